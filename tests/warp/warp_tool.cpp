// SPDX-License-Identifier: Apache-2.0
// The judge's driver of the library's warp (warp_raster_file), with gdalwarp's option names:
//   warp-tool IN OUT [--t_srs S] [--s_srs S] [--tr X Y] [--te A B C D] [--ts W H] [-r M]
//             [--et E] [--srcnodata V|None] [--dstnodata V|None] [--memory-limit BYTES]
//             [--print-plan] [--array]
// --executor N runs the tile executor (run_tiles) over a WarpedSource of the file in N x N output
// tiles into a RasterFileSink, as a pipeline's `read ! warp ! write` would.
// --array warps through warp() on the whole file read as an OwnedRasterArray (read_raster), then
// writes the result with write_raster.
// Exits 0 on success, 1 with the error's message on stderr (the WarpError kind first).
#include <vibespatial/raster/warp.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

using namespace vibespatial::raster;

namespace {

const char* kind_name(WarpErrorKind k) {
  switch (k) {
    case WarpErrorKind::bad_crs:
      return "bad_crs";
    case WarpErrorKind::no_crs:
      return "no_crs";
    case WarpErrorKind::no_overlap:
      return "no_overlap";
    case WarpErrorKind::bad_grid:
      return "bad_grid";
    case WarpErrorKind::transform:
      return "transform";
  }
  return "?";
}

NodataValue nodata_of(const std::string& s) {
  return s == "nan" || s == "NaN" ? NodataValue(std::nan("")) : NodataValue(std::stod(s));
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> a(argv + 1, argv + argc);
  if (a.size() < 2) {
    std::cerr << "usage: warp-tool IN OUT [options]\n";
    return 2;
  }
  WarpOptions o;
  bool print_plan = false, array = false;
  std::int64_t executor_tile = 0;
  try {
    for (std::size_t i = 2; i < a.size(); ++i) {
      const std::string& k = a[i];
      auto next = [&]() -> const std::string& {
        if (i + 1 >= a.size()) throw std::invalid_argument(k + " needs a value");
        return a[++i];
      };
      if (k == "--t_srs") {
        o.dst_crs = next();
      } else if (k == "--s_srs") {
        o.src_crs = next();
      } else if (k == "--tr") {
        const double x = std::stod(next());
        o.resolution = {{x, std::stod(next())}};
      } else if (k == "--te") {
        std::array<double, 4> e{};
        for (double& v : e) v = std::stod(next());
        o.extent = e;
      } else if (k == "--ts") {
        const auto w = std::stoll(next());
        o.size = {{w, std::stoll(next())}};
      } else if (k == "-r") {
        o.method = warp_method_from_string(next());
      } else if (k == "--et") {
        o.error_threshold = std::stod(next());
      } else if (k == "--srcnodata") {
        const std::string& v = next();
        if (v == "None") {
          o.src_nodata_none = true;
        } else {
          o.src_nodata = nodata_of(v);
        }
      } else if (k == "--dstnodata") {
        const std::string& v = next();
        if (v == "None") {
          o.dst_nodata_none = true;
        } else {
          o.dst_nodata = nodata_of(v);
        }
      } else if (k == "--memory-limit") {
        o.memory_limit = std::stoull(next());
      } else if (k == "--executor") {
        executor_tile = std::stoll(next());
      } else if (k == "--array") {
        array = true;
      } else if (k == "--print-plan") {
        print_plan = true;
      } else {
        throw std::invalid_argument("unknown option " + k);
      }
    }
    std::int64_t last_done = 0, last_total = 0;
    o.progress = [&](std::int64_t done, std::int64_t total) {
      last_done = done;
      last_total = total;
    };
    if (print_plan) {
      const RasterMetadata meta = read_raster_metadata(a[0]);
      const WarpPlan plan = plan_warp(meta, plan_warp_grid(meta, o), o);
      std::printf("grid %lld x %lld tiles %zu scale %.17g %.17g max_tile_bytes %llu\n",
                  static_cast<long long>(plan.grid.width), static_cast<long long>(plan.grid.height),
                  plan.tiles.size(), plan.x_scale, plan.y_scale,
                  static_cast<unsigned long long>(plan.max_tile_bytes));
      for (const WarpTile& t : plan.tiles) {
        std::printf(
            "tile %lld,%lld %lldx%lld source %lld,%lld %lldx%lld\n",
            static_cast<long long>(t.output.col_off), static_cast<long long>(t.output.row_off),
            static_cast<long long>(t.output.width), static_cast<long long>(t.output.height),
            static_cast<long long>(t.source.col_off), static_cast<long long>(t.source.row_off),
            static_cast<long long>(t.source.width), static_cast<long long>(t.source.height));
      }
    }
    if (executor_tile > 0) {
      RasterFileSource src(a[0]);
      WarpedSource warped(src, plan_warp_grid(src.metadata(), o), o);
      RasterFileSink sink(a[1], WriteOptions{});
      const RasterMetadata m = warped.metadata();
      RasterPlan plan;
      plan.strategy = TilingStrategy::tiled;
      plan.tile_shape = {{executor_tile, executor_tile}};
      plan.bands_per_pass = m.band_count;
      plan.n_tiles = ((m.height + executor_tile - 1) / executor_tile) *
                     ((m.width + executor_tile - 1) / executor_tile);
      TileRunOptions run;
      run.progress = o.progress;
      run_tiles(
          warped, [](const OwnedRasterArray& tile) { return tile; }, sink, plan, run);
    } else if (array) {
      const OwnedRasterArray src = read_raster(a[0]);
      const OwnedRasterArray out = warp(src, plan_warp_grid(src.metadata(), o), o);
      write_raster(a[1], out);
    } else {
      warp_raster_file(a[0], a[1], o);
    }
    std::printf("progress %lld/%lld\n", static_cast<long long>(last_done),
                static_cast<long long>(last_total));
  } catch (const WarpError& e) {
    std::cerr << "WarpError " << kind_name(e.kind()) << ": " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
