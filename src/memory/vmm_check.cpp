// SPDX-License-Identifier: Apache-2.0
// The VMM pool's invariant checks (as mimalloc's _mi_page_is_valid): check_invariants() for
// the tests, debug_check() after trims, large allocations and refills.
#include "memory/vmm_pool_impl.hpp"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>

namespace vibespatial::raster::detail::vmm {

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
      if (slab->bump_listed != (std::find(state.unowned_bump.begin(), state.unowned_bump.end(),
                                          slab) != state.unowned_bump.end())) {
        return fail("bump_listed disagrees with the class's unowned_bump list");
      }
      if (slab->bump_owned && slab->bump_listed) {
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
  for (const StuckMapping& m : stuck_) {
    stuck_pages += m.pages;
    if (m.handles.size() != (m.multi_page ? 1 : m.pages)) return fail("a stuck mapping's handles");
  }
  if (small_pages + large_mapped + stuck_pages != pages_mapped_)
    return fail("pages_mapped_ is wrong");
  std::size_t unreleased = 0;
  for (const MultiPageHandle& m : unreleased_multi_) unreleased += m.pages;
  if (pages_mapped_ + spare_.size() + unreleased != pages_held_)
    return fail("held pages are unaccounted for");
  if (std::string what = check_multi_locked(); !what.empty()) return fail(what);
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

std::string VmmPool::check_multi_locked() const {
  // Every multi-page handle is mapped whole in one large region, its pages naming it; no other
  // page names it; handles do not overlap.
  std::set<CUmemGenericAllocationHandle> multi_handles;
  CUdeviceptr previous_end = 0;
  for (const auto& [addr, m] : multi_) {
    if (m.pages < 2 || m.handle == 0) return "a multi-page handle of fewer than 2 pages";
    if (addr < previous_end) return "multi-page handles overlap";
    previous_end = addr + m.pages * page_;
    const int ri = region_of(addr);
    if (ri < 0) return "a multi-page handle outside every region";
    const Region& r = regions_[static_cast<std::size_t>(ri)];
    if (r.small || previous_end > r.base + r.size)
      return "a multi-page handle not in one large region";
    const std::size_t first = (addr - r.base) / page_;
    for (std::size_t i = first; i < first + m.pages; ++i) {
      if (r.handles[i] != m.handle) return "a page of a multi-page handle names another handle";
    }
    if (!multi_handles.insert(m.handle).second) return "a multi-page handle is mapped twice";
  }
  if (multi_handles.empty()) return {};
  const int n = region_count_.load(std::memory_order_relaxed);
  std::size_t multi_pages = 0;
  for (int i = 0; i < n; ++i) {
    const Region& r = regions_[static_cast<std::size_t>(i)];
    for (CUmemGenericAllocationHandle h : r.handles) multi_pages += multi_handles.count(h);
  }
  std::size_t expected = 0;
  for (const auto& [addr, m] : multi_) expected += m.pages;
  if (multi_pages != expected) return "a page outside a multi-page handle names it";
  for (CUmemGenericAllocationHandle h : spare_) {
    if (multi_handles.count(h) != 0) return "a multi-page handle is a spare page";
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
  // Amortised: a check costs about one step per slab, so with many slabs it runs every n-th call.
  if (slab_count_ > 64 && (++calls % (slab_count_ / 16)) != 0) return;
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

}  // namespace vibespatial::raster::detail::vmm
