// SPDX-License-Identifier: Apache-2.0
// vsr-bench: benchmark programs. Every figure is a ratio measured side by side in one run: rounds
// of the contenders are interleaved (A, B, A, B, ...) and the median of the per-round ratios is
// reported, because the machines this runs on are shared and noisy.
//
//   vsr-bench alloc [--quick] [--json] [--seed N] [--sections malloc,driver,threads,frag]
//                                                    the device memory pool (issue 3)
//   vsr-bench dispatch                               not yet implemented (exit 2)
//
// Exit status: 0 when every section ran (goals missed or not), 1 when one failed (the others still
// run and the summary names the failure), 2 on bad arguments
// or an unimplemented subcommand, 77 when there is no usable driver or device.
#include "driver/cuda_driver.hpp"

#include <vibespatial/raster/driver.hpp>
#include <vibespatial/raster/memory.hpp>

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
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace vsr = vibespatial::raster;
namespace detail = vibespatial::raster::detail;

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

std::string bytes_str(std::size_t b) {
  if (b >= kGiB) return fmt("%.2f GiB", static_cast<double>(b) / kGiB);
  if (b >= kMiB) return fmt("%.1f MiB", static_cast<double>(b) / kMiB);
  if (b >= kKiB) return fmt("%.0f KiB", static_cast<double>(b) / kKiB);
  return std::to_string(b) + " B";
}

std::string json_escape(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

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
    VSR_CU_TRY(detail::driver().cuMemAlloc(&p, b));
    return reinterpret_cast<void*>(p);
  }
  void release(void* p, std::size_t) {
    VSR_CU_TRY(detail::driver().cuMemFree(reinterpret_cast<CUdeviceptr>(p)));
  }
  void settle() {}
};

struct CuMemAllocAsync {
  CUstream stream = nullptr;
  void* alloc(std::size_t b) {
    CUdeviceptr p = 0;
    VSR_CU_TRY(detail::driver().cuMemAllocAsync(&p, b, stream));
    return reinterpret_cast<void*>(p);
  }
  void release(void* p, std::size_t) {
    VSR_CU_TRY(detail::driver().cuMemFreeAsync(reinterpret_cast<CUdeviceptr>(p), stream));
  }
  void settle() { VSR_CU_TRY(detail::driver().cuStreamSynchronize(stream)); }
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
  std::size_t thread_steps = 100000;
  std::size_t frag_allocs = 20000;
  std::size_t frag_cap = 4 * kGiB;
  int rounds = 7, drv_rounds = 5, thread_rounds = 5;
};

int g_errors = 0;

void case_error(Report& rep, const std::string& name, const std::exception& e) {
  std::fprintf(stderr, "vsr-bench: %s failed: %s\n", name.c_str(), e.what());
  rep.summary.push_back({name + ": ERROR", NAN, "", "error", e.what()});
  rep.section_json("{\"section\": " + json_escape(name) + ", \"error\": " + json_escape(e.what()) +
                   "}");
  ++g_errors;
}

