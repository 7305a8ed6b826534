// SPDX-License-Identifier: Apache-2.0
// Asynchrony and stream ordering (semantics §3.7): work held by a spinning host function stays
// pending, the legacy NULL stream is asynchronous to the host, a CU_STREAM_DEFAULT stream waits
// behind it and a CU_STREAM_NON_BLOCKING stream does not. A driver that runs such work inline
// would hang these cases; a watchdog releases the hold after a while and fails them instead.
//
// Host functions run on one driver thread per context on real GPUs, so while one spins no other
// host function runs: the cases observe the other streams with memsets and copies only.
#include "harness.hpp"

#include <cuda.h>

#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace vsr_conf {
namespace {

constexpr std::chrono::seconds kHangLimit{20};

// Reads one byte of device memory through `stream` (waits for that stream only).
unsigned char read_byte(CUdeviceptr p, CUstream stream) {
  unsigned char v = 0xee;
  VSR_CU_REQUIRE_OK(cu().cuMemcpyDtoHAsync(&v, p, 1, stream));
  VSR_CU_REQUIRE_OK(cu().cuStreamSynchronize(stream));
  return v;
}

}  // namespace

TEST_CASE("stream.host_func_holds_stream") {
  CUstream s = nullptr;
  CUevent e = nullptr;
  VSR_CU_REQUIRE_OK(cu().cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  VSR_CU_REQUIRE_OK(cu().cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  SpinHold hold;
  {
    Watchdog dog(kHangLimit, [&] { hold.released = true; });
    VSR_CU_IS(CUDA_SUCCESS, cu().cuLaunchHostFunc(s, &SpinHold::run, &hold));
    CHECK_MESSAGE(!dog.fired(), "cuLaunchHostFunc waited for its host function");
    VSR_CU_IS(CUDA_SUCCESS, cu().cuEventRecord(e, s));
    if (!hold.released.load()) {
      VSR_CU_IS(CUDA_ERROR_NOT_READY, cu().cuStreamQuery(s));
      VSR_CU_IS(CUDA_ERROR_NOT_READY, cu().cuEventQuery(e));
    }
    hold.released = true;
    VSR_CU_IS(CUDA_SUCCESS, cu().cuStreamSynchronize(s));
    CHECK(hold.ran_on != std::this_thread::get_id());
  }
  VSR_CU_IS(CUDA_SUCCESS, cu().cuStreamQuery(s));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuEventQuery(e));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuEventDestroy(e));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuStreamDestroy(s));
}

TEST_CASE("stream.legacy_stream_ordering") {
  const std::size_t n = 1 << 20;
  CUdeviceptr a = 0;
  CUdeviceptr b = 0;
  VSR_CU_REQUIRE_OK(cu().cuMemAlloc(&a, n));
  VSR_CU_REQUIRE_OK(cu().cuMemAlloc(&b, n));
  VSR_CU_REQUIRE_OK(cu().cuMemsetD8(a, 0, n));
  VSR_CU_REQUIRE_OK(cu().cuMemsetD8(b, 0, n));
  VSR_CU_REQUIRE_OK(cu().cuCtxSynchronize());
  CUstream blocking = nullptr;
  CUstream nonblocking = nullptr;
  CUevent e = nullptr;
  VSR_CU_REQUIRE_OK(cu().cuStreamCreate(&blocking, CU_STREAM_DEFAULT));
  VSR_CU_REQUIRE_OK(cu().cuStreamCreate(&nonblocking, CU_STREAM_NON_BLOCKING));
  VSR_CU_REQUIRE_OK(cu().cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  SpinHold hold;
  {
    Watchdog dog(kHangLimit, [&] { hold.released = true; });
    // The legacy stream is asynchronous to the host: these return while the spin holds it.
    VSR_CU_IS(CUDA_SUCCESS, cu().cuLaunchHostFunc(nullptr, &SpinHold::run, &hold));
    CHECK_MESSAGE(!dog.fired(), "cuLaunchHostFunc on the NULL stream waited for its function");
    VSR_CU_IS(CUDA_SUCCESS, cu().cuEventRecord(e, nullptr));
    CHECK_MESSAGE(!dog.fired(), "cuEventRecord(e, NULL) did not return at once");
    if (!hold.released.load()) {
      VSR_CU_IS(CUDA_ERROR_NOT_READY, cu().cuEventQuery(e));
      VSR_CU_IS(CUDA_ERROR_NOT_READY, cu().cuStreamQuery(nullptr));
    }
    // A CU_STREAM_DEFAULT stream's later work waits behind the held legacy stream ...
    VSR_CU_IS(CUDA_SUCCESS, cu().cuMemsetD8Async(b, 0x2b, n, blocking));
    // ... a CU_STREAM_NON_BLOCKING stream's does not.
    VSR_CU_IS(CUDA_SUCCESS, cu().cuMemsetD8Async(a, 0x1a, n, nonblocking));
    CHECK(read_byte(a + n - 1, nonblocking) == 0x1a);
    CHECK_MESSAGE(!dog.fired(), "the non-blocking stream waited for the legacy stream");
    if (!hold.released.load()) {
      VSR_CU_IS(CUDA_ERROR_NOT_READY, cu().cuStreamQuery(blocking));
      CHECK(read_byte(b, nonblocking) == 0);
    }
    CHECK_MESSAGE(!dog.fired(), "the case hung; the watchdog released the NULL stream");
    hold.released = true;
    VSR_CU_IS(CUDA_SUCCESS, cu().cuStreamSynchronize(blocking));
    CHECK(read_byte(b + n - 1, nonblocking) == 0x2b);
    VSR_CU_IS(CUDA_SUCCESS, cu().cuEventSynchronize(e));
    CHECK(hold.ran_on != std::this_thread::get_id());
  }
  VSR_CU_IS(CUDA_SUCCESS, cu().cuEventQuery(e));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuStreamQuery(nullptr));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuEventDestroy(e));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuStreamDestroy(blocking));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuStreamDestroy(nonblocking));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemFree(a));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemFree(b));
}

}  // namespace vsr_conf
