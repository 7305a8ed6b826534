// SPDX-License-Identifier: Apache-2.0
// The one placement rule (placement.hpp): where ops run. In the ops layer, since it asks whether
// the ops were built with CUDA.
#include "common/expects.hpp"
#include "common/text_escape.hpp"

#include <vibespatial/raster/driver.hpp>
#include <vibespatial/raster/errors.hpp>
#include <vibespatial/raster/memory.hpp>
#include <vibespatial/raster/ops.hpp>
#include <vibespatial/raster/placement.hpp>

#include <cuda.h>

#include <string>

namespace vibespatial::raster {

std::string_view to_string(Placement placement) noexcept {
  switch (placement) {
    case Placement::automatic:
      return "auto";
    case Placement::gpu:
      return "gpu";
    case Placement::cpu:
      return "cpu";
  }
  return "unknown";
}

Placement placement_from_string(std::string_view text) {
  if (text == "auto") return Placement::automatic;
  if (text == "gpu") return Placement::gpu;
  if (text == "cpu") return Placement::cpu;
  throw std::invalid_argument("placement must be auto, gpu or cpu, not '" +
                              detail::printable(std::string(text)) + "'");
}

PlacementDecision placed(Placement want) {
  const DriverInfo info = driver_info();
  PlacementDecision d = placed(want, info, ops_built_with_cuda());
  if (info.available) configure_memory_pool();
  return d;
}

PlacementDecision placed(Placement want, const DriverInfo& info, bool ops_with_cuda) {
  VSR_EXPECTS(want == Placement::automatic || want == Placement::gpu || want == Placement::cpu,
              "placed: not a Placement value");
  PlacementDecision d;
  d.emulated = info.available && info.emulated;
  const std::string device =
      info.devices.empty() ? std::string("?") : detail::printable(info.devices[0].name);
  if (want == Placement::gpu) {
    if (!info.available) {
      throw DriverUnavailableError(
          CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE",
          "placed: the device was asked for, but there is no usable CUDA driver: " +
              detail::printable(info.reason));
    }
    d.residency = Residency::device;
    d.reason = info.emulated ? "emulator (" + detail::printable(info.library) +
                                   "): device memory on the host emulator, as asked (emulated "
                                   "device ops)"
                             : "GPU " + device + ": device memory, as asked" +
                                   (ops_with_cuda ? " (CUDA ops)" : "");
  } else if (want == Placement::cpu) {
    d.reason = "host ops on the CPU, as asked";
  } else if (!info.available) {
    d.reason = "none (" + detail::printable(info.reason) + "): host ops on the CPU";
  } else if (info.emulated) {
    d.reason = "emulator (" + detail::printable(info.library) + "): host ops on the CPU";
  } else if (ops_with_cuda) {
    d.residency = Residency::device;
    d.reason = "GPU " + device + ": device ops (CUDA)";
  } else {
    d.reason = "GPU present, but this build has no CUDA ops: host ops on the CPU";
  }
  return d;
}

}  // namespace vibespatial::raster
