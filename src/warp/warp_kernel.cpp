// SPDX-License-Identifier: Apache-2.0
// GDAL 3.6's warp kernels (gdalwarpkernel.cpp, the general path with masks) over a source window
// and one source coordinate per output pixel: the nearest pixel, the 2x2 bilinear and 4x4 cubic
// formulas at scales >= 0.95, the general separable kernel otherwise (and always for the cubic
// B-spline), GDAL's optimised Lanczos; invalid taps dropped and weights renormalised; integer
// results clamped, rounded and moved off the output's nodata as GDAL does.
#include "warp/warp_kernel.hpp"

#include "common/dtype_visit.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <type_traits>

namespace vibespatial::raster::detail {

int warp_kernel_radius(WarpMethod method) noexcept {
  switch (method) {
    case WarpMethod::nearest:
      return 0;
    case WarpMethod::bilinear:
      return 1;
    case WarpMethod::cubic:
    case WarpMethod::cubicspline:
      return 2;
    case WarpMethod::lanczos:
      return 3;
    default:
      return 0;  // the footprint methods
  }
}

bool warp_uses_corners(WarpMethod method) noexcept {
  switch (method) {
    case WarpMethod::nearest:
    case WarpMethod::bilinear:
    case WarpMethod::cubic:
    case WarpMethod::cubicspline:
    case WarpMethod::lanczos:
      return false;
    default:
      return true;
  }
}

namespace {

// The window as the kernels read it: every band as doubles, and the validity of each pixel.
struct Taps {
  std::int64_t w = 0, h = 0;
  std::vector<double> values;                   // band-major
  std::vector<std::uint8_t> unified;            // empty: every pixel valid
  std::vector<std::vector<std::uint8_t>> band;  // per band; empty: every value valid
  int current = 0;                              // the band being resampled
  bool int16 = false;                           // GDAL's mode takes a result of -1 as none there

