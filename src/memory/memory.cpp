// SPDX-License-Identifier: Apache-2.0
// memory.hpp: tier selection, the per-device pool registry, the OOM recovery chain.
#include "memory/pool_registry.hpp"

#include <vibespatial/raster/memory.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>
#include <map>
#include <mutex>
#include <stdexcept>

namespace vibespatial::raster::detail {
namespace {

constexpr int kMaxDevices = 64;
constexpr int kRecoveryRounds = 3;

enum class Tier { none = -1, a = 0, b = 1, c = 2, fallback = 3 };

const char* tier_name(Tier t) {
  switch (t) {
    case Tier::a:
      return "A";
    case Tier::b:
      return "B";
    case Tier::c:
      return "C";
    case Tier::fallback:
      return "fallback";
    default:
      return "";
  }
}

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return false;
  std::string s(v);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s == "1" || s == "true" || s == "yes" || s == "on";
}

struct Registry {
  std::mutex config_mutex;
  std::atomic<int> tier{static_cast<int>(Tier::none)};
  std::array<std::atomic<DevicePool*>, kMaxDevices> pools{};
  std::array<std::atomic<std::size_t>, kMaxDevices> recoveries{};
  std::mutex handler_mutex;
  std::map<std::uint64_t, std::shared_ptr<OomHandler>> handlers;
  std::uint64_t next_handler = 1;
};

// Leaked on purpose: pools outlive static destruction, so nothing calls the driver after main.
Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

Tier current_tier() {
  return static_cast<Tier>(registry().tier.load(std::memory_order_acquire));
}

bool device_attribute(int device, CUdevice_attribute attribute) {
  const DriverApi& api = driver();
  CUdevice dev = 0;
  VSR_CU_TRY(api.cuDeviceGet(&dev, device));
  int value = 0;
  VSR_CU_TRY(api.cuDeviceGetAttribute(&value, attribute, dev));
  return value != 0;
}

bool device_has_vmm(int device) {
  return driver().has_vmm() &&
         device_attribute(device, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED);
}

int current_device() {
  if (driver_state().device_count == 1) return 0;  // the fast path: no driver call
  return bind_current_device();
}

DevicePool& pool_of(const void* ptr) {
  Registry& r = registry();
  if (driver_state().device_count == 1) {
    if (DevicePool* p = r.pools[0].load(std::memory_order_acquire)) return *p;
  } else {
    for (auto& slot : r.pools) {
      DevicePool* p = slot.load(std::memory_order_acquire);
      if (p != nullptr && p->owns(ptr)) return *p;
    }
  }
  throw std::invalid_argument("device_deallocate: pointer was not allocated by the pool");
}

std::string driver_memory(int device) {
  try {
    ScopedDeviceContext scope(device);
    std::size_t free_b = 0, total_b = 0;
    if (driver().cuMemGetInfo(&free_b, &total_b) == CUDA_SUCCESS) {
      return "the driver reports " + format_bytes(free_b) + " free of " + format_bytes(total_b);
    }
  } catch (const std::exception&) {
  }
  return "the driver's free memory is unknown";
}

[[noreturn]] void throw_oom(DevicePool& pool, std::size_t bytes, const std::string& note) {
  throw OutOfMemoryError(
      bytes, "device_allocate: out of memory on device " + std::to_string(pool.device()) +
                 " (tier " + tier_name(current_tier()) + "): requested " + format_bytes(bytes) +
                 "; " + pool.describe() + "; " + driver_memory(pool.device()) + note);
}

}  // namespace

std::string configured_tier() noexcept {
  return tier_name(current_tier());
}

DevicePool& pool_for_device(int device) {
  configure_memory_pool();
  if (device < 0 || device >= kMaxDevices || device >= driver_state().device_count) {
    throw std::out_of_range("device " + std::to_string(device) + " does not exist");
  }
  Registry& r = registry();
  auto& slot = r.pools[static_cast<std::size_t>(device)];
  if (DevicePool* p = slot.load(std::memory_order_acquire)) return *p;
  std::lock_guard lock(r.config_mutex);
  if (DevicePool* p = slot.load(std::memory_order_acquire)) return *p;
  std::unique_ptr<DevicePool> pool;
  switch (current_tier()) {
    case Tier::a:
    case Tier::b:
      // A device without VMM in a VMM-tier process gets the fallback pool; its stats say so.
      pool = device_has_vmm(device) ? make_vmm_pool(device, current_tier() == Tier::b)
                                    : make_fallback_pool(device);
      break;
    case Tier::c:
      pool = make_managed_pool(device);
      break;
    default:
      pool = make_fallback_pool(device);
      break;
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
  for (std::size_t d = 0; d < r.pools.size(); ++d) {
    DevicePool* p = r.pools[d].exchange(nullptr);
    if (p != nullptr) {
      p->teardown();
      delete p;
    }
    r.recoveries[d] = 0;
  }
  r.tier.store(static_cast<int>(Tier::none), std::memory_order_release);
}

}  // namespace vibespatial::raster::detail

