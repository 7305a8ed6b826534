// SPDX-License-Identifier: Apache-2.0
// The host CUDA driver emulator: devices, contexts, VMM, classic allocations, copies, streams and
// events backed by host memory. Rules and error codes follow
// /work/shared/reference/cuda-vmm-semantics.md (cited as §n below).
//
// Glossary: a reservation is a PROT_NONE anonymous mapping; a physical allocation ("handle") is
// a memfd; a mapping is the memfd mmap'ed MAP_FIXED into a reservation; access is mprotect; a
// linear allocation (cuMemAlloc/Async/Managed) and a pinned host allocation are anonymous mmaps.
// All tables live behind one global mutex, which is never held while a user host function runs
// or while a thread waits for a stream.
#include "emulator_internal.hpp"
#include "vsr_emulator.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <vector>

struct CUstream_st;
struct CUevent_st;

struct CUctx_st {
  int device = 0;
  int refcount = 0;
  bool active = false;
  // Sticky error (§1.1): every later call that needs this context returns it.
  bool poisoned = false;
  // Non-sticky error of an asynchronous operation, reported once by the next synchronization.
  CUresult pending_error = CUDA_SUCCESS;
};

// A created stream: a FIFO run by its own worker thread, or inline when created with SYNC=1.
struct CUstream_st {
  CUctx_st* ctx = nullptr;
  unsigned flags = 0;
  bool inline_ = false;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  uint64_t submitted_ = 0;
  uint64_t completed_ = 0;
  bool paused_ = false;
  bool stopping_ = false;
};

struct CUevent_st {
  CUctx_st* ctx = nullptr;
  unsigned flags = 0;
  bool recorded = false;
  std::shared_ptr<CUstream_st> stream;  // null when recorded on an inline (default) stream
  uint64_t seq = 0;
  uint64_t generation = 0;
  bool time_set = false;
  std::chrono::steady_clock::time_point time;
};

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kGiB = size_t{1} << 30;
constexpr size_t kLinearAlignment = 256;  // §3.5: cuMemAlloc pointers are >= 256-byte aligned

size_t page_size() {
  static const size_t size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return size;
}

bool is_pow2(size_t v) {
  return v != 0 && (v & (v - 1)) == 0;
}
size_t round_up(size_t v, size_t a) {
  return (v + a - 1) / a * a;
}

struct Config {
  int device_count = 1;
  size_t device_memory = 8 * kGiB;
  size_t granularity = 2 * kMiB;
  size_t recommended_granularity = 0;  // 0: same as granularity
  size_t context_overhead = 0;
  bool vmm = true;
  bool managed = true;
  bool memory_pools = true;
  bool sync = false;
  bool sticky = true;
  bool report = false;
  int driver_version = 13000;
};

bool parse_size(const char* text, size_t* out) {
  if (text == nullptr || *text == '\0') return false;
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(text, &end, 10);
  if (errno != 0 || *end != '\0' || text[0] == '-') return false;
  *out = static_cast<size_t>(v);
  return true;
}

bool parse_bool(const char* text, bool* out) {
  if (text == nullptr) return false;
  std::string_view v(text);
  if (v == "1" || v == "true" || v == "on") {
    *out = true;
  } else if (v == "0" || v == "false" || v == "off") {
    *out = false;
  } else {
    return false;
  }
  return true;
}

bool valid_granularity(size_t g) {
  return is_pow2(g) && g % page_size() == 0;
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
};

struct Device {
  size_t charged = 0;
  CUctx_st primary;
};

struct State {
  std::mutex mutex;
  Config config;
  bool initialized = false;
  bool fail_env_read = false;
  std::vector<std::unique_ptr<Device>> devices;
  std::map<uintptr_t, size_t> reservations;
  std::unordered_map<uint64_t, std::shared_ptr<Physical>> handles;  // refs > 0
  size_t live_physical = 0;
  size_t live_physical_bytes = 0;
  std::vector<size_t> physical_per_device;
  std::vector<size_t> physical_bytes_per_device;
  uint64_t next_handle = 0;
  std::map<uintptr_t, Mapping> mappings;
  std::map<uintptr_t, Linear> linear;
  std::map<uintptr_t, HostAlloc> host;
  std::unordered_map<CUstream_st*, std::shared_ptr<CUstream_st>> streams;
  std::unordered_map<CUevent_st*, std::shared_ptr<CUevent_st>> events;
  std::vector<FailRule> fail_plan;
  std::unordered_map<std::string, uint64_t> call_counts;
};

thread_local CUctx_st* tl_current = nullptr;

void read_env(Config& c) {
  auto warn = [](const char* name) {
    std::fprintf(stderr, "vsr-cuda-emulator: ignoring bad %s\n", name);
  };
  auto size_env = [&](const char* name, size_t* out) {
    const char* v = std::getenv(name);
    if (v != nullptr && !parse_size(v, out)) warn(name);
  };
  auto bool_env = [&](const char* name, bool* out) {
    const char* v = std::getenv(name);
    if (v != nullptr && !parse_bool(v, out)) warn(name);
  };
  size_t count = static_cast<size_t>(c.device_count);
  size_env("VSR_EMU_DEVICE_COUNT", &count);
  c.device_count = static_cast<int>(std::min<size_t>(count, 64));
  size_env("VSR_EMU_DEVICE_MEMORY", &c.device_memory);
  size_t g = c.granularity;
  size_env("VSR_EMU_GRANULARITY", &g);
  if (valid_granularity(g)) {
    c.granularity = g;
  } else {
    warn("VSR_EMU_GRANULARITY");
  }
  size_t rec = 0;
  size_env("VSR_EMU_RECOMMENDED_GRANULARITY", &rec);
  if (rec != 0 && rec % c.granularity == 0) {
    c.recommended_granularity = rec;
  } else if (rec != 0) {
    warn("VSR_EMU_RECOMMENDED_GRANULARITY");
  }
  size_env("VSR_EMU_CONTEXT_OVERHEAD", &c.context_overhead);
  bool_env("VSR_EMU_VMM", &c.vmm);
  bool_env("VSR_EMU_MANAGED", &c.managed);
  bool_env("VSR_EMU_MEMORY_POOLS", &c.memory_pools);
  bool_env("VSR_EMU_SYNC", &c.sync);
  bool_env("VSR_EMU_STICKY", &c.sticky);
  bool_env("VSR_EMU_REPORT", &c.report);
  size_t version = static_cast<size_t>(c.driver_version);
  size_env("VSR_EMU_DRIVER_VERSION", &version);
  c.driver_version = static_cast<int>(version);
}

void print_report();

// Leaked on purpose: detached stream workers may still run while static destructors do.
State& st() {
  static State* state = [] {
    auto* s = new State;
    read_env(s->config);
    for (int i = 0; i < s->config.device_count; ++i) {
      auto d = std::make_unique<Device>();
      d->primary.device = i;
      s->devices.push_back(std::move(d));
    }
    s->physical_per_device.assign(static_cast<size_t>(s->config.device_count), 0);
    s->physical_bytes_per_device.assign(static_cast<size_t>(s->config.device_count), 0);
    if (s->config.report) std::atexit(print_report);
    return s;
  }();
  return *state;
}

std::string base_name(std::string_view name) {
  for (std::string_view suffix : {"_ptsz", "_ptds"}) {
    if (name.size() > suffix.size() && name.substr(name.size() - suffix.size()) == suffix) {
      name.remove_suffix(suffix.size());
    }
  }
  size_t pos = name.rfind("_v");
  if (pos != std::string_view::npos && pos + 2 < name.size() &&
      name.find_first_not_of("0123456789", pos + 2) == std::string_view::npos) {
    name = name.substr(0, pos);
  }
  return std::string(name);
}

bool parse_plan(const char* spec, std::vector<FailRule>* out) {
  std::vector<FailRule> plan;
  std::string_view rest = spec != nullptr ? spec : "";
  while (!rest.empty()) {
    size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (item.empty()) continue;
    size_t c1 = item.find(':');
    if (c1 == std::string_view::npos || c1 == 0) return false;
    FailRule rule;
    rule.entry = base_name(item.substr(0, c1));
    std::string_view count = item.substr(c1 + 1);
    size_t c2 = count.find(':');
    std::string_view err = c2 == std::string_view::npos ? std::string_view{} : count.substr(c2 + 1);
    count = count.substr(0, c2);
    if (!count.empty() && count.back() == '+') {
      rule.plus = true;
      count.remove_suffix(1);
    }
    if (count.empty() || count.find_first_not_of("0123456789") != std::string_view::npos) {
      return false;
    }
    rule.n = std::strtoull(std::string(count).c_str(), nullptr, 10);
    if (rule.n == 0) return false;
    if (c2 != std::string_view::npos) {
      if (!vsr::emu::error_by_name(err, &rule.error) || rule.error == CUDA_SUCCESS) return false;
      rule.has_error = true;
    }
    plan.push_back(std::move(rule));
  }
  *out = std::move(plan);
  return true;
}

// --- per-call helpers (called with the global mutex held) ---------------------------------

