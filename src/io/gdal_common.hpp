// SPDX-License-Identifier: Apache-2.0
// What the GDAL files of io share (internal): datasets, GDAL's errors, types and nodata, reads,
// and the creation of outputs. gdal_dataset.cpp opens and reads, gdal_write.cpp creates and
// writes whole files, gdal_stream.cpp holds the executor's file ends (RasterFileSource,
// RasterFileSink) and the streamed runs on them.
#pragma once

#include "common/text_escape.hpp"
#include "files/output_file.hpp"

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/io.hpp>

#include <cpl_error.h>
#include <cpl_string.h>
#include <gdal.h>
#include <gdal_version.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#define VSR_GDAL_HAS_INT8 (GDAL_VERSION_NUM >= GDAL_COMPUTE_VERSION(3, 7, 0))

namespace vibespatial::raster::detail::gdal {

/// GDALAllRegister, once per process.
void register_drivers();

/// Silences GDAL's default stderr error printing for the current thread during one call and
/// records every failure GDAL reports meanwhile, also those that do not show in a call's return
/// value (a dirty block written back when the cache evicts it, a flush inside GDALClose): check()
/// turns them into an exception. The last message stays available (CPLGetLastErrorMsg). GDAL's
/// messages name the files it was given: they are recorded with the private paths of outputs
/// in progress replaced by their targets (PendingOutput::without_temporaries).
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
  std::string warnings() const { return warnings_since(0); }
  /// How many warnings GDAL reported since construction: a mark for warnings_since.
  std::size_t warning_count() const noexcept { return warnings_.size(); }
  /// Every warning since construction, in order, as GDAL wrote it (not made printable).
  const std::vector<std::string>& warning_list() const noexcept { return warnings_; }
  /// The warnings from the @p mark-th on, joined with "; " (printable).
  std::string warnings_since(std::size_t mark) const {
    std::string out;
    for (std::size_t i = mark; i < warnings_.size(); ++i) {
      out.append(out.empty() ? "" : "; ").append(detail::printable(warnings_[i]));
    }
    return out;
  }

 private:
  static void CPL_STDCALL record(CPLErr type, CPLErrorNum /*num*/, const char* msg) {
    auto* self = static_cast<QuietErrors*>(CPLGetErrorHandlerUserData());
    if (self == nullptr) return;
    try {
      std::string text =
          PendingOutput::without_temporaries(msg != nullptr ? msg : "unknown GDAL error");
      if (type == CE_Warning) {
        self->warnings_.push_back(std::move(text));
      } else if ((type == CE_Failure || type == CE_Fatal) && self->failures_++ == 0) {
        self->first_ = std::move(text);
      }
    } catch (...) {
    }
  }

  int failures_ = 0;
  std::string first_;
  std::vector<std::string> warnings_;
};

/// @p text (a path, a driver name, a CRS) as it goes into an exception message: printable, so
/// every message is valid UTF-8 without terminal control characters.
std::string shown(const std::string& text);

/// ": <GDAL's last message>" (the private paths of outputs in progress replaced by their
/// targets), or "" when it has none.
std::string gdal_message();

/// Throws std::runtime_error(@p what + GDAL's last message).
[[noreturn]] void fail(const std::string& what);

struct DatasetCloser {
  void operator()(void* ds) const noexcept { GDALClose(static_cast<GDALDatasetH>(ds)); }
};
using Dataset = std::unique_ptr<void, DatasetCloser>;

/// Opens @p path for reading as @p who (the public call, first in every message). A local file
/// that cannot be reached (missing, no permission) is a std::system_error with the errno; a file
/// that is there but not an allowed raster, or a refused virtual path, std::invalid_argument.
Dataset open_readonly(const std::string& path, const OpenOptions& open, const char* who);

/// Whether @p driver names the option @p name in its metadata item @p list
/// (GDAL_DMD_CREATIONOPTIONLIST or GDAL_DMD_OPENOPTIONLIST). Never throws.
bool driver_lists_option(GDALDriverH driver, const char* list, const char* name);

/// Flushes and closes the written dataset @p ds, then throws if GDAL reported any failure while
/// it was written, flushed or closed (GDALFlushCache and GDALClose return void before GDAL 3.7,
/// so @p errors is what tells).
void close_checked(Dataset& ds, const std::string& path, const QuietErrors& errors);

/// The dtype of @p band (int8 for GTiff's SIGNEDBYTE bytes); std::runtime_error for a type this
/// library does not have.
DType dtype_from_band(GDALRasterBandH band, const std::string& path);

/// The GDAL type that holds @p dtype's bytes (Byte for int8 before GDAL 3.7).
GDALDataType gdal_type(DType dtype);

/// Band @p band's nodata, exactly (64-bit integer rasters through GDAL's Int64/UInt64 calls).
std::optional<NodataValue> band_nodata(GDALRasterBandH band, DType dtype);

