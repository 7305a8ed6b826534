// SPDX-License-Identifier: Apache-2.0
// vsr-run: applies a band operation (statistics, histogram, rescale, clip, nodata fill, 3x3 focal
// mean, normalized difference) to a raster file, or to a generated sample raster, within a VRAM
// budget, and prints a summary.
//
// Where it runs: on a real GPU (and a CUDA build) the ops run on the device, bands moved there
// by dispatch_per_band_gpu or tile by tile; with the host driver emulator or no driver at all the
// host ops run (the CUDA ops cannot run on the emulator), labelled as such in the summary.
//
// A file goes through tile by tile (process_raster_file / for_each_raster_tile): only one tile
// of the plan's bands and GDAL's block cache (capped from the plan) are in memory; statistics,
// histograms and rescale's range are streaming reductions. Only the sample is held whole.
//
// Output: written to a temporary file beside --output and renamed into place only when complete,
// so an error, a full disk or a signal (SIGINT, SIGTERM, ...) leaves the old file as it was (or no
// file) and no temporary file; --output may name the input itself (with --overwrite).
//
// Exit status: 0 on success, 2 for bad arguments (message on stderr), 1 for any other error; a
// run ended by a signal dies of that signal.
#include "../common/cli.hpp"
#include "../common/format.hpp"

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/dispatch.hpp>
#include <vibespatial/raster/driver.hpp>
#include <vibespatial/raster/io.hpp>
#include <vibespatial/raster/memory.hpp>
#include <vibespatial/raster/ops.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
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

Applies a band operation to a raster file (or to a generated sample raster when no --input is
given) within a VRAM budget, and prints a summary: tier, driver, plan, pool statistics, time,
throughput and where the output went. Options take their value as "--name value" or
"--name=value".

