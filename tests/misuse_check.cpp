// SPDX-License-Identifier: Apache-2.0
// With VSR_TEST_NO_MISUSE=1 (the adversarial runs of the memory, buffers, dispatch and ops
// suites), a test executable fails when, over the whole run, a driver call named a destroyed
// stream or event or a released handle (the emulator's stale_handles) or memory was unmapped or
// freed under queued work (unmap_with_pending_work). Both are undefined behaviour on a real
// driver that the emulator only counts (docs/cuda-driver-rules.md §7).
#include "emulator_control.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>

int vsr_test_after_run() {
  const char* on = std::getenv("VSR_TEST_NO_MISUSE");
  if (on == nullptr || std::strcmp(on, "1") != 0) return 0;
  const vsr_emu_outstanding o = vsr_test::emulator().outstanding();
  if (o.stale_handles == 0 && o.unmap_with_pending_work == 0) return 0;
  std::fprintf(stderr,
               "misuse check: %zu driver calls named destroyed streams, events or released "
               "handles (stale_handles); %zu unmaps or frees found queued work "
               "(unmap_with_pending_work); both must be 0\n",
               o.stale_handles, o.unmap_with_pending_work);
  return 1;
}
