// SPDX-License-Identifier: Apache-2.0
// A memory snapshot is one cut (memory_history.hpp): taken while threads allocate and free, its
// trace and its segments agree, as PyTorch's readers need them to (check_snapshot). Read at two
// moments they would not: a block freed between them is "allocated, never freed, and not live",
// and a page mapped anew after a free the trace does not have yet covers a block "live" before
// it (the condition under which PyTorch's segment view throws).
#include "pool_fixture.hpp"
#include "snapshot_checks.hpp"

#include <vibespatial/raster/memory_history.hpp>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using namespace vibespatial::raster;
using namespace vsr_test;

namespace {

/// Blocks one worker allocated and may hand to another to free (frees by another thread).
class Exchange {
 public:
  void put(void* p, std::size_t bytes) {
    std::lock_guard lock(mutex_);
    if (blocks_.size() < 64) {
      blocks_.emplace_back(p, bytes);
      return;
    }
    device_deallocate(p, bytes);
  }
  std::pair<void*, std::size_t> take() {
    std::lock_guard lock(mutex_);
    if (blocks_.empty()) return {nullptr, 0};
    auto b = blocks_.back();
    blocks_.pop_back();
    return b;
  }
  void drain() {
    for (auto b = take(); b.first != nullptr; b = take()) device_deallocate(b.first, b.second);
  }

 private:
  std::mutex mutex_;
  std::vector<std::pair<void*, std::size_t>> blocks_;
};

/// Allocates and frees until `stop`: small blocks of several classes through the thread's cache
/// (kept a while, then freed), now and then a large one, a block freed by another thread, and a
/// trim (which takes other threads' cached blocks and unmaps pages, so pages are mapped anew).
void work(int seed, const std::atomic<bool>& stop, Exchange& exchange,
          std::atomic<std::uint64_t>& ops) {
  std::mt19937 rng(static_cast<unsigned>(seed));
  std::vector<std::pair<void*, std::size_t>> live;
  const std::size_t small[] = {64, 256, 1000, 4096, 20000, 70000};
  while (!stop.load(std::memory_order_relaxed)) {
    ops.fetch_add(1, std::memory_order_relaxed);
    const unsigned pick = rng() % 1000;
    std::size_t bytes = small[rng() % std::size(small)];
    if (pick < 10) bytes = (1 + rng() % 5) * MiB + 7;
    try {
      live.emplace_back(device_allocate(bytes), bytes);
    } catch (const OutOfMemoryError&) {
    }
    if (pick >= 990 && !live.empty()) {
      exchange.put(live.back().first, live.back().second);
      live.pop_back();
    } else if (pick >= 980) {
      auto b = exchange.take();
      if (b.first != nullptr) device_deallocate(b.first, b.second);
    }
    if (pick == 500) free_pool_memory();
    while (live.size() > 24 || (!live.empty() && rng() % 3 == 0)) {
      const std::size_t i = rng() % live.size();
      device_deallocate(live[i].first, live[i].second);
      live[i] = live.back();
      live.pop_back();
    }
  }
  for (auto& [p, bytes] : live) device_deallocate(p, bytes);
}

/// `workers` threads allocate and free while this one takes `snapshots` snapshots, each checked
/// on its own. Returns the first inconsistency ("" when none), with how many were found.
std::string snapshots_under_load(int workers, int snapshots) {
  FreshPool fresh(nullptr, 256 * MiB);
  REQUIRE_FALSE(configure_memory_pool().empty());
  // A small bound keeps each check short; a bounded trace stays consistent (the oldest events
  // go first: frees whose alloc was let go are allowed, check_snapshot's `complete` false).
  record_memory_history(true, 4096);
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> ops{0};
  Exchange exchange;
  std::vector<std::thread> threads;
  for (int t = 0; t < workers; ++t) {
    threads.emplace_back(work, 17 + t, std::cref(stop), std::ref(exchange), std::ref(ops));
  }
  // Every snapshot is taken while the workers run: the first once each has begun.
  while (ops.load() < static_cast<std::uint64_t>(workers) * 100) std::this_thread::yield();
  std::string first;
  int bad = 0;
  std::size_t events = 0;
  for (int k = 0; k < snapshots; ++k) {
    const MemorySnapshot s = memory_snapshot();
    for (const auto& trace : s.device_traces) events += trace.size();
    const std::string why = check_snapshot(s, false);
    if (!why.empty()) {
      ++bad;
      if (first.empty()) first = why;
    }
  }
  stop.store(true);
  for (std::thread& t : threads) t.join();
  exchange.drain();
  // Quiet now: the last snapshot has every block freed.
  const MemorySnapshot last = memory_snapshot();
  record_memory_history(false);
  CHECK(check_snapshot(last, false) == "");
  CHECK(ops.load() > 0);
  CHECK(events > 0);
  MESSAGE(workers << " workers, " << ops.load() << " allocations, " << snapshots << " snapshots, "
                  << bad << " inconsistent");
  return bad == 0 ? "" : std::to_string(bad) + " of " + std::to_string(snapshots) + ": " + first;
}

}  // namespace

TEST_SUITE("pool") {
  TEST_CASE("memory snapshot: one cut while one thread allocates and frees") {
    CHECK(snapshots_under_load(1, 1000) == "");
  }

  TEST_CASE("memory snapshot: one cut while eight threads allocate and free") {
    CHECK(snapshots_under_load(8, 1000) == "");
  }
}
