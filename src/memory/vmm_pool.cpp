// SPDX-License-Identifier: Apache-2.0
// Tiers A and B: the pool on cuMemAddressReserve / cuMemCreate / cuMemMap / cuMemSetAccess.
//
// Physical memory is held as pages: one cuMemCreate handle of one page (the granularity, or the
// recommended granularity where that is a multiple of it). Because every page is mapped on its
// own, any free page can be unmapped and mapped again elsewhere: a large request is served by
// gathering free pages into a fresh contiguous range, so it never fails for lack of a contiguous
// free range while enough physical memory is free (the failure that stranded 19.9 GiB in the
// Python original, reference/vibespatial-reference.md §1.9).
//
// Address space: small regions hold slabs (one page each, split into equal slots of one size
// class); large regions hold large blocks (whole pages). They never mix, so a live small block
// pins one page at most. Reservations are sized to fit an address space that may be scarce
// (§3.4.2: a real driver can refuse large reservations): a large region of about the device's
// memory, small regions of a sixteenth of it, added as needed; a refused reservation is retried
// after giving back the address space of empty regions, then smaller, halving down to what the
// request needs. The pool so works within 1.5 x device memory of address space.
//
// Streams (memory.hpp, "Streams"): the pool calls the driver naming a stream only while a public
// call that passed that stream runs (and then only that stream), or through the event of a mark
// recorded at such a time; the legacy stream, which lives as long as the context, may be named at
// any time. Small blocks are freed without a driver call into the thread's cache; when the cache
// gives them to the shared lists they join the stream's unmarked batch, which a later slow path
// of a call on the same stream (or forget_stream) covers with one mark. A block whose freeing
// stream differs from the allocating one is reused only behind a completed mark, or, rather than
// growing the pool, with the allocating stream made to wait for the mark's event
// (cuStreamWaitEvent, as RMM's stream-ordered pool does); blocks with no mark yet become usable
// everywhere after the cuCtxSynchronize of free_pool_memory() (and so of the OOM chain).
//
// Locking: the small-block fast path uses a per-thread cache (no lock, no driver call); every
// other path takes the pool's mutex. Another thread may take a cache's blocks (trim, and so the
// OOM chain and free_pool_memory()) under the mutex, after a handshake with the owner's fast path
// (ThreadCache::active/steal, an asymmetric fence: the owner pays plain stores and a load). A slab
// belongs to one thread at a time (Slab::owner): the thread refills its cache from its own slabs'
// freed slots, then claims a slab nobody owns, then carves; only a full device lets a thread take
// slots from another thread's slab. Threads thus write disjoint cache lines of the per-slot records
// even after blocks went back to the pool. Driver rules followed (reference/cuda-vmm-semantics.md):
// map whole handles at offset 0 (§3.4.6), set access once per contiguous newly mapped run (§3.4.8,
// §7 #3), unmap only whole mappings inside one reservation (§3.4.7), release handles exactly once
// (§7 #5), and unmap only memory whose freeing stream work has completed (§7 #2).
#include "memory/asymmetric_fence.hpp"
#include "memory/device_pool.hpp"
#include "memory/pool_registry.hpp"
#include "memory/size_classes.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <unordered_map>

namespace vibespatial::raster::detail {
namespace {

constexpr int kMaxRegions = 64;
constexpr int kBinCapacity = 64;
// Slots a slab is made for (at least one span): few for classes up to 8 KiB, whose slabs are then
// one or two spans (each thread and class holds one partly used), more for larger classes, so that
// their slabs stay few (a slab's header and slot records are what the fast path reads).
constexpr std::size_t kSlabSlots = 4;
constexpr std::size_t kSlabSlotsLarge = 16;
constexpr std::size_t kSlabSmallSlot = 8 << 10;
// What a thread's cache may hold of one class: kBinCapacity blocks, or fewer of larger classes so
// that a bin holds about kBinBytes (and at least 4 blocks). Cached blocks count as used memory.
constexpr std::size_t kBinBytes = 64 << 20;
constexpr int bin_capacity(std::size_t slot_size) noexcept {
  return static_cast<int>(std::clamp<std::size_t>(kBinBytes / slot_size, 4, kBinCapacity));
}
constexpr int kStatFlushOps = 64;
constexpr std::int64_t kStatFlushBytes = std::int64_t{4} << 20;
constexpr int kRefillScan = 64;             // shared free slots a refill examines at most
constexpr std::size_t kMaxForgetLog = 256;  // forget_stream() entries before caches are drained

class ThreadCache;

std::atomic<std::uint64_t> g_next_epoch{1};

// Per-slot records in whole cache lines of their own: slabs are shared between threads, and a
// record array must not share a line with anything another thread writes.
class SlotRecords {
 public:
  void reset(std::size_t slots) {
    lines_ = std::make_unique<Line[]>((slots + kPerLine - 1) / kPerLine);
  }
  std::atomic<std::uint32_t>& operator[](std::size_t slot) noexcept {
    return lines_[slot / kPerLine].record[slot % kPerLine];
  }

 private:
  static constexpr std::size_t kPerLine = 16;
  struct alignas(64) Line {
    std::atomic<std::uint32_t> record[kPerLine];
  };
  std::unique_ptr<Line[]> lines_;
};

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

  /// The slot that `p` (inside this slab) falls in. Exact for offsets below 2^32.
  std::size_t slot_of(CUdeviceptr p) const noexcept {
    return static_cast<std::size_t>((static_cast<unsigned __int128>(p - base) * slot_reciprocal) >>
                                    64);
  }
  // Written under the pool's mutex, on a cache line of their own so that those writes do not
  // bounce the line the fast path reads between threads.
  alignas(64) std::uint32_t carved = 0;  // slots handed out at least once (a bump index)
  bool bump_owned = false;  // a thread's bump slab (ThreadCache::bump): not reclaimable meanwhile
  bool bump_listed = false;  // in its class's `unowned_bump` list (uncarved slots, no thread)
  std::uint32_t used = 0;  // carved slots not in `shared` (live or thread-cached)
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
  std::vector<CUmemGenericAllocationHandle> handles;
};

struct LargeBlock {
  std::size_t pages = 0;
  std::size_t bytes = 0;
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
  int capacity = kBinCapacity;  // bin_capacity() of the class
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
  // The pool's forget epoch this cache has applied to its bins (VmmPool::sync_forgotten). Read on
  // the fast path by the owner; written under the mutex by the owner or, after the handshake
  // below, by a thread that takes the cache's blocks.
  std::uint64_t forget_seen = 0;
  // The handshake that lets another thread take this cache's blocks (VmmPool::drain_caches)
  // while the owner may be on its lock-free fast path. The owner sets `active` around every use
  // of its bins outside the mutex and then checks `steal`: if set, it leaves and takes the locked
  // path. A thread that takes the blocks holds the mutex, sets `steal`, fences, waits for
  // `active` to clear, empties the bins, and clears `steal`. Between the owner's store and load
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
// to a pool that was torn down and is dropped without touching it.
std::array<std::atomic<std::uint64_t>, kMaxDevices> g_live_epoch{};

struct ThreadCacheSet {
  std::array<std::unique_ptr<ThreadCache>, kMaxDevices> caches;
  ~ThreadCacheSet();
};
thread_local ThreadCacheSet t_caches;

class VmmPool final : public DevicePool {
 public:
  explicit VmmPool(int device);
  ~VmmPool() override { teardown(); }

  void* allocate(std::size_t bytes, CUstream stream) override;
  void deallocate(void* ptr, std::size_t bytes, CUstream stream) override;
  bool owns(const void* ptr) const noexcept override;
  void trim() override;
  void forget(CUstream stream) override;
  void fill_stats(MemoryPoolStats& stats) const noexcept override;
  std::string describe() const override;
  std::string check_invariants() const override;
  std::pair<std::uintptr_t, std::uintptr_t> slab_extent(const void* ptr) const override;
  void teardown() noexcept override;

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
  // Small blocks.
  ThreadCache& thread_cache();
  // The key of a stream named by `cache`'s owner (CU_STREAM_PER_THREAD: the owner's).
  static CUstream key_in(const ThreadCache& cache, CUstream stream) noexcept {
    if (stream == CU_STREAM_PER_THREAD) return cache.per_thread_key;
    return stream == CU_STREAM_LEGACY ? nullptr : stream;
  }
  void* allocate_small(std::size_t bytes, CUstream stream);
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
  void open_page(SmallPage* page);  // lists a page with free spans (mutex held)
  std::string check_locked() const;  // check_invariants(), mutex held
  // In builds without NDEBUG, with VSR_POOL_CHECKS=1 in the environment (the test suites set it):
  // aborts with what is wrong unless check_locked() passes. After trim, large allocations (and so
  // compose) and refills (every
  // refill while the pool has few slabs, then every 64th). Mutex held.
  void debug_check(const char* where) const noexcept;

