// SPDX-License-Identifier: Apache-2.0
// The tile executor (tiles.hpp): passes, the walk, the first-result rule, the in-memory ends,
// placement, on the host emulator (and with no driver, suite no-driver).
#include "all_dtypes.hpp"
#include "common/dtype_visit.hpp"

#include <vibespatial/raster/dispatch.hpp>
#include <vibespatial/raster/errors.hpp>
#include <vibespatial/raster/placement.hpp>
#include <vibespatial/raster/tiles.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace vibespatial::raster;

namespace {

using detail::visit_dtype;

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
        visit_dtype(dtype, [&](auto tag) {
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
  visit_dtype(in.dtype(), [&](auto tag) {
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

/// Connected components (4-neighbour) of the non-zero pixels of band 0 of @p in: int32 labels
/// 1.. in raster order of each component's first pixel, 0 for background.
std::vector<std::int32_t> label_whole(const std::uint8_t* px, std::int64_t h, std::int64_t w) {
  std::vector<std::int32_t> lab(static_cast<std::size_t>(h * w), 0);
  std::int32_t next = 0;
  std::vector<std::int64_t> stack;
  for (std::int64_t i = 0; i < h * w; ++i) {
    if (px[i] == 0 || lab[static_cast<std::size_t>(i)] != 0) continue;
    lab[static_cast<std::size_t>(i)] = ++next;
    stack.push_back(i);
    while (!stack.empty()) {
      const std::int64_t p = stack.back();
      stack.pop_back();
      const std::int64_t r = p / w, c = p % w;
      const std::int64_t nb[4][2] = {{r - 1, c}, {r + 1, c}, {r, c - 1}, {r, c + 1}};
      for (const auto& n : nb) {
        if (n[0] < 0 || n[0] >= h || n[1] < 0 || n[1] >= w) continue;
        const std::int64_t q = n[0] * w + n[1];
        if (px[q] != 0 && lab[static_cast<std::size_t>(q)] == 0) {
          lab[static_cast<std::size_t>(q)] = next;
          stack.push_back(q);
        }
      }
    }
  }
  return lab;
}

OwnedRasterArray labels_raster(const std::vector<std::int32_t>& lab, std::int64_t h,
                               std::int64_t w) {
  return OwnedRasterArray::from_host(lab.data(), DType::int32, 1, h, w);
}

/// A binary blob pattern: pixels on where a few overlapping diagonals and rings lie.
OwnedRasterArray blobs(std::int64_t h, std::int64_t w) {
  std::vector<std::uint8_t> v(static_cast<std::size_t>(h * w));
  for (std::int64_t r = 0; r < h; ++r) {
    for (std::int64_t c = 0; c < w; ++c) {
      const bool on = ((r * 7 + c * 3) % 11 < 3) ||
                      ((r - 12) * (r - 12) + (c - 20) * (c - 20) < 30) || (c == 33);
      v[static_cast<std::size_t>(r * w + c)] = on ? 1 : 0;
    }
  }
  return OwnedRasterArray::from_host(v.data(), DType::uint8, 1, h, w);
}

/// Labels each tile on its own, made unique across tiles by the index of its first pixel.
OwnedRasterArray label_tile(const OwnedRasterArray& tile, std::int64_t raster_height,
                            std::int64_t raster_width) {
  const std::int64_t h = tile.height(), w = tile.width();
  std::vector<std::int32_t> lab =
      label_whole(static_cast<const std::uint8_t*>(tile.host_data()), h, w);
  // The tile's origin from its affine (identity affine: c = col, f = -row).
  const auto col = static_cast<std::int64_t>(tile.affine().c);
  const auto row = static_cast<std::int64_t>(-tile.affine().f);
  const auto base =
      static_cast<std::int32_t>((row * raster_width + col) * raster_height * raster_width);
  for (auto& l : lab) l = l == 0 ? 0 : l + base;
  return labels_raster(lab, h, w);
}

/// Unions labels that touch across tile seams, then renumbers in raster order.
OwnedRasterArray merge_labels(const OwnedRasterArray& inter, const std::vector<TileWindow>& tiles,
                              bool broken = false) {
  const std::int64_t h = inter.height(), w = inter.width();
  std::vector<std::int32_t> lab(static_cast<std::size_t>(h * w));
  inter.copy_to_host(lab.data());
  std::map<std::int32_t, std::int32_t> parent;
  const std::function<std::int32_t(std::int32_t)> find = [&](std::int32_t x) {
    auto it = parent.find(x);
    if (it == parent.end() || it->second == x) return x;
    return it->second = find(it->second);
  };
  const auto unite = [&](std::int32_t a, std::int32_t b) {
    a = find(a), b = find(b);
    if (a != b) parent[std::max(a, b)] = std::min(a, b);
  };
  if (!broken) {
    for (const TileWindow& t : tiles) {
      const RasterWindow& win = t.window;
      // The seams below and right of each tile.
      for (std::int64_t c = win.col_off; c < win.col_off + win.width; ++c) {
        const std::int64_t r = win.row_off + win.height;
        if (r < h && lab[r * w + c] && lab[(r - 1) * w + c])
          unite(lab[r * w + c], lab[(r - 1) * w + c]);
      }
      for (std::int64_t r = win.row_off; r < win.row_off + win.height; ++r) {
        const std::int64_t c = win.col_off + win.width;
        if (c < w && lab[r * w + c] && lab[r * w + c - 1])
          unite(lab[r * w + c], lab[r * w + c - 1]);
      }
    }
  }
  std::map<std::int32_t, std::int32_t> order;
  for (auto& l : lab) {
    if (l == 0) continue;
    const std::int32_t root = find(l);
    auto [it, fresh] = order.try_emplace(root, static_cast<std::int32_t>(order.size()) + 1);
    l = it->second;
  }
  return labels_raster(lab, h, w);
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
        doctest::Contains("returned nodata nan, which differs from the first tile's 0.0"),
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
                         doctest::Contains("op returned 1 band(s) for a pass of 2 at tile 0"),
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

TEST_SUITE("tiles") {
  TEST_CASE("dispatch_tiled_binary equals the op on the whole pair, for every dtype") {
    for (const DType dtype : vsr_test::kAllDTypes) {
      CAPTURE(to_string(dtype));
      const OwnedRasterArray a = pattern(dtype, 2, 23, 19, 1.0);
      const OwnedRasterArray b = pattern(dtype, 2, 23, 19).with_nodata(std::nullopt);
      // a box sum of a plus b: both tiles are used and the halo matters.
      const BinaryBandOp op = [](const OwnedRasterArray& x, const OwnedRasterArray& y) {
        CHECK(y.exact_nodata() == std::nullopt);  // b's own nodata, not a's
        OwnedRasterArray s = box_sum(x);
        visit_dtype(x.dtype(), [&](auto tag) {
          using T = decltype(tag);
          T* d = static_cast<T*>(s.mutable_host_data());
          const T* q = static_cast<const T*>(y.host_data());
          for (std::size_t i = 0; i < s.byte_size() / sizeof(T); ++i)
            d[i] = static_cast<T>(d[i] + q[i]);
        });
        return s;
      };
      const std::vector<unsigned char> whole = bytes_of(op(a, b));
      for (const auto& [th, tw] : {std::pair{5, 7}, std::pair{23, 4}, std::pair{64, 64}}) {
        RasterPlan plan = tiled_plan(th, tw, 1, 2);
        CHECK(bytes_of(dispatch_tiled_binary(a, b, op, plan)) == whole);
      }
      // Without the halo, a wrong seam shows: the check above can fail.
      CHECK(bytes_of(dispatch_tiled_binary(a, b, op, tiled_plan(5, 7, 0, 2))) != whole);
    }
    const OwnedRasterArray a = pattern(DType::float32, 1, 10, 10);
    const OwnedRasterArray other = pattern(DType::float32, 1, 10, 11);
    CHECK_THROWS_WITH_AS(
        dispatch_tiled_binary(
            a, other, [](const auto& x, const auto&) { return x; }, tiled_plan(4, 4, 0, 1)),
        doctest::Contains("a is 10 x 10 pixels and b 11 x 10"), std::invalid_argument);
  }

  TEST_CASE("dispatch_tiled_accumulator: a histogram by tiles equals the whole histogram") {
    const OwnedRasterArray r = pattern(DType::uint8, 3, 41, 37);
    const auto hist = [](const OwnedRasterArray& t) {
      std::vector<std::int64_t> h(97, 0);
      const auto* p = static_cast<const std::uint8_t*>(t.host_data());
      for (std::size_t i = 0; i < t.byte_size(); ++i) ++h[p[i]];
      return h;
    };
    const auto add = [](std::vector<std::int64_t> acc, const std::vector<std::int64_t>& p) {
      for (std::size_t i = 0; i < acc.size(); ++i) acc[i] += p[i];
      return acc;
    };
    const std::vector<std::int64_t> whole = hist(r);
    for (const auto& [th, tw] : {std::pair{8, 8}, std::pair{41, 5}, std::pair{100, 100}}) {
      CHECK(dispatch_tiled_accumulator(r, hist, add, tiled_plan(th, tw, 3, 1)) == whole);
    }
    CHECK(dispatch_tiled_accumulator(r, hist, add, RasterPlan{}) == whole);
    // A merge that keeps only the last partial is wrong, and the comparison shows it.
    const auto last = [](std::vector<std::int64_t>, const std::vector<std::int64_t>& p) {
      return p;
    };
    CHECK(dispatch_tiled_accumulator(r, hist, last, tiled_plan(8, 8, 0, 1)) != whole);
    const auto grow = [](std::vector<std::int64_t> acc, const std::vector<std::int64_t>& p) {
      acc.insert(acc.end(), p.begin(), p.end());
      return acc;
    };
    CHECK_THROWS_WITH_AS(dispatch_tiled_accumulator(r, hist, grow, tiled_plan(8, 8, 0, 1)),
                         doctest::Contains("the merge at tile 1 changed the partial's shape"),
                         std::invalid_argument);
  }

  TEST_CASE("dispatch_tiled_multipass: tile labels merged across seams equal whole labels") {
    const std::int64_t h = 40, w = 45;
    const OwnedRasterArray r = blobs(h, w);
    const std::vector<std::int32_t> whole =
        label_whole(static_cast<const std::uint8_t*>(r.host_data()), h, w);
    const BandOp local = [&](const OwnedRasterArray& t) { return label_tile(t, h, w); };
    const MultipassMerge merge = [](const OwnedRasterArray& i, const std::vector<TileWindow>& t) {
      return merge_labels(i, t);
    };
    for (const auto& [th, tw] : {std::pair{8, 8}, std::pair{13, 45}, std::pair{40, 7}}) {
      CAPTURE(th);
      CAPTURE(tw);
      const OwnedRasterArray got =
          dispatch_tiled_multipass(r, local, merge, tiled_plan(th, tw, 0, 1));
      std::vector<std::int32_t> v(static_cast<std::size_t>(h * w));
      got.copy_to_host(v.data());
      CHECK(v == whole);
      // A merge that ignores the seams gives other labels: the check can fail.
      const OwnedRasterArray broken = dispatch_tiled_multipass(
          r, local,
          [](const OwnedRasterArray& i, const std::vector<TileWindow>& t) {
            return merge_labels(i, t, true);
          },
          tiled_plan(th, tw, 0, 1));
      broken.copy_to_host(v.data());
      CHECK(v != whole);
    }
    CHECK_THROWS_WITH_AS(
        dispatch_tiled_multipass(
            r, local,
            [](const OwnedRasterArray& i, const std::vector<TileWindow>&) {
              std::vector<float> f(static_cast<std::size_t>(i.height() * i.width()));
              return OwnedRasterArray::from_host(f.data(), DType::float32, 1, i.height(),
                                                 i.width());
            },
            tiled_plan(8, 8, 0, 1)),
        doctest::Contains("merge_fn returned 1 x 40 x 45 float32 for an intermediate of 1 x 40 x "
                          "45 int32"),
        std::invalid_argument);
  }
}

TEST_SUITE("tiles") {
  TEST_CASE("overlapped stages give the serial result, for every depth") {
    const OwnedRasterArray raster = pattern(DType::int16, 3, 53, 41, 9.0);
    const std::vector<unsigned char> whole = bytes_of(box_sum(raster));
    for (const int depth : {0, 1, 2, 8}) {
      CAPTURE(depth);
      RasterTileSource source(raster);
      RasterTileSink sink;
      TileRunOptions o;
      o.per_band = true;
      o.overlap = depth;
      std::vector<std::int64_t> done;
      o.progress = [&](std::int64_t d, std::int64_t) { done.push_back(d); };
      run_tiles(source, box_sum, sink, tiled_plan(8, 16, 1, 2), o);
      CHECK(bytes_of(sink.result()) == whole);
      REQUIRE(!done.empty());
      CHECK(done.size() == static_cast<std::size_t>(done.back()));  // in order, each once
      for (std::size_t i = 0; i < done.size(); ++i)
        CHECK(done[i] == static_cast<std::int64_t>(i + 1));
    }
    CHECK(overlap_tiles_live(0) == 1);
    CHECK(overlap_tiles_live(1) == 3);
    GeneratedSource source;
    source.nodata = {std::nullopt};
    RecordingSink sink;
    TileRunOptions bad;
    bad.overlap = -1;
    CHECK_THROWS_AS(
        run_tiles(
            source, [](const OwnedRasterArray& t) { return t; }, sink, RasterPlan{}, bad),
        std::invalid_argument);
  }

  TEST_CASE("each stage of each tile ends once, after it began, with or without overlap") {
    const OwnedRasterArray raster = pattern(DType::float32, 2, 40, 30);
    for (const int depth : {0, 1, 3}) {
      CAPTURE(depth);
      RasterTileSource source(raster);
      RasterTileSink sink;
      TileRunOptions o;
      o.overlap = depth;
      // Per (tile, stage): +1 at the start, +10 at the end; the end must come after the start.
      std::map<std::pair<std::int64_t, int>, int> seen;
      bool ordered = true;
      o.stage = [&](const TileInfo& w, TileStage st) {
        seen[{w.index, static_cast<int>(st)}] += 1;
      };
      o.stage_done = [&](const TileInfo& w, TileStage st) {
        int& v = seen[{w.index, static_cast<int>(st)}];
        ordered = ordered && v == 1;
        v += 10;
      };
      run_tiles(source, box_sum, sink, tiled_plan(16, 16, 1, 2), o);
      CHECK(ordered);
      REQUIRE(seen.size() == 6 * 3);  // 3 x 2 tiles of 16 x 16 over 40 x 30, 3 stages each
      for (const auto& [key, v] : seen) CHECK(v == 11);
    }
  }

  TEST_CASE("with overlap, tile k computes while tile k+1 is read and tile k-1 written") {
    // Each compute of tile k >= 1 waits (up to 20 s) for the read of tile k+1 and the write of
    // tile k-1 to have started: without overlap neither can, and the waits time out.
    struct Events {
      std::mutex m;
      std::condition_variable cv;
      std::vector<std::int64_t> reads, writes;
      bool seen(const std::vector<std::int64_t>& v, std::int64_t k) {
        return std::find(v.begin(), v.end(), k) != v.end();
      }
    };
    for (const int depth : {0, 1}) {
      CAPTURE(depth);
      Events ev;
      GeneratedSource source;
      source.nodata = {std::nullopt};
      source.h = 40;
      RecordingSink sink;
      TileRunOptions o;
      o.overlap = depth;
      o.stage = [&](const TileInfo& where, TileStage st) {
        std::lock_guard lock(ev.m);
        if (st == TileStage::read) ev.reads.push_back(where.index);
        if (st == TileStage::write) ev.writes.push_back(where.index);
        ev.cv.notify_all();
      };
      int overlapped = 0;
      int k = 0;
      const BandOp op = [&](const OwnedRasterArray& t) {
        const int me = k++;
        if (me >= 1 && me < 3) {
          std::unique_lock lock(ev.m);
          const bool both = ev.cv.wait_for(lock, std::chrono::seconds(depth == 0 ? 0 : 20), [&] {
            return ev.seen(ev.reads, me + 1) && ev.seen(ev.writes, me - 1);
          });
          overlapped += both ? 1 : 0;
        }
        return t;
      };
      run_tiles(source, op, sink, tiled_plan(10, 7, 0, 1), o);
      CHECK(overlapped == (depth == 0 ? 0 : 2));
      CHECK(sink.calls.back() == "finish");
    }
  }

  TEST_CASE("with overlap, a failure in any stage stops the run: first error, no finish") {
    struct FailingSource final : TileSource {
      GeneratedSource inner;
      int fail_at = -1, reads = 0;
      RasterMetadata metadata() const override { return inner.metadata(); }
      std::vector<std::optional<NodataValue>> band_nodata() const override {
        return inner.band_nodata();
      }
      OwnedRasterArray read(const RasterWindow& w, int f, int c) override {
        if (reads++ == fail_at) throw std::runtime_error("read failed");
        return inner.read(w, f, c);
      }
    };
    struct FailingSink final : TileSink {
      int fail_at = -1, writes = 0;
      bool finished = false;
      void begin(const TileOutput&) override {}
      void write(const OwnedRasterArray&, const TileInfo&) override {
        if (writes++ == fail_at) throw std::runtime_error("write failed");
      }
      void finish() override { finished = true; }
    };
    for (const int depth : {1, 3}) {
      for (const char* where : {"read", "compute", "write"}) {
        CAPTURE(depth);
        CAPTURE(where);
        FailingSource source;
        source.inner.nodata = {std::nullopt};
        source.inner.h = 60;
        FailingSink sink;
        const std::string w = where;
        if (w == "read") source.fail_at = 3;
        if (w == "write") sink.fail_at = 3;
        int n = 0;
        const BandOp op = [&](const OwnedRasterArray& t) {
          if (w == "compute" && n++ == 3) throw std::runtime_error("compute failed");
          return t;
        };
        TileRunOptions o;
        o.overlap = depth;
        CHECK_THROWS_WITH_AS(run_tiles(source, op, sink, tiled_plan(5, 7, 0, 1), o),
                             (w + " failed").c_str(), std::runtime_error);
        CHECK_FALSE(sink.finished);
        CHECK(sink.writes <= 4);
      }
    }
  }
}

TEST_SUITE("tiles") {
  TEST_CASE("a walk over billions of tiles holds no list of them") {
    GeneratedSource source;
    source.nodata = {std::nullopt};
    source.h = 1000000000;
    source.w = 1000000000;
    for (const int depth : {0, 2}) {
      RecordingSink sink;
      TileRunOptions o;
      o.overlap = depth;
      std::vector<TileInfo> reads;
      o.stage = [&](const TileInfo& where, TileStage st) {
        if (st == TileStage::read) reads.push_back(where);
      };
      int n = 0;
      CHECK_THROWS_WITH_AS(run_tiles(
                               source,
                               [&](const OwnedRasterArray& t) {
                                 if (++n == 3) throw std::runtime_error("enough");
                                 return t;
                               },
                               sink, tiled_plan(16, 16, 1, 1), o),
                           "enough", std::runtime_error);
      REQUIRE(reads.size() >= 3);
      CHECK(reads[1].total == 3906250000000000LL);
      CHECK(reads[1].window == RasterWindow{16, 0, 16, 16});
    }
    CHECK(tile_window_at(10, 10, 4, 4, 1, 8) == tile_windows(10, 10, 4, 4, 1)[8]);
    CHECK_THROWS_AS(tile_window_at(10, 10, 4, 4, 1, 9), std::out_of_range);
  }
}

TEST_CASE("the placement rule on given facts: a real GPU with CUDA ops is the only auto device") {
  DriverInfo gpu;
  gpu.available = true;
  gpu.library = "libcuda.so.1";
  gpu.devices.resize(1);
  gpu.devices[0].name = "NVIDIA H200";
  const PlacementDecision cuda = placed(Placement::automatic, gpu, true);
  CHECK(cuda.residency == Residency::device);
  CHECK(cuda.reason == "GPU NVIDIA H200: device ops (CUDA)");
  CHECK_FALSE(cuda.emulated);
  CHECK(placed(Placement::automatic, gpu, false).residency == Residency::host);
  CHECK(placed(Placement::gpu, gpu, false).residency == Residency::device);
  CHECK(placed(Placement::cpu, gpu, true).residency == Residency::host);
  DriverInfo emulator = gpu;
  emulator.emulated = true;
  const PlacementDecision emulated = placed(Placement::automatic, emulator, true);
  CHECK(emulated.residency == Residency::host);
  CHECK(emulated.emulated);
  CHECK(placed(Placement::gpu, emulator, true).residency == Residency::device);
  DriverInfo none;
  none.reason = "no libcuda";
  CHECK(placed(Placement::automatic, none, true).reason ==
        "none (no libcuda): host ops on the CPU");
  CHECK_THROWS_AS(placed(Placement::gpu, none, true), DriverUnavailableError);
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
