// SPDX-License-Identifier: Apache-2.0
// The invariants of a memory snapshot (memory_history.hpp) that PyTorch's readers rely on, as
// the memory tests check them: check_snapshot, with the replay MemoryViz.js's segment view makes
// (check_replay).
#pragma once

#include "pool_fixture.hpp"

#include <vibespatial/raster/memory_history.hpp>

#include <cstdint>
#include <iterator>
#include <map>
#include <set>
#include <string>

namespace vsr_test {

using vibespatial::raster::MemoryAction;
using vibespatial::raster::MemoryHistoryEvent;
using vibespatial::raster::MemorySnapshot;
using vibespatial::raster::MemorySnapshotBlock;
using vibespatial::raster::MemorySnapshotSegment;

// Byte ranges [begin, end) as disjoint intervals, adjacent ones merged.
class Ranges {
 public:
  bool covers(std::uint64_t a, std::uint64_t e) const {
    auto it = map_.upper_bound(a);
    if (it == map_.begin()) return false;
    --it;
    return it->second >= e;
  }
  bool misses(std::uint64_t a, std::uint64_t e) const {
    auto it = map_.lower_bound(a);
    if (it != map_.end() && it->first < e) return false;
    return it == map_.begin() || std::prev(it)->second <= a;
  }
  void add(std::uint64_t a, std::uint64_t e) {
    auto it = map_.lower_bound(a);
    if (it != map_.begin() && std::prev(it)->second == a) {
      a = std::prev(it)->first;
      map_.erase(std::prev(it));
    }
    if (it != map_.end() && it->first == e) {
      e = it->second;
      map_.erase(it);
    }
    map_[a] = e;
  }
  void remove(std::uint64_t a, std::uint64_t e) {  // covers(a, e) must hold
    auto it = std::prev(map_.upper_bound(a));
    const std::uint64_t b = it->first, f = it->second;
    map_.erase(it);
    if (b < a) map_[b] = a;
    if (e < f) map_[e] = f;
  }

