// SPDX-License-Identifier: Apache-2.0
// The warp's kernels (warp_kernel.hpp) on hand-made windows and coordinates: GDAL's rules for
// nearest, the 2x2 and 4x4 formulas, renormalisation around invalid taps, the centre rule,
// integer rounding and the move off the output's nodata. Builds without GDAL.
#include "warp/warp_kernel.hpp"

#include <vibespatial/raster/warp.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

using namespace vibespatial::raster;
using detail::WarpKernelArgs;
using detail::WarpSourceWindow;
using detail::WarpValidity;

namespace {

// One output pixel sampled at source coordinate (x, y) of a w x h float64 window.
template <class T>
T sample(const std::vector<T>& pixels, std::int64_t w, std::int64_t h, DType dtype, WarpMethod m,
         double x, double y, std::optional<NodataValue> nodata = {},
         std::optional<NodataValue> dst_nodata = {}) {
  WarpSourceWindow src{pixels.data(), dtype, 1, {0, 0, w, h}};
  WarpValidity validity{{nodata}, false};
  WarpKernelArgs args;
  args.method = m;
  args.src_x = &x;
  args.src_y = &y;
  args.width = args.height = 1;
  args.dst_nodata = dst_nodata ? dst_nodata : nodata;
  T out{};
  detail::warp_tile(src, validity, args, &out);
  return out;
}

}  // namespace

TEST_CASE("warp kernels: the methods' names are gdalwarp's") {
  CHECK(warp_method_from_string("near") == WarpMethod::nearest);
  CHECK(warp_method_from_string("cubicspline") == WarpMethod::cubicspline);
  CHECK(to_string(WarpMethod::lanczos) == "lanczos");
  CHECK(warp_method_from_string("q3") == WarpMethod::q3);
  CHECK(to_string(WarpMethod::rms) == "rms");
  CHECK_THROWS_AS(warp_method_from_string("sum"), std::invalid_argument);
}

TEST_CASE("warp kernels: nearest takes the pixel under the centre; outside stays nodata") {
  const std::vector<double> v = {1, 2, 3, 4, 5, 6};  // 3 x 2
  CHECK(sample(v, 3, 2, DType::float64, WarpMethod::nearest, 1.7, 1.2) == 5);
  CHECK(sample(v, 3, 2, DType::float64, WarpMethod::nearest, 3.0, 1.0, -1.0) == -1);
  CHECK(sample(v, 3, 2, DType::float64, WarpMethod::nearest, -0.01, 1.0, -1.0) == -1);
}

TEST_CASE("warp kernels: bilinear weights, and renormalisation around a nodata tap") {
  const std::vector<double> v = {10, 20, 30, 40};  // 2 x 2
  // centre of the window: the mean of the four
  CHECK(sample(v, 2, 2, DType::float64, WarpMethod::bilinear, 1.0, 1.0) == doctest::Approx(25));
  // a quarter pixel right of the centre: 3/4 of the right column's weight
  CHECK(sample(v, 2, 2, DType::float64, WarpMethod::bilinear, 1.25, 1.0) ==
        doctest::Approx(0.5 * (0.25 * 10 + 0.75 * 20) + 0.5 * (0.25 * 30 + 0.75 * 40)));
  // 40 is nodata: the three others, their weights renormalised
  const std::vector<double> n = {10, 20, 30, -9999};
  CHECK(sample(n, 2, 2, DType::float64, WarpMethod::bilinear, 0.9, 0.9, -9999.0) ==
        doctest::Approx((0.6 * 0.6 * 10 + 0.4 * 0.6 * 20 + 0.6 * 0.4 * 30) / (0.36 + 0.24 + 0.24)));
  // the centre on the nodata pixel: nodata, whatever the neighbours
  CHECK(sample(n, 2, 2, DType::float64, WarpMethod::bilinear, 1.6, 1.6, -9999.0) == -9999);
}

TEST_CASE("warp kernels: cubic is the bilinear result at the border, Catmull-Rom inside") {
  std::vector<double> v(36);
  for (int i = 0; i < 36; ++i) v[static_cast<std::size_t>(i)] = (i % 6) * (i % 6);  // x^2
  const double border = sample(v, 6, 6, DType::float64, WarpMethod::cubic, 1.25, 3.0);
  const double bilinear = sample(v, 6, 6, DType::float64, WarpMethod::bilinear, 1.25, 3.0);
  CHECK(border == doctest::Approx(bilinear));
  // Catmull-Rom reproduces a quadratic: at x = 2.75 - 0.5 = 2.25 it gives 2.25^2
  CHECK(sample(v, 6, 6, DType::float64, WarpMethod::cubic, 2.75, 3.0) == doctest::Approx(5.0625));
}

