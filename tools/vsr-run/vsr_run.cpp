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
// Output: written into a temporary directory beside --output and renamed into place only when
// complete and read back, so an error, a full disk or a signal (SIGINT, SIGTERM, ...) leaves the
// old file as it was (or no file) and no temporary file; --output may name the input itself (with
// --overwrite). The format is tried on a small file before any pixel is read.
//
// Exit status: 0 on success, 2 for bad arguments (message on stderr), 1 for any other error; a
// run ended by a signal dies of that signal.
#include "../common/cli.hpp"
#include "../common/format.hpp"

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/dispatch.hpp>
#include <vibespatial/raster/driver.hpp>
#include <vibespatial/raster/errors.hpp>
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
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
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
  --ot TYPE          the output's type, a numpy name (uint8 int8 uint16 int16 uint32 int32
                     uint64 int64 float32 float64), for every op that writes a raster (default:
                     the op's own: the input's for clip and fill-nodata, float32 or float64 for
                     focal-mean and normalized-difference, float32 for rescale). Converted as
                     gdal_translate -ot does: to an integer type rounded half away from zero and
                     saturated to its range; to float32 as IEEE rounds. The output's nodata is
                     the op's when the type holds it, else the input's, else NaN (float types)
                     or the type's largest value; a valid pixel that would become that nodata
                     (e.g. 255.4 as uint8 with nodata 255) stops the run with an error
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
  -o, --output FILE  write the result there. Rasters: a new file, all or nothing (written in a
                     hidden temporary directory beside it, checked, then renamed into place: an
                     error or a signal leaves FILE as it was; a run killed with SIGKILL leaves
                     the temporary, which the next run writing FILE removes). stats and
                     histogram: their JSON. FILE must be a regular file or new (never a FIFO or
                     a device such as /dev/null)
  --overwrite        replace an existing --output (refused without it); needed to write over
                     the input itself
  -of FORMAT         GDAL raster driver of the output, any case (default: from the extension,
                     .tif is GTiff): any driver with Create that writes files, e.g. GTiff, GPKG,
                     HFA, ENVI, EHdr, netCDF, PCIDSK, SAGA, RRASTER. Before any pixel is read
                     the format is tried on a small file of the output's type, band count and
                     nodata, and refused (exit 2) with the driver's reason when it cannot hold
                     them (e.g. GPKG: 1 band, or up to 4 of uint8; BMP: uint8 only; GSBG keeps
                     its own nodata) or writes no file (MEM; PNG and JPEG have no Create:
                     convert a GTiff with gdal_translate)
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
                     refuse up front a run that needs more host memory than this (default: what
                     is available): a file run's pass (tile, result, GDAL's blocks and block
                     cache), the sample raster and its result, histograms and their text

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
    if (option == "--in-range" || option == "--out-range") return args.op == Op::rescale;
    if (option == "--ot") return args.raster_output();
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

