// SPDX-License-Identifier: Apache-2.0
// Pipelines: a chain equals the same operations run one after another on the whole raster, bit
// for bit, whole and tiled at several tile shapes, for both edge modes and every step kind; band
// math over named inputs and X; the errors of building and running one.
#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/ops.hpp>
#include <vibespatial/raster/pipeline.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

using namespace vibespatial::raster;

namespace {

/// A float32 host raster of random values in [0, 100) with some nodata (-9999) and NaN pixels.
OwnedRasterArray random_raster(int bands, std::int64_t h, std::int64_t w, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0.0f, 100.0f);
  std::vector<float> v(static_cast<std::size_t>(bands * h * w));
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::uint32_t r = rng() % 50;
    v[i] = r == 0 ? -9999.0f : r == 1 ? std::numeric_limits<float>::quiet_NaN() : u(rng);
  }
  return OwnedRasterArray::from_host(v.data(), DType::float32, bands, h, w, -9999.0,
                                     Affine{10, 0, 500, 0, -10, 900}, "EPSG:32633");
}

std::size_t byte_size(const OwnedRasterArray& r) {
  return static_cast<std::size_t>(r.band_count() * r.height() * r.width()) * itemsize(r.dtype());
}

/// Whether two host rasters hold the same bytes, dtype, shape and nodata.
bool same(const OwnedRasterArray& a, const OwnedRasterArray& b) {
  if (a.dtype() != b.dtype() || a.band_count() != b.band_count() || a.height() != b.height() ||
      a.width() != b.width()) {
    return false;
  }
  if (a.nodata().has_value() != b.nodata().has_value()) return false;
  if (a.nodata() && !(std::isnan(*a.nodata()) && std::isnan(*b.nodata())) &&
      *a.nodata() != *b.nodata()) {
    return false;
  }
  return std::memcmp(a.host_data(), b.host_data(), byte_size(a)) == 0;
}

RasterPlan tiled(std::int64_t th, std::int64_t tw, int bands_per_pass = 1) {
  RasterPlan p;
  p.strategy = TilingStrategy::tiled;
  p.tile_shape = {th, tw};
  p.bands_per_pass = bands_per_pass;
  return p;  // halo 0: the run raises it to the chain's
}

const RasterPlan kWhole{};

}  // namespace

