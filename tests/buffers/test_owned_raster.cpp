// SPDX-License-Identifier: Apache-2.0
// OwnedRasterArray on the host emulator: residency round trips, zero-copy band views,
// from_band_stack's rules, bad arguments, and device memory going back to the pool.
#include "all_dtypes.hpp"
#include "memory/pool_fixture.hpp"

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/memory.hpp>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <thread>
#include <vector>

using namespace vibespatial::raster;
using namespace vsr_test;

namespace {

std::vector<unsigned char> pattern(std::size_t n, std::uint32_t seed) {
  std::vector<unsigned char> v(n);
  fill_pattern(v.data(), n, seed);
  return v;
}

OwnedRasterArray float_raster(int bands, std::int64_t h, std::int64_t w, float base,
                              std::optional<double> nodata = {}) {
  std::vector<float> v(static_cast<std::size_t>(bands * h * w));
  std::iota(v.begin(), v.end(), base);
  return OwnedRasterArray::from_host(v.data(), DType::float32, bands, h, w, nodata);
}

std::size_t pool_current() {
  return memory_pool_stats().current_bytes.value_or(0);
}

}  // namespace

TEST_SUITE("owned-raster") {
  TEST_CASE("host -> device -> host round trips for every dtype") {
    FreshPool fresh;
    for (DType dtype : kAllDTypes) {
      CAPTURE(to_string(dtype));
      const int bands = 3;
      const std::int64_t h = 17, w = 29;
      const std::size_t bytes = static_cast<std::size_t>(bands * h * w) * itemsize(dtype);
      const auto src = pattern(bytes, static_cast<std::uint32_t>(dtype));
      OwnedRasterArray r = OwnedRasterArray::from_host(src.data(), dtype, bands, h, w, {},
                                                       Affine{2, 0, 10, 0, -2, 20}, "EPSG:4326");
      CHECK(r.residency() == Residency::host);
      CHECK(r.byte_size() == bytes);
      r.move_to(Residency::device);
      CHECK(r.residency() == Residency::device);
      CHECK(r.host_data() == nullptr);
      CHECK(r.device_pointer() != nullptr);
      CHECK(pool_current() == bytes);
      std::vector<unsigned char> back(bytes);
      r.copy_to_host(back.data());  // from the device
      CHECK(back == src);
      r.move_to(Residency::host);
      CHECK(r.residency() == Residency::host);
      CHECK(r.device_pointer() == nullptr);
      CHECK(pool_current() == 0);
      CHECK(std::memcmp(r.host_data(), src.data(), bytes) == 0);
      CHECK(r.metadata().crs == "EPSG:4326");
      CHECK(r.metadata().affine == Affine{2, 0, 10, 0, -2, 20});
      CHECK(r.metadata().band_count == bands);
      CHECK(r.metadata().dtype == dtype);
    }
  }

  TEST_CASE("device_data moves to the device; mutable_host_data moves back") {
    FreshPool fresh;
    OwnedRasterArray r = float_raster(2, 4, 5, 0.0f);
    auto* d = static_cast<float*>(r.device_data());
    CHECK(r.residency() == Residency::device);
    CHECK(d[39] == 39.0f);  // emulator device pointers are host pointers
    d[0] = -7.0f;
    auto* h = static_cast<float*>(r.mutable_host_data());
    CHECK(r.residency() == Residency::host);
    CHECK(h[0] == -7.0f);
    CHECK(pool_current() == 0);
  }

  TEST_CASE("device_data returns once the copy to the device is complete") {
    // cuMemcpyHtoD from pageable memory may return with the transfer still in flight (§3.6):
    // with the legacy stream held, the pixels must not be read before the copy has run. The
    // stream is released only once the call is seen waiting for it.
    FreshPool fresh;
    EmulatorOption async("ASYNC_DEFAULT_STREAMS", "1");
    detail::bind_current_device();
    OwnedRasterArray r = float_raster(2, 4, 5, 0.0f);
    REQUIRE(emulator().stream_pause(nullptr, 1) == 0);
    std::atomic<bool> done{false};
    std::thread release([&] {
      detail::bind_current_device();  // the legacy stream paused is the current context's
      while (!done.load() && emulator().waiting_threads() == 0) std::this_thread::yield();
      CHECK(emulator().stream_pause(nullptr, 0) == 0);
    });
    const auto* d = static_cast<const float*>(r.device_data());
    std::vector<float> seen(d, d + 40);  // emulator device pointers are host pointers
    done = true;
    release.join();
    for (int i = 0; i < 40; ++i) CHECK(seen[static_cast<std::size_t>(i)] == static_cast<float>(i));
    REQUIRE(detail::driver().cuCtxSynchronize() == CUDA_SUCCESS);
  }

  TEST_CASE("band views are zero-copy on both residencies") {
    FreshPool fresh;
    OwnedRasterArray r = float_raster(4, 8, 16, 0.0f, 0.0);
    const std::size_t band_bytes = 8 * 16 * sizeof(float);
    const OwnedRasterArray b2 = r.band(2);
    CHECK(b2.band_count() == 1);
    CHECK(static_cast<const unsigned char*>(b2.host_data()) ==
          static_cast<const unsigned char*>(r.host_data()) + 2 * band_bytes);
    CHECK(b2.nodata() == 0.0);
    r.move_to(Residency::device);
    const std::size_t live = pool_current();
    // The view follows the storage: same device buffer at the band's offset, no new allocation.
    CHECK(b2.residency() == Residency::device);
    const OwnedRasterArray b3 = r.band(3);
    CHECK(static_cast<const unsigned char*>(b3.device_pointer()) ==
          static_cast<const unsigned char*>(r.device_pointer()) + 3 * band_bytes);
    CHECK(pool_current() == live);
    std::vector<float> out(8 * 16);
    b3.copy_to_host(out.data());
    CHECK(out[0] == 3 * 128.0f);
    CHECK(out[127] == 3 * 128.0f + 127);
    CHECK_THROWS_AS(r.band(4), std::out_of_range);
    CHECK_THROWS_AS(r.band(-1), std::out_of_range);
    CHECK_THROWS_AS(b3.band(1), std::out_of_range);
    CHECK(b3.band(0).device_pointer() == b3.device_pointer());
  }

  TEST_CASE("clone_to copies a view's bands once, to either residency, source unchanged") {
    FreshPool fresh;
    const Affine t{30, 0, 1000, 0, -30, 5000};
    std::vector<float> v(4 * 8 * 16);
    std::iota(v.begin(), v.end(), -5.0f);
    const OwnedRasterArray r =
        OwnedRasterArray::from_host(v.data(), DType::float32, 4, 8, 16, -1.0, t, "EPSG:3857");
    const std::vector<float> band2(v.begin() + 2 * 128, v.begin() + 3 * 128);
    const auto pixels = [](const OwnedRasterArray& x) {
      std::vector<float> out(x.byte_size() / sizeof(float));
      x.copy_to_host(out.data());
      return out;
    };
    for (const Residency from : {Residency::host, Residency::device}) {
      OwnedRasterArray src = r.clone_to(from);
      CHECK(src.residency() == from);
      const OwnedRasterArray view = src.band(2);
      for (const Residency to : {Residency::host, Residency::device}) {
        CAPTURE(static_cast<int>(from));
        CAPTURE(static_cast<int>(to));
        const std::uint64_t copies = emulator().call_count("cuMemcpyHtoD") +
                                     emulator().call_count("cuMemcpyDtoH") +
                                     emulator().call_count("cuMemcpyDtoD");
        const OwnedRasterArray c = view.clone_to(to);
        const std::uint64_t after = emulator().call_count("cuMemcpyHtoD") +
                                    emulator().call_count("cuMemcpyDtoH") +
                                    emulator().call_count("cuMemcpyDtoD");
        // One driver copy when a device is involved, none host to host.
        CHECK(after - copies == (from == Residency::host && to == Residency::host ? 0u : 1u));
        CHECK(c.residency() == to);
        CHECK(src.residency() == from);  // the source stays where it was
        CHECK(c.band_count() == 1);
        CHECK(c.nodata() == -1.0);
        CHECK(c.affine() == t);
        CHECK(c.crs() == "EPSG:3857");
        CHECK(pixels(c) == band2);
        // New storage: the source's pixels are not shared.
        if (to == Residency::host && from == Residency::host)
          CHECK(c.host_data() != view.host_data());
        if (to == Residency::device && from == Residency::device)
          CHECK(c.device_pointer() != view.device_pointer());
      }
    }
    CHECK_THROWS_AS((void)r.clone_to(static_cast<Residency>(7)), std::invalid_argument);
  }

  TEST_CASE("device memory returns to the pool when the last owner goes") {
    FreshPool fresh;
    {
      OwnedRasterArray keep = float_raster(1, 1, 1, 0.0f);  // a handle that outlives the block
      {
        OwnedRasterArray r = float_raster(3, 64, 64, 1.0f);
        r.move_to(Residency::device);
        keep = r.band(1);
      }
      CHECK(pool_current() == 3 * 64 * 64 * sizeof(float));
      float v = 0;
      std::vector<float> band(64 * 64);
      keep.copy_to_host(band.data());
      v = band[0];
      CHECK(v == 1.0f + 64 * 64);
    }
    CHECK(pool_current() == 0);
    CHECK(memory_pool_stats().current_count.value_or(0) == 0);
  }

  TEST_CASE("allocate on either residency") {
    FreshPool fresh;
    OwnedRasterArray d = OwnedRasterArray::allocate(Residency::device, DType::int16, 2, 3, 4);
    CHECK(d.residency() == Residency::device);
    CHECK(pool_current() == 2 * 3 * 4 * 2);
    OwnedRasterArray h = OwnedRasterArray::allocate(Residency::host, DType::int16, 2, 3, 4);
    CHECK(h.host_data() != nullptr);
    CHECK_THROWS_AS(OwnedRasterArray::allocate(Residency::host, DType::int16, 0, 3, 4),
                    std::invalid_argument);
  }

  TEST_CASE("from_host rejects bad arguments") {
    const float one = 1.0f;
    CHECK_THROWS_AS(OwnedRasterArray::from_host(nullptr, DType::float32, 1, 1, 1),
                    std::invalid_argument);
    CHECK_THROWS_AS(OwnedRasterArray::from_host(&one, DType::float32, 0, 1, 1),
                    std::invalid_argument);
    CHECK_THROWS_AS(OwnedRasterArray::from_host(&one, DType::float32, 1, 0, 1),
                    std::invalid_argument);
    CHECK_THROWS_AS(OwnedRasterArray::from_host(&one, DType::float32, 1, 1, -3),
                    std::invalid_argument);
    CHECK_THROWS_AS(OwnedRasterArray::from_host(&one, static_cast<DType>(42), 1, 1, 1),
                    std::invalid_argument);
    CHECK_THROWS_AS(OwnedRasterArray::from_host(&one, DType::float64, 1, std::int64_t{1} << 40,
                                                std::int64_t{1} << 40),
                    std::overflow_error);
    const std::uint8_t byte = 0;
    CHECK_THROWS_AS(OwnedRasterArray::from_host(&byte, DType::uint8, 1, 1, 1,
                                                std::numeric_limits<double>::quiet_NaN()),
                    std::invalid_argument);
    CHECK_NOTHROW(OwnedRasterArray::from_host(&one, DType::float32, 1, 1, 1,
                                              std::numeric_limits<double>::quiet_NaN()));
    OwnedRasterArray r = OwnedRasterArray::from_host(&one, DType::float32, 1, 1, 1);
    CHECK_THROWS_AS(r.copy_to_host(nullptr), std::invalid_argument);
  }

  TEST_CASE("from_band_stack: host stack takes the source's metadata") {
    const OwnedRasterArray source =
        OwnedRasterArray::from_host(std::vector<float>(2 * 3 * 4).data(), DType::float32, 2, 3, 4,
                                    -1.0, Affine{5, 0, 100, 0, -5, 200}, "EPSG:32633");
    std::vector<OwnedRasterArray> parts{float_raster(1, 3, 4, 0.0f, 7.0),
                                        float_raster(1, 3, 4, 100.0f, 7.0)};
    const OwnedRasterArray s = OwnedRasterArray::from_band_stack(parts, source);
    CHECK(s.band_count() == 2);
    CHECK(s.residency() == Residency::host);
    CHECK(s.nodata() == -1.0);
    CHECK(s.affine() == source.affine());
    CHECK(s.crs() == "EPSG:32633");
    const auto* p = static_cast<const float*>(s.host_data());
    CHECK(p[0] == 0.0f);
    CHECK(p[12] == 100.0f);
    CHECK(p[23] == 111.0f);
    // One result: same storage, source metadata, the result's own handle untouched.
    const OwnedRasterArray one = OwnedRasterArray::from_band_stack({parts[1]}, source);
    CHECK(one.host_data() == parts[1].host_data());
    CHECK(one.nodata() == -1.0);
    CHECK(parts[1].nodata() == 7.0);
    CHECK(one.crs() == "EPSG:32633");
  }

  TEST_CASE("from_band_stack: NaN nodata equals NaN for float32 and float64") {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    for (DType dtype : {DType::float32, DType::float64}) {
      CAPTURE(to_string(dtype));
      const std::vector<unsigned char> z(4 * 4 * itemsize(dtype));
      const OwnedRasterArray src = OwnedRasterArray::from_host(z.data(), dtype, 1, 4, 4, nan);
      std::vector<OwnedRasterArray> parts;
      for (int i = 0; i < 3; ++i) {
        parts.push_back(OwnedRasterArray::from_host(z.data(), dtype, 1, 4, 4, nan));
      }
      const OwnedRasterArray s = OwnedRasterArray::from_band_stack(parts, src);
      CHECK(s.band_count() == 3);
      REQUIRE(s.nodata().has_value());
      CHECK(std::isnan(*s.nodata()));
      // NaN against a number, and a number against none, are mismatches.
      parts[2] = OwnedRasterArray::from_host(z.data(), dtype, 1, 4, 4, 0.0);
      CHECK_THROWS_WITH_AS(OwnedRasterArray::from_band_stack(parts, src),
                           doctest::Contains("band 2"), std::invalid_argument);
      parts[2] = OwnedRasterArray::from_host(z.data(), dtype, 1, 4, 4);
      CHECK_THROWS_AS(OwnedRasterArray::from_band_stack(parts, src), std::invalid_argument);
    }
  }

  TEST_CASE("from_band_stack: mismatches name the band") {
    const OwnedRasterArray src = float_raster(1, 3, 4, 0.0f);
    CHECK_THROWS_AS(OwnedRasterArray::from_band_stack({}, src), std::invalid_argument);
    const std::vector<double> d(12);
    CHECK_THROWS_WITH_AS(OwnedRasterArray::from_band_stack(
                             {float_raster(1, 3, 4, 0.0f),
                              OwnedRasterArray::from_host(d.data(), DType::float64, 1, 3, 4)},
                             src),
                         doctest::Contains("band 1"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(
        OwnedRasterArray::from_band_stack(
            {float_raster(1, 3, 4, 0.0f), float_raster(1, 3, 4, 0.0f), float_raster(1, 4, 3, 0.0f)},
            src),
        doctest::Contains("band 2"), std::invalid_argument);
    CHECK_THROWS_AS(OwnedRasterArray::from_band_stack(
                        {float_raster(1, 3, 4, 0.0f, 1.0), float_raster(1, 3, 4, 0.0f, 2.0)}, src),
                    std::invalid_argument);
    // The reference rejects a NaN nodata on an integer result dtype.
    const OwnedRasterArray nan_src =
        float_raster(1, 3, 4, 0.0f, std::numeric_limits<double>::quiet_NaN());
    const std::vector<std::uint8_t> u(12);
    const auto ub = OwnedRasterArray::from_host(u.data(), DType::uint8, 1, 3, 4);
    CHECK_THROWS_AS(OwnedRasterArray::from_band_stack({ub, ub}, nan_src), std::invalid_argument);
  }

  TEST_CASE("from_band_stack: any device band stacks on the device in one allocation") {
    FreshPool fresh;
    {
      const OwnedRasterArray src = float_raster(3, 8, 8, 0.0f);
      OwnedRasterArray a = float_raster(1, 8, 8, 0.0f);
      OwnedRasterArray b = float_raster(1, 8, 8, 1000.0f);
      OwnedRasterArray c = float_raster(1, 8, 8, 2000.0f);
      b.move_to(Residency::device);
      const std::size_t count = memory_pool_stats().current_count.value_or(0);
      const OwnedRasterArray s = OwnedRasterArray::from_band_stack({a, b, c}, src);
      CHECK(s.residency() == Residency::device);
      CHECK(memory_pool_stats().current_count.value_or(0) == count + 1);
      std::vector<float> out(3 * 64);
      s.copy_to_host(out.data());
      CHECK(out[0] == 0.0f);
      CHECK(out[64] == 1000.0f);
      CHECK(out[191] == 2063.0f);
    }
    CHECK(pool_current() == 0);
  }
}

TEST_CASE("exact nodata: with_nodata, metadata and band stacks keep a 64-bit sentinel exactly") {
  constexpr std::int64_t imax = std::numeric_limits<std::int64_t>::max();
  std::vector<std::int64_t> px{1, imax, 3, imax - 1};
  const auto plain = OwnedRasterArray::from_host(px.data(), DType::int64, 2, 1, 2);
  const auto r = plain.with_nodata(NodataValue::from_int64(imax));
  CHECK_FALSE(plain.exact_nodata().has_value());  // the other handle keeps its own
  REQUIRE(r.exact_nodata().has_value());
  CHECK(r.exact_nodata()->as_int64() == std::optional<std::int64_t>(imax));
  CHECK(r.nodata() == std::optional<double>(0x1p63));
  CHECK(r.host_data() == plain.host_data());
  CHECK(r.band(1).exact_nodata() == r.exact_nodata());
  const RasterMetadata m = r.metadata();
  CHECK(m.exact_nodata == r.exact_nodata());
  CHECK(m.nodata == r.nodata());
  // Stacking compares exact sentinels: INT64_MAX and INT64_MAX - 1 share a double, not a value.
  const auto other = plain.with_nodata(NodataValue::from_int64(imax - 1));
  CHECK_THROWS_WITH_AS(OwnedRasterArray::from_band_stack({r.band(0), other.band(1)}, r),
                       doctest::Contains("9223372036854775806"), std::invalid_argument);
  const auto stacked = OwnedRasterArray::from_band_stack({r.band(0), r.band(1)}, r);
  CHECK(stacked.exact_nodata() == r.exact_nodata());
  CHECK_THROWS_AS(plain.with_nodata(NodataValue(std::numeric_limits<double>::quiet_NaN())),
                  std::invalid_argument);
  CHECK_FALSE(r.with_nodata(std::nullopt).nodata().has_value());
}

TEST_CASE("with_georeferencing: a handle on the same pixels with another affine and CRS") {
  std::vector<float> px{1, 2, 3, 4, 5, 6};
  const Affine a{10, 0, 500, 0, -10, 900};
  const auto r =
      OwnedRasterArray::from_host(px.data(), DType::float32, 1, 2, 3, -1.0, a, "EPSG:3857");
  const Affine b{30, 0, 0, 0, -30, 60};
  const auto g = r.with_georeferencing(b, "EPSG:32633");
  CHECK(g.affine() == b);
  CHECK(g.crs() == "EPSG:32633");
  CHECK(g.nodata() == std::optional<double>(-1.0));
  CHECK(g.host_data() == r.host_data());  // shared storage, no copy
  CHECK(r.affine() == a);                 // the source handle keeps its own
  CHECK(r.crs() == "EPSG:3857");
}
