// SPDX-License-Identifier: Apache-2.0
// The output-nodata rule (ops.hpp, "The output's nodata"): which nodata an output gets, and the
// conversion that gives it to a raster without ever writing a valid pixel as nodata. The ops
// facade (calc), pipelines, vsr-run and the Python package all come here.
#include "ops/output_nodata.hpp"

#include "common/dtype_visit.hpp"
#include "common/expects.hpp"

#include <vibespatial/raster/dispatch.hpp>
#include <vibespatial/raster/ops.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace vibespatial::raster {

namespace detail {

bool nodata_fits(DType dtype, const NodataValue& v) noexcept {
  if (!dtype_holds(dtype, v)) return false;
  return !is_floating_point(dtype) || NodataValue(v.to_double()) == v;
}

namespace {

/// @p v as a T (a 64-bit integer type that holds it).
template <class T>
T as_pixel(const NodataValue& v) {
  if constexpr (std::is_signed_v<T>) {
    return static_cast<T>(v.as_int64().value_or(0));
  } else {
    return static_cast<T>(v.as_uint64().value_or(0));
  }
}

/// @p r (a 64-bit integer raster) with its invalid pixels rewritten as @p to, exactly: on the
/// host (no backend op writes a 64-bit sentinel a double cannot hold without converting the
/// values through a double), a device raster going there and back.
OwnedRasterArray retag_64bit(const OwnedRasterArray& r, const NodataValue& to) {
  OwnedRasterArray out =
      OwnedRasterArray::allocate(Residency::host, r.dtype(), r.band_count(), r.height(), r.width(),
                                 std::nullopt, r.affine(), r.crs());
  r.copy_to_host(out.mutable_host_data());
  const std::optional<NodataValue> from = r.exact_nodata();
  const std::int64_t n = r.height() * r.width() * r.band_count();
  visit_dtype(r.dtype(), [&](auto type) {
    using T = decltype(type);
    if constexpr (std::is_same_v<T, std::int64_t> || std::is_same_v<T, std::uint64_t>) {
      if (!from || !dtype_holds(r.dtype(), *from)) return;  // no pixel is invalid
      const T old = as_pixel<T>(*from), fresh = as_pixel<T>(to);
      T* px = static_cast<T*>(out.mutable_host_data());
      for (std::int64_t i = 0; i < n; ++i) {
        if (px[i] == old) px[i] = fresh;
      }
    }
  });
  OwnedRasterArray tagged = out.with_nodata(to);
  return r.residency() == Residency::host ? tagged : tagged.clone_to(r.residency());
}

}  // namespace

void check_no_valid_pixel_became_nodata(const char* who, const OwnedRasterArray& in,
                                        const OwnedRasterArray& out, const NodataValue& nodata,
                                        CUstream stream) {
  // On the stream @p out was written on: its statistics are ordered after that work.
  const std::vector<BandStatistics> before = band_statistics(in, stream),
                                    after = band_statistics(out, stream);
  for (std::size_t b = 0; b < before.size(); ++b) {
    const std::int64_t lost = before[b].count - after[b].count;
    if (lost == 0) continue;
    throw std::invalid_argument(
        std::string(who) + ": " + std::to_string(lost) + " valid pixel(s) of band " +
        std::to_string(b + 1) + " convert to " + nodata.to_string() + " (" +
        std::string(to_string(out.dtype())) +
        ") and would equal the output nodata: they would read as nodata; give the output another "
        "nodata that no valid pixel takes, "
        "or none (vsr-run: -a_nodata V or -a_nodata none; Python: nodata=; C++: "
        "CalcOptions::output_nodata or OutputNodata), or an output type that holds them apart");
  }
}

OwnedRasterArray convert_output_as(const char* who, const OwnedRasterArray& raster, DType out_dtype,
                                   const std::optional<NodataValue>& out_nodata) {
  (void)itemsize(out_dtype);  // throws std::invalid_argument for a bad dtype
  if (out_nodata) {
    VSR_EXPECTS(nodata_fits(out_dtype, *out_nodata),
                std::string(who) + ": the nodata " + out_nodata->to_string() +
                    " is not a value of " + std::string(to_string(out_dtype)));
  }
  const bool same = raster.dtype() == out_dtype;
  const std::optional<NodataValue> from = raster.exact_nodata();
  if (same && from == out_nodata) return raster;
  // A float raster whose nodata is NaN loses only the tag: its invalid pixels stay NaN.
  if (same && !out_nodata && is_floating_point(out_dtype) && from && from->is_nan()) {
    return raster.with_nodata(std::nullopt);
  }
  const auto convert = [&] {
    if (same && out_nodata && !out_nodata->is_nan()) {
      // The valid values stay exactly as they are: only the invalid pixels are rewritten.
      return NodataValue(out_nodata->to_double()) == *out_nodata
                 ? fill_nodata(raster, out_nodata->to_double()).with_nodata(out_nodata)
                 : retag_64bit(raster, *out_nodata);
    }
    if (same && !out_nodata && !is_floating_point(out_dtype)) return fill_nodata(raster, 0.0);
    if (!same && out_nodata && NodataValue(out_nodata->to_double()) != *out_nodata) {
      return convert_pixels_exact(raster, out_dtype, *out_nodata);  // INT64_MAX, UINT64_MAX, ...
    }
    return convert_pixels(raster, out_dtype, out_nodata);
  };
  const OwnedRasterArray result = convert();
  if (out_nodata && !out_nodata->is_nan()) {
    check_no_valid_pixel_became_nodata(who, raster, result, *out_nodata, current_op_stream());
  }
  return result;
}

}  // namespace detail

