// SPDX-License-Identifier: Apache-2.0
#include <vibespatial/raster/errors.hpp>

#include <utility>

namespace vibespatial::raster {

CudaError::CudaError(int code, std::string name, const std::string& what)
    : std::runtime_error(what), code_(code), name_(std::move(name)) {}

OutOfMemoryError::OutOfMemoryError(std::size_t requested_bytes, std::string message)
    : requested_bytes_(requested_bytes), message_(std::move(message)) {}

}  // namespace vibespatial::raster
