// SPDX-License-Identifier: Apache-2.0
// vsr-run's command line (options.hpp).
#include "options.hpp"

#include "cli.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace vsr_run {

const std::string_view usage_text =
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
                       calc         band math over named inputs (-i NAME=FILE), one output
                                    band per --calc expression (docs/band-math.md)
  --in-range LO,HI   rescale: the input range (values outside are clamped to it first); default:
                     the valid range, from a first streamed pass. HI,LO (reversed) maps the other
                     way round, as gdal_translate -scale HI LO: HI goes to the low output end
  --out-range LO,HI  rescale: the output range (default 0,1)
  --ot TYPE          the output's type, a numpy name (uint8 int8 uint16 int16 uint32 int32
                     uint64 int64 float32 float64), for every op that writes a raster (default:
                     the op's own: the input's for clip and fill-nodata, float32 or float64 for
                     focal-mean and normalized-difference, float32 for rescale and calc). Converted as
                     gdal_translate -ot does: to an integer type rounded half away from zero and
                     saturated to its range; to float32 as IEEE rounds. See "nodata of the
                     output" below
  --range LO,HI      clip: the bounds (required); histogram: the range (default: each band's
                     valid range, as numpy's default)
  --bins N           histogram: bin count (default 10)
  --value V          fill-nodata: the value invalid pixels get (required)
  --edge MODE        focal-mean: nearest | reflect | nodata (default nearest): what neighbours
                     outside the raster are (the edge pixel, a mirror, or nothing)
  --calc EXPR        calc: an expression, e.g. (A[4]-A[3])/(A[4]+A[3]) for NDVI; one output
                     band each, repeat for more. Compiled before any pixel is read: a bad one
                     is refused (exit 2) with its column and a caret under it
  --compute float32  calc: compute in float32 instead of float64
  --no-propagate-nodata
                     calc: invalid input pixels go through the expression as their raw values
                     (default: a pixel where any band read is invalid is the output's nodata)
  --nir N, --red N   normalized-difference: the 1-based bands A and B (default 4 and 3 with 4+
                     bands, else 2 and 1); any two different bands

input:
  -i, --input FILE   raster file read through GDAL (default: a generated sample raster)
  -i NAME=FILE       calc: an input under a name the expressions use (A[1], B, ...); repeat for
                     more. A bare -i FILE is input A. The inputs must share size, geotransform
                     and CRS; only the bands the expressions name are read
  -b N               an input band to process, 1-based; repeat for more, in order (as
                     gdal_translate -b); default: all. Bands keep their own nodata.
  --ignore-mask      read the pixels a GDAL mask marks invalid (an internal or .msk mask, an
                     alpha band, NODATA_VALUES) as they are. By default GDAL's mask flags
                     decide, as GetMaskBand and rasterio's masked reads do: where a mask
                     decides, the band's nodata is not consulted, and the masked pixels are
                     read as one value no pixel left valid takes (NaN for float types), which
                     becomes the band's nodata (and so the output's: see below)
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
                     .tif is GTiff, .png PNG, .jpg JPEG): any driver that writes files, e.g.
                     GTiff, COG, PNG, JPEG, GPKG, HFA, ENVI, EHdr, netCDF, PCIDSK, SAGA,
                     RRASTER. COG, PNG and JPEG (CreateCopy only) are written as a GeoTIFF
                     staged in the temporary directory, then converted there (it needs the
                     uncompressed raster's size of free disk meanwhile). Before any pixel is
                     read the format is tried on a small file of the output's type, band count
                     and nodata, and refused (exit 2) with the driver's reason when it cannot
                     hold them (e.g. GPKG: 1 band, or up to 4 of uint8; BMP, PNG, JPEG: uint8
                     (PNG: uint16 too); JPEG: no nodata, its compression is lossy; GSBG keeps
                     its own nodata) or writes no file (MEM)
  --co KEY=VALUE     a GDAL creation option; repeat for more. GTiff defaults: COMPRESS=DEFLATE,
                     TILED=YES, 256 x 256 blocks, INTERLEAVE=BAND, BIGTIFF=IF_SAFER; COG:
                     COMPRESS=DEFLATE, BLOCKSIZE=256, BIGTIFF=IF_SAFER, OVERVIEWS from
                     --overviews
  --overviews LEVELS auto | none | a list of factors, e.g. 2,4,8 (default: the format's own: COG
                     makes them, the others none). auto: 2, 4, 8, ... until a level fits one
                     256 x 256 tile. Inside the file for COG, GTiff and HFA, else in an .ovr
                     beside it, written and replaced with it
  --resampling NAME  how overviews are computed: nearest, average, rms, bilinear, gauss, cubic,
                     cubicspline, lanczos, mode, average_magphase (default: COG's own, else
                     nearest); needs overviews
  -a_nodata V        the output's nodata (also --a_nodata, as gdal_translate): a number of the
                     output's type (exact for 64-bit integers; nan for float types), or none for
                     no nodata (invalid pixels are then written as NaN, or 0 for integer types)
  --threads N        threads reading and compressing (default: every CPU): a tile's rows are
                     read in strips of whole blocks on that many handles at once, and GDAL
                     compresses with NUM_THREADS
  --json             stats and histogram: print JSON (full precision) instead of a table. A
                     statistic JSON has no number for is a string: "inf", "-inf" or "nan" (a
                     band holding infinities); null means the band has no valid pixel
  -q, --quiet        no summary and no progress (errors, tables and JSON still print)
  --progress         progress on stderr even when stderr is not a terminal (one line per tile)
  --diagnostics      after the run, where the time went on stderr: each step's seconds and,
                     under the step that ran them, the tiles' read, compute and write seconds

nodata of the output (raster ops): -a_nodata V sets it (-a_nodata none: none). Otherwise the
output has a nodata only when the input band has one (either band for normalized-difference), or
when it is of an integer type made from floating-point values (a float input, or the normalized
difference, NaN where A + B = 0), whose NaN pixels need a value that marks them invalid; a float
output's NaN pixels are invalid without one. That nodata is the op's when the output type holds
it (NaN for float types; rescale: a value outside --out-range), else the input's (calc: the
first input its expressions read), else the type's largest value; a value chosen only to mark a
GDAL mask's pixels goes to integer outputs only. A valid pixel that would equal the output's
nodata (e.g. 255.4 as uint8 with nodata 255, a calc result saturated to it), however it was
chosen, stops the run with an error: no valid pixel is ever written as nodata.

