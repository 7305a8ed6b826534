// SPDX-License-Identifier: Apache-2.0
// Shared helpers of the emulator self-tests: the driver loaded the way the runtime loads it
// (dlopen of $VIBESPATIAL_CUDA_DRIVER, then cuGetProcAddress_v2 at pinned versions), the
// emulator's control API, and small VMM helpers.
#pragma once

#include "outstanding_checks.hpp"
#include "vsr_emulator.h"

#include <cuda.h>

#include <doctest/doctest.h>

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace vsr_emu_test {

using GetProc = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);

// Every entry point the tests use, resolved at the versions the runtime pins.
struct Driver {
  void* lib = nullptr;
  GetProc get_proc = nullptr;
  decltype(&::cuInit) init = nullptr;
  decltype(&::cuDriverGetVersion) driver_get_version = nullptr;
  decltype(&::cuDeviceGetCount) device_get_count = nullptr;
  decltype(&::cuDeviceGetAttribute) device_get_attribute = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) primary_retain = nullptr;
  decltype(&::cuDevicePrimaryCtxRelease) primary_release = nullptr;
  decltype(&::cuCtxSetCurrent) ctx_set_current = nullptr;
  decltype(&::cuCtxGetCurrent) ctx_get_current = nullptr;
  decltype(&::cuCtxGetDevice) ctx_get_device = nullptr;
  decltype(&::cuCtxSynchronize) ctx_synchronize = nullptr;
  decltype(&::cuMemGetInfo) mem_get_info = nullptr;
  decltype(&::cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&::cuMemAddressReserve) reserve = nullptr;
  decltype(&::cuMemAddressFree) address_free = nullptr;
  decltype(&::cuMemCreate) create = nullptr;
  decltype(&::cuMemRelease) release = nullptr;
  decltype(&::cuMemMap) map = nullptr;
  decltype(&::cuMemUnmap) unmap = nullptr;
  decltype(&::cuMemSetAccess) set_access = nullptr;
  decltype(&::cuMemGetAccess) get_access = nullptr;
  decltype(&::cuMemRetainAllocationHandle) retain_handle = nullptr;
  decltype(&::cuMemGetAllocationPropertiesFromHandle) props_from_handle = nullptr;
  decltype(&::cuMemGetAddressRange) address_range = nullptr;
  decltype(&::cuMemAlloc) alloc = nullptr;
  decltype(&::cuMemFree) free = nullptr;
  decltype(&::cuMemAllocManaged) alloc_managed = nullptr;
  decltype(&::cuMemAllocAsync) alloc_async = nullptr;
  decltype(&::cuMemFreeAsync) free_async = nullptr;
  decltype(&::cuMemHostAlloc) host_alloc = nullptr;
  decltype(&::cuMemFreeHost) free_host = nullptr;
  decltype(&::cuMemcpyHtoD) htod = nullptr;
  decltype(&::cuMemcpyDtoH) dtoh = nullptr;
  decltype(&::cuMemcpyDtoD) dtod = nullptr;
  decltype(&::cuMemcpyHtoDAsync) htod_async = nullptr;
  decltype(&::cuMemcpyDtoHAsync) dtoh_async = nullptr;
  decltype(&::cuMemsetD8) memset8 = nullptr;
  decltype(&::cuMemsetD32Async) memset32_async = nullptr;
  decltype(&::cuMemsetD8Async) memset8_async = nullptr;
  decltype(&::cuStreamCreate) stream_create = nullptr;
  decltype(&::cuStreamDestroy) stream_destroy = nullptr;
  decltype(&::cuStreamSynchronize) stream_synchronize = nullptr;
  decltype(&::cuStreamQuery) stream_query = nullptr;
  decltype(&::cuStreamWaitEvent) stream_wait_event = nullptr;
  decltype(&::cuLaunchHostFunc) launch_host_func = nullptr;
  decltype(&::cuEventCreate) event_create = nullptr;
  decltype(&::cuEventRecord) event_record = nullptr;
  decltype(&::cuEventQuery) event_query = nullptr;
  decltype(&::cuEventSynchronize) event_synchronize = nullptr;
  decltype(&::cuEventDestroy) event_destroy = nullptr;
  decltype(&::cuGetErrorName) error_name = nullptr;
  decltype(&::vsr_emu_query_outstanding) outstanding = nullptr;
  decltype(&::vsr_emu_set_fail) set_fail = nullptr;
  decltype(&::vsr_emu_call_count) call_count = nullptr;
  decltype(&::vsr_emu_fault_count) fault_count = nullptr;
  decltype(&::vsr_emu_set_option) set_option = nullptr;
  decltype(&::vsr_emu_stream_pause) stream_pause = nullptr;
  decltype(&::vsr_emu_describe) describe = nullptr;
  decltype(&::vsr_emu_waiting_threads) waiting_threads = nullptr;
  // Per-thread default stream forms (stream 0 = the calling thread's own stream).
  decltype(&::cuStreamQuery) stream_query_ptsz = nullptr;
  decltype(&::cuStreamSynchronize) stream_synchronize_ptsz = nullptr;
  decltype(&::cuEventRecord) event_record_ptsz = nullptr;
  decltype(&::cuMemsetD8) memset8_ptds = nullptr;

  template <typename F>
  void resolve(F*& out, const char* name, int version) {
    void* p = nullptr;
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    REQUIRE(get_proc(name, &p, version, 0, &status) == CUDA_SUCCESS);
    REQUIRE_MESSAGE(status == CU_GET_PROC_ADDRESS_SUCCESS, name);
    out = reinterpret_cast<F*>(p);
  }

  template <typename F>
  void resolve_ptds(F*& out, const char* name, int version) {
    void* p = nullptr;
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    REQUIRE(get_proc(name, &p, version, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status) ==
            CUDA_SUCCESS);
    REQUIRE_MESSAGE(status == CU_GET_PROC_ADDRESS_SUCCESS, name);
    out = reinterpret_cast<F*>(p);
  }

  template <typename F>
  void symbol(F*& out, const char* name) {
    out = reinterpret_cast<F*>(dlsym(lib, name));
    REQUIRE_MESSAGE((out != nullptr), name);
  }

  Driver() {
    const char* path = std::getenv("VIBESPATIAL_CUDA_DRIVER");
    REQUIRE_MESSAGE(path != nullptr, "VIBESPATIAL_CUDA_DRIVER is not set");
    lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    REQUIRE_MESSAGE(lib != nullptr, dlerror());
    symbol(get_proc, "cuGetProcAddress_v2");
    resolve(init, "cuInit", 2000);
    resolve(driver_get_version, "cuDriverGetVersion", 2020);
    resolve(device_get_count, "cuDeviceGetCount", 2000);
    resolve(device_get_attribute, "cuDeviceGetAttribute", 2000);
    resolve(primary_retain, "cuDevicePrimaryCtxRetain", 7000);
    resolve(primary_release, "cuDevicePrimaryCtxRelease", 11000);
    resolve(ctx_set_current, "cuCtxSetCurrent", 4000);
    resolve(ctx_get_current, "cuCtxGetCurrent", 4000);
    resolve(ctx_get_device, "cuCtxGetDevice", 2000);
    resolve(ctx_synchronize, "cuCtxSynchronize", 2000);
    resolve(mem_get_info, "cuMemGetInfo", 3020);
    resolve(granularity, "cuMemGetAllocationGranularity", 10020);
    resolve(reserve, "cuMemAddressReserve", 10020);
    resolve(address_free, "cuMemAddressFree", 10020);
    resolve(create, "cuMemCreate", 10020);
    resolve(release, "cuMemRelease", 10020);
    resolve(map, "cuMemMap", 10020);
    resolve(unmap, "cuMemUnmap", 10020);
    resolve(set_access, "cuMemSetAccess", 10020);
    resolve(get_access, "cuMemGetAccess", 10020);
    resolve(retain_handle, "cuMemRetainAllocationHandle", 11000);
    resolve(props_from_handle, "cuMemGetAllocationPropertiesFromHandle", 10020);
    resolve(address_range, "cuMemGetAddressRange", 3020);
    resolve(alloc, "cuMemAlloc", 3020);
    resolve(free, "cuMemFree", 3020);
    resolve(alloc_managed, "cuMemAllocManaged", 6000);
    resolve(alloc_async, "cuMemAllocAsync", 11020);
    resolve(free_async, "cuMemFreeAsync", 11020);
    resolve(host_alloc, "cuMemHostAlloc", 2020);
    resolve(free_host, "cuMemFreeHost", 2000);
    resolve(htod, "cuMemcpyHtoD", 3020);
    resolve(dtoh, "cuMemcpyDtoH", 3020);
    resolve(dtod, "cuMemcpyDtoD", 3020);
    resolve(htod_async, "cuMemcpyHtoDAsync", 3020);
    resolve(dtoh_async, "cuMemcpyDtoHAsync", 3020);
    resolve(memset8, "cuMemsetD8", 3020);
    resolve(memset32_async, "cuMemsetD32Async", 3020);
    resolve(memset8_async, "cuMemsetD8Async", 3020);
    resolve(stream_create, "cuStreamCreate", 2000);
    resolve(stream_destroy, "cuStreamDestroy", 4000);
    resolve(stream_synchronize, "cuStreamSynchronize", 2000);
    resolve(stream_query, "cuStreamQuery", 2000);
    resolve(stream_wait_event, "cuStreamWaitEvent", 3020);
    resolve(launch_host_func, "cuLaunchHostFunc", 10000);
    resolve(event_create, "cuEventCreate", 2000);
    resolve(event_record, "cuEventRecord", 2000);
    resolve(event_query, "cuEventQuery", 2000);
    resolve(event_synchronize, "cuEventSynchronize", 2000);
    resolve(event_destroy, "cuEventDestroy", 4000);
    resolve(error_name, "cuGetErrorName", 6000);
    symbol(outstanding, "vsr_emu_query_outstanding");
    symbol(set_fail, "vsr_emu_set_fail");
    symbol(call_count, "vsr_emu_call_count");
    symbol(fault_count, "vsr_emu_fault_count");
    symbol(set_option, "vsr_emu_set_option");
    symbol(stream_pause, "vsr_emu_stream_pause");
    symbol(describe, "vsr_emu_describe");
    // Optional, so that the cases which do not need it also run against an older emulator.
    waiting_threads =
        reinterpret_cast<decltype(waiting_threads)>(dlsym(lib, "vsr_emu_waiting_threads"));
    resolve_ptds(stream_query_ptsz, "cuStreamQuery", 7000);
    resolve_ptds(stream_synchronize_ptsz, "cuStreamSynchronize", 7000);
    resolve_ptds(event_record_ptsz, "cuEventRecord", 7000);
    resolve_ptds(memset8_ptds, "cuMemsetD8", 7000);
  }

  std::string name(CUresult r) const {
    const char* s = nullptr;
    return error_name(r, &s) == CUDA_SUCCESS ? s : std::to_string(static_cast<int>(r));
  }
};

