// SPDX-License-Identifier: Apache-2.0
// The host backend of the band operations: the functors of band_ops.hpp run through Thrust's
// OpenMP device system (g++ -fopenmp, CCCL headers from the CUDA toolkit; no CUDA runtime).
#ifndef THRUST_DEVICE_SYSTEM
#define THRUST_DEVICE_SYSTEM THRUST_DEVICE_SYSTEM_OMP
#endif

#include "ops/band_ops.hpp"
#include "ops/calc_eval.hpp"

#include <thrust/execution_policy.h>
#include <thrust/transform_reduce.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace vibespatial::raster::detail::ops::host {

namespace {
const auto& policy() {
  return thrust::device;
}
}  // namespace

namespace {

constexpr std::int64_t kStatsChunk = 4096;  // pixels: a chunk's two passes stay in the cache

// The Stats of `n` pixels at `p` (a chunk of a band), with no division per pixel (merging pixel
// by pixel, as MergeStats does, has two); chunks are then merged with MergeStats. Integers of
// at most 16 bits: exact integer sums of the values and of their squares (they fit in 64 bits
// for a chunk), one loop that vectorises. Other types: the sum, then the squared deviations
// from the chunk's mean, each over four accumulators in a fixed order (the reductions' latency
// chains run side by side; the result does not depend on threads).
template <class T>
Stats chunk_stats(const T* p, std::int64_t n, Valid<T> valid) {
  if constexpr (std::is_integral_v<T> && sizeof(T) <= 2) {
    std::int64_t count = 0, s1 = 0, s2 = 0;
    T mn = std::numeric_limits<T>::max(), mx = std::numeric_limits<T>::lowest();
    for (std::int64_t i = 0; i < n; ++i) {
      const T v = p[i];
      const bool ok = valid(v);
      const std::int64_t x = ok ? static_cast<std::int64_t>(v) : 0;
      count += ok ? 1 : 0;
      s1 += x;
      s2 += x * x;
      mn = ok && v < mn ? v : mn;
      mx = ok && v > mx ? v : mx;
    }
    if (count == 0) return empty_stats();
    const double c = static_cast<double>(count);
    // count * s2 - s1 * s1 is exact: at most 2^12 * 2^44 for a chunk of 2^12 pixels.
    return Stats{count, static_cast<double>(s1) / c, static_cast<double>(count * s2 - s1 * s1) / c,
                 static_cast<double>(mn), static_cast<double>(mx)};
  } else {
    constexpr int K = 4;
    std::int64_t count = 0;
    double sum[K] = {}, mn = std::numeric_limits<double>::infinity(), mx = -mn;
    const auto add = [&](const T v, double& acc) {
      const bool ok = valid(v);
      const double d = static_cast<double>(v);
      count += ok ? 1 : 0;
      acc += ok ? d : 0.0;
      mn = ok && d < mn ? d : mn;
      mx = ok && d > mx ? d : mx;
    };
    std::int64_t i = 0;
    for (; i + K <= n; i += K) {
      for (int k = 0; k < K; ++k) add(p[i + k], sum[k]);
    }
    for (; i < n; ++i) add(p[i], sum[0]);
    if (count == 0) return empty_stats();
    const double mean = ((sum[0] + sum[1]) + (sum[2] + sum[3])) / static_cast<double>(count);
    double m2[K] = {};
    const auto dev = [&](const T v, double& acc) {
      const double d = static_cast<double>(v) - mean;
      acc += valid(v) ? d * d : 0.0;
    };
    for (i = 0; i + K <= n; i += K) {
      for (int k = 0; k < K; ++k) dev(p[i + k], m2[k]);
    }
    for (; i < n; ++i) dev(p[i], m2[0]);
    return Stats{count, mean, (m2[0] + m2[1]) + (m2[2] + m2[3]), mn, mx};
  }
}

}  // namespace

