// SPDX-License-Identifier: Apache-2.0
#include "driver/cuda_driver.hpp"

#include <vibespatial/raster/driver.hpp>

#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace vibespatial::raster::detail {
namespace {

constexpr const char* kDefaultDriver = "libcuda.so.1";

// Resolves `symbol` at ABI `version` (cuGetProcAddress_v2 returns the newest ABI introduced at or
// before `version`, docs/cuda-driver-rules.md §2.2). Null when the driver lacks it.
template <class Pfn>
bool resolve(PFN_cuGetProcAddress_v12000 get_proc, const char* symbol, int version, Pfn& out) {
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  const CUresult r = get_proc(symbol, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, &status);
  if (r != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS || fn == nullptr) {
    out = nullptr;
    return false;
  }
  out = reinterpret_cast<Pfn>(fn);
  return true;
}

// Resolves every VSR_DRIVER_ENTRIES row; false (naming each) when a required one is missing.
bool resolve_all(PFN_cuGetProcAddress_v12000 gp, DriverApi& a, std::string& missing) {
  bool ok = true;
#define VSR_DRIVER_RESOLVE(name, version, kind)                                         \
  if (!resolve(gp, #name, version, a.name) && EntryKind::kind == EntryKind::required) { \
    ok = false;                                                                         \
    missing += missing.empty() ? #name : ", " #name;                                    \
  }
  VSR_DRIVER_ENTRIES(VSR_DRIVER_RESOLVE)
#undef VSR_DRIVER_RESOLVE
  return ok;
}

// `text` with bytes outside printable ASCII written as \xHH, so a message stays valid UTF-8 and
// cannot carry terminal escapes.
std::string printable(std::string_view text) {
  std::string out;
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f && c != '\\') {
      out += c;
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 15];
    }
  }
  return out;
}

// The name of `result` through `api` when it can say, else from the few codes the seam itself
// reports. Takes the entry points explicitly: the loader calls it while it holds its lock and
// must not reach driver_state() again.
std::string result_name(const DriverApi& api, CUresult result) {
  if (api.cuGetErrorName != nullptr) {
    const char* name = nullptr;
    if (api.cuGetErrorName(result, &name) == CUDA_SUCCESS && name != nullptr) return name;
  }
  switch (result) {
    case CUDA_SUCCESS:
      return "CUDA_SUCCESS";
    case CUDA_ERROR_NO_DEVICE:
      return "CUDA_ERROR_NO_DEVICE";
    case CUDA_ERROR_NOT_FOUND:
      return "CUDA_ERROR_NOT_FOUND";
    default:
      return "CUresult(" + std::to_string(static_cast<int>(result)) + ")";
  }
}

// The library, once dlopen'ed: kept (with its entry points) for the life of the process and
// never dlopen'ed again. `unusable` says it lacks what the runtime needs, which no later call
// can change.
struct LoadedLibrary {
  bool loaded = false;
  bool unusable = false;
  std::string path;
  bool emulated = false;
  int driver_version = 0;
  int result = 0;      // why it is unusable
  std::string reason;  // ditto
  DriverApi api;
};

