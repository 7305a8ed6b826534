// SPDX-License-Identifier: Apache-2.0
// memory.hpp: tier selection, the per-device pool registry, the OOM recovery chain.
#include "common/expects.hpp"
#include "memory/pool_registry.hpp"
#include "memory/vmm_pool_impl.hpp"

#include <vibespatial/raster/memory.hpp>

#include <pthread.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string_view>

namespace vibespatial::raster::detail {
namespace {

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

// `value` with every byte outside printable ASCII, and the quote and backslash, written as \xHH.
std::string escaped(const char* value) {
  std::string out;
  for (const char* c = value; *c != '\0'; ++c) {
    const auto b = static_cast<unsigned char>(*c);
    if (b >= 0x20 && b < 0x7f && b != '"' && b != '\\') {
      out.push_back(*c);
    } else {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02x", b);
      out += hex;
    }
  }
  return out;
}

// A boolean tier variable: unset, or 0/false/no/off, is false; 1/true/yes/on is true (any case).
// Anything else, the empty string included, is an error rather than a silent "off".
bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return false;
  std::string s(v);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off") return false;
  throw std::invalid_argument(std::string("configure_memory_pool: ") + name + "=\"" + escaped(v) +
                              "\" is not a boolean: set 1, true, yes or on to enable it, 0, false, "
                              "no or off to disable it (any case), or leave it unset");
}

// VIBESPATIAL_GPU_POOL_RESERVE: the VMM pool's slack, a fraction from 0 to 1 written as a
// decimal number ("0.1"); unset or "auto": kDefaultReserve (adaptive). Anything else is an error.
double env_reserve() {
  const char* v = std::getenv("VIBESPATIAL_GPU_POOL_RESERVE");
  if (v == nullptr || std::string_view(v) == "auto") return kDefaultReserve;
  double value = -1;
  std::size_t used = 0;
  try {
    value = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string_view text(v);
  const bool plain = !text.empty() && text.find_first_not_of("0123456789.") == std::string::npos;
  if (!plain || used != text.size() || !(value >= 0 && value <= 1)) {
    throw std::invalid_argument(
        "configure_memory_pool: VIBESPATIAL_GPU_POOL_RESERVE=\"" + escaped(v) +
        "\" is not a fraction from 0 to 1: set a decimal number such as 0.1 (10% more pages than "
        "the peak of live large blocks), 0 (no slack), or auto or leave it unset (the adaptive "
        "default)");
  }
  return value;
}

// The VMM pool of the only device of a one-device process (tiers A and B), or null: once the
// calling thread's context is bound, device_allocate and device_deallocate call it directly, with
// no tier or device lookup and no virtual call (VmmPool is final). Set with the pool; cleared by
// reset_memory_pools() and in a forked child, whose calls then take the checked path and throw.
std::atomic<vmm::VmmPool*> g_direct_pool{nullptr};

// Whether this process had used the pool when it forked (see g_forked_child). Set before any
// pool lock is first taken, so a fork while a lock is held always sees it.
std::atomic<bool> g_pool_used{false};

void note_pool_use() noexcept {
  if (!g_pool_used.load(std::memory_order_relaxed)) g_pool_used.store(true);
}

void on_fork_child() noexcept {
  if (g_pool_used.load(std::memory_order_relaxed)) {
    g_direct_pool.store(nullptr, std::memory_order_relaxed);
    g_forked_child.store(true, std::memory_order_relaxed);
  }
}

// Registered when the library is loaded, so no fork can come before it. glibc removes the
// handler if the library is unloaded (dlclose).
[[maybe_unused]] const int g_atfork_registered = pthread_atfork(nullptr, nullptr, on_fork_child);

// Set while this thread runs OOM handlers: an allocation made by a handler that finds the
// device full fails at once instead of running the chain again (which would call the handler
// again, without bound).
thread_local bool t_in_oom_handler = false;

// Whether this thread's context has been checked (and device 0's primary context bound if it had
// none), in a one-device process where current_device() needs no driver call otherwise.
thread_local bool t_context_bound = false;

struct Registry {
  std::mutex config_mutex;
  std::atomic<int> tier{static_cast<int>(Tier::none)};
  double reserve = kDefaultReserve;  // VIBESPATIAL_GPU_POOL_RESERVE, set with the tier
  std::array<std::atomic<DevicePool*>, kMaxDevices> pools{};
  // Why each device has the pool it has (MemoryPoolStats::tier_reason): set once under
  // config_mutex before the tier or the device's pool is published, read after; the strings
  // live in `reason_text` until reset_memory_pools().
  std::array<std::atomic<const std::string*>, kMaxDevices> reasons{};
  std::list<std::string> reason_text;
  // The VMM self-test of each device, run once per configuration (under config_mutex): 0 not
  // run, 1 passed, 2 failed (the text in vmm_failure).
  std::array<int, kMaxDevices> vmm_checked{};
  std::array<std::string, kMaxDevices> vmm_failure;
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

// Whether `device` can use the VMM pool; if not, `why` says so. The attribute is not enough
// (§3.1: some drivers claim VMM and fail the calls), so a one-page self-test runs once per device
// and configuration. config_mutex held.
bool device_has_vmm(int device, std::string* why) {
  const std::string name = "device " + std::to_string(device);
  if (!driver().has_vmm()) {
    if (why) *why = "the driver lacks the virtual memory management entry points";
    return false;
  }
  if (!device_attribute(device, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)) {
    if (why) {
      *why = name +
             " does not support virtual memory management "
             "(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0)";
    }
    return false;
  }
  Registry& r = registry();
  const auto d = static_cast<std::size_t>(device);
  if (device >= 0 && device < kMaxDevices && r.vmm_checked[d] == 0) {
    r.vmm_failure[d] = vmm_self_test(device);
    r.vmm_checked[d] = r.vmm_failure[d].empty() ? 1 : 2;
  }
  if (device >= 0 && device < kMaxDevices && r.vmm_checked[d] == 2) {
    if (why) {
      *why = name + " claims virtual memory management support, but its VMM self-test failed (" +
             r.vmm_failure[d] + ")";
    }
    return false;
  }
  return true;
}

// Records why `device` has its tier (once). config_mutex held.
void set_reason(int device, std::string text) {
  if (device < 0 || device >= kMaxDevices) return;
  Registry& r = registry();
  auto& slot = r.reasons[static_cast<std::size_t>(device)];
  if (slot.load(std::memory_order_relaxed) != nullptr) return;
  r.reason_text.push_back(std::move(text));
  slot.store(&r.reason_text.back(), std::memory_order_release);
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

std::atomic<bool> g_forked_child{false};

void throw_forked_child(const char* function) {
  throw DriverUnavailableError(
      CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED",
      std::string(function) +
          ": this process was forked from one that had used the device memory pool, and CUDA "
          "cannot be used after fork() without exec(): use the pool in the parent, or start "
          "worker processes with exec (Python multiprocessing: the 'spawn' or 'forkserver' start "
          "method)");
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

// After `pool` found the device full for a request: OutOfMemoryError, or in tier B the recovery
// chain (handlers, trim, retry) and the block it finally got.
void* allocate_after_full(DevicePool& pool, std::size_t bytes, CUstream stream,
                          const DeviceFull& full) {
  if (full.impossible) throw_oom(pool, bytes, "; the request is larger than the device's memory");
  if (current_tier() != Tier::b) throw_oom(pool, bytes, "");
  if (t_in_oom_handler) {
    throw_oom(pool, bytes,
              "; called from inside an OOM handler, where the recovery chain does not run again");
  }
  // Tier B's recovery chain. The pool holds none of its locks here, so handlers may free memory
  // through it.
  Registry& r = registry();
  // Slack and every other free page go back first: no handler runs while the pool holds free
  // memory that releasing and retrying could serve the request from.
  try {
    pool.trim();  // every free page back to the driver, after its freeing work completes
  } catch (const CudaError&) {
    // Whatever could not be released stays in the pool; the retry decides.
  }
  try {
    void* p = pool.allocate(bytes, stream);
    r.recoveries[static_cast<std::size_t>(pool.device())].fetch_add(1);
    return p;
  } catch (const DeviceFull&) {
  }
  std::size_t handlers_run = 0;
  for (int round = 1; round <= kRecoveryRounds; ++round) {
    try {
      pool.trim();  // what the failed retry left (pages it made before finding too few)
    } catch (const CudaError&) {
    }
    std::vector<std::shared_ptr<OomHandler>> handlers;
    {
      std::lock_guard lock(r.handler_mutex);
      for (auto& [id, h] : r.handlers) handlers.push_back(h);
    }
    {
      struct InHandlers {
        bool outer = t_in_oom_handler;
        InHandlers() { t_in_oom_handler = true; }
        ~InHandlers() { t_in_oom_handler = outer; }
      } in_handlers;
      for (const auto& h : handlers) {
        ++handlers_run;
        (*h)(bytes);
      }
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
    } catch (const DeviceFull&) {
    }
  }
  throw_oom(pool, bytes,
            "; the recovery chain ran " + std::to_string(kRecoveryRounds) + " rounds (" +
                std::to_string(handlers_run) + " OOM handler calls, free pages released, retried)");
}

}  // namespace vibespatial::raster::detail

namespace vibespatial::raster {

using detail::registry;
using detail::Tier;

std::string configure_memory_pool() {
  if (detail::in_forked_child()) [[unlikely]]
    detail::throw_forked_child(__func__);
  detail::Registry& r = registry();
  Tier t = detail::current_tier();
  if (t != Tier::none) return detail::tier_name(t);
  detail::note_pool_use();
  std::lock_guard lock(r.config_mutex);
  t = detail::current_tier();
  if (t != Tier::none) return detail::tier_name(t);

  // Both variables are checked, whichever wins: a value that means nothing is an error.
  const bool managed = detail::env_flag("VIBESPATIAL_GPU_MANAGED_MEMORY");
  const bool pool_only = detail::env_flag("VIBESPATIAL_GPU_POOL_ONLY");
  const double reserve = detail::env_reserve();
  detail::driver();  // throws DriverUnavailableError, saying why
  const int device = detail::bind_current_device();
  if (managed) {
    if (!detail::driver().cuMemAllocManaged ||
        !detail::device_attribute(device, CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY)) {
      throw CudaError(CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED",
                      "VIBESPATIAL_GPU_MANAGED_MEMORY=1 asks for tier C, but device " +
                          std::to_string(device) + " does not support managed memory");
    }
    if (pool_only) {
      std::fprintf(stderr,
                   "vibespatial-raster: warning: VIBESPATIAL_GPU_MANAGED_MEMORY=\"%s\" and "
                   "VIBESPATIAL_GPU_POOL_ONLY=\"%s\" are both set: tier C (managed memory) wins, "
                   "VIBESPATIAL_GPU_POOL_ONLY is ignored\n",
                   detail::escaped(std::getenv("VIBESPATIAL_GPU_MANAGED_MEMORY")).c_str(),
                   detail::escaped(std::getenv("VIBESPATIAL_GPU_POOL_ONLY")).c_str());
    }
    t = Tier::c;
    detail::set_reason(device, pool_only ? "VIBESPATIAL_GPU_MANAGED_MEMORY is set: managed memory "
                                           "(tier C; VIBESPATIAL_GPU_POOL_ONLY is ignored)"
                                         : "VIBESPATIAL_GPU_MANAGED_MEMORY is set: managed memory "
                                           "(tier C)");
  } else if (pool_only) {
    std::string why;
    if (!detail::device_has_vmm(device, &why)) {
      if (device >= 0 && device < detail::kMaxDevices) {
        r.vmm_checked[static_cast<std::size_t>(device)] =
            0;  // nothing cached: a later call retries
      }
      throw CudaError(CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED",
                      "VIBESPATIAL_GPU_POOL_ONLY=1 asks for tier A, but " + why);
    }
    t = Tier::a;
    detail::set_reason(
        device, "VIBESPATIAL_GPU_POOL_ONLY is set: the VMM pool without OOM recovery (tier A)");
  } else {
    std::string why;
    t = detail::device_has_vmm(device, &why) ? Tier::b : Tier::fallback;
    detail::set_reason(device, t == Tier::fallback
                                   ? why + ": a caching pool over cuMemAlloc (fallback)"
                                   : "the device supports virtual memory management: the VMM pool "
                                     "with OOM recovery (tier B)");
  }
  r.reserve = reserve;
  r.tier.store(static_cast<int>(t), std::memory_order_release);
  return detail::tier_name(t);
}

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
      return direct->allocate(bytes, stream);
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
  try {
    return pool.allocate(bytes, stream);
  } catch (const detail::DeviceFull& f) {
    full = f;
  }
  return detail::allocate_after_full(pool, bytes, stream, *full);
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
    direct->deallocate(ptr, bytes, stream);  // the only pool, so the pointer's if anyone's
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

std::uint64_t add_oom_handler(OomHandler handler) {
  if (detail::in_forked_child()) [[unlikely]]
    detail::throw_forked_child(__func__);
  VSR_EXPECTS(static_cast<bool>(handler), "add_oom_handler: empty handler");
  detail::note_pool_use();
  detail::Registry& r = registry();
  std::lock_guard lock(r.handler_mutex);
  const std::uint64_t id = r.next_handler++;
  r.handlers.emplace(id, std::make_shared<OomHandler>(std::move(handler)));
  return id;
}

void remove_oom_handler(std::uint64_t id) {
  if (detail::in_forked_child()) [[unlikely]]
    detail::throw_forked_child(__func__);
  detail::note_pool_use();
  detail::Registry& r = registry();
  std::lock_guard lock(r.handler_mutex);
  r.handlers.erase(id);
}

}  // namespace vibespatial::raster
