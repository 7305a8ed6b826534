/* SPDX-License-Identifier: Apache-2.0 */
/* A test driver library that forwards cuGetProcAddress_v2 to the host emulator
 * (VSR_HIDING_DRIVER_TARGET, a path) but answers "symbol not found" for the entry points named in
 * VSR_HIDING_DRIVER_HIDE (comma-separated): a driver that lacks them, for the driver seam's tests
 * of required, VMM and optional entries. */
#define _GNU_SOURCE 1

#include <cuda.h>

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

typedef CUresult (*get_proc_fn)(const char*, void**, int, cuuint64_t,
                                CUdriverProcAddressQueryResult*);

static int hidden(const char* symbol) {
  const char* list = getenv("VSR_HIDING_DRIVER_HIDE");
  const size_t n = strlen(symbol);
  while (list != NULL && *list != '\0') {
    const char* end = strchr(list, ',');
    const size_t len = end != NULL ? (size_t)(end - list) : strlen(list);
    if (len == n && strncmp(list, symbol, n) == 0) return 1;
    list = end != NULL ? end + 1 : NULL;
  }
  return 0;
}

__attribute__((visibility("default"))) CUresult cuGetProcAddress_v2(
    const char* symbol, void** pfn, int version, cuuint64_t flags,
    CUdriverProcAddressQueryResult* status) {
  static get_proc_fn target = NULL;
  if (target == NULL) {
    const char* path = getenv("VSR_HIDING_DRIVER_TARGET");
    void* h = path != NULL ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
    if (h == NULL) return CUDA_ERROR_NOT_INITIALIZED;
    target = (get_proc_fn)dlsym(h, "cuGetProcAddress_v2");
    if (target == NULL) return CUDA_ERROR_NOT_INITIALIZED;
  }
  if (symbol != NULL && hidden(symbol)) {
    if (pfn != NULL) *pfn = NULL;
    if (status != NULL) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_ERROR_NOT_FOUND;
  }
  return target(symbol, pfn, version, flags, status);
}
