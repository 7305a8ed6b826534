// SPDX-License-Identifier: Apache-2.0
// Size classes of small blocks: multiples of 512 bytes up to 4 KiB, then eight classes per
// doubling (so rounding wastes at most 12.5%). Every class size is a multiple of 512, so slots
// carved from a granule-aligned page are 512-byte aligned.
#pragma once

#include <bit>
#include <cstddef>

namespace vibespatial::raster::detail {

inline constexpr std::size_t kSmallQuantum = 512;
inline constexpr int kMaxSizeClasses = 96;

/// The class index of a request of `bytes` (1 <= bytes).
constexpr int size_class_of(std::size_t bytes) noexcept {
  if (bytes <= 4096) return static_cast<int>((bytes + kSmallQuantum - 1) / kSmallQuantum) - 1;
  const int p = static_cast<int>(std::bit_width(bytes - 1)) - 1;  // 2^p < bytes <= 2^(p+1)
  const std::size_t step = std::size_t{1} << (p - 3);             // eight steps per doubling
  const std::size_t rounded = (bytes + step - 1) / step * step;
  const int k = static_cast<int>((rounded - (std::size_t{1} << p)) / step);  // 1..8
  return 8 + (p - 12) * 8 + (k - 1);
}

/// The slot size of class `index`.
constexpr std::size_t size_class_bytes(int index) noexcept {
  if (index < 8) return static_cast<std::size_t>(index + 1) * kSmallQuantum;
  const int p = 12 + (index - 8) / 8;
  const int k = (index - 8) % 8 + 1;
  return (std::size_t{1} << p) + static_cast<std::size_t>(k) * (std::size_t{1} << (p - 3));
}

}  // namespace vibespatial::raster::detail
