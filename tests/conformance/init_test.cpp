// SPDX-License-Identifier: Apache-2.0
// Initialization, symbol resolution, devices, contexts and error names (semantics §1–§3.3, §3.8).
#include "harness.hpp"

#include <cuda.h>

#include <doctest/doctest.h>

#include <cstring>
#include <string>

namespace vsr_conf {
namespace {

void* resolve_at(const char* symbol, int version, cuuint64_t flags = CU_GET_PROC_ADDRESS_DEFAULT) {
  void* pfn = nullptr;
  CUdriverProcAddressQueryResult status{};
  CHECK_EQ(error_name(cu().cuGetProcAddress_v2(symbol, &pfn, version, flags, &status)),
           std::string("CUDA_SUCCESS"));
  CHECK_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS);
  return pfn;
}

void check_resolves_to(const char* symbol, int version, const char* exported,
                       cuuint64_t flags = CU_GET_PROC_ADDRESS_DEFAULT) {
  INFO(symbol << " @" << version << " flags " << flags << " -> " << exported);
  void* want = cu().exported(exported);
  REQUIRE(want != nullptr);
  CHECK_EQ(resolve_at(symbol, version, flags), want);
}

}  // namespace

TEST_CASE("preinit.calls_return_not_initialized") {
  const PreInit& p = env().pre;
  CHECK_EQ(error_name(p.device_get_count), std::string("CUDA_ERROR_NOT_INITIALIZED"));
  CHECK_EQ(error_name(p.device_get), std::string("CUDA_ERROR_NOT_INITIALIZED"));
}

TEST_CASE("preinit.context_calls_fail_without_writing") {
  const PreInit& p = env().pre;
  CHECK_EQ(error_name(p.ctx_get_current), std::string("CUDA_ERROR_NOT_INITIALIZED"));
  CHECK_FALSE(p.ctx_get_current_wrote);
  CHECK_EQ(error_name(p.ctx_set_current_null), std::string("CUDA_ERROR_NOT_INITIALIZED"));
  CHECK_EQ(error_name(p.ctx_get_device), std::string("CUDA_ERROR_NOT_INITIALIZED"));
}

TEST_CASE("preinit.lookups_work") {
  const PreInit& p = env().pre;
  CHECK_EQ(error_name(p.error_name), std::string("CUDA_SUCCESS"));
  CHECK_EQ(p.error_name_text, std::string("CUDA_ERROR_INVALID_VALUE"));
  CHECK_EQ(error_name(p.error_string), std::string("CUDA_SUCCESS"));
  CHECK(p.error_string_present);
  // Every pinned entry point was resolved before cuInit (cuda-python's order).
  for (const Resolution& r : cu().resolutions) {
    INFO(r.base << " @" << r.version);
    CHECK_EQ(error_name(r.result), std::string("CUDA_SUCCESS"));
    CHECK_EQ(r.status, CU_GET_PROC_ADDRESS_SUCCESS);
    CHECK(r.pfn != nullptr);
  }
}

TEST_CASE("preinit.driver_get_version") {
  CHECK_EQ(error_name(env().pre.driver_get_version), std::string("CUDA_SUCCESS"));
  CHECK_EQ(env().pre.driver_version, env().driver_version);
}

TEST_CASE("init.flags_must_be_zero") {
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuInit(1));
}

TEST_CASE("init.repeat_succeeds") {
  VSR_CU_IS(CUDA_SUCCESS, cu().cuInit(0));
}

TEST_CASE("version.driver_version") {
  int v = -1;
  VSR_CU_IS(CUDA_SUCCESS, cu().cuDriverGetVersion(&v));
  CHECK(v >= 2000);
  CHECK_EQ(v % 10, 0);
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuDriverGetVersion(nullptr));
}

TEST_CASE("gpa.matches_dlsym_exports") {
  for (const Resolution& r : cu().resolutions) {
    INFO(r.base << " @" << r.version << " -> " << r.exported);
    void* want = cu().exported(r.exported);
    REQUIRE(want != nullptr);
    CHECK_EQ(r.pfn, want);
  }
}

