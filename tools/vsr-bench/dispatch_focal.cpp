// SPDX-License-Identifier: Apache-2.0
// vsr-bench dispatch, section 4: focal_mean_3x3 throughput on the host and the device.
#include "bench_driver.hpp"
#include "dispatch.hpp"

#include <vibespatial/raster/ops.hpp>

#include <string>
#include <vector>

namespace vsr_bench {

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

}  // namespace vsr_bench
