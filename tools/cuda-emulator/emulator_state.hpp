// SPDX-License-Identifier: Apache-2.0
// The host emulator's shared state: configuration, contexts, streams, events and the VMM tables.
// One file per concept implements it: state.cpp the global state, the per-call checks and the
// memory accounting; devices.cpp initialization and devices; contexts.cpp contexts; vmm.cpp
// memory information and the VMM API; allocations.cpp classic device and pinned host allocations;
// copies.cpp copies and memset; streams.cpp streams and events; options.cpp the configuration,
// call accounting and the fault plan (the adversarial modes are options); control.cpp the
// outstanding-object queries; proc_address.cpp cuGetProcAddress; legacy_abi.cpp the old-ABI
// names. Driver rules are cited as §n of docs/cuda-driver-rules.md.
//
// Glossary: a reservation is a PROT_NONE anonymous mapping; a physical allocation ("handle") is
// a memfd; a mapping is the memfd mmap'ed MAP_FIXED into a reservation; access is mprotect; a
// linear allocation (cuMemAlloc/Async/Managed) and a pinned host allocation are anonymous mmaps.
// A stream is a FIFO of tasks run by one worker thread (or inline); stream and event handles are
// addresses in a PROT_NONE arena of the emulator, never the objects' own addresses, so a destroyed
// handle can be recognised (a tombstone) and, in one mode, handed out again at once.
//
// Locking: the global mutex (State::mutex) guards every table. A stream's own mutex guards its
// queue and counters; it is taken after the global one, never before it. No thread holds the
// global mutex while it runs a user host function or waits for a stream.
#pragma once

#include "emulator_internal.hpp"
#include "vsr_emulator.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace vsr::emu {
struct Stream;
}  // namespace vsr::emu

// A primary context (the only kind the emulator has).
struct CUctx_st {
  int device = 0;
  int refcount = 0;
  bool active = false;
  // Sticky error (§1.1): every later call that needs this context returns it.
  bool poisoned = false;
  // Non-sticky error of an asynchronous operation, reported once by the next synchronization.
  CUresult pending_error = CUDA_SUCCESS;
  // Bumped at every reset: per-thread streams of an older generation belong to a dead context.
  uint64_t generation = 0;
  // The legacy default stream's worker while default streams are asynchronous (made on first use).
  std::shared_ptr<vsr::emu::Stream> legacy;
};

