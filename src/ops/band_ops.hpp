// SPDX-License-Identifier: Apache-2.0
// The band operations, written once as functors, and the Thrust drivers shared by both backends.
// Included only by ops_host.cpp (g++, Thrust OpenMP backend) and ops_cuda.cu (nvcc): every
// template expansion happens in those two translation units. VSR_HD is __host__ __device__ under
// nvcc and empty for the host compiler.
#pragma once

#include "common/dtype_visit.hpp"
#include "ops/ops_backend.hpp"

#include <cuda/std/limits>
#include <cuda/std/type_traits>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/transform.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <type_traits>

#if defined(__CUDACC__)
#define VSR_HD __host__ __device__
#else
#define VSR_HD
#endif

namespace vibespatial::raster::detail::ops {

using detail::visit_dtype;  // the one DType switch (common/dtype_visit.hpp)

/// The compute type of T (see ops.hpp): float for <= 16-bit integers and float, else double.
template <class T>
using compute_t =
    cuda::std::conditional_t<(sizeof(T) <= 2) || cuda::std::is_same_v<T, float>, float, double>;

template <class T>
inline constexpr bool is_float_v = cuda::std::is_floating_point_v<T>;

/// C's round(): to nearest, halves away from zero (roundf/round on host and device alike).
template <class C>
VSR_HD inline C round_of(C x) {
  if constexpr (sizeof(C) == 4) {
    return roundf(x);
  } else {
    return round(x);
  }
}

template <class C>
VSR_HD inline C quiet_nan() {
  return cuda::std::numeric_limits<C>::quiet_NaN();
}

/// C -> O: floats by static_cast; integers rounded half away from zero and saturated (NaN -> 0).
template <class O, class C>
VSR_HD inline O convert_to(C x) {
  if constexpr (is_float_v<O>) {
    return static_cast<O>(x);
  } else {
    if (x != x) return O{0};
    const C r = round_of<C>(x);  // half away from zero
    if (r <= static_cast<C>(cuda::std::numeric_limits<O>::lowest()))
      return cuda::std::numeric_limits<O>::lowest();
    if (r >= static_cast<C>(cuda::std::numeric_limits<O>::max()))
      return cuda::std::numeric_limits<O>::max();
    return static_cast<O>(r);
  }
}

/// Validity test of one pixel of type T against a NodataSpec.
///
/// The elementwise functors are written without branches on a pixel's value (`&` on bools and a
/// final select, not `&&` or an early return): the host build then vectorises their loops
/// (with -fno-trapping-math, which lets it compute a result it may discard); a branchy form ran
/// at a third of memcpy bandwidth. The device build is indifferent.
template <class T>
struct Valid {
  bool has = false;
  T nodata{};  ///< the exact sentinel (the facade checked it is a value of T)
  explicit Valid(NodataSpec spec) : has(spec.has) {
    if constexpr (is_float_v<T>) {
      if (has && spec.value != spec.value) has = false;  // NaN nodata: the NaN test covers it
    }
    if constexpr (std::is_same_v<T, std::int64_t> || std::is_same_v<T, std::uint64_t>) {
      if (has) nodata = static_cast<T>(spec.bits);  // exact: a double cannot hold INT64_MAX
    } else {
      if (has) nodata = static_cast<T>(spec.value);
    }
  }
  VSR_HD bool operator()(T v) const {
    if constexpr (is_float_v<T>) {
      return (v == v) & !(has & (v == nodata));
    } else {
      return !(has & (v == nodata));
    }
  }
};

/// Running statistics in float64 (Chan et al. merge of count, mean and M2).
struct Stats {
  long long n;
  double mean, m2, min, max;
};

VSR_HD inline Stats empty_stats() {
  return Stats{0, 0.0, 0.0, cuda::std::numeric_limits<double>::infinity(),
               -cuda::std::numeric_limits<double>::infinity()};
}

/// Pixel -> Stats (empty for invalid pixels).
template <class T>
struct ToStats {
  Valid<T> valid;
  VSR_HD Stats operator()(T v) const {
    if (!valid(v)) return empty_stats();
    const double d = static_cast<double>(v);
    return Stats{1, d, 0.0, d, d};
  }
};

/// Associative merge of two Stats.
struct MergeStats {
  VSR_HD Stats operator()(const Stats& a, const Stats& b) const {
    if (a.n == 0) return b;
    if (b.n == 0) return a;
    Stats r;
    r.n = a.n + b.n;
    const double na = static_cast<double>(a.n), nb = static_cast<double>(b.n);
    const double nr = static_cast<double>(r.n);
    const double delta = b.mean - a.mean;
    r.mean = a.mean + delta * (nb / nr);
    r.m2 = a.m2 + b.m2 + delta * delta * (na * nb / nr);
    r.min = a.min < b.min ? a.min : b.min;
    r.max = a.max > b.max ? a.max : b.max;
    return r;
  }
};

/// Stats -> BandStatistics (NaN fields for an empty band).
inline BandStatistics finish_stats(const Stats& s) {
  BandStatistics out;
  out.count = s.n;
  if (s.n == 0) {
    out.min = out.max = out.mean = out.std = quiet_nan<double>();
  } else {
    out.min = s.min;
    out.max = s.max;
    out.mean = s.mean;
    out.std = std::sqrt(s.m2 / static_cast<double>(s.n));
  }
  return out;
}

template <class T, class O>
struct RescaleOp {
  using C = compute_t<T>;
  Valid<T> valid;
  C in_min, factor, out_min;
  O fill;
  VSR_HD O operator()(T v) const {
    const O r = convert_to<O>((static_cast<C>(v) - in_min) * factor + out_min);
    return valid(v) ? r : fill;
  }
};

template <class T>
struct ClipOp {
  using C = compute_t<T>;
  Valid<T> valid;
  C lower, upper;      ///< comparison bounds
  T lower_t, upper_t;  ///< the values written
  VSR_HD T operator()(T v) const {
    const C c = static_cast<C>(v);
    const T r = c < lower ? lower_t : (c > upper ? upper_t : v);
    return valid(v) ? r : v;
  }
};

template <class T>
struct FillOp {
  Valid<T> valid;
  T value;
  VSR_HD T operator()(T v) const { return valid(v) ? v : value; }
};

template <class T>
struct NormDiffOp {
  using C = compute_t<T>;
  Valid<T> valid_a, valid_b;
  VSR_HD C operator()(T a, T b) const {
    const C ca = static_cast<C>(a), cb = static_cast<C>(b);
    const C sum = ca + cb;
    const C r = (ca - cb) / sum;  // discarded where sum == 0
    // Bitwise on ints, not && on bools: no branch per pixel (the host loop vectorises).
    const int ok = int{valid_a(a)} & int{valid_b(b)} & int{sum != C(0)};
    return ok ? r : quiet_nan<C>();
  }
};

/// Pixel value -> its bin in [0, bins), or -1 (invalid or out of range), by numpy.histogram's
/// rule: the bin is the i with edge(i) <= v < edge(i + 1) (the last bin also takes upper), where
/// the edges are numpy.linspace(lower, upper, bins + 1) computed in float64 (i * step + lower,
/// the last exactly upper) and held in numpy's bin dtype: float32 for float32 data, float64
/// otherwise. Range and edges are compared with the value in that dtype, as numpy compares them.
/// As numpy: a first guess ((v - lower) / (upper - lower)) * bins, then one step down or up where
/// v falls on the other side of the edges (a guess can be 1 ulp off). The guess keeps numpy's
/// division: where float32 edges coincide (more bins than float32 values in the range) the bin
/// numpy picks depends on its guess, so a precomputed reciprocal could pick another. Both
/// backends count one band at a time with this functor: no per-pixel band index.
template <class T>
struct BinOp {
  /// numpy's bin dtype for T (result_type of the data and the Python float bounds).
  using E = cuda::std::conditional_t<cuda::std::is_same_v<T, float>, float, double>;
  Valid<T> valid;
  int bins;
  double lower, upper, step;
  VSR_HD E edge(int k) const {
    return static_cast<E>(k >= bins ? upper : static_cast<double>(k) * step + lower);
  }
  VSR_HD int operator()(T v) const {
    if (!valid(v)) return -1;
    const E e = static_cast<E>(v);
    const E lo = static_cast<E>(lower);
    if (!(e >= lo) || !(e <= static_cast<E>(upper))) return -1;
    // numpy: (a - first_edge) in the bin dtype, divided by (last_edge - first_edge) in float64.
    // In float32 the rounded bounds can put the guess a little past bins: clamp in 64 bits.
    const long long guess =
        static_cast<long long>((static_cast<double>(e - lo) / (upper - lower)) * bins);
    int b = guess >= bins ? bins - 1 : (guess < 0 ? 0 : static_cast<int>(guess));
    if (e < edge(b)) {
      --b;
    } else if (b != bins - 1 && e >= edge(b + 1)) {
      ++b;
    }
    return b;
  }
};

/// Resolves a neighbour index outside [0, n) for `edge`; returns -1 when it is nodata.
VSR_HD inline long long edge_index(long long k, long long n, EdgeMode edge) {
  if (k >= 0 && k < n) return k;
  switch (edge) {
    case EdgeMode::nearest:
      return k < 0 ? 0 : n - 1;
    case EdgeMode::reflect:
      if (n == 1) return 0;
      return k < 0 ? -k : 2 * (n - 1) - k;  // radius 1: -1 -> 1, n -> n - 2
    default:
      return -1;
  }
}

/// Output pixel i of the 3x3 focal mean (band-major index).
template <class T>
struct FocalMeanOp {
  using C = compute_t<T>;
  Valid<T> valid;
  const T* data;
  long long height, width;
  EdgeMode edge;
  VSR_HD C operator()(long long i) const {
    const long long hw = height * width;
    const long long band = i / hw, p = i - band * hw;
    const long long y = p / width;
    return at(band, y, p - y * width);
  }
  /// The mean of pixel (y, x) of band `band`.
  VSR_HD C at(long long band, long long y, long long x) const {
    const long long p = y * width + x;
    const T* base = data + band * height * width;
    if (y > 0 && y < height - 1 && x > 0 && x < width - 1) return interior(base + p);
    if (!valid(base[p])) return quiet_nan<C>();
    C sum = C(0);
    int count = 0;
    for (int dy = -1; dy <= 1; ++dy) {
      const long long yy = edge_index(y + dy, height, edge);
      if (yy < 0) continue;
      for (int dx = -1; dx <= 1; ++dx) {
        const long long xx = edge_index(x + dx, width, edge);
        if (xx < 0) continue;
        const T v = base[yy * width + xx];
        if (!valid(v)) continue;
        sum += static_cast<C>(v);
        ++count;
      }
    }
    return count == 0 ? quiet_nan<C>() : sum / static_cast<C>(count);
  }
  /// The mean at `c`, a pixel whose eight neighbours are all inside its band: no edge rule
  /// applies.
  VSR_HD C interior(const T* c) const { return interior(c - width, c, c + width); }
  /// The same from the pixel above, the pixel and the pixel below: the same order as at()'s
  /// edge path; adding 0 for an invalid neighbour leaves the sum exact (it starts at +0, so it
  /// is never -0). No branch on a value (Valid): the host's row loop vectorises.
  VSR_HD C interior(const T* up, const T* mid, const T* down) const {
    C sum = C(0);
    C count = C(0);
    const T* rows[3] = {up, mid, down};
    for (int r = 0; r < 3; ++r) {
      for (int dx = -1; dx <= 1; ++dx) {
        const T v = rows[r][dx];
        const bool ok = valid(v);
        sum += ok ? static_cast<C>(v) : C(0);
        count += ok ? C(1) : C(0);
      }
    }
    const C mean = sum / (count > C(0) ? count : C(1));
    return (int{valid(mid[0])} & int{count > C(0)}) ? mean : quiet_nan<C>();
  }
};

/// One output row of FocalMeanOp per call (`row`: band * height + y), for the host's threads.
template <class T>
struct FocalMeanRows {
  using C = compute_t<T>;
  FocalMeanOp<T> op;
  C* out;
  void operator()(long long row) const {
    const long long band = row / op.height, y = row - band * op.height, w = op.width;
    C* o = out + row * w;
    if (y == 0 || y == op.height - 1 || w < 3) {
      for (long long x = 0; x < w; ++x) o[x] = op.at(band, y, x);
      return;
    }
    const T* mid = op.data + row * w;
    const T* up = mid - w;
    const T* down = mid + w;
    o[0] = op.at(band, y, 0);
    for (long long x = 1; x < w - 1; ++x) o[x] = op.interior(up + x, mid + x, down + x);
    o[w - 1] = op.at(band, y, w - 1);
  }
};

// ---- Drivers shared by both backends: `policy` is thrust::device (OpenMP) on the host and
// par_nosync(pool allocator).on(stream) on the device. Pointers are raw.

template <class Policy>
void run_rescale(const Policy& policy, const void* in, DType dtype, void* out, DType out_dtype,
                 std::int64_t n, NodataSpec nodata, RescaleParams p) {
  visit_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    using C = compute_t<T>;
    visit_dtype(out_dtype, [&](auto o) {
      using O = decltype(o);
      const C factor = static_cast<C>(p.out_max - p.out_min) / static_cast<C>(p.in_max - p.in_min);
      RescaleOp<T, O> op{Valid<T>(nodata), static_cast<C>(p.in_min), factor,
                         static_cast<C>(p.out_min), convert_to<O>(p.fill)};
      const T* src = static_cast<const T*>(in);
      thrust::transform(policy, src, src + n, static_cast<O*>(out), op);
    });
  });
}

