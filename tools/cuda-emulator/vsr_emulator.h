/* SPDX-License-Identifier: Apache-2.0 */
/* Test-only control API of the host CUDA driver emulator (libvsr-cuda-emulator.so).
 *
 * The emulator exports the subset of the CUDA 13.0 driver API the runtime uses and backs device
 * memory with host memory (docs/cuda-driver-rules.md). These extra functions let tests
 * inspect and steer it. Resolve them with dlsym on the handle of the emulator. Every function is
 * thread-safe and may be called before cuInit.
 *
 * Environment (read when the library is loaded; VSR_EMU_FAIL at the first cuInit):
 *   VSR_EMU_DEVICE_COUNT (1), VSR_EMU_DEVICE_MEMORY (bytes per device, 8 GiB),
 *   VSR_EMU_GRANULARITY (2 MiB), VSR_EMU_RECOMMENDED_GRANULARITY (= granularity),
 *   VSR_EMU_CONTEXT_OVERHEAD (0; bytes, or "<p>%" of the device memory), VSR_EMU_VMM (1),
 *   VSR_EMU_MANAGED (1), VSR_EMU_MEMORY_POOLS (1), VSR_EMU_SYNC (0: each created stream has a
 *   worker thread; 1: all work runs inline, default streams too), VSR_EMU_STICKY (1: bad device
 *   accesses return CUDA_ERROR_ILLEGAL_ADDRESS and poison the context), VSR_EMU_DRIVER_VERSION
 *   (13000), VSR_EMU_FAIL (fault plan, see vsr_emu_set_fail), VSR_EMU_REPORT (1: print the
 *   outstanding objects to stderr at exit).
 *
 * Closed leniencies: on by default (a strict choice where the driver's answer is unverified or
 * where it may not be lenient); 0 reopens each.
 *   VSR_EMU_REQUIRE_CONTEXT (1) calls on created streams and on events fail with
 *       CUDA_ERROR_INVALID_CONTEXT on a thread with no current context.
 *   VSR_EMU_STICKY_VMM (1) once a context holds a sticky error, the VMM calls (reserve, free,
 *       create, release, map, unmap, set-access, retain) do their work and then return it
 *       (cuda.h \notefnerr); retrying such a call repeats it.
 *   VSR_EMU_MEMINFO_QUANTUM (2097152) cuMemGetInfo's free is rounded down to a multiple of this
 *       many bytes (0: exact to the byte).
 * Always strict: cuMemUnmap and cuMemSetAccess take only ranges of whole mappings with no gap
 * inside one reservation; cuMemFree of cuMemAllocAsync memory does not wait for queued work.
 *
 * Adversarial modes: where the driver's contract leaves a choice, these take the harshest one a
 * real driver may make. Each is off by default; VSR_EMU_ADVERSARIAL=1 turns on every mode marked
 * [A] at once (with the value given) and keeps the closed leniencies on; a mode's own variable,
 * when set, overrides it.
 *   VSR_EMU_ASYNC_DEFAULT_STREAMS [A] the legacy NULL stream runs on one worker per context and
 *       CU_STREAM_PER_THREAD (and the _ptds/_ptsz entries' stream 0) on one worker per thread.
 *       A blocking stream's task waits for the legacy stream's earlier work and a legacy task for
 *       the blocking streams' earlier work, on the workers; callers return at once except where
 *       the driver blocks them (cuMemcpyDtoH; cuMemcpyHtoD waits for the stream's earlier work
 *       and reads the source before it returns). CU_STREAM_NON_BLOCKING streams take no part.
 *       Off: default-stream work runs inline in the calling thread.
 *   VSR_EMU_RECYCLE_HANDLES [A] a destroyed stream's (event's) handle value is handed to the
 *       next cuStreamCreate (cuEventCreate) at once, even while its work is still queued, as the
 *       real driver does (RMM #649). Off: values are not reused until 1 Mi handles were made.
 *   VSR_EMU_FREE_NO_SYNC [A] cuMemFree does not wait for queued work (the driver only "may"
 *       synchronise).
 *   VSR_EMU_LATE_WORK [A: 50us] each task a stream worker runs (copies, host functions, event
 *       markers, waits) first waits a random time up to this long ("0" or <number><ns|us|ms|s>):
 *       stream work runs late, and work on streams that do not wait for each other runs in any
 *       order, so a missing wait shows up as wrong data. Work that runs inline is not delayed.
 *   VSR_EMU_ADDRESS_SPACE [A: 1.5x] cuMemAddressReserve returns CUDA_ERROR_OUT_OF_MEMORY once
 *       live reservations would exceed this many bytes, or "<f>x" times the memory of all
 *       devices (0: unlimited).
 *   VSR_EMU_CONTEXT_OVERHEAD [A: 2%] (see above).
 * Diagnostics and cost model (not part of VSR_EMU_ADVERSARIAL):
 *   VSR_EMU_ABORT_ON_MISUSE (0) 1: a stale handle use or an unmap/free under queued work prints
 *       what happened with the entry point's name and aborts (else it is only counted).
 *   VSR_EMU_LATENCY ("") time each call of a named entry point spends before it runs: a comma
 *       list of `entry:<number><ns|us|ms|s>` (base names, e.g. "cuMemMap:20us,cuMemSetAccess:36us")
 *       and presets ("a100": reserve 19us, create 193us, map 1.45us, set-access 36us, unmap
 *       25.6us, measured on an A100).
 * Every mode is also a vsr_emu_set_option name (without the prefix).
 *
 * Counters that are always kept (vsr_emu_outstanding):
 *   stale_handles: calls naming a destroyed stream or event, or a released cuMemCreate handle
 *     (undefined behaviour on the real driver; here CUDA_ERROR_INVALID_HANDLE/INVALID_VALUE).
 *   unmap_with_pending_work: cuMemUnmap, cuMemAddressFree, cuMemRelease (when it frees the
 *     memory) and cuMemFree (when it does not wait) calls that found queued, not yet run work on
 *     any stream touching the memory. The real driver does not wait for such work (§7 #2).
 */
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
  size_t allocation_bytes;        /* their total size */
  size_t managed;                 /* live cuMemAllocManaged allocations */
  size_t managed_bytes;           /* their total size */
  size_t host_allocations;        /* live cuMemHostAlloc / cuMemAllocHost allocations */
  size_t host_bytes;              /* their total size */
  size_t streams;                 /* created, not destroyed streams */
  size_t events;                  /* created, not destroyed events */
  size_t stale_handles;           /* uses of destroyed or released handles so far (process-wide) */
  size_t unmap_with_pending_work; /* unmaps/frees under queued work so far (process-wide) */
} vsr_emu_outstanding;

