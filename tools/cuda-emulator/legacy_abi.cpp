// SPDX-License-Identifier: Apache-2.0
// Old-ABI exports. cuda.h maps the unversioned names to the current ABI (cuMemAlloc ->
// cuMemAlloc_v2), but the real library also exports the unversioned names with the old 32-bit
// signatures (docs/cuda-driver-rules.md §1.4). The emulator must never alias them to the
// new implementations, so they fail with CUDA_ERROR_NOT_SUPPORTED.
#include "emulator_internal.hpp"

#define VSR_EMU_LEGACY_ENTRY(name)                   \
  CUresult legacy_##name() {                         \
    CUresult injected = vsr::emu::begin_call(#name); \
    if (injected != CUDA_SUCCESS) return injected;   \
    return CUDA_ERROR_NOT_SUPPORTED;                 \
  }
VSR_EMU_UNSUPPORTED_LEGACY_ENTRIES(VSR_EMU_LEGACY_ENTRY)
#undef VSR_EMU_LEGACY_ENTRY

// The 7000 ABI differs from _v2 (11000) only in how it interacts with the runtime API, which the
// emulator does not have (§3.2).
CUresult legacy_cuDevicePrimaryCtxRelease(CUdevice dev) {
  return cuDevicePrimaryCtxRelease(dev);
}

// _v2 (12080) only relaxes error checking (§6); same signature.
CUresult legacy_cuEventElapsedTime(float* ms, CUevent start, CUevent end) {
  return cuEventElapsedTime(ms, start, end);
}
