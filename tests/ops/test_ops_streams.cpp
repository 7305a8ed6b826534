// SPDX-License-Identifier: Apache-2.0
// Device ops on streams, on the emulated device backend: an op's output is pool memory for the
// op's own stream. The pool may hand an op a block freed on another stream T whose work is still
// queued; it then orders the stream the block is for after T. If that were the legacy stream
// while the op writes from a non-blocking stream S, S would overwrite the block under T's queued
// work, and no caller could prevent it (the wait is inserted inside the op's call).
#include "driver/cuda_driver.hpp"
#include "memory/pool_fixture.hpp"

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/memory.hpp>
#include <vibespatial/raster/ops.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

using namespace vibespatial::raster;
using namespace vsr_test;

namespace {

const detail::DriverApi& api() {
  return detail::driver();
}

/// A float32 device raster of @p pixels pixels, every one @p value, complete on every stream.
OwnedRasterArray device_constant(std::int64_t pixels, float value) {
  std::vector<float> v(static_cast<std::size_t>(pixels), value);
  auto r = OwnedRasterArray::from_host(v.data(), DType::float32, 1, 1, pixels);
  r.move_to(Residency::device);
  return r;
}

/// One round: a block of @p bytes holding @p pattern, read back on T by a copy still queued when
/// the block is freed on T; then an op on S takes pool memory of the same size. Returns whether
/// T's copy read the pattern, and sets @p same_block when the op's output is the freed block.
/// With @p hold, T is held from before its copy until S's work has run (or 300 ms passed), so
/// the copy runs after whatever S does without waiting for T.
bool round_trip(CUstream t, CUstream s, const OwnedRasterArray& in, std::size_t bytes,
                unsigned char pattern, bool hold, bool& same_block) {
  void* block = device_allocate(bytes, t);
  std::vector<unsigned char> src(bytes, pattern), got(bytes, 0);
  REQUIRE(api().cuMemcpyHtoDAsync(detail::to_device_ptr(block), src.data(), bytes, t) ==
          CUDA_SUCCESS);
  REQUIRE(api().cuStreamSynchronize(t) == CUDA_SUCCESS);
  if (hold) REQUIRE(emulator().stream_pause(t, 1) == 0);
  REQUIRE(api().cuMemcpyDtoHAsync(got.data(), detail::to_device_ptr(block), bytes, t) ==
          CUDA_SUCCESS);
  device_deallocate(block, bytes, t);
  // The op writes 2.0f everywhere: bytes 0x00 0x00 0x00 0x40, never the pattern.
  const OwnedRasterArray out = rescale(in, 0, 1, 0, 2, DType::float32, s);
  same_block = out.device_pointer() == block;
  if (hold) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
    while (api().cuStreamQuery(s) == CUDA_ERROR_NOT_READY &&
           std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    REQUIRE(emulator().stream_pause(t, 0) == 0);
  }
  REQUIRE(api().cuStreamSynchronize(t) == CUDA_SUCCESS);
  REQUIRE(api().cuStreamSynchronize(s) == CUDA_SUCCESS);
  bool ok = true;
  for (unsigned char c : got) ok = ok && c == pattern;
  return ok;
}

struct Streams {
  CUstream t = new_stream(), s = new_stream();
  ~Streams() {
    for (CUstream x : {t, s}) {
      forget_stream(x);
      (void)api().cuStreamDestroy(x);
    }
  }
};

}  // namespace

TEST_SUITE("ops-streams") {
  TEST_CASE("an op's output is ordered after the stream that freed its block (held stream)") {
    // Default streams on workers, as a GPU runs them: the legacy stream's waits then block no
    // host thread.
    EmulatorOption async("ASYNC_DEFAULT_STREAMS", "1");
    for (const std::size_t bytes : {std::size_t{4} << 20, std::size_t{3} << 20}) {
      CAPTURE(bytes);
      FreshPool fresh(nullptr, 64u << 20);
      Streams st;
      const auto in = device_constant(static_cast<std::int64_t>(bytes / 4), 1.0f);
      bool same = false;
      const bool ok = round_trip(st.t, st.s, in, bytes, 0x5a, true, same);
      REQUIRE_MESSAGE(same, "the pool did not hand the op the block freed on T: nothing tested");
      CHECK_MESSAGE(ok, "T's queued copy read what the op on S wrote into the block freed on T");
    }
  }

  TEST_CASE("many rounds with stream work run late: T reads what it wrote, always") {
    EmulatorOption async("ASYNC_DEFAULT_STREAMS", "1");
    EmulatorOption late("LATE_WORK", "300us");
    FreshPool fresh(nullptr, 64u << 20);
    Streams st;
    const std::size_t bytes = std::size_t{4} << 20;
    const auto in = device_constant(static_cast<std::int64_t>(bytes / 4), 1.0f);
    int bad = 0, reused = 0;
    for (int r = 0; r < 40; ++r) {
      bool same = false;
      if (!round_trip(st.t, st.s, in, bytes, static_cast<unsigned char>(0x11 + r), false, same))
        ++bad;
      reused += same ? 1 : 0;
    }
    MESSAGE(reused << " of 40 rounds reused the block freed on T");
    CHECK(bad == 0);
  }
}
