// SPDX-License-Identifier: Apache-2.0
// The band operations' facade: argument checks, the backend chosen by residency (and, for device
// rasters, by the driver: the emulated device backend on the host emulator, the CUDA one on a
// real driver), output rasters. Plain C++ (no Thrust): the work happens in ops_host.cpp,
// ops_emulated.cpp or ops_cuda.cu.
#include "common/expects.hpp"
#include "common/text_escape.hpp"
#include "ops/device_work.hpp"
#include "ops/expression.hpp"
#include "ops/ops_backend.hpp"
#include "ops/output_nodata.hpp"

#include <vibespatial/raster/dispatch.hpp>
#include <vibespatial/raster/errors.hpp>
#include <vibespatial/raster/ops.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace vibespatial::raster {

namespace {

namespace be = detail::ops;
using be::emulated_device;
using be::Work;

/// The [lowest, max] range of an integer dtype, as doubles (int64/uint64 max round up to 2^63 /
/// 2^64, which are therefore excluded by the strict comparisons below).
void int_range(DType d, double& lo, double& hi) {
  switch (d) {
    case DType::uint8:
      lo = 0, hi = 255;
      return;
    case DType::int8:
      lo = -128, hi = 127;
      return;
    case DType::uint16:
      lo = 0, hi = 65535;
      return;
    case DType::int16:
      lo = -32768, hi = 32767;
      return;
    case DType::uint32:
      lo = 0, hi = 4294967295.0;
      return;
    case DType::int32:
      lo = -2147483648.0, hi = 2147483647.0;
      return;
    case DType::uint64:
      lo = 0, hi = 18446744073709551616.0;
      return;
    case DType::int64:
      lo = -9223372036854775808.0, hi = 9223372036854775808.0;
      return;
    default:
      lo = -INFINITY, hi = INFINITY;
      return;
  }
}

/// Whether @p v is exactly a value of @p d.
bool representable(double v, DType d) {
  return dtype_holds(d, NodataValue(v));
}

be::NodataSpec nodata_spec(const OwnedRasterArray& r) {
  be::NodataSpec s;
  const auto nd = r.exact_nodata();
  if (!nd) return s;
  // 64-bit integers compare against the exact sentinel (INT64_MAX is no double).
  if (r.dtype() == DType::int64) {
    if (const auto v = nd->as_int64()) s.has = true, s.bits = static_cast<std::uint64_t>(*v);
  } else if (r.dtype() == DType::uint64) {
    if (const auto v = nd->as_uint64()) s.has = true, s.bits = *v;
  } else if (representable(nd->to_double(), r.dtype())) {
    s.has = true;
  }
  s.value = nd->to_double();
  return s;
}

be::Layout layout_of(const OwnedRasterArray& r) {
  return be::Layout{r.band_count(), r.height(), r.width()};
}

[[noreturn, maybe_unused]] void no_cuda() {
  throw std::runtime_error(
      "the raster is device-resident but the library was built without CUDA, whose device ops "
      "a real GPU needs: move it to the host (move_to(Residency::host)) or rebuild with "
      "-Dcuda=enabled");
}

bool on_device(const OwnedRasterArray& r) {
  if (r.residency() != Residency::device) return false;
#if !defined(VSR_OPS_HAVE_CUDA)
  if (!emulated_device()) no_cuda();
#endif
  return true;
}

const void* pixels(const OwnedRasterArray& r) {
  return r.residency() == Residency::device ? r.device_pointer() : r.host_data();
}

void* mutable_pixels(OwnedRasterArray& r) {
  return r.residency() == Residency::device ? r.device_data() : r.mutable_host_data();
}

/// A new raster of @p r's shape and residency, for an op's result written on @p stream: its device
/// memory is the pool's for that stream, so it is never a block another stream's queued work may
/// still use without @p stream waiting for that work.
OwnedRasterArray like(const OwnedRasterArray& r, DType dtype, std::optional<NodataValue> nodata,
                      CUstream stream) {
  return OwnedRasterArray::allocate(r.residency(), dtype, r.band_count(), r.height(), r.width(),
                                    std::nullopt, r.affine(), r.crs(), stream)
      .with_nodata(nodata);
}

void require_finite(double v, const char* what) {
  VSR_EXPECTS(std::isfinite(v), std::string(what) + " must be finite");
}

/// Checks an output-into target: shape, residency and dtype as the result, and no overlap with
/// @p input other than the same pixels when @p in_place_ok.
void check_out(const OwnedRasterArray& input, const OwnedRasterArray& out, DType dtype,
               const char* op, bool in_place_ok) {
  const std::string where = std::string(op) + ": ";
  VSR_EXPECTS(out.band_count() == input.band_count() && out.height() == input.height() &&
                  out.width() == input.width(),
              where + "out has another shape than the input");
  VSR_EXPECTS(out.residency() == input.residency(),
              where + "out has another residency than the input");
  VSR_EXPECTS(out.dtype() == dtype, where + "out is " + std::string(to_string(out.dtype())) +
                                        ", the result is " + std::string(to_string(dtype)));
  const auto* a = static_cast<const unsigned char*>(pixels(input));
  const auto* b = static_cast<const unsigned char*>(pixels(out));
  const bool overlap = a < b + out.byte_size() && b < a + input.byte_size();
  VSR_EXPECTS(!overlap || (in_place_ok && a == b),
              where + (in_place_ok ? "out partly overlaps the input"
                                   : "out overlaps the input (it reads neighbours: use another "
                                     "raster)"));
}

/// Gives @p out the result's georeferencing.
void label(OwnedRasterArray& out, const OwnedRasterArray& source,
           std::optional<NodataValue> nodata) {
  out = out.with_nodata(nodata).with_georeferencing(source.affine(), source.crs());
}

// Calls backend::fn(args...) on the backend of the residency: host, or on the device the
// emulated backend (host emulator) or the CUDA one (a real driver).
#if defined(VSR_OPS_HAVE_CUDA)
#define VSR_OPS_CUDA_CALL(fn, ...) be::device::fn(__VA_ARGS__)
#else
#define VSR_OPS_CUDA_CALL(fn, ...) no_cuda()
#endif
#define VSR_OPS_CALL(on_dev, fn, ...)                  \
  (!(on_dev)           ? be::host::fn(__VA_ARGS__)     \
   : emulated_device() ? be::emulated::fn(__VA_ARGS__) \
                       : VSR_OPS_CUDA_CALL(fn, __VA_ARGS__))

/// "<op> on the device: <what>".
std::string on_device_message(const char* op, const char* what) {
  return std::string(op) + " on the device: " + what;
}

/// Runs @p f, the device path of operation @p op on @p stream (its output allocation included),
/// between the checks of before_device_work and after_device_work: every error of the device, the
/// driver or the pool leaves as the same type, its message naming @p op. A host path runs as is.
template <class F>
decltype(auto) guarded(bool dev, const char* op, CUstream stream, Work work, F&& f) {
  if (!dev) return f();
  try {
    be::before_device_work(op, stream, work);
    if constexpr (std::is_void_v<decltype(f())>) {
      f();
      be::after_device_work(op, stream, work);
    } else {
      auto result = f();
      be::after_device_work(op, stream, work);
      return result;
    }
  } catch (const DriverUnavailableError& e) {
    throw DriverUnavailableError(e.code(), e.name(), on_device_message(op, e.what()));
  } catch (const CudaError& e) {
    if (e.runtime_code() != 0) {
      throw CudaError(e.code(), e.name(), on_device_message(op, e.what()), e.runtime_code());
    }
    throw CudaError(e.code(), e.name(), on_device_message(op, e.what()));
  } catch (const OutOfMemoryError& e) {
    throw OutOfMemoryError(e.requested_bytes(), on_device_message(op, e.what()));
  }
}

}  // namespace

