// SPDX-License-Identifier: Apache-2.0
// The host CUDA driver emulator: devices, contexts, VMM, classic allocations and copies backed by
// host memory (streams and events: streams.cpp; configuration: options.cpp). Rules and error
// codes follow docs/cuda-driver-rules.md (cited as §n) and
// /work/shared/reference/cuda-vmm-semantics.md, whose numbering it keeps. The glossary and the
// locking rules are in emulator_state.hpp.
#include "emulator_state.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace vsr::emu {

thread_local CUctx_st* tl_current = nullptr;

namespace {
void print_report();
}  // namespace

State& st() {
  static State* state = [] {
    auto* s = new State;
    read_env(s->config);
    s->env_config = s->config;
    for (int i = 0; i < s->config.device_count; ++i) {
      auto d = std::make_unique<Device>();
      d->primary.device = i;
      s->devices.push_back(std::move(d));
    }
    s->physical_per_device.assign(static_cast<size_t>(s->config.device_count), 0);
    s->physical_bytes_per_device.assign(static_cast<size_t>(s->config.device_count), 0);
    if (s->config.report) std::atexit(print_report);
    return s;
  }();
  return *state;
}

// --- per-call helpers (called with the global mutex held) ---------------------------------

CUresult need_init(State& s) {
  return s.initialized ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

CUresult need_vmm(State& s) {
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  return s.config.vmm ? CUDA_SUCCESS : CUDA_ERROR_NOT_SUPPORTED;
}

CUresult need_device(State& s, CUdevice dev) {
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  return dev >= 0 && dev < s.config.device_count ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

// §1.2: the calling thread's current context; poisoned contexts report the sticky error.
CUresult need_context(State& s, CUctx_st** out) {
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (tl_current == nullptr || !tl_current->active) return CUDA_ERROR_INVALID_CONTEXT;
  if (tl_current->poisoned) return CUDA_ERROR_ILLEGAL_ADDRESS;
  *out = tl_current;
  return CUDA_SUCCESS;
}

namespace {

size_t device_free(State& s, int dev) {
  size_t used = s.devices[static_cast<size_t>(dev)]->charged + context_overhead(s.config);
  return used >= s.config.device_memory ? 0 : s.config.device_memory - used;
}

bool charge(State& s, int dev, size_t bytes) {
  if (bytes > device_free(s, dev)) return false;
  s.devices[static_cast<size_t>(dev)]->charged += bytes;
  return true;
}

void uncharge(State& s, int dev, size_t bytes) {
  s.devices[static_cast<size_t>(dev)]->charged -= bytes;
}

// §4: the backing goes when the last reference and the last mapping are gone.
void maybe_destroy_physical(State& s, const std::shared_ptr<Physical>& p) {
  if (p->refs != 0 || p->maps != 0 || p->fd < 0) return;
  close(p->fd);
  p->fd = -1;
  uncharge(s, p->device, p->size);
  s.live_physical--;
  s.live_physical_bytes -= p->size;
  s.physical_per_device[static_cast<size_t>(p->device)]--;
  s.physical_bytes_per_device[static_cast<size_t>(p->device)] -= p->size;
}

template <typename T>
typename std::map<uintptr_t, T>::iterator containing(std::map<uintptr_t, T>& m, uintptr_t p) {
  auto it = m.upper_bound(p);
  if (it == m.begin()) return m.end();
  --it;
  return p < it->first + it->second.size ? it : m.end();
}

std::map<uintptr_t, size_t>::iterator containing_reservation(State& s, uintptr_t p) {
  auto it = s.reservations.upper_bound(p);
  if (it == s.reservations.begin()) return s.reservations.end();
  --it;
  return p < it->first + it->second ? it : s.reservations.end();
}

// Calls f(mapping_iterator, first_byte, end_byte) for each mapping piece of [p, p+n); false if
// any byte of the range is not mapped.
template <typename F>
bool for_each_mapped(State& s, uintptr_t p, size_t n, F&& f) {
  uintptr_t end = p + n;
  if (end < p) return false;
  auto it = containing(s.mappings, p);
  uintptr_t cur = p;
  while (cur < end) {
    if (it == s.mappings.end() || it->first > cur || cur >= it->first + it->second.size) {
      return false;
    }
    uintptr_t piece_end = std::min<uintptr_t>(end, it->first + it->second.size);
    cur = piece_end;
    ++it;
  }
  it = containing(s.mappings, p);
  cur = p;
  while (cur < end) {
    uintptr_t piece_end = std::min<uintptr_t>(end, it->first + it->second.size);
    f(it, cur, piece_end);
    cur = piece_end;
    ++it;
  }
  return true;
}

// The verdict on a device range: usable, not a device range at all (INVALID_VALUE, §3.6 "invalid
// range"), or VMM address space the device may not touch (a fault: 700, §3.6 / invariant 6).
enum class RangeCheck { ok, invalid, fault };

// §3.6 / invariant 6: may a device access [p, p+n) (write or read)?
RangeCheck device_range_check(State& s, uintptr_t p, size_t n, int device, bool write) {
  if (n == 0) return RangeCheck::ok;
  if (p + n < p) return RangeCheck::invalid;
  auto lin = containing(s.linear, p);
  if (lin != s.linear.end()) {
    return p + n <= lin->first + lin->second.size ? RangeCheck::ok : RangeCheck::invalid;
  }
  auto host = containing(s.host, p);
  if (host != s.host.end()) {
    return p + n <= host->first + host->second.size ? RangeCheck::ok : RangeCheck::invalid;
  }
  if (containing_reservation(s, p) == s.reservations.end()) return RangeCheck::invalid;
  const auto ndev = static_cast<size_t>(s.config.device_count);
  bool ok = true;
  bool mapped = for_each_mapped(s, p, n, [&](auto it, uintptr_t a, uintptr_t b) {
    const Mapping& m = it->second;
    size_t first = (a - it->first) / m.granule;
    size_t last = (b - 1 - it->first) / m.granule;
    for (size_t g = first; g <= last; ++g) {
      unsigned char acc = m.access[g * ndev + static_cast<size_t>(device)];
      if (write ? acc != CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                : acc == CU_MEM_ACCESS_FLAGS_PROT_NONE) {
        ok = false;
      }
    }
  });
  return mapped && ok ? RangeCheck::ok : RangeCheck::fault;
}

// A device access fault: sticky 700 (poisoning the context) or, with STICKY=0, INVALID_VALUE.
CUresult fault(State& s, CUctx_st* ctx, bool async) {
  if (s.config.sticky) {
    ctx->poisoned = true;
    return CUDA_ERROR_ILLEGAL_ADDRESS;
  }
  if (async && ctx->pending_error == CUDA_SUCCESS) ctx->pending_error = CUDA_ERROR_INVALID_VALUE;
  return CUDA_ERROR_INVALID_VALUE;
}

// --- copies --------------------------------------------------------------------------------

enum class CopyKind { htod, dtoh, dtod, memset8, memset32 };

struct CopyOp {
  CopyKind kind;
  uintptr_t dst;
  uintptr_t src;
  size_t bytes;
  unsigned value;
};

// Validates the device side(s) of `op` for the device of `ctx` (global mutex held).
RangeCheck copy_ranges_check(State& s, const CopyOp& op, int device) {
  switch (op.kind) {
    case CopyKind::htod:
    case CopyKind::memset8:
    case CopyKind::memset32:
      return device_range_check(s, op.dst, op.bytes, device, true);
    case CopyKind::dtoh:
      return device_range_check(s, op.src, op.bytes, device, false);
    case CopyKind::dtod: {
      const RangeCheck a = device_range_check(s, op.src, op.bytes, device, false);
      const RangeCheck b = device_range_check(s, op.dst, op.bytes, device, true);
      return a == RangeCheck::ok ? b : a;
    }
  }
  return RangeCheck::invalid;
}

// INVALID_VALUE for a range that is no device memory; a fault for forbidden VMM memory.
CUresult range_error(State& s, CUctx_st* ctx, RangeCheck check, bool async) {
  if (check == RangeCheck::fault) return fault(s, ctx, async);
  if (async && ctx->pending_error == CUDA_SUCCESS) ctx->pending_error = CUDA_ERROR_INVALID_VALUE;
  return CUDA_ERROR_INVALID_VALUE;
}

// Executes `op`; the global mutex is held during the copy so that no unmap races it. Marks the
// task's pending access done (the unmap check then ignores it).
CUresult run_copy(CUctx_st* ctx, const CopyOp& op, bool async, PendingAccess* access) {
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (access != nullptr) access->done = true;
  if (ctx->poisoned) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (const RangeCheck c = copy_ranges_check(s, op, ctx->device); c != RangeCheck::ok) {
    return range_error(s, ctx, c, async);
  }
  auto* dst = reinterpret_cast<unsigned char*>(op.dst);
  const auto* src = reinterpret_cast<const unsigned char*>(op.src);
  switch (op.kind) {
    case CopyKind::htod:
    case CopyKind::dtoh:
    case CopyKind::dtod:
      std::memmove(dst, src, op.bytes);
      break;
    case CopyKind::memset8:
      std::memset(dst, static_cast<int>(op.value & 0xff), op.bytes);
      break;
    case CopyKind::memset32: {
      auto v = static_cast<uint32_t>(op.value);
      for (size_t i = 0; i < op.bytes; i += 4) std::memcpy(dst + i, &v, 4);
      break;
    }
  }
  return CUDA_SUCCESS;
}

// The device memory `op` touches, with the physical allocations mapped there now.
std::shared_ptr<PendingAccess> pending_access(State& s, const CopyOp& op) {
  auto access = std::make_shared<PendingAccess>();
  auto add = [&](uintptr_t p) {
    access->ranges.push_back({p, p + op.bytes});
    for_each_mapped(s, p, op.bytes, [&](auto it, uintptr_t, uintptr_t) {
      access->physical.push_back(it->second.physical->id);
    });
  };
  if (op.kind != CopyKind::dtoh) add(op.dst);
  if (op.kind == CopyKind::dtoh || op.kind == CopyKind::dtod) add(op.src);
  return access;
}

bool is_pinned_host(State& s, uintptr_t p) {
  return containing(s.host, p) != s.host.end();
}

// `sync_api`: the call is one of the non-Async forms, which the driver orders on the default
// stream with the host synchronisation of §3.6: HtoD from pageable memory returns once the source
// is staged (after the stream's earlier work), from pinned memory once done; DtoH returns once
// done; DtoD and memset return at once (memset into pinned memory once done).
CUresult copy_entry(const char* entry, CopyOp op, CUstream stream, bool ptds,
                    bool sync_api = false) {
  CUresult injected = begin_call(entry);
  if (injected != CUDA_SUCCESS) return injected;
  State& s = st();
  std::unique_lock lock(s.mutex);
  StreamRef ref;
  CUresult r = resolve_stream(s, stream, ptds, &ref);
  if (r != CUDA_SUCCESS) return r;
  if (op.bytes == 0) return CUDA_SUCCESS;
  if ((op.kind == CopyKind::htod && op.src == 0) || (op.kind == CopyKind::dtoh && op.dst == 0)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (op.kind == CopyKind::memset32 && op.dst % 4 != 0) return CUDA_ERROR_INVALID_VALUE;
  // Checked at enqueue so that the caller sees the fault at once; checked again when it runs.
  if (const RangeCheck c = copy_ranges_check(s, op, ref.ctx->device); c != RangeCheck::ok) {
    return range_error(s, ref.ctx, c, false);
  }
  SubmitOptions options;
  options.access = pending_access(s, op);
  std::shared_ptr<std::vector<unsigned char>> staged;
  if (sync_api) {
    switch (op.kind) {
      case CopyKind::htod:
        if (is_pinned_host(s, op.src)) {
          options.host_wait = true;
        } else {
          options.drain_first = true;
          const auto* src = reinterpret_cast<const unsigned char*>(op.src);
          staged = std::make_shared<std::vector<unsigned char>>(src, src + op.bytes);
          op.src = reinterpret_cast<uintptr_t>(staged->data());
        }
        break;
      case CopyKind::dtoh:
        options.host_wait = true;
        break;
      case CopyKind::dtod:
        break;
      case CopyKind::memset8:
      case CopyKind::memset32:
        options.host_wait = is_pinned_host(s, op.dst);
        break;
    }
  }
  CUctx_st* ctx = ref.ctx;
  return submit(
      lock, ref,
      [ctx, op, access = options.access, staged](bool queued) {
        return run_copy(ctx, op, queued, access.get());
      },
      options);
}

// --- linear allocations --------------------------------------------------------------------

void* map_anonymous(size_t bytes, size_t* mapped) {
  *mapped = round_up(bytes, page_size());
  void* p = mmap(nullptr, *mapped, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

CUresult alloc_linear(State& s, CUctx_st* ctx, size_t bytes, LinearKind kind, CUdeviceptr* out) {
  if (!charge(s, ctx->device, bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
  size_t mapped = 0;
  void* p = map_anonymous(bytes, &mapped);
  if (p == nullptr) {
    uncharge(s, ctx->device, bytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  static_assert(kLinearAlignment <= 4096);
  s.linear[reinterpret_cast<uintptr_t>(p)] = Linear{bytes, mapped, kind, ctx, ctx->device, false};
  *out = reinterpret_cast<CUdeviceptr>(p);
  return CUDA_SUCCESS;
}

void free_linear(State& s, std::map<uintptr_t, Linear>::iterator it) {
  uncharge(s, it->second.device, it->second.size);
  munmap(reinterpret_cast<void*>(it->first), it->second.mapped_size);
  s.linear.erase(it);
}

// Primary context reset (§3.2): its streams, events and allocations go.
void reset_context(std::unique_lock<std::mutex>& lock, CUctx_st* ctx) {
  State& s = st();
  reset_context_streams(lock, ctx);
  for (auto it = s.linear.begin(); it != s.linear.end();) {
    auto next = std::next(it);
    if (it->second.ctx == ctx) free_linear(s, it);
    it = next;
  }
  for (auto it = s.host.begin(); it != s.host.end();) {
    if (it->second.ctx == ctx) {
      munmap(reinterpret_cast<void*>(it->first), it->second.mapped_size);
      it = s.host.erase(it);
    } else {
      ++it;
    }
  }
  ctx->poisoned = false;
  ctx->pending_error = CUDA_SUCCESS;
  ctx->active = false;
}

void print_report() {
  vsr_emu_outstanding o{};
  vsr_emu_query_outstanding(&o, -1);
  std::fprintf(stderr,
               "vsr-cuda-emulator outstanding: reservations=%zu (%zu B) handles=%zu (%zu B) "
               "mappings=%zu allocations=%zu (%zu B) managed=%zu (%zu B) host=%zu (%zu B) "
               "streams=%zu events=%zu stale_handles=%zu unmap_with_pending_work=%zu\n",
               o.reservations, o.reserved_bytes, o.handles, o.physical_bytes, o.mappings,
               o.allocations, o.allocation_bytes, o.managed, o.managed_bytes, o.host_allocations,
               o.host_bytes, o.streams, o.events, o.stale_handles, o.unmap_with_pending_work);
}

int attribute_value(const Config& c, CUdevice dev, int attrib, bool* known) {
  *known = true;
  switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
      return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X:
      return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y:
      return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z:
      return 64;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X:
      return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y:
      return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z:
      return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK:
      return 49152;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY:
      return 65536;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE:
      return 32;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH:
      return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK:
      return 65536;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE:
      return 1980000;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT:
      return 512;
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP:
      return 1;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
      return 132;
    case CU_DEVICE_ATTRIBUTE_INTEGRATED:
      return 0;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
      return 1;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE:
      return CU_COMPUTEMODE_DEFAULT;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
      return 1;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED:
      return 1;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
      return dev + 1;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID:
      return 0;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID:
      return 0;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE:
      return 2619000;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH:
      return 5120;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE:
      return 50 * 1024 * 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR:
      return 2048;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT:
      return 3;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
      return 1;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
      return 9;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
      return 0;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
      return c.managed ? 1 : 0;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
      return c.managed ? 1 : 0;
    case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS:
      return 0;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN:
      return 232448;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
      return c.vmm ? 1 : 0;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
      return c.vmm ? 1 : 0;
    case CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED:
      return 0;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED:
      return 0;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
      return c.memory_pools ? 1 : 0;
    case CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES:
      return 0;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED:
      return 0;
    case CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED:
      return 0;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
      return 0;
    case CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
      return 0;
    default:
      // Other valid attributes report 0 (a capability the emulator does not have); values outside
      // the enum are INVALID_VALUE (§1.3).
      *known = attrib > 0 && attrib < CU_DEVICE_ATTRIBUTE_MAX;
      return 0;
  }
}

}  // namespace
}  // namespace vsr::emu

using namespace vsr::emu;

// ============================== initialization and devices ==============================

/// Initializes the emulator (flags must be 0). Reads VSR_EMU_FAIL at the first call. With
/// VSR_EMU_DEVICE_COUNT=0 it fails with CUDA_ERROR_NO_DEVICE and the library stays uninitialized.
VSR_EMU_EXPORT CUresult cuInit(unsigned int flags) {
  {
    State& s = st();
    std::lock_guard lock(s.mutex);
    read_fail_env_once(s);
  }
  VSR_EMU_BEGIN("cuInit");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (s.config.device_count == 0) return CUDA_ERROR_NO_DEVICE;
  s.initialized = true;
  return CUDA_SUCCESS;
}

/// Writes the emulated driver version (VSR_EMU_DRIVER_VERSION, default 13000). Works before cuInit.
VSR_EMU_EXPORT CUresult cuDriverGetVersion(int* version) {
  VSR_EMU_BEGIN("cuDriverGetVersion");
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *version = vsr::emu::driver_version();
  return CUDA_SUCCESS;
}

/// Writes the number of emulated devices (VSR_EMU_DEVICE_COUNT).
VSR_EMU_EXPORT CUresult cuDeviceGetCount(int* count) {
  VSR_EMU_BEGIN("cuDeviceGetCount");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_init(s); r != CUDA_SUCCESS) return r;
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *count = s.config.device_count;
  return CUDA_SUCCESS;
}

/// Writes the device handle of `ordinal` (the ordinal itself).
VSR_EMU_EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  VSR_EMU_BEGIN("cuDeviceGet");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_init(s); r != CUDA_SUCCESS) return r;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = need_device(s, ordinal); r != CUDA_SUCCESS) return r;
  *device = ordinal;
  return CUDA_SUCCESS;
}

/// Writes an attribute of `dev` (an H100-like 9.0 device; feature attributes follow the options).
VSR_EMU_EXPORT CUresult cuDeviceGetAttribute(int* value, CUdevice_attribute attrib, CUdevice dev) {
  VSR_EMU_BEGIN("cuDeviceGetAttribute");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_device(s, dev); r != CUDA_SUCCESS) return r;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  bool known = false;
  int v = attribute_value(s.config, dev, static_cast<int>(attrib), &known);
  if (!known) return CUDA_ERROR_INVALID_VALUE;
  *value = v;
  return CUDA_SUCCESS;
}

/// Writes the device name ("vibespatial-raster host emulator"), truncated to `len` bytes.
VSR_EMU_EXPORT CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  VSR_EMU_BEGIN("cuDeviceGetName");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_device(s, dev); r != CUDA_SUCCESS) return r;
  if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  std::snprintf(name, static_cast<size_t>(len), "%s", "vibespatial-raster host emulator");
  return CUDA_SUCCESS;
}

