// SPDX-License-Identifier: Apache-2.0
// The one seam between vibespatial-raster and the CUDA driver.
//
// The driver library (VIBESPATIAL_CUDA_DRIVER, default libcuda.so.1) is dlopen'ed once it can
// be, and every entry point is resolved with cuGetProcAddress_v2 at a pinned ABI version, so the
// same binary runs against any driver >= those versions, against the host emulator, and starts
// on machines with no driver at all. Until the driver starts (cuInit, a device), each use tries
// again: nothing of a failed start is kept. Nothing else in the project calls libcuda.
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

/// What the library needs an entry point for, which decides what its absence means.
enum class EntryKind {
  required,  ///< the library cannot work without it: a driver lacking it is not loaded
  vmm,       ///< virtual memory management (tiers A/B): absent means "no VMM" (has_vmm())
  optional,  ///< a feature that checks for it (tier C, stream-ordered allocation) or only the
             ///< tests and benchmarks use it; null when the driver lacks it
};

// Every entry point the library resolves, once: X(name, pinned ABI version, kind). The PFN type
// is PFN_<name>_v<version> from cudaTypedefs.h, and cuGetProcAddress_v2 returns the newest ABI
// introduced at or before that version (docs/cuda-driver-rules.md §2.2).
#define VSR_DRIVER_ENTRIES(X)                     \
  X(cuInit, 2000, required)                       \
  X(cuDriverGetVersion, 2020, required)           \
  X(cuDeviceGet, 2000, required)                  \
  X(cuDeviceGetCount, 2000, required)             \
  X(cuDeviceGetAttribute, 2000, required)         \
  X(cuDeviceGetName, 2000, required)              \
  X(cuDevicePrimaryCtxRetain, 7000, required)     \
  X(cuDevicePrimaryCtxRelease, 11000, required)   \
  X(cuCtxSetCurrent, 4000, required)              \
  X(cuCtxGetCurrent, 4000, required)              \
  X(cuCtxGetDevice, 2000, required)               \
  X(cuCtxSynchronize, 2000, required)             \
  X(cuMemGetInfo, 3020, required)                 \
  X(cuMemAlloc, 3020, required)                   \
  X(cuMemFree, 3020, required)                    \
  X(cuMemHostAlloc, 2020, required)               \
  X(cuMemFreeHost, 2000, required)                \
  X(cuMemGetAddressRange, 3020, required)         \
  X(cuMemcpyHtoD, 3020, required)                 \
  X(cuMemcpyDtoH, 3020, required)                 \
  X(cuMemcpyDtoD, 3020, required)                 \
  X(cuMemcpyHtoDAsync, 3020, required)            \
  X(cuMemcpyDtoHAsync, 3020, required)            \
  X(cuMemcpyDtoDAsync, 3020, required)            \
  X(cuStreamCreate, 2000, required)               \
  X(cuStreamSynchronize, 2000, required)          \
  X(cuStreamQuery, 2000, required)                \
  X(cuStreamDestroy, 4000, required)              \
  X(cuStreamWaitEvent, 3020, required)            \
  X(cuEventCreate, 2000, required)                \
  X(cuEventRecord, 2000, required)                \
  X(cuEventQuery, 2000, required)                 \
  X(cuEventSynchronize, 2000, required)           \
  X(cuEventDestroy, 4000, required)               \
  X(cuGetErrorName, 6000, required)               \
  X(cuGetErrorString, 6000, required)             \
  X(cuMemGetAllocationGranularity, 10020, vmm)    \
  X(cuMemAddressReserve, 10020, vmm)              \
  X(cuMemAddressFree, 10020, vmm)                 \
  X(cuMemCreate, 10020, vmm)                      \
  X(cuMemRelease, 10020, vmm)                     \
  X(cuMemMap, 10020, vmm)                         \
  X(cuMemUnmap, 10020, vmm)                       \
  X(cuMemSetAccess, 10020, vmm)                   \
  X(cuMemRetainAllocationHandle, 11000, optional) \
  X(cuMemAllocManaged, 6000, optional)            \
  X(cuMemAllocAsync, 11020, optional)             \
  X(cuMemFreeAsync, 11020, optional)              \
  X(cuMemsetD8, 3020, optional)                   \
  X(cuMemsetD8Async, 3020, optional)              \
  X(cuLaunchHostFunc, 10000, optional)

/// The resolved entry points, one member per VSR_DRIVER_ENTRIES row, named as the driver names
/// them. Optional and VMM entries are null when the driver lacks them.
struct DriverApi {
#define VSR_DRIVER_MEMBER(name, version, kind) PFN_##name##_v##version name = nullptr;
  VSR_DRIVER_ENTRIES(VSR_DRIVER_MEMBER)
#undef VSR_DRIVER_MEMBER

  /// True when every VMM entry point resolved.
  bool has_vmm() const noexcept;
};

/// How one start of the driver went. Immutable once returned, and never freed: a reference to
/// it stays valid for the life of the process, also after a later start replaced it.
struct DriverState {
  bool available =
      false;            ///< library loaded, required entry points resolved, cuInit ok, >= 1 device
  int result = 0;       ///< CUresult explaining unavailability (CUDA_ERROR_NO_DEVICE if no library)
  std::string library;  ///< what was dlopen'ed (or failed to be)
  std::string reason;   ///< human-readable cause when unavailable
  bool emulated = false;  ///< the library exports the emulator's vsr_emu_* query functions
  int driver_version = 0;
  int device_count = 0;
  /// No later start can change it: the driver is available, or the library that loaded lacks
  /// what the runtime needs (cuGetProcAddress_v2, a required entry point).
  bool settled = false;
  DriverApi api;
};

/// The driver's state, starting it first unless a start already settled it. A failed start is
/// not kept: each call after one starts the driver again: cuInit and the device count are
/// called again, and a library that could not be loaded is looked for again (the
/// VIBESPATIAL_CUDA_DRIVER named then). A library that loaded is kept, with its entry points,
/// and never dlopen'ed again. Thread-safe: racing callers see one state (a call that waited for
/// another thread's start takes its outcome); repeated failures alike return one state object.
/// Never throws.
const DriverState& driver_state() noexcept;

/// The resolved entry points (driver_state(), so a failed start is tried again). Throws
/// DriverUnavailableError, saying why, when there is no usable driver.
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