DType compute_dtype(DType dtype) {
  switch (dtype) {
    case DType::uint8:
    case DType::int8:
    case DType::uint16:
    case DType::int16:
    case DType::float32:
      return DType::float32;
    case DType::uint32:
    case DType::int32:
    case DType::uint64:
    case DType::int64:
    case DType::float64:
      return DType::float64;
  }
  throw std::invalid_argument("compute_dtype: unknown dtype");
}

bool ops_built_with_cuda() noexcept {
#if defined(VSR_OPS_HAVE_CUDA)
  return true;
#else
  return false;
#endif
}

std::vector<BandStatistics> band_statistics(const OwnedRasterArray& raster, CUstream stream) {
  const bool dev = on_device(raster);
  std::vector<BandStatistics> out(static_cast<std::size_t>(raster.band_count()));
  guarded(dev, "statistics", stream, Work::waited, [&] {
    VSR_OPS_CALL(dev, statistics, pixels(raster), raster.dtype(), layout_of(raster),
                 nodata_spec(raster), out.data(), stream);
  });
  return out;
}

std::vector<BandStatistics> band_statistics(const OwnedRasterArray& raster) {
  return band_statistics(raster, current_op_stream());
}

namespace {

struct RescaleSetup {
  std::optional<double> out_nodata;
  be::RescaleParams params;
};

RescaleSetup rescale_setup(const OwnedRasterArray& raster, double in_min, double in_max,
                           double out_min, double out_max, DType out_dtype) {
  require_finite(in_min, "rescale: in_min");
  require_finite(in_max, "rescale: in_max");
  require_finite(out_min, "rescale: out_min");
  require_finite(out_max, "rescale: out_max");
  VSR_EXPECTS(in_min != in_max, "rescale: in_min == in_max");
  (void)itemsize(out_dtype);  // throws std::invalid_argument for a bad dtype
  RescaleSetup r{{}, be::RescaleParams{in_min, in_max, out_min, out_max, 0}};
  const auto nd = raster.nodata();
  if (is_floating_point(out_dtype)) {
    // NaN is never a valid output, so it never takes a valid pixel for nodata.
    r.params.fill = std::numeric_limits<double>::quiet_NaN();
    if (nd) r.out_nodata = r.params.fill;
  } else if (nd) {
    // An integer output's nodata must lie outside the output range, where no valid pixel maps:
    // the source's when it does, else the dtype's largest value, else its smallest.
    const double lo = std::min(out_min, out_max), hi = std::max(out_min, out_max);
    double dlo = 0, dhi = 0;
    int_range(out_dtype, dlo, dhi);
    if (out_dtype == DType::int64 || out_dtype == DType::uint64) dhi = std::nextafter(dhi, 0.0);
    double fill = 0;
    if (representable(*nd, out_dtype) && (*nd < lo || *nd > hi)) {
      fill = *nd;
    } else if (dhi > hi) {
      fill = dhi;
    } else if (dlo < lo) {
      fill = dlo;
    } else {
      throw std::invalid_argument(
          "rescale: the output range [" + std::to_string(lo) + ", " + std::to_string(hi) +
          "] covers every value of " + std::string(to_string(out_dtype)) +
          ", so none is left for the nodata pixels: narrow the output range or use a float dtype");
    }
    r.out_nodata = fill;
    r.params.fill = fill;
  }
  return r;
}

void run_rescale(bool dev, const OwnedRasterArray& raster, const RescaleSetup& r,
                 OwnedRasterArray& out, CUstream stream) {
  VSR_OPS_CALL(dev, rescale, pixels(raster), raster.dtype(), mutable_pixels(out), out.dtype(),
               layout_of(raster).pixels(), nodata_spec(raster), r.params, stream);
}

}  // namespace

