// SPDX-License-Identifier: Apache-2.0
// memory_history.hpp: owner tags (interned once, a thread-local stack of ids), and the recorder:
// per-thread single-producer buffers of small fixed-size events, drained under one mutex into a
// bounded ring (docs/memory-pool.md, "Memory history and snapshots").
//
// A thread's buffer is a ring with one producer (the thread, no lock: it writes the slot at
// `head`, then publishes `head` with a release store) and consumers serialised by the recorder's
// mutex (a drain copies [tail, head) and publishes `tail`). A thread that finds its buffer full
// drains every thread's buffer, so a drained batch holds everything recorded before it began and
// is put into the ring in time order. The live-block map behind the owner statistics pairs each
// free with the latest alloc at its address that is not later than the free, so that a batch that
// comes late (a free whose time stamp was taken before the pool call and published after) cannot
// remove a newer block.
#include "memory/memory_history.hpp"

#include "memory/registry_state.hpp"

#include <algorithm>
#include <array>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

namespace vibespatial::raster::detail::history {

std::atomic<bool> g_on{false};

namespace {

struct RawEvent {
  std::uint64_t t;
  std::uint64_t addr;
  std::uint64_t size;
  std::uint64_t stream;
  std::uint64_t extra;  // oom: the device's free bytes; alloc: the bytes requested
  std::uint32_t session;
  std::uint16_t tag;
  std::uint8_t action;
  std::uint8_t device;
};
static_assert(sizeof(RawEvent) == 48, "events stay small");

constexpr std::uint32_t kBufferEvents = 512;

struct ThreadBuffer {
  std::atomic<std::uint64_t> head{0};
  alignas(64) std::atomic<std::uint64_t> tail{0};
  std::array<RawEvent, kBufferEvents> events;
};

struct LiveBlock {
  std::uint64_t t;
  std::uint64_t size;  // requested
  std::uint16_t tag;
  std::uint8_t device;
};

struct Recorder {
  std::mutex mutex;
  std::vector<ThreadBuffer*> buffers;
  std::vector<RawEvent> ring;  // grows to `capacity`, then wraps at `start`
  std::size_t start = 0;
  std::size_t capacity = 0;
  std::uint64_t dropped = 0;
  std::atomic<std::uint64_t> lost{0};  // events no buffer could take (host memory)
  std::atomic<std::uint32_t> session{0};
  std::unordered_map<std::uint64_t, LiveBlock> live;
  // The clock: ticks and wall time when recording started.
  std::uint64_t t0 = 0;
  std::chrono::steady_clock::time_point steady0;
  std::uint64_t wall0_us = 0;
  // Tags: names by id; ids by name.
  std::mutex tag_mutex;
  std::vector<std::string> tag_names{"user", "raster", "cupy", "torch", "numba"};
  std::unordered_map<std::string, std::uint16_t> tag_ids{
      {"user", 0}, {"raster", 1}, {"cupy", 2}, {"torch", 3}, {"numba", 4}};
};

Recorder& recorder() {
  static Recorder* r = new Recorder();  // leaked: threads may exit after static destruction
  return *r;
}

constexpr std::size_t kMaxTags = 65000;

struct TagStack {
  std::array<std::uint16_t, kMaxMemoryTagDepth> ids{};
  std::size_t depth = 0;
};
thread_local TagStack t_tags;

// Moves every thread's buffered events into the ring, in time order. Mutex held.
void drain_locked(Recorder& r) noexcept {
  std::vector<RawEvent> batch;
  const std::uint32_t session = r.session.load(std::memory_order_relaxed);
  for (ThreadBuffer* b : r.buffers) {
    const std::uint64_t tail = b->tail.load(std::memory_order_relaxed);
    const std::uint64_t head = b->head.load(std::memory_order_acquire);
    try {
      for (std::uint64_t i = tail; i < head; ++i) {
        const RawEvent& e = b->events[i % kBufferEvents];
        if (e.session == session) batch.push_back(e);
      }
    } catch (...) {
      r.dropped += head - tail;  // no host memory: these events are lost, and counted
    }
    b->tail.store(head, std::memory_order_release);
  }
  std::stable_sort(batch.begin(), batch.end(),
                   [](const RawEvent& a, const RawEvent& b) { return a.t < b.t; });
  for (const RawEvent& e : batch) {
    const auto action = static_cast<MemoryAction>(e.action);
    try {
      if (action == MemoryAction::alloc) {
        r.live[e.addr] = LiveBlock{e.t, e.extra, e.tag, e.device};
      } else if (action == MemoryAction::free_requested) {
        auto it = r.live.find(e.addr);
        if (it != r.live.end() && it->second.t <= e.t) r.live.erase(it);
      }
    } catch (...) {
      // The owner statistics miss this block; the event itself is kept below.
    }
    if (r.capacity == 0) continue;
    if (r.ring.size() < r.capacity) {
      try {
        r.ring.push_back(e);
        continue;
      } catch (...) {
        if (r.ring.empty()) {
          ++r.dropped;
          continue;
        }
      }
    }
    // Full (or no memory to grow): the oldest event goes.
    r.ring[r.start] = e;
    r.start = (r.start + 1) % r.ring.size();
    ++r.dropped;
  }
}

// The calling thread's buffer, registered on first use.
struct BufferHolder {
  ThreadBuffer* buffer = nullptr;
  ~BufferHolder() {
    if (buffer == nullptr || in_forked_child()) return;
    Recorder& r = recorder();
    std::lock_guard lock(r.mutex);
    drain_locked(r);  // a thread that exits keeps its events
    std::erase(r.buffers, buffer);
    delete buffer;
  }
};
thread_local BufferHolder t_buffer;

ThreadBuffer* thread_buffer() noexcept {
  if (t_buffer.buffer != nullptr) [[likely]]
    return t_buffer.buffer;
  try {
    auto b = std::make_unique<ThreadBuffer>();
    Recorder& r = recorder();
    std::lock_guard lock(r.mutex);
    r.buffers.push_back(b.get());
    t_buffer.buffer = b.release();
  } catch (...) {
    return nullptr;
  }
  return t_buffer.buffer;
}

// Keeps the newest `capacity` events of the ring, oldest first at index 0. Mutex held.
void linearize(Recorder& r, std::size_t capacity) {
  std::rotate(r.ring.begin(), r.ring.begin() + static_cast<std::ptrdiff_t>(r.start), r.ring.end());
  r.start = 0;
  if (r.ring.size() > capacity) {
    const std::size_t extra = r.ring.size() - capacity;
    r.ring.erase(r.ring.begin(), r.ring.begin() + static_cast<std::ptrdiff_t>(extra));
    r.dropped += extra;
  }
}

bool valid_utf8(std::string_view s) noexcept {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = 0;
    std::uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    }
    if ((c & 0xE0) == 0xC0) {
      n = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;  // cut short
    for (std::size_t k = 1; k <= n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    // Overlong forms, surrogates and code points past U+10FFFF are not text.
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) ||
        cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    i += n + 1;
  }
  return true;
}

void check_tag(std::string_view tag, const char* function) {
  const std::string fn(function);
  if (tag.empty()) throw std::invalid_argument(fn + ": a memory tag may not be empty");
  if (tag.size() > kMaxMemoryTagLength) {
    throw std::invalid_argument(fn + ": a memory tag may hold at most " +
                                std::to_string(kMaxMemoryTagLength) + " bytes, not " +
                                std::to_string(tag.size()));
  }
  if (tag.find('\0') != std::string_view::npos) {
    throw std::invalid_argument(fn + ": a memory tag may not hold a NUL byte");
  }
  if (!valid_utf8(tag)) throw std::invalid_argument(fn + ": a memory tag must be UTF-8 text");
}

std::uint16_t intern(std::string_view tag, const char* function) {
  check_tag(tag, function);
  Recorder& r = recorder();
  std::lock_guard lock(r.tag_mutex);
  const std::string key(tag);
  if (auto it = r.tag_ids.find(key); it != r.tag_ids.end()) return it->second;
  if (r.tag_names.size() >= kMaxTags) {
    throw std::out_of_range(std::string(function) + ": more than " + std::to_string(kMaxTags) +
                            " distinct memory tags");
  }
  const auto id = static_cast<std::uint16_t>(r.tag_names.size());
  r.tag_names.push_back(key);
  try {
    r.tag_ids.emplace(key, id);
  } catch (...) {
    r.tag_names.pop_back();
    throw;
  }
  return id;
}

std::string tag_name(std::uint16_t id) {
  Recorder& r = recorder();
  std::lock_guard lock(r.tag_mutex);
  return id < r.tag_names.size() ? r.tag_names[id] : std::string("user");
}

void push_id(std::uint16_t id, const char* function) {
  TagStack& s = t_tags;
  if (s.depth >= kMaxMemoryTagDepth) {
    throw std::out_of_range(std::string(function) + ": more than " +
                            std::to_string(kMaxMemoryTagDepth) + " memory tags pushed");
  }
  s.ids[s.depth++] = id;
}

std::uint64_t to_time_us(const Recorder& r, std::uint64_t t, double us_per_tick) {
  const double dt = t >= r.t0 ? static_cast<double>(t - r.t0) * us_per_tick
                              : -static_cast<double>(r.t0 - t) * us_per_tick;
  const double us = static_cast<double>(r.wall0_us) + dt;
  return us <= 0 ? 0 : static_cast<std::uint64_t>(us);
}

}  // namespace

