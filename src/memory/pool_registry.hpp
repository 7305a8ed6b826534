// SPDX-License-Identifier: Apache-2.0
// Process-wide pool state behind memory.hpp: the configured tier, one pool per device, the OOM
// handlers. Internal; tests use reset_memory_pools().
#pragma once

#include "memory/device_pool.hpp"
#include "memory/process_facts.hpp"

#include <atomic>
#include <string>

namespace vibespatial::raster::detail {

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
