// SPDX-License-Identifier: Apache-2.0
// The VRAM budget and the per-band and tiled executors on the host emulator.
#include "memory/pool_fixture.hpp"

#include <vibespatial/raster/diagnostics.hpp>
#include <vibespatial/raster/dispatch.hpp>
#include <vibespatial/raster/errors.hpp>
#include <vibespatial/raster/memory.hpp>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <thread>
#include <vector>

using namespace vibespatial::raster;
using namespace vsr_test;

namespace {

/// The last runtime event of @p r's log, or "" when there is none.
std::string last_runtime(const OwnedRasterArray& r) {
  std::string last;
  for (const auto& e : r.diagnostics()->events()) {
    if (e.kind == RasterDiagnosticKind::runtime) last = e.detail;
  }
  return last;
}

OwnedRasterArray iota_raster(int bands, std::int64_t h, std::int64_t w, float base = 0.0f,
                             std::optional<double> nodata = {}, Affine affine = {}) {
  std::vector<float> v(static_cast<std::size_t>(bands) * static_cast<std::size_t>(h * w));
  // Exact in float32 at every size (an accumulated iota is not above 2^24).
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = base + static_cast<float>(i % 65521);
  return OwnedRasterArray::from_host(v.data(), DType::float32, bands, h, w, nodata, affine,
                                     "EPSG:3857");
}

// A device op standing in for a kernel: out = 2 * in + 1 in a new device raster. Emulator device
// pointers are host pointers, and the input's copy is complete when the op is called.
OwnedRasterArray twice_plus_one_on_device(const OwnedRasterArray& band) {
  REQUIRE(band.residency() == Residency::device);
  REQUIRE(band.band_count() == 1);
  const auto* in = static_cast<const float*>(band.device_pointer());
  OwnedRasterArray out = OwnedRasterArray::allocate(Residency::device, DType::float32, 1,
                                                    band.height(), band.width(), band.nodata());
  auto* o = static_cast<float*>(out.device_data());
  const std::size_t n = static_cast<std::size_t>(band.height() * band.width());
  for (std::size_t i = 0; i < n; ++i) o[i] = 2.0f * in[i] + 1.0f;
  return out;
}

std::vector<float> to_vector(const OwnedRasterArray& r) {
  std::vector<float> v(r.byte_size() / sizeof(float));
  r.copy_to_host(v.data());
  return v;
}

// The first failure of the per-band CPU dispatch test: `thread_left` is set when the worker
// thread that threw it has exited.
struct FirstFailure {
  std::mutex m;
  std::condition_variable cv;
  bool claimed = false;
  int waiting = 0;  // calls of other workers waiting for the first failure
  bool thread_left = false;
};

// A thread_local of the thread that threw first: destroyed when that thread exits, after the
// dispatcher's loop has returned on it.
struct SignalAtThreadExit {
  FirstFailure* first = nullptr;
  ~SignalAtThreadExit() {
    if (first == nullptr) return;
    {
      std::lock_guard lock(first->m);
      first->thread_left = true;
    }
    first->cv.notify_all();
  }
};

std::size_t pool_current() {
  return memory_pool_stats().current_bytes.value_or(0);
}

// 3x3 mean with nearest-edge clamping over every band of a float64 host raster.
OwnedRasterArray mean3x3(const OwnedRasterArray& r) {
  REQUIRE(r.dtype() == DType::float64);
  const std::int64_t h = r.height(), w = r.width();
  std::vector<double> in(static_cast<std::size_t>(r.band_count() * h * w));
  r.copy_to_host(in.data());
  std::vector<double> out(in.size());
  for (int b = 0; b < r.band_count(); ++b) {
    const double* src = in.data() + b * h * w;
    double* dst = out.data() + b * h * w;
    for (std::int64_t y = 0; y < h; ++y) {
      for (std::int64_t x = 0; x < w; ++x) {
        double sum = 0;
        for (int dy = -1; dy <= 1; ++dy) {
          for (int dx = -1; dx <= 1; ++dx) {
            const std::int64_t yy = std::clamp<std::int64_t>(y + dy, 0, h - 1);
            const std::int64_t xx = std::clamp<std::int64_t>(x + dx, 0, w - 1);
            sum += src[yy * w + xx];
          }
        }
        dst[y * w + x] = sum / 9.0;
      }
    }
  }
  return OwnedRasterArray::from_host(out.data(), DType::float64, r.band_count(), h, w, r.nodata(),
                                     r.affine(), r.crs());
}

RasterPlan tiled_plan(std::int64_t th, std::int64_t tw, int halo = 0) {
  RasterPlan p;
  p.strategy = TilingStrategy::tiled;
  p.tile_shape = std::make_pair(th, tw);
  p.halo = halo;
  return p;
}

}  // namespace

