// SPDX-License-Identifier: Apache-2.0
// The C ABI (c_api.h) over the C++ API: argument checks, struct conversion and exception to
// status translation. No exception leaves this file.
#include "capi/vsr_version.h"
#include "common/expects.hpp"
#include "driver/cuda_driver.hpp"

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/c_api.h>
#include <vibespatial/raster/dispatch.hpp>
#include <vibespatial/raster/errors.hpp>
#include <vibespatial/raster/memory.hpp>
#include <vibespatial/raster/memory_history.hpp>
#include <vibespatial/raster/outputs.hpp>
#include <vibespatial/raster/warp.hpp>
#include <vibespatial/raster/zonal.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>

namespace vsr = vibespatial::raster;

namespace {

// The first published sizes: a caller's struct_size must be at least these (later fields are
// filled only as far as a caller's struct_size reaches).
constexpr std::size_t kPoolStatsV1Size = offsetof(vsr_pool_stats, tier_reason);
constexpr std::size_t kPlanOptionsV1Size = sizeof(vsr_plan_options);
constexpr std::size_t kRasterPlanV1Size = sizeof(vsr_raster_plan);
constexpr std::size_t kZonalOptionsV1Size = sizeof(vsr_zonal_options);

static_assert(offsetof(vsr_pool_stats, tier_reason) == 200, "vsr_pool_stats layout is ABI");
static_assert(sizeof(vsr_pool_stats) == 200 + VSR_TIER_REASON_CAPACITY, "fields are appended only");
static_assert(sizeof(vsr_plan_options) == 48, "vsr_plan_options layout is ABI");
static_assert(sizeof(vsr_raster_plan) == 64, "vsr_raster_plan layout is ABI");
static_assert(sizeof(vsr_zonal_options) == 80, "vsr_zonal_options layout is ABI");
static_assert(VSR_DTYPE_FLOAT64 == static_cast<int>(vsr::DType::float64));
static_assert(VSR_DTYPE_UINT8 == static_cast<int>(vsr::DType::uint8));
static_assert(VSR_TILING_TILED == static_cast<int>(vsr::TilingStrategy::tiled));
static_assert(VSR_TILING_BAND_BATCHES == static_cast<int>(vsr::TilingStrategy::band_batches));

// Per-thread error state. `fallback` is used when the message itself cannot be stored.
struct ErrorState {
  std::string message;
  const char* fallback = nullptr;
  int cuda_error = 0;
  int io_errno = 0;
};
thread_local ErrorState t_error;

void clear_error() noexcept {
  t_error.message.clear();
  t_error.fallback = nullptr;
  t_error.cuda_error = 0;
  t_error.io_errno = 0;
}

vsr_status fail(vsr_status status, const char* function, const char* what,
                int cuda_error = 0) noexcept {
  t_error.cuda_error = cuda_error;
  t_error.fallback = nullptr;
  try {
    t_error.message.assign(function);
    t_error.message.append(": ");
    t_error.message.append((what != nullptr && what[0] != '\0') ? what : "unspecified error");
  } catch (...) {
    t_error.message.clear();
    t_error.fallback = "vsr: out of host memory while recording an error message";
  }
  return status;
}

vsr_status fail(vsr_status status, const char* function, const std::string& what) noexcept {
  return fail(status, function, what.c_str());
}

// Runs `body` (which returns nothing) and translates any exception into a status.
template <class Body>
vsr_status guarded(const char* function, Body&& body) noexcept {
  clear_error();
  try {
    body();
    // Cleared again: an OOM handler run inside `body` may have made a failing vsr_ call on this
    // thread, and a successful call leaves no message (c_api.h).
    clear_error();
    return VSR_OK;
  } catch (const vsr::DriverUnavailableError& e) {
    return fail(VSR_ERROR_NO_DRIVER, function, e.what(), e.code());
  } catch (const vsr::CudaError& e) {
    return fail(VSR_ERROR_CUDA, function, e.what(), e.code());
  } catch (const vsr::OutOfMemoryError& e) {
    return fail(VSR_ERROR_OUT_OF_MEMORY, function, e.what());
  } catch (const std::bad_alloc& e) {
    return fail(VSR_ERROR_OUT_OF_MEMORY, function,
                std::string("host memory allocation failed (") + e.what() + ")");
  } catch (const std::invalid_argument& e) {
    return fail(VSR_ERROR_INVALID_ARGUMENT, function, e.what());
  } catch (const std::out_of_range& e) {
    return fail(VSR_ERROR_OUT_OF_RANGE, function, e.what());
  } catch (const std::overflow_error& e) {
    return fail(VSR_ERROR_OVERFLOW, function, e.what());
  } catch (const std::system_error& e) {
    if (e.code().category() == std::generic_category() ||
        e.code().category() == std::system_category()) {
      const vsr_status st = fail(VSR_ERROR_IO, function, e.what());
      t_error.io_errno = e.code().value();
      return st;
    }
    return fail(VSR_ERROR_INTERNAL, function, e.what());
  } catch (const std::exception& e) {
    return fail(VSR_ERROR_INTERNAL, function, e.what());
  } catch (...) {
    return fail(VSR_ERROR_INTERNAL, function, "unknown exception");
  }
}

vsr::DType to_dtype(int dtype) {
  VSR_EXPECTS(dtype >= VSR_DTYPE_UINT8 && dtype <= VSR_DTYPE_FLOAT64,
              "dtype " + std::to_string(dtype) +
                  " is not a vsr_dtype (0 = VSR_DTYPE_UINT8 ... 9 = VSR_DTYPE_FLOAT64)");
  return static_cast<vsr::DType>(dtype);
}

std::uint64_t value_of(const std::optional<std::size_t>& v, std::int32_t& has) {
  has = v.has_value() ? 1 : 0;
  return v.value_or(0);
}

// Copies as much of `text` as fits `capacity` bytes with its NUL (nothing when capacity is 0).
void copy_truncated(std::string_view text, char* out, std::size_t capacity) noexcept {
  if (capacity == 0) return;
  const std::size_t n = std::min(text.size(), capacity - 1);
  std::memcpy(out, text.data(), n);
  out[n] = '\0';
}

// A caller's struct (`name`, as in "out->struct_size") must be at least its first published size.
void check_struct_size(const char* name, const char* type, std::size_t struct_size,
                       std::size_t v1_size, const char* advice = "") {
  VSR_EXPECTS(struct_size >= v1_size, std::string(name) + "->struct_size is " +
                                          std::to_string(struct_size) + ", expected sizeof(" +
                                          type + ") (at least " + std::to_string(v1_size) + ")" +
                                          advice);
}

vsr_pool_stats to_c(const vsr::MemoryPoolStats& s) {
  vsr_pool_stats c{};
  c.struct_size = sizeof(vsr_pool_stats);
  copy_truncated(s.tier, c.tier, sizeof(c.tier));
  c.configured = s.configured ? 1 : 0;
  c.device = s.device;
  c.current_bytes = value_of(s.current_bytes, c.has_current_bytes);
  c.current_count = value_of(s.current_count, c.has_current_count);
  c.peak_bytes = value_of(s.peak_bytes, c.has_peak_bytes);
  c.peak_count = value_of(s.peak_count, c.has_peak_count);
  c.total_bytes = value_of(s.total_bytes, c.has_total_bytes);
  c.total_count = value_of(s.total_count, c.has_total_count);
  c.pool_size = value_of(s.pool_size, c.has_pool_size);
  c.used_bytes = value_of(s.used_bytes, c.has_used_bytes);
  c.free_bytes = value_of(s.free_bytes, c.has_free_bytes);
  c.mapped_bytes = s.mapped_bytes;
  c.reserved_bytes = s.reserved_bytes;
  c.pool_free_bytes = s.pool_free_bytes;
  c.largest_free_block = s.largest_free_block;
  c.oom_recoveries = s.oom_recoveries;
  c.granularity = s.granularity;
  c.small_block_limit = s.small_block_limit;
  copy_truncated(s.tier_reason, c.tier_reason, sizeof(c.tier_reason));
  return c;
}

// Copies a filled struct into the caller's, no byte past its struct_size; struct_size is set to
// the bytes filled.
template <class T>
void copy_out(const T& full, T* out) {
  const std::size_t n = std::min(out->struct_size, sizeof(T));
  std::memcpy(static_cast<void*>(out), &full, n);
  out->struct_size = n;
}

void stats_into(const vsr::MemoryPoolStats& s, vsr_pool_stats* out) {
  VSR_EXPECTS(out != nullptr, "out is NULL");
  check_struct_size("out", "vsr_pool_stats", out->struct_size, kPoolStatsV1Size);
  copy_out(to_c(s), out);
}

}  // namespace

