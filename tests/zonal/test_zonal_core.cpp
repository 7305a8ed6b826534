// SPDX-License-Identifier: Apache-2.0
// Zonal statistics without files: coverage fractions against an independent clip of each pixel,
// the centre rule against a point-in-polygon test, every statistic against a direct
// computation, tiled runs against the whole run (a broken merge across tiles shows), zone
// rasters against a direct computation, and the refusals.
#include "zonal/coverage.hpp"

#include <vibespatial/raster/zonal.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <vector>

namespace vsr = vibespatial::raster;
using vsr::ZoneGeometry;
using vsr::ZoneRing;

namespace {

using Pts = std::vector<std::pair<double, double>>;

double ring_area(const Pts& p) {
  double twice = 0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const auto& a = p[i];
    const auto& b = p[(i + 1) % p.size()];
    twice += a.first * b.second - b.first * a.second;
  }
  return std::abs(twice) / 2;
}

// Sutherland-Hodgman clip of a ring by an axis-aligned box: the area of ring and box in common
// (exact for any simple ring against a convex window).
double clipped_area(Pts poly, double x0, double y0, double x1, double y1) {
  const auto clip = [&](auto inside, auto cross) {
    Pts out;
    for (std::size_t i = 0; i < poly.size(); ++i) {
      const auto& a = poly[i];
      const auto& b = poly[(i + 1) % poly.size()];
      const bool ia = inside(a), ib = inside(b);
      if (ia) out.push_back(a);
      if (ia != ib) out.push_back(cross(a, b));
    }
    poly = out;
  };
  const auto at_x = [](double x) {
    return [x](auto a, auto b) {
      const double t = (x - a.first) / (b.first - a.first);
      return std::pair{x, a.second + t * (b.second - a.second)};
    };
  };
  const auto at_y = [](double y) {
    return [y](auto a, auto b) {
      const double t = (y - a.second) / (b.second - a.second);
      return std::pair{a.first + t * (b.first - a.first), y};
    };
  };
  clip([&](auto p) { return p.first >= x0; }, at_x(x0));
  clip([&](auto p) { return p.first <= x1; }, at_x(x1));
  clip([&](auto p) { return p.second >= y0; }, at_y(y0));
  clip([&](auto p) { return p.second <= y1; }, at_y(y1));
  return poly.size() < 3 ? 0.0 : ring_area(poly);
}

// A star-shaped random ring around (cx, cy).
Pts star(std::mt19937& rng, double cx, double cy, double r, int n) {
  std::uniform_real_distribution<double> u(0.3, 1.0);
  Pts p;
  for (int i = 0; i < n; ++i) {
    const double t = 2 * M_PI * i / n;
    const double radius = r * u(rng);  // one radius per vertex: a simple, star-shaped ring
    p.emplace_back(cx + radius * std::cos(t), cy + radius * std::sin(t));
  }
  return p;
}

vsr::OwnedRasterArray float_raster(int bands, std::int64_t h, std::int64_t w, std::uint32_t seed,
                                   double nodata, vsr::Affine affine) {
  std::vector<float> v(static_cast<std::size_t>(bands * h * w));
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(0, 20);
  for (auto& x : v) x = static_cast<float>(d(rng)) * 0.5f;
  for (std::size_t i = 0; i < v.size(); i += 17) v[i] = static_cast<float>(nodata);
  for (std::size_t i = 5; i < v.size(); i += 23) v[i] = NAN;
  return vsr::OwnedRasterArray::from_host(v.data(), vsr::DType::float32, bands, h, w, nodata,
                                          affine);
}

bool same(double a, double b, double rel = 1e-12) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::abs(a - b) <= rel * std::max({1.0, std::abs(a), std::abs(b)});
}

const std::vector<std::string> all_stats = {
    "count",  "sum",      "mean",     "min",      "max",     "stdev", "variance",
    "median", "quantile", "majority", "minority", "variety", "frac",  "cell_count"};

}  // namespace

