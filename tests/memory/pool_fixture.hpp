// SPDX-License-Identifier: Apache-2.0
// Shared helpers of the pool tests: a fresh pool per test, emulator options, patterns.
#pragma once

#include "driver/cuda_driver.hpp"
#include "emulator_control.hpp"
#include "memory/pool_registry.hpp"
#include "tests/outstanding_checks.hpp"

#include <vibespatial/raster/errors.hpp>
#include <vibespatial/raster/memory.hpp>

#include <doctest/doctest.h>

#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

namespace vsr_test {

/// Calls of driver entry point `entry` (nullptr: of every entry point) that the emulator's fault
/// plan made fail since the plan was last set (vsr_emu_fault_count): a test checks with it that
/// the fault it planned was reached and injected, not only that the run survived.
inline unsigned long long faults_fired(const char* entry) {
  using Fn = unsigned long long (*)(const char*);
  static const Fn fn = [] {
    (void)emulator();  // checks that the emulator is the driver
    void* h = dlopen(std::getenv("VIBESPATIAL_CUDA_DRIVER"), RTLD_NOW | RTLD_LOCAL);
    return h == nullptr ? nullptr : reinterpret_cast<Fn>(dlsym(h, "vsr_emu_fault_count"));
  }();
  const bool resolved = fn != nullptr;
  REQUIRE_MESSAGE(resolved, "the emulator has no vsr_emu_fault_count");
  return fn(entry);
}

/// The emulator holds no device memory: no reservation, physical allocation, mapping,
/// cuMemAlloc or managed allocation (after reset_memory_pools(), nothing of the pool).
inline void check_no_device_memory() {
  vsr_emu_test::check_no_device_memory(emulator().outstanding());
}

/// Nothing the pool created is left in the emulator (after reset_memory_pools()), and no pinned
/// host memory either.
inline void check_nothing_outstanding() {
  check_no_device_memory();
  CHECK(emulator().outstanding().host_allocations == 0);
}

/// Tears the pools down, checks that the emulator holds no device memory (check_no_device_memory:
/// pinned host memory is not checked, as the dispatch layer keeps its staging buffers between
/// calls), applies emulator options and the tier's environment, and at scope exit tears down and
/// checks again.
/// Meanwhile no driver call may name a destroyed stream or event or a released handle
/// (stale_handles), and nothing may be unmapped or freed under queued work
/// (unmap_with_pending_work): checked at scope exit.
class FreshPool {
 public:
  explicit FreshPool(const char* tier_env = nullptr, std::size_t device_memory = 512u << 20,
                     const char* vmm = "1") {
    const vsr_emu_outstanding o = emulator().outstanding();
    stale_before_ = o.stale_handles;
    unmap_before_ = o.unmap_with_pending_work;
    vibespatial::raster::detail::reset_memory_pools();
    check_no_device_memory();
    emulator().set_fail(nullptr);
    REQUIRE(emulator().set_option("DEVICE_MEMORY", std::to_string(device_memory).c_str()) == 0);
    REQUIRE(emulator().set_option("VMM", vmm) == 0);
    unsetenv("VIBESPATIAL_GPU_POOL_ONLY");
    unsetenv("VIBESPATIAL_GPU_MANAGED_MEMORY");
    unsetenv("VIBESPATIAL_GPU_POOL_RESERVE");
    if (tier_env != nullptr) setenv(tier_env, "1", 1);
  }
  ~FreshPool() {
    vibespatial::raster::detail::reset_memory_pools();
    emulator().set_fail(nullptr);
    emulator().set_option("VMM", "1");
    unsetenv("VIBESPATIAL_GPU_POOL_ONLY");
    unsetenv("VIBESPATIAL_GPU_MANAGED_MEMORY");
    unsetenv("VIBESPATIAL_GPU_POOL_RESERVE");
    check_no_device_memory();
    const vsr_emu_outstanding o = emulator().outstanding();
    const std::size_t calls_naming_destroyed_handles = o.stale_handles - stale_before_;
    const std::size_t unmaps_or_frees_under_queued_work = o.unmap_with_pending_work - unmap_before_;
    CHECK(calls_naming_destroyed_handles == 0);
    CHECK(unmaps_or_frees_under_queued_work == 0);
  }
  FreshPool(const FreshPool&) = delete;
  FreshPool& operator=(const FreshPool&) = delete;

 private:
  std::size_t stale_before_ = 0;
  std::size_t unmap_before_ = 0;
};

/// Sets an emulator option for the scope, then puts it back to what the environment gave.
class EmulatorOption {
 public:
  EmulatorOption(const char* name, const char* value) : name_(name) {
    REQUIRE(emulator().set_option(name, value) == 0);
  }
  ~EmulatorOption() { emulator().set_option(name_, "default"); }
  EmulatorOption(const EmulatorOption&) = delete;
  EmulatorOption& operator=(const EmulatorOption&) = delete;

 private:
  const char* name_;
};

/// Free device memory as the driver reports it now (cuMemGetInfo, in the current context): a
/// context costs memory, so tests that fill the device size it from this, never from the total.
inline std::size_t driver_free_bytes() {
  vibespatial::raster::detail::bind_current_device();
  std::size_t free_b = 0, total_b = 0;
  REQUIRE(vibespatial::raster::detail::driver().cuMemGetInfo(&free_b, &total_b) == CUDA_SUCCESS);
  return free_b;
}

/// A new non-blocking stream on the current device (the caller destroys it).
inline CUstream new_stream() {
  vibespatial::raster::detail::bind_current_device();
  CUstream s = nullptr;
  REQUIRE(vibespatial::raster::detail::driver().cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) ==
          CUDA_SUCCESS);
  return s;
}

inline void fill_pattern(void* p, std::size_t n, std::uint32_t seed) {
  auto* b = static_cast<unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<unsigned char>((i * 131 + seed) & 0xff);
}

inline bool check_pattern(const void* p, std::size_t n, std::uint32_t seed) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) {
    if (b[i] != static_cast<unsigned char>((i * 131 + seed) & 0xff)) return false;
  }
  return true;
}

constexpr std::size_t MiB = 1u << 20;

}  // namespace vsr_test