// dlopens the library named by VIBESPATIAL_CUDA_DRIVER (read at each try until one loads) and
// resolves its entry points. False, with `s` saying why, when nothing could be loaded.
bool load_library(LoadedLibrary& lib, DriverState& s) {
  const char* env = std::getenv("VIBESPATIAL_CUDA_DRIVER");
  const std::string path = (env != nullptr && env[0] != '\0') ? env : kDefaultDriver;
  // RTLD_LOCAL: the driver's symbols must not satisfy anyone else's references by accident.
  // The handle is never closed: entry points stay valid until process exit.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    s.library = path;
    s.result = CUDA_ERROR_NO_DEVICE;
    s.reason = "no CUDA driver: cannot load " + path + (why ? std::string(": ") + why : "") +
               " (install the NVIDIA driver, or set VIBESPATIAL_CUDA_DRIVER to the path of "
               "libvsr-cuda-emulator.so to run on the host emulator)";
    return false;
  }
  lib.loaded = true;
  lib.path = path;
  lib.emulated = dlsym(handle, "vsr_emu_query_outstanding") != nullptr;
  auto get_proc =
      reinterpret_cast<PFN_cuGetProcAddress_v12000>(dlsym(handle, "cuGetProcAddress_v2"));
  if (get_proc == nullptr) {
    lib.unusable = true;
    lib.result = CUDA_ERROR_NO_DEVICE;
    lib.reason = path +
                 " does not export cuGetProcAddress_v2: a CUDA 12.0 or newer driver "
                 "is required";
    return true;
  }
  std::string missing;
  if (!resolve_all(get_proc, lib.api, missing)) {
    lib.unusable = true;
    lib.result = CUDA_ERROR_NOT_FOUND;
    lib.reason = path + " lacks required entry points: " + missing;
    return true;
  }
  lib.api.cuDriverGetVersion(&lib.driver_version);
  return true;
}

// One start of the driver: the library loaded if it is not yet, then cuInit and the device
// count, which are called again at every start until they succeed (cuInit is idempotent).
void start(LoadedLibrary& lib, DriverState& s) {
  s.result = CUDA_ERROR_NO_DEVICE;
  if (!lib.loaded && !load_library(lib, s)) return;
  s.library = lib.path;
  s.emulated = lib.emulated;
  s.driver_version = lib.driver_version;
  s.api = lib.api;
  if (lib.unusable) {
    s.result = lib.result;
    s.reason = lib.reason;
    s.settled = true;
    return;
  }
  const CUresult init = s.api.cuInit(0);
  if (init != CUDA_SUCCESS) {
    s.result = init;
    s.reason = "cuInit failed with " + result_name(s.api, init) +
               (init == CUDA_ERROR_NO_DEVICE ? ": no CUDA-capable device is present" : "");
    if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES"); visible != nullptr) {
      s.reason += " (CUDA_VISIBLE_DEVICES is set to \"" + std::string(visible) +
                  "\", which may hide every device)";
    }
    return;
  }
  const CUresult count = s.api.cuDeviceGetCount(&s.device_count);
  if (count != CUDA_SUCCESS || s.device_count <= 0) {
    s.result = count != CUDA_SUCCESS ? count : CUDA_ERROR_NO_DEVICE;
    s.reason = count != CUDA_SUCCESS ? "cuDeviceGetCount failed with " + result_name(s.api, count)
                                     : std::string("the driver reports no CUDA device");
    s.device_count = 0;
    return;
  }
  s.result = CUDA_SUCCESS;
  s.available = true;
  s.settled = true;
}

bool same_api(const DriverApi& a, const DriverApi& b) {
  bool same = true;
#define VSR_DRIVER_SAME(name, version, kind) same = same && a.name == b.name;
  VSR_DRIVER_ENTRIES(VSR_DRIVER_SAME)
#undef VSR_DRIVER_SAME
  return same;
}

bool same_state(const DriverState& a, const DriverState& b) {
  return a.available == b.available && a.settled == b.settled && a.result == b.result &&
         a.library == b.library && a.reason == b.reason && a.emulated == b.emulated &&
         a.driver_version == b.driver_version && a.device_count == b.device_count &&
         same_api(a.api, b.api);
}

// The driver's states as the process saw them. A state, once published, is never changed or
// freed (callers hold `const DriverState&`); a failed one is replaced by the next start's. The
// loader is leaked on purpose: the pool's teardown at exit may still call the driver.
class Loader {
 public:
  static Loader& get() {
    static Loader* loader = new Loader();
    return *loader;
  }