TEST_CASE("fractional coverage: cells on a unit grid as exactextract gives them") {
  // rect(1, 1, 3, 2.5) on a 4 x 4 unit grid with origin (0, 4): cells 5, 6 half, 9, 10 whole.
  const vsr::Affine affine{1, 0, 0, 0, -1, 4};
  const ZoneGeometry rect{{{{1, 1}, {3, 1}, {3, 2.5}, {1, 2.5}}}};
  const auto zone = vsr::detail::to_pixel_zone(rect, affine);
  vsr::detail::CoverageScratch scratch;
  std::vector<float> cov;
  vsr::detail::zone_coverage(zone, {0, 0, 4, 4}, vsr::PixelRule::fractional, scratch, cov);
  std::vector<float> want(16, 0.0f);
  want[5] = want[6] = 0.5f;
  want[9] = want[10] = 1.0f;
  CHECK(cov == want);
  // Reversed orientation, and a hole covering the half cells: the same, less the hole.
  ZoneGeometry holed{{{{1, 2.5}, {3, 2.5}, {3, 1}, {1, 1}}, {{1, 2}, {3, 2}, {3, 2.5}, {1, 2.5}}}};
  vsr::detail::zone_coverage(vsr::detail::to_pixel_zone(holed, affine), {0, 0, 4, 4},
                             vsr::PixelRule::fractional, scratch, cov);
  want[5] = want[6] = 0.0f;
  CHECK(cov == want);
}

TEST_CASE("fractional coverage equals the clipped area of every pixel (random rings, holes)") {
  std::mt19937 rng(7);
  const vsr::Affine affine{0.5, 0, 100, 0, -0.25, 50};  // pixels 0.5 wide, 0.25 tall
  for (int trial = 0; trial < 30; ++trial) {
    const Pts outer = star(rng, 102.3, 47.9, 1.7, 5 + trial);
    Pts hole;
    for (const auto& [x, y] : star(rng, 102.3, 47.9, 0.25, 6)) hole.emplace_back(x, y);
    const ZoneGeometry g{{ZoneRing(outer.begin(), outer.end()), ZoneRing(hole.begin(), hole.end())},
                         {ZoneRing{{104.1, 45.1}, {104.9, 45.3}, {104.4, 45.8}}}};
    const auto zone = vsr::detail::to_pixel_zone(g, affine);
    const vsr::RasterWindow win{0, 0, 12, 24};  // x 100..106, y 44..50
    vsr::detail::CoverageScratch scratch;
    std::vector<float> cov;
    vsr::detail::zone_coverage(zone, win, vsr::PixelRule::fractional, scratch, cov);
    for (std::int64_t r = 0; r < win.height; ++r) {
      for (std::int64_t c = 0; c < win.width; ++c) {
        const double x0 = 100 + 0.5 * c, y1 = 50 - 0.25 * r;
        const double x1 = x0 + 0.5, y0 = y1 - 0.25;
        const double area =
            clipped_area(outer, x0, y0, x1, y1) - clipped_area(hole, x0, y0, x1, y1) +
            clipped_area({{104.1, 45.1}, {104.9, 45.3}, {104.4, 45.8}}, x0, y0, x1, y1);
        const double want = area / (0.5 * 0.25);
        INFO("trial " << trial << " cell " << r << "," << c);
        CHECK(std::abs(cov[static_cast<std::size_t>(r * win.width + c)] - want) < 2e-7);
      }
    }
  }
}

