// SPDX-License-Identifier: Apache-2.0
// Virtual memory management: granularity, reservations, physical handles, mappings, access and
// the §4 state machine (semantics §3.4, §4).
#include "harness.hpp"

#include <cuda.h>

#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace vsr_conf {
namespace {

CUmemGenericAllocationHandle create(std::size_t size) {
  CUmemGenericAllocationHandle h = 0;
  VSR_CU_REQUIRE_OK(cu().cuMemCreate(&h, size, &env().prop, 0));
  REQUIRE(h != 0);
  return h;
}

CUdeviceptr reserve(std::size_t size) {
  CUdeviceptr va = 0;
  VSR_CU_REQUIRE_OK(cu().cuMemAddressReserve(&va, size, 0, 0, 0));
  REQUIRE(va != 0);
  return va;
}

void set_access(CUdeviceptr va, std::size_t size,
                CUmemAccess_flags flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
  const CUmemAccessDesc d = access_desc(flags);
  VSR_CU_REQUIRE_OK(cu().cuMemSetAccess(va, size, &d, 1));
}

std::vector<unsigned char> pattern(std::size_t n, unsigned seed) {
  std::vector<unsigned char> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>(i * 31 + seed);
  return v;
}

// Writes a pattern at dst through HtoD and reads it back from src through DtoH.
void check_roundtrip(CUdeviceptr dst, CUdeviceptr src, std::size_t n, unsigned seed) {
  const std::vector<unsigned char> in = pattern(n, seed);
  std::vector<unsigned char> out(n, 0);
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemcpyHtoD(dst, in.data(), n));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemcpyDtoH(out.data(), src, n));
  CHECK(in == out);
}

CUmemLocation device_location() {
  CUmemLocation loc{};
  loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
  loc.id = env().dev;
  return loc;
}

}  // namespace

TEST_CASE("gran.minimum_and_recommended") {
  std::size_t min = 0;
  std::size_t rec = 0;
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemGetAllocationGranularity(&min, &env().prop,
                                                             CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemGetAllocationGranularity(&rec, &env().prop,
                                                             CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  REQUIRE(min > 0);
  CHECK(rec >= min);
  CHECK_EQ(rec % min, 0u);
  CHECK_EQ(min, env().gran);
}

TEST_CASE("gran.null_out") {
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemGetAllocationGranularity(
                                          nullptr, &env().prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
}

TEST_CASE("gran.bad_option") {
  std::size_t g = 0;
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE,
            cu().cuMemGetAllocationGranularity(
                &g, &env().prop, static_cast<CUmemAllocationGranularity_flags>(0xff)));
}

TEST_CASE("gran.location_not_validated") {
  // hip-tests on NVIDIA: "succeeds on NVIDIA" for each of these (semantics §3.4.1).
  std::size_t g = 0;
  CUmemAllocationProp p = env().prop;
  p.location.id = 99;
  VSR_CU_IS(CUDA_SUCCESS,
            cu().cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  p = env().prop;
  p.location.id = -1;
  VSR_CU_IS(CUDA_SUCCESS,
            cu().cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  p = env().prop;
  p.type = CU_MEM_ALLOCATION_TYPE_INVALID;
  VSR_CU_IS(CUDA_SUCCESS,
            cu().cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  p = env().prop;
  p.location.type = CU_MEM_LOCATION_TYPE_INVALID;
  VSR_CU_IS(CUDA_SUCCESS,
            cu().cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
}

TEST_CASE("gran.null_prop") {
  std::size_t g = 0;
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE,
            cu().cuMemGetAllocationGranularity(&g, nullptr, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
}

TEST_CASE("reserve.and_free") {
  const std::size_t G = env().gran;
  CUdeviceptr va = 0;
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAddressReserve(&va, 4 * G, 0, 0, 0));
  REQUIRE(va != 0);
  if (env().strict) CHECK_EQ(va % G, 0u);
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAddressFree(va, 4 * G));
}

TEST_CASE("reserve.bad_arguments") {
  const std::size_t G = env().gran;
  CUdeviceptr va = 0;
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemAddressReserve(nullptr, G, 0, 0, 0));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemAddressReserve(&va, 0, 0, 0, 0));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemAddressReserve(&va, 4097, 0, 0, 0));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemAddressReserve(&va, G, 3, 0, 0));
}

TEST_CASE("reserve.flags_must_be_zero") {
  CUdeviceptr va = 0;
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemAddressReserve(&va, env().gran, 0, 0, 1));
}

