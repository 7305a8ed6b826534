// SPDX-License-Identifier: Apache-2.0
// The checks around a device operation's work (device_work.hpp).
#include "ops/device_work.hpp"

#include "driver/cuda_driver.hpp"
#include "ops/ops_backend.hpp"

#include <vibespatial/raster/errors.hpp>

#include <atomic>
#include <string>

namespace vibespatial::raster::detail::ops {

namespace {

/// The last operation whose device work was queued without a wait for it, for the message of a
/// fault found later (a string literal).
std::atomic<const char*> g_last_queued{nullptr};

/// A CudaError for @p r found by @p call, saying @p what in words.
[[noreturn]] void device_fault(CUresult r, const char* call, const std::string& what) {
  const std::string name = cu_result_name(r);
  const char* text = nullptr;
  const DriverState& s = driver_state();
  if (s.api.cuGetErrorString != nullptr) (void)s.api.cuGetErrorString(r, &text);
  throw CudaError(static_cast<int>(r), name,
                  what + " (" + name + " from " + call + (text != nullptr ? ": " : "") +
                      (text != nullptr ? text : "") + ")");
}

}  // namespace

void before_device_work(const char* op, CUstream stream, Work work) {
  if (emulated_device()) emulated::take_failed_work();
  const DriverApi& api = driver();
  CUresult r = CUDA_SUCCESS;
  const char* call = work == Work::waited ? "cuStreamSynchronize" : "cuStreamQuery";
  try {
    (void)bind_current_device();
    r = work == Work::waited ? api.cuStreamSynchronize(stream) : api.cuStreamQuery(stream);
  } catch (const CudaError& e) {
    // A sticky error (7xx) of the context: earlier work faulted, found by the context's calls.
    if (e.code() < 700 || e.code() > 799) throw;
    r = static_cast<CUresult>(e.code());
    call = "cuCtxGetDevice";
  }
  if (r == CUDA_SUCCESS || r == CUDA_ERROR_NOT_READY) return;
  const char* last = g_last_queued.load();
  device_fault(
      r, call,
      std::string("device work queued before it failed") +
          (last != nullptr ? std::string(": the last operation queued on the device was ") + last
                           : std::string()) +
          "; " + op + " queued nothing");
}

void after_device_work(const char* op, CUstream stream, Work work) {
  if (work == Work::waited) return;
  const CUresult r = driver().cuStreamQuery(stream);
  if (r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_READY) {
    device_fault(r, "cuStreamQuery",
                 std::string("its work (or work queued just before it on another stream) failed"));
  }
  g_last_queued.store(op);
}

bool emulated_device() {
  const DriverState& s = driver_state();
  return s.available && s.emulated;
}

}  // namespace vibespatial::raster::detail::ops
