// SPDX-License-Identifier: Apache-2.0
// The warp's plan and runs: output tiles split (longer side in halves, as gdalwarp splits its
// chunks) until each tile's source window, coordinates and result fit the memory limit; the
// kernel's scale computed once from the whole output; then per tile: read its source window,
// transform its pixel centres on the CPU, resample (warp_kernel.hpp), write.
#include "common/text_escape.hpp"
#include "warp/warp_kernel.hpp"
#include "warp/warp_transform.hpp"

#include <vibespatial/raster/tiles.hpp>

#include <algorithm>
#include <cstring>
#include <functional>

namespace vibespatial::raster {

namespace {

constexpr std::uint64_t default_memory_limit = 64ULL << 20;

detail::WarpSourceGrid source_grid(const RasterMetadata& source, const WarpOptions& options) {
  return {source.width, source.height, source.affine, detail::source_crs(source.crs, options)};
}

// Host bytes of one tile: the source window (its pixels, their doubles, the masks) and the
// output tile (two coordinates a pixel, the result).
std::uint64_t tile_bytes(const RasterWindow& out, const RasterWindow& src, int bands,
                         std::size_t item) {
  const auto s = static_cast<std::uint64_t>(src.width) * static_cast<std::uint64_t>(src.height);
  const auto o = static_cast<std::uint64_t>(out.width) * static_cast<std::uint64_t>(out.height);
  const auto b = static_cast<std::uint64_t>(bands);
  // corners: (w + 1) x (h + 1) coordinates; counted as 2 per pixel plus a row and a column
  const auto c = static_cast<std::uint64_t>(out.width + out.height + 1);
  return s * (b * (item + 9) + 1) + o * (16 + b * item) + 16 * c;
}

struct Planner {
  const detail::WarpTransform& transform;
  int radius, bands;
  std::size_t item;
  std::uint64_t limit;
  std::vector<WarpTile>& tiles;
  std::uint64_t max_bytes = 0;