TEST_CASE("reserve.hint_honoured_when_free") {
  const std::size_t G = env().gran;
  const CUdeviceptr first = reserve(4 * G);
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAddressFree(first, 4 * G));
  CUdeviceptr again = 0;
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAddressReserve(&again, 4 * G, 0, first, 0));
  CHECK_EQ(again, first);
  if (again != 0) VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAddressFree(again, 4 * G));
}

TEST_CASE("reserve.hint_occupied_moves") {
  const std::size_t G = env().gran;
  const CUdeviceptr a = reserve(2 * G);
  CUdeviceptr b = 0;
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAddressReserve(&b, G, 0, a, 0));
  CHECK(b != 0);
  CHECK(b != a);
  if (b != 0 && b != a) VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAddressFree(b, G));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAddressFree(a, 2 * G));
}

TEST_CASE("addressfree.not_a_reservation") {
  const std::size_t G = env().gran;
  const CUdeviceptr va = reserve(4 * G);
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemAddressFree(va + G, G));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemAddressFree(va, 2 * G));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAddressFree(va, 4 * G));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemAddressFree(va, 4 * G));
}

TEST_CASE("addressfree.zero_arguments") {
  const std::size_t G = env().gran;
  const CUdeviceptr va = reserve(G);
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemAddressFree(0, G));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemAddressFree(va, 0));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAddressFree(va, G));
}

TEST_CASE("addressfree.with_live_mapping") {
  const std::size_t G = env().gran;
  const CUdeviceptr va = reserve(2 * G);
  const CUmemGenericAllocationHandle h = create(G);
  VSR_CU_REQUIRE_OK(cu().cuMemMap(va, G, 0, h, 0));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemAddressFree(va, 2 * G));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemUnmap(va, G));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemRelease(h));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAddressFree(va, 2 * G));
}

TEST_CASE("create.size_not_granularity_multiple") {
  CUmemGenericAllocationHandle h = 0;
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemCreate(&h, 128, &env().prop, 0));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemCreate(&h, env().gran + 4096, &env().prop, 0));
}

TEST_CASE("create.size_zero") {
  CUmemGenericAllocationHandle h = 0;
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemCreate(&h, 0, &env().prop, 0));
}

TEST_CASE("create.flags_must_be_zero") {
  CUmemGenericAllocationHandle h = 0;
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemCreate(&h, env().gran, &env().prop, 1));
}

TEST_CASE("create.bad_properties") {
  const std::size_t G = env().gran;
  CUmemGenericAllocationHandle h = 0;
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemCreate(nullptr, G, &env().prop, 0));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemCreate(&h, G, nullptr, 0));
  CUmemAllocationProp p = env().prop;
  p.type = CU_MEM_ALLOCATION_TYPE_INVALID;
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemCreate(&h, G, &p, 0));
  p = env().prop;
  p.location.type = CU_MEM_LOCATION_TYPE_INVALID;
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemCreate(&h, G, &p, 0));
  p = env().prop;
  p.location.id = -1;
  VSR_CU_IS(CUDA_ERROR_INVALID_DEVICE, cu().cuMemCreate(&h, G, &p, 0));
  p.location.id = env().device_count;
  VSR_CU_IS(CUDA_ERROR_INVALID_DEVICE, cu().cuMemCreate(&h, G, &p, 0));
}

TEST_CASE("props.roundtrip") {
  const CUmemGenericAllocationHandle h = create(env().gran);
  CUmemAllocationProp p{};
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemGetAllocationPropertiesFromHandle(&p, h));
  CHECK_EQ(p.type, env().prop.type);
  CHECK_EQ(p.location.type, env().prop.location.type);
  CHECK_EQ(p.location.id, env().prop.location.id);
  CHECK_EQ(p.requestedHandleTypes, env().prop.requestedHandleTypes);
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemRelease(h));
}

