// SPDX-License-Identifier: Apache-2.0
// DType, Affine and RasterMetadata functions.
#include <vibespatial/raster/buffers.hpp>

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
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

Affine Affine::shifted(std::int64_t col, std::int64_t row) const noexcept {
  Affine s = *this;
  s.c = c + static_cast<double>(col) * a + static_cast<double>(row) * b;
  s.f = f + static_cast<double>(col) * d + static_cast<double>(row) * e;
  return s;
}

bool is_floating_point(DType dtype) noexcept {
  return dtype == DType::float32 || dtype == DType::float64;
}

bool dtype_holds(DType dtype, const NodataValue& value) noexcept {
  const double d = value.to_double();
  switch (dtype) {
    case DType::float64:
      return true;
    case DType::float32:
      return std::isnan(d) || static_cast<double>(static_cast<float>(d)) == d;
    case DType::uint64:
      return value.as_uint64().has_value();
    case DType::int64:
      return value.as_int64().has_value();
    default:
      break;
  }
  const auto v = value.as_int64();
  if (!v) return false;
  switch (dtype) {
    case DType::uint8:
      return *v >= 0 && *v <= 255;
    case DType::int8:
      return *v >= -128 && *v <= 127;
    case DType::uint16:
      return *v >= 0 && *v <= 65535;
    case DType::int16:
      return *v >= -32768 && *v <= 32767;
    case DType::uint32:
      return *v >= 0 && *v <= 4294967295LL;
    case DType::int32:
      return *v >= -2147483648LL && *v <= 2147483647LL;
    default:
      return false;
  }
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

NodataValue::NodataValue(double value) noexcept : real_(value) {}

NodataValue NodataValue::from_int64(std::int64_t value) noexcept {
  NodataValue v;
  // Exactly a double? (-2^63 is; 2^63 - 1 is not: its double is 2^63, outside int64.)
  const double d = static_cast<double>(value);
  if (d >= -0x1p63 && d < 0x1p63 && static_cast<std::int64_t>(d) == value) {
    v.real_ = d;
  } else {
    v.kind_ = Kind::int64;
    v.bits_ = static_cast<std::uint64_t>(value);
    v.real_ = d;
  }
  return v;
}

NodataValue NodataValue::from_uint64(std::uint64_t value) noexcept {
  NodataValue v;
  const double d = static_cast<double>(value);
  if (d < 0x1p64 && static_cast<std::uint64_t>(d) == value) {
    v.real_ = d;
  } else if (value <= static_cast<std::uint64_t>(INT64_MAX)) {
    return from_int64(static_cast<std::int64_t>(value));
  } else {
    v.kind_ = Kind::uint64;
    v.bits_ = value;
    v.real_ = d;
  }
  return v;
}

double NodataValue::to_double() const noexcept {
  return real_;
}

std::optional<std::int64_t> NodataValue::as_int64() const noexcept {
  switch (kind_) {
    case Kind::int64:
      return static_cast<std::int64_t>(bits_);
    case Kind::uint64:
      return std::nullopt;  // above INT64_MAX by construction
    case Kind::real:
      break;
  }
  if (!(real_ >= -0x1p63 && real_ < 0x1p63) || std::trunc(real_) != real_) return std::nullopt;
  return static_cast<std::int64_t>(real_);
}

std::optional<std::uint64_t> NodataValue::as_uint64() const noexcept {
  switch (kind_) {
    case Kind::int64: {
      const auto v = static_cast<std::int64_t>(bits_);
      return v >= 0 ? std::optional<std::uint64_t>(static_cast<std::uint64_t>(v)) : std::nullopt;
    }
    case Kind::uint64:
      return bits_;
    case Kind::real:
      break;
  }
  if (!(real_ >= 0 && real_ < 0x1p64) || std::trunc(real_) != real_) return std::nullopt;
  return static_cast<std::uint64_t>(real_);
}

bool NodataValue::is_nan() const noexcept {
  return kind_ == Kind::real && std::isnan(real_);
}

std::string NodataValue::to_string() const {
  if (kind_ == Kind::int64) return std::to_string(static_cast<std::int64_t>(bits_));
  if (kind_ == Kind::uint64) return std::to_string(bits_);
  if (std::isnan(real_)) return "nan";
  if (std::isinf(real_)) return real_ > 0 ? "inf" : "-inf";
  if (const auto i = as_int64(); i && std::fabs(real_) < 0x1p63) return std::to_string(*i);
  char buf[64];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, real_);
    if (std::strtod(buf, nullptr) == real_) break;
  }
  return buf;
}

bool operator==(const NodataValue& a, const NodataValue& b) noexcept {
  if (a.kind_ != b.kind_) return false;
  if (a.kind_ != NodataValue::Kind::real) return a.bits_ == b.bits_;
  if (std::isnan(a.real_) || std::isnan(b.real_)) return std::isnan(a.real_) && std::isnan(b.real_);
  return a.real_ == b.real_;
}

bool same_nodata(const std::optional<double>& a, const std::optional<double>& b) noexcept {
  if (a.has_value() != b.has_value()) return false;
  if (!a) return true;
  if (std::isnan(*a) || std::isnan(*b)) return std::isnan(*a) && std::isnan(*b);
  return *a == *b;
}

}  // namespace vibespatial::raster
