// SPDX-License-Identifier: Apache-2.0
// The driver seam: loading, errors, contexts — against the emulator, and with no driver at all.
#include "driver/cuda_driver.hpp"

#include <vibespatial/raster/driver.hpp>
#include <vibespatial/raster/errors.hpp>
#include <vibespatial/raster/memory.hpp>

#include <doctest/doctest.h>

#include <dlfcn.h>
#include <stdlib.h>

#include <atomic>
#include <cstdlib>
#include <set>
#include <string>
#include <thread>
#include <vector>

using namespace vibespatial::raster;

TEST_SUITE("driver") {
  TEST_CASE("the emulator loads through cuGetProcAddress and reports itself") {
    const detail::DriverState& s = detail::driver_state();
    REQUIRE_MESSAGE(s.available, s.reason);
    CHECK(s.emulated);
    CHECK(s.driver_version >= 12000);
    CHECK(s.device_count >= 1);
    CHECK(s.api.has_vmm());
    CHECK(static_cast<bool>(s.api.cuMemAllocAsync));
    CHECK(&detail::driver() == &s.api);
  }

  TEST_CASE("a failed call becomes a CudaError naming the CUresult, call and location") {
    const detail::DriverApi& api = detail::driver();
    try {
      detail::bind_current_device();
      VSR_CU_TRY(api.cuMemAlloc(nullptr, 16));
      FAIL("expected CudaError");
    } catch (const CudaError& e) {
      CHECK(e.code() == CUDA_ERROR_INVALID_VALUE);
      CHECK(e.name() == "CUDA_ERROR_INVALID_VALUE");
      const std::string what = e.what();
      CHECK(what.find("cuMemAlloc") != std::string::npos);
      CHECK(what.find("test_driver.cpp") != std::string::npos);
    }
    CHECK(detail::cu_result_name(CUDA_ERROR_OUT_OF_MEMORY) == "CUDA_ERROR_OUT_OF_MEMORY");
  }

  TEST_CASE("threads without a context get the primary context of device 0") {
    int device = -1;
    CUcontext ctx = nullptr;
    std::thread t([&] {
      device = detail::bind_current_device();
      detail::driver().cuCtxGetCurrent(&ctx);
    });
    t.join();
    CHECK(device == 0);
    CHECK(ctx == detail::primary_context(0));
    // The primary context is retained once and is the same on every call.
    CHECK(detail::primary_context(0) == detail::primary_context(0));
    CHECK_THROWS_AS(detail::primary_context(-1), CudaError);
    CHECK_THROWS_AS(detail::primary_context(1000), CudaError);
  }

  TEST_CASE("ScopedDeviceContext restores the previous binding") {
    const detail::DriverApi& api = detail::driver();
    std::thread t([&] {
      CUcontext before = reinterpret_cast<CUcontext>(0x1);
      api.cuCtxGetCurrent(&before);
      CHECK(before == nullptr);
      {
        detail::ScopedDeviceContext scope(0);
        CUcontext inside = nullptr;
        api.cuCtxGetCurrent(&inside);
        CHECK(inside == detail::primary_context(0));
      }
      CUcontext after = reinterpret_cast<CUcontext>(0x1);
      api.cuCtxGetCurrent(&after);
      CHECK(after == nullptr);
    });
    t.join();
  }

  TEST_CASE("driver_info describes the emulated device") {
    const DriverInfo info = driver_info();
    REQUIRE(info.available);
    CHECK(info.emulated);
    CHECK(info.reason.empty());
    REQUIRE(!info.devices.empty());
    const DeviceInfo& d = info.devices[0];
    CHECK(d.virtual_memory_management);
    CHECK(d.granularity > 0);
    CHECK(d.granularity % 4096 == 0);
    CHECK(d.total_bytes > 0);
    CHECK(d.free_bytes <= d.total_bytes);
  }
}

TEST_SUITE("driver-absent" * doctest::skip()) {
  TEST_CASE("with no driver library every entry answers clearly and nothing crashes") {
    const detail::DriverState& s = detail::driver_state();
    CHECK_FALSE(s.available);
    CHECK(s.reason.find("cannot load") != std::string::npos);
    CHECK(s.reason.find(s.library) != std::string::npos);
    CHECK(s.result == CUDA_ERROR_NO_DEVICE);
    try {
      detail::driver();
      FAIL("expected DriverUnavailableError");
    } catch (const DriverUnavailableError& e) {
      CHECK(e.code() == CUDA_ERROR_NO_DEVICE);
      CHECK(e.name() == "CUDA_ERROR_NO_DEVICE");
      CHECK(std::string(e.what()).find("no CUDA driver") != std::string::npos);
    }
    CHECK_THROWS_AS(detail::bind_current_device(), DriverUnavailableError);
    const DriverInfo info = driver_info();
    CHECK_FALSE(info.available);
    CHECK(info.devices.empty());
    CHECK_FALSE(info.reason.empty());
  }
}

