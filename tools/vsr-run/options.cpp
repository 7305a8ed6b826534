// SPDX-License-Identifier: Apache-2.0
// vsr-run's command line (options.hpp): the words read against the option table
// (option_table.cpp) and the step table (steps.hpp), which says what each step takes.
#include "options.hpp"

#include "cli.hpp"
#include "steps.hpp"

#include <algorithm>
#include <cerrno>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace vsr_run {

using vsr_cli::UsageError;

namespace {

bool is_identifier(std::string_view s) {
  if (s.empty() || (s.front() >= '0' && s.front() <= '9')) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
}

/// calc's inputs from every -i: NAME=FILE (NAME an identifier), or a bare FILE for input A.
void parse_calc_inputs(Arguments& args) {
  if (args.calc.empty()) throw UsageError("--op calc needs --calc EXPR (one per output band)");
  if (args.inputs.empty()) throw UsageError("--op calc needs -i NAME=FILE (or -i FILE, input A)");
  for (const std::string& text : args.inputs) {
    const std::size_t eq = text.find('=');
    std::string name = "A", path = text;
    if (eq != std::string::npos && is_identifier(std::string_view(text).substr(0, eq))) {
      name = text.substr(0, eq);
      path = text.substr(eq + 1);
    }
    if (path.empty()) throw UsageError("-i " + text + ": no file after '='");
    for (const auto& [other, file] : args.calc_inputs) {
      if (other == name) {
        throw UsageError("-i: input " + name + " is given twice ('" + file + "' and '" + path +
                         "'); name each input: -i A=a.tif -i B=b.tif");
      }
    }
    args.calc_inputs.emplace_back(name, path);
  }
  args.input = args.calc_inputs.front().second;
}

/// The words of one run (--op) or of one pipeline step, read against the option table: each
/// option's value set in @p args; @p check (a pipeline's step) throws the UsageError of an option
/// the step does not take, before its value is read. Returns the steps' own options given, in
/// order.
std::vector<std::string> read_words(std::vector<std::string>& words, Arguments& args,
                                    const std::function<void(const OptionSpec&)>& check) {
  std::vector<char*> argv = {nullptr};
  for (std::string& w : words) argv.push_back(w.data());
  vsr_cli::ArgScanner scan(static_cast<int>(argv.size()), argv.data());
  std::vector<std::string> given;
  while (scan.next()) {
    const std::string_view option = scan.option();
    if (scan.is("-h", "--help")) {
      scan.flag();
      args.help = true;
      continue;
    }
    if (scan.is("--op")) {
      if (check) {
        throw UsageError(
            "--op is not an option of a pipeline's step (each step is named after "
            "its '!')");
      }
      const std::string_view name = scan.value();
      const Step* step = find_step(name);
      if (step == nullptr || step->kind == StepKind::read || step->kind == StepKind::write) {
        throw UsageError("--op: unknown op '" + std::string(name) + "' (" +
                         step_names([](const Step& s) {
                           return s.kind != StepKind::read && s.kind != StepKind::write;
                         }) +
                         ")");
      }
      args.op = step->op;
      args.op_name = name;
      continue;
    }
    const OptionSpec* spec = find_option(option);
    if (spec == nullptr) scan.unknown();
    if (check) check(*spec);
    spec->set(args, scan, option);
    if (spec->group == OptionGroup::step) given.emplace_back(spec->name);
  }
  return given;
}

/// The steps that take @p option, for a message saying where it belongs.
std::string owners(const OptionSpec& option) {
  switch (option.group) {
    case OptionGroup::input:
      return "read (the inputs are read's: read A=a.tif B=b.tif)";
    case OptionGroup::sample:
      return "the sample raster of an --op run without -i";
    case OptionGroup::output:
      return "write (output options go after write FILE)";
    case OptionGroup::read:
    case OptionGroup::run:
      return "the last step, write FILE, stats or histogram (the run's options)";
    case OptionGroup::step:
      break;
  }
  std::string names;
  for (const Step& s : step_table()) {
    if (s.declares(option.name)) names += (names.empty() ? "" : ", ") + std::string(s.name);
  }
  return names;
}

/// The checks of a parsed run that are not one option's: options of other ops, required
/// options, ranges, options that need others.
void check_arguments(Arguments& args, const std::vector<std::string>& given) {
  if (args.op != Op::pipeline) {
    const Step& step = step_of(args.op);
    for (const std::string& option : given) {
      if (!step.declares(option)) {
        throw UsageError(option + " does not apply to --op " + args.op_name + " (an option of " +
                         owners(*find_option(option)) + "; see --help)");
      }
    }
  }
  if (args.op == Op::clip && !args.range) throw UsageError("--op clip needs --range LO,HI");
  if (args.op == Op::warp && args.warp.dst_crs.empty()) {
    throw UsageError("--op warp needs --t_srs SRS (the output's CRS, e.g. EPSG:4326)");
  }
  if (args.op == Op::zonal_stats) {
    if (args.input.empty()) throw UsageError("--op zonal-stats needs -i RASTER");
    if (args.zones.empty()) throw UsageError("--op zonal-stats needs --zones FILE");
    const std::string& out = args.output;
    const auto ends = [&](std::string_view ext) {
      if (out.size() < ext.size()) return false;
      for (std::size_t k = 0; k < ext.size(); ++k) {
        const char c = out[out.size() - ext.size() + k];
        if ((c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c) != ext[k]) return false;
      }
      return true;
    };
    if (!out.empty() && !ends(".csv") && !ends(".json")) {
      throw UsageError("-o: zonal-stats writes a table: FILE.csv or FILE.json");
    }
    const bool weighted =
        std::any_of(args.zonal_stats.begin(), args.zonal_stats.end(),
                    [](const std::string& s) { return s.starts_with("weighted"); });
    if (weighted && args.weights.empty()) {
      throw UsageError("--stats: weighted_mean and weighted_sum need --weights FILE");
    }
  }
  if (args.warp.resolution && args.warp.size) {
    throw UsageError(
        "--tr and --ts are exclusive (as in gdalwarp): give the pixel size or the "
        "pixel count");
  }
  if (args.op == Op::fill_nodata && !args.value) {
    throw UsageError("--op fill-nodata needs --value V");
  }
  if (args.range && !(args.range->lo <= args.range->hi)) {
    throw UsageError("--range: LO must not exceed HI");
  }
  if (args.op == Op::histogram && args.range && !(args.range->lo < args.range->hi)) {
    throw UsageError("--range: a histogram needs LO < HI");
  }
  if (args.in_range && !(args.in_range->lo != args.in_range->hi)) {
    throw UsageError("--in-range: LO and HI must differ (HI,LO maps the other way round)");
  }
  if (args.out_range && !(args.out_range->lo != args.out_range->hi)) {
    throw UsageError("--out-range: LO and HI must differ");
  }
  if (args.nir && args.red && *args.nir == *args.red) {
    throw UsageError("--nir and --red are the same band (" + std::to_string(*args.nir) +
                     "): the normalized difference of a band with itself is 0 everywhere");
  }
  if (args.op == Op::calc) parse_calc_inputs(args);
  if (!args.bands.empty() && args.op == Op::calc) {
    throw UsageError("-b: calc reads the bands its expressions name (A[2], ...)");
  }
  if (!args.bands.empty() && args.input.empty()) {
    throw UsageError("-b selects bands of an --input file");
  }
  if (!args.bands.empty() && args.op == Op::normalized_difference) {
    throw UsageError("-b: normalized-difference takes its two bands from --nir and --red");
  }
  if (!args.output.empty() && !args.raster_output() &&
      (!args.format.empty() || !args.creation_options.empty() || !args.overviews.empty() ||
       !args.resampling.empty())) {
    throw UsageError("-of / --co / --overviews / --resampling: --op " + args.op_name +
                     " writes JSON, not a raster");
  }
  if ((!args.overviews.empty() || !args.resampling.empty()) &&
      (args.output.empty() || !args.raster_output())) {
    throw UsageError(std::string(args.overviews.empty() ? "--resampling" : "--overviews") +
                     " applies to a raster --output");
  }
}

}  // namespace

