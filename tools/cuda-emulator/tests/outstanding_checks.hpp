// SPDX-License-Identifier: Apache-2.0
// Test helper shared by the emulator's self-tests (emulator_driver.hpp) and the library's tests
// (tests/memory/pool_fixture.hpp, through the emulator's dependency, as
// "tests/outstanding_checks.hpp"): what "the emulator holds no device memory" means, one CHECK
// per count, so that a failure names the count.
#pragma once

#include "vsr_emulator.h"

#include <doctest/doctest.h>

namespace vsr_emu_test {

/// No reservation, physical allocation, mapping, cuMemAlloc or managed allocation in `o`.
inline void check_no_device_memory(const vsr_emu_outstanding& o) {
  CHECK(o.reservations == 0);
  CHECK(o.handles == 0);
  CHECK(o.physical_bytes == 0);
  CHECK(o.mappings == 0);
  CHECK(o.allocations == 0);
  CHECK(o.managed == 0);
}

}  // namespace vsr_emu_test
