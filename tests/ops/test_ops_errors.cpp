// SPDX-License-Identifier: Apache-2.0
// How the band operations report errors: bad arguments the device path cannot take, and device
// errors as typed errors that name the operation (on the host emulator, the emulated device
// backend with faults the emulator injects).
#include "memory/pool_fixture.hpp"
#include "ops/runtime_errors.hpp"

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/errors.hpp>
#include <vibespatial/raster/ops.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace vibespatial::raster;
using namespace vsr_test;

namespace {

OwnedRasterArray device_raster(int bands, std::int64_t h, std::int64_t w) {
  std::vector<float> v(static_cast<std::size_t>(bands * h * w), 1.5f);
  auto r = OwnedRasterArray::from_host(v.data(), DType::float32, bands, h, w);
  r.move_to(Residency::device);
  return r;
}

/// What @p f threw: "CudaError <runtime code>: <what>", "OutOfMemoryError: ...", or another type.
std::string thrown(const std::function<void()>& f) {
  try {
    f();
  } catch (const CudaError& e) {
    return "CudaError " + std::to_string(e.runtime_code()) + ": " + e.what();
  } catch (const OutOfMemoryError& e) {
    return std::string("OutOfMemoryError: ") + e.what();
  } catch (const std::exception& e) {
    return std::string("other: ") + e.what();
  }
  return "nothing";
}

}  // namespace

TEST_SUITE("ops-errors") {
  TEST_CASE("histogram: bands * bins must leave room for one more level (2^31 - 2 at most)") {
    const std::uint8_t px = 0;
    const auto r = OwnedRasterArray::from_host(&px, DType::uint8, 1, 1, 1);
    // 1 * (2^31 - 1) bins: the device histogram's bands * bins + 1 levels would overflow int.
    CHECK_THROWS_WITH_AS(histogram(r, std::numeric_limits<std::int32_t>::max(), 0, 1),
                         doctest::Contains("bins"), std::invalid_argument);
    const auto r2 =
        OwnedRasterArray::from_host(std::vector<std::uint8_t>(2).data(), DType::uint8, 2, 1, 1);
    CHECK_THROWS_AS(histogram(r2, 1 << 30, 0, 1), std::invalid_argument);
    CHECK(histogram(r, 4, 0, 1) == std::vector<std::vector<std::int64_t>>{{1, 0, 0, 0}});
  }

  TEST_CASE("a device error reaches the caller as a typed error naming the operation") {
    FreshPool fresh(nullptr, 64 * MiB);
    const auto dev = device_raster(2, 16, 16);
    const auto dev2 = device_raster(2, 16, 16);
    // The emulated device backend queues each op's work with cuLaunchHostFunc: every launch
    // fails, and every op reports it as a CudaError with the driver's code and the op's name.
    REQUIRE(emulator().set_fail("cuLaunchHostFunc:1+:CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES") == 0);
    const std::vector<std::pair<std::string, std::function<void()>>> ops = {
        {"statistics", [&] { (void)band_statistics(dev); }},
        {"rescale", [&] { (void)rescale(dev, 0, 2, 0, 1, DType::float32); }},
        {"clip", [&] { (void)clip(dev, 0, 1); }},
        {"fill_nodata", [&] { (void)fill_nodata(dev, 0); }},
        {"normalized_difference", [&] { (void)normalized_difference(dev, dev2); }},
        {"histogram", [&] { (void)histogram(dev, 8, 0, 2); }},
        {"focal_mean_3x3", [&] { (void)focal_mean_3x3(dev); }},
        {"calc",
         [&] {
           (void)calc({"A[1] + A[2]"}, {{"A", dev}});
         }},
    };
    for (const auto& [name, op] : ops) {
      CAPTURE(name);
      int code = 0;
      try {
        op();
      } catch (const CudaError& e) {
        code = e.code();
        CHECK(std::string(e.what()).find(name + " on the device: ") == 0);
        CHECK(std::string(e.what()).find("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES") !=
              std::string::npos);
      }
      CHECK(code == CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES);
    }
    CHECK(faults_fired("cuLaunchHostFunc") == ops.size());
    emulator().set_fail(nullptr);
    // Nothing is left of the failed ops: no output, no temporary.
    CHECK(memory_pool_stats().current_bytes.value_or(0) == 2 * dev.byte_size());
  }

  TEST_CASE("out of device memory in an op: OutOfMemoryError naming the operation") {
    FreshPool fresh(nullptr, 16 * MiB);
    const auto dev = device_raster(1, 1024, 2560);  // 10 MiB of 16: no room for the output
    const std::string what = thrown([&] { (void)rescale(dev, 0, 2, 0, 1, DType::float32); });
    CHECK(what.rfind("OutOfMemoryError: ", 0) == 0);
    CHECK(what.find("rescale") != std::string::npos);
    CHECK(memory_pool_stats().current_bytes.value_or(0) == dev.byte_size());
    const std::string calc_what = thrown([&] { (void)calc({"A * 2"}, {{"A", dev}}); });
    CHECK(calc_what.rfind("OutOfMemoryError: ", 0) == 0);
    CHECK(calc_what.find("calc on the device") != std::string::npos);
    CHECK(memory_pool_stats().current_bytes.value_or(0) == dev.byte_size());
  }
}

