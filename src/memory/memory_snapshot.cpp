// SPDX-License-Identifier: Apache-2.0
// memory_history.hpp's snapshot: every pool's segments and the recorded history, as PyTorch's
// torch.cuda.memory._snapshot() dict, pickled (protocol 2) and written all or nothing by the
// output writer (files/output_file.hpp; docs/memory-pool.md, "Memory history and snapshots"); and
// the public start and stop of the recording, which walk every pool for the owners kept at a stop
// (memory_owners.hpp) over the recorder's own start and stop (memory_history.hpp).
#include "common/expects.hpp"
#include "files/output_file.hpp"
#include "memory/memory_history.hpp"
#include "memory/memory_owners.hpp"
#include "memory/registry_state.hpp"

#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace vibespatial::raster::detail {
namespace {

// The few pickle opcodes a snapshot needs (protocol 2: Python 2.3 and later read it).
class Pickler {
 public:
  Pickler() { out_ += "\x80\x02"; }
  std::string finish() {
    out_ += '.';
    return std::move(out_);
  }
  void str(std::string_view s) {
    out_ += 'X';
    u32(static_cast<std::uint32_t>(s.size()));
    out_.append(s);
  }
  void integer(std::uint64_t v) {
    if (v < (std::uint64_t{1} << 31)) {
      out_ += 'J';
      u32(static_cast<std::uint32_t>(v));
      return;
    }
    // LONG1: little-endian two's complement, with a zero byte on top when the high bit is set.
    std::string bytes;
    while (v != 0) {
      bytes += static_cast<char>(v & 0xFF);
      v >>= 8;
    }
    if ((static_cast<unsigned char>(bytes.back()) & 0x80) != 0) bytes += '\0';
    out_ += '\x8a';
    out_ += static_cast<char>(bytes.size());
    out_ += bytes;
  }
  void boolean(bool b) { out_ += b ? '\x88' : '\x89'; }
  void begin_dict() { out_ += "}("; }  // EMPTY_DICT, MARK
  void end_dict() { out_ += 'u'; }     // SETITEMS
  void begin_list() { out_ += "]("; }  // EMPTY_LIST, MARK
  void end_list() { out_ += 'e'; }     // APPENDS
  void pair(std::uint64_t a, std::uint64_t b) {
    integer(a);
    integer(b);
    out_ += '\x86';  // TUPLE2
  }
  void key(std::string_view k) { str(k); }

 private:
  void u32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i) out_ += static_cast<char>((v >> (8 * i)) & 0xFF);
  }
  std::string out_;
};

}  // namespace

/// Every pool there is, held still (DevicePool::hold_still) in device order until release() or
/// destruction.
class StillPools {
 public:
  StillPools() {
    try {
      for (auto& slot : registry().pools) {
        const DevicePool* p = slot.load(std::memory_order_acquire);
        if (p == nullptr) continue;
        pools_.push_back(p);
        p->hold_still();
        ++held_;
      }
    } catch (...) {
      release();
      throw;
    }
  }
  ~StillPools() { release(); }
  StillPools(const StillPools&) = delete;
  StillPools& operator=(const StillPools&) = delete;
  const std::vector<const DevicePool*>& pools() const noexcept { return pools_; }
  void release() noexcept {
    while (held_ > 0) pools_[--held_]->release_still();
  }

 private:
  std::vector<const DevicePool*> pools_;
  std::size_t held_ = 0;
};

}  // namespace vibespatial::raster::detail

