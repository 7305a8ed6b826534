// SPDX-License-Identifier: Apache-2.0
// The interface every tier's per-device pool implements, and what the tiers share.
#pragma once

#include "driver/cuda_driver.hpp"
#include "memory/memory_history.hpp"

#include <vibespatial/raster/memory.hpp>
#include <vibespatial/raster/memory_history.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace vibespatial::raster::detail {

/// Thrown by a pool when the driver is out of device memory for a request. The module layer
/// turns it into OutOfMemoryError (after tier B's recovery chain).
struct DeviceFull {
  std::size_t requested_bytes;
  bool impossible = false;  ///< larger than the device could ever hold: no recovery can help
};

/// The identity the pool gives streams (memory.hpp, "Streams"): NULL and CU_STREAM_LEGACY are one
/// stream, the context's legacy stream (key nullptr); CU_STREAM_PER_THREAD names a different
/// stream on each thread (key per_thread_stream_key() of that thread); any other handle is its
/// own key. Keys are compared, never passed to the driver.
///
/// The calling thread's per-thread default stream as a key: an odd value, unique to the thread
/// for the life of the process, that no stream handle (a pointer) ever has.
CUstream per_thread_stream_key() noexcept;

/// A key that matches no stream: what marks and freed blocks of a forgotten stream
/// (forget_stream) carry, so that a new stream with the old handle value is not taken for it.
inline CUstream forgotten_stream() noexcept {
  return reinterpret_cast<CUstream>(~std::uintptr_t{0});
}

/// The key of `stream` on the calling thread.
inline CUstream stream_key(CUstream stream) noexcept {
  if (stream == CU_STREAM_LEGACY) return nullptr;
  if (stream == CU_STREAM_PER_THREAD) return per_thread_stream_key();
  return stream;
}

/// A point in a stream's work: memory freed on the stream with key `stream` is reusable on that
/// stream at once, and on any stream once `event` has completed (or at once on a stream made to
/// wait for `event`). A null event means "already complete". `stream` is a key (stream_key), or
/// forgotten_stream().
struct StreamMark {
  CUstream stream = nullptr;
  CUevent event = nullptr;
  bool complete = false;
};
using MarkRef = std::shared_ptr<StreamMark>;

/// Whether `r` is a sticky error (7xx): the context is poisoned until it is reset, and none of
/// its queued work will run any further; calls that report it may have done their work first
/// (cuda.h \notefnerr).
inline bool is_sticky_error(CUresult r) noexcept {
  return r >= 700 && r <= 799;
}

/// Recycles CUevents for marks. Not thread-safe: used under the owning pool's mutex.
class MarkFactory {
 public:
  explicit MarkFactory(int device) : device_(device) {}
  ~MarkFactory();
  MarkFactory(const MarkFactory&) = delete;
  MarkFactory& operator=(const MarkFactory&) = delete;

  /// Records a mark on `stream` (a handle the caller's public call named, so alive) carrying the
  /// key `key`. If the event cannot be created or recorded, falls back to synchronising `stream`
  /// and returns a complete mark. Throws CudaError only if that fails too.
  MarkRef record(CUstream stream, CUstream key);
  /// True if memory under `mark` may be used on the stream with key `key` now (queries the
  /// event once).
  bool ready_for(const MarkRef& mark, CUstream key);
  /// True if the mark's work has completed (queries the event once).
  bool completed(const MarkRef& mark);
  /// Blocks until the mark's work has completed.
  void wait(const MarkRef& mark);
  /// Makes `stream` (named by the caller's public call) wait for the mark's work: memory under
  /// the mark is then usable on `stream` at once. Throws CudaError.
  void wait_on(const MarkRef& mark, CUstream stream);
  /// Destroys pooled events (teardown).
  void destroy_all() noexcept;

 private:
  int device_;
  std::shared_ptr<std::vector<CUevent>> idle_ = std::make_shared<std::vector<CUevent>>();
};

/// Per-device counters shared by the tiers. Byte counts are requested sizes.
struct UsageCounters {
  std::atomic<std::int64_t> current_bytes{0}, current_count{0};
  std::atomic<std::int64_t> peak_bytes{0}, peak_count{0};
  std::atomic<std::uint64_t> total_bytes{0}, total_count{0};

  void on_allocate(std::size_t bytes) noexcept;
  void on_free(std::size_t bytes) noexcept;
  /// Folds a batch of changes made elsewhere (a thread cache): `peak_*` are the highest values the
  /// batch's running deltas reached.
  void fold(std::int64_t bytes, std::int64_t count, std::int64_t peak_bytes_delta,
            std::int64_t peak_count_delta, std::uint64_t total_b, std::uint64_t total_c) noexcept;
};

void atomic_max(std::atomic<std::int64_t>& target, std::int64_t value) noexcept;

/// device_deallocate's precondition on the block `ptr` that a pool looked up among its live
/// blocks: `allocated` is the size it was allocated with, or null when `ptr` is not one. Throws
/// std::invalid_argument (VSR_EXPECTS) saying which, so that every tier words it alike.
void expect_live_block(const void* ptr, const std::size_t* allocated, std::size_t freed);

/// The snapshot segment of one allocation got from the driver (tiers C and fallback, as PyTorch's
/// classic allocator shows each cudaMalloc): `size` bytes at `ptr` holding one block, live
/// (active_allocated, `requested` bytes asked for) when `requested` > 0, else inactive (cached,
/// or waiting for its stream's work before cuMemFree).
MemorySnapshotSegment driver_allocation_segment(int device, CUdeviceptr ptr, std::size_t size,
                                                std::size_t requested);

