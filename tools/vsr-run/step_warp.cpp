// SPDX-License-Identifier: Apache-2.0
// The warp step: the input reprojected onto another grid, with gdalwarp's options (--t_srs,
// --s_srs, --tr, --te, --ts, -r, --et, --srcnodata, --dstnodata) as the library's WarpOptions
// (docs/warp.md). Its source is the library's WarpedSource over the input's, which the run walks
// and writes through its one write path (-of, --co, --ot, all or nothing, the summary).
#include "cli.hpp"
#include "steps.hpp"

#include <vibespatial/raster/warp.hpp>

#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace vsr_run {

using vsr_cli::UsageError;

namespace {

/// What the command line asked for, named by its options (for a bad grid's message).
std::string grid_options(const Arguments& args) {
  std::string given;
  const auto add = [&](bool on, const char* name) {
    if (on) given += (given.empty() ? "" : ", ") + std::string(name);
  };
  add(args.warp.resolution.has_value(), "--tr");
  add(args.warp.extent.has_value(), "--te");
  add(args.warp.size.has_value(), "--ts");
  return given.empty() ? "the default grid" : given;
}

/// A WarpError as vsr-run reports it: what the command line got wrong (an SRS no one reads, a
/// grid that cannot be made) is a usage error (exit 2); what the input cannot do (no CRS, no
/// pixel in common, no transform) is the run's error (exit 1).
[[noreturn]] void rethrow_warp_error(const Arguments& args, const vsr::WarpError& e) {
  const std::string what = e.what();
  switch (e.kind()) {
    case vsr::WarpErrorKind::bad_crs:
      throw UsageError("--t_srs/--s_srs: " + what);
    case vsr::WarpErrorKind::bad_grid:
      throw UsageError(grid_options(args) + ": " + what);
    case vsr::WarpErrorKind::no_crs:
      throw std::runtime_error(what + " (--s_srs gives the input's CRS)");
    case vsr::WarpErrorKind::no_overlap:
      throw std::runtime_error(what +
                               " (the output grid holds no pixel of the input; check "
                               "--t_srs and --te)");
    case vsr::WarpErrorKind::transform:
      throw std::runtime_error(what);
  }
  throw std::runtime_error(what);
}

std::string window_text(const vsr::RasterWindow& w) {
  char buf[120];
  std::snprintf(buf, sizeof buf, "x %lld y %lld, %lld x %lld", static_cast<long long>(w.col_off),
                static_cast<long long>(w.row_off), static_cast<long long>(w.width),
                static_cast<long long>(w.height));
  return buf;
}

std::string grid_text(const vsr::WarpGrid& g) {
  char buf[320];
  const vsr::Affine& a = g.affine;
  std::snprintf(buf, sizeof buf,
                "%lld x %lld pixels, pixel size %.17g x %.17g, origin (%.17g, %.17g), extent "
                "[%.17g, %.17g, %.17g, %.17g]",
                static_cast<long long>(g.width), static_cast<long long>(g.height), a.a, -a.e, a.c,
                a.f, a.c, a.f + a.e * static_cast<double>(g.height),
                a.c + a.a * static_cast<double>(g.width), a.f);
  return buf;
}

GridWork regrid_warp(const Arguments& args, vsr::TileSource& input, bool georeferenced,
                     bool dry_run) {
  if (!georeferenced) {
    throw std::runtime_error("warp: '" + vsr_cli::printable(args.input) +
                             "' has no geotransform; it cannot be warped");
  }
  const vsr::RasterMetadata meta = input.metadata();
  try {
    const vsr::WarpGrid grid = vsr::plan_warp_grid(meta, args.warp);
    GridWork work;
    work.source = std::make_unique<vsr::WarpedSource>(input, grid, args.warp);
    work.note = std::string(vsr::to_string(args.warp.method)) + " onto " +
                vsr_cli::printable(args.warp.dst_crs) + ", " + std::to_string(grid.width) + " x " +
                std::to_string(grid.height) + " pixels";
    if (dry_run) {
      const vsr::WarpPlan plan = vsr::plan_warp(meta, grid, args.warp);
      work.plan.push_back("grid        " + grid_text(grid));
      work.plan.push_back("crs         " + vsr_cli::printable(args.warp.dst_crs));
      char buf[200];
      std::snprintf(buf, sizeof buf, "method      %s, scale %.6g x %.6g (output per input pixel)",
                    std::string(vsr::to_string(args.warp.method)).c_str(), plan.x_scale,
                    plan.y_scale);
      work.plan.emplace_back(buf);
      work.plan.push_back("warp tiles  " + std::to_string(plan.tiles.size()) +
                          " (output window <- input window)");
      for (std::size_t k = 0; k < plan.tiles.size(); ++k) {
        const vsr::WarpTile& t = plan.tiles[k];
        work.plan.push_back(
            "  tile " + std::to_string(k + 1) + "  " + window_text(t.output) + " <- " +
            (t.source.width > 0 && t.source.height > 0 ? window_text(t.source) : "no input pixel"));
      }
    }
    return work;
  } catch (const vsr::WarpError& e) {
    rethrow_warp_error(args, e);
  }
}

/// Each tile of the output grid as the WarpedSource made it, in the output's dtype and nodata.
StepWork build_warp(const Arguments& args, const StepFacts& facts) {
  return {to_output(warp_step(), args, facts, [](const vsr::OwnedRasterArray& t) { return t; }),
          ot_note(args)};
}

}  // namespace

const Step& warp_step() {
  static const Step s{
      .name = "warp",
      .summary =
          "reprojection as gdalwarp does it: --t_srs (required), --s_srs, --tr, --te, --ts, "
          "-r, --et, --srcnodata, --dstnodata (docs/warp.md); --dry-run prints the grid; in a "
          "pipeline only directly after read",
      .kind = StepKind::grid,
      .op = Op::warp,
      .options = {"--t_srs", "--s_srs", "--tr", "--te", "--ts", "-r", "--et", "--srcnodata",
                  "--dstnodata", "--ot", "--dry-run"},
      .per_band = false,
      .metadata = vsr::MetadataCopy::descriptive,
      .build = build_warp,
      .regrid = regrid_warp,
  };
  return s;
}

}  // namespace vsr_run