TEST_SUITE("ops") {
  TEST_CASE("a chain equals its steps run one after another, whole and tiled, bit for bit") {
    const OwnedRasterArray in = random_raster(3, 37, 53, 11);
    for (EdgeMode edge : {EdgeMode::reflect, EdgeMode::nearest}) {
      CAPTURE(static_cast<int>(edge));
      Pipeline chain({{"A", 3}});
      chain.focal_mean(edge)
          .clip(5, 95)
          .focal_mean(edge == EdgeMode::reflect ? EdgeMode::nearest : EdgeMode::reflect)
          .rescale(0, 100, 1, 255, DType::uint8)
          .convert(DType::float32, NodataValue{0.0});
      CHECK(chain.halo() == 2);
      CHECK(chain.bands_independent());
      CHECK(chain.step_names() ==
            std::vector<std::string>{"focal-mean", "clip", "focal-mean", "rescale", "convert"});
      OwnedRasterArray want = focal_mean_3x3(in, edge);
      want = clip(want, 5, 95);
      want =
          focal_mean_3x3(want, edge == EdgeMode::reflect ? EdgeMode::nearest : EdgeMode::reflect);
      want = rescale(want, 0, 100, 1, 255, DType::uint8);
      want = convert_dtype(want, DType::float32, NodataValue{0.0});
      CHECK(same(chain.run({in}, kWhole), want));
      for (auto [th, tw] :
           {std::pair{8, 8}, std::pair{5, 17}, std::pair{1, 53}, std::pair{64, 64}}) {
        for (int bpp : {1, 3}) {
          CAPTURE(th);
          CAPTURE(tw);
          CAPTURE(bpp);
          const OwnedRasterArray got = chain.run({in}, tiled(th, tw, bpp));
          CHECK(same(got, want));
          CHECK(got.affine() == in.affine());
          CHECK(got.crs() == in.crs());
        }
      }
    }
  }

  TEST_CASE("calc steps: named inputs and X, then a focal step, tiled as whole") {
    const OwnedRasterArray a = random_raster(4, 29, 31, 3);
    const OwnedRasterArray b = random_raster(1, 29, 31, 4);
    Pipeline chain({{"A", 4}, {"B", 1}});
    chain.calc({"(A[4] - A[3]) / (A[4] + A[3])", "A[1] - B"})
        .focal_mean(EdgeMode::reflect)
        .calc({"X[1] * 100 + X[2]"}, CalcOptions{DType::float64});
    CHECK(chain.halo() == 1);
    CHECK_FALSE(chain.bands_independent());
    CHECK(chain.band_count() == 1);
    OwnedRasterArray want =
        calc({"(A[4] - A[3]) / (A[4] + A[3])", "A[1] - B"}, {{"A", a}, {"B", b}});
    want = focal_mean_3x3(want, EdgeMode::reflect);
    want =
        calc({"X[1] * 100 + X[2]"}, {{"A", a}, {"B", b}, {"X", want}}, CalcOptions{DType::float64});
    CHECK(same(chain.run({a, b}, kWhole), want));
    for (auto [th, tw] : {std::pair{7, 7}, std::pair{29, 4}, std::pair{3, 31}}) {
      CAPTURE(th);
      CAPTURE(tw);
      CHECK(same(chain.run({a, b}, tiled(th, tw)), want));
    }
  }

  TEST_CASE("a step of the caller's: its halo counts, its result goes on") {
    const OwnedRasterArray in = random_raster(1, 20, 24, 8);
    Pipeline chain({{"A", 1}});
    chain
        .step(
            "twice", [](const OwnedRasterArray& t) { return focal_mean_3x3(focal_mean_3x3(t)); }, 2)
        .focal_mean();
    CHECK(chain.halo() == 3);
    const OwnedRasterArray want = focal_mean_3x3(focal_mean_3x3(focal_mean_3x3(in)));
    CHECK(same(chain.run({in}, tiled(6, 5)), want));
    Pipeline no_steps({{"A", 1}});
    CHECK(same(no_steps.run({in}, tiled(6, 5)), in));
  }

  TEST_CASE("bad pipelines and bad runs: typed errors naming the step or the inputs") {
    CHECK_THROWS_WITH_AS(Pipeline({}), doctest::Contains("at least one input"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(Pipeline({{"X", 1}}), doctest::Contains("may not be named X"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(Pipeline({{"A", 1}, {"A", 2}}), doctest::Contains("Pipeline: "),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(Pipeline({{"A", 0}}), doctest::Contains("Pipeline: "),
                         std::invalid_argument);
    Pipeline p({{"A", 2}});
    p.focal_mean();
    CHECK_THROWS_WITH_AS(p.calc({"A[1] + C"}),
                         doctest::Contains("Pipeline: step 2 (calc): compile_calc: unknown name "
                                           "'C' at column 8"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(p.calc({"X[3]"}), doctest::Contains("step 2 (calc)"),
                         std::invalid_argument);
    CHECK_THROWS_AS(p.rescale(0, INFINITY, 0, 1, DType::uint8), std::invalid_argument);
    CHECK_THROWS_AS(p.rescale(1, 1, 0, 1, DType::uint8), std::invalid_argument);
    CHECK_THROWS_AS(p.clip(2, 1), std::invalid_argument);
    CHECK_THROWS_AS(p.step("", [](const OwnedRasterArray& t) { return t; }), std::invalid_argument);
    CHECK_THROWS_AS(p.step("none", BandOp{}), std::invalid_argument);
    CHECK_THROWS_AS(p.step(
                        "neg", [](const OwnedRasterArray& t) { return t; }, -1),
                    std::invalid_argument);
    CHECK(p.step_names() == std::vector<std::string>{"focal-mean"});  // failed steps add nothing
    const OwnedRasterArray two = random_raster(2, 10, 12, 1);
    CHECK_THROWS_WITH_AS(p.run({random_raster(3, 10, 12, 1)}, kWhole),
                         doctest::Contains("input A has 3 bands, the pipeline was built for 2"),
                         std::invalid_argument);
    CHECK_THROWS_AS(p.run({two, two}, kWhole), std::invalid_argument);
    Pipeline ab({{"A", 2}, {"B", 2}});
    ab.calc({"A[1] + B[2]"});
    CHECK_THROWS_WITH_AS(ab.run({two, random_raster(2, 11, 12, 2)}, kWhole),
                         doctest::Contains("the inputs must share one grid"),
                         std::invalid_argument);
    // A step's failure on the data names the step.
    Pipeline fill({{"A", 2}});
    fill.fill_nodata(0.5).convert(DType::uint8, NodataValue{300.0});
    CHECK_THROWS_WITH_AS(fill.run({two}, kWhole), doctest::Contains("step 2 (convert)"),
                         std::invalid_argument);
    // A caller's step that changes the shape.
    Pipeline shrink({{"A", 2}});
    shrink.step("crop", [](const OwnedRasterArray& t) {
      return copy_window(t, RasterWindow{0, 0, t.width() - 1, t.height()});
    });
    CHECK_THROWS_WITH_AS(shrink.run({two}, kWhole), doctest::Contains("step 1 (crop): its result"),
                         std::invalid_argument);
  }
}
