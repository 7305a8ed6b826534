// SPDX-License-Identifier: Apache-2.0
// The VMM pool's types (tiers A and B), shared by its files: vmm_pool.cpp (the design, the public
// operations and stats), vmm_pages.cpp (address space and page supply), vmm_multi.cpp
// (multi-page handles), vmm_large.cpp (large blocks: free ranges and windows), vmm_small.cpp (small
// blocks: thread caches, slabs on spans, bump slabs), vmm_batches.cpp (stream marks of freed small
// blocks, forget_stream), vmm_check.cpp (invariant checks). Private to src/memory.
#pragma once

#include "memory/asymmetric_fence.hpp"
#include "memory/device_pool.hpp"
#include "memory/memory_history.hpp"
#include "memory/process_facts.hpp"
#include "memory/size_classes.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace vibespatial::raster::detail::vmm {

constexpr int kMaxRegions = 64;
constexpr int kBinCapacity = 64;
// Slots a slab is made for (at least one span): few for classes up to 8 KiB, whose slabs are then
// one or two spans (each thread and class holds one partly used), more for larger classes, so that
// their slabs stay few (a slab's header and slot records are what the fast path reads).
constexpr std::size_t kSlabSlots = 4;
constexpr std::size_t kSlabSlotsLarge = 16;
constexpr std::size_t kSlabSmallSlot = 8 << 10;
constexpr int kStatFlushOps = 64;
constexpr std::int64_t kStatFlushBytes = std::int64_t{4} << 20;
constexpr int kRefillScan = 64;             // shared free slots a refill examines at most
constexpr std::size_t kMaxForgetLog = 256;  // forget_stream() entries before caches are drained

class ThreadCache;

// Per-slot records in whole cache lines of their own: slabs are shared between threads, and a
// record array must not share a line with anything another thread writes. Zero when made.
template <typename T>
class BasicSlotRecords {
 public:
  void reset(std::size_t slots) {
    lines_ = std::make_unique<Line[]>((slots + kPerLine - 1) / kPerLine);
  }
  std::atomic<T>& operator[](std::size_t slot) noexcept {
    return lines_[slot / kPerLine].record[slot % kPerLine];
  }

 private:
  static constexpr std::size_t kPerLine = 64 / sizeof(T);
  struct alignas(64) Line {
    std::atomic<T> record[kPerLine];
  };
  std::unique_ptr<Line[]> lines_;
};
using SlotRecords = BasicSlotRecords<std::uint32_t>;

// Small blocks freed on one stream that reached the shared lists, with the mark that covers them
// once one is recorded. Its slots are reusable at once on the stream with key `key`, and on any
// stream once `mark` has completed (or behind a wait for it). A batch without a mark is the
// stream's unmarked batch (at most one per key), which new frees join until a call on the stream
// records the mark. Under the pool's mutex.
struct Batch {
  CUstream key = nullptr;  // the stream the blocks were freed on; forgotten_stream() once forgotten
  MarkRef mark;            // a mark on that stream recorded after the frees; null: none yet
  std::uint32_t slots = 0;  // shared slots that refer to it
  bool logged = false;      // a forget_stream() log entry refers to it
  std::size_t index = 0;    // its position in VmmPool::batches_
};

// A slot in a slab's shared free list.
struct SharedSlot {
  void* ptr;
  Batch* batch;
};

// A mapped page of a small region: slabs take runs of its spans (VmmPool::span_ bytes each), so
// that a thread's slab of one size class holds a few spans, not a whole page, and slabs of all
// classes and threads share pages. Under the pool's mutex.
struct SmallPage {
  CUmemGenericAllocationHandle handle = 0;
  int region = 0;
  std::size_t index = 0;         // the page's index in its region
  std::uint64_t free_spans = 0;  // bit i set: span i holds no slab
  bool open = false;             // listed in VmmPool::open_pages_
};

struct Slab {
  // Read on the fast path; fixed once the slab exists.
  CUdeviceptr base = 0;
  int size_class = 0;
  std::size_t slot_size = 0;
  std::uint32_t slot_count = 0;
  SmallPage* page = nullptr;
  std::uint32_t first_span = 0;  // its spans in `page`: [first_span, first_span + spans)
  std::uint32_t spans = 0;
  std::uint64_t slot_reciprocal = 0;  // floor(2^64 / slot_size) + 1: slot index by multiply
  // Requested size of each slot's live block (small blocks are at most 1 MiB); 0 when free. The
  // free path's compare-exchange on it is what detects double frees and wrong sizes without a
  // lock. 32 bits keep this hot, randomly accessed array small.
  SlotRecords requested;
  // The owner stamp of each slot's block (memory_history.hpp), written when it is allocated
  // while recording, before `requested`: a live slot's stamp is read after its `requested`.
  BasicSlotRecords<std::uint64_t> owners;

