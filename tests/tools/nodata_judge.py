#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""vsr-run's nodata and GDAL masks judged against GDAL's own answer (GDAL 3.6's Python bindings).

Every input is made here with GDAL; every answer of ours is read back with GDAL and compared with
what GDAL says of the input: GetMaskFlags / GetMaskBand (the pixels GDAL, and so rasterio's
masked reads, take as valid) and GetNoDataValue. Each check names the rule of docs/outputs.md or
docs/band-math.md it judges:

- masks: a band whose GDAL mask decides (internal mask, .msk, alpha, NODATA_VALUES) has exactly
  GDAL's valid pixels, also those equal to the band's nodata; written out, they stay valid;
- RGBA: all four bands run, the colour bands masked by the alpha, the alpha carried as it is;
- the output's nodata: -a_nodata never rewrites a valid pixel (calc as every op); a valid pixel
  equal to the output's nodata is refused by every op with a message saying what to pass; a
  value chosen only to mark masked pixels stays out of a float output; an input no expression
  reads plays no part;
- COG: what the validator says with and without overviews.

Exits 0 (pass), 1 (fail) or 77 (skip: no Python with numpy and osgeo, or vsr-run not built).
Usage: nodata_judge.py --build-root DIR
"""

import argparse
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from gdal_calc_python import SKIP, ensure_gdal_calc_python  # noqa: E402

ensure_gdal_calc_python(__file__)

import numpy as np  # noqa: E402
from osgeo import gdal  # noqa: E402

gdal.UseExceptions()

FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL: " + what)
    return cond


class Judge:
    def __init__(self, vsr_run, tmp):
        self.vsr_run, self.tmp = vsr_run, tmp

    def path(self, name):
        return os.path.join(self.tmp, name)

    def run(self, *args):
        return subprocess.run([self.vsr_run, *[str(a) for a in args]], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)

    def ok(self, *args):
        p = self.run(*args, "-q", "--overwrite")
        check(p.returncode == 0, f"vsr-run {' '.join(map(str, args))}: exit {p.returncode}: "
              f"{p.stderr.strip()}")
        return p


def create(path, values, gtype, nodata=None, options=()):
    """A GeoTIFF of values (bands, h, w) of GDAL type gtype; the dataset, open for more."""
    b, h, w = values.shape
    ds = gdal.GetDriverByName("GTiff").Create(path, w, h, b, gtype, list(options))
    ds.SetGeoTransform((500000, 10, 0, 5000000, 0, -10))
    for k in range(b):
        band = ds.GetRasterBand(k + 1)
        if nodata is not None:
            band.SetNoDataValue(nodata)
        band.WriteArray(values[k])
    return ds


def with_mask(path, values, gtype, mask, kind, nodata=None):
    """values with a per-dataset mask (0 invalid): internal or in a .msk beside the file."""
    gdal.SetConfigOption("GDAL_TIFF_INTERNAL_MASK", "YES" if kind == "internal" else "NO")
    try:
        ds = create(path, values, gtype, nodata)
        ds.CreateMaskBand(gdal.GMF_PER_DATASET)
        band = ds.GetRasterBand(1)
        band.GetMaskBand().WriteArray(mask)
        band = None
        ds = None
    finally:
        gdal.SetConfigOption("GDAL_TIFF_INTERNAL_MASK", None)
    return path


def gdal_valid(path, band=1):
    """GDAL's valid pixels of a band (GetMaskBand != 0) and its mask flags."""
    ds = gdal.Open(path)  # kept open while its band is used (GDAL's Python bindings need it)
    b = ds.GetRasterBand(band)
    valid, flags = b.GetMaskBand().ReadAsArray() != 0, b.GetMaskFlags()
    ds = None
    return valid, flags


def pixels(path, band=1):
    ds = gdal.Open(path)
    return ds.GetRasterBand(band).ReadAsArray()


def nodata_of(path, band=1):
    ds = gdal.Open(path)
    return ds.GetRasterBand(band).GetNoDataValue()


def stats_count(j, path, *args):
    import json
    p = j.ok("--op", "stats", "-i", path, "--json", *args)
    return [b["count"] for b in json.loads(p.stdout)["bands"]] if p.returncode == 0 else None


