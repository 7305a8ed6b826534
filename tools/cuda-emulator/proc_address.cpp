// SPDX-License-Identifier: Apache-2.0
// cuGetProcAddress (both ABIs) and the error-name tables (docs/cuda-driver-rules.md §2,
// §3.8).
#include "emulator_internal.hpp"

#include <cstring>
#include <string_view>

namespace {

struct ErrorRow {
  int value;
  const char* name;
  const char* text;
};

constexpr ErrorRow kErrors[] = {
#include "error_table.inc"
};

const ErrorRow* find_error(CUresult error) {
  for (const ErrorRow& row : kErrors) {
    if (row.value == static_cast<int>(error)) return &row;
  }
  return nullptr;
}

// One ABI of a base name: introduced at `version`; `per_thread` (if any) is the _ptds/_ptsz form,
// available from `per_thread_version`.
struct ProcEntry {
  const char* name;
  int version;
  void* fn;
  void* per_thread;
  int per_thread_version;
};

template <typename F>
void* fp(F* f) {
  return reinterpret_cast<void*>(f);
}

// From the PFN_<name>_v<ver> typedefs of the 13.0 cudaTypedefs.h (§2.2 table).
const ProcEntry kProcs[] = {
    {"cuCtxGetCurrent", 4000, fp(cuCtxGetCurrent), nullptr, 0},
    {"cuCtxGetDevice", 2000, fp(cuCtxGetDevice), nullptr, 0},
    {"cuCtxGetDevice", 13000, fp(cuCtxGetDevice_v2), nullptr, 0},
    {"cuCtxSetCurrent", 4000, fp(cuCtxSetCurrent), nullptr, 0},
    {"cuCtxSynchronize", 2000, fp(cuCtxSynchronize), nullptr, 0},
    {"cuCtxSynchronize", 13000, fp(cuCtxSynchronize_v2), nullptr, 0},
    {"cuDeviceGet", 2000, fp(cuDeviceGet), nullptr, 0},
    {"cuDeviceGetAttribute", 2000, fp(cuDeviceGetAttribute), nullptr, 0},
    {"cuDeviceGetCount", 2000, fp(cuDeviceGetCount), nullptr, 0},
    {"cuDeviceGetName", 2000, fp(cuDeviceGetName), nullptr, 0},
    {"cuDevicePrimaryCtxGetState", 7000, fp(cuDevicePrimaryCtxGetState), nullptr, 0},
    {"cuDevicePrimaryCtxRelease", 7000, fp(legacy_cuDevicePrimaryCtxRelease), nullptr, 0},
    {"cuDevicePrimaryCtxRelease", 11000, fp(cuDevicePrimaryCtxRelease), nullptr, 0},
    {"cuDevicePrimaryCtxRetain", 7000, fp(cuDevicePrimaryCtxRetain), nullptr, 0},
    {"cuDeviceTotalMem", 2000, fp(legacy_cuDeviceTotalMem), nullptr, 0},
    {"cuDeviceTotalMem", 3020, fp(cuDeviceTotalMem), nullptr, 0},
    {"cuDriverGetVersion", 2020, fp(cuDriverGetVersion), nullptr, 0},
    {"cuEventCreate", 2000, fp(cuEventCreate), nullptr, 0},
    {"cuEventDestroy", 2000, fp(legacy_cuEventDestroy), nullptr, 0},
    {"cuEventDestroy", 4000, fp(cuEventDestroy), nullptr, 0},
    {"cuEventElapsedTime", 2000, fp(legacy_cuEventElapsedTime), nullptr, 0},
    {"cuEventElapsedTime", 12080, fp(cuEventElapsedTime), nullptr, 0},
    {"cuEventQuery", 2000, fp(cuEventQuery), nullptr, 0},
    {"cuEventRecord", 2000, fp(cuEventRecord), fp(cuEventRecord_ptsz), 7000},
    {"cuEventSynchronize", 2000, fp(cuEventSynchronize), nullptr, 0},
    {"cuGetErrorName", 6000, fp(cuGetErrorName), nullptr, 0},
    {"cuGetErrorString", 6000, fp(cuGetErrorString), nullptr, 0},
    {"cuGetProcAddress", 11030, fp(legacy_cuGetProcAddress), nullptr, 0},
    {"cuGetProcAddress", 12000, fp(cuGetProcAddress), nullptr, 0},
    {"cuInit", 2000, fp(cuInit), nullptr, 0},
    {"cuLaunchHostFunc", 10000, fp(cuLaunchHostFunc), fp(cuLaunchHostFunc_ptsz), 10000},
    {"cuMemAddressFree", 10020, fp(cuMemAddressFree), nullptr, 0},
    {"cuMemAddressReserve", 10020, fp(cuMemAddressReserve), nullptr, 0},
    {"cuMemAlloc", 2000, fp(legacy_cuMemAlloc), nullptr, 0},
    {"cuMemAlloc", 3020, fp(cuMemAlloc), nullptr, 0},
    {"cuMemAllocAsync", 11020, fp(cuMemAllocAsync), fp(cuMemAllocAsync_ptsz), 11020},
    {"cuMemAllocHost", 2000, fp(legacy_cuMemAllocHost), nullptr, 0},
    {"cuMemAllocHost", 3020, fp(cuMemAllocHost), nullptr, 0},
    {"cuMemAllocManaged", 6000, fp(cuMemAllocManaged), nullptr, 0},
    {"cuMemCreate", 10020, fp(cuMemCreate), nullptr, 0},
    {"cuMemFree", 2000, fp(legacy_cuMemFree), nullptr, 0},
    {"cuMemFree", 3020, fp(cuMemFree), nullptr, 0},
    {"cuMemFreeAsync", 11020, fp(cuMemFreeAsync), fp(cuMemFreeAsync_ptsz), 11020},
    {"cuMemFreeHost", 2000, fp(cuMemFreeHost), nullptr, 0},
    {"cuMemGetAccess", 10020, fp(cuMemGetAccess), nullptr, 0},
    {"cuMemGetAddressRange", 2000, fp(legacy_cuMemGetAddressRange), nullptr, 0},
    {"cuMemGetAddressRange", 3020, fp(cuMemGetAddressRange), nullptr, 0},
    {"cuMemGetAllocationGranularity", 10020, fp(cuMemGetAllocationGranularity), nullptr, 0},
    {"cuMemGetAllocationPropertiesFromHandle", 10020, fp(cuMemGetAllocationPropertiesFromHandle),
     nullptr, 0},
    {"cuMemGetInfo", 2000, fp(legacy_cuMemGetInfo), nullptr, 0},
    {"cuMemGetInfo", 3020, fp(cuMemGetInfo), nullptr, 0},
    {"cuMemHostAlloc", 2020, fp(cuMemHostAlloc), nullptr, 0},
    {"cuMemMap", 10020, fp(cuMemMap), nullptr, 0},
    {"cuMemRelease", 10020, fp(cuMemRelease), nullptr, 0},
    {"cuMemRetainAllocationHandle", 11000, fp(cuMemRetainAllocationHandle), nullptr, 0},
    {"cuMemSetAccess", 10020, fp(cuMemSetAccess), nullptr, 0},
    {"cuMemUnmap", 10020, fp(cuMemUnmap), nullptr, 0},
    {"cuMemcpyDtoD", 2000, fp(legacy_cuMemcpyDtoD), nullptr, 0},
    {"cuMemcpyDtoD", 3020, fp(cuMemcpyDtoD), fp(cuMemcpyDtoD_v2_ptds), 7000},
    {"cuMemcpyDtoDAsync", 3000, fp(legacy_cuMemcpyDtoDAsync), nullptr, 0},
    {"cuMemcpyDtoDAsync", 3020, fp(cuMemcpyDtoDAsync), fp(cuMemcpyDtoDAsync_v2_ptsz), 7000},
    {"cuMemcpyDtoH", 2000, fp(legacy_cuMemcpyDtoH), nullptr, 0},
    {"cuMemcpyDtoH", 3020, fp(cuMemcpyDtoH), fp(cuMemcpyDtoH_v2_ptds), 7000},
    {"cuMemcpyDtoHAsync", 2000, fp(legacy_cuMemcpyDtoHAsync), nullptr, 0},
    {"cuMemcpyDtoHAsync", 3020, fp(cuMemcpyDtoHAsync), fp(cuMemcpyDtoHAsync_v2_ptsz), 7000},
    {"cuMemcpyHtoD", 2000, fp(legacy_cuMemcpyHtoD), nullptr, 0},
    {"cuMemcpyHtoD", 3020, fp(cuMemcpyHtoD), fp(cuMemcpyHtoD_v2_ptds), 7000},
    {"cuMemcpyHtoDAsync", 2000, fp(legacy_cuMemcpyHtoDAsync), nullptr, 0},
    {"cuMemcpyHtoDAsync", 3020, fp(cuMemcpyHtoDAsync), fp(cuMemcpyHtoDAsync_v2_ptsz), 7000},
    {"cuMemsetD32", 2000, fp(legacy_cuMemsetD32), nullptr, 0},
    {"cuMemsetD32", 3020, fp(cuMemsetD32), fp(cuMemsetD32_v2_ptds), 7000},
    {"cuMemsetD32Async", 3020, fp(cuMemsetD32Async), fp(cuMemsetD32Async_ptsz), 7000},
    {"cuMemsetD8", 2000, fp(legacy_cuMemsetD8), nullptr, 0},
    {"cuMemsetD8", 3020, fp(cuMemsetD8), fp(cuMemsetD8_v2_ptds), 7000},
    {"cuMemsetD8Async", 3020, fp(cuMemsetD8Async), fp(cuMemsetD8Async_ptsz), 7000},
    {"cuStreamCreate", 2000, fp(cuStreamCreate), nullptr, 0},
    {"cuStreamDestroy", 2000, fp(legacy_cuStreamDestroy), nullptr, 0},
    {"cuStreamDestroy", 4000, fp(cuStreamDestroy), nullptr, 0},
    {"cuStreamQuery", 2000, fp(cuStreamQuery), fp(cuStreamQuery_ptsz), 7000},
    {"cuStreamSynchronize", 2000, fp(cuStreamSynchronize), fp(cuStreamSynchronize_ptsz), 7000},
    {"cuStreamWaitEvent", 3020, fp(cuStreamWaitEvent), fp(cuStreamWaitEvent_ptsz), 7000},
};

// The lookup of §2.2: the ABI with the largest introduction version <= cuda_version.
CUdriverProcAddressQueryResult resolve(const char* symbol, int cuda_version, bool per_thread,
                                       void** pfn) {
  const ProcEntry* best = nullptr;
  bool known = false;
  for (const ProcEntry& entry : kProcs) {
    if (std::strcmp(entry.name, symbol) != 0) continue;
    known = true;
    if (entry.version <= cuda_version && (best == nullptr || entry.version > best->version)) {
      best = &entry;
    }
  }
  *pfn = nullptr;
  if (!known) return CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  if (best == nullptr) return CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
  *pfn = (per_thread && best->per_thread != nullptr && best->per_thread_version <= cuda_version)
             ? best->per_thread
             : best->fn;
  return CU_GET_PROC_ADDRESS_SUCCESS;
}

constexpr cuuint64_t kKnownProcFlags =
    CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;

// Both ABIs of cuGetProcAddress: the argument checks and the lookup, its outcome in *result.
CUresult get_proc_address(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                          CUdriverProcAddressQueryResult* result) {
  CUresult injected = vsr::emu::begin_call("cuGetProcAddress");
  if (injected != CUDA_SUCCESS) return injected;
  if (symbol == nullptr || pfn == nullptr || (flags & ~kKnownProcFlags) != 0 ||
      cuda_version > vsr::emu::driver_version()) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *result = resolve(symbol, cuda_version,
                    (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0, pfn);
  return CUDA_SUCCESS;
}

// cuGetErrorName and cuGetErrorString: the `field` of `error`'s row.
CUresult error_text(const char* entry, const char* ErrorRow::*field, CUresult error,
                    const char** str) {
  CUresult injected = vsr::emu::begin_call(entry);
  if (injected != CUDA_SUCCESS) return injected;
  if (str == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorRow* row = find_error(error);
  *str = row != nullptr ? row->*field : nullptr;
  return row != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

}  // namespace

namespace vsr::emu {

bool error_by_name(std::string_view name, CUresult* out) {
  for (const ErrorRow& row : kErrors) {
    if (name == row.name) {
      *out = static_cast<CUresult>(row.value);
      return true;
    }
  }
  return false;
}

}  // namespace vsr::emu

/// Writes the enumerator name of `error` to *str; unknown codes give INVALID_VALUE and NULL.
/// Works before cuInit.
VSR_EMU_EXPORT CUresult cuGetErrorName(CUresult error, const char** str) {
  return error_text("cuGetErrorName", &ErrorRow::name, error, str);
}

/// Writes a description of `error` to *str; unknown codes give INVALID_VALUE and NULL.
/// Works before cuInit.
VSR_EMU_EXPORT CUresult cuGetErrorString(CUresult error, const char** str) {
  return error_text("cuGetErrorString", &ErrorRow::text, error, str);
}

/// cuGetProcAddress_v2 (12000): resolves a base name at an ABI version (§2.2). Unknown names and
/// too-low versions succeed with *pfn = NULL and the reason in *status; a version above the
/// driver's is INVALID_VALUE. Works before cuInit.
VSR_EMU_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int cuda_version,
                                         cuuint64_t flags, CUdriverProcAddressQueryResult* status) {
  CUdriverProcAddressQueryResult result{};
  CUresult r = get_proc_address(symbol, pfn, cuda_version, flags, &result);
  if (r == CUDA_SUCCESS && status != nullptr) *status = result;
  return r;
}

/// The old 4-argument cuGetProcAddress (11030): as _v2, but a symbol that cannot be resolved is
/// CUDA_ERROR_NOT_FOUND (11.x behaviour, §2.2).
CUresult legacy_cuGetProcAddress(const char* symbol, void** pfn, int cuda_version,
                                 cuuint64_t flags) {
  CUdriverProcAddressQueryResult result{};
  CUresult r = get_proc_address(symbol, pfn, cuda_version, flags, &result);
  if (r != CUDA_SUCCESS) return r;
  return result == CU_GET_PROC_ADDRESS_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