TEST_SUITE("budget") {
  // The driver's free memory is what cuMemGetInfo reports, never the device's total: a context
  // costs memory (§3.3; VSR_EMU_CONTEXT_OVERHEAD).
  TEST_CASE("available_vram_bytes follows the emulated device size") {
    {
      FreshPool fresh(nullptr, 64 * MiB);
      const std::size_t free_b = driver_free_bytes();
      CHECK(free_b <= 64 * MiB);
      CHECK(free_b > 56 * MiB);
      CHECK(available_vram_bytes() == free_b * 85 / 100);
    }
    {
      FreshPool fresh(nullptr, 256 * MiB);
      const std::size_t free_b = driver_free_bytes();
      CHECK(free_b <= 256 * MiB);
      CHECK(free_b > 224 * MiB);
      CHECK(available_vram_bytes() == free_b * 85 / 100);
    }
  }

  TEST_CASE("available_vram_bytes counts the pool's free memory") {
    FreshPool fresh(nullptr, 64 * MiB);
    const std::uint64_t before = available_vram_bytes();
    const std::size_t free_b = driver_free_bytes();
    void* p = device_allocate(32 * MiB);
    CHECK(available_vram_bytes() == (free_b - 32 * MiB) * 85 / 100);
    device_deallocate(p, 32 * MiB);
    REQUIRE(memory_pool_stats().pool_free_bytes >= 32 * MiB);
    // The driver sees 32 MiB fewer free bytes, but the pool holds them free for the next pass.
    CHECK(available_vram_bytes() == before);
    free_pool_memory();
    CHECK(available_vram_bytes() == before);
  }
}