def judge_masks(j):
    """GDAL's mask decides, and a valid pixel equal to the band's nodata stays valid."""
    h, w = 40, 60
    i = np.arange(h * w).reshape(h, w)
    v = (i % 200 + 1).astype(np.uint8)
    v[i % 23 == 5] = 0  # valid by the mask, equal to the nodata 0
    mask = np.where(i % 12 == 0, 0, 255).astype(np.uint8)
    for kind in ("internal", "external"):
        src = with_mask(j.path(f"m-{kind}.tif"), v[None], gdal.GDT_Byte, mask, kind, nodata=0)
        valid, flags = gdal_valid(src)
        check(flags == gdal.GMF_PER_DATASET, f"{kind}: GDAL's flags {flags}")
        check(stats_count(j, src) == [int(valid.sum())],
              f"{kind} mask + nodata: count {stats_count(j, src)}, GDAL {int(valid.sum())}")
        # Carried to an output, GDAL's valid pixels stay valid and keep their values.
        out = j.path(f"m-{kind}-clip.tif")
        j.ok("--op", "clip", "--range", "0,255", "-i", src, "-o", out)
        got_valid, _ = gdal_valid(out) if os.path.exists(out) else (None, None)
        check(np.array_equal(got_valid, valid), f"{kind}: the output's valid pixels are not GDAL's")
        check(np.array_equal(pixels(out)[valid], v[valid]), f"{kind}: valid values changed")
        # calc to float32: the same valid pixels, NaN for the masked ones.
        out = j.path(f"m-{kind}-calc.tif")
        j.ok("--op", "calc", "-i", f"A={src}", "--calc", "A + 0.5", "-o", out)
        got_valid, _ = gdal_valid(out)
        check(np.array_equal(got_valid, valid), f"{kind}: calc's valid pixels are not GDAL's")
    # NODATA_VALUES: invalid where every band holds its value (GMF_NODATA | GMF_PER_DATASET).
    three = np.stack([v, v, np.where(i % 5 == 0, 0, v).astype(np.uint8)])
    ds = create(j.path("nv.tif"), three, gdal.GDT_Byte)
    ds.SetMetadataItem("NODATA_VALUES", "0 0 0")
    ds.FlushCache()
    ds = None
    valid, flags = gdal_valid(j.path("nv.tif"))
    check(flags == gdal.GMF_NODATA | gdal.GMF_PER_DATASET, f"NODATA_VALUES: flags {flags}")
    got = stats_count(j, j.path("nv.tif"))
    check(got == [int(valid.sum())] * 3, f"NODATA_VALUES: counts {got}, GDAL {int(valid.sum())}")
    # A band whose nodata decides (GMF_NODATA): its nodata pixels, as GDAL.
    src = j.path("nd.tif")
    create(src, v[None], gdal.GDT_Byte, nodata=0).FlushCache()
    valid, flags = gdal_valid(src)
    check(flags == gdal.GMF_NODATA and stats_count(j, src) == [int(valid.sum())], "GMF_NODATA")
    # 32 bits, its largest value valid: the masked pixels get another value, none is lost.
    big = (i * 1000).astype(np.int32)
    big[0, 1] = 2**31 - 1
    src = with_mask(j.path("i32.tif"), big[None], gdal.GDT_Int32, mask, "internal")
    valid, _ = gdal_valid(src)
    check(stats_count(j, src) == [int(valid.sum())], "int32 with its largest value valid")


