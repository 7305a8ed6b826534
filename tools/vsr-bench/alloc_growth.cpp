// SPDX-License-Identifier: Apache-2.0
// vsr-bench alloc, section 7: what growing the pool costs in driver time under the emulator's A100
// latency model (emulator only): one request of G bytes, and G in 256 MiB requests, with
// multi-page handles (the default: one cuMemCreate per long run of new pages) and with one handle
// per page (VSR_POOL_MULTI_PAGE_MIN=0), side by side. The pool reads that variable when it is
// configured, so each way runs in a process of its own: this program again as the hidden command
// `alloc-growth-worker`, which prints one line "vsr-bench-growth <figures>".
//
// Driver time is modelled: the calls each growth made (the emulator counts them) times the
// model's latency per call; the wall time, which adds the pool's and the emulator's own work, is
// printed beside it.
#include "alloc.hpp"
#include "bench_driver.hpp"

#include <vibespatial/raster/memory.hpp>

#include <dlfcn.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace vsr_bench {
namespace {

constexpr std::size_t kStepBytes = 256 * kMiB;

// The emulator's `a100` preset (tools/cuda-emulator/options.cpp), in ns per call.
struct Latency {
  const char* entry;
  double ns;
};
constexpr std::array<Latency, 5> kA100 = {{{"cuMemAddressReserve", 19000},
                                           {"cuMemCreate", 193000},
                                           {"cuMemMap", 1450},
                                           {"cuMemSetAccess", 36000},
                                           {"cuMemUnmap", 25600}}};

struct Growth {
  double wall_s = 0, model_s = 0;
  unsigned long long creates = 0, maps = 0;
};

using CallCount = unsigned long long (*)(const char*);

CallCount call_count() {
  static const CallCount count = []() -> CallCount {
    const vsr::DriverInfo info = vsr::driver_info();
    if (!info.available || !info.emulated) return nullptr;
    void* lib = ::dlopen(info.library.c_str(), RTLD_NOW | RTLD_LOCAL);
    return lib != nullptr ? reinterpret_cast<CallCount>(::dlsym(lib, "vsr_emu_call_count"))
                          : nullptr;
  }();
  if (count == nullptr) throw std::runtime_error("the growth section needs the host emulator");
  return count;
}

// Grows an empty pool by `bytes` in requests of `step` bytes, with the latency model on.
Growth grow(std::size_t bytes, std::size_t step) {
  vsr::free_pool_memory();
  const CallCount count = call_count();
  std::array<unsigned long long, kA100.size()> before{};
  for (std::size_t i = 0; i < kA100.size(); ++i) before[i] = count(kA100[i].entry);
  const unsigned long long creates = count("cuMemCreate"), maps = count("cuMemMap");
  if (emulator_set_option("LATENCY", "a100") != 0) {
    throw std::runtime_error("the emulator refused LATENCY=a100");
  }
  std::vector<void*> blocks;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    for (std::size_t done = 0; done < bytes; done += step)
      blocks.push_back(vsr::device_allocate(step));
  } catch (...) {
    emulator_set_option("LATENCY", "");
    for (void* p : blocks) vsr::device_deallocate(p, step);
    throw;
  }
  Growth g;
  g.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  emulator_set_option("LATENCY", "");
  for (std::size_t i = 0; i < kA100.size(); ++i) {
    g.model_s += static_cast<double>(count(kA100[i].entry) - before[i]) * kA100[i].ns * 1e-9;
  }
  g.creates = count("cuMemCreate") - creates;
  g.maps = count("cuMemMap") - maps;
  for (void* p : blocks) vsr::device_deallocate(p, step);
  vsr::free_pool_memory();
  return g;
}

std::string exe_path() {
  std::vector<char> buf(4096);
  const ssize_t n = ::readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  if (n <= 0) throw std::runtime_error("growth: cannot read /proc/self/exe");
  return std::string(buf.data(), static_cast<std::size_t>(n));
}

// Runs the worker with VSR_POOL_MULTI_PAGE_MIN set to `multi` (nullptr: unset): its two growths.
std::array<Growth, 2> run_worker(const char* multi, std::size_t bytes) {
  const std::string exe = exe_path();
  if (exe.find('\'') != std::string::npos) throw std::runtime_error("growth: odd program path");
  const std::string cmd = std::string("env ") +
                          (multi ? std::string("VSR_POOL_MULTI_PAGE_MIN=") + multi
                                 : std::string("-u VSR_POOL_MULTI_PAGE_MIN")) +
                          " '" + exe + "' alloc-growth-worker " + std::to_string(bytes);
  FILE* f = ::popen(cmd.c_str(), "r");
  if (f == nullptr) throw std::runtime_error("growth: cannot start the worker");
  std::array<Growth, 2> g{};
  std::string error;
  bool got = false;
  char line[512];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, "vsr-bench-growth error ", 23) == 0) error = line + 23;
    got = got || std::sscanf(line, "vsr-bench-growth %lf %lf %llu %llu %lf %lf %llu %llu",
                             &g[0].wall_s, &g[0].model_s, &g[0].creates, &g[0].maps, &g[1].wall_s,
                             &g[1].model_s, &g[1].creates, &g[1].maps) == 8;
  }
  const int status = ::pclose(f);
  if (!error.empty()) throw std::runtime_error("growth worker: " + error);
  if (!got || status != 0) throw std::runtime_error("growth worker failed");
  return g;
}

}  // namespace

