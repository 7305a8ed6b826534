// SPDX-License-Identifier: Apache-2.0
// Raster files through GDAL: metadata, windowed reads of band subsets, writes, and a streamed
// tile-by-tile processing path that follows a RasterPlan with only one tile in memory.
//
// GDAL is an optional build feature (meson option 'gdal'). The declarations are always present;
// in a build without GDAL every function throws std::runtime_error("... built without GDAL")
// (io_available() says which build this is).
//
// Conventions
// - Georeferencing: GDAL's geotransform is converted with Affine::from_gdal / Affine::to_gdal.
//   A file with no geotransform reads as GDAL's default {0, 1, 0, 0, 0, 1}.
// - CRS: the WKT of GetProjectionRef (empty when the file has none); written back as given
//   (WKT, "EPSG:n" or anything OGRSpatialReference::SetFromUserInput accepts).
// - Nodata: GDAL keeps one per band, this library one per raster. Reading takes band 1's and
//   rejects (std::runtime_error) a file whose selected bands disagree (NaN equals NaN); writing
//   sets it on every band, and an output whose driver does not keep it (GSBG and ISIS3 have
//   their own, FITS none) is never put in place: its nodata pixels would read as valid. A NaN
//   nodata of a float output that the format cannot record (GPKG) is left unrecorded: NaN
//   pixels are invalid all the same.
// - dtypes: all ten. int8 needs GDAL >= 3.7 (GDT_Int8); with older GDAL an int8 raster is
//   written as Byte with PIXELTYPE=SIGNEDBYTE (GTiff) and read back as int8. uint64/int64 need
//   GDAL >= 3.5.
// - Inputs: only the raster file formats of default_input_drivers() open an input unless
//   OpenOptions says otherwise. VRT (whose XML names other files to read, any file on the
//   machine), GDAL's virtual file systems (/vsicurl/, /vsizip/, ...) and URLs need
//   OpenOptions::allow_virtual: a file named "x.tif" holding VRT XML is refused, not followed.
// - Outputs are all or nothing, through the writer of outputs.hpp (whose rules the target keeps):
//   write_raster, process_raster_streamed, process_raster_file and merge_raster_parts write into
//   a private temporary directory beside
//   the target (same directory, a unique hidden name ".<name>.vsr-XXXXXX", mode 0700), under the
//   target's own file name, check GDAL's errors on every write, the flush and the close, check that
//   the driver wrote a regular, non-empty file under that name and that GDAL reads it back with the
//   shape and nodata written, and only then rename it (and the sidecar files the driver wrote
//   beside it, e.g. .aux.xml or .hdr) over the target (rename(2): atomic on one file system). On
//   any error the temporary directory is removed and the target is untouched: an existing file
//   survives byte for byte, a new one does not appear. Outputs are regular files: a target that is
//   a directory, FIFO, socket or device is refused (std::invalid_argument), and so are drivers that
//   write no file (MEM, services), no rasters, or have neither Create nor CreateCopy, before
//   anything is touched. A driver with CreateCopy only (COG, PNG, JPEG) is written as an
//   uncompressed tiled GeoTIFF staged in the same temporary directory and converted there
//   (GDALCreateCopy) before the verification: all or nothing as well. A symbolic link as target is
//   followed (the file it names is replaced). The output's permissions are an existing target's,
//   else 0666 less the umask.
// - Cleanup: a process killed by a signal leaves no temporary behind when it called
//   remove_partial_outputs_on_signals() (vsr-run does). One killed by SIGKILL (or a power cut)
//   leaves its temporary directory; the next write to the same target removes it. Each
//   temporary directory holds an owner record ("owner": pid, process start time, boot id, host
//   name) that its writer keeps locked (flock) while it lives; a write removes another's
//   temporary only when it can take that lock and the record names no live process of this
//   machine (the pid is gone or now another process, or the machine has rebooted since). A
//   live writer's temporary, in this process or another, is never removed.
// - Host memory: a read that needs more host memory than is available (available_host_memory()
//   or StreamOptions::host_memory_limit) is refused up front with HostMemoryLimitError before
//   anything is allocated; an allocation of the library's that fails all the same (memory taken
//   meanwhile) is a HostMemoryLimitError naming what it was for, not a bare std::bad_alloc.
//   Streamed runs hold no list of their tiles: memory does not grow with the raster's size.
// - Thread-safety: every call opens its own dataset, so concurrent calls on distinct files are
//   safe; concurrent writes to the same target each write all or nothing (the last to finish
//   is the file; with WriteOptions::overwrite false, the first, and the others fail).
//   StreamOptions::gdal_cache_bytes changes a process-wide GDAL setting.
#pragma once

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/export.hpp>
#include <vibespatial/raster/outputs.hpp>
#include <vibespatial/raster/tiles.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace vibespatial::raster {