 private:
  std::map<std::uint64_t, std::uint64_t> map_;
};

// MemoryViz.js's segment view draws the state at an event by undoing, from the snapshot back,
// every later event: a segment_alloc or segment_map takes its range out of the segments (it must
// be in one, and no block live then may start in it), a segment_free or segment_unmap puts it
// back (it must be in none), an alloc takes its block out, a free_completed puts it back (it must
// start inside a segment, or the view fails at that event). "" when every event replays.
inline std::string check_replay(const MemorySnapshot& s) {
  for (std::size_t d = 0; d < s.device_traces.size(); ++d) {
    Ranges segments;
    std::map<std::uint64_t, std::uint64_t> live;  // live blocks: address -> size
    for (const MemorySnapshotSegment& seg : s.segments) {
      if (static_cast<std::size_t>(seg.device) != d) continue;
      segments.add(seg.address, seg.address + seg.total_size);
      for (const MemorySnapshotBlock& b : seg.blocks) {
        if (b.active) live[b.address] = b.size;
      }
    }
    const auto& trace = s.device_traces[d];
    for (std::size_t k = trace.size(); k-- > 0;) {
      const MemoryHistoryEvent& e = trace[k];
      const std::uint64_t end = e.addr + e.size;
      switch (e.action) {
        case MemoryAction::segment_alloc:
        case MemoryAction::segment_map:
          if (!segments.covers(e.addr, end)) return "a segment replayed back is in no segment";
          if (live.lower_bound(e.addr) != live.lower_bound(end)) {
            return "a block live before its segment was got starts in it";
          }
          segments.remove(e.addr, end);
          break;
        case MemoryAction::segment_free:
        case MemoryAction::segment_unmap:
          if (!segments.misses(e.addr, end)) {
            return "a segment replayed back is still in a segment before it was given back";
          }
          segments.add(e.addr, end);
          break;
        case MemoryAction::alloc:
          live.erase(e.addr);
          break;
        case MemoryAction::free_completed:
          if (live.count(e.addr) != 0) break;
          if (!segments.covers(e.addr, e.addr + 1))
            return "a block live at an event is in no segment";
          live[e.addr] = e.size;
          break;
        default:
          break;
      }
    }
  }
  return "";
}

// The invariants PyTorch's _memory_viz.segsum and trace, and MemoryViz.js, rely on: blocks tile
// their segment; every alloc has one free_requested and one free_completed after it, or is a live
// block of the snapshot; with `complete` (everything was allocated while recording, nothing
// dropped), every free follows an alloc; replayed back from the snapshot, every block live at an
// event lies in a segment (check_replay). With `complete`, the driver allocations replayed from
// segment_alloc/segment_free and the pages from segment_map/segment_unmap are the snapshot's
// segments. "" when all hold.
inline std::string check_snapshot(const MemorySnapshot& s, bool complete) {
  std::map<std::uint64_t, std::uint64_t> live;  // active blocks: address -> size
  for (const MemorySnapshotSegment& seg : s.segments) {
    std::uint64_t sum = 0, cursor = seg.address, allocated = 0;
    for (const MemorySnapshotBlock& b : seg.blocks) {
      if (b.address != cursor) return "a block does not start where the previous one ended";
      cursor += b.size;
      sum += b.size;
      if (b.active) {
        allocated += b.size;
        if (b.requested_size == 0 || b.requested_size > b.size) return "bad requested_size";
        live[b.address] = b.size;
      }
    }
    if (sum != seg.total_size) return "a segment's blocks do not add up to its size";
    if (allocated != seg.allocated_size) return "allocated_size disagrees with its blocks";
  }
  for (std::size_t d = 0; d < s.device_traces.size(); ++d) {
    std::map<std::uint64_t, int> state;  // 1 allocated, 2 free requested
    for (const MemoryHistoryEvent& e : s.device_traces[d]) {
      switch (e.action) {
        case MemoryAction::alloc:
          if (state.count(e.addr) != 0) return "an alloc of an address still allocated";
          state[e.addr] = 1;
          break;
        case MemoryAction::free_requested:
          if (state.count(e.addr) == 0) {
            if (complete) return "a free of an address never allocated";
            state[e.addr] = 2;
            break;
          }
          if (state[e.addr] != 1) return "two free_requested for one alloc";
          state[e.addr] = 2;
          break;
        case MemoryAction::free_completed:
          if (state.count(e.addr) == 0 && !complete) break;  // its request was dropped
          if (state.count(e.addr) == 0 || state[e.addr] != 2) {
            return "a free_completed without its free_requested";
          }
          state.erase(e.addr);
          break;
        default:
          break;
      }
    }
    for (const auto& [addr, st] : state) {
      if (st != 1) return "a free_requested never completed";
      if (live.count(addr) == 0) return "an alloc without a free that is not live";
    }
  }
  if (const std::string replay = check_replay(s); !replay.empty()) return replay;
  if (complete) {
    // Every driver allocation got while recording (and not given back) is a segment, and every
    // page mapped (and not unmapped) is in one; and the reverse.
    std::map<std::uint64_t, std::uint64_t> driver_segments;  // address -> size
    for (const auto& trace : s.device_traces) {
      for (const MemoryHistoryEvent& e : trace) {
        if (e.action == MemoryAction::segment_alloc) {
          if (!driver_segments.emplace(e.addr, e.size).second) return "a segment got twice";
        } else if (e.action == MemoryAction::segment_free) {
          auto it = driver_segments.find(e.addr);
          if (it == driver_segments.end() || it->second != e.size) {
            return "a segment given back that was not got";
          }
          driver_segments.erase(it);
        }
      }
    }
    std::set<std::uint64_t> mapped_pages;
    const std::size_t page = vibespatial::raster::memory_pool_stats().granularity;
    for (const auto& trace : s.device_traces) {
      for (const MemoryHistoryEvent& e : trace) {
        if (page == 0 &&
            (e.action == MemoryAction::segment_map || e.action == MemoryAction::segment_unmap)) {
          return "pages mapped by a tier without pages";
        }
        if (e.action == MemoryAction::segment_map) {
          for (std::uint64_t a = e.addr; a < e.addr + e.size; a += page) {
            if (!mapped_pages.insert(a).second) return "a page mapped twice";
          }
        } else if (e.action == MemoryAction::segment_unmap) {
          for (std::uint64_t a = e.addr; a < e.addr + e.size; a += page) {
            if (mapped_pages.erase(a) == 0) return "a page unmapped that was not mapped";
          }
        }
      }
    }
    std::set<std::uint64_t> seg_pages;
    for (const MemorySnapshotSegment& seg : s.segments) {
      auto it = driver_segments.find(seg.address);
      if (!seg.expandable && it != driver_segments.end() && it->second == seg.total_size) {
        driver_segments.erase(it);
        continue;
      }
      if (page == 0) return "a segment that was never got";
      for (std::uint64_t a = seg.address; a < seg.address + seg.total_size; a += page) {
        seg_pages.insert(a);
      }
    }
    if (seg_pages != mapped_pages) return "the mapped pages replayed differ from the segments";
    if (!driver_segments.empty()) return "a segment got and not given back is not in the snapshot";
  }
  return "";
}

}  // namespace vsr_test
