// SPDX-License-Identifier: Apache-2.0
// Raster value types: element types, georeferencing, metadata, processing plans and the owned
// band-major raster.
//
// Glossary
// - band: one 2D plane of a raster; a raster is (bands, height, width), band-major.
// - dtype: the element type of every band (DType); itemsize is its width in bytes.
// - affine: the pixel -> world transform in rasterio order (a, b, c, d, e, f):
//   x = a*col + b*row + c, y = d*col + e*row + f. GDAL's geotransform order is (c, a, b, f, d, e);
//   convert with Affine::from_gdal / Affine::to_gdal, never by copying six numbers.
// - plan: how a raster goes through the device within a VRAM budget (RasterPlan): whole, in
//   batches of whole bands, or in spatial tiles (each tile carries the bands of one pass).
// - halo: overlap pixels read around each tile for stencil operations; a plan's tile_shape
//   excludes it, the physical tile is (tile_h + 2*halo, tile_w + 2*halo).
#pragma once

#include <vibespatial/raster/export.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

// CUstream, exactly as <cuda.h> declares it, so this header needs no CUDA headers.
typedef struct CUstream_st* CUstream;  // NOLINT(modernize-use-using)

namespace vibespatial::raster {

/** @brief Element type of a raster's bands; the names are numpy's. */
enum class DType : std::uint8_t {
  uint8,
  int8,
  uint16,
  int16,
  uint32,
  int32,
  uint64,
  int64,
  float32,
  float64
};

/**
 * @brief Width of one element of @p dtype, in bytes (1, 1, 2, 2, 4, 4, 8, 8, 4, 8).
 * @throws std::invalid_argument if @p dtype is not one of the enumerators.
 * Thread-safe.
 */
VSR_EXPORT std::size_t itemsize(DType dtype);

/// Whether @p dtype is float32 or float64 (NaN is a value of it; every other DType is an
/// integer type). Thread-safe, never throws; false for a value that is not an enumerator.
VSR_EXPORT bool is_floating_point(DType dtype) noexcept;

/**
 * @brief The numpy name of @p dtype ("uint8" ... "float64"); "unknown" for a value that is not
 * one of the enumerators. The view refers to static storage. Thread-safe, never throws.
 */
VSR_EXPORT std::string_view to_string(DType dtype) noexcept;

/**
 * @brief The DType whose numpy name is @p name (exactly, e.g. "float32"); empty if none is.
 * Thread-safe, never throws.
 */
VSR_EXPORT std::optional<DType> dtype_from_string(std::string_view name) noexcept;

/// Whether two nodata values are the same sentinel: both absent, both NaN (NaN equals NaN,
/// whatever the scalar type it came from), or equal values. Thread-safe; never throws.
VSR_EXPORT bool same_nodata(const std::optional<double>& a,
                            const std::optional<double>& b) noexcept;

/**
 * @brief A nodata sentinel held exactly: any double, and every 64-bit integer, also those a
 * double cannot hold (INT64_MAX, UINT64_MAX, 2^53 + 1, ...). RasterMetadata::exact_nodata and
 * OwnedRasterArray::exact_nodata carry it; their `nodata` (a double) is its nearest double.
 *
 * The value is canonical: an integer a double holds exactly is stored as that double, so
 * NodataValue(5.0) == NodataValue::from_int64(5). A plain value type; never throws.
 */
class VSR_EXPORT NodataValue {
 public:
  /// The double @p value (NaN included). Implicit, so a double nodata converts.
  NodataValue(double value = 0) noexcept;  // NOLINT(google-explicit-constructor)
  /// The integer @p value exactly.
  static NodataValue from_int64(std::int64_t value) noexcept;
  /// The integer @p value exactly.
  static NodataValue from_uint64(std::uint64_t value) noexcept;

