// SPDX-License-Identifier: Apache-2.0
// Coverage of pixels by polygon zones (coverage.hpp).
#include "zonal/coverage.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace vibespatial::raster::detail {

namespace {

// Round-off of the running sums below this is not coverage (a unit pixel's area is 1).
constexpr double coverage_epsilon = 1e-11;

double shoelace(const std::vector<PixelPoint>& p) {
  double twice = 0;
  for (std::size_t i = 0; i + 1 < p.size(); ++i) {
    twice += p[i].x * p[i + 1].y - p[i + 1].x * p[i].y;
  }
  return twice / 2;
}

// Adds a piece of edge lying inside one row, from x = xa to x = xb, of signed height dy, to
// the row's accumulator a (width + 1 entries): see coverage.hpp.
void add_row_piece(double* a, std::int64_t width, double xa, double xb, double dy) {
  if (xa > xb) std::swap(xa, xb);
  const auto w = static_cast<double>(width);
  if (xb <= 0) {
    a[0] += dy;
    return;
  }
  if (xa >= w) return;
  const double len = xb - xa;
  if (len == 0) {
    const auto c = std::min<std::int64_t>(static_cast<std::int64_t>(std::floor(xa)), width - 1);
    const double right = static_cast<double>(c + 1) - xa;
    a[c] += dy * right;
    a[c + 1] += dy * (1 - right);
    return;
  }
  const double lo = std::max(xa, 0.0), hi = std::min(xb, w);
  if (lo > xa) a[0] += dy * ((lo - xa) / len);  // the part left of the window
  auto c = static_cast<std::int64_t>(std::floor(lo));
  for (; c < width && static_cast<double>(c) < hi; ++c) {
    const double s = std::max(lo, static_cast<double>(c));
    const double e = std::min(hi, static_cast<double>(c + 1));
    if (e <= s) continue;
    const double part = dy * ((e - s) / len);
    const double right = static_cast<double>(c + 1) - (s + e) / 2;
    a[c] += part * right;
    a[c + 1] += part * (1 - right);
  }
}

// Adds edge p -> q (window-local pixel space) times factor to the accumulator (h rows).
void add_edge(PixelPoint p, PixelPoint q, double factor, std::int64_t height, std::int64_t width,
              double* acc) {
  if (p.y == q.y) return;
  const double ylo = std::min(p.y, q.y), yhi = std::max(p.y, q.y);
  const auto h = static_cast<double>(height);
  if (yhi <= 0 || ylo >= h) return;
  const double dir = q.y > p.y ? factor : -factor;
  const double slope = (q.x - p.x) / (q.y - p.y);
  const auto r0 = std::max<std::int64_t>(0, static_cast<std::int64_t>(std::floor(ylo)));
  const auto r1 = std::min<std::int64_t>(height - 1, static_cast<std::int64_t>(std::ceil(yhi)) - 1);
  for (std::int64_t r = r0; r <= r1; ++r) {
    const double ya = std::max(ylo, static_cast<double>(r));
    const double yb = std::min(yhi, static_cast<double>(r + 1));
    if (yb <= ya) continue;
    // x from the edge's own end points, so the cut points do not drift along the edge.
    const double xa = ya == p.y ? p.x : (ya == q.y ? q.x : p.x + (ya - p.y) * slope);
    const double xb = yb == p.y ? p.x : (yb == q.y ? q.x : p.x + (yb - p.y) * slope);
    add_row_piece(acc + r * (width + 1), width, xa, xb, dir * (yb - ya));
  }
}

// The signed area of @p ring in each pixel of the window, into acc (h rows of w + 1: the
// running sums of coverage.hpp, then each pixel's area).
void ring_areas(const PixelRing& ring, const RasterWindow& window, std::vector<double>& acc) {
  const std::int64_t h = window.height, w = window.width;
  acc.assign(static_cast<std::size_t>(h * (w + 1)), 0.0);
  const auto ox = static_cast<double>(window.col_off), oy = static_cast<double>(window.row_off);
  for (std::size_t i = 0; i + 1 < ring.points.size(); ++i) {
    const PixelPoint p{ring.points[i].x - ox, ring.points[i].y - oy};
    const PixelPoint q{ring.points[i + 1].x - ox, ring.points[i + 1].y - oy};
    add_edge(p, q, ring.factor, h, w, acc.data());
  }
  for (std::int64_t r = 0; r < h; ++r) {
    double run = 0;
    double* a = acc.data() + r * (w + 1);
    for (std::int64_t c = 0; c < w; ++c) {
      run += a[c];
      a[c] = std::abs(run) < coverage_epsilon ? 0.0 : run;
    }
  }
}

// Each ring's fractions are rounded to float32 and summed in float32, ring by ring (exteriors
// add, holes subtract, parts add), as exactextract sums them in its float32 coverage matrix: so
// a pixel of a polygon with a hole gets exactly exactextract's coverage, float32(1) -
// float32(hole), not the float32 of the exact difference.
void fractional(const PixelZone& zone, const RasterWindow& window, CoverageScratch& scratch,
                std::vector<float>& out) {
  const std::int64_t h = window.height, w = window.width;
  auto& acc = scratch.accumulate;
  for (std::size_t k = 0; k < zone.rings.size(); ++k) {
    ring_areas(zone.rings[k], window, acc);
    for (std::int64_t r = 0; r < h; ++r) {
      const double* a = acc.data() + r * (w + 1);
      float* o = out.data() + r * w;
      for (std::int64_t c = 0; c < w; ++c) {
        o[c] += static_cast<float>(a[c]);
      }
    }
  }
}

// GDAL rasterize's default rule (alg/llrasterize.cpp): on the scan line through the row's
// pixel centres, an edge with y1 <= yc < y2 (ends ordered by y) crosses at x; the sorted
// crossings pair up, and pixels from floor(a + 0.5) to floor(b + 0.5) - 1 are burnt.
void center(const PixelZone& zone, const RasterWindow& window, CoverageScratch& scratch,
            std::vector<float>& out) {
  auto& xs = scratch.crossings;
  for (std::int64_t r = 0; r < window.height; ++r) {
    const double yc = static_cast<double>(window.row_off + r) + 0.5;
    xs.clear();
    for (const PixelRing& ring : zone.rings) {
      for (std::size_t i = 0; i + 1 < ring.points.size(); ++i) {
        PixelPoint a = ring.points[i], b = ring.points[i + 1];
        if (a.y == b.y) continue;
        if (a.y > b.y) std::swap(a, b);
        if (yc < b.y && yc >= a.y) xs.push_back((yc - a.y) * (b.x - a.x) / (b.y - a.y) + a.x);
      }
    }
    std::sort(xs.begin(), xs.end());
    float* o = out.data() + r * window.width;
    for (std::size_t k = 0; k + 1 < xs.size(); k += 2) {
      const auto from = static_cast<std::int64_t>(std::floor(xs[k] + 0.5)) - window.col_off;
      const auto to = static_cast<std::int64_t>(std::floor(xs[k + 1] + 0.5)) - window.col_off;
      for (std::int64_t c = std::max<std::int64_t>(from, 0); c < std::min(to, window.width); ++c) {
        o[c] = 1.0f;
      }
    }
  }
}

}  // namespace

