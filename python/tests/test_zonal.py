# SPDX-License-Identifier: Apache-2.0
"""ops.zonal_stats against its judges: exactextract (fractional coverage, every statistic it
has), gdal_rasterize masks + NumPy (center and all-touched), NumPy by hand (zone rasters); tiled
runs equal the whole run; zones as paths, shapely geometries and WKB; the refusals."""

from __future__ import annotations

import json
import math
import shutil
import subprocess

import numpy as np
import pytest

from vibespatial_raster import io, ops
from vibespatial_raster.buffers import OwnedRasterArray

shapely = pytest.importorskip("shapely")
from shapely.geometry import MultiPolygon, Point, Polygon, mapping  # noqa: E402

AFFINE = (0.5, 0.0, 10.0, 0.0, -0.5, 80.0)  # rasterio order: x = 0.5 col + 10, y = -0.5 row + 80
H, W = 60, 70
XMIN, YMAX = 10.0, 80.0
XMAX, YMIN = XMIN + 0.5 * W, YMAX - 0.5 * H
NODATA = -9999.0


def values(seed: int = 1, discrete: bool = False) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = (rng.integers(0, 12, (H, W)) * 0.5 if discrete else rng.normal(50, 20, (H, W)))
    a = a.astype(np.float32)
    a.flat[::37] = NODATA
    a.flat[5::41] = np.nan
    return a


def star(rng: np.random.Generator, cx: float, cy: float, r: float, n: int) -> list:
    t = np.linspace(0, 2 * math.pi, n, endpoint=False)
    radius = r * rng.uniform(0.35, 1.0, n)
    return list(zip(cx + radius * np.cos(t), cy + radius * np.sin(t)))


def zones(seed: int = 2, n: int = 25) -> list:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        cx, cy = rng.uniform(XMIN - 2, XMAX + 2), rng.uniform(YMIN - 2, YMAX + 2)
        r = rng.uniform(0.8, 7)
        shell = star(rng, cx, cy, r, 5 + i % 11)
        holes = [star(rng, cx, cy, 0.3 * r * 0.35, 6)] if i % 3 == 0 else []
        out.append(Polygon(shell, holes))
    out.append(MultiPolygon([Polygon(star(rng, 20, 60, 2, 7)), Polygon(star(rng, 30, 70, 1.5, 6))]))
    out.append(Polygon([(100, 100), (101, 100), (101, 101)]))  # outside the raster
    return out


def raster(a: np.ndarray) -> OwnedRasterArray:
    return OwnedRasterArray.from_numpy(a, nodata=NODATA, affine=AFFINE)


def exact(a: np.ndarray, geoms: list, stats: list, weights: np.ndarray | None = None):
    ee = pytest.importorskip("exactextract")
    from exactextract.feature import JSONFeatureSource
    from exactextract.raster import NumPyRasterSource

    src = NumPyRasterSource(a, XMIN, YMIN, XMAX, YMAX, nodata=NODATA)
    wsrc = None if weights is None else NumPyRasterSource(weights, XMIN, YMIN, XMAX, YMAX)
    feats = JSONFeatureSource([{"type": "Feature", "properties": {"id": i},
                                "geometry": mapping(g)} for i, g in enumerate(geoms)])
    return ee.exact_extract(src, feats, stats, weights=wsrc, output="pandas")


def close(got: np.ndarray, want, rtol: float) -> None:
    want = np.asarray(want, dtype=np.float64)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=0, equal_nan=True)


def test_fractional_moments_equal_exactextract():
    a = values()
    geoms = zones()
    got = ops.zonal_stats(raster(a), geoms,
                          stats=["count", "sum", "mean", "min", "max", "stdev", "variance"])
    want = exact(a, geoms, ["count", "sum", "mean", "min", "max", "stdev", "variance"])
    assert got.rows == len(geoms)
    assert list(got["zone"]) == list(range(len(geoms)))
    assert (got["band"] == 1).all()
    close(got["count"], want["count"], 1e-9)
    used = got["count"] > 0
    assert used.sum() >= 20
    # A zone without a used pixel: exactextract's sum is 0, ours null (see zonal-statistics.md).
    close(got["sum"][used], want["sum"][used], 1e-9)
    assert np.isnan(got["sum"][~used]).all() and (want["sum"][~used] == 0).all()
    for s in ("mean", "min", "max", "stdev", "variance"):
        close(got[s], want[s].astype(np.float64), 1e-9)