inline Driver& drv() {
  static Driver d;
  return d;
}

// Asserts by error name so failures read well (§9: compare names, not strings).
#define CHECK_CU(call, expected) CHECK(drv().name(call) == drv().name(expected))
#define REQUIRE_CU(call) REQUIRE(drv().name(call) == "CUDA_SUCCESS")

inline int device_count() {
  int n = 0;
  REQUIRE_CU(drv().device_get_count(&n));
  return n;
}

// cuInit once; the primary context of `dev` is retained and current on the calling thread.
inline CUcontext use_device(int dev = 0) {
  Driver& d = drv();
  static std::once_flag once;
  std::call_once(once, [&] { REQUIRE_CU(d.init(0)); });
  CUcontext ctx = nullptr;
  REQUIRE_CU(d.primary_retain(&ctx, dev));
  REQUIRE_CU(d.ctx_set_current(ctx));
  // One retain per thread and device is enough for these tests: drop the extra ones.
  static thread_local std::vector<int> retained;
  if (std::find(retained.begin(), retained.end(), dev) != retained.end()) {
    REQUIRE_CU(d.primary_release(dev));
  } else {
    retained.push_back(dev);
  }
  return ctx;
}

inline CUmemAllocationProp device_prop(int dev = 0) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  return prop;
}

