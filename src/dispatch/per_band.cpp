// SPDX-License-Identifier: Apache-2.0
// Per-band executors: host bands on a small thread pool, device bands in budgeted batches.
#include "common/checked_math.hpp"
#include "common/expects.hpp"
#include "dispatch/gpu_resources.hpp"
#include "driver/cuda_driver.hpp"

#include <vibespatial/raster/diagnostics.hpp>
#include <vibespatial/raster/dispatch.hpp>
#include <vibespatial/raster/errors.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace vibespatial::raster {

using detail::checked_mul;

namespace {

using Clock = std::chrono::steady_clock;

/// Appends the runtime event of a per-band dispatch to @p result's log: "<who> <path>
/// elapsed=<s>s". Never throws (a log that cannot grow loses the event, not the result).
void record_dispatch(const OwnedRasterArray& result, const char* who, const std::string& path,
                     Clock::time_point start) noexcept {
  try {
    RasterDiagnosticEvent e;
    e.kind = RasterDiagnosticKind::runtime;
    e.elapsed_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    char elapsed[32];
    std::snprintf(elapsed, sizeof elapsed, "%.4f", e.elapsed_seconds);
    e.detail = std::string(who) + " " + path + " elapsed=" + elapsed + "s";
    e.residency = result.residency();
    result.diagnostics()->record(std::move(e));
  } catch (...) {
  }
}

/// "bands=B shape=(H, W)" of @p raster.
std::string bands_text(const OwnedRasterArray& raster) {
  // Appended piece by piece: GCC 12's -Wrestrict misfires on "..." + std::to_string(...) at -O3.
  std::string t("bands=");
  t += std::to_string(raster.band_count());
  t += " shape=(";
  t += std::to_string(raster.height());
  t += ", ";
  t += std::to_string(raster.width());
  t += ')';
  return t;
}

}  // namespace

OwnedRasterArray dispatch_per_band_cpu(const OwnedRasterArray& raster, const BandOp& op) {
  VSR_EXPECTS(op, "dispatch_per_band_cpu: op is empty");
  const Clock::time_point start = Clock::now();
  if (raster.band_count() == 1) {
    OwnedRasterArray result = op(raster);
    record_dispatch(result, "dispatch_per_band_cpu", "single-band passthrough", start);
    return result;
  }

  // The CPU path works on host views; a device raster is copied, never moved (it is const).
  std::optional<OwnedRasterArray> host_copy;
  const OwnedRasterArray* input = &raster;
  if (raster.residency() == Residency::device) {
    host_copy = OwnedRasterArray::allocate(Residency::host, raster.dtype(), raster.band_count(),
                                           raster.height(), raster.width(), raster.nodata(),
                                           raster.affine(), raster.crs());
    raster.copy_to_host(host_copy->mutable_host_data());
    input = &*host_copy;
  }

  const int bands = raster.band_count();
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const int workers = static_cast<int>(std::min<unsigned>({static_cast<unsigned>(bands), hw, 8u}));

  std::vector<std::optional<OwnedRasterArray>> results(static_cast<std::size_t>(bands));
  std::atomic<int> next{0};
  std::atomic<bool> stop{false};
  std::mutex error_mutex;
  std::exception_ptr error;

  auto work = [&] {
    for (;;) {
      if (stop.load(std::memory_order_acquire)) return;
      const int i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= bands) return;
      try {
        results[static_cast<std::size_t>(i)].emplace(op(input->band(i)));
      } catch (...) {
        std::lock_guard lock(error_mutex);
        if (!error) error = std::current_exception();
        stop.store(true, std::memory_order_release);
        return;
      }
    }
  };

  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(workers - 1));
  try {
    for (int t = 1; t < workers; ++t) threads.emplace_back(work);
  } catch (...) {
    // Could not start every worker: run with those that did start.
  }
  work();
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);

  std::vector<OwnedRasterArray> stacked;
  stacked.reserve(results.size());
  for (auto& r : results) stacked.push_back(std::move(*r));
  OwnedRasterArray out = OwnedRasterArray::from_band_stack(stacked, raster);
  record_dispatch(out, "dispatch_per_band_cpu",
                  bands_text(raster) + " threads=" + std::to_string(workers), start);
  return out;
}

