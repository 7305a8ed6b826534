// SPDX-License-Identifier: Apache-2.0
// vsr-plan: prints the plan analyze_raster_plan makes for a raster shape and a VRAM budget.
//
// Exit status: 0 on success, 2 for bad arguments (message on stderr), 1 for any other error.
#include "cli.hpp"

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/dispatch.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <iostream>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace vsr = vibespatial::raster;

namespace {

constexpr std::string_view usage_text =
    R"(usage: vsr-plan --height H --width W [options]

Prints how vibespatial-raster would move a raster through the device within a VRAM budget.

options:
  --height H               raster height in pixels (required, > 0)
  --width W                raster width in pixels (required, > 0)
  --dtype NAME             element type: uint8 int8 uint16 int16 uint32 int32 uint64 int64
                           float32 float64 (default float32)
  --bands N                band count (default 1)
  --buffers-per-band N     device buffers per band (default 2: input + output)
  --scratch BYTES          fixed scratch bytes of the operation per pass (default 0)
  --halo N                 overlap pixels per tile side (default 0)
  --budget BYTES|auto      VRAM budget, > 0; auto asks the device (default auto; 0 with no GPU)
  --per-band               bands are independent: allow band batches
  --json                   print JSON instead of a table
  -h, --help               print this help

BYTES takes a suffix: K, M, G, T (powers of 1000; KB, MB, GB, TB too) or KiB, MiB, GiB, TiB
(powers of 1024), e.g. 80M = 80000000, 2GiB = 2147483648.
)";

using vsr_cli::UsageError;

struct Arguments {
  std::optional<std::int64_t> height, width;
  vsr::DType dtype = vsr::DType::float32;
  vsr::PlanOptions options;
  bool json = false;
  bool help = false;
};

using vsr_cli::json_string;
using vsr_cli::parse_integer;
using vsr_cli::parse_size;
using vsr_cli::printable;

Arguments parse_arguments(int argc, char** argv) {
  Arguments args;
  vsr_cli::ArgScanner words(argc, argv);
  while (words.next()) {
    const std::string_view option = words.option();
    const auto value = [&] { return words.value(); };
    const auto flag = [&] { words.flag(); };

    if (option == "-h" || option == "--help") {
      flag();
      args.help = true;
    } else if (option == "--height") {
      args.height = parse_integer<std::int64_t>(option, value());
    } else if (option == "--width") {
      args.width = parse_integer<std::int64_t>(option, value());
    } else if (option == "--dtype") {
      const std::string_view name = value();
      const auto dtype = vsr::dtype_from_string(name);
      if (!dtype) throw UsageError("--dtype: unknown dtype '" + std::string(name) + "'");
      args.dtype = *dtype;
    } else if (option == "--bands") {
      args.options.band_count = parse_integer<int>(option, value());
    } else if (option == "--buffers-per-band") {
      args.options.buffers_per_band = parse_integer<int>(option, value());
    } else if (option == "--scratch") {
      args.options.scratch_bytes = parse_size(option, value());
    } else if (option == "--halo") {
      args.options.halo = parse_integer<int>(option, value());
    } else if (option == "--budget") {
      const std::string_view text = value();
      if (text == "auto") {
        args.options.vram_budget.reset();
      } else {
        args.options.vram_budget = vsr_cli::parse_budget(option, text);
      }
    } else if (option == "--per-band") {
      flag();
      args.options.per_band = true;
    } else if (option == "--json") {
      flag();
      args.json = true;
    } else {
      throw UsageError("unknown argument '" + std::string(option) + "'");
    }
  }
  if (args.help) return args;
  if (!args.height) throw UsageError("--height is required");
  if (!args.width) throw UsageError("--width is required");
  return args;
}

