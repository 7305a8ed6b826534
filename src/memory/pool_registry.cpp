// SPDX-License-Identifier: Apache-2.0
// memory.hpp's registry and entry points: one pool per device, created on first use; the direct
// path of a one-device process; allocation, free, statistics, trimming and teardown; the state a
// forked child inherits.
#include "common/expects.hpp"
#include "memory/memory_history.hpp"
#include "memory/memory_owners.hpp"
#include "memory/registry_state.hpp"
#include "memory/vmm_pool_impl.hpp"

#include <vibespatial/raster/memory.hpp>

#include <pthread.h>

#include <optional>
#include <stdexcept>
#include <string>

namespace vibespatial::raster::detail {
namespace {

// The VMM pool of the only device of a one-device process (tiers A and B), or null: once the
// calling thread's context is bound, device_allocate and device_deallocate call it directly, with
// no tier or device lookup and no virtual call (VmmPool is final). Set with the pool; cleared by
// reset_memory_pools() and in a forked child, whose calls then take the checked path and throw.
std::atomic<vmm::VmmPool*> g_direct_pool{nullptr};

// Whether this process had used the pool when it forked (see g_forked_child). Set before any
// pool lock is first taken, so a fork while a lock is held always sees it.
std::atomic<bool> g_pool_used{false};

void on_fork_child() noexcept {
  if (g_pool_used.load(std::memory_order_relaxed)) {
    g_direct_pool.store(nullptr, std::memory_order_relaxed);
    g_forked_child.store(true, std::memory_order_relaxed);
  }
}

// Registered when the library is loaded, so no fork can come before it. glibc removes the
// handler if the library is unloaded (dlclose).
[[maybe_unused]] const int g_atfork_registered = pthread_atfork(nullptr, nullptr, on_fork_child);

// Whether this thread's context has been checked (and device 0's primary context bound if it had
// none), in a one-device process where current_device() needs no driver call otherwise.
thread_local bool t_context_bound = false;

DevicePool& pool_of(const void* ptr) {
  Registry& r = registry();
  DevicePool* found = nullptr;
  if (driver_state().device_count == 1) {
    found = r.pools[0].load(std::memory_order_acquire);
  } else {
    for (auto& slot : r.pools) {
      DevicePool* p = slot.load(std::memory_order_acquire);
      if (p != nullptr && p->owns(ptr)) found = p;
    }
  }
  VSR_EXPECTS(found != nullptr, "device_deallocate: pointer was not allocated by the pool");
  return *found;
}

}  // namespace

void note_pool_use() noexcept {
  if (!g_pool_used.load(std::memory_order_relaxed)) g_pool_used.store(true);
}

Registry& registry() {
  static Registry* r = new Registry();  // leaked on purpose (registry_state.hpp)
  return *r;
}

int current_device() {
  if (driver_state().device_count == 1) {
    // One device: no driver call after the thread's first, which binds the primary context if
    // the thread has none (memory.hpp promises it: the blocks are then usable on this thread).
    if (!t_context_bound) [[unlikely]] {
      bind_current_device();
      t_context_bound = true;
    }
    return 0;
  }
  return bind_current_device();
}

std::string configured_tier() noexcept {
  return tier_name(current_tier());
}

DevicePool& pool_for_device(int device) {
  if (current_tier() == Tier::none) configure_memory_pool();
  if (device < 0 || device >= kMaxDevices || device >= driver_state().device_count) {
    throw std::out_of_range("device " + std::to_string(device) + " does not exist");
  }
  Registry& r = registry();
  auto& slot = r.pools[static_cast<std::size_t>(device)];
  if (DevicePool* p = slot.load(std::memory_order_acquire)) return *p;
  std::lock_guard lock(r.config_mutex);
  if (DevicePool* p = slot.load(std::memory_order_acquire)) return *p;
  std::unique_ptr<DevicePool> pool;
  std::string why;
  switch (current_tier()) {
    case Tier::a:
    case Tier::b:
      // A device without VMM in a VMM-tier process gets the fallback pool; its stats say so.
      if (device_has_vmm(device, &why)) {
        pool = make_vmm_pool(device, r.reserve);
        why = current_tier() == Tier::a ? "VIBESPATIAL_GPU_POOL_ONLY is set: the VMM pool without "
                                          "OOM recovery (tier A)"
                                        : "the device supports virtual memory management: the "
                                          "VMM pool with OOM recovery (tier B)";
      } else {
        pool = make_fallback_pool(device);
        why += ": a caching pool over cuMemAlloc (fallback)";
      }
      break;
    case Tier::c:
      pool = make_managed_pool(device);
      why = "VIBESPATIAL_GPU_MANAGED_MEMORY is set: managed memory (tier C)";
      break;
    default:
      pool = make_fallback_pool(device);
      why = "a caching pool over cuMemAlloc (fallback)";
      break;
  }
  set_reason(device, std::move(why));
  if (driver_state().device_count == 1) {
    if (auto* vmm = dynamic_cast<vmm::VmmPool*>(pool.get())) {
      g_direct_pool.store(vmm, std::memory_order_release);
    }
  }
  slot.store(pool.get(), std::memory_order_release);
  return *pool.release();
}

std::size_t pool_free_bytes(int device) noexcept {
  if (device < 0 || device >= kMaxDevices) return 0;
  DevicePool* p = registry().pools[static_cast<std::size_t>(device)].load();
  if (p == nullptr) return 0;
  MemoryPoolStats s;
  p->fill_stats(s);
  return s.pool_free_bytes;
}

void reset_memory_pools() noexcept {
  Registry& r = registry();
  std::lock_guard lock(r.config_mutex);
  g_direct_pool.store(nullptr, std::memory_order_release);
  for (std::size_t d = 0; d < r.pools.size(); ++d) {
    DevicePool* p = r.pools[d].exchange(nullptr);
    if (p != nullptr) {
      p->teardown();
      delete p;
    }
    r.recoveries[d] = 0;
    r.reasons[d].store(nullptr);
    r.vmm_checked[d] = 0;
    r.vmm_failure[d].clear();
  }
  r.reason_text.clear();
  r.tier.store(static_cast<int>(Tier::none), std::memory_order_release);
}

}  // namespace vibespatial::raster::detail

