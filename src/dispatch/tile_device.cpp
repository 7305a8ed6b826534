// SPDX-License-Identifier: Apache-2.0
// The tile executor's device end (tile_device.hpp).
#include "dispatch/tile_device.hpp"

#include "common/checked_math.hpp"

#include <vibespatial/raster/dispatch.hpp>
#include <vibespatial/raster/errors.hpp>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

namespace vibespatial::raster::detail {

namespace {

/// A pinned buffer of at least @p bytes in @p buffer: the one it holds if large enough (its last
/// use is over: the slot is free), else a new lease.
void* pinned_at_least(PinnedBuffer& buffer, std::size_t bytes) {
  if (!buffer || buffer.size() < bytes) {
    buffer = PinnedBuffer();
    buffer = DispatchResources::get().pinned(bytes);
  }
  return buffer.data();
}

int copy_threads(std::size_t bytes) {
  return staging_copy_threads(bytes);
}

}  // namespace

DeviceTile::~DeviceTile() {
  if (!done_) owner_.release(*this, true);
}

int DeviceTiles::depth_for(const RasterPlan& plan, const TileRunOptions& options) {
  if (plan.estimated_vram_per_tile == 0) return 2;
  const std::uint64_t budget =
      options.gpu.vram_budget ? *options.gpu.vram_budget : available_vram_bytes();
  return plan.estimated_vram_per_tile <= usable_vram_budget(budget) / 2 ? 2 : 1;
}

DeviceTiles::DeviceTiles(int depth)
    : api_(&driver()),
      depth_(std::clamp(depth, 1, 2)),
      pipeline_(DispatchResources::get().pipeline()) {}

DeviceTiles::~DeviceTiles() {
  // The lease waits for both streams; the legacy stream may hold an op's work too.
  try {
    ScopedDeviceContext scope(pipeline_->device);
    (void)api_->cuStreamSynchronize(nullptr);
  } catch (...) {
  }
  slots_ = {};
  DispatchResources::get().trim_pinned(static_cast<std::size_t>(pinned_bytes_));
}

std::unique_ptr<DeviceTile> DeviceTiles::upload(std::int64_t index,
                                                std::vector<OwnedRasterArray> tiles) {
  int slot = 0;
  std::vector<OwnedRasterArray> retired;
  {
    std::unique_lock lock(mutex_);
    free_.wait(lock, [&] { return aborted_ || !busy_[0] || (depth_ == 2 && !busy_[1]); });
    if (aborted_) throw std::runtime_error("the tile run stopped");
    slot = !busy_[0] ? 0 : 1;
    busy_[static_cast<std::size_t>(slot)] = true;
    retired.swap(retired_);
  }
  retired.clear();  // freed here, on the allocating thread
  std::unique_ptr<DeviceTile> tile(new DeviceTile(*this, index, slot));
  const Pipeline& p = *pipeline_;
  ScopedDeviceContext scope(p.device);
  std::size_t bytes = 0;
  for (const OwnedRasterArray& t : tiles) {
    if (t.residency() == Residency::host) {
      bytes = checked_add(bytes, t.byte_size(), "the pinned staging of a tile");
    }
  }
  Slot& s = slots_[static_cast<std::size_t>(slot)];
  auto* staging = bytes > 0 ? static_cast<unsigned char*>(pinned_at_least(s.in, bytes)) : nullptr;
  {
    std::lock_guard lock(mutex_);
    std::uint64_t held = 0;
    for (const Slot& x : slots_) held += x.in.size() + x.out.size();
    pinned_bytes_ = std::max(pinned_bytes_, held);
  }
  std::size_t at = 0;
  tile->inputs_.reserve(tiles.size());
  for (OwnedRasterArray& t : tiles) {
    if (t.residency() == Residency::device) {
      tile->inputs_.push_back(std::move(t));
      continue;
    }
    const std::size_t n = t.byte_size();
    parallel_copy(staging + at, t.host_data(), n, copy_threads(n));
    OwnedRasterArray dev =
        OwnedRasterArray::allocate(Residency::device, t.dtype(), t.band_count(), t.height(),
                                   t.width(), std::nullopt, t.affine(), t.crs(), p.copy)
            .with_nodata(t.exact_nodata());
    VSR_CU_TRY(api_->cuMemcpyHtoDAsync(to_device_ptr(dev.device_data()), staging + at, n, p.copy));
    at += n;
    tile->inputs_.push_back(std::move(dev));
  }
  CUevent copied = p.copied[static_cast<std::size_t>(slot)];
  VSR_CU_TRY(api_->cuEventRecord(copied, p.copy));
  // The op runs on the compute stream, or on the legacy stream (ops given a stream of their own
  // choosing, calc without one): both wait for the upload.
  VSR_CU_TRY(api_->cuStreamWaitEvent(p.compute, copied, 0));
  VSR_CU_TRY(api_->cuStreamWaitEvent(nullptr, copied, 0));
  notify_dispatch_step({DispatchStep::staged, static_cast<int>(index), p.copy, p.compute, copied,
                        tile->inputs_.empty() ? nullptr : tile->inputs_[0].device_pointer()});
  return tile;
}

void DeviceTiles::run(
    DeviceTile& tile,
    const std::function<OwnedRasterArray(const std::vector<OwnedRasterArray>&)>& op) {
  const Pipeline& p = *pipeline_;
  {
    OpStreamScope on_compute(p.compute);
    tile.result_.emplace(op(tile.inputs_));
  }
  ScopedDeviceContext scope(p.device);
  // Work the op queued on the legacy stream comes before the download.
  VSR_CU_TRY(api_->cuEventRecord(p.legacy_mark, nullptr));
  VSR_CU_TRY(api_->cuStreamWaitEvent(p.compute, p.legacy_mark, 0));
  const OwnedRasterArray& r = *tile.result_;
  const auto slot = static_cast<std::size_t>(tile.slot_);
  if (r.residency() == Residency::device) {
    void* out = pinned_at_least(slots_[slot].out, r.byte_size());
    VSR_CU_TRY(
        api_->cuMemcpyDtoHAsync(out, to_device_ptr(r.device_pointer()), r.byte_size(), p.compute));
    tile.downloaded_ = true;
  }
  VSR_CU_TRY(api_->cuEventRecord(p.consumed[slot], p.compute));
  notify_dispatch_step({DispatchStep::computed, static_cast<int>(tile.index_), p.copy, p.compute,
                        p.consumed[slot], nullptr});
}

OwnedRasterArray DeviceTiles::finish(DeviceTile& tile) {
  const Pipeline& p = *pipeline_;
  const auto slot = static_cast<std::size_t>(tile.slot_);
  {
    ScopedDeviceContext scope(p.device);
    VSR_CU_TRY(api_->cuEventSynchronize(p.consumed[slot]));
  }
  // The device result stays with the tile (retired, freed by the next upload): only a host
  // handle leaves.
  const OwnedRasterArray& r = *tile.result_;
  OwnedRasterArray out = r;
  if (tile.downloaded_) {
    OwnedRasterArray host =
        OwnedRasterArray::allocate(Residency::host, r.dtype(), r.band_count(), r.height(),
                                   r.width(), std::nullopt, r.affine(), r.crs())
            .with_nodata(r.exact_nodata());
    const std::size_t n = r.byte_size();
    parallel_copy(host.mutable_host_data(), slots_[slot].out.data(), n, copy_threads(n));
    host.adopt_diagnostics(r.diagnostics());
    out = std::move(host);
  }
  notify_dispatch_step({DispatchStep::drained, static_cast<int>(tile.index_), p.copy, p.compute,
                        p.consumed[slot], nullptr});
  release(tile, false);
  return out;
}

void DeviceTiles::release(DeviceTile& tile, bool wait_streams) noexcept {
  if (wait_streams) {
    // The tile's work may still be queued (a failed run): nothing of it may outlive its buffers.
    try {
      ScopedDeviceContext scope(pipeline_->device);
      (void)api_->cuStreamSynchronize(pipeline_->copy);
      (void)api_->cuStreamSynchronize(pipeline_->compute);
      (void)api_->cuStreamSynchronize(nullptr);
    } catch (...) {
    }
  }
  tile.done_ = true;
  {
    std::lock_guard lock(mutex_);
    try {
      for (OwnedRasterArray& r : tile.inputs_) retired_.push_back(std::move(r));
      if (tile.result_) retired_.push_back(std::move(*tile.result_));
    } catch (...) {  // no memory to keep them: freed below, here
    }
    busy_[static_cast<std::size_t>(tile.slot_)] = false;
  }
  tile.inputs_.clear();
  tile.result_.reset();
  free_.notify_all();
}

void DeviceTiles::abort() noexcept {
  {
    std::lock_guard lock(mutex_);
    aborted_ = true;
  }
  free_.notify_all();
}

}  // namespace vibespatial::raster::detail
