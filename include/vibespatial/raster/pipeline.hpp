// SPDX-License-Identifier: Apache-2.0
// Pipelines: a chain of band operations run as one op over the tiles of its inputs, read once.
//
// Glossary:
//   input   a raster the chain reads, by name (A, B, ...), as band math names them; the first
//           input is where the chain starts.
//   step    one operation of the chain: band math over the inputs and the previous step's output,
//           a focal mean, rescale, conversion, clip, nodata fill, or an op of the caller's.
//   X       in a calc step's expressions, the previous step's output (the first input before any
//           other step); the inputs keep their names.
//   halo    the pixels of context a step needs on each side (1 for a 3x3 focal mean); a chain
//           needs the sum of its steps' halos, so that a tile read with it gives, after every
//           step, the same interior as the whole raster would (tile edges inside the raster see
//           real neighbours; true raster edges apply each step's edge rule).
#pragma once

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/export.hpp>
#include <vibespatial/raster/ops.hpp>
#include <vibespatial/raster/tiles.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace vibespatial::raster {

namespace detail {
struct PipelineStep;
}  // namespace detail

/**
 * @brief A chain of band operations over named inputs, run as one op: each tile of the inputs is
 * read once, every step runs on it where the data lives, and the result is written once.
 *
 * Build it step by step (each call checks its arguments and returns the pipeline), then run it
 * over in-memory rasters (run) or over any tile sources with run_tiles (tile_op, halo,
 * bands_independent). A pipeline is immutable once built in practice: running it from several
 * threads at once is safe; adding steps while it runs is not.
 */
class VSR_EXPORT Pipeline {
 public:
  /// One input per entry (name and band count), the first where the chain starts.
  /// @throws std::invalid_argument for no input, a name that is not an identifier, is given twice,
  ///         is "X" or a band-math function, constant or keyword name, or a band count below 1.
  explicit Pipeline(std::vector<CalcInputBands> inputs);

  /// Band math (compile_calc's language) over the inputs and X; one output band per expression.
  /// @throws std::invalid_argument as compile_calc (the message says which step).
  Pipeline& calc(const std::vector<std::string>& expressions, const CalcOptions& options = {});
  /// focal_mean_3x3 with @p edge (halo 1).
  Pipeline& focal_mean(EdgeMode edge = EdgeMode::nearest);
  /// rescale to @p out_dtype. @throws std::invalid_argument for a bound that is not finite or
  /// in_min == in_max (the op's other checks run on the data).
  Pipeline& rescale(double in_min, double in_max, double out_min, double out_max, DType out_dtype);
  /// convert_output (convert_dtype's conversion, any exact nodata, a valid pixel equal to the
  /// nodata refused) to @p out_dtype with @p out_nodata.
  Pipeline& convert(DType out_dtype, std::optional<NodataValue> out_nodata = {});
  /// clip to [@p lower, @p upper]. @throws std::invalid_argument for a NaN bound or lower > upper.
  Pipeline& clip(double lower, double upper);
  /// fill_nodata with @p value.
  Pipeline& fill_nodata(double value);
  /// A step of the caller's: @p op takes the previous output and returns a raster of its height
  /// and width; @p halo is the context it needs per side; @p keeps_bands: whether it returns as
  /// many bands as it gets and treats them independently (false: the chain's bands go together).
  /// @throws std::invalid_argument for an empty @p name or @p op, or a negative @p halo.
  Pipeline& step(std::string name, BandOp op, int halo = 0, bool keeps_bands = true);

  /// Which inputs' nodata only marks masked pixels: one flag per input, in order (a reader of
  /// files passes RasterFileSource::nodata_marks_mask). calc steps take it as
  /// CalcInput::nodata_marks_mask (for X too while X is still the first input), so the
  /// output-nodata rule keeps such a value out of a float output. Default: no input's does.
  /// @throws std::invalid_argument for a count other than the inputs'.
  Pipeline& nodata_marks_mask(std::vector<bool> per_input);

  /// The inputs, as given.
  const std::vector<CalcInputBands>& inputs() const noexcept { return inputs_; }
  /// The steps' names, in order ("calc", "focal-mean", "rescale", "convert", "clip",
  /// "fill-nodata", or the caller's).
  std::vector<std::string> step_names() const;
  /// The sum of the steps' halos: the halo a tiled run must read with.
  int halo() const noexcept { return halo_; }
  /// The band count of the result, where known (every step but the caller's keeps or sets it).
  std::optional<int> band_count() const noexcept { return bands_; }
  /// Whether the chain treats bands independently (no calc step and no caller's step that mixes
  /// bands; then there is one input): a run may take the bands one pass at a time.
  bool bands_independent() const noexcept;
  /// Rasters the chain keeps live per band while a step runs (its input and its output): for
  /// memory plans (RasterPlan's buffers_per_band).
  int buffers_per_band() const noexcept { return 2; }

  /**
   * @brief Runs the chain on one tile of every input (the same window, in the order of inputs()),
   * as a run_tiles MultiTileOp does: the result of the last step (or the first input, for a
   * chain of no steps).
   * @throws std::invalid_argument for a tile count other than the inputs', tiles of different
   *         height or width, or a band count other than compiled for where a calc step needs it;
   *         whatever a step throws (the message says which step).
   */
  OwnedRasterArray apply(const std::vector<OwnedRasterArray>& tiles) const;

  /// apply() as run_tiles' multi-source op.
  MultiTileOp tile_op() const;

  /**
   * @brief The chain over whole host rasters (one per input, one grid), tiled by @p plan: a whole
   * plan is one call to apply(); a tiled plan reads every tile with at least halo() pixels of
   * context and stitches the interiors, which equal the whole-raster result.
   * @throws std::invalid_argument for inputs other than inputs() (count, band counts), rasters of
   *         different height or width (naming the two), a band_batches plan for a chain whose
   *         bands go together; as run_tiles and apply() otherwise.
   */
  OwnedRasterArray run(const std::vector<OwnedRasterArray>& rasters, const RasterPlan& plan,
                       const TileRunOptions& options = {}) const;

 private:
  std::vector<CalcInputBands> inputs_;
  std::vector<bool> marks_;  ///< per input: its nodata only marks masked pixels
  std::vector<std::shared_ptr<const detail::PipelineStep>> steps_;
  int halo_ = 0;
  std::optional<int> bands_;
  bool mixes_bands_ = false;
};

}  // namespace vibespatial::raster