/// Whether this build reads and writes files through GDAL. Never throws.
VSR_EXPORT bool io_available() noexcept;

/// How an input file is opened.
struct OpenOptions {
  /// GDAL driver short names that may open the input; empty: default_input_drivers().
  std::vector<std::string> drivers;
  /// Also allow inputs that make GDAL read other files or other machines: the VRT driver (added
  /// to the drivers), GDAL virtual file system paths ("/vsi...") and URLs ("scheme://...").
  /// Off by default: only a local file of an allowed format opens.
  bool allow_virtual = false;
  /// Read pixels as they are, ignoring the file's GDAL mask bands. Off by default: the streamed
  /// readers (RasterFileSource, so process_raster_file, for_each_raster_tile and vsr-run) follow
  /// GDAL's mask flags as GDALGetMaskBand and rasterio's masked reads do: where a band's mask
  /// is its validity (GDALGetMaskFlags neither GMF_ALL_VALID nor GMF_NODATA alone: an internal
  /// or external .msk mask, an alpha band, a dataset's NODATA_VALUES), the mask alone decides
  /// (a pixel the mask keeps is valid even when it equals the band's nodata) and the masked
  /// pixels are given one value no pixel left valid takes, which becomes the band's nodata
  /// (RasterFileSource::band_nodata): NaN for float types; for integers the band's own nodata
  /// when no valid pixel holds it, else the largest free value (8 and 16 bits), or the type's
  /// largest or smallest (32 and 64 bits), found by a pass over the bands and their masks when
  /// the source opens. Bands read with them that have no nodata (an alpha band) get it too.
  /// read_raster and read_raster_info read the file as it is.
  bool ignore_mask = false;
  /// Threads a RasterFileSource reads a window with: its rows are split into strips of whole
  /// GDAL blocks, each read (and decoded) on a handle of its own, at once. 0 or 1: one thread,
  /// -1: every CPU, n > 1: up to n. Decoding compressed blocks is a large part of a streamed
  /// run's time. GDAL's own multi-threaded decoding (GTiff's NUM_THREADS open option) is not
  /// used: GDAL 3.6 can deadlock with it while the same process writes a compressed file (its
  /// decoding workers evict the output's blocks, which wait on compression queued behind them).
  /// read_raster and read_raster_info read with one thread.
  int num_threads = 0;
};

/**
 * @brief The GDAL drivers that open an input by default: raster file formats whose pixels come
 * from the named file alone (GTiff, which also reads COGs, PNG, JPEG, GIF, BMP, WEBP,
 * JP2OpenJPEG, ENVI, EHdr, AAIGrid, GSBG, GS7BG, NITF). Formats whose header can name another
 * file to read (VRT, HFA's spill files, PCIDSK's linked channels, ERS, netCDF, HDF5) are not in
 * the list; add them to OpenOptions::drivers to accept such files knowingly. Thread-safe.
 */
VSR_EXPORT std::vector<std::string> default_input_drivers();

