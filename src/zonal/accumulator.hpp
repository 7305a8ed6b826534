// SPDX-License-Identifier: Apache-2.0
// The partial statistics of one zone and band (zonal.hpp), their exact merge, and the final
// statistics.
//
// A partial holds float64 sums (coverage, coverage x value, coverage x weight, coverage x weight
// x value), the weighted mean and sum of squared deviations (West's incremental form, merged by
// Chan's rule), min and max, the used pixel count, and, when an order statistic is asked for,
// every (value, coverage) pair, compacted to one pair per distinct value. Merging two partials
// is exact for everything but the float64 sums' rounding order.
#pragma once

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/zonal.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace vibespatial::raster::detail {

/// What the statistics asked for need from each pixel.
struct StatNeeds {
  bool histogram = false;  ///< median, quantile, majority, minority, variety, frac
  bool weights = false;    ///< weighted_mean, weighted_sum
};

/// The needs of @p stats (checked names). @throws ZonalInputError for an unknown name.
StatNeeds stat_needs(const std::vector<std::string>& stats);

/// One zone's and band's partial statistics.
struct ZoneAccumulator {
  double count = 0;         ///< sum of coverage
  double sum = 0;           ///< sum of coverage x value
  double weight_sum = 0;    ///< sum of coverage x weight
  double weighted = 0;      ///< sum of coverage x weight x value
  double mean = 0, m2 = 0;  ///< West: running weighted mean and squared deviations (weight count)
  double min = std::numeric_limits<double>::infinity();
  double max = -std::numeric_limits<double>::infinity();
  std::int64_t cells = 0;                            ///< used valid pixels
  std::vector<std::pair<double, double>> histogram;  ///< (value, coverage); see compact
  std::size_t compacted = 0;  ///< histogram[0, compacted) is sorted with distinct values

  /// Adds a valid pixel of @p value with coverage @p c > 0 and @p weight (NaN when invalid).
  void add(double value, double c, double weight, const StatNeeds& needs) {
    ++cells;
    count += c;
    sum += c * value;
    if (needs.weights) {
      weight_sum += c * weight;
      weighted += c * weight * value;
    }
    const double total = count;
    const double delta = value - mean;
    mean += delta * (c / total);
    m2 += c * delta * (value - mean);
    if (value < min) min = value;
    if (value > max) max = value;
    if (needs.histogram) histogram.emplace_back(value, c);
  }
  /// Merges @p other into this (exact; see the file comment).
  void merge(const ZoneAccumulator& other);
  /// Sorts the histogram and sums the coverage of equal values.
  void compact();
  /// Compacts when the histogram has grown well past its last compaction.
  void maybe_compact() {
    if (histogram.size() > 2 * compacted + 4096) compact();
  }
};

/// The value of @p stat for @p acc (NaN: null) of a band of @p dtype, quantile @p q.
double final_stat(const std::string& stat, ZoneAccumulator& acc, DType dtype, double q);

/// The (value, share of count) pairs of @p acc, ascending (compacts it).
std::vector<std::pair<double, double>> final_frac(ZoneAccumulator& acc);

}  // namespace vibespatial::raster::detail
