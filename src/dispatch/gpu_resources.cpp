// SPDX-License-Identifier: Apache-2.0
#include "dispatch/gpu_resources.hpp"

#include <vibespatial/raster/dispatch.hpp>
#include <vibespatial/raster/memory.hpp>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace vibespatial::raster::detail {

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

std::mutex& observer_mutex() {
  static std::mutex m;
  return m;
}

std::function<void(const DispatchStep&)>& observer() {
  static std::function<void(const DispatchStep&)> f;
  return f;
}

/// Destroys what exists of @p p (in its device's primary context) and deletes it. Returns the
/// first driver error, CUDA_SUCCESS if none.
CUresult destroy_pipeline(Pipeline* p) noexcept {
  CUresult first = CUDA_SUCCESS;
  try {
    const DriverApi& api = driver();
    ScopedDeviceContext scope(p->device);
    auto note = [&](CUresult r) {
      if (first == CUDA_SUCCESS) first = r;
    };
    for (CUstream s : {p->copy, p->compute}) {
      if (s == nullptr) continue;
      // Pool memory was freed on the stream (ops' temporaries, tiles' rasters): its handle value
      // must not pass for a later stream's.
      try {
        forget_stream(s);
      } catch (...) {
      }
      note(api.cuStreamDestroy(s));
    }
    for (CUevent e : p->copied) {
      if (e != nullptr) note(api.cuEventDestroy(e));
    }
    for (CUevent e : p->consumed) {
      if (e != nullptr) note(api.cuEventDestroy(e));
    }
    if (p->legacy_mark != nullptr) note(api.cuEventDestroy(p->legacy_mark));
  } catch (const CudaError& e) {
    if (first == CUDA_SUCCESS) first = static_cast<CUresult>(e.code());
  }
  delete p;
  return first;
}

}  // namespace

int staging_copy_threads(std::size_t bytes) noexcept {
  if (bytes < 16 * kMiB) return 1;
  const std::size_t hw = std::max(1u, std::thread::hardware_concurrency());
  return static_cast<int>(
      std::max<std::size_t>(1, std::min({hw, std::size_t{8}, bytes / (8 * kMiB)})));
}

int parallel_copy(void* dst, const void* src, std::size_t bytes, int threads) {
  if (bytes == 0) return 0;
  if (threads <= 1) {
    std::memcpy(dst, src, bytes);
    return 1;
  }
  const auto n = static_cast<std::size_t>(threads);
  const std::size_t chunk = ((bytes + n - 1) / n + 4095) / 4096 * 4096;
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  std::vector<std::thread> workers;
  workers.reserve(n - 1);
  int copied_by = 1;
  std::vector<std::pair<std::size_t, std::size_t>> left;  // chunks no thread could take
  for (std::size_t off = chunk; off < bytes; off += chunk) {
    const std::size_t len = std::min(chunk, bytes - off);
    try {
      workers.emplace_back([d, s, off, len] { std::memcpy(d + off, s + off, len); });
      ++copied_by;
    } catch (const std::system_error&) {
      left.emplace_back(off, len);
    }
  }
  std::memcpy(d, s, std::min(chunk, bytes));
  for (const auto& [off, len] : left) std::memcpy(d + off, s + off, len);
  for (auto& w : workers) w.join();
  return copied_by;
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    if (data_ != nullptr) DispatchResources::get().give_back(data_, bytes_);
    data_ = o.data_;
    bytes_ = o.bytes_;
    o.data_ = nullptr;
  }
  return *this;
}

PinnedBuffer::~PinnedBuffer() {
  if (data_ != nullptr) DispatchResources::get().give_back(data_, bytes_);
}

PipelineLease::~PipelineLease() {
  if (p_ == nullptr) return;
  bool healthy = true;
  try {
    const DriverApi& api = driver();
    ScopedDeviceContext scope(p_->device);
    healthy = api.cuStreamSynchronize(p_->copy) == CUDA_SUCCESS;
    healthy = api.cuStreamSynchronize(p_->compute) == CUDA_SUCCESS && healthy;
  } catch (...) {
    healthy = false;
  }
  DispatchResources::get().give_back(p_, healthy);
}

struct DispatchResources::State {
  mutable std::mutex mutex;
  std::multimap<std::size_t, void*> idle_pinned;  ///< size -> buffer
  std::size_t idle_bytes = 0;
  std::vector<Pipeline*> idle_pipelines;
};

DispatchResources& DispatchResources::get() {
  static DispatchResources r;  // never destroyed objects: the driver may be gone at exit
  return r;
}

DispatchResources::State& DispatchResources::state() const {
  static State* s = new State;  // intentionally leaked: see get()
  return *s;
}

