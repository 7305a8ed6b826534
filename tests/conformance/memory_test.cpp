// SPDX-License-Identifier: Apache-2.0
// Classic, managed, stream-ordered and pinned host allocation; copies and memset
// (semantics §3.5, §3.6).
#include "harness.hpp"

#include <cuda.h>

#include <doctest/doctest.h>

#include <string>
#include <vector>

namespace vsr_conf {
namespace {

int attribute(CUdevice_attribute a) {
  int v = -1;
  VSR_CU_REQUIRE_OK(cu().cuDeviceGetAttribute(&v, a, env().dev));
  return v;
}

std::vector<unsigned char> pattern(std::size_t n, unsigned seed) {
  std::vector<unsigned char> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>(i * 7 + seed);
  return v;
}

}  // namespace

TEST_CASE("alloc.roundtrip") {
  const std::size_t n = 1 << 20;
  CUdeviceptr a = 0;
  CUdeviceptr b = 0;
  VSR_CU_REQUIRE_OK(cu().cuMemAlloc(&a, n));
  VSR_CU_REQUIRE_OK(cu().cuMemAlloc(&b, n));
  CHECK(a != 0);
  CHECK_EQ(a % 256, 0u);
  CHECK_EQ(b % 256, 0u);
  const std::vector<unsigned char> in = pattern(n, 1);
  std::vector<unsigned char> out(n, 0);
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemcpyHtoD(a, in.data(), n));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemcpyDtoD(b, a, n));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemcpyDtoH(out.data(), b, n));
  CHECK(in == out);
  // A memset is asynchronous but ordered on the legacy stream before the synchronous DtoH.
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemsetD8(b + 100, 0x5a, 1000));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemcpyDtoH(out.data(), b, n));
  CHECK_EQ(out[99], in[99]);
  CHECK_EQ(out[100], 0x5a);
  CHECK_EQ(out[1099], 0x5a);
  CHECK_EQ(out[1100], in[1100]);
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemFree(a));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemFree(b));
}

TEST_CASE("alloc.zero_bytes") {
  CUdeviceptr p = 0;
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemAlloc(&p, 0));
}

TEST_CASE("free.null_pointer") {
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemFree(0));
}

TEST_CASE("free.bad_pointers") {
  const std::size_t G = env().gran;
  CUdeviceptr p = 0;
  VSR_CU_REQUIRE_OK(cu().cuMemAlloc(&p, 4096));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemFree(p + 16));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemFree(p));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemFree(p));
  CUdeviceptr va = 0;
  CUmemGenericAllocationHandle h = 0;
  VSR_CU_REQUIRE_OK(cu().cuMemAddressReserve(&va, G, 0, 0, 0));
  VSR_CU_REQUIRE_OK(cu().cuMemCreate(&h, G, &env().prop, 0));
  VSR_CU_REQUIRE_OK(cu().cuMemMap(va, G, 0, h, 0));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemFree(va));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemUnmap(va, G));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemRelease(h));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAddressFree(va, G));
}

// §3.4.10, §3.5: cuMemGetAddressRange from any address inside a cuMemAlloc allocation gives its
// base and its size (HDR; the size exactly as asked for is only asserted under --strict).
TEST_CASE("range.linear_allocation") {
  CUdeviceptr p = 0;
  VSR_CU_REQUIRE_OK(cu().cuMemAlloc(&p, 1000));
  CUdeviceptr base = 0;
  std::size_t size = 0;
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemGetAddressRange(&base, &size, p + 999));
  CHECK_EQ(base, p);
  CHECK_GE(size, 1000u);
  if (env().strict) CHECK_EQ(size, 1000u);
  base = 0;
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemGetAddressRange(&base, nullptr, p + 5));  // outs optional
  CHECK_EQ(base, p);
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemFree(p));
}

// §3.4.10: on VMM memory the range is the reservation's, mapped or not (PROBE: DALI).
TEST_CASE("range.vmm_reservation") {
  const std::size_t G = env().gran;
  CUdeviceptr va = 0;
  CUmemGenericAllocationHandle h = 0;
  VSR_CU_REQUIRE_OK(cu().cuMemAddressReserve(&va, 2 * G, 0, 0, 0));
  VSR_CU_REQUIRE_OK(cu().cuMemCreate(&h, G, &env().prop, 0));
  VSR_CU_REQUIRE_OK(cu().cuMemMap(va, G, 0, h, 0));
  CUdeviceptr base = 0;
  std::size_t size = 0;
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemGetAddressRange(&base, &size, va + 5));
  CHECK_EQ(base, va);
  CHECK_EQ(size, 2 * G);
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemUnmap(va, G));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemRelease(h));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAddressFree(va, 2 * G));
}

