// SPDX-License-Identifier: Apache-2.0
// The pool's stream safety on the host emulator: destroyed and recycled stream handles, per-thread
// default streams, reuse behind cuStreamWaitEvent rather than growth, a scarce address space, the
// VMM self-test, and tier C's stream-ordered frees. Stream work is held with the emulator's stream
// pause (or behind an event of a paused stream), never with sleeps.
#include "pool_fixture.hpp"

#include <cstring>
#include <latch>
#include <string>
#include <thread>
#include <vector>

using namespace vibespatial::raster;
using namespace vsr_test;

namespace {

// A stream whose work waits behind a paused stream: unlike a paused stream, its work stays
// pending after it is destroyed (cuStreamDestroy releases a stream's own hold).
struct Gate {
  CUstream held = nullptr;
  CUevent event = nullptr;
  Gate() {
    held = new_stream();
    REQUIRE(emulator().stream_pause(held, 1) == 0);
    REQUIRE(detail::driver().cuEventCreate(&event, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
    REQUIRE(detail::driver().cuEventRecord(event, held) == CUDA_SUCCESS);
  }
  // Makes `s`'s later work wait for the gate to open.
  void hold(CUstream s) const {
    REQUIRE(detail::driver().cuStreamWaitEvent(s, event, 0) == CUDA_SUCCESS);
  }
  void open() {
    if (held == nullptr) return;
    emulator().stream_pause(held, 0);
    detail::driver().cuStreamSynchronize(held);
  }
  ~Gate() {
    open();
    detail::driver().cuEventDestroy(event);
    detail::driver().cuStreamDestroy(held);
  }
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;
};

// Holds a stream's work for the scope (released on the way out, also when a check fails).
class Paused {
 public:
  explicit Paused(CUstream s) : s_(s) { REQUIRE(emulator().stream_pause(s_, 1) == 0); }
  ~Paused() { release(); }
  void release() {
    if (held_) emulator().stream_pause(s_, 0);
    held_ = false;
  }
  Paused(const Paused&) = delete;
  Paused& operator=(const Paused&) = delete;

 private:
  CUstream s_;
  bool held_ = true;
};

void memset_async(void* p, unsigned char value, std::size_t n, CUstream s) {
  REQUIRE(detail::driver().cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(p), value, n, s) ==
          CUDA_SUCCESS);
}

bool all_bytes(const void* p, unsigned char value, std::size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);  // emulator device pointers are host's
  for (std::size_t i = 0; i < n; ++i) {
    if (b[i] != value) return false;
  }
  return true;
}

const std::size_t kSizes[] = {1024, 5 * MiB};  // a small block and a large one

}  // namespace

