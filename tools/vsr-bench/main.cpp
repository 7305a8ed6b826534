// SPDX-License-Identifier: Apache-2.0
// vsr-bench: benchmark programs. Every figure is a ratio measured side by side in one run: rounds
// of the contenders are interleaved (A, B, A, B, ...) and the median of the per-round ratios is
// reported, because the machines this runs on are shared and noisy.
//
//   vsr-bench alloc [--quick] [--json] [--seed N] [--large-live N]
//                   [--sections malloc,driver,threads,frag,scale,slack,growth]
//                                                    the device memory pool; scale: the large
//                                                    trace at 8 and 141 GiB emulated devices
//                                                    side by side; slack: the pool's slack policy
//                                                    with and without the A100 latency model;
//                                                    growth: growing the pool, multi-page
//                                                    handles against one per page;
//                                                    N: the large trace's live blocks (default 256)
//   vsr-bench dispatch [--quick] [--json] [--sections cpu,gpu,pipeline,focal]
//                                                    op throughput vs copy bandwidth; the
//                                                    pipeline section also runs on the
//                                                    emulator, with a stand-in op
//
// docs/tools.md describes each section.
//
// Exit status: 0 when every section ran (goals missed or not), 1 when one failed (the others still
// run and the summary names the failure), 2 on bad arguments, 77 when there is no usable driver
// or device (alloc only: dispatch runs its CPU rows without one and marks the GPU rows n/a).
#include "alloc.hpp"
#include "bench.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

namespace vsr_bench {
namespace {

int usage(FILE* to) {
  std::fprintf(to,
               "usage: vsr-bench alloc [--quick] [--json] [--seed N] [--sections LIST]\n"
               "                       [--large-live N]\n"
               "       LIST: comma-separated subset of malloc,driver,threads,frag,scale,slack,\n"
               "             growth\n"
               "       N: the large trace's live blocks of 1-64 MiB (default 256)\n"
               "       vsr-bench dispatch [--quick] [--json] [--sections LIST]\n"
               "       LIST: comma-separated subset of cpu,gpu,pipeline,focal\n");
  return 2;
}

/// Checks a --sections list: comma-separated names, each one of @p known.
std::string checked_sections(std::string_view text, const std::vector<std::string_view>& known) {
  std::string list(text);
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = list.find(',', start);
    const std::string_view name =
        std::string_view(list).substr(start, comma == std::string::npos ? comma : comma - start);
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      std::string names;
      for (const std::string_view k : known) names.append(names.empty() ? "" : ",").append(k);
      throw vsr_cli::UsageError("--sections: unknown section '" + std::string(name) +
                                "' (choose from " + names + ")");
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return list;
}

// The hidden command alloc's scale section starts (alloc_scale.cpp); every option is required.
ScaleWorkerOptions parse_scale_worker(int argc, char** argv) {
  ScaleWorkerOptions w;
  vsr_cli::ArgScanner words(argc, argv, 2);
  while (words.next()) {
    std::size_t* target = words.is("--live")          ? &w.live
                          : words.is("--trace-steps") ? &w.trace_steps
                          : words.is("--steps")       ? &w.steps
                                                      : nullptr;
    if (target != nullptr) {
      *target = vsr_cli::parse_integer<std::size_t>(words.option(), words.value());
    } else if (words.is("--seed")) {
      w.seed = vsr_cli::parse_integer<std::uint64_t>(words.option(), words.value());
    } else {
      words.unknown();
    }
  }
  if (w.live == 0 || w.trace_steps == 0 || w.steps == 0) {
    throw vsr_cli::UsageError("alloc-scale-worker: --live, --trace-steps and --steps are required");
  }
  return w;
}

int parse_and_run(int argc, char** argv) {
  const std::string_view cmd = argv[1];
  if (cmd == "-h" || cmd == "--help") {
    usage(stdout);
    return 0;
  }
  if (cmd == "alloc-scale-worker") return run_scale_worker(parse_scale_worker(argc, argv));
  if (cmd == "alloc-growth-worker") {  // alloc_growth.cpp: one argument, the bytes to grow by
    if (argc != 3) throw vsr_cli::UsageError("alloc-growth-worker: one argument, the bytes");
    return run_growth_worker(vsr_cli::parse_integer<std::size_t>("bytes", argv[2]));
  }
  if (cmd != "dispatch" && cmd != "alloc") {
    throw vsr_cli::UsageError("unknown command '" + std::string(cmd) + "' (alloc or dispatch)");
  }
  const bool dispatch = cmd == "dispatch";
  DispatchOptions d;
  AllocOptions o;
  vsr_cli::ArgScanner words(argc, argv, 2);
  while (words.next()) {
    if (words.is("--json")) {
      words.flag();
      d.json = o.json = true;
    } else if (words.is("--quick")) {
      words.flag();
      d.quick = o.quick = true;
    } else if (words.is("--sections")) {
      if (dispatch) {
        d.sections = checked_sections(words.value(), {"cpu", "gpu", "pipeline", "focal"});
      } else {
        o.sections = checked_sections(
            words.value(), {"malloc", "driver", "threads", "frag", "scale", "slack", "growth"});
      }
    } else if (words.is("--seed") && !dispatch) {
      o.seed = vsr_cli::parse_integer<std::uint64_t>(words.option(), words.value());
    } else if (words.is("--large-live") && !dispatch) {
      o.large_live = vsr_cli::parse_integer<std::size_t>(words.option(), words.value());
      if (o.large_live == 0) throw vsr_cli::UsageError("--large-live: must be at least 1");
    } else {
      words.unknown();
    }
  }
  return dispatch ? run_dispatch(d) : run_alloc(o);
}

}  // namespace
}  // namespace vsr_bench

int main(int argc, char** argv) {
  if (argc < 2) return vsr_bench::usage(stderr);
  try {
    return vsr_bench::parse_and_run(argc, argv);
  } catch (const vsr_cli::UsageError& e) {
    std::fprintf(stderr, "vsr-bench: %s\n", e.what());
    vsr_bench::usage(stderr);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "vsr-bench: %s\n", vsr_cli::printable(e.what()).c_str());
    return 1;
  }
}
