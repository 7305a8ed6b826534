// SPDX-License-Identifier: Apache-2.0
// vibespatial_raster._core: raster files through GDAL (headers, windowed reads, writes, the
// streamed run over a file), and the library's all-or-nothing writer for any bytes.
#include "bindings.hpp"

#include <vibespatial/raster/io.hpp>
#include <vibespatial/raster/outputs.hpp>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

using namespace nb::literals;

namespace vsr_python {

namespace {

vsr::WriteOptions write_options(const std::string& driver, const std::string& compress, bool tiled,
                                int block) {
  vsr::WriteOptions o;
  o.driver = driver;
  o.compress = compress;
  o.tiled = tiled;
  o.block = block;
  return o;
}

}  // namespace

void bind_io(nb::module_& m) {
  // ---- outputs (outputs.hpp): any bytes, all or nothing, with the target's rules ----
  m.def(
      "write_file_atomically",
      [](const std::string& path, const nb::bytes& data, bool overwrite,
         const std::vector<std::pair<std::string, std::string>>& keep) {
        const std::string bytes(data.c_str(), data.size());
        std::vector<vsr::KeptFile> kept;
        for (const auto& [role, file] : keep) kept.push_back({role, file});
        GilRelease release;
        vsr::write_file_atomically(path, bytes, overwrite, kept);
      },
      "path"_a, "data"_a, "overwrite"_a, "keep"_a);
  // ---- I/O ----
  m.def("io_available", &vsr::io_available);
  m.def(
      "read_raster_metadata",
      [](const std::string& path, bool allow_virtual) {
        vsr::RasterMetadata meta;
        {
          GilRelease release;
          meta = vsr::read_raster_metadata(path, vsr::OpenOptions{{}, allow_virtual});
        }
        return metadata_tuple(meta);
      },
      "path"_a, "allow_virtual"_a);
  m.def(
      "read_raster_info",
      [](const std::string& path, bool allow_virtual) {
        vsr::RasterFileInfo info;
        {
          GilRelease release;
          info = vsr::read_raster_info(path, vsr::OpenOptions{{}, allow_virtual});
        }
        return nb::make_tuple(metadata_tuple(info.metadata), info.band_nodata,
                              info.has_geotransform, info.block_shape);
      },
      "path"_a, "allow_virtual"_a);
  m.def(
      "read_raster",
      [](const std::string& path, std::optional<std::array<std::int64_t, 4>> window,
         std::vector<int> bands, bool allow_virtual) {
        std::optional<vsr::RasterWindow> w;
        if (window) w = vsr::RasterWindow{(*window)[0], (*window)[1], (*window)[2], (*window)[3]};
        GilRelease release;
        return vsr::read_raster(path, w, std::move(bands), vsr::OpenOptions{{}, allow_virtual});
      },
      "path"_a, "window"_a.none(), "bands"_a, "allow_virtual"_a);
  m.def(
      "write_raster",
      [](const std::string& path, const Raster& r, const std::string& driver,
         const std::string& compress, bool tiled, int block) {
        const vsr::WriteOptions o = write_options(driver, compress, tiled, block);
        GilRelease release;
        vsr::write_raster(path, r, o);
      },
      "path"_a, "raster"_a, "driver"_a, "compress"_a, "tiled"_a, "block"_a);
  m.def(
      "merge_raster_parts",
      [](const std::vector<std::tuple<std::string, std::array<std::int64_t, 4>, int>>& parts,
         std::int64_t height, std::int64_t width, int band_count, const std::string& dtype,
         Nodata nodata, const AffineTuple& affine, std::string crs, const std::string& out,
         const std::string& driver, const std::string& compress, bool tiled, int block) {
        std::vector<vsr::RasterPart> ps;
        ps.reserve(parts.size());
        for (const auto& [path, w, first_band] : parts) {
          ps.push_back(
              vsr::RasterPart{path, vsr::RasterWindow{w[0], w[1], w[2], w[3]}, first_band});
        }
        vsr::RasterMetadata layout =
            metadata_of(height, width, band_count, dtype, {}, affine, std::move(crs), {});
        layout.exact_nodata = nodata;
        if (nodata) layout.nodata = nodata->to_double();
        const vsr::WriteOptions o = write_options(driver, compress, tiled, block);
        GilRelease release;
        vsr::merge_raster_parts(ps, layout, out, o);
      },
      "parts"_a, "height"_a, "width"_a, "band_count"_a, "dtype"_a, "nodata"_a.none(), "affine"_a,
      "crs"_a, "out_path"_a, "driver"_a, "compress"_a, "tiled"_a, "block"_a);
  m.def(
      "process_raster_streamed",
      [](const std::string& in, const std::string& out, const nb::callable& fn,
         const std::string& strategy, std::optional<std::pair<std::int64_t, std::int64_t>> tile,
         int halo, std::int64_t n_tiles, std::uint64_t estimate, int bands_per_pass, bool fits,
         const std::string& driver, const std::string& compress, bool tiled, int block,
         std::optional<nb::callable> progress, bool allow_virtual) {
        const vsr::BandOp op = band_op(fn);
        const vsr::RasterPlan plan =
            plan_of(strategy, tile, halo, n_tiles, estimate, bands_per_pass, fits);
        vsr::StreamOptions options;
        options.open.allow_virtual = allow_virtual;
        options.write = write_options(driver, compress, tiled, block);
        if (progress) {
          auto ref = std::make_shared<PyRef>(nb::borrow<nb::object>(*progress));
          options.progress = [ref](std::int64_t done, std::int64_t total) {
            with_gil([&] { ref->get()(done, total); });
          };
        }
        GilRelease release;
        vsr::process_raster_file(in, out, op, plan, options);
      },
      "in_path"_a, "out_path"_a, "op"_a, "strategy"_a, "tile_shape"_a.none(), "halo"_a, "n_tiles"_a,
      "estimate"_a, "bands_per_pass"_a, "fits_budget"_a, "driver"_a, "compress"_a, "tiled"_a,
      "block"_a, "progress"_a.none(), "allow_virtual"_a);
}

}  // namespace vsr_python
