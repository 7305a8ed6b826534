// SPDX-License-Identifier: Apache-2.0
// vsr-bench alloc, section 3: threads, each replaying its own small trace on the pool.
#include "alloc.hpp"

#include <vibespatial/raster/memory.hpp>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <exception>
#include <string>
#include <thread>
#include <vector>

namespace vsr_bench {
namespace {

// One round of `n` threads, each replaying its own trace on the pool (the legacy default stream,
// so frees and reallocations hit the thread's own cache). Returns aggregate calls per second.
double threads_round(const std::vector<Trace>& traces, int n, std::size_t steps) {
  std::barrier sync(n);
  std::vector<Clock::time_point> start(n), stop(n);
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> workers;
  for (int i = 0; i < n; ++i) {
    workers.emplace_back([&, i] {
      const Trace& t = traces[static_cast<std::size_t>(i)];
      PoolAlloc a;
      std::vector<void*> ptr(t.fill.size(), nullptr);
      std::vector<std::size_t> size = t.fill;
      try {
        for (std::size_t k = 0; k < ptr.size(); ++k) ptr[k] = a.alloc(size[k]);
      } catch (...) {
        errors[i] = std::current_exception();
      }
      sync.arrive_and_wait();
      start[i] = Clock::now();
      if (!errors[i]) {
        try {
          for (std::size_t k = 0; k < steps; ++k) {
            const Trace::Step& s = t.steps[k];
            a.release(ptr[s.slot], size[s.slot]);
            ptr[s.slot] = nullptr;
            ptr[s.slot] = a.alloc(s.size);
            size[s.slot] = s.size;
          }
        } catch (...) {
          errors[i] = std::current_exception();
        }
      }
      stop[i] = Clock::now();
      sync.arrive_and_wait();
      for (std::size_t k = 0; k < ptr.size(); ++k) {
        if (ptr[k] != nullptr) {
          try {
            a.release(ptr[k], size[k]);
          } catch (...) {
            if (!errors[i]) errors[i] = std::current_exception();
          }
        }
      }
    });
  }
  for (auto& w : workers) w.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  const auto t0 = *std::min_element(start.begin(), start.end());
  const auto t1 = *std::max_element(stop.begin(), stop.end());
  const double secs = std::chrono::duration<double>(t1 - t0).count();
  return 2.0 * static_cast<double>(steps) * n / secs;
}

}  // namespace

void section_threads(Report& rep, const AllocSizes& z, std::uint64_t seed, bool quiet) {
  const std::string label = "3/6 threads";
  std::vector<Trace> traces;
  for (int i = 0; i < 2; ++i) {
    traces.push_back(make_trace("small", z.small_live, 256, 256 * kKiB, z.thread_steps,
                                seed + 1000 + static_cast<std::uint64_t>(i)));
  }
  progress("%s: warm-up", label.c_str());
  threads_round(traces, 1, z.thread_steps);
  threads_round(traces, 2, z.thread_steps);
  std::vector<double> one, two, ratio;
  for (int r = 0; r < z.thread_rounds; ++r) {
    progress("%s: round %d/%d", label.c_str(), r + 1, z.thread_rounds);
    one.push_back(threads_round(traces, 1, z.thread_steps));
    two.push_back(threads_round(traces, 2, z.thread_steps));
    ratio.push_back(two.back() / one.back());
  }
  const double r = median(ratio);
  const std::string goal = ">= 1.7";
  const std::string met = met_str(r, goal);
  std::string note;
  if (rep.machine.cpus < 3) {
    note = "only " + std::to_string(rep.machine.cpus) + " CPUs: the bench's 2 threads share them";
    if (rep.machine.cpus < 2) note = "1 CPU: 2 threads cannot scale here";
  }
  if (!quiet) {
    Table tab({"threads", "live per thread", "steps per thread", "rounds", "Mcalls/s (median)",
               "2T/1T", "goal", "met"});
    tab.add({"1", std::to_string(z.small_live), std::to_string(z.thread_steps),
             std::to_string(z.thread_rounds), fmt("%.2f", median(one) / 1e6), "", "", ""});
    tab.add({"2", std::to_string(z.small_live), std::to_string(z.thread_steps),
             std::to_string(z.thread_rounds), fmt("%.2f", median(two) / 1e6), fmt("%.3f", r), goal,
             met});
    tab.print(
        "== 3. Threads: each replays its own small trace (own live set) on the pool's fast "
        "path; aggregate calls/s, 2 threads over 1, median of interleaved rounds ==" +
        (note.empty() ? std::string() : "\n   note: " + note));
  }
  rep.summary.push_back({"aggregate calls/s, 2 threads / 1 thread", r, goal, met, note});
  rep.section_json(
      "{\"section\": \"threads\", \"live_per_thread\": " + std::to_string(z.small_live) +
      ", \"steps_per_thread\": " + std::to_string(z.thread_steps) + ", \"rounds\": " +
      std::to_string(z.thread_rounds) + ", \"one_thread_calls_per_s\": " + json_num(median(one)) +
      ", \"two_threads_calls_per_s\": " + json_num(median(two)) + ", \"ratio\": " + json_num(r) +
      ", \"goal\": " + json_string(goal) + ", \"met\": " + json_string(met) + "}");
}

}  // namespace vsr_bench