  /// The slot that `p` (inside this slab) falls in. Exact for offsets below 2^32.
  std::size_t slot_of(CUdeviceptr p) const noexcept {
    return static_cast<std::size_t>((static_cast<unsigned __int128>(p - base) * slot_reciprocal) >>
                                    64);
  }
  // Written under the pool's mutex, on a cache line of their own so that those writes do not
  // bounce the line the fast path reads between threads.
  alignas(64) std::uint32_t carved = 0;  // slots handed out at least once (a bump index)
  bool bump_owned = false;   // a thread's bump slab (ThreadCache::bump): not reclaimable meanwhile
  bool bump_listed = false;  // in its class's `unowned_bump` list (uncarved slots, no thread)
  std::uint32_t used = 0;    // carved slots not in `shared` (live or thread-cached)
  // The thread whose refills take this slab's shared slots (null: the next thread that needs
  // its class claims it). Threads thereby keep to slabs of their own, so two threads' blocks do
  // not share the cache lines of `requested`, which every allocation and free writes: with
  // blocks interleaved, two threads ran slower than one. A slab is disowned when it empties.
  ThreadCache* owner = nullptr;
  // Freed slots flushed from thread caches. A slab is in its owner's `with_shared` list (or its
  // class's `unowned` list) exactly while this is not empty.
  std::vector<SharedSlot> shared;
};

// A reservation of address space (size 0: a free slot). Under the pool's mutex; lock-free
// lookups read its copy in RegionLookup.
struct Region {
  CUdeviceptr base = 0;
  std::size_t size = 0;
  std::size_t pages = 0;
  bool small = false;
  std::unique_ptr<std::atomic<Slab*>[]> slabs;        // small: the slab of each span, or null
  std::vector<std::unique_ptr<SmallPage>> page_recs;  // small: each mapped page, or null
  std::vector<CUmemGenericAllocationHandle> handles;  // large: each page's handle, 0 = unmapped
  std::vector<std::size_t> vacant;                    // small: unmapped page indices below `bump`
  std::size_t bump = 0;                               // small: pages never used above this
  // Large: one past the highest page ever mapped. Pages above are all unmapped, so a window
  // search need not slide past it: its cost follows what was mapped, not the region's size.
  std::size_t mapped_end = 0;
};

// What lock-free lookups (owns, the free path) read of a region slot: a sequence lock, because a
// slot is reused for a new reservation once an empty region's address space was given back.
// `version` is odd while the slot is rewritten; the writer (holding the pool's mutex) stores it
// odd, then the fields with release, then even with release; a reader loads all with acquire and
// accepts what it read when the version was even and unchanged.
struct RegionLookup {
  std::atomic<std::uint64_t> version{0};
  std::atomic<CUdeviceptr> base{0};
  std::atomic<std::size_t> size{0};
  std::atomic<std::atomic<Slab*>*> slabs{nullptr};  // small regions only
};

// Pages mapped at `addr` whose map failed (access or a later page) and whose undo, the unmap,
// failed too: the driver still holds the mapping. The range is kept out of use (no slab, no
// window over it) and the handles out of the free lists until an unmap succeeds, retried before
// new pages are created and by trim(). They count as held, mapped and free.
struct StuckMapping {
  CUdeviceptr addr = 0;
  int region = 0;
  std::vector<CUmemGenericAllocationHandle> handles;  // one per page, or the one multi-page handle
  std::size_t pages = 0;
  bool multi_page = false;  // `handles` is one multi-page handle of all `pages`
};

// A multi-page handle: one cuMemCreate of `pages` pages, made when the pool grows by a long run
// of new large pages (one call rather than one per page: cuMemCreate is the costliest VMM call,
// 193 us on an A100, docs/cuda-driver-rules.md §7 #1). The driver maps a handle whole, at offset 0
// (§3.4.6), and unmaps only whole mappings (§3.4.7), so its pages stay mapped where they were
// made, together: free ones are reused there, and the handle is unmapped and released once all
// of its pages are free and idle (trim, or a full device that needs the memory elsewhere).
struct MultiPageHandle {
  CUmemGenericAllocationHandle handle = 0;
  std::size_t pages = 0;
};

struct LargeBlock {
  std::size_t pages = 0;
  std::size_t bytes = 0;
  std::uint64_t owner = 0;  // its owner stamp, when allocated while recording
};

