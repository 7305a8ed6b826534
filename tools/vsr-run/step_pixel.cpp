// SPDX-License-Identifier: Apache-2.0
// The steps that are one library op of a tile: clip, fill-nodata, focal-mean and
// normalized-difference, each with --ot and the output-nodata rule (to_output).
#include "steps.hpp"

#include <string>

namespace vsr_run {

namespace {

vsr::DType same_dtype(vsr::DType in) {
  return in;
}
vsr::DType compute_dtype(vsr::DType in) {
  return vsr::compute_dtype(in);
}

/// @p f with the output's dtype and nodata, and --ot's note.
StepWork work(const Step& step, const Arguments& args, const StepFacts& facts, RasterFn f) {
  return {to_output(step, args, facts, std::move(f)), ot_note(args)};
}

}  // namespace

const Step& clip_step() {
  static const Step s{
      .name = "clip",
      .summary = "valid pixels clamped to --range LO,HI (same type)",
      .kind = StepKind::raster,
      .op = Op::clip,
      .options = {"--range", "--ot", "-a_nodata"},
      .metadata = vsr::MetadataCopy::all,
      .default_dtype = same_dtype,
      .build =
          [](const Arguments& args, const StepFacts& facts) {
            return work(clip_step(), args, facts,
                        [r = *args.range](const vsr::OwnedRasterArray& t) {
                          return vsr::clip(t, r.lo, r.hi);
                        });
          },
  };
  return s;
}

const Step& fill_nodata_step() {
  static const Step s{
      .name = "fill-nodata",
      .summary = "invalid pixels set to --value V (no nodata left)",
      .kind = StepKind::raster,
      .op = Op::fill_nodata,
      .options = {"--value", "--ot", "-a_nodata"},
      .metadata = vsr::MetadataCopy::all,
      .default_dtype = same_dtype,
      .build =
          [](const Arguments& args, const StepFacts& facts) {
            return work(fill_nodata_step(), args, facts,
                        [v = *args.value](const vsr::OwnedRasterArray& t) {
                          return vsr::fill_nodata(t, v);
                        });
          },
  };
  return s;
}

const Step& focal_mean_step() {
  static const Step s{
      .name = "focal-mean",
      .summary = "3x3 mean of the valid pixels (float32/float64)",
      .kind = StepKind::raster,
      .op = Op::focal_mean,
      .options = {"--edge", "--ot", "-a_nodata"},
      .halo = 1,
      .metadata = vsr::MetadataCopy::all,
      .default_dtype = compute_dtype,
      .build =
          [](const Arguments& args, const StepFacts& facts) {
            return work(focal_mean_step(), args, facts,
                        [edge = args.edge](const vsr::OwnedRasterArray& r) {
                          return vsr::focal_mean_3x3(r, edge);
                        });
          },
  };
  return s;
}

const Step& normalized_difference_step() {
  static const Step s{
      .name = "normalized-difference",
      .alias = "ndvi",
      .summary = "(A - B) / (A + B) of two bands, A = --nir, B = --red",
      .kind = StepKind::raster,
      .op = Op::normalized_difference,
      .options = {"--nir", "--red", "--ot", "-a_nodata"},
      .per_band = false,
      .in_pipeline = false,
      .band_pair = true,
      .metadata = vsr::MetadataCopy::descriptive,
      .default_dtype = compute_dtype,
      .build =
          [](const Arguments& args, const StepFacts& facts) {
            // The tiles carry the two bands alone (the source's bands), each with its own nodata.
            return work(normalized_difference_step(), args, facts,
                        [na = facts.band_nodata[0],
                         nb = facts.band_nodata[1]](const vsr::OwnedRasterArray& r) {
                          return vsr::normalized_difference(r.band(0).with_nodata(na),
                                                            r.band(1).with_nodata(nb));
                        });
          },
  };
  return s;
}

}  // namespace vsr_run
