// SPDX-License-Identifier: Apache-2.0
// The one switch from a DType value to its C++ pixel type.
#pragma once

#include <vibespatial/raster/buffers.hpp>

#include <cstdint>
#include <stdexcept>

namespace vibespatial::raster::detail {

/// Calls f(T{}) with the C++ pixel type T of @p dtype and returns what it returns.
/// @throws std::invalid_argument for a value that is not a DType.
template <class F>
decltype(auto) visit_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::uint8:
      return f(std::uint8_t{});
    case DType::int8:
      return f(std::int8_t{});
    case DType::uint16:
      return f(std::uint16_t{});
    case DType::int16:
      return f(std::int16_t{});
    case DType::uint32:
      return f(std::uint32_t{});
    case DType::int32:
      return f(std::int32_t{});
    case DType::uint64:
      return f(std::uint64_t{});
    case DType::int64:
      return f(std::int64_t{});
    case DType::float32:
      return f(float{});
    case DType::float64:
      return f(double{});
  }
  throw std::invalid_argument("dtype: not a DType value");
}

}  // namespace vibespatial::raster::detail
