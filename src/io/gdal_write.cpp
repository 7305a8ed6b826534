// SPDX-License-Identifier: Apache-2.0
// Raster files through GDAL, writing: output drivers, creation options and whole-file writes
// (io.hpp); the checks of an output before any work are output_checks.cpp.
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
#include <gdal_version.h>
#include <ogr_srs_api.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace vibespatial::raster {

namespace detail::gdal {

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

namespace {

/// @p text in upper case (ASCII).
std::string upper_case(std::string text) {
  for (char& c : text) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return text;
}

bool word_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_';
}

/// Whether @p text (upper case) holds @p word as a word of its own, or @p pair ("KEY=VALUE",
/// upper case) not followed by more of a value (COG passes LEVEL=99 on as ZLEVEL=99).
bool names_option(const std::string& text, const std::string& word, const std::string& pair) {
  for (std::size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) {
    const std::size_t end = at + word.size();
    if ((at == 0 || !word_char(text[at - 1])) && (end == text.size() || !word_char(text[end]))) {
      return true;
    }
  }
  for (std::size_t at = text.find(pair); at != std::string::npos; at = text.find(pair, at + 1)) {
    const std::size_t end = at + pair.size();
    if (end == text.size() || !word_char(text[end])) return true;
  }
  return false;
}

}  // namespace