/// A read or a buffer was refused up front because it needs more host memory than the limit
/// (what is available, or StreamOptions::host_memory_limit; nothing was allocated), or its
/// allocation failed (what() names what it was for and the size).
class VSR_EXPORT HostMemoryLimitError : public std::runtime_error {
 public:
  HostMemoryLimitError(std::uint64_t needed_bytes, std::uint64_t limit_bytes,
                       const std::string& what);
  /// Bytes the read would need at once.
  std::uint64_t needed_bytes() const noexcept { return needed_; }
  /// The limit it was compared with.
  std::uint64_t limit_bytes() const noexcept { return limit_; }

 private:
  std::uint64_t needed_, limit_;
};

/**
 * @brief Host memory this process can still use, in bytes: the kernel's MemAvailable (or free
 * physical pages where it is missing), capped by the cgroup's memory.max less its current use.
 * 0 when nothing can be read. Thread-safe, never throws.
 */
VSR_EXPORT std::uint64_t available_host_memory() noexcept;

/// How write_raster creates a file.
struct WriteOptions {
  /// A GDAL raster driver that writes a file (short name, any case), with Create() or with
  /// CreateCopy() only (COG, PNG, JPEG: written as a staged GeoTIFF in the output's temporary
  /// directory, then converted; see docs/outputs.md).
  std::string driver = "GTiff";
  std::string compress = "DEFLATE";  ///< GTiff and COG COMPRESS; empty or "NONE": uncompressed
  bool tiled = true;                 ///< GTiff TILED=YES with block x block tiles
  int block = 256;                   ///< tile side (a multiple of 16 for GTiff and COG)
  /// More creation options, "KEY=VALUE", for any driver, applied after those above (a key given
  /// here replaces theirs), e.g. "PREDICTOR=2" or "ZLEVEL=9".
  std::vector<std::string> creation_options;
  /// Threads GDAL compresses with (the NUM_THREADS creation option, for drivers that take it:
  /// GTiff does): 0 leaves GDAL's default (one thread), -1 every CPU, n > 0 that many.
  /// Compressed writing is most of a streamed run's time.
  int num_threads = 0;
  /// Replace an existing file (the default); false: a target that exists is refused with
  /// std::runtime_error, also when it appears while the output is written (it is linked into
  /// place, never renamed over).
  bool overwrite = true;
  /// Overviews (reduced-resolution levels) of the output: "" the format's default (COG makes
  /// them automatically, the others none); "none"; "auto" (factors 2, 4, 8, ... until a level
  /// fits in one block x block tile, COG's rule); or a list of factors, e.g. "2,4,8" (each >= 2).
  /// COG holds them inside the file; other formats where they can (GTiff, HFA), else in an
  /// external ".ovr" beside the output (written and replaced with it).
  std::string overviews;
  /// How overview levels are computed: a GDAL resampling name (any case): nearest, average,
  /// rms, bilinear, gauss, cubic, cubicspline, lanczos, mode, average_magphase; "" the
  /// format's default (COG's own choice, else nearest as gdaladdo). Any other name is refused
  /// with std::invalid_argument.
  std::string resampling;
};

/**
 * @brief The GDAL driver that writes files named like @p path, from its extension: GTiff for
 * ".tif" / ".tiff", else a raster driver with Create() whose extensions list it (e.g. ".img":
 * HFA, ".bil": EHdr), else one with CreateCopy() only (".png": PNG, ".jpg": JPEG); empty when
 * none does. Case-insensitive. Thread-safe; throws only
 * std::bad_alloc (and "" in a build without GDAL).
 */
VSR_EXPORT std::string output_driver_for(const std::string& path);

/// A raster file's header with what varies per band.
struct RasterFileInfo {
  /// As read_raster_metadata, except that the bands may differ in nodata: metadata.nodata and
  /// metadata.exact_nodata are band 1's.
  RasterMetadata metadata;
  /// Each band's nodata, exactly (band_nodata[0] is band 1's).
  std::vector<std::optional<NodataValue>> band_nodata;
  /// Whether the file has a geotransform (metadata.affine is GDAL's default otherwise).
  bool has_geotransform = true;
  /// Band 1's block (GDALGetBlockSize) as (rows, cols): the pixels GDAL reads and decodes at
  /// once, a GeoTIFF's tile or strip (RowsPerStrip rows of the whole width), a scanline of most
  /// other formats. Windows aligned to it decode no block twice.
  std::pair<std::int64_t, std::int64_t> block_shape{1, 1};
};

