// SPDX-License-Identifier: Apache-2.0
// The warp methods' names (gdalwarp's -r), in every build.
#include <vibespatial/raster/warp.hpp>

#include <array>
#include <string>
#include <utility>

namespace vibespatial::raster {

namespace {

constexpr std::array<std::pair<WarpMethod, std::string_view>, 13> names = {{
    {WarpMethod::nearest, "near"},
    {WarpMethod::bilinear, "bilinear"},
    {WarpMethod::cubic, "cubic"},
    {WarpMethod::cubicspline, "cubicspline"},
    {WarpMethod::lanczos, "lanczos"},
    {WarpMethod::average, "average"},
    {WarpMethod::mode, "mode"},
    {WarpMethod::max, "max"},
    {WarpMethod::min, "min"},
    {WarpMethod::med, "med"},
    {WarpMethod::q1, "q1"},
    {WarpMethod::q3, "q3"},
    {WarpMethod::rms, "rms"},
}};

}  // namespace

std::string_view to_string(WarpMethod method) noexcept {
  for (const auto& [m, name] : names) {
    if (m == method) return name;
  }
  return "unknown";
}

WarpMethod warp_method_from_string(std::string_view name) {
  if (name == "nearest") return WarpMethod::nearest;
  for (const auto& [m, n] : names) {
    if (n == name) return m;
  }
  throw std::invalid_argument("warp: unknown resampling method '" + std::string(name) +
                              "' (near, bilinear, cubic, cubicspline, lanczos, average, mode, "
                              "max, min, med, q1, q3, rms)");
}

}  // namespace vibespatial::raster
