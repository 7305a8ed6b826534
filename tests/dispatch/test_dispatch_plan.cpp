// SPDX-License-Identifier: Apache-2.0
// dispatch_per_band_gpu with the caller's budget and plan (GpuDispatchOptions::vram_budget and
// ::plan, the BandOp overload taking options): the device goes as the caller said, not as the
// device's free memory would say. vsr-run prints its plan and passes the same plan down.
#include "memory/pool_fixture.hpp"

#include <vibespatial/raster/dispatch.hpp>
#include <vibespatial/raster/errors.hpp>
#include <vibespatial/raster/memory.hpp>

#include <cstdint>
#include <set>
#include <stdexcept>
#include <vector>

using namespace vibespatial::raster;
using namespace vsr_test;

namespace {

constexpr std::int64_t kH = 256, kW = 256;  // 256 KiB of float32 per band
constexpr std::uint64_t kBand = kH * kW * sizeof(float);

std::vector<float> pixels(int bands) {
  std::vector<float> v(static_cast<std::size_t>(bands) * static_cast<std::size_t>(kH * kW));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 4099) - 7.0f;
  return v;
}

/// out = 2 * in + 1 in a new device raster, as a kernel would (emulator device pointers are host
/// pointers; the batch's copy is complete when a BandOp is called). Records the view it got.
struct TwicePlusOne {
  std::vector<const void*>* seen;
  OwnedRasterArray operator()(const OwnedRasterArray& band) const {
    REQUIRE(band.residency() == Residency::device);
    REQUIRE(band.band_count() == 1);
    seen->push_back(band.device_pointer());
    const auto* in = static_cast<const float*>(band.device_pointer());
    OwnedRasterArray out = OwnedRasterArray::allocate(Residency::device, DType::float32, 1,
                                                      band.height(), band.width(), band.nodata());
    auto* o = static_cast<float*>(out.device_data());
    for (std::int64_t i = 0; i < kH * kW; ++i) o[i] = 2.0f * in[i] + 1.0f;
    return out;
  }
};

/// The plan vsr-run prints for per-band work on @p r with @p budget (plan_from_metadata).
RasterPlan caller_plan(const OwnedRasterArray& r, std::uint64_t budget) {
  PlanOptions o;
  o.per_band = true;
  o.buffers_per_band = 2;
  o.vram_budget = budget;
  return plan_from_metadata(r.metadata(), o);
}

/// Options carrying the caller's budget and plan.
GpuDispatchOptions caller_options(std::uint64_t budget, const RasterPlan& plan) {
  GpuDispatchOptions o;
  o.vram_budget = budget;
  o.plan = plan;
  return o;
}

/// One dispatch of TwicePlusOne with options @p o: its result, its report and the band views the
/// op was given.
struct Run {
  GpuDispatchReport rep;
  std::vector<const void*> seen;
  OwnedRasterArray out;
  Run(const OwnedRasterArray& r, const GpuDispatchOptions& o)
      : out(dispatch_per_band_gpu(r, BandOp(TwicePlusOne{&seen}), o, &rep)) {}
};

void check_result(const OwnedRasterArray& out, const std::vector<float>& in) {
  std::vector<float> got(out.byte_size() / sizeof(float));
  out.copy_to_host(got.data());
  REQUIRE(got.size() == in.size());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < in.size(); ++i) bad += got[i] != 2.0f * in[i] + 1.0f;
  CHECK(bad == 0);
}

}  // namespace

