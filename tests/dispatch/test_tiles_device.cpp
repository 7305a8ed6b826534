// SPDX-License-Identifier: Apache-2.0
// The tile executor's device end on the emulated device: device tiles go up through pinned
// staging on a copy stream, the ops run on the compute stream, results come back through pinned
// staging; two tiles in flight. Results equal the host run's, bit for bit, and a chain's steps
// run on pool memory with no host copy between them.
#include "dispatch/gpu_resources.hpp"
#include "dispatch/tile_device.hpp"
#include "driver/cuda_driver.hpp"
#include "memory/pool_fixture.hpp"

#include <vibespatial/raster/diagnostics.hpp>
#include <vibespatial/raster/dispatch.hpp>
#include <vibespatial/raster/ops.hpp>
#include <vibespatial/raster/pipeline.hpp>
#include <vibespatial/raster/tiles.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <thread>
#include <vector>

using namespace vibespatial::raster;
using namespace vsr_test;

namespace {

/// Bands of a float32 ramp with NaN every 17th pixel; nodata -1 every 23rd.
OwnedRasterArray sample(int bands, std::int64_t h, std::int64_t w) {
  std::vector<float> v(static_cast<std::size_t>(bands * h * w));
  for (std::size_t i = 0; i < v.size(); ++i) {
    v[i] = i % 17 == 3 ? NAN : (i % 23 == 5 ? -1.0f : static_cast<float>((i * 37) % 1000) * 0.5f);
  }
  return OwnedRasterArray::from_host(v.data(), DType::float32, bands, h, w, -1.0,
                                     Affine{10, 0, 500, 0, -10, 900}, "EPSG:32633");
}

std::vector<unsigned char> bytes_of(const OwnedRasterArray& r) {
  std::vector<unsigned char> b(r.byte_size());
  r.copy_to_host(b.data());
  return b;
}

RasterPlan tiled(std::int64_t th, std::int64_t tw, int halo, int bands_per_pass,
                 std::uint64_t per_tile = 0) {
  RasterPlan p;
  p.strategy = TilingStrategy::tiled;
  p.tile_shape = std::make_pair(th, tw);
  p.halo = halo;
  p.bands_per_pass = bands_per_pass;
  p.estimated_vram_per_tile = per_tile;
  return p;
}

/// clip, then rescale, then the focal mean: three ops whose intermediates live on the device.
OwnedRasterArray chain_op(const OwnedRasterArray& t) {
  const OwnedRasterArray c = clip(t, 10, 400);
  const OwnedRasterArray r = rescale(c, 10, 400, 0, 1, DType::float32);
  return focal_mean_3x3(r, EdgeMode::reflect);
}

OwnedRasterArray run(const OwnedRasterArray& raster, const BandOp& op, const RasterPlan& plan,
                     Residency placement, bool per_band, int overlap) {
  RasterTileSource source(raster);
  RasterTileSink sink;
  TileRunOptions o;
  o.placement = placement;
  o.per_band = per_band;
  o.overlap = overlap;
  run_tiles(source, op, sink, plan, o);
  return sink.result();
}

}  // namespace

