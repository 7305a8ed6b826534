// SPDX-License-Identifier: Apache-2.0
// Zonal statistics over a tile source (zonal.hpp): the options' checks, the plan, and the one
// pass over the tiles for polygon zones and for a zone raster.
#include "common/dtype_visit.hpp"
#include "zonal/accumulator.hpp"
#include "zonal/coverage.hpp"
#include "zonal/zonal_internal.hpp"

#include <vibespatial/raster/zonal.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <limits>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>
#include <unordered_map>

namespace vibespatial::raster {

namespace {

constexpr double nan = std::numeric_limits<double>::quiet_NaN();
constexpr std::uint64_t default_budget = 256ull << 20;

using detail::StatNeeds;
using detail::ZoneAccumulator;

bool is_float(DType d) {
  return d == DType::float32 || d == DType::float64;
}

// Band @p band of a host tile as doubles, NaN where the pixel is invalid (nodata or NaN).
void band_as_doubles(const OwnedRasterArray& tile, int band,
                     const std::optional<NodataValue>& nodata, std::vector<double>& out) {
  const auto n = static_cast<std::size_t>(tile.height() * tile.width());
  out.resize(n);
  const bool has_nodata = nodata.has_value();
  const double nd = has_nodata ? nodata->to_double() : 0.0;
  detail::visit_dtype(tile.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* p = static_cast<const T*>(tile.host_data()) + static_cast<std::size_t>(band) * n;
    for (std::size_t i = 0; i < n; ++i) {
      const auto v = static_cast<double>(p[i]);
      const bool invalid =
          std::isnan(v) || (has_nodata && (v == nd || (std::isnan(nd) && std::isnan(v))));
      out[i] = invalid ? nan : v;
    }
  });
}

}  // namespace

