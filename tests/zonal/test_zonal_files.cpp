// SPDX-License-Identifier: Apache-2.0
// Zonal statistics from files: OGR layers (GeoJSON, GeoPackage), their CRS transformed to the
// raster's, zone rasters, the refusals of bad zones, and the table written all or nothing.
#include "temp_dir.hpp"

#include <vibespatial/raster/io.hpp>
#include <vibespatial/raster/zonal.hpp>

#include <doctest/doctest.h>

#include <ogr_spatialref.h>
#include <ogrsf_frmts.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <system_error>

namespace vsr = vibespatial::raster;

namespace {

const vsr::Affine grid{10, 0, 500000, 0, -10, 4000300};  // EPSG:32631 metres

vsr::OwnedRasterArray values_raster() {
  std::vector<float> v(2 * 30 * 40);
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> d(0, 100);
  for (auto& x : v) x = d(rng);
  for (std::size_t i = 0; i < v.size(); i += 13) v[i] = -9999;
  return vsr::OwnedRasterArray::from_host(v.data(), vsr::DType::float32, 2, 30, 40, -9999.0, grid,
                                          "EPSG:32631");
}

vsr::ZoneGeometry square(double x, double y, double side) {
  return {{{{x, y}, {x + side, y}, {x + side, y + side}, {x, y + side}}}};
}

std::vector<vsr::ZoneGeometry> test_zones() {
  return {square(500013, 4000013, 77),
          {{{{500100, 4000100}, {500300, 4000120}, {500250, 4000290}, {500110, 4000250}},
            {{500150, 4000150}, {500200, 4000160}, {500180, 4000200}}}},
          square(600000, 4100000, 50)};  // outside the raster
}

// Writes @p zones to a new OGR layer in @p crs (EPSG code), with an integer field "id" (10, 11,
// ...) and a text field "name"; @p transform_from: the zones' own EPSG code, transformed here.
void write_layer(const std::string& path, const char* driver,
                 const std::vector<vsr::ZoneGeometry>& zones, int crs, int transform_from = 0) {
  GDALAllRegister();
  GDALDriver* drv = GetGDALDriverManager()->GetDriverByName(driver);
  REQUIRE(drv != nullptr);
  GDALDataset* ds = drv->Create(path.c_str(), 0, 0, 0, GDT_Unknown, nullptr);
  REQUIRE(ds != nullptr);
  OGRSpatialReference srs, from;
  srs.importFromEPSG(crs);
  srs.SetAxisMappingStrategy(OAMS_TRADITIONAL_GIS_ORDER);
  OGRLayer* layer = ds->CreateLayer("zones", &srs, wkbUnknown, nullptr);
  OGRFieldDefn id("id", OFTInteger), name("name", OFTString);
  layer->CreateField(&id);
  layer->CreateField(&name);
  OGRCoordinateTransformation* ct = nullptr;
  if (transform_from != 0) {
    from.importFromEPSG(transform_from);
    from.SetAxisMappingStrategy(OAMS_TRADITIONAL_GIS_ORDER);
    ct = OGRCreateCoordinateTransformation(&from, &srs);
  }
  for (std::size_t z = 0; z < zones.size(); ++z) {
    OGRFeature f(layer->GetLayerDefn());
    f.SetField("id", static_cast<int>(10 + z));
    f.SetField("name", ("zone " + std::to_string(z)).c_str());
    OGRMultiPolygon mp;
    for (const auto& poly : zones[z]) {
      OGRPolygon p;
      for (const auto& ring : poly) {
        OGRLinearRing r;
        for (const auto& [x, y] : ring) r.addPoint(x, y);
        r.closeRings();
        p.addRing(&r);
      }
      mp.addGeometry(&p);
    }
    if (ct != nullptr) REQUIRE(mp.transform(ct) == OGRERR_NONE);
    f.SetGeometry(&mp);
    REQUIRE(layer->CreateFeature(&f) == OGRERR_NONE);
  }
  if (ct != nullptr) OGRCoordinateTransformation::DestroyCT(ct);
  GDALClose(ds);
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

bool same(double a, double b, double rel) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::abs(a - b) <= rel * std::max({1.0, std::abs(a), std::abs(b)});
}

}  // namespace

