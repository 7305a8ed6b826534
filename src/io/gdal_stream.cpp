// SPDX-License-Identifier: Apache-2.0
// The tile executor's file ends (RasterFileSource, RasterFileSink) and the streamed runs that
// are pairs of them: process_raster_file (file to file), for_each_raster_tile (file to a
// visitor), process_raster_streamed (io.hpp).
#include "common/byte_text.hpp"
#include "common/checked_math.hpp"
#include "common/expects.hpp"
#include "common/text_escape.hpp"
#include "files/output_file.hpp"
#include "io/gdal_common.hpp"

#include <vibespatial/raster/io.hpp>
#include <vibespatial/raster/tiles.hpp>

#include <cpl_conv.h>
#include <cpl_error.h>
#include <gdal.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace vibespatial::raster {

using namespace detail::gdal;

namespace {

bool pixel_interleaved(GDALDatasetH ds) {
  const char* interleave = GDALGetMetadataItem(ds, "INTERLEAVE", "IMAGE_STRUCTURE");
  return interleave != nullptr && std::strcmp(interleave, "PIXEL") == 0;
}

/// Bytes of one GDAL block of @p ds holding one band's data: the block of band 1, times the band
/// count when the file interleaves pixels (a block then carries every band).
std::uint64_t dataset_block_bytes(GDALDatasetH ds) {
  GDALRasterBandH band = GDALGetRasterBand(ds, 1);
  int bx = 0, by = 0;
  GDALGetBlockSize(band, &bx, &by);
  std::uint64_t bytes =
      static_cast<std::uint64_t>(std::max(bx, 1)) * static_cast<std::uint64_t>(std::max(by, 1)) *
      static_cast<std::uint64_t>(GDALGetDataTypeSizeBytes(GDALGetRasterDataType(band)));
  if (pixel_interleaved(ds)) {
    bytes = detail::checked_mul(bytes, static_cast<std::uint64_t>(GDALGetRasterCount(ds)),
                                "block byte count");
  }
  return bytes;
}

constexpr std::uint64_t cache_headroom = 64ULL << 20;

std::uint64_t cache_for(GDALDatasetH ds, std::int64_t width, std::int64_t tile_height, int halo,
                        int pass_bands) {
  GDALRasterBandH band = GDALGetRasterBand(ds, 1);
  int bx = 0, by = 0;
  GDALGetBlockSize(band, &bx, &by);
  const std::uint64_t block = dataset_block_bytes(ds);
  // The blocks under one row of tiles (halo included) of the bands of one pass, so that a block
  // shared by neighbouring tiles is decoded once.
  const std::uint64_t block_rows =
      static_cast<std::uint64_t>((tile_height + 2 * halo + by - 1) / std::max(by, 1) + 1);
  const std::uint64_t blocks_across =
      static_cast<std::uint64_t>((width + bx - 1) / std::max(bx, 1));
  const std::uint64_t row = detail::checked_mul(
      detail::checked_mul(block_rows, blocks_across, "cache size"),
      pixel_interleaved(ds)
          ? block
          : detail::checked_mul(block, static_cast<std::uint64_t>(pass_bands), "cache"),
      "cache size");
  const std::uint64_t floor = detail::checked_mul(block, 2, "cache size");
  return std::clamp(row, floor, detail::checked_add(floor, cache_headroom, "cache size"));
}

/// The largest pass of a run of @p plan over bands of @p nodata, and its tile shape.
struct PassShape {
  int bands = 0;
  std::int64_t tile_height = 0, tile_width = 0;
};

PassShape pass_shape(const RasterMetadata& meta,
                     const std::vector<std::optional<NodataValue>>& nodata, const RasterPlan& plan,
                     bool per_band, const char* who) {
  VSR_EXPECTS(plan.halo >= 0, std::string(who) + ": negative halo " + std::to_string(plan.halo));
  PassShape p;
  for (const TilePass& pass : tile_passes(nodata, plan, per_band)) {
    p.bands = std::max(p.bands, pass.band_count);
  }
  p.tile_height = meta.height;
  p.tile_width = meta.width;
  if (plan.strategy == TilingStrategy::tiled) {
    VSR_EXPECTS(plan.tile_shape && plan.tile_shape->first > 0 && plan.tile_shape->second > 0,
                std::string(who) + ": tiled plan without a positive tile_shape");
    p.tile_height = std::min(plan.tile_shape->first, meta.height);
    p.tile_width = std::min(plan.tile_shape->second, meta.width);
  }
  return p;
}

/// What a streamed run copies from its input besides pixels, read before the run (the input's
/// dataset belongs to the reading stage once the run starts).
struct CopiedMetadata {
  std::optional<std::string> area_or_point;
  struct Band {
    std::string description;
    GDALColorInterp interp = GCI_Undefined;
    std::optional<double> scale, offset;
    std::string unit;
  };
  std::vector<Band> bands;
};

CopiedMetadata read_copied_metadata(GDALDatasetH src, const std::vector<int>& bands,
                                    MetadataCopy what) {
  CopiedMetadata m;
  if (what == MetadataCopy::none) return m;
  if (const char* aop = GDALGetMetadataItem(src, "AREA_OR_POINT", nullptr); aop != nullptr) {
    m.area_or_point = aop;
  }
  for (const int b : bands) {
    GDALRasterBandH from = GDALGetRasterBand(src, b);
    CopiedMetadata::Band band;
    if (const char* d = GDALGetDescription(from); d != nullptr) band.description = d;
    band.interp = GDALGetRasterColorInterpretation(from);
    if (what == MetadataCopy::all) {
      int has = 0;
      if (const double scale = GDALGetRasterScale(from, &has); has != 0) band.scale = scale;
      if (const double offset = GDALGetRasterOffset(from, &has); has != 0) band.offset = offset;
      if (const char* unit = GDALGetRasterUnitType(from); unit != nullptr) band.unit = unit;
    }
    m.bands.push_back(std::move(band));
  }
  return m;
}

/// Copies @p m to the new output @p dst, as far as its format holds it.
void apply_copied_metadata(const CopiedMetadata& m, GDALDatasetH dst, int out_bands) {
  // Descriptive metadata goes where the format can hold it: a driver that cannot (RMF has no
  // colour interpretation) fails neither the run nor the file.
  QuietErrors ignored;
  if (m.area_or_point) GDALSetMetadataItem(dst, "AREA_OR_POINT", m.area_or_point->c_str(), nullptr);
  if (out_bands != static_cast<int>(m.bands.size())) return;
  for (int b = 0; b < out_bands; ++b) {
    const CopiedMetadata::Band& from = m.bands[static_cast<std::size_t>(b)];
    GDALRasterBandH to = GDALGetRasterBand(dst, b + 1);
    if (!from.description.empty()) GDALSetDescription(to, from.description.c_str());
    if (from.interp != GCI_Undefined) GDALSetRasterColorInterpretation(to, from.interp);
    if (from.scale) GDALSetRasterScale(to, *from.scale);
    if (from.offset) GDALSetRasterOffset(to, *from.offset);
    if (!from.unit.empty()) GDALSetRasterUnitType(to, from.unit.c_str());
  }
}

}  // namespace