struct FreeRange {
  std::size_t pages = 0;
  std::vector<MarkRef> marks;  // the frees this range is still waiting for
};

struct CacheEntry {
  void* ptr;
  CUstream stream;
  Slab* slab;
};

struct Bin {
  int count = 0;
  std::array<CacheEntry, kBinCapacity> entries;
};

class VmmPool;

/// A thread's cache of freed small blocks and its unshared statistics, for one device's pool.
// Cache-line aligned, so that one thread's writes never share a line with another thread's cache.
class alignas(64) ThreadCache {
 public:
  VmmPool* pool = nullptr;
  std::uint64_t epoch = 0;
  // The owning thread's per-thread default stream as a key (its bins hold CU_STREAM_PER_THREAD).
  CUstream per_thread_key = nullptr;
  // The owning thread's history::thread_id() (whether a block it frees is one it allocated) and
  // recorder state (its record calls, with no thread-local lookup).
  std::uint32_t history_id = 0;
  history::ThreadState* history_state = nullptr;
  // The pool's forget epoch this cache has applied to its bins (VmmPool::sync_forgotten). Read on
  // the fast path by the owner; written under the mutex by the owner or, after the handshake
  // below, by a thread that takes the cache's blocks.
  std::uint64_t forget_seen = 0;
  // The handshake that lets another thread take this cache's blocks (VmmPool::drain_caches), or
  // hold the pool still for a snapshot (hold_still), while the owner may be on its lock-free
  // fast path. The owner sets `active` around every use of its bins outside the mutex (and,
  // while recording, around the change of the block and its history events) and then checks
  // `steal`: if set, it leaves and takes the locked path. A thread that takes the blocks holds
  // the mutex, sets `steal`, fences, waits for `active` to clear, empties the bins (a snapshot
  // reads them), and clears `steal`. Between the owner's store and load
  // and the taker's store and load sits a store-load fence: asymmetric (a compiler barrier on the
  // owner's side, membarrier on the taker's) where available, else sequentially consistent
  // operations on both sides.
  std::atomic<bool> active{false};
  std::atomic<bool> steal{false};
  std::array<Bin, kMaxSizeClasses> bins;
  // The slab each class takes never-used slots from (its bump slab), per thread, so that threads
  // do not share slabs (and the cache lines of their slot records) until blocks migrate through
  // the shared list. Under the pool's mutex. Their spans together stay within the pool's
  // bump_budget_ (VmmPool::install_bump): what a thread strands in partly used slabs is bounded
  // by a constant, whatever the number of size classes it uses.
  std::array<Slab*, kMaxSizeClasses> bump{};
  std::size_t bump_spans = 0;
  // The slabs this thread owns that have shared slots, per class (under the pool's mutex).
  std::array<std::vector<Slab*>, kMaxSizeClasses> with_shared;
  // Written only by the owning thread; read by memory_pool_stats() from any thread.
  std::atomic<std::int64_t> bytes{0}, count{0}, peak_bytes{0}, peak_count{0};
  std::atomic<std::uint64_t> total_bytes{0}, total_count{0};
  int ops = 0;

  void add(std::int64_t b, std::int64_t c) noexcept {
    const std::int64_t nb = bytes.load(std::memory_order_relaxed) + b;
    const std::int64_t nc = count.load(std::memory_order_relaxed) + c;
    bytes.store(nb, std::memory_order_relaxed);
    count.store(nc, std::memory_order_relaxed);
    if (nb > peak_bytes.load(std::memory_order_relaxed)) {
      peak_bytes.store(nb, std::memory_order_relaxed);
    }
    if (nc > peak_count.load(std::memory_order_relaxed)) {
      peak_count.store(nc, std::memory_order_relaxed);
    }
    if (c > 0) {
      total_bytes.store(total_bytes.load(std::memory_order_relaxed) + static_cast<std::uint64_t>(b),
                        std::memory_order_relaxed);
      total_count.store(total_count.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    }
  }
};

// The epoch of each device's live VMM pool (0: none). A thread cache whose epoch differs belongs

// The epoch of each device's live VMM pool (0: none). A thread cache whose epoch differs belongs
// to a pool that was torn down and is dropped without touching it. Defined in vmm_pool.cpp.
extern std::array<std::atomic<std::uint64_t>, kMaxDevices> g_live_epoch;

class VmmPool final : public DevicePool {
 public:
  /// `reserve`: VIBESPATIAL_GPU_POOL_RESERVE (a fraction, 0 to 1), or negative for the adaptive
  /// default (see slack_allowed).
  VmmPool(int device, double reserve);
  ~VmmPool() override { teardown(); }

