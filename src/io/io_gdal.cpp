// SPDX-License-Identifier: Apache-2.0
// Raster file I/O through GDAL's C API (io.hpp).
#include "common/text_escape.hpp"
#include "io/output_file.hpp"

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/io.hpp>

#include <cpl_conv.h>
#include <cpl_error.h>
#include <cpl_string.h>
#include <gdal.h>
#include <gdal_version.h>
#include <ogr_srs_api.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#define VSR_GDAL_HAS_INT8 (GDAL_VERSION_NUM >= GDAL_COMPUTE_VERSION(3, 7, 0))

namespace vibespatial::raster {

namespace {

void register_drivers() {
  static std::once_flag once;
  std::call_once(once, [] { GDALAllRegister(); });
}

/// Silences GDAL's default stderr error printing for the current thread during one call and
/// records every failure GDAL reports meanwhile, also those that do not show in a call's return
/// value (a dirty block written back when the cache evicts it, a flush inside GDALClose): check()
/// turns them into an exception. The last message stays available (CPLGetLastErrorMsg).
class QuietErrors {
 public:
  QuietErrors() {
    CPLPushErrorHandlerEx(&QuietErrors::record, this);
    CPLErrorReset();
  }
  ~QuietErrors() { CPLPopErrorHandler(); }
  QuietErrors(const QuietErrors&) = delete;
  QuietErrors& operator=(const QuietErrors&) = delete;

  /// Throws std::runtime_error(@p what + GDAL's first message) if GDAL reported a failure
  /// since construction.
  void check(const std::string& what) const {
    if (failures_ > 0) throw std::runtime_error(what + ": " + detail::printable(first_));
  }

 private:
  static void CPL_STDCALL record(CPLErr type, CPLErrorNum /*num*/, const char* msg) {
    auto* self = static_cast<QuietErrors*>(CPLGetErrorHandlerUserData());
    if (self == nullptr || (type != CE_Failure && type != CE_Fatal)) return;
    try {
      if (self->failures_++ == 0) self->first_ = msg != nullptr ? msg : "unknown GDAL error";
    } catch (...) {
    }
  }

