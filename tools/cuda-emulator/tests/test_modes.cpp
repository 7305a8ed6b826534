// SPDX-License-Identifier: Apache-2.0
// Self-tests of the emulator's adversarial modes and misuse counters (vsr_emulator.h). Each case
// sets the options it needs at run time and puts them back, so the cases run in every
// configuration of the 'emulator' suite. Ordering comes from held streams (a host function
// waiting on a gate, or vsr_emu_stream_pause) and from vsr_emu_waiting_threads, never from sleeps.
#include "emulator_driver.hpp"
#include "vsr_emulator.h"

#include <cuda.h>

#include <doctest/doctest.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using namespace vsr_emu_test;

namespace {

// A host function that holds its stream until release() (an ordinary driver-API way to keep
// work queued, usable on a real GPU too).
class Gate {
 public:
  static void hold(void* self) {
    auto* g = static_cast<Gate*>(self);
    std::unique_lock lock(g->mutex_);
    g->entered_ = true;
    g->cv_.notify_all();
    g->cv_.wait(lock, [g] { return g->open_; });
  }
  void release() {
    std::lock_guard lock(mutex_);
    open_ = true;
    cv_.notify_all();
  }
  bool entered() {
    std::lock_guard lock(mutex_);
    return entered_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false;
  bool entered_ = false;
};

void set_flag(void* flag) {
  static_cast<std::atomic<int>*>(flag)->store(1);
}

size_t stale() {
  return outstanding().stale_handles;
}
size_t pending_unmaps() {
  return outstanding().unmap_with_pending_work;
}

// Runs `call` on a new thread that has a current context. Returns once the call is either seen
// blocked inside the emulator (vsr_emu_waiting_threads rose) or finished; the thread is joined by
// the returned object's destructor.
class BlockingCall {
 public:
  explicit BlockingCall(std::function<void()> call) {
    REQUIRE_MESSAGE((drv().waiting_threads != nullptr), "no vsr_emu_waiting_threads");
    const unsigned long long before = drv().waiting_threads();
    thread_ = std::thread([this, call = std::move(call)] {
      use_device();
      call();
      finished_ = true;
    });
    while (!finished_.load() && drv().waiting_threads() <= before) std::this_thread::yield();
    blocked_ = !finished_.load();
  }
  ~BlockingCall() { join(); }
  BlockingCall(const BlockingCall&) = delete;
  BlockingCall& operator=(const BlockingCall&) = delete;
  // Whether the call was still blocked when it was first seen waiting.
  bool blocked() const { return blocked_; }
  void join() {
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::thread thread_;
  std::atomic<bool> finished_{false};
  bool blocked_ = false;
};

std::string describe() {
  return drv().describe();
}

}  // namespace

TEST_CASE("modes: a destroyed stream or event is a tombstone; later uses count as stale") {
  Driver& d = drv();
  use_device();
  Options opt;
  opt.set("RECYCLE_HANDLES", "0");
  CUstream s = nullptr;
  CUevent e = nullptr;
  REQUIRE_CU(d.stream_create(&s, CU_STREAM_NON_BLOCKING));
  REQUIRE_CU(d.event_create(&e, CU_EVENT_DISABLE_TIMING));
  REQUIRE_CU(d.stream_destroy(s));
  REQUIRE_CU(d.event_destroy(e));
  const size_t before = stale();
  CUevent live = nullptr;
  REQUIRE_CU(d.event_create(&live, 0));
  CHECK(live != e);  // not recycled in this mode
  CHECK_CU(d.stream_query(s), CUDA_ERROR_INVALID_HANDLE);
  CHECK_CU(d.stream_synchronize(s), CUDA_ERROR_INVALID_HANDLE);
  CHECK_CU(d.event_record(live, s), CUDA_ERROR_INVALID_HANDLE);
  CHECK_CU(d.event_query(e), CUDA_ERROR_INVALID_HANDLE);
  CHECK_CU(d.event_record(e, nullptr), CUDA_ERROR_INVALID_HANDLE);
  CHECK_CU(d.stream_destroy(s), CUDA_ERROR_INVALID_HANDLE);
  CHECK_CU(d.event_destroy(e), CUDA_ERROR_INVALID_HANDLE);
  CHECK(stale() == before + 7);
  // A value that was never a handle is invalid but not stale.
  CHECK_CU(d.stream_query(reinterpret_cast<CUstream>(0x10)), CUDA_ERROR_INVALID_HANDLE);
  CHECK(stale() == before + 7);
  // A released cuMemCreate handle is stale too (a second cuMemRelease is undefined behaviour).
  const size_t g = min_granularity();
  CUmemAllocationProp prop = device_prop();
  CUmemGenericAllocationHandle h = 0;
  REQUIRE_CU(d.create(&h, g, &prop, 0));
  REQUIRE_CU(d.release(h));
  CHECK_CU(d.release(h), CUDA_ERROR_INVALID_VALUE);
  CUdeviceptr va = 0;
  REQUIRE_CU(d.reserve(&va, g, 0, 0, 0));
  CHECK_CU(d.map(va, g, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK(stale() == before + 9);
  REQUIRE_CU(d.address_free(va, g));
  REQUIRE_CU(d.event_destroy(live));
  check_nothing_outstanding();
}

TEST_CASE("modes: ABORT_ON_MISUSE aborts with the entry point and the handle") {
  Driver& d = drv();
  use_device();
  CUstream s = nullptr;
  REQUIRE_CU(d.stream_create(&s, CU_STREAM_NON_BLOCKING));
  REQUIRE_CU(d.stream_destroy(s));
  int pipe_fds[2];
  REQUIRE(pipe(pipe_fds) == 0);
  std::fflush(nullptr);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // The child only makes calls that need no stream worker (fork keeps this thread only).
    const rlimit no_core{0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    std::signal(SIGABRT, SIG_DFL);  // not doctest's crash report
    dup2(pipe_fds[1], STDERR_FILENO);
    d.set_option("ABORT_ON_MISUSE", "1");
    d.stream_query(s);
    std::_Exit(0);  // not reached when the misuse aborts
  }
  close(pipe_fds[1]);
  std::string err;
  char buf[256];
  for (ssize_t n; (n = read(pipe_fds[0], buf, sizeof buf)) > 0;) err.append(buf, buf + n);
  close(pipe_fds[0]);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGABRT);
  INFO(err);
  CHECK(err.find("cuStreamQuery") != std::string::npos);
  CHECK(err.find("was destroyed") != std::string::npos);
}

TEST_CASE("modes: RECYCLE_HANDLES gives a destroyed stream's value to the next stream at once") {
  Driver& d = drv();
  use_device();
  Options opt;
  opt.set("RECYCLE_HANDLES", "1").set("SYNC", "0");
  const size_t n = 4096;
  CUdeviceptr a = 0;
  CUdeviceptr b = 0;
  REQUIRE_CU(d.alloc(&a, n));
  REQUIRE_CU(d.alloc(&b, n));
  REQUIRE_CU(d.memset8(a, 0, n));
  REQUIRE_CU(d.memset8(b, 0, n));
  REQUIRE_CU(d.ctx_synchronize());
  CUstream s1 = nullptr;
  REQUIRE_CU(d.stream_create(&s1, CU_STREAM_NON_BLOCKING));
  Gate gate;
  REQUIRE_CU(d.launch_host_func(s1, &Gate::hold, &gate));
  REQUIRE_CU(d.memset8_async(a, 0x11, n, s1));
  REQUIRE_CU(d.stream_destroy(s1));  // returns at once; its work stays queued behind the gate
  CUstream s2 = nullptr;
  REQUIRE_CU(d.stream_create(&s2, CU_STREAM_NON_BLOCKING));
  CHECK(s2 == s1);  // the same value, while s1's work is still queued (RMM #649)
  REQUIRE_CU(d.memset8_async(b, 0x22, n, s2));
  REQUIRE_CU(d.stream_synchronize(s2));  // the new stream does not wait for the old one's work
  CHECK(reinterpret_cast<const unsigned char*>(b)[0] == 0x22);
  CHECK(reinterpret_cast<const unsigned char*>(a)[0] == 0);
  CHECK_CU(d.stream_query(s2), CUDA_SUCCESS);  // names the new stream: not stale
  gate.release();
  REQUIRE_CU(d.ctx_synchronize());
  CHECK(reinterpret_cast<const unsigned char*>(a)[n - 1] == 0x11);
  // Events are recycled the same way.
  CUevent e1 = nullptr;
  CUevent e2 = nullptr;
  REQUIRE_CU(d.event_create(&e1, 0));
  REQUIRE_CU(d.event_destroy(e1));
  REQUIRE_CU(d.event_create(&e2, 0));
  CHECK(e2 == e1);
  REQUIRE_CU(d.event_destroy(e2));
  REQUIRE_CU(d.stream_destroy(s2));
  REQUIRE_CU(d.free(a));
  REQUIRE_CU(d.free(b));
  check_nothing_outstanding();
}

TEST_CASE("modes: cuCtxSynchronize waits for work still queued on a destroyed stream") {
  Driver& d = drv();
  use_device();
  Options opt;
  opt.set("SYNC", "0");
  CUstream s = nullptr;
  REQUIRE_CU(d.stream_create(&s, CU_STREAM_NON_BLOCKING));
  Gate gate;
  std::atomic<int> done{0};
  REQUIRE_CU(d.launch_host_func(s, &Gate::hold, &gate));
  REQUIRE_CU(d.launch_host_func(s, &set_flag, &done));
  REQUIRE_CU(d.stream_destroy(s));
  std::atomic<int> seen{-1};
  std::atomic<int> result{-1};
  BlockingCall call([&] {
    result = d.ctx_synchronize();
    seen = done.load();
  });
  CHECK(call.blocked());  // it waits for the destroyed stream's queued work
  gate.release();
  call.join();
  CHECK(result.load() == CUDA_SUCCESS);
  CHECK(seen.load() == 1);  // and returns only after that work ran
  check_nothing_outstanding();
}

TEST_CASE("modes: ASYNC_DEFAULT_STREAMS queues the legacy stream's work on a worker") {
  Driver& d = drv();
  use_device();
  {
    Options off;
    off.set("ASYNC_DEFAULT_STREAMS", "0");
    CHECK(d.stream_pause(nullptr, 1) == CUDA_ERROR_NOT_SUPPORTED);
  }
  Options opt;
  opt.set("ASYNC_DEFAULT_STREAMS", "1").set("SYNC", "0");
  const size_t n = 1 << 16;
  CUdeviceptr p = 0;
  REQUIRE_CU(d.alloc(&p, n));
  REQUIRE_CU(d.memset8(p, 0, n));
  REQUIRE_CU(d.ctx_synchronize());
  CUstream blocking = nullptr;
  CUstream nonblocking = nullptr;
  REQUIRE_CU(d.stream_create(&blocking, CU_STREAM_DEFAULT));
  REQUIRE_CU(d.stream_create(&nonblocking, CU_STREAM_NON_BLOCKING));
  CUevent e = nullptr;
  REQUIRE_CU(d.event_create(&e, CU_EVENT_DISABLE_TIMING));

  // A held legacy stream: memset and event record return at once and stay pending.
  REQUIRE(d.stream_pause(nullptr, 1) == 0);
  REQUIRE_CU(d.memset8(p, 0x5a, n));
  REQUIRE_CU(d.event_record(e, nullptr));
  CHECK_CU(d.event_query(e), CUDA_ERROR_NOT_READY);
  CHECK_CU(d.stream_query(nullptr), CUDA_ERROR_NOT_READY);
  CHECK_CU(d.stream_query(CU_STREAM_LEGACY), CUDA_ERROR_NOT_READY);
  CHECK(reinterpret_cast<const unsigned char*>(p)[0] == 0);
  // A CU_STREAM_DEFAULT stream's later work waits behind the legacy stream; a non-blocking
  // stream's does not.
  std::atomic<int> blocking_ran{0};
  std::atomic<int> nonblocking_ran{0};
  REQUIRE_CU(d.launch_host_func(blocking, &set_flag, &blocking_ran));
  REQUIRE_CU(d.launch_host_func(nonblocking, &set_flag, &nonblocking_ran));
  REQUIRE_CU(d.stream_synchronize(nonblocking));
  CHECK(nonblocking_ran.load() == 1);
  CHECK_CU(d.stream_query(blocking), CUDA_ERROR_NOT_READY);
  CHECK(blocking_ran.load() == 0);
  REQUIRE(d.stream_pause(nullptr, 0) == 0);
  REQUIRE_CU(d.stream_synchronize(blocking));
  CHECK(blocking_ran.load() == 1);
  CHECK_CU(d.event_query(e), CUDA_SUCCESS);
  CHECK(reinterpret_cast<const unsigned char*>(p)[n - 1] == 0x5a);

  // The other way round: legacy work waits behind a held blocking stream, on the worker; the
  // caller is not blocked.
  REQUIRE(d.stream_pause(blocking, 1) == 0);
  REQUIRE_CU(d.memset8_async(p, 0x01, n, blocking));
  REQUIRE_CU(d.memset8(p, 0x02, n));  // ordered after the blocking stream's memset
  REQUIRE_CU(d.event_record(e, nullptr));
  CHECK_CU(d.event_query(e), CUDA_ERROR_NOT_READY);
  nonblocking_ran = 0;
  REQUIRE_CU(d.launch_host_func(nonblocking, &set_flag, &nonblocking_ran));
  REQUIRE_CU(d.stream_synchronize(nonblocking));
  CHECK(nonblocking_ran.load() == 1);
  REQUIRE(d.stream_pause(blocking, 0) == 0);
  REQUIRE_CU(d.event_synchronize(e));
  CHECK(reinterpret_cast<const unsigned char*>(p)[0] == 0x02);

  // cuMemcpyHtoD from pageable memory returns once the source is read; cuMemcpyDtoH once done.
  REQUIRE(d.stream_pause(nullptr, 1) == 0);
  std::vector<unsigned char> src(n, 0x77);
  REQUIRE_CU(d.htod(p, src.data(), n));
  src.assign(n, 0x99);  // too late to change what is copied
  REQUIRE(d.stream_pause(nullptr, 0) == 0);
  std::vector<unsigned char> back(n, 0);
  REQUIRE_CU(d.dtoh(back.data(), p, n));
  CHECK(back[0] == 0x77);
  CHECK(back[n - 1] == 0x77);

  REQUIRE_CU(d.event_destroy(e));
  REQUIRE_CU(d.stream_destroy(blocking));
  REQUIRE_CU(d.stream_destroy(nonblocking));
  REQUIRE_CU(d.free(p));
  check_nothing_outstanding();
}

TEST_CASE("modes: the per-thread default stream is one stream per thread") {
  Driver& d = drv();
  use_device();
  Options opt;
  opt.set("ASYNC_DEFAULT_STREAMS", "1").set("SYNC", "0");
  CUevent mine = nullptr;
  CUevent theirs = nullptr;
  REQUIRE_CU(d.event_create(&mine, CU_EVENT_DISABLE_TIMING));
  REQUIRE_CU(d.event_create(&theirs, CU_EVENT_DISABLE_TIMING));
  std::mutex m;
  std::condition_variable cv;
  int step = 0;  // 1: other thread's stream held with work recorded; 2: may release
  std::thread other([&] {
    use_device();
    CHECK(d.stream_pause(CU_STREAM_PER_THREAD, 1) == 0);
    CHECK_CU(d.event_record(theirs, CU_STREAM_PER_THREAD), CUDA_SUCCESS);
    CHECK_CU(d.stream_query_ptsz(nullptr), CUDA_ERROR_NOT_READY);
    std::unique_lock lock(m);
    step = 1;
    cv.notify_all();
    cv.wait(lock, [&] { return step == 2; });
    CHECK(d.stream_pause(CU_STREAM_PER_THREAD, 0) == 0);
    CHECK_CU(d.stream_synchronize_ptsz(nullptr), CUDA_SUCCESS);
  });
  {
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return step == 1; });
  }
  // The same handle value names this thread's own, idle stream.
  CHECK_CU(d.stream_query(CU_STREAM_PER_THREAD), CUDA_SUCCESS);
  CHECK_CU(d.stream_query_ptsz(nullptr), CUDA_SUCCESS);
  REQUIRE_CU(d.event_record_ptsz(mine, nullptr));
  REQUIRE_CU(d.stream_synchronize(CU_STREAM_PER_THREAD));
  CHECK_CU(d.event_query(mine), CUDA_SUCCESS);
  CHECK_CU(d.event_query(theirs), CUDA_ERROR_NOT_READY);
  {
    std::lock_guard lock(m);
    step = 2;
    cv.notify_all();
  }
  other.join();
  CHECK_CU(d.event_query(theirs), CUDA_SUCCESS);
  REQUIRE_CU(d.event_destroy(mine));
  REQUIRE_CU(d.event_destroy(theirs));
  check_nothing_outstanding();
}

TEST_CASE("modes: unmapping, freeing or releasing memory under queued work is counted") {
  Driver& d = drv();
  use_device();
  Options opt;
  opt.set("SYNC", "0").set("STICKY", "0");
  const size_t g = min_granularity();
  CUstream s = nullptr;
  REQUIRE_CU(d.stream_create(&s, CU_STREAM_NON_BLOCKING));
  CUmemAllocationProp prop = device_prop();
  CUmemAccessDesc rw = access(0);

  SUBCASE("work that completed before the unmap is not counted") {
    const size_t before = pending_unmaps();
    Mapped m(g);
    REQUIRE_CU(d.memset8_async(m.va, 1, g, s));
    REQUIRE_CU(d.stream_synchronize(s));
    // Queued work elsewhere does not count either.
    Mapped other(g);
    REQUIRE(d.stream_pause(s, 1) == 0);
    REQUIRE_CU(d.memset8_async(other.va, 2, g, s));
    REQUIRE_CU(d.unmap(m.va, m.size));
    CHECK(pending_unmaps() == before);
    REQUIRE_CU(d.map(m.va, m.size, 0, m.handle, 0));
    REQUIRE(d.stream_pause(s, 0) == 0);
    REQUIRE_CU(d.stream_synchronize(s));
  }

  SUBCASE("unmap and remap under a queued memset: the stale write lands in the new handle") {
    const size_t before = pending_unmaps();
    CUmemGenericAllocationHandle h1 = 0;
    CUmemGenericAllocationHandle h2 = 0;
    CUdeviceptr va = 0;
    REQUIRE_CU(d.create(&h1, g, &prop, 0));
    REQUIRE_CU(d.create(&h2, g, &prop, 0));
    REQUIRE_CU(d.reserve(&va, g, 0, 0, 0));
    REQUIRE_CU(d.map(va, g, 0, h1, 0));
    REQUIRE_CU(d.set_access(va, g, &rw, 1));
    REQUIRE(d.stream_pause(s, 1) == 0);
    REQUIRE_CU(d.memset8_async(va, 0xcd, g, s));
    REQUIRE_CU(d.unmap(va, g));
    CHECK(pending_unmaps() == before + 1);
    REQUIRE_CU(d.map(va, g, 0, h2, 0));
    REQUIRE_CU(d.set_access(va, g, &rw, 1));
    REQUIRE_CU(d.memset8(va, 0, g));
    REQUIRE_CU(d.stream_synchronize(nullptr));  // s is non-blocking: this does not wait for it
    REQUIRE(d.stream_pause(s, 0) == 0);
    REQUIRE_CU(d.stream_synchronize(s));
    CHECK(reinterpret_cast<const unsigned char*>(va)[0] == 0xcd);  // the hazard itself
    REQUIRE_CU(d.unmap(va, g));
    REQUIRE_CU(d.release(h1));
    REQUIRE_CU(d.release(h2));
    REQUIRE_CU(d.address_free(va, g));
  }

  SUBCASE("unmap, release and address free under a queued copy count once each") {
    const size_t before = pending_unmaps();
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr va = 0;
    REQUIRE_CU(d.create(&h, g, &prop, 0));
    REQUIRE_CU(d.reserve(&va, g, 0, 0, 0));
    REQUIRE_CU(d.map(va, g, 0, h, 0));
    REQUIRE_CU(d.set_access(va, g, &rw, 1));
    std::vector<unsigned char> host(256, 0);
    REQUIRE(d.stream_pause(s, 1) == 0);
    REQUIRE_CU(d.dtoh_async(host.data(), va, host.size(), s));
    REQUIRE_CU(d.unmap(va, g));
    CHECK(pending_unmaps() == before + 1);
    REQUIRE_CU(d.release(h));  // frees the memory the queued copy reads
    CHECK(pending_unmaps() == before + 2);
    REQUIRE_CU(d.address_free(va, g));
    CHECK(pending_unmaps() == before + 3);
    REQUIRE(d.stream_pause(s, 0) == 0);
    // The copy finds no memory when it runs (STICKY=0: a pending INVALID_VALUE, not a fault).
    CHECK_CU(d.stream_synchronize(s), CUDA_ERROR_INVALID_VALUE);
  }

  SUBCASE("cuMemFree waits for queued work unless FREE_NO_SYNC; async memory never waits") {
    const size_t before = pending_unmaps();
    CUdeviceptr p = 0;
    REQUIRE_CU(d.alloc(&p, 4096));
    {
      Options sync_free;
      sync_free.set("FREE_NO_SYNC", "0");
      REQUIRE(d.stream_pause(s, 1) == 0);
      REQUIRE_CU(d.memset8_async(p, 3, 4096, s));
      std::atomic<int> result{-1};
      BlockingCall call([&] { result = d.free(p); });
      CHECK(call.blocked());
      REQUIRE(d.stream_pause(s, 0) == 0);
      call.join();
      CHECK(result.load() == CUDA_SUCCESS);
      CHECK(pending_unmaps() == before);
    }
    {
      Options no_sync;
      no_sync.set("FREE_NO_SYNC", "1");
      REQUIRE_CU(d.alloc(&p, 4096));
      REQUIRE(d.stream_pause(s, 1) == 0);
      REQUIRE_CU(d.memset8_async(p, 4, 4096, s));
      REQUIRE_CU(d.free(p));  // returns although the memset is held
      CHECK(pending_unmaps() == before + 1);
      REQUIRE(d.stream_pause(s, 0) == 0);
      CHECK_CU(d.stream_synchronize(s), CUDA_ERROR_INVALID_VALUE);
    }
    {
      Options sync_free;
      sync_free.set("FREE_NO_SYNC", "0");
      REQUIRE_CU(d.alloc_async(&p, 4096, s));
      REQUIRE_CU(d.stream_synchronize(s));
      REQUIRE(d.stream_pause(s, 1) == 0);
      REQUIRE_CU(d.memset8_async(p, 5, 4096, s));
      REQUIRE_CU(d.free(p));  // stream-ordered memory: no implicit synchronisation (§3.5)
      CHECK(pending_unmaps() == before + 2);
      REQUIRE(d.stream_pause(s, 0) == 0);
      CHECK_CU(d.stream_synchronize(s), CUDA_ERROR_INVALID_VALUE);
    }
  }
  REQUIRE_CU(d.stream_destroy(s));
  check_nothing_outstanding();
}

TEST_CASE("modes: ADDRESS_SPACE limits live reservations") {
  Driver& d = drv();
  use_device();
  const size_t g = min_granularity();
  Options opt;
  opt.set("ADDRESS_SPACE", std::to_string(4 * g).c_str());
  CUdeviceptr a = 0;
  CUdeviceptr b = 0;
  REQUIRE_CU(d.reserve(&a, 3 * g, 0, 0, 0));
  CHECK_CU(d.reserve(&b, 2 * g, 0, 0, 0), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(b == 0);
  REQUIRE_CU(d.reserve(&b, g, 0, 0, 0));
  REQUIRE_CU(d.address_free(a, 3 * g));
  REQUIRE_CU(d.reserve(&a, 3 * g, 0, 0, 0));
  REQUIRE_CU(d.address_free(a, 3 * g));
  REQUIRE_CU(d.address_free(b, g));
  // A multiple of all devices' memory.
  opt.set("ADDRESS_SPACE", "1.5x");
  size_t f = 0;
  size_t total = 0;
  REQUIRE_CU(d.mem_get_info(&f, &total));
  const size_t all = total * static_cast<size_t>(device_count());
  REQUIRE_CU(d.reserve(&a, all, 0, 0, 0));
  CHECK_CU(d.reserve(&b, all, 0, 0, 0), CUDA_ERROR_OUT_OF_MEMORY);
  REQUIRE_CU(d.reserve(&b, all / 2, 0, 0, 0));
  REQUIRE_CU(d.address_free(a, all));
  REQUIRE_CU(d.address_free(b, all / 2));
  CHECK(d.set_option("ADDRESS_SPACE", "-1x") == CUDA_ERROR_INVALID_VALUE);
  CHECK(d.set_option("ADDRESS_SPACE", "lots") == CUDA_ERROR_INVALID_VALUE);
  check_nothing_outstanding();
}

TEST_CASE("modes: LATENCY makes the named entry points spend the given time") {
  Driver& d = drv();
  use_device();
  Options opt;
  opt.set("LATENCY", "cuMemGetInfo_v2:30ms, cuStreamQuery:1us");
  CHECK(describe().find("latency_entries=2") != std::string::npos);
  size_t f = 0;
  size_t t = 0;
  const auto start = std::chrono::steady_clock::now();
  REQUIRE_CU(d.mem_get_info(&f, &t));
  CHECK(std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(30));
  opt.set("LATENCY", "a100");
  CHECK(describe().find("latency_entries=5") != std::string::npos);
  for (const char* bad : {"cuMemMap", "cuMemMap:", "cuMemMap:5", "cuMemMap:5xs", ":5us",
                          "cuMemMap:-5us", "cuMemMap:120s"}) {
    CAPTURE(bad);
    CHECK(d.set_option("LATENCY", bad) == CUDA_ERROR_INVALID_VALUE);
  }
  opt.set("LATENCY", "");
  CHECK(describe().find("latency_entries=0") != std::string::npos);
}

TEST_CASE("modes: cuMemSetAccess and cuMemUnmap take whole mappings inside one reservation") {
  Driver& d = drv();
  use_device();
  const size_t g = min_granularity();
  CUmemAllocationProp prop = device_prop();
  CUmemAccessDesc rw = access(0);
  // Two adjacent reservations (hints are honoured when free), each mapped at the seam.
  CUdeviceptr area = 0;
  REQUIRE_CU(d.reserve(&area, 4 * g, 0, 0, 0));
  REQUIRE_CU(d.address_free(area, 4 * g));
  CUdeviceptr a = 0;
  CUdeviceptr b = 0;
  REQUIRE_CU(d.reserve(&a, 2 * g, 0, area, 0));
  REQUIRE_CU(d.reserve(&b, 2 * g, 0, area + 2 * g, 0));
  REQUIRE(a == area);
  REQUIRE(b == a + 2 * g);
  CUmemGenericAllocationHandle h1 = 0;
  CUmemGenericAllocationHandle h2 = 0;
  CUmemGenericAllocationHandle h3 = 0;
  REQUIRE_CU(d.create(&h1, g, &prop, 0));
  REQUIRE_CU(d.create(&h2, g, &prop, 0));
  REQUIRE_CU(d.create(&h3, 2 * g, &prop, 0));
  REQUIRE_CU(d.map(a + g, g, 0, h1, 0));
  REQUIRE_CU(d.map(b, g, 0, h2, 0));
  CHECK_CU(d.set_access(a + g, 2 * g, &rw, 1), CUDA_ERROR_INVALID_VALUE);  // spans a|b
  CHECK_CU(d.unmap(a + g, 2 * g), CUDA_ERROR_INVALID_VALUE);
  CHECK(outstanding().mappings == 2);
  CHECK_CU(d.set_access(a + g, g, &rw, 1), CUDA_SUCCESS);
  CHECK_CU(d.set_access(b, g, &rw, 1), CUDA_SUCCESS);
  REQUIRE_CU(d.unmap(a + g, g));
  REQUIRE_CU(d.unmap(b, g));
  // Part of one mapping (§3.4.8: the range must contain the whole allocation).
  REQUIRE_CU(d.map(a, 2 * g, 0, h3, 0));
  CHECK_CU(d.set_access(a, g, &rw, 1), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(d.set_access(a + g, g, &rw, 1), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(d.set_access(a, 2 * g, &rw, 1), CUDA_SUCCESS);
  REQUIRE_CU(d.unmap(a, 2 * g));
  REQUIRE_CU(d.release(h1));
  REQUIRE_CU(d.release(h2));
  REQUIRE_CU(d.release(h3));
  REQUIRE_CU(d.address_free(a, 2 * g));
  REQUIRE_CU(d.address_free(b, 2 * g));
  check_nothing_outstanding();
}

TEST_CASE("modes: REQUIRE_CONTEXT: stream and event calls fail without a current context") {
  Driver& d = drv();
  use_device();
  Options opt;
  opt.set("SYNC", "0");
  CUstream s = nullptr;
  CUevent e = nullptr;
  REQUIRE_CU(d.stream_create(&s, CU_STREAM_NON_BLOCKING));
  REQUIRE_CU(d.event_create(&e, CU_EVENT_DISABLE_TIMING));
  CUdeviceptr p = 0;
  REQUIRE_CU(d.alloc(&p, 4096));
  auto calls = [&](CUresult expected) {
    CHECK_CU(d.stream_query(s), expected);
    CHECK_CU(d.stream_synchronize(s), expected);
    CHECK_CU(d.event_record(e, s), expected);
    CHECK_CU(d.event_query(e), expected);
    CHECK_CU(d.event_synchronize(e), expected);
    CHECK_CU(d.stream_wait_event(s, e, 0), expected);
    CHECK_CU(d.memset8_async(p, 1, 16, s), expected);
  };
  {
    Options strict;
    strict.set("REQUIRE_CONTEXT", "1");
    std::thread([&] {
      calls(CUDA_ERROR_INVALID_CONTEXT);
      CHECK_CU(d.stream_destroy(s), CUDA_ERROR_INVALID_CONTEXT);
      CHECK_CU(d.event_destroy(e), CUDA_ERROR_INVALID_CONTEXT);
    }).join();
  }
  {
    Options lenient;
    lenient.set("REQUIRE_CONTEXT", "0");
    std::thread([&] {
      CHECK_CU(d.stream_query(s), CUDA_SUCCESS);
      CHECK_CU(d.event_record(e, s), CUDA_SUCCESS);
      CHECK_CU(d.stream_synchronize(s), CUDA_SUCCESS);
      CHECK_CU(d.event_query(e), CUDA_SUCCESS);
    }).join();
  }
  REQUIRE_CU(d.stream_destroy(s));
  REQUIRE_CU(d.event_destroy(e));
  REQUIRE_CU(d.free(p));
  check_nothing_outstanding();
}

TEST_CASE("modes: STICKY_VMM: VMM calls report a sticky error after doing their work") {
  Driver& d = drv();
  use_device();
  const size_t g = min_granularity();
  CUmemAllocationProp prop = device_prop();
  Options opt;
  opt.set("STICKY", "1").set("STICKY_VMM", "1");
  CUmemGenericAllocationHandle h = 0;
  CUmemGenericAllocationHandle unmapped = 0;
  CUdeviceptr va = 0;
  REQUIRE_CU(d.create(&h, g, &prop, 0));
  REQUIRE_CU(d.create(&unmapped, g, &prop, 0));
  REQUIRE_CU(d.reserve(&va, g, 0, 0, 0));
  REQUIRE_CU(d.map(va, g, 0, h, 0));
  CHECK_CU(d.memset8(va, 0, 16), CUDA_ERROR_ILLEGAL_ADDRESS);  // mapped without access
  CHECK_CU(d.ctx_synchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);
  const vsr_emu_outstanding before = outstanding();
  const size_t stale_before = before.stale_handles;
  CHECK_CU(d.release(unmapped), CUDA_ERROR_ILLEGAL_ADDRESS);
  CHECK(outstanding().handles == before.handles - 1);       // the release happened
  CHECK_CU(d.release(unmapped), CUDA_ERROR_INVALID_VALUE);  // so a retry is a double release
  CHECK(stale() == stale_before + 1);
  CHECK_CU(d.unmap(va, g), CUDA_ERROR_ILLEGAL_ADDRESS);
  CHECK(outstanding().mappings == before.mappings - 1);
  CUmemGenericAllocationHandle made = 0;
  CHECK_CU(d.create(&made, g, &prop, 0), CUDA_ERROR_ILLEGAL_ADDRESS);
  CHECK(made != 0);
  // Off: VMM calls do not see the context's error.
  opt.set("STICKY_VMM", "0");
  CHECK_CU(d.release(made), CUDA_SUCCESS);
  CHECK_CU(d.release(h), CUDA_SUCCESS);
  CHECK_CU(d.address_free(va, g), CUDA_SUCCESS);
  // Resetting the primary context clears the sticky error (earlier tests' threads left retains).
  while (d.primary_release(0) == CUDA_SUCCESS) {
  }
  CUcontext again = nullptr;
  REQUIRE_CU(d.primary_retain(&again, 0));
  CHECK_CU(d.ctx_synchronize(), CUDA_SUCCESS);
  check_nothing_outstanding();
}

TEST_CASE("modes: MEMINFO_QUANTUM and a relative CONTEXT_OVERHEAD make cuMemGetInfo inexact") {
  Driver& d = drv();
  use_device();
  Options opt;
  const size_t q = 2 << 20;
  opt.set("MEMINFO_QUANTUM", std::to_string(q).c_str()).set("CONTEXT_OVERHEAD", "3%");
  size_t f0 = 0;
  size_t total = 0;
  REQUIRE_CU(d.mem_get_info(&f0, &total));
  CHECK(f0 % q == 0);
  CHECK(f0 <= total - total * 3 / 100);
  CUdeviceptr p = 0;
  REQUIRE_CU(d.alloc(&p, 1000));
  size_t f1 = 0;
  REQUIRE_CU(d.mem_get_info(&f1, &total));
  CHECK(f1 % q == 0);
  CHECK(f0 - f1 != 1000);  // never exact to the byte
  REQUIRE_CU(d.free(p));
  CHECK(d.set_option("CONTEXT_OVERHEAD", "100%") == CUDA_ERROR_INVALID_VALUE);
  CHECK(d.set_option("CONTEXT_OVERHEAD", "x%") == CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("modes: ADVERSARIAL switches every adversarial mode; 'default' restores the env") {
  Driver& d = drv();
  use_device();
  const char* env = std::getenv("VSR_EMU_ADVERSARIAL");
  const bool from_env = env != nullptr && std::string(env) == "1";
  const std::string all_on =
      "async_default_streams=1 recycle_handles=1 free_no_sync=1 require_context=1 sticky_vmm=1 "
      "meminfo_quantum=2097152";
  CHECK((describe().find(all_on) != std::string::npos) == from_env);
  {
    Options opt;
    opt.set("ADVERSARIAL", "1");
    const std::string line = describe();
    INFO(line);
    CHECK(line.find(all_on) != std::string::npos);
    CHECK(line.find("address_space=0 ") == std::string::npos);
    CHECK(line.find("abort_on_misuse=0") != std::string::npos);  // a diagnostic, not a mode
    opt.set("ADVERSARIAL", "0");
    CHECK(describe().find("async_default_streams=0 recycle_handles=0 free_no_sync=0") !=
          std::string::npos);
  }
  CHECK((describe().find(all_on) != std::string::npos) == from_env);
  CHECK(d.set_option("ADVERSARIAL", "maybe") == CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("modes: the closed leniencies are on by default") {
  use_device();
  for (const char* var :
       {"VSR_EMU_REQUIRE_CONTEXT", "VSR_EMU_STICKY_VMM", "VSR_EMU_MEMINFO_QUANTUM"}) {
    if (std::getenv(var) != nullptr) {
      MESSAGE(var << " is set: the defaults are not what this run sees");
      return;
    }
  }
  CHECK(describe().find("require_context=1 sticky_vmm=1 meminfo_quantum=2097152") !=
        std::string::npos);
  Options opt;
  opt.set("ADVERSARIAL", "0");  // back to the defaults: still on
  CHECK(describe().find("require_context=1 sticky_vmm=1 meminfo_quantum=2097152") !=
        std::string::npos);
}

namespace {

struct Appender {
  std::mutex* mutex;
  std::vector<int>* order;
  int value;
};

void append(void* p) {
  auto* a = static_cast<Appender*>(p);
  std::lock_guard lock(*a->mutex);
  a->order->push_back(a->value);
}

}  // namespace

TEST_CASE("modes: LATE_WORK delays each task a worker runs, and keeps each stream's order") {
  Driver& d = drv();
  use_device();
  CHECK(d.set_option("LATE_WORK", "later") == CUDA_ERROR_INVALID_VALUE);
  CHECK(d.set_option("LATE_WORK", "61s") == CUDA_ERROR_INVALID_VALUE);
  {
    Options opt;
    opt.set("LATE_WORK", "0");
    CHECK(describe().find("late_work_ns=0") != std::string::npos);
    opt.set("ADVERSARIAL", "1");
    CHECK(describe().find("late_work_ns=50000") != std::string::npos);
    opt.set("LATE_WORK", "300us");
    CHECK(describe().find("late_work_ns=300000") != std::string::npos);
    // Two streams' work interleaves in any order; each stream's stays in its order.
    CUstream a = nullptr, b = nullptr;
    REQUIRE_CU(d.stream_create(&a, CU_STREAM_NON_BLOCKING));
    REQUIRE_CU(d.stream_create(&b, CU_STREAM_NON_BLOCKING));
    std::mutex m;
    std::vector<int> order;
    std::vector<Appender> tasks;
    tasks.reserve(40);
    for (int i = 0; i < 20; ++i) {
      tasks.push_back({&m, &order, i});
      tasks.push_back({&m, &order, 100 + i});
    }
    for (int i = 0; i < 20; ++i) {
      REQUIRE_CU(d.launch_host_func(a, append, &tasks[static_cast<std::size_t>(2 * i)]));
      REQUIRE_CU(d.launch_host_func(b, append, &tasks[static_cast<std::size_t>(2 * i + 1)]));
    }
    REQUIRE_CU(d.stream_synchronize(a));
    REQUIRE_CU(d.stream_synchronize(b));
    REQUIRE(order.size() == 40);
    std::vector<int> on_a, on_b;
    for (int v : order) (v < 100 ? on_a : on_b).push_back(v);
    for (int i = 0; i < 20; ++i) {
      CHECK(on_a[static_cast<std::size_t>(i)] == i);
      CHECK(on_b[static_cast<std::size_t>(i)] == 100 + i);
    }
    REQUIRE_CU(d.stream_destroy(a));
    REQUIRE_CU(d.stream_destroy(b));
  }
  const char* env = std::getenv("VSR_EMU_ADVERSARIAL");
  const bool adversarial = env != nullptr && std::string(env) == "1";
  CHECK(describe().find(adversarial ? "late_work_ns=50000" : "late_work_ns=0") !=
        std::string::npos);
}

TEST_CASE("emulator: an @run fault: the launch succeeds, its work faults when it runs") {
  Driver& d = drv();
  use_device();
  CHECK(d.set_fail("cuLaunchHostFunc:1@runs") == CUDA_ERROR_INVALID_VALUE);
  REQUIRE(d.set_fail("cuLaunchHostFunc:2@run") == 0);
  CUstream s = nullptr;
  REQUIRE_CU(d.stream_create(&s, CU_STREAM_NON_BLOCKING));
  std::atomic<int> first{0}, second{0};
  REQUIRE_CU(d.launch_host_func(s, set_flag, &first));
  REQUIRE_CU(d.stream_synchronize(s));
  CHECK(first == 1);
  CHECK_CU(d.launch_host_func(s, set_flag, &second), CUDA_SUCCESS);  // it faults later
  CHECK(d.fault_count("cuLaunchHostFunc") == 1);
  CHECK_CU(d.stream_synchronize(s), CUDA_ERROR_ILLEGAL_ADDRESS);
  CHECK(second == 1);  // the function still ran: what faulted work wrote is unspecified
  REQUIRE(d.set_fail(nullptr) == 0);
  (void)d.stream_destroy(s);
  // Resetting the primary context clears the sticky error (earlier tests' threads left retains).
  while (d.primary_release(0) == CUDA_SUCCESS) {
  }
  CUcontext again = nullptr;
  REQUIRE_CU(d.primary_retain(&again, 0));
  CHECK_CU(d.ctx_synchronize(), CUDA_SUCCESS);
}