/// Sorts the segments `out` holds from index `first` on by address (a pool's collect_segments).
void sort_by_address(std::vector<MemorySnapshotSegment>& out, std::size_t first);

/// Records that a pool got (`action` segment_alloc) or gave back (segment_free) the driver
/// allocation of `size` bytes at `ptr`, after the driver call succeeded: one relaxed load while
/// recording is off. Called with the pool's mutex held, so that the history's order of a
/// segment's events and its blocks' events is the order they happened in.
inline void note_driver_allocation(MemoryAction action, int device, CUdeviceptr ptr,
                                   std::size_t size) noexcept {
  if (history::on()) [[unlikely]]
    history::record_now(action, device, ptr, size);
}

/// What a pool holds at an address (DevicePool::block_at).
struct BlockAt {
  enum class Kind {
    none,      ///< memory the pool does not hold
    not_live,  ///< memory the pool holds in no live block (freed, cached, or never handed out)
    live,      ///< inside the live block of `bytes` requested bytes at `begin`
  };
  Kind kind = Kind::none;
  std::uintptr_t begin = 0;
  std::size_t bytes = 0;
};

/// One device's pool of one tier.
class DevicePool {
 public:
  virtual ~DevicePool() = default;
  /// Throws DeviceFull when the device has no memory left for the request, CudaError on other
  /// driver failures. `bytes` > 0.
  virtual void* allocate(std::size_t bytes, CUstream stream) = 0;
  /// Throws std::invalid_argument (changing nothing) for pointers it does not own as live blocks
  /// of exactly `bytes`.
  virtual void deallocate(void* ptr, std::size_t bytes, CUstream stream) = 0;
  /// True if `ptr` lies in memory this pool manages (live or not). Lock-free where possible.
  virtual bool owns(const void* ptr) const noexcept = 0;
  /// Where `ptr` (any address, a block's interior included) lies in this pool's memory: the
  /// exact extent of the live block holding it, as requested (check_device_range). Takes the
  /// pool's lock.
  virtual BlockAt block_at(const void* ptr) const = 0;
  /// Gives every free physical byte back to the driver, waiting for pending frees.
  virtual void trim() = 0;
  /// forget_stream(stream) for this pool: memory freed on `stream` stops being "same stream" for
  /// its handle value and becomes reusable anywhere once the stream's work so far has completed.
  /// Throws CudaError (changing nothing) when no mark can be recorded on `stream`.
  virtual void forget(CUstream stream) = 0;
  virtual void fill_stats(MemoryPoolStats& stats) const noexcept = 0;
  /// Human-readable state for error messages.
  virtual std::string describe() const = 0;
  /// Checks the pool's internal bookkeeping (as mimalloc's _mi_page_is_valid): "" when it is
  /// consistent, else what is wrong. Takes the pool's lock; for tests and debug builds.
  virtual std::string check_invariants() const { return {}; }
  /// The [begin, end) of the slab holding small block `ptr` ({0, 0} if none): for tests.
  virtual std::pair<std::uintptr_t, std::uintptr_t> slab_extent(const void* /*ptr*/) const {
    return {0, 0};
  }
  /// Returns everything to the driver, live blocks included. Never throws.
  virtual void teardown() noexcept = 0;
  /// Holds the pool still for a snapshot's cut (memory_snapshot.cpp): takes its lock and waits
  /// until no thread is on a lock-free path of it. Until release_still(), every allocation and
  /// free of the pool waits, and every one that returned or stands waiting has recorded all of
  /// its history events or none: a pool records a block's events in the same locked (or
  /// fast-path) section that changes the block. Meanwhile the caller may call only
  /// collect_segments and collect_owned_locked, and the history's recorder.
  virtual void hold_still() const = 0;
  virtual void release_still() const noexcept = 0;
  /// Appends this pool's segments to `out` (memory_history.hpp). The caller holds the pool still.
  virtual void collect_segments(std::vector<MemorySnapshotSegment>& out) const = 0;
  /// Appends each live block whose owner stamp is of history session `session` to `out`, under
  /// the pool's lock (memory_owners.hpp). A pool records a block's alloc event and keeps the
  /// stamp history::record_alloc returns while recording (history::on()), before the block can
  /// reach another thread.
  virtual void collect_owned(std::uint16_t session,
                             std::vector<history::OwnedBlock>& out) const = 0;
  /// collect_owned, with the pool held still by the caller (hold_still).
  virtual void collect_owned_locked(std::uint16_t session,
                                    std::vector<history::OwnedBlock>& out) const = 0;
  int device() const noexcept { return device_; }

 protected:
  explicit DevicePool(int device) : device_(device) {}
  int device_;
};

/// `reserve`: the slack as a fraction of the peak of live large pages (0 to 1), or negative for
/// the adaptive default.
std::unique_ptr<DevicePool> make_vmm_pool(int device, double reserve);
/// Maps one page through the VMM calls the pool uses (reserve, create, map, set access, then
/// unmap, release, free) on `device`. Returns "" when they work, else what failed (e.g.
/// "cuMemMap returned CUDA_ERROR_NOT_SUPPORTED"): some drivers claim VMM support and then fail
/// these calls (sandboxes, §7 #8, #9). A device too full for one page passes (the pool then
/// reports the OOM itself). Throws CudaError/DriverUnavailableError only for failures outside the
/// VMM calls (binding the device's context).
std::string vmm_self_test(int device);
std::unique_ptr<DevicePool> make_fallback_pool(int device);
std::unique_ptr<DevicePool> make_managed_pool(int device);

std::string format_bytes(std::size_t bytes);

}  // namespace vibespatial::raster::detail
