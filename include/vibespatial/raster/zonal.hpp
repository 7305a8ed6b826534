// SPDX-License-Identifier: Apache-2.0
// Zonal statistics: per zone (a polygon, or a value of a zone raster) and band, the statistics
// of the pixels inside, in one pass over the raster's tiles (docs/zonal-statistics.md).
//
// Glossary
// - zone: a polygon or multipolygon (ZoneSet, from an OGR layer, WKB or coordinates; in the
//   raster's CRS) or one integer value of a zone raster on the raster's grid.
// - coverage c of a pixel by a zone: PixelRule::fractional, the exact fraction of the pixel's
//   area inside the zone (holes subtract, the parts of a multipolygon add, stored as float32 as
//   exactextract stores it); center and all_touched: 1 for a selected pixel. A pixel shared by
//   zones counts for each. Pixels with c == 0 are not used.
// - valid pixel: not the band's nodata and not NaN. Invalid pixels add to no statistic.
// - table: one row per zone and band, zone-major, zones in input order (zone rasters: ascending
//   value), bands in the order asked. A zone with no used valid pixel has count, cell_count and
//   variety 0 and every other statistic null (NaN in the table).
// - one pass: the raster is read tile by tile (the planner's tiles within the budget); each tile
//   is reduced for every zone whose bounding box meets it, and the zones' partial statistics are
//   merged exactly across tiles (float64 sums, min/max, and each zone's exact (value, coverage)
//   multiset for the order statistics), so a result does not depend on the tiling.
#pragma once

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/export.hpp>
#include <vibespatial/raster/io.hpp>
#include <vibespatial/raster/tiles.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace vibespatial::raster {

/// Bad zones or zonal options: a geometry that is not a valid polygon, an empty layer, a missing
/// zone field, a zone raster of another grid or of a float dtype, an unknown statistic. Nothing
/// was computed or written.
class VSR_EXPORT ZonalInputError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// Which pixels a polygon zone uses, and with what coverage.
enum class PixelRule {
  fractional,  ///< every pixel the polygon covers, weighted by the covered fraction (exactextract)
  center,      ///< pixels whose centre is inside (GDAL rasterize's default), weight 1
  all_touched  ///< pixels whose interior meets the polygon's (GDAL's ALL_TOUCHED), weight 1
};

/// "fractional", "center" or "all-touched". Never throws.
VSR_EXPORT std::string_view to_string(PixelRule rule) noexcept;
/// The rule named @p text ("all_touched" also accepted). @throws ZonalInputError otherwise.
VSR_EXPORT PixelRule pixel_rule_from_string(std::string_view text);

/// The statistics zonal_stats computes, by name: count, sum, mean, min, max, stdev, variance,
/// median, quantile, majority, minority, variety, frac, weighted_mean, weighted_sum, cell_count.
VSR_EXPORT const std::vector<std::string>& zonal_stat_names();

/**
 * @brief The statistic names of a comma-separated list ("count,sum,mean"), checked.
 * @throws ZonalInputError for an empty list, an unknown name (the known ones are listed) or a
 *         name given twice.
 */
VSR_EXPORT std::vector<std::string> parse_zonal_stats(std::string_view list);

/// One polygon in world coordinates: rings of (x, y) points, the first the exterior, the others
/// holes; each ring closed or not (it is closed implicitly), in either orientation.
using ZoneRing = std::vector<std::pair<double, double>>;
using ZonePolygon = std::vector<ZoneRing>;
/// A zone's geometry: the polygons of a polygon or multipolygon (parts add; none: an empty zone).
using ZoneGeometry = std::vector<ZonePolygon>;

/// The zones' identifiers, one per zone: integers, reals or text.
struct ZoneIds {
  enum class Kind { integer, real, text };
  Kind kind = Kind::integer;
  std::vector<std::int64_t> integers;  ///< kind integer
  std::vector<double> reals;           ///< kind real
  std::vector<std::string> texts;      ///< kind text
  /// Zones.
  std::size_t size() const noexcept;
};

/// Polygon zones in the raster's CRS: one geometry and one identifier per zone.
struct ZoneSet {
  std::vector<ZoneGeometry> geometries;
  ZoneIds ids;  ///< empty: 0, 1, 2, ... (integers)
};

