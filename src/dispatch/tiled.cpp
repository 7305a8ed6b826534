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

namespace {

void check_walk(const char* who, std::int64_t height, std::int64_t width, std::int64_t tile_height,
                std::int64_t tile_width, int halo) {
  const std::string name(who);
  VSR_EXPECTS(height > 0 && width > 0,
              name + ": the raster is " + std::to_string(height) + " x " + std::to_string(width));
  VSR_EXPECTS(
      tile_height > 0 && tile_width > 0,
      name + ": tiles of " + std::to_string(tile_height) + " x " + std::to_string(tile_width));
  VSR_EXPECTS(halo >= 0, name + ": negative halo " + std::to_string(halo));
}

TileWindow tile_of(std::int64_t height, std::int64_t width, std::int64_t tile_height,
                   std::int64_t tile_width, int halo, std::int64_t row, std::int64_t col) {
  const std::int64_t r0 = row * tile_height, c0 = col * tile_width;
  TileWindow t;
  t.window =
      RasterWindow{c0, r0, std::min(tile_width, width - c0), std::min(tile_height, height - r0)};
  const std::int64_t pr0 = std::max<std::int64_t>(0, r0 - halo);
  const std::int64_t pc0 = std::max<std::int64_t>(0, c0 - halo);
  const std::int64_t pr1 = std::min(height, r0 + t.window.height + halo);
  const std::int64_t pc1 = std::min(width, c0 + t.window.width + halo);
  t.read = RasterWindow{pc0, pr0, pc1 - pc0, pr1 - pr0};
  return t;
}

}  // namespace

std::vector<TileWindow> tile_windows(std::int64_t height, std::int64_t width,
                                     std::int64_t tile_height, std::int64_t tile_width, int halo) {
  check_walk("tile_windows", height, width, tile_height, tile_width, halo);
  const std::int64_t rows = (height - 1) / tile_height + 1, cols = (width - 1) / tile_width + 1;
  std::vector<TileWindow> tiles;
  tiles.reserve(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      tiles.push_back(tile_of(height, width, tile_height, tile_width, halo, r, c));
    }
  }
  return tiles;
}

TileWindow tile_window_at(std::int64_t height, std::int64_t width, std::int64_t tile_height,
                          std::int64_t tile_width, int halo, std::int64_t index) {
  check_walk("tile_window_at", height, width, tile_height, tile_width, halo);
  const std::int64_t rows = (height - 1) / tile_height + 1, cols = (width - 1) / tile_width + 1;
  if (index < 0 || index / cols >= rows) {
    throw std::out_of_range("tile_window_at: tile " + std::to_string(index) + " is not in [0, " +
                            std::to_string(rows) + " x " + std::to_string(cols) + ")");
  }
  return tile_of(height, width, tile_height, tile_width, halo, index / cols, index % cols);
}

