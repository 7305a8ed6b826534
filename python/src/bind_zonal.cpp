// SPDX-License-Identifier: Apache-2.0
// vibespatial_raster._core: zonal statistics (zonal.hpp) over a raster file or an in-memory
// raster, zones from a vector file, WKB or a zone raster. Results cross as a tuple of raw
// column bytes the Python module (ops.zonal_stats) turns into NumPy arrays.
#include "bindings.hpp"

#include <vibespatial/raster/zonal.hpp>

#include <nanobind/stl/function.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

using namespace nb::literals;

namespace vsr_python {

namespace {

template <class T>
nb::bytes column_bytes(const std::vector<T>& v) {
  return nb::bytes(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// (zone kind, zone column, band bytes (int32), stat names, [stat bytes (float64)], frac rows)
nb::tuple table_of(const vsr::ZonalTable& t) {
  nb::object zone;
  std::string kind;
  switch (t.zone.kind) {
    case vsr::ZoneIds::Kind::integer:
      kind = "int64";
      zone = column_bytes(t.zone.integers);
      break;
    case vsr::ZoneIds::Kind::real:
      kind = "float64";
      zone = column_bytes(t.zone.reals);
      break;
    case vsr::ZoneIds::Kind::text:
      kind = "str";
      zone = nb::cast(t.zone.texts);
      break;
  }
  std::vector<std::int32_t> bands(t.band.begin(), t.band.end());
  nb::list values;
  for (const auto& column : t.values) values.append(column_bytes(column));
  nb::list frac;
  for (const auto& row : t.frac) frac.append(nb::cast(row));
  return nb::make_tuple(kind, zone, column_bytes(bands), nb::cast(t.stat_names), values, frac);
}

vsr::ZonalOptions options_of(const std::string& pixels, const std::vector<std::string>& stats,
                             double quantile, const std::vector<int>& bands,
                             std::uint64_t memory_budget,
                             std::optional<std::pair<std::int64_t, std::int64_t>> tile_shape,
                             std::optional<nb::callable> progress, bool allow_virtual,
                             int threads) {
  vsr::ZonalOptions o;
  o.threads = threads;
  o.pixels = vsr::pixel_rule_from_string(pixels);
  o.stats = stats;
  o.quantile = quantile;
  o.bands = bands;
  o.memory_budget = memory_budget;
  o.tile_shape = tile_shape;
  o.open.allow_virtual = allow_virtual;
  if (progress) {
    auto ref = std::make_shared<PyRef>(nb::borrow<nb::object>(*progress));
    o.progress = [ref](std::int64_t done, std::int64_t total) {
      with_gil([&] { ref->get()(done, total); });
    };
  }
  return o;
}

vsr::ZoneSet zones_of(const std::vector<nb::bytes>& wkb, std::optional<nb::object> ids_kind,
                      std::optional<nb::object> ids) {
  std::vector<std::string> blobs;
  blobs.reserve(wkb.size());
  for (const auto& b : wkb) blobs.emplace_back(b.c_str(), b.size());
  vsr::ZoneIds z;
  if (ids_kind && ids) {
    const auto kind = nb::cast<std::string>(*ids_kind);
    if (kind == "int64") {
      z.integers = nb::cast<std::vector<std::int64_t>>(*ids);
    } else if (kind == "float64") {
      z.kind = vsr::ZoneIds::Kind::real;
      z.reals = nb::cast<std::vector<double>>(*ids);
    } else {
      z.kind = vsr::ZoneIds::Kind::text;
      z.texts = nb::cast<std::vector<std::string>>(*ids);
    }
  }
  GilRelease release;
  return vsr::zones_from_wkb(blobs, std::move(z));
}

}  // namespace

void bind_zonal(nb::module_& m) {
  nb::exception<vsr::ZonalInputError>(m, "ZonalInputError", PyExc_ValueError);
  m.def(
      "zonal_stats_file",
      [](const std::string& raster, const std::string& zones, const std::string& layer,
         const std::string& zone_field, const std::string& weights, const std::string& pixels,
         const std::vector<std::string>& stats, double quantile, const std::vector<int>& bands,
         std::uint64_t memory_budget,
         std::optional<std::pair<std::int64_t, std::int64_t>> tile_shape,
         std::optional<nb::callable> progress, bool allow_virtual, int threads) {
        const vsr::ZonalOptions o =
            options_of(pixels, stats, quantile, bands, memory_budget, tile_shape,
                       std::move(progress), allow_virtual, threads);
        vsr::ZonalTable t;
        {
          GilRelease release;
          t = vsr::zonal_stats_file(raster, vsr::ZoneFile{zones, layer, zone_field}, o, weights);
        }
        return table_of(t);
      },
      "raster"_a, "zones"_a, "layer"_a, "zone_field"_a, "weights"_a, "pixels"_a, "stats"_a,
      "quantile"_a, "bands"_a, "memory_budget"_a, "tile_shape"_a.none(), "progress"_a.none(),
      "allow_virtual"_a, "threads"_a = 0);
  m.def(
      "zonal_stats_file_wkb",
      [](const std::string& raster, const std::vector<nb::bytes>& wkb,
         std::optional<nb::object> ids_kind, std::optional<nb::object> ids,
         const std::string& weights, const std::string& pixels,
         const std::vector<std::string>& stats, double quantile, const std::vector<int>& bands,
         std::uint64_t memory_budget,
         std::optional<std::pair<std::int64_t, std::int64_t>> tile_shape,
         std::optional<nb::callable> progress, bool allow_virtual, int threads) {
        const vsr::ZonalOptions o =
            options_of(pixels, stats, quantile, bands, memory_budget, tile_shape,
                       std::move(progress), allow_virtual, threads);
        const vsr::ZoneSet zones = zones_of(wkb, std::move(ids_kind), std::move(ids));
        vsr::ZonalTable t;
        {
          GilRelease release;
          t = vsr::zonal_stats_file(raster, zones, o, weights);
        }
        return table_of(t);
      },
      "raster"_a, "wkb"_a, "ids_kind"_a.none(), "ids"_a.none(), "weights"_a, "pixels"_a, "stats"_a,
      "quantile"_a, "bands"_a, "memory_budget"_a, "tile_shape"_a.none(), "progress"_a.none(),
      "allow_virtual"_a, "threads"_a = 0);
  m.def(
      "zonal_stats_raster",
      [](const Raster& raster, std::optional<std::vector<nb::bytes>> wkb,
         std::optional<nb::object> ids_kind, std::optional<nb::object> ids,
         std::optional<Raster> zone_raster, std::optional<Raster> weights,
         const std::string& pixels, const std::vector<std::string>& stats, double quantile,
         const std::vector<int>& bands, std::uint64_t memory_budget,
         std::optional<std::pair<std::int64_t, std::int64_t>> tile_shape,
         std::optional<nb::callable> progress, int threads) {
        const vsr::ZonalOptions o = options_of(pixels, stats, quantile, bands, memory_budget,
                                               tile_shape, std::move(progress), false, threads);
        std::optional<vsr::ZoneSet> zones;
        if (wkb) zones = zones_of(*wkb, std::move(ids_kind), std::move(ids));
        vsr::ZonalTable t;
        {
          GilRelease release;
          const Raster* w = weights ? &*weights : nullptr;
          t = zones ? vsr::zonal_stats(raster, *zones, o, w)
                    : vsr::zonal_stats(raster, zone_raster.value(), o, w);
        }
        return table_of(t);
      },
      "raster"_a, "wkb"_a.none(), "ids_kind"_a.none(), "ids"_a.none(), "zone_raster"_a.none(),
      "weights"_a.none(), "pixels"_a, "stats"_a, "quantile"_a, "bands"_a, "memory_budget"_a,
      "tile_shape"_a.none(), "progress"_a.none(), "threads"_a = 0);
  m.def("zonal_stat_names", &vsr::zonal_stat_names);
}

}  // namespace vsr_python
