// SPDX-License-Identifier: Apache-2.0
// The tile executor: one walk over a raster's tiles, from a source, through an op, into a sink.
//
// Every tiled path of the library is a pair of ends on run_tiles: dispatch_tiled and
// dispatch_tiled_halo (an in-memory raster into an in-memory raster), io's process_raster_file
// and for_each_raster_tile (a file into a file, or into a visitor), vsr-run (a file or its
// generated sample into a file, a reduction or nothing). A new place to read tiles from or to
// write them to is a new TileSource or TileSink, and nothing else.
//
// Glossary
// - source: where tiles come from. It knows the grid (height, width, dtype, affine, CRS) and
//   each selected band's nodata, and reads any window of a run of its selected bands.
// - sink: where results go. It is told the output's layout once, by the first result
//   (TileSink::begin), each pass's nodata (begin_pass), then every tile's result (write), and
//   finish() makes the output whole; a sink destroyed without finish() leaves nothing behind.
// - pass: a run of consecutive selected bands that goes through the tiles together. An op that
//   takes its bands together (per_band false) has one pass of every band. A per-band op has
//   passes of at most plan.bands_per_pass bands of one nodata (tile_passes).
// - tile: one window of tile_windows over the plan's tile shape (a whole or band_batches plan
//   is one tile: the whole raster), read with the plan's halo on each side (clamped to the
//   raster); the sink keeps its interior (TileInfo::window).
// - first-result rule: the first tile's result fixes the output's dtype and band count (per-band
//   runs: as many bands as selected, each pass returning its own), and each pass's first
//   result fixes that pass's nodata. Every later result must agree, and every result must have
//   its tile's height and width: otherwise std::invalid_argument naming the tile.
// - placement: where the op's input tiles live (Residency::host, or Residency::device: each tile
//   is copied to the device once before the op, through pinned staging, and its result back,
//   with two tiles in flight where the budget holds them). placed() (placement.hpp, the ops
//   layer) is the rule that chooses it.
#pragma once

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/dispatch.hpp>
#include <vibespatial/raster/export.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace vibespatial::raster {

/// Where a tile of a run is: tile @p index of @p total (passes x tiles), its effective window
/// (halo excluded), the window read (halo included, clamped to the raster), the 0-based
/// positions of its bands among the selected bands, and the first output band its result's
/// bands go to (the same position for per-band runs; 0 when the op takes the bands together).
struct TileInfo {
  std::int64_t index = 0, total = 0;
  RasterWindow window, read;
  int first_band = 0, band_count = 0;
  int output_band = 0;
};

/// The steps of a tile, as TileRunOptions::stage (and io's StreamOptions::stage) reports them.
enum class TileStage { read, compute, write };

/// A run of consecutive selected bands that goes through the tiles together.
struct TilePass {
  int first_band = 0;  ///< 0-based position among the selected bands
  int band_count = 0;  ///< bands in the pass (>= 1)
  friend bool operator==(const TilePass&, const TilePass&) = default;
};

/**
 * @brief The passes of a run over bands whose nodata are @p band_nodata (one per selected
 * band, in order).
 *
 * Bands are independent when @p per_band is set, or when @p plan is band_batches or tiled with
 * fewer bands per pass than bands (as a per-band plan makes): then each pass is at most
 * plan.bands_per_pass consecutive bands of one nodata (a whole plan with @p per_band: every band
 * of one nodata, consecutive). Otherwise one pass carries every band.
 * @throws std::invalid_argument for no bands or plan.bands_per_pass < 1. Thread-safe.
 */
VSR_EXPORT std::vector<TilePass> tile_passes(
    const std::vector<std::optional<NodataValue>>& band_nodata, const RasterPlan& plan,
    bool per_band);

/**
 * @brief Whether the passes tile_passes makes for these arguments treat bands as independent
 * (each pass's result goes to its own output bands). Throws as tile_passes. Thread-safe.
 */
VSR_EXPORT bool bands_independent(int band_count, const RasterPlan& plan, bool per_band);

/**
 * @brief The first-result rule (see the glossary) as a value: what the results of a run have
 * fixed so far, and the check of each new result against it. run_tiles keeps one per run;
 * executors that cannot pass a first result along (the Dask layer's chunks, which compute
 * apart) fix the expected values up front with the expect_* members.
 */
