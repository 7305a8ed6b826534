// SPDX-License-Identifier: Apache-2.0
// The pipelined per-band GPU dispatch on the host emulator: results, double buffering observed
// with the emulator's streams paused one at a time, the reusable pinned staging, the staging
// copy threads, errors and options.
#include "dispatch/gpu_resources.hpp"
#include "memory/pool_fixture.hpp"
#include "watchdog.hpp"

#include <vibespatial/raster/dispatch.hpp>
#include <vibespatial/raster/errors.hpp>
#include <vibespatial/raster/memory.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

using namespace vibespatial::raster;
using namespace vsr_test;

namespace {

OwnedRasterArray iota_raster(int bands, std::int64_t h, std::int64_t w) {
  std::vector<float> v(static_cast<std::size_t>(bands) * static_cast<std::size_t>(h * w));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 65521) + 0.5f;
  return OwnedRasterArray::from_host(v.data(), DType::float32, bands, h, w, -1.0, Affine{},
                                     "EPSG:3857");
}

std::vector<float> to_vector(const OwnedRasterArray& r) {
  std::vector<float> v(r.byte_size() / sizeof(float));
  r.copy_to_host(v.data());
  return v;
}

std::size_t pool_current_bytes() {
  return memory_pool_stats().current_bytes.value_or(0);
}

const detail::DriverApi& api() {
  return detail::driver();
}

// A device op standing in for a kernel queued on `stream`: the band copied into a new device
// raster by cuMemcpyDtoDAsync on that stream (on the emulator: the stream's worker copies it, in
// stream order). It reads the band when it runs, so a batch computed before its copy landed, or
// after its slot was overwritten, gives wrong pixels.
OwnedRasterArray copy_on_stream(const OwnedRasterArray& band, CUstream stream) {
  REQUIRE(band.residency() == Residency::device);
  REQUIRE(band.band_count() == 1);
  OwnedRasterArray out = OwnedRasterArray::allocate(Residency::device, band.dtype(), 1,
                                                    band.height(), band.width(), band.nodata());
  VSR_CU_TRY(api().cuMemcpyDtoDAsync(detail::to_device_ptr(out.device_data()),
                                     detail::to_device_ptr(band.device_pointer()), band.byte_size(),
                                     stream));
  return out;
}

/// Budget (bytes) for which double-buffered dispatch of float32 bands of @p band_bytes with two
/// buffers per band plans @p per_pass bands per pass: half of it, times the planner's 0.7, holds
/// per_pass bands and a half.
std::uint64_t budget_for(std::uint64_t band_bytes, int per_pass) {
  return static_cast<std::uint64_t>(static_cast<double>(band_bytes) * 2 * (per_pass + 0.5) / 0.35);
}

/// The pause tests: four 256 x 256 float32 bands dispatched one band per pass, double-buffered,
/// while one of the dispatch's streams is held (paused). The watchdog releases the held stream if
/// the test's checks never come.
struct OneStreamHeld {
  FreshPool fresh{nullptr, 64 * MiB};
  static constexpr std::int64_t h = 256, w = 256;
  const OwnedRasterArray r = iota_raster(4, h, w);
  const std::vector<float> expected = to_vector(r);
  GpuDispatchOptions o = one_band_per_pass();
  CUstream held = nullptr;
  // A broken pipeline would otherwise wait for the held stream forever.
  Watchdog dog{std::chrono::seconds(60), [this] {
                 if (held != nullptr) emulator().stream_pause(held, 0);
               }};

  static GpuDispatchOptions one_band_per_pass() {
    GpuDispatchOptions options;
    options.vram_budget = budget_for(static_cast<std::uint64_t>(h * w) * 4, 1);
    return options;
  }
  void hold(CUstream stream) {
    held = stream;
    REQUIRE(emulator().stream_pause(stream, 1) == 0);
  }
  /// Ends the hold; true if the watchdog had not fired by then (the checks ran while it held).
  bool release() {
    const bool in_time = !dog.fired();
    dog.done();
    CHECK(emulator().stream_pause(held, 0) == 0);
    return in_time;
  }
};

/// Installs an observer for the scope.
struct Observe {
  explicit Observe(std::function<void(const detail::DispatchStep&)> f) {
    detail::set_dispatch_observer(std::move(f));
  }
  ~Observe() { detail::set_dispatch_observer({}); }
};

}  // namespace

