// SPDX-License-Identifier: Apache-2.0
// The tile executor's device end (tile_executor.cpp, placement device): tiles go to the device
// through pinned staging on a copy stream, the op runs with the compute stream current
// (OpStreamScope), and its result comes back through pinned staging on the compute stream,
// with up to two tiles in flight: tile k+1's upload and op are queued while tile k's work runs
// and tile k is written. The streams, events and pinned buffers are gpu_resources' (a leased
// Pipeline).
//
// Glossary
// - slot: the pinned buffers and events of one tile in flight (two slots, or one when the plan
//   says two tiles do not fit the budget). A tile takes a slot before its upload and gives it
//   back once it is written (finish) or dropped.
// - upload: the host tiles copied into the slot's pinned buffer, then to new device rasters
//   (pool memory for the copy stream) on the copy stream; the compute stream and the legacy
//   stream wait for it (an event).
// - download: the op's device result copied into the slot's pinned output on the compute stream,
//   after the compute stream waited for the op's work on the legacy stream.
#pragma once

#include "dispatch/gpu_resources.hpp"

#include <vibespatial/raster/tiles.hpp>

#include <array>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace vibespatial::raster::detail {

class DeviceTiles;

/// One tile on the device, from its upload to its result on the host. Dropping it before
/// DeviceTiles::finish waits for the streams (no queued work outlives its buffers) and gives its
/// slot back.
class DeviceTile {
 public:
  ~DeviceTile();
  DeviceTile(const DeviceTile&) = delete;
  DeviceTile& operator=(const DeviceTile&) = delete;

  /// The op's result, as it returned it (on the device, or on the host); set by run().
  const std::optional<OwnedRasterArray>& result() const { return result_; }

 private:
  friend class DeviceTiles;
  DeviceTile(DeviceTiles& owner, std::int64_t index, int slot)
      : owner_(owner), index_(index), slot_(slot) {}
  DeviceTiles& owner_;
  std::int64_t index_;
  int slot_;
  std::vector<OwnedRasterArray> inputs_;  ///< on the device
  std::optional<OwnedRasterArray> result_;
  bool downloaded_ = false;  ///< result_ is being copied into the slot's pinned output
  bool done_ = false;        ///< finished: its work completed and its slot is back
};

/// The device end of one run. Construct on the thread that runs the ops (it binds the device).
class DeviceTiles {
 public:
  /// @p depth 1 or 2: the tiles in flight at most.
  explicit DeviceTiles(int depth);
  /// Waits for every stream (PipelineLease), then gives back the pinned buffers.
  ~DeviceTiles();
  DeviceTiles(const DeviceTiles&) = delete;
  DeviceTiles& operator=(const DeviceTiles&) = delete;

  /// The tiles in flight for @p plan within @p options.gpu's budget (or what the device has):
  /// 2, unless the plan says two of its passes do not fit the budget.
  static int depth_for(const RasterPlan& plan, const TileRunOptions& options);

  /// Waits for a free slot (the tile two before this one written), then uploads @p tiles (host
  /// rasters; a device one is used as it is): see the glossary. Throws what the driver or the
  /// pool throws (the slot is given back).
  std::unique_ptr<DeviceTile> upload(std::int64_t index, std::vector<OwnedRasterArray> tiles);

  /// Runs @p op on the tile's device inputs with the compute stream current, then queues the
  /// download of its result; returns at once. The op's result is tile.result().
  void run(DeviceTile& tile,
           const std::function<OwnedRasterArray(const std::vector<OwnedRasterArray>&)>& op);

  /// Waits for the tile's work and returns its result on the host (the downloaded pixels with
  /// the device result's nodata, georeferencing and diagnostic log; a host result as it is),
  /// then frees its device rasters and gives its slot back. Any thread.
  OwnedRasterArray finish(DeviceTile& tile);

  /// A failed run: wakes an upload waiting for a slot, which then throws.
  void abort() noexcept;

 private:
  friend class DeviceTile;
  void release(DeviceTile& tile, bool wait_streams) noexcept;

  struct Slot {
    PinnedBuffer in, out;
  };
  const DriverApi* api_;
  int depth_;
  PipelineLease pipeline_;
  std::array<Slot, 2> slots_;
  std::mutex mutex_;
  std::condition_variable free_;
  std::array<bool, 2> busy_{};
  bool aborted_ = false;
  /// Device rasters of finished tiles, whose work is done: freed by the next upload, on the
  /// thread that allocated them, so that the pool's cache of that thread takes them back (a
  /// block freed on another thread stays in that thread's cache, out of the uploads' reach).
  std::vector<OwnedRasterArray> retired_;
  std::uint64_t pinned_bytes_ = 0;  ///< the most pinned bytes held at once (for trim_pinned)
};

}  // namespace vibespatial::raster::detail
