// SPDX-License-Identifier: Apache-2.0
// Overflow-checked byte arithmetic for sizes that come from user input (raster dimensions, band
// counts, buffers per band).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace vibespatial::raster::detail {

/// x * y, or std::overflow_error "<what> does not fit in 64 bits".
inline std::uint64_t checked_mul(std::uint64_t x, std::uint64_t y, const char* what) {
  std::uint64_t product = 0;
  if (__builtin_mul_overflow(x, y, &product)) {
    throw std::overflow_error(std::string(what) + " does not fit in 64 bits");
  }
  return product;
}

/// x + y, or std::overflow_error "<what> does not fit in 64 bits".
inline std::uint64_t checked_add(std::uint64_t x, std::uint64_t y, const char* what) {
  std::uint64_t sum = 0;
  if (__builtin_add_overflow(x, y, &sum)) {
    throw std::overflow_error(std::string(what) + " does not fit in 64 bits");
  }
  return sum;
}

}  // namespace vibespatial::raster::detail
