// SPDX-License-Identifier: Apache-2.0
// vsr-bench: benchmark programs. Every figure is a ratio measured side by side in one run: rounds
// of the contenders are interleaved (A, B, A, B, ...) and the median of the per-round ratios is
// reported, because the machines this runs on are shared and noisy.
//
//   vsr-bench alloc [--quick] [--json] [--seed N] [--sections malloc,driver,threads,frag]
//                                                    the device memory pool (issue 3)
//   vsr-bench dispatch [--quick] [--json] [--sections cpu,gpu,pipeline,focal]
//                                                    op throughput vs copy bandwidth (issue 5);
//                                                    the pipeline section also runs on the
//                                                    emulator, with a stand-in op (issue 12)
//
// Exit status: 0 when every section ran (goals missed or not), 1 when one failed (the others still
// run and the summary names the failure), 2 on bad arguments, 77 when there is no usable driver
// or device (alloc only: dispatch runs its CPU rows without one and marks the GPU rows n/a).
#include "../common/cli.hpp"
#include "../common/format.hpp"
#include "bench_driver.hpp"

#include <vibespatial/raster/dispatch.hpp>
#include <vibespatial/raster/driver.hpp>
#include <vibespatial/raster/memory.hpp>
#include <vibespatial/raster/ops.hpp>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace vsr = vibespatial::raster;

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kKiB = 1024, kMiB = kKiB * 1024, kGiB = kMiB * 1024;

// ---- options and output helpers -----------------------------------------------------------------

struct Options {
  bool json = false;
  bool quick = false;
  std::uint64_t seed = 20240611;
  std::string sections;  // comma-separated subset of malloc,driver,threads,frag; empty: all
};

bool g_progress = true;

