#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The library's warp judged against GDAL 3.6's own gdalwarp on GeoTIFFs made here with GDAL.

Cases (--case):
- near: every dtype, five reprojections (UTM -> EPSG:4326, EPSG:4326 -> 3857, -> Lambert-93 (LCC),
  -> CONUS Albers (EPSG:5070), -> British National Grid (EPSG:27700)), `gdalwarp -et 0`: the
  same grid and identical pixels, nodata included;
- interp: bilinear, cubic, cubicspline, lanczos on float32/float64/uint16/int16 with nodata pixels,
  `-et 0` and the default threshold: within 1e-6 relative (integers: equal) and the same nodata
  pixels;
- footprint: average, rms, mode, max, min, med, q1, q3 on float32/uint16/int16 with nodata, on
  the default grid and downsampled about 3x, `-et 0`: average and rms within 1e-6 relative, the
  others identical, with the same nodata pixels;
- grid: -tr, -ts, -te and their pairs give gdalwarp's size and geotransform;
- errors: bad SRS, no CRS, no overlap, absurd sizes: a typed error and no output left behind.

Exits 0 (pass), 1 (fail) or 77 (skip: no gdalwarp, or no Python with numpy and osgeo).
Usage: warp_judge.py --case CASE --tool PATH-TO-warp-tool
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
    from osgeo import gdal
except ImportError:
    if not os.environ.get("VSR_WARP_JUDGE_AGAIN") and os.path.exists("/usr/bin/python3") and \
            os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3"):
        os.environ["VSR_WARP_JUDGE_AGAIN"] = "1"
        os.execv("/usr/bin/python3", ["/usr/bin/python3", os.path.abspath(__file__)] + sys.argv[1:])
    print("SKIP: no Python with numpy and osgeo (Debian: apt-get install python3-gdal)")
    sys.exit(SKIP)

gdal.UseExceptions()
FAILURES = []
CHECKS = [0]

DTYPES = {
    "uint8": gdal.GDT_Byte, "uint16": gdal.GDT_UInt16, "int16": gdal.GDT_Int16,
    "uint32": gdal.GDT_UInt32, "int32": gdal.GDT_Int32, "float32": gdal.GDT_Float32,
    "float64": gdal.GDT_Float64,
}
if hasattr(gdal, "GDT_Int64"):
    DTYPES["int64"] = gdal.GDT_Int64
    DTYPES["uint64"] = gdal.GDT_UInt64

# (name, source CRS, geotransform, size (w, h), target CRS)
JOBS = [
    ("utm-4326", "EPSG:32633", (400000, 30, 0, 5000000, 0, -30), (120, 100), "EPSG:4326"),
    ("4326-3857", "EPSG:4326", (10, 0.1, 0, 50, 0, -0.1), (120, 100), "EPSG:3857"),
    ("lcc", "EPSG:4326", (0, 0.05, 0, 49, 0, -0.05), (110, 90), "EPSG:2154"),
    ("albers", "EPSG:4326", (-100, 0.1, 0, 45, 0, -0.1), (120, 100), "EPSG:5070"),
    ("bng", "EPSG:4326", (-4, 0.02, 0, 55, 0, -0.02), (100, 110), "EPSG:27700"),
]


def check(cond, what):
    CHECKS[0] += 1
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what)


def make(path, dtype, crs, gt, size, bands=1, nodata=None, seed=1, smooth=False):
    w, h = size
    ds = gdal.GetDriverByName("GTiff").Create(path, w, h, bands, DTYPES[dtype])
    ds.SetGeoTransform(gt)
    if crs:
        ds.SetProjection(crs_wkt(crs))
    rng = np.random.default_rng(seed)
    for b in range(bands):
        if smooth:
            yy, xx = np.mgrid[0:h, 0:w]
            a = 50 + 40 * np.sin(xx / 7.0 + b) * np.cos(yy / 5.0) + rng.uniform(0, 5, (h, w))
        else:
            a = rng.uniform(0, 100, (h, w))
        if dtype.startswith("int"):
            a = a - 50
        a = a.astype(gdal_array_type(dtype))
        if nodata is not None:
            a[rng.uniform(0, 1, (h, w)) < 0.05] = nodata
            ds.GetRasterBand(b + 1).SetNoDataValue(nodata)
        ds.GetRasterBand(b + 1).WriteArray(a)
    ds = None


