// SPDX-License-Identifier: Apache-2.0
// A vsr-run's reductions (job.hpp): statistics and histograms streamed tile by tile over the
// input, or over a pipeline's output.
#include "checked_math.hpp"
#include "cli.hpp"
#include "format.hpp"
#include "job.hpp"
#include "steps.hpp"

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/io.hpp>
#include <vibespatial/raster/ops.hpp>
#include <vibespatial/raster/pipeline.hpp>
#include <vibespatial/raster/tiles.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace vsr_run {

namespace {

/// Runs @p fn on @p piece where the ops run: on the device when @p where is (a host piece is
/// cloned there once, freed on return), else on the host.
template <class Fn>
auto on_compute(vsr::Residency where, const vsr::OwnedRasterArray& piece, Fn&& fn) {
  if (where != vsr::Residency::device || piece.residency() == vsr::Residency::device) {
    return fn(piece);
  }
  return fn(piece.clone_to(vsr::Residency::device));
}

}  // namespace

/// A streamed reduction over the input: each tile handed to @p visit on the host (the visitor
/// moves what it computes to the device itself).
void Job::reduce(const std::string& what, const vsr::VisitTileSink::Visit& visit) {
  Progress pass(show_progress_, what);
  vsr::TileRunOptions o = tile_options(pass);
  o.placement = vsr::Residency::host;
  vsr::VisitTileSink sink(visit);
  vsr::run_tiles(
      *source_, [](const vsr::OwnedRasterArray& t) { return t; }, sink, plan_, o);
}

/// Statistics of tiles merged per band (merge_statistics: exact min/max/count, Chan's update).
void Job::run_statistics() {
  reduce(args_.op == Op::stats ? args_.op_name : args_.op_name + " (range pass)",
         [&](const vsr::OwnedRasterArray& tile, const vsr::TileInfo& where) {
           const std::vector<vsr::BandStatistics> s = on_compute(
               placement_.residency, tile, [](const auto& r) { return vsr::band_statistics(r); });
           for (int b = 0; b < where.band_count; ++b) {
             vsr::BandStatistics& band = stats_[static_cast<std::size_t>(where.first_band + b)];
             band = vsr::merge_statistics(band, s[static_cast<std::size_t>(b)]);
           }
         });
}

void Job::run_histogram() {
  const std::size_t nsel = bands_.size();
  hist_range_.resize(nsel);
  if (args_.range) {
    std::fill(hist_range_.begin(), hist_range_.end(), *args_.range);
  } else {
    // numpy's default range: each band's valid min and max (+-0.5 when they are equal).
    run_statistics();
    for (std::size_t b = 0; b < nsel; ++b) {
      const vsr::BandStatistics& m = stats_[b];
      if (m.count > 0 && (!std::isfinite(m.min) || !std::isfinite(m.max))) {
        throw std::runtime_error("histogram: band " + std::to_string(bands_[b]) +
                                 " holds infinite values (its valid range is [" +
                                 std::to_string(m.min) + ", " + std::to_string(m.max) +
                                 "]): give --range LO,HI");
      }
      hist_range_[b] = m.count == 0    ? Range{0, 1}
                       : m.min < m.max ? Range{m.min, m.max}
                                       : Range{m.min - 0.5, m.max + 0.5};
    }
  }
  hist_.assign(nsel, std::vector<std::int64_t>(static_cast<std::size_t>(args_.bins), 0));
  reduce(args_.op_name, [&](const vsr::OwnedRasterArray& tile, const vsr::TileInfo& where) {
    for (int b = 0; b < where.band_count; ++b) {
      const auto k = static_cast<std::size_t>(where.first_band + b);
      const auto h = on_compute(placement_.residency, tile.band(b), [&](const auto& r) {
        return vsr::histogram(r, args_.bins, hist_range_[k].lo, hist_range_[k].hi);
      });
      for (std::size_t i = 0; i < h[0].size(); ++i) hist_[k][i] += h[0][i];
    }
  });
}

/// A terminal stats or histogram: the chain's output reduced tile by tile, never written. Its
/// bands are the chain's output bands (1-based), each with its pass's nodata; histograms use
/// --range (a pipeline has no first pass to find one).
void Job::reduce_pipeline(const std::vector<vsr::TileSource*>& sources,
                          const vsr::TileRunOptions& o) {
  bands_.clear();
  band_nodata_.clear();
  stats_.clear();
  hist_.clear();
  const auto band_slot = [&](int k, const vsr::OwnedRasterArray& result) {
    while (static_cast<int>(bands_.size()) <= k) {
      bands_.push_back(static_cast<int>(bands_.size()) + 1);
      band_nodata_.push_back(result.exact_nodata());
      stats_.emplace_back();
      hist_.emplace_back(static_cast<std::size_t>(args_.bins), 0);
    }
    return static_cast<std::size_t>(k);
  };
  vsr::VisitTileSink sink([&](const vsr::OwnedRasterArray& result, const vsr::TileInfo& where) {
    const vsr::OwnedRasterArray host =
        result.residency() == vsr::Residency::host ? result : result.clone_to(vsr::Residency::host);
    // The result covers the read window, halo included: only the tile's own pixels count.
    const vsr::RasterWindow own{where.window.col_off - where.read.col_off,
                                where.window.row_off - where.read.row_off, where.window.width,
                                where.window.height};
    const bool whole = own.col_off == 0 && own.row_off == 0 && own.width == host.width() &&
                       own.height == host.height();
    const vsr::OwnedRasterArray tile = whole ? host : vsr::copy_window(host, own);
    meta_.dtype = tile.dtype();
    const std::vector<vsr::BandStatistics> s = vsr::band_statistics(tile);
    for (int b = 0; b < tile.band_count(); ++b) {
      const std::size_t k = band_slot(where.output_band + b, tile);
      if (args_.terminal == Op::stats) {
        stats_[k] = vsr::merge_statistics(stats_[k], s[static_cast<std::size_t>(b)]);
      } else {
        const auto h = vsr::histogram(tile.band(b), args_.bins, args_.range->lo, args_.range->hi);
        for (std::size_t i = 0; i < h[0].size(); ++i) hist_[k][i] += h[0][i];
      }
    }
  });
  vsr::run_tiles(sources, chain_->tile_op(), sink, plan_, o);
  hist_range_.assign(bands_.size(), args_.range.value_or(Range{0, 1}));
}

}  // namespace vsr_run
