// SPDX-License-Identifier: Apache-2.0
// The tile executor (tiles.hpp): passes, the walk, placement, the first-result rule.
#include "common/checked_math.hpp"
#include "common/expects.hpp"
#include "dispatch/tile_device.hpp"

#include <vibespatial/raster/dispatch.hpp>
#include <vibespatial/raster/tiles.hpp>

#include <algorithm>
#include <climits>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace vibespatial::raster {

TileSource::~TileSource() = default;
TileSink::~TileSink() = default;

void TileSink::begin_pass(int /*output_band*/, int /*band_count*/,
                          const std::optional<NodataValue>& /*nodata*/) {}

void TileSink::finish() {}

namespace {

/// The nodata in the rule's messages, as a value of @p dtype: a float raster's integral nodata
/// is written as a float ("5.0", where NodataValue::to_string says "5").
std::string nodata_text(const std::optional<NodataValue>& v, DType dtype) {
  if (!v) return "none";
  std::string text = v->to_string();
  if (is_floating_point(dtype) && text.find_first_not_of("-0123456789") == std::string::npos) {
    text += ".0";
  }
  return text;
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
                                nodata_text(result.exact_nodata(), result.dtype()) +
                                ", which differs from the first tile's " +
                                nodata_text(nodata_, result.dtype()) +
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
  // The run holds a result while the next tile is on the device: results go to the host.
  if (!gpu.output) gpu.output = Residency::host;
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
  std::int64_t tile_height = 0, tile_width = 0, tiles = 0;  ///< per pass
  int halo = 0;
  std::int64_t total = 0;
  /// Tile @p k of a pass, computed when it is reached: no list of tiles is held.
  TileWindow tile(std::int64_t k) const {
    return tile_window_at(meta.height, meta.width, tile_height, tile_width, halo, k);
  }
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
  w.tile_height = th;
  w.tile_width = tw;
  w.halo = plan.halo;
  const auto count = [](std::uint64_t a, std::uint64_t b) {
    const std::uint64_t n = detail::checked_mul(a, b, "tile count");
    if (n > static_cast<std::uint64_t>(INT64_MAX))
      throw std::overflow_error("tile count too large");
    return static_cast<std::int64_t>(n);
  };
  w.tiles = count(static_cast<std::uint64_t>((w.meta.height - 1) / th + 1),
                  static_cast<std::uint64_t>((w.meta.width - 1) / tw + 1));
  w.total = count(static_cast<std::uint64_t>(w.tiles), w.passes.size());
  return w;
}

/// A bounded FIFO between two stages. close() ends it: push then refuses, and pop returns
/// nothing once it is empty (or at once, with @p drop).
template <class T>
class StageQueue {
 public:
  explicit StageQueue(std::size_t capacity) : capacity_(capacity) {}
  /// Waits for room; false when the queue was closed.
  bool push(T item) {
    std::unique_lock lock(mutex_);
    room_.wait(lock, [&] { return closed_ || items_.size() < capacity_; });
    if (closed_) return false;
    items_.push_back(std::move(item));
    ready_.notify_one();
    return true;
  }
  /// Waits for an item; empty once the queue is closed and drained (or closed with drop).
  std::optional<T> pop() {
    std::unique_lock lock(mutex_);
    ready_.wait(lock, [&] { return !items_.empty() || closed_; });
    if (items_.empty() || dropped_) return std::nullopt;
    std::optional<T> item(std::move(items_.front()));
    items_.pop_front();
    room_.notify_one();
    return item;
  }
  /// No more items; with @p drop, the ones queued are discarded too (a failed run).
  void close(bool drop = false) {
    std::lock_guard lock(mutex_);
    closed_ = true;
    if (drop) {
      dropped_ = true;
      items_.clear();
    }
    ready_.notify_all();
    room_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_, room_;
  std::deque<T> items_;
  std::size_t capacity_;
  bool closed_ = false, dropped_ = false;
};

/// One tile on its way through the stages.
struct Stop {
  TileInfo where;
  bool first_of_pass = false;
  std::vector<OwnedRasterArray> inputs;  ///< read, until computed
  std::optional<OwnedRasterArray> result;
  std::optional<TileOutput> begin;  ///< set on the run's first result: the sink begins with it
  std::unique_ptr<detail::DeviceTile> device;  ///< on the device end: from upload to write
};

/// The device end of a run with device placement, made on first use (on the thread that runs
/// the ops), for the tiles `takes` says go through it.
class DeviceEnd {
 public:
  DeviceEnd(const RasterPlan& plan, const TileRunOptions& options,
            std::function<bool(const TileInfo&)> takes)
      : depth_(options.placement == Residency::device
                   ? detail::DeviceTiles::depth_for(plan, options)
                   : 0),
        takes_(std::move(takes)) {}
  /// Null for a tile that does not go through the device end.
  detail::DeviceTiles* for_tile(const TileInfo& where) {
    if (depth_ == 0 || !takes_(where)) return nullptr;
    std::lock_guard lock(mutex_);
    if (!tiles_) tiles_.emplace(depth_);
    return &*tiles_;
  }
  detail::DeviceTiles* get() {
    std::lock_guard lock(mutex_);
    return tiles_ ? &*tiles_ : nullptr;
  }
  void abort() noexcept {
    if (detail::DeviceTiles* t = get()) t->abort();
  }