/**
 * @brief The header of the raster file @p path with each band's nodata; unlike
 * read_raster_metadata it accepts bands of differing nodata (VRT stacks, HFA).
 * @throws std::system_error (errno's code, e.g. std::errc::no_such_file_or_directory) for a
 *         local file that is missing or cannot be reached; std::invalid_argument for a file
 *         that is not a raster @p open allows; std::runtime_error for an unsupported or mixed data
 * type, or a build without GDAL.
 */
VSR_EXPORT RasterFileInfo read_raster_info(const std::string& path, const OpenOptions& open = {});

/**
 * @brief The header of the raster file @p path: shape, band count, dtype, nodata (band 1's),
 * affine, CRS (WKT) and driver short name.
 * @throws std::system_error (errno's code) for a local file that is missing or cannot be
 *         reached; std::invalid_argument for a file GDAL cannot open as an allowed raster (GDAL's
 *         message included); std::runtime_error for a data type this library does not have (e.g.
 * complex), bands of differing data types or nodata values, or a build without GDAL.
 */
VSR_EXPORT RasterMetadata read_raster_metadata(const std::string& path);

/// read_raster_metadata opening @p path as @p open allows (a refused driver or path is
/// std::invalid_argument, naming the option that would allow it).
VSR_EXPORT RasterMetadata read_raster_metadata(const std::string& path, const OpenOptions& open);

/**
 * @brief Reads @p window (default: the whole raster) of the 1-based @p bands (default: all, in
 * order; a band may be repeated) of @p path into a new host raster. The affine is shifted to the
 * window's origin; nodata and CRS as read_raster_metadata (nodata checked over the selected
 * bands only).
 * @throws std::system_error for a missing or unreachable file, as read_raster_metadata;
 *         std::invalid_argument for a file that is not an allowed raster, a window outside the
 *         raster or of non-positive size, a band index outside [1, band count];
 *         HostMemoryLimitError when the pixels exceed available_host_memory();
 *         std::runtime_error as read_raster_metadata or when GDAL fails to read.
 */
VSR_EXPORT OwnedRasterArray read_raster(const std::string& path,
                                        std::optional<RasterWindow> window = {},
                                        std::vector<int> bands = {});

/// read_raster opening @p path as @p open allows.
VSR_EXPORT OwnedRasterArray read_raster(const std::string& path, std::optional<RasterWindow> window,
                                        std::vector<int> bands, const OpenOptions& open);

/**
 * @brief Writes @p raster (host or device resident; a device raster is copied to the host, not
 * moved) to @p path, replacing any existing file only once the new one is complete (see
 * "Outputs" above): its dtype, every band, affine, CRS and nodata (on every band).
 * @throws std::invalid_argument, before anything is touched, for a driver that is unknown or
 *         not available in this GDAL (GDAL_SKIP), writes no raster, has no Create or writes no
 *         file (MEM), a dtype the driver does not create, creation options the driver refuses
 *         (an unknown name, a value of the wrong type or not among its choices, such as
 *         COMPRESS=BOGUS, which GDAL alone would only warn about; a GeoTIFF tile side that is
 *         not a positive multiple of 16), a CRS GDAL does not understand, or a target that is
 *         not a regular file; HostMemoryLimitError when a device raster's host copy does not
 *         fit; std::runtime_error when the temporary directory cannot be created, GDAL cannot
 *         create, write, flush or close the file (its message included; e.g. a full disk), the
 *         driver wrote no file under the target's name or one GDAL cannot read back, or a
 *         rename fails. @p path is then as it was.
 */
VSR_EXPORT void write_raster(const std::string& path, const OwnedRasterArray& raster,
                             const WriteOptions& options = {});