  double value(std::int64_t x, std::int64_t y) const {
    return values[static_cast<std::size_t>(current * w * h + y * w + x)];
  }
  bool valid(std::int64_t x, std::int64_t y) const {
    const auto i = static_cast<std::size_t>(y * w + x);
    if (!unified.empty() && !unified[i]) return false;
    const auto& m = band[static_cast<std::size_t>(current)];
    return m.empty() || m[i] != 0;
  }
  bool inside(std::int64_t x, std::int64_t y) const { return x >= 0 && y >= 0 && x < w && y < h; }
};

template <class T>
bool type_holds_nodata(double nodata) {
  if constexpr (std::is_floating_point_v<T>) {
    return true;
  } else {
    const double v = std::floor(nodata + 1e-6);
    return v >= static_cast<double>(std::numeric_limits<T>::min()) &&
           v <= static_cast<double>(std::numeric_limits<T>::max());
  }
}

// GDALWarpNoDataMasker's comparison: integers against floor(nodata + 1e-6), floats within a
// relative FLT_EPSILON (float's, also for doubles), NaN nodata matching NaN.
template <class T>
bool is_nodata(T value, double nodata) {
  if constexpr (std::is_floating_point_v<T>) {
    const double v = static_cast<double>(value);
    if (std::isnan(nodata)) return std::isnan(v);
    return v == nodata || std::fabs(v - nodata) < FLT_EPSILON * std::fabs(v + nodata) * 2;
  } else {
    return static_cast<double>(value) == std::floor(nodata + 1e-6);
  }
}

template <class T>
Taps make_taps(const WarpSourceWindow& src, const WarpValidity& validity) {
  Taps t;
  t.w = src.window.width;
  t.h = src.window.height;
  t.int16 = std::is_same_v<T, std::int16_t>;
  const auto n = static_cast<std::size_t>(t.w * t.h);
  const auto* p = static_cast<const T*>(src.pixels);
  t.values.resize(n * static_cast<std::size_t>(src.bands));
  for (std::size_t i = 0; i < t.values.size(); ++i) t.values[i] = static_cast<double>(p[i]);
  t.band.resize(static_cast<std::size_t>(src.bands));
  bool any = false;
  for (int b = 0; b < src.bands; ++b) {
    const auto& nd = validity.band_nodata[static_cast<std::size_t>(b)];
    if (!nd || !type_holds_nodata<T>(nd->to_double())) continue;
    auto& m = t.band[static_cast<std::size_t>(b)];
    m.resize(n);
    const T* band = p + static_cast<std::size_t>(b) * n;
    for (std::size_t i = 0; i < n; ++i) m[i] = is_nodata(band[i], nd->to_double()) ? 0 : 1;
    any = true;
  }
  if (!any) return t;
  // The unified mask: a pixel is valid when any band is (one band: its own mask).
  t.unified.assign(n, 0);
  for (int b = 0; b < src.bands; ++b) {
    const auto& m = t.band[static_cast<std::size_t>(b)];
    for (std::size_t i = 0; i < n; ++i) t.unified[i] |= m.empty() ? 1 : m[i];
  }
  if (validity.unified_only || src.bands == 1) {
    for (auto& m : t.band) m.clear();
  }
  return t;
}

double cubic_weight(double x) {
  x = std::fabs(x);
  if (x <= 1) return 1.5 * x * x * x - 2.5 * x * x + 1;
  if (x <= 2) return -0.5 * x * x * x + 2.5 * x * x - 4 * x + 2;
  return 0;
}

// Six times the cubic B-spline as GDAL evaluates it: the sum of truncated powers
// (x+2)^3+ - 4(x+1)^3+ + 6x^3+ - 4(x-1)^3+, without the (x-2)^3+ term, so that it is not zero
// (but slightly negative) for x > 2, which downsampling reaches; GDAL's results include that.
double bspline_weight(double x) {
  const auto cube = [](double u) { return u > 0 ? u * u * u : 0.0; };
  return cube(x + 2) - 4 * cube(x + 1) + 6 * cube(x) - 4 * cube(x - 1);
}

double triangle_weight(double x) {
  x = std::fabs(x);
  return x < 1 ? 1 - x : 0;
}

double lanczos_weight(double x) {
  if (x == 0) return 1;
  if (std::fabs(x) >= 3) return 0;
  const double pi_x = std::numbers::pi * x;
  return std::sin(pi_x) * std::sin(pi_x / 3) / (pi_x * pi_x / 3);
}

// GWKBilinearResample4Sample: the 2x2 taps around (sx, sy), invalid ones dropped.
std::optional<double> bilinear4(const Taps& t, double sx, double sy) {
  const auto i0 = static_cast<std::int64_t>(std::floor(sx - 0.5));
  const auto j0 = static_cast<std::int64_t>(std::floor(sy - 0.5));
  const double fx = sx - 0.5 - static_cast<double>(i0), fy = sy - 0.5 - static_cast<double>(j0);
  const double wx[2] = {1 - fx, fx}, wy[2] = {1 - fy, fy};
  double acc = 0, div = 0;
  for (int j = 0; j < 2; ++j) {
    for (int i = 0; i < 2; ++i) {
      const std::int64_t x = i0 + i, y = j0 + j;
      if (!t.inside(x, y) || !t.valid(x, y)) continue;
      const double w = wx[i] * wy[j];
      acc += w * t.value(x, y);
      div += w;
    }
  }
  if (div < 1e-5) return std::nullopt;
  return div == 1 ? acc : acc / div;
}

// GWKCubicResample4Sample: Catmull-Rom over 4x4 taps; the bilinear result at the window's border
// and where any of the 16 taps is invalid.
std::optional<double> cubic4(const Taps& t, double sx, double sy) {
  const auto i0 = static_cast<std::int64_t>(sx - 0.5);
  const auto j0 = static_cast<std::int64_t>(sy - 0.5);
  if (i0 - 1 < 0 || j0 - 1 < 0 || i0 + 2 >= t.w || j0 + 2 >= t.h) return bilinear4(t, sx, sy);
  for (std::int64_t y = j0 - 1; y <= j0 + 2; ++y) {
    for (std::int64_t x = i0 - 1; x <= i0 + 2; ++x) {
      if (!t.valid(x, y)) return bilinear4(t, sx, sy);
    }
  }
  const auto weights = [](double f, double* w) {
    w[0] = (-f + 2 * f * f - f * f * f) / 2;
    w[1] = 1 - 2.5 * f * f + 1.5 * f * f * f;
    w[2] = (f + 4 * f * f - 3 * f * f * f) / 2;
    w[3] = (f * f * f - f * f) / 2;
  };
  double wx[4], wy[4];
  weights(sx - 0.5 - static_cast<double>(i0), wx);
  weights(sy - 0.5 - static_cast<double>(j0), wy);
  double acc = 0;
  for (int j = 0; j < 4; ++j) {
    double row = 0;
    for (int i = 0; i < 4; ++i) row += wx[i] * t.value(i0 - 1 + i, j0 - 1 + j);
    acc += wy[j] * row;
  }
  return acc;
}

// GWKResample: the separable kernel of radius r, stretched by 1/scale when downsampling,
// truncated at the window and at invalid taps and renormalised.
std::optional<double> general(const Taps& t, double sx, double sy, double (*k)(double), int r,
                              double x_scale, double y_scale) {
  const double s_x = std::min(x_scale, 1.0), s_y = std::min(y_scale, 1.0);
  const int nx = x_scale < 1 ? static_cast<int>(std::ceil(r / x_scale)) : r;
  const int ny = y_scale < 1 ? static_cast<int>(std::ceil(r / y_scale)) : r;
  const auto i0 = static_cast<std::int64_t>(std::floor(sx - 0.5));
  const auto j0 = static_cast<std::int64_t>(std::floor(sy - 0.5));
  const double fx = sx - 0.5 - static_cast<double>(i0), fy = sy - 0.5 - static_cast<double>(j0);
  const int first = (r + 1) % 2;
  double acc = 0, div = 0;
  for (int j = first - ny; j <= ny; ++j) {
    const std::int64_t y = j0 + j;
    if (y < 0 || y >= t.h) continue;
    const double wy = k((j - fy) * s_y);
    double row = 0, row_w = 0;
    for (int i = first - nx; i <= nx; ++i) {
      const std::int64_t x = i0 + i;
      if (x < 0 || x >= t.w || !t.valid(x, y)) continue;
      const double wx = k((i - fx) * s_x);
      row += wx * t.value(x, y);
      row_w += wx;
    }
    acc += wy * row;
    div += wy * row_w;
  }
  if (div < 1e-6) return std::nullopt;
  return std::fabs(div - 1) < 1e-5 ? acc : acc / div;
}

// GWKResampleOptimizedLanczos: at scale >= 1 the taps within 3 of (sx, sy); when downsampling
// the weights L(i * scale), which GDAL computes without the fractional offset. Fewer valid
// taps than half of those in the window: no value.
std::optional<double> lanczos(const Taps& t, double sx, double sy, double x_scale, double y_scale) {
  const auto i0 = static_cast<std::int64_t>(std::floor(sx - 0.5));
  const auto j0 = static_cast<std::int64_t>(std::floor(sy - 0.5));
  const double fx = sx - 0.5 - static_cast<double>(i0), fy = sy - 0.5 - static_cast<double>(j0);
  const int nx = x_scale < 1 ? static_cast<int>(std::ceil(3 / x_scale)) : 3;
  const int ny = y_scale < 1 ? static_cast<int>(std::ceil(3 / y_scale)) : 3;
  const auto weight = [](int i, double f, double scale) {
    if (scale >= 1) return std::fabs(i - f) <= 3 ? lanczos_weight(i - f) : 0.0;
    return std::fabs(i * scale) <= 3 ? lanczos_weight(i * scale) : 0.0;
  };
  const auto used = [](int i, double f, double scale) {
    return scale >= 1 ? std::fabs(i - f) <= 3 : std::fabs(i * scale) <= 3;
  };
  double acc = 0, div = 0;
  int taps = 0, valid = 0;
  for (int j = -ny; j <= ny; ++j) {
    const std::int64_t y = j0 + j;
    if (y < 0 || y >= t.h || !used(j, fy, y_scale)) continue;
    const double wy = weight(j, fy, y_scale);
    for (int i = -nx; i <= nx; ++i) {
      const std::int64_t x = i0 + i;
      if (x < 0 || x >= t.w || !used(i, fx, x_scale)) continue;
      ++taps;
      if (!t.valid(x, y)) continue;
      ++valid;
      const double w = weight(i, fx, x_scale) * wy;
      acc += w * t.value(x, y);
      div += w;
    }
  }
  if (valid < taps / 2) return std::nullopt;
  if (div < 1e-6) return std::nullopt;
  return std::fabs(div - 1) < 1e-5 ? acc : acc / div;
}

std::optional<double> resample(const Taps& t, const WarpKernelArgs& a, double sx, double sy) {
  const bool four = a.x_scale >= 0.95 && a.y_scale >= 0.95;
  switch (a.method) {
    case WarpMethod::nearest:
      return std::nullopt;  // copied as is by the caller
    case WarpMethod::bilinear:
      if (four) return bilinear4(t, sx, sy);
      return general(t, sx, sy, triangle_weight, 1, a.x_scale, a.y_scale);
    case WarpMethod::cubic:
      if (four) return cubic4(t, sx, sy);
      return general(t, sx, sy, cubic_weight, 2, a.x_scale, a.y_scale);
    case WarpMethod::cubicspline:
      return general(t, sx, sy, bspline_weight, 2, a.x_scale, a.y_scale);
    case WarpMethod::lanczos:
      return lanczos(t, sx, sy, a.x_scale, a.y_scale);
    default:
      return std::nullopt;  // the footprint methods run apart (footprint_tile)
  }
}

// GDAL's conversion of a kernel result to the output type: clamped to the type's range, rounded
// half up (floor(v + 0.5); unsigned types truncate v + 0.5, the same there), and an integer equal
// to the output's nodata moved one step off it (up from the type's minimum, else down).
template <class T>
T to_output(double v, const std::optional<double>& nodata) {
  if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(v);
  } else {
    constexpr double lo = static_cast<double>(std::numeric_limits<T>::min());
    constexpr double hi = static_cast<double>(std::numeric_limits<T>::max());
    T out;
    if (std::isnan(v)) {
      out = 0;
    } else if (v <= lo) {
      out = std::numeric_limits<T>::min();
    } else if (v >= hi) {
      out = std::numeric_limits<T>::max();
    } else {
      out = static_cast<T>(std::floor(v + 0.5));
    }
    if (nodata && static_cast<double>(out) == *nodata) {
      out =
          out == std::numeric_limits<T>::min() ? static_cast<T>(out + 1) : static_cast<T>(out - 1);
    }
    return out;
  }
}

template <class T>
T fill_value(const std::optional<NodataValue>& nodata) {
  if (!nodata) return T{0};
  if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(nodata->to_double());
  } else if constexpr (std::is_signed_v<T>) {
    return static_cast<T>(nodata->as_int64().value_or(0));
  } else {
    return static_cast<T>(nodata->as_uint64().value_or(0));
  }
}

