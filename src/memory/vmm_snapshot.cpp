// SPDX-License-Identifier: Apache-2.0
// The VMM pool's segments for memory_snapshot() (memory_history.hpp), mapped onto PyTorch's
// snapshot format (docs/memory-pool.md, "Memory history and snapshots"):
//   - a run of mapped large pages at contiguous addresses is one "large" segment, as PyTorch's
//     expandable segments are: its live blocks are active_allocated, its free ranges inactive;
//   - a mapped small page is one "small" segment: the slots of its slabs are blocks (live ones
//     active_allocated, free or thread-cached ones inactive), and the spans no slab holds and a
//     slab's tail past its last slot are inactive.
// Blocks tile each segment (PyTorch's segsum asserts it). Stuck mappings (memory.hpp) are not
// segments: no block may be placed there.
#include "memory/vmm_pool_impl.hpp"

namespace vibespatial::raster::detail::vmm {

namespace {

// Appends a block, merging an inactive one into an inactive predecessor.
void add_block(MemorySnapshotSegment& seg, std::uint64_t addr, std::uint64_t size,
               std::uint64_t requested) {
  if (size == 0) return;
  const bool active = requested != 0;
  if (!active && !seg.blocks.empty() && !seg.blocks.back().active) {
    seg.blocks.back().size += size;
    return;
  }
  MemorySnapshotBlock b;
  b.address = addr;
  b.size = size;
  b.requested_size = requested;
  b.active = active;
  seg.blocks.push_back(std::move(b));
  if (active) seg.allocated_size += size;
}

}  // namespace

void VmmPool::hold_still() const {
  mutex_.lock();
  // Every thread off its fast path: a small block's alloc or free changes the block and records
  // its events inside the fast path (or under the mutex), so none is half done now. (Should the
  // fence fail, which membarrier does not once registered, a free on a fast path meanwhile may
  // be seen half done.)
  (void)hold_caches(nullptr);
}

void VmmPool::release_still() const noexcept {
  release_caches(nullptr);
  mutex_.unlock();
}

void VmmPool::collect_segments(std::vector<MemorySnapshotSegment>& out) const {
  const int n = region_count_.load(std::memory_order_relaxed);
  for (int ri = 0; ri < n; ++ri) {
    const Region& region = regions_[static_cast<std::size_t>(ri)];
    if (region.size == 0) continue;
    if (!region.small) {
      // Runs of mapped pages; within each, live blocks and free ranges in address order.
      std::size_t i = 0;
      while (i < region.pages) {
        if (region.handles[i] == 0) {
          ++i;
          continue;
        }
        std::size_t end = i;
        while (end < region.pages && region.handles[end] != 0) ++end;
        MemorySnapshotSegment seg;
        seg.device = device_;
        seg.address = region.base + i * page_;
        seg.total_size = (end - i) * page_;
        seg.small = false;
        seg.expandable = true;
        const CUdeviceptr seg_end = seg.address + seg.total_size;
        CUdeviceptr cursor = seg.address;
        auto live = live_large_.lower_bound(seg.address);
        while (cursor < seg_end) {
          if (live != live_large_.end() && live->first == cursor) {
            const std::size_t size = live->second.pages * page_;
            add_block(seg, cursor, size, live->second.bytes);
            cursor += size;
            ++live;
            continue;
          }
          // Not live: free (a free range, or a page of no range) up to the next live block.
          const CUdeviceptr next =
              live != live_large_.end() && live->first < seg_end ? live->first : seg_end;
          add_block(seg, cursor, next - cursor, 0);
          cursor = next;
        }
        out.push_back(std::move(seg));
        i = end;
      }
      continue;
    }
    for (std::size_t index = 0; index < region.page_recs.size(); ++index) {
      const SmallPage* page = region.page_recs[index].get();
      if (page == nullptr) continue;
      MemorySnapshotSegment seg;
      seg.device = device_;
      seg.address = region.base + index * page_;
      seg.total_size = page_;
      seg.small = true;
      const CUdeviceptr page_end = seg.address + page_;
      CUdeviceptr cursor = seg.address;
      while (cursor < page_end) {
        const std::size_t g = (cursor - region.base) >> span_shift_;
        const Slab* slab = cursor < seg.address + std::size_t{spans_per_page_} * span_
                               ? region.slabs[g].load(std::memory_order_acquire)
                               : nullptr;
        if (slab == nullptr) {
          const CUdeviceptr next =
              std::min<CUdeviceptr>(page_end, (cursor & ~(CUdeviceptr{span_} - 1)) + span_);
          add_block(seg, cursor, next - cursor, 0);
          cursor = next;
          continue;
        }
        // The slab's slots (their requested sizes say which are live), then its tail.
        auto& records = const_cast<SlotRecords&>(slab->requested);
        for (std::uint32_t s = 0; s < slab->slot_count; ++s) {
          const std::uint32_t requested =
              s < slab->carved ? records[s].load(std::memory_order_acquire) : 0;
          add_block(seg, slab->base + s * slab->slot_size, slab->slot_size, requested);
        }
        const CUdeviceptr slab_end = slab->base + std::size_t{slab->spans} * span_;
        add_block(seg, slab->base + slab->slot_count * slab->slot_size,
                  slab_end - (slab->base + slab->slot_count * slab->slot_size), 0);
        cursor = slab_end;
      }
      out.push_back(std::move(seg));
    }
  }
}

}  // namespace vibespatial::raster::detail::vmm

namespace vibespatial::raster::detail::vmm {

void VmmPool::collect_owned(std::uint16_t session, std::vector<history::OwnedBlock>& out) const {
  std::lock_guard lock(mutex_);
  collect_owned_locked(session, out);
}

void VmmPool::collect_owned_locked(std::uint16_t session,
                                   std::vector<history::OwnedBlock>& out) const {
  for (const auto& [addr, block] : live_large_) {
    if (block.owner != 0 && history::stamp_session(block.owner) == session) {
      out.push_back({addr, block.bytes, history::stamp_tag(block.owner)});
    }
  }
  for (const ClassState& state : classes_) {
    for (const Slab* slab : state.slabs) {
      auto& requested = const_cast<SlotRecords&>(slab->requested);
      auto& owners = const_cast<BasicSlotRecords<std::uint64_t>&>(slab->owners);
      for (std::uint32_t s = 0; s < slab->carved; ++s) {
        const std::uint32_t bytes = requested[s].load(std::memory_order_acquire);
        if (bytes == 0) continue;  // free, or in a thread's cache
        const std::uint64_t stamp = owners[s].load(std::memory_order_relaxed);
        if (history::stamp_session(stamp) != session) continue;
        out.push_back({slab->base + s * slab->slot_size, bytes, history::stamp_tag(stamp)});
      }
    }
  }
}

}  // namespace vibespatial::raster::detail::vmm
