// SPDX-License-Identifier: Apache-2.0
// Replaced by the pool-aware budget (issue 4)
#include <vibespatial/raster/dispatch.hpp>

#include <cstdint>

namespace vibespatial::raster {

std::uint64_t available_vram_bytes() noexcept {
  return 0;
}

}  // namespace vibespatial::raster