TEST_CASE("zonal_stats_file: a GeoJSON layer with a zone field equals the in-memory run") {
  vsr_test::TempDir dir("vsr-zonal");
  const auto raster = values_raster();
  vsr::write_raster(dir.file("v.tif"), raster);
  write_layer(dir.file("z.geojson"), "GeoJSON", test_zones(), 32631);
  vsr::ZonalOptions o;
  o.stats = {"count", "sum", "mean", "min", "max", "stdev", "median", "cell_count"};
  const auto t = vsr::zonal_stats_file(dir.file("v.tif"), {dir.file("z.geojson"), "", "id"}, o);
  vsr::ZoneSet zones;
  zones.geometries = test_zones();
  const auto want = vsr::zonal_stats(raster, zones, o);
  REQUIRE(t.rows() == 6);
  CHECK(t.zone.kind == vsr::ZoneIds::Kind::integer);
  CHECK(t.zone.integers == std::vector<std::int64_t>{10, 10, 11, 11, 12, 12});
  CHECK(t.band == std::vector<int>{1, 2, 1, 2, 1, 2});
  for (std::size_t s = 0; s < o.stats.size(); ++s) {
    for (std::size_t r = 0; r < t.rows(); ++r)
      CHECK(same(t.values[s][r], want.values[s][r], 1e-12));
  }
  CHECK(t.column("count")[4] == 0);  // outside the raster: zero coverage, nulls
  CHECK(std::isnan(t.column("mean")[4]));
  // -b 2, a text zone field, a tiny budget (many tiles): the same numbers.
  o.bands = {2};
  o.memory_budget = 4096;
  const auto b2 = vsr::zonal_stats_file(dir.file("v.tif"), {dir.file("z.geojson"), "", "name"}, o);
  REQUIRE(b2.rows() == 3);
  CHECK(b2.band == std::vector<int>{2, 2, 2});
  CHECK(b2.zone.texts == std::vector<std::string>{"zone 0", "zone 1", "zone 2"});
  for (std::size_t s = 0; s < o.stats.size(); ++s) {
    for (std::size_t r = 0; r < 3; ++r)
      CHECK(same(b2.values[s][r], want.values[s][2 * r + 1], 1e-12));
  }
  // No zone field: feature ids.
  o.bands = {};
  const auto fid = vsr::zonal_stats_file(dir.file("v.tif"), {dir.file("z.geojson"), "", ""}, o);
  REQUIRE(fid.rows() == 6);  // GeoJSON's feature ids (its driver takes them from "id")
  CHECK(fid.zone.integers[0] == fid.zone.integers[1]);
  CHECK(fid.zone.integers[2] != fid.zone.integers[0]);
}

TEST_CASE("zonal_stats_file: a layer in another CRS is transformed to the raster's") {
  vsr_test::TempDir dir("vsr-zonal");
  const auto raster = values_raster();
  vsr::write_raster(dir.file("v.tif"), raster);
  write_layer(dir.file("z.gpkg"), "GPKG", test_zones(), 4326, 32631);
  vsr::ZonalOptions o;
  o.stats = {"count", "sum", "min", "max"};
  const auto t = vsr::zonal_stats_file(dir.file("v.tif"), {dir.file("z.gpkg"), "zones", "id"}, o);
  vsr::ZoneSet zones;
  zones.geometries = test_zones();
  const auto want = vsr::zonal_stats(raster, zones, o);
  REQUIRE(t.rows() == want.rows());
  for (std::size_t r = 0; r < t.rows(); ++r) {
    CHECK(same(t.column("count")[r], want.column("count")[r], 1e-6));
    CHECK(same(t.column("sum")[r], want.column("sum")[r], 1e-6));
    CHECK(same(t.column("min")[r], want.column("min")[r], 0));
  }
}

TEST_CASE("zonal_stats_file over a zone raster file; zone rasters it refuses") {
  vsr_test::TempDir dir("vsr-zonal");
  const auto raster = values_raster();
  vsr::write_raster(dir.file("v.tif"), raster);
  std::vector<std::int16_t> z(30 * 40);
  for (std::size_t i = 0; i < z.size(); ++i) z[i] = static_cast<std::int16_t>(i % 7);
  const auto zr = vsr::OwnedRasterArray::from_host(z.data(), vsr::DType::int16, 1, 30, 40, 0.0,
                                                   grid, "EPSG:32631");
  vsr::write_raster(dir.file("z.tif"), zr);
  vsr::ZonalOptions o;
  o.stats = {"count", "mean", "majority"};
  o.bands = {2};
  const auto t = vsr::zonal_stats_file(dir.file("v.tif"), {dir.file("z.tif"), "", ""}, o);
  const auto want = vsr::zonal_stats(raster, zr, o);
  REQUIRE(t.rows() == 6);  // zones 1..6; 0 is nodata
  CHECK(t.zone.integers == std::vector<std::int64_t>{1, 2, 3, 4, 5, 6});
  CHECK(t.band == std::vector<int>{2, 2, 2, 2, 2, 2});
  for (std::size_t r = 0; r < 6; ++r)
    CHECK(same(t.column("mean")[r], want.column("mean")[r], 1e-12));
  std::vector<float> zf(30 * 40, 1.0f);
  vsr::write_raster(dir.file("zf.tif"),
                    vsr::OwnedRasterArray::from_host(zf.data(), vsr::DType::float32, 1, 30, 40, {},
                                                     grid, "EPSG:32631"));
  CHECK_THROWS_AS(vsr::zonal_stats_file(dir.file("v.tif"), {dir.file("zf.tif"), "", ""}, o),
                  vsr::ZonalInputError);
  vsr::write_raster(
      dir.file("zs.tif"),
      vsr::OwnedRasterArray::from_host(z.data(), vsr::DType::int16, 1, 30, 40, 0.0,
                                       vsr::Affine{20, 0, 500000, 0, -20, 4000300}, "EPSG:32631"));
  CHECK_THROWS_AS(vsr::zonal_stats_file(dir.file("v.tif"), {dir.file("zs.tif"), "", ""}, o),
                  vsr::ZonalInputError);
}

