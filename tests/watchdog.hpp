// SPDX-License-Identifier: Apache-2.0
// Test helper: fails a case that hangs instead of blocking the run. Unless done() (or the
// destructor) disarms it within `limit`, it calls `on_fire` once, on its own thread (which should
// release whatever holds the case), and fired() turns true. The limit only bounds a hang; no
// assertion depends on timing.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace vsr_test {

class Watchdog {
 public:
  Watchdog(std::chrono::seconds limit, std::function<void()> on_fire)
      : thread_([this, limit, on_fire = std::move(on_fire)] {
          std::unique_lock lock(mutex_);
          if (cv_.wait_for(lock, limit, [this] { return done_; })) return;
          fired_ = true;
          lock.unlock();
          on_fire();
        }) {}
  ~Watchdog() {
    done();
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  /// Disarms it: from now on it never fires.
  void done() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
  }
  bool fired() const { return fired_.load(); }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::atomic<bool> fired_{false};
  std::thread thread_;  // last: it starts once the members it uses exist
};

}  // namespace vsr_test