std::uint16_t current_tag() noexcept {
  const TagStack& s = t_tags;
  return s.depth == 0 ? kTagUser : s.ids[s.depth - 1];
}

void record(MemoryAction action, int device, std::uint64_t addr, std::uint64_t size,
            std::uint64_t stream, std::uint64_t t, std::uint64_t extra) noexcept {
  ThreadBuffer* b = thread_buffer();
  if (b == nullptr) [[unlikely]] {
    recorder().lost.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const std::uint64_t head = b->head.load(std::memory_order_relaxed);
  if (head - b->tail.load(std::memory_order_acquire) >= kBufferEvents) [[unlikely]] {
    Recorder& r = recorder();
    std::lock_guard lock(r.mutex);
    drain_locked(r);
  }
  RawEvent& e = b->events[head % kBufferEvents];
  e.t = t;
  e.addr = addr;
  e.size = size;
  e.stream = stream;
  e.extra = extra;
  e.session = recorder().session.load(std::memory_order_relaxed);
  e.tag = current_tag();
  e.action = static_cast<std::uint8_t>(action);
  e.device = static_cast<std::uint8_t>(device);
  b->head.store(head + 1, std::memory_order_release);
}

std::unordered_map<std::uint64_t, std::string> live_owners() {
  Recorder& r = recorder();
  std::unordered_map<std::uint64_t, std::uint16_t> ids;
  {
    std::lock_guard lock(r.mutex);
    drain_locked(r);
    for (const auto& [addr, b] : r.live) ids.emplace(addr, b.tag);
  }
  std::unordered_map<std::uint64_t, std::string> out;
  for (const auto& [addr, id] : ids) out.emplace(addr, tag_name(id));
  return out;
}

std::vector<OwnerUsage> owner_usage(int device) {
  Recorder& r = recorder();
  std::unordered_map<std::uint16_t, std::pair<std::size_t, std::size_t>> by_tag;
  {
    std::lock_guard lock(r.mutex);
    drain_locked(r);
    for (const auto& [addr, b] : r.live) {
      if (b.device != device) continue;
      auto& [bytes, count] = by_tag[b.tag];
      bytes += b.size;
      ++count;
    }
  }
  std::vector<OwnerUsage> out;
  for (const auto& [tag, usage] : by_tag) out.push_back({tag_name(tag), usage.first, usage.second});
  std::sort(out.begin(), out.end(), [](const OwnerUsage& a, const OwnerUsage& b) {
    return a.live_bytes != b.live_bytes ? a.live_bytes > b.live_bytes : a.owner < b.owner;
  });
  return out;
}

void fill_traces(MemorySnapshot& snapshot, int device_count) {
  Recorder& r = recorder();
  std::vector<RawEvent> events;
  double us_per_tick = 0;
  {
    std::lock_guard lock(r.mutex);
    drain_locked(r);
    linearize(r, r.ring.size());
    events = r.ring;
    snapshot.dropped_events = r.dropped + r.lost.load(std::memory_order_relaxed);
    snapshot.recording = on();
    const std::uint64_t t1 = ticks();
    const auto steady1 = std::chrono::steady_clock::now();
    const double us =
        std::chrono::duration<double, std::micro>(steady1 - r.steady0).count();
    us_per_tick = t1 > r.t0 ? us / static_cast<double>(t1 - r.t0) : 0.0;
  }
  // Batches were drained in time order; a late batch may interleave with an earlier one.
  std::stable_sort(events.begin(), events.end(),
                   [](const RawEvent& a, const RawEvent& b) { return a.t < b.t; });
  int devices = std::max(device_count, 1);
  for (const RawEvent& e : events) devices = std::max(devices, static_cast<int>(e.device) + 1);
  snapshot.device_traces.assign(static_cast<std::size_t>(devices), {});
  std::vector<std::string> names;
  {
    std::lock_guard lock(r.tag_mutex);
    names = r.tag_names;
  }
  for (const RawEvent& e : events) {
    MemoryHistoryEvent out;
    out.action = static_cast<MemoryAction>(e.action);
    out.device = e.device;
    out.addr = e.addr;
    out.size = e.size;
    out.stream = e.stream;
    out.time_us = to_time_us(r, e.t, us_per_tick);
    if (out.action == MemoryAction::oom) out.device_free = e.extra;
    out.owner = e.tag < names.size() ? names[e.tag] : std::string("user");
    snapshot.device_traces[e.device].push_back(std::move(out));
  }
}

LibraryTag::LibraryTag() noexcept : pushed_(t_tags.depth == 0) {
  if (pushed_) t_tags.ids[t_tags.depth++] = kTagRaster;
}

LibraryTag::~LibraryTag() {
  if (pushed_ && t_tags.depth > 0) --t_tags.depth;
}

}  // namespace vibespatial::raster::detail::history

