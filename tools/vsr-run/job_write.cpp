// SPDX-License-Identifier: Apache-2.0
// A vsr-run's output (job.hpp): tried before any pixel is read, then written through the one
// write path, for the raster steps, calc and a pipeline alike.
#include "cli.hpp"
#include "dtype_visit.hpp"
#include "job.hpp"
#include "steps.hpp"

#include <vibespatial/raster/io.hpp>
#include <vibespatial/raster/tiles.hpp>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace vsr_run {

using vsr_cli::printable;
using vsr_cli::UsageError;

namespace {

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

/// The tiny rasters of nodata pixels of every calc source: its dtype, bands read and @p nodata
/// (the run's for each source: a warped source's is the warp's output nodata).
std::vector<vsr::OwnedRasterArray> calc_tinies(
    const std::vector<std::unique_ptr<vsr::RasterFileSource>>& sources,
    const std::vector<std::optional<vsr::NodataValue>>& nodata) {
  std::vector<vsr::OwnedRasterArray> tiny;
  for (std::size_t k = 0; k < sources.size(); ++k) {
    tiny.push_back(nodata_tiny(sources[k]->metadata().dtype,
                               static_cast<int>(sources[k]->bands().size()), nodata[k]));
  }
  return tiny;
}

}  // namespace

