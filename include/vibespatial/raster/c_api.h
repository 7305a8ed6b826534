/* SPDX-License-Identifier: Apache-2.0 */
/* The C ABI of vibespatial-raster: the device memory pool, the VRAM budget and the raster
 * planner, callable from C (C99 or later), C++ and foreign function interfaces such as Python's
 * ctypes.
 *
 * Conventions
 * - Every function except vsr_version, vsr_last_error_message and vsr_last_cuda_error returns a
 *   vsr_status; results go through out pointers. On failure out values are left unchanged
 *   unless the function says otherwise.
 * - No C++ exception crosses this ABI. A failing call records a message for the calling thread
 *   (vsr_last_error_message) and, for VSR_ERROR_CUDA and VSR_ERROR_NO_DRIVER, the CUresult
 *   (vsr_last_cuda_error). A successful call clears both.
 * - Structs carry a `struct_size` field that the caller sets to sizeof(the struct) it was
 *   compiled with; later versions only append fields, and the library reads and writes no
 *   byte past `struct_size`.
 * - All functions are thread-safe. Pointers from vsr_device_allocate are CUdeviceptr values in
 *   the device's primary context; `stream` arguments are CUstream handles (NULL: the legacy
 *   default stream).
 * - The CUDA driver is loaded at run time from VIBESPATIAL_CUDA_DRIVER (default libcuda.so.1);
 *   point it at libvsr-cuda-emulator.so to run on the host emulator. When it cannot be loaded,
 *   or its cuInit fails (no device visible), calls that need it fail with VSR_ERROR_NO_DRIVER
 *   and a message saying why; nothing aborts, and the next such call tries again.
 * - In a child forked from a process that used the pool, every pool function fails with
 *   VSR_ERROR_NO_DRIVER (CUDA cannot be used after fork without exec), never blocking, and
 *   vsr_memory_pool_stats reports an unconfigured pool. */
#ifndef VIBESPATIAL_RASTER_C_API_H
#define VIBESPATIAL_RASTER_C_API_H

#include <stddef.h>
#include <stdint.h>

#ifndef VSR_EXPORT
/** Marks a function as part of the shared library's exported ABI. */
#define VSR_EXPORT __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/** The result of a call: VSR_OK or one of the VSR_ERROR_* codes (an int in the ABI). */
typedef int vsr_status;

/** Values of vsr_status. */
enum vsr_status_code {
  VSR_OK = 0,                     /**< success */
  VSR_ERROR_INVALID_ARGUMENT = 1, /**< a bad argument (null out pointer, bad dtype, double free) */
  VSR_ERROR_OUT_OF_MEMORY = 2,    /**< the device (after the pool's recovery chain) or the host
                                       could not satisfy an allocation */
  VSR_ERROR_CUDA = 3,             /**< a CUDA driver call failed; see vsr_last_cuda_error */
  VSR_ERROR_NO_DRIVER = 4,        /**< no usable CUDA driver or device */
  VSR_ERROR_OVERFLOW = 5,         /**< a size does not fit in 64 bits */
  VSR_ERROR_OUT_OF_RANGE = 6,     /**< a value is outside its range, e.g. a buffer too small */
  VSR_ERROR_INTERNAL = 7,         /**< any other failure (a bug): please report it */
  VSR_ERROR_IO = 8                /**< a file could not be written (the message names it and
                                       the errno's text; see vsr_last_io_errno) */
};

/** Element types of raster bands, in the order (and with the values) of the C++ DType. */
enum vsr_dtype {
  VSR_DTYPE_UINT8 = 0,
  VSR_DTYPE_INT8 = 1,
  VSR_DTYPE_UINT16 = 2,
  VSR_DTYPE_INT16 = 3,
  VSR_DTYPE_UINT32 = 4,
  VSR_DTYPE_INT32 = 5,
  VSR_DTYPE_UINT64 = 6,
  VSR_DTYPE_INT64 = 7,
  VSR_DTYPE_FLOAT32 = 8,
  VSR_DTYPE_FLOAT64 = 9
};

