/* SPDX-License-Identifier: Apache-2.0 */
/* The C ABI, tested from C on the host driver emulator. A plain C99 program: exit 0 on
 * success, 1 with a message on the first failure.
 *
 *   test_c_api              VIBESPATIAL_CUDA_DRIVER = the emulator, VSR_EMU_DEVICE_MEMORY = 64 MiB
 *   test_c_api --no-driver  VIBESPATIAL_CUDA_DRIVER = a library that does not exist
 *   test_c_api --no-device  the emulator with no device (cuInit fails): the same answers as with
 *                           no driver, never an abort
 *   test_c_api --start-fails-twice  VSR_EMU_FAIL=cuInit:1,cuInit:2: the first two calls fail,
 *                           the third starts the driver */
#define _GNU_SOURCE 1

#include <vibespatial/raster/c_api.h>

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)

static int g_checks = 0;

#define CHECK(cond)                                                                            \
  do {                                                                                         \
    ++g_checks;                                                                                \
    if (!(cond)) {                                                                             \
      fprintf(stderr, "%s:%d: CHECK(%s) failed; last error: \"%s\" (CUresult %d)\n", __FILE__, \
              __LINE__, #cond, vsr_last_error_message(), vsr_last_cuda_error());               \
      exit(1);                                                                                 \
    }                                                                                          \
  } while (0)

/* `call` succeeds and leaves no error message. */
#define CHECK_OK(call)                          \
  do {                                          \
    vsr_status check_ok_status_ = (call);       \
    CHECK(check_ok_status_ == VSR_OK);          \
    CHECK(vsr_last_error_message()[0] == '\0'); \
    CHECK(vsr_last_cuda_error() == 0);          \
  } while (0)

/* `call` fails with `status` and a non-empty message naming the function. */
#define CHECK_FAILS(call, status, function)                                             \
  do {                                                                                  \
    vsr_status check_fails_status_ = (call);                                            \
    CHECK(check_fails_status_ == (status));                                             \
    CHECK(vsr_last_error_message() != NULL);                                            \
    CHECK(strstr(vsr_last_error_message(), function ": ") == vsr_last_error_message()); \
    CHECK(strlen(vsr_last_error_message()) > strlen(function ": "));                    \
  } while (0)

static vsr_pool_stats stats(void) {
  vsr_pool_stats s;
  memset(&s, 0xAB, sizeof s);
  s.struct_size = sizeof s;
  CHECK_OK(vsr_memory_pool_stats(&s));
  CHECK(s.struct_size == sizeof s);
  return s;
}

/* ---- version, dtypes, strategies ---- */

static void test_version_and_names(void) {
  static const char* const names[] = {"uint8", "int8",   "uint16", "int16",   "uint32",
                                      "int32", "uint64", "int64",  "float32", "float64"};
  static const size_t sizes[] = {1, 1, 2, 2, 4, 4, 8, 8, 4, 8};
  int i;
  int d = -1;
  size_t n = 0;
  const char* name = NULL;

  CHECK(vsr_version() != NULL);
  CHECK(strcmp(vsr_version(), VSR_EXPECTED_VERSION) == 0);
  CHECK(vsr_last_error_message() != NULL);
  CHECK(vsr_last_error_message()[0] == '\0');
  CHECK(vsr_last_cuda_error() == 0);

  for (i = 0; i < 10; ++i) {
    CHECK_OK(vsr_dtype_from_name(names[i], &d));
    CHECK(d == i);
    CHECK_OK(vsr_dtype_name(i, &name));
    CHECK(strcmp(name, names[i]) == 0);
    CHECK_OK(vsr_dtype_itemsize(i, &n));
    CHECK(n == sizes[i]);
  }
  CHECK(VSR_DTYPE_FLOAT32 == 8);
  d = 42;
  CHECK_FAILS(vsr_dtype_from_name("float16", &d), VSR_ERROR_INVALID_ARGUMENT,
              "vsr_dtype_from_name");
  CHECK(strstr(vsr_last_error_message(), "float16") != NULL);
  CHECK(d == 42); /* unchanged on failure */
  CHECK_FAILS(vsr_dtype_from_name(NULL, &d), VSR_ERROR_INVALID_ARGUMENT, "vsr_dtype_from_name");
  CHECK_FAILS(vsr_dtype_from_name("uint8", NULL), VSR_ERROR_INVALID_ARGUMENT,
              "vsr_dtype_from_name");
  CHECK_FAILS(vsr_dtype_name(10, &name), VSR_ERROR_INVALID_ARGUMENT, "vsr_dtype_name");
  CHECK_FAILS(vsr_dtype_name(-1, &name), VSR_ERROR_INVALID_ARGUMENT, "vsr_dtype_name");
  CHECK_FAILS(vsr_dtype_name(0, NULL), VSR_ERROR_INVALID_ARGUMENT, "vsr_dtype_name");
  CHECK_FAILS(vsr_dtype_itemsize(10, &n), VSR_ERROR_INVALID_ARGUMENT, "vsr_dtype_itemsize");
  CHECK_FAILS(vsr_dtype_itemsize(0, NULL), VSR_ERROR_INVALID_ARGUMENT, "vsr_dtype_itemsize");

  CHECK_OK(vsr_tiling_strategy_name(VSR_TILING_WHOLE, &name));
  CHECK(strcmp(name, "whole") == 0);
  CHECK_OK(vsr_tiling_strategy_name(VSR_TILING_BAND_BATCHES, &name));
  CHECK(strcmp(name, "band_batches") == 0);
  CHECK_OK(vsr_tiling_strategy_name(VSR_TILING_TILED, &name));
  CHECK(strcmp(name, "tiled") == 0);
  CHECK_FAILS(vsr_tiling_strategy_name(3, &name), VSR_ERROR_INVALID_ARGUMENT,
              "vsr_tiling_strategy_name");
  CHECK_FAILS(vsr_tiling_strategy_name(0, NULL), VSR_ERROR_INVALID_ARGUMENT,
              "vsr_tiling_strategy_name");
}

/* ---- budget and planner ---- */

static void test_budget_and_plans(void) {
  int bands = 0;
  uint64_t available = 0;
  vsr_plan_options o;
  vsr_raster_plan p;
  struct {
    vsr_raster_plan plan;
    uint64_t later_field;
  } bigger;

  CHECK_OK(vsr_available_vram_bytes(&available));
  CHECK(available > 0);
  CHECK(available <= (uint64_t)(64 * MIB)); /* the emulated device has 64 MiB */
  CHECK_FAILS(vsr_available_vram_bytes(NULL), VSR_ERROR_INVALID_ARGUMENT,
              "vsr_available_vram_bytes");

  /* 1000 x 1000 float32, 2 buffers: 8e6 bytes per band; 80e6 / 8e6 = 10. */
  CHECK_OK(vsr_max_bands_for_budget(1000, 1000, VSR_DTYPE_FLOAT32, 2, 0, 1, 80000000u, &bands));
  CHECK(bands == 10);
  CHECK_OK(
      vsr_max_bands_for_budget(1000, 1000, VSR_DTYPE_FLOAT32, 2, 8000000u, 1, 80000000u, &bands));
  CHECK(bands == 9);
  CHECK_OK(vsr_max_bands_for_budget(1000, 1000, VSR_DTYPE_FLOAT32, 2, 0, 1, 0, &bands));
  CHECK(bands == 1); /* always at least one */
  CHECK_OK(vsr_max_bands_for_budget(1000, 1000, VSR_DTYPE_UINT8, 1, 0, 0, 0, &bands));
  CHECK(bands == (int)(available / 1000000u));
  bands = -7;
  CHECK_FAILS(vsr_max_bands_for_budget(0, 1000, VSR_DTYPE_FLOAT32, 2, 0, 1, 1000, &bands),
              VSR_ERROR_INVALID_ARGUMENT, "vsr_max_bands_for_budget");
  CHECK(bands == -7);
  CHECK_FAILS(vsr_max_bands_for_budget(10, 10, 99, 2, 0, 1, 1000, &bands),
              VSR_ERROR_INVALID_ARGUMENT, "vsr_max_bands_for_budget");
  CHECK_FAILS(vsr_max_bands_for_budget(10, 10, VSR_DTYPE_FLOAT32, 0, 0, 1, 1000, &bands),
              VSR_ERROR_INVALID_ARGUMENT, "vsr_max_bands_for_budget");
  CHECK_FAILS(vsr_max_bands_for_budget(10, 10, VSR_DTYPE_FLOAT32, 2, 0, 1, 1000, NULL),
              VSR_ERROR_INVALID_ARGUMENT, "vsr_max_bands_for_budget");
  CHECK_FAILS(vsr_max_bands_for_budget((int64_t)1 << 40, (int64_t)1 << 40, VSR_DTYPE_FLOAT64, 2, 0,
                                       1, 1000, &bands),
              VSR_ERROR_OVERFLOW, "vsr_max_bands_for_budget");

  CHECK_FAILS(vsr_plan_options_init(NULL), VSR_ERROR_INVALID_ARGUMENT, "vsr_plan_options_init");
  memset(&o, 0xCD, sizeof o);
  CHECK_OK(vsr_plan_options_init(&o));
  CHECK(o.struct_size == sizeof o);
  CHECK(o.band_count == 1 && o.buffers_per_band == 2 && o.scratch_bytes == 0 && o.halo == 0);
  CHECK(o.per_band == 0 && o.has_vram_budget == 0 && o.vram_budget == 0 && o.reserved0 == 0);

  /* Defaults (opts NULL): the budget is what the device has; 100 x 100 float32 fits whole. */
  memset(&p, 0xEE, sizeof p);
  p.struct_size = sizeof p;
  CHECK_OK(vsr_analyze_raster_plan(100, 100, VSR_DTYPE_FLOAT32, NULL, &p));
  CHECK(p.struct_size == sizeof p);
  CHECK(p.strategy == VSR_TILING_WHOLE && p.has_tile_shape == 0 && p.tile_height == 0);
  CHECK(p.tile_width == 0 && p.n_tiles == 0 && p.bands_per_pass == 1 && p.fits_budget == 1);
  CHECK(p.estimated_vram_per_tile == 2u * 100u * 100u * 4u && p.reserved0 == 0);

  /* The consumer's case: 4 bands of 1000 x 1000 float32 in 80 MB: whole, 32 MB. */
  o.band_count = 4;
  o.has_vram_budget = 1;
  o.vram_budget = 80000000u;
  CHECK_OK(vsr_analyze_raster_plan(1000, 1000, VSR_DTYPE_FLOAT32, &o, &p));
  CHECK(p.strategy == VSR_TILING_WHOLE && p.bands_per_pass == 4);
  CHECK(p.estimated_vram_per_tile == 32000000u && p.fits_budget == 1);

  /* Per-band work that does not fit whole: 8 bands, 7 fit in 0.7 * 80 MB. */
  o.band_count = 8;
  o.per_band = 1;
  CHECK_OK(vsr_analyze_raster_plan(1000, 1000, VSR_DTYPE_FLOAT32, &o, &p));
  CHECK(p.strategy == VSR_TILING_BAND_BATCHES && p.bands_per_pass == 7);
  CHECK(p.has_tile_shape == 0 && p.fits_budget == 1);

  /* Too big for whole bands: tiled, with tile sides multiples of 256. */
  o.band_count = 1;
  o.per_band = 0;
  o.halo = 3;
  CHECK_OK(vsr_analyze_raster_plan(20000, 20000, VSR_DTYPE_FLOAT32, &o, &p));
  CHECK(p.strategy == VSR_TILING_TILED && p.has_tile_shape == 1 && p.halo == 3);
  CHECK(p.tile_height > 0 && p.tile_height % 256 == 0 && p.tile_width % 256 == 0);
  CHECK(p.n_tiles == ((20000 + p.tile_height - 1) / p.tile_height) *
                         ((20000 + p.tile_width - 1) / p.tile_width));
  CHECK(p.estimated_vram_per_tile <= 56000000u && p.fits_budget == 1);

  /* A budget nothing fits: the smallest tiles, fits_budget 0. */
  o.halo = 0;
  o.vram_budget = 1000;
  CHECK_OK(vsr_analyze_raster_plan(20000, 20000, VSR_DTYPE_FLOAT32, &o, &p));
  CHECK(p.strategy == VSR_TILING_TILED && p.tile_height == 256 && p.tile_width == 256);
  CHECK(p.fits_budget == 0);

  /* A caller compiled against a later, longer struct: nothing past sizeof is written. */
  memset(&bigger, 0x5A, sizeof bigger);
  bigger.plan.struct_size = sizeof bigger;
  CHECK_OK(vsr_analyze_raster_plan(100, 100, VSR_DTYPE_UINT8, NULL, &bigger.plan));
  CHECK(bigger.plan.struct_size == sizeof(vsr_raster_plan));
  CHECK(bigger.later_field == UINT64_C(0x5A5A5A5A5A5A5A5A));

  /* Errors. */
  CHECK_FAILS(vsr_analyze_raster_plan(100, 100, VSR_DTYPE_FLOAT32, &o, NULL),
              VSR_ERROR_INVALID_ARGUMENT, "vsr_analyze_raster_plan");
  p.struct_size = 8;
  CHECK_FAILS(vsr_analyze_raster_plan(100, 100, VSR_DTYPE_FLOAT32, &o, &p),
              VSR_ERROR_INVALID_ARGUMENT, "vsr_analyze_raster_plan");
  CHECK(strstr(vsr_last_error_message(), "struct_size") != NULL);
  p.struct_size = sizeof p;
  CHECK_FAILS(vsr_analyze_raster_plan(100, -1, VSR_DTYPE_FLOAT32, &o, &p),
              VSR_ERROR_INVALID_ARGUMENT, "vsr_analyze_raster_plan");
  CHECK_FAILS(vsr_analyze_raster_plan(100, 100, -1, &o, &p), VSR_ERROR_INVALID_ARGUMENT,
              "vsr_analyze_raster_plan");
  o.halo = -1;
  CHECK_FAILS(vsr_analyze_raster_plan(100, 100, VSR_DTYPE_FLOAT32, &o, &p),
              VSR_ERROR_INVALID_ARGUMENT, "vsr_analyze_raster_plan");
  CHECK(strstr(vsr_last_error_message(), "halo") != NULL);
  o.halo = 0;
  o.band_count = 0;
  CHECK_FAILS(vsr_analyze_raster_plan(100, 100, VSR_DTYPE_FLOAT32, &o, &p),
              VSR_ERROR_INVALID_ARGUMENT, "vsr_analyze_raster_plan");
  o.band_count = 1;
  o.buffers_per_band = 0;
  CHECK_FAILS(vsr_analyze_raster_plan(100, 100, VSR_DTYPE_FLOAT32, &o, &p),
              VSR_ERROR_INVALID_ARGUMENT, "vsr_analyze_raster_plan");
  o.buffers_per_band = 2;
  o.struct_size = 0;
  CHECK_FAILS(vsr_analyze_raster_plan(100, 100, VSR_DTYPE_FLOAT32, &o, &p),
              VSR_ERROR_INVALID_ARGUMENT, "vsr_analyze_raster_plan");
  CHECK(strstr(vsr_last_error_message(), "vsr_plan_options_init") != NULL);
  o.struct_size = sizeof o;
  CHECK_FAILS(
      vsr_analyze_raster_plan((int64_t)1 << 40, (int64_t)1 << 40, VSR_DTYPE_FLOAT64, &o, &p),
      VSR_ERROR_OVERFLOW, "vsr_analyze_raster_plan");
  CHECK_OK(vsr_analyze_raster_plan(100, 100, VSR_DTYPE_FLOAT32, &o, &p));
}

/* ---- the pool ---- */

static void test_pool_before_configuration(void) {
  vsr_pool_stats s = stats();
  vsr_pool_stats small;
  CHECK(s.tier[0] == '\0' && s.configured == 0);
  CHECK(s.has_current_bytes == 0 && s.has_pool_size == 0 && s.has_used_bytes == 0);
  CHECK(s.current_bytes == 0 && s.reserved0 == 0 && s.oom_recoveries == 0);
  CHECK_FAILS(vsr_memory_pool_stats(NULL), VSR_ERROR_INVALID_ARGUMENT, "vsr_memory_pool_stats");
  CHECK(s.tier_reason[0] == '\0');
  small.struct_size = offsetof(vsr_pool_stats, tier_reason) - 8;
  CHECK_FAILS(vsr_memory_pool_stats(&small), VSR_ERROR_INVALID_ARGUMENT, "vsr_memory_pool_stats");
  /* Freeing before configuration: a no-op, and pointers cannot be the pool's yet. */
  CHECK_OK(vsr_free_pool_memory());
  CHECK_FAILS(vsr_device_deallocate((void*)(uintptr_t)0x1000, 64, NULL), VSR_ERROR_INVALID_ARGUMENT,
              "vsr_device_deallocate");
}

static void test_configure(void) {
  char tier[VSR_TIER_CAPACITY];
  vsr_pool_stats s;
  memset(tier, 'x', sizeof tier);
  CHECK_FAILS(vsr_configure_memory_pool(tier, 1), VSR_ERROR_OUT_OF_RANGE,
              "vsr_configure_memory_pool");
  CHECK(tier[0] == '\0'); /* truncated, NUL-terminated */
  CHECK_OK(vsr_configure_memory_pool(NULL, 0));
  CHECK_OK(vsr_configure_memory_pool(tier, sizeof tier));
  CHECK(strcmp(tier, "B") == 0); /* the emulator supports VMM */
  CHECK_OK(vsr_configure_memory_pool(tier, 2));
  CHECK(strcmp(tier, "B") == 0);
  s = stats();
  CHECK(strcmp(s.tier, "B") == 0 && s.configured == 1 && s.device == 0);
  CHECK(strstr(s.tier_reason, "tier B") != NULL); /* why: the device supports VMM */
  /* A caller built before tier_reason existed: accepted, filled up to its struct_size. */
  {
    vsr_pool_stats old;
    memset(&old, 0xAB, sizeof old);
    old.struct_size = offsetof(vsr_pool_stats, tier_reason);
    CHECK_OK(vsr_memory_pool_stats(&old));
    CHECK(old.struct_size == offsetof(vsr_pool_stats, tier_reason));
    CHECK(strcmp(old.tier, "B") == 0);
    CHECK((unsigned char)old.tier_reason[0] == 0xAB); /* untouched */
  }
  CHECK(s.has_current_bytes && s.has_current_count && s.has_peak_bytes && s.has_peak_count);
  CHECK(s.has_total_bytes && s.has_total_count && s.has_pool_size);
  CHECK(!s.has_used_bytes && !s.has_free_bytes);
  CHECK(s.current_bytes == 0 && s.current_count == 0);
  s.struct_size = sizeof s;
  CHECK_OK(vsr_memory_pool_stats_device(0, &s));
  CHECK(strcmp(s.tier, "B") == 0 && s.device == 0);
  /* The emulator has one device: others do not exist (nothing is written). */
  s.device = 7;
  CHECK_FAILS(vsr_memory_pool_stats_device(5, &s), VSR_ERROR_OUT_OF_RANGE,
              "vsr_memory_pool_stats_device");
  CHECK(s.device == 7);
  CHECK_FAILS(vsr_memory_pool_stats_device(-1, &s), VSR_ERROR_OUT_OF_RANGE,
              "vsr_memory_pool_stats_device");
}

static void test_allocate_and_free(void) {
  void* p = (void*)&p;
  void* q = NULL;
  vsr_pool_stats s;
  int dummy = 0;

  CHECK_FAILS(vsr_device_allocate(MIB, NULL, NULL), VSR_ERROR_INVALID_ARGUMENT,
              "vsr_device_allocate");
  CHECK_OK(vsr_device_allocate(0, NULL, &p));
  CHECK(p == NULL);
  CHECK_OK(vsr_device_allocate(MIB, NULL, &p));
  CHECK(p != NULL && ((uintptr_t)p % 256) == 0);
  CHECK_OK(vsr_device_allocate(1000, NULL, &q));
  CHECK(q != NULL && q != p);
  s = stats();
  CHECK(s.current_bytes == MIB + 1000 && s.current_count == 2);
  CHECK(s.peak_bytes >= MIB + 1000 && s.total_count >= 2);
  CHECK(s.granularity == 2 * MIB && s.pool_size >= 2 * MIB);

  CHECK_FAILS(vsr_device_deallocate(p, MIB + 1, NULL), VSR_ERROR_INVALID_ARGUMENT,
              "vsr_device_deallocate"); /* wrong size: nothing changes */
  CHECK_FAILS(vsr_device_deallocate(&dummy, 4, NULL), VSR_ERROR_INVALID_ARGUMENT,
              "vsr_device_deallocate"); /* not the pool's */
  CHECK_FAILS(vsr_device_deallocate(NULL, 5, NULL), VSR_ERROR_INVALID_ARGUMENT,
              "vsr_device_deallocate");
  CHECK_OK(vsr_device_deallocate(NULL, 0, NULL));
  CHECK_OK(vsr_device_deallocate(p, MIB, NULL));
  CHECK_FAILS(vsr_device_deallocate(p, MIB, NULL), VSR_ERROR_INVALID_ARGUMENT,
              "vsr_device_deallocate"); /* double free */
  CHECK_OK(vsr_device_deallocate(q, 1000, NULL));
  CHECK_FAILS(vsr_device_deallocate(q, 1000, NULL), VSR_ERROR_INVALID_ARGUMENT,
              "vsr_device_deallocate");
  s = stats();
  CHECK(s.current_bytes == 0 && s.current_count == 0);

  /* The pool keeps freed pages; vsr_free_pool_memory gives them back. */
  CHECK(s.pool_free_bytes > 0);
  CHECK_OK(vsr_free_pool_memory());
  s = stats();
  CHECK(s.pool_free_bytes == 0 && s.pool_size == 0);
}

/* ---- OOM handlers ---- */

struct cache {
  void* ptr;
  size_t bytes;
  int calls;
  int freed;
};

/* Frees the cached block, if there is one, through the C ABI. */
static int free_cache(size_t requested_bytes, void* user_data) {
  struct cache* c = (struct cache*)user_data;
  ++c->calls;
  if (requested_bytes == 0 || c->ptr == NULL) return 0;
  if (vsr_device_deallocate(c->ptr, c->bytes, NULL) != VSR_OK) return 0;
  c->ptr = NULL;
  ++c->freed;
  return 1;
}

/* Like free_cache, then a vsr_ call of its own that fails: the outer call that then succeeds
 * must not keep that inner error (vsr_last_error_message is "" after any successful call). */
static int free_cache_then_fail(size_t requested_bytes, void* user_data) {
  int d = 0;
  const int freed = free_cache(requested_bytes, user_data);
  if (vsr_dtype_from_name("not-a-dtype", &d) != VSR_ERROR_INVALID_ARGUMENT) return 0;
  return freed;
}

static int count_only(size_t requested_bytes, void* user_data) {
  (void)requested_bytes;
  ++*(int*)user_data;
  return 0;
}

static void test_oom_handlers(void) {
  struct cache c = {NULL, 48 * MIB, 0, 0};
  int counted = 0;
  uint64_t id = 0;
  uint64_t counter_id = 0;
  uint64_t recoveries = 0;
  void* p = (void*)&p;
  void* q = NULL;
  vsr_pool_stats s;

  CHECK_FAILS(vsr_add_oom_handler(NULL, &c, &id), VSR_ERROR_INVALID_ARGUMENT,
              "vsr_add_oom_handler");
  CHECK_FAILS(vsr_add_oom_handler(free_cache, &c, NULL), VSR_ERROR_INVALID_ARGUMENT,
              "vsr_add_oom_handler");

  /* 48 MiB cached on a 64 MiB device: 32 MiB more does not fit without a handler. */
  CHECK_OK(vsr_device_allocate(c.bytes, NULL, &c.ptr));
  recoveries = stats().oom_recoveries;
  CHECK_FAILS(vsr_device_allocate(32 * MIB, NULL, &p), VSR_ERROR_OUT_OF_MEMORY,
              "vsr_device_allocate");
  CHECK(p == NULL);
  CHECK(vsr_last_cuda_error() == 0);

  /* A request larger than the device fails at once, handlers or not. */
  CHECK_OK(vsr_add_oom_handler(count_only, &counted, &counter_id));
  CHECK(counter_id != 0);
  CHECK_FAILS(vsr_device_allocate(128 * MIB, NULL, &p), VSR_ERROR_OUT_OF_MEMORY,
              "vsr_device_allocate");
  CHECK(counted == 0);

  /* A handler that frees nothing is called each round; the request still fails. */
  CHECK_FAILS(vsr_device_allocate(32 * MIB, NULL, &p), VSR_ERROR_OUT_OF_MEMORY,
              "vsr_device_allocate");
  CHECK(counted >= 1);
  CHECK(strstr(vsr_last_error_message(), "OOM handler") != NULL);

  /* The handler frees the cache: the request succeeds after it ran. */
  CHECK_OK(vsr_add_oom_handler(free_cache, &c, &id));
  CHECK(id != 0 && id != counter_id);
  CHECK_OK(vsr_remove_oom_handler(counter_id));
  counted = 0;
  CHECK_OK(vsr_device_allocate(32 * MIB, NULL, &p)); /* message "" despite the nested call */
  CHECK(p != NULL);
  CHECK(c.calls == 1 && c.freed == 1 && c.ptr == NULL);
  CHECK(counted == 0); /* removed: not called */
  s = stats();
  CHECK(s.oom_recoveries == recoveries + 1);
  CHECK(s.current_bytes == 32 * MIB && s.current_count == 1);

  /* Nothing left to free: the handler returns 0 and the request fails. */
  CHECK_FAILS(vsr_device_allocate(48 * MIB, NULL, &c.ptr), VSR_ERROR_OUT_OF_MEMORY,
              "vsr_device_allocate");
  CHECK(c.calls >= 2 && c.freed == 1);

  CHECK_OK(vsr_remove_oom_handler(id));
  CHECK_OK(vsr_remove_oom_handler(id));              /* unknown ids are ignored */
  CHECK_OK(vsr_remove_oom_handler(UINT64_C(12345))); /* never registered */
  CHECK_OK(vsr_device_deallocate(p, 32 * MIB, NULL));

  /* A handler whose own vsr_ call fails, then frees: the outer call succeeds with no error. */
  CHECK_OK(vsr_add_oom_handler(free_cache_then_fail, &c, &id));
  c.calls = 0;
  CHECK_OK(vsr_device_allocate(c.bytes, NULL, &c.ptr));
  CHECK_OK(vsr_device_allocate(32 * MIB, NULL, &q)); /* CHECK_OK: message "", CUresult 0 */
  CHECK(c.calls == 1 && c.ptr == NULL);
  CHECK_OK(vsr_device_deallocate(q, 32 * MIB, NULL));
  CHECK_OK(vsr_remove_oom_handler(id));
  CHECK_OK(vsr_free_pool_memory());
}

/* ---- driver failures (the emulator's fault plan) ---- */

static void test_cuda_errors(void) {
  typedef int (*set_fail_fn)(const char*);
  const char* path = getenv("VIBESPATIAL_CUDA_DRIVER");
  void* emulator;
  set_fail_fn set_fail;
  void* p = (void*)&p;

  CHECK(path != NULL);
  emulator = dlopen(path, RTLD_NOW | RTLD_NOLOAD); /* the instance the library loaded */
  CHECK(emulator != NULL);
  *(void**)(&set_fail) = dlsym(emulator, "vsr_emu_set_fail");
  CHECK(set_fail != NULL);

  /* Every cuMemCreate fails with CUDA_ERROR_UNKNOWN (999): not an OOM, a driver error. */
  CHECK(set_fail("cuMemCreate:1+:CUDA_ERROR_UNKNOWN") == 0);
  CHECK_FAILS(vsr_device_allocate(4 * MIB, NULL, &p), VSR_ERROR_CUDA, "vsr_device_allocate");
  CHECK(vsr_last_cuda_error() == 999);
  CHECK(strstr(vsr_last_error_message(), "CUDA_ERROR_UNKNOWN") != NULL);
  CHECK(p == NULL);
  CHECK(set_fail(NULL) == 0);
  CHECK(vsr_last_cuda_error() == 999); /* until the next call */
  CHECK_OK(vsr_device_allocate(4 * MIB, NULL, &p));
  CHECK(vsr_last_cuda_error() == 0);
  CHECK_OK(vsr_device_deallocate(p, 4 * MIB, NULL));
  CHECK_OK(vsr_free_pool_memory());
  dlclose(emulator);
}

/* ---- copies: vsr_memcpy, vsr_stream_synchronize ---- */

static void test_memcpy(void) {
  unsigned char host[4096];
  unsigned char back[4096];
  void* a = NULL;
  void* b = NULL;
  size_t i;
  for (i = 0; i < sizeof host; ++i) host[i] = (unsigned char)(i * 7 + 3);
  memset(back, 0, sizeof back);
  CHECK_OK(vsr_device_allocate(sizeof host, NULL, &a));
  CHECK_OK(vsr_device_allocate(sizeof host, NULL, &b));
  CHECK_OK(vsr_memcpy(a, host, sizeof host, VSR_COPY_HOST_TO_DEVICE, NULL));
  CHECK_OK(vsr_memcpy(b, a, sizeof host, VSR_COPY_DEVICE_TO_DEVICE, NULL));
  CHECK_OK(vsr_memcpy(back, b, sizeof host, VSR_COPY_DEVICE_TO_HOST, NULL));
  CHECK(memcmp(host, back, sizeof host) == 0);
  /* A part, from an offset inside the block. */
  memset(back, 0, sizeof back);
  CHECK_OK(vsr_memcpy(back, (unsigned char*)b + 100, 50, VSR_COPY_DEVICE_TO_HOST, NULL));
  CHECK(memcmp(back, host + 100, 50) == 0 && back[50] == 0);
  CHECK_OK(vsr_memcpy(NULL, NULL, 0, VSR_COPY_DEVICE_TO_HOST, NULL)); /* nothing to copy */
  CHECK_FAILS(vsr_memcpy(back, b, 16, 3, NULL), VSR_ERROR_INVALID_ARGUMENT, "vsr_memcpy");
  CHECK_FAILS(vsr_memcpy(back, b, 16, -1, NULL), VSR_ERROR_INVALID_ARGUMENT, "vsr_memcpy");
  CHECK_FAILS(vsr_memcpy(NULL, b, 16, VSR_COPY_DEVICE_TO_HOST, NULL), VSR_ERROR_INVALID_ARGUMENT,
              "vsr_memcpy");
  CHECK_FAILS(vsr_memcpy(a, NULL, 16, VSR_COPY_HOST_TO_DEVICE, NULL), VSR_ERROR_INVALID_ARGUMENT,
              "vsr_memcpy");
  CHECK_OK(vsr_stream_synchronize(NULL));
  CHECK_OK(vsr_device_deallocate(a, sizeof host, NULL));
  CHECK_OK(vsr_device_deallocate(b, sizeof host, NULL));
}

/* A device side that does not hold `bytes`: refused before any copy, so nothing past the block
 * is read or written and no sticky fault ends the context (a 64-byte block taken for 64 x 64 and
 * 1024 x 1024 float32 pixels, the second reaching unmapped pages). */
static void test_memcpy_extent(void) {
  const size_t claims[] = {64 * 64 * 4, 1024 * 1024 * 4};
  unsigned char* host = malloc(4 * MIB);
  void* small = NULL;
  void* large = NULL;
  size_t i;
  CHECK(host != NULL);
  memset(host, 0x5a, 4 * MIB);
  CHECK_OK(vsr_device_allocate(64, NULL, &small));
  CHECK_OK(vsr_device_allocate(8 * MIB, NULL, &large));
  CHECK_OK(vsr_memcpy(small, host, 64, VSR_COPY_HOST_TO_DEVICE, NULL));
  for (i = 0; i < sizeof claims / sizeof claims[0]; ++i) {
    memset(host, 0, 4 * MIB);
    CHECK_FAILS(vsr_memcpy(host, small, claims[i], VSR_COPY_DEVICE_TO_HOST, NULL),
                VSR_ERROR_INVALID_ARGUMENT, "vsr_memcpy");
    CHECK(strstr(vsr_last_error_message(), "vsr_memcpy: src: ") == vsr_last_error_message());
    CHECK(strstr(vsr_last_error_message(), "(64 bytes at") != NULL);
    CHECK(host[0] == 0 && host[64] == 0); /* nothing was copied */
    CHECK_FAILS(vsr_memcpy(small, host, claims[i], VSR_COPY_HOST_TO_DEVICE, NULL),
                VSR_ERROR_INVALID_ARGUMENT, "vsr_memcpy");
    CHECK(strstr(vsr_last_error_message(), "vsr_memcpy: dst: ") == vsr_last_error_message());
    CHECK_FAILS(vsr_memcpy(large, small, claims[i], VSR_COPY_DEVICE_TO_DEVICE, NULL),
                VSR_ERROR_INVALID_ARGUMENT, "vsr_memcpy");
    CHECK_FAILS(vsr_memcpy(small, large, claims[i], VSR_COPY_DEVICE_TO_DEVICE, NULL),
                VSR_ERROR_INVALID_ARGUMENT, "vsr_memcpy");
  }
  /* Host memory is not device memory. */
  CHECK_FAILS(vsr_memcpy(host, host + 64, 64, VSR_COPY_DEVICE_TO_HOST, NULL),
              VSR_ERROR_INVALID_ARGUMENT, "vsr_memcpy");
  CHECK(strstr(vsr_last_error_message(), "is not device memory") != NULL);
  /* The context is still usable: the block kept its bytes, new memory works. */
  memset(host, 0, 64);
  CHECK_OK(vsr_memcpy(host, small, 64, VSR_COPY_DEVICE_TO_HOST, NULL));
  CHECK(host[0] == 0x5a && host[63] == 0x5a);
  CHECK_OK(vsr_memcpy(large, small, 64, VSR_COPY_DEVICE_TO_DEVICE, NULL));
  CHECK_OK(vsr_stream_synchronize(NULL));
  CHECK_OK(vsr_device_deallocate(small, 64, NULL));
  CHECK_OK(vsr_device_deallocate(large, 8 * MIB, NULL));
  CHECK_OK(vsr_device_allocate(64, NULL, &small));
  CHECK_OK(vsr_device_deallocate(small, 64, NULL));
  free(host);
}

/* ---- vsr_forget_stream: a recycled stream handle does not inherit busy blocks ---- */

/* The emulator's driver calls, by name, with void* for CUDA handles (no cuda.h here). */
typedef int (*stream_create_fn)(void**, unsigned);
typedef int (*stream_fn)(void*);
typedef int (*event_create_fn)(void**, unsigned);
typedef int (*event_record_fn)(void*, void*);
typedef int (*stream_wait_event_fn)(void*, void*, unsigned);
typedef int (*memset_async_fn)(unsigned long long, unsigned char, size_t, void*);
typedef int (*stream_pause_fn)(void*, int);
typedef int (*set_option_fn)(const char*, const char*);

static void* emulator_symbol(void* emulator, const char* name) {
  void* f = dlsym(emulator, name);
  CHECK(f != NULL);
  return f;
}

static void test_forget_stream(void) {
  const char* path = getenv("VIBESPATIAL_CUDA_DRIVER");
  void* emulator;
  stream_create_fn stream_create;
  stream_fn stream_destroy, stream_synchronize, stream_query;
  event_create_fn event_create;
  stream_fn event_destroy;
  event_record_fn event_record;
  stream_wait_event_fn stream_wait_event;
  memset_async_fn memset_async;
  stream_pause_fn stream_pause;
  set_option_fn set_option;
  void* gate = NULL;
  void* event = NULL;
  void* s = NULL;
  void* s2 = NULL;
  void* p = NULL;
  void* q = NULL;
  const size_t size = 1024;
  unsigned char back[1024];
  size_t i;

  CHECK(path != NULL);
  emulator = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
  CHECK(emulator != NULL);
  *(void**)(&stream_create) = emulator_symbol(emulator, "cuStreamCreate");
  *(void**)(&stream_destroy) = emulator_symbol(emulator, "cuStreamDestroy_v2");
  *(void**)(&stream_synchronize) = emulator_symbol(emulator, "cuStreamSynchronize");
  *(void**)(&stream_query) = emulator_symbol(emulator, "cuStreamQuery");
  *(void**)(&event_create) = emulator_symbol(emulator, "cuEventCreate");
  *(void**)(&event_destroy) = emulator_symbol(emulator, "cuEventDestroy_v2");
  *(void**)(&event_record) = emulator_symbol(emulator, "cuEventRecord");
  *(void**)(&stream_wait_event) = emulator_symbol(emulator, "cuStreamWaitEvent");
  *(void**)(&memset_async) = emulator_symbol(emulator, "cuMemsetD8Async");
  *(void**)(&stream_pause) = emulator_symbol(emulator, "vsr_emu_stream_pause");
  *(void**)(&set_option) = emulator_symbol(emulator, "vsr_emu_set_option");

  CHECK_OK(vsr_forget_stream(NULL)); /* the legacy stream: a no-op */
  /* The handle of a destroyed stream goes to the next stream at once, as on the real driver. */
  CHECK(set_option("RECYCLE_HANDLES", "1") == 0);
  CHECK_OK(vsr_stream_synchronize(NULL)); /* binds the primary context on this thread */
  /* S's work waits behind a held stream (a hold that outlives S's destruction). */
  CHECK(stream_create(&gate, 1) == 0);
  CHECK(stream_pause(gate, 1) == 0);
  CHECK(event_create(&event, 2) == 0);
  CHECK(event_record(event, gate) == 0);
  CHECK(stream_create(&s, 1) == 0);
  CHECK(stream_wait_event(s, event, 0) == 0);
  CHECK_OK(vsr_device_allocate(size, s, &p));
  CHECK(memset_async((unsigned long long)(uintptr_t)p, 0xaa, size, s) == 0); /* pending */
  CHECK_OK(vsr_device_deallocate(p, size, s));
  CHECK_OK(vsr_forget_stream(s));
  CHECK_OK(vsr_forget_stream(s)); /* may be called again */
  CHECK(stream_destroy(s) == 0);
  CHECK(stream_create(&s2, 1) == 0);
  CHECK(s2 == s); /* the same handle value */
  CHECK_OK(vsr_device_allocate(size, s2, &q));
  if (q == p) CHECK(stream_query(s2) == 600); /* CUDA_ERROR_NOT_READY: behind S's free */
  CHECK(memset_async((unsigned long long)(uintptr_t)q, 0x55, size, s2) == 0);
  CHECK(stream_pause(gate, 0) == 0);
  CHECK(stream_synchronize(gate) == 0);
  CHECK(stream_synchronize(s2) == 0);
  CHECK_OK(vsr_memcpy(back, q, size, VSR_COPY_DEVICE_TO_HOST, s2));
  for (i = 0; i < size; ++i) CHECK(back[i] == 0x55); /* S's late write did not land here */
  CHECK_OK(vsr_device_deallocate(q, size, s2));
  CHECK_OK(vsr_forget_stream(s2));
  CHECK(stream_destroy(s2) == 0);
  CHECK(event_destroy(event) == 0);
  CHECK(stream_destroy(gate) == 0);
  CHECK(set_option("RECYCLE_HANDLES", "default") == 0);
  dlclose(emulator);
}

/* ---- the error state is per thread ---- */

static void* thread_body(void* arg) {
  int* result = (int*)arg;
  int d = 0;
  *result = 1;
  if (vsr_last_error_message()[0] != '\0') return NULL; /* not the main thread's */
  if (vsr_dtype_from_name("int4", &d) != VSR_ERROR_INVALID_ARGUMENT) return NULL;
  if (strstr(vsr_last_error_message(), "int4") == NULL) return NULL;
  if (vsr_dtype_from_name("int8", &d) != VSR_OK || d != VSR_DTYPE_INT8) return NULL;
  if (vsr_last_error_message()[0] != '\0') return NULL;
  *result = 0;
  return NULL;
}

static void test_thread_local_errors(void) {
  pthread_t thread;
  int result = -1;
  int d = 0;
  CHECK_FAILS(vsr_dtype_from_name("complex64", &d), VSR_ERROR_INVALID_ARGUMENT,
              "vsr_dtype_from_name");
  CHECK(pthread_create(&thread, NULL, thread_body, &result) == 0);
  CHECK(pthread_join(thread, NULL) == 0);
  CHECK(result == 0);
  CHECK(strstr(vsr_last_error_message(), "complex64") != NULL); /* untouched by the thread */
}

/* ---- no driver, or a driver whose cuInit fails ---- */

/* `reason` is a part of the message every failing call must quote. */
static int run_without_driver(const char* mode, const char* reason) {
  char tier[VSR_TIER_CAPACITY] = "unchanged";
  void* p = (void*)&p;
  uint64_t available = 1;
  vsr_pool_stats s;
  vsr_raster_plan plan;
  vsr_plan_options o;

  CHECK_FAILS(vsr_configure_memory_pool(tier, sizeof tier), VSR_ERROR_NO_DRIVER,
              "vsr_configure_memory_pool");
  CHECK(vsr_last_cuda_error() != 0);
  CHECK(strstr(vsr_last_error_message(), reason) != NULL);
  CHECK(strcmp(tier, "unchanged") == 0);
  CHECK_FAILS(vsr_configure_memory_pool(tier, sizeof tier), VSR_ERROR_NO_DRIVER,
              "vsr_configure_memory_pool"); /* not cached as success */
  CHECK_FAILS(vsr_device_allocate(MIB, NULL, &p), VSR_ERROR_NO_DRIVER, "vsr_device_allocate");
  CHECK(p == NULL);
  CHECK_OK(vsr_available_vram_bytes(&available));
  CHECK(available == 0);
  s = stats();
  CHECK(s.tier[0] == '\0' && s.configured == 0);
  CHECK_OK(vsr_free_pool_memory());
  CHECK_OK(vsr_forget_stream(NULL)); /* a no-op before configuration */
  CHECK_FAILS(vsr_memcpy(&available, &s, 8, VSR_COPY_DEVICE_TO_HOST, NULL), VSR_ERROR_NO_DRIVER,
              "vsr_memcpy");
  CHECK_FAILS(vsr_stream_synchronize(NULL), VSR_ERROR_NO_DRIVER, "vsr_stream_synchronize");
  /* Planning needs no driver: budget 0 means whole. */
  plan.struct_size = sizeof plan;
  CHECK_OK(vsr_analyze_raster_plan(5000, 5000, VSR_DTYPE_FLOAT64, NULL, &plan));
  CHECK(plan.strategy == VSR_TILING_WHOLE && plan.estimated_vram_per_tile == 0);
  CHECK_OK(vsr_plan_options_init(&o));
  o.has_vram_budget = 1;
  o.vram_budget = 1000000;
  CHECK_OK(vsr_analyze_raster_plan(5000, 5000, VSR_DTYPE_FLOAT64, &o, &plan));
  CHECK(plan.strategy == VSR_TILING_TILED);
  printf("c-api (%s): %d checks passed\n", mode, g_checks);
  return 0;
}

/* ---- a driver whose first starts fail ---- */

/* Nothing is kept of a failed start: each call starts the driver again (once the failure of the
 * first cuInit was kept for the whole process, and the driver never saw a second one). */
static int run_start_fails_twice(void) {
  char tier[VSR_TIER_CAPACITY] = "unchanged";
  void* p = (void*)&p;
  void* emulator;
  unsigned long long (*call_count)(const char*);
  const char* path = getenv("VIBESPATIAL_CUDA_DRIVER");

  CHECK(path != NULL);
  CHECK_FAILS(vsr_configure_memory_pool(tier, sizeof tier), VSR_ERROR_NO_DRIVER,
              "vsr_configure_memory_pool");
  CHECK(strstr(vsr_last_error_message(), "cuInit failed") != NULL);
  CHECK(strcmp(tier, "unchanged") == 0);
  CHECK_FAILS(vsr_device_allocate(MIB, NULL, &p), VSR_ERROR_NO_DRIVER, "vsr_device_allocate");
  CHECK(p == NULL);
  CHECK_OK(vsr_device_allocate(MIB, NULL, &p)); /* configures the pool on the way */
  CHECK(p != NULL);
  CHECK_OK(vsr_device_deallocate(p, MIB, NULL));
  CHECK_OK(vsr_configure_memory_pool(tier, sizeof tier));
  CHECK(strcmp(tier, "B") == 0);
  CHECK(stats().configured == 1);

  emulator = dlopen(path, RTLD_NOW | RTLD_NOLOAD); /* the instance the library loaded */
  CHECK(emulator != NULL);
  *(void**)(&call_count) = dlsym(emulator, "vsr_emu_call_count");
  CHECK(call_count != NULL);
  CHECK(call_count("cuInit") == 3); /* two failed starts, one good, none after */
  dlclose(emulator);
  printf("c-api (start fails twice): %d checks passed\n", g_checks);
  return 0;
}

/* ---- memory history and snapshots ---- */

static void test_memory_history(void) {
  char dir[] = "/tmp/vsr-capi-history-XXXXXX";
  char path[256];
  char missing[256];
  char fifo[256];
  struct stat st;
  void* p = NULL;
  void* q = NULL;
  FILE* f;
  CHECK_FAILS(vsr_record_memory_history(1, 0), VSR_ERROR_INVALID_ARGUMENT,
              "vsr_record_memory_history");
  CHECK_FAILS(vsr_record_memory_history(1, (size_t)1 << 40), VSR_ERROR_OUT_OF_RANGE,
              "vsr_record_memory_history");
  CHECK_FAILS(vsr_push_memory_tag(NULL), VSR_ERROR_INVALID_ARGUMENT, "vsr_push_memory_tag");
  CHECK_FAILS(vsr_push_memory_tag(""), VSR_ERROR_INVALID_ARGUMENT, "vsr_push_memory_tag");
  CHECK_FAILS(vsr_push_memory_tag("\xff"), VSR_ERROR_INVALID_ARGUMENT, "vsr_push_memory_tag");
  CHECK_FAILS(vsr_pop_memory_tag(), VSR_ERROR_INVALID_ARGUMENT, "vsr_pop_memory_tag");
  CHECK_OK(vsr_record_memory_history(1, 1000));
  CHECK_OK(vsr_push_memory_tag("c caller"));
  CHECK_OK(vsr_device_allocate(3 * MIB, NULL, &p));
  CHECK_FAILS(vsr_device_allocate((size_t)1 << 40, NULL, &q), VSR_ERROR_OUT_OF_MEMORY,
              "vsr_device_allocate");
  CHECK(strstr(vsr_last_error_message(),
               "top owners by live bytes: c caller 3.00 MiB in 1 block") != NULL);
  CHECK(strstr(vsr_last_error_message(), "requested 1.00 TiB") != NULL);
  CHECK_OK(vsr_pop_memory_tag());
  CHECK_FAILS(vsr_pop_memory_tag(), VSR_ERROR_INVALID_ARGUMENT, "vsr_pop_memory_tag");
  CHECK(mkdtemp(dir) != NULL);
  snprintf(path, sizeof path, "%s/snap.pickle", dir);
  snprintf(missing, sizeof missing, "%s/missing/snap.pickle", dir);
  snprintf(fifo, sizeof fifo, "%s/pipe", dir);
  CHECK_OK(vsr_dump_memory_snapshot(path, 0));
  f = fopen(path, "rb");
  CHECK(f != NULL);
  CHECK(fgetc(f) == 0x80);
  fclose(f);
  CHECK_FAILS(vsr_dump_memory_snapshot(path, 0), VSR_ERROR_IO, "vsr_dump_memory_snapshot");
  CHECK(vsr_last_io_errno() == EEXIST);
  CHECK(strstr(vsr_last_error_message(), "exists") != NULL);
  CHECK_OK(vsr_dump_memory_snapshot(path, 1));
  CHECK(vsr_last_io_errno() == 0);
  CHECK_FAILS(vsr_dump_memory_snapshot(missing, 0), VSR_ERROR_IO, "vsr_dump_memory_snapshot");
  CHECK(vsr_last_io_errno() == ENOENT);
  /* A FIFO (or a device) is never replaced, even with overwrite: its reader would wait forever. */
  CHECK(mkfifo(fifo, 0600) == 0);
  CHECK_FAILS(vsr_dump_memory_snapshot(fifo, 1), VSR_ERROR_INVALID_ARGUMENT,
              "vsr_dump_memory_snapshot");
  CHECK(strstr(vsr_last_error_message(), "not a regular file") != NULL);
  CHECK(lstat(fifo, &st) == 0 && S_ISFIFO(st.st_mode));
  CHECK(remove(fifo) == 0);
  CHECK_FAILS(vsr_dump_memory_snapshot(NULL, 0), VSR_ERROR_INVALID_ARGUMENT,
              "vsr_dump_memory_snapshot");
  CHECK(remove(path) == 0);
  CHECK(rmdir(dir) == 0); /* nothing else was left behind */
  CHECK_OK(vsr_device_deallocate(p, 3 * MIB, NULL));
  CHECK_OK(vsr_record_memory_history(0, 0));
}

int main(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "--no-driver") == 0) {
    return run_without_driver("no driver", "VIBESPATIAL_CUDA_DRIVER");
  }
  if (argc > 1 && strcmp(argv[1], "--no-device") == 0) {
    return run_without_driver("no device", "cuInit failed");
  }
  if (argc > 1 && strcmp(argv[1], "--start-fails-twice") == 0) {
    return run_start_fails_twice();
  }
  if (argc > 1) {
    fprintf(stderr, "usage: %s [--no-driver | --no-device | --start-fails-twice]\n", argv[0]);
    return 2;
  }
  test_version_and_names();
  test_budget_and_plans();
  test_pool_before_configuration();
  test_configure();
  test_allocate_and_free();
  test_oom_handlers();
  test_cuda_errors();
  test_memcpy();
  test_memcpy_extent();
  test_forget_stream();
  test_thread_local_errors();
  test_memory_history();
  CHECK(stats().current_bytes == 0);
  printf("c-api: %d checks passed (vibespatial-raster %s)\n", g_checks, vsr_version());
  return 0;
}
