// SPDX-License-Identifier: Apache-2.0
// A raster's diagnostic log: what happened to its pixels (created, transferred, dispatched),
// bounded so that a raster that lives long keeps only its recent history.
//
// Glossary
// - event: one RasterDiagnosticEvent: a kind, a detail text, the residency at the time and, for
//   transfers, the bytes copied and the seconds the copy took.
// - log: a RasterDiagnostics; every storage of an OwnedRasterArray has one, shared by the copies
//   and band views of that storage (OwnedRasterArray::diagnostics()).
// - runtime selection: a decision of where work ran (requested, selected, reason), kept in the
//   log's runtime history and recorded as a runtime event too.
#pragma once

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/export.hpp>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace vibespatial::raster {

/// What a diagnostic event records (the Python original's kinds).
enum class RasterDiagnosticKind : std::uint8_t {
  created,          ///< a raster was made (from host pixels)
  transfer,         ///< pixels were copied host -> device or device -> host
  materialization,  ///< a host copy was made for reading (not a move)
  runtime,          ///< an executor ran (which one, which path) or a runtime was selected
};

/// "created", "transfer", "materialization" or "runtime"; "unknown" otherwise. Never throws.
VSR_EXPORT std::string_view to_string(RasterDiagnosticKind kind) noexcept;

/// One event of a raster's log. A plain value type.
struct RasterDiagnosticEvent {
  RasterDiagnosticKind kind = RasterDiagnosticKind::runtime;
  std::string detail;                     ///< what happened, in words
  Residency residency = Residency::host;  ///< where the pixels were after it
  bool visible_to_user = false;           ///< true for transfers (the original's flag)
  double elapsed_seconds = 0;             ///< wall time it took (transfers, executors)
  std::uint64_t bytes_transferred = 0;    ///< bytes copied (transfers)
};

/// A runtime decision: where work was asked to run, where it ran, and why. A plain value type.
struct RuntimeSelection {
  std::string requested;  ///< e.g. "auto", "gpu", "cpu"
  std::string selected;   ///< e.g. "gpu", "cpu"
  std::string reason;     ///< why, in words
};

/**
 * @brief A bounded, thread-safe log of diagnostic events and runtime selections.
 *
 * At most `capacity` events and `capacity` selections are kept: recording beyond that drops
 * the oldest, and dropped_events() counts what was dropped. Recording costs one lock and one
 * string move. All members are thread-safe.
 */
class VSR_EXPORT RasterDiagnostics {
 public:
  /// The most events (and, apart, runtime selections) a log keeps.
  static constexpr std::size_t capacity = 64;

  RasterDiagnostics() = default;
  RasterDiagnostics(const RasterDiagnostics&) = delete;
  RasterDiagnostics& operator=(const RasterDiagnostics&) = delete;

  /// Appends @p event (dropping the oldest beyond capacity). Throws only std::bad_alloc.
  void record(RasterDiagnosticEvent event);
  /**
   * @brief Appends @p selection to the runtime history and a runtime event
   * "selected=<selected> reason=<reason>" (requested added when set) at @p residency.
   * Throws only std::bad_alloc.
   */
  void record_runtime_selection(RuntimeSelection selection, Residency residency);
  /// Appends a copy of @p other's events and selections, oldest first (a no-op for itself).
  void append_from(const RasterDiagnostics& other);

  /// The events kept, oldest first.
  std::vector<RasterDiagnosticEvent> events() const;
  /// The runtime selections kept, oldest first.
  std::vector<RuntimeSelection> runtime_history() const;
  /// Events recorded but no longer kept (dropped beyond capacity).
  std::uint64_t dropped_events() const;

 private:
  mutable std::mutex mutex_;
  std::deque<RasterDiagnosticEvent> events_;
  std::deque<RuntimeSelection> selections_;
  std::uint64_t dropped_ = 0;
};

}  // namespace vibespatial::raster
