// SPDX-License-Identifier: Apache-2.0
// Small blocks of the VMM pool: their allocation and free, per-thread caches (the lock-free fast
// path), slabs on runs of spans of shared pages, bump slabs and their per-thread budget, the
// shared free lists.
#include "common/expects.hpp"
#include "memory/vmm_pool_impl.hpp"

namespace vibespatial::raster::detail::vmm {

struct ThreadCacheSet {
  std::array<std::unique_ptr<ThreadCache>, kMaxDevices> caches;
  ~ThreadCacheSet();
};
thread_local ThreadCacheSet t_caches;

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

ThreadCache& VmmPool::thread_cache() {
  auto& slot = t_caches.caches[static_cast<std::size_t>(device_)];
  if (!slot || slot->epoch != epoch_) {
    slot = std::make_unique<ThreadCache>();  // a stale cache's pool is gone: drop it
    slot->pool = this;
    slot->epoch = epoch_;
    slot->per_thread_key = per_thread_stream_key();
    slot->history_id = history::thread_id();
    slot->history_state = &history::thread_state();
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
    const std::size_t slot = e.slab->slot_of(reinterpret_cast<CUdeviceptr>(e.ptr));
    if (history::on()) [[unlikely]]
      note_small_alloc(cache, *e.slab, slot, e.ptr, bytes, stream);
    e.slab->requested[slot].store(static_cast<std::uint32_t>(bytes), std::memory_order_release);
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

void VmmPool::release_slot(Slab* slab, std::size_t slot, const void* ptr, std::size_t bytes) {
  std::uint32_t expected = static_cast<std::uint32_t>(bytes);
  const bool fits = bytes != 0 && bytes <= small_limit_;
  if (!fits) expected = slab->requested[slot].load(std::memory_order_acquire);
  if (!fits ||
      !slab->requested[slot].compare_exchange_strong(expected, 0, std::memory_order_acq_rel)) {
    const std::size_t allocated = expected;
    expect_live_block(ptr, expected == 0 ? nullptr : &allocated, bytes);
  }
}

void VmmPool::deallocate_small(Slab* slab, void* ptr, std::size_t bytes, CUstream stream) {
  const auto p = reinterpret_cast<CUdeviceptr>(ptr);
  const std::size_t slot = slab->slot_of(p);
  VSR_EXPECTS(p == slab->base + slot * slab->slot_size && slot < slab->slot_count,
              "device_deallocate: pointer is inside a small block, not at its start");
  ThreadCache& cache = thread_cache();
  if (history::on()) [[unlikely]]
    return deallocate_small_recorded(cache, slab, slot, ptr, bytes, stream);
  release_slot(slab, slot, ptr, bytes);
  Bin& bin = cache.bins[static_cast<std::size_t>(slab->size_class)];
  // Into the thread's cache bin with no lock and no driver call, or under the mutex when the bin
  // is full or being drained.
  if (enter_fast_path(cache)) [[likely]] {
    if (bin.count < kBinCapacity) [[likely]] {
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
    note_locked();
    free_into_bin_locked(cache, slab, ptr, bytes, stream);
  } catch (...) {
    slab->requested[slot].store(static_cast<std::uint32_t>(bytes),
                                std::memory_order_release);  // changes nothing
    throw;
  }
}

void VmmPool::free_into_bin_locked(ThreadCache& cache, Slab* slab, void* ptr, std::size_t bytes,
                                   CUstream stream) noexcept {
  Bin& bin = cache.bins[static_cast<std::size_t>(slab->size_class)];
  sync_forgotten(cache);
  const bool flushed = bin.count == kBinCapacity;
  if (flushed) flush_bin(cache, slab->size_class, kBinCapacity / 2);
  bin.entries[static_cast<std::size_t>(bin.count++)] = {ptr, stream, slab};
  cache.add(-static_cast<std::int64_t>(bytes), -1);
  if (flushed) mark_pending(stream, key_in(cache, stream));  // a call on `stream`
}

void VmmPool::deallocate_small_recorded(ThreadCache& cache, Slab* slab, std::size_t slot, void* ptr,
                                        std::size_t bytes, CUstream stream) {
  const auto p = reinterpret_cast<CUdeviceptr>(ptr);
  // The free's time stamp before the block can be reused; its events once it is free, before
  // the window closes.
  const auto record = [&](std::uint64_t t) {
    history::record_free(*cache.history_state, device_, p, bytes,
                         reinterpret_cast<std::uintptr_t>(stream), t);
  };
  Bin& bin = cache.bins[static_cast<std::size_t>(slab->size_class)];
  if (enter_fast_path(cache)) [[likely]] {
    if (bin.count < kBinCapacity) [[likely]] {
      try {
        release_slot(slab, slot, ptr, bytes);
      } catch (...) {
        leave_fast_path(cache);
        throw;
      }
      const std::uint64_t t =
          history::free_time(slab->owners[slot].load(std::memory_order_relaxed), cache.history_id);
      bin.entries[static_cast<std::size_t>(bin.count++)] = {ptr, stream, slab};
      cache.add(-static_cast<std::int64_t>(bytes), -1);
      record(t);
      leave_fast_path(cache);
      return;
    }
    leave_fast_path(cache);
  }
  std::lock_guard lock(mutex_);
  note_locked();
  release_slot(slab, slot, ptr, bytes);
  const std::uint64_t t =
      history::free_time(slab->owners[slot].load(std::memory_order_relaxed), cache.history_id);
  free_into_bin_locked(cache, slab, ptr, bytes, stream);
  record(t);
}

void* VmmPool::refill_and_allocate(ThreadCache& cache, int size_class, std::size_t bytes,
                                   CUstream stream) {
  std::lock_guard lock(mutex_);
  note_locked();
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
  const int want = kBinCapacity / 2 + 1;
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
  const std::size_t slot = result.slab->slot_of(reinterpret_cast<CUdeviceptr>(result.ptr));
  if (history::on()) [[unlikely]]
    note_small_alloc(cache, *result.slab, slot, result.ptr, bytes, stream);
  result.slab->requested[slot].store(static_cast<std::uint32_t>(bytes), std::memory_order_release);
  usage_.on_allocate(bytes);
  debug_check("refill");
  return result.ptr;
}

std::uint32_t VmmPool::spans_for(std::size_t slot_size) const noexcept {
  // kSlabSlots(Large) slots, or 2 of the largest classes in half a page (slot_size <= page_ / 4);
  // then up to 8 spans more, to waste at most 1/64 of the slab after its last slot (a 7.5 KiB class
  // wastes 2 KiB of one 32 KiB span, 512 B of four).
  const std::size_t slots = slot_size <= kSlabSmallSlot ? kSlabSlots : kSlabSlotsLarge;
  const std::size_t bytes = std::min(slots * slot_size, page_ / 2);
  const std::size_t least =
      std::clamp<std::size_t>((bytes + span_ - 1) / span_, 1, spans_per_page_);
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
  slab->owners.reset(slab->slot_count);
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
    if (!vmm_call_took_effect(api.cuMemUnmap(region.base + page->index * page_, page_))) continue;
    note_pages(MemoryAction::segment_unmap, region.base + page->index * page_, 1);
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
      if (b != nullptr &&
          (largest < 0 || b->spans > cache.bump[static_cast<std::size_t>(largest)]->spans)) {
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

template <typename Take>
void VmmPool::take_shared_slot(Slab* slab, std::size_t i, Take& take) {
  std::vector<SharedSlot>& shared = slab->shared;
  const SharedSlot e = shared[i];
  shared[i] = shared.back();
  shared.pop_back();
  take(e.ptr, slab);
  drop_batch_ref(e.batch);
}

template <typename Take, typename Want>
void VmmPool::take_shared(Slab* slab, CUstream key, int& budget, Take&& take, Want&& want) {
  std::vector<SharedSlot>& shared = slab->shared;
  for (std::size_t i = shared.size(); i-- > 0 && budget > 0 && want(); --budget) {
    if (!batch_ready_for(shared[i].batch, key)) continue;
    take_shared_slot(slab, i, take);
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
    take_shared_slot(slab, i, take);
  }
  if (shared.empty()) unlist(slab);
}

bool VmmPool::hold_caches(const ThreadCache* self) const noexcept {
  bool any = false;
  for (ThreadCache* c : caches_) {
    if (c == self) continue;
    c->steal.store(true, asymmetric_ ? std::memory_order_relaxed : std::memory_order_seq_cst);
    any = true;
  }
  if (!any) return true;
  // Without the fence nothing is known about the owners' fast paths.
  if (asymmetric_ && !heavy_fence()) return false;
  for (ThreadCache* c : caches_) {
    if (c == self) continue;
    // An owner inside its fast path leaves it within a few instructions (it takes no lock there,
    // and calls only the history's recorder while recording); later entries see `steal` and take
    // the mutex, which is held here.
    while (c->active.load(asymmetric_ ? std::memory_order_acquire : std::memory_order_seq_cst)) {
      std::this_thread::yield();
    }
  }
  return true;
}

void VmmPool::release_caches(const ThreadCache* self) const noexcept {
  for (ThreadCache* c : caches_) {
    if (c != self) c->steal.store(false, std::memory_order_release);
  }
}

void VmmPool::drain_caches(const ThreadCache* self) noexcept {
  if (hold_caches(self)) {  // else leave their caches alone
    for (ThreadCache* c : caches_) {
      if (c == self) continue;
      sync_forgotten(*c);
      release_bumps(*c);
      for (int k = 0; k < kMaxSizeClasses; ++k) flush_bin(*c, k, 0);
    }
  }
  release_caches(self);
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

}  // namespace vibespatial::raster::detail::vmm
