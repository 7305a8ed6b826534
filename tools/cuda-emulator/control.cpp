// SPDX-License-Identifier: Apache-2.0
// The test control API's view of live objects (vsr_emu_query_outstanding) and the report of them at
// exit (VSR_EMU_REPORT). The fault plan, call counts and options are in options.cpp, stream pauses
// in streams.cpp.
#include "emulator_state.hpp"

#include <cstdio>
#include <mutex>

namespace vsr::emu {

void print_report() {
  vsr_emu_outstanding o{};
  vsr_emu_query_outstanding(&o, -1);
  std::fprintf(stderr,
               "vsr-cuda-emulator outstanding: reservations=%zu (%zu B) handles=%zu (%zu B) "
               "mappings=%zu allocations=%zu (%zu B) managed=%zu (%zu B) host=%zu (%zu B) "
               "streams=%zu events=%zu stale_handles=%zu unmap_with_pending_work=%zu\n",
               o.reservations, o.reserved_bytes, o.handles, o.physical_bytes, o.mappings,
               o.allocations, o.allocation_bytes, o.managed, o.managed_bytes, o.host_allocations,
               o.host_bytes, o.streams, o.events, o.stale_handles, o.unmap_with_pending_work);
}

}  // namespace vsr::emu

using namespace vsr::emu;

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
  o.stale_handles = static_cast<size_t>(s.stale_handles);
  o.unmap_with_pending_work = static_cast<size_t>(s.unmap_with_pending_work);
  *out = o;
  return CUDA_SUCCESS;
}