/// Writes the emulated capacity of `dev` (VSR_EMU_DEVICE_MEMORY).
VSR_EMU_EXPORT CUresult cuDeviceTotalMem(size_t* bytes, CUdevice dev) {
  VSR_EMU_BEGIN("cuDeviceTotalMem");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_device(s, dev); r != CUDA_SUCCESS) return r;
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *bytes = s.config.device_memory;
  return CUDA_SUCCESS;
}

// ============================== contexts ==============================

/// Retains (and activates) the primary context of `dev`; every call returns the same handle.
VSR_EMU_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice dev) {
  VSR_EMU_BEGIN("cuDevicePrimaryCtxRetain");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_device(s, dev); r != CUDA_SUCCESS) return r;
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUctx_st& primary = s.devices[static_cast<size_t>(dev)]->primary;
  primary.refcount++;
  primary.active = true;
  *ctx = &primary;
  return CUDA_SUCCESS;
}

/// Drops one retain of the primary context of `dev`; at zero the context is reset: its streams,
/// events, cuMemAlloc/Async/Managed and host allocations are destroyed (§3.2).
VSR_EMU_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  VSR_EMU_BEGIN("cuDevicePrimaryCtxRelease");
  State& s = st();
  std::unique_lock lock(s.mutex);
  if (CUresult r = need_device(s, dev); r != CUDA_SUCCESS) return r;
  CUctx_st& primary = s.devices[static_cast<size_t>(dev)]->primary;
  if (primary.refcount == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (--primary.refcount == 0) reset_context(lock, &primary);
  return CUDA_SUCCESS;
}

