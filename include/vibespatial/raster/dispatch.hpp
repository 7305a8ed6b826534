// SPDX-License-Identifier: Apache-2.0
// VRAM budget, raster planning and band/tile dispatch.
//
// The planner reproduces the reference's analyze_raster_plan exactly for per_band == false
// (same strategy, tile shapes, tile counts and estimates for the same inputs) and adds
// fits_budget and, for per-band work, the band_batches strategy.
#pragma once

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/export.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

// CUstream, exactly as <cuda.h> declares it, so this header needs no CUDA headers.
typedef struct CUstream_st* CUstream;  // NOLINT(modernize-use-using)

namespace vibespatial::raster {

/**
 * @brief Device memory a new pass may use, in bytes: (driver free + free bytes the pool holds)
 * * 0.85, leaving 15% headroom for the driver, fragmentation and concurrent allocations.
 * Returns 0 when there is no usable driver or device, so it is safe on CPU-only machines.
 * Thread-safe, never throws.
 */
VSR_EXPORT std::uint64_t available_vram_bytes() noexcept;

/**
 * @brief How many bands of @p height x @p width @p dtype fit in the budget at once, each band
 * needing @p buffers_per_band device buffers, after @p scratch_bytes are set aside:
 * max(1, (budget - scratch) / (height * width * itemsize * buffers_per_band)), clamped to
 * INT_MAX. The budget is @p vram_budget, or available_vram_bytes() when empty; a budget below
 * the scratch counts as 0. Always >= 1, so a one-band fallback is always possible.
 * @throws std::invalid_argument for height or width <= 0, a bad dtype, buffers_per_band < 1;
 *         std::overflow_error if the per-band byte count does not fit in 64 bits.
 * Thread-safe.
 */
VSR_EXPORT int max_bands_for_budget(std::int64_t height, std::int64_t width, DType dtype,
                                    int buffers_per_band = 2, std::uint64_t scratch_bytes = 0,
                                    std::optional<std::uint64_t> vram_budget = {});

/** @brief What an operation needs on the device, for analyze_raster_plan. */
struct PlanOptions {
  int band_count = 1;               ///< bands of the raster (>= 1)
  int buffers_per_band = 2;         ///< device buffers per band (default: input + output)
  std::uint64_t scratch_bytes = 0;  ///< fixed scratch of the operation per pass, bytes
  int halo = 0;                     ///< overlap pixels per tile side for stencil ops (>= 0)
  std::optional<std::uint64_t> vram_budget;  ///< bytes; empty: available_vram_bytes()
  bool per_band = false;  ///< true: bands are independent, so band_batches may be chosen
};

/**
 * @brief The usable part of a VRAM budget: floor(budget * 0.7), computed in double precision
 * exactly as the reference does (30% is kept for runtime variance). Never throws.
 */
VSR_EXPORT std::uint64_t usable_vram_budget(std::uint64_t vram_budget) noexcept;

/**
 * @brief Decides how a @p height x @p width raster of @p dtype goes through the device.
 *
 * With budget = options.vram_budget (or available_vram_bytes()), usable = usable_vram_budget:
 * - budget 0 (no GPU): whole, estimate 0 (tiling is a device-side concern).
 * - all bands * buffers + scratch <= usable: whole, estimate = that sum.
 * - per_band == false: tiled, all bands per tile. Tiles start at min(4096, H) x min(4096, W),
 *   rounded down to multiples of 256 (at least 256); while a tile (halo included) + scratch
 *   exceeds usable and a side is above 256, the larger side (height on a tie) is halved and
 *   rounded down to a multiple of 256 (at least 256). This is the reference's algorithm.
 * - per_band == true and one band (+ scratch) fits: band_batches with the most bands that fit.
 * - per_band == true otherwise: tiled as above for one band at a time (bands_per_pass 1);
 *   n_tiles counts the tiles of one band.
 * fits_budget is false exactly when the returned estimate exceeds usable (even 256 x 256 tiles
 * are too big); the plan is still returned.
 *
 * @throws std::invalid_argument for height or width <= 0, a bad dtype, band_count < 1,
 *         buffers_per_band < 1 or halo < 0 (the message names the argument and value);
 *         std::overflow_error if a byte count does not fit in 64 bits.
 * Thread-safe; calls available_vram_bytes() only when options.vram_budget is empty.
 */
VSR_EXPORT RasterPlan analyze_raster_plan(std::int64_t height, std::int64_t width, DType dtype,
                                          const PlanOptions& options = {});

/**
 * @brief analyze_raster_plan with the height, width, dtype and band_count of @p metadata
 * (the metadata's band_count replaces options.band_count), so a plan can be made before any
 * pixel is read. Throws as analyze_raster_plan. Thread-safe.
 */
VSR_EXPORT RasterPlan plan_from_metadata(const RasterMetadata& metadata, PlanOptions options = {});

/**
 * @brief Applies @p op to each band of @p raster on the host and stacks the results with the
 * source's metadata (from_band_stack). A single-band raster is passed through: one call, its
 * result returned as is.
 *
 * Bands run in parallel on min(bands, hardware threads, 8) std::threads; each call gets a
 * host-resident single-band view (a device-resident raster is first copied to the host, not
 * moved), so @p op must be safe to call concurrently. Results are stacked in band order.
 * @throws std::invalid_argument for an empty @p op; if @p op throws, the first exception (in
 *         time) is rethrown once every worker has stopped, and bands not yet started are not
 *         started; what from_band_stack throws.
 */
VSR_EXPORT OwnedRasterArray dispatch_per_band_cpu(const OwnedRasterArray& raster, const BandOp& op);

/**
 * @brief Applies @p op to each band of @p raster as device views and stacks the results with
 * the source's metadata. A single-band raster is passed through (one call, no driver needed).
 *
 * The StreamBandOp overload below with GpuDispatchOptions{@p buffers_per_band,
 * @p scratch_bytes} (budget available_vram_bytes(), double buffering where it fits); everything
 * said there holds (streams, batches, output, errors, resources), except:
 * - @p op is called with no stream and its device work goes to the legacy default stream (as the
 *   band operations' forms without a stream do); the call's copies and output copies are ordered
 *   with it by events;
 * - @p op is called once the batch's copy has completed (the host waits for it), so it may also
 *   read the view synchronously;
 * - its device work must be complete, or queued on the legacy default stream, when it returns.
 */
VSR_EXPORT OwnedRasterArray dispatch_per_band_gpu(const OwnedRasterArray& raster, const BandOp& op,
                                                  int buffers_per_band = 2,
                                                  std::uint64_t scratch_bytes = 0);

/**
 * @brief A per-band operation that queues its device work on @p stream: takes one single-band
 * device view, whose pixels are ready in @p stream's order (its copy may still be in flight when
 * the op is called), and returns its result, a single-band raster of the same height and width,
 * on the device (pixels written in @p stream's order) or on the host (complete). The band
 * operations' stream forms (ops.hpp) are such ops: `[](const auto& b, CUstream s) { return
 * rescale(b, 0, 1000, 0, 1, DType::float32, s); }`.
 */
using StreamBandOp = std::function<OwnedRasterArray(const OwnedRasterArray& band, CUstream stream)>;

/**
 * @brief The calling thread's op stream: where the band operations' forms without a stream
 * (ops.hpp) and a Pipeline's steps queue their device work. The legacy default stream (nullptr)
 * unless an OpStreamScope is active on the thread; the tile executor makes its compute stream
 * current while it runs an op on device tiles. Never throws.
 */
VSR_EXPORT CUstream current_op_stream() noexcept;

/**
 * @brief Makes @p stream (a stream of the device's primary context, or nullptr: the legacy
 * default stream) the calling thread's op stream (current_op_stream) for its scope; the one
 * before comes back when it ends, so scopes nest. Thread-local: other threads keep theirs.
 * Never throws.
 */
class VSR_EXPORT OpStreamScope {
 public:
  explicit OpStreamScope(CUstream stream) noexcept;
  ~OpStreamScope();
  OpStreamScope(const OpStreamScope&) = delete;
  OpStreamScope& operator=(const OpStreamScope&) = delete;