OwnedRasterArray rescale(const OwnedRasterArray& raster, double in_min, double in_max,
                         double out_min, double out_max, DType out_dtype, CUstream stream) {
  const RescaleSetup r = rescale_setup(raster, in_min, in_max, out_min, out_max, out_dtype);
  const bool dev = on_device(raster);  // before allocating: fails at once without CUDA
  return guarded(dev, "rescale", stream, Work::queued, [&] {
    OwnedRasterArray out = like(raster, out_dtype, r.out_nodata, stream);
    run_rescale(dev, raster, r, out, stream);
    return out;
  });
}

OwnedRasterArray rescale(const OwnedRasterArray& raster, double in_min, double in_max,
                         double out_min, double out_max, DType out_dtype) {
  return rescale(raster, in_min, in_max, out_min, out_max, out_dtype, current_op_stream());
}

void rescale_into(const OwnedRasterArray& raster, double in_min, double in_max, double out_min,
                  double out_max, OwnedRasterArray& out, CUstream stream) {
  const RescaleSetup r = rescale_setup(raster, in_min, in_max, out_min, out_max, out.dtype());
  check_out(raster, out, out.dtype(), "rescale_into", true);
  const bool dev = on_device(raster);
  guarded(dev, "rescale_into", stream, Work::queued,
          [&] { run_rescale(dev, raster, r, out, stream); });
  label(out, raster, r.out_nodata);
}

void rescale_into(const OwnedRasterArray& raster, double in_min, double in_max, double out_min,
                  double out_max, OwnedRasterArray& out) {
  rescale_into(raster, in_min, in_max, out_min, out_max, out, current_op_stream());
}

OwnedRasterArray detail::convert_pixels(const OwnedRasterArray& raster, DType out_dtype,
                                        const std::optional<NodataValue>& out_nodata) {
  (void)itemsize(out_dtype);  // throws std::invalid_argument for a bad dtype
  double fill = is_floating_point(out_dtype) ? std::numeric_limits<double>::quiet_NaN() : 0.0;
  if (out_nodata) {
    // The fill goes to the backend as a double: it must be one, and a value of out_dtype.
    const double v = out_nodata->to_double();
    VSR_EXPECTS(NodataValue(v) == *out_nodata && representable(v, out_dtype) &&
                    !(std::isnan(v) && !is_floating_point(out_dtype)),
                "convert_dtype: the nodata " + out_nodata->to_string() + " is not a value of " +
                    std::string(to_string(out_dtype)));
    fill = v;
  }
  const bool dev = on_device(raster);  // before allocating: fails at once without CUDA
  const CUstream stream = current_op_stream();
  return guarded(dev, "convert_dtype", stream, Work::queued, [&] {
    OwnedRasterArray o = like(raster, out_dtype, out_nodata, stream);
    // The identity map of rescale: (v - 0) * 1 + (-0.0) is v exactly, -0.0 included.
    const be::RescaleParams p{0.0, 1.0, -0.0, 1.0, fill};
    VSR_OPS_CALL(dev, rescale, pixels(raster), raster.dtype(), mutable_pixels(o), out_dtype,
                 layout_of(raster).pixels(), nodata_spec(raster), p, stream);
    return o;
  });
}

OwnedRasterArray convert_dtype(const OwnedRasterArray& raster, DType out_dtype,
                               std::optional<NodataValue> out_nodata) {
  OwnedRasterArray out = detail::convert_pixels(raster, out_dtype, out_nodata);
  if (out_nodata && !out_nodata->is_nan()) {
    // A valid pixel that became the nodata: fewer valid pixels out than in.
    const std::vector<BandStatistics> in = band_statistics(raster), got = band_statistics(out);
    for (std::size_t b = 0; b < in.size(); ++b) {
      VSR_EXPECTS(in[b].count == got[b].count,
                  "convert_dtype: " + std::to_string(in[b].count - got[b].count) +
                      " valid pixel(s) of band " + std::to_string(b + 1) + " convert to " +
                      out_nodata->to_string() + ", the nodata of the " +
                      std::string(to_string(out_dtype)) +
                      " output: use a wider type, or clip the values first");
    }
  }
  return out;
}

