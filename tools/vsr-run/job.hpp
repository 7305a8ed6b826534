// SPDX-License-Identifier: Apache-2.0
// One vsr-run: input -> plan -> run -> report. Its input as one tile source (a file, or the
// generated sample; job_input.cpp), the step of the step table (steps.hpp), and its output as
// one tile sink (a file through the one write path, job_write.cpp; a reduction, job_reduce.cpp;
// or nothing), on the library's tile executor (job.cpp); the report of what it did (report.cpp).
#pragma once

#include "options.hpp"
#include "steps.hpp"
#include "timings.hpp"

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/dispatch.hpp>
#include <vibespatial/raster/io.hpp>
#include <vibespatial/raster/ops.hpp>
#include <vibespatial/raster/pipeline.hpp>
#include <vibespatial/raster/tiles.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace vsr_run {

/// Input bytes (every selected band) of one tile of a streamed file run at most: small enough
/// that a run of a large file has many tiles for its stages to overlap, large enough that GDAL
/// reads and writes long runs of blocks and a device's copies stay efficient.
inline constexpr std::uint64_t kStreamTileBytes = 64ULL << 20;

/// Progress on stderr: on a terminal one line updated as each tile is read, computed and written;
/// otherwise (--progress) one line per tile done. Thread-safe.
class Progress {
 public:
  Progress(bool enabled, std::string what);
  void update(std::int64_t done, std::int64_t total, const char* unit);
  /// A tile's step (terminal only: a pipe gets the per-tile lines).
  void stage(const vsr::TileInfo& where, vsr::TileStage stage);

 private:
  bool enabled_, tty_;
  std::string what_;
  std::mutex mutex_;
};

/// Whether the GDAL driver @p name (any case) is COG.
bool is_cog(const std::string& name);

/// "none" or the value's exact text.
std::string nodata_text(const std::optional<vsr::NodataValue>& v);

/// One vsr-run: its steps in the order run() takes them.
class Job {
 public:
  explicit Job(const Arguments& args) : args_(args) {}
  /// Runs it; 0 on success. @throws vsr_cli::UsageError (exit 2) or what the run throws (exit 1).
  int run();

 private:
  void check_output();
  void check_output_trial();
  void check_host_memory(std::uint64_t bytes, const std::string& what,
                         const std::string& advice) const;
  void open_input();
  void regrid_input();
  void make_plan();
  void stream_plan(const vsr::RasterMetadata& plan_meta);
  void choose_overlap();
  void count_host_bytes();
  vsr::TileRunOptions tile_options(Progress& progress) const;
  void reduce(const std::string& what, const vsr::VisitTileSink::Visit& visit);
  void run_statistics();
  void run_histogram();
  StepFacts facts(bool trial) const;
  StepWork raster_work();
  void open_inputs();
  void run_step();
  /// The one write path (job_write.cpp).
  void write_raster(vsr::RasterFileSource* from, vsr::MetadataCopy copy,
                    const std::function<void(vsr::TileSink&)>& run);
  void run_sources(const vsr::MultiTileOp& op);
  void run_raster_op();
  void run_table();
  // calc: its inputs, expressions and run
  void open_calc_inputs();
  vsr::MultiTileOp calc_function() const;
  void run_calc();
  // pipeline: the chain of steps over the read inputs
  void warp_pipeline_inputs();
  void build_pipeline();
  /// "warp ! calc ! ...": the pipeline's steps between read and its last.
  std::string chain_text() const;
  void print_dry_run() const;
  void run_pipeline();
  void reduce_pipeline(const std::vector<vsr::TileSource*>& sources, const vsr::TileRunOptions& o);
  // report.cpp
  void print_results();
  void print_summary(double seconds) const;
  std::string plan_text() const;
  std::string stages_text() const;
  /// --diagnostics: the timings table on stderr (after the summary).
  void print_diagnostics();

  /// Enters the run's step @p name (step_, and the --diagnostics clock).
  void enter(std::string name) {
    step_ = std::move(name);
    timings_.step(step_);
  }

  const Arguments& args_;
  /// The run's step (nullptr for a pipeline, whose steps are chain_'s).
  const Step* op_step_ = nullptr;
  /// What the run is doing, for the message of an allocation that fails all the same.
  std::string step_ = "starting";
  /// Where the time went (--diagnostics); fed by every tile run's stage events.
  mutable RunTimings timings_;
  vsr::PlacementDecision placement_;
  bool show_progress_ = false;
  bool from_file_ = false;
  vsr::WriteOptions write_;
  vsr::OpenOptions open_;
  std::optional<vsr::OwnedRasterArray> sample_;
  /// The input: the file's or the sample's selected bands.
  std::unique_ptr<vsr::TileSource> source_;
  vsr::RasterFileSource* file_ = nullptr;  ///< source_ when it is a file
  /// A grid step's (warp): the input's source, which source_ (the output grid's) reads; the
  /// step's own plan (--dry-run) and what the summary says of it.
  std::unique_ptr<vsr::TileSource> input_source_;
  std::vector<std::string> step_plan_;
  /// A pipeline's `read ! warp ! ...`: each calc source seen on the warp's grid (the run's
  /// sources; the chain has the steps after warp).
  std::vector<std::unique_ptr<vsr::TileSource>> warped_;
  std::string grid_note_;
  std::string table_json_, table_csv_;                        ///< a table step's result
  vsr::RasterMetadata meta_;                                  ///< the input's (every band)
  std::vector<std::optional<vsr::NodataValue>> band_nodata_;  ///< of the selected bands
  std::vector<int> bands_;                                    ///< selected, 1-based
  /// The nodata the file source chose only to mark its masked pixels (no band's own), if any:
  /// the output-nodata rule does not give it to a float output.
  std::optional<vsr::NodataValue> mask_marker_;
  int nir_ = 0, red_ = 0;
  std::string input_label_;
  /// calc: one source per input read (only the bands its expressions name), their names.
  std::vector<std::unique_ptr<vsr::RasterFileSource>> calc_sources_;
  std::vector<std::string> calc_names_;
  std::vector<bool> calc_marks_;  ///< per calc source: its nodata only marks masked pixels
  vsr::CalcProgram calc_program_;
  vsr::CalcOptions calc_options_;
  std::optional<vsr::Pipeline> chain_;
  vsr::PlanOptions popts_;
  std::string budget_note_;
  vsr::RasterPlan plan_;
  bool tiled_ = false;
  bool streamed_ = false;         ///< the plan's tiles are the streaming size (stream_plan)
  int overlap_ = 0;               ///< TileRunOptions::overlap of the run (choose_overlap)
  std::uint64_t host_bytes_ = 0;  ///< host memory of a file run's passes (count_host_bytes)
  bool per_band_op_ = true;
  std::optional<std::uint64_t> gdal_cache_;
  std::optional<Progress> progress_;
  std::vector<vsr::BandStatistics> stats_;
  std::vector<std::vector<std::int64_t>> hist_;
  std::vector<Range> hist_range_;
  std::string note_;
  std::string output_label_ = "none (use --output FILE to write the result)";
};

}  // namespace vsr_run