namespace vibespatial::raster {

namespace h = detail::history;

void record_memory_history(bool enabled, std::size_t max_entries) {
  h::Recorder& r = h::recorder();
  if (!enabled) {
    std::lock_guard lock(r.mutex);
    h::g_on.store(false, std::memory_order_relaxed);
    h::drain_locked(r);  // what was recorded so far stays for a snapshot
    return;
  }
  if (max_entries == 0) {
    throw std::invalid_argument("record_memory_history: max_entries must be at least 1");
  }
  if (max_entries > kMaxMemoryHistoryEntries) {
    throw std::out_of_range("record_memory_history: max_entries " + std::to_string(max_entries) +
                            " is above the limit of " + std::to_string(kMaxMemoryHistoryEntries));
  }
  std::lock_guard lock(r.mutex);
  if (h::g_on.load(std::memory_order_relaxed)) {
    h::drain_locked(r);
    h::linearize(r, max_entries);
    r.capacity = max_entries;
    return;
  }
  // A new history: events of the previous one still in thread buffers are discarded by session.
  r.session.fetch_add(1, std::memory_order_relaxed);
  h::drain_locked(r);
  r.ring.clear();
  r.ring.shrink_to_fit();
  r.start = 0;
  r.capacity = max_entries;
  r.dropped = 0;
  r.lost.store(0, std::memory_order_relaxed);
  r.live.clear();
  r.steady0 = std::chrono::steady_clock::now();
  r.wall0_us = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(
          std::chrono::system_clock::now().time_since_epoch())
          .count());
  r.t0 = h::ticks();
  h::g_on.store(true, std::memory_order_release);
}

