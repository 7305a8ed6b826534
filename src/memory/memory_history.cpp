// SPDX-License-Identifier: Apache-2.0
// memory_history.hpp: owner tags (interned once, a thread-local stack of ids), and the recorder:
// per-thread single-producer buffers of small fixed-size events, drained under one mutex into a
// bounded ring (docs/memory-pool.md, "Memory history and snapshots").
//
// A thread's buffer is a ring with one producer (the thread, no lock: it writes the slot at
// `head`, then publishes `head` with a release store) and consumers serialised by the recorder's
// mutex (a drain copies [tail, head) and publishes `tail`). A thread whose chunk is full hands it
// to the ring whole and takes a fresh one; a snapshot sorts the ring's events by time stamp
// (stable: one thread's events keep their order). Owners of live blocks are not tracked here:
// each pool keeps an owner stamp with every block allocated while recording (memory_owners.cpp).
#include "memory/memory_history.hpp"

#include "common/text_escape.hpp"
#include "memory/process_facts.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <unordered_map>

namespace vibespatial::raster::detail::history {

std::atomic<bool> g_on{false};

namespace {

// One event in a thread's buffer, packed into 32 bytes (two per cache line: what recording
// costs is mostly these bytes): the time stamp, the address with the action and the device in
// its top 16 bits, the size with the owner tag in its top 16 bits, and the stream handle. An
// address or a size of 2^48 or more (no device has such memory; a request may ask for it) is
// written as a wide event: the flag kWide in the action, the address and size 0, and the next
// slot holding the whole address (in `t`) and size (in `addr_word`). The two slots are
// published together, so a drain never splits them.
struct RawEvent {
  std::uint64_t t;
  std::uint64_t addr_word;  // address (oom: the device's free bytes) | action << 48 | device << 56
  std::uint64_t size_word;  // size | tag << 48
  std::uint64_t stream;
};
static_assert(sizeof(RawEvent) == 32, "events stay small");

constexpr int kFieldBits = 48;
constexpr std::uint64_t kFieldMask = (std::uint64_t{1} << kFieldBits) - 1;
constexpr std::uint8_t kWide = 0x80;

// The raw action of a free that completes when it is requested (the pools' frees): one event
// in a thread's buffer for the trace's two entries, free_requested and free_completed, at one
// time. Not a MemoryAction: only the ring holds it; ring_events() writes the two entries.
constexpr std::uint8_t kRawFree = 0x7F;
static_assert(static_cast<std::uint8_t>(MemoryAction::segment_free) < kRawFree);
static_assert(kMaxDevices <= 256, "a device fits in a byte");

inline std::uint8_t action_of(const RawEvent& e) noexcept {
  return static_cast<std::uint8_t>((e.addr_word >> kFieldBits) & 0x7F);
}
inline bool wide(const RawEvent& e) noexcept {
  return ((e.addr_word >> kFieldBits) & kWide) != 0;
}

// The trace entries `e` stands for.
// The trace entries an event of `action` stands for: a free is two (free_requested and
// free_completed), every other action one.
constexpr std::uint32_t entries_for(std::uint8_t action) noexcept {
  return action == kRawFree ? 2 : 1;
}
inline std::uint32_t entries_of(const RawEvent& e) noexcept {
  return entries_for(action_of(e));
}

// The trace entries of the events in [begin, end), which ends after a whole event.
std::uint32_t entries_of(const RawEvent* begin, const RawEvent* end) noexcept {
  std::uint32_t n = 0;
  for (const RawEvent* e = begin; e < end; e += wide(*e) ? 2 : 1) n += entries_of(*e);
  return n;
}

// An event as the ring's reader uses it (ring_events).
struct Event {
  std::uint64_t t;
  std::uint64_t addr;
  std::uint64_t size;
  std::uint64_t stream;
  std::uint16_t tag;
  std::uint8_t action;
  std::uint8_t device;
};

constexpr std::uint32_t kChunkEvents = 512;

// Events of one thread, in its order: [begin, end) once handed to the ring.
struct Chunk {
  std::uint32_t begin = 0;
  std::uint32_t end = 0;
  std::uint32_t entries = 0;  // the trace entries of [begin, end) (entries_of), once handed over
  std::array<RawEvent, kChunkEvents> events;
};

// A thread's chunk being filled: the thread writes the slot at `head` and publishes `head`; a
// consumer (under the recorder's mutex) copies [tail, head) out and publishes `tail`. The thread
// swaps in a fresh chunk under the mutex when it is full.
struct ThreadBuffer {
  Chunk* chunk = nullptr;
  std::atomic<std::uint32_t> head{0};
  alignas(64) std::atomic<std::uint32_t> tail{0};
};

struct Recorder {
  std::mutex mutex;
  std::vector<ThreadBuffer*> buffers;
  std::deque<Chunk*> ring;      // oldest first, in the order they were handed over
  std::size_t ring_events = 0;  // trace entries in `ring` (entries_of: what the bound counts)
  std::vector<Chunk*> spare;    // chunks to reuse
  std::size_t capacity = 0;
  std::uint64_t dropped = 0;
  // The latest time stamp of an event let go. A snapshot leaves out every event at or before it
  // too (counted as dropped), so that its trace is every event after one moment: threads hand
  // their chunks over in no order of time, and a ring that let one thread's older chunk go may
  // still hold another thread's events from before it (an alloc whose free was let go).
  std::uint64_t dropped_until = 0;
  std::atomic<std::uint64_t> lost{0};  // events no buffer could take (host memory)
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

}  // namespace

// What record() reads of the calling thread: one constant-initialised thread-local (one TLS
// lookup per event in a shared library, none where a pool's thread cache keeps its address),
// its destructor kept apart (BufferHolder).
struct ThreadState {
  ThreadBuffer* buffer = nullptr;
  std::uint64_t clock = 0;  // the thread's last time stamp (clock())
  std::uint32_t events = 0;
  std::uint32_t id = 0;  // thread_id(), once assigned
  // Trace entries put into `buffer`'s chunk since it was installed (exact while its tail is 0:
  // no drain copied part of it), so that a full chunk is handed over without a count.
  std::uint32_t chunk_entries = 0;
  TagStack tags;
};

namespace {

thread_local ThreadState t_hot;

// The session of the history being recorded (a new one per start, whose low 16 bits are never
// 0: owner stamps carry them).
std::atomic<std::uint32_t> g_session{0};
std::atomic<std::uint32_t> g_next_thread{0};

inline std::uint16_t tag_of(const ThreadState& st) noexcept {
  return st.tags.depth == 0 ? kTagUser : st.tags.ids[st.tags.depth - 1];
}

[[gnu::noinline]] std::uint32_t assign_thread_id(ThreadState& st) noexcept {
  std::uint32_t id = g_next_thread.fetch_add(1, std::memory_order_relaxed) + 1;
  if (id == 0) id = g_next_thread.fetch_add(1, std::memory_order_relaxed) + 1;  // 2^32 threads on
  st.id = id;
  return id;
}

inline std::uint32_t id_of(ThreadState& st) noexcept {
  return st.id != 0 ? st.id : assign_thread_id(st);
}

// The stamp of a block the calling thread allocates now.
inline std::uint64_t stamp_of(ThreadState& st, std::uint32_t session) noexcept {
  return (std::uint64_t{session & 0xFFFF} << 48) | (std::uint64_t{tag_of(st)} << 32) | id_of(st);
}

Chunk* new_chunk(Recorder& r) noexcept {
  Chunk* c = nullptr;
  if (!r.spare.empty()) {
    c = r.spare.back();
    r.spare.pop_back();
  } else {
    c = new (std::nothrow) Chunk;
    if (c == nullptr) return nullptr;
  }
  c->begin = c->end = 0;
  return c;
}

void recycle(Recorder& r, Chunk* c) noexcept {
  try {
    r.spare.push_back(c);
  } catch (...) {
    delete c;
  }
}

bool earlier(const Event& a, const Event& b) noexcept {
  return a.t < b.t;
}

// Lets the events [begin, end) go, which stand for `entries` trace entries. Mutex held.
void let_go(Recorder& r, const RawEvent* begin, const RawEvent* end,
            std::uint32_t entries) noexcept {
  r.dropped += entries;
  for (const RawEvent* e = begin; e < end; e += wide(*e) ? 2 : 1) {
    r.dropped_until = std::max(r.dropped_until, e->t);
  }
}

// Lets the oldest chunks go down to the bound. Mutex held.
void trim_ring(Recorder& r) noexcept {
  while (r.ring.size() > 1 && r.ring_events - r.ring.front()->entries >= r.capacity) {
    Chunk* old = r.ring.front();
    r.ring.pop_front();
    r.ring_events -= old->entries;
    let_go(r, &old->events[old->begin], &old->events[old->end], old->entries);
    recycle(r, old);
  }
}

// Hands `c`, whose events [begin, end) stand for `entries` trace entries, to the ring and lets
// the oldest chunks go while the ring holds a chunk more than the bound (a snapshot keeps
// exactly the newest `capacity`). Mutex held.
void hand_over(Recorder& r, Chunk* c, std::uint32_t entries) noexcept {
  if (c->begin == c->end || r.capacity == 0) {
    recycle(r, c);
    return;
  }
  c->entries = entries;
  try {
    r.ring.push_back(c);
  } catch (...) {
    let_go(r, &c->events[c->begin], &c->events[c->end], c->entries);
    recycle(r, c);
    return;
  }
  r.ring_events += c->entries;
  trim_ring(r);
}

// Moves what every thread has recorded and not handed over into the ring (copies of the filled
// part of each thread's chunk). Mutex held.
void drain_locked(Recorder& r) noexcept {
  for (ThreadBuffer* b : r.buffers) {
    const std::uint32_t tail = b->tail.load(std::memory_order_relaxed);
    const std::uint32_t head = b->head.load(std::memory_order_acquire);
    if (head <= tail) continue;
    Chunk* c = new_chunk(r);
    if (c == nullptr) {
      // No host memory: lost, and counted.
      let_go(r, &b->chunk->events[tail], &b->chunk->events[head],
             entries_of(&b->chunk->events[tail], &b->chunk->events[head]));
    } else {
      std::copy(&b->chunk->events[tail], &b->chunk->events[head], c->events.begin());
      c->end = head - tail;
      hand_over(r, c, entries_of(&c->events[0], &c->events[c->end]));
    }
    b->tail.store(head, std::memory_order_release);
  }
}

// The thread's chunk is full (or has no room for a wide event): into the ring, and a fresh one.
// Mutex taken here.
[[gnu::noinline]] void chunk_full(ThreadState& st, ThreadBuffer* b) noexcept {
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  Chunk* full = b->chunk;
  Chunk* fresh = new_chunk(r);
  full->begin = b->tail.load(std::memory_order_relaxed);
  full->end = b->head.load(std::memory_order_relaxed);
  // Counted as they were put, unless a drain (or a new history) took the events before `tail`.
  const std::uint32_t entries =
      full->begin == 0 ? st.chunk_entries
                       : entries_of(&full->events[full->begin], &full->events[full->end]);
  st.chunk_entries = 0;
  if (fresh == nullptr) {  // no host memory: the chunk's events are lost, and counted
    let_go(r, &full->events[full->begin], &full->events[full->end], entries);
    fresh = full;
  } else {
    hand_over(r, full, entries);
  }
  fresh->begin = fresh->end = 0;
  b->chunk = fresh;
  b->tail.store(0, std::memory_order_relaxed);
  b->head.store(0, std::memory_order_release);
}

// Drains and unregisters the thread's buffer when the thread exits (armed with the buffer).
struct BufferHolder {
  bool armed = false;
  ~BufferHolder() {
    ThreadBuffer* buffer = t_hot.buffer;
    if (buffer == nullptr || in_forked_child()) return;
    Recorder& r = recorder();
    std::lock_guard lock(r.mutex);
    drain_locked(r);  // a thread that exits keeps its events
    std::erase(r.buffers, buffer);
    t_hot.buffer = nullptr;
    recycle(r, buffer->chunk);
    delete buffer;
  }
};
thread_local BufferHolder t_holder;

// The calling thread's buffer, registered on first use.
[[gnu::noinline]] ThreadBuffer* new_thread_buffer() noexcept {
  try {
    auto b = std::make_unique<ThreadBuffer>();
    t_holder.armed = true;  // constructs the holder: its destructor runs at thread exit
    Recorder& r = recorder();
    std::lock_guard lock(r.mutex);
    b->chunk = new_chunk(r);
    if (b->chunk == nullptr) return nullptr;
    r.buffers.push_back(b.get());
    t_hot.chunk_entries = 0;
    t_hot.buffer = b.release();
  } catch (...) {
    return nullptr;
  }
  return t_hot.buffer;
}

// The ring's events, oldest first: those after the latest one let go, and of them the newest
// `capacity` (the rest count as dropped): every event after one moment. Mutex held.
std::vector<Event> ring_events(Recorder& r, std::uint64_t& dropped) {
  std::uint64_t late = 0;  // events kept, but from before one let go
  std::vector<Event> events;
  events.reserve(r.ring_events);
  for (Chunk* c : r.ring) {
    for (std::uint32_t i = c->begin; i < c->end; ++i) {
      const RawEvent& e = c->events[i];
      Event out{e.t,
                e.addr_word & kFieldMask,
                e.size_word & kFieldMask,
                e.stream,
                static_cast<std::uint16_t>(e.size_word >> kFieldBits),
                action_of(e),
                static_cast<std::uint8_t>(e.addr_word >> 56)};
      if (wide(e)) {  // the whole address and size are in the next slot
        ++i;
        out.addr = c->events[i].t;
        out.size = c->events[i].addr_word;
      }
      if (out.t <= r.dropped_until) {  // before an event let go: left out as well
        late += entries_for(out.action);
        continue;
      }
      if (out.action != kRawFree) {
        events.push_back(out);
        continue;
      }
      // The stable sort keeps the request before the completion.
      out.action = static_cast<std::uint8_t>(MemoryAction::free_requested);
      events.push_back(out);
      out.action = static_cast<std::uint8_t>(MemoryAction::free_completed);
      events.push_back(out);
    }
  }
  std::stable_sort(events.begin(), events.end(), earlier);
  dropped = r.dropped + late;
  if (events.size() > r.capacity) {
    const std::size_t extra = events.size() - r.capacity;
    events.erase(events.begin(), events.begin() + static_cast<std::ptrdiff_t>(extra));
    dropped += extra;
  }
  return events;
}

// Drops every recorded event (a new history). Mutex held.
void clear_ring(Recorder& r) noexcept {
  for (ThreadBuffer* b : r.buffers) {
    b->tail.store(b->head.load(std::memory_order_acquire), std::memory_order_release);
  }
  for (Chunk* c : r.ring) recycle(r, c);
  r.ring.clear();
  r.ring_events = 0;
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
  TagStack& s = t_hot.tags;
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
  const TagStack& s = t_hot.tags;
  return s.depth == 0 ? kTagUser : s.ids[s.depth - 1];
}

namespace {

[[gnu::noinline]] void put_wide(ThreadState& st, ThreadBuffer* b, std::uint8_t action, int device,
                                std::uint64_t addr, std::uint64_t size, std::uint64_t stream,
                                std::uint64_t t) noexcept {
  if (b->head.load(std::memory_order_relaxed) + 2 > kChunkEvents) chunk_full(st, b);
  const std::uint32_t head = b->head.load(std::memory_order_relaxed);
  RawEvent& e = b->chunk->events[head];
  e.t = t;
  e.addr_word = (std::uint64_t{static_cast<std::uint8_t>(action | kWide)} << kFieldBits) |
                (std::uint64_t{static_cast<std::uint8_t>(device)} << 56);
  e.size_word = std::uint64_t{tag_of(st)} << kFieldBits;
  e.stream = stream;
  RawEvent& whole = b->chunk->events[head + 1];
  whole.t = addr;
  whole.addr_word = size;
  whole.size_word = whole.stream = 0;
  st.chunk_entries += entries_for(action);
  b->head.store(head + 2, std::memory_order_release);
  if (head + 2 == kChunkEvents) chunk_full(st, b);
}

inline void put(ThreadState& st, ThreadBuffer* b, std::uint8_t action, int device,
                std::uint64_t addr, std::uint64_t size, std::uint64_t stream,
                std::uint64_t t) noexcept {
  if (((addr | size) >> kFieldBits) != 0) [[unlikely]] {
    put_wide(st, b, action, device, addr, size, stream, t);
    return;
  }
  const std::uint32_t head = b->head.load(std::memory_order_relaxed);
  RawEvent& e = b->chunk->events[head];
  e.t = t;
  e.addr_word = addr | (std::uint64_t{action} << kFieldBits) |
                (std::uint64_t{static_cast<std::uint8_t>(device)} << 56);
  e.size_word = size | (std::uint64_t{tag_of(st)} << kFieldBits);
  e.stream = stream;
  st.chunk_entries += entries_for(action);
  b->head.store(head + 1, std::memory_order_release);
  if (head + 1 == kChunkEvents) [[unlikely]]
    chunk_full(st, b);
}

inline ThreadBuffer* buffer_of(ThreadState& st) noexcept {
  ThreadBuffer* b = st.buffer;
  if (b == nullptr) [[unlikely]] {
    b = new_thread_buffer();
    if (b == nullptr) recorder().lost.fetch_add(1, std::memory_order_relaxed);
  }
  return b;
}

}  // namespace

void record(MemoryAction action, int device, std::uint64_t addr, std::uint64_t size,
            std::uint64_t stream, std::uint64_t t, std::uint64_t extra) noexcept {
  ThreadState& st = t_hot;
  ThreadBuffer* b = buffer_of(st);
  if (b == nullptr) [[unlikely]]
    return;
  if (t > st.clock) st.clock = t;
  if (action == MemoryAction::oom) addr = extra;  // an oom has no address
  put(st, b, static_cast<std::uint8_t>(action), device, addr, size, stream, t);
}

std::uint64_t clock() noexcept {
  ThreadState& st = t_hot;
  // A fresh time stamp every 64th event keeps the thread's clock close to the real one.
  if ((++st.events & 63) == 0) st.clock = std::max(st.clock, ticks());
  return st.clock;
}

void touch_clock() noexcept {
  ThreadState& st = t_hot;
  st.clock = std::max(st.clock, ticks());
}

std::uint32_t thread_id() noexcept {
  return id_of(t_hot);
}

ThreadState& thread_state() noexcept {
  return t_hot;
}

std::uint64_t record_alloc(int device, std::uint64_t addr, std::uint64_t requested,
                           std::uint64_t stream, bool fresh) noexcept {
  return record_alloc(t_hot, device, addr, requested, stream, fresh);
}

std::uint64_t record_alloc(ThreadState& st, int device, std::uint64_t addr, std::uint64_t requested,
                           std::uint64_t stream, bool fresh) noexcept {
  const std::uint32_t session = g_session.load(std::memory_order_relaxed);
  ThreadBuffer* b = buffer_of(st);
  if (b != nullptr) [[likely]] {
    if (fresh || (++st.events & 63) == 0) st.clock = std::max(st.clock, ticks());
    put(st, b, static_cast<std::uint8_t>(MemoryAction::alloc), device, addr, requested, stream,
        st.clock);
  }
  return stamp_of(st, session);
}

std::uint16_t current_session() noexcept {
  return static_cast<std::uint16_t>(g_session.load(std::memory_order_relaxed));
}

void record_free(int device, std::uint64_t addr, std::uint64_t requested, std::uint64_t stream,
                 std::uint64_t t) noexcept {
  record_free(t_hot, device, addr, requested, stream, t);
}

void record_free(ThreadState& st, int device, std::uint64_t addr, std::uint64_t requested,
                 std::uint64_t stream, std::uint64_t t) noexcept {
  ThreadBuffer* b = buffer_of(st);
  if (b == nullptr) [[unlikely]]
    return;
  if (t > st.clock) st.clock = t;
  put(st, b, kRawFree, device, addr, requested, stream, t == 0 ? st.clock : t);
}

std::vector<OwnerUsage> usage_by_owner(const std::vector<OwnedBlock>& blocks) {
  std::unordered_map<std::uint16_t, std::pair<std::size_t, std::size_t>> by_tag;
  for (const OwnedBlock& b : blocks) {
    auto& [bytes, count] = by_tag[b.tag];
    bytes += b.bytes;
    ++count;
  }
  std::vector<OwnerUsage> out;
  for (const auto& [tag, usage] : by_tag) out.push_back({tag_name(tag), usage.first, usage.second});
  std::sort(out.begin(), out.end(), [](const OwnerUsage& a, const OwnerUsage& b) {
    return a.live_bytes != b.live_bytes ? a.live_bytes > b.live_bytes : a.owner < b.owner;
  });
  return out;
}

std::unordered_map<std::uint64_t, std::string> owners_by_address(
    const std::vector<OwnedBlock>& blocks) {
  std::vector<std::string> names;
  {
    Recorder& r = recorder();
    std::lock_guard lock(r.tag_mutex);
    names = r.tag_names;
  }
  std::unordered_map<std::uint64_t, std::string> out;
  for (const OwnedBlock& b : blocks) {
    out.emplace(b.addr, b.tag < names.size() ? names[b.tag] : std::string("user"));
  }
  return out;
}

TraceCut::TraceCut() : lock_(recorder().mutex) {
  drain_locked(recorder());
}

void TraceCut::fill(MemorySnapshot& snapshot, int device_count) {
  Recorder& r = recorder();
  std::vector<Event> events;
  double us_per_tick = 0;
  {
    const std::unique_lock lock = std::move(lock_);
    events = ring_events(r, snapshot.dropped_events);
    snapshot.dropped_events += r.lost.load(std::memory_order_relaxed);
    snapshot.recording = on();
    const std::uint64_t t1 = ticks();
    const auto steady1 = std::chrono::steady_clock::now();
    const double us = std::chrono::duration<double, std::micro>(steady1 - r.steady0).count();
    us_per_tick = t1 > r.t0 ? us / static_cast<double>(t1 - r.t0) : 0.0;
  }
  int devices = std::max(device_count, 1);
  for (const Event& e : events) devices = std::max(devices, static_cast<int>(e.device) + 1);
  snapshot.device_traces.assign(static_cast<std::size_t>(devices), {});
  std::vector<std::string> names;
  {
    std::lock_guard lock(r.tag_mutex);
    names = r.tag_names;
  }
  for (const Event& e : events) {
    MemoryHistoryEvent out;
    out.action = static_cast<MemoryAction>(e.action);
    out.device = e.device;
    out.addr = e.addr;
    out.size = e.size;
    out.stream = e.stream;
    out.time_us = to_time_us(r, e.t, us_per_tick);
    if (out.action == MemoryAction::oom) {  // its address field holds the device's free bytes
      out.device_free = e.addr;
      out.addr = 0;
    }
    out.owner = e.tag < names.size() ? names[e.tag] : std::string("user");
    snapshot.device_traces[e.device].push_back(std::move(out));
  }
}

LibraryTag::LibraryTag() noexcept : pushed_(t_hot.tags.depth == 0) {
  if (pushed_) t_hot.tags.ids[t_hot.tags.depth++] = kTagRaster;
}

LibraryTag::~LibraryTag() {
  if (pushed_ && t_hot.tags.depth > 0) --t_hot.tags.depth;
}

bool stop() noexcept {
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  const bool was_on = g_on.load(std::memory_order_relaxed);
  g_on.store(false, std::memory_order_relaxed);
  drain_locked(r);  // what was recorded so far stays for a snapshot
  return was_on;
}

bool start(std::size_t max_entries) {
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  if (g_on.load(std::memory_order_relaxed)) {
    drain_locked(r);
    r.capacity = max_entries;
    trim_ring(r);
    return false;
  }
  // A new history: events of the previous one still in thread buffers are discarded (clear_ring;
  // only an event being written by a thread that saw recording on before the stop can slip in,
  // as an event of the start's moment), and blocks stamped in it are not owned in this one.
  std::uint32_t session = g_session.load(std::memory_order_relaxed) + 1;
  if ((session & 0xFFFF) == 0) ++session;  // a stamp's session is never 0
  g_session.store(session, std::memory_order_relaxed);
  clear_ring(r);
  r.capacity = max_entries;
  r.dropped = 0;
  r.dropped_until = 0;
  r.lost.store(0, std::memory_order_relaxed);
  r.steady0 = std::chrono::steady_clock::now();
  r.wall0_us = static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                              std::chrono::system_clock::now().time_since_epoch())
                                              .count());
  r.t0 = ticks();
  g_on.store(true, std::memory_order_release);
  return true;
}

}  // namespace vibespatial::raster::detail::history