/// Writes the primary context's flags (always 0) and whether it is active.
VSR_EMU_EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
  VSR_EMU_BEGIN("cuDevicePrimaryCtxGetState");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_device(s, dev); r != CUDA_SUCCESS) return r;
  if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *flags = 0;
  *active = s.devices[static_cast<size_t>(dev)]->primary.active ? 1 : 0;
  return CUDA_SUCCESS;
}

/// Binds `ctx` (a primary context handle, or NULL to unbind) to the calling thread.
VSR_EMU_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
  VSR_EMU_BEGIN("cuCtxSetCurrent");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_init(s); r != CUDA_SUCCESS) return r;
  if (ctx != nullptr) {
    bool found = false;
    for (auto& d : s.devices) found = found || &d->primary == ctx;
    if (!found) return CUDA_ERROR_INVALID_CONTEXT;
  }
  tl_current = ctx;
  return CUDA_SUCCESS;
}

/// Writes the calling thread's current context (NULL when none). Before cuInit it returns
/// NOT_INITIALIZED without writing (§1.1).
VSR_EMU_EXPORT CUresult cuCtxGetCurrent(CUcontext* ctx) {
  VSR_EMU_BEGIN("cuCtxGetCurrent");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_init(s); r != CUDA_SUCCESS) return r;
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *ctx = tl_current;
  return CUDA_SUCCESS;
}

