// SPDX-License-Identifier: Apache-2.0
// vsr-bench alloc, section 6: the pool's slack policy as configured (the adaptive default unless
// VIBESPATIAL_GPU_POOL_RESERVE says otherwise) on the large trace at several live-set sizes: its
// cost with and without the emulator's A100 latency model, side by side in one run, and its VMM
// calls per alloc+free; then the same trace on a device sized 1.08x its peak of live bytes.
#include "alloc.hpp"
#include "bench_driver.hpp"

#include <vibespatial/raster/errors.hpp>
#include <vibespatial/raster/memory.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

namespace vsr_bench {
namespace {

// One round of the pool with the emulator's latency model set for it, and cleared after it.
double replay_with_latency(const Trace& t, std::size_t steps) {
  if (emulator_set_option("LATENCY", "a100") != 0) {
    throw std::runtime_error("the emulator refused LATENCY=a100");
  }
  try {
    PoolAlloc a;
    const double ns = replay(a, t, steps);
    emulator_set_option("LATENCY", "");
    return ns;
  } catch (...) {
    emulator_set_option("LATENCY", "");
    throw;
  }
}

// The large trace's live set in pages at its peak, replayed once on the pool.
std::size_t peak_live_bytes(const Trace& t, std::size_t steps, std::size_t page) {
  std::size_t live = 0, peak = 0;
  for (std::size_t b : t.fill) live += (b + page - 1) / page * page;
  peak = live;
  std::vector<std::size_t> size = t.fill;
  for (std::size_t k = 0; k < steps; ++k) {
    const Trace::Step& s = t.steps[k];
    live -= (size[s.slot] + page - 1) / page * page;
    live += (s.size + page - 1) / page * page;  // freed first, then allocated: as the trace runs
    size[s.slot] = s.size;
    peak = std::max(peak, live);
  }
  return peak;
}

struct NearFull {
  std::size_t device = 0;     // pool's share of the device: 1.08x the trace's peak live bytes
  std::size_t peak_live = 0;  // page-rounded
  std::size_t ooms = 0;
  std::size_t max_pool = 0;
  double calls = -1;
};

// The trace on an emulated device with 8% more free memory than its peak of live bytes: every
// OutOfMemoryError is counted (the step's slot stays empty), pool_size sampled after each call.
NearFull near_full(const Trace& t, std::size_t steps, std::size_t page) {
  NearFull r;
  r.peak_live = peak_live_bytes(t, steps, page);
  vsr::free_pool_memory();
  std::size_t free_b = 0, total_b = 0;
  BENCH_CU_TRY(vsr_bench::driver().cuMemGetInfo(&free_b, &total_b));
  r.device = r.peak_live + r.peak_live * 8 / 100;
  const std::size_t others = total_b - free_b;  // the context and anything else charged
  if (emulator_set_option("DEVICE_MEMORY", std::to_string(others + r.device).c_str()) != 0) {
    throw std::runtime_error("the emulator refused DEVICE_MEMORY for the near-full device");
  }
  std::vector<void*> ptr(t.fill.size(), nullptr);
  std::vector<std::size_t> size = t.fill;
  const auto sample = [&] {
    r.max_pool = std::max(r.max_pool, vsr::memory_pool_stats().pool_size.value_or(0));
  };
  const auto alloc = [&](std::size_t slot) {
    try {
      ptr[slot] = vsr::device_allocate(size[slot]);
    } catch (const vsr::OutOfMemoryError&) {
      ++r.ooms;
      ptr[slot] = nullptr;
    }
    sample();
  };
  try {
    for (std::size_t i = 0; i < ptr.size(); ++i) alloc(i);
    const long long before = emulator_vmm_calls();
    for (std::size_t k = 0; k < steps; ++k) {
      const Trace::Step& s = t.steps[k];
      if (ptr[s.slot] != nullptr) vsr::device_deallocate(ptr[s.slot], size[s.slot]);
      size[s.slot] = s.size;
      alloc(s.slot);
    }
    const long long after = emulator_vmm_calls();
    if (before >= 0 && after >= 0) {
      r.calls = static_cast<double>(after - before) / static_cast<double>(steps);
    }
  } catch (...) {
    for (std::size_t i = 0; i < ptr.size(); ++i) {
      if (ptr[i] != nullptr) vsr::device_deallocate(ptr[i], size[i]);
    }
    vsr::free_pool_memory();
    emulator_set_option("DEVICE_MEMORY", "default");
    throw;
  }
  for (std::size_t i = 0; i < ptr.size(); ++i) {
    if (ptr[i] != nullptr) vsr::device_deallocate(ptr[i], size[i]);
  }
  vsr::free_pool_memory();
  emulator_set_option("DEVICE_MEMORY", "default");
  return r;
}

}  // namespace

void section_default(Report& rep, const AllocSizes& z, std::uint64_t seed, bool quiet) {
  const char* env = std::getenv("VIBESPATIAL_GPU_POOL_RESERVE");
  const std::string policy =
      env == nullptr ? "adaptive (default)" : std::string("VIBESPATIAL_GPU_POOL_RESERVE=") + env;
  const bool emulated = rep.machine.emulated;
  const std::string calls_goal = "<= 0.02";
  const std::string latency_goal = "<= 1.5";
  Table tab({"trace", "live", "steps", "rounds", "ns/op", "ns/op A100 model", "A100/none", "goal",
             "met", "VMM calls per alloc+free", "goal", "met"});
  // Each live-set size as far as the device's free memory allows (the pool's pages of earlier
  // sections are given back first). On the emulator the device is made large enough for 2,048
  // live blocks for this section (its pages are never touched, so size costs nothing).
  vsr::free_pool_memory();
  struct DeviceSize {
    bool set = false;
    ~DeviceSize() {
      if (set) emulator_set_option("DEVICE_MEMORY", "default");
    }
  } device_size;
  if (emulated) {
    device_size.set = emulator_set_option("DEVICE_MEMORY", std::to_string(192 * kGiB).c_str()) == 0;
  }
  std::size_t free_b = 0, total_b = 0;
  BENCH_CU_TRY(vsr_bench::driver().cuMemGetInfo(&free_b, &total_b));
  const double per_block = mean_size(1 * kMiB, 64 * kMiB, Dist::log_uniform) * 1.3;
  const auto fit = static_cast<std::size_t>(0.6 * static_cast<double>(free_b) / per_block);
  for (std::size_t live : z.default_lives) {
    const std::size_t n = std::min(live, std::max<std::size_t>(fit, 1));
    if (n < live) {
      rep.notes.push_back("slack section: " + std::to_string(live) + " live blocks scaled to " +
                          std::to_string(n) + " to fit free device memory");
    }
    const Trace t = make_large_trace(n, z.default_steps, seed + 3000 + live);
    const std::string name = "slack " + std::to_string(n) + " live";
    progress("6/6 slack: large trace, %zu live blocks, %s", n, policy.c_str());
    std::vector<std::vector<double>> s;
    double calls = -1;
    const bool ran = run_case(rep, tab, "large", name, [&] {
      vsr::free_pool_memory();
      std::vector<Contender> cs{contender("none", PoolAlloc{})};
      if (emulated) {
        cs.push_back(
            {"a100", [](const Trace& tr, std::size_t st) { return replay_with_latency(tr, st); }});
      }
      s = interleave("6/6 slack", t, z.default_steps, z.rounds, cs);
      calls = vmm_calls_per_op(t, z.default_steps);
      vsr::free_pool_memory();
    });
    if (!ran) continue;
    const double ratio = emulated ? paired_ratio(s[1], s[0]) : NAN;
    const std::string lat_met = emulated ? met_str(ratio, latency_goal) : "n/a";
    const std::string calls_met = calls < 0 ? "n/a" : met_str(calls, calls_goal);
    tab.add({"large", std::to_string(n), std::to_string(z.default_steps), std::to_string(z.rounds),
             fmt("%.1f", median(s[0])), emulated ? fmt("%.1f", median(s[1])) : "n/a",
             emulated ? fmt("%.3f", ratio) : "n/a", latency_goal, lat_met,
             calls < 0 ? "n/a" : fmt("%.4f", calls), calls_goal, calls_met});
    rep.summary.push_back(
        {"VMM calls per alloc+free, large trace, " + std::to_string(n) + " live, " + policy,
         calls < 0 ? NAN : calls, calls_goal, calls_met,
         calls < 0 ? "counted on the emulator only" : ""});
    rep.summary.push_back(
        {"large trace ns/op, A100 latency model / none, " + std::to_string(n) + " live, " + policy,
         ratio, latency_goal, lat_met, emulated ? "" : "the latency model is the emulator's"});
    rep.section_json(
        "{\"section\": \"slack\", \"policy\": " + json_string(policy) +
        ", \"live\": " + std::to_string(n) + ", \"steps\": " + std::to_string(z.default_steps) +
        ", \"rounds\": " + std::to_string(z.rounds) + ", \"ns_per_op\": " + json_num(median(s[0])) +
        ", \"a100_ns_per_op\": " + json_num(emulated ? median(s[1]) : NAN) +
        ", \"a100_ratio\": " + json_num(ratio) +
        ", \"vmm_calls_per_alloc_free\": " + json_num(calls < 0 ? NAN : calls) + "}");
  }
  // The near-full device (emulator only: a real device's size is what it is).
  Table near({"trace", "live", "steps", "device (pool's share)", "peak live", "OOMs",
              "peak pool_size", "pool <= device", "VMM calls per alloc+free"});
  if (!emulated) {
    skipped_row(rep, "near-full device (1.08x peak live): OOMs", "== 0",
                "n/a (the emulator sizes the device)");
  } else {
    const std::size_t n = std::min(z.large_live, std::max<std::size_t>(fit, 1));
    const Trace t = make_large_trace(n, z.default_steps, seed + 4000);
    progress("6/6 slack: near-full device, %zu live blocks", n);
    NearFull r;
    if (run_case(rep, near, "large", "slack near-full",
                 [&] { r = near_full(t, z.default_steps, rep.machine.granularity); })) {
      const bool within = r.max_pool <= r.device;
      near.add({"large", std::to_string(n), std::to_string(z.default_steps), format_bytes(r.device),
                format_bytes(r.peak_live), std::to_string(r.ooms), format_bytes(r.max_pool),
                within ? "yes" : "no", r.calls < 0 ? "n/a" : fmt("%.4f", r.calls)});
      rep.summary.push_back(
          {"near-full device (1.08x peak live): OOMs, " + policy, static_cast<double>(r.ooms),
           "<= 0", r.ooms == 0 ? "yes" : "no",
           within ? "pool never above the device" : "the pool held more than the device"});
      rep.section_json(
          "{\"section\": \"slack near-full\", \"policy\": " + json_string(policy) +
          ", \"live\": " + std::to_string(n) + ", \"device_bytes\": " + std::to_string(r.device) +
          ", \"peak_live_bytes\": " + std::to_string(r.peak_live) + ", \"ooms\": " +
          std::to_string(r.ooms) + ", \"peak_pool_size_bytes\": " + std::to_string(r.max_pool) +
          ", \"vmm_calls_per_alloc_free\": " + json_num(r.calls < 0 ? NAN : r.calls) + "}");
    }
  }
  if (!quiet) {
    tab.print("== 6. Slack (" + policy +
              "): the large trace with and without the A100 latency model, side by side ==");
    if (emulated) near.print("== 6. Slack: the large trace on a device 1.08x its peak live ==");
  }
}

}  // namespace vsr_bench