PinnedBuffer DispatchResources::pinned(std::size_t bytes) {
  State& s = state();
  {
    std::lock_guard lock(s.mutex);
    auto it = s.idle_pinned.lower_bound(bytes);
    if (it != s.idle_pinned.end() && it->first / 2 <= bytes) {
      PinnedBuffer b(it->second, it->first);
      s.idle_bytes -= it->first;
      s.idle_pinned.erase(it);
      return b;
    }
  }
  const DriverApi& api = driver();
  bind_current_device();
  void* p = nullptr;
  VSR_CU_TRY(api.cuMemHostAlloc(&p, bytes, CU_MEMHOSTALLOC_PORTABLE));
  return PinnedBuffer(p, bytes);
}

PipelineLease DispatchResources::pipeline() {
  const int device = bind_current_device();
  State& s = state();
  {
    std::lock_guard lock(s.mutex);
    for (auto it = s.idle_pipelines.begin(); it != s.idle_pipelines.end(); ++it) {
      if ((*it)->device == device) {
        Pipeline* p = *it;
        s.idle_pipelines.erase(it);
        return PipelineLease(p);
      }
    }
  }
  const DriverApi& api = driver();
  auto* p = new Pipeline;
  p->device = device;
  CUresult r = api.cuStreamCreate(&p->copy, CU_STREAM_NON_BLOCKING);
  if (r == CUDA_SUCCESS) r = api.cuStreamCreate(&p->compute, CU_STREAM_NON_BLOCKING);
  for (CUevent* e :
       {&p->copied[0], &p->copied[1], &p->consumed[0], &p->consumed[1], &p->legacy_mark}) {
    if (r == CUDA_SUCCESS) r = api.cuEventCreate(e, CU_EVENT_DISABLE_TIMING);
  }
  if (r != CUDA_SUCCESS) {
    (void)destroy_pipeline(p);
    throw_cuda_error(r, "creating the streams and events of a dispatch pipeline", __FILE__,
                     __LINE__);
  }
  return PipelineLease(p);
}

void DispatchResources::give_back(void* data, std::size_t bytes) noexcept {
  State& s = state();
  std::lock_guard lock(s.mutex);
  try {
    s.idle_pinned.emplace(bytes, data);
    s.idle_bytes += bytes;
  } catch (...) {
    // No memory for the bookkeeping: free the buffer instead of keeping it.
    try {
      bind_current_device();
      (void)driver().cuMemFreeHost(data);
    } catch (...) {
    }
  }
}

void DispatchResources::give_back(Pipeline* p, bool healthy) noexcept {
  if (healthy) {
    State& s = state();
    std::lock_guard lock(s.mutex);
    try {
      s.idle_pipelines.push_back(p);
      return;
    } catch (...) {
    }
  }
  (void)destroy_pipeline(p);
}

void DispatchResources::trim_pinned(std::size_t keep_bytes) noexcept {
  State& s = state();
  std::lock_guard lock(s.mutex);
  while (s.idle_bytes > keep_bytes && !s.idle_pinned.empty()) {
    auto it = std::prev(s.idle_pinned.end());
    try {
      bind_current_device();
      (void)driver().cuMemFreeHost(it->second);
    } catch (...) {
    }
    s.idle_bytes -= it->first;
    s.idle_pinned.erase(it);
  }
}

void DispatchResources::release_idle() {
  State& s = state();
  std::multimap<std::size_t, void*> pinned;
  std::vector<Pipeline*> pipelines;
  {
    std::lock_guard lock(s.mutex);
    pinned.swap(s.idle_pinned);
    pipelines.swap(s.idle_pipelines);
    s.idle_bytes = 0;
  }
  std::optional<CudaError> first;
  if (!pinned.empty()) {
    try {
      const DriverApi& api = driver();
      bind_current_device();
      for (const auto& [bytes, p] : pinned) {
        const CUresult r = api.cuMemFreeHost(p);
        if (r != CUDA_SUCCESS && !first) {
          first.emplace(static_cast<int>(r), cu_result_name(r),
                        "free_dispatch_resources: cuMemFreeHost failed: " + cu_result_name(r));
        }
      }
    } catch (const CudaError& e) {
      if (!first) first = e;
    }
  }
  for (Pipeline* p : pipelines) {
    const CUresult r = destroy_pipeline(p);
    if (r != CUDA_SUCCESS && !first) {
      first.emplace(static_cast<int>(r), cu_result_name(r),
                    "free_dispatch_resources: destroying a pipeline failed: " + cu_result_name(r));
    }
  }
  if (first) throw *first;
}

std::size_t DispatchResources::idle_pinned_bytes() const noexcept {
  State& s = state();
  std::lock_guard lock(s.mutex);
  return s.idle_bytes;
}

void set_dispatch_observer(std::function<void(const DispatchStep&)> f) {
  std::lock_guard lock(observer_mutex());
  observer() = std::move(f);
}

void notify_dispatch_step(const DispatchStep& step) {
  std::function<void(const DispatchStep&)> f;
  {
    std::lock_guard lock(observer_mutex());
    f = observer();
  }
  if (f) f(step);
}

}  // namespace vibespatial::raster::detail

namespace vibespatial::raster {

void free_dispatch_resources() {
  if (!detail::driver_state().available) return;
  detail::DispatchResources::get().release_idle();
}

}  // namespace vibespatial::raster
