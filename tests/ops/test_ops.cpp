// SPDX-License-Identifier: Apache-2.0
// The band operations on the host backend against plain reference loops, for all ten dtypes.
#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/dispatch.hpp>
#include <vibespatial/raster/ops.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <stdexcept>
#include <type_traits>
#include <vector>

using namespace vibespatial::raster;

namespace {

template <class T>
DType dtype_of() {
  if constexpr (std::is_same_v<T, std::uint8_t>) return DType::uint8;
  if constexpr (std::is_same_v<T, std::int8_t>) return DType::int8;
  if constexpr (std::is_same_v<T, std::uint16_t>) return DType::uint16;
  if constexpr (std::is_same_v<T, std::int16_t>) return DType::int16;
  if constexpr (std::is_same_v<T, std::uint32_t>) return DType::uint32;
  if constexpr (std::is_same_v<T, std::int32_t>) return DType::int32;
  if constexpr (std::is_same_v<T, std::uint64_t>) return DType::uint64;
  if constexpr (std::is_same_v<T, std::int64_t>) return DType::int64;
  if constexpr (std::is_same_v<T, float>) return DType::float32;
  if constexpr (std::is_same_v<T, double>) return DType::float64;
}

template <class T>
using C_t = std::conditional_t<(sizeof(T) <= 2) || std::is_same_v<T, float>, float, double>;

constexpr double kNodata = 7;  // a value of every dtype, and frequent in narrow random data

/// Random band-major data: narrow types over their full range, wide ones over +-2^40 (floats
/// over +-1e6); every 13th pixel is the nodata value and, for floats, every 17th is NaN.
template <class T>
std::vector<T> gen_pixels(std::size_t n, unsigned seed, bool with_nan = true) {
  std::mt19937_64 rng(seed);
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    if constexpr (std::is_floating_point_v<T>) {
      v[i] = static_cast<T>(std::uniform_real_distribution<double>(-1e6, 1e6)(rng));
    } else if constexpr (sizeof(T) <= 2) {
      v[i] = static_cast<T>(std::uniform_int_distribution<int>(std::numeric_limits<T>::lowest(),
                                                               std::numeric_limits<T>::max())(rng));
    } else if constexpr (std::is_signed_v<T>) {
      v[i] =
          static_cast<T>(std::uniform_int_distribution<std::int64_t>(-(1LL << 40), 1LL << 40)(rng));
    } else {
      v[i] = static_cast<T>(std::uniform_int_distribution<std::uint64_t>(0, 1ULL << 40)(rng));
    }
    if (i % 13 == 5) v[i] = static_cast<T>(kNodata);
    if constexpr (std::is_floating_point_v<T>) {
      if (with_nan && i % 17 == 3) v[i] = std::numeric_limits<T>::quiet_NaN();
    }
  }
  return v;
}

template <class T>
bool ref_valid(T v, std::optional<double> nd) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(v)) return false;
  }
  return !(nd && static_cast<double>(v) == *nd);
}

template <class T>
std::vector<T> read(const OwnedRasterArray& r) {
  std::vector<T> out(static_cast<std::size_t>(r.band_count() * r.height() * r.width()));
  r.copy_to_host(out.data());
  return out;
}

/// Equal, NaN equal to NaN.
template <class T>
bool same(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  }
  return a == b;
}

template <class O, class C>
O ref_convert(C x) {
  if constexpr (std::is_floating_point_v<O>) {
    return static_cast<O>(x);
  } else {
    if (std::isnan(x)) return 0;
    const C r = std::round(x);
    if (r <= static_cast<C>(std::numeric_limits<O>::lowest()))
      return std::numeric_limits<O>::lowest();
    if (r >= static_cast<C>(std::numeric_limits<O>::max())) return std::numeric_limits<O>::max();
    return static_cast<O>(r);
  }
}

long long ref_edge(long long k, long long n, EdgeMode e) {
  if (k >= 0 && k < n) return k;
  if (e == EdgeMode::nearest) return std::clamp(k, 0LL, n - 1);
  if (e == EdgeMode::reflect) return n == 1 ? 0 : (k < 0 ? 1 : n - 2);
  return -1;
}