/** How a plan moves a raster through the device (the C++ TilingStrategy). */
enum vsr_tiling_strategy {
  VSR_TILING_WHOLE = 0,        /**< all bands at once, no tiling */
  VSR_TILING_BAND_BATCHES = 1, /**< whole bands, bands_per_pass at a time (per-band work) */
  VSR_TILING_TILED = 2         /**< spatial tiles of tile_height x tile_width */
};

/** Bytes enough for any tier name and its terminating NUL ("fallback" is the longest). */
#define VSR_TIER_CAPACITY 16
/** Bytes of vsr_pool_stats.tier_reason, its terminating NUL included (longer text is cut). */
#define VSR_TIER_REASON_CAPACITY 256

/** A snapshot of one device's pool (the C++ MemoryPoolStats). Set struct_size to
 * sizeof(vsr_pool_stats) before the call. A key that the tier does not report has its has_
 * flag 0 and its value 0. Byte counts of live memory are the sizes requested. */
typedef struct vsr_pool_stats {
  size_t struct_size;           /**< in: sizeof(vsr_pool_stats); out: bytes filled */
  char tier[VSR_TIER_CAPACITY]; /**< "A", "B", "C", "fallback", or "" before configuration */
  int32_t configured;           /**< 1 once vsr_configure_memory_pool has succeeded */
  int32_t device;               /**< the device this snapshot describes */
  /* Tiers A/B/C (pool_size: A/B only); total_bytes is also reported by the fallback tier. */
  uint64_t current_bytes;
  uint64_t current_count;
  uint64_t peak_bytes;
  uint64_t peak_count;
  uint64_t total_bytes; /**< A/B/C: bytes ever allocated; fallback: used + free */
  uint64_t total_count;
  uint64_t pool_size; /**< A/B: physical bytes the pool holds */
  /* Fallback tier. */
  uint64_t used_bytes;
  uint64_t free_bytes;
  int32_t has_current_bytes;
  int32_t has_current_count;
  int32_t has_peak_bytes;
  int32_t has_peak_count;
  int32_t has_total_bytes;
  int32_t has_total_count;
  int32_t has_pool_size;
  int32_t has_used_bytes;
  int32_t has_free_bytes;
  int32_t reserved0; /**< padding; written as 0 */
  /* Always reported (0 where the tier has no such thing). */
  uint64_t mapped_bytes;       /**< A/B: physical bytes mapped into the address space */
  uint64_t reserved_bytes;     /**< A/B: virtual address space reserved */
  uint64_t pool_free_bytes;    /**< physical bytes held with no live data */
  uint64_t largest_free_block; /**< A/B: largest request servable without new memory */
  uint64_t oom_recoveries;     /**< B: requests that succeeded only after the OOM chain */
  uint64_t granularity;        /**< A/B: the page size in bytes */
  uint64_t small_block_limit;  /**< A/B: requests up to this size are small blocks */
  /* Added after the first release: filled only when struct_size covers it. */
  char tier_reason[VSR_TIER_REASON_CAPACITY]; /**< why the device has its tier, "" before */
} vsr_pool_stats;

/** What an operation needs on the device (the C++ PlanOptions). Fill it with
 * vsr_plan_options_init, then change what differs. */
typedef struct vsr_plan_options {
  size_t struct_size;       /**< sizeof(vsr_plan_options) */
  int32_t band_count;       /**< bands of the raster (>= 1); default 1 */
  int32_t buffers_per_band; /**< device buffers per band (>= 1); default 2 */
  uint64_t scratch_bytes;   /**< fixed scratch per pass, bytes; default 0 */
  int32_t halo;             /**< overlap pixels per tile side (>= 0); default 0 */
  int32_t per_band;         /**< nonzero: bands are independent (band_batches allowed) */
  uint64_t vram_budget;     /**< bytes; used only when has_vram_budget is nonzero */
  int32_t has_vram_budget;  /**< 0: the budget is vsr_available_vram_bytes() */
  int32_t reserved0;        /**< padding; ignored (vsr_plan_options_init sets 0) */
} vsr_plan_options;

/** The planner's decision (the C++ RasterPlan). Set struct_size to sizeof(vsr_raster_plan)
 * before the call. */
