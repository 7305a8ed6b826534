// SPDX-License-Identifier: Apache-2.0
// The one seam between vibespatial-raster and the CUDA driver.
//
// The driver library (VIBESPATIAL_CUDA_DRIVER, default libcuda.so.1) is dlopen'ed once, and
// every entry point is resolved with cuGetProcAddress_v2 at a pinned ABI version, so the same
// binary runs against any driver >= those versions, against the host emulator, and starts on
// machines with no driver at all. Nothing else in the project calls libcuda.
//
// Contexts: the runtime works in each device's primary context (the one the CUDA runtime uses),
// so memory from the pool is valid for Thrust, CUB and user kernels in the same process. The
// seam retains a device's primary context the first time it is needed and keeps it for the life
// of the process.
#pragma once

#include <vibespatial/raster/errors.hpp>

#include <cuda.h>
#include <cudaTypedefs.h>

#include <string>

namespace vibespatial::raster::detail {

/// Entry points, each resolved at the ABI version in its name. Optional ones are null when the
/// driver lacks them (the features that need them are then reported unsupported).
struct DriverApi {
  // Required.
  PFN_cuInit_v2000 cuInit = nullptr;
  PFN_cuDriverGetVersion_v2020 cuDriverGetVersion = nullptr;
  PFN_cuDeviceGet_v2000 cuDeviceGet = nullptr;
  PFN_cuDeviceGetCount_v2000 cuDeviceGetCount = nullptr;
  PFN_cuDeviceGetAttribute_v2000 cuDeviceGetAttribute = nullptr;
  PFN_cuDeviceGetName_v2000 cuDeviceGetName = nullptr;
  PFN_cuDevicePrimaryCtxRetain_v7000 cuDevicePrimaryCtxRetain = nullptr;
  PFN_cuDevicePrimaryCtxRelease_v11000 cuDevicePrimaryCtxRelease = nullptr;
  PFN_cuCtxSetCurrent_v4000 cuCtxSetCurrent = nullptr;
  PFN_cuCtxGetCurrent_v4000 cuCtxGetCurrent = nullptr;
  PFN_cuCtxGetDevice_v2000 cuCtxGetDevice = nullptr;
  PFN_cuCtxSynchronize_v2000 cuCtxSynchronize = nullptr;
  PFN_cuMemGetInfo_v3020 cuMemGetInfo = nullptr;
  PFN_cuMemAlloc_v3020 cuMemAlloc = nullptr;
  PFN_cuMemFree_v3020 cuMemFree = nullptr;
  PFN_cuMemHostAlloc_v2020 cuMemHostAlloc = nullptr;
  PFN_cuMemFreeHost_v2000 cuMemFreeHost = nullptr;
  PFN_cuMemcpyHtoD_v3020 cuMemcpyHtoD = nullptr;
  PFN_cuMemcpyDtoH_v3020 cuMemcpyDtoH = nullptr;
  PFN_cuMemcpyDtoD_v3020 cuMemcpyDtoD = nullptr;
  PFN_cuMemcpyHtoDAsync_v3020 cuMemcpyHtoDAsync = nullptr;
  PFN_cuMemcpyDtoHAsync_v3020 cuMemcpyDtoHAsync = nullptr;
  PFN_cuMemcpyDtoDAsync_v3020 cuMemcpyDtoDAsync = nullptr;
  PFN_cuMemsetD8_v3020 cuMemsetD8 = nullptr;
  PFN_cuMemsetD8Async_v3020 cuMemsetD8Async = nullptr;
  PFN_cuStreamCreate_v2000 cuStreamCreate = nullptr;
  PFN_cuStreamSynchronize_v2000 cuStreamSynchronize = nullptr;
  PFN_cuStreamQuery_v2000 cuStreamQuery = nullptr;
  PFN_cuStreamDestroy_v4000 cuStreamDestroy = nullptr;
  PFN_cuStreamWaitEvent_v3020 cuStreamWaitEvent = nullptr;
  PFN_cuEventCreate_v2000 cuEventCreate = nullptr;
  PFN_cuEventRecord_v2000 cuEventRecord = nullptr;
  PFN_cuEventQuery_v2000 cuEventQuery = nullptr;
  PFN_cuEventSynchronize_v2000 cuEventSynchronize = nullptr;
  PFN_cuEventDestroy_v4000 cuEventDestroy = nullptr;
  PFN_cuGetErrorName_v6000 cuGetErrorName = nullptr;
  PFN_cuGetErrorString_v6000 cuGetErrorString = nullptr;
  // Optional: virtual memory management (tiers A/B).
  PFN_cuMemGetAllocationGranularity_v10020 cuMemGetAllocationGranularity = nullptr;
  PFN_cuMemAddressReserve_v10020 cuMemAddressReserve = nullptr;
  PFN_cuMemAddressFree_v10020 cuMemAddressFree = nullptr;
  PFN_cuMemCreate_v10020 cuMemCreate = nullptr;
  PFN_cuMemRelease_v10020 cuMemRelease = nullptr;
  PFN_cuMemMap_v10020 cuMemMap = nullptr;
  PFN_cuMemUnmap_v10020 cuMemUnmap = nullptr;
  PFN_cuMemSetAccess_v10020 cuMemSetAccess = nullptr;
  PFN_cuMemRetainAllocationHandle_v11000 cuMemRetainAllocationHandle = nullptr;
  // Optional: managed memory (tier C) and stream-ordered allocation (benchmarks).
  PFN_cuMemAllocManaged_v6000 cuMemAllocManaged = nullptr;
  PFN_cuMemAllocAsync_v11020 cuMemAllocAsync = nullptr;
  PFN_cuMemFreeAsync_v11020 cuMemFreeAsync = nullptr;