// --- RasterFileSource ------------------------------------------------------------------------

struct RasterFileSource::State {
  std::string path;
  OpenOptions open;
  Dataset ds;
  /// More handles of the file, one per extra reading thread (OpenOptions::num_threads), opened
  /// at the first read that uses them.
  std::vector<Dataset> more;
  int threads = 1;      ///< threads a read may use
  int block_rows = 1;   ///< GDAL block height of the first selected band
  RasterMetadata meta;  ///< of the selected bands (nodata: the first's)
  std::vector<int> bands;
  std::vector<std::optional<NodataValue>> nodata;
  /// Per band: its GDAL mask decides its validity; its nodata only marks masked pixels (chosen
  /// by mask_marker, not the band's own).
  std::vector<bool> masked, marks;
  bool has_geotransform = true;

  /// Reads @p window of @p bands of the file into @p tile (allocated for it) in row strips
  /// of whole blocks, strip i on handle i (the source's own handle first, the others opened on
  /// first use), each strip on a thread of its own but the first, which runs on the calling
  /// thread. The first error (GDAL's, or opening a handle) is rethrown once every strip is done.
  void read_strips(const RasterWindow& window, const std::vector<int>& bands,
                   OwnedRasterArray& tile, int strips) {
    State& s = *this;
    // Strips of whole blocks that cover every row: the last takes what is left.
    const std::int64_t even = (window.height + strips - 1) / strips;
    const std::int64_t rows_per = (even + s.block_rows - 1) / s.block_rows * s.block_rows;
    std::mutex error_mutex;
    std::exception_ptr error;
    const auto strip = [&](int i, GDALDatasetH ds) {
      try {
        QuietErrors quiet;
        RasterWindow w = window;
        w.row_off = window.row_off + i * rows_per;
        w.height = std::min(rows_per, window.row_off + window.height - w.row_off);
        if (w.height <= 0) return;
        auto* buf = static_cast<std::byte*>(tile.mutable_host_data()) +
                    static_cast<std::size_t>((w.row_off - window.row_off) * window.width) *
                        itemsize(tile.dtype());
        std::vector<int> b = bands;
        raster_io(ds, GF_Read, w, buf, tile.dtype(), b, window.width, window.width * window.height,
                  s.path);
        quiet.check("cannot read '" + shown(s.path) + "'");
      } catch (...) {
        std::lock_guard lock(error_mutex);
        if (!error) error = std::current_exception();
      }
    };
    {
      QuietErrors quiet;
      while (static_cast<int>(s.more.size()) < strips - 1) {
        s.more.push_back(open_readonly(s.path, s.open, "RasterFileSource"));
      }
    }
    std::vector<std::thread> others;
    others.reserve(static_cast<std::size_t>(strips - 1));
    try {
      for (int i = 1; i < strips; ++i) {
        others.emplace_back(strip, i, s.more[static_cast<std::size_t>(i - 1)].get());
      }
    } catch (...) {
      std::lock_guard lock(error_mutex);
      if (!error) error = std::current_exception();  // a thread that could not start
    }
    strip(0, s.ds.get());
    for (std::thread& t : others) t.join();
    if (error) std::rethrow_exception(error);
  }
};