template <class T>
std::vector<C_t<T>> ref_focal(const std::vector<T>& d, int bands, long long h, long long w,
                              std::optional<double> nd, EdgeMode e) {
  using C = C_t<T>;
  std::vector<C> out(d.size());
  for (int b = 0; b < bands; ++b)
    for (long long y = 0; y < h; ++y)
      for (long long x = 0; x < w; ++x) {
        const T* band = d.data() + b * h * w;
        C& o = out[static_cast<std::size_t>(b * h * w + y * w + x)];
        if (!ref_valid(band[y * w + x], nd)) {
          o = std::numeric_limits<C>::quiet_NaN();
          continue;
        }
        C sum = 0;
        int cnt = 0;
        for (int dy = -1; dy <= 1; ++dy)
          for (int dx = -1; dx <= 1; ++dx) {
            const long long yy = ref_edge(y + dy, h, e), xx = ref_edge(x + dx, w, e);
            if (yy < 0 || xx < 0) continue;
            const T v = band[yy * w + xx];
            if (!ref_valid(v, nd)) continue;
            sum += static_cast<C>(v);
            ++cnt;
          }
        o = cnt ? sum / static_cast<C>(cnt) : std::numeric_limits<C>::quiet_NaN();
      }
  return out;
}

template <class T>
std::vector<std::int64_t> ref_hist(const std::vector<T>& d, std::size_t first, std::size_t n,
                                   std::optional<double> nd, int bins, double lo, double hi) {
  std::vector<std::int64_t> h(static_cast<std::size_t>(bins), 0);
  for (std::size_t i = first; i < first + n; ++i) {
    if (!ref_valid(d[i], nd)) continue;
    const double v = static_cast<double>(d[i]);
    if (v < lo || v > hi) continue;
    // numpy: edges = linspace(lo, hi, bins + 1); the bin is searchsorted(edges, v, 'right') - 1,
    // the last bin closed.
    std::vector<double> edges(static_cast<std::size_t>(bins) + 1);
    for (int k = 0; k <= bins; ++k)
      edges[static_cast<std::size_t>(k)] = k * ((hi - lo) / bins) + lo;
    edges.back() = hi;
    long long b = std::upper_bound(edges.begin(), edges.end(), v) - edges.begin() - 1;
    b = std::min<long long>(b, bins - 1);
    ++h[static_cast<std::size_t>(b)];
  }
  return h;
}

