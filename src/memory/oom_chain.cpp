// SPDX-License-Identifier: Apache-2.0
// memory.hpp's OOM recovery chain (tier B): when the device is full, give every free page back and
// retry; then rounds of the registered OOM handlers, each followed by giving free pages back and
// retrying; and the OutOfMemoryError that says what the pool and the driver hold.
#include "common/byte_text.hpp"
#include "common/expects.hpp"
#include "memory/memory_history.hpp"
#include "memory/memory_owners.hpp"
#include "memory/registry_state.hpp"

#include <vibespatial/raster/memory.hpp>

#include <string>
#include <vector>

namespace vibespatial::raster::detail {
namespace {

constexpr int kRecoveryRounds = 3;

// Set while this thread runs OOM handlers: an allocation made by a handler that finds the
// device full fails at once instead of running the chain again (which would call the handler
// again, without bound).
thread_local bool t_in_oom_handler = false;

std::string driver_memory(int device) {
  try {
    ScopedDeviceContext scope(device);
    std::size_t free_b = 0, total_b = 0;
    if (driver().cuMemGetInfo(&free_b, &total_b) == CUDA_SUCCESS) {
      return "the driver reports " + format_bytes(free_b) + " free of " + format_bytes(total_b);
    }
  } catch (const std::exception&) {
  }
  return "the driver's free memory is unknown";
}

// The top owners by live bytes, from the memory history (memory_history.hpp).
std::string owners(int device) {
  std::vector<OwnerUsage> top;
  try {
    top = owner_usage(device);
  } catch (const std::exception&) {
    top.clear();
  }
  if (top.empty()) {
    return history::on() ? "no live block was allocated while recording"
                         : "owners unknown (record_memory_history() records them)";
  }
  std::string text = "top owners by live bytes: ";
  for (std::size_t i = 0; i < top.size() && i < 5; ++i) {
    if (i > 0) text += ", ";
    text += top[i].owner + " " + byte_text(top[i].live_bytes) + " in " +
            std::to_string(top[i].live_count) + (top[i].live_count == 1 ? " block" : " blocks");
  }
  if (top.size() > 5) text += ", and " + std::to_string(top.size() - 5) + " more";
  return text;
}

[[noreturn]] void throw_oom(DevicePool& pool, std::size_t bytes, const std::string& note) {
  if (history::on()) {
    std::size_t free_b = 0, total_b = 0;
    try {
      ScopedDeviceContext scope(pool.device());
      if (driver().cuMemGetInfo(&free_b, &total_b) != CUDA_SUCCESS) free_b = 0;
    } catch (const std::exception&) {
      free_b = 0;
    }
    history::record(MemoryAction::oom, pool.device(), 0, bytes, 0, history::ticks(), free_b);
  }
  throw OutOfMemoryError(bytes, "device_allocate: out of memory on device " +
                                    std::to_string(pool.device()) + " (tier " +
                                    tier_name(current_tier()) + "): requested " +
                                    format_bytes(bytes) + "; " + driver_memory(pool.device()) +
                                    "; " + pool.describe() + "; " + owners(pool.device()) + note);
}

// Every free page of `pool` back to the driver, after its freeing work completes; what cannot be
// released stays in the pool, and the retry that follows decides.
void release_free_pages(DevicePool& pool) {
  try {
    pool.trim();
  } catch (const CudaError&) {
  }
}

// Runs every registered handler once with t_in_oom_handler set; returns how many ran.
std::size_t run_handlers(Registry& r, std::size_t bytes) {
  std::vector<std::shared_ptr<OomHandler>> handlers;
  {
    std::lock_guard lock(r.handler_mutex);
    for (auto& [id, h] : r.handlers) handlers.push_back(h);
  }
  struct InHandlers {
    bool outer = t_in_oom_handler;
    InHandlers() { t_in_oom_handler = true; }
    ~InHandlers() { t_in_oom_handler = outer; }
  } in_handlers;
  for (const auto& h : handlers) (*h)(bytes);
  return handlers.size();
}

}  // namespace

void* allocate_after_full(DevicePool& pool, std::size_t bytes, CUstream stream,
                          const DeviceFull& full) {
  if (full.impossible) throw_oom(pool, bytes, "; the request is larger than the device's memory");
  if (current_tier() != Tier::b) throw_oom(pool, bytes, "");
  if (t_in_oom_handler) {
    throw_oom(pool, bytes,
              "; called from inside an OOM handler, where the recovery chain does not run again");
  }
  // Tier B's recovery chain. The pool holds none of its locks here, so handlers may free memory
  // through it. Free pages (slack included) go back before every retry and before every round of
  // handlers: no handler runs while the pool holds free memory a retry could serve the request
  // from (a failed retry may leave pages it made before finding too few).
  Registry& r = registry();
  std::size_t handlers_run = 0;
  for (int round = 0; round <= kRecoveryRounds; ++round) {
    if (round > 0) {
      release_free_pages(pool);
      handlers_run += run_handlers(r, bytes);
    }
    release_free_pages(pool);
    try {
      void* p = pool.allocate(bytes, stream);
      r.recoveries[static_cast<std::size_t>(pool.device())].fetch_add(1);
      return p;
    } catch (const DeviceFull&) {
    }
  }
  throw_oom(pool, bytes,
            "; the recovery chain ran " + std::to_string(kRecoveryRounds) + " rounds (" +
                std::to_string(handlers_run) + " OOM handler calls, free pages released, retried)");
}

}  // namespace vibespatial::raster::detail

namespace vibespatial::raster {

using detail::registry;

std::uint64_t add_oom_handler(OomHandler handler) {
  if (detail::in_forked_child()) [[unlikely]]
    detail::throw_forked_child(__func__);
  VSR_EXPECTS(static_cast<bool>(handler), "add_oom_handler: empty handler");
  detail::note_pool_use();
  detail::Registry& r = registry();
  std::lock_guard lock(r.handler_mutex);
  const std::uint64_t id = r.next_handler++;
  r.handlers.emplace(id, std::make_shared<OomHandler>(std::move(handler)));
  return id;
}

void remove_oom_handler(std::uint64_t id) {
  if (detail::in_forked_child()) [[unlikely]]
    detail::throw_forked_child(__func__);
  detail::note_pool_use();
  detail::Registry& r = registry();
  std::lock_guard lock(r.handler_mutex);
  r.handlers.erase(id);
}

}  // namespace vibespatial::raster