Arguments parse_arguments(int argc, char** argv) {
  Arguments args;
  std::vector<std::string> words(argv + std::min(argc, 1), argv + argc);
  const std::vector<std::string> given = read_words(words, args, nullptr);
  if (args.help) return args;
  check_arguments(args, given);
  return args;
}

namespace {

UsageError pipeline_usage(const std::string& what) {
  return UsageError("pipeline: " + what +
                    " (vsr-run pipeline read A=a.tif ! STEP [options] ! ... ! write FILE "
                    "[output options])");
}

/// A pipeline's last step, write FILE or a terminal stats or histogram, with the run's options.
Arguments parse_last_step(std::vector<std::string> words, bool& dry_run) {
  const std::string last = words.front();
  words.erase(words.begin());
  std::erase_if(words, [&](const std::string& w) {
    if (w != "--dry-run") return false;
    dry_run = true;
    return true;
  });
  const Step& step = last == "write" ? write_step() : *find_step(last);
  const auto check = [&](const OptionSpec& o) {
    const bool takes =
        o.group == OptionGroup::run || o.group == OptionGroup::read ||
        (last == "write" ? o.group == OptionGroup::output
                         : step.declares(o.name) || o.name == "-o" || o.name == "--overwrite");
    if (!takes) {
      throw UsageError("pipeline step " + last + ": " + std::string(o.name) +
                       " is not an option of " + last + "; it belongs to " + owners(o));
    }
  };
  Arguments args;
  if (last == "write") {
    if (words.empty() || words.front().starts_with("-")) {
      throw pipeline_usage("write needs FILE first");
    }
    words.insert(words.begin(), "-o");
    args.op = Op::pipeline;
    const std::vector<std::string> given = read_words(words, args, check);
    check_arguments(args, given);
    return args;
  }
  // A terminal stats or histogram: its own options (--json, -o FILE for the JSON, --bins,
  // --range) and the run's.
  args.op = step.op;
  args.op_name = last;
  try {
    const std::vector<std::string> given = read_words(words, args, check);
    check_arguments(args, given);
  } catch (const UsageError& e) {
    const std::string what = e.what();
    throw what.starts_with("pipeline step ") ? e
                                             : UsageError("pipeline step " + last + ": " + what);
  }
  for (const std::string_view need : step.pipeline_needs) {
    const OptionSpec& o = *find_option(need);
    if (need == "--range" && !args.range) {
      throw pipeline_usage(last + " needs " + std::string(o.name) + " " + std::string(o.value) +
                           " in a pipeline (no first pass finds the range)");
    }
  }
  args.terminal = step.op;
  return args;
}

/// A pipeline's step @p s between read and write: its name and only the options it declares.
std::shared_ptr<const Arguments> parse_step(std::size_t s, const std::vector<std::string>& seg,
                                            const std::vector<std::string>& inputs) {
  const std::string& name = seg.front();
  const Step* step = find_step(name);
  if (step != nullptr && !step->pipeline_refusal.empty()) {
    throw pipeline_usage("step '" + name + "': " + std::string(step->pipeline_refusal));
  }
  if (step == nullptr || !step->in_pipeline) {
    throw pipeline_usage("unknown step '" + name + "' (" +
                         step_names([](const Step& t) { return t.in_pipeline; }) +
                         "; read first, write last)");
  }
  const std::string where = "pipeline step " + std::to_string(s) + " (" + name + "): ";
  Arguments args;
  args.op = step->op;
  args.op_name = name;
  std::vector<std::string> words(seg.begin() + 1, seg.end());
  try {
    const std::vector<std::string> given = read_words(words, args, [&](const OptionSpec& o) {
      if (!step->declares(o.name)) {
        throw UsageError(std::string(o.name) + " is not an option of " + name + "; it belongs to " +
                         owners(o));
      }
    });
    // calc's inputs are read's.
    if (step->kind == StepKind::calc) args.inputs = inputs;
    check_arguments(args, given);
  } catch (const UsageError& e) {
    throw UsageError(where + e.what());
  }
  for (const std::string_view need : step->pipeline_needs) {
    if (need == "--in-range" && !args.in_range) {
      const OptionSpec& o = *find_option(need);
      throw UsageError(where + name + " needs " + std::string(o.name) + " " + std::string(o.value) +
                       " in a pipeline (no first pass finds the range)");
    }
  }
  return std::make_shared<const Arguments>(std::move(args));
}

}  // namespace

