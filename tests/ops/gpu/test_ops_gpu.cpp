// SPDX-License-Identifier: Apache-2.0
// GPU check of the band operations (suite 'gpu'): the reference-loop cases of
// ../reference_cases.cpp on device inputs (values computed apart from either backend), and the
// device backend equal to the host backend for every op and dtype. Exact: integer outputs,
// elementwise float outputs (the .cu is built with -fmad=false), counts, min and max. Tolerance:
// statistics' mean and std, relative 1e-9 (scaled by the value range for the mean), since the
// reduction order differs. On a real driver it checks the CUDA backend (exit 77 with the reason
// when there is no device or the build has no CUDA ops: VSR_TEST_CUDA_OPS unset, built without
// nvcc); on the host emulator (suite 'ops', plain and adversarial) the emulated device backend,
// with every move, copy, stream and pool temporary as on a GPU.
#define DOCTEST_CONFIG_IMPLEMENT
#ifndef VSR_TEST_CUDA_OPS
#define VSR_TEST_CUDA_OPS 0
#endif
#include "../reference.hpp"
#include "all_dtypes.hpp"
#include "driver/cuda_driver.hpp"
#include "ops/ops_backend.hpp"

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/memory.hpp>
#include <vibespatial/raster/ops.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

using namespace vibespatial::raster;

int vsr_test_after_run();  // misuse_check.cpp

namespace {

/// Random bytes as pixels, then nodata (7) every 13th pixel and NaN every 17th for floats;
/// floats get finite random values in +-1e6.
OwnedRasterArray make(DType dt, int bands, std::int64_t h, std::int64_t w, unsigned seed) {
  const std::size_t n = static_cast<std::size_t>(bands * h * w), sz = itemsize(dt);
  std::vector<unsigned char> bytes(n * sz);
  std::mt19937_64 rng(seed);
  for (auto& b : bytes) b = static_cast<unsigned char>(rng());
  for (std::size_t i = 0; i < n; ++i) {
    unsigned char* p = bytes.data() + i * sz;
    if (dt == DType::float32) {
      float f = static_cast<float>(std::uniform_real_distribution<double>(-1e6, 1e6)(rng));
      if (i % 17 == 3) f = NAN;
      if (i % 13 == 5) f = 7;
      std::memcpy(p, &f, 4);
    } else if (dt == DType::float64) {
      double f = std::uniform_real_distribution<double>(-1e6, 1e6)(rng);
      if (i % 17 == 3) f = NAN;
      if (i % 13 == 5) f = 7;
      std::memcpy(p, &f, 8);
    } else if (i % 13 == 5) {
      std::memset(p, 0, sz);
      p[0] = 7;  // little-endian 7
    }
  }
  return OwnedRasterArray::from_host(bytes.data(), dt, bands, h, w, 7.0);
}

OwnedRasterArray on_device(const OwnedRasterArray& r) {
  std::vector<unsigned char> bytes(r.byte_size());
  r.copy_to_host(bytes.data());
  // The exact nodata (a 64-bit sentinel such as INT64_MAX is no double).
  auto out = OwnedRasterArray::from_host(bytes.data(), r.dtype(), r.band_count(), r.height(),
                                         r.width(), std::nullopt, r.affine(), r.crs())
                 .with_nodata(r.exact_nodata());
  out.move_to(Residency::device);
  return out;
}

/// Byte-equal, except that any NaN equals any NaN (float outputs).
bool same_pixels(const OwnedRasterArray& a, const OwnedRasterArray& b, int& mismatches) {
  REQUIRE(a.dtype() == b.dtype());
  REQUIRE(a.byte_size() == b.byte_size());
  std::vector<unsigned char> x(a.byte_size()), y(b.byte_size());
  a.copy_to_host(x.data());
  b.copy_to_host(y.data());
  mismatches = 0;
  const std::size_t sz = itemsize(a.dtype()), n = x.size() / sz;
  for (std::size_t i = 0; i < n; ++i) {
    const unsigned char* p = x.data() + i * sz;
    const unsigned char* q = y.data() + i * sz;
    if (std::memcmp(p, q, sz) == 0) continue;
    if (a.dtype() == DType::float32) {
      float u, v;
      std::memcpy(&u, p, 4), std::memcpy(&v, q, 4);
      if (std::isnan(u) && std::isnan(v)) continue;
    } else if (a.dtype() == DType::float64) {
      double u, v;
      std::memcpy(&u, p, 8), std::memcpy(&v, q, 8);
      if (std::isnan(u) && std::isnan(v)) continue;
    }
    ++mismatches;
  }
  return mismatches == 0;
}

}  // namespace

