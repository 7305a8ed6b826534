// SPDX-License-Identifier: Apache-2.0
// The rescale step: --in-range onto --out-range as --ot; without --in-range (an --op run) the
// valid range of every selected band, from a first streamed pass of statistics.
#include "cli.hpp"
#include "steps.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>

namespace vsr_run {

using vsr_cli::UsageError;

namespace {

Range out_range(const Arguments& args) {
  return args.out_range.value_or(Range{0, 1});
}

/// rescale of @p in onto @p out; with @p clamp, values outside @p in are clamped first (no
/// extrapolation, so no valid value can reach a nodata chosen outside the output range). A
/// reversed range (HI,LO) maps the other way round, as gdal_translate -scale. With -a_nodata the
/// map is made in the compute type and converted with that nodata (to_output), so that an
/// integer output may take every value of its type.
RasterFn rescale_with(vsr::DType ot, bool own_nodata, Range in, Range out, bool clamp) {
  return [in, out, ot, clamp, own_nodata](const vsr::OwnedRasterArray& t) {
    const vsr::DType as =
        own_nodata && !vsr::is_floating_point(ot) ? vsr::compute_dtype(t.dtype()) : ot;
    if (clamp) {
      const vsr::OwnedRasterArray c = vsr::clip(t, std::min(in.lo, in.hi), std::max(in.lo, in.hi));
      return vsr::rescale(c, in.lo, in.hi, out.lo, out.hi, as);
    }
    return vsr::rescale(t, in.lo, in.hi, out.lo, out.hi, as);
  };
}

/// The valid range of all selected bands (the first pass's statistics), so that every tile and
/// band maps the same way; @p note says what is odd about it.
Range valid_range(const StepFacts& facts, Range out, std::string& note) {
  Range in{std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity()};
  const std::vector<vsr::BandStatistics>& stats = *facts.stats;
  for (std::size_t b = 0; b < stats.size(); ++b) {
    const vsr::BandStatistics& m = stats[b];
    if (m.count == 0) continue;
    if (!std::isfinite(m.min) || !std::isfinite(m.max)) {
      throw std::runtime_error("rescale: band " + std::to_string((*facts.bands)[b]) +
                               " holds infinite values (its valid range is [" +
                               std::to_string(m.min) + ", " + std::to_string(m.max) +
                               "]): give --in-range LO,HI");
    }
    in.lo = std::min(in.lo, m.min), in.hi = std::max(in.hi, m.max);
  }
  if (!(in.lo <= in.hi)) {
    in = {0, 1};  // no valid pixel: every output pixel is nodata
    note = "no valid pixel: every output pixel is nodata";
  } else if (in.lo == in.hi) {
    // A constant raster: every valid pixel maps to the low end of the output range.
    in.hi = in.lo + std::max(1.0, std::fabs(in.lo));
    note = "constant raster (every valid pixel is " + json_number(in.lo) +
           "): valid pixels map to " + json_number(out.lo);
  }
  return in;
}

/// Invalid pixels of an integer output need a value outside --out-range: refused before any
/// pixel is read when the type has none.
void check_rescale(const Arguments& args, const StepFacts& facts) {
  const vsr::DType out_dtype = rescale_step().output_dtype(args, facts.dtype);
  const Range out = out_range(args);
  if (args.a_nodata || vsr::is_floating_point(out_dtype) ||
      !(facts.band_nodata.front() || vsr::is_floating_point(facts.dtype))) {
    return;
  }
  const double lo = std::min(out.lo, out.hi), hi = std::max(out.lo, out.hi);
  if (!vsr::dtype_holds(out_dtype, vsr::NodataValue(std::floor(lo) - 1)) &&
      !vsr::dtype_holds(out_dtype, vsr::NodataValue(std::ceil(hi) + 1))) {
    throw UsageError("--out-range " + json_number(out.lo) + "," + json_number(out.hi) +
                     " covers every value of " + std::string(vsr::to_string(out_dtype)) +
                     ", so no value is left to mark the invalid pixels of the input: give "
                     "-a_nodata V (a value of the range, which no valid pixel may then take) "
                     "or -a_nodata none (no nodata: invalid pixels are written as 0)");
  }
}

StepWork build_rescale(const Arguments& args, const StepFacts& facts) {
  const Step& step = rescale_step();
  const vsr::DType ot = step.output_dtype(args, facts.dtype);
  const Range out = out_range(args);
  const bool own_nodata = args.a_nodata.has_value();
  if (facts.trial) {
    // The output's dtype and nodata do not depend on the range.
    return {to_output(step, args, facts, rescale_with(ot, own_nodata, Range{0, 1}, out, false)),
            ""};
  }
  std::string note;
  const Range in = args.in_range ? *args.in_range : valid_range(facts, out, note);
  char buf[200];
  std::snprintf(buf, sizeof buf, "[%s, %s] -> [%s, %s] as %s", json_number(in.lo).c_str(),
                json_number(in.hi).c_str(), json_number(out.lo).c_str(),
                json_number(out.hi).c_str(),
                std::string(vsr::to_string(args.ot.value_or(vsr::DType::float32))).c_str());
  note = std::string(buf) + (note.empty() ? "" : "; " + note);
  return {to_output(step, args, facts,
                    rescale_with(ot, own_nodata, in, out, args.in_range.has_value())),
          note};
}

}  // namespace

const Step& rescale_step() {
  static const Step s{
      .name = "rescale",
      .summary =
          "--in-range onto --out-range as --ot (default: the valid range of all "
          "selected bands onto 0,1 as float32)",
      .kind = StepKind::raster,
      .op = Op::rescale,
      .options = {"--in-range", "--out-range", "--ot", "-a_nodata"},
      .pipeline_needs = {"--in-range"},
      .metadata = vsr::MetadataCopy::descriptive,
      .default_dtype = [](vsr::DType) { return vsr::DType::float32; },
      .range_pass = [](const Arguments& args) { return !args.in_range.has_value(); },
      .check = check_rescale,
      .build = build_rescale,
  };
  return s;
}

}  // namespace vsr_run