What the output keeps from the input: georeferencing (none if the input has none), CRS,
AREA_OR_POINT, band descriptions and colour interpretation; scale, offset and unit too for
clip, fill-nodata and focal-mean, which keep the values' meaning.

resources:
  --device WHERE     auto | gpu | cpu (default auto): where the ops run. auto: the GPU when there
                     is a real one and this build has the CUDA ops, else the CPU; gpu: the
                     device on any usable driver, or exit 1 without one (on the host driver
                     emulator: its emulated device, the host ops' work queued on its streams);
                     cpu: the host
  --budget BYTES     VRAM budget for planning, > 0, or auto (default auto: what the device has
                     free; with no GPU, a quarter of the available host memory, at most 1 GiB)
  --host-memory BYTES
                     refuse up front a run that needs more host memory than this (default: what
                     is available): a file run's pass (tile, result, GDAL's blocks and block
                     cache), the sample raster and its result, histograms and their text
  --memory-history FILE
                     record the device pool's memory history during the run and write it, with
                     the pool's segments, to FILE as PyTorch's memory snapshot pickle (open it
                     in pytorch.org/memory_viz; docs/memory-pool.md), also when the run fails;
                     FILE follows --output's rules, checked before the run: an existing FILE is
                     refused unless --overwrite, and FILE is never an input or the output

