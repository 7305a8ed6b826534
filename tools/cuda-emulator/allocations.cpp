// SPDX-License-Identifier: Apache-2.0
// Classic allocations: linear device memory (cuMemAlloc, stream-ordered cuMemAllocAsync and
// cuMemFreeAsync, managed memory) and pinned host memory, each an anonymous mmap charged to its
// device. Rules and error codes follow
// docs/cuda-driver-rules.md (cited as §n); the glossary and the locking rules are in
// emulator_state.hpp.
#include "emulator_state.hpp"

#include <sys/mman.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace vsr::emu {

namespace {

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

}  // namespace

void free_linear(State& s, std::map<uintptr_t, Linear>::iterator it) {
  uncharge(s, it->second.device, it->second.size);
  munmap(reinterpret_cast<void*>(it->first), it->second.mapped_size);
  s.linear.erase(it);
}

}  // namespace vsr::emu

using namespace vsr::emu;

/// Allocates `bytesize` bytes of device memory (256-byte aligned host memory) in the current
/// context, charged to its device.
VSR_EMU_EXPORT CUresult cuMemAlloc(CUdeviceptr* dptr, size_t bytesize) {
  VSR_EMU_ENTRY("cuMemAlloc");
  CUctx_st* ctx = nullptr;
  VSR_EMU_TRY(need_context(s, &ctx));
  if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  return alloc_linear(s, ctx, bytesize, LinearKind::device, dptr);
}

/// Frees cuMemAlloc/cuMemAllocAsync/cuMemAllocManaged memory; 0 is a no-op; interior, unknown,
/// already freed or VMM pointers are INVALID_VALUE. It waits for the context's queued work first
/// (the driver "may synchronize", §3.5), except for cuMemAllocAsync memory (never, §3.5) and
/// with VSR_EMU_FREE_NO_SYNC; a free that does not wait counts queued work that still uses the
/// memory (unmap_with_pending_work).
VSR_EMU_EXPORT CUresult cuMemFree(CUdeviceptr dptr) {
  VSR_EMU_ENTRY("cuMemFree");
  CUctx_st* ctx = nullptr;
  VSR_EMU_TRY(need_context(s, &ctx));
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
  VSR_EMU_ENTRY("cuMemAllocManaged");
  CUctx_st* ctx = nullptr;
  VSR_EMU_TRY(need_context(s, &ctx));
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
  VSR_EMU_TRY(resolve_stream(s, stream, ptds, &ref));
  if (!s.config.memory_pools) return CUDA_ERROR_NOT_SUPPORTED;
  if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  // The pointer is usable in stream order at once: nothing to enqueue.
  return alloc_linear(s, ref.ctx, bytesize, LinearKind::async, dptr);
}

CUresult free_async(CUdeviceptr dptr, CUstream stream, bool ptds) {
  State& s = st();
  std::unique_lock lock(s.mutex);
  StreamRef ref;
  VSR_EMU_TRY(resolve_stream(s, stream, ptds, &ref));
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
  VSR_EMU_TRY(need_context(s, &ctx));
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
  VSR_EMU_ENTRY("cuMemFreeHost");
  CUctx_st* ctx = nullptr;
  VSR_EMU_TRY(need_context(s, &ctx));
  if (p == nullptr) return CUDA_SUCCESS;
  auto it = s.host.find(reinterpret_cast<uintptr_t>(p));
  if (it == s.host.end()) return CUDA_ERROR_INVALID_VALUE;
  munmap(p, it->second.mapped_size);
  s.host.erase(it);
  return CUDA_SUCCESS;
}

/// The allocation holding `dptr` (§3.4.10, §3.5): a linear allocation of the current context
/// (cuMemAlloc, cuMemAllocAsync not yet freed, managed memory) as it was asked for, or the VMM
/// reservation holding it, mapped or not, as the real driver reports VMM addresses. Pinned host
/// memory, freed memory, other contexts' linear memory and unknown addresses are NOT_FOUND.
/// `pbase` and `psize` are optional (HDR).
VSR_EMU_EXPORT CUresult cuMemGetAddressRange(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  VSR_EMU_ENTRY("cuMemGetAddressRange");
  CUctx_st* ctx = nullptr;
  VSR_EMU_TRY(need_context(s, &ctx));
  uintptr_t base = 0;
  size_t size = 0;
  if (auto lin = containing(s.linear, dptr); lin != s.linear.end()) {
    if (lin->second.free_pending || lin->second.ctx != ctx) return CUDA_ERROR_NOT_FOUND;
    base = lin->first;
    size = lin->second.size;
  } else if (auto res = containing_reservation(s, dptr); res != s.reservations.end()) {
    base = res->first;
    size = res->second;
  } else {
    return CUDA_ERROR_NOT_FOUND;
  }
  if (pbase != nullptr) *pbase = base;
  if (psize != nullptr) *psize = size;
  return CUDA_SUCCESS;
}
