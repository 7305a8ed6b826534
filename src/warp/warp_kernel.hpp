// SPDX-License-Identifier: Apache-2.0
// The warp's resampling kernels: GDAL's kernels and nodata rules (GDAL 3.6 gdalwarpkernel.cpp's
// general path) over a source window and an array of source coordinates, one per output pixel.
// No GDAL here: the transform is computed elsewhere (warp_transform.hpp), so the same kernel runs
// on every backend and in builds without GDAL.
#pragma once

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/warp.hpp>

#include <cstdint>
#include <optional>
#include <vector>

namespace vibespatial::raster::detail {

/// Kernel radius in source pixels at scale 1 (gdalwarp's: near 0, bilinear 1, cubic 2,
/// cubicspline 2, lanczos 3, the footprint methods 0).
int warp_kernel_radius(WarpMethod method) noexcept;

/// Whether @p method reads the footprint of each output pixel (average, mode, max, min, med, q1,
/// q3, rms): its coordinates are those of the pixels' corners, not their centres.
bool warp_uses_corners(WarpMethod method) noexcept;

/// The source window a tile reads, band-major, in the source's dtype.
struct WarpSourceWindow {
  const void* pixels = nullptr;
  DType dtype = DType::float32;
  int bands = 1;
  RasterWindow window;  ///< where it lies in the source raster
};

/// Which source pixels are valid (gdalwarp's masks): each band's nodata (empty: every value is
/// valid, NaN included), and whether only the unified mask (a pixel is valid when any band is)
/// decides, gdalwarp's UNIFIED_SRC_NODATA=YES.
struct WarpValidity {
  std::vector<std::optional<NodataValue>> band_nodata;
  bool unified_only = false;
};

/// What to compute for one output tile.
struct WarpKernelArgs {
  WarpMethod method = WarpMethod::nearest;
  double x_scale = 1, y_scale = 1;  ///< output pixels per source pixel, for the whole output
  /// Source pixel/line coordinates (of the source raster, not the window) of each output pixel's
  /// centre, row-major over the tile; NaN where the transform failed.
  /// For the footprint methods (warp_uses_corners): the (height + 1) x (width + 1) corners instead.
  const double* src_x = nullptr;
  const double* src_y = nullptr;
  std::int64_t height = 0, width = 0;  ///< the output tile
  std::optional<NodataValue> dst_nodata;
};

/**
 * @brief Resamples @p source into @p out (band-major, the source's dtype, width*height per band):
 * every pixel first set to the output's nodata (0 without one), then each pixel whose centre
 * lands on a valid source pixel of the window gets the kernel's value, as GDAL's warp kernel
 * computes it. Thread-safe on distinct outputs.
 */
void warp_tile(const WarpSourceWindow& source, const WarpValidity& validity,
               const WarpKernelArgs& args, void* out);

}  // namespace vibespatial::raster::detail