def crs_wkt(crs):
    from osgeo import osr
    s = osr.SpatialReference()
    s.SetFromUserInput(crs)
    return s.ExportToWkt()


def gdal_array_type(dtype):
    return np.dtype(dtype)


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


def warp_both(tmp, src, tag, opts_gdal, opts_ours):
    g = os.path.join(tmp, tag + "-gdal.tif")
    o = os.path.join(tmp, tag + "-ours.tif")
    r = run([GDALWARP, "-q", "-overwrite"] + opts_gdal + [src, g])
    if r.returncode != 0:
        check(False, f"{tag}: gdalwarp failed: {r.stderr.strip()}")
        return None, None
    r = run([TOOL, src, o] + opts_ours)
    if r.returncode != 0:
        check(False, f"{tag}: warp-tool failed: {r.stderr.strip()}")
        return None, None
    return gdal.Open(g), gdal.Open(o)


def same_grid(tag, a, b):
    check((a.RasterXSize, a.RasterYSize) == (b.RasterXSize, b.RasterYSize),
          f"{tag}: size {b.RasterXSize}x{b.RasterYSize}, gdalwarp {a.RasterXSize}x{a.RasterYSize}")
    ga, gb = a.GetGeoTransform(), b.GetGeoTransform()
    check(all(abs(x - y) <= 1e-9 * max(1.0, abs(x)) for x, y in zip(ga, gb)),
          f"{tag}: geotransform {gb}, gdalwarp {ga}")
    return (a.RasterXSize, a.RasterYSize) == (b.RasterXSize, b.RasterYSize)


def compare(tag, a, b, rel=0.0, nodata_slack=0):
    if not same_grid(tag, a, b):
        return
    for i in range(1, a.RasterCount + 1):
        ba, bb = a.GetRasterBand(i), b.GetRasterBand(i)
        na, nb = ba.GetNoDataValue(), bb.GetNoDataValue()
        check(na == nb or (na is not None and nb is not None and np.isnan(na) and np.isnan(nb)),
              f"{tag}: band {i} nodata {nb}, gdalwarp {na}")
        x, y = ba.ReadAsArray(), bb.ReadAsArray()
        if x.dtype != y.dtype:
            y = y.view(x.dtype) if x.itemsize == y.itemsize else y
        if na is not None:
            ma = (x == na) | (np.isnan(x) if x.dtype.kind == "f" else False)
            mb = (y == na) | (np.isnan(y) if y.dtype.kind == "f" else False)
            nm = int(np.count_nonzero(ma != mb))
            check(nm <= nodata_slack,
                  f"{tag}: band {i}: {nm} pixels nodata in one and not the other")
            keep = ~(ma | mb)
        else:
            keep = np.ones(x.shape, bool)
        xv, yv = x[keep].astype(np.float64), y[keep].astype(np.float64)
        if rel == 0.0:
            bad = int(np.count_nonzero((xv != yv) & ~(np.isnan(xv) & np.isnan(yv))))
            check(bad == 0, f"{tag}: band {i}: {bad} of {xv.size} pixels differ")
        else:
            tol = rel * np.maximum(np.abs(xv), 1.0)
            if x.dtype.kind in "iu":
                tol = np.maximum(tol, 1.0 if rel > 0 else 0.0)  # a rounding step at .5
            bad = np.abs(xv - yv) > tol
            worst = float(np.max(np.abs(xv - yv))) if xv.size else 0.0
            check(int(np.count_nonzero(bad)) == 0,
                  f"{tag}: band {i}: {int(np.count_nonzero(bad))} of {xv.size} pixels beyond "
                  f"{rel} relative (largest difference {worst})")


