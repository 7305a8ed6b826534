#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""`vsr-run --op warp` and a pipeline's warp step judged against GDAL 3.6's gdalwarp, on GeoTIFFs
made here with GDAL (UTM 33N -> EPSG:4326).

Cases (--case):
- near: `-r near` equal to `gdalwarp -et 0` (grid, geotransform, CRS, nodata and every pixel),
  on the default grid and with --tr, --te and --tr with --te, whole and in many tiles (--budget);
  uint16 and float32 inputs;
- bilinear: `-r bilinear` within 1e-6 (relative) of `gdalwarp -et 0 -r bilinear`, the same nodata
  pixels, on the same grids;
- dry_run: --dry-run prints the output grid (gdalwarp's size) and each warp tile's input window,
  and writes nothing;
- errors: a bad SRS, bad command lines (no --t_srs, --tr with a zero, a bad number, --tr with
  --ts) exit 2; no CRS and no overlap exit 1; none leaves an output;
- pipeline: `read ! warp ! calc ! write` equal to --op warp then --op calc on its output, whole
  and tiled (`--et 0`: with a threshold the approximation follows each tile's rows); warp
  elsewhere in a pipeline exits 2 (errors).

Exits 0 (pass), 1 (fail) or 77 (skip: no gdalwarp, or no Python with numpy and osgeo).
Usage: warp_cli_judge.py --case CASE --build-root BUILD
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

SKIP = 77
GDALWARP = shutil.which("gdalwarp") or "/usr/bin/gdalwarp"
if not os.path.exists(GDALWARP):
    print("SKIP: gdalwarp not found (Debian: apt-get install gdal-bin)")
    sys.exit(SKIP)
try:
    import numpy as np
    from osgeo import gdal, osr
except ImportError:
    if not os.environ.get("VSR_WARP_CLI_AGAIN") and os.path.exists("/usr/bin/python3") and \
            os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3"):
        os.environ["VSR_WARP_CLI_AGAIN"] = "1"
        os.execv("/usr/bin/python3", ["/usr/bin/python3", os.path.abspath(__file__)] + sys.argv[1:])
    print("SKIP: no Python with numpy and osgeo (Debian: apt-get install python3-gdal)")
    sys.exit(SKIP)

gdal.UseExceptions()
FAILURES = []
CHECKS = [0]

# (-tr, -te) of the grids judged: the default, a pixel size, an extent, both.
GRIDS = [
    ([], "default"),
    (["--tr", "0.0001", "0.00008"], "tr"),
    (["--te", "13.73", "45.12", "13.77", "45.145"], "te"),
    (["--tr", "0.0001", "0.0001", "--te", "13.735", "45.125", "13.765", "45.14"], "tr+te"),
]


def check(ok, what):
    CHECKS[0] += 1
    if not ok:
        FAILURES.append(what)


def make_input(path, dtype, width=300, height=260, nodata=None, crs=True):
    gtype = {"uint16": gdal.GDT_UInt16, "float32": gdal.GDT_Float32}[dtype]
    ds = gdal.GetDriverByName("GTiff").Create(path, width, height, 2, gtype)
    ds.SetGeoTransform((400000, 10, 0, 5000000, 0, -10))
    if crs:
        s = osr.SpatialReference()
        s.ImportFromEPSG(32633)
        ds.SetProjection(s.ExportToWkt())
    rng = np.random.default_rng(7)
    for b in (1, 2):
        if dtype == "uint16":
            a = rng.integers(1, 60000, size=(height, width)).astype(np.uint16)
        else:
            yy, xx = np.mgrid[0:height, 0:width]
            a = (np.sin(xx / 17.0 + b) * 100 + yy * 0.5 + rng.random((height, width))).astype(
                np.float32)
        if nodata is not None:
            a[20:40, 30:70] = nodata
        ds.GetRasterBand(b).WriteArray(a)
        if nodata is not None:
            ds.GetRasterBand(b).SetNoDataValue(nodata)
    ds = None


def gdal_te_tr(extra):
    """Our --tr/--te words as gdalwarp's."""
    return [w.replace("--", "-", 1) if w.startswith("--") else w for w in extra]


class Runner:
    def __init__(self, build_root, tmp):
        self.vsr_run = os.path.join(build_root, "tools", "vsr-run", "vsr-run")
        self.tmp = tmp

    def path(self, name):
        return os.path.join(self.tmp, name)

    def ours(self, args):
        return subprocess.run([self.vsr_run] + args, capture_output=True, text=True)

    def gdalwarp(self, src, dst, extra):
        if os.path.exists(dst):
            os.remove(dst)
        subprocess.run([GDALWARP, "-q", "-et", "0", "-t_srs", "EPSG:4326", "-overwrite"] + extra +
                       [src, dst], check=True, capture_output=True)


def read(path):
    ds = gdal.Open(path)
    bands = [ds.GetRasterBand(k + 1) for k in range(ds.RasterCount)]
    return {
        "size": (ds.RasterXSize, ds.RasterYSize),
        "gt": ds.GetGeoTransform(),
        "srs": osr.SpatialReference(wkt=ds.GetProjection()),
        "nodata": [b.GetNoDataValue() for b in bands],
        "data": ds.ReadAsArray(),
        "dtype": bands[0].DataType,
    }


def compare(label, got_path, want_path, exact):
    got, want = read(got_path), read(want_path)
    check(got["size"] == want["size"], f"{label}: size {got['size']} vs gdalwarp {want['size']}")
    check(np.allclose(got["gt"], want["gt"], rtol=1e-12, atol=0),
          f"{label}: geotransform {got['gt']} vs gdalwarp {want['gt']}")
    check(got["srs"].IsSame(want["srs"]) == 1, f"{label}: the CRS differs from gdalwarp's")
    check(got["nodata"] == want["nodata"], f"{label}: nodata {got['nodata']} vs {want['nodata']}")
    check(got["dtype"] == want["dtype"], f"{label}: dtype differs")
    if got["size"] != want["size"]:
        return
    a, b = got["data"].astype(np.float64), want["data"].astype(np.float64)
    nd = want["nodata"][0]
    if nd is not None:
        check(np.array_equal(a == nd, b == nd), f"{label}: nodata pixels differ "
              f"({int(np.sum((a == nd) != (b == nd)))} pixels)")
    if exact:
        check(np.array_equal(a, b, equal_nan=True),
              f"{label}: {int(np.sum(a != b))} pixels differ from gdalwarp -et 0")
    else:
        valid = (b != nd) if nd is not None else np.ones_like(b, dtype=bool)
        err = np.abs(a[valid] - b[valid]) / np.maximum(1.0, np.abs(b[valid]))
        worst = float(err.max()) if err.size else 0.0
        check(worst <= 1e-6, f"{label}: relative difference {worst:.3g} > 1e-6")


def judge_method(r, method, exact):
    for dtype, nodata in (("uint16", 0), ("float32", -9999.0)):
        if method == "bilinear" and dtype == "uint16":
            continue  # gdalwarp rounds integer outputs; judged in the library's own tests
        src = r.path(f"in-{dtype}.tif")
        make_input(src, dtype, nodata=nodata)
        for extra, name in GRIDS:
            want = r.path(f"want-{dtype}-{name}-{method}.tif")
            r.gdalwarp(src, want, ["-r", method] + gdal_te_tr(extra))
            for budget in ([], ["--budget", "300K"]):
                got = r.path(f"got-{dtype}-{name}-{method}-{len(budget)}.tif")
                p = r.ours(["--op", "warp", "-i", src, "-o", got, "--t_srs", "EPSG:4326",
                            "--et", "0", "-r", method, "-q", "--overwrite"] + extra + budget)
                label = f"{method} {dtype} {name}{' tiled' if budget else ''}"
                check(p.returncode == 0, f"{label}: exit {p.returncode}: {p.stderr.strip()}")
                if p.returncode == 0:
                    compare(label, got, want, exact)


def case_near(r):
    judge_method(r, "near", True)


def case_bilinear(r):
    judge_method(r, "bilinear", False)


def case_dry_run(r):
    src = r.path("in.tif")
    make_input(src, "float32", nodata=-9999.0)
    for extra, name in GRIDS:
        want = r.path(f"want-{name}.tif")
        r.gdalwarp(src, want, gdal_te_tr(extra))
        w = read(want)
        out = r.path(f"dry-{name}.tif")
        p = r.ours(["--op", "warp", "-i", src, "-o", out, "--t_srs", "EPSG:4326", "--dry-run"] +
                   extra)
        check(p.returncode == 0, f"dry-run {name}: exit {p.returncode}: {p.stderr.strip()}")
        check(f"grid        {w['size'][0]} x {w['size'][1]} pixels" in p.stdout,
              f"dry-run {name}: no grid line of {w['size']} in:\n{p.stdout}")
        check("warp tiles" in p.stdout and "<- x " in p.stdout,
              f"dry-run {name}: no tile with its input window in:\n{p.stdout}")
        check(not os.path.exists(out), f"dry-run {name}: wrote {out}")
    # The pipeline's dry run prints the warp's grid too.
    out = r.path("dry-pipe.tif")
    p = r.ours(["pipeline", "read", src, "!", "warp", "--t_srs", "EPSG:4326", "!", "write", out,
                "--dry-run"])
    check(p.returncode == 0 and "read ! warp ! write" in p.stdout and "grid " in p.stdout,
          f"pipeline dry-run: exit {p.returncode}:\n{p.stdout}{p.stderr}")
    check(not os.path.exists(out), "pipeline dry-run wrote its output")


def case_errors(r):
    src = r.path("in.tif")
    make_input(src, "float32", nodata=-9999.0)
    nocrs = r.path("nocrs.tif")
    make_input(nocrs, "float32", crs=False)
    out = r.path("out.tif")
    base = ["--op", "warp", "-i", src, "-o", out]
    cases = [
        (base + ["--t_srs", "EPSG:999999"], 2, "not a CRS"),
        (base + ["--t_srs", "nonsense"], 2, "not a CRS"),
        (base, 2, "needs --t_srs"),
        (base + ["--t_srs", "EPSG:4326", "--tr", "0", "1"], 2, "> 0"),
        (base + ["--t_srs", "EPSG:4326", "--tr", "1"], 2, "needs 2 values"),
        (base + ["--t_srs", "EPSG:4326", "--tr", "x", "1"], 2, "not a number"),
        (base + ["--t_srs", "EPSG:4326", "--te", "1", "1", "0", "2"], 2, "XMIN"),
        (base + ["--t_srs", "EPSG:4326", "--tr", "1", "1", "--ts", "5", "5"], 2, "exclusive"),
        (base + ["--t_srs", "EPSG:4326", "-r", "sideways"], 2, "unknown resampling"),
        (base + ["--t_srs", "EPSG:4326", "--range", "0,1"], 2, "does not apply"),
        (["--op", "warp", "-i", nocrs, "-o", out, "--t_srs", "EPSG:4326"], 1, "CRS"),
        (base + ["--t_srs", "EPSG:4326", "--te", "100", "10", "101", "11"], 1, "intersect"),
        (["pipeline", "read", src, "!", "calc", "--calc", "X[1]", "!", "warp", "--t_srs",
          "EPSG:4326", "!", "write", out], 2, "directly after read"),
        (["pipeline", "read", src, "!", "warp", "!", "write", out], 2, "needs --t_srs"),
    ]
    for args, code, words in cases:
        p = r.ours(args)
        label = " ".join(args[1:2] + args[5:] if args[0] == "--op" else args[:1] + args[3:])
        check(p.returncode == code,
              f"{label}: exit {p.returncode}, want {code}: {p.stderr.strip()}")
        check(words in p.stderr, f"{label}: '{words}' not in: {p.stderr.strip()}")
        check(not os.path.exists(out), f"{label}: left {out}")
        leftovers = [f for f in os.listdir(r.tmp) if f.startswith("out.tif")]
        check(not leftovers, f"{label}: left {leftovers}")


def case_pipeline(r):
    src = r.path("in.tif")
    make_input(src, "float32", nodata=-9999.0)
    for method in ("near", "bilinear"):
        for budget in ([], ["--budget", "300K"]):
            label = f"pipeline {method}{' tiled' if budget else ''}"
            mid, two, one = r.path("mid.tif"), r.path("two.tif"), r.path("one.tif")
            warp = ["--t_srs", "EPSG:4326", "-r", method, "--tr", "0.0001", "0.0001", "--et", "0"]
            p1 = r.ours(["--op", "warp", "-i", src, "-o", mid, "-q", "--overwrite"] + warp)
            p2 = r.ours(["--op", "calc", "-i", mid, "--calc", "A[1] * 2 - A[2]", "-o", two, "-q",
                         "--overwrite"])
            p3 = r.ours(["pipeline", "read", src, "!", "warp"] + warp +
                        ["!", "calc", "--calc", "X[1] * 2 - X[2]", "!", "write", one, "-q",
                         "--overwrite"] + budget)
            for name, p in (("--op warp", p1), ("--op calc", p2), ("pipeline", p3)):
                check(p.returncode == 0, f"{label}: {name}: exit {p.returncode}: "
                      f"{p.stderr.strip()}")
            if p1.returncode or p2.returncode or p3.returncode:
                continue
            a, b = read(one), read(two)
            check(a["size"] == b["size"] and a["gt"] == b["gt"] and a["nodata"] == b["nodata"],
                  f"{label}: grid or nodata differ: {a['size']} {a['gt']} {a['nodata']} vs "
                  f"{b['size']} {b['gt']} {b['nodata']}")
            check(a["srs"].IsSame(b["srs"]) == 1, f"{label}: the CRS differs")
            if a["size"] == b["size"]:
                check(np.array_equal(a["data"], b["data"], equal_nan=True),
                      f"{label}: {int(np.sum(a['data'] != b['data']))} pixels differ")


CASES = {"near": case_near, "bilinear": case_bilinear, "dry_run": case_dry_run,
         "errors": case_errors, "pipeline": case_pipeline}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", required=True, choices=sorted(CASES))
    ap.add_argument("--build-root", required=True)
    args = ap.parse_args()
    exe = os.path.join(args.build_root, "tools", "vsr-run", "vsr-run")
    if not os.access(exe, os.X_OK):
        print(f"SKIP: {exe} is not built")
        return SKIP
    with tempfile.TemporaryDirectory(prefix="vsr-warp-cli-") as tmp:
        CASES[args.case](Runner(os.path.abspath(args.build_root), tmp))
    print(f"{args.case}: {CHECKS[0]} checks, {len(FAILURES)} failures")
    for f in FAILURES[:40]:
        print("  FAIL " + f)
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
