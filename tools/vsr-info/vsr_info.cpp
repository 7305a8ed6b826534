// SPDX-License-Identifier: Apache-2.0
// vsr-info: what CUDA driver and devices vibespatial-raster sees.
//
//   vsr-info          a readable report
//   vsr-info --json   the same as one JSON object
//
// Exit status: 0 when a driver and at least one device are available, 1 when not (the report
// says why), 2 on bad arguments.
#include "escape.hpp"
#include "format.hpp"

#include <vibespatial/raster/driver.hpp>

#include <cstdio>
#include <cstring>
#include <string>

namespace vsr = vibespatial::raster;
using vsr_cli::format_bytes;
using vsr_cli::json_string;
using vsr_cli::printable;

namespace {

std::string version_string(int v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

void print_json(const vsr::DriverInfo& info) {
  std::printf("{\"available\": %s, \"library\": %s, \"emulated\": %s, ",
              info.available ? "true" : "false", json_string(info.library).c_str(),
              info.emulated ? "true" : "false");
  std::printf("\"reason\": %s, \"driver_version\": %d, \"devices\": [",
              json_string(info.reason).c_str(), info.driver_version);
  for (std::size_t i = 0; i < info.devices.size(); ++i) {
    const vsr::DeviceInfo& d = info.devices[i];
    std::printf(
        "%s{\"ordinal\": %d, \"name\": %s, \"compute_capability\": \"%d.%d\", "
        "\"vmm\": %s, \"managed\": %s, \"memory_pools\": %s, \"granularity\": %zu, "
        "\"recommended_granularity\": %zu, \"free_bytes\": %zu, \"total_bytes\": %zu}",
        i ? ", " : "", d.ordinal, json_string(d.name).c_str(), d.compute_capability_major,
        d.compute_capability_minor, d.virtual_memory_management ? "true" : "false",
        d.managed_memory ? "true" : "false", d.memory_pools ? "true" : "false", d.granularity,
        d.recommended_granularity, d.free_bytes, d.total_bytes);
  }
  std::printf("]}\n");
}

void print_text(const vsr::DriverInfo& info) {
  if (!info.available) {
    std::printf("CUDA driver: not available\n");
    std::printf("  library tried: %s\n", printable(info.library).c_str());
    std::printf("  reason:        %s\n", printable(info.reason).c_str());
    std::printf("No GPU is usable here. GPU work will fail with a clear error; CPU paths work.\n");
    std::printf("To run on the host driver emulator instead:\n");
    std::printf("  VIBESPATIAL_CUDA_DRIVER=/path/to/libvsr-cuda-emulator.so vsr-info\n");
    return;
  }
  std::printf("CUDA driver: %s (CUDA %s)\n", printable(info.library).c_str(),
              version_string(info.driver_version).c_str());
  if (info.emulated) {
    std::printf(
        "  EMULATED: this is the vibespatial-raster host driver emulator; \"device\"\n"
        "  memory is host memory and no GPU is in use.\n");
  }
  std::printf("Devices: %zu\n", info.devices.size());
  for (const vsr::DeviceInfo& d : info.devices) {
    std::printf("  [%d] %s, compute capability %d.%d\n", d.ordinal, printable(d.name).c_str(),
                d.compute_capability_major, d.compute_capability_minor);
    std::printf("      virtual memory management: %s\n",
                d.virtual_memory_management ? "yes" : "no (the pool uses the fallback tier)");
    std::printf("      managed memory:            %s\n", d.managed_memory ? "yes" : "no");
    std::printf("      stream-ordered pools:      %s\n", d.memory_pools ? "yes" : "no");
    if (d.virtual_memory_management) {
      std::printf("      granularity:               %s (recommended %s)\n",
                  format_bytes(d.granularity).c_str(),
                  format_bytes(d.recommended_granularity).c_str());
    }
    std::printf("      memory:                    %s free of %s\n",
                format_bytes(d.free_bytes).c_str(), format_bytes(d.total_bytes).c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::printf(
          "usage: vsr-info [--json]\n"
          "Reports the CUDA driver and devices vibespatial-raster sees.\n"
          "Environment: VIBESPATIAL_CUDA_DRIVER names the driver library (default "
          "libcuda.so.1).\n");
      return 0;
    } else {
      std::fprintf(stderr, "vsr-info: unknown argument '%s' (try --help)\n",
                   printable(argv[i]).c_str());
      return 2;
    }
  }
  const vsr::DriverInfo info = vsr::driver_info();
  if (json) {
    print_json(info);
  } else {
    print_text(info);
  }
  return info.available ? 0 : 1;
}
