// SPDX-License-Identifier: Apache-2.0
// Raster files through GDAL, reading: opening, headers, types and nodata, windowed reads (io.hpp).
#include "common/byte_text.hpp"
#include "common/checked_math.hpp"
#include "common/expects.hpp"
#include "common/text_escape.hpp"
#include "io/gdal_common.hpp"

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/io.hpp>

#include <cpl_conv.h>
#include <cpl_error.h>
#include <cpl_string.h>
#include <gdal.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace vibespatial::raster {

namespace detail::gdal {

void register_drivers() {
  static std::once_flag once;
  std::call_once(once, [] { GDALAllRegister(); });
}

/// @p text (a path, a driver name, a CRS) as it goes into an exception message: printable, so
/// every message is valid UTF-8 without terminal control characters.
std::string shown(const std::string& text) {
  return detail::printable(text);
}

std::string gdal_message() {
  const char* msg = CPLGetLastErrorMsg();
  if (msg == nullptr || *msg == '\0') return {};
  return ": " + detail::printable(PendingOutput::without_temporaries(msg));
}

[[noreturn]] void fail(const std::string& what) {
  throw std::runtime_error(what + gdal_message());
}

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

bool driver_lists_option(GDALDriverH driver, const char* list, const char* name) {
  const char* known = GDALGetMetadataItem(driver, list, nullptr);
  if (known == nullptr) return false;
  const std::string single = std::string("name='") + name + "'";
  const std::string dbl = std::string("name=\"") + name + "\"";
  return std::strstr(known, single.c_str()) != nullptr ||
         std::strstr(known, dbl.c_str()) != nullptr;
}

/// NUM_THREADS=1 for the driver that will open @p path (among @p allowed) when it takes that
/// open option (GTiff): inputs are decoded on the thread that reads them, whatever
/// GDAL_NUM_THREADS says. GDAL 3.6's multi-threaded decoding deadlocks against a compressed
/// file written at the same time in the process (its decoding workers evict the output's
/// blocks, which wait for compression jobs queued behind them), as a streamed run does; reads
/// go in parallel on handles of their own instead (OpenOptions::num_threads).
CPLStringList one_decoding_thread(const std::string& path, const CPLStringList& allowed) {
  CPLStringList options;
  GDALDriverH driver = GDALIdentifyDriverEx(path.c_str(), GDAL_OF_RASTER, allowed.List(), nullptr);
  if (driver != nullptr && driver_lists_option(driver, GDAL_DMD_OPENOPTIONLIST, "NUM_THREADS")) {
    options.SetNameValue("NUM_THREADS", "1");
  }
  return options;
}

/// Opens @p path for reading as @p who (the public call, first in every message). A local file
/// that cannot be reached (missing, no permission) is a std::system_error with the errno; a file
/// that is there but not an allowed raster, or a refused virtual path, std::invalid_argument.
Dataset open_readonly(const std::string& path, const OpenOptions& open, const char* who) {
  register_drivers();
  const std::string cannot = std::string(who) + ": cannot open raster '" + shown(path) + "'";
  VSR_EXPECTS(open.allow_virtual || !is_virtual_path(path),
              cannot +
                  ": GDAL virtual file systems and URLs are refused unless allowed "
                  "(OpenOptions::allow_virtual; vsr-run --allow-virtual)");
  VSR_EXPECTS(path.find('\0') == std::string::npos,
              cannot + ": the path holds a NUL byte (GDAL would stop the path there)");
  // A FIFO, socket or device would block GDAL's open, or feed it without end: only regular
  // files (and directories, which drivers may take) are opened.
  if (struct stat st{}; !is_virtual_path(path) && ::stat(path.c_str(), &st) == 0 &&
                        !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
    throw std::invalid_argument(cannot + ": not a regular file (a FIFO, socket or device)");
  }
  std::vector<std::string> drivers = open.drivers.empty() ? default_input_drivers() : open.drivers;
  if (open.allow_virtual) drivers.emplace_back("VRT");
  CPLStringList allowed;
  for (const std::string& d : drivers) allowed.AddString(d.c_str());
  VSR_EXPECTS(open.num_threads >= -1, std::string(who) + ": OpenOptions::num_threads " +
                                          std::to_string(open.num_threads) +
                                          " is not -1 (every CPU), 0 (one) or positive");
  GDALDatasetH ds =
      GDALOpenEx(path.c_str(), GDAL_OF_RASTER | GDAL_OF_READONLY | GDAL_OF_VERBOSE_ERROR,
                 allowed.List(), one_decoding_thread(path, allowed).List(), nullptr);
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
  // Not found or not reachable: an I/O error, not a bad argument (GDAL's message says the same).
  if (struct stat st{}; !is_virtual_path(path) && ::stat(path.c_str(), &st) != 0) {
    throw std::system_error(errno, std::generic_category(), cannot);
  }
  throw std::invalid_argument(cannot + why);
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

/// The GDAL type that holds each dtype's bytes (Byte for int8 before GDAL 3.7), both ways.
struct GdalType {
  DType dtype;
  GDALDataType gdal;
};
constexpr GdalType kGdalTypes[] = {
    {DType::uint8, GDT_Byte},
#if VSR_GDAL_HAS_INT8
    {DType::int8, GDT_Int8},
#else
    {DType::int8, GDT_Byte},
#endif
    {DType::uint16, GDT_UInt16},   {DType::int16, GDT_Int16},     {DType::uint32, GDT_UInt32},
    {DType::int32, GDT_Int32},     {DType::uint64, GDT_UInt64},   {DType::int64, GDT_Int64},
    {DType::float32, GDT_Float32}, {DType::float64, GDT_Float64},
};

DType dtype_from_band(GDALRasterBandH band, const std::string& path) {
  const GDALDataType type = GDALGetRasterDataType(band);
  if (type == GDT_Byte) {
    // GDAL < 3.7 has no Int8: GTiff marks signed bytes in the IMAGE_STRUCTURE metadata.
    const char* pt = GDALGetMetadataItem(band, "PIXELTYPE", "IMAGE_STRUCTURE");
    return (pt != nullptr && std::strcmp(pt, "SIGNEDBYTE") == 0) ? DType::int8 : DType::uint8;
  }
  for (const GdalType& t : kGdalTypes) {
    if (t.gdal == type) return t.dtype;
  }
  throw std::runtime_error("raster '" + shown(path) + "' has GDAL data type " +
                           GDALGetDataTypeName(type) +
                           ", which vibespatial-raster does not support");
}

/// The GDAL type that holds @p dtype's bytes (Byte for int8 before GDAL 3.7).
GDALDataType gdal_type(DType dtype) {
  for (const GdalType& t : kGdalTypes) {
    if (t.dtype == dtype) return t.gdal;
  }
  throw std::invalid_argument("write_raster: bad dtype");
}

/// Band @p band's nodata, exactly: 64-bit integer rasters through GDAL's Int64/UInt64 calls
/// (GDALGetRasterNoDataValue would give INT64_MAX as the double 2^63).
std::optional<NodataValue> band_nodata(GDALRasterBandH band, DType dtype) {
  int has = 0;
  NodataValue value;
  if (dtype == DType::int64) {
    value = NodataValue::from_int64(GDALGetRasterNoDataValueAsInt64(band, &has));
  } else if (dtype == DType::uint64) {
    value = NodataValue::from_uint64(GDALGetRasterNoDataValueAsUInt64(band, &has));
  } else {
    value = GDALGetRasterNoDataValue(band, &has);
  }
  if (has == 0) return std::nullopt;
  return value;
}

/// Sets band @p band's nodata exactly: 64-bit integers through GDAL's Int64/UInt64 setters (the
/// double setter stores INT64_MAX as "9" and UINT64_MAX as "1"). A NaN nodata of a float band
/// that the driver cannot record (GPKG) is left unrecorded: NaN pixels are invalid all the same
/// (see ops.hpp, "Valid pixels").
void set_band_nodata(GDALRasterBandH band, DType dtype, const NodataValue& nodata) {
  CPLErr err = CE_None;
  std::string why;
  {
    QuietErrors own;  // this call's errors are judged here, not by the caller's QuietErrors
    if (const auto i = nodata.as_int64(); dtype == DType::int64 && i) {
      err = GDALSetRasterNoDataValueAsInt64(band, *i);
    } else if (const auto u = nodata.as_uint64(); dtype == DType::uint64 && u) {
      err = GDALSetRasterNoDataValueAsUInt64(band, *u);
    } else {
      err = GDALSetRasterNoDataValue(band, nodata.to_double());
    }
    why = gdal_message();
  }
  // A driver may report a failure and record the value all the same (GPKG's float coverages
  // in GDAL 3.6): what the band then holds decides.
  if (err == CE_None || band_nodata(band, dtype) == std::optional<NodataValue>(nodata)) {
    CPLErrorReset();
    return;
  }
  if (is_floating_point(dtype) && std::isnan(nodata.to_double())) {
    CPLErrorReset();
    return;
  }
  throw std::runtime_error("cannot set nodata " + nodata.to_string() + why);
}

/// Header of an open dataset; @p bands (1-based) select the bands checked for a common dtype
/// and nodata, all bands when empty.
RasterMetadata metadata_of(GDALDatasetH ds, const std::string& path, const std::vector<int>& bands,
                           bool mixed_nodata) {
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
  meta.exact_nodata = band_nodata(first, meta.dtype);
  if (meta.exact_nodata) meta.nodata = meta.exact_nodata->to_double();
  for (int b : selected) {
    GDALRasterBandH band = GDALGetRasterBand(ds, b);
    if (dtype_from_band(band, path) != meta.dtype) {
      throw std::runtime_error("raster '" + shown(path) + "': band " + std::to_string(b) +
                               " has a different data type than band " +
                               std::to_string(selected.front()));
    }
    if (!mixed_nodata && band_nodata(band, meta.dtype) != meta.exact_nodata) {
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

/// Band-major RasterIO of a (bands, h, w) buffer whose rows are @p line_elems elements apart and
/// whose bands are @p band_elems elements apart.
void raster_io(GDALDatasetH ds, GDALRWFlag flag, const RasterWindow& w, void* buf, DType dtype,
               std::vector<int>& bands, std::int64_t line_elems, std::int64_t band_elems,
               const std::string& path) {
  const auto item = static_cast<GSpacing>(itemsize(dtype));
  // A read of a band list other than 1..k goes band by band: GDAL 3.6's multi-threaded GTiff
  // decoding (GDAL_NUM_THREADS) crashes on one dataset read of such a list of a compressed
  // band-interleaved file (docs/tools.md, -b). Band reads share the block cache, so a
  // pixel-interleaved file is still decoded once per tile.
  bool prefix = true;
  for (std::size_t i = 0; i < bands.size(); ++i) prefix = prefix && bands[i] == int(i) + 1;
  CPLErr err = CE_None;
  if (flag == GF_Read && !prefix && bands.size() > 1) {
    auto* bytes = static_cast<unsigned char*>(buf);
    for (std::size_t i = 0; i < bands.size() && err == CE_None; ++i) {
      GDALRasterBandH band = GDALGetRasterBand(ds, bands[i]);
      err =
          band == nullptr
              ? CE_Failure
              : GDALRasterIOEx(band, flag, static_cast<int>(w.col_off), static_cast<int>(w.row_off),
                               static_cast<int>(w.width), static_cast<int>(w.height),
                               bytes + static_cast<std::ptrdiff_t>(i) * item * band_elems,
                               static_cast<int>(w.width), static_cast<int>(w.height),
                               gdal_type(dtype), item, item * line_elems, nullptr);
    }
  } else {
    err = GDALDatasetRasterIOEx(ds, flag, static_cast<int>(w.col_off), static_cast<int>(w.row_off),
                                static_cast<int>(w.width), static_cast<int>(w.height), buf,
                                static_cast<int>(w.width), static_cast<int>(w.height),
                                gdal_type(dtype), static_cast<int>(bands.size()), bands.data(),
                                item, item * line_elems, item * band_elems, nullptr);
  }
  if (err != CE_None) {
    fail(std::string(flag == GF_Read ? "cannot read" : "cannot write") + " raster '" + shown(path) +
         "'");
  }
}

std::string window_text(const RasterWindow& w, int bands, DType dtype) {
  return std::to_string(bands) + " x " + std::to_string(w.height) + " x " +
         std::to_string(w.width) + " " + std::string(to_string(dtype));
}

/// Reads @p window of @p bands; with @p check_memory, a read larger than the host memory
/// available is refused before anything is allocated (the streamed paths check their passes
/// up front instead).
OwnedRasterArray read_open(GDALDatasetH ds, const std::string& path,
                           std::optional<RasterWindow> window, std::vector<int> bands,
                           bool check_memory, bool mixed_nodata) {
  if (bands.empty()) {
    for (int b = 1; b <= GDALGetRasterCount(ds); ++b) bands.push_back(b);
  }
  const RasterMetadata meta = metadata_of(ds, path, bands, mixed_nodata);
  const RasterWindow w = window.value_or(RasterWindow{0, 0, meta.width, meta.height});
  if (w.width <= 0 || w.height <= 0 || w.col_off < 0 || w.row_off < 0 ||
      w.col_off > meta.width - w.width || w.row_off > meta.height - w.height) {
    throw std::invalid_argument(
        "window (col_off " + std::to_string(w.col_off) + ", row_off " + std::to_string(w.row_off) +
        ", width " + std::to_string(w.width) + ", height " + std::to_string(w.height) +
        ") is not inside raster '" + shown(path) + "' of " + std::to_string(meta.width) + " x " +
        std::to_string(meta.height) + " pixels");
  }
  const std::uint64_t bytes = detail::checked_mul(
      detail::checked_mul(
          static_cast<std::uint64_t>(w.width) * static_cast<std::uint64_t>(w.height),
          static_cast<std::uint64_t>(meta.band_count), "raster pixel count"),
      itemsize(meta.dtype), "raster byte count");
  if (check_memory) {
    const std::uint64_t limit = available_host_memory();
    if (bytes > limit) {
      throw HostMemoryLimitError(bytes, limit,
                                 "reading " + window_text(w, meta.band_count, meta.dtype) +
                                     " of '" + shown(path) + "' needs " + detail::byte_text(bytes) +
                                     " of host memory, more than the " + detail::byte_text(limit) +
                                     " available; read it in windows or tiles (process_raster_file,"
                                     " for_each_raster_tile)");
    }
  }
  std::optional<OwnedRasterArray> allocated;
  try {
    allocated = OwnedRasterArray::allocate(Residency::host, meta.dtype, meta.band_count, w.height,
                                           w.width, std::nullopt,
                                           meta.affine.shifted(w.col_off, w.row_off), meta.crs);
  } catch (const std::bad_alloc&) {
    // Memory taken meanwhile by someone else: still a host-memory error naming the read.
    const std::uint64_t limit = available_host_memory();
    throw HostMemoryLimitError(bytes, limit,
                               "reading " + window_text(w, meta.band_count, meta.dtype) + " of '" +
                                   shown(path) + "': out of host memory allocating its " +
                                   detail::byte_text(bytes) + " (" + detail::byte_text(limit) +
                                   " available)");
  }
  OwnedRasterArray out = allocated->with_nodata(meta.exact_nodata);
  raster_io(ds, GF_Read, w, out.mutable_host_data(), meta.dtype, bands, w.width, w.width * w.height,
            path);
  return out;
}

}  // namespace detail::gdal

using namespace detail::gdal;

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
  Dataset ds = open_readonly(path, open, "read_raster_metadata");
  return metadata_of(ds.get(), path, {});
}

OwnedRasterArray read_raster(const std::string& path, std::optional<RasterWindow> window,
                             std::vector<int> bands) {
  return read_raster(path, window, std::move(bands), OpenOptions{});
}

OwnedRasterArray read_raster(const std::string& path, std::optional<RasterWindow> window,
                             std::vector<int> bands, const OpenOptions& open) {
  QuietErrors quiet;
  Dataset ds = open_readonly(path, open, "read_raster");
  return read_open(ds.get(), path, window, std::move(bands));
}

RasterFileInfo read_raster_info(const std::string& path, const OpenOptions& open) {
  QuietErrors quiet;
  Dataset ds = open_readonly(path, open, "read_raster_info");
  RasterFileInfo info;
  info.metadata = metadata_of(ds.get(), path, {}, /*mixed_nodata=*/true);
  for (int b = 1; b <= GDALGetRasterCount(ds.get()); ++b) {
    info.band_nodata.push_back(band_nodata(GDALGetRasterBand(ds.get(), b), info.metadata.dtype));
  }
  std::array<double, 6> gt{};
  info.has_geotransform = GDALGetGeoTransform(ds.get(), gt.data()) == CE_None;
  int block_cols = 1, block_rows = 1;
  GDALGetBlockSize(GDALGetRasterBand(ds.get(), 1), &block_cols, &block_rows);
  info.block_shape = {std::max(1, block_rows), std::max(1, block_cols)};
  return info;
}

}  // namespace vibespatial::raster