A file run streams: tiles of at most 64 MiB of input over every band when the budget allows and
the file makes two or more, tile k+1 read while tile k is computed and tile k-1 written (the
summary's "stages" line, with the host memory that needs; stages one after another when it does
not fit --host-memory).

sample (no --input):
  --sample-size N    sample raster side in pixels (default 2048)
  --bands N          sample raster band count (default 4)

  -h, --help         print this help

pipeline: vsr-run pipeline read A=a.tif [B=b.tif ...] ! STEP [options] ! ... ! write FILE
          [output options] [--dry-run]
  a chain of steps, each tile read once and written once: calc (--calc, --ot, --compute,
  --no-propagate-nodata; X is the previous step's output), focal-mean (--edge), rescale
  (--in-range required, --out-range, --ot), clip (--range), fill-nodata (--value), each with the
  matching op's options and output rule; write takes the output options above and --budget,
  --device, -q, --progress, --diagnostics. The steps' halos are summed. --dry-run prints the plan (tiles, halo,
  steps) from the inputs' headers, reading no pixel and writing nothing.
  Instead of write FILE, a last step stats [--json] [-o FILE.json] or histogram --range LO,HI
  [--bins N] [--json] [-o FILE.json] prints the chain's output as those ops print it, writing
  no raster

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
using vsr_cli::UsageError;