TEST_SUITE("dispatch-cpu") {
  TEST_CASE("runtime events: the executor and its path") {
    const OwnedRasterArray one = iota_raster(1, 4, 4);
    const OwnedRasterArray a = dispatch_per_band_cpu(
        one, [](const OwnedRasterArray& b) { return b.clone_to(Residency::host); });
    const std::string single = last_runtime(a);
    CHECK(single.find("dispatch_per_band_cpu single-band passthrough elapsed=") == 0);
    const OwnedRasterArray three = iota_raster(3, 8, 10);
    const OwnedRasterArray b = dispatch_per_band_cpu(
        three, [](const OwnedRasterArray& band) { return band.clone_to(Residency::host); });
    const std::string multi = last_runtime(b);
    CHECK(multi.find("dispatch_per_band_cpu bands=3 shape=(8, 10) threads=") == 0);
    CHECK(multi.find(" elapsed=") != std::string::npos);
    CHECK(last_runtime(three).empty());  // the source's log is not touched
  }

  TEST_CASE("single band: one call, result as is") {
    const OwnedRasterArray r = iota_raster(1, 4, 4);
    int calls = 0;
    const OwnedRasterArray out = dispatch_per_band_cpu(r, [&](const OwnedRasterArray& b) {
      ++calls;
      CHECK(b.host_data() == r.host_data());
      return iota_raster(1, 4, 4, 5.0f, 3.0);
    });
    CHECK(calls == 1);
    CHECK(out.nodata() == 3.0);  // passthrough: not restamped with the source's metadata
  }

  TEST_CASE("bands in order, source metadata") {
    const Affine t{10, 0, 500, 0, -10, 900};
    const OwnedRasterArray r = iota_raster(13, 6, 7, 0.0f, -9.0, t);
    // With two workers or more (min(bands, hardware threads, 8)), band 0 finishes last: its call
    // waits until band 12's has returned, so the results come back out of band order.
    const bool parallel = std::thread::hardware_concurrency() >= 2;
    std::mutex m;
    std::condition_variable cv;
    bool last_done = false;
    std::vector<int> finished;
    const OwnedRasterArray out = dispatch_per_band_cpu(r, [&](const OwnedRasterArray& b) {
      REQUIRE(b.residency() == Residency::host);
      std::vector<float> v(42);
      b.copy_to_host(v.data());
      const int band = static_cast<int>(v[0]) / 42;
      if (band == 0 && parallel) {
        std::unique_lock lock(m);
        cv.wait(lock, [&] { return last_done; });
      }
      for (float& x : v) x = -x;
      OwnedRasterArray result =
          OwnedRasterArray::from_host(v.data(), DType::float32, 1, 6, 7, -9.0);
      std::lock_guard lock(m);
      finished.push_back(band);
      if (band == 12) {
        last_done = true;
        cv.notify_all();
      }
      return result;
    });
    REQUIRE(finished.size() == 13);
    if (parallel) CHECK(finished.back() == 0);
    CHECK(out.band_count() == 13);
    CHECK(out.affine() == t);
    CHECK(out.crs() == "EPSG:3857");
    CHECK(out.nodata() == -9.0);
    const auto v = to_vector(out);
    for (std::size_t i = 0; i < v.size(); ++i) REQUIRE(v[i] == -static_cast<float>(i % 65521));
  }

  TEST_CASE("the first exception propagates and the remaining bands are not started") {
    // With two workers or more, the first failure is thrown on a worker thread, and every other
    // call waits until that thread has left the dispatcher (a thread_local guard of it signals
    // when the thread exits): by then the failure is recorded and the workers told to stop. The
    // other calls then fail too (a later failure must not replace the first) or return (their
    // workers must not start another band).
    const bool parallel = std::thread::hardware_concurrency() >= 2;
    const std::thread::id caller = std::this_thread::get_id();
    for (const bool later_calls_fail : {true, false}) {
      CAPTURE(later_calls_fail);
      const OwnedRasterArray r = iota_raster(200, 2, 2);
      std::atomic<int> calls{0};
      FirstFailure first;
      auto op = [&](const OwnedRasterArray& b) -> OwnedRasterArray {
        ++calls;
        std::vector<float> v(4);
        b.copy_to_host(v.data());
        if (!parallel) {  // one worker: band 1 fails, band 0 came before it
          if (static_cast<int>(v[0]) / 4 == 1) throw std::runtime_error("first failure");
          return b;
        }
        std::unique_lock lock(first.m);
        if (!first.claimed && std::this_thread::get_id() != caller) {
          first.claimed = true;
          // Not before another worker's call is in flight (the workers take bands until told
          // to stop, so one comes).
          first.cv.wait(lock, [&] { return first.waiting > 0; });
          lock.unlock();
          thread_local SignalAtThreadExit signal;
          signal.first = &first;
          throw std::runtime_error("first failure");
        }
        ++first.waiting;
        first.cv.notify_all();
        first.cv.wait(lock, [&] { return first.thread_left; });
        if (later_calls_fail) throw std::logic_error("later failure");
        return b;
      };
      CHECK_THROWS_WITH_AS(dispatch_per_band_cpu(r, op), "first failure", std::runtime_error);
      // At most one call per worker (min(bands, hardware threads, 8)): none started after.
      CHECK(calls.load() <= (parallel ? 8 : 2));
      CHECK(calls.load() >= 2);
    }
  }

  TEST_CASE("device-resident input is read through host views, left on the device") {
    FreshPool fresh;
    OwnedRasterArray r = iota_raster(3, 4, 4);
    r.move_to(Residency::device);
    const OwnedRasterArray out = dispatch_per_band_cpu(r, [](const OwnedRasterArray& b) {
      CHECK(b.residency() == Residency::host);
      return b;
    });
    CHECK(r.residency() == Residency::device);
    CHECK(to_vector(out) == to_vector(r));
  }
}