// The source pixels an output pixel covers, from its top-left (x0, y0) and bottom-right (x1, y1)
// corners (GWKAverageOrMode): columns [c0, c1), rows [r0, r1), with the edge weights of average
// and rms (first and last column or row by the part covered, a single one by 1).
struct Footprint {
  double x0, y0, x1, y1;
  std::int64_t c0, c1, r0, r1;

  static double weight(std::int64_t i, std::int64_t lo, std::int64_t hi, double f0, double f1) {
    if (i == lo) return lo + 1 == hi ? 1.0 : 1 - (f0 - static_cast<double>(lo));
    if (i + 1 == hi) return 1 - (static_cast<double>(hi) - f1);
    return 1.0;
  }
  double wx(std::int64_t c) const { return weight(c, c0, c1, x0, x1); }
  double wy(std::int64_t r) const { return weight(r, r0, r1, y0, y1); }
};

std::optional<Footprint> footprint_of(double x0, double y0, double x1, double y1, const Taps& t,
                                      int margin_x, int margin_y) {
  for (double v : {x0, y0, x1, y1}) {
    if (std::isnan(v)) return std::nullopt;
  }
  const auto w = static_cast<double>(t.w), h = static_cast<double>(t.h);
  if (x0 < -margin_x || x1 < -margin_x || y0 < -margin_y || y1 < -margin_y || x0 > w + margin_x ||
      x1 > w + margin_x || y0 > h + margin_y || y1 > h + margin_y) {
    return std::nullopt;
  }
  if (x0 > x1) std::swap(x0, x1);
  if (y0 > y1) std::swap(y0, y1);
  Footprint f{x0, y0, x1, y1, 0, 0, 0, 0};
  const auto span = [](double lo, double hi, std::int64_t n, std::int64_t& a, std::int64_t& b) {
    a = std::clamp(static_cast<std::int64_t>(std::floor(lo + 1e-10)), std::int64_t{0}, n);
    b = std::min(static_cast<std::int64_t>(std::ceil(hi - 1e-10)), n);
    if (a == b && b < n) b = a + 1;
  };
  span(x0, x1, t.w, f.c0, f.c1);
  span(y0, y1, t.h, f.r0, f.r1);
  return f;
}

