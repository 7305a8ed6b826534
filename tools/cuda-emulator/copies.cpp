// SPDX-License-Identifier: Apache-2.0
// Copies and memset between host and device memory, synchronous and stream-ordered: the checks of
// the device ranges (a range that is no device memory, VMM memory the device may not touch) and
// the copy itself, run in stream order. Rules and error codes follow
// docs/cuda-driver-rules.md (cited as §n); the glossary and the locking rules are in
// emulator_state.hpp.
#include "emulator_state.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace vsr::emu {

namespace {

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

}  // namespace

}  // namespace vsr::emu

using namespace vsr::emu;

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
