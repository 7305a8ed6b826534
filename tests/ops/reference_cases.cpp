// SPDX-License-Identifier: Apache-2.0
// Every band operation against plain reference loops (reference.hpp), for all ten dtypes, on
// inputs placed by where_ops_run: compiled into test-ops (host backend) and test-ops-gpu (device
// backend), so that both backends are checked against values computed apart from either.
#include "reference.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <vector>

using namespace vsr_ops_test;

namespace {

/// Every multiple of 0.01 on [0, 1] as T (computed two ways: i * 0.01 and i / 100 in T) in 7, 10
/// and 100 bins: the histogram equals the reference loop's edge search.
template <class T>
void check_hundredths_against_edge_search() {
  std::vector<T> grid;
  for (int i = 0; i <= 100; ++i) grid.push_back(static_cast<T>(i * 0.01));
  for (int i = 0; i <= 100; ++i) grid.push_back(static_cast<T>(i) / static_cast<T>(100));
  const auto g = input(grid.data(), dtype_of<T>(), 1, 1, static_cast<std::int64_t>(grid.size()));
  for (const int bins : {7, 10, 100}) {
    CAPTURE(bins);
    CHECK(histogram(g, bins, 0, 1)[0] == ref_hist(grid, 0, grid.size(), std::nullopt, bins, 0, 1));
  }
}

}  // namespace