// Run with a driver whose cuInit fails (the emulator with no device, or a cuInit fault): loading
// once aborted the process (a recursive static initialisation while naming the error).
TEST_SUITE("driver-no-device" * doctest::skip()) {
  TEST_CASE("a failing cuInit is a typed 'no usable device' error, never an abort") {
    const detail::DriverState& s = detail::driver_state();
    CHECK_FALSE(s.available);
    CHECK(s.result != CUDA_SUCCESS);
    CHECK(s.reason.find("cuInit failed with CUDA_ERROR_") != std::string::npos);
    CHECK(s.device_count == 0);
    try {
      detail::driver();
      FAIL("expected DriverUnavailableError");
    } catch (const DriverUnavailableError& e) {
      CHECK(e.code() == s.result);
      CHECK(e.name().rfind("CUDA_ERROR_", 0) == 0);
      CHECK(std::string(e.what()).find("cuInit failed") != std::string::npos);
    }
    CHECK_THROWS_AS(detail::bind_current_device(), DriverUnavailableError);
    CHECK_THROWS_AS(configure_memory_pool(), DriverUnavailableError);
    CHECK_THROWS_AS(device_allocate(1024), DriverUnavailableError);
    CHECK_NOTHROW(free_pool_memory());
    CHECK_FALSE(memory_pool_stats().configured);
    const DriverInfo info = driver_info();
    CHECK_FALSE(info.available);
    CHECK(info.emulated);
    CHECK(info.devices.empty());
    CHECK(info.reason == s.reason);
  }
}

// Run against tests/driver/hiding_driver.c, which hides the entry points named in
// VSR_HIDING_DRIVER_HIDE; VSR_TEST_EXPECT says what the seam must make of it.
TEST_SUITE("driver-hidden-entries" * doctest::skip()) {
  TEST_CASE("required entries refuse the driver by name; VMM and optional ones do not") {
    const detail::DriverState& s = detail::driver_state();
    const std::string expect = std::getenv("VSR_TEST_EXPECT");
    if (expect == "refused") {
      CHECK_FALSE(s.available);
      CHECK(s.result == CUDA_ERROR_NOT_FOUND);
      CHECK(s.reason.find("lacks required entry points: cuStreamWaitEvent") != std::string::npos);
      CHECK_THROWS_AS(configure_memory_pool(), DriverUnavailableError);
    } else if (expect == "no-vmm") {
      REQUIRE_MESSAGE(s.available, s.reason);
      CHECK_FALSE(s.api.has_vmm());
      CHECK_FALSE(static_cast<bool>(s.api.cuMemMap));
      CHECK(configure_memory_pool() == "fallback");
      void* p = device_allocate(1 << 20);
      CHECK(p != nullptr);
      device_deallocate(p, 1 << 20);
    } else {
      REQUIRE(expect == "optional");
      REQUIRE_MESSAGE(s.available, s.reason);
      CHECK(s.api.has_vmm());
      CHECK_FALSE(static_cast<bool>(s.api.cuMemsetD8));
      CHECK_FALSE(static_cast<bool>(s.api.cuMemAllocAsync));
      CHECK(configure_memory_pool() == "B");
    }
  }
}

namespace {

// Calls of `entry` the emulator saw (its vsr_emu_call_count), through the instance the runtime
// loaded.
unsigned long long emulator_calls(const char* entry) {
  const char* path = std::getenv("VIBESPATIAL_CUDA_DRIVER");
  REQUIRE(path != nullptr);
  void* handle = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
  REQUIRE(handle != nullptr);
  auto count =
      reinterpret_cast<unsigned long long (*)(const char*)>(dlsym(handle, "vsr_emu_call_count"));
  REQUIRE(static_cast<bool>(count));
  const unsigned long long n = count(entry);
  dlclose(handle);
  return n;
}

int env_int(const char* name) {
  const char* v = std::getenv(name);
  REQUIRE_MESSAGE(v != nullptr, name);
  return std::atoi(v);
}

}  // namespace

// Run with a fault plan that fails the first two driver starts (cuInit, or cuDeviceGetCount
// after a good cuInit), VSR_TEST_RESULT the CUresult they fail with and VSR_TEST_REASON a part
// of the reason. The first failure was once kept for the whole process: every later call failed
// with it and the driver never saw a second cuInit.
TEST_SUITE("driver-retry" * doctest::skip()) {
  TEST_CASE("a failed start is tried again by the next call, and a caller's state stays valid") {
    const int result = env_int("VSR_TEST_RESULT");
    const std::string reason_part = std::getenv("VSR_TEST_REASON");
    const detail::DriverState& first = detail::driver_state();  // start 1 fails
    REQUIRE_FALSE(first.available);
    CHECK(first.result == result);
    CHECK(first.reason.find(reason_part) != std::string::npos);
    CHECK(first.device_count == 0);
    CHECK(emulator_calls("cuInit") == 1);
    const std::string first_reason = first.reason;
    try {
      configure_memory_pool();  // start 2 fails, as the plan says
      FAIL("expected DriverUnavailableError");
    } catch (const DriverUnavailableError& e) {
      CHECK(e.code() == result);
      CHECK(std::string(e.what()).find(reason_part) != std::string::npos);
    }
    CHECK(emulator_calls("cuInit") == 2);   // one start per call, not two
    CHECK(configure_memory_pool() == "B");  // start 3 succeeds
    CHECK(emulator_calls("cuInit") == 3);
    // The state the first caller holds is the one it was given, still readable.
    CHECK_FALSE(first.available);
    CHECK(first.reason == first_reason);
    const detail::DriverState& now = detail::driver_state();
    CHECK(now.available);
    CHECK(now.device_count >= 1);
    CHECK(now.reason.empty());
    CHECK(&detail::driver() == &now.api);
    // A usable driver is settled: no call starts it again.
    void* p = device_allocate(1 << 20);
    CHECK(p != nullptr);
    device_deallocate(p, 1 << 20);
    CHECK(driver_info().available);
    for (int i = 0; i < 100; ++i) CHECK(&detail::driver_state() == &now);
    CHECK(emulator_calls("cuInit") == 3);
  }
}

