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

namespace {

/// The deterministic sample: smooth ramps per band plus a hash-based texture, ~1% NaN. Made in
/// its raster's own buffer (one copy of the pixels in memory).
vsr::OwnedRasterArray make_sample(int bands, std::int64_t side) {
  // 10 m pixels in UTM 33N, so a written sample opens in any GIS.
  vsr::OwnedRasterArray r =
      vsr::OwnedRasterArray::allocate(vsr::Residency::host, vsr::DType::float32, bands, side, side,
                                      std::numeric_limits<double>::quiet_NaN(),
                                      vsr::Affine{10, 0, 500000, 0, -10, 5000000}, "EPSG:32633");
  auto* px = static_cast<float*>(r.mutable_host_data());
  std::size_t i = 0;
  for (int b = 0; b < bands; ++b) {
    for (std::int64_t y = 0; y < side; ++y) {
      for (std::int64_t x = 0; x < side; ++x, ++i) {
        std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761U;
        h ^= h >> 15;
        px[i] = (h % 100 == 0) ? std::numeric_limits<float>::quiet_NaN()
                               : static_cast<float>(100 * (b + 1)) +
                                     static_cast<float>((x + 2 * y) % 1000) * 0.5F +
                                     static_cast<float>(h % 64) * 0.25F;
      }
    }
  }
  return r;
}

/// Runs @p fn on @p piece where the ops run: on the device when @p where is (a host piece is
/// cloned there once, freed on return), else on the host.
template <class Fn>
auto on_compute(vsr::Residency where, const vsr::OwnedRasterArray& piece, Fn&& fn) {
  if (where != vsr::Residency::device || piece.residency() == vsr::Residency::device) {
    return fn(piece);
  }
  return fn(piece.clone_to(vsr::Residency::device));
}

/// The bytes of one pixel of @p t holding @p v (exactly, for 64-bit integers).
std::vector<std::byte> pixel_bytes(vsr::DType t, const vsr::NodataValue& v) {
  std::vector<std::byte> out(vsr::itemsize(t));
  if (!vsr::dtype_holds(t, v)) return out;
  const auto put = [&](auto x) { std::memcpy(out.data(), &x, sizeof x); };
  const double d = v.to_double();
  vsr::detail::visit_dtype(t, [&](auto type) {
    using T = decltype(type);
    if constexpr (std::is_same_v<T, std::uint64_t>) {
      put(v.as_uint64().value_or(0));
    } else if constexpr (std::is_same_v<T, std::int64_t>) {
      put(v.as_int64().value_or(0));
    } else {
      put(static_cast<T>(d));
    }
  });
  return out;
}

/// Whether the GDAL driver @p name (any case) is COG.
bool is_cog(const std::string& name) {
  return name.size() == 3 && std::tolower(static_cast<unsigned char>(name[0])) == 'c' &&
         std::tolower(static_cast<unsigned char>(name[1])) == 'o' &&
         std::tolower(static_cast<unsigned char>(name[2])) == 'g';
}

/// A 3 x 3 raster of @p bands of @p dtype whose every pixel is @p nodata (0 without one): no
/// valid value of it can collide with an output's nodata.
vsr::OwnedRasterArray nodata_tiny(vsr::DType dtype, int bands,
                                  const std::optional<vsr::NodataValue>& nodata) {
  vsr::OwnedRasterArray tiny =
      vsr::OwnedRasterArray::allocate(vsr::Residency::host, dtype, bands, 3, 3).with_nodata(nodata);
  std::vector<std::byte> pixel(vsr::itemsize(dtype));
  if (nodata) pixel = pixel_bytes(dtype, *nodata);
  auto* dst = static_cast<std::byte*>(tiny.mutable_host_data());
  for (std::size_t k = 0; k < tiny.byte_size(); k += pixel.size()) {
    std::copy(pixel.begin(), pixel.end(), dst + k);
  }
  return tiny;
}

/// The tiny rasters of nodata pixels of every calc source: its dtype, bands read and nodata.
std::vector<vsr::OwnedRasterArray> calc_tinies(
    const std::vector<std::unique_ptr<vsr::RasterFileSource>>& sources) {
  std::vector<vsr::OwnedRasterArray> tiny;
  for (const auto& src : sources) {
    tiny.push_back(nodata_tiny(src->metadata().dtype, static_cast<int>(src->bands().size()),
                               src->band_nodata().front()));
  }
  return tiny;
}

}  // namespace

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
    if (args_.op == Op::calc) {
      open_calc_inputs();
      enter("checking the output");
      check_calc_output();
    } else if (args_.op == Op::pipeline) {
      open_calc_inputs();
      build_pipeline();
      enter("checking the output");
      check_pipeline_output();
    } else {
      open_input();
      enter("checking the output");
      check_raster_output();
    }
    enter("planning");
    make_plan();
    enter("running " + args_.op_name);
    if (args_.dry_run) {
      print_dry_run();
      print_diagnostics();
      return 0;
    }
    if (args_.op == Op::pipeline) {
      run_pipeline();
    } else if (args_.op == Op::calc) {
      run_calc();
    } else if (args_.op == Op::stats) {
      run_statistics();
    } else if (args_.op == Op::histogram) {
      run_histogram();
    } else {
      run_raster_op();
    }
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