class VSR_EXPORT TileResultRule {
 public:
  /// A rule that has fixed nothing; its messages start with @p name.
  explicit TileResultRule(std::string name = "run_tiles");
  /**
   * @brief Checks @p result, computed for a tile read as @p read (@p tile names it in messages,
   * e.g. "tile 3 (row 256, column 0)"): its height and width must be read's, and its dtype, band
   * count and nodata (NaN equals NaN) those fixed so far; what is not fixed yet, this result
   * fixes.
   * @throws std::invalid_argument naming the tile, what differs and what was fixed.
   */
  void check(const OwnedRasterArray& result, const RasterWindow& read, const std::string& tile);
  /// Fixes the dtype every result must have.
  void expect_dtype(DType dtype) { dtype_ = dtype; }
  /// Fixes the band count every result must have (until changed).
  void expect_band_count(int band_count) { band_count_ = band_count; }
  /// Fixes the nodata every result must have (until reset_nodata).
  void expect_nodata(std::optional<NodataValue> nodata) {
    nodata_ = nodata;
    nodata_fixed_ = true;
  }
  /// Forgets the nodata: the next result fixes it again (a new pass).
  void reset_nodata() { nodata_fixed_ = false; }
  std::optional<DType> dtype() const { return dtype_; }
  std::optional<int> band_count() const { return band_count_; }
  bool nodata_fixed() const { return nodata_fixed_; }
  const std::optional<NodataValue>& nodata() const { return nodata_; }

 private:
  std::string name_;
  std::optional<DType> dtype_;
  std::optional<int> band_count_;
  std::optional<NodataValue> nodata_;
  bool nodata_fixed_ = false;
};

/// The output's layout, as the first result fixes it (TileSink::begin).
struct TileOutput {
  DType dtype = DType::float32;        ///< the results' dtype
  int band_count = 1;                  ///< output bands
  std::int64_t height = 0, width = 0;  ///< the source's grid
  Affine affine;                       ///< the source's
  std::string crs;                     ///< the source's
};

/**
 * @brief Where tiles come from (see the glossary). A source is used by one run at a time; its
 * read() is called from one thread at a time, not necessarily the thread that called run_tiles.
 */
class VSR_EXPORT TileSource {
 public:
  virtual ~TileSource();
  /// The grid of the selected bands: height, width, dtype, affine and CRS, band_count the
  /// number of selected bands (>= 1), nodata the first selected band's.
  virtual RasterMetadata metadata() const = 0;
  /// Each selected band's nodata, exactly (band_count entries).
  virtual std::vector<std::optional<NodataValue>> band_nodata() const = 0;
  /// Reads @p window of the selected bands [@p first_band, @p first_band + @p band_count) into a
  /// raster (host or device) of those bands, with the nodata of @p first_band, the affine shifted
  /// to the window's origin and the source's CRS. The window lies inside the grid.
  virtual OwnedRasterArray read(const RasterWindow& window, int first_band, int band_count) = 0;

 protected:
  TileSource() = default;
  TileSource(const TileSource&) = default;
  TileSource& operator=(const TileSource&) = default;
};

/**
 * @brief Where results go (see the glossary). A sink is used by one run at a time; its members
 * are called from one thread at a time, in the order begin, then per pass begin_pass and the
 * pass's writes, then finish.
 */
class VSR_EXPORT TileSink {
 public:
  virtual ~TileSink();
  /// Once, before anything else: the output's layout, from the first result.
  virtual void begin(const TileOutput& output) = 0;
  /// At the start of each pass: its output bands [@p output_band, @p output_band +
  /// @p band_count) and their nodata (the pass's first result's). The default does nothing.
  virtual void begin_pass(int output_band, int band_count,
                          const std::optional<NodataValue>& nodata);
  /// One tile's result: the shape of where.read, host or device resident; the sink keeps the
  /// interior, where.window, for output bands [where.output_band, + result.band_count()).
  virtual void write(const OwnedRasterArray& result, const TileInfo& where) = 0;
  /// After the last tile: makes the output whole. Not called when the run fails. The default
  /// does nothing.
  virtual void finish();

 protected:
  TileSink() = default;
  TileSink(const TileSink&) = default;
  TileSink& operator=(const TileSink&) = default;
};

