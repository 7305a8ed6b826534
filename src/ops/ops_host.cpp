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

#include <cstdint>
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

void statistics(const void* in, DType dtype, Layout layout, NodataSpec nodata, BandStatistics* out,
                CUstream /*stream*/) {
  visit_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    const T* data = static_cast<const T*>(in);
    const std::int64_t hw = layout.band_pixels();
    for (int b = 0; b < layout.bands; ++b) {
      const Stats s =
          thrust::transform_reduce(policy(), data + b * hw, data + (b + 1) * hw,
                                   ToStats<T>{Valid<T>(nodata)}, empty_stats(), MergeStats{});
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
  // Thrust has no histogram: the same BinIdOp in an OpenMP loop with per-thread counters.
  visit_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    const BinIdOp<T> op = make_bin_op<T>(in, layout, nodata, bins, lower, upper);
    const std::int64_t total_bins = static_cast<std::int64_t>(layout.bands) * bins;
    const std::int64_t n = layout.pixels();
    for (std::int64_t k = 0; k < total_bins; ++k) counts[k] = 0;
#pragma omp parallel
    {
      std::vector<std::int64_t> local(static_cast<std::size_t>(total_bins), 0);
#pragma omp for schedule(static)
      for (std::int64_t i = 0; i < n; ++i) {
        const int id = op(i);
        if (id >= 0) ++local[static_cast<std::size_t>(id)];
      }
#pragma omp critical
      for (std::int64_t k = 0; k < total_bins; ++k) counts[k] += local[static_cast<std::size_t>(k)];
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