int run_growth_worker(std::size_t bytes) {
  try {
    void* warm = vsr::device_allocate(4096);  // configures the pool outside the measurement
    const Growth one = grow(bytes, bytes);
    const Growth steps = grow(bytes, kStepBytes);
    vsr::device_deallocate(warm, 4096);
    std::printf("vsr-bench-growth %.6f %.6f %llu %llu %.6f %.6f %llu %llu\n", one.wall_s,
                one.model_s, one.creates, one.maps, steps.wall_s, steps.model_s, steps.creates,
                steps.maps);
    return 0;
  } catch (const std::exception& e) {
    std::printf("vsr-bench-growth error %s\n", e.what());
    return 1;
  }
}

void section_growth(Report& rep, const AllocSizes& z, bool quiet) {
  const std::string goal = ">= 80";
  const std::size_t bytes = z.growth_bytes;
  if (!rep.machine.emulated) {
    skipped_row(rep, "pool growth GB/s of driver time, A100 model", goal,
                "n/a: the latency model is the emulator's");
    return;
  }
  Table tab({"handles", "requests", "cuMemCreate", "cuMemMap", "driver time (A100 model)", "GB/s",
             "wall", "goal", "met"});
  const std::string total = format_bytes(bytes);
  std::array<Growth, 2> multi{}, per_page{};
  progress("7/7 growth: %s with multi-page handles, then per page", total.c_str());
  if (!run_case(rep, tab, "multi-page", "growth multi-page",
                [&] { multi = run_worker(nullptr, bytes); }) ||
      !run_case(rep, tab, "per page", "growth per page",
                [&] { per_page = run_worker("0", bytes); })) {
    return;
  }
  const auto gbs = [bytes](const Growth& g) {
    return g.model_s > 0 ? static_cast<double>(bytes) / g.model_s / 1e9 : NAN;
  };
  const char* const ways[2] = {"multi-page", "per page"};
  const std::string requests[2] = {"1 x " + total, total + " in 256 MiB"};
  for (int w = 0; w < 2; ++w) {
    const std::array<Growth, 2>& g = w == 0 ? multi : per_page;
    for (int r = 0; r < 2; ++r) {
      const bool scored = w == 0 && r == 0;
      const double v = gbs(g[static_cast<std::size_t>(r)]);
      tab.add({ways[w], requests[r], std::to_string(g[static_cast<std::size_t>(r)].creates),
               std::to_string(g[static_cast<std::size_t>(r)].maps),
               fmt("%.4f s", g[static_cast<std::size_t>(r)].model_s), fmt("%.1f", v),
               fmt("%.3f s", g[static_cast<std::size_t>(r)].wall_s), scored ? goal : "(info)",
               scored ? met_str(v, goal) : "n/a"});
      rep.section_json(
          "{\"section\": \"growth\", \"handles\": " + json_string(ways[w]) +
          ", \"bytes\": " + std::to_string(bytes) +
          ", \"request_bytes\": " + std::to_string(r == 0 ? bytes : kStepBytes) +
          ", \"creates\": " + std::to_string(g[static_cast<std::size_t>(r)].creates) +
          ", \"maps\": " + std::to_string(g[static_cast<std::size_t>(r)].maps) +
          ", \"driver_s_a100_model\": " + json_num(g[static_cast<std::size_t>(r)].model_s) +
          ", \"gb_per_s\": " + json_num(v) +
          ", \"wall_s\": " + json_num(g[static_cast<std::size_t>(r)].wall_s) + "}");
    }
  }
  const double v = gbs(multi[0]);
  rep.summary.push_back({"pool growth by " + total +
                             " in one request, GB/s of driver time (A100 "
                             "model)",
                         v, goal, met_str(v, goal),
                         "per page: " + fmt("%.1f", gbs(per_page[0])) + " GB/s"});
  if (!quiet) tab.print("== 7. Growth (" + total + "): multi-page handles against one per page ==");
}

}  // namespace vsr_bench