  /// The nearest double (INT64_MAX gives 2^63).
  double to_double() const noexcept;
  /// The value as an int64 when it is an integer in int64's range; empty otherwise.
  std::optional<std::int64_t> as_int64() const noexcept;
  /// The value as a uint64 when it is an integer in uint64's range; empty otherwise.
  std::optional<std::uint64_t> as_uint64() const noexcept;
  /// Whether the value is NaN.
  bool is_nan() const noexcept;
  /// Exact decimal text: an integer's digits ("9223372036854775807", "-9999"), "nan", "inf",
  /// "-inf", or the shortest text that reads back as the same double ("0.1").
  std::string to_string() const;

  /// The same value (NaN equals NaN).
  friend VSR_EXPORT bool operator==(const NodataValue& a, const NodataValue& b) noexcept;

 private:
  enum class Kind : std::uint8_t { real, int64, uint64 };
  Kind kind_ = Kind::real;
  double real_ = 0;
  std::uint64_t bits_ = 0;  ///< the integer (two's complement for int64) unless real
};

/**
 * @brief Whether @p value is exactly a value of @p dtype: any value for float64, a value float32
 * holds (NaN and infinities included) for float32, an integer in the type's range for integer
 * types (every int64 and uint64, exactly). The one range rule of the library (ops, vsr-run and
 * the Python package ask it). Thread-safe; never throws.
 */
VSR_EXPORT bool dtype_holds(DType dtype, const NodataValue& value) noexcept;

/**
 * @brief Pixel -> world transform in rasterio order: x = a*col + b*row + c,
 * y = d*col + e*row + f. The default is the identity with a north-up flip (e = -1).
 *
 * (col, row) are pixel-edge coordinates: (0, 0) is the outer corner of the first pixel.
 * A plain value type; thread-safe as any const object.
 */
struct VSR_EXPORT Affine {
  double a = 1, b = 0, c = 0, d = 0, e = -1, f = 0;

  /**
   * @brief Builds the transform from a GDAL geotransform (GetGeoTransform order):
   * gt = {c, a, b, f, d, e}, i.e. {origin x, pixel width, row rotation, origin y,
   * column rotation, pixel height}.
   */
  static Affine from_gdal(const std::array<double, 6>& geotransform) noexcept;

  /** @brief This transform in GDAL geotransform order {c, a, b, f, d, e}. */
  std::array<double, 6> to_gdal() const noexcept;

  /** @brief World coordinates {x, y} of pixel-edge position (@p col, @p row). */
  std::array<double, 2> apply(double col, double row) const noexcept;

  /**
   * @brief The transform of a window (a tile, a read window) whose first pixel is pixel
   * (@p col, @p row) of this raster: the same a, b, d, e, and (c, f) = apply(col, row).
   */
  Affine shifted(std::int64_t col, std::int64_t row) const noexcept;

  friend bool operator==(const Affine&, const Affine&) = default;
};

/**
 * @brief Axis-aligned world extent of a raster, in the units of its CRS.
 * left <= right and bottom <= top always hold (they are min/max over the four corners).
 */
struct RasterBounds {
  double left = 0, bottom = 0, right = 0, top = 0;

  friend bool operator==(const RasterBounds&, const RasterBounds&) = default;
};

/**
 * @brief What a raster header says, without the pixels (the reference's RasterMetadata).
 * A plain value type.
 */
struct VSR_EXPORT RasterMetadata {
  std::int64_t height = 0, width = 0;
  int band_count = 1;
  DType dtype = DType::float32;
  std::optional<double> nodata;  ///< NaN is a valid nodata value and compares equal to NaN
  /// The nodata exactly, when set (readers of files and OwnedRasterArray::metadata set it;
  /// `nodata` is then its nearest double). Empty with `nodata` set: `nodata` is exact.
  std::optional<NodataValue> exact_nodata;
  Affine affine;
  std::string crs;     ///< WKT, "EPSG:n", or empty
  std::string driver;  ///< e.g. "GTiff"; empty for in-memory rasters

  /**
   * @brief height * width (pixels of one band).
   * @throws std::overflow_error if the product does not fit in 64 bits.
   */
  std::int64_t pixel_count() const;

