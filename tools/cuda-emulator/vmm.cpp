// SPDX-License-Identifier: Apache-2.0
// Memory information and the virtual memory management API: cuMemGetInfo, granularity, address
// reservations, physical allocations (memfds), mappings, access, handle retain and properties.
// Rules and error codes follow docs/cuda-driver-rules.md (cited as §n); the glossary and the
// locking rules are in emulator_state.hpp.
#include "emulator_state.hpp"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

using namespace vsr::emu;

namespace {

// The emulator's physical memory is host objects: each cuMemCreate handle is a memfd (one open
// file: `ulimit -n` caps them) and each mapping a host mapping (vm.max_map_count caps them,
// 65530 by default). Past either limit cuMemCreate / cuMemMap return OUT_OF_MEMORY with device
// memory to spare, which a real driver would not: said once on stderr, so that a large trace
// that fails on the emulator is not taken for a pool that ran out.
void note_host_limit(const char* entry, const char* what, std::size_t count, const char* limit,
                     long value) {
  static std::atomic<bool> said{false};
  if (said.exchange(true)) return;
  std::fprintf(stderr,
               "vsr-cuda-emulator: %s: the host refused a new %s with %zu held (%s is %ld): "
               "returning CUDA_ERROR_OUT_OF_MEMORY, which a real device would not\n",
               entry, what, count, limit, value);
}

long max_map_count() {
  long limit = -1;
  if (FILE* f = std::fopen("/proc/sys/vm/max_map_count", "r")) {
    if (std::fscanf(f, "%ld", &limit) != 1) limit = -1;
    std::fclose(f);
  }
  return limit;
}

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

}  // namespace

/// free = capacity - charged - context overhead for the current context's device, rounded down
/// to VSR_EMU_MEMINFO_QUANTUM when set.
VSR_EMU_EXPORT CUresult cuMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  VSR_EMU_ENTRY("cuMemGetInfo");
  CUctx_st* ctx = nullptr;
  VSR_EMU_TRY(need_context(s, &ctx));
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
  VSR_EMU_ENTRY("cuMemGetAllocationGranularity");
  VSR_EMU_TRY(need_vmm(s));
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
  VSR_EMU_ENTRY("cuMemAddressReserve");
  VSR_EMU_TRY(need_vmm(s));
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
  VSR_EMU_ENTRY("cuMemAddressFree");
  VSR_EMU_TRY(need_vmm(s));
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
  VSR_EMU_ENTRY("cuMemCreate");
  VSR_EMU_TRY(need_vmm(s));
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
  if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
    rlimit files{};
    getrlimit(RLIMIT_NOFILE, &files);
    note_host_limit("cuMemCreate", "memfd (one open file per handle)", s.handles.size(),
                    "ulimit -n", static_cast<long>(files.rlim_cur));
  }
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
  VSR_EMU_ENTRY("cuMemRelease");
  VSR_EMU_TRY(need_vmm(s));
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
  VSR_EMU_ENTRY("cuMemMap");
  VSR_EMU_TRY(need_vmm(s));
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
  if (got == MAP_FAILED) {
    if (errno == ENOMEM) {
      note_host_limit("cuMemMap", "host mapping", s.mappings.size(), "vm.max_map_count",
                      max_map_count());
    }
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
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
  VSR_EMU_ENTRY("cuMemUnmap");
  VSR_EMU_TRY(need_vmm(s));
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
  VSR_EMU_ENTRY("cuMemSetAccess");
  VSR_EMU_TRY(need_vmm(s));
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
  VSR_EMU_ENTRY("cuMemGetAccess");
  VSR_EMU_TRY(need_vmm(s));
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
  VSR_EMU_ENTRY("cuMemRetainAllocationHandle");
  VSR_EMU_TRY(need_vmm(s));
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
  VSR_EMU_ENTRY("cuMemGetAllocationPropertiesFromHandle");
  VSR_EMU_TRY(need_vmm(s));
  if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto it = s.handles.find(handle);
  if (it == s.handles.end()) return bad_vmm_handle(s, handle);
  *prop = it->second->prop;
  return CUDA_SUCCESS;
}