void print_json(std::ostream& out, const Arguments& args, std::uint64_t budget, bool auto_budget,
                const vsr::RasterPlan& plan) {
  const vsr::PlanOptions& o = args.options;
  out << "{\n"
      << "  \"height\": " << *args.height << ",\n"
      << "  \"width\": " << *args.width << ",\n"
      << "  \"dtype\": " << json_string(vsr::to_string(args.dtype)) << ",\n"
      << "  \"band_count\": " << o.band_count << ",\n"
      << "  \"buffers_per_band\": " << o.buffers_per_band << ",\n"
      << "  \"scratch_bytes\": " << o.scratch_bytes << ",\n"
      << "  \"per_band\": " << (o.per_band ? "true" : "false") << ",\n"
      << "  \"vram_budget\": " << budget << ",\n"
      << "  \"budget_source\": " << json_string(auto_budget ? "auto" : "explicit") << ",\n"
      << "  \"usable_budget\": " << vsr::usable_vram_budget(budget) << ",\n"
      << "  \"plan\": {\n"
      << "    \"strategy\": " << json_string(vsr::to_string(plan.strategy)) << ",\n"
      << "    \"tile_shape\": ";
  if (plan.tile_shape) {
    out << "[" << plan.tile_shape->first << ", " << plan.tile_shape->second << "]";
  } else {
    out << "null";
  }
  out << ",\n"
      << "    \"halo\": " << plan.halo << ",\n"
      << "    \"n_tiles\": " << plan.n_tiles << ",\n"
      << "    \"estimated_vram_per_tile\": " << plan.estimated_vram_per_tile << ",\n"
      << "    \"bands_per_pass\": " << plan.bands_per_pass << ",\n"
      << "    \"fits_budget\": " << (plan.fits_budget ? "true" : "false") << "\n"
      << "  }\n"
      << "}\n";
}

void print_table(std::ostream& out, const Arguments& args, std::uint64_t budget, bool auto_budget,
                 const vsr::RasterPlan& plan) {
  const vsr::PlanOptions& o = args.options;
  const auto text = [](const auto& value) {
    std::ostringstream s;
    s << value;
    return s.str();
  };
  std::vector<std::pair<std::string, std::string>> rows{
      {"height", text(*args.height)},
      {"width", text(*args.width)},
      {"dtype", std::string(vsr::to_string(args.dtype))},
      {"bands", text(o.band_count)},
      {"buffers per band", text(o.buffers_per_band)},
      {"scratch bytes", text(o.scratch_bytes)},
      {"per band", o.per_band ? "yes" : "no"},
      {"VRAM budget", text(budget) + (auto_budget ? " (auto)" : "")},
      {"usable budget", text(vsr::usable_vram_budget(budget))},
      {"strategy", std::string(vsr::to_string(plan.strategy))},
      {"tile shape", plan.tile_shape
                         ? text(plan.tile_shape->first) + " x " + text(plan.tile_shape->second)
                         : "-"},
      {"halo", text(plan.halo)},
      {"tiles", text(plan.n_tiles)},
      {"bands per pass", text(plan.bands_per_pass)},
      {"VRAM per pass", text(plan.estimated_vram_per_tile)},
      {"fits budget", plan.fits_budget ? "yes" : "no"},
  };
  std::size_t key_width = 0;
  for (const auto& row : rows) key_width = std::max(key_width, row.first.size());
  for (const auto& [key, value] : rows) {
    out << key << std::string(key_width - key.size() + 2, ' ') << value << '\n';
  }
}

}  // namespace

int main(int argc, char** argv) {
  Arguments args;
  try {
    args = parse_arguments(argc, argv);
  } catch (const UsageError& error) {
    std::cerr << "vsr-plan: " << error.what() << "\n(see vsr-plan --help)\n";
    return 2;
  }
  if (args.help) {
    std::cout << usage_text;
    return 0;
  }
  try {
    const bool auto_budget = !args.options.vram_budget;
    const std::uint64_t budget =
        auto_budget ? vsr::available_vram_bytes() : *args.options.vram_budget;
    vsr::PlanOptions options = args.options;
    options.vram_budget = budget;  // one query, so the plan and the printed budget agree
    const vsr::RasterPlan plan =
        vsr::analyze_raster_plan(*args.height, *args.width, args.dtype, options);
    if (args.json) {
      print_json(std::cout, args, budget, auto_budget, plan);
    } else {
      print_table(std::cout, args, budget, auto_budget, plan);
    }
    return 0;
  } catch (const std::invalid_argument& error) {
    std::cerr << "vsr-plan: " << printable(error.what()) << '\n';
    return 2;
  } catch (const std::overflow_error& error) {
    std::cerr << "vsr-plan: " << printable(error.what()) << '\n';
    return 2;
  } catch (const std::exception& error) {
    std::cerr << "vsr-plan: " << printable(error.what()) << '\n';
    return 1;
  }
}
