// SPDX-License-Identifier: Apache-2.0
// The output-nodata rule's internals (output_nodata.cpp), shared with the ops facade (ops.cpp):
// the conversion kernel without its check, the exact identity of calc, and the one check that
// no valid pixel became the output's nodata.
#pragma once

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/ops.hpp>

#include <optional>

namespace vibespatial::raster::detail {

/// Whether @p dtype holds @p v exactly, as a pixel and (for the float types) as a double: the
/// rule's test of a candidate nodata.
bool nodata_fits(DType dtype, const NodataValue& v) noexcept;

/// convert_dtype's conversion (ops.cpp) without its check: invalid pixels written as
/// @p out_nodata (a double; none: NaN or 0), valid ones converted through the compute type.
OwnedRasterArray convert_pixels(const OwnedRasterArray& raster, DType out_dtype,
                                const std::optional<NodataValue>& out_nodata);

/// The conversion of convert_pixels through calc's evaluator (ops.cpp), which writes any exact
/// nodata, 64-bit sentinels a double cannot hold included; no check.
OwnedRasterArray convert_pixels_exact(const OwnedRasterArray& raster, DType out_dtype,
                                      const NodataValue& out_nodata);

/// The one check of the rule: every valid pixel of @p in is valid in @p out, whose nodata is
/// @p nodata, counted on @p stream (the one @p out was written on). @throws
/// std::invalid_argument naming the band, the count and the value, and what to give instead, as
/// @p who.
void check_no_valid_pixel_became_nodata(const char* who, const OwnedRasterArray& in,
                                        const OwnedRasterArray& out, const NodataValue& nodata,
                                        CUstream stream);

/// convert_output, its messages starting with @p who.
OwnedRasterArray convert_output_as(const char* who, const OwnedRasterArray& raster, DType out_dtype,
                                   const std::optional<NodataValue>& out_nodata);

}  // namespace vibespatial::raster::detail