TEST_SUITE("dispatch-gpu") {
  TEST_CASE("a raster twice the device size goes through in budgeted batches") {
    FreshPool fresh(nullptr, 64 * MiB);
    // 8 bands x 2048 x 2048 float32 = 128 MiB on a 64 MiB device. The reference (whole raster,
    // per-band outputs, then a stack) would need about 3x the raster: 384 MiB.
    const int bands = 8;
    const std::int64_t h = 2048, w = 2048;
    const Affine t{30, 0, 1000, 0, -30, 5000};
    const OwnedRasterArray r = iota_raster(bands, h, w, 0.0f, -1.0, t);
    const std::uint64_t budget = available_vram_bytes();
    PlanOptions o;
    o.band_count = bands;
    o.per_band = true;
    o.vram_budget = budget;
    const RasterPlan plan = analyze_raster_plan(h, w, DType::float32, o);
    REQUIRE(plan.strategy == TilingStrategy::band_batches);

    int calls = 0;
    const OwnedRasterArray out = dispatch_per_band_gpu(r, [&](const OwnedRasterArray& b) {
      ++calls;
      CHECK(b.affine() == t);
      CHECK(b.nodata() == -1.0);
      return twice_plus_one_on_device(b);
    });
    CHECK(calls == bands);
    const MemoryPoolStats stats = memory_pool_stats();
    REQUIRE(stats.peak_bytes.has_value());
    CHECK(*stats.peak_bytes <= budget);
    CHECK(*stats.peak_bytes >= 2 * static_cast<std::size_t>(h * w) * sizeof(float));
    MESSAGE("budget " << budget << ", peak " << *stats.peak_bytes << ", plan bands_per_pass "
                      << plan.bands_per_pass);
    // One asynchronous copy per batch, through two pinned staging buffers (double buffering).
    CHECK(emulator().call_count("cuMemcpyHtoDAsync") ==
          static_cast<unsigned long long>((bands + plan.bands_per_pass - 1) / plan.bands_per_pass));
    CHECK(emulator().call_count("cuMemHostAlloc") == 2);
    // 128 MiB of output cannot stay on a 64 MiB device: it came back batch by batch.
    CHECK(out.residency() == Residency::host);
    CHECK(out.band_count() == bands);
    CHECK(out.affine() == t);
    CHECK(out.nodata() == -1.0);
    CHECK(out.crs() == "EPSG:3857");
    const auto* v = static_cast<const float*>(out.host_data());
    const std::size_t n = static_cast<std::size_t>(bands * h * w);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) bad += v[i] != 2.0f * static_cast<float>(i % 65521) + 1.0f;
    CHECK(bad == 0);
    CHECK(pool_current() == 0);
    // Pinned staging and the pipeline's streams are kept for the next call, until given back.
    CHECK(emulator().outstanding().host_allocations == 2);
    CHECK(emulator().outstanding().streams == 2);
    free_dispatch_resources();
    CHECK(emulator().outstanding().host_allocations == 0);
    CHECK(emulator().outstanding().streams == 0);
    detail::reset_memory_pools();  // the pool's own stream-order events go with it
    CHECK(emulator().outstanding().events == 0);
  }

  TEST_CASE("the output stays on the device when it fits") {
    FreshPool fresh(nullptr, 64 * MiB);
    const OwnedRasterArray r = iota_raster(4, 256, 256);
    {
      const OwnedRasterArray out = dispatch_per_band_gpu(r, twice_plus_one_on_device);
      CHECK(out.residency() == Residency::device);
      CHECK(pool_current() == out.byte_size());  // inputs and per-band results are gone
      const auto v = to_vector(out);
      for (std::size_t i = 0; i < v.size(); ++i)
        REQUIRE(v[i] == 2.0f * static_cast<float>(i % 65521) + 1.0f);
    }
    CHECK(pool_current() == 0);
  }

  TEST_CASE("host results and device-resident input") {
    FreshPool fresh(nullptr, 64 * MiB);
    OwnedRasterArray r = iota_raster(3, 64, 32);
    r.move_to(Residency::device);
    const void* base = r.device_pointer();
    int band = 0;
    const OwnedRasterArray out = dispatch_per_band_gpu(r, [&](const OwnedRasterArray& b) {
      // The input is used in place: band views on the raster's own buffer.
      CHECK(b.device_pointer() ==
            static_cast<const unsigned char*>(base) + band++ * 64 * 32 * sizeof(float));
      std::vector<double> v(64 * 32, static_cast<double>(band));
      return OwnedRasterArray::from_host(v.data(), DType::float64, 1, 64, 32);
    });
    CHECK(out.dtype() == DType::float64);
    CHECK(out.band_count() == 3);
    std::vector<double> v(3 * 64 * 32);
    out.copy_to_host(v.data());
    // Band k (from 0) of the output holds k + 1 in every pixel, in band order.
    std::size_t bad = 0;
    for (std::size_t i = 0; i < v.size(); ++i) {
      bad += v[i] != static_cast<double>(i / (64 * 32) + 1);
    }
    CHECK(bad == 0);
  }

  TEST_CASE("runtime events: passthrough, and batches of a multiband run") {
    FreshPool fresh(nullptr, 64 * MiB);
    const OwnedRasterArray one = iota_raster(1, 8, 8);
    const OwnedRasterArray a = dispatch_per_band_gpu(
        one, [](const OwnedRasterArray& b) { return b.clone_to(Residency::host); });
    CHECK(last_runtime(a).find("dispatch_per_band_gpu single-band passthrough elapsed=") == 0);
    const OwnedRasterArray three = iota_raster(3, 8, 10);
    const OwnedRasterArray b = dispatch_per_band_gpu(three, twice_plus_one_on_device);
    const std::string multi = last_runtime(b);
    CHECK(multi.find("dispatch_per_band_gpu bands=3 shape=(8, 10) batches=1 bands_per_pass=3") ==
          0);
    CHECK(multi.find(" elapsed=") != std::string::npos);
  }

  TEST_CASE("single band: passthrough") {
    FreshPool fresh(nullptr, 64 * MiB);
    const OwnedRasterArray r = iota_raster(1, 8, 8);
    int calls = 0;
    const OwnedRasterArray out = dispatch_per_band_gpu(r, [&](const OwnedRasterArray& b) {
      ++calls;
      CHECK(b.host_data() == r.host_data());
      return b;
    });
    CHECK(calls == 1);
    CHECK(out.host_data() == r.host_data());
  }

  TEST_CASE("an op that throws: the error propagates and everything is released") {
    FreshPool fresh(nullptr, 64 * MiB);
    // 8 bands x 4 MiB: two batches of four; batch 1 is being prefetched when band 2 fails.
    const OwnedRasterArray r = iota_raster(8, 1024, 1024);
    for (int failing : {0, 2, 5, 7}) {
      CAPTURE(failing);
      int band = 0;
      auto op = [&](const OwnedRasterArray& b) {
        if (band++ == failing) throw std::runtime_error("op failed");
        return twice_plus_one_on_device(b);
      };
      CHECK_THROWS_WITH_AS(dispatch_per_band_gpu(r, op), "op failed", std::runtime_error);
      CHECK(pool_current() == 0);
      free_dispatch_resources();
      const vsr_emu_outstanding o = emulator().outstanding();
      CHECK(o.host_allocations == 0);
      CHECK(o.streams == 0);
      detail::reset_memory_pools();  // the pool's own stream-order events go with it
      CHECK(emulator().outstanding().events == 0);
    }
  }

  TEST_CASE("results of the wrong shape or mixed dtypes are rejected") {
    FreshPool fresh(nullptr, 64 * MiB);
    const OwnedRasterArray r = iota_raster(3, 16, 16);
    CHECK_THROWS_AS(
        dispatch_per_band_gpu(r, [](const OwnedRasterArray&) { return iota_raster(1, 16, 17); }),
        std::invalid_argument);
    CHECK_THROWS_AS(
        dispatch_per_band_gpu(r, [](const OwnedRasterArray&) { return iota_raster(2, 16, 16); }),
        std::invalid_argument);
    int band = 0;
    CHECK_THROWS_WITH_AS(dispatch_per_band_gpu(r,
                                               [&](const OwnedRasterArray& b) {
                                                 if (band++ == 0) return b;
                                                 std::vector<double> v(256);
                                                 return OwnedRasterArray::from_host(
                                                     v.data(), DType::float64, 1, 16, 16);
                                               }),
                         doctest::Contains("band 1"), std::invalid_argument);
    CHECK(pool_current() == 0);
    free_dispatch_resources();
    CHECK(emulator().outstanding().host_allocations == 0);
  }

  TEST_CASE("a band too large for the budget: tiled plan, pointed at dispatch_tiled") {
    FreshPool fresh(nullptr, 8 * MiB);
    const OwnedRasterArray r = iota_raster(2, 1024, 1024);  // 4 MiB per band, 8 MiB per pass
    CHECK_THROWS_WITH_AS(dispatch_per_band_gpu(r, twice_plus_one_on_device),
                         doctest::Contains("dispatch_tiled"), std::runtime_error);
    CHECK(pool_current() == 0);
  }
}