namespace vsr::emu {

using Clock = std::chrono::steady_clock;

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kGiB = size_t{1} << 30;
constexpr size_t kLinearAlignment = 256;  // §3.5: cuMemAlloc pointers are >= 256-byte aligned

size_t page_size();
inline bool is_pow2(size_t v) {
  return v != 0 && (v & (v - 1)) == 0;
}
inline size_t round_up(size_t v, size_t a) {
  return (v + a - 1) / a * a;
}

struct Config {
  int device_count = 1;
  size_t device_memory = 8 * kGiB;
  size_t granularity = 2 * kMiB;
  size_t recommended_granularity = 0;    // 0: same as granularity
  size_t context_overhead = 0;           // bytes, or ...
  double context_overhead_fraction = 0;  // ... this fraction of device_memory when > 0
  bool vmm = true;
  bool managed = true;
  bool memory_pools = true;
  bool sync = false;
  bool sticky = true;
  bool report = false;
  int driver_version = 13000;
  // Adversarial modes (vsr_emulator.h); VSR_EMU_ADVERSARIAL turns on every one marked [A] (and
  // keeps the closed leniencies below on).
  bool async_default_streams = false;  // [A] legacy and per-thread default streams on workers
  bool recycle_handles = false;        // [A] destroyed handle values reused by the next create
  bool free_no_sync = false;           // [A] cuMemFree does not wait for queued work
  // [A] each task a stream worker runs first waits a random time up to this long (0: none), so
  // that work on different streams runs in any order their waits allow, and late.
  std::chrono::nanoseconds late_work{0};
  // Closed leniencies: on by default (vsr_emulator.h), and in adversarial mode.
  bool require_context = true;        // stream/event calls need a current context
  bool sticky_vmm = true;             // VMM calls report a pending sticky error
  size_t meminfo_quantum = 2 * kMiB;  // cuMemGetInfo's free rounded down to this multiple
  size_t address_space = 0;           // [A] bytes of reservations allowed (0: unlimited), or ...
  double address_space_factor = 0;    // ... this multiple of all devices' memory when > 0
  bool abort_on_misuse = false;       // stale handle or unmap under queued work: abort
  std::map<std::string, std::chrono::nanoseconds> latency;  // per base entry name
  std::string latency_spec;                                 // as given
};

bool parse_size(const char* text, size_t* out);
bool parse_bool(const char* text, bool* out);
void read_env(Config& c);
size_t context_overhead(const Config& c);
// 0 when unlimited.
size_t address_space_limit(const Config& c);
inline bool default_streams_async(const Config& c) {
  return c.async_default_streams && !c.sync;
}

enum class LinearKind { device, async, managed };

struct Linear {
  size_t size = 0;
  size_t mapped_size = 0;
  LinearKind kind = LinearKind::device;
  CUctx_st* ctx = nullptr;
  int device = 0;
  bool free_pending = false;  // cuMemFreeAsync queued
};

struct HostAlloc {
  size_t size = 0;
  size_t mapped_size = 0;
  CUctx_st* ctx = nullptr;
};

struct Physical {
  uint64_t id = 0;
  size_t size = 0;
  CUmemAllocationProp prop{};
  int device = 0;
  int fd = -1;
  size_t refs = 0;
  size_t maps = 0;
};

struct Mapping {
  size_t size = 0;
  size_t granule = 0;
  std::shared_ptr<Physical> physical;
  // access_[granule * device_count + device]
  std::vector<unsigned char> access;
};

struct FailRule {
  std::string entry;
  uint64_t n = 0;
  bool plus = false;
  bool has_error = false;
  CUresult error = CUDA_SUCCESS;
  bool at_run = false;  // `@run`: the call succeeds; its queued work faults when it runs
};

struct Device {
  size_t charged = 0;
  CUctx_st primary;
};

// The device memory a queued task will touch, for the unmap-under-queued-work check. `done` is
// set (global mutex held) once the task has run; tasks without device access carry none.
struct PendingAccess {
  struct Range {
    uintptr_t begin;
    uintptr_t end;
  };
  std::vector<Range> ranges;
  std::vector<uint64_t> physical;  // cuMemCreate ids mapped under the ranges at enqueue time
  bool done = false;
};

struct Task {
  std::function<void()> run;
  std::shared_ptr<PendingAccess> access;
};

enum class StreamKind { legacy, per_thread, created };

struct Stream {
  CUctx_st* ctx = nullptr;
  StreamKind kind = StreamKind::created;
  unsigned flags = 0;
  uint64_t ctx_generation = 0;
  CUstream handle = nullptr;  // created streams: the value cuStreamCreate handed out
  bool inline_ = false;       // created with SYNC=1: work runs in the submitting call
  bool destroyed = false;     // global mutex: cuStreamDestroy, thread exit or context reset
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<Task> queue;
  std::shared_ptr<PendingAccess> running;  // the task the worker has taken and not finished
  uint64_t submitted = 0;
  uint64_t completed = 0;
  bool paused = false;
  bool stopping = false;