CUresult need_init(State& s) {
  return s.initialized ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

CUresult need_vmm(State& s) {
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  return s.config.vmm ? CUDA_SUCCESS : CUDA_ERROR_NOT_SUPPORTED;
}

CUresult need_device(State& s, CUdevice dev) {
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  return dev >= 0 && dev < s.config.device_count ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

// §1.2: the calling thread's current context; poisoned contexts report the sticky error.
CUresult need_context(State& s, CUctx_st** out) {
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (tl_current == nullptr || !tl_current->active) return CUDA_ERROR_INVALID_CONTEXT;
  if (tl_current->poisoned) return CUDA_ERROR_ILLEGAL_ADDRESS;
  *out = tl_current;
  return CUDA_SUCCESS;
}

size_t device_free(State& s, int dev) {
  size_t used = s.devices[static_cast<size_t>(dev)]->charged + s.config.context_overhead;
  return used >= s.config.device_memory ? 0 : s.config.device_memory - used;
}

bool charge(State& s, int dev, size_t bytes) {
  if (bytes > device_free(s, dev)) return false;
  s.devices[static_cast<size_t>(dev)]->charged += bytes;
  return true;
}

void uncharge(State& s, int dev, size_t bytes) {
  s.devices[static_cast<size_t>(dev)]->charged -= bytes;
}

// §4: the backing goes when the last reference and the last mapping are gone.
void maybe_destroy_physical(State& s, const std::shared_ptr<Physical>& p) {
  if (p->refs != 0 || p->maps != 0 || p->fd < 0) return;
  close(p->fd);
  p->fd = -1;
  uncharge(s, p->device, p->size);
  s.live_physical--;
  s.live_physical_bytes -= p->size;
  s.physical_per_device[static_cast<size_t>(p->device)]--;
  s.physical_bytes_per_device[static_cast<size_t>(p->device)] -= p->size;
}

template <typename T>
typename std::map<uintptr_t, T>::iterator containing(std::map<uintptr_t, T>& m, uintptr_t p) {
  auto it = m.upper_bound(p);
  if (it == m.begin()) return m.end();
  --it;
  return p < it->first + it->second.size ? it : m.end();
}

std::map<uintptr_t, size_t>::iterator containing_reservation(State& s, uintptr_t p) {
  auto it = s.reservations.upper_bound(p);
  if (it == s.reservations.begin()) return s.reservations.end();
  --it;
  return p < it->first + it->second ? it : s.reservations.end();
}

// Calls f(mapping_iterator, first_byte, end_byte) for each mapping piece of [p, p+n); false if
// any byte of the range is not mapped.
template <typename F>
bool for_each_mapped(State& s, uintptr_t p, size_t n, F&& f) {
  uintptr_t end = p + n;
  if (end < p) return false;
  auto it = containing(s.mappings, p);
  uintptr_t cur = p;
  while (cur < end) {
    if (it == s.mappings.end() || it->first > cur || cur >= it->first + it->second.size) {
      return false;
    }
    uintptr_t piece_end = std::min<uintptr_t>(end, it->first + it->second.size);
    cur = piece_end;
    ++it;
  }
  it = containing(s.mappings, p);
  cur = p;
  while (cur < end) {
    uintptr_t piece_end = std::min<uintptr_t>(end, it->first + it->second.size);
    f(it, cur, piece_end);
    cur = piece_end;
    ++it;
  }
  return true;
}

// The verdict on a device range: usable, not a device range at all (INVALID_VALUE, §3.6 "invalid
// range"), or VMM address space the device may not touch (a fault: 700, §3.6 / invariant 6).
enum class RangeCheck { ok, invalid, fault };

// §3.6 / invariant 6: may a device access [p, p+n) (write or read)?
RangeCheck device_range_check(State& s, uintptr_t p, size_t n, int device, bool write) {
  if (n == 0) return RangeCheck::ok;
  if (p + n < p) return RangeCheck::invalid;
  auto lin = containing(s.linear, p);
  if (lin != s.linear.end()) {
    return p + n <= lin->first + lin->second.size ? RangeCheck::ok : RangeCheck::invalid;
  }
  auto host = containing(s.host, p);
  if (host != s.host.end()) {
    return p + n <= host->first + host->second.size ? RangeCheck::ok : RangeCheck::invalid;
  }
  if (containing_reservation(s, p) == s.reservations.end()) return RangeCheck::invalid;
  const auto ndev = static_cast<size_t>(s.config.device_count);
  bool ok = true;
  bool mapped = for_each_mapped(s, p, n, [&](auto it, uintptr_t a, uintptr_t b) {
    const Mapping& m = it->second;
    size_t first = (a - it->first) / m.granule;
    size_t last = (b - 1 - it->first) / m.granule;
    for (size_t g = first; g <= last; ++g) {
      unsigned char acc = m.access[g * ndev + static_cast<size_t>(device)];
      if (write ? acc != CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                : acc == CU_MEM_ACCESS_FLAGS_PROT_NONE) {
        ok = false;
      }
    }
  });
  return mapped && ok ? RangeCheck::ok : RangeCheck::fault;
}

// A device access fault: sticky 700 (poisoning the context) or, with STICKY=0, INVALID_VALUE.
CUresult fault(State& s, CUctx_st* ctx, bool async) {
  if (s.config.sticky) {
    ctx->poisoned = true;
    return CUDA_ERROR_ILLEGAL_ADDRESS;
  }
  if (async && ctx->pending_error == CUDA_SUCCESS) ctx->pending_error = CUDA_ERROR_INVALID_VALUE;
  return CUDA_ERROR_INVALID_VALUE;
}

// --- streams -------------------------------------------------------------------------------

void worker_loop(std::shared_ptr<CUstream_st> stream) {
  std::unique_lock lock(stream->mutex_);
  for (;;) {
    stream->cv_.wait(lock, [&] {
      return (!stream->queue_.empty() && !stream->paused_) ||
             (stream->stopping_ && stream->queue_.empty());
    });
    if (stream->queue_.empty()) return;
    std::function<void()> task = std::move(stream->queue_.front());
    stream->queue_.pop_front();
    lock.unlock();
    task();
    task = nullptr;
    lock.lock();
    stream->completed_++;
    stream->cv_.notify_all();
  }
}

void wait_for(const std::shared_ptr<CUstream_st>& stream, uint64_t seq) {
  std::unique_lock lock(stream->mutex_);
  stream->cv_.wait(lock, [&] { return stream->completed_ >= seq; });
}

uint64_t submitted(const std::shared_ptr<CUstream_st>& stream) {
  std::lock_guard lock(stream->mutex_);
  return stream->submitted_;
}

enum class StreamKind { legacy, per_thread, created };

struct StreamRef {
  StreamKind kind = StreamKind::legacy;
  std::shared_ptr<CUstream_st> stream;
  CUctx_st* ctx = nullptr;
};

// Resolves a stream handle (global mutex held). `ptds`: stream 0 is the per-thread stream.
// Default streams need a current context; created streams carry their own.
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
  auto it = s.streams.find(handle);
  if (it == s.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
  CUctx_st* ctx = it->second->ctx;
  if (!ctx->active) return CUDA_ERROR_INVALID_CONTEXT;
  if (ctx->poisoned) return CUDA_ERROR_ILLEGAL_ADDRESS;
  out->kind = StreamKind::created;
  out->stream = it->second;
  out->ctx = ctx;
  return CUDA_SUCCESS;
}

// Streams of `ctx` (all, or only the blocking ones) with their submission counts.
std::vector<std::pair<std::shared_ptr<CUstream_st>, uint64_t>> snapshot_streams(State& s,
                                                                                CUctx_st* ctx,
                                                                                bool blocking) {
  std::vector<std::pair<std::shared_ptr<CUstream_st>, uint64_t>> out;
  for (auto& [raw, stream] : s.streams) {
    if (stream->ctx != ctx || (blocking && (stream->flags & CU_STREAM_NON_BLOCKING) != 0)) {
      continue;
    }
    out.emplace_back(stream, submitted(stream));
  }
  return out;
}

void wait_all(const std::vector<std::pair<std::shared_ptr<CUstream_st>, uint64_t>>& streams) {
  for (const auto& [stream, seq] : streams) wait_for(stream, seq);
}

// Runs `task` in stream order; `lock` is the held global lock. Inline execution (legacy and
// per-thread default streams, SYNC streams) releases the lock and returns the task's result.
// Queued work keeps the lock held, stores the work's sequence number in *seq (if given) and
// reports failures through the context. The task's argument says whether it was queued.
CUresult submit(std::unique_lock<std::mutex>& lock, const StreamRef& ref,
                std::function<CUresult(bool)> task, uint64_t* seq = nullptr) {
  State& s = st();
  if (ref.kind == StreamKind::legacy) {
    // The legacy default stream waits for all blocking streams of its context (§3.7).
    auto blocking = snapshot_streams(s, ref.ctx, true);
    lock.unlock();
    wait_all(blocking);
    return task(false);
  }
  if (ref.kind == StreamKind::per_thread || ref.stream->inline_) {
    if (ref.kind == StreamKind::created) {
      std::lock_guard slock(ref.stream->mutex_);
      ref.stream->submitted_++;
      ref.stream->completed_++;
    }
    lock.unlock();
    return task(false);
  }
  {
    std::lock_guard slock(ref.stream->mutex_);
    ref.stream->queue_.push_back([task = std::move(task)] { task(true); });
    ref.stream->submitted_++;
    if (seq != nullptr) *seq = ref.stream->submitted_;
  }
  ref.stream->cv_.notify_all();
  return CUDA_SUCCESS;
}

CUresult sync_result(CUctx_st* ctx) {
  if (ctx->poisoned) return CUDA_ERROR_ILLEGAL_ADDRESS;
  CUresult r = ctx->pending_error;
  ctx->pending_error = CUDA_SUCCESS;
  return r;
}

// --- copies --------------------------------------------------------------------------------

enum class CopyKind { htod, dtoh, dtod, memset8, memset32 };

struct CopyOp {
  CopyKind kind;
  uintptr_t dst;
  uintptr_t src;
  size_t bytes;
  unsigned value;
};

// Validates the device side(s) of `op` for the device of `ctx` (global mutex held).
RangeCheck copy_ranges_check(State& s, const CopyOp& op, int device) {
  switch (op.kind) {
    case CopyKind::htod:
    case CopyKind::memset8:
    case CopyKind::memset32:
      return device_range_check(s, op.dst, op.bytes, device, true);
    case CopyKind::dtoh:
      return device_range_check(s, op.src, op.bytes, device, false);
    case CopyKind::dtod: {
      const RangeCheck a = device_range_check(s, op.src, op.bytes, device, false);
      const RangeCheck b = device_range_check(s, op.dst, op.bytes, device, true);
      return a == RangeCheck::ok ? b : a;
    }
  }
  return RangeCheck::invalid;
}

// INVALID_VALUE for a range that is no device memory; a fault for forbidden VMM memory.
CUresult range_error(State& s, CUctx_st* ctx, RangeCheck check, bool async) {
  if (check == RangeCheck::fault) return fault(s, ctx, async);
  if (async && ctx->pending_error == CUDA_SUCCESS) ctx->pending_error = CUDA_ERROR_INVALID_VALUE;
  return CUDA_ERROR_INVALID_VALUE;
}

// Executes `op`; the global mutex is held during the copy so that no unmap races it.
CUresult run_copy(CUctx_st* ctx, const CopyOp& op, bool async) {
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (ctx->poisoned) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (const RangeCheck c = copy_ranges_check(s, op, ctx->device); c != RangeCheck::ok) {
    return range_error(s, ctx, c, async);
  }
  auto* dst = reinterpret_cast<unsigned char*>(op.dst);
  const auto* src = reinterpret_cast<const unsigned char*>(op.src);
  switch (op.kind) {
    case CopyKind::htod:
    case CopyKind::dtoh:
    case CopyKind::dtod:
      std::memmove(dst, src, op.bytes);
      break;
    case CopyKind::memset8:
      std::memset(dst, static_cast<int>(op.value & 0xff), op.bytes);
      break;
    case CopyKind::memset32: {
      auto v = static_cast<uint32_t>(op.value);
      for (size_t i = 0; i < op.bytes; i += 4) std::memcpy(dst + i, &v, 4);
      break;
    }
  }
  return CUDA_SUCCESS;
}

CUresult copy_entry(const char* entry, CopyOp op, CUstream stream, bool ptds) {
  CUresult injected = vsr::emu::begin_call(entry);
  if (injected != CUDA_SUCCESS) return injected;
  State& s = st();
  std::unique_lock lock(s.mutex);
  StreamRef ref;
  CUresult r = resolve_stream(s, stream, ptds, &ref);
  if (r != CUDA_SUCCESS) return r;
  if (op.bytes == 0) return CUDA_SUCCESS;
  if ((op.kind == CopyKind::htod && op.src == 0) || (op.kind == CopyKind::dtoh && op.dst == 0)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (op.kind == CopyKind::memset32 && op.dst % 4 != 0) return CUDA_ERROR_INVALID_VALUE;
  // Checked at enqueue so that the caller sees the fault at once; checked again when it runs.
  if (const RangeCheck c = copy_ranges_check(s, op, ref.ctx->device); c != RangeCheck::ok) {
    return range_error(s, ref.ctx, c, false);
  }
  CUctx_st* ctx = ref.ctx;
  return submit(lock, ref, [ctx, op](bool queued) { return run_copy(ctx, op, queued); });
}

// --- linear allocations --------------------------------------------------------------------

void* map_anonymous(size_t bytes, size_t* mapped) {
  *mapped = round_up(bytes, page_size());
  void* p = mmap(nullptr, *mapped, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

CUresult alloc_linear(State& s, CUctx_st* ctx, size_t bytes, LinearKind kind, CUdeviceptr* out) {
  if (!charge(s, ctx->device, bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
  size_t mapped = 0;
  void* p = map_anonymous(bytes, &mapped);
  if (p == nullptr) {
    uncharge(s, ctx->device, bytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  static_assert(kLinearAlignment <= 4096);
  s.linear[reinterpret_cast<uintptr_t>(p)] = Linear{bytes, mapped, kind, ctx, ctx->device, false};
  *out = reinterpret_cast<CUdeviceptr>(p);
  return CUDA_SUCCESS;
}

void free_linear(State& s, std::map<uintptr_t, Linear>::iterator it) {
  uncharge(s, it->second.device, it->second.size);
  munmap(reinterpret_cast<void*>(it->first), it->second.mapped_size);
  s.linear.erase(it);
}

// Primary context reset (§3.2): its streams, events and allocations go.
void reset_context(std::unique_lock<std::mutex>& lock, CUctx_st* ctx) {
  State& s = st();
  auto all = snapshot_streams(s, ctx, false);
  lock.unlock();
  wait_all(all);
  lock.lock();
  for (auto it = s.streams.begin(); it != s.streams.end();) {
    if (it->second->ctx == ctx) {
      {
        std::lock_guard slock(it->second->mutex_);
        it->second->stopping_ = true;
        it->second->paused_ = false;
      }
      it->second->cv_.notify_all();
      it = s.streams.erase(it);
    } else {
      ++it;
    }
  }
  std::erase_if(s.events, [&](const auto& e) { return e.second->ctx == ctx; });
  for (auto it = s.linear.begin(); it != s.linear.end();) {
    auto next = std::next(it);
    if (it->second.ctx == ctx) free_linear(s, it);
    it = next;
  }
  for (auto it = s.host.begin(); it != s.host.end();) {
    if (it->second.ctx == ctx) {
      munmap(reinterpret_cast<void*>(it->first), it->second.mapped_size);
      it = s.host.erase(it);
    } else {
      ++it;
    }
  }
  ctx->poisoned = false;
  ctx->pending_error = CUDA_SUCCESS;
  ctx->active = false;
}

void print_report() {
  vsr_emu_outstanding o{};
  vsr_emu_query_outstanding(&o, -1);
  std::fprintf(stderr,
               "vsr-cuda-emulator outstanding: reservations=%zu (%zu B) handles=%zu (%zu B) "
               "mappings=%zu allocations=%zu (%zu B) managed=%zu (%zu B) host=%zu (%zu B) "
               "streams=%zu events=%zu\n",
               o.reservations, o.reserved_bytes, o.handles, o.physical_bytes, o.mappings,
               o.allocations, o.allocation_bytes, o.managed, o.managed_bytes, o.host_allocations,
               o.host_bytes, o.streams, o.events);
}

bool is_allocating(std::string_view entry) {
  for (std::string_view e : {"cuMemCreate", "cuMemAlloc", "cuMemAllocManaged", "cuMemAllocAsync",
                             "cuMemHostAlloc", "cuMemAllocHost", "cuMemAddressReserve"}) {
    if (entry == e) return true;
  }
  return false;
}

int attribute_value(const Config& c, CUdevice dev, int attrib, bool* known) {
  *known = true;
  switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
      return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X:
      return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y:
      return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z:
      return 64;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X:
      return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y:
      return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z:
      return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK:
      return 49152;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY:
      return 65536;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE:
      return 32;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH:
      return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK:
      return 65536;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE:
      return 1980000;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT:
      return 512;
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP:
      return 1;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
      return 132;
    case CU_DEVICE_ATTRIBUTE_INTEGRATED:
      return 0;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
      return 1;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE:
      return CU_COMPUTEMODE_DEFAULT;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
      return 1;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED:
      return 1;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
      return dev + 1;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID:
      return 0;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID:
      return 0;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE:
      return 2619000;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH:
      return 5120;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE:
      return 50 * 1024 * 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR:
      return 2048;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT:
      return 3;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
      return 1;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
      return 9;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
      return 0;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
      return c.managed ? 1 : 0;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
      return c.managed ? 1 : 0;
    case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS:
      return 0;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN:
      return 232448;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
      return c.vmm ? 1 : 0;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
      return c.vmm ? 1 : 0;
    case CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED:
      return 0;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED:
      return 0;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
      return c.memory_pools ? 1 : 0;
    case CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES:
      return 0;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED:
      return 0;
    case CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED:
      return 0;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
      return 0;
    case CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
      return 0;
    default:
      // Other valid attributes report 0 (a capability the emulator does not have); values outside
      // the enum are INVALID_VALUE (§1.3).
      *known = attrib > 0 && attrib < CU_DEVICE_ATTRIBUTE_MAX;
      return 0;
  }
}

}  // namespace

namespace vsr::emu {

CUresult begin_call(const char* entry, bool allocating) {
  State& s = st();
  std::lock_guard lock(s.mutex);
  std::string name(entry);
  uint64_t n = ++s.call_counts[name];
  for (const FailRule& rule : s.fail_plan) {
    if (rule.entry != name) continue;
    if (n == rule.n || (rule.plus && n > rule.n)) {
      if (rule.has_error) return rule.error;
      return allocating || is_allocating(name) ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_UNKNOWN;
    }
  }
  return CUDA_SUCCESS;
}

int driver_version() {
  State& s = st();
  std::lock_guard lock(s.mutex);
  return s.config.driver_version;
}

}  // namespace vsr::emu

using vsr::emu::begin_call;

#define VSR_EMU_BEGIN(entry)                         \
  do {                                               \
    CUresult injected_ = begin_call(entry);          \
    if (injected_ != CUDA_SUCCESS) return injected_; \
  } while (0)

// ============================== initialization and devices ==============================

/// Initializes the emulator (flags must be 0). Reads VSR_EMU_FAIL at the first call. With
/// VSR_EMU_DEVICE_COUNT=0 it fails with CUDA_ERROR_NO_DEVICE and the library stays uninitialized.
VSR_EMU_EXPORT CUresult cuInit(unsigned int flags) {
  {
    State& s = st();
    std::lock_guard lock(s.mutex);
    if (!s.fail_env_read) {
      s.fail_env_read = true;
      const char* spec = std::getenv("VSR_EMU_FAIL");
      if (spec != nullptr && !parse_plan(spec, &s.fail_plan)) {
        std::fprintf(stderr, "vsr-cuda-emulator: ignoring bad VSR_EMU_FAIL\n");
      }
      s.call_counts.clear();
    }
  }
  VSR_EMU_BEGIN("cuInit");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (s.config.device_count == 0) return CUDA_ERROR_NO_DEVICE;
  s.initialized = true;
  return CUDA_SUCCESS;
}

/// Writes the emulated driver version (VSR_EMU_DRIVER_VERSION, default 13000). Works before cuInit.
VSR_EMU_EXPORT CUresult cuDriverGetVersion(int* version) {
  VSR_EMU_BEGIN("cuDriverGetVersion");
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *version = vsr::emu::driver_version();
  return CUDA_SUCCESS;
}

/// Writes the number of emulated devices (VSR_EMU_DEVICE_COUNT).
VSR_EMU_EXPORT CUresult cuDeviceGetCount(int* count) {
  VSR_EMU_BEGIN("cuDeviceGetCount");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_init(s); r != CUDA_SUCCESS) return r;
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *count = s.config.device_count;
  return CUDA_SUCCESS;
}

/// Writes the device handle of `ordinal` (the ordinal itself).
VSR_EMU_EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  VSR_EMU_BEGIN("cuDeviceGet");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_init(s); r != CUDA_SUCCESS) return r;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = need_device(s, ordinal); r != CUDA_SUCCESS) return r;
  *device = ordinal;
  return CUDA_SUCCESS;
}

/// Writes an attribute of `dev` (an H100-like 9.0 device; feature attributes follow the options).
VSR_EMU_EXPORT CUresult cuDeviceGetAttribute(int* value, CUdevice_attribute attrib, CUdevice dev) {
  VSR_EMU_BEGIN("cuDeviceGetAttribute");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_device(s, dev); r != CUDA_SUCCESS) return r;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  bool known = false;
  int v = attribute_value(s.config, dev, static_cast<int>(attrib), &known);
  if (!known) return CUDA_ERROR_INVALID_VALUE;
  *value = v;
  return CUDA_SUCCESS;
}

/// Writes the device name ("vibespatial-raster host emulator"), truncated to `len` bytes.
VSR_EMU_EXPORT CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  VSR_EMU_BEGIN("cuDeviceGetName");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_device(s, dev); r != CUDA_SUCCESS) return r;
  if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  std::snprintf(name, static_cast<size_t>(len), "%s", "vibespatial-raster host emulator");
  return CUDA_SUCCESS;
}

