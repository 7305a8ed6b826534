// SPDX-License-Identifier: Apache-2.0
// GDAL mask bands of inputs (io.hpp, OpenOptions::ignore_mask): an internal or external (.msk)
// mask, or an alpha band, marks pixels invalid; the tile executor's file source writes its
// band's nodata into them, so that every op skips them as nodata pixels (docs/outputs.md).
#include "io/gdal_common.hpp"

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/io.hpp>

#include <gdal.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace vibespatial::raster::detail::gdal {

namespace {

/// Calls @p fn with a null pointer of the C++ type of @p dtype.
template <class Fn>
void with_type(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::uint8:
      return fn(static_cast<std::uint8_t*>(nullptr));
    case DType::int8:
      return fn(static_cast<std::int8_t*>(nullptr));
    case DType::uint16:
      return fn(static_cast<std::uint16_t*>(nullptr));
    case DType::int16:
      return fn(static_cast<std::int16_t*>(nullptr));
    case DType::uint32:
      return fn(static_cast<std::uint32_t*>(nullptr));
    case DType::int32:
      return fn(static_cast<std::int32_t*>(nullptr));
    case DType::uint64:
      return fn(static_cast<std::uint64_t*>(nullptr));
    case DType::int64:
      return fn(static_cast<std::int64_t*>(nullptr));
    case DType::float32:
      return fn(static_cast<float*>(nullptr));
    default:
      return fn(static_cast<double*>(nullptr));
  }
}

/// @p v as a T (a value dtype_holds for T's dtype).
template <class T>
T as_pixel(const NodataValue& v) {
  if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(v.to_double());
  } else if constexpr (std::is_signed_v<T>) {
    return static_cast<T>(v.as_int64().value_or(0));
  } else {
    return static_cast<T>(v.as_uint64().value_or(0));
  }
}

NodataValue of_pixel(std::int64_t v) {
  return NodataValue::from_int64(v);
}

/// The mask of @p band over @p w (0: invalid), as GDAL gives it.
std::vector<std::uint8_t> read_mask(GDALRasterBandH band, const RasterWindow& w,
                                    const std::string& path) {
  std::vector<std::uint8_t> mask(static_cast<std::size_t>(w.width * w.height));
  if (GDALRasterIO(GDALGetMaskBand(band), GF_Read, static_cast<int>(w.col_off),
                   static_cast<int>(w.row_off), static_cast<int>(w.width),
                   static_cast<int>(w.height), mask.data(), static_cast<int>(w.width),
                   static_cast<int>(w.height), GDT_Byte, 0, 0) != CE_None) {
    fail("cannot read the mask of '" + shown(path) + "'");
  }
  return mask;
}

}  // namespace

bool has_pixel_mask(GDALRasterBandH band) {
  const int flags = GDALGetMaskFlags(band);
  return (flags & GMF_ALL_VALID) == 0 && (flags & GMF_NODATA) == 0;
}