namespace {

/// One call of dispatch_per_band_gpu: exactly one of `stream_op` and `band_op` is set.
class GpuDispatch {
 public:
  GpuDispatch(const OwnedRasterArray& raster, const StreamBandOp* stream_op, const BandOp* band_op,
              const GpuDispatchOptions& options)
      : raster_(raster), sop_(stream_op), bop_(band_op), o_(options) {}
  // A BandOp's work runs on the legacy stream (compute_stream_ null), which the pipeline's lease
  // does not wait for: when an op throws, result copies queued there may still read results_ or
  // write out_, so the legacy stream is waited for before any member goes.
  ~GpuDispatch() {
    if (!pipeline_ || compute_stream_ != nullptr) return;
    try {
      detail::ScopedDeviceContext scope((**pipeline_).device);
      (void)api_->cuStreamSynchronize(nullptr);
    } catch (...) {
      // A failing driver: the lease's own waits decide what happens to the pipeline.
    }
  }
  GpuDispatch(const GpuDispatch&) = delete;
  GpuDispatch& operator=(const GpuDispatch&) = delete;

  OwnedRasterArray run(GpuDispatchReport* report);
  /// Pinned bytes this call leased (what the idle pool may keep afterwards).
  std::uint64_t pinned_bytes() const { return pinned_bytes_; }

 private:
  void plan();
  void stage(int k);
  void compute(int k);
  void drain(int k);
  void take_result(const OwnedRasterArray& result, int band, int slot);
  void compute_after_legacy();
  [[noreturn]] void fail_tiled(const RasterPlan& plan) const;

  const OwnedRasterArray& raster_;
  const StreamBandOp* sop_;
  const BandOp* bop_;
  GpuDispatchOptions o_;

  const detail::DriverApi* api_ = nullptr;
  int bands_ = 0;
  std::int64_t height_ = 0, width_ = 0;
  std::uint64_t budget_ = 0;
  std::uint64_t band_bytes_ = 0;
  RasterPlan plan_;
  int per_batch_ = 1, n_batches_ = 0, depth_ = 1;
  std::uint64_t in_bytes_ = 0, pass_bytes_ = 0;
  bool input_on_device_ = false;
  const unsigned char* host_in_ = nullptr;
  CUstream compute_stream_ = nullptr;  // the pipeline's, or the legacy stream for a BandOp
  int staging_threads_used_ = 0;
  std::uint64_t pinned_bytes_ = 0;