operation:
  --op NAME          the operation (default stats):
                       stats        per band: count, min, max, mean, std of the valid pixels
                       histogram    per band: counts of the valid pixels in --bins equal bins
                                    on --range (numpy.histogram's bins)
                       rescale      --in-range onto --out-range as --ot (default: the valid
                                    range of all selected bands onto 0,1 as float32)
                       clip         valid pixels clamped to --range LO,HI (same type)
                       fill-nodata  invalid pixels set to --value V (no nodata left)
                       focal-mean   3x3 mean of the valid pixels (float32/float64), halo 1
                       normalized-difference (alias ndvi)
                                    (A - B) / (A + B) of two bands, A = --nir, B = --red
  --in-range LO,HI   rescale: the input range (values outside are clamped to it first); default:
                     the valid range, from a first streamed pass
  --out-range LO,HI  rescale: the output range (default 0,1)
  --ot TYPE          rescale: output type, a numpy name (uint8 ... float64; default float32)
  --range LO,HI      clip: the bounds (required); histogram: the range (default: each band's
                     valid range, as numpy's default)
  --bins N           histogram: bin count (default 10)
  --value V          fill-nodata: the value invalid pixels get (required)
  --edge MODE        focal-mean: nearest | reflect | nodata (default nearest): what neighbours
                     outside the raster are (the edge pixel, a mirror, or nothing)
  --nir N, --red N   normalized-difference: the 1-based bands A and B (default 4 and 3 with 4+
                     bands, else 2 and 1); any two different bands

input:
  -i, --input FILE   raster file read through GDAL (default: a generated sample raster)
  -b N               an input band to process, 1-based; repeat for more, in order (as
                     gdal_translate -b); default: all. Bands keep their own nodata.
  --allow-virtual    also open VRT files, GDAL virtual file systems (/vsi...) and URLs as input;
                     refused by default, since a VRT reads whatever files its XML names (only
                     raster file formats open an input otherwise: GTiff/COG, PNG, JPEG, ...)

output:
  -o, --output FILE  write the result there. Rasters: a new file, all or nothing (a temporary
                     file beside it, renamed into place when complete: an error or a signal
                     leaves FILE as it was). stats and histogram: their JSON.
  --overwrite        replace an existing --output (refused without it); needed to write over
                     the input itself
  -of FORMAT         GDAL driver of the output (default: from the extension, .tif is GTiff)
  --co KEY=VALUE     a GDAL creation option; repeat for more. GTiff defaults: COMPRESS=DEFLATE,
                     TILED=YES, 256 x 256 blocks, INTERLEAVE=BAND, BIGTIFF=IF_SAFER
  --threads N        threads GDAL compresses with (NUM_THREADS; default: every CPU)
  --json             stats and histogram: print JSON (full precision) instead of a table
  -q, --quiet        no summary and no progress (errors, tables and JSON still print)
  --progress         progress on stderr even when stderr is not a terminal (one line per tile)

What the output keeps from the input: georeferencing (none if the input has none), CRS,
AREA_OR_POINT, band descriptions and colour interpretation; scale, offset and unit too for
clip, fill-nodata and focal-mean, which keep the values' meaning.

resources:
  --budget BYTES     VRAM budget for planning, > 0, or auto (default auto: what the device has
                     free; with no GPU, a quarter of the available host memory, at most 1 GiB)
  --host-memory BYTES
                     refuse up front a file run whose pass (tile, result, GDAL's blocks and
                     block cache) needs more host memory than this (default: what is available)

sample (no --input):
  --sample-size N    sample raster side in pixels (default 2048)
  --bands N          sample raster band count (default 4)

  -h, --help         print this help

BYTES takes a suffix: K, M, G, T (powers of 1000; KB, MB, GB, TB too) or KiB, MiB, GiB, TiB
(powers of 1024), e.g. 80M = 80000000, 2GiB = 2147483648.

Odd data: a rescale whose valid range is infinite stops and asks for --in-range; a constant
raster rescales to the low end of --out-range; rescale's output nodata is never a valid output
value (NaN for float types, else a value outside --out-range: the summary says which). The
sample raster is deterministic: float32, nodata NaN, about 1% of the pixels NaN.
)";

using vsr_cli::parse_double;
using vsr_cli::parse_integer;
using vsr_cli::parse_size;
using vsr_cli::printable;
using vsr_cli::UsageError;

enum class Op { stats, histogram, rescale, clip, fill_nodata, focal_mean, normalized_difference };

struct Range {
  double lo = 0, hi = 0;
};

struct Arguments {
  Op op = Op::stats;
  std::string op_name = "stats";
  std::string input, output;
  std::vector<int> bands;               ///< -b
  std::optional<std::uint64_t> budget;  ///< empty: auto
  std::int64_t sample_size = 2048;
  int sample_bands = 4;
  std::optional<int> nir, red;
  std::optional<Range> in_range, out_range, range;
  std::optional<vsr::DType> ot;
  int bins = 10;
  bool bins_given = false;
  std::optional<double> value;
  vsr::EdgeMode edge = vsr::EdgeMode::nearest;
  bool edge_given = false;
  std::string format;
  std::vector<std::string> creation_options;
  bool overwrite = false;
  int threads = -1;
  bool json = false;
  bool quiet = false;
  bool progress = false;
  bool allow_virtual = false;
  std::optional<std::uint64_t> host_memory;  ///< empty: what is available
  bool help = false;

  bool raster_output() const { return op != Op::stats && op != Op::histogram; }
};

Range parse_range(std::string_view option, std::string_view text) {
  const std::size_t comma = text.find(',');
  if (comma == std::string_view::npos) {
    throw UsageError(std::string(option) + ": '" + std::string(text) +
                     "' is not LO,HI (two numbers and a comma)");
  }
  Range r{parse_double(option, text.substr(0, comma)),
          parse_double(option, text.substr(comma + 1))};
  return r;
}

Arguments parse_arguments(int argc, char** argv) {
  Arguments args;
  vsr_cli::ArgScanner words(argc, argv);
  std::vector<std::string> given;  // op-specific options, checked against the op below
  while (words.next()) {
    const std::string_view option = words.option();
    if (words.is("-h", "--help")) {
      words.flag();
      args.help = true;
    } else if (words.is("--op")) {
      const std::string_view name = words.value();
      if (name == "stats") {
        args.op = Op::stats;
      } else if (name == "histogram") {
        args.op = Op::histogram;
      } else if (name == "rescale") {
        args.op = Op::rescale;
      } else if (name == "clip") {
        args.op = Op::clip;
      } else if (name == "fill-nodata") {
        args.op = Op::fill_nodata;
      } else if (name == "focal-mean") {
        args.op = Op::focal_mean;
      } else if (name == "normalized-difference" || name == "ndvi") {
        args.op = Op::normalized_difference;
      } else {
        throw UsageError("--op: unknown op '" + std::string(name) +
                         "' (stats, histogram, rescale, clip, fill-nodata, focal-mean, "
                         "normalized-difference or ndvi)");
      }
      args.op_name = name;
    } else if (words.is("-i", "--input")) {
      args.input = words.value();
    } else if (words.is("-o", "--output")) {
      args.output = words.value();
    } else if (words.is("-b")) {
      const int b = parse_integer<int>(option, words.value());
      if (b < 1) throw UsageError("-b: band numbers start at 1 (got " + std::to_string(b) + ")");
      args.bands.push_back(b);
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
      args.sample_bands = parse_integer<int>(option, words.value());
      if (args.sample_bands < 1 || args.sample_bands > 256) {
        throw UsageError("--bands must be in [1, 256]");
      }
    } else if (words.is("--nir")) {
      args.nir = parse_integer<int>(option, words.value());
      given.emplace_back(option);
    } else if (words.is("--red")) {
      args.red = parse_integer<int>(option, words.value());
      given.emplace_back(option);
    } else if (words.is("--in-range")) {
      args.in_range = parse_range(option, words.value());
      given.emplace_back(option);
    } else if (words.is("--out-range")) {
      args.out_range = parse_range(option, words.value());
      given.emplace_back(option);
    } else if (words.is("--range")) {
      args.range = parse_range(option, words.value());
      given.emplace_back(option);
    } else if (words.is("--ot")) {
      const std::string_view name = words.value();
      args.ot = vsr::dtype_from_string(name);
      if (!args.ot) {
        throw UsageError("--ot: unknown type '" + std::string(name) +
                         "' (uint8 int8 uint16 int16 uint32 int32 uint64 int64 float32 float64)");
      }
      given.emplace_back(option);
    } else if (words.is("--bins")) {
      args.bins = parse_integer<int>(option, words.value());
      if (args.bins < 1 || args.bins > 1000000) throw UsageError("--bins must be in [1, 1000000]");
      args.bins_given = true;
      given.emplace_back(option);
    } else if (words.is("--value")) {
      args.value = parse_double(option, words.value());
      given.emplace_back(option);
    } else if (words.is("--edge")) {
      const std::string_view mode = words.value();
      if (mode == "nearest") {
        args.edge = vsr::EdgeMode::nearest;
      } else if (mode == "reflect") {
        args.edge = vsr::EdgeMode::reflect;
      } else if (mode == "nodata") {
        args.edge = vsr::EdgeMode::constant_nodata;
      } else {
        throw UsageError("--edge: unknown mode '" + std::string(mode) +
                         "' (nearest, reflect or nodata)");
      }
      args.edge_given = true;
      given.emplace_back(option);
    } else if (words.is("-of")) {
      args.format = words.value();
    } else if (words.is("--co")) {
      const std::string_view kv = words.value();
      if (kv.find('=') == std::string_view::npos || kv.front() == '=') {
        throw UsageError("--co: '" + std::string(kv) + "' is not KEY=VALUE");
      }
      args.creation_options.emplace_back(kv);
    } else if (words.is("--overwrite")) {
      words.flag();
      args.overwrite = true;
    } else if (words.is("--threads")) {
      args.threads = parse_integer<int>(option, words.value());
      if (args.threads < 1) throw UsageError("--threads must be >= 1");
    } else if (words.is("--json")) {
      words.flag();
      args.json = true;
      given.emplace_back(option);
    } else if (words.is("-q", "--quiet")) {
      words.flag();
      args.quiet = true;
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
  if (args.help) return args;

  // Options that belong to other ops are mistakes, not silently ignored.
  const auto allowed = [&](std::string_view option) {
    if (option == "--nir" || option == "--red") return args.op == Op::normalized_difference;
    if (option == "--in-range" || option == "--out-range" || option == "--ot") {
      return args.op == Op::rescale;
    }
    if (option == "--range") return args.op == Op::clip || args.op == Op::histogram;
    if (option == "--bins") return args.op == Op::histogram;
    if (option == "--value") return args.op == Op::fill_nodata;
    if (option == "--edge") return args.op == Op::focal_mean;
    if (option == "--json") return !args.raster_output();
    return true;
  };
  for (const std::string& option : given) {
    if (!allowed(option)) {
      throw UsageError(option + " does not apply to --op " + args.op_name + " (see --help)");
    }
  }
  if (args.op == Op::clip && !args.range) throw UsageError("--op clip needs --range LO,HI");
  if (args.op == Op::fill_nodata && !args.value)
    throw UsageError("--op fill-nodata needs --value V");
  if (args.range && !(args.range->lo <= args.range->hi)) {
    throw UsageError("--range: LO must not exceed HI");
  }
  if (args.op == Op::histogram && args.range && !(args.range->lo < args.range->hi)) {
    throw UsageError("--range: a histogram needs LO < HI");
  }
  if (args.in_range && !(args.in_range->lo < args.in_range->hi)) {
    throw UsageError("--in-range: LO must be below HI");
  }
  if (args.out_range && !(args.out_range->lo != args.out_range->hi)) {
    throw UsageError("--out-range: LO and HI must differ");
  }
  if (args.nir && args.red && *args.nir == *args.red) {
    throw UsageError("--nir and --red are the same band (" + std::to_string(*args.nir) +
                     "): the normalized difference of a band with itself is 0 everywhere");
  }
  if (!args.bands.empty() && args.input.empty()) {
    throw UsageError("-b selects bands of an --input file");
  }
  if (!args.bands.empty() && args.op == Op::normalized_difference) {
    throw UsageError("-b: normalized-difference takes its two bands from --nir and --red");
  }
  if (!args.output.empty() && !args.raster_output() &&
      (!args.format.empty() || !args.creation_options.empty())) {
    throw UsageError("-of / --co: --op " + args.op_name + " writes JSON, not a raster");
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

/// Progress on stderr: on a terminal one line updated as each tile is read, computed and written;
/// otherwise (--progress) one line per tile done.
class Progress {
 public:
  Progress(bool enabled, std::string what)
      : enabled_(enabled), tty_(::isatty(2) != 0), what_(std::move(what)) {}
  void update(std::int64_t done, std::int64_t total, const char* unit) {
    if (!enabled_ || total <= 0) return;
    const std::lock_guard<std::mutex> lock(mutex_);
    const int pct = static_cast<int>(100 * done / total);
    if (tty_) {
      std::fprintf(stderr, "\r\033[K[vsr-run] %s: %s %lld/%lld (%d%%)%s", what_.c_str(), unit,
                   static_cast<long long>(done), static_cast<long long>(total), pct,
                   done == total ? "\n" : "");
    } else {
      std::fprintf(stderr, "[vsr-run] %s: %s %lld/%lld (%d%%)\n", what_.c_str(), unit,
                   static_cast<long long>(done), static_cast<long long>(total), pct);
    }
    std::fflush(stderr);
  }
  /// A tile's step (terminal only: a pipe gets the per-tile lines).
  void stage(const vsr::TileInfo& where, vsr::TileStage stage) {
    if (!enabled_ || !tty_) return;
    const std::lock_guard<std::mutex> lock(mutex_);
    const char* step = stage == vsr::TileStage::read      ? "reading"
                       : stage == vsr::TileStage::compute ? "computing"
                                                          : "writing";
    std::fprintf(
        stderr, "\r\033[K[vsr-run] %s: tile %lld/%lld, band%s %d%s%s: %s", what_.c_str(),
        static_cast<long long>(where.index + 1), static_cast<long long>(where.total),
        where.band_count > 1 ? "s" : "", where.first_band + 1, where.band_count > 1 ? "-" : "",
        where.band_count > 1 ? std::to_string(where.first_band + where.band_count).c_str() : "",
        step);
    std::fflush(stderr);
  }

 private:
  bool enabled_, tty_;
  std::string what_;
  std::mutex mutex_;
};

/// Where the ops run.
enum class Mode { gpu, emulator, none };

/// A double as JSON: full precision (%.17g), null for NaN and infinities (JSON has neither).
std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

/// Runs @p fn on a host @p piece where the ops run: on the device in gpu mode (a device copy,
/// freed on return), else on the host.
template <class Fn>
auto on_compute(Mode mode, const vsr::OwnedRasterArray& piece, Fn&& fn) {
  if (mode != Mode::gpu || piece.residency() == vsr::Residency::device) return fn(piece);
  vsr::OwnedRasterArray dev =
      vsr::OwnedRasterArray::from_host(piece.host_data(), piece.dtype(), piece.band_count(),
                                       piece.height(), piece.width(), std::nullopt, piece.affine(),
                                       piece.crs())
          .with_nodata(piece.exact_nodata());
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

std::string nodata_text(const std::optional<vsr::NodataValue>& v) {
  return v ? v->to_string() : std::string("none");
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

int run(const Arguments& args) {
  const auto start = std::chrono::steady_clock::now();
  // An interrupted or killed run leaves no partial output: the output is written to a temporary
  // file beside it, which these handlers remove before the signal ends the process.
  vsr::remove_partial_outputs_on_signals();
  const bool show_progress = !args.quiet && (args.progress || ::isatty(2) != 0);
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

  const bool from_file = !args.input.empty();
  if ((from_file || (!args.output.empty() && args.raster_output())) && !vsr::io_available()) {
    throw std::runtime_error(std::string(from_file ? "--input" : "--output") +
                             ": this vsr-run was built without GDAL (install libgdal-dev and "
                             "rebuild); run without --input/--output to use the sample raster");
  }
  if (!args.output.empty() && file_exists(args.output) && !args.overwrite) {
    throw UsageError("--output: '" + args.output +
                     "' exists; add --overwrite to replace it (it is replaced only once the new "
                     "file is complete)");
  }
  vsr::WriteOptions write;
  if (!args.output.empty() && args.raster_output()) {
    write.driver = args.format.empty() ? vsr::output_driver_for(args.output) : args.format;
    if (write.driver.empty()) {
      throw UsageError("--output: cannot tell the format of '" + args.output +
                       "' from its extension; give -of FORMAT (e.g. -of GTiff)");
    }
    write.creation_options = args.creation_options;
    write.num_threads = args.threads;
    write.overwrite = args.overwrite;
  }

  // The raster: a file's header first, so the plan is made before any pixel is read.
  vsr::OpenOptions open;
  open.allow_virtual = args.allow_virtual;
  std::optional<vsr::OwnedRasterArray> raster;
  vsr::RasterMetadata meta;
  std::vector<std::optional<vsr::NodataValue>> file_nodata;  // of every band
  std::vector<std::optional<vsr::NodataValue>> band_nodata;  // of the selected bands
  std::vector<int> bands = args.bands;                       // selected, 1-based
  std::string input_label;
  if (!from_file) {
    raster = make_sample(args.sample_bands, args.sample_size);
    meta = raster->metadata();
    file_nodata.assign(static_cast<std::size_t>(meta.band_count), raster->exact_nodata());
    input_label = "sample";
  } else {
    const vsr::RasterFileInfo file = vsr::read_raster_info(args.input, open);
    meta = file.metadata;
    file_nodata = file.band_nodata;
    input_label = printable(args.input) + " (" + meta.driver + ")";
  }
  const int file_bands = meta.band_count;
  if (bands.empty()) {
    for (int b = 1; b <= file_bands; ++b) bands.push_back(b);
  }
  for (const int b : bands) {
    if (b > file_bands) {
      throw UsageError("-b " + std::to_string(b) + ": the input has " + std::to_string(file_bands) +
                       " band(s)");
    }
    band_nodata.push_back(file_nodata[static_cast<std::size_t>(b - 1)]);
  }
  char shape[160];
  std::snprintf(shape, sizeof shape, "%d x %lld x %lld %s", file_bands,
                static_cast<long long>(meta.height), static_cast<long long>(meta.width),
                std::string(vsr::to_string(meta.dtype)).c_str());
  input_label += std::string(", ") + shape;
  if (args.bands.size() > 0) {
    input_label += ", bands";
    for (const int b : bands) input_label += " " + std::to_string(b);
  }
  bool mixed = false;
  for (const auto& nd : band_nodata) mixed = mixed || nd != band_nodata.front();
  if (mixed) {
    input_label += ", nodata per band:";
    for (const auto& nd : band_nodata) input_label += " " + nodata_text(nd);
  } else {
    input_label += ", nodata " + nodata_text(band_nodata.front());
  }

  int nir = 0, red = 0;
  if (args.op == Op::normalized_difference) {
    if (file_bands < 2) throw UsageError("--op " + args.op_name + " needs 2 or more bands");
    nir = args.nir.value_or(file_bands >= 4 ? 4 : 2);
    red = args.red.value_or(file_bands >= 4 ? 3 : 1);
    if (nir < 1 || nir > file_bands || red < 1 || red > file_bands) {
      throw UsageError("--nir/--red must be band numbers in [1, " + std::to_string(file_bands) +
                       "]");
    }
    if (nir == red) {
      throw UsageError("--nir and --red are the same band (" + std::to_string(nir) + ")");
    }
    bands = {nir, red};
    band_nodata = {file_nodata[static_cast<std::size_t>(nir - 1)],
                   file_nodata[static_cast<std::size_t>(red - 1)]};
  }

  const bool per_band_op = args.op != Op::normalized_difference;
  vsr::PlanOptions popts;
  std::string budget_note = args.budget ? "" : " (auto)";
  if (args.budget) {
    popts.vram_budget = *args.budget;
  } else if (const std::uint64_t vram = vsr::available_vram_bytes(); vram > 0) {
    popts.vram_budget = vram;
  } else {
    // No GPU: plan tiles for host memory, so that a raster larger than memory still streams.
    popts.vram_budget = std::max<std::uint64_t>(
        1, std::min<std::uint64_t>(vsr::available_host_memory() / 4, 1ULL << 30));
    budget_note = " (auto: host memory, no GPU)";
  }
  popts.per_band = per_band_op;
  popts.halo = args.op == Op::focal_mean ? 1 : 0;
  vsr::RasterMetadata plan_meta = meta;
  plan_meta.band_count = static_cast<int>(bands.size());
  // Reductions hold one buffer per band; the others an input and an output.
  popts.buffers_per_band = args.raster_output() ? 2 : 1;
  const vsr::RasterPlan plan = vsr::plan_from_metadata(plan_meta, popts);
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

  vsr::StreamOptions stream;
  stream.open = open;
  stream.bands = bands;
  stream.per_band = per_band_op;
  stream.mixed_nodata = !per_band_op;
  stream.host_memory_limit = args.host_memory.value_or(0);
  stream.write = write;
  stream.metadata = (args.op == Op::clip || args.op == Op::fill_nodata || args.op == Op::focal_mean)
                        ? vsr::MetadataCopy::all
                        : vsr::MetadataCopy::descriptive;
  stream.stage = [&](const vsr::TileInfo& where, vsr::TileStage s) { progress.stage(where, s); };
  if (from_file) stream.gdal_cache_bytes = vsr::gdal_cache_for_plan(args.input, plan, stream);

  const std::size_t nsel = bands.size();
  std::vector<vsr::BandStatistics> stats(nsel);
  // Statistics of tiles merged per band (merge_statistics: exact min/max/count, Chan's update).
  const auto merge_stats = [&](const vsr::OwnedRasterArray& tile, const vsr::TileInfo& where) {
    const std::vector<vsr::BandStatistics> s =
        on_compute(mode, tile, [](const auto& r) { return vsr::band_statistics(r); });
    for (int b = 0; b < where.band_count; ++b) {
      vsr::BandStatistics& band = stats[static_cast<std::size_t>(where.first_band + b)];
      band = vsr::merge_statistics(band, s[static_cast<std::size_t>(b)]);
    }
  };
  // A streamed reduction over the file, or over the sample band by band (tiles of the plan).
  const auto reduce =
      [&](const std::string& what,
          const std::function<void(const vsr::OwnedRasterArray&, const vsr::TileInfo&)>& visit) {
        Progress pass(show_progress, what);
        if (from_file) {
          vsr::StreamOptions s = stream;
          s.progress = [&](std::int64_t done, std::int64_t total) {
            pass.update(done, total, "tile");
          };
          s.stage = [&](const vsr::TileInfo& where, vsr::TileStage st) { pass.stage(where, st); };
          vsr::for_each_raster_tile(args.input, plan, visit, s);
          return;
        }
        const std::vector<vsr::TileWindow> tiles =
            tiled ? vsr::tile_windows(meta.height, meta.width, plan.tile_shape->first,
                                      plan.tile_shape->second)
                  : vsr::tile_windows(meta.height, meta.width, meta.height, meta.width);
        const auto total = static_cast<std::int64_t>(tiles.size() * nsel);
        std::int64_t done = 0;
        const std::size_t item = vsr::itemsize(meta.dtype);
        for (std::size_t b = 0; b < nsel; ++b) {
          const vsr::OwnedRasterArray band = raster->band(bands[b] - 1);
          for (const vsr::TileWindow& t : tiles) {
            const vsr::RasterWindow& w = t.window;
            std::vector<std::byte> buf(static_cast<std::size_t>(w.height * w.width) * item);
            const auto* src = static_cast<const std::byte*>(band.host_data());
            for (std::int64_t y = 0; y < w.height; ++y) {
              std::copy_n(
                  src + static_cast<std::size_t>((w.row_off + y) * meta.width + w.col_off) * item,
                  static_cast<std::size_t>(w.width) * item,
                  buf.data() + static_cast<std::size_t>(y * w.width) * item);
            }
            const vsr::OwnedRasterArray tile =
                vsr::OwnedRasterArray::from_host(buf.data(), meta.dtype, 1, w.height, w.width)
                    .with_nodata(band_nodata[b]);
            vsr::TileInfo where;
            where.index = done;
            where.total = total;
            where.window = w;
            where.read = w;
            where.first_band = static_cast<int>(b);
            where.band_count = 1;
            visit(tile, where);
            pass.update(++done, total, "tile");
          }
        }
      };

  std::string output_label = "none (use --output FILE to write the result)";
  std::string note;
  std::vector<std::vector<std::int64_t>> hist;
  std::vector<Range> hist_range;

  if (args.op == Op::stats) {
    reduce(args.op_name, merge_stats);
  } else if (args.op == Op::histogram) {
    hist_range.resize(nsel);
    if (args.range) {
      std::fill(hist_range.begin(), hist_range.end(), *args.range);
    } else {
      // numpy's default range: each band's valid min and max (+-0.5 when they are equal).
      reduce("histogram (range pass)", merge_stats);
      for (std::size_t b = 0; b < nsel; ++b) {
        const vsr::BandStatistics& m = stats[b];
        if (m.count > 0 && (!std::isfinite(m.min) || !std::isfinite(m.max))) {
          throw std::runtime_error("histogram: band " + std::to_string(bands[b]) +
                                   " holds infinite values (its valid range is [" +
                                   std::to_string(m.min) + ", " + std::to_string(m.max) +
                                   "]): give --range LO,HI");
        }
        hist_range[b] = m.count == 0    ? Range{0, 1}
                        : m.min < m.max ? Range{m.min, m.max}
                                        : Range{m.min - 0.5, m.max + 0.5};
      }
    }
    hist.assign(nsel, std::vector<std::int64_t>(static_cast<std::size_t>(args.bins), 0));
    reduce(args.op_name, [&](const vsr::OwnedRasterArray& tile, const vsr::TileInfo& where) {
      for (int b = 0; b < where.band_count; ++b) {
        const auto k = static_cast<std::size_t>(where.first_band + b);
        const auto h = on_compute(mode, tile.band(b), [&](const auto& r) {
          return vsr::histogram(r, args.bins, hist_range[k].lo, hist_range[k].hi);
        });
        for (std::size_t i = 0; i < h[0].size(); ++i) hist[k][i] += h[0][i];
      }
    });
  } else {
    std::function<vsr::OwnedRasterArray(const vsr::OwnedRasterArray&)> f;
    if (args.op == Op::focal_mean) {
      f = [edge = args.edge](const vsr::OwnedRasterArray& r) {
        return vsr::focal_mean_3x3(r, edge);
      };
    } else if (args.op == Op::clip) {
      f = [r = *args.range](const vsr::OwnedRasterArray& t) { return vsr::clip(t, r.lo, r.hi); };
    } else if (args.op == Op::fill_nodata) {
      f = [v = *args.value](const vsr::OwnedRasterArray& t) { return vsr::fill_nodata(t, v); };
    } else if (args.op == Op::normalized_difference) {
      // A file's tiles carry the two bands alone (stream.bands), each with its own nodata.
      const int a = from_file ? 0 : nir - 1, b = from_file ? 1 : red - 1;
      f = [a, b, na = band_nodata[0], nb = band_nodata[1]](const vsr::OwnedRasterArray& r) {
        return vsr::normalized_difference(r.band(a).with_nodata(na), r.band(b).with_nodata(nb));
      };
    } else {
      Range in{}, out = args.out_range.value_or(Range{0, 1});
      const vsr::DType ot = args.ot.value_or(vsr::DType::float32);
      if (args.in_range) {
        in = *args.in_range;
      } else {
        // The valid range of all selected bands, so every tile and band maps the same way: a
        // first streamed pass.
        reduce("rescale (range pass)", merge_stats);
        in = {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity()};
        for (std::size_t b = 0; b < nsel; ++b) {
          const vsr::BandStatistics& m = stats[b];
          if (m.count == 0) continue;
          if (!std::isfinite(m.min) || !std::isfinite(m.max)) {
            throw std::runtime_error("rescale: band " + std::to_string(bands[b]) +
                                     " holds infinite values (its valid range is [" +
                                     std::to_string(m.min) + ", " + std::to_string(m.max) +
                                     "]): give --in-range LO,HI");
          }
          in.lo = std::min(in.lo, m.min), in.hi = std::max(in.hi, m.max);
        }
        if (!(in.lo <= in.hi)) {
          in = {0, 1};  // no valid pixel: every output pixel is nodata
          note = "no valid pixel: every output pixel is nodata";
        } else if (in.lo == in.hi) {
          // A constant raster: every valid pixel maps to the low end of the output range.
          in.hi = in.lo + std::max(1.0, std::fabs(in.lo));
          note = "constant raster (every valid pixel is " + json_number(in.lo) +
                 "): valid pixels map to " + json_number(out.lo);
        }
      }
      const bool clamp = args.in_range.has_value();
      f = [in, out, ot, clamp](const vsr::OwnedRasterArray& t) {
        // With a given input range, values outside it are clamped first (no extrapolation, so
        // no valid value can reach the nodata chosen outside the output range).
        if (clamp)
          return vsr::rescale(vsr::clip(t, in.lo, in.hi), in.lo, in.hi, out.lo, out.hi, ot);
        return vsr::rescale(t, in.lo, in.hi, out.lo, out.hi, ot);
      };
      char buf[200];
      std::snprintf(buf, sizeof buf, "[%s, %s] -> [%s, %s] as %s", json_number(in.lo).c_str(),
                    json_number(in.hi).c_str(), json_number(out.lo).c_str(),
                    json_number(out.hi).c_str(), std::string(vsr::to_string(ot)).c_str());
      note = std::string(buf) + (note.empty() ? "" : "; " + note);
    }
    stream.progress = tile_progress;
    const vsr::BandOp op = compute_op(mode, f, true, per_band_op);
    if (from_file && !args.output.empty()) {
      // The main job: the file goes through tile by tile, one tile live, the output written
      // as the tiles come (a whole plan is one tile).
      vsr::process_raster_file(args.input, args.output, op, plan, stream);
    } else if (from_file) {
      // No output: the op runs tile by tile and its results are dropped (a timing run).
      vsr::for_each_raster_tile(
          args.input, plan,
          [&](const vsr::OwnedRasterArray& tile, const vsr::TileInfo&) { (void)op(tile); }, stream);
    } else {
      std::optional<vsr::OwnedRasterArray> result;
      if (args.op == Op::normalized_difference) {
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
      if (!args.output.empty()) vsr::write_raster(args.output, *result, write);
    }
    if (!args.output.empty()) {
      const vsr::RasterFileInfo out =
          vsr::read_raster_info(args.output, {.drivers = {write.driver}});
      std::string nd = nodata_text(out.band_nodata.front());
      for (const auto& v : out.band_nodata) {
        if (v != out.band_nodata.front()) nd = "per band";
      }
      output_label = printable(args.output) + " (" +
                     std::string(vsr::to_string(out.metadata.dtype)) + ", " +
                     std::to_string(out.metadata.band_count) + " band(s), " + out.metadata.driver +
                     ", nodata " + nd + ")";
    }
  }

  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double pixels = static_cast<double>(nsel) * static_cast<double>(meta.height) *
                        static_cast<double>(meta.width);

  // Statistics and histograms: a table, or JSON (to stdout, or to --output).
  if (!args.raster_output()) {
    std::string text;
    const bool json = args.json || !args.output.empty();
    if (json) {
      text = "{\"input\": " + vsr_cli::json_string(from_file ? args.input : "sample") +
             ", \"dtype\": \"" + std::string(vsr::to_string(meta.dtype)) + "\", \"bands\": [";
      for (std::size_t b = 0; b < nsel; ++b) {
        text += std::string(b ? ", " : "") + "{\"band\": " + std::to_string(bands[b]) +
                ", \"nodata\": " +
                (band_nodata[b] ? vsr_cli::json_string(band_nodata[b]->to_string()) : "null");
        if (args.op == Op::stats) {
          const vsr::BandStatistics& m = stats[b];
          const bool any = m.count > 0;
          text += ", \"count\": " + std::to_string(m.count) +
                  ", \"min\": " + (any ? json_number(m.min) : "null") +
                  ", \"max\": " + (any ? json_number(m.max) : "null") +
                  ", \"mean\": " + (any ? json_number(m.mean) : "null") +
                  ", \"std\": " + (any ? json_number(m.std) : "null");
        } else {
          text += ", \"range\": [" + json_number(hist_range[b].lo) + ", " +
                  json_number(hist_range[b].hi) + "], \"edges\": [";
          const double step = (hist_range[b].hi - hist_range[b].lo) / args.bins;
          for (int i = 0; i <= args.bins; ++i) {
            const double e = i == args.bins ? hist_range[b].hi : i * step + hist_range[b].lo;
            text += std::string(i ? ", " : "") + json_number(e);
          }
          text += "], \"counts\": [";
          for (std::size_t i = 0; i < hist[b].size(); ++i) {
            text += std::string(i ? ", " : "") + std::to_string(hist[b][i]);
          }
          text += "]";
        }
        text += "}";
      }
      text += "]}\n";
    } else if (args.op == Op::stats) {
      char line[256];
      std::snprintf(line, sizeof line, "%-5s %12s %14s %14s %14s %14s\n", "band", "count", "min",
                    "max", "mean", "std");
      text += line;
      for (std::size_t b = 0; b < nsel; ++b) {
        const vsr::BandStatistics& m = stats[b];
        const double nan = std::numeric_limits<double>::quiet_NaN();
        const bool any = m.count > 0;
        std::snprintf(line, sizeof line, "%-5d %12lld %14.6g %14.6g %14.6g %14.6g\n", bands[b],
                      static_cast<long long>(m.count), any ? m.min : nan, any ? m.max : nan,
                      any ? m.mean : nan, any ? m.std : nan);
        text += line;
      }
    } else {
      char line[256];
      for (std::size_t b = 0; b < nsel; ++b) {
        std::snprintf(line, sizeof line, "band %d: %d bins on [%.17g, %.17g]\n", bands[b],
                      args.bins, hist_range[b].lo, hist_range[b].hi);
        text += line;
        const double step = (hist_range[b].hi - hist_range[b].lo) / args.bins;
        for (int i = 0; i < args.bins; ++i) {
          const double e0 = i * step + hist_range[b].lo;
          const double e1 =
              i + 1 == args.bins ? hist_range[b].hi : (i + 1) * step + hist_range[b].lo;
          std::snprintf(line, sizeof line, "  [%.10g, %.10g%c %lld\n", e0, e1,
                        i + 1 == args.bins ? ']' : ')',
                        static_cast<long long>(hist[b][static_cast<std::size_t>(i)]));
          text += line;
        }
      }
    }
    if (!args.output.empty()) {
      vsr::write_file_atomically(args.output, text, args.overwrite);
      output_label = printable(args.output) + " (JSON)";
    } else {
      std::fputs(text.c_str(), stdout);
      output_label = args.json ? "the JSON above" : "the table above";
    }
  }
  if (args.quiet) return 0;

  const vsr::MemoryPoolStats pool = vsr::memory_pool_stats();
  // With --json on stdout the summary goes to stderr, so stdout stays one JSON document.
  FILE* out = args.json && args.output.empty() ? stderr : stdout;
  std::fprintf(out, "vsr-run summary\n");
  std::fprintf(out, "  op          %s%s\n", args.op_name.c_str(),
               note.empty() ? "" : (": " + note).c_str());
  std::fprintf(out, "  input       %s\n", input_label.c_str());
  std::fprintf(out, "  driver      %s\n", driver_label.c_str());
  std::fprintf(out, "  tier        %s\n",
               pool.tier.empty() ? "none (no device memory pool)" : pool.tier.c_str());
  std::string plan_text = std::string(vsr::to_string(plan.strategy));
  if (tiled) {
    plan_text += ", " + std::to_string(plan.n_tiles) + " tiles of " +
                 std::to_string(plan.tile_shape->first) + " x " +
                 std::to_string(plan.tile_shape->second) + " (halo " + std::to_string(plan.halo) +
                 ")";
  }
  plan_text += ", " + std::to_string(plan.bands_per_pass) + " band(s) per pass, budget " +
               vsr_cli::format_bytes(*popts.vram_budget) + budget_note + ", " +
               vsr_cli::format_bytes(plan.estimated_vram_per_tile) + " per pass" +
               (plan.fits_budget ? "" : " (does NOT fit the budget)");
  std::fprintf(out, "  plan        %s\n", plan_text.c_str());
  if (stream.gdal_cache_bytes) {
    std::fprintf(out, "  gdal cache  %s (from the plan)\n",
                 vsr_cli::format_bytes(*stream.gdal_cache_bytes).c_str());
  }
  if (pool.configured) {
    const std::uint64_t peak = pool.peak_bytes.value_or(pool.used_bytes.value_or(0));
    std::fprintf(
        out, "  pool        peak %s, pool size %s\n", vsr_cli::format_bytes(peak).c_str(),
        pool.pool_size ? vsr_cli::format_bytes(*pool.pool_size).c_str() : "n/a for this tier");
  } else {
    std::fprintf(out, "  pool        not configured (no driver)\n");
  }
  std::fprintf(out, "  time        %.3f s\n", seconds);
  std::fprintf(out, "  throughput  %.1f Mpx/s (%.0f pixels, all bands)\n",
               seconds > 0 ? pixels / seconds / 1e6 : 0.0, pixels);
  std::fprintf(out, "  output      %s\n", output_label.c_str());
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