RasterFileSource::RasterFileSource(const std::string& path, const OpenOptions& open,
                                   std::vector<int> bands)
    : state_(std::make_unique<State>()) {
  static constexpr const char* who = "RasterFileSource";
  QuietErrors quiet;
  State& s = *state_;
  s.path = path;
  s.open = open;
  s.ds = open_readonly(path, open, who);
  s.threads = open.num_threads < 0
                  ? static_cast<int>(std::max(1U, std::thread::hardware_concurrency()))
                  : std::max(1, open.num_threads);
  s.meta = metadata_of(s.ds.get(), path, bands, /*mixed_nodata=*/true);
  s.bands = bands.empty() ? all_bands(GDALGetRasterCount(s.ds.get())) : std::move(bands);
  std::vector<std::optional<NodataValue>> own;
  for (const int b : s.bands) {
    GDALRasterBandH band = GDALGetRasterBand(s.ds.get(), b);
    own.push_back(detail::gdal::band_nodata(band, s.meta.dtype));
    // GDAL's mask flags decide: a band whose mask is its validity ignores its own nodata.
    s.masked.push_back(!open.ignore_mask && has_pixel_mask(band));
  }
  s.nodata = own;
  s.marks.assign(s.bands.size(), false);
  if (std::find(s.masked.begin(), s.masked.end(), true) != s.masked.end()) {
    // One value for the masked pixels that no pixel left valid takes, given also to the bands
    // read with them that have no nodata (an RGBA file's alpha band), so that every band keeps
    // one nodata; the masked bands' own nodata when it is free.
    std::vector<int> masked, plain;
    std::optional<NodataValue> preferred;
    for (std::size_t k = 0; k < s.bands.size(); ++k) {
      if (s.masked[k]) {
        masked.push_back(s.bands[k]);
        if (!preferred) preferred = own[k];
      } else if (!own[k]) {
        plain.push_back(s.bands[k]);
      }
    }
    const NodataValue marker =
        mask_marker(s.ds.get(), masked, plain, s.meta.dtype, preferred, path);
    for (std::size_t k = 0; k < s.bands.size(); ++k) {
      if (!s.masked[k] && own[k]) continue;
      s.nodata[k] = marker;
      s.marks[k] = own[k] != marker;
    }
    s.meta.exact_nodata = s.nodata.front();
    s.meta.nodata =
        s.nodata.front() ? std::optional<double>(s.nodata.front()->to_double()) : std::nullopt;
  }
  std::array<double, 6> gt{};
  s.has_geotransform = GDALGetGeoTransform(s.ds.get(), gt.data()) == CE_None;
  int block_cols = 1;
  GDALGetBlockSize(GDALGetRasterBand(s.ds.get(), s.bands.front()), &block_cols, &s.block_rows);
  s.block_rows = std::max(1, s.block_rows);
  CPLErrorReset();
}