namespace vibespatial::raster {

using detail::registry;
using detail::Tier;

std::string configure_memory_pool() {
  detail::Registry& r = registry();
  Tier t = detail::current_tier();
  if (t != Tier::none) return detail::tier_name(t);
  std::lock_guard lock(r.config_mutex);
  t = detail::current_tier();
  if (t != Tier::none) return detail::tier_name(t);

  detail::driver();  // throws DriverUnavailableError, saying why
  const int device = detail::bind_current_device();
  if (detail::env_flag("VIBESPATIAL_GPU_MANAGED_MEMORY")) {
    if (!detail::driver().cuMemAllocManaged ||
        !detail::device_attribute(device, CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY)) {
      throw CudaError(CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED",
                      "VIBESPATIAL_GPU_MANAGED_MEMORY=1 asks for tier C, but device " +
                          std::to_string(device) + " does not support managed memory");
    }
    t = Tier::c;
  } else if (detail::env_flag("VIBESPATIAL_GPU_POOL_ONLY")) {
    if (!detail::device_has_vmm(device)) {
      throw CudaError(CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED",
                      "VIBESPATIAL_GPU_POOL_ONLY=1 asks for tier A, but device " +
                          std::to_string(device) + " does not support virtual memory management");
    }
    t = Tier::a;
  } else {
    t = detail::device_has_vmm(device) ? Tier::b : Tier::fallback;
  }
  r.tier.store(static_cast<int>(t), std::memory_order_release);
  return detail::tier_name(t);
}

void free_pool_memory() {
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
  s.tier = detail::configured_tier();
  s.configured = !s.tier.empty();
  if (!s.configured || device < 0 || device >= static_cast<int>(registry().pools.size())) return s;
  detail::DevicePool* p = registry().pools[static_cast<std::size_t>(device)].load();
  if (p == nullptr) {  // configured, but nothing allocated on this device yet
    if (s.tier == "fallback") {
      s.used_bytes = s.free_bytes = s.total_bytes = 0;
    } else {
      s.current_bytes = s.current_count = s.peak_bytes = s.peak_count = s.total_bytes =
          s.total_count = 0;
      if (s.tier != "C") s.pool_size = 0;
    }
    return s;
  }
  p->fill_stats(s);
  if (s.used_bytes) s.tier = "fallback";  // a non-VMM device in a VMM-tier process
  s.oom_recoveries = registry().recoveries[static_cast<std::size_t>(device)].load();
  return s;
}

MemoryPoolStats memory_pool_stats() noexcept {
  int device = 0;
  try {
    if (detail::current_tier() != Tier::none) device = detail::current_device();
  } catch (...) {
    device = 0;
  }
  return memory_pool_stats(device);
}

void* device_allocate(std::size_t bytes, CUstream stream) {
  if (bytes == 0) return nullptr;
  if (detail::current_tier() == Tier::none) configure_memory_pool();
  detail::DevicePool& pool = detail::pool_for_device(detail::current_device());
  try {
    return pool.allocate(bytes, stream);
  } catch (const detail::DeviceFull& full) {
    if (full.impossible) {
      detail::throw_oom(pool, bytes, "; the request is larger than the device's memory");
    }
    if (detail::current_tier() != Tier::b) detail::throw_oom(pool, bytes, "");
  }
  // Tier B's recovery chain. The pool holds none of its locks here, so handlers may free memory
  // through it.
  detail::Registry& r = registry();
  std::size_t handlers_run = 0;
  for (int round = 1; round <= detail::kRecoveryRounds; ++round) {
    std::vector<std::shared_ptr<OomHandler>> handlers;
    {
      std::lock_guard lock(r.handler_mutex);
      for (auto& [id, h] : r.handlers) handlers.push_back(h);
    }
    for (const auto& h : handlers) {
      ++handlers_run;
      (*h)(bytes);
    }
    try {
      pool.trim();  // every free page back to the driver, after its freeing work completes
    } catch (const CudaError&) {
      // Whatever could not be released stays in the pool; the retry decides.
    }
    try {
      void* p = pool.allocate(bytes, stream);
      r.recoveries[static_cast<std::size_t>(pool.device())].fetch_add(1);
      return p;
    } catch (const detail::DeviceFull&) {
    }
  }
  detail::throw_oom(pool, bytes,
                    "; the recovery chain ran " + std::to_string(detail::kRecoveryRounds) +
                        " rounds (" + std::to_string(handlers_run) +
                        " OOM handler calls, free pages released, retried)");
}

void device_deallocate(void* ptr, std::size_t bytes, CUstream stream) {
  if (ptr == nullptr) {
    if (bytes == 0) return;
    throw std::invalid_argument("device_deallocate: null pointer with a size of " +
                                std::to_string(bytes) + " bytes");
  }
  if (detail::current_tier() == Tier::none) {
    throw std::invalid_argument(
        "device_deallocate: the pool is not configured, so it never "
        "allocated this pointer");
  }
  detail::pool_of(ptr).deallocate(ptr, bytes, stream);
}

std::uint64_t add_oom_handler(OomHandler handler) {
  if (!handler) throw std::invalid_argument("add_oom_handler: empty handler");
  detail::Registry& r = registry();
  std::lock_guard lock(r.handler_mutex);
  const std::uint64_t id = r.next_handler++;
  r.handlers.emplace(id, std::make_shared<OomHandler>(std::move(handler)));
  return id;
}

void remove_oom_handler(std::uint64_t id) {
  detail::Registry& r = registry();
  std::lock_guard lock(r.handler_mutex);
  r.handlers.erase(id);
}

}  // namespace vibespatial::raster