 private:
  int depth_;
  std::function<bool(const TileInfo&)> takes_;
  std::mutex mutex_;
  std::optional<detail::DeviceTiles> tiles_;
};

/// The executor's loop over the tiles of @p w: @p read(where) reads a tile's inputs, @p compute
/// (where, inputs) computes its result, the first-result rule checks it and the sink writes it.
/// With options.overlap > 0 reading and writing run on threads of their own, queues of
/// options.overlap tiles between the stages, while the calling thread computes.
template <class Read, class Compute>
void walk_tiles(const Walk& w, TileSink& sink, const TileRunOptions& options, DeviceEnd& device,
                Read&& read, Compute&& compute) {
  const std::string& who = options.name;
  VSR_EXPECTS(options.overlap >= 0 && options.overlap <= 64,
              who + ": overlap " + std::to_string(options.overlap) + " is not in [0, 64]");
  // Stop k of the run: pass k / tiles, tile k % tiles.
  const auto stop_at = [&w](std::int64_t k) {
    const TilePass& pass = w.passes[static_cast<std::size_t>(k / w.tiles)];
    const TileWindow tile = w.tile(k % w.tiles);
    Stop s;
    s.where.index = k;
    s.where.total = w.total;
    s.where.window = tile.window;
    s.where.read = tile.read;
    s.where.first_band = w.per_band ? pass.first_band : 0;
    s.where.band_count = pass.band_count;
    s.where.output_band = w.per_band ? pass.first_band : 0;
    s.first_of_pass = k % w.tiles == 0;
    return s;
  };

  // Callbacks come from every stage's thread: one at a time.
  std::mutex callback_mutex;
  const auto stage = [&](const TileInfo& where, TileStage st) {
    if (!options.stage) return;
    std::lock_guard lock(callback_mutex);
    options.stage(where, st);
  };
  const auto stage_done = [&](const TileInfo& where, TileStage st) {
    if (!options.stage_done) return;
    std::lock_guard lock(callback_mutex);
    options.stage_done(where, st);
  };
  TileResultRule rule(who);
  bool begun = false;
  const auto compute_stop = [&](Stop& s) {
    stage(s.where, TileStage::compute);
    {
      // The inputs are released before the result is written.
      std::vector<OwnedRasterArray> inputs = std::move(s.inputs);
      if (detail::DeviceTiles* dev = device.for_tile(s.where)) {
        s.device = dev->upload(s.where.index, std::move(inputs));
        dev->run(*s.device, [&](const std::vector<OwnedRasterArray>& on_device) {
          return compute(s.where, on_device);
        });
        s.result.emplace(*s.device->result());
      } else {
        s.result.emplace(compute(s.where, inputs));
      }
    }
    stage_done(s.where, TileStage::compute);
    const OwnedRasterArray& result = *s.result;
    if (w.per_band && result.band_count() != s.where.band_count) {
      throw std::invalid_argument(
          who + ": op returned " + std::to_string(result.band_count()) + " band(s) for a pass of " +
          std::to_string(s.where.band_count) + " at " + tile_text(s.where) +
          " (bands are independent here: a plan with fewer bands per pass than bands, or a "
          "per-band op, returns as many bands as it gets)");
    }
    if (s.first_of_pass) {
      if (w.per_band) rule.expect_band_count(s.where.band_count);
      rule.reset_nodata();
    }
    rule.check(result, s.where.read, tile_text(s.where));
    if (!begun) {
      TileOutput out;
      out.dtype = result.dtype();
      out.band_count = w.per_band ? w.meta.band_count : result.band_count();
      out.height = w.meta.height;
      out.width = w.meta.width;
      out.affine = w.meta.affine;
      out.crs = w.meta.crs;
      s.begin = out;
      begun = true;
    }
    // A device tile's result stays with its DeviceTile alone, which frees it on this thread.
    if (s.device) s.result.reset();
  };
  const auto write_stop = [&](Stop& s) {
    if (s.device) {
      // The tile's work on the device done, its result on the host.
      s.result.emplace(device.get()->finish(*s.device));
      s.device.reset();
    }
    if (s.begin) sink.begin(*s.begin);
    if (s.first_of_pass) {
      sink.begin_pass(s.where.output_band, s.result->band_count(), s.result->exact_nodata());
    }
    stage(s.where, TileStage::write);
    sink.write(*s.result, s.where);
    stage_done(s.where, TileStage::write);
    s.result.reset();
    if (options.progress) {
      std::lock_guard lock(callback_mutex);
      options.progress(s.where.index + 1, w.total);
    }
  };

  if (options.overlap == 0) {
    for (std::int64_t k = 0; k < w.total; ++k) {
      Stop s = stop_at(k);
      stage(s.where, TileStage::read);
      s.inputs = read(s.where);
      stage_done(s.where, TileStage::read);
      compute_stop(s);
      write_stop(s);
    }
    sink.finish();
    return;
  }

  // Three stages: tile k+1 is read while tile k computes and tile k-1 is written.
  const auto depth = static_cast<std::size_t>(options.overlap);
  StageQueue<Stop> to_compute(depth), to_write(depth);
  std::mutex error_mutex;
  std::exception_ptr error;
  const auto failed = [&] {
    {
      std::lock_guard lock(error_mutex);
      if (!error) error = std::current_exception();
    }
    to_compute.close(true);
    to_write.close(true);
    device.abort();
  };
  std::thread reader([&] {
    try {
      for (std::int64_t k = 0; k < w.total; ++k) {
        Stop next = stop_at(k);
        stage(next.where, TileStage::read);
        next.inputs = read(next.where);
        stage_done(next.where, TileStage::read);
        if (!to_compute.push(std::move(next))) return;
      }
      to_compute.close();
    } catch (...) {
      failed();
    }
  });
  std::thread writer([&] {
    try {
      while (std::optional<Stop> s = to_write.pop()) write_stop(*s);
    } catch (...) {
      failed();
    }
  });
  try {
    while (std::optional<Stop> s = to_compute.pop()) {
      compute_stop(*s);
      if (!to_write.push(std::move(*s))) break;
    }
    to_write.close();
  } catch (...) {
    failed();
  }
  reader.join();
  writer.join();
  if (error) std::rethrow_exception(error);
  sink.finish();
}

}  // namespace

void run_tiles(TileSource& source, const BandOp& op, TileSink& sink, const RasterPlan& plan,
               const TileRunOptions& options) {
  VSR_EXPECTS(op, options.name + ": empty op");
  const Walk w = walk_of({&source}, plan, options);
  // A per-band tile of several bands goes to dispatch_per_band_gpu, which stages the bands
  // itself, in batches the plan decided; every other device tile through the device end.
  const auto batched = [&w](const TileInfo& where) { return w.per_band && where.band_count > 1; };
  DeviceEnd device(plan, options, [&](const TileInfo& where) { return !batched(where); });
  walk_tiles(
      w, sink, options, device,
      [&](const TileInfo& where) {
        std::vector<OwnedRasterArray> in;
        in.push_back(source.read(where.read, where.first_band, where.band_count));
        return in;
      },
      [&](const TileInfo& where, const std::vector<OwnedRasterArray>& in) {
        if (options.placement == Residency::device && in[0].residency() != Residency::device &&
            batched(where)) {
          // The stack takes the nodata the op gives (the bands of a pass share theirs), as the
          // op on the whole tile would, not the source's, as dispatch_per_band_gpu's stack does.
          std::optional<std::optional<NodataValue>> nodata;
          const BandOp each = [&](const OwnedRasterArray& band) {
            OwnedRasterArray r = op(band);
            if (!nodata) nodata = r.exact_nodata();
            return r;
          };
          OwnedRasterArray out = dispatch_per_band_gpu(in[0], each, band_batches(options, plan));
          return nodata ? out.with_nodata(*nodata) : out;
        }
        return op(in[0]);
      });
}

void run_tiles(const std::vector<TileSource*>& sources, const MultiTileOp& op, TileSink& sink,
               const RasterPlan& plan, const TileRunOptions& options) {
  VSR_EXPECTS(op, options.name + ": empty op");
  const Walk w = walk_of(sources, plan, options);
  DeviceEnd device(plan, options, [](const TileInfo&) { return true; });
  walk_tiles(
      w, sink, options, device,
      [&](const TileInfo& where) {
        std::vector<OwnedRasterArray> tiles;
        tiles.reserve(sources.size());
        for (std::size_t i = 0; i < sources.size(); ++i) {
          const int count = w.per_band ? where.band_count : w.band_counts[i];
          tiles.push_back(sources[i]->read(where.read, where.first_band, count));
        }
        return tiles;
      },
      [&](const TileInfo& where, const std::vector<OwnedRasterArray>& in) {
        return op(in, where);
      });
}

}  // namespace vibespatial::raster