namespace {

/// Checks clip's bounds and rounds them to @p d (see ops.hpp).
void clip_bounds(DType d, double& lower, double& upper) {
  VSR_EXPECTS(!std::isnan(lower) && !std::isnan(upper), "clip: a bound is NaN");
  if (!is_floating_point(d)) {
    double lo = 0, hi = 0;
    int_range(d, lo, hi);
    if (d == DType::uint64 || d == DType::int64) {
      // 2^63 / 2^64 are not values of the type: the largest double below them is.
      hi = std::nextafter(hi, 0.0);
    }
    lower = std::max(std::ceil(lower), lo);
    upper = std::min(std::floor(upper), hi);
  } else if (d == DType::float32) {
    lower = std::max(lower, -static_cast<double>(std::numeric_limits<float>::max()));
    upper = std::min(upper, static_cast<double>(std::numeric_limits<float>::max()));
  }
  VSR_EXPECTS(lower <= upper, "clip: lower > upper");
}

void run_clip(bool dev, const OwnedRasterArray& raster, double lower, double upper,
              OwnedRasterArray& out, CUstream stream) {
  VSR_OPS_CALL(dev, clip, pixels(raster), raster.dtype(), mutable_pixels(out),
               layout_of(raster).pixels(), nodata_spec(raster), lower, upper, stream);
}

}  // namespace

OwnedRasterArray clip(const OwnedRasterArray& raster, double lower, double upper, CUstream stream) {
  clip_bounds(raster.dtype(), lower, upper);
  const bool dev = on_device(raster);  // before allocating: fails at once without CUDA
  OwnedRasterArray out = guarded(dev, "clip", stream, Work::queued, [&] {
    OwnedRasterArray o = like(raster, raster.dtype(), raster.exact_nodata(), stream);
    run_clip(dev, raster, lower, upper, o, stream);
    return o;
  });
  // A bound equal to the nodata turns the valid pixels clamped to it into nodata: refused.
  const be::NodataSpec nd = nodata_spec(raster);
  if (nd.has && !std::isnan(nd.value) && (nd.value == lower || nd.value == upper)) {
    detail::check_no_valid_pixel_became_nodata("clip", raster, out, *raster.exact_nodata(), stream);
  }
  return out;
}

OwnedRasterArray clip(const OwnedRasterArray& raster, double lower, double upper) {
  return clip(raster, lower, upper, current_op_stream());
}

void clip_into(const OwnedRasterArray& raster, double lower, double upper, OwnedRasterArray& out,
               CUstream stream) {
  clip_bounds(raster.dtype(), lower, upper);
  check_out(raster, out, raster.dtype(), "clip_into", true);
  const bool dev = on_device(raster);
  guarded(dev, "clip_into", stream, Work::queued,
          [&] { run_clip(dev, raster, lower, upper, out, stream); });
  label(out, raster, raster.exact_nodata());
}

void clip_into(const OwnedRasterArray& raster, double lower, double upper, OwnedRasterArray& out) {
  clip_into(raster, lower, upper, out, current_op_stream());
}

namespace {

void check_fill_value(const OwnedRasterArray& raster, double value) {
  VSR_EXPECTS(!std::isnan(value) && representable(value, raster.dtype()),
              "fill_nodata: " + std::to_string(value) + " is not a value of " +
                  std::string(to_string(raster.dtype())));
}

void run_fill(bool dev, const OwnedRasterArray& raster, double value, OwnedRasterArray& out,
              CUstream stream) {
  VSR_OPS_CALL(dev, fill_nodata, pixels(raster), raster.dtype(), mutable_pixels(out),
               layout_of(raster).pixels(), nodata_spec(raster), value, stream);
}

}  // namespace

OwnedRasterArray fill_nodata(const OwnedRasterArray& raster, double value, CUstream stream) {
  check_fill_value(raster, value);
  const bool dev = on_device(raster);  // before allocating: fails at once without CUDA
  return guarded(dev, "fill_nodata", stream, Work::queued, [&] {
    OwnedRasterArray out = like(raster, raster.dtype(), std::nullopt, stream);
    run_fill(dev, raster, value, out, stream);
    return out;
  });
}

OwnedRasterArray fill_nodata(const OwnedRasterArray& raster, double value) {
  return fill_nodata(raster, value, current_op_stream());
}

void fill_nodata_into(const OwnedRasterArray& raster, double value, OwnedRasterArray& out,
                      CUstream stream) {
  check_fill_value(raster, value);
  check_out(raster, out, raster.dtype(), "fill_nodata_into", true);
  const bool dev = on_device(raster);
  guarded(dev, "fill_nodata_into", stream, Work::queued,
          [&] { run_fill(dev, raster, value, out, stream); });
  label(out, raster, std::nullopt);
}

void fill_nodata_into(const OwnedRasterArray& raster, double value, OwnedRasterArray& out) {
  fill_nodata_into(raster, value, out, current_op_stream());
}

