// SPDX-License-Identifier: Apache-2.0
// The fallback tier (devices without VMM): a caching pool over cuMemAlloc, sizes rounded up to
// 512 bytes. A freed block is cached and reused for a request of the same rounded size, or a
// slightly smaller one (at most 1/8 of the block is wasted), on its freeing stream at once, on
// another once its mark completed or, rather than a new cuMemAlloc, behind a wait for the mark;
// on OOM every cached block is freed (after its freeing work) and the request retried once.
// In a snapshot each cuMemAlloc is a segment of one block (memory_history.hpp): active_allocated
// while live, inactive while cached; the history records it as segment_alloc and segment_free.
#include "memory/device_pool.hpp"
#include "memory/driver_blocks.hpp"

#include <iterator>
#include <map>
#include <mutex>
#include <stdexcept>
#include <vector>

namespace vibespatial::raster::detail {
namespace {

constexpr std::size_t kRounding = 512;

class FallbackPool final : public DevicePool {
 public:
  explicit FallbackPool(int device) : DevicePool(device), live_(device), marks_(device) {}
  ~FallbackPool() override { teardown(); }

  void* allocate(std::size_t bytes, CUstream stream) override {
    if (bytes > (std::size_t{1} << 50)) throw DeviceFull{bytes};
    if (stream == CU_STREAM_LEGACY) stream = nullptr;
    const CUstream key = stream_key(stream);
    const std::size_t rounded = (bytes + kRounding - 1) / kRounding * kRounding;
    std::lock_guard lock(mutex_);
    auto take = [&](std::multimap<std::size_t, Cached>::iterator it) {
      const CUdeviceptr p = it->second.ptr;
      const std::size_t size = it->first;
      cached_.erase(it);
      cached_bytes_ -= size;
      return hand_out(p, size, bytes, stream);
    };
    const auto end = cached_.upper_bound(rounded + rounded / 8);
    for (auto it = cached_.lower_bound(rounded); it != end; ++it) {
      if (marks_.ready_for(it->second.mark, key)) return take(it);
    }
    // Rather than new memory: a block still busy on another stream, behind a wait for its mark.
    if (auto it = cached_.lower_bound(rounded); it != end) {
      marks_.wait_on(it->second.mark, stream);  // throws: nothing taken
      return take(it);
    }
    const DriverApi& api = driver();
    ScopedDeviceContext scope(device_);
    CUdeviceptr p = 0;
    CUresult r = api.cuMemAlloc(&p, rounded);
    if (r == CUDA_ERROR_OUT_OF_MEMORY && !cached_.empty()) {
      release_cached();  // the caching pool's own recovery: give the cache back, retry once
      r = api.cuMemAlloc(&p, rounded);
    }
    if (r == CUDA_ERROR_OUT_OF_MEMORY) throw DeviceFull{bytes};
    if (r != CUDA_SUCCESS) throw_cuda_error(r, "cuMemAlloc", __FILE__, __LINE__);
    note_driver_allocation(MemoryAction::segment_alloc, device_, p, rounded);
    return hand_out(p, rounded, bytes, stream);
  }

  void deallocate(void* ptr, std::size_t bytes, CUstream stream) override {
    std::lock_guard lock(mutex_);
    auto it = live_.expect_live(ptr, bytes);
    if (stream == CU_STREAM_LEGACY) stream = nullptr;
    MarkRef mark = marks_.record(stream, stream_key(stream));  // may throw: nothing changed yet
    const std::size_t size = it->second.size;
    cached_.emplace(size, Cached{it->first, std::move(mark)});
    cached_bytes_ += size;
    used_bytes_ -= size;
    usage_.on_free(bytes);
    live_.erase(it);
    if (history::on()) {  // under the mutex: before the block can be reused
      history::record_free(device_, reinterpret_cast<std::uintptr_t>(ptr), bytes,
                           reinterpret_cast<std::uintptr_t>(stream), history::ticks());
    }
  }

  bool owns(const void* ptr) const noexcept override {
    std::lock_guard lock(mutex_);
    const auto p = reinterpret_cast<CUdeviceptr>(ptr);
    if (live_.has(p)) return true;
    for (const auto& [size, c] : cached_) {
      if (c.ptr == p) return true;
    }
    return false;
  }

  BlockAt block_at(const void* ptr) const override {
    const auto p = reinterpret_cast<CUdeviceptr>(ptr);
    std::lock_guard lock(mutex_);
    if (const BlockAt live = live_.holding(p); live.kind != BlockAt::Kind::none) return live;
    for (const auto& [size, c] : cached_) {
      if (p >= c.ptr && p - c.ptr < size) return {BlockAt::Kind::not_live};
    }
    return {};
  }

