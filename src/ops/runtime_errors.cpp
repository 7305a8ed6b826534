// SPDX-License-Identifier: Apache-2.0
#include "ops/runtime_errors.hpp"

#include <vibespatial/raster/errors.hpp>

#include <cuda.h>

#include <driver_types.h>

#include <string>

namespace vibespatial::raster::detail::ops {

int runtime_to_driver_result(int runtime_code) noexcept {
  // Pairs that mean the same error. Many runtime codes share their number with the driver's, but
  // not all (cudaErrorInvalidConfiguration is 9, which no CUresult is; 35 differs in meaning), so
  // the translation is explicit and anything unlisted is CUDA_ERROR_UNKNOWN.
  struct Pair {
    cudaError_t runtime;
    CUresult driver;
  };
  static constexpr Pair kPairs[] = {
      {cudaSuccess, CUDA_SUCCESS},
      {cudaErrorInvalidValue, CUDA_ERROR_INVALID_VALUE},
      {cudaErrorMemoryAllocation, CUDA_ERROR_OUT_OF_MEMORY},
      {cudaErrorInitializationError, CUDA_ERROR_NOT_INITIALIZED},
      {cudaErrorCudartUnloading, CUDA_ERROR_DEINITIALIZED},
      {cudaErrorInvalidConfiguration, CUDA_ERROR_INVALID_VALUE},
      {cudaErrorStubLibrary, CUDA_ERROR_STUB_LIBRARY},
      {cudaErrorInsufficientDriver, CUDA_ERROR_SYSTEM_DRIVER_MISMATCH},
      {cudaErrorDevicesUnavailable, CUDA_ERROR_DEVICE_UNAVAILABLE},
      {cudaErrorNoDevice, CUDA_ERROR_NO_DEVICE},
      {cudaErrorInvalidDevice, CUDA_ERROR_INVALID_DEVICE},
      {cudaErrorInvalidKernelImage, CUDA_ERROR_INVALID_IMAGE},
      {cudaErrorDeviceUninitialized, CUDA_ERROR_INVALID_CONTEXT},
      {cudaErrorNoKernelImageForDevice, CUDA_ERROR_NO_BINARY_FOR_GPU},
      {cudaErrorInvalidPtx, CUDA_ERROR_INVALID_PTX},
      {cudaErrorUnsupportedPtxVersion, CUDA_ERROR_UNSUPPORTED_PTX_VERSION},
      {cudaErrorInvalidResourceHandle, CUDA_ERROR_INVALID_HANDLE},
      {cudaErrorNotReady, CUDA_ERROR_NOT_READY},
      {cudaErrorIllegalAddress, CUDA_ERROR_ILLEGAL_ADDRESS},
      {cudaErrorLaunchOutOfResources, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES},
      {cudaErrorLaunchTimeout, CUDA_ERROR_LAUNCH_TIMEOUT},
      {cudaErrorContextIsDestroyed, CUDA_ERROR_CONTEXT_IS_DESTROYED},
      {cudaErrorAssert, CUDA_ERROR_ASSERT},
      {cudaErrorHardwareStackError, CUDA_ERROR_HARDWARE_STACK_ERROR},
      {cudaErrorIllegalInstruction, CUDA_ERROR_ILLEGAL_INSTRUCTION},
      {cudaErrorMisalignedAddress, CUDA_ERROR_MISALIGNED_ADDRESS},
      {cudaErrorInvalidAddressSpace, CUDA_ERROR_INVALID_ADDRESS_SPACE},
      {cudaErrorInvalidPc, CUDA_ERROR_INVALID_PC},
      {cudaErrorLaunchFailure, CUDA_ERROR_LAUNCH_FAILED},
      {cudaErrorNotSupported, CUDA_ERROR_NOT_SUPPORTED},
      {cudaErrorSystemDriverMismatch, CUDA_ERROR_SYSTEM_DRIVER_MISMATCH},
      {cudaErrorUnknown, CUDA_ERROR_UNKNOWN},
  };
  for (const Pair& p : kPairs) {
    if (static_cast<int>(p.runtime) == runtime_code) return static_cast<int>(p.driver);
  }
  return CUDA_ERROR_UNKNOWN;
}

void throw_runtime_error(const RuntimeErrorApi& api, int code, const char* what) {
  // The runtime keeps a failed call's error as its "last error" (launch errors too): read it
  // back so that it is cleared and the next operation does not report it again.
  (void)api.get_last_error();
  const char* name = api.error_name(code);
  const char* text = api.error_string(code);
  const std::string n = name != nullptr ? name : "cudaError(" + std::to_string(code) + ")";
  const std::string message =
      std::string(what) + " failed: " + n + ": " + (text != nullptr ? text : "unknown error");
  if (code == cudaErrorMemoryAllocation) throw OutOfMemoryError(0, message);
  throw CudaError(runtime_to_driver_result(code), n, message, code);
}

}  // namespace vibespatial::raster::detail::ops