PixelZone to_pixel_zone(const ZoneGeometry& geometry, const Affine& affine) {
  PixelZone zone;
  zone.xmin = zone.ymin = std::numeric_limits<double>::infinity();
  zone.xmax = zone.ymax = -std::numeric_limits<double>::infinity();
  for (const ZonePolygon& polygon : geometry) {
    for (std::size_t k = 0; k < polygon.size(); ++k) {
      PixelRing ring;
      ring.points.reserve(polygon[k].size() + 1);
      for (const auto& [x, y] : polygon[k]) {
        ring.points.push_back({(x - affine.c) / affine.a, (y - affine.f) / affine.e});
      }
      if (ring.points.size() < 3) continue;
      const PixelPoint first = ring.points.front(), last = ring.points.back();
      if (first.x != last.x || first.y != last.y) ring.points.push_back(first);
      const double area = shoelace(ring.points);
      if (area == 0 || !std::isfinite(area)) continue;
      // A positive shoelace area (in pixel space) makes the trapezoid sums negative.
      ring.factor = (area > 0 ? -1.0 : 1.0) * (k == 0 ? 1.0 : -1.0);
      for (const PixelPoint& p : ring.points) {
        zone.xmin = std::min(zone.xmin, p.x);
        zone.xmax = std::max(zone.xmax, p.x);
        zone.ymin = std::min(zone.ymin, p.y);
        zone.ymax = std::max(zone.ymax, p.y);
      }
      zone.rings.push_back(std::move(ring));
    }
  }
  zone.empty = zone.rings.empty();
  return zone;
}

RasterWindow zone_window(const PixelZone& zone, std::int64_t height, std::int64_t width) {
  if (zone.empty) return {};
  const double c0 = std::max(0.0, std::floor(zone.xmin));
  const double c1 = std::min(static_cast<double>(width), std::ceil(zone.xmax));
  const double r0 = std::max(0.0, std::floor(zone.ymin));
  const double r1 = std::min(static_cast<double>(height), std::ceil(zone.ymax));
  if (c1 <= c0 || r1 <= r0) return {};
  return {static_cast<std::int64_t>(c0), static_cast<std::int64_t>(r0),
          static_cast<std::int64_t>(c1 - c0), static_cast<std::int64_t>(r1 - r0)};
}

void zone_coverage(const PixelZone& zone, const RasterWindow& window, PixelRule rule,
                   CoverageScratch& scratch, std::vector<float>& out) {
  out.assign(static_cast<std::size_t>(window.height * window.width), 0.0f);
  if (zone.empty || window.height <= 0 || window.width <= 0) return;
  if (rule == PixelRule::center) {
    center(zone, window, scratch, out);
    return;
  }
  fractional(zone, window, scratch, out);
  if (rule == PixelRule::all_touched) {
    for (float& v : out) v = v > 0 ? 1.0f : 0.0f;
  }
}

}  // namespace vibespatial::raster::detail
