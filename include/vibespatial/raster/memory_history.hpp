// SPDX-License-Identifier: Apache-2.0
// The device pool's memory history and snapshots, in the format of PyTorch's
// torch.cuda.memory._snapshot() (docs/memory-pool.md, "Memory history and snapshots").
//
// Recording is off by default; while it is off the pool pays one relaxed load and a predictable
// branch per call. record_memory_history(true) starts it: from then on every allocation, free,
// page mapped or unmapped, page created or released (tiers A and B), driver allocation got or
// given back (tiers C and fallback), trim and OOM of every device's pool is recorded with its
// time, device, stream, address, size and owner tag, into a buffer of the calling thread (no
// lock) that is moved into one bounded ring (the most recent `max_entries` events are kept) when
// it fills, when a snapshot or statistics are taken, and when the thread exits.
//
// Owner tags: each thread has a stack of tags; an event carries the innermost one, or "user" when
// the stack is empty. The library's own buffers and temporaries carry "raster" when the caller
// set no tag; the CuPy, PyTorch and Numba plug-ins carry "cupy", "torch" and "numba". Tags are
// interned once (a push), never copied per event.
#pragma once

#include <vibespatial/raster/export.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace vibespatial::raster {

/// The most events a history may keep (max_entries); more is refused.
inline constexpr std::size_t kMaxMemoryHistoryEntries = std::size_t{1} << 24;
/// The longest owner tag, in bytes.
inline constexpr std::size_t kMaxMemoryTagLength = 256;
/// The most tags a thread may have pushed at once.
inline constexpr std::size_t kMaxMemoryTagDepth = 64;

/// Starts (`enabled` true) or stops recording. Starting when stopped discards the previous
/// history and keeps the most recent `max_entries` events from now on; starting again while
/// recording keeps what was recorded and changes the bound (the oldest events go if it shrinks).
/// Stopping keeps the history for memory_snapshot() until recording starts again.
/// Thread-safe.
/// @throws std::invalid_argument when `enabled` and `max_entries` is 0; std::out_of_range when
///         it is above kMaxMemoryHistoryEntries. Nothing changes then. DriverUnavailableError in
///         a forked child (memory.hpp, fork()), where memory_snapshot() is empty.
VSR_EXPORT void record_memory_history(bool enabled, std::size_t max_entries = 100000);

/// Whether recording is on.
VSR_EXPORT bool memory_history_enabled() noexcept;

/// Pushes `tag` on the calling thread's tag stack: later events of this thread carry it until
/// pop_memory_tag(). Prefer MemoryTag.
/// @throws std::invalid_argument for an empty tag, one longer than kMaxMemoryTagLength bytes or
///         one holding a NUL byte; std::out_of_range when the thread already has
///         kMaxMemoryTagDepth tags pushed, or 65,000 distinct tags exist. Nothing changes then.
VSR_EXPORT void push_memory_tag(std::string_view tag);
/// Pops the calling thread's innermost tag.
/// @throws std::logic_error when the thread has no tag pushed (nothing changes).
VSR_EXPORT void pop_memory_tag();
/// The calling thread's innermost tag, or "user".
VSR_EXPORT std::string current_memory_tag();
/// The calling thread's tag depth (tags pushed and not popped).
VSR_EXPORT std::size_t memory_tag_depth() noexcept;

/// RAII owner tag: pushes `tag` for its lifetime (see push_memory_tag for what it throws).
class VSR_EXPORT MemoryTag {
 public:
  explicit MemoryTag(std::string_view tag);
  ~MemoryTag();
  MemoryTag(const MemoryTag&) = delete;
  MemoryTag& operator=(const MemoryTag&) = delete;

 private:
  std::size_t depth_;  // the stack's depth with this tag on it
};

/// A default owner for a scope: pushes `tag` only when the calling thread has no tag pushed, so
/// that a tag the caller set wins (the library's "raster", the plug-ins' "cupy", "torch",
/// "numba"). Same errors as MemoryTag.
class VSR_EXPORT DefaultMemoryTag {
 public:
  explicit DefaultMemoryTag(std::string_view tag);
  ~DefaultMemoryTag();
  DefaultMemoryTag(const DefaultMemoryTag&) = delete;
  DefaultMemoryTag& operator=(const DefaultMemoryTag&) = delete;

 private:
  bool pushed_;
};

/// Records a user marker (`name`, validated as a tag) in the history if recording is on: an
/// "annotate" entry in device 0's trace. Same errors as push_memory_tag.
VSR_EXPORT void memory_history_marker(std::string_view name);

