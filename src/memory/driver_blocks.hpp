// SPDX-License-Identifier: Apache-2.0
// The live blocks of a pool that makes one driver allocation per block (tier C, managed_pool.cpp;
// the fallback tier, fallback_pool.cpp): each block is its own allocation, keyed by address, with
// the allocation's size, the bytes asked for and its owner stamp. One bookkeeping for both: the
// alloc's history event and stamp, the free's check, the lookup of an interior address, the
// snapshot's segments and the owners. Not thread-safe: under the owning pool's mutex. Internal to
// src/memory.
#pragma once

#include "memory/device_pool.hpp"

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <vector>

namespace vibespatial::raster::detail {

class DriverBlocks {
 public:
  struct Block {
    std::size_t size;         // the driver allocation's bytes (the snapshot segment's size)
    std::size_t bytes;        // requested
    std::uint64_t owner = 0;  // its owner stamp, when allocated while recording
  };
  using Map = std::map<CUdeviceptr, Block>;  // ordered: interior addresses are found

  explicit DriverBlocks(int device) : device_(device) {}

  /// A new live block at `p` (an allocation of `size` bytes for `bytes` asked on `stream`); its
  /// alloc event, with a fresh time stamp (these tiers do not keep the thread's clock fresh),
  /// while recording. Throws std::bad_alloc (nothing added).
  void add(CUdeviceptr p, std::size_t size, std::size_t bytes, CUstream stream) {
    Block& block = live_.emplace(p, Block{size, bytes}).first->second;
    if (history::on()) {
      block.owner =
          history::record_alloc(device_, p, bytes, reinterpret_cast<std::uintptr_t>(stream), true);
    }
  }

  /// The live block freed at `ptr` with `bytes`; throws std::invalid_argument, changing nothing,
  /// unless it is one (expect_live_block).
  Map::iterator expect_live(const void* ptr, std::size_t bytes) {
    auto it = live_.find(reinterpret_cast<CUdeviceptr>(ptr));
    expect_live_block(ptr, it == live_.end() ? nullptr : &it->second.bytes, bytes);
    return it;
  }

  void erase(Map::iterator it) { live_.erase(it); }

  bool has(CUdeviceptr p) const noexcept { return live_.count(p) != 0; }

  /// The live block whose allocation holds `p`, as block_at reports it; Kind::none if none.
  BlockAt holding(CUdeviceptr p) const noexcept {
    auto it = live_.upper_bound(p);
    if (it != live_.begin() && p - std::prev(it)->first < std::prev(it)->second.size) {
      return {BlockAt::Kind::live, std::prev(it)->first, std::prev(it)->second.bytes};
    }
    return {};
  }

  /// One segment of one active block per live block (collect_segments).
  void collect_segments(std::vector<MemorySnapshotSegment>& out) const {
    for (const auto& [p, b] : live_)
      out.push_back(driver_allocation_segment(device_, p, b.size, b.bytes));
  }

  /// The live blocks stamped in history session `session` (collect_owned_locked).
  void collect_owned(std::uint16_t session, std::vector<history::OwnedBlock>& out) const {
    for (const auto& [p, b] : live_) {
      if (b.owner != 0 && history::stamp_session(b.owner) == session) {
        out.push_back({p, b.bytes, history::stamp_tag(b.owner)});
      }
    }
  }

  const Map& all() const noexcept { return live_; }
  std::size_t count() const noexcept { return live_.size(); }
  bool empty() const noexcept { return live_.empty(); }
  void clear() noexcept { live_.clear(); }

 private:
  int device_;
  Map live_;
};

}  // namespace vibespatial::raster::detail