NodataValue default_nodata(DType dtype) {
  switch (dtype) {
    case DType::uint8:
      return NodataValue(255.0);
    case DType::int8:
      return NodataValue(127.0);
    case DType::uint16:
      return NodataValue(65535.0);
    case DType::int16:
      return NodataValue(32767.0);
    case DType::uint32:
      return NodataValue(4294967295.0);
    case DType::int32:
      return NodataValue(2147483647.0);
    case DType::uint64:
      return NodataValue(std::nextafter(18446744073709551616.0, 0.0));
    case DType::int64:
      return NodataValue(std::nextafter(9223372036854775808.0, 0.0));
    case DType::float32:
    case DType::float64:
      return NodataValue(std::numeric_limits<double>::quiet_NaN());
  }
  throw std::invalid_argument("default_nodata: unknown dtype");
}

std::optional<NodataValue> output_nodata(DType out_dtype, const OutputNodata& request,
                                         const std::vector<NodataCandidate>& candidates,
                                         bool needed) {
  const NodataValue fallback = default_nodata(out_dtype);  // checks the dtype
  switch (request.mode) {
    case OutputNodata::Mode::value:
      VSR_EXPECTS(detail::nodata_fits(out_dtype, request.value),
                  "output_nodata: " + request.value.to_string() + " is not a value of " +
                      std::string(to_string(out_dtype)));
      return request.value;
    case OutputNodata::Mode::none:
      return std::nullopt;
    case OutputNodata::Mode::rule:
      break;
  }
  if (!needed) return std::nullopt;
  for (const NodataCandidate& c : candidates) {
    if (!c.value) continue;
    // NaN is free in a float output: a value that only marked masked input pixels is not kept.
    if (c.marks_mask && is_floating_point(out_dtype)) continue;
    if (detail::nodata_fits(out_dtype, *c.value)) return *c.value;
  }
  return fallback;
}

OwnedRasterArray convert_output(const OwnedRasterArray& raster, DType out_dtype,
                                const std::optional<NodataValue>& out_nodata) {
  return detail::convert_output_as("convert_output", raster, out_dtype, out_nodata);
}

}  // namespace vibespatial::raster
