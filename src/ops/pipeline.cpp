// SPDX-License-Identifier: Apache-2.0
// pipeline.hpp: a chain of band operations as one op over the tiles of its inputs, on the one
// tile executor (run_tiles).
#include "common/expects.hpp"

#include <vibespatial/raster/diagnostics.hpp>
#include <vibespatial/raster/dispatch.hpp>
#include <vibespatial/raster/pipeline.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace vibespatial::raster {

namespace detail {

// One step: its name, its halo, and what it does to the previous output given the chain's tiles.
struct PipelineStep {
  std::string name;
  int halo = 0;
  /// @p marks: per input, whether its nodata only marks masked pixels; @p x_marks: X's.
  std::function<OwnedRasterArray(const OwnedRasterArray& x,
                                 const std::vector<OwnedRasterArray>& tiles,
                                 const std::vector<bool>& marks, bool x_marks)>
      run;
};

}  // namespace detail

namespace {

constexpr const char* kName = "Pipeline";

std::string step_label(std::size_t index, const std::string& name) {
  return std::string(kName) + ": step " + std::to_string(index + 1) + " (" + name + ")";
}

/// Records step @p index's run in @p result's log: "Pipeline: step N (name) on the device" (or
/// "on the host"), with the seconds it took to return (a device step's work is then queued, not
/// done). Never throws: a log that cannot grow loses the event.
void record_step(const OwnedRasterArray& result, std::size_t index, const std::string& name,
                 std::chrono::steady_clock::time_point start) noexcept {
  try {
    RasterDiagnosticEvent e;
    e.kind = RasterDiagnosticKind::runtime;
    e.residency = result.residency();
    e.elapsed_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    e.detail = step_label(index, name) +
               (e.residency == Residency::device ? " on the device" : " on the host");
    result.diagnostics()->record(std::move(e));
  } catch (...) {
  }
}

}  // namespace

Pipeline::Pipeline(std::vector<CalcInputBands> inputs) : inputs_(std::move(inputs)) {
  VSR_EXPECTS(!inputs_.empty(), std::string(kName) + ": at least one input is needed");
  for (const CalcInputBands& in : inputs_) {
    VSR_EXPECTS(in.name != "X", std::string(kName) +
                                    ": an input may not be named X, which names the previous "
                                    "step's output in a calc step's expressions");
  }
  // The inputs' names and band counts follow band math's rules: compile_calc checks them.
  try {
    (void)compile_calc({"0"}, inputs_);
  } catch (const std::invalid_argument& e) {
    std::string what = e.what();
    const std::string prefix = "compile_calc: ";
    if (what.rfind(prefix, 0) == 0) what = what.substr(prefix.size());
    throw std::invalid_argument(std::string(kName) + ": " + what);
  }
  bands_ = inputs_.front().band_count;
  marks_.assign(inputs_.size(), false);
}

Pipeline& Pipeline::nodata_marks_mask(std::vector<bool> per_input) {
  VSR_EXPECTS(per_input.size() == inputs_.size(),
              std::string(kName) + ": nodata_marks_mask has " + std::to_string(per_input.size()) +
                  " flags for " + std::to_string(inputs_.size()) + " inputs");
  marks_ = std::move(per_input);
  return *this;
}

Pipeline& Pipeline::calc(const std::vector<std::string>& expressions, const CalcOptions& options) {
  const std::string label = step_label(steps_.size(), "calc");
  VSR_EXPECTS(bands_.has_value(),
              label +
                  ": the previous step's band count is not known (a step of the caller's "
                  "that changes bands): X cannot be compiled");
  std::vector<CalcInputBands> names = inputs_;
  names.push_back({"X", *bands_});
  CalcProgram program;
  try {
    program = compile_calc(expressions, names);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(label + ": " + e.what());
  }
  const std::vector<std::string> input_names = [&] {
    std::vector<std::string> v;
    for (const CalcInputBands& in : names) v.push_back(in.name);
    return v;
  }();
  auto step = std::make_shared<detail::PipelineStep>();
  step->name = "calc";
  step->run = [program, options, input_names](const OwnedRasterArray& x,
                                              const std::vector<OwnedRasterArray>& tiles,
                                              const std::vector<bool>& marks, bool x_marks) {
    std::vector<CalcInput> in;
    in.reserve(tiles.size() + 1);
    for (std::size_t i = 0; i < tiles.size(); ++i) {
      in.push_back({input_names[i], tiles[i], {}, marks[i]});
    }
    in.push_back({"X", x, {}, x_marks});
    return raster::calc(program, in, options, current_op_stream());
  };
  steps_.push_back(std::move(step));
  bands_ = static_cast<int>(expressions.size());
  mixes_bands_ = true;
  return *this;
}