 private:
  CUstream previous_;
};

/** @brief How dispatch_per_band_gpu goes through the device. */
struct GpuDispatchOptions {
  int buffers_per_band = 2;         ///< device buffers the op needs per band (input included)
  std::uint64_t scratch_bytes = 0;  ///< fixed scratch the op needs per pass, bytes
  std::optional<std::uint64_t> vram_budget;  ///< bytes; empty: available_vram_bytes()
  /// 2: double buffering (batch k+1 is copied while batch k computes) where two passes fit;
  /// 1: one batch at a time (copy, compute, output). Other values are rejected.
  int pipeline_depth = 2;
  int staging_threads = 0;  ///< threads of each host staging copy; 0: by size (>= 16 MiB: up to 8)
  /// The plan the caller decided (analyze_raster_plan / plan_from_metadata with per_band = true
  /// and vram_budget = the budget above), followed as is instead of planning again: batches of
  /// plan->bands_per_pass bands (the last may be smaller), double-buffered only when two passes
  /// of plan->estimated_vram_per_tile fit usable_vram_budget(budget) (else one at a time). A
  /// caller that prints or logs its plan gives it here, so the device goes as it said.
  /// A `tiled` plan, or bands_per_pass < 1, is rejected. Empty: planned from the budget.
  std::optional<RasterPlan> plan;
  /// Where the stacked output goes. Empty: on the device when it fits the budget beside the
  /// passes in flight, else on the host (each band's result through pinned staging). The tile
  /// executor asks for the host: it holds a tile's result while the next tile goes through the
  /// device, which the budget of one call does not count.
  std::optional<Residency> output;
};

/** @brief What one dispatch_per_band_gpu call did (for benchmarks and tests). */
struct GpuDispatchReport {
  RasterPlan plan;                     ///< the plan its batches followed
  std::uint64_t vram_budget = 0;       ///< the budget, bytes
  int passes = 0;                      ///< batches of bands
  int pipeline_depth = 0;              ///< 2 when batches were double-buffered
  bool input_copied = false;           ///< false for a device-resident input (used in place)
  Residency output = Residency::host;  ///< where the stacked output is
  int staging_threads = 0;             ///< the most threads one host staging copy used
  std::uint64_t pinned_bytes = 0;      ///< pinned staging the call used, bytes
};

/**
 * @brief Applies @p op to each band of @p raster as device views, its device work on a stream of
 * the call, and stacks the results with the source's metadata. A single-band raster is passed
 * through: one call `op(raster, nullptr)` (the legacy default stream), its result as is.
 *
 * Several bands: the budget is options.vram_budget, or available_vram_bytes() taken once. The
 * bands go to the device in batches through pinned staging: each batch is copied by several
 * threads (large batches) into a pinned buffer, then to the device by an asynchronous copy on a
 * copy stream; @p op runs on each band of the batch with the call's compute stream. Both streams
 * are CU_STREAM_NON_BLOCKING (so neither waits for, or holds up, the legacy default stream) and
 * events order them: a batch computes after its copy, and a slot's buffer is copied over only
 * after the compute that read it. With pipeline_depth 2 (the default) and more than one batch,
 * two slots alternate (double buffering): batch k+1 is copied while batch k computes, the host
 * never waiting for the compute of batch k before queuing that copy, and each pass is planned
 * with half the budget, analyze_raster_plan(per_band = true, buffers_per_band, scratch_bytes,
 * budget / 2), so that both fit; when half the budget cannot hold one band, or all bands fit in
 * it (one batch), the plan is made with the whole budget and batches go one at a time. With
 * options.plan the caller's plan is followed instead, without planning again (see there).
 * A device-resident raster is used in place, batch by batch, without copies (double-buffered
 * the same way: batch k computes while the host releases batch k-1's results).
 *
 * Results go straight into the output stack, one pool allocation on the device when it fits
 * the budget beside the passes in flight, else a host raster (device results reach it through
 * pinned buffers, asynchronously on the compute stream); its dtype is the results' (which must
 * agree), its nodata, affine and CRS are the source's. A batch's results are released once the
 * host has seen its compute work complete. Device memory the call allocates, plus what @p op
 * uses within its declared buffers_per_band and scratch_bytes, stays within the budget.
 *
 * Pinned buffers, streams and events are leased from a process-wide set that keeps them for the
 * next call (idle pinned memory never exceeds what the last call used); free_dispatch_resources()
 * gives them back. The output is complete (every stream of the call synchronised) on return.
 *
 * @p report, when not null, receives what the call did.
 * @throws DriverUnavailableError when there is no usable driver (several bands);
 *         std::runtime_error naming the plan when it is `tiled` (one band does not fit the
 *         budget): run such work through dispatch_tiled / dispatch_tiled_halo with that plan;
 *         std::invalid_argument for an empty @p op, pipeline_depth not 1 or 2, negative
 *         staging_threads, a bad buffers_per_band, a result of the wrong shape, or results whose
 *         dtype or nodata differ; OutOfMemoryError / CudaError from the pool and driver; whatever
 *         @p op throws. On any error the call's streams are synchronised and every device
 *         buffer, pinned buffer and stream it used is released or returned for reuse.
 * Thread-safety: concurrent calls on distinct rasters are safe (each leases its own streams).
 */
VSR_EXPORT OwnedRasterArray dispatch_per_band_gpu(const OwnedRasterArray& raster,
                                                  const StreamBandOp& op,
                                                  const GpuDispatchOptions& options = {},
                                                  GpuDispatchReport* report = nullptr);

/**
 * @brief dispatch_per_band_gpu of a BandOp with the budget, plan, pipeline and staging of
 * @p options (options.buffers_per_band and scratch_bytes as the overload above takes them), and
 * @p report, when not null, receiving what the call did. @p op is called as in the overload
 * above (no stream, after its batch's copy has completed, device work complete or on the legacy
 * default stream when it returns). Throws as the StreamBandOp overload.
 */
VSR_EXPORT OwnedRasterArray dispatch_per_band_gpu(const OwnedRasterArray& raster, const BandOp& op,
                                                  const GpuDispatchOptions& options,
                                                  GpuDispatchReport* report = nullptr);

/**
 * @brief Gives back what GPU dispatch keeps for reuse between calls: idle pinned staging
 * buffers, streams and events, on every device. Calls in flight keep theirs (they return them
 * when they end). A no-op without a driver.
 * @throws CudaError when the driver fails to free something (everything is released regardless).
 * Thread-safe.
 */
VSR_EXPORT void free_dispatch_resources();

/** @brief One tile of a tiled walk: what it produces and what it reads. */
struct TileWindow {
  RasterWindow window;  ///< the output pixels the tile makes (tiles do not overlap)
  RasterWindow read;    ///< window with the halo on each side, clamped to the raster