TEST_CASE("center rule: pixel centres inside (even-odd), all-touched: interiors meeting") {
  std::mt19937 rng(11);
  const vsr::Affine affine{1, 0, 0, 0, -1, 20};
  for (int trial = 0; trial < 20; ++trial) {
    const Pts ring = star(rng, 10.2, 9.7, 7.3, 7 + trial);
    const ZoneGeometry g{{ZoneRing(ring.begin(), ring.end())}};
    const auto zone = vsr::detail::to_pixel_zone(g, affine);
    vsr::detail::CoverageScratch scratch;
    std::vector<float> center, touched, frac;
    const vsr::RasterWindow win{0, 0, 20, 20};
    vsr::detail::zone_coverage(zone, win, vsr::PixelRule::center, scratch, center);
    vsr::detail::zone_coverage(zone, win, vsr::PixelRule::all_touched, scratch, touched);
    vsr::detail::zone_coverage(zone, win, vsr::PixelRule::fractional, scratch, frac);
    for (int r = 0; r < 20; ++r) {
      for (int c = 0; c < 20; ++c) {
        const double x = c + 0.5, y = 20 - (r + 0.5);
        bool inside = false;
        for (std::size_t i = 0, j = ring.size() - 1; i < ring.size(); j = i++) {
          const auto& a = ring[i];
          const auto& b = ring[j];
          if ((a.second > y) != (b.second > y) &&
              x < (b.first - a.first) * (y - a.second) / (b.second - a.second) + a.first) {
            inside = !inside;
          }
        }
        const auto k = static_cast<std::size_t>(r * 20 + c);
        CHECK(center[k] == (inside ? 1.0f : 0.0f));
        CHECK(touched[k] == (frac[k] > 0 ? 1.0f : 0.0f));
        if (inside) CHECK(touched[k] == 1.0f);
      }
    }
  }
}

namespace {

// Direct computation of every statistic for one zone and band: coverage of the whole raster,
// then the definitions.
std::map<std::string, double> direct(const vsr::OwnedRasterArray& r, int band,
                                     const ZoneGeometry& g, vsr::PixelRule rule, double q) {
  const auto zone = vsr::detail::to_pixel_zone(g, r.affine());
  vsr::detail::CoverageScratch scratch;
  std::vector<float> cov;
  vsr::detail::zone_coverage(zone, {0, 0, r.width(), r.height()}, rule, scratch, cov);
  const auto* px = static_cast<const float*>(r.host_data()) + band * r.height() * r.width();
  const double nd = r.nodata().value_or(NAN);
  double count = 0, sum = 0, mn = INFINITY, mx = -INFINITY;
  std::int64_t cells = 0;
  std::map<double, double> hist;
  std::vector<std::pair<double, double>> used;
  for (std::size_t i = 0; i < cov.size(); ++i) {
    const double v = px[i];
    if (!(cov[i] > 0) || std::isnan(v) || v == nd) continue;
    count += cov[i];
    sum += cov[i] * v;
    mn = std::min(mn, v);
    mx = std::max(mx, v);
    ++cells;
    hist[v] += cov[i];
    used.emplace_back(v, cov[i]);
  }
  std::map<std::string, double> s;
  s["count"] = count;
  s["cell_count"] = static_cast<double>(cells);
  s["variety"] = static_cast<double>(hist.size());
  if (cells == 0) return s;
  const double mean = sum / count;
  double m2 = 0;
  for (const auto& [v, c] : used) m2 += c * (v - mean) * (v - mean);
  s["sum"] = sum;
  s["mean"] = mean;
  s["min"] = mn;
  s["max"] = mx;
  s["variance"] = m2 / count;
  s["stdev"] = std::sqrt(m2 / count);
  double best = -1, worst = INFINITY, maj = 0, mino = 0;
  for (const auto& [v, c] : hist) {
    if (c >= best) best = c, maj = v;
    if (c < worst) worst = c, mino = v;
  }
  s["majority"] = maj;
  s["minority"] = mino;
  // Quantiles over distinct values (exactextract's rule), written out differently: the position
  // of value k is (k W_k + (n-1) S_{k-1}) / ((n-1) S).
  const auto quant = [&](double qq) {
    std::vector<std::pair<double, double>> h(hist.begin(), hist.end());
    const double n = static_cast<double>(h.size());
    if (h.size() == 1) return h[0].first;
    double total = 0;
    for (const auto& e : h) total += e.second;
    double before = 0, prev_pos = 0, prev_v = h[0].first;
    for (std::size_t k = 0; k < h.size(); ++k) {
      const double pos =
          (static_cast<double>(k) * h[k].second + (n - 1) * before) / ((n - 1) * total);
      if (pos > qq) {
        if (k == 0) return h[0].first;
        return prev_v + (qq - prev_pos) / (pos - prev_pos) * (h[k].first - prev_v);
      }
      prev_pos = pos;
      prev_v = h[k].first;
      before += h[k].second;
    }
    return h.back().first;
  };
  s["median"] = static_cast<float>(quant(0.5));
  s["quantile"] = static_cast<float>(quant(q));
  return s;
}

std::vector<ZoneGeometry> random_zones(std::mt19937& rng, int n, double w, double h) {
  std::uniform_real_distribution<double> ux(-3, w + 3), uy(-3, h + 3), ur(0.5, 6);
  std::vector<ZoneGeometry> zones;
  for (int i = 0; i < n; ++i) {
    const Pts p = star(rng, ux(rng), uy(rng), ur(rng), 5 + i % 9);
    zones.push_back({{ZoneRing(p.begin(), p.end())}});
  }
  return zones;
}

}  // namespace

