// SPDX-License-Identifier: Apache-2.0
// Tiled executors (reference tiling.py): pointwise tiles and halo tiles, stitched on the host.
#include "common/expects.hpp"

#include <vibespatial/raster/dispatch.hpp>

#include <algorithm>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace vibespatial::raster {

namespace {

struct Window {
  std::int64_t row0, col0, rows, cols;
};

// Copies window `w` of every band of the host raster `src` (bands, H, W) into `dst`.
void read_window(const unsigned char* src, int bands, std::int64_t height, std::int64_t width,
                 std::size_t item, const Window& w, unsigned char* dst) {
  const std::size_t row_bytes = static_cast<std::size_t>(w.cols) * item;
  for (int b = 0; b < bands; ++b) {
    const unsigned char* band =
        src + static_cast<std::size_t>(b) * static_cast<std::size_t>(height * width) * item;
    for (std::int64_t r = 0; r < w.rows; ++r) {
      std::memcpy(dst, band + (static_cast<std::size_t>((w.row0 + r) * width + w.col0)) * item,
                  row_bytes);
      dst += row_bytes;
    }
  }
}

}  // namespace

std::vector<TileWindow> tile_windows(std::int64_t height, std::int64_t width,
                                     std::int64_t tile_height, std::int64_t tile_width, int halo) {
  VSR_EXPECTS(height > 0 && width > 0, "tile_windows: the raster is " + std::to_string(height) +
                                           " x " + std::to_string(width));
  VSR_EXPECTS(
      tile_height > 0 && tile_width > 0,
      "tile_windows: tiles of " + std::to_string(tile_height) + " x " + std::to_string(tile_width));
  VSR_EXPECTS(halo >= 0, "tile_windows: negative halo " + std::to_string(halo));
  std::vector<TileWindow> tiles;
  tiles.reserve(
      static_cast<std::size_t>(((height - 1) / tile_height + 1) * ((width - 1) / tile_width + 1)));
  for (std::int64_t r0 = 0; r0 < height; r0 += tile_height) {
    for (std::int64_t c0 = 0; c0 < width; c0 += tile_width) {
      TileWindow t;
      t.window = RasterWindow{c0, r0, std::min(tile_width, width - c0),
                              std::min(tile_height, height - r0)};
      const std::int64_t pr0 = std::max<std::int64_t>(0, r0 - halo);
      const std::int64_t pc0 = std::max<std::int64_t>(0, c0 - halo);
      const std::int64_t pr1 = std::min(height, r0 + t.window.height + halo);
      const std::int64_t pc1 = std::min(width, c0 + t.window.width + halo);
      t.read = RasterWindow{pc0, pr0, pc1 - pc0, pr1 - pr0};
      tiles.push_back(t);
    }
  }
  return tiles;
}