typedef struct vsr_raster_plan {
  size_t struct_size;               /**< in: sizeof(vsr_raster_plan); out: bytes filled */
  int32_t strategy;                 /**< a vsr_tiling_strategy */
  int32_t halo;                     /**< overlap pixels on each side of a tile */
  int32_t has_tile_shape;           /**< 1 for tiled plans, else 0 */
  int32_t bands_per_pass;           /**< bands on the device at once */
  int64_t tile_height;              /**< effective tile height, halo excluded; 0 unless tiled */
  int64_t tile_width;               /**< effective tile width, halo excluded; 0 unless tiled */
  int64_t n_tiles;                  /**< tiles (of one band when per-band); 0 unless tiled */
  uint64_t estimated_vram_per_tile; /**< bytes one pass needs on the device */
  int32_t fits_budget;              /**< 0: even the smallest pass exceeds the usable budget */
  int32_t reserved0;                /**< padding; written as 0 */
} vsr_raster_plan;

/** An OOM handler: called (tier B) with the size of a request the device cannot satisfy and
 * the user_data it was registered with; returns nonzero if it freed something. The pool holds
 * none of its locks while handlers run, so a handler may call vsr_device_deallocate (and any
 * other vsr_ function). It may run on any thread that allocates. An allocation made inside a
 * handler that finds the device full fails at once with VSR_ERROR_OUT_OF_MEMORY: the recovery
 * chain never runs inside itself. An error recorded by a handler's own failing call does not
 * survive the outer call when that succeeds. */
typedef int (*vsr_oom_handler)(size_t requested_bytes, void* user_data);

/** The project version ("0.1.0"), a static string. Never fails. */
VSR_EXPORT const char* vsr_version(void);

/** The message of the last failing vsr_ call on the calling thread; "" if the last call
 * succeeded or there was none. Valid until the thread's next vsr_ call. Never returns NULL. */
VSR_EXPORT const char* vsr_last_error_message(void);

/** The CUresult of the last vsr_ call on the calling thread if it failed with VSR_ERROR_CUDA or
 * VSR_ERROR_NO_DRIVER; 0 (CUDA_SUCCESS) otherwise. */
VSR_EXPORT int vsr_last_cuda_error(void);

/** Configures the pool (once per process; later calls return the first tier) and writes the
 * tier ("A", "B", "C" or "fallback") with its NUL to tier_out, if tier_out is not NULL.
 * VSR_TIER_CAPACITY bytes always suffice. Errors: VSR_ERROR_NO_DRIVER (nothing is cached: a
 * later call, this or any other that needs the driver, starts it again: cuInit and the device
 * count are called again, and a driver library that could not be loaded is looked for again; a
 * library that loaded but lacks a required entry point stays refused, see vibespatial/raster/
 * driver.hpp); VSR_ERROR_CUDA when the requested tier is impossible;
 * VSR_ERROR_INVALID_ARGUMENT when VIBESPATIAL_GPU_MANAGED_MEMORY or VIBESPATIAL_GPU_POOL_ONLY
 * holds anything but 1/true/yes/on or 0/false/no/off, or VIBESPATIAL_GPU_POOL_RESERVE anything but
 * "auto" or a decimal fraction from 0 to 1 (nothing is configured);
 * VSR_ERROR_OUT_OF_RANGE when tier_capacity is too small (the pool is configured all the same,
 * and tier_out, if tier_capacity > 0, holds the truncated, NUL-terminated name). */
VSR_EXPORT vsr_status vsr_configure_memory_pool(char* tier_out, size_t tier_capacity);

/** Gives unused physical memory of every device's pool back to the driver. Live blocks are
 * untouched. A no-op before configuration and in tier C. Errors: VSR_ERROR_CUDA (the pool
 * stays consistent and usable). */
VSR_EXPORT vsr_status vsr_free_pool_memory(void);

/** Statistics of the pool of the calling thread's current device; works before configuration
 * (tier "", configured 0). out->struct_size must be set; sizes below the first version's
 * sizeof(vsr_pool_stats) are VSR_ERROR_INVALID_ARGUMENT, as is a NULL out. */
VSR_EXPORT vsr_status vsr_memory_pool_stats(vsr_pool_stats* out);