  int failures_ = 0;
  std::string first_;
};

/// @p text (a path, a driver name, a CRS) as it goes into an exception message: printable, so
/// every message is valid UTF-8 without terminal control characters.
std::string shown(const std::string& text) {
  return detail::printable(text);
}

std::string gdal_message() {
  const char* msg = CPLGetLastErrorMsg();
  return (msg != nullptr && *msg != '\0') ? ": " + detail::printable(msg) : std::string();
}

[[noreturn]] void fail(const std::string& what) {
  throw std::runtime_error(what + gdal_message());
}

struct DatasetCloser {
  void operator()(void* ds) const noexcept { GDALClose(static_cast<GDALDatasetH>(ds)); }
};
using Dataset = std::unique_ptr<void, DatasetCloser>;

/// Whether @p path makes GDAL leave the local file system: a /vsi... virtual file system path or
/// a URL ("scheme://").
bool is_virtual_path(const std::string& path) {
  if (path.rfind("/vsi", 0) == 0) return true;
  const std::size_t colon = path.find("://");
  if (colon == std::string::npos || colon == 0) return false;
  return std::all_of(path.begin(), path.begin() + static_cast<std::ptrdiff_t>(colon), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '+' || c == '-' || c == '.';
  });
}

Dataset open_readonly(const std::string& path, const OpenOptions& open = {}) {
  register_drivers();
  if (!open.allow_virtual && is_virtual_path(path)) {
    throw std::invalid_argument("cannot open raster '" + shown(path) +
                                "': GDAL virtual file systems and URLs are refused unless allowed "
                                "(OpenOptions::allow_virtual; vsr-run --allow-virtual)");
  }
  std::vector<std::string> drivers = open.drivers.empty() ? default_input_drivers() : open.drivers;
  if (open.allow_virtual) drivers.emplace_back("VRT");
  CPLStringList allowed;
  for (const std::string& d : drivers) allowed.AddString(d.c_str());
  GDALDatasetH ds =
      GDALOpenEx(path.c_str(), GDAL_OF_RASTER | GDAL_OF_READONLY | GDAL_OF_VERBOSE_ERROR,
                 allowed.List(), nullptr, nullptr);
  if (ds != nullptr) return Dataset(ds);
  std::string why = gdal_message();
  // Say so when the file is a raster of a format that is not allowed.
  if (GDALDriverH found = GDALIdentifyDriverEx(path.c_str(), GDAL_OF_RASTER, nullptr, nullptr);
      found != nullptr) {
    const std::string name = GDALGetDriverShortName(found);
    if (std::find(drivers.begin(), drivers.end(), name) == drivers.end()) {
      std::string list;
      for (const std::string& d : drivers) list += (list.empty() ? "" : ", ") + d;
      why = ": its format (" + shown(name) + ") is not an allowed input format (" + list + ")" +
            (name == "VRT" ? "; a VRT reads the files it names, allow it with "
                             "OpenOptions::allow_virtual (vsr-run --allow-virtual)"
                           : "; add it to OpenOptions::drivers to allow it");
    }
  }
  throw std::invalid_argument("cannot open raster '" + shown(path) + "'" + why);
}

/// Flushes and closes the written dataset @p ds, then throws if GDAL reported any failure while
/// it was written, flushed or closed (GDALFlushCache and GDALClose return void before GDAL 3.7,
/// so @p errors is what tells).
void close_checked(Dataset& ds, const std::string& path, const QuietErrors& errors) {
  errors.check("cannot write '" + shown(path) + "'");
  GDALFlushCache(ds.get());
  errors.check("cannot write '" + shown(path) + "' (flushing)");
  ds.reset();
  errors.check("cannot write '" + shown(path) + "' (closing)");
}

DType dtype_from_band(GDALRasterBandH band, const std::string& path) {
  switch (GDALGetRasterDataType(band)) {
    case GDT_Byte: {
      // GDAL < 3.7 has no Int8: GTiff marks signed bytes in the IMAGE_STRUCTURE metadata.
      const char* pt = GDALGetMetadataItem(band, "PIXELTYPE", "IMAGE_STRUCTURE");
      return (pt != nullptr && std::strcmp(pt, "SIGNEDBYTE") == 0) ? DType::int8 : DType::uint8;
    }
#if VSR_GDAL_HAS_INT8
    case GDT_Int8:
      return DType::int8;
#endif
    case GDT_UInt16:
      return DType::uint16;
    case GDT_Int16:
      return DType::int16;
    case GDT_UInt32:
      return DType::uint32;
    case GDT_Int32:
      return DType::int32;
    case GDT_UInt64:
      return DType::uint64;
    case GDT_Int64:
      return DType::int64;
    case GDT_Float32:
      return DType::float32;
    case GDT_Float64:
      return DType::float64;
    default:
      throw std::runtime_error("raster '" + shown(path) + "' has GDAL data type " +
                               GDALGetDataTypeName(GDALGetRasterDataType(band)) +
                               ", which vibespatial-raster does not support");
  }
}

/// The GDAL type that holds @p dtype's bytes (Byte for int8 before GDAL 3.7).
GDALDataType gdal_type(DType dtype) {
  switch (dtype) {
    case DType::uint8:
      return GDT_Byte;
    case DType::int8:
#if VSR_GDAL_HAS_INT8
      return GDT_Int8;
#else
      return GDT_Byte;
#endif
    case DType::uint16:
      return GDT_UInt16;
    case DType::int16:
      return GDT_Int16;
    case DType::uint32:
      return GDT_UInt32;
    case DType::int32:
      return GDT_Int32;
    case DType::uint64:
      return GDT_UInt64;
    case DType::int64:
      return GDT_Int64;
    case DType::float32:
      return GDT_Float32;
    case DType::float64:
      return GDT_Float64;
  }
  throw std::invalid_argument("write_raster: bad dtype");
}

std::optional<double> band_nodata(GDALRasterBandH band, DType dtype) {
  int has = 0;
  double value = 0;
  if (dtype == DType::int64) {
    const std::int64_t v = GDALGetRasterNoDataValueAsInt64(band, &has);
    value = static_cast<double>(v);
  } else if (dtype == DType::uint64) {
    const std::uint64_t v = GDALGetRasterNoDataValueAsUInt64(band, &has);
    value = static_cast<double>(v);
  } else {
    value = GDALGetRasterNoDataValue(band, &has);
  }
  if (has == 0) return std::nullopt;
  return value;
}

void set_band_nodata(GDALRasterBandH band, DType dtype, double nodata) {
  CPLErr err = CE_None;
  // 64-bit integers go through the exact setters when the value is an integer in range, so
  // large sentinels (e.g. INT64_MIN) are not rounded through the string form of a double.
  if (dtype == DType::int64 && std::trunc(nodata) == nodata && nodata >= -0x1p63 &&
      nodata < 0x1p63) {
    err = GDALSetRasterNoDataValueAsInt64(band, static_cast<std::int64_t>(nodata));
  } else if (dtype == DType::uint64 && std::trunc(nodata) == nodata && nodata >= 0 &&
             nodata < 0x1p64) {
    err = GDALSetRasterNoDataValueAsUInt64(band, static_cast<std::uint64_t>(nodata));
  } else {
    err = GDALSetRasterNoDataValue(band, nodata);
  }
  if (err != CE_None) fail("cannot set nodata " + std::to_string(nodata));
}

/// Header of an open dataset; @p bands (1-based) select the bands checked for a common dtype
/// and nodata, all bands when empty.
RasterMetadata metadata_of(GDALDatasetH ds, const std::string& path,
                           const std::vector<int>& bands) {
  RasterMetadata meta;
  meta.width = GDALGetRasterXSize(ds);
  meta.height = GDALGetRasterYSize(ds);
  const int count = GDALGetRasterCount(ds);
  if (count < 1) throw std::runtime_error("raster '" + shown(path) + "' has no bands");
  std::vector<int> selected = bands;
  if (selected.empty()) {
    for (int b = 1; b <= count; ++b) selected.push_back(b);
  }
  for (int b : selected) {
    if (b < 1 || b > count) {
      throw std::invalid_argument("band index " + std::to_string(b) + " is outside [1, " +
                                  std::to_string(count) + "] for raster '" + shown(path) + "'");
    }
  }
  meta.band_count = static_cast<int>(selected.size());
  GDALRasterBandH first = GDALGetRasterBand(ds, selected.front());
  meta.dtype = dtype_from_band(first, path);
  meta.nodata = band_nodata(first, meta.dtype);
  for (int b : selected) {
    GDALRasterBandH band = GDALGetRasterBand(ds, b);
    if (dtype_from_band(band, path) != meta.dtype) {
      throw std::runtime_error("raster '" + shown(path) + "': band " + std::to_string(b) +
                               " has a different data type than band " +
                               std::to_string(selected.front()));
    }
    if (!same_nodata(band_nodata(band, meta.dtype), meta.nodata)) {
      throw std::runtime_error("raster '" + shown(path) + "': band " + std::to_string(b) +
                               " has a different nodata value than band " +
                               std::to_string(selected.front()) +
                               " (one nodata per raster is supported)");
    }
  }
  std::array<double, 6> gt{};
  if (GDALGetGeoTransform(ds, gt.data()) != CE_None) {
    gt = {0, 1, 0, 0, 0, 1};
    CPLErrorReset();
  }
  meta.affine = Affine::from_gdal(gt);
  const char* wkt = GDALGetProjectionRef(ds);
  meta.crs = wkt != nullptr ? wkt : "";
  GDALDriverH driver = GDALGetDatasetDriver(ds);
  meta.driver = driver != nullptr ? GDALGetDriverShortName(driver) : "";
  return meta;
}

Affine shifted(const Affine& a, std::int64_t col, std::int64_t row) {
  Affine s = a;
  s.c = a.c + static_cast<double>(col) * a.a + static_cast<double>(row) * a.b;
  s.f = a.f + static_cast<double>(col) * a.d + static_cast<double>(row) * a.e;
  return s;
}

/// Band-major RasterIO of a (bands, h, w) buffer whose rows are @p line_elems elements apart and
/// whose bands are @p band_elems elements apart.
void raster_io(GDALDatasetH ds, GDALRWFlag flag, const RasterWindow& w, void* buf, DType dtype,
               std::vector<int>& bands, std::int64_t line_elems, std::int64_t band_elems,
               const std::string& path) {
  const auto item = static_cast<GSpacing>(itemsize(dtype));
  const CPLErr err = GDALDatasetRasterIOEx(
      ds, flag, static_cast<int>(w.col_off), static_cast<int>(w.row_off), static_cast<int>(w.width),
      static_cast<int>(w.height), buf, static_cast<int>(w.width), static_cast<int>(w.height),
      gdal_type(dtype), static_cast<int>(bands.size()), bands.data(), item, item * line_elems,
      item * band_elems, nullptr);
  if (err != CE_None) {
    fail(std::string(flag == GF_Read ? "cannot read" : "cannot write") + " raster '" + shown(path) +
         "'");
  }
}

OwnedRasterArray read_open(GDALDatasetH ds, const std::string& path,
                           std::optional<RasterWindow> window, std::vector<int> bands) {
  if (bands.empty()) {
    for (int b = 1; b <= GDALGetRasterCount(ds); ++b) bands.push_back(b);
  }
  const RasterMetadata meta = metadata_of(ds, path, bands);
  const RasterWindow w = window.value_or(RasterWindow{0, 0, meta.width, meta.height});
  if (w.width <= 0 || w.height <= 0 || w.col_off < 0 || w.row_off < 0 ||
      w.col_off > meta.width - w.width || w.row_off > meta.height - w.height) {
    throw std::invalid_argument(
        "window (col_off " + std::to_string(w.col_off) + ", row_off " + std::to_string(w.row_off) +
        ", width " + std::to_string(w.width) + ", height " + std::to_string(w.height) +
        ") is not inside raster '" + shown(path) + "' of " + std::to_string(meta.width) + " x " +
        std::to_string(meta.height) + " pixels");
  }
  OwnedRasterArray out =
      OwnedRasterArray::allocate(Residency::host, meta.dtype, meta.band_count, w.height, w.width,
                                 meta.nodata, shifted(meta.affine, w.col_off, w.row_off), meta.crs);
  raster_io(ds, GF_Read, w, out.mutable_host_data(), meta.dtype, bands, w.width, w.width * w.height,
            path);
  return out;
}

/// Creates the dataset @p file (the temporary file of @p path, which messages name).
Dataset create_dataset(const std::string& file, const std::string& path, DType dtype,
                       int band_count, std::int64_t height, std::int64_t width,
                       const std::optional<double>& nodata, const Affine& affine,
                       const std::string& crs, const WriteOptions& options) {
  register_drivers();
  if (height > INT_MAX || width > INT_MAX) {
    throw std::invalid_argument("write_raster: " + std::to_string(width) + " x " +
                                std::to_string(height) + " exceeds GDAL's size limit");
  }
  GDALDriverH driver = GDALGetDriverByName(options.driver.c_str());
  if (driver == nullptr) {
    throw std::invalid_argument("write_raster: unknown GDAL driver '" + shown(options.driver) +
                                "'");
  }
  const bool gtiff = options.driver == "GTiff";
  if (dtype == DType::int8 && !VSR_GDAL_HAS_INT8 && !gtiff) {
    throw std::invalid_argument("write_raster: int8 needs GDAL >= 3.7 for driver '" +
                                shown(options.driver) + "' (this GDAL is " GDAL_RELEASE_NAME ")");
  }
  std::string wkt;
  if (!crs.empty()) {
    OGRSpatialReferenceH srs = OSRNewSpatialReference(nullptr);
    char* text = nullptr;
    const bool ok = OSRSetFromUserInput(srs, crs.c_str()) == OGRERR_NONE &&
                    OSRExportToWkt(srs, &text) == OGRERR_NONE;
    if (text != nullptr) wkt = text;
    CPLFree(text);
    OSRDestroySpatialReference(srs);
    if (!ok)
      throw std::invalid_argument("write_raster: GDAL does not understand CRS '" + shown(crs) +
                                  "'");
  }

  CPLStringList opts;
  if (gtiff) {
    if (!options.compress.empty()) opts.SetNameValue("COMPRESS", options.compress.c_str());
    if (options.tiled) {
      opts.SetNameValue("TILED", "YES");
      opts.SetNameValue("BLOCKXSIZE", std::to_string(options.block).c_str());
      opts.SetNameValue("BLOCKYSIZE", std::to_string(options.block).c_str());
    }
    // Band-major like OwnedRasterArray, so a band is contiguous in the file.
    if (band_count > 1) opts.SetNameValue("INTERLEAVE", "BAND");
    if (dtype == DType::int8 && !VSR_GDAL_HAS_INT8) opts.SetNameValue("PIXELTYPE", "SIGNEDBYTE");
    // Files beyond 4 GiB need BigTIFF; IF_SAFER decides from the uncompressed size.
    opts.SetNameValue("BIGTIFF", "IF_SAFER");
  }
  GDALDatasetH ds = GDALCreate(driver, file.c_str(), static_cast<int>(width),
                               static_cast<int>(height), band_count, gdal_type(dtype), opts.List());
  if (ds == nullptr) fail("cannot create raster '" + shown(path) + "'");
  Dataset owned(ds);
  std::array<double, 6> gt = affine.to_gdal();
  if (GDALSetGeoTransform(ds, gt.data()) != CE_None) {
    fail("cannot set the geotransform of '" + shown(path) + "'");
  }
  if (!wkt.empty() && GDALSetProjection(ds, wkt.c_str()) != CE_None) {
    fail("cannot set the CRS of '" + shown(path) + "'");
  }
  if (nodata) {
    for (int b = 1; b <= band_count; ++b) set_band_nodata(GDALGetRasterBand(ds, b), dtype, *nodata);
  }
  return owned;
}

/// The host pixels of @p raster: its own buffer when host resident, else a copy in @p scratch.
const void* host_pixels(const OwnedRasterArray& raster, std::vector<std::byte>& scratch) {
  if (raster.residency() == Residency::host && raster.host_data() != nullptr) {
    return raster.host_data();
  }
  scratch.resize(raster.byte_size());
  raster.copy_to_host(scratch.data());
  return scratch.data();
}

std::vector<int> all_bands(int n) {
  std::vector<int> v(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = i + 1;
  return v;
}

}  // namespace

bool io_available() noexcept {
  return true;
}

std::vector<std::string> default_input_drivers() {
  return {"GTiff", "PNG",  "JPEG",    "GIF",  "BMP",   "WEBP", "JP2OpenJPEG",
          "ENVI",  "EHdr", "AAIGrid", "GSBG", "GS7BG", "NITF"};
}

RasterMetadata read_raster_metadata(const std::string& path) {
  return read_raster_metadata(path, OpenOptions{});
}

RasterMetadata read_raster_metadata(const std::string& path, const OpenOptions& open) {
  QuietErrors quiet;
  Dataset ds = open_readonly(path, open);
  return metadata_of(ds.get(), path, {});
}

OwnedRasterArray read_raster(const std::string& path, std::optional<RasterWindow> window,
                             std::vector<int> bands) {
  return read_raster(path, window, std::move(bands), OpenOptions{});
}

OwnedRasterArray read_raster(const std::string& path, std::optional<RasterWindow> window,
                             std::vector<int> bands, const OpenOptions& open) {
  QuietErrors quiet;
  Dataset ds = open_readonly(path, open);
  return read_open(ds.get(), path, window, std::move(bands));
}

void write_raster(const std::string& path, const OwnedRasterArray& raster,
                  const WriteOptions& options) {
  QuietErrors quiet;
  std::vector<std::byte> scratch;
  const void* pixels = host_pixels(raster, scratch);
  detail::PendingOutput pending(path);  // declared before the dataset: removed after its close
  Dataset ds =
      create_dataset(pending.path(), path, raster.dtype(), raster.band_count(), raster.height(),
                     raster.width(), raster.nodata(), raster.affine(), raster.crs(), options);
  std::vector<int> bands = all_bands(raster.band_count());
  raster_io(ds.get(), GF_Write, RasterWindow{0, 0, raster.width(), raster.height()},
            const_cast<void*>(pixels), raster.dtype(), bands, raster.width(),
            raster.width() * raster.height(), path);
  close_checked(ds, path, quiet);
  pending.commit();
}

void process_raster_streamed(const std::string& in, const std::string& out, const BandOp& op,
                             const RasterPlan& plan, const WriteOptions& options,
                             std::function<void(std::int64_t, std::int64_t)> progress) {
  StreamOptions stream;
  stream.write = options;
  stream.progress = std::move(progress);
  process_raster_file(in, out, op, plan, stream);
}

void process_raster_file(const std::string& in, const std::string& out, const BandOp& op,
                         const RasterPlan& plan, const StreamOptions& stream) {
  const WriteOptions& options = stream.write;
  const auto& progress = stream.progress;
  if (!op) throw std::invalid_argument("process_raster_streamed: empty op");
  if (plan.halo < 0) {
    throw std::invalid_argument("process_raster_streamed: negative halo " +
                                std::to_string(plan.halo));
  }
  QuietErrors quiet;
  Dataset src = open_readonly(in, stream.open);
  const RasterMetadata meta = metadata_of(src.get(), in, {});
  std::int64_t th = meta.height, tw = meta.width;
  if (plan.strategy == TilingStrategy::tiled) {
    if (!plan.tile_shape || plan.tile_shape->first <= 0 || plan.tile_shape->second <= 0) {
      throw std::invalid_argument(
          "process_raster_streamed: tiled plan without a positive tile_shape");
    }
    th = std::min(plan.tile_shape->first, meta.height);
    tw = std::min(plan.tile_shape->second, meta.width);
  }
  const std::int64_t rows = (meta.height + th - 1) / th, cols = (meta.width + tw - 1) / tw;
  const std::int64_t total = rows * cols;
  const std::int64_t halo = plan.halo;

  // Declared before the output dataset, so that on an error the dataset is closed first and its
  // temporary file removed after.
  std::optional<detail::PendingOutput> pending;
  Dataset dst;
  DType out_dtype = DType::float32;
  int out_bands = 0;
  std::optional<double> out_nodata;
  std::vector<int> out_band_map;
  std::int64_t done = 0;
  for (std::int64_t r0 = 0; r0 < meta.height; r0 += th) {
    for (std::int64_t c0 = 0; c0 < meta.width; c0 += tw) {
      const std::int64_t eh = std::min(th, meta.height - r0), ew = std::min(tw, meta.width - c0);
      const std::int64_t pr0 = std::max<std::int64_t>(0, r0 - halo);
      const std::int64_t pc0 = std::max<std::int64_t>(0, c0 - halo);
      const std::int64_t pr1 = std::min(meta.height, r0 + eh + halo);
      const std::int64_t pc1 = std::min(meta.width, c0 + ew + halo);
      const RasterWindow phys{pc0, pr0, pc1 - pc0, pr1 - pr0};
      // The input tile is released before the result is written: one tile live at a time.
      const OwnedRasterArray result = [&] {
        const OwnedRasterArray tile = read_open(src.get(), in, phys, {});
        return op(tile);
      }();
      if (result.height() != phys.height || result.width() != phys.width) {
        throw std::invalid_argument(
            "process_raster_streamed: op returned " + std::to_string(result.height()) + " x " +
            std::to_string(result.width()) + " for a " + std::to_string(phys.height) + " x " +
            std::to_string(phys.width) + " tile");
      }
      if (!dst) {
        // Created from the first result: the output dtype and nodata are the op's.
        out_dtype = result.dtype();
        out_bands = result.band_count();
        out_nodata = result.nodata();
        out_band_map = all_bands(out_bands);
        pending.emplace(out);
        dst = create_dataset(pending->path(), out, out_dtype, out_bands, meta.height, meta.width,
                             out_nodata, meta.affine, meta.crs, options);
      } else if (result.dtype() != out_dtype || result.band_count() != out_bands ||
                 !same_nodata(result.nodata(), out_nodata)) {
        throw std::invalid_argument(
            "process_raster_streamed: tile " + std::to_string(done) +
            " result differs from the first tile's in dtype, band count or nodata");
      }
      std::vector<std::byte> scratch;
      const auto* base = static_cast<const std::byte*>(host_pixels(result, scratch));
      const std::size_t offset =
          static_cast<std::size_t>((r0 - pr0) * phys.width + (c0 - pc0)) * itemsize(out_dtype);
      raster_io(dst.get(), GF_Write, RasterWindow{c0, r0, ew, eh},
                const_cast<std::byte*>(base + offset), out_dtype, out_band_map, phys.width,
                phys.width * phys.height, out);
      // A failure reported off the calls' return values (e.g. an evicted block that could not be
      // written back) fails the run here, not at the end.
      quiet.check("cannot process '" + shown(in) + "' into '" + shown(out) + "'");
      ++done;
      if (progress) progress(done, total);
    }
  }
  close_checked(dst, out, quiet);
  src.reset();  // the input closed before the output replaces it (in place: the same file)
  pending->commit();
}

}  // namespace vibespatial::raster
