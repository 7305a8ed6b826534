// SPDX-License-Identifier: Apache-2.0
// The CUDA backend of the band operations: the functors of band_ops.hpp through Thrust
// (par_nosync with the pool allocator) and CUB (reduce, histogram) on the caller's stream (the
// legacy default stream for the forms without one). Every temporary comes from the device pool,
// allocated and freed in the order of that stream. cudart (linked statically, this file only) runs
// in the device's primary context, which the driver seam makes current first, so pool memory and
// runtime launches share one context.
//
// Errors (runtime_errors.hpp): every runtime call is checked, launch errors are read with
// cudaGetLastError (which clears them) after each op's kernels are queued, Thrust's exceptions
// become CudaError/OutOfMemoryError, and a failed call clears the runtime's last error, so no op
// reports another op's failure.
//
// Layering (as CUB's): ops.cpp (facade: checks, residency, outputs) -> the entry points below
// (dispatch: dtype, temporaries, stream) -> Thrust/CUB kernels over the band_ops.hpp functors.
#include "driver/cuda_driver.hpp"
#include "ops/band_ops.hpp"
#include "ops/calc_eval.hpp"
#include "ops/pool_allocator.hpp"
#include "ops/runtime_errors.hpp"

#include <vibespatial/raster/errors.hpp>

#include <cub/device/device_histogram.cuh>
#include <cub/device/device_reduce.cuh>
#include <cuda_runtime.h>
#include <thrust/execution_policy.h>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>
#include <thrust/system/cuda/execution_policy.h>
#include <thrust/system_error.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace vibespatial::raster::detail::ops::device {

namespace {

int last_error() {
  return static_cast<int>(cudaGetLastError());
}
const char* error_name(int code) {
  return cudaGetErrorName(static_cast<cudaError_t>(code));
}
const char* error_string(int code) {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

constexpr RuntimeErrorApi kRuntime{&last_error, &error_name, &error_string};

/// Throws (CudaError with the runtime code, or OutOfMemoryError) when a runtime call failed,
/// clearing the runtime's last error first.
void check(cudaError_t err, const char* what) {
  check_runtime(kRuntime, static_cast<int>(err), what);
}

/// Runs @p f (Thrust algorithms), turning Thrust's exceptions into the library's typed errors,
/// then reads and clears the launch errors of the queued work. Raster outputs stay
/// stream-ordered: nothing here waits for the device.
template <class F>
void run_thrust(const char* what, F&& f) {
  try {
    f();
  } catch (const thrust::system_error& e) {
    throw_runtime_error(kRuntime, e.code().value(), what);
  }
  check_launch(kRuntime, what);
}

/// Makes the device's primary context current (the one pool memory lives in) before cudart use.
void enter() {
  (void)detail::bind_current_device();
}

/// Thrust policy on @p stream whose temporaries come from the pool (the allocator must outlive
/// its uses).
auto policy(PoolThrustAllocator& alloc) {
  return thrust::cuda::par_nosync(alloc).on(alloc.stream);
}

}  // namespace

void statistics(const void* in, DType dtype, Layout layout, NodataSpec nodata, BandStatistics* out,
                CUstream stream) {
  enter();
  visit_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    // One DeviceReduce per band, each over the whole device (a segmented reduce gives one thread
    // block per segment: 4 bands would run on 4 of 132 SMs), all queued before one wait.
    const int bands = layout.bands;
    const long long n = layout.band_pixels();
    PoolBuffer result(sizeof(Stats) * static_cast<std::size_t>(bands), stream);
    auto band_values = [&](int b) {
      return thrust::make_transform_iterator(static_cast<const T*>(in) + b * n,
                                             ToStats<T>{Valid<T>(nodata)});
    };
    std::size_t temp_bytes = 0;
    check(cub::DeviceReduce::Reduce(nullptr, temp_bytes, band_values(0), result.as<Stats>(), n,
                                    MergeStats{}, empty_stats(), stream),
          "statistics: cub::DeviceReduce::Reduce (size query)");
    PoolBuffer temp(temp_bytes, stream);
    for (int b = 0; b < bands; ++b) {
      check(
          cub::DeviceReduce::Reduce(temp.get(), temp_bytes, band_values(b), result.as<Stats>() + b,
                                    n, MergeStats{}, empty_stats(), stream),
          "statistics: cub::DeviceReduce::Reduce");
    }
    check_launch(kRuntime, "statistics: the reduction kernels");
    std::vector<Stats> host(static_cast<std::size_t>(bands));
    check(cudaMemcpyAsync(host.data(), result.get(), result.size(), cudaMemcpyDeviceToHost, stream),
          "statistics: cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream), "statistics: cudaStreamSynchronize");
    for (int b = 0; b < bands; ++b) out[b] = finish_stats(host[static_cast<std::size_t>(b)]);
  });
}

void rescale(const void* in, DType dtype, void* out, DType out_dtype, std::int64_t n,
             NodataSpec nodata, RescaleParams params, CUstream stream) {
  enter();
  PoolThrustAllocator alloc{stream};
  run_thrust("rescale",
             [&] { run_rescale(policy(alloc), in, dtype, out, out_dtype, n, nodata, params); });
}

void clip(const void* in, DType dtype, void* out, std::int64_t n, NodataSpec nodata, double lower,
          double upper, CUstream stream) {
  enter();
  PoolThrustAllocator alloc{stream};
  run_thrust("clip", [&] { run_clip(policy(alloc), in, dtype, out, n, nodata, lower, upper); });
}

