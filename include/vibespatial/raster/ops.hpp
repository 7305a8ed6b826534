// SPDX-License-Identifier: Apache-2.0
// Band operations: statistics, rescale, clip, nodata fill, normalized difference, histograms,
// a 3x3 focal mean and band math (calc: expressions over named inputs), for all ten dtypes.
//
// Where they run: an operation runs where its input lives. A host-resident raster is processed
// by the host backend (Thrust's OpenMP backend, all cores); a device-resident raster by a device
// backend: on a real driver the CUDA backend (Thrust and CUB on the device, temporaries from the
// device pool) when the library was built with CUDA (ops_built_with_cuda()), else the call throws
// std::runtime_error ("built without CUDA"); on the host driver emulator, in every build, the
// emulated device backend: the host backend's work queued in stream order on the emulator's
// streams (cuLaunchHostFunc) over its device memory, temporaries from the pool on the op's
// stream, results read back with the driver's copies, so results equal the host backend's and
// everything around the kernels runs as on a GPU. Raster results have the input's residency,
// shape, affine and CRS.
//
// Valid pixels: a pixel is valid unless it equals the raster's nodata value or is NaN (floating
// dtypes; a NaN nodata marks NaN pixels only). An integer raster whose nodata is not exactly
// representable in its dtype has no nodata pixels.
//
// Compute type (as the reference's binary ops): float32 for uint8, int8, uint16, int16 and
// float32; float64 for uint32, int32, uint64, int64 and float64 (compute_dtype()). Elementwise
// arithmetic runs in the compute type; reductions (statistics) accumulate in float64, and
// histogram bins are numpy's (edges in float64, held as float32 for float32 data).
//
// The CUDA backend is compiled without FMA contraction (-fmad=false) so that elementwise results
// round exactly as on the host: integer results and counts are equal on both backends, floating
// results of elementwise ops too; statistics differ only by summation order.
//
// Streams: the forms without a stream queue their device work on the calling thread's op stream
// (current_op_stream(), dispatch.hpp: the legacy default stream unless an OpStreamScope set
// another, as the tile executor does for device tiles); each operation also has a form taking the
// CUstream to queue it on (see "Stream forms" below). A device result is pool memory for the
// stream its work is queued on.
//
// Errors on the device: a failing driver or runtime call, a kernel launch error or a full device
// reaches the caller as CudaError (code() a CUresult; runtime_code() the cudaError_t of a failed
// runtime call) or OutOfMemoryError, whose message names the operation; a failure never leaves
// the CUDA runtime's error state behind for the next operation.
//
// This header includes no Thrust, CUB or CUDA header.
#pragma once

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/export.hpp>
#include <vibespatial/raster/placement.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

// CUstream, exactly as <cuda.h> declares it, so this header needs no CUDA headers.
typedef struct CUstream_st* CUstream;  // NOLINT(modernize-use-using)

