// SPDX-License-Identifier: Apache-2.0
// A sticky error (7xx) poisons the context until the process ends, so this runs in a process of
// its own (test 'pool-sticky'). With it pending, VMM calls do their work and then return it
// (cuda.h \notefnerr; the emulator's VSR_EMU_STICKY_VMM): the pool must take such an unmap or
// release as done and never repeat it, since releasing a released handle is undefined (§7 #5).
#include "pool_fixture.hpp"

namespace vsr = vibespatial::raster;
using vsr_test::emulator;
using vsr_test::MiB;

TEST_CASE("a poisoned context: free_pool_memory releases every page once and reports the error") {
  vsr_test::FreshPool fresh(nullptr, 64 * MiB);
  void* large = vsr::device_allocate(8 * MiB);
  void* small = vsr::device_allocate(4096);
  vsr::device_deallocate(large, 8 * MiB);
  vsr::device_deallocate(small, 4096);
  REQUIRE(*vsr::memory_pool_stats().pool_size > 0);
  // A device access to reserved address space with nothing mapped: CUDA_ERROR_ILLEGAL_ADDRESS,
  // and the context is poisoned.
  const auto& api = vsr::detail::driver();
  CUdeviceptr hole = 0;
  REQUIRE(api.cuMemAddressReserve(&hole, 2 * MiB, 0, 0, 0) == CUDA_SUCCESS);
  REQUIRE(api.cuMemsetD8(hole, 0, 1) == CUDA_ERROR_ILLEGAL_ADDRESS);
  const unsigned long long stale = emulator().outstanding().stale_handles;
  CHECK_THROWS_AS(vsr::free_pool_memory(), vsr::CudaError);
  CHECK(emulator().outstanding().handles == 0);  // every page released (the calls took effect)
  CHECK(*vsr::memory_pool_stats().pool_size == 0);
  // A second trim has nothing left to release: no handle is named twice.
  try {
    vsr::free_pool_memory();
  } catch (const vsr::CudaError&) {
  }
  CHECK(emulator().outstanding().stale_handles == stale);
  api.cuMemAddressFree(hole, 2 * MiB);  // takes effect, and reports the sticky error
}