TEST_CASE("zonal_stats_file refuses bad zones with a clear error") {
  vsr_test::TempDir dir("vsr-zonal");
  vsr::write_raster(dir.file("v.tif"), values_raster());
  write_layer(dir.file("z.geojson"), "GeoJSON", test_zones(), 32631);
  vsr::ZonalOptions o;
  const auto run = [&](const vsr::ZoneFile& zones) {
    return vsr::zonal_stats_file(dir.file("v.tif"), zones, o);
  };
  CHECK_THROWS_WITH_AS(run({dir.file("z.geojson"), "", "nope"}),
                       doctest::Contains("has no field 'nope' (fields: id, name)"),
                       vsr::ZonalInputError);
  CHECK_THROWS_WITH_AS(run({dir.file("z.geojson"), "other", ""}), doctest::Contains("no layer"),
                       vsr::ZonalInputError);
  CHECK_THROWS_AS(run({dir.file("missing.gpkg"), "", ""}), std::system_error);
  const std::string head = R"({"type":"FeatureCollection","features":[)";
  write_text(dir.file("empty.geojson"), head + "]}");
  CHECK_THROWS_WITH_AS(run({dir.file("empty.geojson"), "", ""}),
                       doctest::Contains("has no features"), vsr::ZonalInputError);
  write_text(
      dir.file("points.geojson"),
      head +
          R"({"type":"Feature","properties":{},"geometry":{"type":"Point","coordinates":[500100,4000100]}}]})");
  CHECK_THROWS_WITH_AS(run({dir.file("points.geojson"), "", ""}),
                       doctest::Contains("not a polygon"), vsr::ZonalInputError);
  write_text(
      dir.file("line.geojson"),
      head +
          R"({"type":"Feature","properties":{},"geometry":{"type":"LineString","coordinates":[[500100,4000100],[500200,4000200]]}}]})");
  CHECK_THROWS_WITH_AS(run({dir.file("line.geojson"), "", ""}), doctest::Contains("not a polygon"),
                       vsr::ZonalInputError);
  write_text(
      dir.file("bowtie.geojson"),
      head +
          R"({"type":"Feature","properties":{},"geometry":{"type":"Polygon","coordinates":[[[500000,4000000],[500100,4000100],[500100,4000000],[500000,4000100],[500000,4000000]]]}}]})");
  CHECK_THROWS_WITH_AS(run({dir.file("bowtie.geojson"), "", ""}),
                       doctest::Contains("not a valid polygon"), vsr::ZonalInputError);
  // A null geometry is an empty zone: a zero-coverage row.
  write_text(dir.file("null.geojson"),
             head + R"({"type":"Feature","properties":{"id":3},"geometry":null}]})");
  const auto t = run({dir.file("null.geojson"), "", "id"});
  REQUIRE(t.rows() == 2);
  CHECK(t.column("count")[0] == 0);
  CHECK(std::isnan(t.column("sum")[0]));
}

TEST_CASE("write_zonal_table: JSON and CSV all or nothing, other extensions refused") {
  vsr_test::TempDir dir("vsr-zonal");
  vsr::ZonalOptions o;
  o.stats = {"count", "mean"};
  vsr::ZoneSet zones;
  zones.geometries = test_zones();
  const auto t = vsr::zonal_stats(values_raster(), zones, o);
  vsr::write_zonal_table(t, dir.file("out.json"));
  vsr::write_zonal_table(t, dir.file("out.CSV"));
  std::ifstream json(dir.file("out.json")), csv(dir.file("out.CSV"));
  const std::string j((std::istreambuf_iterator<char>(json)), {}),
      c((std::istreambuf_iterator<char>(csv)), {});
  CHECK(j == vsr::zonal_table_json(t));
  CHECK(c == vsr::zonal_table_csv(t));
  CHECK(j.find("\"zone\": 2, \"band\": 2, \"count\": 0, \"mean\": null}") != std::string::npos);
  CHECK_THROWS_AS(vsr::write_zonal_table(t, dir.file("out.txt")), vsr::ZonalInputError);
  CHECK(!std::filesystem::exists(dir.file("out.txt")));
  CHECK_THROWS_AS(vsr::write_zonal_table(t, dir.file("out.json"), false), std::system_error);
}
