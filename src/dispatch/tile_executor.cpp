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

/// The per-band GPU dispatch options of a tile for @p plan: the caller's, or band batches of the
/// run's plan.
GpuDispatchOptions band_batches(const TileRunOptions& options, const RasterPlan& plan) {
  GpuDispatchOptions gpu = options.gpu;
  if (!gpu.plan) {
    RasterPlan batches = plan;
    batches.strategy = TilingStrategy::band_batches;
    batches.tile_shape.reset();
    batches.n_tiles = 0;
    gpu.plan = batches;
  }
  return gpu;
}

/// What one run walks: the grid, the passes and the tiles, checked before anything is read.
struct Walk {
  RasterMetadata meta;           ///< of source 0
  std::vector<int> band_counts;  ///< of each source
  bool per_band = false;
  std::vector<TilePass> passes;
  std::vector<TileWindow> tiles;
  std::int64_t total = 0;
};

Walk walk_of(const std::vector<TileSource*>& sources, const RasterPlan& plan,
             const TileRunOptions& options) {
  const std::string& who = options.name;
  VSR_EXPECTS(!sources.empty(), who + ": no source");
  VSR_EXPECTS(std::none_of(sources.begin(), sources.end(), [](auto* s) { return s == nullptr; }),
              who + ": a null source");
  VSR_EXPECTS(plan.halo >= 0, who + ": negative halo " + std::to_string(plan.halo));
  VSR_EXPECTS(plan.bands_per_pass >= 1,
              who + ": bands_per_pass " + std::to_string(plan.bands_per_pass) + " < 1");
  Walk w;
  w.meta = sources[0]->metadata();
  std::vector<std::vector<std::optional<NodataValue>>> nodata;
  for (std::size_t i = 0; i < sources.size(); ++i) {
    const RasterMetadata m = i == 0 ? w.meta : sources[i]->metadata();
    VSR_EXPECTS(m.height == w.meta.height && m.width == w.meta.width,
                who + ": source " + std::to_string(i) + " is " + std::to_string(m.width) + " x " +
                    std::to_string(m.height) + " pixels and source 0 " +
                    std::to_string(w.meta.width) + " x " + std::to_string(w.meta.height) +
                    ": the sources of a run share one grid");
    nodata.push_back(sources[i]->band_nodata());
    w.band_counts.push_back(m.band_count);
    VSR_EXPECTS(static_cast<int>(nodata.back().size()) == m.band_count,
                who + ": source " + std::to_string(i) + " gives " +
                    std::to_string(nodata.back().size()) + " nodata for " +
                    std::to_string(m.band_count) + " band(s)");
  }
  std::int64_t th = w.meta.height, tw = w.meta.width;
  if (plan.strategy == TilingStrategy::tiled) {
    VSR_EXPECTS(plan.tile_shape && plan.tile_shape->first > 0 && plan.tile_shape->second > 0,
                who + ": a tiled plan needs a positive tile_shape");
    th = std::min(plan.tile_shape->first, w.meta.height);
    tw = std::min(plan.tile_shape->second, w.meta.width);
  }
  w.per_band = bands_independent(w.meta.band_count, plan, options.per_band);
  if (w.per_band) {
    for (std::size_t i = 1; i < nodata.size(); ++i) {
      VSR_EXPECTS(nodata[i].size() == nodata[0].size(),
                  who + ": source " + std::to_string(i) + " has " +
                      std::to_string(nodata[i].size()) + " band(s) and source 0 " +
                      std::to_string(nodata[0].size()) +
                      ": bands taken one by one need sources of one band count");
    }
    // A band's key is its nodata in every source: passes split where any of them changes.
    // tile_passes compares one nodata per band, so the key is folded into the first source's
    // list by marking bands that start a new run of the other sources.
    w.passes = tile_passes(nodata[0], plan, options.per_band);
    for (std::size_t i = 1; i < nodata.size(); ++i) {
      std::vector<TilePass> split;
      for (const TilePass& p : w.passes) {
        TilePass cur{p.first_band, 1};
        for (int b = p.first_band + 1; b < p.first_band + p.band_count; ++b) {
          if (nodata[i][static_cast<std::size_t>(b)] ==
              nodata[i][static_cast<std::size_t>(cur.first_band)]) {
            ++cur.band_count;
          } else {
            split.push_back(cur);
            cur = {b, 1};
          }
        }
        split.push_back(cur);
      }
      w.passes = std::move(split);
    }
  } else {
    w.passes = tile_passes(nodata[0], plan, false);
    if (!options.mixed_nodata) {
      for (std::size_t i = 0; i < nodata.size(); ++i) {
        const auto& nd = nodata[i];
        if (std::any_of(nd.begin(), nd.end(), [&](const auto& v) { return v != nd[0]; })) {
          throw std::runtime_error(
              who + ": the bands " +
              (sources.size() > 1 ? "of source " + std::to_string(i) + " " : "") +
              "differ in nodata and the op takes them together: select bands of one nodata, or "
              "accept mixed nodata and give each band its own (read_raster_info has every "
              "band's)");
        }
      }
    }
  }
  w.tiles = tile_windows(w.meta.height, w.meta.width, th, tw, plan.halo);
  w.total = static_cast<std::int64_t>(w.passes.size() * w.tiles.size());
  return w;
}