/**
 * @brief Checks @p options as write_raster and the streamed writers will, without writing
 * anything: the driver exists in this GDAL (the name in any case: "gtiff" is GTiff), writes
 * rasters to a file and has Create, and its creation options (COMPRESS, the tile side,
 * NUM_THREADS and every KEY=VALUE of creation_options) are ones it takes. For a tool to refuse
 * bad options before it reads or computes anything.
 * @throws std::invalid_argument naming what the driver refuses (as write_raster would).
 */
VSR_EXPORT void check_write_options(const WriteOptions& options);

/**
 * @brief Checks, before anything is computed, that @p path can be written with @p options as a
 * raster of @p band_count bands of @p dtype with @p nodata and @p crs: check_write_options, the
 * dtype among those the driver creates, and a trial: a georeferenced 16 x 16 raster of that
 * dtype, band count, nodata and CRS written under
 * @p path's name in a temporary directory beside it, closed, read back by the driver (it must
 * have written a regular file under that name) and removed. Catches what only the driver knows
 * (GeoPackage takes 1 band of float32, BMP 1 or 3 of uint8) and what the file system refuses.
 * @p path itself is never touched.
 * @throws std::invalid_argument naming what the driver refuses (an unknown or unavailable
 *         driver, no Create, no file on disk, a dtype, band count or creation option), or
 *         what check_output_path refuses as such; std::runtime_error when the directory takes
 *         no temporary or @p path exists and options.overwrite is false.
 */
VSR_EXPORT void check_output_file(const std::string& path, const WriteOptions& options, DType dtype,
                                  int band_count,
                                  const std::optional<NodataValue>& nodata = std::nullopt,
                                  const std::string& crs = {});

/// What a streamed run copies from the input file to the output besides pixels, georeferencing
/// (affine and CRS; none when the input has no geotransform) and nodata.
enum class MetadataCopy {
  none,         ///< nothing more
  descriptive,  ///< AREA_OR_POINT, and per band its description and colour interpretation
  all  ///< descriptive, and per band scale, offset and unit: for ops that keep the values' meaning
};

/// How process_raster_file and for_each_raster_tile read, write and report.
struct StreamOptions {
  OpenOptions open;        ///< how the input is opened
  WriteOptions write;      ///< how the output is created (process_raster_file only)
  std::vector<int> bands;  ///< 1-based input bands, in order (repeats allowed); empty: all
  /// Bytes one pass may use on the host (tile, result, GDAL's blocks and cache); 0: what
  /// available_host_memory() says. A plan needing more is refused with HostMemoryLimitError.
  std::uint64_t host_memory_limit = 0;
  /// When set, GDAL's block cache (process-wide: GDALSetCacheMax64) is limited to this many bytes
  /// for the rest of the process, so that memory stays bounded by the plan; gdal_cache_for_plan()
  /// gives a value for a plan.
  std::optional<std::uint64_t> gdal_cache_bytes;
  /// Called after each tile of each pass with (tiles done, total), if set.
  std::function<void(std::int64_t done, std::int64_t total)> progress;
  /// Called before each tile is read, computed and written (a whole-raster pass is one tile:
  /// this is what moves while it runs), if set.
  std::function<void(const TileInfo& where, TileStage stage)> stage;
  /// The bands are independent (a per-band op): passes carry at most plan.bands_per_pass bands
  /// and never bands of different nodata, so every band keeps its own nodata. Also implied by a
  /// band_batches or tiled plan with fewer bands per pass than bands.
  bool per_band = false;
  /// Accept a pass that is not per-band over bands of different nodata: its tiles then carry the
  /// first band's nodata, and the op must give the other bands theirs (read_raster_info,
  /// OwnedRasterArray::with_nodata). Off: such a run is refused (std::runtime_error).
  bool mixed_nodata = false;
  /// What the output copies from the input (process_raster_file). Output band i takes input
  /// band i's (of the selected bands) when the output has as many bands as were selected.
  MetadataCopy metadata = MetadataCopy::descriptive;
  /// Tiles in flight between reading, computing and writing (TileRunOptions::overlap): 0 runs
  /// them one after another, n >= 1 overlaps the three stages with queues of n tiles; the host
  /// memory check counts the tiles that keeps live.
  int overlap = 0;
};

