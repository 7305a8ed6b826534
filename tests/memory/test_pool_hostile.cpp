// SPDX-License-Identifier: Apache-2.0
// The pool's defects found by a hostile user, each as the case that exposed it: re-entrant OOM
// handlers, driver faults during refills and rollbacks, blocks stranded in a live thread's cache,
// threads without a context, statistics of devices that do not exist, failing frees, and tier
// variables with values that mean nothing.
#include "pool_fixture.hpp"

#include <cxxabi.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <latch>
#include <string>
#include <thread>
#include <vector>

using namespace vibespatial::raster;
using namespace vsr_test;

namespace {

// A 5 MiB block on `s` with work queued on it that cannot run: `s` is paused, so the block's free
// records a stream mark with an event.
void* large_block_with_work_held(CUstream s) {
  void* p = device_allocate(5 * MiB, s);
  emulator().stream_pause(s, 1);
  detail::driver().cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(p), 0, 1, s);
  return p;
}

// The end of a test on a paused stream `s`: resumes it, waits for its work, lets the pool forget
// it, tears the pools down and destroys it.
void resume_and_destroy(CUstream s) {
  emulator().stream_pause(s, 0);
  REQUIRE(detail::driver().cuStreamSynchronize(s) == CUDA_SUCCESS);
  forget_stream(s);
  detail::reset_memory_pools();
  REQUIRE(detail::driver().cuStreamDestroy(s) == CUDA_SUCCESS);
}

// The emulator's charge and mappings agree with what the pool says it holds.
void check_pool_matches_driver() {
  const MemoryPoolStats s = memory_pool_stats();
  const vsr_emu_outstanding o = emulator().outstanding();
  REQUIRE(s.pool_size.has_value());
  CHECK(o.physical_bytes == *s.pool_size);
  CHECK(o.handles * s.granularity == *s.pool_size);
  CHECK(o.mappings * s.granularity == s.mapped_bytes);  // the pool maps page by page
}

// Runs `body` with the process's stderr sent to a temporary file; returns what was written.
template <typename Body>
std::string capture_stderr(Body&& body) {
  std::fflush(stderr);
  std::FILE* tmp = std::tmpfile();
  REQUIRE(tmp != nullptr);
  const int saved = dup(2);
  dup2(fileno(tmp), 2);
  try {
    body();
  } catch (...) {
    std::fflush(stderr);
    dup2(saved, 2);
    close(saved);
    std::fclose(tmp);
    throw;
  }
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  std::string text;
  std::rewind(tmp);
  for (int c = std::fgetc(tmp); c != EOF; c = std::fgetc(tmp)) text.push_back(static_cast<char>(c));
  std::fclose(tmp);
  return text;
}

void set_env(const char* name, const char* value) {
  if (value == nullptr) {
    unsetenv(name);
  } else {
    setenv(name, value, 1);
  }
}

}  // namespace