#define ALL_DTYPES                                                                     \
  std::uint8_t, std::int8_t, std::uint16_t, std::int16_t, std::uint32_t, std::int32_t, \
      std::uint64_t, std::int64_t, float, double

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
    const auto r = OwnedRasterArray::from_host(d.data(), dtype_of<T>(), bands, h, w, kNodata);
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
    const auto r = OwnedRasterArray::from_host(d.data(), dtype_of<T>(), bands, h, w, kNodata);
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
        CHECK(out.residency() == Residency::host);
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
    const auto a = OwnedRasterArray::from_host(da.data(), dtype_of<T>(), 2, h, w, kNodata);
    const auto b = OwnedRasterArray::from_host(db.data(), dtype_of<T>(), 2, h, w);  // no nodata
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
    const auto other = OwnedRasterArray::from_host(da.data(), dtype_of<T>(), 1, h, w);
    CHECK_THROWS_AS(normalized_difference(a, other), std::invalid_argument);
  }

  TEST_CASE_TEMPLATE("histograms match a reference loop", T, ALL_DTYPES) {
    const int bands = 2;
    const long long h = 41, w = 47;
    const auto d = gen_pixels<T>(static_cast<std::size_t>(bands * h * w), 55);
    const auto r = OwnedRasterArray::from_host(d.data(), dtype_of<T>(), bands, h, w, kNodata);
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
    const auto r = OwnedRasterArray::from_host(v.data(), DType::uint8, 1, 2, 3, 0.0);
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
    const auto rn = OwnedRasterArray::from_host(g.data(), DType::float32, 1, 1, 3,
                                                std::numeric_limits<double>::quiet_NaN());
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
    const auto ri = OwnedRasterArray::from_host(i.data(), DType::int64, 1, 2, 3)
                        .with_nodata(NodataValue::from_int64(imax));
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
    const auto ru = OwnedRasterArray::from_host(u.data(), DType::uint64, 1, 2, 2)
                        .with_nodata(NodataValue::from_uint64(umax));
    CHECK(band_statistics(ru)[0].count == 2);
    CHECK(read<double>(focal_mean_3x3(ru))[0] != read<double>(focal_mean_3x3(ru))[0]);  // NaN
  }

  TEST_CASE("histogram values on bin edges go where numpy.histogram puts them") {
    // numpy.histogram([0.3, 0.6, 0.7, 0.1, 0.2, 0.5, 0.9, 1.0, 0.0], 10, (0, 1)) counts
    // [1, 1, 2, 0, 0, 2, 1, 0, 0, 2]: 0.3, 0.6 and 0.7 lie below linspace's edges
    // 0.30000000000000004, 0.6000000000000001 and 0.7000000000000001.
    const std::vector<double> v{0.3, 0.6, 0.7, 0.1, 0.2, 0.5, 0.9, 1.0, 0.0};
    const auto r = OwnedRasterArray::from_host(v.data(), DType::float64, 1, 1, 9);
    CHECK(histogram(r, 10, 0, 1)[0] == std::vector<std::int64_t>{1, 1, 2, 0, 0, 2, 1, 0, 0, 2});
    CHECK(histogram(r, 10, 0, 1)[0] == ref_hist(v, 0, v.size(), std::nullopt, 10, 0, 1));
    // Every multiple of 0.01 on [0, 1] in 7, 10 and 100 bins against the edge search.
    std::vector<double> grid;
    for (int i = 0; i <= 100; ++i) grid.push_back(i * 0.01);
    for (int i = 0; i <= 100; ++i) grid.push_back(i / 100.0);
    const auto g = OwnedRasterArray::from_host(grid.data(), DType::float64, 1, 1,
                                               static_cast<std::int64_t>(grid.size()));
    for (const int bins : {7, 10, 100}) {
      CAPTURE(bins);
      CHECK(histogram(g, bins, 0, 1)[0] ==
            ref_hist(grid, 0, grid.size(), std::nullopt, bins, 0, 1));
    }
  }

  TEST_CASE("histograms of narrow and signed types (CUB's known miscounts)") {
    // int8 over its full range, one pixel per value: negative samples must be counted.
    std::vector<std::int8_t> s(256);
    for (int i = 0; i < 256; ++i)
      s[static_cast<std::size_t>(i)] = static_cast<std::int8_t>(i - 128);
    const auto ri = OwnedRasterArray::from_host(s.data(), DType::int8, 1, 16, 16);
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
    const auto ru = OwnedRasterArray::from_host(u.data(), DType::uint8, 2, 16, 16);
    const auto hu = histogram(ru, 256, 0, 256);
    CHECK(hu[0] == std::vector<std::int64_t>(256, 1));
    CHECK(hu[1] == std::vector<std::int64_t>(256, 1));
    const auto h4 = histogram(ru, 4, 0, 255);
    CHECK(h4[0] == std::vector<std::int64_t>{64, 64, 64, 64});
    // int16 negatives and uint16 high values.
    std::vector<std::int16_t> s16{-32768, -1, 0, 32767};
    const auto r16 = OwnedRasterArray::from_host(s16.data(), DType::int16, 1, 2, 2);
    CHECK(histogram(r16, 2, -32768, 32767)[0] == std::vector<std::int64_t>{2, 2});
  }

  TEST_CASE_TEMPLATE("focal mean matches a reference loop in every edge mode", T, ALL_DTYPES) {
    using C = C_t<T>;
    for (const auto& [h, w] : {std::pair{17LL, 13LL}, std::pair{1LL, 9LL}, std::pair{6LL, 1LL},
                               std::pair{1LL, 1LL}, std::pair{2LL, 2LL}}) {
      const auto d = gen_pixels<T>(static_cast<std::size_t>(2 * h * w), 66);
      const auto r = OwnedRasterArray::from_host(d.data(), dtype_of<T>(), 2, h, w, kNodata);
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
    if (!ops_built_with_cuda()) {
      auto dev = OwnedRasterArray::from_host(v.data(), DType::float32, 1, 2, 2);
      dev.move_to(Residency::device);  // the emulator's device
      CHECK_THROWS_WITH_AS(band_statistics(dev), doctest::Contains("built without CUDA"),
                           std::runtime_error);
      CHECK_THROWS_WITH_AS(focal_mean_3x3(dev), doctest::Contains("built without CUDA"),
                           std::runtime_error);
    }
  }
}