/** As vsr_memory_pool_stats, for the pool of `device` (the C++ memory_pool_stats(device)).
 * VSR_ERROR_OUT_OF_RANGE for a device that does not exist (a negative ordinal, 64 or more, or,
 * once the pool is configured, at or above the driver's device count). */
VSR_EXPORT vsr_status vsr_memory_pool_stats_device(int device, vsr_pool_stats* out);

/** Allocates `bytes` of device memory usable in stream order on `stream` (a CUstream; NULL: the
 * legacy default stream) and writes the pointer to *out. Configures the pool on first use.
 * bytes == 0 writes NULL and succeeds. Errors (*out is set to NULL): VSR_ERROR_INVALID_ARGUMENT
 * (out NULL), VSR_ERROR_OUT_OF_MEMORY (tier B: after OOM handlers, a release of free pages and
 * retries), VSR_ERROR_NO_DRIVER, VSR_ERROR_CUDA, VSR_ERROR_INVALID_ARGUMENT as
 * vsr_configure_memory_pool for a bad tier variable. */
VSR_EXPORT vsr_status vsr_device_allocate(size_t bytes, void* stream, void** out);

/** Frees a block from vsr_device_allocate; `bytes` must be its size. It may be reused at once on
 * `stream`, and on other streams once the work queued on `stream` up to this call has completed
 * (or behind a cuStreamWaitEvent on it; the C++ memory.hpp, "Streams"). `stream` must be alive.
 * (NULL, 0) is a no-op. Errors: VSR_ERROR_INVALID_ARGUMENT, changing nothing, for a pointer the
 * pool did not hand out, one already freed, or a size that differs from the allocation's;
 * VSR_ERROR_CUDA when a driver call the free needs fails (recording the stream's mark, or
 * cuMemFree in tier C): nothing is changed, the block stays live and a retry frees it. */
VSR_EXPORT vsr_status vsr_device_deallocate(void* ptr, size_t bytes, void* stream);

/** Tells the pool that `stream` (a CUstream) is about to be destroyed: call it after the last
 * vsr_device_deallocate on `stream` and before cuStreamDestroy, while the stream is alive. CUDA
 * recycles stream handles, and without this call the pool may treat a new stream that gets the
 * same handle value as the old one, handing it blocks the old stream's queued work still uses.
 * Afterwards blocks freed on `stream` are reusable on any stream once the work queued on `stream`
 * so far has completed. NULL (the legacy default stream): a no-op; CU_STREAM_PER_THREAD: the
 * calling thread's per-thread stream. A no-op before configuration. Thread-safe; may be called
 * again (the C++ forget_stream). Errors: VSR_ERROR_CUDA when the pool cannot record a mark on
 * `stream` (e.g. it was already destroyed): the pools that failed are unchanged and a later call
 * may retry; VSR_ERROR_NO_DRIVER in a forked child. */
VSR_EXPORT vsr_status vsr_forget_stream(void* stream);

/** Registers an OOM handler (see vsr_oom_handler) with `user_data` passed back to it, and
 * writes its id (never 0) to *id_out. Handlers run in registration order. Errors:
 * VSR_ERROR_INVALID_ARGUMENT for a NULL handler or id_out (nothing is registered). */
VSR_EXPORT vsr_status vsr_add_oom_handler(vsr_oom_handler handler, void* user_data,
                                          uint64_t* id_out);

/** Unregisters the handler with id `id`. Unknown ids are ignored (VSR_OK). A call of the handler
 * already running on another thread may complete; after this returns no new call starts. */
VSR_EXPORT vsr_status vsr_remove_oom_handler(uint64_t id);

/** Device memory a new pass may use: (driver free + free bytes the pool holds) * 0.85, written
 * to *out; 0 with no usable driver or device (still VSR_OK). Errors: VSR_ERROR_INVALID_ARGUMENT
 * for a NULL out. */
VSR_EXPORT vsr_status vsr_available_vram_bytes(uint64_t* out);