TEST_SUITE("ops") {
  TEST_CASE_TEMPLATE("statistics match a reference loop", T, ALL_DTYPES) {
    const int bands = 3;
    const long long h = 37, w = 53;
    std::vector<T> d = gen_pixels<T>(static_cast<std::size_t>(bands * h * w), 11);
    // Band 1 is all nodata, band 2 is constant apart from nodata.
    for (long long i = 0; i < h * w; ++i) d[static_cast<std::size_t>(h * w + i)] = T(kNodata);
    long long constant_count = 0;
    for (long long i = 2 * h * w; i < 3 * h * w; ++i) {
      d[static_cast<std::size_t>(i)] = T(i % 13 == 5 ? kNodata : 42);
      constant_count += i % 13 != 5;
    }
    const auto r = input(d.data(), dtype_of<T>(), bands, h, w, kNodata);
    const auto stats = band_statistics(r);
    REQUIRE(stats.size() == 3);
    // Band 0 by reference (long double two-pass).
    long long n = 0;
    long double sum = 0, mn = INFINITY, mx = -INFINITY;
    for (long long i = 0; i < h * w; ++i)
      if (ref_valid(d[static_cast<std::size_t>(i)], kNodata)) {
        const long double v = static_cast<long double>(d[static_cast<std::size_t>(i)]);
        ++n, sum += v, mn = std::min(mn, v), mx = std::max(mx, v);
      }
    const long double mean = sum / n;
    long double ss = 0;
    for (long long i = 0; i < h * w; ++i)
      if (ref_valid(d[static_cast<std::size_t>(i)], kNodata)) {
        const long double dv = static_cast<long double>(d[static_cast<std::size_t>(i)]) - mean;
        ss += dv * dv;
      }
    CHECK(stats[0].count == n);
    CHECK(stats[0].min == static_cast<double>(mn));
    CHECK(stats[0].max == static_cast<double>(mx));
    CHECK(stats[0].mean == doctest::Approx(static_cast<double>(mean))
                               .epsilon(1e-9)
                               .scale(static_cast<double>(mx - mn)));
    CHECK(stats[0].std == doctest::Approx(static_cast<double>(std::sqrt(ss / n))).epsilon(1e-9));
    // All nodata: count 0, NaN statistics.
    CHECK(stats[1].count == 0);
    CHECK(std::isnan(stats[1].min));
    CHECK(std::isnan(stats[1].max));
    CHECK(std::isnan(stats[1].mean));
    CHECK(std::isnan(stats[1].std));
    // Constant: std exactly 0.
    CHECK(stats[2].count == constant_count);
    CHECK(stats[2].min == 42);
    CHECK(stats[2].max == 42);
    CHECK(stats[2].mean == 42);
    CHECK(stats[2].std == 0);
    // A band view gives that band's statistics.
    const auto s2 = band_statistics(r.band(2));
    REQUIRE(s2.size() == 1);
    CHECK(s2[0].count == stats[2].count);
    CHECK(s2[0].mean == stats[2].mean);
  }

  TEST_CASE_TEMPLATE("rescale, clip and fill match reference loops", T, ALL_DTYPES) {
    using C = C_t<T>;
    const int bands = 2;
    const long long h = 19, w = 31;
    const auto d = gen_pixels<T>(static_cast<std::size_t>(bands * h * w), 22);
    const auto r = input(d.data(), dtype_of<T>(), bands, h, w, kNodata);
    const double lo = static_cast<double>(
        std::numeric_limits<T>::is_integer ? std::numeric_limits<T>::lowest() : T(-1e6));
    const double hi =
        static_cast<double>(std::numeric_limits<T>::is_integer
                                ? std::min<double>(std::numeric_limits<T>::max(), 1099511627776.0)
                                : T(1e6));
    SUBCASE("rescale to uint8, int16 and float32") {
      auto check_rescale = [&](auto out_tag, DType out_dtype) {
        using O = decltype(out_tag);
        // Output range 0..254, so that uint8 has a value left for nodata (255).
        const auto out = rescale(r, lo, hi, 0, 254, out_dtype);
        CHECK(out.dtype() == out_dtype);
        CHECK(out.residency() == r.residency());
        const auto got = read<O>(out);
        const C factor = static_cast<C>(254.0 - 0.0) / static_cast<C>(hi - lo);
        // The source's nodata (7) lies inside the output range: the dtype's maximum, or NaN.
        const O fill = std::numeric_limits<O>::is_integer ? std::numeric_limits<O>::max()
                                                          : std::numeric_limits<O>::quiet_NaN();
        REQUIRE(out.nodata().has_value());
        CHECK(same(static_cast<O>(*out.nodata()), fill));
        int bad = 0;
        for (std::size_t i = 0; i < d.size(); ++i) {
          const O want = ref_valid(d[i], kNodata)
                             ? ref_convert<O>((static_cast<C>(d[i]) - static_cast<C>(lo)) * factor +
                                              static_cast<C>(0.0))
                             : fill;
          bad += !same(got[i], want);
        }
        CHECK(bad == 0);
      };
      check_rescale(std::uint8_t{}, DType::uint8);
      check_rescale(std::int16_t{}, DType::int16);
      check_rescale(float{}, DType::float32);
    }
    SUBCASE("clip") {
      const double cl = lo + (hi - lo) * 0.25 + 0.5, cu = lo + (hi - lo) * 0.75 - 0.5;
      const auto out = clip(r, cl, cu);
      CHECK(out.dtype() == dtype_of<T>());
      const auto got = read<T>(out);
      const double rl = std::numeric_limits<T>::is_integer ? std::ceil(cl) : cl;
      const double ru = std::numeric_limits<T>::is_integer ? std::floor(cu) : cu;
      int bad = 0;
      for (std::size_t i = 0; i < d.size(); ++i) {
        T want = d[i];
        if (ref_valid(d[i], kNodata)) {
          const C c = static_cast<C>(d[i]);
          if (c < static_cast<C>(rl))
            want = static_cast<T>(rl);
          else if (c > static_cast<C>(ru))
            want = static_cast<T>(ru);
        }
        bad += !same(got[i], want);
      }
      CHECK(bad == 0);
      CHECK_THROWS_AS(clip(r, 5, 4), std::invalid_argument);
      CHECK_THROWS_AS(clip(r, NAN, 4), std::invalid_argument);
    }
    SUBCASE("fill_nodata") {
      const auto out = fill_nodata(r, 3);
      CHECK_FALSE(out.nodata().has_value());
      const auto got = read<T>(out);
      int bad = 0;
      for (std::size_t i = 0; i < d.size(); ++i)
        bad += !same(got[i], ref_valid(d[i], kNodata) ? d[i] : T(3));
      CHECK(bad == 0);
      CHECK_THROWS_AS(fill_nodata(r, NAN), std::invalid_argument);
      if constexpr (std::numeric_limits<T>::is_integer) {
        CHECK_THROWS_AS(fill_nodata(r, 0.5), std::invalid_argument);
        CHECK_THROWS_AS(fill_nodata(r, 1e30), std::invalid_argument);
      }
    }
  }

  TEST_CASE_TEMPLATE("normalized difference matches a reference loop", T, ALL_DTYPES) {
    using C = C_t<T>;
    const long long h = 23, w = 29;
    const auto da = gen_pixels<T>(static_cast<std::size_t>(2 * h * w), 33);
    auto db = gen_pixels<T>(static_cast<std::size_t>(2 * h * w), 44);
    db[10] = da[10];                                                      // a - b == 0
    if constexpr (std::is_signed_v<T>) db[12] = static_cast<T>(-da[12]);  // a + b == 0
    const auto a = input(da.data(), dtype_of<T>(), 2, h, w, kNodata);
    const auto b = input(db.data(), dtype_of<T>(), 2, h, w);  // no nodata
    const auto out = normalized_difference(a, b);
    CHECK(out.dtype() == compute_dtype(dtype_of<T>()));
    REQUIRE(out.nodata().has_value());
    CHECK(std::isnan(*out.nodata()));
    const auto got = read<C>(out);
    int bad = 0;
    for (std::size_t i = 0; i < da.size(); ++i) {
      C want = std::numeric_limits<C>::quiet_NaN();
      if (ref_valid(da[i], kNodata) && ref_valid(db[i], std::nullopt)) {
        const C ca = static_cast<C>(da[i]), cb = static_cast<C>(db[i]);
        if (ca + cb != C(0)) want = (ca - cb) / (ca + cb);
      }
      bad += !same(got[i], want);
    }
    CHECK(bad == 0);
    const auto other = input(da.data(), dtype_of<T>(), 1, h, w);
    CHECK_THROWS_AS(normalized_difference(a, other), std::invalid_argument);
  }

  TEST_CASE_TEMPLATE("histograms match a reference loop", T, ALL_DTYPES) {
    const int bands = 2;
    const long long h = 41, w = 47;
    const auto d = gen_pixels<T>(static_cast<std::size_t>(bands * h * w), 55);
    const auto r = input(d.data(), dtype_of<T>(), bands, h, w, kNodata);
    const std::size_t hw = static_cast<std::size_t>(h * w);
    for (const auto& [bins, lo, hi] :
         {std::tuple{16, -1000.0, 1000.0}, std::tuple{7, 0.0, 100.0}, std::tuple{1, -1e12, 1e12}}) {
      const auto hist = histogram(r, bins, lo, hi);
      REQUIRE(hist.size() == 2);
      for (int b = 0; b < bands; ++b)
        CHECK(hist[static_cast<std::size_t>(b)] == ref_hist(d, b * hw, hw, kNodata, bins, lo, hi));
    }
    CHECK_THROWS_AS(histogram(r, 0, 0, 1), std::invalid_argument);
    CHECK_THROWS_AS(histogram(r, 4, 1, 1), std::invalid_argument);
    CHECK_THROWS_AS(histogram(r, 4, 0, INFINITY), std::invalid_argument);
  }

  TEST_CASE("rescale's nodata never takes a valid output value") {
    // A Byte raster with nodata 0 rescaled to 0..1: its valid minimum maps to 0.0, so the old
    // choice (the source's nodata, 0) called it nodata.
    std::vector<std::uint8_t> v{0, 10, 20, 30, 0, 40};
    const auto r = input(v.data(), DType::uint8, 1, 2, 3, 0.0);
    const auto f = rescale(r, 10, 40, 0, 1, DType::float32);
    REQUIRE(f.nodata().has_value());
    CHECK(std::isnan(*f.nodata()));
    const auto fv = read<float>(f);
    CHECK(std::isnan(fv[0]));
    CHECK(fv[1] == 0.0F);  // the valid minimum is a valid 0
    CHECK(fv[5] == 1.0F);
    // Integer outputs: the source's nodata if it lies outside the output range, else the
    // dtype's largest value, else its smallest; none left: an error.
    const auto u = rescale(r, 10, 40, 0, 100, DType::uint8);
    CHECK(u.nodata() == std::optional<double>(255));
    CHECK(read<std::uint8_t>(u) == std::vector<std::uint8_t>{255, 0, 33, 67, 255, 100});
    const auto kept = rescale(r, 10, 40, 1, 100, DType::uint8);
    CHECK(kept.nodata() == std::optional<double>(0));
    const auto low = rescale(r, 10, 40, 100, 255, DType::uint8);
    CHECK(low.nodata() == std::optional<double>(0));
    const auto s = rescale(r, 10, 40, -128, 126, DType::int8);
    CHECK(s.nodata() == std::optional<double>(127));
    const auto big = rescale(r, 10, 40, 0, 1000, DType::int64);
    REQUIRE(big.nodata().has_value());
    CHECK(*big.nodata() > 1000);
    CHECK(read<std::int64_t>(big)[0] == static_cast<std::int64_t>(*big.nodata()));
    CHECK_THROWS_WITH_AS(rescale(r, 10, 40, 0, 255, DType::uint8),
                         doctest::Contains("none is left for the nodata"), std::invalid_argument);
    // A NaN nodata to an integer output gets a value too (it wrote valid zeros before).
    std::vector<float> g{1, NAN, 3};
    const auto rn =
        input(g.data(), DType::float32, 1, 1, 3, std::numeric_limits<double>::quiet_NaN());
    const auto un = rescale(rn, 1, 3, 0, 200, DType::uint8);
    CHECK(un.nodata() == std::optional<double>(255));
    CHECK(read<std::uint8_t>(un) == std::vector<std::uint8_t>{0, 255, 200});
    // Every valid output differs from the nodata, for each rule above.
    for (const auto& [out, valid] : {std::pair{u, 4}, std::pair{kept, 4}, std::pair{low, 4},
                                     std::pair{s, 4}, std::pair{un, 2}}) {
      CHECK(band_statistics(out)[0].count == valid);
    }
  }

  TEST_CASE("64-bit integer nodata at the type's limits marks exactly its pixels") {
    constexpr std::int64_t imax = std::numeric_limits<std::int64_t>::max();
    constexpr std::uint64_t umax = std::numeric_limits<std::uint64_t>::max();
    // INT64_MAX - 1 and UINT64_MAX - 1 share the sentinel's double but are valid pixels.
    std::vector<std::int64_t> i{imax, 5, imax - 1, -7, imax, 0};
    const auto ri =
        input(i.data(), DType::int64, 1, 2, 3).with_nodata(NodataValue::from_int64(imax));
    const BandStatistics si = band_statistics(ri)[0];
    CHECK(si.count == 4);
    CHECK(si.max == static_cast<double>(imax - 1));
    CHECK(si.min == -7);
    CHECK(histogram(ri, 2, -10, 10)[0] == std::vector<std::int64_t>{1, 2});
    const auto ci = clip(ri, -1, 100);
    CHECK(ci.exact_nodata() == ri.exact_nodata());
    CHECK(read<std::int64_t>(ci) == std::vector<std::int64_t>{imax, 5, 100, -1, imax, 0});
    CHECK(read<std::int64_t>(fill_nodata(ri, 9)) ==
          std::vector<std::int64_t>{9, 5, imax - 1, -7, 9, 0});
    std::vector<std::uint64_t> u{umax, 1, umax - 1, umax};
    const auto ru =
        input(u.data(), DType::uint64, 1, 2, 2).with_nodata(NodataValue::from_uint64(umax));
    CHECK(band_statistics(ru)[0].count == 2);
    CHECK(read<double>(focal_mean_3x3(ru))[0] != read<double>(focal_mean_3x3(ru))[0]);  // NaN
  }

  TEST_CASE("histogram values on bin edges go where numpy.histogram puts them") {
    // numpy.histogram([0.3, 0.6, 0.7, 0.1, 0.2, 0.5, 0.9, 1.0, 0.0], 10, (0, 1)) counts
    // [1, 1, 2, 0, 0, 2, 1, 0, 0, 2]: 0.3, 0.6 and 0.7 lie below linspace's edges
    // 0.30000000000000004, 0.6000000000000001 and 0.7000000000000001.
    const std::vector<double> v{0.3, 0.6, 0.7, 0.1, 0.2, 0.5, 0.9, 1.0, 0.0};
    const auto r = input(v.data(), DType::float64, 1, 1, 9);
    CHECK(histogram(r, 10, 0, 1)[0] == std::vector<std::int64_t>{1, 1, 2, 0, 0, 2, 1, 0, 0, 2});
    CHECK(histogram(r, 10, 0, 1)[0] == ref_hist(v, 0, v.size(), std::nullopt, 10, 0, 1));
    check_hundredths_against_edge_search<double>();
  }

  TEST_CASE("float32 histograms: numpy's float32 edges, values compared in float32") {
    // numpy.histogram(numpy.float32([0.3, 0.6, 0.7, 0.1, 0.2, 0.4, 0.5, 0.8, 0.9, 1.0, 0.0]),
    // 10, (0, 1)) counts one value per bin and two in the last: numpy's edges are float32 there
    // (0.7f is edge 7 itself); float64 edges put 0.7f (0.69999998...) in bin 6, no value in bin 7.
    const std::vector<float> v{0.3f, 0.6f, 0.7f, 0.1f, 0.2f, 0.4f, 0.5f, 0.8f, 0.9f, 1.0f, 0.0f};
    const auto r = input(v.data(), DType::float32, 1, 1, 11);
    CHECK(histogram(r, 10, 0, 1)[0] == std::vector<std::int64_t>{1, 1, 1, 1, 1, 1, 1, 1, 1, 2});
    CHECK(histogram(r, 10, 0, 1)[0] == ref_hist(v, 0, v.size(), std::nullopt, 10, 0, 1));
    // The range is compared in float32 too (numpy: [1, 0, 0] and [0, 0, 1]): 0.1f lies below
    // the double 0.1000000015 but equals it as float32; 0.5f lies above 0.49999999, not float32.
    const std::vector<float> lo{0.1f}, hi{0.5f};
    CHECK(histogram(input(lo.data(), DType::float32, 1, 1, 1), 3, 0.1000000015, 0.5)[0] ==
          std::vector<std::int64_t>{1, 0, 0});
    CHECK(histogram(input(hi.data(), DType::float32, 1, 1, 1), 3, 0.1, 0.49999999)[0] ==
          std::vector<std::int64_t>{0, 0, 1});
    check_hundredths_against_edge_search<float>();
  }

  TEST_CASE_TEMPLATE("histograms of several bands, 256 and 65536 bins, values on the edges", T,
                     ALL_DTYPES) {
    // Band 0 random; band 1 the edges of the case's bins that T holds (as many as fit, and the
    // last one, upper, which goes to the last bin); band 2 only nodata (7, itself on an edge)
    // and NaN but for up to three valid pixels. Each band against the reference's edge search;
    // band 2 counts only its valid pixels.
    const std::int64_t h = 40, w = 52;
    const auto hw = static_cast<std::size_t>(h * w);
    for (const auto& [bins, lo, hi] : {std::tuple{256, 0.0, 256.0}, std::tuple{256, -1.0, 1.0},
                                       std::tuple{65536, -32768.0, 32768.0}}) {
      CAPTURE(bins);
      CAPTURE(lo);
      std::vector<T> d = gen_pixels<T>(3 * hw, 91);
      const auto holds = [](double x) {  // x is a value of T (checked before any conversion)
        if constexpr (std::is_floating_point_v<T>) {
          return static_cast<double>(static_cast<T>(x)) == x;
        } else {
          return x >= static_cast<double>(std::numeric_limits<T>::lowest()) &&
                 x <= static_cast<double>(std::numeric_limits<T>::max()) && x == std::floor(x);
        }
      };
      const double step = (hi - lo) / bins;
      std::size_t on_edges = 0;
      for (int k = 0; k < bins && on_edges + 1 < hw; ++k) {
        const double e = k * step + lo;
        if (holds(e)) d[hw + on_edges++] = static_cast<T>(e);
      }
      if (holds(hi)) d[2 * hw - 1] = static_cast<T>(hi);  // the last edge, always
      for (std::size_t i = 0; i < hw; ++i) {
        const bool nan = std::is_floating_point_v<T> && i % 2 == 1;
        d[2 * hw + i] = nan ? std::numeric_limits<T>::quiet_NaN() : static_cast<T>(kNodata);
      }
      std::int64_t valid = 0;
      for (const double v : {lo, hi, 0.0, 1.0, 100.0}) {
        if (holds(v) && v >= lo && v <= hi && v != kNodata && valid < 3)
          d[2 * hw + 10 + static_cast<std::size_t>(valid++)] = static_cast<T>(v);
      }
      const auto r = input(d.data(), dtype_of<T>(), 3, h, w, kNodata);
      const auto hist = histogram(r, bins, lo, hi);
      REQUIRE(hist.size() == 3);
      for (std::size_t b = 0; b < 3; ++b) {
        CAPTURE(b);
        CHECK(hist[b] == ref_hist(d, b * hw, hw, kNodata, bins, lo, hi));
      }
      std::int64_t band2 = 0;
      for (const std::int64_t c : hist[2]) band2 += c;
      CHECK(band2 == valid);
      if (holds(hi)) CHECK(hist[1].back() >= 1);  // upper, in the last bin
      if (holds(lo)) CHECK(hist[1].front() >= 1);
    }
  }

  TEST_CASE("histograms of narrow and signed types (CUB's known miscounts)") {
    // int8 over its full range, one pixel per value: negative samples must be counted.
    std::vector<std::int8_t> s(256);
    for (int i = 0; i < 256; ++i)
      s[static_cast<std::size_t>(i)] = static_cast<std::int8_t>(i - 128);
    const auto ri = input(s.data(), DType::int8, 1, 16, 16);
    const auto hi = histogram(ri, 256, -128, 128);
    CHECK(hi[0] == std::vector<std::int64_t>(256, 1));
    // Max value in the last bin: [-128, 127] in 255 bins.
    const auto hl = histogram(ri, 255, -128, 127);
    CHECK(hl[0][254] == 2);  // 126 and 127
    CHECK(hl[0][0] == 1);
    // uint8 full range: not everything in bin 0.
    std::vector<std::uint8_t> u(512);
    for (int i = 0; i < 512; ++i)
      u[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(i % 256);
    const auto ru = input(u.data(), DType::uint8, 2, 16, 16);
    const auto hu = histogram(ru, 256, 0, 256);
    CHECK(hu[0] == std::vector<std::int64_t>(256, 1));
    CHECK(hu[1] == std::vector<std::int64_t>(256, 1));
    const auto h4 = histogram(ru, 4, 0, 255);
    CHECK(h4[0] == std::vector<std::int64_t>{64, 64, 64, 64});
    // int16 negatives and uint16 high values.
    std::vector<std::int16_t> s16{-32768, -1, 0, 32767};
    const auto r16 = input(s16.data(), DType::int16, 1, 2, 2);
    CHECK(histogram(r16, 2, -32768, 32767)[0] == std::vector<std::int64_t>{2, 2});
  }

  TEST_CASE_TEMPLATE("focal mean matches a reference loop in every edge mode", T, ALL_DTYPES) {
    using C = C_t<T>;
    for (const auto& [h, w] : {std::pair{17LL, 13LL}, std::pair{1LL, 9LL}, std::pair{6LL, 1LL},
                               std::pair{1LL, 1LL}, std::pair{2LL, 2LL}}) {
      const auto d = gen_pixels<T>(static_cast<std::size_t>(2 * h * w), 66);
      const auto r = input(d.data(), dtype_of<T>(), 2, h, w, kNodata);
      for (EdgeMode e : {EdgeMode::nearest, EdgeMode::reflect, EdgeMode::constant_nodata}) {
        CAPTURE(h);
        CAPTURE(w);
        CAPTURE(static_cast<int>(e));
        const auto out = focal_mean_3x3(r, e);
        CHECK(out.dtype() == compute_dtype(dtype_of<T>()));
        const auto got = read<C>(out);
        const auto want = ref_focal(d, 2, h, w, kNodata, e);
        int bad = 0;
        for (std::size_t i = 0; i < got.size(); ++i) bad += !same(got[i], want[i]);
        CHECK(bad == 0);
      }
    }
  }
}