namespace {

void check_pair(const OwnedRasterArray& a, const OwnedRasterArray& b) {
  VSR_EXPECTS(a.dtype() == b.dtype() && a.band_count() == b.band_count() &&
                  a.height() == b.height() && a.width() == b.width() &&
                  a.residency() == b.residency(),
              "normalized_difference: a and b differ in dtype, shape or residency");
}

void run_normalized_difference(bool dev, const OwnedRasterArray& a, const OwnedRasterArray& b,
                               OwnedRasterArray& out, CUstream stream) {
  VSR_OPS_CALL(dev, normalized_difference, pixels(a), pixels(b), a.dtype(), mutable_pixels(out),
               layout_of(a).pixels(), nodata_spec(a), nodata_spec(b), stream);
}

}  // namespace

OwnedRasterArray normalized_difference(const OwnedRasterArray& a, const OwnedRasterArray& b,
                                       CUstream stream) {
  check_pair(a, b);
  const bool dev = on_device(a);  // before allocating: fails at once without CUDA
  return guarded(dev, "normalized_difference", stream, Work::queued, [&] {
    OwnedRasterArray out =
        like(a, compute_dtype(a.dtype()), std::numeric_limits<double>::quiet_NaN(), stream);
    run_normalized_difference(dev, a, b, out, stream);
    return out;
  });
}

OwnedRasterArray normalized_difference(const OwnedRasterArray& a, const OwnedRasterArray& b) {
  return normalized_difference(a, b, current_op_stream());
}

void normalized_difference_into(const OwnedRasterArray& a, const OwnedRasterArray& b,
                                OwnedRasterArray& out, CUstream stream) {
  check_pair(a, b);
  const DType out_dtype = compute_dtype(a.dtype());
  check_out(a, out, out_dtype, "normalized_difference_into", true);
  check_out(b, out, out_dtype, "normalized_difference_into", true);
  const bool dev = on_device(a);
  guarded(dev, "normalized_difference_into", stream, Work::queued,
          [&] { run_normalized_difference(dev, a, b, out, stream); });
  label(out, a, std::numeric_limits<double>::quiet_NaN());
}

void normalized_difference_into(const OwnedRasterArray& a, const OwnedRasterArray& b,
                                OwnedRasterArray& out) {
  normalized_difference_into(a, b, out, current_op_stream());
}

std::vector<std::vector<std::int64_t>> histogram(const OwnedRasterArray& raster, int bins,
                                                 double lower, double upper, CUstream stream) {
  VSR_EXPECTS(bins >= 1, "histogram: bins must be >= 1");
  require_finite(lower, "histogram: lower");
  require_finite(upper, "histogram: upper");
  VSR_EXPECTS(lower < upper, "histogram: lower >= upper");
  // The backends index bins (and the bins edge, bins + 1) in an int: 2^31 - 2 bins at most, for
  // all bands together (the limit the library has always had).
  VSR_EXPECTS(static_cast<std::int64_t>(raster.band_count()) * bins <
                  std::numeric_limits<std::int32_t>::max(),
              "histogram: band_count * bins must be below 2^31 - 1 (" +
                  std::to_string(raster.band_count()) + " bands x " + std::to_string(bins) +
                  " bins)");
  const bool dev = on_device(raster);
  const int bands = raster.band_count();
  std::vector<std::int64_t> flat(static_cast<std::size_t>(bands) * static_cast<std::size_t>(bins));
  guarded(dev, "histogram", stream, Work::waited, [&] {
    VSR_OPS_CALL(dev, histogram, pixels(raster), raster.dtype(), layout_of(raster),
                 nodata_spec(raster), bins, lower, upper, flat.data(), stream);
  });
  std::vector<std::vector<std::int64_t>> out(static_cast<std::size_t>(bands));
  for (int b = 0; b < bands; ++b)
    out[static_cast<std::size_t>(b)].assign(flat.begin() + std::int64_t{b} * bins,
                                            flat.begin() + std::int64_t{b + 1} * bins);
  return out;
}

std::vector<std::vector<std::int64_t>> histogram(const OwnedRasterArray& raster, int bins,
                                                 double lower, double upper) {
  return histogram(raster, bins, lower, upper, current_op_stream());
}

namespace {

void check_edge(EdgeMode edge) {
  VSR_EXPECTS(
      edge == EdgeMode::nearest || edge == EdgeMode::reflect || edge == EdgeMode::constant_nodata,
      "focal_mean_3x3: unknown edge mode");
}

void run_focal(bool dev, const OwnedRasterArray& raster, EdgeMode edge, OwnedRasterArray& out,
               CUstream stream) {
  VSR_OPS_CALL(dev, focal_mean_3x3, pixels(raster), raster.dtype(), mutable_pixels(out),
               layout_of(raster), nodata_spec(raster), edge, stream);
}

}  // namespace

OwnedRasterArray focal_mean_3x3(const OwnedRasterArray& raster, EdgeMode edge, CUstream stream) {
  check_edge(edge);
  const bool dev = on_device(raster);  // before allocating: fails at once without CUDA
  return guarded(dev, "focal_mean_3x3", stream, Work::queued, [&] {
    OwnedRasterArray out = like(raster, compute_dtype(raster.dtype()),
                                std::numeric_limits<double>::quiet_NaN(), stream);
    run_focal(dev, raster, edge, out, stream);
    return out;
  });
}

