// SPDX-License-Identifier: Apache-2.0
// GDAL raster I/O: round trips of all ten dtypes, georeferencing, nodata, windows, band subsets,
// errors, and the streamed tile-by-tile path. Input files are made with GDAL's own C API.
#include "common/byte_text.hpp"
#include "temp_dir.hpp"

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/dispatch.hpp>
#include <vibespatial/raster/io.hpp>
#include <vibespatial/raster/ops.hpp>

#include <doctest/doctest.h>

#include <cpl_conv.h>
#include <cpl_error.h>
#include <cpl_string.h>
#include <gdal.h>
#include <gdal_version.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

using namespace vibespatial::raster;
namespace fs = std::filesystem;

namespace {

/// A fresh directory removed at the end of the test case.
struct TempDir : vsr_test::TempDir {
  TempDir() : vsr_test::TempDir("vsr-io") {}
};

/// Writes a float32 raster with GDAL directly (not through the library under test): a GeoTIFF,
/// or with @p driver "HFA" an Erdas Imagine file, which (unlike GTiff) keeps a nodata per band.
void make_tiff_f32(const std::string& path, int width, int height, int bands,
                   const std::array<double, 6>& gt,
                   const std::vector<std::optional<double>>& nodata,
                   const std::vector<float>& pixels, const char* wkt = nullptr,
                   const char* driver = "GTiff") {
  GDALAllRegister();
  GDALDriverH drv = GDALGetDriverByName(driver);
  REQUIRE(drv != nullptr);
  GDALDatasetH ds = GDALCreate(drv, path.c_str(), width, height, bands, GDT_Float32, nullptr);
  REQUIRE(ds != nullptr);
  std::array<double, 6> g = gt;
  REQUIRE(GDALSetGeoTransform(ds, g.data()) == CE_None);
  if (wkt != nullptr) REQUIRE(GDALSetProjection(ds, wkt) == CE_None);
  for (int b = 0; b < bands; ++b) {
    GDALRasterBandH band = GDALGetRasterBand(ds, b + 1);
    if (nodata[static_cast<std::size_t>(b)]) {
      REQUIRE(GDALSetRasterNoDataValue(band, *nodata[static_cast<std::size_t>(b)]) == CE_None);
    }
    REQUIRE(GDALRasterIO(band, GF_Write, 0, 0, width, height,
                         const_cast<float*>(pixels.data()) +
                             static_cast<std::size_t>(b) * static_cast<std::size_t>(width * height),
                         width, height, GDT_Float32, 0, 0) == CE_None);
  }
  GDALClose(ds);
}

std::vector<float> ramp(int bands, int height, int width) {
  std::vector<float> v(static_cast<std::size_t>(bands) * static_cast<std::size_t>(height * width));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 37) % 1001) * 0.5F;
  return v;
}

template <class T>
std::vector<T> as_vector(const OwnedRasterArray& r) {
  std::vector<T> v(r.byte_size() / sizeof(T));
  r.copy_to_host(v.data());
  return v;
}

std::vector<std::byte> bytes_of(const OwnedRasterArray& r) {
  std::vector<std::byte> v(r.byte_size());
  r.copy_to_host(v.data());
  return v;
}

/// Bytes of a raster with a deterministic pattern (every byte varies) for any dtype.
OwnedRasterArray pattern_raster(DType dtype, int bands, std::int64_t h, std::int64_t w,
                                std::optional<double> nodata) {
  const std::size_t n = static_cast<std::size_t>(bands * h * w) * itemsize(dtype);
  std::vector<unsigned char> raw(n);
  for (std::size_t i = 0; i < n; ++i) raw[i] = static_cast<unsigned char>((i * 131 + 7) % 251);
  if (dtype == DType::float32) {
    auto* f = reinterpret_cast<float*>(raw.data());
    for (std::size_t i = 0; i < n / 4; ++i) f[i] = static_cast<float>(i) * 0.25F - 3.0F;
  } else if (dtype == DType::float64) {
    auto* f = reinterpret_cast<double*>(raw.data());
    for (std::size_t i = 0; i < n / 8; ++i) f[i] = static_cast<double>(i) * 1e-3 - 1.0;
  }
  return OwnedRasterArray::from_host(raw.data(), dtype, bands, h, w, nodata,
                                     Affine{0.5, 0, 1000, 0, -0.5, 2000}, "EPSG:32633");
}

WriteOptions driver_options(const std::string& driver) {
  WriteOptions w;
  w.driver = driver;
  return w;
}

/// Whether @p s is valid UTF-8 with no C0/C1 control character and no DEL (checked here, apart
/// from the library's escaping code).
bool clean_utf8(const std::string& s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = c < 0x80           ? 1
                    : (c >> 5) == 0x6  ? 2
                    : (c >> 4) == 0xE  ? 3
                    : (c >> 3) == 0x1E ? 4
                                       : 0;
    if (n == 0 || i + n > s.size()) return false;
    std::uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1FU) : n == 3 ? (c & 0x0FU) : (c & 0x07U);
    for (std::size_t k = 1; k < n; ++k) {
      const auto t = static_cast<unsigned char>(s[i + k]);
      if ((t & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (t & 0x3FU);
    }
    if (cp < 0x20 || (cp >= 0x7F && cp <= 0x9F)) return false;
    i += n;
  }
  return true;
}

}  // namespace

TEST_CASE("io_available is true in a GDAL build") {
  CHECK(io_available());
}

TEST_CASE("all ten dtypes round-trip with nodata, affine and CRS") {
  TempDir dir;
  const struct {
    DType dtype;
    std::optional<double> nodata;
  } cases[] = {
      {DType::uint8, 255},
      {DType::int8, -128},
      {DType::uint16, 65535},
      {DType::int16, -9999},
      {DType::uint32, 4294967295.0},
      {DType::int32, -2147483648.0},
      {DType::uint64, 18446744073709549568.0},  // exactly representable in double
      {DType::int64, -9223372036854775808.0},
      {DType::float32, std::numeric_limits<double>::quiet_NaN()},
      {DType::float64, -1e300},
  };
  for (const auto& c : cases) {
    CAPTURE(to_string(c.dtype));
    const OwnedRasterArray src = pattern_raster(c.dtype, 3, 37, 53, c.nodata);
    const std::string path = dir.file(std::string(to_string(c.dtype)) + ".tif");
    write_raster(path, src);
    const RasterMetadata meta = read_raster_metadata(path);
    CHECK(meta.dtype == c.dtype);
    CHECK(meta.band_count == 3);
    CHECK(meta.height == 37);
    CHECK(meta.width == 53);
    CHECK(meta.driver == "GTiff");
    CHECK(same_nodata(meta.nodata, c.nodata));
    CHECK(meta.affine == src.affine());
    CHECK(meta.crs.find("32633") != std::string::npos);
    const OwnedRasterArray back = read_raster(path);
    CHECK(back.dtype() == c.dtype);
    CHECK(same_nodata(back.nodata(), c.nodata));
    CHECK(bytes_of(back) == bytes_of(src));
  }
}

TEST_CASE("int8 is stored as GDAL Int8, or as Byte with PIXELTYPE=SIGNEDBYTE before GDAL 3.7") {
  TempDir dir;
  const std::int8_t px[4] = {-128, -1, 0, 127};
  const OwnedRasterArray src = OwnedRasterArray::from_host(px, DType::int8, 1, 2, 2, -1.0);
  const std::string path = dir.file("i8.tif");
  write_raster(path, src);
  GDALDatasetH ds = GDALOpen(path.c_str(), GA_ReadOnly);
  REQUIRE(ds != nullptr);
  GDALRasterBandH band = GDALGetRasterBand(ds, 1);
#if GDAL_VERSION_NUM >= GDAL_COMPUTE_VERSION(3, 7, 0)
  CHECK(GDALGetRasterDataType(band) == GDT_Int8);
#else
  CHECK(GDALGetRasterDataType(band) == GDT_Byte);
  const char* pt = GDALGetMetadataItem(band, "PIXELTYPE", "IMAGE_STRUCTURE");
  REQUIRE(pt != nullptr);
  CHECK(std::string(pt) == "SIGNEDBYTE");
  // Other drivers have no signed-byte marker: int8 is rejected with a clear message.
  CHECK_THROWS_WITH_AS(write_raster(dir.file("i8.img"), src, driver_options("HFA")),
                       doctest::Contains("int8 needs GDAL >= 3.7"), std::invalid_argument);
#endif
  GDALClose(ds);
  const OwnedRasterArray back = read_raster(path);
  CHECK(back.dtype() == DType::int8);
  CHECK(back.nodata() == std::optional<double>(-1.0));
  CHECK(as_vector<std::int8_t>(back) == std::vector<std::int8_t>(px, px + 4));
}