  /**
   * @brief The world extent: min/max of the affine image of the four raster corners
   * (0, 0), (width, 0), (0, height), (width, height). Correct for rotated and flipped
   * transforms.
   */
  RasterBounds bounds() const noexcept;
};

/**
 * @brief How a plan moves a raster through the device.
 * - whole: all bands at once, no tiling.
 * - band_batches: whole bands, bands_per_pass of them at a time (only for per-band work).
 * - tiled: spatial tiles of tile_shape; each tile carries bands_per_pass bands.
 */
enum class TilingStrategy { whole, band_batches, tiled };

/** @brief "whole", "band_batches" or "tiled"; "unknown" otherwise. Never throws. */
VSR_EXPORT std::string_view to_string(TilingStrategy strategy) noexcept;

/**
 * @brief The planner's decision for one raster and one operation (see dispatch.hpp).
 * A plain value type.
 */
struct RasterPlan {
  TilingStrategy strategy = TilingStrategy::whole;
  /// Effective (output) tile (height, width), halo excluded; empty unless tiled.
  std::optional<std::pair<std::int64_t, std::int64_t>> tile_shape;
  int halo = 0;                               ///< overlap pixels on each side of a tile
  std::int64_t n_tiles = 0;                   ///< ceil(H/th) * ceil(W/tw); 0 unless tiled
  std::uint64_t estimated_vram_per_tile = 0;  ///< bytes one pass needs on the device
  int bands_per_pass = 1;                     ///< band_count for whole and (non per-band) tiled
  bool fits_budget = true;  ///< false: even the smallest pass exceeds the usable budget

  friend bool operator==(const RasterPlan&, const RasterPlan&) = default;
};

/// A pixel window of a raster: columns [col_off, col_off + width), rows [row_off, row_off +
/// height). Must lie inside the raster with width and height > 0.
struct RasterWindow {
  std::int64_t col_off = 0, row_off = 0, width = 0, height = 0;

  friend bool operator==(const RasterWindow&, const RasterWindow&) = default;
};

/** @brief Where a raster's authoritative pixels live. */
enum class Residency { host, device };

namespace detail {
struct RasterStorage;
}  // namespace detail

class RasterDiagnostics;  // diagnostics.hpp

/**
 * @brief An owned, band-major (bands, height, width) raster with its georeferencing, resident
 * on the host and/or the device. Copies and band views share storage (a copy is a handle, not
 * a deep copy).
 *
 * Residency is a property of the shared storage: move_to on a band view moves every band of the
 * storage, and the pixels live in exactly one place at a time (host_data() is null while they
 * are on the device; moving back to the host frees the device copy), so no stale mirror exists.
 * Device memory comes from the pool (device_allocate, for the legacy default stream, or for the
 * stream given to allocate) and goes back to it, on that stream, when the last handle sharing the
 * storage is destroyed.
 *
 * Thread-safety: distinct objects that share no storage may be used from distinct threads
 * freely. Handles sharing storage may be used concurrently through const members; residency
 * changes are serialised by a mutex in the storage, but a non-const call (move_to, device_data,
 * mutable_host_data) invalidates pointers other threads obtained from host_data(),
 * device_pointer() or mutable_host_data(), so callers must not mix those concurrently.
 */
class VSR_EXPORT OwnedRasterArray {
 public:
  /**
   * @brief Copies @p bands * @p height * @p width elements of @p dtype from @p data (band-major)
   * into a new host-resident raster.
   * @throws std::invalid_argument for a null @p data, non-positive sizes, a bad dtype or a NaN
   *         @p nodata on an integer dtype (as the reference's from_numpy);
   *         std::overflow_error if the byte size does not fit in 64 bits.
   */
  static OwnedRasterArray from_host(const void* data, DType dtype, int bands, std::int64_t height,
                                    std::int64_t width, std::optional<double> nodata = {},
                                    Affine affine = {}, std::string crs = {});

