// SPDX-License-Identifier: Apache-2.0
// The emulator's global state (st(), the calling thread's current context) and what every entry
// point checks and charges: initialization, devices, contexts, device memory accounting, the
// reservation table. Rules and error codes follow
// docs/cuda-driver-rules.md (cited as §n); the glossary and the locking rules are in
// emulator_state.hpp.
#include "emulator_state.hpp"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>

namespace vsr::emu {

thread_local CUctx_st* tl_current = nullptr;

State& st() {
  static State* state = [] {
    auto* s = new State;
    read_env(s->config);
    s->env_config = s->config;
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

CUresult need_context(State& s, CUctx_st** out) {
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (tl_current == nullptr || !tl_current->active) return CUDA_ERROR_INVALID_CONTEXT;
  if (tl_current->poisoned) return CUDA_ERROR_ILLEGAL_ADDRESS;
  *out = tl_current;
  return CUDA_SUCCESS;
}

size_t device_free(State& s, int dev) {
  size_t used = s.devices[static_cast<size_t>(dev)]->charged + context_overhead(s.config);
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

std::map<uintptr_t, size_t>::iterator containing_reservation(State& s, uintptr_t p) {
  auto it = s.reservations.upper_bound(p);
  if (it == s.reservations.begin()) return s.reservations.end();
  --it;
  return p < it->first + it->second ? it : s.reservations.end();
}

std::string hex_range(uintptr_t begin, uintptr_t end) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "[0x%llx, 0x%llx)", static_cast<unsigned long long>(begin),
                static_cast<unsigned long long>(end));
  return buf;
}

}  // namespace vsr::emu