TEST_SUITE("dispatch-plan") {
  TEST_CASE("a BandOp dispatch batches as the caller's plan says, not as the free memory says") {
    // 64 MiB of device memory would take all six bands in one pass; the caller's 2 MiB budget
    // (1.4 MiB usable) plans 2 bands of 2 x 256 KiB per pass: three passes.
    FreshPool fresh(nullptr, 64 * MiB);
    const std::vector<float> px = pixels(6);
    const OwnedRasterArray r =
        OwnedRasterArray::from_host(px.data(), DType::float32, 6, kH, kW, -1.0);
    const std::uint64_t budget = 2 * MiB;
    const RasterPlan plan = caller_plan(r, budget);
    REQUIRE(plan.strategy == TilingStrategy::band_batches);
    REQUIRE(plan.bands_per_pass == 2);

    const Run run(r, caller_options(budget, plan));
    const GpuDispatchReport& rep = run.rep;
    const std::vector<const void*>& seen = run.seen;
    CHECK(rep.plan == plan);
    CHECK(rep.vram_budget == budget);
    CHECK(rep.passes == 3);
    // Two passes of 1 MiB do not fit 1.4 MiB: one batch at a time, as planned.
    CHECK(rep.pipeline_depth == 1);
    CHECK(emulator().call_count("cuMemcpyHtoDAsync") == 3);
    // The bands of a batch are views of one slot: two distinct band addresses per pass, one slot.
    REQUIRE(seen.size() == 6);
    CHECK(std::set<const void*>(seen.begin(), seen.end()).size() == 2);
    CHECK(static_cast<const unsigned char*>(seen[1]) - static_cast<const unsigned char*>(seen[0]) ==
          static_cast<std::ptrdiff_t>(kBand));
    CHECK(*memory_pool_stats().peak_bytes <= budget);  // what dispatch promises
    CHECK(run.out.band_count() == 6);
    CHECK(run.out.nodata() == -1.0);
    check_result(run.out, px);
    free_dispatch_resources();
  }

  TEST_CASE("a caller's plan made for half the budget is double-buffered") {
    FreshPool fresh(nullptr, 64 * MiB);
    const std::vector<float> px = pixels(6);
    const OwnedRasterArray r = OwnedRasterArray::from_host(px.data(), DType::float32, 6, kH, kW);
    const std::uint64_t budget = 4 * MiB;
    const RasterPlan plan = caller_plan(r, budget / 2);  // 2 bands per pass, 1 MiB
    REQUIRE(plan.bands_per_pass == 2);
    GpuDispatchOptions o = caller_options(budget, plan);
    const Run run(r, o);
    CHECK(run.rep.passes == 3);
    CHECK(run.rep.pipeline_depth == 2);
    CHECK(std::set<const void*>(run.seen.begin(), run.seen.end()).size() == 4);  // two slots
    CHECK(*memory_pool_stats().peak_bytes <= budget);  // what dispatch promises
    check_result(run.out, px);
    o.pipeline_depth = 1;
    const Run one_at_a_time(r, o);
    check_result(one_at_a_time.out, px);
    CHECK(one_at_a_time.rep.pipeline_depth == 1);
    free_dispatch_resources();
  }

  TEST_CASE("a BandOp dispatch plans from the caller's budget when no plan is given") {
    FreshPool fresh(nullptr, 64 * MiB);
    const std::vector<float> px = pixels(6);
    const OwnedRasterArray r = OwnedRasterArray::from_host(px.data(), DType::float32, 6, kH, kW);
    GpuDispatchOptions o;
    o.vram_budget = 2 * MiB;  // double-buffered: 1 MiB per pass, 0.7 MiB usable: 1 band
    const Run run(r, o);
    check_result(run.out, px);
    CHECK(run.rep.vram_budget == 2 * MiB);
    CHECK(run.rep.plan == caller_plan(r, MiB));
    CHECK(run.rep.passes == 6);
    free_dispatch_resources();
  }

  TEST_CASE("a caller's plan that cannot be followed is refused") {
    FreshPool fresh(nullptr, 64 * MiB);
    const std::vector<float> px = pixels(3);
    const OwnedRasterArray r = OwnedRasterArray::from_host(px.data(), DType::float32, 3, kH, kW);
    std::vector<const void*> seen;
    const BandOp op = TwicePlusOne{&seen};
    GpuDispatchOptions o;
    o.vram_budget = 100 * 1024;
    o.plan = caller_plan(r, *o.vram_budget);
    REQUIRE(o.plan->strategy == TilingStrategy::tiled);
    CHECK_THROWS_WITH_AS(dispatch_per_band_gpu(r, op, o),
                         doctest::Contains("use dispatch_tiled or dispatch_tiled_halo"),
                         std::runtime_error);
    o.plan = RasterPlan{};
    o.plan->bands_per_pass = 0;
    CHECK_THROWS_WITH_AS(dispatch_per_band_gpu(r, op, o),
                         doctest::Contains("bands_per_pass must be >= 1"), std::invalid_argument);
    o.plan.reset();
    o.pipeline_depth = 3;
    CHECK_THROWS_AS(dispatch_per_band_gpu(r, op, o), std::invalid_argument);
    CHECK(seen.empty());
    free_dispatch_resources();
  }
}