namespace {

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

/// -a_nodata's value: "none", or a number held exactly (every 64-bit integer; "nan", "inf").
std::optional<vsr::NodataValue> parse_nodata(std::string_view option, std::string_view text) {
  if (text == "none" || text == "None" || text == "NONE") return std::nullopt;
  const char* first = text.data();
  const char* last = text.data() + text.size();
  const bool integer = !text.empty() &&
                       std::all_of(text.begin() + (text.front() == '-' ? 1 : 0), text.end(),
                                   [](char c) { return c >= '0' && c <= '9'; }) &&
                       text != "-";
  if (integer) {
    if (text.front() == '-') {
      std::int64_t v = 0;
      const auto [end, err] = std::from_chars(first, last, v);
      if (err == std::errc() && end == last) return vsr::NodataValue::from_int64(v);
    } else {
      std::uint64_t v = 0;
      const auto [end, err] = std::from_chars(first, last, v);
      if (err == std::errc() && end == last) return vsr::NodataValue::from_uint64(v);
    }
    throw UsageError(std::string(option) + ": '" + std::string(text) +
                     "' is out of range (no dtype holds it)");
  }
  double v = 0;
  const auto [end, err] = std::from_chars(first, last, v);
  if (err != std::errc() || end != last) {
    throw UsageError(std::string(option) + ": '" + std::string(text) + "' is not a number or none");
  }
  return vsr::NodataValue(v);
}

bool is_identifier(std::string_view s) {
  if (s.empty() || (s.front() >= '0' && s.front() <= '9')) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
}

/// calc's inputs from every -i: NAME=FILE (NAME an identifier), or a bare FILE for input A.
void parse_calc_inputs(Arguments& args) {
  if (args.calc.empty()) throw UsageError("--op calc needs --calc EXPR (one per output band)");
  if (args.inputs.empty()) throw UsageError("--op calc needs -i NAME=FILE (or -i FILE, input A)");
  for (const std::string& text : args.inputs) {
    const std::size_t eq = text.find('=');
    std::string name = "A", path = text;
    if (eq != std::string::npos && is_identifier(std::string_view(text).substr(0, eq))) {
      name = text.substr(0, eq);
      path = text.substr(eq + 1);
    }
    if (path.empty()) throw UsageError("-i " + text + ": no file after '='");
    for (const auto& [other, file] : args.calc_inputs) {
      if (other == name) {
        throw UsageError("-i: input " + name + " is given twice ('" + file + "' and '" + path +
                         "'); name each input: -i A=a.tif -i B=b.tif");
      }
    }
    args.calc_inputs.emplace_back(name, path);
  }
  args.input = args.calc_inputs.front().second;
}

}  // namespace

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
      } else if (name == "calc") {
        args.op = Op::calc;
      } else {
        throw UsageError("--op: unknown op '" + std::string(name) +
                         "' (stats, histogram, rescale, clip, fill-nodata, focal-mean, "
                         "normalized-difference or ndvi, calc)");
      }
      args.op_name = name;
    } else if (words.is("-i", "--input")) {
      args.input = words.value();
      args.inputs.push_back(args.input);
    } else if (words.is("--calc")) {
      const std::string_view expr = words.value();
      args.calc.emplace_back(expr);
      given.emplace_back(option);
    } else if (words.is("--compute")) {
      const std::string_view what = words.value();
      if (what == "float32") {
        args.compute_float32 = true;
      } else if (what == "float64") {
        args.compute_float32 = false;
      } else {
        throw UsageError("--compute: '" + std::string(what) + "' is not float32 or float64");
      }
      given.emplace_back(option);
    } else if (words.is("--no-propagate-nodata")) {
      words.flag();
      args.propagate_nodata = false;
      given.emplace_back(option);
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
    } else if (words.is("--overviews")) {
      args.overviews = words.value();
    } else if (words.is("--resampling")) {
      args.resampling = words.value();
    } else if (words.is("-a_nodata", "--a_nodata")) {
      args.a_nodata_text = words.value();
      args.a_nodata = parse_nodata(option, args.a_nodata_text);
      given.emplace_back("-a_nodata");
    } else if (words.is("--ignore-mask")) {
      words.flag();
      args.ignore_mask = true;
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
    } else if (words.is("--diagnostics")) {
      words.flag();
      args.diagnostics = true;
    } else if (words.is("--memory-history")) {
      args.memory_history = words.value();
      if (args.memory_history.empty()) throw UsageError("--memory-history needs a file name");
    } else if (words.is("--host-memory")) {
      args.host_memory = parse_size(option, words.value());
      if (*args.host_memory == 0) throw UsageError("--host-memory must be > 0");
    } else if (words.is("--device")) {
      const std::string_view where = words.value();
      try {
        args.device = vsr::placement_from_string(where);
      } catch (const std::invalid_argument&) {
        throw UsageError("--device: '" + std::string(where) + "' is not auto, gpu or cpu");
      }
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
    if (option == "-a_nodata") return args.raster_output();
    if (option == "--calc" || option == "--compute" || option == "--no-propagate-nodata") {
      return args.op == Op::calc;
    }
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
  if (args.in_range && !(args.in_range->lo != args.in_range->hi)) {
    throw UsageError("--in-range: LO and HI must differ (HI,LO maps the other way round)");
  }
  if (args.out_range && !(args.out_range->lo != args.out_range->hi)) {
    throw UsageError("--out-range: LO and HI must differ");
  }
  if (args.nir && args.red && *args.nir == *args.red) {
    throw UsageError("--nir and --red are the same band (" + std::to_string(*args.nir) +
                     "): the normalized difference of a band with itself is 0 everywhere");
  }
  if (args.op == Op::calc) parse_calc_inputs(args);
  if (!args.bands.empty() && args.op == Op::calc) {
    throw UsageError("-b: calc reads the bands its expressions name (A[2], ...)");
  }
  if (!args.bands.empty() && args.input.empty()) {
    throw UsageError("-b selects bands of an --input file");
  }
  if (!args.bands.empty() && args.op == Op::normalized_difference) {
    throw UsageError("-b: normalized-difference takes its two bands from --nir and --red");
  }
  if (!args.output.empty() && !args.raster_output() &&
      (!args.format.empty() || !args.creation_options.empty() || !args.overviews.empty() ||
       !args.resampling.empty())) {
    throw UsageError("-of / --co / --overviews / --resampling: --op " + args.op_name +
                     " writes JSON, not a raster");
  }
  if ((!args.overviews.empty() || !args.resampling.empty()) &&
      (args.output.empty() || !args.raster_output())) {
    throw UsageError(std::string(args.overviews.empty() ? "--resampling" : "--overviews") +
                     " applies to a raster --output");
  }
  return args;
}