TEST_CASE("gpa.largest_version_not_above_request") {
  check_resolves_to("cuMemAlloc", 2000, "cuMemAlloc");
  check_resolves_to("cuMemAlloc", 3010, "cuMemAlloc");
  check_resolves_to("cuMemAlloc", 3020, "cuMemAlloc_v2");
  check_resolves_to("cuMemAlloc", 12000, "cuMemAlloc_v2");
  check_resolves_to("cuMemGetInfo", 2000, "cuMemGetInfo");
  check_resolves_to("cuMemGetInfo", 12000, "cuMemGetInfo_v2");
  check_resolves_to("cuDevicePrimaryCtxRelease", 7000, "cuDevicePrimaryCtxRelease");
  check_resolves_to("cuDevicePrimaryCtxRelease", 10020, "cuDevicePrimaryCtxRelease");
  check_resolves_to("cuDevicePrimaryCtxRelease", 11000, "cuDevicePrimaryCtxRelease_v2");
  check_resolves_to("cuStreamDestroy", 3020, "cuStreamDestroy");
  check_resolves_to("cuStreamDestroy", 4000, "cuStreamDestroy_v2");
  check_resolves_to("cuMemCreate", 12000, "cuMemCreate");
  check_resolves_to("cuGetProcAddress", 11030, "cuGetProcAddress");
  check_resolves_to("cuGetProcAddress", 12000, "cuGetProcAddress_v2");
}

TEST_CASE("gpa.ctx_synchronize_split") {
  // Same base name, different signature: cuCtxSynchronize(void) up to 12.9,
  // cuCtxSynchronize_v2(CUcontext) from 13.0 (semantics §2.2).
  check_resolves_to("cuCtxSynchronize", 12090, "cuCtxSynchronize");
  check_resolves_to("cuCtxGetDevice", 12090, "cuCtxGetDevice");
  if (env().driver_version >= 13000) {
    check_resolves_to("cuCtxSynchronize", 13000, "cuCtxSynchronize_v2");
    check_resolves_to("cuCtxGetDevice", 13000, "cuCtxGetDevice_v2");
  } else {
    MESSAGE("driver " << env().driver_version << " < 13000: the 13000 half is not applicable");
  }
}

TEST_CASE("gpa.per_thread_default_stream") {
  const cuuint64_t ptds = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  check_resolves_to("cuMemcpyHtoD", 12000, "cuMemcpyHtoD_v2_ptds", ptds);
  check_resolves_to("cuStreamSynchronize", 12000, "cuStreamSynchronize_ptsz", ptds);
  check_resolves_to("cuMemAllocAsync", 12000, "cuMemAllocAsync_ptsz", ptds);
  check_resolves_to("cuMemcpyHtoD", 12000, "cuMemcpyHtoD_v2");
  check_resolves_to("cuStreamSynchronize", 12000, "cuStreamSynchronize");
}

TEST_CASE("gpa.version_not_sufficient") {
  void* pfn = reinterpret_cast<void*>(1);
  auto status = static_cast<CUdriverProcAddressQueryResult>(77);
  VSR_CU_IS(CUDA_SUCCESS, cu().cuGetProcAddress_v2("cuMemCreate", &pfn, 10010, 0, &status));
  CHECK(pfn == nullptr);
  CHECK_EQ(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
}

TEST_CASE("gpa.unknown_symbol") {
  void* pfn = reinterpret_cast<void*>(1);
  auto status = static_cast<CUdriverProcAddressQueryResult>(77);
  VSR_CU_IS(CUDA_SUCCESS, cu().cuGetProcAddress_v2("cuNoSuchEntryPoint", &pfn, 12000, 0, &status));
  CHECK(pfn == nullptr);
  CHECK_EQ(status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
}

TEST_CASE("gpa.version_above_driver") {
  void* pfn = nullptr;
  CUdriverProcAddressQueryResult status{};
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE,
            cu().cuGetProcAddress_v2("cuMemAlloc", &pfn, env().driver_version + 10, 0, &status));
}

TEST_CASE("gpa.null_status_allowed") {
  void* pfn = nullptr;
  VSR_CU_IS(CUDA_SUCCESS, cu().cuGetProcAddress_v2("cuMemAlloc", &pfn, 3020, 0, nullptr));
  CHECK_EQ(pfn, cu().exported("cuMemAlloc_v2"));
}

TEST_CASE("gpa.legacy_four_argument_entry") {
  auto gpa = reinterpret_cast<PFN_cuGetProcAddress_v11030>(cu().exported("cuGetProcAddress"));
  REQUIRE(reinterpret_cast<void*>(gpa) != nullptr);
  void* pfn = nullptr;
  VSR_CU_IS(CUDA_SUCCESS, gpa("cuMemAlloc", &pfn, 3020, 0));
  CHECK_EQ(pfn, cu().exported("cuMemAlloc_v2"));
}

TEST_CASE("gpa.versioned_name_not_found") {
  void* pfn = reinterpret_cast<void*>(1);
  auto status = static_cast<CUdriverProcAddressQueryResult>(77);
  VSR_CU_IS(CUDA_SUCCESS, cu().cuGetProcAddress_v2("cuMemAlloc_v2", &pfn, 12000, 0, &status));
  CHECK(pfn == nullptr);
  CHECK_EQ(status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
}

TEST_CASE("gpa.bad_arguments_rejected") {
  void* pfn = nullptr;
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE,
            cu().cuGetProcAddress_v2("cuMemAlloc", nullptr, 12000, 0, nullptr));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuGetProcAddress_v2(nullptr, &pfn, 12000, 0, nullptr));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE,
            cu().cuGetProcAddress_v2("cuMemAlloc", &pfn, 12000, 4, nullptr));
}

