// SPDX-License-Identifier: Apache-2.0
#include "driver_table.hpp"

#include <dlfcn.h>

#include <cstdlib>

namespace vsr_conf {
namespace {

template <class Pfn>
struct missing_entry;

template <class... Args>
struct missing_entry<CUresult(CUDAAPI*)(Args...)> {
  static CUresult CUDAAPI call(Args...) { return CUDA_ERROR_NOT_FOUND; }
};

template <class Pfn>
void resolve(Driver& d, Pfn& slot, const char* base, const char* exported, int version) {
  void* pfn = nullptr;
  auto status = static_cast<CUdriverProcAddressQueryResult>(-1);
  CUresult r = d.cuGetProcAddress_v2(base, &pfn, version, CU_GET_PROC_ADDRESS_DEFAULT, &status);
  d.resolutions.push_back({base, exported, version, r, status, pfn});
  slot = (r == CUDA_SUCCESS && pfn != nullptr) ? reinterpret_cast<Pfn>(pfn)
                                               : &missing_entry<Pfn>::call;
}

}  // namespace

void* Driver::exported(const char* name) const {
  return library == nullptr ? nullptr : dlsym(library, name);
}

bool load_driver(Driver& d, std::string* why) {
  const char* env = std::getenv("VIBESPATIAL_CUDA_DRIVER");
  d.path = (env != nullptr && env[0] != '\0') ? env : "libcuda.so.1";
  d.library = dlopen(d.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (d.library == nullptr) {
    const char* err = dlerror();
    *why = "cannot load " + d.path + ": " + (err != nullptr ? err : "unknown dlopen error");
    return false;
  }
  d.cuGetProcAddress_v2 =
      reinterpret_cast<PFN_cuGetProcAddress_v12000>(dlsym(d.library, "cuGetProcAddress_v2"));
  if (d.cuGetProcAddress_v2 == nullptr) {
    *why = d.path + " does not export cuGetProcAddress_v2";
    return false;
  }
#define VSR_CONF_RESOLVE(base, exported, version) resolve(d, d.base, #base, #exported, version);
  VSR_CONF_ENTRIES(VSR_CONF_RESOLVE)
#undef VSR_CONF_RESOLVE
  return true;
}

}  // namespace vsr_conf
