// SPDX-License-Identifier: Apache-2.0
// GDAL mask bands of inputs (io.hpp, OpenOptions::ignore_mask), as GDAL's mask flags say: where
// a band's validity is its mask (an internal or external .msk mask, an alpha band, a dataset's
// NODATA_VALUES), the mask alone decides and the band's nodata is not consulted, as
// GDALGetMaskBand and rasterio's masked reads do. The tile executor's file source writes one
// value that no pixel left valid takes (mask_marker) into the masked pixels and reads it as the
// band's nodata, so that every op skips them and no valid pixel is taken for one
// (docs/outputs.md).
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

/// Reads @p w of @p band as T (the band's dtype) into @p px.
template <class T>
void read_pixels(GDALRasterBandH band, DType dtype, const RasterWindow& w, std::vector<T>& px,
                 const std::string& path) {
  px.resize(static_cast<std::size_t>(w.width * w.height));
  if (GDALRasterIO(band, GF_Read, static_cast<int>(w.col_off), static_cast<int>(w.row_off),
                   static_cast<int>(w.width), static_cast<int>(w.height), px.data(),
                   static_cast<int>(w.width), static_cast<int>(w.height), gdal_type(dtype), 0,
                   0) != CE_None) {
    fail("cannot read '" + shown(path) + "'");
  }
}

/// The values of T a marker may take, in the order they are preferred: @p preferred, then for
/// 8- and 16-bit types every value from the largest down, for wider types the largest and the
/// smallest.
template <class T>
std::vector<T> marker_candidates(const std::optional<NodataValue>& preferred, DType dtype) {
  std::vector<T> out;
  if (preferred && dtype_holds(dtype, *preferred)) out.push_back(as_pixel<T>(*preferred));
  if constexpr (sizeof(T) <= 2) {
    for (std::int64_t v = std::numeric_limits<T>::max(); v >= std::numeric_limits<T>::min(); --v) {
      out.push_back(static_cast<T>(v));
    }
  } else {
    out.push_back(std::numeric_limits<T>::max());
    out.push_back(std::numeric_limits<T>::min());
  }
  return out;
}

}  // namespace

bool has_pixel_mask(GDALRasterBandH band) {
  const int flags = GDALGetMaskFlags(band);
  return (flags & GMF_ALL_VALID) == 0 && flags != GMF_NODATA;
}

NodataValue mask_marker(GDALDatasetH ds, const std::vector<int>& masked,
                        const std::vector<int>& plain, DType dtype,
                        const std::optional<NodataValue>& preferred, const std::string& path) {
  if (is_floating_point(dtype)) return NodataValue(std::numeric_limits<double>::quiet_NaN());
  std::optional<NodataValue> found;
  with_type(dtype, [&](auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    if constexpr (std::is_integral_v<T>) {
      const std::vector<T> candidates = marker_candidates<T>(preferred, dtype);
      // Which candidates a pixel that stays valid takes: a table of every value for 8 and 16
      // bits, else a look at each of the few candidates.
      constexpr bool table = sizeof(T) <= 2;
      const auto index = [](T v) {
        return static_cast<std::size_t>(static_cast<std::int64_t>(v) -
                                        std::numeric_limits<T>::min());
      };
      std::vector<bool> taken(table ? std::size_t{1} << (8 * sizeof(T)) : candidates.size());
      const auto take = [&](T v) {
        if constexpr (table) {
          taken[index(v)] = true;
        } else {
          for (std::size_t c = 0; c < candidates.size(); ++c) {
            if (candidates[c] == v) taken[c] = true;
          }
        }
      };
      const std::int64_t width = GDALGetRasterXSize(ds), height = GDALGetRasterYSize(ds);
      const std::int64_t rows =
          std::max<std::int64_t>(1, (std::int64_t{1} << 22) / std::max<std::int64_t>(width, 1));
      std::vector<T> px;
      for (const auto& [bands, use_mask] : {std::pair{&masked, true}, std::pair{&plain, false}}) {
        for (const int band : *bands) {
          GDALRasterBandH b = GDALGetRasterBand(ds, band);
          for (std::int64_t r = 0; r < height; r += rows) {
            const RasterWindow w{0, r, width, std::min(rows, height - r)};
            read_pixels(b, dtype, w, px, path);
            if (!use_mask) {
              for (const T v : px) take(v);
              continue;
            }
            const std::vector<std::uint8_t> mask = read_mask(b, w, path);
            for (std::size_t i = 0; i < px.size(); ++i) {
              if (mask[i] != 0) take(px[i]);
            }
          }
        }
      }
      for (std::size_t c = 0; c < candidates.size() && !found; ++c) {
        if (!taken[table ? index(candidates[c]) : c]) {
          found = std::is_signed_v<T>
                      ? NodataValue::from_int64(static_cast<std::int64_t>(candidates[c]))
                      : NodataValue::from_uint64(static_cast<std::uint64_t>(candidates[c]));
        }
      }
    }
  });
  if (found) return *found;
  std::string list;
  for (const int band : masked) list += (list.empty() ? "" : ", ") + std::to_string(band);
  std::string others;
  for (const int band : plain) others += (others.empty() ? "" : ", ") + std::to_string(band);
  throw std::runtime_error(
      "band(s) " + list + " of '" + shown(path) + "' take their GDAL mask" +
      (others.empty() ? "" : " (and band(s) " + others + ", read with them, have no nodata)") +
      ", and the pixels that stay valid take every " + std::string(to_string(dtype)) +
      " value tried: none is left to mark the masked pixels; read the file without its mask "
      "(vsr-run --ignore-mask, OpenOptions::ignore_mask: every band as data, so an alpha band "
      "read with the others is carried through and stays their mask in the output, as "
      "gdal_translate copies it)" +
      (others.empty() ? "" : ", or select fewer bands (-b)"));
}

void apply_masks(GDALDatasetH ds, OwnedRasterArray& tile, const RasterWindow& window,
                 const std::vector<int>& bands,
                 const std::vector<std::optional<NodataValue>>& marker,
                 const std::vector<bool>& masked, const std::string& path) {
  const std::int64_t band_px = window.width * window.height;
  auto* base = static_cast<std::byte*>(tile.mutable_host_data());
  for (std::size_t b = 0; b < bands.size(); ++b) {
    if (!masked[b] || !marker[b]) continue;
    const std::vector<std::uint8_t> mask = read_mask(GDALGetRasterBand(ds, bands[b]), window, path);
    with_type(tile.dtype(), [&](auto* type) {
      using T = std::remove_pointer_t<decltype(type)>;
      T* px = reinterpret_cast<T*>(base) + static_cast<std::ptrdiff_t>(b) * band_px;
      const T fill = as_pixel<T>(*marker[b]);
      std::int64_t clashes = 0;
      for (std::int64_t i = 0; i < band_px; ++i) {
        if (mask[static_cast<std::size_t>(i)] == 0) {
          px[i] = fill;
        } else if (px[i] == fill) {
          ++clashes;  // NaN never compares equal: a float marker cannot clash
        }
      }
      if (clashes > 0) {
        throw std::runtime_error(
            std::to_string(clashes) + " valid pixel(s) of band " + std::to_string(bands[b]) +
            " of '" + shown(path) + "' hold " + marker[b]->to_string() +
            ", the value its masked pixels were given (no pixel held it when the file was "
            "opened: was it changed since?); read the file without its mask (vsr-run "
            "--ignore-mask, OpenOptions::ignore_mask)");
      }
    });
  }
}

}  // namespace vibespatial::raster::detail::gdal
