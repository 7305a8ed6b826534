// SPDX-License-Identifier: Apache-2.0
// The VMM pool's address space (regions, the lock-free lookup of pointers) and page supply
// (mapping pages, stuck mappings, gathering pages for a request).
#include "memory/vmm_pool_impl.hpp"

namespace vibespatial::raster::detail::vmm {

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
    try {
      if (!range_idle(it->second)) {
        ++it;
        continue;
      }
      unmap_free_range(it);  // multi-page handles wholly free are released
    } catch (...) {
      break;  // no host memory: keep what is left mapped
    }
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
    if (!empty || !vmm_call_took_effect(api.cuMemAddressFree(r.base, r.size))) continue;
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
    note_pages(MemoryAction::segment_map, addr, count);
    return;
  }
  // Undo exactly what this call mapped (§7 #6: never unmap a range with unmapped gaps). If that
  // fails, the driver still maps those pages: keep them known, never forgotten nor reused.
  if (mapped > 0 && !vmm_call_took_effect(api.cuMemUnmap(addr, mapped * page_))) {
    stuck_.push_back({addr, region_of(addr), {handles, handles + mapped}, mapped, false});
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
    const std::size_t pages = m.pages;
    Region& region = regions_[static_cast<std::size_t>(m.region)];
    CUresult r = CUDA_SUCCESS;
    try {  // room first, so that nothing after the unmap can fail
      spare_.reserve(spare_.size() + pages);
      unreleased_multi_.reserve(unreleased_multi_.size() + 1);
      if (region.small) region.vacant.reserve(region.vacant.size() + pages);
    } catch (const std::bad_alloc&) {
      r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (r == CUDA_SUCCESS) {
      r = driver_state().api.cuMemUnmap(m.addr, pages * page_);
      if (vmm_call_took_effect(r)) r = CUDA_SUCCESS;
    }
    if (r != CUDA_SUCCESS) {
      if (first == CUDA_SUCCESS) first = r;
      ++i;
      continue;
    }
    pages_mapped_ -= pages;
    if (m.multi_page) {
      release_multi(m.handles[0], pages);
    } else {
      spare_.insert(spare_.end(), m.handles.begin(), m.handles.end());
    }
    if (region.small) {
      for (std::size_t k = 0; k < pages; ++k) {
        region.vacant.push_back((m.addr - region.base) / page_ + k);
      }
    }
    stuck_.erase(stuck_.begin() + static_cast<std::ptrdiff_t>(i));
  }
  return first;
}

bool VmmPool::create_pages(std::size_t until, std::vector<CUmemGenericAllocationHandle>& out) {
  while (out.size() < until) {
    CUmemGenericAllocationHandle h = 0;
    const CUresult r = driver().cuMemCreate(&h, page_, &prop_, 0);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) return false;
    if (r != CUDA_SUCCESS) throw_cuda_error(r, "cuMemCreate", __FILE__, __LINE__);
    out.push_back(h);  // `out` has room (acquire_pages reserved it)
    ++pages_held_;
    note_pages(MemoryAction::page_create, 0, 1);
  }
  return true;
}

std::size_t VmmPool::growth_room(std::size_t wanted) {
  const std::size_t base = small_pages_ + large_peak_pages_;
  const std::size_t cap = pages_held_ + wanted > base ? base + slack_allowed(wanted) : base;
  return pages_held_ < cap ? cap - pages_held_ : 0;
}

std::size_t VmmPool::slack_allowed(std::size_t wanted) {
  if (reserve_ >= 0) {
    return static_cast<std::size_t>(reserve_ * static_cast<double>(large_peak_pages_));
  }
  // The adaptive default: a tenth of the peak of live large pages while the device has room,
  // never more than half of the device's free pages that would be left once `wanted` new
  // pages were made, so the slack shrinks as the device fills and is none on a full one.
  const std::size_t target = large_peak_pages_ / 10;
  if (target == 0) return 0;
  std::size_t free_bytes = 0, total_bytes = 0;
  if (driver().cuMemGetInfo(&free_bytes, &total_bytes) != CUDA_SUCCESS) return 0;  // then tight
  const std::size_t free_pages = free_bytes / page_;
  const std::size_t left = free_pages > wanted ? free_pages - wanted : 0;
  return std::min(target, left / 2);
}

