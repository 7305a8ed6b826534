// SPDX-License-Identifier: Apache-2.0
// vsr-run --diagnostics: the run's steps and tile stages, timed (timings.hpp).
#include "timings.hpp"

namespace vsr_run {

namespace vsr = vibespatial::raster;

void RunTimings::step(const std::string& name) {
  const std::lock_guard<std::mutex> lock(mutex_);
  const Clock::time_point now = Clock::now();
  close_stage_locked(now);
  if (open_step_) {
    steps_[*open_step_].seconds += std::chrono::duration<double>(now - step_start_).count();
  }
  std::size_t i = 0;
  while (i < steps_.size() && steps_[i].name != name) ++i;
  if (i == steps_.size()) steps_.push_back(Step{name});
  open_step_ = i;
  step_start_ = now;
}

void RunTimings::close_stage_locked(Clock::time_point now) {
  if (!open_stage_ || !open_step_) {
    open_stage_.reset();
    return;
  }
  const auto k = static_cast<std::size_t>(*open_stage_);
  Step& s = steps_[*open_step_];
  s.stage_seconds[k] += std::chrono::duration<double>(now - stage_start_).count();
  ++s.stage_count[k];
  open_stage_.reset();
}

void RunTimings::stage(vsr::TileStage stage) {
  const std::lock_guard<std::mutex> lock(mutex_);
  const Clock::time_point now = Clock::now();
  close_stage_locked(now);
  open_stage_ = stage;
  stage_start_ = now;
}

void RunTimings::tile_done() {
  const std::lock_guard<std::mutex> lock(mutex_);
  close_stage_locked(Clock::now());
}

void RunTimings::finish() {
  const std::lock_guard<std::mutex> lock(mutex_);
  const Clock::time_point now = Clock::now();
  close_stage_locked(now);
  if (open_step_) {
    steps_[*open_step_].seconds += std::chrono::duration<double>(now - step_start_).count();
  }
  open_step_.reset();
}

void RunTimings::print(std::FILE* out) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  static const char* const kStages[] = {"read", "compute", "write"};
  std::fprintf(out, "[vsr-run] diagnostics: where the time went\n");
  std::fprintf(out, "  %-40s %10s\n", "step", "seconds");
  double total = 0;
  for (const Step& s : steps_) {
    std::fprintf(out, "  %-40s %10.4f\n", s.name.c_str(), s.seconds);
    total += s.seconds;
    for (std::size_t k = 0; k < 3; ++k) {
      if (s.stage_count[k] == 0) continue;
      const std::string label = std::string("  ") + kStages[k] + " (" +
                                std::to_string(s.stage_count[k]) + " tile" +
                                (s.stage_count[k] == 1 ? "" : "s") + ")";
      std::fprintf(out, "  %-40s %10.4f\n", label.c_str(), s.stage_seconds[k]);
    }
  }
  std::fprintf(out, "  %-40s %10.4f\n", "total", total);
}

}  // namespace vsr_run