/** How many bands of height x width `dtype` (a vsr_dtype) fit at once, each band needing
 * buffers_per_band device buffers, after scratch_bytes: max(1, (budget - scratch) /
 * (height * width * itemsize * buffers_per_band)), clamped to INT_MAX, written to *out. The
 * budget is vram_budget if has_vram_budget is nonzero, else vsr_available_vram_bytes().
 * Errors: VSR_ERROR_INVALID_ARGUMENT (height or width <= 0, a bad dtype, buffers_per_band < 1,
 * out NULL), VSR_ERROR_OVERFLOW (the per-band byte count exceeds 64 bits). */
VSR_EXPORT vsr_status vsr_max_bands_for_budget(int64_t height, int64_t width, int dtype,
                                               int buffers_per_band, uint64_t scratch_bytes,
                                               int has_vram_budget, uint64_t vram_budget, int* out);

/** Fills *opts with the defaults (struct_size set, band_count 1, buffers_per_band 2, the rest
 * 0). Errors: VSR_ERROR_INVALID_ARGUMENT for a NULL opts. */
VSR_EXPORT vsr_status vsr_plan_options_init(vsr_plan_options* opts);

/** Decides how a height x width raster of `dtype` (a vsr_dtype) goes through the device (the
 * C++ analyze_raster_plan; see dispatch.hpp for the algorithm) and writes it to *out, whose
 * struct_size must be set. `opts` may be NULL for the defaults; otherwise its struct_size must
 * be at least that of the first version. Errors: VSR_ERROR_INVALID_ARGUMENT (height or width
 * <= 0, a bad dtype, band_count < 1, buffers_per_band < 1, halo < 0, a bad struct_size, out
 * NULL), VSR_ERROR_OVERFLOW (a byte count exceeds 64 bits). */
VSR_EXPORT vsr_status vsr_analyze_raster_plan(int64_t height, int64_t width, int dtype,
                                              const vsr_plan_options* opts, vsr_raster_plan* out);

/** Writes the vsr_dtype whose numpy name is `name` (exactly, e.g. "float32") to *out.
 * Errors: VSR_ERROR_INVALID_ARGUMENT for an unknown name or a NULL argument. */
VSR_EXPORT vsr_status vsr_dtype_from_name(const char* name, int* out);

/** Writes the numpy name of `dtype` (a static string, e.g. "float32") to *out.
 * Errors: VSR_ERROR_INVALID_ARGUMENT for a bad dtype or a NULL out. */
VSR_EXPORT vsr_status vsr_dtype_name(int dtype, const char** out);

/** Writes the width of one element of `dtype` in bytes to *out.
 * Errors: VSR_ERROR_INVALID_ARGUMENT for a bad dtype or a NULL out. */
VSR_EXPORT vsr_status vsr_dtype_itemsize(int dtype, size_t* out);

/** Writes the name of a vsr_tiling_strategy ("whole", "band_batches", "tiled"; a static
 * string) to *out. Errors: VSR_ERROR_INVALID_ARGUMENT for a bad value or a NULL out. */
VSR_EXPORT vsr_status vsr_tiling_strategy_name(int strategy, const char** out);

/** Directions of vsr_memcpy. */
enum vsr_copy_kind {
  VSR_COPY_HOST_TO_DEVICE = 0,  /**< dst is device memory, src host memory */
  VSR_COPY_DEVICE_TO_HOST = 1,  /**< dst is host memory, src device memory */
  VSR_COPY_DEVICE_TO_DEVICE = 2 /**< both are device memory */
};

/** Copies `bytes` bytes from `src` to `dst` in the direction `kind` (a vsr_copy_kind) and returns
 * once the copy has completed. The copy is queued on `stream` (a CUstream; NULL: the legacy
 * default stream), so it runs after the work already queued there: pass the stream a producer
 * wrote the source on. Device addresses are those of the calling thread's current context (device
 * 0's primary context is bound when the thread has none): pool blocks and any other device memory
 * the driver knows there (cuMemAlloc, managed memory, other libraries' allocations in the
 * primary context). Host memory may be pageable. bytes == 0 is a no-op. Thread-safe. Before
 * copying, each device side is checked to hold `bytes` from its address (the C++
 * check_device_range): a pool block within the bytes it was allocated with, other memory within
 * the allocation the driver reports there (cuMemGetAddressRange).
 * Errors: VSR_ERROR_INVALID_ARGUMENT (a bad kind; a NULL dst or src with bytes > 0; a device side
 * that is no device memory the driver knows, a freed pool block, or fewer than `bytes` from its
 * address: nothing is copied), VSR_ERROR_NO_DRIVER, VSR_ERROR_CUDA. */
