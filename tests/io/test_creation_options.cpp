// SPDX-License-Identifier: Apache-2.0
// Creation options that GDAL's validation lets through but the driver ignores (it warns and
// writes without them) or cannot make (a tile side with no upper bound in the option list):
// refused before the target is touched, by every write and by the trial of check_output_file,
// with messages that name the target, never the private temporary.
#include "temp_dir.hpp"

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/io.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

using namespace vibespatial::raster;
namespace fs = std::filesystem;

namespace {

OwnedRasterArray ramp(int bands) {
  OwnedRasterArray r =
      OwnedRasterArray::allocate(Residency::host, DType::float32, bands, 20, 30, std::nullopt,
                                 Affine{1, 0, 0, 0, -1, 20}, "EPSG:32633");
  auto* px = static_cast<float*>(r.mutable_host_data());
  for (std::int64_t i = 0; i < 20 * 30 * bands; ++i) px[i] = static_cast<float>(i % 97);
  return r;
}

WriteOptions with(const char* driver, std::vector<std::string> creation_options) {
  WriteOptions w;
  w.driver = driver;
  w.creation_options = std::move(creation_options);
  return w;
}

/// What @p call threw, checked to name @p target and no temporary; std::invalid_argument unless
/// @p any (a tile side GDAL refuses only when it makes the file: a whole write finds it there).
std::string refusal(const std::function<void()>& call, const std::string& target,
                    bool any = false) {
  try {
    call();
  } catch (const std::exception& e) {
    const std::string what = e.what();
    CAPTURE(what);
    CHECK((any || dynamic_cast<const std::invalid_argument*>(&e) != nullptr));
    CHECK(what.find(".vsr-") == std::string::npos);
    CHECK(what.find("'" + target + "'") != std::string::npos);
    return what;
  }
  FAIL("not refused");
  return "";
}

}  // namespace

TEST_CASE("a creation option the driver ignores or cannot make is refused up front") {
  vsr_test::TempDir dir("vsr-co");
  const OwnedRasterArray r = ramp(2);
  const std::string out = dir.file("out.tif");
  const auto both = [&](const WriteOptions& w, const std::string& says, bool at_make = false) {
    CAPTURE(says);
    CHECK_NOTHROW(check_write_options(w));  // GDAL's validation lets it through
    CHECK(refusal([&] { write_raster(out, r, w); }, out, at_make).find(says) != std::string::npos);
    CHECK(refusal([&] { check_output_file(out, w, DType::float32, 2); }, out).find(says) !=
          std::string::npos);
    CHECK_FALSE(fs::exists(out));
  };
  // GTiff lists ZLEVEL, ZSTD_LEVEL and JPEG_QUALITY as int without a range: it warns
  // "ZLEVEL=99 value not recognised, ignoring" and writes with its default.
  both(with("GTiff", {"ZLEVEL=99"}), "does not take the creation option ZLEVEL=99");
  both(with("GTiff", {"COMPRESS=ZSTD", "ZSTD_LEVEL=99"}), "ZSTD_LEVEL=99");
  both(with("GTiff", {"COMPRESS=JPEG", "jpeg_quality=500"}), "jpeg_quality=500");
  // COG passes LEVEL on as GTiff's ZLEVEL.
  both(with("COG", {"COMPRESS=DEFLATE", "LEVEL=99"}), "LEVEL=99");
  // A tile side GDAL cannot make: COG fails only at its conversion, after every pixel.
  both(with("COG", {"BLOCKSIZE=99999999"}), "99999999", true);
  // What the drivers take is written.
  write_raster(out, r, with("GTiff", {"ZLEVEL=9"}));
  check_output_file(dir.file("c.tif"), with("COG", {"BLOCKSIZE=256", "LEVEL=9"}), DType::float32,
                    2);
  write_raster(dir.file("c.tif"), r, with("COG", {"BLOCKSIZE=256", "LEVEL=9"}));
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"c.tif", "out.tif"});
}