TEST_CASE("zonal_stats: every statistic equals a direct computation, tiled equals whole") {
  std::mt19937 rng(3);
  const vsr::Affine affine{1, 0, 0, 0, -1, 40};
  const auto raster = float_raster(2, 40, 50, 5, -1.0, affine);
  vsr::ZoneSet zones;
  zones.geometries = random_zones(rng, 40, 50, 40);
  zones.geometries.push_back({{{{1000, 1000}, {1001, 1000}, {1001, 1001}}}});  // outside
  for (const auto rule :
       {vsr::PixelRule::fractional, vsr::PixelRule::center, vsr::PixelRule::all_touched}) {
    vsr::ZonalOptions o;
    o.pixels = rule;
    o.stats = all_stats;
    o.quantile = 0.3;
    o.threads = 1;
    const vsr::ZonalTable whole = vsr::zonal_stats(raster, zones, o);
    REQUIRE(whole.rows() == zones.geometries.size() * 2);
    o.threads = 4;  // each zone is reduced by one thread: the same bits
    const vsr::ZonalTable threaded = vsr::zonal_stats(raster, zones, o);
    for (std::size_t s = 0; s < o.stats.size(); ++s) {
      for (std::size_t row = 0; row < whole.rows(); ++row) {
        CHECK(same(threaded.values[s][row], whole.values[s][row], 0));
      }
    }
    for (std::size_t z = 0; z < zones.geometries.size(); ++z) {
      for (int b = 0; b < 2; ++b) {
        const std::size_t row = z * 2 + static_cast<std::size_t>(b);
        CHECK(whole.band[row] == b + 1);
        CHECK(whole.zone.integers[row] == static_cast<std::int64_t>(z));
        auto want = direct(raster, b, zones.geometries[z], rule, 0.3);
        for (const auto& s : all_stats) {
          if (s == "frac") continue;
          const double expected = want.count(s) ? want[s] : NAN;
          INFO("rule " << vsr::to_string(rule) << " zone " << z << " band " << b << " " << s);
          CHECK(same(whole.column(s)[row], expected, 1e-12));
        }
      }
    }
    // The last zone lies outside: count 0, nulls.
    const std::size_t last = whole.rows() - 1;
    CHECK(whole.column("count")[last] == 0);
    CHECK(std::isnan(whole.column("mean")[last]));
    CHECK(whole.frac[last].empty());
    for (const auto& shape :
         {std::pair<std::int64_t, std::int64_t>{7, 5}, {1, 50}, {40, 1}, {3, 3}}) {
      o.tile_shape = shape;
      std::int64_t progress_calls = 0;
      o.progress = [&](std::int64_t, std::int64_t) { ++progress_calls; };
      const vsr::ZonalTable tiled = vsr::zonal_stats(raster, zones, o);
      const vsr::RasterPlan plan = vsr::zonal_stats_plan(raster.metadata(), o);
      CHECK(plan.strategy == vsr::TilingStrategy::tiled);
      CHECK(plan.n_tiles == progress_calls);
      CHECK(progress_calls ==
            ((40 + shape.first - 1) / shape.first) * ((50 + shape.second - 1) / shape.second));
      for (std::size_t s = 0; s < o.stats.size(); ++s) {
        for (std::size_t row = 0; row < whole.rows(); ++row) {
          INFO("tile " << shape.first << "x" << shape.second << " " << o.stats[s] << " row "
                       << row);
          CHECK(same(tiled.values[s][row], whole.values[s][row], 1e-12));
        }
      }
      for (std::size_t row = 0; row < whole.rows(); ++row) {
        REQUIRE(tiled.frac[row].size() == whole.frac[row].size());
        for (std::size_t k = 0; k < whole.frac[row].size(); ++k) {
          CHECK(tiled.frac[row][k].first == whole.frac[row][k].first);
          CHECK(same(tiled.frac[row][k].second, whole.frac[row][k].second));
        }
      }
    }
  }
}

