// SPDX-License-Identifier: Apache-2.0
// The step table (steps.hpp), the steps the run itself carries out (read, write, the
// reductions, whose work is Job's), and what every raster step shares: its output's dtype and
// nodata.
#include "steps.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

namespace vsr_run {

bool Step::declares(std::string_view option) const {
  return std::find(options.begin(), options.end(), option) != options.end();
}

vsr::DType Step::output_dtype(const Arguments& args, vsr::DType in) const {
  if (args.ot) return *args.ot;
  return default_dtype ? default_dtype(in) : in;
}

const Step& stats_step() {
  static const Step s{
      .name = "stats",
      .summary = "per band: count, min, max, mean, std of the valid pixels",
      .kind = StepKind::reduction,
      .op = Op::stats,
      .options = {"--json"},
      .in_pipeline = false,
  };
  return s;
}

const Step& histogram_step() {
  static const Step s{
      .name = "histogram",
      .summary =
          "per band: counts of the valid pixels in --bins equal bins on --range "
          "(numpy.histogram's bins)",
      .kind = StepKind::reduction,
      .op = Op::histogram,
      .options = {"--json", "--bins", "--range"},
      .in_pipeline = false,
      .pipeline_needs = {"--range"},
  };
  return s;
}

const Step& read_step() {
  static const Step s{
      .name = "read",
      .summary =
          "a pipeline's inputs, NAME=FILE (a bare FILE is A), one grid; an --op run's "
          "input options",
      .kind = StepKind::read,
      .op = Op::pipeline,
      .options = {"-i", "-b", "--ignore-mask", "--allow-virtual"},
      .in_pipeline = false,
  };
  return s;
}

const Step& write_step() {
  static const Step s{
      .name = "write",
      .summary =
          "a pipeline's output FILE and its options, and the run's; an --op run's "
          "output options",
      .kind = StepKind::write,
      .op = Op::pipeline,
      .options = {"-o", "-of", "--co", "--overviews", "--resampling", "--overwrite"},
      .in_pipeline = false,
  };
  return s;
}

const std::vector<Step>& step_table() {
  static const std::vector<Step> table = {
      stats_step(),
      histogram_step(),
      rescale_step(),
      clip_step(),
      fill_nodata_step(),
      focal_mean_step(),
      normalized_difference_step(),
      calc_step(),
      warp_step(),
      zonal_step(),
      read_step(),
      write_step(),
  };
  return table;
}

const Step* find_step(std::string_view name) {
  for (const Step& s : step_table()) {
    if (s.name == name || (!s.alias.empty() && s.alias == name)) return &s;
  }
  return nullptr;
}

const Step& step_of(Op op) {
  for (const Step& s : step_table()) {
    if (s.op == op && s.kind != StepKind::read && s.kind != StepKind::write) return s;
  }
  throw std::logic_error("vsr-run: no step runs this op");
}

std::string step_names(bool (*keep)(const Step&)) {
  std::vector<std::string> names;
  for (const Step& s : step_table()) {
    if (!keep(s)) continue;
    names.emplace_back(s.name);
    if (!s.alias.empty()) names.back() += " or " + std::string(s.alias);
  }
  std::string text;
  for (std::size_t k = 0; k < names.size(); ++k) {
    text += (k == 0 ? "" : ", ") + names[k];
  }
  return text;
}

vsr::OutputNodata nodata_request(const Arguments& args) {
  if (!args.a_nodata) return vsr::OutputNodata::by_rule();
  return *args.a_nodata ? vsr::OutputNodata::of(**args.a_nodata) : vsr::OutputNodata::none();
}

std::string ot_note(const Arguments& args) {
  if (!args.ot) return "";
  return "output as " + std::string(vsr::to_string(*args.ot)) +
         (vsr::is_floating_point(*args.ot) ? "" : " (rounded half away from zero, saturated)");
}

RasterFn to_output(const Step& step, const Arguments& args, const StepFacts& facts, RasterFn op) {
  const vsr::DType target = step.output_dtype(args, facts.dtype);
  const bool pair = step.band_pair;
  const bool pair_nodata = pair && (facts.band_nodata[0] || facts.band_nodata[1]);
  const bool float_source = vsr::is_floating_point(facts.dtype) || pair;
  const bool needs_for_nan = !vsr::is_floating_point(target) && float_source;
  const vsr::OutputNodata request = nodata_request(args);
  const bool asked = args.a_nodata.has_value();
  return [op = std::move(op), target, pair, pair_nodata, needs_for_nan, request, asked,
          marker = facts.mask_marker](const vsr::OwnedRasterArray& t) {
    const std::optional<vsr::NodataValue> in = t.exact_nodata();
    const bool input_nodata = pair ? pair_nodata : in.has_value();
    // A float input without nodata going to an integer output: its NaN pixels are invalid, and
    // the op gives them a nodata as for an input that has one.
    const bool nan_marks = !asked && !input_nodata && needs_for_nan && !pair;
    const vsr::OwnedRasterArray r =
        op(nan_marks ? t.with_nodata(std::numeric_limits<double>::quiet_NaN()) : t);
    const std::optional<vsr::NodataValue> own = r.exact_nodata();
    const bool in_marks = marker && in == marker;
    const std::optional<vsr::NodataValue> nodata =
        vsr::output_nodata(target, request, {{own, in_marks && own == in}, {in, in_marks}},
                           (input_nodata || needs_for_nan) && own.has_value());
    return vsr::convert_output(r, target, nodata);
  };
}

}  // namespace vsr_run
