// SPDX-License-Identifier: Apache-2.0
// vsr-bench dispatch: op throughput against copy bandwidth and pipelined per-band dispatch. This
// header holds the benchmark's sizes, the helpers its sections share (dispatch_helpers.cpp) and the
// sections, one file each: dispatch_elementwise.cpp (1, 2), dispatch_pipeline.cpp (3),
// dispatch_focal.cpp (4); dispatch.cpp runs them.
//
// Bandwidth figures count every byte an op reads plus every byte it writes (rescale float32 ->
// float32: 8 bytes per pixel), and the same for its baseline copy, so a ratio is baseline time
// over op time per round. Host clocks time everything: the driver table has no
// cuEventElapsedTime, so GPU rounds end with cuCtxSynchronize.
#pragma once

#include "bench.hpp"

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/driver.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace vsr = vibespatial::raster;

namespace vsr_bench {

struct DispatchSizes {
  std::int64_t cpu_h = 4096, cpu_w = 8192;      // float32: 128 MiB in, 128 MiB out
  std::int64_t focal_h = 4096, focal_w = 4096;  // 16 Mpx
  std::int64_t gpu_h = 16384, gpu_w = 16384;    // 1 GiB in, 1 GiB out, 1 GiB copy target
  int gpu_reps = 10;                            // ops per timed GPU round (each ~1 ms)
  int pipe_bands = 8;
  std::int64_t pipe_h = 8192, pipe_w = 4096;  // 128 MiB per band, 1 GiB in all
  int rounds = 7;
};

// Sets the OpenMP team size of the host backend's parallel regions started from this thread.
// Returns false without OpenMP (the host backend then runs Thrust's serial backend).
bool set_host_threads(int n);

int host_max_threads();

// Thread counts of the host rows: 1 and 2 (the goals), and all cores as information when the
// machine has more. 1 only without OpenMP.
std::vector<int> host_thread_counts(unsigned cpus);

double seconds_since(Clock::time_point t0);

// memcpy split into `threads` contiguous page-aligned chunks, one std::thread each.
void parallel_memcpy(void* dst, const void* src, std::size_t bytes, int threads);

// A float32 host raster with values in [0, 1000) and no nodata.
vsr::OwnedRasterArray host_raster(int bands, std::int64_t h, std::int64_t w);

// The op the sections time: rescale float32 -> float32.
vsr::OwnedRasterArray rescale_op(const vsr::OwnedRasterArray& r);

struct TimedContender {
  std::string name;
  std::function<double()> round;  // seconds
};

// samples[c][r]: seconds of contender c in round r; one untimed warm-up round each first.
std::vector<std::vector<double>> interleave_timed(const std::string& label, int rounds,
                                                  std::vector<TimedContender>& cs);

double gbps(double bytes, double secs);

// Why the GPU rows are not measured, or empty when they are.
std::string gpu_skip_reason(const vsr::DriverInfo& info);

// Runs `reps` calls of f back to back and waits for the device; seconds.
double gpu_round(int reps, const std::function<void()>& f);

/// 1. CPU elementwise: rescale_into against memcpy.
void section_cpu_elementwise(Report& rep, const DispatchSizes& z, bool quiet);
/// 2. GPU elementwise: rescale on the device against cuMemcpyDtoDAsync.
void section_gpu_elementwise(Report& rep, const DispatchSizes& z, const std::string& skip,
                             bool quiet);
/// 3. Pipelined per-band dispatch against a pinned host-to-device copy.
void section_pipeline(Report& rep, const DispatchSizes& z, const std::string& mode, bool quiet);
/// 4. focal_mean_3x3 throughput (information).
void section_focal(Report& rep, const DispatchSizes& z, const std::string& skip, bool quiet);

}  // namespace vsr_bench