void statistics(const void* in, DType dtype, Layout layout, NodataSpec nodata, BandStatistics* out,
                CUstream /*stream*/) {
  visit_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    const T* data = static_cast<const T*>(in);
    const std::int64_t hw = layout.band_pixels();
    const Valid<T> valid(nodata);
    const std::int64_t chunks = (hw + kStatsChunk - 1) / kStatsChunk;
    std::vector<Stats> parts(static_cast<std::size_t>(chunks));
    for (int b = 0; b < layout.bands; ++b) {
      const T* band = data + b * hw;
#pragma omp parallel for schedule(static)
      for (std::int64_t c = 0; c < chunks; ++c) {
        const std::int64_t first = c * kStatsChunk;
        parts[static_cast<std::size_t>(c)] =
            chunk_stats(band + first, std::min(kStatsChunk, hw - first), valid);
      }
      // Merged in chunk order: the result does not depend on the number of threads.
      Stats s = empty_stats();
      for (const Stats& part : parts) s = MergeStats{}(s, part);
      out[b] = finish_stats(s);
    }
  });
}

void rescale(const void* in, DType dtype, void* out, DType out_dtype, std::int64_t n,
             NodataSpec nodata, RescaleParams params, CUstream /*stream*/) {
  run_rescale(policy(), in, dtype, out, out_dtype, n, nodata, params);
}

void clip(const void* in, DType dtype, void* out, std::int64_t n, NodataSpec nodata, double lower,
          double upper, CUstream /*stream*/) {
  run_clip(policy(), in, dtype, out, n, nodata, lower, upper);
}

void fill_nodata(const void* in, DType dtype, void* out, std::int64_t n, NodataSpec nodata,
                 double value, CUstream /*stream*/) {
  run_fill(policy(), in, dtype, out, n, nodata, value);
}

void normalized_difference(const void* a, const void* b, DType dtype, void* out, std::int64_t n,
                           NodataSpec nodata_a, NodataSpec nodata_b, CUstream /*stream*/) {
  run_normalized_difference(policy(), a, b, dtype, out, n, nodata_a, nodata_b);
}

void histogram(const void* in, DType dtype, Layout layout, NodataSpec nodata, int bins,
               double lower, double upper, std::int64_t* counts, CUstream /*stream*/) {
  // Thrust has no histogram: one band at a time (as the CUDA backend counts), BinOp in an OpenMP
  // loop with per-thread counters.
  visit_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    const BinOp<T> op = make_bin_op<T>(nodata, bins, lower, upper);
    const std::int64_t n = layout.band_pixels();
    const auto width = static_cast<std::size_t>(bins);
    for (int band = 0; band < layout.bands; ++band) {
      const T* data = static_cast<const T*>(in) + band * n;
      std::int64_t* out = counts + static_cast<std::size_t>(band) * width;
      for (std::size_t k = 0; k < width; ++k) out[k] = 0;
#pragma omp parallel
      {
        std::vector<std::int64_t> local(width, 0);
#pragma omp for schedule(static)
        for (std::int64_t i = 0; i < n; ++i) {
          const int bin = op(data[i]);
          if (bin >= 0) ++local[static_cast<std::size_t>(bin)];
        }
#pragma omp critical
        for (std::size_t k = 0; k < width; ++k) out[k] += local[k];
      }
    }
  });
}

void focal_mean_3x3(const void* in, DType dtype, void* out, Layout layout, NodataSpec nodata,
                    EdgeMode edge, CUstream /*stream*/) {
  run_focal_mean(policy(), in, dtype, out, layout, nodata, edge);
}

void calc(const CalcLaunch& launch, CUstream /*stream*/) {
  // Lanes per evaluation: the opcode dispatch is paid once per kCalcLanes pixels, and the
  // registers (kCalcMaxRegisters x kCalcLanes values, 16 KiB in float64) stay on the stack; the
  // few a program uses stay in L1. 64 ran the NDVI expression faster than 128 or 256.
  constexpr int kCalcLanes = 64;
  if (calc_registers_used(launch.code, launch.code_size) > kCalcMaxRegisters) {
    throw std::invalid_argument("calc: the program names more than " +
                                std::to_string(kCalcMaxRegisters) + " registers");
  }
  calc::run_calc<kCalcLanes>(policy(), launch);
}

}  // namespace vibespatial::raster::detail::ops::host

namespace vibespatial::raster {

BandStatistics merge_statistics(const BandStatistics& a, const BandStatistics& b) noexcept {
  namespace ops = detail::ops;
  const auto stats = [](const BandStatistics& s) {
    if (s.count == 0) return ops::empty_stats();
    return ops::Stats{s.count, s.mean, s.std * s.std * static_cast<double>(s.count), s.min, s.max};
  };
  return ops::finish_stats(ops::MergeStats{}(stats(a), stats(b)));
}

}  // namespace vibespatial::raster
