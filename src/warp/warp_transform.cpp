// SPDX-License-Identifier: Apache-2.0
// The warp's transform through GDAL: GDALCreateGenImgProjTransformer2 over two band-less MEM
// datasets carrying the grids (so the transform is the one gdalwarp builds, CENTER_LONG for
// geographic sources included), GDAL's approximate transformer on top unless the threshold is 0.
#include "warp/warp_transform.hpp"

#include "io/gdal_common.hpp"

#include <gdal_alg.h>
#include <ogr_srs_api.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace vibespatial::raster::detail {

namespace {

using gdal::QuietErrors;

struct DatasetCloser {
  void operator()(void* ds) const noexcept { GDALClose(static_cast<GDALDatasetH>(ds)); }
};
using Dataset = std::unique_ptr<void, DatasetCloser>;

// A MEM dataset of no bands: the grid a transformer is made from, nothing allocated.
Dataset grid_dataset(std::int64_t width, std::int64_t height, const Affine& affine,
                     const std::string& wkt) {
  gdal::register_drivers();
  GDALDriverH mem = GDALGetDriverByName("MEM");
  if (mem == nullptr) throw std::runtime_error("warp: GDAL's MEM driver is missing");
  if (width > std::numeric_limits<int>::max() || height > std::numeric_limits<int>::max()) {
    throw WarpError(WarpErrorKind::bad_grid,
                    "warp: a grid of " + std::to_string(width) + " x " + std::to_string(height) +
                        " pixels is larger than GDAL's limit of 2^31 - 1 on a side");
  }
  Dataset ds(
      GDALCreate(mem, "", static_cast<int>(width), static_cast<int>(height), 0, GDT_Byte, nullptr));
  if (!ds) throw std::runtime_error("warp: cannot make a MEM dataset for the grid");
  std::array<double, 6> gt = affine.to_gdal();
  GDALSetGeoTransform(ds.get(), gt.data());
  GDALSetProjection(ds.get(), wkt.c_str());
  return ds;
}

}  // namespace

std::string crs_to_wkt(const std::string& text, const std::string& what) {
  QuietErrors quiet;
  OGRSpatialReferenceH srs = OSRNewSpatialReference(nullptr);
  const OGRErr err = OSRSetFromUserInput(srs, text.c_str());
  char* wkt = nullptr;
  if (err == OGRERR_NONE) OSRExportToWkt(srs, &wkt);
  OSRDestroySpatialReference(srs);
  if (err != OGRERR_NONE || wkt == nullptr || *wkt == '\0') {
    CPLFree(wkt);
    throw WarpError(WarpErrorKind::bad_crs,
                    "warp: " + what + " '" + printable(text) + "' is not a CRS GDAL/PROJ can read");
  }
  std::string out(wkt);
  CPLFree(wkt);
  return out;
}

std::string source_crs(const std::string& own, const WarpOptions& options) {
  if (!options.src_crs.empty()) return crs_to_wkt(options.src_crs, "the source CRS (--s_srs)");
  if (own.empty()) {
    throw WarpError(WarpErrorKind::no_crs,
                    "warp: the source has no CRS; give one (--s_srs) to warp it");
  }
  return crs_to_wkt(own, "the source's CRS");
}

WarpTransform::WarpTransform(const WarpSourceGrid& source, const WarpGrid& output,
                             double error_threshold)
    : source_(source) {
  if (!(error_threshold >= 0) || !std::isfinite(error_threshold)) {
    throw WarpError(WarpErrorKind::bad_grid,
                    "warp: the error threshold (--et) must be a finite number >= 0");
  }
  Dataset src = grid_dataset(source.width, source.height, source.affine, source.crs);
  Dataset dst = grid_dataset(output.width, output.height, output.affine, output.crs);
  QuietErrors quiet;
  exact_ = GDALCreateGenImgProjTransformer2(src.get(), dst.get(), nullptr);
  if (exact_ == nullptr) {
    throw WarpError(WarpErrorKind::transform,
                    std::string("warp: no transform between the source's and the output's CRS: ") +
                        printable(CPLGetLastErrorMsg()));
  }
  if (error_threshold > 0) {
    approx_ = GDALCreateApproxTransformer(GDALGenImgProjTransform, exact_, error_threshold);
  }
}