TEST_CASE("vmm.transition_table") {
  // One allocation of S through the nine steps of semantics §4, free memory checked after each.
  const std::size_t G = env().gran;
  const std::size_t S = 16 * G;
  const long long s = static_cast<long long>(S);
  const std::size_t f0 = free_bytes();
  CUmemGenericAllocationHandle h = 0;
  VSR_CU_REQUIRE_OK(cu().cuMemCreate(&h, S, &env().prop, 0));
  REQUIRE(h != 0);
  const std::size_t f1 = free_bytes();
  check_free_delta(f0, f1, -s, "1 cuMemCreate");
  const CUdeviceptr va = reserve(S);
  const std::size_t f2 = free_bytes();
  check_free_delta(f1, f2, 0, "2 cuMemAddressReserve");
  VSR_CU_REQUIRE_OK(cu().cuMemMap(va, S, 0, h, 0));
  const std::size_t f3 = free_bytes();
  check_free_delta(f2, f3, 0, "3 cuMemMap");
  set_access(va, S);
  const std::size_t f4 = free_bytes();
  check_free_delta(f3, f4, 0, "4 cuMemSetAccess");
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemRelease(h));
  const std::size_t f5 = free_bytes();
  check_free_delta(f4, f5, 0, "5 cuMemRelease while mapped");
  // Released but still mapped: the memory stays alive and usable through va.
  check_roundtrip(va, va, 4096, 5);
  check_roundtrip(va + S - 4096, va + S - 4096, 4096, 6);
  CUmemGenericAllocationHandle h2 = 0;
  VSR_CU_IS(CUDA_SUCCESS,
            cu().cuMemRetainAllocationHandle(&h2, reinterpret_cast<void*>(va + G + 5)));
  CHECK_EQ(h2, h);
  const std::size_t f6 = free_bytes();
  check_free_delta(f5, f6, 0, "6 cuMemRetainAllocationHandle");
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemRelease(h2));
  const std::size_t f7 = free_bytes();
  check_free_delta(f6, f7, 0, "7 cuMemRelease of the retained handle");
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemUnmap(va, S));
  const std::size_t f8 = free_bytes();
  check_free_delta(f7, f8, s, "8 cuMemUnmap (last reference gone)");
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAddressFree(va, S));
  const std::size_t f9 = free_bytes();
  check_free_delta(f8, f9, 0, "9 cuMemAddressFree");
}

TEST_CASE("map.no_access_until_set_access") {
  const std::size_t G = env().gran;
  const CUdeviceptr va = reserve(2 * G);
  const CUmemGenericAllocationHandle h = create(2 * G);
  VSR_CU_REQUIRE_OK(cu().cuMemMap(va, 2 * G, 0, h, 0));
  const CUmemLocation loc = device_location();
  unsigned long long flags = 77;
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemGetAccess(&flags, &loc, va + G));
  CHECK_EQ(flags, static_cast<unsigned long long>(CU_MEM_ACCESS_FLAGS_PROT_NONE));
  set_access(va, 2 * G);
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemGetAccess(&flags, &loc, va + G));
  CHECK_EQ(flags, static_cast<unsigned long long>(CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
  check_roundtrip(va + G - 64, va + G - 64, 128, 1);
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemUnmap(va, 2 * G));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemRelease(h));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAddressFree(va, 2 * G));
}

TEST_CASE("map.flags_must_be_zero") {
  const std::size_t G = env().gran;
  const CUdeviceptr va = reserve(G);
  const CUmemGenericAllocationHandle h = create(G);
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemMap(va, G, 0, h, 1));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemRelease(h));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAddressFree(va, G));
}

TEST_CASE("map.alias_same_handle") {
  const std::size_t G = env().gran;
  const CUdeviceptr va = reserve(2 * G);
  const CUmemGenericAllocationHandle h = create(G);
  VSR_CU_REQUIRE_OK(cu().cuMemMap(va, G, 0, h, 0));
  VSR_CU_REQUIRE_OK(cu().cuMemMap(va + G, G, 0, h, 0));
  set_access(va, 2 * G);
  check_roundtrip(va + 256, va + G + 256, 1024, 2);
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemUnmap(va, 2 * G));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemRelease(h));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAddressFree(va, 2 * G));
}

