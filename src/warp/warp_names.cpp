// SPDX-License-Identifier: Apache-2.0
// The warp methods' names (gdalwarp's -r), in every build.
#include <vibespatial/raster/warp.hpp>

#include <string>

namespace vibespatial::raster {

std::string_view to_string(WarpMethod method) noexcept {
  switch (method) {
    case WarpMethod::nearest:
      return "near";
    case WarpMethod::bilinear:
      return "bilinear";
    case WarpMethod::cubic:
      return "cubic";
    case WarpMethod::cubicspline:
      return "cubicspline";
    case WarpMethod::lanczos:
      return "lanczos";
  }
  return "unknown";
}

WarpMethod warp_method_from_string(std::string_view name) {
  if (name == "near" || name == "nearest") return WarpMethod::nearest;
  if (name == "bilinear") return WarpMethod::bilinear;
  if (name == "cubic") return WarpMethod::cubic;
  if (name == "cubicspline") return WarpMethod::cubicspline;
  if (name == "lanczos") return WarpMethod::lanczos;
  throw std::invalid_argument("warp: unknown resampling method '" + std::string(name) +
                              "' (near, bilinear, cubic, cubicspline, lanczos)");
}

}  // namespace vibespatial::raster
