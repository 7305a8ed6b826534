// SPDX-License-Identifier: Apache-2.0
#include "memory/device_pool.hpp"

#include "common/byte_text.hpp"
#include "common/expects.hpp"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>

namespace vibespatial::raster::detail {

void atomic_max(std::atomic<std::int64_t>& target, std::int64_t value) noexcept {
  std::int64_t seen = target.load(std::memory_order_relaxed);
  while (value > seen && !target.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

void expect_live_block(const void* ptr, const std::size_t* allocated, std::size_t freed) {
  VSR_EXPECTS(allocated != nullptr,
              "device_deallocate: " + std::to_string(reinterpret_cast<std::uintptr_t>(ptr)) +
                  " is not a live block of this pool (never allocated, or already freed)");
  VSR_EXPECTS(*allocated == freed, "device_deallocate: block was allocated with " +
                                       std::to_string(*allocated) + " bytes but freed with " +
                                       std::to_string(freed));
}

MemorySnapshotSegment driver_allocation_segment(int device, CUdeviceptr ptr, std::size_t size,
                                                std::size_t requested) {
  MemorySnapshotSegment seg;
  seg.device = device;
  seg.address = ptr;
  seg.total_size = size;
  seg.allocated_size = requested != 0 ? size : 0;
  seg.small = size <= (std::size_t{1} << 20);  // PyTorch's small pool: blocks of 1 MiB at most
  seg.expandable = false;
  MemorySnapshotBlock b;
  b.address = ptr;
  b.size = size;
  b.requested_size = requested;
  b.active = requested != 0;
  seg.blocks.push_back(std::move(b));
  return seg;
}

void sort_by_address(std::vector<MemorySnapshotSegment>& out, std::size_t first) {
  std::sort(out.begin() + static_cast<std::ptrdiff_t>(first), out.end(),
            [](const MemorySnapshotSegment& a, const MemorySnapshotSegment& b) {
              return a.address < b.address;
            });
}

void UsageCounters::on_allocate(std::size_t bytes) noexcept {
  const auto b = static_cast<std::int64_t>(bytes);
  atomic_max(peak_bytes, current_bytes.fetch_add(b, std::memory_order_relaxed) + b);
  atomic_max(peak_count, current_count.fetch_add(1, std::memory_order_relaxed) + 1);
  total_bytes.fetch_add(bytes, std::memory_order_relaxed);
  total_count.fetch_add(1, std::memory_order_relaxed);
}

void UsageCounters::on_free(std::size_t bytes) noexcept {
  current_bytes.fetch_sub(static_cast<std::int64_t>(bytes), std::memory_order_relaxed);
  current_count.fetch_sub(1, std::memory_order_relaxed);
}

void UsageCounters::fold(std::int64_t bytes, std::int64_t count, std::int64_t peak_bytes_delta,
                         std::int64_t peak_count_delta, std::uint64_t total_b,
                         std::uint64_t total_c) noexcept {
  atomic_max(peak_bytes,
             current_bytes.fetch_add(bytes, std::memory_order_relaxed) + peak_bytes_delta);
  atomic_max(peak_count,
             current_count.fetch_add(count, std::memory_order_relaxed) + peak_count_delta);
  total_bytes.fetch_add(total_b, std::memory_order_relaxed);
  total_count.fetch_add(total_c, std::memory_order_relaxed);
}

namespace {
std::atomic<std::uintptr_t> g_next_thread_key{1};
thread_local bool t_marks_bound = false;  // MarkFactory::record bound this thread's context
thread_local std::uintptr_t t_per_thread_key = 0;
}  // namespace

CUstream per_thread_stream_key() noexcept {
  if (t_per_thread_key == 0) [[unlikely]] {
    // Odd and above 2: never NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD or a handle (aligned).
    t_per_thread_key = (g_next_thread_key.fetch_add(1, std::memory_order_relaxed) << 4) | 0x3;
  }
  return reinterpret_cast<CUstream>(t_per_thread_key);
}

MarkFactory::~MarkFactory() {
  destroy_all();
}

MarkRef MarkFactory::record(CUstream stream, CUstream key) {
  const DriverApi& api = driver();
  // One device: a thread's context, once bound, is the device's (memory.hpp binds the primary
  // context for a thread that has none), so only a thread's first mark queries it; not every mark,
  // that is every large free. A thread that only frees (blocks from another thread) is bound here.
  std::optional<ScopedDeviceContext> scope;
  if (driver_state().device_count != 1) {
    scope.emplace(device_);
  } else if (!t_marks_bound) [[unlikely]] {
    bind_current_device();
    t_marks_bound = true;
  }
  // An idle stream has finished everything queued on it, and a sticky error (7xx) ended all of
  // the context's work: the mark is complete without an event.
  if (const CUresult q = api.cuStreamQuery(stream); q == CUDA_SUCCESS || is_sticky_error(q)) {
    return std::make_shared<StreamMark>(StreamMark{key, nullptr, true});
  }
  CUevent event = nullptr;
  if (!idle_->empty()) {
    event = idle_->back();
    idle_->pop_back();
  } else if (api.cuEventCreate(&event, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
    event = nullptr;
  }
  if (event != nullptr && api.cuEventRecord(event, stream) == CUDA_SUCCESS) {
    // The deleter returns the event to the idle list; marks die under the pool's mutex.
    std::weak_ptr<std::vector<CUevent>> idle = idle_;
    return MarkRef(new StreamMark{key, event, false}, [idle](StreamMark* m) {
      if (auto list = idle.lock()) {
        list->push_back(m->event);
      } else {
        driver_state().api.cuEventDestroy(m->event);
      }
      delete m;
    });
  }
  if (event != nullptr) idle_->push_back(event);
  // No event: make the stream's work so far complete instead, so the memory is free everywhere.
  // If even that fails (a stream of another device's context, a failing driver), wait for the
  // whole context, which waits for every stream's work (§3.7). Error paths only.
  if (api.cuStreamSynchronize(stream) != CUDA_SUCCESS) VSR_CU_TRY(api.cuCtxSynchronize());
  return std::make_shared<StreamMark>(StreamMark{key, nullptr, true});
}

bool MarkFactory::completed(const MarkRef& mark) {
  if (!mark || mark->complete) return true;
  ScopedDeviceContext scope(device_);
  const CUresult r = driver().cuEventQuery(mark->event);
  // A sticky error (7xx) ends every piece of the context's work: none will touch memory again.
  if (r == CUDA_SUCCESS || is_sticky_error(r)) mark->complete = true;
  return mark->complete;
}

bool MarkFactory::ready_for(const MarkRef& mark, CUstream key) {
  return !mark || mark->stream == key || completed(mark);
}

void MarkFactory::wait_on(const MarkRef& mark, CUstream stream) {
  if (!mark || mark->complete) return;
  ScopedDeviceContext scope(device_);
  VSR_CU_TRY(driver().cuStreamWaitEvent(stream, mark->event, 0));
}

void MarkFactory::wait(const MarkRef& mark) {
  if (!mark || mark->complete) return;
  ScopedDeviceContext scope(device_);
  const CUresult r = driver().cuEventSynchronize(mark->event);
  if (r != CUDA_SUCCESS && !is_sticky_error(r)) {  // sticky: the work is gone (completed())
    throw_cuda_error(r, "cuEventSynchronize", __FILE__, __LINE__);
  }
  mark->complete = true;
}

void MarkFactory::destroy_all() noexcept {
  const DriverState& s = driver_state();
  if (s.available) {
    for (CUevent e : *idle_) s.api.cuEventDestroy(e);
  }
  idle_->clear();
}

std::string format_bytes(std::size_t bytes) {
  if (bytes < 1024) return byte_text(bytes);
  return byte_text(bytes) + " (" + std::to_string(bytes) + " B)";
}

}  // namespace vibespatial::raster::detail
