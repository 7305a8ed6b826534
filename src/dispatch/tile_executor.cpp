// SPDX-License-Identifier: Apache-2.0
// The tile executor (tiles.hpp): passes, the walk, placement, the first-result rule.
#include "common/expects.hpp"

#include <vibespatial/raster/dispatch.hpp>
#include <vibespatial/raster/tiles.hpp>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace vibespatial::raster {

TileSource::~TileSource() = default;
TileSink::~TileSink() = default;

void TileSink::begin_pass(int /*output_band*/, int /*band_count*/,
                          const std::optional<NodataValue>& /*nodata*/) {}

void TileSink::finish() {}

namespace {

std::string nodata_text(const std::optional<NodataValue>& v) {
  return v ? v->to_string() : std::string("none");
}

}  // namespace

TileResultRule::TileResultRule(std::string name) : name_(std::move(name)) {}

void TileResultRule::check(const OwnedRasterArray& result, const RasterWindow& read,
                           const std::string& tile) {
  if (result.height() != read.height || result.width() != read.width) {
    throw std::invalid_argument(name_ + ": op returned " + std::to_string(result.height()) + " x " +
                                std::to_string(result.width()) + " for " + tile + " of " +
                                std::to_string(read.height) + " x " + std::to_string(read.width) +
                                "; it must return its input's shape");
  }
  if (dtype_ && result.dtype() != *dtype_) {
    throw std::invalid_argument(
        name_ + ": " + tile + " returned dtype " + std::string(to_string(result.dtype())) +
        ", which differs from the first tile's " + std::string(to_string(*dtype_)) +
        ": an op must return one dtype for every tile");
  }
  if (band_count_ && result.band_count() != *band_count_) {
    throw std::invalid_argument(
        name_ + ": " + tile + " returned " + std::to_string(result.band_count()) +
        " band(s), which differs from the first tile's " + std::to_string(*band_count_));
  }
  if (nodata_fixed_ && result.exact_nodata() != nodata_) {
    throw std::invalid_argument(name_ + ": " + tile + " returned nodata " +
                                nodata_text(result.exact_nodata()) +
                                ", which differs from the first tile's " + nodata_text(nodata_) +
                                ": an op must return one nodata for every tile");
  }
  dtype_ = result.dtype();
  band_count_ = result.band_count();
  nodata_ = result.exact_nodata();
  nodata_fixed_ = true;
}

bool bands_independent(int band_count, const RasterPlan& plan, bool per_band) {
  VSR_EXPECTS(band_count >= 1, "tile_passes: no bands");
  VSR_EXPECTS(plan.bands_per_pass >= 1,
              "tile_passes: bands_per_pass " + std::to_string(plan.bands_per_pass) + " < 1");
  // A whole plan is one pass whatever bands_per_pass says (a default RasterPlan says 1).
  return per_band || (plan.strategy != TilingStrategy::whole && plan.bands_per_pass < band_count);
}

std::vector<TilePass> tile_passes(const std::vector<std::optional<NodataValue>>& band_nodata,
                                  const RasterPlan& plan, bool per_band) {
  const int n = static_cast<int>(band_nodata.size());
  std::vector<TilePass> passes;
  if (!bands_independent(n, plan, per_band)) {
    passes.push_back({0, n});
    return passes;
  }
  // Runs of at most `most` consecutive bands of one nodata.
  const int most =
      per_band && plan.strategy == TilingStrategy::whole ? n : std::min(plan.bands_per_pass, n);
  for (int b = 0; b < n; ++b) {
    const auto nd = [&](int i) -> const std::optional<NodataValue>& {
      return band_nodata[static_cast<std::size_t>(i)];
    };
    if (passes.empty() || passes.back().band_count >= most ||
        nd(b) != nd(passes.back().first_band)) {
      passes.push_back({b, 1});
    } else {
      ++passes.back().band_count;
    }
  }
  return passes;
}

namespace {

/// The tile's text in messages.
std::string tile_text(const TileInfo& where) {
  return "tile " + std::to_string(where.index) + " (row " + std::to_string(where.read.row_off) +
         ", column " + std::to_string(where.read.col_off) + ")";
}

/// @p op on @p tile where options.placement says.
OwnedRasterArray compute(const BandOp& op, const OwnedRasterArray& tile,
                         const TileRunOptions& options, const RasterPlan& plan, bool per_band) {
  if (options.placement != Residency::device || tile.residency() == Residency::device) {
    return op(tile);
  }
  if (per_band && tile.band_count() > 1) {
    // dispatch_per_band_gpu stages the bands itself, in batches the plan decided.
    GpuDispatchOptions gpu = options.gpu;
    if (!gpu.plan) {
      RasterPlan batches = plan;
      batches.strategy = TilingStrategy::band_batches;
      batches.tile_shape.reset();
      batches.n_tiles = 0;
      gpu.plan = batches;
    }
    return dispatch_per_band_gpu(tile, op, gpu);
  }
  return op(tile.clone_to(Residency::device));
}

}  // namespace