template <class... Args>
void progress(const char* fmt, Args... args) {
  if (!g_progress) return;
  std::fprintf(stderr, "[vsr-bench] ");
  std::fprintf(stderr, fmt, args...);
  std::fputc('\n', stderr);
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

using vsr_cli::format_bytes;
using vsr_cli::json_string;

std::string json_num(double v) {
  if (!std::isfinite(v)) return "null";
  return fmt("%.6g", v);
}

class Table {
 public:
  explicit Table(std::vector<std::string> header) : rows_{std::move(header)} {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void print(const std::string& title) const {
    std::vector<std::size_t> w(rows_[0].size(), 0);
    for (const auto& r : rows_) {
      for (std::size_t i = 0; i < r.size() && i < w.size(); ++i) w[i] = std::max(w[i], r[i].size());
    }
    std::printf("\n%s\n", title.c_str());
    for (std::size_t k = 0; k < rows_.size(); ++k) {
      std::string line;
      for (std::size_t i = 0; i < w.size(); ++i) {
        const std::string cell = i < rows_[k].size() ? rows_[k][i] : "";
        if (i > 0) line += " | ";
        line += cell + std::string(w[i] - cell.size(), ' ');
      }
      while (!line.empty() && line.back() == ' ') line.pop_back();
      std::printf("%s\n", line.c_str());
      if (k == 0) {
        std::string rule;
        for (std::size_t i = 0; i < w.size(); ++i)
          rule += (i > 0 ? "-+-" : "") + std::string(w[i], '-');
        std::printf("%s\n", rule.c_str());
      }
    }
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// ---- traces -------------------------------------------------------------------------------------

enum class Dist { log_uniform, uniform };

const char* dist_name(Dist d) {
  return d == Dist::uniform ? "uniform" : "log-uniform";
}

std::size_t draw(std::mt19937_64& rng, std::size_t lo, std::size_t hi, Dist d) {
  if (d == Dist::uniform) return std::uniform_int_distribution<std::size_t>(lo, hi)(rng);
  std::uniform_real_distribution<double> u(std::log(static_cast<double>(lo)),
                                           std::log(static_cast<double>(hi)));
  return std::clamp(static_cast<std::size_t>(std::exp(u(rng))), lo, hi);
}

double mean_size(std::size_t lo, std::size_t hi, Dist d) {
  const double a = static_cast<double>(lo), b = static_cast<double>(hi);
  return d == Dist::uniform ? 0.5 * (a + b) : (b - a) / std::log(b / a);
}

// A replacement trace: fill `live` slots, then each step frees one random slot and allocates a
// new size into it. Every contender replays exactly the same calls.
struct Trace {
  std::string name;
  std::size_t lo = 0, hi = 0;
  Dist dist = Dist::log_uniform;
  std::vector<std::size_t> fill;
  struct Step {
    std::uint32_t slot;
    std::size_t size;
  };
  std::vector<Step> steps;
};

Trace make_trace(std::string name, std::size_t live, std::size_t lo, std::size_t hi,
                 std::size_t steps, std::uint64_t seed, Dist dist = Dist::log_uniform) {
  Trace t{std::move(name), lo, hi, dist, {}, {}};
  std::mt19937_64 rng(seed);
  t.fill.resize(live);
  for (auto& s : t.fill) s = draw(rng, lo, hi, dist);
  t.steps.resize(steps);
  for (auto& s : t.steps) {
    s.slot =
        static_cast<std::uint32_t>(std::uniform_int_distribution<std::size_t>(0, live - 1)(rng));
    s.size = draw(rng, lo, hi, dist);
  }
  return t;
}

// ---- contenders ---------------------------------------------------------------------------------

struct PoolAlloc {
  CUstream stream = nullptr;
  void* alloc(std::size_t b) { return vsr::device_allocate(b, stream); }
  void release(void* p, std::size_t b) { vsr::device_deallocate(p, b, stream); }
  void settle() {}
};

struct MallocAlloc {
  // Called through volatile pointers so the compiler cannot pair and elide malloc/free.
  static inline void* (*volatile do_malloc)(std::size_t) = std::malloc;
  static inline void (*volatile do_free)(void*) = std::free;
  void* alloc(std::size_t b) {
    void* p = do_malloc(b);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  void release(void* p, std::size_t) { do_free(p); }
  void settle() {}
};

struct CuMemAlloc {
  void* alloc(std::size_t b) {
    CUdeviceptr p = 0;
    BENCH_CU_TRY(vsr_bench::driver().cuMemAlloc(&p, b));
    return reinterpret_cast<void*>(p);
  }
  void release(void* p, std::size_t) {
    BENCH_CU_TRY(vsr_bench::driver().cuMemFree(reinterpret_cast<CUdeviceptr>(p)));
  }
  void settle() {}
};

struct CuMemAllocAsync {
  CUstream stream = nullptr;
  void* alloc(std::size_t b) {
    CUdeviceptr p = 0;
    BENCH_CU_TRY(vsr_bench::driver().cuMemAllocAsync(&p, b, stream));
    return reinterpret_cast<void*>(p);
  }
  void release(void* p, std::size_t) {
    BENCH_CU_TRY(vsr_bench::driver().cuMemFreeAsync(reinterpret_cast<CUdeviceptr>(p), stream));
  }
  void settle() { BENCH_CU_TRY(vsr_bench::driver().cuStreamSynchronize(stream)); }
};

// One round: fill (untimed), `steps` replacement steps (timed), drain (untimed).
// Returns ns per call (an allocation or a free).
template <class A>
double replay(A& a, const Trace& t, std::size_t steps) {
  std::vector<void*> ptr(t.fill.size());
  std::vector<std::size_t> size = t.fill;
  for (std::size_t i = 0; i < ptr.size(); ++i) ptr[i] = a.alloc(size[i]);
  const auto t0 = Clock::now();
  for (std::size_t k = 0; k < steps; ++k) {
    const Trace::Step& s = t.steps[k];
    a.release(ptr[s.slot], size[s.slot]);
    ptr[s.slot] = a.alloc(s.size);
    size[s.slot] = s.size;
  }
  const auto t1 = Clock::now();
  for (std::size_t i = 0; i < ptr.size(); ++i) a.release(ptr[i], size[i]);
  a.settle();
  return static_cast<double>(
             std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count()) /
         (2.0 * static_cast<double>(steps));
}

struct Contender {
  std::string name;
  std::function<double(const Trace&, std::size_t)> round;
};

template <class A>
Contender contender(std::string name, A a) {
  return {std::move(name),
          [a](const Trace& t, std::size_t steps) mutable { return replay(a, t, steps); }};
}

// samples[c][r]: ns/op of contender c in round r. One untimed warm-up round per contender first.
std::vector<std::vector<double>> interleave(const std::string& label, const Trace& t,
                                            std::size_t steps, int rounds,
                                            std::vector<Contender>& cs) {
  progress("%s: %s trace, warm-up", label.c_str(), t.name.c_str());
  for (auto& c : cs) c.round(t, steps);
  std::vector<std::vector<double>> samples(cs.size());
  for (int r = 0; r < rounds; ++r) {
    progress("%s: %s trace, round %d/%d", label.c_str(), t.name.c_str(), r + 1, rounds);
    for (std::size_t c = 0; c < cs.size(); ++c) samples[c].push_back(cs[c].round(t, steps));
  }
  return samples;
}

double paired_ratio(const std::vector<double>& num, const std::vector<double>& den) {
  std::vector<double> r;
  for (std::size_t i = 0; i < num.size() && i < den.size(); ++i) r.push_back(num[i] / den[i]);
  return median(r);
}

// ---- results ------------------------------------------------------------------------------------

struct SummaryRow {
  std::string metric;
  double value = NAN;
  std::string goal;  // "<= 2.0", ">= 1.7", or "" (information only)
  std::string met;   // "yes", "no", "n/a"
  std::string note;
};

std::string met_str(double v, const std::string& goal) {
  if (goal.empty() || !std::isfinite(v)) return "n/a";
  const double bound = std::atof(goal.c_str() + 3);
  const bool ok = goal.rfind("<=", 0) == 0 ? v <= bound : v >= bound;
  return ok ? "yes" : "no";
}

struct Machine {
  unsigned cpus = 0;
  std::string cpu_model;
  std::string library;
  bool emulated = false;
  int driver_version = 0;
  std::string device;
  int cc_major = 0, cc_minor = 0;
  std::size_t free_bytes = 0, total_bytes = 0;
  std::string tier;
  std::size_t granularity = 0, small_limit = 0;
};

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown";
}

struct Report {
  Machine machine;
  std::vector<std::string> notes;
  std::string sections_json;  // comma-separated JSON objects
  std::vector<SummaryRow> summary;

  void section_json(const std::string& obj) {
    if (!sections_json.empty()) sections_json += ",\n    ";
    sections_json += obj;
  }
};

// ---- the alloc benchmark ------------------------------------------------------------------------

struct Sizes {
  std::size_t small_live = 10000, small_steps = 200000;
  std::size_t large_live = 256, large_steps = 5000;
  std::size_t drv_small_steps = 5000, drv_large_steps = 500;
  std::size_t thread_steps = 500000;
  std::size_t frag_allocs = 20000;
  std::size_t frag_cap = 4 * kGiB;
  int rounds = 7, drv_rounds = 5, thread_rounds = 9;  // threads: short rounds, noisy on few CPUs
};

int g_errors = 0;

void case_error(Report& rep, const std::string& name, const std::exception& e) {
  std::fprintf(stderr, "vsr-bench: %s failed: %s\n", name.c_str(), e.what());
  rep.summary.push_back({name + ": ERROR", NAN, "", "error", e.what()});
  rep.section_json("{\"section\": " + json_string(name) + ", \"error\": " + json_string(e.what()) +
                   "}");
  ++g_errors;
}

// Runs one section unless --sections leaves it out; a failing section is reported and the others
// still run.
void run_section(Report& rep, const std::string& selected, const char* name,
                 const std::function<void()>& section) {
  if (!selected.empty() &&
      ("," + selected + ",").find("," + std::string(name) + ",") == std::string::npos) {
    return;
  }
  try {
    section();
  } catch (const std::exception& e) {
    case_error(rep, name, e);
  }
}

// VMM calls (create, release, map, unmap, set access) per alloc+free pair of a steady trace on
// the pool: one more round after the measured ones, counted over its replacement steps only. -1
// on a real driver, whose calls nobody counts.
double vmm_calls_per_op(const Trace& t, std::size_t steps) {
  PoolAlloc a;
  std::vector<void*> ptr(t.fill.size());
  std::vector<std::size_t> size = t.fill;
  for (std::size_t i = 0; i < ptr.size(); ++i) ptr[i] = a.alloc(size[i]);
  const long long before = vsr_bench::emulator_vmm_calls();
  for (std::size_t k = 0; k < steps; ++k) {
    const Trace::Step& s = t.steps[k];
    a.release(ptr[s.slot], size[s.slot]);
    ptr[s.slot] = a.alloc(s.size);
    size[s.slot] = s.size;
  }
  const long long after = vsr_bench::emulator_vmm_calls();
  for (std::size_t i = 0; i < ptr.size(); ++i) a.release(ptr[i], size[i]);
  if (before < 0 || after < 0) return -1;
  return static_cast<double>(after - before) / static_cast<double>(steps);
}

void section_malloc(Report& rep, const Trace& small, const Trace& large, const Sizes& z,
                    bool quiet) {
  const std::string label = "1/4 pool vs malloc";
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
    try {
      s = interleave(label, *c.t, c.steps, z.rounds, cs);
    } catch (const std::exception& e) {
      tab.add({c.t->name, "ERROR (see summary)"});
      case_error(rep, "pool_vs_malloc " + c.t->name, e);
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
}

void section_driver(Report& rep, const Trace& small, const Trace& large, const Sizes& z,
                    bool quiet) {
  const std::string label = "2/4 pool vs driver";
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
    try {
      s = interleave(label, *c.t, c.steps, z.drv_rounds, cs);
    } catch (const std::exception& e) {
      tab.add({c.t->name, "ERROR (see summary)"});
      case_error(rep, "pool_vs_driver " + c.t->name, e);
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

void section_threads(Report& rep, const Sizes& z, std::uint64_t seed, bool quiet) {
  const std::string label = "3/4 threads";
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

struct FragResult {
  std::size_t allocs = 0, frees = 0, base = 0;
  std::size_t peak_live = 0, peak_live_pages = 0, peak_pool = 0;
  double ratio = NAN, page_floor = NAN;
};

// Churn under a live-bytes cap: allocate while the next request fits, else free random live
// blocks until it does. pool_size is sampled after every call; the pool is never trimmed.
FragResult fragmentation(Dist dist, std::size_t cap, std::size_t allocs, std::uint64_t seed,
                         std::size_t page) {
  FragResult f;
  vsr::free_pool_memory();  // earlier sections' pages would count as this trace's
  f.base = vsr::memory_pool_stats().pool_size.value_or(0);
  std::mt19937_64 rng(seed);
  struct Live {
    void* p;
    std::size_t size;
  };
  std::vector<Live> live;
  std::map<std::uintptr_t, std::uintptr_t> ranges;  // live [begin, end)
  std::size_t live_bytes = 0, live_pages = 0;
  const auto pages = [page](std::size_t b) { return (b + page - 1) / page * page; };
  const auto sample = [&] {
    f.peak_live = std::max(f.peak_live, live_bytes);
    f.peak_live_pages = std::max(f.peak_live_pages, live_pages);
    f.peak_pool = std::max(f.peak_pool, vsr::memory_pool_stats().pool_size.value_or(0));
  };
  for (std::size_t k = 0; k < allocs; ++k) {
    const std::size_t size = draw(rng, 1 * kMiB, 64 * kMiB, dist);
    while (!live.empty() && live_bytes + size > cap) {
      const std::size_t i = std::uniform_int_distribution<std::size_t>(0, live.size() - 1)(rng);
      vsr::device_deallocate(live[i].p, live[i].size);
      ranges.erase(reinterpret_cast<std::uintptr_t>(live[i].p));
      live_bytes -= live[i].size;
      live_pages -= pages(live[i].size);
      live[i] = live.back();
      live.pop_back();
      ++f.frees;
      sample();
    }
    void* p = vsr::device_allocate(size);
    // Not timed, so the trace also checks that no two live blocks overlap.
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    const auto next = ranges.lower_bound(a);
    const bool overlaps = (next != ranges.end() && next->first < a + size) ||
                          (next != ranges.begin() && std::prev(next)->second > a);
    if (overlaps) {
      throw std::runtime_error("the pool handed out a block overlapping a live one (" +
                               std::to_string(size) + " bytes at " + std::to_string(a) +
                               ", allocation " + std::to_string(k) + ")");
    }
    ranges.emplace(a, a + size);
    live.push_back({p, size});
    live_bytes += size;
    live_pages += pages(size);
    ++f.allocs;
    sample();
  }
  for (const Live& l : live) vsr::device_deallocate(l.p, l.size);
  f.ratio = static_cast<double>(f.peak_pool - std::min(f.base, f.peak_pool)) /
            static_cast<double>(f.peak_live);
  f.page_floor = static_cast<double>(f.peak_live_pages) / static_cast<double>(f.peak_live);
  return f;
}

void section_fragmentation(Report& rep, const Sizes& z, std::uint64_t seed, bool quiet) {
  const std::string goal = "<= 1.05";
  Table tab({"sizes", "live cap", "allocs", "frees", "peak live requested", "peak pool_size",
             "peak/requested", "page-rounding floor", "goal", "met"});
  int idx = 0;
  for (Dist d : {Dist::uniform, Dist::log_uniform}) {
    progress("4/4 fragmentation: %s sizes, %zu allocations, cap %s", dist_name(d), z.frag_allocs,
             format_bytes(z.frag_cap).c_str());
    FragResult f;
    try {
      f = fragmentation(d, z.frag_cap, z.frag_allocs, seed + 2000 + idx++, rep.machine.granularity);
    } catch (const std::exception& e) {
      tab.add({std::string("1-64 MiB ") + dist_name(d), "ERROR (see summary)"});
      case_error(rep, std::string("fragmentation ") + dist_name(d), e);
      continue;
    }
    // The uniform trace is the goal; log-uniform is information (its many 1-2 MiB requests put
    // the page-rounding floor itself above the goal).
    const bool scored = d == Dist::uniform;
    const std::string met = scored ? met_str(f.ratio, goal) : "n/a";
    const std::string sizes = std::string("1-64 MiB ") + dist_name(d);
    tab.add({sizes, format_bytes(z.frag_cap), std::to_string(f.allocs), std::to_string(f.frees),
             format_bytes(f.peak_live), format_bytes(f.peak_pool), fmt("%.4f", f.ratio),
             fmt("%.4f", f.page_floor), scored ? goal : "(info)", met});
    rep.summary.push_back({"fragmentation peak pool_size / peak live requested, " + sizes, f.ratio,
                           scored ? goal : "", met,
                           "page-rounding floor " + fmt("%.4f", f.page_floor)});
    rep.section_json(
        "{\"section\": \"fragmentation\", \"sizes\": " + json_string(sizes) +
        ", \"live_cap_bytes\": " + std::to_string(z.frag_cap) +
        ", \"allocs\": " + std::to_string(f.allocs) + ", \"frees\": " + std::to_string(f.frees) +
        ", \"pool_size_before\": " + std::to_string(f.base) +
        ", \"peak_live_requested_bytes\": " + std::to_string(f.peak_live) +
        ", \"peak_live_page_rounded_bytes\": " + std::to_string(f.peak_live_pages) +
        ", \"peak_pool_size_bytes\": " + std::to_string(f.peak_pool) + ", \"ratio\": " +
        json_num(f.ratio) + ", \"page_rounding_floor\": " + json_num(f.page_floor) +
        ", \"goal\": " + json_string(scored ? goal : "") + ", \"met\": " + json_string(met) + "}");
  }
  if (!quiet) {
    tab.print(
        "== 4. Fragmentation: churn under a live-bytes cap; peak physical (pool_size sampled "
        "after every call, never trimmed) over peak live requested bytes ==");
  }
}

Machine describe_machine() {
  Machine m;
  m.cpus = std::thread::hardware_concurrency();
  m.cpu_model = cpu_model();
  const vsr::DriverInfo info = vsr::driver_info();
  m.library = info.library;
  m.emulated = info.emulated;
  m.driver_version = info.driver_version;
  if (!info.devices.empty()) {
    const auto& d = info.devices.front();
    m.device = d.name;
    m.cc_major = d.compute_capability_major;
    m.cc_minor = d.compute_capability_minor;
  }
  vsr_bench::bind_primary_context();
  BENCH_CU_TRY(vsr_bench::driver().cuMemGetInfo(&m.free_bytes, &m.total_bytes));
  m.tier = vsr::configure_memory_pool();
  // The pool is created lazily: one call makes its page size and small-block limit known.
  vsr::device_deallocate(vsr::device_allocate(256), 256);
  const vsr::MemoryPoolStats s = vsr::memory_pool_stats();
  m.granularity = s.granularity != 0 ? s.granularity : 2 * kMiB;
  m.small_limit = s.small_block_limit;
  return m;
}

// Sizes the large and fragmentation traces to the device's free memory: the pool keeps the pages
// of earlier traces while the driver's allocators run, so three large live sets may coexist.
void fit_to_device(Report& rep, Sizes& z) {
  const double free_b = static_cast<double>(rep.machine.free_bytes);
  const double per_block = mean_size(1 * kMiB, 64 * kMiB, Dist::log_uniform) * 1.3;
  const double budget = 0.6 * free_b;
  if (3.0 * per_block * static_cast<double>(z.large_live) > budget) {
    const auto fit = static_cast<std::size_t>(budget / (3.0 * per_block));
    rep.notes.push_back("large trace scaled down from " + std::to_string(z.large_live) + " to " +
                        std::to_string(std::max<std::size_t>(fit, 1)) + " live blocks to fit " +
                        format_bytes(rep.machine.free_bytes) + " free device memory");
    z.large_live = std::max<std::size_t>(fit, 1);
  }
  const auto frag_fit = static_cast<std::size_t>(0.25 * free_b);
  if (z.frag_cap > frag_fit) {
    rep.notes.push_back("fragmentation live cap scaled down from " + format_bytes(z.frag_cap) +
                        " to " + format_bytes(frag_fit) + " to fit free device memory");
    z.frag_cap = std::max<std::size_t>(frag_fit, 128 * kMiB);
  }
}

// Notes, sections and summary of a --json report, and its closing brace.
void print_json_tail(const Report& rep) {
  std::string notes;
  for (const auto& n : rep.notes) notes += (notes.empty() ? "" : ", ") + json_string(n);
  std::printf("  \"notes\": [%s],\n", notes.c_str());
  std::printf("  \"sections\": [\n    %s\n  ],\n", rep.sections_json.c_str());
  std::printf("  \"summary\": [\n");
  for (std::size_t i = 0; i < rep.summary.size(); ++i) {
    const auto& r = rep.summary[i];
    std::printf("    {\"metric\": %s, \"value\": %s, \"goal\": %s, \"met\": %s, \"note\": %s}%s\n",
                json_string(r.metric).c_str(), json_num(r.value).c_str(),
                json_string(r.goal).c_str(), json_string(r.met).c_str(),
                json_string(r.note).c_str(), i + 1 < rep.summary.size() ? "," : "");
  }
  std::printf("  ]\n}\n");
}

void print_summary(const Report& rep, const std::string& title) {
  Table sum({"metric", "value", "goal", "met?"});
  for (const auto& r : rep.summary) {
    sum.add({r.metric + (r.note.empty() ? "" : " (" + r.note + ")"),
             std::isfinite(r.value) ? fmt("%.3f", r.value) : "-", r.goal.empty() ? "-" : r.goal,
             r.met});
  }
  sum.print(title);
}

void print_machine(const Report& rep, const Options& o, const Sizes& z) {
  const Machine& m = rep.machine;
  std::printf("vsr-bench alloc%s: seed %llu\n", o.quick ? " --quick" : "",
              static_cast<unsigned long long>(o.seed));
  std::printf("machine: %u CPUs (%s)\n", m.cpus, m.cpu_model.c_str());
  std::printf("driver:  %s%s, version %d.%d\n", m.library.c_str(),
              m.emulated ? " [HOST EMULATOR: driver rows measure nothing real]" : "",
              m.driver_version / 1000, (m.driver_version % 1000) / 10);
  std::printf("device:  %s (cc %d.%d), %s free of %s\n", m.device.c_str(), m.cc_major, m.cc_minor,
              format_bytes(m.free_bytes).c_str(), format_bytes(m.total_bytes).c_str());
  std::printf("pool:    tier %s, page %s, small blocks up to %s\n", m.tier.c_str(),
              format_bytes(m.granularity).c_str(), format_bytes(m.small_limit).c_str());
  std::printf("rounds:  %d (malloc), %d (driver), %d (threads); median of interleaved rounds\n",
              z.rounds, z.drv_rounds, z.thread_rounds);
  for (const auto& n : rep.notes) std::printf("note:    %s\n", n.c_str());
}

void print_json(const Report& rep, const Options& o) {
  const Machine& m = rep.machine;
  std::printf("{\n  \"benchmark\": \"alloc\",\n  \"quick\": %s,\n  \"seed\": %llu,\n",
              o.quick ? "true" : "false", static_cast<unsigned long long>(o.seed));
  std::printf(
      "  \"machine\": {\"cpus\": %u, \"cpu_model\": %s, \"driver_library\": %s, \"emulated\": %s, "
      "\"driver_version\": %d, \"device\": %s, \"compute_capability\": \"%d.%d\", \"free_bytes\": "
      "%zu, \"total_bytes\": %zu, \"tier\": %s, \"page_bytes\": %zu, \"small_block_limit\": "
      "%zu},\n",
      m.cpus, json_string(m.cpu_model).c_str(), json_string(m.library).c_str(),
      m.emulated ? "true" : "false", m.driver_version, json_string(m.device).c_str(), m.cc_major,
      m.cc_minor, m.free_bytes, m.total_bytes, json_string(m.tier).c_str(), m.granularity,
      m.small_limit);
  print_json_tail(rep);
}

int run_alloc(const Options& o) {
  // Emulated device memory is memfd pages that are never touched, so a large size costs nothing;
  // the real driver ignores the variable. Must precede the first driver call.
  setenv("VSR_EMU_DEVICE_MEMORY", std::to_string(64 * kGiB).c_str(), /*overwrite=*/0);

  const vsr::DriverInfo info = vsr::driver_info();
  if (!info.available || info.devices.empty()) {
    std::fprintf(stderr, "vsr-bench: no usable CUDA driver or device (%s): %s\n",
                 info.library.c_str(), info.reason.c_str());
    return 77;
  }

  Report rep;
  rep.machine = describe_machine();
  Sizes z;
  if (o.quick) {
    z.small_steps = 20000;
    z.large_steps = 2000;  // fewer and the first steps after the fill, which remap pages, dominate
    z.drv_small_steps = 1000;
    z.drv_large_steps = 100;
    z.thread_steps = 100000;  // a few ms per round: shorter is mostly thread start-up
    z.frag_allocs = 500;
    z.frag_cap = 1 * kGiB;
    z.rounds = z.drv_rounds = z.thread_rounds = 3;
  }
  fit_to_device(rep, z);
  if (!o.json) print_machine(rep, o, z);

  const Trace small = make_trace("small", z.small_live, 256, 256 * kKiB, z.small_steps, o.seed);
  const Trace large = make_trace("large", z.large_live, 1 * kMiB, 64 * kMiB,
                                 std::max(z.large_steps, z.drv_large_steps), o.seed + 1);

  const auto t0 = Clock::now();
  const auto guarded = [&](const char* name, const std::function<void()>& section) {
    run_section(rep, o.sections, name, section);
  };
  guarded("malloc", [&] { section_malloc(rep, small, large, z, o.json); });
  guarded("driver", [&] { section_driver(rep, small, large, z, o.json); });
  guarded("threads", [&] { section_threads(rep, z, o.seed, o.json); });
  guarded("frag", [&] { section_fragmentation(rep, z, o.seed, o.json); });
  const int status = g_errors > 0 ? 1 : 0;
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  progress("done in %.1f s", secs);

  if (o.json) {
    print_json(rep, o);
    return status;
  }
  print_summary(rep, "== Summary" +
                         std::string(rep.machine.emulated ? " (CPU + host emulator)" : "") + ", " +
                         fmt("%.1f", secs) + " s ==");
  return status;
}

// ---- the dispatch benchmark ---------------------------------------------------------------------
//
// Bandwidth figures count every byte an op reads plus every byte it writes (rescale float32 ->
// float32: 8 bytes per pixel), and the same for its baseline copy, so a ratio is baseline time
// over op time per round. Host clocks time everything: the driver table has no
// cuEventElapsedTime, so GPU rounds end with cuCtxSynchronize.

struct DispatchSizes {
  std::int64_t cpu_h = 4096, cpu_w = 8192;      // float32: 128 MiB in, 128 MiB out
  std::int64_t focal_h = 4096, focal_w = 4096;  // 16 Mpx
  std::int64_t gpu_h = 16384, gpu_w = 16384;    // 1 GiB in, 1 GiB out, 1 GiB copy target
  int gpu_reps = 10;                            // ops per timed GPU round (each ~1 ms)
  int pipe_bands = 8;
  std::int64_t pipe_h = 8192, pipe_w = 4096;  // 128 MiB per band, 1 GiB in all
  int rounds = 7;
};

struct DispatchOptions {
  bool json = false;
  bool quick = false;
  std::string sections;  // comma-separated subset of cpu,gpu,pipeline,focal; empty: all
};

// Sets the OpenMP team size of the host backend's parallel regions started from this thread.
// Returns false without OpenMP (the host backend then runs Thrust's serial backend).
bool set_host_threads(int n) {
#if defined(_OPENMP)
  omp_set_num_threads(n);
  return true;
#else
  (void)n;
  return n == 1;
#endif
}

int host_max_threads() {
#if defined(_OPENMP)
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// Thread counts of the host rows: 1 and 2 (the goals), and all cores as information when the
// machine has more. 1 only without OpenMP.
std::vector<int> host_thread_counts(unsigned cpus) {
#if defined(_OPENMP)
  std::vector<int> t{1, 2};
  if (cpus > 2) t.push_back(static_cast<int>(cpus));
  return t;
#else
  (void)cpus;
  return {1};
#endif
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// memcpy split into `threads` contiguous page-aligned chunks, one std::thread each.
void parallel_memcpy(void* dst, const void* src, std::size_t bytes, int threads) {
  if (threads <= 1) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const std::size_t chunk =
      ((bytes + static_cast<std::size_t>(threads) - 1) / static_cast<std::size_t>(threads) + 4095) /
      4096 * 4096;
  std::vector<std::thread> ts;
  for (int i = 0; i < threads; ++i) {
    const std::size_t off = chunk * static_cast<std::size_t>(i);
    if (off >= bytes) break;
    const std::size_t n = std::min(chunk, bytes - off);
    ts.emplace_back([=] {
      std::memcpy(static_cast<unsigned char*>(dst) + off,
                  static_cast<const unsigned char*>(src) + off, n);
    });
  }
  for (auto& t : ts) t.join();
}

// A float32 host raster with values in [0, 1000) and no nodata.
vsr::OwnedRasterArray host_raster(int bands, std::int64_t h, std::int64_t w) {
  auto r = vsr::OwnedRasterArray::allocate(vsr::Residency::host, vsr::DType::float32, bands, h, w);
  auto* p = static_cast<float*>(r.mutable_host_data());
  const std::size_t n = static_cast<std::size_t>(bands) * static_cast<std::size_t>(h * w);
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<float>((i * 2654435761u) % 1000u);
  return r;
}

vsr::OwnedRasterArray rescale_op(const vsr::OwnedRasterArray& r) {
  return vsr::rescale(r, 0.0, 1000.0, 0.0, 1.0, vsr::DType::float32);
}

struct TimedContender {
  std::string name;
  std::function<double()> round;  // seconds
};

// samples[c][r]: seconds of contender c in round r; one untimed warm-up round each first.
std::vector<std::vector<double>> interleave_timed(const std::string& label, int rounds,
                                                  std::vector<TimedContender>& cs) {
  progress("%s: warm-up", label.c_str());
  for (auto& c : cs) c.round();
  std::vector<std::vector<double>> samples(cs.size());
  for (int r = 0; r < rounds; ++r) {
    progress("%s: round %d/%d", label.c_str(), r + 1, rounds);
    for (std::size_t c = 0; c < cs.size(); ++c) samples[c].push_back(cs[c].round());
  }
  return samples;
}

double gbps(double bytes, double secs) {
  return bytes / secs / 1e9;
}

// Why the GPU rows are not measured, or empty when they are.
std::string gpu_skip_reason(const vsr::DriverInfo& info) {
  if (!info.available || info.devices.empty()) return "n/a: no GPU";
  if (info.emulated) return "emulator: not measured";
  if (!vsr::ops_built_with_cuda()) return "n/a: built without CUDA";
  return "";
}

void skipped_row(Report& rep, const std::string& metric, const std::string& goal,
                 const std::string& why) {
  rep.summary.push_back({metric, NAN, goal, why, ""});
}

void section_cpu_elementwise(Report& rep, const DispatchSizes& z, bool quiet) {
  const std::string goal = ">= 0.70";
  const std::size_t bytes =
      static_cast<std::size_t>(z.cpu_h * z.cpu_w) * sizeof(float);  // one side
  const double moved = 2.0 * static_cast<double>(bytes);
  const vsr::OwnedRasterArray in = host_raster(1, z.cpu_h, z.cpu_w);
  const void* src = in.host_data();
  auto dst = std::make_unique_for_overwrite<unsigned char[]>(bytes);
  std::memset(dst.get(), 0, bytes);  // pre-faulted: the baseline is pure copy bandwidth
  // The scored op writes into one output raster reused every round, as a pipeline that keeps
  // its buffers does; the allocating form is shown beside memcpy into a fresh buffer.
  vsr::OwnedRasterArray reused = vsr::OwnedRasterArray::allocate(
      vsr::Residency::host, vsr::DType::float32, 1, z.cpu_h, z.cpu_w);
  std::memset(reused.mutable_host_data(), 0, bytes);
  Table tab({"threads", "size", "rounds", "rescale_into GB/s", "memcpy GB/s", "ratio", "goal",
             "met", "rescale (new output) GB/s", "memcpy fresh dst GB/s"});
  for (int t : host_thread_counts(rep.machine.cpus)) {
    const bool scored = t <= 2;
    const std::string label = "1/4 cpu elementwise, " + std::to_string(t) + " thread(s)";
    std::vector<TimedContender> cs{
        {"rescale_into",
         [&] {
           set_host_threads(t);
           const auto t0 = Clock::now();
           vsr::rescale_into(in, 0.0, 1000.0, 0.0, 1.0, reused);
           return seconds_since(t0);
         }},
        {"memcpy",
         [&] {
           const auto t0 = Clock::now();
           parallel_memcpy(dst.get(), src, bytes, t);
           return seconds_since(t0);
         }},
        {"memcpy fresh",
         [&] {
           // As the op: a new output buffer each call (its page faults included).
           const auto t0 = Clock::now();
           auto fresh = std::make_unique_for_overwrite<unsigned char[]>(bytes);
           parallel_memcpy(fresh.get(), src, bytes, t);
           fresh.reset();
           return seconds_since(t0);
         }},
        {"rescale",
         [&] {
           set_host_threads(t);
           const auto t0 = Clock::now();
           const vsr::OwnedRasterArray out = rescale_op(in);
           return seconds_since(t0);
         }},
    };
    const auto s = interleave_timed(label, z.rounds, cs);
    const double ratio = paired_ratio(s[1], s[0]);
    const std::string g = scored ? goal : "";
    const std::string met = met_str(ratio, g);
    tab.add({std::to_string(t), format_bytes(bytes), std::to_string(z.rounds),
             fmt("%.2f", gbps(moved, median(s[0]))), fmt("%.2f", gbps(moved, median(s[1]))),
             fmt("%.3f", ratio), scored ? goal : "(info)", met,
             fmt("%.2f", gbps(moved, median(s[3]))), fmt("%.2f", gbps(moved, median(s[2])))});
    rep.summary.push_back(
        {"CPU rescale_into / memcpy GB/s, " + std::to_string(t) + " thread(s)", ratio, g, met,
         fmt("%.2f", gbps(moved, median(s[0]))) + " vs " + fmt("%.2f", gbps(moved, median(s[1]))) +
             " GB/s; with a new output each call " + fmt("%.2f", gbps(moved, median(s[3]))) +
             " vs memcpy into a fresh buffer " + fmt("%.2f", gbps(moved, median(s[2]))) + " GB/s"});
    rep.section_json("{\"section\": \"cpu_elementwise\", \"threads\": " + std::to_string(t) +
                     ", \"bytes_per_side\": " + std::to_string(bytes) +
                     ", \"rounds\": " + std::to_string(z.rounds) +
                     ", \"rescale_into_gbps\": " + json_num(gbps(moved, median(s[0]))) +
                     ", \"rescale_new_output_gbps\": " + json_num(gbps(moved, median(s[3]))) +
                     ", \"memcpy_gbps\": " + json_num(gbps(moved, median(s[1]))) +
                     ", \"memcpy_fresh_dst_gbps\": " + json_num(gbps(moved, median(s[2]))) +
                     ", \"ratio\": " + json_num(ratio) + ", \"goal\": " + json_string(g) +
                     ", \"met\": " + json_string(met) + "}");
  }
  set_host_threads(host_max_threads());
  if (!quiet) {
    tab.print(
        "== 1. CPU elementwise: rescale_into float32 -> float32 on a host raster into a reused "
        "output (host backend, OpenMP threads) vs memcpy of the same bytes (std::threads, "
        "pre-faulted destination); GB/s = (read + written) / s, median of interleaved rounds; "
        "ratio = median of per-round ratios. The allocating rescale pays a page fault per 4 KiB "
        "of its new output, as 'memcpy fresh dst' does ==");
  }
}

// Runs `reps` calls of f back to back and waits for the device; seconds.
double gpu_round(int reps, const std::function<void()>& f) {
  const auto& api = vsr_bench::driver();
  BENCH_CU_TRY(api.cuCtxSynchronize());
  const auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) f();
  BENCH_CU_TRY(api.cuCtxSynchronize());
  return seconds_since(t0);
}

void section_gpu_elementwise(Report& rep, const DispatchSizes& z, const std::string& skip,
                             bool quiet) {
  const std::string goal = ">= 0.85";
  const std::string metric = "GPU rescale / cuMemcpyDtoD GB/s";
  Table tab(
      {"size", "rounds", "ops/round", "rescale GB/s", "DtoD GB/s", "rescale/DtoD", "goal", "met"});
  if (!skip.empty()) {
    skipped_row(rep, metric, goal, skip);
    rep.section_json("{\"section\": \"gpu_elementwise\", \"skipped\": " + json_string(skip) + "}");
    if (!quiet) std::printf("\n== 2. GPU elementwise: %s ==\n", skip.c_str());
    return;
  }
  const auto& api = vsr_bench::driver();
  vsr_bench::bind_primary_context();
  const std::size_t bytes = static_cast<std::size_t>(z.gpu_h * z.gpu_w) * sizeof(float);
  const double moved = 2.0 * static_cast<double>(bytes);
  vsr::OwnedRasterArray in = host_raster(1, z.gpu_h, z.gpu_w);
  in.move_to(vsr::Residency::device);
  const CUdeviceptr src = vsr_bench::to_device_ptr(in.device_pointer());
  void* dst = vsr::device_allocate(bytes);
  std::vector<TimedContender> cs{
      {"rescale", [&] { return gpu_round(z.gpu_reps, [&] { (void)rescale_op(in); }); }},
      {"DtoD",
       [&] {
         return gpu_round(z.gpu_reps, [&] {
           BENCH_CU_TRY(api.cuMemcpyDtoDAsync(vsr_bench::to_device_ptr(dst), src, bytes, nullptr));
         });
       }},
  };
  std::vector<std::vector<double>> s;
  try {
    s = interleave_timed("2/4 gpu elementwise", z.rounds, cs);
  } catch (...) {
    vsr::device_deallocate(dst, bytes);
    throw;
  }
  vsr::device_deallocate(dst, bytes);
  const double per = moved * z.gpu_reps;
  const double ratio = paired_ratio(s[1], s[0]);
  const std::string met = met_str(ratio, goal);
  tab.add({format_bytes(bytes), std::to_string(z.rounds), std::to_string(z.gpu_reps),
           fmt("%.1f", gbps(per, median(s[0]))), fmt("%.1f", gbps(per, median(s[1]))),
           fmt("%.3f", ratio), goal, met});
  rep.summary.push_back({metric, ratio, goal, met,
                         fmt("%.1f", gbps(per, median(s[0]))) + " vs " +
                             fmt("%.1f", gbps(per, median(s[1]))) + " GB/s"});
  rep.section_json(
      "{\"section\": \"gpu_elementwise\", \"bytes_per_side\": " + std::to_string(bytes) +
      ", \"rounds\": " + std::to_string(z.rounds) + ", \"ops_per_round\": " +
      std::to_string(z.gpu_reps) + ", \"rescale_gbps\": " + json_num(gbps(per, median(s[0]))) +
      ", \"dtod_gbps\": " + json_num(gbps(per, median(s[1]))) + ", \"ratio\": " + json_num(ratio) +
      ", \"goal\": " + json_string(goal) + ", \"met\": " + json_string(met) + "}");
  if (!quiet) {
    tab.print(
        "== 2. GPU elementwise: rescale float32 -> float32 on a device raster (output from the "
        "pool) vs cuMemcpyDtoDAsync of the same bytes; GB/s = (read + written) / s ==");
  }
}

// Budget (bytes) for which double-buffered dispatch of bands of @p band_bytes, two buffers per
// band, plans @p per_pass bands per pass: half the budget, times the planner's 0.7, holds
// per_pass and a half bands.
std::uint64_t pipeline_budget(std::uint64_t band_bytes, int per_pass) {
  return static_cast<std::uint64_t>(static_cast<double>(band_bytes) * 2 * (per_pass + 0.5) / 0.35);
}

// The stand-in op where the CUDA ops cannot run (the emulator, a build without CUDA): the band
// copied into a new device raster by cuMemcpyDtoDAsync on the stream, i.e. an identity "kernel"
// that reads and writes the band in stream order.
vsr::OwnedRasterArray copy_band_on_stream(const vsr::OwnedRasterArray& band, CUstream stream) {
  vsr::OwnedRasterArray out = vsr::OwnedRasterArray::allocate(
      vsr::Residency::device, band.dtype(), 1, band.height(), band.width(), band.nodata());
  BENCH_CU_TRY(vsr_bench::driver().cuMemcpyDtoDAsync(
      vsr_bench::to_device_ptr(out.device_data()), vsr_bench::to_device_ptr(band.device_pointer()),
      band.byte_size(), stream));
  return out;
}

// Pipelined per-band dispatch (dispatch_per_band_gpu, stream form): a host raster batched by an
// explicit budget into >= 4 passes, double-buffered. Its output is first checked against the host
// path; then interleaved rounds time it against one pinned host-to-device copy of the same bytes
// (the goal), the same dispatch one batch at a time (pipeline_depth 1, same batches) and the same
// dispatch over a device-resident copy (no input copies: the compute phase alone, batches
// double-buffered as the pipelined run's). The overlap ratio is (serial - pipelined) /
// min(copy phase, compute phase), the copy phase being serial - compute-only: 1 when the shorter
// phase is hidden entirely, 0 when nothing overlaps (clamped; the JSON also has it unclamped,
// which exceeds 1 when the pipeline also hides host work the model does not count). `mode`:
// "gpu" (rescale on the device), "stand-in" (the identity op above on a real device without the
// CUDA ops) or "emulator" (the stand-in on the host emulator, whose streams are worker threads:
// the copy "engine" and the compute "engine" are two host threads sharing the CPUs).
void section_pipeline(Report& rep, const DispatchSizes& z, const std::string& mode, bool quiet) {
  const std::string goal = ">= 0.80";
  const std::string metric = "pipelined per-band GPU dispatch / pinned H2D GB/s";
  const std::string overlap_metric = "per-band dispatch overlap ratio";
  Table tab({"bands x size", "plan", "passes", "rounds", "dispatch GB/s", "pinned H2D GB/s",
             "dispatch/pinned H2D", "goal", "met", "serial GB/s", "overlap", "pageable H2D GB/s"});
  if (mode.rfind("n/a", 0) == 0) {
    skipped_row(rep, metric, goal, mode);
    skipped_row(rep, overlap_metric, "", mode);
    rep.section_json("{\"section\": \"pipeline\", \"skipped\": " + json_string(mode) + "}");
    if (!quiet) std::printf("\n== 3. Pipelined per-band GPU dispatch: %s ==\n", mode.c_str());
    return;
  }
  const bool real_op = mode == "gpu";
  const auto& api = vsr_bench::driver();
  vsr_bench::bind_primary_context();
  const vsr::OwnedRasterArray in = host_raster(z.pipe_bands, z.pipe_h, z.pipe_w);
  const std::size_t bytes = in.byte_size();
  const std::size_t band_bytes = bytes / static_cast<std::size_t>(z.pipe_bands);
  const double moved = static_cast<double>(bytes);  // host -> device bytes
  const vsr::StreamBandOp op =
      real_op ? vsr::StreamBandOp([](const vsr::OwnedRasterArray& b, CUstream s) {
        return vsr::rescale(b, 0.0, 1000.0, 0.0, 1.0, vsr::DType::float32, s);
      })
              : vsr::StreamBandOp(copy_band_on_stream);
  vsr::GpuDispatchOptions pipelined;
  pipelined.vram_budget = pipeline_budget(band_bytes, std::max(1, z.pipe_bands / 4));
  vsr::GpuDispatchOptions serial = pipelined;
  serial.pipeline_depth = 1;
  serial.vram_budget = *pipelined.vram_budget / 2;  // the same batches, one at a time

  // Checked before any time is taken: the pipelined output equals the host path's.
  vsr::GpuDispatchReport report;
  {
    const vsr::OwnedRasterArray expected = real_op ? rescale_op(in) : in;
    const vsr::OwnedRasterArray out = vsr::dispatch_per_band_gpu(in, op, pipelined, &report);
    if (report.passes < 4 || report.pipeline_depth != 2) {
      throw std::runtime_error("pipeline: the budget gave " + std::to_string(report.passes) +
                               " pass(es) at depth " + std::to_string(report.pipeline_depth) +
                               ", expected >= 4 double-buffered passes");
    }
    std::vector<unsigned char> got(out.byte_size()), want(expected.byte_size());
    out.copy_to_host(got.data());
    expected.copy_to_host(want.data());
    if (got != want) {
      std::size_t i = 0;
      while (i < got.size() && got[i] == want[i]) ++i;
      throw std::runtime_error("pipeline: dispatch output differs from the host path at byte " +
                               std::to_string(i) + " of " + std::to_string(got.size()));
    }
  }
  const std::string plan_str = std::string(vsr::to_string(report.plan.strategy)) + ", " +
                               std::to_string(report.plan.bands_per_pass) + " band(s)/pass, " +
                               format_bytes(report.vram_budget) + " budget, output on the " +
                               (report.output == vsr::Residency::device ? "device" : "host");

  void* pinned = nullptr;
  BENCH_CU_TRY(api.cuMemHostAlloc(&pinned, bytes, 0));
  void* dst = nullptr;
  CUstream stream = nullptr;
  const auto release = [&] {
    if (dst != nullptr) vsr::device_deallocate(dst, bytes);
    if (stream != nullptr) (void)api.cuStreamDestroy(stream);
    (void)api.cuMemFreeHost(pinned);
  };
  std::vector<std::vector<double>> s;
  try {
    std::memcpy(pinned, in.host_data(), bytes);
    dst = vsr::device_allocate(bytes);
    BENCH_CU_TRY(api.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    vsr::OwnedRasterArray resident = host_raster(z.pipe_bands, z.pipe_h, z.pipe_w);
    resident.move_to(vsr::Residency::device);
    const auto timed_dispatch = [&](const vsr::OwnedRasterArray& r,
                                    const vsr::GpuDispatchOptions& o) {
      BENCH_CU_TRY(api.cuCtxSynchronize());
      const auto t0 = Clock::now();
      const vsr::OwnedRasterArray out = vsr::dispatch_per_band_gpu(r, op, o);
      return seconds_since(t0);  // the output is complete when the call returns
    };
    std::vector<TimedContender> cs{
        {"dispatch", [&] { return timed_dispatch(in, pipelined); }},
        {"pinned H2D",
         [&] {
           const auto t0 = Clock::now();
           BENCH_CU_TRY(
               api.cuMemcpyHtoDAsync(vsr_bench::to_device_ptr(dst), pinned, bytes, stream));
           BENCH_CU_TRY(api.cuStreamSynchronize(stream));
           return seconds_since(t0);
         }},
        {"serial", [&] { return timed_dispatch(in, serial); }},
        {"compute only", [&] { return timed_dispatch(resident, pipelined); }},
        {"pageable H2D",
         [&] {
           const auto t0 = Clock::now();
           BENCH_CU_TRY(api.cuMemcpyHtoD(vsr_bench::to_device_ptr(dst), in.host_data(), bytes));
           return seconds_since(t0);
         }},
    };
    s = interleave_timed("3/4 pipelined dispatch", z.rounds, cs);
  } catch (...) {
    release();
    throw;
  }
  release();
  const double ratio = paired_ratio(s[1], s[0]);
  const double t_pipe = median(s[0]), t_serial = median(s[2]), t_compute = median(s[3]);
  const double t_copy = t_serial - t_compute;
  const double shorter = std::min(t_copy, t_compute);
  const double overlap_raw = shorter > 0 ? (t_serial - t_pipe) / shorter : std::nan("");
  const double overlap =
      std::isfinite(overlap_raw) ? std::clamp(overlap_raw, 0.0, 1.0) : overlap_raw;
  const std::string met = real_op ? met_str(ratio, goal) : "n/a (" + mode + ")";
  const std::string note = fmt("%.2f", gbps(moved, t_pipe)) + " vs " +
                           fmt("%.2f", gbps(moved, median(s[1]))) + " GB/s, " +
                           std::to_string(report.passes) + " passes, plan " + plan_str + ", " +
                           (real_op ? "rescale on the device" : mode + " stand-in op");
  tab.add({std::to_string(z.pipe_bands) + " x " + format_bytes(band_bytes), plan_str,
           std::to_string(report.passes), std::to_string(z.rounds),
           fmt("%.2f", gbps(moved, t_pipe)), fmt("%.2f", gbps(moved, median(s[1]))),
           fmt("%.3f", ratio), goal, met, fmt("%.2f", gbps(moved, t_serial)), fmt("%.2f", overlap),
           fmt("%.2f", gbps(moved, median(s[4])))});
  rep.summary.push_back({metric, ratio, real_op ? goal : "", met, note});
  rep.summary.push_back({overlap_metric, overlap, "", "n/a",
                         "(serial - pipelined) / min(copy, compute), clamped to [0, 1] "
                         "(unclamped " +
                             fmt("%.2f", overlap_raw) + "): serial " + fmt("%.4f", t_serial) +
                             " s, pipelined " + fmt("%.4f", t_pipe) + " s, compute only " +
                             fmt("%.4f", t_compute) + " s; " + mode});
  rep.section_json(
      "{\"section\": \"pipeline\", \"mode\": " + json_string(mode) +
      ", \"bands\": " + std::to_string(z.pipe_bands) + ", \"bytes\": " + std::to_string(bytes) +
      ", \"plan\": " + json_string(plan_str) + ", \"passes\": " + std::to_string(report.passes) +
      ", \"pipeline_depth\": " + std::to_string(report.pipeline_depth) +
      ", \"vram_budget\": " + std::to_string(report.vram_budget) +
      ", \"output_on_device\": " + (report.output == vsr::Residency::device ? "true" : "false") +
      ", \"staging_threads\": " + std::to_string(report.staging_threads) +
      ", \"pinned_bytes\": " + std::to_string(report.pinned_bytes) +
      ", \"verified\": true, \"rounds\": " + std::to_string(z.rounds) +
      ", \"dispatch_gbps\": " + json_num(gbps(moved, t_pipe)) +
      ", \"pinned_h2d_gbps\": " + json_num(gbps(moved, median(s[1]))) +
      ", \"serial_gbps\": " + json_num(gbps(moved, t_serial)) +
      ", \"pageable_h2d_gbps\": " + json_num(gbps(moved, median(s[4]))) +
      ", \"pipelined_s\": " + json_num(t_pipe) + ", \"serial_s\": " + json_num(t_serial) +
      ", \"compute_only_s\": " + json_num(t_compute) + ", \"ratio\": " + json_num(ratio) +
      ", \"overlap\": " + json_num(overlap) + ", \"overlap_unclamped\": " + json_num(overlap_raw) +
      ", \"speedup\": " + json_num(t_serial / t_pipe) +
      ", \"goal\": " + json_string(real_op ? goal : "") + ", \"met\": " + json_string(met) + "}");
  if (!quiet) {
    tab.print(
        "== 3. Pipelined per-band GPU dispatch: dispatch_per_band_gpu (stream form, " +
        std::string(real_op ? "rescale" : "stand-in op: a device copy of each band") +
        ") over a host raster, batched by an explicit budget and double-buffered, end to end "
        "(its staging and output included), output verified against the host path first; vs one "
        "cuMemcpyHtoDAsync of the same bytes from a pinned buffer; serial = the same batches one "
        "at a time; overlap = (serial - pipelined) / min(copy, compute); GB/s = host bytes / s ==");
  }
}

void section_focal(Report& rep, const DispatchSizes& z, const std::string& skip, bool quiet) {
  Table tab({"where", "threads", "raster", "rounds", "Mpx/s"});
  const double host_px = static_cast<double>(z.focal_h * z.focal_w);
  {
    const vsr::OwnedRasterArray in = host_raster(1, z.focal_h, z.focal_w);
    const std::vector<int> threads = host_thread_counts(rep.machine.cpus);
    std::vector<TimedContender> cs;
    for (int t : threads) {
      cs.push_back({std::to_string(t), [&in, t] {
                      set_host_threads(t);
                      const auto t0 = Clock::now();
                      const vsr::OwnedRasterArray out = vsr::focal_mean_3x3(in);
                      return seconds_since(t0);
                    }});
    }
    const auto s = interleave_timed("4/4 focal mean, host", z.rounds, cs);
    set_host_threads(host_max_threads());
    for (std::size_t i = 0; i < threads.size(); ++i) {
      const double mpx = host_px / median(s[i]) / 1e6;
      const std::string shape = std::to_string(z.focal_h) + " x " + std::to_string(z.focal_w);
      tab.add(
          {"host", std::to_string(threads[i]), shape, std::to_string(z.rounds), fmt("%.1f", mpx)});
      rep.summary.push_back(
          {"focal_mean_3x3 Mpx/s, host, " + std::to_string(threads[i]) + " thread(s)", mpx, "",
           "n/a", ""});
      rep.section_json("{\"section\": \"focal_mean\", \"where\": \"host\", \"threads\": " +
                       std::to_string(threads[i]) + ", \"height\": " + std::to_string(z.focal_h) +
                       ", \"width\": " + std::to_string(z.focal_w) + ", \"rounds\": " +
                       std::to_string(z.rounds) + ", \"mpx_per_s\": " + json_num(mpx) + "}");
    }
  }
  if (!skip.empty()) {
    tab.add({"GPU", "-", "-", "-", skip});
    skipped_row(rep, "focal_mean_3x3 Mpx/s, GPU", "", skip);
    rep.section_json("{\"section\": \"focal_mean\", \"where\": \"gpu\", \"skipped\": " +
                     json_string(skip) + "}");
  } else {
    vsr_bench::bind_primary_context();
    vsr::OwnedRasterArray in = host_raster(1, z.gpu_h, z.gpu_w);
    in.move_to(vsr::Residency::device);
    std::vector<TimedContender> cs{
        {"gpu", [&] { return gpu_round(z.gpu_reps, [&] { (void)vsr::focal_mean_3x3(in); }); }}};
    const auto s = interleave_timed("4/4 focal mean, GPU", z.rounds, cs);
    const double mpx = static_cast<double>(z.gpu_h * z.gpu_w) * z.gpu_reps / median(s[0]) / 1e6;
    tab.add({"GPU", "-", std::to_string(z.gpu_h) + " x " + std::to_string(z.gpu_w),
             std::to_string(z.rounds), fmt("%.1f", mpx)});
    rep.summary.push_back({"focal_mean_3x3 Mpx/s, GPU", mpx, "", "n/a", ""});
    rep.section_json(
        "{\"section\": \"focal_mean\", \"where\": \"gpu\", \"height\": " + std::to_string(z.gpu_h) +
        ", \"width\": " + std::to_string(z.gpu_w) + ", \"rounds\": " + std::to_string(z.rounds) +
        ", \"ops_per_round\": " + std::to_string(z.gpu_reps) + ", \"mpx_per_s\": " + json_num(mpx) +
        "}");
  }
  if (!quiet) {
    tab.print(
        "== 4. focal_mean_3x3 (float32, edge nearest, no nodata), megapixels per second, median "
        "of rounds (information: no goal) ==");
  }
}

int run_dispatch(const DispatchOptions& o) {
  Report rep;
  rep.machine.cpus = std::thread::hardware_concurrency();
  rep.machine.cpu_model = cpu_model();
  const vsr::DriverInfo info = vsr::driver_info();
  rep.machine.library = info.library;
  rep.machine.emulated = info.emulated;
  rep.machine.driver_version = info.driver_version;
  if (info.available && !info.devices.empty()) {
    const auto& d = info.devices.front();
    rep.machine.device = d.name;
    rep.machine.cc_major = d.compute_capability_major;
    rep.machine.cc_minor = d.compute_capability_minor;
  }
  const std::string skip = gpu_skip_reason(info);
  const int omp_threads = host_max_threads();
#if !defined(_OPENMP)
  rep.notes.push_back("built without OpenMP: host rows run 1 thread only");
#endif
  if (!vsr::ops_built_with_cuda()) rep.notes.push_back("library built without CUDA");

  DispatchSizes z;
  if (o.quick) {
    z.cpu_h = 1024;
    z.cpu_w = 2048;  // 8 MiB
    z.focal_h = 512;
    z.focal_w = 1024;
    z.gpu_h = 4096;
    z.gpu_w = 4096;  // 64 MiB
    z.gpu_reps = 5;
    z.pipe_bands = 4;
    z.pipe_h = 2048;
    z.pipe_w = 2048;  // 16 MiB per band
    z.rounds = 3;
  }
  if (skip.empty()) {
    vsr_bench::bind_primary_context();
    BENCH_CU_TRY(
        vsr_bench::driver().cuMemGetInfo(&rep.machine.free_bytes, &rep.machine.total_bytes));
    // Each GPU section holds at most ~3.3x its raster (input, output, copy target, staging):
    // keep that under a third of free memory.
    while (z.gpu_h > 1024 &&
           static_cast<double>(z.gpu_h * z.gpu_w) * 4 * 3.3 > rep.machine.free_bytes / 3.0) {
      z.gpu_h /= 2;
    }
    while (z.pipe_bands > 2 && static_cast<double>(z.pipe_bands * z.pipe_h * z.pipe_w) * 4 * 3.3 >
                                   rep.machine.free_bytes / 3.0) {
      z.pipe_bands /= 2;
    }
  }

  if (!o.json) {
    std::printf("vsr-bench dispatch%s\n", o.quick ? " --quick" : "");
    std::printf("machine: %u CPUs (%s), OpenMP %s\n", rep.machine.cpus,
                rep.machine.cpu_model.c_str(),
#if defined(_OPENMP)
                ("max " + std::to_string(omp_threads) + " threads").c_str()
#else
                "not available"
#endif
    );
    if (info.available) {
      std::printf("driver:  %s%s, version %d.%d; ops built %s CUDA\n", info.library.c_str(),
                  info.emulated ? " [HOST EMULATOR: GPU rows not measured]" : "",
                  info.driver_version / 1000, (info.driver_version % 1000) / 10,
                  vsr::ops_built_with_cuda() ? "with" : "without");
      std::printf("device:  %s (cc %d.%d)", rep.machine.device.c_str(), rep.machine.cc_major,
                  rep.machine.cc_minor);
      if (skip.empty()) {
        std::printf(", %s free of %s", format_bytes(rep.machine.free_bytes).c_str(),
                    format_bytes(rep.machine.total_bytes).c_str());
      }
      std::printf("\n");
    } else {
      std::printf("driver:  none (%s); GPU rows not measured\n", info.reason.c_str());
    }
    std::printf("rounds:  %d; median of interleaved rounds\n", z.rounds);
    for (const auto& n : rep.notes) std::printf("note:    %s\n", n.c_str());
  }

  const auto t0 = Clock::now();
  const auto guarded = [&](const char* name, const std::function<void()>& section) {
    run_section(rep, o.sections, name, section);
    // Give the pool's cached pages back, so one section's device memory never adds to the next.
    if (skip.empty()) {
      try {
        vsr::free_pool_memory();
      } catch (const std::exception& e) {
        case_error(rep, std::string(name) + " (free_pool_memory)", e);
      }
    }
  };
  guarded("cpu", [&] { section_cpu_elementwise(rep, z, o.json); });
  guarded("gpu", [&] { section_gpu_elementwise(rep, z, skip, o.json); });
  // The pipeline runs on the emulator too (a stand-in op: the CUDA ops cannot run there).
  const std::string pipe_mode = !info.available || info.devices.empty() ? "n/a: no GPU"
                                : info.emulated                         ? "emulator"
                                : !vsr::ops_built_with_cuda()           ? "stand-in"
                                                                        : "gpu";
  guarded("pipeline", [&] { section_pipeline(rep, z, pipe_mode, o.json); });
  guarded("focal", [&] { section_focal(rep, z, skip, o.json); });
  const int status = g_errors > 0 ? 1 : 0;
  const double secs = seconds_since(t0);
  progress("done in %.1f s", secs);

  if (o.json) {
    const Machine& m = rep.machine;
    std::printf("{\n  \"benchmark\": \"dispatch\",\n  \"quick\": %s,\n",
                o.quick ? "true" : "false");
    std::printf(
        "  \"machine\": {\"cpus\": %u, \"cpu_model\": %s, \"openmp_max_threads\": %d, "
        "\"driver_available\": %s, \"driver_library\": %s, \"emulated\": %s, "
        "\"driver_version\": %d, \"device\": %s, \"compute_capability\": \"%d.%d\", "
        "\"free_bytes\": %zu, \"total_bytes\": %zu, \"ops_built_with_cuda\": %s, "
        "\"gpu_rows\": %s},\n",
        m.cpus, json_string(m.cpu_model).c_str(), omp_threads, info.available ? "true" : "false",
        json_string(m.library).c_str(), m.emulated ? "true" : "false", m.driver_version,
        json_string(m.device).c_str(), m.cc_major, m.cc_minor, m.free_bytes, m.total_bytes,
        vsr::ops_built_with_cuda() ? "true" : "false",
        json_string(skip.empty() ? "measured" : skip).c_str());
    print_json_tail(rep);
    return status;
  }
  print_summary(rep, "== Summary" + std::string(skip.empty() ? "" : " (GPU rows: " + skip + ")") +
                         ", " + fmt("%.1f", secs) + " s ==");
  return status;
}

int usage(FILE* to) {
  std::fprintf(to,
               "usage: vsr-bench alloc [--quick] [--json] [--seed N] [--sections LIST]\n"
               "       LIST: comma-separated subset of malloc,driver,threads,frag\n"
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
      for (const std::string_view k : known) names += (names.empty() ? "" : ",") + std::string(k);
      throw vsr_cli::UsageError("--sections: unknown section '" + std::string(name) +
                                "' (choose from " + names + ")");
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return list;
}

int parse_and_run(int argc, char** argv) {
  const std::string_view cmd = argv[1];
  if (cmd == "-h" || cmd == "--help") {
    usage(stdout);
    return 0;
  }
  if (cmd != "dispatch" && cmd != "alloc") {
    throw vsr_cli::UsageError("unknown command '" + std::string(cmd) + "' (alloc or dispatch)");
  }
  const bool dispatch = cmd == "dispatch";
  DispatchOptions d;
  Options o;
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
        o.sections = checked_sections(words.value(), {"malloc", "driver", "threads", "frag"});
      }
    } else if (words.is("--seed") && !dispatch) {
      o.seed = vsr_cli::parse_integer<std::uint64_t>(words.option(), words.value());
    } else {
      words.unknown();
    }
  }
  return dispatch ? run_dispatch(d) : run_alloc(o);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage(stderr);
  try {
    return parse_and_run(argc, argv);
  } catch (const vsr_cli::UsageError& e) {
    std::fprintf(stderr, "vsr-bench: %s\n", e.what());
    usage(stderr);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "vsr-bench: %s\n", vsr_cli::printable(e.what()).c_str());
    return 1;
  }
}
