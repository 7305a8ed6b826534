// SPDX-License-Identifier: Apache-2.0
// Plain reference loops for the band operations and the data they run on, shared by the host
// test (tests/ops/test_ops.cpp) and the GPU test (tests/ops/gpu/test_ops_gpu.cpp): the cases in
// reference_cases.cpp check every op against these loops wherever the binary runs the ops.
#pragma once

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/ops.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

namespace vsr_ops_test {

using namespace vibespatial::raster;

/// Where the binary runs the ops: each one defines it (test-ops: on the host, as given;
/// test-ops-gpu: a device copy). Every input of reference_cases.cpp goes through it.
OwnedRasterArray where_ops_run(OwnedRasterArray host_raster);

/// OwnedRasterArray::from_host, placed where the ops run.
template <class... A>
OwnedRasterArray input(A&&... args) {
  return where_ops_run(OwnedRasterArray::from_host(std::forward<A>(args)...));
}

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

inline long long ref_edge(long long k, long long n, EdgeMode e) {
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
  // numpy 2: the bin dtype is float32 for float32 data, else float64; edges = linspace(lo, hi,
  // bins + 1) computed in float64 and cast to it; range and edges compared in it; the bin is
  // searchsorted(edges, v, 'right') - 1, the last bin closed.
  using E = std::conditional_t<std::is_same_v<T, float>, float, double>;
  std::vector<E> edges(static_cast<std::size_t>(bins) + 1);
  for (int k = 0; k <= bins; ++k)
    edges[static_cast<std::size_t>(k)] = static_cast<E>(k * ((hi - lo) / bins) + lo);
  edges.back() = static_cast<E>(hi);
  for (std::size_t i = first; i < first + n; ++i) {
    if (!ref_valid(d[i], nd)) continue;
    const E v = static_cast<E>(d[i]);
    if (v < static_cast<E>(lo) || v > static_cast<E>(hi)) continue;
    long long b = std::upper_bound(edges.begin(), edges.end(), v) - edges.begin() - 1;
    b = std::min<long long>(b, bins - 1);
    ++h[static_cast<std::size_t>(b)];
  }
  return h;
}

#define ALL_DTYPES                                                                     \
  std::uint8_t, std::int8_t, std::uint16_t, std::int16_t, std::uint32_t, std::int32_t, \
      std::uint64_t, std::int64_t, float, double

}  // namespace vsr_ops_test