/// Writes the emulated capacity of `dev` (VSR_EMU_DEVICE_MEMORY).
VSR_EMU_EXPORT CUresult cuDeviceTotalMem(size_t* bytes, CUdevice dev) {
  VSR_EMU_BEGIN("cuDeviceTotalMem");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_device(s, dev); r != CUDA_SUCCESS) return r;
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *bytes = s.config.device_memory;
  return CUDA_SUCCESS;
}

// ============================== contexts ==============================

/// Retains (and activates) the primary context of `dev`; every call returns the same handle.
VSR_EMU_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice dev) {
  VSR_EMU_BEGIN("cuDevicePrimaryCtxRetain");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_device(s, dev); r != CUDA_SUCCESS) return r;
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUctx_st& primary = s.devices[static_cast<size_t>(dev)]->primary;
  primary.refcount++;
  primary.active = true;
  *ctx = &primary;
  return CUDA_SUCCESS;
}

/// Drops one retain of the primary context of `dev`; at zero the context is reset: its streams,
/// events, cuMemAlloc/Async/Managed and host allocations are destroyed (§3.2).
VSR_EMU_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  VSR_EMU_BEGIN("cuDevicePrimaryCtxRelease");
  State& s = st();
  std::unique_lock lock(s.mutex);
  if (CUresult r = need_device(s, dev); r != CUDA_SUCCESS) return r;
  CUctx_st& primary = s.devices[static_cast<size_t>(dev)]->primary;
  if (primary.refcount == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (--primary.refcount == 0) reset_context(lock, &primary);
  return CUDA_SUCCESS;
}