template <class Policy>
void run_clip(const Policy& policy, const void* in, DType dtype, void* out, std::int64_t n,
              NodataSpec nodata, double lower, double upper) {
  visit_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    using C = compute_t<T>;
    // The facade rounded integer bounds inwards and saturated them to T's range.
    ClipOp<T> op{Valid<T>(nodata), static_cast<C>(lower), static_cast<C>(upper),
                 static_cast<T>(lower), static_cast<T>(upper)};
    const T* src = static_cast<const T*>(in);
    thrust::transform(policy, src, src + n, static_cast<T*>(out), op);
  });
}

template <class Policy>
void run_fill(const Policy& policy, const void* in, DType dtype, void* out, std::int64_t n,
              NodataSpec nodata, double value) {
  visit_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    FillOp<T> op{Valid<T>(nodata), static_cast<T>(value)};
    const T* src = static_cast<const T*>(in);
    thrust::transform(policy, src, src + n, static_cast<T*>(out), op);
  });
}

template <class Policy>
void run_normalized_difference(const Policy& policy, const void* a, const void* b, DType dtype,
                               void* out, std::int64_t n, NodataSpec na, NodataSpec nb) {
  visit_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    using C = compute_t<T>;
    NormDiffOp<T> op{Valid<T>(na), Valid<T>(nb)};
    const T* pa = static_cast<const T*>(a);
    thrust::transform(policy, pa, pa + n, static_cast<const T*>(b), static_cast<C*>(out), op);
  });
}

template <class Policy>
void run_focal_mean(const Policy& policy, const void* in, DType dtype, void* out, Layout layout,
                    NodataSpec nodata, EdgeMode edge) {
  visit_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    using C = compute_t<T>;
    FocalMeanOp<T> op{Valid<T>(nodata), static_cast<const T*>(in), layout.height, layout.width,
                      edge};
    thrust::counting_iterator<long long> first(0);
#if defined(__CUDACC__)
    thrust::transform(policy, first, first + layout.pixels(), static_cast<C*>(out), op);
#else
    // The host walks rows: one index division per row, not per pixel (it cost more than the
    // window's nine loads); a thread per pixel suits the device.
    thrust::for_each(policy, first, first + layout.bands * layout.height,
                     FocalMeanRows<T>{op, static_cast<C*>(out)});
#endif
  });
}

/// BinOp of @p bins bins on [lower, upper].
template <class T>
BinOp<T> make_bin_op(NodataSpec nodata, int bins, double lower, double upper) {
  return BinOp<T>{Valid<T>(nodata), bins, lower, upper,
                  (upper - lower) / static_cast<double>(bins)};
}

}  // namespace vibespatial::raster::detail::ops
