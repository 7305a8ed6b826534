// SPDX-License-Identifier: Apache-2.0
// Outputs that must not be lost or left behind: drivers that write no file, unverified
// temporaries, every Create-capable GDAL driver, an unavailable GTiff, stale temporaries of
// killed writers (and live ones kept), targets that are not regular files, concurrent writers,
// and host memory (streamed runs hold no tile list). Inputs are made with GDAL's own C API.
#include "files/output_file.hpp"
#include "temp_dir.hpp"

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/dispatch.hpp>
#include <vibespatial/raster/io.hpp>
#include <vibespatial/raster/ops.hpp>

#include <doctest/doctest.h>

#include <cpl_conv.h>
#include <cpl_error.h>
#include <gdal.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace vibespatial::raster;
namespace fs = std::filesystem;

namespace {

/// A fresh directory removed at the end of the test case.
struct TempDir : vsr_test::TempDir {
  TempDir() : vsr_test::TempDir("vsr-out") {}
};

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> v;
  for (const auto& e : fs::directory_iterator(dir)) v.push_back(e.path().filename().string());
  std::sort(v.begin(), v.end());
  return v;
}

std::string bytes_of_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

void put_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

/// A 1-band float32 GeoTIFF made with GDAL, nodata -9999 every 7th pixel.
void make_input(const std::string& path, int width, int height) {
  GDALAllRegister();
  GDALDatasetH ds = GDALCreate(GDALGetDriverByName("GTiff"), path.c_str(), width, height, 1,
                               GDT_Float32, nullptr);
  REQUIRE(ds != nullptr);
  std::array<double, 6> gt{500000, 10, 0, 5000000, 0, -10};
  REQUIRE(GDALSetGeoTransform(ds, gt.data()) == CE_None);
  GDALRasterBandH band = GDALGetRasterBand(ds, 1);
  REQUIRE(GDALSetRasterNoDataValue(band, -9999) == CE_None);
  std::vector<float> px(static_cast<std::size_t>(width * height));
  for (std::size_t i = 0; i < px.size(); ++i) {
    px[i] = i % 7 == 0 ? -9999.0F : static_cast<float>((i * 37) % 1001) * 0.25F;
  }
  REQUIRE(GDALRasterIO(band, GF_Write, 0, 0, width, height, px.data(), width, height, GDT_Float32,
                       0, 0) == CE_None);
  GDALClose(ds);
}

OwnedRasterArray small_raster(std::optional<double> nodata = -9999.0) {
  std::vector<float> px(12 * 10);
  for (std::size_t i = 0; i < px.size(); ++i) {
    px[i] = i % 5 == 0 ? -9999.0F : static_cast<float>(i) * 0.5F;
  }
  return OwnedRasterArray::from_host(px.data(), DType::float32, 1, 10, 12, nodata,
                                     Affine{10, 0, 500000, 0, -10, 5000000}, "EPSG:32633");
}

WriteOptions with_driver(const std::string& driver) {
  WriteOptions w;
  w.driver = driver;
  return w;
}

/// The pixels of band 1 of @p path, read with GDAL, and its nodata (NaN when none).
std::vector<float> gdal_pixels(const std::string& path, double* nodata = nullptr) {
  GDALDatasetH ds = GDALOpen(path.c_str(), GA_ReadOnly);
  REQUIRE(ds != nullptr);
  GDALRasterBandH band = GDALGetRasterBand(ds, 1);
  const int w = GDALGetRasterXSize(ds), h = GDALGetRasterYSize(ds);
  std::vector<float> px(static_cast<std::size_t>(w * h));
  REQUIRE(GDALRasterIO(band, GF_Read, 0, 0, w, h, px.data(), w, h, GDT_Float32, 0, 0) == CE_None);
  int has = 0;
  const double nd = GDALGetRasterNoDataValue(band, &has);
  if (nodata != nullptr) *nodata = has != 0 ? nd : std::nan("");
  GDALClose(ds);
  return px;
}

const BandOp focal = [](const OwnedRasterArray& t) { return focal_mean_3x3(t); };

RasterPlan tiled_plan(std::int64_t side) {
  RasterPlan plan;
  plan.strategy = TilingStrategy::tiled;
  plan.tile_shape = std::pair<std::int64_t, std::int64_t>{side, side};
  plan.bands_per_pass = 1;
  plan.halo = 1;
  return plan;
}

}  // namespace