OwnedRasterArray focal_mean_3x3(const OwnedRasterArray& raster, EdgeMode edge) {
  return focal_mean_3x3(raster, edge, current_op_stream());
}

void focal_mean_3x3_into(const OwnedRasterArray& raster, EdgeMode edge, OwnedRasterArray& out,
                         CUstream stream) {
  check_edge(edge);
  check_out(raster, out, compute_dtype(raster.dtype()), "focal_mean_3x3_into", false);
  const bool dev = on_device(raster);
  guarded(dev, "focal_mean_3x3_into", stream, Work::queued,
          [&] { run_focal(dev, raster, edge, out, stream); });
  label(out, raster, std::numeric_limits<double>::quiet_NaN());
}

void focal_mean_3x3_into(const OwnedRasterArray& raster, EdgeMode edge, OwnedRasterArray& out) {
  focal_mean_3x3_into(raster, edge, out, current_op_stream());
}

// ---- Band math (calc)

namespace {

template <class T>
std::uint64_t bits_of(T value) {
  std::uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  return bits;
}

/// @p v (which @p d holds, or at least converts to exactly for a NodataSpec) as a value of @p d,
/// packed as the evaluator unpacks it.
std::uint64_t pack(DType d, const NodataValue& v) {
  switch (d) {
    case DType::uint8:
      return bits_of(static_cast<std::uint8_t>(*v.as_int64()));
    case DType::int8:
      return bits_of(static_cast<std::int8_t>(*v.as_int64()));
    case DType::uint16:
      return bits_of(static_cast<std::uint16_t>(*v.as_int64()));
    case DType::int16:
      return bits_of(static_cast<std::int16_t>(*v.as_int64()));
    case DType::uint32:
      return bits_of(static_cast<std::uint32_t>(*v.as_int64()));
    case DType::int32:
      return bits_of(static_cast<std::int32_t>(*v.as_int64()));
    case DType::uint64:
      return *v.as_uint64();
    case DType::int64:
      return bits_of(*v.as_int64());
    case DType::float32:
      return bits_of(static_cast<float>(v.to_double()));
    case DType::float64:
      return bits_of(v.to_double());
  }
  return 0;
}

/// The evaluator's view of band @p band_index of @p r.
be::CalcSlot calc_slot(const OwnedRasterArray& r, int band_index) {
  be::CalcSlot s;
  const std::size_t band_bytes =
      static_cast<std::size_t>(r.height() * r.width()) * itemsize(r.dtype());
  s.data = static_cast<const unsigned char*>(pixels(r)) +
           band_bytes * static_cast<std::size_t>(band_index);
  s.dtype = r.dtype();
  const be::NodataSpec spec = nodata_spec(r);
  // A NaN nodata marks NaN pixels only, which every float load treats as invalid anyway.
  s.has_nodata = spec.has && !std::isnan(spec.value);
  if (s.has_nodata) {
    s.nodata = (r.dtype() == DType::int64 || r.dtype() == DType::uint64)
                   ? spec.bits
                   : pack(r.dtype(), *r.exact_nodata());
  }
  return s;
}

/// The output's nodata by the output-nodata rule (ops.hpp): given (none with no_nodata), else
/// the nodata of the first input that the expressions read (@p read, by input) and that has one,
/// when the dtype holds it, else default_nodata().
std::optional<NodataValue> calc_output_nodata(const std::vector<CalcInput>& inputs,
                                              const std::vector<bool>& read,
                                              const CalcOptions& options) {
  const DType d = options.output;
  if (options.no_nodata) {
    VSR_EXPECTS(!options.output_nodata, "calc: output_nodata and no_nodata are both given");
    return std::nullopt;
  }
  if (options.output_nodata) {
    VSR_EXPECTS(detail::nodata_fits(d, *options.output_nodata),
                "calc: the output nodata " + options.output_nodata->to_string() +
                    " is not a value of " + std::string(to_string(d)));
  }
  std::vector<NodataCandidate> first;
  for (std::size_t i = 0; i < inputs.size() && first.empty(); ++i) {
    if (!read[i]) continue;
    if (const auto nd = inputs[i].raster.exact_nodata()) {
      first.push_back({nd, inputs[i].nodata_marks_mask});
    }
  }
  return output_nodata(
      d, options.output_nodata ? OutputNodata::of(*options.output_nodata) : OutputNodata::by_rule(),
      first, true);
}

/// Runs the evaluator of @p code over @p slots: one band of @p dtype per expression, of @p r0's
/// grid and residency, invalid pixels (and NaN results, in an integer dtype) written as @p fill,
/// the result's nodata @p tag.
OwnedRasterArray run_calc(const detail::CalcCompiled& prog, const std::vector<be::CalcSlot>& slots,
                          const OwnedRasterArray& r0, DType dtype, const NodataValue& fill,
                          const std::optional<NodataValue>& tag, bool compute_float32,
                          bool propagate_nodata, CUstream stream) {
  const bool dev = on_device(r0);  // before allocating: fails at once without CUDA
  const detail::CalcCode& code = compute_float32 ? prog.f32 : prog.f64;
  const int bands = static_cast<int>(prog.expressions.size());
  return guarded(dev, "calc", stream, Work::queued, [&] {
    OwnedRasterArray out =
        OwnedRasterArray::allocate(r0.residency(), dtype, bands, r0.height(), r0.width(),
                                   std::nullopt, r0.affine(), r0.crs(), stream)
            .with_nodata(tag);
    const std::size_t band_bytes =
        static_cast<std::size_t>(r0.height() * r0.width()) * itemsize(dtype);
    auto* base = static_cast<unsigned char*>(mutable_pixels(out));
    std::vector<be::CalcOutputBand> outputs(static_cast<std::size_t>(bands));
    for (int k = 0; k < bands; ++k) {
      be::CalcOutputBand& o = outputs[static_cast<std::size_t>(k)];
      o.data = base + band_bytes * static_cast<std::size_t>(k);
      o.dtype = dtype;
      o.nodata = pack(dtype, fill);
    }
    be::CalcLaunch launch;
    launch.code = code.code.data();
    launch.code_size = static_cast<int>(code.code.size());
    launch.constants = code.constants.data();
    launch.constant_count = static_cast<int>(code.constants.size());
    launch.slots = slots.data();
    launch.slot_count = static_cast<int>(slots.size());
    launch.outputs = outputs.data();
    launch.output_count = bands;
    launch.pixels = r0.height() * r0.width();
    launch.compute_float32 = compute_float32;
    launch.propagate_nodata = propagate_nodata;
    VSR_OPS_CALL(dev, calc, launch, stream);
    return out;
  });
}

std::string quoted(const std::string& name) {
  std::string q = detail::printable(name);
  q.insert(q.begin(), '\'');
  q.push_back('\'');
  return q;
}

std::string affine_text(const Affine& a) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "(%.17g, %.17g, %.17g, %.17g, %.17g, %.17g)", a.a, a.b, a.c, a.d,
                a.e, a.f);
  return buf;
}