RasterFileSource::~RasterFileSource() = default;

RasterMetadata RasterFileSource::metadata() const {
  return state_->meta;
}

std::vector<std::optional<NodataValue>> RasterFileSource::band_nodata() const {
  return state_->nodata;
}

const std::string& RasterFileSource::path() const {
  return state_->path;
}

const std::vector<int>& RasterFileSource::bands() const {
  return state_->bands;
}

bool RasterFileSource::has_geotransform() const {
  return state_->has_geotransform;
}

const std::vector<bool>& RasterFileSource::masked_bands() const {
  return state_->masked;
}

const std::vector<bool>& RasterFileSource::nodata_marks_mask() const {
  return state_->marks;
}

OwnedRasterArray RasterFileSource::read(const RasterWindow& window, int first_band,
                                        int band_count) {
  State& s = *state_;
  if (!s.ds) throw std::logic_error("RasterFileSource: read after close");
  VSR_EXPECTS(first_band >= 0 && band_count >= 1 &&
                  first_band <= static_cast<int>(s.bands.size()) - band_count,
              "RasterFileSource: bands " + std::to_string(first_band) + "+" +
                  std::to_string(band_count) + " of " + std::to_string(s.bands.size()));
  QuietErrors quiet;
  const auto first = s.bands.begin() + first_band;
  const std::vector<int> bands(first, first + band_count);
  // A window of several block rows is read in strips at once when threads are allowed.
  const int strips =
      static_cast<int>(std::min<std::int64_t>(s.threads, window.height / s.block_rows));
  std::optional<OwnedRasterArray> read;
  if (strips >= 2 && window.width > 0 && window.col_off >= 0 && window.row_off >= 0 &&
      window.col_off <= s.meta.width - window.width &&
      window.row_off <= s.meta.height - window.height) {
    read = OwnedRasterArray::allocate(
        Residency::host, s.meta.dtype, band_count, window.height, window.width, std::nullopt,
        s.meta.affine.shifted(window.col_off, window.row_off), s.meta.crs);
    s.read_strips(window, bands, *read, strips);
  } else {
    read = read_open(s.ds.get(), s.path, window, bands, /*check_memory=*/false,
                     /*mixed_nodata=*/true);
  }
  OwnedRasterArray tile = read->with_nodata(s.nodata[static_cast<std::size_t>(first_band)]);
  if (std::any_of(s.masked.begin() + first_band, s.masked.begin() + first_band + band_count,
                  [](bool m) { return m; })) {
    const auto at = [&](const auto& v) {
      return std::vector(v.begin() + first_band, v.begin() + first_band + band_count);
    };
    apply_masks(s.ds.get(), tile, window, at(s.bands), at(s.nodata), at(s.masked), s.path);
  }
  quiet.check("cannot read '" + shown(s.path) + "'");
  return tile;
}

