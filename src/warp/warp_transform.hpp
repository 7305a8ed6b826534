// SPDX-License-Identifier: Apache-2.0
// The warp's transform (internal, GDAL): output pixel/line -> source pixel/line through GDAL's
// GenImgProj transformer (PROJ underneath, as gdalwarp builds it from two datasets), optionally
// wrapped in GDAL's approximate transformer; the source window of an output window
// (GDALWarpOperation::ComputeSourceWindow's rule) and the kernel's scale for the whole output.
#pragma once

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/warp.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace vibespatial::raster::detail {

/// A source raster's size and georeferencing, as the transform needs them.
struct WarpSourceGrid {
  std::int64_t width = 0, height = 0;
  Affine affine;
  std::string crs;  ///< WKT
};

/// The WKT of @p text (anything OGRSpatialReference::SetFromUserInput reads).
/// @throws WarpError(bad_crs) naming @p what ("--t_srs") and the text.
std::string crs_to_wkt(const std::string& text, const std::string& what);

/// The source's CRS for @p options (src_crs, else @p own), as WKT.
/// @throws WarpError(no_crs) when both are empty; (bad_crs).
std::string source_crs(const std::string& own, const WarpOptions& options);

/// The source window of an output window, GDAL's way (ComputeSourceWindow): its clamped
/// offset and size, and GDAL's "extra size" (the margin not part of the footprint).
struct SourceWindow {
  RasterWindow window;
  double extra_x = 0, extra_y = 0;
  bool failed = false;  ///< no sample of the output window's outline reached the source
};

/// One transform between an output grid and a source raster. Not thread-safe: one per thread.
class WarpTransform {
 public:
  /// @throws WarpError(transform) when GDAL cannot make the transform.
  WarpTransform(const WarpSourceGrid& source, const WarpGrid& output, double error_threshold);
  ~WarpTransform();
  WarpTransform(const WarpTransform&) = delete;
  WarpTransform& operator=(const WarpTransform&) = delete;

  /// The source pixel/line coordinates of the centres of @p tile's pixels (row-major), each row
  /// transformed in one call of the approximate transformer (or exactly); NaN where it failed.
  void source_coords(const RasterWindow& tile, std::vector<double>& x,
                     std::vector<double>& y) const;
  /// As source_coords for the (height + 1) x (width + 1) corners of @p tile's pixels.
  void corner_coords(const RasterWindow& tile, std::vector<double>& x,
                     std::vector<double>& y) const;
  /// Output pixel/line -> source pixel/line of @p n points, exactly; ok[i] says which succeeded.
  void to_source(int n, double* x, double* y, int* ok) const;
  /// The source window of @p output for a kernel of @p radius (GDAL's rule, see SourceWindow).
  SourceWindow source_window(const RasterWindow& output, int radius) const;

 private:
  WarpSourceGrid source_;
  void* exact_ = nullptr;
  void* approx_ = nullptr;
};

/// The kernel's scale for the whole of @p output (GDAL's per-chunk XSCALE/YSCALE, computed once
/// from the whole output's source window: snapped to 1, or to 1/N within 0.05).
std::array<double, 2> warp_scale(const RasterWindow& output, const SourceWindow& source);

}  // namespace vibespatial::raster::detail