/* Fills *out with the live objects of `device` (-1: all devices; reservations and host
 * allocations belong to no device and are counted for every `device`; the two misuse counters are
 * process-wide and never reset). Returns a CUresult value:
 * CUDA_SUCCESS, CUDA_ERROR_INVALID_VALUE (out NULL) or CUDA_ERROR_INVALID_DEVICE. */
int vsr_emu_query_outstanding(vsr_emu_outstanding* out, int device);

/* Replaces the fault plan and restarts every call count. `spec` is a comma list of
 * `entry:N[:CUDA_ERROR_NAME]` (the Nth call of entry point `entry` fails) or `entry:N+[:NAME]`
 * (the Nth and every later call fail). `entry` is the base name (cuMemCreate); _v2/_ptds/_ptsz
 * suffixes name the same entry. A failing call has no side effects and writes no out-parameter.
 * Default error: CUDA_ERROR_OUT_OF_MEMORY for allocating entries, else CUDA_ERROR_UNKNOWN.
 * A rule ending in `@run` (cuLaunchHostFunc only) lets the call succeed and makes its work fault
 * when it runs, as a kernel's bad access does: the context takes the error (default
 * CUDA_ERROR_ILLEGAL_ADDRESS; a 7xx error poisons it, another is reported once by the next
 * synchronisation), then the function still runs.
 * NULL or "" clears the plan. Returns 0, or 1 (CUDA_ERROR_INVALID_VALUE) on a bad spec (the
 * previous plan is kept). */