/// How run_tiles goes through the tiles.
struct TileRunOptions {
  /// The public call's name, which every message of the run starts with.
  std::string name = "run_tiles";
  /// The op treats bands independently (see tile_passes): passes of at most plan.bands_per_pass
  /// bands of one nodata, each result as many bands as its pass, at the same positions.
  bool per_band = false;
  /// Accept a pass whose bands differ in nodata when the op takes them together: its tiles then
  /// carry the first band's nodata and the op gives the others theirs. Off: such a run is refused
  /// (std::runtime_error) before anything is read.
  bool mixed_nodata = false;
  /// Where the op's input tiles live. Residency::device: each host tile goes to the device once,
  /// through pinned staging on a copy stream; the op is called with the run's compute stream
  /// current (current_op_stream, so the ops' forms without a stream queue their work there; work
  /// it queues on the legacy default stream is waited for too), and a device result comes back
  /// through pinned staging on the compute stream before the sink sees it on the host. Two
  /// tiles are in flight when two passes of the plan fit the budget (`gpu.vram_budget`, else
  /// what the device has): with `overlap`, tile k+1's upload and op are queued while tile k's
  /// work runs and tile k is written. Per-band tiles of several bands go through
  /// dispatch_per_band_gpu with `gpu` instead (its plan: band batches of the run's plan), which
  /// stages them in its own pipeline. placed() chooses this.
  Residency placement = Residency::host;
  /// Budget, buffers and plan of the per-band GPU dispatch of a tile (placement device). Empty
  /// plan: band batches of plan.bands_per_pass bands.
  GpuDispatchOptions gpu;
  /// Tiles in flight between the stages. 0: each tile is read, computed and written in turn on
  /// the calling thread (one tile live). n >= 1: three stages overlap, tile k+1 read (on a
  /// thread of the run) while tile k is computed (on the calling thread) and tile k-1 written
  /// (on another thread of the run), with queues of n tiles between them: at most n + 2 input
  /// tiles and n + 2 results are live (overlap_tiles_live). At most 64.
  int overlap = 0;
  /// Called after each tile is written with (tiles done, total), if set.
  std::function<void(std::int64_t done, std::int64_t total)> progress;
  /// Called before each tile is read, computed and written, if set. With overlap, the calls come
  /// from the stages' threads, one at a time (never concurrently), so the stages of neighbouring
  /// tiles interleave.
  std::function<void(const TileInfo& where, TileStage stage)> stage;
  /// Called after each tile's read, compute and write has ended (without an error), if set:
  /// with `stage`, what a stage took, also while the stages overlap. The same threads and the
  /// same one-at-a-time rule as `stage`.
  std::function<void(const TileInfo& where, TileStage stage)> stage_done;
};

/**
 * @brief How many input tiles (and, as many, results) a run with @p overlap keeps live at most:
 * 1 without overlap, else overlap + 2 (one being read, @p overlap queued, one computing; the
 * same for results: one computed, @p overlap queued, one being written). For memory plans.
 * Never throws.
 */
constexpr int overlap_tiles_live(int overlap) noexcept {
  return overlap <= 0 ? 1 : overlap + 2;
}

/**
 * @brief Runs @p op over the tiles of @p plan, from @p source into @p sink.
 *
 * For each pass (tile_passes) and each tile of tile_windows(height, width, tile shape, halo)
 * in row-major order: the source reads the tile's read window of the pass's bands, the tile is
 * placed (options.placement), @p op computes its result, the first-result rule checks it (see
 * the glossary), and the sink writes it. Without options.overlap one tile is live at a time;
 * with it the three stages overlap (see there). A whole or band_batches plan is one tile, the
 * whole raster. finish() is called, on the calling thread, after the last tile was written.
 * On an error the stages stop, the run's threads are joined, and the first error (in time) is
 * rethrown.
 *
 * @throws std::invalid_argument for an empty @p op, a negative halo, bands_per_pass < 1, a
 *         tiled plan without a positive tile_shape, or a result breaking the first-result rule
 *         (the message names the tile); std::runtime_error for a pass over bands of different
 *         nodata without options.mixed_nodata; whatever the source, @p op or the sink throws.
 *         The sink's finish() is then not called.
 * Thread-safety: concurrent runs with distinct sources and sinks are safe.
 */
VSR_EXPORT void run_tiles(TileSource& source, const BandOp& op, TileSink& sink,
                          const RasterPlan& plan, const TileRunOptions& options = {});

/**
 * @brief An op over the tiles of several sources at once (the same window and pass of each),
 * told where the tile is: for binary ops, band math over named inputs and pipelines.
 */
using MultiTileOp = std::function<OwnedRasterArray(const std::vector<OwnedRasterArray>& tiles,
                                                   const TileInfo& where)>;