  void split(const RasterWindow& out) {
    const detail::SourceWindow sw = transform.source_window(out, radius);
    const RasterWindow src = sw.failed ? RasterWindow{} : sw.window;
    const std::uint64_t bytes = tile_bytes(out, src, bands, item);
    if (bytes <= limit) {
      tiles.push_back({out, src});
      max_bytes = std::max(max_bytes, bytes);
      return;
    }
    if (out.width <= 1 && out.height <= 1) {
      throw WarpError(WarpErrorKind::bad_grid, "warp: one output pixel needs a source window of " +
                                                   std::to_string(src.width) + " x " +
                                                   std::to_string(src.height) +
                                                   " pixels, more than the memory limit of " +
                                                   std::to_string(limit) + " bytes");
    }
    RasterWindow a = out, b = out;
    if (out.width >= out.height) {
      a.width = out.width / 2;
      b.col_off = out.col_off + a.width;
      b.width = out.width - a.width;
    } else {
      a.height = out.height / 2;
      b.row_off = out.row_off + a.height;
      b.height = out.height - a.height;
    }
    split(a);
    split(b);
  }
};

struct Resolved {
  detail::WarpValidity validity;
  std::optional<NodataValue> dst_nodata;
};

// gdalwarp's nodata defaults: -srcnodata replaces every band's (one validity for all bands when
// there are several), None ignores them; the output's nodata is -dstnodata, else the source's.
Resolved resolve_nodata(const std::vector<std::optional<NodataValue>>& band_nodata, DType dtype,
                        const WarpOptions& options) {
  Resolved r;
  r.validity.band_nodata = band_nodata;
  if (options.src_nodata_none) {
    std::fill(r.validity.band_nodata.begin(), r.validity.band_nodata.end(), std::nullopt);
  } else if (options.src_nodata) {
    std::fill(r.validity.band_nodata.begin(), r.validity.band_nodata.end(), options.src_nodata);
    r.validity.unified_only = band_nodata.size() > 1;
  }
  if (options.dst_nodata_none) {
    r.dst_nodata = std::nullopt;
  } else if (options.dst_nodata) {
    r.dst_nodata = options.dst_nodata;
  } else if (!r.validity.band_nodata.empty()) {
    r.dst_nodata = r.validity.band_nodata.front();
  }
  if (r.dst_nodata && !dtype_holds(dtype, *r.dst_nodata)) {
    throw std::invalid_argument("warp: the output's nodata " + r.dst_nodata->to_string() +
                                " is not a value of " + std::string(to_string(dtype)));
  }
  return r;
}

using ReadWindow = std::function<OwnedRasterArray(const RasterWindow&)>;
using WriteTile = std::function<void(const WarpTile&, const OwnedRasterArray&)>;

// One output tile: its pixels' source coordinates (centres, or corners for the footprint
// methods), then the kernel over its source window (none: every pixel the output's nodata).
OwnedRasterArray resample_tile(const detail::WarpTransform& transform, const RasterWindow& output,
                               const OwnedRasterArray* src, const RasterWindow& window, DType dtype,
                               int bands, const Resolved& nodata, const WarpOptions& options,
                               double x_scale, double y_scale) {
  std::vector<double> xs, ys;
  detail::WarpSourceWindow sw;
  sw.dtype = dtype;
  sw.bands = bands;
  if (src != nullptr) {
    sw.pixels = src->host_data();
    sw.window = window;
  }
  if (detail::warp_uses_corners(options.method)) {
    transform.corner_coords(output, xs, ys);
  } else {
    transform.source_coords(output, xs, ys);
  }
  detail::WarpKernelArgs args;
  args.method = options.method;
  args.x_scale = x_scale;
  args.y_scale = y_scale;
  args.src_x = xs.data();
  args.src_y = ys.data();
  args.height = output.height;
  args.width = output.width;
  args.dst_nodata = nodata.dst_nodata;
  OwnedRasterArray out = OwnedRasterArray::allocate(Residency::host, dtype, bands, output.height,
                                                    output.width, std::nullopt);
  detail::warp_tile(sw, nodata.validity, args, out.mutable_host_data());
  return nodata.dst_nodata ? out.with_nodata(nodata.dst_nodata) : out;
}

void run_warp(const WarpPlan& plan, const detail::WarpSourceGrid& grid, DType dtype, int bands,
              const Resolved& nodata, const WarpOptions& options, const ReadWindow& read,
              const WriteTile& write) {
  const detail::WarpTransform transform(grid, plan.grid, options.error_threshold);
  const auto total = static_cast<std::int64_t>(plan.tiles.size());
  for (std::int64_t i = 0; i < total; ++i) {
    const WarpTile& tile = plan.tiles[static_cast<std::size_t>(i)];
    std::optional<OwnedRasterArray> src;
    if (tile.source.width > 0 && tile.source.height > 0) src = read(tile.source);
    write(tile, resample_tile(transform, tile.output, src ? &*src : nullptr, tile.source, dtype,
                              bands, nodata, options, plan.x_scale, plan.y_scale));
    if (options.progress) options.progress(i + 1, total);
  }
}

}  // namespace

WarpPlan plan_warp(const RasterMetadata& source, const WarpGrid& grid, const WarpOptions& options) {
  if (grid.width <= 0 || grid.height <= 0) {
    throw WarpError(WarpErrorKind::bad_grid, "warp: the output grid has no pixels");
  }
  const detail::WarpSourceGrid src = source_grid(source, options);
  const detail::WarpTransform transform(src, grid, 0);
  const int radius = detail::warp_kernel_radius(options.method);
  const RasterWindow whole{0, 0, grid.width, grid.height};
  const detail::SourceWindow sw = transform.source_window(whole, radius);
  if (sw.failed) {
    throw WarpError(WarpErrorKind::no_overlap,
                    "warp: the output grid does not intersect the source");
  }
  WarpPlan plan;
  plan.grid = grid;
  const auto scale = detail::warp_scale(whole, sw);
  plan.x_scale = scale[0];
  plan.y_scale = scale[1];
  Planner p{transform,
            radius,
            source.band_count,
            itemsize(source.dtype),
            options.memory_limit != 0 ? options.memory_limit : default_memory_limit,
            plan.tiles};
  p.split(whole);
  std::sort(plan.tiles.begin(), plan.tiles.end(), [](const WarpTile& a, const WarpTile& b) {
    return a.output.row_off != b.output.row_off ? a.output.row_off < b.output.row_off
                                                : a.output.col_off < b.output.col_off;
  });
  plan.max_tile_bytes = p.max_bytes;
  return plan;
}

OwnedRasterArray warp(const OwnedRasterArray& source, const WarpGrid& grid,
                      const WarpOptions& options) {
  const OwnedRasterArray host =
      source.residency() == Residency::host ? source : source.clone_to(Residency::host);
  const RasterMetadata meta = host.metadata();
  const WarpPlan plan = plan_warp(meta, grid, options);
  std::vector<std::optional<NodataValue>> band_nodata(static_cast<std::size_t>(meta.band_count),
                                                      host.exact_nodata());
  const Resolved nodata = resolve_nodata(band_nodata, meta.dtype, options);
  OwnedRasterArray out =
      OwnedRasterArray::allocate(Residency::host, meta.dtype, meta.band_count, grid.height,
                                 grid.width, std::nullopt, grid.affine, grid.crs);
  if (nodata.dst_nodata) out = out.with_nodata(nodata.dst_nodata);
  auto* base = static_cast<std::byte*>(out.mutable_host_data());
  const std::size_t item = itemsize(meta.dtype);
  const auto plane = static_cast<std::size_t>(grid.width * grid.height);
  run_warp(
      plan, source_grid(meta, options), meta.dtype, meta.band_count, nodata, options,
      [&](const RasterWindow& w) { return copy_window(host, w); },
      [&](const WarpTile& tile, const OwnedRasterArray& result) {
        const auto* r = static_cast<const std::byte*>(result.host_data());
        const auto tw = static_cast<std::size_t>(tile.output.width);
        const auto th = static_cast<std::size_t>(tile.output.height);
        for (std::size_t b = 0; b < static_cast<std::size_t>(meta.band_count); ++b) {
          for (std::size_t row = 0; row < th; ++row) {
            const std::size_t dst = b * plane +
                                    (static_cast<std::size_t>(tile.output.row_off) + row) *
                                        static_cast<std::size_t>(grid.width) +
                                    static_cast<std::size_t>(tile.output.col_off);
            std::memcpy(base + dst * item, r + (b * th * tw + row * tw) * item, tw * item);
          }
        }
      });
  return out;
}

void warp_raster_file(const std::string& input, const std::string& output,
                      const WarpOptions& options, const WriteOptions& write,
                      const OpenOptions& open) {
  RasterFileSource source(input, open);
  const RasterMetadata meta = source.metadata();
  if (!source.has_geotransform()) {
    throw WarpError(WarpErrorKind::no_crs, "warp: '" + detail::printable(input) +
                                               "' has no geotransform; it cannot be warped");
  }
  const WarpGrid grid = plan_warp_grid(meta, options);
  const WarpPlan plan = plan_warp(meta, grid, options);
  const Resolved nodata = resolve_nodata(source.band_nodata(), meta.dtype, options);
  RasterFileSink sink(output, write);
  sink.copy_from(source, MetadataCopy::descriptive);
  sink.begin({meta.dtype, meta.band_count, grid.height, grid.width, grid.affine, grid.crs});
  sink.begin_pass(0, meta.band_count, nodata.dst_nodata);
  std::int64_t index = 0;
  const auto total = static_cast<std::int64_t>(plan.tiles.size());
  run_warp(
      plan, source_grid(meta, options), meta.dtype, meta.band_count, nodata, options,
      [&](const RasterWindow& w) { return source.read(w, 0, meta.band_count); },
      [&](const WarpTile& tile, const OwnedRasterArray& result) {
        TileInfo where;
        where.index = index++;
        where.total = total;
        where.window = where.read = tile.output;
        where.band_count = meta.band_count;
        sink.write(result, where);
      });
  source.close();
  sink.finish();
}

}  // namespace vibespatial::raster

