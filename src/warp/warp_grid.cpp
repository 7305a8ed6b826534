// SPDX-License-Identifier: Apache-2.0
// The output grid as gdalwarp chooses it (GDAL 3.6 apps/gdalwarp_lib.cpp GDALWarpCreateOutput):
// GDALSuggestedWarpOutput2 over the source, then -tr, -ts and -te applied with gdalwarp's sizes
// and origins.
#include "io/gdal_common.hpp"
#include "warp/warp_transform.hpp"

#include <gdal_alg.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace vibespatial::raster {

namespace {

using detail::gdal::QuietErrors;

struct Extent {
  double min_x = 0, min_y = 0, max_x = 0, max_y = 0;
};

struct Suggested {
  std::array<double, 6> gt{};
  std::int64_t width = 0, height = 0;
  Extent extent;
};

// A band-less MEM copy of the source's grid and the transformer gdalwarp makes from it (the
// source dataset, no destination, DST_SRS): source pixel/line <-> output georeferenced.
struct SourceTransformer {
  GDALDatasetH ds = nullptr;
  void* t = nullptr;

  SourceTransformer(const RasterMetadata& source, const std::string& src_wkt,
                    const std::string& dst_wkt) {
    detail::gdal::register_drivers();
    GDALDriverH mem = GDALGetDriverByName("MEM");
    if (source.width > std::numeric_limits<int>::max() ||
        source.height > std::numeric_limits<int>::max()) {
      throw WarpError(WarpErrorKind::bad_grid, "warp: the source is larger than GDAL's limit");
    }
    ds = GDALCreate(mem, "", static_cast<int>(source.width), static_cast<int>(source.height), 0,
                    GDT_Byte, nullptr);
    if (ds == nullptr) throw std::runtime_error("warp: cannot make a MEM dataset for the source");
    std::array<double, 6> sgt = source.affine.to_gdal();
    GDALSetGeoTransform(ds, sgt.data());
    GDALSetProjection(ds, src_wkt.c_str());
    QuietErrors quiet;
    char** opts = CSLSetNameValue(nullptr, "DST_SRS", dst_wkt.c_str());
    t = GDALCreateGenImgProjTransformer2(ds, nullptr, opts);
    CSLDestroy(opts);
    if (t == nullptr) {
      GDALClose(ds);
      throw WarpError(WarpErrorKind::transform,
                      std::string("warp: no transform between the source's and the output's "
                                  "CRS: ") +
                          detail::printable(CPLGetLastErrorMsg()));
    }
  }
  ~SourceTransformer() {
    GDALDestroyGenImgProjTransformer(t);
    GDALClose(ds);
  }
  SourceTransformer(const SourceTransformer&) = delete;
  SourceTransformer& operator=(const SourceTransformer&) = delete;
};

// GDALSuggestedWarpOutput2 over the source.
Suggested suggest(const RasterMetadata& source, const std::string& src_wkt,
                  const std::string& dst_wkt) {
  SourceTransformer st(source, src_wkt, dst_wkt);
  QuietErrors quiet;
  Suggested s;
  int w = 0, h = 0;
  double ext[4] = {0, 0, 0, 0};
  const CPLErr err =
      GDALSuggestedWarpOutput2(st.ds, GDALGenImgProjTransform, st.t, s.gt.data(), &w, &h, ext, 0);
  if (err != CE_None || w <= 0 || h <= 0) {
    throw WarpError(WarpErrorKind::no_overlap,
                    std::string("warp: the source has no extent in the output's CRS: ") +
                        detail::printable(CPLGetLastErrorMsg()));
  }
  s.width = w;
  s.height = h;
  s.extent = {ext[0], ext[1], ext[2], ext[3]};
  return s;
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// gdalwarp's resolution for -te alone: at 10 x 10 points of the extent (its edges included), the
// output distance that one source pixel spans along x and along y (from neighbours epsilon away),
// outliers below a tenth of the median dropped; the smallest of the points' means of the two.
double resolution_in_extent(const RasterMetadata& source, const std::string& src_wkt,
                            const std::string& dst_wkt, const Extent& e) {
  SourceTransformer st(source, src_wkt, dst_wkt);
  const double eps = std::min(e.max_x - e.min_x, e.max_y - e.min_y) / 1000;
  constexpr int steps = 10;
  std::vector<double> xs, ys;
  for (int j = 0; j < steps; ++j) {
    for (int i = 0; i < steps; ++i) {
      const double x = e.min_x + i * (e.max_x - e.min_x) / (steps - 1);
      const double y = e.min_y + j * (e.max_y - e.min_y) / (steps - 1);
      xs.insert(xs.end(), {x, x + eps, x});
      ys.insert(ys.end(), {y, y, y + eps});
    }
  }
  std::vector<double> zs(xs.size(), 0.0);
  std::vector<int> ok(xs.size(), 0);
  {
    QuietErrors quiet;
    GDALGenImgProjTransform(st.t, TRUE, static_cast<int>(xs.size()), xs.data(), ys.data(),
                            zs.data(), ok.data());
  }
  std::vector<double> rx, ry;
  const auto W = static_cast<double>(source.width), H = static_cast<double>(source.height);
  for (std::size_t k = 0; k + 2 < xs.size(); k += 3) {
    if (!ok[k] || !ok[k + 1] || !ok[k + 2]) continue;
    if (xs[k] < 0 || ys[k] < 0 || xs[k] > W || ys[k] > H) continue;
    const double dx = std::hypot(xs[k + 1] - xs[k], ys[k + 1] - ys[k]);
    const double dy = std::hypot(xs[k + 2] - xs[k], ys[k + 2] - ys[k]);
    if (!(dx > 0) || !(dy > 0)) continue;
    rx.push_back(eps / dx);
    ry.push_back(eps / dy);
  }
  if (rx.empty()) {
    throw WarpError(WarpErrorKind::no_overlap,
                    "warp: the output extent (--te) does not intersect the source");
  }
  const double mx = median_of(rx) / 10, my = median_of(ry) / 10;
  std::vector<double> means;
  for (std::size_t k = 0; k < rx.size(); ++k) {
    if (rx[k] >= mx && ry[k] >= my) means.push_back((rx[k] + ry[k]) / 2);
  }
  const double mm = median_of(means) / 10;
  double best = std::numeric_limits<double>::infinity();
  for (double m : means) {
    if (m >= mm) best = std::min(best, m);
  }
  return best;
}

void check_options(const WarpOptions& o) {
  const auto bad = [](const std::string& m) { throw WarpError(WarpErrorKind::bad_grid, m); };
  if (o.resolution) {
    for (double r : *o.resolution) {
      if (!(r > 0) || !std::isfinite(r)) bad("warp: a resolution (--tr) must be finite and > 0");
    }
  }
  if (o.size) {
    for (std::int64_t n : *o.size) {
      if (n < 0) bad("warp: an output size (--ts) must be >= 0");
    }
    if ((*o.size)[0] == 0 && (*o.size)[1] == 0) bad("warp: --ts 0 0 gives no output size");
    if (o.resolution) bad("warp: --tr and --ts cannot be given together");
  }
  if (o.extent) {
    const auto& e = *o.extent;
    for (double v : e) {
      if (!std::isfinite(v)) bad("warp: an extent (--te) must be finite");
    }
    if (!(e[2] > e[0]) || !(e[3] > e[1])) {
      bad("warp: an extent (--te xmin ymin xmax ymax) needs xmax > xmin and ymax > ymin");
    }
  }
}

std::int64_t checked_size(double n, const char* what) {
  if (!(n >= 1) || n > static_cast<double>(std::numeric_limits<int>::max())) {
    throw WarpError(WarpErrorKind::bad_grid,
                    std::string("warp: the output would be ") +
                        (std::isfinite(n) ? std::to_string(static_cast<long long>(n)) : "inf") +
                        " pixels " + what + ", outside 1 .. 2^31 - 1");
  }
  return static_cast<std::int64_t>(n);
}

}  // namespace

WarpGrid plan_warp_grid(const RasterMetadata& source, const WarpOptions& options) {
  check_options(options);
  if (source.width <= 0 || source.height <= 0) {
    throw WarpError(WarpErrorKind::bad_grid, "warp: the source has no pixels");
  }
  const std::string src_wkt = detail::source_crs(source.crs, options);
  const std::string dst_wkt = options.dst_crs.empty()
                                  ? src_wkt
                                  : detail::crs_to_wkt(options.dst_crs, "the output CRS (--t_srs)");
  WarpGrid grid;
  grid.crs = dst_wkt;
  const bool size_x = options.size && (*options.size)[0] > 0;
  const bool size_y = options.size && (*options.size)[1] > 0;
  Extent e;
  Suggested s;
  const bool need_suggest = !options.extent;
  if (need_suggest) s = suggest(source, src_wkt, dst_wkt);
  if (options.extent) {
    const auto& t = *options.extent;
    e = {t[0], t[1], t[2], t[3]};
  } else {
    e = s.extent;
  }
  double xres = 0, yres = 0;
  std::int64_t w = 0, h = 0;
  if (options.resolution) {
    xres = (*options.resolution)[0];
    yres = (*options.resolution)[1];
    w = checked_size(std::floor((e.max_x - e.min_x + xres / 2) / xres), "wide");
    h = checked_size(std::floor((std::fabs(e.max_y - e.min_y) + yres / 2) / yres), "high");
  } else if (size_x && size_y) {
    w = (*options.size)[0];
    h = (*options.size)[1];
    xres = (e.max_x - e.min_x) / static_cast<double>(w);
    yres = (e.max_y - e.min_y) / static_cast<double>(h);
  } else if (size_x) {
    w = (*options.size)[0];
    xres = yres = (e.max_x - e.min_x) / static_cast<double>(w);
    h = checked_size(std::floor((std::fabs(e.max_y - e.min_y) + yres / 2) / yres), "high");
  } else if (size_y) {
    h = (*options.size)[1];
    xres = yres = (e.max_y - e.min_y) / static_cast<double>(h);
    w = checked_size(std::floor((e.max_x - e.min_x + xres / 2) / xres), "wide");
  } else if (options.extent) {
    // -te alone: the resolution gdalwarp estimates inside the extent, then the pixel sizes made
    // to fit the extent exactly.
    xres = yres = resolution_in_extent(source, src_wkt, dst_wkt, e);
    w = checked_size(std::floor((e.max_x - e.min_x + xres / 2) / xres), "wide");
    h = checked_size(std::floor((e.max_y - e.min_y + yres / 2) / yres), "high");
    xres = (e.max_x - e.min_x) / static_cast<double>(w);
    yres = (e.max_y - e.min_y) / static_cast<double>(h);
  } else {
    grid.width = s.width;
    grid.height = s.height;
    grid.affine = Affine::from_gdal(s.gt);
    return grid;
  }
  grid.width = checked_size(static_cast<double>(w), "wide");
  grid.height = checked_size(static_cast<double>(h), "high");
  grid.affine = Affine::from_gdal({e.min_x, xres, 0, e.max_y, 0, -yres});
  return grid;
}

WarpGrid plan_warp_grid(const std::string& path, const WarpOptions& options,
                        const OpenOptions& open) {
  const RasterFileInfo info = read_raster_info(path, open);
  return plan_warp_grid(info.metadata, options);
}

}  // namespace vibespatial::raster