namespace {

CUresult ctx_get_device(CUdevice* device, CUcontext ctx) {
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_init(s); r != CUDA_SUCCESS) return r;
  if (ctx == nullptr) {
    CUctx_st* cur = nullptr;
    if (CUresult r = need_context(s, &cur); r != CUDA_SUCCESS) return r;
    ctx = cur;
  } else if (!ctx->active) {
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *device = ctx->device;
  return CUDA_SUCCESS;
}

CUresult ctx_synchronize(CUcontext ctx) {
  State& s = st();
  std::unique_lock lock(s.mutex);
  if (ctx == nullptr) {
    CUctx_st* cur = nullptr;
    if (CUresult r = need_context(s, &cur); r != CUDA_SUCCESS) return r;
    ctx = cur;
  } else if (!ctx->active) {
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  // Work still queued on destroyed streams counts too (§3.7: cuStreamDestroy returns at once).
  WaitList all = context_work(s, ctx);
  lock.unlock();
  wait_all(all);
  lock.lock();
  return sync_result(ctx);
}

}  // namespace

/// Writes the device of the current context; INVALID_CONTEXT without one.
VSR_EMU_EXPORT CUresult cuCtxGetDevice(CUdevice* device) {
  VSR_EMU_BEGIN("cuCtxGetDevice");
  return ctx_get_device(device, nullptr);
}

/// 13.0 form: the device of `ctx` (NULL: the current context).
VSR_EMU_EXPORT CUresult cuCtxGetDevice_v2(CUdevice* device, CUcontext ctx) {
  VSR_EMU_BEGIN("cuCtxGetDevice");
  return ctx_get_device(device, ctx);
}

/// Waits for all work of the current context (every stream, also destroyed ones still draining,
/// and the default streams); returns the context's pending error.
VSR_EMU_EXPORT CUresult cuCtxSynchronize(void) {
  VSR_EMU_BEGIN("cuCtxSynchronize");
  return ctx_synchronize(nullptr);
}

/// 13.0 form: waits for all streams of `ctx` (NULL: the current context).
VSR_EMU_EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx) {
  VSR_EMU_BEGIN("cuCtxSynchronize");
  return ctx_synchronize(ctx);
}

// ============================== memory info and VMM ==============================

namespace {

// §1.1 \notefnerr: every VMM entry may also return an error of earlier asynchronous work. With
// STICKY_VMM a sticky error of any context reaches them; the call has still done its work, so a
// caller that retries (a second cuMemRelease) repeats it.
CUresult vmm_result(State& s, CUresult r) {
  if (r != CUDA_SUCCESS || !s.config.sticky_vmm) return r;
  for (const auto& d : s.devices) {
    if (d->primary.active && d->primary.poisoned) return CUDA_ERROR_ILLEGAL_ADDRESS;
  }
  return r;
}

// An id cuMemCreate never returned, or one already released (a stale use: the real driver's
// behaviour is undefined, §3.4.5).
CUresult bad_vmm_handle(State& s, CUmemGenericAllocationHandle handle) {
  if (handle != 0 && handle <= s.next_handle) {
    misuse(s, &s.stale_handles,
           "names allocation handle " + std::to_string(handle) + ", which was released");
  }
  return CUDA_ERROR_INVALID_VALUE;
}

// [ptr, ptr+size) is exactly a gap-free run of whole mappings inside one reservation (§3.4.7,
// §3.4.8; spans across reservation boundaries are not accepted, §4 invariant 1). Sets *first and
// *past to the run's mappings.
bool whole_mappings(State& s, uintptr_t ptr, size_t size,
                    std::map<uintptr_t, Mapping>::iterator* first,
                    std::map<uintptr_t, Mapping>::iterator* past) {
  if (ptr == 0 || size == 0 || ptr + size < ptr) return false;
  const uintptr_t end = ptr + size;
  auto res = containing_reservation(s, ptr);
  if (res == s.reservations.end() || end > res->first + res->second) return false;
  auto it = s.mappings.find(ptr);
  if (it == s.mappings.end()) return false;
  *first = it;
  uintptr_t cur = ptr;
  while (cur < end) {
    if (it == s.mappings.end() || it->first != cur) return false;
    cur += it->second.size;
    ++it;
  }
  *past = it;
  return cur == end;
}

std::string hex_range(uintptr_t begin, uintptr_t end) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "[0x%llx, 0x%llx)", static_cast<unsigned long long>(begin),
                static_cast<unsigned long long>(end));
  return buf;
}

}  // namespace

/// free = capacity - charged - context overhead for the current context's device, rounded down
/// to VSR_EMU_MEMINFO_QUANTUM when set.
VSR_EMU_EXPORT CUresult cuMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  VSR_EMU_BEGIN("cuMemGetInfo");
  State& s = st();
  std::lock_guard lock(s.mutex);
  CUctx_st* ctx = nullptr;
  if (CUresult r = need_context(s, &ctx); r != CUDA_SUCCESS) return r;
  if (free_bytes == nullptr || total_bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  size_t free = device_free(s, ctx->device);
  if (s.config.meminfo_quantum != 0)
    free = free / s.config.meminfo_quantum * s.config.meminfo_quantum;
  *free_bytes = free;
  *total_bytes = s.config.device_memory;
  return CUDA_SUCCESS;
}

