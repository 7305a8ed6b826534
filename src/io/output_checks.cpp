// SPDX-License-Identifier: Apache-2.0
// Raster files through GDAL, the checks of an output before any work (io.hpp): its options
// against the driver, and the trial file that exercises them (check_write_options,
// check_output_file).
#include "common/expects.hpp"
#include "common/text_escape.hpp"
#include "io/gdal_common.hpp"

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/io.hpp>

#include <cpl_string.h>
#include <gdal.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace vibespatial::raster {

namespace detail::gdal {

namespace {

/// Whether the creation option @p kv ("KEY=VALUE") sets a GeoTIFF or COG tile side.
bool is_block_option(const std::string& kv) {
  const std::size_t eq = kv.find('=');
  const std::string key = kv.substr(0, eq);
  return EQUAL(key.c_str(), "BLOCKXSIZE") || EQUAL(key.c_str(), "BLOCKYSIZE") ||
         EQUAL(key.c_str(), "BLOCKSIZE");
}

/// The trial of check_output_file: a georeferenced 16 x 16 raster of @p band_count
/// bands of @p dtype with @p nodata and @p crs written with @p options under @p path's name in a
/// temporary directory beside it, band by band, completed (closed, converted, overviews built,
/// verified), read back and removed. @p shape tells the trial apart in messages (" in blocks of
/// BLOCKSIZE=512").
/// @throws std::invalid_argument naming what the driver refuses; what Output throws.
void write_trial(const std::string& path, const WriteOptions& options, DType dtype, int band_count,
                 const std::optional<NodataValue>& nodata, const std::string& crs,
                 const std::string& name, const std::string& shape, QuietErrors& quiet,
                 const char* who) {
  constexpr std::int64_t side = 16;
  const WriteOptions& trial = options;
  // Band b holds 10 + 10 * (b % 11) (3 more where the nodata is one of those), a value every
  // dtype holds: what reads back tells a band lost, swapped or filled with other memory (MRF
  // pixel-interleaved, written band by band) from a lossy codec's small error.
  const double shift = nodata && std::fmod(nodata->to_double(), 10.0) == 0.0 &&
                               nodata->to_double() >= 10 && nodata->to_double() <= 110
                           ? 3.0
                           : 0.0;
  const auto band_value = [&](int b) { return 10.0 + 10.0 * (b % 11) + shift; };
  // With a nodata, every 5th pixel is nodata, amid valid ones: a driver that does not give them
  // back exactly (a lossy codec blurs them into their neighbours) would turn nodata pixels into
  // valid values.
  const auto is_nodata_pixel = [&](std::int64_t k) { return nodata && k % 5 == 2; };
  const double nodata_value = nodata ? nodata->to_double() : 0.0;
  const std::string wrote =
      std::to_string(band_count) + " band(s) of " + std::string(to_string(dtype)) +
      (nodata ? " with nodata " + nodata->to_string() : std::string()) + shape;
  {
    Output out(path, trial, who);  // never committed: removed
    out.check(dtype, band_count);
    try {
      // Georeferenced, as most outputs are (GPKG needs a geotransform).
      const Affine affine{1, 0, 0, 0, -1, side};
      GDALDatasetH ds = out.create(dtype, band_count, side, side, nodata, &affine, crs, quiet);
      // 8-byte cells: float64, or the dataset's own type for 64-bit integers (so that their
      // nodata, e.g. INT64_MAX, is written and compared exactly).
      const GDALDataType cell = dtype == DType::int64    ? GDT_Int64
                                : dtype == DType::uint64 ? GDT_UInt64
                                                         : GDT_Float64;
      std::vector<std::uint64_t> pixels(static_cast<std::size_t>(side * side * band_count));
      const auto put = [&](std::size_t i, double v) {
        if (cell == GDT_Int64) {
          pixels[i] = static_cast<std::uint64_t>(static_cast<std::int64_t>(v));
        } else if (cell == GDT_UInt64) {
          pixels[i] = static_cast<std::uint64_t>(v);
        } else {
          std::memcpy(&pixels[i], &v, sizeof v);
        }
      };
      const auto put_nodata = [&](std::size_t i) {
        if (cell == GDT_Int64) {
          pixels[i] = static_cast<std::uint64_t>(nodata->as_int64().value_or(0));
        } else if (cell == GDT_UInt64) {
          pixels[i] = nodata->as_uint64().value_or(0);
        } else {
          put(i, nodata_value);
        }
      };
      const auto value_at = [&](std::size_t i) {
        if (cell == GDT_Int64) return static_cast<double>(static_cast<std::int64_t>(pixels[i]));
        if (cell == GDT_UInt64) return static_cast<double>(pixels[i]);
        double v = 0;
        std::memcpy(&v, &pixels[i], sizeof v);
        return v;
      };
      const auto nodata_at = [&](std::size_t i) {
        if (cell == GDT_Int64) {
          return nodata->as_int64() == static_cast<std::int64_t>(pixels[i]);
        }
        if (cell == GDT_UInt64) return nodata->as_uint64() == pixels[i];
        const double v = value_at(i);
        return v == nodata_value || (std::isnan(v) && std::isnan(nodata_value));
      };
      for (int b = 0; b < band_count; ++b) {
        for (std::int64_t k = 0; k < side * side; ++k) {
          const auto i = static_cast<std::size_t>(b * side * side + k);
          if (is_nodata_pixel(k)) {
            put_nodata(i);
          } else {
            put(i, band_value(b));
          }
        }
      }
      std::vector<int> bands = all_bands(band_count);
      const auto io = [&](GDALDatasetH h, GDALRWFlag flag) {
        return GDALDatasetRasterIOEx(h, flag, 0, 0, static_cast<int>(side), static_cast<int>(side),
                                     pixels.data(), static_cast<int>(side), static_cast<int>(side),
                                     cell, band_count, bands.data(), 8, 8 * side, 8 * side * side,
                                     nullptr);
      };
      // Band by band, each flushed before the next, as a per-band streamed run writes (a pass
      // of one band, its blocks evicted from GDAL's cache before the next pass).
      for (int b = 0; b < band_count; ++b) {
        const CPLErr err = GDALRasterIO(
            GDALGetRasterBand(ds, b + 1), GF_Write, 0, 0, static_cast<int>(side),
            static_cast<int>(side), pixels.data() + static_cast<std::ptrdiff_t>(b * side * side),
            static_cast<int>(side), static_cast<int>(side), cell, 0, 0);
        if (err != CE_None) fail("cannot write raster '" + shown(path) + "'");
        GDALFlushCache(ds);
      }
      const std::string& file = out.complete(
          quiet,
          std::vector<std::optional<NodataValue>>(static_cast<std::size_t>(band_count), nodata));
      CPLStringList allowed;
      allowed.AddString(out.reading_driver().c_str());
      Dataset back(GDALOpenEx(file.c_str(), GDAL_OF_RASTER | GDAL_OF_READONLY, allowed.List(),
                              nullptr, nullptr));
      for (std::size_t i = 0; i < pixels.size(); ++i)
        put(i, cell == GDT_Float64 ? std::nan("") : 1);
      if (!back || io(back.get(), GF_Read) != CE_None) {
        fail("cannot write '" + shown(path) + "': GDAL's " + shown(name) +
             " driver cannot read back the pixels it wrote");
      }
      for (int b = 0; b < band_count; ++b) {
        for (std::int64_t k = 0; k < side * side; ++k) {
          const auto i = static_cast<std::size_t>(b * side * side + k);
          const double got = value_at(i);
          if (is_nodata_pixel(k)) {
            if (nodata_at(i)) continue;
            char text[160];
            std::snprintf(text, sizeof text,
                          "reads back %.17g in band %d where its nodata %s was written", got, b + 1,
                          nodata->to_string().c_str());
            throw std::runtime_error("GDAL's " + shown(name) + " driver " + text +
                                     ": it does not keep the nodata pixels of " + wrote +
                                     " (a lossy compression?), which would read as valid values");
          }
          if (!(std::fabs(got - band_value(b)) <= 3.0) || (nodata && nodata_at(i))) {
            char text[120];
            std::snprintf(text, sizeof text, "reads back %.17g in band %d where %g was written",
                          got, b + 1, band_value(b));
            throw std::runtime_error("GDAL's " + shown(name) + " driver " + text +
                                     ": it does not keep the pixels of " + wrote);
          }
        }
      }
    } catch (const std::invalid_argument&) {
      throw;
    } catch (const std::runtime_error& e) {
      // GDAL refused the raster itself (a band count or size the format cannot hold).
      std::string why = e.what();
      const std::string prefix = "cannot write '" + shown(path) + "': ";
      if (why.rfind(prefix, 0) == 0) why.erase(0, prefix.size());
      throw std::invalid_argument(std::string(who) + ": GDAL's " + shown(name) +
                                  " driver cannot write " + wrote + " to '" + shown(path) +
                                  "': " + why);
    }
  }
}

}  // namespace

}  // namespace detail::gdal