VSR_EXPORT vsr_status vsr_memcpy(void* dst, const void* src, size_t bytes, int kind, void* stream);

/** Waits until the work queued on `stream` (a CUstream; NULL: the legacy default stream) has
 * completed. Binds device 0's primary context when the calling thread has no current context.
 * Thread-safe. Errors: VSR_ERROR_NO_DRIVER, VSR_ERROR_CUDA. */
VSR_EXPORT vsr_status vsr_stream_synchronize(void* stream);

/* ---- memory history and snapshots (docs/memory-pool.md, the C++ memory_history.hpp) ---- */

/** Starts (`enabled` nonzero) or stops recording the pool's memory history, keeping the most
 * recent `max_entries` events (ignored when stopping). Errors: VSR_ERROR_INVALID_ARGUMENT for a
 * `max_entries` of 0, VSR_ERROR_OUT_OF_RANGE above 16,777,216: nothing changes then. */
VSR_EXPORT vsr_status vsr_record_memory_history(int enabled, size_t max_entries);

/** Pushes the owner tag `tag` (UTF-8, 1 to 256 bytes) on the calling thread's tag stack: later
 * events of this thread carry it until vsr_pop_memory_tag. Errors: VSR_ERROR_INVALID_ARGUMENT
 * for NULL, an empty or longer tag, or one that is not UTF-8; VSR_ERROR_OUT_OF_RANGE when 64 tags
 * are already pushed. Nothing is pushed then. */
VSR_EXPORT vsr_status vsr_push_memory_tag(const char* tag);

/** Pops the calling thread's innermost owner tag. Errors: VSR_ERROR_INVALID_ARGUMENT when none
 * is pushed (nothing changes). */
VSR_EXPORT vsr_status vsr_pop_memory_tag(void);

/** Writes the snapshot (segments and the recorded history, as a pickle of PyTorch's
 * torch.cuda.memory._snapshot() dict) to `path`, all or nothing, by the library's writer of every
 * output (a private temporary directory beside `path`, its file renamed into place when
 * complete). An existing `path` is refused unless `overwrite` is nonzero. Errors:
 * VSR_ERROR_INVALID_ARGUMENT for a NULL or empty path, or one that names a directory, FIFO,
 * socket or device (never replaced, with overwrite too); VSR_ERROR_IO when the file cannot be
 * written (an existing file without overwrite: errno EEXIST; a missing directory: ENOENT), with
 * no file left behind. */
VSR_EXPORT vsr_status vsr_dump_memory_snapshot(const char* path, int overwrite);

/** The errno of the last vsr_ call on the calling thread if it failed with VSR_ERROR_IO; 0
 * otherwise. */
VSR_EXPORT int vsr_last_io_errno(void);

/** How vsr_warp_file reprojects (the C++ WarpOptions, gdalwarp's options; docs/warp.md). Fill
 * it with vsr_warp_options_init, then change what differs. Strings are borrowed for the call. */
typedef struct vsr_warp_options {
  size_t struct_size;      /**< sizeof(vsr_warp_options) */
  const char* dst_crs;     /**< -t_srs; NULL or "": the source's CRS */
  const char* src_crs;     /**< -s_srs; NULL or "": the source's own */
  const char* method;      /**< -r: "near", "bilinear", ... "rms"; NULL: "near" */
  double error_threshold;  /**< -et, in source pixels (default 0.125; 0: exact) */
  int32_t has_resolution;  /**< nonzero: resolution is -tr */
  int32_t has_extent;      /**< nonzero: extent is -te */
  double resolution[2];    /**< xres, yres */
  double extent[4];        /**< xmin, ymin, xmax, ymax in the output CRS */
  int32_t has_size;        /**< nonzero: size is -ts */
  int32_t has_src_nodata;  /**< nonzero: src_nodata is -srcnodata */
  int64_t size[2];         /**< width, height (0 for one: from the other) */
  double src_nodata;       /**< the source's nodata for every band */
  double dst_nodata;       /**< the output's nodata */
  int32_t has_dst_nodata;  /**< nonzero: dst_nodata is -dstnodata */
  int32_t src_nodata_none; /**< nonzero: -srcnodata None */
  int32_t dst_nodata_none; /**< nonzero: -dstnodata None */
  int32_t overwrite;       /**< nonzero: an existing output is replaced (default 1) */
  uint64_t memory_limit;   /**< host bytes per output tile; 0: 64 MiB */
} vsr_warp_options;