TEST_SUITE("tiles-device") {
  TEST_CASE("device tiles equal the host run, whole and tiled, with and without overlap") {
    FreshPool fresh(nullptr, 256u << 20);
    const OwnedRasterArray raster = sample(3, 96, 80);
    for (const bool per_band : {false, true}) {
      for (const int overlap : {0, 1, 2}) {
        for (const RasterPlan& plan : {tiled(40, 30, 1, 1), tiled(40, 30, 1, 3), RasterPlan{}}) {
          CAPTURE(per_band);
          CAPTURE(overlap);
          CAPTURE(plan.bands_per_pass);
          const OwnedRasterArray host =
              run(raster, chain_op, plan, Residency::host, per_band, overlap);
          const OwnedRasterArray dev =
              run(raster, chain_op, plan, Residency::device, per_band, overlap);
          CHECK(dev.residency() == Residency::host);
          CHECK(bytes_of(dev) == bytes_of(host));
        }
      }
    }
    // Nothing of the runs is left in the pool: every tile, result and temporary went back.
    CHECK(memory_pool_stats().current_bytes.value_or(1) == 0);
  }

  TEST_CASE("two tiles in flight: tile k+1's upload is queued before tile k's op ended") {
    FreshPool fresh(nullptr, 256u << 20);
    const OwnedRasterArray raster = sample(1, 64, 64);
    std::mutex m;
    std::vector<std::pair<int, int>> steps;  // (kind, tile)
    CUevent computed0 = nullptr;
    CUstream compute = nullptr;
    bool held = false, queued_before_end = false;
    std::thread releaser;
    detail::set_dispatch_observer([&](const detail::DispatchStep& s) {
      std::lock_guard lock(m);
      steps.emplace_back(static_cast<int>(s.kind), s.batch);
      if (s.kind == detail::DispatchStep::staged && s.batch == 0) {
        // Tile 0 is uploaded, its op not yet queued: hold the compute stream so that the op
        // cannot end.
        compute = s.compute;
        held = emulator().stream_pause(compute, 1) == 0;
        // Released after a while whatever happens, so that a run that waited does not hang.
        releaser = std::thread([&emu = emulator(), compute] {
          std::this_thread::sleep_for(std::chrono::milliseconds(2000));
          (void)emu.stream_pause(compute, 0);
        });
      }
      if (s.kind == detail::DispatchStep::computed && s.batch == 0) computed0 = s.event;
      if (s.kind == detail::DispatchStep::staged && s.batch == 1 && held && computed0) {
        queued_before_end = detail::driver().cuEventQuery(computed0) == CUDA_ERROR_NOT_READY;
        (void)emulator().stream_pause(compute, 0);
      }
    });
    const OwnedRasterArray dev =
        run(raster, chain_op, tiled(16, 64, 1, 1), Residency::device, false, 1);
    detail::set_dispatch_observer({});
    if (releaser.joinable()) releaser.join();
    REQUIRE(held);
    CHECK(queued_before_end);
    CHECK(bytes_of(dev) ==
          bytes_of(run(raster, chain_op, tiled(16, 64, 1, 1), Residency::host, false, 1)));
  }

  TEST_CASE(
      "per-band tiles of several bands (dispatch_per_band_gpu): the op's nodata, not the "
      "source's") {
    FreshPool fresh(nullptr, 256u << 20);
    const OwnedRasterArray raster = sample(3, 48, 40);
    const BandOp fill = [](const OwnedRasterArray& t) { return fill_nodata(t, 7); };
    for (const RasterPlan& plan : {tiled(24, 40, 0, 3), RasterPlan{}}) {
      const OwnedRasterArray host = run(raster, fill, plan, Residency::host, true, 0);
      const OwnedRasterArray dev = run(raster, fill, plan, Residency::device, true, 0);
      CHECK_FALSE(host.exact_nodata().has_value());  // fill_nodata's result has none
      CHECK(dev.exact_nodata() == host.exact_nodata());
      CHECK(bytes_of(dev) == bytes_of(host));
    }
  }

  TEST_CASE("one tile in flight where the budget holds one") {
    FreshPool fresh(nullptr, 256u << 20);
    TileRunOptions o;
    o.gpu.vram_budget = 10u << 20;
    CHECK(detail::DeviceTiles::depth_for(tiled(8, 8, 0, 1, 3u << 20), o) == 2);
    CHECK(detail::DeviceTiles::depth_for(tiled(8, 8, 0, 1, 4u << 20), o) == 1);
  }

  TEST_CASE("a chain on device tiles: every step on pool memory, no host copy between steps") {
    FreshPool fresh(nullptr, 256u << 20);
    const OwnedRasterArray a = sample(4, 96, 80);
    Pipeline chain({{"A", 4}});
    // NaN as the output's nodata: a valid (A[4] - A[3]) / (A[4] + A[3]) may be -1, the input's.
    CalcOptions nan_nodata;
    nan_nodata.output_nodata = NodataValue(std::numeric_limits<double>::quiet_NaN());
    chain.calc({"(A[4] - A[3]) / (A[4] + A[3])", "A[1] * 2"}, nan_nodata)
        .focal_mean(EdgeMode::reflect)
        .clip(-0.5, 600)
        .rescale(-0.5, 600, 0, 250, DType::uint8);
    const RasterPlan plan = tiled(32, 40, chain.halo(), 4);
    TileRunOptions host_o;
    const OwnedRasterArray host = chain.run({a}, plan, host_o);
    // The chain's op on the executor's device end, each result's log read as it leaves the op.
    std::atomic<int> steps_on_device{0}, steps_elsewhere{0};
    const MultiTileOp op = [&, inner = chain.tile_op()](const std::vector<OwnedRasterArray>& t,
                                                        const TileInfo& where) {
      OwnedRasterArray r = inner(t, where);
      for (const RasterDiagnosticEvent& e : r.diagnostics()->events()) {
        if (e.detail.find("Pipeline: step") != 0) continue;
        ++(e.residency == Residency::device ? steps_on_device : steps_elsewhere);
      }
      return r;
    };
    RasterTileSource source(a);
    RasterTileSink sink;
    TileRunOptions dev_o;
    dev_o.placement = Residency::device;
    dev_o.overlap = 1;
    const auto before =
        emulator().call_count("cuMemcpyDtoHAsync") + emulator().call_count("cuMemcpyDtoH");
    run_tiles({&source}, op, sink, plan, dev_o);
    const auto copies =
        emulator().call_count("cuMemcpyDtoHAsync") + emulator().call_count("cuMemcpyDtoH") - before;
    CHECK(bytes_of(sink.result()) == bytes_of(host));
    // 3 x 2 tiles, each downloaded once: the steps in between stay on the device.
    CHECK(copies == 6);
    CHECK(steps_on_device == 4 * 6);
    CHECK(steps_elsewhere == 0);
  }
}