/// Writes the minimum (VSR_EMU_GRANULARITY) or recommended granularity. Like the real driver it
/// does not validate prop's location or type (§3.4.1).
VSR_EMU_EXPORT CUresult cuMemGetAllocationGranularity(size_t* granularity,
                                                      const CUmemAllocationProp* prop,
                                                      CUmemAllocationGranularity_flags option) {
  VSR_EMU_BEGIN("cuMemGetAllocationGranularity");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_vmm(s); r != CUDA_SUCCESS) return r;
  if (granularity == nullptr || prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (option == CU_MEM_ALLOC_GRANULARITY_MINIMUM) {
    *granularity = s.config.granularity;
  } else if (option == CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) {
    *granularity = s.config.recommended_granularity != 0 ? s.config.recommended_granularity
                                                         : s.config.granularity;
  } else {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

/// Reserves [*ptr, *ptr+size) of PROT_NONE address space aligned to max(alignment, granularity).
/// A free, suitably aligned hint `addr` is honoured; otherwise another address is returned
/// without error (§3.4.2). Past VSR_EMU_ADDRESS_SPACE bytes of live reservations it fails with
/// OUT_OF_MEMORY, as a real driver does when virtual address space runs out.
VSR_EMU_EXPORT CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment,
                                            CUdeviceptr addr, unsigned long long flags) {
  VSR_EMU_BEGIN("cuMemAddressReserve");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_vmm(s); r != CUDA_SUCCESS) return r;
  const size_t page = page_size();
  if (ptr == nullptr || size == 0 || size % page != 0 || flags != 0 || addr % page != 0 ||
      (alignment != 0 && !is_pow2(alignment))) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const size_t limit = address_space_limit(s.config);
  if (limit != 0 && (size > limit || s.reserved_bytes > limit - size)) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const size_t align = std::max(alignment, s.config.granularity);
  constexpr int kProt = PROT_NONE;
  constexpr int kFlags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
  if (addr != 0 && addr % align == 0 && addr + size > addr) {
    void* want = reinterpret_cast<void*>(addr);
    void* got = mmap(want, size, kProt, kFlags | MAP_FIXED_NOREPLACE, -1, 0);
    if (got == want) {
      s.reservations[addr] = size;
      s.reserved_bytes += size;
      *ptr = addr;
      return vmm_result(s, CUDA_SUCCESS);
    }
    // Kernels before 4.17 treat the flag as a plain hint and may place the range elsewhere.
    if (got != MAP_FAILED) munmap(got, size);
  }
  if (size + align < size) return CUDA_ERROR_OUT_OF_MEMORY;
  void* raw = mmap(nullptr, size + align, kProt, kFlags, -1, 0);
  if (raw == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  auto base = reinterpret_cast<uintptr_t>(raw);
  uintptr_t aligned = round_up(base, align);
  if (aligned > base) munmap(raw, aligned - base);
  uintptr_t tail = aligned + size;
  if (base + size + align > tail) munmap(reinterpret_cast<void*>(tail), base + size + align - tail);
  s.reservations[aligned] = size;
  s.reserved_bytes += size;
  *ptr = aligned;
  return vmm_result(s, CUDA_SUCCESS);
}

/// Frees a reservation: (ptr, size) must be exactly one reservation with no mapping inside
/// (strict, §3.4.3). Queued work that still targets the range is counted
/// (unmap_with_pending_work).
VSR_EMU_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  VSR_EMU_BEGIN("cuMemAddressFree");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_vmm(s); r != CUDA_SUCCESS) return r;
  if (ptr == 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
  auto it = s.reservations.find(ptr);
  if (it == s.reservations.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
  auto m = s.mappings.lower_bound(ptr);
  if (m != s.mappings.end() && m->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;
  if (pending_work_overlaps(s, ptr, ptr + size)) {
    misuse(s, &s.unmap_with_pending_work,
           "frees reservation " + hex_range(ptr, ptr + size) + " while queued work targets it");
  }
  munmap(reinterpret_cast<void*>(ptr), size);
  s.reservations.erase(it);
  s.reserved_bytes -= size;
  return vmm_result(s, CUDA_SUCCESS);
}

/// Creates a physical allocation (a memfd) of `size` bytes on prop->location.id, charged to the
/// device at once. Handle ids increase monotonically, are never 0 and never reused (§3.4.4).
VSR_EMU_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                    const CUmemAllocationProp* prop, unsigned long long flags) {
  VSR_EMU_BEGIN("cuMemCreate");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_vmm(s); r != CUDA_SUCCESS) return r;
  if (handle == nullptr || prop == nullptr || size == 0 || flags != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
  if (prop->location.type == CU_MEM_LOCATION_TYPE_HOST ||
      prop->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
      prop->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
  if (prop->location.id < 0 || prop->location.id >= s.config.device_count) {
    return CUDA_ERROR_INVALID_DEVICE;
  }
  if (prop->win32HandleMetaData != nullptr) return CUDA_ERROR_INVALID_VALUE;
  if ((prop->requestedHandleTypes & ~CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (size % s.config.granularity != 0) return CUDA_ERROR_INVALID_VALUE;
  const int dev = prop->location.id;
  if (!charge(s, dev, size)) return CUDA_ERROR_OUT_OF_MEMORY;
  int fd = memfd_create("vsr-emu-physical", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(size)) != 0) {
    if (fd >= 0) close(fd);
    uncharge(s, dev, size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  auto p = std::make_shared<Physical>();
  p->id = ++s.next_handle;
  p->size = size;
  p->prop = *prop;
  p->device = dev;
  p->fd = fd;
  p->refs = 1;
  s.handles[p->id] = p;
  s.live_physical++;
  s.live_physical_bytes += size;
  s.physical_per_device[static_cast<size_t>(dev)]++;
  s.physical_bytes_per_device[static_cast<size_t>(dev)] += size;
  *handle = p->id;
  return vmm_result(s, CUDA_SUCCESS);
}

/// Drops one reference of `handle`; the memory goes once no reference and no mapping remain.
/// Unknown or already released ids are INVALID_VALUE (the real driver's behaviour is undefined;
/// a released id counts as a stale handle).
VSR_EMU_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  VSR_EMU_BEGIN("cuMemRelease");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_vmm(s); r != CUDA_SUCCESS) return r;
  auto it = s.handles.find(handle);
  if (handle == 0 || it == s.handles.end()) return bad_vmm_handle(s, handle);
  std::shared_ptr<Physical> p = it->second;
  if (--p->refs == 0) {
    s.handles.erase(it);
    if (p->maps == 0 && pending_work_overlaps(s, 0, 0, p->id)) {
      misuse(s, &s.unmap_with_pending_work,
             "frees allocation handle " + std::to_string(p->id) + " while queued work uses it");
    }
    maybe_destroy_physical(s, p);
  }
  return vmm_result(s, CUDA_SUCCESS);
}

/// Maps the whole allocation `handle` at ptr (offset 0, size = allocation size; strict, §3.4.6)
/// inside one reservation, over no existing mapping. The mapping starts with no access.
VSR_EMU_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                                 CUmemGenericAllocationHandle handle, unsigned long long flags) {
  VSR_EMU_BEGIN("cuMemMap");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_vmm(s); r != CUDA_SUCCESS) return r;
  if (ptr == 0 || size == 0 || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  auto h = s.handles.find(handle);
  if (h == s.handles.end()) return bad_vmm_handle(s, handle);
  const size_t g = s.config.granularity;
  std::shared_ptr<Physical> p = h->second;
  if (ptr % g != 0 || size % g != 0 || offset % g != 0) return CUDA_ERROR_INVALID_VALUE;
  if (offset != 0 || size != p->size) return CUDA_ERROR_INVALID_VALUE;
  auto res = containing_reservation(s, ptr);
  if (res == s.reservations.end() || ptr + size > res->first + res->second) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto next = s.mappings.lower_bound(ptr);
  if (next != s.mappings.end() && next->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;
  if (containing(s.mappings, ptr) != s.mappings.end()) return CUDA_ERROR_INVALID_VALUE;
  void* got = mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE, MAP_SHARED | MAP_FIXED, p->fd,
                   static_cast<off_t>(offset));
  if (got == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  Mapping m;
  m.size = size;
  m.granule = g;
  m.physical = p;
  m.access.assign(size / g * static_cast<size_t>(s.config.device_count),
                  CU_MEM_ACCESS_FLAGS_PROT_NONE);
  s.mappings[ptr] = std::move(m);
  p->maps++;
  return vmm_result(s, CUDA_SUCCESS);
}

/// Unmaps [ptr, ptr+size), which must be exactly a gap-free union of whole mappings inside one
/// reservation (§3.4.7). The range becomes plain reservation again; queued work that still
/// targets it is counted (unmap_with_pending_work): the driver does not wait for it (§7 #2).
VSR_EMU_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  VSR_EMU_BEGIN("cuMemUnmap");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_vmm(s); r != CUDA_SUCCESS) return r;
  std::map<uintptr_t, Mapping>::iterator first;
  std::map<uintptr_t, Mapping>::iterator past;
  if (!whole_mappings(s, ptr, size, &first, &past)) return CUDA_ERROR_INVALID_VALUE;
  if (pending_work_overlaps(s, ptr, ptr + size)) {
    misuse(s, &s.unmap_with_pending_work,
           "unmaps " + hex_range(ptr, ptr + size) + " while queued work targets it");
  }
  for (auto m = first; m != past;) {
    // Re-reserve rather than munmap: the address range still belongs to the reservation.
    mmap(reinterpret_cast<void*>(m->first), m->second.size, PROT_NONE,
         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    std::shared_ptr<Physical> p = m->second.physical;
    p->maps--;
    m = s.mappings.erase(m);
    maybe_destroy_physical(s, p);
  }
  return vmm_result(s, CUDA_SUCCESS);
}

/// Sets per-device access on [ptr, ptr+size), which must contain whole mappings only, with no
/// gap, inside one reservation (§3.4.8: "a fully mapped address range containing all
/// allocations"; it may span several mappings). The host view gets the widest access any device
/// has (mprotect).
VSR_EMU_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,
                                       size_t count) {
  VSR_EMU_BEGIN("cuMemSetAccess");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_vmm(s); r != CUDA_SUCCESS) return r;
  if (ptr == 0 || size == 0 || desc == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < count; ++i) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    if (desc[i].location.id < 0 || desc[i].location.id >= s.config.device_count) {
      return CUDA_ERROR_INVALID_DEVICE;
    }
    if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
        desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
        desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  const size_t g = s.config.granularity;
  if (ptr % g != 0 || size % g != 0) return CUDA_ERROR_INVALID_VALUE;
  const auto ndev = static_cast<size_t>(s.config.device_count);
  std::map<uintptr_t, Mapping>::iterator first;
  std::map<uintptr_t, Mapping>::iterator past;
  if (!whole_mappings(s, ptr, size, &first, &past)) return CUDA_ERROR_INVALID_VALUE;
  for (auto it = first; it != past; ++it) {
    Mapping& m = it->second;
    for (uintptr_t gaddr = it->first; gaddr < it->first + m.size; gaddr += m.granule) {
      size_t gi = (gaddr - it->first) / m.granule;
      for (size_t i = 0; i < count; ++i) {
        m.access[gi * ndev + static_cast<size_t>(desc[i].location.id)] =
            static_cast<unsigned char>(desc[i].flags);
      }
      unsigned char widest = CU_MEM_ACCESS_FLAGS_PROT_NONE;
      for (size_t d = 0; d < ndev; ++d) widest = std::max(widest, m.access[gi * ndev + d]);
      int prot = widest == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE
                 : widest == CU_MEM_ACCESS_FLAGS_PROT_READ    ? PROT_READ
                                                              : PROT_NONE;
      mprotect(reinterpret_cast<void*>(gaddr), m.granule, prot);
    }
  }
  return vmm_result(s, CUDA_SUCCESS);
}