  // Large blocks.
  void* allocate_large(std::size_t bytes, CUstream stream);
  void deallocate_large(CUdeviceptr p, std::size_t bytes, CUstream stream);
  bool range_ready(FreeRange& range, CUstream key);
  bool range_idle(FreeRange& range);
  void insert_free(CUdeviceptr addr, std::size_t pages, std::vector<MarkRef> marks);
  void erase_free(std::map<CUdeviceptr, FreeRange>::iterator it);
  // A free range just unmapped: its pages become spare pages and it leaves the free lists.
  // spare_ must already have room for its pages (nothing after an unmap may fail). Returns the
  // next range. Mutex held.
  std::map<CUdeviceptr, FreeRange>::iterator retire_unmapped_range(
      std::map<CUdeviceptr, FreeRange>::iterator it) noexcept;
  // A window of `pages` mapped pages for the stream with key `key`; with `create` false only from
  // pages the pool holds (0 if it holds too few). Mutex held.
  CUdeviceptr compose(std::size_t pages, CUstream key, bool create);
  // Gathers `count` pages; with `create` false only pages the pool holds, returning false (and
  // taking none) if it holds too few. Throws DeviceFull when the driver has no memory left.
  bool acquire_pages(std::size_t count, CUdeviceptr avoid_begin, CUdeviceptr avoid_end,
                     std::vector<CUmemGenericAllocationHandle>& out, bool create);
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
  std::size_t bump_budget_ = 0;  // spans a thread's bump slabs may hold together
  std::vector<SmallPage*> open_pages_;  // mapped small pages with free spans (some may be full)
  std::size_t small_pages_ = 0;          // mapped small pages
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
  std::size_t slab_count_ = 0;
  MarkFactory marks_;
  bool torn_down_ = false;
  const bool asymmetric_ = asymmetric_fence_available();  // the cache handshake's fence
};

ThreadCacheSet::~ThreadCacheSet() {
  // A forked child's caches belong to the parent's pools, whose mutex may be held for ever.
  if (in_forked_child()) return;
  for (std::size_t d = 0; d < caches.size(); ++d) {
    ThreadCache* c = caches[d].get();
    if (c != nullptr && c->pool != nullptr &&
        g_live_epoch[d].load(std::memory_order_acquire) == c->epoch) {
      c->pool->retire_cache(*c);
    }
  }
}

std::size_t round_up(std::size_t v, std::size_t m) {
  return (v + m - 1) / m * m;
}

VmmPool::VmmPool(int device) : DevicePool(device), marks_(device) {
  const DriverApi& api = driver();
  ScopedDeviceContext scope(device);
  prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop_.location.id = device;
  std::size_t minimum = 0, recommended = 0;
  VSR_CU_TRY(api.cuMemGetAllocationGranularity(&minimum, &prop_, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  VSR_CU_TRY(api.cuMemGetAllocationGranularity(&recommended, &prop_,
                                               CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  if (minimum == 0) {
    throw CudaError(CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED",
                    "the driver reports a VMM granularity of 0");
  }
  page_ = (recommended >= minimum && recommended % minimum == 0) ? recommended : minimum;
  small_limit_ = std::min<std::size_t>(std::size_t{1} << 20, page_ / 4);
  small_limit_ = std::max(small_limit_, kSmallQuantum);
  // Spans: the largest power of two that divides the page, at most 32 KiB or a 64th of the page
  // (a page whose size has a large odd factor keeps its first 64 spans only).
  span_shift_ = std::min(std::countr_zero(page_), std::max(15, static_cast<int>(std::bit_width(
                                                                   (page_ + 63) / 64 - 1))));
  span_ = std::size_t{1} << span_shift_;
  spans_per_page_ = static_cast<std::uint32_t>(std::min<std::size_t>(64, page_ / span_));
  bump_budget_ = spans_per_page_;
  std::size_t free_bytes = 0;
  VSR_CU_TRY(api.cuMemGetInfo(&free_bytes, &device_total_));
  // Regions: a large one holds every page of the device; small ones a sixteenth each (at least
  // 16 pages, at most half the device), so that one large and a few small fit in 1.5 x.
  const std::size_t device_pages = std::max<std::size_t>(1, (device_total_ + page_ - 1) / page_);
  large_region_ = device_pages * page_;
  small_region_ =
      std::max<std::size_t>(
          1, std::min(device_pages / 2, std::max<std::size_t>(16, (device_pages + 15) / 16))) *
      page_;
  access_.location = prop_.location;
  access_.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  epoch_ = g_next_epoch.fetch_add(1);
  g_live_epoch[static_cast<std::size_t>(device)].store(epoch_, std::memory_order_release);
}

// ---- regions -----------------------------------------------------------------------------------

void VmmPool::publish_region(int index) noexcept {
  const Region& r = regions_[static_cast<std::size_t>(index)];
  RegionLookup& l = lookup_[static_cast<std::size_t>(index)];
  const std::uint64_t v = l.version.load(std::memory_order_relaxed);
  l.version.store(v + 1, std::memory_order_relaxed);
  l.base.store(r.base, std::memory_order_release);
  l.size.store(r.size, std::memory_order_release);
  l.slabs.store(r.small ? r.slabs.get() : nullptr, std::memory_order_release);
  l.version.store(v + 2, std::memory_order_release);
}

int VmmPool::add_region(std::size_t size, std::size_t min_size, bool small) {
  const DriverApi& api = driver();
  // A free slot: one whose region was given back, else a new one.
  auto free_slot = [&] {
    const int n = region_count_.load(std::memory_order_relaxed);
    for (int i = 0; i < n; ++i) {
      if (regions_[static_cast<std::size_t>(i)].size == 0) return i;
    }
    return n < kMaxRegions ? n : -1;
  };
  bool made_space = false;
  int index = free_slot();
  if (index < 0) {
    made_space = true;
    if (!make_address_space() || (index = free_slot()) < 0) throw DeviceFull{min_size};
  }
  CUdeviceptr base = 0;
  for (;;) {
    const CUresult r = api.cuMemAddressReserve(&base, size, page_, 0, 0);
    if (r == CUDA_SUCCESS) break;
    if (r != CUDA_ERROR_OUT_OF_MEMORY)
      throw_cuda_error(r, "cuMemAddressReserve", __FILE__, __LINE__);
    // Address space is short (§3.4.2): give back what empty regions hold, then ask for less.
    if (!made_space) {
      made_space = true;
      if (make_address_space()) {
        index = free_slot();
        continue;
      }
    }
    if (size <= min_size) throw DeviceFull{min_size};
    size = std::max(round_up(size / 2, page_), min_size);
  }
  Region& region = regions_[static_cast<std::size_t>(index)];
  try {
    region.pages = size / page_;
    if (small) {
      region.slabs = std::make_unique<std::atomic<Slab*>[]>(size >> span_shift_);
      region.page_recs.resize(region.pages);
    } else {
      region.handles.assign(region.pages, 0);
    }
  } catch (...) {
    api.cuMemAddressFree(base, size);
    region.pages = 0;
    region.slabs.reset();
    region.page_recs.clear();
    region.handles.clear();
    throw;
  }
  region.base = base;
  region.size = size;
  region.small = small;
  region.vacant.clear();
  region.bump = 0;
  region.mapped_end = 0;
  reserved_bytes_ += size;
  publish_region(index);
  if (index == region_count_.load(std::memory_order_relaxed)) {
    region_count_.store(index + 1, std::memory_order_release);  // publish to lock-free readers
  }
  return index;
}

bool VmmPool::make_address_space() noexcept {
  const DriverApi& api = driver_state().api;
  // Pages of empty, idle slabs and of idle free ranges become spare pages (no memory is given
  // back), so that the regions they were mapped in may empty.
  try {
    std::vector<CUmemGenericAllocationHandle> pages;
    reclaim_small_pages(&pages, static_cast<std::size_t>(-1), false);
    spare_.insert(spare_.end(), pages.begin(), pages.end());
  } catch (...) {
  }
  for (auto it = free_by_addr_.begin(); it != free_by_addr_.end();) {
    const CUdeviceptr begin = it->first;
    const std::size_t pages = it->second.pages;
    bool idle = false;
    try {
      spare_.reserve(spare_.size() + pages);
      idle = range_idle(it->second);
    } catch (...) {
    }
    if (!idle || api.cuMemUnmap(begin, pages * page_) != CUDA_SUCCESS) {
      ++it;
      continue;
    }
    it = retire_unmapped_range(it);
  }
  bool freed = false;
  const int n = region_count_.load(std::memory_order_relaxed);
  for (int i = 0; i < n; ++i) {
    Region& r = regions_[static_cast<std::size_t>(i)];
    if (r.size == 0) continue;
    bool empty = std::none_of(stuck_.begin(), stuck_.end(),
                              [&](const StuckMapping& m) { return m.region == i; });
    if (r.small) {
      empty = empty && r.vacant.size() == r.bump;
    } else {
      empty = empty && std::all_of(r.handles.begin(), r.handles.end(),
                                   [](CUmemGenericAllocationHandle h) { return h == 0; });
    }
    if (!empty || api.cuMemAddressFree(r.base, r.size) != CUDA_SUCCESS) continue;
    reserved_bytes_ -= r.size;
    if (r.slabs) {
      try {
        retired_slab_arrays_.push_back(std::move(r.slabs));
      } catch (...) {
        // Freed at teardown in any case: keep it with the slot.
      }
    }
    r.base = 0;
    r.size = 0;
    r.pages = 0;
    r.small = false;
    r.handles = {};
    r.page_recs.clear();
    r.vacant = {};
    r.bump = 0;
    r.mapped_end = 0;
    publish_region(i);
    freed = true;
  }
  return freed;
}

int VmmPool::region_of(CUdeviceptr p) const noexcept {
  const int n = region_count_.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    const RegionLookup& l = lookup_[static_cast<std::size_t>(i)];
    CUdeviceptr base = 0;
    std::size_t size = 0;
    for (;;) {
      const std::uint64_t v = l.version.load(std::memory_order_acquire);
      base = l.base.load(std::memory_order_acquire);
      size = l.size.load(std::memory_order_acquire);
      if ((v & 1) == 0 && l.version.load(std::memory_order_acquire) == v) break;
      std::this_thread::yield();  // a slot being rewritten under the mutex: a few stores
    }
    if (p >= base && p - base < size) return i;
  }
  return -1;
}

bool VmmPool::owns(const void* ptr) const noexcept {
  return region_of(reinterpret_cast<CUdeviceptr>(ptr)) >= 0;
}

Slab* VmmPool::slab_of(CUdeviceptr p) const noexcept {
  const int n = region_count_.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    const RegionLookup& l = lookup_[static_cast<std::size_t>(i)];
    CUdeviceptr base = 0;
    std::size_t size = 0;
    std::atomic<Slab*>* slabs = nullptr;
    for (;;) {
      const std::uint64_t v = l.version.load(std::memory_order_acquire);
      base = l.base.load(std::memory_order_acquire);
      size = l.size.load(std::memory_order_acquire);
      slabs = l.slabs.load(std::memory_order_acquire);
      if ((v & 1) == 0 && l.version.load(std::memory_order_acquire) == v) break;
      std::this_thread::yield();
    }
    if (p >= base && p - base < size) {
      return slabs != nullptr ? slabs[(p - base) >> span_shift_].load(std::memory_order_acquire)
                              : nullptr;
    }
  }
  return nullptr;
}

void VmmPool::map_pages(CUdeviceptr addr, CUmemGenericAllocationHandle* handles,
                        std::size_t count) {
  const DriverApi& api = driver();
  std::size_t mapped = 0;
  CUresult r = CUDA_SUCCESS;
  for (; mapped < count; ++mapped) {
    r = api.cuMemMap(addr + mapped * page_, page_, 0, handles[mapped], 0);
    if (r != CUDA_SUCCESS) break;
  }
  if (r == CUDA_SUCCESS) r = api.cuMemSetAccess(addr, count * page_, &access_, 1);
  if (r == CUDA_SUCCESS) {
    pages_mapped_ += count;
    return;
  }
  // Undo exactly what this call mapped (§7 #6: never unmap a range with unmapped gaps). If that
  // fails, the driver still maps those pages: keep them known, never forgotten nor reused.
  if (mapped > 0 && api.cuMemUnmap(addr, mapped * page_) != CUDA_SUCCESS) {
    stuck_.push_back({addr, region_of(addr), {handles, handles + mapped}});
    pages_mapped_ += mapped;
    std::fill(handles, handles + mapped, CUmemGenericAllocationHandle{0});
  }
  if (r == CUDA_ERROR_OUT_OF_MEMORY) throw DeviceFull{count * page_};
  throw_cuda_error(r, "cuMemMap/cuMemSetAccess", __FILE__, __LINE__);
}

CUresult VmmPool::recover_stuck() noexcept {
  CUresult first = CUDA_SUCCESS;
  for (std::size_t i = 0; i < stuck_.size();) {
    StuckMapping& m = stuck_[i];
    const std::size_t pages = m.handles.size();
    Region& region = regions_[static_cast<std::size_t>(m.region)];
    CUresult r = CUDA_SUCCESS;
    try {  // room first, so that nothing after the unmap can fail
      spare_.reserve(spare_.size() + pages);
      if (region.small) region.vacant.reserve(region.vacant.size() + pages);
    } catch (const std::bad_alloc&) {
      r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (r == CUDA_SUCCESS) r = driver_state().api.cuMemUnmap(m.addr, pages * page_);
    if (r != CUDA_SUCCESS) {
      if (first == CUDA_SUCCESS) first = r;
      ++i;
      continue;
    }
    pages_mapped_ -= pages;
    spare_.insert(spare_.end(), m.handles.begin(), m.handles.end());
    if (region.small) {
      for (std::size_t k = 0; k < pages; ++k) {
        region.vacant.push_back((m.addr - region.base) / page_ + k);
      }
    }
    stuck_.erase(stuck_.begin() + static_cast<std::ptrdiff_t>(i));
  }
  return first;
}

// ---- page supply -------------------------------------------------------------------------------

bool VmmPool::acquire_pages(std::size_t count, CUdeviceptr avoid_begin, CUdeviceptr avoid_end,
                            std::vector<CUmemGenericAllocationHandle>& out, bool create) {
  const DriverApi& api = driver();
  try {
    if (!stuck_.empty()) recover_stuck();  // their pages are free once unmapped
    while (out.size() < count && !spare_.empty()) {
      out.push_back(spare_.back());
      spare_.pop_back();
    }
    // Idle free large pages elsewhere: unmap them from their range's tail and reuse the handles.
    for (auto it = free_by_addr_.begin(); out.size() < count && it != free_by_addr_.end();) {
      const CUdeviceptr begin = it->first;
      const CUdeviceptr end = begin + it->second.pages * page_;
      if ((begin < avoid_end && end > avoid_begin) || !range_idle(it->second)) {
        ++it;
        continue;
      }
      const std::size_t take = std::min(count - out.size(), it->second.pages);
      const CUdeviceptr cut = end - take * page_;
      if (api.cuMemUnmap(cut, take * page_) != CUDA_SUCCESS) {
        ++it;
        continue;
      }
      Region& region = regions_[static_cast<std::size_t>(region_of(cut))];
      const std::size_t first = (cut - region.base) / page_;
      for (std::size_t i = 0; i < take; ++i) {
        out.push_back(region.handles[first + i]);
        region.handles[first + i] = 0;
      }
      pages_mapped_ -= take;
      const std::size_t left = it->second.pages - take;
      std::vector<MarkRef> marks = std::move(it->second.marks);
      auto next = std::next(it);
      erase_free(it);
      if (left > 0) insert_free(begin, left, std::move(marks));
      it = next;
    }
    if (out.size() < count) reclaim_small_pages(&out, count - out.size(), false);
    if (!create && out.size() < count) {
      spare_.insert(spare_.end(), out.begin(), out.end());  // all of them stay in the pool
      out.clear();
      return false;
    }
    while (out.size() < count) {
      CUmemGenericAllocationHandle h = 0;
      const CUresult r = api.cuMemCreate(&h, page_, &prop_, 0);
      if (r == CUDA_ERROR_OUT_OF_MEMORY) throw DeviceFull{count * page_};
      if (r != CUDA_SUCCESS) throw_cuda_error(r, "cuMemCreate", __FILE__, __LINE__);
      out.push_back(h);
      ++pages_held_;
    }
  } catch (...) {
    spare_.insert(spare_.end(), out.begin(), out.end());  // valid pages stay in the pool
    out.clear();
    throw;
  }
  return true;
}

// ---- large blocks ------------------------------------------------------------------------------

bool VmmPool::range_ready(FreeRange& range, CUstream key) {
  std::erase_if(range.marks, [&](const MarkRef& m) { return marks_.completed(m); });
  return std::all_of(range.marks.begin(), range.marks.end(),
                     [&](const MarkRef& m) { return m->stream == key; });
}

bool VmmPool::range_idle(FreeRange& range) {
  std::erase_if(range.marks, [&](const MarkRef& m) { return marks_.completed(m); });
  return range.marks.empty();
}

std::map<CUdeviceptr, FreeRange>::iterator VmmPool::retire_unmapped_range(
    std::map<CUdeviceptr, FreeRange>::iterator it) noexcept {
  const CUdeviceptr begin = it->first;
  const std::size_t pages = it->second.pages;
  Region& region = regions_[static_cast<std::size_t>(region_of(begin))];
  const std::size_t first = (begin - region.base) / page_;
  for (std::size_t i = 0; i < pages; ++i) {
    spare_.push_back(region.handles[first + i]);
    region.handles[first + i] = 0;
  }
  pages_mapped_ -= pages;
  auto next = std::next(it);
  erase_free(it);
  return next;
}

void VmmPool::erase_free(std::map<CUdeviceptr, FreeRange>::iterator it) {
  auto [lo, hi] = free_by_size_.equal_range(it->second.pages);
  for (auto s = lo; s != hi; ++s) {
    if (s->second == it->first) {
      free_by_size_.erase(s);
      break;
    }
  }
  free_by_addr_.erase(it);
}

void VmmPool::insert_free(CUdeviceptr addr, std::size_t pages, std::vector<MarkRef> marks) {
  const int region = region_of(addr);
  auto next = free_by_addr_.lower_bound(addr);
  // Coalesce with neighbours in the same reservation (mappings never straddle reservations).
  if (next != free_by_addr_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.pages * page_ == addr && region_of(prev->first) == region) {
      addr = prev->first;
      pages += prev->second.pages;
      marks.insert(marks.end(), prev->second.marks.begin(), prev->second.marks.end());
      erase_free(prev);
    }
  }
  next = free_by_addr_.lower_bound(addr);
  if (next != free_by_addr_.end() && addr + pages * page_ == next->first &&
      region_of(next->first) == region) {
    pages += next->second.pages;
    marks.insert(marks.end(), next->second.marks.begin(), next->second.marks.end());
    erase_free(next);
  }
  free_by_addr_.emplace(addr, FreeRange{pages, std::move(marks)});
  free_by_size_.emplace(pages, addr);
}

CUdeviceptr VmmPool::compose(std::size_t pages, CUstream key, bool create) {
  // Find a window of `pages` pages with no live block and no free range still busy for `key`:
  // its mapped pages are reused in place, its holes get pages from elsewhere.
  CUdeviceptr window = 0;
  int window_region = -1;
  std::size_t best_holes = pages + 1;
  const int n = region_count_.load(std::memory_order_relaxed);
  for (int ri = 0; ri < n && best_holes > 0; ++ri) {
    const Region& region = regions_[static_cast<std::size_t>(ri)];
    if (region.small || region.pages < pages) continue;
    std::vector<std::pair<CUdeviceptr, std::size_t>> obstacles;
    const CUdeviceptr end = region.base + region.size;
    for (auto it = live_large_.lower_bound(region.base); it != live_large_.end() && it->first < end;
         ++it) {
      obstacles.emplace_back(it->first, it->second.pages);
    }
    for (auto it = free_by_addr_.lower_bound(region.base);
         it != free_by_addr_.end() && it->first < end; ++it) {
      if (!range_ready(it->second, key)) obstacles.emplace_back(it->first, it->second.pages);
    }
    for (const StuckMapping& m : stuck_) {
      if (m.region == ri) obstacles.emplace_back(m.addr, m.handles.size());
    }
    std::sort(obstacles.begin(), obstacles.end());
    // Among the gaps between obstacles, take the window with the most pages already mapped:
    // every hole in it costs a map (and, for pages taken from elsewhere, an unmap).
    CUdeviceptr cursor = region.base;
    obstacles.emplace_back(end, 0);
    for (const auto& [addr, count] : obstacles) {
      const std::size_t gap = addr > cursor ? (addr - cursor) / page_ : 0;
      if (gap >= pages) {
        const std::size_t first = (cursor - region.base) / page_;
        std::size_t holes = 0;
        for (std::size_t i = 0; i < pages; ++i) holes += region.handles[first + i] == 0 ? 1 : 0;
        for (std::size_t start = first;; ++start) {
          if (holes < best_holes) {
            best_holes = holes;
            window = region.base + start * page_;
            window_region = ri;
          }
          // Windows starting at or past mapped_end are all holes: none beats one seen already.
          if (holes == 0 || start + pages >= first + gap || start >= region.mapped_end) break;
          holes -= region.handles[start] == 0 ? 1 : 0;
          holes += region.handles[start + pages] == 0 ? 1 : 0;
        }
      }
      cursor = std::max(cursor, addr + count * page_);
      if (best_holes == 0) break;
    }
  }
  if (window_region < 0) {
    window_region = add_region(std::max(large_region_, pages * page_), pages * page_, false);
    window = regions_[static_cast<std::size_t>(window_region)].base;
  }
  Region& region = regions_[static_cast<std::size_t>(window_region)];
  const std::size_t first = (window - region.base) / page_;
  const CUdeviceptr window_end = window + pages * page_;

  std::size_t holes = 0;
  for (std::size_t i = 0; i < pages; ++i) holes += region.handles[first + i] == 0 ? 1 : 0;
  std::vector<CUmemGenericAllocationHandle> fresh;
  if (!acquire_pages(holes, window, window_end, fresh, create)) return 0;

  // Map each run of holes; on failure, the pages mapped so far in this call go back as free.
  std::size_t next_fresh = 0;
  try {
    for (std::size_t i = 0; i < pages;) {
      if (region.handles[first + i] != 0) {
        ++i;
        continue;
      }
      std::size_t run = 0;
      while (i + run < pages && region.handles[first + i + run] == 0) ++run;
      map_pages(window + i * page_, fresh.data() + next_fresh, run);
      for (std::size_t k = 0; k < run; ++k) region.handles[first + i + k] = fresh[next_fresh + k];
      region.mapped_end = std::max(region.mapped_end, first + i + run);
      next_fresh += run;
      i += run;
    }
  } catch (...) {
    // Pages of a stuck mapping (entries map_pages set to 0) stay with it.
    std::copy_if(fresh.begin() + static_cast<std::ptrdiff_t>(next_fresh), fresh.end(),
                 std::back_inserter(spare_), [](CUmemGenericAllocationHandle h) { return h != 0; });
    for (std::size_t i = 0; i < pages;) {  // newly mapped pages become ordinary free pages
      const CUdeviceptr a = window + i * page_;
      if (region.handles[first + i] != 0 && free_by_addr_.find(a) == free_by_addr_.end()) {
        bool inside_free = false;
        auto it = free_by_addr_.upper_bound(a);
        if (it != free_by_addr_.begin()) {
          --it;
          inside_free = a < it->first + it->second.pages * page_;
        }
        if (!inside_free) insert_free(a, 1, {});
      }
      ++i;
    }
    throw;
  }
  // The window's already-mapped pages belonged to ready free ranges: cut them out, keeping the
  // parts of those ranges that lie outside the window.
  for (;;) {
    auto it = free_by_addr_.lower_bound(window);
    if (it != free_by_addr_.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second.pages * page_ > window) it = prev;
    }
    if (it == free_by_addr_.end() || it->first >= window_end) break;
    const CUdeviceptr begin = it->first;
    const CUdeviceptr end = begin + it->second.pages * page_;
    std::vector<MarkRef> marks = std::move(it->second.marks);
    erase_free(it);
    if (begin < window) insert_free(begin, (window - begin) / page_, marks);
    if (end > window_end) insert_free(window_end, (end - window_end) / page_, marks);
  }
  return window;
}

void* VmmPool::allocate_large(std::size_t bytes, CUstream stream) {
  const std::size_t pages = (bytes + page_ - 1) / page_;
  ThreadCache& cache = thread_cache();
  std::lock_guard lock(mutex_);
  fold_cache_stats(cache);
  const CUstream key = key_in(cache, stream);
  mark_pending(stream, key);
  CUdeviceptr addr = 0;
  // Takes `pages` from the front of a free range; the rest stays free.
  auto take_range = [&](std::map<CUdeviceptr, FreeRange>::iterator range) {
    addr = range->first;
    const std::size_t left = range->second.pages - pages;
    std::vector<MarkRef> marks = std::move(range->second.marks);
    erase_free(range);
    if (left > 0) insert_free(addr + pages * page_, left, std::move(marks));
  };
  // 1. The smallest free range that is ready for the stream.
  for (auto it = free_by_size_.lower_bound(pages); it != free_by_size_.end(); ++it) {
    auto range = free_by_addr_.find(it->second);
    if (!range_ready(range->second, key)) continue;
    take_range(range);
    break;
  }
  if (addr == 0) {
    ScopedDeviceContext scope(device_);
    // 2. A window of ready free pages and pages the pool holds. Where address space is short
    //    (§3.4.2), no window may be reservable for them; a busy range may still serve.
    try {
      addr = compose(pages, key, false);
    } catch (const DeviceFull&) {
      addr = 0;  // nothing was taken; step 4 reports it if nothing else serves
    }
    // 3. Rather than taking new memory: the smallest free range still busy on other streams,
    //    with this stream made to wait for its marks (§3.7).
    if (addr == 0) {
      auto it = free_by_size_.lower_bound(pages);
      if (it != free_by_size_.end()) {
        auto range = free_by_addr_.find(it->second);
        for (const MarkRef& m : range->second.marks) {
          if (m->stream != key) marks_.wait_on(m, stream);  // throws: nothing taken yet
        }
        take_range(range);
      }
    }
    // 4. New memory.
    if (addr == 0) addr = compose(pages, key, true);
  }
  live_large_.emplace(addr, LargeBlock{pages, bytes});
  large_live_pages_ += pages;
  usage_.on_allocate(bytes);
  debug_check("allocate_large");
  return reinterpret_cast<void*>(addr);
}

void VmmPool::deallocate_large(CUdeviceptr p, std::size_t bytes, CUstream stream) {
  ThreadCache& cache = thread_cache();
  std::lock_guard lock(mutex_);
  auto it = live_large_.find(p);
  if (it == live_large_.end()) {
    throw std::invalid_argument(
        "device_deallocate: " + std::to_string(static_cast<unsigned long long>(p)) +
        " is not a live block of this pool (never allocated, or already "
        "freed)");
  }
  if (it->second.bytes != bytes) {
    throw std::invalid_argument("device_deallocate: block was allocated with " +
                                std::to_string(it->second.bytes) + " bytes but freed with " +
                                std::to_string(bytes));
  }
  const CUstream key = key_in(cache, stream);
  MarkRef mark = marks_.record(stream, key);  // may throw: nothing has changed yet
  fold_cache_stats(cache);
  const std::size_t pages = it->second.pages;
  live_large_.erase(it);
  large_live_pages_ -= pages;
  usage_.on_free(bytes);
  insert_free(p, pages, {std::move(mark)});
  mark_pending(stream, key);
}

// ---- small blocks ------------------------------------------------------------------------------

ThreadCache& VmmPool::thread_cache() {
  auto& slot = t_caches.caches[static_cast<std::size_t>(device_)];
  if (!slot || slot->epoch != epoch_) {
    slot = std::make_unique<ThreadCache>();  // a stale cache's pool is gone: drop it
    for (int c = 0; c < kMaxSizeClasses; ++c) {
      slot->bins[static_cast<std::size_t>(c)].capacity = bin_capacity(size_class_bytes(c));
    }
    slot->pool = this;
    slot->epoch = epoch_;
    slot->per_thread_key = per_thread_stream_key();
    std::lock_guard lock(mutex_);
    slot->forget_seen = forget_epoch_.value.load(std::memory_order_relaxed);  // nothing to apply
    caches_.push_back(slot.get());
  }
  return *slot;
}

void VmmPool::fold_cache_stats(ThreadCache& c) noexcept {
  const std::int64_t b = c.bytes.load(std::memory_order_relaxed);
  const std::int64_t n = c.count.load(std::memory_order_relaxed);
  usage_.fold(b, n, c.peak_bytes.load(std::memory_order_relaxed),
              c.peak_count.load(std::memory_order_relaxed),
              c.total_bytes.load(std::memory_order_relaxed),
              c.total_count.load(std::memory_order_relaxed));
  c.bytes.store(0, std::memory_order_relaxed);
  c.count.store(0, std::memory_order_relaxed);
  c.peak_bytes.store(0, std::memory_order_relaxed);
  c.peak_count.store(0, std::memory_order_relaxed);
  c.total_bytes.store(0, std::memory_order_relaxed);
  c.total_count.store(0, std::memory_order_relaxed);
  c.ops = 0;
}

void* VmmPool::allocate_small(std::size_t bytes, CUstream stream) {
  const int size_class = size_class_of(bytes);
  ThreadCache& cache = thread_cache();
  Bin& bin = cache.bins[static_cast<std::size_t>(size_class)];
  if (!enter_fast_path(cache)) [[unlikely]] {
    return refill_and_allocate(cache, size_class, bytes, stream);  // drained, or a forget pending
  }
  for (int i = bin.count - 1; i >= 0 && i >= bin.count - 4; --i) {
    if (bin.entries[static_cast<std::size_t>(i)].stream != stream) continue;
    const CacheEntry e = bin.entries[static_cast<std::size_t>(i)];
    bin.entries[static_cast<std::size_t>(i)] = bin.entries[static_cast<std::size_t>(--bin.count)];
    e.slab->requested[e.slab->slot_of(reinterpret_cast<CUdeviceptr>(e.ptr))].store(
        static_cast<std::uint32_t>(bytes), std::memory_order_release);
    cache.add(static_cast<std::int64_t>(bytes), 1);
    if (++cache.ops >= kStatFlushOps ||
        cache.bytes.load(std::memory_order_relaxed) > kStatFlushBytes) {
      fold_cache_stats(cache);
    }
    leave_fast_path(cache);
    return e.ptr;
  }
  leave_fast_path(cache);
  return refill_and_allocate(cache, size_class, bytes, stream);
}

void* VmmPool::refill_and_allocate(ThreadCache& cache, int size_class, std::size_t bytes,
                                   CUstream stream) {
  std::lock_guard lock(mutex_);
  sync_forgotten(cache);
  fold_cache_stats(cache);
  const CUstream key = key_in(cache, stream);
  ClassState& state = classes_[static_cast<std::size_t>(size_class)];
  Bin& bin = cache.bins[static_cast<std::size_t>(size_class)];
  // The bin missed: what it holds was freed on other streams. Hand it to the shared lists, where
  // marks make it reusable on any stream once its work completes.
  if (bin.count > 0) flush_bin(cache, size_class, 0);
  // A call on `stream`: what was freed on it and has no mark yet gets one.
  mark_pending(stream, key);
  // Every slot taken goes into the (now empty) bin at once, the one handed out included, so that
  // a driver call failing on the way (a mark recorded, queried or waited for) loses none: what
  // was taken stays in this thread's cache, on `stream`, where it is ready. The request takes the
  // first.
  const int want = bin.capacity / 2 + 1;
  auto take = [&](void* ptr, Slab* slab) {
    ++slab->used;
    bin.entries[static_cast<std::size_t>(bin.count++)] = {ptr, stream, slab};
  };
  auto wanted = [&] { return bin.count < want; };
  int budget = kRefillScan;
  // 1. Shared slots of the thread's own slabs, then 2. slabs nobody owns, claimed.
  std::vector<Slab*>& own = cache.with_shared[static_cast<std::size_t>(size_class)];
  for (std::size_t k = own.size(); k-- > 0 && budget > 0 && wanted();) {
    take_shared(own[k], key, budget, take, wanted);
  }
  while (budget > 0 && wanted() && !state.unowned.empty()) {
    Slab* slab = state.unowned.back();
    set_owner(slab, &cache);
    take_shared(slab, key, budget, take, wanted);
  }
  // 3. Never-used slots of the thread's bump slab of the class, or of one nobody bumps from.
  Slab*& bump = cache.bump[static_cast<std::size_t>(size_class)];
  auto take_fresh = [&] {
    while (wanted() && bump != nullptr && bump->carved < bump->slot_count) {
      take(reinterpret_cast<void*>(bump->base + bump->carved * bump->slot_size), bump);
      ++bump->carved;
    }
  };
  auto adopt = [&](Slab* slab) {
    if (slab->owner != &cache) set_owner(slab, &cache);
    install_bump(cache, slab);
    take_fresh();
  };
  take_fresh();
  while (bin.count == 0 && !state.unowned_bump.empty()) adopt(state.unowned_bump.back());
  if (bin.count == 0) {
    // 4. A new slab on spans or pages the pool holds.
    Slab* fresh = nullptr;
    try {
      fresh = new_slab(size_class, &cache, false);
    } catch (const DeviceFull&) {
      // No address space for a new region: the steps below decide.
    }
    std::vector<const StreamMark*> waited;
    auto take_waiting_any = [&] {
      for (std::size_t k = state.slabs.size(); k-- > 0 && wanted();) {
        if (!state.slabs[k]->shared.empty()) {
          take_waiting(state.slabs[k], stream, key, take, wanted, waited);
        }
      }
    };
    // 5. Rather than new memory: slots freed on other streams whose mark is still pending, with
    //    `stream` made to wait for it.
    if (fresh == nullptr) take_waiting_any();
    // 6. A new slab on new memory.
    if (fresh == nullptr && bin.count == 0) {
      try {
        fresh = new_slab(size_class, &cache, true);
      } catch (const DeviceFull&) {
        // 7. The device is full: free slots of other threads' slabs (a thread otherwise keeps
        //    to its own slabs: blocks of two threads in one slab share the cache lines of its
        //    slot records), then another thread's bump slab of the class, before giving up.
        int unlimited = std::numeric_limits<int>::max();
        for (std::size_t k = state.slabs.size(); k-- > 0 && bin.count == 0;) {
          if (!state.slabs[k]->shared.empty()) {
            take_shared(state.slabs[k], key, unlimited, take, wanted);
          }
        }
        while (bin.count == 0) {
          Slab* stolen = steal_bump(cache, size_class);
          if (stolen == nullptr) break;
          adopt(stolen);
        }
        if (bin.count == 0) throw;  // nothing taken
      }
    }
    if (fresh != nullptr) adopt(fresh);
  }
  // Nothing below throws. The first slot taken is handed out; the rest keep their order.
  const CacheEntry result = bin.entries[0];
  std::copy(bin.entries.begin() + 1, bin.entries.begin() + bin.count, bin.entries.begin());
  --bin.count;
  result.slab->requested[result.slab->slot_of(reinterpret_cast<CUdeviceptr>(result.ptr))].store(
      static_cast<std::uint32_t>(bytes), std::memory_order_release);
  usage_.on_allocate(bytes);
  debug_check("refill");
  return result.ptr;
}

std::uint32_t VmmPool::spans_for(std::size_t slot_size) const noexcept {
  // kSlabSlots(Large) slots, or 2 of the largest classes in half a page (slot_size <= page_ / 4); then
  // up to 8 spans more, to waste at most 1/64 of the slab after its last slot (a 7.5 KiB class
  // wastes 2 KiB of one 32 KiB span, 512 B of four).
  const std::size_t slots = slot_size <= kSlabSmallSlot ? kSlabSlots : kSlabSlotsLarge;
  const std::size_t bytes = std::min(slots * slot_size, page_ / 2);
  const std::size_t least = std::clamp<std::size_t>((bytes + span_ - 1) / span_, 1, spans_per_page_);
  const std::size_t most = std::min<std::size_t>(spans_per_page_, std::max<std::size_t>(least, 8));
  std::size_t best = least;
  double best_waste = 1.0;
  for (std::size_t k = least; k <= most; ++k) {
    const double waste =
        static_cast<double>((k * span_) % slot_size) / static_cast<double>(k * span_);
    if (waste <= 1.0 / 64) return static_cast<std::uint32_t>(k);
    if (waste < best_waste) {
      best_waste = waste;
      best = k;
    }
  }
  return static_cast<std::uint32_t>(best);
}

void VmmPool::open_page(SmallPage* page) {
  if (page->open) return;
  open_pages_.push_back(page);
  page->open = true;
}

namespace {
// The first run of `k` set bits in `bits` (its lowest bit's index), or -1.
int find_run(std::uint64_t bits, std::uint32_t k) noexcept {
  std::uint64_t starts = bits;
  for (std::uint32_t i = 1; i < k && starts != 0; ++i) starts &= bits >> i;
  return starts == 0 ? -1 : std::countr_zero(starts);
}
std::uint64_t span_mask(std::uint32_t first, std::uint32_t count) noexcept {
  return (count >= 64 ? ~std::uint64_t{0} : ((std::uint64_t{1} << count) - 1)) << first;
}
}  // namespace

Slab* VmmPool::new_slab(int size_class, ThreadCache* owner, bool create) {
  ScopedDeviceContext scope(device_);
  // Host memory first: nothing may throw once spans are taken or a page is mapped.
  auto slab = std::make_unique<Slab>();
  slab->size_class = size_class;
  slab->slot_size = size_class_bytes(size_class);
  slab->spans = spans_for(slab->slot_size);
  slab->slot_count = static_cast<std::uint32_t>(slab->spans * span_ / slab->slot_size);
  slab->slot_reciprocal = ~std::uint64_t{0} / slab->slot_size + 1;
  slab->requested.reset(slab->slot_count);
  slab->owner = owner;
  std::vector<Slab*>& slabs = classes_[static_cast<std::size_t>(size_class)].slabs;
  if (slabs.size() == slabs.capacity()) slabs.reserve(2 * slabs.size() + 1);
  if (open_pages_.size() == open_pages_.capacity()) open_pages_.reserve(2 * open_pages_.size() + 4);
  const std::uint32_t k = slab->spans;
  // 1. Free spans in a mapped page (full pages found on the way leave the list).
  auto from_open_pages = [&]() -> std::pair<SmallPage*, int> {
    for (std::size_t i = open_pages_.size(); i-- > 0;) {
      SmallPage* page = open_pages_[i];
      if (page->free_spans == 0) {
        page->open = false;
        open_pages_[i] = open_pages_.back();
        open_pages_.pop_back();
        continue;
      }
      if (const int first = find_run(page->free_spans, k); first >= 0) return {page, first};
    }
    return {nullptr, -1};
  };
  auto [page, first] = from_open_pages();
  // 2. Spans of empty slabs whose freed blocks' work has completed.
  if (page == nullptr && release_empty_slabs(false) > 0) std::tie(page, first) = from_open_pages();
  // 3. A new page.
  if (page == nullptr) {
    auto rec = std::make_unique<SmallPage>();
    std::vector<CUmemGenericAllocationHandle> handle;
    handle.reserve(1);
    int ri = -1;
    auto find_region = [&] {
      ri = -1;
      const int n = region_count_.load(std::memory_order_relaxed);
      for (int i = 0; i < n && ri < 0; ++i) {
        const Region& r = regions_[static_cast<std::size_t>(i)];
        if (r.small && (!r.vacant.empty() || r.bump < r.pages)) ri = i;
      }
    };
    if (!acquire_pages(1, 0, 0, handle, create)) return nullptr;
    find_region();  // acquire_pages may have vacated pages: choose only now
    if (ri < 0) {
      try {
        ri = add_region(small_region_, page_, true);
      } catch (...) {
        spare_.push_back(handle[0]);
        throw;
      }
    }
    Region& region = regions_[static_cast<std::size_t>(ri)];
    const std::size_t index = region.vacant.empty() ? region.bump : region.vacant.back();
    auto take_page = [&] {
      if (region.vacant.empty()) {
        ++region.bump;
      } else {
        region.vacant.pop_back();
      }
    };
    try {
      map_pages(region.base + index * page_, handle.data(), 1);
    } catch (...) {
      if (handle[0] != 0) {
        spare_.push_back(handle[0]);
      } else {
        take_page();  // a stuck mapping holds the page until it is unmapped
      }
      throw;
    }
    take_page();
    rec->handle = handle[0];
    rec->region = ri;
    rec->index = index;
    rec->free_spans = span_mask(0, spans_per_page_);
    page = rec.get();
    region.page_recs[index] = std::move(rec);
    ++small_pages_;
    open_page(page);  // room reserved above
    first = 0;
  }
  // Nothing below throws.
  Region& region = regions_[static_cast<std::size_t>(page->region)];
  page->free_spans &= ~span_mask(static_cast<std::uint32_t>(first), k);
  slab->page = page;
  slab->first_span = static_cast<std::uint32_t>(first);
  slab->base = region.base + page->index * page_ + static_cast<std::size_t>(first) * span_;
  Slab* raw = slab.release();
  slabs.push_back(raw);
  const std::size_t g = (raw->base - region.base) >> span_shift_;
  for (std::uint32_t i = 0; i < k; ++i) region.slabs[g + i].store(raw, std::memory_order_release);
  ++slab_count_;
  return raw;
}

void VmmPool::release_slab(Slab* slab) noexcept {
  SmallPage* page = slab->page;
  Region& region = regions_[static_cast<std::size_t>(page->region)];
  const std::size_t g = (slab->base - region.base) >> span_shift_;
  for (std::uint32_t i = 0; i < slab->spans; ++i) {
    region.slabs[g + i].store(nullptr, std::memory_order_release);
  }
  ClassState& state = classes_[static_cast<std::size_t>(slab->size_class)];
  if (!slab->shared.empty()) unlist(slab);
  for (const SharedSlot& e : slab->shared) drop_batch_ref(e.batch);
  if (slab->bump_listed) std::erase(state.unowned_bump, slab);
  std::erase(state.slabs, slab);
  --slab_count_;
  const bool was_full = page->free_spans == 0;
  page->free_spans |= span_mask(slab->first_span, slab->spans);
  delete slab;
  if (was_full && !page->open) {
    try {
      open_page(page);
    } catch (...) {
      // Found again by reclaim_small_pages once it is free; until then its spans wait.
    }
  }
}

std::size_t VmmPool::release_empty_slabs(bool wait) {
  std::size_t released = 0;
  for (ClassState& state : classes_) {
    for (std::size_t i = 0; i < state.slabs.size();) {
      Slab* slab = state.slabs[i];
      if (slab->used != 0 || slab->bump_owned) {
        ++i;
        continue;
      }
      // Reuse spans only once no queued work still uses their blocks (§7 #2): every slot's mark
      // has completed.
      bool idle = true;
      for (const SharedSlot& e : slab->shared) {
        if (wait && e.batch->mark) {
          marks_.wait(e.batch->mark);
        } else if (!batch_idle(e.batch)) {
          idle = false;
          break;
        }
      }
      if (!idle) {
        ++i;
        continue;
      }
      release_slab(slab);  // erases slabs[i]
      ++released;
    }
  }
  return released;
}

std::size_t VmmPool::reclaim_small_pages(std::vector<CUmemGenericAllocationHandle>* into,
                                         std::size_t want, bool wait) {
  release_empty_slabs(wait);
  const DriverApi& api = driver();
  const std::uint64_t all = span_mask(0, spans_per_page_);
  std::size_t unmapped = 0;
  for (std::size_t i = open_pages_.size(); i-- > 0 && unmapped < want;) {
    SmallPage* page = open_pages_[i];
    if (page->free_spans != all) continue;
    Region& region = regions_[static_cast<std::size_t>(page->region)];
    std::vector<CUmemGenericAllocationHandle>& to = into != nullptr ? *into : spare_;
    to.reserve(to.size() + 1);  // room first: nothing after the unmap may fail
    region.vacant.reserve(region.vacant.size() + 1);
    if (api.cuMemUnmap(region.base + page->index * page_, page_) != CUDA_SUCCESS) continue;
    pages_mapped_ -= 1;
    --small_pages_;
    to.push_back(page->handle);
    region.vacant.push_back(page->index);
    open_pages_[i] = open_pages_.back();
    open_pages_.pop_back();
    region.page_recs[page->index].reset();
    ++unmapped;
  }
  return unmapped;
}

void VmmPool::release_bump(ThreadCache& cache, int size_class) noexcept {
  Slab*& slab = cache.bump[static_cast<std::size_t>(size_class)];
  if (slab == nullptr) return;
  slab->bump_owned = false;
  cache.bump_spans -= slab->spans;
  if (slab->carved < slab->slot_count && !slab->bump_listed) {
    try {
      classes_[static_cast<std::size_t>(size_class)].unowned_bump.push_back(slab);
      slab->bump_listed = true;
    } catch (...) {
      // Its slots never used stay unused until the slab empties and is released.
    }
  }
  slab = nullptr;
}

void VmmPool::release_bumps(ThreadCache& cache) noexcept {
  for (int c = 0; c < kMaxSizeClasses; ++c) release_bump(cache, c);
}

void VmmPool::install_bump(ThreadCache& cache, Slab* slab) noexcept {
  const int size_class = slab->size_class;
  release_bump(cache, size_class);
  // Over budget: give up the thread's largest other bump slabs (to any thread that needs them).
  while (cache.bump_spans + slab->spans > bump_budget_) {
    int largest = -1;
    for (int c = 0; c < kMaxSizeClasses; ++c) {
      const Slab* b = cache.bump[static_cast<std::size_t>(c)];
      if (b != nullptr && (largest < 0 ||
                           b->spans > cache.bump[static_cast<std::size_t>(largest)]->spans)) {
        largest = c;
      }
    }
    if (largest < 0) break;
    release_bump(cache, largest);
  }
  if (slab->bump_listed) {
    std::erase(classes_[static_cast<std::size_t>(size_class)].unowned_bump, slab);
    slab->bump_listed = false;
  }
  slab->bump_owned = true;
  cache.bump_spans += slab->spans;
  cache.bump[static_cast<std::size_t>(size_class)] = slab;
}

Slab* VmmPool::steal_bump(ThreadCache& cache, int size_class) noexcept {
  const auto c = static_cast<std::size_t>(size_class);
  for (ThreadCache* other : caches_) {
    if (other == &cache) continue;
    Slab* slab = other->bump[c];
    if (slab == nullptr || slab->carved == slab->slot_count) continue;
    release_bump(*other, size_class);
    return slab;
  }
  return nullptr;
}

// ---- batches and marks of small blocks ---------------------------------------------------------

Batch* VmmPool::new_batch(CUstream key, MarkRef mark) {
  auto b = std::make_unique<Batch>();
  b->key = key;
  b->mark = std::move(mark);
  b->index = batches_.size();
  batches_.push_back(b.get());
  if (!b->mark) {
    try {
      unmarked_.push_back(b.get());
    } catch (...) {
      batches_.pop_back();
      throw;
    }
  }
  return b.release();
}

Batch* VmmPool::unmarked_batch(CUstream key) {
  for (Batch* b : unmarked_) {
    if (b->key == key) return b;
  }
  return new_batch(key, nullptr);
}

void VmmPool::set_mark(Batch* batch, MarkRef mark) {
  if (!batch->mark) std::erase(unmarked_, batch);
  batch->mark = std::move(mark);
}

void VmmPool::add_shared(Slab* slab, void* ptr, Batch* batch) {
  if (slab->shared.empty()) list_of(slab).push_back(slab);
  slab->shared.push_back(SharedSlot{ptr, batch});
  ++batch->slots;
}

void VmmPool::drop_batch_ref(Batch* batch) noexcept {
  if (--batch->slots != 0 || batch->logged) return;
  if (!batch->mark) std::erase(unmarked_, batch);
  Batch* last = batches_.back();
  last->index = batch->index;
  batches_[batch->index] = last;
  batches_.pop_back();
  delete batch;
}

void VmmPool::mark_pending(CUstream stream, CUstream key) noexcept {
  for (Batch* b : unmarked_) {
    if (b->key != key) continue;
    try {
      // Recorded now, the mark covers everything queued on the stream, the frees included (§3.7).
      set_mark(b, marks_.record(stream, key));
    } catch (...) {
      // No mark: the blocks stay reusable on their own stream, and elsewhere after trim().
    }
    return;
  }
}

bool VmmPool::batch_ready_for(Batch* batch, CUstream key) {
  if (batch->key == key) return true;
  return batch_idle(batch);
}

bool VmmPool::batch_idle(Batch* batch) {
  if (!batch->mark) {
    if (batch->key != nullptr) return false;  // no mark yet; only the freeing stream may use it
    set_mark(batch, marks_.record(nullptr, nullptr));  // the legacy stream is always alive
  }
  return marks_.completed(batch->mark);
}

void VmmPool::settle_unmarked() {
  if (unmarked_.empty()) return;
  const DriverApi& api = driver();
  bool other = false;
  for (Batch* b : std::vector<Batch*>(unmarked_)) {
    if (b->key == nullptr) {
      set_mark(b, marks_.record(nullptr, nullptr));
    } else {
      other = true;
    }
  }
  if (!other) return;
  // Their streams may be gone: only a wait for the whole context covers them (§3.7).
  VSR_CU_TRY(api.cuCtxSynchronize());
  auto done = std::make_shared<StreamMark>(StreamMark{forgotten_stream(), nullptr, true});
  for (Batch* b : std::vector<Batch*>(unmarked_)) set_mark(b, done);
}

void VmmPool::sync_forgotten(ThreadCache& cache) noexcept {
  const std::uint64_t now = forget_epoch_.value.load(std::memory_order_relaxed);
  if (cache.forget_seen == now) return;
  for (const ForgetEntry& f : forget_log_) {
    if (f.epoch <= cache.forget_seen) continue;
    for (int c = 0; c < kMaxSizeClasses; ++c) {
      Bin& bin = cache.bins[static_cast<std::size_t>(c)];
      int kept = 0;
      for (int i = 0; i < bin.count; ++i) {
        const CacheEntry& e = bin.entries[static_cast<std::size_t>(i)];
        if (key_in(cache, e.stream) != f.key) {
          bin.entries[static_cast<std::size_t>(kept++)] = e;
          continue;
        }
        add_shared(e.slab, e.ptr, f.batch);
        if (--e.slab->used == 0 && !e.slab->bump_owned && e.slab->owner != nullptr) {
          set_owner(e.slab, nullptr);
        }
      }
      bin.count = kept;
    }
  }
  cache.forget_seen = now;
  prune_forget_log();
}

void VmmPool::prune_forget_log() noexcept {
  if (forget_log_.empty()) return;
  std::uint64_t oldest = forget_epoch_.value.load(std::memory_order_relaxed);
  for (const ThreadCache* c : caches_) oldest = std::min(oldest, c->forget_seen);
  auto end = std::find_if(forget_log_.begin(), forget_log_.end(),
                          [&](const ForgetEntry& f) { return f.epoch > oldest; });
  for (auto it = forget_log_.begin(); it != end; ++it) {
    Batch* b = it->batch;
    b->logged = false;
    if (b->slots == 0) {
      ++b->slots;
      drop_batch_ref(b);  // deletes it
    }
  }
  forget_log_.erase(forget_log_.begin(), end);
}

void VmmPool::flush_bin(ThreadCache& cache, int size_class, int keep) noexcept {
  Bin& bin = cache.bins[static_cast<std::size_t>(size_class)];
  const int move = bin.count - keep;
  if (move <= 0) return;
  Batch* batch = nullptr;
  CUstream batch_key = nullptr;
  for (int i = 0; i < move; ++i) {
    const CacheEntry& e = bin.entries[static_cast<std::size_t>(i)];
    const CUstream key = key_in(cache, e.stream);
    if (batch == nullptr || key != batch_key) {
      batch = unmarked_batch(key);  // joins what was freed on that stream and has no mark yet
      batch_key = key;
    }
    add_shared(e.slab, e.ptr, batch);
    // An emptied slab holds none of its owner's blocks: any thread may claim it now.
    if (--e.slab->used == 0 && !e.slab->bump_owned && e.slab->owner != nullptr) {
      set_owner(e.slab, nullptr);
    }
  }
  std::copy(bin.entries.begin() + move, bin.entries.begin() + bin.count, bin.entries.begin());
  bin.count = keep;
}

std::vector<Slab*>& VmmPool::list_of(Slab* slab) {
  const auto c = static_cast<std::size_t>(slab->size_class);
  return slab->owner != nullptr ? slab->owner->with_shared[c] : classes_[c].unowned;
}

void VmmPool::unlist(Slab* slab) {
  std::vector<Slab*>& list = list_of(slab);
  if (list.back() == slab) {
    list.pop_back();  // the common case: lists are taken from the back
  } else {
    std::erase(list, slab);
  }
}

void VmmPool::set_owner(Slab* slab, ThreadCache* owner) {
  const bool listed = !slab->shared.empty();
  if (listed) unlist(slab);
  slab->owner = owner;
  if (listed) list_of(slab).push_back(slab);
}

void VmmPool::disown_all(ThreadCache& cache) {
  for (ClassState& state : classes_) {
    for (Slab* slab : state.slabs) {
      if (slab->owner == &cache) set_owner(slab, nullptr);
    }
  }
}

template <typename Take, typename Want>
void VmmPool::take_shared(Slab* slab, CUstream key, int& budget, Take&& take, Want&& want) {
  std::vector<SharedSlot>& shared = slab->shared;
  for (std::size_t i = shared.size(); i-- > 0 && budget > 0 && want(); --budget) {
    if (!batch_ready_for(shared[i].batch, key)) continue;
    const SharedSlot e = shared[i];
    shared[i] = shared.back();
    shared.pop_back();
    take(e.ptr, slab);
    drop_batch_ref(e.batch);
  }
  if (shared.empty()) unlist(slab);
}

template <typename Take, typename Want>
void VmmPool::take_waiting(Slab* slab, CUstream stream, CUstream key, Take&& take, Want&& want,
                           std::vector<const StreamMark*>& waited) {
  std::vector<SharedSlot>& shared = slab->shared;
  for (std::size_t i = shared.size(); i-- > 0 && want();) {
    Batch* b = shared[i].batch;
    if (!batch_ready_for(b, key)) {
      if (!b->mark) continue;  // nothing to wait for: its stream has not been named since
      if (std::find(waited.begin(), waited.end(), b->mark.get()) == waited.end()) {
        marks_.wait_on(b->mark, stream);  // throws: what was taken so far stays taken
        waited.push_back(b->mark.get());
      }
    }
    const SharedSlot e = shared[i];
    shared[i] = shared.back();
    shared.pop_back();
    take(e.ptr, slab);
    drop_batch_ref(e.batch);
  }
  if (shared.empty()) unlist(slab);
}

void VmmPool::drain_caches(const ThreadCache* self) noexcept {
  bool any = false;
  for (ThreadCache* c : caches_) {
    if (c == self) continue;
    c->steal.store(true, asymmetric_ ? std::memory_order_relaxed : std::memory_order_seq_cst);
    any = true;
  }
  if (!any) return;
  // Without the fence nothing is known about the owners' fast paths: leave their caches alone.
  const bool fenced = !asymmetric_ || heavy_fence();
  for (ThreadCache* c : caches_) {
    if (c == self) continue;
    if (fenced) {
      // An owner inside its fast path leaves it within a few instructions (it takes no lock and
      // makes no call there); later entries see `steal` and take the mutex, which is held here.
      while (c->active.load(asymmetric_ ? std::memory_order_acquire : std::memory_order_seq_cst)) {
        std::this_thread::yield();
      }
      sync_forgotten(*c);
      release_bumps(*c);
      for (int k = 0; k < kMaxSizeClasses; ++k) flush_bin(*c, k, 0);
    }
    c->steal.store(false, std::memory_order_release);
  }
}

void VmmPool::retire_cache(ThreadCache& cache) noexcept {
  try {
    std::lock_guard lock(mutex_);
    fold_cache_stats(cache);
    ScopedDeviceContext scope(device_);
    sync_forgotten(cache);
    for (int c = 0; c < kMaxSizeClasses; ++c) flush_bin(cache, c, 0);
    release_bumps(cache);
    disown_all(cache);
    std::erase(caches_, &cache);
    prune_forget_log();
    // What the thread freed on its per-thread stream: nobody else may name that stream, and it
    // ends with the thread. A mark on the legacy stream covers it: the legacy stream's work
    // waits for all earlier work of the blocking streams, the per-thread stream included (§3.7).
    for (Batch* b : std::vector<Batch*>(unmarked_)) {
      if (b->key != cache.per_thread_key) continue;
      try {
        set_mark(b, marks_.record(nullptr, forgotten_stream()));
        b->key = forgotten_stream();
      } catch (...) {
        // Unmarked: usable after trim()'s cuCtxSynchronize.
      }
    }
  } catch (...) {
    // Shutdown or a failing driver: the cached slots stay unavailable; nothing else is lost.
    std::lock_guard lock(mutex_);
    disown_all(cache);
    std::erase(caches_, &cache);
  }
}

// ---- public operations -------------------------------------------------------------------------

void* VmmPool::allocate(std::size_t bytes, CUstream stream) {
  if (stream == CU_STREAM_LEGACY) stream = nullptr;  // one stream (§3.7)
  if (bytes <= small_limit_) return allocate_small(bytes, stream);
  if (bytes > device_total_) throw DeviceFull{bytes, true};  // can never fit; avoids overflow
  return allocate_large(bytes, stream);
}

void VmmPool::deallocate(void* ptr, std::size_t bytes, CUstream stream) {
  if (stream == CU_STREAM_LEGACY) stream = nullptr;
  const auto p = reinterpret_cast<CUdeviceptr>(ptr);
  Slab* slab = slab_of(p);
  if (slab == nullptr) return deallocate_large(p, bytes, stream);
  const std::size_t slot = slab->slot_of(p);
  if (p != slab->base + slot * slab->slot_size || slot >= slab->slot_count) {
    throw std::invalid_argument(
        "device_deallocate: pointer is inside a small block, not at its start");
  }
  std::uint32_t expected = static_cast<std::uint32_t>(bytes);
  const bool fits = bytes != 0 && bytes <= small_limit_;
  if (!fits) expected = slab->requested[slot].load(std::memory_order_acquire);
  if (!fits ||
      !slab->requested[slot].compare_exchange_strong(expected, 0, std::memory_order_acq_rel)) {
    if (expected == 0) {
      throw std::invalid_argument(
          "device_deallocate: block is not live (never allocated, or already freed)");
    }
    throw std::invalid_argument("device_deallocate: block was allocated with " +
                                std::to_string(expected) + " bytes but freed with " +
                                std::to_string(bytes));
  }
  ThreadCache& cache = thread_cache();
  Bin& bin = cache.bins[static_cast<std::size_t>(slab->size_class)];
  if (enter_fast_path(cache)) [[likely]] {
    if (bin.count < bin.capacity) [[likely]] {
      bin.entries[static_cast<std::size_t>(bin.count++)] = {ptr, stream, slab};
      cache.add(-static_cast<std::int64_t>(bytes), -1);
      leave_fast_path(cache);
      return;
    }
    leave_fast_path(cache);
  }
  // The bin is full, another thread is draining it, or a forget_stream() call is to be applied
  // first: under the mutex, which such a thread holds.
  try {
    std::lock_guard lock(mutex_);
    sync_forgotten(cache);
    const bool flushed = bin.count >= bin.capacity;
    if (flushed) flush_bin(cache, slab->size_class, bin.capacity / 2);
    bin.entries[static_cast<std::size_t>(bin.count++)] = {ptr, stream, slab};
    cache.add(-static_cast<std::int64_t>(bytes), -1);
    if (flushed) mark_pending(stream, key_in(cache, stream));  // a call on `stream`
  } catch (...) {
    slab->requested[slot].store(static_cast<std::uint32_t>(bytes),
                                std::memory_order_release);  // changes nothing
    throw;
  }
}

void VmmPool::trim() {
  ThreadCache& cache = thread_cache();
  std::lock_guard lock(mutex_);
  const DriverApi& api = driver();
  ScopedDeviceContext scope(device_);
  sync_forgotten(cache);
  fold_cache_stats(cache);
  release_bumps(cache);
  for (int c = 0; c < kMaxSizeClasses; ++c) flush_bin(cache, c, 0);
  drain_caches(&cache);  // what other threads freed and still cache is free memory too
  std::optional<CudaError> first_error;
  if (const CUresult r = recover_stuck(); r != CUDA_SUCCESS) {
    first_error = CudaError(r, cu_result_name(r), "cuMemUnmap failed in free_pool_memory");
  }
  // Free large ranges: wait for the streams that freed them, then unmap (§7 #2).
  for (auto it = free_by_addr_.begin(); it != free_by_addr_.end();) {
    const CUdeviceptr begin = it->first;
    const std::size_t pages = it->second.pages;
    try {
      for (const MarkRef& m : it->second.marks) marks_.wait(m);
      it->second.marks.clear();
      spare_.reserve(spare_.size() + pages);
      VSR_CU_TRY(api.cuMemUnmap(begin, pages * page_));
    } catch (const CudaError& e) {
      if (!first_error) first_error = e;
      ++it;
      continue;
    }
    it = retire_unmapped_range(it);
  }
  // Small blocks: every freed slot needs a mark before its slab's page may go.
  try {
    settle_unmarked();
  } catch (const CudaError& e) {
    if (!first_error) first_error = e;
  }
  try {
    reclaim_small_pages(nullptr, static_cast<std::size_t>(-1), true);
  } catch (const CudaError& e) {
    if (!first_error) first_error = e;
  }
  std::vector<CUmemGenericAllocationHandle> kept;
  for (CUmemGenericAllocationHandle h : spare_) {
    const CUresult r = api.cuMemRelease(h);
    if (r == CUDA_SUCCESS) {
      --pages_held_;
    } else {
      kept.push_back(h);
      if (!first_error) {
        first_error = CudaError(r, cu_result_name(r), "cuMemRelease failed in free_pool_memory");
      }
    }
  }
  spare_ = std::move(kept);
  debug_check("trim");
  if (first_error) throw *first_error;
}

void VmmPool::forget(CUstream stream) {
  if (stream == CU_STREAM_LEGACY) stream = nullptr;
  if (stream == nullptr) return;  // the legacy stream lives as long as the context
  ThreadCache& cache = thread_cache();
  std::lock_guard lock(mutex_);
  const CUstream key = key_in(cache, stream);
  // While `stream` is alive: one mark covers everything freed on it so far (§3.7).
  MarkRef mark = marks_.record(stream, forgotten_stream());  // throws: nothing has changed
  Batch* forgotten = new_batch(forgotten_stream(), mark);
  forgotten->logged = true;
  try {
    forget_log_.push_back(
        {forget_epoch_.value.load(std::memory_order_relaxed) + 1, key, forgotten});
  } catch (...) {
    forgotten->logged = false;
    ++forgotten->slots;
    drop_batch_ref(forgotten);
    throw;
  }
  // From here on nothing throws.
  for (Batch* b : batches_) {
    if (b == forgotten || b->key != key) continue;
    b->key = forgotten_stream();
    if (!b->mark) set_mark(b, mark);
  }
  for (auto& [addr, range] : free_by_addr_) {
    for (const MarkRef& m : range.marks) {
      if (m->stream == key) m->stream = forgotten_stream();
    }
  }
  // Every thread cache applies the call to its bins on its next use (its fast path sees the new
  // epoch); this thread's at once.
  forget_epoch_.value.store(forget_log_.back().epoch, std::memory_order_release);
  sync_forgotten(cache);
  if (forget_log_.size() > kMaxForgetLog) drain_caches(&cache);  // idle threads' caches too
  prune_forget_log();
}

void VmmPool::fill_stats(MemoryPoolStats& s) const noexcept {
  std::lock_guard lock(mutex_);
  std::int64_t b = usage_.current_bytes.load(), c = usage_.current_count.load();
  std::int64_t pb = 0, pc = 0;
  std::uint64_t tb = usage_.total_bytes.load(), tc = usage_.total_count.load();
  for (const ThreadCache* cache : caches_) {
    b += cache->bytes.load(std::memory_order_relaxed);
    c += cache->count.load(std::memory_order_relaxed);
    pb += cache->peak_bytes.load(std::memory_order_relaxed);
    pc += cache->peak_count.load(std::memory_order_relaxed);
    tb += cache->total_bytes.load(std::memory_order_relaxed);
    tc += cache->total_count.load(std::memory_order_relaxed);
  }
  const std::int64_t peak_b = std::max(usage_.peak_bytes.load(), usage_.current_bytes.load() + pb);
  const std::int64_t peak_c = std::max(usage_.peak_count.load(), usage_.current_count.load() + pc);
  s.current_bytes = static_cast<std::size_t>(std::max<std::int64_t>(b, 0));
  s.current_count = static_cast<std::size_t>(std::max<std::int64_t>(c, 0));
  s.peak_bytes = static_cast<std::size_t>(std::max(peak_b, b));
  s.peak_count = static_cast<std::size_t>(std::max(peak_c, c));
  s.total_bytes = static_cast<std::size_t>(tb);
  s.total_count = static_cast<std::size_t>(tc);
  s.pool_size = pages_held_ * page_;
  s.mapped_bytes = pages_mapped_ * page_;
  s.reserved_bytes = reserved_bytes_;
  // A small page is free once no slab on it holds a live or cached block (trim then releases it).
  std::vector<const SmallPage*> busy_pages;
  try {
    for (const ClassState& state : classes_) {
      for (const Slab* slab : state.slabs) {
        if (slab->used != 0) busy_pages.push_back(slab->page);
      }
    }
  } catch (...) {
  }
  std::sort(busy_pages.begin(), busy_pages.end());
  const auto busy = static_cast<std::size_t>(
      std::unique(busy_pages.begin(), busy_pages.end()) - busy_pages.begin());
  s.pool_free_bytes = (pages_held_ - large_live_pages_ - busy) * page_;
  s.largest_free_block = free_by_size_.empty() ? 0 : std::prev(free_by_size_.end())->first * page_;
  s.granularity = page_;
  s.small_block_limit = small_limit_;
}

std::string VmmPool::describe() const {
  MemoryPoolStats s;
  fill_stats(s);
  return "the pool holds " + format_bytes(*s.pool_size) + " of physical memory (" +
         format_bytes(*s.current_bytes) + " live in " + std::to_string(*s.current_count) +
         " blocks, " + format_bytes(s.pool_free_bytes) + " free; largest free range " +
         format_bytes(s.largest_free_block) + "), " + format_bytes(s.reserved_bytes) +
         " of address space reserved";
}

std::pair<std::uintptr_t, std::uintptr_t> VmmPool::slab_extent(const void* ptr) const {
  std::lock_guard lock(mutex_);
  const Slab* slab = slab_of(reinterpret_cast<CUdeviceptr>(ptr));
  if (slab == nullptr) return {0, 0};
  return {slab->base, slab->base + slab->spans * span_};
}

std::string VmmPool::check_invariants() const {
  std::lock_guard lock(mutex_);
  return check_locked();
}

std::string VmmPool::check_locked() const {
  auto fail = [](const std::string& what) { return "pool invariant: " + what; };
  std::size_t slabs = 0, small_pages = 0, large_mapped = 0, stuck_pages = 0;
  std::map<const SmallPage*, std::uint64_t> spans_used;
  for (int c = 0; c < kMaxSizeClasses; ++c) {
    const ClassState& state = classes_[static_cast<std::size_t>(c)];
    for (const Slab* slab : state.slabs) {
      ++slabs;
      if (slab->size_class != c) return fail("a slab is listed under another class");
      if (slab->used + slab->shared.size() > slab->carved || slab->carved > slab->slot_count) {
        return fail("a slab's used + shared slots exceed its carved slots");
      }
      if (slab->slot_count * slab->slot_size > slab->spans * span_) {
        return fail("a slab's slots overrun its spans");
      }
      const SmallPage* page = slab->page;
      const Region& region = regions_[static_cast<std::size_t>(page->region)];
      if (region.page_recs[page->index].get() != page) return fail("a slab's page is not mapped");
      const std::uint64_t mask = span_mask(slab->first_span, slab->spans);
      if ((page->free_spans & mask) != 0) return fail("a slab's spans are marked free");
      if ((spans_used[page] & mask) != 0) return fail("two slabs share a span");
      spans_used[page] |= mask;
      const std::size_t g = (slab->base - region.base) >> span_shift_;
      for (std::uint32_t i = 0; i < slab->spans; ++i) {
        if (region.slabs[g + i].load(std::memory_order_relaxed) != slab) {
          return fail("a span's slab entry does not name its slab");
        }
      }
      if (slab->bump_listed !=
          (std::find(state.unowned_bump.begin(), state.unowned_bump.end(), slab) !=
           state.unowned_bump.end())) {
        return fail("bump_listed disagrees with the class's unowned_bump list");
      }
      if (slab->bump_owned == slab->bump_listed && slab->bump_owned) {
        return fail("a slab is both a thread's bump slab and listed as nobody's");
      }
    }
  }
  if (slabs != slab_count_) return fail("slab_count_ is wrong");
  for (const ThreadCache* cache : caches_) {
    std::size_t spans = 0;
    for (const Slab* b : cache->bump) {
      if (b == nullptr) continue;
      if (!b->bump_owned) return fail("a thread's bump slab is not marked bump_owned");
      spans += b->spans;
    }
    if (spans != cache->bump_spans) return fail("a thread's bump_spans is wrong");
    if (spans > bump_budget_ + spans_per_page_) return fail("a thread's bump slabs exceed budget");
  }
  const int n = region_count_.load(std::memory_order_relaxed);
  const std::uint64_t all = span_mask(0, spans_per_page_);
  for (int i = 0; i < n; ++i) {
    const Region& r = regions_[static_cast<std::size_t>(i)];
    if (r.size == 0) continue;
    for (const auto& page : r.page_recs) {
      if (!page) continue;
      ++small_pages;
      const auto it = spans_used.find(page.get());
      const std::uint64_t used = it == spans_used.end() ? 0 : it->second;
      if ((used | page->free_spans) != all) return fail("a page's span is neither free nor used");
      if (page->free_spans != 0 && !page->open) return fail("a page with free spans is not open");
    }
    for (CUmemGenericAllocationHandle h : r.handles) large_mapped += h != 0 ? 1 : 0;
  }
  for (const SmallPage* page : open_pages_) {
    if (!page->open) return fail("a listed page is not marked open");
  }
  if (small_pages != small_pages_) return fail("small_pages_ is wrong");
  for (const StuckMapping& m : stuck_) stuck_pages += m.handles.size();
  if (small_pages + large_mapped + stuck_pages != pages_mapped_) return fail("pages_mapped_ is wrong");
  if (pages_mapped_ + spare_.size() != pages_held_) return fail("held pages are unaccounted for");
  std::size_t free_pages = 0;
  for (const auto& [addr, range] : free_by_addr_) {
    free_pages += range.pages;
    bool indexed = false;
    auto [lo, hi] = free_by_size_.equal_range(range.pages);
    for (auto s = lo; s != hi && !indexed; ++s) indexed = s->second == addr;
    if (!indexed) return fail("a free range is missing from the size index");
    auto next = free_by_addr_.upper_bound(addr);
    if (next != free_by_addr_.end() && addr + range.pages * page_ > next->first) {
      return fail("free ranges overlap");
    }
  }
  if (free_by_size_.size() != free_by_addr_.size()) return fail("the size index has extra entries");
  if (free_pages + large_live_pages_ != large_mapped) {
    return fail("large mapped pages are neither live nor free");
  }
  return {};
}

void VmmPool::debug_check([[maybe_unused]] const char* where) const noexcept {
#ifndef NDEBUG
  static const bool enabled = [] {
    const char* v = std::getenv("VSR_POOL_CHECKS");
    return v != nullptr && v[0] == '1';
  }();
  if (!enabled) return;
  static thread_local unsigned calls = 0;
  if (slab_count_ > 256 && (++calls % 64) != 0) return;
  std::string what;
  try {
    what = check_locked();
  } catch (...) {
    return;  // no host memory to check with
  }
  if (!what.empty()) {
    std::fprintf(stderr, "vibespatial-raster: %s (after %s)\n", what.c_str(), where);
    std::abort();
  }
#endif
}

void VmmPool::teardown() noexcept {
  std::lock_guard lock(mutex_);
  if (torn_down_) return;
  torn_down_ = true;
  g_live_epoch[static_cast<std::size_t>(device_)].store(0, std::memory_order_release);
  const DriverState& ds = driver_state();
  if (!ds.available) return;
  const DriverApi& api = ds.api;
  try {
    ScopedDeviceContext scope(device_);
    api.cuCtxSynchronize();  // whatever freed small blocks is done before their pages go
    for (Batch* b : batches_) delete b;
    batches_.clear();
    unmarked_.clear();
    forget_log_.clear();
    for (auto& [addr, range] : free_by_addr_) {
      for (const MarkRef& m : range.marks) {
        if (m && !m->complete) api.cuEventSynchronize(m->event);
      }
    }
    for (ClassState& state : classes_) {
      state.unowned.clear();
      state.unowned_bump.clear();
      for (Slab* slab : state.slabs) delete slab;
      state.slabs.clear();
    }
    open_pages_.clear();
    free_by_addr_.clear();
    free_by_size_.clear();
    live_large_.clear();
    const int n = region_count_.load();
    for (int i = 0; i < n; ++i) {
      Region& r = regions_[static_cast<std::size_t>(i)];
      for (std::unique_ptr<SmallPage>& page : r.page_recs) {
        if (!page) continue;
        if (api.cuMemUnmap(r.base + page->index * page_, page_) == CUDA_SUCCESS) --pages_mapped_;
        api.cuMemRelease(page->handle);
        page.reset();
      }
      for (std::size_t p = 0; p < r.handles.size(); ++p) {
        if (r.handles[p] == 0) continue;
        api.cuMemUnmap(r.base + p * page_, page_);
        api.cuMemRelease(r.handles[p]);
        r.handles[p] = 0;
      }
      if (r.size != 0) api.cuMemAddressFree(r.base, r.size);
    }
    for (const StuckMapping& m : stuck_) {
      if (api.cuMemUnmap(m.addr, m.handles.size() * page_) == CUDA_SUCCESS) {
        pages_mapped_ -= m.handles.size();
      }
      for (CUmemGenericAllocationHandle h : m.handles) api.cuMemRelease(h);
    }
    stuck_.clear();
    for (CUmemGenericAllocationHandle h : spare_) api.cuMemRelease(h);
    spare_.clear();
    marks_.destroy_all();
  } catch (...) {
    // Teardown is best effort: a failing driver leaves nothing further to do.
  }
  region_count_.store(0);
  retired_slab_arrays_.clear();
  caches_.clear();
  pages_held_ = pages_mapped_ = reserved_bytes_ = large_live_pages_ = slab_count_ = 0;
  small_pages_ = 0;
}

}  // namespace

std::string vmm_self_test(int device) {
  const DriverApi& api = driver();
  ScopedDeviceContext scope(device);
  {
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    auto failed = [](const char* call, CUresult r) {
      return std::string(call) + " returned " + cu_result_name(r);
    };
    std::size_t page = 0;
    CUresult r = api.cuMemGetAllocationGranularity(&page, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (r != CUDA_SUCCESS) return failed("cuMemGetAllocationGranularity", r);
    if (page == 0) return "cuMemGetAllocationGranularity reported 0 bytes";
    CUdeviceptr base = 0;
    r = api.cuMemAddressReserve(&base, page, page, 0, 0);
    if (r != CUDA_SUCCESS) return failed("cuMemAddressReserve", r);
    // The cleanup calls are retried once: a transient failure must not leak the page or the
    // reservation (the pool itself retries them likewise).
    auto free_address = [&] {
      if (api.cuMemAddressFree(base, page) != CUDA_SUCCESS) api.cuMemAddressFree(base, page);
    };
    CUmemGenericAllocationHandle handle = 0;
    r = api.cuMemCreate(&handle, page, &prop, 0);
    if (r != CUDA_SUCCESS) {
      free_address();
      // A device with no page left proves nothing about VMM: the pool reports the OOM itself.
      return r == CUDA_ERROR_OUT_OF_MEMORY ? std::string() : failed("cuMemCreate", r);
    }
    std::string result;
    r = api.cuMemMap(base, page, 0, handle, 0);
    if (r != CUDA_SUCCESS) {
      result = failed("cuMemMap", r);
    } else {
      CUmemAccessDesc access = {};
      access.location = prop.location;
      access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      r = api.cuMemSetAccess(base, page, &access, 1);
      if (r != CUDA_SUCCESS) result = failed("cuMemSetAccess", r);
      if (api.cuMemUnmap(base, page) != CUDA_SUCCESS &&
          api.cuMemUnmap(base, page) != CUDA_SUCCESS && result.empty()) {
        result = "cuMemUnmap failed";
      }
    }
    // Released exactly once (§7 #5): a sticky error (7xx) may come from a release that worked.
    if (const CUresult rr = api.cuMemRelease(handle);
        rr != CUDA_SUCCESS && (rr < 700 || rr > 799)) {
      api.cuMemRelease(handle);
    }
    free_address();
    return result;
  }
}

std::unique_ptr<DevicePool> make_vmm_pool(int device) {
  if (device < 0 || device >= kMaxDevices) {
    throw std::out_of_range("device ordinal out of range for the pool");
  }
  return std::make_unique<VmmPool>(device);
}

}  // namespace vibespatial::raster::detail
