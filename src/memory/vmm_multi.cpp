// SPDX-License-Identifier: Apache-2.0
// Multi-page handles of the VMM pool (MultiPageHandle): one cuMemCreate for a long run of new
// large pages, mapped whole where it was made, unmapped and released whole once all of its pages
// are free and idle.
#include "memory/vmm_pool_impl.hpp"

namespace vibespatial::raster::detail::vmm {

std::map<CUdeviceptr, MultiPageHandle>::iterator VmmPool::multi_at(CUdeviceptr addr) noexcept {
  auto it = multi_.upper_bound(addr);
  if (it == multi_.begin()) return multi_.end();
  --it;
  return addr < it->first + it->second.pages * page_ ? it : multi_.end();
}

void VmmPool::release_multi(CUmemGenericAllocationHandle h, std::size_t pages) noexcept {
  if (vmm_call_took_effect(driver_state().api.cuMemRelease(h))) {
    pages_held_ -= pages;  // released, even when a sticky error came back (never twice)
    note_pages(MemoryAction::page_release, 0, pages);
  } else {
    unreleased_multi_.push_back({h, pages});  // the caller made room
  }
}

void VmmPool::map_multi(CUdeviceptr addr, CUmemGenericAllocationHandle h, std::size_t pages) {
  const DriverApi& api = driver();
  const std::size_t bytes = pages * page_;
  unreleased_multi_.reserve(unreleased_multi_.size() + 1);  // room first: a release may fail
  stuck_.reserve(stuck_.size() + 1);
  CUresult r = api.cuMemMap(addr, bytes, 0, h, 0);
  if (r == CUDA_SUCCESS) {
    r = api.cuMemSetAccess(addr, bytes, &access_, 1);
    if (r == CUDA_SUCCESS) {
      pages_mapped_ += pages;
      note_pages(MemoryAction::segment_map, addr, pages);
      return;
    }
    // Undo the mapping (§7 #6); if that fails, the driver still maps the handle: keep it known.
    if (!vmm_call_took_effect(api.cuMemUnmap(addr, bytes))) {
      stuck_.push_back({addr, region_of(addr), {h}, pages, true});
      pages_mapped_ += pages;
      throw_cuda_error(r, "cuMemSetAccess", __FILE__, __LINE__);
    }
  }
  release_multi(h, pages);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) throw DeviceFull{bytes};
  throw_cuda_error(r, "cuMemMap/cuMemSetAccess", __FILE__, __LINE__);
}

std::size_t VmmPool::map_multi_runs(int ri, std::size_t first, std::size_t pages,
                                    std::size_t& room) {
  Region& region = regions_[static_cast<std::size_t>(ri)];
  std::size_t filled = 0;
  for (std::size_t i = 0; i < pages;) {
    if (region.handles[first + i] != 0) {
      ++i;
      continue;
    }
    std::size_t run = 0;
    while (i + run < pages && region.handles[first + i + run] == 0) ++run;
    if (run >= multi_min_pages_ && run <= room) {
      const CUdeviceptr addr = region.base + (first + i) * page_;
      CUmemGenericAllocationHandle h = 0;
      const CUresult r = driver().cuMemCreate(&h, run * page_, &prop_, 0);
      if (r == CUDA_ERROR_OUT_OF_MEMORY) return filled;  // single pages may still fit
      if (r != CUDA_SUCCESS) throw_cuda_error(r, "cuMemCreate", __FILE__, __LINE__);
      pages_held_ += run;
      note_pages(MemoryAction::page_create, 0, run);
      auto entry = multi_.end();
      try {
        entry = multi_.emplace(addr, MultiPageHandle{h, run}).first;
      } catch (...) {
        unreleased_multi_.reserve(unreleased_multi_.size() + 1);
        release_multi(h, run);
        throw;
      }
      try {
        map_multi(addr, h, run);
      } catch (...) {
        multi_.erase(entry);
        throw;
      }
      std::fill_n(region.handles.begin() + static_cast<std::ptrdiff_t>(first + i), run, h);
      region.mapped_end = std::max(region.mapped_end, first + i + run);
      room -= run;
      filled += run;
    }
    i += run;
  }
  return filled;
}

CUresult VmmPool::unmap_free_range(std::map<CUdeviceptr, FreeRange>::iterator& it) {
  const CUdeviceptr begin = it->first;
  const CUdeviceptr end = begin + it->second.pages * page_;
  // Handles reaching past either end keep their pages in this range mapped.
  CUdeviceptr a = begin, b = end;
  if (auto m = multi_at(begin); m != multi_.end() && m->first < begin) {
    a = std::min(end, m->first + m->second.pages * page_);
  }
  if (auto m = multi_at(end - page_);
      m != multi_.end() && m->first + m->second.pages * page_ > end) {
    b = std::max(a, m->first);
  }
  if (a >= b) {
    ++it;
    return CUDA_SUCCESS;
  }
  const std::size_t pages = (b - a) / page_;
  std::size_t handles = 0;
  for (auto m = multi_.lower_bound(a); m != multi_.end() && m->first < b; ++m) ++handles;
  // Room first: nothing after the unmap may fail.
  spare_.reserve(spare_.size() + pages);
  unreleased_multi_.reserve(unreleased_multi_.size() + handles);
  const CUresult r = driver().cuMemUnmap(a, b - a);
  if (!vmm_call_took_effect(r)) {
    ++it;
    return r;
  }
  note_pages(MemoryAction::segment_unmap, a, pages);
  Region& region = regions_[static_cast<std::size_t>(region_of(a))];
  const std::size_t first = (a - region.base) / page_;
  for (auto m = multi_.lower_bound(a); m != multi_.end() && m->first < b;) {
    const std::size_t at = (m->first - region.base) / page_;
    std::fill_n(region.handles.begin() + static_cast<std::ptrdiff_t>(at), m->second.pages,
                CUmemGenericAllocationHandle{0});
    release_multi(m->second.handle, m->second.pages);
    m = multi_.erase(m);
  }
  for (std::size_t i = first; i < first + pages; ++i) {
    if (region.handles[i] == 0) continue;
    spare_.push_back(region.handles[i]);
    region.handles[i] = 0;
  }
  pages_mapped_ -= pages;
  auto next = std::next(it);
  erase_free(it);
  if (a > begin) insert_free(begin, (a - begin) / page_, {});
  if (end > b) insert_free(b, (end - b) / page_, {});
  it = next;
  return r;
}

std::size_t VmmPool::release_idle_multi(std::size_t want, CUdeviceptr avoid_begin,
                                        CUdeviceptr avoid_end) {
  std::size_t freed = 0;
  for (auto it = free_by_addr_.begin(); freed < want && it != free_by_addr_.end();) {
    const CUdeviceptr begin = it->first;
    const CUdeviceptr end = begin + it->second.pages * page_;
    auto m = multi_.lower_bound(begin);
    const bool holds_whole = m != multi_.end() && m->first + m->second.pages * page_ <= end;
    if ((begin < avoid_end && end > avoid_begin) || !holds_whole || !range_idle(it->second)) {
      ++it;
      continue;
    }
    const std::size_t held = pages_held_, spare = spare_.size();
    unmap_free_range(it);  // on failure `it` moves on and nothing changed
    freed += (held - pages_held_) + (spare_.size() - spare);
  }
  return freed;
}

}  // namespace vibespatial::raster::detail::vmm
