// SPDX-License-Identifier: Apache-2.0
// The emulated device backend of the band operations (ops_backend.hpp): on the host driver
// emulator, each device entry point queues the host backend's work (the functors of
// band_ops.hpp and calc_eval.hpp, through ops_host.cpp) with cuLaunchHostFunc on the op's stream.
// The emulator's worker for that stream runs it in stream order, on the emulator's device memory,
// whose pointers are real host pointers. Everything around the work is as in the CUDA backend:
// temporaries (statistics' and histograms' results, calc's tables) come from the pool on the
// op's stream and are freed in its order; results are read back with the driver's copies and a
// wait for the stream; calc's tables go to the device with one copy.
//
// Host code in every build (no CUDA runtime): a build without nvcc runs device rasters on the
// emulator with it.
#include "driver/cuda_driver.hpp"
#include "memory/library_tag.hpp"
#include "ops/ops_backend.hpp"
#include "ops/pool_allocator.hpp"

#include <vibespatial/raster/errors.hpp>

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace vibespatial::raster::detail::ops::emulated {

namespace {

/// One piece of work queued on a stream: what the emulator's worker runs, and where an error
/// it raised goes (the ops that wait for their stream read it; see queue()).
struct HostWork {
  std::function<void()> run;
  std::shared_ptr<std::exception_ptr> error;
};

/// The first error of queued work no caller waited for: reported by the next operation
/// (take_failed_work), since a host function cannot return one.
std::mutex& failed_mutex() {
  static std::mutex m;
  return m;
}
std::exception_ptr& failed_work() {
  static std::exception_ptr e;
  return e;
}

void CUDA_CB run_host_work(void* p) {
  std::unique_ptr<HostWork> work(static_cast<HostWork*>(p));
  try {
    work->run();
  } catch (...) {
    if (work->error) {
      *work->error = std::current_exception();
    } else {
      std::lock_guard lock(failed_mutex());
      if (!failed_work()) failed_work() = std::current_exception();
    }
  }
}

const DriverApi& api() {
  const DriverApi& a = driver();
  if (a.cuLaunchHostFunc == nullptr) {
    throw CudaError(CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED",
                    "the driver has no cuLaunchHostFunc, which the emulated device backend needs");
  }
  return a;
}

/// Queues @p run on @p stream. With @p error, an exception of the work lands there (for a call
/// that waits for the stream and rethrows it); without, in failed_work().
void queue(const char* what, CUstream stream, std::function<void()> run,
           std::shared_ptr<std::exception_ptr> error = nullptr) {
  const DriverApi& a = api();
  (void)bind_current_device();
  auto work = std::make_unique<HostWork>(HostWork{std::move(run), std::move(error)});
  const CUresult r = a.cuLaunchHostFunc(stream, &run_host_work, work.get());
  if (r != CUDA_SUCCESS) throw_cuda_error(r, what, __FILE__, __LINE__);
  (void)work.release();  // run_host_work owns it now
}

/// Copies @p bytes of device memory at @p src to @p dst on @p stream and waits for the stream;
/// then rethrows what the work before it raised.
void read_back(const char* what, void* dst, const void* src, std::size_t bytes, CUstream stream,
               const std::shared_ptr<std::exception_ptr>& error) {
  const DriverApi& a = api();
  VSR_CU_TRY(a.cuMemcpyDtoHAsync(dst, to_device_ptr(src), bytes, stream));
  const CUresult r = a.cuStreamSynchronize(stream);
  if (r != CUDA_SUCCESS) throw_cuda_error(r, what, __FILE__, __LINE__);
  if (*error) std::rethrow_exception(*error);
}

}  // namespace

void take_failed_work() {
  std::exception_ptr e;
  {
    std::lock_guard lock(failed_mutex());
    std::swap(e, failed_work());
  }
  if (e) std::rethrow_exception(e);
}

void statistics(const void* in, DType dtype, Layout layout, NodataSpec nodata, BandStatistics* out,
                CUstream stream) {
  const auto bands = static_cast<std::size_t>(layout.bands);
  PoolBuffer result(sizeof(BandStatistics) * bands, stream);
  auto error = std::make_shared<std::exception_ptr>();
  auto* d_result = result.as<BandStatistics>();
  queue(
      "statistics: cuLaunchHostFunc", stream,
      [=] { host::statistics(in, dtype, layout, nodata, d_result, stream); }, error);
  read_back("statistics: reading the results back", out, d_result, result.size(), stream, error);
}

void rescale(const void* in, DType dtype, void* out, DType out_dtype, std::int64_t n,
             NodataSpec nodata, RescaleParams params, CUstream stream) {
  queue("rescale: cuLaunchHostFunc", stream,
        [=] { host::rescale(in, dtype, out, out_dtype, n, nodata, params, stream); });
}

void clip(const void* in, DType dtype, void* out, std::int64_t n, NodataSpec nodata, double lower,
          double upper, CUstream stream) {
  queue("clip: cuLaunchHostFunc", stream,
        [=] { host::clip(in, dtype, out, n, nodata, lower, upper, stream); });
}

void fill_nodata(const void* in, DType dtype, void* out, std::int64_t n, NodataSpec nodata,
                 double value, CUstream stream) {
  queue("fill_nodata: cuLaunchHostFunc", stream,
        [=] { host::fill_nodata(in, dtype, out, n, nodata, value, stream); });
}

void normalized_difference(const void* a, const void* b, DType dtype, void* out, std::int64_t n,
                           NodataSpec nodata_a, NodataSpec nodata_b, CUstream stream) {
  queue("normalized_difference: cuLaunchHostFunc", stream,
        [=] { host::normalized_difference(a, b, dtype, out, n, nodata_a, nodata_b, stream); });
}

void histogram(const void* in, DType dtype, Layout layout, NodataSpec nodata, int bins,
               double lower, double upper, std::int64_t* counts, CUstream stream) {
  const std::size_t total = static_cast<std::size_t>(layout.bands) * static_cast<std::size_t>(bins);
  PoolBuffer hist(sizeof(std::int64_t) * total, stream);
  auto error = std::make_shared<std::exception_ptr>();
  auto* d_hist = hist.as<std::int64_t>();
  queue(
      "histogram: cuLaunchHostFunc", stream,
      [=] { host::histogram(in, dtype, layout, nodata, bins, lower, upper, d_hist, stream); },
      error);
  read_back("histogram: reading the counts back", counts, d_hist, hist.size(), stream, error);
}

void focal_mean_3x3(const void* in, DType dtype, void* out, Layout layout, NodataSpec nodata,
                    EdgeMode edge, CUstream stream) {
  queue("focal_mean_3x3: cuLaunchHostFunc", stream,
        [=] { host::focal_mean_3x3(in, dtype, out, layout, nodata, edge, stream); });
}

void calc(const CalcLaunch& launch, CUstream stream) {
  // The tables go to the device in one copy, as the CUDA backend sends them; the work reads them
  // there. The emulator reads the source of an asynchronous copy when the copy runs, so the host
  // buffer lives until the work after it has run.
  auto packed = std::make_shared<const CalcTables>(launch);
  PoolBuffer tables(packed->bytes.size(), stream);
  VSR_CU_TRY(api().cuMemcpyHtoDAsync(to_device_ptr(tables.get()), packed->bytes.data(),
                                     packed->bytes.size(), stream));
  const CalcLaunch on_device = packed->at(launch, tables.get());
  try {
    queue("calc: cuLaunchHostFunc", stream,
          [on_device, packed, stream] { host::calc(on_device, stream); });
  } catch (...) {
    // The copy is queued and reads `packed` when it runs: wait for it before `packed` goes.
    (void)api().cuStreamSynchronize(stream);
    throw;
  }
}

}  // namespace vibespatial::raster::detail::ops::emulated