/// Checks that the inputs can be evaluated together: one size, residency, affine and CRS.
void check_calc_inputs(const std::vector<CalcInput>& inputs) {
  const CalcInput& first = inputs.front();
  const OwnedRasterArray& r0 = first.raster;
  for (std::size_t i = 1; i < inputs.size(); ++i) {
    const OwnedRasterArray& r = inputs[i].raster;
    const std::string pair =
        "calc: inputs " + quoted(first.name) + " and " + quoted(inputs[i].name) + " differ in ";
    VSR_EXPECTS(r.height() == r0.height() && r.width() == r0.width(),
                pair + "size (" + std::to_string(r0.height()) + " x " + std::to_string(r0.width()) +
                    " and " + std::to_string(r.height()) + " x " + std::to_string(r.width()) +
                    ", height x width)");
    VSR_EXPECTS(r.residency() == r0.residency(),
                pair + "residency (one is on the host, the other on the device)");
    VSR_EXPECTS(r.affine() == r0.affine(),
                pair + "affine: " + affine_text(r0.affine()) + " and " + affine_text(r.affine()));
    VSR_EXPECTS(r.crs() == r0.crs(), pair + "CRS (compared as text)");
  }
}

}  // namespace

CalcProgram compile_calc(const std::vector<std::string>& expressions,
                         const std::vector<CalcInputBands>& inputs) {
  return detail::CalcAccess::make(
      detail::compile_calc_expressions("compile_calc", expressions, inputs));
}