namespace vibespatial::raster {

namespace h = detail::history;

bool memory_history_enabled() noexcept {
  return h::on();
}

void push_memory_tag(std::string_view tag) {
  const std::uint16_t id = h::intern(tag, "push_memory_tag");
  h::push_id(id, "push_memory_tag");
}

void pop_memory_tag() {
  if (h::t_hot.tags.depth == 0) {
    throw std::logic_error("pop_memory_tag: no memory tag is pushed on this thread");
  }
  --h::t_hot.tags.depth;
}

std::string current_memory_tag() {
  return h::tag_name(h::current_tag());
}

std::size_t memory_tag_depth() noexcept {
  return h::t_hot.tags.depth;
}

MemoryTag::MemoryTag(std::string_view tag) : depth_(0) {
  push_memory_tag(tag);
  depth_ = h::t_hot.tags.depth;
}

MemoryTag::~MemoryTag() {
  // Pops its own level; tags pushed inside it and not popped go with it.
  if (h::t_hot.tags.depth >= depth_) h::t_hot.tags.depth = depth_ - 1;
}

DefaultMemoryTag::DefaultMemoryTag(std::string_view tag) : pushed_(false) {
  if (h::t_hot.tags.depth != 0) return;
  const std::uint16_t id = h::intern(tag, "DefaultMemoryTag");
  h::push_id(id, "DefaultMemoryTag");
  pushed_ = true;
}

DefaultMemoryTag::~DefaultMemoryTag() {
  if (pushed_ && h::t_hot.tags.depth > 0) --h::t_hot.tags.depth;
}

void memory_history_marker(std::string_view name) {
  const std::uint16_t id = h::intern(name, "memory_history_marker");
  if (!h::on()) return;
  h::TagStack& s = h::t_hot.tags;
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
    case MemoryAction::segment_alloc:
      return "segment_alloc";
    case MemoryAction::segment_free:
      return "segment_free";
  }
  return "unknown";
}

}  // namespace vibespatial::raster