  /**
   * @brief A new raster of @p bands x @p height x @p width @p dtype elements resident at
   * @p where, contents unspecified (for operations that write their output in place: on the
   * device through device_data(), on the host through mutable_host_data()). Device memory comes
   * from the pool.
   * @throws as from_host (except for @p data); OutOfMemoryError / CudaError /
   *         DriverUnavailableError for a device raster the device cannot hold.
   */
  static OwnedRasterArray allocate(Residency where, DType dtype, int bands, std::int64_t height,
                                   std::int64_t width, std::optional<double> nodata = {},
                                   Affine affine = {}, std::string crs = {});

  /**
   * @brief As allocate(), with the device memory from the pool for @p stream (a stream of the
   * device's primary context; nullptr: the legacy default stream, as allocate()): usable at once
   * in @p stream's order, also where the pool hands it a block freed on another stream (the pool
   * then makes @p stream wait for that stream's work). Allocate what a stream writes for that
   * stream: memory for another stream may still be in use by work queued elsewhere that
   * @p stream does not wait for. The storage goes back to the pool in @p stream's order when its
   * last handle is destroyed (or the raster moves to the host), so work still queued there on it
   * runs first: @p stream must outlive the raster (destroy a stream's rasters, then call
   * forget_stream, then destroy the stream). Ignored for a host raster. Throws as allocate().
   */
  static OwnedRasterArray allocate(Residency where, DType dtype, int bands, std::int64_t height,
                                   std::int64_t width, std::optional<double> nodata, Affine affine,
                                   std::string crs, CUstream stream);

  /**
   * @brief Stacks single-band results into one raster; affine, CRS and nodata come from
   * @p source. One result is returned as is (sharing its storage) with @p source's metadata.
   * Several results are copied, band after band (a multi-band result contributes all its
   * bands), into new storage: on the device (one pool allocation, device-to-device copies) if
   * any result is on the device, else on the host.
   * @throws std::invalid_argument for an empty list, or bands whose dtype, nodata (NaN equals
   *         NaN) or shape differ from band 0 (the message names the band), or a NaN nodata in
   *         @p source with an integer result dtype (as the reference); OutOfMemoryError /
   *         CudaError from the device copy.
   */
  static OwnedRasterArray from_band_stack(const std::vector<OwnedRasterArray>& bands,
                                          const OwnedRasterArray& source);

  /// Bands in this raster (1 for a band view).
  int band_count() const;
  /// Rows of every band, in pixels.
  std::int64_t height() const;
  /// Columns of every band, in pixels.
  std::int64_t width() const;
  /// Element type of every band.
  DType dtype() const;
  /// The nodata value shared by all bands; empty if none. NaN is a valid value. For a 64-bit
  /// integer sentinel a double cannot hold (INT64_MAX), the nearest double: exact_nodata() has
  /// the value itself.
  std::optional<double> nodata() const;
  /// The nodata value exactly (see NodataValue); empty if none. The ops test pixels against it.
  std::optional<NodataValue> exact_nodata() const;
  /**
   * @brief A handle on the same pixels (shared storage, as a copy) whose nodata is @p nodata;
   * affine and CRS as this one's.
   * @throws std::invalid_argument for a NaN nodata on an integer dtype.
   */
  OwnedRasterArray with_nodata(std::optional<NodataValue> nodata) const;
  /**
   * @brief A handle on the same pixels (shared storage, as a copy) whose affine and CRS are
   * @p affine and @p crs; nodata as this one's. Other handles keep theirs. Throws only
   * std::bad_alloc.
   */
  OwnedRasterArray with_georeferencing(const Affine& affine, std::string crs) const {
    OwnedRasterArray r = *this;
    r.affine_ = affine;
    r.crs_ = std::move(crs);
    return r;
  }
  /// Pixel -> world transform (rasterio order).
  const Affine& affine() const;
  /// Coordinate reference system: WKT, "EPSG:n", or empty.
  const std::string& crs() const;
  /// Where the authoritative pixels are now.
  Residency residency() const;
  /// Shape, dtype and georeferencing as a RasterMetadata (driver empty).
  RasterMetadata metadata() const;