// Run with VSR_EMU_FAIL=cuInit:1+ (every start fails).
TEST_SUITE("driver-retry-always-fails" * doctest::skip()) {
  TEST_CASE("every call tries again; repeated failures reuse one state") {
    const detail::DriverState& first = detail::driver_state();
    REQUIRE_FALSE(first.available);
    for (int i = 0; i < 1000; ++i) {
      CHECK_THROWS_AS(configure_memory_pool(), DriverUnavailableError);
      // The same failure is the same state: retrying forever does not grow memory.
      REQUIRE(&detail::driver_state() == &first);
    }
    CHECK(emulator_calls("cuInit") == 2001);
    CHECK_FALSE(driver_info().available);
  }
}

// Run with VSR_EMU_FAIL=cuInit:1: threads race the first configuration while the first start
// fails and later ones succeed.
TEST_SUITE("driver-retry-threads" * doctest::skip()) {
  TEST_CASE("threads racing a failing then succeeding start see one consistent state") {
    constexpr int kThreads = 16;
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<std::string> tiers(kThreads);
    std::vector<int> failures(kThreads, 0);
    std::vector<std::string> odd(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        ready.fetch_add(1);
        while (!go.load()) std::this_thread::yield();
        for (int attempt = 0; attempt < 50 && tiers[t].empty(); ++attempt) {
          const detail::DriverState& s = detail::driver_state();
          // Whatever state a thread holds is whole: a failure has its reason, a success none.
          if (s.available != s.reason.empty() || s.available != (s.device_count > 0)) {
            odd[t] = "inconsistent state: " + s.reason;
          }
          if (!s.available) ++failures[t];
          try {
            tiers[t] = configure_memory_pool();
          } catch (const DriverUnavailableError& e) {
            ++failures[t];
            if (std::string(e.what()).find("cuInit failed") == std::string::npos) odd[t] = e.what();
          } catch (const std::exception& e) {
            odd[t] = e.what();
          }
        }
      });
    }
    while (ready.load() < kThreads) std::this_thread::yield();
    go.store(true);
    for (auto& th : threads) th.join();
    int failed_calls = 0;
    for (int t = 0; t < kThreads; ++t) {
      CHECK_MESSAGE(odd[t].empty(), odd[t]);
      CHECK(tiers[t] == "B");
      failed_calls += failures[t];
    }
    CHECK(failed_calls >= 1);              // the first start failed, and someone was told
    CHECK(emulator_calls("cuInit") == 2);  // one failed start, one good: racers share them
    CHECK(detail::driver_state().available);
  }
}

// Run with no driver library (VIBESPATIAL_CUDA_DRIVER names none) and VSR_TEST_EMULATOR the
// emulator's path: nothing was loaded, so a later call loads the library named then.
TEST_SUITE("driver-retry-library" * doctest::skip()) {
  TEST_CASE("a library that could not be loaded is loaded by a later call") {
    const detail::DriverState& first = detail::driver_state();
    REQUIRE_FALSE(first.available);
    CHECK(first.reason.find("cannot load") != std::string::npos);
    CHECK(&detail::driver_state() == &first);  // the same failure again
    REQUIRE(setenv("VIBESPATIAL_CUDA_DRIVER", std::getenv("VSR_TEST_EMULATOR"), 1) == 0);
    CHECK(configure_memory_pool() == "B");
    const detail::DriverState& now = detail::driver_state();
    CHECK(now.available);
    CHECK(now.emulated);
    CHECK(now.library == std::getenv("VSR_TEST_EMULATOR"));
    CHECK(first.reason.find("cannot load") != std::string::npos);  // still valid
    // Once loaded, the library is kept: the variable is not read again.
    REQUIRE(setenv("VIBESPATIAL_CUDA_DRIVER", "/nonexistent/libcuda.so.1", 1) == 0);
    CHECK(&detail::driver_state() == &now);
    CHECK(configure_memory_pool() == "B");
    REQUIRE(setenv("VIBESPATIAL_CUDA_DRIVER", std::getenv("VSR_TEST_EMULATOR"), 1) == 0);
    CHECK(emulator_calls("cuInit") == 1);
  }
}
