// SPDX-License-Identifier: Apache-2.0
// The tile executor's in-memory ends (tiles.hpp): a host raster as a source, a host raster as
// a sink, a visitor as a sink, and the one window copy they share.
#include "common/expects.hpp"

#include <vibespatial/raster/tiles.hpp>

#include <cstddef>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace vibespatial::raster {

namespace {

bool inside(const RasterWindow& w, std::int64_t height, std::int64_t width) {
  return w.width > 0 && w.height > 0 && w.col_off >= 0 && w.row_off >= 0 &&
         w.col_off <= width - w.width && w.row_off <= height - w.height;
}

std::string window_text(const RasterWindow& w) {
  return "(col_off " + std::to_string(w.col_off) + ", row_off " + std::to_string(w.row_off) +
         ", width " + std::to_string(w.width) + ", height " + std::to_string(w.height) + ")";
}

/// The host pixels of @p r: its own, or a copy in @p scratch when it is on the device.
const std::byte* host_pixels(const OwnedRasterArray& r, std::vector<std::byte>& scratch) {
  if (const void* p = r.host_data(); p != nullptr) return static_cast<const std::byte*>(p);
  scratch.resize(r.byte_size());
  r.copy_to_host(scratch.data());
  return scratch.data();
}

/// Copies the @p rows x @p row_bytes block at @p src (rows @p src_pitch bytes apart) to @p dst
/// (rows @p dst_pitch bytes apart).
void copy_rows(const std::byte* src, std::size_t src_pitch, std::byte* dst, std::size_t dst_pitch,
               std::int64_t rows, std::size_t row_bytes) {
  for (std::int64_t r = 0; r < rows; ++r) {
    std::memcpy(dst + static_cast<std::size_t>(r) * dst_pitch,
                src + static_cast<std::size_t>(r) * src_pitch, row_bytes);
  }
}

}  // namespace

OwnedRasterArray copy_window(const OwnedRasterArray& raster, const RasterWindow& window,
                             const std::vector<int>& bands) {
  VSR_EXPECTS(raster.host_data() != nullptr,
              "copy_window: the raster is on the device (a window of it needs it on the host)");
  VSR_EXPECTS(inside(window, raster.height(), raster.width()),
              "copy_window: window " + window_text(window) + " is not inside the " +
                  std::to_string(raster.width()) + " x " + std::to_string(raster.height()) +
                  " raster");
  std::vector<int> selected = bands;
  if (selected.empty()) {
    for (int b = 1; b <= raster.band_count(); ++b) selected.push_back(b);
  }
  for (const int b : selected) {
    VSR_EXPECTS(b >= 1 && b <= raster.band_count(), "copy_window: band " + std::to_string(b) +
                                                        " is not in [1, " +
                                                        std::to_string(raster.band_count()) + "]");
  }
  const std::size_t item = itemsize(raster.dtype());
  OwnedRasterArray out = OwnedRasterArray::allocate(
                             Residency::host, raster.dtype(), static_cast<int>(selected.size()),
                             window.height, window.width, std::nullopt,
                             raster.affine().shifted(window.col_off, window.row_off), raster.crs())
                             .with_nodata(raster.exact_nodata());
  const auto* src = static_cast<const std::byte*>(raster.host_data());
  auto* dst = static_cast<std::byte*>(out.mutable_host_data());
  const std::size_t band_bytes = static_cast<std::size_t>(raster.height() * raster.width()) * item;
  const std::size_t tile_band_bytes = static_cast<std::size_t>(window.height * window.width) * item;
  const std::size_t row_bytes = static_cast<std::size_t>(window.width) * item;
  for (std::size_t i = 0; i < selected.size(); ++i) {
    const std::byte* band =
        src + static_cast<std::size_t>(selected[i] - 1) * band_bytes +
        static_cast<std::size_t>(window.row_off * raster.width() + window.col_off) * item;
    copy_rows(band, static_cast<std::size_t>(raster.width()) * item, dst + i * tile_band_bytes,
              row_bytes, window.height, row_bytes);
  }
  return out;
}

// --- RasterTileSource ------------------------------------------------------------------------

RasterTileSource::RasterTileSource(OwnedRasterArray raster, std::vector<int> bands)
    : raster_(std::move(raster)) {
  VSR_EXPECTS(raster_.host_data() != nullptr,
              "RasterTileSource: the raster is on the device (tiles are read from a host raster; "
              "a full device to host copy would defeat the purpose of tiling)");
  if (bands.empty()) {
    for (int b = 1; b <= raster_.band_count(); ++b) bands.push_back(b);
  }
  for (const int b : bands) {
    VSR_EXPECTS(b >= 1 && b <= raster_.band_count(),
                "RasterTileSource: band " + std::to_string(b) + " is not in [1, " +
                    std::to_string(raster_.band_count()) + "]");
    bands_.push_back(b - 1);
  }
}