std::uint64_t RasterFileSource::run_host_bytes(
    const RasterPlan& plan, bool per_band, int overlap,
    std::optional<std::uint64_t> gdal_cache_bytes) const {
  const State& s = *state_;
  const PassShape p = pass_shape(s.meta, s.nodata, plan, per_band, "RasterFileSource");
  const auto ph =
      static_cast<std::uint64_t>(std::min(s.meta.height, p.tile_height + 2 * plan.halo));
  const auto pw = static_cast<std::uint64_t>(std::min(s.meta.width, p.tile_width + 2 * plan.halo));
  const std::uint64_t px =
      detail::checked_mul(detail::checked_mul(ph, pw, "tile pixel count"),
                          static_cast<std::uint64_t>(p.bands), "tile pixel count");
  // Each tile, and twice a result of up to 8 bytes a pixel (the result and a stacked or host
  // copy), for every tile a run keeps live.
  const std::uint64_t tile =
      detail::checked_mul(detail::checked_mul(px, itemsize(s.meta.dtype) + 16, "pass bytes"),
                          static_cast<std::uint64_t>(overlap_tiles_live(overlap)), "pass bytes");
  const std::uint64_t cache =
      gdal_cache_bytes ? *gdal_cache_bytes
                       : static_cast<std::uint64_t>(std::max<GIntBig>(0, GDALGetCacheMax64()));
  // GDAL decodes whole blocks: at least one is held beside the cache.
  return detail::checked_add(detail::checked_add(tile, cache, "pass bytes"),
                             dataset_block_bytes(s.ds.get()), "pass bytes");
}

std::uint64_t RasterFileSource::gdal_cache_for(const RasterPlan& plan, bool per_band) const {
  const State& s = *state_;
  const PassShape p = pass_shape(s.meta, s.nodata, plan, per_band, "gdal_cache_for_plan");
  return cache_for(s.ds.get(), s.meta.width, p.tile_height, plan.halo, p.bands);
}

std::uint64_t RasterFileSource::block_bytes() const {
  return state_->ds ? dataset_block_bytes(state_->ds.get()) : 0;
}

void RasterFileSource::close() noexcept {
  state_->ds.reset();
}

// --- RasterFileSink --------------------------------------------------------------------------

struct RasterFileSink::State {
  std::string path;
  WriteOptions options;
  std::optional<Output> out;  ///< the file written, all or nothing
  DType dtype = DType::float32;
  std::vector<std::optional<NodataValue>> written;  ///< each output band's nodata
  std::optional<NodataValue> file_nodata;           ///< GTiff: the one nodata the file has
  bool file_nodata_set = false;
  CopiedMetadata copied;
  bool georeferenced = true;
  std::function<void()> before_commit;
};

RasterFileSink::RasterFileSink(const std::string& path, const WriteOptions& options)
    : state_(std::make_unique<State>()) {
  static constexpr const char* who = "RasterFileSink";
  QuietErrors quiet;
  State& s = *state_;
  s.path = path;
  s.options = options;
  // What the driver refuses, refused before anything is read (the dtype once it is known); the
  // temporary made before anything is computed: a directory that takes no temporary fails first.
  s.out.emplace(path, options, who);
}

RasterFileSink::~RasterFileSink() = default;

