// SPDX-License-Identifier: Apache-2.0
// vsr-bench alloc, sections 1 and 2: the traces replayed by the pool against malloc and against
// the driver's allocators, and the VMM calls the pool makes on a steady large trace.
#include "alloc.hpp"
#include "bench_driver.hpp"

#include <vibespatial/raster/memory.hpp>
#include <vibespatial/raster/memory_history.hpp>

#include <cmath>
#include <exception>
#include <string>
#include <vector>

namespace vsr_bench {

double vmm_calls_per_op(const Trace& t, std::size_t steps) {
  PoolAlloc a;
  long long before = -1, after = -1;
  run_trace(a, t, steps,
            [&](bool start) { (start ? before : after) = vsr_bench::emulator_vmm_calls(); });
  if (before < 0 || after < 0) return -1;
  return static_cast<double>(after - before) / static_cast<double>(steps);
}

void section_malloc(Report& rep, const Trace& small, const Trace& large, const AllocSizes& z,
                    bool quiet) {
  const std::string label = "1/6 pool vs malloc";
  Table tab({"trace", "live", "sizes", "steps", "rounds", "pool ns/op", "malloc ns/op",
             "pool/malloc", "goal", "met", "VMM calls per alloc+free"});
  struct Case {
    const Trace* t;
    std::size_t steps;
    const char* goal;
  };
  for (const Case& c :
       {Case{&small, z.small_steps, "<= 2.0"}, Case{&large, z.large_steps, "<= 1.0"}}) {
    std::vector<Contender> cs{contender("pool", PoolAlloc{}), contender("malloc", MallocAlloc{})};
    std::vector<std::vector<double>> s;
    if (!run_case(rep, tab, c.t->name, "pool_vs_malloc " + c.t->name,
                  [&] { s = interleave(label, *c.t, c.steps, z.rounds, cs); })) {
      continue;
    }
    const double ratio = paired_ratio(s[0], s[1]);
    const std::string met = met_str(ratio, c.goal);
    const std::string sizes =
        format_bytes(c.t->lo) + "-" + format_bytes(c.t->hi) + " " + dist_name(c.t->dist);
    double vmm = -1;
    try {
      vmm = vmm_calls_per_op(*c.t, c.steps);
    } catch (const std::exception& e) {
      case_error(rep, "vmm_calls " + c.t->name, e);
    }
    const std::string vmm_goal = "<= 0.02";
    const std::string vmm_met = vmm < 0 ? "n/a" : met_str(vmm, vmm_goal);
    tab.add({c.t->name, std::to_string(c.t->fill.size()), sizes, std::to_string(c.steps),
             std::to_string(z.rounds), fmt("%.1f", median(s[0])), fmt("%.1f", median(s[1])),
             fmt("%.3f", ratio), c.goal, met,
             vmm < 0 ? "n/a (counted on the emulator only)" : fmt("%.4f", vmm)});
    rep.summary.push_back(
        {"pool/malloc ns per op, " + c.t->name + " trace", ratio, c.goal, met, ""});
    if (c.t == &large) {
      rep.summary.push_back({"VMM calls per alloc+free, large trace (steady state)",
                             vmm < 0 ? NAN : vmm, vmm_goal, vmm_met,
                             vmm < 0 ? "counted on the emulator only" : ""});
    }
    rep.section_json(
        "{\"section\": \"pool_vs_malloc\", \"trace\": " + json_string(c.t->name) +
        ", \"live\": " + std::to_string(c.t->fill.size()) +
        ", \"steps\": " + std::to_string(c.steps) + ", \"rounds\": " + std::to_string(z.rounds) +
        ", \"pool_ns_per_op\": " + json_num(median(s[0])) +
        ", \"malloc_ns_per_op\": " + json_num(median(s[1])) + ", \"ratio\": " + json_num(ratio) +
        ", \"goal\": " + json_string(c.goal) + ", \"met\": " + json_string(met) +
        ", \"vmm_calls_per_alloc_free\": " + json_num(vmm < 0 ? NAN : vmm) + "}");
  }
  if (!quiet) {
    tab.print(
        "== 1. Pool vs system malloc/free: bookkeeping only (memory never touched), ns per call "
        "(alloc or free), median of interleaved rounds; ratio = median of per-round ratios ==");
  }
  section_recording(rep, small, z, quiet);
}

void section_recording(Report& rep, const Trace& small, const AllocSizes& z, bool quiet) {
  // The small trace with the memory history off and on (memory_history.hpp), side by side in the
  // same interleaved rounds: each "on" round starts a new history (the default bound, 100,000
  // events, so the ring wraps) and stops it after the drain.
  const std::string label = "1/6 memory history";
  Table tab({"trace", "live", "steps", "rounds", "off ns/op", "on ns/op", "on/off", "goal", "met"});
  const char* goal = "<= 2.0";
  Contender off = contender("recording off", PoolAlloc{});
  Contender inner = contender("recording on", PoolAlloc{});
  Contender on{"recording on", [inner](const Trace& t, std::size_t steps) mutable {
                 vsr::record_memory_history(true);
                 const double ns = inner.round(t, steps);
                 vsr::record_memory_history(false);
                 return ns;
               }};
  std::vector<Contender> cs{off, on};
  std::vector<std::vector<double>> s;
  if (!run_case(rep, tab, small.name, "memory_history " + small.name,
                [&] { s = interleave(label, small, z.small_steps, z.rounds, cs); })) {
    return;
  }
  const double ratio = paired_ratio(s[1], s[0]);
  const std::string met = met_str(ratio, goal);
  tab.add({small.name, std::to_string(small.fill.size()), std::to_string(z.small_steps),
           std::to_string(z.rounds), fmt("%.1f", median(s[0])), fmt("%.1f", median(s[1])),
           fmt("%.3f", ratio), goal, met});
  rep.summary.push_back({"memory history on/off ns per op, small trace", ratio, goal, met, ""});
  rep.section_json("{\"section\": \"memory_history\", \"trace\": " + json_string(small.name) +
                   ", \"steps\": " + std::to_string(z.small_steps) + ", \"rounds\": " +
                   std::to_string(z.rounds) + ", \"off_ns_per_op\": " + json_num(median(s[0])) +
                   ", \"on_ns_per_op\": " + json_num(median(s[1])) +
                   ", \"ratio\": " + json_num(ratio) + ", \"goal\": " + json_string(goal) +
                   ", \"met\": " + json_string(met) + "}");
  if (!quiet) {
    tab.print(
        "== 1b. Memory history: the small trace with recording off and on, ns per call, median "
        "of interleaved rounds; ratio = median of per-round ratios ==");
  }
}

void section_driver(Report& rep, const Trace& small, const Trace& large, const AllocSizes& z,
                    bool quiet) {
  const std::string label = "2/6 pool vs driver";
  const bool emu = rep.machine.emulated;
  const auto& api = vsr_bench::driver();
  const bool has_async = api.cuMemAllocAsync != nullptr && api.cuMemFreeAsync != nullptr;
  // Never destroyed: the pool keeps marks and cached blocks that name the stream it was freed on.
  static CUstream stream = nullptr;
  if (stream == nullptr) BENCH_CU_TRY(api.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  const std::string tag = emu ? " [host-only emulator: measures nothing real]" : "";
  Table tab({"trace", "live", "steps", "rounds", "pool ns/op", "cuMemAlloc ns/op",
             "cuMemAllocAsync ns/op", "pool/cuMemAlloc", "pool/cuMemAllocAsync", "goal", "met"});
  struct Case {
    const Trace* t;
    std::size_t steps;
  };
  for (const Case& c : {Case{&small, z.drv_small_steps}, Case{&large, z.drv_large_steps}}) {
    std::vector<Contender> cs{contender("pool", PoolAlloc{stream}),
                              contender("cuMemAlloc", CuMemAlloc{})};
    if (has_async) cs.push_back(contender("cuMemAllocAsync", CuMemAllocAsync{stream}));
    std::vector<std::vector<double>> s;
    if (!run_case(rep, tab, c.t->name, "pool_vs_driver " + c.t->name,
                  [&] { s = interleave(label, *c.t, c.steps, z.drv_rounds, cs); })) {
      continue;
    }
    const double r_sync = paired_ratio(s[0], s[1]);
    const double r_async = has_async ? paired_ratio(s[0], s[2]) : NAN;
    const std::string goal = "<= 0.5";
    const std::string met = emu ? "n/a" : met_str(r_async, goal);
    tab.add({c.t->name, std::to_string(c.t->fill.size()), std::to_string(c.steps),
             std::to_string(z.drv_rounds), fmt("%.1f", median(s[0])), fmt("%.1f", median(s[1])),
             has_async ? fmt("%.1f", median(s[2])) : "unsupported", fmt("%.3f", r_sync),
             has_async ? fmt("%.3f", r_async) : "-", emu ? goal + " (GPU only)" : goal, met});
    rep.summary.push_back(
        {"pool/cuMemAlloc, " + c.t->name + " trace" + tag, r_sync, "", "n/a", ""});
    rep.summary.push_back({"pool/cuMemAllocAsync, " + c.t->name + " trace" + tag, r_async,
                           emu ? goal + " (GPU only)" : goal, met, ""});
    rep.section_json(
        "{\"section\": \"pool_vs_driver\", \"host_only_emulator\": " +
        std::string(emu ? "true" : "false") + ", \"trace\": " + json_string(c.t->name) +
        ", \"live\": " + std::to_string(c.t->fill.size()) + ", \"steps\": " +
        std::to_string(c.steps) + ", \"rounds\": " + std::to_string(z.drv_rounds) +
        ", \"pool_ns_per_op\": " + json_num(median(s[0])) +
        ", \"cuMemAlloc_ns_per_op\": " + json_num(median(s[1])) +
        ", \"cuMemAllocAsync_ns_per_op\": " + json_num(has_async ? median(s[2]) : NAN) +
        ", \"pool_over_cuMemAlloc\": " + json_num(r_sync) +
        ", \"pool_over_cuMemAllocAsync\": " + json_num(r_async) +
        ", \"goal\": " + json_string(goal) + ", \"met\": " + json_string(met) + "}");
  }
  if (!quiet) {
    tab.print("== 2. Pool vs the driver's allocators on one non-blocking stream" + tag +
              "; cuMemAllocAsync uses the device's default memory pool (release threshold as "
              "configured, default 0) ==");
  }
}

}  // namespace vsr_bench