Pipeline& Pipeline::focal_mean(EdgeMode edge) {
  VSR_EXPECTS(
      edge == EdgeMode::nearest || edge == EdgeMode::reflect || edge == EdgeMode::constant_nodata,
      step_label(steps_.size(), "focal-mean") + ": unknown edge mode");
  auto step = std::make_shared<detail::PipelineStep>();
  step->name = "focal-mean";
  step->halo = 1;
  step->run = [edge](const OwnedRasterArray& x, const std::vector<OwnedRasterArray>&,
                     const std::vector<bool>&, bool) { return focal_mean_3x3(x, edge); };
  steps_.push_back(std::move(step));
  halo_ += 1;
  return *this;
}

Pipeline& Pipeline::rescale(double in_min, double in_max, double out_min, double out_max,
                            DType out_dtype) {
  const std::string label = step_label(steps_.size(), "rescale");
  VSR_EXPECTS(std::isfinite(in_min) && std::isfinite(in_max) && std::isfinite(out_min) &&
                  std::isfinite(out_max),
              label + ": every bound must be finite");
  VSR_EXPECTS(in_min != in_max, label + ": in_min and in_max must differ");
  auto step = std::make_shared<detail::PipelineStep>();
  step->name = "rescale";
  step->run = [=](const OwnedRasterArray& x, const std::vector<OwnedRasterArray>&,
                  const std::vector<bool>&,
                  bool) { return raster::rescale(x, in_min, in_max, out_min, out_max, out_dtype); };
  steps_.push_back(std::move(step));
  return *this;
}

Pipeline& Pipeline::convert(DType out_dtype, std::optional<NodataValue> out_nodata) {
  auto step = std::make_shared<detail::PipelineStep>();
  step->name = "convert";
  step->run = [=](const OwnedRasterArray& x, const std::vector<OwnedRasterArray>&,
                  const std::vector<bool>&,
                  bool) { return convert_output(x, out_dtype, out_nodata); };
  steps_.push_back(std::move(step));
  return *this;
}

Pipeline& Pipeline::clip(double lower, double upper) {
  const std::string label = step_label(steps_.size(), "clip");
  VSR_EXPECTS(!std::isnan(lower) && !std::isnan(upper), label + ": a bound is NaN");
  VSR_EXPECTS(lower <= upper, label + ": lower must not exceed upper");
  auto step = std::make_shared<detail::PipelineStep>();
  step->name = "clip";
  step->run = [=](const OwnedRasterArray& x, const std::vector<OwnedRasterArray>&,
                  const std::vector<bool>&, bool) { return raster::clip(x, lower, upper); };
  steps_.push_back(std::move(step));
  return *this;
}

Pipeline& Pipeline::fill_nodata(double value) {
  auto step = std::make_shared<detail::PipelineStep>();
  step->name = "fill-nodata";
  step->run = [=](const OwnedRasterArray& x, const std::vector<OwnedRasterArray>&,
                  const std::vector<bool>&, bool) { return raster::fill_nodata(x, value); };
  steps_.push_back(std::move(step));
  return *this;
}

Pipeline& Pipeline::step(std::string name, BandOp op, int halo, bool keeps_bands) {
  const std::string label = step_label(steps_.size(), name);
  VSR_EXPECTS(!name.empty(), std::string(kName) + ": a step needs a name");
  VSR_EXPECTS(static_cast<bool>(op), label + ": op is empty");
  VSR_EXPECTS(halo >= 0, label + ": halo must be >= 0, not " + std::to_string(halo));
  auto step = std::make_shared<detail::PipelineStep>();
  step->name = std::move(name);
  step->halo = halo;
  step->run = [op = std::move(op)](const OwnedRasterArray& x, const std::vector<OwnedRasterArray>&,
                                   const std::vector<bool>&, bool) { return op(x); };
  steps_.push_back(std::move(step));
  halo_ += halo;
  if (!keeps_bands) {
    bands_.reset();
    mixes_bands_ = true;
  }
  return *this;
}

std::vector<std::string> Pipeline::step_names() const {
  std::vector<std::string> names;
  names.reserve(steps_.size());
  for (const auto& s : steps_) names.push_back(s->name);
  return names;
}

