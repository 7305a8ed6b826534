// SPDX-License-Identifier: Apache-2.0
// DType, Affine and RasterMetadata functions.
#include <vibespatial/raster/buffers.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace vibespatial::raster {

namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  std::size_t itemsize;
};

// Indexed by the enumerator value.
constexpr std::array<DTypeInfo, 10> dtype_table{{
    {DType::uint8, "uint8", 1},
    {DType::int8, "int8", 1},
    {DType::uint16, "uint16", 2},
    {DType::int16, "int16", 2},
    {DType::uint32, "uint32", 4},
    {DType::int32, "int32", 4},
    {DType::uint64, "uint64", 8},
    {DType::int64, "int64", 8},
    {DType::float32, "float32", 4},
    {DType::float64, "float64", 8},
}};

constexpr bool table_is_indexed_by_value() {
  for (std::size_t i = 0; i < dtype_table.size(); ++i) {
    if (static_cast<std::size_t>(dtype_table[i].dtype) != i) return false;
  }
  return true;
}
static_assert(table_is_indexed_by_value());

const DTypeInfo* find_info(DType dtype) noexcept {
  const auto index = static_cast<std::size_t>(dtype);
  return index < dtype_table.size() ? &dtype_table[index] : nullptr;
}

}  // namespace

std::size_t itemsize(DType dtype) {
  const DTypeInfo* info = find_info(dtype);
  if (info == nullptr) {
    throw std::invalid_argument("dtype: not a DType value (" +
                                std::to_string(static_cast<unsigned>(dtype)) + ")");
  }
  return info->itemsize;
}

std::string_view to_string(DType dtype) noexcept {
  const DTypeInfo* info = find_info(dtype);
  return info == nullptr ? std::string_view("unknown") : info->name;
}

std::optional<DType> dtype_from_string(std::string_view name) noexcept {
  for (const DTypeInfo& info : dtype_table) {
    if (info.name == name) return info.dtype;
  }
  return std::nullopt;
}

Affine Affine::from_gdal(const std::array<double, 6>& gt) noexcept {
  return Affine{gt[1], gt[2], gt[0], gt[4], gt[5], gt[3]};
}

std::array<double, 6> Affine::to_gdal() const noexcept {
  return {c, a, b, f, d, e};
}

std::array<double, 2> Affine::apply(double col, double row) const noexcept {
  return {a * col + b * row + c, d * col + e * row + f};
}

std::int64_t RasterMetadata::pixel_count() const {
  std::int64_t pixels = 0;
  if (__builtin_mul_overflow(height, width, &pixels)) {
    throw std::overflow_error("pixel_count: " + std::to_string(height) + " x " +
                              std::to_string(width) + " does not fit in 64 bits");
  }
  return pixels;
}

RasterBounds RasterMetadata::bounds() const noexcept {
  const auto h = static_cast<double>(height);
  const auto w = static_cast<double>(width);
  const std::array<std::array<double, 2>, 4> corners{affine.apply(0, 0), affine.apply(w, 0),
                                                     affine.apply(0, h), affine.apply(w, h)};
  RasterBounds bounds{corners[0][0], corners[0][1], corners[0][0], corners[0][1]};
  for (const auto& [x, y] : corners) {
    bounds.left = std::min(bounds.left, x);
    bounds.right = std::max(bounds.right, x);
    bounds.bottom = std::min(bounds.bottom, y);
    bounds.top = std::max(bounds.top, y);
  }
  return bounds;
}

std::string_view to_string(TilingStrategy strategy) noexcept {
  switch (strategy) {
    case TilingStrategy::whole:
      return "whole";
    case TilingStrategy::band_batches:
      return "band_batches";
    case TilingStrategy::tiled:
      return "tiled";
  }
  return "unknown";
}

bool same_nodata(const std::optional<double>& a, const std::optional<double>& b) noexcept {
  if (a.has_value() != b.has_value()) return false;
  if (!a) return true;
  if (std::isnan(*a) || std::isnan(*b)) return std::isnan(*a) && std::isnan(*b);
  return *a == *b;
}

}  // namespace vibespatial::raster
