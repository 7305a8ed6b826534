// SPDX-License-Identifier: Apache-2.0
// The conformance suite's own driver loader: dlopen + cuGetProcAddress_v2 at pinned versions.
// It deliberately shares no code with src/driver/, so a loader bug there cannot hide here.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <string>
#include <vector>

namespace vsr_conf {

// X(base name, exported symbol that version resolves to, pinned version). The PFN type is
// PFN_<base>_v<version> from cudaTypedefs.h; the exported name is what dlsym must agree with
// (semantics §2.2 version table).
#define VSR_CONF_ENTRIES(X)                                                                \
  X(cuInit, cuInit, 2000)                                                                  \
  X(cuDriverGetVersion, cuDriverGetVersion, 2020)                                          \
  X(cuDeviceGet, cuDeviceGet, 2000)                                                        \
  X(cuDeviceGetCount, cuDeviceGetCount, 2000)                                              \
  X(cuDeviceGetAttribute, cuDeviceGetAttribute, 2000)                                      \
  X(cuDeviceTotalMem, cuDeviceTotalMem_v2, 3020)                                           \
  X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, 7000)                              \
  X(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2, 11000)                        \
  X(cuCtxSetCurrent, cuCtxSetCurrent, 4000)                                                \
  X(cuCtxGetCurrent, cuCtxGetCurrent, 4000)                                                \
  X(cuCtxGetDevice, cuCtxGetDevice, 2000)                                                  \
  X(cuCtxSynchronize, cuCtxSynchronize, 2000)                                              \
  X(cuMemGetInfo, cuMemGetInfo_v2, 3020)                                                   \
  X(cuMemGetAllocationGranularity, cuMemGetAllocationGranularity, 10020)                   \
  X(cuMemAddressReserve, cuMemAddressReserve, 10020)                                       \
  X(cuMemAddressFree, cuMemAddressFree, 10020)                                             \
  X(cuMemCreate, cuMemCreate, 10020)                                                       \
  X(cuMemRelease, cuMemRelease, 10020)                                                     \
  X(cuMemMap, cuMemMap, 10020)                                                             \
  X(cuMemUnmap, cuMemUnmap, 10020)                                                         \
  X(cuMemSetAccess, cuMemSetAccess, 10020)                                                 \
  X(cuMemGetAccess, cuMemGetAccess, 10020)                                                 \
  X(cuMemGetAllocationPropertiesFromHandle, cuMemGetAllocationPropertiesFromHandle, 10020) \
  X(cuMemRetainAllocationHandle, cuMemRetainAllocationHandle, 11000)                       \
  X(cuMemAlloc, cuMemAlloc_v2, 3020)                                                       \
  X(cuMemFree, cuMemFree_v2, 3020)                                                         \
  X(cuMemAllocManaged, cuMemAllocManaged, 6000)                                            \
  X(cuMemAllocAsync, cuMemAllocAsync, 11020)                                               \
  X(cuMemFreeAsync, cuMemFreeAsync, 11020)                                                 \
  X(cuMemHostAlloc, cuMemHostAlloc, 2020)                                                  \
  X(cuMemFreeHost, cuMemFreeHost, 2000)                                                    \
  X(cuMemGetAddressRange, cuMemGetAddressRange_v2, 3020)                                   \
  X(cuMemcpyHtoD, cuMemcpyHtoD_v2, 3020)                                                   \
  X(cuMemcpyDtoH, cuMemcpyDtoH_v2, 3020)                                                   \
  X(cuMemcpyDtoD, cuMemcpyDtoD_v2, 3020)                                                   \
  X(cuMemcpyHtoDAsync, cuMemcpyHtoDAsync_v2, 3020)                                         \
  X(cuMemcpyDtoHAsync, cuMemcpyDtoHAsync_v2, 3020)                                         \
  X(cuMemcpyDtoDAsync, cuMemcpyDtoDAsync_v2, 3020)                                         \
  X(cuMemsetD8, cuMemsetD8_v2, 3020)                                                       \
  X(cuMemsetD8Async, cuMemsetD8Async, 3020)                                                \
  X(cuStreamCreate, cuStreamCreate, 2000)                                                  \
  X(cuStreamSynchronize, cuStreamSynchronize, 2000)                                        \
  X(cuStreamQuery, cuStreamQuery, 2000)                                                    \
  X(cuStreamDestroy, cuStreamDestroy_v2, 4000)                                             \
  X(cuStreamWaitEvent, cuStreamWaitEvent, 3020)                                            \
  X(cuLaunchHostFunc, cuLaunchHostFunc, 10000)                                             \
  X(cuEventCreate, cuEventCreate, 2000)                                                    \
  X(cuEventRecord, cuEventRecord, 2000)                                                    \
  X(cuEventQuery, cuEventQuery, 2000)                                                      \
  X(cuEventSynchronize, cuEventSynchronize, 2000)                                          \
  X(cuEventDestroy, cuEventDestroy_v2, 4000)                                               \
  X(cuGetErrorName, cuGetErrorName, 6000)                                                  \
  X(cuGetErrorString, cuGetErrorString, 6000)

// How one pinned entry point resolved (before cuInit: see main.cpp).
struct Resolution {
  const char* base;
  const char* exported;
  int version;
  CUresult result;
  CUdriverProcAddressQueryResult status;
  void* pfn;
};

struct Driver {
  void* library = nullptr;
  std::string path;
  PFN_cuGetProcAddress_v12000 cuGetProcAddress_v2 = nullptr;
#define VSR_CONF_FIELD(base, exported, version) PFN_##base##_v##version base = nullptr;
  VSR_CONF_ENTRIES(VSR_CONF_FIELD)
#undef VSR_CONF_FIELD
  std::vector<Resolution> resolutions;

  // dlsym of an exported name in the loaded library (nullptr when absent).
  void* exported(const char* name) const;
};

// Opens the library named by VIBESPATIAL_CUDA_DRIVER (empty or unset: "libcuda.so.1") and
// resolves every entry; unresolved entries are bound to a stub returning CUDA_ERROR_NOT_FOUND so
// the cases that use them fail by name instead of crashing. Returns false (reason in *why) only
// when the library or cuGetProcAddress_v2 itself is missing.
bool load_driver(Driver& d, std::string* why);

}  // namespace vsr_conf
