/* SPDX-License-Identifier: Apache-2.0 */
/* Test-only control API of the host CUDA driver emulator (libvsr-cuda-emulator.so).
 *
 * The emulator exports the subset of the CUDA 13.0 driver API the runtime uses and backs device
 * memory with host memory (reference/cuda-vmm-semantics.md). These extra functions let tests
 * inspect and steer it. Resolve them with dlsym on the handle of the emulator. Every function is
 * thread-safe and may be called before cuInit.
 *
 * Environment (read when the library is loaded; VSR_EMU_FAIL at the first cuInit):
 *   VSR_EMU_DEVICE_COUNT (1), VSR_EMU_DEVICE_MEMORY (bytes per device, 8 GiB),
 *   VSR_EMU_GRANULARITY (2 MiB), VSR_EMU_RECOMMENDED_GRANULARITY (= granularity),
 *   VSR_EMU_CONTEXT_OVERHEAD (0), VSR_EMU_VMM (1), VSR_EMU_MANAGED (1), VSR_EMU_MEMORY_POOLS (1),
 *   VSR_EMU_SYNC (0: each created stream has a worker thread), VSR_EMU_STICKY (1: bad device
 *   accesses return CUDA_ERROR_ILLEGAL_ADDRESS and poison the context), VSR_EMU_DRIVER_VERSION
 *   (13000), VSR_EMU_FAIL (fault plan, see vsr_emu_set_fail), VSR_EMU_REPORT (1: print the
 *   outstanding objects to stderr at exit). */
#ifndef VIBESPATIAL_RASTER_VSR_EMULATOR_H
#define VIBESPATIAL_RASTER_VSR_EMULATOR_H

#include <cuda.h>

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Live emulator objects, for leak checks. */
typedef struct vsr_emu_outstanding {
  size_t reservations;   /* cuMemAddressReserve ranges not yet freed */
  size_t reserved_bytes; /* their total size */
  size_t handles;        /* cuMemCreate allocations whose backing is alive (refs > 0 or maps > 0) */
  size_t physical_bytes; /* bytes charged by those */
  size_t mappings;       /* cuMemMap mappings */
  size_t allocations;    /* live cuMemAlloc and cuMemAllocAsync allocations */
  size_t allocation_bytes; /* their total size */
  size_t managed;          /* live cuMemAllocManaged allocations */
  size_t managed_bytes;    /* their total size */
  size_t host_allocations; /* live cuMemHostAlloc / cuMemAllocHost allocations */
  size_t host_bytes;       /* their total size */
  size_t streams;          /* created, not destroyed streams */
  size_t events;           /* created, not destroyed events */
} vsr_emu_outstanding;

/* Fills *out with the live objects of `device` (-1: all devices; reservations and host
 * allocations belong to no device and are counted for every `device`). Returns a CUresult value:
 * CUDA_SUCCESS, CUDA_ERROR_INVALID_VALUE (out NULL) or CUDA_ERROR_INVALID_DEVICE. */
int vsr_emu_query_outstanding(vsr_emu_outstanding* out, int device);

/* Replaces the fault plan and restarts every call count. `spec` is a comma list of
 * `entry:N[:CUDA_ERROR_NAME]` (the Nth call of entry point `entry` fails) or `entry:N+[:NAME]`
 * (the Nth and every later call fail). `entry` is the base name (cuMemCreate); _v2/_ptds/_ptsz
 * suffixes name the same entry. A failing call has no side effects and writes no out-parameter.
 * Default error: CUDA_ERROR_OUT_OF_MEMORY for allocating entries, else CUDA_ERROR_UNKNOWN.
 * NULL or "" clears the plan. Returns 0, or 1 (CUDA_ERROR_INVALID_VALUE) on a bad spec (the
 * previous plan is kept). */
int vsr_emu_set_fail(const char* spec);

/* Calls of entry point `entry` (base name, suffixes ignored) since the fault plan was last set,
 * including calls that failed. */
unsigned long long vsr_emu_call_count(const char* entry);

/* Changes one option at run time; `name` without the VSR_EMU_ prefix: DEVICE_MEMORY, VMM, MANAGED,
 * MEMORY_POOLS, GRANULARITY, RECOMMENDED_GRANULARITY, CONTEXT_OVERHEAD, SYNC, STICKY. Returns 0,
 * 1 (CUDA_ERROR_INVALID_VALUE: unknown name or bad value) or 800 (CUDA_ERROR_NOT_PERMITTED: the
 * change would break live objects, e.g. a capacity below what is charged, a new granularity
 * while VMM allocations exist, VMM off while VMM objects exist). SYNC applies to streams created
 * afterwards. */
int vsr_emu_set_option(const char* name, const char* value);

/* Holds (paused != 0) or releases the worker of a created stream: queued work, event markers and
 * stream-ordered frees stay pending while held (the operation already running finishes). Returns
 * 0, 400 (CUDA_ERROR_INVALID_HANDLE: not a live created stream) or 801 (CUDA_ERROR_NOT_SUPPORTED:
 * the stream runs inline because it was created with SYNC=1). cuStreamDestroy releases a hold. */
int vsr_emu_stream_pause(CUstream stream, int paused);

/* One line: version, devices, memory, granularity and flags. The string belongs to the calling
 * thread and stays valid until its next call. */
const char* vsr_emu_describe(void);

#ifdef __cplusplus
}
#endif

#endif /* VIBESPATIAL_RASTER_VSR_EMULATOR_H */
