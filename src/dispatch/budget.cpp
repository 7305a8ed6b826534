// SPDX-License-Identifier: Apache-2.0
// The VRAM budget: what the driver reports free plus what the pool holds free, minus headroom.
#include "driver/cuda_driver.hpp"
#include "memory/pool_registry.hpp"

#include <vibespatial/raster/dispatch.hpp>

#include <cstdint>

namespace vibespatial::raster {

std::uint64_t available_vram_bytes() noexcept {
  try {
    const detail::DriverState& state = detail::driver_state();
    if (!state.available) return 0;
    const int device = detail::bind_current_device();
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
    if (state.api.cuMemGetInfo(&free_bytes, &total_bytes) != CUDA_SUCCESS) return 0;
    // Pages the pool holds free are usable by the next pass but invisible to cuMemGetInfo.
    const auto held = static_cast<unsigned __int128>(free_bytes) + detail::pool_free_bytes(device);
    return static_cast<std::uint64_t>(held * 85 / 100);
  } catch (...) {
    return 0;
  }
}

}  // namespace vibespatial::raster