def judge_rgba(j):
    """All four bands of an RGBA file: the colour bands masked by the alpha, the alpha as is."""
    h, w = 20, 30
    i = np.arange(h * w).reshape(h, w)
    alpha = np.where(i % 7 == 0, 0, 255).astype(np.uint8)
    rgb = np.stack([(i * 7 + 50 * k) % 256 for k in range(3)]).astype(np.uint8)
    full = rgb.copy()  # every value is valid somewhere: no value is left to mark masked pixels
    rgb[(rgb >= 240) & (alpha != 0)] = 17  # 240..255 only where the alpha hides them
    src = j.path("rgba.tif")
    create(src, np.concatenate([rgb, alpha[None]]), gdal.GDT_Byte,
           options=["ALPHA=YES", "PHOTOMETRIC=RGB"])
    valid = [gdal_valid(src, b) for b in range(1, 5)]
    check([f for _, f in valid] == [gdal.GMF_ALPHA | gdal.GMF_PER_DATASET] * 3 +
          [gdal.GMF_ALL_VALID], f"RGBA flags {[f for _, f in valid]}")
    counts = stats_count(j, src)
    check(counts == [int(m.sum()) for m, _ in valid], f"RGBA counts {counts}")
    out = j.path("rgba-clip.tif")
    j.ok("--op", "clip", "--range", "0,255", "-i", src, "-o", out)
    for b in range(1, 4):
        got_valid, _ = gdal_valid(out, b)
        check(np.array_equal(got_valid, valid[b - 1][0]), f"RGBA band {b}: valid pixels")
        check(np.array_equal(pixels(out, b)[got_valid], rgb[b - 1][got_valid]), f"RGBA band {b}")
    got_valid, _ = gdal_valid(out, 4)
    check(got_valid.all() and np.array_equal(pixels(out, 4), alpha), "the alpha carried as is")
    ds = gdal.Open(out)
    interp = ds.GetRasterBand(4).GetColorInterpretation()
    ds = None
    check(interp == gdal.GCI_AlphaBand, "alpha interp")
    # Colour bands that take every value: refused up front, naming --ignore-mask, which runs all
    # four bands as data and carries the alpha through as the output's mask (gdal_translate's
    # result).
    src = j.path("rgba-full.tif")
    create(src, np.concatenate([full, alpha[None]]), gdal.GDT_Byte,
           options=["ALPHA=YES", "PHOTOMETRIC=RGB"])
    out = j.path("rgba-full-clip.tif")
    p = j.run("--op", "clip", "--range", "0,255", "-i", src, "-o", out)
    check(p.returncode == 1 and "--ignore-mask" in p.stderr and not os.path.exists(out),
          f"full-range RGBA: exit {p.returncode}: {p.stderr}")
    j.ok("--op", "clip", "--range", "0,255", "-i", src, "--ignore-mask", "-o", out)
    for b in range(1, 4):
        got_valid, flags = gdal_valid(out, b)
        check(flags == gdal.GMF_ALPHA | gdal.GMF_PER_DATASET and
              np.array_equal(got_valid, alpha != 0), f"--ignore-mask RGBA band {b}: {flags}")


