// SPDX-License-Identifier: Apache-2.0
// fork() while other threads use the pool. The child inherits the pool's mutexes in whatever state
// the parent's threads left them; CUDA cannot be used in it anyway. Every pool call in the child
// must fail at once with DriverUnavailableError, never block.
#include "pool_fixture.hpp"

#include <vibespatial/raster/memory_history.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <string>
#include <thread>
#include <vector>

using namespace vibespatial::raster;
using namespace vsr_test;

namespace {

// Bits of the child's exit status, one per broken promise.
enum ChildFailure : int {
  kConfigure = 1 << 0,
  kAllocateSmall = 1 << 1,
  kAllocateLarge = 1 << 2,
  kDeallocate = 1 << 3,
  kFreePoolMemory = 1 << 4,
  kAddHandler = 1 << 5,
  kRemoveHandler = 1 << 6,
  kStats = 1 << 7,
  kHistory = 1 << 8,
};

// True when `call` throws DriverUnavailableError with CUDA_ERROR_NOT_INITIALIZED and a message
// that names fork.
template <typename Call>
bool refused(Call&& call) {
  try {
    call();
  } catch (const DriverUnavailableError& e) {
    return e.code() == CUDA_ERROR_NOT_INITIALIZED &&
           std::string(e.what()).find("fork") != std::string::npos;
  } catch (...) {
    return false;
  }
  return false;
}

// Runs in the child: every pool entry point, none of which may block. Returns the exit status.
int child_checks(void* live_small, void* live_large) {
  int failed = 0;
  if (!refused([] { configure_memory_pool(); })) failed |= kConfigure;
  // A block this thread freed on the null stream is in its cache: the fast path must refuse too.
  if (!refused([] { device_allocate(1000); })) failed |= kAllocateSmall;
  if (!refused([] { device_allocate(3 * MiB); })) failed |= kAllocateLarge;
  if (!refused([&] { device_deallocate(live_small, 1000); }) ||
      !refused([&] { device_deallocate(live_large, 3 * MiB); })) {
    failed |= kDeallocate;
  }
  if (!refused([] { free_pool_memory(); })) failed |= kFreePoolMemory;
  if (!refused([] { add_oom_handler([](std::size_t) { return false; }); })) failed |= kAddHandler;
  if (!refused([] { remove_oom_handler(1); })) failed |= kRemoveHandler;
  if (!refused([] { record_memory_history(true); }) || !memory_snapshot().device_traces.empty() ||
      !memory_snapshot().segments.empty()) {
    failed |= kHistory;
  }
  const MemoryPoolStats s = memory_pool_stats();
  const MemoryPoolStats s0 = memory_pool_stats(0);
  if (s.configured || !s.tier.empty() || s.current_bytes || s0.configured || !s0.tier.empty()) {
    failed |= kStats;
  }
  return failed;
}

}  // namespace

TEST_SUITE("pool") {
  TEST_CASE("17.4: a child forked while other threads use the pool gets a typed error at once") {
    FreshPool fresh(nullptr, 256 * MiB);
    REQUIRE(configure_memory_pool() == "B");
    void* warm = device_allocate(1000);
    device_deallocate(warm, 1000);  // cached by this thread
    void* live_small = device_allocate(1000);
    void* live_large = device_allocate(3 * MiB);
    // Threads that keep taking the pool's locks: large blocks (the pool mutex), handlers, stats
    // and trims.
    std::atomic<bool> stop{false};
    std::atomic<long> rounds[2] = {0, 0};
    std::vector<std::thread> hammers;
    hammers.emplace_back([&] {
      while (!stop.load()) {
        void* p = device_allocate(5 * MiB);
        device_deallocate(p, 5 * MiB);
        ++rounds[0];
      }
    });
    hammers.emplace_back([&] {
      while (!stop.load()) {
        const std::uint64_t id = add_oom_handler([](std::size_t) { return false; });
        (void)memory_pool_stats();
        void* q = device_allocate(200 * 1024);
        device_deallocate(q, 200 * 1024);
        remove_oom_handler(id);
        free_pool_memory();
        ++rounds[1];
      }
    });
    while (rounds[0].load() < 10 || rounds[1].load() < 10) std::this_thread::yield();
    constexpr int kChildren = 20;
    std::vector<pid_t> children;
    for (int i = 0; i < kChildren; ++i) {
      const pid_t pid = fork();
      REQUIRE(pid >= 0);
      if (pid == 0) _exit(child_checks(live_small, live_large));
      children.push_back(pid);
    }
    // A watchdog, not an ordering: a child that has not exited by the deadline hangs.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    int hung = 0, refused_all = 0;
    std::vector<int> statuses;
    while (!children.empty()) {
      for (std::size_t i = children.size(); i-- > 0;) {
        int status = 0;
        if (waitpid(children[i], &status, WNOHANG) == 0) {
          if (std::chrono::steady_clock::now() < deadline) continue;
          kill(children[i], SIGKILL);
          waitpid(children[i], &status, 0);
          ++hung;
        } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
          ++refused_all;
        } else {
          statuses.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 1000 + WTERMSIG(status));
        }
        children[i] = children.back();
        children.pop_back();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    stop = true;
    for (auto& t : hammers) t.join();
    CHECK(hung == 0);
    CHECK(refused_all == kChildren);
    for (int st : statuses) CHECK_MESSAGE(st == 0, "child failure bits (or 1000 + signal) " << st);
    // The parent is unaffected.
    device_deallocate(live_small, 1000);
    device_deallocate(live_large, 3 * MiB);
    void* p = device_allocate(2000);
    device_deallocate(p, 2000);
    CHECK(*memory_pool_stats().current_count == 0);
  }
}