  // Declared before the pipeline so that they are destroyed after it: the lease waits for both
  // streams, so no queued copy or op still uses a buffer when it goes back to the pool.
  std::array<std::optional<OwnedRasterArray>, 2> slot_input_;  ///< device input of each slot
  std::array<detail::PinnedBuffer, 2> staging_in_;             ///< pinned input of each slot
  std::array<detail::PinnedBuffer, 2> staging_out_;            ///< pinned output of each slot
  std::array<std::vector<OwnedRasterArray>, 2> results_;       ///< held until drained
  std::array<std::vector<int>, 2> via_pinned_;                 ///< bands whose output is pinned
  std::array<bool, 2> copied_recorded_{}, consumed_recorded_{};
  std::optional<OwnedRasterArray> out_;
  std::optional<double> out_nodata_;
  std::uint64_t out_band_bytes_ = 0;
  bool out_on_device_ = false;
  std::optional<detail::PipelineLease> pipeline_;
};

void GpuDispatch::fail_tiled(const RasterPlan& plan) const {
  throw std::runtime_error(
      "dispatch_per_band_gpu: one band of " + std::to_string(height_) + " x " +
      std::to_string(width_) + " " + std::string(to_string(raster_.dtype())) + " with " +
      std::to_string(o_.buffers_per_band) + " buffers and " + std::to_string(o_.scratch_bytes) +
      " scratch bytes does not fit the VRAM budget of " + std::to_string(budget_) +
      " bytes (plan: tiled, " + std::to_string(plan.n_tiles) + " tiles of " +
      std::to_string(plan.tile_shape ? plan.tile_shape->first : 0) + " x " +
      std::to_string(plan.tile_shape ? plan.tile_shape->second : 0) +
      "); use dispatch_tiled or dispatch_tiled_halo with this plan");
}

void GpuDispatch::plan() {
  if (o_.plan) {
    // The caller's plan, as it decided it: no second planning from the budget.
    const RasterPlan& given = *o_.plan;
    if (given.strategy == TilingStrategy::tiled) fail_tiled(given);
    VSR_EXPECTS(given.bands_per_pass >= 1,
                "dispatch_per_band_gpu: the given plan's bands_per_pass must be >= 1, not " +
                    std::to_string(given.bands_per_pass));
    plan_ = given;
    per_batch_ = std::min(given.bands_per_pass, bands_);
    n_batches_ = (bands_ + per_batch_ - 1) / per_batch_;
    // Two passes in flight only where the caller's budget holds both.
    const std::uint64_t usable = usable_vram_budget(budget_);
    depth_ =
        o_.pipeline_depth == 2 && n_batches_ >= 2 && given.estimated_vram_per_tile <= usable / 2
            ? 2
            : 1;
    in_bytes_ = band_bytes_ * static_cast<std::uint64_t>(per_batch_);
    pass_bytes_ = given.estimated_vram_per_tile;
    return;
  }
  PlanOptions options;
  options.band_count = bands_;
  options.buffers_per_band = o_.buffers_per_band;
  options.scratch_bytes = o_.scratch_bytes;
  options.per_band = true;
  options.vram_budget = budget_;
  const RasterPlan full = analyze_raster_plan(height_, width_, raster_.dtype(), options);
  if (full.strategy == TilingStrategy::tiled) fail_tiled(full);
  plan_ = full;
  depth_ = 1;
  if (o_.pipeline_depth == 2) {
    // Double buffering holds two passes at once (the batch computing and the one being copied,
    // or for a device-resident input the one whose results are being drained): each pass is
    // planned with half the budget, so both fit within the planner's usable share.
    options.vram_budget = budget_ / 2;
    const RasterPlan half = analyze_raster_plan(height_, width_, raster_.dtype(), options);
    if (half.strategy != TilingStrategy::tiled && half.bands_per_pass < bands_) {
      plan_ = half;
      depth_ = 2;
    }
  }
  per_batch_ = std::clamp(plan_.bands_per_pass, 1, bands_);
  n_batches_ = (bands_ + per_batch_ - 1) / per_batch_;
  if (n_batches_ < 2) depth_ = 1;
  in_bytes_ = band_bytes_ * static_cast<std::uint64_t>(per_batch_);
  pass_bytes_ = plan_.estimated_vram_per_tile;
}

// The compute stream's later work waits for everything queued on the legacy default stream so
// far: pool memory handed out for the legacy stream (rasters the op allocates, the output) may
// have been freed there with work still queued, and a non-blocking stream does not wait for it.
void GpuDispatch::compute_after_legacy() {
  if (compute_stream_ == nullptr) return;
  const detail::Pipeline& p = **pipeline_;
  VSR_CU_TRY(api_->cuEventRecord(p.legacy_mark, nullptr));
  VSR_CU_TRY(api_->cuStreamWaitEvent(compute_stream_, p.legacy_mark, 0));
}

// Starts the host-to-device copy of batch k into its slot: the host copies the bands into the
// slot's pinned buffer (several threads for large batches) once the slot's previous copy has
// read it, then the copy stream, after the compute that last read the slot's device buffer,
// copies it to the device.
void GpuDispatch::stage(int k) {
  const detail::Pipeline& p = **pipeline_;
  const int s = k % depth_;
  const int b0 = k * per_batch_;
  const int nb = std::min(per_batch_, bands_ - b0);
  const std::size_t bytes = static_cast<std::size_t>(band_bytes_) * static_cast<std::size_t>(nb);
  if (copied_recorded_[s]) VSR_CU_TRY(api_->cuEventSynchronize(p.copied[s]));
  const int threads =
      o_.staging_threads > 0 ? o_.staging_threads : detail::staging_copy_threads(bytes);
  staging_threads_used_ = std::max(
      staging_threads_used_,
      detail::parallel_copy(staging_in_[s].data(),
                            host_in_ + static_cast<std::size_t>(band_bytes_) * b0, bytes, threads));
  if (consumed_recorded_[s]) VSR_CU_TRY(api_->cuStreamWaitEvent(p.copy, p.consumed[s], 0));
  void* dst = slot_input_[s]->device_data();
  VSR_CU_TRY(
      api_->cuMemcpyHtoDAsync(detail::to_device_ptr(dst), staging_in_[s].data(), bytes, p.copy));
  VSR_CU_TRY(api_->cuEventRecord(p.copied[s], p.copy));
  copied_recorded_[s] = true;
  detail::notify_dispatch_step(
      {detail::DispatchStep::staged, k, p.copy, compute_stream_, p.copied[s], dst});
}

// Queues batch k's work: the op on each band (on the compute stream after the batch's copy, for
// a StreamBandOp; for a BandOp after the host saw the copy complete), and each result's copy into
// the output; then marks the slot consumed once that work is done.
void GpuDispatch::compute(int k) {
  const detail::Pipeline& p = **pipeline_;
  const int s = k % depth_;
  const int b0 = k * per_batch_;
  const int nb = std::min(per_batch_, bands_ - b0);
  if (!input_on_device_) {
    if (sop_ != nullptr) {
      VSR_CU_TRY(api_->cuStreamWaitEvent(compute_stream_, p.copied[s], 0));
    } else {
      VSR_CU_TRY(api_->cuEventSynchronize(p.copied[s]));
    }
  }
  compute_after_legacy();
  for (int j = 0; j < nb; ++j) {
    const OwnedRasterArray view = input_on_device_ ? raster_.band(b0 + j) : slot_input_[s]->band(j);
    OwnedRasterArray result = sop_ != nullptr ? (*sop_)(view, compute_stream_) : (*bop_)(view);
    take_result(result, b0 + j, s);
    results_[s].push_back(std::move(result));
  }
  VSR_CU_TRY(api_->cuEventRecord(p.consumed[s], compute_stream_));
  consumed_recorded_[s] = true;
  detail::notify_dispatch_step({detail::DispatchStep::computed, k, p.copy, compute_stream_,
                                p.consumed[s],
                                input_on_device_ ? nullptr : slot_input_[s]->device_pointer()});
}

// Waits for batch k's compute work, moves its pinned outputs into the host output and releases
// its results.
void GpuDispatch::drain(int k) {
  const detail::Pipeline& p = **pipeline_;
  const int s = k % depth_;
  const int b0 = k * per_batch_;
  VSR_CU_TRY(api_->cuEventSynchronize(p.consumed[s]));
  if (!via_pinned_[s].empty()) {
    auto* host = static_cast<unsigned char*>(out_->mutable_host_data());
    const auto n = static_cast<std::size_t>(out_band_bytes_);
    for (int band : via_pinned_[s]) {
      const auto j = static_cast<std::size_t>(band - b0);
      detail::parallel_copy(
          host + n * static_cast<std::size_t>(band),
          static_cast<const unsigned char*>(staging_out_[s].data()) + n * j, n,
          o_.staging_threads > 0 ? o_.staging_threads : detail::staging_copy_threads(n));
    }
    via_pinned_[s].clear();
  }
  results_[s].clear();
  detail::notify_dispatch_step(
      {detail::DispatchStep::drained, k, p.copy, compute_stream_, p.consumed[s], nullptr});
}

void GpuDispatch::take_result(const OwnedRasterArray& result, int band, int slot) {
  const std::string where = "dispatch_per_band_gpu: the result of band " + std::to_string(band);
  if (result.band_count() != 1 || result.height() != height_ || result.width() != width_) {
    throw std::invalid_argument(where + " has shape (" + std::to_string(result.band_count()) +
                                ", " + std::to_string(result.height()) + ", " +
                                std::to_string(result.width()) + "), expected (1, " +
                                std::to_string(height_) + ", " + std::to_string(width_) + ")");
  }
  if (!out_) {
    out_nodata_ = result.nodata();
    out_band_bytes_ = checked_mul(
        checked_mul(static_cast<std::uint64_t>(height_), static_cast<std::uint64_t>(width_),
                    "dispatch_per_band_gpu: output byte count"),
        itemsize(result.dtype()), "dispatch_per_band_gpu: output byte count");
    const std::uint64_t out_total = checked_mul(out_band_bytes_, static_cast<std::uint64_t>(bands_),
                                                "dispatch_per_band_gpu: output byte count");
    // The stack stays on the device only if it fits beside the passes in flight.
    const std::uint64_t held = pass_bytes_ * static_cast<std::uint64_t>(depth_);
    out_on_device_ = o_.output ? *o_.output == Residency::device
                               : held <= budget_ && out_total <= budget_ - held;
    out_ = OwnedRasterArray::allocate(out_on_device_ ? Residency::device : Residency::host,
                                      result.dtype(), bands_, height_, width_, raster_.nodata(),
                                      raster_.affine(), raster_.crs());
    if (out_on_device_) {
      compute_after_legacy();
    } else {
      const std::uint64_t slot_bytes = out_band_bytes_ * static_cast<std::uint64_t>(per_batch_);
      for (int s = 0; s < depth_; ++s) {
        staging_out_[static_cast<std::size_t>(s)] =
            detail::DispatchResources::get().pinned(static_cast<std::size_t>(slot_bytes));
        pinned_bytes_ += staging_out_[static_cast<std::size_t>(s)].size();
      }
    }
  } else {
    VSR_EXPECTS(result.dtype() == out_->dtype(),
                where + " has dtype " + std::string(to_string(result.dtype())) + ", band 0's has " +
                    std::string(to_string(out_->dtype())));
    VSR_EXPECTS(same_nodata(result.nodata(), out_nodata_),
                where + " has a different nodata from band 0's result");
  }
  const auto n = static_cast<std::size_t>(out_band_bytes_);
  const std::size_t offset = n * static_cast<std::size_t>(band);
  const void* src = result.device_pointer();
  if (out_on_device_) {
    auto* dst = static_cast<unsigned char*>(out_->device_data()) + offset;
    if (src != nullptr) {
      VSR_CU_TRY(api_->cuMemcpyDtoDAsync(detail::to_device_ptr(dst), detail::to_device_ptr(src), n,
                                         compute_stream_));
    } else {
      VSR_CU_TRY(api_->cuMemcpyHtoDAsync(detail::to_device_ptr(dst), result.host_data(), n,
                                         compute_stream_));
    }
  } else if (src != nullptr) {
    const int j = band - (band / per_batch_) * per_batch_;
    auto* dst = static_cast<unsigned char*>(staging_out_[static_cast<std::size_t>(slot)].data()) +
                n * static_cast<std::size_t>(j);
    VSR_CU_TRY(api_->cuMemcpyDtoHAsync(dst, detail::to_device_ptr(src), n, compute_stream_));
    via_pinned_[static_cast<std::size_t>(slot)].push_back(band);
  } else {
    std::memcpy(static_cast<unsigned char*>(out_->mutable_host_data()) + offset, result.host_data(),
                n);
  }
}

OwnedRasterArray GpuDispatch::run(GpuDispatchReport* report) {
  try {
    api_ = &detail::driver();
  } catch (const DriverUnavailableError& e) {
    throw DriverUnavailableError(
        e.code(), e.name(),
        "dispatch_per_band_gpu: a raster of " + std::to_string(raster_.band_count()) +
            " bands needs a CUDA driver and device (use dispatch_per_band_cpu without one): " +
            e.what());
  }
  detail::bind_current_device();
  bands_ = raster_.band_count();
  height_ = raster_.height();
  width_ = raster_.width();
  // One budget for the planner and for every decision below.
  budget_ = o_.vram_budget ? *o_.vram_budget : available_vram_bytes();
  band_bytes_ = checked_mul(
      checked_mul(static_cast<std::uint64_t>(height_), static_cast<std::uint64_t>(width_),
                  "dispatch_per_band_gpu: band byte count"),
      itemsize(raster_.dtype()), "dispatch_per_band_gpu: band byte count");
  if (budget_ == 0) {
    throw OutOfMemoryError(band_bytes_,
                           "dispatch_per_band_gpu: the device has no memory available (VRAM "
                           "budget 0 bytes)");
  }
  input_on_device_ = raster_.residency() == Residency::device;
  host_in_ = input_on_device_ ? nullptr : static_cast<const unsigned char*>(raster_.host_data());
  plan();

  // Slot buffers first (see the member order), then the pipeline.
  if (!input_on_device_) {
    for (int s = 0; s < depth_; ++s) {
      slot_input_[static_cast<std::size_t>(s)] =
          OwnedRasterArray::allocate(Residency::device, raster_.dtype(), per_batch_, height_,
                                     width_, raster_.nodata(), raster_.affine(), raster_.crs());
      staging_in_[static_cast<std::size_t>(s)] =
          detail::DispatchResources::get().pinned(static_cast<std::size_t>(in_bytes_));
      pinned_bytes_ += staging_in_[static_cast<std::size_t>(s)].size();
    }
  }
  pipeline_.emplace(detail::DispatchResources::get().pipeline());
  const detail::Pipeline& p = **pipeline_;
  compute_stream_ = sop_ != nullptr ? p.compute : nullptr;
  if (!input_on_device_) {
    // The slots' device buffers come from the pool for the legacy stream: the copy stream waits
    // for what is queued there.
    VSR_CU_TRY(api_->cuEventRecord(p.legacy_mark, nullptr));
    VSR_CU_TRY(api_->cuStreamWaitEvent(p.copy, p.legacy_mark, 0));
    stage(0);
  }
  for (int k = 0; k < n_batches_; ++k) {
    compute(k);
    if (depth_ == 2) {
      // Batch k is queued: release batch k-1 and start copying batch k+1 into its slot, so the
      // copy (and the host's draining of k-1) runs while batch k computes.
      if (k >= 1) drain(k - 1);
      if (k + 1 < n_batches_ && !input_on_device_) stage(k + 1);
    } else {
      drain(k);
      if (k + 1 < n_batches_ && !input_on_device_) stage(k + 1);
    }
  }
  if (depth_ == 2) drain(n_batches_ - 1);
  if (report != nullptr) {
    report->plan = plan_;
    report->vram_budget = budget_;
    report->passes = n_batches_;
    report->pipeline_depth = depth_;
    report->input_copied = !input_on_device_;
    report->output = out_on_device_ ? Residency::device : Residency::host;
    report->staging_threads = staging_threads_used_;
    report->pinned_bytes = pinned_bytes_;
  }
  return std::move(*out_);
}

/// Runs one call, then trims the idle pinned buffers to what it used (after its leases are back).
OwnedRasterArray run_gpu_dispatch(const OwnedRasterArray& raster, const StreamBandOp* stream_op,
                                  const BandOp* band_op, const GpuDispatchOptions& options,
                                  GpuDispatchReport* report) {
  const Clock::time_point start = Clock::now();
  GpuDispatchReport local;
  if (report == nullptr) report = &local;
  std::optional<OwnedRasterArray> out;
  std::exception_ptr error;
  std::uint64_t used = 0;
  {
    GpuDispatch call(raster, stream_op, band_op, options);
    try {
      out.emplace(call.run(report));
    } catch (...) {
      error = std::current_exception();
    }
    used = call.pinned_bytes();
  }  // the call's pipeline waited for its streams; its buffers are back
  detail::DispatchResources::get().trim_pinned(static_cast<std::size_t>(used));
  if (error) std::rethrow_exception(error);
  record_dispatch(*out, "dispatch_per_band_gpu",
                  bands_text(raster) + " batches=" + std::to_string(report->passes) +
                      " bands_per_pass=" + std::to_string(report->plan.bands_per_pass) +
                      " pipeline_depth=" + std::to_string(report->pipeline_depth),
                  start);
  return std::move(*out);
}

/// The preconditions of both dispatch_per_band_gpu overloads: an op, and options in range.
void check_gpu_dispatch(bool has_op, const GpuDispatchOptions& options) {
  VSR_EXPECTS(has_op, "dispatch_per_band_gpu: op is empty");
  VSR_EXPECTS(options.pipeline_depth == 1 || options.pipeline_depth == 2,
              "dispatch_per_band_gpu: pipeline_depth must be 1 or 2, not " +
                  std::to_string(options.pipeline_depth));
  VSR_EXPECTS(options.staging_threads >= 0, "dispatch_per_band_gpu: staging_threads must be >= 0");
}

}  // namespace