TEST_CASE("access.one_call_spans_adjacent_mappings") {
  // Back-to-back mappings of different handles form one buffer (DALI, cuda-samples).
  const std::size_t G = env().gran;
  const CUdeviceptr va = reserve(3 * G);
  const CUmemGenericAllocationHandle h1 = create(2 * G);
  const CUmemGenericAllocationHandle h2 = create(G);
  VSR_CU_REQUIRE_OK(cu().cuMemMap(va, 2 * G, 0, h1, 0));
  VSR_CU_REQUIRE_OK(cu().cuMemMap(va + 2 * G, G, 0, h2, 0));
  set_access(va, 3 * G);
  const CUdeviceptr seam = va + 2 * G;
  check_roundtrip(seam - 512, seam - 512, 1024, 3);
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemcpyDtoD(va, seam - 512, 1024));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemsetD8(seam - 100, 0xab, 200));
  std::vector<unsigned char> out(200, 0);
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemcpyDtoH(out.data(), seam - 100, 200));
  CHECK(out == std::vector<unsigned char>(200, 0xab));
  std::vector<unsigned char> copied(1024, 0);
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemcpyDtoH(copied.data(), va, 1024));
  CHECK(copied == pattern(1024, 3));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemUnmap(va, 2 * G));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemUnmap(va + 2 * G, G));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemRelease(h1));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemRelease(h2));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAddressFree(va, 3 * G));
}

TEST_CASE("access.later_mapping_not_at_base") {
  // The grow pattern: map(va + committed, delta) then setAccess(va + committed, delta).
  const std::size_t G = env().gran;
  const CUdeviceptr va = reserve(4 * G);
  const CUmemGenericAllocationHandle h1 = create(G);
  const CUmemGenericAllocationHandle h2 = create(G);
  VSR_CU_REQUIRE_OK(cu().cuMemMap(va, G, 0, h1, 0));
  set_access(va, G);
  VSR_CU_REQUIRE_OK(cu().cuMemMap(va + G, G, 0, h2, 0));
  set_access(va + G, G);
  check_roundtrip(va + G - 256, va + G - 256, 512, 4);
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemUnmap(va, 2 * G));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemRelease(h1));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemRelease(h2));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAddressFree(va, 4 * G));
}

TEST_CASE("access.read_only") {
  const std::size_t G = env().gran;
  const CUdeviceptr va = reserve(G);
  const CUmemGenericAllocationHandle h = create(G);
  VSR_CU_REQUIRE_OK(cu().cuMemMap(va, G, 0, h, 0));
  set_access(va, G, CU_MEM_ACCESS_FLAGS_PROT_READ);
  const CUmemLocation loc = device_location();
  unsigned long long flags = 77;
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemGetAccess(&flags, &loc, va));
  CHECK_EQ(flags, static_cast<unsigned long long>(CU_MEM_ACCESS_FLAGS_PROT_READ));
  std::vector<unsigned char> out(256);
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemcpyDtoH(out.data(), va, out.size()));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemUnmap(va, G));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemRelease(h));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAddressFree(va, G));
}

TEST_CASE("access.cumemalloc_memory_rejected") {
  const std::size_t G = env().gran;
  CUdeviceptr p = 0;
  VSR_CU_REQUIRE_OK(cu().cuMemAlloc(&p, G));
  const CUmemAccessDesc d = access_desc();
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemSetAccess(p, G, &d, 1));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemFree(p));
}

TEST_CASE("access.unmapped_range_rejected") {
  const std::size_t G = env().gran;
  const CUdeviceptr va = reserve(2 * G);
  const CUmemAccessDesc d = access_desc();
  VSR_CU_FAILS(CUDA_ERROR_INVALID_VALUE, cu().cuMemSetAccess(va, G, &d, 1));
  const CUmemGenericAllocationHandle h = create(G);
  VSR_CU_REQUIRE_OK(cu().cuMemMap(va, G, 0, h, 0));
  VSR_CU_FAILS(CUDA_ERROR_INVALID_VALUE, cu().cuMemSetAccess(va, 2 * G, &d, 1));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemUnmap(va, G));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemRelease(h));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAddressFree(va, 2 * G));
}

TEST_CASE("access.bad_location_id") {
  const std::size_t G = env().gran;
  const CUdeviceptr va = reserve(G);
  const CUmemGenericAllocationHandle h = create(G);
  VSR_CU_REQUIRE_OK(cu().cuMemMap(va, G, 0, h, 0));
  CUmemAccessDesc d = access_desc();
  d.location.id = env().device_count + 7;
  VSR_CU_IS(CUDA_ERROR_INVALID_DEVICE, cu().cuMemSetAccess(va, G, &d, 1));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemUnmap(va, G));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemRelease(h));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAddressFree(va, G));
}

TEST_CASE("access.null_desc_or_zero_count") {
  const std::size_t G = env().gran;
  const CUdeviceptr va = reserve(G);
  const CUmemGenericAllocationHandle h = create(G);
  VSR_CU_REQUIRE_OK(cu().cuMemMap(va, G, 0, h, 0));
  const CUmemAccessDesc d = access_desc();
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemSetAccess(va, G, nullptr, 1));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemSetAccess(va, G, &d, 0));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemUnmap(va, G));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemRelease(h));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAddressFree(va, G));
}