void refuse_ignored_options(const QuietErrors& errors, std::size_t mark,
                            const WriteOptions& options, const std::string& driver_name,
                            const std::string& path, const char* who) {
  const std::vector<std::string>& warnings = errors.warning_list();
  for (std::size_t i = mark; i < warnings.size(); ++i) {
    const std::string text = upper_case(warnings[i]);
    for (const std::string& kv : options.creation_options) {
      const std::size_t eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) continue;
      if (!names_option(text, upper_case(kv.substr(0, eq)), upper_case(kv))) continue;
      throw std::invalid_argument(std::string(who) + ": GDAL's " + shown(driver_name) +
                                  " driver does not take the creation option " + shown(kv) +
                                  " for '" + shown(path) +
                                  "' (it would write without it): " + shown(warnings[i]));
    }
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
/// rasters, it creates a raster (Create, or CreateCopy from a staged GeoTIFF), and it writes a
/// file. Its
/// short name as GDAL spells it goes to @p canonical ("gtiff" is GTiff).
/// @throws std::invalid_argument naming the reason, as @p who.
GDALDriverH output_driver(const WriteOptions& options, const char* who, std::string* canonical) {
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
  // A driver with only CreateCopy (COG, PNG, JPEG) gets a staged GeoTIFF converted (Output).
  if (GDALGetMetadataItem(driver, GDAL_DCAP_CREATE, nullptr) == nullptr &&
      GDALGetMetadataItem(driver, GDAL_DCAP_CREATECOPY, nullptr) == nullptr) {
    throw std::invalid_argument(its +
                                " cannot write a raster (it has neither Create nor "
                                "CreateCopy)");
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

/// Refuses a GeoTIFF tile side (WriteOptions::block) that is not a positive multiple of 16.
void check_block(const WriteOptions& options, bool tiled, const char* who) {
  if (tiled && (options.block < 16 || options.block % 16 != 0)) {
    throw std::invalid_argument(std::string(who) +
                                ": a GeoTIFF tile side must be a positive "
                                "multiple of 16, not " +
                                std::to_string(options.block));
  }
}

/// The resampling names GDALBuildOverviews takes (gdaladdo -r), lower case.
constexpr std::array<const char*, 10> resampling_names = {
    "nearest", "average",     "rms",     "bilinear", "gauss",
    "cubic",   "cubicspline", "lanczos", "mode",     "average_magphase"};

/// @p name as GDAL spells it (upper case), if it is one of resampling_names (any case); empty
/// otherwise.
std::string gdal_resampling(const std::string& name) {
  for (const char* known : resampling_names) {
    if (EQUAL(known, name.c_str())) {
      std::string upper = known;
      for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      return upper;
    }
  }
  return "";
}

Overviews parse_overviews(const WriteOptions& options, const std::string& driver_name,
                          const char* who) {
  if (!options.resampling.empty() && gdal_resampling(options.resampling).empty()) {
    std::string names;
    for (const char* known : resampling_names)
      names += (names.empty() ? "" : ", ") + std::string(known);
    throw std::invalid_argument(std::string(who) + ": unknown resampling '" +
                                shown(options.resampling) + "' (GDAL's are " + names + ")");
  }
  Overviews ov;
  const std::string& text = options.overviews;
  if (text.empty()) {
    ov.kind = driver_name == "COG" ? Overviews::Kind::automatic : Overviews::Kind::none;
    return ov;
  }
  if (EQUAL(text.c_str(), "none")) return ov;
  if (EQUAL(text.c_str(), "auto")) {
    ov.kind = Overviews::Kind::automatic;
    return ov;
  }
  const std::string bad = std::string(who) + ": overviews '" + shown(text) +
                          "' are not \"none\", \"auto\" or a list of factors such as "
                          "\"2,4,8\"";
  ov.kind = Overviews::Kind::levels;
  std::size_t at = 0;
  for (;;) {
    const std::size_t comma = text.find(',', at);
    const std::string item =
        text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    if (item.empty() || item.size() > 9 || !std::all_of(item.begin(), item.end(), [](char c) {
          return std::isdigit(static_cast<unsigned char>(c)) != 0;
        })) {
      throw std::invalid_argument(bad);
    }
    const int f = std::stoi(item);
    if (f < 2) {
      throw std::invalid_argument(std::string(who) + ": overview factor " + item +
                                  " is below 2 (a factor of 2 halves each side)");
    }
    if (std::find(ov.levels.begin(), ov.levels.end(), f) != ov.levels.end()) {
      throw std::invalid_argument(std::string(who) + ": overview factor " + item +
                                  " is given twice");
    }
    ov.levels.push_back(f);
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  std::sort(ov.levels.begin(), ov.levels.end());
  return ov;
}

std::vector<int> automatic_levels(std::int64_t height, std::int64_t width, int block) {
  std::vector<int> levels;
  const std::int64_t side = std::max<std::int64_t>(block, 1);
  for (std::int64_t f = 2; f <= (1 << 30); f *= 2) {
    const std::int64_t before = f / 2;
    if ((height + before - 1) / before <= side && (width + before - 1) / before <= side) break;
    levels.push_back(static_cast<int>(f));
  }
  return levels;
}

/// The creation options a write of @p band_count bands of @p dtype passes to @p driver (named
/// @p driver_name, GDAL's spelling), checked (validate_creation_options) before anything is
/// created.
CPLStringList creation_options(GDALDriverH driver, const std::string& driver_name,
                               const WriteOptions& options, DType dtype, int band_count,
                               const char* who) {
  const bool gtiff = driver_name == "GTiff";
  const bool cog = driver_name == "COG";
  CPLStringList opts;
  if (gtiff || cog) check_block(options, cog || options.tiled, who);
  if (cog) {
    // A COG is a tiled GeoTIFF by construction: the compression, tile side and BigTIFF rule of a
    // GTiff output, and the overviews WriteOptions ask for.
    if (!options.compress.empty()) opts.SetNameValue("COMPRESS", options.compress.c_str());
    opts.SetNameValue("BLOCKSIZE", std::to_string(options.block).c_str());
    opts.SetNameValue("BIGTIFF", "IF_SAFER");
    const Overviews ov = parse_overviews(options, driver_name, who);
    opts.SetNameValue("OVERVIEWS", ov.kind == Overviews::Kind::none        ? "NONE"
                                   : ov.kind == Overviews::Kind::automatic ? "AUTO"
                                                                           : "FORCE_USE_EXISTING");
    if (ov.kind == Overviews::Kind::automatic && !options.resampling.empty()) {
      opts.SetNameValue("RESAMPLING", gdal_resampling(options.resampling).c_str());
    }
  }
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
  // NUM_THREADS only where the driver takes it (GTiff does), so others warn about nothing.
  if (options.num_threads != 0 &&
      driver_lists_option(driver, GDAL_DMD_CREATIONOPTIONLIST, "NUM_THREADS")) {
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
                       const std::string& crs, const WriteOptions& options,
                       const QuietErrors& errors, const char* who) {
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
  const std::size_t mark = errors.warning_count();
  GDALDatasetH ds = GDALCreate(driver, file.c_str(), static_cast<int>(width),
                               static_cast<int>(height), band_count, gdal_type(dtype), opts.List());
  if (ds == nullptr) fail("cannot create raster '" + shown(path) + "'");
  Dataset owned(ds);
  // A value the driver's list gives no range for (GTiff's ZLEVEL=99): it warns and ignores it.
  refuse_ignored_options(errors, mark, options, name, path, who);
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

GDALDriverH check_output_options(const WriteOptions& options, const char* who,
                                 std::string* canonical) {
  std::string name;
  GDALDriverH driver = output_driver(options, who, &name);
  (void)parse_overviews(options, name, who);
  (void)creation_options(driver, name, options, DType::float32, 1, who);
  if (canonical != nullptr) *canonical = name;
  return driver;
}

namespace {

/// The options of the staged GeoTIFF of a CreateCopy driver: uncompressed (it is read once, by
/// the conversion), tiled in blocks of at most 256 (a trial's 16), BigTIFF if safer.
WriteOptions staged_options(const WriteOptions& options) {
  WriteOptions staged;
  staged.driver = "GTiff";
  staged.compress = "NONE";
  staged.tiled = true;
  staged.block = std::clamp(options.block / 16 * 16, 16, 256);
  staged.overwrite = true;
  return staged;
}

/// Builds the overviews @p levels on the closed file @p file of @p driver (opened in update, so
/// that formats with internal overviews hold them; else read-only: an external .ovr beside it),
/// resampled as @p resampling ("" is nearest, as gdaladdo).
void build_overviews(const std::string& file, const std::string& path, const std::string& driver,
                     const std::vector<int>& levels, const std::string& resampling,
                     const QuietErrors& errors) {
  if (levels.empty()) return;
  CPLStringList allowed;
  allowed.AddString(driver.c_str());
  Dataset ds;
  {
    // A driver that cannot update its format says so as an error: not the write's failure.
    QuietErrors probe;
    ds.reset(GDALOpenEx(file.c_str(), GDAL_OF_RASTER | GDAL_OF_UPDATE, allowed.List(), nullptr,
                        nullptr));
  }
  if (!ds) {
    ds.reset(GDALOpenEx(file.c_str(), GDAL_OF_RASTER | GDAL_OF_READONLY | GDAL_OF_VERBOSE_ERROR,
                        allowed.List(), nullptr, nullptr));
  }
  if (!ds) fail("cannot write '" + shown(path) + "': GDAL cannot reopen it to build overviews");
  std::vector<int> factors = levels;
  const std::string method = resampling.empty() ? "NEAREST" : gdal_resampling(resampling);
  if (GDALBuildOverviews(ds.get(), method.c_str(), static_cast<int>(factors.size()), factors.data(),
                         0, nullptr, nullptr, nullptr) != CE_None) {
    fail("cannot write '" + shown(path) + "': GDAL cannot build its overviews");
  }
  close_checked(ds, path, errors);
}

}  // namespace

Output::Output(const std::string& path, const WriteOptions& options, const char* who)
    : path_(path), options_(options), who_(who) {
  driver_ = check_output_options(options, who, &driver_name_);
  staged_ = GDALGetMetadataItem(driver_, GDAL_DCAP_CREATE, nullptr) == nullptr;
  pending_.emplace(path, options.overwrite);
  // Beside data/, so that it is never taken for a sidecar of the output.
  if (staged_) stage_ = pending_->directory() + "/stage.tif";
}

void Output::check(DType dtype, int band_count) const {
  if (dtype == DType::int8 && !VSR_GDAL_HAS_INT8 && driver_name_ != "GTiff") {
    throw std::invalid_argument(std::string(who_) + ": int8 needs GDAL >= 3.7 for driver '" +
                                shown(driver_name_) + "' (this GDAL is " GDAL_RELEASE_NAME ")");
  }
  check_creation_dtype(driver_, dtype, who_);
  (void)creation_options(driver_, driver_name_, options_, dtype, band_count, who_);
}

GDALDatasetH Output::create(DType dtype, int band_count, std::int64_t height, std::int64_t width,
                            const std::optional<NodataValue>& nodata, const Affine* affine,
                            const std::string& crs, const QuietErrors& errors) {
  check(dtype, band_count);
  dtype_ = dtype;
  band_count_ = band_count;
  height_ = height;
  width_ = width;
  ds_ = staged_ ? create_dataset(stage_, path_, dtype, band_count, height, width, nodata, affine,
                                 crs, staged_options(options_), errors, who_)
                : create_dataset(pending_->path(), path_, dtype, band_count, height, width, nodata,
                                 affine, crs, options_, errors, who_);
  return ds_.get();
}

std::string Output::reading_driver() const {
  if (GDALGetMetadataItem(driver_, GDAL_DCAP_OPEN, nullptr) != nullptr) return driver_name_;
  return driver_name_ == "COG" ? std::string("GTiff") : driver_name_;
}

const std::string& Output::complete(const QuietErrors& errors,
                                    const std::vector<std::optional<NodataValue>>& nodata) {
  const std::string& file = pending_->path();
  const Overviews ov = parse_overviews(options_, driver_name_, who_);
  std::vector<int> levels = ov.kind == Overviews::Kind::levels ? ov.levels
                            : ov.kind == Overviews::Kind::automatic && driver_name_ != "COG"
                                ? automatic_levels(height_, width_, options_.block)
                                : std::vector<int>{};
  if (driver_name_ == "JPEG") {
    for (const auto& nd : nodata) {
      if (nd) {
        throw std::invalid_argument(
            std::string(who_) + ": GDAL's JPEG driver compresses lossily: pixels of nodata " +
            nd->to_string() +
            " would read back as other, valid values; write it without a nodata, or to a "
            "lossless format (PNG, GTiff, COG)");
      }
    }
  }
  close_checked(ds_, path_, errors);
  if (staged_) {
    // COG takes listed overviews from its source: built on the staged file first.
    if (driver_name_ == "COG") {
      build_overviews(stage_, path_, "GTiff", levels, options_.resampling, errors);
      levels.clear();
    }
    CPLStringList allowed;
    allowed.AddString("GTiff");
    Dataset src(GDALOpenEx(stage_.c_str(),
                           GDAL_OF_RASTER | GDAL_OF_READONLY | GDAL_OF_VERBOSE_ERROR,
                           allowed.List(), nullptr, nullptr));
    if (!src) fail("cannot write '" + shown(path_) + "': GDAL cannot reopen its staged GeoTIFF");
    const CPLStringList opts =
        creation_options(driver_, driver_name_, options_, dtype_, band_count_, who_);
    // Strict: a driver that cannot hold the data as it is fails instead of approximating it.
    const std::size_t mark = errors.warning_count();
    Dataset out(
        GDALCreateCopy(driver_, file.c_str(), src.get(), TRUE, opts.List(), nullptr, nullptr));
    if (!out) {
      fail("cannot write '" + shown(path_) + "': GDAL's " + shown(driver_name_) +
           " driver cannot convert the staged GeoTIFF");
    }
    refuse_ignored_options(errors, mark, options_, driver_name_, path_, who_);
    close_checked(out, path_, errors);
    src.reset();
    // The staged file is not needed any more: its space is freed before the commit.
    ::unlink(stage_.c_str());
    ::unlink((stage_ + ".aux.xml").c_str());
  }
  build_overviews(file, path_, reading_driver(), levels, options_.resampling, errors);
  verify_written(file, path_, reading_driver(), height_, width_, dtype_, nodata);
  if (ov.kind == Overviews::Kind::levels) {
    // As many overview levels as asked for, or the file would not be what was asked.
    CPLStringList allowed;
    allowed.AddString(reading_driver().c_str());
    Dataset back(GDALOpenEx(file.c_str(), GDAL_OF_RASTER | GDAL_OF_READONLY, allowed.List(),
                            nullptr, nullptr));
    const int have = back ? GDALGetOverviewCount(GDALGetRasterBand(back.get(), 1)) : -1;
    if (have != static_cast<int>(ov.levels.size())) {
      throw std::runtime_error("cannot write '" + shown(path_) + "': GDAL's " +
                               shown(driver_name_) + " driver reads back " + std::to_string(have) +
                               " overview level(s), not the " + std::to_string(ov.levels.size()) +
                               " asked for");
    }
  }
  errors.check("cannot write '" + shown(path_) + "'");
  return file;
}

void Output::commit() {
  pending_->commit(options_.overwrite);
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

}  // namespace detail::gdal

using namespace detail::gdal;

void write_raster(const std::string& path, const OwnedRasterArray& raster,
                  const WriteOptions& options) {
  static constexpr const char* who = "write_raster";
  QuietErrors quiet;
  // What the driver refuses, refused before anything is touched.
  Output out(path, options, who);
  out.check(raster.dtype(), raster.band_count());
  std::vector<std::byte> scratch;
  const void* pixels = host_pixels(raster, scratch, who);
  GDALDatasetH ds = out.create(raster.dtype(), raster.band_count(), raster.height(), raster.width(),
                               raster.exact_nodata(), &raster.affine(), raster.crs(), quiet);
  std::vector<int> bands = all_bands(raster.band_count());
  raster_io(ds, GF_Write, RasterWindow{0, 0, raster.width(), raster.height()},
            const_cast<void*>(pixels), raster.dtype(), bands, raster.width(),
            raster.width() * raster.height(), path);
  (void)out.complete(
      quiet, std::vector<std::optional<NodataValue>>(static_cast<std::size_t>(raster.band_count()),
                                                     raster.exact_nodata()));
  out.commit();
}

std::string output_driver_for(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  const std::size_t dot = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return "";
  std::string ext = path.substr(dot + 1);
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (ext == "tif" || ext == "tiff") return "GTiff";
  register_drivers();
  // Drivers with Create first, then those with CreateCopy only (".png": PNG, ".jpg": JPEG).
  for (const char* capability : {GDAL_DCAP_CREATE, GDAL_DCAP_CREATECOPY}) {
    for (int i = 0; i < GDALGetDriverCount(); ++i) {
      GDALDriverH d = GDALGetDriver(i);
      if (GDALGetMetadataItem(d, GDAL_DCAP_RASTER, nullptr) == nullptr ||
          GDALGetMetadataItem(d, capability, nullptr) == nullptr) {
        continue;
      }
      const char* exts = GDALGetMetadataItem(d, GDAL_DMD_EXTENSIONS, nullptr);
      if (exts == nullptr) continue;
      const CPLStringList list(CSLTokenizeString2(exts, " ", 0));
      for (int k = 0; k < list.size(); ++k) {
        if (EQUAL(list[k], ext.c_str())) return GDALGetDriverShortName(d);
      }
    }
  }
  return "";
}

}  // namespace vibespatial::raster
