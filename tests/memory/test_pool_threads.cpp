// SPDX-License-Identifier: Apache-2.0
// Many threads and streams allocate, write a pattern, verify it and free.
#include "pool_fixture.hpp"

#include <algorithm>
#include <atomic>
#include <barrier>
#include <random>
#include <set>
#include <thread>
#include <vector>

using namespace vibespatial::raster;
using namespace vsr_test;

TEST_SUITE("pool") {
  TEST_CASE("8 threads on their own streams: no overlap, no corruption, exact totals") {
    FreshPool fresh(nullptr, 2048 * MiB);
    const detail::DriverApi& api = detail::driver();
    constexpr int kThreads = 8;
    std::atomic<int> corrupt{0}, failures{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        detail::bind_current_device();
        CUstream stream = nullptr;
        if (t % 2 == 1 && api.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
          ++failures;
          return;
        }
        std::mt19937 rng(static_cast<unsigned>(t * 7919));
        std::vector<std::pair<void*, std::size_t>> live;
        for (int i = 0; i < 3000; ++i) {
          if (live.size() < 64 && (live.empty() || rng() % 3 != 0)) {
            const std::size_t sz = (rng() % 50 == 0) ? MiB + rng() % (4 * MiB) : 1 + rng() % 20000;
            try {
              void* p = device_allocate(sz, stream);
              fill_pattern(p, std::min<std::size_t>(sz, 4096), static_cast<std::uint32_t>(t));
              live.emplace_back(p, sz);
            } catch (const std::exception&) {
              ++failures;
            }
          } else {
            const std::size_t k = rng() % live.size();
            auto [p, sz] = live[k];
            if (!check_pattern(p, std::min<std::size_t>(sz, 4096), static_cast<std::uint32_t>(t))) {
              ++corrupt;
            }
            device_deallocate(p, sz, stream);
            live[k] = live.back();
            live.pop_back();
          }
        }
        for (auto [p, sz] : live) {
          if (!check_pattern(p, std::min<std::size_t>(sz, 4096), static_cast<std::uint32_t>(t))) {
            ++corrupt;
          }
          device_deallocate(p, sz, stream);
        }
        if (stream != nullptr) {
          api.cuStreamSynchronize(stream);
          forget_stream(stream);  // before its handle value can be recycled
          api.cuStreamDestroy(stream);
        }
      });
    }
    for (auto& th : threads) th.join();
    CHECK(corrupt.load() == 0);
    CHECK(failures.load() == 0);
    const MemoryPoolStats s = memory_pool_stats();
    CHECK(*s.current_bytes == 0);
    CHECK(*s.current_count == 0);
    CHECK(*s.total_count > 8000);
    free_pool_memory();
    detail::reset_memory_pools();
    check_nothing_outstanding();
  }

  TEST_CASE("a thread's exit returns its cached blocks to the pool") {
    FreshPool fresh;
    std::thread([] {
      for (int i = 0; i < 10; ++i) {
        void* p = device_allocate(2000);
        device_deallocate(p, 2000);
      }
    }).join();
    free_pool_memory();
    CHECK(*memory_pool_stats().pool_size == 0);
  }
  TEST_CASE("concurrent threads take their small blocks from slabs of their own") {
    // Two threads' blocks in one slab share the cache lines of its per-slot records, which every
    // allocation and free writes: the pool keeps threads on distinct slabs, even when both
    // refill from slots that a thread which has exited left behind.
    FreshPool fresh;
    constexpr std::size_t kSize = 64 << 10;
    constexpr int kBlocks = 100;
    std::thread([] {
      std::vector<void*> ps;
      for (int i = 0; i < kBlocks; ++i) ps.push_back(device_allocate(kSize));
      std::shuffle(ps.begin(), ps.end(), std::mt19937(42));  // slots return in random order
      for (void* p : ps) device_deallocate(p, kSize);
    }).join();
    std::barrier sync(2);
    std::vector<void*> got[2];
    std::vector<std::thread> ts;
    for (int t = 0; t < 2; ++t) {
      ts.emplace_back([&, t] {
        for (int i = 0; i < kBlocks; ++i) {  // in lockstep: both refill while the other does
          sync.arrive_and_wait();
          got[t].push_back(device_allocate(kSize));
        }
        sync.arrive_and_wait();  // both live sets complete before either frees
        for (void* p : got[t]) device_deallocate(p, kSize);
      });
    }
    for (auto& th : ts) th.join();
    // Slabs are runs of spans of shared pages (docs/memory-pool.md): compare the slabs the blocks
    // came from.
    std::set<std::uintptr_t> slabs[2];
    for (int t = 0; t < 2; ++t) {
      REQUIRE(got[t].size() == kBlocks);
      for (void* p : got[t]) {
        const auto [begin, end] = detail::pool_for_device(0).slab_extent(p);
        REQUIRE(begin != 0);
        REQUIRE(reinterpret_cast<std::uintptr_t>(p) - begin < end - begin);
        slabs[t].insert(begin);
      }
    }
    for (std::uintptr_t s : slabs[0]) CHECK_MESSAGE(slabs[1].count(s) == 0, "slab shared");
    CHECK(detail::pool_for_device(0).check_invariants() == "");
    CHECK(*memory_pool_stats().current_count == 0);
  }

  TEST_CASE("a full device: a thread reuses slots freed into another live thread's slabs") {
    // Slabs a thread owns are still everyone's memory: when no page is left, another thread
    // takes their free slots instead of failing.
    FreshPool fresh(nullptr, 8 * MiB);
    constexpr std::size_t kSize = 16 << 10;
    std::barrier sync(2);
    std::size_t held = 0, kept = 0;
    int b_failures = 0;
    std::thread a([&] {
      std::vector<void*> ps;
      try {
        for (;;) ps.push_back(device_allocate(kSize));
      } catch (const OutOfMemoryError&) {
      }
      held = ps.size();
      const std::size_t page = memory_pool_stats().granularity;
      std::set<std::uintptr_t> seen;
      std::vector<void*> keep;
      for (void* p : ps) {  // one live block per page keeps every slab owned and busy
        if (seen.insert(reinterpret_cast<std::uintptr_t>(p) / page).second) {
          keep.push_back(p);
        } else {
          device_deallocate(p, kSize);
        }
      }
      kept = keep.size();
      sync.arrive_and_wait();  // B runs while A lives
      sync.arrive_and_wait();
      for (void* p : keep) device_deallocate(p, kSize);
    });
    std::thread b([&] {
      sync.arrive_and_wait();
      // All but A's live blocks and what A's thread cache may hold (a bin of 64 at most).
      const std::size_t want = held - kept - 64;
      std::vector<void*> ps;
      for (std::size_t i = 0; i < want; ++i) {
        try {
          ps.push_back(device_allocate(kSize));
        } catch (const OutOfMemoryError&) {
          ++b_failures;
          break;
        }
      }
      for (void* p : ps) device_deallocate(p, kSize);
      sync.arrive_and_wait();
    });
    a.join();
    b.join();
    CHECK(held >= 256);  // 8 MiB of 16 KiB blocks, less nothing
    CHECK(kept >= 1);
    CHECK(b_failures == 0);
    CHECK(*memory_pool_stats().current_count == 0);
    free_pool_memory();
    CHECK(*memory_pool_stats().pool_size == 0);
  }
}
