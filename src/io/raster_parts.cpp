// SPDX-License-Identifier: Apache-2.0
// merge_raster_parts (io.hpp): a raster written in parts, as one file. The parts are one tile
// source (a grid of part files; each read is assembled from the parts it overlaps) and the
// output is RasterFileSink, so the file is written all or nothing by the one tile executor. Only
// io's public calls are used here: the file builds with and without GDAL.
#include "common/byte_text.hpp"
#include "common/checked_math.hpp"
#include "common/expects.hpp"
#include "common/text_escape.hpp"

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/io.hpp>
#include <vibespatial/raster/tiles.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace vibespatial::raster {

namespace {

constexpr const char* kWho = "merge_raster_parts";

/// Whether two nodata values mark the same pixels of @p dtype: NaN equals NaN, integers compare
/// exactly whatever their kind (from_int64(5) is 5.0), float32 values as float32.
bool same_marker(DType dtype, const std::optional<NodataValue>& a,
                 const std::optional<NodataValue>& b) {
  if (!a || !b) return !a && !b;
  if (a->is_nan() || b->is_nan()) return a->is_nan() && b->is_nan();
  const auto ai = a->as_int64(), bi = b->as_int64();
  if (ai || bi) return ai == bi;
  const auto au = a->as_uint64(), bu = b->as_uint64();
  if (au || bu) return au == bu;
  if (dtype == DType::float32) {
    return static_cast<float>(a->to_double()) == static_cast<float>(b->to_double());
  }
  return a->to_double() == b->to_double();
}

std::string nodata_text(const std::optional<NodataValue>& v) {
  return v ? v->to_string() : std::string("none");
}

/// The sorted distinct values of @p starts.
std::vector<std::int64_t> edges(std::vector<std::int64_t> starts) {
  std::sort(starts.begin(), starts.end());
  starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
  return starts;
}

/// The index of the cell of @p cuts (sorted starts, the first 0) holding @p at.
std::size_t cell_of(const std::vector<std::int64_t>& cuts, std::int64_t at) {
  return static_cast<std::size_t>(std::upper_bound(cuts.begin(), cuts.end(), at) - cuts.begin()) -
         1;
}

/// The parts of one raster as a tile source.
class PartsSource final : public TileSource {
 public:
  PartsSource(const std::vector<RasterPart>& parts, const RasterMetadata& layout)
      : parts_(parts), layout_(layout) {
    nodata_ = layout.exact_nodata ? layout.exact_nodata
              : layout.nodata     ? std::optional<NodataValue>(*layout.nodata)
                                  : std::nullopt;
    layout_.exact_nodata = nodata_;
    layout_.nodata = nodata_ ? std::optional<double>(nodata_->to_double()) : std::nullopt;
    check_layout();
    read_headers();
    check_grid();
  }

  RasterMetadata metadata() const override { return layout_; }

  std::vector<std::optional<NodataValue>> band_nodata() const override {
    return std::vector<std::optional<NodataValue>>(static_cast<std::size_t>(layout_.band_count),
                                                   nodata_);
  }