bool Pipeline::bands_independent() const noexcept {
  return !mixes_bands_ && inputs_.size() == 1;
}

OwnedRasterArray Pipeline::apply(const std::vector<OwnedRasterArray>& tiles) const {
  VSR_EXPECTS(tiles.size() == inputs_.size(), std::string(kName) + ": " +
                                                  std::to_string(tiles.size()) + " tiles for " +
                                                  std::to_string(inputs_.size()) + " inputs");
  for (std::size_t i = 1; i < tiles.size(); ++i) {
    VSR_EXPECTS(tiles[i].height() == tiles[0].height() && tiles[i].width() == tiles[0].width(),
                std::string(kName) + ": the tiles of " + inputs_[0].name + " and " +
                    inputs_[i].name + " differ in height or width");
  }
  OwnedRasterArray x = tiles.front();
  for (std::size_t i = 0; i < steps_.size(); ++i) {
    const detail::PipelineStep& s = *steps_[i];
    try {
      const auto start = std::chrono::steady_clock::now();
      // X is the first input's tile until a step has run.
      OwnedRasterArray next = s.run(x, tiles, marks_, i == 0 && marks_.front());
      VSR_EXPECTS(next.height() == x.height() && next.width() == x.width(),
                  "its result is " + std::to_string(next.width()) + " x " +
                      std::to_string(next.height()) + " pixels, its input " +
                      std::to_string(x.width()) + " x " + std::to_string(x.height()));
      // One log for the chain's results (the inputs' stay theirs): each step's event, where
      // it ran, in the result's diagnostics.
      if (i > 0) next.adopt_diagnostics(x.diagnostics());
      record_step(next, i, s.name, start);
      x = std::move(next);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(step_label(i, s.name) + ": " + e.what());
    } catch (const std::runtime_error& e) {
      throw std::runtime_error(step_label(i, s.name) + ": " + e.what());
    }
  }
  return x;
}

MultiTileOp Pipeline::tile_op() const {
  return [self = *this](const std::vector<OwnedRasterArray>& tiles, const TileInfo&) {
    return self.apply(tiles);
  };
}

OwnedRasterArray Pipeline::run(const std::vector<OwnedRasterArray>& rasters, const RasterPlan& plan,
                               const TileRunOptions& options) const {
  const std::string name = std::string(kName) + "::run";
  VSR_EXPECTS(rasters.size() == inputs_.size(), name + ": " + std::to_string(rasters.size()) +
                                                    " rasters for " +
                                                    std::to_string(inputs_.size()) + " inputs");
  for (std::size_t i = 0; i < rasters.size(); ++i) {
    VSR_EXPECTS(rasters[i].band_count() == inputs_[i].band_count,
                name + ": input " + inputs_[i].name + " has " +
                    std::to_string(rasters[i].band_count()) +
                    " bands, the pipeline was built for " + std::to_string(inputs_[i].band_count));
    VSR_EXPECTS(
        rasters[i].height() == rasters[0].height() && rasters[i].width() == rasters[0].width(),
        name + ": " + inputs_[0].name + " is " + std::to_string(rasters[0].width()) + " x " +
            std::to_string(rasters[0].height()) + " pixels and " + inputs_[i].name + " " +
            std::to_string(rasters[i].width()) + " x " + std::to_string(rasters[i].height()) +
            ": the inputs must share one grid");
  }
  if (plan.strategy == TilingStrategy::whole) return apply(rasters);
  VSR_EXPECTS(
      plan.strategy == TilingStrategy::tiled,
      name + ": plan strategy " + std::string(to_string(plan.strategy)) + " is not whole or tiled");
  std::vector<RasterTileSource> sources;
  sources.reserve(rasters.size());
  for (const OwnedRasterArray& r : rasters) sources.emplace_back(r);
  std::vector<TileSource*> ends;
  for (RasterTileSource& s : sources) ends.push_back(&s);
  RasterPlan walk = plan;
  walk.halo = std::max(plan.halo, halo_);
  TileRunOptions o = options;
  if (o.name == TileRunOptions{}.name) o.name = name;
  if (!bands_independent()) {
    o.per_band = false;
    walk.bands_per_pass = rasters.front().band_count();
  }
  RasterTileSink sink;
  run_tiles(ends, tile_op(), sink, walk, o);
  return sink.result();
}

}  // namespace vibespatial::raster
