// SPDX-License-Identifier: Apache-2.0
// vsr-bench alloc: the machine it runs on, the sizes fitted to the device, its sections in turn and
// the report.
#include "alloc.hpp"

#include "bench_driver.hpp"

#include <vibespatial/raster/driver.hpp>
#include <vibespatial/raster/memory.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>

namespace vsr_bench {
namespace {

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
void fit_to_device(Report& rep, AllocSizes& z) {
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

void print_machine(const Report& rep, const AllocOptions& o, const AllocSizes& z) {
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
  std::printf(
      "rounds:  %d (malloc, scale), %d (driver), %d (threads); median of interleaved rounds\n",
      z.rounds, z.drv_rounds, z.thread_rounds);
  for (const auto& n : rep.notes) std::printf("note:    %s\n", n.c_str());
}

void print_json(const Report& rep, const AllocOptions& o) {
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

}  // namespace

Trace make_large_trace(std::size_t live, std::size_t steps, std::uint64_t seed) {
  return make_trace("large", live, 1 * kMiB, 64 * kMiB, steps, seed);
}

int run_alloc(const AllocOptions& o) {
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
  AllocSizes z;
  if (o.quick) {
    z.small_steps = 20000;
    z.large_steps = 2000;  // fewer and the first steps after the fill, which remap pages, dominate
    z.drv_small_steps = 1000;
    z.drv_large_steps = 100;
    z.thread_steps = 100000;  // a few ms per round: shorter is mostly thread start-up
    z.frag_allocs = 500;
    z.frag_cap = 1 * kGiB;
    z.rounds = z.drv_rounds = z.thread_rounds = 3;
    z.default_lives = {64, 256};
    z.default_steps = 1000;
    z.growth_bytes = 4 * kGiB;
  }
  if (o.large_live != 0) z.large_live = o.large_live;
  fit_to_device(rep, z);
  if (!o.json) print_machine(rep, o, z);

  const Trace small = make_trace("small", z.small_live, 256, 256 * kKiB, z.small_steps, o.seed);
  const std::uint64_t large_seed = o.seed + 1;
  const Trace large =
      make_large_trace(z.large_live, std::max(z.large_steps, z.drv_large_steps), large_seed);

  const auto t0 = Clock::now();
  const auto guarded = [&](const char* name, const std::function<void()>& section) {
    run_section(rep, o.sections, name, section);
  };
  guarded("malloc", [&] { section_malloc(rep, small, large, z, o.json); });
  guarded("driver", [&] { section_driver(rep, small, large, z, o.json); });
  guarded("threads", [&] { section_threads(rep, z, o.seed, o.json); });
  guarded("frag", [&] { section_fragmentation(rep, z, o.seed, o.json); });
  guarded("scale", [&] { section_scale(rep, large, large_seed, z, o.json); });
  guarded("slack", [&] { section_default(rep, z, o.seed, o.json); });
  guarded("growth", [&] { section_growth(rep, z, o.json); });
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

}  // namespace vsr_bench
