// SPDX-License-Identifier: Apache-2.0
// Tier C (VIBESPATIAL_GPU_MANAGED_MEMORY): no pooling, one cuMemAllocManaged per request. In a
// snapshot each allocation is a segment of one block (memory_history.hpp), got and given back
// as segment_alloc and segment_free in the history.
#include "memory/device_pool.hpp"
#include "memory/driver_blocks.hpp"

#include <iterator>
#include <map>
#include <mutex>
#include <vector>

namespace vibespatial::raster::detail {
namespace {

// Tier C: bare managed memory, one cuMemAllocManaged per request, counted. A free is stream
// ordered: cuMemFree need not wait for queued work (§3.5), so a block freed while its stream is
// busy is kept until a mark recorded at the free completes (checked by later calls; trim() and an
// allocation that finds the device full wait for it).
class ManagedPool final : public DevicePool {
 public:
  explicit ManagedPool(int device) : DevicePool(device), live_(device), marks_(device) {}
  ~ManagedPool() override { teardown(); }

  void* allocate(std::size_t bytes, CUstream stream) override {
    if (bytes > (std::size_t{1} << 50)) throw DeviceFull{bytes};
    const DriverApi& api = driver();
    std::lock_guard lock(mutex_);
    ScopedDeviceContext scope(device_);
    free_completed(false);
    CUdeviceptr p = 0;
    CUresult r = api.cuMemAllocManaged(&p, bytes, CU_MEM_ATTACH_GLOBAL);
    if (r == CUDA_ERROR_OUT_OF_MEMORY && !pending_.empty()) {
      free_completed(true);  // what waits for its stream's work is memory too
      r = api.cuMemAllocManaged(&p, bytes, CU_MEM_ATTACH_GLOBAL);
    }
    if (r == CUDA_ERROR_OUT_OF_MEMORY) throw DeviceFull{bytes};
    if (r != CUDA_SUCCESS) throw_cuda_error(r, "cuMemAllocManaged", __FILE__, __LINE__);
    note_driver_allocation(MemoryAction::segment_alloc, device_, p, bytes);
    live_.add(p, bytes, bytes, stream);  // its alloc event after the segment's
    usage_.on_allocate(bytes);
    return reinterpret_cast<void*>(p);
  }

  void deallocate(void* ptr, std::size_t bytes, CUstream stream) override {
    std::lock_guard lock(mutex_);
    auto it = live_.expect_live(ptr, bytes);
    if (stream == CU_STREAM_LEGACY) stream = nullptr;
    ScopedDeviceContext scope(device_);
    // The work queued on `stream` so far may still use the block.
    MarkRef mark = marks_.record(stream, stream_key(stream));  // may throw: nothing changed
    // The free's time stamp before cuMemFree: its events come before the segment's free.
    const std::uint64_t t = history::on() ? history::ticks() : 0;
    if (mark->complete) {
      VSR_CU_TRY(driver().cuMemFree(it->first));  // may throw: the block is still live
      note_driver_allocation(MemoryAction::segment_free, device_, it->first, it->second.bytes);
    } else {
      pending_.push_back({it->first, it->second.bytes, std::move(mark)});  // may throw: likewise
    }
    live_.erase(it);
    usage_.on_free(bytes);
    if (t != 0) {
      history::record_free(device_, reinterpret_cast<std::uintptr_t>(ptr), bytes,
                           reinterpret_cast<std::uintptr_t>(stream), t);
    }
    free_completed(false);
  }

  bool owns(const void* ptr) const noexcept override {
    std::lock_guard lock(mutex_);
    return live_.has(reinterpret_cast<CUdeviceptr>(ptr));
  }

  BlockAt block_at(const void* ptr) const override {
    const auto p = reinterpret_cast<CUdeviceptr>(ptr);
    std::lock_guard lock(mutex_);
    if (const BlockAt live = live_.holding(p); live.kind != BlockAt::Kind::none) return live;
    for (const Pending& f : pending_) {
      if (p >= f.ptr && p - f.ptr < f.bytes) return {BlockAt::Kind::not_live};
    }
    return {};
  }