/// Writes the access flags of `location` (a device) for the mapped address `ptr`.
VSR_EMU_EXPORT CUresult cuMemGetAccess(unsigned long long* flags, const CUmemLocation* location,
                                       CUdeviceptr ptr) {
  VSR_EMU_BEGIN("cuMemGetAccess");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_vmm(s); r != CUDA_SUCCESS) return r;
  if (flags == nullptr || location == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (location->type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
  if (location->id < 0 || location->id >= s.config.device_count) return CUDA_ERROR_INVALID_DEVICE;
  auto it = containing(s.mappings, ptr);
  if (it == s.mappings.end()) return CUDA_ERROR_INVALID_VALUE;
  size_t gi = (ptr - it->first) / it->second.granule;
  *flags = it->second.access[gi * static_cast<size_t>(s.config.device_count) +
                             static_cast<size_t>(location->id)];
  return CUDA_SUCCESS;
}

/// Writes the handle mapped at `addr` (the same id cuMemCreate returned) and adds a reference.
VSR_EMU_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle,
                                                    void* addr) {
  VSR_EMU_BEGIN("cuMemRetainAllocationHandle");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_vmm(s); r != CUDA_SUCCESS) return r;
  if (handle == nullptr || addr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto it = containing(s.mappings, reinterpret_cast<uintptr_t>(addr));
  if (it == s.mappings.end()) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<Physical> p = it->second.physical;
  if (p->refs++ == 0) s.handles[p->id] = p;
  *handle = p->id;
  return vmm_result(s, CUDA_SUCCESS);
}

/// Writes the properties `handle` was created with.
VSR_EMU_EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(
    CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle) {
  VSR_EMU_BEGIN("cuMemGetAllocationPropertiesFromHandle");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_vmm(s); r != CUDA_SUCCESS) return r;
  if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto it = s.handles.find(handle);
  if (it == s.handles.end()) return bad_vmm_handle(s, handle);
  *prop = it->second->prop;
  return CUDA_SUCCESS;
}

// ============================== classic allocations ==============================

/// Allocates `bytesize` bytes of device memory (256-byte aligned host memory) in the current
/// context, charged to its device.
VSR_EMU_EXPORT CUresult cuMemAlloc(CUdeviceptr* dptr, size_t bytesize) {
  VSR_EMU_BEGIN("cuMemAlloc");
  State& s = st();
  std::lock_guard lock(s.mutex);
  CUctx_st* ctx = nullptr;
  if (CUresult r = need_context(s, &ctx); r != CUDA_SUCCESS) return r;
  if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  return alloc_linear(s, ctx, bytesize, LinearKind::device, dptr);
}

