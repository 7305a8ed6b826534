// SPDX-License-Identifier: Apache-2.0
// Tiers A and B: the pool on cuMemAddressReserve / cuMemCreate / cuMemMap / cuMemSetAccess.
//
// Physical memory is held as pages (the granularity, or the recommended granularity where that is
// a multiple of it), each of one cuMemCreate handle of its own or of a multi-page handle.
// Because a single page is mapped on its own, any free one can be unmapped and mapped again
// elsewhere: a large request is served by gathering free pages into a fresh contiguous range, so
// it never fails for lack of a contiguous free range while enough physical memory is free (the
// failure that stranded 19.9 GiB in the Python original, which asked the driver for one
// contiguous allocation per block). Growth by a long run of new large pages is one multi-page
// handle (vmm_multi.cpp), since cuMemCreate costs 193 us a call on an A100 (one per 2 MiB page
// grows a pool at about 10 GB/s): the driver maps and unmaps a handle only whole, so its pages
// stay where they were made, reused in place, and the handle is unmapped and released once all
// of them are free (trim), or when a full device needs their memory as single pages elsewhere.
//
// Address space: small regions hold small pages; large regions hold large blocks (whole pages).
// They never mix. A small page is split into 32 KiB spans (a 64th of larger pages); a slab is a
// run of spans of one page, cut into equal slots of one size class (about 4 slots up to 8 KiB,
// 16 above, at most 1/64 wasted after the last slot), so slabs of every class and thread share
// pages, and an empty slab's spans go back to its page without a driver call. A page with no slab
// is unmapped under pressure (a large request, trim). Reservations are sized to fit an address
// space that may be scarce (§3.4.2: a real driver can refuse large reservations): a large region
// of about the device's memory, small regions of a sixteenth of it, added as needed; a refused
// reservation is retried after giving back the address space of empty regions, then smaller,
// halving down to what the request needs. The window search of a large request stops at the
// highest page ever mapped in a region, so its cost follows what was mapped, not the region's
// size.
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
// freed slots, then claims a slab nobody owns, then takes never-used slots of its bump slab of the
// class (or of one nobody bumps from), then makes a new slab. A thread's bump slabs hold at most a
// page's spans together; over that it gives up its largest to the class's unowned_bump list. Only
// a full device lets a thread take free slots of another thread's slabs, then its bump slab.
// Threads thus write disjoint cache lines of the per-slot records
// even after blocks went back to the pool. Driver rules followed (docs/cuda-driver-rules.md):
// map whole handles at offset 0 (§3.4.6), set access once per contiguous newly mapped run (§3.4.8,
// §7 #3), unmap only whole mappings inside one reservation (§3.4.7), release handles exactly once
// (§7 #5), and unmap only memory whose freeing stream work has completed (§7 #2).
#include "common/expects.hpp"
#include "memory/vmm_pool_impl.hpp"

#include <optional>

namespace vibespatial::raster::detail::vmm {

std::array<std::atomic<std::uint64_t>, kMaxDevices> g_live_epoch{};

namespace {
std::atomic<std::uint64_t> g_next_epoch{1};

// VSR_POOL_MULTI_PAGE_MIN: the fewest new large pages in one run that get one multi-page handle
// (a decimal count; 0: one handle per page, as the pool grew before). Unset: 128 MiB of pages.
std::size_t multi_page_min(std::size_t page) {
  const char* v = std::getenv("VSR_POOL_MULTI_PAGE_MIN");
  if (v == nullptr) return std::max<std::size_t>(2, (std::size_t{128} << 20) / page);
  const std::string text(v);
  if (text.empty() || text.size() > 9 ||
      text.find_first_not_of("0123456789") != std::string::npos) {
    std::string shown;
    for (const char c : text.substr(0, 40)) shown += (c >= ' ' && c <= '~') ? c : '?';
    throw std::invalid_argument("configure_memory_pool: VSR_POOL_MULTI_PAGE_MIN=\"" + shown +
                                "\" is not a page count: set a decimal number of pages (0: one "
                                "handle per page) or leave it unset");
  }
  return static_cast<std::size_t>(std::stoul(text));
}
}  // namespace

VmmPool::VmmPool(int device, double reserve)
    : DevicePool(device), reserve_(reserve), marks_(device) {
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
  span_shift_ = std::min(std::countr_zero(page_),
                         std::max(15, static_cast<int>(std::bit_width((page_ + 63) / 64 - 1))));
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
  multi_min_pages_ = multi_page_min(page_);
  epoch_ = g_next_epoch.fetch_add(1);
  g_live_epoch[static_cast<std::size_t>(device)].store(epoch_, std::memory_order_release);
}

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
  deallocate_small(slab, ptr, bytes, stream);
}