/** Fills `opts` with the defaults (gdalwarp's). Errors: VSR_ERROR_INVALID_ARGUMENT for NULL. */
VSR_EXPORT vsr_status vsr_warp_options_init(vsr_warp_options* opts);

/** Reprojects the raster file `input` into `output` (all or nothing: nothing is left at `output`
 * on any error) onto the grid gdalwarp would choose for `opts` (NULL: the defaults, which keep the
 * source's CRS). Errors: VSR_ERROR_INVALID_ARGUMENT for NULL paths, a bad method, an SRS GDAL
 * cannot read, a source without a CRS, an output grid that misses the source or cannot be made
 * (the message says which); VSR_ERROR_IO when a file cannot be read or written; every error in a
 * build without GDAL. */
VSR_EXPORT vsr_status vsr_warp_file(const char* input, const char* output,
                                    const vsr_warp_options* opts);
/** How vsr_zonal_stats computes (the C++ ZonalOptions, docs/zonal-statistics.md). Fill it with
 * vsr_zonal_options_init, then set what differs; strings are borrowed for the call only. */
typedef struct vsr_zonal_options {
  size_t struct_size;     /**< sizeof(vsr_zonal_options) */
  const char* pixels;     /**< "fractional" (NULL: this), "center" or "all-touched" */
  const char* stats;      /**< comma-separated statistic names; NULL: count,sum,mean,min,max */
  double quantile;        /**< the q of "quantile", in [0, 1]; 0.9 */
  const int* bands;       /**< 1-based bands of the raster; NULL: all */
  size_t band_count;      /**< entries of bands */
  const char* layer;      /**< vector zones: the layer; NULL: the first */
  const char* zone_field; /**< vector zones: the zone identifier field; NULL: feature ids */
  const char* weights;    /**< a one-band weights raster on the raster's grid; NULL: none */
  uint64_t memory_budget; /**< host bytes of the tiles read at once; 0: 256 MiB */
} vsr_zonal_options;

/** Fills `opts` with the defaults (struct_size set). Errors: VSR_ERROR_INVALID_ARGUMENT for
 * NULL. */
VSR_EXPORT vsr_status vsr_zonal_options_init(vsr_zonal_options* opts);

/** Zonal statistics of the raster file `raster` over `zones` (a vector file OGR opens, its
 * features transformed to the raster's CRS, or an integer zone raster on the same grid), as a
 * table of one row per zone and band. With `out_path` (not NULL) the table is written there all
 * or nothing (".json" or ".csv", from its extension; an existing file is replaced only with
 * `overwrite` nonzero), and `text_out` may be NULL. Otherwise `*text_out` receives the table as
 * JSON, NUL-terminated, allocated by the library (release it with vsr_free_text) and `*text_len`
 * (if not NULL) its length. `opts` may be NULL (the defaults). Errors:
 * VSR_ERROR_INVALID_ARGUMENT for NULL arguments, bad options, bad zones (an invalid or
 * non-polygon geometry, an empty layer, a missing layer or field, a zone raster of another grid
 * or a float dtype); VSR_ERROR_IO for a file that is missing or cannot be written (nothing is
 * written then); others as their C++ causes. */
VSR_EXPORT vsr_status vsr_zonal_stats(const char* raster, const char* zones,
                                      const vsr_zonal_options* opts, const char* out_path,
                                      int overwrite, char** text_out, size_t* text_len);

/** Releases text returned by vsr_zonal_stats (NULL is ignored). Never fails. */
VSR_EXPORT void vsr_free_text(char* text);

#ifdef __cplusplus
}
#endif

#endif /* VIBESPATIAL_RASTER_C_API_H */
