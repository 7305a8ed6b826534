// SPDX-License-Identifier: Apache-2.0
// One vsr-run (job.hpp): checks, input, plan, and the op through the tile executor.
#include "job.hpp"

#include "checked_math.hpp"
#include "cli.hpp"
#include "dtype_visit.hpp"
#include "format.hpp"
#include "steps.hpp"

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/dispatch.hpp>
#include <vibespatial/raster/driver.hpp>
#include <vibespatial/raster/errors.hpp>
#include <vibespatial/raster/io.hpp>
#include <vibespatial/raster/memory.hpp>
#include <vibespatial/raster/ops.hpp>
#include <vibespatial/raster/tiles.hpp>

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace vsr_run {

using vsr_cli::printable;
using vsr_cli::UsageError;

Progress::Progress(bool enabled, std::string what)
    : enabled_(enabled), tty_(::isatty(2) != 0), what_(std::move(what)) {}

void Progress::update(std::int64_t done, std::int64_t total, const char* unit) {
  if (!enabled_ || total <= 0) return;
  const std::lock_guard<std::mutex> lock(mutex_);
  const int pct = static_cast<int>(100 * done / total);
  if (tty_) {
    std::fprintf(stderr, "\r\033[K[vsr-run] %s: %s %lld/%lld (%d%%)%s", what_.c_str(), unit,
                 static_cast<long long>(done), static_cast<long long>(total), pct,
                 done == total ? "\n" : "");
  } else {
    std::fprintf(stderr, "[vsr-run] %s: %s %lld/%lld (%d%%)\n", what_.c_str(), unit,
                 static_cast<long long>(done), static_cast<long long>(total), pct);
  }
  std::fflush(stderr);
}

void Progress::stage(const vsr::TileInfo& where, vsr::TileStage stage) {
  if (!enabled_ || !tty_) return;
  const std::lock_guard<std::mutex> lock(mutex_);
  const char* step = stage == vsr::TileStage::read      ? "reading"
                     : stage == vsr::TileStage::compute ? "computing"
                                                        : "writing";
  std::fprintf(
      stderr, "\r\033[K[vsr-run] %s: tile %lld/%lld, band%s %d%s%s: %s", what_.c_str(),
      static_cast<long long>(where.index + 1), static_cast<long long>(where.total),
      where.band_count > 1 ? "s" : "", where.first_band + 1, where.band_count > 1 ? "-" : "",
      where.band_count > 1 ? std::to_string(where.first_band + where.band_count).c_str() : "",
      step);
  std::fflush(stderr);
}

std::string nodata_text(const std::optional<vsr::NodataValue>& v) {
  return v ? v->to_string() : std::string("none");
}

void Job::print_diagnostics() {
  if (!args_.diagnostics) return;
  timings_.finish();
  timings_.print(stderr);
  std::fflush(stderr);
}

int Job::run() {
  const auto start = std::chrono::steady_clock::now();
  // An interrupted or killed run leaves no partial output: the output is written to a temporary
  // file beside it, which these handlers remove before the signal ends the process.
  vsr::remove_partial_outputs_on_signals();
  try {
    show_progress_ = !args_.quiet && (args_.progress || ::isatty(2) != 0);
    enter("looking for a device");
    placement_ = vsr::placed(args_.device);
    from_file_ = !args_.input.empty();
    if (args_.op != Op::pipeline) op_step_ = &step_of(args_.op);
    enter("checking the output");
    check_output();
    enter(from_file_ ? "reading the input's header" : "making the sample raster");
    open_inputs();
    enter("checking the output");
    check_output_trial();
    enter("planning");
    make_plan();
    enter("running " + args_.op_name);
    if (args_.dry_run) {
      print_dry_run();
      print_diagnostics();
      return 0;
    }
    run_step();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    enter("printing the results");
    if (!args_.raster_output()) print_results();
    if (!args_.quiet) print_summary(seconds);
    print_diagnostics();
  } catch (const vsr::OutOfMemoryError&) {
    throw;  // the device's, with its own message
  } catch (const std::bad_alloc&) {
    // Every allocation sized by the input is checked up front; one that fails all the same
    // (memory taken meanwhile) is named, never a bare std::bad_alloc.
    const std::uint64_t avail = vsr::available_host_memory();
    throw vsr::HostMemoryLimitError(0, avail,
                                    "out of host memory while " + step_ + " (" +
                                        vsr_cli::format_bytes(avail) + " available now)");
  }
  return 0;
}

/// Refuses up front (HostMemoryLimitError) @p what, which needs @p bytes of host memory, when
/// that is more than --host-memory or what is available; @p advice says what to do instead.
void Job::check_host_memory(std::uint64_t bytes, const std::string& what,
                            const std::string& advice) const {
  const std::uint64_t limit = args_.host_memory.value_or(vsr::available_host_memory());
  if (bytes <= limit) return;
  throw vsr::HostMemoryLimitError(
      bytes, limit,
      what + " needs " + vsr_cli::format_bytes(bytes) + " of host memory, more than the " +
          vsr_cli::format_bytes(limit) +
          (args_.host_memory ? " allowed (--host-memory)" : " available (--host-memory)") + "; " +
          advice);
}

/// GDAL present, --overwrite, and the output's driver and creation options (what needs no
/// input: the trial of the format comes after the input's header, check_raster_output).
void Job::check_output() {
  if ((from_file_ || (!args_.output.empty() && args_.raster_output())) && !vsr::io_available()) {
    throw std::runtime_error(std::string(from_file_ ? "--input" : "--output") +
                             ": this vsr-run was built without GDAL (install libgdal-dev and "
                             "rebuild); run without --input/--output to use the sample raster");
  }
  // The target of any output (a directory, FIFO or device, a directory that takes no
  // temporary, an existing file without --overwrite): a usage error before anything is read. A
  // raster may replace its input (in place); JSON never does.
  if (!args_.output.empty()) {
    check_target("--output", args_.output, args_.overwrite,
                 args_.raster_output() ? std::vector<vsr::KeptFile>{} : files_read(args_));
  }
  if (!args_.output.empty() && args_.raster_output()) {
    write_.driver = args_.format.empty() ? vsr::output_driver_for(args_.output) : args_.format;
    if (write_.driver.empty()) {
      throw UsageError("--output: cannot tell the format of '" + args_.output +
                       "' from its extension; give -of FORMAT (e.g. -of GTiff)");
    }
    write_.num_threads = args_.threads;
    write_.overwrite = args_.overwrite;
    // The driver first, without --co: what it refuses is the format's (named by -of, or by the
    // output's extension), never the creation options'.
    try {
      vsr::check_write_options(write_);
    } catch (const std::invalid_argument& e) {
      throw UsageError(args_.format.empty()
                           ? "--output: " + std::string(e.what()) + " (the format of '" +
                                 args_.output + "', from its extension; -of chooses another)"
                           : "-of: " + std::string(e.what()));
    }
    write_.creation_options = args_.creation_options;
    // Options the driver refuses are a usage error now, not a failure after the whole run.
    try {
      vsr::check_write_options(write_);
    } catch (const std::invalid_argument& e) {
      throw UsageError("--co: " + std::string(e.what()));
    }
    for (const auto& [option, field, value] :
         {std::tuple{"--resampling", &vsr::WriteOptions::resampling, &args_.resampling},
          std::tuple{"--overviews", &vsr::WriteOptions::overviews, &args_.overviews}}) {
      write_.*field = *value;
      try {
        vsr::check_write_options(write_);
      } catch (const std::invalid_argument& e) {
        throw UsageError(std::string(option) + ": " + e.what());
      }
    }
    const bool cog = is_cog(write_.driver);
    if (!args_.resampling.empty() &&
        (args_.overviews == "none" || (args_.overviews.empty() && !cog))) {
      throw UsageError("--resampling: the output gets no overviews to resample (" +
                       std::string(args_.overviews.empty()
                                       ? "a " + write_.driver + " output has none by default"
                                       : "--overviews none") +
                       "): give --overviews auto or a list of factors");
    }
  }
  open_.allow_virtual = args_.allow_virtual;
  open_.ignore_mask = args_.ignore_mask;
  open_.num_threads = args_.threads;  // GTiff decodes in parallel, as it encodes
}

/// The one plan of the run: printed in the summary, followed by the streamed runs, the tiled
/// executors and dispatch_per_band_gpu alike.
void Job::make_plan() {
  // A warped pipeline reads every band of a tile together, as --op warp (one validity for all
  // bands with --srcnodata).
  per_band_op_ = op_step_ ? op_step_->per_band : chain_->bands_independent() && warped_.empty();
  const bool per_band_op = per_band_op_;
  budget_note_ = args_.budget ? "" : " (auto)";
  if (args_.budget) {
    popts_.vram_budget = *args_.budget;
  } else if (const std::uint64_t vram = vsr::available_vram_bytes(); vram > 0) {
    popts_.vram_budget = vram;
  } else {
    // No GPU: plan tiles for host memory, so that a raster larger than memory still streams.
    popts_.vram_budget = std::max<std::uint64_t>(
        1, std::min<std::uint64_t>(vsr::available_host_memory() / 4, 1ULL << 30));
    budget_note_ = " (auto: host memory, no GPU)";
  }
  popts_.per_band = per_band_op;
  popts_.halo = op_step_ ? op_step_->halo : 0;
  vsr::RasterMetadata plan_meta = meta_;
  plan_meta.band_count = static_cast<int>(bands_.size());
  // Reductions hold one buffer per band; the others an input and an output.
  popts_.buffers_per_band = args_.raster_output() || args_.op == Op::pipeline ? 2 : 1;
  plan_ = vsr::plan_from_metadata(plan_meta, popts_);
  tiled_ = plan_.strategy == vsr::TilingStrategy::tiled;

  progress_.emplace(show_progress_, args_.op_name);
  if (args_.op == Op::calc || args_.op == Op::pipeline) {
    // Every band read of every input and every output band at once, in the compute type.
    int read = 0;
    for (const auto& src : calc_sources_) read += static_cast<int>(src->bands().size());
    const int out_bands = args_.op == Op::calc ? static_cast<int>(args_.calc.size())
                                               : chain_->band_count().value_or(read);
    plan_meta.band_count = per_band_op_ ? read : std::max(read, out_bands);
    plan_meta.dtype = calc_options_.compute_float32 ? vsr::DType::float32 : vsr::DType::float64;
    if (args_.op == Op::pipeline) popts_.halo = chain_->halo();  // the steps' halos summed
    plan_ = vsr::plan_from_metadata(plan_meta, popts_);
    tiled_ = plan_.strategy == vsr::TilingStrategy::tiled;
  }
  if (from_file_) stream_plan(plan_meta);
  if (!calc_sources_.empty()) {
    // GDAL's block cache is one for the process: room for every input's blocks.
    std::uint64_t cache = 0;
    for (const auto& src : calc_sources_) cache += src->gdal_cache_for(plan_, false);
    gdal_cache_ = cache;
    choose_overlap();
    for (const auto& src : calc_sources_) {
      vsr::StreamOptions memory;
      memory.per_band = false;
      memory.host_memory_limit = args_.host_memory.value_or(0);
      memory.gdal_cache_bytes = cache;
      memory.overlap = overlap_;
      src->prepare(plan_, memory, "vsr-run");
    }
  }
  if (file_) {
    vsr::StreamOptions memory;
    memory.per_band = per_band_op_;
    memory.host_memory_limit = args_.host_memory.value_or(0);
    memory.gdal_cache_bytes = gdal_cache_ = file_->gdal_cache_for(plan_, per_band_op_);
    choose_overlap();
    memory.overlap = overlap_;
    file_->prepare(plan_, memory, "vsr-run");
  }
  count_host_bytes();
  stats_.assign(bands_.size(), {});
}

/// A file run streams: the plan the budget allows is narrowed to tiles of at most
/// kStreamTileBytes of input over every selected band, when such a plan fits the budget and has
/// two tiles or more, so that reading, computing and writing overlap (choose_overlap) and each
/// block of a pixel-interleaved file is decoded once (a tile carries every band).
void Job::stream_plan(const vsr::RasterMetadata& plan_meta) {
  vsr::PlanOptions s = popts_;
  s.per_band = false;
  // The planner keeps 30% of a budget back and counts the halo: room for a tile of
  // kStreamTileBytes (and its buffers) with 10% to spare.
  const auto want = static_cast<std::uint64_t>(static_cast<double>(kStreamTileBytes) *
                                               s.buffers_per_band * 1.1 / 0.7) +
                    s.scratch_bytes;
  s.vram_budget = std::min(*popts_.vram_budget, want);
  const vsr::RasterPlan p = vsr::plan_from_metadata(plan_meta, s);
  if (p.strategy != vsr::TilingStrategy::tiled || p.n_tiles < 2 || !p.fits_budget) return;
  if (tiled_ && plan_.n_tiles >= p.n_tiles) return;  // the budget's tiles are smaller already
  plan_ = p;
  tiled_ = true;
  streamed_ = true;
}

/// Overlaps the stages of a file run with two or more tiles (TileRunOptions::overlap 1: one
/// tile queued between stages) when the host memory that keeps live fits --host-memory (or
/// what is available); one stage after another otherwise.
void Job::choose_overlap() {
  overlap_ = 0;
  if (!from_file_) return;
  std::int64_t stops = tiled_ ? plan_.n_tiles : 1;
  if (file_) {
    stops *= static_cast<std::int64_t>(vsr::tile_passes(band_nodata_, plan_, per_band_op_).size());
  }
  if (stops < 2) return;
  std::uint64_t bytes = 0;
  try {
    if (file_) bytes = file_->run_host_bytes(plan_, per_band_op_, 1, gdal_cache_);
    for (const auto& src : calc_sources_) {
      bytes = vsr::detail::checked_add(bytes, src->run_host_bytes(plan_, false, 1, gdal_cache_),
                                       "the host memory of a run");
    }
  } catch (const std::overflow_error&) {
    return;
  }
  if (bytes <= args_.host_memory.value_or(vsr::available_host_memory())) overlap_ = 1;
}

/// The host memory the run's passes need at once (RasterFileSource::run_host_bytes of every
/// input, with the run's overlap): what the summary prints.
void Job::count_host_bytes() {
  host_bytes_ = 0;
  if (file_) host_bytes_ = file_->run_host_bytes(plan_, per_band_op_, overlap_, gdal_cache_);
  for (const auto& src : calc_sources_) {
    host_bytes_ = vsr::detail::checked_add(
        host_bytes_, src->run_host_bytes(plan_, false, overlap_, gdal_cache_), "host memory");
  }
}

/// How the run goes through the executor: the op's band rule, placement, progress.
vsr::TileRunOptions Job::tile_options(Progress& progress) const {
  vsr::TileRunOptions o;
  o.name = "vsr-run";
  o.per_band = per_band_op_;
  o.mixed_nodata = !per_band_op_;
  o.overlap = overlap_;
  o.placement = placement_.residency;
  o.gpu.buffers_per_band = popts_.buffers_per_band;
  o.gpu.vram_budget = popts_.vram_budget;
  // The plan the summary prints; for a tiled plan, each tile's bands as its passes
  // (plan.bands_per_pass bands of one tile per pass).
  vsr::RasterPlan passes = plan_;
  if (tiled_) {
    passes.strategy = vsr::TilingStrategy::band_batches;
    passes.tile_shape.reset();
    passes.n_tiles = 0;
  }
  o.gpu.plan = passes;
  RunTimings* timings = &timings_;
  o.progress = [&progress](std::int64_t done, std::int64_t total) {
    progress.update(done, total, "tile");
  };
  o.stage = [&progress, timings](const vsr::TileInfo& where, vsr::TileStage s) {
    timings->stage(where, s);
    progress.stage(where, s);
  };
  o.stage_done = [timings](const vsr::TileInfo& where, vsr::TileStage s) {
    timings->stage_done(where, s);
  };
  return o;
}

/// The run's inputs: calc's and a pipeline's named files (a pipeline's chain built for them), or
/// the one input of the other steps (a file's header, or the sample).
void Job::open_inputs() {
  if (op_step_ == nullptr || op_step_->kind == StepKind::calc) {
    open_calc_inputs();
    if (op_step_ == nullptr) {
      warp_pipeline_inputs();
      build_pipeline();
    }
  } else {
    open_input();
    if (op_step_->kind == StepKind::table && args_.dry_run) {
      step_plan_ = op_step_->tabulate(args_, meta_, true).plan;
    }
  }
}

/// The run's step through the tile executor.
void Job::run_step() {
  if (op_step_ == nullptr) {
    run_pipeline();
  } else if (op_step_->kind == StepKind::calc) {
    run_calc();
  } else if (op_step_->kind == StepKind::table) {
    run_table();
  } else if (op_step_->op == Op::stats) {
    run_statistics();
  } else if (op_step_->op == Op::histogram) {
    run_histogram();
  } else {
    run_raster_op();
  }
}

/// A table step over the input (the library's own pass), written all or nothing to --output
/// or kept for print_results.
void Job::run_table() {
  TableWork work = op_step_->tabulate(args_, meta_, false);
  note_ = work.note;
  table_json_ = std::move(work.json);
  table_csv_ = std::move(work.csv);
  if (!args_.output.empty()) {
    work.write(args_.output, args_.overwrite, files_read(args_));
    output_label_ = printable(args_.output) + " (the table)";
  }
}

}  // namespace vsr_run