/// A raster output, tried before any pixel is read: a small file of the output's dtype, band
/// count and nodata written in the format, read back and removed (check_output_file). The dtype
/// and nodata are what the op makes of a tiny raster of the input's dtype and nodata.
void Job::check_raster_output() {
  if (args_.output.empty() || !args_.raster_output()) return;
  const Step& step = *op_step_;
  const vsr::OwnedRasterArray tiny =
      nodata_tiny(meta_.dtype, step.band_pair ? 2 : 1, band_nodata_.front());
  vsr::DType out_dtype = step.output_dtype(args_, meta_.dtype);
  if (args_.a_nodata && *args_.a_nodata && !vsr::dtype_holds(out_dtype, **args_.a_nodata)) {
    throw UsageError("-a_nodata: " + args_.a_nodata_text + " is not a value of " +
                     std::string(vsr::to_string(out_dtype)) + ", the output's type" +
                     (args_.ot ? "" : " (--ot chooses another)"));
  }
  if (step.check) step.check(args_, facts(true));
  std::optional<vsr::NodataValue> out_nodata;
  try {
    const vsr::OwnedRasterArray r = step.build(args_, facts(true)).fn(tiny);
    out_dtype = r.dtype();
    out_nodata = r.exact_nodata();
  } catch (const std::exception&) {
    // The op refuses the tiny raster (the run will say why): the trial goes without a nodata.
  }
  const int out_bands = step.band_pair ? 1 : static_cast<int>(bands_.size());
  try {
    vsr::check_output_file(args_.output, write_, out_dtype, out_bands, out_nodata, meta_.crs);
  } catch (const std::invalid_argument& e) {
    throw UsageError((args_.format.empty() ? "--output: " : "-of: ") + std::string(e.what()));
  }
}

/// What reaches the run's raster step: the input's dtype and selected bands' nodata (@p trial:
/// for the output's trial before any pixel is read).
StepFacts Job::facts(bool trial) const {
  StepFacts f;
  f.dtype = meta_.dtype;
  f.band_nodata = band_nodata_;
  f.mask_marker = mask_marker_;
  f.stats = &stats_;
  f.bands = &bands_;
  f.trial = trial;
  return f;
}

