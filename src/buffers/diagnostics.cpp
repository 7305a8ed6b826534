// SPDX-License-Identifier: Apache-2.0
// RasterDiagnostics: a raster's bounded, thread-safe log of events and runtime selections.
#include <vibespatial/raster/diagnostics.hpp>

#include <utility>

namespace vibespatial::raster {

std::string_view to_string(RasterDiagnosticKind kind) noexcept {
  switch (kind) {
    case RasterDiagnosticKind::created:
      return "created";
    case RasterDiagnosticKind::transfer:
      return "transfer";
    case RasterDiagnosticKind::materialization:
      return "materialization";
    case RasterDiagnosticKind::runtime:
      return "runtime";
  }
  return "unknown";
}

void RasterDiagnostics::record(RasterDiagnosticEvent event) {
  std::lock_guard lock(mutex_);
  events_.push_back(std::move(event));
  if (events_.size() > capacity) {
    events_.pop_front();
    ++dropped_;
  }
}

void RasterDiagnostics::record_runtime_selection(RuntimeSelection selection, Residency residency) {
  RasterDiagnosticEvent event;
  event.kind = RasterDiagnosticKind::runtime;
  event.detail = "selected=" + selection.selected + " reason=" + selection.reason;
  if (!selection.requested.empty()) event.detail += " requested=" + selection.requested;
  event.residency = residency;
  std::lock_guard lock(mutex_);
  selections_.push_back(std::move(selection));
  if (selections_.size() > capacity) selections_.pop_front();
  events_.push_back(std::move(event));
  if (events_.size() > capacity) {
    events_.pop_front();
    ++dropped_;
  }
}

void RasterDiagnostics::append_from(const RasterDiagnostics& other) {
  if (&other == this) return;
  std::vector<RasterDiagnosticEvent> events = other.events();
  std::vector<RuntimeSelection> selections = other.runtime_history();
  std::lock_guard lock(mutex_);
  for (RuntimeSelection& s : selections) {
    selections_.push_back(std::move(s));
    if (selections_.size() > capacity) selections_.pop_front();
  }
  for (RasterDiagnosticEvent& e : events) {
    events_.push_back(std::move(e));
    if (events_.size() > capacity) {
      events_.pop_front();
      ++dropped_;
    }
  }
}

std::vector<RasterDiagnosticEvent> RasterDiagnostics::events() const {
  std::lock_guard lock(mutex_);
  return {events_.begin(), events_.end()};
}

std::vector<RuntimeSelection> RasterDiagnostics::runtime_history() const {
  std::lock_guard lock(mutex_);
  return {selections_.begin(), selections_.end()};
}

std::uint64_t RasterDiagnostics::dropped_events() const {
  std::lock_guard lock(mutex_);
  return dropped_;
}

}  // namespace vibespatial::raster