def test_order_statistics_equal_exactextract():
    a = values(seed=3, discrete=True)
    geoms = zones(seed=4)
    stats = ["median", "quantile", "majority", "minority", "variety", "frac"]
    got = ops.zonal_stats(raster(a), geoms, stats=stats, quantile=0.9)
    want = exact(a, geoms, ["median", "quantile(q=0.9)", "majority", "minority", "variety",
                            "unique", "frac"])
    for s, w in (("median", "median"), ("quantile", "quantile_90"), ("majority", "majority"),
                 ("minority", "minority"), ("variety", "variety")):
        close(got[s], want[w].astype(np.float64), 1e-9)
    for row in range(got.rows):
        expected = {float(v): float(f) for v, f in zip(want["unique"][row], want["frac"][row])}
        mine = got["frac"][row]
        assert set(mine) == set(expected)
        for v, f in expected.items():
            assert mine[v] == pytest.approx(f, rel=1e-9)


def test_weighted_stats_equal_exactextract_and_tiles_do_not_change_results():
    a = values(seed=5)
    w = np.random.default_rng(6).uniform(0, 3, (H, W))
    geoms = zones(seed=7)
    stats = ["count", "sum", "mean", "min", "max", "stdev", "weighted_mean", "weighted_sum",
             "median", "majority", "cell_count"]
    whole = ops.zonal_stats(raster(a), geoms, stats=stats,
                            weights=OwnedRasterArray.from_numpy(w, affine=AFFINE))
    want = exact(a, geoms, ["weighted_mean", "weighted_sum"], weights=w)
    used = whole["count"] > 0
    close(whole["weighted_mean"], want["weighted_mean"], 1e-9)
    close(whole["weighted_sum"][used], want["weighted_sum"][used], 1e-9)
    one_thread = ops.zonal_stats(raster(a), geoms, stats=stats, threads=1,
                                 weights=OwnedRasterArray.from_numpy(w, affine=AFFINE))
    for s in stats:
        close(one_thread[s], whole[s], 0)
    for shape in ((1, 1), (7, 5), (60, 3), (2, 70)):
        tiled = ops.zonal_stats(raster(a), geoms, stats=stats, tile_shape=shape,
                                weights=OwnedRasterArray.from_numpy(w, affine=AFFINE))
        for s in stats:
            close(tiled[s], whole[s], 1e-12)


def write_zones(path, geoms) -> None:
    features = [{"type": "Feature", "properties": {"id": i, "name": f"z{i}"},
                 "geometry": mapping(g)} for i, g in enumerate(geoms)]
    path.write_text(json.dumps({"type": "FeatureCollection", "features": features}))


@pytest.mark.skipif(shutil.which("gdal_rasterize") is None, reason="gdal_rasterize not installed")
@pytest.mark.parametrize("rule", ["center", "all-touched"])
def test_center_and_all_touched_equal_gdal_rasterize(tmp_path, rule):
    a = values(seed=8)
    geoms = zones(seed=9, n=15)
    io.write_raster(tmp_path / "v.tif", raster(a))
    write_zones(tmp_path / "z.geojson", geoms)
    got = ops.zonal_stats(tmp_path / "v.tif", tmp_path / "z.geojson", zone_field="id",
                          pixels=rule, stats=["count", "sum", "mean", "min", "max", "stdev"])
    assert list(got["zone"]) == list(range(len(geoms)))
    valid = (a != NODATA) & ~np.isnan(a)
    for i in range(len(geoms)):
        mask_path = tmp_path / f"m{i}.tif"
        cmd = ["gdal_rasterize", "-q", "-burn", "1", "-init", "0", "-ot", "Byte", "-where",
               f"id={i}", "-te", str(XMIN), str(YMIN), str(XMAX), str(YMAX), "-ts", str(W),
               str(H)]
        if rule == "all-touched":
            cmd.append("-at")
        subprocess.run(cmd + [str(tmp_path / "z.geojson"), str(mask_path)], check=True)
        mask = io.read_raster(mask_path).to_numpy()[0].astype(bool) & valid
        v = a[mask].astype(np.float64)
        assert got["count"][i] == mask.sum(), i
        if mask.sum() == 0:
            assert np.isnan(got["mean"][i])
            continue
        assert got["sum"][i] == pytest.approx(v.sum(), rel=1e-12)
        assert got["mean"][i] == pytest.approx(v.mean(), rel=1e-12)
        assert got["min"][i] == v.min() and got["max"][i] == v.max()
        assert got["stdev"][i] == pytest.approx(v.std(), rel=1e-9, abs=1e-12)