namespace detail {

void check_stats(const ZonalOptions& o, bool have_weights) {
  if (o.stats.empty()) throw ZonalInputError("zonal_stats: no statistics asked for");
  std::set<std::string> seen;
  const auto& known = zonal_stat_names();
  for (const std::string& s : o.stats) {
    if (std::find(known.begin(), known.end(), s) == known.end()) {
      std::string list;
      for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
      throw ZonalInputError("zonal_stats: unknown statistic '" + s + "' (known: " + list + ")");
    }
    if (!seen.insert(s).second) {
      throw ZonalInputError("zonal_stats: statistic '" + s + "' asked for twice");
    }
  }
  if (!(o.quantile >= 0 && o.quantile <= 1)) {
    throw ZonalInputError("zonal_stats: quantile must be in [0, 1], got " +
                          std::to_string(o.quantile));
  }
  if (stat_needs(o.stats).weights && !have_weights) {
    throw ZonalInputError("zonal_stats: weighted_mean and weighted_sum need a weights raster");
  }
}

void check_same_grid(const RasterMetadata& a, const RasterMetadata& b, const std::string& what) {
  const auto close = [](double x, double y) {
    return std::abs(x - y) <= 1e-9 * std::max({1.0, std::abs(x), std::abs(y)});
  };
  const Affine &p = a.affine, &q = b.affine;
  if (a.height != b.height || a.width != b.width || !close(p.a, q.a) || !close(p.b, q.b) ||
      !close(p.c, q.c) || !close(p.d, q.d) || !close(p.e, q.e) || !close(p.f, q.f)) {
    throw ZonalInputError("zonal_stats: " + what + " is not on the raster's grid (" +
                          std::to_string(b.height) + " x " + std::to_string(b.width) +
                          " pixels vs " + std::to_string(a.height) + " x " +
                          std::to_string(a.width) +
                          ", or another geotransform): it is never "
                          "resampled");
  }
}

std::uint64_t bytes_per_pixel(const RasterMetadata& m, std::size_t bands,
                              std::optional<DType> weights) {
  // The tile as read, each used band's float64 copy, the coverage (float32) and the running sums
  // (float64) of one zone's window, and the weights' tile and copy.
  std::uint64_t bpp = static_cast<std::uint64_t>(m.band_count) * itemsize(m.dtype) + 8 * bands + 12;
  if (weights) bpp += itemsize(*weights) + 8;
  return bpp;
}

RasterPlan zonal_plan(const RasterMetadata& m, std::uint64_t bytes_per_pixel,
                      const ZonalOptions& o) {
  RasterPlan plan;
  if (o.tile_shape) {
    const auto [th, tw] = *o.tile_shape;
    if (th < 1 || tw < 1) throw ZonalInputError("zonal_stats: tile_shape must be positive");
    plan.strategy = TilingStrategy::tiled;
    plan.tile_shape = std::pair{std::min(th, m.height), std::min(tw, m.width)};
    plan.n_tiles = ((m.height + th - 1) / th) * ((m.width + tw - 1) / tw);
  } else {
    PlanOptions po;
    po.band_count = static_cast<int>(std::max<std::uint64_t>(1, bytes_per_pixel));
    po.buffers_per_band = 1;
    po.vram_budget = o.memory_budget == 0 ? default_budget : o.memory_budget;
    plan = analyze_raster_plan(m.height, m.width, DType::uint8, po);
  }
  plan.bands_per_pass = std::max(1, m.band_count);
  return plan;
}

std::vector<int> selected_bands(const ZonalOptions& o, int band_count) {
  std::vector<int> bands = o.bands;
  if (bands.empty()) {
    bands.resize(static_cast<std::size_t>(band_count));
    std::iota(bands.begin(), bands.end(), 1);
  }
  for (int b : bands) {
    if (b < 1 || b > band_count) {
      throw ZonalInputError("zonal_stats: band " + std::to_string(b) + " is not in [1, " +
                            std::to_string(band_count) + "]");
    }
  }
  return bands;
}

ZonalTable make_table(const ZoneIds& ids, const std::vector<int>& row_zone,
                      const std::vector<int>& labels, std::vector<ZoneAccumulator>& acc,
                      const ZonalOptions& o, DType dtype) {
  ZonalTable t;
  t.stat_names = o.stats;
  t.zone.kind = ids.kind;
  const std::size_t nb = labels.size();
  const std::size_t rows = row_zone.size() * nb;
  t.values.assign(o.stats.size(), std::vector<double>(rows));
  const bool frac = std::find(o.stats.begin(), o.stats.end(), "frac") != o.stats.end();
  if (frac) t.frac.resize(rows);
  for (std::size_t z = 0; z < row_zone.size(); ++z) {
    const auto src = static_cast<std::size_t>(row_zone[z]);
    for (std::size_t b = 0; b < nb; ++b) {
      const std::size_t row = z * nb + b;
      ZoneAccumulator& a = acc[src * nb + b];
      switch (ids.kind) {
        case ZoneIds::Kind::integer:
          t.zone.integers.push_back(ids.integers[src]);
          break;
        case ZoneIds::Kind::real:
          t.zone.reals.push_back(ids.reals[src]);
          break;
        case ZoneIds::Kind::text:
          t.zone.texts.push_back(ids.texts[src]);
          break;
      }
      t.band.push_back(labels[b]);
      for (std::size_t s = 0; s < o.stats.size(); ++s) {
        t.values[s][row] = detail::final_stat(o.stats[s], a, dtype, o.quantile);
      }
      if (frac && a.cells > 0) t.frac[row] = detail::final_frac(a);
    }
  }
  return t;
}

void prepare_source(TileSource& source, const RasterPlan& plan) {
  if (auto* file = dynamic_cast<RasterFileSource*>(&source)) {
    StreamOptions so;
    file->prepare(plan, so, "zonal_stats");
  }
}

}  // namespace detail

