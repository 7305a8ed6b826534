// SPDX-License-Identifier: Apache-2.0
// A raster written in parts, merged into one file (merge_raster_parts), and the file's block
// shape (RasterFileInfo::block_shape).
#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/io.hpp>
#include <vibespatial/raster/tiles.hpp>

#include <doctest/doctest.h>

#include <unistd.h>

#include <cfloat>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

using namespace vibespatial::raster;
namespace fs = std::filesystem;

namespace {

struct PartsDir {
  fs::path path;
  PartsDir() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("vsr-parts-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::create_directories(path);
  }
  ~PartsDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

const Affine kAffine{0.5, 0, 1000, 0, -0.5, 2000};

/// A raster whose every pixel differs, of any dtype, with @p nodata exactly.
OwnedRasterArray whole_raster(DType dtype, int bands, std::int64_t h, std::int64_t w,
                              std::optional<NodataValue> nodata) {
  const std::size_t n = static_cast<std::size_t>(bands * h * w);
  std::vector<unsigned char> raw(n * itemsize(dtype));
  for (std::size_t i = 0; i < n; ++i) {
    const double v = static_cast<double>(i % 97) + 1;
    switch (dtype) {
      case DType::uint8:
        raw[i] = static_cast<unsigned char>(v);
        break;
      case DType::int64: {
        const auto x = static_cast<std::int64_t>(v);
        std::memcpy(&raw[i * 8], &x, 8);
        break;
      }
      case DType::uint64: {
        const auto x = static_cast<std::uint64_t>(v);
        std::memcpy(&raw[i * 8], &x, 8);
        break;
      }
      case DType::float32: {
        const auto x = static_cast<float>(v) * 0.5F;
        std::memcpy(&raw[i * 4], &x, 4);
        break;
      }
      case DType::float64: {
        const double x = v * 0.25;
        std::memcpy(&raw[i * 8], &x, 8);
        break;
      }
      default:
        FAIL("no pattern for this dtype");
    }
  }
  return OwnedRasterArray::from_host(raw.data(), dtype, bands, h, w, {}, kAffine, "EPSG:32633")
      .with_nodata(nodata);
}

std::vector<std::byte> bytes_of(const OwnedRasterArray& r) {
  std::vector<std::byte> v(r.byte_size());
  r.copy_to_host(v.data());
  return v;
}

RasterMetadata layout_of(const OwnedRasterArray& r) {
  RasterMetadata m = r.metadata();
  m.driver.clear();
  return m;
}

/// The cuts of an axis of @p total into pieces of @p sizes.
std::vector<std::int64_t> starts(const std::vector<std::int64_t>& sizes) {
  std::vector<std::int64_t> s;
  std::int64_t at = 0;
  for (const std::int64_t n : sizes) {
    s.push_back(at);
    at += n;
  }
  return s;
}

/// Writes each cell of the grid (band, row and column sizes) of @p whole as a GeoTIFF part, as
/// the Dask layer does; returns the parts.
std::vector<RasterPart> write_parts(const OwnedRasterArray& whole, const PartsDir& dir,
                                    const std::vector<int>& band_sizes,
                                    const std::vector<std::int64_t>& row_sizes,
                                    const std::vector<std::int64_t>& col_sizes) {
  std::vector<RasterPart> parts;
  WriteOptions plain;
  plain.compress = "NONE";
  plain.tiled = false;
  int b0 = 0;
  for (const int nb : band_sizes) {
    std::vector<int> bands;
    for (int b = 0; b < nb; ++b) bands.push_back(b0 + b + 1);
    const std::vector<std::int64_t> rs = starts(row_sizes), cs = starts(col_sizes);
    for (std::size_t r = 0; r < rs.size(); ++r) {
      for (std::size_t c = 0; c < cs.size(); ++c) {
        const RasterWindow w{cs[c], rs[r], col_sizes[c], row_sizes[r]};
        RasterPart part;
        part.path = dir.file("part-b" + std::to_string(b0) + "-r" + std::to_string(rs[r]) + "-c" +
                             std::to_string(cs[c]) + ".tif");
        part.window = w;
        part.first_band = b0;
        write_raster(part.path, copy_window(whole, w, bands), plain);
        parts.push_back(part);
      }
    }
    b0 += nb;
  }
  return parts;
}

std::string contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

}  // namespace

TEST_CASE("read_raster_info gives band 1's block: a GeoTIFF's tiles or strips") {
  PartsDir dir;
  const OwnedRasterArray r = whole_raster(DType::float32, 2, 100, 70, std::nullopt);
  WriteOptions tiled;
  tiled.block = 32;
  write_raster(dir.file("tiled.tif"), r, tiled);
  CHECK(read_raster_info(dir.file("tiled.tif")).block_shape ==
        std::pair<std::int64_t, std::int64_t>{32, 32});
  WriteOptions strips;
  strips.tiled = false;
  strips.creation_options = {"BLOCKYSIZE=10"};
  write_raster(dir.file("strips.tif"), r, strips);
  CHECK(read_raster_info(dir.file("strips.tif")).block_shape ==
        std::pair<std::int64_t, std::int64_t>{10, 70});
}

TEST_CASE("merge_raster_parts writes the whole raster from a grid of parts, exactly") {
  PartsDir dir;
  SUBCASE("a regular grid of bands, rows and columns") {
    const OwnedRasterArray whole = whole_raster(DType::float32, 3, 40, 30, NodataValue(-1.5));
    const auto parts = write_parts(whole, dir, {2, 1}, {16, 16, 8}, {16, 14});
    const std::string out = dir.file("merged.tif");
    merge_raster_parts(parts, layout_of(whole), out);
    const OwnedRasterArray back = read_raster(out);
    CHECK(bytes_of(back) == bytes_of(whole));
    CHECK(back.affine() == kAffine);
    CHECK(back.exact_nodata() == NodataValue(-1.5));
    CHECK(back.dtype() == DType::float32);
    CHECK_FALSE(back.crs().empty());
    for (const RasterPart& p : parts) CHECK(fs::exists(p.path));  // read, never removed
  }
  SUBCASE("an irregular grid (Dask's evened-out last chunks): tiles straddle parts") {
    const OwnedRasterArray whole = whole_raster(DType::uint8, 1, 37, 41, NodataValue(0));
    const auto parts = write_parts(whole, dir, {1}, {20, 9, 8}, {7, 30, 4});
    merge_raster_parts(parts, layout_of(whole), dir.file("merged.tif"));
    CHECK(bytes_of(read_raster(dir.file("merged.tif"))) == bytes_of(whole));
  }
  SUBCASE("one part") {
    const OwnedRasterArray whole = whole_raster(DType::float64, 2, 5, 6, std::nullopt);
    const auto parts = write_parts(whole, dir, {2}, {5}, {6});
    WriteOptions o;
    o.compress = "LZW";
    merge_raster_parts(parts, layout_of(whole), dir.file("merged.tif"), o);
    const OwnedRasterArray back = read_raster(dir.file("merged.tif"));
    CHECK(bytes_of(back) == bytes_of(whole));
    CHECK_FALSE(back.exact_nodata().has_value());
  }
}

TEST_CASE("merge_raster_parts keeps 64-bit integer and extreme float nodata exactly") {
  struct Case {
    DType dtype;
    NodataValue nodata;
  };
  const Case cases[] = {
      {DType::int64, NodataValue::from_int64(std::numeric_limits<std::int64_t>::max())},
      {DType::int64, NodataValue::from_int64(std::numeric_limits<std::int64_t>::min())},
      {DType::uint64, NodataValue::from_uint64(std::numeric_limits<std::uint64_t>::max())},
      {DType::uint64, NodataValue::from_int64(7)},  // a small integer of either kind
      {DType::float64, NodataValue(DBL_MAX)},
      {DType::float64, NodataValue(-DBL_MAX)},
      {DType::float32, NodataValue(static_cast<double>(-FLT_MAX))},
  };
  for (const Case& c : cases) {
    CAPTURE(c.nodata.to_string());
    PartsDir dir;
    const OwnedRasterArray whole = whole_raster(c.dtype, 2, 12, 10, c.nodata);
    const auto parts = write_parts(whole, dir, {1, 1}, {6, 6}, {5, 5});
    merge_raster_parts(parts, layout_of(whole), dir.file("merged.tif"));
    const RasterFileInfo info = read_raster_info(dir.file("merged.tif"));
    REQUIRE(info.band_nodata.size() == 2);
    for (const auto& nd : info.band_nodata) {
      REQUIRE(nd.has_value());
      CHECK(nd->to_string() == c.nodata.to_string());
    }
    CHECK(bytes_of(read_raster(dir.file("merged.tif"))) == bytes_of(whole));
  }
}

TEST_CASE(
    "merge_raster_parts refuses parts that are not a grid of the raster, and writes nothing") {
  PartsDir dir;
  const OwnedRasterArray whole = whole_raster(DType::float32, 2, 20, 20, NodataValue(-1.0));
  const auto parts = write_parts(whole, dir, {1, 1}, {10, 10}, {10, 10});
  const RasterMetadata layout = layout_of(whole);
  const std::string out = dir.file("out.tif");
  {
    std::ofstream existing(out, std::ios::binary);
    existing << "the file that was there";
  }
  const auto refused = [&](std::vector<RasterPart> ps, const RasterMetadata& m, const char* says) {
    CAPTURE(says);
    CHECK_THROWS_WITH_AS(merge_raster_parts(ps, m, out), doctest::Contains(says),
                         std::invalid_argument);
    CHECK(contents(out) == "the file that was there");
  };

  refused({}, layout, "merge_raster_parts: no parts");
  std::vector<RasterPart> missing_one(parts.begin(), parts.end() - 1);
  refused(missing_one, layout, "7 parts for a grid of 2 x 2 x 2 cells");
  std::vector<RasterPart> twice = parts;
  twice[1] = twice[0];
  refused(twice, layout, "are both placed at band 0, row 0, column 0");
  std::vector<RasterPart> shifted = parts;
  shifted[1].window.col_off = 9;  // overlaps its neighbour by a column
  refused(shifted, layout, "8 parts for a grid of 2 x 2 x 3 cells");
  std::vector<RasterPart> outside = parts;
  outside[3].window.row_off = 15;
  refused(outside, layout, "outside the 2 x 20 x 20 raster");
  std::vector<RasterPart> wrong_band = parts;
  wrong_band[4].first_band = 0;
  refused(wrong_band, layout, "are both placed at band 0, row 0, column 0");

  RasterMetadata other_dtype = layout;
  other_dtype.dtype = DType::float64;
  refused(parts, other_dtype, "is float32, the raster float64");
  RasterMetadata other_nodata = layout;
  other_nodata.exact_nodata = NodataValue(-2.0);
  other_nodata.nodata = -2.0;
  refused(parts, other_nodata, "band 1 has nodata -1, the raster -2");
  RasterMetadata bigger = layout;
  bigger.width = 21;
  refused(parts, bigger, "holds columns 10 to 19, but its cell ends before column 21");
  std::vector<RasterPart> small = parts;
  small[0].window.height = 9;
  refused(small, layout, "is 10 x 10, its window 9 x 10");

  std::vector<RasterPart> gone = parts;
  gone[2].path = dir.file("no-such-part.tif");
  CHECK_THROWS_AS(merge_raster_parts(gone, layout, out), std::system_error);
  CHECK(contents(out) == "the file that was there");
  // No temporary is left beside the output.
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path)) ++entries;
  CHECK(entries == static_cast<int>(parts.size()) + 1);
}