TEST_SUITE("dispatch-pipeline") {
  TEST_CASE("stream ops: batched, double-buffered, results equal the input") {
    FreshPool fresh(nullptr, 64 * MiB);
    const std::int64_t h = 512, w = 512;  // 1 MiB per band
    const OwnedRasterArray r = iota_raster(8, h, w);
    const auto expected = to_vector(r);
    SUBCASE("output on the host") {
      GpuDispatchOptions o;
      o.vram_budget = budget_for(MiB, 1);
      GpuDispatchReport rep;
      const OwnedRasterArray out = dispatch_per_band_gpu(r, copy_on_stream, o, &rep);
      CHECK(rep.passes == 8);
      CHECK(rep.plan.bands_per_pass == 1);
      CHECK(rep.pipeline_depth == 2);
      CHECK(rep.input_copied);
      CHECK(rep.output == Residency::host);
      CHECK(out.residency() == Residency::host);
      CHECK(to_vector(out) == expected);
      CHECK(out.nodata() == -1.0);
      CHECK(out.crs() == "EPSG:3857");
      CHECK(emulator().call_count("cuMemcpyHtoDAsync") == 8);
      CHECK(pool_current_bytes() == 0);
      // Two passes in flight at most: the pool never held more than the budget.
      CHECK(*memory_pool_stats().peak_bytes <= *o.vram_budget);
    }
    SUBCASE("output on the device") {
      GpuDispatchOptions o;
      // 2 bands per pass (4 MiB with their outputs); 8 MiB of output fits beside two passes.
      o.vram_budget = 33 * MiB / 2;
      GpuDispatchReport rep;
      const OwnedRasterArray out = dispatch_per_band_gpu(r, copy_on_stream, o, &rep);
      CHECK(rep.passes == 4);
      CHECK(rep.pipeline_depth == 2);
      CHECK(rep.output == Residency::device);
      CHECK(out.residency() == Residency::device);
      CHECK(to_vector(out) == expected);
      CHECK(pool_current_bytes() == out.byte_size());
    }
    SUBCASE("one batch at a time (pipeline_depth 1)") {
      GpuDispatchOptions o;
      o.vram_budget = budget_for(MiB, 1);
      o.pipeline_depth = 1;
      GpuDispatchReport rep;
      const OwnedRasterArray out = dispatch_per_band_gpu(r, copy_on_stream, o, &rep);
      CHECK(rep.pipeline_depth == 1);
      CHECK(rep.passes >= 2);
      CHECK(to_vector(out) == expected);
    }
    SUBCASE("a device-resident input is used in place") {
      OwnedRasterArray dev = iota_raster(8, h, w);
      dev.move_to(Residency::device);
      GpuDispatchReport rep;
      const OwnedRasterArray out = dispatch_per_band_gpu(dev, copy_on_stream, {}, &rep);
      CHECK_FALSE(rep.input_copied);
      CHECK(emulator().call_count("cuMemcpyHtoDAsync") == 0);
      CHECK(to_vector(out) == expected);
    }
    free_dispatch_resources();
    CHECK(emulator().outstanding().host_allocations == 0);
    CHECK(emulator().outstanding().streams == 0);
  }

  TEST_CASE_FIXTURE(OneStreamHeld,
                    "copy k+1 completes while compute k is held (compute stream paused)") {
    std::atomic<int> calls{0};
    bool checked = false;
    Observe obs([&](const detail::DispatchStep& s) {
      if (s.kind == detail::DispatchStep::staged && s.batch == 0) hold(s.compute);
      if (s.kind == detail::DispatchStep::staged && s.batch == 1) {
        // Batch 0's op was called and its work queued before this copy was queued.
        CHECK(calls == 1);
        // The copy completes although compute 0 is held...
        REQUIRE(api().cuEventSynchronize(s.event) == CUDA_SUCCESS);
        CHECK(!dog.fired());
        // ... which is still pending: nothing made the copy wait for it.
        CHECK(api().cuStreamQuery(s.compute) == CUDA_ERROR_NOT_READY);
        // A synchronous copy on the legacy stream completes too: the held stream is
        // non-blocking (a blocking one would make the legacy stream wait for it).
        std::vector<float> got(static_cast<std::size_t>(h * w));
        REQUIRE(api().cuMemcpyDtoH(got.data(), detail::to_device_ptr(s.device_input),
                                   got.size() * sizeof(float)) == CUDA_SUCCESS);
        CHECK(std::memcmp(got.data(), expected.data() + h * w, got.size() * sizeof(float)) == 0);
        checked = release();
      }
    });
    GpuDispatchReport rep;
    const OwnedRasterArray out = dispatch_per_band_gpu(
        r,
        [&](const OwnedRasterArray& b, CUstream s) {
          ++calls;
          return copy_on_stream(b, s);
        },
        o, &rep);
    CHECK(checked);
    CHECK_FALSE(dog.fired());
    CHECK(rep.passes == 4);
    CHECK(rep.pipeline_depth == 2);
    CHECK(to_vector(out) == expected);
  }

  TEST_CASE_FIXTURE(OneStreamHeld,
                    "compute k completes while copy k+1 is held (copy stream paused)") {
    CUevent computed0 = nullptr;
    bool checked = false;
    Observe obs([&](const detail::DispatchStep& s) {
      if (s.kind == detail::DispatchStep::staged && s.batch == 0) {
        REQUIRE(api().cuEventSynchronize(s.event) == CUDA_SUCCESS);  // copy 0 landed
        hold(s.copy);
      }
      if (s.kind == detail::DispatchStep::computed && s.batch == 0) computed0 = s.event;
      if (s.kind == detail::DispatchStep::staged && s.batch == 1) {
        REQUIRE(computed0 != nullptr);
        CHECK(api().cuEventQuery(s.event) == CUDA_ERROR_NOT_READY);  // copy 1 is held...
        // ... and compute 0 completes meanwhile.
        REQUIRE(api().cuEventSynchronize(computed0) == CUDA_SUCCESS);
        CHECK(api().cuEventQuery(s.event) == CUDA_ERROR_NOT_READY);
        checked = release();
      }
    });
    const OwnedRasterArray out = dispatch_per_band_gpu(r, copy_on_stream, o);
    CHECK(checked);
    CHECK_FALSE(dog.fired());
    CHECK(to_vector(out) == expected);
  }

  TEST_CASE("pinned staging is reused across calls and bounded by the plan, not the raster") {
    FreshPool fresh(nullptr, 64 * MiB);
    free_dispatch_resources();
    const OwnedRasterArray r = iota_raster(8, 512, 512);  // 8 MiB
    GpuDispatchOptions o;
    o.vram_budget = budget_for(MiB, 1);
    const unsigned long long before = emulator().call_count("cuMemHostAlloc");
    GpuDispatchReport rep;
    (void)dispatch_per_band_gpu(r, copy_on_stream, o, &rep);
    const unsigned long long first = emulator().call_count("cuMemHostAlloc") - before;
    CHECK(first == 4);                   // two input slots, two output slots
    CHECK(rep.pinned_bytes == 4 * MiB);  // one band each: the plan's batch, not 8 MiB
    CHECK(emulator().outstanding().host_bytes == rep.pinned_bytes);
    for (int i = 0; i < 3; ++i) (void)dispatch_per_band_gpu(r, copy_on_stream, o);
    CHECK(emulator().call_count("cuMemHostAlloc") - before == first);  // reused
    CHECK(emulator().call_count("cuStreamCreate") <= 2);
    // A call with smaller batches reuses them too; what stays idle never exceeds one call's use.
    (void)dispatch_per_band_gpu(iota_raster(8, 256, 512), copy_on_stream, o);
    CHECK(emulator().call_count("cuMemHostAlloc") - before == first);
    CHECK(detail::DispatchResources::get().idle_pinned_bytes() <= 4 * MiB);
    free_dispatch_resources();
    CHECK(emulator().outstanding().host_allocations == 0);
    CHECK(detail::DispatchResources::get().idle_pinned_bytes() == 0);
  }

  TEST_CASE("large staging copies use several threads") {
    CHECK(detail::staging_copy_threads(1 * MiB) == 1);
    if (std::thread::hardware_concurrency() >= 2)
      CHECK(detail::staging_copy_threads(64 * MiB) >= 2);
    CHECK(detail::staging_copy_threads(std::size_t{1} << 40) <= 8);
    // parallel_copy: exact bytes at odd sizes, any thread count.
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{4095}, std::size_t{4097},
                          std::size_t{3 * 4096 + 17}, std::size_t{1 << 20}}) {
      for (int t : {1, 2, 3, 8}) {
        CAPTURE(n);
        CAPTURE(t);
        std::vector<unsigned char> src(n), dst(n + 1, 0xee);
        fill_pattern(src.data(), n, static_cast<std::uint32_t>(n + t));
        const int used = detail::parallel_copy(dst.data(), src.data(), n, t);
        CHECK((n == 0 || std::memcmp(dst.data(), src.data(), n) == 0));
        CHECK(dst[n] == 0xee);
        CHECK(used >= (n == 0 ? 0 : 1));
        CHECK(used <= t);
      }
    }
    CHECK(detail::parallel_copy(std::vector<char>(1 << 20).data(),
                                std::vector<char>(1 << 20).data(), 1 << 20, 4) == 4);

    // The budget below holds 228 MiB: a device with room for it beside a context's own memory.
    FreshPool fresh(nullptr, 320 * MiB);
    const OwnedRasterArray r = iota_raster(4, 2048, 2048);  // 16 MiB per band
    GpuDispatchOptions o;
    o.vram_budget = budget_for(16 * MiB, 2);
    GpuDispatchReport rep;
    const OwnedRasterArray out = dispatch_per_band_gpu(r, copy_on_stream, o, &rep);
    CHECK(rep.passes == 2);
    CHECK(rep.staging_threads == detail::staging_copy_threads(32 * MiB));
    if (std::thread::hardware_concurrency() >= 2) CHECK(rep.staging_threads >= 2);
    o.staging_threads = 3;
    (void)dispatch_per_band_gpu(r, copy_on_stream, o, &rep);
    CHECK(rep.staging_threads == 3);
    CHECK(to_vector(out) == to_vector(r));
    free_dispatch_resources();
  }

  TEST_CASE("an op that throws mid-pipeline: the streams are drained and nothing leaks") {
    FreshPool fresh(nullptr, 64 * MiB);
    const OwnedRasterArray r = iota_raster(8, 512, 512);
    GpuDispatchOptions o;
    o.vram_budget = budget_for(MiB, 1);
    for (int failing : {0, 1, 4, 7}) {
      CAPTURE(failing);
      int band = 0;
      auto op = [&](const OwnedRasterArray& b, CUstream s) {
        if (band++ == failing) throw std::runtime_error("op failed");
        return copy_on_stream(b, s);
      };
      CHECK_THROWS_WITH_AS(dispatch_per_band_gpu(r, op, o), "op failed", std::runtime_error);
      CHECK(pool_current_bytes() == 0);
      // A driver failure in the middle too: the 3rd host-to-device copy.
      band = 100;
      REQUIRE(emulator().set_fail("cuMemcpyHtoDAsync:3") == 0);
      try {
        (void)dispatch_per_band_gpu(r, op, o);
        FAIL("expected CudaError");
      } catch (const CudaError& e) {
        CHECK(e.code() == CUDA_ERROR_UNKNOWN);  // the injected failure, not another
      }
      CHECK(faults_fired("cuMemcpyHtoDAsync") == 1);
      emulator().set_fail(nullptr);
      CHECK(pool_current_bytes() == 0);
      free_dispatch_resources();
      const vsr_emu_outstanding out = emulator().outstanding();
      CHECK(out.host_allocations == 0);
      CHECK(out.streams == 0);
    }
    detail::reset_memory_pools();
    CHECK(emulator().outstanding().events == 0);
  }

  TEST_CASE("bad options are rejected before any work") {
    FreshPool fresh(nullptr, 64 * MiB);
    const OwnedRasterArray r = iota_raster(2, 8, 8);
    GpuDispatchOptions o;
    o.pipeline_depth = 3;
    CHECK_THROWS_AS(dispatch_per_band_gpu(r, copy_on_stream, o), std::invalid_argument);
    o.pipeline_depth = 2;
    o.staging_threads = -1;
    CHECK_THROWS_AS(dispatch_per_band_gpu(r, copy_on_stream, o), std::invalid_argument);
    CHECK_THROWS_AS(dispatch_per_band_gpu(r, StreamBandOp{}), std::invalid_argument);
    o.staging_threads = 0;
    o.buffers_per_band = 0;
    CHECK_THROWS_AS(dispatch_per_band_gpu(r, copy_on_stream, o), std::invalid_argument);
    // One band: passed through, on the legacy stream.
    const OwnedRasterArray one = iota_raster(1, 8, 8);
    CUstream seen = reinterpret_cast<CUstream>(1);
    (void)dispatch_per_band_gpu(one, [&](const OwnedRasterArray& b, CUstream s) {
      seen = s;
      return b;
    });
    CHECK(seen == nullptr);
    CHECK(emulator().outstanding().host_allocations == 0);
  }
}
