// SPDX-License-Identifier: Apache-2.0
// vsr-run: applies a band operation (statistics, rescale, 3x3 focal mean, normalized difference)
// to a GeoTIFF, or to a generated sample raster, within a VRAM budget, and prints a summary.
//
// Where it runs: on a real GPU (and a CUDA build) the ops run on the device, bands moved there
// by dispatch_per_band_gpu or tile by tile; with the host driver emulator or no driver at all the
// host ops run (the CUDA ops cannot run on the emulator), labelled as such in the summary.
//
// Output: written to a temporary file beside --output and renamed into place only when complete,
// so an error, a full disk or a signal (SIGINT, SIGTERM, ...) leaves the old file as it was (or no
// file) and no temporary file; --output may name the input itself.
//
// Exit status: 0 on success, 2 for bad arguments (message on stderr), 1 for any other error; a
// run ended by a signal dies of that signal.
#include "../common/cli.hpp"

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/dispatch.hpp>
#include <vibespatial/raster/driver.hpp>
#include <vibespatial/raster/io.hpp>
#include <vibespatial/raster/memory.hpp>
#include <vibespatial/raster/ops.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace vsr = vibespatial::raster;

namespace {

constexpr std::string_view usage_text =
    R"(usage: vsr-run [options]

Applies a band operation to a GeoTIFF (or to a generated sample raster when no --input is given)
within a VRAM budget, and prints a summary: tier, driver, plan, pool statistics, time, throughput
and where the output went.

options:
  --op NAME          stats | rescale | focal-mean | ndvi (default stats)
                       stats       per-band count, min, max, mean, std of the valid pixels
                       rescale     valid range of the raster (min..max) -> 0..1 as float32
                       focal-mean  3x3 mean of the valid pixels (float32/float64), halo 1
                       ndvi        (nir - red) / (nir + red), see --nir / --red
  --input FILE       raster file read through GDAL (default: a generated sample raster)
  --output FILE      write the result there (GeoTIFF; needs GDAL); not for --op stats. Written
                     to a temporary file beside it and renamed into place when complete: an
                     error or a signal leaves FILE as it was. FILE may be the input itself.
  --host-memory BYTES
                     refuse up front a file run whose pass (tile, result, GDAL's blocks and
                     block cache) needs more host memory than this (default: what is available)
  --allow-virtual    also open VRT files, GDAL virtual file systems (/vsi...) and URLs as input;
                     refused by default, since a VRT reads whatever files its XML names (only
                     raster file formats open an input otherwise: GTiff/COG, PNG, JPEG, ...)
  --budget BYTES     VRAM budget for planning, > 0, or auto (default auto: what the device has
                     free; 0 with no GPU, which plans the whole raster at once)
  --sample-size N    sample raster side in pixels (default 2048)
  --bands N          sample raster band count (default 4)
  --nir N, --red N   1-based bands for ndvi (default 4 and 3 with 4+ bands, else 2 and 1)
  --progress         progress on stderr even when stderr is not a terminal
  -h, --help         print this help

BYTES takes a suffix: K, M, G, T (powers of 1000; KB, MB, GB, TB too) or KiB, MiB, GiB, TiB
(powers of 1024), e.g. 80M = 80000000, 2GiB = 2147483648.

The sample raster is deterministic: float32, nodata NaN, about 1% of the pixels NaN.
)";

using vsr_cli::parse_integer;
using vsr_cli::parse_size;
using vsr_cli::printable;
using vsr_cli::UsageError;

enum class Op { stats, rescale, focal_mean, ndvi };

struct Arguments {
  Op op = Op::stats;
  std::string op_name = "stats";
  std::string input, output;
  std::optional<std::uint64_t> budget;  ///< empty: auto
  std::int64_t sample_size = 2048;
  int bands = 4;
  std::optional<int> nir, red;
  bool progress = false;
  bool allow_virtual = false;
  std::optional<std::uint64_t> host_memory;  ///< empty: what is available
  bool help = false;
};