  void* allocate(std::size_t bytes, CUstream stream) override;
  void deallocate(void* ptr, std::size_t bytes, CUstream stream) override;
  bool owns(const void* ptr) const noexcept override;
  BlockAt block_at(const void* ptr) const override;
  void trim() override;
  void forget(CUstream stream) override;
  void fill_stats(MemoryPoolStats& stats) const noexcept override;
  std::string describe() const override;
  std::string check_invariants() const override;
  std::pair<std::uintptr_t, std::uintptr_t> slab_extent(const void* ptr) const override;
  void teardown() noexcept override;
  void hold_still() const override;
  void release_still() const noexcept override;
  void collect_segments(std::vector<MemorySnapshotSegment>& out) const override;
  void collect_owned(std::uint16_t session, std::vector<history::OwnedBlock>& out) const override;
  void collect_owned_locked(std::uint16_t session,
                            std::vector<history::OwnedBlock>& out) const override;

  void retire_cache(ThreadCache& cache) noexcept;

 private:
  // The owner's side of the cache handshake: true if the owner may use its bins without the
  // mutex until leave_fast_path(); false if another thread is taking them, or a forget_stream()
  // call has not been applied to them yet (use the locked path).
  bool enter_fast_path(ThreadCache& cache) const noexcept {
    if (asymmetric_) {
      cache.active.store(true, std::memory_order_relaxed);
      light_fence();
      if (!cache.steal.load(std::memory_order_acquire) && forget_current(cache)) [[likely]]
        return true;
    } else {
      cache.active.exchange(true, std::memory_order_seq_cst);
      if (!cache.steal.load(std::memory_order_seq_cst) && forget_current(cache)) [[likely]]
        return true;
    }
    cache.active.store(false, std::memory_order_release);
    return false;
  }
  static void leave_fast_path(ThreadCache& cache) noexcept {
    cache.active.store(false, std::memory_order_release);
  }
  // One relaxed load: whether the cache's bins have seen every forget_stream() call. A call that
  // happens before this one (the stream was forgotten, destroyed, and a new one with its handle
  // value reached this thread) is always seen.
  bool forget_current(const ThreadCache& cache) const noexcept {
    return forget_epoch_.value.load(std::memory_order_relaxed) == cache.forget_seen;
  }
  // Moves the blocks every other thread's cache holds to the shared lists, and gives up those
  // threads' bump slabs, so that trim() can release what they freed. Mutex held.
  void drain_caches(const ThreadCache* self) noexcept;
  // The taking side of the cache handshake (mutex held): sets `steal` on every cache but `self`,
  // then waits until none of their owners is on its fast path. Until release_caches() each owner
  // takes the locked path, which waits for the mutex. False when the fence failed: then nothing
  // is known about the owners' fast paths (membarrier, once registered, does not fail).
  bool hold_caches(const ThreadCache* self) const noexcept;
  void release_caches(const ThreadCache* self) const noexcept;
  // Small blocks.
  ThreadCache& thread_cache();
  // The key of a stream named by `cache`'s owner (CU_STREAM_PER_THREAD: the owner's).
  static CUstream key_in(const ThreadCache& cache, CUstream stream) noexcept {
    if (stream == CU_STREAM_PER_THREAD) return cache.per_thread_key;
    return stream == CU_STREAM_LEGACY ? nullptr : stream;
  }
  void* allocate_small(std::size_t bytes, CUstream stream);
  // Frees a small block of `slab` (deallocate found it): into the thread's cache bin with no lock
  // and no driver call, or under the mutex when the bin is full or being drained.
  void deallocate_small(Slab* slab, void* ptr, std::size_t bytes, CUstream stream);
  // deallocate_small while recording: the slot's release, the bin's entry and the free's events
  // in one window (the fast path's, or the mutex), so that a snapshot, which holds both
  // (hold_still), sees the free whole or not at all.
  void deallocate_small_recorded(ThreadCache& cache, Slab* slab, std::size_t slot, void* ptr,
                                 std::size_t bytes, CUstream stream);
  // Takes slot `slot` of `slab` back from its block (without a lock: the compare-exchange on
  // its requested size detects double frees and wrong sizes); throws std::invalid_argument,
  // changing nothing, unless it holds a live block of `bytes`.
  void release_slot(Slab* slab, std::size_t slot, const void* ptr, std::size_t bytes);
  // A freed small block into its thread's bin, flushing half of a full bin to the shared lists
  // (and marking `stream`'s frees). Mutex held.
  void free_into_bin_locked(ThreadCache& cache, Slab* slab, void* ptr, std::size_t bytes,
                            CUstream stream) noexcept;
  void* refill_and_allocate(ThreadCache& cache, int size_class, std::size_t bytes, CUstream stream);
  void flush_bin(ThreadCache& cache, int size_class, int keep) noexcept;  // mutex held
  // Batches (mutex held).
  Batch* new_batch(CUstream key, MarkRef mark);
  Batch* unmarked_batch(CUstream key);
  void set_mark(Batch* batch, MarkRef mark);
  void add_shared(Slab* slab, void* ptr, Batch* batch);
  void drop_batch_ref(Batch* batch) noexcept;
  // Covers the unmarked batch of `stream` (a stream the current public call names) with one mark.
  // Never throws: without a mark the blocks stay reusable on their own stream only.
  void mark_pending(CUstream stream, CUstream key) noexcept;
  // Whether a shared slot of `batch` may be used on the stream with key `key` now (records a mark
  // on the legacy stream for its unmarked batch, the one stream always alive). Mutex held.
  bool batch_ready_for(Batch* batch, CUstream key);
  // Whether every block of `batch` is idle: its mark has completed. Mutex held.
  bool batch_idle(Batch* batch);
  // Applies the forget_stream() calls `cache` has not seen to its bins. Mutex held, and the
  // owner off its fast path (the owner itself, or after the handshake).
  void sync_forgotten(ThreadCache& cache) noexcept;
  void prune_forget_log() noexcept;
  // Gives every unmarked batch a mark: legacy ones one recorded now, the others a complete one
  // after a cuCtxSynchronize (which also waits for streams destroyed since, §3.7). Mutex held.
  void settle_unmarked();
  // Slab ownership and the lists of slabs with shared slots. Mutex held.
  std::vector<Slab*>& list_of(Slab* slab);
  void unlist(Slab* slab);                         // takes a slab with shared slots off its list
  void set_owner(Slab* slab, ThreadCache* owner);  // moves it to the new owner's list
  void disown_all(ThreadCache& cache);
  // Moves up to `budget` examined shared slots of `slab` that are ready for the stream with key
  // `key` to `take`, while `want` says more are wanted; unlists the slab once it has none left.
  // `slab` must have shared slots (be listed). Mutex held.
  template <typename Take, typename Want>
  void take_shared(Slab* slab, CUstream key, int& budget, Take&& take, Want&& want);
  // Like take_shared, but also takes slots whose mark is still pending, making `stream` wait for
  // each such mark first (once per mark: `waited`). Mutex held.
  template <typename Take, typename Want>
  void take_waiting(Slab* slab, CUstream stream, CUstream key, Take&& take, Want&& want,
                    std::vector<const StreamMark*>& waited);
  // Removes shared slot `i` of `slab` (the last one takes its place), hands its block to `take`
  // and drops the slot's reference to its batch. Mutex held.
  template <typename Take>
  void take_shared_slot(Slab* slab, std::size_t i, Take& take);
  void fold_cache_stats(ThreadCache& cache) noexcept;
  // Bump slabs (mutex held). A thread's bump slab of a class gives its never-used slots to the
  // thread's refills. Given up (release_bump), a slab with slots never used joins its class's
  // `unowned_bump` list, which refills of any thread take before making a new slab.
  void release_bump(ThreadCache& cache, int size_class) noexcept;
  void release_bumps(ThreadCache& cache) noexcept;
  // Makes `slab` the bump slab of `cache` for its class, first giving up other bump slabs of the
  // thread while their spans and the new slab's would exceed bump_budget_.
  void install_bump(ThreadCache& cache, Slab* slab) noexcept;
  // A bump slab of the class taken from another thread (or nobody): a full device's last resort.
  Slab* steal_bump(ThreadCache& cache, int size_class) noexcept;
  Slab* slab_of(CUdeviceptr p) const noexcept;
  // Spans per slab of a class: kSlabSlots slots, or half a page for the largest classes; one span
  // at least.
  std::uint32_t spans_for(std::size_t slot_size) const noexcept;
  // A new slab for `owner`: spans free in a mapped page, else spans freed from empty idle slabs,
  // else a new page; with `create` false only from pages the pool holds (null if none). Mutex held.
  Slab* new_slab(int size_class, ThreadCache* owner, bool create);
  // Gives an empty slab's spans back to its page (no driver call). Mutex held.
  void release_slab(Slab* slab) noexcept;
  // Releases every empty slab (no live or cached block, not a thread's bump slab) whose freed
  // blocks' work has completed (with `wait`, after waiting for it). Returns how many. Mutex held.
  std::size_t release_empty_slabs(bool wait);
  // Releases empty slabs (release_empty_slabs(wait)), then unmaps up to `want` small pages that
  // hold no slab, appending their handles to `into` (spare_ when null). Returns the pages unmapped.
  // Mutex held.
  std::size_t reclaim_small_pages(std::vector<CUmemGenericAllocationHandle>* into, std::size_t want,
                                  bool wait);
  void open_page(SmallPage* page);         // lists a page with free spans (mutex held)
  std::string check_locked() const;        // check_invariants(), mutex held
  std::string check_multi_locked() const;  // its multi-page handles' part
  // In builds without NDEBUG, with VSR_POOL_CHECKS=1 in the environment (the test suites set it):
  // aborts with what is wrong unless check_locked() passes. After trim, large allocations (and so
  // compose) and refills (every
  // refill while the pool has few slabs, then every (slabs / 16)-th). Mutex held.
  void debug_check(const char* where) const noexcept;