// One band's value over a footprint by a footprint method; empty when no pixel is valid.
std::optional<double> footprint_value(const Taps& t, const Footprint& f, WarpMethod m,
                                      std::vector<double>& values) {
  values.clear();
  double acc = 0, weights = 0;
  const bool weighted = m == WarpMethod::average || m == WarpMethod::rms;
  for (std::int64_t r = f.r0; r < f.r1; ++r) {
    for (std::int64_t c = f.c0; c < f.c1; ++c) {
      if (!t.valid(c, r)) continue;
      const double v = t.value(c, r);
      if (weighted) {
        const double w = f.wx(c) * f.wy(r);
        acc += w * (m == WarpMethod::rms ? v * v : v);
        weights += w;
      } else {
        values.push_back(v);
      }
    }
  }
  if (weighted) {
    if (weights <= 0) return std::nullopt;
    return m == WarpMethod::rms ? std::sqrt(acc / weights) : acc / weights;
  }
  if (values.empty()) return std::nullopt;
  switch (m) {
    case WarpMethod::min: {
      double best = std::numeric_limits<double>::max();
      for (double v : values) best = v < best ? v : best;
      return best;
    }
    case WarpMethod::max: {
      double best = std::numeric_limits<double>::lowest();
      for (double v : values) best = v > best ? v : best;
      return best;
    }
    case WarpMethod::mode: {
      // GDAL compares values as float32; a value becomes the mode when its count passes the
      // best so far, scanning row by row (ties go to the first to reach the count).
      std::vector<std::pair<float, int>> counts;
      float best = 0;
      int best_count = 0;
      for (double v : values) {
        const auto fv = static_cast<float>(v);
        auto it = std::find_if(counts.begin(), counts.end(),
                               [&](const auto& e) { return e.first == fv; });
        if (it == counts.end()) {
          counts.emplace_back(fv, 0);
          it = counts.end() - 1;
        }
        if (++it->second > best_count) {
          best_count = it->second;
          best = fv;
        }
      }
      // GDAL 3.6's Int16 histogram marks "no mode" with -1, so a mode of -1 is never written.
      if (t.int16 && best == -1) return std::nullopt;
      return static_cast<double>(best);
    }
    default: {
      const double q = m == WarpMethod::med ? 0.5 : m == WarpMethod::q1 ? 0.25 : 0.75;
      std::sort(values.begin(), values.end());
      const double n = static_cast<double>(values.size());
      const auto at = static_cast<std::size_t>(std::max(0.0, std::ceil(q * n - 1)));
      return values[std::min(at, values.size() - 1)];
    }
  }
}

