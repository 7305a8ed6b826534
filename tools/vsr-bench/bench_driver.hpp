// SPDX-License-Identifier: Apache-2.0
// vsr-bench's own handle on the CUDA driver: test-only, for the benchmark's raw-driver contenders
// (cuMemAlloc / cuMemAllocAsync against the pool) and its copies. The library's public API gives
// the pool and the rasters, not the driver; the bench links the shared library as users do and
// opens the driver library the runtime opened (driver_info().library), so both share one driver
// and one primary context. Nothing here is part of the library.
#pragma once

#include <vibespatial/raster/driver.hpp>

#include <cuda.h>

#include <dlfcn.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace vsr_bench {

// X(member, exported symbol): the driver entry points the bench calls.
#define VSR_BENCH_DRIVER_ENTRIES(X)                     \
  X(cuGetErrorName, cuGetErrorName)                     \
  X(cuDeviceGet, cuDeviceGet)                           \
  X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain) \
  X(cuCtxSetCurrent, cuCtxSetCurrent)                   \
  X(cuCtxGetCurrent, cuCtxGetCurrent)                   \
  X(cuCtxSynchronize, cuCtxSynchronize)                 \
  X(cuMemGetInfo, cuMemGetInfo_v2)                      \
  X(cuMemAlloc, cuMemAlloc_v2)                          \
  X(cuMemFree, cuMemFree_v2)                            \
  X(cuMemAllocAsync, cuMemAllocAsync)                   \
  X(cuMemFreeAsync, cuMemFreeAsync)                     \
  X(cuMemHostAlloc, cuMemHostAlloc)                     \
  X(cuMemFreeHost, cuMemFreeHost)                       \
  X(cuMemcpyHtoD, cuMemcpyHtoD_v2)                      \
  X(cuMemcpyHtoDAsync, cuMemcpyHtoDAsync_v2)            \
  X(cuMemcpyDtoDAsync, cuMemcpyDtoDAsync_v2)            \
  X(cuStreamCreate, cuStreamCreate)                     \
  X(cuStreamDestroy, cuStreamDestroy_v2)                \
  X(cuStreamSynchronize, cuStreamSynchronize)

/// The entry points, each nullptr where the driver lacks it (cuMemAllocAsync on old drivers).
struct Driver {
#define VSR_BENCH_MEMBER(name, symbol) decltype(&::symbol) name = nullptr;
  VSR_BENCH_DRIVER_ENTRIES(VSR_BENCH_MEMBER)
#undef VSR_BENCH_MEMBER
};

/// The driver the library loaded, resolved once. Throws std::runtime_error when there is none.
inline const Driver& driver() {
  static const Driver api = [] {
    const vibespatial::raster::DriverInfo info = vibespatial::raster::driver_info();
    if (!info.available)
      throw std::runtime_error("vsr-bench: no usable CUDA driver: " + info.reason);
    void* lib = ::dlopen(info.library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) throw std::runtime_error("vsr-bench: cannot open " + info.library);
    Driver d;
#define VSR_BENCH_RESOLVE(name, symbol) \
  d.name = reinterpret_cast<decltype(d.name)>(::dlsym(lib, #symbol));
    VSR_BENCH_DRIVER_ENTRIES(VSR_BENCH_RESOLVE)
#undef VSR_BENCH_RESOLVE
    return d;  // the library stays open for the process
  }();
  return api;
}

/// The host driver emulator's count of calls to the pool's VMM entry points (cuMemCreate,
/// cuMemRelease, cuMemMap, cuMemUnmap, cuMemSetAccess) so far, or -1 on a real driver (which
/// counts nothing): vsr_emu_call_count, found in the driver library the library loaded.
inline long long emulator_vmm_calls() {
  using CallCount = unsigned long long (*)(const char*);
  static const CallCount count = []() -> CallCount {
    const vibespatial::raster::DriverInfo info = vibespatial::raster::driver_info();
    if (!info.available || !info.emulated) return nullptr;
    void* lib = ::dlopen(info.library.c_str(), RTLD_NOW | RTLD_LOCAL);
    return lib != nullptr ? reinterpret_cast<CallCount>(::dlsym(lib, "vsr_emu_call_count"))
                          : nullptr;
  }();
  if (count == nullptr) return -1;
  unsigned long long n = 0;
  for (const char* entry :
       {"cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemUnmap", "cuMemSetAccess"}) {
    n += count(entry);
  }
  return static_cast<long long>(n);
}

/// Sets a host driver emulator option (vsr_emu_set_option: "LATENCY", "DEVICE_MEMORY", ...;
/// "default" puts back what the environment gave). Returns its status, or -1 on a real driver.
inline int emulator_set_option(const char* name, const char* value) {
  using SetOption = int (*)(const char*, const char*);
  static const SetOption set = []() -> SetOption {
    const vibespatial::raster::DriverInfo info = vibespatial::raster::driver_info();
    if (!info.available || !info.emulated) return nullptr;
    void* lib = ::dlopen(info.library.c_str(), RTLD_NOW | RTLD_LOCAL);
    return lib != nullptr ? reinterpret_cast<SetOption>(::dlsym(lib, "vsr_emu_set_option"))
                          : nullptr;
  }();
  return set != nullptr ? set(name, value) : -1;
}

/// Throws std::runtime_error naming the call and the CUresult unless @p r is CUDA_SUCCESS.
inline void check(CUresult r, const char* call) {
  if (r == CUDA_SUCCESS) return;
  const char* name = nullptr;
  if (driver().cuGetErrorName != nullptr) driver().cuGetErrorName(r, &name);
  throw std::runtime_error(std::string(call) + " failed with " +
                           (name != nullptr ? name : "CUresult " + std::to_string(r)));
}

/// Makes device 0's primary context current on this thread if no context is (as the library's
/// calls do), so raw driver calls here run in the context the pool allocates in.
inline void bind_primary_context() {
  const Driver& api = driver();
  CUcontext current = nullptr;
  check(api.cuCtxGetCurrent(&current), "cuCtxGetCurrent");
  if (current != nullptr) return;
  CUdevice dev = 0;
  check(api.cuDeviceGet(&dev, 0), "cuDeviceGet");
  CUcontext primary = nullptr;
  check(api.cuDevicePrimaryCtxRetain(&primary, dev), "cuDevicePrimaryCtxRetain");
  check(api.cuCtxSetCurrent(primary), "cuCtxSetCurrent");
}

inline CUdeviceptr to_device_ptr(const void* p) {
  return static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p));
}

}  // namespace vsr_bench

/// Calls a driver entry point of vsr_bench::driver() and throws if it fails.
#define BENCH_CU_TRY(call) ::vsr_bench::check((call), #call)
