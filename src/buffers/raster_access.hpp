// SPDX-License-Identifier: Apache-2.0
// The library's access to an OwnedRasterArray handle's georeferencing (per handle, see
// buffers.hpp): the ops' output-into forms give a caller's output raster the result's metadata.
#pragma once

#include <vibespatial/raster/buffers.hpp>

#include <optional>
#include <string>

namespace vibespatial::raster::detail {

struct RasterAccess {
  /// Sets @p r's nodata, affine and CRS (this handle only; other handles keep theirs).
  static void set_georeferencing(OwnedRasterArray& r, std::optional<NodataValue> nodata,
                                 const Affine& affine, const std::string& crs) {
    r.nodata_ = nodata;
    r.affine_ = affine;
    r.crs_ = crs;
  }
};

}  // namespace vibespatial::raster::detail