namespace {

/// One segment of a pipeline parsed as `vsr-run --op OP WORDS...` (plus @p extra first).
Arguments parse_as_op(const std::string& op, const std::vector<std::string>& extra,
                      const std::vector<std::string>& words) {
  std::vector<std::string> all = {"vsr-run", "--op", op};
  all.insert(all.end(), extra.begin(), extra.end());
  all.insert(all.end(), words.begin(), words.end());
  std::vector<char*> argv;
  for (std::string& w : all) argv.push_back(w.data());
  return parse_arguments(static_cast<int>(argv.size()), argv.data());
}

}  // namespace

Arguments parse_pipeline(int argc, char** argv) {
  std::vector<std::vector<std::string>> segments(1);
  for (int i = 1; i < argc; ++i) {
    const std::string_view w = argv[i];
    if (w == "!") {
      segments.emplace_back();
    } else {
      segments.back().emplace_back(w);
    }
  }
  if (segments.size() == 1 && !segments[0].empty() &&
      (segments[0][0] == "-h" || segments[0][0] == "--help")) {
    Arguments help;
    help.help = true;
    return help;
  }
  const auto usage = [](const std::string& what) {
    return UsageError("pipeline: " + what +
                      " (vsr-run pipeline read A=a.tif ! STEP [options] ! ... ! write FILE "
                      "[output options])");
  };
  if (segments.front().empty() || segments.front().front() != "read") {
    throw usage("the first step must be read");
  }
  if (segments.size() < 2 || segments.back().empty() ||
      (segments.back().front() != "write" && segments.back().front() != "stats" &&
       segments.back().front() != "histogram")) {
    throw usage("the last step must be write FILE, stats or histogram");
  }
  // read NAME=FILE ...: the inputs, as calc's -i.
  std::vector<std::string> inputs;
  for (std::size_t k = 1; k < segments.front().size(); ++k) {
    const std::string& word = segments.front()[k];
    if (word.starts_with("-")) {
      throw usage("read takes only NAME=FILE (or FILE, input A), not '" + word +
                  "': the run's options go after write FILE");
    }
    inputs.push_back("-i");
    inputs.push_back(word);
  }
  if (inputs.empty()) throw usage("read needs NAME=FILE (or FILE, input A)");
  // write FILE [output options]: the run's own options.
  std::vector<std::string> write;
  bool dry_run = false;
  for (std::size_t k = 1; k < segments.back().size(); ++k) {
    if (segments.back()[k] == "--dry-run") {
      dry_run = true;
    } else {
      write.push_back(segments.back()[k]);
    }
  }
  const std::string last = segments.back().front();
  Arguments args;
  if (last == "write") {
    if (write.empty() || write.front().starts_with("-")) throw usage("write needs FILE first");
    write.insert(write.begin(), "-o");
    // Parsed as a raster op's output options; the op's own options do not apply to write.
    args = parse_as_op("fill-nodata", {"--value", "0"}, write);
    if (args.ot || args.a_nodata || args.edge_given || args.range || args.in_range ||
        args.out_range || args.nir || args.red || args.bins_given || args.value != 0.0 ||
        !args.bands.empty() || args.inputs.size() != 0) {
      throw usage(
          "write takes FILE and output options (-of, --co, --overwrite, --overviews, "
          "--resampling, --threads) and the run's (--budget, --device, -q, --progress, "
          "--diagnostics, --memory-history, --dry-run); a step's options go after the step's "
          "name");
    }
  } else {
    // A terminal stats or histogram: its own options (--json, -o FILE for the JSON, --bins,
    // --range) and the run's.
    try {
      args = parse_as_op(last, {}, write);
    } catch (const UsageError& e) {
      throw UsageError("pipeline step " + last + ": " + e.what());
    }
    if (!args.bands.empty() || !args.inputs.empty()) {
      throw usage(last + ": the inputs are read's (-i and -b do not apply to a step)");
    }
    if (last == "histogram" && !args.range) {
      throw usage("histogram needs --range LO,HI in a pipeline (no first pass finds the range)");
    }
    args.terminal = last == "stats" ? Op::stats : Op::histogram;
  }
  args.op = Op::pipeline;
  args.op_name = "pipeline";
  args.value.reset();
  args.dry_run = dry_run;
  args.inputs.clear();
  {
    Arguments named = parse_as_op("calc", inputs, {"--calc", "1"});
    args.calc_inputs = named.calc_inputs;
    args.input = named.input;
  }
  for (std::size_t s = 1; s + 1 < segments.size(); ++s) {
    const std::vector<std::string>& seg = segments[s];
    if (seg.empty()) throw usage("step " + std::to_string(s) + " is empty");
    const std::string& name = seg.front();
    const std::vector<std::string> words(seg.begin() + 1, seg.end());
    if (name != "calc" && name != "focal-mean" && name != "rescale" && name != "clip" &&
        name != "fill-nodata") {
      throw usage("unknown step '" + name +
                  "' (calc, focal-mean, rescale, clip, fill-nodata; read first, write last)");
    }
    Arguments step;
    try {
      step = parse_as_op(name, name == "calc" ? inputs : std::vector<std::string>{}, words);
    } catch (const UsageError& e) {
      throw UsageError("pipeline step " + std::to_string(s) + " (" + name + "): " + e.what());
    }
    const auto refuse = [&](const std::string& what) {
      throw UsageError("pipeline step " + std::to_string(s) + " (" + name + "): " + what);
    };
    if (!step.output.empty() || !step.format.empty() || !step.creation_options.empty() ||
        !step.overviews.empty() || !step.resampling.empty() || step.overwrite) {
      refuse("output options go after write FILE");
    }
    if ((name != "calc" && !step.inputs.empty()) || !step.bands.empty()) {
      refuse("the inputs are read's (-i and -b do not apply to a step)");
    }
    if (name == "rescale" && !step.in_range) {
      refuse("rescale needs --in-range LO,HI in a pipeline (no first pass finds the range)");
    }
    step.op_name = name;
    args.steps.push_back(std::make_shared<const Arguments>(std::move(step)));
  }
  if (args.steps.empty()) throw usage("no step between read and write");
  return args;
}

