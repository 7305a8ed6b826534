// SPDX-License-Identifier: Apache-2.0
// What a vsr-run prints (job.hpp): the statistics and histograms (a table or JSON) and the
// summary.
#include "cli.hpp"
#include "format.hpp"
#include "job.hpp"

#include <vibespatial/raster/io.hpp>
#include <vibespatial/raster/memory.hpp>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

namespace vsr_run {

using vsr_cli::printable;

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

namespace {

/// A statistic as JSON: a number (%.17g), or for the values JSON has no number for the strings
/// "inf", "-inf" and "nan" (a band holding infinities has an infinite min, max or mean, and a
/// NaN std); null is kept for "no valid pixel".
std::string json_statistic(double v) {
  if (std::isnan(v)) return "\"nan\"";
  if (std::isinf(v)) return v > 0 ? "\"inf\"" : "\"-inf\"";
  return json_number(v);
}

/// numpy.histogram's edges of a band: linspace(lo, hi, bins + 1) in float64, as float32 for
/// float32 data (numpy's bin dtype is the data's there).
std::vector<double> histogram_edges(Range r, int bins, vsr::DType dtype) {
  std::vector<double> edges(static_cast<std::size_t>(bins) + 1);
  const double step = (r.hi - r.lo) / bins;
  for (int i = 0; i <= bins; ++i) {
    const double e = i == bins ? r.hi : i * step + r.lo;
    edges[static_cast<std::size_t>(i)] =
        dtype == vsr::DType::float32 ? static_cast<double>(static_cast<float>(e)) : e;
  }
  return edges;
}

}  // namespace

/// Statistics and histograms: a table, or JSON (to stdout, or to --output).
void Job::print_results() {
  if (op_step_ != nullptr && op_step_->kind == StepKind::table) {
    if (args_.json) {
      std::fputs(table_json_.c_str(), stdout);
      if (!table_json_.ends_with('\n')) std::fputc('\n', stdout);
    } else if (args_.output.empty()) {
      std::fputs(table_csv_.c_str(), stdout);
    }
    std::fflush(stdout);
    return;
  }
  const std::size_t nsel = bands_.size();
  std::string text;
  const bool json = args_.json || !args_.output.empty();
  if (json) {
    text = "{\"input\": " + vsr_cli::json_string(from_file_ ? args_.input : "sample") +
           ", \"dtype\": \"" + std::string(vsr::to_string(meta_.dtype)) + "\", \"bands\": [";
    for (std::size_t b = 0; b < nsel; ++b) {
      text += std::string(b ? ", " : "") + "{\"band\": " + std::to_string(bands_[b]) +
              ", \"nodata\": " +
              (band_nodata_[b] ? vsr_cli::json_string(band_nodata_[b]->to_string()) : "null");
      if (args_.printed_op() == Op::stats) {
        const vsr::BandStatistics& m = stats_[b];
        const bool any = m.count > 0;
        text += ", \"count\": " + std::to_string(m.count) +
                ", \"min\": " + (any ? json_statistic(m.min) : "null") +
                ", \"max\": " + (any ? json_statistic(m.max) : "null") +
                ", \"mean\": " + (any ? json_statistic(m.mean) : "null") +
                ", \"std\": " + (any ? json_statistic(m.std) : "null");
      } else {
        text += ", \"range\": [" + json_number(hist_range_[b].lo) + ", " +
                json_number(hist_range_[b].hi) + "], \"edges\": [";
        const std::vector<double> edges = histogram_edges(hist_range_[b], args_.bins, meta_.dtype);
        for (std::size_t i = 0; i < edges.size(); ++i) {
          text += std::string(i ? ", " : "") + json_number(edges[i]);
        }
        text += "], \"counts\": [";
        for (std::size_t i = 0; i < hist_[b].size(); ++i) {
          text += std::string(i ? ", " : "") + std::to_string(hist_[b][i]);
        }
        text += "]";
      }
      text += "}";
    }
    text += "]}\n";
  } else if (args_.printed_op() == Op::stats) {
    char line[256];
    std::snprintf(line, sizeof line, "%-5s %12s %14s %14s %14s %14s\n", "band", "count", "min",
                  "max", "mean", "std");
    text += line;
    for (std::size_t b = 0; b < nsel; ++b) {
      const vsr::BandStatistics& m = stats_[b];
      const double nan = std::numeric_limits<double>::quiet_NaN();
      const bool any = m.count > 0;
      std::snprintf(line, sizeof line, "%-5d %12lld %14.6g %14.6g %14.6g %14.6g\n", bands_[b],
                    static_cast<long long>(m.count), any ? m.min : nan, any ? m.max : nan,
                    any ? m.mean : nan, any ? m.std : nan);
      text += line;
    }
  } else {
    char line[256];
    for (std::size_t b = 0; b < nsel; ++b) {
      std::snprintf(line, sizeof line, "band %d: %d bins on [%.17g, %.17g]\n", bands_[b],
                    args_.bins, hist_range_[b].lo, hist_range_[b].hi);
      text += line;
      const std::vector<double> edges = histogram_edges(hist_range_[b], args_.bins, meta_.dtype);
      for (int i = 0; i < args_.bins; ++i) {
        const auto k = static_cast<std::size_t>(i);
        std::snprintf(line, sizeof line, "  [%.10g, %.10g%c %lld\n", edges[k], edges[k + 1],
                      i + 1 == args_.bins ? ']' : ')', static_cast<long long>(hist_[b][k]));
        text += line;
      }
    }
  }
  if (!args_.output.empty()) {
    vsr::write_file_atomically(args_.output, text, args_.overwrite);
    output_label_ = printable(args_.output) + " (JSON)";
  } else {
    std::fputs(text.c_str(), stdout);
    output_label_ = args_.json ? "the JSON above" : "the table above";
  }
}

std::string Job::plan_text() const {
  std::string text = std::string(vsr::to_string(plan_.strategy));
  if (tiled_) {
    text += ", " + std::to_string(plan_.n_tiles) + " tiles of " +
            std::to_string(plan_.tile_shape->first) + " x " +
            std::to_string(plan_.tile_shape->second) + " (halo " + std::to_string(plan_.halo) + ")";
  }
  text += ", " + std::to_string(plan_.bands_per_pass) + " band(s) per pass, budget " +
          vsr_cli::format_bytes(*popts_.vram_budget) + budget_note_ + ", " +
          vsr_cli::format_bytes(plan_.estimated_vram_per_tile) + " per pass" +
          (plan_.fits_budget ? "" : " (does NOT fit the budget)");
  if (streamed_)
    text += "; tiles of at most " + vsr_cli::format_bytes(kStreamTileBytes) + " streamed";
  return text;
}

std::string Job::stages_text() const {
  std::string text = overlap_ > 0 ? "reading, computing and writing overlapped (" +
                                        std::to_string(overlap_) + " tile(s) queued between stages)"
                                  : "reading, computing and writing one after another";
  if (host_bytes_ > 0) {
    text += ", host memory " + vsr_cli::format_bytes(host_bytes_) + " at most (" +
            std::to_string(vsr::overlap_tiles_live(overlap_)) +
            " tile(s) and result(s) live, GDAL's blocks and cache)";
  }
  return text;
}

void Job::print_summary(double seconds) const {
  const double pixels = static_cast<double>(bands_.size()) * static_cast<double>(meta_.height) *
                        static_cast<double>(meta_.width);
  const vsr::MemoryPoolStats pool = vsr::memory_pool_stats();
  // With --json on stdout the summary goes to stderr, so stdout stays one JSON document.
  // So does a table printed as CSV.
  const bool table = op_step_ != nullptr && op_step_->kind == StepKind::table;
  FILE* out = (args_.json || table) && args_.output.empty() ? stderr : stdout;
  std::fprintf(out, "vsr-run summary\n");
  std::fprintf(out, "  op          %s%s\n", args_.op_name.c_str(),
               note_.empty() ? "" : (": " + note_).c_str());
  std::fprintf(out, "  input       %s\n", input_label_.c_str());
  std::fprintf(out, "  driver      %s\n", placement_.reason.c_str());
  std::fprintf(out, "  tier        %s\n",
               pool.tier.empty() ? "none (no device memory pool)" : pool.tier.c_str());
  std::fprintf(out, "  plan        %s\n", plan_text().c_str());
  if (from_file_) std::fprintf(out, "  stages      %s\n", stages_text().c_str());
  if (gdal_cache_) {
    std::fprintf(out, "  gdal cache  %s (from the plan)\n",
                 vsr_cli::format_bytes(*gdal_cache_).c_str());
  }
  if (pool.configured) {
    const std::uint64_t peak = pool.peak_bytes.value_or(pool.used_bytes.value_or(0));
    std::fprintf(
        out, "  pool        peak %s, pool size %s\n", vsr_cli::format_bytes(peak).c_str(),
        pool.pool_size ? vsr_cli::format_bytes(*pool.pool_size).c_str() : "n/a for this tier");
  } else {
    std::fprintf(out, "  pool        not configured (no driver)\n");
  }
  std::fprintf(out, "  time        %.3f s\n", seconds);
  std::fprintf(out, "  throughput  %.1f Mpx/s (%.0f pixels, all bands)\n",
               seconds > 0 ? pixels / seconds / 1e6 : 0.0, pixels);
  std::fprintf(out, "  output      %s\n", output_label_.c_str());
}

/// --dry-run: the plan (tiles, halo, steps) and nothing read but the headers.
void Job::print_dry_run() const {
  if (op_step_ != nullptr) {
    std::printf("vsr-run --op %s (dry run: no pixel read, nothing written)\n",
                args_.op_name.c_str());
    std::printf("  input       %s\n", input_label_.c_str());
    for (const std::string& line : step_plan_) std::printf("  %s\n", line.c_str());
    std::printf("  plan        %s\n", plan_text().c_str());
    if (from_file_) std::printf("  stages      %s\n", stages_text().c_str());
    std::printf("  output      %s\n",
                args_.output.empty() ? "none"
                : !args_.raster_output()
                    ? printable(args_.output).c_str()
                    : (printable(args_.output) + " (" + write_.driver + ")").c_str());
    return;
  }
  const std::string steps = chain_text();
  std::printf("vsr-run pipeline (dry run: no pixel read, nothing written)\n");
  std::printf("  input       %s\n", input_label_.c_str());
  const char* last = !args_.terminal               ? "write"
                     : args_.terminal == Op::stats ? "stats"
                                                   : "histogram";
  std::printf("  steps       read ! %s ! %s\n", steps.c_str(), last);
  std::printf("  halo        %d (the sum of the steps')\n", chain_->halo());
  for (const std::string& line : step_plan_) std::printf("  %s\n", line.c_str());
  std::printf("  plan        %s\n", plan_text().c_str());
  std::printf("  stages      %s\n", stages_text().c_str());
  if (args_.terminal) {
    std::printf(
        "  output      %s of the chain's output, %s\n",
        args_.terminal == Op::stats ? "statistics" : "histograms",
        args_.output.empty() ? "printed" : ("as JSON in " + printable(args_.output)).c_str());
  } else {
    std::printf("  output      %s (%s)\n", printable(args_.output).c_str(), write_.driver.c_str());
  }
}

}  // namespace vsr_run
