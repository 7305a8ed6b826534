// SPDX-License-Identifier: Apache-2.0
// Reprojection (warp) as GDAL's gdalwarp does it: the output grid gdalwarp would choose (or the
// one asked for with gdalwarp's -tr/-te/-ts), the transform through GDAL's transformer API (so
// every CRS, datum grid and pipeline PROJ knows), and GDAL's resampling kernels and nodata rules
// in the library's own code, the same on every backend. docs/warp.md says what matches gdalwarp
// and where it differs.
//
// GDAL is an optional build feature: without it every call here throws std::runtime_error
// ("... built without GDAL"), as io.hpp's calls do; warp_method_from_string and to_string work
// in every build.
#pragma once

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/export.hpp>
#include <vibespatial/raster/io.hpp>
#include <vibespatial/raster/tiles.hpp>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace vibespatial::raster {

/// The resampling kernels, with gdalwarp's names (to_string / warp_method_from_string).
enum class WarpMethod {
  nearest,      ///< "near": the source pixel under the output pixel's centre
  bilinear,     ///< "bilinear": 2x2 (a triangle kernel of radius 1 when downsampling)
  cubic,        ///< "cubic": Catmull-Rom (Keys a = -0.5), 4x4
  cubicspline,  ///< "cubicspline": the cubic B-spline, radius 2
  lanczos,      ///< "lanczos": sinc(x) sinc(x/3), radius 3
  average,      ///< "average": the mean over the output pixel's footprint, edge pixels weighted
  mode,         ///< "mode": the most frequent valid value of the footprint (the first on ties)
  max,          ///< "max": the largest valid value of the footprint
  min,          ///< "min": the smallest valid value of the footprint
  med,          ///< "med": the median (the lower middle of an even count)
  q1,           ///< "q1": the first quartile, as med
  q3,           ///< "q3": the third quartile, as med
  rms,          ///< "rms": the root mean square, weighted as average
};

/// gdalwarp's name of @p method ("near", "bilinear", "cubic", "cubicspline", "lanczos", "average",
/// "mode", "max", "min", "med", "q1", "q3", "rms").
VSR_EXPORT std::string_view to_string(WarpMethod method) noexcept;

/**
 * @brief The method gdalwarp calls @p name ("near" or "nearest", and to_string's other names).
 * @throws std::invalid_argument naming the methods for any other text. Thread-safe.
 */
VSR_EXPORT WarpMethod warp_method_from_string(std::string_view name);

/// What a WarpError is about.
enum class WarpErrorKind {
  bad_crs,     ///< an SRS text GDAL/PROJ cannot read
  no_crs,      ///< the source has no CRS and none was given (WarpOptions::src_crs)
  no_overlap,  ///< the output grid and the source have no pixel in common
  bad_grid,    ///< an output grid that cannot be made (sizes, resolutions, extents)
  transform,   ///< no transform between the two CRSs
};

/// A warp refused before anything was written (see WarpErrorKind).
class VSR_EXPORT WarpError : public std::invalid_argument {
 public:
  WarpError(WarpErrorKind kind, const std::string& message)
      : std::invalid_argument(message), kind_(kind) {}
  WarpErrorKind kind() const noexcept { return kind_; }

 private:
  WarpErrorKind kind_;
};

/// An output grid: its size in pixels, its affine (pixel-edge, rasterio order) and its CRS.
struct WarpGrid {
  std::int64_t width = 0, height = 0;
  Affine affine;
  std::string crs;  ///< WKT
};

/// How to warp, in gdalwarp's terms (each member names its gdalwarp option).
struct WarpOptions {
  std::string dst_crs;  ///< -t_srs: anything GDAL's SetFromUserInput reads; empty: the source's
  std::string src_crs;  ///< -s_srs: overrides the source's CRS; empty: the source's own
  std::optional<std::array<double, 2>> resolution;  ///< -tr xres yres (> 0, output units)
  std::optional<std::array<double, 4>> extent;      ///< -te xmin ymin xmax ymax (output CRS)
  std::optional<std::array<std::int64_t, 2>> size;  ///< -ts width height (0: from the other)
  WarpMethod method = WarpMethod::nearest;          ///< -r
  /// -et: the approximation's error threshold in source pixels; 0 transforms every pixel exactly.
  double error_threshold = 0.125;
  /// -srcnodata: the source's nodata for every band (replaces the file's); with several bands it
  /// is one validity for all (gdalwarp's UNIFIED_SRC_NODATA=YES).
  std::optional<NodataValue> src_nodata;
  bool src_nodata_none = false;  ///< -srcnodata None: the source's nodata is ignored
  /// -dstnodata: the output's nodata (default: the source's); pixels no valid source pixel
  /// reaches are set to it (to 0 when the output has none).
  std::optional<NodataValue> dst_nodata;
  bool dst_nodata_none = false;  ///< -dstnodata None: the output has no nodata
  /// Bytes one output tile may use on the host: its source window, its source coordinates and
  /// its result (0: 64 MiB, gdalwarp's -wm default). A tile whose source window would not fit is
  /// split; a single output pixel whose window does not fit is refused (WarpError bad_grid).
  std::uint64_t memory_limit = 0;
  /// Called after each output tile with (tiles done, total), if set.
  std::function<void(std::int64_t done, std::int64_t total)> progress;
};