TEST_CASE("a driver that writes no file is refused before anything is touched") {
  TempDir dir;
  const std::string in = dir.file("in.tif");
  make_input(in, 40, 30);
  const std::string before = bytes_of_file(in);
  const OwnedRasterArray r = small_raster();
  for (const char* driver : {"MEM", "mem", "NGW"}) {
    CAPTURE(driver);
    const WriteOptions w = with_driver(driver);
    // Over an existing file (the input itself), and as a new file.
    CHECK_THROWS_AS(write_raster(in, r, w), std::invalid_argument);
    CHECK_THROWS_AS(write_raster(dir.file("new.tif"), r, w), std::invalid_argument);
    CHECK_THROWS_AS(check_write_options(w), std::invalid_argument);
    StreamOptions s;
    s.write = w;
    s.write.overwrite = true;
    int calls = 0;
    const BandOp counted = [&](const OwnedRasterArray& t) {
      ++calls;
      return focal_mean_3x3(t);
    };
    CHECK_THROWS_AS(process_raster_file(in, in, counted, RasterPlan{}, s), std::invalid_argument);
    CHECK(calls == 0);  // refused before any tile was read
    CHECK(bytes_of_file(in) == before);
    CHECK(names_in(dir.path) == std::vector<std::string>{"in.tif"});
  }
  CHECK_THROWS_WITH_AS(write_raster(in, r, with_driver("MEM")),
                       doctest::Contains("write_raster: GDAL's MEM driver keeps the raster in "
                                         "memory and writes no file"),
                       std::invalid_argument);
  // PNG and JPEG have only CreateCopy: written through a staged GeoTIFF (tested below).
  CHECK_NOTHROW(check_write_options(with_driver("PNG")));
}

// --- drivers with CreateCopy only, overviews
// ------------------------------------------------------

