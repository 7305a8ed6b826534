#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The judge of band math: vibespatial-raster's calc (through vsr-test-calc, which reads and
writes GeoTIFFs with the library's io) against GDAL's gdal_calc.py on rasters GDAL made.

    calc_judge.py --tool PATH/vsr-test-calc

Each case is one expression in two spellings (ours and numpy's, which gdal_calc.py evaluates)
and is run three ways:
  float64 inputs, Float64 output:  equal (NaN equal to NaN); cases that call exp, log, pow or a
      trigonometric function within a few ulps (of the result, or of 1 for smaller results),
      since numpy uses its own SIMD math library;
  float64 inputs, Float32 output against our float64 compute written as float32: likewise;
  float32 inputs, Float32 output against our float32 compute (gdal_calc.py computes in the
      inputs' type): within a few float32 ulps (equal for + - * / sqrt and comparisons).
Nodata: the same pixels are nodata, except where gdal_calc.py leaves NaN at a nodata pixel
(its nodata formula multiplies the raw result by 0, so an infinite or NaN result stays NaN) and
we write the nodata: counted and reported as that documented difference, never as a pass of a
wrong value. docs/band-math.md explains every difference.

Exits 77 (skip) with the reason when gdal_calc.py or the osgeo module is missing. Where this
Python has no osgeo but gdal_calc.py's interpreter has, the judge runs itself with that one.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

NODATA = -9999.0


sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from gdal_calc_python import ensure_gdal_calc_python  # noqa: E402

ensure_gdal_calc_python(__file__)

import numpy as np  # noqa: E402
from osgeo import gdal  # noqa: E402
from osgeo_utils.gdal_calc import Calc  # noqa: E402

gdal.UseExceptions()

H, W = 48, 64
# Our inputs: A (3 bands) and B (one band). gdal_calc.py takes one band per letter: its A, B, C
# are our A[1], A[2], A[3] and its D is our B.
LETTERS = {"A": ("a", 1), "B": ("a", 2), "C": ("a", 3), "D": ("b", 1)}

# (ours, numpy's, gdal_calc.py letters used, libm: calls the math library beyond sqrt,
#  output type: None for the float runs, else (numpy name, GDAL name, nodata))
CASES = [
    ("A[1] + B", "A + D", "AD", False, None),
    ("A[1] - B * 2", "A - D * 2", "AD", False, None),
    ("(A[3] - A[2]) / (A[3] + A[2])", "(C - B) / (C + B)", "BC", False, None),
    ("A[1] / B", "A / D", "AD", False, None),
    ("-A[1]**2", "-A**2", "A", False, None),
    ("A[1] ** 3", "A ** 3", "A", True, None),
    ("A[1] ** 0.5", "A ** 0.5", "A", False, None),
    ("pow(A[1], 0.5)", "power(A, 0.5)", "A", True, None),
    ("A[2] ** -1", "B ** -1", "B", False, None),
    ("A[1] ^ 2 + A[2] ^ 1", "A ** 2 + B ** 1", "AB", False, None),
    ("sqrt(abs(A[1]))", "sqrt(absolute(A))", "A", False, None),
    ("exp(A[1] / 100)", "exp(A / 100)", "A", True, None),
    ("log(A[1])", "log(A)", "A", True, None),
    ("log10(abs(B) + 1)", "log10(absolute(D) + 1)", "D", True, None),
    ("sin(A[1]) + cos(A[2])", "sin(A) + cos(B)", "AB", True, None),
    ("tan(A[1] / 10)", "tan(A / 10)", "A", True, None),
    ("arcsin(A[1] / 100) - arccos(A[2] / 100)", "arcsin(A / 100) - arccos(B / 100)", "AB", True,
     None),
    ("atan(A[1]) + atan2(A[2], B)", "arctan(A) + arctan2(B, D)", "ABD", True, None),
    ("floor(A[1] / 7) + ceil(B / 3)", "floor(A / 7) + ceil(D / 3)", "AD", False, None),
    ("round(A[1] / 2)", "round(A / 2)", "A", False, None),
    ("min(A[1], A[2], B)", "minimum(minimum(A, B), D)", "ABD", False, None),
    ("max(A[1], 0)", "maximum(A, 0)", "A", False, None),
    ("A[1] > B", "A > D", "AD", False, None),
    ("(A[1] <= B) + (A[2] == A[3]) * 2", "(A <= D) + (B == C) * 2", "ABCD", False, None),
    ("A[1] != B", "A != D", "AD", False, None),
    ("A[1] > 0 && B < 0", "logical_and(A > 0, D < 0)", "AD", False, None),
    ("A[1] > 0 or not B < 0", "logical_or(A > 0, logical_not(D < 0))", "AD", False, None),
    ("A[1] > B ? A[1] : B * 2", "where(A > D, A, D * 2)", "AD", False, None),
    ("where(A[1] > 0, A[1], -A[1])", "where(A > 0, A, -A)", "A", False, None),
    ("isnan(A[1] / B) + isinf(A[1] / B) * 2", "isnan(A / D) + isinf(A / D) * 2", "AD", False,
     None),
    ("A[1] * pi", "A * pi", "A", False, None),
    ("(A[1] + A[2]) * (A[3] - B) / (B + 1)", "(A + B) * (C - D) / (D + 1)", "ABCD", False, None),
    ("A[1] * 1e-3 + 1.5e2 - .5", "A * 1e-3 + 1.5e2 - .5", "A", False, None),
    ("A[2] > 0 ? A[2] > 10 ? 2 : 1 : 0", "where(B > 0, where(B > 10, 2, 1), 0)", "B", False,
     None),
    ("abs(A[1]) ** (B / 50)", "absolute(A) ** (D / 50)", "AD", True, None),
    ("A[1] * 2.5", "A * 2.5", "A", False, ("int16", "Int16", -9999)),
    # Negative values saturate to 0; the nodata is a value no result takes (one that a valid
    # result took would be refused, where gdal_calc.py writes it and it reads as nodata).
    ("A[1] * 3 + 100", "A * 3 + 100", "A", False, ("uint16", "UInt16", 65535)),
    ("floor(A[2]) * 1000", "floor(B) * 1000", "B", False, ("int32", "Int32", -9999)),
]

FLOAT_ULPS = 4  # libm cases: numpy's SIMD math library against glibc


def write(path, arrays, gdal_type):
    drv = gdal.GetDriverByName("GTiff")
    ds = drv.Create(path, W, H, len(arrays), gdal_type)
    ds.SetGeoTransform((500000, 30, 0, 4000000, 0, -30))
    ds.SetProjection('PROJCS["WGS 84 / UTM zone 33N",GEOGCS["WGS 84",DATUM["WGS_1984",'
                     'SPHEROID["WGS 84",6378137,298.257223563]],PRIMEM["Greenwich",0],'
                     'UNIT["degree",0.0174532925199433]],PROJECTION["Transverse_Mercator"],'
                     'PARAMETER["latitude_of_origin",0],PARAMETER["central_meridian",15],'
                     'PARAMETER["scale_factor",0.9996],PARAMETER["false_easting",500000],'
                     'PARAMETER["false_northing",0],UNIT["metre",1]]')
    for i, a in enumerate(arrays):
        band = ds.GetRasterBand(i + 1)
        band.SetNoDataValue(NODATA)
        band.WriteArray(a)
    ds = None


def read(path):
    ds = gdal.Open(path)
    return ds.GetRasterBand(1).ReadAsArray(), ds.GetRasterBand(1).GetNoDataValue()


def make_values(rng, n_bands):
    """float32 values: integers (ties for round and for integer outputs), small and large
    floats, zeros (division by zero) and nodata pixels."""
    out = []
    for b in range(n_bands):
        kind = rng.integers(0, 4, size=(H, W))
        v = np.where(kind == 0, rng.integers(-20, 21, size=(H, W)).astype(np.float64),
                     np.where(kind == 1, rng.uniform(-1, 1, size=(H, W)),
                              rng.uniform(-100, 100, size=(H, W))))
        v = v.astype(np.float32)
        flat = v.reshape(-1)
        flat[(np.arange(flat.size) + 3 * b) % 31 == 4] = 0
        flat[(np.arange(flat.size) + 5 * b) % 11 == 2] = NODATA
        out.append(v)
    return out


def ordered(x):
    """Floats as integers in the order of their values (for ulp distances)."""
    if x.dtype == np.float32:
        i = x.view(np.int32).astype(np.int64)
        return np.where(i < 0, -(2**31) - i, i)
    i = x.view(np.int64)
    return np.where(i < 0, np.iinfo(np.int64).min - i, i)


def ulp_distance(a, b):
    """Representable values between a and b (for finite values; int64 arithmetic, exact)."""
    with np.errstate(over="ignore"):
        return np.abs(ordered(a) - ordered(b))


def ours(tool, out, expr, inputs, ot, nodata, f32=False):
    cmd = [tool, out, "-e", expr, "--ot", ot, "--nodata", repr(float(nodata))]
    for name, path in inputs:
        cmd += ["-i", f"{name}={path}"]
    if f32:
        cmd.append("--compute-float32")
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"vsr-test-calc failed for {expr!r}: {r.stderr.strip()}")
    return read(out)


def theirs(out, expr, letters, files, gdal_type, nodata):
    kwargs = {}
    for letter in letters:
        f, band = LETTERS[letter]
        kwargs[letter] = files[f]
        kwargs[f"{letter}_band"] = band
    with np.errstate(all="ignore"):
        Calc(calc=expr, outfile=out, NoDataValue=nodata, type=gdal_type, quiet=True,
             overwrite=True, **kwargs)
    return read(out)


class Tally:
    def __init__(self):
        self.failures = []
        self.documented = 0
        self.rows = []


def compare(tally, label, got, want, masked, nodata, ulps):
    got_nd = got == nodata
    both_nan = np.isnan(got) & np.isnan(want) if got.dtype.kind == "f" else np.zeros(got.shape, bool)
    equal = (got == want) | both_nan
    if got.dtype.kind == "f" and ulps > 0:
        # Within `ulps` of the result, or of 1 where the result is smaller (a sum of values
        # below 1, such as sin + cos, carries their absolute error, not the result's).
        finite = np.isfinite(got) & np.isfinite(want)
        with np.errstate(invalid="ignore"):
            scale = np.spacing(np.maximum(np.abs(want), 1).astype(got.dtype))
            equal |= finite & ((ulp_distance(got, want) <= ulps) |
                               (np.abs(got - want) <= ulps * scale))
    # gdal_calc.py: (1 * (mask == 0)) * result + nodata * mask is NaN where result is inf or NaN;
    # and a NaN result of valid pixels stays NaN there, where we write the nodata (NaN is invalid).
    documented = got_nd & (np.isnan(want) if want.dtype.kind == "f" else False)
    bad = ~(equal | documented)
    # Our rule: every masked pixel is nodata.
    bad |= masked & ~got_nd
    max_ulps = 0
    if got.dtype.kind == "f":
        fin = np.isfinite(got) & np.isfinite(want) & ~masked
        if fin.any():
            max_ulps = int(ulp_distance(got[fin], want[fin]).max())
    tally.documented += int(documented.sum())
    tally.rows.append((label, int(bad.sum()), int(documented.sum()), max_ulps))
    if bad.any():
        idx = np.argwhere(bad)[:3]
        detail = ", ".join(f"{tuple(int(v) for v in i)}: ours {got[tuple(i)]!r} gdal_calc "
                           f"{want[tuple(i)]!r}" for i in idx)
        tally.failures.append(f"{label}: {int(bad.sum())} pixel(s) differ ({detail})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    args = ap.parse_args()
    tool = os.path.abspath(args.tool)
    rng = np.random.default_rng(20240611)
    tally = Tally()
    with tempfile.TemporaryDirectory(prefix="vsr-calc-judge-") as tmp:
        a_vals = make_values(rng, 3)
        b_vals = make_values(rng, 1)
        files64 = {"a": os.path.join(tmp, "a64.tif"), "b": os.path.join(tmp, "b64.tif")}
        files32 = {"a": os.path.join(tmp, "a32.tif"), "b": os.path.join(tmp, "b32.tif")}
        # The float64 files hold the float32 values exactly: both runs see the same numbers.
        write(files64["a"], [v.astype(np.float64) for v in a_vals], gdal.GDT_Float64)
        write(files64["b"], [v.astype(np.float64) for v in b_vals], gdal.GDT_Float64)
        write(files32["a"], a_vals, gdal.GDT_Float32)
        write(files32["b"], b_vals, gdal.GDT_Float32)
        bands = {"A": a_vals[0], "B": a_vals[1], "C": a_vals[2], "D": b_vals[0]}
        out_ours = os.path.join(tmp, "ours.tif")
        out_theirs = os.path.join(tmp, "theirs.tif")
        for expr, numpy_expr, letters, libm, int_out in CASES:
            masked = np.zeros((H, W), bool)
            for letter in letters:
                masked |= bands[letter] == NODATA
            runs = []
            if int_out is None:
                runs.append(("float64", "Float64", files64, False, NODATA, FLOAT_ULPS if libm else 0))
                runs.append(("float32", "Float32", files64, False, NODATA, 1 if libm else 0))
                runs.append(("float32", "Float32", files32, True, NODATA, FLOAT_ULPS if libm else 0))
            else:
                ot, gt, nd = int_out
                runs.append((ot, gt, files64, False, nd, 0))
            for ot, gt, files, f32, nd, ulps in runs:
                kind = ("f32 inputs, f32 compute" if f32 else "f64 inputs") + f" -> {ot}"
                label = f"{expr!r} [{kind}]"
                inputs = [("A", files["a"]), ("B", files["b"])]
                got, got_nd = ours(tool, out_ours, expr, inputs, ot, nd, f32)
                want, want_nd = theirs(out_theirs, numpy_expr, letters, files, gt, nd)
                if got_nd != want_nd:
                    tally.failures.append(f"{label}: nodata {got_nd} vs gdal_calc's {want_nd}")
                compare(tally, label, got, want, masked, nd, ulps)

        # gdal_calc.py on the command line is the Calc() run above.
        script = shutil.which("gdal_calc.py")
        cli_out = os.path.join(tmp, "cli.tif")
        subprocess.run([script, "--quiet", "--overwrite", "-A", files64["a"], "--A_band=3",
                        "-B", files64["a"], "--B_band=2", "--calc=(A - B) / (A + B)",
                        "--type=Float64", f"--NoDataValue={NODATA}", f"--outfile={cli_out}"],
                       check=True, capture_output=True)
        cli, _ = read(cli_out)
        got, _ = ours(tool, out_ours, "(A[3] - A[2]) / (A[3] + A[2])",
                      [("A", files64["a"])], "float64", NODATA)
        same = (cli == got) | (np.isnan(cli) & ((got == NODATA) | np.isnan(got)))
        if not same.all():
            tally.failures.append(f"gdal_calc.py on the command line: {int((~same).sum())} pixels")

        # NaN inputs: we treat NaN as invalid (the library's rule), gdal_calc.py only the nodata
        # value: it computes with the NaN. Checked as that documented difference.
        nan_vals = make_values(rng, 1)[0]
        nan_vals.reshape(-1)[::17] = np.nan
        nan_file = os.path.join(tmp, "nan.tif")
        write(nan_file, [nan_vals], gdal.GDT_Float32)
        got, _ = ours(tool, out_ours, "A + 1", [("A", nan_file)], "float32", NODATA)
        want, _ = theirs(out_theirs, "A + 1", "A", {"a": nan_file}, "Float32", NODATA)
        is_nan = np.isnan(nan_vals)
        if not (np.all(got[is_nan] == NODATA) and np.all(np.isnan(want[is_nan]))
                and np.array_equal(got[~is_nan], want[~is_nan])):
            tally.failures.append("NaN inputs: not the documented difference")

    width = max(len(r[0]) for r in tally.rows)
    print(f"{'case':<{width}}  differ  nodata-NaN  max-ulps")
    for label, bad, doc, ulps in tally.rows:
        print(f"{label:<{width}}  {bad:6d}  {doc:10d}  {ulps:8d}")
    print(f"{len(CASES)} expressions, {len(tally.rows)} runs; {tally.documented} nodata pixels "
          "where gdal_calc.py leaves NaN (documented)")
    if tally.failures:
        print("FAILURES:")
        for f in tally.failures:
            print("  " + f)
        return 1
    print("all runs agree with gdal_calc.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