TEST_CASE("getaccess.bad_arguments") {
  const std::size_t G = env().gran;
  const CUdeviceptr va = reserve(2 * G);
  const CUmemGenericAllocationHandle h = create(G);
  VSR_CU_REQUIRE_OK(cu().cuMemMap(va, G, 0, h, 0));
  const CUmemLocation loc = device_location();
  unsigned long long flags = 0;
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemGetAccess(nullptr, &loc, va));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemGetAccess(&flags, nullptr, va));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemGetAccess(&flags, &loc, va + G));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemUnmap(va, G));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemRelease(h));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAddressFree(va, 2 * G));
}

TEST_CASE("map.strict_shape_rules") {
  // The emulator's strict choices for the §10(b) questions: partial, offset, unaligned,
  // overlapping and zero-argument maps are rejected.
  const std::size_t G = env().gran;
  const CUdeviceptr va = reserve(4 * G);
  const CUmemGenericAllocationHandle h = create(2 * G);
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemMap(va, G, 0, h, 0));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemMap(va, G, G, h, 0));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemMap(va, 3 * G, 0, h, 0));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemMap(va + 4096, 2 * G, 0, h, 0));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemMap(0, 2 * G, 0, h, 0));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemMap(va, 0, 0, h, 0));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemMap(va, 2 * G, 0, 0, 0));
  VSR_CU_REQUIRE_OK(cu().cuMemMap(va, 2 * G, 0, h, 0));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemMap(va + G, 2 * G, 0, h, 0));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemUnmap(va, 2 * G));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemRelease(h));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAddressFree(va, 4 * G));
}

TEST_CASE("map.released_handle_rejected") {
  const std::size_t G = env().gran;
  const CUdeviceptr va = reserve(G);
  const CUmemGenericAllocationHandle h = create(G);
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemRelease(h));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemMap(va, G, 0, h, 0));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAddressFree(va, G));
}

TEST_CASE("unmap.one_call_over_adjacent_mappings") {
  const std::size_t G = env().gran;
  const std::size_t S = 8 * G;
  const CUdeviceptr va = reserve(2 * S);
  const std::size_t f0 = free_bytes();
  const CUmemGenericAllocationHandle h1 = create(S);
  const CUmemGenericAllocationHandle h2 = create(S);
  VSR_CU_REQUIRE_OK(cu().cuMemMap(va, S, 0, h1, 0));
  VSR_CU_REQUIRE_OK(cu().cuMemMap(va + S, S, 0, h2, 0));
  set_access(va, 2 * S);
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemRelease(h1));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemRelease(h2));
  const std::size_t f1 = free_bytes();
  check_free_delta(f0, f1, -2 * static_cast<long long>(S), "two handles created and mapped");
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemUnmap(va, 2 * S));
  const std::size_t f2 = free_bytes();
  check_free_delta(f1, f2, 2 * static_cast<long long>(S), "one unmap over both mappings");
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAddressFree(va, 2 * S));
}

TEST_CASE("unmap.subrange_rejected") {
  const std::size_t G = env().gran;
  const CUdeviceptr va = reserve(2 * G);
  const CUmemGenericAllocationHandle h = create(2 * G);
  VSR_CU_REQUIRE_OK(cu().cuMemMap(va, 2 * G, 0, h, 0));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemUnmap(va, G));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemUnmap(va + G, G));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemUnmap(va, 2 * G));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemRelease(h));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAddressFree(va, 2 * G));
}

TEST_CASE("unmap.range_with_gap_fails") {
  const std::size_t G = env().gran;
  const CUdeviceptr va = reserve(2 * G);
  const CUmemGenericAllocationHandle h = create(G);
  VSR_CU_REQUIRE_OK(cu().cuMemMap(va, G, 0, h, 0));
  VSR_CU_FAILS(CUDA_ERROR_INVALID_VALUE, cu().cuMemUnmap(va, 2 * G));
  // What a failed bulk unmap leaves behind is unverified (§10): only the strict emulator
  // promises the mapping is intact.
  const CUresult cleanup = cu().cuMemUnmap(va, G);
  if (env().strict) VSR_CU_IS(CUDA_SUCCESS, cleanup);
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemRelease(h));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAddressFree(va, 2 * G));
}

