// SPDX-License-Identifier: Apache-2.0
// The CUDA backend of the band operations: the functors of band_ops.hpp through Thrust
// (par_nosync with the pool allocator) and CUB (segmented reduce, histogram) on the legacy default
// stream. Every temporary comes from the device pool. cudart (linked statically, this file only)
// runs in the device's primary context, which the driver seam makes current first, so pool
// memory and runtime launches share one context.
//
// Layering (as CUB's): ops.cpp (facade: checks, residency, outputs) -> the entry points below
// (dispatch: dtype, temporaries, stream) -> Thrust/CUB kernels over the band_ops.hpp functors.
#include "driver/cuda_driver.hpp"
#include "ops/band_ops.hpp"
#include "ops/pool_allocator.hpp"

#include <vibespatial/raster/errors.hpp>

#include <cub/device/device_histogram.cuh>
#include <cub/device/device_segmented_reduce.cuh>
#include <cuda_runtime.h>
#include <thrust/execution_policy.h>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>
#include <thrust/system/cuda/execution_policy.h>

#include <cstdint>
#include <string>
#include <vector>

namespace vibespatial::raster::detail::ops::device {

namespace {

/// Throws CudaError (code: the cudaError_t value) when a runtime call fails.
void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw CudaError(static_cast<int>(err), cudaGetErrorName(err),
                    std::string("vibespatial: ") + what + " failed: " + cudaGetErrorString(err));
  }
}

/// The stream every op runs on: the legacy default stream, which the pool and OwnedRasterArray's
/// copies also use, so outputs are ordered after allocation and before later copies.
constexpr CUstream kStream = nullptr;

/// Makes the device's primary context current (the one pool memory lives in) before cudart use.
void enter() {
  (void)detail::bind_current_device();
}

/// Thrust policy whose temporaries come from the pool (the allocator must outlive its uses).
auto policy(PoolThrustAllocator& alloc) {
  return thrust::cuda::par_nosync(alloc).on(kStream);
}

/// Raises launch errors of the queued work; raster outputs stay stream-ordered.
void finish_async(const char* what) {
  check(cudaPeekAtLastError(), what);
}

/// band b -> b * band_pixels: segment offsets without an array.
struct SegmentOffset {
  long long band_pixels;
  VSR_HD long long operator()(long long b) const { return b * band_pixels; }
};

}  // namespace

void statistics(const void* in, DType dtype, Layout layout, NodataSpec nodata,
                BandStatistics* out) {
  enter();
  visit_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    auto values =
        thrust::make_transform_iterator(static_cast<const T*>(in), ToStats<T>{Valid<T>(nodata)});
    auto offsets = thrust::make_transform_iterator(thrust::counting_iterator<long long>(0),
                                                   SegmentOffset{layout.band_pixels()});
    const int segments = layout.bands;
    PoolBuffer result(sizeof(Stats) * static_cast<std::size_t>(segments), kStream);
    std::size_t temp_bytes = 0;
    check(cub::DeviceSegmentedReduce::Reduce(nullptr, temp_bytes, values, result.as<Stats>(),
                                             segments, offsets, offsets + 1, MergeStats{},
                                             empty_stats(), kStream),
          "DeviceSegmentedReduce (size query)");
    PoolBuffer temp(temp_bytes, kStream);
    check(cub::DeviceSegmentedReduce::Reduce(temp.get(), temp_bytes, values, result.as<Stats>(),
                                             segments, offsets, offsets + 1, MergeStats{},
                                             empty_stats(), kStream),
          "DeviceSegmentedReduce");
    std::vector<Stats> host(static_cast<std::size_t>(segments));
    check(
        cudaMemcpyAsync(host.data(), result.get(), result.size(), cudaMemcpyDeviceToHost, kStream),
        "cudaMemcpyAsync (statistics)");
    check(cudaStreamSynchronize(kStream), "cudaStreamSynchronize (statistics)");
    for (int b = 0; b < segments; ++b) out[b] = finish_stats(host[static_cast<std::size_t>(b)]);
  });
}

void rescale(const void* in, DType dtype, void* out, DType out_dtype, std::int64_t n,
             NodataSpec nodata, RescaleParams params) {
  enter();
  PoolThrustAllocator alloc{kStream};
  run_rescale(policy(alloc), in, dtype, out, out_dtype, n, nodata, params);
  finish_async("rescale");
}

