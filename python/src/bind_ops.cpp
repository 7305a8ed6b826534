// SPDX-License-Identifier: Apache-2.0
// vibespatial_raster._core: the VRAM budget and plans, the dispatchers (per band on the host and
// the device, tiled) with Python band ops, the placement rule and the first-result rule of the
// tile executor, the band operations, band math and pipelines.
#include "bindings.hpp"

#include <vibespatial/raster/driver.hpp>
#include <vibespatial/raster/ops.hpp>
#include <vibespatial/raster/pipeline.hpp>
#include <vibespatial/raster/tiles.hpp>

#include <nanobind/ndarray.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

using namespace nb::literals;

namespace vsr_python {

// ---- callbacks into Python -------------------------------------------------------------------

vsr::BandOp band_op(const nb::callable& fn) {
  auto ref = std::make_shared<PyRef>(nb::borrow<nb::object>(fn));
  return [ref](const Raster& band) -> Raster {
    return with_gil([&] {
      nb::object arg = nb::cast(band, nb::rv_policy::copy);
      nb::object result = ref->get()(arg);
      if (!nb::isinstance<Raster>(result)) {
        throw nb::type_error("the band operation must return a Raster (internal adapter error)");
      }
      return nb::cast<Raster>(result);
    });
  };
}

namespace {

vsr::EdgeMode edge_of(const std::string& name) {
  if (name == "nearest") return vsr::EdgeMode::nearest;
  if (name == "reflect") return vsr::EdgeMode::reflect;
  if (name == "constant_nodata") return vsr::EdgeMode::constant_nodata;
  throw std::invalid_argument("edge must be 'nearest', 'reflect' or 'constant_nodata', not '" +
                              name + "'");
}

vsr::CalcOptions calc_options(const std::string& dtype, bool compute_float32, bool propagate_nodata,
                              const Nodata& nodata) {
  vsr::CalcOptions o;
  o.output = dtype_of(dtype);
  o.compute_float32 = compute_float32;
  o.propagate_nodata = propagate_nodata;
  o.output_nodata = nodata;
  return o;
}

vsr::PlanOptions plan_options(int band_count, int buffers_per_band, std::uint64_t scratch_bytes,
                              int halo, std::optional<std::uint64_t> vram_budget, bool per_band) {
  vsr::PlanOptions o;
  o.band_count = band_count;
  o.buffers_per_band = buffers_per_band;
  o.scratch_bytes = scratch_bytes;
  o.halo = halo;
  o.vram_budget = vram_budget;
  o.per_band = per_band;
  return o;
}

/// The histogram counts[band][bin] as a (bands, bins) int64 NumPy array.
nb::object histogram_array(const std::vector<std::vector<std::int64_t>>& counts, int bins) {
  auto* flat = new std::vector<std::int64_t>();
  flat->reserve(counts.size() * static_cast<std::size_t>(bins));
  for (const auto& band : counts) flat->insert(flat->end(), band.begin(), band.end());
  nb::capsule owner(flat,
                    [](void* p) noexcept { delete static_cast<std::vector<std::int64_t>*>(p); });
  const std::size_t shape[2] = {counts.size(), static_cast<std::size_t>(bins)};
  nb::ndarray<nb::numpy, std::int64_t> a(flat->data(), 2, shape, owner);
  return nb::cast(a, nb::rv_policy::reference);
}

/// A plan as Python passes it (RasterPlan._core_args()).
using PlanTuple = std::tuple<std::string, std::optional<std::pair<std::int64_t, std::int64_t>>, int,
                             std::int64_t, std::uint64_t, int, bool>;

vsr::RasterPlan plan_of_tuple(const PlanTuple& t) {
  return plan_of(std::get<0>(t), std::get<1>(t), std::get<2>(t), std::get<3>(t), std::get<4>(t),
                 std::get<5>(t), std::get<6>(t));
}

}  // namespace

void bind_ops(nb::module_& m) {
  // ---- budget and planning ----
  m.def("available_vram_bytes", &vsr::available_vram_bytes, nb::call_guard<GilRelease>());
  m.def("usable_vram_budget", &vsr::usable_vram_budget, "vram_budget"_a);
  m.def(
      "max_bands_for_budget",
      [](std::int64_t height, std::int64_t width, const std::string& dtype, int buffers_per_band,
         std::uint64_t scratch_bytes, std::optional<std::uint64_t> vram_budget) {
        const vsr::DType d = dtype_of(dtype);
        GilRelease release;
        return vsr::max_bands_for_budget(height, width, d, buffers_per_band, scratch_bytes,
                                         vram_budget);
      },
      "height"_a, "width"_a, "dtype"_a, "buffers_per_band"_a, "scratch_bytes"_a,
      "vram_budget"_a.none());
  m.def(
      "analyze_raster_plan",
      [](std::int64_t height, std::int64_t width, const std::string& dtype, int band_count,
         int buffers_per_band, std::uint64_t scratch_bytes, int halo,
         std::optional<std::uint64_t> vram_budget, bool per_band) {
        const vsr::DType d = dtype_of(dtype);
        vsr::RasterPlan p;
        {
          GilRelease release;
          p = vsr::analyze_raster_plan(height, width, d,
                                       plan_options(band_count, buffers_per_band, scratch_bytes,
                                                    halo, vram_budget, per_band));
        }
        return plan_tuple(p);
      },
      "height"_a, "width"_a, "dtype"_a, "band_count"_a, "buffers_per_band"_a, "scratch_bytes"_a,
      "halo"_a, "vram_budget"_a.none(), "per_band"_a);
  m.def(
      "plan_from_metadata",
      [](std::int64_t height, std::int64_t width, int band_count, const std::string& dtype,
         int buffers_per_band, std::uint64_t scratch_bytes, int halo,
         std::optional<std::uint64_t> vram_budget, bool per_band) {
        vsr::RasterMetadata meta = metadata_of(height, width, band_count, dtype, {}, {}, {}, {});
        vsr::RasterPlan p;
        {
          GilRelease release;
          p = vsr::plan_from_metadata(
              meta, plan_options(1, buffers_per_band, scratch_bytes, halo, vram_budget, per_band));
        }
        return plan_tuple(p);
      },
      "height"_a, "width"_a, "band_count"_a, "dtype"_a, "buffers_per_band"_a, "scratch_bytes"_a,
      "halo"_a, "vram_budget"_a.none(), "per_band"_a);

  // ---- dispatch ----
  m.def(
      "dispatch_per_band_cpu",
      [](const Raster& r, const nb::callable& fn) {
        const vsr::BandOp op = band_op(fn);
        GilRelease release;
        return vsr::dispatch_per_band_cpu(r, op);
      },
      "raster"_a, "op"_a);
  m.def(
      "dispatch_per_band_gpu",
      [](const Raster& r, const nb::callable& fn, int buffers_per_band,
         std::uint64_t scratch_bytes) {
        const vsr::BandOp op = band_op(fn);
        GilRelease release;
        return vsr::dispatch_per_band_gpu(r, op, buffers_per_band, scratch_bytes);
      },
      "raster"_a, "op"_a, "buffers_per_band"_a, "scratch_bytes"_a);
  m.def(
      "dispatch_tiled",
      [](const Raster& r, const nb::callable& fn, const std::string& strategy,
         std::optional<std::pair<std::int64_t, std::int64_t>> tile_shape, int halo,
         std::int64_t n_tiles, std::uint64_t estimate, int bands_per_pass, bool fits,
         bool with_halo) {
        const vsr::BandOp op = band_op(fn);
        const vsr::RasterPlan plan =
            plan_of(strategy, tile_shape, halo, n_tiles, estimate, bands_per_pass, fits);
        GilRelease release;
        return with_halo ? vsr::dispatch_tiled_halo(r, op, plan) : vsr::dispatch_tiled(r, op, plan);
      },
      "raster"_a, "op"_a, "strategy"_a, "tile_shape"_a.none(), "halo"_a, "n_tiles"_a, "estimate"_a,
      "bands_per_pass"_a, "fits_budget"_a, "with_halo"_a);
  m.def(
      "dispatch_tiled_binary",
      [](const Raster& a, const Raster& b, const nb::callable& fn, const PlanTuple& plan) {
        auto ref = std::make_shared<PyRef>(nb::borrow<nb::object>(fn));
        const vsr::BinaryBandOp op = [ref](const Raster& ta, const Raster& tb) -> Raster {
          return with_gil([&] {
            nb::object result =
                ref->get()(nb::cast(ta, nb::rv_policy::copy), nb::cast(tb, nb::rv_policy::copy));
            return nb::cast<Raster>(result);
          });
        };
        const vsr::RasterPlan p = plan_of_tuple(plan);
        GilRelease release;
        return vsr::dispatch_tiled_binary(a, b, op, p);
      },
      "a"_a, "b"_a, "op"_a, "plan"_a);
  m.def(
      "dispatch_tiled_multipass",
      [](const Raster& r, const nb::callable& local, const nb::callable& merge,
         const PlanTuple& plan) {
        const vsr::BandOp local_op = band_op(local);
        auto ref = std::make_shared<PyRef>(nb::borrow<nb::object>(merge));
        const vsr::MultipassMerge merge_op =
            [ref](const Raster& intermediate, const std::vector<vsr::TileWindow>& tiles) -> Raster {
          return with_gil([&] {
            // Each tile's effective bounds as (row_start, row_end, col_start, col_end).
            nb::list bounds;
            for (const vsr::TileWindow& t : tiles) {
              const vsr::RasterWindow& w = t.window;
              bounds.append(
                  nb::make_tuple(w.row_off, w.row_off + w.height, w.col_off, w.col_off + w.width));
            }
            nb::object result = ref->get()(nb::cast(intermediate, nb::rv_policy::copy), bounds);
            return nb::cast<Raster>(result);
          });
        };
        const vsr::RasterPlan p = plan_of_tuple(plan);
        GilRelease release;
        return vsr::dispatch_tiled_multipass(r, local_op, merge_op, p);
      },
      "raster"_a, "local"_a, "merge"_a, "plan"_a);
  m.def(
      "dispatch_tiled_accumulator",
      [](const Raster& r, const nb::callable& tile_fn, const nb::callable& merge_fn,
         const PlanTuple& plan) -> nb::object {
        // Partials are Python objects held by PyRef (released with the GIL wherever they go).
        using Partial = std::shared_ptr<PyRef>;
        auto tile_ref = std::make_shared<PyRef>(nb::borrow<nb::object>(tile_fn));
        auto merge_ref = std::make_shared<PyRef>(nb::borrow<nb::object>(merge_fn));
        const auto tile = [tile_ref](const Raster& t) -> Partial {
          return with_gil([&] {
            return std::make_shared<PyRef>(tile_ref->get()(nb::cast(t, nb::rv_policy::copy)));
          });
        };
        const auto merge = [merge_ref](Partial acc, const Partial& part) -> Partial {
          return with_gil(
              [&] { return std::make_shared<PyRef>(merge_ref->get()(acc->get(), part->get())); });
        };
        const vsr::RasterPlan p = plan_of_tuple(plan);
        Partial out;
        {
          GilRelease release;
          out = vsr::dispatch_tiled_accumulator(r, tile, merge, p);
        }
        return nb::borrow<nb::object>(out->get());
      },
      "raster"_a, "tile_fn"_a, "merge_fn"_a, "plan"_a);

  // ---- placement and the first-result rule ----
  m.def(
      "placement_from_string",
      [](const std::string& text) {
        return std::string(vsr::to_string(vsr::placement_from_string(text)));
      },
      "text"_a);
  m.def(
      "placed",
      [](const std::string& want, std::optional<nb::dict> driver,
         std::optional<bool> ops_with_cuda) {
        const vsr::Placement p = vsr::placement_from_string(want);
        vsr::PlacementDecision d;
        if (!driver) {
          GilRelease release;
          d = vsr::placed(p);
        } else {
          // The facts as driver_info() gives them; a key that is missing reads as its default.
          vsr::DriverInfo info;
          const nb::dict& f = *driver;
          const auto get = [&](const char* key) {
            return f.contains(key) ? nb::borrow<nb::object>(f[key]) : nb::none();
          };
          info.available = nb::cast<bool>(nb::bool_(get("available")));
          info.emulated = nb::cast<bool>(nb::bool_(get("emulated")));
          if (!get("library").is_none())
            info.library = nb::cast<std::string>(nb::str(get("library")));
          if (!get("reason").is_none()) info.reason = nb::cast<std::string>(nb::str(get("reason")));
          const nb::object devices = get("devices");
          if (!devices.is_none()) {
            for (nb::handle dev : devices) {
              vsr::DeviceInfo di;
              if (nb::isinstance<nb::dict>(dev) && nb::cast<nb::dict>(dev).contains("name")) {
                di.name = nb::cast<std::string>(nb::str(dev["name"]));
              }
              info.devices.push_back(std::move(di));
            }
          }
          d = vsr::placed(p, info, ops_with_cuda ? *ops_with_cuda : vsr::ops_built_with_cuda());
        }
        return nb::make_tuple(residency_name(d.residency), d.reason, d.emulated);
      },
      "want"_a, "driver"_a = nb::none(), "ops_with_cuda"_a = nb::none());

  nb::class_<vsr::TileResultRule>(m, "TileResultRule")
      .def(nb::init<std::string>(), "name"_a)
      .def(
          "check",
          [](vsr::TileResultRule& rule, const Raster& result,
             const std::array<std::int64_t, 4>& read, const std::string& tile) {
            rule.check(result, vsr::RasterWindow{read[0], read[1], read[2], read[3]}, tile);
          },
          "result"_a, "read"_a, "tile"_a)
      .def(
          "expect_dtype",
          [](vsr::TileResultRule& rule, const std::string& dtype) {
            rule.expect_dtype(dtype_of(dtype));
          },
          "dtype"_a)
      .def("expect_band_count", &vsr::TileResultRule::expect_band_count, "band_count"_a)
      .def("expect_nodata", &vsr::TileResultRule::expect_nodata, "nodata"_a.none())
      .def("reset_nodata", &vsr::TileResultRule::reset_nodata)
      .def_prop_ro("dtype",
                   [](const vsr::TileResultRule& rule) -> std::optional<std::string> {
                     if (!rule.dtype()) return std::nullopt;
                     return dtype_name(*rule.dtype());
                   })
      .def_prop_ro("band_count", &vsr::TileResultRule::band_count)
      .def_prop_ro("nodata_fixed", &vsr::TileResultRule::nodata_fixed)
      .def_prop_ro("nodata", [](const vsr::TileResultRule& rule) { return rule.nodata(); });

  // ---- ops ----
  m.def("ops_built_with_cuda", &vsr::ops_built_with_cuda);
  m.def(
      "compute_dtype",
      [](const std::string& dtype) { return dtype_name(vsr::compute_dtype(dtype_of(dtype))); },
      "dtype"_a);
  m.def(
      "band_statistics",
      [](const Raster& r) {
        std::vector<vsr::BandStatistics> stats;
        {
          GilRelease release;
          stats = vsr::band_statistics(r);
        }
        nb::list out;
        for (const vsr::BandStatistics& s : stats) {
          out.append(nb::make_tuple(s.count, s.min, s.max, s.mean, s.std));
        }
        return out;
      },
      "raster"_a);
  m.def(
      "rescale",
      [](const Raster& r, double in_min, double in_max, double out_min, double out_max,
         const std::string& dtype) {
        const vsr::DType d = dtype_of(dtype);
        GilRelease release;
        return vsr::rescale(r, in_min, in_max, out_min, out_max, d);
      },
      "raster"_a, "in_min"_a, "in_max"_a, "out_min"_a, "out_max"_a, "dtype"_a);
  m.def("rescale_into",
        nb::overload_cast<const vsr::OwnedRasterArray&, double, double, double, double,
                          vsr::OwnedRasterArray&>(&vsr::rescale_into),
        "raster"_a, "in_min"_a, "in_max"_a, "out_min"_a, "out_max"_a, "out"_a,
        nb::call_guard<GilRelease>());
  m.def("clip", nb::overload_cast<const vsr::OwnedRasterArray&, double, double>(&vsr::clip),
        "raster"_a, "lower"_a, "upper"_a, nb::call_guard<GilRelease>());
  m.def("clip_into",
        nb::overload_cast<const vsr::OwnedRasterArray&, double, double, vsr::OwnedRasterArray&>(
            &vsr::clip_into),
        "raster"_a, "lower"_a, "upper"_a, "out"_a, nb::call_guard<GilRelease>());
  m.def("fill_nodata", nb::overload_cast<const vsr::OwnedRasterArray&, double>(&vsr::fill_nodata),
        "raster"_a, "value"_a, nb::call_guard<GilRelease>());
  m.def("fill_nodata_into",
        nb::overload_cast<const vsr::OwnedRasterArray&, double, vsr::OwnedRasterArray&>(
            &vsr::fill_nodata_into),
        "raster"_a, "value"_a, "out"_a, nb::call_guard<GilRelease>());
  m.def("normalized_difference",
        nb::overload_cast<const vsr::OwnedRasterArray&, const vsr::OwnedRasterArray&>(
            &vsr::normalized_difference),
        "a"_a, "b"_a, nb::call_guard<GilRelease>());
  m.def("normalized_difference_into",
        nb::overload_cast<const vsr::OwnedRasterArray&, const vsr::OwnedRasterArray&,
                          vsr::OwnedRasterArray&>(&vsr::normalized_difference_into),
        "a"_a, "b"_a, "out"_a, nb::call_guard<GilRelease>());
  m.def(
      "histogram",
      [](const Raster& r, int bins, double lower, double upper) {
        std::vector<std::vector<std::int64_t>> counts;
        {
          GilRelease release;
          counts = vsr::histogram(r, bins, lower, upper);
        }
        return histogram_array(counts, bins);
      },
      "raster"_a, "bins"_a, "lower"_a, "upper"_a);
  m.def(
      "focal_mean_3x3",
      [](const Raster& r, const std::string& edge) {
        const vsr::EdgeMode e = edge_of(edge);
        GilRelease release;
        return vsr::focal_mean_3x3(r, e);
      },
      "raster"_a, "edge"_a);
  m.def(
      "focal_mean_3x3_into",
      [](const Raster& r, const std::string& edge, Raster& out) {
        const vsr::EdgeMode e = edge_of(edge);
        GilRelease release;
        vsr::focal_mean_3x3_into(r, e, out);
      },
      "raster"_a, "edge"_a, "out"_a);

  // ---- band math and pipelines ----
  m.def(
      "calc",
      [](const std::vector<std::string>& expressions, const std::vector<std::string>& names,
         const std::vector<Raster>& rasters, const std::string& dtype, bool compute_float32,
         bool propagate_nodata, Nodata nodata) {
        if (names.size() != rasters.size()) {
          throw std::invalid_argument("calc: one name per raster");
        }
        vsr::CalcOptions options = calc_options(dtype, compute_float32, propagate_nodata, nodata);
        std::vector<vsr::CalcInput> inputs;
        for (std::size_t i = 0; i < names.size(); ++i) inputs.push_back({names[i], rasters[i]});
        GilRelease release;
        return vsr::calc(expressions, inputs, options);
      },
      "expressions"_a, "names"_a, "rasters"_a, "dtype"_a, "compute_float32"_a, "propagate_nodata"_a,
      "nodata"_a.none());
  nb::class_<vsr::Pipeline>(m, "Pipeline")
      .def(
          "__init__",
          [](vsr::Pipeline* self, const std::vector<std::pair<std::string, int>>& inputs) {
            std::vector<vsr::CalcInputBands> v;
            for (const auto& [name, bands] : inputs) v.push_back({name, bands});
            new (self) vsr::Pipeline(std::move(v));
          },
          "inputs"_a)
      .def(
          "calc",
          [](vsr::Pipeline& p, const std::vector<std::string>& expressions,
             const std::string& dtype, bool compute_float32, bool propagate_nodata, Nodata nodata) {
            p.calc(expressions, calc_options(dtype, compute_float32, propagate_nodata, nodata));
          },
          "expressions"_a, "dtype"_a, "compute_float32"_a, "propagate_nodata"_a, "nodata"_a.none())
      .def(
          "focal_mean",
          [](vsr::Pipeline& p, const std::string& edge) { p.focal_mean(edge_of(edge)); }, "edge"_a)
      .def(
          "rescale",
          [](vsr::Pipeline& p, double in_min, double in_max, double out_min, double out_max,
             const std::string& dtype) {
            p.rescale(in_min, in_max, out_min, out_max, dtype_of(dtype));
          },
          "in_min"_a, "in_max"_a, "out_min"_a, "out_max"_a, "dtype"_a)
      .def(
          "convert",
          [](vsr::Pipeline& p, const std::string& dtype, Nodata nodata) {
            p.convert(dtype_of(dtype), nodata);
          },
          "dtype"_a, "nodata"_a.none())
      .def(
          "clip", [](vsr::Pipeline& p, double lower, double upper) { p.clip(lower, upper); },
          "lower"_a, "upper"_a)
      .def(
          "fill_nodata", [](vsr::Pipeline& p, double value) { p.fill_nodata(value); }, "value"_a)
      .def_prop_ro("halo", &vsr::Pipeline::halo)
      .def_prop_ro("band_count", &vsr::Pipeline::band_count)
      .def_prop_ro("bands_independent", &vsr::Pipeline::bands_independent)
      .def("step_names", &vsr::Pipeline::step_names)
      .def(
          "run",
          [](const vsr::Pipeline& p, const std::vector<Raster>& rasters,
             const std::string& strategy,
             std::optional<std::pair<std::int64_t, std::int64_t>> tile_shape, int halo,
             std::int64_t n_tiles, std::uint64_t estimate, int bands_per_pass, bool fits) {
            const vsr::RasterPlan plan =
                plan_of(strategy, tile_shape, halo, n_tiles, estimate, bands_per_pass, fits);
            GilRelease release;
            return p.run(rasters, plan);
          },
          "rasters"_a, "strategy"_a, "tile_shape"_a.none(), "halo"_a, "n_tiles"_a, "estimate"_a,
          "bands_per_pass"_a, "fits_budget"_a);
}

}  // namespace vsr_python
