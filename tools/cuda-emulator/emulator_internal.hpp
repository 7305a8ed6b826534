// SPDX-License-Identifier: Apache-2.0
// Declarations shared by the emulator's translation units: the per-thread-stream (_ptds/_ptsz)
// entry points and the old-ABI names, which cuda.h does not declare under these names, and the
// call-accounting hook every entry point goes through.
#pragma once

// Every exported driver declaration gets default visibility; the rest of the library is hidden.
#pragma GCC visibility push(default)
#include <cuda.h>
#pragma GCC visibility pop

#include <string_view>

#define VSR_EMU_EXPORT extern "C" __attribute__((visibility("default")))

namespace vsr::emu {

// Counts a call of `entry` (base name) and returns the error the fault plan injects into this
// call, or CUDA_SUCCESS. `allocating` selects the default injected error (OUT_OF_MEMORY).
CUresult begin_call(const char* entry, bool allocating = false);

// The version cuDriverGetVersion reports (VSR_EMU_DRIVER_VERSION, default 13000).
int driver_version();

// Looks a CUresult up by its enumerator name ("CUDA_ERROR_OUT_OF_MEMORY").
bool error_by_name(std::string_view name, CUresult* out);

}  // namespace vsr::emu

// Per-thread default stream variants: stream 0 means CU_STREAM_PER_THREAD.
VSR_EMU_EXPORT CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void* src, size_t n);
VSR_EMU_EXPORT CUresult cuMemcpyDtoH_v2_ptds(void* dst, CUdeviceptr src, size_t n);
VSR_EMU_EXPORT CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n);
VSR_EMU_EXPORT CUresult cuMemsetD8_v2_ptds(CUdeviceptr dst, unsigned char value, size_t n);
VSR_EMU_EXPORT CUresult cuMemsetD32_v2_ptds(CUdeviceptr dst, unsigned int value, size_t n);
VSR_EMU_EXPORT CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void* src, size_t n,
                                                  CUstream stream);
VSR_EMU_EXPORT CUresult cuMemcpyDtoHAsync_v2_ptsz(void* dst, CUdeviceptr src, size_t n,
                                                  CUstream stream);
VSR_EMU_EXPORT CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n,
                                                  CUstream stream);
VSR_EMU_EXPORT CUresult cuMemsetD8Async_ptsz(CUdeviceptr dst, unsigned char value, size_t n,
                                             CUstream stream);
VSR_EMU_EXPORT CUresult cuMemsetD32Async_ptsz(CUdeviceptr dst, unsigned int value, size_t n,
                                              CUstream stream);
VSR_EMU_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream stream);
VSR_EMU_EXPORT CUresult cuStreamQuery_ptsz(CUstream stream);
VSR_EMU_EXPORT CUresult cuStreamWaitEvent_ptsz(CUstream stream, CUevent event, unsigned int flags);
VSR_EMU_EXPORT CUresult cuEventRecord_ptsz(CUevent event, CUstream stream);
VSR_EMU_EXPORT CUresult cuLaunchHostFunc_ptsz(CUstream stream, CUhostFn fn, void* user_data);
VSR_EMU_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream stream);
VSR_EMU_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream);

// The old 4-argument cuGetProcAddress (PFN_cuGetProcAddress_v11030); cuda.h maps the name to _v2.
VSR_EMU_EXPORT CUresult legacy_cuGetProcAddress(const char* symbol, void** pfn, int cuda_version,
                                                cuuint64_t flags) __asm__("cuGetProcAddress");

// Old-ABI exports (32-bit sizes and pointers, §1.4). The emulator does not implement that ABI:
// these return CUDA_ERROR_NOT_SUPPORTED without reading their arguments, so they are declared
// without parameters. cuDevicePrimaryCtxRelease (7000) and cuEventElapsedTime (2000) have the
// same ABI and semantics as their successors and forward to them. The unsupported names, one
// X(name) each: declared here, defined in legacy_abi.cpp.
#define VSR_EMU_UNSUPPORTED_LEGACY_ENTRIES(X) \
  X(cuDeviceTotalMem)                         \
  X(cuMemGetInfo)                             \
  X(cuMemGetAddressRange)                     \
  X(cuMemAlloc)                               \
  X(cuMemFree)                                \
  X(cuMemAllocHost)                           \
  X(cuMemcpyHtoD)                             \
  X(cuMemcpyDtoH)                             \
  X(cuMemcpyDtoD)                             \
  X(cuMemcpyHtoDAsync)                        \
  X(cuMemcpyDtoHAsync)                        \
  X(cuMemcpyDtoDAsync)                        \
  X(cuMemsetD8)                               \
  X(cuMemsetD32)                              \
  X(cuStreamDestroy)                          \
  X(cuEventDestroy)
#define VSR_EMU_LEGACY_ENTRY(name) VSR_EMU_EXPORT CUresult legacy_##name() __asm__(#name);
VSR_EMU_UNSUPPORTED_LEGACY_ENTRIES(VSR_EMU_LEGACY_ENTRY)
#undef VSR_EMU_LEGACY_ENTRY
VSR_EMU_EXPORT CUresult
legacy_cuDevicePrimaryCtxRelease(CUdevice dev) __asm__("cuDevicePrimaryCtxRelease");
VSR_EMU_EXPORT CUresult legacy_cuEventElapsedTime(float* ms, CUevent start,
                                                  CUevent end) __asm__("cuEventElapsedTime");
