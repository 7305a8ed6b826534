// SPDX-License-Identifier: Apache-2.0
// vsr-bench dispatch: the helpers its sections share (dispatch.hpp).
#include "bench_driver.hpp"
#include "dispatch.hpp"

#include <vibespatial/raster/ops.hpp>

#include <cstring>
#include <thread>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace vsr_bench {

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

double gpu_round(int reps, const std::function<void()>& f) {
  const auto& api = vsr_bench::driver();
  BENCH_CU_TRY(api.cuCtxSynchronize());
  const auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) f();
  BENCH_CU_TRY(api.cuCtxSynchronize());
  return seconds_since(t0);
}

}  // namespace vsr_bench