/// Writes the primary context's flags (always 0) and whether it is active.
VSR_EMU_EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
  VSR_EMU_BEGIN("cuDevicePrimaryCtxGetState");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_device(s, dev); r != CUDA_SUCCESS) return r;
  if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *flags = 0;
  *active = s.devices[static_cast<size_t>(dev)]->primary.active ? 1 : 0;
  return CUDA_SUCCESS;
}

/// Binds `ctx` (a primary context handle, or NULL to unbind) to the calling thread.
VSR_EMU_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
  VSR_EMU_BEGIN("cuCtxSetCurrent");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_init(s); r != CUDA_SUCCESS) return r;
  if (ctx != nullptr) {
    bool found = false;
    for (auto& d : s.devices) found = found || &d->primary == ctx;
    if (!found) return CUDA_ERROR_INVALID_CONTEXT;
  }
  tl_current = ctx;
  return CUDA_SUCCESS;
}

/// Writes the calling thread's current context (NULL when none). Before cuInit it returns
/// NOT_INITIALIZED without writing (§1.1).
VSR_EMU_EXPORT CUresult cuCtxGetCurrent(CUcontext* ctx) {
  VSR_EMU_BEGIN("cuCtxGetCurrent");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_init(s); r != CUDA_SUCCESS) return r;
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *ctx = tl_current;
  return CUDA_SUCCESS;
}

namespace {

CUresult ctx_get_device(CUdevice* device, CUcontext ctx) {
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_init(s); r != CUDA_SUCCESS) return r;
  if (ctx == nullptr) {
    CUctx_st* cur = nullptr;
    if (CUresult r = need_context(s, &cur); r != CUDA_SUCCESS) return r;
    ctx = cur;
  } else if (!ctx->active) {
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *device = ctx->device;
  return CUDA_SUCCESS;
}

CUresult ctx_synchronize(CUcontext ctx) {
  State& s = st();
  std::unique_lock lock(s.mutex);
  if (ctx == nullptr) {
    CUctx_st* cur = nullptr;
    if (CUresult r = need_context(s, &cur); r != CUDA_SUCCESS) return r;
    ctx = cur;
  } else if (!ctx->active) {
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  auto all = snapshot_streams(s, ctx, false);
  lock.unlock();
  wait_all(all);
  lock.lock();
  return sync_result(ctx);
}

}  // namespace

/// Writes the device of the current context; INVALID_CONTEXT without one.
VSR_EMU_EXPORT CUresult cuCtxGetDevice(CUdevice* device) {
  VSR_EMU_BEGIN("cuCtxGetDevice");
  return ctx_get_device(device, nullptr);
}

/// 13.0 form: the device of `ctx` (NULL: the current context).
VSR_EMU_EXPORT CUresult cuCtxGetDevice_v2(CUdevice* device, CUcontext ctx) {
  VSR_EMU_BEGIN("cuCtxGetDevice");
  return ctx_get_device(device, ctx);
}

/// Waits for all streams of the current context; returns the context's pending error.
VSR_EMU_EXPORT CUresult cuCtxSynchronize(void) {
  VSR_EMU_BEGIN("cuCtxSynchronize");
  return ctx_synchronize(nullptr);
}

/// 13.0 form: waits for all streams of `ctx` (NULL: the current context).
VSR_EMU_EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx) {
  VSR_EMU_BEGIN("cuCtxSynchronize");
  return ctx_synchronize(ctx);
}

// ============================== memory info and VMM ==============================

/// free = capacity - charged - VSR_EMU_CONTEXT_OVERHEAD for the current context's device.
VSR_EMU_EXPORT CUresult cuMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  VSR_EMU_BEGIN("cuMemGetInfo");
  State& s = st();
  std::lock_guard lock(s.mutex);
  CUctx_st* ctx = nullptr;
  if (CUresult r = need_context(s, &ctx); r != CUDA_SUCCESS) return r;
  if (free_bytes == nullptr || total_bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *free_bytes = device_free(s, ctx->device);
  *total_bytes = s.config.device_memory;
  return CUDA_SUCCESS;
}