  // The current state, starting the driver again first when it is not settled. A call that
  // waited while another thread started it takes that start's outcome: racing threads see one
  // state, and a failing driver is started once per batch of racers, not once per racer.
  const DriverState& state() noexcept {
    const DriverState* s = current_.load(std::memory_order_acquire);
    if (s != nullptr && s->settled) return *s;
    const std::uint64_t seen = starts_.load(std::memory_order_acquire);
    std::lock_guard lock(mutex_);
    s = current_.load(std::memory_order_relaxed);
    if (s != nullptr && (s->settled || starts_.load(std::memory_order_relaxed) != seen)) {
      return *s;
    }
    s = publish(attempt());
    starts_.fetch_add(1, std::memory_order_release);
    current_.store(s, std::memory_order_release);
    return *s;
  }

  // The current state without a new start (the first call starts the driver): for naming an
  // error of a call that already ran, and for teardown.
  const DriverState& current() noexcept {
    const DriverState* s = current_.load(std::memory_order_acquire);
    return s != nullptr ? *s : state();
  }

 private:
  Loader() = default;

  // One start, as a new state (null when there is no memory for one). mutex_ held.
  std::unique_ptr<DriverState> attempt() noexcept {
    try {
      auto s = std::make_unique<DriverState>();
      try {
        start(library_, *s);
        // The reason quotes a path and the environment: keep it printable, valid UTF-8.
        s->reason = printable(s->reason);
      } catch (...) {
        *s = DriverState();
        s->result = CUDA_ERROR_UNKNOWN;
        s->reason = "unexpected failure while loading the CUDA driver";
      }
      return s;
    } catch (...) {
      return nullptr;
    }
  }

  // `s` as a published state; one equal to a state published before is that one, so a driver
  // failing the same way at every call costs no memory per call. Without memory for `s`, the
  // current state stays (a later call starts again). mutex_ held.
  const DriverState* publish(std::unique_ptr<DriverState> s) noexcept {
    if (s != nullptr) {
      for (const auto& p : published_) {
        if (same_state(*p, *s)) return p.get();
      }
      try {
        published_.push_back(std::move(s));
        return published_.back().get();
      } catch (...) {
      }
    }
    static const DriverState none;  // unavailable, no reason: only before any state exists
    const DriverState* c = current_.load(std::memory_order_relaxed);
    return c != nullptr ? c : &none;
  }

  std::mutex mutex_;
  LoadedLibrary library_;                                // mutex_
  std::vector<std::unique_ptr<DriverState>> published_;  // mutex_; never shrinks
  std::atomic<const DriverState*> current_{nullptr};
  std::atomic<std::uint64_t> starts_{0};
};

}  // namespace

bool DriverApi::has_vmm() const noexcept {
  bool all = true;
#define VSR_DRIVER_VMM(name, version, kind) \
  all = all && (EntryKind::kind != EntryKind::vmm || name != nullptr);
  VSR_DRIVER_ENTRIES(VSR_DRIVER_VMM)
#undef VSR_DRIVER_VMM
  return all;
}

const DriverState& driver_state() noexcept {
  return Loader::get().state();
}

const DriverApi& driver() {
  const DriverState& s = driver_state();
  if (!s.available) {
    throw DriverUnavailableError(s.result, result_name(s.api, static_cast<CUresult>(s.result)),
                                 s.reason);
  }
  return s.api;
}

std::string cu_result_name(CUresult result) {
  return result_name(Loader::get().current().api, result);
}

void throw_cuda_error(CUresult result, const char* expression, const char* file, int line) {
  std::string name = cu_result_name(result);
  std::string what = name + " from " + expression + " at " + file + ":" + std::to_string(line);
  const DriverState& s = Loader::get().current();
  if (s.api.cuGetErrorString != nullptr) {
    const char* text = nullptr;
    if (s.api.cuGetErrorString(result, &text) == CUDA_SUCCESS && text != nullptr) {
      what += " (" + std::string(text) + ")";
    }
  }
  throw CudaError(static_cast<int>(result), std::move(name), what);
}