namespace vibespatial::raster {

/// Statistics of the valid pixels of one band. With no valid pixel, count is 0 and the other
/// fields are NaN.
struct BandStatistics {
  std::int64_t count = 0;  ///< valid pixels
  double min = 0;          ///< smallest valid value (as float64)
  double max = 0;          ///< largest valid value (as float64)
  double mean = 0;         ///< arithmetic mean
  double std = 0;          ///< population standard deviation (ddof = 0, as numpy's default)
};

/// Edge handling of focal_mean_3x3 for neighbours outside the raster.
enum class EdgeMode {
  nearest,         ///< the nearest edge pixel (index clamped): aaa|abcd|ddd
  reflect,         ///< mirrored without repeating the edge, as numpy.pad 'reflect': cb|abcd|cb
  constant_nodata  ///< outside pixels count as nodata: the window is truncated at the edge
};

/// The compute type of @p dtype: float32 for integers of 16 bits or fewer and float32, float64
/// otherwise. Also the output dtype of normalized_difference and focal_mean_3x3.
/// @throws std::invalid_argument if @p dtype is not one of the enumerators.
VSR_EXPORT DType compute_dtype(DType dtype);

/// Whether this build has the CUDA backend (device-resident rasters can be processed).
VSR_EXPORT bool ops_built_with_cuda() noexcept;

/**
 * @brief Per-band count, min, max, mean and population std (ddof = 0) of the valid pixels.
 * @return one entry per band, in band order.
 * On the device each band is reduced across the whole device (one reduction per band).
 * @throws std::runtime_error for a device raster in a build without CUDA; CudaError /
 *         OutOfMemoryError from the device backend (the message names the operation).
 */
VSR_EXPORT std::vector<BandStatistics> band_statistics(const OwnedRasterArray& raster);

/**
 * @brief The statistics of two disjoint sets of pixels taken together (e.g. two tiles of one
 * band), from theirs: counts add, min/max combine exactly, mean and std by Chan et al.'s parallel
 * update, the same merge band_statistics uses inside a band. A side with count 0 is ignored
 * (both empty: count 0 and NaN fields, as band_statistics of an empty band). Associative up to
 * rounding. Never throws; thread-safe.
 */
VSR_EXPORT BandStatistics merge_statistics(const BandStatistics& a,
                                           const BandStatistics& b) noexcept;

/**
 * @brief Linear map of [@p in_min, @p in_max] onto [@p out_min, @p out_max]:
 * `out = (v - in_min) * ((out_max - out_min) / (in_max - in_min)) + out_min`, in the compute type
 * of the input dtype, converted to @p out_dtype (integers: rounded half away from zero and
 * saturated to the dtype's range; values outside the input range are extrapolated, not clamped).
 *
 * Invalid pixels are written as a nodata that no valid pixel can take: NaN for a float output
 * (the result's nodata is NaN if the source had a nodata, empty if not); for an integer output
 * of a source with a nodata, a value outside [min(out_min, out_max), max(out_min, out_max)]: the
 * source's nodata when it is such a value of @p out_dtype, else the dtype's largest value (for
 * 64-bit types the largest a double holds), else its smallest; for an integer output of a source
 * without nodata (NaN pixels of a float source), 0 and no nodata. Valid pixels outside
 * [in_min, in_max] are extrapolated and saturated, so only they can reach such a nodata: clip
 * them first where that matters.
 * @throws std::invalid_argument if a bound is not finite, @p in_min == @p in_max, @p out_dtype
 *         is not a dtype, or an integer output range covers the whole dtype while the source has
 *         a nodata (no value is left for it); std::runtime_error as band_statistics.
 */
VSR_EXPORT OwnedRasterArray rescale(const OwnedRasterArray& raster, double in_min, double in_max,
                                    double out_min, double out_max, DType out_dtype);

/**
 * @brief The raster as @p out_dtype, converted as GDAL's tools convert (gdal_translate -ot):
 * valid pixels go through the input's compute type (float64 for 32- and 64-bit integers, so
 * 64-bit values beyond 2^53 become their nearest double) and, for an integer @p out_dtype, are
 * rounded half away from zero and saturated to its range; a float64 to float32 conversion rounds
 * as IEEE does (beyond +-3.4e38: +-infinity); -0.0 stays -0.0. Invalid pixels (nodata or NaN)
 * are written as @p out_nodata, which becomes the result's nodata; without one, as NaN for a
 * float output and 0 for an integer output (the result then has no nodata, as rescale).
 * Since the output's nodata must never be a valid output value, a valid pixel that converts to
 * @p out_nodata (e.g. 255.4 to uint8 with nodata 255) is an error, checked per band.
 * Metadata as the input's. Runs where the input lives, as every operation.
 * @throws std::invalid_argument for a bad dtype, an @p out_nodata that is not exactly a value of
 *         @p out_dtype and of a double, or a valid pixel converting to @p out_nodata (the message
 *         names the band, the count and the value); std::runtime_error as band_statistics.
 */
VSR_EXPORT OwnedRasterArray convert_dtype(const OwnedRasterArray& raster, DType out_dtype,
                                          std::optional<NodataValue> out_nodata);

/// @name The output's nodata
/// One rule decides the nodata of every output of the library's ops, calc and pipelines, and of
/// the tools and the Python package built on them (docs/outputs.md, "The output's nodata"):
///
/// 1. Asked for (OutputNodata::of: vsr-run -a_nodata V, CalcOptions::output_nodata, Python's
///    nodata=): that value, which must be a value of the output's dtype. OutputNodata::none():
///    no nodata; invalid pixels are written as NaN (float types) or 0 (integer types).
/// 2. Else an output that can hold no invalid pixel (@p needed false: its inputs have no nodata
///    and nothing it computes is NaN) has none.
/// 3. Else the first candidate (the op's own nodata, then the inputs', in that order) that the
///    output's dtype holds exactly; a candidate that only marks an input's masked pixels
///    (NodataCandidate::marks_mask) is passed over for a float output, whose NaN no result
///    takes; else default_nodata(). calc's one candidate is the nodata of the first input its
///    expressions read.
///
/// A valid pixel equal to the output's nodata is never written: convert_output (and calc)
/// refuse it, whichever way the nodata was chosen, with a message that says what to change.
/// @{

/// How an output's nodata is asked for: by the rule (the default), none, or a value.
struct OutputNodata {
  enum class Mode : std::uint8_t { rule, none, value };
  Mode mode = Mode::rule;
  NodataValue value = {};  ///< for Mode::value
  static OutputNodata by_rule() noexcept { return {}; }
  static OutputNodata none() noexcept { return {Mode::none, {}}; }
  static OutputNodata of(NodataValue v) noexcept { return {Mode::value, v}; }
};

/// A nodata the rule may give an output (an op's own, or an input's), and where it comes from.
struct NodataCandidate {
  std::optional<NodataValue> value;
  /// Chosen by a reader only to mark an input's masked pixels (RasterFileSource::
  /// nodata_marks_mask): an integer output may keep it, a float output takes NaN instead.
  bool marks_mask = false;
};

/// The nodata an output of @p dtype gets when no candidate fits: NaN for float types, else the
/// type's largest value (255, 127, 65535, 32767, 4294967295, 2147483647; for the 64-bit types
/// the largest double below 2^64 / 2^63). @throws std::invalid_argument for a bad dtype.
VSR_EXPORT NodataValue default_nodata(DType dtype);

/// The rule above: the nodata of an output of @p out_dtype. Thread-safe.
/// @throws std::invalid_argument when the value asked for is not a value of @p out_dtype
///         (NaN for an integer type, 0.5 for uint8, ...), or for a bad dtype.
VSR_EXPORT std::optional<NodataValue> output_nodata(DType out_dtype, const OutputNodata& request,
                                                    const std::vector<NodataCandidate>& candidates,
                                                    bool needed);

/**
 * @brief @p raster as an output of @p out_dtype with the nodata @p out_nodata (output_nodata's
 * answer): converted as convert_dtype converts, its invalid pixels (its nodata, NaN) written as
 * @p out_nodata (without one: NaN for a float output, 0 for an integer one). Unlike
 * convert_dtype, any exact nodata is taken (64-bit sentinels a double cannot hold, such as
 * INT64_MAX: those are set on the host, a device raster going there and back), and a raster
 * already of @p out_dtype keeps its valid values exactly (only its invalid pixels are
 * rewritten; returned as is when its nodata is already @p out_nodata).
 * @throws std::invalid_argument when @p out_nodata is not a value of @p out_dtype, or a valid
 *         pixel equals @p out_nodata after the conversion (it would read as nodata): the message
 *         names the band, the count and the value, and says to give another nodata (or none),
 *         or a type that holds the values apart; std::runtime_error as band_statistics.
 */
VSR_EXPORT OwnedRasterArray convert_output(const OwnedRasterArray& raster, DType out_dtype,
                                           const std::optional<NodataValue>& out_nodata);
/// @}

/**
 * @brief Clamps valid pixels to [@p lower, @p upper] (same dtype; for integers the bounds are
 * first rounded inwards: ceil(lower), floor(upper), and saturated to the dtype's range). Invalid
 * pixels are unchanged; nodata is kept. A valid pixel clamped to a bound equal to the nodata
 * would read as nodata: that is refused, as the output-nodata rule says (clip_into does not
 * check it).
 * @throws std::invalid_argument if a bound is NaN or @p lower > @p upper (after rounding for
 *         integers), or a valid pixel is clamped to the nodata; std::runtime_error as
 *         band_statistics.
 */
VSR_EXPORT OwnedRasterArray clip(const OwnedRasterArray& raster, double lower, double upper);

/**
 * @brief Replaces invalid pixels (nodata or NaN) with @p value; the result has no nodata.
 * @throws std::invalid_argument if @p value is not exactly representable in the dtype (NaN for
 *         floats is rejected too: it would leave the pixels invalid); std::runtime_error as
 *         band_statistics.
 */
VSR_EXPORT OwnedRasterArray fill_nodata(const OwnedRasterArray& raster, double value);

/**
 * @brief (a - b) / (a + b) band by band, in the compute type of the dtype, as float32 or float64
 * (compute_dtype()). NaN where either input is invalid (each raster's own nodata) or a + b == 0;
 * the result's nodata is NaN. Metadata comes from @p a.
 * @throws std::invalid_argument if @p a and @p b differ in dtype, band count, height, width or
 *         residency; std::runtime_error as band_statistics.
 */
VSR_EXPORT OwnedRasterArray normalized_difference(const OwnedRasterArray& a,
                                                  const OwnedRasterArray& b);

/**
 * @brief Per-band histogram of the valid pixels over @p bins equal bins on [@p lower, @p upper],
 * as numpy.histogram(values, bins, (lower, upper)) counts them (numpy 2): the edges are
 * numpy.linspace(lower, upper, bins + 1) computed in float64 (edge i = i * ((upper - lower) /
 * bins) + lower, the last exactly upper) and held in numpy's bin dtype, float32 for float32 data
 * and float64 for every other dtype; bins are half-open [edge_i, edge_i+1) except the last,
 * which includes @p upper; a value is compared with the edges, and with @p lower and @p upper,
 * in that dtype. So a value on an edge goes where numpy puts it: with 10 bins on [0, 1], the
 * float64 value 0.3 is in bin 2 (edge 3 is 0.30000000000000004), the float32 value 0.7f in bin 7
 * (edge 7 as float32 is 0.7f); values outside [lower, upper] are not counted.
 * @return counts[band][bin].
 * @throws std::invalid_argument if @p bins < 1, a bound is not finite, @p lower >= @p upper, or
 *         band_count * bins exceeds 2^31 - 2 (the device counts band_count * bins + 1 levels in
 *         an int); std::runtime_error as band_statistics.
 */
VSR_EXPORT std::vector<std::vector<std::int64_t>> histogram(const OwnedRasterArray& raster,
                                                            int bins, double lower, double upper);

/**
 * @brief Mean of the valid pixels of each 3x3 window, in the compute type, as float32 or float64
 * (compute_dtype()), same shape as the input; the result's nodata is NaN. The output is NaN where
 * the centre pixel is invalid or no neighbour is valid. Neighbours outside the raster follow
 * @p edge. Bands are independent.
 *
 * Tiling: with dispatch_tiled_halo and plan.halo >= 1 the result equals the whole-raster result
 * (tile edges inside the raster see real neighbours; true raster edges apply @p edge).
 * @throws std::invalid_argument for an unknown @p edge; std::runtime_error as band_statistics.
 */
VSR_EXPORT OwnedRasterArray focal_mean_3x3(const OwnedRasterArray& raster,
                                           EdgeMode edge = EdgeMode::nearest);

/// @name Output-into forms
/// The elementwise operations and the focal mean, writing into a raster the caller owns, so that
/// a pipeline reuses one output raster instead of allocating a new one per call (on the host a
/// fresh output also costs a page fault per 4 KiB, which bounds an allocating op well below
/// memory bandwidth). Results are exactly those of the allocating forms.
///
/// @p out must have the input's band count, height, width and residency, and the result's dtype
/// (for rescale_into, out.dtype() is the output dtype). Its pixels are overwritten and this
/// handle's nodata, affine and CRS become the result's (other handles sharing its storage keep
/// theirs). Elementwise forms may write in place (@p out the input itself, or a handle of the
/// same pixels); any other overlap of @p out with an input is rejected, and focal_mean_3x3_into
/// rejects every overlap because it reads neighbours.
/// @throws std::invalid_argument as the allocating form, or when @p out differs in shape,
///         residency or dtype, or overlaps an input as described; std::runtime_error as
///         band_statistics. After an argument error @p out is unchanged.
/// @{
VSR_EXPORT void rescale_into(const OwnedRasterArray& raster, double in_min, double in_max,
                             double out_min, double out_max, OwnedRasterArray& out);
VSR_EXPORT void clip_into(const OwnedRasterArray& raster, double lower, double upper,
                          OwnedRasterArray& out);
VSR_EXPORT void fill_nodata_into(const OwnedRasterArray& raster, double value,
                                 OwnedRasterArray& out);
VSR_EXPORT void normalized_difference_into(const OwnedRasterArray& a, const OwnedRasterArray& b,
                                           OwnedRasterArray& out);
VSR_EXPORT void focal_mean_3x3_into(const OwnedRasterArray& raster, EdgeMode edge,
                                    OwnedRasterArray& out);
/// @}

/// @name Stream forms
/// Each operation with the CUstream its device work is queued on (a stream of the device's
/// primary context; nullptr is the legacy default stream, which the forms above use). Results
/// are those of the forms above. For a device raster:
/// - the input must be ready in @p stream's order (written earlier on @p stream, or ordered
///   before it with an event);
/// - a raster result is returned as soon as its work is queued: its pixels are valid in
///   @p stream's order. band_statistics and histogram wait for @p stream and return results;
/// - temporaries come from the pool and are freed in @p stream's order. Output rasters are pool
///   memory for @p stream (OwnedRasterArray::allocate with @p stream): a block the pool hands
///   them that another stream freed with work still queued is ordered after that work on
///   @p stream itself. An input written on another stream (the legacy default stream included:
///   move_to and allocate's copies complete before they return) must be ordered before
///   @p stream by the caller (an event). An output goes back to the pool in @p stream's order
///   when its last handle is destroyed, so @p stream must outlive it (drop the outputs, then
///   forget_stream, then destroy the stream).
/// For a host raster @p stream is ignored. Throws as the forms above.
/// @{
VSR_EXPORT std::vector<BandStatistics> band_statistics(const OwnedRasterArray& raster,
                                                       CUstream stream);
VSR_EXPORT OwnedRasterArray rescale(const OwnedRasterArray& raster, double in_min, double in_max,
                                    double out_min, double out_max, DType out_dtype,
                                    CUstream stream);
VSR_EXPORT OwnedRasterArray clip(const OwnedRasterArray& raster, double lower, double upper,
                                 CUstream stream);
VSR_EXPORT OwnedRasterArray fill_nodata(const OwnedRasterArray& raster, double value,
                                        CUstream stream);
VSR_EXPORT OwnedRasterArray normalized_difference(const OwnedRasterArray& a,
                                                  const OwnedRasterArray& b, CUstream stream);
VSR_EXPORT std::vector<std::vector<std::int64_t>> histogram(const OwnedRasterArray& raster,
                                                            int bins, double lower, double upper,
                                                            CUstream stream);
VSR_EXPORT OwnedRasterArray focal_mean_3x3(const OwnedRasterArray& raster, EdgeMode edge,
                                           CUstream stream);
VSR_EXPORT void rescale_into(const OwnedRasterArray& raster, double in_min, double in_max,
                             double out_min, double out_max, OwnedRasterArray& out,
                             CUstream stream);
VSR_EXPORT void clip_into(const OwnedRasterArray& raster, double lower, double upper,
                          OwnedRasterArray& out, CUstream stream);
VSR_EXPORT void fill_nodata_into(const OwnedRasterArray& raster, double value,
                                 OwnedRasterArray& out, CUstream stream);
VSR_EXPORT void normalized_difference_into(const OwnedRasterArray& a, const OwnedRasterArray& b,
                                           OwnedRasterArray& out, CUstream stream);
VSR_EXPORT void focal_mean_3x3_into(const OwnedRasterArray& raster, EdgeMode edge,
                                    OwnedRasterArray& out, CUstream stream);
/// @}

/// @name Band math (calc)
/// Expressions over named inputs, as GDAL's raster calculators write them: `(A[4] - A[3]) /
/// (A[4] + A[3])`, `where(B > 0, A * 2, 0)`, `A > 100 ? 1 : 0`. docs/band-math.md has the grammar
/// (operators, precedence, functions, constants) with GDAL's and numpy's spellings side by side.
///
/// - Names: an input is bound to a name the caller chooses (an identifier: letters, digits and
///   `_`, not starting with a digit, not a function, constant or keyword); `A[2]` is band 2 of
///   input A (1-based); `A` alone is allowed for a one-band input only (on a multi-band input it
///   is an error naming the input: band math has no "every band" meaning).
/// - Evaluation: every pixel is computed in float64 (or float32 with
///   CalcOptions::compute_float32); each input band is converted to the compute type when loaded,
///   whatever its dtype. Arithmetic follows IEEE 754 (division by zero gives +-inf or NaN, log of
///   a negative NaN, ...). One expression gives one output band; several give several bands, in
///   order, from one pass over the pixels.
/// - Output: CalcOptions::output (float32 by default), converted as convert_dtype converts
///   (integers rounded half away from zero and saturated; NaN, which no integer type holds,
///   becomes the output's nodata). The output's nodata follows the output-nodata rule (see
///   output_nodata): CalcOptions::output_nodata when given (CalcOptions::no_nodata: none); else
///   the nodata of the first input (in the order given) that the expressions read and that has
///   one, when the output dtype holds it exactly (an input no expression reads plays no part);
///   else default_nodata(): NaN for a float output, the dtype's largest value for an integer
///   one. The result always has a nodata, unless no_nodata. A valid result equal to it is an
///   error (std::invalid_argument naming the band, the count and the value), never written.
/// - Nodata propagation (CalcOptions::propagate_nodata, on by default): a pixel where any input
///   band the expression names is invalid (its input's nodata, or NaN for float inputs) is the
///   output's nodata, whichever branch of a `?:` or where() it sits in; off, the raw values go
///   through the expression. A NaN result of a valid pixel is invalid: written as the output's
///   nodata (NaN in a float output without one).
/// - Inputs: all of one height and width, one residency, one affine and one CRS (compared
///   exactly; the result has them). The work runs where the inputs live, as every operation.
/// - Determinism: both backends run the same evaluator; +, -, *, /, sqrt, comparisons, floor,
///   ceil, round, min, max and conversions are exact IEEE operations and give bit-identical
///   results on the host and the device; exp, log, log10, pow, trigonometric functions come from
///   each side's math library and may differ by an ulp or two.
///
/// Bad expressions are std::invalid_argument whose message names the problem and its 1-based
/// column (characters), then shows the expression (escaped, a window of it when long) and a caret
/// under the column: `calc: unknown name 'C' at column 8\n  A[1] + C\n         ^`. With several
/// expressions the message says which (`calc: expression 2: ...`). Expressions of any length
/// compile in linear time; nesting deeper than 256 levels (parentheses, calls, unary operators)
/// is refused as "nested too deeply".
/// @{

/// The name and band count of one input, for compile_calc.
struct CalcInputBands {
  std::string name;
  int band_count = 1;
};

/// One input of calc: a raster under a name.
struct CalcInput {
  std::string name;
  OwnedRasterArray raster;
  /// The band numbers (1-based, of the source the expressions name) of raster's bands, for a
  /// raster that holds only some bands of its source (read with CalcProgram::bands_read, say):
  /// {3, 4} means raster band 1 is A[3] and band 2 is A[4]. Empty: raster's bands are 1 to
  /// band_count().
  std::vector<int> bands = {};
  /// raster's nodata was chosen by its reader only to mark masked pixels (RasterFileSource::
  /// nodata_marks_mask), not the file's: the output-nodata rule does not give it to a float
  /// output (NodataCandidate::marks_mask).
  bool nodata_marks_mask = false;
};

/// How calc computes and writes.
struct CalcOptions {
  DType output = DType::float32;  ///< the output dtype
  bool compute_float32 = false;   ///< compute in float32 instead of float64
  bool propagate_nodata = true;   ///< an invalid input pixel gives the output's nodata
  /// The output's nodata; empty: the rule in the section comment. Must be a value of `output`.
  std::optional<NodataValue> output_nodata = {};
  /// No nodata at all (vsr-run -a_nodata none): invalid pixels are written as NaN (float
  /// outputs) or 0 (integer outputs) and the result has no nodata. output_nodata must be empty.
  bool no_nodata = false;
};

/// The bands one input's expressions read.
struct CalcBandUse {
  std::string name;        ///< the input
  std::vector<int> bands;  ///< 1-based, ascending, each once; empty if no expression reads it
};

namespace detail {
struct CalcCompiled;
struct CalcAccess;
}  // namespace detail

/**
 * @brief Compiled band-math expressions (compile_calc): checked against the inputs' names and
 * band counts, lowered to the evaluator's program for both compute types. Immutable: copies
 * share it, and it may be used from many threads at once (e.g. one calc per tile).
 * A default-constructed program is empty (calc refuses it).
 */
class VSR_EXPORT CalcProgram {
 public:
  CalcProgram() = default;