/// What an event records.
enum class MemoryAction : std::uint8_t {
  alloc,           ///< a block handed out (addr, size: its rounded size)
  free_requested,  ///< device_deallocate called
  free_completed,  ///< the block is reusable by the pool (at once on its own stream)
  segment_map,     ///< pages mapped at addr (size bytes): a segment grows or appears
  segment_unmap,   ///< pages unmapped at addr
  page_create,     ///< a physical page created (cuMemCreate; addr 0: it has no address yet)
  page_release,    ///< a physical page released (cuMemRelease; addr 0)
  trim,            ///< free_pool_memory() on a pool (size: bytes it released)
  oom,             ///< a request failed (size: requested; device_free: the driver's free bytes)
  annotate,        ///< a user marker (the owner field is its name)
  segment_alloc,   ///< memory got from the driver at addr (size bytes): a new segment (tiers C
                   ///< and fallback: a cuMemAllocManaged or cuMemAlloc)
  segment_free,    ///< the segment at addr given back to the driver (cuMemFree)
};
/// The action's name in a snapshot's trace: PyTorch's ("alloc", "free_requested",
/// "free_completed", "segment_map", "segment_unmap", "segment_alloc", "segment_free", "oom",
/// "annotate"), and "page_create", "page_release" and "trim", which PyTorch's readers pass over
/// (a page has no address until it is mapped, so it is no "segment_alloc").
VSR_EXPORT const char* memory_action_name(MemoryAction action) noexcept;

struct MemoryHistoryEvent {
  MemoryAction action = MemoryAction::alloc;
  int device = 0;
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
  std::uint64_t stream = 0;       ///< the CUstream value the call passed (0: legacy)
  std::uint64_t time_us = 0;      ///< microseconds since the Unix epoch
  std::uint64_t device_free = 0;  ///< oom only: what the driver reported free
  std::string owner;              ///< the owner tag (a marker's name for annotate)
};

/// One block of a segment: blocks tile their segment in address order.
struct MemorySnapshotBlock {
  std::uint64_t address = 0;
  std::uint64_t size = 0;            ///< bytes of the segment it covers
  std::uint64_t requested_size = 0;  ///< live blocks: the size requested; else 0
  bool active = false;               ///< "active_allocated" (live), else "inactive"
  std::string owner;                 ///< the live block's owner tag, when it was recorded
};

/// One segment: a run of mapped large pages or a mapped page of small blocks (tiers A and B), or
/// one allocation got from the driver (tiers C and fallback: a cuMemAllocManaged or cuMemAlloc).
struct MemorySnapshotSegment {
  int device = 0;
  std::uint64_t address = 0;
  std::uint64_t total_size = 0;
  std::uint64_t allocated_size = 0;  ///< bytes of live blocks (their block sizes)
  /// "small" (a page of slabs; a driver allocation of 1 MiB at most) or "large".
  bool small = false;
  /// A run of mapped pages that grows and shrinks by segment_map / segment_unmap (PyTorch's
  /// expandable segments: tiers A and B's large segments); false for a driver allocation.
  bool expandable = false;
  std::vector<MemorySnapshotBlock> blocks;
};

struct MemorySnapshot {
  std::vector<MemorySnapshotSegment> segments;
  /// One list per device (as many as the process has, at least one), oldest event first.
  std::vector<std::vector<MemoryHistoryEvent>> device_traces;
  std::uint64_t dropped_events = 0;  ///< events the bounded ring let go (memory_snapshot)
  bool recording = false;
};

/// The segments of every device's pool and the recorded history. Blocks freed into a thread's
/// cache, or cached by the fallback tier, are inactive; so are tier C's freed blocks that wait
/// for their stream's work before cuMemFree. Thread-safe, and one cut: every pool is held still
/// (allocations and frees of other threads wait) while the segments are read and the events
/// recorded so far are gathered, so every change before the cut is in both the segments and the
/// trace, and none after it in either. The trace is every event after one moment: when the
/// bound let events go, also the kept events from before the latest one let go are left out
/// (and counted in dropped_events).
/// @throws std::bad_alloc.
VSR_EXPORT MemorySnapshot memory_snapshot();

/// Writes memory_snapshot() as a pickle of PyTorch's snapshot dict (docs/memory-pool.md) to
/// `path`, all or nothing, by the writer of every output (outputs.hpp): a private temporary
/// directory beside `path`, its file renamed into place when complete. An existing `path` is
/// refused unless `overwrite`; a FIFO, socket or device is never replaced.
/// @throws std::invalid_argument for an empty path, one that names no file, a directory, FIFO,
///         socket or device; std::system_error with the errno: std::errc::file_exists for an
///         existing path without `overwrite`, no_such_file_or_directory for a missing directory,
///         and so on; no file is left behind.
VSR_EXPORT void dump_memory_snapshot(const std::string& path, bool overwrite = false);

/// PyTorch's snapshot dict of `snapshot`, pickled (protocol 2).
VSR_EXPORT std::string memory_snapshot_pickle(const MemorySnapshot& snapshot);

}  // namespace vibespatial::raster