  friend bool operator==(const TileWindow&, const TileWindow&) = default;
};

/**
 * @brief The tiles of a @p height x @p width raster cut in @p tile_height x @p tile_width
 * tiles, row-major (the last row and column of tiles are smaller), each read with @p halo pixels
 * of context per side. The one tile walk of the library: dispatch_tiled, dispatch_tiled_halo and
 * io's streamed runs (process_raster_file, for_each_raster_tile) visit tiles in this order.
 * @throws std::invalid_argument for a non-positive size or tile size, or a negative halo.
 * Thread-safe.
 */
VSR_EXPORT std::vector<TileWindow> tile_windows(std::int64_t height, std::int64_t width,
                                                std::int64_t tile_height, std::int64_t tile_width,
                                                int halo = 0);

/**
 * @brief Tile @p index of tile_windows(@p height, @p width, @p tile_height, @p tile_width,
 * @p halo), computed alone: a walk over billions of tiles holds no list of them.
 * @throws std::invalid_argument as tile_windows; std::out_of_range for an @p index outside
 *         [0, tile count). Thread-safe.
 */
VSR_EXPORT TileWindow tile_window_at(std::int64_t height, std::int64_t width,
                                     std::int64_t tile_height, std::int64_t tile_width, int halo,
                                     std::int64_t index);

/**
 * @brief Runs a pointwise @p op over the non-overlapping tiles of @p plan (or once, for a whole
 * plan) and stitches the results; each tile's affine is shifted to its origin
 * (c' = c + col*a + row*b, f' = f + col*d + row*e).
 *
 * Tiles are row-major over plan.tile_shape (edge tiles are smaller) and carry every band; each
 * is a new host raster (from_host) with the source's nodata and CRS. @p op returns a raster of
 * its input's height and width; the host output is allocated from the first tile's result
 * (dtype, nodata and band count: ops may change the dtype), with the source's affine and CRS.
 * Serial, on the calling thread.
 * @throws std::invalid_argument for a tiled plan over a device-resident raster (a full device
 *         to host copy would defeat the purpose of tiling), a band_batches plan, a tiled plan
 *         without a positive tile_shape, an empty @p op, or a result of the wrong shape or of a
 *         dtype or band count differing from the first tile's; whatever @p op throws.
 */
VSR_EXPORT OwnedRasterArray dispatch_tiled(const OwnedRasterArray& raster, const BandOp& op,
                                           const RasterPlan& plan);

/**
 * @brief As dispatch_tiled, but each tile is read with plan.halo extra pixels per side
 * (clamped at the raster edges, no padding: at a true edge the op's own boundary rule applies);
 * @p op returns its input's shape and the interior is kept. With plan.halo >= the op's radius
 * the result equals the whole-raster result. The tile's affine is shifted to the origin of the
 * read window (halo included).
 * @throws as dispatch_tiled; std::invalid_argument for a negative plan.halo.
 */
VSR_EXPORT OwnedRasterArray dispatch_tiled_halo(const OwnedRasterArray& raster, const BandOp& op,
                                                const RasterPlan& plan);

}  // namespace vibespatial::raster