NodataValue mask_nodata(GDALDatasetH ds, const std::vector<int>& bands, DType dtype,
                        const std::string& path) {
  if (is_floating_point(dtype)) return NodataValue(std::numeric_limits<double>::quiet_NaN());
  switch (dtype) {
    case DType::uint32:
      return NodataValue(4294967295.0);
    case DType::int32:
      return NodataValue(2147483647.0);
    case DType::uint64:
      return NodataValue::from_uint64(std::numeric_limits<std::uint64_t>::max());
    case DType::int64:
      return NodataValue::from_int64(std::numeric_limits<std::int64_t>::max());
    default:
      break;
  }
  // 8 and 16 bits: a value no valid pixel of the bands takes, found by a pass over each band and
  // its mask (the largest free one), so that no valid pixel ever reads as a masked one; one for
  // all of them, so that the bands of an RGB image with a mask keep one nodata (GeoTIFF holds
  // one for all bands).
  const std::int64_t width = GDALGetRasterXSize(ds), height = GDALGetRasterYSize(ds);
  const bool is_signed = dtype == DType::int8 || dtype == DType::int16;
  const int bits = dtype == DType::uint8 || dtype == DType::int8 ? 8 : 16;
  const std::int64_t lo = is_signed ? -(std::int64_t{1} << (bits - 1)) : 0;
  const std::int64_t count = std::int64_t{1} << bits;
  std::vector<bool> taken(static_cast<std::size_t>(count), false);
  const std::int64_t rows =
      std::max<std::int64_t>(1, (std::int64_t{1} << 22) / std::max<std::int64_t>(width, 1));
  for (const int band : bands) {
    GDALRasterBandH b = GDALGetRasterBand(ds, band);
    for (std::int64_t r = 0; r < height; r += rows) {
      const RasterWindow w{0, r, width, std::min(rows, height - r)};
      const std::vector<std::uint8_t> mask = read_mask(b, w, path);
      std::vector<std::int32_t> px(mask.size());
      if (GDALRasterIO(b, GF_Read, 0, static_cast<int>(w.row_off), static_cast<int>(w.width),
                       static_cast<int>(w.height), px.data(), static_cast<int>(w.width),
                       static_cast<int>(w.height), GDT_Int32, 0, 0) != CE_None) {
        fail("cannot read '" + shown(path) + "'");
      }
      for (std::size_t i = 0; i < px.size(); ++i) {
        if (mask[i] == 0) continue;
        std::int64_t v = px[i];
        // int8 held as GDAL Byte (SIGNEDBYTE, GDAL < 3.7): the byte's signed value.
        if (dtype == DType::int8 && v > 127) v -= 256;
        taken[static_cast<std::size_t>(v - lo)] = true;
      }
    }
  }
  for (std::int64_t k = count - 1; k >= 0; --k) {
    if (!taken[static_cast<std::size_t>(k)]) return of_pixel(k + lo);
  }
  std::string list;
  for (const int band : bands) list += (list.empty() ? "" : ", ") + std::to_string(band);
  throw std::runtime_error("band(s) " + list + " of '" + shown(path) +
                           "' have a GDAL mask and no nodata, and their valid pixels take every " +
                           std::string(to_string(dtype)) +
                           " value: none is left to mark the masked pixels; give the file a "
                           "nodata, or read it without its mask (vsr-run --ignore-mask, "
                           "OpenOptions::ignore_mask)");
}

void apply_masks(GDALDatasetH ds, OwnedRasterArray& tile, const RasterWindow& window,
                 const std::vector<int>& bands,
                 const std::vector<std::optional<NodataValue>>& nodata,
                 const std::vector<bool>& masked, const std::vector<bool>& chosen,
                 const std::string& path) {
  const std::int64_t band_px = window.width * window.height;
  auto* base = static_cast<std::byte*>(tile.mutable_host_data());
  for (std::size_t b = 0; b < bands.size(); ++b) {
    if (!masked[b] || !nodata[b]) continue;
    const std::vector<std::uint8_t> mask = read_mask(GDALGetRasterBand(ds, bands[b]), window, path);
    with_type(tile.dtype(), [&](auto* type) {
      using T = std::remove_pointer_t<decltype(type)>;
      T* px = reinterpret_cast<T*>(base) + static_cast<std::ptrdiff_t>(b) * band_px;
      const T fill = as_pixel<T>(*nodata[b]);
      std::int64_t clashes = 0;
      for (std::int64_t i = 0; i < band_px; ++i) {
        if (mask[static_cast<std::size_t>(i)] == 0) {
          px[i] = fill;
        } else if (chosen[b] && px[i] == fill) {
          ++clashes;
        }
      }
      if (clashes > 0) {
        throw std::runtime_error(
            std::to_string(clashes) + " valid pixel(s) of band " + std::to_string(bands[b]) +
            " of '" + shown(path) + "' hold " + nodata[b]->to_string() +
            ", the value its masked pixels were given (it has a GDAL mask and no nodata): give "
            "the file a nodata, or read it without its mask (vsr-run --ignore-mask, "
            "OpenOptions::ignore_mask)");
      }
    });
  }
}

}  // namespace vibespatial::raster::detail::gdal