/// Sets band @p band's nodata exactly (64-bit integers through GDAL's Int64/UInt64 setters).
void set_band_nodata(GDALRasterBandH band, DType dtype, const NodataValue& nodata);

/// Header of an open dataset; @p bands (1-based) select the bands checked for a common dtype
/// and nodata (unless @p mixed_nodata), all bands when empty.
RasterMetadata metadata_of(GDALDatasetH ds, const std::string& path, const std::vector<int>& bands,
                           bool mixed_nodata = false);

/// Band-major RasterIO of a (bands, h, w) buffer whose rows are @p line_elems elements apart and
/// whose bands are @p band_elems elements apart.
void raster_io(GDALDatasetH ds, GDALRWFlag flag, const RasterWindow& w, void* buf, DType dtype,
               std::vector<int>& bands, std::int64_t line_elems, std::int64_t band_elems,
               const std::string& path);

/// "B x H x W dtype".
std::string window_text(const RasterWindow& w, int bands, DType dtype);

/// Reads @p window of @p bands; with @p check_memory, a read larger than the host memory
/// available is refused before anything is allocated (the streamed paths check their passes
/// up front instead).
OwnedRasterArray read_open(GDALDatasetH ds, const std::string& path,
                           std::optional<RasterWindow> window, std::vector<int> bands,
                           bool check_memory = true, bool mixed_nodata = false);

/// The output driver @p options name, checked for what a write needs (GDAL has it, it writes
/// rasters, it has Create or CreateCopy, it writes a file); its short name as GDAL spells it goes
/// to
/// @p canonical. @throws std::invalid_argument naming the reason, as @p who.
GDALDriverH output_driver(const WriteOptions& options, const char* who,
                          std::string* canonical = nullptr);

/// The creation options a write of @p band_count bands of @p dtype passes to @p driver, checked
/// against the driver's list before anything is created.
CPLStringList creation_options(GDALDriverH driver, const std::string& driver_name,
                               const WriteOptions& options, DType dtype, int band_count,
                               const char* who);

/// Creates the dataset @p file (the temporary file of @p path, which messages name), as @p who;
/// a creation option the driver warned about while it created the file (refuse_ignored_options,
/// over what @p errors recorded) is refused.
Dataset create_dataset(const std::string& file, const std::string& path, DType dtype,
                       int band_count, std::int64_t height, std::int64_t width,
                       const std::optional<NodataValue>& nodata, const Affine* affine,
                       const std::string& crs, const WriteOptions& options,
                       const QuietErrors& errors, const char* who);

/// Refuses (std::invalid_argument, as @p who, naming @p path) a creation option of @p options that
/// a warning GDAL reported since @p mark names ("ZLEVEL=99 value not recognised, ignoring"): the
/// driver took the file but ignores the value, which GDALValidateCreationOptions cannot tell from
/// the driver's option list (GTiff's ZLEVEL lists no range; COG's LEVEL=99 becomes ZLEVEL=99).
void refuse_ignored_options(const QuietErrors& errors, std::size_t mark,
                            const WriteOptions& options, const std::string& driver_name,
                            const std::string& path, const char* who);

/// Checks the closed output @p file of @p path before it is committed: it opens as written, and
/// each band keeps the nodata written to it. @throws std::runtime_error when it does not.
void verify_written(const std::string& file, const std::string& path, const std::string& driver,
                    std::int64_t height, std::int64_t width, DType dtype,
                    const std::vector<std::optional<NodataValue>>& nodata);

/// The overviews a write makes (WriteOptions::overviews for the driver @p driver_name).
struct Overviews {
  enum class Kind { none, automatic, levels };
  Kind kind = Kind::none;
  std::vector<int> levels;  ///< the factors, ascending, for Kind::levels
};

/// WriteOptions::overviews and ::resampling checked and read for @p driver_name ("": automatic
/// for COG, none for the others). @throws std::invalid_argument for a text that is not one of
/// their forms, as @p who.
Overviews parse_overviews(const WriteOptions& options, const std::string& driver_name,
                          const char* who);

/// The factors of automatic overviews of a @p width x @p height raster: 2, 4, 8, ... while the
/// level before is larger than @p block on a side (COG's rule for its BLOCKSIZE).
std::vector<int> automatic_levels(std::int64_t height, std::int64_t width, int block);

/// Checks what a write with @p options needs before anything is touched (the driver, its
/// creation options, the overviews and the resampling); the driver's short name goes to
/// @p canonical. @throws std::invalid_argument as @p who.
GDALDriverH check_output_options(const WriteOptions& options, const char* who,
                                 std::string* canonical = nullptr);