/**
 * @brief run_tiles over several sources of one grid: each tile is read from every source (the
 * same window; the pass's bands of each source when the bands are independent, else every band
 * of each), placed, and handed to @p op together.
 *
 * Passes are those of tile_passes over the bands' nodata, a band's nodata being the list of its
 * nodata in every source (so a pass never mixes bands whose nodata differ in any source).
 * Independent bands need sources of one band count. Each source's bands must agree in nodata
 * (unless options.mixed_nodata) when the op takes them together. Placement device copies each
 * tile to the device; the per-band GPU dispatch of run_tiles does not apply here (the op gets
 * every tile of the pass at once).
 * @throws std::invalid_argument for no source, a null source, sources that differ in height or
 *         width (naming the two), independent bands over sources of different band counts; as
 *         run_tiles otherwise.
 */
VSR_EXPORT void run_tiles(const std::vector<TileSource*>& sources, const MultiTileOp& op,
                          TileSink& sink, const RasterPlan& plan,
                          const TileRunOptions& options = {});

// ---------------------------------------------------------------------------------------------
// In-memory ends
// ---------------------------------------------------------------------------------------------

/**
 * @brief Tiles of an in-memory host raster: each read is a new host raster holding a copy of the
 * window (a window covering the whole raster and every band of a run shares its storage
 * instead). @p bands are the 1-based bands read, in order (repeats allowed); empty: all. The
 * raster is shared, not copied: it must outlive the source and stay unchanged meanwhile.
 * @throws std::invalid_argument for a device-resident raster (a tiled run would need a full
 *         device-to-host copy first) or a band outside [1, band count].
 */
class VSR_EXPORT RasterTileSource final : public TileSource {
 public:
  explicit RasterTileSource(OwnedRasterArray raster, std::vector<int> bands = {});
  RasterMetadata metadata() const override;
  std::vector<std::optional<NodataValue>> band_nodata() const override;
  OwnedRasterArray read(const RasterWindow& window, int first_band, int band_count) override;

 private:
  OwnedRasterArray raster_;
  std::vector<int> bands_;  ///< 0-based
};

/**
 * @brief Results stitched into one host raster: allocated at begin() with the first result's
 * dtype and band count and the source's grid, affine and CRS; its nodata is the first pass's.
 * result() hands it over after the run.
 * @throws std::invalid_argument (from begin_pass) when passes differ in nodata: a raster keeps
 *         one nodata for all bands.
 */
class VSR_EXPORT RasterTileSink final : public TileSink {
 public:
  RasterTileSink() = default;
  void begin(const TileOutput& output) override;
  void begin_pass(int output_band, int band_count,
                  const std::optional<NodataValue>& nodata) override;
  void write(const OwnedRasterArray& result, const TileInfo& where) override;
  void finish() override;
  /// The stitched raster. @throws std::logic_error before the run finished.
  OwnedRasterArray result() const;

 private:
  std::optional<OwnedRasterArray> out_;
  std::optional<NodataValue> nodata_;
  bool nodata_set_ = false, finished_ = false;
  std::vector<std::byte> scratch_;  ///< a device result's host copy
};

/**
 * @brief Hands every result to a function, with where it is: for reductions (statistics,
 * histograms) and runs that keep nothing (an empty function drops every result).
 */
class VSR_EXPORT VisitTileSink final : public TileSink {
 public:
  using Visit = std::function<void(const OwnedRasterArray& result, const TileInfo& where)>;
  explicit VisitTileSink(Visit visit = {}) : visit_(std::move(visit)) {}
  void begin(const TileOutput&) override {}
  void write(const OwnedRasterArray& result, const TileInfo& where) override;

 private:
  Visit visit_;
};

/**
 * @brief Copies @p window of the 1-based @p bands (empty: all) of the host raster @p raster into
 * a new host raster: the affine shifted to the window's origin, nodata and CRS as @p raster's.
 * The one window copy of the library (sources and tiled executors use it).
 * @throws std::invalid_argument for a device-resident raster, a window outside the raster or of
 *         non-positive size, or a band outside [1, band count].
 */
VSR_EXPORT OwnedRasterArray copy_window(const OwnedRasterArray& raster, const RasterWindow& window,
                                        const std::vector<int>& bands = {});

// ---------------------------------------------------------------------------------------------
// The other tiled executors of the Python original, on run_tiles
// ---------------------------------------------------------------------------------------------

/// An op over the same tile of two rasters.
using BinaryBandOp =
    std::function<OwnedRasterArray(const OwnedRasterArray& a, const OwnedRasterArray& b)>;

/**
 * @brief Runs @p op over the same tiles of @p a and @p b (one grid) and stitches the results, as
 * dispatch_tiled does for one raster: a whole plan is one call op(a, b) and its result as is; a
 * tiled plan reads each tile of both (every band, halo plan.halo), the first result fixes the
 * output (dtype, bands, nodata), the output has @p a's affine and CRS.
 * @throws std::invalid_argument for an empty @p op, rasters of different height or width (named
 *         with both shapes), a tiled plan over a device-resident raster, a band_batches plan, a
 *         tiled plan without a positive tile_shape, a result breaking the first-result rule;
 *         whatever @p op throws.
 */