/// The raster: a file's header only (the plan is made before any pixel is read), or the sample;
/// the selected bands and their nodata.
void Job::open_input() {
  std::vector<std::optional<vsr::NodataValue>> file_nodata;  // of every band
  if (!from_file_) {
    // The sample is held whole, with (raster ops) a result as large at up to 8 bytes a pixel,
    // and a band and its result at a time beside them.
    const std::uint64_t side = static_cast<std::uint64_t>(args_.sample_size);
    const std::uint64_t band_px = side * side;  // <= 2^32
    const std::uint64_t sample = band_px * static_cast<std::uint64_t>(args_.sample_bands) * 4;
    const std::uint64_t work =
        args_.raster_output()
            ? band_px * static_cast<std::uint64_t>(args_.sample_bands) * 8 + 2 * band_px * 8
            : 2 * band_px * 8;
    char shape[160];
    std::snprintf(shape, sizeof shape, "the sample raster (%d band(s) of %lld x %lld float32, %s)",
                  args_.sample_bands, static_cast<long long>(side), static_cast<long long>(side),
                  vsr_cli::format_bytes(sample).c_str());
    check_host_memory(sample + work,
                      std::string(shape) +
                          (args_.raster_output() ? " with its result" : " with its working copies"),
                      "give a smaller --sample-size or fewer --bands");
    step_ = "making " + std::string(shape);
    sample_ = make_sample(args_.sample_bands, args_.sample_size);
    step_ = "reading the input";
    meta_ = sample_->metadata();
    file_nodata.assign(static_cast<std::size_t>(meta_.band_count), sample_->exact_nodata());
    input_label_ = "sample";
  } else {
    const vsr::RasterFileInfo file = vsr::read_raster_info(args_.input, open_);
    meta_ = file.metadata;
    file_nodata = file.band_nodata;
    input_label_ = printable(args_.input) + " (" + meta_.driver + ")";
  }
  const int file_bands = meta_.band_count;
  bands_ = args_.bands;
  if (bands_.empty()) {
    for (int b = 1; b <= file_bands; ++b) bands_.push_back(b);
  }
  for (const int b : bands_) {
    if (b > file_bands) {
      throw UsageError("-b " + std::to_string(b) + ": the input has " + std::to_string(file_bands) +
                       " band(s)");
    }
    band_nodata_.push_back(file_nodata[static_cast<std::size_t>(b - 1)]);
  }
  char shape[160];
  std::snprintf(shape, sizeof shape, "%d x %lld x %lld %s", file_bands,
                static_cast<long long>(meta_.height), static_cast<long long>(meta_.width),
                std::string(vsr::to_string(meta_.dtype)).c_str());
  input_label_ += std::string(", ") + shape;
  if (!args_.bands.empty()) {
    input_label_ += ", bands";
    for (const int b : bands_) input_label_.append(" ").append(std::to_string(b));
  }
  // What the reductions hold per selected band: statistics, or histograms (counts, edges) and
  // their text (a table line or JSON numbers per bin).
  const std::uint64_t nsel = bands_.size();
  if (args_.op == Op::histogram) {
    const std::uint64_t per_band = (static_cast<std::uint64_t>(args_.bins) + 1) * 80;
    check_host_memory(nsel * per_band,
                      "a histogram of " + std::to_string(args_.bins) + " bins for each of " +
                          std::to_string(nsel) + " band(s), with its text,",
                      "give fewer --bins or fewer bands (-b)");
  } else if (args_.op == Op::stats) {
    check_host_memory(nsel * 512, "the statistics of " + std::to_string(nsel) + " band(s)",
                      "select fewer bands (-b)");
  }
  bool mixed = false;
  for (const auto& nd : band_nodata_) mixed = mixed || nd != band_nodata_.front();
  if (mixed) {
    input_label_ += ", nodata per band:";
    for (const auto& nd : band_nodata_) input_label_.append(" ").append(nodata_text(nd));
  } else {
    input_label_ += ", nodata " + nodata_text(band_nodata_.front());
  }

  if (args_.op == Op::normalized_difference) {
    if (file_bands < 2) throw UsageError("--op " + args_.op_name + " needs 2 or more bands");
    nir_ = args_.nir.value_or(file_bands >= 4 ? 4 : 2);
    red_ = args_.red.value_or(file_bands >= 4 ? 3 : 1);
    if (nir_ < 1 || nir_ > file_bands || red_ < 1 || red_ > file_bands) {
      throw UsageError("--nir/--red must be band numbers in [1, " + std::to_string(file_bands) +
                       "]");
    }
    if (nir_ == red_) {
      throw UsageError("--nir and --red are the same band (" + std::to_string(nir_) + ")");
    }
    bands_ = {nir_, red_};
    band_nodata_ = {file_nodata[static_cast<std::size_t>(nir_ - 1)],
                    file_nodata[static_cast<std::size_t>(red_ - 1)]};
  }
  // The one input of the run: the selected bands of the file, or of the sample.
  if (from_file_) {
    auto file = std::make_unique<vsr::RasterFileSource>(args_.input, open_, bands_);
    file_ = file.get();
    source_ = std::move(file);
    // A band with a GDAL mask reads its masked pixels as its nodata (one chosen for it when it
    // has none): the run, its output's nodata (the rule of to_output) and the report go by it.
    const std::vector<bool>& masked = file_->masked_bands();
    if (std::find(masked.begin(), masked.end(), true) != masked.end()) {
      band_nodata_ = file_->band_nodata();
      input_label_ += "; GDAL mask on band(s)";
      for (std::size_t k = 0; k < masked.size(); ++k) {
        if (masked[k]) input_label_.append(" ").append(std::to_string(bands_[k]));
      }
      input_label_ += ": masked pixels read as nodata " + nodata_text(band_nodata_.front()) +
                      " (--ignore-mask reads them as they are)";
      // A value chosen only to mark them (no band's own nodata) stays out of a float output.
      const std::vector<bool>& marks = file_->nodata_marks_mask();
      for (std::size_t k = 0; k < marks.size(); ++k) {
        if (marks[k]) mask_marker_ = band_nodata_[k];
      }
      for (std::size_t k = 0; k < marks.size(); ++k) {
        if (!marks[k] && mask_marker_ && band_nodata_[k] == mask_marker_) mask_marker_.reset();
      }
    }
  } else {
    source_ = std::make_unique<vsr::RasterTileSource>(*sample_, bands_);
  }
}

