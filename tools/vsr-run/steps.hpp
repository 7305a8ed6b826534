// SPDX-License-Identifier: Apache-2.0
// vsr-run's steps: one table (steps.cpp) of every step a run or a pipeline is made of, each with
// its name, the options it takes, its halo, its band rule and how it builds its work from the
// facts of what reaches it. `--op NAME`, `pipeline ... ! NAME ...`, --help and --dry-run all read
// it. A new op is one entry here and one file (step_*.cpp) that defines it.
#pragma once

#include "options.hpp"

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/io.hpp>
#include <vibespatial/raster/ops.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace vsr_run {

using RasterFn = std::function<vsr::OwnedRasterArray(const vsr::OwnedRasterArray&)>;

/// What reaches a step: the dtype and the nodata of each band of its input tiles, and the nodata
/// the input's file chose only to mark its GDAL-masked pixels (which the output-nodata rule
/// keeps out of a float output).
struct StepFacts {
  vsr::DType dtype = vsr::DType::float32;
  std::vector<std::optional<vsr::NodataValue>> band_nodata;
  std::optional<vsr::NodataValue> mask_marker;
  /// rescale of a whole run without --in-range: the valid range of every selected band, from
  /// the first pass (Step::range_pass), with the bands' numbers for its messages.
  const std::vector<vsr::BandStatistics>* stats = nullptr;
  const std::vector<int>* bands = nullptr;
  /// The output's trial before any pixel is read (a tiny raster of nodata pixels): the work as
  /// the run makes it, minus what needs the pixels (rescale's range).
  bool trial = false;
};

/// A raster step's work for one input: its function of a tile (the output's dtype and nodata
/// applied) and what the summary says of it.
struct StepWork {
  RasterFn fn;
  std::string note;
};

/// The kinds of steps, which say how a run goes through them.
enum class StepKind {
  read,       ///< the inputs (a pipeline's first step; an --op run's -i, -b, ...)
  write,      ///< the output (a pipeline's last step; an --op run's -o, -of, ...)
  reduction,  ///< tiles reduced per band and printed (stats, histogram); no raster written
  raster,     ///< a function of one tile of the selected bands (Step::build)
  calc,       ///< band math over named inputs (vsr::calc; the library's Pipeline::calc)
  /// The input seen on another grid (warp): Step::regrid makes the run's source from the
  /// input's (a source of the output grid, vsr::WarpedSource), which the run then walks and
  /// writes through its one write path with Step::build's function of each tile, as a raster
  /// step's. The step's own plan (Step's StepPlan::lines) is printed by --dry-run.
  grid,
  /// A table of the input (zonal-stats): Step::tabulate computes it over the input file in the
  /// library's own pass; --json prints it as JSON, -o writes it (.csv, .json) all or nothing,
  /// otherwise it is printed as CSV. The step's plan (TableWork::plan) is printed by --dry-run.
  table,
};

/// A table step's work (StepKind::table): its plan's lines (--dry-run), what the summary says,
/// and, when run, the table as JSON and CSV and its writer (all or nothing).
struct TableWork {
  std::vector<std::string> plan;
  std::string note;
  std::string json, csv;
  std::function<void(const std::string& path, bool overwrite,
                     const std::vector<vsr::KeptFile>& kept)>
      write;
};

/// A grid step's work (StepKind::grid): the run's source over the input's, what the summary
/// says of it, and the lines --dry-run prints of the step's own plan. A step whose output is
/// not a raster (a table) may give its plan's lines the same way.
struct GridWork {
  std::unique_ptr<vsr::TileSource> source;
  std::string note;
  std::vector<std::string> plan;
};