CUcontext primary_context(int device) {
  const DriverApi& api = driver();
  static std::mutex mutex;
  static CUcontext contexts[64] = {};
  if (device < 0 || device >= driver_state().device_count || device >= 64) {
    throw CudaError(CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE",
                    "device ordinal " + std::to_string(device) + " is out of range");
  }
  std::lock_guard lock(mutex);
  if (contexts[device] == nullptr) {
    CUdevice dev = 0;
    VSR_CU_TRY(api.cuDeviceGet(&dev, device));
    CUcontext ctx = nullptr;
    VSR_CU_TRY(api.cuDevicePrimaryCtxRetain(&ctx, dev));
    contexts[device] = ctx;
  }
  return contexts[device];
}

int bind_current_device() {
  const DriverApi& api = driver();
  CUcontext current = nullptr;
  VSR_CU_TRY(api.cuCtxGetCurrent(&current));
  if (current == nullptr) {
    VSR_CU_TRY(api.cuCtxSetCurrent(primary_context(0)));
    return 0;
  }
  CUdevice dev = 0;
  VSR_CU_TRY(api.cuCtxGetDevice(&dev));
  return static_cast<int>(dev);
}

ScopedDeviceContext::ScopedDeviceContext(int device) {
  const DriverApi& api = driver();
  CUcontext target = primary_context(device);
  VSR_CU_TRY(api.cuCtxGetCurrent(&previous_));
  if (previous_ != target) {
    VSR_CU_TRY(api.cuCtxSetCurrent(target));
    changed_ = true;
  }
}

ScopedDeviceContext::~ScopedDeviceContext() {
  if (changed_) Loader::get().current().api.cuCtxSetCurrent(previous_);
}

}  // namespace vibespatial::raster::detail

namespace vibespatial::raster {

DriverInfo driver_info() noexcept {
  DriverInfo info;
  try {
    const detail::DriverState& s = detail::driver_state();
    info.available = s.available;
    info.library = s.library;
    info.reason = s.reason;
    info.emulated = s.emulated;
    info.driver_version = s.driver_version;
    if (!s.available) return info;
    const detail::DriverApi& api = s.api;
    for (int i = 0; i < s.device_count; ++i) {
      DeviceInfo d;
      d.ordinal = i;
      CUdevice dev = 0;
      if (api.cuDeviceGet(&dev, i) != CUDA_SUCCESS) continue;
      char name[256] = {};
      if (api.cuDeviceGetName(name, sizeof(name) - 1, dev) == CUDA_SUCCESS) d.name = name;
      auto attr = [&](CUdevice_attribute a) {
        int v = 0;
        return api.cuDeviceGetAttribute(&v, a, dev) == CUDA_SUCCESS ? v : 0;
      };
      d.compute_capability_major = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
      d.compute_capability_minor = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
      d.virtual_memory_management =
          api.has_vmm() && attr(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) != 0;
      d.managed_memory =
          api.cuMemAllocManaged != nullptr && attr(CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY) != 0;
      d.memory_pools =
          api.cuMemAllocAsync != nullptr && attr(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED) != 0;
      if (d.virtual_memory_management) {
        CUmemAllocationProp prop = {};
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = i;
        api.cuMemGetAllocationGranularity(&d.granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
        api.cuMemGetAllocationGranularity(&d.recommended_granularity, &prop,
                                          CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
      }
      try {
        detail::ScopedDeviceContext scope(i);
        api.cuMemGetInfo(&d.free_bytes, &d.total_bytes);
      } catch (const std::exception&) {
        // Memory figures stay 0: the device is listed, but its context could not be made.
      }
      info.devices.push_back(std::move(d));
    }
  } catch (...) {
    info.available = false;
    if (info.reason.empty()) info.reason = "unexpected failure while querying the CUDA driver";
  }
  return info;
}

}  // namespace vibespatial::raster