Arguments parse_arguments(int argc, char** argv) {
  Arguments args;
  vsr_cli::ArgScanner words(argc, argv);
  while (words.next()) {
    const std::string_view option = words.option();
    if (words.is("-h", "--help")) {
      words.flag();
      args.help = true;
    } else if (words.is("--op")) {
      const std::string_view name = words.value();
      if (name == "stats") {
        args.op = Op::stats;
      } else if (name == "rescale") {
        args.op = Op::rescale;
      } else if (name == "focal-mean") {
        args.op = Op::focal_mean;
      } else if (name == "ndvi") {
        args.op = Op::ndvi;
      } else {
        throw UsageError("--op: unknown op '" + std::string(name) +
                         "' (stats, rescale, focal-mean or ndvi)");
      }
      args.op_name = name;
    } else if (words.is("--input")) {
      args.input = words.value();
    } else if (words.is("--output")) {
      args.output = words.value();
    } else if (words.is("--budget")) {
      const std::string_view text = words.value();
      if (text == "auto") {
        args.budget.reset();
      } else {
        args.budget = vsr_cli::parse_budget(option, text);
      }
    } else if (words.is("--sample-size")) {
      args.sample_size = parse_integer<std::int64_t>(option, words.value());
      if (args.sample_size < 1 || args.sample_size > 65536) {
        throw UsageError("--sample-size must be in [1, 65536]");
      }
    } else if (words.is("--bands")) {
      args.bands = parse_integer<int>(option, words.value());
      if (args.bands < 1 || args.bands > 256) throw UsageError("--bands must be in [1, 256]");
    } else if (words.is("--nir")) {
      args.nir = parse_integer<int>(option, words.value());
    } else if (words.is("--red")) {
      args.red = parse_integer<int>(option, words.value());
    } else if (words.is("--progress")) {
      words.flag();
      args.progress = true;
    } else if (words.is("--host-memory")) {
      args.host_memory = parse_size(option, words.value());
      if (*args.host_memory == 0) throw UsageError("--host-memory must be > 0");
    } else if (words.is("--allow-virtual")) {
      words.flag();
      args.allow_virtual = true;
    } else {
      words.unknown();
    }
  }
  if (args.op == Op::stats && !args.output.empty()) {
    throw UsageError("--output: --op stats prints a table and writes no raster");
  }
  return args;
}

/// The deterministic sample: smooth ramps per band plus a hash-based texture, ~1% NaN.
vsr::OwnedRasterArray make_sample(int bands, std::int64_t side) {
  std::vector<float> px(static_cast<std::size_t>(bands) * static_cast<std::size_t>(side * side));
  std::size_t i = 0;
  for (int b = 0; b < bands; ++b) {
    for (std::int64_t y = 0; y < side; ++y) {
      for (std::int64_t x = 0; x < side; ++x, ++i) {
        std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761U;
        h ^= h >> 15;
        px[i] = (h % 100 == 0) ? std::numeric_limits<float>::quiet_NaN()
                               : static_cast<float>(100 * (b + 1)) +
                                     static_cast<float>((x + 2 * y) % 1000) * 0.5F +
                                     static_cast<float>(h % 64) * 0.25F;
      }
    }
  }
  // 10 m pixels in UTM 33N, so a written sample opens in any GIS.
  return vsr::OwnedRasterArray::from_host(
      px.data(), vsr::DType::float32, bands, side, side, std::numeric_limits<double>::quiet_NaN(),
      vsr::Affine{10, 0, 500000, 0, -10, 5000000}, "EPSG:32633");
}

/// Progress on stderr: one updating line on a terminal, plain lines otherwise (--progress).
class Progress {
 public:
  Progress(bool enabled, std::string what)
      : enabled_(enabled), tty_(::isatty(2) != 0), what_(std::move(what)) {}
  void update(std::int64_t done, std::int64_t total, const char* unit) {
    if (!enabled_ || total <= 0) return;
    const std::lock_guard<std::mutex> lock(mutex_);
    const int pct = static_cast<int>(100 * done / total);
    if (tty_) {
      std::fprintf(stderr, "\r[vsr-run] %s: %s %lld/%lld (%d%%)%s", what_.c_str(), unit,
                   static_cast<long long>(done), static_cast<long long>(total), pct,
                   done == total ? "\n" : "");
    } else {
      std::fprintf(stderr, "[vsr-run] %s: %s %lld/%lld (%d%%)\n", what_.c_str(), unit,
                   static_cast<long long>(done), static_cast<long long>(total), pct);
    }
    std::fflush(stderr);
  }

