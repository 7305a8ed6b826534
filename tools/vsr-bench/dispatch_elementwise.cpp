// SPDX-License-Identifier: Apache-2.0
// vsr-bench dispatch, sections 1 and 2: rescale against a copy of the same bytes, on the host
// (memcpy) and on the device (cuMemcpyDtoDAsync).
#include "bench_driver.hpp"
#include "dispatch.hpp"

#include <vibespatial/raster/memory.hpp>
#include <vibespatial/raster/ops.hpp>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace vsr_bench {

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

}  // namespace vsr_bench
