// SPDX-License-Identifier: Apache-2.0
// The state behind memory.hpp that its three files share: the configured tier and the registry of
// pools (pool_registry.cpp), how a tier is chosen from the environment and the devices
// (memory_config.cpp), and the OOM recovery chain (oom_chain.cpp). Internal to src/memory.
#pragma once

#include "memory/device_pool.hpp"
#include "memory/process_facts.hpp"

#include <vibespatial/raster/memory.hpp>

#include <cuda.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace vibespatial::raster::detail {

enum class Tier { none = -1, a = 0, b = 1, c = 2, fallback = 3 };

/// "A", "B", "C", "fallback", or "" for Tier::none. (memory_config.cpp)
const char* tier_name(Tier t) noexcept;

struct Registry {
  std::mutex config_mutex;
  std::atomic<int> tier{static_cast<int>(Tier::none)};
  double reserve = kDefaultReserve;  // VIBESPATIAL_GPU_POOL_RESERVE, set with the tier
  std::array<std::atomic<DevicePool*>, kMaxDevices> pools{};
  // Why each device has the pool it has (MemoryPoolStats::tier_reason): set once under
  // config_mutex before the tier or the device's pool is published, read after; the strings
  // live in `reason_text` until reset_memory_pools().
  std::array<std::atomic<const std::string*>, kMaxDevices> reasons{};
  std::list<std::string> reason_text;
  // The VMM self-test of each device, run once per configuration (under config_mutex): 0 not
  // run, 1 passed, 2 failed (the text in vmm_failure).
  std::array<int, kMaxDevices> vmm_checked{};
  std::array<std::string, kMaxDevices> vmm_failure;
  std::array<std::atomic<std::size_t>, kMaxDevices> recoveries{};
  std::mutex handler_mutex;
  std::map<std::uint64_t, std::shared_ptr<OomHandler>> handlers;
  std::uint64_t next_handler = 1;
};

/// The process's registry, created on first use and never destroyed: pools outlive static
/// destruction, so nothing calls the driver after main. (pool_registry.cpp)
Registry& registry();

inline Tier current_tier() {
  return static_cast<Tier>(registry().tier.load(std::memory_order_acquire));
}

/// Notes that this process has used the pool (see g_forked_child). (pool_registry.cpp)
void note_pool_use() noexcept;

/// The device of the calling thread's current context, binding device 0's primary context to a
/// thread that has none. (pool_registry.cpp)
int current_device();

/// Whether `device` can use the VMM pool; if not, `why` says so. config_mutex held.
/// (memory_config.cpp)
bool device_has_vmm(int device, std::string* why);

/// Records why `device` has its tier (once). config_mutex held. (memory_config.cpp)
void set_reason(int device, std::string text);

/// After `pool` found the device full for a request: OutOfMemoryError, or in tier B the
/// recovery chain and the block it finally got. (oom_chain.cpp)
void* allocate_after_full(DevicePool& pool, std::size_t bytes, CUstream stream,
                          const DeviceFull& full);

}  // namespace vibespatial::raster::detail
