// SPDX-License-Identifier: Apache-2.0
// The VRAM budget: what the driver reports free plus what the pool holds free, minus headroom.
#include "driver/cuda_driver.hpp"

#include <vibespatial/raster/dispatch.hpp>
#include <vibespatial/raster/memory.hpp>

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
    // Pages the pool holds free are usable by the next pass but invisible to cuMemGetInfo
    // (memory.hpp's public snapshot: dispatch reads the pool through its interface only).
    const auto held =
        static_cast<unsigned __int128>(free_bytes) + memory_pool_stats(device).pool_free_bytes;
    return static_cast<std::uint64_t>(held * 85 / 100);
  } catch (...) {
    return 0;
  }
}

}  // namespace vibespatial::raster
