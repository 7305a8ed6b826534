// SPDX-License-Identifier: Apache-2.0
// A raster's diagnostic log on the host emulator: created and transfer events (bytes, seconds),
// runtime selections, the bound, the log shared by views and carried by from_band_stack.
#include "memory/pool_fixture.hpp"

#include <vibespatial/raster/buffers.hpp>
#include <vibespatial/raster/diagnostics.hpp>

#include <cstdint>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace vibespatial::raster;
using namespace vsr_test;

namespace {

OwnedRasterArray floats(int bands, std::int64_t h, std::int64_t w) {
  std::vector<float> v(static_cast<std::size_t>(bands * h * w));
  std::iota(v.begin(), v.end(), 0.0f);
  return OwnedRasterArray::from_host(v.data(), DType::float32, bands, h, w);
}

std::vector<RasterDiagnosticEvent> of_kind(const OwnedRasterArray& r, RasterDiagnosticKind k) {
  std::vector<RasterDiagnosticEvent> out;
  for (auto& e : r.diagnostics()->events()) {
    if (e.kind == k) out.push_back(e);
  }
  return out;
}

}  // namespace

TEST_SUITE("diagnostics") {
  TEST_CASE("kind names are the original's") {
    CHECK(to_string(RasterDiagnosticKind::created) == "created");
    CHECK(to_string(RasterDiagnosticKind::transfer) == "transfer");
    CHECK(to_string(RasterDiagnosticKind::materialization) == "materialization");
    CHECK(to_string(RasterDiagnosticKind::runtime) == "runtime");
    CHECK(to_string(static_cast<RasterDiagnosticKind>(99)) == "unknown");
  }

  TEST_CASE("from_host records created; each move records a transfer with bytes and seconds") {
    FreshPool fresh;
    OwnedRasterArray r = floats(2, 8, 10);
    const auto created = of_kind(r, RasterDiagnosticKind::created);
    REQUIRE(created.size() == 1);
    CHECK(created[0].detail.find("2x8x10 float32") != std::string::npos);
    r.move_to(Residency::device);
    r.move_to(Residency::device);  // no copy, no event
    (void)r.mutable_host_data();   // device -> host
    (void)r.device_data();         // host -> device
    const auto t = of_kind(r, RasterDiagnosticKind::transfer);
    REQUIRE(t.size() == 3);
    CHECK(t[0].detail.rfind("host->device 640 bytes", 0) == 0);
    CHECK(t[0].residency == Residency::device);
    CHECK(t[1].detail.rfind("device->host 640 bytes", 0) == 0);
    CHECK(t[1].residency == Residency::host);
    for (const auto& e : t) {
      CHECK(e.bytes_transferred == 640);
      CHECK(e.elapsed_seconds >= 0);
      CHECK(e.visible_to_user);
    }
  }

  TEST_CASE("a failed move records nothing") {
    FreshPool fresh(nullptr, 1024);
    OwnedRasterArray r = floats(1, 64, 64);  // 16 KiB on a 1 KiB device
    CHECK_THROWS(r.move_to(Residency::device));
    CHECK(of_kind(r, RasterDiagnosticKind::transfer).empty());
  }

  TEST_CASE("copies and band views share the storage's log; adopt_diagnostics replaces it") {
    OwnedRasterArray r = floats(3, 4, 4);
    const OwnedRasterArray v = r.band(1);
    CHECK(v.diagnostics() == r.diagnostics());
    CHECK(r.with_nodata(1.0).diagnostics() == r.diagnostics());
    OwnedRasterArray other = floats(1, 4, 4);
    CHECK(other.diagnostics() != r.diagnostics());
    other.adopt_diagnostics(r.diagnostics());
    CHECK(other.diagnostics() == r.diagnostics());
    CHECK_THROWS_AS(other.adopt_diagnostics(nullptr), std::invalid_argument);
  }

  TEST_CASE("the log is bounded: the oldest go, dropped_events counts them") {
    RasterDiagnostics log;
    const std::size_t n = RasterDiagnostics::capacity + 10;
    for (std::size_t i = 0; i < n; ++i) {
      RasterDiagnosticEvent e;
      e.detail = std::to_string(i);
      log.record(e);
    }
    const auto events = log.events();
    REQUIRE(events.size() == RasterDiagnostics::capacity);
    CHECK(events.front().detail == "10");
    CHECK(events.back().detail == std::to_string(n - 1));
    CHECK(log.dropped_events() == 10);
    for (std::size_t i = 0; i < n; ++i) log.record_runtime_selection({"auto", "cpu", "x"}, {});
    CHECK(log.runtime_history().size() == RasterDiagnostics::capacity);
    CHECK(log.events().size() == RasterDiagnostics::capacity);
  }

  TEST_CASE("record_runtime_selection keeps the selection and records a runtime event") {
    OwnedRasterArray r = floats(1, 2, 2);
    r.diagnostics()->record_runtime_selection({"auto", "cpu", "no GPU"}, r.residency());
    const auto h = r.diagnostics()->runtime_history();
    REQUIRE(h.size() == 1);
    CHECK(h[0].selected == "cpu");
    const auto rt = of_kind(r, RasterDiagnosticKind::runtime);
    REQUIRE(rt.size() == 1);
    CHECK(rt[0].detail == "selected=cpu reason=no GPU requested=auto");
  }

  TEST_CASE("from_band_stack of several results starts with their events, each log once") {
    OwnedRasterArray a = floats(1, 4, 4), b = floats(1, 4, 4);
    RasterDiagnosticEvent e;
    e.detail = "band a";
    a.diagnostics()->record(e);
    e.detail = "band b";
    b.diagnostics()->record(e);
    const OwnedRasterArray source = floats(2, 4, 4);
    const OwnedRasterArray stack = OwnedRasterArray::from_band_stack({a, b, a}, source);
    std::vector<std::string> details;
    for (const auto& ev : stack.diagnostics()->events()) details.push_back(ev.detail);
    REQUIRE(details.size() == 4);  // a: created + "band a"; b: created + "band b"
    CHECK(details[1] == "band a");
    CHECK(details[3] == "band b");
    // One result: its storage, its log.
    CHECK(OwnedRasterArray::from_band_stack({a}, source).diagnostics() == a.diagnostics());
  }

  TEST_CASE("recording from several threads keeps every event up to the bound") {
    RasterDiagnostics log;
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&log] {
        for (int i = 0; i < 1000; ++i) log.record({});
      });
    }
    for (auto& t : threads) t.join();
    CHECK(log.events().size() == RasterDiagnostics::capacity);
    CHECK(log.dropped_events() == 4000 - RasterDiagnostics::capacity);
  }
}
