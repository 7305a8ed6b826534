// SPDX-License-Identifier: Apache-2.0
// Multi-page handles (vmm_pool_impl.hpp, MultiPageHandle): a long run of new large pages is one
// cuMemCreate, mapped whole; its free pages are reused in place; it is unmapped and released
// whole once all of its pages are free; a full device gives it back for pages elsewhere; and
// every driver call on those paths may fail without a leak or an unusable pool.
#include "pool_fixture.hpp"

#include <cstdlib>
#include <string>
#include <vector>

using namespace vibespatial::raster;
using namespace vsr_test;

namespace {

/// VSR_POOL_MULTI_PAGE_MIN for the scope (nullptr: unset), set before the pool is configured.
class MultiPageMin {
 public:
  explicit MultiPageMin(const char* value) {
    if (value != nullptr) {
      setenv("VSR_POOL_MULTI_PAGE_MIN", value, 1);
    } else {
      unsetenv("VSR_POOL_MULTI_PAGE_MIN");
    }
  }
  ~MultiPageMin() { unsetenv("VSR_POOL_MULTI_PAGE_MIN"); }
  MultiPageMin(const MultiPageMin&) = delete;
  MultiPageMin& operator=(const MultiPageMin&) = delete;
};

/// Calls of `entry` made while `f` runs.
template <typename F>
unsigned long long calls_during(const char* entry, F&& f) {
  const unsigned long long before = emulator().call_count(entry);
  f();
  return emulator().call_count(entry) - before;
}

std::string invariants() {
  return detail::pool_for_device(0).check_invariants();
}

/// The full-device case, with 8 MiB pages and multi-page handles from 4 pages, on a device of 24
/// pages (and a large region of as many; one small page holds the warm-up block): a free
/// multi-page handle (8 pages, pages 0-7) before a live block (2 pages, 8-9), then a request (14
/// pages) that fits in no free range and only after the live block, and that the device holds
/// only once the handle's memory is given back. Returns the live blocks.
constexpr std::size_t kPage = 8 * MiB;
constexpr std::size_t kFullDevice = 24 * kPage, kFirst = 8 * kPage, kMiddle = 2 * kPage,
                      kLast = 14 * kPage;

/// The page size and the multi-page minimum of the full-device case, for a scope that starts
/// with no pool (after FreshPool).
class FullDeviceShape {
 public:
  FullDeviceShape() : page_("RECOMMENDED_GRANULARITY", "8388608"), knob_("4") {}

 private:
  EmulatorOption page_;
  MultiPageMin knob_;
};
struct Block {
  void* ptr;
  std::size_t bytes;
};
std::vector<Block> full_device_case(int& typed_errors) {
  std::vector<Block> live;
  auto alloc = [&](std::size_t bytes) {
    try {
      live.push_back({device_allocate(bytes), bytes});
    } catch (const CudaError&) {
      ++typed_errors;
    } catch (const std::bad_alloc&) {
      ++typed_errors;
    }
  };
  alloc(kFirst);
  alloc(kMiddle);
  if (!live.empty() && live.front().bytes == kFirst) {
    device_deallocate(live.front().ptr, live.front().bytes);
    live.erase(live.begin());
  }
  alloc(kLast);
  try {
    free_pool_memory();
  } catch (const CudaError&) {
    ++typed_errors;
  }
  return live;
}

}  // namespace