/// Frees cuMemAlloc/cuMemAllocAsync/cuMemAllocManaged memory; 0 is a no-op; interior, unknown,
/// already freed or VMM pointers are INVALID_VALUE. It waits for the context's queued work first
/// (the driver "may synchronize", §3.5), except for cuMemAllocAsync memory (never, §3.5) and
/// with VSR_EMU_FREE_NO_SYNC; a free that does not wait counts queued work that still uses the
/// memory (unmap_with_pending_work).
VSR_EMU_EXPORT CUresult cuMemFree(CUdeviceptr dptr) {
  VSR_EMU_BEGIN("cuMemFree");
  State& s = st();
  std::unique_lock lock(s.mutex);
  CUctx_st* ctx = nullptr;
  if (CUresult r = need_context(s, &ctx); r != CUDA_SUCCESS) return r;
  if (dptr == 0) return CUDA_SUCCESS;
  auto it = s.linear.find(dptr);
  if (it == s.linear.end() || it->second.free_pending) return CUDA_ERROR_INVALID_VALUE;
  if (!s.config.free_no_sync && it->second.kind != LinearKind::async) {
    WaitList all = context_work(s, it->second.ctx);
    lock.unlock();
    wait_all(all);
    lock.lock();
    it = s.linear.find(dptr);
    if (it == s.linear.end() || it->second.free_pending) return CUDA_ERROR_INVALID_VALUE;
  }
  if (pending_work_overlaps(s, dptr, dptr + it->second.size)) {
    misuse(s, &s.unmap_with_pending_work,
           "frees " + hex_range(dptr, dptr + it->second.size) + " while queued work uses it");
  }
  free_linear(s, it);
  return CUDA_SUCCESS;
}

/// Allocates managed memory (flags CU_MEM_ATTACH_GLOBAL or _HOST); charged to the current
/// context's device like cuMemAlloc. NOT_SUPPORTED with VSR_EMU_MANAGED=0.
VSR_EMU_EXPORT CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  VSR_EMU_BEGIN("cuMemAllocManaged");
  State& s = st();
  std::lock_guard lock(s.mutex);
  CUctx_st* ctx = nullptr;
  if (CUresult r = need_context(s, &ctx); r != CUDA_SUCCESS) return r;
  if (!s.config.managed) return CUDA_ERROR_NOT_SUPPORTED;
  if (dptr == nullptr || bytesize == 0 ||
      (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return alloc_linear(s, ctx, bytesize, LinearKind::managed, dptr);
}

namespace {

CUresult alloc_async(CUdeviceptr* dptr, size_t bytesize, CUstream stream, bool ptds) {
  State& s = st();
  std::lock_guard lock(s.mutex);
  StreamRef ref;
  if (CUresult r = resolve_stream(s, stream, ptds, &ref); r != CUDA_SUCCESS) return r;
  if (!s.config.memory_pools) return CUDA_ERROR_NOT_SUPPORTED;
  if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  // The pointer is usable in stream order at once: nothing to enqueue.
  return alloc_linear(s, ref.ctx, bytesize, LinearKind::async, dptr);
}

CUresult free_async(CUdeviceptr dptr, CUstream stream, bool ptds) {
  State& s = st();
  std::unique_lock lock(s.mutex);
  StreamRef ref;
  if (CUresult r = resolve_stream(s, stream, ptds, &ref); r != CUDA_SUCCESS) return r;
  auto it = s.linear.find(dptr);
  if (dptr == 0 || it == s.linear.end() || it->second.free_pending ||
      it->second.kind == LinearKind::managed) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  it->second.free_pending = true;
  return submit(lock, ref, [dptr](bool) {
    State& st2 = st();
    std::lock_guard l2(st2.mutex);
    auto found = st2.linear.find(dptr);
    if (found != st2.linear.end()) free_linear(st2, found);
    return CUDA_SUCCESS;
  });
}

}  // namespace

/// Stream-ordered allocation: the pointer is returned at once and charged to the stream's device.
/// NOT_SUPPORTED with VSR_EMU_MEMORY_POOLS=0.
VSR_EMU_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream stream) {
  VSR_EMU_BEGIN("cuMemAllocAsync");
  return alloc_async(dptr, bytesize, stream, false);
}

/// cuMemAllocAsync with stream 0 meaning the per-thread stream.
CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream stream) {
  VSR_EMU_BEGIN("cuMemAllocAsync");
  return alloc_async(dptr, bytesize, stream, true);
}

/// Stream-ordered free: the memory is released when the stream reaches this point.
VSR_EMU_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
  VSR_EMU_BEGIN("cuMemFreeAsync");
  return free_async(dptr, stream, false);
}

/// cuMemFreeAsync with stream 0 meaning the per-thread stream.
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
  VSR_EMU_BEGIN("cuMemFreeAsync");
  return free_async(dptr, stream, true);
}