namespace {

/// A @p width x @p height float32 raster of smooth values, nodata -9999 every 11th pixel.
OwnedRasterArray ramp_raster(std::int64_t width, std::int64_t height) {
  std::vector<float> px(static_cast<std::size_t>(width * height));
  for (std::size_t i = 0; i < px.size(); ++i) {
    const auto x = static_cast<std::int64_t>(i) % width, y = static_cast<std::int64_t>(i) / width;
    px[i] = i % 11 == 0 ? -9999.0F : static_cast<float>(x + 2 * y) * 0.5F;
  }
  return OwnedRasterArray::from_host(px.data(), DType::float32, 1, height, width, -9999.0,
                                     Affine{10, 0, 500000, 0, -10, 5000000}, "EPSG:32633");
}

/// 3 bands of uint8, no nodata.
OwnedRasterArray rgb_raster(std::int64_t width, std::int64_t height) {
  std::vector<std::uint8_t> px(static_cast<std::size_t>(3 * width * height));
  for (std::size_t i = 0; i < px.size(); ++i) px[i] = static_cast<std::uint8_t>((i * 7) % 251);
  return OwnedRasterArray::from_host(px.data(), DType::uint8, 3, height, width, std::nullopt,
                                     Affine{10, 0, 500000, 0, -10, 5000000}, "EPSG:32633");
}

int overview_count(const std::string& path) {
  GDALDatasetH ds = GDALOpen(path.c_str(), GA_ReadOnly);
  REQUIRE(ds != nullptr);
  const int n = GDALGetOverviewCount(GDALGetRasterBand(ds, 1));
  GDALClose(ds);
  return n;
}

std::string driver_of(const std::string& path) {
  GDALDatasetH ds = GDALOpen(path.c_str(), GA_ReadOnly);
  REQUIRE(ds != nullptr);
  const std::string name = GDALGetDriverShortName(GDALGetDatasetDriver(ds));
  GDALClose(ds);
  return name;
}

constexpr const char* cog_validator =
    "/usr/lib/python3/dist-packages/osgeo_utils/samples/validate_cloud_optimized_geotiff.py";

/// What GDAL's validate_cloud_optimized_geotiff.py says of @p path (stdout and stderr) and its
/// exit status; empty when /usr/bin/python3 or the script (osgeo_utils) is missing.
std::optional<std::pair<int, std::string>> validate_cog(const std::string& path) {
  if (::access("/usr/bin/python3", X_OK) != 0 || ::access(cog_validator, R_OK) != 0) {
    return std::nullopt;
  }
  const std::string cmd = std::string("/usr/bin/python3 ") + cog_validator + " '" + path + "' 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
  const int status = ::pclose(p);
  return std::pair<int, std::string>{WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace

TEST_CASE("COG: a staged GeoTIFF converted, overviews, a valid cloud optimized GeoTIFF") {
  TempDir dir;
  const std::string out = dir.file("out.tif");
  const OwnedRasterArray r = ramp_raster(2000, 2000);
  WriteOptions w = with_driver("COG");
  write_raster(out, r, w);
  CHECK(names_in(dir.path) == std::vector<std::string>{"out.tif"});  // no staged file left
  CHECK(driver_of(out) == "GTiff");
  CHECK(overview_count(out) == 3);  // 1000, 500, 250: until a level fits a 256 x 256 block
  double nd = 0;
  const std::vector<float> back = gdal_pixels(out, &nd);
  CHECK(nd == -9999.0);
  CHECK(std::memcmp(back.data(), r.host_data(), back.size() * sizeof(float)) == 0);
  if (const auto v = validate_cog(out)) {
    CAPTURE(v->second);
    CHECK(v->first == 0);
    CHECK(v->second.find("is a valid cloud optimized GeoTIFF") != std::string::npos);
    CHECK(v->second.find("WARNING") == std::string::npos);
    CHECK(v->second.find("ERROR") == std::string::npos);
  } else {
    MESSAGE("skipped the COG validation: /usr/bin/python3 or osgeo_utils is missing");
  }
  // Listed levels (built on the staged file, kept by COG), none, and the streamed writer.
  w.overviews = "2,4";
  w.resampling = "average";
  write_raster(out, r, w);
  CHECK(overview_count(out) == 2);
  if (const auto v = validate_cog(out)) CHECK(v->first == 0);
  w.overviews = "none";
  w.resampling.clear();
  write_raster(out, r, w);
  CHECK(overview_count(out) == 0);
  const std::string in = dir.file("in.tif");
  make_input(in, 700, 600);
  StreamOptions s;
  s.write = with_driver("cog");
  process_raster_file(in, dir.file("streamed.tif"), focal, tiled_plan(128), s);
  CHECK(overview_count(dir.file("streamed.tif")) == 2);  // 350 x 300, 175 x 150
  if (const auto v = validate_cog(dir.file("streamed.tif"))) {
    CAPTURE(v->second);
    CHECK(v->first == 0);
    CHECK(v->second.find("WARNING") == std::string::npos);
  }
  CHECK(names_in(dir.path) == std::vector<std::string>{"in.tif", "out.tif", "streamed.tif"});
  CHECK_NOTHROW(check_output_file(dir.file("t.tif"), with_driver("COG"), DType::float32, 3,
                                  NodataValue(-9999.0)));
  CHECK(names_in(dir.path) == std::vector<std::string>{"in.tif", "out.tif", "streamed.tif"});
}

TEST_CASE("PNG and JPEG are written through a staged GeoTIFF; a failed CreateCopy leaves nothing") {
  TempDir dir;
  const OwnedRasterArray rgb = rgb_raster(64, 48);
  const std::string png = dir.file("out.png");
  write_raster(png, rgb, with_driver("PNG"));
  CHECK(driver_of(png) == "PNG");
  {
    const OwnedRasterArray back = read_raster(png, std::nullopt, {}, {.drivers = {"PNG"}});
    REQUIRE(back.band_count() == 3);
    CHECK(std::memcmp(back.host_data(), rgb.host_data(), rgb.byte_size()) == 0);
    CHECK(back.affine() == rgb.affine());  // georeferencing in the .aux.xml written with it
  }
  CHECK(output_driver_for(png) == "PNG");
  CHECK(output_driver_for(dir.file("x.jpg")) == "JPEG");
  // A 1-band uint8 with nodata keeps it; the sink (a streamed run) writes PNG too.
  write_raster(png, rgb.band(0).with_nodata(NodataValue(0.0)), with_driver("PNG"));
  CHECK(read_raster_info(png, {.drivers = {"PNG"}}).band_nodata[0] == NodataValue(0.0));
  const std::string jpg = dir.file("out.jpg");
  write_raster(jpg, rgb, with_driver("JPEG"));
  CHECK(driver_of(jpg) == "JPEG");
  const std::vector<std::string> kept = names_in(dir.path);
  const std::string before = bytes_of_file(jpg);
  // JPEG refuses 2 bands in its CreateCopy: nothing is left, the old file is kept.
  const OwnedRasterArray two = OwnedRasterArray::from_host(rgb.host_data(), DType::uint8, 2, 48, 64,
                                                           std::nullopt, rgb.affine(), rgb.crs());
  CHECK_THROWS_WITH_AS(write_raster(jpg, two, with_driver("JPEG")),
                       doctest::Contains("JPEG driver cannot convert"), std::runtime_error);
  CHECK(bytes_of_file(jpg) == before);
  CHECK(names_in(dir.path) == kept);
  CHECK_THROWS_AS(check_output_file(dir.file("n.jpg"), with_driver("JPEG"), DType::uint8, 2),
                  std::invalid_argument);
  // What the driver does not create is refused before anything is touched.
  CHECK_THROWS_WITH_AS(write_raster(jpg, ramp_raster(8, 8), with_driver("JPEG")),
                       doctest::Contains("cannot write float32"), std::invalid_argument);
  // A lossy JPEG cannot keep nodata pixels apart.
  CHECK_THROWS_WITH_AS(
      check_output_file(dir.file("n.jpg"), with_driver("JPEG"), DType::uint8, 1, NodataValue(0.0)),
      doctest::Contains("lossily"), std::invalid_argument);
  CHECK(bytes_of_file(jpg) == before);
  CHECK(names_in(dir.path) == kept);
}

TEST_CASE("a COG write that fails after the staged GeoTIFF leaves nothing") {
  TempDir dir;
  const std::string out = dir.file("out.tif");
  put_file(out, "old bytes");
  // A fault in the conversion: the staged file is written, then COG's CreateCopy fails (a tiling
  // scheme it does not know: its option list takes any string, the conversion refuses it).
  WriteOptions w = with_driver("COG");
  w.creation_options = {"TILING_SCHEME=NoSuchScheme"};
  CHECK_THROWS_AS(write_raster(out, ramp_raster(300, 200), w), std::runtime_error);
  CHECK(bytes_of_file(out) == "old bytes");
  CHECK(names_in(dir.path) == std::vector<std::string>{"out.tif"});
}

TEST_CASE("overviews and resampling: built before the commit, checked up front") {
  TempDir dir;
  const OwnedRasterArray r = ramp_raster(600, 500);
  WriteOptions w;
  w.overviews = "auto";  // 300 x 250, 150 x 125
  write_raster(dir.file("a.tif"), r, w);
  CHECK(overview_count(dir.file("a.tif")) == 2);
  w.overviews = "2,4,8";
  w.resampling = "AVERAGE";
  write_raster(dir.file("a.tif"), r, w);
  CHECK(overview_count(dir.file("a.tif")) == 3);
  CHECK(names_in(dir.path) == std::vector<std::string>{"a.tif"});  // inside the GeoTIFF
  // A format without internal overviews gets an external .ovr, written and replaced with it; a
  // later write without overviews removes it (it would apply to the new file).
  WriteOptions envi = with_driver("ENVI");
  envi.overviews = "2";
  write_raster(dir.file("e.img"), r, envi);
  CHECK(fs::exists(dir.file("e.img.ovr")));
  CHECK(overview_count(dir.file("e.img")) == 1);
  envi.overviews.clear();
  write_raster(dir.file("e.img"), r, envi);
  CHECK_FALSE(fs::exists(dir.file("e.img.ovr")));
  CHECK(overview_count(dir.file("e.img")) == 0);
  for (const char* bad : {"1", "0", "2,x", "two", "2,,4", "2,2", ",", "-2", "auto,2"}) {
    CAPTURE(bad);
    WriteOptions b;
    b.overviews = bad;
    CHECK_THROWS_AS(check_write_options(b), std::invalid_argument);
    CHECK_THROWS_AS(write_raster(dir.file("b.tif"), r, b), std::invalid_argument);
  }
  WriteOptions b;
  b.resampling = "bogus";
  CHECK_THROWS_WITH_AS(check_write_options(b), doctest::Contains("unknown resampling 'bogus'"),
                       std::invalid_argument);
  for (const char* good : {"nearest", "Average", "cubic", "lanczos", "mode", "rms", "bilinear"}) {
    b.resampling = good;
    CHECK_NOTHROW(check_write_options(b));
  }
  CHECK_FALSE(fs::exists(dir.file("b.tif")));
}

TEST_CASE("commit never puts an unverified file in place") {
  TempDir dir;
  const std::string target = dir.file("t.tif");
  put_file(target, "old bytes");
  {
    // The writer wrote nothing at all.
    detail::PendingOutput p(target);
    CHECK_THROWS_WITH_AS(p.commit(true), doctest::Contains("wrote no file"), std::runtime_error);
  }
  CHECK(bytes_of_file(target) == "old bytes");
  CHECK(names_in(dir.path) == std::vector<std::string>{"t.tif"});
  {
    // The writer left its file empty.
    detail::PendingOutput p(target);
    put_file(p.path(), "");
    CHECK_THROWS_WITH_AS(p.commit(true), doctest::Contains("empty"), std::runtime_error);
  }
  CHECK(bytes_of_file(target) == "old bytes");
  CHECK(names_in(dir.path) == std::vector<std::string>{"t.tif"});
  {
    // The writer made a directory where the file goes (Zarr does).
    detail::PendingOutput p(target);
    fs::create_directories(p.path() + "/.zarray");
    CHECK_THROWS_WITH_AS(p.commit(true), doctest::Contains("not a regular file"),
                         std::runtime_error);
  }
  CHECK(bytes_of_file(target) == "old bytes");
  CHECK(names_in(dir.path) == std::vector<std::string>{"t.tif"});
  {
    // The writer wrote its sidecars only.
    detail::PendingOutput p(target);
    put_file(fs::path(p.path()).replace_extension(".hdr").string(), "header");
    CHECK_THROWS_WITH_AS(p.commit(true), doctest::Contains("(only t.hdr)"), std::runtime_error);
  }
  CHECK(names_in(dir.path) == std::vector<std::string>{"t.tif"});
  {
    // A written file with a sidecar: both land, under the target's names.
    detail::PendingOutput p(target);
    put_file(p.path(), "new bytes");
    put_file(fs::path(p.path()).replace_extension(".hdr").string(), "header");
    p.commit(true);
  }
  CHECK(bytes_of_file(target) == "new bytes");
  CHECK(bytes_of_file(dir.file("t.hdr")) == "header");
  CHECK(names_in(dir.path) == std::vector<std::string>{"t.hdr", "t.tif"});
  // An empty text output is a legitimate file.
  write_file_atomically(dir.file("e.json"), "");
  CHECK(fs::file_size(dir.file("e.json")) == 0);
  // MEM through the public call, with a dataset that closes cleanly: nothing replaced.
  CHECK_THROWS(write_raster(target, small_raster(), with_driver("MEM")));
  CHECK(bytes_of_file(target) == "new bytes");
}

TEST_CASE("GeoPackage and every other Create-capable driver write, or refuse with a reason") {
  TempDir dir;
  const OwnedRasterArray r = small_raster();
  std::vector<float> want(static_cast<std::size_t>(r.byte_size() / 4));
  r.copy_to_host(want.data());
  GDALAllRegister();
  int written = 0;
  for (int i = 0; i < GDALGetDriverCount(); ++i) {
    GDALDriverH d = GDALGetDriver(i);
    if (GDALGetMetadataItem(d, GDAL_DCAP_RASTER, nullptr) == nullptr ||
        GDALGetMetadataItem(d, GDAL_DCAP_CREATE, nullptr) == nullptr) {
      continue;
    }
    const std::string name = GDALGetDriverShortName(d);
    CAPTURE(name);
    const char* exts = GDALGetMetadataItem(d, GDAL_DMD_EXTENSIONS, nullptr);
    std::string ext = exts != nullptr ? exts : "";
    ext = ext.substr(0, ext.find(' '));
    const fs::path sub = dir.path / name;
    fs::create_directories(sub);
    const std::string out = (sub / ("o." + (ext.empty() ? std::string("out") : ext))).string();
    // The trial predicts the write: what it accepts writes and reads back as written.
    bool accepted = true;
    try {
      check_output_file(out, with_driver(name), DType::float32, 1, NodataValue(-9999.0),
                        "EPSG:32633");
    } catch (const std::invalid_argument& e) {
      accepted = false;
      CHECK(std::string(e.what()).rfind("check_output_file: ", 0) == 0);
    }
    CHECK(names_in(sub).empty());
    bool ok = true;
    std::string why;
    try {
      write_raster(out, r, with_driver(name));
    } catch (const std::exception& e) {
      ok = false;
      why = e.what();
    }
    CAPTURE(why);
    if (!ok) {
      CHECK(!accepted);
      CHECK(!why.empty());
      CHECK(names_in(sub).empty());  // nothing of the failed write is left
      continue;
    }
    ++written;
    double nodata = 0;
    const std::vector<float> got = gdal_pixels(out, &nodata);
    REQUIRE(got.size() == want.size());
    CHECK(nodata == -9999.0);
    CHECK(std::equal(got.begin(), got.end(), want.begin()));
    for (const std::string& n : names_in(sub)) CHECK(n.find(".vsr-") == std::string::npos);
  }
  CHECK(written >= 10);
  // GeoPackage in particular, which refused to create over the temporary file.
  const std::string gpkg = dir.file("g.gpkg");
  CHECK_NOTHROW(write_raster(gpkg, r, with_driver("GPKG")));
  CHECK(gdal_pixels(gpkg) == want);
  const std::string in = dir.file("in.tif");
  make_input(in, 40, 30);
  StreamOptions s;
  s.write = with_driver("GPKG");
  const BandOp clip01 = [](const OwnedRasterArray& t) { return clip(t, 0, 100); };
  CHECK_NOTHROW(process_raster_file(in, dir.file("s.gpkg"), clip01, tiled_plan(16), s));
  double nodata = 0;
  const std::vector<float> streamed = gdal_pixels(dir.file("s.gpkg"), &nodata);
  CHECK(nodata == -9999.0);
  CHECK(std::count(streamed.begin(), streamed.end(), -9999.0F) == (40 * 30 + 6) / 7);
}

TEST_CASE("drivers that lose nodata or pixels are refused by the trial") {
  TempDir dir;
  // GSBG keeps its own nodata (1.70141e38): -9999 pixels would read as valid values.
  CHECK_THROWS_WITH_AS(check_output_file(dir.file("o.grd"), with_driver("GSBG"), DType::float32, 1,
                                         NodataValue(-9999.0)),
                       doctest::Contains("does not keep band 1's nodata -9999"),
                       std::invalid_argument);
  // A float NaN nodata the driver cannot record is no loss: NaN pixels are invalid all the same.
  CHECK_NOTHROW(check_output_file(dir.file("n.gpkg"), with_driver("GPKG"), DType::float32, 1,
                                  NodataValue(std::nan(""))));
  // GeoPackage reads 3 bands of uint8 back as RGBA.
  CHECK_THROWS_WITH_AS(check_output_file(dir.file("o.gpkg"), with_driver("GPKG"), DType::uint8, 3),
                       doctest::Contains("reads back 4 band(s)"), std::invalid_argument);
  // A dtype the driver does not create, before anything is made.
  CHECK_THROWS_WITH_AS(check_output_file(dir.file("o.bmp"), with_driver("BMP"), DType::float32, 1),
                       doctest::Contains("cannot write float32"), std::invalid_argument);
  CHECK(names_in(dir.path).empty());
  // A target that exists without overwrite, and a directory that takes no temporary.
  put_file(dir.file("x.tif"), "x");
  WriteOptions keep;
  keep.overwrite = false;
  CHECK_THROWS_AS(check_output_file(dir.file("x.tif"), keep, DType::float32, 1),
                  std::runtime_error);
  CHECK_THROWS_WITH_AS(check_output_file(dir.file("no/such/x.tif"), {}, DType::float32, 1),
                       doctest::Contains("cannot create a temporary directory"),
                       std::runtime_error);
  CHECK(names_in(dir.path) == std::vector<std::string>{"x.tif"});
}

TEST_CASE("an unavailable GTiff driver is named as such, and driver names take any case") {
  TempDir dir;
  GDALAllRegister();
  GDALDriverH gtiff = GDALGetDriverByName("GTiff");
  REQUIRE(gtiff != nullptr);
  GDALDeregisterDriver(gtiff);
  CPLSetConfigOption("GDAL_SKIP", "GTiff");
  const auto restore = [&] {
    CPLSetConfigOption("GDAL_SKIP", nullptr);
    GDALRegisterDriver(gtiff);
  };
  try {
    CHECK_THROWS_WITH_AS(check_write_options({}),
                         doctest::Contains("check_write_options: GDAL driver 'GTiff' is not "
                                           "available in this GDAL: GDAL_SKIP (GTiff) disables it"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(write_raster(dir.file("o.tif"), small_raster()),
                         doctest::Contains("not available in this GDAL"), std::invalid_argument);
    CPLSetConfigOption("GDAL_SKIP", nullptr);
    CHECK_THROWS_WITH_AS(check_write_options({}),
                         doctest::Contains("not available in this GDAL (it is built into every "
                                           "GDAL"),
                         std::invalid_argument);
  } catch (...) {
    restore();
    throw;
  }
  restore();
  CHECK_THROWS_WITH_AS(check_write_options(with_driver("NoSuchDriver")),
                       doctest::Contains("unknown GDAL driver 'NoSuchDriver'"),
                       std::invalid_argument);
  // "gtiff" is GTiff, with GTiff's defaults (tiled, DEFLATE).
  write_raster(dir.file("lc.tif"), small_raster(), with_driver("gtiff"));
  GDALDatasetH ds = GDALOpen(dir.file("lc.tif").c_str(), GA_ReadOnly);
  REQUIRE(ds != nullptr);
  const char* compression = GDALGetMetadataItem(ds, "COMPRESSION", "IMAGE_STRUCTURE");
  CHECK(std::string(compression != nullptr ? compression : "") == "DEFLATE");
  int bx = 0, by = 0;
  GDALGetBlockSize(GDALGetRasterBand(ds, 1), &bx, &by);
  CHECK(bx == 256);
  CHECK(by == 256);
  GDALClose(ds);
}

namespace {

/// The hidden temporaries (any naming, old or new) of writes to @p name in @p dir.
std::vector<std::string> temporaries(const fs::path& dir, const std::string& name) {
  const std::string stem = fs::path(name).stem().string();
  std::vector<std::string> v;
  for (const std::string& n : names_in(dir)) {
    if (n.rfind("." + name + ".vsr-", 0) == 0 || n.rfind("." + stem + ".vsr-", 0) == 0) {
      v.push_back(n);
    }
  }
  return v;
}

/// Forks a writer that starts an output to @p target, writes its file and then dies of SIGKILL
/// (the temporary survives it).
void killed_writer(const std::string& target) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    detail::PendingOutput p(target);
    if (std::FILE* f = std::fopen(p.path().c_str(), "wb"); f != nullptr) {
      std::fputs("partial", f);
      std::fclose(f);
    }
    ::raise(SIGKILL);
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFSIGNALED(status));
  REQUIRE(WTERMSIG(status) == SIGKILL);
}

/// A fake temporary directory of a write to @p target with the owner record @p record, unlocked.
std::string fake_temporary(const std::string& dir, const std::string& name,
                           const std::string& suffix, const std::string& record) {
  const std::string t = dir + "/." + name + ".vsr-" + suffix;
  fs::create_directories(t + "/data");
  put_file(t + "/data/" + name, "partial");
  put_file(t + "/owner", record);
  return t;
}

std::string first_line_of(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

std::string my_start_time() {
  const std::string stat = first_line_of("/proc/self/stat");
  std::istringstream rest(stat.substr(stat.rfind(')') + 2));
  std::string field;
  for (int i = 3; i <= 22; ++i) rest >> field;
  return field;
}

std::string record(long pid, const std::string& start, const std::string& boot,
                   const std::string& host) {
  return "vibespatial-raster temporary output\npid " + std::to_string(pid) + "\nstart " + start +
         "\nboot " + boot + "\nhost " + host + "\ntarget x\n";
}

}  // namespace

TEST_CASE("a killed writer's temporary is removed by the next write, a live one never") {
  TempDir dir;
  const std::string target = dir.file("t.tif");
  const OwnedRasterArray r = small_raster();
  killed_writer(target);
  REQUIRE(temporaries(dir.path, "t.tif").size() == 1);
  write_raster(target, r);
  CHECK(names_in(dir.path) == std::vector<std::string>{"t.tif"});

  // A live writer in another process: its temporary survives a write to the same target.
  int to_child[2], from_child[2];
  REQUIRE(::pipe(to_child) == 0);
  REQUIRE(::pipe(from_child) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(to_child[1]);
    ::close(from_child[0]);
    {
      detail::PendingOutput p(target);
      put_file(p.path(), "live");
      (void)!::write(from_child[1], "r", 1);
      char c = 0;
      (void)!::read(to_child[0], &c, 1);  // until the parent closes its end
    }
    ::_exit(0);
  }
  ::close(to_child[0]);
  ::close(from_child[1]);
  char c = 0;
  REQUIRE(::read(from_child[0], &c, 1) == 1);
  const std::vector<std::string> live = temporaries(dir.path, "t.tif");
  REQUIRE(live.size() == 1);
  write_raster(target, r);
  CHECK(temporaries(dir.path, "t.tif") == live);
  ::close(to_child[1]);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  ::close(from_child[0]);
  CHECK(names_in(dir.path) == std::vector<std::string>{"t.tif"});

  // Another writer of this process (another thread could hold it): kept.
  {
    detail::PendingOutput mine(target);
    put_file(mine.path(), "mine");
    write_raster(target, r);
    CHECK(fs::exists(mine.path()));
    std::thread([&] { write_raster(target, r); }).join();
    CHECK(fs::exists(mine.path()));
  }
  CHECK(names_in(dir.path) == std::vector<std::string>{"t.tif"});

  // Records: this process's pid with another start time is a reused pid (stale); this process
  // itself, unlocked as a file system without working locks would leave it, is alive (kept);
  // another boot of this host is gone (stale); another host's is never judged (kept).
  const std::string boot = first_line_of("/proc/sys/kernel/random/boot_id");
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const long me = static_cast<long>(::getpid());
  fake_temporary(dir.path.string(), "t.tif", "reused",
                 record(me, my_start_time() + "1", boot, host));
  const std::string alive =
      fake_temporary(dir.path.string(), "t.tif", "alive0", record(me, my_start_time(), boot, host));
  fake_temporary(dir.path.string(), "t.tif", "reboot",
                 record(me, my_start_time(), "another-boot", host));
  const std::string other =
      fake_temporary(dir.path.string(), "t.tif", "otherh",
                     record(me, my_start_time(), "another-boot", std::string(host) + "-elsewhere"));
  // No record at all, and another target's: kept.
  fs::create_directories(dir.file(".t.tif.vsr-norec0"));
  const std::string unrelated = fake_temporary(dir.path.string(), "u.tif", "stale0",
                                               record(me, my_start_time() + "1", boot, host));
  write_raster(target, r);
  CHECK(names_in(dir.path) == std::vector<std::string>{".t.tif.vsr-alive0", ".t.tif.vsr-norec0",
                                                       ".t.tif.vsr-otherh", ".u.tif.vsr-stale0",
                                                       "t.tif"});
  CHECK(fs::exists(alive + "/data/t.tif"));
  CHECK(fs::exists(other + "/owner"));
  CHECK(fs::exists(unrelated + "/data/u.tif"));
}

TEST_CASE("a forked child dying of a signal leaves its parent's temporaries alone") {
  TempDir dir;
  const std::string target = dir.file("t.tif");
  detail::PendingOutput mine(target);
  put_file(mine.path(), "mine");
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // A child of fork without exec (a worker pool): it inherits the registry of writes in
    // progress, which are its parent's, not its own. (The test runner's own handler goes
    // first: the library installs its handlers only over the default disposition.)
    ::signal(SIGTERM, SIG_DFL);
    remove_partial_outputs_on_signals();
    ::raise(SIGTERM);
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGTERM);
  CHECK(fs::exists(mine.path()));
  mine.commit(true);
  CHECK(bytes_of_file(target) == "mine");
}

TEST_CASE("removing a stale temporary never follows links out of it") {
  TempDir dir;
  const std::string target = dir.file("t.tif");
  const fs::path elsewhere = dir.path / "elsewhere";
  fs::create_directories(elsewhere);
  put_file((elsewhere / "precious").string(), "keep me");
  const std::string stale = record(static_cast<long>(::getpid()), my_start_time() + "1",
                                   first_line_of("/proc/sys/kernel/random/boot_id"), "any");
  // A stale temporary whose data/ is a link to another directory: the link goes, not its files.
  const std::string t = dir.file(".t.tif.vsr-linked");
  fs::create_directories(t);
  fs::create_directory_symlink(elsewhere, t + "/data");
  put_file(t + "/owner", stale);
  // A "temporary" that is itself a link to that directory, and one whose owner record is a link
  // to a record: neither is judged.
  fs::create_directory_symlink(elsewhere, dir.file(".t.tif.vsr-dirlnk"));
  const std::string u = dir.file(".t.tif.vsr-ownlnk");
  fs::create_directories(u + "/data");
  put_file(dir.file("record"), stale);
  fs::create_symlink(dir.file("record"), u + "/owner");
  write_raster(target, small_raster());
  CHECK(bytes_of_file((elsewhere / "precious").string()) == "keep me");
  CHECK(names_in(dir.path) == std::vector<std::string>{".t.tif.vsr-dirlnk", ".t.tif.vsr-ownlnk",
                                                       "elsewhere", "record", "t.tif"});
}

TEST_CASE("targets that are not regular files are refused, links are followed") {
  TempDir dir;
  const OwnedRasterArray r = small_raster();
  const std::string fifo = dir.file("pipe.tif");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THROWS_WITH_AS(write_raster(fifo, r), doctest::Contains("not a regular file"),
                       std::invalid_argument);
  CHECK_THROWS_AS(write_file_atomically(fifo, "{}"), std::invalid_argument);
  CHECK_THROWS_AS(check_output_path(fifo), std::invalid_argument);
  struct stat st {};
  REQUIRE(::lstat(fifo.c_str(), &st) == 0);
  CHECK(S_ISFIFO(st.st_mode));
  CHECK_THROWS_AS(write_raster(dir.path.string(), r), std::invalid_argument);
  CHECK_NOTHROW(check_output_path(dir.file("fresh.json")));
  CHECK(names_in(dir.path) == std::vector<std::string>{"pipe.tif"});
  // A link to the input: the streamed result replaces the file it names; the link stays.
  const std::string in = dir.file("in.tif");
  make_input(in, 40, 30);
  const std::string link = dir.file("link.tif");
  fs::create_symlink("in.tif", link);
  const OwnedRasterArray whole = focal_mean_3x3(read_raster(in));
  process_raster_streamed(in, link, focal, tiled_plan(16));
  CHECK(fs::is_symlink(link));
  std::vector<float> want(static_cast<std::size_t>(whole.byte_size() / 4));
  whole.copy_to_host(want.data());
  const std::vector<float> got = gdal_pixels(in);
  CHECK(std::equal(got.begin(), got.end(), want.begin(),
                   [](float a, float b) { return a == b || (std::isnan(a) && std::isnan(b)); }));
}

TEST_CASE("concurrent writers of one target: each all or nothing, nothing left") {
  TempDir dir;
  const std::string target = dir.file("t.tif");
  const OwnedRasterArray a = small_raster(-9999.0), b = small_raster(std::nullopt);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < 5; ++k) {
        try {
          write_raster(target, t % 2 == 0 ? a : b);
        } catch (...) {
          ++failures;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  CHECK(failures == 0);
  CHECK(names_in(dir.path) == std::vector<std::string>{"t.tif"});
  CHECK(read_raster(target).width() == 12);
  // Without overwrite exactly one writer wins.
  std::atomic<int> won{0};
  threads.clear();
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      WriteOptions w;
      w.overwrite = false;
      try {
        write_raster(dir.file("once.tif"), a, w);
        ++won;
      } catch (const std::runtime_error&) {
      }
    });
  }
  for (std::thread& t : threads) t.join();
  CHECK(won == 1);
  CHECK(names_in(dir.path) == std::vector<std::string>{"once.tif", "t.tif"});
}

TEST_CASE("streamed runs hold no tile list: a 10^9 x 10^9 VRT streams from its first tile") {
  TempDir dir;
  const std::string small = dir.file("small.tif");
  make_input(small, 64, 64);
  const std::string vrt = dir.file("big.vrt");
  put_file(
      vrt,
      "<VRTDataset rasterXSize=\"1000000000\" rasterYSize=\"1000000000\">\n"
      "  <VRTRasterBand dataType=\"Float32\" band=\"1\"><SimpleSource>\n"
      "    <SourceFilename relativeToVRT=\"1\">small.tif</SourceFilename>\n"
      "    <SourceBand>1</SourceBand><SrcRect xOff=\"0\" yOff=\"0\" xSize=\"64\" ySize=\"64\"/>\n"
      "    <DstRect xOff=\"0\" yOff=\"0\" xSize=\"64\" ySize=\"64\"/></SimpleSource>\n"
      "  </VRTRasterBand>\n</VRTDataset>\n");
  StreamOptions s;
  s.open.allow_virtual = true;
  struct Stop {};
  std::vector<TileInfo> seen;
  try {
    for_each_raster_tile(
        vrt, tiled_plan(256),
        [&](const OwnedRasterArray&, const TileInfo& where) {
          seen.push_back(where);
          if (seen.size() == 3) throw Stop{};
        },
        s);
    FAIL("the walk ended");
  } catch (const Stop&) {
  }
  REQUIRE(seen.size() == 3);
  CHECK(seen[0].total == 3906250LL * 3906250LL);
  // The tiles are tile_windows' tiles, in its order.
  const std::vector<TileWindow> first = tile_windows(600, 1000, 256, 256, 1);
  const std::string mid = dir.file("mid.tif");
  make_input(mid, 1000, 600);
  std::vector<TileInfo> all;
  for_each_raster_tile(mid, tiled_plan(256), [&](const OwnedRasterArray&, const TileInfo& where) {
    all.push_back(where);
  });
  REQUIRE(all.size() == first.size());
  for (std::size_t i = 0; i < all.size(); ++i) {
    CHECK(all[i].window == first[i].window);
    CHECK(all[i].read == first[i].read);
  }
  CHECK(seen[1].window == RasterWindow{256, 0, 256, 256});
}
