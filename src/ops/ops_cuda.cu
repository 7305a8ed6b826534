// SPDX-License-Identifier: Apache-2.0
// The CUDA backend of the band operations: the functors of band_ops.hpp through Thrust
// (par_nosync with the pool allocator), CUB (reduce) and kernels of its own (histograms, band
// math) on the caller's stream (the legacy default stream for the forms without one). Every
// temporary comes from the device pool, allocated and freed in the order of that stream. cudart
// (linked statically, this file only) runs in the device's primary context, which the driver
// seam makes current first, so pool memory and runtime launches share one context.
//
// Errors (runtime_errors.hpp): every runtime call is checked, launch errors are read with
// cudaGetLastError (which clears them) after each op's kernels are queued, Thrust's exceptions
// become CudaError/OutOfMemoryError, and a failed call clears the runtime's last error, so no op
// reports another op's failure.
//
// Layering (as CUB's): ops.cpp (facade: checks, residency, outputs) -> the entry points below
// (dispatch: dtype, temporaries, stream) -> Thrust/CUB kernels, or this file's, over the
// band_ops.hpp and calc_eval.hpp functors.
#include "driver/cuda_driver.hpp"
#include "ops/band_ops.hpp"
#include "ops/calc_eval.hpp"
#include "ops/pool_allocator.hpp"
#include "ops/runtime_errors.hpp"

#include <vibespatial/raster/errors.hpp>

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
#include <stdexcept>
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

namespace {

using Counter = unsigned long long;
constexpr int kHistBlock = 256;  ///< threads per block of the histogram kernels
/// The most bins one block counts in shared memory (32-bit counters: 32 KiB); more go straight
/// to the band's counters in global memory.
constexpr int kSharedBins = 8192;

/// One band's histogram, each block counting its samples in shared memory, then adding its
/// non-zero bins to @p d_counts (grid-stride; a block counts fewer than 2^32 samples).
template <class T>
__global__ void __launch_bounds__(kHistBlock)
    histogram_shared_kernel(const T* __restrict__ d_band, std::int64_t n, BinOp<T> op,
                            Counter* __restrict__ d_counts) {
  extern __shared__ __align__(16) unsigned char hist_shared[];
  unsigned* bins = reinterpret_cast<unsigned*>(hist_shared);
  for (int k = threadIdx.x; k < op.bins; k += blockDim.x) bins[k] = 0;
  __syncthreads();
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += step) {
    const int b = op(d_band[i]);
    if (b >= 0) atomicAdd(&bins[b], 1u);
  }
  __syncthreads();
  for (int k = threadIdx.x; k < op.bins; k += blockDim.x) {
    const unsigned c = bins[k];
    if (c != 0) atomicAdd(&d_counts[k], static_cast<Counter>(c));
  }
}

/// One band's histogram of more bins than shared memory holds: atomics on the band's counters.
template <class T>
__global__ void __launch_bounds__(kHistBlock)
    histogram_global_kernel(const T* __restrict__ d_band, std::int64_t n, BinOp<T> op,
                            Counter* __restrict__ d_counts) {
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += step) {
    const int b = op(d_band[i]);
    if (b >= 0) atomicAdd(&d_counts[b], Counter{1});
  }
}

}  // namespace