/// The executor's loop: @p compute(where) reads and computes one tile; the rule checks it and
/// the sink writes it.
template <class Compute>
void walk_tiles(const Walk& w, TileSink& sink, const TileRunOptions& options, Compute&& compute) {
  const std::string& who = options.name;
  TileResultRule rule(who);
  bool begun = false;
  std::int64_t index = 0;
  for (const TilePass& pass : w.passes) {
    if (w.per_band) rule.expect_band_count(pass.band_count);
    rule.reset_nodata();
    bool first_of_pass = true;
    for (const TileWindow& tile : w.tiles) {
      TileInfo where;
      where.index = index++;
      where.total = w.total;
      where.window = tile.window;
      where.read = tile.read;
      where.first_band = w.per_band ? pass.first_band : 0;
      where.band_count = pass.band_count;
      where.output_band = w.per_band ? pass.first_band : 0;
      if (options.stage) options.stage(where, TileStage::read);
      const OwnedRasterArray result = compute(where);
      if (w.per_band && result.band_count() != pass.band_count) {
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
        out.band_count = w.per_band ? w.meta.band_count : result.band_count();
        out.height = w.meta.height;
        out.width = w.meta.width;
        out.affine = w.meta.affine;
        out.crs = w.meta.crs;
        sink.begin(out);
        begun = true;
      }
      if (first_of_pass) {
        sink.begin_pass(where.output_band, result.band_count(), result.exact_nodata());
        first_of_pass = false;
      }
      if (options.stage) options.stage(where, TileStage::write);
      sink.write(result, where);
      if (options.progress) options.progress(where.index + 1, w.total);
    }
  }
  sink.finish();
}

/// @p tile where options.placement says (one copy to the device).
OwnedRasterArray placed_tile(OwnedRasterArray tile, const TileRunOptions& options) {
  if (options.placement != Residency::device || tile.residency() == Residency::device) {
    return tile;
  }
  return tile.clone_to(Residency::device);
}

}  // namespace

void run_tiles(TileSource& source, const BandOp& op, TileSink& sink, const RasterPlan& plan,
               const TileRunOptions& options) {
  VSR_EXPECTS(op, options.name + ": empty op");
  const Walk w = walk_of({&source}, plan, options);
  walk_tiles(w, sink, options, [&](const TileInfo& where) {
    // The input tile is released before the result is written: one tile live at a time.
    const OwnedRasterArray in = source.read(where.read, where.first_band, where.band_count);
    if (options.stage) options.stage(where, TileStage::compute);
    if (options.placement == Residency::device && in.residency() != Residency::device &&
        w.per_band && in.band_count() > 1) {
      // dispatch_per_band_gpu stages the bands itself, in batches the plan decided.
      return dispatch_per_band_gpu(in, op, band_batches(options, plan));
    }
    return op(placed_tile(in, options));
  });
}

void run_tiles(const std::vector<TileSource*>& sources, const MultiTileOp& op, TileSink& sink,
               const RasterPlan& plan, const TileRunOptions& options) {
  VSR_EXPECTS(op, options.name + ": empty op");
  const Walk w = walk_of(sources, plan, options);
  walk_tiles(w, sink, options, [&](const TileInfo& where) {
    std::vector<OwnedRasterArray> tiles;
    tiles.reserve(sources.size());
    for (std::size_t i = 0; i < sources.size(); ++i) {
      const int count = w.per_band ? where.band_count : w.band_counts[i];
      tiles.push_back(placed_tile(sources[i]->read(where.read, where.first_band, count), options));
    }
    if (options.stage) options.stage(where, TileStage::compute);
    return op(tiles, where);
  });
}

}  // namespace vibespatial::raster
