// SPDX-License-Identifier: Apache-2.0
// What the runtime knows about the CUDA driver it loaded (or failed to load).
#pragma once

#include <vibespatial/raster/export.hpp>

#include <cstddef>
#include <string>
#include <vector>

namespace vibespatial::raster {

/// One device as the driver reports it.
struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
  bool virtual_memory_management =
      false;                    ///< CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
  bool managed_memory = false;  ///< CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY
  bool memory_pools = false;    ///< CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED
  std::size_t granularity = 0;  ///< minimum VMM granularity of device memory; 0 without VMM
  std::size_t recommended_granularity = 0;
  std::size_t free_bytes = 0;  ///< cuMemGetInfo in the device's primary context
  std::size_t total_bytes = 0;
};

/// The driver the runtime loaded, or why it could not.
struct DriverInfo {
  bool available = false;  ///< a driver was loaded, cuInit succeeded and a device exists
  std::string library;     ///< the library name or path that was dlopen'ed
  std::string reason;      ///< why the driver is unavailable; empty when available
  bool emulated = false;   ///< the library is the vibespatial-raster host emulator
  int driver_version = 0;  ///< cuDriverGetVersion: 1000*major + 10*minor
  std::vector<DeviceInfo> devices;
};

/// Loads the driver on first use and describes it. Never throws: with no driver or no device it
/// returns `available == false` and a reason. A failed start is not kept: until the driver is
/// available, each call (of this or of any call that needs the driver) starts it again: cuInit
/// and the device count are called again, and a library that could not be loaded is looked for
/// again under the VIBESPATIAL_CUDA_DRIVER of that moment. A library that loaded is kept for the
/// life of the process (never loaded again); one that lacks a required entry point stays
/// refused. Device queries bind the device's primary context to no thread; they retain it for
/// the life of the process. Thread-safe: racing first calls see one outcome.
VSR_EXPORT DriverInfo driver_info() noexcept;

}  // namespace vibespatial::raster
