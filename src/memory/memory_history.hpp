// SPDX-License-Identifier: Apache-2.0
// The recorder behind memory_history.hpp, as the pools call it: one relaxed load while recording
// is off; while on, a small fixed-size event into the calling thread's buffer (no lock), moved
// into the bounded ring under the recorder's mutex when the buffer fills, for a snapshot or
// statistics, and when the thread exits. Internal to src/memory (docs/memory-pool.md).
#pragma once

#include "memory/library_tag.hpp"

#include <vibespatial/raster/memory.hpp>
#include <vibespatial/raster/memory_history.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace vibespatial::raster::detail::history {

extern std::atomic<bool> g_on;

/// Whether recording is on (one relaxed load: the only cost while it is off).
inline bool on() noexcept {
  return g_on.load(std::memory_order_relaxed);
}

/// A time stamp: the time-stamp counter where it is cheap (x86-64), else the steady clock in ns.
inline std::uint64_t ticks() noexcept {
#if defined(__x86_64__)
  return __rdtsc();
#else
  return static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
#endif
}

/// Starts a new history of at most `max_entries` events (1 to kMaxMemoryHistoryEntries, which
/// the caller checked), or, while recording, sets the bound to it. Returns whether a new history
/// started. Takes the recorder's mutex. The public record_memory_history (memory_snapshot.cpp)
/// orders it with the owners kept at a stop (memory_owners.hpp).
bool start(std::size_t max_entries);
/// Stops recording; what was recorded stays for a snapshot until the next start. Returns
/// whether it was recording. Takes the recorder's mutex.
bool stop() noexcept;

/// Built-in tag ids.
inline constexpr std::uint16_t kTagUser = 0;
inline constexpr std::uint16_t kTagRaster = 1;

/// The calling thread's innermost tag id (kTagUser when none).
std::uint16_t current_tag() noexcept;

/// Records one event with the calling thread's tag (time stamp `t`, from ticks()); `extra` is
/// the device's free bytes for an oom (which has no address). Sizes are requested bytes for
/// allocs and frees (as PyTorch's trace has them), else bytes. Never throws: an event that
/// cannot be kept (no memory for the thread's buffer) is counted as dropped.
void record(MemoryAction action, int device, std::uint64_t addr, std::uint64_t size,
            std::uint64_t stream, std::uint64_t t, std::uint64_t extra = 0) noexcept;

inline void record_now(MemoryAction action, int device, std::uint64_t addr, std::uint64_t size,
                       std::uint64_t stream = 0, std::uint64_t extra = 0) noexcept {
  record(action, device, addr, size, stream, ticks(), extra);
}

/// The calling thread's clock: its last time stamp, refreshed from ticks() every 64th call and
/// by every event recorded with a fresh one; it never goes back. Cheaper than ticks(), and
/// enough for events whose order other threads' events depend on only through a pool's locked
/// paths, which call touch_clock(): a thread's allocs, and its frees of blocks it allocated
/// (free_time). A free of a block another thread allocated needs a fresh stamp: the other
/// thread's alloc may be later than this thread's clock.
std::uint64_t clock() noexcept;
/// Refreshes the calling thread's clock from ticks() (a pool's locked paths, while recording).
void touch_clock() noexcept;
/// The calling thread's id in the history (never 0; assigned on first use, never reused).
std::uint32_t thread_id() noexcept;

/// The calling thread's recorder state. A pool's per-thread cache keeps its address and passes
/// it to record_alloc and record_free, which then skip the thread-local lookup (one call into
/// the C library per event in a shared library). Only that thread may pass it, while it runs.
struct ThreadState;
ThreadState& thread_state() noexcept;

