// SPDX-License-Identifier: Apache-2.0
// vsr-run --help (options.hpp): the steps and their options from the step table, every option's
// help from the option table, and the rules that are no one option's.
#include "options.hpp"
#include "steps.hpp"

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>

namespace vsr_run {

namespace {

constexpr std::size_t kWidth = 99;
constexpr std::size_t kIndent = 21;

/// @p text wrapped at kWidth after @p first (the first line's start), the other lines indented
/// by @p indent; '\x01' is a space that breaks no line.
std::string wrap(std::string_view text, std::string first, std::size_t indent) {
  std::string out, line = std::move(first);
  std::size_t start = 0;
  bool empty = true;
  while (start < text.size()) {
    std::size_t end = text.find(' ', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view word = text.substr(start, end - start);
    if (!empty && line.size() + 1 + word.size() > kWidth) {
      out += line + "\n";
      line.assign(indent, ' ');
      empty = true;
    }
    if (!empty) line += ' ';
    line += word;
    empty = false;
    start = end + 1;
  }
  out += line + "\n";
  std::replace(out.begin(), out.end(), '\x01', ' ');
  return out;
}

/// "  LABEL  help..." with the help from column kIndent (on the next line for a long label).
std::string entry(const std::string& label, std::string_view help) {
  const std::string text = "  " + label;
  if (text.size() + 1 > kIndent)
    return text + "\n" + wrap(help, std::string(kIndent, ' '), kIndent);
  return wrap(help, text + std::string(kIndent - text.size(), ' '), kIndent);
}

std::string option_label(const OptionSpec& o) {
  std::string label(o.name);
  if (!o.alias.empty()) label += ", " + std::string(o.alias);
  if (!o.value.empty()) label += " " + std::string(o.value);
  return label;
}

std::string group_options(OptionGroup g) {
  std::string text;
  for (const OptionSpec& o : option_table()) {
    if (o.group == g) text += entry(option_label(o), o.help);
  }
  return text;
}

std::string step_options(const Step& s) {
  std::string names;
  for (const std::string_view o : s.options) {
    names += (names.empty() ? "" : " ") + std::string(o);
    if (const OptionSpec* spec = find_option(o); spec && !spec->value.empty()) {
      names += "\x01" + std::string(spec->value);
    }
  }
  return names;
}

constexpr std::string_view kIntro =
    "Applies a step (a band operation) to a raster file, or to a generated sample raster when "
    "no --input is given, within a VRAM budget, and prints a summary: tier, driver, plan, pool "
    "statistics, time, throughput and where the output went. A pipeline chains steps, each "
    "tile read once and written once. Options take their value as \"--name value\" or "
    "\"--name=value\". Each step takes only its own options (below): any other is refused "
    "(exit 2), naming the step and where the option belongs.";

constexpr std::string_view kPipeline =
    "pipeline: vsr-run pipeline read A=a.tif [B=b.tif ...] ! STEP [options] ! ... ! write FILE "
    "[options] [--dry-run]. The steps are those marked \"pipeline\" above, each with its own "
    "options only and the matching op's output rule (calc: X is the previous step's output); "
    "write takes the output options and the run's (resources below, --ignore-mask, "
    "--allow-virtual). The steps' halos are summed. --dry-run prints the plan (tiles, halo, "
    "steps) from the inputs' headers, reading no pixel and writing nothing. Instead of write "
    "FILE, a last step stats [--json] [-o FILE.json] or histogram --range LO,HI [--bins N] "
    "[--json] [-o FILE.json] prints the chain's output as those ops print it, writing no "
    "raster; it takes the run's options too.";

constexpr std::string_view kRules[] = {
    "nodata of the output (raster steps): -a_nodata V sets it (-a_nodata none: none). Otherwise "
    "the output has a nodata only when the input band has one (either band for "
    "normalized-difference), or when it is of an integer type made from floating-point values "
    "(a float input, or the normalized difference, NaN where A + B = 0), whose NaN pixels need "
    "a value that marks them invalid; a float output's NaN pixels are invalid without one. "
    "That nodata is the op's when the output type holds it (NaN for float types; rescale: a "
    "value outside --out-range), else the input's (calc: the first input its expressions "
    "read), else the type's largest value; a value chosen only to mark a GDAL mask's pixels "
    "goes to integer outputs only. A valid pixel that would equal the output's nodata (e.g. "
    "255.4 as uint8 with nodata 255, a calc result saturated to it), however it was chosen, "
    "stops the run with an error: no valid pixel is ever written as nodata.",
    "What the output keeps from the input: georeferencing (none if the input has none), CRS, "
    "AREA_OR_POINT, band descriptions and colour interpretation; scale, offset and unit too "
    "for clip, fill-nodata and focal-mean, which keep the values' meaning.",
    "A file run streams: tiles of at most 64 MiB of input over every band when the budget "
    "allows and the file makes two or more, tile k+1 read while tile k is computed and tile "
    "k-1 written (the summary's \"stages\" line, with the host memory that needs; stages one "
    "after another when it does not fit --host-memory).",
    "BYTES takes a suffix: K, M, G, T (powers of 1000; KB, MB, GB, TB too) or KiB, MiB, GiB, "
    "TiB (powers of 1024), e.g. 80M = 80000000, 2GiB = 2147483648.",
    "Odd data: a rescale whose valid range is infinite stops and asks for --in-range; a "
    "constant raster rescales to the low end of --out-range; rescale's output nodata is never "
    "a valid output value (NaN for float types, else a value outside --out-range: the summary "
    "says which). The sample raster is deterministic: float32, nodata NaN, about 1% of the "
    "pixels NaN.",
};

}  // namespace

std::string usage_text() {
  std::string text =
      "usage: vsr-run --op STEP [options]\n"
      "       vsr-run pipeline read A=a.tif [B=b.tif ...] ! STEP [options] ! ... ! write FILE "
      "[options]\n\n";
  text += wrap(kIntro, "", 0) + "\n";
  text += "steps (--op NAME, default stats; a pipeline's ! NAME):\n";
  for (const Step& s : step_table()) {
    std::string about(s.summary);
    if (s.halo > 0) about += "; halo " + std::to_string(s.halo);
    about += s.in_pipeline ? "; pipeline" : "";
    if (s.kind == StepKind::reduction) about += "; a pipeline's last step";
    if (!s.pipeline_needs.empty()) {
      about += " (needs";
      for (const std::string_view n : s.pipeline_needs) about += " " + std::string(n);
      about += " there)";
    }
    if (!s.options.empty()) about += ". Options: " + step_options(s);
    std::string label(s.name);
    if (!s.alias.empty()) label += " (" + std::string(s.alias) + ")";
    text += entry(label, about);
  }
  text += "\nthe steps' options:\n" + group_options(OptionGroup::step);
  text +=
      "\ninput (read):\n" + group_options(OptionGroup::input) + group_options(OptionGroup::read);
  text += "\noutput (write):\n" + group_options(OptionGroup::output);
  text += "\nresources and the run (an --op run; a pipeline's last step):\n" +
          group_options(OptionGroup::run);
  text += "\nsample (an --op run without --input):\n" + group_options(OptionGroup::sample);
  text += entry("-h, --help", "print this help") + "\n";
  text += wrap(kPipeline, "", 0);
  for (const std::string_view rule : kRules) text += "\n" + wrap(rule, "", 0);
  return text;
}

}  // namespace vsr_run