  // Large blocks.
  void* allocate_large(std::size_t bytes, CUstream stream);
  void deallocate_large(CUdeviceptr p, std::size_t bytes, CUstream stream);
  bool range_ready(FreeRange& range, CUstream key);
  bool range_idle(FreeRange& range);
  void insert_free(CUdeviceptr addr, std::size_t pages, std::vector<MarkRef> marks);
  void erase_free(std::map<CUdeviceptr, FreeRange>::iterator it);
  // Moves the handles of `pages` large pages just unmapped at `addr` to `to` (which must have
  // room: nothing after an unmap may fail) and marks them unmapped. Mutex held.
  void take_unmapped_handles(CUdeviceptr addr, std::size_t pages,
                             std::vector<CUmemGenericAllocationHandle>& to) noexcept;
  // A window of `pages` mapped pages for the stream with key `key`; with `create` false only from
  // pages the pool holds (0 if it holds too few). Mutex held.
  CUdeviceptr compose(std::size_t pages, CUstream key, bool create);
  // New pages (cuMemCreate) into `out` until it holds `until`; false when the device is full
  // (what was created stays in `out`). Throws CudaError on other failures. Mutex held.
  bool create_pages(std::size_t until, std::vector<CUmemGenericAllocationHandle>& out);
  // Gathers `count` pages; with `create` false only pages the pool holds, returning false (and
  // taking none) if it holds too few. Throws DeviceFull when the driver has no memory left.
  bool acquire_pages(std::size_t count, CUdeviceptr avoid_begin, CUdeviceptr avoid_end,
                     std::vector<CUmemGenericAllocationHandle>& out, bool create);
  // Pages the pool may create now, beyond what it holds, when it needs `wanted` more: up to its
  // small pages, the peak of live large pages and the slack allowed. Mutex held.
  std::size_t growth_room(std::size_t wanted);
  // Multi-page handles (MultiPageHandle). The one mapped over `addr`, or multi_.end().
  std::map<CUdeviceptr, MultiPageHandle>::iterator multi_at(CUdeviceptr addr) noexcept;
  // Creates and maps one multi-page handle over each run of at least multi_min_pages_ holes of
  // the window's `pages` pages at `window` (region index `ri`, first page `first`), while the
  // pool may grow by it (`room`, decreased). Returns the holes filled; stops at a full device.
  // Throws CudaError on other failures (pages it mapped stay mapped). Mutex held.
  std::size_t map_multi_runs(int ri, std::size_t first, std::size_t pages, std::size_t& room);
  // Maps multi-page handle `h` of `pages` pages at `addr` and makes it accessible; on failure
  // releases it (or keeps it as a StuckMapping when the undo fails) and throws. Mutex held.
  void map_multi(CUdeviceptr addr, CUmemGenericAllocationHandle h, std::size_t pages);
  // Releases an unmapped multi-page handle; one whose release fails joins unreleased_multi_,
  // which must have room. Mutex held.
  void release_multi(CUmemGenericAllocationHandle h, std::size_t pages) noexcept;
  // Unmaps what may be unmapped of the idle free range `it`: its single pages, which join
  // spare_, and the multi-page handles lying wholly inside it, which are released (the pages of
  // a handle reaching outside the range stay mapped and free). Sets `it` to the range after it.
  // Returns the failure of the unmap (then nothing changed), else CUDA_SUCCESS. Mutex held.
  CUresult unmap_free_range(std::map<CUdeviceptr, FreeRange>::iterator& it);
  // On a full device: unmaps idle free ranges outside [avoid_begin, avoid_end) that hold a whole
  // multi-page handle (unmap_free_range) until `want` pages were given back or made spare.
  // Returns how many. Mutex held.
  std::size_t release_idle_multi(std::size_t want, CUdeviceptr avoid_begin, CUdeviceptr avoid_end);
  // Pages the pool may hold beyond its small pages and the peak of live large pages when it
  // needs `wanted` more: reserve_ times that peak, or with the adaptive default (reserve_ < 0) a
  // tenth of it, at most half the device's free pages left after `wanted` (cuMemGetInfo; none if
  // that fails). Mutex held.
  std::size_t slack_allowed(std::size_t wanted);
  // Blocks until the freeing work of every busy free large range has completed, and forgets
  // their marks; false if no range was busy. Throws CudaError when a wait fails. Mutex held.
  bool wait_for_busy_free_ranges();
  // Unmaps idle free large pages outside [avoid_begin, avoid_end) from their ranges' tails into
  // `out` until it holds `count` (it must have room). Returns how many. Mutex held.
  std::size_t take_idle_free_pages(std::size_t count, CUdeviceptr avoid_begin,
                                   CUdeviceptr avoid_end,
                                   std::vector<CUmemGenericAllocationHandle>& out);
  int region_of(CUdeviceptr p) const noexcept;
  // Reserves a region of `size` bytes (retrying after make_address_space(), then halving down to
  // `min_size`); throws DeviceFull when even that is refused. Mutex held.
  int add_region(std::size_t size, std::size_t min_size, bool small);
  // Gives back the address space of regions with nothing mapped (after moving the pages of empty
  // slabs and idle free ranges to spare_). Returns whether any region was freed. Mutex held.
  bool make_address_space() noexcept;
  void publish_region(int index) noexcept;
  // Maps `count` pages at `addr` and makes them accessible; on failure undoes what it mapped and
  // throws. If the undo fails too, the mapped pages become a StuckMapping and their entries in
  // `handles` are set to 0: the caller must not reuse those. Mutex held.
  void map_pages(CUdeviceptr addr, CUmemGenericAllocationHandle* handles, std::size_t count);
  // Unmaps stuck mappings, returning their pages to spare_ (and their slab pages to their
  // region's vacant list). Returns the first failure, CUDA_SUCCESS if none. Mutex held.
  CUresult recover_stuck() noexcept;