void run_tiles(TileSource& source, const BandOp& op, TileSink& sink, const RasterPlan& plan,
               const TileRunOptions& options) {
  const std::string& who = options.name;
  VSR_EXPECTS(op, who + ": empty op");
  VSR_EXPECTS(plan.halo >= 0, who + ": negative halo " + std::to_string(plan.halo));
  VSR_EXPECTS(plan.bands_per_pass >= 1,
              who + ": bands_per_pass " + std::to_string(plan.bands_per_pass) + " < 1");
  const RasterMetadata meta = source.metadata();
  std::int64_t th = meta.height, tw = meta.width;
  if (plan.strategy == TilingStrategy::tiled) {
    VSR_EXPECTS(plan.tile_shape && plan.tile_shape->first > 0 && plan.tile_shape->second > 0,
                who + ": a tiled plan needs a positive tile_shape");
    th = std::min(plan.tile_shape->first, meta.height);
    tw = std::min(plan.tile_shape->second, meta.width);
  }
  const std::vector<std::optional<NodataValue>> nodata = source.band_nodata();
  VSR_EXPECTS(static_cast<int>(nodata.size()) == meta.band_count,
              who + ": the source gives " + std::to_string(nodata.size()) + " nodata for " +
                  std::to_string(meta.band_count) + " band(s)");
  const bool per_band = bands_independent(meta.band_count, plan, options.per_band);
  const std::vector<TilePass> passes = tile_passes(nodata, plan, options.per_band);
  if (!per_band && !options.mixed_nodata &&
      std::any_of(nodata.begin(), nodata.end(), [&](const auto& v) { return v != nodata[0]; })) {
    throw std::runtime_error(who +
                             ": the bands differ in nodata and the op takes them together: "
                             "select bands of one nodata, or accept mixed nodata and give each "
                             "band its own (read_raster_info has every band's)");
  }
  const std::vector<TileWindow> tiles = tile_windows(meta.height, meta.width, th, tw, plan.halo);
  const auto total = static_cast<std::int64_t>(passes.size() * tiles.size());

  TileResultRule rule(who);
  bool begun = false;
  std::int64_t index = 0;
  for (const TilePass& pass : passes) {
    if (per_band) rule.expect_band_count(pass.band_count);
    rule.reset_nodata();
    bool first_of_pass = true;
    for (const TileWindow& tile : tiles) {
      TileInfo where;
      where.index = index++;
      where.total = total;
      where.window = tile.window;
      where.read = tile.read;
      where.first_band = pass.first_band;
      where.band_count = pass.band_count;
      where.output_band = per_band ? pass.first_band : 0;
      if (options.stage) options.stage(where, TileStage::read);
      OwnedRasterArray result = [&] {
        // The input tile is released before the result is written: one tile live at a time.
        const OwnedRasterArray in = source.read(where.read, pass.first_band, pass.band_count);
        if (options.stage) options.stage(where, TileStage::compute);
        return compute(op, in, options, plan, per_band);
      }();
      if (per_band && result.band_count() != pass.band_count) {
        throw std::invalid_argument(
            who + ": op returned " + std::to_string(result.band_count()) + " band(s) for " +
            tile_text(where) + " of a pass of " + std::to_string(pass.band_count) +
            " (bands are independent here: a plan with fewer bands per pass than bands, or a "
            "per-band op, returns as many bands as it gets)");
      }
      rule.check(result, where.read, tile_text(where));
      if (!begun) {
        TileOutput out;
        out.dtype = result.dtype();
        out.band_count = per_band ? meta.band_count : result.band_count();
        out.height = meta.height;
        out.width = meta.width;
        out.affine = meta.affine;
        out.crs = meta.crs;
        sink.begin(out);
        begun = true;
      }
      if (first_of_pass) {
        sink.begin_pass(where.output_band, result.band_count(), result.exact_nodata());
        first_of_pass = false;
      }
      if (options.stage) options.stage(where, TileStage::write);
      sink.write(result, where);
      if (options.progress) options.progress(where.index + 1, total);
    }
  }
  sink.finish();
}

}  // namespace vibespatial::raster
