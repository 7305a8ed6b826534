// SPDX-License-Identifier: Apache-2.0
// The tile executor (tiles.hpp): passes, the walk, the first-result rule, the in-memory ends,
// placement, on the host emulator (and with no driver, suite no-driver).
#include "all_dtypes.hpp"

#include <vibespatial/raster/dispatch.hpp>
#include <vibespatial/raster/errors.hpp>
#include <vibespatial/raster/tiles.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

using namespace vibespatial::raster;

namespace {

/// Calls f(T{}) with the C++ type of @p dtype.
template <class F>
void with_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::uint8:
      return f(std::uint8_t{});
    case DType::int8:
      return f(std::int8_t{});
    case DType::uint16:
      return f(std::uint16_t{});
    case DType::int16:
      return f(std::int16_t{});
    case DType::uint32:
      return f(std::uint32_t{});
    case DType::int32:
      return f(std::int32_t{});
    case DType::uint64:
      return f(std::uint64_t{});
    case DType::int64:
      return f(std::int64_t{});
    case DType::float32:
      return f(float{});
    case DType::float64:
      return f(double{});
  }
}

/// A raster of @p dtype whose pixel (b, r, c) holds (b * 131 + r * 17 + c * 3) % 97.
OwnedRasterArray pattern(DType dtype, int bands, std::int64_t h, std::int64_t w,
                         std::optional<double> nodata = {}) {
  const std::size_t item = itemsize(dtype);
  std::vector<unsigned char> bytes(static_cast<std::size_t>(bands * h * w) * item);
  std::size_t i = 0;
  for (int b = 0; b < bands; ++b) {
    for (std::int64_t r = 0; r < h; ++r) {
      for (std::int64_t c = 0; c < w; ++c, ++i) {
        const auto v = static_cast<std::uint8_t>((b * 131 + r * 17 + c * 3) % 97);
        with_type(dtype, [&](auto tag) {
          using T = decltype(tag);
          const T t = static_cast<T>(v);
          std::memcpy(bytes.data() + i * item, &t, item);
        });
      }
    }
  }
  return OwnedRasterArray::from_host(bytes.data(), dtype, bands, h, w, nodata,
                                     Affine{2, 0, 100, 0, -2, 500}, "EPSG:32633");
}

std::vector<unsigned char> bytes_of(const OwnedRasterArray& r) {
  std::vector<unsigned char> v(r.byte_size());
  r.copy_to_host(v.data());
  return v;
}

/// A 3x3 box sum with edges clamped (a halo op whose result depends on the neighbours), in the
/// raster's dtype (wrapping as the type does), so a wrong stitch or halo shows.
OwnedRasterArray box_sum(const OwnedRasterArray& in) {
  OwnedRasterArray out =
      OwnedRasterArray::allocate(Residency::host, in.dtype(), in.band_count(), in.height(),
                                 in.width(), std::nullopt, in.affine(), in.crs())
          .with_nodata(in.exact_nodata());
  with_type(in.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* s = static_cast<const T*>(in.host_data());
    T* d = static_cast<T*>(out.mutable_host_data());
    const std::int64_t h = in.height(), w = in.width();
    for (int b = 0; b < in.band_count(); ++b) {
      for (std::int64_t r = 0; r < h; ++r) {
        for (std::int64_t c = 0; c < w; ++c) {
          double acc = 0;
          for (int dr = -1; dr <= 1; ++dr) {
            for (int dc = -1; dc <= 1; ++dc) {
              const std::int64_t rr = std::clamp<std::int64_t>(r + dr, 0, h - 1);
              const std::int64_t cc = std::clamp<std::int64_t>(c + dc, 0, w - 1);
              acc += static_cast<double>(s[(b * h + rr) * w + cc]);
            }
          }
          d[(b * h + r) * w + c] = static_cast<T>(acc);
        }
      }
    }
  });
  return out;
}

RasterPlan tiled_plan(std::int64_t th, std::int64_t tw, int halo, int bands_per_pass) {
  RasterPlan p;
  p.strategy = TilingStrategy::tiled;
  p.tile_shape = {th, tw};
  p.halo = halo;
  p.bands_per_pass = bands_per_pass;
  return p;
}

/// A sink that records what it was told, in order.
struct RecordingSink final : TileSink {
  std::vector<std::string> calls;
  std::vector<TileInfo> writes;
  TileOutput output;
  void begin(const TileOutput& o) override {
    output = o;
    calls.push_back("begin");
  }
  void begin_pass(int band, int count, const std::optional<NodataValue>& nd) override {
    calls.push_back("pass " + std::to_string(band) + "+" + std::to_string(count) + " " +
                    (nd ? nd->to_string() : "none"));
  }
  void write(const OwnedRasterArray&, const TileInfo& where) override {
    writes.push_back(where);
    calls.push_back("write");
  }
  void finish() override { calls.push_back("finish"); }
};