  /// True when every VMM entry point resolved.
  bool has_vmm() const noexcept;
};

/// How loading went. Filled once; immutable afterwards.
struct DriverState {
  bool available =
      false;            ///< library loaded, required entry points resolved, cuInit ok, >= 1 device
  int result = 0;       ///< CUresult explaining unavailability (CUDA_ERROR_NO_DEVICE if no library)
  std::string library;  ///< what was dlopen'ed
  std::string reason;   ///< human-readable cause when unavailable
  bool emulated = false;  ///< the library exports the emulator's vsr_emu_* query functions
  int driver_version = 0;
  int device_count = 0;
  DriverApi api;
};

/// Loads the driver on first call (thread-safe, once per process) and returns its state.
/// Never throws.
const DriverState& driver_state() noexcept;

/// The resolved entry points. Throws DriverUnavailableError, saying why, when there is no
/// usable driver.
const DriverApi& driver();

/// A host-visible pointer value as the driver's device pointer type.
inline CUdeviceptr to_device_ptr(const void* p) noexcept {
  return reinterpret_cast<CUdeviceptr>(p);
}

/// The CUresult's enumerator name, via the driver when loaded, else "CUresult(<n>)".
std::string cu_result_name(CUresult result);

/// Throws CudaError for `result`, naming the failed expression and source location.
[[noreturn]] void throw_cuda_error(CUresult result, const char* expression, const char* file,
                                   int line);

/// Makes sure the calling thread has a current context, binding device 0's primary context if it
/// has none, and returns the device of the current context. Throws CudaError.
int bind_current_device();

/// Retains (once per process) and returns `device`'s primary context. Throws CudaError.
CUcontext primary_context(int device);

/// RAII: makes `device`'s primary context current on this thread for the scope, restoring the
/// previous one afterwards. Throws CudaError from the constructor only.
class ScopedDeviceContext {
 public:
  explicit ScopedDeviceContext(int device);
  ~ScopedDeviceContext();
  ScopedDeviceContext(const ScopedDeviceContext&) = delete;
  ScopedDeviceContext& operator=(const ScopedDeviceContext&) = delete;

 private:
  CUcontext previous_ = nullptr;
  bool changed_ = false;
};

}  // namespace vibespatial::raster::detail

/// Calls a driver entry point and throws CudaError (with the CUresult name, the expression, file
/// and line) when it fails. Usage: `VSR_CU_TRY(api.cuMemCreate(&handle, size, &prop, 0));`
#define VSR_CU_TRY(call)                                                                   \
  do {                                                                                     \
    const CUresult vsr_cu_try_result_ = (call);                                            \
    if (vsr_cu_try_result_ != CUDA_SUCCESS) {                                              \
      ::vibespatial::raster::detail::throw_cuda_error(vsr_cu_try_result_, #call, __FILE__, \
                                                      __LINE__);                           \
    }                                                                                      \
  } while (0)

/// Checks a precondition of a public call; throws std::invalid_argument with `message`.
#define VSR_EXPECTS(cond, message)                                  \
  do {                                                              \
    if (!(cond)) throw std::invalid_argument(std::string(message)); \
  } while (0)