  std::size_t round_up_pages(std::size_t bytes) const noexcept {
    return (bytes + page_ - 1) / page_ * page_;
  }
  // The history (memory_history.hpp): pages mapped or unmapped at `addr`, pages created or
  // released. One relaxed load while recording is off.
  // Called as the mutex is taken on a path where blocks may pass between threads: a later
  // event of any thread is stamped after the events before it (memory_history.hpp, clock()).
  static void note_locked() noexcept {
    if (history::on()) [[unlikely]]
      history::touch_clock();
  }
  // A small block's alloc event and owner stamp, while recording: before its `requested` store.
  void note_small_alloc(ThreadCache& cache, Slab& slab, std::size_t slot, void* ptr,
                        std::size_t bytes, CUstream stream) const noexcept {
    slab.owners[slot].store(
        history::record_alloc(*cache.history_state, device_, reinterpret_cast<std::uintptr_t>(ptr),
                              bytes, reinterpret_cast<std::uintptr_t>(stream)),
        std::memory_order_relaxed);
  }
  void note_pages(MemoryAction action, CUdeviceptr addr, std::size_t pages) const noexcept {
    if (history::on()) [[unlikely]]
      history::record_now(action, device_, addr, pages * page_);
  }

  std::size_t page_ = 0;
  std::size_t small_limit_ = 0;
  std::size_t device_total_ = 0;
  std::size_t large_region_ = 0;  // the size a large region is reserved with (at least)
  std::size_t small_region_ = 0;  // the size a small region is reserved with
  std::uint64_t epoch_ = 0;
  CUmemAllocationProp prop_ = {};
  CUmemAccessDesc access_ = {};