TEST_CASE("unmap.zero_arguments") {
  const std::size_t G = env().gran;
  const CUdeviceptr va = reserve(G);
  const CUmemGenericAllocationHandle h = create(G);
  VSR_CU_REQUIRE_OK(cu().cuMemMap(va, G, 0, h, 0));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemUnmap(0, G));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemUnmap(va, 0));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemUnmap(va, G));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemRelease(h));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAddressFree(va, G));
}

TEST_CASE("retain.same_handle_from_interior") {
  const std::size_t G = env().gran;
  const CUdeviceptr va = reserve(2 * G);
  const CUmemGenericAllocationHandle h = create(2 * G);
  VSR_CU_REQUIRE_OK(cu().cuMemMap(va, 2 * G, 0, h, 0));
  for (CUdeviceptr p : {va, va + 1, va + G + 12345, va + 2 * G - 1}) {
    CUmemGenericAllocationHandle r = 0;
    VSR_CU_IS(CUDA_SUCCESS, cu().cuMemRetainAllocationHandle(&r, reinterpret_cast<void*>(p)));
    CHECK_EQ(r, h);
    VSR_CU_IS(CUDA_SUCCESS, cu().cuMemRelease(r));
  }
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemUnmap(va, 2 * G));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemRelease(h));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAddressFree(va, 2 * G));
}

TEST_CASE("retain.bad_arguments") {
  const std::size_t G = env().gran;
  const CUdeviceptr va = reserve(2 * G);
  const CUmemGenericAllocationHandle h = create(G);
  VSR_CU_REQUIRE_OK(cu().cuMemMap(va, G, 0, h, 0));
  CUmemGenericAllocationHandle r = 0;
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE,
            cu().cuMemRetainAllocationHandle(nullptr, reinterpret_cast<void*>(va)));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemRetainAllocationHandle(&r, nullptr));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE,
            cu().cuMemRetainAllocationHandle(&r, reinterpret_cast<void*>(va + G)));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemUnmap(va, G));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE,
            cu().cuMemRetainAllocationHandle(&r, reinterpret_cast<void*>(va)));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemRelease(h));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAddressFree(va, 2 * G));
}

TEST_CASE("release.zero_handle") {
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemRelease(0));
}

TEST_CASE("release.double") {
  const CUmemGenericAllocationHandle h = create(env().gran);
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemRelease(h));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemRelease(h));
}

TEST_CASE("vmm.context_free") {
  // The VMM calls name their device and list no INVALID_CONTEXT (semantics §1.2, §10(a)).
  on_fresh_thread([] {
    const std::size_t G = env().gran;
    std::size_t g = 0;
    VSR_CU_IS(CUDA_SUCCESS, cu().cuMemGetAllocationGranularity(&g, &env().prop,
                                                               CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr va = 0;
    VSR_CU_REQUIRE_OK(cu().cuMemCreate(&h, G, &env().prop, 0));
    VSR_CU_REQUIRE_OK(cu().cuMemAddressReserve(&va, G, 0, 0, 0));
    VSR_CU_IS(CUDA_SUCCESS, cu().cuMemMap(va, G, 0, h, 0));
    const CUmemAccessDesc d = access_desc();
    VSR_CU_IS(CUDA_SUCCESS, cu().cuMemSetAccess(va, G, &d, 1));
    VSR_CU_IS(CUDA_SUCCESS, cu().cuMemUnmap(va, G));
    VSR_CU_IS(CUDA_SUCCESS, cu().cuMemRelease(h));
    VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAddressFree(va, G));
  });
}

TEST_CASE("reserve.pool_region_sizes") {
  // The pool reserves max(2 x device memory, request) per large region and the device's size per
  // small region (src/memory/vmm_pool.cpp, add_region), several at once; every granule of both
  // must be mappable. Real drivers grant such reservations (semantics §3.4.2: PyTorch, llama.cpp).
  std::size_t total = 0;
  VSR_CU_REQUIRE_OK(cu().cuDeviceTotalMem(&total, env().dev));
  const std::size_t G = env().gran;
  const std::size_t large = (2 * total + G - 1) / G * G;
  const std::size_t small = (total + G - 1) / G * G;
  CUdeviceptr big = 0;
  const CUresult r = cu().cuMemAddressReserve(&big, large, 0, 0, 0);
  if (r == CUDA_ERROR_OUT_OF_MEMORY && !env().real_driver) {
    VSR_CONF_NOT_APPLICABLE("the emulator's address space is limited (VSR_EMU_ADDRESS_SPACE)");
  }
  VSR_CU_REQUIRE_OK(r);
  CUdeviceptr little = 0;
  const CUresult r2 = cu().cuMemAddressReserve(&little, small, 0, 0, 0);
  if (r2 == CUDA_ERROR_OUT_OF_MEMORY && !env().real_driver) {
    VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAddressFree(big, large));
    VSR_CONF_NOT_APPLICABLE("the emulator's address space is limited (VSR_EMU_ADDRESS_SPACE)");
  }
  VSR_CU_REQUIRE_OK(r2);
  // The last granule of each region, and the first of the large one, take a mapping.
  const CUmemGenericAllocationHandle h = create(G);
  for (CUdeviceptr at : {big, big + large - G, little + small - G}) {
    VSR_CU_REQUIRE_OK(cu().cuMemMap(at, G, 0, h, 0));
    set_access(at, G);
    check_roundtrip(at + G - 512, at + G - 512, 512, 7);
    VSR_CU_IS(CUDA_SUCCESS, cu().cuMemUnmap(at, G));
  }
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemRelease(h));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAddressFree(little, small));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAddressFree(big, large));
}

