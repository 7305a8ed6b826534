// SPDX-License-Identifier: Apache-2.0
// The memory history and snapshots (memory_history.hpp): recording, owner tags, the snapshot's
// segments and traces and the invariants PyTorch's readers rely on, fault injection, the
// pickle and its file.
#include "pool_fixture.hpp"
#include "snapshot_checks.hpp"

#include <vibespatial/raster/memory_history.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <system_error>
#include <thread>
#include <vector>

using namespace vibespatial::raster;
using namespace vsr_test;

namespace {

// Stops recording at scope exit, whatever the test did.
struct Recording {
  explicit Recording(std::size_t max_entries = 100000) { record_memory_history(true, max_entries); }
  ~Recording() { record_memory_history(false); }
};

std::vector<MemoryHistoryEvent> events_of(const MemorySnapshot& s, int device = 0) {
  REQUIRE(s.device_traces.size() > static_cast<std::size_t>(device));
  return s.device_traces[static_cast<std::size_t>(device)];
}

std::size_t count(const std::vector<MemoryHistoryEvent>& ev, MemoryAction a) {
  std::size_t n = 0;
  for (const auto& e : ev) n += e.action == a ? 1 : 0;
  return n;
}

// A stream of the test's, resumed (if paused), synchronised and destroyed at scope exit, so that
// a failed check does not leave the pool's teardown waiting for it.
struct TestStream {
  CUstream stream = new_stream();
  TestStream() = default;
  TestStream(const TestStream&) = delete;
  TestStream& operator=(const TestStream&) = delete;
  ~TestStream() {
    emulator().stream_pause(stream, 0);
    detail::driver().cuStreamSynchronize(stream);
    detail::driver().cuStreamDestroy(stream);
  }
};

// The block at `addr` in the snapshot and its segment (nullptr: in none).
std::pair<const MemorySnapshotSegment*, const MemorySnapshotBlock*> find_block(
    const MemorySnapshot& s, const void* addr) {
  const auto a = reinterpret_cast<std::uintptr_t>(addr);
  for (const MemorySnapshotSegment& seg : s.segments) {
    for (const MemorySnapshotBlock& b : seg.blocks) {
      if (b.address == a) return {&seg, &b};
    }
  }
  return {nullptr, nullptr};
}

// Tiers C and fallback: each driver allocation is a segment of one block, got (segment_alloc)
// before the block's alloc event and given back (segment_free) after its free; a block freed on
// a stream with queued work stays as an inactive block (tier C: until cuMemFree; fallback:
// cached), and so does a cached one.
void check_driver_allocation_segments(const char* tier_env, const char* vmm, const char* tier) {
  FreshPool fresh(tier_env, 64 * MiB, vmm);
  REQUIRE(configure_memory_pool() == tier);
  const bool caching = std::string(tier) == "fallback";
  TestStream test_stream;
  CUstream busy = test_stream.stream;
  {
    Recording rec;
    void* a = nullptr;
    {
      MemoryTag tag("tile 3");
      a = device_allocate(3 * MiB);
    }
    void* b = device_allocate(1000);
    void* c = device_allocate(5000, busy);
    device_deallocate(a, 3 * MiB);  // before the pause: the emulator's cuMemFree waits for streams
    emulator().stream_pause(busy, 1);
    REQUIRE(detail::driver().cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(c), 1, 5000, busy) ==
            CUDA_SUCCESS);
    device_deallocate(c, 5000, busy);  // its stream's work is still queued
    MemorySnapshot s = memory_snapshot();
    CHECK(check_snapshot(s, true) == "");
    // Every live block lies in a segment of its own, which its blocks tile.
    auto [seg_b, block_b] = find_block(s, b);
    REQUIRE(seg_b != nullptr);
    CHECK(block_b->active);
    CHECK(block_b->requested_size == 1000);
    CHECK(block_b->size == (caching ? 1024u : 1000u));
    CHECK(block_b->owner == "user");
    CHECK(seg_b->address == reinterpret_cast<std::uintptr_t>(b));
    CHECK(seg_b->total_size == block_b->size);
    CHECK(seg_b->allocated_size == block_b->size);
    CHECK(seg_b->small);
    CHECK_FALSE(seg_b->expandable);
    for (const MemorySnapshotSegment& seg : s.segments) {
      std::uint64_t sum = 0;
      for (const MemorySnapshotBlock& blk : seg.blocks) sum += blk.size;
      CHECK(sum == seg.total_size);
      CHECK(seg.blocks.size() == 1);
    }
    // `c` waits for its stream (tier C) or is cached (fallback): held from the driver, inactive.
    auto [seg_c, block_c] = find_block(s, c);
    REQUIRE(seg_c != nullptr);
    CHECK_FALSE(block_c->active);
    CHECK(seg_c->allocated_size == 0);
    // `a`: given back at once (tier C, its stream was idle) or cached (fallback), a large segment.
    auto [seg_a, block_a] = find_block(s, a);
    if (caching) {
      REQUIRE(seg_a != nullptr);
      CHECK_FALSE(block_a->active);
      CHECK_FALSE(seg_a->small);
    } else {
      CHECK(seg_a == nullptr);
    }
    const auto ev = events_of(s);
    CHECK(count(ev, MemoryAction::segment_alloc) == 3);
    CHECK(count(ev, MemoryAction::segment_free) == (caching ? 0u : 1u));
    CHECK(s.segments.size() == (caching ? 3u : 2u));
    // Got before the block's alloc event, given back after its free.
    std::size_t got = ev.size(), alloc_at = ev.size(), freed_at = ev.size(), given = ev.size();
    for (std::size_t i = 0; i < ev.size(); ++i) {
      if (ev[i].addr != reinterpret_cast<std::uintptr_t>(a)) continue;
      if (ev[i].action == MemoryAction::segment_alloc) got = i;
      if (ev[i].action == MemoryAction::alloc) alloc_at = i;
      if (ev[i].action == MemoryAction::free_completed) freed_at = i;
      if (ev[i].action == MemoryAction::segment_free) given = i;
    }
    REQUIRE(alloc_at < ev.size());
    CHECK(got < alloc_at);
    CHECK(ev[got].size == 3 * MiB);
    REQUIRE(freed_at < ev.size());
    if (!caching) CHECK(freed_at < given);
    // The pickle says what kind of segment it is.
    const std::string pickle = memory_snapshot_pickle(s);
    CHECK(pickle.find("segment_alloc") != std::string::npos);
    emulator().stream_pause(busy, 0);
    REQUIRE(detail::driver().cuStreamSynchronize(busy) == CUDA_SUCCESS);
    device_deallocate(b, 1000);
    free_pool_memory();
    s = memory_snapshot();
    CHECK(check_snapshot(s, true) == "");
    CHECK(s.segments.empty());
    const auto after = events_of(s);
    CHECK(count(after, MemoryAction::segment_free) == 3);
    CHECK(count(after, MemoryAction::trim) == 1);
  }
}

