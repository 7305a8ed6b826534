// SPDX-License-Identifier: Apache-2.0
// The pool's contracts on the host emulator: tiers, statistics, bad input, fragmentation,
// trimming with live blocks, the OOM chain, stream order, devices, soak.
#include "pool_fixture.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <vector>

using namespace vibespatial::raster;
using namespace vsr_test;

TEST_SUITE("pool") {
  TEST_CASE("statistics before configuration, then tier B by default") {
    FreshPool fresh;
    MemoryPoolStats before = memory_pool_stats();
    CHECK(before.tier.empty());
    CHECK_FALSE(before.configured);
    CHECK_FALSE(before.current_bytes.has_value());
    CHECK(configure_memory_pool() == "B");
    CHECK(configure_memory_pool() == "B");  // idempotent
    MemoryPoolStats s = memory_pool_stats();
    CHECK(s.tier == "B");
    CHECK(s.configured);
    REQUIRE(s.current_bytes.has_value());
    CHECK(*s.current_bytes == 0);
    CHECK(*s.pool_size == 0);
    CHECK_FALSE(s.used_bytes.has_value());
  }

  TEST_CASE("device_allocate configures lazily; blocks are usable and counted") {
    FreshPool fresh;
    void* small = device_allocate(1000);
    void* large = device_allocate(3 * MiB);
    CHECK(reinterpret_cast<std::uintptr_t>(small) % 256 == 0);
    CHECK(reinterpret_cast<std::uintptr_t>(large) % (2 * MiB) == 0);
    fill_pattern(small, 1000, 1);
    fill_pattern(large, 3 * MiB, 2);
    CHECK(check_pattern(small, 1000, 1));
    CHECK(check_pattern(large, 3 * MiB, 2));
    MemoryPoolStats s = memory_pool_stats();
    CHECK(s.tier == "B");
    CHECK(*s.current_bytes == 1000 + 3 * MiB);
    CHECK(*s.current_count == 2);
    CHECK(*s.pool_size == 3 * 2 * MiB);  // one slab page + two pages of the large block
    CHECK(s.granularity == 2 * MiB);
    CHECK(s.small_block_limit == 512 * 1024);
    device_deallocate(small, 1000);
    device_deallocate(large, 3 * MiB);
    s = memory_pool_stats();
    CHECK(*s.current_bytes == 0);
    CHECK(*s.current_count == 0);
    CHECK(*s.peak_bytes == 1000 + 3 * MiB);
    CHECK(*s.peak_count == 2);
    CHECK(*s.total_bytes == 1000 + 3 * MiB);
    CHECK(*s.total_count == 2);
    CHECK(*s.pool_size == 6 * MiB);       // cached, not returned
    CHECK(s.pool_free_bytes >= 4 * MiB);  // the thread-cached small block keeps its slab busy
    // The freed large block is reused without growing the pool.
    void* again = device_allocate(3 * MiB);
    CHECK(again == large);
    device_deallocate(again, 3 * MiB);
    free_pool_memory();
    s = memory_pool_stats();
    CHECK(*s.pool_size == 0);
    CHECK(s.mapped_bytes == 0);
    detail::reset_memory_pools();
    check_nothing_outstanding();
  }

  TEST_CASE("bad input throws and changes nothing") {
    FreshPool fresh;
    CHECK_NOTHROW(device_deallocate(nullptr, 0));
    CHECK(device_allocate(0) == nullptr);
    CHECK_THROWS_AS(device_deallocate(nullptr, 8), std::invalid_argument);
    int host = 0;
    CHECK_THROWS_AS(device_deallocate(&host, 4), std::invalid_argument);  // before configuration
    void* small = device_allocate(4096);
    void* large = device_allocate(5 * MiB);
    const MemoryPoolStats before = memory_pool_stats();
    CHECK_THROWS_AS(device_deallocate(&host, 4), std::invalid_argument);
    CHECK_THROWS_AS(device_deallocate(small, 4095), std::invalid_argument);         // wrong size
    CHECK_THROWS_AS(device_deallocate(large, 5 * MiB + 1), std::invalid_argument);  // wrong size
    CHECK_THROWS_AS(device_deallocate(static_cast<char*>(small) + 512, 4096),
                    std::invalid_argument);  // interior pointer
    CHECK_THROWS_AS(device_deallocate(static_cast<char*>(large) + 4096, 5 * MiB),
                    std::invalid_argument);
    const MemoryPoolStats after = memory_pool_stats();
    CHECK(*after.current_bytes == *before.current_bytes);
    CHECK(*after.current_count == 2);
    device_deallocate(small, 4096);
    device_deallocate(large, 5 * MiB);
    CHECK_THROWS_AS(device_deallocate(small, 4096), std::invalid_argument);  // double free
    CHECK_THROWS_AS(device_deallocate(large, 5 * MiB), std::invalid_argument);
    CHECK(*memory_pool_stats().current_count == 0);
    // Absurd sizes: a bad_alloc, never a crash or a wrapped size.
    CHECK_THROWS_AS(device_allocate(~std::size_t{0}), OutOfMemoryError);
    CHECK_THROWS_AS(device_allocate(std::size_t{1} << 62), std::bad_alloc);
    // Still usable, and the failed requests left no trace in the statistics.
    void* p = device_allocate(777);
    fill_pattern(p, 777, 4);
    CHECK(check_pattern(p, 777, 4));
    CHECK(*memory_pool_stats().current_bytes == 777);
    CHECK(*memory_pool_stats().current_count == 1);
    device_deallocate(p, 777);
  }

  TEST_CASE("fragmentation: a request larger than any free range still succeeds") {
    // 64 MiB device, 2 MiB pages. Fill it with 4 MiB blocks (as many as the driver's free memory
    // holds: a context costs some), free every other one: half is free but no two free blocks
    // are adjacent. A contiguous-slab pool cannot serve a request of all but two of the freed
    // blocks; this pool remaps the free pages into a fresh range without asking the driver for
    // more memory.
    FreshPool fresh(nullptr, 64 * MiB);
    const int n = static_cast<int>(driver_free_bytes() / (4 * MiB));
    REQUIRE(n >= 12);
    std::vector<void*> blocks;
    for (int i = 0; i < n; ++i) blocks.push_back(device_allocate(4 * MiB));
    for (int i = 0; i < n; ++i) fill_pattern(blocks[static_cast<std::size_t>(i)], 4 * MiB, i);
    CHECK_THROWS_AS(device_allocate(4 * MiB), OutOfMemoryError);  // truly full
    const std::size_t held = *memory_pool_stats().pool_size;
    int freed = 0;
    for (int i = 0; i < n; i += 2, ++freed) {
      device_deallocate(blocks[static_cast<std::size_t>(i)], 4 * MiB);
    }
    MemoryPoolStats s = memory_pool_stats();
    CHECK(s.largest_free_block == 4 * MiB);
    // The freed blocks, and the page the failed request left (the pool keeps what it created).
    CHECK(s.pool_free_bytes == held - static_cast<std::size_t>(n - freed) * 4 * MiB);
    CHECK(s.pool_free_bytes >= static_cast<std::size_t>(freed) * 4 * MiB);
    const std::size_t big_bytes = static_cast<std::size_t>(freed - 2) * 4 * MiB;
    void* big = device_allocate(big_bytes);  // throws OutOfMemoryError when it cannot
    CHECK(*memory_pool_stats().current_bytes ==
          big_bytes + static_cast<std::size_t>(n - freed) * 4 * MiB);
    fill_pattern(big, big_bytes, 99);
    for (int i = 1; i < n; i += 2) {
      CHECK(check_pattern(blocks[static_cast<std::size_t>(i)], 4 * MiB, i));  // untouched
    }
    CHECK(check_pattern(big, big_bytes, 99));
    s = memory_pool_stats();
    CHECK(*s.pool_size == held);  // no growth: the same pages, remapped
    CHECK(s.oom_recoveries == 0);
    device_deallocate(big, big_bytes);
    for (int i = 1; i < n; i += 2) device_deallocate(blocks[static_cast<std::size_t>(i)], 4 * MiB);
    detail::reset_memory_pools();
    check_nothing_outstanding();
  }

  TEST_CASE("large-block churn: live blocks never overlap, physical stays near live") {
    // Tight (no slack): physical within 5% of live; the adaptive default keeps up to a
    // tenth more as slack while the device has room.
    for (const char* reserve : {"0", static_cast<const char*>(nullptr)}) {
      INFO("VIBESPATIAL_GPU_POOL_RESERVE " << (reserve != nullptr ? reserve : "unset"));
      const double bound = reserve != nullptr ? 1.05 : 1.15;
      FreshPool fresh(nullptr, std::size_t{16} << 30);
      if (reserve != nullptr) setenv("VIBESPATIAL_GPU_POOL_RESERVE", reserve, 1);
      std::mt19937_64 rng(7);
      std::uniform_int_distribution<std::size_t> size(MiB, 64 * MiB), slot(0, 127);
      std::vector<std::pair<char*, std::size_t>> live(128);
      std::map<char*, std::size_t> by_addr;
      std::size_t overlaps = 0, live_bytes = 0, peak_live = 0, peak_physical = 0;
      auto take = [&](std::size_t n) {
        auto* p = static_cast<char*>(device_allocate(n));
        auto next = by_addr.upper_bound(p);
        if (next != by_addr.end() && next->first < p + n) ++overlaps;
        if (next != by_addr.begin() && std::prev(next)->first + std::prev(next)->second > p) {
          ++overlaps;
        }
        by_addr[p] = n;
        live_bytes += n;
        peak_live = std::max(peak_live, live_bytes);
        peak_physical = std::max(peak_physical, *memory_pool_stats().pool_size);
        return p;
      };
      for (auto& [p, n] : live) p = take(n = size(rng));
      for (int step = 0; step < 1500; ++step) {
        auto& [p, n] = live[slot(rng)];
        device_deallocate(p, n);
        by_addr.erase(p);
        live_bytes -= n;
        p = take(n = size(rng));
      }
      CHECK(overlaps == 0);
      MESSAGE("peak physical / peak live = " << double(peak_physical) / double(peak_live));
      CHECK(double(peak_physical) / double(peak_live) <= bound);
      for (auto& [p, n] : live) device_deallocate(p, n);
      detail::reset_memory_pools();
      check_nothing_outstanding();
    }
  }

  TEST_CASE("small live blocks never pin large physical memory") {
    FreshPool fresh(nullptr, 32 * MiB);
    std::vector<void*> small;
    for (int i = 0; i < 100; ++i) small.push_back(device_allocate(1024));
    // 1 slab page (2 MiB) holds them all; every page the driver has left serves a large block.
    CHECK(*memory_pool_stats().pool_size == 2 * MiB);
    const std::size_t rest = driver_free_bytes() / (2 * MiB) * (2 * MiB);
    REQUIRE(rest >= 28 * MiB);
    void* big = device_allocate(rest);  // throws OutOfMemoryError when it cannot
    CHECK(*memory_pool_stats().pool_size == 2 * MiB + rest);  // the slab page and the block
    fill_pattern(big, rest, 8);
    CHECK(check_pattern(big, rest, 8));
    device_deallocate(big, rest);
    for (void* p : small) device_deallocate(p, 1024);
  }

  TEST_CASE("free_pool_memory with live blocks keeps them in place and intact") {
    FreshPool fresh;
    void* live_small = device_allocate(300 * 1024);
    void* live_large = device_allocate(7 * MiB);
    fill_pattern(live_small, 300 * 1024, 5);
    fill_pattern(live_large, 7 * MiB, 6);
    std::vector<std::pair<void*, std::size_t>> temp;
    for (std::size_t sz : {std::size_t{64 * 1024}, 3 * MiB, 9 * MiB, std::size_t{1000}}) {
      temp.emplace_back(device_allocate(sz), sz);
    }
    for (auto& [p, sz] : temp) device_deallocate(p, sz);
    const MemoryPoolStats before = memory_pool_stats();
    free_pool_memory();
    const MemoryPoolStats after = memory_pool_stats();
    CHECK(*after.pool_size < *before.pool_size);
    CHECK(*after.pool_size == 2 * MiB + 4 * 2 * MiB);  // the live slab page + the live block
    CHECK(after.pool_free_bytes == 0);
    CHECK(check_pattern(live_small, 300 * 1024, 5));
    CHECK(check_pattern(live_large, 7 * MiB, 6));
    CHECK(*after.current_bytes == 300 * 1024 + 7 * MiB);
    // The driver got the memory back.
    const vsr_emu_outstanding o = emulator().outstanding();
    CHECK(o.physical_bytes == *after.pool_size);
    device_deallocate(live_small, 300 * 1024);
    device_deallocate(live_large, 7 * MiB);
    free_pool_memory();
    CHECK(*memory_pool_stats().pool_size == 0);
    CHECK(emulator().outstanding().physical_bytes == 0);
  }

  TEST_CASE("tier B: the OOM chain runs handlers, releases free pages and retries") {
    FreshPool fresh(nullptr, 32 * MiB);
    std::vector<void*> cache;  // memory a user cache holds and can give up
    for (int i = 0; i < 6; ++i) cache.push_back(device_allocate(4 * MiB));
    std::size_t asked = 0;
    int calls = 0;
    const std::uint64_t id = add_oom_handler([&](std::size_t bytes) {
      ++calls;
      asked = bytes;
      if (cache.empty()) return false;
      for (void* p : cache) device_deallocate(p, 4 * MiB);  // re-enters the pool: no deadlock
      cache.clear();
      return true;
    });
    void* big = device_allocate(20 * MiB);  // throws OutOfMemoryError when the chain fails
    CHECK(calls == 1);
    CHECK(*memory_pool_stats().current_bytes == 20 * MiB);  // the cache went, the block came
    CHECK(asked == 20 * MiB);
    MemoryPoolStats s = memory_pool_stats();
    CHECK(s.oom_recoveries == 1);
    // Nothing left to free: the chain is bounded and ends in OutOfMemoryError with a message.
    try {
      device_allocate(20 * MiB);
      FAIL("expected OutOfMemoryError");
    } catch (const OutOfMemoryError& e) {
      const std::string what = e.what();
      CHECK(e.requested_bytes() == 20 * MiB);
      CHECK(what.find("requested 20.00 MiB") != std::string::npos);
      CHECK(what.find("live in 1 blocks") != std::string::npos);
      CHECK(what.find("tier B") != std::string::npos);
    }
    CHECK(calls == 4);  // three more rounds
    remove_oom_handler(id);
    remove_oom_handler(id);  // unknown ids are ignored
    CHECK_THROWS_AS(add_oom_handler(OomHandler{}), std::invalid_argument);
    device_deallocate(big, 20 * MiB);
    // Usable after OOM.
    void* p = device_allocate(20 * MiB);
    device_deallocate(p, 20 * MiB);
  }

  TEST_CASE("tier B: the chain gives every free page back before any handler runs") {
    // A handler is the last resort: when it runs, the pool holds no free page (slack included)
    // that releasing and retrying could have served the request from.
    FreshPool fresh(nullptr, 32 * MiB);
    void* cached = device_allocate(8 * MiB);  // what a user cache holds and can give up
    void* idle = device_allocate(12 * MiB);
    device_deallocate(idle, 12 * MiB);  // free pages the pool keeps
    const std::size_t page = memory_pool_stats().granularity;
    const std::size_t room = driver_free_bytes() + *memory_pool_stats().pool_size;
    const std::size_t want = (room / page - 1) * page;  // fits only once `cached` is gone
    REQUIRE(want > room - 8 * MiB);
    int calls = 0;
    std::size_t free_held = 1;
    const std::uint64_t id = add_oom_handler([&](std::size_t) {
      ++calls;
      free_held = memory_pool_stats().pool_free_bytes;
      if (cached == nullptr) return false;
      device_deallocate(cached, 8 * MiB);
      cached = nullptr;
      return true;
    });
    void* big = device_allocate(want);
    remove_oom_handler(id);
    CHECK(calls == 1);
    CHECK(free_held == 0);
    CHECK(memory_pool_stats().oom_recoveries == 1);
    device_deallocate(big, want);
  }

  TEST_CASE("a full device: a request waits for pages still being freed, in tiers A and B") {
    // The only pages that could serve the request belong to a block freed on a stream whose
    // work is still queued: the request waits for that work (another thread lets it run) and
    // takes them, rather than failing (tier A) or running the OOM handlers (tier B).
    for (const char* tier : {"VIBESPATIAL_GPU_POOL_ONLY", static_cast<const char*>(nullptr)}) {
      INFO("tier " << (tier != nullptr ? "A" : "B"));
      FreshPool fresh(tier, 32 * MiB);
      const detail::DriverApi& api = detail::driver();
      CUstream s1 = new_stream();
      CUstream s2 = new_stream();
      int calls = 0;
      const std::uint64_t id = add_oom_handler([&](std::size_t) {
        ++calls;
        return false;
      });
      REQUIRE(emulator().stream_pause(s1, 1) == 0);
      void* a = device_allocate(16 * MiB, s1);
      REQUIRE(api.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(a), 0x11, 16 * MiB, s1) ==
              CUDA_SUCCESS);
      device_deallocate(a, 16 * MiB, s1);
      const std::size_t page = memory_pool_stats().granularity;
      const std::size_t room = driver_free_bytes() + *memory_pool_stats().pool_size;
      const std::size_t want = (room / page - 1) * page;  // needs a's pages
      REQUIRE(want > room - 16 * MiB);
      std::thread release([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        emulator().stream_pause(s1, 0);
      });
      void* b = nullptr;
      CHECK_NOTHROW(b = device_allocate(want, s2));
      release.join();
      remove_oom_handler(id);
      CHECK(calls == 0);
      CHECK(memory_pool_stats().oom_recoveries == 0);
      if (b != nullptr) {
        fill_pattern(b, want, 5);
        CHECK(check_pattern(b, want, 5));
        device_deallocate(b, want, s2);
      }
      REQUIRE(api.cuStreamSynchronize(s1) == CUDA_SUCCESS);
      REQUIRE(api.cuStreamSynchronize(s2) == CUDA_SUCCESS);
      CHECK(detail::pool_for_device(0).check_invariants() == "");
      forget_stream(s1);
      forget_stream(s2);
      detail::reset_memory_pools();
      REQUIRE(api.cuStreamDestroy(s1) == CUDA_SUCCESS);
      REQUIRE(api.cuStreamDestroy(s2) == CUDA_SUCCESS);
    }
  }

  TEST_CASE("tier B gives back cached free pages before failing") {
    FreshPool fresh(nullptr, 32 * MiB);
    // Fill the device with small slabs, free them all: only empty slabs hold the memory.
    std::vector<void*> small;
    for (int i = 0; i < 12 * 4; ++i) small.push_back(device_allocate(500 * 1024));
    for (void* p : small) device_deallocate(p, 500 * 1024);
    const std::size_t slab_pages = *memory_pool_stats().pool_size;
    REQUIRE(slab_pages > 2 * MiB);          // the empty slabs hold more than 32 - 30 MiB
    void* big = device_allocate(30 * MiB);  // needs the slab pages back
    const MemoryPoolStats s = memory_pool_stats();
    CHECK(*s.current_bytes == 30 * MiB);
    CHECK(*s.pool_size == 30 * MiB);  // the slab pages were given back, the block mapped
    CHECK(s.oom_recoveries == 1);
    fill_pattern(big, 30 * MiB, 9);
    CHECK(check_pattern(big, 30 * MiB, 9));
    device_deallocate(big, 30 * MiB);
  }

  TEST_CASE("tier A never runs the chain") {
    FreshPool fresh("VIBESPATIAL_GPU_POOL_ONLY", 16 * MiB);
    CHECK(configure_memory_pool() == "A");
    int calls = 0;
    const std::uint64_t id = add_oom_handler([&](std::size_t) {
      ++calls;
      return false;
    });
    void* a = device_allocate(12 * MiB);
    CHECK_THROWS_AS(device_allocate(8 * MiB), OutOfMemoryError);
    CHECK(calls == 0);
    CHECK(memory_pool_stats().tier == "A");
    remove_oom_handler(id);
    device_deallocate(a, 12 * MiB);
    void* b = device_allocate(8 * MiB);  // its own free pages are still reused
    device_deallocate(b, 8 * MiB);
  }

  TEST_CASE("tier C: bare managed memory, counted, no pool size") {
    FreshPool fresh("VIBESPATIAL_GPU_MANAGED_MEMORY");
    CHECK(configure_memory_pool() == "C");
    void* p = device_allocate(12345);
    fill_pattern(p, 12345, 3);
    CHECK(check_pattern(p, 12345, 3));
    MemoryPoolStats s = memory_pool_stats();
    CHECK(s.tier == "C");
    CHECK(*s.current_bytes == 12345);
    CHECK_FALSE(s.pool_size.has_value());
    CHECK(emulator().outstanding().managed == 1);
    CHECK_THROWS_AS(device_deallocate(p, 1), std::invalid_argument);
    device_deallocate(p, 12345);
    CHECK(emulator().outstanding().managed == 0);
    CHECK(*memory_pool_stats().peak_bytes == 12345);
    CHECK_NOTHROW(free_pool_memory());
  }

  TEST_CASE("tier C requested on a device without managed memory fails clearly") {
    FreshPool fresh("VIBESPATIAL_GPU_MANAGED_MEMORY");
    REQUIRE(emulator().set_option("MANAGED", "0") == 0);
    CHECK_THROWS_AS(configure_memory_pool(), CudaError);
    CHECK(memory_pool_stats().tier.empty());
    emulator().set_option("MANAGED", "1");
    CHECK(configure_memory_pool() == "C");  // nothing was cached by the failure
  }

  TEST_CASE("fallback tier without VMM: a caching pool over cuMemAlloc") {
    FreshPool fresh(nullptr, 64 * MiB, "0");
    CHECK(configure_memory_pool() == "fallback");
    void* a = device_allocate(1000);  // rounded to 1024
    void* b = device_allocate(5 * MiB);
    fill_pattern(b, 5 * MiB, 7);
    MemoryPoolStats s = memory_pool_stats();
    CHECK(s.tier == "fallback");
    CHECK(*s.used_bytes == 1024 + 5 * MiB);
    CHECK(*s.free_bytes == 0);
    CHECK(*s.total_bytes == *s.used_bytes + *s.free_bytes);
    device_deallocate(a, 1000);
    s = memory_pool_stats();
    CHECK(*s.free_bytes == 1024);
    CHECK(*s.total_bytes == 1024 + 5 * MiB);
    void* a2 = device_allocate(1000);
    CHECK(a2 == a);  // cached block reused
    device_deallocate(a2, 1000);
    CHECK_THROWS_AS(device_deallocate(a2, 1000), std::invalid_argument);
    CHECK_THROWS_AS(device_deallocate(b, 5), std::invalid_argument);
    CHECK(check_pattern(b, 5 * MiB, 7));
    free_pool_memory();
    s = memory_pool_stats();
    CHECK(*s.free_bytes == 0);
    CHECK(emulator().outstanding().allocations == 1);
    // OOM: the cache is given back before failing.
    std::vector<void*> fill;
    for (int i = 0; i < 11; ++i) fill.push_back(device_allocate(5 * MiB));
    for (void* p : fill) device_deallocate(p, 5 * MiB);
    void* big = device_allocate(50 * MiB);  // throws OutOfMemoryError when it cannot
    s = memory_pool_stats();
    CHECK(*s.used_bytes == 5 * MiB + 50 * MiB);  // b and the new block
    CHECK(*s.free_bytes == 0);                   // the cache was given back first
    CHECK(emulator().outstanding().allocations == 2);
    CHECK_THROWS_AS(device_allocate(50 * MiB), OutOfMemoryError);
    device_deallocate(big, 50 * MiB);
    device_deallocate(b, 5 * MiB);
    detail::reset_memory_pools();
    check_nothing_outstanding();
  }

  TEST_CASE("an impossible tier (pool-only without VMM) is refused; nothing is cached") {
    FreshPool fresh;
    // A missing driver or device cannot be shown here (the driver is loaded once per process):
    // the driver suite and dispatch-no-driver cover it.
    REQUIRE(emulator().set_option("VMM", "0") == 0);
    setenv("VIBESPATIAL_GPU_POOL_ONLY", "1", 1);
    try {
      configure_memory_pool();
      FAIL("expected CudaError");
    } catch (const CudaError& e) {
      CHECK(e.code() == CUDA_ERROR_NOT_SUPPORTED);
      CHECK_FALSE(dynamic_cast<const DriverUnavailableError*>(&e));
    }
    MemoryPoolStats s;
    CHECK_NOTHROW(s = memory_pool_stats());
    CHECK(s.tier.empty());
    CHECK_FALSE(s.configured);
    REQUIRE(emulator().set_option("VMM", "1") == 0);
    CHECK(configure_memory_pool() == "A");  // a later call tries again
  }

  TEST_CASE("stream order: reuse at once on the freeing stream, on another only in order") {
    FreshPool fresh;
    const detail::DriverApi& api = detail::driver();
    detail::bind_current_device();
    CUstream s1 = nullptr, s2 = nullptr;
    REQUIRE(api.cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    REQUIRE(api.cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    for (std::size_t size : {std::size_t{2048}, 6 * MiB}) {
      CAPTURE(size);
      INFO("size " << size);
      REQUIRE(emulator().stream_pause(s1, 1) == 0);  // s1's queued work stays pending
      void* p = device_allocate(size, s1);
      // Work that uses the block is queued on s1 (and held there) when the block is freed.
      REQUIRE(api.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(p), 0x11, size, s1) ==
              CUDA_SUCCESS);
      device_deallocate(p, size, s1);
      // Same stream: reused at once.
      void* same = device_allocate(size, s1);
      CHECK(same == p);
      device_deallocate(same, size, s1);
      // Other stream while s1's work is pending: a different block, or this one with s2 made to
      // wait for s1's free (the pool holds nothing else: rather than new memory).
      void* other = device_allocate(size, s2);
      if (other == p) {
        CHECK(api.cuStreamQuery(s2) == CUDA_ERROR_NOT_READY);
      } else {
        CHECK(api.cuStreamQuery(s2) == CUDA_SUCCESS);
      }
      device_deallocate(other, size, s2);
      std::set<void*> freed_on_s1 = {p};
      if (size <= 4096) {
        CHECK(other != p);  // a slab with free slots left: carved, not waited for
        std::vector<void*> churn;
        for (int i = 0; i < 40; ++i) churn.push_back(device_allocate(size, s1));
        for (void* q : churn) {
          REQUIRE(api.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(q), 0x22, size, s1) ==
                  CUDA_SUCCESS);
        }
        for (void* q : churn) device_deallocate(q, size, s1);
        freed_on_s1.insert(churn.begin(), churn.end());
      }
      REQUIRE(emulator().stream_pause(s1, 0) == 0);
      REQUIRE(api.cuStreamSynchronize(s1) == CUDA_SUCCESS);
      REQUIRE(api.cuStreamSynchronize(s2) == CUDA_SUCCESS);
      // s1's work is done, but small blocks freed on it have no mark yet (the pool names s1 only
      // in calls on s1): forget_stream(s1) records one, and s2 may then reuse them (the shared
      // list is scanned a bounded number of entries per refill, so it may take a few refills).
      forget_stream(s1);
      std::vector<void*> taken;
      bool reused = false;
      for (int i = 0; i < 512 && !reused; ++i) {
        void* q = device_allocate(size, s2);
        taken.push_back(q);
        reused = freed_on_s1.count(q) != 0;
      }
      CHECK(reused);
      CHECK(api.cuStreamQuery(s2) == CUDA_SUCCESS);  // without a wait: the mark had completed
      for (void* q : taken) device_deallocate(q, size, s2);
      REQUIRE(api.cuStreamSynchronize(s2) == CUDA_SUCCESS);
    }
    forget_stream(s1);
    forget_stream(s2);
    detail::reset_memory_pools();
    api.cuStreamDestroy(s1);
    api.cuStreamDestroy(s2);
  }

  TEST_CASE("10,000 live small blocks and 300 large ones") {
    FreshPool fresh(nullptr, 4096 * MiB);
    std::mt19937 rng(7);
    std::vector<std::pair<void*, std::size_t>> live;
    for (int i = 0; i < 10000; ++i) {
      const std::size_t sz = 256 + rng() % (256 * 1024);
      live.emplace_back(device_allocate(sz), sz);
    }
    for (int i = 0; i < 300; ++i) {
      const std::size_t sz = MiB + rng() % (8 * MiB);
      live.emplace_back(device_allocate(sz), sz);
    }
    std::set<void*> distinct;
    for (auto& [p, sz] : live) distinct.insert(p);
    CHECK(distinct.size() == live.size());
    CHECK(*memory_pool_stats().current_count == live.size());
    std::shuffle(live.begin(), live.end(), rng);
    for (auto& [p, sz] : live) device_deallocate(p, sz);
    CHECK(*memory_pool_stats().current_count == 0);
    free_pool_memory();
    CHECK(*memory_pool_stats().pool_size == 0);
  }

  TEST_CASE("soak: random traffic ends back at the baseline") {
    FreshPool fresh(nullptr, 256 * MiB);
    std::mt19937 rng(11);
    std::vector<std::pair<void*, std::size_t>> live;
    std::size_t live_bytes = 0;
    for (int step = 0; step < 20000; ++step) {
      const bool alloc = live.empty() || (rng() % 100) < 55;
      if (alloc) {
        const std::size_t sz = (rng() % 10 == 0) ? MiB + rng() % (6 * MiB) : 1 + rng() % 65536;
        if (live_bytes + sz > 120 * MiB) continue;  // slabs of ~40 classes take their pages too
        void* p = device_allocate(sz);
        static_cast<unsigned char*>(p)[0] = 0x5a;
        static_cast<unsigned char*>(p)[sz - 1] = 0xa5;
        live.emplace_back(p, sz);
        live_bytes += sz;
      } else {
        const std::size_t i = rng() % live.size();
        auto [p, sz] = live[i];
        CHECK(static_cast<unsigned char*>(p)[0] == 0x5a);
        CHECK(static_cast<unsigned char*>(p)[sz - 1] == 0xa5);
        device_deallocate(p, sz);
        live_bytes -= sz;
        live[i] = live.back();
        live.pop_back();
      }
      if (step % 5000 == 4999) free_pool_memory();
    }
    for (auto& [p, sz] : live) device_deallocate(p, sz);
    const MemoryPoolStats s = memory_pool_stats();
    CHECK(*s.current_bytes == 0);
    CHECK(*s.current_count == 0);
    free_pool_memory();
    CHECK(*memory_pool_stats().pool_size == 0);
    CHECK(emulator().outstanding().physical_bytes == 0);
    detail::reset_memory_pools();
    check_nothing_outstanding();
  }
}

