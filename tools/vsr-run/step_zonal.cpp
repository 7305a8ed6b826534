// SPDX-License-Identifier: Apache-2.0
// The zonal-stats step: per zone (a polygon of --zones, or a value of a zone raster) and band,
// the statistics of the raster's pixels inside, through the library's zonal_stats_file and its
// table writer (docs/zonal-statistics.md). Its output is a table, not a raster.
#include "cli.hpp"
#include "steps.hpp"

#include <vibespatial/raster/io.hpp>
#include <vibespatial/raster/zonal.hpp>

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace vsr_run {

namespace {

vsr::ZonalOptions zonal_options(const Arguments& args) {
  vsr::ZonalOptions o;
  o.pixels = args.pixels;
  o.stats = args.zonal_stats;
  o.bands = args.bands;
  if (args.budget) o.memory_budget = *args.budget;
  o.open.allow_virtual = args.allow_virtual;
  o.open.ignore_mask = args.ignore_mask;
  o.open.num_threads = args.threads;
  if (args.threads > 0) o.threads = args.threads;
  return o;
}

std::string joined(const std::vector<std::string>& names) {
  std::string text;
  for (const std::string& n : names) text += (text.empty() ? "" : ",") + n;
  return text;
}

TableWork tabulate_zonal(const Arguments& args, const vsr::RasterMetadata& input, bool dry_run) {
  const vsr::ZonalOptions o = zonal_options(args);
  TableWork work;
  work.note = joined(o.stats) + " over the zones of " + vsr_cli::printable(args.zones) + ", " +
              std::string(vsr::to_string(o.pixels)) + " pixels";
  if (dry_run) {
    std::optional<vsr::DType> weights;
    if (!args.weights.empty()) weights = vsr::read_raster_info(args.weights, o.open).metadata.dtype;
    const vsr::RasterPlan plan = vsr::zonal_stats_plan(input, o, weights);
    work.plan.push_back(
        "zones       " + vsr_cli::printable(args.zones) +
        (args.zone_layer.empty() ? "" : ", layer " + args.zone_layer) +
        (args.zone_field.empty() ? ", ids: the feature ids" : ", ids: field " + args.zone_field));
    work.plan.push_back("pixels      " + std::string(vsr::to_string(o.pixels)));
    work.plan.push_back("stats       " + joined(o.stats));
    if (!args.weights.empty())
      work.plan.push_back("weights     " + vsr_cli::printable(args.weights));
    std::string tiles = plan.strategy == vsr::TilingStrategy::tiled && plan.tile_shape
                            ? std::to_string(plan.n_tiles) + " tile(s) of " +
                                  std::to_string(plan.tile_shape->first) + " x " +
                                  std::to_string(plan.tile_shape->second) + " (rows x columns)"
                            : std::string("the whole raster at once");
    work.plan.push_back("zonal pass  " + tiles + ", one pass");
    return work;
  }
  const vsr::ZoneFile zones{args.zones, args.zone_layer, args.zone_field};
  auto table = std::make_shared<const vsr::ZonalTable>([&] {
    try {
      return vsr::zonal_stats_file(args.input, zones, o, args.weights);
    } catch (const vsr::ZonalInputError& e) {
      throw std::runtime_error("zonal-stats: " + std::string(e.what()));
    }
  }());
  work.json = vsr::zonal_table_json(*table);
  work.csv = vsr::zonal_table_csv(*table);
  work.note += ", " + std::to_string(table->rows()) + " row(s)";
  work.write = [table](const std::string& path, bool overwrite,
                       const std::vector<vsr::KeptFile>& kept) {
    vsr::write_zonal_table(*table, path, overwrite, kept);
  };
  return work;
}

}  // namespace

const Step& zonal_step() {
  static const Step s{
      .name = "zonal-stats",
      .summary =
          "per zone (--zones: polygons, or a zone raster) and band: --stats of the pixels "
          "inside (docs/zonal-statistics.md); a table: CSV printed, --json, or -o FILE.csv/.json",
      .kind = StepKind::table,
      .op = Op::zonal_stats,
      .options = {"--zones", "--layer", "--zone-field", "--pixels", "--weights", "--stats",
                  "--json", "--dry-run"},
      .per_band = false,
      .in_pipeline = false,
      .tabulate = tabulate_zonal,
      .pipeline_refusal =
          "zonal-stats makes a table, not a raster: run it as vsr-run --op "
          "zonal-stats -i RASTER --zones FILE",
  };
  return s;
}

}  // namespace vsr_run
