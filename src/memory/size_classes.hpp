// SPDX-License-Identifier: Apache-2.0
// Size classes of small blocks: multiples of 256 bytes up to 4 KiB, then eight classes per
// doubling (so rounding wastes at most 12.5%, 6% on average for sizes spread evenly). Every class
// size is a multiple of 256, so slots carved from a granule-aligned page are 256-byte aligned,
// the alignment memory.hpp promises (that of cuMemAlloc).
#pragma once

#include <bit>
#include <cstddef>

namespace vibespatial::raster::detail {

inline constexpr std::size_t kSmallQuantum = 256;
inline constexpr int kLinearClasses = 4096 / kSmallQuantum;  // the classes up to 4 KiB
inline constexpr int kMaxSizeClasses = 96;

/// The class index of a request of `bytes` (1 <= bytes).
constexpr int size_class_of(std::size_t bytes) noexcept {
  if (bytes <= 4096) return static_cast<int>((bytes + kSmallQuantum - 1) / kSmallQuantum) - 1;
  const int p = static_cast<int>(std::bit_width(bytes - 1)) - 1;  // 2^p < bytes <= 2^(p+1)
  const std::size_t step = std::size_t{1} << (p - 3);             // eight steps per doubling
  const std::size_t rounded = (bytes + step - 1) / step * step;
  const int k = static_cast<int>((rounded - (std::size_t{1} << p)) / step);  // 1..8
  return kLinearClasses + (p - 12) * 8 + (k - 1);
}

/// The slot size of class `index`.
constexpr std::size_t size_class_bytes(int index) noexcept {
  if (index < kLinearClasses) return static_cast<std::size_t>(index + 1) * kSmallQuantum;
  const int p = 12 + (index - kLinearClasses) / 8;
  const int k = (index - kLinearClasses) % 8 + 1;
  return (std::size_t{1} << p) + static_cast<std::size_t>(k) * (std::size_t{1} << (p - 3));
}

// Every class fits, up to the largest small block (1 MiB), and each size maps to the smallest
// class that holds it.
static_assert(size_class_of(std::size_t{1} << 20) < kMaxSizeClasses);
static_assert(size_class_bytes(size_class_of(4097)) == 4608);
static_assert(size_class_bytes(size_class_of(257)) == 512);
static_assert(size_class_of(4096) == kLinearClasses - 1 && size_class_of(4097) == kLinearClasses);

}  // namespace vibespatial::raster::detail