namespace {

struct Run {
  RasterMetadata meta;
  std::vector<std::optional<NodataValue>> nodata;
  std::vector<int> bands;  // 1-based among the source's bands
  StatNeeds needs;
  RasterPlan plan;
  std::int64_t tile_h = 0, tile_w = 0, tiles_across = 1, tiles_down = 1;
};

Run start(TileSource& values, TileSource* weights, const ZonalOptions& o,
          std::uint64_t extra_bytes_per_pixel) {
  detail::check_stats(o, weights != nullptr);
  Run r;
  r.meta = values.metadata();
  const Affine& a = r.meta.affine;
  if (a.b != 0 || a.d != 0 || a.a == 0 || a.e == 0) {
    throw ZonalInputError(
        "zonal_stats: the raster's grid is rotated or degenerate (affine b, d "
        "must be 0, a and e nonzero)");
  }
  r.nodata = values.band_nodata();
  r.bands = detail::selected_bands(o, r.meta.band_count);
  r.needs = detail::stat_needs(o.stats);
  std::optional<DType> weights_dtype;
  if (weights != nullptr) {
    const RasterMetadata wm = weights->metadata();
    detail::check_same_grid(r.meta, wm, "the weights raster");
    if (wm.band_count != 1)
      throw ZonalInputError("zonal_stats: the weights raster must have one band");
    weights_dtype = wm.dtype;
  }
  r.plan = detail::zonal_plan(
      r.meta,
      detail::bytes_per_pixel(r.meta, r.bands.size(), weights_dtype) + extra_bytes_per_pixel, o);
  if (r.plan.strategy == TilingStrategy::tiled) {
    r.tile_h = r.plan.tile_shape->first;
    r.tile_w = r.plan.tile_shape->second;
  } else {
    r.tile_h = r.meta.height;
    r.tile_w = r.meta.width;
  }
  r.tiles_down = (r.meta.height + r.tile_h - 1) / r.tile_h;
  r.tiles_across = (r.meta.width + r.tile_w - 1) / r.tile_w;
  detail::prepare_source(values, r.plan);
  return r;
}

void walk(const Run& r, std::vector<TileSource*> sources, const ZonalOptions& o,
          const MultiTileOp& op) {
  VisitTileSink sink;
  TileRunOptions ro;
  ro.name = "zonal_stats";
  ro.mixed_nodata = true;
  ro.progress = o.progress;
  run_tiles(sources, op, sink, r.plan, ro);
}

RasterWindow intersect(const RasterWindow& a, const RasterWindow& b) {
  const std::int64_t c0 = std::max(a.col_off, b.col_off);
  const std::int64_t r0 = std::max(a.row_off, b.row_off);
  const std::int64_t c1 = std::min(a.col_off + a.width, b.col_off + b.width);
  const std::int64_t r1 = std::min(a.row_off + a.height, b.row_off + b.height);
  if (c1 <= c0 || r1 <= r0) return {};
  return {c0, r0, c1 - c0, r1 - r0};
}

// The tiles each zone's window meets, as lists per tile (compressed rows).
struct TileBuckets {
  std::vector<std::size_t> start;  // tiles + 1
  std::vector<std::uint32_t> zones;
};

TileBuckets bucket_zones(const Run& r, const std::vector<RasterWindow>& windows) {
  const auto tiles = static_cast<std::size_t>(r.tiles_down * r.tiles_across);
  TileBuckets b;
  b.start.assign(tiles + 1, 0);
  const auto each = [&](const RasterWindow& w, auto&& f) {
    if (w.width <= 0) return;
    for (std::int64_t tr = w.row_off / r.tile_h; tr <= (w.row_off + w.height - 1) / r.tile_h;
         ++tr) {
      for (std::int64_t tc = w.col_off / r.tile_w; tc <= (w.col_off + w.width - 1) / r.tile_w;
           ++tc) {
        f(static_cast<std::size_t>(tr * r.tiles_across + tc));
      }
    }
  };
  for (const RasterWindow& w : windows) each(w, [&](std::size_t t) { ++b.start[t + 1]; });
  for (std::size_t t = 0; t < tiles; ++t) b.start[t + 1] += b.start[t];
  b.zones.resize(b.start[tiles]);
  std::vector<std::size_t> fill(b.start.begin(), b.start.end() - 1);
  for (std::size_t z = 0; z < windows.size(); ++z) {
    each(windows[z], [&](std::size_t t) { b.zones[fill[t]++] = static_cast<std::uint32_t>(z); });
  }
  return b;
}

// One thread's buffers of a polygon run.
struct Worker {
  std::vector<ZoneAccumulator> partial;
  std::vector<float> cov;
  detail::CoverageScratch scratch;
};

int thread_count(int asked) {
  if (asked > 0) return std::min(asked, 256);
  return static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 256u));
}

// Calls f(worker, k) for every k in [begin, end): on the calling thread alone for one worker or
// a short range, else on every worker's thread taking indices in turn. The first exception is
// rethrown once all threads are joined.
template <class F>
void parallel_range(std::vector<Worker>& workers, std::size_t begin, std::size_t end, F&& f) {
  if (workers.size() == 1 || end - begin < 2) {
    for (std::size_t k = begin; k < end; ++k) f(workers[0], k);
    return;
  }
  std::atomic<std::size_t> next{begin};
  std::exception_ptr error;
  std::mutex error_mutex;
  const auto run = [&](Worker& wk) {
    try {
      for (std::size_t k = next++; k < end; k = next++) f(wk, k);
    } catch (...) {
      const std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next = end;
    }
  };
  std::vector<std::thread> threads;
  const std::size_t n = std::min(workers.size(), end - begin);
  threads.reserve(n - 1);
  for (std::size_t i = 1; i < n; ++i) threads.emplace_back(run, std::ref(workers[i]));
  run(workers[0]);
  for (auto& th : threads) th.join();
  if (error) std::rethrow_exception(error);
}

