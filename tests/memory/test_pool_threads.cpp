// SPDX-License-Identifier: Apache-2.0
// Many threads and streams allocate, write a pattern, verify it and free.
#include "pool_fixture.hpp"

#include <atomic>
#include <random>
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
}
