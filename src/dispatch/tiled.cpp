// SPDX-License-Identifier: Apache-2.0
// The tile walk, and the in-memory tiled executors (pointwise and halo tiles, stitched on the
// host): a host raster source and a host raster sink on run_tiles (tiles.hpp).
#include "common/expects.hpp"

#include <vibespatial/raster/dispatch.hpp>
#include <vibespatial/raster/tiles.hpp>

#include <algorithm>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace vibespatial::raster {

std::vector<TileWindow> tile_windows(std::int64_t height, std::int64_t width,
                                     std::int64_t tile_height, std::int64_t tile_width, int halo) {
  VSR_EXPECTS(height > 0 && width > 0, "tile_windows: the raster is " + std::to_string(height) +
                                           " x " + std::to_string(width));
  VSR_EXPECTS(
      tile_height > 0 && tile_width > 0,
      "tile_windows: tiles of " + std::to_string(tile_height) + " x " + std::to_string(tile_width));
  VSR_EXPECTS(halo >= 0, "tile_windows: negative halo " + std::to_string(halo));
  std::vector<TileWindow> tiles;
  tiles.reserve(
      static_cast<std::size_t>(((height - 1) / tile_height + 1) * ((width - 1) / tile_width + 1)));
  for (std::int64_t r0 = 0; r0 < height; r0 += tile_height) {
    for (std::int64_t c0 = 0; c0 < width; c0 += tile_width) {
      TileWindow t;
      t.window = RasterWindow{c0, r0, std::min(tile_width, width - c0),
                              std::min(tile_height, height - r0)};
      const std::int64_t pr0 = std::max<std::int64_t>(0, r0 - halo);
      const std::int64_t pc0 = std::max<std::int64_t>(0, c0 - halo);
      const std::int64_t pr1 = std::min(height, r0 + t.window.height + halo);
      const std::int64_t pc1 = std::min(width, c0 + t.window.width + halo);
      t.read = RasterWindow{pc0, pr0, pc1 - pc0, pr1 - pr0};
      tiles.push_back(t);
    }
  }
  return tiles;
}

namespace {

// The in-memory pair of ends on the one executor, with `halo` pixels of context per side.
OwnedRasterArray tiled(const char* who, const OwnedRasterArray& raster, const BandOp& op,
                       const RasterPlan& plan, int halo) {
  const std::string name(who);
  VSR_EXPECTS(op, name + ": op is empty");
  if (plan.strategy == TilingStrategy::whole) return op(raster);
  VSR_EXPECTS(plan.strategy == TilingStrategy::tiled,
              name + ": plan strategy " + std::string(to_string(plan.strategy)) +
                  " is not whole or tiled (band_batches: use dispatch_per_band_gpu)");
  VSR_EXPECTS(plan.tile_shape && plan.tile_shape->first > 0 && plan.tile_shape->second > 0,
              name + ": a tiled plan needs a positive tile_shape");
  VSR_EXPECTS(halo >= 0, name + ": plan.halo must be >= 0");
  VSR_EXPECTS(raster.host_data() != nullptr,
              name +
                  ": tiled dispatch needs a host-resident raster (a full device to host "
                  "transfer would defeat the OOM-avoidance goal)");
  RasterPlan walk = plan;
  walk.halo = halo;
  // Every band in each tile: the op takes the tile's bands together.
  walk.bands_per_pass = raster.band_count();
  RasterTileSource source(raster);
  RasterTileSink sink;
  TileRunOptions options;
  options.name = name;
  run_tiles(source, op, sink, walk, options);
  return sink.result();
}

}  // namespace

OwnedRasterArray dispatch_tiled(const OwnedRasterArray& raster, const BandOp& op,
                                const RasterPlan& plan) {
  return tiled("dispatch_tiled", raster, op, plan, 0);
}

OwnedRasterArray dispatch_tiled_halo(const OwnedRasterArray& raster, const BandOp& op,
                                     const RasterPlan& plan) {
  return tiled("dispatch_tiled_halo", raster, op, plan, plan.halo);
}

}  // namespace vibespatial::raster