TEST_CASE("geotransform <-> affine is exact, rotation terms included") {
  TempDir dir;
  const std::array<double, 6> gt = {100.5, 0.25, 0.0125, 200.75, -0.03125, -0.5};
  const std::string path = dir.file("gt.tif");
  make_tiff_f32(path, 8, 6, 1, gt, {std::nullopt}, ramp(1, 6, 8));
  const RasterMetadata meta = read_raster_metadata(path);
  CHECK(meta.affine == Affine{0.25, 0.0125, 100.5, -0.03125, -0.5, 200.75});
  CHECK(!meta.nodata.has_value());
  CHECK(meta.crs.empty());

  const std::string copy = dir.file("gt2.tif");
  write_raster(copy, read_raster(path));
  GDALDatasetH ds = GDALOpen(copy.c_str(), GA_ReadOnly);
  REQUIRE(ds != nullptr);
  std::array<double, 6> back{};
  REQUIRE(GDALGetGeoTransform(ds, back.data()) == CE_None);
  GDALClose(ds);
  CHECK(back == gt);
}

TEST_CASE("nodata: NaN on multi-band float32, integer, absent, and disagreeing bands") {
  TempDir dir;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::array<double, 6> gt = {0, 1, 0, 0, 0, -1};
  const std::string p_nan = dir.file("nan.tif");
  make_tiff_f32(p_nan, 4, 3, 3, gt, {nan, nan, nan}, ramp(3, 3, 4));
  // The reference failed here (float32 NaN sentinels compared with ==).
  const OwnedRasterArray r = read_raster(p_nan);
  REQUIRE(r.nodata().has_value());
  CHECK(std::isnan(*r.nodata()));
  const OwnedRasterArray stacked = OwnedRasterArray::from_band_stack({r.band(0), r.band(2)}, r);
  CHECK(stacked.band_count() == 2);

  const std::string p_int = dir.file("int.tif");
  make_tiff_f32(p_int, 4, 3, 2, gt, {-9999.0, -9999.0}, ramp(2, 3, 4));
  CHECK(read_raster_metadata(p_int).nodata == std::optional<double>(-9999.0));

  // HFA (not a default input format: its header can name a spill file) keeps a nodata per band.
  const std::string p_mixed = dir.file("mixed.img");
  make_tiff_f32(p_mixed, 4, 3, 3, gt, {-1.0, -1.0, -2.0}, ramp(3, 3, 4), nullptr, "HFA");
  const OpenOptions hfa{.drivers = {"HFA"}};
  CHECK_THROWS_WITH_AS(read_raster_metadata(p_mixed, hfa),
                       doctest::Contains("different nodata value"), std::runtime_error);
  CHECK_THROWS_AS(read_raster(p_mixed, {}, {}, hfa), std::runtime_error);
  // Bands that agree can still be read on their own.
  CHECK(read_raster(p_mixed, {}, {1, 2}, hfa).nodata() == std::optional<double>(-1.0));
  CHECK(read_raster(p_mixed, {}, {3}, hfa).nodata() == std::optional<double>(-2.0));
}

TEST_CASE("windows and band subsets") {
  TempDir dir;
  const int H = 20, W = 30, B = 3;
  const std::vector<float> px = ramp(B, H, W);
  const std::string path = dir.file("win.tif");
  make_tiff_f32(path, W, H, B, {10, 2, 0, 50, 0, -3}, {std::nullopt, std::nullopt, std::nullopt},
                px);
  const OwnedRasterArray r = read_raster(path, RasterWindow{5, 7, 11, 4}, {3, 1, 3});
  CHECK(r.band_count() == 3);
  CHECK(r.height() == 4);
  CHECK(r.width() == 11);
  CHECK(r.affine() == Affine{2, 0, 20, 0, -3, 29});
  const std::vector<float> got = as_vector<float>(r);
  const int band_of[3] = {2, 0, 2};
  for (int b = 0; b < 3; ++b) {
    for (int y = 0; y < 4; ++y) {
      for (int x = 0; x < 11; ++x) {
        CHECK(got[static_cast<std::size_t>((b * 4 + y) * 11 + x)] ==
              px[static_cast<std::size_t>((band_of[b] * H + 7 + y) * W + 5 + x)]);
      }
    }
  }
  const OwnedRasterArray full_last_row = read_raster(path, RasterWindow{0, H - 1, W, 1});
  CHECK(full_last_row.band_count() == B);
}

