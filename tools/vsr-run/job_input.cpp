// SPDX-License-Identifier: Apache-2.0
// A vsr-run's inputs (job.hpp): a file's header or the generated sample, the selected bands and
// their nodata; calc's and a pipeline's named inputs on one grid, and what runs over them.
#include "checked_math.hpp"
#include "cli.hpp"
#include "format.hpp"
#include "job.hpp"
#include "steps.hpp"

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/io.hpp>
#include <vibespatial/raster/ops.hpp>
#include <vibespatial/raster/pipeline.hpp>
#include <vibespatial/raster/tiles.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
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

}  // namespace

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
  if (op_step_->kind == StepKind::grid) regrid_input();
}

/// A grid step (warp): the run reads the step's source, which reads the input's; the run's
/// metadata and nodata are the output grid's from here on.
void Job::regrid_input() {
  GridWork work = op_step_->regrid(args_, *source_, file_ == nullptr || file_->has_geotransform(),
                                   args_.dry_run);
  input_source_ = std::move(source_);
  source_ = std::move(work.source);
  step_plan_ = std::move(work.plan);
  grid_note_ = std::move(work.note);
  const std::string driver = meta_.driver;
  meta_ = source_->metadata();
  meta_.driver = driver;
  band_nodata_ = source_->band_nodata();
  mask_marker_.reset();
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

/// A pipeline whose first step is a grid step (warp): each input read seen on the step's grid
/// (the inputs are on one grid, so the step makes the same grid of each), the run's metadata
/// and nodata the grid's from here on.
void Job::warp_pipeline_inputs() {
  const Arguments& first = *args_.steps.front();
  const Step& step = *find_step(first.op_name);
  if (step.kind != StepKind::grid) return;
  band_nodata_.clear();
  for (std::size_t k = 0; k < calc_sources_.size(); ++k) {
    vsr::RasterFileSource& src = *calc_sources_[k];
    GridWork work = step.regrid(first, src, src.has_geotransform(), args_.dry_run);
    const vsr::RasterMetadata m = work.source->metadata();
    if (k == 0) {
      step_plan_ = std::move(work.plan);
      grid_note_ = std::move(work.note);
      const std::string driver = meta_.driver;
      meta_ = m;
      meta_.driver = driver;
    } else if (m.width != meta_.width || m.height != meta_.height || !(m.affine == meta_.affine)) {
      throw std::logic_error("vsr-run: the inputs of one grid were warped onto different grids");
    }
    band_nodata_.push_back(work.source->band_nodata().front());
    warped_.push_back(std::move(work.source));
  }
  // A warped input's nodata is the warp's output nodata, never only a mask's marker.
  calc_marks_.assign(calc_marks_.size(), false);
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
    if (find_step(step->op_name)->kind == StepKind::grid) continue;  // the sources' (warped_)
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

}  // namespace vsr_run