  OwnedRasterArray read(const RasterWindow& window, int first_band, int band_count) override {
    OwnedRasterArray tile =
        OwnedRasterArray::allocate(
            Residency::host, layout_.dtype, band_count, window.height, window.width, {},
            layout_.affine.shifted(window.col_off, window.row_off), layout_.crs)
            .with_nodata(nodata_);
    auto* out = static_cast<std::byte*>(tile.mutable_host_data());
    const std::size_t item = itemsize(layout_.dtype);
    const std::int64_t row_end = window.row_off + window.height;
    const std::int64_t col_end = window.col_off + window.width;
    for (std::size_t bc = cell_of(band_cuts_, first_band);
         bc < band_cuts_.size() && band_cuts_[bc] < first_band + band_count; ++bc) {
      for (std::size_t rc = cell_of(row_cuts_, window.row_off);
           rc < row_cuts_.size() && row_cuts_[rc] < row_end; ++rc) {
        for (std::size_t cc = cell_of(col_cuts_, window.col_off);
             cc < col_cuts_.size() && col_cuts_[cc] < col_end; ++cc) {
          const Placed& p = placed_[cell_index(bc, rc, cc)];
          const RasterPart& part = parts_[p.part];
          // The overlap of the part and the read, in the part's pixels and bands.
          const int b0 = std::max(first_band, part.first_band);
          const int b1 = std::min(first_band + band_count, part.first_band + p.bands);
          const std::int64_t r0 = std::max(window.row_off, part.window.row_off);
          const std::int64_t r1 = std::min(row_end, part.window.row_off + part.window.height);
          const std::int64_t c0 = std::max(window.col_off, part.window.col_off);
          const std::int64_t c1 = std::min(col_end, part.window.col_off + part.window.width);
          std::vector<int> bands;
          for (int b = b0; b < b1; ++b) bands.push_back(b - part.first_band + 1);
          const OwnedRasterArray piece = read_raster(
              part.path,
              RasterWindow{c0 - part.window.col_off, r0 - part.window.row_off, c1 - c0, r1 - r0},
              std::move(bands));
          const auto* in = static_cast<const std::byte*>(piece.host_data());
          const std::size_t row_bytes = static_cast<std::size_t>(c1 - c0) * item;
          for (int b = b0; b < b1; ++b) {
            for (std::int64_t r = r0; r < r1; ++r) {
              const std::size_t from =
                  (static_cast<std::size_t>(b - b0) * static_cast<std::size_t>(r1 - r0) +
                   static_cast<std::size_t>(r - r0)) *
                  row_bytes;
              const std::size_t to = ((static_cast<std::size_t>(b - first_band) *
                                           static_cast<std::size_t>(window.height) +
                                       static_cast<std::size_t>(r - window.row_off)) *
                                          static_cast<std::size_t>(window.width) +
                                      static_cast<std::size_t>(c0 - window.col_off)) *
                                     item;
              std::memcpy(out + to, in + from, row_bytes);
            }
          }
        }
      }
    }
    return tile;
  }

  /// The tile shape of the run: the largest part's rows and columns.
  std::pair<std::int64_t, std::int64_t> tile_shape() const {
    std::int64_t rows = 1, cols = 1;
    for (const RasterPart& part : parts_) {
      rows = std::max(rows, part.window.height);
      cols = std::max(cols, part.window.width);
    }
    return {rows, cols};
  }

 private:
  struct Placed {
    std::size_t part = 0;
    int bands = 0;  ///< the part file's band count
  };

  std::string named(std::size_t i) const {
    return "part " + std::to_string(i) + " ('" + detail::printable(parts_[i].path) + "')";
  }

  void check_layout() const {
    VSR_EXPECTS(!parts_.empty(), std::string(kWho) + ": no parts");
    VSR_EXPECTS(layout_.height > 0 && layout_.width > 0 && layout_.band_count > 0,
                std::string(kWho) + ": the layout has no pixels (" +
                    std::to_string(layout_.band_count) + " band(s) of " +
                    std::to_string(layout_.height) + " x " + std::to_string(layout_.width) + ")");
    VSR_EXPECTS(!(nodata_ && nodata_->is_nan() && !is_floating_point(layout_.dtype)),
                std::string(kWho) + ": NaN nodata is not valid for integer dtype " +
                    std::string(to_string(layout_.dtype)));
    for (std::size_t i = 0; i < parts_.size(); ++i) {
      const RasterWindow& w = parts_[i].window;
      VSR_EXPECTS(
          w.height > 0 && w.width > 0 && w.row_off >= 0 && w.col_off >= 0 &&
              w.row_off <= layout_.height - w.height && w.col_off <= layout_.width - w.width &&
              parts_[i].first_band >= 0 && parts_[i].first_band < layout_.band_count,
          std::string(kWho) + ": " + named(i) + " is placed at rows " + std::to_string(w.row_off) +
              "+" + std::to_string(w.height) + ", columns " + std::to_string(w.col_off) + "+" +
              std::to_string(w.width) + ", band " + std::to_string(parts_[i].first_band) +
              ", outside the " + std::to_string(layout_.band_count) + " x " +
              std::to_string(layout_.height) + " x " + std::to_string(layout_.width) + " raster");
    }
  }