RasterMetadata RasterTileSource::metadata() const {
  RasterMetadata m = raster_.metadata();
  m.band_count = static_cast<int>(bands_.size());
  return m;
}

std::vector<std::optional<NodataValue>> RasterTileSource::band_nodata() const {
  return std::vector<std::optional<NodataValue>>(bands_.size(), raster_.exact_nodata());
}

OwnedRasterArray RasterTileSource::read(const RasterWindow& window, int first_band,
                                        int band_count) {
  VSR_EXPECTS(first_band >= 0 && band_count >= 1 &&
                  first_band <= static_cast<int>(bands_.size()) - band_count,
              "RasterTileSource: bands " + std::to_string(first_band) + "+" +
                  std::to_string(band_count) + " of " + std::to_string(bands_.size()));
  const auto b0 = static_cast<std::size_t>(first_band);
  bool run = true;  // consecutive bands of the raster: a whole window is a view
  for (int i = 1; i < band_count; ++i) {
    run = run && bands_[b0 + static_cast<std::size_t>(i)] == bands_[b0] + i;
  }
  if (run && window == RasterWindow{0, 0, raster_.width(), raster_.height()}) {
    return raster_.bands(bands_[b0], band_count);
  }
  std::vector<int> selected;
  for (int i = 0; i < band_count; ++i) {
    selected.push_back(bands_[b0 + static_cast<std::size_t>(i)] + 1);
  }
  return copy_window(raster_, window, selected);
}

// --- RasterTileSink --------------------------------------------------------------------------

void RasterTileSink::begin(const TileOutput& output) {
  out_ = OwnedRasterArray::allocate(Residency::host, output.dtype, output.band_count, output.height,
                                    output.width, std::nullopt, output.affine, output.crs);
  nodata_set_ = false;
  finished_ = false;
}

void RasterTileSink::begin_pass(int output_band, int /*band_count*/,
                                const std::optional<NodataValue>& nodata) {
  if (nodata_set_ && nodata != nodata_) {
    throw std::invalid_argument(
        "the results of bands " + std::to_string(output_band + 1) + ".. have nodata " +
        (nodata ? nodata->to_string() : std::string("none")) + ", earlier bands " +
        (nodata_ ? nodata_->to_string() : std::string("none")) +
        ", and an in-memory raster keeps one nodata for all bands");
  }
  nodata_ = nodata;
  nodata_set_ = true;
  *out_ = out_->with_nodata(nodata);
}

void RasterTileSink::write(const OwnedRasterArray& result, const TileInfo& where) {
  const std::size_t item = itemsize(out_->dtype());
  const std::byte* res = host_pixels(result, scratch_);
  auto* dst = static_cast<std::byte*>(out_->mutable_host_data());
  const std::int64_t height = out_->height(), width = out_->width();
  const RasterWindow& w = where.window;
  const RasterWindow& r = where.read;
  const std::size_t row_bytes = static_cast<std::size_t>(w.width) * item;
  for (int b = 0; b < result.band_count(); ++b) {
    const std::byte* src =
        res + static_cast<std::size_t>(b) * static_cast<std::size_t>(r.height * r.width) * item +
        static_cast<std::size_t>((w.row_off - r.row_off) * r.width + (w.col_off - r.col_off)) *
            item;
    std::byte* to = dst +
                    static_cast<std::size_t>(where.output_band + b) *
                        static_cast<std::size_t>(height * width) * item +
                    static_cast<std::size_t>(w.row_off * width + w.col_off) * item;
    copy_rows(src, static_cast<std::size_t>(r.width) * item, to,
              static_cast<std::size_t>(width) * item, w.height, row_bytes);
  }
}

void RasterTileSink::finish() {
  finished_ = true;
}

OwnedRasterArray RasterTileSink::result() const {
  if (!finished_ || !out_) throw std::logic_error("RasterTileSink: the run has not finished");
  return *out_;
}

// --- VisitTileSink ---------------------------------------------------------------------------

void VisitTileSink::write(const OwnedRasterArray& result, const TileInfo& where) {
  if (visit_) visit_(result, where);
}

}  // namespace vibespatial::raster
