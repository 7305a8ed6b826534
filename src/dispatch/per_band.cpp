// SPDX-License-Identifier: Apache-2.0
// Per-band executors: host bands on a small thread pool, device bands in budgeted batches.
#include "common/checked_math.hpp"
#include "driver/cuda_driver.hpp"

#include <vibespatial/raster/dispatch.hpp>
#include <vibespatial/raster/errors.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace vibespatial::raster {

using detail::checked_mul;

namespace {

// Everything one dispatch_per_band_gpu call holds on the driver. The destructor waits for the
// stream before freeing anything, so an in-flight prefetch never writes into released memory.
struct GpuCallResources {
  explicit GpuCallResources(const detail::DriverApi& driver_api) : api(driver_api) {}
  GpuCallResources(const GpuCallResources&) = delete;
  GpuCallResources& operator=(const GpuCallResources&) = delete;

  ~GpuCallResources() {
    if (stream != nullptr) api.cuStreamSynchronize(stream);
    for (auto& b : batch) b.reset();
    for (void* p : pinned) {
      if (p != nullptr) api.cuMemFreeHost(p);
    }
    for (CUevent e : copied) {
      if (e != nullptr) api.cuEventDestroy(e);
    }
    if (stream != nullptr) api.cuStreamDestroy(stream);
  }

  const detail::DriverApi& api;
  CUstream stream = nullptr;
  std::array<CUevent, 2> copied{};                       ///< recorded after each slot's H->D copy
  std::array<bool, 2> recorded{};                        ///< copied[slot] has been recorded
  std::array<void*, 2> pinned{};                         ///< pinned staging, one per slot
  std::array<std::optional<OwnedRasterArray>, 2> batch;  ///< device input of each slot
};

}  // namespace

OwnedRasterArray dispatch_per_band_cpu(const OwnedRasterArray& raster, const BandOp& op) {
  if (!op) throw std::invalid_argument("dispatch_per_band_cpu: op is empty");
  if (raster.band_count() == 1) return op(raster);

  // The CPU path works on host views; a device raster is copied, never moved (it is const).
  std::optional<OwnedRasterArray> host_copy;
  const OwnedRasterArray* input = &raster;
  if (raster.residency() == Residency::device) {
    host_copy = OwnedRasterArray::allocate(Residency::host, raster.dtype(), raster.band_count(),
                                           raster.height(), raster.width(), raster.nodata(),
                                           raster.affine(), raster.crs());
    raster.copy_to_host(host_copy->mutable_host_data());
    input = &*host_copy;
  }

  const int bands = raster.band_count();
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const int workers = static_cast<int>(std::min<unsigned>({static_cast<unsigned>(bands), hw, 8u}));

  std::vector<std::optional<OwnedRasterArray>> results(static_cast<std::size_t>(bands));
  std::atomic<int> next{0};
  std::atomic<bool> stop{false};
  std::mutex error_mutex;
  std::exception_ptr error;

  auto work = [&] {
    for (;;) {
      if (stop.load(std::memory_order_acquire)) return;
      const int i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= bands) return;
      try {
        results[static_cast<std::size_t>(i)].emplace(op(input->band(i)));
      } catch (...) {
        std::lock_guard lock(error_mutex);
        if (!error) error = std::current_exception();
        stop.store(true, std::memory_order_release);
        return;
      }
    }
  };

  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(workers - 1));
  try {
    for (int t = 1; t < workers; ++t) threads.emplace_back(work);
  } catch (...) {
    // Could not start every worker: run with those that did start.
  }
  work();
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);

  std::vector<OwnedRasterArray> stacked;
  stacked.reserve(results.size());
  for (auto& r : results) stacked.push_back(std::move(*r));
  return OwnedRasterArray::from_band_stack(stacked, raster);
}