void clip(const void* in, DType dtype, void* out, std::int64_t n, NodataSpec nodata, double lower,
          double upper) {
  enter();
  PoolThrustAllocator alloc{kStream};
  run_clip(policy(alloc), in, dtype, out, n, nodata, lower, upper);
  finish_async("clip");
}

void fill_nodata(const void* in, DType dtype, void* out, std::int64_t n, NodataSpec nodata,
                 double value) {
  enter();
  PoolThrustAllocator alloc{kStream};
  run_fill(policy(alloc), in, dtype, out, n, nodata, value);
  finish_async("fill_nodata");
}

void normalized_difference(const void* a, const void* b, DType dtype, void* out, std::int64_t n,
                           NodataSpec nodata_a, NodataSpec nodata_b) {
  enter();
  PoolThrustAllocator alloc{kStream};
  run_normalized_difference(policy(alloc), a, b, dtype, out, n, nodata_a, nodata_b);
  finish_async("normalized_difference");
}

void histogram(const void* in, DType dtype, Layout layout, NodataSpec nodata, int bins,
               double lower, double upper, std::int64_t* counts) {
  enter();
  // One HistogramEven over integer bin ids (band * bins + bin, -1 dropped) for all bands: the
  // samples are int ids on levels [0, bands * bins], which sidesteps CUB's narrow and signed
  // sample-type bugs (int8 negatives, full-range uint8; reference §5.3).
  const int total_bins = layout.bands * bins;
  visit_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    auto ids =
        thrust::make_transform_iterator(thrust::counting_iterator<long long>(0),
                                        make_bin_op<T>(in, layout, nodata, bins, lower, upper));
    using Counter = unsigned long long;
    PoolBuffer hist(sizeof(Counter) * static_cast<std::size_t>(total_bins), kStream);
    const long long samples = layout.pixels();
    std::size_t temp_bytes = 0;
    check(cub::DeviceHistogram::HistogramEven(nullptr, temp_bytes, ids, hist.as<Counter>(),
                                              total_bins + 1, 0, total_bins, samples, kStream),
          "DeviceHistogram::HistogramEven (size query)");
    PoolBuffer temp(temp_bytes, kStream);
    check(cub::DeviceHistogram::HistogramEven(temp.get(), temp_bytes, ids, hist.as<Counter>(),
                                              total_bins + 1, 0, total_bins, samples, kStream),
          "DeviceHistogram::HistogramEven");
    std::vector<Counter> host(static_cast<std::size_t>(total_bins));
    check(cudaMemcpyAsync(host.data(), hist.get(), hist.size(), cudaMemcpyDeviceToHost, kStream),
          "cudaMemcpyAsync (histogram)");
    check(cudaStreamSynchronize(kStream), "cudaStreamSynchronize (histogram)");
    for (int k = 0; k < total_bins; ++k)
      counts[k] = static_cast<std::int64_t>(host[static_cast<std::size_t>(k)]);
  });
}

void focal_mean_3x3(const void* in, DType dtype, void* out, Layout layout, NodataSpec nodata,
                    EdgeMode edge) {
  enter();
  PoolThrustAllocator alloc{kStream};
  run_focal_mean(policy(alloc), in, dtype, out, layout, nodata, edge);
  finish_async("focal_mean_3x3");
}

std::size_t pool_thrust_probe(std::int64_t n, bool& ok) {
  enter();
  std::size_t allocations = 0;
  PoolThrustAllocator alloc{kStream, &allocations};
  PoolBuffer buf(sizeof(long long) * static_cast<std::size_t>(n), kStream);
  long long* p = buf.as<long long>();
  // Descending values in pool memory, written by a Thrust kernel, then sorted (temporaries from
  // the pool allocator) and read back.
  thrust::sequence(policy(alloc), p, p + n, static_cast<long long>(n - 1), -1LL);
  thrust::sort(policy(alloc), p, p + n);
  std::vector<long long> host(static_cast<std::size_t>(n));
  check(cudaMemcpyAsync(host.data(), p, buf.size(), cudaMemcpyDeviceToHost, kStream),
        "cudaMemcpyAsync (probe)");
  check(cudaStreamSynchronize(kStream), "cudaStreamSynchronize (probe)");
  ok = true;
  for (std::int64_t i = 0; i < n; ++i) ok = ok && host[static_cast<std::size_t>(i)] == i;
  return allocations;
}

}  // namespace vibespatial::raster::detail::ops::device