  /// The expressions, as given; one output band each.
  const std::vector<std::string>& expressions() const noexcept;
  /// The inputs it was compiled for (names and band counts), in the order given.
  const std::vector<CalcInputBands>& inputs() const noexcept;
  /// For every input (in the order given), the bands the expressions read: a tiled executor
  /// reads only these (and passes them as CalcInput::bands), a CLI can refuse a missing file
  /// before reading any pixel.
  const std::vector<CalcBandUse>& bands_read() const noexcept;
  /// The bands the expressions read of input @p name.
  /// @throws std::invalid_argument if the program has no input @p name.
  const std::vector<int>& bands_read(std::string_view name) const;
  /// The most registers (values per pixel) its evaluation holds at once: the bounded
  /// evaluation stack computed when compiled (at most 32).
  int registers() const noexcept;
  /// Instructions of its program (float64 compute; float32 folds constants alike).
  std::size_t instruction_count() const noexcept;
  /// Whether this holds a program (false when default-constructed).
  bool valid() const noexcept { return impl_ != nullptr; }

 private:
  friend struct detail::CalcAccess;
  std::shared_ptr<const detail::CalcCompiled> impl_;
};

/**
 * @brief Compiles @p expressions for inputs of the given names and band counts, without data:
 * every syntax error, unknown name, band out of range or wrong function arity is found here.
 * @throws std::invalid_argument for an empty list, a bad expression (message as in the section
 *         comment, starting "compile_calc: "), an input name that is no identifier, is given
 *         twice or is a function, constant or keyword name, or a band count below 1.
 * Thread-safe.
 */
VSR_EXPORT CalcProgram compile_calc(const std::vector<std::string>& expressions,
                                    const std::vector<CalcInputBands>& inputs);

/**
 * @brief Evaluates @p program on @p inputs: one output band per expression, of the inputs'
 * height, width, residency, affine and CRS, dtype options.output, nodata as the section comment
 * says. Every input the expressions read must be given (by the name compiled for); an input
 * without CalcInput::bands must have the band count compiled for, one with it must hold every
 * band read. Device inputs: the stream forms' rules (see "Stream forms").
 * @throws std::invalid_argument for an empty program or input list, an unknown or repeated
 *         name, a missing input or band, inputs that differ in height and width, residency,
 *         affine or CRS (the message names the two), a bad output dtype, an output_nodata that
 *         is not a value of it (or given with no_nodata), or a valid result equal to the
 *         output's nodata; std::runtime_error as band_statistics.
 */
VSR_EXPORT OwnedRasterArray calc(const CalcProgram& program, const std::vector<CalcInput>& inputs,
                                 const CalcOptions& options = {}, CUstream stream = nullptr);

/**
 * @brief compile_calc(@p expressions, the inputs' names and band counts) then calc: the one-call
 * form. Errors start with "calc: ". An input with CalcInput::bands is compiled with the largest
 * band it holds as its count.
 * @throws as compile_calc and calc.
 */
VSR_EXPORT OwnedRasterArray calc(const std::vector<std::string>& expressions,
                                 const std::vector<CalcInput>& inputs,
                                 const CalcOptions& options = {}, CUstream stream = nullptr);
/// @}

}  // namespace vibespatial::raster