TEST_SUITE("pool") {
  TEST_CASE(
      "17.3: an allocation inside an OOM handler fails fast instead of re-entering the chain") {
    FreshPool fresh(nullptr, 8 * MiB);
    void* held = device_allocate(6 * MiB);  // 3 of the device's 4 pages
    int depth = 0, max_depth = 0, calls = 0, inner_oom = 0;
    std::string inner_message;
    const std::uint64_t id = add_oom_handler([&](std::size_t) {
      ++calls;
      max_depth = std::max(max_depth, ++depth);
      if (depth <= 3) {  // bounds the recursion of a pool that re-enters its chain
        try {
          void* p = device_allocate(4 * MiB);
          device_deallocate(p, 4 * MiB);
        } catch (const OutOfMemoryError& e) {
          ++inner_oom;
          inner_message = e.what();
        }
      }
      --depth;
      return false;
    });
    CHECK_THROWS_AS(device_allocate(4 * MiB), OutOfMemoryError);
    remove_oom_handler(id);
    CHECK(max_depth == 1);
    CHECK(calls == 3);  // once per round of the outer chain, never from inside a handler
    CHECK(inner_oom == 3);
    CHECK(inner_message.find("inside an OOM handler") != std::string::npos);
    // Out of the handler, the chain runs again: a handler that frees makes the request succeed.
    const std::uint64_t frees = add_oom_handler([&](std::size_t) {
      if (held == nullptr) return false;
      device_deallocate(held, 6 * MiB);
      held = nullptr;
      return true;
    });
    void* p = device_allocate(4 * MiB);
    CHECK(held == nullptr);
    device_deallocate(p, 4 * MiB);
    remove_oom_handler(frees);
    CHECK(*memory_pool_stats().current_count == 0);
  }

  TEST_CASE("OOM handlers run outside any C++ exception handler: a thread may end inside one") {
    // An embedding interpreter may end the allocating thread inside a handler by a foreign
    // unwind (CPython's pthread_exit() of a daemon thread at exit), which the handler catches
    // and passes on (or parks the thread in its catch block). A C++ runtime terminates the
    // process when such an unwind is caught while another exception is being handled, so the
    // chain must not run inside the handler of the pool's own DeviceFull. Both entries to the
    // chain: a thread's first allocation (the checked path) and a later one (the direct path).
    FreshPool fresh(nullptr, 8 * MiB);
    void* held = device_allocate(6 * MiB);  // 3 of the device's 4 pages
    std::atomic<int> caught{0};
    const std::uint64_t id = add_oom_handler([&](std::size_t) -> bool {
      try {
        pthread_exit(nullptr);
      } catch (...) {  // the forced unwind (catch (abi::__forced_unwind&) binds to no object)
        ++caught;
        throw;
      }
    });
    std::atomic<int> returned{0};
    std::thread first([&] {
      (void)device_allocate(4 * MiB);
      ++returned;
    });
    first.join();
    std::thread later([&] {
      device_deallocate(device_allocate(4096), 4096);
      (void)device_allocate(4 * MiB);
      ++returned;
    });
    later.join();
    CHECK(caught == 2);
    CHECK(returned == 0);
    remove_oom_handler(id);
    // The chain and the pool are as they were: a handler that frees makes the request succeed.
    const std::uint64_t frees = add_oom_handler([&](std::size_t) {
      if (held == nullptr) return false;
      device_deallocate(held, 6 * MiB);
      held = nullptr;
      return true;
    });
    void* p = device_allocate(4 * MiB);
    device_deallocate(p, 4 * MiB);
    remove_oom_handler(frees);
    CHECK(held == nullptr);
    CHECK(*memory_pool_stats().current_count == 0);
  }

  TEST_CASE("17.7: driver faults during small-block refills lose no slot") {
    // Refills take slots freed on other streams, each behind a mark the pool records or queries
    // with driver calls. A call failing after a slot was taken must not lose that slot: a lost
    // slot pins its slab page for ever, and enough of them pin the whole device. Tier A: a full
    // device fails at once instead of running the chain, whose trim would wait for the held
    // stream.
    constexpr std::size_t kDevice = 32 * MiB;
    FreshPool fresh("VIBESPATIAL_GPU_POOL_ONLY", kDevice);
    const std::size_t all_pages = driver_free_bytes() / (2 * MiB) * (2 * MiB);  // a context costs
    const detail::DriverApi& api = detail::driver();
    CUstream a = new_stream(), b = new_stream(), c = new_stream();
    // cuEventCreate first: the pool creates events only while it has no idle one.
    const char* const faults[] = {"cuEventCreate", "cuCtxGetCurrent", "cuStreamQuery",
                                  "cuEventRecord", "cuEventQuery"};
    int errors = 0, setup_failures = 0;
    std::size_t size = 2000;
    for (const char* entry : faults) {
      unsigned long long fired = 0;  // faults of `entry` the emulator injected, in all rounds
      for (int n = 1; n <= 8; ++n) {
        CAPTURE(entry);
        CAPTURE(n);
        size = size % 60000 + 1500;  // spread the rounds over size classes, so over slabs
        std::vector<void*> on_a, on_b, on_c;
        try {
          for (int i = 0; i < 40; ++i) on_a.push_back(device_allocate(size, a));
          for (int i = 0; i < 40; ++i) on_b.push_back(device_allocate(size, b));
        } catch (const OutOfMemoryError&) {
          ++setup_failures;  // pages pinned by lost slots
        }
        // Faults on every call of `entry` from the n-th on, from the frees (which record the
        // marks) through the refills. Where a failed event makes the pool synchronise the stream
        // instead, that fails too (the stream is held: it would wait).
        std::string spec = std::string(entry) + ":" + std::to_string(n) + "+";
        if (std::string(entry) == "cuEventRecord" || std::string(entry) == "cuEventCreate") {
          spec += ",cuStreamSynchronize:1+,cuCtxSynchronize:1+";
        }
        // Frees on two streams, one of them held with work queued, so that its marks stay
        // pending.
        emulator().stream_pause(a, 1);
        if (!on_a.empty()) {
          api.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(on_a[0]), 0, size, a);
        }
        REQUIRE(emulator().set_fail(spec.c_str()) == 0);
        for (void* p : on_a) device_deallocate(p, size, a);  // a failed mark is not an error
        for (void* p : on_b) device_deallocate(p, size, b);
        try {
          forget_stream(a);  // records a mark of the held stream: an event, or a failed wait
        } catch (const CudaError&) {
          ++errors;
        }
        for (int i = 0; i < 60; ++i) {
          try {
            on_c.push_back(device_allocate(size, c));
          } catch (const CudaError&) {
            ++errors;
          } catch (const OutOfMemoryError&) {
            ++errors;
          }
        }
        fired += faults_fired(entry);
        emulator().set_fail(nullptr);
        emulator().stream_pause(a, 0);
        for (void* p : on_c) device_deallocate(p, size, c);
        for (CUstream s : {a, b, c}) api.cuStreamSynchronize(s);
        free_pool_memory();  // what is free goes back; a lost slot keeps its page
      }
      CHECK_MESSAGE(fired > 0, std::string(entry) << ": no call of it was made to fail");
    }
    CHECK(errors > 0);  // the faults hit
    CHECK(setup_failures == 0);
    CHECK(*memory_pool_stats().current_bytes == 0);
    // Every page went back: nothing pins a slab.
    CHECK(*memory_pool_stats().pool_size == 0);
    void* all = nullptr;
    CHECK_NOTHROW(all = device_allocate(all_pages));
    if (all != nullptr) device_deallocate(all, all_pages);
    for (CUstream s : {a, b, c}) {
      forget_stream(s);
      api.cuStreamDestroy(s);
    }
    detail::reset_memory_pools();
    check_nothing_outstanding();
  }

  TEST_CASE("17.8: a mapping whose rollback unmap failed stays known, is avoided, then released") {
    FreshPool fresh(nullptr, 64 * MiB);
    REQUIRE(configure_memory_pool() == "B");
    SUBCASE("large block") {
      // The block's two fresh pages are mapped, access fails, and so does the undo.
      REQUIRE(emulator().set_fail("cuMemSetAccess:1,cuMemUnmap:1") == 0);
      CHECK_THROWS_AS(device_allocate(4 * MiB), CudaError);
      CHECK(faults_fired("cuMemSetAccess") == 1);
      CHECK(faults_fired("cuMemUnmap") == 1);  // the undo failed too
      emulator().set_fail(nullptr);
      check_pool_matches_driver();
      void* p = nullptr;
      REQUIRE_NOTHROW(p = device_allocate(4 * MiB));
      fill_pattern(p, 4 * MiB, 8);
      CHECK(check_pattern(p, 4 * MiB, 8));
      check_pool_matches_driver();
      device_deallocate(p, 4 * MiB);
    }
    SUBCASE("slab page") {
      REQUIRE(emulator().set_fail("cuMemSetAccess:1,cuMemUnmap:1") == 0);
      CHECK_THROWS_AS(device_allocate(1000), CudaError);
      CHECK(faults_fired("cuMemSetAccess") == 1);
      CHECK(faults_fired("cuMemUnmap") == 1);
      emulator().set_fail(nullptr);
      check_pool_matches_driver();
      void* p = nullptr;
      REQUIRE_NOTHROW(p = device_allocate(1000));
      fill_pattern(p, 1000, 9);
      CHECK(check_pattern(p, 1000, 9));
      check_pool_matches_driver();
      device_deallocate(p, 1000);
    }
    SUBCASE("the unmap keeps failing for a while") {
      REQUIRE(emulator().set_fail("cuMemSetAccess:1,cuMemUnmap:1+") == 0);
      CHECK_THROWS_AS(device_allocate(6 * MiB), CudaError);
      void* p = nullptr;
      REQUIRE_NOTHROW(p = device_allocate(6 * MiB));  // elsewhere: nothing needs an unmap
      fill_pattern(p, 6 * MiB, 10);
      CHECK(check_pattern(p, 6 * MiB, 10));
      device_deallocate(p, 6 * MiB);
      CHECK_THROWS_AS(free_pool_memory(), CudaError);  // cannot unmap yet: says so
      CHECK(faults_fired("cuMemSetAccess") == 1);
      CHECK(faults_fired("cuMemUnmap") >= 2);  // the undo and the trim's attempt
      check_pool_matches_driver();
      emulator().set_fail(nullptr);
    }
    free_pool_memory();
    CHECK(*memory_pool_stats().pool_size == 0);
    check_pool_matches_driver();
    CHECK(emulator().outstanding().physical_bytes == 0);
    CHECK(emulator().outstanding().mappings == 0);
    detail::reset_memory_pools();
    check_nothing_outstanding();
  }

  TEST_CASE("17.9: the OOM chain and free_pool_memory reach blocks cached by a live thread") {
    // A thread fills the device with small blocks, frees them all and stays alive: its thread
    // cache holds every block. Other threads must still get the memory.
    FreshPool fresh(nullptr, 8 * MiB);
    constexpr std::size_t kBlock = 512 * 1024;  // the largest small block: 4 per page
    REQUIRE(configure_memory_pool() == "B");
    std::latch leave(1);
    struct Parked {
      std::size_t filled = 0;
      std::latch parked{1};
      std::thread thread;
    };
    auto fill_free_park = [&](Parked& t) {
      t.thread = std::thread([&] {
        std::vector<void*> ps;
        try {
          for (;;) ps.push_back(device_allocate(kBlock));
        } catch (const OutOfMemoryError&) {
        }
        t.filled = ps.size();
        for (void* p : ps) device_deallocate(p, kBlock);
        t.parked.count_down();
        leave.wait();
      });
      t.parked.wait();
    };
    // Every page the driver has (a context costs some memory), 4 blocks each.
    const std::size_t pages = driver_free_bytes() / (2 * MiB);
    REQUIRE(pages >= 3);
    Parked first, second, third;
    fill_free_park(first);
    REQUIRE(memory_pool_stats().small_block_limit == kBlock);
    CHECK(first.filled == 4 * pages);
    // The second thread's OOM chain takes the blocks the first one caches.
    fill_free_park(second);
    CHECK(second.filled == 4 * pages);
    CHECK(*memory_pool_stats().current_bytes == 0);
    // free_pool_memory() gives back what the parked second thread caches.
    free_pool_memory();
    CHECK(*memory_pool_stats().pool_size == 0);
    CHECK(emulator().outstanding().physical_bytes == 0);
    // A large request's chain, from this thread, reaches the third thread's cache.
    fill_free_park(third);
    CHECK(third.filled == 4 * pages);
    void* big = nullptr;
    CHECK_NOTHROW(big = device_allocate(pages * 2 * MiB));
    if (big != nullptr) device_deallocate(big, pages * 2 * MiB);
    leave.count_down();
    for (Parked* t : {&first, &second, &third}) t->thread.join();
    CHECK(*memory_pool_stats().current_count == 0);
  }

  TEST_CASE("17.10: a worker thread's block is usable with the driver on that thread") {
    struct Config {
      const char* tier_env;
      const char* vmm;
      const char* tier;
    };
    for (const Config& cfg : {Config{nullptr, "1", "B"}, Config{nullptr, "0", "fallback"},
                              Config{"VIBESPATIAL_GPU_MANAGED_MEMORY", "1", "C"}}) {
      CAPTURE(cfg.tier);
      FreshPool fresh(cfg.tier_env, 64 * MiB, cfg.vmm);
      REQUIRE(configure_memory_pool() == cfg.tier);  // on this thread
      void* warm = device_allocate(1000);  // so that the worker's small block is a cache hit
      device_deallocate(warm, 1000);
      CUresult had_context = CUDA_ERROR_UNKNOWN;
      CUresult small_result = CUDA_ERROR_UNKNOWN, large_result = CUDA_ERROR_UNKNOWN;
      bool small_ok = false, large_ok = false;
      std::thread([&] {
        const detail::DriverApi& api = detail::driver();
        CUcontext ctx = nullptr;
        had_context = api.cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx == nullptr
                          ? CUDA_SUCCESS
                          : CUDA_ERROR_UNKNOWN;  // a fresh thread has no context
        void* small = device_allocate(1000);
        void* large = device_allocate(3 * MiB);
        small_result = api.cuMemsetD8(reinterpret_cast<CUdeviceptr>(small), 7, 1000);
        large_result = api.cuMemsetD8(reinterpret_cast<CUdeviceptr>(large), 9, 3 * MiB);
        api.cuCtxSynchronize();
        small_ok = static_cast<unsigned char*>(small)[999] == 7;
        large_ok = static_cast<unsigned char*>(large)[3 * MiB - 1] == 9;
        device_deallocate(small, 1000);
        device_deallocate(large, 3 * MiB);
      }).join();
      CHECK(had_context == CUDA_SUCCESS);
      CHECK(small_result == CUDA_SUCCESS);
      CHECK(large_result == CUDA_SUCCESS);
      CHECK(small_ok);
      CHECK(large_ok);
    }
  }

  TEST_CASE("17.11: statistics of a device that does not exist say so") {
    FreshPool fresh;
    REQUIRE(configure_memory_pool() == "B");
    for (int device : {1, 5, 63, 64, 1000, -1}) {
      CAPTURE(device);
      const MemoryPoolStats s = memory_pool_stats(device);
      CHECK(s.device == device);
      CHECK(s.no_such_device);
      CHECK_FALSE(s.configured);
      CHECK(s.tier.empty());
      CHECK_FALSE(s.current_bytes.has_value());
      CHECK_FALSE(s.pool_size.has_value());
    }
    const MemoryPoolStats s0 = memory_pool_stats(0);
    CHECK_FALSE(s0.no_such_device);
    CHECK(s0.configured);
    CHECK(s0.tier == "B");
  }

  TEST_CASE("a large block's free in a one-device process makes no context query") {
    // The stream mark of a large free must stay cheap (a context query per free is a
    // driver call on every free of a real driver).
    FreshPool fresh(nullptr, 64 * MiB);
    CUstream s = new_stream();
    device_deallocate(device_allocate(5 * MiB, s), 5 * MiB, s);  // the thread's first mark
    void* p = large_block_with_work_held(s);                     // its free needs an event mark
    const unsigned long long before = emulator().call_count("cuCtxGetCurrent");
    device_deallocate(p, 5 * MiB, s);
    CHECK(emulator().call_count("cuCtxGetCurrent") == before);
    resume_and_destroy(s);
  }

  TEST_CASE("a thread with no context of its own frees a large block with work queued") {
    // The free records a mark: on a thread that never allocated, the pool binds the context.
    FreshPool fresh(nullptr, 64 * MiB);
    CUstream s = new_stream();
    void* p = large_block_with_work_held(s);
    std::thread([&] {
      CUcontext none = nullptr;
      REQUIRE(detail::driver().cuCtxGetCurrent(&none) == CUDA_SUCCESS);
      REQUIRE(none == nullptr);
      CHECK_NOTHROW(device_deallocate(p, 5 * MiB, s));
    }).join();
    CHECK(*memory_pool_stats().current_count == 0);
    resume_and_destroy(s);
  }

  TEST_CASE("17.13: a free that fails with a driver error changes nothing; the retry frees it") {
    struct Config {
      const char* tier_env;
      const char* vmm;
      std::size_t bytes;
      const char* fault;
      bool hold;  // keep work queued on the freeing stream (else let it finish before the free)
    };
    // Large blocks record a stream mark (an event, or a synchronisation; no context query in a
    // one-device process); tier C records one too (after a context query) and, the
    // stream being idle, calls cuMemFree in the free (with work queued it would wait for a later
    // call). Small blocks of tiers A/B free with no driver call.
    const Config configs[] = {
        {nullptr, "1", 5 * MiB, "cuEventRecord:1,cuStreamSynchronize:1,cuCtxSynchronize:1", true},
        {"VIBESPATIAL_GPU_POOL_ONLY", "1", 5 * MiB,
         "cuEventRecord:1,cuStreamSynchronize:1,cuCtxSynchronize:1", true},
        {nullptr, "0", 5000, "cuEventRecord:1,cuStreamSynchronize:1,cuCtxSynchronize:1", true},
        {"VIBESPATIAL_GPU_MANAGED_MEMORY", "1", 5000, "cuMemFree:1", false},
        {"VIBESPATIAL_GPU_MANAGED_MEMORY", "1", 5000, "cuCtxGetCurrent:1", false},
    };
    for (const Config& cfg : configs) {
      CAPTURE(cfg.fault);
      CAPTURE(cfg.vmm);
      CAPTURE(cfg.bytes);
      FreshPool fresh(cfg.tier_env, 64 * MiB, cfg.vmm);
      CUstream busy = new_stream();
      void* p = device_allocate(cfg.bytes, busy);
      fill_pattern(p, cfg.bytes, 11);
      if (cfg.hold) emulator().stream_pause(busy, 1);  // the freeing stream has work queued
      detail::driver().cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(p) + cfg.bytes - 1, 0xab, 1,
                                       busy);
      if (!cfg.hold) REQUIRE(detail::driver().cuStreamSynchronize(busy) == CUDA_SUCCESS);
      const MemoryPoolStats before = memory_pool_stats();
      REQUIRE(emulator().set_fail(cfg.fault) == 0);
      try {
        device_deallocate(p, cfg.bytes, busy);
        FAIL("expected CudaError");
      } catch (const CudaError& e) {
        CHECK(e.code() == CUDA_ERROR_UNKNOWN);  // the injected error (non-allocating entries)
      }
      CHECK(faults_fired(nullptr) >= 1);
      emulator().set_fail(nullptr);
      const MemoryPoolStats after = memory_pool_stats();
      CHECK(after.current_count == before.current_count);
      CHECK(after.current_bytes == before.current_bytes);
      CHECK(after.pool_free_bytes == before.pool_free_bytes);
      // Still live: the retry frees it, once.
      CHECK_NOTHROW(device_deallocate(p, cfg.bytes, busy));
      CHECK_THROWS_AS(device_deallocate(p, cfg.bytes, busy), std::invalid_argument);
      CHECK(*memory_pool_stats().current_count == 0);
      emulator().stream_pause(busy, 0);
      detail::driver().cuStreamSynchronize(busy);
      CHECK_NOTHROW(free_pool_memory());
      forget_stream(busy);
      detail::reset_memory_pools();
      detail::driver().cuStreamDestroy(busy);
      check_nothing_outstanding();
    }
  }

  TEST_CASE(
      "17.15: tier variables: unknown values are errors, both set gives tier C and a warning") {
    const char* const kManaged = "VIBESPATIAL_GPU_MANAGED_MEMORY";
    const char* const kPoolOnly = "VIBESPATIAL_GPU_POOL_ONLY";
    struct Case {
      const char* managed;
      const char* pool_only;
      const char* tier;  // the tier chosen, or nullptr for std::invalid_argument naming `bad`
      const char* bad;
    };
    const Case cases[] = {
        {nullptr, nullptr, "B", nullptr},
        {"0", nullptr, "B", nullptr},
        {"false", "no", "B", nullptr},
        {"OFF", "Off", "B", nullptr},
        {"1", nullptr, "C", nullptr},
        {"TRUE", nullptr, "C", nullptr},
        {"Yes", "0", "C", nullptr},
        {nullptr, "on", "A", nullptr},
        {"no", "1", "A", nullptr},
        {nullptr, "true", "A", nullptr},
        {"", nullptr, nullptr, kManaged},
        {nullptr, "", nullptr, kPoolOnly},
        {"2", nullptr, nullptr, kManaged},
        {nullptr, "enable", nullptr, kPoolOnly},
        {" 1", nullptr, nullptr, kManaged},
        {"1 ", nullptr, nullptr, kManaged},
        {"tru", "1", nullptr, kManaged},
        {"1", "ja", nullptr, kPoolOnly},
        {"\x1b[31m", nullptr, nullptr, kManaged},
    };
    for (const Case& c : cases) {
      CAPTURE(std::string(c.managed ? c.managed : "(unset)"));
      CAPTURE(std::string(c.pool_only ? c.pool_only : "(unset)"));
      FreshPool fresh;
      set_env(kManaged, c.managed);
      set_env(kPoolOnly, c.pool_only);
      if (c.tier != nullptr) {
        CHECK(configure_memory_pool() == c.tier);
        continue;
      }
      try {
        configure_memory_pool();
        FAIL("expected std::invalid_argument");
      } catch (const std::invalid_argument& e) {
        const std::string what = e.what();
        CHECK(what.find(c.bad) != std::string::npos);
        CHECK(
            std::all_of(what.begin(), what.end(), [](char ch) { return ch >= 0x20 && ch < 0x7f; }));
      }
      CHECK(memory_pool_stats().tier.empty());  // nothing cached: a corrected value works
      set_env(kManaged, nullptr);
      set_env(kPoolOnly, nullptr);
      CHECK(configure_memory_pool() == "B");
    }
    {
      FreshPool fresh;
      set_env(kManaged, "\x1b[31m");
      try {
        configure_memory_pool();
        FAIL("expected std::invalid_argument");
      } catch (const std::invalid_argument& e) {
        CHECK(std::string(e.what()).find("\\x1B[31m") != std::string::npos);
      }
    }
    {
      FreshPool fresh;
      set_env(kManaged, "yes");
      set_env(kPoolOnly, "1");
      std::string tier;
      const std::string warning = capture_stderr([&] { tier = configure_memory_pool(); });
      CHECK(tier == "C");
      CHECK(warning.find(kManaged) != std::string::npos);
      CHECK(warning.find(kPoolOnly) != std::string::npos);
      CHECK(std::count(warning.begin(), warning.end(), '\n') == 1);
    }
  }
}