TEST_SUITE("dispatch-tiled") {
  TEST_CASE("tiles carry every band and an affine shifted to their origin") {
    const Affine t{2, 0.5, 100, 0.25, -3, 50};
    const OwnedRasterArray r = iota_raster(2, 10, 13, 0.0f, 0.0, t);
    struct Seen {
      Affine affine;
      std::int64_t h, w;
      float first;
    };
    std::vector<Seen> seen;
    const OwnedRasterArray out = dispatch_tiled(
        r,
        [&](const OwnedRasterArray& tile) {
          CHECK(tile.band_count() == 2);
          CHECK(tile.crs() == "EPSG:3857");
          CHECK(tile.nodata() == 0.0);
          seen.push_back({tile.affine(), tile.height(), tile.width(),
                          static_cast<const float*>(tile.host_data())[0]});
          return tile;
        },
        tiled_plan(4, 5));
    REQUIRE(seen.size() == 9);  // 3 x 3 tiles, smaller at the bottom and right edges
    std::size_t k = 0;
    for (std::int64_t row = 0; row < 10; row += 4) {
      for (std::int64_t col = 0; col < 13; col += 5, ++k) {
        CAPTURE(k);
        CHECK(seen[k].affine.a == t.a);
        CHECK(seen[k].affine.e == t.e);
        CHECK(seen[k].affine.c == t.c + col * t.a + row * t.b);
        CHECK(seen[k].affine.f == t.f + col * t.d + row * t.e);
        CHECK(seen[k].h == std::min<std::int64_t>(4, 10 - row));
        CHECK(seen[k].w == std::min<std::int64_t>(5, 13 - col));
        CHECK(seen[k].first == static_cast<float>(row * 13 + col));
      }
    }
    CHECK(out.affine() == t);
    CHECK(to_vector(out) == to_vector(r));
  }

  TEST_CASE("an op may change the dtype; the output follows the first tile") {
    const OwnedRasterArray r = iota_raster(1, 9, 11);
    const OwnedRasterArray out = dispatch_tiled(
        r,
        [](const OwnedRasterArray& tile) {
          std::vector<float> v(tile.byte_size() / sizeof(float));
          tile.copy_to_host(v.data());
          std::vector<std::uint8_t> c(v.size());
          for (std::size_t i = 0; i < v.size(); ++i) c[i] = v[i] >= 50.0f ? 1 : 0;
          return OwnedRasterArray::from_host(c.data(), DType::uint8, 1, tile.height(), tile.width(),
                                             255.0);
        },
        tiled_plan(4, 3));
    CHECK(out.dtype() == DType::uint8);
    CHECK(out.nodata() == 255.0);
    const auto* c = static_cast<const std::uint8_t*>(out.host_data());
    for (int i = 0; i < 99; ++i) REQUIRE(c[i] == (i >= 50 ? 1 : 0));
  }

  TEST_CASE("halo tiles reproduce the whole-raster 3x3 mean") {
    std::vector<double> v(2 * 37 * 53);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37 * i) * 100.0 + (i % 7);
    const OwnedRasterArray r = OwnedRasterArray::from_host(v.data(), DType::float64, 2, 37, 53);
    const OwnedRasterArray whole = mean3x3(r);
    std::vector<double> expected(v.size());
    whole.copy_to_host(expected.data());
    for (auto [th, tw] : std::vector<std::pair<std::int64_t, std::int64_t>>{
             {8, 8}, {5, 7}, {37, 1}, {1, 53}, {16, 64}, {1, 1}, {36, 52}}) {
      CAPTURE(th);
      CAPTURE(tw);
      const OwnedRasterArray tiled = dispatch_tiled_halo(r, mean3x3, tiled_plan(th, tw, 1));
      std::vector<double> got(v.size());
      tiled.copy_to_host(got.data());
      CHECK(got == expected);
    }
    // Without a halo the seams differ (the check above is not vacuous).
    const OwnedRasterArray seams = dispatch_tiled_halo(r, mean3x3, tiled_plan(8, 8, 0));
    std::vector<double> got(v.size());
    seams.copy_to_host(got.data());
    CHECK(got != expected);
  }

  TEST_CASE("whole plans call the op once; tiled plans need host input") {
    FreshPool fresh;
    OwnedRasterArray r = iota_raster(2, 8, 8);
    int calls = 0;
    const auto identity = [&](const OwnedRasterArray& b) {
      ++calls;
      return b;
    };
    const OwnedRasterArray same = dispatch_tiled(r, identity, RasterPlan{});
    CHECK(calls == 1);
    CHECK(same.host_data() == r.host_data());
    r.move_to(Residency::device);
    CHECK_THROWS_AS(dispatch_tiled(r, identity, tiled_plan(4, 4)), std::invalid_argument);
    CHECK_THROWS_AS(dispatch_tiled_halo(r, identity, tiled_plan(4, 4, 1)), std::invalid_argument);
    CHECK_NOTHROW(dispatch_tiled_halo(r, identity, RasterPlan{}));
    r.move_to(Residency::host);
    RasterPlan batches;
    batches.strategy = TilingStrategy::band_batches;
    CHECK_THROWS_AS(dispatch_tiled(r, identity, batches), std::invalid_argument);
    CHECK_THROWS_AS(dispatch_tiled(r, identity, tiled_plan(0, 4)), std::invalid_argument);
    CHECK_THROWS_AS(dispatch_tiled(
                        r,
                        [](const OwnedRasterArray& t) {
                          return iota_raster(t.band_count(), t.height() + 1, t.width());
                        },
                        tiled_plan(4, 4)),
                    std::invalid_argument);
  }
}