namespace vibespatial::raster {

using detail::registry;
using detail::Tier;

void free_pool_memory() {
  if (detail::in_forked_child()) [[unlikely]]
    detail::throw_forked_child(__func__);
  if (detail::current_tier() == Tier::none) return;
  std::optional<CudaError> first;
  for (auto& slot : registry().pools) {
    detail::DevicePool* p = slot.load(std::memory_order_acquire);
    if (p == nullptr) continue;
    try {
      p->trim();
    } catch (const CudaError& e) {
      if (!first) first = e;
    }
  }
  if (first) throw *first;
}

MemoryPoolStats memory_pool_stats(int device) noexcept {
  MemoryPoolStats s;
  s.device = device;
  // A forked child reports no pool: the parent's may be mid-change, behind a lock never released.
  if (detail::in_forked_child()) return s;
  const std::string tier = detail::configured_tier();
  // Once configured, the driver is loaded and knows its devices; before, only the pool's limits.
  if (device < 0 || device >= static_cast<int>(registry().pools.size()) ||
      (!tier.empty() && device >= detail::driver_state().device_count)) {
    s.no_such_device = true;
    return s;
  }
  s.tier = tier;
  s.configured = !s.tier.empty();
  if (!s.configured) return s;
  if (const std::string* why =
          registry().reasons[static_cast<std::size_t>(device)].load(std::memory_order_acquire)) {
    s.tier_reason = *why;
  }
  detail::DevicePool* p = registry().pools[static_cast<std::size_t>(device)].load();
  if (p == nullptr) {  // configured, but nothing allocated on this device yet
    const Tier t = detail::current_tier();
    if (t == Tier::fallback) {
      s.used_bytes = s.free_bytes = s.total_bytes = 0;
    } else {
      s.current_bytes = s.current_count = s.peak_bytes = s.peak_count = s.total_bytes =
          s.total_count = 0;
      if (t != Tier::c) s.pool_size = 0;
    }
    return s;
  }
  p->fill_stats(s);
  try {
    s.owners = detail::owner_usage(device);
  } catch (...) {
    s.owners.clear();  // no host memory: the statistics without the owners
  }
  if (s.used_bytes) s.tier = "fallback";  // a non-VMM device in a VMM-tier process
  s.oom_recoveries = registry().recoveries[static_cast<std::size_t>(device)].load();
  return s;
}

MemoryPoolStats memory_pool_stats() noexcept {
  if (detail::in_forked_child()) return MemoryPoolStats{};
  int device = 0;
  try {
    if (detail::current_tier() != Tier::none) device = detail::current_device();
  } catch (...) {
    device = 0;
  }
  return memory_pool_stats(device);
}

void* device_allocate(std::size_t bytes, CUstream stream) {
  // The direct path (g_direct_pool): one pointer, one thread-local flag, then the pool.
  detail::vmm::VmmPool* direct = detail::g_direct_pool.load(std::memory_order_acquire);
  // The recovery chain runs after the DeviceFull handler has ended, not inside it: OOM handlers
  // may call code that unwinds the thread by a foreign exception (CPython ends a thread that
  // asks for the GIL while the interpreter exits), and a C++ runtime terminates the process when
  // it meets one while another exception is being handled.
  std::optional<detail::DeviceFull> full;
  if (direct != nullptr && detail::t_context_bound && bytes != 0) [[likely]] {
    try {
      return direct->allocate(bytes, stream);  // records its alloc event while recording
    } catch (const detail::DeviceFull& f) {
      full = f;
    }
    return detail::allocate_after_full(*direct, bytes, stream, *full);
  }
  if (detail::in_forked_child()) [[unlikely]]
    detail::throw_forked_child(__func__);
  if (bytes == 0) return nullptr;
  if (detail::current_tier() == Tier::none) configure_memory_pool();
  detail::DevicePool& pool = detail::pool_for_device(detail::current_device());
  void* p = nullptr;
  try {
    p = pool.allocate(bytes, stream);
  } catch (const detail::DeviceFull& f) {
    full = f;
  }
  if (full) p = detail::allocate_after_full(pool, bytes, stream, *full);
  return p;
}

void forget_stream(CUstream stream) {
  if (detail::in_forked_child()) [[unlikely]]
    detail::throw_forked_child(__func__);
  if (stream == nullptr || stream == CU_STREAM_LEGACY) return;  // lives as long as the context
  if (detail::current_tier() == Tier::none) return;             // nothing was ever freed on it
  std::optional<CudaError> first;
  for (auto& slot : registry().pools) {
    detail::DevicePool* p = slot.load(std::memory_order_acquire);
    if (p == nullptr) continue;
    try {
      p->forget(stream);
    } catch (const CudaError& e) {
      if (!first) first = e;
    }
  }
  if (first) throw *first;
}

void device_deallocate(void* ptr, std::size_t bytes, CUstream stream) {
  detail::vmm::VmmPool* direct = detail::g_direct_pool.load(std::memory_order_acquire);
  if (direct != nullptr && ptr != nullptr) [[likely]] {
    // The only pool, so the pointer's if anyone's; it records the free while recording.
    direct->deallocate(ptr, bytes, stream);
    return;
  }
  if (detail::in_forked_child()) [[unlikely]]
    detail::throw_forked_child(__func__);
  if (ptr == nullptr && bytes == 0) return;  // what device_allocate(0) returned
  VSR_EXPECTS(ptr != nullptr,
              "device_deallocate: null pointer with a size of " + std::to_string(bytes) + " bytes");
  VSR_EXPECTS(detail::current_tier() != Tier::none,
              "device_deallocate: the pool is not configured, so it never allocated this pointer");
  detail::pool_of(ptr).deallocate(ptr, bytes, stream);
}

}  // namespace vibespatial::raster
