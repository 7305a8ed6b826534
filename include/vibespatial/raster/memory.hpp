// SPDX-License-Identifier: Apache-2.0
// The device memory pool: tiers A/B/C/fallback on the CUDA driver API (docs/memory-pool.md).
//
// Glossary
//   granule      the driver's minimum VMM allocation granularity G (2 MiB on NVIDIA GPUs).
//   page         one physical allocation (cuMemCreate handle) of exactly one granule. Every
//                physical byte the pool holds is a page, so any free page can be remapped
//                anywhere: free memory never strands for lack of a contiguous range.
//   small block  a request of at most `small_block_limit` bytes, a slot of a slab: a run of a
//                page's 64 spans cut into equal slots of one size class, so that slabs of every
//                class and thread share pages. A live small block pins only its slab's page.
//   large block  a larger request, rounded up to whole pages and mapped contiguously in the
//                pool's reserved address space; its pages are its own.
//   mark         an event recorded on the stream that freed memory: the memory may be reused on
//                that stream at once, and on another stream once the event has completed.
//
// Tiers (chosen once per process by configure_memory_pool(), first match wins):
//   C         VIBESPATIAL_GPU_MANAGED_MEMORY true: bare cuMemAllocManaged per request; no pooling.
//   A         VIBESPATIAL_GPU_POOL_ONLY true: the VMM pool with no OOM recovery: when the device
//             is full the request fails at once with OutOfMemoryError.
//   B         default where the device supports virtual memory management: the VMM pool plus a
//             bounded recovery chain on OOM (give every free page back and retry; then rounds of
//             handlers, giving free pages back and retrying).
//   fallback  devices without VMM: a caching pool over cuMemAlloc, sizes rounded to 512 bytes.
// "Supports VMM" means the device says so and a one-page self-test of the VMM calls passes when
// the pool is configured (some sandboxed drivers claim support and then fail them);
// MemoryPoolStats::tier_reason says why a device has its tier.
// Both variables take 1/true/yes/on or 0/false/no/off (any case), or are unset (off); any other
// value, the empty string included, makes configuration fail (std::invalid_argument). Both true:
// tier C, with a one-line warning on stderr.
// VIBESPATIAL_GPU_POOL_RESERVE (tiers A/B): the slack. A large request that no free range fits
// is served by remapping pages into a new window (map, unmap and set-access calls, each a kernel
// call on a real driver); while the pool holds less than the peak of live large pages plus the
// slack, it creates new pages instead, and a steady mix of sizes then settles into free ranges
// that fit and maps nothing. Unset or "auto" (the default): adaptive, up to a tenth of the peak
// of live large pages while the device has room, never more than half the device's free pages,
// so none on a full device. A decimal fraction from 0 to 1 fixes it: 0 holds about the peak of
// live pages (always tight), 0.1 up to 10% more. Either way a full device ends the slack: a
// request takes idle free pages (waiting for freeing work if it must) before it fails, and the
// recovery chain gives every free page back before any OOM handler runs (docs/memory-pool.md).
//
// One pool per device; an allocation uses the pool of the device of the calling thread's current
// context, and binds device 0's primary context to a thread that has none (it stays bound, so the
// block is usable with the driver on that thread at once). In a process with several devices
// that costs one context query per allocation; with one device, one on a thread's first
// allocation only (a context the thread unbinds later is not bound again).
// All functions are thread-safe. Memory is valid in the device's primary context, so Thrust, CUB
// and user kernels can use it directly. The VMM pool reserves about the device's memory of
// virtual address space for large blocks and a sixteenth of it per region of small blocks, and
// works where address space is scarce (1.5 x device memory): a refused reservation is retried
// after giving back empty regions, then smaller.
//
// Streams. device_allocate and device_deallocate take the stream the block is used on; the pool
// keeps blocks in stream order without synchronising the device:
//   - A block freed on stream S may be handed out again at once for S (work queued later on S
//     runs after the work that used it).
//   - For another stream it is handed out only once a *mark* covering the free has completed: an
//     event recorded on S after the free, never by naming S later. Large blocks (and every block
//     of the fallback tier and tier C) record the mark when freed. Small blocks are freed with no
//     driver call; their mark is recorded by a later call on S that takes the pool's slow path
//     (an allocation on S that misses the thread's cache, a free on S that fills it), or by
//     forget_stream(S).
//   - Rather than taking new memory from the driver (or running the OOM chain), a request reuses
//     a block freed on another stream whose mark is still pending by making its own stream wait
//     for the mark (cuStreamWaitEvent): the request's later work is then ordered after the free.
//   - Blocks whose stream was never named again (no mark) become reusable everywhere in
//     free_pool_memory() (and so in tier B's OOM chain), which synchronises the context.
//   - The pool calls the driver with a stream only while a call that passed that stream runs, or
//     through the event of a mark recorded then; the legacy stream it may name at any time.
//   - NULL and CU_STREAM_LEGACY are one stream, the context's legacy stream. CU_STREAM_PER_THREAD
//     is a different stream on each thread: a block freed on thread A's per-thread stream is not
//     "the same stream" for thread B, and its mark is recorded by thread A (when A exits, by a
//     mark on the legacy stream, which waits for the per-thread streams' earlier work). The
//     _ptds/_ptsz meaning of NULL is not used: NULL is always the legacy stream.
//   - Stream handles are recycled by the driver (RMM #649): a stream created after another was
//     destroyed may have the same handle value. Call forget_stream(S) before destroying a stream S
//     on which you freed pool memory. A stream destroyed without it is harmless as long as no new
//     stream gets its handle value; if one does, blocks freed on the old stream may be handed to
//     the new one as "the same stream" while the old stream's work still uses them.
//
// fork(): CUDA cannot be used in a child process after fork() without exec(). In a child forked
// from a process that had used the pool (configured it or registered a handler), every function
// here throws DriverUnavailableError (CUDA_ERROR_NOT_INITIALIZED) at once, without touching a
// lock another thread of the parent may have held, except memory_pool_stats(), which returns an
// empty snapshot (tier "", configured false). Blocks inherited from the parent cannot be used or
// freed in the child; the parent's pool is unaffected.
#pragma once

