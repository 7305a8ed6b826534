// SPDX-License-Identifier: Apache-2.0
/**
 * @file placement.hpp
 * @brief The one placement rule: where an op runs (the host, or the device and which backend),
 * and in words why. Part of the ops layer: the rule asks whether the ops were built with CUDA
 * (ops_built_with_cuda, ops.hpp, which includes this header). The executors (tiles.hpp) take
 * the residency it chooses as TileRunOptions::placement and know nothing of the rule.
 */
#pragma once

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/driver.hpp>
#include <vibespatial/raster/export.hpp>

#include <string>
#include <string_view>

namespace vibespatial::raster {

/// Where a caller asks an op to run.
enum class Placement {
  automatic,  ///< the device when a real GPU and the CUDA ops are there, else the host
  gpu,        ///< the device (any usable driver, the host emulator included)
  cpu,        ///< the host
};

/// "auto", "gpu" or "cpu". Never throws.
VSR_EXPORT std::string_view to_string(Placement placement) noexcept;

/**
 * @brief "auto", "gpu" or "cpu" as a Placement.
 * @throws std::invalid_argument naming @p text otherwise.
 */
VSR_EXPORT Placement placement_from_string(std::string_view text);

/// The decision of placed(): where tiles live, and in words why.
struct PlacementDecision {
  Residency residency = Residency::host;
  std::string reason;     ///< e.g. "GPU NVIDIA H200: device ops (CUDA)", "none (...): host ops"
  bool emulated = false;  ///< the driver is the host emulator
};

/**
 * @brief The one placement rule. automatic: the device when a real (not emulated) driver with a
 * device is there and the ops were built with CUDA (ops_built_with_cuda), else the host (on the
 * host emulator the device ops are the emulated device backend: host work queued on the
 * emulator's streams, never faster than the host ops). gpu: the device whenever a driver is
 * usable; on the emulator the ops then run on the emulated device backend, so the whole device
 * path (residency moves, pinned staging, streams and events, the pool) runs as on a GPU. cpu:
 * the host. Configures the memory pool when a driver is usable.
 * @throws DriverUnavailableError for gpu without a usable driver; what configure_memory_pool
 *         throws. Thread-safe.
 */
VSR_EXPORT PlacementDecision placed(Placement want = Placement::automatic);

/**
 * @brief The rule of placed() on the facts given, which it would otherwise gather: @p driver
 * (driver_info(); its devices name the GPU in the reason) and @p ops_with_cuda
 * (ops_built_with_cuda()). It neither asks the driver nor configures the pool: for callers that
 * hold the facts already (the Python package asks the driver once per process) and for tests.
 * @throws DriverUnavailableError for gpu without a usable driver. Thread-safe.
 */
VSR_EXPORT PlacementDecision placed(Placement want, const DriverInfo& driver, bool ops_with_cuda);

}  // namespace vibespatial::raster