/// The one plan of the run: printed in the summary, followed by the streamed runs, the tiled
/// executors and dispatch_per_band_gpu alike.
void Job::make_plan() {
  per_band_op_ = op_step_ ? op_step_->per_band : chain_->bands_independent();
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

/// A streamed reduction over the input: each tile handed to @p visit on the host (the visitor
/// moves what it computes to the device itself).
void Job::reduce(const std::string& what, const vsr::VisitTileSink::Visit& visit) {
  Progress pass(show_progress_, what);
  vsr::TileRunOptions o = tile_options(pass);
  o.placement = vsr::Residency::host;
  vsr::VisitTileSink sink(visit);
  vsr::run_tiles(
      *source_, [](const vsr::OwnedRasterArray& t) { return t; }, sink, plan_, o);
}

/// Statistics of tiles merged per band (merge_statistics: exact min/max/count, Chan's update).
void Job::run_statistics() {
  reduce(args_.op == Op::stats ? args_.op_name : args_.op_name + " (range pass)",
         [&](const vsr::OwnedRasterArray& tile, const vsr::TileInfo& where) {
           const std::vector<vsr::BandStatistics> s = on_compute(
               placement_.residency, tile, [](const auto& r) { return vsr::band_statistics(r); });
           for (int b = 0; b < where.band_count; ++b) {
             vsr::BandStatistics& band = stats_[static_cast<std::size_t>(where.first_band + b)];
             band = vsr::merge_statistics(band, s[static_cast<std::size_t>(b)]);
           }
         });
}

void Job::run_histogram() {
  const std::size_t nsel = bands_.size();
  hist_range_.resize(nsel);
  if (args_.range) {
    std::fill(hist_range_.begin(), hist_range_.end(), *args_.range);
  } else {
    // numpy's default range: each band's valid min and max (+-0.5 when they are equal).
    run_statistics();
    for (std::size_t b = 0; b < nsel; ++b) {
      const vsr::BandStatistics& m = stats_[b];
      if (m.count > 0 && (!std::isfinite(m.min) || !std::isfinite(m.max))) {
        throw std::runtime_error("histogram: band " + std::to_string(bands_[b]) +
                                 " holds infinite values (its valid range is [" +
                                 std::to_string(m.min) + ", " + std::to_string(m.max) +
                                 "]): give --range LO,HI");
      }
      hist_range_[b] = m.count == 0    ? Range{0, 1}
                       : m.min < m.max ? Range{m.min, m.max}
                                       : Range{m.min - 0.5, m.max + 0.5};
    }
  }
  hist_.assign(nsel, std::vector<std::int64_t>(static_cast<std::size_t>(args_.bins), 0));
  reduce(args_.op_name, [&](const vsr::OwnedRasterArray& tile, const vsr::TileInfo& where) {
    for (int b = 0; b < where.band_count; ++b) {
      const auto k = static_cast<std::size_t>(where.first_band + b);
      const auto h = on_compute(placement_.residency, tile.band(b), [&](const auto& r) {
        return vsr::histogram(r, args_.bins, hist_range_[k].lo, hist_range_[k].hi);
      });
      for (std::size_t i = 0; i < h[0].size(); ++i) hist_[k][i] += h[0][i];
    }
  });
}

/// The run's raster step built for its input; a step that needs the valid range first (rescale
/// without --in-range) gets it from a first streamed pass of statistics.
StepWork Job::raster_work() {
  const Step& step = *op_step_;
  if (step.range_pass && step.range_pass(args_)) run_statistics();
  return step.build(args_, facts(false));
}

/// The op from the source into the output file (all or nothing), or into nothing (a timing
/// run), tile by tile as the plan says (a whole plan is one tile).
void Job::run_raster_op() {
  StepWork work = raster_work();
  note_ = work.note;
  const RasterFn f = std::move(work.fn);
  const vsr::TileRunOptions o = tile_options(*progress_);
  if (args_.output.empty()) {
    vsr::VisitTileSink drop;
    vsr::run_tiles(*source_, f, drop, plan_, o);
  } else {
    vsr::RasterFileSink sink(args_.output, write_);
    if (file_) {
      sink.copy_from(*file_, op_step_->metadata);
      // The input closed before the output replaces it (in place: the same file).
      sink.before_commit([this] { file_->close(); });
    }
    vsr::run_tiles(*source_, f, sink, plan_, o);
  }
  if (!args_.output.empty()) {
    // COG only writes: its files are GeoTIFFs.
    const vsr::RasterFileInfo out = vsr::read_raster_info(
        args_.output, {.drivers = {is_cog(write_.driver) ? std::string("GTiff") : write_.driver}});
    std::string nd = nodata_text(out.band_nodata.front());
    for (const auto& v : out.band_nodata) {
      if (v != out.band_nodata.front()) nd = "per band";
    }
    output_label_ = printable(args_.output) + " (" +
                    std::string(vsr::to_string(out.metadata.dtype)) + ", " +
                    std::to_string(out.metadata.band_count) + " band(s), " + out.metadata.driver +
                    ", nodata " + nd + ")";
  }
}

/// calc's inputs: every file's header (one grid: size, geotransform, CRS), the expressions
/// compiled for their names and band counts (before any pixel is read), and one source per input
/// whose bands the expressions read, holding only those bands.
void Job::open_calc_inputs() {
  std::vector<vsr::CalcInputBands> names;
  std::vector<vsr::RasterFileInfo> infos;
  const auto label = [&](std::size_t k) {
    return args_.calc_inputs[k].first + "=" + printable(args_.calc_inputs[k].second);
  };
  for (std::size_t k = 0; k < args_.calc_inputs.size(); ++k) {
    const auto& [name, path] = args_.calc_inputs[k];
    infos.push_back(vsr::read_raster_info(path, open_));
    const vsr::RasterFileInfo& info = infos.back();
    names.push_back({name, info.metadata.band_count});
    if (k == 0) continue;
    const vsr::RasterFileInfo& first = infos.front();
    const vsr::RasterMetadata &a = first.metadata, &b = info.metadata;
    std::string differ;
    if (a.height != b.height || a.width != b.width) {
      differ = "their sizes differ (" + std::to_string(a.width) + " x " + std::to_string(a.height) +
               " vs " + std::to_string(b.width) + " x " + std::to_string(b.height) +
               ", width x height)";
    } else if (first.has_geotransform != info.has_geotransform ||
               (info.has_geotransform && !(a.affine == b.affine))) {
      const auto gt = [](const vsr::RasterFileInfo& i) {
        if (!i.has_geotransform) return std::string("none");
        std::string t;
        for (const double v : i.metadata.affine.to_gdal()) {
          if (!t.empty()) t += ',';
          t += json_number(v);
        }
        return t;
      };
      differ = "their geotransforms differ (" + gt(first) + " vs " + gt(info) + ")";
    } else if (a.crs != b.crs) {
      differ = "their CRS differ (" + std::string(a.crs.empty() ? "none" : "one") + " vs " +
               (b.crs.empty() ? "none" : "another") + ")";
    }
    if (!differ.empty()) {
      throw UsageError("calc: inputs " + label(0) + " and " + label(k) + " are not on one grid: " +
                       differ + "; resample one onto the other's grid first (e.g. with gdalwarp)");
    }
  }
  meta_ = infos.front().metadata;
  std::vector<vsr::CalcBandUse> every;  // pipeline: every band of every input
  if (args_.op == Op::pipeline) {
    for (const auto& n : names) {
      every.push_back({n.name, {}});
      for (int b = 1; b <= n.band_count; ++b) every.back().bands.push_back(b);
    }
  } else {
    try {
      calc_program_ = vsr::compile_calc(args_.calc, names);
    } catch (const std::invalid_argument& e) {
      throw UsageError::lines(e.what());  // the expression and a caret under the column
    }
  }
  calc_options_.output = calc_step().output_dtype(args_, meta_.dtype);
  calc_options_.compute_float32 = args_.compute_float32;
  calc_options_.propagate_nodata = args_.propagate_nodata;
  if (args_.a_nodata) {
    calc_options_.output_nodata = *args_.a_nodata;
    calc_options_.no_nodata = !*args_.a_nodata;
  }
  if (args_.a_nodata && *args_.a_nodata) {
    if (!vsr::dtype_holds(calc_options_.output, **args_.a_nodata)) {
      throw UsageError("-a_nodata: " + args_.a_nodata_text + " is not a value of " +
                       std::string(vsr::to_string(calc_options_.output)) + ", the output's type" +
                       (args_.ot ? "" : " (--ot chooses another)"));
    }
  }
  const std::vector<vsr::CalcBandUse>& use =
      args_.op == Op::pipeline ? every : calc_program_.bands_read();
  for (std::size_t k = 0; k < use.size(); ++k) {
    std::vector<int> bands = use[k].bands;
    // Expressions that read no band at all (constants) still run over the first input's grid.
    if (bands.empty() && k == 0 &&
        std::all_of(use.begin(), use.end(), [](const auto& u) { return u.bands.empty(); })) {
      bands = {1};
    }
    input_label_ += std::string(input_label_.empty() ? "" : "; ") + label(k) + " (" +
                    infos[k].metadata.driver + ", " + std::to_string(infos[k].metadata.band_count) +
                    " x " + std::to_string(meta_.height) + " x " + std::to_string(meta_.width) +
                    " " + std::string(vsr::to_string(infos[k].metadata.dtype)) + ")";
    if (bands.empty()) {
      input_label_ += ", not read";
      continue;
    }
    input_label_ += ", band(s)";
    for (const int b : bands) input_label_.append(" ").append(std::to_string(b));
    auto src = std::make_unique<vsr::RasterFileSource>(args_.calc_inputs[k].second, open_, bands);
    // Band math takes one nodata per input: the bands it reads of one input must agree.
    const std::vector<std::optional<vsr::NodataValue>> nd = src->band_nodata();
    for (std::size_t i = 1; i < nd.size(); ++i) {
      if (nd[i] != nd[0]) {
        throw UsageError("calc: input " + label(k) + ": bands " + std::to_string(bands[0]) +
                         " and " + std::to_string(bands[i]) + " have different nodata (" +
                         nodata_text(nd[0]) + " and " + nodata_text(nd[i]) +
                         "); band math takes one nodata per input");
      }
    }
    input_label_ += ", nodata " + nodata_text(nd[0]);
    band_nodata_.push_back(nd[0]);
    for (const int b : bands) bands_.push_back(b);
    calc_names_.push_back(use[k].name);
    const std::vector<bool>& marks = src->nodata_marks_mask();
    calc_marks_.push_back(!marks.empty() && marks.front());
    calc_sources_.push_back(std::move(src));
  }
}

/// calc's output, tried before any pixel is read: what calc makes of a tiny raster of every
/// input's dtype and nodata, written in the format (check_output_file).
void Job::check_calc_output() {
  if (args_.output.empty()) return;
  const std::vector<vsr::OwnedRasterArray> tiny = calc_tinies(calc_sources_);
  vsr::DType out_dtype = calc_options_.output;
  std::optional<vsr::NodataValue> out_nodata;
  try {
    const vsr::OwnedRasterArray r = calc_function()(tiny, vsr::TileInfo{});
    out_dtype = r.dtype();
    out_nodata = r.exact_nodata();
  } catch (const std::exception&) {
    // calc refuses the tiny rasters (the run will say why): the trial goes without a nodata.
  }
  try {
    vsr::check_output_file(args_.output, write_, out_dtype, static_cast<int>(args_.calc.size()),
                           out_nodata, meta_.crs);
  } catch (const std::invalid_argument& e) {
    throw UsageError((args_.format.empty() ? "--output: " : "-of: ") + std::string(e.what()));
  }
}

/// calc over one tile of every source read, each under its name with the bands it holds and
/// whether its nodata only marks masked pixels; -a_nodata is CalcOptions::output_nodata (none:
/// CalcOptions::no_nodata), so calc computes with the output's nodata from the start.
vsr::MultiTileOp Job::calc_function() const {
  std::vector<std::vector<int>> bands;
  for (const auto& src : calc_sources_) bands.push_back(src->bands());
  return [program = calc_program_, options = calc_options_, names = calc_names_,
          bands = std::move(bands), marks = calc_marks_](
             const std::vector<vsr::OwnedRasterArray>& tiles, const vsr::TileInfo&) {
    std::vector<vsr::CalcInput> inputs;
    for (std::size_t k = 0; k < tiles.size(); ++k) {
      inputs.push_back({names[k], tiles[k], bands[k], marks[k]});
    }
    return vsr::calc(program, inputs, options);
  };
}

/// calc from its sources into the output file (all or nothing), or into nothing, tile by tile on
/// the multi-source executor.
void Job::run_calc() {
  std::vector<vsr::TileSource*> sources;
  for (const auto& src : calc_sources_) sources.push_back(src.get());
  vsr::TileRunOptions o = tile_options(*progress_);
  o.mixed_nodata = true;  // each input's nodata travels with its own tiles
  const vsr::MultiTileOp f = calc_function();
  char buf[160];
  std::snprintf(buf, sizeof buf, "%zu expression(s) as %s, computed in %s%s", args_.calc.size(),
                std::string(vsr::to_string(calc_options_.output)).c_str(),
                calc_options_.compute_float32 ? "float32" : "float64",
                calc_options_.propagate_nodata ? "" : ", nodata not propagated");
  note_ = buf;
  if (args_.output.empty()) {
    vsr::VisitTileSink drop;
    vsr::run_tiles(sources, f, drop, plan_, o);
    return;
  }
  {
    vsr::RasterFileSink sink(args_.output, write_);
    sink.copy_from(*calc_sources_.front(), vsr::MetadataCopy::none);
    // The inputs closed before the output replaces one of them (in place: the same file).
    sink.before_commit([this] {
      for (const auto& src : calc_sources_) src->close();
    });
    vsr::run_tiles(sources, f, sink, plan_, o);
  }
  const vsr::RasterFileInfo out = vsr::read_raster_info(
      args_.output, {.drivers = {is_cog(write_.driver) ? std::string("GTiff") : write_.driver}});
  output_label_ = printable(args_.output) + " (" + std::string(vsr::to_string(out.metadata.dtype)) +
                  ", " + std::to_string(out.metadata.band_count) + " band(s), " +
                  out.metadata.driver + ", nodata " + nodata_text(out.band_nodata.front()) + ")";
}

/// The pipeline's chain: a calc step as the library's (its options as --op calc's), the other
/// steps as vsr-run's ops themselves (their options, --ot and output nodata rule), each made for
/// the dtype and nodata of what reaches it.
void Job::build_pipeline() {
  std::vector<vsr::CalcInputBands> inputs;
  for (std::size_t k = 0; k < calc_sources_.size(); ++k) {
    inputs.push_back({calc_names_[k], static_cast<int>(calc_sources_[k]->bands().size())});
  }
  try {
    chain_.emplace(inputs);  // refuses an input named X, the previous step's output
  } catch (const std::invalid_argument& e) {
    throw UsageError("pipeline: read: " + std::string(e.what()));
  }
  chain_->nodata_marks_mask(calc_marks_);
  // The first step reads the first input's tiles: a nodata that only marks its masked pixels
  // stays out of a float output there too.
  const std::optional<vsr::NodataValue> first_marker =
      calc_marks_.front() ? band_nodata_.front() : std::nullopt;
  for (std::size_t s = 0; s < args_.steps.size(); ++s) {
    const std::shared_ptr<const Arguments> step = args_.steps[s];
    try {
      if (step->op == Op::calc) {
        vsr::CalcOptions o;
        o.output = step->ot.value_or(vsr::DType::float32);
        o.compute_float32 = step->compute_float32;
        o.propagate_nodata = step->propagate_nodata;
        if (step->a_nodata) {
          o.output_nodata = *step->a_nodata;
          o.no_nodata = !*step->a_nodata;
          if (o.output_nodata && !vsr::dtype_holds(o.output, *o.output_nodata)) {
            throw UsageError("pipeline step " + std::to_string(s + 1) +
                             " (calc): -a_nodata: " + step->a_nodata_text + " is not a value of " +
                             std::string(vsr::to_string(o.output)) + ", the step's type");
          }
        }
        chain_->calc(step->calc, o);
      } else {
        // Built for what reaches it, tile by tile: the tile's dtype and nodata.
        const Step* table = find_step(step->op_name);
        chain_->step(
            step->op_name,
            [step, table,
             marker = s == 0 ? first_marker : std::nullopt](const vsr::OwnedRasterArray& t) {
              StepFacts f;
              f.dtype = t.dtype();
              f.band_nodata.assign(static_cast<std::size_t>(t.band_count()), t.exact_nodata());
              f.mask_marker = marker;
              return table->build(*step, f).fn(t);
            },
            table->halo, table->per_band);
      }
    } catch (const std::invalid_argument& e) {
      throw UsageError::lines(e.what());  // names the step; a bad expression with its caret
    }
  }
}

/// The pipeline's output, tried before any pixel is read: what the chain makes of a tiny raster
/// of every input's dtype, bands and nodata, written in the format.
void Job::check_pipeline_output() {
  if (args_.terminal) return;  // printed, or JSON: its path was checked with the options
  const std::vector<vsr::OwnedRasterArray> tiny = calc_tinies(calc_sources_);
  vsr::DType out_dtype = vsr::DType::float32;
  int out_bands = chain_->band_count().value_or(1);
  std::optional<vsr::NodataValue> out_nodata;
  try {
    const vsr::OwnedRasterArray r = chain_->apply(tiny);
    out_dtype = r.dtype();
    out_bands = r.band_count();
    out_nodata = r.exact_nodata();
  } catch (const std::exception&) {
    // A step refuses the tiny rasters (the run will say why): the trial goes without a nodata.
  }
  try {
    vsr::check_output_file(args_.output, write_, out_dtype, out_bands, out_nodata, meta_.crs);
  } catch (const std::invalid_argument& e) {
    throw UsageError((args_.format.empty() ? "--output: " : "-of: ") + std::string(e.what()));
  }
}

/// --dry-run: the plan (tiles, halo, steps) and nothing read but the headers.
void Job::print_dry_run() const {
  std::string steps;
  for (const std::string& n : chain_->step_names()) steps += (steps.empty() ? "" : " ! ") + n;
  std::printf("vsr-run pipeline (dry run: no pixel read, nothing written)\n");
  std::printf("  input       %s\n", input_label_.c_str());
  const char* last = !args_.terminal               ? "write"
                     : args_.terminal == Op::stats ? "stats"
                                                   : "histogram";
  std::printf("  steps       read ! %s ! %s\n", steps.c_str(), last);
  std::printf("  halo        %d (the sum of the steps')\n", chain_->halo());
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

/// A terminal stats or histogram: the chain's output reduced tile by tile, never written. Its
/// bands are the chain's output bands (1-based), each with its pass's nodata; histograms use
/// --range (a pipeline has no first pass to find one).
void Job::reduce_pipeline(const std::vector<vsr::TileSource*>& sources,
                          const vsr::TileRunOptions& o) {
  bands_.clear();
  band_nodata_.clear();
  stats_.clear();
  hist_.clear();
  const auto band_slot = [&](int k, const vsr::OwnedRasterArray& result) {
    while (static_cast<int>(bands_.size()) <= k) {
      bands_.push_back(static_cast<int>(bands_.size()) + 1);
      band_nodata_.push_back(result.exact_nodata());
      stats_.emplace_back();
      hist_.emplace_back(static_cast<std::size_t>(args_.bins), 0);
    }
    return static_cast<std::size_t>(k);
  };
  vsr::VisitTileSink sink([&](const vsr::OwnedRasterArray& result, const vsr::TileInfo& where) {
    const vsr::OwnedRasterArray host =
        result.residency() == vsr::Residency::host ? result : result.clone_to(vsr::Residency::host);
    // The result covers the read window, halo included: only the tile's own pixels count.
    const vsr::RasterWindow own{where.window.col_off - where.read.col_off,
                                where.window.row_off - where.read.row_off, where.window.width,
                                where.window.height};
    const bool whole = own.col_off == 0 && own.row_off == 0 && own.width == host.width() &&
                       own.height == host.height();
    const vsr::OwnedRasterArray tile = whole ? host : vsr::copy_window(host, own);
    meta_.dtype = tile.dtype();
    const std::vector<vsr::BandStatistics> s = vsr::band_statistics(tile);
    for (int b = 0; b < tile.band_count(); ++b) {
      const std::size_t k = band_slot(where.output_band + b, tile);
      if (args_.terminal == Op::stats) {
        stats_[k] = vsr::merge_statistics(stats_[k], s[static_cast<std::size_t>(b)]);
      } else {
        const auto h = vsr::histogram(tile.band(b), args_.bins, args_.range->lo, args_.range->hi);
        for (std::size_t i = 0; i < h[0].size(); ++i) hist_[k][i] += h[0][i];
      }
    }
  });
  vsr::run_tiles(sources, chain_->tile_op(), sink, plan_, o);
  hist_range_.assign(bands_.size(), args_.range.value_or(Range{0, 1}));
}

/// The chain from its sources into the output file (all or nothing), each tile read once with
/// the steps' halos summed.
void Job::run_pipeline() {
  std::vector<vsr::TileSource*> sources;
  for (const auto& src : calc_sources_) sources.push_back(src.get());
  vsr::TileRunOptions o = tile_options(*progress_);
  o.mixed_nodata = true;  // each input's nodata travels with its own tiles
  std::string steps;
  for (const std::string& n : chain_->step_names()) steps += (steps.empty() ? "" : " ! ") + n;
  note_ = steps + ", halo " + std::to_string(chain_->halo());
  if (args_.terminal) {
    reduce_pipeline(sources, o);
    return;
  }
  {
    vsr::RasterFileSink sink(args_.output, write_);
    sink.copy_from(*calc_sources_.front(), vsr::MetadataCopy::none);
    sink.before_commit([this] {
      for (const auto& src : calc_sources_) src->close();
    });
    // Each tile's result says where its steps ran (--diagnostics).
    vsr::MultiTileOp op = [this, chain = chain_->tile_op()](const auto& tiles, const auto& where) {
      vsr::OwnedRasterArray r = chain(tiles, where);
      if (args_.diagnostics) timings_.note_steps(r);
      return r;
    };
    vsr::run_tiles(sources, op, sink, plan_, o);
  }
  const vsr::RasterFileInfo out = vsr::read_raster_info(
      args_.output, {.drivers = {is_cog(write_.driver) ? std::string("GTiff") : write_.driver}});
  output_label_ = printable(args_.output) + " (" + std::string(vsr::to_string(out.metadata.dtype)) +
                  ", " + std::to_string(out.metadata.band_count) + " band(s), " +
                  out.metadata.driver + ", nodata " + nodata_text(out.band_nodata.front()) + ")";
}

}  // namespace vsr_run