Arguments parse_pipeline(int argc, char** argv) {
  std::vector<std::vector<std::string>> segments(1);
  for (int i = 1; i < argc; ++i) {
    const std::string_view w = argv[i];
    if (w == "!") {
      segments.emplace_back();
    } else {
      segments.back().emplace_back(w);
    }
  }
  if (segments.size() == 1 && !segments[0].empty() &&
      (segments[0][0] == "-h" || segments[0][0] == "--help")) {
    Arguments help;
    help.help = true;
    return help;
  }
  if (segments.front().empty() || segments.front().front() != "read") {
    throw pipeline_usage("the first step must be read");
  }
  if (segments.size() < 2 || segments.back().empty() ||
      (segments.back().front() != "write" && segments.back().front() != "stats" &&
       segments.back().front() != "histogram")) {
    throw pipeline_usage("the last step must be write FILE, stats or histogram");
  }
  // read NAME=FILE ...: the inputs, as calc's -i.
  std::vector<std::string> inputs;
  for (std::size_t k = 1; k < segments.front().size(); ++k) {
    const std::string& word = segments.front()[k];
    if (word.starts_with("-")) {
      throw pipeline_usage("read takes only NAME=FILE (or FILE, input A), not '" + word +
                           "': the run's options go after write FILE");
    }
    inputs.push_back(word);
  }
  if (inputs.empty()) throw pipeline_usage("read needs NAME=FILE (or FILE, input A)");
  bool dry_run = false;
  Arguments args = parse_last_step(segments.back(), dry_run);
  args.op = Op::pipeline;
  args.op_name = "pipeline";
  args.dry_run = dry_run;
  {
    Arguments named;
    named.calc = {"1"};
    named.inputs = inputs;
    parse_calc_inputs(named);
    args.calc_inputs = named.calc_inputs;
    args.input = named.input;
  }
  for (std::size_t s = 1; s + 1 < segments.size(); ++s) {
    if (segments[s].empty()) throw pipeline_usage("step " + std::to_string(s) + " is empty");
    args.steps.push_back(parse_step(s, segments[s], inputs));
    const Step& step = *find_step(segments[s].front());
    if (step.kind == StepKind::grid && s != 1) {
      throw pipeline_usage("step " + std::to_string(s) + " (" + segments[s].front() +
                           "): it changes the grid, so it comes directly after read");
    }
    if (args.steps.back()->dry_run) {
      throw pipeline_usage("step " + std::to_string(s) + " (" + segments[s].front() +
                           "): --dry-run goes after the last step");
    }
  }
  if (args.steps.empty()) throw pipeline_usage("no step between read and write");
  return args;
}