  void read_headers() {
    part_bands_.reserve(parts_.size());
    for (std::size_t i = 0; i < parts_.size(); ++i) {
      const RasterPart& part = parts_[i];
      const RasterFileInfo info = read_raster_info(part.path);
      const RasterMetadata& m = info.metadata;
      const std::string who = std::string(kWho) + ": " + named(i);
      VSR_EXPECTS(m.dtype == layout_.dtype, who + " is " + std::string(to_string(m.dtype)) +
                                                ", the raster " +
                                                std::string(to_string(layout_.dtype)));
      VSR_EXPECTS(m.height == part.window.height && m.width == part.window.width,
                  who + " is " + std::to_string(m.height) + " x " + std::to_string(m.width) +
                      ", its window " + std::to_string(part.window.height) + " x " +
                      std::to_string(part.window.width));
      VSR_EXPECTS(m.band_count <= layout_.band_count - part.first_band,
                  who + " has " + std::to_string(m.band_count) + " band(s) from band " +
                      std::to_string(part.first_band) + ", beyond the raster's " +
                      std::to_string(layout_.band_count));
      for (std::size_t b = 0; b < info.band_nodata.size(); ++b) {
        VSR_EXPECTS(same_marker(layout_.dtype, info.band_nodata[b], nodata_),
                    who + " band " + std::to_string(b + 1) + " has nodata " +
                        nodata_text(info.band_nodata[b]) + ", the raster " + nodata_text(nodata_));
      }
      part_bands_.push_back(m.band_count);
    }
  }

  std::size_t cell_index(std::size_t b, std::size_t r, std::size_t c) const {
    return (b * row_cuts_.size() + r) * col_cuts_.size() + c;
  }

  /// Each part must be one cell of the grid its starts cut, and each cell one part.
  void check_grid() {
    std::vector<std::int64_t> bands, rows, cols;
    for (const RasterPart& part : parts_) {
      bands.push_back(part.first_band);
      rows.push_back(part.window.row_off);
      cols.push_back(part.window.col_off);
    }
    band_cuts_ = edges(std::move(bands));
    row_cuts_ = edges(std::move(rows));
    col_cuts_ = edges(std::move(cols));
    const std::string grid =
        " (the parts must form a grid of the raster: the parts' first bands, "
        "rows and columns cut it into cells, and each cell is one part)";
    VSR_EXPECTS(band_cuts_.front() == 0 && row_cuts_.front() == 0 && col_cuts_.front() == 0,
                std::string(kWho) + ": no part starts at band 0, row 0 or column 0" + grid);
    const auto end_of = [](const std::vector<std::int64_t>& cuts, std::size_t k,
                           std::int64_t total) {
      return k + 1 < cuts.size() ? cuts[k + 1] : total;
    };
    const std::uint64_t cells = detail::checked_mul(
        detail::checked_mul(band_cuts_.size(), row_cuts_.size(), "merge_raster_parts cells"),
        col_cuts_.size(), "merge_raster_parts cells");
    VSR_EXPECTS(cells == parts_.size(),
                std::string(kWho) + ": " + std::to_string(parts_.size()) + " parts for a grid of " +
                    std::to_string(band_cuts_.size()) + " x " + std::to_string(row_cuts_.size()) +
                    " x " + std::to_string(col_cuts_.size()) +
                    " cells (bands x rows x columns): some overlap or leave pixels out" + grid);
    const std::size_t none = parts_.size();
    std::vector<std::size_t> owner(parts_.size(), none);
    placed_.assign(parts_.size(), Placed{});
    for (std::size_t i = 0; i < parts_.size(); ++i) {
      const RasterPart& part = parts_[i];
      const std::size_t bc = cell_of(band_cuts_, part.first_band);
      const std::size_t rc = cell_of(row_cuts_, part.window.row_off);
      const std::size_t cc = cell_of(col_cuts_, part.window.col_off);
      const std::string who = std::string(kWho) + ": " + named(i);
      VSR_EXPECTS(part.first_band + part_bands_[i] == end_of(band_cuts_, bc, layout_.band_count),
                  who + " holds bands " + std::to_string(part.first_band) + " to " +
                      std::to_string(part.first_band + part_bands_[i] - 1) +
                      ", but its cell ends before band " +
                      std::to_string(end_of(band_cuts_, bc, layout_.band_count)) + grid);
      VSR_EXPECTS(part.window.row_off + part.window.height == end_of(row_cuts_, rc, layout_.height),
                  who + " holds rows " + std::to_string(part.window.row_off) + " to " +
                      std::to_string(part.window.row_off + part.window.height - 1) +
                      ", but its cell ends before row " +
                      std::to_string(end_of(row_cuts_, rc, layout_.height)) + grid);
      VSR_EXPECTS(part.window.col_off + part.window.width == end_of(col_cuts_, cc, layout_.width),
                  who + " holds columns " + std::to_string(part.window.col_off) + " to " +
                      std::to_string(part.window.col_off + part.window.width - 1) +
                      ", but its cell ends before column " +
                      std::to_string(end_of(col_cuts_, cc, layout_.width)) + grid);
      std::size_t& o = owner[cell_index(bc, rc, cc)];
      VSR_EXPECTS(o == none, std::string(kWho) + ": " + named(o) + " and " + named(i) +
                                 " are both placed at band " + std::to_string(part.first_band) +
                                 ", row " + std::to_string(part.window.row_off) + ", column " +
                                 std::to_string(part.window.col_off));
      o = i;
      placed_[cell_index(bc, rc, cc)] = Placed{i, part_bands_[i]};
    }
  }

