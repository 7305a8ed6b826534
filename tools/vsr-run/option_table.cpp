// SPDX-License-Identifier: Apache-2.0
// Every option of vsr-run (options.hpp): its names, value, group, help and what it sets. Which
// step takes which of the steps' own options is the step table's (steps.hpp).
#include "cli.hpp"
#include "options.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>

namespace vsr_run {

using vsr_cli::ArgScanner;
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

using G = OptionGroup;

#define VSR_SET [](Arguments & a, ArgScanner & w, [[maybe_unused]] std::string_view o)

}  // namespace

const std::vector<OptionSpec>& option_table() {
  static const std::vector<OptionSpec> table = {
      // The steps' own options (which step takes which: the step table).
      {"--in-range", "", "LO,HI", G::step,
       "rescale: the input range (values outside are clamped to it first); default: the valid "
       "range, from a first streamed pass. HI,LO (reversed) maps the other way round, as "
       "gdal_translate -scale HI LO: HI goes to the low output end",
       VSR_SET{a.in_range = parse_range(o, w.value());
}
}  // namespace vsr_run
, {"--out-range", "", "LO,HI", G::step, "rescale: the output range (default 0,1)",
   VSR_SET{a.out_range = parse_range(o, w.value());
}
}
, {"--ot", "", "TYPE", G::step,
   "the output's type, a numpy name (uint8 int8 uint16 int16 uint32 int32 uint64 int64 "
   "float32 float64), for every step that writes a raster (default: the step's own: the "
   "input's for clip and fill-nodata, float32 or float64 for focal-mean and "
   "normalized-difference, float32 for rescale and calc). Converted as gdal_translate -ot "
   "does: to an integer type rounded half away from zero and saturated to its range; to "
   "float32 as IEEE rounds. See \"nodata of the output\" below",
   VSR_SET{const std::string_view name = w.value();
a.ot = vsr::dtype_from_string(name);
if (!a.ot) {
  throw UsageError("--ot: unknown type '" + std::string(name) +
                   "' (uint8 int8 uint16 int16 uint32 int32 uint64 int64 float32 "
                   "float64)");
}
}
}
, {"--range", "", "LO,HI", G::step,
   "clip: the bounds (required); histogram: the range (default: each band's valid range, "
   "as numpy's default)",
   VSR_SET{a.range = parse_range(o, w.value());
}
}
, {"--bins", "", "N", G::step, "histogram: bin count (default 10)",
   VSR_SET{a.bins = parse_integer<int>(o, w.value());
if (a.bins < 1 || a.bins > 1000000) throw UsageError("--bins must be in [1, 1000000]");
a.bins_given = true;
}
}
, {"--value", "", "V", G::step, "fill-nodata: the value invalid pixels get (required)",
   VSR_SET{a.value = parse_double(o, w.value());
}
}
, {"--edge", "", "MODE", G::step,
   "focal-mean: nearest | reflect | nodata (default nearest): what neighbours outside the "
   "raster are (the edge pixel, a mirror, or nothing)",
   VSR_SET{const std::string_view mode = w.value();
if (mode == "nearest") {
  a.edge = vsr::EdgeMode::nearest;
} else if (mode == "reflect") {
  a.edge = vsr::EdgeMode::reflect;
} else if (mode == "nodata") {
  a.edge = vsr::EdgeMode::constant_nodata;
} else {
  throw UsageError("--edge: unknown mode '" + std::string(mode) + "' (nearest, reflect or nodata)");
}
a.edge_given = true;
}
}
, {"--calc", "", "EXPR", G::step,
   "calc: an expression, e.g. (A[4]-A[3])/(A[4]+A[3]) for NDVI; one output band each, "
   "repeat for more. Compiled before any pixel is read: a bad one is refused (exit 2) with "
   "its column and a caret under it",
   VSR_SET{a.calc.emplace_back(w.value());
}
}
, {"--compute", "", "float32", G::step, "calc: compute in float32 instead of float64",
   VSR_SET{const std::string_view what = w.value();
if (what == "float32") {
  a.compute_float32 = true;
} else if (what == "float64") {
  a.compute_float32 = false;
} else {
  throw UsageError("--compute: '" + std::string(what) + "' is not float32 or float64");
}
}
}
, {"--no-propagate-nodata", "", "", G::step,
   "calc: invalid input pixels go through the expression as their raw values (default: a "
   "pixel where any band read is invalid is the output's nodata)",
   VSR_SET{w.flag();
a.propagate_nodata = false;
}
}
, {"--nir", "", "N", G::step,
   "normalized-difference: the 1-based band A (default 4 with 4+ bands, else 2); any two "
   "different bands",
   VSR_SET{a.nir = parse_integer<int>(o, w.value());
}
}
, {"--red", "", "N", G::step,
   "normalized-difference: the 1-based band B (default 3 with 4+ bands, else 1)",
   VSR_SET{a.red = parse_integer<int>(o, w.value());
}
}
, {"-a_nodata", "--a_nodata", "V", G::step,
   "the output's nodata (as gdal_translate): a number of the output's type (exact for "
   "64-bit integers; nan for float types), or none for no nodata (invalid pixels are then "
   "written as NaN, or 0 for integer types)",
   VSR_SET{a.a_nodata_text = w.value();
a.a_nodata = parse_nodata(o, a.a_nodata_text);
}
}
, {"--json", "", "", G::step,
   "stats, histogram and zonal-stats: print JSON (full precision) instead of a table. A statistic "
   "JSON "
   "has no number for is a string: \"inf\", \"-inf\" or \"nan\" (a band holding "
   "infinities); null means the band has no valid pixel",
   VSR_SET{w.flag();
a.json = true;
}
}
, {"--dry-run", "", "", G::step,
   "warp, zonal-stats: print the plan (the output grid, and each output tile's source window) and "
   "read "
   "no pixel, write nothing",
   VSR_SET{w.flag();
a.dry_run = true;
}
}
, {"--zones", "", "FILE", G::step,
   "zonal-stats: the zones (required): a vector file's polygons (GeoPackage, GeoJSON, "
   "Shapefile; transformed to the raster's CRS) or an integer zone raster on the raster's grid",
   VSR_SET{a.zones = w.value();
}
}
, {"--layer", "", "NAME", G::step, "zonal-stats: the vector file's layer (default: the first)",
   VSR_SET{a.zone_layer = w.value();
}
}
, {"--zone-field", "", "NAME", G::step,
   "zonal-stats: the attribute naming each zone (default: the feature ids)",
   VSR_SET{a.zone_field = w.value();
}
}
, {"--pixels", "", "RULE", G::step,
   "zonal-stats: fractional (default: each pixel weighted by the share of it inside, as "
   "exactextract), center (pixels whose centre is inside) or all-touched",
   VSR_SET{try {a.pixels = vsr::pixel_rule_from_string(w.value());
}
catch (const std::invalid_argument& e) {
  throw UsageError(std::string(o) + ": " + e.what());
}
}
}
, {"--weights", "", "FILE", G::step,
   "zonal-stats: a one-band raster on the raster's grid for weighted_mean and weighted_sum",
   VSR_SET{a.weights = w.value();
}
}
, {"--stats", "", "LIST", G::step,
   "zonal-stats: the statistics, comma-separated (default count,sum,mean,min,max): count, sum, "
   "mean, min, max, stdev, variance, median, quantile, majority, minority, variety, frac, "
   "weighted_mean, weighted_sum, cell_count",
   VSR_SET{try {a.zonal_stats = vsr::parse_zonal_stats(w.value());
}
catch (const std::invalid_argument& e) {
  throw UsageError(std::string(o) + ": " + e.what());
}
}
}
, {"--t_srs", "-t_srs", "SRS", G::step,
   "warp: the output's CRS (required), as gdalwarp -t_srs takes it (EPSG:4326, a PROJ "
   "string, WKT, ...)",
   VSR_SET{a.warp.dst_crs = w.value();
}
}
, {"--s_srs", "-s_srs", "SRS", G::step,
   "warp: the input's CRS, in place of the file's own (gdalwarp -s_srs)",
   VSR_SET{a.warp.src_crs = w.value();
}
}
, {"--tr", "-tr", "XRES YRES", G::step,
   "warp: the output's pixel size in its CRS's units, both > 0 (gdalwarp -tr)",
   VSR_SET{const auto v = w.values(2);
a.warp.resolution = {parse_double(o, v[0]), parse_double(o, v[1])};
for (const double r : *a.warp.resolution) {
  if (!(r > 0) || !std::isfinite(r)) {
    throw UsageError(std::string(o) + ": the resolutions must be finite and > 0");
  }
}
}
}
, {"--te", "-te", "XMIN YMIN XMAX YMAX", G::step,
   "warp: the output's extent in its CRS (gdalwarp -te); XMIN < XMAX, YMIN < YMAX",
   VSR_SET{const auto v = w.values(4);
std::array<double, 4> e{};
for (std::size_t k = 0; k < 4; ++k) {
  e[k] = parse_double(o, v[k]);
  if (!std::isfinite(e[k])) throw UsageError(std::string(o) + ": the bounds must be finite");
}
if (!(e[0] < e[2]) || !(e[1] < e[3])) {
  throw UsageError(std::string(o) + ": XMIN must be below XMAX and YMIN below YMAX");
}
a.warp.extent = e;
}
}
, {"--ts", "-ts", "WIDTH HEIGHT", G::step,
   "warp: the output's size in pixels (gdalwarp -ts; 0 for one: from the other and the "
   "extent's aspect); not with --tr",
   VSR_SET{const auto v = w.values(2);
const auto width = parse_integer<std::int64_t>(o, v[0]);
const auto height = parse_integer<std::int64_t>(o, v[1]);
if (width < 0 || height < 0 || (width == 0 && height == 0)) {
  throw UsageError(std::string(o) + ": the sizes must be >= 0 and not both 0");
}
a.warp.size = {width, height};
}
}
, {"-r", "--r", "METHOD", G::step,
   "warp: the resampling method, gdalwarp's names: near (default), bilinear, cubic, "
   "cubicspline, lanczos, average, mode, max, min, med, q1, q3, rms",
   VSR_SET{a.warp_method = w.value();
try {
  a.warp.method = vsr::warp_method_from_string(a.warp_method);
} catch (const std::invalid_argument& e) {
  throw UsageError(std::string(o) + ": " + e.what());
}
}
}
, {"--et", "-et", "E", G::step,
   "warp: the transform's error threshold in input pixels (gdalwarp -et; default 0.125; 0 "
   "transforms every pixel exactly)",
   VSR_SET{a.warp.error_threshold = parse_double(o, w.value());
if (!(a.warp.error_threshold >= 0) || !std::isfinite(a.warp.error_threshold)) {
  throw UsageError(std::string(o) + ": must be a finite number >= 0");
}
}
}
, {"--srcnodata", "-srcnodata", "V", G::step,
   "warp: the input's nodata for every band, in place of the file's (gdalwarp -srcnodata); "
   "None: the file's nodata is ignored",
   VSR_SET{const std::optional<vsr::NodataValue> v = parse_nodata(o, w.value());
a.warp.src_nodata = v;
a.warp.src_nodata_none = !v.has_value();
}
}
, {"--dstnodata", "-dstnodata", "V", G::step,
   "warp: the output's nodata (gdalwarp -dstnodata; default: the input's); None: the output "
   "has none (pixels no input pixel reaches are 0)",
   VSR_SET{const std::optional<vsr::NodataValue> v = parse_nodata(o, w.value());
a.warp.dst_nodata = v;
a.warp.dst_nodata_none = !v.has_value();
}
}
,
    // Input.
    {"-i", "--input", "FILE", G::input,
     "raster file read through GDAL (default: a generated sample raster). calc: -i NAME=FILE, "
     "an input under a name the expressions use (A[1], B, ...); repeat for more; a bare FILE "
     "is input A. The inputs must share size, geotransform and CRS; only the bands the "
     "expressions name are read",
     VSR_SET{a.input = w.value();
a.inputs.push_back(a.input);
}
}
, {"-b", "", "N", G::input,
   "an input band to process, 1-based; repeat for more, in order (as gdal_translate -b); "
   "default: all. Bands keep their own nodata",
   VSR_SET{const int b = parse_integer<int>(o, w.value());
if (b < 1) throw UsageError("-b: band numbers start at 1 (got " + std::to_string(b) + ")");
a.bands.push_back(b);
}
}
, {"--ignore-mask", "", "", G::read,
   "read the pixels a GDAL mask marks invalid (an internal or .msk mask, an alpha band, "
   "NODATA_VALUES) as they are. By default GDAL's mask flags decide, as GetMaskBand and "
   "rasterio's masked reads do: where a mask decides, the band's nodata is not consulted, "
   "and the masked pixels are read as one value no pixel left valid takes (NaN for float "
   "types), which becomes the band's nodata (and so the output's: see below)",
   VSR_SET{w.flag();
a.ignore_mask = true;
}
}
, {"--allow-virtual", "", "", G::read,
   "also open VRT files, GDAL virtual file systems (/vsi...) and URLs as input; refused by "
   "default, since a VRT reads whatever files its XML names (only raster file formats open "
   "an input otherwise: GTiff/COG, PNG, JPEG, ...)",
   VSR_SET{w.flag();
a.allow_virtual = true;
}
}
,
    // Output.
    {"-o", "--output", "FILE", G::output,
     "write the result there. Rasters: a new file, all or nothing (written in a hidden "
     "temporary directory beside it, checked, then renamed into place: an error or a signal "
     "leaves FILE as it was; a run killed with SIGKILL leaves the temporary, which the next "
     "run writing FILE removes). stats and histogram: their JSON. FILE must be a regular file "
     "or new (never a FIFO or a device such as /dev/null)",
     VSR_SET{a.output = w.value();
}
}
, {"--overwrite", "", "", G::output,
   "replace an existing --output (refused without it); needed to write over the input "
   "itself",
   VSR_SET{w.flag();
a.overwrite = true;
}
}
, {"-of", "", "FORMAT", G::output,
   "GDAL raster driver of the output, any case (default: from the extension, .tif is GTiff, "
   ".png PNG, .jpg JPEG): any driver that writes files, e.g. GTiff, COG, PNG, JPEG, GPKG, "
   "HFA, ENVI, EHdr, netCDF, PCIDSK, SAGA, RRASTER. COG, PNG and JPEG (CreateCopy only) are "
   "written as a GeoTIFF staged in the temporary directory, then converted there (it needs "
   "the uncompressed raster's size of free disk meanwhile). Before any pixel is read the "
   "format is tried on a small file of the output's type, band count and nodata, and "
   "refused (exit 2) with the driver's reason when it cannot hold them (e.g. GPKG: 1 band, "
   "or up to 4 of uint8; BMP, PNG, JPEG: uint8 (PNG: uint16 too); JPEG: no nodata, its "
   "compression is lossy; GSBG keeps its own nodata) or writes no file (MEM)",
   VSR_SET{a.format = w.value();
}
}
, {"--co", "", "KEY=VALUE", G::output,
   "a GDAL creation option; repeat for more. GTiff defaults: COMPRESS=DEFLATE, TILED=YES, "
   "256 x 256 blocks, INTERLEAVE=BAND, BIGTIFF=IF_SAFER; COG: COMPRESS=DEFLATE, "
   "BLOCKSIZE=256, BIGTIFF=IF_SAFER, OVERVIEWS from --overviews",
   VSR_SET{const std::string_view kv = w.value();
if (kv.find('=') == std::string_view::npos || kv.front() == '=') {
  throw UsageError("--co: '" + std::string(kv) + "' is not KEY=VALUE");
}
a.creation_options.emplace_back(kv);
}
}
, {"--overviews", "", "LEVELS", G::output,
   "auto | none | a list of factors, e.g. 2,4,8 (default: the format's own: COG makes them, "
   "the others none). auto: 2, 4, 8, ... until a level fits one 256 x 256 tile. Inside the "
   "file for COG, GTiff and HFA, else in an .ovr beside it, written and replaced with it",
   VSR_SET{a.overviews = w.value();
}
}
, {"--resampling", "", "NAME", G::output,
   "how overviews are computed: nearest, average, rms, bilinear, gauss, cubic, "
   "cubicspline, lanczos, mode, average_magphase (default: COG's own, else nearest); needs "
   "overviews",
   VSR_SET{a.resampling = w.value();
}
}
,
    // The run.
    {"--device", "", "WHERE", G::run,
     "auto | gpu | cpu (default auto): where the ops run. auto: the GPU when there is a real "
     "one and this build has the CUDA ops, else the CPU; gpu: the device on any usable "
     "driver, or exit 1 without one (on the host driver emulator: its emulated device, the "
     "host ops' work queued on its streams); cpu: the host",
     VSR_SET{const std::string_view where = w.value();
try {
  a.device = vsr::placement_from_string(where);
} catch (const std::invalid_argument&) {
  throw UsageError("--device: '" + std::string(where) + "' is not auto, gpu or cpu");
}
}
}
, {"--budget", "", "BYTES", G::run,
   "VRAM budget for planning, > 0, or auto (default auto: what the device has free; with no "
   "GPU, a quarter of the available host memory, at most 1 GiB)",
   VSR_SET{const std::string_view text = w.value();
if (text == "auto") {
  a.budget.reset();
} else {
  a.budget = vsr_cli::parse_budget(o, text);
}
}
}
, {"--host-memory", "", "BYTES", G::run,
   "refuse up front a run that needs more host memory than this (default: what is "
   "available): a file run's pass (tile, result, GDAL's blocks and block cache), the sample "
   "raster and its result, histograms and their text",
   VSR_SET{a.host_memory = parse_size(o, w.value());
if (*a.host_memory == 0) throw UsageError("--host-memory must be > 0");
}
}
, {"--threads", "", "N", G::run,
   "threads reading and compressing (default: every CPU): a tile's rows are read in strips "
   "of whole blocks on that many handles at once, and GDAL compresses with NUM_THREADS",
   VSR_SET{a.threads = parse_integer<int>(o, w.value());
if (a.threads < 1) throw UsageError("--threads must be >= 1");
}
}
, {"--memory-history", "", "FILE", G::run,
   "record the device pool's memory history during the run and write it, with the pool's "
   "segments, to FILE as PyTorch's memory snapshot pickle (open it in "
   "pytorch.org/memory_viz; docs/memory-pool.md), also when the run fails; FILE follows "
   "--output's rules, checked before the run: an existing FILE is refused unless "
   "--overwrite, and FILE is never an input or the output",
   VSR_SET{a.memory_history = w.value();
if (a.memory_history.empty()) throw UsageError("--memory-history needs a file name");
}
}
, {"-q", "--quiet", "", G::run, "no summary and no progress (errors, tables and JSON still print)",
   VSR_SET{w.flag();
a.quiet = true;
}
}
, {"--progress", "", "", G::run,
   "progress on stderr even when stderr is not a terminal (one line per tile)", VSR_SET{w.flag();
a.progress = true;
}
}
, {"--diagnostics", "", "", G::run,
   "after the run, where the time went on stderr: each step's seconds and, under the step "
   "that ran them, the tiles' read, compute and write seconds",
   VSR_SET{w.flag();
a.diagnostics = true;
}
}
,
    // The sample.
    {"--sample-size", "", "N", G::sample, "sample raster side in pixels (default 2048)",
     VSR_SET{a.sample_size = parse_integer<std::int64_t>(o, w.value());
if (a.sample_size < 1 || a.sample_size > 65536) {
  throw UsageError("--sample-size must be in [1, 65536]");
}
}
}
, {"--bands", "", "N", G::sample, "sample raster band count (default 4)",
   VSR_SET{a.sample_bands = parse_integer<int>(o, w.value());
if (a.sample_bands < 1 || a.sample_bands > 256) {
  throw UsageError("--bands must be in [1, 256]");
}
}
}
,
}
;
return table;
}

#undef VSR_SET

const OptionSpec* find_option(std::string_view name) {
  for (const OptionSpec& o : option_table()) {
    if (o.name == name || (!o.alias.empty() && o.alias == name)) return &o;
  }
  return nullptr;
}

}  // namespace vsr_run
