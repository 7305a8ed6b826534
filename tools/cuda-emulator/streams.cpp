// SPDX-License-Identifier: Apache-2.0
// Streams and events of the host emulator (docs/cuda-driver-rules.md §3.7).
//
// A created stream is a FIFO run by a worker thread of its own (or inline with SYNC=1). With
// ASYNC_DEFAULT_STREAMS the legacy default stream of a context and the per-thread default stream
// of each thread are workers too; otherwise their work runs inline in the calling thread. The
// legacy stream's implicit synchronisation with blocking streams (§3.7) is done by the workers:
// a task queued on the legacy stream first waits for the work queued earlier on the context's
// blocking streams, and a task queued on a blocking stream first waits for the legacy stream's
// earlier work; the caller is never blocked for it. Non-blocking streams take part in neither.
//
// Stream and event handles are values of a PROT_NONE arena (HandleSpace). A destroyed handle
// leaves a tombstone until the value is reused: a later call naming it counts in stale_handles.
#include "emulator_state.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

namespace vsr::emu {
namespace {

// Whether the calling thread is a stream worker (its waits are not host waits).
thread_local bool tl_worker = false;
// Host threads blocked in a driver call until stream work completes (vsr_emu_waiting_threads).
std::atomic<unsigned long long> g_waiting{0};

constexpr size_t kHandleArena = size_t{16} << 20;
constexpr size_t kHandleStride = 16;

void worker_loop(std::shared_ptr<Stream> stream) {
  tl_worker = true;
  std::unique_lock lock(stream->mutex);
  for (;;) {
    stream->cv.wait(lock, [&] {
      return (!stream->queue.empty() && !stream->paused) ||
             (stream->stopping && stream->queue.empty());
    });
    if (stream->queue.empty()) return;
    Task task = std::move(stream->queue.front());
    stream->queue.pop_front();
    stream->running = task.access;
    lock.unlock();
    if (const auto late = late_work_delay(); late.count() > 0) std::this_thread::sleep_for(late);
    task.run();
    task = Task{};
    lock.lock();
    stream->running = nullptr;
    stream->completed++;
    stream->cv.notify_all();
  }
}

void wait_for(const std::shared_ptr<Stream>& stream, uint64_t seq) {
  std::unique_lock lock(stream->mutex);
  if (stream->completed >= seq) return;
  const bool host = !tl_worker;
  if (host) g_waiting++;
  stream->cv.wait(lock, [&] { return stream->completed >= seq; });
  if (host) g_waiting--;
}

uint64_t submitted_of(const std::shared_ptr<Stream>& stream) {
  std::lock_guard lock(stream->mutex);
  return stream->submitted;
}

bool idle(const std::shared_ptr<Stream>& stream) {
  std::lock_guard lock(stream->mutex);
  return stream->completed >= stream->submitted;
}

// Lets the worker finish what is queued and exit (global mutex held).
void stop(const std::shared_ptr<Stream>& stream) {
  stream->destroyed = true;
  {
    std::lock_guard lock(stream->mutex);
    stream->stopping = true;
    stream->paused = false;
  }
  stream->cv.notify_all();
}

// --- handles ---------------------------------------------------------------------------------

int kind_index(char kind) {
  return kind == 's' ? 0 : 1;
}

// A handle value for a new stream ('s') or event ('e'); nullptr when the arena is exhausted.
void* new_handle(State& s, char kind) {
  HandleSpace& h = s.handle_space;
  if (h.base == 0) {
    void* arena =
        mmap(nullptr, kHandleArena, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (arena == MAP_FAILED) return nullptr;
    h.base = reinterpret_cast<uintptr_t>(arena);
    h.slots = kHandleArena / kHandleStride;
  }
  std::deque<uintptr_t>& mine = h.retired[kind_index(kind)];
  std::deque<uintptr_t>& other = h.retired[1 - kind_index(kind)];
  uintptr_t v = 0;
  if (s.config.recycle_handles && !mine.empty()) {
    v = mine.back();  // the value destroyed last, at once (RMM #649)
    mine.pop_back();
  } else if (h.next < h.slots) {
    v = h.base + kHandleStride * h.next++;
  } else if (!mine.empty()) {
    v = mine.front();
    mine.pop_front();
  } else if (!other.empty()) {
    v = other.front();
    other.pop_front();
  } else {
    return nullptr;
  }
  s.tombstones.erase(v);
  return reinterpret_cast<void*>(v);
}

void retire_handle(State& s, const void* handle, char kind) {
  const auto v = reinterpret_cast<uintptr_t>(handle);
  s.tombstones[v] = kind;
  s.handle_space.retired[kind_index(kind)].push_back(v);
}

// An unknown stream or event handle: INVALID_HANDLE, and a stale use if it was destroyed.
CUresult unknown_handle(State& s, const void* handle) {
  auto it = s.tombstones.find(reinterpret_cast<uintptr_t>(handle));
  if (it != s.tombstones.end()) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "names %s %p, which was destroyed",
                  it->second == 's' ? "stream" : "event", handle);
    misuse(s, &s.stale_handles, buf);
  }
  return CUDA_ERROR_INVALID_HANDLE;
}

// REQUIRE_CONTEXT: stream and event calls need a current context (§1.2).
CUresult need_current(State& s) {
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (s.config.require_context && (tl_current == nullptr || !tl_current->active)) {
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  return CUDA_SUCCESS;
}

CUresult find_event(State& s, CUevent event, std::shared_ptr<Event>* out) {
  VSR_EMU_TRY(need_current(s));
  auto it = s.events.find(event);
  if (it == s.events.end()) return unknown_handle(s, event);
  *out = it->second;
  return CUDA_SUCCESS;
}

// --- stream objects --------------------------------------------------------------------------

// A new stream object with a running worker (unless inline); nullptr if no thread can be made.
std::shared_ptr<Stream> start_stream(State& s, CUctx_st* ctx, StreamKind kind, unsigned flags,
                                     bool inline_) {
  auto stream = std::make_shared<Stream>();
  stream->ctx = ctx;
  stream->kind = kind;
  stream->flags = flags;
  stream->ctx_generation = ctx->generation;
  stream->inline_ = inline_;
  if (!inline_) {
    try {
      std::thread(worker_loop, stream).detach();
    } catch (const std::system_error&) {
      return nullptr;
    }
  }
  std::erase_if(s.all_streams, [](const std::weak_ptr<Stream>& w) { return w.expired(); });
  s.all_streams.push_back(stream);
  return stream;
}

// The calling thread's per-thread default streams, one per context; stopped at thread exit.
struct PerThreadStreams {
  std::vector<std::shared_ptr<Stream>> list;
  ~PerThreadStreams() {
    if (list.empty()) return;
    State& s = st();
    std::lock_guard lock(s.mutex);
    for (auto& stream : list) stop(stream);
  }
};
thread_local PerThreadStreams tl_per_thread;

std::shared_ptr<Stream> per_thread_stream(State& s, CUctx_st* ctx, bool create) {
  auto& list = tl_per_thread.list;
  std::erase_if(list, [](const std::shared_ptr<Stream>& p) {
    return p->ctx_generation != p->ctx->generation;
  });
  for (auto& p : list) {
    if (p->ctx == ctx) return p;
  }
  if (!create) return nullptr;
  auto p = start_stream(s, ctx, StreamKind::per_thread, CU_STREAM_DEFAULT, false);
  if (p != nullptr) list.push_back(p);
  return p;
}

std::shared_ptr<Stream> legacy_stream(State& s, CUctx_st* ctx, bool create) {
  if (ctx->legacy != nullptr || !create) return ctx->legacy;
  ctx->legacy = start_stream(s, ctx, StreamKind::legacy, CU_STREAM_DEFAULT, false);
  return ctx->legacy;
}

// The worker `ref` queues on, or nullptr when its work runs inline.
CUresult queue_of(State& s, const StreamRef& ref, std::shared_ptr<Stream>* out) {
  *out = nullptr;
  switch (ref.kind) {
    case StreamKind::created:
      if (!ref.stream->inline_) *out = ref.stream;
      return CUDA_SUCCESS;
    case StreamKind::legacy:
      if (!default_streams_async(s.config)) return CUDA_SUCCESS;
      *out = legacy_stream(s, ref.ctx, true);
      break;
    case StreamKind::per_thread:
      if (!default_streams_async(s.config)) return CUDA_SUCCESS;
      *out = per_thread_stream(s, ref.ctx, true);
      break;
  }
  return *out != nullptr ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

// Work the legacy stream of `ctx` waits for: everything queued so far on the live blocking
// streams of the context (§3.7), except `self`.
WaitList blocking_work(State& s, CUctx_st* ctx, const Stream* self) {
  WaitList out;
  for (const auto& weak : s.all_streams) {
    std::shared_ptr<Stream> other = weak.lock();
    if (other == nullptr || other.get() == self || other->ctx != ctx || other->destroyed ||
        !other->blocking() || other->ctx_generation != ctx->generation) {
      continue;
    }
    std::lock_guard lock(other->mutex);
    if (other->submitted > other->completed) out.emplace_back(other, other->submitted);
  }
  return out;
}

// The implicit dependencies of a task queued now on `target` (global mutex held).
WaitList implicit_deps(State& s, CUctx_st* ctx, const std::shared_ptr<Stream>& target) {
  if (target->kind == StreamKind::legacy) return blocking_work(s, ctx, target.get());
  WaitList out;
  if (target->blocking() && ctx->legacy != nullptr && ctx->legacy != target) {
    std::lock_guard lock(ctx->legacy->mutex);
    if (ctx->legacy->submitted > ctx->legacy->completed) {
      out.emplace_back(ctx->legacy, ctx->legacy->submitted);
    }
  }
  return out;
}

// Runs `task` in the calling thread, in stream order (releases `lock`).
CUresult run_inline(std::unique_lock<std::mutex>& lock, const StreamRef& ref,
                    std::function<CUresult(bool)>& task) {
  State& s = st();
  WaitList before;
  if (ref.kind == StreamKind::legacy) {
    // The legacy stream waits for all blocking streams of its context (§3.7), and for its own
    // worker's work if ASYNC_DEFAULT_STREAMS was on before.
    before = blocking_work(s, ref.ctx, nullptr);
    if (ref.ctx->legacy != nullptr)
      before.emplace_back(ref.ctx->legacy, submitted_of(ref.ctx->legacy));
  } else if (ref.kind == StreamKind::per_thread) {
    if (auto own = per_thread_stream(s, ref.ctx, false))
      before.emplace_back(own, submitted_of(own));
  } else {
    std::lock_guard slock(ref.stream->mutex);
    ref.stream->submitted++;
    ref.stream->completed++;
  }
  lock.unlock();
  wait_all(before);
  return task(false);
}

struct CallResult {
  CUresult value = CUDA_SUCCESS;
};

}  // namespace

CUresult resolve_stream(State& s, CUstream handle, bool ptds, StreamRef* out) {
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (handle == nullptr) handle = ptds ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY;
  if (handle == CU_STREAM_LEGACY || handle == CU_STREAM_PER_THREAD) {
    CUctx_st* ctx = nullptr;
    CUresult r = need_context(s, &ctx);
    if (r != CUDA_SUCCESS) return r;
    out->kind = handle == CU_STREAM_LEGACY ? StreamKind::legacy : StreamKind::per_thread;
    out->ctx = ctx;
    return CUDA_SUCCESS;
  }
  VSR_EMU_TRY(need_current(s));
  auto it = s.streams.find(handle);
  if (it == s.streams.end()) return unknown_handle(s, handle);
  CUctx_st* ctx = it->second->ctx;
  if (!ctx->active) return CUDA_ERROR_INVALID_CONTEXT;
  if (ctx->poisoned) return CUDA_ERROR_ILLEGAL_ADDRESS;
  out->kind = StreamKind::created;
  out->stream = it->second;
  out->ctx = ctx;
  return CUDA_SUCCESS;
}

CUresult submit(std::unique_lock<std::mutex>& lock, const StreamRef& ref,
                std::function<CUresult(bool)> task, const SubmitOptions& options) {
  State& s = st();
  std::shared_ptr<Stream> target;
  if (CUresult r = queue_of(s, ref, &target); r != CUDA_SUCCESS) {
    lock.unlock();
    return r;
  }
  if (target == nullptr) return run_inline(lock, ref, task);
  if (options.drain_first) {
    const uint64_t earlier = submitted_of(target);
    lock.unlock();
    wait_for(target, earlier);
    lock.lock();
    if (!ref.ctx->active) {
      lock.unlock();
      return CUDA_ERROR_INVALID_CONTEXT;
    }
    if (target->destroyed) {  // the context was reset meanwhile: its default stream is new
      if (CUresult r = queue_of(s, ref, &target); r != CUDA_SUCCESS || target == nullptr) {
        lock.unlock();
        return r != CUDA_SUCCESS ? r : CUDA_ERROR_INVALID_CONTEXT;
      }
    }
  }
  WaitList deps = implicit_deps(s, ref.ctx, target);
  auto result = options.host_wait ? std::make_shared<CallResult>() : nullptr;
  auto run = [deps = std::move(deps), task = std::move(task), result] {
    for (const auto& [stream, seq] : deps) wait_for(stream, seq);
    const CUresult r = task(result == nullptr);
    if (result != nullptr) result->value = r;
  };
  uint64_t seq = 0;
  {
    std::lock_guard slock(target->mutex);
    target->queue.push_back(Task{std::move(run), options.access});
    seq = ++target->submitted;
  }
  target->cv.notify_all();
  if (options.seq != nullptr) *options.seq = seq;
  if (options.queued_on != nullptr) *options.queued_on = target;
  if (!options.host_wait) return CUDA_SUCCESS;
  lock.unlock();
  wait_for(target, seq);
  return result->value;
}

WaitList context_work(State& s, CUctx_st* ctx) {
  WaitList out;
  for (const auto& weak : s.all_streams) {
    std::shared_ptr<Stream> stream = weak.lock();
    if (stream == nullptr || stream->ctx != ctx) continue;
    std::lock_guard lock(stream->mutex);
    if (stream->submitted > stream->completed) out.emplace_back(stream, stream->submitted);
  }
  return out;
}

void wait_all(const WaitList& list) {
  for (const auto& [stream, seq] : list) wait_for(stream, seq);
}

bool pending_work_overlaps(State& s, uintptr_t begin, uintptr_t end, uint64_t physical) {
  auto hits = [&](const std::shared_ptr<PendingAccess>& a) {
    if (a == nullptr || a->done) return false;
    for (const auto& r : a->ranges) {
      if (r.begin < end && begin < r.end) return true;
    }
    return physical != 0 &&
           std::find(a->physical.begin(), a->physical.end(), physical) != a->physical.end();
  };
  for (const auto& weak : s.all_streams) {
    std::shared_ptr<Stream> stream = weak.lock();
    if (stream == nullptr) continue;
    std::lock_guard lock(stream->mutex);
    if (hits(stream->running)) return true;
    for (const Task& t : stream->queue) {
      if (hits(t.access)) return true;
    }
  }
  return false;
}

void reset_context_streams(std::unique_lock<std::mutex>& lock, CUctx_st* ctx) {
  State& s = st();
  WaitList all = context_work(s, ctx);
  lock.unlock();
  wait_all(all);
  lock.lock();
  for (auto it = s.streams.begin(); it != s.streams.end();) {
    if (it->second->ctx == ctx) {
      retire_handle(s, it->first, 's');
      stop(it->second);
      it = s.streams.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = s.events.begin(); it != s.events.end();) {
    if (it->second->ctx == ctx) {
      retire_handle(s, it->first, 'e');
      it = s.events.erase(it);
    } else {
      ++it;
    }
  }
  // Default-stream workers of the context, the per-thread ones of every thread included.
  for (const auto& weak : s.all_streams) {
    std::shared_ptr<Stream> stream = weak.lock();
    if (stream != nullptr && stream->ctx == ctx && stream->kind != StreamKind::created) {
      stop(stream);
    }
  }
  ctx->legacy = nullptr;
  ctx->generation++;
}

CUresult sync_result(CUctx_st* ctx) {
  if (ctx->poisoned) return CUDA_ERROR_ILLEGAL_ADDRESS;
  CUresult r = ctx->pending_error;
  ctx->pending_error = CUDA_SUCCESS;
  return r;
}

}  // namespace vsr::emu

using namespace vsr::emu;

// ============================== streams ==============================

/// Creates a stream (flags CU_STREAM_DEFAULT or CU_STREAM_NON_BLOCKING) in the current context.
/// It runs its work FIFO on its own worker thread, or inline when VSR_EMU_SYNC=1.
VSR_EMU_EXPORT CUresult cuStreamCreate(CUstream* stream, unsigned int flags) {
  VSR_EMU_ENTRY("cuStreamCreate");
  CUctx_st* ctx = nullptr;
  VSR_EMU_TRY(need_context(s, &ctx));
  if (stream == nullptr || (flags != CU_STREAM_DEFAULT && flags != CU_STREAM_NON_BLOCKING)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto created = start_stream(s, ctx, StreamKind::created, flags, s.config.sync);
  if (created == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  void* handle = new_handle(s, 's');
  if (handle == nullptr) {
    stop(created);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  created->handle = static_cast<CUstream>(handle);
  s.streams[created->handle] = created;
  *stream = created->handle;
  return CUDA_SUCCESS;
}

/// Destroys a created stream at once; its queued work still runs to completion (a hold set with
/// vsr_emu_stream_pause is released). The handle is a tombstone from then on.
VSR_EMU_EXPORT CUresult cuStreamDestroy(CUstream stream) {
  VSR_EMU_ENTRY("cuStreamDestroy");
  VSR_EMU_TRY(need_current(s));
  auto it = s.streams.find(stream);
  if (it == s.streams.end()) return unknown_handle(s, stream);
  std::shared_ptr<Stream> victim = it->second;
  s.streams.erase(it);
  retire_handle(s, stream, 's');
  stop(victim);
  return CUDA_SUCCESS;
}

namespace {

CUresult stream_synchronize(CUstream stream, bool ptds) {
  State& s = st();
  std::unique_lock lock(s.mutex);
  StreamRef ref;
  CUresult r = resolve_stream(s, stream, ptds, &ref);
  if (r != CUDA_SUCCESS) return r;
  WaitList targets;
  if (ref.kind == StreamKind::created) {
    targets.emplace_back(ref.stream, submitted_of(ref.stream));
  } else if (ref.kind == StreamKind::per_thread) {
    if (auto own = per_thread_stream(s, ref.ctx, false))
      targets.emplace_back(own, submitted_of(own));
  } else if (default_streams_async(s.config)) {
    if (auto legacy = legacy_stream(s, ref.ctx, false)) {
      targets.emplace_back(legacy, submitted_of(legacy));
    }
  } else {
    targets = blocking_work(s, ref.ctx, nullptr);
    if (ref.ctx->legacy != nullptr) {
      targets.emplace_back(ref.ctx->legacy, submitted_of(ref.ctx->legacy));
    }
  }
  lock.unlock();
  wait_all(targets);
  lock.lock();
  return sync_result(ref.ctx);
}

CUresult stream_query(CUstream stream, bool ptds) {
  State& s = st();
  std::lock_guard lock(s.mutex);
  StreamRef ref;
  VSR_EMU_TRY(resolve_stream(s, stream, ptds, &ref));
  std::vector<std::shared_ptr<Stream>> targets;
  if (ref.kind == StreamKind::created) {
    targets.push_back(ref.stream);
  } else if (ref.kind == StreamKind::per_thread) {
    if (auto own = per_thread_stream(s, ref.ctx, false)) targets.push_back(own);
  } else if (default_streams_async(s.config)) {
    if (auto legacy = legacy_stream(s, ref.ctx, false)) targets.push_back(legacy);
  } else {
    for (auto& [other, seq] : blocking_work(s, ref.ctx, nullptr)) targets.push_back(other);
    if (ref.ctx->legacy != nullptr) targets.push_back(ref.ctx->legacy);
  }
  for (auto& t : targets) {
    if (!idle(t)) return CUDA_ERROR_NOT_READY;
  }
  return CUDA_SUCCESS;
}

// The stream and the event of cuStreamWaitEvent and cuEventRecord, in that order of checks.
CUresult stream_and_event(State& s, CUstream stream, bool ptds, CUevent event, StreamRef* ref,
                          std::shared_ptr<Event>* ev) {
  VSR_EMU_TRY(resolve_stream(s, stream, ptds, ref));
  return find_event(s, event, ev);
}

CUresult stream_wait_event(CUstream stream, CUevent event, unsigned flags, bool ptds) {
  State& s = st();
  std::unique_lock lock(s.mutex);
  StreamRef ref;
  std::shared_ptr<Event> ev;
  VSR_EMU_TRY(stream_and_event(s, stream, ptds, event, &ref, &ev));
  if ((flags & ~static_cast<unsigned>(CU_EVENT_WAIT_EXTERNAL)) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::shared_ptr<Stream> target = ev->stream;
  uint64_t seq = ev->seq;
  if (!ev->recorded || target == nullptr) return CUDA_SUCCESS;
  return submit(lock, ref, [target, seq](bool) {
    wait_for(target, seq);
    return CUDA_SUCCESS;
  });
}

// `fault`: an `@run` rule of the fault plan made this call's work fault when it runs (as a
// kernel's bad access): the context takes the error, then the function still runs (what faulted
// work wrote is unspecified; its user data is released as usual).
CUresult launch_host_func(CUstream stream, CUhostFn fn, void* user_data, bool ptds,
                          CUresult fault) {
  State& s = st();
  std::unique_lock lock(s.mutex);
  StreamRef ref;
  VSR_EMU_TRY(resolve_stream(s, stream, ptds, &ref));
  if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUctx_st* ctx = ref.ctx;
  return submit(lock, ref, [fn, user_data, ctx, fault](bool) {
    if (fault != CUDA_SUCCESS) fault_queued_work(ctx, fault);
    fn(user_data);
    return CUDA_SUCCESS;
  });
}

CUresult event_record(CUevent event, CUstream stream, bool ptds) {
  State& s = st();
  std::unique_lock lock(s.mutex);
  StreamRef ref;
  std::shared_ptr<Event> ev;
  VSR_EMU_TRY(stream_and_event(s, stream, ptds, event, &ref, &ev));
  if (ev->ctx != ref.ctx) return CUDA_ERROR_INVALID_HANDLE;
  const uint64_t generation = ++ev->generation;
  ev->recorded = true;
  ev->time_set = false;
  auto marker = [ev, generation](bool) {
    State& s2 = st();
    std::lock_guard l2(s2.mutex);
    if (ev->generation == generation) {
      ev->time = Clock::now();
      ev->time_set = true;
    }
    return CUDA_SUCCESS;
  };
  ev->stream = nullptr;
  ev->seq = 0;
  uint64_t seq = 0;
  std::shared_ptr<Stream> queued_on;
  SubmitOptions options;
  options.seq = &seq;
  options.queued_on = &queued_on;
  CUresult r = submit(lock, ref, marker, options);
  if (seq != 0) {  // queued: the global lock is still held
    ev->stream = queued_on;
    ev->seq = seq;
  }
  return r;
}

}  // namespace

/// Waits until all work queued on `stream` so far is done (the legacy stream: its own work, or,
/// with default streams inline, all blocking streams of the context); returns the context's
/// pending or sticky error.
VSR_EMU_EXPORT CUresult cuStreamSynchronize(CUstream stream) {
  VSR_EMU_BEGIN("cuStreamSynchronize");
  return stream_synchronize(stream, false);
}

/// SUCCESS when all work of `stream` is done, else CUDA_ERROR_NOT_READY.
VSR_EMU_EXPORT CUresult cuStreamQuery(CUstream stream) {
  VSR_EMU_BEGIN("cuStreamQuery");
  return stream_query(stream, false);
}

/// Makes later work of `stream` wait until `event`'s captured work is done.
VSR_EMU_EXPORT CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags) {
  VSR_EMU_BEGIN("cuStreamWaitEvent");
  return stream_wait_event(stream, event, flags, false);
}

/// Runs fn(user_data) in stream order (on the stream's worker thread).
VSR_EMU_EXPORT CUresult cuLaunchHostFunc(CUstream stream, CUhostFn fn, void* user_data) {
  VSR_EMU_BEGIN("cuLaunchHostFunc");
  return launch_host_func(stream, fn, user_data, false, take_run_fault());
}

/// Per-thread default stream forms of the stream calls above.
CUresult cuStreamSynchronize_ptsz(CUstream stream) {
  VSR_EMU_BEGIN("cuStreamSynchronize");
  return stream_synchronize(stream, true);
}
CUresult cuStreamQuery_ptsz(CUstream stream) {
  VSR_EMU_BEGIN("cuStreamQuery");
  return stream_query(stream, true);
}
CUresult cuStreamWaitEvent_ptsz(CUstream stream, CUevent event, unsigned int flags) {
  VSR_EMU_BEGIN("cuStreamWaitEvent");
  return stream_wait_event(stream, event, flags, true);
}
CUresult cuLaunchHostFunc_ptsz(CUstream stream, CUhostFn fn, void* user_data) {
  VSR_EMU_BEGIN("cuLaunchHostFunc");
  return launch_host_func(stream, fn, user_data, true, take_run_fault());
}
CUresult cuEventRecord_ptsz(CUevent event, CUstream stream) {
  VSR_EMU_BEGIN("cuEventRecord");
  return event_record(event, stream, true);
}

// ============================== events ==============================

/// Creates an event in the current context. INTERPROCESS requires DISABLE_TIMING.
VSR_EMU_EXPORT CUresult cuEventCreate(CUevent* event, unsigned int flags) {
  VSR_EMU_ENTRY("cuEventCreate");
  CUctx_st* ctx = nullptr;
  VSR_EMU_TRY(need_context(s, &ctx));
  constexpr unsigned kKnown =
      CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  if (event == nullptr || (flags & ~kKnown) != 0 ||
      ((flags & CU_EVENT_INTERPROCESS) != 0 && (flags & CU_EVENT_DISABLE_TIMING) == 0)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  void* handle = new_handle(s, 'e');
  if (handle == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  auto ev = std::make_shared<Event>();
  ev->ctx = ctx;
  ev->handle = static_cast<CUevent>(handle);
  ev->flags = flags;
  s.events[ev->handle] = ev;
  *event = ev->handle;
  return CUDA_SUCCESS;
}

/// Records `event` on `stream`: it completes when the stream reaches this point. Returns at once.
VSR_EMU_EXPORT CUresult cuEventRecord(CUevent event, CUstream stream) {
  VSR_EMU_BEGIN("cuEventRecord");
  return event_record(event, stream, false);
}

namespace {

CUresult event_target(CUevent event, std::shared_ptr<Stream>* stream, uint64_t* seq) {
  State& s = st();
  std::lock_guard lock(s.mutex);
  std::shared_ptr<Event> ev;
  VSR_EMU_TRY(find_event(s, event, &ev));
  if (ev->ctx->poisoned) return CUDA_ERROR_ILLEGAL_ADDRESS;
  *stream = ev->recorded ? ev->stream : nullptr;
  *seq = ev->seq;
  return CUDA_SUCCESS;
}

}  // namespace

/// SUCCESS when the captured work is done (or the event was never recorded), else NOT_READY.
VSR_EMU_EXPORT CUresult cuEventQuery(CUevent event) {
  VSR_EMU_BEGIN("cuEventQuery");
  std::shared_ptr<Stream> stream;
  uint64_t seq = 0;
  VSR_EMU_TRY(event_target(event, &stream, &seq));
  if (stream == nullptr) return CUDA_SUCCESS;
  std::lock_guard slock(stream->mutex);
  return stream->completed >= seq ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

/// Waits for the captured work of `event` (returns at once if never recorded).
VSR_EMU_EXPORT CUresult cuEventSynchronize(CUevent event) {
  VSR_EMU_BEGIN("cuEventSynchronize");
  std::shared_ptr<Stream> stream;
  uint64_t seq = 0;
  VSR_EMU_TRY(event_target(event, &stream, &seq));
  if (stream != nullptr) wait_for(stream, seq);
  return CUDA_SUCCESS;
}

/// Destroys `event` at once, even while its captured work is pending. The handle is a tombstone
/// from then on.
VSR_EMU_EXPORT CUresult cuEventDestroy(CUevent event) {
  VSR_EMU_ENTRY("cuEventDestroy");
  std::shared_ptr<Event> ev;
  VSR_EMU_TRY(find_event(s, event, &ev));
  s.events.erase(event);
  retire_handle(s, event, 'e');
  return CUDA_SUCCESS;
}

/// Milliseconds between two completed, timed events.
VSR_EMU_EXPORT CUresult cuEventElapsedTime(float* ms, CUevent start, CUevent end) {
  VSR_EMU_ENTRY("cuEventElapsedTime");
  if (ms == nullptr) {
    VSR_EMU_TRY(need_current(s));
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::shared_ptr<Event> a;
  std::shared_ptr<Event> b;
  VSR_EMU_TRY(find_event(s, start, &a));
  VSR_EMU_TRY(find_event(s, end, &b));
  for (const auto* e : {a.get(), b.get()}) {
    if (!e->recorded || (e->flags & CU_EVENT_DISABLE_TIMING) != 0) {
      return CUDA_ERROR_INVALID_HANDLE;
    }
  }
  if (!a->time_set || !b->time_set) return CUDA_ERROR_NOT_READY;
  *ms = std::chrono::duration<float, std::milli>(b->time - a->time).count();
  return CUDA_SUCCESS;
}

// ============================== test control API ==============================

/// See vsr_emulator.h.
VSR_EMU_EXPORT int vsr_emu_stream_pause(CUstream stream, int paused) {
  State& s = st();
  std::lock_guard lock(s.mutex);
  std::shared_ptr<Stream> target;
  if (stream == nullptr || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD) {
    CUctx_st* ctx = nullptr;
    VSR_EMU_TRY(need_context(s, &ctx));
    if (!default_streams_async(s.config)) return CUDA_ERROR_NOT_SUPPORTED;
    target = stream == CU_STREAM_PER_THREAD ? per_thread_stream(s, ctx, true)
                                            : legacy_stream(s, ctx, true);
    if (target == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  } else {
    auto it = s.streams.find(stream);
    if (it == s.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
    if (it->second->inline_) return CUDA_ERROR_NOT_SUPPORTED;
    target = it->second;
  }
  {
    std::lock_guard slock(target->mutex);
    target->paused = paused != 0;
  }
  target->cv.notify_all();
  return CUDA_SUCCESS;
}

/// See vsr_emulator.h.
VSR_EMU_EXPORT unsigned long long vsr_emu_waiting_threads(void) {
  return g_waiting.load();
}