BlockAt VmmPool::block_at(const void* ptr) const {
  const auto p = reinterpret_cast<CUdeviceptr>(ptr);
  std::lock_guard lock(mutex_);
  const int region = region_of(p);
  if (region < 0) return {};
  const BlockAt not_live{BlockAt::Kind::not_live};
  if (regions_[static_cast<std::size_t>(region)].small) {
    const Slab* slab = slab_of(p);
    if (slab == nullptr) return not_live;
    const std::size_t slot = slab->slot_of(p);
    if (slot >= slab->carved) return not_live;  // never handed out, or past the last slot
    const std::uint32_t requested =
        const_cast<SlotRecords&>(slab->requested)[slot].load(std::memory_order_acquire);
    if (requested == 0) return not_live;  // free, or in a thread's cache
    return {BlockAt::Kind::live, slab->base + slot * slab->slot_size, requested};
  }
  auto it = live_large_.upper_bound(p);
  if (it == live_large_.begin()) return not_live;
  --it;
  if (p - it->first >= it->second.pages * page_) return not_live;
  return {BlockAt::Kind::live, it->first, it->second.bytes};
}

void VmmPool::trim() {
  ThreadCache& cache = thread_cache();
  std::lock_guard lock(mutex_);
  note_locked();
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
  // Pages of a multi-page handle with a live page elsewhere stay mapped (unmap_free_range).
  for (auto it = free_by_addr_.begin(); it != free_by_addr_.end();) {
    try {
      for (const MarkRef& m : it->second.marks) marks_.wait(m);
      it->second.marks.clear();
    } catch (const CudaError& e) {
      if (!first_error) first_error = e;
      ++it;
      continue;
    }
    if (const CUresult r = unmap_free_range(it); r != CUDA_SUCCESS && !first_error) {
      first_error = CudaError(r, cu_result_name(r), "cuMemUnmap failed in free_pool_memory");
    }
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
  const std::size_t held_before = pages_held_;
  for (CUmemGenericAllocationHandle h : spare_) {
    const CUresult r = api.cuMemRelease(h);
    if (vmm_call_took_effect(r)) {
      --pages_held_;  // released, even when a sticky error came back (never released twice)
      note_pages(MemoryAction::page_release, 0, 1);
    } else {
      kept.push_back(h);
    }
    if (r != CUDA_SUCCESS && !first_error) {
      first_error = CudaError(r, cu_result_name(r), "cuMemRelease failed in free_pool_memory");
    }
  }
  spare_ = std::move(kept);
  for (std::size_t i = 0; i < unreleased_multi_.size();) {
    const MultiPageHandle m = unreleased_multi_[i];
    const CUresult r = api.cuMemRelease(m.handle);
    if (r != CUDA_SUCCESS && !first_error) {
      first_error = CudaError(r, cu_result_name(r), "cuMemRelease failed in free_pool_memory");
    }
    if (!vmm_call_took_effect(r)) {
      ++i;
      continue;
    }
    pages_held_ -= m.pages;
    note_pages(MemoryAction::page_release, 0, m.pages);
    unreleased_multi_.erase(unreleased_multi_.begin() + static_cast<std::ptrdiff_t>(i));
  }
  large_peak_pages_ = large_live_pages_;  // the slack grows again from what is live
  note_pages(MemoryAction::trim, 0, held_before - pages_held_);
  debug_check("trim");
  if (first_error) throw *first_error;
}

void VmmPool::forget(CUstream stream) {
  if (stream == CU_STREAM_LEGACY) stream = nullptr;
  if (stream == nullptr) return;  // the legacy stream lives as long as the context
  ThreadCache& cache = thread_cache();
  std::lock_guard lock(mutex_);
  note_locked();
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
  const auto busy = static_cast<std::size_t>(std::unique(busy_pages.begin(), busy_pages.end()) -
                                             busy_pages.begin());
  s.pool_free_bytes = (pages_held_ - large_live_pages_ - busy) * page_;
  s.largest_free_block = free_by_size_.empty() ? 0 : std::prev(free_by_size_.end())->first * page_;
  s.granularity = page_;
  s.small_block_limit = small_limit_;
}

std::string VmmPool::describe() const {
  MemoryPoolStats s;
  fill_stats(s);
  // What the held memory is: live blocks, free large pages (slack: free ranges and spare pages),
  // free small-block slots (free or cached slots of slabs, and spans no slab holds).
  std::size_t free_large = 0, small_bytes = 0, small_live = 0;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [addr, range] : free_by_addr_) free_large += range.pages * page_;
    free_large += spare_.size() * page_;
    small_bytes = small_pages_ * page_;
    for (const ClassState& state : classes_) {
      for (const Slab* slab : state.slabs) {
        auto& records = const_cast<SlotRecords&>(slab->requested);
        for (std::uint32_t i = 0; i < slab->carved; ++i) {
          if (records[i].load(std::memory_order_relaxed) != 0) small_live += slab->slot_size;
        }
      }
    }
  }
  return "the pool holds " + format_bytes(*s.pool_size) +
         " of physical memory: " + format_bytes(*s.current_bytes) + " live in " +
         std::to_string(*s.current_count) + " blocks, " + format_bytes(free_large) +
         " as free large pages (slack), " +
         format_bytes(small_bytes - std::min(small_bytes, small_live)) +
         " in free small-block slots; the largest request it could serve without new memory is " +
         format_bytes(s.largest_free_block) + "; " + format_bytes(s.reserved_bytes) +
         " of address space reserved";
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
      for (auto m = multi_.lower_bound(r.base); m != multi_.end() && m->first < r.base + r.size;
           m = multi_.erase(m)) {
        const std::size_t at = (m->first - r.base) / page_;
        api.cuMemUnmap(m->first, m->second.pages * page_);
        api.cuMemRelease(m->second.handle);
        std::fill_n(r.handles.begin() + static_cast<std::ptrdiff_t>(at), m->second.pages,
                    CUmemGenericAllocationHandle{0});
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
      if (api.cuMemUnmap(m.addr, m.pages * page_) == CUDA_SUCCESS) pages_mapped_ -= m.pages;
      for (CUmemGenericAllocationHandle h : m.handles) api.cuMemRelease(h);
    }
    stuck_.clear();
    for (CUmemGenericAllocationHandle h : spare_) api.cuMemRelease(h);
    spare_.clear();
    for (const MultiPageHandle& m : unreleased_multi_) api.cuMemRelease(m.handle);
    unreleased_multi_.clear();
    multi_.clear();
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

}  // namespace vibespatial::raster::detail::vmm

namespace vibespatial::raster::detail {

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
    if (const CUresult rr = api.cuMemRelease(handle); !vmm::vmm_call_took_effect(rr)) {
      api.cuMemRelease(handle);
    }
    free_address();
    return result;
  }
}

std::unique_ptr<DevicePool> make_vmm_pool(int device, double reserve) {
  if (device < 0 || device >= kMaxDevices) {
    throw std::out_of_range("device ordinal out of range for the pool");
  }
  VSR_EXPECTS(reserve <= 1, "make_vmm_pool: reserve must be in [0, 1], or negative (adaptive)");
  return std::make_unique<vmm::VmmPool>(device, reserve);
}

}  // namespace vibespatial::raster::detail
