// SPDX-License-Identifier: Apache-2.0
// memory_owners.hpp: the owned blocks from each device's pool (DevicePool::collect_owned) while
// recording, and the copy kept at a stop.
#include "memory/memory_owners.hpp"

#include "memory/registry_state.hpp"

#include <array>
#include <mutex>
#include <utility>

namespace vibespatial::raster::detail {
namespace {

struct Kept {
  std::mutex mutex;
  bool valid = false;  // a history stopped and its owners are kept
  std::array<std::vector<history::OwnedBlock>, kMaxDevices> blocks;
};

Kept& kept() {
  static Kept* k = new Kept();  // leaked, as the registry: read by threads after static destruction
  return *k;
}

std::vector<history::OwnedBlock> pool_blocks(int device) {
  std::vector<history::OwnedBlock> out;
  const DevicePool* pool = registry().pools[static_cast<std::size_t>(device)].load();
  if (pool != nullptr) pool->collect_owned(history::current_session(), out);
  return out;
}

}  // namespace

std::vector<history::OwnedBlock> owned_blocks(int device) {
  if (device < 0 || device >= kMaxDevices) return {};
  if (history::on()) return pool_blocks(device);
  Kept& k = kept();
  std::lock_guard lock(k.mutex);
  return k.valid ? k.blocks[static_cast<std::size_t>(device)] : std::vector<history::OwnedBlock>{};
}

std::vector<OwnerUsage> owner_usage(int device) {
  return history::usage_by_owner(owned_blocks(device));
}

std::vector<history::OwnedBlock> owned_blocks_held(const std::vector<const DevicePool*>& pools) {
  std::vector<history::OwnedBlock> all;
  if (history::on()) {
    for (const DevicePool* pool : pools)
      pool->collect_owned_locked(history::current_session(), all);
    return all;
  }
  Kept& k = kept();
  std::lock_guard lock(k.mutex);
  if (!k.valid) return all;
  for (const auto& blocks : k.blocks) all.insert(all.end(), blocks.begin(), blocks.end());
  return all;
}

void keep_owned_blocks() noexcept {
  std::array<std::vector<history::OwnedBlock>, kMaxDevices> now;
  bool valid = true;
  try {
    for (int d = 0; d < kMaxDevices; ++d) now[static_cast<std::size_t>(d)] = pool_blocks(d);
  } catch (...) {
    valid = false;  // no host memory: the owners are unknown after the stop
  }
  Kept& k = kept();
  std::lock_guard lock(k.mutex);
  k.valid = valid;
  if (valid) k.blocks.swap(now);
}

void forget_owned_blocks() noexcept {
  Kept& k = kept();
  std::lock_guard lock(k.mutex);
  k.valid = false;
  for (auto& b : k.blocks) std::vector<history::OwnedBlock>().swap(b);
}

}  // namespace vibespatial::raster::detail