  mutable std::mutex mutex_;
  std::array<Region, kMaxRegions> regions_;
  std::array<RegionLookup, kMaxRegions> lookup_;
  std::atomic<int> region_count_{0};  // slots in use or freed; never decreases while the pool lives
  // Slab arrays of regions whose address space was given back: a lock-free lookup that raced
  // the change (for a pointer the pool does not own) may still read one. Freed at teardown.
  std::vector<std::unique_ptr<std::atomic<Slab*>[]>> retired_slab_arrays_;

  std::map<CUdeviceptr, LargeBlock> live_large_;
  std::map<CUdeviceptr, FreeRange> free_by_addr_;
  std::multimap<std::size_t, CUdeviceptr> free_by_size_;
  std::vector<CUmemGenericAllocationHandle> spare_;
  std::vector<StuckMapping> stuck_;
  std::map<CUdeviceptr, MultiPageHandle> multi_;  // mapped multi-page handles, by address
  // Unmapped multi-page handles whose release failed: held, retried by trim() and teardown.
  std::vector<MultiPageHandle> unreleased_multi_;
  // The fewest new pages in one run that get a multi-page handle (VSR_POOL_MULTI_PAGE_MIN; by
  // default 128 MiB of pages, at least 2); 0: one handle per page.
  std::size_t multi_min_pages_ = 0;