OwnedRasterArray dispatch_per_band_gpu(const OwnedRasterArray& raster, const StreamBandOp& op,
                                       const GpuDispatchOptions& options,
                                       GpuDispatchReport* report) {
  check_gpu_dispatch(static_cast<bool>(op), options);
  if (raster.band_count() == 1) {
    const Clock::time_point start = Clock::now();
    OwnedRasterArray result = op(raster, nullptr);
    record_dispatch(result, "dispatch_per_band_gpu", "single-band passthrough", start);
    return result;
  }
  return run_gpu_dispatch(raster, &op, nullptr, options, report);
}

OwnedRasterArray dispatch_per_band_gpu(const OwnedRasterArray& raster, const BandOp& op,
                                       int buffers_per_band, std::uint64_t scratch_bytes) {
  GpuDispatchOptions options;
  options.buffers_per_band = buffers_per_band;
  options.scratch_bytes = scratch_bytes;
  return dispatch_per_band_gpu(raster, op, options, nullptr);
}

OwnedRasterArray dispatch_per_band_gpu(const OwnedRasterArray& raster, const BandOp& op,
                                       const GpuDispatchOptions& options,
                                       GpuDispatchReport* report) {
  check_gpu_dispatch(static_cast<bool>(op), options);
  if (raster.band_count() == 1) {
    const Clock::time_point start = Clock::now();
    OwnedRasterArray result = op(raster);
    record_dispatch(result, "dispatch_per_band_gpu", "single-band passthrough", start);
    return result;
  }
  return run_gpu_dispatch(raster, nullptr, &op, options, report);
}

}  // namespace vibespatial::raster