void section_malloc(Report& rep, const Trace& small, const Trace& large, const Sizes& z,
                    bool quiet) {
  const std::string label = "1/4 pool vs malloc";
  Table tab({"trace", "live", "sizes", "steps", "rounds", "pool ns/op", "malloc ns/op",
             "pool/malloc", "goal", "met"});
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
        bytes_str(c.t->lo) + "-" + bytes_str(c.t->hi) + " " + dist_name(c.t->dist);
    tab.add({c.t->name, std::to_string(c.t->fill.size()), sizes, std::to_string(c.steps),
             std::to_string(z.rounds), fmt("%.1f", median(s[0])), fmt("%.1f", median(s[1])),
             fmt("%.3f", ratio), c.goal, met});
    rep.summary.push_back(
        {"pool/malloc ns per op, " + c.t->name + " trace", ratio, c.goal, met, ""});
    rep.section_json(
        "{\"section\": \"pool_vs_malloc\", \"trace\": " + json_escape(c.t->name) +
        ", \"live\": " + std::to_string(c.t->fill.size()) +
        ", \"steps\": " + std::to_string(c.steps) + ", \"rounds\": " + std::to_string(z.rounds) +
        ", \"pool_ns_per_op\": " + json_num(median(s[0])) +
        ", \"malloc_ns_per_op\": " + json_num(median(s[1])) + ", \"ratio\": " + json_num(ratio) +
        ", \"goal\": " + json_escape(c.goal) + ", \"met\": " + json_escape(met) + "}");
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
  const auto& api = detail::driver();
  const bool has_async = api.cuMemAllocAsync != nullptr && api.cuMemFreeAsync != nullptr;
  // Never destroyed: the pool keeps marks and cached blocks that name the stream it was freed on.
  static CUstream stream = nullptr;
  if (stream == nullptr) VSR_CU_TRY(api.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
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
        std::string(emu ? "true" : "false") + ", \"trace\": " + json_escape(c.t->name) +
        ", \"live\": " + std::to_string(c.t->fill.size()) + ", \"steps\": " +
        std::to_string(c.steps) + ", \"rounds\": " + std::to_string(z.drv_rounds) +
        ", \"pool_ns_per_op\": " + json_num(median(s[0])) +
        ", \"cuMemAlloc_ns_per_op\": " + json_num(median(s[1])) +
        ", \"cuMemAllocAsync_ns_per_op\": " + json_num(has_async ? median(s[2]) : NAN) +
        ", \"pool_over_cuMemAlloc\": " + json_num(r_sync) +
        ", \"pool_over_cuMemAllocAsync\": " + json_num(r_async) +
        ", \"goal\": " + json_escape(goal) + ", \"met\": " + json_escape(met) + "}");
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
      ", \"goal\": " + json_escape(goal) + ", \"met\": " + json_escape(met) + "}");
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
             bytes_str(z.frag_cap).c_str());
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
    tab.add({sizes, bytes_str(z.frag_cap), std::to_string(f.allocs), std::to_string(f.frees),
             bytes_str(f.peak_live), bytes_str(f.peak_pool), fmt("%.4f", f.ratio),
             fmt("%.4f", f.page_floor), scored ? goal : "(info)", met});
    rep.summary.push_back({"fragmentation peak pool_size / peak live requested, " + sizes, f.ratio,
                           scored ? goal : "", met,
                           "page-rounding floor " + fmt("%.4f", f.page_floor)});
    rep.section_json(
        "{\"section\": \"fragmentation\", \"sizes\": " + json_escape(sizes) +
        ", \"live_cap_bytes\": " + std::to_string(z.frag_cap) +
        ", \"allocs\": " + std::to_string(f.allocs) + ", \"frees\": " + std::to_string(f.frees) +
        ", \"pool_size_before\": " + std::to_string(f.base) +
        ", \"peak_live_requested_bytes\": " + std::to_string(f.peak_live) +
        ", \"peak_live_page_rounded_bytes\": " + std::to_string(f.peak_live_pages) +
        ", \"peak_pool_size_bytes\": " + std::to_string(f.peak_pool) + ", \"ratio\": " +
        json_num(f.ratio) + ", \"page_rounding_floor\": " + json_num(f.page_floor) +
        ", \"goal\": " + json_escape(scored ? goal : "") + ", \"met\": " + json_escape(met) + "}");
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
  detail::bind_current_device();
  VSR_CU_TRY(detail::driver().cuMemGetInfo(&m.free_bytes, &m.total_bytes));
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
                        bytes_str(rep.machine.free_bytes) + " free device memory");
    z.large_live = std::max<std::size_t>(fit, 1);
  }
  const auto frag_fit = static_cast<std::size_t>(0.25 * free_b);
  if (z.frag_cap > frag_fit) {
    rep.notes.push_back("fragmentation live cap scaled down from " + bytes_str(z.frag_cap) +
                        " to " + bytes_str(frag_fit) + " to fit free device memory");
    z.frag_cap = std::max<std::size_t>(frag_fit, 128 * kMiB);
  }
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
              bytes_str(m.free_bytes).c_str(), bytes_str(m.total_bytes).c_str());
  std::printf("pool:    tier %s, page %s, small blocks up to %s\n", m.tier.c_str(),
              bytes_str(m.granularity).c_str(), bytes_str(m.small_limit).c_str());
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
      m.cpus, json_escape(m.cpu_model).c_str(), json_escape(m.library).c_str(),
      m.emulated ? "true" : "false", m.driver_version, json_escape(m.device).c_str(), m.cc_major,
      m.cc_minor, m.free_bytes, m.total_bytes, json_escape(m.tier).c_str(), m.granularity,
      m.small_limit);
  std::string notes;
  for (const auto& n : rep.notes) notes += (notes.empty() ? "" : ", ") + json_escape(n);
  std::printf("  \"notes\": [%s],\n", notes.c_str());
  std::printf("  \"sections\": [\n    %s\n  ],\n", rep.sections_json.c_str());
  std::printf("  \"summary\": [\n");
  for (std::size_t i = 0; i < rep.summary.size(); ++i) {
    const auto& r = rep.summary[i];
    std::printf("    {\"metric\": %s, \"value\": %s, \"goal\": %s, \"met\": %s, \"note\": %s}%s\n",
                json_escape(r.metric).c_str(), json_num(r.value).c_str(),
                json_escape(r.goal).c_str(), json_escape(r.met).c_str(),
                json_escape(r.note).c_str(), i + 1 < rep.summary.size() ? "," : "");
  }
  std::printf("  ]\n}\n");
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
    z.large_steps = 300;
    z.drv_small_steps = 1000;
    z.drv_large_steps = 100;
    z.thread_steps = 10000;
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
  // A failing section is reported and the others still run.
  const auto guarded = [&](const char* name, const std::function<void()>& section) {
    if (!o.sections.empty() &&
        ("," + o.sections + ",").find("," + std::string(name) + ",") == std::string::npos) {
      return;
    }
    try {
      section();
    } catch (const std::exception& e) {
      case_error(rep, name, e);
    }
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
  Table sum({"metric", "value", "goal", "met?"});
  for (const auto& r : rep.summary) {
    sum.add({r.metric + (r.note.empty() ? "" : " (" + r.note + ")"),
             std::isfinite(r.value) ? fmt("%.3f", r.value) : "-", r.goal.empty() ? "-" : r.goal,
             r.met});
  }
  sum.print("== Summary" + std::string(rep.machine.emulated ? " (CPU + host emulator)" : "") +
            ", " + fmt("%.1f", secs) + " s ==");
  return status;
}

int usage(FILE* to) {
  std::fprintf(to,
               "usage: vsr-bench alloc [--quick] [--json] [--seed N] [--sections LIST]\n"
               "       LIST: comma-separated subset of malloc,driver,threads,frag\n"
               "       vsr-bench dispatch   (not yet implemented)\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage(stderr);
  const std::string cmd = argv[1];
  if (cmd == "-h" || cmd == "--help") {
    usage(stdout);
    return 0;
  }
  if (cmd == "dispatch") {
    std::fprintf(stderr, "vsr-bench dispatch: not yet implemented\n");
    return 2;
  }
  if (cmd != "alloc") return usage(stderr);
  Options o;
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      o.json = true;
    } else if (std::strcmp(argv[i], "--quick") == 0) {
      o.quick = true;
    } else if (std::strcmp(argv[i], "--sections") == 0 && i + 1 < argc) {
      o.sections = argv[++i];
    } else if (std::strcmp(argv[i], "--seed") == 0 && i + 1 < argc) {
      o.seed = std::strtoull(argv[++i], nullptr, 10);
    } else {
      return usage(stderr);
    }
  }
  try {
    return run_alloc(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "vsr-bench: %s\n", e.what());
    return 1;
  }
}
