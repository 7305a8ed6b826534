// SPDX-License-Identifier: Apache-2.0
// Self-test of the host CUDA driver emulator. It loads the library the way the runtime does
// (dlopen of $VIBESPATIAL_CUDA_DRIVER, then cuGetProcAddress_v2 at pinned versions) and checks
// the rules of docs/cuda-driver-rules.md. Runs with 1 and with 2 emulated devices, inline, and
// with every adversarial mode on; the modes themselves are tested in test_modes.cpp.
#include "emulator_driver.hpp"
#include "vsr_emulator.h"

#include <cuda.h>

#include <doctest/doctest.h>

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using namespace vsr_emu_test;

TEST_CASE("emulator: rules before cuInit") {
  Driver& d = drv();
  int version = 0;
  CHECK_CU(d.driver_get_version(&version), CUDA_SUCCESS);
  CHECK(version == 13000);
  CUcontext ctx = reinterpret_cast<CUcontext>(0x1);
  CHECK_CU(d.ctx_get_current(&ctx), CUDA_ERROR_NOT_INITIALIZED);
  CHECK(ctx == reinterpret_cast<CUcontext>(0x1));  // §1.1: not written before cuInit
  int n = -1;
  CHECK_CU(d.device_get_count(&n), CUDA_ERROR_NOT_INITIALIZED);
  size_t g = 0;
  CUmemAllocationProp prop = device_prop();
  CHECK_CU(d.granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_ERROR_NOT_INITIALIZED);
  CHECK_CU(d.init(1), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(d.init(0), CUDA_SUCCESS);
  CHECK_CU(d.init(0), CUDA_SUCCESS);
}

TEST_CASE("emulator: cuGetProcAddress follows the per-version table") {
  Driver& d = drv();
  void* p = reinterpret_cast<void*>(1);
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
  CHECK_CU(d.get_proc("cuMemCreate", &p, 10010, 0, &status), CUDA_SUCCESS);
  CHECK(p == nullptr);
  CHECK(status == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  CHECK_CU(d.get_proc("cuNoSuchThing", &p, 12000, 0, &status), CUDA_SUCCESS);
  CHECK(status == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  CHECK_CU(d.get_proc("cuMemAlloc_v2", &p, 12000, 0, &status), CUDA_SUCCESS);
  CHECK(status == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  CHECK_CU(d.get_proc("cuMemAlloc", &p, 99990, 0, &status), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(d.get_proc(nullptr, &p, 12000, 0, nullptr), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(d.get_proc("cuMemAlloc", nullptr, 12000, 0, nullptr), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(d.get_proc("cuMemAlloc", &p, 12000, 4, nullptr), CUDA_ERROR_INVALID_VALUE);

  struct Case {
    const char* name;
    int version;
    cuuint64_t flags;
    const char* symbol;
  };
  const Case cases[] = {
      {"cuMemAlloc", 2000, 0, "cuMemAlloc"},
      {"cuMemAlloc", 3020, 0, "cuMemAlloc_v2"},
      {"cuMemAlloc", 12000, 0, "cuMemAlloc_v2"},
      {"cuCtxSynchronize", 12090, 0, "cuCtxSynchronize"},
      {"cuCtxSynchronize", 13000, 0, "cuCtxSynchronize_v2"},
      {"cuCtxGetDevice", 13000, 0, "cuCtxGetDevice_v2"},
      {"cuDevicePrimaryCtxRelease", 7000, 0, "cuDevicePrimaryCtxRelease"},
      {"cuDevicePrimaryCtxRelease", 11000, 0, "cuDevicePrimaryCtxRelease_v2"},
      {"cuMemRetainAllocationHandle", 12000, 0, "cuMemRetainAllocationHandle"},
      {"cuGetProcAddress", 11030, 0, "cuGetProcAddress"},
      {"cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"},
      {"cuMemcpyHtoD", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
       "cuMemcpyHtoD_v2_ptds"},
      {"cuMemcpyHtoD", 6000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemcpyHtoD_v2"},
      {"cuStreamSynchronize", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
       "cuStreamSynchronize_ptsz"},
      {"cuMemAllocAsync", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
       "cuMemAllocAsync_ptsz"},
      {"cuMemCreate", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemCreate"},
      {"cuStreamDestroy", 12000, 0, "cuStreamDestroy_v2"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    CAPTURE(c.version);
    p = nullptr;
    CHECK_CU(d.get_proc(c.name, &p, c.version, c.flags, &status), CUDA_SUCCESS);
    CHECK(status == CU_GET_PROC_ADDRESS_SUCCESS);
    CHECK(p == dlsym(d.lib, c.symbol));
  }
  // The old 4-argument ABI reports unresolvable names as NOT_FOUND.
  using GetProcV1 = CUresult (*)(const char*, void**, int, cuuint64_t);
  auto v1 = reinterpret_cast<GetProcV1>(dlsym(d.lib, "cuGetProcAddress"));
  REQUIRE((v1 != nullptr));
  CHECK_CU(v1("cuNoSuchThing", &p, 12000, 0), CUDA_ERROR_NOT_FOUND);
  CHECK_CU(v1("cuMemMap", &p, 12000, 0), CUDA_SUCCESS);
  CHECK(p == dlsym(d.lib, "cuMemMap"));
  // Old 32-bit ABI exports are never aliased to the new implementations.
  using MemAllocV1 = CUresult (*)(unsigned int*, unsigned int);
  auto alloc_v1 = reinterpret_cast<MemAllocV1>(dlsym(d.lib, "cuMemAlloc"));
  unsigned int small = 0;
  CHECK_CU(alloc_v1(&small, 16), CUDA_ERROR_NOT_SUPPORTED);

  const char* s = reinterpret_cast<const char*>(1);
  CHECK_CU(d.error_name(static_cast<CUresult>(9999), &s), CUDA_ERROR_INVALID_VALUE);
  CHECK(s == nullptr);
  CHECK(d.name(CUDA_ERROR_ILLEGAL_ADDRESS) == "CUDA_ERROR_ILLEGAL_ADDRESS");
  CHECK(d.name(CUDA_ERROR_STUB_LIBRARY) == "CUDA_ERROR_STUB_LIBRARY");
}

TEST_CASE("emulator: devices, attributes and contexts") {
  Driver& d = drv();
  use_device();
  int v = -1;
  CHECK_CU(d.device_get_attribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0),
           CUDA_SUCCESS);
  CHECK(v == 1);
  CHECK_CU(d.device_get_attribute(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0),
           CUDA_SUCCESS);
  CHECK(v == 9);
  CHECK_CU(d.device_get_attribute(&v, CU_DEVICE_ATTRIBUTE_MAX, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(d.device_get_attribute(&v, CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, device_count()),
           CUDA_ERROR_INVALID_DEVICE);
  CUdevice dev = -1;
  CHECK_CU(d.ctx_get_device(&dev), CUDA_SUCCESS);
  CHECK(dev == 0);
  CHECK(std::string(d.describe()).find("vsr-cuda-emulator") == 0);

  // A new thread has no current context (§1.2); VMM calls do not need one.
  std::thread([&] {
    CUcontext cur = reinterpret_cast<CUcontext>(0x1);
    CHECK_CU(d.ctx_get_current(&cur), CUDA_SUCCESS);
    CHECK(cur == nullptr);
    size_t f = 0;
    size_t t = 0;
    CHECK_CU(d.mem_get_info(&f, &t), CUDA_ERROR_INVALID_CONTEXT);
    CUdeviceptr p = 0;
    CHECK_CU(d.alloc(&p, 256), CUDA_ERROR_INVALID_CONTEXT);
    CHECK_CU(d.ctx_get_device(&dev), CUDA_ERROR_INVALID_CONTEXT);
    CHECK_CU(d.ctx_synchronize(), CUDA_ERROR_INVALID_CONTEXT);
    CUstream s = nullptr;
    CHECK_CU(d.stream_create(&s, 0), CUDA_ERROR_INVALID_CONTEXT);
    CHECK_CU(d.alloc_async(&p, 256, nullptr), CUDA_ERROR_INVALID_CONTEXT);
    const size_t g = min_granularity();
    CUmemGenericAllocationHandle h = 0;
    CUmemAllocationProp prop = device_prop();
    CHECK_CU(d.create(&h, g, &prop, 0), CUDA_SUCCESS);
    CHECK_CU(d.release(h), CUDA_SUCCESS);
  }).join();
}

TEST_CASE("emulator: VMM transition table with cuMemGetInfo deltas (§4)") {
  Driver& d = drv();
  use_device();
  const size_t g = min_granularity();
  const size_t size = 2 * g;
  const size_t base = free_bytes();
  CUmemAllocationProp prop = device_prop();
  CUmemGenericAllocationHandle h = 0;
  REQUIRE_CU(d.create(&h, size, &prop, 0));
  CHECK(h != 0);
  CHECK(free_bytes() == base - size);
  CHECK(outstanding().handles == 1);
  CUdeviceptr va = 0;
  REQUIRE_CU(d.reserve(&va, size, 0, 0, 0));
  CHECK(va % g == 0);
  CHECK(free_bytes() == base - size);
  REQUIRE_CU(d.map(va, size, 0, h, 0));
  CHECK(free_bytes() == base - size);
  unsigned long long flags = 99;
  CUmemLocation loc = prop.location;
  CHECK_CU(d.get_access(&flags, &loc, va), CUDA_SUCCESS);
  CHECK(flags == CU_MEM_ACCESS_FLAGS_PROT_NONE);
  CUmemAccessDesc rw = access(0);
  REQUIRE_CU(d.set_access(va, size, &rw, 1));
  CHECK_CU(d.get_access(&flags, &loc, va + g), CUDA_SUCCESS);
  CHECK(flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  std::vector<unsigned char> pattern(size);
  for (size_t i = 0; i < size; ++i) pattern[i] = static_cast<unsigned char>(i * 7);
  REQUIRE_CU(d.htod(va, pattern.data(), size));
  REQUIRE_CU(d.ctx_synchronize());  // a pageable HtoD may return before the data lands (§3.6)
  CHECK(std::memcmp(reinterpret_cast<void*>(va), pattern.data(), size) == 0);

  // Step 5: release while mapped keeps the memory alive and usable.
  REQUIRE_CU(d.release(h));
  CHECK(free_bytes() == base - size);
  CHECK(outstanding().handles == 1);
  std::vector<unsigned char> back(size);
  REQUIRE_CU(d.dtoh(back.data(), va, size));
  CHECK(back == pattern);
  CHECK_CU(d.release(h), CUDA_ERROR_INVALID_VALUE);
  CUmemGenericAllocationHandle again = 0;
  CHECK_CU(d.map(va + size, size, 0, h, 0), CUDA_ERROR_INVALID_VALUE);

  // Steps 6-7: retain gives the same id back and needs its own release.
  REQUIRE_CU(d.retain_handle(&again, reinterpret_cast<void*>(va + 5)));
  CHECK(again == h);
  CUmemAllocationProp got{};
  CHECK_CU(d.props_from_handle(&got, again), CUDA_SUCCESS);
  CHECK(got.location.id == 0);
  REQUIRE_CU(d.release(again));
  CHECK(free_bytes() == base - size);

  // Step 8: the last unmap frees the memory.
  REQUIRE_CU(d.unmap(va, size));
  CHECK(free_bytes() == base);
  CHECK(outstanding().handles == 0);
  CHECK_CU(d.retain_handle(&again, reinterpret_cast<void*>(va)), CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(d.address_free(va, size));
  CHECK(free_bytes() == base);

  // Handle ids are never reused.
  CUmemGenericAllocationHandle next = 0;
  REQUIRE_CU(d.create(&next, g, &prop, 0));
  CHECK(next > h);
  REQUIRE_CU(d.release(next));
  check_nothing_outstanding();
}

TEST_CASE("emulator: strict reserve/create/map/unmap/access/free rules") {
  Driver& d = drv();
  use_device();
  const size_t g = min_granularity();
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  CUmemAllocationProp prop = device_prop();
  CUdeviceptr va = 0;
  CHECK_CU(d.reserve(&va, 0, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(d.reserve(&va, page + 1, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(d.reserve(&va, g, 3, 0, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(d.reserve(&va, g, 0, 0, 1), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(d.reserve(nullptr, g, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
  // A free hint is honoured (grow in place); an occupied one yields another address.
  CUdeviceptr area = 0;
  REQUIRE_CU(d.reserve(&area, 6 * g, 0, 0, 0));
  REQUIRE_CU(d.address_free(area, 6 * g));
  REQUIRE_CU(d.reserve(&va, 4 * g, 0, area, 0));
  CHECK(va == area);
  CUdeviceptr grown = 0;
  REQUIRE_CU(d.reserve(&grown, 2 * g, 0, va + 4 * g, 0));
  CHECK(grown == va + 4 * g);
  CUdeviceptr other = 0;
  REQUIRE_CU(d.reserve(&other, g, 0, va, 0));
  CHECK(other != va);
  CUdeviceptr big = 0;
  REQUIRE_CU(d.reserve(&big, g, size_t{1} << 30, 0, 0));
  CHECK(big % (size_t{1} << 30) == 0);
  REQUIRE_CU(d.address_free(big, g));

  CUmemGenericAllocationHandle h1 = 0;
  CUmemGenericAllocationHandle h2 = 0;
  CUmemGenericAllocationHandle bad = 0;
  CHECK_CU(d.create(&bad, 0, &prop, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(d.create(&bad, g - page, &prop, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(d.create(&bad, g + page, &prop, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(d.create(&bad, g, &prop, 1), CUDA_ERROR_INVALID_VALUE);
  CUmemAllocationProp q = prop;
  q.location.id = -1;
  CHECK_CU(d.create(&bad, g, &q, 0), CUDA_ERROR_INVALID_DEVICE);
  q = prop;
  q.type = CU_MEM_ALLOCATION_TYPE_INVALID;
  CHECK_CU(d.create(&bad, g, &q, 0), CUDA_ERROR_INVALID_VALUE);
  q = prop;
  q.location.type = CU_MEM_LOCATION_TYPE_INVALID;
  CHECK_CU(d.create(&bad, g, &q, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK(bad == 0);
  REQUIRE_CU(d.create(&h1, 2 * g, &prop, 0));
  REQUIRE_CU(d.create(&h2, g, &prop, 0));

  CHECK_CU(d.map(va, g, 0, h1, 0), CUDA_ERROR_INVALID_VALUE);              // part of a handle
  CHECK_CU(d.map(va, g, g, h1, 0), CUDA_ERROR_INVALID_VALUE);              // offset != 0
  CHECK_CU(d.map(va + page, g, 0, h2, 0), CUDA_ERROR_INVALID_VALUE);       // unaligned
  CHECK_CU(d.map(va, g, 0, h2, 1), CUDA_ERROR_INVALID_VALUE);              // flags
  CHECK_CU(d.map(va, g, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);               // handle 0
  CHECK_CU(d.map(va + 3 * g, 2 * g, 0, h1, 0), CUDA_ERROR_INVALID_VALUE);  // straddles a|grown
  REQUIRE_CU(d.map(va, 2 * g, 0, h1, 0));
  CHECK_CU(d.map(va + g, g, 0, h2, 0), CUDA_ERROR_INVALID_VALUE);  // overlap
  REQUIRE_CU(d.map(va + 2 * g, g, 0, h2, 0));
  REQUIRE_CU(d.map(va + 3 * g, g, 0, h2, 0));  // aliasing one handle twice is legal

  CUmemAccessDesc rw = access(0);
  CHECK_CU(d.set_access(va, 5 * g, &rw, 1), CUDA_ERROR_INVALID_VALUE);  // includes unmapped
  CHECK_CU(d.set_access(va, g, &rw, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(d.set_access(va, g, nullptr, 1), CUDA_ERROR_INVALID_VALUE);
  CUmemAccessDesc far = access(99);
  CHECK_CU(d.set_access(va, g, &far, 1), CUDA_ERROR_INVALID_DEVICE);
  CHECK_CU(d.set_access(va, 3 * g, &rw, 1), CUDA_SUCCESS);  // spans two mappings
  CUmemAccessDesc ro = access(0, CU_MEM_ACCESS_FLAGS_PROT_READ);
  CHECK_CU(d.set_access(va + 3 * g, g, &ro, 1), CUDA_SUCCESS);
  // Aliases share memory.
  unsigned int word = 0xabcdef01u;
  REQUIRE_CU(d.htod(va + 2 * g, &word, sizeof word));
  unsigned int read = 0;
  REQUIRE_CU(d.dtoh(&read, va + 3 * g, sizeof read));
  CHECK(read == word);
  // A copy across two adjacent mappings of different handles works.
  std::vector<unsigned char> span(2 * page, 0x5a);
  CHECK_CU(d.htod(va + 2 * g - page, span.data(), span.size()), CUDA_SUCCESS);
  REQUIRE_CU(d.ctx_synchronize());  // done before the unmaps below (§3.6: HtoD may return early)

  CUdeviceptr plain = 0;
  REQUIRE_CU(d.alloc(&plain, g));
  CHECK_CU(d.set_access(plain, g, &rw, 1), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(d.free(va), CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(d.free(plain));

  CHECK_CU(d.unmap(va, g), CUDA_ERROR_INVALID_VALUE);      // sub-range of a mapping
  CHECK_CU(d.unmap(va, 5 * g), CUDA_ERROR_INVALID_VALUE);  // runs past the mappings
  CHECK_CU(d.unmap(0, g), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(d.address_free(va, 4 * g), CUDA_ERROR_INVALID_VALUE);  // live mappings
  REQUIRE_CU(d.unmap(va, 3 * g));                                 // two whole mappings at once
  CHECK_CU(d.unmap(va, 2 * g), CUDA_ERROR_INVALID_VALUE);         // already unmapped
  REQUIRE_CU(d.unmap(va + 3 * g, g));
  CHECK_CU(d.address_free(va, 2 * g), CUDA_ERROR_INVALID_VALUE);  // wrong size
  CHECK_CU(d.address_free(va, 6 * g), CUDA_ERROR_INVALID_VALUE);  // spans two reservations
  REQUIRE_CU(d.address_free(va, 4 * g));
  CHECK_CU(d.address_free(va, 4 * g), CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(d.address_free(grown, 2 * g));
  REQUIRE_CU(d.address_free(other, g));
  REQUIRE_CU(d.release(h1));
  REQUIRE_CU(d.release(h2));
  CHECK_CU(d.release(0), CUDA_ERROR_INVALID_VALUE);
  check_nothing_outstanding();
}

TEST_CASE("emulator: classic allocations, copies and sticky faults") {
  Driver& d = drv();
  CUcontext ctx = use_device();
  Options opt;
  // Exact accounting, and VMM calls that do not see the context's sticky error (test_modes.cpp
  // covers MEMINFO_QUANTUM and STICKY_VMM).
  opt.set("MEMINFO_QUANTUM", "0").set("STICKY_VMM", "0");
  const size_t base = free_bytes();
  CUdeviceptr p = 0;
  CHECK_CU(d.alloc(&p, 0), CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(d.alloc(&p, 1000));
  CHECK(p % 256 == 0);
  CHECK(free_bytes() == base - 1000);
  unsigned char buf[64] = {};
  CHECK_CU(d.htod(p, nullptr, 16), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(d.htod(p, nullptr, 0), CUDA_SUCCESS);
  CHECK_CU(d.memset8(0, 0, 0), CUDA_SUCCESS);
  REQUIRE_CU(d.memset8(p, 0x42, 1000));
  REQUIRE_CU(d.dtoh(buf, p + 100, sizeof buf));
  CHECK(buf[0] == 0x42);
  CHECK(buf[63] == 0x42);
  CHECK_CU(d.free(0), CUDA_SUCCESS);
  CHECK_CU(d.free(p + 16), CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(d.free(p));
  CHECK_CU(d.free(p), CUDA_ERROR_INVALID_VALUE);
  CHECK(free_bytes() == base);

  CUdeviceptr m = 0;
  CHECK_CU(d.alloc_managed(&m, 4096, 3), CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(d.alloc_managed(&m, 4096, CU_MEM_ATTACH_GLOBAL));
  CHECK(outstanding().managed == 1);
  REQUIRE_CU(d.free(m));
  void* pinned = nullptr;
  REQUIRE_CU(d.host_alloc(&pinned, 4096, CU_MEMHOSTALLOC_PORTABLE));
  CHECK(outstanding().host_allocations == 1);
  CHECK_CU(d.memset8(reinterpret_cast<CUdeviceptr>(pinned), 1, 4096), CUDA_SUCCESS);
  REQUIRE_CU(d.free_host(pinned));
  CHECK_CU(d.free_host(nullptr), CUDA_SUCCESS);

  // STICKY=0: a bad device range is INVALID_VALUE and the context stays usable.
  const size_t g = min_granularity();
  CUdeviceptr va = 0;
  REQUIRE_CU(d.reserve(&va, g, 0, 0, 0));
  REQUIRE(d.set_option("STICKY", "0") == 0);
  CHECK_CU(d.htod(va, buf, 16), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(d.ctx_synchronize(), CUDA_SUCCESS);
  REQUIRE(d.set_option("STICKY", "1") == 0);
  // Mapped without access faults as well: 700, and the context is poisoned from then on.
  {
    CUmemGenericAllocationHandle h = 0;
    CUmemAllocationProp prop = device_prop();
    REQUIRE_CU(d.create(&h, g, &prop, 0));
    REQUIRE_CU(d.map(va, g, 0, h, 0));
    CHECK_CU(d.memset8(va, 0, 16), CUDA_ERROR_ILLEGAL_ADDRESS);
    CHECK_CU(d.ctx_synchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);
    CHECK_CU(d.alloc(&p, 1024), CUDA_ERROR_ILLEGAL_ADDRESS);
    // VMM calls are context-free and keep working.
    REQUIRE_CU(d.unmap(va, g));
    REQUIRE_CU(d.release(h));
  }
  REQUIRE_CU(d.address_free(va, g));
  // Resetting the primary context (last release) clears the sticky error.
  CHECK_CU(d.primary_release(0), CUDA_SUCCESS);
  CHECK_CU(d.primary_release(0), CUDA_ERROR_INVALID_CONTEXT);
  CUcontext again = nullptr;
  REQUIRE_CU(d.primary_retain(&again, 0));
  CHECK(again == ctx);
  CHECK_CU(d.ctx_synchronize(), CUDA_SUCCESS);
  check_nothing_outstanding();
}

// §3.4.10, §3.5: the allocation holding an address, for a caller that must know how far a
// pointer it was given may be read.
TEST_CASE("emulator: cuMemGetAddressRange reports the allocation holding an address") {
  Driver& d = drv();
  use_device();
  CUdeviceptr base = 0;
  size_t size = 0;
  CUdeviceptr p = 0;
  REQUIRE_CU(d.alloc(&p, 1000));
  // Any address inside: the allocation as asked for, not its pages.
  REQUIRE_CU(d.address_range(&base, &size, p + 999));
  CHECK(base == p);
  CHECK(size == 1000);
  CHECK_CU(d.address_range(&base, &size, p + 1000), CUDA_ERROR_NOT_FOUND);
  // Either out pointer may be NULL.
  size = 0;
  REQUIRE_CU(d.address_range(nullptr, &size, p));
  CHECK(size == 1000);
  base = 0;
  REQUIRE_CU(d.address_range(&base, nullptr, p + 10));
  CHECK(base == p);
  CHECK_CU(d.address_range(nullptr, nullptr, p), CUDA_SUCCESS);
  // A thread with no current context (§1.2).
  std::thread([&] {
    CHECK_CU(d.address_range(&base, &size, p), CUDA_ERROR_INVALID_CONTEXT);
  }).join();
  REQUIRE_CU(d.free(p));
  CHECK_CU(d.address_range(&base, &size, p), CUDA_ERROR_NOT_FOUND);  // freed
  // Managed memory is an allocation too; pinned host memory and other addresses are not.
  CUdeviceptr m = 0;
  REQUIRE_CU(d.alloc_managed(&m, 4096, CU_MEM_ATTACH_GLOBAL));
  REQUIRE_CU(d.address_range(&base, &size, m + 4095));
  CHECK(base == m);
  CHECK(size == 4096);
  REQUIRE_CU(d.free(m));
  void* pinned = nullptr;
  REQUIRE_CU(d.host_alloc(&pinned, 4096, 0));
  CHECK_CU(d.address_range(&base, &size, reinterpret_cast<CUdeviceptr>(pinned)),
           CUDA_ERROR_NOT_FOUND);
  REQUIRE_CU(d.free_host(pinned));
  int on_stack = 0;
  CHECK_CU(d.address_range(&base, &size, reinterpret_cast<CUdeviceptr>(&on_stack)),
           CUDA_ERROR_NOT_FOUND);
  CHECK_CU(d.address_range(&base, &size, 0), CUDA_ERROR_NOT_FOUND);
  // Stream-ordered memory until its free is queued.
  CUdeviceptr a = 0;
  REQUIRE_CU(d.alloc_async(&a, 512, nullptr));
  REQUIRE_CU(d.address_range(&base, &size, a + 1));
  CHECK(size == 512);
  REQUIRE_CU(d.free_async(a, nullptr));
  CHECK_CU(d.address_range(&base, &size, a), CUDA_ERROR_NOT_FOUND);
  REQUIRE_CU(d.stream_synchronize(nullptr));
  // VMM addresses: the reservation, mapped or not (PROBE: DALI), so never a mapping's extent.
  const size_t g = min_granularity();
  CUdeviceptr va = 0;
  REQUIRE_CU(d.reserve(&va, 2 * g, 0, 0, 0));
  CUmemAllocationProp prop = device_prop();
  CUmemGenericAllocationHandle h = 0;
  REQUIRE_CU(d.create(&h, g, &prop, 0));
  REQUIRE_CU(d.map(va, g, 0, h, 0));
  for (CUdeviceptr at : {va, va + 5, va + g + 5, va + 2 * g - 1}) {
    base = 0;
    size = 0;
    REQUIRE_CU(d.address_range(&base, &size, at));
    CHECK(base == va);
    CHECK(size == 2 * g);
  }
  CHECK_CU(d.address_range(&base, &size, va + 2 * g), CUDA_ERROR_NOT_FOUND);
  REQUIRE_CU(d.unmap(va, g));
  REQUIRE_CU(d.release(h));
  REQUIRE_CU(d.address_free(va, 2 * g));
  CHECK_CU(d.address_range(&base, &size, va), CUDA_ERROR_NOT_FOUND);
  // Another device's linear memory is not the current context's.
  if (device_count() > 1) {
    use_device(1);
    CUdeviceptr q = 0;
    REQUIRE_CU(d.alloc(&q, 256));
    REQUIRE_CU(d.address_range(&base, &size, q));
    use_device(0);
    CHECK_CU(d.address_range(&base, &size, q), CUDA_ERROR_NOT_FOUND);
    use_device(1);
    REQUIRE_CU(d.free(q));
    use_device(0);
  }
  check_nothing_outstanding();
}

// CUDA 13's forms that name a context (cuCtxGetDevice_v2, cuCtxSynchronize_v2): NULL means the
// current context; a given one must be active, even while it is still some thread's current one.
TEST_CASE("emulator: the 13.0 context forms take a given context only while it is active") {
  Driver& d = drv();
  const CUcontext ctx = use_device();
  decltype(&::cuCtxGetDevice_v2) get_device_v2 = nullptr;
  decltype(&::cuCtxSynchronize_v2) synchronize_v2 = nullptr;
  d.symbol(get_device_v2, "cuCtxGetDevice_v2");
  d.symbol(synchronize_v2, "cuCtxSynchronize_v2");
  CUdevice dev = -1;
  CHECK_CU(get_device_v2(&dev, ctx), CUDA_SUCCESS);
  CHECK(dev == 0);
  dev = -1;
  CHECK_CU(get_device_v2(&dev, nullptr), CUDA_SUCCESS);
  CHECK(dev == 0);
  CHECK_CU(synchronize_v2(ctx), CUDA_SUCCESS);
  CHECK_CU(get_device_v2(nullptr, ctx), CUDA_ERROR_INVALID_VALUE);
  // Every reference dropped: the primary context is inactive, though still current here.
  int refs = 0;
  while (d.primary_release(0) == CUDA_SUCCESS) ++refs;
  REQUIRE(refs >= 1);
  CUcontext cur = nullptr;
  CHECK_CU(d.ctx_get_current(&cur), CUDA_SUCCESS);
  CHECK(cur == ctx);
  dev = -1;
  CHECK_CU(get_device_v2(&dev, ctx), CUDA_ERROR_INVALID_CONTEXT);
  CHECK(dev == -1);  // nothing written
  CHECK_CU(synchronize_v2(ctx), CUDA_ERROR_INVALID_CONTEXT);
  // Retained again: the same handle, active again.
  for (int i = 0; i < refs; ++i) {
    CUcontext again = nullptr;
    REQUIRE_CU(d.primary_retain(&again, 0));
    CHECK(again == ctx);
  }
  CHECK_CU(get_device_v2(&dev, ctx), CUDA_SUCCESS);
  CHECK(dev == 0);
  CHECK_CU(synchronize_v2(ctx), CUDA_SUCCESS);
  check_nothing_outstanding();
}

TEST_CASE("emulator: fault injection") {
  Driver& d = drv();
  use_device();
  const size_t g = min_granularity();
  CUmemAllocationProp prop = device_prop();
  const size_t base = free_bytes();

  CHECK(d.set_fail("cuMemCreate:2") == 0);
  CUmemGenericAllocationHandle h1 = 0;
  CUmemGenericAllocationHandle h2 = 0;
  CUmemGenericAllocationHandle h3 = 0;
  CHECK_CU(d.create(&h1, g, &prop, 0), CUDA_SUCCESS);
  CHECK_CU(d.create(&h2, g, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);  // default for allocating
  CHECK(h2 == 0);                                                  // out-parameter untouched
  CHECK(free_bytes() == base - g);                                 // no side effect
  CHECK_CU(d.create(&h3, g, &prop, 0), CUDA_SUCCESS);              // only the 2nd call
  CHECK(d.call_count("cuMemCreate") == 3);
  CHECK(d.fault_count("cuMemCreate") == 1);  // the planned fault fired, once
  CHECK(d.fault_count("cuMemCreate_v2") == 1);
  CHECK(d.fault_count("cuMemMap") == 0);
  CHECK(d.fault_count(nullptr) == 1);
  REQUIRE_CU(d.release(h1));
  REQUIRE_CU(d.release(h3));

  CHECK(d.set_fail("cuMemMap:1:CUDA_ERROR_INVALID_DEVICE, cuMemAlloc_v2:2+") == 0);
  CHECK(d.call_count("cuMemCreate") == 0);  // counts restart with the plan
  CHECK(d.fault_count(nullptr) == 0);
  REQUIRE_CU(d.create(&h1, g, &prop, 0));
  CUdeviceptr va = 0;
  REQUIRE_CU(d.reserve(&va, g, 0, 0, 0));
  CHECK_CU(d.map(va, g, 0, h1, 0), CUDA_ERROR_INVALID_DEVICE);
  CHECK(outstanding().mappings == 0);
  CHECK_CU(d.map(va, g, 0, h1, 0), CUDA_SUCCESS);
  CUdeviceptr p = 0;
  REQUIRE_CU(d.alloc(&p, 256));
  CUdeviceptr q = 0;
  CHECK_CU(d.alloc(&q, 256), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_CU(d.alloc(&q, 256), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(q == 0);
  CHECK(d.call_count("cuMemAlloc") == 3);
  CHECK(d.call_count("cuMemAlloc_v2") == 3);
  CHECK(d.fault_count("cuMemMap") == 1);
  CHECK(d.fault_count("cuMemAlloc") == 2);  // N+: the 2nd and every later call
  CHECK(d.fault_count(nullptr) == 3);

  CHECK(d.set_fail("cuMemUnmap:1:CUDA_ERROR_NO_SUCH_ERROR") == CUDA_ERROR_INVALID_VALUE);
  CHECK(d.set_fail("cuMemUnmap") == CUDA_ERROR_INVALID_VALUE);
  CHECK(d.set_fail("cuMemUnmap:0") == CUDA_ERROR_INVALID_VALUE);
  // Blanks around an item are trimmed and empty items skipped.
  CHECK(d.set_fail(" cuMemUnmap:1 ,, ") == 0);
  CHECK_CU(d.unmap(va, g), CUDA_ERROR_UNKNOWN);  // default for non-allocating entries
  CHECK(d.set_fail("") == 0);
  REQUIRE_CU(d.unmap(va, g));
  REQUIRE_CU(d.address_free(va, g));
  REQUIRE_CU(d.release(h1));
  REQUIRE_CU(d.free(p));
  CHECK(free_bytes() == base);
  check_nothing_outstanding();
}

TEST_CASE("emulator: asynchronous streams, events and pause") {
  Driver& d = drv();
  use_device();
  CUstream s = nullptr;
  CUstream t = nullptr;
  CHECK_CU(d.stream_create(&s, 2), CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(d.stream_create(&s, CU_STREAM_NON_BLOCKING));
  REQUIRE_CU(d.stream_create(&t, CU_STREAM_NON_BLOCKING));
  CUevent e = nullptr;
  CHECK_CU(d.event_create(&e, CU_EVENT_INTERPROCESS), CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(d.event_create(&e, 0));
  CHECK_CU(d.event_query(e), CUDA_SUCCESS);  // never recorded
  CHECK_CU(d.event_synchronize(e), CUDA_SUCCESS);

  const size_t n = 1 << 20;
  CUdeviceptr p = 0;
  REQUIRE_CU(d.alloc_async(&p, n, s));
  CHECK(outstanding().allocations == 1);
  std::vector<unsigned int> host(n / 4, 7);
  std::vector<unsigned int> back(n / 4, 0);
  const bool async = d.stream_pause(s, 1) == 0;
  REQUIRE_CU(d.memset32_async(p, 0x01020304u, n / 4, s));
  REQUIRE_CU(d.event_record(e, s));
  std::atomic<int> ran{0};
  REQUIRE_CU(d.launch_host_func(
      s, [](void* arg) { static_cast<std::atomic<int>*>(arg)->fetch_add(1); }, &ran));
  if (async) {
    // Work stays pending while the stream is held (deterministic NOT_READY).
    CHECK_CU(d.stream_query(s), CUDA_ERROR_NOT_READY);
    CHECK_CU(d.event_query(e), CUDA_ERROR_NOT_READY);
    CHECK(ran.load() == 0);
    // t waits for e: its copy cannot overtake the memset.
    REQUIRE_CU(d.stream_wait_event(t, e, 0));
    REQUIRE_CU(d.dtoh_async(back.data(), p, n, t));
    CHECK_CU(d.stream_query(t), CUDA_ERROR_NOT_READY);
    CHECK(d.stream_pause(s, 0) == 0);
  } else {
    REQUIRE_CU(d.stream_wait_event(t, e, 0));
    REQUIRE_CU(d.dtoh_async(back.data(), p, n, t));
  }
  REQUIRE_CU(d.stream_synchronize(t));
  CHECK(back[0] == 0x01020304u);
  CHECK(back[n / 4 - 1] == 0x01020304u);
  REQUIRE_CU(d.event_synchronize(e));
  CHECK_CU(d.event_query(e), CUDA_SUCCESS);
  REQUIRE_CU(d.stream_synchronize(s));
  CHECK(ran.load() == 1);

  // cuMemFreeAsync frees when the stream reaches it.
  if (async) CHECK(d.stream_pause(s, 1) == 0);
  REQUIRE_CU(d.free_async(p, s));
  CHECK_CU(d.free_async(p, s), CUDA_ERROR_INVALID_VALUE);
  if (async) {
    CHECK(outstanding().allocations == 1);
    CHECK(d.stream_pause(s, 0) == 0);
  }
  REQUIRE_CU(d.stream_synchronize(s));
  CHECK(outstanding().allocations == 0);

  // Destroying a stream with pending work returns at once; the work still completes.
  if (async) CHECK(d.stream_pause(s, 1) == 0);
  REQUIRE_CU(d.launch_host_func(
      s, [](void* arg) { static_cast<std::atomic<int>*>(arg)->fetch_add(1); }, &ran));
  REQUIRE_CU(d.event_record(e, s));
  REQUIRE_CU(d.stream_destroy(s));
  CHECK_CU(d.stream_destroy(s), CUDA_ERROR_INVALID_HANDLE);
  REQUIRE_CU(d.event_synchronize(e));
  CHECK(ran.load() == 2);
  REQUIRE_CU(d.stream_destroy(t));
  REQUIRE_CU(d.event_destroy(e));
  CHECK_CU(d.event_destroy(e), CUDA_ERROR_INVALID_HANDLE);
  CHECK_CU(d.stream_synchronize(nullptr), CUDA_SUCCESS);
  CHECK_CU(d.stream_synchronize(CU_STREAM_PER_THREAD), CUDA_SUCCESS);
  check_nothing_outstanding();
}

TEST_CASE("emulator: options (VMM, managed, memory pools, capacity)") {
  Driver& d = drv();
  use_device();
  const size_t g = min_granularity();
  CUmemAllocationProp prop = device_prop();
  int v = -1;

  REQUIRE(d.set_option("VMM", "0") == 0);
  CHECK_CU(d.device_get_attribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0),
           CUDA_SUCCESS);
  CHECK(v == 0);
  size_t gran = 0;
  CUmemGenericAllocationHandle h = 0;
  CUdeviceptr va = 0;
  CHECK_CU(d.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_ERROR_NOT_SUPPORTED);
  CHECK_CU(d.create(&h, g, &prop, 0), CUDA_ERROR_NOT_SUPPORTED);
  CHECK_CU(d.reserve(&va, g, 0, 0, 0), CUDA_ERROR_NOT_SUPPORTED);
  CHECK_CU(d.release(1), CUDA_ERROR_NOT_SUPPORTED);
  REQUIRE(d.set_option("VMM", "1") == 0);

  REQUIRE_CU(d.create(&h, g, &prop, 0));
  CHECK(d.set_option("VMM", "0") == CUDA_ERROR_NOT_PERMITTED);  // live VMM objects
  CHECK(d.set_option("GRANULARITY", std::to_string(2 * g).c_str()) == CUDA_ERROR_NOT_PERMITTED);
  CHECK(d.set_option("DEVICE_MEMORY", std::to_string(g / 2).c_str()) == CUDA_ERROR_NOT_PERMITTED);
  REQUIRE_CU(d.release(h));

  REQUIRE(d.set_option("RECOMMENDED_GRANULARITY", std::to_string(2 * g).c_str()) == 0);
  CHECK_CU(d.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED), CUDA_SUCCESS);
  CHECK(gran == 2 * g);
  CHECK(d.set_option("RECOMMENDED_GRANULARITY", std::to_string(g + 4096).c_str()) ==
        CUDA_ERROR_INVALID_VALUE);
  REQUIRE(d.set_option("RECOMMENDED_GRANULARITY", "0") == 0);

  REQUIRE(d.set_option("MANAGED", "0") == 0);
  CHECK_CU(d.device_get_attribute(&v, CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, 0), CUDA_SUCCESS);
  CHECK(v == 0);
  CUdeviceptr m = 0;
  CHECK_CU(d.alloc_managed(&m, 4096, CU_MEM_ATTACH_GLOBAL), CUDA_ERROR_NOT_SUPPORTED);
  REQUIRE(d.set_option("MANAGED", "1") == 0);
  REQUIRE(d.set_option("MEMORY_POOLS", "0") == 0);
  CHECK_CU(d.device_get_attribute(&v, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 0), CUDA_SUCCESS);
  CHECK(v == 0);
  CHECK_CU(d.alloc_async(&m, 4096, nullptr), CUDA_ERROR_NOT_SUPPORTED);
  REQUIRE(d.set_option("MEMORY_POOLS", "1") == 0);
  CHECK(d.set_option("NO_SUCH_OPTION", "1") == CUDA_ERROR_INVALID_VALUE);
  CHECK(d.set_option("VMM", "maybe") == CUDA_ERROR_INVALID_VALUE);

  // Capacity: exceeding it is OUT_OF_MEMORY at cuMemCreate / cuMemAlloc.
  size_t f = 0;
  size_t total = 0;
  REQUIRE_CU(d.mem_get_info(&f, &total));
  REQUIRE(d.set_option("DEVICE_MEMORY", std::to_string(4 * g).c_str()) == 0);
  REQUIRE(d.set_option("CONTEXT_OVERHEAD", std::to_string(g).c_str()) == 0);
  CHECK(free_bytes() == 3 * g);
  CHECK_CU(d.create(&h, 4 * g, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
  REQUIRE_CU(d.create(&h, 3 * g, &prop, 0));
  CHECK(free_bytes() == 0);
  CUdeviceptr p = 0;
  CHECK_CU(d.alloc(&p, 1), CUDA_ERROR_OUT_OF_MEMORY);
  REQUIRE_CU(d.release(h));
  REQUIRE(d.set_option("CONTEXT_OVERHEAD", "0") == 0);
  REQUIRE(d.set_option("DEVICE_MEMORY", std::to_string(total).c_str()) == 0);
  check_nothing_outstanding();
}

TEST_CASE("emulator: multiple devices") {
  Driver& d = drv();
  use_device();
  if (device_count() < 2) {
    MESSAGE("one emulated device: the 'emulator-2dev' test runs this case");
    return;
  }
  const size_t g = min_granularity();
  use_device(1);
  const size_t free1 = free_bytes();
  use_device(0);
  const size_t free0 = free_bytes();
  CUmemAllocationProp prop = device_prop(1);
  CUmemGenericAllocationHandle h = 0;
  REQUIRE_CU(d.create(&h, g, &prop, 0));
  CHECK(free_bytes() == free0);  // charged to device 1 only
  CHECK(outstanding(1).handles == 1);
  CHECK(outstanding(0).handles == 0);
  prop.location.id = 2;
  CUmemGenericAllocationHandle bad = 0;
  CHECK_CU(d.create(&bad, g, &prop, 0), CUDA_ERROR_INVALID_DEVICE);
  CUdeviceptr va = 0;
  REQUIRE_CU(d.reserve(&va, g, 0, 0, 0));
  REQUIRE_CU(d.map(va, g, 0, h, 0));
  // Access is per device: device 1 may write, the current context's device 0 may not.
  CUmemAccessDesc rw1 = access(1);
  REQUIRE_CU(d.set_access(va, g, &rw1, 1));
  unsigned long long flags = 9;
  CUmemLocation loc0{CU_MEM_LOCATION_TYPE_DEVICE, 0};
  CHECK_CU(d.get_access(&flags, &loc0, va), CUDA_SUCCESS);
  CHECK(flags == CU_MEM_ACCESS_FLAGS_PROT_NONE);
  REQUIRE(d.set_option("STICKY", "0") == 0);
  unsigned int word = 5;
  CHECK_CU(d.htod(va, &word, 4), CUDA_ERROR_INVALID_VALUE);
  REQUIRE(d.set_option("STICKY", "1") == 0);
  use_device(1);
  CUdevice dev = -1;
  REQUIRE_CU(d.ctx_get_device(&dev));
  CHECK(dev == 1);
  CHECK(free_bytes() == free1 - g);
  CHECK_CU(d.htod(va, &word, 4), CUDA_SUCCESS);
  REQUIRE_CU(d.ctx_synchronize());
  REQUIRE_CU(d.unmap(va, g));
  REQUIRE_CU(d.release(h));
  REQUIRE_CU(d.address_free(va, g));
  CHECK(free_bytes() == free1);
  use_device(0);
  check_nothing_outstanding();
}

TEST_CASE("emulator: 8 threads create/map/access/write/verify/unmap/release") {
  Driver& d = drv();
  use_device();
  const size_t g = min_granularity();
  const size_t base = free_bytes();
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      use_device();
      CUstream stream = nullptr;
      if (d.stream_create(&stream, 0) != CUDA_SUCCESS) failures++;
      for (int iter = 0; iter < 25; ++iter) {
        const size_t size = g * static_cast<size_t>(1 + (t + iter) % 3);
        CUmemAllocationProp prop = device_prop();
        CUmemGenericAllocationHandle h = 0;
        CUdeviceptr va = 0;
        CUmemAccessDesc rw = access(0);
        bool ok = d.create(&h, size, &prop, 0) == CUDA_SUCCESS &&
                  d.reserve(&va, size, 0, 0, 0) == CUDA_SUCCESS &&
                  d.map(va, size, 0, h, 0) == CUDA_SUCCESS && d.release(h) == CUDA_SUCCESS &&
                  d.set_access(va, size, &rw, 1) == CUDA_SUCCESS;
        const auto pattern = static_cast<unsigned int>(t * 1000 + iter);
        ok = ok && d.memset32_async(va, pattern, size / 4, stream) == CUDA_SUCCESS &&
             d.stream_synchronize(stream) == CUDA_SUCCESS;
        const auto* words = reinterpret_cast<const unsigned int*>(va);
        ok = ok && words[0] == pattern && words[size / 4 - 1] == pattern;
        std::vector<unsigned int> back(16);
        ok = ok && d.dtoh(back.data(), va + size - 64, 64) == CUDA_SUCCESS && back[15] == pattern;
        ok = ok && d.unmap(va, size) == CUDA_SUCCESS && d.address_free(va, size) == CUDA_SUCCESS;
        if (!ok) failures++;
      }
      if (d.stream_destroy(stream) != CUDA_SUCCESS) failures++;
    });
  }
  for (auto& th : threads) th.join();
  CHECK(failures.load() == 0);
  CHECK(free_bytes() == base);
  check_nothing_outstanding();
}