ZoneIds default_ids(std::size_t n) {
  ZoneIds ids;
  ids.integers.resize(n);
  std::iota(ids.integers.begin(), ids.integers.end(), std::int64_t{0});
  return ids;
}

}  // namespace

ZonalTable zonal_stats(TileSource& values, const ZoneSet& zones, const ZonalOptions& o,
                       TileSource* weights) {
  const std::size_t nz = zones.geometries.size();
  if (zones.ids.size() != 0 && zones.ids.size() != nz) {
    throw ZonalInputError("zonal_stats: " + std::to_string(zones.ids.size()) + " zone ids for " +
                          std::to_string(nz) + " geometries");
  }
  if (nz > std::numeric_limits<std::uint32_t>::max()) {
    throw ZonalInputError("zonal_stats: too many zones");
  }
  const Run r = start(values, weights, o, 0);
  std::vector<detail::PixelZone> pz(nz);
  std::vector<RasterWindow> windows(nz);
  for (std::size_t z = 0; z < nz; ++z) {
    pz[z] = detail::to_pixel_zone(zones.geometries[z], r.meta.affine);
    windows[z] = detail::zone_window(pz[z], r.meta.height, r.meta.width);
  }
  const TileBuckets buckets = bucket_zones(r, windows);
  const std::size_t nb = r.bands.size();
  std::vector<ZoneAccumulator> acc(nz * nb);
  std::vector<std::vector<double>> vals(nb);
  std::vector<double> wvals;
  const int threads = thread_count(o.threads);
  std::vector<Worker> workers(static_cast<std::size_t>(threads));
  for (Worker& wk : workers) wk.partial.resize(nb);

  std::vector<TileSource*> sources{&values};
  if (weights != nullptr) sources.push_back(weights);
  const auto op = [&](const std::vector<OwnedRasterArray>& tiles, const TileInfo& where) {
    const RasterWindow& tw = where.window;
    const auto t =
        static_cast<std::size_t>((tw.row_off / r.tile_h) * r.tiles_across + tw.col_off / r.tile_w);
    if (buckets.start[t] == buckets.start[t + 1]) return tiles[0];
    for (std::size_t b = 0; b < nb; ++b) {
      const int pos = r.bands[b] - 1;
      band_as_doubles(tiles[0], pos, r.nodata[static_cast<std::size_t>(pos)], vals[b]);
    }
    if (weights != nullptr) band_as_doubles(tiles[1], 0, tiles[1].exact_nodata(), wvals);
    // Zones are independent: each is reduced, and merged into its accumulator, by one worker.
    const auto reduce = [&](Worker& wk, std::size_t k) {
      const std::uint32_t z = buckets.zones[k];
      const RasterWindow w = intersect(windows[z], tw);
      if (w.width <= 0) return;
      detail::zone_coverage(pz[z], w, o.pixels, wk.scratch, wk.cov);
      for (auto& p : wk.partial) p = ZoneAccumulator{};
      for (std::int64_t row = 0; row < w.height; ++row) {
        const std::int64_t base =
            (w.row_off - tw.row_off + row) * tw.width + (w.col_off - tw.col_off);
        for (std::int64_t col = 0; col < w.width; ++col) {
          const float c = wk.cov[static_cast<std::size_t>(row * w.width + col)];
          if (!(c > 0)) continue;
          const auto i = static_cast<std::size_t>(base + col);
          const double wt = weights != nullptr ? wvals[i] : 1.0;
          for (std::size_t b = 0; b < nb; ++b) {
            const double v = vals[b][i];
            if (!std::isnan(v)) wk.partial[b].add(v, c, wt, r.needs);
          }
        }
      }
      for (std::size_t b = 0; b < nb; ++b) acc[z * nb + b].merge(wk.partial[b]);
    };
    parallel_range(workers, buckets.start[t], buckets.start[t + 1], reduce);
    return tiles[0];
  };
  walk(r, sources, o, op);
  std::vector<int> rows(nz);
  std::iota(rows.begin(), rows.end(), 0);
  const ZoneIds ids = zones.ids.size() == 0 ? default_ids(nz) : zones.ids;
  return detail::make_table(ids, rows, r.bands, acc, o, r.meta.dtype);
}