// §3.4.10: an address the context knows no allocation at fails (NOT_FOUND in the field: mpich
// #5897, NCCL #2332; the code only under --strict).
TEST_CASE("range.unknown_address") {
  CUdeviceptr p = 0;
  VSR_CU_REQUIRE_OK(cu().cuMemAlloc(&p, 4096));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemFree(p));
  CUdeviceptr base = 0;
  std::size_t size = 0;
  VSR_CU_FAILS(CUDA_ERROR_NOT_FOUND, cu().cuMemGetAddressRange(&base, &size, p));
  int on_stack = 0;
  VSR_CU_FAILS(CUDA_ERROR_NOT_FOUND,
               cu().cuMemGetAddressRange(&base, &size, reinterpret_cast<CUdeviceptr>(&on_stack)));
}

TEST_CASE("managed.alloc") {
  if (attribute(CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY) != 1) {
    VSR_CONF_NOT_APPLICABLE("managed memory not supported on this device");
  }
  CUdeviceptr p = 0;
  VSR_CU_REQUIRE_OK(cu().cuMemAllocManaged(&p, 1 << 20, CU_MEM_ATTACH_GLOBAL));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemsetD8(p, 0x11, 1 << 20));
  std::vector<unsigned char> out(64, 0);
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemcpyDtoH(out.data(), p + 4096, out.size()));
  CHECK(out == std::vector<unsigned char>(64, 0x11));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemFree(p));
  CUdeviceptr q = 0;
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemAllocManaged(&q, 0, CU_MEM_ATTACH_GLOBAL));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemAllocManaged(&q, 4096, 4));
}

TEST_CASE("async.alloc_free") {
  if (attribute(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED) != 1) {
    VSR_CONF_NOT_APPLICABLE("memory pools not supported on this device");
  }
  CUstream s = nullptr;
  VSR_CU_REQUIRE_OK(cu().cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr p = 0;
  const std::size_t n = 1 << 20;
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAllocAsync(&p, n, s));
  CHECK(p != 0);
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemsetD8Async(p, 0x3c, n, s));
  std::vector<unsigned char> out(256, 0);
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemcpyDtoHAsync(out.data(), p + n - 256, 256, s));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemFreeAsync(p, s));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuStreamSynchronize(s));
  CHECK(out == std::vector<unsigned char>(256, 0x3c));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuStreamDestroy(s));
}

TEST_CASE("host.pinned_alloc") {
  void* hp = nullptr;
  const std::size_t n = 64 * 1024;
  VSR_CU_REQUIRE_OK(cu().cuMemHostAlloc(&hp, n, 0));
  REQUIRE(hp != nullptr);
  auto* bytes = static_cast<unsigned char*>(hp);
  for (std::size_t i = 0; i < n; ++i) bytes[i] = static_cast<unsigned char>(i);
  CUdeviceptr d = 0;
  VSR_CU_REQUIRE_OK(cu().cuMemAlloc(&d, n));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemcpyHtoD(d, hp, n));
  std::vector<unsigned char> out(n, 0);
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemcpyDtoH(out.data(), d, n));
  CHECK(std::vector<unsigned char>(bytes, bytes + n) == out);
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemFree(d));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemFreeHost(hp));
}

TEST_CASE("memcpy.null_host_pointer") {
  CUdeviceptr d = 0;
  VSR_CU_REQUIRE_OK(cu().cuMemAlloc(&d, 4096));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemcpyHtoD(d, nullptr, 0));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemcpyHtoD(d, nullptr, 16));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemFree(d));
}