  struct ClassState {
    std::vector<Slab*> slabs;
    std::vector<Slab*> unowned;       // slabs with shared slots and no owner
    std::vector<Slab*> unowned_bump;  // slabs with never-used slots that no thread bumps from
  };
  // Small pages: spans of span_ bytes (a power of two; 64 KiB or page_ / 64 when larger, page_ at
  // most), spans_per_page_ of them (at most 64) per page.
  std::size_t span_ = 0;
  int span_shift_ = 0;
  std::uint32_t spans_per_page_ = 0;
  std::size_t bump_budget_ = 0;         // spans a thread's bump slabs may hold together
  std::vector<SmallPage*> open_pages_;  // mapped small pages with free spans (some may be full)
  std::size_t small_pages_ = 0;         // mapped small pages
  std::array<ClassState, kMaxSizeClasses> classes_;
  std::vector<ThreadCache*> caches_;
  std::vector<Batch*> batches_;   // every batch
  std::vector<Batch*> unmarked_;  // the batches without a mark, at most one per key
  // forget_stream() calls that some thread cache has not applied yet: the stream's key and the
  // batch (key forgotten_stream(), the call's mark) its cached blocks join.
  struct ForgetEntry {
    std::uint64_t epoch;
    CUstream key;
    Batch* batch;
  };
  std::vector<ForgetEntry> forget_log_;
  // Counts forget_stream() calls; read by every fast path, written rarely: a line of its own.
  struct alignas(64) ForgetEpoch {
    std::atomic<std::uint64_t> value{0};
    char pad[64 - sizeof(std::atomic<std::uint64_t>)];
  };
  ForgetEpoch forget_epoch_;

  UsageCounters usage_;
  std::size_t pages_held_ = 0;
  std::size_t pages_mapped_ = 0;
  std::size_t reserved_bytes_ = 0;
  std::size_t large_live_pages_ = 0;
  // The most pages live large blocks have needed at once since the pool was last trimmed
  // (counting a request being served): the base of the warm reserve.
  std::size_t large_peak_pages_ = 0;
  const double reserve_;  // the slack: a fraction of large_peak_pages_, or < 0 adaptive
  std::size_t slab_count_ = 0;
  MarkFactory marks_;
  bool torn_down_ = false;
  const bool asymmetric_ = asymmetric_fence_available();  // the cache handshake's fence
};

// Whether an unmap, release or address free took effect: CUDA_SUCCESS, or a sticky error (7xx),
// which reports the context's earlier failure after the call did its work (cuda.h \notefnerr).
// Such a call is never retried: a second release of a released handle is undefined behaviour
// (§7 #5). Should a sticky call not have acted, what it held stays with the poisoned context,
// which the application must reset anyway.
inline bool vmm_call_took_effect(CUresult r) noexcept {
  return r == CUDA_SUCCESS || is_sticky_error(r);
}

inline std::size_t round_up(std::size_t v, std::size_t m) {
  return (v + m - 1) / m * m;
}

// The first run of `k` set bits in `bits` (its lowest bit's index), or -1.
inline int find_run(std::uint64_t bits, std::uint32_t k) noexcept {
  std::uint64_t starts = bits;
  for (std::uint32_t i = 1; i < k && starts != 0; ++i) starts &= bits >> i;
  return starts == 0 ? -1 : std::countr_zero(starts);
}

// Bits [first, first + count) of a page's span mask.
inline std::uint64_t span_mask(std::uint32_t first, std::uint32_t count) noexcept {
  return (count >= 64 ? ~std::uint64_t{0} : ((std::uint64_t{1} << count) - 1)) << first;
}

}  // namespace vibespatial::raster::detail::vmm