// Under fault injection of the calls that get and give back driver memory and mark streams, the
// snapshot's segments are what the history replays to, and the pool gives everything back.
void check_driver_allocation_faults(const char* tier_env, const char* vmm,
                                    std::initializer_list<const char*> entries) {
  int faults = 0;
  for (const char* entry : entries) {
    for (int n = 1; n <= 3; ++n) {
      const std::string spec = std::string(entry) + ":" + std::to_string(n);
      CAPTURE(spec);
      FreshPool fresh(tier_env, 64 * MiB, vmm);
      (void)configure_memory_pool();
      TestStream test_stream;
      CUstream busy = test_stream.stream;
      Recording rec;
      REQUIRE(emulator().set_fail(spec.c_str()) == 0);
      std::vector<std::pair<void*, std::size_t>> live;
      const std::size_t sizes[] = {1000, 5 * MiB, 300, 9 * MiB, 70000, 3 * MiB, 20 * MiB};
      for (int round = 0; round < 3; ++round) {
        for (std::size_t size : sizes) {
          try {
            live.emplace_back(device_allocate(size, round == 1 ? busy : nullptr), size);
            if (round == 1) {  // queued work on the freeing stream: its free needs a mark
              detail::driver().cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(live.back().first), 1,
                                               size, busy);
            }
          } catch (const CudaError&) {
          } catch (const OutOfMemoryError&) {
          }
        }
        for (std::size_t i = 0; i < live.size(); i += 2) {
          try {
            device_deallocate(live[i].first, live[i].second, round == 1 ? busy : nullptr);
            live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
          } catch (const CudaError&) {
          }
        }
        try {
          free_pool_memory();
        } catch (const CudaError&) {
        }
      }
      faults += static_cast<int>(faults_fired(entry));
      emulator().set_fail(nullptr);
      MemorySnapshot s = memory_snapshot();
      CHECK(s.dropped_events == 0);
      CHECK(check_snapshot(s, true) == "");
      for (auto& [p, size] : live) device_deallocate(p, size);
      REQUIRE(detail::driver().cuStreamSynchronize(busy) == CUDA_SUCCESS);
      free_pool_memory();
      s = memory_snapshot();
      CHECK(check_snapshot(s, true) == "");
      CHECK(s.segments.empty());
      const auto ev = events_of(s);
      CHECK(count(ev, MemoryAction::segment_alloc) == count(ev, MemoryAction::segment_free));
      CHECK(count(ev, MemoryAction::alloc) == count(ev, MemoryAction::free_completed));
    }
  }
  CHECK(faults > 0);
}

}  // namespace