TEST_SUITE("pool") {
  TEST_CASE("a recycled stream handle does not inherit blocks its old stream's work still uses") {
    // S writes a block behind a closed gate and frees it; forget_stream(S), then S is destroyed
    // and the driver hands its handle value to the next stream S2 (as the real driver may, RMM
    // #649). S2 must not get the block until S's write has run, unless S2 waits for it.
    FreshPool fresh;
    EmulatorOption recycle("RECYCLE_HANDLES", "1");
    const detail::DriverApi& api = detail::driver();
    for (const std::size_t size : kSizes) {
      CAPTURE(size);
      Gate gate;
      CUstream s = new_stream();
      gate.hold(s);
      void* p = device_allocate(size, s);
      memset_async(p, 0xaa, size, s);  // pending behind the gate
      device_deallocate(p, size, s);
      forget_stream(s);
      REQUIRE(api.cuStreamDestroy(s) == CUDA_SUCCESS);
      CUstream s2 = new_stream();
      REQUIRE(s2 == s);  // the same handle value
      void* q = device_allocate(size, s2);
      if (q == p) CHECK(api.cuStreamQuery(s2) == CUDA_ERROR_NOT_READY);  // behind S's mark
      memset_async(q, 0x55, size, s2);
      gate.open();
      REQUIRE(api.cuStreamSynchronize(s2) == CUDA_SUCCESS);
      CHECK(all_bytes(q, 0x55, size));  // S's late write did not land in S2's block
      device_deallocate(q, size, s2);
      forget_stream(s2);
      REQUIRE(api.cuStreamDestroy(s2) == CUDA_SUCCESS);
    }
    detail::reset_memory_pools();
    check_nothing_outstanding();
  }

  TEST_CASE("a stream destroyed without forget_stream is never named by the pool again") {
    // Small blocks are freed with no driver call; their mark must be recorded while a call names
    // the stream, never later on a handle that may be dead (the pool once recorded it in
    // free_pool_memory(), on destroyed streams). A new stream (another handle value) must not
    // get blocks whose old stream's work is still pending.
    FreshPool fresh;
    // Handle values not recycled: a new stream with the old value is what forget_stream is for
    // (the test above).
    EmulatorOption no_recycling("RECYCLE_HANDLES", "0");
    const detail::DriverApi& api = detail::driver();
    const std::size_t stale_before = emulator().outstanding().stale_handles;
    for (const std::size_t size : kSizes) {
      CAPTURE(size);
      Gate gate;
      CUstream s = new_stream();
      gate.hold(s);
      std::vector<void*> blocks;
      for (int i = 0; i < 4; ++i) blocks.push_back(device_allocate(size, s));
      for (void* p : blocks) memset_async(p, 0xaa, size, s);
      for (void* p : blocks) device_deallocate(p, size, s);
      REQUIRE(api.cuStreamDestroy(s) == CUDA_SUCCESS);  // its work is still queued
      CUstream s2 = new_stream();
      REQUIRE(s2 != s);
      std::vector<void*> taken;
      for (int i = 0; i < 4; ++i) {
        void* q = device_allocate(size, s2);
        memset_async(q, 0x55, size, s2);
        taken.push_back(q);
      }
      gate.open();
      REQUIRE(api.cuCtxSynchronize() == CUDA_SUCCESS);
      for (void* q : taken) CHECK(all_bytes(q, 0x55, size));
      for (void* q : taken) device_deallocate(q, size, s2);
      // Gives back the pages freed on the destroyed stream too (their work has run).
      CHECK_NOTHROW(free_pool_memory());
      forget_stream(s2);
      REQUIRE(api.cuStreamDestroy(s2) == CUDA_SUCCESS);
      CHECK(emulator().outstanding().stale_handles == stale_before);
    }
    CHECK_NOTHROW(free_pool_memory());
    CHECK(*memory_pool_stats().pool_size == 0);
    detail::reset_memory_pools();
    CHECK(emulator().outstanding().stale_handles == stale_before);
    check_nothing_outstanding();
  }

  TEST_CASE("per-thread default streams are one stream per thread") {
    // A block freed on thread A's per-thread stream, with A's write still pending, is not "the
    // same stream" for thread B's per-thread stream (both name CU_STREAM_PER_THREAD).
    FreshPool fresh;
    EmulatorOption async("ASYNC_DEFAULT_STREAMS", "1");
    const detail::DriverApi& api = detail::driver();
    constexpr std::size_t size = 5 * MiB;
    void* freed = nullptr;
    std::latch a_freed(1), b_allocated(1);
    std::thread a([&] {
      detail::bind_current_device();
      REQUIRE(emulator().stream_pause(CU_STREAM_PER_THREAD, 1) == 0);
      void* p = device_allocate(size, CU_STREAM_PER_THREAD);
      memset_async(p, 0xaa, size, CU_STREAM_PER_THREAD);  // pending: A's stream is held
      device_deallocate(p, size, CU_STREAM_PER_THREAD);
      freed = p;
      a_freed.count_down();
      b_allocated.wait();
      REQUIRE(emulator().stream_pause(CU_STREAM_PER_THREAD, 0) == 0);
      REQUIRE(api.cuStreamSynchronize(CU_STREAM_PER_THREAD) == CUDA_SUCCESS);
    });
    a_freed.wait();
    detail::bind_current_device();
    void* q = device_allocate(size, CU_STREAM_PER_THREAD);
    if (q == freed) CHECK(api.cuStreamQuery(CU_STREAM_PER_THREAD) == CUDA_ERROR_NOT_READY);
    memset_async(q, 0x55, size, CU_STREAM_PER_THREAD);
    b_allocated.count_down();
    a.join();
    REQUIRE(api.cuStreamSynchronize(CU_STREAM_PER_THREAD) == CUDA_SUCCESS);
    CHECK(all_bytes(q, 0x55, size));  // A's late write did not land in B's block
    device_deallocate(q, size, CU_STREAM_PER_THREAD);
    REQUIRE(api.cuCtxSynchronize() == CUDA_SUCCESS);
  }

  TEST_CASE("a full pool reuses a block freed on a busy stream behind a wait, not new memory") {
    // Tier A (no OOM chain): the device holds one large block, freed on s1 with s1's write still
    // pending. A request on s2 must get it with s2 made to wait for s1's free
    // (cuStreamWaitEvent), not fail for want of memory; also where address space is too short
    // to reserve a second window for the pages (1.5 x device memory).
    for (const char* address_space : {"0", "1.5x"}) {
      CAPTURE(address_space);
      FreshPool fresh("VIBESPATIAL_GPU_POOL_ONLY", 64 * MiB);
      EmulatorOption limit("ADDRESS_SPACE", address_space);
      const detail::DriverApi& api = detail::driver();
      const std::size_t size = driver_free_bytes() / (2 * MiB) * (2 * MiB);
      CUstream s1 = new_stream(), s2 = new_stream();
      void* p = device_allocate(size, s1);
      const std::size_t held = *memory_pool_stats().pool_size;
      Paused hold(s1);
      memset_async(p, 0xaa, size, s1);
      device_deallocate(p, size, s1);
      void* q = nullptr;
      REQUIRE_NOTHROW(q = device_allocate(size, s2));
      CHECK(q == p);
      CHECK(api.cuStreamQuery(s2) == CUDA_ERROR_NOT_READY);  // waits for s1's free
      CHECK(*memory_pool_stats().pool_size == held);         // no new memory
      memset_async(q, 0x55, size, s2);
      hold.release();
      REQUIRE(api.cuStreamSynchronize(s2) == CUDA_SUCCESS);
      CHECK(all_bytes(q, 0x55, size));  // ordered after s1's write
      device_deallocate(q, size, s2);
      for (CUstream s : {s1, s2}) {
        api.cuStreamSynchronize(s);
        forget_stream(s);
        api.cuStreamDestroy(s);
      }
      detail::reset_memory_pools();
      check_nothing_outstanding();
    }
  }

  TEST_CASE("the pool works within an address space of 1.5 x device memory") {
    // A real driver may refuse large reservations (§3.4.2). Every small size class, 2 MiB of each
    // (a small region fills), the rest of the device in large blocks, and a request that needs
    // free pages remapped into a fresh range must all work.
    FreshPool fresh("VIBESPATIAL_GPU_POOL_ONLY", 64 * MiB);
    EmulatorOption limit("ADDRESS_SPACE", "1.5x");
    std::vector<std::pair<void*, std::size_t>> small;
    for (std::size_t b = 256; b <= 512 * 1024; b *= 2) {
      for (std::size_t i = 0; i < 2 * MiB / b; ++i) {
        void* p = nullptr;
        REQUIRE_NOTHROW(p = device_allocate(b));
        fill_pattern(p, b, static_cast<std::uint32_t>(b));
        small.emplace_back(p, b);
      }
    }
    const std::size_t page = 2 * MiB;
    const int n = static_cast<int>(driver_free_bytes() / page);
    REQUIRE(n >= 8);
    std::vector<void*> blocks;
    for (int i = 0; i < n; ++i) {
      void* p = nullptr;
      REQUIRE_NOTHROW(p = device_allocate(page));
      fill_pattern(p, page, static_cast<std::uint32_t>(i));
      blocks.push_back(p);
    }
    CHECK_THROWS_AS(device_allocate(page), OutOfMemoryError);  // truly full
    int freed = 0;
    for (int i = 0; i < n; i += 2, ++freed)
      device_deallocate(blocks[static_cast<std::size_t>(i)], page);
    const std::size_t big_bytes = static_cast<std::size_t>(freed) * page;
    void* big = nullptr;
    REQUIRE_NOTHROW(big = device_allocate(big_bytes));  // the freed pages, in a fresh range
    fill_pattern(big, big_bytes, 7);
    for (int i = 1; i < n; i += 2) {
      CHECK(
          check_pattern(blocks[static_cast<std::size_t>(i)], page, static_cast<std::uint32_t>(i)));
    }
    for (const auto& [p, b] : small) CHECK(check_pattern(p, b, static_cast<std::uint32_t>(b)));
    CHECK(check_pattern(big, big_bytes, 7));
    device_deallocate(big, big_bytes);
    for (int i = 1; i < n; i += 2) device_deallocate(blocks[static_cast<std::size_t>(i)], page);
    for (const auto& [p, b] : small) device_deallocate(p, b);
    CHECK_NOTHROW(free_pool_memory());
    detail::reset_memory_pools();
    check_nothing_outstanding();
  }

  TEST_CASE("a device whose VMM calls fail despite claiming support gets the fallback tier") {
    // Sandboxed drivers may claim VMM support and then refuse the calls (§7 #8, #9): a one-page
    // self-test at configuration sends the process to the fallback tier, and the stats say why.
    const char* const faults[] = {"cuMemCreate:1+:CUDA_ERROR_NOT_SUPPORTED",
                                  "cuMemMap:1+:CUDA_ERROR_NOT_SUPPORTED",
                                  "cuMemSetAccess:1+:CUDA_ERROR_NOT_PERMITTED"};
    for (const char* fault : faults) {
      CAPTURE(fault);
      FreshPool fresh;
      REQUIRE(emulator().set_fail(fault) == 0);
      CHECK(configure_memory_pool() == "fallback");
      const std::string call(fault, std::strchr(fault, ':'));
      CHECK(faults_fired(call.c_str()) >= 1);  // the self-test's call was made to fail
      const MemoryPoolStats s = memory_pool_stats();
      CHECK(s.tier == "fallback");
      CHECK(s.tier_reason.find("VMM self-test failed") != std::string::npos);
      CHECK(s.tier_reason.find(call) != std::string::npos);
      void* p = nullptr;
      REQUIRE_NOTHROW(p = device_allocate(3 * MiB));
      fill_pattern(p, 3 * MiB, 3);
      CHECK(check_pattern(p, 3 * MiB, 3));
      device_deallocate(p, 3 * MiB);
      detail::reset_memory_pools();
      emulator().set_fail(nullptr);
      check_nothing_outstanding();
    }
    FreshPool fresh;
    CHECK(configure_memory_pool() == "B");
    CHECK(memory_pool_stats().tier_reason.find("supports virtual memory management") !=
          std::string::npos);
  }

  TEST_CASE("tier C frees in stream order: cuMemFree only after the stream's work") {
    // cuMemFree need not wait for queued work (VSR_EMU_FREE_NO_SYNC): a block freed on a busy
    // stream is released only once the stream's work has run, by a later call of the pool.
    FreshPool fresh("VIBESPATIAL_GPU_MANAGED_MEMORY");
    EmulatorOption no_sync("FREE_NO_SYNC", "1");
    const detail::DriverApi& api = detail::driver();
    const std::size_t unmap_before = emulator().outstanding().unmap_with_pending_work;
    CUstream s = new_stream();
    void* p = device_allocate(3 * MiB, s);
    Paused hold(s);
    memset_async(p, 0xaa, 3 * MiB, s);
    device_deallocate(p, 3 * MiB, s);
    CHECK(emulator().outstanding().managed == 1);  // not yet released: s's write is pending
    void* r = device_allocate(MiB);                // a later call: s's work is still pending
    CHECK(emulator().outstanding().managed == 2);
    hold.release();
    REQUIRE(api.cuStreamSynchronize(s) == CUDA_SUCCESS);
    CHECK_NOTHROW(free_pool_memory());  // releases the block whose stream's work has run
    CHECK(emulator().outstanding().managed == 1);
    device_deallocate(r, MiB);  // the legacy stream is idle: released at once
    CHECK(emulator().outstanding().managed == 0);
    CHECK(emulator().outstanding().unmap_with_pending_work == unmap_before);
    forget_stream(s);
    api.cuStreamDestroy(s);
    detail::reset_memory_pools();
    check_nothing_outstanding();
  }
}
