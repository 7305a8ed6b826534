// SPDX-License-Identifier: Apache-2.0
// vsr-run --diagnostics: the run's steps and tile stages, timed (timings.hpp).
#include "timings.hpp"

#include <vibespatial/raster/diagnostics.hpp>

#include <sys/resource.h>

#include <algorithm>

namespace vsr_run {

namespace vsr = vibespatial::raster;

namespace {

/// The process's user + system CPU seconds so far.
double process_cpu_seconds() {
  rusage u{};
  if (::getrusage(RUSAGE_SELF, &u) != 0) return 0;
  const auto secs = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
  };
  return secs(u.ru_utime) + secs(u.ru_stime);
}

}  // namespace

void RunTimings::close_step_locked(Clock::time_point now) {
  if (!open_step_) return;
  Step& s = steps_[*open_step_];
  s.seconds += std::chrono::duration<double>(now - step_start_).count();
  s.cpu_seconds += process_cpu_seconds() - step_cpu_start_;
  open_step_.reset();
}

void RunTimings::step(const std::string& name) {
  const std::lock_guard<std::mutex> lock(mutex_);
  const Clock::time_point now = Clock::now();
  close_step_locked(now);
  std::size_t i = 0;
  while (i < steps_.size() && steps_[i].name != name) ++i;
  if (i == steps_.size()) steps_.push_back(Step{name});
  open_step_ = i;
  step_start_ = now;
  step_cpu_start_ = process_cpu_seconds();
}

void RunTimings::stage(const vsr::TileInfo& where, vsr::TileStage stage) {
  const std::lock_guard<std::mutex> lock(mutex_);
  started_[{where.index, static_cast<int>(stage)}] = Clock::now();
}

void RunTimings::stage_done(const vsr::TileInfo& where, vsr::TileStage stage) {
  const std::lock_guard<std::mutex> lock(mutex_);
  const Clock::time_point now = Clock::now();
  const auto it = started_.find({where.index, static_cast<int>(stage)});
  if (it == started_.end()) return;
  if (open_step_) {
    const auto k = static_cast<std::size_t>(stage);
    Step& s = steps_[*open_step_];
    s.stage_seconds[k] += std::chrono::duration<double>(now - it->second).count();
    ++s.stage_count[k];
  }
  started_.erase(it);
}

void RunTimings::note_steps(const vsr::OwnedRasterArray& result) {
  static const std::string kPrefix = "Pipeline: ";
  const std::vector<vsr::RasterDiagnosticEvent> events = result.diagnostics()->events();
  const std::lock_guard<std::mutex> lock(mutex_);
  for (const vsr::RasterDiagnosticEvent& e : events) {
    if (e.kind != vsr::RasterDiagnosticKind::runtime || e.detail.rfind(kPrefix, 0) != 0) continue;
    const std::string step = e.detail.substr(kPrefix.size());
    auto it = std::find_if(pipeline_steps_.begin(), pipeline_steps_.end(),
                           [&](const auto& p) { return p.first == step; });
    if (it == pipeline_steps_.end()) {
      pipeline_steps_.emplace_back(step, 1);
    } else {
      ++it->second;
    }
  }
}

void RunTimings::finish() {
  const std::lock_guard<std::mutex> lock(mutex_);
  close_step_locked(Clock::now());
  started_.clear();
}

void RunTimings::print(std::FILE* out) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  static const char* const kStages[] = {"read", "compute", "write"};
  std::fprintf(out, "[vsr-run] diagnostics: where the time went\n");
  std::fprintf(out, "  %-40s %10s %8s\n", "step", "seconds", "cores");
  double total = 0;
  for (const Step& s : steps_) {
    std::fprintf(out, "  %-40s %10.4f %8.2f\n", s.name.c_str(), s.seconds,
                 s.seconds > 0 ? s.cpu_seconds / s.seconds : 0.0);
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
  for (const auto& [step, tiles] : pipeline_steps_) {
    std::fprintf(out, "  %s: %lld tile%s\n", step.c_str(), static_cast<long long>(tiles),
                 tiles == 1 ? "" : "s");
  }
}

}  // namespace vsr_run