/// Writes the minimum (VSR_EMU_GRANULARITY) or recommended granularity. Like the real driver it
/// does not validate prop's location or type (§3.4.1).
VSR_EMU_EXPORT CUresult cuMemGetAllocationGranularity(size_t* granularity,
                                                      const CUmemAllocationProp* prop,
                                                      CUmemAllocationGranularity_flags option) {
  VSR_EMU_BEGIN("cuMemGetAllocationGranularity");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_vmm(s); r != CUDA_SUCCESS) return r;
  if (granularity == nullptr || prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (option == CU_MEM_ALLOC_GRANULARITY_MINIMUM) {
    *granularity = s.config.granularity;
  } else if (option == CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) {
    *granularity = s.config.recommended_granularity != 0 ? s.config.recommended_granularity
                                                         : s.config.granularity;
  } else {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

/// Reserves [*ptr, *ptr+size) of PROT_NONE address space aligned to max(alignment, granularity).
/// A free, suitably aligned hint `addr` is honoured; otherwise another address is returned
/// without error (§3.4.2).
VSR_EMU_EXPORT CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment,
                                            CUdeviceptr addr, unsigned long long flags) {
  VSR_EMU_BEGIN("cuMemAddressReserve");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_vmm(s); r != CUDA_SUCCESS) return r;
  const size_t page = page_size();
  if (ptr == nullptr || size == 0 || size % page != 0 || flags != 0 || addr % page != 0 ||
      (alignment != 0 && !is_pow2(alignment))) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const size_t align = std::max(alignment, s.config.granularity);
  constexpr int kProt = PROT_NONE;
  constexpr int kFlags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
  if (addr != 0 && addr % align == 0 && addr + size > addr) {
    void* want = reinterpret_cast<void*>(addr);
    void* got = mmap(want, size, kProt, kFlags | MAP_FIXED_NOREPLACE, -1, 0);
    if (got == want) {
      s.reservations[addr] = size;
      *ptr = addr;
      return CUDA_SUCCESS;
    }
    // Kernels before 4.17 treat the flag as a plain hint and may place the range elsewhere.
    if (got != MAP_FAILED) munmap(got, size);
  }
  if (size + align < size) return CUDA_ERROR_OUT_OF_MEMORY;
  void* raw = mmap(nullptr, size + align, kProt, kFlags, -1, 0);
  if (raw == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  auto base = reinterpret_cast<uintptr_t>(raw);
  uintptr_t aligned = round_up(base, align);
  if (aligned > base) munmap(raw, aligned - base);
  uintptr_t tail = aligned + size;
  if (base + size + align > tail) munmap(reinterpret_cast<void*>(tail), base + size + align - tail);
  s.reservations[aligned] = size;
  *ptr = aligned;
  return CUDA_SUCCESS;
}

/// Frees a reservation: (ptr, size) must be exactly one reservation with no mapping inside
/// (strict, §3.4.3).
VSR_EMU_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  VSR_EMU_BEGIN("cuMemAddressFree");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_vmm(s); r != CUDA_SUCCESS) return r;
  if (ptr == 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
  auto it = s.reservations.find(ptr);
  if (it == s.reservations.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
  auto m = s.mappings.lower_bound(ptr);
  if (m != s.mappings.end() && m->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;
  munmap(reinterpret_cast<void*>(ptr), size);
  s.reservations.erase(it);
  return CUDA_SUCCESS;
}

/// Creates a physical allocation (a memfd) of `size` bytes on prop->location.id, charged to the
/// device at once. Handle ids increase monotonically, are never 0 and never reused (§3.4.4).
VSR_EMU_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                    const CUmemAllocationProp* prop, unsigned long long flags) {
  VSR_EMU_BEGIN("cuMemCreate");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_vmm(s); r != CUDA_SUCCESS) return r;
  if (handle == nullptr || prop == nullptr || size == 0 || flags != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
  if (prop->location.type == CU_MEM_LOCATION_TYPE_HOST ||
      prop->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
      prop->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
  if (prop->location.id < 0 || prop->location.id >= s.config.device_count) {
    return CUDA_ERROR_INVALID_DEVICE;
  }
  if (prop->win32HandleMetaData != nullptr) return CUDA_ERROR_INVALID_VALUE;
  if ((prop->requestedHandleTypes & ~CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (size % s.config.granularity != 0) return CUDA_ERROR_INVALID_VALUE;
  const int dev = prop->location.id;
  if (!charge(s, dev, size)) return CUDA_ERROR_OUT_OF_MEMORY;
  int fd = memfd_create("vsr-emu-physical", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(size)) != 0) {
    if (fd >= 0) close(fd);
    uncharge(s, dev, size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  auto p = std::make_shared<Physical>();
  p->id = ++s.next_handle;
  p->size = size;
  p->prop = *prop;
  p->device = dev;
  p->fd = fd;
  p->refs = 1;
  s.handles[p->id] = p;
  s.live_physical++;
  s.live_physical_bytes += size;
  s.physical_per_device[static_cast<size_t>(dev)]++;
  s.physical_bytes_per_device[static_cast<size_t>(dev)] += size;
  *handle = p->id;
  return CUDA_SUCCESS;
}

/// Drops one reference of `handle`; the memory goes once no reference and no mapping remain.
/// Unknown or already released ids are INVALID_VALUE (the real driver's behaviour is undefined).
VSR_EMU_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  VSR_EMU_BEGIN("cuMemRelease");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_vmm(s); r != CUDA_SUCCESS) return r;
  auto it = s.handles.find(handle);
  if (handle == 0 || it == s.handles.end()) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<Physical> p = it->second;
  if (--p->refs == 0) {
    s.handles.erase(it);
    maybe_destroy_physical(s, p);
  }
  return CUDA_SUCCESS;
}

/// Maps the whole allocation `handle` at ptr (offset 0, size = allocation size; strict, §3.4.6)
/// inside one reservation, over no existing mapping. The mapping starts with no access.
VSR_EMU_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                                 CUmemGenericAllocationHandle handle, unsigned long long flags) {
  VSR_EMU_BEGIN("cuMemMap");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_vmm(s); r != CUDA_SUCCESS) return r;
  if (ptr == 0 || size == 0 || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  auto h = s.handles.find(handle);
  if (h == s.handles.end()) return CUDA_ERROR_INVALID_VALUE;
  const size_t g = s.config.granularity;
  std::shared_ptr<Physical> p = h->second;
  if (ptr % g != 0 || size % g != 0 || offset % g != 0) return CUDA_ERROR_INVALID_VALUE;
  if (offset != 0 || size != p->size) return CUDA_ERROR_INVALID_VALUE;
  auto res = containing_reservation(s, ptr);
  if (res == s.reservations.end() || ptr + size > res->first + res->second) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto next = s.mappings.lower_bound(ptr);
  if (next != s.mappings.end() && next->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;
  if (containing(s.mappings, ptr) != s.mappings.end()) return CUDA_ERROR_INVALID_VALUE;
  void* got = mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE, MAP_SHARED | MAP_FIXED, p->fd,
                   static_cast<off_t>(offset));
  if (got == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  Mapping m;
  m.size = size;
  m.granule = g;
  m.physical = p;
  m.access.assign(size / g * static_cast<size_t>(s.config.device_count),
                  CU_MEM_ACCESS_FLAGS_PROT_NONE);
  s.mappings[ptr] = std::move(m);
  p->maps++;
  return CUDA_SUCCESS;
}

/// Unmaps [ptr, ptr+size), which must be exactly a gap-free union of whole mappings (§3.4.7).
/// The range becomes plain reservation again.
VSR_EMU_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  VSR_EMU_BEGIN("cuMemUnmap");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_vmm(s); r != CUDA_SUCCESS) return r;
  if (ptr == 0 || size == 0 || ptr + size < ptr) return CUDA_ERROR_INVALID_VALUE;
  const uintptr_t end = ptr + size;
  auto first = s.mappings.find(ptr);
  if (first == s.mappings.end()) return CUDA_ERROR_INVALID_VALUE;
  auto it = first;
  uintptr_t cur = ptr;
  while (cur < end) {
    if (it == s.mappings.end() || it->first != cur) return CUDA_ERROR_INVALID_VALUE;
    cur += it->second.size;
    ++it;
  }
  if (cur != end) return CUDA_ERROR_INVALID_VALUE;
  for (auto m = first; m != it;) {
    // Re-reserve rather than munmap: the address range still belongs to the reservation.
    mmap(reinterpret_cast<void*>(m->first), m->second.size, PROT_NONE,
         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    std::shared_ptr<Physical> p = m->second.physical;
    p->maps--;
    m = s.mappings.erase(m);
    maybe_destroy_physical(s, p);
  }
  return CUDA_SUCCESS;
}

/// Sets per-device access on [ptr, ptr+size), which must be fully mapped (it may span several
/// mappings or be a granule-aligned part of one). The host view gets the widest access any
/// device has (mprotect).
VSR_EMU_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,
                                       size_t count) {
  VSR_EMU_BEGIN("cuMemSetAccess");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_vmm(s); r != CUDA_SUCCESS) return r;
  if (ptr == 0 || size == 0 || desc == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < count; ++i) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    if (desc[i].location.id < 0 || desc[i].location.id >= s.config.device_count) {
      return CUDA_ERROR_INVALID_DEVICE;
    }
    if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
        desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
        desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  const size_t g = s.config.granularity;
  if (ptr % g != 0 || size % g != 0) return CUDA_ERROR_INVALID_VALUE;
  const auto ndev = static_cast<size_t>(s.config.device_count);
  bool mapped = for_each_mapped(s, ptr, size, [](auto, uintptr_t, uintptr_t) {});
  if (!mapped) return CUDA_ERROR_INVALID_VALUE;
  for_each_mapped(s, ptr, size, [&](auto it, uintptr_t a, uintptr_t b) {
    Mapping& m = it->second;
    for (uintptr_t gaddr = a; gaddr < b; gaddr += m.granule) {
      size_t gi = (gaddr - it->first) / m.granule;
      for (size_t i = 0; i < count; ++i) {
        m.access[gi * ndev + static_cast<size_t>(desc[i].location.id)] =
            static_cast<unsigned char>(desc[i].flags);
      }
      unsigned char widest = CU_MEM_ACCESS_FLAGS_PROT_NONE;
      for (size_t d = 0; d < ndev; ++d) widest = std::max(widest, m.access[gi * ndev + d]);
      int prot = widest == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE
                 : widest == CU_MEM_ACCESS_FLAGS_PROT_READ    ? PROT_READ
                                                              : PROT_NONE;
      mprotect(reinterpret_cast<void*>(gaddr), m.granule, prot);
    }
  });
  return CUDA_SUCCESS;
}

/// Writes the access flags of `location` (a device) for the mapped address `ptr`.
VSR_EMU_EXPORT CUresult cuMemGetAccess(unsigned long long* flags, const CUmemLocation* location,
                                       CUdeviceptr ptr) {
  VSR_EMU_BEGIN("cuMemGetAccess");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_vmm(s); r != CUDA_SUCCESS) return r;
  if (flags == nullptr || location == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (location->type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
  if (location->id < 0 || location->id >= s.config.device_count) return CUDA_ERROR_INVALID_DEVICE;
  auto it = containing(s.mappings, ptr);
  if (it == s.mappings.end()) return CUDA_ERROR_INVALID_VALUE;
  size_t gi = (ptr - it->first) / it->second.granule;
  *flags = it->second.access[gi * static_cast<size_t>(s.config.device_count) +
                             static_cast<size_t>(location->id)];
  return CUDA_SUCCESS;
}

/// Writes the handle mapped at `addr` (the same id cuMemCreate returned) and adds a reference.
VSR_EMU_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle,
                                                    void* addr) {
  VSR_EMU_BEGIN("cuMemRetainAllocationHandle");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_vmm(s); r != CUDA_SUCCESS) return r;
  if (handle == nullptr || addr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto it = containing(s.mappings, reinterpret_cast<uintptr_t>(addr));
  if (it == s.mappings.end()) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<Physical> p = it->second.physical;
  if (p->refs++ == 0) s.handles[p->id] = p;
  *handle = p->id;
  return CUDA_SUCCESS;
}