  void trim() override {
    std::lock_guard lock(mutex_);
    ScopedDeviceContext scope(device_);
    const bool recording = history::on();
    const std::size_t held_before = recording ? pending_bytes() : 0;
    free_completed(true);
    if (recording)
      history::record_now(MemoryAction::trim, device_, 0, held_before - pending_bytes());
    if (!pending_.empty()) {
      throw CudaError(CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN",
                      "free_pool_memory: some freed managed blocks could not be released");
    }
  }

  void forget(CUstream /*stream*/) override {}  // pending frees hold events, not streams

  void hold_still() const override { mutex_.lock(); }  // every path of this pool takes it
  void release_still() const noexcept override { mutex_.unlock(); }

  void collect_segments(std::vector<MemorySnapshotSegment>& out) const override {
    const std::size_t first = out.size();
    live_.collect_segments(out);
    for (const Pending& f : pending_) {
      out.push_back(driver_allocation_segment(device_, f.ptr, f.bytes, 0));
    }
    sort_by_address(out, first);
  }

  void collect_owned(std::uint16_t session, std::vector<history::OwnedBlock>& out) const override {
    std::lock_guard lock(mutex_);
    collect_owned_locked(session, out);
  }

  void collect_owned_locked(std::uint16_t session,
                            std::vector<history::OwnedBlock>& out) const override {
    live_.collect_owned(session, out);
  }

  void fill_stats(MemoryPoolStats& s) const noexcept override {
    s.current_bytes = static_cast<std::size_t>(usage_.current_bytes.load());
    s.current_count = static_cast<std::size_t>(usage_.current_count.load());
    s.peak_bytes = static_cast<std::size_t>(usage_.peak_bytes.load());
    s.peak_count = static_cast<std::size_t>(usage_.peak_count.load());
    s.total_bytes = static_cast<std::size_t>(usage_.total_bytes.load());
    s.total_count = static_cast<std::size_t>(usage_.total_count.load());
  }

  std::string describe() const override {
    std::lock_guard lock(mutex_);
    return "managed memory: " +
           format_bytes(static_cast<std::size_t>(usage_.current_bytes.load())) + " live in " +
           std::to_string(live_.count()) + " blocks";
  }

  void teardown() noexcept override {
    std::lock_guard lock(mutex_);
    const DriverState& ds = driver_state();
    if (ds.available) {
      try {
        ScopedDeviceContext scope(device_);
        if (!live_.empty() || !pending_.empty()) ds.api.cuCtxSynchronize();
        for (const auto& [p, b] : live_.all()) ds.api.cuMemFree(p);
        for (const Pending& f : pending_) ds.api.cuMemFree(f.ptr);
        pending_.clear();  // the marks' events go back to the factory, destroyed in the context
        marks_.destroy_all();
      } catch (...) {
        // Best effort at teardown.
      }
    }
    live_.clear();
    pending_.clear();
    marks_.destroy_all();
  }

 private:
  struct Pending {
    CUdeviceptr ptr;
    std::size_t bytes;
    MarkRef mark;
  };

  std::size_t pending_bytes() const noexcept {
    std::size_t n = 0;
    for (const Pending& f : pending_) n += f.bytes;
    return n;
  }

  // cuMemFree of the pending blocks whose marks have completed (with `wait`, of all, after
  // waiting). A failing call keeps the block pending, for a later try. Mutex held, in context.
  void free_completed(bool wait) noexcept {
    const DriverApi& api = driver_state().api;
    std::erase_if(pending_, [&](const Pending& f) {
      try {
        if (wait) {
          marks_.wait(f.mark);
        } else if (!marks_.completed(f.mark)) {
          return false;
        }
      } catch (...) {
        return false;
      }
      if (api.cuMemFree(f.ptr) != CUDA_SUCCESS) return false;
      note_driver_allocation(MemoryAction::segment_free, device_, f.ptr, f.bytes);
      return true;
    });
  }

  mutable std::mutex mutex_;
  DriverBlocks live_;
  std::vector<Pending> pending_;
  UsageCounters usage_;
  MarkFactory marks_;
};

}  // namespace

std::unique_ptr<DevicePool> make_managed_pool(int device) {
  return std::make_unique<ManagedPool>(device);
}

}  // namespace vibespatial::raster::detail