/// Owner stamps: what a pool keeps with each block allocated while recording, so that the owner
/// statistics and the snapshot's owners come from the pools' own records of their live blocks
/// (no map of live blocks beside them), and a free knows whether its thread allocated the block.
/// A stamp holds the history's session (the low 16 bits of a number that grows at every start,
/// never 0 there), the allocating thread's tag id and its thread_id(); 0 for a block never
/// stamped. A block is owned in the current history when its stamp's session is the current
/// one, since every allocation of a session stamps its block while the session records.
inline std::uint16_t stamp_session(std::uint64_t stamp) noexcept {
  return static_cast<std::uint16_t>(stamp >> 48);
}
inline std::uint16_t stamp_tag(std::uint64_t stamp) noexcept {
  return static_cast<std::uint16_t>(stamp >> 32);
}
inline std::uint32_t stamp_thread(std::uint64_t stamp) noexcept {
  return static_cast<std::uint32_t>(stamp);
}
/// The session a stamp of the history being recorded carries (0 before the first start).
std::uint16_t current_session() noexcept;

/// An alloc event at the thread's clock (with `fresh`, at ticks(): for pools whose locked paths
/// do not keep the thread's clock fresh), for `requested` bytes. Returns the block's owner stamp
/// (even when the event could not be kept), which the pool stores with the block. A pool calls
/// it while recording, after any page it mapped for the block and before the block can reach
/// another thread.
std::uint64_t record_alloc(int device, std::uint64_t addr, std::uint64_t requested,
                           std::uint64_t stream, bool fresh = false) noexcept;
/// record_alloc for the thread whose thread_state() is `self` (the calling thread's).
std::uint64_t record_alloc(ThreadState& self, int device, std::uint64_t addr,
                           std::uint64_t requested, std::uint64_t stream,
                           bool fresh = false) noexcept;

/// The time stamp a pool takes for the free of a block whose owner stamp is `stamp`, by the
/// thread with history id `self`, before the block can be reused: 0 (the thread's clock, read
/// by record_free) when that thread allocated it, else ticks(). The thread's clock is then at
/// least the alloc's stamp, and no other thread can see the block before the free is done.
inline std::uint64_t free_time(std::uint64_t stamp, std::uint32_t self) noexcept {
  return stamp_thread(stamp) == self ? 0 : ticks();
}
/// A free's two events, free_requested and free_completed, at `t` (free_time(), or a ticks()
/// read before the block could be reused; 0: the thread's clock), for `requested` bytes. A pool
/// calls it after the free succeeded.
void record_free(int device, std::uint64_t addr, std::uint64_t requested, std::uint64_t stream,
                 std::uint64_t t) noexcept;
/// record_free for the thread whose thread_state() is `self` (the calling thread's).
void record_free(ThreadState& self, int device, std::uint64_t addr, std::uint64_t requested,
                 std::uint64_t stream, std::uint64_t t) noexcept;

/// A live block a pool stamped in the current session: its address, requested bytes and tag.
struct OwnedBlock {
  std::uint64_t addr;
  std::uint64_t bytes;
  std::uint16_t tag;
};

/// Live bytes and counts per owner tag of `blocks`, largest first.
std::vector<OwnerUsage> usage_by_owner(const std::vector<OwnedBlock>& blocks);
/// The owner tag of each of `blocks`, by address.
std::unordered_map<std::uint64_t, std::string> owners_by_address(
    const std::vector<OwnedBlock>& blocks);

/// The history at a snapshot's cut (memory_snapshot.cpp). Made while every pool is held still
/// (DevicePool::hold_still): it takes the recorder's lock and moves every event recorded so far
/// into the ring, so that the ring holds every event of every change the pools have made up to
/// the cut, and none of a later one (those wait in their threads' buffers for the next
/// snapshot). The pools may be released after it is made. fill() then writes the ring's events,
/// oldest first, and how many it let go, into a snapshot. The recorder's lock is held until
/// fill() (or destruction): a thread whose buffer fills meanwhile waits for it.
class TraceCut {
 public:
  TraceCut();
  TraceCut(const TraceCut&) = delete;
  TraceCut& operator=(const TraceCut&) = delete;
  void fill(MemorySnapshot& snapshot, int device_count);

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace vibespatial::raster::detail::history