/// Writes the properties `handle` was created with.
VSR_EMU_EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(
    CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle) {
  VSR_EMU_BEGIN("cuMemGetAllocationPropertiesFromHandle");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_vmm(s); r != CUDA_SUCCESS) return r;
  auto it = s.handles.find(handle);
  if (prop == nullptr || it == s.handles.end()) return CUDA_ERROR_INVALID_VALUE;
  *prop = it->second->prop;
  return CUDA_SUCCESS;
}

// ============================== classic allocations ==============================

/// Allocates `bytesize` bytes of device memory (256-byte aligned host memory) in the current
/// context, charged to its device.
VSR_EMU_EXPORT CUresult cuMemAlloc(CUdeviceptr* dptr, size_t bytesize) {
  VSR_EMU_BEGIN("cuMemAlloc");
  State& s = st();
  std::lock_guard lock(s.mutex);
  CUctx_st* ctx = nullptr;
  if (CUresult r = need_context(s, &ctx); r != CUDA_SUCCESS) return r;
  if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  return alloc_linear(s, ctx, bytesize, LinearKind::device, dptr);
}

/// Frees cuMemAlloc/cuMemAllocAsync/cuMemAllocManaged memory; 0 is a no-op; interior, unknown,
/// already freed or VMM pointers are INVALID_VALUE.
VSR_EMU_EXPORT CUresult cuMemFree(CUdeviceptr dptr) {
  VSR_EMU_BEGIN("cuMemFree");
  State& s = st();
  std::unique_lock lock(s.mutex);
  CUctx_st* ctx = nullptr;
  if (CUresult r = need_context(s, &ctx); r != CUDA_SUCCESS) return r;
  if (dptr == 0) return CUDA_SUCCESS;
  auto it = s.linear.find(dptr);
  if (it == s.linear.end() || it->second.free_pending) return CUDA_ERROR_INVALID_VALUE;
  // cuMemFree synchronises implicitly (§3.5): work already queued that uses the memory completes
  // before it is released, so the address cannot be reused under that work.
  auto all = snapshot_streams(s, it->second.ctx, false);
  lock.unlock();
  wait_all(all);
  lock.lock();
  it = s.linear.find(dptr);
  if (it == s.linear.end() || it->second.free_pending) return CUDA_ERROR_INVALID_VALUE;
  free_linear(s, it);
  return CUDA_SUCCESS;
}

/// Allocates managed memory (flags CU_MEM_ATTACH_GLOBAL or _HOST); charged to the current
/// context's device like cuMemAlloc. NOT_SUPPORTED with VSR_EMU_MANAGED=0.
VSR_EMU_EXPORT CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  VSR_EMU_BEGIN("cuMemAllocManaged");
  State& s = st();
  std::lock_guard lock(s.mutex);
  CUctx_st* ctx = nullptr;
  if (CUresult r = need_context(s, &ctx); r != CUDA_SUCCESS) return r;
  if (!s.config.managed) return CUDA_ERROR_NOT_SUPPORTED;
  if (dptr == nullptr || bytesize == 0 ||
      (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return alloc_linear(s, ctx, bytesize, LinearKind::managed, dptr);
}

namespace {

CUresult alloc_async(CUdeviceptr* dptr, size_t bytesize, CUstream stream, bool ptds) {
  State& s = st();
  std::lock_guard lock(s.mutex);
  StreamRef ref;
  if (CUresult r = resolve_stream(s, stream, ptds, &ref); r != CUDA_SUCCESS) return r;
  if (!s.config.memory_pools) return CUDA_ERROR_NOT_SUPPORTED;
  if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  // The pointer is usable in stream order at once: nothing to enqueue.
  return alloc_linear(s, ref.ctx, bytesize, LinearKind::async, dptr);
}

CUresult free_async(CUdeviceptr dptr, CUstream stream, bool ptds) {
  State& s = st();
  std::unique_lock lock(s.mutex);
  StreamRef ref;
  if (CUresult r = resolve_stream(s, stream, ptds, &ref); r != CUDA_SUCCESS) return r;
  auto it = s.linear.find(dptr);
  if (dptr == 0 || it == s.linear.end() || it->second.free_pending ||
      it->second.kind == LinearKind::managed) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  it->second.free_pending = true;
  return submit(lock, ref, [dptr](bool) {
    State& st2 = st();
    std::lock_guard l2(st2.mutex);
    auto found = st2.linear.find(dptr);
    if (found != st2.linear.end()) free_linear(st2, found);
    return CUDA_SUCCESS;
  });
}

}  // namespace

/// Stream-ordered allocation: the pointer is returned at once and charged to the stream's device.
/// NOT_SUPPORTED with VSR_EMU_MEMORY_POOLS=0.
VSR_EMU_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream stream) {
  VSR_EMU_BEGIN("cuMemAllocAsync");
  return alloc_async(dptr, bytesize, stream, false);
}

/// cuMemAllocAsync with stream 0 meaning the per-thread stream.
CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream stream) {
  VSR_EMU_BEGIN("cuMemAllocAsync");
  return alloc_async(dptr, bytesize, stream, true);
}

/// Stream-ordered free: the memory is released when the stream reaches this point.
VSR_EMU_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
  VSR_EMU_BEGIN("cuMemFreeAsync");
  return free_async(dptr, stream, false);
}

/// cuMemFreeAsync with stream 0 meaning the per-thread stream.
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
  VSR_EMU_BEGIN("cuMemFreeAsync");
  return free_async(dptr, stream, true);
}

namespace {

CUresult host_alloc(void** pp, size_t bytesize, unsigned flags) {
  State& s = st();
  std::lock_guard lock(s.mutex);
  CUctx_st* ctx = nullptr;
  if (CUresult r = need_context(s, &ctx); r != CUDA_SUCCESS) return r;
  constexpr unsigned kKnown =
      CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
  if (pp == nullptr || bytesize == 0 || (flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
  size_t mapped = 0;
  void* p = map_anonymous(bytesize, &mapped);
  if (p == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  s.host[reinterpret_cast<uintptr_t>(p)] = HostAlloc{bytesize, mapped, ctx};
  *pp = p;
  return CUDA_SUCCESS;
}

}  // namespace

/// Allocates page-locked host memory (plain host memory here), accessible to every device.
VSR_EMU_EXPORT CUresult cuMemHostAlloc(void** pp, size_t bytesize, unsigned int flags) {
  VSR_EMU_BEGIN("cuMemHostAlloc");
  return host_alloc(pp, bytesize, flags);
}

/// cuMemHostAlloc with flags 0.
VSR_EMU_EXPORT CUresult cuMemAllocHost(void** pp, size_t bytesize) {
  VSR_EMU_BEGIN("cuMemAllocHost");
  return host_alloc(pp, bytesize, 0);
}

/// Frees cuMemHostAlloc/cuMemAllocHost memory; NULL is a no-op.
VSR_EMU_EXPORT CUresult cuMemFreeHost(void* p) {
  VSR_EMU_BEGIN("cuMemFreeHost");
  State& s = st();
  std::lock_guard lock(s.mutex);
  CUctx_st* ctx = nullptr;
  if (CUresult r = need_context(s, &ctx); r != CUDA_SUCCESS) return r;
  if (p == nullptr) return CUDA_SUCCESS;
  auto it = s.host.find(reinterpret_cast<uintptr_t>(p));
  if (it == s.host.end()) return CUDA_ERROR_INVALID_VALUE;
  munmap(p, it->second.mapped_size);
  s.host.erase(it);
  return CUDA_SUCCESS;
}

// ============================== copies and memset ==============================

namespace {

CopyOp htod(CUdeviceptr dst, const void* src, size_t n) {
  return {CopyKind::htod, dst, reinterpret_cast<uintptr_t>(src), n, 0};
}
CopyOp dtoh(void* dst, CUdeviceptr src, size_t n) {
  return {CopyKind::dtoh, reinterpret_cast<uintptr_t>(dst), src, n, 0};
}
CopyOp dtod(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return {CopyKind::dtod, dst, src, n, 0};
}
CopyOp set8(CUdeviceptr dst, unsigned char v, size_t n) {
  return {CopyKind::memset8, dst, 0, n, v};
}
CopyOp set32(CUdeviceptr dst, unsigned v, size_t n) {
  return {CopyKind::memset32, dst, 0, n * 4, v};
}

}  // namespace

/// Host-to-device copy on the legacy default stream (synchronous).
VSR_EMU_EXPORT CUresult cuMemcpyHtoD(CUdeviceptr dst, const void* src, size_t n) {
  return copy_entry("cuMemcpyHtoD", htod(dst, src, n), nullptr, false);
}
/// Device-to-host copy on the legacy default stream (synchronous).
VSR_EMU_EXPORT CUresult cuMemcpyDtoH(void* dst, CUdeviceptr src, size_t n) {
  return copy_entry("cuMemcpyDtoH", dtoh(dst, src, n), nullptr, false);
}
/// Device-to-device copy on the legacy default stream.
VSR_EMU_EXPORT CUresult cuMemcpyDtoD(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return copy_entry("cuMemcpyDtoD", dtod(dst, src, n), nullptr, false);
}
/// Stream-ordered host-to-device copy.
VSR_EMU_EXPORT CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void* src, size_t n,
                                          CUstream stream) {
  return copy_entry("cuMemcpyHtoDAsync", htod(dst, src, n), stream, false);
}
/// Stream-ordered device-to-host copy.
VSR_EMU_EXPORT CUresult cuMemcpyDtoHAsync(void* dst, CUdeviceptr src, size_t n, CUstream stream) {
  return copy_entry("cuMemcpyDtoHAsync", dtoh(dst, src, n), stream, false);
}
/// Stream-ordered device-to-device copy.
VSR_EMU_EXPORT CUresult cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n,
                                          CUstream stream) {
  return copy_entry("cuMemcpyDtoDAsync", dtod(dst, src, n), stream, false);
}
/// Sets n bytes on the legacy default stream.
VSR_EMU_EXPORT CUresult cuMemsetD8(CUdeviceptr dst, unsigned char value, size_t n) {
  return copy_entry("cuMemsetD8", set8(dst, value, n), nullptr, false);
}
/// Stream-ordered byte memset.
VSR_EMU_EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n,
                                        CUstream stream) {
  return copy_entry("cuMemsetD8Async", set8(dst, value, n), stream, false);
}
/// Sets n 32-bit words (dst 4-byte aligned) on the legacy default stream.
VSR_EMU_EXPORT CUresult cuMemsetD32(CUdeviceptr dst, unsigned int value, size_t n) {
  return copy_entry("cuMemsetD32", set32(dst, value, n), nullptr, false);
}
/// Stream-ordered 32-bit memset.
VSR_EMU_EXPORT CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t n,
                                         CUstream stream) {
  return copy_entry("cuMemsetD32Async", set32(dst, value, n), stream, false);
}

