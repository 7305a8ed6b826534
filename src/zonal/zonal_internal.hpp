// SPDX-License-Identifier: Apache-2.0
// What the zonal statistics' files share (zonal.hpp): option checks, the plan, the table.
#pragma once

#include "zonal/accumulator.hpp"

#include <vibespatial/raster/zonal.hpp>

#include <optional>
#include <string>
#include <vector>

namespace vibespatial::raster::detail {

/// Checks @p o's statistics and quantile. @throws ZonalInputError.
void check_stats(const ZonalOptions& o, bool have_weights);
/// Refuses (ZonalInputError naming @p what) a raster @p b not on @p a's grid.
void check_same_grid(const RasterMetadata& a, const RasterMetadata& b, const std::string& what);
/// Host bytes a run holds per pixel of a tile: @p m's tile, @p bands float64 copies, the
/// coverage and running sums, and the weights' tile and copy when @p weights is set.
std::uint64_t bytes_per_pixel(const RasterMetadata& m, std::size_t bands,
                              std::optional<DType> weights);
/// The plan of a run over @p m's grid at @p bytes_per_pixel host bytes (or o.tile_shape).
RasterPlan zonal_plan(const RasterMetadata& m, std::uint64_t bytes_per_pixel,
                      const ZonalOptions& o);
/// o.bands, or every band; checked against @p band_count.
std::vector<int> selected_bands(const ZonalOptions& o, int band_count);
/// The table of rows @p row_zone (zone indices, in row order) x @p labels.
ZonalTable make_table(const ZoneIds& ids, const std::vector<int>& row_zone,
                      const std::vector<int>& labels, std::vector<ZoneAccumulator>& acc,
                      const ZonalOptions& o, DType dtype);
/// A RasterFileSource's up-front host memory check for @p plan; nothing for other sources.
void prepare_source(TileSource& source, const RasterPlan& plan);

}  // namespace vibespatial::raster::detail
