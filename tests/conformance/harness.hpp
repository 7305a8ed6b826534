// SPDX-License-Identifier: Apache-2.0
// Shared state and helpers of the conformance cases.
#pragma once

#include "driver_table.hpp"
#include "watchdog.hpp"

#include <cuda.h>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace vsr_conf {

// What main() recorded before the first successful cuInit (semantics §1.1).
struct PreInit {
  CUresult device_get_count = CUDA_SUCCESS;
  CUresult device_get = CUDA_SUCCESS;
  CUresult ctx_get_current = CUDA_SUCCESS;
  bool ctx_get_current_wrote = false;
  CUresult ctx_set_current_null = CUDA_SUCCESS;
  CUresult ctx_get_device = CUDA_SUCCESS;
  CUresult error_name = CUDA_SUCCESS;
  std::string error_name_text;
  CUresult error_string = CUDA_SUCCESS;
  bool error_string_present = false;
  CUresult driver_get_version = CUDA_SUCCESS;
  int driver_version = 0;
};

struct Env {
  Driver cu;
  PreInit pre;
  bool strict = false;
  bool real_driver = true;  // the library's file name starts with libcuda.so
  int driver_version = 0;
  int device_count = 0;
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  CUresult release_before_retain = CUDA_SUCCESS;
  std::size_t gran = 0;  // MINIMUM granularity of device-pinned memory on dev
  CUmemAllocationProp prop{};
};

Env& env();
inline const Driver& cu() {
  return env().cu;
}

// The CUresult's enum identifier from the driver's own table, or "CUresult(<n>)".
std::string error_name(CUresult r);

// Free device memory; fails the case when cuMemGetInfo does not succeed.
std::size_t free_bytes();

CUmemAccessDesc access_desc(CUmemAccess_flags flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE);

// Runs f on a new thread, which has no current context (semantics §1.2).
template <class F>
void on_fresh_thread(F f) {
  std::thread t(f);
  t.join();
}

// Memory deltas are compared with a slack of two granules: the real driver may charge page
// tables, and free memory is racy across processes (semantics §3.3, §9.1).
void check_free_delta(std::size_t before, std::size_t after, long long expected, const char* step);

// The doctest case now running (set by the table listener in main.cpp).
void set_current_case(const std::string& name);
// Marks the running case "not applicable": the table reports it as SKIP, never PASS.
void mark_not_applicable();
bool was_not_applicable(const std::string& name);

// Fails a case that hangs instead of blocking the run (tests/watchdog.hpp).
using vsr_test::Watchdog;

// A host function (cuLaunchHostFunc) that spins until released, holding its stream. It makes no
// CUDA call (host functions may not).
struct SpinHold {
  std::atomic<bool> released{false};
  std::atomic<bool> started{false};
  std::thread::id ran_on;
  static void CUDA_CB run(void* self) {
    auto* h = static_cast<SpinHold*>(self);
    h->ran_on = std::this_thread::get_id();
    h->started = true;
    while (!h->released.load()) std::this_thread::yield();
  }
};

}  // namespace vsr_conf

// Returns from the running case, which the table then reports as SKIP with the reason logged.
#define VSR_CONF_NOT_APPLICABLE(why)           \
  do {                                         \
    ::vsr_conf::mark_not_applicable();         \
    MESSAGE("not applicable (SKIP): " << why); \
    return;                                    \
  } while (false)

#define VSR_CU_IS(expected, call) CHECK_EQ(::vsr_conf::error_name(call), std::string(#expected))
#define VSR_CU_REQUIRE_OK(call) \
  REQUIRE_EQ(::vsr_conf::error_name(call), std::string("CUDA_SUCCESS"))
// A call that must fail; which code it returns is only asserted under --strict.
#define VSR_CU_FAILS(strict_expected, call)                                          \
  do {                                                                               \
    const std::string vsr_got_ = ::vsr_conf::error_name(call);                       \
    CHECK_NE(vsr_got_, std::string("CUDA_SUCCESS"));                                 \
    if (::vsr_conf::env().strict) CHECK_EQ(vsr_got_, std::string(#strict_expected)); \
  } while (false)
