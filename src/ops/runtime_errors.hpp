// SPDX-License-Identifier: Apache-2.0
// How the CUDA backend of the band operations reports CUDA *runtime* errors (cudart: Thrust, CUB,
// kernel launches). Plain C++, so that the policy is tested on the CPU with a fake runtime
// (tests/ops): every failure is read with cudaGetLastError, which clears it, so a failed op never
// leaves its error behind for the next op to report; a cudaError_t never lands in CudaError::code()
// (which is a CUresult) but in CudaError::runtime_code(); out-of-memory is an OutOfMemoryError.
#pragma once

#include <cstddef>

namespace vibespatial::raster::detail::ops {

/// The runtime's error functions: cudart's in ops_cuda.cu, fakes in the tests. Values are
/// cudaError_t as int.
struct RuntimeErrorApi {
  int (*get_last_error)();              ///< cudaGetLastError: returns the last error and clears it
  const char* (*error_name)(int code);  ///< cudaGetErrorName
  const char* (*error_string)(int code);  ///< cudaGetErrorString
};

/// The CUresult that means what cudaError_t @p runtime_code means: the same number for the codes
/// the two enumerations share, CUDA_ERROR_UNKNOWN (999) where the driver has no such error.
int runtime_to_driver_result(int runtime_code) noexcept;

/// Throws for a failed runtime call: clears the runtime's last error first (get_last_error), then
/// throws OutOfMemoryError for cudaErrorMemoryAllocation, else CudaError with the runtime code.
/// The message is "<what> failed: <name>: <string>".
[[noreturn]] void throw_runtime_error(const RuntimeErrorApi& api, int code, const char* what);

/// Throws as throw_runtime_error when @p code is not cudaSuccess (0).
inline void check_runtime(const RuntimeErrorApi& api, int code, const char* what) {
  if (code != 0) throw_runtime_error(api, code, what);
}

/// After queuing kernels: reads and clears the runtime's last error (launch errors of the work
/// just queued), throwing as check_runtime.
inline void check_launch(const RuntimeErrorApi& api, const char* what) {
  check_runtime(api, api.get_last_error(), what);
}

}  // namespace vibespatial::raster::detail::ops