namespace {

// Runs `op` over the tiles of `plan` with `halo` pixels of context per side (0: pointwise).
OwnedRasterArray run_tiles(const char* who, const OwnedRasterArray& raster, const BandOp& op,
                           const RasterPlan& plan, int halo) {
  const std::string name(who);
  VSR_EXPECTS(op, name + ": op is empty");
  if (plan.strategy == TilingStrategy::whole) return op(raster);
  VSR_EXPECTS(plan.strategy == TilingStrategy::tiled,
              name + ": plan strategy " + std::string(to_string(plan.strategy)) +
                  " is not whole or tiled (band_batches: use dispatch_per_band_gpu)");
  VSR_EXPECTS(plan.tile_shape && plan.tile_shape->first > 0 && plan.tile_shape->second > 0,
              name + ": a tiled plan needs a positive tile_shape");
  VSR_EXPECTS(halo >= 0, name + ": plan.halo must be >= 0");
  const void* host = raster.host_data();
  VSR_EXPECTS(host != nullptr, name +
                                   ": tiled dispatch needs a host-resident raster (a full "
                                   "device to host transfer would defeat the OOM-avoidance "
                                   "goal)");

  const int bands = raster.band_count();
  const std::int64_t height = raster.height();
  const std::int64_t width = raster.width();
  const std::size_t item = itemsize(raster.dtype());
  const auto [tile_h, tile_w] = *plan.tile_shape;
  const Affine& t = raster.affine();

  std::optional<OwnedRasterArray> out;
  unsigned char* out_host = nullptr;
  std::size_t out_item = 0;
  int out_bands = 0;
  std::vector<unsigned char> tile_in;
  std::vector<unsigned char> tile_out;

  for (const TileWindow& tw : tile_windows(height, width, tile_h, tile_w, halo)) {
    const Window eff{tw.window.row_off, tw.window.col_off, tw.window.height, tw.window.width};
    const Window phys{tw.read.row_off, tw.read.col_off, tw.read.height, tw.read.width};

    tile_in.resize(static_cast<std::size_t>(bands) *
                   static_cast<std::size_t>(phys.rows * phys.cols) * item);
    read_window(static_cast<const unsigned char*>(host), bands, height, width, item, phys,
                tile_in.data());
    const OwnedRasterArray tile =
        OwnedRasterArray::from_host(tile_in.data(), raster.dtype(), bands, phys.rows, phys.cols,
                                    raster.nodata(), t.shifted(phys.col0, phys.row0), raster.crs());
    const OwnedRasterArray result = op(tile);

    if (result.height() != phys.rows || result.width() != phys.cols) {
      throw std::invalid_argument(name + ": op returned " + std::to_string(result.height()) +
                                  " x " + std::to_string(result.width()) + " for a tile of " +
                                  std::to_string(phys.rows) + " x " + std::to_string(phys.cols) +
                                  " at row " + std::to_string(phys.row0) + ", column " +
                                  std::to_string(phys.col0) + "; it must return its input's shape");
    }
    if (!out) {
      // Lazily, from the first result: ops may change the dtype (e.g. classify -> uint8).
      out_bands = result.band_count();
      out_item = itemsize(result.dtype());
      out = OwnedRasterArray::allocate(Residency::host, result.dtype(), out_bands, height, width,
                                       result.nodata(), raster.affine(), raster.crs());
      out_host = static_cast<unsigned char*>(out->mutable_host_data());
    } else if (result.dtype() != out->dtype() || result.band_count() != out_bands) {
      throw std::invalid_argument(name + ": the tile at row " + std::to_string(phys.row0) +
                                  ", column " + std::to_string(phys.col0) +
                                  " returned a different dtype or band count from the first "
                                  "tile");
    }
    const unsigned char* res = static_cast<const unsigned char*>(result.host_data());
    if (res == nullptr) {
      tile_out.resize(result.byte_size());
      result.copy_to_host(tile_out.data());
      res = tile_out.data();
    }
    const std::int64_t top = eff.row0 - phys.row0;
    const std::int64_t left = eff.col0 - phys.col0;
    const std::size_t row_bytes = static_cast<std::size_t>(eff.cols) * out_item;
    for (int b = 0; b < out_bands; ++b) {
      const unsigned char* src_band = res + static_cast<std::size_t>(b) *
                                                static_cast<std::size_t>(phys.rows * phys.cols) *
                                                out_item;
      unsigned char* dst_band = out_host + static_cast<std::size_t>(b) *
                                               static_cast<std::size_t>(height * width) * out_item;
      for (std::int64_t r = 0; r < eff.rows; ++r) {
        std::memcpy(
            dst_band + static_cast<std::size_t>((eff.row0 + r) * width + eff.col0) * out_item,
            src_band + static_cast<std::size_t>((top + r) * phys.cols + left) * out_item,
            row_bytes);
      }
    }
  }
  return std::move(*out);
}

}  // namespace

OwnedRasterArray dispatch_tiled(const OwnedRasterArray& raster, const BandOp& op,
                                const RasterPlan& plan) {
  return run_tiles("dispatch_tiled", raster, op, plan, 0);
}

OwnedRasterArray dispatch_tiled_halo(const OwnedRasterArray& raster, const BandOp& op,
                                     const RasterPlan& plan) {
  return run_tiles("dispatch_tiled_halo", raster, op, plan, plan.halo);
}

}  // namespace vibespatial::raster
