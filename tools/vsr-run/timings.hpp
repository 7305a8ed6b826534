// SPDX-License-Identifier: Apache-2.0
// vsr-run --diagnostics: where a run's time went, per step and per tile stage.
#pragma once

#include <vibespatial/raster/tiles.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace vsr_run {

/**
 * @brief The wall time of a run's steps (in the order they were first entered; a step entered
 * again adds to its line) and, within them, of the tiles' read, compute and write stages.
 *
 * A stage lasts from its tile's stage event to the next event of the run (the next stage, or
 * the tile's end): exact for the serial walk vsr-run uses. Thread-safe (the executor's stage
 * events may come from its threads, one at a time).
 */
class RunTimings {
 public:
  /// Closes the open step (if any) and opens @p name.
  void step(const std::string& name);
  /// A tile's @p stage begins: closes the open stage.
  void stage(vibespatial::raster::TileStage stage);
  /// The tile being written is done: closes its write stage and counts the tile.
  void tile_done();
  /// Closes the open step and stage (call once the run is over).
  void finish();
  /// Writes the table to @p out: each step's seconds, the stages' seconds and tile counts under
  /// the step they ran in, and the total.
  void print(std::FILE* out) const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Step {
    std::string name;
    double seconds = 0;
    std::array<double, 3> stage_seconds{};      ///< read, compute, write
    std::array<std::int64_t, 3> stage_count{};  ///< tiles through each stage
  };
  void close_stage_locked(Clock::time_point now);

  mutable std::mutex mutex_;
  std::vector<Step> steps_;
  std::optional<std::size_t> open_step_;
  Clock::time_point step_start_;
  std::optional<vibespatial::raster::TileStage> open_stage_;
  Clock::time_point stage_start_;
};

}  // namespace vsr_run