namespace vibespatial::raster {

void record_memory_history(bool enabled, std::size_t max_entries) {
  // The recorder's mutex may be held for ever in a child forked from a recording process.
  if (detail::in_forked_child()) [[unlikely]]
    detail::throw_forked_child(__func__);
  // Orders starts and stops with the owners kept at a stop (memory_owners.hpp), which are read
  // from the pools under their locks: never under the recorder's mutex, which the pools take
  // under theirs.
  static std::mutex control;
  if (!enabled) {
    std::lock_guard order(control);
    if (detail::history::stop()) detail::keep_owned_blocks();  // the owners as at the stop
    return;
  }
  if (max_entries == 0) {
    throw std::invalid_argument("record_memory_history: max_entries must be at least 1");
  }
  if (max_entries > kMaxMemoryHistoryEntries) {
    throw std::out_of_range("record_memory_history: max_entries " + std::to_string(max_entries) +
                            " is above the limit of " + std::to_string(kMaxMemoryHistoryEntries));
  }
  std::lock_guard order(control);
  // A new history owns none of the blocks kept at the last stop; the forgetting comes before the
  // start, while nothing records (`control` orders it with every stop).
  if (!detail::history::on()) detail::forget_owned_blocks();
  detail::history::start(max_entries);
}

MemorySnapshot memory_snapshot() {
  MemorySnapshot snap;
  if (detail::in_forked_child()) return snap;
  int devices = 1;
  if (detail::current_tier() != detail::Tier::none) {
    devices = std::max(1, detail::driver_state().device_count);
  }
  // One cut: every pool held still (its lock, and no thread on its lock-free paths), then the
  // history drained up to that moment and the segments and owners read, before any pool moves
  // on. A pool records a block's events in the section that changes the block, so every block
  // change before the cut is in the trace and the segments, and none after it is in either.
  // (Read at two moments, a block freed in between would be "allocated, never freed, and not
  // live", and a page mapped anew after a free not yet recorded would cover a block "live"
  // before it.) The history's events are sorted after the pools are released.
  detail::StillPools still;
  detail::history::TraceCut cut;
  for (const detail::DevicePool* p : still.pools()) p->collect_segments(snap.segments);
  const std::vector<detail::history::OwnedBlock> owned = detail::owned_blocks_held(still.pools());
  still.release();
  cut.fill(snap, devices);
  const auto owners = detail::history::owners_by_address(owned);
  for (MemorySnapshotSegment& seg : snap.segments) {
    for (MemorySnapshotBlock& b : seg.blocks) {
      if (!b.active) continue;
      auto it = owners.find(b.address);
      if (it != owners.end()) b.owner = it->second;
    }
  }
  return snap;
}

std::string memory_snapshot_pickle(const MemorySnapshot& snap) {
  detail::Pickler p;
  p.begin_dict();
  p.key("segments");
  p.begin_list();
  for (const MemorySnapshotSegment& seg : snap.segments) {
    p.begin_dict();
    p.key("device");
    p.integer(static_cast<std::uint64_t>(seg.device));
    p.key("address");
    p.integer(seg.address);
    p.key("total_size");
    p.integer(seg.total_size);
    p.key("allocated_size");
    p.integer(seg.allocated_size);
    p.key("active_size");
    p.integer(seg.allocated_size);
    std::uint64_t requested = 0;
    for (const MemorySnapshotBlock& b : seg.blocks) requested += b.requested_size;
    p.key("requested_size");
    p.integer(requested);
    p.key("stream");
    p.integer(0);
    p.key("segment_type");
    p.str(seg.small ? "small" : "large");
    p.key("segment_pool_id");
    p.pair(0, 0);
    p.key("is_expandable");
    p.boolean(seg.expandable);
    p.key("frames");
    p.begin_list();
    p.end_list();
    p.key("blocks");
    p.begin_list();
    for (const MemorySnapshotBlock& b : seg.blocks) {
      p.begin_dict();
      p.key("address");
      p.integer(b.address);
      p.key("size");
      p.integer(b.size);
      p.key("requested_size");
      p.integer(b.requested_size);
      p.key("state");
      p.str(b.active ? "active_allocated" : "inactive");
      p.key("frames");
      p.begin_list();
      p.end_list();
      if (b.active && !b.owner.empty()) {
        p.key("user_metadata");
        p.str(b.owner);
      }
      p.end_dict();
    }
    p.end_list();
    p.end_dict();
  }
  p.end_list();
  p.key("device_traces");
  p.begin_list();
  for (const auto& trace : snap.device_traces) {
    p.begin_list();
    for (const MemoryHistoryEvent& e : trace) {
      p.begin_dict();
      p.key("action");
      p.str(memory_action_name(e.action));
      if (e.action != MemoryAction::oom) {
        p.key("addr");
        p.integer(e.addr);
      }
      p.key("size");
      p.integer(e.size);
      p.key("stream");
      p.integer(e.stream);
      p.key("time_us");
      p.integer(e.time_us);
      p.key("frames");
      p.begin_list();
      p.end_list();
      p.key("user_metadata");
      p.str(e.owner);
      if (e.action == MemoryAction::oom) {
        p.key("device_free");
        p.integer(e.device_free);
      }
      p.end_dict();
    }
    p.end_list();
  }
  p.end_list();
  p.key("vibespatial");
  p.begin_dict();
  p.key("dropped_events");
  p.integer(snap.dropped_events);
  p.key("recording");
  p.boolean(snap.recording);
  p.end_dict();
  p.end_dict();
  return p.finish();
}

void dump_memory_snapshot(const std::string& path, bool overwrite) {
  VSR_EXPECTS(!path.empty(), "dump_memory_snapshot: empty path");
  VSR_EXPECTS(path.find('\0') == std::string::npos, "dump_memory_snapshot: path holds a NUL byte");
  // The writer of every output: the target checked first (a directory, FIFO or device is never
  // replaced), a private temporary beside it renamed into place when complete.
  detail::write_output_file("dump_memory_snapshot", path, memory_snapshot_pickle(memory_snapshot()),
                            overwrite);
}

}  // namespace vibespatial::raster
