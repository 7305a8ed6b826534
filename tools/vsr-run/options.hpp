// SPDX-License-Identifier: Apache-2.0
// vsr-run's command line: the options of a run (option_table.cpp), parsed and checked against
// the step table (options.cpp, steps.hpp), and --help made from both tables (help.cpp).
#pragma once

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/ops.hpp>
#include <vibespatial/raster/outputs.hpp>
#include <vibespatial/raster/tiles.hpp>
#include <vibespatial/raster/warp.hpp>
#include <vibespatial/raster/zonal.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace vsr_cli {
class ArgScanner;
}

namespace vsr_run {

namespace vsr = vibespatial::raster;

/// --help's text, made from the option table and the step table.
std::string usage_text();

enum class Op {
  stats,
  histogram,
  rescale,
  clip,
  fill_nodata,
  focal_mean,
  normalized_difference,
  calc,
  warp,
  zonal_stats,
  pipeline
};

struct Range {
  double lo = 0, hi = 0;
};

struct Arguments {
  Op op = Op::stats;
  std::string op_name = "stats";
  std::string input, output;
  /// Every -i, as given (calc: NAME=FILE or a bare FILE, input A; other ops: the last is input).
  std::vector<std::string> inputs;
  /// calc: the named inputs (NAME, FILE), in the order given.
  std::vector<std::pair<std::string, std::string>> calc_inputs;
  std::vector<std::string> calc;  ///< calc: --calc, one output band each
  bool compute_float32 = false;   ///< calc: --compute float32
  bool propagate_nodata = true;   ///< calc: off with --no-propagate-nodata
  /// pipeline: its steps, each parsed as the matching op's options (calc: with the read inputs).
  std::vector<std::shared_ptr<const struct Arguments>> steps;
  bool dry_run = false;  ///< pipeline, warp: --dry-run
  /// warp: gdalwarp's options (--t_srs, --s_srs, --tr, --te, --ts, -r, --et, --srcnodata,
  /// --dstnodata) as the library takes them.
  vsr::WarpOptions warp;
  std::string warp_method = "near";  ///< warp: -r as given
  /// zonal-stats: --zones FILE (a vector layer or a zone raster), --layer, --zone-field,
  /// --weights FILE; --pixels and --stats as the library takes them.
  std::string zones, zone_layer, zone_field, weights;
  vsr::PixelRule pixels = vsr::PixelRule::fractional;
  std::vector<std::string> zonal_stats = {"count", "sum", "mean", "min", "max"};
  /// pipeline: a terminal `! stats` or `! histogram` instead of `! write FILE`: the chain's
  /// output is reduced and printed (or written as JSON to --output) as that op prints it.
  std::optional<Op> terminal;
  std::vector<int> bands;               ///< -b
  std::optional<std::uint64_t> budget;  ///< empty: auto
  std::int64_t sample_size = 2048;
  int sample_bands = 4;
  std::optional<int> nir, red;
  std::optional<Range> in_range, out_range, range;
  std::optional<vsr::DType> ot;
  int bins = 10;
  bool bins_given = false;
  std::optional<double> value;
  vsr::EdgeMode edge = vsr::EdgeMode::nearest;
  bool edge_given = false;
  std::string format;
  std::vector<std::string> creation_options;
  std::string overviews;   ///< --overviews: "" (the format's default), none, auto, "2,4,8"
  std::string resampling;  ///< --resampling
  /// -a_nodata: empty when not given; holding an empty value for "-a_nodata none".
  std::optional<std::optional<vsr::NodataValue>> a_nodata;
  std::string a_nodata_text;
  bool ignore_mask = false;  ///< --ignore-mask
  bool overwrite = false;
  std::string memory_history;  ///< --memory-history FILE: the run's memory snapshot; "" none
  int threads = -1;
  bool json = false;
  bool quiet = false;
  bool progress = false;
  bool diagnostics = false;  ///< --diagnostics: where the time went, on stderr
  bool allow_virtual = false;
  std::optional<std::uint64_t> host_memory;           ///< empty: what is available
  vsr::Placement device = vsr::Placement::automatic;  ///< --device
  bool help = false;

  bool raster_output() const {
    return op != Op::stats && op != Op::histogram && op != Op::zonal_stats && !terminal;
  }
  /// The op whose results are printed: the terminal step of a pipeline, else the op.
  Op printed_op() const { return terminal.value_or(op); }
};

/// Where an option belongs: a step's own (which steps take it: the step table), how the inputs
/// are opened, the output, the run, the sample raster.
enum class OptionGroup { step, input, read, output, run, sample };

/// One option of vsr-run: its names, its value's name ("" for a flag), its group and help, and
/// what it sets (its value read from the scanner, checked).
struct OptionSpec {
  std::string_view name, alias, value;
  OptionGroup group;
  std::string_view help;
  void (*set)(struct Arguments& args, vsr_cli::ArgScanner& words, std::string_view option);
};

/// Every option, in --help's order within its group.
const std::vector<OptionSpec>& option_table();
/// The option named (or aliased) @p name; nullptr when none.
const OptionSpec* find_option(std::string_view name);

/// The command line, checked: options of other ops, missing values, ranges, mixed options are
/// UsageError (exit 2).
Arguments parse_arguments(int argc, char** argv);

/// `vsr-run pipeline read A=a.tif ... ! STEP [options] ! ... ! write FILE [output options]`
/// (argv[0] is "pipeline"): the steps parsed as their ops' options. UsageError as above.
Arguments parse_pipeline(int argc, char** argv);

/// The files a run reads (its input, or each of calc's and read's inputs), for a target that
/// must replace none of them (vsr::check_output_path).
std::vector<vsr::KeptFile> files_read(const Arguments& args);
/// files_read and the run's --output.
std::vector<vsr::KeptFile> files_of_the_run(const Arguments& args);

/// Checks the output target @p path of @p option before anything is read (vsr::check_output_path
/// with @p kept): what it refuses about the target (a directory, FIFO or device, a kept file, a
/// missing or read-only directory, an existing file without --overwrite) is a UsageError naming
/// @p option; other failures (a file system error) are rethrown.
void check_target(const std::string& option, const std::string& path, bool overwrite,
                  const std::vector<vsr::KeptFile>& kept = {});

}  // namespace vsr_run