// ---- the CUDA runtime error policy (src/ops/runtime_errors.hpp), against a fake runtime -------

namespace {

/// A fake CUDA runtime: a failed call leaves its error as the "last error", as cudart does;
/// get_last_error returns and clears it.
int g_last_error = 0;
int fake_get_last_error() {
  const int e = g_last_error;
  g_last_error = 0;
  return e;
}
const char* fake_name(int code) {
  switch (code) {
    case 2:
      return "cudaErrorMemoryAllocation";
    case 9:
      return "cudaErrorInvalidConfiguration";
    case 35:
      return "cudaErrorInsufficientDriver";
    case 719:
      return "cudaErrorLaunchFailure";
    default:
      return "cudaErrorUnknown";
  }
}
const char* fake_string(int) {
  return "fake runtime error";
}
constexpr detail::ops::RuntimeErrorApi kFake{&fake_get_last_error, &fake_name, &fake_string};

/// A runtime call that fails with @p code, leaving it as the last error.
int failing_call(int code) {
  g_last_error = code;
  return code;
}

}  // namespace

TEST_SUITE("ops-errors") {
  TEST_CASE("runtime errors: CudaError keeps CUresult in code() and the cudaError_t apart") {
    CHECK(detail::ops::runtime_to_driver_result(0) == CUDA_SUCCESS);
    CHECK(detail::ops::runtime_to_driver_result(2) == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(detail::ops::runtime_to_driver_result(100) == CUDA_ERROR_NO_DEVICE);
    CHECK(detail::ops::runtime_to_driver_result(719) == CUDA_ERROR_LAUNCH_FAILED);
    // Same number, other meaning, or no CUresult at all: never passed through as is.
    CHECK(detail::ops::runtime_to_driver_result(35) == CUDA_ERROR_SYSTEM_DRIVER_MISMATCH);
    CHECK(detail::ops::runtime_to_driver_result(98) == CUDA_ERROR_UNKNOWN);
    CHECK(detail::ops::runtime_to_driver_result(12345) == CUDA_ERROR_UNKNOWN);

    g_last_error = 0;
    try {
      detail::ops::check_runtime(kFake, failing_call(9), "rescale: a kernel launch");
      FAIL("no exception");
    } catch (const CudaError& e) {
      CHECK(e.runtime_code() == 9);
      CHECK(e.code() == CUDA_ERROR_INVALID_VALUE);
      CHECK(e.name() == "cudaErrorInvalidConfiguration");
      CHECK(std::string(e.what()).find("rescale: a kernel launch failed") != std::string::npos);
    }
    // The failed call's error was read back, so it is not reported again.
    CHECK(g_last_error == 0);
    CHECK_NOTHROW(detail::ops::check_launch(kFake, "clip"));
  }

  TEST_CASE("runtime errors: a launch error is reported once, by the op that queued it") {
    g_last_error = 719;  // a kernel of the op just queued failed to launch
    CHECK_THROWS_WITH_AS(detail::ops::check_launch(kFake, "focal_mean_3x3"),
                         doctest::Contains("focal_mean_3x3"), CudaError);
    // The next op's check sees a clean runtime (peeking would have thrown 719 again here).
    CHECK_NOTHROW(detail::ops::check_launch(kFake, "rescale"));
  }

  TEST_CASE("runtime errors: cudaErrorMemoryAllocation is an OutOfMemoryError") {
    g_last_error = 0;
    CHECK_THROWS_WITH_AS(detail::ops::check_runtime(kFake, failing_call(2), "histogram: temp"),
                         doctest::Contains("histogram"), OutOfMemoryError);
    CHECK(g_last_error == 0);
  }
}

// ---- a fault of queued device work is not blamed on the next operation -------------------------

// Run alone (tests/ops/meson.build, ops-errors-queued-fault): the fault poisons the context for
// the rest of the process.
TEST_SUITE("ops-errors-queued-fault" * doctest::skip()) {
  TEST_CASE("a rescale whose work faults later: statistics says it was earlier work, and whose") {
    FreshPool fresh(nullptr, 64 * MiB);
    const auto dev = device_raster(1, 64, 64);
    CUstream s = new_stream();
    // The stream is held, so rescale's work (the emulator's first host function) runs only once
    // rescale has returned: then it faults, as a kernel's bad access does, asynchronously.
    REQUIRE(emulator().stream_pause(s, 1) == 0);
    REQUIRE(emulator().set_fail("cuLaunchHostFunc:1@run") == 0);
    std::optional<OwnedRasterArray> out;
    CHECK_NOTHROW(out.emplace(rescale(dev, 0, 2, 0, 1, DType::float32, s)));
    REQUIRE(emulator().stream_pause(s, 0) == 0);
    // The fault has happened (the stream's work ran) before statistics is called.
    while (detail::driver().cuStreamQuery(s) == CUDA_ERROR_NOT_READY) std::this_thread::yield();
    std::string what;
    try {
      (void)band_statistics(*out, s);
    } catch (const CudaError& e) {
      what = e.what();
      CHECK(e.code() == CUDA_ERROR_ILLEGAL_ADDRESS);
    }
    CAPTURE(what);
    CHECK(faults_fired("cuLaunchHostFunc") == 1);
    CHECK(what.rfind("statistics on the device: device work queued before it failed", 0) == 0);
    CHECK(what.find("the last operation queued on the device was rescale") != std::string::npos);
    CHECK(what.find("statistics queued nothing") != std::string::npos);
    out.reset();
    try {
      forget_stream(s);
    } catch (const CudaError&) {  // the poisoned context refuses the mark
    }
    (void)detail::driver().cuStreamDestroy(s);
  }
}

// ---- a real driver (the emulator behind tests/driver's hiding driver, which is not the emulator
// to the library): device rasters go to the CUDA backend, or are refused without it -------------

// Run alone (tests/ops/meson.build, ops-errors-real-driver), with that driver.
TEST_SUITE("ops-errors-real-driver" * doctest::skip()) {
  TEST_CASE("on a driver that is not the emulator: the CUDA backend's errors, or no CUDA") {
    REQUIRE_FALSE(detail::driver_state().emulated);
    std::vector<float> v(16 * 16, 1.5f);
    auto dev = OwnedRasterArray::from_host(v.data(), DType::float32, 1, 16, 16);
    dev.move_to(Residency::device);
    if (!ops_built_with_cuda()) {
      CHECK_THROWS_WITH_AS(band_statistics(dev), doctest::Contains("built without CUDA"),
                           std::runtime_error);
      CHECK_THROWS_WITH_AS(focal_mean_3x3(dev), doctest::Contains("built without CUDA"),
                           std::runtime_error);
      return;
    }
    // The CUDA runtime finds no real driver behind this one: every op fails on the device, each
    // with a CudaError carrying the runtime's code and the op's name.
    for (const auto& [name, op] : std::vector<std::pair<std::string, std::function<void()>>>{
             {"statistics", [&] { (void)band_statistics(dev); }},
             {"rescale", [&] { (void)rescale(dev, 0, 2, 0, 1, DType::float32); }},
             {"focal_mean_3x3", [&] { (void)focal_mean_3x3(dev); }},
             {"calc", [&] {
                (void)calc({"A * 2"}, {{"A", dev}});
              }}}) {
      CAPTURE(name);
      const std::string what = thrown(op);
      CAPTURE(what);
      CHECK(what.rfind("CudaError ", 0) == 0);
      CHECK(what.find("CudaError 0:") == std::string::npos);  // a runtime error, with its code
      CHECK(what.find(name) != std::string::npos);
    }
  }
}