TEST_CASE("errors carry clear messages") {
  TempDir dir;
  const std::string path = dir.file("e.tif");
  make_tiff_f32(path, 8, 6, 2, {0, 1, 0, 0, 0, -1}, {std::nullopt, std::nullopt}, ramp(2, 6, 8));
  // A missing file is an I/O error carrying errno's code, not a bad argument; the message
  // starts with the call ("read_raster_metadata: cannot open raster '...missing.tif'").
  const auto missing_error = [&](const auto& call) {
    try {
      call();
    } catch (const std::system_error& e) {
      return std::pair{e.code(), std::string(e.what())};
    }
    return std::pair{std::error_code{}, std::string("no std::system_error")};
  };
  const auto [meta_code, meta_what] =
      missing_error([&] { (void)read_raster_metadata(dir.file("missing.tif")); });
  CHECK(meta_code == std::errc::no_such_file_or_directory);
  CHECK(meta_what.rfind("read_raster_metadata: cannot open raster '", 0) == 0);
  CHECK(meta_what.find("missing.tif") != std::string::npos);
  const auto [read_code, read_what] =
      missing_error([&] { (void)read_raster(dir.file("missing.tif")); });
  CHECK(read_code == std::errc::no_such_file_or_directory);
  CHECK(read_what.find("No such file") != std::string::npos);
  // There, but not a raster: a bad argument.
  const std::string text = dir.file("notes.tif");
  std::FILE* f = std::fopen(text.c_str(), "w");
  REQUIRE(f != nullptr);
  std::fputs("not a raster\n", f);
  std::fclose(f);
  CHECK_THROWS_WITH_AS(read_raster_metadata(text),
                       doctest::Contains("read_raster_metadata: cannot open raster"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(read_raster(path, RasterWindow{4, 0, 5, 6}),
                       doctest::Contains("is not inside"), std::invalid_argument);
  CHECK_THROWS_AS(read_raster(path, RasterWindow{0, 0, 0, 6}), std::invalid_argument);
  CHECK_THROWS_AS(read_raster(path, RasterWindow{-1, 0, 2, 2}), std::invalid_argument);
  CHECK_THROWS_WITH_AS(read_raster(path, {}, {0}), doctest::Contains("band index 0"),
                       std::invalid_argument);
  CHECK_THROWS_AS(read_raster(path, {}, {1, 3}), std::invalid_argument);
  const OwnedRasterArray r = read_raster(path);
  CHECK_THROWS_WITH_AS(write_raster(dir.file("x.tif"), r, driver_options("NoSuch")),
                       doctest::Contains("unknown GDAL driver"), std::invalid_argument);
  const OwnedRasterArray bad_crs = OwnedRasterArray::from_host(r.host_data(), r.dtype(), 2, 6, 8,
                                                               std::nullopt, Affine{}, "not a crs");
  CHECK_THROWS_WITH_AS(write_raster(dir.file("x.tif"), bad_crs),
                       doctest::Contains("does not understand CRS"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(write_raster(dir.file("no/such/dir/x.tif"), r),
                       doctest::Contains("cannot create"), std::runtime_error);
  // A NUL byte would end the path early for GDAL: e.tif would be read instead.
  CHECK_THROWS_WITH_AS(read_raster_metadata(path + std::string(1, '\0') + "x"),
                       doctest::Contains("NUL byte"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(write_raster(path + std::string(1, '\0') + "x", r),
                       doctest::Contains("NUL byte"), std::invalid_argument);
  CHECK(read_raster_metadata(path).band_count == 2);
  // A FIFO would block GDAL's open until a writer came: refused before it is opened.
  const std::string fifo = dir.file("pipe.tif");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THROWS_WITH_AS(read_raster_metadata(fifo), doctest::Contains("not a regular file"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(read_raster(fifo), doctest::Contains("not a regular file"),
                       std::invalid_argument);
}

TEST_CASE("exception messages are valid UTF-8 without control characters, whatever the path") {
  TempDir dir;
  const std::string hostile = dir.file("bad-\xff\xfe-\x1b[31mred-\xc2\x9b.tif");
  const auto message_of = [](const auto& call) {
    try {
      call();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    FAIL("no exception");
    return std::string();
  };
  const std::string m1 = message_of([&] { read_raster_metadata(hostile); });
  CHECK(clean_utf8(m1));
  CHECK(m1.find("\\xFF\\xFE") != std::string::npos);
  const std::string m2 = message_of([&] { read_raster(hostile); });
  CHECK(clean_utf8(m2));
  const OwnedRasterArray r = pattern_raster(DType::uint8, 1, 4, 4, std::nullopt);
  const std::string m3 = message_of([&] { write_raster(dir.file("no\x1b/\xff/x.tif"), r); });
  CHECK(clean_utf8(m3));
  const std::string m4 =
      message_of([&] { write_raster(dir.file("x.tif"), r, driver_options("\x1b\xff")); });
  CHECK(clean_utf8(m4));
  CHECK(clean_utf8(message_of([&] {
    write_raster(dir.file("x.tif"),
                 OwnedRasterArray::from_host(r.host_data(), r.dtype(), 1, 4, 4, std::nullopt,
                                             Affine{}, "\x1b[2J\xff"));
  })));
}

TEST_CASE(
    "inputs: only raster file formats open by default; VRT and /vsi paths need allow_virtual") {
  TempDir dir;
  // A "secret" local file and a .tif holding VRT XML that reads it as a raw Byte band.
  const std::string secret = dir.file("secret.txt");
  const std::string text = "root:x:0:0:secret";
  {
    std::FILE* f = std::fopen(secret.c_str(), "wb");
    REQUIRE(f != nullptr);
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
  }
  const std::string vrt = dir.file("innocent.tif");
  {
    std::FILE* f = std::fopen(vrt.c_str(), "wb");
    REQUIRE(f != nullptr);
    std::fprintf(f,
                 "<VRTDataset rasterXSize=\"%zu\" rasterYSize=\"1\">\n"
                 "  <VRTRasterBand dataType=\"Byte\" band=\"1\" subClass=\"VRTRawRasterBand\">\n"
                 "    <SourceFilename relativetoVRT=\"0\">%s</SourceFilename>\n"
                 "    <ImageOffset>0</ImageOffset><PixelOffset>1</PixelOffset>"
                 "<LineOffset>%zu</LineOffset>\n"
                 "  </VRTRasterBand>\n</VRTDataset>\n",
                 text.size(), secret.c_str(), text.size());
    std::fclose(f);
  }
  CHECK_THROWS_WITH_AS(read_raster_metadata(vrt),
                       doctest::Contains("format (VRT) is not an allowed"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(read_raster(vrt), doctest::Contains("allow_virtual"), std::invalid_argument);
  CHECK_THROWS_AS(read_raster(vrt, {}, {}, OpenOptions{.drivers = {"GTiff"}}),
                  std::invalid_argument);
  // Asked for, the VRT opens and reads the file it names (which is why it is opt-in).
  const OwnedRasterArray leaked =
      read_raster(vrt, {}, {}, OpenOptions{.drivers = {}, .allow_virtual = true});
  const std::vector<std::uint8_t> bytes = as_vector<std::uint8_t>(leaked);
  CHECK(std::string(bytes.begin(), bytes.end()) == text);

  // Virtual file systems and URLs are refused before GDAL sees them.
  const std::string tif = dir.file("plain.tif");
  make_tiff_f32(tif, 4, 3, 1, {0, 1, 0, 0, 0, -1}, {std::nullopt}, ramp(1, 3, 4));
  CHECK(read_raster(tif).width() == 4);
  const std::vector<std::string> virtual_paths = {"/vsicurl/http://127.0.0.1:9/x.tif",
                                                  "/vsigzip/" + tif, "http://127.0.0.1:9/x.tif",
                                                  "/vsimem/x.tif"};
  for (const std::string& p : virtual_paths) {
    CAPTURE(p);
    CHECK_THROWS_WITH_AS(read_raster_metadata(p), doctest::Contains("virtual file systems"),
                         std::invalid_argument);
  }
  // Formats outside the list are named in the error; a list of one's own opens them.
  const std::string img = dir.file("x.img");
  make_tiff_f32(img, 4, 3, 1, {0, 1, 0, 0, 0, -1}, {std::nullopt}, ramp(1, 3, 4), nullptr, "HFA");
  CHECK_THROWS_WITH_AS(read_raster(img), doctest::Contains("format (HFA)"), std::invalid_argument);
  CHECK(read_raster(img, {}, {}, OpenOptions{.drivers = {"HFA"}}).width() == 4);
  const std::vector<std::string> defaults = default_input_drivers();
  CHECK(std::find(defaults.begin(), defaults.end(), "GTiff") != defaults.end());
  CHECK(std::find(defaults.begin(), defaults.end(), "VRT") == defaults.end());
}

TEST_CASE("streamed focal mean with halo equals the whole-raster result, tile by tile") {
  TempDir dir;
  const int H = 600, W = 700, B = 3;
  std::vector<float> px = ramp(B, H, W);
  for (std::size_t i = 0; i < px.size(); i += 97) px[i] = -1.0F;  // nodata pixels
  const std::string in = dir.file("in.tif");
  make_tiff_f32(in, W, H, B, {0, 1, 0, 0, 0, -1}, {-1.0, -1.0, -1.0}, px);

  PlanOptions opts;
  opts.band_count = B;
  opts.halo = 1;
  opts.vram_budget = 4u << 20;  // small enough to force 256 x 256 tiles
  const RasterPlan plan = plan_from_metadata(read_raster_metadata(in), opts);
  REQUIRE(plan.strategy == TilingStrategy::tiled);
  REQUIRE(plan.n_tiles > 1);

  const BandOp focal = [](const OwnedRasterArray& t) { return focal_mean_3x3(t); };
  std::int64_t calls = 0, last_total = 0;
  const std::string out = dir.file("out.tif");
  process_raster_streamed(in, out, focal, plan, {}, [&](std::int64_t done, std::int64_t total) {
    ++calls;
    CHECK(done == calls);
    last_total = total;
  });
  CHECK(calls == plan.n_tiles);
  CHECK(last_total == plan.n_tiles);

  const OwnedRasterArray whole = focal_mean_3x3(read_raster(in));
  const OwnedRasterArray got = read_raster(out);
  CHECK(got.dtype() == DType::float32);
  REQUIRE(got.nodata().has_value());
  CHECK(std::isnan(*got.nodata()));
  CHECK(got.affine() == whole.affine());
  CHECK(bytes_of(got) == bytes_of(whole));

  // Without a halo the tile seams differ: the halo is what makes the result exact.
  RasterPlan no_halo = plan;
  no_halo.halo = 0;
  process_raster_streamed(in, dir.file("seams.tif"), focal, no_halo);
  CHECK(bytes_of(read_raster(dir.file("seams.tif"))) != bytes_of(whole));
}

TEST_CASE("streamed output dtype is the op's: uint16 in, float32 out") {
  TempDir dir;
  const int H = 300, W = 280;
  std::vector<std::uint16_t> px(static_cast<std::size_t>(H * W));
  for (std::size_t i = 0; i < px.size(); ++i) px[i] = static_cast<std::uint16_t>((i * 7) % 4000);
  const OwnedRasterArray src =
      OwnedRasterArray::from_host(px.data(), DType::uint16, 1, H, W, 0.0, Affine{}, "EPSG:4326");
  const std::string in = dir.file("u16.tif");
  write_raster(in, src);

  const BandOp to_float = [](const OwnedRasterArray& t) {
    return rescale(t, 0, 4000, 0, 1, DType::float32);
  };
  RasterPlan plan;
  plan.strategy = TilingStrategy::tiled;
  plan.tile_shape = std::pair<std::int64_t, std::int64_t>{128, 100};
  plan.n_tiles = 3 * 3;
  const std::string out = dir.file("f32.tif");
  process_raster_streamed(in, out, to_float, plan);
  const RasterMetadata meta = read_raster_metadata(out);
  CHECK(meta.dtype == DType::float32);
  CHECK(meta.crs.find("4326") != std::string::npos);
  CHECK(bytes_of(read_raster(out)) == bytes_of(to_float(src)));

  // A whole plan is one tile.
  std::int64_t calls = 0;
  process_raster_streamed(in, dir.file("whole.tif"), to_float, RasterPlan{}, {},
                          [&](std::int64_t, std::int64_t total) {
                            ++calls;
                            CHECK(total == 1);
                          });
  CHECK(calls == 1);
  CHECK(bytes_of(read_raster(dir.file("whole.tif"))) == bytes_of(to_float(src)));
}

TEST_CASE("streamed: bad arguments and ops that break the contract") {
  TempDir dir;
  const std::string in = dir.file("in.tif");
  make_tiff_f32(in, 64, 64, 1, {0, 1, 0, 0, 0, -1}, {std::nullopt}, ramp(1, 64, 64));
  RasterPlan plan;
  plan.strategy = TilingStrategy::tiled;
  plan.tile_shape = std::pair<std::int64_t, std::int64_t>{32, 32};
  const BandOp identity = [](const OwnedRasterArray& t) { return t; };
  CHECK_THROWS_AS(process_raster_streamed(in, dir.file("o.tif"), BandOp{}, plan),
                  std::invalid_argument);
  RasterPlan neg = plan;
  neg.halo = -1;
  CHECK_THROWS_AS(process_raster_streamed(in, dir.file("o.tif"), identity, neg),
                  std::invalid_argument);
  RasterPlan no_shape = plan;
  no_shape.tile_shape.reset();
  CHECK_THROWS_AS(process_raster_streamed(in, dir.file("o.tif"), identity, no_shape),
                  std::invalid_argument);
  const BandOp shrink = [](const OwnedRasterArray& t) {
    return OwnedRasterArray::allocate(Residency::host, t.dtype(), 1, 1, 1);
  };
  CHECK_THROWS_WITH_AS(process_raster_streamed(in, dir.file("o.tif"), shrink, plan),
                       doctest::Contains("op returned 1 x 1"), std::invalid_argument);
  int n = 0;
  const BandOp changes_dtype = [&n](const OwnedRasterArray& t) {
    return ++n == 1 ? t : rescale(t, 0, 1, 0, 1, DType::float64);
  };
  CHECK_THROWS_WITH_AS(process_raster_streamed(in, dir.file("o.tif"), changes_dtype, plan),
                       doctest::Contains("differs from the first tile"), std::invalid_argument);
  CHECK_THROWS_AS(
      process_raster_streamed(dir.file("missing.tif"), dir.file("o.tif"), identity, plan),
      std::system_error);
}

namespace {

std::vector<char> file_bytes(const std::string& path) {
  std::vector<char> v;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  REQUIRE(f != nullptr);
  char buf[65536];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) v.insert(v.end(), buf, buf + n);
  std::fclose(f);
  return v;
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> v;
  for (const auto& e : fs::directory_iterator(dir)) v.push_back(e.path().filename().string());
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace

TEST_CASE("outputs are all or nothing: a failing op or write leaves the target as it was") {
  TempDir dir;
  const std::string in = dir.file("in.tif");
  make_tiff_f32(in, 64, 64, 2, {0, 1, 0, 0, 0, -1}, {std::nullopt, std::nullopt}, ramp(2, 64, 64));
  const std::vector<char> in_bytes = file_bytes(in);
  RasterPlan plan;
  plan.strategy = TilingStrategy::tiled;
  plan.tile_shape = std::pair<std::int64_t, std::int64_t>{16, 16};
  plan.bands_per_pass = 2;
  plan.halo = 1;
  int calls = 0;
  const BandOp fails_at_5 = [&calls](const OwnedRasterArray& t) {
    if (++calls == 5) throw std::runtime_error("tile 5 failed");
    return focal_mean_3x3(t);
  };

  // In place: the input survives byte for byte, and no temporary file is left.
  CHECK_THROWS_WITH(process_raster_streamed(in, in, fails_at_5, plan), "tile 5 failed");
  CHECK(calls == 5);
  CHECK(file_bytes(in) == in_bytes);
  CHECK(names_in(dir.path) == std::vector<std::string>{"in.tif"});

  // Over an existing output (with a stale .aux.xml): both survive; a new output never appears.
  const std::string out = dir.file("out.tif");
  {
    std::FILE* f = std::fopen(out.c_str(), "wb");
    std::fputs("old", f);
    std::fclose(f);
    f = std::fopen((out + ".aux.xml").c_str(), "wb");
    std::fputs("<PAMDataset/>", f);
    std::fclose(f);
  }
  ::chmod(out.c_str(), 0640);
  calls = 0;
  CHECK_THROWS(process_raster_streamed(in, out, fails_at_5, plan));
  CHECK(file_bytes(out) == std::vector<char>{'o', 'l', 'd'});
  CHECK(names_in(dir.path) == std::vector<std::string>{"in.tif", "out.tif", "out.tif.aux.xml"});
  calls = 0;
  CHECK_THROWS(process_raster_streamed(in, dir.file("new.tif"), fails_at_5, plan));
  CHECK(names_in(dir.path) == std::vector<std::string>{"in.tif", "out.tif", "out.tif.aux.xml"});

  // write_raster failing after the temporary file exists (a CRS GDAL rejects) changes nothing.
  const OwnedRasterArray r = read_raster(in);
  CHECK_THROWS(write_raster(out, OwnedRasterArray::from_host(r.host_data(), r.dtype(), 2, 64, 64,
                                                             std::nullopt, Affine{}, "no crs")));
  CHECK(file_bytes(out) == std::vector<char>{'o', 'l', 'd'});
  CHECK(names_in(dir.path) == std::vector<std::string>{"in.tif", "out.tif", "out.tif.aux.xml"});

  // Success replaces the file (keeping its permissions) and drops the stale sidecar; in place
  // too, where the result is the whole-raster result.
  const OwnedRasterArray whole = focal_mean_3x3(r);
  process_raster_streamed(
      in, out, [](const OwnedRasterArray& t) { return focal_mean_3x3(t); }, plan);
  CHECK(bytes_of(read_raster(out)) == bytes_of(whole));
  CHECK((fs::status(out).permissions() & fs::perms::all) ==
        (fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read));
  process_raster_streamed(
      in, in, [](const OwnedRasterArray& t) { return focal_mean_3x3(t); }, plan);
  CHECK(bytes_of(read_raster(in)) == bytes_of(whole));
  CHECK(names_in(dir.path) == std::vector<std::string>{"in.tif", "out.tif"});
  write_raster(dir.file("w.tif"), whole);
  CHECK(bytes_of(read_raster(dir.file("w.tif"))) == bytes_of(whole));

  // A directory that cannot take a temporary: a clear error, nothing written.
  CHECK_THROWS_WITH_AS(write_raster(dir.file("no/such/dir/x.tif"), whole),
                       doctest::Contains("cannot create a temporary directory"),
                       std::runtime_error);
}

TEST_CASE("streamed passes read only the plan's bands; reductions stream; memory is checked") {
  TempDir dir;
  const int H = 300, W = 260, B = 5;
  std::vector<float> px = ramp(B, H, W);
  for (std::size_t i = 0; i < px.size(); i += 89) px[i] = -1.0F;
  const std::string in = dir.file("in.tif");
  make_tiff_f32(in, W, H, B, {0, 1, 0, 0, 0, -1}, {-1.0, -1.0, -1.0, -1.0, -1.0}, px);
  const OwnedRasterArray whole_in = read_raster(in);

  PlanOptions opts;
  opts.per_band = true;
  opts.halo = 1;
  opts.vram_budget = 600000;  // one band does not fit: tiled, one band per pass
  const RasterPlan plan = plan_from_metadata(read_raster_metadata(in), opts);
  REQUIRE(plan.strategy == TilingStrategy::tiled);
  REQUIRE(plan.bands_per_pass == 1);

  // Reductions: every tile carries one band, the merged counts, minima and maxima are exact.
  std::vector<std::int64_t> count(B, 0);
  std::vector<double> lo(B, 1e300), hi(B, -1e300);
  std::int64_t tiles = 0;
  RasterPlan no_halo = plan;
  no_halo.halo = 0;
  for_each_raster_tile(in, no_halo, [&](const OwnedRasterArray& tile, const TileInfo& where) {
    CHECK(tile.band_count() == 1);
    CHECK(where.band_count == 1);
    CHECK(where.index == tiles++);
    CHECK(where.total == plan.n_tiles * B);
    const BandStatistics s = band_statistics(tile)[0];
    const auto b = static_cast<std::size_t>(where.first_band);
    count[b] += s.count;
    if (s.count > 0) lo[b] = std::min(lo[b], s.min), hi[b] = std::max(hi[b], s.max);
  });
  CHECK(tiles == plan.n_tiles * B);
  const std::vector<BandStatistics> expected = band_statistics(whole_in);
  for (int b = 0; b < B; ++b) {
    CHECK(count[static_cast<std::size_t>(b)] == expected[static_cast<std::size_t>(b)].count);
    CHECK(lo[static_cast<std::size_t>(b)] == expected[static_cast<std::size_t>(b)].min);
    CHECK(hi[static_cast<std::size_t>(b)] == expected[static_cast<std::size_t>(b)].max);
  }

  // Per-band passes: the op sees one band at a time, the output has every band in place.
  int max_bands_seen = 0;
  const BandOp focal = [&](const OwnedRasterArray& t) {
    max_bands_seen = std::max(max_bands_seen, t.band_count());
    return focal_mean_3x3(t);
  };
  StreamOptions so;
  process_raster_file(in, dir.file("out.tif"), focal, plan, so);
  CHECK(max_bands_seen == 1);
  CHECK(bytes_of(read_raster(dir.file("out.tif"))) == bytes_of(focal_mean_3x3(whole_in)));

  // A band selection: bands 4 and 2, in that order.
  so.bands = {4, 2};
  process_raster_file(in, dir.file("sel.tif"), focal, plan, so);
  const OwnedRasterArray sel = read_raster(dir.file("sel.tif"));
  CHECK(sel.band_count() == 2);
  CHECK(bytes_of(sel) == bytes_of(focal_mean_3x3(read_raster(in, {}, {4, 2}))));

  // A per-band pass whose op returns another band count is refused.
  const BandOp two = [](const OwnedRasterArray& t) {
    return OwnedRasterArray::from_band_stack({t, t}, t);
  };
  CHECK_THROWS_WITH_AS(process_raster_file(in, dir.file("x.tif"), two, plan, StreamOptions{}),
                       doctest::Contains("band(s) for a pass of 1"), std::invalid_argument);

  // A host memory limit below what a pass needs: refused before reading, nothing written.
  StreamOptions tight;
  tight.host_memory_limit = 100000;
  tight.gdal_cache_bytes = gdal_cache_for_plan(in, plan);
  CHECK(*tight.gdal_cache_bytes >= 2 * 256 * 260 * 4);
  CHECK_THROWS_AS(process_raster_file(in, dir.file("y.tif"), focal, plan, tight),
                  HostMemoryLimitError);
  CHECK_THROWS_AS(for_each_raster_tile(
                      in, plan, [](const OwnedRasterArray&, const TileInfo&) {}, tight),
                  HostMemoryLimitError);
  CHECK(!fs::exists(dir.file("y.tif")));
}

TEST_CASE("a read larger than host memory is refused up front, with the amount") {
  TempDir dir;
  // 100000 x 100000 x 500 float32 (20 TB) in a sparse, pixel-interleaved file of about a MB.
  const std::string path = dir.file("huge.tif");
  GDALAllRegister();
  const char* co[] = {"SPARSE_OK=TRUE", "INTERLEAVE=PIXEL", "BLOCKYSIZE=1", "BIGTIFF=YES", nullptr};
  GDALDatasetH ds = GDALCreate(GDALGetDriverByName("GTiff"), path.c_str(), 100000, 100000, 500,
                               GDT_Float32, const_cast<char**>(co));
  REQUIRE(ds != nullptr);
  GDALClose(ds);
  try {
    (void)read_raster(path);
    FAIL("no exception");
  } catch (const HostMemoryLimitError& e) {
    CHECK(e.needed_bytes() == 100000ULL * 100000ULL * 500ULL * 4ULL);
    // The limit is what was available when the read was refused; a second reading of
    // available_host_memory() can differ (other processes), so the message is checked to name
    // the limit the error carries instead.
    CHECK(e.limit_bytes() > 0);
    CHECK(e.limit_bytes() < e.needed_bytes());
    const std::string what = e.what();
    CHECK(what.find("TiB of host memory") != std::string::npos);
    CHECK(what.find("more than the " + detail::byte_text(e.limit_bytes())) != std::string::npos);
  }
  // A window of it reads.
  CHECK(read_raster(path, RasterWindow{5, 5, 3, 2}, {7}).byte_size() == 24);
  CHECK(available_host_memory() > 0);
}

TEST_CASE("64-bit integer nodata at the type's limits reads and writes exactly") {
  TempDir dir;
  constexpr std::int64_t imax = std::numeric_limits<std::int64_t>::max();
  constexpr std::uint64_t umax = std::numeric_limits<std::uint64_t>::max();
  GDALAllRegister();
  // Int64 with nodata INT64_MAX, UInt64 with nodata UINT64_MAX, set through GDAL's exact calls.
  const std::vector<std::int64_t> ip{imax, 9, imax - 1, 1, imax, -5};
  const std::vector<std::uint64_t> up{umax, 1, umax - 1, 9, umax, 0};
  const std::string ipath = dir.file("i64.tif"), upath = dir.file("u64.tif");
  {
    GDALDatasetH ds =
        GDALCreate(GDALGetDriverByName("GTiff"), ipath.c_str(), 3, 2, 1, GDT_Int64, nullptr);
    GDALRasterBandH b = GDALGetRasterBand(ds, 1);
    REQUIRE(GDALSetRasterNoDataValueAsInt64(b, imax) == CE_None);
    REQUIRE(GDALRasterIO(b, GF_Write, 0, 0, 3, 2, const_cast<std::int64_t*>(ip.data()), 3, 2,
                         GDT_Int64, 0, 0) == CE_None);
    GDALClose(ds);
    ds = GDALCreate(GDALGetDriverByName("GTiff"), upath.c_str(), 3, 2, 1, GDT_UInt64, nullptr);
    b = GDALGetRasterBand(ds, 1);
    REQUIRE(GDALSetRasterNoDataValueAsUInt64(b, umax) == CE_None);
    REQUIRE(GDALRasterIO(b, GF_Write, 0, 0, 3, 2, const_cast<std::uint64_t*>(up.data()), 3, 2,
                         GDT_UInt64, 0, 0) == CE_None);
    GDALClose(ds);
  }
  const OwnedRasterArray ri = read_raster(ipath);
  REQUIRE(ri.exact_nodata().has_value());
  CHECK(ri.exact_nodata()->as_int64() == std::optional<std::int64_t>(imax));
  CHECK(read_raster_metadata(ipath).exact_nodata == ri.exact_nodata());
  CHECK(band_statistics(ri)[0].count == 4);  // 9, INT64_MAX - 1, 1, -5
  const OwnedRasterArray ru = read_raster(upath);
  CHECK(ru.exact_nodata()->as_uint64() == std::optional<std::uint64_t>(umax));
  CHECK(band_statistics(ru)[0].count == 4);

  // Written back, GDAL reads the same sentinels (the double setter wrote "9" and "1").
  write_raster(dir.file("i64-out.tif"), ri);
  write_raster(dir.file("u64-out.tif"), ru);
  GDALDatasetH ds = GDALOpen(dir.file("i64-out.tif").c_str(), GA_ReadOnly);
  int has = 0;
  CHECK(GDALGetRasterNoDataValueAsInt64(GDALGetRasterBand(ds, 1), &has) == imax);
  CHECK(has == 1);
  GDALClose(ds);
  ds = GDALOpen(dir.file("u64-out.tif").c_str(), GA_ReadOnly);
  CHECK(GDALGetRasterNoDataValueAsUInt64(GDALGetRasterBand(ds, 1), &has) == umax);
  GDALClose(ds);
  // Streamed ops that keep the dtype keep the sentinel.
  RasterPlan plan;
  plan.strategy = TilingStrategy::tiled;
  plan.tile_shape = std::pair<std::int64_t, std::int64_t>{1, 2};
  process_raster_streamed(
      ipath, dir.file("clip.tif"), [](const OwnedRasterArray& t) { return clip(t, 0, 5); }, plan);
  const OwnedRasterArray c = read_raster(dir.file("clip.tif"));
  CHECK(c.exact_nodata() == ri.exact_nodata());
  CHECK(as_vector<std::int64_t>(c) == std::vector<std::int64_t>{imax, 5, 5, 1, imax, 0});
}

TEST_CASE("creation options GDAL would ignore are errors, before anything is written") {
  TempDir dir;
  const std::string src = dir.file("src.tif");
  make_tiff_f32(src, 40, 20, 1, {0, 1, 0, 0, 0, -1}, {std::nullopt}, ramp(1, 20, 40));
  const OwnedRasterArray r = read_raster(src);
  const auto refused = [&](const WriteOptions& w, const char* says) {
    const std::string out = dir.file("out.tif");
    CAPTURE(says);
    CHECK_THROWS_WITH_AS(check_write_options(w), doctest::Contains(says), std::invalid_argument);
    CHECK_THROWS_WITH_AS(write_raster(out, r, w), doctest::Contains(says), std::invalid_argument);
    CHECK(!fs::exists(out));
    StreamOptions so;
    so.write = w;
    const BandOp keep = [](const OwnedRasterArray& t) { return clip(t, -1e9, 1e9); };
    CHECK_THROWS_WITH_AS(process_raster_file(src, out, keep, RasterPlan{}, so),
                         doctest::Contains(says), std::invalid_argument);
    CHECK(!fs::exists(out));
  };
  WriteOptions w;
  w.compress = "BOGUS";  // GDAL alone warns and writes uncompressed
  refused(w, "'BOGUS' is an unexpected value for COMPRESS");
  w = WriteOptions{};
  w.creation_options = {"NOSUCHOPTION=1"};
  refused(w, "NOSUCHOPTION");
  w.creation_options = {"TILED=maybe"};
  refused(w, "'maybe' is an unexpected value for TILED");
  w = WriteOptions{};
  w.block = 7;  // GDAL fails only at creation, after a streamed job has computed its first pass
  refused(w, "a positive multiple of 16, not 7");
  w.block = 0;
  refused(w, "not 0");
  // An existing target is left as it was.
  const std::string kept = dir.file("kept.tif");
  fs::copy_file(src, kept);
  const auto before = fs::file_size(kept);
  w = WriteOptions{};
  w.compress = "zip";
  CHECK_THROWS_AS(write_raster(kept, r, w), std::invalid_argument);
  CHECK(fs::file_size(kept) == before);
  CHECK(read_raster(kept).host_data() != nullptr);
  // What GDAL takes still works: any case of a known value, untiled with any block.
  CHECK_NOTHROW(check_write_options(WriteOptions{}));
  CHECK_THROWS_WITH_AS(check_write_options(driver_options("NoSuch")),
                       doctest::Contains("unknown GDAL driver"), std::invalid_argument);
  w.compress = "lzw";
  CHECK_NOTHROW(check_write_options(w));
  write_raster(dir.file("lzw.tif"), r, w);
  w = WriteOptions{};
  w.tiled = false;
  w.block = 7;
  write_raster(dir.file("strips.tif"), r, w);
  CHECK(read_raster_metadata(dir.file("strips.tif")).width == 40);
}

TEST_CASE("per-band nodata, metadata, creation options, overwrite and format by extension") {
  TempDir dir;
  // HFA keeps a nodata per band.
  const std::string mixed = dir.file("mixed.img");
  const std::vector<float> px = ramp(3, 20, 30);
  make_tiff_f32(mixed, 30, 20, 3, {5, 2, 0, 50, 0, -2}, {-1.0, -1.0, 3.5}, px, nullptr, "HFA");
  const OpenOptions hfa{.drivers = {"HFA"}, .allow_virtual = false};
  const RasterFileInfo info = read_raster_info(mixed, hfa);
  REQUIRE(info.band_nodata.size() == 3);
  CHECK(info.band_nodata[2] == std::optional<NodataValue>(3.5));
  CHECK(info.metadata.exact_nodata == std::optional<NodataValue>(-1.0));
  CHECK(info.has_geotransform);

  // Per-band passes never mix nodata: bands 1-2 go together, band 3 alone, each tile carrying
  // its band's nodata; the HFA output keeps each band's.
  RasterPlan whole;
  StreamOptions so;
  so.open = hfa;
  so.per_band = true;
  std::vector<std::pair<int, int>> passes;
  for_each_raster_tile(
      mixed, whole,
      [&](const OwnedRasterArray& tile, const TileInfo& where) {
        passes.emplace_back(where.first_band, where.band_count);
        CHECK(tile.exact_nodata() == info.band_nodata[static_cast<std::size_t>(where.first_band)]);
      },
      so);
  CHECK(passes == std::vector<std::pair<int, int>>{{0, 2}, {2, 1}});
  so.write.driver = "HFA";
  const BandOp keep = [](const OwnedRasterArray& t) { return clip(t, -1e9, 1e9); };
  process_raster_file(mixed, dir.file("out.img"), keep, whole, so);
  CHECK(read_raster_info(dir.file("out.img"), hfa).band_nodata == info.band_nodata);
  // GTiff holds one nodata: the same run into GTiff is refused, and leaves nothing.
  so.write.driver = "GTiff";
  CHECK_THROWS_WITH_AS(process_raster_file(mixed, dir.file("out.tif"), keep, whole, so),
                       doctest::Contains("GTiff keeps one nodata"), std::invalid_argument);
  CHECK(!fs::exists(dir.file("out.tif")));
  // Taken together (not per band), mixed nodata is refused unless asked for.
  so.per_band = false;
  CHECK_THROWS_WITH_AS(process_raster_file(mixed, dir.file("out.tif"), keep, whole, so),
                       doctest::Contains("differ in nodata"), std::runtime_error);

  // Metadata: scale/offset/unit/description/colour and AREA_OR_POINT travel (all), or only the
  // descriptive part; no geotransform in, none out.
  const std::string in = dir.file("meta.tif");
  make_tiff_f32(in, 16, 8, 1, {0, 1, 0, 0, 0, -1}, {std::nullopt}, ramp(1, 8, 16));
  {
    GDALDatasetH ds = GDALOpen(in.c_str(), GA_Update);
    GDALRasterBandH b = GDALGetRasterBand(ds, 1);
    GDALSetRasterScale(b, 0.25);
    GDALSetRasterOffset(b, 7);
    GDALSetRasterUnitType(b, "m");
    GDALSetDescription(b, "height");
    GDALSetMetadataItem(ds, "AREA_OR_POINT", "Point", nullptr);
    GDALClose(ds);
  }
  StreamOptions plain;
  plain.metadata = MetadataCopy::all;
  process_raster_file(in, dir.file("all.tif"), keep, whole, plain);
  plain.metadata = MetadataCopy::descriptive;
  plain.write.creation_options = {"COMPRESS=LZW"};
  plain.write.num_threads = 2;
  process_raster_file(in, dir.file("desc.tif"), keep, whole, plain);
  GDALDatasetH a = GDALOpen(dir.file("all.tif").c_str(), GA_ReadOnly);
  GDALDatasetH d = GDALOpen(dir.file("desc.tif").c_str(), GA_ReadOnly);
  int has = 0;
  CHECK(GDALGetRasterScale(GDALGetRasterBand(a, 1), &has) == 0.25);
  CHECK(GDALGetRasterOffset(GDALGetRasterBand(a, 1), &has) == 7);
  CHECK(std::string(GDALGetRasterUnitType(GDALGetRasterBand(a, 1))) == "m");
  CHECK(std::string(GDALGetDescription(GDALGetRasterBand(d, 1))) == "height");
  CHECK(std::string(GDALGetMetadataItem(d, "AREA_OR_POINT", nullptr)) == "Point");
  GDALGetRasterScale(GDALGetRasterBand(d, 1), &has);
  CHECK(has == 0);
  CHECK(std::string(GDALGetMetadataItem(d, "COMPRESSION", "IMAGE_STRUCTURE")) == "LZW");
  GDALClose(a);
  GDALClose(d);
  {
    GDALDatasetH ds = GDALCreate(GDALGetDriverByName("GTiff"), dir.file("nogt.tif").c_str(), 8, 4,
                                 1, GDT_Float32, nullptr);
    GDALClose(ds);
  }
  CHECK_FALSE(read_raster_info(dir.file("nogt.tif")).has_geotransform);
  process_raster_file(dir.file("nogt.tif"), dir.file("nogt-out.tif"), keep, whole, plain);
  CHECK_FALSE(read_raster_info(dir.file("nogt-out.tif")).has_geotransform);

  // overwrite = false: an existing target is refused and kept.
  StreamOptions no_over;
  no_over.write.overwrite = false;
  const std::vector<char> before = file_bytes(dir.file("all.tif"));
  CHECK_THROWS_WITH_AS(process_raster_file(in, dir.file("all.tif"), keep, whole, no_over),
                       doctest::Contains("exists"), std::runtime_error);
  CHECK(file_bytes(dir.file("all.tif")) == before);
  write_file_atomically(dir.file("s.json"), "{}\n");
  CHECK_THROWS_AS(write_file_atomically(dir.file("s.json"), "[]\n", false), std::runtime_error);
  CHECK(file_bytes(dir.file("s.json")) == std::vector<char>{'{', '}', '\n'});

  CHECK(output_driver_for("a/b.TIF") == "GTiff");
  CHECK(output_driver_for("x.img") == "HFA");
  CHECK(output_driver_for("x.nosuchext").empty());
  CHECK(output_driver_for("dir.d/noext").empty());
}

// --- GDAL mask bands of inputs
// ---------------------------------------------------------------------

namespace {

/// A GeoTIFF of @p bands bands of GDAL type @p type holding @p values (band-major, as doubles),
/// with @p nodata on every band when given and a GDAL mask: "internal", "external" (.msk) or
/// "alpha" (the last band, ALPHA=YES), 0 where @p invalid(i) of the pixel index, else 255.
void make_masked(const std::string& path, int width, int height, int bands, GDALDataType type,
                 const std::vector<double>& values, const std::string& kind,
                 const std::function<bool(int)>& invalid, std::optional<double> nodata = {}) {
  GDALAllRegister();
  CPLStringList co;
  if (kind == "alpha") co.SetNameValue("ALPHA", "YES");
  GDALDatasetH ds =
      GDALCreate(GDALGetDriverByName("GTiff"), path.c_str(), width, height, bands, type, co.List());
  REQUIRE(ds != nullptr);
  std::array<double, 6> gt{0, 1, 0, static_cast<double>(height), 0, -1};
  GDALSetGeoTransform(ds, gt.data());
  const int data_bands = kind == "alpha" ? bands - 1 : bands;
  for (int b = 1; b <= data_bands; ++b) {
    GDALRasterBandH band = GDALGetRasterBand(ds, b);
    if (nodata) REQUIRE(GDALSetRasterNoDataValue(band, *nodata) == CE_None);
    REQUIRE(GDALRasterIO(band, GF_Write, 0, 0, width, height,
                         const_cast<double*>(values.data()) +
                             static_cast<std::size_t>((b - 1) * width * height),
                         width, height, GDT_Float64, 0, 0) == CE_None);
  }
  std::vector<std::uint8_t> mask(static_cast<std::size_t>(width * height));
  for (int i = 0; i < width * height; ++i) mask[static_cast<std::size_t>(i)] = invalid(i) ? 0 : 255;
  GDALRasterBandH target = nullptr;
  if (kind == "alpha") {
    target = GDALGetRasterBand(ds, bands);
    GDALSetRasterColorInterpretation(target, GCI_AlphaBand);
  } else {
    CPLSetConfigOption("GDAL_TIFF_INTERNAL_MASK", kind == "internal" ? "YES" : "NO");
    REQUIRE(GDALCreateDatasetMaskBand(ds, GMF_PER_DATASET) == CE_None);
    CPLSetConfigOption("GDAL_TIFF_INTERNAL_MASK", nullptr);
    target = GDALGetMaskBand(GDALGetRasterBand(ds, 1));
  }
  REQUIRE(GDALRasterIO(target, GF_Write, 0, 0, width, height, mask.data(), width, height, GDT_Byte,
                       0, 0) == CE_None);
  GDALClose(ds);
}

/// The whole of @p source's bands, read as one tile per band.
std::vector<double> read_all(RasterFileSource& source, int band) {
  const RasterMetadata m = source.metadata();
  const OwnedRasterArray t = source.read(RasterWindow{0, 0, m.width, m.height}, band, 1);
  const OwnedRasterArray d = convert_dtype(t.with_nodata(std::nullopt), DType::float64, {});
  return as_vector<double>(d);
}

}  // namespace

TEST_CASE("GDAL mask bands mark invalid pixels, read as nodata, unless ignored") {
  TempDir dir;
  const int w = 9, h = 7, n = w * h;
  std::vector<double> v(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = 1.5 * i;
  const auto every3 = [](int i) { return i % 3 == 0; };
  for (const char* kind : {"internal", "external"}) {
    CAPTURE(kind);
    const std::string f = dir.file(std::string("f32-") + kind + ".tif");
    make_masked(f, w, h, 1, GDT_Float32, v, kind, every3);
    CHECK(fs::exists(f + ".msk") == (std::string(kind) == "external"));
    RasterFileSource src(f);
    CHECK(src.masked_bands() == std::vector<bool>{true});
    REQUIRE(src.band_nodata()[0]);
    CHECK(src.band_nodata()[0]->is_nan());  // float without nodata: NaN
    CHECK(src.metadata().exact_nodata->is_nan());
    const std::vector<double> got = read_all(src, 0);
    for (int i = 0; i < n; ++i) {
      if (every3(i)) {
        CHECK(std::isnan(got[static_cast<std::size_t>(i)]));
      } else {
        CHECK(got[static_cast<std::size_t>(i)] == v[static_cast<std::size_t>(i)]);
      }
    }
    // The statistics of a streamed run leave the masked pixels out.
    std::int64_t count = 0;
    for_each_raster_tile(f, RasterPlan{}, [&](const OwnedRasterArray& t, const TileInfo&) {
      count += band_statistics(t)[0].count;
    });
    CHECK(count == n - (n + 2) / 3);
    // ignore_mask: as the file is, and read_raster never applies the mask.
    RasterFileSource plain(f,
                           OpenOptions{.drivers = {}, .allow_virtual = false, .ignore_mask = true});
    CHECK(plain.masked_bands() == std::vector<bool>{false});
    CHECK_FALSE(plain.band_nodata()[0]);
    CHECK(read_all(plain, 0) == v);
    CHECK_FALSE(read_raster_info(f).band_nodata[0]);
  }
  // A band with a nodata of its own: masked pixels take it.
  {
    const std::string f = dir.file("nd.tif");
    make_masked(f, w, h, 1, GDT_Int16, v, "internal", every3, -1.0);
    RasterFileSource src(f);
    CHECK(src.band_nodata()[0] == NodataValue(-1.0));
    const std::vector<double> got = read_all(src, 0);
    for (int i = 0; i < n; ++i) {
      CHECK(got[static_cast<std::size_t>(i)] ==
            (every3(i) ? -1.0 : std::round(v[static_cast<std::size_t>(i)])));
    }
  }
}

TEST_CASE("a band whose GDAL mask decides ignores its nodata, as GDAL's mask flags say") {
  // GDAL: with an internal mask GetMaskBand is the mask (GMF_PER_DATASET) and the band's nodata
  // is not consulted: a pixel the mask keeps is valid even where it equals the nodata.
  TempDir dir;
  const int w = 12, h = 10, n = w * h;
  std::vector<double> v(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = i % 5 == 0 ? 0 : 1 + i % 200;
  const auto every4 = [](int i) { return i % 4 == 1; };
  for (const char* kind : {"internal", "external"}) {
    CAPTURE(kind);
    const std::string f = dir.file(std::string("u8nd-") + kind + ".tif");
    make_masked(f, w, h, 1, GDT_Byte, v, kind, every4, 0.0);
    RasterFileSource src(f);
    CHECK(src.masked_bands() == std::vector<bool>{true});
    // 0 is taken by pixels the mask keeps: the masked ones get the largest free value.
    CHECK(src.band_nodata()[0] == NodataValue(255.0));
    CHECK(src.nodata_marks_mask() == std::vector<bool>{true});
    const std::vector<double> got = read_all(src, 0);
    int valid = 0;
    for (int i = 0; i < n; ++i) {
      CHECK(got[static_cast<std::size_t>(i)] ==
            (every4(i) ? 255.0 : v[static_cast<std::size_t>(i)]));
      valid += every4(i) ? 0 : 1;
    }
    CHECK(band_statistics(src.read(RasterWindow{0, 0, w, h}, 0, 1))[0].count == valid);
  }
  // The band's own nodata, where no pixel the mask keeps holds it, marks the masked pixels.
  std::vector<double> free = v;
  for (double& x : free) x = x == 0 ? 7 : x;
  const std::string f = dir.file("u8free.tif");
  make_masked(f, w, h, 1, GDT_Byte, free, "internal", every4, 0.0);
  RasterFileSource src(f);
  CHECK(src.band_nodata()[0] == NodataValue(0.0));
  CHECK(src.nodata_marks_mask() == std::vector<bool>{false});
}

TEST_CASE("masked integer bands without nodata get one no valid pixel takes") {
  TempDir dir;
  const int w = 16, h = 16, n = w * h;
  // RGBA: 3 uint8 bands with every value 0..255 once, 200 and 201 only where the alpha is 0: the
  // nodata is the largest value no valid pixel of the three takes, 201 (one for all three).
  std::vector<double> v(static_cast<std::size_t>(3 * n));
  for (int b = 0; b < 3; ++b) {
    for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(b * n + i)] = (i * 7) % 256;
  }
  const auto hole = [&](int i) { return (i * 7) % 256 == 200 || (i * 7) % 256 == 201; };
  const std::string rgba = dir.file("rgba.tif");
  make_masked(rgba, w, h, 4, GDT_Byte, v, "alpha", hole);
  RasterFileSource src(rgba);
  CHECK(src.masked_bands() == std::vector<bool>{true, true, true, false});  // alpha: all valid
  const auto nd = src.band_nodata();
  CHECK(nd[0] == NodataValue(201.0));
  CHECK(nd[1] == NodataValue(201.0));
  CHECK(nd[2] == NodataValue(201.0));
  // The alpha band, read with them and without a nodata, gets the same one (none of its pixels
  // holds it), so that the four bands keep one nodata; it only marks masked pixels.
  CHECK(nd[3] == NodataValue(201.0));
  CHECK(src.nodata_marks_mask() == std::vector<bool>{true, true, true, true});
  for (int b = 0; b < 3; ++b) {
    const std::vector<double> got = read_all(src, b);
    for (int i = 0; i < n; ++i) {
      CHECK(got[static_cast<std::size_t>(i)] ==
            (hole(i) ? 201.0 : v[static_cast<std::size_t>(b * n + i)]));
    }
  }
  // Every value valid somewhere (16 x 17: each value at least once among the valid pixels):
  // none is left.
  std::vector<double> all(16 * 17);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<double>((i * 7) % 256);
  const std::string full = dir.file("full.tif");
  make_masked(full, 16, 17, 1, GDT_Byte, all, "internal", [](int i) { return i == 3; });
  CHECK_THROWS_WITH_AS(RasterFileSource{full}, doctest::Contains("--ignore-mask"),
                       std::runtime_error);
  CHECK_NOTHROW(RasterFileSource(
      full, OpenOptions{.drivers = {}, .allow_virtual = false, .ignore_mask = true}));
  // 32 bits: the largest value, unless a valid pixel holds it: then the smallest.
  std::vector<double> big(static_cast<std::size_t>(n), 5.0);
  const std::string i32 = dir.file("i32.tif");
  make_masked(i32, w, h, 1, GDT_Int32, big, "external", [](int i) { return i == 0; });
  CHECK(RasterFileSource(i32).band_nodata()[0] == NodataValue(2147483647.0));
  big[7] = 2147483647.0;
  make_masked(i32, w, h, 1, GDT_Int32, big, "external", [](int i) { return i == 0; });
  RasterFileSource s32(i32);
  CHECK(s32.band_nodata()[0] == NodataValue(-2147483648.0));
  const OwnedRasterArray t32 = s32.read(RasterWindow{0, 0, w, h}, 0, 1);
  CHECK(band_statistics(t32)[0].count == n - 1);
}

TEST_CASE("a source reading with several threads reads every window as one thread does") {
  TempDir dir;
  // 3 bands of 300 x 200 float32 in 32 x 32 tiled DEFLATE blocks, pixel-interleaved, every
  // pixel distinct.
  const std::string f = dir.file("strips.tif");
  const int w = 200, h = 300, nb = 3;
  {
    CPLStringList co;
    co.SetNameValue("TILED", "YES");
    co.SetNameValue("BLOCKXSIZE", "32");
    co.SetNameValue("BLOCKYSIZE", "32");
    co.SetNameValue("COMPRESS", "DEFLATE");
    GDALDatasetH ds =
        GDALCreate(GDALGetDriverByName("GTiff"), f.c_str(), w, h, nb, GDT_Float32, co.List());
    REQUIRE(ds != nullptr);
    std::vector<float> px(static_cast<std::size_t>(w * h * nb));
    for (std::size_t i = 0; i < px.size(); ++i) px[i] = static_cast<float>(i) * 0.25F;
    REQUIRE(GDALDatasetRasterIO(ds, GF_Write, 0, 0, w, h, px.data(), w, h, GDT_Float32, nb, nullptr,
                                0, 0, 0) == CE_None);
    GDALClose(ds);
  }
  RasterFileSource one(f);
  for (const int threads : {2, 3, 4, -1}) {
    CAPTURE(threads);
    OpenOptions open;
    open.num_threads = threads;
    RasterFileSource many(f, open);
    // Heights around the block size and the thread count, windows inside and at the edges.
    for (const std::int64_t rows : {1, 31, 32, 33, 63, 64, 65, 97, 129, 257, 299, 300}) {
      for (const std::int64_t row_off : {std::int64_t{0}, std::int64_t{7}, h - rows}) {
        if (row_off + rows > h) continue;
        CAPTURE(rows);
        CAPTURE(row_off);
        const RasterWindow win{5, row_off, 150, rows};
        for (const auto& [first, count] : {std::pair{0, 3}, std::pair{1, 2}, std::pair{2, 1}}) {
          const OwnedRasterArray a = one.read(win, first, count);
          const OwnedRasterArray b = many.read(win, first, count);
          CHECK(b.affine() == a.affine());
          CHECK(as_vector<float>(b) == as_vector<float>(a));
        }
      }
    }
  }
  OpenOptions bad;
  bad.num_threads = -2;
  CHECK_THROWS_AS(RasterFileSource(f, bad), std::invalid_argument);
}

TEST_CASE("a file run with overlapped stages and reading threads writes what a serial run does") {
  // Reading (in strips, on a thread per strip), computing and writing (with GDAL's encoding
  // threads) of different tiles at once: the ThreadSanitizer build runs this over real GDAL
  // datasets, where the executor's own tests use sources and sinks in memory.
  TempDir dir;
  const int H = 300, W = 260, B = 3;
  std::vector<float> px = ramp(B, H, W);
  for (std::size_t i = 0; i < px.size(); i += 97) px[i] = -1.0F;
  const std::string in = dir.file("in.tif");
  make_tiff_f32(in, W, H, B, {0, 1, 0, 0, 0, -1}, {-1.0, -1.0, -1.0}, px);
  PlanOptions opts;
  opts.halo = 1;
  opts.vram_budget = 400000;
  RasterPlan plan = plan_from_metadata(read_raster_metadata(in), opts);
  REQUIRE(plan.strategy == TilingStrategy::tiled);
  REQUIRE(plan.n_tiles >= 4);
  const BandOp focal = [](const OwnedRasterArray& t) { return focal_mean_3x3(t); };
  process_raster_file(in, dir.file("serial.tif"), focal, plan, StreamOptions{});
  const std::vector<std::byte> serial = bytes_of(read_raster(dir.file("serial.tif")));
  for (const int overlap : {1, 2}) {
    for (const bool per_band : {false, true}) {
      CAPTURE(overlap);
      CAPTURE(per_band);
      StreamOptions so;
      so.overlap = overlap;
      so.per_band = per_band;
      so.open.num_threads = 3;
      so.write.num_threads = 2;
      so.write.creation_options = {"COMPRESS=DEFLATE", "TILED=YES", "BLOCKXSIZE=64",
                                   "BLOCKYSIZE=64"};
      std::int64_t progressed = 0, total = 0;
      so.progress = [&](std::int64_t done, std::int64_t of) { progressed = done, total = of; };
      const std::string out = dir.file("overlap.tif");
      process_raster_file(in, out, focal, plan, so);
      CHECK(bytes_of(read_raster(out)) == serial);
      CHECK(progressed == total);
      CHECK(total >= plan.n_tiles);
      fs::remove(out);
      // The tiles a visitor sees, in order, on the writing stage's thread.
      std::int64_t seen = 0;
      for_each_raster_tile(
          in, plan,
          [&](const OwnedRasterArray& tile, const TileInfo& where) {
            CHECK(where.index == seen++);
            CHECK(tile.band_count() == where.band_count);
          },
          so);
      CHECK(seen == progressed);
    }
  }
}
