// SPDX-License-Identifier: Apache-2.0
// Process-wide pool state behind memory.hpp: the configured tier, one pool per device, the OOM
// handlers. Internal; tests use reset_memory_pools().
#pragma once

#include "memory/device_pool.hpp"

#include <atomic>
#include <string>

namespace vibespatial::raster::detail {

/// Devices the pools serve (ordinals 0 .. kMaxDevices - 1): one slot each in the registry and in
/// every thread's cache set.
inline constexpr int kMaxDevices = 64;
// The VMM pool's slack when VIBESPATIAL_GPU_POOL_RESERVE is unset or "auto" (memory.hpp): a
// negative value selects the adaptive default (VmmPool::slack_allowed).
inline constexpr double kDefaultReserve = -1.0;

/// Set in a child process forked (pthread_atfork) from a process that had used the pool. The
/// child inherits the pool's mutexes in whatever state the parent's other threads left them, and
/// CUDA cannot be used after fork() without exec(): every pool entry point checks this first and
/// throws (throw_forked_child), touching no lock. Never cleared.
extern std::atomic<bool> g_forked_child;

inline bool in_forked_child() noexcept {
  return g_forked_child.load(std::memory_order_relaxed);
}

/// Throws DriverUnavailableError (CUDA_ERROR_NOT_INITIALIZED) saying that `function` cannot run in
/// a forked child.
[[noreturn]] void throw_forked_child(const char* function);

/// The configured tier's name, or "" before configuration. Never throws.
std::string configured_tier() noexcept;

/// The pool of `device`, creating it (and configuring the tier) if needed.
DevicePool& pool_for_device(int device);

/// Bytes of free physical memory the pools of `device` hold (what free_pool_memory() would give
/// back). 0 before configuration. Never throws.
std::size_t pool_free_bytes(int device) noexcept;

/// Tears every pool down (returning all memory, live blocks included, to the driver) and forgets
/// the tier, so the next call configures afresh from the environment. For tests: no other thread
/// may use the pool meanwhile, and every pointer from the old pools is invalid afterwards.
void reset_memory_pools() noexcept;

}  // namespace vibespatial::raster::detail