using namespace detail::gdal;

void check_write_options(const WriteOptions& options) {
  static constexpr const char* who = "check_write_options";
  QuietErrors quiet;
  (void)check_output_options(options, who);
}

void check_output_file(const std::string& path, const WriteOptions& options, DType dtype,
                       int band_count, const std::optional<NodataValue>& nodata,
                       const std::string& crs) {
  static constexpr const char* who = "check_output_file";
  VSR_EXPECTS(band_count >= 1,
              std::string(who) + ": band_count " + std::to_string(band_count) + " < 1");
  QuietErrors quiet;
  std::string name;
  (void)check_output_options(options, who, &name);
  // Tile sides given as creation options are tried as given, on one band: GDAL checks no upper
  // bound (COG's BLOCKSIZE=99999999 fails only when the file is made, which for COG is at the
  // end of a run).
  std::string blocks;
  for (const std::string& kv : options.creation_options) {
    if (is_block_option(kv)) blocks += (blocks.empty() ? "" : " ") + kv;
  }
  if (!blocks.empty()) {
    write_trial(path, options, dtype, 1, nodata, crs, name, " in blocks of " + blocks, quiet, who);
  }
  // The trial raster of every band: small, so that drivers that fill a new file up front write
  // little, in small GeoTIFF tiles (a 256 x 256 block per band of a 500-band trial would hold
  // 128 MiB; COG's smallest is 128), with every other creation option as given.
  WriteOptions trial = options;
  trial.block = name == "COG" ? 128 : 16;
  std::erase_if(trial.creation_options, is_block_option);
  write_trial(path, trial, dtype, band_count, nodata, crs, name, "", quiet, who);
}

}  // namespace vibespatial::raster
