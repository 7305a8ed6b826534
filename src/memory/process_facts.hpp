// SPDX-License-Identifier: Apache-2.0
// The memory layer's ground floor: facts of the process that every pool and the recorder read,
// with nothing of the pools or the registry above them: how many devices the pools serve, the
// slack default, and whether this process is a child forked from one that used the pool.
// Internal to src/memory.
#pragma once

#include <atomic>

namespace vibespatial::raster::detail {

/// Devices the pools serve (ordinals 0 .. kMaxDevices - 1): one slot each in the registry and in
/// every thread's cache set.
inline constexpr int kMaxDevices = 64;
// The VMM pool's slack when VIBESPATIAL_GPU_POOL_RESERVE is unset or "auto" (memory.hpp): a
// negative value selects the adaptive default (VmmPool::slack_allowed).
inline constexpr double kDefaultReserve = -1.0;

/// Set in a child process forked (pthread_atfork, pool_registry.cpp) from a process that had used
/// the pool. The child inherits the pool's mutexes in whatever state the parent's other threads
/// left them, and CUDA cannot be used after fork() without exec(): every pool entry point checks
/// this first and throws (throw_forked_child), touching no lock. Never cleared.
extern std::atomic<bool> g_forked_child;

inline bool in_forked_child() noexcept {
  return g_forked_child.load(std::memory_order_relaxed);
}

/// Throws DriverUnavailableError (CUDA_ERROR_NOT_INITIALIZED) saying that `function` cannot run in
/// a forked child.
[[noreturn]] void throw_forked_child(const char* function);

}  // namespace vibespatial::raster::detail