/**
 * @brief The tile executor's source over a raster file (tiles.hpp): the 1-based @p bands of
 * @p path (empty: all), opened once as @p open allows and read window by window through GDAL.
 * A source may be read from any one thread at a time (the reading stage of an overlapped run);
 * each read reports GDAL's errors as its own.
 * @throws (constructor) what read_raster_info throws; std::invalid_argument for a band outside
 *         the file. (read) std::runtime_error when GDAL fails to read, std::logic_error after
 *         close().
 */
class VSR_EXPORT RasterFileSource final : public TileSource {
 public:
  explicit RasterFileSource(const std::string& path, const OpenOptions& open = {},
                            std::vector<int> bands = {});
  ~RasterFileSource() override;
  RasterFileSource(const RasterFileSource&) = delete;
  RasterFileSource& operator=(const RasterFileSource&) = delete;
  RasterMetadata metadata() const override;
  std::vector<std::optional<NodataValue>> band_nodata() const override;
  OwnedRasterArray read(const RasterWindow& window, int first_band, int band_count) override;
  /// The path opened.
  const std::string& path() const;
  /// The selected bands, 1-based.
  const std::vector<int>& bands() const;
  /// Whether the file has a geotransform (the metadata's affine is GDAL's default otherwise).
  bool has_geotransform() const;
  /// For each selected band, whether its GDAL mask decides which pixels are valid (GDAL's mask
  /// flags: an internal or .msk mask, an alpha band, NODATA_VALUES; the band's own nodata is
  /// then not consulted, as in GDAL); its masked pixels are read as its nodata (band_nodata).
  /// All false with OpenOptions::ignore_mask.
  const std::vector<bool>& masked_bands() const;
  /// For each selected band, whether its nodata (band_nodata) was chosen by this source only to
  /// mark masked pixels, not the file's own: the output-nodata rule gives such a value to an
  /// integer output only (NodataCandidate::marks_mask, CalcInput::nodata_marks_mask).
  const std::vector<bool>& nodata_marks_mask() const;
  /**
   * @brief Bytes of host memory a run of @p plan over this source needs at once: every tile
   * and result live (overlap_tiles_live(@p overlap) of each; results counted at up to 8 bytes
   * a pixel, with a host copy), one GDAL block beside the cache, and the cache itself
   * (@p gdal_cache_bytes, or GDAL's setting when empty).
   * @throws std::overflow_error when it does not fit in 64 bits; as tile_passes for a bad plan.
   */
  std::uint64_t run_host_bytes(const RasterPlan& plan, bool per_band, int overlap,
                               std::optional<std::uint64_t> gdal_cache_bytes = {}) const;
  /**
   * @brief Readies a run of @p plan: refuses it up front (HostMemoryLimitError, the message
   * starting with @p name) when run_host_bytes(plan, options.per_band, options.overlap,
   * options.gdal_cache_bytes) exceeds options.host_memory_limit (0: available_host_memory()),
   * then limits GDAL's block cache to options.gdal_cache_bytes when set (process-wide).
   * process_raster_file and for_each_raster_tile call it; a program walking this source with
   * run_tiles itself calls it first.
   */
  void prepare(const RasterPlan& plan, const StreamOptions& options,
               const std::string& name = "RasterFileSource") const;
  /// Bytes of one GDAL block holding one band's data (every band's, pixel-interleaved).
  std::uint64_t block_bytes() const;
  /// A GDAL block cache size for a run of @p plan (see gdal_cache_for_plan).
  std::uint64_t gdal_cache_for(const RasterPlan& plan, bool per_band) const;
  /// Closes the file; later reads throw std::logic_error. An output that replaces the file (the
  /// same path) is committed only after the input is closed. Never throws.
  void close() noexcept;

