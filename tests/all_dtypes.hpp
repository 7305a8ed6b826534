// SPDX-License-Identifier: Apache-2.0
// Test helper: every DType, in the order of the enum, for tests that loop over all of them.
#pragma once

#include <vibespatial/raster/buffers.hpp>

#include <array>

namespace vsr_test {

inline constexpr std::array<vibespatial::raster::DType, 10> kAllDTypes{
    vibespatial::raster::DType::uint8,   vibespatial::raster::DType::int8,
    vibespatial::raster::DType::uint16,  vibespatial::raster::DType::int16,
    vibespatial::raster::DType::uint32,  vibespatial::raster::DType::int32,
    vibespatial::raster::DType::uint64,  vibespatial::raster::DType::int64,
    vibespatial::raster::DType::float32, vibespatial::raster::DType::float64};

}  // namespace vsr_test