int vsr_emu_set_fail(const char* spec);

/* Calls of entry point `entry` (base name, suffixes ignored) since the fault plan was last set,
 * including calls that failed. */
unsigned long long vsr_emu_call_count(const char* entry);

/* Calls of entry point `entry` (base name, suffixes ignored; NULL: of every entry point) that the
 * fault plan made fail since the plan was last set: lets a test check that each fault it planned
 * was reached and injected. */
unsigned long long vsr_emu_fault_count(const char* entry);

/* Changes one option at run time; `name` without the VSR_EMU_ prefix: DEVICE_MEMORY, VMM, MANAGED,
 * MEMORY_POOLS, GRANULARITY, RECOMMENDED_GRANULARITY, CONTEXT_OVERHEAD, SYNC, STICKY,
 * ADVERSARIAL (1 turns every [A] mode on, 0 puts every mode back to its default),
 * ASYNC_DEFAULT_STREAMS, RECYCLE_HANDLES, FREE_NO_SYNC, LATE_WORK, REQUIRE_CONTEXT, STICKY_VMM,
 * MEMINFO_QUANTUM, ADDRESS_SPACE, ABORT_ON_MISUSE, LATENCY ("" clears). Values as for the
 * variables, or "default": the value the environment gave (ADVERSARIAL "default": every mode it
 * switches). Returns 0, 1 (CUDA_ERROR_INVALID_VALUE: unknown name or bad value) or 800
 * (CUDA_ERROR_NOT_PERMITTED: the change would break live objects, e.g. a capacity below what is
 * charged, a new granularity while VMM allocations exist, VMM off while VMM objects exist). SYNC
 * applies to streams created afterwards; ASYNC_DEFAULT_STREAMS to default-stream work submitted
 * afterwards (work already queued still runs first); ADDRESS_SPACE to later reservations; LATE_WORK
 * to the next task a worker takes. */
int vsr_emu_set_option(const char* name, const char* value);

/* Holds (paused != 0) or releases the worker of a stream: queued work, event markers and
 * stream-ordered frees stay pending while held (the operation already running finishes).
 * `stream` is a created stream, or NULL / CU_STREAM_LEGACY (the legacy stream of the calling
 * thread's current context) or CU_STREAM_PER_THREAD (the calling thread's per-thread stream),
 * which need ASYNC_DEFAULT_STREAMS. Returns 0, 400 (CUDA_ERROR_INVALID_HANDLE: not a live created
 * stream), 201 (CUDA_ERROR_INVALID_CONTEXT: a default stream and no current context) or 801
 * (CUDA_ERROR_NOT_SUPPORTED: the stream runs inline, because it was created with SYNC=1 or it is
 * a default stream without ASYNC_DEFAULT_STREAMS). cuStreamDestroy and a context reset release a
 * hold. */
int vsr_emu_stream_pause(CUstream stream, int paused);

/* Host threads currently blocked inside a driver call until stream work completes
 * (cuStreamSynchronize, cuEventSynchronize, cuCtxSynchronize, cuMemFree, the host-synchronous
 * copies). Lets a test release held work only once a call is seen waiting for it. */
unsigned long long vsr_emu_waiting_threads(void);

/* One line: version, devices, memory, granularity and flags. The string belongs to the calling
 * thread and stays valid until its next call. */
const char* vsr_emu_describe(void);

#ifdef __cplusplus
}
#endif

#endif /* VIBESPATIAL_RASTER_VSR_EMULATOR_H */