/// Where read_zone_layer finds polygon zones.
struct ZoneLayer {
  std::string path;        ///< a file OGR opens as vector data (GeoPackage, GeoJSON, Shapefile)
  std::string layer;       ///< layer name; empty: the first layer
  std::string zone_field;  ///< attribute giving the zone identifiers; empty: the feature ids
};

/**
 * @brief Reads the polygon zones of @p source, transformed (OGR) to @p target_crs when the layer
 * has another CRS (both must be known; empty: no transformation), in feature order. Each
 * feature must be a valid Polygon or MultiPolygon (GEOS validity); a null geometry is an empty
 * zone (a zero-coverage row).
 * @throws std::system_error for a missing file; ZonalInputError for a file OGR cannot open as
 *         vector data, a missing layer or zone field (the fields are listed), an empty layer, a
 *         point or line geometry, an invalid polygon (the feature and GEOS's reason), a
 *         transformation that fails; std::runtime_error in a build without GDAL.
 */
VSR_EXPORT ZoneSet read_zone_layer(const ZoneLayer& source, const std::string& target_crs = {});

/**
 * @brief Polygon zones from WKB (or EWKB without SRID) geometries: Polygon or MultiPolygon,
 * checked as read_zone_layer checks features; @p ids as ZoneSet::ids.
 * @throws ZonalInputError for bad WKB, points or lines, invalid polygons (naming the index);
 *         std::runtime_error in a build without GDAL.
 */
VSR_EXPORT ZoneSet zones_from_wkb(const std::vector<std::string>& wkb, ZoneIds ids = {});

/// How zonal_stats computes.
struct ZonalOptions {
  PixelRule pixels = PixelRule::fractional;
  /// Statistic names (zonal_stat_names), in the table's column order.
  std::vector<std::string> stats = {"count", "sum", "mean", "min", "max"};
  double quantile = 0.9;  ///< the q of "quantile", in [0, 1]
  /// 1-based bands of the raster (of the file, or of the in-memory raster), in order; empty: all.
  std::vector<int> bands;
  /// Host bytes the tiles read at once may take (values, weights, zones and coverage); 0: 256 MiB.
  std::uint64_t memory_budget = 0;
  /// Tile shape (rows, columns) instead of the planner's: for tests of the merge across tiles.
  std::optional<std::pair<std::int64_t, std::int64_t>> tile_shape;
  /// Threads reducing the zones of a tile (polygon zones): 0 every CPU, n > 0 that many.
  /// Results do not depend on it: each zone is reduced by one thread.
  int threads = 0;
  /// How raster files are opened (zonal_stats_file).
  OpenOptions open;
  /// Called after each tile with (tiles done, total), if set.
  std::function<void(std::int64_t done, std::int64_t total)> progress;
};

/// The result: columns of one row per zone and band (see the glossary).
struct ZonalTable {
  ZoneIds zone;                         ///< each row's zone identifier
  std::vector<int> band;                ///< each row's 1-based band
  std::vector<std::string> stat_names;  ///< the statistics' columns, in order
  /// values[s][row]: statistic stat_names[s] of the row (frac: NaN); NaN is null.
  std::vector<std::vector<double>> values;
  /// frac[row]: (value, share of count) per distinct value, ascending; empty unless "frac".
  std::vector<std::vector<std::pair<double, double>>> frac;
  /// Rows.
  std::size_t rows() const noexcept { return band.size(); }
  /// The column of @p stat. @throws std::out_of_range when it was not computed.
  const std::vector<double>& column(std::string_view stat) const;
};

/**
 * @brief Zonal statistics of @p values (its selected bands) over polygon @p zones (in the
 * raster's CRS), with the optional @p weights (one band on the same grid: weighted_mean and
 * weighted_sum use coverage x weight; an invalid weight is NaN). One pass over the tiles.
 * @throws ZonalInputError for options or zones it refuses (a rotated grid, weights on another
 *         grid, weighted statistics without weights, q outside [0, 1]); what the sources throw.
 * Thread-safety: concurrent calls with distinct sources are safe.
 */