TEST_CASE("gpa.legacy_unknown_not_found") {
  auto gpa = reinterpret_cast<PFN_cuGetProcAddress_v11030>(cu().exported("cuGetProcAddress"));
  REQUIRE(reinterpret_cast<void*>(gpa) != nullptr);
  void* pfn = nullptr;
  VSR_CU_IS(CUDA_ERROR_NOT_FOUND, gpa("cuNoSuchEntryPoint", &pfn, 11030, 0));
}

TEST_CASE("error.names") {
  const struct {
    CUresult code;
    const char* name;
  } table[] = {
      {CUDA_SUCCESS, "CUDA_SUCCESS"},
      {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE"},
      {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY"},
      {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED"},
      {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED"},
      {CUDA_ERROR_STUB_LIBRARY, "CUDA_ERROR_STUB_LIBRARY"},
      {CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA_ERROR_DEVICE_UNAVAILABLE"},
      {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE"},
      {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE"},
      {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT"},
      {CUDA_ERROR_ALREADY_MAPPED, "CUDA_ERROR_ALREADY_MAPPED"},
      {CUDA_ERROR_NOT_MAPPED, "CUDA_ERROR_NOT_MAPPED"},
      {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE"},
      {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE"},
      {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND"},
      {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY"},
      {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS"},
      {CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED"},
      {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED"},
      {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED"},
      {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN"},
  };
  for (const auto& row : table) {
    const char* s = nullptr;
    INFO("code " << static_cast<int>(row.code));
    VSR_CU_IS(CUDA_SUCCESS, cu().cuGetErrorName(row.code, &s));
    REQUIRE(s != nullptr);
    CHECK_EQ(std::string(s), std::string(row.name));
  }
}

TEST_CASE("error.unknown_code") {
  const char* s = "sentinel";
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuGetErrorName(static_cast<CUresult>(9999), &s));
  CHECK(s == nullptr);
  s = "sentinel";
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuGetErrorString(static_cast<CUresult>(9999), &s));
  CHECK(s == nullptr);
}

TEST_CASE("error.strings_present") {
  for (CUresult code : {CUDA_SUCCESS, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_READY,
                        CUDA_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_UNKNOWN}) {
    const char* s = nullptr;
    INFO("code " << static_cast<int>(code));
    VSR_CU_IS(CUDA_SUCCESS, cu().cuGetErrorString(code, &s));
    REQUIRE(s != nullptr);
    CHECK(std::strlen(s) > 0);
  }
}

TEST_CASE("device.count_and_get") {
  int n = -1;
  VSR_CU_IS(CUDA_SUCCESS, cu().cuDeviceGetCount(&n));
  CHECK(n >= 1);
  CHECK_EQ(n, env().device_count);
  CUdevice d = -1;
  VSR_CU_IS(CUDA_SUCCESS, cu().cuDeviceGet(&d, 0));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuDeviceGetCount(nullptr));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuDeviceGet(nullptr, 0));
}

TEST_CASE("device.bad_ordinal") {
  const int n = env().device_count;
  CUdevice d = 0;
  int value = 0;
  std::size_t bytes = 0;
  CUcontext c = nullptr;
  VSR_CU_IS(CUDA_ERROR_INVALID_DEVICE, cu().cuDeviceGet(&d, n));
  VSR_CU_IS(CUDA_ERROR_INVALID_DEVICE, cu().cuDeviceGet(&d, -1));
  VSR_CU_IS(CUDA_ERROR_INVALID_DEVICE,
            cu().cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, n));
  VSR_CU_IS(CUDA_ERROR_INVALID_DEVICE, cu().cuDeviceTotalMem(&bytes, n));
  VSR_CU_IS(CUDA_ERROR_INVALID_DEVICE, cu().cuDevicePrimaryCtxRetain(&c, n));
}

TEST_CASE("device.attribute_without_context") {
  on_fresh_thread([] {
    int vmm = -1;
    VSR_CU_IS(CUDA_SUCCESS,
              cu().cuDeviceGetAttribute(
                  &vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, env().dev));
    CHECK((vmm == 0 || vmm == 1));
    std::size_t bytes = 0;
    VSR_CU_IS(CUDA_SUCCESS, cu().cuDeviceTotalMem(&bytes, env().dev));
    CHECK(bytes > 0);
  });
}

TEST_CASE("device.attribute_null_out") {
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE,
            cu().cuDeviceGetAttribute(nullptr, CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, env().dev));
}

TEST_CASE("device.attribute_max_rejected") {
  int value = 0;
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE,
            cu().cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_MAX, env().dev));
}

TEST_CASE("ctx.release_without_retain") {
  CHECK_EQ(error_name(env().release_before_retain), std::string("CUDA_ERROR_INVALID_CONTEXT"));
}

TEST_CASE("ctx.primary_retain_same_and_not_current") {
  on_fresh_thread([] {
    CUcontext a = nullptr;
    CUcontext b = nullptr;
    VSR_CU_IS(CUDA_SUCCESS, cu().cuDevicePrimaryCtxRetain(&a, env().dev));
    VSR_CU_IS(CUDA_SUCCESS, cu().cuDevicePrimaryCtxRetain(&b, env().dev));
    CHECK(a != nullptr);
    CHECK_EQ(a, b);
    CHECK_EQ(a, env().ctx);
    CUcontext current = reinterpret_cast<CUcontext>(1);
    VSR_CU_IS(CUDA_SUCCESS, cu().cuCtxGetCurrent(&current));
    CHECK(current == nullptr);
    VSR_CU_IS(CUDA_SUCCESS, cu().cuDevicePrimaryCtxRelease(env().dev));
    VSR_CU_IS(CUDA_SUCCESS, cu().cuDevicePrimaryCtxRelease(env().dev));
  });
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuDevicePrimaryCtxRetain(nullptr, env().dev));
}

TEST_CASE("ctx.set_and_get_current") {
  on_fresh_thread([] {
    VSR_CU_IS(CUDA_SUCCESS, cu().cuCtxSetCurrent(env().ctx));
    CUcontext current = nullptr;
    VSR_CU_IS(CUDA_SUCCESS, cu().cuCtxGetCurrent(&current));
    CHECK_EQ(current, env().ctx);
    CUdevice d = -1;
    VSR_CU_IS(CUDA_SUCCESS, cu().cuCtxGetDevice(&d));
    CHECK_EQ(d, env().dev);
    VSR_CU_IS(CUDA_SUCCESS, cu().cuCtxSynchronize());
    VSR_CU_IS(CUDA_SUCCESS, cu().cuCtxSetCurrent(nullptr));
    current = reinterpret_cast<CUcontext>(1);
    VSR_CU_IS(CUDA_SUCCESS, cu().cuCtxGetCurrent(&current));
    CHECK(current == nullptr);
  });
}

TEST_CASE("ctx.fresh_thread_needs_context") {
  // The primary context is retained and current on the main thread; that does not make it
  // current here (semantics §1.2, HAMi-core #172).
  on_fresh_thread([] {
    std::size_t free = 0;
    std::size_t total = 0;
    CUdeviceptr p = 0;
    CUdevice d = 0;
    CUstream s = nullptr;
    CUevent e = nullptr;
    VSR_CU_IS(CUDA_ERROR_INVALID_CONTEXT, cu().cuMemGetInfo(&free, &total));
    VSR_CU_IS(CUDA_ERROR_INVALID_CONTEXT, cu().cuMemAlloc(&p, 1 << 20));
    VSR_CU_IS(CUDA_ERROR_INVALID_CONTEXT, cu().cuCtxGetDevice(&d));
    VSR_CU_IS(CUDA_ERROR_INVALID_CONTEXT, cu().cuCtxSynchronize());
    VSR_CU_IS(CUDA_ERROR_INVALID_CONTEXT, cu().cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    VSR_CU_IS(CUDA_ERROR_INVALID_CONTEXT, cu().cuEventCreate(&e, CU_EVENT_DEFAULT));
    VSR_CU_IS(CUDA_ERROR_INVALID_CONTEXT, cu().cuStreamSynchronize(nullptr));
    VSR_CU_IS(CUDA_ERROR_INVALID_CONTEXT, cu().cuMemAllocAsync(&p, 1 << 20, nullptr));
  });
}

TEST_CASE("ctx.get_current_null_out") {
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuCtxGetCurrent(nullptr));
}

TEST_CASE("meminfo.query") {
  std::size_t free = 0;
  std::size_t total = 0;
  VSR_CU_IS(CUDA_SUCCESS, cu().cuMemGetInfo(&free, &total));
  CHECK(total > 0);
  CHECK(free <= total);
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemGetInfo(nullptr, &total));
  VSR_CU_IS(CUDA_ERROR_INVALID_VALUE, cu().cuMemGetInfo(&free, nullptr));
}

}  // namespace vsr_conf