/// A source of generated tiles whose bands have the given nodata: no raster behind it.
struct GeneratedSource final : TileSource {
  std::vector<std::optional<NodataValue>> nodata;
  std::int64_t h = 10, w = 7;
  int reads = 0;
  RasterMetadata metadata() const override {
    RasterMetadata m;
    m.height = h;
    m.width = w;
    m.band_count = static_cast<int>(nodata.size());
    m.dtype = DType::float32;
    return m;
  }
  std::vector<std::optional<NodataValue>> band_nodata() const override { return nodata; }
  OwnedRasterArray read(const RasterWindow& win, int first, int count) override {
    ++reads;
    std::vector<float> v(static_cast<std::size_t>(count * win.height * win.width));
    std::size_t i = 0;
    for (int b = 0; b < count; ++b) {
      for (std::int64_t r = 0; r < win.height; ++r) {
        for (std::int64_t c = 0; c < win.width; ++c) {
          v[i++] =
              static_cast<float>((first + b) * 1000 + (win.row_off + r) * 10 + (win.col_off + c));
        }
      }
    }
    return OwnedRasterArray::from_host(v.data(), DType::float32, count, win.height, win.width)
        .with_nodata(nodata[static_cast<std::size_t>(first)]);
  }
};

}  // namespace

TEST_SUITE("tiles") {
  TEST_CASE("tile_passes: one pass for joint ops, runs of one nodata for per-band ops") {
    const std::optional<NodataValue> none, zero = NodataValue(0.0), nan = NodataValue(NAN);
    const RasterPlan whole;
    CHECK(tile_passes({zero, zero, nan}, whole, false) == std::vector<TilePass>{{0, 3}});
    CHECK(tile_passes({zero, zero, nan, nan, none}, whole, true) ==
          std::vector<TilePass>{{0, 2}, {2, 2}, {4, 1}});
    RasterPlan batches;
    batches.strategy = TilingStrategy::band_batches;
    batches.bands_per_pass = 2;
    CHECK(tile_passes({zero, zero, zero, zero, zero}, batches, false) ==
          std::vector<TilePass>{{0, 2}, {2, 2}, {4, 1}});
    CHECK(bands_independent(5, batches, false));
    CHECK_FALSE(bands_independent(2, batches, false));
    CHECK_THROWS_AS(tile_passes({}, whole, false), std::invalid_argument);
    RasterPlan bad;
    bad.bands_per_pass = 0;
    CHECK_THROWS_AS(tile_passes({zero}, bad, false), std::invalid_argument);
  }

  TEST_CASE("a halo op through raster ends equals the whole-raster op, for every dtype") {
    for (const DType dtype : vsr_test::kAllDTypes) {
      CAPTURE(to_string(dtype));
      const OwnedRasterArray raster = pattern(dtype, 3, 37, 29, 5.0);
      const std::vector<unsigned char> whole = bytes_of(box_sum(raster));
      for (const auto& [th, tw] :
           {std::pair{8, 8}, std::pair{37, 5}, std::pair{1, 29}, std::pair{64, 64}}) {
        for (const int bpp : {1, 2, 3}) {
          CAPTURE(th);
          CAPTURE(tw);
          CAPTURE(bpp);
          RasterTileSource source(raster);
          RasterTileSink sink;
          TileRunOptions o;
          o.per_band = true;
          run_tiles(source, box_sum, sink, tiled_plan(th, tw, 1, bpp), o);
          const OwnedRasterArray out = sink.result();
          CHECK(bytes_of(out) == whole);
          CHECK(out.exact_nodata() == std::optional<NodataValue>(NodataValue(5.0)));
          CHECK(out.affine() == raster.affine());
          CHECK(out.crs() == raster.crs());
        }
      }
    }
  }

  TEST_CASE("a halo narrower than the op's reach differs from the whole result") {
    // The check above can fail: without the halo the tile edges see clamped, not real,
    // neighbours.
    const OwnedRasterArray raster = pattern(DType::float32, 1, 20, 20);
    RasterTileSource source(raster);
    RasterTileSink sink;
    run_tiles(source, box_sum, sink, tiled_plan(8, 8, 0, 1));
    CHECK(bytes_of(sink.result()) != bytes_of(box_sum(raster)));
  }

  TEST_CASE("the sink hears begin, each pass, each tile in order, then finish") {
    GeneratedSource source;
    source.nodata = {NodataValue(1.0), NodataValue(1.0), NodataValue(2.0)};
    RecordingSink sink;
    TileRunOptions o;
    o.per_band = true;
    run_tiles(
        source, [](const OwnedRasterArray& t) { return t; }, sink, tiled_plan(6, 7, 1, 3), o);
    CHECK(sink.calls == std::vector<std::string>{"begin", "pass 0+2 1", "write", "write",
                                                 "pass 2+1 2", "write", "write", "finish"});
    CHECK(sink.output.band_count == 3);
    REQUIRE(sink.writes.size() == 4);
    CHECK(sink.writes[1].window == RasterWindow{0, 6, 7, 4});
    CHECK(sink.writes[1].read == RasterWindow{0, 5, 7, 5});
    CHECK(sink.writes[2].output_band == 2);
    CHECK(sink.writes[3].index == 3);
    CHECK(sink.writes[3].total == 4);
    CHECK(source.reads == 4);
  }

  TEST_CASE("the first-result rule: dtype, bands, nodata and shape are checked, by tile") {
    GeneratedSource source;
    source.nodata = {NodataValue(0.0)};
    const RasterPlan plan = tiled_plan(4, 7, 0, 1);
    RecordingSink sink;
    const auto second_tile = [&](auto change) {
      sink = RecordingSink{};
      int n = 0;
      run_tiles(
          source, [&](const OwnedRasterArray& t) { return n++ == 1 ? change(t) : t; }, sink, plan);
    };
    const auto as_float64 = [](const OwnedRasterArray& t) {
      std::vector<double> v(static_cast<std::size_t>(t.height() * t.width()), 1.0);
      return OwnedRasterArray::from_host(v.data(), DType::float64, 1, t.height(), t.width(), 0.0);
    };
    CHECK_THROWS_WITH_AS(second_tile(as_float64),
                         doctest::Contains("tile 1 (row 4, column 0) returned dtype float64, "
                                           "which differs from the first tile's float32"),
                         std::invalid_argument);
    // Nothing is finished after a failure.
    CHECK(sink.calls == std::vector<std::string>{"begin", "pass 0+1 0", "write"});
    CHECK_THROWS_WITH_AS(
        second_tile([](const OwnedRasterArray& t) { return t.with_nodata(NodataValue(NAN)); }),
        doctest::Contains("returned nodata nan, which differs from the first tile's 0"),
        std::invalid_argument);
    CHECK_THROWS_WITH_AS(second_tile([](const OwnedRasterArray& t) {
                           return OwnedRasterArray::from_band_stack({t, t}, t);
                         }),
                         doctest::Contains("returned 2 band(s), which differs"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(second_tile([](const OwnedRasterArray& t) {
                           return copy_window(t, RasterWindow{0, 0, 3, 2});
                         }),
                         doctest::Contains("op returned 2 x 3 for tile 1"), std::invalid_argument);
    // Per-band: a pass must get as many bands back as it gave.
    source.nodata = {NodataValue(0.0), NodataValue(0.0)};
    TileRunOptions per_band;
    per_band.per_band = true;
    CHECK_THROWS_WITH_AS(run_tiles(
                             source, [](const OwnedRasterArray& t) { return t.band(0); }, sink,
                             tiled_plan(4, 7, 0, 2), per_band),
                         doctest::Contains("op returned 1 band(s) for tile 0"),
                         std::invalid_argument);
  }

  TEST_CASE("each pass fixes its own nodata; a raster sink refuses two nodata") {
    GeneratedSource source;
    source.nodata = {NodataValue(1.0), NodataValue(2.0)};
    TileRunOptions o;
    o.per_band = true;
    RecordingSink rec;
    run_tiles(
        source, [](const OwnedRasterArray& t) { return t; }, rec, tiled_plan(5, 5, 0, 2), o);
    CHECK(rec.calls.back() == "finish");
    RasterTileSink sink;
    CHECK_THROWS_WITH_AS(
        run_tiles(
            source, [](const OwnedRasterArray& t) { return t; }, sink, tiled_plan(5, 5, 0, 2), o),
        doctest::Contains("keeps one nodata for all bands"), std::invalid_argument);
    CHECK_THROWS_AS(sink.result(), std::logic_error);
  }

  TEST_CASE("bands of different nodata taken together are refused unless mixed is accepted") {
    GeneratedSource source;
    source.nodata = {NodataValue(1.0), std::nullopt};
    RecordingSink sink;
    CHECK_THROWS_WITH_AS(
        run_tiles(
            source, [](const OwnedRasterArray& t) { return t; }, sink, RasterPlan{}),
        doctest::Contains("the bands differ in nodata"), std::runtime_error);
    CHECK(source.reads == 0);
    TileRunOptions o;
    o.mixed_nodata = true;
    run_tiles(
        source, [](const OwnedRasterArray& t) { return t; }, sink, RasterPlan{}, o);
    CHECK(sink.calls == std::vector<std::string>{"begin", "pass 0+2 1", "write", "finish"});
  }

  TEST_CASE("bad plans and ops are refused before anything is read") {
    GeneratedSource source;
    source.nodata = {std::nullopt};
    RecordingSink sink;
    const BandOp id = [](const OwnedRasterArray& t) { return t; };
    CHECK_THROWS_AS(run_tiles(source, BandOp{}, sink, RasterPlan{}), std::invalid_argument);
    RasterPlan p = tiled_plan(4, 4, -1, 1);
    CHECK_THROWS_AS(run_tiles(source, id, sink, p), std::invalid_argument);
    p = tiled_plan(0, 4, 0, 1);
    CHECK_THROWS_AS(run_tiles(source, id, sink, p), std::invalid_argument);
    p = tiled_plan(4, 4, 0, 0);
    CHECK_THROWS_AS(run_tiles(source, id, sink, p), std::invalid_argument);
    CHECK(source.reads == 0);
    CHECK(sink.calls.empty());
  }

  TEST_CASE("a raster source: band selection, views for whole windows, device rasters refused") {
    const OwnedRasterArray raster = pattern(DType::uint16, 4, 9, 6, 3.0);
    RasterTileSource source(raster, {4, 2, 3});
    CHECK(source.metadata().band_count == 3);
    CHECK(source.band_nodata().size() == 3);
    const OwnedRasterArray two = source.read(RasterWindow{0, 0, 6, 9}, 1, 2);  // bands 2, 3
    CHECK(two.host_data() == raster.band(1).host_data());                      // a view
    CHECK(bytes_of(two) == bytes_of(raster.bands(1, 2)));
    const OwnedRasterArray win = source.read(RasterWindow{1, 2, 3, 4}, 0, 2);  // bands 4, 2
    CHECK(win.affine() == raster.affine().shifted(1, 2));
    CHECK(bytes_of(win) == bytes_of(copy_window(raster, RasterWindow{1, 2, 3, 4}, {4, 2})));
    CHECK_THROWS_AS(RasterTileSource(raster, {5}), std::invalid_argument);
    CHECK_THROWS_AS(copy_window(raster, RasterWindow{4, 0, 3, 1}), std::invalid_argument);
    CHECK_THROWS_AS(copy_window(raster, RasterWindow{0, 0, 0, 1}), std::invalid_argument);
    CHECK_THROWS_AS(raster.bands(3, 2), std::out_of_range);
    CHECK_THROWS_AS(raster.bands(0, 0), std::out_of_range);
  }

  TEST_CASE("placement strings") {
    CHECK(placement_from_string("auto") == Placement::automatic);
    CHECK(to_string(Placement::gpu) == "gpu");
    CHECK_THROWS_WITH_AS(placement_from_string("GPU"),
                         doctest::Contains("placement must be auto, gpu or cpu, not 'GPU'"),
                         std::invalid_argument);
  }
}

TEST_SUITE("tiles-emulator") {
  TEST_CASE("placed on the emulator: auto and cpu on the host, gpu on the device") {
    const PlacementDecision automatic = placed();
    CHECK(automatic.residency == Residency::host);
    CHECK(automatic.emulated);
    CHECK(automatic.reason.find("emulator") != std::string::npos);
    CHECK(placed(Placement::cpu).residency == Residency::host);
    CHECK(placed(Placement::gpu).residency == Residency::device);
  }

  TEST_CASE("device placement: tiles reach the op on the device, per-band tiles band by band") {
    const OwnedRasterArray raster = pattern(DType::float32, 3, 12, 10, 7.0);
    for (const bool per_band : {false, true}) {
      CAPTURE(per_band);
      RasterTileSource source(raster);
      RasterTileSink sink;
      TileRunOptions o;
      o.per_band = per_band;
      o.placement = Residency::device;
      int calls = 0;
      const BandOp op = [&](const OwnedRasterArray& t) {
        ++calls;
        REQUIRE(t.residency() == Residency::device);
        CHECK(t.band_count() == (per_band ? 1 : 3));
        // The emulator's device memory is host memory: the box sum runs on a host copy.
        return box_sum(t.clone_to(Residency::host));
      };
      run_tiles(source, op, sink, tiled_plan(5, 10, 1, 3), o);
      CHECK(calls == (per_band ? 9 : 3));
      CHECK(bytes_of(sink.result()) == bytes_of(box_sum(raster)));
    }
  }
}

TEST_SUITE("no-driver") {
  TEST_CASE("placed with no driver: the host, and gpu refused") {
    const PlacementDecision d = placed();
    CHECK(d.residency == Residency::host);
    CHECK_FALSE(d.emulated);
    CHECK(d.reason.rfind("none (", 0) == 0);
    CHECK_THROWS_AS(placed(Placement::gpu), DriverUnavailableError);
  }
}