/// Per-thread default stream forms (stream 0 = CU_STREAM_PER_THREAD, which runs inline without
/// waiting for other streams).
CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void* src, size_t n) {
  return copy_entry("cuMemcpyHtoD", htod(dst, src, n), nullptr, true);
}
CUresult cuMemcpyDtoH_v2_ptds(void* dst, CUdeviceptr src, size_t n) {
  return copy_entry("cuMemcpyDtoH", dtoh(dst, src, n), nullptr, true);
}
CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return copy_entry("cuMemcpyDtoD", dtod(dst, src, n), nullptr, true);
}
CUresult cuMemsetD8_v2_ptds(CUdeviceptr dst, unsigned char value, size_t n) {
  return copy_entry("cuMemsetD8", set8(dst, value, n), nullptr, true);
}
CUresult cuMemsetD32_v2_ptds(CUdeviceptr dst, unsigned int value, size_t n) {
  return copy_entry("cuMemsetD32", set32(dst, value, n), nullptr, true);
}
CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void* src, size_t n, CUstream stream) {
  return copy_entry("cuMemcpyHtoDAsync", htod(dst, src, n), stream, true);
}
CUresult cuMemcpyDtoHAsync_v2_ptsz(void* dst, CUdeviceptr src, size_t n, CUstream stream) {
  return copy_entry("cuMemcpyDtoHAsync", dtoh(dst, src, n), stream, true);
}
CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream) {
  return copy_entry("cuMemcpyDtoDAsync", dtod(dst, src, n), stream, true);
}
CUresult cuMemsetD8Async_ptsz(CUdeviceptr dst, unsigned char value, size_t n, CUstream stream) {
  return copy_entry("cuMemsetD8Async", set8(dst, value, n), stream, true);
}
CUresult cuMemsetD32Async_ptsz(CUdeviceptr dst, unsigned int value, size_t n, CUstream stream) {
  return copy_entry("cuMemsetD32Async", set32(dst, value, n), stream, true);
}

// ============================== streams ==============================