  void trim() override {
    std::lock_guard lock(mutex_);
    ScopedDeviceContext scope(device_);
    const std::size_t held_before = cached_bytes_;
    release_cached();
    if (history::on())
      history::record_now(MemoryAction::trim, device_, 0, held_before - cached_bytes_);
    if (!cached_.empty()) {
      throw CudaError(CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN",
                      "free_pool_memory: some cached blocks could not be freed");
    }
  }

  void forget(CUstream stream) override {
    if (stream == CU_STREAM_LEGACY || stream == nullptr) return;
    const CUstream key = stream_key(stream);
    std::lock_guard lock(mutex_);
    // Every cached block's mark was recorded when it was freed: it covers the block's work.
    for (auto& [size, c] : cached_) {
      if (c.mark && c.mark->stream == key) c.mark->stream = forgotten_stream();
    }
  }

  void hold_still() const override { mutex_.lock(); }  // every path of this pool takes it
  void release_still() const noexcept override { mutex_.unlock(); }

  void collect_segments(std::vector<MemorySnapshotSegment>& out) const override {
    const std::size_t first = out.size();
    live_.collect_segments(out);
    for (const auto& [size, c] : cached_)
      out.push_back(driver_allocation_segment(device_, c.ptr, size, 0));
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
    std::lock_guard lock(mutex_);
    s.used_bytes = used_bytes_;
    s.free_bytes = cached_bytes_;
    s.total_bytes = used_bytes_ + cached_bytes_;
    s.current_count = static_cast<std::size_t>(usage_.current_count.load());
    s.peak_count = static_cast<std::size_t>(usage_.peak_count.load());
    s.total_count = static_cast<std::size_t>(usage_.total_count.load());
    s.pool_free_bytes = cached_bytes_;
  }

  std::string describe() const override {
    std::lock_guard lock(mutex_);
    return "the fallback pool holds " + format_bytes(used_bytes_ + cached_bytes_) + " (" +
           format_bytes(used_bytes_) + " live in " + std::to_string(live_.count()) + " blocks, " +
           format_bytes(cached_bytes_) + " cached free)";
  }

  void teardown() noexcept override {
    std::lock_guard lock(mutex_);
    const DriverState& ds = driver_state();
    if (ds.available) {
      try {
        ScopedDeviceContext scope(device_);
        for (auto& [size, c] : cached_) {
          if (c.mark && !c.mark->complete) ds.api.cuEventSynchronize(c.mark->event);
          ds.api.cuMemFree(c.ptr);
        }
        // Live blocks may still be in use by queued work: cuMemFree need not wait (§3.5).
        if (!live_.empty()) ds.api.cuCtxSynchronize();
        for (const auto& [p, b] : live_.all()) ds.api.cuMemFree(p);
        cached_.clear();  // the marks' events go back to the factory, destroyed in the context
        marks_.destroy_all();
      } catch (...) {
        // Best effort at teardown.
      }
    }
    cached_.clear();
    live_.clear();
    marks_.destroy_all();
    used_bytes_ = cached_bytes_ = 0;
  }

 private:
  struct Cached {
    CUdeviceptr ptr;
    MarkRef mark;
  };

  // Mutex held.
  void* hand_out(CUdeviceptr p, std::size_t size, std::size_t bytes, CUstream stream) {
    live_.add(p, size, bytes, stream);  // sizes rounded up
    used_bytes_ += size;
    usage_.on_allocate(bytes);
    return reinterpret_cast<void*>(p);
  }

  // Frees every cached block, waiting for the stream work that freed it. Mutex held.
  void release_cached() {
    const DriverApi& api = driver();
    for (auto it = cached_.begin(); it != cached_.end();) {
      try {
        marks_.wait(it->second.mark);
      } catch (const CudaError&) {
        ++it;
        continue;
      }
      if (api.cuMemFree(it->second.ptr) != CUDA_SUCCESS) {
        ++it;
        continue;
      }
      note_driver_allocation(MemoryAction::segment_free, device_, it->second.ptr, it->first);
      cached_bytes_ -= it->first;
      it = cached_.erase(it);
    }
  }

  mutable std::mutex mutex_;
  DriverBlocks live_;
  std::multimap<std::size_t, Cached> cached_;
  std::size_t used_bytes_ = 0;
  std::size_t cached_bytes_ = 0;
  UsageCounters usage_;
  MarkFactory marks_;
};

}  // namespace

std::unique_ptr<DevicePool> make_fallback_pool(int device) {
  return std::make_unique<FallbackPool>(device);
}

}  // namespace vibespatial::raster::detail