namespace {

CUresult host_alloc(void** pp, size_t bytesize, unsigned flags) {
  State& s = st();
  std::lock_guard lock(s.mutex);
  CUctx_st* ctx = nullptr;
  if (CUresult r = need_context(s, &ctx); r != CUDA_SUCCESS) return r;
  constexpr unsigned kKnown =
      CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
  if (pp == nullptr || bytesize == 0 || (flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
  size_t mapped = 0;
  void* p = map_anonymous(bytesize, &mapped);
  if (p == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  s.host[reinterpret_cast<uintptr_t>(p)] = HostAlloc{bytesize, mapped, ctx};
  *pp = p;
  return CUDA_SUCCESS;
}

}  // namespace

/// Allocates page-locked host memory (plain host memory here), accessible to every device.
VSR_EMU_EXPORT CUresult cuMemHostAlloc(void** pp, size_t bytesize, unsigned int flags) {
  VSR_EMU_BEGIN("cuMemHostAlloc");
  return host_alloc(pp, bytesize, flags);
}

/// cuMemHostAlloc with flags 0.
VSR_EMU_EXPORT CUresult cuMemAllocHost(void** pp, size_t bytesize) {
  VSR_EMU_BEGIN("cuMemAllocHost");
  return host_alloc(pp, bytesize, 0);
}

/// Frees cuMemHostAlloc/cuMemAllocHost memory; NULL is a no-op.
VSR_EMU_EXPORT CUresult cuMemFreeHost(void* p) {
  VSR_EMU_BEGIN("cuMemFreeHost");
  State& s = st();
  std::lock_guard lock(s.mutex);
  CUctx_st* ctx = nullptr;
  if (CUresult r = need_context(s, &ctx); r != CUDA_SUCCESS) return r;
  if (p == nullptr) return CUDA_SUCCESS;
  auto it = s.host.find(reinterpret_cast<uintptr_t>(p));
  if (it == s.host.end()) return CUDA_ERROR_INVALID_VALUE;
  munmap(p, it->second.mapped_size);
  s.host.erase(it);
  return CUDA_SUCCESS;
}

// ============================== copies and memset ==============================

namespace {

CopyOp htod(CUdeviceptr dst, const void* src, size_t n) {
  return {CopyKind::htod, dst, reinterpret_cast<uintptr_t>(src), n, 0};
}
CopyOp dtoh(void* dst, CUdeviceptr src, size_t n) {
  return {CopyKind::dtoh, reinterpret_cast<uintptr_t>(dst), src, n, 0};
}
CopyOp dtod(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return {CopyKind::dtod, dst, src, n, 0};
}
CopyOp set8(CUdeviceptr dst, unsigned char v, size_t n) {
  return {CopyKind::memset8, dst, 0, n, v};
}
CopyOp set32(CUdeviceptr dst, unsigned v, size_t n) {
  return {CopyKind::memset32, dst, 0, n * 4, v};
}

}  // namespace

/// Host-to-device copy on the legacy default stream: returns once the source is read (§3.6).
VSR_EMU_EXPORT CUresult cuMemcpyHtoD(CUdeviceptr dst, const void* src, size_t n) {
  return copy_entry("cuMemcpyHtoD", htod(dst, src, n), nullptr, false, true);
}
/// Device-to-host copy on the legacy default stream: returns once the copy is done.
VSR_EMU_EXPORT CUresult cuMemcpyDtoH(void* dst, CUdeviceptr src, size_t n) {
  return copy_entry("cuMemcpyDtoH", dtoh(dst, src, n), nullptr, false, true);
}
/// Device-to-device copy on the legacy default stream (asynchronous to the host).
VSR_EMU_EXPORT CUresult cuMemcpyDtoD(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return copy_entry("cuMemcpyDtoD", dtod(dst, src, n), nullptr, false, true);
}
/// Stream-ordered host-to-device copy.
VSR_EMU_EXPORT CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void* src, size_t n,
                                          CUstream stream) {
  return copy_entry("cuMemcpyHtoDAsync", htod(dst, src, n), stream, false);
}
/// Stream-ordered device-to-host copy.
VSR_EMU_EXPORT CUresult cuMemcpyDtoHAsync(void* dst, CUdeviceptr src, size_t n, CUstream stream) {
  return copy_entry("cuMemcpyDtoHAsync", dtoh(dst, src, n), stream, false);
}
/// Stream-ordered device-to-device copy.
VSR_EMU_EXPORT CUresult cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n,
                                          CUstream stream) {
  return copy_entry("cuMemcpyDtoDAsync", dtod(dst, src, n), stream, false);
}
/// Sets n bytes on the legacy default stream (asynchronous to the host unless the target is
/// pinned host memory).
VSR_EMU_EXPORT CUresult cuMemsetD8(CUdeviceptr dst, unsigned char value, size_t n) {
  return copy_entry("cuMemsetD8", set8(dst, value, n), nullptr, false, true);
}
/// Stream-ordered byte memset.
VSR_EMU_EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n,
                                        CUstream stream) {
  return copy_entry("cuMemsetD8Async", set8(dst, value, n), stream, false);
}
/// Sets n 32-bit words (dst 4-byte aligned) on the legacy default stream.
VSR_EMU_EXPORT CUresult cuMemsetD32(CUdeviceptr dst, unsigned int value, size_t n) {
  return copy_entry("cuMemsetD32", set32(dst, value, n), nullptr, false, true);
}
/// Stream-ordered 32-bit memset.
VSR_EMU_EXPORT CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t n,
                                         CUstream stream) {
  return copy_entry("cuMemsetD32Async", set32(dst, value, n), stream, false);
}

/// Per-thread default stream forms (stream 0 = CU_STREAM_PER_THREAD: the calling thread's own
/// default stream).
CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void* src, size_t n) {
  return copy_entry("cuMemcpyHtoD", htod(dst, src, n), nullptr, true, true);
}
CUresult cuMemcpyDtoH_v2_ptds(void* dst, CUdeviceptr src, size_t n) {
  return copy_entry("cuMemcpyDtoH", dtoh(dst, src, n), nullptr, true, true);
}
CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return copy_entry("cuMemcpyDtoD", dtod(dst, src, n), nullptr, true, true);
}
CUresult cuMemsetD8_v2_ptds(CUdeviceptr dst, unsigned char value, size_t n) {
  return copy_entry("cuMemsetD8", set8(dst, value, n), nullptr, true, true);
}
CUresult cuMemsetD32_v2_ptds(CUdeviceptr dst, unsigned int value, size_t n) {
  return copy_entry("cuMemsetD32", set32(dst, value, n), nullptr, true, true);
}
CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void* src, size_t n, CUstream stream) {
  return copy_entry("cuMemcpyHtoDAsync", htod(dst, src, n), stream, true);
}
CUresult cuMemcpyDtoHAsync_v2_ptsz(void* dst, CUdeviceptr src, size_t n, CUstream stream) {
  return copy_entry("cuMemcpyDtoHAsync", dtoh(dst, src, n), stream, true);
}
CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream) {
  return copy_entry("cuMemcpyDtoDAsync", dtod(dst, src, n), stream, true);
}
CUresult cuMemsetD8Async_ptsz(CUdeviceptr dst, unsigned char value, size_t n, CUstream stream) {
  return copy_entry("cuMemsetD8Async", set8(dst, value, n), stream, true);
}
CUresult cuMemsetD32Async_ptsz(CUdeviceptr dst, unsigned int value, size_t n, CUstream stream) {
  return copy_entry("cuMemsetD32Async", set32(dst, value, n), stream, true);
}

// ============================== test control API ==============================

/// See vsr_emulator.h.
VSR_EMU_EXPORT int vsr_emu_query_outstanding(vsr_emu_outstanding* out, int device) {
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (device < -1 || device >= s.config.device_count) return CUDA_ERROR_INVALID_DEVICE;
  vsr_emu_outstanding o{};
  o.reservations = s.reservations.size();
  for (auto& [base, size] : s.reservations) o.reserved_bytes += size;
  if (device == -1) {
    o.handles = s.live_physical;
    o.physical_bytes = s.live_physical_bytes;
  } else {
    o.handles = s.physical_per_device[static_cast<size_t>(device)];
    o.physical_bytes = s.physical_bytes_per_device[static_cast<size_t>(device)];
  }
  for (auto& [va, m] : s.mappings) {
    if (device == -1 || m.physical->device == device) o.mappings++;
  }
  for (auto& [p, l] : s.linear) {
    if (device != -1 && l.device != device) continue;
    if (l.kind == LinearKind::managed) {
      o.managed++;
      o.managed_bytes += l.size;
    } else {
      o.allocations++;
      o.allocation_bytes += l.size;
    }
  }
  for (auto& [p, h] : s.host) {
    o.host_allocations++;
    o.host_bytes += h.size;
  }
  for (auto& [raw, str] : s.streams) {
    if (device == -1 || str->ctx->device == device) o.streams++;
  }
  for (auto& [raw, ev] : s.events) {
    if (device == -1 || ev->ctx->device == device) o.events++;
  }
  o.stale_handles = static_cast<size_t>(s.stale_handles);
  o.unmap_with_pending_work = static_cast<size_t>(s.unmap_with_pending_work);
  *out = o;
  return CUDA_SUCCESS;
}
