// SPDX-License-Identifier: Apache-2.0
// Which pixels of a window a polygon zone uses, and with what coverage (zonal.hpp's PixelRule).
//
// Everything here works in pixel space: x the column, y the row (down), both in pixel-edge
// units of the whole raster, so a pixel is a unit square and a covered area is a fraction.
// - fractional: the exact area of the polygon inside each pixel. Each ring edge is cut at the
//   rows it crosses and, within a row, at the columns; a piece of edge inside a pixel
//   contributes its signed height times the part of the pixel to its right (a trapezoid) to that
//   pixel, and its whole signed height to every pixel further right in the row. A running sum
//   along the row then gives each pixel's signed area; the ring's orientation fixes the sign,
//   so exteriors add and holes subtract, and the parts of a multipolygon add.
// - center: GDAL rasterize's scanline rule, even-odd over every ring of the zone.
// - all_touched: pixels whose interior meets the zone's interior (fractional coverage > 0).
// Thread-safety: functions of distinct outputs are independent.
#pragma once

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/zonal.hpp>

#include <cstdint>
#include <vector>

namespace vibespatial::raster::detail {

/// A point in pixel space (x: column, y: row, pixel-edge units).
struct PixelPoint {
  double x = 0, y = 0;
};

/// A ring in pixel space, closed (last point == first), with the factor its signed trapezoid
/// sums are multiplied by: +-1 so that an exterior adds its area and a hole subtracts it.
struct PixelRing {
  std::vector<PixelPoint> points;
  double factor = 1;
};

/// A zone in pixel space: every ring of every polygon, and the bounding box of the points.
struct PixelZone {
  std::vector<PixelRing> rings;
  double xmin = 0, xmax = 0, ymin = 0, ymax = 0;
  bool empty = true;  ///< no ring with area
};

/**
 * @brief @p geometry (world coordinates) in the pixel space of @p affine (north-up or south-up,
 * no rotation). Rings of fewer than three distinct points or of zero area are dropped.
 */
PixelZone to_pixel_zone(const ZoneGeometry& geometry, const Affine& affine);

/// The window of the raster (@p height x @p width) that @p zone's bounding box meets; empty
/// (width or height 0) when it meets none.
RasterWindow zone_window(const PixelZone& zone, std::int64_t height, std::int64_t width);

/// Reusable buffers of the coverage functions (one per thread).
struct CoverageScratch {
  std::vector<double> accumulate;
  std::vector<double> crossings;
};

/**
 * @brief The coverage of each pixel of @p window by @p zone under @p rule, row-major into @p out
 * (window.height x window.width): fractional areas rounded to float32 (tiny round-off around 0
 * snapped to 0), or 1 / 0 for center and all_touched.
 */
void zone_coverage(const PixelZone& zone, const RasterWindow& window, PixelRule rule,
                   CoverageScratch& scratch, std::vector<float>& out);

}  // namespace vibespatial::raster::detail