  const std::vector<RasterPart>& parts_;
  RasterMetadata layout_;
  std::optional<NodataValue> nodata_;
  std::vector<int> part_bands_;  ///< each part's band count, in the order of parts_
  std::vector<std::int64_t> band_cuts_, row_cuts_, col_cuts_;
  std::vector<Placed> placed_;  ///< by cell (cell_index)
};

}  // namespace

void merge_raster_parts(const std::vector<RasterPart>& parts, const RasterMetadata& layout,
                        const std::string& out, const WriteOptions& options) {
  if (!io_available()) {
    throw std::runtime_error(std::string(kWho) +
                             ": vibespatial-raster was built without GDAL (install libgdal-dev "
                             "and reconfigure with -Dgdal=enabled)");
  }
  // What the driver or the output's path refuses, refused before any part is opened.
  RasterFileSink sink(out, options);
  PartsSource source(parts, layout);
  RasterPlan plan;
  plan.strategy = TilingStrategy::tiled;
  plan.tile_shape = source.tile_shape();
  plan.bands_per_pass = layout.band_count;
  plan.fits_budget = true;
  const std::int64_t rows = std::min(plan.tile_shape->first, layout.height);
  const std::int64_t cols = std::min(plan.tile_shape->second, layout.width);
  // A tile of every band and the largest piece read into it.
  const std::uint64_t needed = detail::checked_mul(
      detail::checked_mul(
          detail::checked_mul(static_cast<std::uint64_t>(rows), static_cast<std::uint64_t>(cols),
                              "merge_raster_parts tile bytes"),
          static_cast<std::uint64_t>(layout.band_count), "merge_raster_parts tile bytes"),
      2 * itemsize(layout.dtype), "merge_raster_parts tile bytes");
  const std::uint64_t limit = available_host_memory();
  if (needed > limit) {
    throw HostMemoryLimitError(
        needed, limit,
        std::string(kWho) + ": a tile of " + std::to_string(layout.band_count) + " band(s) of " +
            std::to_string(rows) + " x " + std::to_string(cols) + " " +
            std::string(to_string(layout.dtype)) + " (the largest part's rows and columns) needs " +
            detail::byte_text(needed) + " of host memory, more than the " +
            detail::byte_text(limit) + " available; write smaller parts");
  }
  TileRunOptions run;
  run.name = kWho;
  run_tiles(
      source, [](const OwnedRasterArray& tile) { return tile; }, sink, plan, run);
}

}  // namespace vibespatial::raster