OwnedRasterArray dispatch_per_band_gpu(const OwnedRasterArray& raster, const BandOp& op,
                                       int buffers_per_band, std::uint64_t scratch_bytes) {
  if (!op) throw std::invalid_argument("dispatch_per_band_gpu: op is empty");
  if (raster.band_count() == 1) return op(raster);

  const detail::DriverApi* driver_api = nullptr;
  try {
    driver_api = &detail::driver();
  } catch (const DriverUnavailableError& e) {
    throw DriverUnavailableError(
        e.code(), e.name(),
        "dispatch_per_band_gpu: a raster of " + std::to_string(raster.band_count()) +
            " bands needs a CUDA driver and device (use dispatch_per_band_cpu without one): " +
            e.what());
  }
  const detail::DriverApi& api = *driver_api;
  detail::bind_current_device();

  // One budget for the planner and for every decision below.
  const std::uint64_t budget = available_vram_bytes();
  const int bands = raster.band_count();
  const std::int64_t height = raster.height();
  const std::int64_t width = raster.width();
  PlanOptions options;
  options.band_count = bands;
  options.buffers_per_band = buffers_per_band;
  options.scratch_bytes = scratch_bytes;
  options.vram_budget = budget;
  options.per_band = true;
  const std::uint64_t band_bytes =
      checked_mul(checked_mul(static_cast<std::uint64_t>(height), static_cast<std::uint64_t>(width),
                              "dispatch_per_band_gpu: band byte count"),
                  itemsize(raster.dtype()), "dispatch_per_band_gpu: band byte count");
  if (budget == 0) {
    throw OutOfMemoryError(band_bytes,
                           "dispatch_per_band_gpu: the device has no memory available (VRAM "
                           "budget 0 bytes)");
  }
  const RasterPlan plan = analyze_raster_plan(height, width, raster.dtype(), options);
  if (plan.strategy == TilingStrategy::tiled) {
    throw std::runtime_error(
        "dispatch_per_band_gpu: one band of " + std::to_string(height) + " x " +
        std::to_string(width) + " " + std::string(to_string(raster.dtype())) + " with " +
        std::to_string(buffers_per_band) + " buffers and " + std::to_string(scratch_bytes) +
        " scratch bytes does not fit the VRAM budget of " + std::to_string(budget) +
        " bytes (plan: tiled, " + std::to_string(plan.n_tiles) + " tiles of " +
        std::to_string(plan.tile_shape ? plan.tile_shape->first : 0) + " x " +
        std::to_string(plan.tile_shape ? plan.tile_shape->second : 0) +
        "); use dispatch_tiled or dispatch_tiled_halo with this plan");
  }

  const int per_batch = std::clamp(plan.bands_per_pass, 1, bands);
  const int n_batches = (bands + per_batch - 1) / per_batch;
  const std::uint64_t in_bytes = band_bytes * static_cast<std::uint64_t>(per_batch);
  // What one batch needs on the device: its input, the op's other buffers and its scratch.
  const std::uint64_t pass_bytes = plan.estimated_vram_per_tile;
  const bool input_on_device = raster.residency() == Residency::device;
  const unsigned char* host_in =
      input_on_device ? nullptr : static_cast<const unsigned char*>(raster.host_data());

  GpuCallResources res(api);
  if (!input_on_device) {
    VSR_CU_TRY(api.cuStreamCreate(&res.stream, CU_STREAM_DEFAULT));
    for (CUevent& e : res.copied) VSR_CU_TRY(api.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  }

  // Output: decided at the first result, whose dtype sets the output's.
  std::optional<OwnedRasterArray> out;
  std::optional<DType> out_dtype;  // the first result's dtype and nodata
  std::optional<double> out_nodata;
  std::uint64_t out_band_bytes = 0;
  std::uint64_t out_on_device_bytes = 0;
  bool prefetched_next = false;

  // Starts the H->D copy of batch k into slot k % 2 (pinned staging, async on the stream).
  auto stage = [&](int k) {
    const int slot = k % 2;
    const int b0 = k * per_batch;
    const int nb = std::min(per_batch, bands - b0);
    const std::size_t bytes = static_cast<std::size_t>(band_bytes) * static_cast<std::size_t>(nb);
    if (res.recorded[slot]) VSR_CU_TRY(api.cuEventSynchronize(res.copied[slot]));
    if (res.pinned[slot] == nullptr) {
      VSR_CU_TRY(api.cuMemHostAlloc(&res.pinned[slot], static_cast<std::size_t>(in_bytes), 0));
    }
    std::memcpy(res.pinned[slot], host_in + static_cast<std::size_t>(band_bytes) * b0, bytes);
    res.batch[slot] =
        OwnedRasterArray::allocate(Residency::device, raster.dtype(), nb, height, width,
                                   raster.nodata(), raster.affine(), raster.crs());
    VSR_CU_TRY(api.cuMemcpyHtoDAsync(detail::to_device_ptr(res.batch[slot]->device_pointer()),
                                     res.pinned[slot], bytes, res.stream));
    VSR_CU_TRY(api.cuEventRecord(res.copied[slot], res.stream));
    res.recorded[slot] = true;
  };

  auto take_result = [&](const OwnedRasterArray& result, int band) {
    const std::string where = "dispatch_per_band_gpu: the result of band " + std::to_string(band);
    if (result.band_count() != 1 || result.height() != height || result.width() != width) {
      throw std::invalid_argument(where + " has shape (" + std::to_string(result.band_count()) +
                                  ", " + std::to_string(result.height()) + ", " +
                                  std::to_string(result.width()) + "), expected (1, " +
                                  std::to_string(height) + ", " + std::to_string(width) + ")");
    }
    if (!out_dtype) {
      out_dtype = result.dtype();
      out_nodata = result.nodata();
      out_band_bytes = checked_mul(
          checked_mul(static_cast<std::uint64_t>(height), static_cast<std::uint64_t>(width),
                      "dispatch_per_band_gpu: output byte count"),
          itemsize(result.dtype()), "dispatch_per_band_gpu: output byte count");
      const std::uint64_t out_total = checked_mul(out_band_bytes, static_cast<std::uint64_t>(bands),
                                                  "dispatch_per_band_gpu: output byte count");
      // The stack stays on the device only if it fits beside a pass (and a prefetched batch).
      const std::uint64_t beside = pass_bytes + (prefetched_next ? in_bytes : 0);
      const bool keep = beside <= budget && out_total <= budget - beside;
      out = OwnedRasterArray::allocate(keep ? Residency::device : Residency::host, result.dtype(),
                                       bands, height, width, raster.nodata(), raster.affine(),
                                       raster.crs());
      out_on_device_bytes = keep ? out_total : 0;
    } else {
      if (result.dtype() != *out_dtype) {
        throw std::invalid_argument(where + " has dtype " + std::string(to_string(result.dtype())) +
                                    ", band 0's has " + std::string(to_string(*out_dtype)));
      }
      if (!same_nodata(result.nodata(), out_nodata)) {
        throw std::invalid_argument(where + " has a different nodata from band 0's result");
      }
    }
    const std::size_t n = static_cast<std::size_t>(out_band_bytes);
    const std::size_t offset = n * static_cast<std::size_t>(band);
    if (out_on_device_bytes != 0) {
      auto* dst = static_cast<unsigned char*>(out->device_data()) + offset;
      if (const void* src = result.device_pointer(); src != nullptr) {
        VSR_CU_TRY(api.cuMemcpyDtoD(detail::to_device_ptr(dst), detail::to_device_ptr(src), n));
      } else {
        VSR_CU_TRY(api.cuMemcpyHtoD(detail::to_device_ptr(dst), result.host_data(), n));
      }
    } else {
      result.copy_to_host(static_cast<unsigned char*>(out->mutable_host_data()) + offset);
    }
  };

  if (!input_on_device) stage(0);
  for (int k = 0; k < n_batches; ++k) {
    const int slot = k % 2;
    const int b0 = k * per_batch;
    const int nb = std::min(per_batch, bands - b0);
    // Double buffering: batch k+1 is copied while batch k's op runs, if both fit the budget.
    prefetched_next = false;
    if (!input_on_device && k + 1 < n_batches) {
      const std::uint64_t held = pass_bytes + out_on_device_bytes;
      if (held <= budget && in_bytes <= budget - held) {
        stage(k + 1);
        prefetched_next = true;
      }
    }
    if (!input_on_device) VSR_CU_TRY(api.cuEventSynchronize(res.copied[slot]));
    for (int j = 0; j < nb; ++j) {
      const OwnedRasterArray view =
          input_on_device ? raster.band(b0 + j) : res.batch[slot]->band(j);
      const OwnedRasterArray result = op(view);
      take_result(result, b0 + j);
    }
    if (out_on_device_bytes != 0) {
      // The device-to-device copies must finish before the results and the input are freed.
      VSR_CU_TRY(api.cuCtxSynchronize());
    }
    res.batch[slot].reset();
    if (!input_on_device && !prefetched_next && k + 1 < n_batches) stage(k + 1);
  }
  return std::move(*out);
}

}  // namespace vibespatial::raster