def test_zone_raster_equals_numpy_by_hand(tmp_path):
    a = values(seed=10)
    z = np.random.default_rng(11).integers(0, 9, (H, W)).astype(np.int16)
    zr = OwnedRasterArray.from_numpy(z, nodata=0, affine=AFFINE)
    got = ops.zonal_stats(raster(a), zr, stats=["count", "sum", "mean", "min", "max", "stdev"],
                          tile_shape=(8, 9))
    valid = (a != NODATA) & ~np.isnan(a)
    assert list(got["zone"]) == list(range(1, 9))
    for row, zone in enumerate(got["zone"]):
        v = a[(z == zone) & valid].astype(np.float64)
        assert got["count"][row] == v.size
        assert got["sum"][row] == pytest.approx(v.sum(), rel=1e-12)
        assert got["stdev"][row] == pytest.approx(v.std(), rel=1e-9)
        assert got["min"][row] == v.min()
    io.write_raster(tmp_path / "v.tif", raster(a))
    io.write_raster(tmp_path / "z.tif", zr)
    from_files = ops.zonal_stats(tmp_path / "v.tif", tmp_path / "z.tif", stats="count,sum")
    close(from_files["sum"], got["sum"], 1e-12)


def test_paths_wkb_ids_and_pandas(tmp_path):
    a = values(seed=12)
    geoms = zones(seed=13, n=6)
    io.write_raster(tmp_path / "v.tif", raster(np.stack([a, np.where(a == NODATA, a, a * 2)])))
    write_zones(tmp_path / "z.geojson", geoms)
    by_path = ops.zonal_stats(tmp_path / "v.tif", tmp_path / "z.geojson", zone_field="name",
                              stats=["count", "mean"], bands=[2])
    assert list(by_path["zone"]) == [f"z{i}" for i in range(len(geoms))]
    assert (by_path["band"] == 2).all()
    wkb = [shapely.to_wkb(g) for g in geoms]
    by_wkb = ops.zonal_stats(str(tmp_path / "v.tif"), wkb, ids=[f"z{i}" for i in range(len(geoms))],
                             stats="count,mean", bands=[2])
    close(by_wkb["mean"], by_path["mean"], 1e-12)
    in_memory = ops.zonal_stats(raster(a), geoms, stats="count,mean")
    close(in_memory["mean"] * 2, by_path["mean"], 1e-6)
    seen = []
    ops.zonal_stats(raster(a), geoms, progress=lambda d, t: seen.append((d, t)), tile_shape=(20, 70))
    assert seen == [(1, 3), (2, 3), (3, 3)]
    pd = pytest.importorskip("pandas")
    df = by_path.to_pandas()
    assert isinstance(df, pd.DataFrame)
    assert list(df.columns) == ["zone", "band", "count", "mean"]


def test_bad_zones_and_options_are_refused(tmp_path):
    a = values()
    io.write_raster(tmp_path / "v.tif", raster(a))
    write_zones(tmp_path / "z.geojson", zones(n=3))
    with pytest.raises(ops.ZonalInputError, match="has no field 'nope'"):
        ops.zonal_stats(tmp_path / "v.tif", tmp_path / "z.geojson", zone_field="nope")
    with pytest.raises(ValueError, match="unknown statistic"):
        ops.zonal_stats(raster(a), zones(n=2), stats="count,bogus")
    with pytest.raises(ops.ZonalInputError, match="not a polygon"):
        ops.zonal_stats(raster(a), [Point(20, 60)])
    bowtie = Polygon([(20, 60), (25, 65), (25, 60), (20, 65)])
    with pytest.raises(ops.ZonalInputError, match="not a valid polygon"):
        ops.zonal_stats(raster(a), [bowtie])
    with pytest.raises(OSError):
        ops.zonal_stats(tmp_path / "v.tif", tmp_path / "missing.gpkg")
    zf = OwnedRasterArray.from_numpy(np.ones((H, W), np.float32), affine=AFFINE)
    with pytest.raises(ops.ZonalInputError, match="integer dtype"):
        ops.zonal_stats(raster(a), zf)
    with pytest.raises(ops.ZonalInputError, match="weights raster"):
        ops.zonal_stats(raster(a), zones(n=2), stats=["weighted_mean"])
    with pytest.raises(TypeError):
        ops.zonal_stats(raster(a), [object()])