TEST_CASE("warp kernels: integer results rounded, clamped, and moved off the output's nodata") {
  const std::vector<std::uint8_t> v = {0, 255, 0, 255};
  CHECK(sample(v, 2, 2, DType::uint8, WarpMethod::bilinear, 1.0, 1.0) == 128);  // 127.5 -> 128
  const std::vector<std::uint8_t> z = {0, 0, 0, 0};
  // a valid 0 with a dst nodata of 0 becomes 1 (GDAL moves it up from the type's minimum)
  CHECK(sample(z, 2, 2, DType::uint8, WarpMethod::bilinear, 1.0, 1.0, std::nullopt,
               NodataValue(0.0)) == 1);
  // nearest copies the value as is
  CHECK(sample(z, 2, 2, DType::uint8, WarpMethod::nearest, 1.0, 1.0, std::nullopt,
               NodataValue(0.0)) == 0);
  const std::vector<std::int16_t> big = {32767, 32767, 32767, 32767};
  CHECK(sample(big, 2, 2, DType::int16, WarpMethod::lanczos, 1.0, 1.0) == 32767);
}

TEST_CASE("warp kernels: NaN is a value without a nodata, and invalid with a NaN nodata") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> v = {1, nan, 3, 4};
  CHECK(std::isnan(sample(v, 2, 2, DType::float64, WarpMethod::bilinear, 1.0, 1.0)));
  CHECK(sample(v, 2, 2, DType::float64, WarpMethod::bilinear, 0.9, 0.9, NodataValue(nan)) ==
        doctest::Approx((0.6 * 0.6 * 1 + 0.6 * 0.4 * 3 + 0.4 * 0.4 * 4) / (0.36 + 0.24 + 0.16)));
}

namespace {

// One output pixel whose corners land at (x0, y0) and (x1, y1) of a w x h float64 window.
double footprint(const std::vector<double>& pixels, std::int64_t w, std::int64_t h, WarpMethod m,
                 double x0, double y0, double x1, double y1) {
  WarpSourceWindow src{pixels.data(), DType::float64, 1, {0, 0, w, h}};
  WarpValidity validity{{NodataValue(-1.0)}, false};
  // the corners of a 1 x 1 output: (0,0) (1,0) / (0,1) (1,1); the kernel reads TL and BR
  const double xs[4] = {x0, 0, 0, x1}, ys[4] = {y0, 0, 0, y1};
  WarpKernelArgs args;
  args.method = m;
  args.src_x = xs;
  args.src_y = ys;
  args.width = args.height = 1;
  args.dst_nodata = NodataValue(-1.0);
  double out = 0;
  detail::warp_tile(src, validity, args, &out);
  return out;
}

}  // namespace

TEST_CASE("warp kernels: the footprint methods as GDAL's (edge weights, ranks, mode's ties)") {
  const std::vector<double> row = {10, 20, 40};  // 3 x 1
  // columns 0..2 covered from 0.5 to 2.5: weights 0.5, 1, 0.5
  CHECK(footprint(row, 3, 1, WarpMethod::average, 0.5, 0, 2.5, 1) == doctest::Approx(22.5));
  const std::vector<double> four = {1, 2, 3, 4};  // 4 x 1
  CHECK(footprint(four, 4, 1, WarpMethod::rms, 0, 0, 4, 1) == doctest::Approx(2.7386127875));
  CHECK(footprint(four, 4, 1, WarpMethod::med, 0, 0, 4, 1) == 2);
  CHECK(footprint(four, 4, 1, WarpMethod::q1, 0, 0, 4, 1) == 1);
  CHECK(footprint(four, 4, 1, WarpMethod::q3, 0, 0, 4, 1) == 3);
  CHECK(footprint(four, 4, 1, WarpMethod::mode, 0, 0, 4, 1) == 1);
  CHECK(footprint(four, 4, 1, WarpMethod::max, 0, 0, 4, 1) == 4);
  const std::vector<double> holes = {-1, 5, -1, 3};  // nodata -1 left out
  CHECK(footprint(holes, 4, 1, WarpMethod::min, 0, 0, 4, 1) == 3);
  CHECK(footprint(holes, 4, 1, WarpMethod::average, 0, 0, 1, 1) == -1);  // only nodata: none
}
