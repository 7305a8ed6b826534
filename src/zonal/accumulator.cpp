// SPDX-License-Identifier: Apache-2.0
// Partial zonal statistics and their merge (accumulator.hpp).
#include "zonal/accumulator.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace vibespatial::raster::detail {

namespace {

constexpr double nan = std::numeric_limits<double>::quiet_NaN();

bool is_integer_dtype(DType d) {
  return d != DType::float32 && d != DType::float64;
}

// A statistic computed in double, returned in the band's type as exactextract returns its
// quantiles: integers truncated toward zero, float32 rounded.
double in_dtype(double v, DType d) {
  if (is_integer_dtype(d)) return std::trunc(v);
  if (d == DType::float32) return static_cast<double>(static_cast<float>(v));
  return v;
}

// The weighted quantile over distinct values (exactextract's WeightedQuantiles): with n values
// v_k of weights W_k and cumulative weights S_k, s_k = k W_k + (n - 1) S_{k-1}; the target
// t = q S (n - 1) falls between the last s_l <= t and the first s_k > t.
double weighted_quantile(const std::vector<std::pair<double, double>>& h, double q) {
  const std::size_t n = h.size();
  if (n == 0) return nan;
  std::vector<double> s(n);
  double cumulative = 0;
  for (std::size_t k = 0; k < n; ++k) {
    s[k] = static_cast<double>(k) * h[k].second + static_cast<double>(n - 1) * cumulative;
    cumulative += h[k].second;
  }
  const double t = q * cumulative * static_cast<double>(n - 1);
  const auto it = std::upper_bound(s.begin(), s.end(), t);
  if (it == s.end()) return h[n - 1].first;
  const auto k = static_cast<std::size_t>(it - s.begin());
  if (k == 0) return h[0].first;
  const std::size_t l = k - 1;
  return h[l].first + (t - s[l]) * (h[k].first - h[l].first) / (s[k] - s[l]);
}

}  // namespace

StatNeeds stat_needs(const std::vector<std::string>& stats) {
  StatNeeds needs;
  for (const std::string& s : stats) {
    if (s == "median" || s == "quantile" || s == "majority" || s == "minority" || s == "variety" ||
        s == "frac") {
      needs.histogram = true;
    } else if (s == "weighted_mean" || s == "weighted_sum") {
      needs.weights = true;
    }
  }
  return needs;
}

void ZoneAccumulator::merge(const ZoneAccumulator& o) {
  if (o.cells == 0) return;
  if (cells == 0) {
    *this = o;
    return;
  }
  const double total = count + o.count;
  const double delta = o.mean - mean;
  m2 += o.m2 + delta * delta * (count * o.count / total);
  mean += delta * (o.count / total);
  count = total;
  cells += o.cells;
  sum += o.sum;
  weight_sum += o.weight_sum;
  weighted += o.weighted;
  min = std::min(min, o.min);
  max = std::max(max, o.max);
  histogram.insert(histogram.end(), o.histogram.begin(), o.histogram.end());
  maybe_compact();
}

void ZoneAccumulator::compact() {
  if (compacted == histogram.size()) return;
  std::sort(histogram.begin(), histogram.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::size_t out = 0;
  for (std::size_t i = 0; i < histogram.size(); ++i) {
    if (out > 0 && histogram[out - 1].first == histogram[i].first) {
      histogram[out - 1].second += histogram[i].second;
    } else {
      histogram[out++] = histogram[i];
    }
  }
  histogram.resize(out);
  compacted = out;
}

double final_stat(const std::string& stat, ZoneAccumulator& acc, DType dtype, double q) {
  if (stat == "count") return acc.cells == 0 ? 0.0 : acc.count;
  if (stat == "cell_count") return static_cast<double>(acc.cells);
  if (stat == "variety") {
    acc.compact();
    return static_cast<double>(acc.histogram.size());
  }
  if (acc.cells == 0) return nan;
  if (stat == "sum") return acc.sum;
  if (stat == "mean") return acc.count > 0 ? acc.sum / acc.count : nan;
  if (stat == "min") return acc.min;
  if (stat == "max") return acc.max;
  if (stat == "variance") return acc.count > 0 ? acc.m2 / acc.count : nan;
  if (stat == "stdev") return acc.count > 0 ? std::sqrt(acc.m2 / acc.count) : nan;
  if (stat == "weighted_sum") return acc.weighted;
  if (stat == "weighted_mean") return acc.weight_sum != 0 ? acc.weighted / acc.weight_sum : nan;
  if (stat == "frac") return nan;
  acc.compact();
  const auto& h = acc.histogram;
  if (stat == "median") return in_dtype(weighted_quantile(h, 0.5), dtype);
  if (stat == "quantile") return in_dtype(weighted_quantile(h, q), dtype);
  if (stat == "majority" || stat == "minority") {
    const bool majority = stat == "majority";
    std::size_t best = 0;
    for (std::size_t k = 1; k < h.size(); ++k) {
      // Ascending values: a tie goes to the later (larger) value for majority, the earlier
      // (smaller) for minority, as exactextract breaks them.
      if (majority ? h[k].second >= h[best].second : h[k].second < h[best].second) best = k;
    }
    return h.empty() ? nan : h[best].first;
  }
  return nan;
}

std::vector<std::pair<double, double>> final_frac(ZoneAccumulator& acc) {
  acc.compact();
  std::vector<std::pair<double, double>> out;
  out.reserve(acc.histogram.size());
  for (const auto& [v, c] : acc.histogram) out.emplace_back(v, c / acc.count);
  return out;
}

}  // namespace vibespatial::raster::detail