TEST_SUITE("pool") {
  TEST_CASE("multi-page handles: a large growth is one cuMemCreate, the per-page way one a page") {
    for (const char* min : {static_cast<const char*>(nullptr), "0"}) {
      CAPTURE(std::string(min ? min : "(default)"));
      FreshPool fresh(nullptr, 1024 * MiB);
      MultiPageMin knob(min);
      void* warm = device_allocate(4096);  // configures the pool
      void* p = nullptr;
      const unsigned long long creates =
          calls_during("cuMemCreate", [&] { p = device_allocate(512 * MiB); });
      CHECK(creates == (min == nullptr ? 1 : 256));
      CHECK(*memory_pool_stats().pool_size == 2 * MiB + 512 * MiB);
      CHECK(invariants() == "");
      fill_pattern(p, 512 * MiB, 7);
      CHECK(check_pattern(p, 512 * MiB, 7));
      device_deallocate(p, 512 * MiB);
      device_deallocate(warm, 4096);
      free_pool_memory();
      CHECK(*memory_pool_stats().pool_size == 0);
    }
  }

  TEST_CASE("multi-page handles: free pages are reused in place, the handle released whole") {
    FreshPool fresh(nullptr, 1024 * MiB);
    MultiPageMin knob(nullptr);
    void* p = device_allocate(512 * MiB);
    device_deallocate(p, 512 * MiB);
    void* a = nullptr;
    void* b = nullptr;
    const unsigned long long maps_before = emulator().call_count("cuMemMap");
    const unsigned long long creates = calls_during("cuMemCreate", [&] {
      a = device_allocate(100 * MiB);
      b = device_allocate(200 * MiB);
    });
    CHECK(creates == 0);
    CHECK(emulator().call_count("cuMemMap") == maps_before);
    fill_pattern(a, 100 * MiB, 1);
    fill_pattern(b, 200 * MiB, 2);
    // Live pages keep the whole handle: trim unmaps and releases nothing of it.
    const unsigned long long releases = calls_during("cuMemRelease", [] { free_pool_memory(); });
    CHECK(releases == 0);
    CHECK(*memory_pool_stats().pool_size == 512 * MiB);
    CHECK(invariants() == "");
    CHECK(check_pattern(a, 100 * MiB, 1));
    device_deallocate(a, 100 * MiB);
    CHECK(calls_during("cuMemRelease", [] { free_pool_memory(); }) == 0);
    CHECK(check_pattern(b, 200 * MiB, 2));
    device_deallocate(b, 200 * MiB);
    CHECK(calls_during("cuMemUnmap", [] { free_pool_memory(); }) == 1);
    CHECK(*memory_pool_stats().pool_size == 0);
    CHECK(memory_pool_stats().mapped_bytes == 0);
    CHECK(invariants() == "");
  }

  // Tier A: no recovery chain, whose trim would give the handle back too.
  TEST_CASE("multi-page handles: a full device gives a free handle back for pages elsewhere") {
    FreshPool fresh("VIBESPATIAL_GPU_POOL_ONLY", kFullDevice);
    FullDeviceShape shape;
    void* warm = device_allocate(4096);  // the small page, as in the fault runs
    int errors = 0;
    std::vector<Block> live = full_device_case(errors);
    CHECK(errors == 0);
    REQUIRE(live.size() == 2);
    fill_pattern(live[1].ptr, kLast, 3);
    CHECK(check_pattern(live[1].ptr, kLast, 3));
    CHECK(invariants() == "");
    // The handle went back: the pool holds the small page and the two live blocks.
    CHECK(*memory_pool_stats().pool_size == kPage + kMiddle + kLast);
    for (const Block& b : live) device_deallocate(b.ptr, b.bytes);
    device_deallocate(warm, 4096);
    free_pool_memory();
    CHECK(*memory_pool_stats().pool_size == 0);
  }

  // Every VMM call of the multi-page paths (create, map, set access of a handle; unmap and
  // release of a whole handle, on a full device and in trim) fails once in turn.
  TEST_CASE("multi-page handles: fault injection on the full-device case") {
    const char* const entries[] = {"cuMemCreate", "cuMemMap",     "cuMemSetAccess",
                                   "cuMemUnmap",  "cuMemRelease", "cuMemGetInfo"};
    std::vector<unsigned long long> counts;
    {
      FreshPool fresh(nullptr, kFullDevice);
      FullDeviceShape shape;
      void* warm = device_allocate(4096);  // the pool's set-up is not replayed
      emulator().set_fail("");
      int errors = 0;
      std::vector<Block> live = full_device_case(errors);
      REQUIRE(errors == 0);
      for (const char* e : entries) counts.push_back(emulator().call_count(e));
      for (const Block& b : live) device_deallocate(b.ptr, b.bytes);
      device_deallocate(warm, 4096);
    }
    int injected = 0;
    for (std::size_t k = 0; k < std::size(entries); ++k) {
      for (unsigned long long n = 1; n <= counts[k]; ++n) {
        const std::string spec = std::string(entries[k]) + ":" + std::to_string(n);
        CAPTURE(spec);
        FreshPool fresh(nullptr, kFullDevice);
        FullDeviceShape shape;
        void* warm = device_allocate(4096);
        REQUIRE(emulator().set_fail(spec.c_str()) == 0);
        int errors = 0;
        std::vector<Block> live;
        try {
          live = full_device_case(errors);
        } catch (const std::invalid_argument& e) {
          FAIL("an injected driver failure surfaced as invalid_argument: " << e.what());
        }
        CHECK(faults_fired(entries[k]) == 1);
        emulator().set_fail("");
        CHECK(invariants() == "");
        for (const Block& b : live) {
          fill_pattern(b.ptr, b.bytes, 5);
          CHECK(check_pattern(b.ptr, b.bytes, 5));
          CHECK_NOTHROW(device_deallocate(b.ptr, b.bytes));
        }
        // Still usable: the same large requests again.
        void* big = device_allocate(kLast);
        fill_pattern(big, kLast, 6);
        CHECK(check_pattern(big, kLast, 6));
        device_deallocate(big, kLast);
        device_deallocate(warm, 4096);
        CHECK(*memory_pool_stats().current_count == 0);
        CHECK_NOTHROW(free_pool_memory());
        CHECK(invariants() == "");
        detail::reset_memory_pools();
        check_nothing_outstanding();
        ++injected;
      }
    }
    MESSAGE(injected << " single-fault runs of the multi-page paths");
    CHECK(injected > 10);
  }
}