namespace {

/// The checks of a tiled run over an in-memory raster; returns the plan run_tiles walks (every
/// band per tile, `halo` pixels of context), or nothing for a whole plan.
std::optional<RasterPlan> walk_plan(const std::string& name, const OwnedRasterArray& raster,
                                    const RasterPlan& plan, int halo) {
  if (plan.strategy == TilingStrategy::whole) return std::nullopt;
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
  return walk;
}

// The in-memory pair of ends on the one executor, with `halo` pixels of context per side.
OwnedRasterArray tiled(const char* who, const OwnedRasterArray& raster, const BandOp& op,
                       const RasterPlan& plan, int halo) {
  const std::string name(who);
  VSR_EXPECTS(op, name + ": op is empty");
  const std::optional<RasterPlan> walk = walk_plan(name, raster, plan, halo);
  if (!walk) return op(raster);
  RasterTileSource source(raster);
  RasterTileSink sink;
  TileRunOptions options;
  options.name = name;
  run_tiles(source, op, sink, *walk, options);
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

namespace vibespatial::raster {

OwnedRasterArray dispatch_tiled_binary(const OwnedRasterArray& a, const OwnedRasterArray& b,
                                       const BinaryBandOp& op, const RasterPlan& plan) {
  static const std::string name = "dispatch_tiled_binary";
  VSR_EXPECTS(op, name + ": op is empty");
  VSR_EXPECTS(a.height() == b.height() && a.width() == b.width(),
              name + ": a is " + std::to_string(a.width()) + " x " + std::to_string(a.height()) +
                  " pixels and b " + std::to_string(b.width()) + " x " +
                  std::to_string(b.height()) + ": the two rasters must share one grid");
  const std::optional<RasterPlan> walk = walk_plan(name, a, plan, plan.halo);
  if (!walk) return op(a, b);
  (void)walk_plan(name, b, plan, plan.halo);  // b must be on the host too
  RasterTileSource sa(a), sb(b);
  RasterTileSink sink;
  TileRunOptions options;
  options.name = name;
  options.mixed_nodata = true;  // a's and b's nodata are each their own
  run_tiles(
      {&sa, &sb},
      [&](const std::vector<OwnedRasterArray>& t, const TileInfo&) { return op(t[0], t[1]); }, sink,
      *walk, options);
  return sink.result();
}

OwnedRasterArray dispatch_tiled_multipass(const OwnedRasterArray& raster, const BandOp& local_fn,
                                          const MultipassMerge& merge_fn, const RasterPlan& plan) {
  static const std::string name = "dispatch_tiled_multipass";
  VSR_EXPECTS(local_fn, name + ": local_fn is empty");
  VSR_EXPECTS(merge_fn, name + ": merge_fn is empty");
  const std::optional<RasterPlan> walk = walk_plan(name, raster, plan, plan.halo);
  OwnedRasterArray intermediate = [&] {
    if (!walk) return local_fn(raster);
    RasterTileSource source(raster);
    RasterTileSink sink;
    TileRunOptions options;
    options.name = name;
    run_tiles(source, local_fn, sink, *walk, options);
    return sink.result();
  }();
  const std::vector<TileWindow> tiles =
      walk ? tile_windows(raster.height(), raster.width(), walk->tile_shape->first,
                          walk->tile_shape->second, walk->halo)
           : tile_windows(raster.height(), raster.width(), raster.height(), raster.width(), 0);
  const auto shape = [](const OwnedRasterArray& r) {
    return std::to_string(r.band_count()) + " x " + std::to_string(r.height()) + " x " +
           std::to_string(r.width()) + " " + std::string(to_string(r.dtype()));
  };
  OwnedRasterArray merged = merge_fn(intermediate, tiles);
  VSR_EXPECTS(
      merged.dtype() == intermediate.dtype() && merged.band_count() == intermediate.band_count() &&
          merged.height() == intermediate.height() && merged.width() == intermediate.width(),
      name + ": merge_fn returned " + shape(merged) + " for an intermediate of " +
          shape(intermediate) + ": the merge must keep the intermediate's dtype and shape");
  return merged;
}

namespace detail {

void visit_raster_tiles(
    const OwnedRasterArray& raster, const RasterPlan& plan, const std::string& name,
    const std::function<void(const OwnedRasterArray& tile, const TileInfo& where)>& visit) {
  const std::optional<RasterPlan> walk = walk_plan(name, raster, plan, 0);
  if (!walk) {
    TileInfo where;
    where.total = 1;
    where.window = where.read = RasterWindow{0, 0, raster.width(), raster.height()};
    where.band_count = raster.band_count();
    visit(raster, where);
    return;
  }
  RasterTileSource source(raster);
  VisitTileSink sink(visit);
  TileRunOptions options;
  options.name = name;
  run_tiles(
      source, [](const OwnedRasterArray& t) { return t; }, sink, *walk, options);
}

}  // namespace detail

}  // namespace vibespatial::raster
