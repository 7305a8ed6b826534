// SPDX-License-Identifier: Apache-2.0
// Planner tests: max_bands_for_budget, analyze_raster_plan, plan_from_metadata.
#include "all_dtypes.hpp"

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/dispatch.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace vsr = vibespatial::raster;
using vsr::DType;
using vsr::PlanOptions;
using vsr::RasterPlan;
using vsr::TilingStrategy;

namespace {

// A straight-line transcription of the reference's analyze_raster_plan
// (vibespatial/raster/dispatch.py), independent of src/dispatch/planner.cpp. Python ints are
// int64 here: the inputs of the tests below keep every product far below 2^63.
struct ReferencePlan {
  bool tiled = false;
  std::int64_t tile_h = 0, tile_w = 0;
  int halo = 0;
  std::int64_t n_tiles = 0;
  std::int64_t estimated_vram_per_tile = 0;
};

ReferencePlan reference_analyze_raster_plan(std::int64_t height, std::int64_t width,
                                            std::int64_t pixel_bytes, std::int64_t band_count,
                                            std::int64_t buffers_per_band,
                                            std::int64_t scratch_bytes, std::int64_t halo,
                                            std::int64_t vram_budget) {
  const double budget_safety_factor = 0.7;
  const std::int64_t default_tile_dim = 4096;
  const std::int64_t tile_alignment = 256;
  const std::int64_t min_tile_dim = tile_alignment;

  const std::int64_t full_raster_bytes =
      height * width * pixel_bytes * buffers_per_band * band_count;

  if (vram_budget <= 0) {
    return ReferencePlan{false, 0, 0, static_cast<int>(halo), 0, 0};
  }

  // int(vram_budget * budget_safety_factor)
  const auto usable_budget =
      static_cast<std::int64_t>(static_cast<double>(vram_budget) * budget_safety_factor);

  if (full_raster_bytes + scratch_bytes <= usable_budget) {
    return ReferencePlan{false, 0, 0, static_cast<int>(halo), 0, full_raster_bytes + scratch_bytes};
  }

  std::int64_t tile_h = std::min(default_tile_dim, height);
  std::int64_t tile_w = std::min(default_tile_dim, width);

  tile_h = std::max(min_tile_dim, (tile_h / tile_alignment) * tile_alignment);
  tile_w = std::max(min_tile_dim, (tile_w / tile_alignment) * tile_alignment);

  std::int64_t physical_h = 0;
  std::int64_t physical_w = 0;
  std::int64_t tile_bytes = 0;
  while (true) {
    physical_h = tile_h + 2 * halo;
    physical_w = tile_w + 2 * halo;
    tile_bytes =
        physical_h * physical_w * pixel_bytes * buffers_per_band * band_count + scratch_bytes;
    if (tile_bytes <= usable_budget) break;
    if (tile_h <= min_tile_dim && tile_w <= min_tile_dim) break;
    if (tile_h >= tile_w) {
      tile_h = std::max(min_tile_dim, ((tile_h / 2) / tile_alignment) * tile_alignment);
    } else {
      tile_w = std::max(min_tile_dim, ((tile_w / 2) / tile_alignment) * tile_alignment);
    }
  }

  physical_h = tile_h + 2 * halo;
  physical_w = tile_w + 2 * halo;
  tile_bytes =
      physical_h * physical_w * pixel_bytes * buffers_per_band * band_count + scratch_bytes;

  const std::int64_t effective_h = tile_h;
  const std::int64_t effective_w = tile_w;
  const std::int64_t rows_of_tiles = (height + effective_h - 1) / effective_h;
  const std::int64_t cols_of_tiles = (width + effective_w - 1) / effective_w;
  const std::int64_t n_tiles = rows_of_tiles * cols_of_tiles;

  return ReferencePlan{true, tile_h, tile_w, static_cast<int>(halo), n_tiles, tile_bytes};
}

PlanOptions options_with(int bands, int bpb, std::uint64_t scratch, int halo,
                         std::optional<std::uint64_t> budget, bool per_band = false) {
  PlanOptions options;
  options.band_count = bands;
  options.buffers_per_band = bpb;
  options.scratch_bytes = scratch;
  options.halo = halo;
  options.vram_budget = budget;
  options.per_band = per_band;
  return options;
}

std::string describe(const RasterPlan& plan) {
  std::ostringstream s;
  s << vsr::to_string(plan.strategy) << " tile=";
  if (plan.tile_shape) {
    s << plan.tile_shape->first << "x" << plan.tile_shape->second;
  } else {
    s << "none";
  }
  s << " halo=" << plan.halo << " n_tiles=" << plan.n_tiles
    << " est=" << plan.estimated_vram_per_tile << " bands_per_pass=" << plan.bands_per_pass
    << " fits=" << plan.fits_budget;
  return s.str();
}

bool same_as_reference(const RasterPlan& plan, const ReferencePlan& ref) {
  if (plan.halo != ref.halo || plan.n_tiles != ref.n_tiles ||
      plan.estimated_vram_per_tile != static_cast<std::uint64_t>(ref.estimated_vram_per_tile)) {
    return false;
  }
  if (!ref.tiled) return plan.strategy == TilingStrategy::whole && !plan.tile_shape;
  return plan.strategy == TilingStrategy::tiled && plan.tile_shape &&
         plan.tile_shape->first == ref.tile_h && plan.tile_shape->second == ref.tile_w;
}

std::int64_t ceil_div(std::int64_t n, std::int64_t d) {
  return (n + d - 1) / d;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// max_bands_for_budget
// ---------------------------------------------------------------------------------------------

TEST_CASE("max_bands_for_budget: the reference's cases (80 MB = 80,000,000 bytes)") {
  // The reference's tests mock available_vram_bytes() to return 80_000_000 (decimal MB). With
  // 80 MiB the uint8 case would give 41, not 40.
  constexpr std::uint64_t mb80 = 80'000'000;
  CHECK(vsr::max_bands_for_budget(1000, 1000, DType::float32, 2, 0, mb80) == 10);
  CHECK(vsr::max_bands_for_budget(1000, 1000, DType::uint8, 2, 0, mb80) == 40);
  CHECK(vsr::max_bands_for_budget(1000, 1000, DType::float64, 2, 0, mb80) == 5);
  CHECK(vsr::max_bands_for_budget(1000, 1000, DType::float32, 2, 30'000'000, mb80) == 6);
}

TEST_CASE("max_bands_for_budget: edges") {
  SUBCASE("at least one band") {
    CHECK(vsr::max_bands_for_budget(1000, 1000, DType::float32, 2, 0, 0) == 1);
    CHECK(vsr::max_bands_for_budget(1000, 1000, DType::float32, 2, 0, 7'999'999) == 1);
    CHECK(vsr::max_bands_for_budget(1000, 1000, DType::float32, 2, 0, 8'000'000) == 1);
    CHECK(vsr::max_bands_for_budget(1000, 1000, DType::float32, 2, 0, 16'000'000) == 2);
  }
  SUBCASE("scratch above the budget saturates at 0") {
    CHECK(vsr::max_bands_for_budget(10, 10, DType::uint8, 1, 1'000'000, 10) == 1);
    CHECK(vsr::max_bands_for_budget(10, 10, DType::uint8, 1, 1000, 1000) == 1);
    CHECK(vsr::max_bands_for_budget(10, 10, DType::uint8, 1, 1000, 1300) == 3);
  }
  SUBCASE("buffers per band count") {
    CHECK(vsr::max_bands_for_budget(1000, 1000, DType::float32, 1, 0, 80'000'000) == 20);
    CHECK(vsr::max_bands_for_budget(1000, 1000, DType::float32, 3, 0, 80'000'000) == 6);
  }
  SUBCASE("clamped to INT_MAX") {
    CHECK(vsr::max_bands_for_budget(1, 1, DType::uint8, 1, 0, std::uint64_t{1} << 40) == INT_MAX);
    CHECK(vsr::max_bands_for_budget(1, 1, DType::uint8, 1, 0,
                                    std::numeric_limits<std::uint64_t>::max()) == INT_MAX);
  }
  SUBCASE("no explicit budget asks available_vram_bytes()") {
    const std::uint64_t available = vsr::available_vram_bytes();
    CHECK(vsr::max_bands_for_budget(100, 100, DType::float32) ==
          vsr::max_bands_for_budget(100, 100, DType::float32, 2, 0, available));
  }
}

TEST_CASE("max_bands_for_budget: invalid arguments and overflow") {
  CHECK_THROWS_AS(vsr::max_bands_for_budget(0, 10, DType::float32), std::invalid_argument);
  CHECK_THROWS_AS(vsr::max_bands_for_budget(-1, 10, DType::float32), std::invalid_argument);
  CHECK_THROWS_AS(vsr::max_bands_for_budget(10, 0, DType::float32), std::invalid_argument);
  CHECK_THROWS_AS(vsr::max_bands_for_budget(10, -5, DType::float32), std::invalid_argument);
  CHECK_THROWS_AS(vsr::max_bands_for_budget(10, 10, static_cast<DType>(10)), std::invalid_argument);
  CHECK_THROWS_AS(vsr::max_bands_for_budget(10, 10, DType::float32, 0), std::invalid_argument);
  CHECK_THROWS_AS(vsr::max_bands_for_budget(10, 10, DType::float32, -2), std::invalid_argument);
  const std::int64_t big = std::int64_t{1} << 40;
  CHECK_THROWS_AS(vsr::max_bands_for_budget(big, big, DType::uint8, 1, 0, 1000),
                  std::overflow_error);
  // The pixel count fits, the byte count does not.
  CHECK_THROWS_AS(vsr::max_bands_for_budget(std::int64_t{1} << 31, std::int64_t{1} << 31,
                                            DType::float64, 2, 0, 1000),
                  std::overflow_error);
  CHECK_THROWS_WITH_AS(vsr::max_bands_for_budget(-7, 10, DType::float32),
                       doctest::Contains("height"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(vsr::max_bands_for_budget(-7, 10, DType::float32), doctest::Contains("-7"),
                       std::invalid_argument);
}

// ---------------------------------------------------------------------------------------------
// analyze_raster_plan: worked examples
// ---------------------------------------------------------------------------------------------

TEST_CASE("usable budget is floor(0.7 * budget)") {
  CHECK(vsr::usable_vram_budget(0) == 0);
  CHECK(vsr::usable_vram_budget(1) == 0);
  CHECK(vsr::usable_vram_budget(10) == 7);
  CHECK(vsr::usable_vram_budget(1'000'000'000) == 700'000'000);
  CHECK(vsr::usable_vram_budget(std::uint64_t{16} << 30) ==
        static_cast<std::uint64_t>(static_cast<double>(std::uint64_t{16} << 30) * 0.7));
}

TEST_CASE("budget 0 means no GPU: whole, estimate 0") {
  const RasterPlan plan =
      vsr::analyze_raster_plan(50000, 50000, DType::float64, options_with(7, 3, 12345, 4, 0));
  CHECK(plan.strategy == TilingStrategy::whole);
  CHECK_FALSE(plan.tile_shape.has_value());
  CHECK(plan.n_tiles == 0);
  CHECK(plan.estimated_vram_per_tile == 0);
  CHECK(plan.halo == 4);
  CHECK(plan.bands_per_pass == 7);
  CHECK(plan.fits_budget);
  // per_band changes nothing there.
  CHECK(vsr::analyze_raster_plan(50000, 50000, DType::float64,
                                 options_with(7, 3, 12345, 4, 0, true)) == plan);
}

TEST_CASE("whole when everything fits") {
  const RasterPlan plan = vsr::analyze_raster_plan(1000, 1000, DType::float32,
                                                   options_with(3, 2, 1000, 0, 1'000'000'000));
  CHECK(plan.strategy == TilingStrategy::whole);
  CHECK_FALSE(plan.tile_shape.has_value());
  CHECK(plan.n_tiles == 0);
  CHECK(plan.estimated_vram_per_tile == 3 * 8'000'000 + 1000);
  CHECK(plan.bands_per_pass == 3);
  CHECK(plan.fits_budget);

  SUBCASE("exactly at the usable budget is whole") {
    // full + scratch = 8,000,000 + 6,000,000 == int(20,000,000 * 0.7).
    const RasterPlan edge = vsr::analyze_raster_plan(1000, 1000, DType::float32,
                                                     options_with(1, 2, 6'000'000, 0, 20'000'000));
    CHECK(edge.strategy == TilingStrategy::whole);
    CHECK(edge.estimated_vram_per_tile == 14'000'000);
    const RasterPlan over = vsr::analyze_raster_plan(1000, 1000, DType::float32,
                                                     options_with(1, 2, 6'000'001, 0, 20'000'000));
    CHECK(over.strategy == TilingStrategy::tiled);
  }
}

TEST_CASE("tiled: 4096 tiles when they fit") {
  // 10000^2 float32 x2 = 800 MB > 700 MB usable.
  const RasterPlan plan = vsr::analyze_raster_plan(10000, 10000, DType::float32,
                                                   options_with(1, 2, 0, 0, 1'000'000'000));
  CHECK(plan.strategy == TilingStrategy::tiled);
  REQUIRE(plan.tile_shape.has_value());
  CHECK(*plan.tile_shape == std::pair<std::int64_t, std::int64_t>{4096, 4096});
  CHECK(plan.n_tiles == 9);
  CHECK(plan.estimated_vram_per_tile == 4096ull * 4096 * 4 * 2);
  CHECK(plan.bands_per_pass == 1);
  CHECK(plan.fits_budget);
}

TEST_CASE("tiled: halving sequence, height first on a tie") {
  // 10000^2 float32, one band, 2 buffers: 8 bytes per pixel. Each budget admits exactly one
  // step of the sequence the reference walks through.
  const std::array<std::pair<std::int64_t, std::int64_t>, 9> sequence{{
      {4096, 4096},
      {2048, 4096},
      {2048, 2048},
      {1024, 2048},
      {1024, 1024},
      {512, 1024},
      {512, 512},
      {256, 512},
      {256, 256},
  }};
  for (const auto& [th, tw] : sequence) {
    CAPTURE(th);
    CAPTURE(tw);
    const std::uint64_t tile_bytes = static_cast<std::uint64_t>(th * tw * 8);
    // The smallest budget whose usable part holds the tile.
    std::uint64_t budget = tile_bytes * 10 / 7;
    while (vsr::usable_vram_budget(budget) < tile_bytes) ++budget;
    const RasterPlan plan =
        vsr::analyze_raster_plan(10000, 10000, DType::float32, options_with(1, 2, 0, 0, budget));
    CHECK(plan.strategy == TilingStrategy::tiled);
    REQUIRE(plan.tile_shape.has_value());
    CHECK(plan.tile_shape->first == th);
    CHECK(plan.tile_shape->second == tw);
    CHECK(plan.n_tiles == ceil_div(10000, th) * ceil_div(10000, tw));
    CHECK(plan.estimated_vram_per_tile == tile_bytes);
    CHECK(plan.fits_budget);
    // One byte less and the planner takes the next step down (or stops at 256^2, over budget).
    const RasterPlan smaller = vsr::analyze_raster_plan(10000, 10000, DType::float32,
                                                        options_with(1, 2, 0, 0, budget - 1));
    REQUIRE(smaller.tile_shape.has_value());
    CHECK(smaller.tile_shape->first * smaller.tile_shape->second <= th * tw);
    if (th * tw == 256 * 256) {
      CHECK(*smaller.tile_shape == std::pair<std::int64_t, std::int64_t>{256, 256});
      CHECK_FALSE(smaller.fits_budget);
    } else {
      CHECK(smaller.tile_shape->first * smaller.tile_shape->second == th * tw / 2);
    }
  }
}

TEST_CASE("tiled: non-square rasters halve the larger side") {
  // 300 rows: the tile height starts at 256 (rounded down), the width halves alone.
  const RasterPlan plan =
      vsr::analyze_raster_plan(300, 100000, DType::float32, options_with(1, 2, 0, 0, 10'000'000));
  REQUIRE(plan.tile_shape.has_value());
  // usable 7e6: 256 x 4096 x 8 = 8.4e6 too big; 256 x 2048 x 8 = 4.2e6 fits.
  CHECK(*plan.tile_shape == std::pair<std::int64_t, std::int64_t>{256, 2048});
  CHECK(plan.n_tiles == 2 * ceil_div(100000, 2048));

  // Fewer than 256 pixels on a side: the tile is still 256 (larger than the raster).
  const RasterPlan tiny =
      vsr::analyze_raster_plan(100, 100, DType::float64, options_with(4, 2, 0, 0, 100'000));
  REQUIRE(tiny.tile_shape.has_value());
  CHECK(*tiny.tile_shape == std::pair<std::int64_t, std::int64_t>{256, 256});
  CHECK(tiny.n_tiles == 1);
  CHECK(tiny.estimated_vram_per_tile == 256ull * 256 * 8 * 2 * 4);
  CHECK_FALSE(tiny.fits_budget);
}

TEST_CASE("tiled: the halo is in the estimate, not in the tile shape") {
  const RasterPlan plan = vsr::analyze_raster_plan(10000, 10000, DType::float32,
                                                   options_with(2, 2, 5000, 8, 1'000'000'000));
  REQUIRE(plan.tile_shape.has_value());
  CHECK(*plan.tile_shape == std::pair<std::int64_t, std::int64_t>{4096, 4096});
  CHECK(plan.halo == 8);
  CHECK(plan.estimated_vram_per_tile == (4096ull + 16) * (4096 + 16) * 4 * 2 * 2 + 5000);
  CHECK(plan.n_tiles == 9);
  CHECK(plan.bands_per_pass == 2);
}

TEST_CASE("fits_budget is false when even 256 x 256 is over") {
  const RasterPlan plan =
      vsr::analyze_raster_plan(10000, 10000, DType::float32, options_with(16, 3, 0, 0, 1'000'000));
  REQUIRE(plan.tile_shape.has_value());
  CHECK(*plan.tile_shape == std::pair<std::int64_t, std::int64_t>{256, 256});
  CHECK(plan.estimated_vram_per_tile == 256ull * 256 * 4 * 3 * 16);
  CHECK_FALSE(plan.fits_budget);

  // Scratch alone over the budget.
  const RasterPlan scratch = vsr::analyze_raster_plan(
      1000, 1000, DType::uint8, options_with(1, 1, 2'000'000'000, 0, 1'000'000'000));
  CHECK(scratch.strategy == TilingStrategy::tiled);
  CHECK_FALSE(scratch.fits_budget);

  // A budget of one byte: usable 0.
  const RasterPlan one = vsr::analyze_raster_plan(1, 1, DType::uint8, options_with(1, 1, 0, 0, 1));
  CHECK(one.strategy == TilingStrategy::tiled);
  CHECK_FALSE(one.fits_budget);
  CHECK(one.n_tiles == 1);
}

TEST_CASE("no explicit budget asks available_vram_bytes()") {
  const std::uint64_t available = vsr::available_vram_bytes();
  CHECK(vsr::analyze_raster_plan(5000, 7000, DType::int16, options_with(3, 2, 0, 1, {})) ==
        vsr::analyze_raster_plan(5000, 7000, DType::int16, options_with(3, 2, 0, 1, available)));
}

// ---------------------------------------------------------------------------------------------
// per_band
// ---------------------------------------------------------------------------------------------

TEST_CASE("per_band: band_batches with the most bands that fit") {
  // 1000^2 float32 x2 = 8e6 per band, 16 bands = 128e6; usable 70e6.
  const RasterPlan plan = vsr::analyze_raster_plan(1000, 1000, DType::float32,
                                                   options_with(16, 2, 0, 3, 100'000'000, true));
  CHECK(plan.strategy == TilingStrategy::band_batches);
  CHECK(plan.bands_per_pass == 8);
  CHECK(plan.estimated_vram_per_tile == 64'000'000);
  CHECK_FALSE(plan.tile_shape.has_value());
  CHECK(plan.n_tiles == 0);
  CHECK(plan.halo == 3);
  CHECK(plan.fits_budget);

  const RasterPlan with_scratch = vsr::analyze_raster_plan(
      1000, 1000, DType::float32, options_with(16, 2, 10'000'000, 0, 100'000'000, true));
  CHECK(with_scratch.strategy == TilingStrategy::band_batches);
  CHECK(with_scratch.bands_per_pass == 7);
  CHECK(with_scratch.estimated_vram_per_tile == 66'000'000);

  // Everything fits: whole, as without per_band.
  const RasterPlan whole = vsr::analyze_raster_plan(1000, 1000, DType::float32,
                                                    options_with(8, 2, 0, 0, 100'000'000, true));
  CHECK(whole.strategy == TilingStrategy::whole);
  CHECK(whole.bands_per_pass == 8);
  CHECK(whole.estimated_vram_per_tile == 64'000'000);
}

TEST_CASE("per_band: one band does not fit -> tiles of one band") {
  // 10000^2 float32 x2 = 800 MB per band > 700 MB usable.
  const RasterPlan plan = vsr::analyze_raster_plan(10000, 10000, DType::float32,
                                                   options_with(8, 2, 0, 2, 1'000'000'000, true));
  CHECK(plan.strategy == TilingStrategy::tiled);
  CHECK(plan.bands_per_pass == 1);
  REQUIRE(plan.tile_shape.has_value());
  CHECK(*plan.tile_shape == std::pair<std::int64_t, std::int64_t>{4096, 4096});
  CHECK(plan.estimated_vram_per_tile == 4100ull * 4100 * 8);
  CHECK(plan.n_tiles == 9);
  CHECK(plan.fits_budget);

  // Not per-band: all 8 bands in each tile (4100^2 x 64 B > 700 MB), so the tiles are smaller.
  const RasterPlan all = vsr::analyze_raster_plan(10000, 10000, DType::float32,
                                                  options_with(8, 2, 0, 2, 1'000'000'000));
  REQUIRE(all.tile_shape.has_value());
  CHECK(*all.tile_shape == std::pair<std::int64_t, std::int64_t>{2048, 4096});
  CHECK(all.estimated_vram_per_tile == 2052ull * 4100 * 8 * 8);
  CHECK(all.bands_per_pass == 8);

  const RasterPlan hopeless = vsr::analyze_raster_plan(10000, 10000, DType::float64,
                                                       options_with(4, 3, 0, 0, 100'000, true));
  CHECK(hopeless.strategy == TilingStrategy::tiled);
  CHECK(hopeless.bands_per_pass == 1);
  CHECK(*hopeless.tile_shape == std::pair<std::int64_t, std::int64_t>{256, 256});
  CHECK_FALSE(hopeless.fits_budget);
}

// ---------------------------------------------------------------------------------------------
// The grid: identical to the reference for per_band == false, properties for both
// ---------------------------------------------------------------------------------------------

TEST_CASE("grid: identical to the reference transcription, and the plan properties hold") {
  const std::array<std::int64_t, 7> dims{1, 255, 256, 1000, 4097, 10000, 50000};
  const std::array<std::uint64_t, 3> scratches{0, 1'000'000, 100ull << 20};
  const std::array<int, 3> halos{0, 1, 8};
  const std::array<std::uint64_t, 12> budgets{0,
                                              1,
                                              1'000'000,
                                              1ull << 20,
                                              16'000'000,
                                              100'000'000,
                                              123'456'789,
                                              256ull << 20,
                                              1'000'000'000,
                                              2ull << 30,
                                              8'000'000'000,
                                              16ull << 30};

  std::int64_t cases = 0;
  std::int64_t mismatches = 0;
  std::int64_t property_failures = 0;
  std::string first_mismatch;
  std::string first_property_failure;
  const auto fail_property = [&](const std::string& what) {
    if (property_failures++ == 0) first_property_failure = what;
  };

  for (const std::int64_t h : dims) {
    for (const std::int64_t w : dims) {
      for (const DType dtype : vsr_test::kAllDTypes) {
        const auto item = static_cast<std::int64_t>(vsr::itemsize(dtype));
        for (int bands = 1; bands <= 16; ++bands) {
          for (int bpb = 1; bpb <= 3; ++bpb) {
            for (const std::uint64_t scratch : scratches) {
              for (const int halo : halos) {
                for (const std::uint64_t budget : budgets) {
                  ++cases;
                  std::ostringstream where;
                  where << "H=" << h << " W=" << w << " dtype=" << vsr::to_string(dtype)
                        << " bands=" << bands << " bpb=" << bpb << " scratch=" << scratch
                        << " halo=" << halo << " budget=" << budget;
                  const RasterPlan plan = vsr::analyze_raster_plan(
                      h, w, dtype, options_with(bands, bpb, scratch, halo, budget));
                  const ReferencePlan ref = reference_analyze_raster_plan(
                      h, w, item, bands, bpb, static_cast<std::int64_t>(scratch), halo,
                      static_cast<std::int64_t>(budget));
                  if (!same_as_reference(plan, ref) || plan.bands_per_pass != bands) {
                    if (mismatches++ == 0) {
                      first_mismatch = where.str() + " got " + describe(plan);
                    }
                    continue;
                  }

                  const std::uint64_t usable = vsr::usable_vram_budget(budget);
                  // fits_budget is honest.
                  if (budget == 0) {
                    if (!plan.fits_budget) fail_property(where.str() + " budget 0 not fitting");
                  } else if (plan.fits_budget != (plan.estimated_vram_per_tile <= usable)) {
                    fail_property(where.str() + " fits_budget wrong: " + describe(plan));
                  }
                  // Tiles cover the raster.
                  if (plan.strategy == TilingStrategy::tiled) {
                    const auto [th, tw] = *plan.tile_shape;
                    if (th % 256 != 0 || tw % 256 != 0 || th < 256 || tw < 256 || th > 4096 ||
                        tw > 4096 || plan.n_tiles != ceil_div(h, th) * ceil_div(w, tw) ||
                        plan.n_tiles * th * tw < h * w) {
                      fail_property(where.str() + " bad tiling: " + describe(plan));
                    }
                    if (!plan.fits_budget && (th != 256 || tw != 256)) {
                      fail_property(where.str() + " over budget above 256^2: " + describe(plan));
                    }
                  }

                  // per_band: never worse than the plan without it; band batches maximal.
                  const RasterPlan pb = vsr::analyze_raster_plan(
                      h, w, dtype, options_with(bands, bpb, scratch, halo, budget, true));
                  const std::uint64_t one_band = static_cast<std::uint64_t>(h * w * item * bpb);
                  if (plan.strategy == TilingStrategy::whole) {
                    if (!(pb == plan)) fail_property(where.str() + " per_band not whole");
                    continue;
                  }
                  if (pb.estimated_vram_per_tile > std::max(usable, plan.estimated_vram_per_tile) ||
                      (plan.fits_budget && !pb.fits_budget)) {
                    fail_property(where.str() + " per_band bigger: " + describe(pb) + " vs " +
                                  describe(plan));
                  }
                  if (pb.strategy == TilingStrategy::band_batches) {
                    const auto k = static_cast<std::uint64_t>(pb.bands_per_pass);
                    if (k < 1 || pb.bands_per_pass >= bands || pb.tile_shape || pb.n_tiles != 0 ||
                        !pb.fits_budget || pb.halo != halo ||
                        pb.estimated_vram_per_tile != k * one_band + scratch ||
                        k * one_band + scratch > usable || (k + 1) * one_band + scratch <= usable) {
                      fail_property(where.str() + " band_batches not maximal: " + describe(pb));
                    }
                  } else {
                    // One band does not fit: the reference's tiles for a single band.
                    const ReferencePlan one = reference_analyze_raster_plan(
                        h, w, item, 1, bpb, static_cast<std::int64_t>(scratch), halo,
                        static_cast<std::int64_t>(budget));
                    if (one_band + scratch <= usable || pb.bands_per_pass != 1 ||
                        !same_as_reference(pb, one) ||
                        pb.fits_budget != (pb.estimated_vram_per_tile <= usable)) {
                      fail_property(where.str() + " per_band tiles wrong: " + describe(pb));
                    }
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  INFO("cases: " << cases);
  INFO("first mismatch: " << first_mismatch);
  INFO("first property failure: " << first_property_failure);
  CHECK(cases == 7 * 7 * 10 * 16 * 3 * 3 * 3 * 12);
  CHECK(mismatches == 0);
  CHECK(property_failures == 0);
}

// ---------------------------------------------------------------------------------------------
// Validation and plan_from_metadata
// ---------------------------------------------------------------------------------------------

TEST_CASE("analyze_raster_plan: invalid arguments name the argument and value") {
  const auto plan = [](std::int64_t h, std::int64_t w, DType dtype, PlanOptions options) {
    return vsr::analyze_raster_plan(h, w, dtype, options);
  };
  const PlanOptions ok = options_with(1, 2, 0, 0, 1'000'000);
  CHECK_THROWS_WITH_AS(plan(0, 10, DType::uint8, ok), doctest::Contains("height"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(plan(-3, 10, DType::uint8, ok), doctest::Contains("-3"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(plan(10, 0, DType::uint8, ok), doctest::Contains("width"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(plan(10, -9, DType::uint8, ok), doctest::Contains("-9"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(plan(10, 10, static_cast<DType>(77), ok), doctest::Contains("dtype"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(plan(10, 10, DType::uint8, options_with(0, 2, 0, 0, 1000)),
                       doctest::Contains("band_count"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(plan(10, 10, DType::uint8, options_with(-4, 2, 0, 0, 1000)),
                       doctest::Contains("-4"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(plan(10, 10, DType::uint8, options_with(1, 0, 0, 0, 1000)),
                       doctest::Contains("buffers_per_band"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(plan(10, 10, DType::uint8, options_with(1, 2, 0, -1, 1000)),
                       doctest::Contains("halo"), std::invalid_argument);
  // Validation happens whatever the budget (also with budget 0 / no GPU).
  CHECK_THROWS_AS(plan(0, 10, DType::uint8, options_with(1, 2, 0, 0, 0)), std::invalid_argument);
  CHECK_THROWS_AS(plan(10, 10, DType::uint8, options_with(1, 2, 0, -1, 0)), std::invalid_argument);
}

TEST_CASE("analyze_raster_plan: byte counts over 64 bits throw overflow_error") {
  const std::int64_t big = std::int64_t{1} << 40;
  CHECK_THROWS_AS(vsr::analyze_raster_plan(big, big, DType::uint8, options_with(1, 1, 0, 0, 1000)),
                  std::overflow_error);
  CHECK_THROWS_AS(vsr::analyze_raster_plan(big, big, DType::uint8, options_with(1, 1, 0, 0, 0)),
                  std::overflow_error);
  // Pixels fit, bands x buffers x itemsize do not.
  CHECK_THROWS_AS(vsr::analyze_raster_plan(std::int64_t{1} << 30, std::int64_t{1} << 30,
                                           DType::float64, options_with(1 << 20, 8, 0, 0, 1000)),
                  std::overflow_error);
  // Tile bytes + scratch over 64 bits.
  CHECK_THROWS_AS(vsr::analyze_raster_plan(
                      1000, 1000, DType::uint8,
                      options_with(1, 1, std::numeric_limits<std::uint64_t>::max(), 0, 1000)),
                  std::overflow_error);
  // A huge but representable raster still plans.
  const RasterPlan plan = vsr::analyze_raster_plan(std::int64_t{1} << 31, std::int64_t{1} << 20,
                                                   DType::uint8, options_with(1, 1, 0, 0, 1000));
  CHECK(plan.strategy == TilingStrategy::tiled);
  CHECK(plan.n_tiles == (std::int64_t{1} << 23) * (std::int64_t{1} << 12));
  // full + scratch near 2^64 is compared without wrapping: one byte over the usable budget.
  const std::uint64_t max_budget = std::numeric_limits<std::uint64_t>::max();
  const std::uint64_t usable = vsr::usable_vram_budget(max_budget);
  const RasterPlan wide = vsr::analyze_raster_plan(
      1000, 1000, DType::uint8, options_with(1, 1, usable - 1'000'000 + 1, 0, max_budget));
  CHECK(wide.strategy == TilingStrategy::tiled);
  // 1000 rounds down to a 768 x 768 tile: 589,824 bytes, under the 1,000,000 left.
  CHECK(*wide.tile_shape == std::pair<std::int64_t, std::int64_t>{768, 768});
  CHECK(wide.estimated_vram_per_tile == usable - 1'000'000 + 1 + 768 * 768);
  CHECK(wide.fits_budget);
  CHECK(vsr::analyze_raster_plan(1000, 1000, DType::uint8,
                                 options_with(1, 1, usable - 1'000'000, 0, max_budget))
            .strategy == TilingStrategy::whole);
  // A tile whose bytes + scratch exceed 64 bits throws rather than wrapping.
  CHECK_THROWS_AS(vsr::analyze_raster_plan(1000, 1000, DType::uint8,
                                           options_with(1, 1, max_budget - 10, 0, max_budget)),
                  std::overflow_error);
}

TEST_CASE("plan_from_metadata takes dims, dtype and band_count from the metadata") {
  vsr::RasterMetadata meta;
  meta.height = 10000;
  meta.width = 12000;
  meta.band_count = 5;
  meta.dtype = DType::uint16;
  PlanOptions options = options_with(99, 3, 4096, 2, 500'000'000);
  const RasterPlan plan = vsr::plan_from_metadata(meta, options);
  PlanOptions expected_options = options;
  expected_options.band_count = 5;
  CHECK(plan == vsr::analyze_raster_plan(10000, 12000, DType::uint16, expected_options));
  CHECK(plan.bands_per_pass == 5);

  meta.band_count = 0;
  CHECK_THROWS_AS(vsr::plan_from_metadata(meta, options), std::invalid_argument);
  meta.band_count = 1;
  meta.height = 0;
  CHECK_THROWS_AS(vsr::plan_from_metadata(meta, options), std::invalid_argument);
}

TEST_CASE("tile_windows: row-major tiles that cover every pixel once, reads with the halo") {
  const std::int64_t h = 5, w = 7;
  const std::vector<vsr::TileWindow> tiles = vsr::tile_windows(h, w, 2, 3, 1);
  REQUIRE(tiles.size() == 9);  // 3 rows x 3 columns of tiles
  std::vector<int> covered(static_cast<std::size_t>(h * w), 0);
  std::int64_t prev_row = -1, prev_col = -1;
  for (const vsr::TileWindow& t : tiles) {
    const vsr::RasterWindow& e = t.window;
    CHECK((e.row_off > prev_row || (e.row_off == prev_row && e.col_off > prev_col)));
    prev_row = e.row_off, prev_col = e.col_off;
    CHECK(e.height == std::min<std::int64_t>(2, h - e.row_off));
    CHECK(e.width == std::min<std::int64_t>(3, w - e.col_off));
    for (std::int64_t r = e.row_off; r < e.row_off + e.height; ++r)
      for (std::int64_t c = e.col_off; c < e.col_off + e.width; ++c)
        ++covered[static_cast<std::size_t>(r * w + c)];
    // The read window: one pixel more on each side, clamped to the raster.
    CHECK(t.read.row_off == std::max<std::int64_t>(0, e.row_off - 1));
    CHECK(t.read.col_off == std::max<std::int64_t>(0, e.col_off - 1));
    CHECK(t.read.row_off + t.read.height == std::min(h, e.row_off + e.height + 1));
    CHECK(t.read.col_off + t.read.width == std::min(w, e.col_off + e.width + 1));
  }
  CHECK(std::all_of(covered.begin(), covered.end(), [](int n) { return n == 1; }));
  CHECK(tiles.back().window == vsr::RasterWindow{6, 4, 1, 1});
  // Without a halo the read is the window; one tile larger than the raster is the raster.
  for (const vsr::TileWindow& t : vsr::tile_windows(h, w, 2, 3)) CHECK(t.read == t.window);
  const auto one = vsr::tile_windows(h, w, 100, 100, 4);
  REQUIRE(one.size() == 1);
  CHECK(one[0].window == vsr::RasterWindow{0, 0, w, h});
  CHECK(one[0].read == one[0].window);
  CHECK_THROWS_AS(vsr::tile_windows(0, w, 2, 3), std::invalid_argument);
  CHECK_THROWS_AS(vsr::tile_windows(h, w, 2, 0), std::invalid_argument);
  CHECK_THROWS_AS(vsr::tile_windows(h, w, 2, 3, -1), std::invalid_argument);
}
