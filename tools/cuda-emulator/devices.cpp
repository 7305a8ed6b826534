// SPDX-License-Identifier: Apache-2.0
// Initialization and devices: cuInit, the driver version, device count, handles, attributes (an
// H100-like 9.0 device whose feature attributes follow the options), name and capacity. Rules and
// error codes follow docs/cuda-driver-rules.md (cited as §n); the glossary and the locking rules
// are in emulator_state.hpp.
#include "emulator_state.hpp"

#include <cstdio>

namespace vsr::emu {

namespace {

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

/// Initializes the emulator (flags must be 0). Reads VSR_EMU_FAIL at the first call. With
/// VSR_EMU_DEVICE_COUNT=0 it fails with CUDA_ERROR_NO_DEVICE and the library stays uninitialized.
VSR_EMU_EXPORT CUresult cuInit(unsigned int flags) {
  {
    State& s = st();
    std::lock_guard lock(s.mutex);
    read_fail_env_once(s);
  }
  VSR_EMU_ENTRY("cuInit");
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
  VSR_EMU_ENTRY("cuDeviceGetCount");
  VSR_EMU_TRY(need_init(s));
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *count = s.config.device_count;
  return CUDA_SUCCESS;
}

/// Writes the device handle of `ordinal` (the ordinal itself).
VSR_EMU_EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  VSR_EMU_ENTRY("cuDeviceGet");
  VSR_EMU_TRY(need_init(s));
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  VSR_EMU_TRY(need_device(s, ordinal));
  *device = ordinal;
  return CUDA_SUCCESS;
}

/// Writes an attribute of `dev` (an H100-like 9.0 device; feature attributes follow the options).
VSR_EMU_EXPORT CUresult cuDeviceGetAttribute(int* value, CUdevice_attribute attrib, CUdevice dev) {
  VSR_EMU_ENTRY("cuDeviceGetAttribute");
  VSR_EMU_TRY(need_device(s, dev));
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  bool known = false;
  int v = attribute_value(s.config, dev, static_cast<int>(attrib), &known);
  if (!known) return CUDA_ERROR_INVALID_VALUE;
  *value = v;
  return CUDA_SUCCESS;
}

/// Writes the device name ("vibespatial-raster host emulator"), truncated to `len` bytes.
VSR_EMU_EXPORT CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  VSR_EMU_ENTRY("cuDeviceGetName");
  VSR_EMU_TRY(need_device(s, dev));
  if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  std::snprintf(name, static_cast<size_t>(len), "%s", "vibespatial-raster host emulator");
  return CUDA_SUCCESS;
}

/// Writes the emulated capacity of `dev` (VSR_EMU_DEVICE_MEMORY).
VSR_EMU_EXPORT CUresult cuDeviceTotalMem(size_t* bytes, CUdevice dev) {
  VSR_EMU_ENTRY("cuDeviceTotalMem");
  VSR_EMU_TRY(need_device(s, dev));
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *bytes = s.config.device_memory;
  return CUDA_SUCCESS;
}