/// One step of the table.
struct Step {
  std::string_view name{};
  std::string_view alias{};    ///< another name for it ("" none)
  std::string_view summary{};  ///< --help's line(s) about it
  StepKind kind = StepKind::raster;
  Op op = Op::stats;
  /// The options it takes (their first names in options.cpp's table), besides the groups every
  /// run takes (an --op run: input, output, run, sample; in a pipeline only read and write take
  /// those).
  std::vector<std::string_view> options{};
  int halo = 0;             ///< pixels of its neighbours it reads (focal-mean: 1)
  bool per_band = true;     ///< bands independent (passes of any bands of one nodata)
  bool in_pipeline = true;  ///< may be a pipeline's step
  /// The options it needs in a pipeline on top of an --op run's (no first pass finds them).
  std::vector<std::string_view> pipeline_needs{};
  /// raster: reads exactly two bands (normalized-difference: --nir and --red), writes one.
  bool band_pair = false;
  /// raster: what the output keeps of the input's metadata.
  vsr::MetadataCopy metadata = vsr::MetadataCopy::descriptive;
  /// raster, calc: the output's dtype without --ot, for an input of @p in.
  vsr::DType (*default_dtype)(vsr::DType in) = nullptr;
  /// raster: whether a whole run needs a first pass of statistics before building (rescale
  /// without --in-range).
  bool (*range_pass)(const Arguments&) = nullptr;
  /// raster: checks that need the input's facts and no pixel (UsageError), before the trial.
  void (*check)(const Arguments&, const StepFacts&) = nullptr;
  /// raster, grid: the work for what reaches it (grid: a tile of the output grid).
  StepWork (*build)(const Arguments&, const StepFacts&) = nullptr;
  /// grid: the run's source over @p input (its header only: no pixel is read), @p georeferenced
  /// whether the input has a geotransform. Throws UsageError (exit 2) for what the command line
  /// got wrong, std::runtime_error (exit 1) for what the input cannot do.
  GridWork (*regrid)(const Arguments&, vsr::TileSource& input, bool georeferenced,
                     bool dry_run) = nullptr;
  /// table: the plan (@p dry_run) or the table, for the input of header @p input.
  TableWork (*tabulate)(const Arguments&, const vsr::RasterMetadata& input, bool dry_run) = nullptr;
  /// Why the step is no pipeline step, when it is one a user may try there ("": the pipeline's
  /// message listing its steps).
  std::string_view pipeline_refusal{};

  bool declares(std::string_view option) const;
  /// The output's dtype: --ot, else the step's own for an input of @p in.
  vsr::DType output_dtype(const Arguments& args, vsr::DType in) const;
};

/// Every step, in --help's order.
const std::vector<Step>& step_table();
/// The step named (or aliased) @p name; nullptr when none.
const Step* find_step(std::string_view name);
/// The step of @p op.
const Step& step_of(Op op);
/// "a, b, c": the names of the steps @p keep accepts.
std::string step_names(bool (*keep)(const Step&));

// The steps' entries, one file each (or per family).
const Step& stats_step();
const Step& histogram_step();
const Step& rescale_step();
const Step& clip_step();
const Step& fill_nodata_step();
const Step& focal_mean_step();
const Step& normalized_difference_step();
const Step& calc_step();
const Step& warp_step();
const Step& zonal_step();
const Step& read_step();
const Step& write_step();

/// A raster step's function @p op with the output's dtype (--ot) and nodata applied, by the
/// library's output-nodata rule (vsr::output_nodata; docs/outputs.md). The output needs a
/// nodata when the input has one (the tile's band; either band of a band pair) or when it is of
/// an integer type made from floating-point values (a float input, or a band pair's NaN), and
/// the op's result has invalid pixels at all; its candidates are the op's own nodata, then the
/// input's. vsr::convert_output refuses a valid pixel equal to it.
RasterFn to_output(const Step& step, const Arguments& args, const StepFacts& facts, RasterFn op);

/// The summary's note of an --ot conversion ("" without --ot).
std::string ot_note(const Arguments& args);

/// A double as JSON: full precision (%.17g), null for NaN and infinities (JSON has neither).
std::string json_number(double v);

/// -a_nodata as the output-nodata rule takes it: a value, none, or the rule's own choice.
vsr::OutputNodata nodata_request(const Arguments& args);

}  // namespace vsr_run