 private:
  bool enabled_, tty_;
  std::string what_;
  std::mutex mutex_;
};

/// Where the ops run.
enum class Mode { gpu, emulator, none };

std::string mib(std::uint64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

/// Statistics of a band merged from disjoint parts (Chan et al.'s parallel variance update).
struct Moments {
  std::int64_t count = 0;
  double min = std::numeric_limits<double>::infinity();
  double max = -std::numeric_limits<double>::infinity();
  double mean = 0, m2 = 0;

  void merge(const vsr::BandStatistics& s) {
    if (s.count == 0) return;
    const double n = static_cast<double>(count), m = static_cast<double>(s.count);
    const double delta = s.mean - mean;
    mean += delta * m / (n + m);
    m2 += s.std * s.std * m + delta * delta * n * m / (n + m);
    count += s.count;
    min = std::min(min, s.min);
    max = std::max(max, s.max);
  }
};

/// Runs @p fn on a host @p piece where the ops run: on the device in gpu mode (a device copy,
/// freed on return), else on the host.
template <class Fn>
auto on_compute(Mode mode, const vsr::OwnedRasterArray& piece, Fn&& fn) {
  if (mode != Mode::gpu || piece.residency() == vsr::Residency::device) return fn(piece);
  vsr::OwnedRasterArray dev = vsr::OwnedRasterArray::from_host(
      piece.host_data(), piece.dtype(), piece.band_count(), piece.height(), piece.width(),
      piece.nodata(), piece.affine(), piece.crs());
  dev.move_to(vsr::Residency::device);
  return fn(dev);
}

/// A raster op run where the ops run, its result brought to the host (tiles are written there).
/// With @p per_band, each band of the input goes to the device on its own (one band per pass, as
/// a per-band plan says) and the results are stacked.
vsr::BandOp compute_op(Mode mode,
                       std::function<vsr::OwnedRasterArray(const vsr::OwnedRasterArray&)> f,
                       bool result_to_host, bool per_band) {
  return [mode, f = std::move(f), result_to_host, per_band](const vsr::OwnedRasterArray& t) {
    auto one = [&](const vsr::OwnedRasterArray& piece) {
      vsr::OwnedRasterArray r = on_compute(mode, piece, f);
      if (result_to_host) r.move_to(vsr::Residency::host);
      return r;
    };
    if (!per_band || t.band_count() == 1 || mode != Mode::gpu) return one(t);
    std::vector<vsr::OwnedRasterArray> results;
    for (int b = 0; b < t.band_count(); ++b) results.push_back(one(t.band(b)));
    return vsr::OwnedRasterArray::from_band_stack(results, t);
  };
}

int run(const Arguments& args) {
  const auto start = std::chrono::steady_clock::now();
  // An interrupted or killed run leaves no partial output: the output is written to a temporary
  // file beside it, which these handlers remove before the signal ends the process.
  vsr::remove_partial_outputs_on_signals();
  const bool show_progress = args.progress || ::isatty(2) != 0;
  const vsr::DriverInfo info = vsr::driver_info();
  Mode mode = Mode::none;
  std::string driver_label = "none (" + printable(info.reason) + "): host ops on the CPU";
  if (info.available && info.emulated) {
    mode = Mode::emulator;
    driver_label = "emulator (" + printable(info.library) + "): host ops on the CPU";
  } else if (info.available && vsr::ops_built_with_cuda()) {
    mode = Mode::gpu;
    driver_label = "GPU " +
                   printable(info.devices.empty() ? std::string("?") : info.devices[0].name) +
                   ": device ops (CUDA)";
  } else if (info.available) {
    driver_label = "GPU present, but this build has no CUDA ops: host ops on the CPU";
  }
  if (info.available) vsr::configure_memory_pool();

  if ((!args.input.empty() || !args.output.empty()) && !vsr::io_available()) {
    throw std::runtime_error(std::string(!args.input.empty() ? "--input" : "--output") +
                             ": this vsr-run was built without GDAL (install libgdal-dev and "
                             "rebuild); run without --input/--output to use the sample raster");
  }

  // The raster: a file's header first, so the plan is made before any pixel is read.
  vsr::OpenOptions open;
  open.allow_virtual = args.allow_virtual;
  std::optional<vsr::OwnedRasterArray> raster;
  vsr::RasterMetadata meta;
  std::string input_label;
  if (args.input.empty()) {
    raster = make_sample(args.bands, args.sample_size);
    meta = raster->metadata();
    input_label = "sample";
  } else {
    meta = vsr::read_raster_metadata(args.input, open);
    input_label = printable(args.input) + " (" + meta.driver + ")";
  }
  char shape[160];
  std::snprintf(shape, sizeof shape, "%d x %lld x %lld %s", meta.band_count,
                static_cast<long long>(meta.height), static_cast<long long>(meta.width),
                std::string(vsr::to_string(meta.dtype)).c_str());
  input_label += std::string(", ") + shape;

  int nir = 0, red = 0;
  if (args.op == Op::ndvi) {
    if (meta.band_count < 2) throw UsageError("--op ndvi needs a raster with 2 or more bands");
    nir = args.nir.value_or(meta.band_count >= 4 ? 4 : 2);
    red = args.red.value_or(meta.band_count >= 4 ? 3 : 1);
    if (nir < 1 || nir > meta.band_count || red < 1 || red > meta.band_count) {
      throw UsageError("--nir/--red must be band numbers in [1, " +
                       std::to_string(meta.band_count) + "]");
    }
  }

  vsr::PlanOptions popts;
  popts.vram_budget = args.budget ? *args.budget : vsr::available_vram_bytes();
  popts.per_band = args.op == Op::stats || args.op == Op::rescale || args.op == Op::focal_mean;
  popts.halo = args.op == Op::focal_mean ? 1 : 0;
  vsr::RasterMetadata plan_meta = meta;
  if (args.op == Op::ndvi) plan_meta.band_count = 2;
  // ndvi: two input bands and one output band per pixel.
  popts.buffers_per_band = args.op == Op::stats ? 1 : 2;
  vsr::RasterPlan plan = vsr::plan_from_metadata(plan_meta, popts);
  const bool tiled = plan.strategy == vsr::TilingStrategy::tiled;

  Progress progress(show_progress, args.op_name);
  auto tile_progress = [&](std::int64_t done, std::int64_t total) {
    progress.update(done, total, "tile");
  };
  // Counts tiles of the in-memory tiled executors for the progress line.
  auto counted_tiles = [&](vsr::BandOp op) -> vsr::BandOp {
    return [&, op = std::move(op), done = std::int64_t{0}](const vsr::OwnedRasterArray& t) mutable {
      vsr::OwnedRasterArray r = op(t);
      tile_progress(++done, plan.n_tiles);
      return r;
    };
  };
  std::string output_label = "none (use --output FILE.tif to write the result)";
  std::vector<Moments> stats(static_cast<std::size_t>(meta.band_count));

  // A file goes through tile by tile (passes of the plan's bands), never whole unless the plan
  // is whole: only one tile and GDAL's capped block cache are in memory.
  vsr::StreamOptions stream;
  stream.open = open;
  stream.host_memory_limit = args.host_memory.value_or(0);
  if (args.op == Op::ndvi) stream.bands = {nir, red};
  if (!args.input.empty())
    stream.gdal_cache_bytes = vsr::gdal_cache_for_plan(args.input, plan, stream);
  // Statistics of tiles merged per band (exact min/max/count; Chan's update for mean and std).
  const auto merge_stats = [&](const vsr::OwnedRasterArray& tile, const vsr::TileInfo& where) {
    const std::vector<vsr::BandStatistics> s =
        on_compute(mode, tile, [](const auto& r) { return vsr::band_statistics(r); });
    for (int b = 0; b < where.band_count; ++b) {
      stats[static_cast<std::size_t>(where.first_band + b)].merge(s[static_cast<std::size_t>(b)]);
    }
  };

  if (args.op == Op::stats) {
    if (!args.input.empty()) {
      stream.progress = tile_progress;
      vsr::for_each_raster_tile(args.input, plan, merge_stats, stream);
    } else {
      const std::int64_t th = tiled ? plan.tile_shape->first : meta.height;
      const std::int64_t tw = tiled ? plan.tile_shape->second : meta.width;
      const std::int64_t per_band = ((meta.height + th - 1) / th) * ((meta.width + tw - 1) / tw);
      std::int64_t done = 0;
      for (int b = 0; b < meta.band_count; ++b) {
        const vsr::OwnedRasterArray band = raster->band(b);
        for (std::int64_t r0 = 0; r0 < meta.height; r0 += th) {
          for (std::int64_t c0 = 0; c0 < meta.width; c0 += tw) {
            const std::int64_t h = std::min(th, meta.height - r0),
                               w = std::min(tw, meta.width - c0);
            const std::size_t item = vsr::itemsize(meta.dtype);
            std::vector<std::byte> buf(static_cast<std::size_t>(h * w) * item);
            const auto* src = static_cast<const std::byte*>(band.host_data());
            for (std::int64_t y = 0; y < h; ++y) {
              std::copy_n(src + static_cast<std::size_t>((r0 + y) * meta.width + c0) * item,
                          static_cast<std::size_t>(w) * item,
                          buf.data() + static_cast<std::size_t>(y * w) * item);
            }
            const vsr::OwnedRasterArray tile =
                vsr::OwnedRasterArray::from_host(buf.data(), meta.dtype, 1, h, w, meta.nodata);
            merge_stats(tile, vsr::TileInfo{.index = done,
                                            .total = per_band * meta.band_count,
                                            .window = {},
                                            .read = {},
                                            .first_band = b,
                                            .band_count = 1});
            progress.update(++done, per_band * meta.band_count, tiled ? "tile" : "band");
          }
        }
      }
    }
  } else {
    std::function<vsr::OwnedRasterArray(const vsr::OwnedRasterArray&)> f;
    if (args.op == Op::focal_mean) {
      f = [](const vsr::OwnedRasterArray& r) { return vsr::focal_mean_3x3(r); };
    } else if (args.op == Op::ndvi) {
      // A file's tiles carry the two bands alone (stream.bands); the sample carries them all.
      const int a = args.input.empty() ? nir - 1 : 0, b = args.input.empty() ? red - 1 : 1;
      f = [a, b](const vsr::OwnedRasterArray& r) {
        return vsr::normalized_difference(r.band(a), r.band(b));
      };
    } else {
      // The valid range of the whole raster, so every tile maps the same way: a first streamed
      // pass over a file.
      if (!args.input.empty()) {
        Progress range_progress(show_progress, "rescale (range pass)");
        stream.progress = [&](std::int64_t done, std::int64_t total) {
          range_progress.update(done, total, "tile");
        };
        vsr::for_each_raster_tile(args.input, plan, merge_stats, stream);
      } else {
        const std::vector<vsr::BandStatistics> s = vsr::band_statistics(*raster);
        for (std::size_t b = 0; b < s.size(); ++b) stats[b].merge(s[b]);
      }
      double lo = std::numeric_limits<double>::infinity(), hi = -lo;
      for (const Moments& m : stats) {
        if (m.count > 0) lo = std::min(lo, m.min), hi = std::max(hi, m.max);
      }
      if (!(lo < hi)) lo = 0, hi = 1;
      f = [lo, hi](const vsr::OwnedRasterArray& r) {
        return vsr::rescale(r, lo, hi, 0, 1, vsr::DType::float32);
      };
    }
    stream.progress = tile_progress;
    if (!args.input.empty() && !args.output.empty()) {
      // The main job: the file goes through tile by tile, one tile live, the output written
      // as the tiles come (a whole plan is one tile).
      vsr::process_raster_file(args.input, args.output, compute_op(mode, f, true, popts.per_band),
                               plan, stream);
    } else if (!args.input.empty()) {
      // No output: the op runs tile by tile and its results are dropped (a timing run).
      const vsr::BandOp op = compute_op(mode, f, true, popts.per_band);
      vsr::for_each_raster_tile(
          args.input, plan,
          [&](const vsr::OwnedRasterArray& tile, const vsr::TileInfo&) { (void)op(tile); }, stream);
    } else {
      std::optional<vsr::OwnedRasterArray> result;
      if (args.op == Op::ndvi) {
        if (tiled) {
          result =
              vsr::dispatch_tiled(*raster, counted_tiles(compute_op(mode, f, true, false)), plan);
        } else {
          result = compute_op(mode, f, true, false)(*raster);
          progress.update(1, 1, "pass");
        }
      } else if (tiled) {
        result =
            vsr::dispatch_tiled_halo(*raster, counted_tiles(compute_op(mode, f, true, true)), plan);
      } else {
        std::atomic<std::int64_t> done{0};
        const std::int64_t total = meta.band_count;
        vsr::BandOp counted = [&, op = compute_op(mode, f, mode != Mode::gpu, false)](
                                  const vsr::OwnedRasterArray& band) {
          vsr::OwnedRasterArray r = op(band);
          progress.update(++done, total, "band");
          return r;
        };
        if (mode == Mode::gpu) {
          result = vsr::dispatch_per_band_gpu(*raster, counted);
          result->move_to(vsr::Residency::host);
        } else {
          result = vsr::dispatch_per_band_cpu(*raster, counted);
        }
      }
      if (!args.output.empty()) {
        vsr::write_raster(args.output, *result);
      }
    }
    if (!args.output.empty()) {
      const vsr::RasterMetadata out = vsr::read_raster_metadata(args.output);
      output_label = printable(args.output) + " (" + std::string(vsr::to_string(out.dtype)) + ", " +
                     std::to_string(out.band_count) + " band(s), " + out.driver + ")";
    }
  }

  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double pixels = static_cast<double>(meta.band_count) * static_cast<double>(meta.height) *
                        static_cast<double>(meta.width);

  if (args.op == Op::stats) {
    std::printf("%-5s %12s %14s %14s %14s %14s\n", "band", "count", "min", "max", "mean", "std");
    for (std::size_t b = 0; b < stats.size(); ++b) {
      const Moments& m = stats[b];
      const double nan = std::numeric_limits<double>::quiet_NaN();
      const bool any = m.count > 0;
      std::printf("%-5zu %12lld %14.6g %14.6g %14.6g %14.6g\n", b + 1,
                  static_cast<long long>(m.count), any ? m.min : nan, any ? m.max : nan,
                  any ? m.mean : nan, any ? std::sqrt(m.m2 / static_cast<double>(m.count)) : nan);
    }
  }
  const vsr::MemoryPoolStats pool = vsr::memory_pool_stats();
  std::printf("vsr-run summary\n");
  std::printf("  op          %s\n", args.op_name.c_str());
  std::printf("  input       %s\n", input_label.c_str());
  std::printf("  driver      %s\n", driver_label.c_str());
  std::printf("  tier        %s\n",
              pool.tier.empty() ? "none (no device memory pool)" : pool.tier.c_str());
  std::string plan_text = std::string(vsr::to_string(plan.strategy));
  if (tiled) {
    plan_text += ", " + std::to_string(plan.n_tiles) + " tiles of " +
                 std::to_string(plan.tile_shape->first) + " x " +
                 std::to_string(plan.tile_shape->second) + " (halo " + std::to_string(plan.halo) +
                 ")";
  }
  plan_text += ", " + std::to_string(plan.bands_per_pass) + " band(s) per pass, budget " +
               (*popts.vram_budget == 0 ? std::string("0 (no GPU)") : mib(*popts.vram_budget)) +
               (args.budget ? "" : " (auto)") + ", " + mib(plan.estimated_vram_per_tile) +
               " per pass" + (plan.fits_budget ? "" : " (does NOT fit the budget)");
  std::printf("  plan        %s\n", plan_text.c_str());
  if (pool.configured) {
    const std::uint64_t peak = pool.peak_bytes.value_or(pool.used_bytes.value_or(0));
    std::printf("  pool        peak %s, pool size %s\n", mib(peak).c_str(),
                pool.pool_size ? mib(*pool.pool_size).c_str() : "n/a for this tier");
  } else {
    std::printf("  pool        not configured (no driver)\n");
  }
  std::printf("  time        %.3f s\n", seconds);
  std::printf("  throughput  %.1f Mpx/s (%.0f pixels, all bands)\n",
              seconds > 0 ? pixels / seconds / 1e6 : 0.0, pixels);
  std::printf("  output      %s\n",
              args.op == Op::stats ? "the statistics table above" : output_label.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Arguments args;
  try {
    args = parse_arguments(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "vsr-run: %s\n", e.what());
    return 2;
  }
  if (args.help) {
    std::fputs(std::string(usage_text).c_str(), stdout);
    return 0;
  }
  try {
    return run(args);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "vsr-run: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "vsr-run: error: %s\n", printable(e.what()).c_str());
    return 1;
  }
}