/// The deterministic sample: smooth ramps per band plus a hash-based texture, ~1% NaN. Made in
/// its raster's own buffer (one copy of the pixels in memory).
vsr::OwnedRasterArray make_sample(int bands, std::int64_t side) {
  // 10 m pixels in UTM 33N, so a written sample opens in any GIS.
  vsr::OwnedRasterArray r =
      vsr::OwnedRasterArray::allocate(vsr::Residency::host, vsr::DType::float32, bands, side, side,
                                      std::numeric_limits<double>::quiet_NaN(),
                                      vsr::Affine{10, 0, 500000, 0, -10, 5000000}, "EPSG:32633");
  auto* px = static_cast<float*>(r.mutable_host_data());
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
  return r;
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

/// Runs @p fn on @p piece where the ops run: on the device in gpu mode (a host piece is cloned
/// there once, freed on return), else on the host.
template <class Fn>
auto on_compute(Mode mode, const vsr::OwnedRasterArray& piece, Fn&& fn) {
  if (mode != Mode::gpu || piece.residency() == vsr::Residency::device) return fn(piece);
  return fn(piece.clone_to(vsr::Residency::device));
}

std::string nodata_text(const std::optional<vsr::NodataValue>& v) {
  return v ? v->to_string() : std::string("none");
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

/// Where the ops run, and the summary's words for it. Configures the pool when there is a driver.
std::pair<Mode, std::string> detect_device() {
  const vsr::DriverInfo info = vsr::driver_info();
  std::pair<Mode, std::string> where{Mode::none,
                                     "none (" + printable(info.reason) + "): host ops on the CPU"};
  if (info.available && info.emulated) {
    where = {Mode::emulator, "emulator (" + printable(info.library) + "): host ops on the CPU"};
  } else if (info.available && vsr::ops_built_with_cuda()) {
    where = {Mode::gpu,
             "GPU " + printable(info.devices.empty() ? std::string("?") : info.devices[0].name) +
                 ": device ops (CUDA)"};
  } else if (info.available) {
    where.second = "GPU present, but this build has no CUDA ops: host ops on the CPU";
  }
  if (info.available) vsr::configure_memory_pool();
  return where;
}

/// Whether @p v is exactly a value of @p t (and of a double, as convert_dtype takes it).
bool holds(vsr::DType t, const vsr::NodataValue& v) {
  const double d = v.to_double();
  if (!(vsr::NodataValue(d) == v)) return false;
  if (t == vsr::DType::float64) return true;
  if (t == vsr::DType::float32)
    return std::isnan(d) || static_cast<double>(static_cast<float>(d)) == d;
  if (!std::isfinite(d) || std::floor(d) != d) return false;
  switch (t) {
    case vsr::DType::uint8:
      return d >= 0 && d <= 255;
    case vsr::DType::int8:
      return d >= -128 && d <= 127;
    case vsr::DType::uint16:
      return d >= 0 && d <= 65535;
    case vsr::DType::int16:
      return d >= -32768 && d <= 32767;
    case vsr::DType::uint32:
      return d >= 0 && d <= 4294967295.0;
    case vsr::DType::int32:
      return d >= -2147483648.0 && d <= 2147483647.0;
    case vsr::DType::uint64:
      return d >= 0 && d < 18446744073709551616.0;
    default:
      return d >= -9223372036854775808.0 && d < 9223372036854775808.0;  // int64
  }
}

/// The nodata of an op's @p result converted to --ot @p t (see --help): none if the result has
/// none; else the result's, else the source's, when @p t holds it; else NaN (float) or the
/// type's largest value (integer; 64-bit: the largest double below 2^63 / 2^64).
std::optional<vsr::NodataValue> converted_nodata(const vsr::OwnedRasterArray& result,
                                                 const vsr::OwnedRasterArray& source,
                                                 vsr::DType t) {
  if (!result.exact_nodata()) return std::nullopt;
  for (const auto& c : {result.exact_nodata(), source.exact_nodata()}) {
    if (c && holds(t, *c)) return c;
  }
  if (vsr::is_floating_point(t)) return vsr::NodataValue(std::numeric_limits<double>::quiet_NaN());
  switch (t) {
    case vsr::DType::uint8:
      return vsr::NodataValue(255.0);
    case vsr::DType::int8:
      return vsr::NodataValue(127.0);
    case vsr::DType::uint16:
      return vsr::NodataValue(65535.0);
    case vsr::DType::int16:
      return vsr::NodataValue(32767.0);
    case vsr::DType::uint32:
      return vsr::NodataValue(4294967295.0);
    case vsr::DType::int32:
      return vsr::NodataValue(2147483647.0);
    case vsr::DType::uint64:
      return vsr::NodataValue(std::nextafter(18446744073709551616.0, 0.0));
    default:
      return vsr::NodataValue(std::nextafter(9223372036854775808.0, 0.0));
  }
}

/// The bytes of one pixel of @p t holding @p v (exactly, for 64-bit integers).
std::vector<std::byte> pixel_bytes(vsr::DType t, const vsr::NodataValue& v) {
  std::vector<std::byte> out(vsr::itemsize(t));
  if (!holds(t, v) && t != vsr::DType::int64 && t != vsr::DType::uint64) return out;
  const auto put = [&](auto x) { std::memcpy(out.data(), &x, sizeof x); };
  const double d = v.to_double();
  switch (t) {
    case vsr::DType::uint8:
      put(static_cast<std::uint8_t>(d));
      break;
    case vsr::DType::int8:
      put(static_cast<std::int8_t>(d));
      break;
    case vsr::DType::uint16:
      put(static_cast<std::uint16_t>(d));
      break;
    case vsr::DType::int16:
      put(static_cast<std::int16_t>(d));
      break;
    case vsr::DType::uint32:
      put(static_cast<std::uint32_t>(d));
      break;
    case vsr::DType::int32:
      put(static_cast<std::int32_t>(d));
      break;
    case vsr::DType::uint64:
      put(v.as_uint64().value_or(0));
      break;
    case vsr::DType::int64:
      put(v.as_int64().value_or(0));
      break;
    case vsr::DType::float32:
      put(static_cast<float>(d));
      break;
    default:
      put(d);
      break;
  }
  return out;
}

using RasterFn = std::function<vsr::OwnedRasterArray(const vsr::OwnedRasterArray&)>;

/// One vsr-run: its steps in the order run() takes them.
class Job {
 public:
  explicit Job(const Arguments& args) : args_(args) {}
  int run();

 private:
  void check_output();
  void check_raster_output();
  void check_host_memory(std::uint64_t bytes, const std::string& what,
                         const std::string& advice) const;
  void open_input();
  void make_plan();
  void reduce(const std::string& what,
              const std::function<void(const vsr::OwnedRasterArray&, const vsr::TileInfo&)>& visit);
  void run_statistics();
  void run_histogram();
  RasterFn raster_function();
  RasterFn rescale_function();
  vsr::BandOp compute_op(RasterFn f, bool result_to_host, bool per_band) const;
  void run_raster_op();
  void print_results();
  void print_summary(double seconds) const;

  const Arguments& args_;
  /// What the run is doing, for the message of an allocation that fails all the same.
  std::string step_ = "starting";
  Mode mode_ = Mode::none;
  std::string driver_label_;
  bool show_progress_ = false;
  bool from_file_ = false;
  vsr::WriteOptions write_;
  vsr::OpenOptions open_;
  std::optional<vsr::OwnedRasterArray> raster_;  ///< the sample
  vsr::RasterMetadata meta_;
  std::vector<std::optional<vsr::NodataValue>> band_nodata_;  ///< of the selected bands
  std::vector<int> bands_;                                    ///< selected, 1-based
  int nir_ = 0, red_ = 0;
  std::string input_label_;
  vsr::PlanOptions popts_;
  std::string budget_note_;
  vsr::RasterPlan plan_;
  bool tiled_ = false;
  std::optional<Progress> progress_;
  vsr::StreamOptions stream_;
  std::vector<vsr::BandStatistics> stats_;
  std::vector<std::vector<std::int64_t>> hist_;
  std::vector<Range> hist_range_;
  std::string note_;
  std::string output_label_ = "none (use --output FILE to write the result)";
};

int Job::run() {
  const auto start = std::chrono::steady_clock::now();
  // An interrupted or killed run leaves no partial output: the output is written to a temporary
  // file beside it, which these handlers remove before the signal ends the process.
  vsr::remove_partial_outputs_on_signals();
  try {
    show_progress_ = !args_.quiet && (args_.progress || ::isatty(2) != 0);
    step_ = "looking for a device";
    std::tie(mode_, driver_label_) = detect_device();
    from_file_ = !args_.input.empty();
    step_ = "checking the output";
    check_output();
    step_ = from_file_ ? "reading the input's header" : "making the sample raster";
    open_input();
    step_ = "checking the output";
    check_raster_output();
    step_ = "planning";
    make_plan();
    step_ = "running " + args_.op_name;
    if (args_.op == Op::stats) {
      run_statistics();
    } else if (args_.op == Op::histogram) {
      run_histogram();
    } else {
      run_raster_op();
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    step_ = "printing the results";
    if (!args_.raster_output()) print_results();
    if (!args_.quiet) print_summary(seconds);
  } catch (const vsr::OutOfMemoryError&) {
    throw;  // the device's, with its own message
  } catch (const std::bad_alloc&) {
    // Every allocation sized by the input is checked up front; one that fails all the same
    // (memory taken meanwhile) is named, never a bare std::bad_alloc.
    const std::uint64_t avail = vsr::available_host_memory();
    throw vsr::HostMemoryLimitError(0, avail,
                                    "out of host memory while " + step_ + " (" +
                                        vsr_cli::format_bytes(avail) + " available now)");
  }
  return 0;
}

/// Refuses up front (HostMemoryLimitError) @p what, which needs @p bytes of host memory, when
/// that is more than --host-memory or what is available; @p advice says what to do instead.
void Job::check_host_memory(std::uint64_t bytes, const std::string& what,
                            const std::string& advice) const {
  const std::uint64_t limit = args_.host_memory.value_or(vsr::available_host_memory());
  if (bytes <= limit) return;
  throw vsr::HostMemoryLimitError(
      bytes, limit,
      what + " needs " + vsr_cli::format_bytes(bytes) + " of host memory, more than the " +
          vsr_cli::format_bytes(limit) +
          (args_.host_memory ? " allowed (--host-memory)" : " available (--host-memory)") + "; " +
          advice);
}

/// GDAL present, --overwrite, and the output's driver and creation options (what needs no
/// input: the trial of the format comes after the input's header, check_raster_output).
void Job::check_output() {
  if ((from_file_ || (!args_.output.empty() && args_.raster_output())) && !vsr::io_available()) {
    throw std::runtime_error(std::string(from_file_ ? "--input" : "--output") +
                             ": this vsr-run was built without GDAL (install libgdal-dev and "
                             "rebuild); run without --input/--output to use the sample raster");
  }
  if (!args_.output.empty() && file_exists(args_.output) && !args_.overwrite) {
    throw UsageError("--output: '" + args_.output +
                     "' exists; add --overwrite to replace it (it is replaced only once the new "
                     "file is complete)");
  }
  if (!args_.output.empty() && args_.raster_output()) {
    write_.driver = args_.format.empty() ? vsr::output_driver_for(args_.output) : args_.format;
    if (write_.driver.empty()) {
      throw UsageError("--output: cannot tell the format of '" + args_.output +
                       "' from its extension; give -of FORMAT (e.g. -of GTiff)");
    }
    write_.num_threads = args_.threads;
    write_.overwrite = args_.overwrite;
    // The driver first, without --co: what it refuses is the format's (named by -of, or by the
    // output's extension), never the creation options'.
    try {
      vsr::check_write_options(write_);
    } catch (const std::invalid_argument& e) {
      throw UsageError(args_.format.empty()
                           ? "--output: " + std::string(e.what()) + " (the format of '" +
                                 args_.output + "', from its extension; -of chooses another)"
                           : "-of: " + std::string(e.what()));
    }
    write_.creation_options = args_.creation_options;
    // Options the driver refuses are a usage error now, not a failure after the whole run.
    try {
      vsr::check_write_options(write_);
    } catch (const std::invalid_argument& e) {
      throw UsageError("--co: " + std::string(e.what()));
    }
  } else if (!args_.output.empty()) {
    // A JSON output: its path is checked now (a directory, a FIFO, a read-only directory), not
    // after the run.
    try {
      vsr::check_output_path(args_.output, args_.overwrite);
    } catch (const std::invalid_argument& e) {
      throw UsageError("--output: " + std::string(e.what()));
    }
  }
  open_.allow_virtual = args_.allow_virtual;
}

/// A raster output, tried before any pixel is read: a small file of the output's dtype, band
/// count and nodata written in the format, read back and removed (check_output_file). The dtype
/// and nodata are what the op makes of a tiny raster of the input's dtype and nodata.
void Job::check_raster_output() {
  if (args_.output.empty() || !args_.raster_output()) return;
  const bool ndvi = args_.op == Op::normalized_difference;
  const int tiny_bands = ndvi ? (from_file_ ? 2 : meta_.band_count) : 1;
  vsr::OwnedRasterArray tiny =
      vsr::OwnedRasterArray::allocate(vsr::Residency::host, meta_.dtype, tiny_bands, 3, 3)
          .with_nodata(band_nodata_.front());
  // Every pixel nodata (or 0 without one): no valid value can collide with an output nodata.
  {
    std::vector<std::byte> pixel(vsr::itemsize(meta_.dtype));
    if (const auto& nd = band_nodata_.front()) pixel = pixel_bytes(meta_.dtype, *nd);
    auto* dst = static_cast<std::byte*>(tiny.mutable_host_data());
    for (std::size_t k = 0; k < tiny.byte_size(); k += pixel.size()) {
      std::copy(pixel.begin(), pixel.end(), dst + k);
    }
  }
  vsr::DType out_dtype = args_.ot.value_or(args_.op == Op::rescale ? vsr::DType::float32
                                           : args_.op == Op::clip || args_.op == Op::fill_nodata
                                               ? meta_.dtype
                                               : vsr::compute_dtype(meta_.dtype));
  std::optional<vsr::NodataValue> out_nodata;
  try {
    const std::string note = note_;
    const Range out = args_.out_range.value_or(Range{0, 1});
    const vsr::OwnedRasterArray r =
        args_.op == Op::rescale
            ? vsr::rescale(tiny, 0, 1, out.lo, out.hi, args_.ot.value_or(vsr::DType::float32))
            : raster_function()(tiny);
    note_ = note;
    out_dtype = r.dtype();
    out_nodata = r.exact_nodata();
  } catch (const std::exception&) {
    // The op refuses the tiny raster (the run will say why): the trial goes without a nodata.
  }
  const int out_bands = ndvi ? 1 : static_cast<int>(bands_.size());
  try {
    vsr::check_output_file(args_.output, write_, out_dtype, out_bands, out_nodata, meta_.crs);
  } catch (const std::invalid_argument& e) {
    throw UsageError((args_.format.empty() ? "--output: " : "-of: ") + std::string(e.what()));
  }
}

/// The raster: a file's header only (the plan is made before any pixel is read), or the sample;
/// the selected bands and their nodata.
void Job::open_input() {
  std::vector<std::optional<vsr::NodataValue>> file_nodata;  // of every band
  if (!from_file_) {
    // The sample is held whole, with (raster ops) a result as large at up to 8 bytes a pixel,
    // and a band and its result at a time beside them.
    const std::uint64_t side = static_cast<std::uint64_t>(args_.sample_size);
    const std::uint64_t band_px = side * side;  // <= 2^32
    const std::uint64_t sample = band_px * static_cast<std::uint64_t>(args_.sample_bands) * 4;
    const std::uint64_t work =
        args_.raster_output()
            ? band_px * static_cast<std::uint64_t>(args_.sample_bands) * 8 + 2 * band_px * 8
            : 2 * band_px * 8;
    char shape[160];
    std::snprintf(shape, sizeof shape, "the sample raster (%d band(s) of %lld x %lld float32, %s)",
                  args_.sample_bands, static_cast<long long>(side), static_cast<long long>(side),
                  vsr_cli::format_bytes(sample).c_str());
    check_host_memory(sample + work,
                      std::string(shape) +
                          (args_.raster_output() ? " with its result" : " with its working copies"),
                      "give a smaller --sample-size or fewer --bands");
    step_ = "making " + std::string(shape);
    raster_ = make_sample(args_.sample_bands, args_.sample_size);
    step_ = "reading the input";
    meta_ = raster_->metadata();
    file_nodata.assign(static_cast<std::size_t>(meta_.band_count), raster_->exact_nodata());
    input_label_ = "sample";
  } else {
    const vsr::RasterFileInfo file = vsr::read_raster_info(args_.input, open_);
    meta_ = file.metadata;
    file_nodata = file.band_nodata;
    input_label_ = printable(args_.input) + " (" + meta_.driver + ")";
  }
  const int file_bands = meta_.band_count;
  bands_ = args_.bands;
  if (bands_.empty()) {
    for (int b = 1; b <= file_bands; ++b) bands_.push_back(b);
  }
  for (const int b : bands_) {
    if (b > file_bands) {
      throw UsageError("-b " + std::to_string(b) + ": the input has " + std::to_string(file_bands) +
                       " band(s)");
    }
    band_nodata_.push_back(file_nodata[static_cast<std::size_t>(b - 1)]);
  }
  char shape[160];
  std::snprintf(shape, sizeof shape, "%d x %lld x %lld %s", file_bands,
                static_cast<long long>(meta_.height), static_cast<long long>(meta_.width),
                std::string(vsr::to_string(meta_.dtype)).c_str());
  input_label_ += std::string(", ") + shape;
  if (!args_.bands.empty()) {
    input_label_ += ", bands";
    for (const int b : bands_) input_label_.append(" ").append(std::to_string(b));
  }
  // What the reductions hold per selected band: statistics, or histograms (counts, edges) and
  // their text (a table line or JSON numbers per bin).
  const std::uint64_t nsel = bands_.size();
  if (args_.op == Op::histogram) {
    const std::uint64_t per_band = (static_cast<std::uint64_t>(args_.bins) + 1) * 80;
    check_host_memory(nsel * per_band,
                      "a histogram of " + std::to_string(args_.bins) + " bins for each of " +
                          std::to_string(nsel) + " band(s), with its text,",
                      "give fewer --bins or fewer bands (-b)");
  } else if (args_.op == Op::stats) {
    check_host_memory(nsel * 512, "the statistics of " + std::to_string(nsel) + " band(s)",
                      "select fewer bands (-b)");
  }
  bool mixed = false;
  for (const auto& nd : band_nodata_) mixed = mixed || nd != band_nodata_.front();
  if (mixed) {
    input_label_ += ", nodata per band:";
    for (const auto& nd : band_nodata_) input_label_.append(" ").append(nodata_text(nd));
  } else {
    input_label_ += ", nodata " + nodata_text(band_nodata_.front());
  }

  if (args_.op == Op::normalized_difference) {
    if (file_bands < 2) throw UsageError("--op " + args_.op_name + " needs 2 or more bands");
    nir_ = args_.nir.value_or(file_bands >= 4 ? 4 : 2);
    red_ = args_.red.value_or(file_bands >= 4 ? 3 : 1);
    if (nir_ < 1 || nir_ > file_bands || red_ < 1 || red_ > file_bands) {
      throw UsageError("--nir/--red must be band numbers in [1, " + std::to_string(file_bands) +
                       "]");
    }
    if (nir_ == red_) {
      throw UsageError("--nir and --red are the same band (" + std::to_string(nir_) + ")");
    }
    bands_ = {nir_, red_};
    band_nodata_ = {file_nodata[static_cast<std::size_t>(nir_ - 1)],
                    file_nodata[static_cast<std::size_t>(red_ - 1)]};
  }
}

/// The one plan of the run: printed in the summary, followed by the streamed runs, the tiled
/// executors and dispatch_per_band_gpu alike.
void Job::make_plan() {
  const bool per_band_op = args_.op != Op::normalized_difference;
  budget_note_ = args_.budget ? "" : " (auto)";
  if (args_.budget) {
    popts_.vram_budget = *args_.budget;
  } else if (const std::uint64_t vram = vsr::available_vram_bytes(); vram > 0) {
    popts_.vram_budget = vram;
  } else {
    // No GPU: plan tiles for host memory, so that a raster larger than memory still streams.
    popts_.vram_budget = std::max<std::uint64_t>(
        1, std::min<std::uint64_t>(vsr::available_host_memory() / 4, 1ULL << 30));
    budget_note_ = " (auto: host memory, no GPU)";
  }
  popts_.per_band = per_band_op;
  popts_.halo = args_.op == Op::focal_mean ? 1 : 0;
  vsr::RasterMetadata plan_meta = meta_;
  plan_meta.band_count = static_cast<int>(bands_.size());
  // Reductions hold one buffer per band; the others an input and an output.
  popts_.buffers_per_band = args_.raster_output() ? 2 : 1;
  plan_ = vsr::plan_from_metadata(plan_meta, popts_);
  tiled_ = plan_.strategy == vsr::TilingStrategy::tiled;

  progress_.emplace(show_progress_, args_.op_name);
  stream_.open = open_;
  stream_.bands = bands_;
  stream_.per_band = per_band_op;
  stream_.mixed_nodata = !per_band_op;
  stream_.host_memory_limit = args_.host_memory.value_or(0);
  stream_.write = write_;
  stream_.metadata =
      (args_.op == Op::clip || args_.op == Op::fill_nodata || args_.op == Op::focal_mean)
          ? vsr::MetadataCopy::all
          : vsr::MetadataCopy::descriptive;
  stream_.stage = [this](const vsr::TileInfo& where, vsr::TileStage s) {
    progress_->stage(where, s);
  };
  if (from_file_) stream_.gdal_cache_bytes = vsr::gdal_cache_for_plan(args_.input, plan_, stream_);
  stats_.assign(bands_.size(), {});
}

/// A streamed reduction over the file, or over the sample band by band (tiles of the plan).
void Job::reduce(
    const std::string& what,
    const std::function<void(const vsr::OwnedRasterArray&, const vsr::TileInfo&)>& visit) {
  Progress pass(show_progress_, what);
  if (from_file_) {
    vsr::StreamOptions s = stream_;
    s.progress = [&](std::int64_t done, std::int64_t total) { pass.update(done, total, "tile"); };
    s.stage = [&](const vsr::TileInfo& where, vsr::TileStage st) { pass.stage(where, st); };
    vsr::for_each_raster_tile(args_.input, plan_, visit, s);
    return;
  }
  const std::vector<vsr::TileWindow> tiles =
      tiled_ ? vsr::tile_windows(meta_.height, meta_.width, plan_.tile_shape->first,
                                 plan_.tile_shape->second)
             : vsr::tile_windows(meta_.height, meta_.width, meta_.height, meta_.width);
  const std::size_t nsel = bands_.size();
  const auto total = static_cast<std::int64_t>(tiles.size() * nsel);
  std::int64_t done = 0;
  const std::size_t item = vsr::itemsize(meta_.dtype);
  for (std::size_t b = 0; b < nsel; ++b) {
    const vsr::OwnedRasterArray band = raster_->band(bands_[b] - 1);
    const auto* src = static_cast<const std::byte*>(band.host_data());
    for (const vsr::TileWindow& t : tiles) {
      const vsr::RasterWindow& w = t.window;
      // The tile's rows copied straight into its raster (one copy).
      vsr::OwnedRasterArray tile =
          vsr::OwnedRasterArray::allocate(vsr::Residency::host, meta_.dtype, 1, w.height, w.width)
              .with_nodata(band_nodata_[b]);
      auto* dst = static_cast<std::byte*>(tile.mutable_host_data());
      for (std::int64_t y = 0; y < w.height; ++y) {
        std::copy_n(
            src + static_cast<std::size_t>((w.row_off + y) * meta_.width + w.col_off) * item,
            static_cast<std::size_t>(w.width) * item,
            dst + static_cast<std::size_t>(y * w.width) * item);
      }
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
}

/// Statistics of tiles merged per band (merge_statistics: exact min/max/count, Chan's update).
void Job::run_statistics() {
  reduce(args_.op == Op::stats ? args_.op_name : args_.op_name + " (range pass)",
         [&](const vsr::OwnedRasterArray& tile, const vsr::TileInfo& where) {
           const std::vector<vsr::BandStatistics> s =
               on_compute(mode_, tile, [](const auto& r) { return vsr::band_statistics(r); });
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
      const auto h = on_compute(mode_, tile.band(b), [&](const auto& r) {
        return vsr::histogram(r, args_.bins, hist_range_[k].lo, hist_range_[k].hi);
      });
      for (std::size_t i = 0; i < h[0].size(); ++i) hist_[k][i] += h[0][i];
    }
  });
}

/// rescale's function; its input range from a first streamed pass unless --in-range is given.
RasterFn Job::rescale_function() {
  Range in{}, out = args_.out_range.value_or(Range{0, 1});
  const vsr::DType ot = args_.ot.value_or(vsr::DType::float32);
  if (args_.in_range) {
    in = *args_.in_range;
  } else {
    // The valid range of all selected bands, so every tile and band maps the same way.
    run_statistics();
    in = {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity()};
    for (std::size_t b = 0; b < bands_.size(); ++b) {
      const vsr::BandStatistics& m = stats_[b];
      if (m.count == 0) continue;
      if (!std::isfinite(m.min) || !std::isfinite(m.max)) {
        throw std::runtime_error("rescale: band " + std::to_string(bands_[b]) +
                                 " holds infinite values (its valid range is [" +
                                 std::to_string(m.min) + ", " + std::to_string(m.max) +
                                 "]): give --in-range LO,HI");
      }
      in.lo = std::min(in.lo, m.min), in.hi = std::max(in.hi, m.max);
    }
    if (!(in.lo <= in.hi)) {
      in = {0, 1};  // no valid pixel: every output pixel is nodata
      note_ = "no valid pixel: every output pixel is nodata";
    } else if (in.lo == in.hi) {
      // A constant raster: every valid pixel maps to the low end of the output range.
      in.hi = in.lo + std::max(1.0, std::fabs(in.lo));
      note_ = "constant raster (every valid pixel is " + json_number(in.lo) +
              "): valid pixels map to " + json_number(out.lo);
    }
  }
  char buf[200];
  std::snprintf(buf, sizeof buf, "[%s, %s] -> [%s, %s] as %s", json_number(in.lo).c_str(),
                json_number(in.hi).c_str(), json_number(out.lo).c_str(),
                json_number(out.hi).c_str(), std::string(vsr::to_string(ot)).c_str());
  note_ = std::string(buf) + (note_.empty() ? "" : "; " + note_);
  const bool clamp = args_.in_range.has_value();
  return [in, out, ot, clamp](const vsr::OwnedRasterArray& t) {
    // With a given input range, values outside it are clamped first (no extrapolation, so no
    // valid value can reach the nodata chosen outside the output range).
    if (clamp) return vsr::rescale(vsr::clip(t, in.lo, in.hi), in.lo, in.hi, out.lo, out.hi, ot);
    return vsr::rescale(t, in.lo, in.hi, out.lo, out.hi, ot);
  };
}

/// The raster op as a function of one tile, --ot applied to its result.
RasterFn Job::raster_function() {
  if (args_.op == Op::rescale) return rescale_function();  // rescale writes --ot itself
  RasterFn f;
  if (args_.op == Op::focal_mean) {
    f = [edge = args_.edge](const vsr::OwnedRasterArray& r) {
      return vsr::focal_mean_3x3(r, edge);
    };
  } else if (args_.op == Op::clip) {
    f = [r = *args_.range](const vsr::OwnedRasterArray& t) { return vsr::clip(t, r.lo, r.hi); };
  } else if (args_.op == Op::fill_nodata) {
    f = [v = *args_.value](const vsr::OwnedRasterArray& t) { return vsr::fill_nodata(t, v); };
  } else {
    // A file's tiles carry the two bands alone (stream.bands), each with its own nodata.
    const int a = from_file_ ? 0 : nir_ - 1, b = from_file_ ? 1 : red_ - 1;
    f = [a, b, na = band_nodata_[0], nb = band_nodata_[1]](const vsr::OwnedRasterArray& r) {
      return vsr::normalized_difference(r.band(a).with_nodata(na), r.band(b).with_nodata(nb));
    };
  }
  if (!args_.ot) return f;
  note_ = "output as " + std::string(vsr::to_string(*args_.ot)) +
          (vsr::is_floating_point(*args_.ot) ? "" : " (rounded half away from zero, saturated)");
  return [f = std::move(f), ot = *args_.ot](const vsr::OwnedRasterArray& t) {
    const vsr::OwnedRasterArray r = f(t);
    if (r.dtype() == ot) return r;
    return vsr::convert_dtype(r, ot, converted_nodata(r, t, ot));
  };
}

/// @p f run where the ops run, its result brought to the host when @p result_to_host (tiles are
/// written there). With @p per_band on the GPU, a tile of several bands goes through
/// dispatch_per_band_gpu with the run's budget and plan (the plan the summary prints).
vsr::BandOp Job::compute_op(RasterFn f, bool result_to_host, bool per_band) const {
  vsr::GpuDispatchOptions gpu;
  gpu.buffers_per_band = popts_.buffers_per_band;
  gpu.vram_budget = popts_.vram_budget;
  // The plan the summary prints; for a tiled plan, each tile's bands as its passes
  // (plan.bands_per_pass bands of one tile per pass).
  vsr::RasterPlan passes = plan_;
  if (tiled_) {
    passes.strategy = vsr::TilingStrategy::band_batches;
    passes.tile_shape.reset();
    passes.n_tiles = 0;
  }
  gpu.plan = passes;
  return [mode = mode_, f = std::move(f), result_to_host, per_band,
          gpu](const vsr::OwnedRasterArray& t) {
    const auto one = [&](const vsr::OwnedRasterArray& piece) { return on_compute(mode, piece, f); };
    vsr::OwnedRasterArray r = per_band && t.band_count() > 1 && mode == Mode::gpu
                                  ? vsr::dispatch_per_band_gpu(t, vsr::BandOp(one), gpu)
                                  : one(t);
    if (result_to_host) r.move_to(vsr::Residency::host);
    return r;
  };
}

void Job::run_raster_op() {
  const bool per_band_op = args_.op != Op::normalized_difference;
  RasterFn f = raster_function();
  Progress& progress = *progress_;
  stream_.progress = [&](std::int64_t done, std::int64_t total) {
    progress.update(done, total, "tile");
  };
  // Counts tiles of the in-memory tiled executors for the progress line.
  const auto counted_tiles = [&](vsr::BandOp op) -> vsr::BandOp {
    return [&, op = std::move(op), done = std::int64_t{0}](const vsr::OwnedRasterArray& t) mutable {
      vsr::OwnedRasterArray r = op(t);
      progress.update(++done, plan_.n_tiles, "tile");
      return r;
    };
  };
  if (from_file_ && !args_.output.empty()) {
    // The main job: the file goes through tile by tile, one tile live, the output written as
    // the tiles come (a whole plan is one tile).
    vsr::process_raster_file(args_.input, args_.output, compute_op(f, true, per_band_op), plan_,
                             stream_);
  } else if (from_file_) {
    // No output: the op runs tile by tile and its results are dropped (a timing run).
    const vsr::BandOp op = compute_op(f, true, per_band_op);
    vsr::for_each_raster_tile(
        args_.input, plan_,
        [&](const vsr::OwnedRasterArray& tile, const vsr::TileInfo&) { (void)op(tile); }, stream_);
  } else {
    std::optional<vsr::OwnedRasterArray> result;
    if (tiled_) {
      const vsr::BandOp op = counted_tiles(compute_op(f, true, per_band_op));
      result = per_band_op ? vsr::dispatch_tiled_halo(*raster_, op, plan_)
                           : vsr::dispatch_tiled(*raster_, op, plan_);
    } else if (!per_band_op) {
      result = compute_op(f, true, false)(*raster_);
      progress.update(1, 1, "pass");
    } else {
      std::atomic<std::int64_t> done{0};
      const std::int64_t total = meta_.band_count;
      vsr::BandOp counted =
          [&, op = compute_op(f, mode_ != Mode::gpu, false)](const vsr::OwnedRasterArray& band) {
            vsr::OwnedRasterArray r = op(band);
            progress.update(++done, total, "band");
            return r;
          };
      if (mode_ == Mode::gpu) {
        // The plan and budget the summary prints, not a second planning.
        vsr::GpuDispatchOptions gpu;
        gpu.buffers_per_band = popts_.buffers_per_band;
        gpu.vram_budget = popts_.vram_budget;
        gpu.plan = plan_;
        result = vsr::dispatch_per_band_gpu(*raster_, counted, gpu);
        result->move_to(vsr::Residency::host);
      } else {
        result = vsr::dispatch_per_band_cpu(*raster_, counted);
      }
    }
    if (!args_.output.empty()) vsr::write_raster(args_.output, *result, write_);
  }
  if (!args_.output.empty()) {
    const vsr::RasterFileInfo out =
        vsr::read_raster_info(args_.output, {.drivers = {write_.driver}});
    std::string nd = nodata_text(out.band_nodata.front());
    for (const auto& v : out.band_nodata) {
      if (v != out.band_nodata.front()) nd = "per band";
    }
    output_label_ = printable(args_.output) + " (" +
                    std::string(vsr::to_string(out.metadata.dtype)) + ", " +
                    std::to_string(out.metadata.band_count) + " band(s), " + out.metadata.driver +
                    ", nodata " + nd + ")";
  }
}

/// numpy.histogram's edges of a band: linspace(lo, hi, bins + 1) in float64, as float32 for
/// float32 data (numpy's bin dtype is the data's there).
std::vector<double> histogram_edges(Range r, int bins, vsr::DType dtype) {
  std::vector<double> edges(static_cast<std::size_t>(bins) + 1);
  const double step = (r.hi - r.lo) / bins;
  for (int i = 0; i <= bins; ++i) {
    const double e = i == bins ? r.hi : i * step + r.lo;
    edges[static_cast<std::size_t>(i)] =
        dtype == vsr::DType::float32 ? static_cast<double>(static_cast<float>(e)) : e;
  }
  return edges;
}

/// Statistics and histograms: a table, or JSON (to stdout, or to --output).
void Job::print_results() {
  const std::size_t nsel = bands_.size();
  std::string text;
  const bool json = args_.json || !args_.output.empty();
  if (json) {
    text = "{\"input\": " + vsr_cli::json_string(from_file_ ? args_.input : "sample") +
           ", \"dtype\": \"" + std::string(vsr::to_string(meta_.dtype)) + "\", \"bands\": [";
    for (std::size_t b = 0; b < nsel; ++b) {
      text += std::string(b ? ", " : "") + "{\"band\": " + std::to_string(bands_[b]) +
              ", \"nodata\": " +
              (band_nodata_[b] ? vsr_cli::json_string(band_nodata_[b]->to_string()) : "null");
      if (args_.op == Op::stats) {
        const vsr::BandStatistics& m = stats_[b];
        const bool any = m.count > 0;
        text += ", \"count\": " + std::to_string(m.count) +
                ", \"min\": " + (any ? json_number(m.min) : "null") +
                ", \"max\": " + (any ? json_number(m.max) : "null") +
                ", \"mean\": " + (any ? json_number(m.mean) : "null") +
                ", \"std\": " + (any ? json_number(m.std) : "null");
      } else {
        text += ", \"range\": [" + json_number(hist_range_[b].lo) + ", " +
                json_number(hist_range_[b].hi) + "], \"edges\": [";
        const std::vector<double> edges = histogram_edges(hist_range_[b], args_.bins, meta_.dtype);
        for (std::size_t i = 0; i < edges.size(); ++i) {
          text += std::string(i ? ", " : "") + json_number(edges[i]);
        }
        text += "], \"counts\": [";
        for (std::size_t i = 0; i < hist_[b].size(); ++i) {
          text += std::string(i ? ", " : "") + std::to_string(hist_[b][i]);
        }
        text += "]";
      }
      text += "}";
    }
    text += "]}\n";
  } else if (args_.op == Op::stats) {
    char line[256];
    std::snprintf(line, sizeof line, "%-5s %12s %14s %14s %14s %14s\n", "band", "count", "min",
                  "max", "mean", "std");
    text += line;
    for (std::size_t b = 0; b < nsel; ++b) {
      const vsr::BandStatistics& m = stats_[b];
      const double nan = std::numeric_limits<double>::quiet_NaN();
      const bool any = m.count > 0;
      std::snprintf(line, sizeof line, "%-5d %12lld %14.6g %14.6g %14.6g %14.6g\n", bands_[b],
                    static_cast<long long>(m.count), any ? m.min : nan, any ? m.max : nan,
                    any ? m.mean : nan, any ? m.std : nan);
      text += line;
    }
  } else {
    char line[256];
    for (std::size_t b = 0; b < nsel; ++b) {
      std::snprintf(line, sizeof line, "band %d: %d bins on [%.17g, %.17g]\n", bands_[b],
                    args_.bins, hist_range_[b].lo, hist_range_[b].hi);
      text += line;
      const std::vector<double> edges = histogram_edges(hist_range_[b], args_.bins, meta_.dtype);
      for (int i = 0; i < args_.bins; ++i) {
        const auto k = static_cast<std::size_t>(i);
        std::snprintf(line, sizeof line, "  [%.10g, %.10g%c %lld\n", edges[k], edges[k + 1],
                      i + 1 == args_.bins ? ']' : ')', static_cast<long long>(hist_[b][k]));
        text += line;
      }
    }
  }
  if (!args_.output.empty()) {
    vsr::write_file_atomically(args_.output, text, args_.overwrite);
    output_label_ = printable(args_.output) + " (JSON)";
  } else {
    std::fputs(text.c_str(), stdout);
    output_label_ = args_.json ? "the JSON above" : "the table above";
  }
}

void Job::print_summary(double seconds) const {
  const double pixels = static_cast<double>(bands_.size()) * static_cast<double>(meta_.height) *
                        static_cast<double>(meta_.width);
  const vsr::MemoryPoolStats pool = vsr::memory_pool_stats();
  // With --json on stdout the summary goes to stderr, so stdout stays one JSON document.
  FILE* out = args_.json && args_.output.empty() ? stderr : stdout;
  std::fprintf(out, "vsr-run summary\n");
  std::fprintf(out, "  op          %s%s\n", args_.op_name.c_str(),
               note_.empty() ? "" : (": " + note_).c_str());
  std::fprintf(out, "  input       %s\n", input_label_.c_str());
  std::fprintf(out, "  driver      %s\n", driver_label_.c_str());
  std::fprintf(out, "  tier        %s\n",
               pool.tier.empty() ? "none (no device memory pool)" : pool.tier.c_str());
  std::string plan_text = std::string(vsr::to_string(plan_.strategy));
  if (tiled_) {
    plan_text += ", " + std::to_string(plan_.n_tiles) + " tiles of " +
                 std::to_string(plan_.tile_shape->first) + " x " +
                 std::to_string(plan_.tile_shape->second) + " (halo " + std::to_string(plan_.halo) +
                 ")";
  }
  plan_text += ", " + std::to_string(plan_.bands_per_pass) + " band(s) per pass, budget " +
               vsr_cli::format_bytes(*popts_.vram_budget) + budget_note_ + ", " +
               vsr_cli::format_bytes(plan_.estimated_vram_per_tile) + " per pass" +
               (plan_.fits_budget ? "" : " (does NOT fit the budget)");
  std::fprintf(out, "  plan        %s\n", plan_text.c_str());
  if (stream_.gdal_cache_bytes) {
    std::fprintf(out, "  gdal cache  %s (from the plan)\n",
                 vsr_cli::format_bytes(*stream_.gdal_cache_bytes).c_str());
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
  std::fprintf(out, "  output      %s\n", output_label_.c_str());
}

int run(const Arguments& args) {
  return Job(args).run();
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
