// SPDX-License-Identifier: Apache-2.0
// Polygon zones from files and WKB need GDAL/OGR: without it they throw (zonal.hpp).
#include <vibespatial/raster/zonal.hpp>

#include <stdexcept>

namespace vibespatial::raster {

namespace {
[[noreturn]] void unavailable(const char* what) {
  throw std::runtime_error(std::string(what) + ": vibespatial-raster was built without GDAL");
}
}  // namespace

ZoneSet read_zone_layer(const ZoneLayer&, const std::string&) {
  unavailable("read_zone_layer");
}
ZoneSet zones_from_wkb(const std::vector<std::string>&, ZoneIds) {
  unavailable("zones_from_wkb");
}
ZonalTable zonal_stats_file(const std::string&, const ZoneSet&, const ZonalOptions&,
                            const std::string&) {
  unavailable("zonal_stats_file");
}
ZonalTable zonal_stats_file(const std::string&, const ZoneFile&, const ZonalOptions&,
                            const std::string&) {
  unavailable("zonal_stats_file");
}

}  // namespace vibespatial::raster