void RasterFileSink::copy_from(const RasterFileSource& source, MetadataCopy what) {
  State& s = *state_;
  QuietErrors quiet;
  s.georeferenced = source.has_geotransform();
  if (!source.state_->ds) return;
  s.copied = read_copied_metadata(source.state_->ds.get(), source.bands(), what);
}

void RasterFileSink::before_commit(std::function<void()> hook) {
  state_->before_commit = std::move(hook);
}

void RasterFileSink::begin(const TileOutput& output) {
  State& s = *state_;
  QuietErrors quiet;
  s.dtype = output.dtype;
  GDALDatasetH dst =
      s.out->create(output.dtype, output.band_count, output.height, output.width, std::nullopt,
                    s.georeferenced ? &output.affine : nullptr, output.crs, quiet);
  apply_copied_metadata(s.copied, dst, output.band_count);
  s.written.assign(static_cast<std::size_t>(output.band_count), std::nullopt);
  quiet.check("cannot create '" + shown(s.path) + "'");
}

void RasterFileSink::begin_pass(int output_band, int band_count,
                                const std::optional<NodataValue>& nodata) {
  State& s = *state_;
  QuietErrors quiet;
  if (s.out->one_nodata() && s.file_nodata_set && nodata != s.file_nodata) {
    throw std::invalid_argument(
        "the results of bands " + std::to_string(output_band + 1) + ".. have nodata " +
        (nodata ? nodata->to_string() : "none") + ", earlier bands " +
        (s.file_nodata ? s.file_nodata->to_string() : "none") + ", and " + s.out->driver() +
        " keeps one nodata for all bands: write these bands to a file of their own or "
        "to a format with a nodata per band");
  }
  s.file_nodata = nodata;
  s.file_nodata_set = true;
  for (int b = 0; b < band_count; ++b) {
    s.written[static_cast<std::size_t>(output_band + b)] = nodata;
    if (nodata) {
      set_band_nodata(GDALGetRasterBand(s.out->dataset(), output_band + b + 1), s.dtype, *nodata);
    }
  }
  quiet.check("cannot write '" + shown(s.path) + "'");
}

void RasterFileSink::write(const OwnedRasterArray& result, const TileInfo& where) {
  State& s = *state_;
  QuietErrors quiet;
  std::vector<std::byte> scratch;
  const auto* base = static_cast<const std::byte*>(host_pixels(result, scratch, "RasterFileSink"));
  const RasterWindow& phys = where.read;
  const std::size_t offset =
      static_cast<std::size_t>((where.window.row_off - phys.row_off) * phys.width +
                               (where.window.col_off - phys.col_off)) *
      itemsize(s.dtype);
  std::vector<int> out_bands;
  for (int b = 0; b < result.band_count(); ++b) out_bands.push_back(where.output_band + b + 1);
  raster_io(s.out->dataset(), GF_Write, where.window, const_cast<std::byte*>(base + offset),
            s.dtype, out_bands, phys.width, phys.width * phys.height, s.path);
  // A failure reported off the calls' return values (e.g. an evicted block that could not be
  // written back) fails the run here, not at the end.
  quiet.check("cannot write '" + shown(s.path) + "'");
}

void RasterFileSink::finish() {
  State& s = *state_;
  QuietErrors quiet;
  (void)s.out->complete(quiet, s.written);
  if (s.before_commit) s.before_commit();
  s.out->commit();
}

// --- Streamed runs ---------------------------------------------------------------------------