void histogram(const void* in, DType dtype, Layout layout, NodataSpec nodata, int bins,
               double lower, double upper, std::int64_t* counts, CUstream stream) {
  enter();
  // One band at a time, each pixel's bin by BinOp (the host backend's functor, so the same bins,
  // edges included), counted in shared memory where the bins fit; the counters of every band in
  // one buffer, read back once.
  const std::size_t total = static_cast<std::size_t>(layout.bands) * static_cast<std::size_t>(bins);
  const std::int64_t n = layout.band_pixels();
  PoolBuffer hist(sizeof(Counter) * total, stream);
  check(cudaMemsetAsync(hist.get(), 0, hist.size(), stream), "histogram: cudaMemsetAsync");
  // Enough blocks to fill the device, and enough that none counts 2^32 samples in 32 bits.
  constexpr std::int64_t kPerBlock = std::int64_t{1} << 31;
  const std::int64_t wanted = (n + kHistBlock - 1) / kHistBlock;
  std::int64_t blocks = wanted < 4096 ? wanted : 4096;
  if (blocks < (n + kPerBlock - 1) / kPerBlock) blocks = (n + kPerBlock - 1) / kPerBlock;
  visit_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    const BinOp<T> op = make_bin_op<T>(nodata, bins, lower, upper);
    for (int band = 0; band < layout.bands && n > 0; ++band) {
      const T* d_band = static_cast<const T*>(in) + band * n;
      Counter* d_counts = hist.as<Counter>() + static_cast<std::size_t>(band) * bins;
      if (bins <= kSharedBins) {
        const std::size_t shared = sizeof(unsigned) * static_cast<std::size_t>(bins);
        histogram_shared_kernel<T><<<static_cast<unsigned>(blocks), kHistBlock, shared, stream>>>(
            d_band, n, op, d_counts);
      } else {
        histogram_global_kernel<T>
            <<<static_cast<unsigned>(blocks), kHistBlock, 0, stream>>>(d_band, n, op, d_counts);
      }
    }
  });
  check_launch(kRuntime, "histogram: the histogram kernels");
  std::vector<Counter> host(total);
  check(cudaMemcpyAsync(host.data(), hist.get(), hist.size(), cudaMemcpyDeviceToHost, stream),
        "histogram: cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream), "histogram: cudaStreamSynchronize");
  for (std::size_t k = 0; k < total; ++k) counts[k] = static_cast<std::int64_t>(host[k]);
}

void focal_mean_3x3(const void* in, DType dtype, void* out, Layout layout, NodataSpec nodata,
                    EdgeMode edge, CUstream stream) {
  enter();
  PoolThrustAllocator alloc{stream};
  run_thrust("focal_mean_3x3",
             [&] { run_focal_mean(policy(alloc), in, dtype, out, layout, nodata, edge); });
}

namespace {

constexpr int kCalcBlock = 128;  ///< threads per block of calc_kernel

/// One pixel per thread (grid-stride), the program's registers in dynamic shared memory: register
/// r of thread t at r * blockDim.x + t (CalcRegisters), registers * blockDim.x values of C per
/// block. No per-thread array indexed at run time, so no local memory.
template <class C>
__global__ void __launch_bounds__(kCalcBlock) calc_kernel(CalcLaunch p) {
  extern __shared__ __align__(16) unsigned char calc_shared[];
  const calc::CalcRegisters<C, 0> reg{reinterpret_cast<C*>(calc_shared) + threadIdx.x,
                                      static_cast<int>(blockDim.x)};
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < p.pixels; i += step) {
    calc::evaluate<1, C>(p, i, reg);
  }
}

template <class C>
void launch_calc(const CalcLaunch& on_device, int registers, CUstream stream) {
  const std::size_t shared = sizeof(C) * static_cast<std::size_t>(registers) * kCalcBlock;
  const std::int64_t wanted = (on_device.pixels + kCalcBlock - 1) / kCalcBlock;
  const auto blocks = static_cast<unsigned>(wanted < (1 << 20) ? wanted : (1 << 20));
  calc_kernel<C><<<blocks, kCalcBlock, shared, stream>>>(on_device);
}

}  // namespace

void calc(const CalcLaunch& launch, CUstream stream) {
  enter();
  // Each thread's registers are the program's (at most kCalcMaxRegisters: 16 KiB of shared
  // memory per block in float32, 32 KiB in float64, under the 48 KiB a launch may take).
  const int registers = calc_registers_used(launch.code, launch.code_size);
  if (registers > kCalcMaxRegisters) {
    throw std::invalid_argument("calc: the program names more than " +
                                std::to_string(kCalcMaxRegisters) + " registers");
  }
  if (launch.pixels <= 0) return;
  // The program's tables (instructions, constants, slots, outputs) go to the device in one copy;
  // the pixels already live there. cudaMemcpyAsync from pageable memory returns once the bytes
  // are staged, so `host` may go before the copy completes; the buffer is freed in stream order.
  const CalcTables host(launch);
  PoolBuffer tables(host.bytes.size(), stream);
  check(cudaMemcpyAsync(tables.get(), host.bytes.data(), host.bytes.size(), cudaMemcpyHostToDevice,
                        stream),
        "calc: cudaMemcpyAsync");
  const CalcLaunch on_device = host.at(launch, tables.get());
  if (launch.compute_float32) {
    launch_calc<float>(on_device, registers, stream);
  } else {
    launch_calc<double>(on_device, registers, stream);
  }
  check_launch(kRuntime, "calc: the evaluation kernel");
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