namespace vibespatial::raster {

struct WarpedSource::State {
  TileSource& source;
  WarpGrid grid;
  WarpOptions options;
  RasterMetadata meta;
  std::vector<std::optional<NodataValue>> src_nodata;
  Resolved nodata;
  std::unique_ptr<detail::WarpTransform> transform;
  double x_scale = 1, y_scale = 1;
  int radius = 0;
};

WarpedSource::WarpedSource(TileSource& source, const WarpGrid& grid, const WarpOptions& options) {
  const RasterMetadata meta = source.metadata();
  const detail::WarpSourceGrid src = source_grid(meta, options);
  auto transform = std::make_unique<detail::WarpTransform>(src, grid, options.error_threshold);
  const int radius = detail::warp_kernel_radius(options.method);
  const RasterWindow whole{0, 0, grid.width, grid.height};
  const detail::SourceWindow sw = transform->source_window(whole, radius);
  if (sw.failed) {
    throw WarpError(WarpErrorKind::no_overlap,
                    "warp: the output grid does not intersect the source");
  }
  const auto scale = detail::warp_scale(whole, sw);
  const auto band_nodata = source.band_nodata();
  state_.reset(new State{source, grid, options, meta, band_nodata,
                         resolve_nodata(band_nodata, meta.dtype, options), std::move(transform),
                         scale[0], scale[1], radius});
}

WarpedSource::~WarpedSource() = default;

RasterMetadata WarpedSource::metadata() const {
  RasterMetadata m = state_->meta;
  m.height = state_->grid.height;
  m.width = state_->grid.width;
  m.affine = state_->grid.affine;
  m.crs = state_->grid.crs;
  m.exact_nodata = state_->nodata.dst_nodata;
  m.nodata = m.exact_nodata ? std::optional<double>(m.exact_nodata->to_double()) : std::nullopt;
  return m;
}

std::vector<std::optional<NodataValue>> WarpedSource::band_nodata() const {
  return std::vector<std::optional<NodataValue>>(static_cast<std::size_t>(state_->meta.band_count),
                                                 state_->nodata.dst_nodata);
}

OwnedRasterArray WarpedSource::read(const RasterWindow& window, int first_band, int band_count) {
  State& s = *state_;
  const detail::SourceWindow sw = s.transform->source_window(window, s.radius);
  Resolved nodata = s.nodata;
  nodata.validity.band_nodata.assign(
      s.nodata.validity.band_nodata.begin() + first_band,
      s.nodata.validity.band_nodata.begin() + first_band + band_count);
  std::optional<OwnedRasterArray> src;
  if (!sw.failed) src = s.source.read(sw.window, first_band, band_count);
  OwnedRasterArray out =
      resample_tile(*s.transform, window, src ? &*src : nullptr, sw.window, s.meta.dtype,
                    band_count, nodata, s.options, s.x_scale, s.y_scale);
  const Affine& g = s.grid.affine;
  const auto col = static_cast<double>(window.col_off), row = static_cast<double>(window.row_off);
  const Affine at{g.a, g.b, g.c + g.a * col + g.b * row, g.d, g.e, g.f + g.d * col + g.e * row};
  return out.with_georeferencing(at, s.grid.crs);
}

}  // namespace vibespatial::raster