template <class T>
void footprint_tile(Taps& t, const WarpSourceWindow& src, const WarpKernelArgs& a, T* out,
                    const std::optional<double>& nudge) {
  const auto n = static_cast<std::size_t>(a.width * a.height);
  const std::int64_t cw = a.width + 1;
  const int mx = 2 * std::max(1, static_cast<int>(std::ceil(1 / a.x_scale)));
  const int my = 2 * std::max(1, static_cast<int>(std::ceil(1 / a.y_scale)));
  const auto col0 = static_cast<double>(src.window.col_off);
  const auto row0 = static_cast<double>(src.window.row_off);
  std::vector<double> values;
  for (std::int64_t j = 0; j < a.height; ++j) {
    for (std::int64_t i = 0; i < a.width; ++i) {
      const auto tl = static_cast<std::size_t>(j * cw + i);
      const auto br = static_cast<std::size_t>((j + 1) * cw + i + 1);
      const auto f = footprint_of(a.src_x[tl] - col0, a.src_y[tl] - row0, a.src_x[br] - col0,
                                  a.src_y[br] - row0, t, mx, my);
      if (!f) continue;
      const auto p = static_cast<std::size_t>(j * a.width + i);
      for (int b = 0; b < src.bands; ++b) {
        t.current = b;
        if (const auto v = footprint_value(t, *f, a.method, values)) {
          out[static_cast<std::size_t>(b) * n + p] = to_output<T>(*v, nudge);
        }
      }
    }
  }
}

