// SPDX-License-Identifier: Apache-2.0
// Contexts: the primary context of each device (retain, release and its reset, state), the
// calling thread's current context, the context's device and synchronisation. Rules and error codes
// follow docs/cuda-driver-rules.md (cited as §n); the glossary and the locking rules are in
// emulator_state.hpp.
#include "emulator_state.hpp"

#include <sys/mman.h>

#include <iterator>
#include <mutex>

namespace vsr::emu {

namespace {

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

}  // namespace

}  // namespace vsr::emu

using namespace vsr::emu;

/// Retains (and activates) the primary context of `dev`; every call returns the same handle.
VSR_EMU_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice dev) {
  VSR_EMU_ENTRY("cuDevicePrimaryCtxRetain");
  VSR_EMU_TRY(need_device(s, dev));
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
  VSR_EMU_ENTRY("cuDevicePrimaryCtxRelease");
  VSR_EMU_TRY(need_device(s, dev));
  CUctx_st& primary = s.devices[static_cast<size_t>(dev)]->primary;
  if (primary.refcount == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (--primary.refcount == 0) reset_context(lock, &primary);
  return CUDA_SUCCESS;
}

/// Writes the primary context's flags (always 0) and whether it is active.
VSR_EMU_EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
  VSR_EMU_ENTRY("cuDevicePrimaryCtxGetState");
  VSR_EMU_TRY(need_device(s, dev));
  if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *flags = 0;
  *active = s.devices[static_cast<size_t>(dev)]->primary.active ? 1 : 0;
  return CUDA_SUCCESS;
}

/// Binds `ctx` (a primary context handle, or NULL to unbind) to the calling thread.
VSR_EMU_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
  VSR_EMU_ENTRY("cuCtxSetCurrent");
  VSR_EMU_TRY(need_init(s));
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
  VSR_EMU_ENTRY("cuCtxGetCurrent");
  VSR_EMU_TRY(need_init(s));
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *ctx = tl_current;
  return CUDA_SUCCESS;
}

namespace {

// The context argument of the 13.0 forms: *ctx, which must be active, or the current context when
// it is NULL (§1.2).
CUresult given_or_current(State& s, CUcontext* ctx) {
  if (*ctx == nullptr) return need_context(s, ctx);
  return (*ctx)->active ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

CUresult ctx_get_device(CUdevice* device, CUcontext ctx) {
  State& s = st();
  std::lock_guard lock(s.mutex);
  VSR_EMU_TRY(need_init(s));
  VSR_EMU_TRY(given_or_current(s, &ctx));
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *device = ctx->device;
  return CUDA_SUCCESS;
}

CUresult ctx_synchronize(CUcontext ctx) {
  State& s = st();
  std::unique_lock lock(s.mutex);
  VSR_EMU_TRY(given_or_current(s, &ctx));
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