void fill_nodata(const void* in, DType dtype, void* out, std::int64_t n, NodataSpec nodata,
                 double value, CUstream stream) {
  enter();
  PoolThrustAllocator alloc{stream};
  run_thrust("fill_nodata", [&] { run_fill(policy(alloc), in, dtype, out, n, nodata, value); });
}

void normalized_difference(const void* a, const void* b, DType dtype, void* out, std::int64_t n,
                           NodataSpec nodata_a, NodataSpec nodata_b, CUstream stream) {
  enter();
  PoolThrustAllocator alloc{stream};
  run_thrust("normalized_difference", [&] {
    run_normalized_difference(policy(alloc), a, b, dtype, out, n, nodata_a, nodata_b);
  });
}

void histogram(const void* in, DType dtype, Layout layout, NodataSpec nodata, int bins,
               double lower, double upper, std::int64_t* counts, CUstream stream) {
  enter();
  // One HistogramEven over integer bin ids (band * bins + bin, -1 dropped) for all bands: the
  // samples are int ids on levels [0, bands * bins], which sidesteps CUB's narrow and signed
  // sample-type bugs (int8 negatives, full-range uint8 samples). The facade guarantees
  // bands * bins < 2^31 - 1, so the level count bands * bins + 1 is an int.
  const int total_bins = layout.bands * bins;
  visit_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    auto ids =
        thrust::make_transform_iterator(thrust::counting_iterator<long long>(0),
                                        make_bin_op<T>(in, layout, nodata, bins, lower, upper));
    using Counter = unsigned long long;
    PoolBuffer hist(sizeof(Counter) * static_cast<std::size_t>(total_bins), stream);
    const long long samples = layout.pixels();
    std::size_t temp_bytes = 0;
    check(cub::DeviceHistogram::HistogramEven(nullptr, temp_bytes, ids, hist.as<Counter>(),
                                              total_bins + 1, 0, total_bins, samples, stream),
          "histogram: cub::DeviceHistogram::HistogramEven (size query)");
    PoolBuffer temp(temp_bytes, stream);
    check(cub::DeviceHistogram::HistogramEven(temp.get(), temp_bytes, ids, hist.as<Counter>(),
                                              total_bins + 1, 0, total_bins, samples, stream),
          "histogram: cub::DeviceHistogram::HistogramEven");
    check_launch(kRuntime, "histogram: the histogram kernels");
    std::vector<Counter> host(static_cast<std::size_t>(total_bins));
    check(cudaMemcpyAsync(host.data(), hist.get(), hist.size(), cudaMemcpyDeviceToHost, stream),
          "histogram: cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream), "histogram: cudaStreamSynchronize");
    for (int k = 0; k < total_bins; ++k)
      counts[k] = static_cast<std::int64_t>(host[static_cast<std::size_t>(k)]);
  });
}

void focal_mean_3x3(const void* in, DType dtype, void* out, Layout layout, NodataSpec nodata,
                    EdgeMode edge, CUstream stream) {
  enter();
  PoolThrustAllocator alloc{stream};
  run_thrust("focal_mean_3x3",
             [&] { run_focal_mean(policy(alloc), in, dtype, out, layout, nodata, edge); });
}

void calc(const CalcLaunch& launch, CUstream stream) {
  enter();
  // The program's tables (instructions, constants, slots, outputs) go to the device in one copy;
  // the pixels already live there. cudaMemcpyAsync from pageable memory returns once the bytes
  // are staged, so `host` may go before the copy completes; the buffer is freed in stream order.
  const CalcTables host(launch);
  PoolBuffer tables(host.bytes.size(), stream);
  check(cudaMemcpyAsync(tables.get(), host.bytes.data(), host.bytes.size(), cudaMemcpyHostToDevice,
                        stream),
        "calc: cudaMemcpyAsync");
  const CalcLaunch on_device = host.at(launch, tables.get());
  PoolThrustAllocator alloc{stream};
  run_thrust("calc", [&] { calc::run_calc<1>(policy(alloc), on_device); });
}

std::size_t pool_thrust_probe(std::int64_t n, bool& ok) {
  enter();
  constexpr CUstream kLegacy = nullptr;
  std::size_t allocations = 0;
  PoolThrustAllocator alloc{kLegacy, &allocations};
  PoolBuffer buf(sizeof(long long) * static_cast<std::size_t>(n), kLegacy);
  long long* p = buf.as<long long>();
  // Descending values in pool memory, written by a Thrust kernel, then sorted (temporaries from
  // the pool allocator) and read back.
  run_thrust("pool_thrust_probe", [&] {
    thrust::sequence(policy(alloc), p, p + n, static_cast<long long>(n - 1), -1LL);
    thrust::sort(policy(alloc), p, p + n);
  });
  std::vector<long long> host(static_cast<std::size_t>(n));
  check(cudaMemcpyAsync(host.data(), p, buf.size(), cudaMemcpyDeviceToHost, kLegacy),
        "pool_thrust_probe: cudaMemcpyAsync");
  check(cudaStreamSynchronize(kLegacy), "pool_thrust_probe: cudaStreamSynchronize");
  ok = true;
  for (std::int64_t i = 0; i < n; ++i) ok = ok && host[static_cast<std::size_t>(i)] == i;
  return allocations;
}

}  // namespace vibespatial::raster::detail::ops::device