TEST_CASE(
    "zonal_stats: weights, overlapping multipolygon parts add, shared pixels count for each") {
  const vsr::Affine affine{1, 0, 0, 0, -1, 4};
  std::vector<double> v(16), w(16);
  for (int i = 0; i < 16; ++i) v[i] = i, w[i] = i % 3;
  w[15] = NAN;
  const auto values =
      vsr::OwnedRasterArray::from_host(v.data(), vsr::DType::float64, 1, 4, 4, {}, affine);
  const auto weights =
      vsr::OwnedRasterArray::from_host(w.data(), vsr::DType::float64, 1, 4, 4, {}, affine);
  vsr::ZoneSet zones;
  // Two overlapping 2 x 2 squares as one multipolygon (invalid, but parts add as exactextract's
  // do), and the top-left 2 x 2 square again.
  zones.geometries = {{{{{0, 2}, {2, 2}, {2, 4}, {0, 4}}}, {{{1, 2}, {3, 2}, {3, 4}, {1, 4}}}},
                      {{{{0, 2}, {2, 2}, {2, 4}, {0, 4}}}},
                      {{{{2, 0}, {4, 0}, {4, 2}, {2, 2}}}}};
  vsr::ZonalOptions o;
  o.stats = {"count", "sum", "weighted_sum", "weighted_mean"};
  const auto t = vsr::zonal_stats(values, zones, o, &weights);
  CHECK(t.column("count")[0] == 8);
  CHECK(t.column("sum")[0] == (0 + 1 + 4 + 5) + (1 + 2 + 5 + 6));
  CHECK(t.column("count")[1] == 4);
  CHECK(t.column("weighted_sum")[1] == 0 * 0 + 1 * 1 + 4 * 1 + 5 * 2);
  CHECK(t.column("weighted_mean")[1] == doctest::Approx(15.0 / 4));
  CHECK(
      std::isnan(t.column("weighted_sum")[2]));  // a NaN weight (pixel 15) is NaN, as exactextract
}