TEST_SUITE("pool") {
  TEST_CASE("memory history: off by default; bad max_entries is refused and changes nothing") {
    FreshPool fresh;
    CHECK_FALSE(memory_history_enabled());
    CHECK_THROWS_AS(record_memory_history(true, 0), std::invalid_argument);
    CHECK_THROWS_AS(record_memory_history(true, kMaxMemoryHistoryEntries + 1), std::out_of_range);
    CHECK_THROWS_AS(record_memory_history(true, static_cast<std::size_t>(-1)), std::out_of_range);
    CHECK_FALSE(memory_history_enabled());
    void* p = device_allocate(1000);
    device_deallocate(p, 1000);
    const MemorySnapshot s = memory_snapshot();
    CHECK_FALSE(s.recording);
    CHECK(count(events_of(s), MemoryAction::alloc) == 0);
    CHECK(memory_pool_stats().owners.empty());
    {
      Recording rec(10);
      CHECK(memory_history_enabled());
      CHECK_THROWS_AS(record_memory_history(true, 0), std::invalid_argument);
      CHECK(memory_history_enabled());  // still recording, bound unchanged
    }
    CHECK_FALSE(memory_history_enabled());
  }

  TEST_CASE("memory history: allocs, frees, pages mapped and owners, in order") {
    FreshPool fresh;
    (void)configure_memory_pool();
    Recording rec;
    const std::size_t page = [] {
      void* p = device_allocate(256);
      device_deallocate(p, 256);
      return memory_pool_stats().granularity;
    }();
    void* small = nullptr;
    void* large = nullptr;
    {
      MemoryTag tag("tile 3");
      small = device_allocate(1000);
      large = device_allocate(5 * MiB);
    }
    void* user = device_allocate(3000);
    device_deallocate(small, 1000);
    MemorySnapshot s = memory_snapshot();
    CHECK(s.recording);
    CHECK(check_snapshot(s, true) == "");
    const auto ev = events_of(s);
    // The large block's pages were mapped before its alloc event.
    std::size_t map_at = ev.size(), alloc_at = ev.size();
    for (std::size_t i = 0; i < ev.size(); ++i) {
      if (ev[i].action == MemoryAction::segment_map && ev[i].size >= 3 * page &&
          map_at == ev.size()) {
        map_at = i;
      }
      if (ev[i].action == MemoryAction::alloc &&
          ev[i].addr == reinterpret_cast<std::uintptr_t>(large)) {
        alloc_at = i;
        CHECK(ev[i].size == 5 * MiB);  // the bytes asked for, as PyTorch's trace has them
        CHECK(ev[i].owner == "tile 3");
      }
      if (ev[i].action == MemoryAction::alloc &&
          ev[i].addr == reinterpret_cast<std::uintptr_t>(user)) {
        CHECK(ev[i].owner == "user");
      }
      CHECK(ev[i].time_us > 0);
      if (i > 0) CHECK(ev[i].time_us >= ev[i - 1].time_us);
    }
    REQUIRE(alloc_at < ev.size());
    CHECK(map_at < alloc_at);
    CHECK(count(ev, MemoryAction::free_requested) == 2);  // the first 256 B block, then `small`
    CHECK(count(ev, MemoryAction::free_completed) == 2);
    // The snapshot's live blocks carry their owners.
    std::map<std::uint64_t, MemorySnapshotBlock> blocks;
    for (const auto& seg : s.segments) {
      for (const auto& b : seg.blocks) {
        if (b.active) blocks[b.address] = b;
      }
    }
    REQUIRE(blocks.count(reinterpret_cast<std::uintptr_t>(large)) == 1);
    CHECK(blocks[reinterpret_cast<std::uintptr_t>(large)].owner == "tile 3");
    CHECK(blocks[reinterpret_cast<std::uintptr_t>(large)].requested_size == 5 * MiB);
    CHECK(blocks[reinterpret_cast<std::uintptr_t>(user)].requested_size == 3000);
    CHECK(blocks.count(reinterpret_cast<std::uintptr_t>(small)) == 0);
    // Owners in the statistics.
    const MemoryPoolStats st = memory_pool_stats();
    REQUIRE(st.owners.size() == 2);
    CHECK(st.owners[0].owner == "tile 3");
    CHECK(st.owners[0].live_bytes == 5 * MiB);
    CHECK(st.owners[0].live_count == 1);
    CHECK(st.owners[1].owner == "user");
    CHECK(st.owners[1].live_bytes == 3000);
    device_deallocate(large, 5 * MiB);
    device_deallocate(user, 3000);
    free_pool_memory();
    s = memory_snapshot();
    CHECK(check_snapshot(s, true) == "");
    CHECK(s.segments.empty());
    CHECK(count(events_of(s), MemoryAction::trim) == 1);
    CHECK(count(events_of(s), MemoryAction::page_create) ==
          count(events_of(s), MemoryAction::page_release));
    CHECK(memory_pool_stats().owners.empty());
  }

  TEST_CASE("memory history: tags, and bad tags are refused") {
    CHECK(current_memory_tag() == "user");
    CHECK_THROWS_AS(pop_memory_tag(), std::logic_error);
    CHECK_THROWS_AS(push_memory_tag(""), std::invalid_argument);
    CHECK_THROWS_AS(push_memory_tag(std::string(kMaxMemoryTagLength + 1, 'x')),
                    std::invalid_argument);
    CHECK_THROWS_AS(push_memory_tag(std::string("a\0b", 3)), std::invalid_argument);
    CHECK_THROWS_AS(push_memory_tag("\xff\xfe"), std::invalid_argument);
    CHECK_THROWS_AS(push_memory_tag("\xc3"), std::invalid_argument);  // cut short
    CHECK(memory_tag_depth() == 0);
    CHECK_NOTHROW(push_memory_tag(std::string(kMaxMemoryTagLength, 'x')));
    CHECK_NOTHROW(push_memory_tag("caf\xc3\xa9"));
    CHECK(current_memory_tag() == "caf\xc3\xa9");
    pop_memory_tag();
    pop_memory_tag();
    {
      MemoryTag outer("outer");
      {
        DefaultMemoryTag d("cupy");  // a tag is set: the caller's wins
        CHECK(current_memory_tag() == "outer");
        MemoryTag inner("inner");
        CHECK(current_memory_tag() == "inner");
        push_memory_tag("left open");  // popped with `inner`
      }
      CHECK(current_memory_tag() == "outer");
    }
    CHECK(memory_tag_depth() == 0);
    {
      DefaultMemoryTag d("numba");
      CHECK(current_memory_tag() == "numba");
    }
    CHECK(current_memory_tag() == "user");
    for (std::size_t i = 0; i < kMaxMemoryTagDepth; ++i) push_memory_tag("deep");
    CHECK_THROWS_AS(push_memory_tag("deep"), std::out_of_range);
    CHECK(memory_tag_depth() == kMaxMemoryTagDepth);
    for (std::size_t i = 0; i < kMaxMemoryTagDepth; ++i) pop_memory_tag();
    CHECK_THROWS_AS(memory_history_marker(""), std::invalid_argument);
  }

  TEST_CASE("memory history: a thread that exits keeps its events; markers; the bound") {
    FreshPool fresh;
    {
      Recording rec;
      memory_history_marker("start");
      std::thread t([] {
        MemoryTag tag("worker");
        for (int i = 0; i < 100; ++i) {
          void* p = device_allocate(512 + static_cast<std::size_t>(i));
          device_deallocate(p, 512 + static_cast<std::size_t>(i));
        }
        void* keep = device_allocate(7000);
        (void)keep;  // freed below, by the main thread
      });
      t.join();
      const MemorySnapshot s = memory_snapshot();
      const auto ev = events_of(s);
      CHECK(count(ev, MemoryAction::alloc) == 101);
      CHECK(count(ev, MemoryAction::free_completed) == 100);
      CHECK(count(ev, MemoryAction::annotate) == 1);
      CHECK(ev.front().action == MemoryAction::annotate);
      CHECK(ev.front().owner == "start");
      CHECK(check_snapshot(s, true) == "");
      void* keep = nullptr;
      for (const auto& e : ev) {
        if (e.action == MemoryAction::alloc && e.size >= 7000)
          keep = reinterpret_cast<void*>(e.addr);
      }
      REQUIRE(keep != nullptr);
      device_deallocate(keep, 7000);
      const MemorySnapshot after = memory_snapshot();
      CHECK(check_snapshot(after, true) == "");
      CHECK(count(events_of(after), MemoryAction::free_completed) == 101);
    }
    {
      // A bound of 50 keeps the newest 50 events and counts the rest.
      Recording rec(50);
      for (int i = 0; i < 100; ++i) {
        void* p = device_allocate(300);
        device_deallocate(p, 300);
      }
      const MemorySnapshot s = memory_snapshot();
      CHECK(events_of(s).size() == 50);
      CHECK(s.dropped_events >= 250);
      CHECK(check_snapshot(s, false) == "");
      record_memory_history(true, 10);  // shrinking keeps the newest
      CHECK(events_of(memory_snapshot()).size() == 10);
    }
    // Stopped: the history stays for a snapshot; starting again begins a new one.
    CHECK(events_of(memory_snapshot()).size() == 10);
    Recording again;
    CHECK(events_of(memory_snapshot()).empty());
  }

  TEST_CASE("memory history: the bound keeps the newest entries and counts every other one") {
    FreshPool fresh;
    // Over many of a thread's buffers, with snapshots between (each takes part of one): the
    // newest 5000 entries are kept and every other one is counted as dropped, exactly (an alloc
    // is one entry, a free two: free_requested and free_completed).
    for (int i = 0; i < 3; ++i) device_deallocate(device_allocate(300), 300);  // no page events
    Recording rec(5000);
    for (int round = 1; round <= 3; ++round) {
      for (int i = 0; i < 1500; ++i) device_deallocate(device_allocate(300), 300);
      const MemorySnapshot s = memory_snapshot();
      const std::size_t recorded = 4500 * static_cast<std::size_t>(round);
      const std::size_t kept = events_of(s).size();
      CHECK(kept == std::min<std::size_t>(5000, recorded));
      CHECK(kept + s.dropped_events == recorded);
      CHECK(check_snapshot(s, false) == "");
    }
  }

  TEST_CASE("memory history: a block freed by another thread is freed after its alloc") {
    FreshPool fresh;
    Recording rec;
    // The main thread's clock stops here; the worker's allocs are stamped later.
    void* first = device_allocate(600);
    device_deallocate(first, 600);
    std::vector<std::pair<void*, std::size_t>> blocks;
    std::thread worker([&] {
      for (int i = 0; i < 10; ++i) {
        const std::size_t size = i % 2 == 0 ? 700 + static_cast<std::size_t>(i) : 3 * MiB;
        blocks.emplace_back(device_allocate(size), size);
      }
    });
    worker.join();
    for (auto& [p, size] : blocks) device_deallocate(p, size);
    const MemorySnapshot s = memory_snapshot();
    CHECK(check_snapshot(s, true) == "");
    const auto ev = events_of(s);
    CHECK(count(ev, MemoryAction::alloc) == 11);
    CHECK(count(ev, MemoryAction::free_completed) == 11);
    std::map<std::uint64_t, std::size_t> alloc_at;
    for (std::size_t i = 0; i < ev.size(); ++i) {
      if (ev[i].action == MemoryAction::alloc) alloc_at[ev[i].addr] = i;
      if (ev[i].action == MemoryAction::free_requested) {
        CAPTURE(i);
        REQUIRE(alloc_at.count(ev[i].addr) == 1);
        CHECK(alloc_at[ev[i].addr] < i);
        CHECK(ev[i].time_us >= ev[alloc_at[ev[i].addr]].time_us);
      }
    }
  }

  TEST_CASE("memory history: owners are kept at a stop; a new history owns no older block") {
    FreshPool fresh;
    void* before = device_allocate(900);  // allocated while not recording: no owner
    void* kept = nullptr;
    void* large = nullptr;
    {
      Recording rec;
      MemoryTag tag("kept");
      kept = device_allocate(1000);
      large = device_allocate(5 * MiB);
      const auto owners = memory_pool_stats().owners;
      REQUIRE(owners.size() == 1);
      CHECK(owners[0].owner == "kept");
      CHECK(owners[0].live_bytes == 5 * MiB + 1000);
      CHECK(owners[0].live_count == 2);
    }
    // Stopped: the owners as they were at the stop, whatever is allocated or freed since.
    void* later = device_allocate(800);
    device_deallocate(kept, 1000);
    void* reused = device_allocate(1000);  // may take the slot of `kept`: no owner is written
    auto owners = memory_pool_stats().owners;
    REQUIRE(owners.size() == 1);
    CHECK(owners[0].owner == "kept");
    CHECK(owners[0].live_count == 2);
    {
      // A new history: the blocks stamped in the last one are not owned in this one.
      Recording rec;
      CHECK(memory_pool_stats().owners.empty());
      MemoryTag tag("new");
      void* fresh_block = device_allocate(1000);
      owners = memory_pool_stats().owners;
      REQUIRE(owners.size() == 1);
      CHECK(owners[0].owner == "new");
      CHECK(owners[0].live_bytes == 1000);
      const MemorySnapshot s = memory_snapshot();
      std::size_t owned = 0;
      for (const auto& seg : s.segments) {
        for (const auto& b : seg.blocks) {
          if (!b.active) continue;
          if (b.address == reinterpret_cast<std::uintptr_t>(fresh_block)) {
            CHECK(b.owner == "new");
            ++owned;
          } else {
            CHECK(b.owner.empty());
          }
        }
      }
      CHECK(owned == 1);
      device_deallocate(fresh_block, 1000);
      CHECK(memory_pool_stats().owners.empty());
    }
    for (auto [p, size] :
         {std::pair{before, std::size_t{900}}, std::pair{large, 5 * MiB},
          std::pair{later, std::size_t{800}}, std::pair{reused, std::size_t{1000}}}) {
      device_deallocate(p, size);
    }
  }

  TEST_CASE("memory history: sizes of 2^48 bytes and more are kept whole") {
    FreshPool fresh;
    Recording rec;
    const std::size_t huge = (std::size_t{1} << 49) + 12345;
    CHECK_THROWS_AS(device_allocate(huge), OutOfMemoryError);
    void* p = device_allocate(4000);
    device_deallocate(p, 4000);
    const auto ev = events_of(memory_snapshot());
    REQUIRE(count(ev, MemoryAction::oom) == 1);
    for (const auto& e : ev) {
      if (e.action == MemoryAction::oom) CHECK(e.size == huge);
      if (e.action == MemoryAction::alloc) CHECK(e.size == 4000);
    }
    CHECK(count(ev, MemoryAction::free_completed) == 1);
  }

  TEST_CASE("memory history: an OOM is recorded with the device's free bytes") {
    FreshPool fresh("VIBESPATIAL_GPU_POOL_ONLY", 64 * MiB);
    Recording rec;
    void* a = nullptr;
    {
      MemoryTag tag("tile 3");
      a = device_allocate(40 * MiB);
    }
    void* b = device_allocate(3000);
    // The message says why: the request, the device, what the pool holds and as what, the
    // largest request it could serve, the top owners.
    try {
      device_allocate(40 * MiB);
      FAIL("expected OutOfMemoryError");
    } catch (const OutOfMemoryError& e) {
      const std::string what = e.what();
      CAPTURE(what);
      CHECK(what.find("requested 40.00 MiB") != std::string::npos);
      CHECK(what.find("free of 64.00 MiB") != std::string::npos);
      CHECK(what.find("live in 2 blocks") != std::string::npos);
      CHECK(what.find("as free large pages (slack)") != std::string::npos);
      CHECK(what.find("in free small-block slots") != std::string::npos);
      CHECK(what.find("the largest request it could serve without new memory is") !=
            std::string::npos);
      CHECK(what.find("top owners by live bytes: tile 3 40.00 MiB in 1 block, user 2.93 KiB in "
                      "1 block") != std::string::npos);
    }
    device_deallocate(b, 3000);
    const MemorySnapshot s = memory_snapshot();
    const auto ev = events_of(s);
    REQUIRE(count(ev, MemoryAction::oom) == 1);
    for (const auto& e : ev) {
      if (e.action != MemoryAction::oom) continue;
      CHECK(e.size == 40 * MiB);
      CHECK(e.device_free < 64 * MiB);
    }
    CHECK(count(ev, MemoryAction::alloc) == 2);
    CHECK(check_snapshot(s, true) == "");
    device_deallocate(a, 40 * MiB);
  }

  TEST_CASE("memory history under fault injection: no event lost, nothing leaked") {
    const char* entries[] = {"cuMemCreate",  "cuMemMap",      "cuMemSetAccess",     "cuMemUnmap",
                             "cuMemRelease", "cuEventRecord", "cuMemAddressReserve"};
    int faults = 0;
    for (const char* entry : entries) {
      for (int n = 1; n <= 3; ++n) {
        const std::string spec = std::string(entry) + ":" + std::to_string(n);
        CAPTURE(spec);
        FreshPool fresh(nullptr, 64 * MiB);
        (void)configure_memory_pool();
        Recording rec;
        REQUIRE(emulator().set_fail(spec.c_str()) == 0);
        std::vector<std::pair<void*, std::size_t>> live;
        int errors = 0;
        const std::size_t sizes[] = {1000, 5 * MiB, 300, 9 * MiB, 70000, 3 * MiB, 20 * MiB};
        for (int round = 0; round < 3; ++round) {
          for (std::size_t size : sizes) {
            try {
              live.emplace_back(device_allocate(size), size);
            } catch (const CudaError&) {
              ++errors;
            } catch (const OutOfMemoryError&) {
              ++errors;
            }
          }
          for (std::size_t i = 0; i < live.size(); i += 2) {
            try {
              device_deallocate(live[i].first, live[i].second);
              live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
            } catch (const CudaError&) {
              ++errors;
            }
          }
          try {
            free_pool_memory();
          } catch (const CudaError&) {
            ++errors;
          }
        }
        faults += static_cast<int>(faults_fired(entry));
        emulator().set_fail(nullptr);
        MemorySnapshot s = memory_snapshot();
        CHECK(s.dropped_events == 0);
        CHECK(check_snapshot(s, true) == "");
        for (auto& [p, size] : live) device_deallocate(p, size);
        try {
          free_pool_memory();
        } catch (const CudaError&) {
          free_pool_memory();
        }
        s = memory_snapshot();
        CHECK(check_snapshot(s, true) == "");
        const auto ev = events_of(s);
        CHECK(count(ev, MemoryAction::alloc) == count(ev, MemoryAction::free_completed));
        CHECK(*memory_pool_stats().current_count == 0);
        CHECK(memory_pool_stats().owners.empty());
        (void)errors;
      }
    }
    CHECK(faults > 0);
  }

  TEST_CASE("memory snapshot: the pickle, and its file written all or nothing") {
    FreshPool fresh;
    Recording rec;
    void* p = device_allocate(4 * MiB);
    const std::string pickle = memory_snapshot_pickle(memory_snapshot());
    CHECK(pickle.substr(0, 2) == std::string("\x80\x02", 2));
    CHECK(pickle.back() == '.');
    CHECK(pickle.find("active_allocated") != std::string::npos);
    CHECK(pickle.find("device_traces") != std::string::npos);
    char dir_template[] = "/tmp/vsr-history-XXXXXX";
    const std::string dir = mkdtemp(dir_template);
    const std::string path = dir + "/snap.pickle";
    dump_memory_snapshot(path);
    struct stat st {};
    REQUIRE(stat(path.c_str(), &st) == 0);
    CHECK(st.st_size > 100);
    // An existing file is refused (and kept), unless overwrite.
    try {
      dump_memory_snapshot(path);
      FAIL("an existing file was overwritten");
    } catch (const std::system_error& e) {
      CHECK(e.code() == std::errc::file_exists);
    }
    CHECK_NOTHROW(dump_memory_snapshot(path, true));
    // A missing directory.
    try {
      dump_memory_snapshot(dir + "/missing/snap.pickle");
      FAIL("wrote into a missing directory");
    } catch (const std::system_error& e) {
      CHECK(e.code() == std::errc::no_such_file_or_directory);
    }
    CHECK_THROWS_AS(dump_memory_snapshot(""), std::invalid_argument);
    CHECK_THROWS_AS(dump_memory_snapshot(dir + "/"), std::invalid_argument);
    // Nothing but the snapshot is left in the directory (no temporary file).
    std::remove(path.c_str());
    CHECK(rmdir(dir.c_str()) == 0);
    device_deallocate(p, 4 * MiB);
  }

  TEST_CASE("memory history: tier C shows each cuMemAllocManaged as a segment") {
    check_driver_allocation_segments("VIBESPATIAL_GPU_MANAGED_MEMORY", "1", "C");
  }

  TEST_CASE("memory history: the fallback tier shows each cuMemAlloc as a segment") {
    check_driver_allocation_segments(nullptr, "0", "fallback");
  }

  TEST_CASE("memory history under fault injection, tier C: the segments replay") {
    check_driver_allocation_faults("VIBESPATIAL_GPU_MANAGED_MEMORY", "1",
                                   {"cuMemAllocManaged", "cuMemFree", "cuEventRecord"});
  }

  TEST_CASE("memory history under fault injection, fallback: the segments replay") {
    check_driver_allocation_faults(nullptr, "0", {"cuMemAlloc", "cuMemFree", "cuEventRecord"});
  }
}
