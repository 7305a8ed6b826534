// SPDX-License-Identifier: Apache-2.0
// The exception types of vibespatial-raster.
//
// - CudaError: a CUDA driver call (or a runtime call of the device ops) failed. Carries the
//   CUresult value and its name (and the cudaError_t of a failed runtime call).
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
#include <utility>

namespace vibespatial::raster {

/// A CUDA driver call, or a CUDA runtime call of the band operations' device backend, failed.
/// `code()` is always a CUresult value (compare it with the CUDA_ERROR_* enumerators of
/// <cuda.h>). For a failed runtime call (Thrust, CUB, a kernel launch) `runtime_code()` is the
/// cudaError_t value, `code()` the CUresult meaning the same (CUDA_ERROR_UNKNOWN where none does)
/// and `name()` the runtime's name ("cudaErrorInvalidConfiguration"); for a driver call
/// `runtime_code()` is 0 and `name()` the CUresult's name. `what()` names the operation or call
/// (and, for driver calls, the source location).
class VSR_EXPORT CudaError : public std::runtime_error {
 public:
  CudaError(int code, std::string name, const std::string& what);
  /// A failed CUDA runtime call: @p code the corresponding CUresult, @p name the cudaError_t's
  /// name, @p runtime_code the cudaError_t value (non-zero).
  CudaError(int code, std::string name, const std::string& what, int runtime_code)
      : CudaError(code, std::move(name), what) {
    runtime_code_ = runtime_code;
  }
  /// The CUresult value of the failed call (for runtime errors: its CUresult translation).
  int code() const noexcept { return code_; }
  /// The CUresult's enumerator name ("CUDA_ERROR_OUT_OF_MEMORY"), or "CUresult(<n>)"; for a
  /// failed runtime call the cudaError_t's name ("cudaErrorLaunchFailure").
  const std::string& name() const noexcept { return name_; }
  /// The cudaError_t value of a failed CUDA runtime call; 0 when a driver call failed.
  int runtime_code() const noexcept { return runtime_code_; }

 private:
  int code_;
  std::string name_;
  int runtime_code_ = 0;
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
