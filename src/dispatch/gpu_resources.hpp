// SPDX-License-Identifier: Apache-2.0
// The one owner of the driver objects GPU dispatch uses (docs/architecture.md, "Who creates
// streams, events and pinned memory": they are owned here and nowhere else in the library's
// work, the pool's stream marks aside): pinned host staging buffers, kept for reuse between
// calls and bounded by what one call's plan needs, and pipelines (a copy stream and a compute
// stream, both CU_STREAM_NON_BLOCKING so that neither waits for the legacy default stream, with
// their events), leased per call and kept for reuse. free_dispatch_resources() gives back what
// is idle. Also the multi-threaded staging copy and a test hook on the pipeline's steps.
#pragma once

#include "driver/cuda_driver.hpp"

#include <array>
#include <cstddef>
#include <functional>

namespace vibespatial::raster::detail {

/// Threads for a host staging copy of @p bytes: 1 below 16 MiB, else min(hardware threads, 8,
/// bytes / 8 MiB), at least 1. Never throws.
int staging_copy_threads(std::size_t bytes) noexcept;

/// memcpy of @p bytes in @p threads contiguous chunks split at 4 KiB multiples, one per thread
/// (the calling thread copies the first). Returns how many threads copied: fewer than asked if
/// a thread could not be started (the calling thread then copies that chunk too). The ranges
/// must not overlap.
int parallel_copy(void* dst, const void* src, std::size_t bytes, int threads);

/// A pinned (page-locked, portable) host buffer leased from DispatchResources; it goes back to
/// the idle list when the lease is destroyed. Movable, not copyable.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(void* data, std::size_t bytes) : data_(data), bytes_(bytes) {}
  PinnedBuffer(PinnedBuffer&& o) noexcept : data_(o.data_), bytes_(o.bytes_) { o.data_ = nullptr; }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer();

  void* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return bytes_; }
  explicit operator bool() const noexcept { return data_ != nullptr; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

/// The driver objects of one pipelined dispatch call, in the primary context of `device`.
struct Pipeline {
  int device = 0;
  CUstream copy = nullptr;     ///< host-to-device copies (CU_STREAM_NON_BLOCKING)
  CUstream compute = nullptr;  ///< the op's work and the output copies (CU_STREAM_NON_BLOCKING)
  std::array<CUevent, 2> copied{};    ///< per slot: its input batch reached the device
  std::array<CUevent, 2> consumed{};  ///< per slot: the compute work that reads it is done
  CUevent legacy_mark = nullptr;      ///< recorded on the legacy stream (see per_band.cpp)
};

/// A leased Pipeline. Destruction waits for both streams (no queued work outlives the lease,
/// whatever happened) and returns the pipeline for reuse, or destroys it if waiting failed.
class PipelineLease {
 public:
  explicit PipelineLease(Pipeline* p) : p_(p) {}
  PipelineLease(PipelineLease&& o) noexcept : p_(o.p_) { o.p_ = nullptr; }
  PipelineLease(const PipelineLease&) = delete;
  PipelineLease& operator=(const PipelineLease&) = delete;
  PipelineLease& operator=(PipelineLease&&) = delete;
  ~PipelineLease();

  Pipeline& operator*() const noexcept { return *p_; }
  Pipeline* operator->() const noexcept { return p_; }

 private:
  Pipeline* p_;
};

/// Process-wide owner of dispatch's pinned buffers and pipelines. Thread-safe.
class DispatchResources {
 public:
  static DispatchResources& get();

  /// A pinned buffer of at least @p bytes: the smallest idle one that fits (and is at most
  /// twice as large), else a new cuMemHostAlloc(PORTABLE). Throws CudaError.
  PinnedBuffer pinned(std::size_t bytes);
  /// A pipeline of the calling thread's device (binding device 0's primary context if none is
  /// current): an idle one, else new streams and events. Throws CudaError (nothing leaked).
  PipelineLease pipeline();
  /// Frees idle pinned buffers, largest first, until at most @p keep_bytes stay idle. Called at
  /// the end of each dispatch call with what that call used, so the idle pool never exceeds one
  /// call's plan. Errors of the driver are ignored (the buffer is forgotten).
  void trim_pinned(std::size_t keep_bytes) noexcept;
  /// Frees everything idle: pinned buffers, streams, events. Throws CudaError (the first error;
  /// everything is released regardless).
  void release_idle();
  /// Bytes of idle pinned buffers (for tests and reports).
  std::size_t idle_pinned_bytes() const noexcept;

 private:
  friend class PinnedBuffer;
  friend class PipelineLease;
  void give_back(void* data, std::size_t bytes) noexcept;
  void give_back(Pipeline* p, bool healthy) noexcept;
  DispatchResources() = default;
  struct State;
  State& state() const;
};

/// A step of the pipelined dispatch, for tests (tests/dispatch): observed on the calling thread.
struct DispatchStep {
  enum Kind {
    staged,    ///< batch's host-to-device copy queued on `copy`; `event` records its completion
    computed,  ///< batch's op calls returned and its output copies are queued on `compute`;
               ///< `event` records the completion of that work
    drained,   ///< the host saw batch's compute work complete and released its results
  };
  Kind kind;
  int batch;
  CUstream copy;
  CUstream compute;
  CUevent event;
  const void* device_input;  ///< the device buffer holding the batch's input
};

/// Installs (or, with an empty function, removes) the observer called at each DispatchStep of
/// every pipelined dispatch call. Test hook: not to be changed while a dispatch call runs.
void set_dispatch_observer(std::function<void(const DispatchStep&)> observer);
/// Calls the observer, if any.
void notify_dispatch_step(const DispatchStep& step);

}  // namespace vibespatial::raster::detail