std::size_t VmmPool::take_idle_free_pages(std::size_t count, CUdeviceptr avoid_begin,
                                          CUdeviceptr avoid_end,
                                          std::vector<CUmemGenericAllocationHandle>& out) {
  const DriverApi& api = driver();
  std::size_t taken = 0;
  for (auto it = free_by_addr_.begin(); out.size() < count && it != free_by_addr_.end();) {
    const CUdeviceptr begin = it->first;
    const CUdeviceptr end = begin + it->second.pages * page_;
    if ((begin < avoid_end && end > avoid_begin) || !range_idle(it->second)) {
      ++it;
      continue;
    }
    std::size_t take = std::min(count - out.size(), it->second.pages);
    CUdeviceptr cut = end - take * page_;
    // Multi-page handles stay where they are mapped: only single pages of the tail move.
    if (auto m = multi_.lower_bound(end); !multi_.empty() && m != multi_.begin()) {
      --m;
      const CUdeviceptr m_end = m->first + m->second.pages * page_;
      if (m_end > cut) {
        cut = std::min(m_end, end);
        take = (end - cut) / page_;
      }
    }
    if (take == 0) {
      ++it;
      continue;
    }
    if (!vmm_call_took_effect(api.cuMemUnmap(cut, take * page_))) {
      ++it;
      continue;
    }
    note_pages(MemoryAction::segment_unmap, cut, take);
    take_unmapped_handles(cut, take, out);
    taken += take;
    const std::size_t left = it->second.pages - take;
    std::vector<MarkRef> marks = std::move(it->second.marks);
    auto next = std::next(it);
    erase_free(it);
    if (left > 0) insert_free(begin, left, std::move(marks));
    it = next;
  }
  return taken;
}

bool VmmPool::acquire_pages(std::size_t count, CUdeviceptr avoid_begin, CUdeviceptr avoid_end,
                            std::vector<CUmemGenericAllocationHandle>& out, bool create) {
  try {
    out.reserve(count);                    // room first: nothing after an unmap below may fail
    if (!stuck_.empty()) recover_stuck();  // their pages are free once unmapped
    while (out.size() < count && !spare_.empty()) {
      out.push_back(spare_.back());
      spare_.pop_back();
    }
    // Slack: while the pool holds less than its small pages, the peak of live large pages and
    // the slack allowed, new pages rather than idle free pages unmapped from elsewhere.
    // Remapping takes pages from the free ranges that later requests would reuse as they are,
    // so with no slack a steady trace keeps remapping; with some, it settles into free ranges
    // of the sizes it needs and maps nothing (docs/memory-pool.md has the figures). A device
    // that is full ends the slack: the pages then come from elsewhere as usual.
    if (out.size() < count) {
      const std::size_t below_cap = growth_room(count - out.size());
      create_pages(std::min(count, out.size() + below_cap), out);  // a full device ends it
    }
    // Idle free large pages elsewhere: unmap them from their range's tail and reuse the handles.
    take_idle_free_pages(count, avoid_begin, avoid_end, out);
    if (out.size() < count) reclaim_small_pages(&out, count - out.size(), false);
    if (!create && out.size() < count) {
      spare_.insert(spare_.end(), out.begin(), out.end());  // all of them stay in the pool
      out.clear();
      return false;
    }
    if (!create_pages(count, out)) {
      // A full device: multi-page handles wholly free go back to the driver, their memory to
      // come back as single pages where the request needs it.
      if (release_idle_multi(count - out.size(), avoid_begin, avoid_end) == 0)
        throw DeviceFull{count * page_};
      while (out.size() < count && !spare_.empty()) {
        out.push_back(spare_.back());
        spare_.pop_back();
      }
      if (!create_pages(count, out)) throw DeviceFull{count * page_};
    }
  } catch (...) {
    spare_.insert(spare_.end(), out.begin(), out.end());  // valid pages stay in the pool
    out.clear();
    throw;
  }
  return true;
}

}  // namespace vibespatial::raster::detail::vmm
