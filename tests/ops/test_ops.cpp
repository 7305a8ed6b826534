// SPDX-License-Identifier: Apache-2.0
// The band operations on the host backend: the reference-loop cases of reference_cases.cpp on host
// inputs, and the host-only behaviour (tiled dispatch, output-into forms, argument checks).
#include "reference.hpp"

#include <vibespatial/raster/dispatch.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <vector>

using namespace vsr_ops_test;

namespace vsr_ops_test {
OwnedRasterArray where_ops_run(OwnedRasterArray host_raster) {
  return host_raster;
}
}  // namespace vsr_ops_test

TEST_SUITE("ops") {
  TEST_CASE("output-into forms give the output the result's georeferencing") {
    std::vector<float> px{1, 2, 3, 4, 5, 6};
    const Affine a{10, 0, 500, 0, -10, 900};
    const auto r =
        OwnedRasterArray::from_host(px.data(), DType::float32, 1, 2, 3, -1.0, a, "EPSG:3857");
    auto out = OwnedRasterArray::allocate(Residency::host, DType::float32, 1, 2, 3);
    clip_into(r, 0, 4, out);
    CHECK(out.affine() == a);
    CHECK(out.crs() == "EPSG:3857");
    CHECK(out.nodata() == std::optional<double>(-1.0));
    auto scaled = OwnedRasterArray::allocate(Residency::host, DType::float32, 1, 2, 3);
    rescale_into(r, 0, 6, 0, 1, scaled);
    CHECK(scaled.affine() == a);
    CHECK(scaled.crs() == "EPSG:3857");
  }

  TEST_CASE("merge_statistics of two parts equals the statistics of the whole") {
    const auto d = gen_pixels<double>(2 * 37 * 53, 5);
    const auto whole = OwnedRasterArray::from_host(d.data(), DType::float64, 1, 74, 53, kNodata);
    const auto top = OwnedRasterArray::from_host(d.data(), DType::float64, 1, 11, 53, kNodata);
    const auto rest =
        OwnedRasterArray::from_host(d.data() + 11 * 53, DType::float64, 1, 63, 53, kNodata);
    const BandStatistics w = band_statistics(whole)[0];
    const BandStatistics m = merge_statistics(band_statistics(top)[0], band_statistics(rest)[0]);
    CHECK(m.count == w.count);
    CHECK(m.min == w.min);
    CHECK(m.max == w.max);
    CHECK(m.mean == doctest::Approx(w.mean).epsilon(1e-12).scale(w.max - w.min));
    CHECK(m.std == doctest::Approx(w.std).epsilon(1e-12));
    // An empty side (count 0, NaN fields) is ignored; both empty is an empty band's answer.
    BandStatistics empty;
    empty.min = empty.max = empty.mean = empty.std = std::numeric_limits<double>::quiet_NaN();
    const BandStatistics e = merge_statistics(empty, m);
    CHECK(e.count == m.count);
    CHECK(e.mean == m.mean);
    CHECK(e.std == m.std);
    const BandStatistics none = merge_statistics(BandStatistics{}, empty);
    CHECK(none.count == 0);
    CHECK(std::isnan(none.mean));
  }

  TEST_CASE_TEMPLATE("focal mean through dispatch_tiled_halo equals the whole raster", T,
                     std::uint8_t, std::int32_t, float, double) {
    using C = C_t<T>;
    const long long h = 29, w = 34;
    const auto d = gen_pixels<T>(static_cast<std::size_t>(2 * h * w), 77);
    const auto r = OwnedRasterArray::from_host(d.data(), dtype_of<T>(), 2, h, w, kNodata);
    for (EdgeMode e : {EdgeMode::nearest, EdgeMode::reflect, EdgeMode::constant_nodata}) {
      const auto whole = read<C>(focal_mean_3x3(r, e));
      RasterPlan plan;
      plan.strategy = TilingStrategy::tiled;
      plan.tile_shape = std::make_pair(8LL, 7LL);
      plan.halo = 1;
      const BandOp op = [e](const OwnedRasterArray& t) { return focal_mean_3x3(t, e); };
      const auto tiled = read<C>(dispatch_tiled_halo(r, op, plan));
      int bad = 0;
      for (std::size_t i = 0; i < whole.size(); ++i) bad += !same(whole[i], tiled[i]);
      CHECK(bad == 0);
    }
  }

  TEST_CASE_TEMPLATE("output-into forms equal the allocating forms, in place too", T, ALL_DTYPES) {
    const int bands = 2;
    const long long h = 13, w = 21;
    const auto d = gen_pixels<T>(static_cast<std::size_t>(bands * h * w), 88);
    const Affine geo{10, 0, 500000, 0, -10, 4200000};
    const auto r = OwnedRasterArray::from_host(d.data(), dtype_of<T>(), bands, h, w, kNodata, geo,
                                               "EPSG:32633");
    const auto d2 = gen_pixels<T>(d.size(), 99);
    const auto r2 = OwnedRasterArray::from_host(d2.data(), dtype_of<T>(), bands, h, w, kNodata);
    auto bytes = [](const OwnedRasterArray& x) {
      std::vector<unsigned char> b(x.byte_size());
      x.copy_to_host(b.data());
      return b;
    };
    // An output raster with other metadata, reused across every call.
    auto target = [&](DType dt) {
      return OwnedRasterArray::allocate(Residency::host, dt, bands, h, w, 123.0, Affine{}, "junk");
    };
    auto same_result = [&](const OwnedRasterArray& into, const OwnedRasterArray& want) {
      CHECK(bytes(into) == bytes(want));
      CHECK(into.dtype() == want.dtype());
      CHECK(same_nodata(into.nodata(), want.nodata()));
      CHECK(into.affine() == want.affine());
      CHECK(into.crs() == want.crs());
    };
    const double lo = -100, hi = 100;
    for (DType od : {DType::uint8, DType::int16, DType::float32, DType::float64}) {
      auto out = target(od);
      rescale_into(r, lo, hi, 0, 250, out);
      same_result(out, rescale(r, lo, hi, 0, 250, od));
    }
    auto out = target(dtype_of<T>());
    clip_into(r, 3, 90, out);
    same_result(out, clip(r, 3, 90));
    fill_nodata_into(r, 1, out);
    same_result(out, fill_nodata(r, 1));
    auto outc = target(compute_dtype(dtype_of<T>()));
    normalized_difference_into(r, r2, outc);
    same_result(outc, normalized_difference(r, r2));
    for (EdgeMode e : {EdgeMode::nearest, EdgeMode::reflect, EdgeMode::constant_nodata}) {
      focal_mean_3x3_into(r, e, outc);
      same_result(outc, focal_mean_3x3(r, e));
    }
    // In place: the elementwise forms may write over their input.
    {
      auto copy = OwnedRasterArray::from_host(d.data(), dtype_of<T>(), bands, h, w, kNodata);
      clip_into(copy, 3, 90, copy);
      CHECK(bytes(copy) == bytes(clip(r, 3, 90)));
      auto view = copy.band(1);  // another handle of the same pixels
      fill_nodata_into(copy.band(1), 1, view);
      CHECK(bytes(view) == bytes(fill_nodata(clip(r, 3, 90), 1).band(1)));
      const auto state = bytes(copy);
      const auto snapshot =
          OwnedRasterArray::from_host(state.data(), dtype_of<T>(), bands, h, w, kNodata);
      rescale_into(copy, lo, hi, 0, 1, copy);
      CHECK(bytes(copy) == bytes(rescale(snapshot, lo, hi, 0, 1, dtype_of<T>())));
    }
    // Bad targets change nothing.
    auto wrong_dtype = target(dtype_of<T>() == DType::uint8 ? DType::int8 : DType::uint8);
    const auto before = bytes(wrong_dtype);
    CHECK_THROWS_AS(clip_into(r, 3, 90, wrong_dtype), std::invalid_argument);
    CHECK_THROWS_AS(fill_nodata_into(r, 1, wrong_dtype), std::invalid_argument);
    CHECK(bytes(wrong_dtype) == before);
    CHECK(wrong_dtype.crs() == "junk");
    auto wrong_shape = OwnedRasterArray::allocate(Residency::host, dtype_of<T>(), bands, h, w + 1);
    CHECK_THROWS_AS(clip_into(r, 3, 90, wrong_shape), std::invalid_argument);
    auto one_band = OwnedRasterArray::allocate(Residency::host, dtype_of<T>(), 1, h, w);
    CHECK_THROWS_AS(clip_into(r, 3, 90, one_band), std::invalid_argument);
    auto wrong_compute =
        target(compute_dtype(dtype_of<T>()) == DType::float32 ? DType::float64 : DType::float32);
    CHECK_THROWS_AS(normalized_difference_into(r, r2, wrong_compute), std::invalid_argument);
    CHECK_THROWS_AS(focal_mean_3x3_into(r, EdgeMode::nearest, wrong_compute),
                    std::invalid_argument);
    CHECK_THROWS_AS(rescale_into(r, 1, 1, 0, 1, out), std::invalid_argument);
  }

  TEST_CASE("output-into forms: values in place, focal overlap, residency") {
    std::vector<float> v{1, 2, NAN, 4, 5, 6};
    auto r = OwnedRasterArray::from_host(v.data(), DType::float32, 1, 2, 3);
    rescale_into(r, 0, 4, 0, 100, r);  // float32 -> float32 in place
    const auto got = read<float>(r);
    CHECK(got[0] == 25);
    CHECK(got[3] == 100);
    CHECK(std::isnan(got[2]));
    CHECK(r.nodata() == std::nullopt);
    // The focal mean reads neighbours: in place would read its own output.
    CHECK_THROWS_WITH_AS(focal_mean_3x3_into(r, EdgeMode::nearest, r),
                         doctest::Contains("overlaps"), std::invalid_argument);
    auto view = r.band(0);
    CHECK_THROWS_AS(focal_mean_3x3_into(r, EdgeMode::nearest, view), std::invalid_argument);
    // normalized_difference_into may write over either input.
    std::vector<float> a{3, 1, 2, 2, 0, 5}, b{1, 1, 2, 0, 0, 5};
    auto ra = OwnedRasterArray::from_host(a.data(), DType::float32, 1, 2, 3);
    const auto rb = OwnedRasterArray::from_host(b.data(), DType::float32, 1, 2, 3);
    normalized_difference_into(ra, rb, ra);
    const auto nd = read<float>(ra);
    CHECK(nd[0] == 0.5f);
    CHECK(nd[1] == 0.0f);
    CHECK(nd[3] == 1.0f);
    CHECK(std::isnan(nd[4]));  // a + b == 0
    CHECK(ra.nodata().has_value());
    CHECK(std::isnan(*ra.nodata()));
    // Another residency is rejected (the emulator's device).
    auto dev = OwnedRasterArray::allocate(Residency::device, DType::float32, 1, 2, 3);
    CHECK_THROWS_WITH_AS(clip_into(rb, 0, 1, dev), doctest::Contains("residency"),
                         std::invalid_argument);
  }

  TEST_CASE("compute types, bad arguments and residency") {
    CHECK(compute_dtype(DType::uint8) == DType::float32);
    CHECK(compute_dtype(DType::int16) == DType::float32);
    CHECK(compute_dtype(DType::float32) == DType::float32);
    CHECK(compute_dtype(DType::uint32) == DType::float64);
    CHECK(compute_dtype(DType::int64) == DType::float64);
    CHECK(compute_dtype(DType::float64) == DType::float64);
    CHECK_THROWS_AS(compute_dtype(static_cast<DType>(99)), std::invalid_argument);
    std::vector<float> v{1, 2, NAN, 4};
    const auto r = OwnedRasterArray::from_host(v.data(), DType::float32, 1, 2, 2);
    CHECK_THROWS_AS(rescale(r, 1, 1, 0, 1, DType::uint8), std::invalid_argument);
    CHECK_THROWS_AS(rescale(r, 0, INFINITY, 0, 1, DType::uint8), std::invalid_argument);
    CHECK_THROWS_AS(rescale(r, 0, 1, 0, 1, static_cast<DType>(42)), std::invalid_argument);
    CHECK_THROWS_AS(focal_mean_3x3(r, static_cast<EdgeMode>(9)), std::invalid_argument);
    // NaN pixels without nodata: rescale to an integer writes 0 and sets no nodata; to a float
    // it writes NaN.
    const auto ru = rescale(r, 0, 4, 0, 100, DType::uint8);
    CHECK_FALSE(ru.nodata().has_value());
    CHECK(read<std::uint8_t>(ru) == std::vector<std::uint8_t>{25, 50, 0, 100});
    const auto rf = read<double>(rescale(r, 0, 4, 0, 100, DType::float64));
    CHECK(std::isnan(rf[2]));
    CHECK(rf[3] == 100);
    // Saturation and rounding half away from zero.
    std::vector<double> s{-1.5, 2.5, 300, -300};
    const auto rs = OwnedRasterArray::from_host(s.data(), DType::float64, 1, 2, 2);
    CHECK(read<std::uint8_t>(rescale(rs, 0, 1, 0, 1, DType::uint8)) ==
          std::vector<std::uint8_t>{0, 3, 255, 0});
    CHECK(read<std::int8_t>(rescale(rs, 0, 1, 0, 1, DType::int8)) ==
          std::vector<std::int8_t>{-2, 3, 127, -128});
    // Ops leave their input untouched and keep metadata.
    CHECK(std::isnan(read<float>(r)[2]));
    // A nodata that is not a value of the dtype marks nothing.
    std::vector<std::uint8_t> b{0, 1, 2, 3};
    const auto rb = OwnedRasterArray::from_host(b.data(), DType::uint8, 1, 2, 2, -9999.0);
    CHECK(band_statistics(rb)[0].count == 4);
    // On the emulator a device raster runs on its emulated device in every build, CUDA or not
    // (a real driver's refusal without CUDA: ops-errors-real-driver).
    auto dev = OwnedRasterArray::from_host(v.data(), DType::float32, 1, 2, 2);
    dev.move_to(Residency::device);  // the emulator's device
    CHECK(band_statistics(dev)[0].count ==
          band_statistics(OwnedRasterArray::from_host(v.data(), DType::float32, 1, 2, 2))[0].count);
  }
}
