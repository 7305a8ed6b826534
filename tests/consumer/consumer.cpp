// SPDX-License-Identifier: Apache-2.0
// A downstream program: allocates from the pool, plans a raster, and checks what it got.
#include <vibespatial/raster/dispatch.hpp>
#include <vibespatial/raster/memory.hpp>

#include <cstdio>
#include <cstring>

namespace vsr = vibespatial::raster;

int main() {
  const std::string tier = vsr::configure_memory_pool();
  void* p = vsr::device_allocate(1 << 20);
  if (p == nullptr) return 1;
  vsr::device_deallocate(p, 1 << 20);
  vsr::PlanOptions options;
  options.band_count = 4;
  options.vram_budget = 80'000'000;
  const vsr::RasterPlan plan = vsr::analyze_raster_plan(1000, 1000, vsr::DType::float32, options);
  std::printf("tier %s, plan %s, %zu bytes allocated in total\n", tier.c_str(),
              std::string(vsr::to_string(plan.strategy)).c_str(),
              *vsr::memory_pool_stats().total_bytes);
  return tier == "B" && plan.strategy == vsr::TilingStrategy::whole ? 0 : 1;
}