def judge_output_nodata(j):
    u8 = j.path("u8-200.tif")
    create(u8, np.full((1, 4, 4), 200, np.uint8), gdal.GDT_Byte)
    # -a_nodata V never rewrites valid pixels: every one of the 16 stays 255 and valid.
    for extra, want_nodata in ((["-a_nodata", "0"], 0), (["-a_nodata", "none"], None)):
        out = j.path("a.tif")
        j.ok("--op", "calc", "-i", f"A={u8}", "--calc", "A + 55", "--ot", "uint8", *extra,
             "-o", out)
        got_valid, _ = gdal_valid(out)
        check(nodata_of(out) == want_nodata and (pixels(out) == 255).all() and got_valid.all(),
              f"calc A+55 {extra}: nodata {nodata_of(out)}, {int(got_valid.sum())} valid of 16")
    i16 = j.path("i16-40.tif")
    create(i16, np.full((1, 4, 4), 40, np.int16), gdal.GDT_Int16)
    out = j.path("a16.tif")
    j.ok("--op", "calc", "-i", f"A={i16}", "--calc", "A * 1000", "--ot", "int16", "-a_nodata",
         "-32768", "-o", out)
    check((pixels(out) == 32767).all() and gdal_valid(out)[0].all(), "saturated int16 rewritten")
    # Every valid pixel equal to the output's nodata: refused, by calc as by the other ops.
    out = j.path("b.tif")
    p = j.run("--op", "calc", "-i", f"A={u8}", "--calc", "A + 55", "--ot", "uint8", "-o", out)
    check(p.returncode == 1 and "convert to 255 (uint8) and would equal the output nodata" in p.stderr and
          "-a_nodata" in p.stderr and not os.path.exists(out), f"calc collision: {p.stderr}")
    neg = j.path("neg.tif")
    create(neg, np.array([[[-5, 7], [9, 60]]], np.int16), gdal.GDT_Int16, nodata=0)
    out = j.path("b-clip.tif")
    p = j.run("--op", "clip", "--range", "0,50", "-i", neg, "-o", out)
    check(p.returncode == 1 and "convert to 0 (int16) and would equal the output nodata" in p.stderr and
          "-a_nodata" in p.stderr and not os.path.exists(out), f"clip collision: {p.stderr}")
    # A value chosen only to mark masked pixels stays out of a float output.
    h, w = 10, 30
    i = np.arange(h * w).reshape(h, w)
    v = (i % 255).astype(np.uint8)  # 0..254, 254 valid: the marker is 255, which A + 1 takes
    mask = np.where(i % 9 == 1, 0, 255).astype(np.uint8)
    src = with_mask(j.path("mu8.tif"), v[None], gdal.GDT_Byte, mask, "internal")
    valid, _ = gdal_valid(src)
    out = j.path("f.tif")
    j.ok("--op", "calc", "-i", f"A={src}", "--calc", "A + 1", "-o", out)
    got_valid, _ = gdal_valid(out)
    check(np.isnan(nodata_of(out)) and np.array_equal(got_valid, valid),
          f"a mask's marker as calc's nodata: {nodata_of(out)}, {int(got_valid.sum())} valid, "
          f"GDAL {int(valid.sum())}")
    out = j.path("f-clip.tif")
    j.ok("--op", "clip", "--range", "0,255", "--ot", "float32", "-i", src, "-o", out)
    check(np.isnan(nodata_of(out)) and np.array_equal(gdal_valid(out)[0], valid),
          f"a mask's marker as clip's float32 nodata: {nodata_of(out)}")
    # An input no expression reads plays no part in the output's nodata.
    nd16 = j.path("i16nd.tif")
    create(nd16, np.full((1, 4, 4), 5, np.int16), gdal.GDT_Int16, nodata=-32768)
    plain = j.path("u8plain.tif")
    create(plain, np.full((1, 4, 4), 7, np.uint8), gdal.GDT_Byte)
    for expr, want in (("B + 1", None), ("A + B", -32768.0)):
        for how in ("op", "pipeline"):
            out = j.path("g.tif")
            if how == "op":
                j.ok("--op", "calc", "-i", f"A={nd16}", "-i", f"B={plain}", "--calc", expr,
                     "-o", out)
            else:
                j.ok("pipeline", "read", f"A={nd16}", f"B={plain}", "!", "calc", "--calc", expr,
                     "!", "write", out)
            nd = nodata_of(out)
            check((np.isnan(nd) if want is None else nd == want), f"{how} {expr}: nodata {nd}")


def judge_cog(j):
    from osgeo_utils.samples import validate_cloud_optimized_geotiff as v
    h, w = 1537, 2049
    src = j.path("big.tif")
    create(src, (np.arange(h * w) % 251).astype(np.float32).reshape(1, h, w), gdal.GDT_Float32)
    for overviews, want_warning in (([], False), (["--overviews", "none"], True)):
        out = j.path("c.tif")
        j.ok("--op", "clip", "--range", "0,100", "-i", src, "-of", "COG", *overviews, "-o", out)
        warnings, errors, _ = v.validate(out, full_check=True)
        check(not errors, f"COG {overviews}: errors {errors}")
        recommended = any("recommended to include internal overviews" in x for x in warnings)
        check(recommended == want_warning and len(warnings) == int(want_warning),
              f"COG {overviews}: warnings {warnings}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-root", required=True)
    args = ap.parse_args()
    vsr_run = os.path.join(args.build_root, "tools", "vsr-run", "vsr-run")
    if not os.access(vsr_run, os.X_OK):
        print(f"SKIP: {vsr_run} is not built")
        return SKIP
    with tempfile.TemporaryDirectory(prefix="vsr-nodata-judge-") as tmp:
        j = Judge(vsr_run, tmp)
        for part in (judge_masks, judge_rgba, judge_output_nodata, judge_cog):
            try:
                part(j)
            except Exception as e:  # an output missing, a file GDAL cannot read: a failure
                check(False, f"{part.__name__}: {type(e).__name__}: {e}")
            print(f"{part.__name__}: {'done' if not FAILURES else 'failures so far'}")
    if FAILURES:
        print(f"{len(FAILURES)} failure(s)")
        return 1
    print("vsr-run's nodata and masks agree with GDAL")
    return 0


if __name__ == "__main__":
    sys.exit(main())