bool is_cog(const std::string& name) {
  return name.size() == 3 && std::tolower(static_cast<unsigned char>(name[0])) == 'c' &&
         std::tolower(static_cast<unsigned char>(name[1])) == 'o' &&
         std::tolower(static_cast<unsigned char>(name[2])) == 'g';
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

/// A raster output, tried before any pixel is read: what the run makes of a tiny raster of each
/// input's dtype and nodata (3 x 3 pixels, all nodata), written in the format, read back and
/// removed (check_output_file). A step that refuses the tiny raster (the run will say why) is
/// tried without a nodata.
void Job::check_output_trial() {
  if (args_.output.empty() || !args_.raster_output()) return;
  vsr::DType dtype = vsr::DType::float32;
  int bands = 1;
  bool bands_of_result = false;
  std::function<vsr::OwnedRasterArray()> made;
  std::vector<vsr::OwnedRasterArray> tinies;
  if (op_step_ == nullptr) {
    tinies = calc_tinies(calc_sources_, band_nodata_);
    bands = chain_->band_count().value_or(1);
    bands_of_result = true;
    made = [&] { return chain_->apply(tinies); };
  } else if (op_step_->kind == StepKind::calc) {
    tinies = calc_tinies(calc_sources_, band_nodata_);
    dtype = calc_options_.output;
    bands = static_cast<int>(args_.calc.size());
    made = [&] { return calc_function()(tinies, vsr::TileInfo{}); };
  } else {
    const Step& step = *op_step_;
    tinies.push_back(nodata_tiny(meta_.dtype, step.band_pair ? 2 : 1, band_nodata_.front()));
    dtype = step.output_dtype(args_, meta_.dtype);
    if (args_.a_nodata && *args_.a_nodata && !vsr::dtype_holds(dtype, **args_.a_nodata)) {
      throw UsageError("-a_nodata: " + args_.a_nodata_text + " is not a value of " +
                       std::string(vsr::to_string(dtype)) + ", the output's type" +
                       (args_.ot ? "" : " (--ot chooses another)"));
    }
    if (step.check) step.check(args_, facts(true));
    bands = step.band_pair ? 1 : static_cast<int>(bands_.size());
    made = [&] { return step.build(args_, facts(true)).fn(tinies.front()); };
  }
  std::optional<vsr::NodataValue> nodata;
  try {
    const vsr::OwnedRasterArray r = made();
    dtype = r.dtype();
    if (bands_of_result) bands = r.band_count();
    nodata = r.exact_nodata();
  } catch (const std::exception&) {
    // The step refuses the tiny raster (the run will say why): the trial goes without a nodata.
  }
  try {
    vsr::check_output_file(args_.output, write_, dtype, bands, nodata, meta_.crs);
  } catch (const std::invalid_argument& e) {
    throw UsageError((args_.format.empty() ? "--output: " : "-of: ") + std::string(e.what()));
  }
}

/// The run's one write path: the tiles @p run hands its sink go into the output file (all or
/// nothing; with @p from's metadata as @p copy says, and every input closed before the output
/// replaces one of them: in place, the same file), which is then read back for the summary; or
/// into nothing without --output (a timing run).
void Job::write_raster(vsr::RasterFileSource* from, vsr::MetadataCopy copy,
                       const std::function<void(vsr::TileSink&)>& run) {
  if (args_.output.empty()) {
    vsr::VisitTileSink drop;
    run(drop);
    return;
  }
  {
    vsr::RasterFileSink sink(args_.output, write_);
    if (from != nullptr) {
      sink.copy_from(*from, copy);
      sink.before_commit([this] {
        if (file_) file_->close();
        for (const auto& src : calc_sources_) src->close();
      });
    }
    run(sink);
  }
  // COG only writes: its files are GeoTIFFs.
  const vsr::RasterFileInfo out = vsr::read_raster_info(
      args_.output, {.drivers = {is_cog(write_.driver) ? std::string("GTiff") : write_.driver}});
  std::string nd = nodata_text(out.band_nodata.front());
  for (const auto& v : out.band_nodata) {
    if (v != out.band_nodata.front()) nd = "per band";
  }
  output_label_ = printable(args_.output) + " (" + std::string(vsr::to_string(out.metadata.dtype)) +
                  ", " + std::to_string(out.metadata.band_count) + " band(s), " +
                  out.metadata.driver + ", nodata " + nd + ")";
}

/// The run's raster step built for its input; a step that needs the valid range first (rescale
/// without --in-range) gets it from a first streamed pass of statistics.
StepWork Job::raster_work() {
  const Step& step = *op_step_;
  if (step.range_pass && step.range_pass(args_)) run_statistics();
  return step.build(args_, facts(false));
}

/// A raster step from the source, tile by tile as the plan says (a whole plan is one tile).
void Job::run_raster_op() {
  const StepWork work = raster_work();
  note_ = grid_note_.empty() || work.note.empty() ? grid_note_ + work.note
                                                  : grid_note_ + "; " + work.note;
  const vsr::TileRunOptions o = tile_options(*progress_);
  write_raster(file_, op_step_->metadata,
               [&](vsr::TileSink& sink) { vsr::run_tiles(*source_, work.fn, sink, plan_, o); });
}

/// @p op over a tile of every calc source at once, on the multi-source executor (each input's
/// nodata travels with its own tiles).
void Job::run_sources(const vsr::MultiTileOp& op) {
  std::vector<vsr::TileSource*> sources;
  for (const auto& src : calc_sources_) sources.push_back(src.get());
  if (!warped_.empty()) {
    sources.clear();
    for (const auto& src : warped_) sources.push_back(src.get());
  }
  vsr::TileRunOptions o = tile_options(*progress_);
  o.mixed_nodata = true;
  if (args_.terminal) {
    reduce_pipeline(sources, o);
    return;
  }
  write_raster(calc_sources_.front().get(), vsr::MetadataCopy::none,
               [&](vsr::TileSink& sink) { vsr::run_tiles(sources, op, sink, plan_, o); });
}

/// calc over a tile of every input read, one output band per expression.
void Job::run_calc() {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%zu expression(s) as %s, computed in %s%s", args_.calc.size(),
                std::string(vsr::to_string(calc_options_.output)).c_str(),
                calc_options_.compute_float32 ? "float32" : "float64",
                calc_options_.propagate_nodata ? "" : ", nodata not propagated");
  note_ = buf;
  run_sources(calc_function());
}

std::string Job::chain_text() const {
  std::string steps = warped_.empty() ? "" : args_.steps.front()->op_name;
  for (const std::string& n : chain_->step_names()) steps += (steps.empty() ? "" : " ! ") + n;
  return steps;
}

/// The chain over a tile of every input, each tile read once with the steps' halos summed.
void Job::run_pipeline() {
  note_ = chain_text() + ", halo " + std::to_string(chain_->halo());
  if (!grid_note_.empty()) note_ += "; warp: " + grid_note_;
  // Each tile's result says where its steps ran (--diagnostics).
  run_sources([this, chain = chain_->tile_op()](const auto& tiles, const auto& where) {
    vsr::OwnedRasterArray r = chain(tiles, where);
    if (args_.diagnostics) timings_.note_steps(r);
    return r;
  });
}

}  // namespace vsr_run