std::vector<vsr::KeptFile> files_read(const Arguments& args) {
  std::vector<vsr::KeptFile> kept;
  for (const auto& [name, path] : args.calc_inputs) kept.push_back({"input " + name, path});
  if (args.calc_inputs.empty() && !args.input.empty()) kept.push_back({"the input", args.input});
  return kept;
}

std::vector<vsr::KeptFile> files_of_the_run(const Arguments& args) {
  std::vector<vsr::KeptFile> kept = files_read(args);
  if (!args.output.empty()) kept.push_back({"the output", args.output});
  return kept;
}

void check_target(const std::string& option, const std::string& path, bool overwrite,
                  const std::vector<vsr::KeptFile>& kept) {
  try {
    vsr::check_output_path(path, overwrite, kept);
  } catch (const std::invalid_argument& e) {
    throw UsageError(option + ": " + e.what());
  } catch (const std::system_error& e) {
    const int err = e.code().value();
    if (e.code().category() != std::generic_category()) throw;
    if (err == EEXIST) {
      throw UsageError(option + ": '" + path +
                       "' exists; add --overwrite to replace it (it is replaced only once the "
                       "new file is complete)");
    }
    // The path the command line gave names no place to write: a missing or read-only directory.
    if (err == ENOENT || err == ENOTDIR || err == EACCES || err == EPERM || err == EROFS ||
        err == ENAMETOOLONG || err == ELOOP || err == EISDIR) {
      throw UsageError(option + ": " + e.what());
    }
    throw;
  }
}

}  // namespace vsr_run