inline CUmemAccessDesc access(int dev,
                              CUmemAccess_flags flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
  CUmemAccessDesc desc{};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = dev;
  desc.flags = flags;
  return desc;
}

inline size_t min_granularity() {
  size_t g = 0;
  CUmemAllocationProp prop = device_prop();
  REQUIRE_CU(drv().granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  return g;
}

inline size_t free_bytes() {
  size_t f = 0;
  size_t t = 0;
  REQUIRE_CU(drv().mem_get_info(&f, &t));
  return f;
}

inline vsr_emu_outstanding outstanding(int dev = -1) {
  vsr_emu_outstanding o{};
  REQUIRE(drv().outstanding(&o, dev) == CUDA_SUCCESS);
  return o;
}

inline void check_nothing_outstanding() {
  const vsr_emu_outstanding o = outstanding();
  check_no_device_memory(o);
  CHECK(o.host_allocations == 0);
  CHECK(o.streams == 0);
  CHECK(o.events == 0);
}

// A reserved, mapped, read-write range of `size` bytes (one handle).
struct Mapped {
  CUdeviceptr va = 0;
  size_t size = 0;
  CUmemGenericAllocationHandle handle = 0;

  Mapped(size_t bytes, int dev = 0) : size(bytes) {
    Driver& d = drv();
    CUmemAllocationProp prop = device_prop(dev);
    REQUIRE_CU(d.create(&handle, size, &prop, 0));
    REQUIRE_CU(d.reserve(&va, size, 0, 0, 0));
    REQUIRE_CU(d.map(va, size, 0, handle, 0));
    CUmemAccessDesc rw = access(dev);
    REQUIRE_CU(d.set_access(va, size, &rw, 1));
  }
  ~Mapped() {
    Driver& d = drv();
    CHECK_CU(d.unmap(va, size), CUDA_SUCCESS);
    CHECK_CU(d.release(handle), CUDA_SUCCESS);
    CHECK_CU(d.address_free(va, size), CUDA_SUCCESS);
  }
  Mapped(const Mapped&) = delete;
  Mapped& operator=(const Mapped&) = delete;
};

// Sets emulator options for one scope and puts each back to its environment value at exit.
class Options {
 public:
  Options() = default;
  Options(const Options&) = delete;
  Options& operator=(const Options&) = delete;
  ~Options() {
    for (auto it = names_.rbegin(); it != names_.rend(); ++it) {
      CHECK_MESSAGE(drv().set_option(it->c_str(), "default") == 0, *it);
    }
  }
  Options& set(const char* name, const char* value) {
    REQUIRE_MESSAGE(drv().set_option(name, value) == 0, name);
    names_.emplace_back(name);
    return *this;
  }

 private:
  std::vector<std::string> names_;
};

}  // namespace vsr_emu_test
