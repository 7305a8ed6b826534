// SPDX-License-Identifier: Apache-2.0
// DType, Affine, RasterMetadata and plan-type tests.
#include "all_dtypes.hpp"

#include <vibespatial/raster/buffers.hpp>

#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>

namespace vsr = vibespatial::raster;
using vsr::DType;
using vsr::NodataValue;
using vsr_test::kAllDTypes;

TEST_CASE("itemsize follows numpy") {
  const std::array<std::size_t, 10> expected{1, 1, 2, 2, 4, 4, 8, 8, 4, 8};
  for (std::size_t i = 0; i < kAllDTypes.size(); ++i) {
    CHECK(vsr::itemsize(kAllDTypes[i]) == expected[i]);
  }
  CHECK_THROWS_AS(vsr::itemsize(static_cast<DType>(10)), std::invalid_argument);
  CHECK_THROWS_AS(vsr::itemsize(static_cast<DType>(255)), std::invalid_argument);
}

TEST_CASE("DType names are numpy's and round trip") {
  const std::array<std::string_view, 10> names{"uint8", "int8",   "uint16", "int16",   "uint32",
                                               "int32", "uint64", "int64",  "float32", "float64"};
  for (std::size_t i = 0; i < kAllDTypes.size(); ++i) {
    CHECK(vsr::to_string(kAllDTypes[i]) == names[i]);
    const auto parsed = vsr::dtype_from_string(names[i]);
    REQUIRE(parsed.has_value());
    CHECK(*parsed == kAllDTypes[i]);
  }
  CHECK(vsr::to_string(static_cast<DType>(42)) == "unknown");
  CHECK_FALSE(vsr::dtype_from_string("").has_value());
  CHECK_FALSE(vsr::dtype_from_string("float").has_value());
  CHECK_FALSE(vsr::dtype_from_string("Float32").has_value());
  CHECK_FALSE(vsr::dtype_from_string("float32 ").has_value());
  CHECK_FALSE(vsr::dtype_from_string("unknown").has_value());
}

TEST_CASE("TilingStrategy names") {
  CHECK(vsr::to_string(vsr::TilingStrategy::whole) == "whole");
  CHECK(vsr::to_string(vsr::TilingStrategy::band_batches) == "band_batches");
  CHECK(vsr::to_string(vsr::TilingStrategy::tiled) == "tiled");
  CHECK(vsr::to_string(static_cast<vsr::TilingStrategy>(7)) == "unknown");
}

TEST_CASE("Affine defaults and rasterio order") {
  const vsr::Affine identity;
  CHECK(identity.a == 1);
  CHECK(identity.b == 0);
  CHECK(identity.c == 0);
  CHECK(identity.d == 0);
  CHECK(identity.e == -1);
  CHECK(identity.f == 0);

  // x = a*col + b*row + c ; y = d*col + e*row + f
  const vsr::Affine t{2, 3, 100, 5, -7, 200};
  const auto p = t.apply(10, 20);
  CHECK(p[0] == doctest::Approx(2 * 10 + 3 * 20 + 100));
  CHECK(p[1] == doctest::Approx(5 * 10 - 7 * 20 + 200));
}

TEST_CASE("a window's affine starts at its first pixel") {
  const vsr::Affine t{10, 0.5, 1000, -0.25, -10, 5000};
  const vsr::Affine w = t.shifted(7, 3);
  CHECK(w.a == t.a);
  CHECK(w.b == t.b);
  CHECK(w.d == t.d);
  CHECK(w.e == t.e);
  // The window's pixel (0, 0) is the raster's pixel (7, 3), and (2, 5) is (9, 8).
  CHECK(w.apply(0, 0) == t.apply(7, 3));
  CHECK(w.apply(2, 5) == t.apply(9, 8));
  CHECK(t.shifted(0, 0) == t);
}

TEST_CASE("is_floating_point: float32 and float64 only") {
  for (const DType d : {DType::uint8, DType::int8, DType::uint16, DType::int16, DType::uint32,
                        DType::int32, DType::uint64, DType::int64}) {
    CHECK_FALSE(vsr::is_floating_point(d));
  }
  CHECK(vsr::is_floating_point(DType::float32));
  CHECK(vsr::is_floating_point(DType::float64));
  CHECK_FALSE(vsr::is_floating_point(static_cast<DType>(99)));
}

TEST_CASE("Affine GDAL geotransform round trip") {
  // GDAL order: origin x, pixel width, row rotation, origin y, column rotation, pixel height.
  const std::array<double, 6> gt{440720.0, 60.0, 0.5, 3751320.0, -0.25, -60.0};
  const vsr::Affine t = vsr::Affine::from_gdal(gt);
  CHECK(t.c == 440720.0);
  CHECK(t.a == 60.0);
  CHECK(t.b == 0.5);
  CHECK(t.f == 3751320.0);
  CHECK(t.d == -0.25);
  CHECK(t.e == -60.0);
  CHECK(t.to_gdal() == gt);
  CHECK(vsr::Affine::from_gdal(t.to_gdal()) == t);
  // Same world point from both conventions: GDAL Xgeo = gt0 + col*gt1 + row*gt2.
  const auto p = t.apply(3, 4);
  CHECK(p[0] == doctest::Approx(gt[0] + 3 * gt[1] + 4 * gt[2]));
  CHECK(p[1] == doctest::Approx(gt[3] + 3 * gt[4] + 4 * gt[5]));
}