extern "C" {

const char* vsr_version(void) {
  return VSR_VERSION_STRING;
}

const char* vsr_last_error_message(void) {
  return t_error.fallback != nullptr ? t_error.fallback : t_error.message.c_str();
}

int vsr_last_cuda_error(void) {
  return t_error.cuda_error;
}

vsr_status vsr_configure_memory_pool(char* tier_out, size_t tier_capacity) {
  return guarded(__func__, [&] {
    const std::string tier = vsr::configure_memory_pool();
    if (tier_out == nullptr) return;
    copy_truncated(tier, tier_out, tier_capacity);
    if (tier_capacity < tier.size() + 1) {
      throw std::out_of_range("tier_capacity " + std::to_string(tier_capacity) +
                              " cannot hold the tier \"" + tier + "\" and its NUL (" +
                              std::to_string(tier.size() + 1) + " bytes)");
    }
  });
}

vsr_status vsr_free_pool_memory(void) {
  return guarded(__func__, [] { vsr::free_pool_memory(); });
}

vsr_status vsr_forget_stream(void* stream) {
  return guarded(__func__, [&] { vsr::forget_stream(static_cast<CUstream>(stream)); });
}

vsr_status vsr_record_memory_history(int enabled, size_t max_entries) {
  return guarded(__func__, [&] { vsr::record_memory_history(enabled != 0, max_entries); });
}

vsr_status vsr_push_memory_tag(const char* tag) {
  return guarded(__func__, [&] {
    VSR_EXPECTS(tag != nullptr, "tag is NULL");
    vsr::push_memory_tag(tag);
  });
}

vsr_status vsr_pop_memory_tag(void) {
  return guarded(__func__, [] {
    VSR_EXPECTS(vsr::memory_tag_depth() > 0, "no memory tag is pushed on this thread");
    vsr::pop_memory_tag();
  });
}

vsr_status vsr_dump_memory_snapshot(const char* path, int overwrite) {
  return guarded(__func__, [&] {
    VSR_EXPECTS(path != nullptr, "path is NULL");
    vsr::dump_memory_snapshot(path, overwrite != 0);
  });
}

int vsr_last_io_errno(void) {
  return t_error.io_errno;
}

vsr_status vsr_memory_pool_stats(vsr_pool_stats* out) {
  return guarded(__func__, [&] { stats_into(vsr::memory_pool_stats(), out); });
}

vsr_status vsr_memory_pool_stats_device(int device, vsr_pool_stats* out) {
  return guarded(__func__, [&] {
    const vsr::MemoryPoolStats s = vsr::memory_pool_stats(device);
    if (s.no_such_device) {
      throw std::out_of_range("device " + std::to_string(device) + " does not exist");
    }
    stats_into(s, out);
  });
}

vsr_status vsr_device_allocate(size_t bytes, void* stream, void** out) {
  if (out != nullptr) *out = nullptr;
  return guarded(__func__, [&] {
    VSR_EXPECTS(out != nullptr, "out is NULL");
    *out = vsr::device_allocate(bytes, static_cast<CUstream>(stream));
  });
}

vsr_status vsr_device_deallocate(void* ptr, size_t bytes, void* stream) {
  return guarded(__func__,
                 [&] { vsr::device_deallocate(ptr, bytes, static_cast<CUstream>(stream)); });
}

vsr_status vsr_add_oom_handler(vsr_oom_handler handler, void* user_data, uint64_t* id_out) {
  return guarded(__func__, [&] {
    VSR_EXPECTS(handler != nullptr, "handler is NULL");
    VSR_EXPECTS(id_out != nullptr, "id_out is NULL");
    *id_out = vsr::add_oom_handler(
        [handler, user_data](std::size_t requested) { return handler(requested, user_data) != 0; });
  });
}

vsr_status vsr_remove_oom_handler(uint64_t id) {
  return guarded(__func__, [&] { vsr::remove_oom_handler(id); });
}

vsr_status vsr_available_vram_bytes(uint64_t* out) {
  return guarded(__func__, [&] {
    VSR_EXPECTS(out != nullptr, "out is NULL");
    *out = vsr::available_vram_bytes();
  });
}

vsr_status vsr_max_bands_for_budget(int64_t height, int64_t width, int dtype, int buffers_per_band,
                                    uint64_t scratch_bytes, int has_vram_budget,
                                    uint64_t vram_budget, int* out) {
  return guarded(__func__, [&] {
    VSR_EXPECTS(out != nullptr, "out is NULL");
    const vsr::DType d = to_dtype(dtype);
    std::optional<std::uint64_t> budget;
    if (has_vram_budget != 0) budget = vram_budget;
    *out = vsr::max_bands_for_budget(height, width, d, buffers_per_band, scratch_bytes, budget);
  });
}

vsr_status vsr_plan_options_init(vsr_plan_options* opts) {
  return guarded(__func__, [&] {
    VSR_EXPECTS(opts != nullptr, "opts is NULL");
    const vsr::PlanOptions defaults;
    *opts = vsr_plan_options{};
    opts->struct_size = sizeof(vsr_plan_options);
    opts->band_count = defaults.band_count;
    opts->buffers_per_band = defaults.buffers_per_band;
    opts->scratch_bytes = defaults.scratch_bytes;
    opts->halo = defaults.halo;
    opts->per_band = defaults.per_band ? 1 : 0;
  });
}

vsr_status vsr_analyze_raster_plan(int64_t height, int64_t width, int dtype,
                                   const vsr_plan_options* opts, vsr_raster_plan* out) {
  return guarded(__func__, [&] {
    VSR_EXPECTS(out != nullptr, "out is NULL");
    check_struct_size("out", "vsr_raster_plan", out->struct_size, kRasterPlanV1Size);
    const vsr::DType d = to_dtype(dtype);
    vsr::PlanOptions options;
    if (opts != nullptr) {
      check_struct_size("opts", "vsr_plan_options", opts->struct_size, kPlanOptionsV1Size,
                        ": fill it with vsr_plan_options_init");
      options.band_count = opts->band_count;
      options.buffers_per_band = opts->buffers_per_band;
      options.scratch_bytes = opts->scratch_bytes;
      options.halo = opts->halo;
      options.per_band = opts->per_band != 0;
      if (opts->has_vram_budget != 0) options.vram_budget = opts->vram_budget;
    }
    const vsr::RasterPlan plan = vsr::analyze_raster_plan(height, width, d, options);
    vsr_raster_plan c{};
    c.struct_size = sizeof(vsr_raster_plan);
    c.strategy = static_cast<std::int32_t>(plan.strategy);
    c.halo = plan.halo;
    c.has_tile_shape = plan.tile_shape.has_value() ? 1 : 0;
    c.bands_per_pass = plan.bands_per_pass;
    if (plan.tile_shape) {
      c.tile_height = plan.tile_shape->first;
      c.tile_width = plan.tile_shape->second;
    }
    c.n_tiles = plan.n_tiles;
    c.estimated_vram_per_tile = plan.estimated_vram_per_tile;
    c.fits_budget = plan.fits_budget ? 1 : 0;
    copy_out(c, out);
  });
}

vsr_status vsr_dtype_from_name(const char* name, int* out) {
  return guarded(__func__, [&] {
    VSR_EXPECTS(name != nullptr, "name is NULL");
    VSR_EXPECTS(out != nullptr, "out is NULL");
    const std::optional<vsr::DType> d = vsr::dtype_from_string(name);
    VSR_EXPECTS(d.has_value(), std::string("\"") + name +
                                   "\" is not a dtype name (uint8, int8, uint16, int16, uint32, "
                                   "int32, uint64, int64, float32, float64)");
    *out = static_cast<int>(*d);
  });
}

vsr_status vsr_dtype_name(int dtype, const char** out) {
  return guarded(__func__, [&] {
    VSR_EXPECTS(out != nullptr, "out is NULL");
    // to_string returns a view of a NUL-terminated literal.
    *out = vsr::to_string(to_dtype(dtype)).data();
  });
}

vsr_status vsr_dtype_itemsize(int dtype, size_t* out) {
  return guarded(__func__, [&] {
    VSR_EXPECTS(out != nullptr, "out is NULL");
    *out = vsr::itemsize(to_dtype(dtype));
  });
}

vsr_status vsr_tiling_strategy_name(int strategy, const char** out) {
  return guarded(__func__, [&] {
    VSR_EXPECTS(out != nullptr, "out is NULL");
    VSR_EXPECTS(strategy >= VSR_TILING_WHOLE && strategy <= VSR_TILING_TILED,
                "strategy " + std::to_string(strategy) + " is not a vsr_tiling_strategy");
    *out = vsr::to_string(static_cast<vsr::TilingStrategy>(strategy)).data();
  });
}

vsr_status vsr_memcpy(void* dst, const void* src, size_t bytes, int kind, void* stream) {
  return guarded(__func__, [&] {
    VSR_EXPECTS(kind >= VSR_COPY_HOST_TO_DEVICE && kind <= VSR_COPY_DEVICE_TO_DEVICE,
                "kind is not a vsr_copy_kind (0 = host to device, 1 = device to host, 2 = device "
                "to device)");
    if (bytes == 0) return;
    VSR_EXPECTS(dst != nullptr && src != nullptr, "dst or src is NULL");
    const vsr::detail::DriverApi& api = vsr::detail::driver();
    vsr::detail::bind_current_device();
    // Before any copy: the device side(s) must hold `bytes` (a copy past an allocation reads its
    // neighbours, or faults with a sticky error that ends the context).
    if (kind != VSR_COPY_HOST_TO_DEVICE) vsr::check_device_range(src, bytes, "src");
    if (kind != VSR_COPY_DEVICE_TO_HOST) vsr::check_device_range(dst, bytes, "dst");
    const auto s = static_cast<CUstream>(stream);
    using vsr::detail::to_device_ptr;
    switch (kind) {
      case VSR_COPY_HOST_TO_DEVICE:
        VSR_CU_TRY(api.cuMemcpyHtoDAsync(to_device_ptr(dst), src, bytes, s));
        break;
      case VSR_COPY_DEVICE_TO_HOST:
        VSR_CU_TRY(api.cuMemcpyDtoHAsync(dst, to_device_ptr(src), bytes, s));
        break;
      default:
        VSR_CU_TRY(api.cuMemcpyDtoDAsync(to_device_ptr(dst), to_device_ptr(src), bytes, s));
        break;
    }
    VSR_CU_TRY(api.cuStreamSynchronize(s));
  });
}

vsr_status vsr_stream_synchronize(void* stream) {
  return guarded(__func__, [&] {
    const vsr::detail::DriverApi& api = vsr::detail::driver();
    vsr::detail::bind_current_device();
    VSR_CU_TRY(api.cuStreamSynchronize(static_cast<CUstream>(stream)));
  });
}

vsr_status vsr_warp_options_init(vsr_warp_options* opts) {
  return guarded(__func__, [&] {
    VSR_EXPECTS(opts != nullptr, "opts is NULL");
    *opts = vsr_warp_options{};
    opts->struct_size = sizeof(vsr_warp_options);
    opts->error_threshold = vsr::WarpOptions{}.error_threshold;
    opts->overwrite = 1;
  });
}

vsr_status vsr_warp_file(const char* input, const char* output, const vsr_warp_options* opts) {
  return guarded(__func__, [&] {
    VSR_EXPECTS(input != nullptr, "input is NULL");
    VSR_EXPECTS(output != nullptr, "output is NULL");
    vsr::WarpOptions o;
    vsr::WriteOptions write;
    if (opts != nullptr) {
      check_struct_size("opts", "vsr_warp_options", opts->struct_size, sizeof(vsr_warp_options),
                        ": fill it with vsr_warp_options_init");
      if (opts->dst_crs != nullptr) o.dst_crs = opts->dst_crs;
      if (opts->src_crs != nullptr) o.src_crs = opts->src_crs;
      if (opts->method != nullptr) o.method = vsr::warp_method_from_string(opts->method);
      o.error_threshold = opts->error_threshold;
      if (opts->has_resolution != 0) o.resolution = {{opts->resolution[0], opts->resolution[1]}};
      if (opts->has_extent != 0) {
        o.extent = {{opts->extent[0], opts->extent[1], opts->extent[2], opts->extent[3]}};
      }
      if (opts->has_size != 0) o.size = {{opts->size[0], opts->size[1]}};
      if (opts->has_src_nodata != 0) o.src_nodata = opts->src_nodata;
      if (opts->has_dst_nodata != 0) o.dst_nodata = opts->dst_nodata;
      o.src_nodata_none = opts->src_nodata_none != 0;
      o.dst_nodata_none = opts->dst_nodata_none != 0;
      o.memory_limit = opts->memory_limit;
      write.overwrite = opts->overwrite != 0;
    }
    vsr::warp_raster_file(input, output, o, write);
  });
}

}  // extern "C"

