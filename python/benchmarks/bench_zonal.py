# SPDX-License-Identifier: Apache-2.0
"""Zonal statistics against exactextract, side by side in one run.


Makes a float32 raster of size x size (random field, nodata holes) and `zones` random star
polygons over it, then times count, sum, mean, min, max, stdev with fractional coverage:
exactextract's exact_extract (each of its strategies; the raster as a NumPyRasterSource, the
polygons as GeoJSON-like features, both already in memory) and ops.zonal_stats over the same
in-memory raster and WKB. Prints one line per run and the ratio to exactextract's fastest, and
checks that the counts and sums agree (1e-9 relative).
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np


def make(size: int, n: int, seed: int = 1):
    import shapely
    rng = np.random.default_rng(seed)
    a = rng.normal(100, 30, (size, size)).astype(np.float32)
    a.flat[::101] = -9999
    cx, cy = rng.uniform(0, size, n), rng.uniform(0, size, n)
    r = rng.uniform(2, max(3, size / math.sqrt(n) * 1.5), n)
    geoms = []
    for i in range(n):
        k = 6 + i % 10
        t = np.linspace(0, 2 * math.pi, k, endpoint=False)
        rad = r[i] * rng.uniform(0.4, 1, k)
        geoms.append(shapely.Polygon(np.c_[cx[i] + rad * np.cos(t), cy[i] + rad * np.sin(t)]))
    return a, geoms


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--size", type=int, default=8000)
    p.add_argument("--zones", type=int, default=100000)
    args = p.parse_args()
    import exactextract as ee
    from exactextract.feature import JSONFeatureSource
    from exactextract.raster import NumPyRasterSource
    import shapely
    from shapely.geometry import mapping

    from vibespatial_raster.buffers import OwnedRasterArray

    a, geoms = make(args.size, args.zones)
    stats = ["count", "sum", "mean", "min", "max", "stdev"]
    size = args.size
    src = NumPyRasterSource(a, 0, 0, size, size, nodata=-9999)
    feats = [{"type": "Feature", "id": i, "properties": {"id": i}, "geometry": mapping(g)}
             for i, g in enumerate(geoms)]
    results = {}
    for strategy in ("feature-sequential", "raster-sequential"):
        t0 = time.perf_counter()
        df = ee.exact_extract(src, JSONFeatureSource(feats), stats, strategy=strategy,
                              output="pandas")
        results[strategy] = (time.perf_counter() - t0, df)
        print(f"exactextract {strategy}: {results[strategy][0]:.2f} s")
    raster = OwnedRasterArray.from_numpy(a, nodata=-9999, affine=(1, 0, 0, 0, -1, size))
    wkb = [shapely.to_wkb(g) for g in geoms]
    from vibespatial_raster import _core, _zonal
    best = min(v[0] for v in results.values())
    for threads in (1, 0):
        t0 = time.perf_counter()
        ours = _core.zonal_stats_raster(raster._as_native(), wkb, None, None, None, None,
                                        "fractional", stats, 0.9, [], 0, None, None,
                                        threads=threads)
        elapsed = time.perf_counter() - t0
        label = "1 thread" if threads == 1 else "every CPU"
        print(f"vibespatial zonal_stats ({label}): {elapsed:.2f} s "
              f"({best / elapsed:.2f}x exactextract's fastest)")
    got = _zonal._columns(ours)
    want = results["feature-sequential"][1]
    np.testing.assert_allclose(got["count"], want["count"], rtol=1e-9)
    used = got["count"] > 0
    np.testing.assert_allclose(got["sum"][used], want["sum"][used], rtol=1e-9)
    print("counts and sums agree within 1e-9")


if __name__ == "__main__":
    main()