  // Blocking streams synchronise with the legacy stream (§3.7); the per-thread one does too.
  bool blocking() const {
    return kind == StreamKind::per_thread ||
           (kind == StreamKind::created && (flags & CU_STREAM_NON_BLOCKING) == 0);
  }
};

struct Event {
  CUctx_st* ctx = nullptr;
  CUevent handle = nullptr;
  unsigned flags = 0;
  bool recorded = false;
  std::shared_ptr<Stream> stream;  // null when recorded on work that ran inline
  uint64_t seq = 0;
  uint64_t generation = 0;
  bool time_set = false;
  Clock::time_point time;
};

// Handle values for streams and events: addresses of a PROT_NONE arena, 16 bytes apart. A value
// is never reused while unused ones remain, except in RECYCLE_HANDLES mode, where the value most
// recently destroyed is handed out first (the real driver recycles handles: RMM #649).
struct HandleSpace {
  uintptr_t base = 0;
  size_t slots = 0;
  size_t next = 0;
  std::deque<uintptr_t> retired[2];  // destroyed stream [0] and event [1] values, oldest first
};

struct State {
  std::mutex mutex;
  Config config;
  Config env_config;  // as read from the environment (vsr_emu_set_option's "default")
  bool initialized = false;
  bool fail_env_read = false;
  std::vector<std::unique_ptr<Device>> devices;
  std::map<uintptr_t, size_t> reservations;
  size_t reserved_bytes = 0;
  std::unordered_map<uint64_t, std::shared_ptr<Physical>> handles;  // refs > 0
  size_t live_physical = 0;
  size_t live_physical_bytes = 0;
  std::vector<size_t> physical_per_device;
  std::vector<size_t> physical_bytes_per_device;
  uint64_t next_handle = 0;
  std::map<uintptr_t, Mapping> mappings;
  std::map<uintptr_t, Linear> linear;
  std::map<uintptr_t, HostAlloc> host;
  std::unordered_map<CUstream, std::shared_ptr<Stream>> streams;  // live created streams
  std::unordered_map<CUevent, std::shared_ptr<Event>> events;     // live events
  // Every stream object, also legacy, per-thread and destroyed ones whose work still runs.
  std::vector<std::weak_ptr<Stream>> all_streams;
  HandleSpace handle_space;
  std::unordered_map<uintptr_t, char> tombstones;  // destroyed value -> 's' stream, 'e' event
  uint64_t stale_handles = 0;
  uint64_t unmap_with_pending_work = 0;
  std::vector<FailRule> fail_plan;
  std::unordered_map<std::string, uint64_t> call_counts;
  std::unordered_map<std::string, uint64_t> fault_counts;  // calls the plan made fail
};

// Leaked on purpose: detached stream workers may still run while static destructors do.
State& st();

// The calling thread's current context (cuCtxSetCurrent).
extern thread_local CUctx_st* tl_current;

#define VSR_EMU_BEGIN(entry)                            \
  do {                                                  \
    CUresult injected_ = ::vsr::emu::begin_call(entry); \
    if (injected_ != CUDA_SUCCESS) return injected_;    \
  } while (0)

// The start of an entry point that works on the state: VSR_EMU_BEGIN, then `s` is the state and
// `lock` (a std::unique_lock, for entry points that wait) holds its mutex to the end of the scope.
#define VSR_EMU_ENTRY(entry)               \
  VSR_EMU_BEGIN(entry);                    \
  ::vsr::emu::State& s = ::vsr::emu::st(); \
  std::unique_lock lock(s.mutex)

// Returns the result of `check` (a need_* call or the like) unless it is CUDA_SUCCESS.
#define VSR_EMU_TRY(check)                                          \
  do {                                                              \
    if (const CUresult r_ = (check); r_ != CUDA_SUCCESS) return r_; \
  } while (0)

// --- options.cpp ---

// The fault the plan gave the calling thread's current call for when its queued work runs
// (an `@run` rule), or CUDA_SUCCESS; reading it clears it. Entry points whose work is queued
// (cuLaunchHostFunc) take it right after VSR_EMU_BEGIN.
CUresult take_run_fault();
// Records `error` as the result of queued work that faulted while it ran on `ctx` (global mutex
// not held): a sticky error (7xx, with STICKY) poisons the context, any other is the pending
// error the next synchronisation reports.
void fault_queued_work(CUctx_st* ctx, CUresult error);
// The late-work delay of the next task a stream worker runs (a random time up to LATE_WORK).
std::chrono::nanoseconds late_work_delay();

std::string base_name(std::string_view name);
bool valid_granularity(size_t g);
// Reads VSR_EMU_FAIL once, at the first cuInit (global mutex held).
void read_fail_env_once(State& s);
// Called (global mutex held) for a misuse of the driver the real one would not report: counts it
// in *counter and, with ABORT_ON_MISUSE, prints `what` with the entry point's name and aborts.
void misuse(State& s, uint64_t* counter, const std::string& what);

// --- state.cpp: per-call checks, device memory accounting (global mutex held) ---

CUresult need_init(State& s);
// NOT_SUPPORTED without VMM (VSR_EMU_VMM=0).
CUresult need_vmm(State& s);
CUresult need_device(State& s, CUdevice dev);
// §1.2: the calling thread's current context; poisoned contexts report the sticky error.
CUresult need_context(State& s, CUctx_st** out);
// Free bytes of device `dev`: capacity - charged - context overhead.
size_t device_free(State& s, int dev);
// Charges `bytes` to device `dev`; false (nothing charged) when they do not fit.
bool charge(State& s, int dev, size_t bytes);
void uncharge(State& s, int dev, size_t bytes);
// §4: the backing goes when the last reference and the last mapping are gone.
void maybe_destroy_physical(State& s, const std::shared_ptr<Physical>& p);
// The reservation containing address p, or s.reservations.end().
std::map<uintptr_t, size_t>::iterator containing_reservation(State& s, uintptr_t p);
// "[0x..., 0x...)" for messages.
std::string hex_range(uintptr_t begin, uintptr_t end);

// The entry of `m` (keyed by start address, with a .size) containing address p, or m.end().
template <typename T>
typename std::map<uintptr_t, T>::iterator containing(std::map<uintptr_t, T>& m, uintptr_t p) {
  auto it = m.upper_bound(p);
  if (it == m.begin()) return m.end();
  --it;
  return p < it->first + it->second.size ? it : m.end();
}

// --- allocations.cpp (global mutex held) ---

// Unmaps a linear allocation and uncharges its device.
void free_linear(State& s, std::map<uintptr_t, Linear>::iterator it);

// --- control.cpp ---

// Prints the outstanding objects to stderr (VSR_EMU_REPORT=1, at exit).
void print_report();

// --- streams.cpp ---

struct StreamRef {
  StreamKind kind = StreamKind::legacy;
  std::shared_ptr<Stream> stream;  // created streams
  CUctx_st* ctx = nullptr;
};

// Resolves a stream handle (global mutex held). `ptds`: stream 0 is the per-thread stream.
// Default streams need a current context; created streams carry their own (unless
// REQUIRE_CONTEXT). A destroyed handle is a stale use.
CUresult resolve_stream(State& s, CUstream handle, bool ptds, StreamRef* out);

struct SubmitOptions {
  std::shared_ptr<PendingAccess> access;         // device memory the task touches
  uint64_t* seq = nullptr;                       // queued: the task's sequence number (else 0)
  std::shared_ptr<Stream>* queued_on = nullptr;  // queued: the stream it went to
  bool host_wait = false;    // a host-synchronous call: wait for the task, return its result
  bool drain_first = false;  // wait for the stream's earlier work before queueing (§3.6 HtoD)
};

// Runs `task` in stream order. `lock` is the held global lock. Work that runs inline (inline
// streams; default streams unless ASYNC_DEFAULT_STREAMS) releases the lock and returns the task's
// result; so does host_wait. Queued work keeps the lock held and returns CUDA_SUCCESS; failures
// are then reported through the context. The task's argument says whether it runs queued.
CUresult submit(std::unique_lock<std::mutex>& lock, const StreamRef& ref,
                std::function<CUresult(bool)> task, const SubmitOptions& options = {});

using WaitList = std::vector<std::pair<std::shared_ptr<Stream>, uint64_t>>;
// All work submitted so far to any stream of `ctx`: created, destroyed but still draining, legacy
// and per-thread streams (global mutex held).
WaitList context_work(State& s, CUctx_st* ctx);
// Waits (no global mutex held) until each stream reached its sequence number.
void wait_all(const WaitList& list);
// Is queued, not yet run work touching [begin, end) or the physical allocation `physical` (0:
// none)? Global mutex held.
bool pending_work_overlaps(State& s, uintptr_t begin, uintptr_t end, uint64_t physical = 0);
// Primary context reset: waits for and stops its streams, drops its events (tombstoned).
void reset_context_streams(std::unique_lock<std::mutex>& lock, CUctx_st* ctx);
CUresult sync_result(CUctx_st* ctx);

}  // namespace vsr::emu
