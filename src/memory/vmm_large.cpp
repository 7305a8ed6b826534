// SPDX-License-Identifier: Apache-2.0
// Large blocks of the VMM pool: whole pages, free ranges indexed by address and size, and the
// windows that gather free pages into a fresh contiguous range.
#include "memory/vmm_pool_impl.hpp"

namespace vibespatial::raster::detail::vmm {

bool VmmPool::range_ready(FreeRange& range, CUstream key) {
  std::erase_if(range.marks, [&](const MarkRef& m) { return marks_.completed(m); });
  return std::all_of(range.marks.begin(), range.marks.end(),
                     [&](const MarkRef& m) { return m->stream == key; });
}

bool VmmPool::range_idle(FreeRange& range) {
  std::erase_if(range.marks, [&](const MarkRef& m) { return marks_.completed(m); });
  return range.marks.empty();
}

void VmmPool::take_unmapped_handles(CUdeviceptr addr, std::size_t pages,
                                    std::vector<CUmemGenericAllocationHandle>& to) noexcept {
  Region& region = regions_[static_cast<std::size_t>(region_of(addr))];
  const std::size_t first = (addr - region.base) / page_;
  for (std::size_t i = 0; i < pages; ++i) {
    to.push_back(region.handles[first + i]);
    region.handles[first + i] = 0;
  }
  pages_mapped_ -= pages;
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
      if (m.region == ri) obstacles.emplace_back(m.addr, m.pages);
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
  std::size_t next_fresh = 0;
  // Undoes this call on failure: unused fresh pages go back to spare_ (those of a stuck mapping,
  // entries map_pages set to 0, stay with it) and pages mapped so far become ordinary free pages.
  // Idempotent: a page already in a free range is left as it is.
  auto give_back = [&] {
    std::copy_if(fresh.begin() + static_cast<std::ptrdiff_t>(next_fresh), fresh.end(),
                 std::back_inserter(spare_), [](CUmemGenericAllocationHandle h) { return h != 0; });
    fresh.clear();
    next_fresh = 0;
    for (std::size_t i = 0; i < pages; ++i) {
      const CUdeviceptr a = window + i * page_;
      if (region.handles[first + i] == 0 || free_by_addr_.find(a) != free_by_addr_.end()) continue;
      auto it = free_by_addr_.upper_bound(a);
      const bool inside_free = it != free_by_addr_.begin() &&
                               a < std::prev(it)->first + std::prev(it)->second.pages * page_;
      if (!inside_free) insert_free(a, 1, {});
    }
  };
  try {
    // Long runs of new pages get one multi-page handle each, while the pool may grow by them
    // (as acquire_pages creates pages up to that, with `create` false too); the other holes get
    // single pages, spare ones first.
    if (multi_min_pages_ > 0 && holes >= multi_min_pages_) {
      std::size_t room = growth_room(holes - std::min(holes, spare_.size()));
      holes -= map_multi_runs(window_region, first, pages, room);
    }
    if (!acquire_pages(holes, window, window_end, fresh, create)) {
      give_back();
      return 0;
    }
    // Map each run of holes.
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
    give_back();
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

bool VmmPool::wait_for_busy_free_ranges() {
  bool waited = false;
  for (auto& [addr, range] : free_by_addr_) {
    if (range_idle(range)) continue;
    for (const MarkRef& m : range.marks) marks_.wait(m);  // throws CudaError: nothing changed
    range.marks.clear();
    waited = true;
  }
  return waited;
}

void* VmmPool::allocate_large(std::size_t bytes, CUstream stream) {
  const std::size_t pages = (bytes + page_ - 1) / page_;
  ThreadCache& cache = thread_cache();
  std::lock_guard lock(mutex_);
  note_locked();
  fold_cache_stats(cache);
  const CUstream key = key_in(cache, stream);
  mark_pending(stream, key);
  large_peak_pages_ = std::max(large_peak_pages_, large_live_pages_ + pages);
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
    // 4. New memory. On a full device (or with no address space for a window), free ranges whose
    //    freeing work is still queued hold pages too: wait for that work, then compose again from
    //    what the pool holds, rather than fail while it holds what the request needs.
    if (addr == 0) {
      try {
        addr = compose(pages, key, true);
      } catch (const DeviceFull&) {
        if (!wait_for_busy_free_ranges()) throw;
        addr = compose(pages, key, true);
      }
    }
  }
  const auto block = live_large_.emplace(addr, LargeBlock{pages, bytes}).first;
  if (history::on()) [[unlikely]]  // after the pages were mapped for it
    block->second.owner =
        history::record_alloc(device_, addr, bytes, reinterpret_cast<std::uintptr_t>(stream));
  large_live_pages_ += pages;
  usage_.on_allocate(bytes);
  debug_check("allocate_large");
  return reinterpret_cast<void*>(addr);
}

void VmmPool::deallocate_large(CUdeviceptr p, std::size_t bytes, CUstream stream) {
  ThreadCache& cache = thread_cache();
  std::lock_guard lock(mutex_);
  note_locked();
  auto it = live_large_.find(p);
  expect_live_block(reinterpret_cast<const void*>(p),
                    it == live_large_.end() ? nullptr : &it->second.bytes, bytes);
  const CUstream key = key_in(cache, stream);
  MarkRef mark = marks_.record(stream, key);  // may throw: nothing has changed yet
  fold_cache_stats(cache);
  const std::size_t pages = it->second.pages;
  live_large_.erase(it);
  large_live_pages_ -= pages;
  usage_.on_free(bytes);
  insert_free(p, pages, {std::move(mark)});
  mark_pending(stream, key);
  if (history::on()) [[unlikely]]  // under the mutex, at the clock the lock freshened
    history::record_free(device_, p, bytes, reinterpret_cast<std::uintptr_t>(stream), 0);
}

}  // namespace vibespatial::raster::detail::vmm
