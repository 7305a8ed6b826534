// SPDX-License-Identifier: Apache-2.0
// The VRAM planner: max_bands_for_budget, analyze_raster_plan, plan_from_metadata.
//
// analyze_raster_plan with per_band == false is the reference's algorithm
// (vibespatial/raster/dispatch.py, analyze_raster_plan) step for step; the constants and the
// order of the tests below are part of its observable results.
#include "common/checked_math.hpp"

#include <vibespatial/raster/dispatch.hpp>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace vibespatial::raster {

using detail::checked_add;
using detail::checked_mul;

namespace {

constexpr double budget_safety_factor = 0.7;  // the reference's _BUDGET_SAFETY_FACTOR
constexpr std::int64_t default_tile_dim = 4096;
constexpr std::int64_t tile_alignment = 256;
constexpr std::int64_t min_tile_dim = tile_alignment;

[[noreturn]] void throw_invalid(const char* name, long long value, const char* requirement) {
  throw std::invalid_argument(std::string(name) + " must be " + requirement + ", got " +
                              std::to_string(value));
}

void validate_dims(std::int64_t height, std::int64_t width, DType dtype, int buffers_per_band) {
  if (height <= 0) throw_invalid("height", height, "> 0");
  if (width <= 0) throw_invalid("width", width, "> 0");
  if (static_cast<unsigned>(dtype) > static_cast<unsigned>(DType::float64)) {
    throw_invalid("dtype", static_cast<long long>(dtype), "a DType enumerator");
  }
  if (buffers_per_band < 1) throw_invalid("buffers_per_band", buffers_per_band, ">= 1");
}

// Bytes of one band across its buffers: height * width * itemsize * buffers_per_band.
std::uint64_t band_bytes(std::int64_t height, std::int64_t width, DType dtype,
                         int buffers_per_band) {
  std::uint64_t bytes = checked_mul(static_cast<std::uint64_t>(height),
                                    static_cast<std::uint64_t>(width), "raster pixel count");
  bytes = checked_mul(bytes, itemsize(dtype), "raster byte count");
  return checked_mul(bytes, static_cast<std::uint64_t>(buffers_per_band), "raster byte count");
}

std::int64_t ceil_div(std::int64_t n, std::int64_t d) {
  return (n - 1) / d + 1;
}

struct TileChoice {
  std::int64_t tile_h;
  std::int64_t tile_w;
  std::uint64_t tile_bytes;
};

// The reference's tile search for a pass carrying `bands` bands.
TileChoice choose_tile(std::int64_t height, std::int64_t width, DType dtype, int bands,
                       int buffers_per_band, std::uint64_t scratch, int halo,
                       std::uint64_t usable) {
  const std::uint64_t per_pixel = checked_mul(
      checked_mul(itemsize(dtype), static_cast<std::uint64_t>(buffers_per_band), "tile byte count"),
      static_cast<std::uint64_t>(bands), "tile byte count");
  const auto bytes_of = [&](std::int64_t tile_h, std::int64_t tile_w) {
    const auto physical_h =
        static_cast<std::uint64_t>(tile_h) + 2 * static_cast<std::uint64_t>(halo);
    const auto physical_w =
        static_cast<std::uint64_t>(tile_w) + 2 * static_cast<std::uint64_t>(halo);
    const std::uint64_t pixels = checked_mul(physical_h, physical_w, "tile pixel count");
    return checked_add(checked_mul(pixels, per_pixel, "tile byte count"), scratch,
                       "tile byte count + scratch_bytes");
  };
  const auto align_down = [](std::int64_t dim) {
    return std::max(min_tile_dim, (dim / tile_alignment) * tile_alignment);
  };

  std::int64_t tile_h = align_down(std::min(default_tile_dim, height));
  std::int64_t tile_w = align_down(std::min(default_tile_dim, width));
  std::uint64_t tile_bytes = 0;
  while (true) {
    tile_bytes = bytes_of(tile_h, tile_w);
    if (tile_bytes <= usable) break;
    if (tile_h <= min_tile_dim && tile_w <= min_tile_dim) break;
    // The reference halves height on a tie (`if tile_h >= tile_w`).
    if (tile_h >= tile_w) {
      tile_h = align_down(tile_h / 2);
    } else {
      tile_w = align_down(tile_w / 2);
    }
  }
  return {tile_h, tile_w, tile_bytes};
}

RasterPlan tiled_plan(std::int64_t height, std::int64_t width, const TileChoice& tile, int halo,
                      int bands_per_pass, std::uint64_t usable) {
  RasterPlan plan;
  plan.strategy = TilingStrategy::tiled;
  plan.tile_shape = std::pair{tile.tile_h, tile.tile_w};
  plan.halo = halo;
  plan.n_tiles = static_cast<std::int64_t>(
      checked_mul(static_cast<std::uint64_t>(ceil_div(height, tile.tile_h)),
                  static_cast<std::uint64_t>(ceil_div(width, tile.tile_w)), "tile count"));
  plan.estimated_vram_per_tile = tile.tile_bytes;
  plan.bands_per_pass = bands_per_pass;
  plan.fits_budget = tile.tile_bytes <= usable;
  return plan;
}

}  // namespace