VSR_EXPORT OwnedRasterArray dispatch_tiled_binary(const OwnedRasterArray& a,
                                                  const OwnedRasterArray& b, const BinaryBandOp& op,
                                                  const RasterPlan& plan);

/**
 * @brief The intermediate of dispatch_tiled_multipass's first pass and the tiles that made it,
 * for the merge: each tile's effective window (halo excluded) and read window.
 */
using MultipassMerge = std::function<OwnedRasterArray(const OwnedRasterArray& intermediate,
                                                      const std::vector<TileWindow>& tiles)>;

/**
 * @brief Two passes: @p local_fn runs over the tiles of @p plan (with plan.halo, as
 * dispatch_tiled_halo) into a full-size host intermediate, then @p merge_fn(intermediate, tiles)
 * runs once on the host with the tile bounds (label merges of connected components across tile
 * seams, distance-transform seams) and its result is returned. A whole plan is one tile.
 * @throws std::invalid_argument for an empty @p local_fn or @p merge_fn, a plan as
 *         dispatch_tiled_halo refuses, a local result breaking the first-result rule, or a merge
 *         whose result differs from the intermediate in dtype, band count, height or width (the
 *         message names both); whatever the functions throw.
 */
VSR_EXPORT OwnedRasterArray dispatch_tiled_multipass(const OwnedRasterArray& raster,
                                                     const BandOp& local_fn,
                                                     const MultipassMerge& merge_fn,
                                                     const RasterPlan& plan);

namespace detail {
/// Calls @p visit with each tile of @p raster (plan's tiles, every band, no halo) in order.
VSR_EXPORT void visit_raster_tiles(
    const OwnedRasterArray& raster, const RasterPlan& plan, const std::string& name,
    const std::function<void(const OwnedRasterArray& tile, const TileInfo& where)>& visit);
/// Whether two partials of an accumulator agree in shape: rasters in dtype, bands, height and
/// width; sized containers in size; anything else always.
template <class T>
bool same_partial_shape(const T& a, const T& b) {
  if constexpr (std::is_same_v<T, OwnedRasterArray>) {
    return a.dtype() == b.dtype() && a.band_count() == b.band_count() && a.height() == b.height() &&
           a.width() == b.width();
  } else if constexpr (requires { a.size(); }) {
    return a.size() == b.size();
  } else {
    return true;
  }
}
}  // namespace detail

/**
 * @brief Map-reduce over the tiles of @p plan: @p tile_fn(tile) gives each tile's partial,
 * folded left in tile order with @p merge_fn(acc, partial), which must be associative
 * (histograms, zonal partials); the halo is ignored (tiles do not overlap). A whole plan is one
 * tile, the raster itself. Returns the fold (the first tile's partial for one tile).
 * Tiles are read one at a time (tiled plans need a host-resident raster).
 * @throws std::invalid_argument for a plan as dispatch_tiled refuses, or a merge whose result
 *         differs in shape from the partials (a raster's dtype, bands or size; a container's
 *         size), naming the tile; whatever the functions throw.
 */
template <class TileFn, class MergeFn>
auto dispatch_tiled_accumulator(const OwnedRasterArray& raster, TileFn tile_fn, MergeFn merge_fn,
                                const RasterPlan& plan)
    -> std::decay_t<std::invoke_result_t<TileFn&, const OwnedRasterArray&>> {
  using Partial = std::decay_t<std::invoke_result_t<TileFn&, const OwnedRasterArray&>>;
  std::optional<Partial> acc;
  detail::visit_raster_tiles(
      raster, plan, "dispatch_tiled_accumulator",
      [&](const OwnedRasterArray& tile, const TileInfo& where) {
        Partial part = tile_fn(tile);
        if (!acc) {
          acc.emplace(std::move(part));
          return;
        }
        Partial merged = merge_fn(std::move(*acc), part);
        if (!detail::same_partial_shape(merged, part)) {
          throw std::invalid_argument("dispatch_tiled_accumulator: the merge at tile " +
                                      std::to_string(where.index) +
                                      " changed the partial's shape (a merge must return what "
                                      "it is given, e.g. summed histograms)");
        }
        acc.emplace(std::move(merged));
      });
  return std::move(*acc);
}

}  // namespace vibespatial::raster