WarpTransform::~WarpTransform() {
  if (approx_ != nullptr) GDALDestroyApproxTransformer(approx_);
  if (exact_ != nullptr) GDALDestroyGenImgProjTransformer(exact_);
}

void WarpTransform::to_source(int n, double* x, double* y, int* ok) const {
  std::vector<double> z(static_cast<std::size_t>(n), 0.0);
  QuietErrors quiet;  // a point PROJ cannot transform is a failed point, not an error
  GDALGenImgProjTransform(exact_, TRUE, n, x, y, z.data(), ok);
}

namespace {

// Rows of @p w points at x = x0 + i, y = y0 + r (r < h), each row in one call of @p approx (or
// exactly through @p exact); NaN where a point failed.
void transform_rows(void* exact, void* approx, double x0, double y0, std::size_t w, std::int64_t h,
                    std::vector<double>& x, std::vector<double>& y) {
  x.resize(w * static_cast<std::size_t>(h));
  y.resize(x.size());
  std::vector<double> z(w);
  std::vector<int> ok(w);
  QuietErrors quiet;  // a point PROJ cannot transform is a failed point, not an error
  for (std::int64_t r = 0; r < h; ++r) {
    double* px = x.data() + static_cast<std::size_t>(r) * w;
    double* py = y.data() + static_cast<std::size_t>(r) * w;
    for (std::size_t i = 0; i < w; ++i) {
      px[i] = x0 + static_cast<double>(i);
      py[i] = y0 + static_cast<double>(r);
      z[i] = 0;
    }
    const int n = static_cast<int>(w);
    if (approx != nullptr) {
      GDALApproxTransform(approx, TRUE, n, px, py, z.data(), ok.data());
    } else {
      GDALGenImgProjTransform(exact, TRUE, n, px, py, z.data(), ok.data());
    }
    for (std::size_t i = 0; i < w; ++i) {
      if (!ok[i]) px[i] = py[i] = std::numeric_limits<double>::quiet_NaN();
    }
  }
}

}  // namespace

void WarpTransform::source_coords(const RasterWindow& tile, std::vector<double>& x,
                                  std::vector<double>& y) const {
  transform_rows(exact_, approx_, static_cast<double>(tile.col_off) + 0.5,
                 static_cast<double>(tile.row_off) + 0.5, static_cast<std::size_t>(tile.width),
                 tile.height, x, y);
}

void WarpTransform::corner_coords(const RasterWindow& tile, std::vector<double>& x,
                                  std::vector<double>& y) const {
  transform_rows(exact_, approx_, static_cast<double>(tile.col_off),
                 static_cast<double>(tile.row_off), static_cast<std::size_t>(tile.width) + 1,
                 tile.height + 1, x, y);
}