namespace vsr_ops_test {
OwnedRasterArray where_ops_run(OwnedRasterArray host_raster) {
  OwnedRasterArray r = on_device(host_raster);
  REQUIRE(r.residency() == Residency::device);
  return r;
}
}  // namespace vsr_ops_test

TEST_SUITE("gpu") {
  TEST_CASE("every op and dtype: device == host") {
    const int bands = 3;
    const std::int64_t h = 211, w = 307;
    for (DType dt : vsr_test::kAllDTypes) {
      CAPTURE(to_string(dt));
      const auto host = make(dt, bands, h, w, 1234);
      const auto dev = on_device(host);
      REQUIRE(dev.residency() == Residency::device);
      int bad = 0;

      const auto sh = band_statistics(host), sd = band_statistics(dev);
      for (int b = 0; b < bands; ++b) {
        const auto &x = sh[static_cast<std::size_t>(b)], &y = sd[static_cast<std::size_t>(b)];
        CHECK(x.count == y.count);
        CHECK(x.min == y.min);
        CHECK(x.max == y.max);
        CHECK(y.mean == doctest::Approx(x.mean).epsilon(1e-9).scale(x.max - x.min));
        CHECK(y.std == doctest::Approx(x.std).epsilon(1e-9));
      }

      for (DType out : {DType::uint8, DType::int16, DType::float32, DType::float64}) {
        const auto a = rescale(host, -1000, 1000, 0, 250, out);
        const auto b = rescale(dev, -1000, 1000, 0, 250, out);
        CHECK(b.residency() == Residency::device);
        CHECK_MESSAGE(same_pixels(a, b, bad), "rescale to ", to_string(out), ": ", bad);
      }
      CHECK_MESSAGE(same_pixels(clip(host, -500.5, 20000), clip(dev, -500.5, 20000), bad),
                    "clip: ", bad);
      CHECK_MESSAGE(same_pixels(fill_nodata(host, 3), fill_nodata(dev, 3), bad), "fill: ", bad);
      const auto host2 = make(dt, bands, h, w, 999);
      const auto dev2 = on_device(host2);
      CHECK_MESSAGE(
          same_pixels(normalized_difference(host, host2), normalized_difference(dev, dev2), bad),
          "normalized_difference: ", bad);
      for (EdgeMode e : {EdgeMode::nearest, EdgeMode::reflect, EdgeMode::constant_nodata})
        CHECK_MESSAGE(same_pixels(focal_mean_3x3(host, e), focal_mean_3x3(dev, e), bad),
                      "focal mode ", static_cast<int>(e), ": ", bad);
      CHECK(histogram(host, 64, -1e5, 1e5) == histogram(dev, 64, -1e5, 1e5));
      CHECK(histogram(host, 256, 0, 256) == histogram(dev, 256, 0, 256));
      CHECK(histogram(host, 256, -128, 128) == histogram(dev, 256, -128, 128));
      CHECK(histogram(host, 256, -1e6, 1e6) == histogram(dev, 256, -1e6, 1e6));
      CHECK(histogram(host, 65536, -32768, 32768) == histogram(dev, 65536, -32768, 32768));
    }
  }

  TEST_CASE("a program naming every register evaluates alike on the host and the device") {
    // By hand (the compiler needs a huge expression for 32 registers): r31 = A, r0 = 3, then
    // r_j = r31 + r_(j-1) for j = 1..30 (r_j = j * A + 3), and out = r30 + r15 = 45 * A + 6, in
    // float64 and float32 (exact for |A| < 2^15 in either). Each pixel's A differs, so registers
    // shared between pixels (threads) would show.
    using namespace detail::ops;
    const int last = kCalcMaxRegisters - 1;
    std::vector<CalcInstr> code;
    const auto emit = [&](CalcOp op, int dst, int a, int b, int arg) {
      CalcInstr in;
      in.op = op;
      in.dst = static_cast<std::uint8_t>(dst);
      in.a = static_cast<std::uint8_t>(a);
      in.b = static_cast<std::uint8_t>(b);
      in.arg = arg;
      code.push_back(in);
    };
    emit(CalcOp::load, last, 0, 0, 0);
    emit(CalcOp::constant, 0, 0, 0, 0);
    for (int j = 1; j < last; ++j) emit(CalcOp::add, j, last, j - 1, 0);
    emit(CalcOp::add, 0, last - 1, 15, 0);
    emit(CalcOp::store, 0, 0, 0, 0);
    REQUIRE(calc_registers_used(code.data(), static_cast<int>(code.size())) == kCalcMaxRegisters);
    const double constants[1] = {3.0};

    const std::int64_t h = 67, w = 129, n = h * w;  // not a multiple of a block or of 64 lanes
    std::vector<std::int16_t> a(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i)
      a[static_cast<std::size_t>(i)] = static_cast<std::int16_t>((i * 37) % 1401 - 700);
    const auto host_in = OwnedRasterArray::from_host(a.data(), DType::int16, 1, h, w);
    const auto dev_in = host_in.clone_to(Residency::device);
    const auto& st = detail::driver_state();
    for (const bool f32 : {false, true}) {
      CAPTURE(f32);
      auto host_out = OwnedRasterArray::allocate(Residency::host, DType::float64, 1, h, w);
      auto dev_out = OwnedRasterArray::allocate(Residency::device, DType::float64, 1, h, w);
      const auto run = [&](const void* in, void* out, auto backend) {
        CalcSlot slot;
        slot.data = in;
        slot.dtype = DType::int16;
        CalcOutputBand o;
        o.data = out;
        o.dtype = DType::float64;
        CalcLaunch l;
        l.code = code.data();
        l.code_size = static_cast<int>(code.size());
        l.constants = constants;
        l.constant_count = 1;
        l.slots = &slot;
        l.slot_count = 1;
        l.outputs = &o;
        l.output_count = 1;
        l.pixels = n;
        l.compute_float32 = f32;
        backend(l);
      };
      run(host_in.host_data(), host_out.mutable_host_data(),
          [](const CalcLaunch& l) { host::calc(l, nullptr); });
      run(dev_in.device_pointer(), dev_out.device_data(), [&](const CalcLaunch& l) {
        if (st.emulated) {
          emulated::calc(l, nullptr);
        } else {
#if VSR_TEST_CUDA_OPS
          device::calc(l, nullptr);
#endif
        }
      });
      std::vector<double> got_host(static_cast<std::size_t>(n)), got_dev(got_host.size());
      host_out.copy_to_host(got_host.data());
      dev_out.copy_to_host(got_dev.data());  // waits for the legacy stream the work is on
      int bad_host = 0, bad_dev = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        const double want = 45.0 * a[static_cast<std::size_t>(i)] + 6.0;
        bad_host += got_host[static_cast<std::size_t>(i)] != want;
        bad_dev += got_dev[static_cast<std::size_t>(i)] != want;
      }
      CHECK(bad_host == 0);
      CHECK(bad_dev == 0);
    }
    // One register more is refused, not run past the register file.
    code[0].dst = kCalcMaxRegisters;
    CalcLaunch bad;
    bad.code = code.data();
    bad.code_size = static_cast<int>(code.size());
    CHECK_THROWS_AS(host::calc(bad, nullptr), std::invalid_argument);
  }

  TEST_CASE("output-into forms on the device equal the host, in place too") {
    for (DType dt : {DType::uint8, DType::int16, DType::float32, DType::float64}) {
      CAPTURE(to_string(dt));
      const auto host = make(dt, 2, 97, 131, 77);
      const auto dev = on_device(host);
      int bad = 0;
      auto out = OwnedRasterArray::allocate(Residency::device, DType::float32, 2, 97, 131);
      rescale_into(dev, -1000, 1000, 0, 1, out);
      CHECK_MESSAGE(same_pixels(rescale(host, -1000, 1000, 0, 1, DType::float32), out, bad),
                    "rescale_into: ", bad);
      auto outc = OwnedRasterArray::allocate(Residency::device, compute_dtype(dt), 2, 97, 131);
      focal_mean_3x3_into(dev, EdgeMode::reflect, outc);
      CHECK_MESSAGE(same_pixels(focal_mean_3x3(host, EdgeMode::reflect), outc, bad),
                    "focal_mean_3x3_into: ", bad);
      auto inplace = on_device(host);
      clip_into(inplace, -500.5, 20000, inplace);
      CHECK(inplace.residency() == Residency::device);
      CHECK_MESSAGE(same_pixels(clip(host, -500.5, 20000), inplace, bad), "clip_into: ", bad);
    }
  }

  TEST_CASE("stream forms on a non-blocking stream equal the host") {
    const auto& api = detail::driver();
    detail::bind_current_device();
    CUstream s = nullptr;
    REQUIRE(api.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    for (DType dt : {DType::uint8, DType::int16, DType::float32, DType::float64}) {
      CAPTURE(to_string(dt));
      const auto host = make(dt, 4, 509, 1021, 4321);
      const auto dev = on_device(host);
      REQUIRE(api.cuCtxSynchronize() == CUDA_SUCCESS);  // dev was written on the legacy stream
      int bad = 0;
      const auto r = rescale(dev, -1000, 1000, 0, 255, DType::float32, s);
      const auto f = focal_mean_3x3(dev, EdgeMode::reflect, s);
      auto into = OwnedRasterArray::allocate(Residency::device, dt, 4, 509, 1021);
      REQUIRE(api.cuCtxSynchronize() == CUDA_SUCCESS);  // into comes from the legacy stream's pool
      clip_into(dev, -500.5, 20000, into, s);
      REQUIRE(api.cuStreamSynchronize(s) == CUDA_SUCCESS);
      CHECK_MESSAGE(same_pixels(rescale(host, -1000, 1000, 0, 255, DType::float32), r, bad),
                    "rescale: ", bad);
      CHECK_MESSAGE(same_pixels(focal_mean_3x3(host, EdgeMode::reflect), f, bad), "focal: ", bad);
      CHECK_MESSAGE(same_pixels(clip(host, -500.5, 20000), into, bad), "clip_into: ", bad);
      const auto sh = band_statistics(host), sd = band_statistics(dev, s);
      for (int b = 0; b < 4; ++b) {
        const auto &x = sh[static_cast<std::size_t>(b)], &y = sd[static_cast<std::size_t>(b)];
        CHECK(x.count == y.count);
        CHECK(x.min == y.min);
        CHECK(x.max == y.max);
        CHECK(y.mean == doctest::Approx(x.mean).epsilon(1e-9).scale(x.max - x.min));
      }
      CHECK(histogram(host, 128, -1e5, 1e5) == histogram(dev, 128, -1e5, 1e5, s));
    }
    REQUIRE(api.cuStreamDestroy(s) == CUDA_SUCCESS);
  }

#if VSR_TEST_CUDA_OPS
  TEST_CASE("a pool pointer is used by a Thrust kernel; the pool counts the temporaries") {
    if (detail::driver_state().emulated) {
      MESSAGE("the emulated device backend runs no Thrust kernel");
      return;
    }
    const auto before = memory_pool_stats();
    bool ok = false;
    const std::size_t temps = detail::ops::device::pool_thrust_probe(1 << 20, ok);
    CHECK(ok);
    CHECK(temps >= 1);
    const auto after = memory_pool_stats();
    REQUIRE(before.total_count.has_value() == after.total_count.has_value());
    if (after.total_count) CHECK(*after.total_count >= *before.total_count + 1 + temps);
    // Statistics on a device raster allocate the CUB temporaries and the result from the pool.
    const auto dev = on_device(make(DType::float32, 4, 512, 512, 5));
    const auto s0 = memory_pool_stats();
    (void)band_statistics(dev);
    const auto s1 = memory_pool_stats();
    if (s1.total_count) CHECK(*s1.total_count >= *s0.total_count + 2);
  }
#endif
}

int main(int argc, char** argv) {
  const auto& st = vibespatial::raster::detail::driver_state();
  if (!st.available) {
    std::fprintf(stderr, "test-ops-gpu: skipped: no usable CUDA driver: %s\n", st.reason.c_str());
    return 77;
  }
  if (!st.emulated && !(VSR_TEST_CUDA_OPS && vibespatial::raster::ops_built_with_cuda())) {
    std::fprintf(stderr,
                 "test-ops-gpu: skipped: built without CUDA (no nvcc, or -Dcuda=disabled), which "
                 "a real GPU needs\n");
    return 77;
  }
  std::fprintf(stderr, "test-ops-gpu: the %s device backend on %s\n",
               st.emulated ? "emulated" : "CUDA", st.library.c_str());
  doctest::Context ctx(argc, argv);
  int result = ctx.run();
  if (ctx.shouldExit()) return result;
  if (st.emulated && result == 0) result = vsr_test_after_run();
  return result;
}