/// One raster output, all or nothing (docs/outputs.md): checked and given its private temporary
/// directory at construction; written into the dataset create() makes: the output driver's own
/// for a driver with Create, else (COG, PNG, JPEG: CreateCopy only) a staged uncompressed tiled
/// GeoTIFF in the temporary directory; complete() closes it, converts a staged one
/// (GDALCreateCopy into the temporary's file), builds the overviews asked for and verifies the
/// file; commit() renames it over the target. Destroyed before commit(), it leaves nothing.
class Output {
 public:
  /// @throws what check_output_options and PendingOutput throw.
  Output(const std::string& path, const WriteOptions& options, const char* who);
  Output(const Output&) = delete;
  Output& operator=(const Output&) = delete;

  /// Refuses (std::invalid_argument) a dtype or band count the output driver does not take,
  /// before anything is created.
  void check(DType dtype, int band_count) const;
  /// Creates the dataset written into (see the class) and sets the georeferencing and, when
  /// given, every band's nodata.
  /// Creation options the driver ignores are refused (refuse_ignored_options over @p errors).
  GDALDatasetH create(DType dtype, int band_count, std::int64_t height, std::int64_t width,
                      const std::optional<NodataValue>& nodata, const Affine* affine,
                      const std::string& crs, const QuietErrors& errors);
  GDALDatasetH dataset() const noexcept { return ds_.get(); }
  /// Whether the file written into keeps one nodata for all bands (a GeoTIFF, staged or not).
  bool one_nodata() const noexcept { return staged_ || driver_name_ == "GTiff"; }
  /// The output driver's short name, GDAL's spelling.
  const std::string& driver() const noexcept { return driver_name_; }
  /// The driver that reads the output back (GTiff for COG, which only writes).
  std::string reading_driver() const;
  /// Closes the dataset, converts a staged one, builds the overviews and verifies the file
  /// (verify_written: band @p b keeps @p nodata[b]); GDAL's failures are those @p errors
  /// recorded since the write began. Returns the written file (in the temporary directory).
  /// @throws std::runtime_error when a step fails; the target is untouched.
  const std::string& complete(const QuietErrors& errors,
                              const std::vector<std::optional<NodataValue>>& nodata);
  /// Renames the completed file over the target (PendingOutput::commit).
  void commit();

 private:
  std::string path_;
  WriteOptions options_;
  const char* who_;
  GDALDriverH driver_ = nullptr;
  std::string driver_name_;
  bool staged_ = false;  ///< CreateCopy only: written into stage_
  std::string stage_;
  DType dtype_ = DType::float32;
  int band_count_ = 0;
  std::int64_t height_ = 0, width_ = 0;
  // Declared before the dataset: on an error the dataset is closed first and the temporary
  // files removed after.
  std::optional<PendingOutput> pending_;
  Dataset ds_;
};

/// Whether @p band's validity is its GDAL mask band, as GDAL decides it (GDALGetMaskFlags): an
/// internal or .msk mask (GMF_PER_DATASET, or a per-band mask), an alpha band (GMF_ALPHA), or a
/// dataset's NODATA_VALUES (GMF_NODATA | GMF_PER_DATASET); the band's nodata is then not
/// consulted. False for GMF_ALL_VALID and for GMF_NODATA alone (the band's own nodata decides,
/// which the ops test themselves). gdal_mask.cpp.
bool has_pixel_mask(GDALRasterBandH band);

/// The one nodata the masked pixels of @p masked get (bands whose mask decides), also given to
/// the bands @p plain (unmasked, without a nodata) so that every band read keeps one nodata: a
/// value that no pixel the mask marks valid, and no pixel of a plain band, takes, found by a
/// pass over the bands and their masks. Float types: NaN (no pass). Integers: @p preferred (the
/// masked bands' own nodata) when free, else for 8- and 16-bit types the largest free value,
/// for 32- and 64-bit ones the type's largest, else its smallest value.
/// @throws std::runtime_error when none is free (the message names -b and --ignore-mask).
NodataValue mask_marker(GDALDatasetH ds, const std::vector<int>& masked,
                        const std::vector<int>& plain, DType dtype,
                        const std::optional<NodataValue>& preferred, const std::string& path);

/// Writes @p marker[b] into the pixels of @p tile's band b (file band @p bands[b], read over
/// @p window) that its mask marks invalid (mask value 0), for the bands @p masked; a pixel the
/// mask marks valid that holds it is std::runtime_error (mask_marker chose a value none holds).
void apply_masks(GDALDatasetH ds, OwnedRasterArray& tile, const RasterWindow& window,
                 const std::vector<int>& bands,
                 const std::vector<std::optional<NodataValue>>& marker,
                 const std::vector<bool>& masked, const std::string& path);

/// The host pixels of @p raster: its own buffer when host resident, else a copy in @p scratch
/// (checked against the host memory available first).
const void* host_pixels(const OwnedRasterArray& raster, std::vector<std::byte>& scratch,
                        const char* who);

/// 1..@p n.
std::vector<int> all_bands(int n);

}  // namespace vibespatial::raster::detail::gdal