ZonalTable zonal_stats(TileSource& values, TileSource& zone_raster, const ZonalOptions& o,
                       TileSource* weights) {
  const RasterMetadata zm = zone_raster.metadata();
  if (zm.band_count != 1) throw ZonalInputError("zonal_stats: the zone raster must have one band");
  if (is_float(zm.dtype)) {
    throw ZonalInputError("zonal_stats: the zone raster must have an integer dtype, not " +
                          std::string(to_string(zm.dtype)));
  }
  const Run r = start(values, weights, o, itemsize(zm.dtype) + 8);
  detail::check_same_grid(r.meta, zm, "the zone raster");
  const std::size_t nb = r.bands.size();
  std::unordered_map<std::int64_t, std::size_t> index;
  std::vector<std::int64_t> zone_values;
  std::vector<ZoneAccumulator> acc;
  std::vector<std::vector<double>> vals(nb);
  std::vector<double> wvals, zvals;
  std::vector<TileSource*> sources{&values, &zone_raster};
  if (weights != nullptr) sources.push_back(weights);
  const std::optional<NodataValue> znd = zone_raster.band_nodata().at(0);
  const auto op = [&](const std::vector<OwnedRasterArray>& tiles, const TileInfo&) {
    for (std::size_t b = 0; b < nb; ++b) {
      const int pos = r.bands[b] - 1;
      band_as_doubles(tiles[0], pos, r.nodata[static_cast<std::size_t>(pos)], vals[b]);
    }
    band_as_doubles(tiles[1], 0, znd, zvals);
    if (weights != nullptr) band_as_doubles(tiles[2], 0, tiles[2].exact_nodata(), wvals);
    for (std::size_t i = 0; i < zvals.size(); ++i) {
      if (std::isnan(zvals[i])) continue;
      const auto zone = static_cast<std::int64_t>(zvals[i]);
      auto [it, fresh] = index.try_emplace(zone, zone_values.size());
      if (fresh) {
        zone_values.push_back(zone);
        acc.resize(acc.size() + nb);
      }
      const double wt = weights != nullptr ? wvals[i] : 1.0;
      for (std::size_t b = 0; b < nb; ++b) {
        const double v = vals[b][i];
        if (std::isnan(v)) continue;
        ZoneAccumulator& a = acc[it->second * nb + b];
        a.add(v, 1.0, wt, r.needs);
        if (r.needs.histogram) a.maybe_compact();
      }
    }
    return tiles[0];
  };
  walk(r, sources, o, op);
  std::vector<int> rows(zone_values.size());
  std::iota(rows.begin(), rows.end(), 0);
  std::sort(rows.begin(), rows.end(), [&](int x, int y) {
    return zone_values[static_cast<std::size_t>(x)] < zone_values[static_cast<std::size_t>(y)];
  });
  ZoneIds ids;
  ids.integers = zone_values;
  return detail::make_table(ids, rows, r.bands, acc, o, r.meta.dtype);
}

ZonalTable zonal_stats(const OwnedRasterArray& values, const ZoneSet& zones,
                       const ZonalOptions& options, const OwnedRasterArray* weights) {
  RasterTileSource source(values);
  std::optional<RasterTileSource> w;
  if (weights != nullptr) w.emplace(*weights);
  return zonal_stats(source, zones, options, w ? &*w : nullptr);
}

ZonalTable zonal_stats(const OwnedRasterArray& values, const OwnedRasterArray& zone_raster,
                       const ZonalOptions& options, const OwnedRasterArray* weights) {
  RasterTileSource source(values);
  RasterTileSource zones(zone_raster);
  std::optional<RasterTileSource> w;
  if (weights != nullptr) w.emplace(*weights);
  return zonal_stats(source, zones, options, w ? &*w : nullptr);
}

RasterPlan zonal_stats_plan(const RasterMetadata& values, const ZonalOptions& options,
                            std::optional<DType> weights, std::optional<DType> zone_raster) {
  const std::vector<int> bands = detail::selected_bands(options, values.band_count);
  std::uint64_t bpp = detail::bytes_per_pixel(values, bands.size(), weights);
  if (zone_raster) bpp += itemsize(*zone_raster) + 8;
  return detail::zonal_plan(values, bpp, options);
}

}  // namespace vibespatial::raster