TEST_CASE("zonal_stats over a zone raster equals a direct computation, tiled or not") {
  const vsr::Affine affine{2, 0, 10, 0, -2, 90};
  const std::int64_t h = 23, w = 31;
  const auto raster = float_raster(1, h, w, 9, -1.0, affine);
  std::vector<std::int32_t> z(static_cast<std::size_t>(h * w));
  std::mt19937 rng(2);
  std::uniform_int_distribution<int> d(-3, 12);
  for (auto& x : z) x = d(rng);
  const auto zr =
      vsr::OwnedRasterArray::from_host(z.data(), vsr::DType::int32, 1, h, w, 7.0, affine);
  vsr::ZonalOptions o;
  o.stats = {"count", "sum", "mean", "min", "max", "stdev", "median", "majority", "variety"};
  const auto t = vsr::zonal_stats(raster, zr, o);
  const auto* px = static_cast<const float*>(raster.host_data());
  std::map<int, std::vector<double>> per;
  for (std::size_t i = 0; i < z.size(); ++i) {
    if (z[i] == 7) continue;
    per[z[i]];
    if (std::isnan(px[i]) || px[i] == -1.0f) continue;
    per[z[i]].push_back(px[i]);
  }
  REQUIRE(t.rows() == per.size());
  std::size_t row = 0;
  for (const auto& [zone, vals] : per) {
    CHECK(t.zone.integers[row] == zone);
    double sum = 0;
    for (double x : vals) sum += x;
    CHECK(t.column("count")[row] == static_cast<double>(vals.size()));
    CHECK(same(t.column("sum")[row], sum));
    CHECK(t.column("min")[row] == *std::min_element(vals.begin(), vals.end()));
    ++row;
  }
  o.tile_shape = std::pair<std::int64_t, std::int64_t>{4, 6};
  const auto tiled = vsr::zonal_stats(raster, zr, o);
  REQUIRE(tiled.rows() == t.rows());
  for (std::size_t s = 0; s < o.stats.size(); ++s) {
    for (std::size_t r = 0; r < t.rows(); ++r) CHECK(same(tiled.values[s][r], t.values[s][r]));
  }
}

TEST_CASE("zonal_stats refuses bad options and zones with ZonalInputError") {
  const vsr::Affine affine{1, 0, 0, 0, -1, 4};
  std::vector<float> v(16, 1.0f);
  const auto values =
      vsr::OwnedRasterArray::from_host(v.data(), vsr::DType::float32, 1, 4, 4, {}, affine);
  vsr::ZoneSet zones;
  zones.geometries = {{{{{0, 0}, {1, 0}, {1, 1}}}}};
  vsr::ZonalOptions o;
  o.stats = {"count", "bogus"};
  CHECK_THROWS_AS(vsr::zonal_stats(values, zones, o), vsr::ZonalInputError);
  o.stats = {"weighted_mean"};
  CHECK_THROWS_AS(vsr::zonal_stats(values, zones, o), vsr::ZonalInputError);
  o.stats = {"quantile"};
  o.quantile = 1.5;
  CHECK_THROWS_AS(vsr::zonal_stats(values, zones, o), vsr::ZonalInputError);
  o = {};
  o.bands = {2};
  CHECK_THROWS_AS(vsr::zonal_stats(values, zones, o), vsr::ZonalInputError);
  o = {};
  const auto floats =
      vsr::OwnedRasterArray::from_host(v.data(), vsr::DType::float32, 1, 4, 4, {}, affine);
  CHECK_THROWS_AS(vsr::zonal_stats(values, floats, o), vsr::ZonalInputError);
  std::vector<std::int16_t> zi(20, 1);
  const auto other =
      vsr::OwnedRasterArray::from_host(zi.data(), vsr::DType::int16, 1, 4, 5, {}, affine);
  CHECK_THROWS_AS(vsr::zonal_stats(values, other, o), vsr::ZonalInputError);
  const auto shifted = vsr::OwnedRasterArray::from_host(zi.data(), vsr::DType::int16, 1, 4, 4, {},
                                                        vsr::Affine{1, 0, 0.5, 0, -1, 4});
  CHECK_THROWS_AS(vsr::zonal_stats(values, shifted, o), vsr::ZonalInputError);
  vsr::ZoneSet bad_ids = zones;
  bad_ids.ids.integers = {1, 2};
  CHECK_THROWS_AS(vsr::zonal_stats(values, bad_ids, o), vsr::ZonalInputError);
  CHECK_THROWS_AS(vsr::parse_zonal_stats("count,,sum"), vsr::ZonalInputError);
  CHECK_THROWS_AS(vsr::parse_zonal_stats("count,count"), vsr::ZonalInputError);
  CHECK(vsr::parse_zonal_stats("count, sum,median") ==
        std::vector<std::string>{"count", "sum", "median"});
  CHECK_THROWS_AS(vsr::pixel_rule_from_string("centre"), vsr::ZonalInputError);
  // The planner's plan: whole within the default budget, tiles within a small one.
  vsr::ZonalOptions p;
  CHECK(vsr::zonal_stats_plan(values.metadata(), p).strategy == vsr::TilingStrategy::whole);
  vsr::RasterMetadata big = values.metadata();
  big.height = big.width = 20000;
  p.memory_budget = 64ull << 20;
  const vsr::RasterPlan tiled = vsr::zonal_stats_plan(big, p, vsr::DType::float32);
  CHECK(tiled.strategy == vsr::TilingStrategy::tiled);
  CHECK(tiled.fits_budget);
}