/// Creates a stream (flags CU_STREAM_DEFAULT or CU_STREAM_NON_BLOCKING) in the current context.
/// It runs its work FIFO on its own worker thread, or inline when VSR_EMU_SYNC=1.
VSR_EMU_EXPORT CUresult cuStreamCreate(CUstream* stream, unsigned int flags) {
  VSR_EMU_BEGIN("cuStreamCreate");
  State& s = st();
  std::lock_guard lock(s.mutex);
  CUctx_st* ctx = nullptr;
  if (CUresult r = need_context(s, &ctx); r != CUDA_SUCCESS) return r;
  if (stream == nullptr || (flags != CU_STREAM_DEFAULT && flags != CU_STREAM_NON_BLOCKING)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto created = std::make_shared<CUstream_st>();
  created->ctx = ctx;
  created->flags = flags;
  created->inline_ = s.config.sync;
  if (!created->inline_) {
    try {
      std::thread(worker_loop, created).detach();
    } catch (const std::system_error&) {
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  s.streams[created.get()] = created;
  *stream = created.get();
  return CUDA_SUCCESS;
}

/// Destroys a created stream at once; its queued work still runs to completion.
VSR_EMU_EXPORT CUresult cuStreamDestroy(CUstream stream) {
  VSR_EMU_BEGIN("cuStreamDestroy");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_init(s); r != CUDA_SUCCESS) return r;
  auto it = s.streams.find(stream);
  if (it == s.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
  std::shared_ptr<CUstream_st> victim = it->second;
  s.streams.erase(it);
  {
    std::lock_guard slock(victim->mutex_);
    victim->stopping_ = true;
    victim->paused_ = false;
  }
  victim->cv_.notify_all();
  return CUDA_SUCCESS;
}

namespace {

CUresult stream_synchronize(CUstream stream, bool ptds) {
  State& s = st();
  std::unique_lock lock(s.mutex);
  StreamRef ref;
  CUresult r = resolve_stream(s, stream, ptds, &ref);
  if (r != CUDA_SUCCESS) return r;
  if (ref.kind == StreamKind::per_thread) return sync_result(ref.ctx);
  std::vector<std::pair<std::shared_ptr<CUstream_st>, uint64_t>> targets;
  if (ref.kind == StreamKind::legacy) {
    targets = snapshot_streams(s, ref.ctx, true);
  } else {
    targets.emplace_back(ref.stream, submitted(ref.stream));
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
  if (CUresult r = resolve_stream(s, stream, ptds, &ref); r != CUDA_SUCCESS) return r;
  std::vector<std::shared_ptr<CUstream_st>> targets;
  if (ref.kind == StreamKind::created) {
    targets.push_back(ref.stream);
  } else if (ref.kind == StreamKind::legacy) {
    for (auto& [str, seq] : snapshot_streams(s, ref.ctx, true)) targets.push_back(str);
  }
  for (auto& t : targets) {
    std::lock_guard slock(t->mutex_);
    if (t->completed_ < t->submitted_) return CUDA_ERROR_NOT_READY;
  }
  return CUDA_SUCCESS;
}

CUresult stream_wait_event(CUstream stream, CUevent event, unsigned flags, bool ptds) {
  State& s = st();
  std::unique_lock lock(s.mutex);
  StreamRef ref;
  if (CUresult r = resolve_stream(s, stream, ptds, &ref); r != CUDA_SUCCESS) return r;
  auto ev = s.events.find(event);
  if (ev == s.events.end()) return CUDA_ERROR_INVALID_HANDLE;
  if ((flags & ~static_cast<unsigned>(CU_EVENT_WAIT_EXTERNAL)) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::shared_ptr<CUstream_st> target = ev->second->stream;
  uint64_t seq = ev->second->seq;
  if (!ev->second->recorded || target == nullptr) return CUDA_SUCCESS;
  return submit(lock, ref, [target, seq](bool) {
    wait_for(target, seq);
    return CUDA_SUCCESS;
  });
}

CUresult launch_host_func(CUstream stream, CUhostFn fn, void* user_data, bool ptds) {
  State& s = st();
  std::unique_lock lock(s.mutex);
  StreamRef ref;
  if (CUresult r = resolve_stream(s, stream, ptds, &ref); r != CUDA_SUCCESS) return r;
  if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return submit(lock, ref, [fn, user_data](bool) {
    fn(user_data);
    return CUDA_SUCCESS;
  });
}

CUresult event_record(CUevent event, CUstream stream, bool ptds) {
  State& s = st();
  std::unique_lock lock(s.mutex);
  StreamRef ref;
  if (CUresult r = resolve_stream(s, stream, ptds, &ref); r != CUDA_SUCCESS) return r;
  auto it = s.events.find(event);
  if (it == s.events.end()) return CUDA_ERROR_INVALID_HANDLE;
  std::shared_ptr<CUevent_st> ev = it->second;
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
  CUresult r = submit(lock, ref, marker, &seq);
  if (lock.owns_lock()) {
    ev->stream = ref.stream;
    ev->seq = seq;
  }
  return r;
}

}  // namespace

/// Waits until all work queued on `stream` so far is done (the legacy stream: all blocking
/// streams of the context); returns the context's pending or sticky error.
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
  return launch_host_func(stream, fn, user_data, false);
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
  return launch_host_func(stream, fn, user_data, true);
}
CUresult cuEventRecord_ptsz(CUevent event, CUstream stream) {
  VSR_EMU_BEGIN("cuEventRecord");
  return event_record(event, stream, true);
}

// ============================== events ==============================

/// Creates an event in the current context. INTERPROCESS requires DISABLE_TIMING.
VSR_EMU_EXPORT CUresult cuEventCreate(CUevent* event, unsigned int flags) {
  VSR_EMU_BEGIN("cuEventCreate");
  State& s = st();
  std::lock_guard lock(s.mutex);
  CUctx_st* ctx = nullptr;
  if (CUresult r = need_context(s, &ctx); r != CUDA_SUCCESS) return r;
  constexpr unsigned kKnown =
      CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  if (event == nullptr || (flags & ~kKnown) != 0 ||
      ((flags & CU_EVENT_INTERPROCESS) != 0 && (flags & CU_EVENT_DISABLE_TIMING) == 0)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto ev = std::make_shared<CUevent_st>();
  ev->ctx = ctx;
  ev->flags = flags;
  s.events[ev.get()] = ev;
  *event = ev.get();
  return CUDA_SUCCESS;
}

/// Records `event` on `stream`: it completes when the stream reaches this point.
VSR_EMU_EXPORT CUresult cuEventRecord(CUevent event, CUstream stream) {
  VSR_EMU_BEGIN("cuEventRecord");
  return event_record(event, stream, false);
}

namespace {

CUresult event_target(CUevent event, std::shared_ptr<CUstream_st>* stream, uint64_t* seq) {
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_init(s); r != CUDA_SUCCESS) return r;
  auto it = s.events.find(event);
  if (it == s.events.end()) return CUDA_ERROR_INVALID_HANDLE;
  if (it->second->ctx->poisoned) return CUDA_ERROR_ILLEGAL_ADDRESS;
  *stream = it->second->recorded ? it->second->stream : nullptr;
  *seq = it->second->seq;
  return CUDA_SUCCESS;
}

}  // namespace

/// SUCCESS when the captured work is done (or the event was never recorded), else NOT_READY.
VSR_EMU_EXPORT CUresult cuEventQuery(CUevent event) {
  VSR_EMU_BEGIN("cuEventQuery");
  std::shared_ptr<CUstream_st> stream;
  uint64_t seq = 0;
  if (CUresult r = event_target(event, &stream, &seq); r != CUDA_SUCCESS) return r;
  if (stream == nullptr) return CUDA_SUCCESS;
  std::lock_guard slock(stream->mutex_);
  return stream->completed_ >= seq ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

/// Waits for the captured work of `event` (returns at once if never recorded).
VSR_EMU_EXPORT CUresult cuEventSynchronize(CUevent event) {
  VSR_EMU_BEGIN("cuEventSynchronize");
  std::shared_ptr<CUstream_st> stream;
  uint64_t seq = 0;
  if (CUresult r = event_target(event, &stream, &seq); r != CUDA_SUCCESS) return r;
  if (stream != nullptr) wait_for(stream, seq);
  return CUDA_SUCCESS;
}

/// Destroys `event` at once, even while its captured work is pending.
VSR_EMU_EXPORT CUresult cuEventDestroy(CUevent event) {
  VSR_EMU_BEGIN("cuEventDestroy");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_init(s); r != CUDA_SUCCESS) return r;
  auto it = s.events.find(event);
  if (it == s.events.end()) return CUDA_ERROR_INVALID_HANDLE;
  s.events.erase(it);
  return CUDA_SUCCESS;
}

/// Milliseconds between two completed, timed events.
VSR_EMU_EXPORT CUresult cuEventElapsedTime(float* ms, CUevent start, CUevent end) {
  VSR_EMU_BEGIN("cuEventElapsedTime");
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (CUresult r = need_init(s); r != CUDA_SUCCESS) return r;
  if (ms == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto a = s.events.find(start);
  auto b = s.events.find(end);
  if (a == s.events.end() || b == s.events.end()) return CUDA_ERROR_INVALID_HANDLE;
  for (const auto* e : {a->second.get(), b->second.get()}) {
    if (!e->recorded || (e->flags & CU_EVENT_DISABLE_TIMING) != 0) {
      return CUDA_ERROR_INVALID_HANDLE;
    }
  }
  if (!a->second->time_set || !b->second->time_set) return CUDA_ERROR_NOT_READY;
  *ms = std::chrono::duration<float, std::milli>(b->second->time - a->second->time).count();
  return CUDA_SUCCESS;
}

// ============================== test control API ==============================

/// See vsr_emulator.h.
VSR_EMU_EXPORT int vsr_emu_query_outstanding(vsr_emu_outstanding* out, int device) {
  State& s = st();
  std::lock_guard lock(s.mutex);
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (device < -1 || device >= s.config.device_count) return CUDA_ERROR_INVALID_DEVICE;
  vsr_emu_outstanding o{};
  o.reservations = s.reservations.size();
  for (auto& [base, size] : s.reservations) o.reserved_bytes += size;
  if (device == -1) {
    o.handles = s.live_physical;
    o.physical_bytes = s.live_physical_bytes;
  } else {
    o.handles = s.physical_per_device[static_cast<size_t>(device)];
    o.physical_bytes = s.physical_bytes_per_device[static_cast<size_t>(device)];
  }
  for (auto& [va, m] : s.mappings) {
    if (device == -1 || m.physical->device == device) o.mappings++;
  }
  for (auto& [p, l] : s.linear) {
    if (device != -1 && l.device != device) continue;
    if (l.kind == LinearKind::managed) {
      o.managed++;
      o.managed_bytes += l.size;
    } else {
      o.allocations++;
      o.allocation_bytes += l.size;
    }
  }
  for (auto& [p, h] : s.host) {
    o.host_allocations++;
    o.host_bytes += h.size;
  }
  for (auto& [raw, str] : s.streams) {
    if (device == -1 || str->ctx->device == device) o.streams++;
  }
  for (auto& [raw, ev] : s.events) {
    if (device == -1 || ev->ctx->device == device) o.events++;
  }
  *out = o;
  return CUDA_SUCCESS;
}

/// See vsr_emulator.h.
VSR_EMU_EXPORT int vsr_emu_set_fail(const char* spec) {
  State& s = st();
  std::lock_guard lock(s.mutex);
  std::vector<FailRule> plan;
  if (!parse_plan(spec, &plan)) return CUDA_ERROR_INVALID_VALUE;
  s.fail_plan = std::move(plan);
  s.call_counts.clear();
  s.fail_env_read = true;
  return CUDA_SUCCESS;
}

/// See vsr_emulator.h.
VSR_EMU_EXPORT unsigned long long vsr_emu_call_count(const char* entry) {
  if (entry == nullptr) return 0;
  State& s = st();
  std::lock_guard lock(s.mutex);
  auto it = s.call_counts.find(base_name(entry));
  return it == s.call_counts.end() ? 0 : it->second;
}

/// See vsr_emulator.h.
VSR_EMU_EXPORT int vsr_emu_set_option(const char* name, const char* value) {
  if (name == nullptr || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = st();
  std::lock_guard lock(s.mutex);
  Config& c = s.config;
  std::string_view n(name);
  size_t number = 0;
  bool flag = false;
  size_t max_charged = 0;
  for (auto& d : s.devices) max_charged = std::max(max_charged, d->charged);
  bool has_linear_kind[3] = {false, false, false};
  for (auto& [p, l] : s.linear) has_linear_kind[static_cast<int>(l.kind)] = true;
  const bool vmm_live = !s.reservations.empty() || s.live_physical != 0 || !s.mappings.empty();
  if (n == "DEVICE_MEMORY" || n == "CONTEXT_OVERHEAD" || n == "GRANULARITY" ||
      n == "RECOMMENDED_GRANULARITY") {
    if (!parse_size(value, &number)) return CUDA_ERROR_INVALID_VALUE;
  } else if (n == "VMM" || n == "MANAGED" || n == "MEMORY_POOLS" || n == "SYNC" || n == "STICKY") {
    if (!parse_bool(value, &flag)) return CUDA_ERROR_INVALID_VALUE;
  } else {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (n == "DEVICE_MEMORY") {
    if (number < max_charged + c.context_overhead) return CUDA_ERROR_NOT_PERMITTED;
    c.device_memory = number;
  } else if (n == "CONTEXT_OVERHEAD") {
    if (max_charged + number > c.device_memory) return CUDA_ERROR_NOT_PERMITTED;
    c.context_overhead = number;
  } else if (n == "GRANULARITY") {
    if (!valid_granularity(number)) return CUDA_ERROR_INVALID_VALUE;
    if (c.recommended_granularity != 0 && c.recommended_granularity % number != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (s.live_physical != 0 || !s.mappings.empty()) return CUDA_ERROR_NOT_PERMITTED;
    c.granularity = number;
  } else if (n == "RECOMMENDED_GRANULARITY") {
    if (number != 0 && number % c.granularity != 0) return CUDA_ERROR_INVALID_VALUE;
    c.recommended_granularity = number;
  } else if (n == "VMM") {
    if (!flag && vmm_live) return CUDA_ERROR_NOT_PERMITTED;
    c.vmm = flag;
  } else if (n == "MANAGED") {
    if (!flag && has_linear_kind[static_cast<int>(LinearKind::managed)]) {
      return CUDA_ERROR_NOT_PERMITTED;
    }
    c.managed = flag;
  } else if (n == "MEMORY_POOLS") {
    if (!flag && has_linear_kind[static_cast<int>(LinearKind::async)]) {
      return CUDA_ERROR_NOT_PERMITTED;
    }
    c.memory_pools = flag;
  } else if (n == "SYNC") {
    c.sync = flag;
  } else {
    c.sticky = flag;
  }
  return CUDA_SUCCESS;
}

/// See vsr_emulator.h.
VSR_EMU_EXPORT int vsr_emu_stream_pause(CUstream stream, int paused) {
  State& s = st();
  std::lock_guard lock(s.mutex);
  auto it = s.streams.find(stream);
  if (it == s.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
  if (it->second->inline_) return CUDA_ERROR_NOT_SUPPORTED;
  {
    std::lock_guard slock(it->second->mutex_);
    it->second->paused_ = paused != 0;
  }
  it->second->cv_.notify_all();
  return CUDA_SUCCESS;
}

/// See vsr_emulator.h.
VSR_EMU_EXPORT const char* vsr_emu_describe(void) {
  thread_local std::string line;
  State& s = st();
  std::lock_guard lock(s.mutex);
  const Config& c = s.config;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "vsr-cuda-emulator driver=%d devices=%d memory=%zu granularity=%zu "
                "recommended=%zu overhead=%zu vmm=%d managed=%d pools=%d sync=%d sticky=%d",
                c.driver_version, c.device_count, c.device_memory, c.granularity,
                c.recommended_granularity != 0 ? c.recommended_granularity : c.granularity,
                c.context_overhead, c.vmm, c.managed, c.memory_pools, c.sync, c.sticky);
  line = buf;
  return line.c_str();
}
