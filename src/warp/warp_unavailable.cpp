// SPDX-License-Identifier: Apache-2.0
// warp.hpp in a build without GDAL: the API links and every call says why it cannot work.
#include <vibespatial/raster/warp.hpp>

#include <stdexcept>
#include <string>

namespace vibespatial::raster {

namespace {

[[noreturn]] void unavailable(const char* what) {
  throw std::runtime_error(std::string(what) +
                           ": vibespatial-raster was built without GDAL (install libgdal-dev "
                           "and reconfigure with -Dgdal=enabled)");
}

}  // namespace

WarpGrid plan_warp_grid(const RasterMetadata& /*source*/, const WarpOptions& /*options*/) {
  unavailable("plan_warp_grid");
}

WarpGrid plan_warp_grid(const std::string& /*path*/, const WarpOptions& /*options*/,
                        const OpenOptions& /*open*/) {
  unavailable("plan_warp_grid");
}

WarpPlan plan_warp(const RasterMetadata& /*source*/, const WarpGrid& /*grid*/,
                   const WarpOptions& /*options*/) {
  unavailable("plan_warp");
}

OwnedRasterArray warp(const OwnedRasterArray& /*source*/, const WarpGrid& /*grid*/,
                      const WarpOptions& /*options*/) {
  unavailable("warp");
}

void warp_raster_file(const std::string& /*input*/, const std::string& /*output*/,
                      const WarpOptions& /*options*/, const WriteOptions& /*write*/,
                      const OpenOptions& /*open*/) {
  unavailable("warp_raster_file");
}

struct WarpedSource::State {};

WarpedSource::WarpedSource(TileSource& /*source*/, const WarpGrid& /*grid*/,
                           const WarpOptions& /*options*/) {
  unavailable("WarpedSource");
}

WarpedSource::~WarpedSource() = default;

RasterMetadata WarpedSource::metadata() const {
  unavailable("WarpedSource");
}

std::vector<std::optional<NodataValue>> WarpedSource::band_nodata() const {
  unavailable("WarpedSource");
}

OwnedRasterArray WarpedSource::read(const RasterWindow& /*window*/, int /*first_band*/,
                                    int /*band_count*/) {
  unavailable("WarpedSource");
}

}  // namespace vibespatial::raster