#include <vibespatial/raster/export.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

// CUstream, exactly as <cuda.h> declares it, so this header needs no CUDA headers.
typedef struct CUstream_st* CUstream;  // NOLINT(modernize-use-using)

namespace vibespatial::raster {

/// Live memory of one owner tag (record_memory_history, memory_history.hpp).
struct OwnerUsage {
  std::string owner;
  std::size_t live_bytes = 0;  ///< requested bytes
  std::size_t live_count = 0;
};

/// A snapshot of one device's pool. Keys of the seed are kept: `current_*`, `peak_*`, `total_*`
/// and `pool_size` for tiers A/B/C (pool_size: A/B only); `used_bytes`, `free_bytes` and
/// `total_bytes` (= used + free) for the fallback tier. Byte counts of live memory are the sizes
/// requested, not the rounded sizes.
///
/// Peaks are exact when one thread at a time uses the pool; with concurrent threads they may
/// over-report by at most what each thread allocated since its last exchange with the shared
/// pool (at most 4 MiB or 64 requests per thread).
struct MemoryPoolStats {
  std::string tier;  ///< "A", "B", "C", "fallback", or "" before configuration (and when
                     ///< no_such_device, or in a forked child)
  /// Why this device has its tier, in words: the variable that chose it, or that the device
  /// supports VMM, or why it does not (e.g. "device 0 claims virtual memory management support,
  /// but its VMM self-test failed (cuMemMap returned CUDA_ERROR_NOT_SUPPORTED): a caching pool
  /// over cuMemAlloc (fallback)"). Empty when `tier` is, and for a device of a configured process
  /// that has not allocated yet (except the device configured).
  std::string tier_reason;
  bool configured = false;  ///< configure_memory_pool() has succeeded
  int device = 0;           ///< the device this snapshot describes
  /// memory_pool_stats(device) was asked about a device this process does not have: a negative
  /// ordinal, one of 64 or more, or, once the pool is configured (the driver then knows its
  /// devices), one not below the driver's device count. The rest of the snapshot is then empty
  /// (tier "", configured false).
  bool no_such_device = false;
  // tiers A/B/C
  std::optional<std::size_t> current_bytes, current_count, peak_bytes, peak_count, total_bytes,
      total_count;
  std::optional<std::size_t> pool_size;  ///< A/B: physical bytes the pool holds (pages)
  // fallback
  std::optional<std::size_t> used_bytes, free_bytes;
  // additions
  std::size_t mapped_bytes = 0;        ///< A/B: physical bytes mapped into the address space
  std::size_t reserved_bytes = 0;      ///< A/B: virtual address space reserved
  std::size_t pool_free_bytes = 0;     ///< physical bytes held with no live data: what
                                       ///< free_pool_memory() would give back (all tiers but C)
  std::size_t largest_free_block = 0;  ///< A/B: the largest request servable without new memory
  std::size_t oom_recoveries = 0;      ///< B: requests that succeeded only after the OOM chain
  std::size_t granularity = 0;         ///< A/B: the page size in bytes
  std::size_t small_block_limit = 0;   ///< A/B: requests up to this size are small blocks
  /// Live bytes and counts per owner tag (memory_history.hpp), largest first: the blocks
  /// allocated on this device while recording was on and not freed since. Empty when nothing
  /// was recorded.
  std::vector<OwnerUsage> owners;
};

/// Configures the pool once per process and returns the tier ("A", "B", "C" or "fallback").
/// Idempotent and thread-safe: later calls return the tier chosen first. Called lazily by
/// device_allocate().
/// @throws std::invalid_argument when VIBESPATIAL_GPU_MANAGED_MEMORY or VIBESPATIAL_GPU_POOL_ONLY
///         holds a value that is not a boolean, or VIBESPATIAL_GPU_POOL_RESERVE one that is not a
///         decimal fraction from 0 to 1 (the message names the variable and its value,
///         non-printable bytes as \xHH); DriverUnavailableError when there is no usable driver or
///         device, or in a forked child; CudaError (CUDA_ERROR_NOT_SUPPORTED) when the requested
///         tier is impossible, e.g. VIBESPATIAL_GPU_MANAGED_MEMORY=1 on a device without managed
///         memory. After any of these nothing is cached: a later call tries again.
VSR_EXPORT std::string configure_memory_pool();

/// Gives unused physical memory back to the driver, on every device's pool: unmaps and releases
/// every free page (waiting for the stream work that freed it, event by event), empty slabs
/// included, also blocks that other threads freed and still hold in their thread caches. Small
/// blocks freed on a stream that has no mark yet (see "Streams") are waited for with one
/// cuCtxSynchronize, which also waits for the work of streams destroyed since; afterwards they
/// are reusable on any stream. Live blocks stay where they are, with their contents; safe to call
/// with live allocations. Tier C: releases the blocks whose free waits for their stream's work,
/// after it. Fallback: frees every cached block. No-op before configuration.
/// @throws CudaError if the driver fails; the pool stays consistent and usable, and what could
///         not be given back (e.g. a page whose unmap failed) is tried again by the next call.
/// @throws DriverUnavailableError in a forked child.
VSR_EXPORT void free_pool_memory();

/// Statistics of the pool of the current thread's device. Never throws and never blocks on a
/// lock a forked child inherited; works before configuration (tier "", configured false). In a
/// forked child: an empty snapshot (tier "", configured false, device 0).
VSR_EXPORT MemoryPoolStats memory_pool_stats() noexcept;
/// Statistics of the pool of `device`. Never throws. For a device the process does not have,
/// no_such_device is true and the snapshot is otherwise empty; in a forked child, an empty
/// snapshot (tier "", configured false). Makes no driver call.
VSR_EXPORT MemoryPoolStats memory_pool_stats(int device) noexcept;

/// Allocates `bytes` of device memory, usable in stream order on `stream` (nullptr: the legacy
/// default stream). Configures the pool on first use. Alignment: 256 bytes at least; large
/// blocks are granule-aligned. `bytes == 0` returns nullptr.
/// Fast path: a cached small block freed by this thread on the same stream is returned with no
/// lock and no driver call. Otherwise a block freed on another stream may be returned with
/// `stream` made to wait for that stream's mark (cuStreamWaitEvent) rather than new memory taken
/// (see "Streams"); `stream` must be alive.
/// @throws OutOfMemoryError (a std::bad_alloc) when the request cannot be satisfied (tier B after
///         its recovery chain; at once when called from inside an OOM handler); its message says
///         what was asked for and what the pool held.
/// @throws DriverUnavailableError / CudaError on driver failures; DriverUnavailableError in a
///         forked child; std::invalid_argument from the lazy configuration (a tier variable that
///         is not a boolean).
VSR_EXPORT void* device_allocate(std::size_t bytes, CUstream stream = nullptr);

/// Frees a block from device_allocate. `bytes` must be the size it was allocated with. The block
/// may be reused at once on `stream`, and on other streams once a mark of `stream` recorded at or
/// after this call has completed, or behind a wait for that mark (see "Streams" above; an event,
/// queried; never a device-wide synchronisation). `stream` must be alive: its work so far is
/// what may still use the block. `device_deallocate(nullptr, 0)` is a no-op (outside a forked
/// child).
/// Small blocks of tiers A/B are freed with no driver call (a free that fills the thread's cache
/// may record a mark of `stream`; a failure there is not an error). Large blocks, and every block
/// of the fallback tier and tier C, record a mark of `stream` (a context query, then a stream
/// query and an event, or a synchronisation of `stream` when no event can be recorded); tier C
/// then calls cuMemFree once the mark has completed (at once if `stream` was idle, else in a
/// later call of the pool).
/// @throws std::invalid_argument, changing nothing, when `ptr` was not handed out by the pool,
///         was already freed, or `bytes` differs from the allocation's size.
/// @throws CudaError, changing nothing, when one of those driver calls fails: the block is still
///         live, with its contents, and a later call with the same arguments frees it.
/// @throws DriverUnavailableError in a forked child.
VSR_EXPORT void device_deallocate(void* ptr, std::size_t bytes, CUstream stream = nullptr);

/// Checks that the `bytes` bytes at `ptr` are device memory that may be read and written whole,
/// before anything copies or reads them (every entry point of the library that takes a caller's
/// device pointer and a size asks it first: vsr_memcpy, Python's from_device and its CUDA array
/// interface and DLPack imports):
///   - a pointer into the pool's memory must lie in a live block, and the range within that
///     block's requested bytes: the pool knows its blocks exactly, where the driver sees only its
///     mappings (a page, or a whole reservation of VMM memory, far larger than a block);
///   - any other pointer must lie in an allocation the driver reports for the calling thread's
///     current context (cuMemGetAddressRange; device 0's primary context is bound to a thread
///     that has none), and the range within it. Another library's memory is thereby checked as
///     finely as the driver knows it: a suballocating pool's (CuPy's, RMM's) whole driver
///     allocation, a VMM allocator's (PyTorch's expandable segments) whole reservation, mapped or
///     not.
/// Nothing is checked (and nothing called) for `bytes == 0`. `what` starts the message (the
/// public call's name). Thread-safe; takes a pool's lock for a pointer into its memory.
/// @throws std::invalid_argument for a null `ptr`, a range that wraps around the address space,
///         memory that is neither (the driver knows no allocation there: host memory, freed
///         memory, another context's), a pointer into the pool's memory that is in no live block
///         (freed, or never handed out), or a range past the end of its block or allocation; the
///         message says how many bytes were asked for and what the block or allocation holds.
/// @throws DriverUnavailableError without a usable driver, or in a forked child; CudaError for
///         another failure of the driver's query.
VSR_EXPORT void check_device_range(const void* ptr, std::size_t bytes, std::string_view what);

/// Tells the pool that `stream` is about to be destroyed: call it after the last device_deallocate
/// on `stream` and before cuStreamDestroy, while the stream is still alive. CUDA recycles stream
/// handles (docs/cuda-driver-rules.md §3.7), and the pool would otherwise treat a new stream with
/// the same handle as the old one, handing it blocks the old stream's work may still use. It
/// records one mark on `stream` in every device's pool (a stream query, and an event if the stream
/// is busy); every block and free range freed on `stream`, in every thread's cache too, stops being
/// "the same stream" for its handle value and becomes reusable on any stream once that mark
/// completes (or behind a wait for it). Other threads apply it to their caches on their next
/// allocation or free (a cheap check of a counter on the fast path). NULL and CU_STREAM_LEGACY: a
/// no-op (the legacy stream lives as long as the context); CU_STREAM_PER_THREAD: the calling
/// thread's per-thread stream. A no-op before configuration. Thread-safe; may be called again.
/// @throws CudaError when no mark can be recorded on `stream` (e.g. it was already destroyed);
///         the pools that could not record one are unchanged, so a later call may retry.
/// @throws DriverUnavailableError in a forked child.
VSR_EXPORT void forget_stream(CUstream stream);

/// An OOM handler: called with the size of a request the device cannot satisfy (tier B); returns
/// true if it freed something (through device_deallocate: the pool holds none of its locks while
/// handlers run). May be called from any thread that allocates. A handler may call any function
/// here; but the recovery chain never runs inside itself: an allocation a handler makes (on the
/// thread that runs it) that finds the device full throws OutOfMemoryError at once.
using OomHandler = std::function<bool(std::size_t requested_bytes)>;

/// Registers an OOM handler; returns its id (never 0). Thread-safe.
/// @throws std::invalid_argument if `handler` is empty; DriverUnavailableError in a forked child.
VSR_EXPORT std::uint64_t add_oom_handler(OomHandler handler);

/// Unregisters a handler. Unknown ids are ignored. A handler running concurrently may complete.
/// @throws DriverUnavailableError in a forked child.
VSR_EXPORT void remove_oom_handler(std::uint64_t id);

}  // namespace vibespatial::raster
