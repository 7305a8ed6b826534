// SPDX-License-Identifier: Apache-2.0
// vsr-run --diagnostics: where a run's time went, per step and per tile stage.
#pragma once

#include <vibespatial/raster/tiles.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace vsr_run {

/**
 * @brief The wall time of a run's steps (in the order they were first entered; a step entered
 * again adds to its line) and, within them, the time the tiles' read, compute and write stages
 * took, each from its start to its end (TileRunOptions::stage and stage_done), so that
 * overlapped stages are each counted whole: their sum may then exceed the step's wall time.
 * Also the process's CPU time in each step (cores busy = CPU / wall). Thread-safe (the
 * executor's stage events come from its threads, one at a time).
 */
class RunTimings {
 public:
  /// Closes the open step (if any) and opens @p name.
  void step(const std::string& name);
  /// Tile @p where's @p stage begins.
  void stage(const vibespatial::raster::TileInfo& where, vibespatial::raster::TileStage stage);
  /// Tile @p where's @p stage has ended: its time goes to the open step.
  void stage_done(const vibespatial::raster::TileInfo& where, vibespatial::raster::TileStage stage);
  /// Counts the steps a tile's @p result went through, from its diagnostic log: the Pipeline's
  /// step events ("Pipeline: step N (name) on the device"), by step and where it ran.
  void note_steps(const vibespatial::raster::OwnedRasterArray& result);
  /// Closes the open step (call once the run is over).
  void finish();
  /// Writes the table to @p out: each step's seconds and cores busy, the stages' seconds and
  /// tile counts under the step they ran in, and the total.
  void print(std::FILE* out) const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Step {
    std::string name;
    double seconds = 0, cpu_seconds = 0;
    std::array<double, 3> stage_seconds{};      ///< read, compute, write
    std::array<std::int64_t, 3> stage_count{};  ///< tiles through each stage
  };
  void close_step_locked(Clock::time_point now);

  mutable std::mutex mutex_;
  std::vector<Step> steps_;
  std::optional<std::size_t> open_step_;
  Clock::time_point step_start_;
  double step_cpu_start_ = 0;
  /// Start of each stage under way, by (tile index, stage).
  std::map<std::pair<std::int64_t, int>, Clock::time_point> started_;
  /// Tiles through each pipeline step, by its event's text ("step 1 (calc) on the device"), in
  /// the order first seen.
  std::vector<std::pair<std::string, std::int64_t>> pipeline_steps_;
};

}  // namespace vsr_run