TEST_CASE("the table as JSON and CSV: nulls, frac, text zones") {
  vsr::ZonalTable t;
  t.zone.kind = vsr::ZoneIds::Kind::text;
  t.zone.texts = {"a\"b", "c,d"};
  t.band = {1, 1};
  t.stat_names = {"count", "mean", "frac"};
  t.values = {{2.5, 0}, {0.1, NAN}, {NAN, NAN}};
  t.frac = {{{1, 0.25}, {2, 0.75}}, {}};
  CHECK(vsr::zonal_table_json(t) ==
        "[\n  {\"zone\": \"a\\\"b\", \"band\": 1, \"count\": 2.5, \"mean\": 0.10000000000000001, "
        "\"frac\": {\"1\": 0.25, \"2\": 0.75}},\n  {\"zone\": \"c,d\", \"band\": 1, \"count\": 0, "
        "\"mean\": null, \"frac\": null}\n]\n");
  CHECK(vsr::zonal_table_csv(t) ==
        "zone,band,count,mean,frac\n\"a\"\"b\",1,2.5,0.10000000000000001,\"1:0.25;2:0.75\"\n"
        "\"c,d\",1,0,,\n");
}

TEST_CASE("zonal_stats: a million polygon zones in one pass") {
  // 1000 x 1000 pixels, one unit square per pixel shifted by half a pixel: each covers four
  // quarter pixels (the last row and column half outside), tiles of 256 x 256.
  const std::int64_t n = 1000;
  std::vector<float> v(static_cast<std::size_t>(n * n));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 7);
  const auto raster = vsr::OwnedRasterArray::from_host(v.data(), vsr::DType::float32, 1, n, n, {},
                                                       vsr::Affine{1, 0, 0, 0, -1, 1000});
  vsr::ZoneSet zones;
  zones.geometries.reserve(static_cast<std::size_t>(n * n));
  for (std::int64_t r = 0; r < n; ++r) {
    for (std::int64_t c = 0; c < n; ++c) {
      const double x = c + 0.5, y = 1000 - r - 1.5;
      zones.geometries.push_back({{{{x, y}, {x + 1, y}, {x + 1, y + 1}, {x, y + 1}}}});
    }
  }
  vsr::ZonalOptions o;
  o.stats = {"count", "sum", "cell_count"};
  o.tile_shape = std::pair<std::int64_t, std::int64_t>{256, 256};
  const auto t = vsr::zonal_stats(raster, zones, o);
  REQUIRE(t.rows() == static_cast<std::size_t>(n * n));
  std::size_t inside = 0;
  for (std::int64_t r = 0; r < n; ++r) {
    for (std::int64_t c = 0; c < n; ++c) {
      const auto k = static_cast<std::size_t>(r * n + c);
      const bool edge = r == n - 1 || c == n - 1;
      if (edge) continue;
      ++inside;
      const double want = 0.25 * (v[k] + v[k + 1] + v[k + n] + v[k + n + 1]);
      if (t.column("count")[k] != 1 || t.column("sum")[k] != want ||
          t.column("cell_count")[k] != 4) {
        FAIL("zone " << k << ": count " << t.column("count")[k] << " sum " << t.column("sum")[k]);
      }
    }
  }
  CHECK(inside == static_cast<std::size_t>((n - 1) * (n - 1)));
  CHECK(t.column("count")[static_cast<std::size_t>(n * n - 1)] == 0.25);
}
