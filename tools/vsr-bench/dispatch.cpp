// SPDX-License-Identifier: Apache-2.0
// vsr-bench dispatch: the machine, the sizes fitted to the device, its sections in turn and the
// report.
#include "dispatch.hpp"

#include "bench_driver.hpp"

#include <vibespatial/raster/driver.hpp>
#include <vibespatial/raster/memory.hpp>
#include <vibespatial/raster/ops.hpp>

#include <cstdio>
#include <functional>
#include <string>
#include <thread>

namespace vsr_bench {

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

}  // namespace vsr_bench