 private:
  friend class RasterFileSink;  // copies the input's descriptive metadata before a run
  struct State;
  std::unique_ptr<State> state_;
};

/**
 * @brief The tile executor's sink into a raster file, all or nothing (see "Outputs"): the
 * driver and creation options are checked and the temporary made at construction (before any
 * work); the dataset is created at begin() with the first result's dtype and band count and the
 * source's grid; each pass's nodata goes on its bands (GTiff keeps one nodata for all bands:
 * passes of different nodata are refused there); each write stores the result's interior; at
 * finish() the file is closed, verified and renamed over @p path. Destroyed without finish(),
 * nothing is left behind. Its members may be called from any one thread at a time.
 * @throws (constructor) what write_raster throws for the driver, options and path;
 *         (begin, write, finish) what write_raster throws for the dataset.
 */
class VSR_EXPORT RasterFileSink final : public TileSink {
 public:
  RasterFileSink(const std::string& path, const WriteOptions& options);
  ~RasterFileSink() override;
  RasterFileSink(const RasterFileSink&) = delete;
  RasterFileSink& operator=(const RasterFileSink&) = delete;
  /// Copies what @p what names from @p source's file to the output (the descriptive metadata of
  /// band i goes to output band i when the output has as many bands as the source selected),
  /// and georeferences the output only if @p source has a geotransform. Before the run.
  void copy_from(const RasterFileSource& source, MetadataCopy what);
  /// Called once the output is closed and verified, right before it replaces @p path (an input
  /// at the same path is closed there). Before the run.
  void before_commit(std::function<void()> hook);
  void begin(const TileOutput& output) override;
  void begin_pass(int output_band, int band_count,
                  const std::optional<NodataValue>& nodata) override;
  void write(const OwnedRasterArray& result, const TileInfo& where) override;
  void finish() override;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/**
 * @brief A GDAL block cache size for streaming @p in with @p plan: enough for the input blocks of
 * one row of tiles (so no block is decoded twice), at least two of the file's blocks, and at
 * most 64 MiB more than that minimum. This is the fixed overhead that peak memory adds to a pass.
 * @throws as read_raster_metadata.
 */
VSR_EXPORT std::uint64_t gdal_cache_for_plan(const std::string& in, const RasterPlan& plan,
                                             const StreamOptions& options = {});

/// One file of a raster written in parts (merge_raster_parts): its pixels are @p window of the
/// whole raster, for the whole raster's bands [first_band, first_band + the file's band count).
struct RasterPart {
  std::string path;     ///< a raster file of a default input format (default_input_drivers)
  RasterWindow window;  ///< where its pixels go in the whole raster
  int first_band = 0;   ///< the whole raster's band (0-based) that the file's band 1 is
};

/**
 * @brief Writes the raster made of @p parts as one file @p out, all or nothing (see "Outputs"),
 * on the tile executor: the parts are one tile source whose reads are assembled from the parts
 * they overlap, written through RasterFileSink in tiles of the largest part's rows and columns
 * and every band (one tile in memory at a time). For a raster whose pieces were written apart
 * (the Dask layer writes each chunk to a part file).
 *
 * @p layout is the whole raster: height, width, band_count, dtype, nodata (exact_nodata when set,
 * else nodata), affine and CRS; the output has them exactly, a 64-bit integer nodata included.
 * The parts must form a grid of it, as Dask chunks do: the distinct band, row and column starts
 * of the parts cut the raster into cells, and each cell is exactly one part. Every part is
 * checked before anything is written: its size is its window's, its dtype the layout's, its
 * bands lie inside the layout's, and each band's nodata is the layout's (the same value in the
 * dtype; NaN equals NaN). The parts are read, never changed or removed.
 * @throws std::invalid_argument for an empty @p parts, a layout without pixels, parts that do
 *         not form a grid of the raster (overlaps, gaps, a window outside it: the message names
 *         the part), a part whose header differs from its place in the layout (named);
 *         std::system_error for a part that is missing or cannot be read (errno's code);
 *         HostMemoryLimitError when one tile needs more host memory than available_host_memory();
 *         std::runtime_error for a build without GDAL; what RasterFileSink and read_raster throw.
 *         @p out is then as it was.
 */
VSR_EXPORT void merge_raster_parts(const std::vector<RasterPart>& parts,
                                   const RasterMetadata& layout, const std::string& out,
                                   const WriteOptions& options = {});

/**
 * @brief Processes the raster file @p in tile by tile following @p plan and writes @p out (all
 * or nothing, see "Outputs" above).
 *
 * Passes: with options.per_band, or a band_batches or tiled plan that carries fewer bands per
 * pass than are selected (as a per-band plan makes), bands are independent: a pass carries at
 * most plan.bands_per_pass consecutive selected bands of one nodata, @p op gets a tile of those
 * bands and must return as many, which become the output's bands at the same positions, each
 * with its pass's result nodata (GTiff keeps one nodata for all bands: passes whose results
 * differ in nodata are refused there). Otherwise one pass carries every selected band (the
 * tile's nodata is the first band's: read_raster_info gives each band's) and the output has the
 * bands @p op returns. Only one pass's bands are read.
 *
 * Tiles are row-major over plan.tile_shape (a whole or band_batches plan is one tile: the whole
 * raster). Each tile is read with plan.halo extra pixels per side, clamped at the raster edges
 * (no padding), with the affine shifted to the read window's origin; @p op returns a raster of
 * its input's height and width, whose interior (the effective tile) is written. With plan.halo
 * >= the op's radius the file equals the whole-raster result.
 *
 * The output is created on the first tile's result, with that result's dtype and nodata (the
 * op's, not the input's: an op may change the dtype), the input's full shape, affine (none if
 * the input has no geotransform) and CRS, and the metadata options.metadata names.
 * Only one tile is live at a time. Before reading, the host memory of a pass (tile and result,
 * GDAL's blocks, the cache) is compared with options.host_memory_limit.
 * @throws std::invalid_argument for an empty @p op, a negative halo, a tiled plan without a
 *         positive tile_shape, bands_per_pass < 1, or a tile result of the wrong shape or band
 *         count or of a dtype or nodata differing from the first tile's; HostMemoryLimitError;
 *         what read_raster / write_raster throw (what the driver or @p out's path refuses is
 *         refused before any tile is read); whatever @p op throws. @p out is then as it was.
 */
VSR_EXPORT void process_raster_file(const std::string& in, const std::string& out, const BandOp& op,
                                    const RasterPlan& plan, const StreamOptions& options);

/**
 * @brief Reads the raster file @p in tile by tile as process_raster_file does (same passes, tiles,
 * halo and memory check) and hands each tile to @p visit with where it is; writes nothing. For
 * reductions (statistics, ranges) that must not hold the raster.
 * @throws std::invalid_argument for an empty @p visit or a plan as process_raster_file;
 *         HostMemoryLimitError; what read_raster throws; whatever @p visit throws.
 */
VSR_EXPORT void for_each_raster_tile(
    const std::string& in, const RasterPlan& plan,
    const std::function<void(const OwnedRasterArray& tile, const TileInfo& where)>& visit,
    const StreamOptions& options = {});

/**
 * @brief Processes the raster file @p in tile by tile following @p plan and writes @p out (all
 * or nothing): process_raster_file with the default OpenOptions, every band, @p options as the
 * write options and @p progress, called after each tile with (tiles done, total tiles). Passes,
 * tiles, halo, the output's creation and the memory check are process_raster_file's.
 * @throws what process_raster_file throws. On any error @p out is as it was.
 */
VSR_EXPORT void process_raster_streamed(
    const std::string& in, const std::string& out, const BandOp& op, const RasterPlan& plan,
    const WriteOptions& options = {},
    std::function<void(std::int64_t done, std::int64_t total)> progress = {});

}  // namespace vibespatial::raster