TEST_CASE("access.reset_after_unmap_and_remap") {
  // cuda.h (cuMemUnmap): "Any new mapping to this virtual address will need to have access
  // granted through cuMemSetAccess, as all mappings start with no accessibility setup."
  const std::size_t G = env().gran;
  const CUdeviceptr va = reserve(G);
  const CUmemGenericAllocationHandle h1 = create(G);
  const CUmemGenericAllocationHandle h2 = create(G);
  const CUmemLocation loc = device_location();
  unsigned long long flags = 77;
  VSR_CU_REQUIRE_OK(cu().cuMemMap(va, G, 0, h1, 0));
  set_access(va, G);
  check_roundtrip(va, va, 256, 8);
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemUnmap(va, G));
  // The same handle again: no access.
  VSR_CU_REQUIRE_OK(cu().cuMemMap(va, G, 0, h1, 0));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemGetAccess(&flags, &loc, va));
  CHECK_EQ(flags, static_cast<unsigned long long>(CU_MEM_ACCESS_FLAGS_PROT_NONE));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemUnmap(va, G));
  // Another handle: no access either.
  flags = 77;
  VSR_CU_REQUIRE_OK(cu().cuMemMap(va, G, 0, h2, 0));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemGetAccess(&flags, &loc, va));
  CHECK_EQ(flags, static_cast<unsigned long long>(CU_MEM_ACCESS_FLAGS_PROT_NONE));
  set_access(va, G);
  check_roundtrip(va, va, 256, 9);
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemUnmap(va, G));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemRelease(h1));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemRelease(h2));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAddressFree(va, G));
}

TEST_CASE("unmap.tail_of_adjacent_mappings") {
  // One cuMemUnmap over the last two of three back-to-back mappings; the first stays usable
  // (semantics §3.4.7: one call may cover several whole, adjacent mappings).
  const std::size_t G = env().gran;
  const CUdeviceptr va = reserve(4 * G);
  const CUmemGenericAllocationHandle h1 = create(G);
  const CUmemGenericAllocationHandle h2 = create(G);
  const CUmemGenericAllocationHandle h3 = create(2 * G);
  VSR_CU_REQUIRE_OK(cu().cuMemMap(va, G, 0, h1, 0));
  VSR_CU_REQUIRE_OK(cu().cuMemMap(va + G, G, 0, h2, 0));
  VSR_CU_REQUIRE_OK(cu().cuMemMap(va + 2 * G, 2 * G, 0, h3, 0));
  set_access(va, 4 * G);
  check_roundtrip(va + G - 256, va + G - 256, 512, 10);
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemUnmap(va + G, 3 * G));
  check_roundtrip(va, va, 4096, 11);
  check_roundtrip(va + G - 256, va + G - 256, 256, 12);
  // The tail is plain reservation again: it can be mapped anew.
  VSR_CU_REQUIRE_OK(cu().cuMemMap(va + G, G, 0, h2, 0));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemUnmap(va, 2 * G));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemRelease(h1));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemRelease(h2));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemRelease(h3));
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemAddressFree(va, 4 * G));
}

}  // namespace vsr_conf
