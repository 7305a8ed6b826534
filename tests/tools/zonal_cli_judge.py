#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""`vsr-run --op zonal-stats` against an independent NumPy computation on a small case.

A 12 x 10 float32 raster (two bands, nodata -9999 and a NaN pixel) and a GeoPackage of three
square zones on pixel edges (so that every pixel is wholly in or out and the fractional, centre
and all-touched rules agree: the test computes each zone's masks with NumPy), one with a hole,
one partly outside the raster. Checks:
- --json: one object per zone and band, count, sum, mean, min, max equal to NumPy's (1e-12
  relative), for --pixels fractional and center, whole and in tiles (--budget);
- -o out.csv and -o out.json: the same table written (the JSON file equal to --json's output);
- --dry-run: the plan printed, nothing written;
- bad command lines (no --zones, an unknown statistic, an unknown --pixels, -o out.txt,
  weighted statistics without --weights) exit 2; a missing zones file and a missing zone field
  exit 1; none leaves an output.

Exits 0 (pass), 1 (fail) or 77 (skip: no Python with numpy and osgeo).
Usage: zonal_cli_judge.py --build-root BUILD
"""

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile

SKIP = 77
try:
    import numpy as np
    from osgeo import gdal, ogr, osr
except ImportError:
    if not os.environ.get("VSR_ZONAL_CLI_AGAIN") and os.path.exists("/usr/bin/python3") and \
            os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3"):
        os.environ["VSR_ZONAL_CLI_AGAIN"] = "1"
        os.execv("/usr/bin/python3", ["/usr/bin/python3", os.path.abspath(__file__)] + sys.argv[1:])
    print("SKIP: no Python with numpy and osgeo (Debian: apt-get install python3-gdal)")
    sys.exit(SKIP)

gdal.UseExceptions()
FAILURES = []
CHECKS = [0]
W, H = 12, 10
X0, Y0, PX = 500000.0, 4000000.0, 10.0
# Zones in pixel coordinates (col0, row0, col1, row1), holes the same way; ids 7, 3, 11.
ZONES = [
    (7, (1, 1, 6, 5), [(2, 2, 4, 3)]),
    (3, (5, 4, 12, 10), []),
    (11, (9, -3, 15, 3), []),  # partly outside the raster
]


def check(ok, what):
    CHECKS[0] += 1
    if not ok:
        FAILURES.append(what)


def ring(c0, r0, c1, r1):
    g = ogr.Geometry(ogr.wkbLinearRing)
    for c, r in ((c0, r0), (c1, r0), (c1, r1), (c0, r1), (c0, r0)):
        g.AddPoint_2D(X0 + c * PX, Y0 - r * PX)
    return g


def make_inputs(tmp):
    srs = osr.SpatialReference()
    srs.ImportFromEPSG(32633)
    raster = os.path.join(tmp, "values.tif")
    ds = gdal.GetDriverByName("GTiff").Create(raster, W, H, 2, gdal.GDT_Float32)
    ds.SetGeoTransform((X0, PX, 0, Y0, 0, -PX))
    ds.SetProjection(srs.ExportToWkt())
    rng = np.random.default_rng(3)
    data = (rng.random((2, H, W)) * 100).astype(np.float32)
    data[0, 1, 1] = -9999
    data[1, 4, 6] = -9999
    data[0, 6, 8] = np.nan
    for b in range(2):
        ds.GetRasterBand(b + 1).WriteArray(data[b])
        ds.GetRasterBand(b + 1).SetNoDataValue(-9999)
    ds = None
    zones = os.path.join(tmp, "zones.gpkg")
    vds = ogr.GetDriverByName("GPKG").CreateDataSource(zones)
    layer = vds.CreateLayer("parcels", srs, ogr.wkbPolygon)
    layer.CreateField(ogr.FieldDefn("id", ogr.OFTInteger))
    for zid, outer, holes in ZONES:
        poly = ogr.Geometry(ogr.wkbPolygon)
        poly.AddGeometry(ring(*outer))
        for h in holes:
            poly.AddGeometry(ring(*h))
        f = ogr.Feature(layer.GetLayerDefn())
        f.SetField("id", zid)
        f.SetGeometry(poly)
        layer.CreateFeature(f)
    vds = None
    return raster, zones, data


def expected(data):
    rows = []
    for zid, (c0, r0, c1, r1), holes in ZONES:
        mask = np.zeros((H, W), dtype=bool)
        mask[max(r0, 0):min(r1, H), max(c0, 0):min(c1, W)] = True
        for (hc0, hr0, hc1, hr1) in holes:
            mask[hr0:hr1, hc0:hc1] = False
        for b in range(2):
            v = data[b][mask].astype(np.float64)
            v = v[(v != -9999) & ~np.isnan(v)]
            rows.append({"zone": zid, "band": b + 1, "count": float(v.size), "sum": float(v.sum()),
                         "mean": float(v.mean()), "min": float(v.min()), "max": float(v.max())})
    return rows


def close(a, b):
    return a is not None and abs(a - b) <= 1e-12 * max(1.0, abs(b))


def compare(label, got, want):
    check(len(got) == len(want), f"{label}: {len(got)} rows, want {len(want)}")
    for g, w in zip(got, want):
        check(g.get("zone") == w["zone"] and g.get("band") == w["band"],
              f"{label}: row {g.get('zone')}/{g.get('band')}, want {w['zone']}/{w['band']}")
        for s in ("count", "sum", "mean", "min", "max"):
            v = g.get(s)
            check(close(None if v is None else float(v), w[s]),
                  f"{label}: zone {w['zone']} band {w['band']} {s} {v}, want {w[s]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-root", required=True)
    args = ap.parse_args()
    exe = os.path.join(args.build_root, "tools", "vsr-run", "vsr-run")
    if not os.access(exe, os.X_OK):
        print(f"SKIP: {exe} is not built")
        return SKIP

    def run(a):
        return subprocess.run([exe] + a, capture_output=True, text=True)

    with tempfile.TemporaryDirectory(prefix="vsr-zonal-cli-") as tmp:
        raster, zones, data = make_inputs(tmp)
        want = expected(data)
        base = ["--op", "zonal-stats", "-i", raster, "--zones", zones, "--zone-field", "id"]
        for extra in ([], ["--pixels", "center"], ["--pixels", "all-touched"],
                      ["--budget", "1K"]):
            p = run(base + ["--json", "-q"] + extra)
            label = "--json " + " ".join(extra)
            check(p.returncode == 0, f"{label}: exit {p.returncode}: {p.stderr.strip()}")
            if p.returncode == 0:
                compare(label, json.loads(p.stdout), want)
        out_json = os.path.join(tmp, "t.json")
        out_csv = os.path.join(tmp, "t.csv")
        p1 = run(base + ["-o", out_json, "-q"])
        p2 = run(base + ["-o", out_csv])
        check(p1.returncode == 0 and p2.returncode == 0,
              f"-o: exit {p1.returncode} {p2.returncode}: {p1.stderr}{p2.stderr}")
        if p1.returncode == 0:
            with open(out_json) as f:
                compare("-o t.json", json.load(f), want)
        if p2.returncode == 0:
            check("zonal-stats" in p2.stdout and "t.csv" in p2.stdout, f"summary: {p2.stdout}")
            with open(out_csv) as f:
                rows = list(csv.DictReader(f))
            compare("-o t.csv", [{k: (int(v) if k in ("zone", "band") else float(v))
                                  for k, v in r.items()} for r in rows], want)
        dry = os.path.join(tmp, "dry.json")
        p = run(base + ["-o", dry, "--dry-run"])
        check(p.returncode == 0 and "zones " in p.stdout and "stats " in p.stdout,
              f"--dry-run: exit {p.returncode}: {p.stdout}{p.stderr}")
        check(not os.path.exists(dry), "--dry-run wrote its output")
        out = os.path.join(tmp, "bad.json")
        bad = [
            (["--op", "zonal-stats", "-i", raster, "-o", out], 2, "--zones"),
            (base + ["-o", out, "--stats", "count,nosuch"], 2, "nosuch"),
            (base + ["-o", out, "--pixels", "some"], 2, "--pixels"),
            (base + ["-o", os.path.join(tmp, "bad.txt")], 2, ".csv"),
            (base + ["-o", out, "--stats", "weighted_mean"], 2, "--weights"),
            (base + ["-o", out, "--edge", "reflect"], 2, "does not apply"),
            (["--op", "zonal-stats", "-i", raster, "--zones", os.path.join(tmp, "no.gpkg"),
              "-o", out], 1, "no.gpkg"),
            (["--op", "zonal-stats", "-i", raster, "--zones", zones, "--zone-field", "nope",
              "-o", out], 1, "nope"),
            (["pipeline", "read", raster, "!", "zonal-stats", "--zones", zones, "!", "write",
              os.path.join(tmp, "p.tif")], 2, "table"),
        ]
        for a, code, words in bad:
            p = run(a)
            label = " ".join(x for x in a if not x.startswith(tmp))
            check(p.returncode == code, f"{label}: exit {p.returncode}, want {code}: {p.stderr}")
            check(words in p.stderr, f"{label}: '{words}' not in {p.stderr.strip()}")
            leftovers = [f for f in os.listdir(tmp) if f.startswith(("bad.", "p.tif"))]
            check(not leftovers, f"{label}: left {leftovers}")
    print(f"zonal-stats: {CHECKS[0]} checks, {len(FAILURES)} failures")
    for f in FAILURES[:40]:
        print("  FAIL " + f)
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