  /**
   * @brief Zero-copy single-band view of band @p i on the same residency.
   * @throws std::out_of_range if @p i is not in [0, band_count()).
   */
  OwnedRasterArray band(int i) const;
  /**
   * @brief Zero-copy view of the @p count bands starting at band @p first, on the same
   * residency, with this view's nodata, affine and CRS.
   * @throws std::out_of_range unless 0 <= @p first, 1 <= @p count and first + count <=
   *         band_count().
   */
  OwnedRasterArray bands(int first, int count) const;

  /**
   * @brief Copies the pixels of the whole storage host <-> device through the pool (copies on
   * the legacy default stream, complete when this returns: the device pointer may be used at
   * once from any stream, or the host pointer at once); a no-op if already there. The old copy
   * is freed.
   * @throws OutOfMemoryError / CudaError / DriverUnavailableError; the raster is unchanged then.
   */
  void move_to(Residency target);

  /**
   * @brief Copies this view's bands*height*width*itemsize bytes, band-major, into @p dst, from
   * either residency (a synchronous device-to-host copy when on the device).
   * @throws std::invalid_argument for a null @p dst; CudaError.
   */
  void copy_to_host(void* dst) const;

  /**
   * @brief A deep copy of this view's bands in new storage at @p where, with this view's nodata,
   * affine and CRS: one copy (host to host, host to device, device to host or device to device),
   * complete when this returns. The source is unchanged (unlike move_to, which moves every band
   * of the shared storage). Device memory comes from the pool.
   * @throws std::invalid_argument if @p where is not a Residency value; OutOfMemoryError /
   *         CudaError / DriverUnavailableError for a device copy.
   */
  OwnedRasterArray clone_to(Residency where) const;

  /**
   * @brief The device pointer of the first element; moves the raster to the device first (as
   * move_to: the copy is complete when this returns).
   */
  void* device_data();

  /** @brief The device pointer of the first element, or null unless on the device; never moves. */
  const void* device_pointer() const;

  /** @brief The host pointer of the first element; null while the pixels are only on the device. */
  const void* host_data() const;

  /** @brief Writable host pointer of the first element; moves the raster to the host first. */
  void* mutable_host_data();

  /// Bytes of this view's pixels: band_count * height * width * itemsize.
  std::size_t byte_size() const;

  /**
   * @brief The diagnostic log of this raster's storage (diagnostics.hpp), shared by every copy
   * and band view of it; never null. from_host records a created event, move_to, device_data
   * and mutable_host_data a transfer event for each copy they make (bytes and seconds),
   * from_band_stack gives a stack of several results their events, and the per-band
   * dispatchers a runtime event naming the executor and its path. Thread-safe.
   */
  std::shared_ptr<RasterDiagnostics> diagnostics() const;

  /**
   * @brief Makes @p log this storage's diagnostic log (for a copy that takes over from the
   * raster it copied, so the history follows the pixels). Other handles of the storage see it
   * too. @throws std::invalid_argument for a null @p log.
   */
  void adopt_diagnostics(std::shared_ptr<RasterDiagnostics> log);

 private:
  OwnedRasterArray(std::shared_ptr<detail::RasterStorage> storage, int first_band, int band_count);

  std::shared_ptr<detail::RasterStorage> storage_;
  int first_band_ = 0;  ///< index of this view's first band in storage_
  int band_count_ = 0;  ///< bands in this view
  // Georeferencing is per handle, so from_band_stack can give a shared result the source's
  // metadata without changing the other handles (the reference overwrote them in place).
  std::optional<NodataValue> nodata_;
  Affine affine_;
  std::string crs_;
};

/** @brief A per-band (or per-tile) operation: takes one input, returns its result. */
using BandOp = std::function<OwnedRasterArray(const OwnedRasterArray& band)>;

}  // namespace vibespatial::raster
