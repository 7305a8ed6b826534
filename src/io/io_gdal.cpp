// SPDX-License-Identifier: Apache-2.0
// Raster file I/O through GDAL's C API (io.hpp).
#include "common/byte_text.hpp"
#include "common/checked_math.hpp"
#include "common/expects.hpp"
#include "common/text_escape.hpp"
#include "io/output_file.hpp"

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/dispatch.hpp>
#include <vibespatial/raster/io.hpp>

#include <cpl_conv.h>
#include <cpl_error.h>
#include <cpl_string.h>
#include <gdal.h>
#include <gdal_version.h>
#include <ogr_srs_api.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
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

  /// The warnings GDAL reported since construction, joined with "; " (printable).
  std::string warnings() const { return detail::printable(warnings_); }

 private:
  static void CPL_STDCALL record(CPLErr type, CPLErrorNum /*num*/, const char* msg) {
    auto* self = static_cast<QuietErrors*>(CPLGetErrorHandlerUserData());
    if (self == nullptr) return;
    const char* text = msg != nullptr ? msg : "unknown GDAL error";
    try {
      if (type == CE_Warning) {
        self->warnings_.append(self->warnings_.empty() ? "" : "; ").append(text);
      } else if ((type == CE_Failure || type == CE_Fatal) && self->failures_++ == 0) {
        self->first_ = text;
      }
    } catch (...) {
    }
  }

  int failures_ = 0;
  std::string first_;
  std::string warnings_;
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
                           bool mixed_nodata = false) {
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

std::string window_text(const RasterWindow& w, int bands, DType dtype) {
  return std::to_string(bands) + " x " + std::to_string(w.height) + " x " +
         std::to_string(w.width) + " " + std::string(to_string(dtype));
}

/// Reads @p window of @p bands; with @p check_memory, a read larger than the host memory
/// available is refused before anything is allocated (the streamed paths check their passes
/// up front instead).
OwnedRasterArray read_open(GDALDatasetH ds, const std::string& path,
                           std::optional<RasterWindow> window, std::vector<int> bands,
                           bool check_memory = true, bool mixed_nodata = false) {
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

/// Checks @p opts against @p driver's creation option list (names, types, the values a choice
/// takes) before anything is created: GDAL itself only warns and then writes with the defaults
/// (COMPRESS=BOGUS gave an uncompressed file). Throws std::invalid_argument with its warnings.
void validate_creation_options(GDALDriverH driver, const std::string& driver_name,
                               const CPLStringList& opts, const char* who) {
  QuietErrors quiet;  // GDALValidateCreationOptions says what is wrong only as warnings
  if (GDALValidateCreationOptions(driver, opts.List()) == FALSE) {
    const std::string why = quiet.warnings();
    throw std::invalid_argument(std::string(who) + ": GDAL's " + shown(driver_name) +
                                " driver refuses the creation options: " +
                                (why.empty() ? std::string("invalid creation option") : why));
  }
}

/// Whether GDAL_SKIP (the configuration option or the environment variable) names @p driver.
bool skipped_by_config(const std::string& driver) {
  const char* skip = CPLGetConfigOption("GDAL_SKIP", nullptr);
  if (skip == nullptr) return false;
  const CPLStringList names(CSLTokenizeStringComplex(skip, " ,", FALSE, FALSE));
  for (int i = 0; i < names.size(); ++i) {
    if (EQUAL(names[i], driver.c_str())) return true;
  }
  return false;
}

/// The output driver @p options name, checked for what a write needs: GDAL has it, it writes
/// rasters, it creates a raster to write into piecewise (Create), and it writes a file. Its
/// short name as GDAL spells it goes to @p canonical ("gtiff" is GTiff).
/// @throws std::invalid_argument naming the reason, as @p who.
GDALDriverH output_driver(const WriteOptions& options, const char* who,
                          std::string* canonical = nullptr) {
  register_drivers();
  const std::string& name = options.driver;
  const std::string what = std::string(who) + ": GDAL driver '" + shown(name) + "'";
  if (name.empty()) throw std::invalid_argument(std::string(who) + ": no output driver given");
  GDALDriverH driver = GDALGetDriverByName(name.c_str());
  if (driver == nullptr) {
    if (skipped_by_config(name)) {
      throw std::invalid_argument(what + " is not available in this GDAL: GDAL_SKIP (" +
                                  shown(CPLGetConfigOption("GDAL_SKIP", "")) + ") disables it");
    }
    if (EQUAL(name.c_str(), "GTiff")) {
      // Built into every GDAL: missing only when deregistered (GDAL_SKIP, a plugin setup).
      throw std::invalid_argument(what +
                                  " is not available in this GDAL (it is built into every "
                                  "GDAL, so it was deregistered: GDAL_SKIP or the program)");
    }
    throw std::invalid_argument(std::string(who) + ": unknown GDAL driver '" + shown(name) +
                                "': this GDAL (" GDAL_RELEASE_NAME
                                ") has no driver of that name (misspelt, or a GDAL built "
                                "without it)");
  }
  const std::string real = GDALGetDriverShortName(driver);
  const std::string its = std::string(who) + ": GDAL's " + shown(real) + " driver";
  if (GDALGetMetadataItem(driver, GDAL_DCAP_RASTER, nullptr) == nullptr) {
    throw std::invalid_argument(its + " writes no rasters");
  }
  if (GDALGetMetadataItem(driver, GDAL_DCAP_CREATE, nullptr) == nullptr) {
    throw std::invalid_argument(
        its + " cannot create a raster to write into (it has no Create" +
        (GDALGetMetadataItem(driver, GDAL_DCAP_CREATECOPY, nullptr) != nullptr
             ? ", only CreateCopy: write GTiff and convert it with gdal_translate -of " + real
             : std::string()) +
        ")");
  }
  // A driver that writes no file on disk would leave nothing to rename into place: one that
  // connects to a service or database, or one that declares no file extension and does not
  // write through GDAL's file layer either (MEM keeps the raster in memory).
  if (const char* prefix = GDALGetMetadataItem(driver, GDAL_DMD_CONNECTION_PREFIX, nullptr);
      prefix != nullptr) {
    throw std::invalid_argument(its + " writes to a service or database (connection prefix '" +
                                shown(prefix) + "'), not to a file");
  }
  if (GDALGetMetadataItem(driver, GDAL_DMD_EXTENSION, nullptr) == nullptr &&
      GDALGetMetadataItem(driver, GDAL_DMD_EXTENSIONS, nullptr) == nullptr &&
      GDALGetMetadataItem(driver, GDAL_DCAP_VIRTUALIO, nullptr) == nullptr) {
    throw std::invalid_argument(its + (EQUAL(real.c_str(), "MEM")
                                           ? " keeps the raster in memory and writes no file"
                                           : " declares no file extension and no file I/O "
                                             "through GDAL: it may write no file, or a "
                                             "directory, and is not supported as an output"));
  }
  if (canonical != nullptr) *canonical = real;
  return driver;
}

/// Refuses a dtype @p driver does not create (its DMD_CREATIONDATATYPES), before anything is
/// created. The list lags behind the drivers for the types GDAL added late (GTiff of GDAL 3.6
/// writes Int64 and UInt64 without listing them): those are left to the driver's Create and to
/// what reads back.
void check_creation_dtype(GDALDriverH driver, DType dtype, const char* who) {
  const char* types = GDALGetMetadataItem(driver, GDAL_DMD_CREATIONDATATYPES, nullptr);
  if (types == nullptr) return;  // the driver does not say
  if (dtype == DType::int8 || dtype == DType::int64 || dtype == DType::uint64) return;
  const char* type = GDALGetDataTypeName(gdal_type(dtype));
  const CPLStringList list(CSLTokenizeString2(types, " ", 0));
  for (int i = 0; i < list.size(); ++i) {
    if (EQUAL(list[i], type)) return;
  }
  throw std::invalid_argument(std::string(who) + ": GDAL's " +
                              shown(GDALGetDriverShortName(driver)) + " driver cannot write " +
                              std::string(to_string(dtype)) + " (GDAL " + type + "); it writes " +
                              shown(types));
}

/// The creation options a write of @p band_count bands of @p dtype passes to @p driver (named
/// @p driver_name, GDAL's spelling), checked (validate_creation_options) before anything is
/// created.
CPLStringList creation_options(GDALDriverH driver, const std::string& driver_name,
                               const WriteOptions& options, DType dtype, int band_count,
                               const char* who) {
  const bool gtiff = driver_name == "GTiff";
  CPLStringList opts;
  if (gtiff) {
    if (!options.compress.empty()) opts.SetNameValue("COMPRESS", options.compress.c_str());
    if (options.tiled) {
      if (options.block < 16 || options.block % 16 != 0) {
        throw std::invalid_argument(std::string(who) +
                                    ": a GeoTIFF tile side must be a positive "
                                    "multiple of 16, not " +
                                    std::to_string(options.block));
      }
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
  // NUM_THREADS only where the driver takes it (GTiff does), so others warn about nothing.
  const char* known = GDALGetMetadataItem(driver, GDAL_DMD_CREATIONOPTIONLIST, nullptr);
  if (options.num_threads != 0 && known != nullptr &&
      (std::strstr(known, "name='NUM_THREADS'") != nullptr ||
       std::strstr(known, "name=\"NUM_THREADS\"") != nullptr)) {
    opts.SetNameValue("NUM_THREADS", options.num_threads < 0
                                         ? "ALL_CPUS"
                                         : std::to_string(options.num_threads).c_str());
  }
  for (const std::string& kv : options.creation_options) {
    const std::size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw std::invalid_argument(std::string(who) + ": creation option '" + shown(kv) +
                                  "' is not KEY=VALUE");
    }
    opts.SetNameValue(kv.substr(0, eq).c_str(), kv.substr(eq + 1).c_str());
  }
  validate_creation_options(driver, driver_name, opts, who);
  return opts;
}

/// Creates the dataset @p file (the temporary file of @p path, which messages name), as @p who.
/// @throws std::invalid_argument for what the driver refuses before anything is written: a
/// driver, dtype or creation option it does not take, a CRS GDAL does not understand, or a
/// driver that made no file at @p file (it writes elsewhere, or nowhere).
Dataset create_dataset(const std::string& file, const std::string& path, DType dtype,
                       int band_count, std::int64_t height, std::int64_t width,
                       const std::optional<NodataValue>& nodata, const Affine* affine,
                       const std::string& crs, const WriteOptions& options, const char* who) {
  register_drivers();
  if (height > INT_MAX || width > INT_MAX) {
    throw std::invalid_argument(std::string(who) + ": " + std::to_string(width) + " x " +
                                std::to_string(height) + " exceeds GDAL's size limit");
  }
  std::string name;
  GDALDriverH driver = output_driver(options, who, &name);
  const bool gtiff = name == "GTiff";
  if (dtype == DType::int8 && !VSR_GDAL_HAS_INT8 && !gtiff) {
    throw std::invalid_argument(std::string(who) + ": int8 needs GDAL >= 3.7 for driver '" +
                                shown(name) + "' (this GDAL is " GDAL_RELEASE_NAME ")");
  }
  check_creation_dtype(driver, dtype, who);
  std::string wkt;
  if (!crs.empty()) {
    OGRSpatialReferenceH srs = OSRNewSpatialReference(nullptr);
    char* text = nullptr;
    const bool ok = OSRSetFromUserInput(srs, crs.c_str()) == OGRERR_NONE &&
                    OSRExportToWkt(srs, &text) == OGRERR_NONE;
    if (text != nullptr) wkt = text;
    CPLFree(text);
    OSRDestroySpatialReference(srs);
    if (!ok) {
      throw std::invalid_argument(std::string(who) + ": GDAL does not understand CRS '" +
                                  shown(crs) + "'");
    }
  }

  const CPLStringList opts = creation_options(driver, name, options, dtype, band_count, who);
  GDALDatasetH ds = GDALCreate(driver, file.c_str(), static_cast<int>(width),
                               static_cast<int>(height), band_count, gdal_type(dtype), opts.List());
  if (ds == nullptr) fail("cannot create raster '" + shown(path) + "'");
  Dataset owned(ds);
  // A driver that made a directory there (Zarr) writes no file to rename into place: refused
  // now, before any pixel is written. One that made nothing yet may write at close (PDS4's
  // label): the file is verified after the close (verify_written, PendingOutput::commit).
  if (struct stat st{}; ::lstat(file.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    throw std::invalid_argument(std::string(who) + ": GDAL's " + shown(name) +
                                " driver made a directory, not a file, for '" + shown(path) +
                                "': it cannot write outputs (they are files)");
  }
  if (affine != nullptr) {
    std::array<double, 6> gt = affine->to_gdal();
    if (GDALSetGeoTransform(ds, gt.data()) != CE_None) {
      fail("cannot set the geotransform of '" + shown(path) + "'");
    }
  }
  if (!wkt.empty() && GDALSetProjection(ds, wkt.c_str()) != CE_None) {
    fail("cannot set the CRS of '" + shown(path) + "'");
  }
  if (nodata) {
    for (int b = 1; b <= band_count; ++b) set_band_nodata(GDALGetRasterBand(ds, b), dtype, *nodata);
  }
  return owned;
}

/// Checks the closed output @p file of @p path before it is committed: GDAL's @p driver opens
/// it as a raster of @p width x @p height of @p dtype with a band for each of @p nodata, and
/// each band keeps the nodata written to it (a NaN nodata of a float band may go unrecorded:
/// NaN pixels are invalid all the same; a band written without one may read one, the driver's
/// fixed sentinel). What cannot be read back as written is never put in place: pixels that
/// were nodata would read as valid values.
/// @throws std::runtime_error when it does not.
void verify_written(const std::string& file, const std::string& path, const std::string& driver,
                    std::int64_t height, std::int64_t width, DType dtype,
                    const std::vector<std::optional<NodataValue>>& nodata) {
  const int band_count = static_cast<int>(nodata.size());
  CPLStringList allowed;
  allowed.AddString(driver.c_str());
  Dataset ds(GDALOpenEx(file.c_str(), GDAL_OF_RASTER | GDAL_OF_READONLY | GDAL_OF_VERBOSE_ERROR,
                        allowed.List(), nullptr, nullptr));
  const std::string cannot =
      "cannot write '" + shown(path) + "': GDAL's " + shown(driver) + " driver";
  if (!ds) fail(cannot + " cannot open the file it wrote");
  if (GDALGetRasterXSize(ds.get()) != width || GDALGetRasterYSize(ds.get()) != height ||
      GDALGetRasterCount(ds.get()) != band_count) {
    throw std::runtime_error(cannot + " reads back " +
                             std::to_string(GDALGetRasterCount(ds.get())) + " band(s) of " +
                             std::to_string(GDALGetRasterYSize(ds.get())) + " x " +
                             std::to_string(GDALGetRasterXSize(ds.get())) +
                             " from the file it wrote, not " + std::to_string(band_count) + " of " +
                             std::to_string(height) + " x " + std::to_string(width));
  }
  for (int b = 1; b <= band_count; ++b) {
    const std::optional<NodataValue>& wrote = nodata[static_cast<std::size_t>(b - 1)];
    if (!wrote) continue;
    const std::optional<NodataValue> reads = band_nodata(GDALGetRasterBand(ds.get(), b), dtype);
    if (reads == wrote) continue;
    if (is_floating_point(dtype) && std::isnan(wrote->to_double()) && !reads) continue;
    throw std::runtime_error(cannot + " does not keep band " + std::to_string(b) + "'s nodata " +
                             wrote->to_string() + " (it reads back " +
                             (reads ? reads->to_string() : std::string("none")) +
                             "): its nodata pixels would read as valid values");
  }
}

/// The host pixels of @p raster: its own buffer when host resident, else a copy in @p scratch
/// (checked against the host memory available first).
const void* host_pixels(const OwnedRasterArray& raster, std::vector<std::byte>& scratch,
                        const char* who) {
  if (raster.residency() == Residency::host && raster.host_data() != nullptr) {
    return raster.host_data();
  }
  const std::uint64_t bytes = raster.byte_size();
  const std::uint64_t limit = available_host_memory();
  const std::string what = window_text(RasterWindow{0, 0, raster.width(), raster.height()},
                                       raster.band_count(), raster.dtype());
  if (bytes > limit) {
    throw HostMemoryLimitError(bytes, limit,
                               std::string(who) + ": the host copy of a device raster (" + what +
                                   ") needs " + detail::byte_text(bytes) +
                                   " of host memory, more than the " + detail::byte_text(limit) +
                                   " available");
  }
  try {
    scratch.resize(raster.byte_size());
  } catch (const std::bad_alloc&) {
    throw HostMemoryLimitError(bytes, limit,
                               std::string(who) + ": out of host memory allocating the " +
                                   detail::byte_text(bytes) + " host copy of a device raster (" +
                                   what + ")");
  }
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

void check_write_options(const WriteOptions& options) {
  static constexpr const char* who = "check_write_options";
  QuietErrors quiet;
  std::string name;
  GDALDriverH driver = output_driver(options, who, &name);
  (void)creation_options(driver, name, options, DType::float32, 1, who);
}

void check_output_file(const std::string& path, const WriteOptions& options, DType dtype,
                       int band_count, const std::optional<NodataValue>& nodata,
                       const std::string& crs) {
  static constexpr const char* who = "check_output_file";
  VSR_EXPECTS(band_count >= 1,
              std::string(who) + ": band_count " + std::to_string(band_count) + " < 1");
  QuietErrors quiet;
  std::string name;
  GDALDriverH driver = output_driver(options, who, &name);
  (void)creation_options(driver, name, options, dtype, band_count, who);
  check_creation_dtype(driver, dtype, who);
  // The trial raster: small, so that drivers that fill a new file up front write little, in
  // small GeoTIFF tiles (the block options were checked above; a 256 x 256 block per band of a
  // 500-band trial would hold 128 MiB).
  constexpr std::int64_t side = 16;
  WriteOptions trial = options;
  trial.block = 16;
  std::erase_if(trial.creation_options, [](const std::string& kv) {
    return kv.rfind("BLOCKXSIZE=", 0) == 0 || kv.rfind("BLOCKYSIZE=", 0) == 0;
  });
  // Band b holds 10 + 10 * (b % 11) (3 more where the nodata is one of those), a value every
  // dtype holds: what reads back tells a band lost, swapped or filled with other memory (MRF
  // pixel-interleaved, written band by band) from a lossy codec's small error.
  const double shift = nodata && std::fmod(nodata->to_double(), 10.0) == 0.0 &&
                               nodata->to_double() >= 10 && nodata->to_double() <= 110
                           ? 3.0
                           : 0.0;
  const auto band_value = [&](int b) { return 10.0 + 10.0 * (b % 11) + shift; };
  const std::string wrote = std::to_string(band_count) + " band(s) of " +
                            std::string(to_string(dtype)) +
                            (nodata ? " with nodata " + nodata->to_string() : std::string());
  detail::PendingOutput pending(path, options.overwrite);  // never committed: removed
  {
    Dataset ds;
    try {
      // Georeferenced, as most outputs are (GPKG needs a geotransform).
      const Affine affine{1, 0, 0, 0, -1, side};
      ds = create_dataset(pending.path(), path, dtype, band_count, side, side, nodata, &affine, crs,
                          trial, who);
      std::vector<double> pixels(static_cast<std::size_t>(side * side * band_count));
      for (int b = 0; b < band_count; ++b) {
        std::fill_n(pixels.begin() + static_cast<std::ptrdiff_t>(b * side * side), side * side,
                    band_value(b));
      }
      std::vector<int> bands = all_bands(band_count);
      const auto io = [&](GDALDatasetH h, GDALRWFlag flag) {
        return GDALDatasetRasterIOEx(h, flag, 0, 0, static_cast<int>(side), static_cast<int>(side),
                                     pixels.data(), static_cast<int>(side), static_cast<int>(side),
                                     GDT_Float64, band_count, bands.data(), sizeof(double),
                                     sizeof(double) * side, sizeof(double) * side * side, nullptr);
      };
      // Band by band, each flushed before the next, as a per-band streamed run writes (a pass
      // of one band, its blocks evicted from GDAL's cache before the next pass).
      for (int b = 0; b < band_count; ++b) {
        const CPLErr err = GDALRasterIO(
            GDALGetRasterBand(ds.get(), b + 1), GF_Write, 0, 0, static_cast<int>(side),
            static_cast<int>(side), pixels.data() + static_cast<std::ptrdiff_t>(b * side * side),
            static_cast<int>(side), static_cast<int>(side), GDT_Float64, 0, 0);
        if (err != CE_None) fail("cannot write raster '" + shown(path) + "'");
        GDALFlushCache(ds.get());
      }
      close_checked(ds, path, quiet);
      verify_written(
          pending.path(), path, name, side, side, dtype,
          std::vector<std::optional<NodataValue>>(static_cast<std::size_t>(band_count), nodata));
      CPLStringList allowed;
      allowed.AddString(name.c_str());
      Dataset back(GDALOpenEx(pending.path().c_str(), GDAL_OF_RASTER | GDAL_OF_READONLY,
                              allowed.List(), nullptr, nullptr));
      std::fill(pixels.begin(), pixels.end(), std::nan(""));
      if (!back || io(back.get(), GF_Read) != CE_None) {
        fail("cannot write '" + shown(path) + "': GDAL's " + shown(name) +
             " driver cannot read back the pixels it wrote");
      }
      for (int b = 0; b < band_count; ++b) {
        for (std::int64_t k = 0; k < side * side; ++k) {
          const double got = pixels[static_cast<std::size_t>(b * side * side + k)];
          if (!(std::fabs(got - band_value(b)) <= 3.0)) {
            char text[120];
            std::snprintf(text, sizeof text, "reads back %.17g in band %d where %g was written",
                          got, b + 1, band_value(b));
            throw std::runtime_error("GDAL's " + shown(name) + " driver " + text +
                                     ": it does not keep the pixels of " + wrote);
          }
        }
      }
    } catch (const std::invalid_argument&) {
      throw;
    } catch (const std::runtime_error& e) {
      // GDAL refused the raster itself (a band count or size the format cannot hold).
      std::string why = e.what();
      const std::string prefix = "cannot write '" + shown(path) + "': ";
      if (why.rfind(prefix, 0) == 0) why.erase(0, prefix.size());
      throw std::invalid_argument(std::string(who) + ": GDAL's " + shown(name) +
                                  " driver cannot write " + wrote + " to '" + shown(path) +
                                  "': " + why);
    }
  }
}

void write_raster(const std::string& path, const OwnedRasterArray& raster,
                  const WriteOptions& options) {
  static constexpr const char* who = "write_raster";
  QuietErrors quiet;
  {
    // What the driver refuses, refused before anything is touched.
    std::string name;
    GDALDriverH driver = output_driver(options, who, &name);
    check_creation_dtype(driver, raster.dtype(), who);
    (void)creation_options(driver, name, options, raster.dtype(), raster.band_count(), who);
  }
  std::vector<std::byte> scratch;
  const void* pixels = host_pixels(raster, scratch, who);
  detail::PendingOutput pending(path, options.overwrite);  // before the dataset: removed after it
  Dataset ds = create_dataset(pending.path(), path, raster.dtype(), raster.band_count(),
                              raster.height(), raster.width(), raster.exact_nodata(),
                              &raster.affine(), raster.crs(), options, who);
  std::vector<int> bands = all_bands(raster.band_count());
  raster_io(ds.get(), GF_Write, RasterWindow{0, 0, raster.width(), raster.height()},
            const_cast<void*>(pixels), raster.dtype(), bands, raster.width(),
            raster.width() * raster.height(), path);
  close_checked(ds, path, quiet);
  verify_written(pending.path(), path, GDALGetDriverShortName(output_driver(options, who)),
                 raster.height(), raster.width(), raster.dtype(),
                 std::vector<std::optional<NodataValue>>(
                     static_cast<std::size_t>(raster.band_count()), raster.exact_nodata()));
  pending.commit(options.overwrite);
}

void process_raster_streamed(const std::string& in, const std::string& out, const BandOp& op,
                             const RasterPlan& plan, const WriteOptions& options,
                             std::function<void(std::int64_t, std::int64_t)> progress) {
  StreamOptions stream;
  stream.write = options;
  stream.progress = std::move(progress);
  process_raster_file(in, out, op, plan, stream);
}

namespace {

/// How a streamed run goes through a file: its passes (runs of selected bands) and tiles.
struct StreamLayout {
  std::vector<int> bands;                               ///< selected, 1-based
  std::vector<std::optional<NodataValue>> band_nodata;  ///< of each selected band
  struct Pass {
    int first = 0, count = 0;  ///< positions among the selected bands
  };
  std::vector<Pass> passes;
  std::int64_t th = 0, tw = 0, rows = 0, cols = 0, halo = 0;
  bool per_band = false;  ///< bands are independent: each pass's result goes to its own bands
  bool mixed_nodata = false;
  std::int64_t tiles_per_pass() const { return rows * cols; }
  std::int64_t total() const { return static_cast<std::int64_t>(passes.size()) * rows * cols; }
  int max_pass_bands() const {
    int m = 0;
    for (const Pass& p : passes) m = std::max(m, p.count);
    return m;
  }
};

StreamLayout layout_of(GDALDatasetH ds, const RasterMetadata& meta, const RasterPlan& plan,
                       const StreamOptions& options, const char* who) {
  if (plan.halo < 0) {
    throw std::invalid_argument(std::string(who) + ": negative halo " + std::to_string(plan.halo));
  }
  if (plan.bands_per_pass < 1) {
    throw std::invalid_argument(std::string(who) + ": bands_per_pass " +
                                std::to_string(plan.bands_per_pass) + " < 1");
  }
  StreamLayout l;
  l.bands = options.bands.empty() ? all_bands(GDALGetRasterCount(ds)) : options.bands;
  for (const int b : l.bands) {
    l.band_nodata.push_back(band_nodata(GDALGetRasterBand(ds, b), meta.dtype));
    l.mixed_nodata = l.mixed_nodata || l.band_nodata.back() != l.band_nodata.front();
  }
  const int n = static_cast<int>(l.bands.size());
  // A whole plan is one pass whatever bands_per_pass says (a default RasterPlan says 1).
  l.per_band =
      options.per_band || (plan.strategy != TilingStrategy::whole && plan.bands_per_pass < n);
  if (l.per_band) {
    // Runs of at most bands_per_pass consecutive bands of one nodata.
    const int most = options.per_band && plan.strategy == TilingStrategy::whole
                         ? n
                         : std::min(plan.bands_per_pass, n);
    for (int b = 0; b < n; ++b) {
      const auto i = static_cast<std::size_t>(b);
      if (l.passes.empty() || l.passes.back().count >= most ||
          l.band_nodata[i] != l.band_nodata[static_cast<std::size_t>(l.passes.back().first)]) {
        l.passes.push_back({b, 1});
      } else {
        ++l.passes.back().count;
      }
    }
  } else {
    l.passes.push_back({0, n});
  }
  l.th = meta.height;
  l.tw = meta.width;
  if (plan.strategy == TilingStrategy::tiled) {
    if (!plan.tile_shape || plan.tile_shape->first <= 0 || plan.tile_shape->second <= 0) {
      throw std::invalid_argument(std::string(who) + ": tiled plan without a positive tile_shape");
    }
    l.th = std::min(plan.tile_shape->first, meta.height);
    l.tw = std::min(plan.tile_shape->second, meta.width);
  }
  l.halo = plan.halo;
  l.rows = (meta.height + l.th - 1) / l.th;
  l.cols = (meta.width + l.tw - 1) / l.tw;
  return l;
}

bool pixel_interleaved(GDALDatasetH ds) {
  const char* interleave = GDALGetMetadataItem(ds, "INTERLEAVE", "IMAGE_STRUCTURE");
  return interleave != nullptr && std::strcmp(interleave, "PIXEL") == 0;
}

/// Bytes of one GDAL block of @p ds holding one band's data: the block of band 1, times the band
/// count when the file interleaves pixels (a block then carries every band).
std::uint64_t block_bytes(GDALDatasetH ds) {
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

std::uint64_t cache_for(GDALDatasetH ds, const RasterMetadata& meta, const StreamLayout& l) {
  GDALRasterBandH band = GDALGetRasterBand(ds, 1);
  int bx = 0, by = 0;
  GDALGetBlockSize(band, &bx, &by);
  const std::uint64_t block = block_bytes(ds);
  // The blocks under one row of tiles (halo included) of the bands of one pass, so that a block
  // shared by neighbouring tiles is decoded once.
  const std::uint64_t block_rows =
      static_cast<std::uint64_t>((l.th + 2 * l.halo + by - 1) / std::max(by, 1) + 1);
  const std::uint64_t blocks_across =
      static_cast<std::uint64_t>((meta.width + bx - 1) / std::max(bx, 1));
  const std::uint64_t row = detail::checked_mul(
      detail::checked_mul(block_rows, blocks_across, "cache size"),
      pixel_interleaved(ds)
          ? block
          : detail::checked_mul(block, static_cast<std::uint64_t>(l.max_pass_bands()), "cache"),
      "cache size");
  const std::uint64_t floor = detail::checked_mul(block, 2, "cache size");
  return std::clamp(row, floor, detail::checked_add(floor, cache_headroom, "cache size"));
}

/// Refuses up front a run whose pass needs more host memory than the limit.
void check_pass_memory(GDALDatasetH ds, const RasterMetadata& meta, const StreamLayout& l,
                       const StreamOptions& options, const std::string& path, const char* who) {
  const std::uint64_t ph = static_cast<std::uint64_t>(std::min(meta.height, l.th + 2 * l.halo));
  const std::uint64_t pw = static_cast<std::uint64_t>(std::min(meta.width, l.tw + 2 * l.halo));
  const int bands = l.max_pass_bands();
  const std::uint64_t px =
      detail::checked_mul(detail::checked_mul(ph, pw, "tile pixel count"),
                          static_cast<std::uint64_t>(bands), "tile pixel count");
  // The tile, and twice a result of up to 8 bytes a pixel (the result and a stacked or host copy).
  const std::uint64_t tile = detail::checked_mul(px, itemsize(meta.dtype) + 16, "pass bytes");
  const std::uint64_t cache =
      options.gdal_cache_bytes
          ? *options.gdal_cache_bytes
          : static_cast<std::uint64_t>(std::max<GIntBig>(0, GDALGetCacheMax64()));
  // GDAL decodes whole blocks: at least one is held beside the cache.
  const std::uint64_t needed = detail::checked_add(detail::checked_add(tile, cache, "pass bytes"),
                                                   block_bytes(ds), "pass bytes");
  const std::uint64_t limit =
      options.host_memory_limit != 0 ? options.host_memory_limit : available_host_memory();
  if (needed > limit) {
    throw HostMemoryLimitError(
        needed, limit,
        std::string(who) + ": a pass over '" + shown(path) + "' (" + std::to_string(bands) +
            " band(s) of " + std::to_string(ph) + " x " + std::to_string(pw) + " " +
            std::string(to_string(meta.dtype)) + ", GDAL blocks of " +
            detail::byte_text(block_bytes(ds)) + ", cache " + detail::byte_text(cache) +
            ") needs " + detail::byte_text(needed) + " of host memory, more than the " +
            detail::byte_text(limit) +
            (options.host_memory_limit != 0 ? " allowed" : " available") +
            "; plan smaller tiles (a smaller budget) or fewer bands per pass");
  }
}

/// Opens @p in, lays out the run and checks its memory; the caller then walks the tiles.
struct OpenStream {
  Dataset src;
  RasterMetadata meta;
  StreamLayout layout;
  bool has_geotransform = true;
};

OpenStream open_stream(const std::string& in, const RasterPlan& plan, const StreamOptions& options,
                       const char* who) {
  OpenStream s;
  s.src = open_readonly(in, options.open, who);
  s.meta = metadata_of(s.src.get(), in, options.bands, /*mixed_nodata=*/true);
  std::array<double, 6> gt{};
  s.has_geotransform = GDALGetGeoTransform(s.src.get(), gt.data()) == CE_None;
  CPLErrorReset();
  s.layout = layout_of(s.src.get(), s.meta, plan, options, who);
  if (!s.layout.per_band && s.layout.mixed_nodata && !options.mixed_nodata) {
    throw std::runtime_error(std::string(who) + ": the bands of '" + shown(in) +
                             "' differ in nodata and the op takes them together: select bands "
                             "of one nodata, or set StreamOptions::mixed_nodata and take each "
                             "band's nodata from read_raster_info");
  }
  check_pass_memory(s.src.get(), s.meta, s.layout, options, in, who);
  if (options.gdal_cache_bytes) GDALSetCacheMax64(static_cast<GIntBig>(*options.gdal_cache_bytes));
  return s;
}

/// Tile (@p row, @p col) of the layout, as tile_windows makes it (the same windows in the same
/// row-major order), computed when it is reached: no list of tiles is held, so a raster of
/// billions of tiles costs no memory for them.
TileWindow tile_at(const RasterMetadata& meta, const StreamLayout& l, std::int64_t row,
                   std::int64_t col) {
  const std::int64_t r0 = row * l.th, c0 = col * l.tw;
  TileWindow t;
  t.window =
      RasterWindow{c0, r0, std::min(l.tw, meta.width - c0), std::min(l.th, meta.height - r0)};
  const std::int64_t pr0 = std::max<std::int64_t>(0, r0 - l.halo);
  const std::int64_t pc0 = std::max<std::int64_t>(0, c0 - l.halo);
  const std::int64_t pr1 = std::min(meta.height, r0 + t.window.height + l.halo);
  const std::int64_t pc1 = std::min(meta.width, c0 + t.window.width + l.halo);
  t.read = RasterWindow{pc0, pr0, pc1 - pc0, pr1 - pr0};
  return t;
}

/// Calls @p f(tile, where) for every tile of every pass, one tile live at a time.
template <class F>
void walk_tiles(const OpenStream& s, const std::string& in, const StreamOptions& options, F&& f) {
  const StreamLayout& l = s.layout;
  const RasterMetadata& meta = s.meta;
  std::int64_t index = 0;
  for (const StreamLayout::Pass& pass : l.passes) {
    const std::vector<int> pass_bands(l.bands.begin() + pass.first,
                                      l.bands.begin() + pass.first + pass.count);
    for (std::int64_t row = 0; row < l.rows; ++row) {
      for (std::int64_t col = 0; col < l.cols; ++col) {
        const TileWindow tile = tile_at(meta, l, row, col);
        TileInfo where;
        where.index = index++;
        where.total = l.total();
        where.window = tile.window;
        where.read = tile.read;
        where.first_band = pass.first;
        where.band_count = pass.count;
        if (options.stage) options.stage(where, TileStage::read);
        f(read_open(s.src.get(), in, where.read, pass_bands, false, true), where);
      }
    }
  }
}

/// Copies what options.metadata names from @p src to the new output @p dst, as far as its format
/// holds it.
void copy_metadata(GDALDatasetH src, GDALDatasetH dst, const StreamLayout& l, int out_bands,
                   MetadataCopy what) {
  if (what == MetadataCopy::none) return;
  // Descriptive metadata goes where the format can hold it: a driver that cannot (RMF has no
  // colour interpretation) fails neither the run nor the file.
  QuietErrors ignored;
  if (const char* aop = GDALGetMetadataItem(src, "AREA_OR_POINT", nullptr); aop != nullptr) {
    GDALSetMetadataItem(dst, "AREA_OR_POINT", aop, nullptr);
  }
  if (out_bands != static_cast<int>(l.bands.size())) return;
  for (int b = 0; b < out_bands; ++b) {
    GDALRasterBandH from = GDALGetRasterBand(src, l.bands[static_cast<std::size_t>(b)]);
    GDALRasterBandH to = GDALGetRasterBand(dst, b + 1);
    if (const char* d = GDALGetDescription(from); d != nullptr && *d != '\0') {
      GDALSetDescription(to, d);
    }
    if (const GDALColorInterp ci = GDALGetRasterColorInterpretation(from); ci != GCI_Undefined) {
      GDALSetRasterColorInterpretation(to, ci);
    }
    if (what != MetadataCopy::all) continue;
    int has = 0;
    if (const double scale = GDALGetRasterScale(from, &has); has != 0) {
      GDALSetRasterScale(to, scale);
    }
    if (const double offset = GDALGetRasterOffset(from, &has); has != 0) {
      GDALSetRasterOffset(to, offset);
    }
    if (const char* unit = GDALGetRasterUnitType(from); unit != nullptr && *unit != '\0') {
      GDALSetRasterUnitType(to, unit);
    }
  }
}

}  // namespace

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
  return info;
}

std::string output_driver_for(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  const std::size_t dot = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return "";
  std::string ext = path.substr(dot + 1);
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (ext == "tif" || ext == "tiff") return "GTiff";
  register_drivers();
  for (int i = 0; i < GDALGetDriverCount(); ++i) {
    GDALDriverH d = GDALGetDriver(i);
    if (GDALGetMetadataItem(d, GDAL_DCAP_RASTER, nullptr) == nullptr ||
        GDALGetMetadataItem(d, GDAL_DCAP_CREATE, nullptr) == nullptr) {
      continue;
    }
    const char* exts = GDALGetMetadataItem(d, GDAL_DMD_EXTENSIONS, nullptr);
    if (exts == nullptr) continue;
    const CPLStringList list(CSLTokenizeString2(exts, " ", 0));
    for (int k = 0; k < list.size(); ++k) {
      if (EQUAL(list[k], ext.c_str())) return GDALGetDriverShortName(d);
    }
  }
  return "";
}

std::uint64_t gdal_cache_for_plan(const std::string& in, const RasterPlan& plan,
                                  const StreamOptions& options) {
  QuietErrors quiet;
  Dataset src = open_readonly(in, options.open, "gdal_cache_for_plan");
  const RasterMetadata meta = metadata_of(src.get(), in, options.bands, true);
  return cache_for(src.get(), meta,
                   layout_of(src.get(), meta, plan, options, "gdal_cache_for_plan"));
}

void process_raster_file(const std::string& in, const std::string& out, const BandOp& op,
                         const RasterPlan& plan, const StreamOptions& options) {
  static constexpr const char* who = "process_raster_file";
  if (!op) throw std::invalid_argument(std::string(who) + ": empty op");
  QuietErrors quiet;
  std::string driver_name;
  {
    // What the driver refuses, refused before anything is read (the dtype once it is known).
    GDALDriverH driver = output_driver(options.write, who, &driver_name);
    (void)creation_options(driver, driver_name, options.write, DType::float32, 1, who);
  }
  OpenStream s = open_stream(in, plan, options, who);
  const StreamLayout& l = s.layout;
  const bool gtiff = driver_name == "GTiff";

  // Made before anything is computed (a directory that takes no temporary fails first), and
  // declared before the output dataset, so that on an error the dataset is closed first and its
  // temporary files removed after.
  detail::PendingOutput pending(out, options.write.overwrite);
  Dataset dst;
  DType out_dtype = DType::float32;
  int out_bands = 0;
  std::optional<NodataValue> out_nodata;                   // of the current pass's result
  std::vector<std::optional<NodataValue>> written_nodata;  // each output band's
  std::optional<NodataValue> file_nodata;  // GTiff: the one nodata the file has, once set
  bool file_nodata_set = false;
  std::int64_t pass_first_tile = -1;
  walk_tiles(s, in, options, [&](OwnedRasterArray tile_in, const TileInfo& where) {
    if (options.stage) options.stage(where, TileStage::compute);
    // The input tile is released before the result is written: one tile live at a time.
    const OwnedRasterArray result = [&] {
      const OwnedRasterArray tile = std::move(tile_in);
      return op(tile);
    }();
    const RasterWindow& phys = where.read;
    if (result.height() != phys.height || result.width() != phys.width) {
      throw std::invalid_argument(
          std::string(who) + ": op returned " + std::to_string(result.height()) + " x " +
          std::to_string(result.width()) + " for a " + std::to_string(phys.height) + " x " +
          std::to_string(phys.width) + " tile");
    }
    if (l.per_band && result.band_count() != where.band_count) {
      throw std::invalid_argument(
          std::string(who) + ": op returned " + std::to_string(result.band_count()) +
          " band(s) for a pass of " + std::to_string(where.band_count) +
          " (a plan with fewer bands per pass than bands treats bands as independent)");
    }
    const bool first_of_pass = where.index % l.tiles_per_pass() == 0;
    if (!dst) {
      // Created from the first result: the output dtype and nodata are the op's.
      out_dtype = result.dtype();
      out_bands = l.per_band ? static_cast<int>(l.bands.size()) : result.band_count();
      dst = create_dataset(pending.path(), out, out_dtype, out_bands, s.meta.height, s.meta.width,
                           std::nullopt, s.has_geotransform ? &s.meta.affine : nullptr, s.meta.crs,
                           options.write, who);
      copy_metadata(s.src.get(), dst.get(), l, out_bands, options.metadata);
      written_nodata.assign(static_cast<std::size_t>(out_bands), std::nullopt);
    } else if (result.dtype() != out_dtype || (!l.per_band && result.band_count() != out_bands)) {
      throw std::invalid_argument(std::string(who) + ": tile " + std::to_string(where.index) +
                                  " result differs from the first tile's in dtype or band count");
    }
    if (first_of_pass) {
      // Each pass's result nodata goes on its own bands.
      pass_first_tile = where.index;
      out_nodata = result.exact_nodata();
      if (gtiff && file_nodata_set && out_nodata != file_nodata) {
        throw std::invalid_argument(
            std::string(who) + ": the results of bands " + std::to_string(where.first_band + 1) +
            ".. have nodata " + (out_nodata ? out_nodata->to_string() : "none") +
            ", earlier bands " + (file_nodata ? file_nodata->to_string() : "none") +
            ", and GTiff keeps one nodata for all bands: write these bands to a file of their "
            "own or to a format with a nodata per band");
      }
      file_nodata = out_nodata;
      file_nodata_set = true;
      const int first_out = l.per_band ? where.first_band : 0;
      const int count = l.per_band ? where.band_count : out_bands;
      for (int b = 0; b < count; ++b) {
        written_nodata[static_cast<std::size_t>(first_out + b)] = out_nodata;
        if (out_nodata) {
          set_band_nodata(GDALGetRasterBand(dst.get(), first_out + b + 1), out_dtype, *out_nodata);
        }
      }
    } else if (result.exact_nodata() != out_nodata) {
      throw std::invalid_argument(std::string(who) + ": tile " + std::to_string(where.index) +
                                  " result differs from tile " + std::to_string(pass_first_tile) +
                                  "'s in nodata");
    }
    if (options.stage) options.stage(where, TileStage::write);
    std::vector<std::byte> scratch;
    const auto* base = static_cast<const std::byte*>(host_pixels(result, scratch, who));
    const std::size_t offset =
        static_cast<std::size_t>((where.window.row_off - phys.row_off) * phys.width +
                                 (where.window.col_off - phys.col_off)) *
        itemsize(out_dtype);
    std::vector<int> out_band_map;
    const int first_out = l.per_band ? where.first_band : 0;
    for (int b = 0; b < result.band_count(); ++b) out_band_map.push_back(first_out + b + 1);
    raster_io(dst.get(), GF_Write, where.window, const_cast<std::byte*>(base + offset), out_dtype,
              out_band_map, phys.width, phys.width * phys.height, out);
    // A failure reported off the calls' return values (e.g. an evicted block that could not be
    // written back) fails the run here, not at the end.
    quiet.check("cannot process '" + shown(in) + "' into '" + shown(out) + "'");
    if (options.progress) options.progress(where.index + 1, where.total);
  });
  close_checked(dst, out, quiet);
  verify_written(pending.path(), out, driver_name, s.meta.height, s.meta.width, out_dtype,
                 written_nodata);
  s.src.reset();  // the input closed before the output replaces it (in place: the same file)
  pending.commit(options.write.overwrite);
}

void for_each_raster_tile(
    const std::string& in, const RasterPlan& plan,
    const std::function<void(const OwnedRasterArray& tile, const TileInfo& where)>& visit,
    const StreamOptions& options) {
  static constexpr const char* who = "for_each_raster_tile";
  if (!visit) throw std::invalid_argument(std::string(who) + ": empty visitor");
  QuietErrors quiet;
  const OpenStream s = open_stream(in, plan, options, who);
  walk_tiles(s, in, options, [&](OwnedRasterArray tile, const TileInfo& where) {
    quiet.check("cannot read '" + shown(in) + "'");
    if (options.stage) options.stage(where, TileStage::compute);
    visit(tile, where);
    if (options.progress) options.progress(where.index + 1, where.total);
  });
}

}  // namespace vibespatial::raster