void RasterFileSource::prepare(const RasterPlan& plan, const StreamOptions& options,
                               const std::string& name) const {
  const RasterFileSource& source = *this;
  const char* who = name.c_str();
  const RasterMetadata meta = source.metadata();
  const std::uint64_t needed =
      source.run_host_bytes(plan, options.per_band, options.overlap, options.gdal_cache_bytes);
  const std::uint64_t limit =
      options.host_memory_limit != 0 ? options.host_memory_limit : available_host_memory();
  if (needed > limit) {
    const PassShape p = pass_shape(meta, source.band_nodata(), plan, options.per_band, who);
    const std::uint64_t cache =
        options.gdal_cache_bytes
            ? *options.gdal_cache_bytes
            : static_cast<std::uint64_t>(std::max<GIntBig>(0, GDALGetCacheMax64()));
    throw HostMemoryLimitError(
        needed, limit,
        std::string(who) + ": a pass over '" + shown(source.path()) + "' (" +
            std::to_string(p.bands) + " band(s) of " +
            std::to_string(std::min(meta.height, p.tile_height + 2 * plan.halo)) + " x " +
            std::to_string(std::min(meta.width, p.tile_width + 2 * plan.halo)) + " " +
            std::string(to_string(meta.dtype)) + ", " +
            std::to_string(overlap_tiles_live(options.overlap)) + " tile(s) live, GDAL blocks of " +
            detail::byte_text(source.block_bytes()) + ", cache " + detail::byte_text(cache) +
            ") needs " + detail::byte_text(needed) + " of host memory, more than the " +
            detail::byte_text(limit) +
            (options.host_memory_limit != 0 ? " allowed" : " available") +
            "; plan smaller tiles (a smaller budget) or fewer bands per pass");
  }
  if (options.gdal_cache_bytes) GDALSetCacheMax64(static_cast<GIntBig>(*options.gdal_cache_bytes));
}

namespace {

TileRunOptions run_options(const StreamOptions& options, const char* who) {
  TileRunOptions o;
  o.name = who;
  o.per_band = options.per_band;
  o.mixed_nodata = options.mixed_nodata;
  o.overlap = options.overlap;
  o.progress = options.progress;
  o.stage = options.stage;
  return o;
}

}  // namespace

void process_raster_streamed(const std::string& in, const std::string& out, const BandOp& op,
                             const RasterPlan& plan, const WriteOptions& options,
                             std::function<void(std::int64_t, std::int64_t)> progress) {
  StreamOptions stream;
  stream.write = options;
  stream.progress = std::move(progress);
  process_raster_file(in, out, op, plan, stream);
}

std::uint64_t gdal_cache_for_plan(const std::string& in, const RasterPlan& plan,
                                  const StreamOptions& options) {
  const RasterFileSource source(in, options.open, options.bands);
  return source.gdal_cache_for(plan, options.per_band);
}

void process_raster_file(const std::string& in, const std::string& out, const BandOp& op,
                         const RasterPlan& plan, const StreamOptions& options) {
  static constexpr const char* who = "process_raster_file";
  if (!op) throw std::invalid_argument(std::string(who) + ": empty op");
  {
    // What the driver refuses, refused before the input is opened.
    QuietErrors quiet;
    std::string driver_name;
    GDALDriverH driver = output_driver(options.write, who, &driver_name);
    (void)creation_options(driver, driver_name, options.write, DType::float32, 1, who);
  }
  RasterFileSource source(in, options.open, options.bands);
  source.prepare(plan, options, who);
  RasterFileSink sink(out, options.write);
  sink.copy_from(source, options.metadata);
  // The input closed before the output replaces it (in place: the same file).
  sink.before_commit([&source] { source.close(); });
  run_tiles(source, op, sink, plan, run_options(options, who));
}

void for_each_raster_tile(
    const std::string& in, const RasterPlan& plan,
    const std::function<void(const OwnedRasterArray& tile, const TileInfo& where)>& visit,
    const StreamOptions& options) {
  static constexpr const char* who = "for_each_raster_tile";
  if (!visit) throw std::invalid_argument(std::string(who) + ": empty visitor");
  RasterFileSource source(in, options.open, options.bands);
  source.prepare(plan, options, who);
  VisitTileSink sink(visit);
  run_tiles(
      source, [](const OwnedRasterArray& tile) { return tile; }, sink, plan,
      run_options(options, who));
}

}  // namespace vibespatial::raster