def case_near(tmp):
    for name, scrs, gt, size, tcrs in JOBS:
        for dt in DTYPES:
            src = os.path.join(tmp, f"{name}-{dt}.tif")
            nod = 7 if dt != "float64" else -9999.0
            make(src, dt, scrs, gt, size, bands=2 if dt == "uint16" else 1, nodata=nod)
            a, b = warp_both(tmp, src, f"near-{name}-{dt}", ["-t_srs", tcrs, "-et", "0", "-r", "near"],
                             ["--t_srs", tcrs, "--et", "0", "-r", "near"])
            if a is not None:
                compare(f"near {name} {dt}", a, b)
            if dt in ("uint8", "float32"):
                a, b = warp_both(tmp, src, f"near-array-{name}-{dt}",
                                 ["-t_srs", tcrs, "-et", "0", "-r", "near"],
                                 ["--t_srs", tcrs, "--et", "0", "-r", "near", "--array"])
                if a is not None:
                    compare(f"near {name} {dt} (warp of an OwnedRasterArray)", a, b)


def case_interp(tmp):
    for name, scrs, gt, size, tcrs in JOBS[:3]:
        for dt in ["float32", "float64", "uint16", "int16"]:
            nod = -9999.0 if dt.startswith("float") else 7
            src = os.path.join(tmp, f"i-{name}-{dt}.tif")
            make(src, dt, scrs, gt, size, nodata=nod, smooth=True)
            for m in ["bilinear", "cubic", "cubicspline", "lanczos"]:
                for et in ["0", None]:
                    eo = ["-et", et] if et else []
                    ours = ["--et", et] if et else []
                    tag = f"{m} {name} {dt} et={et or 'default'}"
                    a, b = warp_both(tmp, src, tag.replace(" ", "-").replace("=", ""),
                                     ["-t_srs", tcrs, "-r", m] + eo, ["--t_srs", tcrs, "-r", m] + ours)
                    if a is not None:
                        # With the approximation, a few pixels at the footprint's edge may land
                        # on either side of the source's border (docs/warp.md).
                        slack = 0 if et else max(2, a.RasterXSize * a.RasterYSize // 1000)
                        compare(tag, a, b, rel=1e-6, nodata_slack=slack)
    # several bands with -srcnodata (one validity for all bands) and -dstnodata
    src = os.path.join(tmp, "multi.tif")
    make(src, "float32", "EPSG:32633", JOBS[0][2], JOBS[0][3], bands=3, nodata=-9999.0, smooth=True)
    for m in ["near", "bilinear", "cubic"]:
        a, b = warp_both(tmp, src, f"multi-{m}",
                         ["-t_srs", "EPSG:4326", "-r", m, "-et", "0", "-srcnodata", "-9999",
                          "-dstnodata", "-1"],
                         ["--t_srs", "EPSG:4326", "-r", m, "--et", "0", "--srcnodata", "-9999",
                          "--dstnodata", "-1"])
        if a is not None:
            compare(f"multi {m} -srcnodata -dstnodata", a, b, rel=1e-6)


def case_footprint(tmp):
    for name, scrs, gt, size, tcrs in JOBS[:3]:
        for dt in ["float32", "uint16", "int16"]:
            nod = -9999.0 if dt.startswith("float") else 7
            src = os.path.join(tmp, f"f-{name}-{dt}.tif")
            make(src, dt, scrs, gt, size, nodata=nod, smooth=dt != "uint16")
            for m in ["average", "rms", "mode", "max", "min", "med", "q1", "q3"]:
                for down in ["", "-ts 40 0"]:
                    extra = down.split()
                    tag = f"{m} {name} {dt}{' ' + down if down else ''}"
                    a, b = warp_both(tmp, src, tag.replace(" ", "-"),
                                     ["-t_srs", tcrs, "-r", m, "-et", "0"] + extra,
                                     ["--t_srs", tcrs, "-r", m, "--et", "0"] +
                                     [x.replace("-ts", "--ts") for x in extra])
                    if a is not None:
                        compare(tag, a, b, rel=1e-6 if m in ("average", "rms") else 0.0)


def case_grid(tmp):
    src = os.path.join(tmp, "g.tif")
    make(src, "float32", "EPSG:32633", JOBS[0][2], JOBS[0][3])
    variants = [
        ([], []),
        (["-tr", "0.0005", "0.0004"], ["--tr", "0.0005", "0.0004"]),
        (["-ts", "80", "60"], ["--ts", "80", "60"]),
        (["-ts", "80", "0"], ["--ts", "80", "0"]),
        (["-ts", "0", "50"], ["--ts", "0", "50"]),
        (["-te", "13.73", "45.125", "13.77", "45.145"], ["--te", "13.73", "45.125", "13.77", "45.145"]),
        (["-te", "13.72", "45.11", "13.8", "45.16"], ["--te", "13.72", "45.11", "13.8", "45.16"]),
        (["-te", "13.73", "45.125", "13.77", "45.145", "-tr", "0.001", "0.001"],
         ["--te", "13.73", "45.125", "13.77", "45.145", "--tr", "0.001", "0.001"]),
        (["-te", "13.73", "45.125", "13.77", "45.145", "-ts", "40", "30"],
         ["--te", "13.73", "45.125", "13.77", "45.145", "--ts", "40", "30"]),
    ]
    for i, (g, o) in enumerate(variants):
        a, b = warp_both(tmp, src, f"grid{i}", ["-t_srs", "EPSG:4326", "-et", "0"] + g,
                         ["--t_srs", "EPSG:4326", "--et", "0"] + o)
        if a is not None:
            compare(f"grid {' '.join(g) or 'default'}", a, b)
    # a transform that fails for part of the grid (the far side of an orthographic view): those
    # pixels are left nodata, as gdalwarp leaves them
    world = os.path.join(tmp, "world.tif")
    make(world, "float32", "EPSG:4326", (-180, 2, 0, 90, 0, -2), (180, 90), nodata=-9999.0,
         smooth=True)
    ortho = "+proj=ortho +lat_0=45 +lon_0=10 +datum=WGS84"
    # (on gdalwarp's own grid: where the transform fails, the suggested grids differ slightly,
    # docs/warp.md)
    grid = ["-te", "-6378137", "-6378137", "6378137", "6378137", "-ts", "140", "140"]
    ours_grid = ["--te", "-6378137", "-6378137", "6378137", "6378137", "--ts", "140", "140"]
    for m in ["near", "bilinear"]:
        a, b = warp_both(tmp, world, f"ortho-{m}", ["-t_srs", ortho, "-et", "0", "-r", m] + grid,
                         ["--t_srs", ortho, "--et", "0", "-r", m] + ours_grid)
        if a is not None:
            # near: identical; bilinear: the same nodata pixels (its values differ where samples
            # of the outline fail: GDAL's kernel scale comes from another source-window search)
            compare(f"{m} onto an orthographic view (part of the grid fails)", a, b,
                    rel=0.0 if m == "near" else 1e9)
    # -te alone, other reprojections (one extent reaching past the source)
    g4326 = os.path.join(tmp, "g4326.tif")
    make(g4326, "float32", "EPSG:4326", JOBS[1][2], JOBS[1][3])
    for te in (["1300000", "4700000", "2000000", "6000000"],
               ["800000", "4000000", "3000000", "7000000"]):
        a, b = warp_both(tmp, g4326, "te3857", ["-t_srs", "EPSG:3857", "-et", "0", "-te"] + te,
                         ["--t_srs", "EPSG:3857", "--et", "0", "--te"] + te)
        if a is not None:
            compare(f"grid -te {' '.join(te)} (EPSG:3857)", a, b)
    a, b = warp_both(tmp, src, "array-bilinear", ["-t_srs", "EPSG:4326", "-et", "0", "-r", "cubic"],
                     ["--t_srs", "EPSG:4326", "--et", "0", "-r", "cubic", "--array"])
    if a is not None:
        compare("cubic, warp of an OwnedRasterArray", a, b, rel=1e-6)
    # a memory limit that splits the output into many tiles changes nothing with -et 0
    a, b = warp_both(tmp, src, "tiles", ["-t_srs", "EPSG:4326", "-et", "0", "-r", "bilinear"],
                     ["--t_srs", "EPSG:4326", "--et", "0", "-r", "bilinear", "--memory-limit",
                      "60000"])
    if a is not None:
        compare("bilinear in many tiles", a, b, rel=1e-6)
    # the tile executor over a WarpedSource (a pipeline's `read ! warp ! write`), 32 x 32 tiles
    for m in ["near", "bilinear", "cubic", "average"]:
        a, b = warp_both(tmp, src, f"executor-{m}", ["-t_srs", "EPSG:4326", "-et", "0", "-r", m],
                         ["--t_srs", "EPSG:4326", "--et", "0", "-r", m, "--executor", "32"])
        if a is not None:
            compare(f"{m} through run_tiles over a WarpedSource", a, b, rel=1e-6)
    # the progress callback: called once per tile, ending at (total, total)
    r = run([TOOL, src, os.path.join(tmp, "progress.tif"), "--t_srs", "EPSG:4326", "-r",
             "bilinear", "--memory-limit", "60000", "--print-plan"])
    tiles = [ln for ln in r.stdout.splitlines() if ln.startswith("tile ")]
    last = [ln for ln in r.stdout.splitlines() if ln.startswith("progress ")]
    check(r.returncode == 0 and len(tiles) > 1 and last == [f"progress {len(tiles)}/{len(tiles)}"],
          f"progress: {len(tiles)} tiles, {last}")


def case_errors(tmp):
    src = os.path.join(tmp, "e.tif")
    make(src, "uint8", "EPSG:32633", JOBS[0][2], JOBS[0][3])
    nocrs = os.path.join(tmp, "nocrs.tif")
    make(nocrs, "uint8", None, JOBS[0][2], JOBS[0][3])
    cases = [
        ("bad SRS", src, ["--t_srs", "EPSG:999999"], "bad_crs"),
        ("unparseable SRS", src, ["--t_srs", "not a crs"], "bad_crs"),
        ("no CRS", nocrs, ["--t_srs", "EPSG:4326"], "no_crs"),
        ("no overlap", src, ["--t_srs", "EPSG:4326", "--te", "100", "10", "101", "11"],
         "no_overlap"),
        ("absurd size", src, ["--t_srs", "EPSG:4326", "--ts", "3000000000", "10"], "bad_grid"),
        ("absurd resolution", src, ["--t_srs", "EPSG:4326", "--tr", "1e-15", "1e-15"],
         "bad_grid"),
        ("negative resolution", src, ["--t_srs", "EPSG:4326", "--tr", "-1", "1"], "bad_grid"),
        ("tiny memory limit", src, ["--t_srs", "EPSG:4326", "--memory-limit", "10"], "bad_grid"),
    ]
    for what, inp, opts, kind in cases:
        out = os.path.join(tmp, "out-" + what.replace(" ", "-") + ".tif")
        r = run([TOOL, inp, out] + opts)
        check(r.returncode == 1 and ("WarpError " + kind) in r.stderr,
              f"{what}: exit {r.returncode}, stderr {r.stderr.strip()!r}, wanted WarpError {kind}")
        check(not os.path.exists(out), f"{what}: an output was left at {out}")
    left = [f for f in os.listdir(tmp) if f.startswith(".")]
    check(not left, f"temporaries left behind: {left}")


def main():
    global TOOL
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", required=True, choices=["near", "interp", "footprint", "grid", "errors"])
    ap.add_argument("--tool", required=True)
    args = ap.parse_args()
    TOOL = args.tool
    with tempfile.TemporaryDirectory() as tmp:
        globals()["case_" + args.case](tmp)
    print(f"{CHECKS[0] - len(FAILURES)} of {CHECKS[0]} checks passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