vsr_status vsr_zonal_options_init(vsr_zonal_options* opts) {
  return guarded(__func__, [&] {
    VSR_EXPECTS(opts != nullptr, "opts is NULL");
    *opts = vsr_zonal_options{};
    opts->struct_size = sizeof(vsr_zonal_options);
    opts->quantile = vsr::ZonalOptions{}.quantile;
  });
}

vsr_status vsr_zonal_stats(const char* raster, const char* zones, const vsr_zonal_options* opts,
                           const char* out_path, int overwrite, char** text_out, size_t* text_len) {
  return guarded(__func__, [&] {
    VSR_EXPECTS(raster != nullptr, "raster is NULL");
    VSR_EXPECTS(zones != nullptr, "zones is NULL");
    VSR_EXPECTS(out_path != nullptr || text_out != nullptr, "out_path and text_out are NULL");
    vsr::ZonalOptions o;
    vsr::ZoneFile zf{zones, "", ""};
    std::string weights;
    if (opts != nullptr) {
      check_struct_size("opts", "vsr_zonal_options", opts->struct_size, kZonalOptionsV1Size,
                        ": fill it with vsr_zonal_options_init");
      if (opts->pixels != nullptr) o.pixels = vsr::pixel_rule_from_string(opts->pixels);
      if (opts->stats != nullptr) o.stats = vsr::parse_zonal_stats(opts->stats);
      o.quantile = opts->quantile;
      VSR_EXPECTS(opts->bands != nullptr || opts->band_count == 0, "opts->bands is NULL");
      o.bands.assign(opts->bands, opts->bands + opts->band_count);
      if (opts->layer != nullptr) zf.layer = opts->layer;
      if (opts->zone_field != nullptr) zf.zone_field = opts->zone_field;
      if (opts->weights != nullptr) weights = opts->weights;
      o.memory_budget = opts->memory_budget;
    }
    if (out_path != nullptr) {
      // Refused before anything is computed, as the writer would refuse it after.
      vsr::check_output_path(out_path, overwrite != 0,
                             {{"the raster", raster}, {"the zones", zones}});
    }
    const vsr::ZonalTable table = vsr::zonal_stats_file(raster, zf, o, weights);
    if (out_path != nullptr) {
      vsr::write_zonal_table(table, out_path, overwrite != 0,
                             {{"the raster", raster}, {"the zones", zones}});
      return;
    }
    const std::string json = vsr::zonal_table_json(table);
    char* text = static_cast<char*>(std::malloc(json.size() + 1));
    if (text == nullptr) throw std::bad_alloc();
    std::memcpy(text, json.c_str(), json.size() + 1);
    *text_out = text;
    if (text_len != nullptr) *text_len = json.size();
  });
}

void vsr_free_text(char* text) {
  std::free(text);
}