// Run by the 'dispatch-no-driver' test, whose VIBESPATIAL_CUDA_DRIVER names no library.
TEST_SUITE("no-driver") {
  TEST_CASE("without a driver: budget 0, host paths work, GPU dispatch says why") {
    if (detail::driver_state().available) {
      MESSAGE("a driver is loaded; this case is meant for VIBESPATIAL_CUDA_DRIVER=<missing>");
      return;
    }
    CHECK(available_vram_bytes() == 0);
    const OwnedRasterArray r = iota_raster(3, 4, 4);
    const auto identity = [](const OwnedRasterArray& b) { return b; };
    CHECK_THROWS_WITH_AS(dispatch_per_band_gpu(r, identity),
                         doctest::Contains("dispatch_per_band_cpu"), DriverUnavailableError);
    CHECK(to_vector(dispatch_per_band_cpu(r, identity)) == to_vector(r));
    const OwnedRasterArray one = iota_raster(1, 4, 4);
    CHECK(dispatch_per_band_gpu(one, identity).host_data() == one.host_data());
    OwnedRasterArray m = iota_raster(2, 2, 2);
    CHECK_THROWS_AS(m.move_to(Residency::device), DriverUnavailableError);
    CHECK(m.residency() == Residency::host);
    CHECK(to_vector(dispatch_tiled(r, identity, tiled_plan(3, 3))) == to_vector(r));
  }
}