SourceWindow WarpTransform::source_window(const RasterWindow& out, int radius) const {
  // The outline at 21 steps a side, at pixel corners; a 23 x 23 grid when a point fails.
  constexpr int steps = 20;
  std::vector<double> xs, ys;
  const auto add = [&](double fx, double fy) {
    xs.push_back(static_cast<double>(out.col_off) + fx * static_cast<double>(out.width));
    ys.push_back(static_cast<double>(out.row_off) + fy * static_cast<double>(out.height));
  };
  for (int s = 0; s <= steps; ++s) {
    const double f = s == steps ? 1.0 : static_cast<double>(s) / steps;
    add(f, 0);
    add(f, 1);
    add(0, f);
    add(1, f);
  }
  auto run = [&](std::vector<int>& ok) {
    ok.assign(xs.size(), 0);
    to_source(static_cast<int>(xs.size()), xs.data(), ys.data(), ok.data());
    return std::count(ok.begin(), ok.end(), 0);
  };
  std::vector<int> ok;
  auto failed = run(ok);
  if (failed > 0) {
    xs.clear();
    ys.clear();
    std::vector<double> f;
    f.push_back(0.5 / static_cast<double>(out.width));
    for (int s = 0; s <= steps; ++s) f.push_back(s == steps ? 1.0 : static_cast<double>(s) / steps);
    f.push_back(1 - 0.5 / static_cast<double>(out.width));
    for (double fy : f) {
      for (double fx : f) add(fx, fy);
    }
    failed = run(ok);
  }
  double min_x = std::numeric_limits<double>::infinity(), max_x = -min_x;
  double min_y = min_x, max_y = -min_x;
  const auto snap = [](double v) {
    const double r = std::round(v);
    return std::fabs(v - r) < 1e-6 ? r : v;
  };
  for (std::size_t i = 0; i < xs.size(); ++i) {
    if (!ok[i] || std::isnan(xs[i]) || std::isnan(ys[i])) continue;
    min_x = std::min(min_x, snap(xs[i]));
    max_x = std::max(max_x, snap(xs[i]));
    min_y = std::min(min_y, snap(ys[i]));
    max_y = std::max(max_y, snap(ys[i]));
  }
  SourceWindow sw;
  const auto W = static_cast<double>(source_.width), H = static_cast<double>(source_.height);
  if (!(min_x <= max_x) || max_x < 0 || max_y < 0 || min_x > W || min_y > H) {
    sw.failed = true;
    return sw;
  }
  const auto margin = [&](double dst, double span) {
    const double s = span > 0 ? dst / span : 1.0;
    int r = s < 0.95 ? static_cast<int>(std::ceil(radius / s)) : radius;
    return failed > 0 ? r + 10 : r;
  };
  const int rx = margin(static_cast<double>(out.width), max_x - min_x);
  const int ry = margin(static_cast<double>(out.height), max_y - min_y);
  const auto lo_x = static_cast<std::int64_t>(std::max(0.0, min_x));
  const auto lo_y = static_cast<std::int64_t>(std::max(0.0, min_y));
  const auto hi_x = static_cast<std::int64_t>(std::min(std::ceil(max_x), W));
  const auto hi_y = static_cast<std::int64_t>(std::min(std::ceil(max_y), H));
  const std::int64_t off_x = std::max<std::int64_t>(0, std::min(lo_x - rx, source_.width));
  const std::int64_t off_y = std::max<std::int64_t>(0, std::min(lo_y - ry, source_.height));
  sw.window.col_off = off_x;
  sw.window.row_off = off_y;
  sw.window.width = std::max<std::int64_t>(0, std::min(source_.width - off_x, hi_x - off_x + rx));
  sw.window.height = std::max<std::int64_t>(0, std::min(source_.height - off_y, hi_y - off_y + ry));
  const double raw_x = std::max(0.0, std::min(W - static_cast<double>(lo_x), max_x - min_x));
  const double raw_y = std::max(0.0, std::min(H - static_cast<double>(lo_y), max_y - min_y));
  sw.extra_x = static_cast<double>(sw.window.width) - raw_x;
  sw.extra_y = static_cast<double>(sw.window.height) - raw_y;
  sw.failed = sw.window.width == 0 || sw.window.height == 0;
  return sw;
}

std::array<double, 2> warp_scale(const RasterWindow& out, const SourceWindow& src) {
  const auto one = [](double dst, double size, double extra) {
    if (size <= 0) return 1.0;
    double scale = dst / (size - extra);
    if (size >= dst && size <= dst + extra) scale = 1.0;
    if (scale < 1.0) {
      const double reciprocal = 1.0 / scale;
      const int n = static_cast<int>(reciprocal + 0.5);
      if (std::fabs(reciprocal - n) < 0.05) scale = 1.0 / n;
    }
    return scale;
  };
  return {
      one(static_cast<double>(out.width), static_cast<double>(src.window.width), src.extra_x),
      one(static_cast<double>(out.height), static_cast<double>(src.window.height), src.extra_y)};
}

}  // namespace vibespatial::raster::detail
