// SPDX-License-Identifier: Apache-2.0
// check_device_range (memory.hpp): a caller's pointer and size against the memory that holds
// them, before any copy. The pool answers for its own blocks exactly (a small block's page, or a
// large block's mapping, is far larger than the block); the driver (cuMemGetAddressRange) for
// other memory. In every tier.
#include "pool_fixture.hpp"

#include <cstdint>
#include <stdexcept>
#include <string>

using namespace vibespatial::raster;
using namespace vsr_test;

namespace {

/// The message check_device_range throws for (ptr, bytes), "" when it passes.
std::string refusal(const void* ptr, std::size_t bytes) {
  try {
    check_device_range(ptr, bytes, "test");
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

const unsigned char* at(const void* p, std::size_t offset) {
  return static_cast<const unsigned char*>(p) + offset;
}

/// The checks every tier must pass: a small block, an interior range, a claim past its end
/// (64 x 64 and 1024 x 1024 float32 over a 64-byte block), a freed block, other memory.
void check_tier() {
  void* small = device_allocate(64);
  CHECK(refusal(small, 64) == "");
  CHECK(refusal(at(small, 16), 48) == "");
  CHECK(refusal(at(small, 63), 1) == "");
  const std::string past = refusal(small, 64 * 64 * 4);
  CHECK(past.rfind("test: 16384 bytes at 0x", 0) == 0);
  CHECK(past.find("run past the end of the pool block holding it (64 bytes at") !=
        std::string::npos);
  CHECK(refusal(small, 1024 * 1024 * 4) != "");
  CHECK(refusal(at(small, 16), 49) != "");
  CHECK(refusal(at(small, 64), 1) != "");  // the next byte is not this block's
  // Nothing was read: the device is still usable.
  void* again = device_allocate(1 << 20);
  device_deallocate(again, 1 << 20);
  // A large block: its requested bytes, not its pages.
  const std::size_t large_bytes = 3 * MiB + 5;
  void* large = device_allocate(large_bytes);
  CHECK(refusal(large, large_bytes) == "");
  CHECK(refusal(at(large, MiB), large_bytes - MiB) == "");
  CHECK(refusal(large, large_bytes + 1) != "");
  device_deallocate(large, large_bytes);
  device_deallocate(small, 64);
  // A freed block is refused (the pool still holds the memory, or gave it back to the driver).
  CHECK(refusal(small, 1) != "");
  CHECK(refusal(large, 1) != "");
  // Nothing to check for no bytes; a null pointer with bytes, and a range that wraps, are refused.
  CHECK(refusal(nullptr, 0) == "");
  CHECK(refusal(nullptr, 1).rfind("test: null device pointer", 0) == 0);
  CHECK(refusal(reinterpret_cast<const void*>(~std::uintptr_t{0} - 10), 100).find("wrap") !=
        std::string::npos);
}

/// Memory the pool does not hold: the driver's allocation, and host memory (no allocation).
void check_other_memory() {
  const detail::DriverApi& api = detail::driver();
  detail::bind_current_device();
  CUdeviceptr p = 0;
  REQUIRE(api.cuMemAlloc(&p, 1000) == CUDA_SUCCESS);
  const void* ptr = reinterpret_cast<const void*>(p);
  CHECK(refusal(ptr, 1000) == "");
  CHECK(refusal(at(ptr, 999), 1) == "");
  CHECK(refusal(ptr, 1001).find("run past the end of the device allocation holding it (1000 "
                                "bytes at") != std::string::npos);
  REQUIRE(api.cuMemFree(p) == CUDA_SUCCESS);
  CHECK(refusal(ptr, 1).find("is not device memory") != std::string::npos);
  int on_stack = 0;
  CHECK(refusal(&on_stack, sizeof on_stack).find("is not device memory") != std::string::npos);
}

}  // namespace

TEST_SUITE("pool") {
  TEST_CASE("check_device_range: a VMM pool block holds its requested bytes, not its mapping") {
    FreshPool fresh;
    REQUIRE(configure_memory_pool() == "B");
    check_tier();
    check_other_memory();
    // A thread-cached block is not live either.
    void* p = device_allocate(100);
    device_deallocate(p, 100);
    CHECK(refusal(p, 1).find("in no live block") != std::string::npos);
  }

  TEST_CASE("check_device_range: the fallback tier's blocks") {
    FreshPool fresh(nullptr, 512u << 20, "0");
    REQUIRE(configure_memory_pool() == "fallback");
    check_tier();
    check_other_memory();
    // A cached block: the pool holds its cuMemAlloc allocation, but it is no one's now.
    void* p = device_allocate(5000);
    device_deallocate(p, 5000);
    CHECK(refusal(p, 1).find("in no live block") != std::string::npos);
    free_pool_memory();
    CHECK(refusal(p, 1).find("is not device memory") != std::string::npos);
  }

  TEST_CASE("check_device_range: tier C's blocks") {
    FreshPool fresh("VIBESPATIAL_GPU_MANAGED_MEMORY");
    REQUIRE(configure_memory_pool() == "C");
    check_tier();
    check_other_memory();
  }

  TEST_CASE("check_device_range: before the pool is configured, the driver answers") {
    FreshPool fresh;
    check_other_memory();
    CHECK(memory_pool_stats().tier.empty());  // nothing configured the pool
  }
}