TEST_CASE("RasterMetadata defaults, pixel_count and bounds") {
  vsr::RasterMetadata meta;
  CHECK(meta.height == 0);
  CHECK(meta.width == 0);
  CHECK(meta.band_count == 1);
  CHECK(meta.dtype == DType::float32);
  CHECK_FALSE(meta.nodata.has_value());
  CHECK(meta.crs.empty());
  CHECK(meta.driver.empty());

  meta.height = 100;
  meta.width = 200;
  CHECK(meta.pixel_count() == 20000);

  SUBCASE("north-up") {
    meta.affine = vsr::Affine{10, 0, 1000, 0, -10, 5000};
    const vsr::RasterBounds b = meta.bounds();
    CHECK(b.left == 1000);
    CHECK(b.right == 1000 + 200 * 10);
    CHECK(b.top == 5000);
    CHECK(b.bottom == 5000 - 100 * 10);
  }
  SUBCASE("south-up and mirrored: still ordered") {
    meta.affine = vsr::Affine{-2, 0, 0, 0, 3, 0};
    const vsr::RasterBounds b = meta.bounds();
    CHECK(b == vsr::RasterBounds{-400, 0, 0, 300});
  }
  SUBCASE("rotation: min/max over the four corners") {
    // 90 degree rotation: x = -row, y = col.
    meta.affine = vsr::Affine{0, -1, 0, 1, 0, 0};
    const vsr::RasterBounds b = meta.bounds();
    CHECK(b == vsr::RasterBounds{-100, 0, 0, 200});
  }
  SUBCASE("shear and rotation, corners computed by hand") {
    meta.height = 2;
    meta.width = 4;
    meta.affine = vsr::Affine{1, 0.5, 10, -0.5, -1, 20};
    // corners (col,row): (0,0)->(10,20) (4,0)->(14,18) (0,2)->(11,18) (4,2)->(15,16)
    const vsr::RasterBounds b = meta.bounds();
    CHECK(b.left == doctest::Approx(10));
    CHECK(b.right == doctest::Approx(15));
    CHECK(b.bottom == doctest::Approx(16));
    CHECK(b.top == doctest::Approx(20));
  }
}

TEST_CASE("pixel_count overflow throws") {
  vsr::RasterMetadata meta;
  meta.height = std::int64_t{1} << 40;
  meta.width = std::int64_t{1} << 40;
  CHECK_THROWS_AS(meta.pixel_count(), std::overflow_error);
  meta.width = 1 << 20;
  CHECK(meta.pixel_count() == std::int64_t{1} << 60);
}

TEST_CASE("RasterPlan defaults") {
  const vsr::RasterPlan plan;
  CHECK(plan.strategy == vsr::TilingStrategy::whole);
  CHECK_FALSE(plan.tile_shape.has_value());
  CHECK(plan.halo == 0);
  CHECK(plan.n_tiles == 0);
  CHECK(plan.estimated_vram_per_tile == 0);
  CHECK(plan.bands_per_pass == 1);
  CHECK(plan.fits_budget);
}

TEST_CASE("NodataValue holds every double and every 64-bit integer exactly") {
  constexpr std::int64_t imax = std::numeric_limits<std::int64_t>::max();
  constexpr std::int64_t imin = std::numeric_limits<std::int64_t>::min();
  constexpr std::uint64_t umax = std::numeric_limits<std::uint64_t>::max();
  // Integers a double cannot hold stay exact.
  const NodataValue a = NodataValue::from_int64(imax);
  CHECK(a.as_int64() == std::optional<std::int64_t>(imax));
  CHECK(a.as_uint64() == std::optional<std::uint64_t>(static_cast<std::uint64_t>(imax)));
  CHECK(a.to_double() == 0x1p63);
  CHECK(a.to_string() == "9223372036854775807");
  const NodataValue u = NodataValue::from_uint64(umax);
  CHECK(u.as_uint64() == std::optional<std::uint64_t>(umax));
  CHECK_FALSE(u.as_int64().has_value());
  CHECK(u.to_string() == "18446744073709551615");
  CHECK(NodataValue::from_uint64((1ULL << 53) + 1).as_int64() ==
        std::optional<std::int64_t>((1LL << 53) + 1));
  // Neighbours differ although their doubles are equal.
  CHECK_FALSE(a == NodataValue::from_int64(imax - 1));
  CHECK(a.to_double() == NodataValue::from_int64(imax - 1).to_double());
  CHECK_FALSE(a == NodataValue(0x1p63));
  CHECK_FALSE(u == NodataValue::from_uint64(umax - 1));
  // Canonical: an integer a double holds equals that double, whatever it came from.
  CHECK(NodataValue::from_int64(imin) == NodataValue(-0x1p63));
  CHECK(NodataValue::from_int64(imin).as_int64() == std::optional<std::int64_t>(imin));
  CHECK(NodataValue::from_int64(-9999) == NodataValue(-9999.0));
  CHECK(NodataValue::from_uint64(static_cast<std::uint64_t>(imax)) == a);
  CHECK(NodataValue::from_int64(-9999).to_string() == "-9999");
  // Doubles.
  const NodataValue nan(std::numeric_limits<double>::quiet_NaN());
  CHECK(nan.is_nan());
  CHECK(nan == NodataValue(std::numeric_limits<double>::quiet_NaN()));
  CHECK(nan.to_string() == "nan");
  CHECK_FALSE(nan.as_int64().has_value());
  CHECK(NodataValue(0.1).to_string() == "0.1");
  CHECK(NodataValue(-1e300).to_string() == "-1e+300");
  CHECK(NodataValue(-0.5).as_int64() == std::nullopt);
  CHECK(NodataValue(-1.0).as_uint64() == std::nullopt);
  CHECK(NodataValue(std::numeric_limits<double>::infinity()).to_string() == "inf");
  CHECK(NodataValue(1e20).as_uint64() == std::nullopt);
}
