// SPDX-License-Identifier: Apache-2.0
// A downstream program: allocates from the pool, plans a raster, runs a band operation and asks
// for the driver and I/O features, through every public C++ header, and checks what it got.
#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/dispatch.hpp>
#include <vibespatial/raster/driver.hpp>
#include <vibespatial/raster/errors.hpp>
#include <vibespatial/raster/io.hpp>
#include <vibespatial/raster/memory.hpp>
#include <vibespatial/raster/ops.hpp>

#include <cstdio>
#include <string>
#include <vector>

namespace vsr = vibespatial::raster;

int main() {
  const vsr::DriverInfo driver = vsr::driver_info();
  const std::string tier = vsr::configure_memory_pool();
  void* p = vsr::device_allocate(1 << 20);
  if (p == nullptr) return 1;
  vsr::device_deallocate(p, 1 << 20);
  vsr::PlanOptions options;
  options.band_count = 4;
  options.vram_budget = 80'000'000;
  const vsr::RasterPlan plan = vsr::analyze_raster_plan(1000, 1000, vsr::DType::float32, options);
  const std::vector<float> pixels = {1, 2, 3, 4, 5, 6};
  const vsr::OwnedRasterArray raster =
      vsr::OwnedRasterArray::from_host(pixels.data(), vsr::DType::float32, 1, 2, 3);
  const vsr::BandStatistics stats = vsr::band_statistics(raster).at(0);
  std::printf("tier %s on %s, plan %s, %zu bytes allocated in total, mean %.1f, GDAL %s\n",
              tier.c_str(), driver.emulated ? "the emulator" : "a driver",
              std::string(vsr::to_string(plan.strategy)).c_str(),
              *vsr::memory_pool_stats().total_bytes, stats.mean,
              vsr::io_available() ? "yes" : "no");
  return tier == "B" && driver.available && plan.strategy == vsr::TilingStrategy::whole &&
                 stats.count == 6 && stats.mean == 3.5
             ? 0
             : 1;
}