std::vector<vsr::KeptFile> files_read(const Arguments& args) {
  std::vector<vsr::KeptFile> kept;
  for (const auto& [name, path] : args.calc_inputs) kept.push_back({"input " + name, path});
  if (!args.zones.empty()) kept.push_back({"--zones", args.zones});
  if (!args.weights.empty()) kept.push_back({"--weights", args.weights});
  if (args.calc_inputs.empty() && !args.input.empty()) kept.push_back({"the input", args.input});
  return kept;
}

std::vector<vsr::KeptFile> files_of_the_run(const Arguments& args) {
  std::vector<vsr::KeptFile> kept = files_read(args);
  if (!args.output.empty()) kept.push_back({"the output", args.output});
  return kept;
}

void check_target(const std::string& option, const std::string& path, bool overwrite,
                  const std::vector<vsr::KeptFile>& kept) {
  try {
    vsr::check_output_path(path, overwrite, kept);
  } catch (const std::invalid_argument& e) {
    throw UsageError(option + ": " + e.what());
  } catch (const std::system_error& e) {
    const int err = e.code().value();
    if (e.code().category() != std::generic_category()) throw;
    if (err == EEXIST) {
      throw UsageError(option + ": '" + path +
                       "' exists; add --overwrite to replace it (it is replaced only once the "
                       "new file is complete)");
    }
    // The path the command line gave names no place to write: a missing or read-only directory.
    if (err == ENOENT || err == ENOTDIR || err == EACCES || err == EPERM || err == EROFS ||
        err == ENAMETOOLONG || err == ELOOP || err == EISDIR) {
      throw UsageError(option + ": " + e.what());
    }
    throw;
  }
}

}  // namespace vsr_run