TEST_CASE("memcpy.async_roundtrip") {
  const std::size_t n = 256 * 1024;
  CUstream s = nullptr;
  VSR_CU_REQUIRE_OK(cu().cuStreamCreate(&s, CU_STREAM_DEFAULT));
  CUdeviceptr a = 0;
  CUdeviceptr b = 0;
  VSR_CU_REQUIRE_OK(cu().cuMemAlloc(&a, n));
  VSR_CU_REQUIRE_OK(cu().cuMemAlloc(&b, n));
  const std::vector<unsigned char> in = pattern(n, 9);
  std::vector<unsigned char> out(n, 0);
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemcpyHtoDAsync(a, in.data(), n, s));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemcpyDtoDAsync(b, a, n, s));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemsetD8Async(b, 0xee, 16, s));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemcpyDtoHAsync(out.data(), b, n, s));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuStreamSynchronize(s));
  CHECK_EQ(out[0], 0xee);
  CHECK_EQ(out[15], 0xee);
  CHECK(std::vector<unsigned char>(out.begin() + 16, out.end()) ==
        std::vector<unsigned char>(in.begin() + 16, in.end()));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemFree(a));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemFree(b));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuStreamDestroy(s));
}

TEST_CASE("memcpy.past_end_of_allocation") {
  CUdeviceptr d = 0;
  VSR_CU_REQUIRE_OK(cu().cuMemAlloc(&d, 4096));
  std::vector<unsigned char> buf(64, 0);
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemcpyHtoD(d + 4090, buf.data(), buf.size()));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemcpyDtoH(buf.data(), 0, 16));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemFree(d));
}

TEST_CASE("stream.create_flags") {
  CUstream a = nullptr;
  CUstream b = nullptr;
  CUstream c = nullptr;
  VSR_CU_IS(CUDA_SUCCESS, cu().cuStreamCreate(&a, CU_STREAM_DEFAULT));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
  CHECK(a != nullptr);
  CHECK(b != nullptr);
  CHECK(a != b);
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuStreamCreate(&c, 2));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuStreamDestroy(a));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuStreamDestroy(b));
}

TEST_CASE("stream.null_out") {
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuStreamCreate(nullptr, 0));
}

TEST_CASE("stream.special_handles") {
  VSR_CU_IS(CUDA_SUCCESS, cu().cuStreamSynchronize(nullptr));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuStreamSynchronize(CU_STREAM_LEGACY));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuStreamSynchronize(CU_STREAM_PER_THREAD));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuCtxSynchronize());
}

TEST_CASE("stream.query_not_ready_is_not_a_failure") {
  // NOT_READY (600) only means "work pending"; an idle stream answers SUCCESS (semantics §3.7).
  CUstream s = nullptr;
  VSR_CU_REQUIRE_OK(cu().cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuStreamQuery(s));
  const std::size_t n = 8 << 20;
  CUdeviceptr a = 0;
  VSR_CU_REQUIRE_OK(cu().cuMemAlloc(&a, n));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemsetD8Async(a, 1, n, s));
  const std::string q = error_name(cu().cuStreamQuery(s));
  CHECK((q == "CUDA_SUCCESS" || q == "CUDA_ERROR_NOT_READY"));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuStreamSynchronize(s));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuStreamQuery(s));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemFree(a));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuStreamDestroy(s));
}

TEST_CASE("event.never_recorded") {
  CUevent e = nullptr;
  VSR_CU_REQUIRE_OK(cu().cuEventCreate(&e, CU_EVENT_DEFAULT));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuEventQuery(e));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuEventSynchronize(e));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuEventDestroy(e));
}

TEST_CASE("event.record_and_synchronize") {
  CUstream s = nullptr;
  CUevent e = nullptr;
  VSR_CU_REQUIRE_OK(cu().cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  VSR_CU_REQUIRE_OK(cu().cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  const std::size_t n = 4 << 20;
  CUdeviceptr a = 0;
  VSR_CU_REQUIRE_OK(cu().cuMemAlloc(&a, n));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemsetD8Async(a, 7, n, s));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuEventRecord(e, s));
  const std::string q = error_name(cu().cuEventQuery(e));
  CHECK((q == "CUDA_SUCCESS" || q == "CUDA_ERROR_NOT_READY"));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuEventSynchronize(e));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuEventQuery(e));
  unsigned char last = 0;
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemcpyDtoH(&last, a + n - 1, 1));
  CHECK_EQ(last, 7);
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemFree(a));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuEventDestroy(e));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuStreamDestroy(s));
}

TEST_CASE("event.create_flags") {
  CUevent e = nullptr;
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuEventCreate(&e, CU_EVENT_INTERPROCESS));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuEventCreate(&e, 0x100));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuEventCreate(&e, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuEventDestroy(e));
}

}  // namespace vsr_conf