bool memory_history_enabled() noexcept {
  return h::on();
}

void push_memory_tag(std::string_view tag) {
  const std::uint16_t id = h::intern(tag, "push_memory_tag");
  h::push_id(id, "push_memory_tag");
}

void pop_memory_tag() {
  if (h::t_tags.depth == 0) {
    throw std::logic_error("pop_memory_tag: no memory tag is pushed on this thread");
  }
  --h::t_tags.depth;
}

std::string current_memory_tag() {
  return h::tag_name(h::current_tag());
}

std::size_t memory_tag_depth() noexcept {
  return h::t_tags.depth;
}

MemoryTag::MemoryTag(std::string_view tag) : depth_(0) {
  push_memory_tag(tag);
  depth_ = h::t_tags.depth;
}

MemoryTag::~MemoryTag() {
  // Pops its own level; tags pushed inside it and not popped go with it.
  if (h::t_tags.depth >= depth_) h::t_tags.depth = depth_ - 1;
}

DefaultMemoryTag::DefaultMemoryTag(std::string_view tag) : pushed_(false) {
  if (h::t_tags.depth != 0) return;
  const std::uint16_t id = h::intern(tag, "DefaultMemoryTag");
  h::push_id(id, "DefaultMemoryTag");
  pushed_ = true;
}

DefaultMemoryTag::~DefaultMemoryTag() {
  if (pushed_ && h::t_tags.depth > 0) --h::t_tags.depth;
}

void memory_history_marker(std::string_view name) {
  const std::uint16_t id = h::intern(name, "memory_history_marker");
  if (!h::on()) return;
  h::TagStack& s = h::t_tags;
  if (s.depth >= kMaxMemoryTagDepth) {
    throw std::out_of_range("memory_history_marker: the thread's tag stack is full");
  }
  s.ids[s.depth++] = id;  // the marker carries its name as its owner
  h::record_now(MemoryAction::annotate, 0, 0, 0);
  --s.depth;
}

const char* memory_action_name(MemoryAction action) noexcept {
  switch (action) {
    case MemoryAction::alloc:
      return "alloc";
    case MemoryAction::free_requested:
      return "free_requested";
    case MemoryAction::free_completed:
      return "free_completed";
    case MemoryAction::segment_map:
      return "segment_map";
    case MemoryAction::segment_unmap:
      return "segment_unmap";
    case MemoryAction::page_create:
      return "page_create";
    case MemoryAction::page_release:
      return "page_release";
    case MemoryAction::trim:
      return "trim";
    case MemoryAction::oom:
      return "oom";
    case MemoryAction::annotate:
      return "annotate";
  }
  return "unknown";
}

}  // namespace vibespatial::raster