template <class T>
void warp_tile_typed(const WarpSourceWindow& src, const WarpValidity& validity,
                     const WarpKernelArgs& a, T* out) {
  Taps t = make_taps<T>(src, validity);
  const auto* raw = static_cast<const T*>(src.pixels);
  const auto n = static_cast<std::size_t>(a.width * a.height);
  const T fill = fill_value<T>(a.dst_nodata);
  for (std::size_t i = 0; i < n * static_cast<std::size_t>(src.bands); ++i) out[i] = fill;
  std::optional<double> nudge;
  if (a.dst_nodata) nudge = a.dst_nodata->to_double();
  if (warp_uses_corners(a.method)) {
    footprint_tile<T>(t, src, a, out, nudge);
    return;
  }
  const auto col0 = static_cast<double>(src.window.col_off);
  const auto row0 = static_cast<double>(src.window.row_off);
  const auto w = static_cast<double>(t.w), h = static_cast<double>(t.h);
  const bool one_wide = t.w == 1 || t.h == 1;
  for (std::size_t p = 0; p < n; ++p) {
    const double sx = a.src_x[p] - col0, sy = a.src_y[p] - row0;
    if (std::isnan(sx) || std::isnan(sy)) continue;
    if (sx < 0 || sy < 0 || sx + 1e-10 > w || sy + 1e-10 > h) continue;
    const auto cx = std::min(static_cast<std::int64_t>(sx + 1e-10), t.w - 1);
    const auto cy = std::min(static_cast<std::int64_t>(sy + 1e-10), t.h - 1);
    if (!t.unified.empty() && !t.unified[static_cast<std::size_t>(cy * t.w + cx)]) continue;
    for (int b = 0; b < src.bands; ++b) {
      t.current = b;
      T* dst = out + static_cast<std::size_t>(b) * n + p;
      if (one_wide && a.method != WarpMethod::nearest) {
        // GDAL takes the pixel under the centre when the window is one pixel wide or high.
        if (t.valid(cx, cy)) *dst = to_output<T>(t.value(cx, cy), nudge);
        continue;
      }
      if (a.method == WarpMethod::nearest) {
        if (t.valid(cx, cy)) {
          *dst = raw[static_cast<std::size_t>(b * t.w * t.h + cy * t.w + cx)];
        }
        continue;
      }
      if (const auto v = resample(t, a, sx, sy)) *dst = to_output<T>(*v, nudge);
    }
  }
}

}  // namespace

void warp_tile(const WarpSourceWindow& source, const WarpValidity& validity,
               const WarpKernelArgs& args, void* out) {
  visit_dtype(source.dtype, [&](auto tag) {
    using T = decltype(tag);
    warp_tile_typed<T>(source, validity, args, static_cast<T*>(out));
  });
}

}  // namespace vibespatial::raster::detail
