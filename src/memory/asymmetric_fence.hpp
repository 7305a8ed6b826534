// SPDX-License-Identifier: Apache-2.0
// An asymmetric store-load fence: a full barrier split unevenly between a hot side, which pays a
// compiler barrier only, and a rare side, which makes every running thread of the process execute
// a memory barrier (Linux membarrier(2), MEMBARRIER_CMD_PRIVATE_EXPEDITED). It is folly's
// asymmetricLightBarrier / asymmetricHeavyBarrier pair, and what lets the pool take blocks out of
// another thread's cache while that thread's fast path stays free of atomic read-modify-writes
// (vmm_pool.cpp, ThreadCache).
//
// Use (Dekker's pattern): the hot side stores its flag, calls light_fence(), then loads the other
// side's flag; the rare side stores its flag, calls heavy_fence(), then loads the hot side's. At
// least one of the two loads sees the other side's store.
#pragma once

#include <atomic>

namespace vibespatial::raster::detail {

/// True when heavy_fence() works in this process (the kernel supports and registered the
/// private expedited membarrier). Decided on the first call; never changes afterwards. Builds
/// under ThreadSanitizer, which cannot see the kernel's barrier, report false.
bool asymmetric_fence_available() noexcept;

/// The hot side: orders nothing in hardware; only correct paired with heavy_fence().
inline void light_fence() noexcept {
  std::atomic_signal_fence(std::memory_order_seq_cst);
}

/// The rare side: returns once every thread of the process has executed a full memory barrier
/// (or was not running). Costs a system call and an interrupt per CPU running this process.
/// Returns false if the system call failed; then nothing may be concluded from the fence.
bool heavy_fence() noexcept;

}  // namespace vibespatial::raster::detail