TEST_SUITE("pool-2dev") {
  TEST_CASE("one pool per device, chosen by the current context") {
    FreshPool fresh;
    const detail::DriverApi& api = detail::driver();
    REQUIRE(detail::driver_state().device_count == 2);
    void* on0 = nullptr;
    void* on1 = nullptr;
    {
      detail::ScopedDeviceContext ctx(0);
      on0 = device_allocate(5 * MiB);
    }
    {
      detail::ScopedDeviceContext ctx(1);
      on1 = device_allocate(5 * MiB);
      CHECK(memory_pool_stats().device == 1);
      CHECK(*memory_pool_stats().current_bytes == 5 * MiB);
    }
    CHECK(*memory_pool_stats(0).current_bytes == 5 * MiB);
    CHECK(*memory_pool_stats(1).current_bytes == 5 * MiB);
    CHECK_FALSE(memory_pool_stats(1).no_such_device);
    CHECK(memory_pool_stats(2).no_such_device);  // two devices, 0 and 1
    CHECK(memory_pool_stats(2).tier.empty());
    vsr_emu_outstanding d0{}, d1{};
    emulator().query_outstanding(&d0, 0);
    emulator().query_outstanding(&d1, 1);
    CHECK(d0.physical_bytes == 6 * MiB);
    CHECK(d1.physical_bytes == 6 * MiB);
    // Frees route by pointer, whatever the current context.
    {
      detail::ScopedDeviceContext ctx(0);
      device_deallocate(on1, 5 * MiB);
      device_deallocate(on0, 5 * MiB);
    }
    CHECK(*memory_pool_stats(1).current_bytes == 0);
    CHECK(*memory_pool_stats(0).current_bytes == 0);
    free_pool_memory();
    CHECK(*memory_pool_stats(1).pool_size == 0);
    (void)api;
    detail::reset_memory_pools();
    check_nothing_outstanding();
  }
}