std::uint64_t usable_vram_budget(std::uint64_t vram_budget) noexcept {
  // Python's int(budget * 0.7): the product is a double, truncated toward zero.
  return static_cast<std::uint64_t>(static_cast<double>(vram_budget) * budget_safety_factor);
}

int max_bands_for_budget(std::int64_t height, std::int64_t width, DType dtype, int buffers_per_band,
                         std::uint64_t scratch_bytes, std::optional<std::uint64_t> vram_budget) {
  validate_dims(height, width, dtype, buffers_per_band);
  const std::uint64_t per_band = band_bytes(height, width, dtype, buffers_per_band);
  const std::uint64_t budget = vram_budget ? *vram_budget : available_vram_bytes();
  const std::uint64_t left = budget > scratch_bytes ? budget - scratch_bytes : 0;
  const std::uint64_t bands = std::max<std::uint64_t>(1, left / per_band);
  return static_cast<int>(std::min<std::uint64_t>(bands, INT_MAX));
}

RasterPlan analyze_raster_plan(std::int64_t height, std::int64_t width, DType dtype,
                               const PlanOptions& options) {
  validate_dims(height, width, dtype, options.buffers_per_band);
  if (options.band_count < 1) throw_invalid("band_count", options.band_count, ">= 1");
  if (options.halo < 0) throw_invalid("halo", options.halo, ">= 0");

  const std::uint64_t one_band = band_bytes(height, width, dtype, options.buffers_per_band);
  const std::uint64_t full =
      checked_mul(one_band, static_cast<std::uint64_t>(options.band_count), "raster byte count");
  const std::uint64_t scratch = options.scratch_bytes;

  RasterPlan whole;
  whole.strategy = TilingStrategy::whole;
  whole.halo = options.halo;
  whole.bands_per_pass = options.band_count;

  const std::uint64_t budget = options.vram_budget ? *options.vram_budget : available_vram_bytes();
  if (budget == 0) return whole;  // no GPU: tiling is a device-side concern

  const std::uint64_t usable = usable_vram_budget(budget);
  // Compared without forming full + scratch, which may exceed 64 bits while the plan still tiles.
  if (full <= usable && scratch <= usable - full) {
    whole.estimated_vram_per_tile = full + scratch;
    return whole;
  }

  if (!options.per_band) {
    const TileChoice tile = choose_tile(height, width, dtype, options.band_count,
                                        options.buffers_per_band, scratch, options.halo, usable);
    return tiled_plan(height, width, tile, options.halo, options.band_count, usable);
  }

  if (one_band <= usable && scratch <= usable - one_band) {
    const std::uint64_t fitting = (usable - scratch) / one_band;
    // Whole was rejected, so fewer than band_count bands fit.
    const auto bands = static_cast<int>(
        std::min<std::uint64_t>(fitting, static_cast<std::uint64_t>(options.band_count)));
    RasterPlan plan;
    plan.strategy = TilingStrategy::band_batches;
    plan.halo = options.halo;
    plan.bands_per_pass = bands;
    plan.estimated_vram_per_tile = one_band * static_cast<std::uint64_t>(bands) + scratch;
    return plan;
  }

  const TileChoice tile =
      choose_tile(height, width, dtype, 1, options.buffers_per_band, scratch, options.halo, usable);
  return tiled_plan(height, width, tile, options.halo, 1, usable);
}

RasterPlan plan_from_metadata(const RasterMetadata& metadata, PlanOptions options) {
  options.band_count = metadata.band_count;
  return analyze_raster_plan(metadata.height, metadata.width, metadata.dtype, options);
}

}  // namespace vibespatial::raster
