// SPDX-License-Identifier: Apache-2.0
// Who owns the live blocks (memory_history.hpp, "owner tags"): read from the pools' owner stamps
// while the history records, and kept as they were when it stopped until the next start. What
// memory_pool_stats()'s owners, the OOM message and the snapshot's block owners say. Internal to
// src/memory (docs/memory-pool.md, "Memory history and snapshots").
#pragma once

#include "memory/memory_history.hpp"

#include <vibespatial/raster/memory.hpp>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace vibespatial::raster::detail {

class DevicePool;

/// The live blocks of `device` allocated while the current history recorded (each pool's
/// stamped blocks); after a stop, those kept at the stop. Empty when nothing was recorded. Takes
/// the device pool's lock. Throws std::bad_alloc.
std::vector<history::OwnedBlock> owned_blocks(int device);

/// Live bytes and counts per owner tag on `device`, largest first (owned_blocks).
std::vector<OwnerUsage> owner_usage(int device);

/// The owned live blocks of `pools` (owned_blocks), for a snapshot that holds each of them still
/// (DevicePool::hold_still): read from the pools under the caller's hold while recording, else
/// those kept at the stop.
std::vector<history::OwnedBlock> owned_blocks_held(const std::vector<const DevicePool*>& pools);

/// Keeps every device's owned blocks as they are now (the history stops: afterwards no stamp
/// is written, so the pools' stamps would go stale as blocks are freed and reused). Takes the
/// pools' locks: never called under the recorder's mutex. Without host memory, keeps none.
void keep_owned_blocks() noexcept;

/// Forgets the blocks kept at a stop (a new history starts).
void forget_owned_blocks() noexcept;

}  // namespace vibespatial::raster::detail