/// One output tile of a warp and the source window it reads (empty: no source pixel).
struct WarpTile {
  RasterWindow output;
  RasterWindow source;
};

/// What a warp will do: the grid, the tiles, and the kernel's scale for the whole output.
struct WarpPlan {
  WarpGrid grid;
  std::vector<WarpTile> tiles;
  double x_scale = 1, y_scale = 1;   ///< output pixels per source pixel (GDAL's XSCALE/YSCALE)
  std::uint64_t max_tile_bytes = 0;  ///< the largest tile's host bytes (within memory_limit)
};

/**
 * @brief The output grid for warping a raster described by @p source (its width, height,
 * affine and CRS) with @p options: gdalwarp's (GDALSuggestedWarpOutput2, then -tr/-te/-ts as
 * gdalwarp applies them).
 * @throws WarpError (bad_crs, no_crs, bad_grid, transform). Thread-safe.
 */
VSR_EXPORT WarpGrid plan_warp_grid(const RasterMetadata& source, const WarpOptions& options);

/// As plan_warp_grid(metadata, options) for the raster file @p path (read_raster_info's throws).
VSR_EXPORT WarpGrid plan_warp_grid(const std::string& path, const WarpOptions& options,
                                   const OpenOptions& open = {});

/**
 * @brief The tiles of warping @p source onto @p grid: each output tile's source window (the
 * footprint of its transformed pixels grown by the kernel's radius), split until every tile fits
 * options.memory_limit.
 * @throws WarpError (bad_crs, no_crs, no_overlap, bad_grid, transform). Thread-safe.
 */
VSR_EXPORT WarpPlan plan_warp(const RasterMetadata& source, const WarpGrid& grid,
                              const WarpOptions& options);

/**
 * @brief @p source (host or device; its affine and CRS, or options.src_crs) warped onto
 * @p grid: a host raster of the source's dtype and band count, with the output's nodata.
 * @throws WarpError as plan_warp; std::invalid_argument for a dst_nodata the dtype cannot hold.
 */
VSR_EXPORT OwnedRasterArray warp(const OwnedRasterArray& source, const WarpGrid& grid,
                                 const WarpOptions& options);

/**
 * @brief Warps the raster file @p input into @p output (all or nothing, as RasterFileSink):
 * onto options' grid (plan_warp_grid), tile by tile within options.memory_limit.
 * @throws WarpError as plan_warp; what RasterFileSource and RasterFileSink throw. Nothing is left
 *         at @p output on any error.
 */
VSR_EXPORT void warp_raster_file(const std::string& input, const std::string& output,
                                 const WarpOptions& options, const WriteOptions& write = {},
                                 const OpenOptions& open = {});

/**
 * @brief The tile executor's source (tiles.hpp) of a warped raster: @p source, a source over a
 * georeferenced raster (a RasterFileSource, a RasterTileSource), seen on @p grid, so that
 * run_tiles walks the output grid (a pipeline's `read ! warp ! ...`). metadata() is the grid with
 * the source's dtype and band count and the output's nodata; read(window) reads the window's
 * source footprint (grown by the kernel's radius) from @p source and resamples it, with the
 * kernel's scale of the whole grid, so results do not depend on the tiling. Reads take every
 * band of a pass together (a pass of some bands resamples those, with their own validity).
 * @p source must outlive this object; used by one run at a time.
 * @throws (constructor) WarpError as plan_warp; (read) what @p source's read throws.
 */
class VSR_EXPORT WarpedSource final : public TileSource {
 public:
  WarpedSource(TileSource& source, const WarpGrid& grid, const WarpOptions& options);
  ~WarpedSource() override;
  WarpedSource(const WarpedSource&) = delete;
  WarpedSource& operator=(const WarpedSource&) = delete;
  RasterMetadata metadata() const override;
  std::vector<std::optional<NodataValue>> band_nodata() const override;
  OwnedRasterArray read(const RasterWindow& window, int first_band, int band_count) override;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace vibespatial::raster