VSR_EXPORT ZonalTable zonal_stats(TileSource& values, const ZoneSet& zones,
                                  const ZonalOptions& options, TileSource* weights = nullptr);

/**
 * @brief Zonal statistics of @p values over the zones of the integer zone raster @p zone_raster
 * (one band on the same grid; its nodata pixels belong to no zone). Rows for each zone value
 * found, ascending. The pixel rule does not apply (every pixel has coverage 1).
 * @throws ZonalInputError for a zone raster of another grid, of several bands or a float dtype;
 *         as the polygon form otherwise.
 */
VSR_EXPORT ZonalTable zonal_stats(TileSource& values, TileSource& zone_raster,
                                  const ZonalOptions& options, TileSource* weights = nullptr);

/// In-memory forms: @p values a host raster (its affine and CRS place it).
VSR_EXPORT ZonalTable zonal_stats(const OwnedRasterArray& values, const ZoneSet& zones,
                                  const ZonalOptions& options,
                                  const OwnedRasterArray* weights = nullptr);
VSR_EXPORT ZonalTable zonal_stats(const OwnedRasterArray& values,
                                  const OwnedRasterArray& zone_raster, const ZonalOptions& options,
                                  const OwnedRasterArray* weights = nullptr);

/**
 * @brief The plan a zonal_stats run over a raster of @p values' header follows (for a dry run):
 * the planner's tiles within options.memory_budget (or options.tile_shape), with a weights
 * raster of @p weights' dtype and a zone raster of @p zone_raster's when set.
 * @throws ZonalInputError for a band outside the raster or a non-positive tile shape.
 */
VSR_EXPORT RasterPlan zonal_stats_plan(const RasterMetadata& values, const ZonalOptions& options,
                                       std::optional<DType> weights = {},
                                       std::optional<DType> zone_raster = {});

/// Zones given as a file: a vector layer (polygons) or, when the file is a raster, a zone raster.
struct ZoneFile {
  std::string path;
  std::string layer;       ///< vector files: as ZoneLayer
  std::string zone_field;  ///< vector files: as ZoneLayer
};

/**
 * @brief Zonal statistics of the raster file @p raster_path (options.bands) over @p zones: a
 * vector file's layer (transformed to the raster's CRS) or a zone raster file; @p weights_path
 * (empty: none) a one-band raster file on the same grid. The vector-or-raster choice: a file
 * OGR opens with at least one layer is a vector, else a raster.
 * @throws what read_zone_layer, RasterFileSource and the TileSource forms throw.
 */
VSR_EXPORT ZonalTable zonal_stats_file(const std::string& raster_path, const ZoneFile& zones,
                                       const ZonalOptions& options,
                                       const std::string& weights_path = {});

/**
 * @brief zonal_stats_file over polygon @p zones already in the raster's CRS (WKB, shapely
 * geometries): the raster file's options.bands, @p weights_path as above.
 * @throws what RasterFileSource and the TileSource forms throw.
 */
VSR_EXPORT ZonalTable zonal_stats_file(const std::string& raster_path, const ZoneSet& zones,
                                       const ZonalOptions& options,
                                       const std::string& weights_path = {});

/// The table as a JSON array of one object per row: {"zone": id, "band": n, "<stat>": value
/// or null, ...}; frac an object {"<value>": share, ...}. Numbers with 17 significant digits.
VSR_EXPORT std::string zonal_table_json(const ZonalTable& table);
/// The table as CSV: a header row "zone,band,<stats>", empty cells for null, frac as
/// "value:share;value:share" (quoted). Text zone ids are quoted as CSV quotes them.
VSR_EXPORT std::string zonal_table_csv(const ZonalTable& table);

/**
 * @brief Writes @p table to @p path all or nothing (outputs.hpp): ".json" as zonal_table_json,
 * ".csv" as zonal_table_csv (any case).
 * @throws ZonalInputError for another extension; what write_file_atomically throws.
 */
VSR_EXPORT void write_zonal_table(const ZonalTable& table, const std::string& path,
                                  bool overwrite = true, const std::vector<KeptFile>& kept = {});

}  // namespace vibespatial::raster
