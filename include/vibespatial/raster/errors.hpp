// SPDX-License-Identifier: Apache-2.0
// The exception types of vibespatial-raster.
//
// - CudaError: a CUDA driver call failed. Carries the CUresult value and its name.
// - DriverUnavailableError: there is no usable driver (no library, no device, cuInit failed).
// - OutOfMemoryError: the device (or the pool's budget) cannot satisfy a request even after the
//   pool's recovery chain. Derives from std::bad_alloc so generic handlers catch it.
// Bad arguments throw the standard std::invalid_argument / std::out_of_range /
// std::overflow_error. No public call aborts the process on bad input.
#pragma once

#include <vibespatial/raster/export.hpp>

#include <cstddef>
#include <new>
#include <stdexcept>
#include <string>

namespace vibespatial::raster {

/// A CUDA driver call failed.
/// `code()` is the CUresult value (compare it with the CUDA_ERROR_* enumerators of <cuda.h>),
/// `name()` its enumerator name, e.g. "CUDA_ERROR_INVALID_VALUE". `what()` also names the call
/// and the source location.
class VSR_EXPORT CudaError : public std::runtime_error {
 public:
  CudaError(int code, std::string name, const std::string& what);
  /// The CUresult value of the failed call.
  int code() const noexcept { return code_; }
  /// The CUresult's enumerator name ("CUDA_ERROR_OUT_OF_MEMORY"), or "CUresult(<n>)".
  const std::string& name() const noexcept { return name_; }

 private:
  int code_;
  std::string name_;
};

/// There is no usable CUDA driver: the library named by VIBESPATIAL_CUDA_DRIVER (default
/// libcuda.so.1) could not be loaded or lacks an entry point, cuInit failed, or no device exists.
/// `code()` is the CUresult that says why (CUDA_ERROR_NO_DEVICE when the library is missing).
class VSR_EXPORT DriverUnavailableError : public CudaError {
 public:
  using CudaError::CudaError;
};

/// A device allocation could not be satisfied. The message says how much was asked for and what
/// the pool held (live and free) when it gave up.
class VSR_EXPORT OutOfMemoryError : public std::bad_alloc {
 public:
  OutOfMemoryError(std::size_t requested_bytes, std::string message);
  const char* what() const noexcept override { return message_.c_str(); }
  /// The size of the request that failed, in bytes.
  std::size_t requested_bytes() const noexcept { return requested_bytes_; }

 private:
  std::size_t requested_bytes_;
  std::string message_;
};

}  // namespace vibespatial::raster