OwnedRasterArray calc(const CalcProgram& program, const std::vector<CalcInput>& inputs,
                      const CalcOptions& options, CUstream stream) {
  const detail::CalcCompiled* prog = detail::CalcAccess::get(program);
  VSR_EXPECTS(prog != nullptr, "calc: the program is empty (default-constructed)");
  VSR_EXPECTS(!inputs.empty(), "calc: no inputs (the output's size comes from them)");
  VSR_EXPECTS(to_string(options.output) != "unknown", "calc: the output dtype is not a DType");
  // Which given input is each of the program's inputs.
  const std::size_t n_prog = prog->inputs.size();
  std::vector<int> given(n_prog, -1);
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    std::size_t j = 0;
    while (j < n_prog && prog->inputs[j].name != inputs[i].name) ++j;
    VSR_EXPECTS(j < n_prog, "calc: input " + quoted(inputs[i].name) +
                                " is not one the program was compiled for");
    VSR_EXPECTS(given[j] < 0, "calc: input " + quoted(inputs[i].name) + " is given twice");
    given[j] = static_cast<int>(i);
  }
  for (std::size_t j = 0; j < n_prog; ++j) {
    VSR_EXPECTS(given[j] >= 0 || prog->bands_read[j].bands.empty(),
                "calc: the expressions read input " + quoted(prog->inputs[j].name) +
                    ", which is not given");
  }
  for (std::size_t j = 0; j < n_prog; ++j) {
    if (given[j] < 0) continue;
    const CalcInput& in = inputs[static_cast<std::size_t>(given[j])];
    const int compiled = prog->inputs[j].band_count;
    const std::string name = quoted(in.name);
    if (in.bands.empty()) {
      VSR_EXPECTS(in.raster.band_count() == compiled,
                  "calc: input " + name + " has " + std::to_string(in.raster.band_count()) +
                      " bands, the program was compiled for " + std::to_string(compiled) +
                      " (give CalcInput::bands when it holds some of them)");
      continue;
    }
    VSR_EXPECTS(static_cast<std::size_t>(in.raster.band_count()) == in.bands.size(),
                "calc: input " + name + " has " + std::to_string(in.raster.band_count()) +
                    " bands, but its CalcInput::bands lists " + std::to_string(in.bands.size()));
    for (std::size_t k = 0; k < in.bands.size(); ++k) {
      const int b = in.bands[k];
      VSR_EXPECTS(b >= 1 && b <= compiled, "calc: CalcInput::bands of " + name + " lists band " +
                                               std::to_string(b) + ", not one of 1 to " +
                                               std::to_string(compiled));
      VSR_EXPECTS(
          std::find(in.bands.begin(), in.bands.begin() + static_cast<std::ptrdiff_t>(k), b) ==
              in.bands.begin() + static_cast<std::ptrdiff_t>(k),
          "calc: CalcInput::bands of " + name + " lists band " + std::to_string(b) + " twice");
    }
  }
  check_calc_inputs(inputs);
  std::vector<bool> read(inputs.size(), false);
  for (std::size_t j = 0; j < n_prog; ++j) {
    if (given[j] >= 0)
      read[static_cast<std::size_t>(given[j])] = !prog->bands_read[j].bands.empty();
  }
  const std::optional<NodataValue> out_nodata = calc_output_nodata(inputs, read, options);

  std::vector<be::CalcSlot> slots;
  slots.reserve(prog->slots.size());
  for (const detail::CalcSlotRef& s : prog->slots) {
    const CalcInput& in =
        inputs[static_cast<std::size_t>(given[static_cast<std::size_t>(s.input)])];
    int index = s.band - 1;
    if (!in.bands.empty()) {
      const auto it = std::find(in.bands.begin(), in.bands.end(), s.band);
      VSR_EXPECTS(it != in.bands.end(), "calc: input " + quoted(in.name) + " lacks band " +
                                            std::to_string(s.band) +
                                            ", which the expressions read (see CalcInput::bands)");
      index = static_cast<int>(it - in.bands.begin());
    }
    slots.push_back(calc_slot(in.raster, index));
  }

  const OwnedRasterArray& r0 = inputs.front().raster;
  const DType out = options.output;
  const NodataValue nan(std::numeric_limits<double>::quiet_NaN());
  if (!out_nodata || (is_floating_point(out) && out_nodata->is_nan())) {
    // No valid result can be the nodata (NaN results are invalid; without a nodata nothing is).
    const NodataValue fill = out_nodata ? *out_nodata : is_floating_point(out) ? nan : 0.0;
    return run_calc(*prog, slots, r0, out, fill, out_nodata, options.compute_float32,
                    options.propagate_nodata, stream);
  }
  // A valid result may equal the nodata: computed with NaN for the invalid pixels (the output
  // dtype if a float, else the compute type, which holds every result before its conversion),
  // then given the nodata by the rule's one conversion, which refuses such a pixel.
  const DType as = is_floating_point(out)    ? out
                   : options.compute_float32 ? DType::float32
                                             : DType::float64;
  const OwnedRasterArray computed = run_calc(
      *prog, slots, r0, as, nan, nan, options.compute_float32, options.propagate_nodata, stream);
  return detail::convert_output_as("calc", computed, out, out_nodata);
}

OwnedRasterArray detail::convert_pixels_exact(const OwnedRasterArray& raster, DType out_dtype,
                                              const NodataValue& out_nodata) {
  // The identity program "A[1]", "A[2]", ... in the compute type convert_dtype converts through.
  std::vector<std::string> expressions;
  for (int b = 1; b <= raster.band_count(); ++b) {
    expressions.push_back("A[" + std::to_string(b) + "]");
  }
  const CalcProgram program = compile_calc(expressions, {{"A", raster.band_count()}});
  const detail::CalcCompiled* prog = detail::CalcAccess::get(program);
  std::vector<be::CalcSlot> slots;
  for (const detail::CalcSlotRef& s : prog->slots) slots.push_back(calc_slot(raster, s.band - 1));
  return run_calc(*prog, slots, raster, out_dtype, out_nodata, out_nodata,
                  compute_dtype(raster.dtype()) == DType::float32, true, current_op_stream());
}

OwnedRasterArray calc(const std::vector<std::string>& expressions,
                      const std::vector<CalcInput>& inputs, const CalcOptions& options,
                      CUstream stream) {
  VSR_EXPECTS(!inputs.empty(), "calc: no inputs (the output's size comes from them)");
  std::vector<CalcInputBands> shapes;
  shapes.reserve(inputs.size());
  for (const CalcInput& in : inputs) {
    int count = in.raster.band_count();
    if (!in.bands.empty()) count = std::max(1, *std::max_element(in.bands.begin(), in.bands.end()));
    shapes.push_back(CalcInputBands{in.name, count});
  }
  return calc(
      detail::CalcAccess::make(detail::compile_calc_expressions("calc", expressions, shapes)),
      inputs, options, stream);
}

}  // namespace vibespatial::raster
