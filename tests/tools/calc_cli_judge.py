#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The command line's judge of band math: `vsr-run --op calc` and a `vsr-run pipeline` calc step
against GDAL's gdal_calc.py, on GeoTIFFs GDAL made here, for every dtype.

    calc_cli_judge.py --build-root BUILD

For each input dtype (uint8 ... float64, with nodata at the type's limits, NaN pixels in the
float inputs, NaN as a nodata, one 3-band input A and one 1-band input B) every expression of
EXPRESSIONS runs three ways: all of them as the bands of one `vsr-run --op calc` run, all of them
as one `vsr-run pipeline read A=.. B=.. ! calc ... ! write` run, and each through gdal_calc.py's
Calc() (GDAL 3.6's, in this process) with only the letters it uses. gdal_calc.py computes in the
inputs' type, so:
  float64 inputs: equal (NaN equal to NaN); expressions calling exp, log, pow or a trigonometric
      function within a few ulps (numpy's SIMD math library against glibc);
  float32 inputs with --compute float32: equal for + - * / sqrt, comparisons and logic, within a
      few float32 ulps for the math library's functions;
  integer inputs: the numpy spelling converts the letters to float64 first (numpy's integer
      arithmetic wraps, ours computes in float64), then as float64 inputs; INTEGER_NATIVE runs a
      few expressions in the integer type itself, where numpy's arithmetic is exact: equal.
Nodata: every pixel where a band an expression names is nodata (or NaN, in a float input) must
be our output's nodata; gdal_calc.py's output there must be its nodata, or NaN where its raw
result is NaN (its nodata formula multiplies the raw result by 0), or anything where only a NaN
input marks the pixel (gdal_calc.py masks by value only): both counted as the documented
differences of docs/band-math.md, never passed as values. Output types: OUTPUT_TYPES converts one
float64 result to every integer type, as GDAL converts on write.

Exits 77 (skip) with the reason when gdal_calc.py, numpy or the osgeo module is missing, or the
tools are not built. Where this Python has no osgeo but gdal_calc.py's interpreter has, the judge
runs itself with that one.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile



sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from gdal_calc_python import SKIP, ensure_gdal_calc_python  # noqa: E402

ensure_gdal_calc_python(__file__)

import numpy as np  # noqa: E402
from osgeo import gdal  # noqa: E402
from osgeo_utils.gdal_calc import Calc  # noqa: E402

gdal.UseExceptions()

H, W = 40, 56
# gdal_calc.py takes one band per letter: its A, B, C are our A[1], A[2], A[3], its D our B.
LETTERS = {"A": ("a", 1), "B": ("a", 2), "C": ("a", 3), "D": ("b", 1)}

# (ours, numpy's, libm: calls the math library beyond sqrt). gdal_calc.py gets the letters the
# numpy spelling names.
EXPRESSIONS = [
    ("A[1] + B", "A + D", False),
    ("A[1] - B * 2", "A - D * 2", False),
    ("(A[3] - A[2]) / (A[3] + A[2])", "(C - B) / (C + B)", False),
    ("A[1] / B", "A / D", False),
    ("-A[1]**2", "-A**2", False),
    ("A[1] ** 3", "A ** 3", True),
    ("A[1] ^ 2 + A[2] ^ 1", "A ** 2 + B ** 1", False),
    ("abs(A[1]) ** 0.5", "absolute(A) ** 0.5", False),
    ("pow(abs(A[2]), 1.5)", "power(absolute(B), 1.5)", True),
    ("sqrt(abs(A[1]))", "sqrt(absolute(A))", False),
    ("sqrt(A[1])", "sqrt(A)", False),
    ("exp(A[1] / 100)", "exp(A / 100)", True),
    ("log(A[1])", "log(A)", True),
    ("log10(abs(B) + 1)", "log10(absolute(D) + 1)", True),
    ("sin(A[1]) + cos(A[2])", "sin(A) + cos(B)", True),
    ("tan(A[1] / 10)", "tan(A / 10)", True),
    ("atan(A[1]) + atan2(A[2], B)", "arctan(A) + arctan2(B, D)", True),
    ("asin(A[3] / 100)", "arcsin(C / 100)", True),
    ("floor(A[1] / 7) + ceil(B / 3)", "floor(A / 7) + ceil(D / 3)", False),
    ("round(A[1] / 2)", "round(A / 2)", False),
    ("min(A[1], A[2], B)", "minimum(minimum(A, B), D)", False),
    ("max(A[1], 0)", "maximum(A, 0)", False),
    ("A[1] > B", "A > D", False),
    ("(A[1] <= B) + (A[2] == A[3]) * 2", "(A <= D) + (B == C) * 2", False),
    ("A[1] != B", "A != D", False),
    ("A[1] > 0 && B < 5", "logical_and(A > 0, D < 5)", False),
    ("A[1] > 0 || !(B < 5)", "logical_or(A > 0, logical_not(D < 5))", False),
    ("A[1] > 3 and not A[2] > 3", "logical_and(A > 3, logical_not(B > 3))", False),
    ("A[1] > B ? A[1] : B * 2", "where(A > D, A, D * 2)", False),
    ("where(A[1] > 0, A[1], -A[1])", "where(A > 0, A, -A)", False),
    ("A[2] > 0 ? A[2] > 10 ? 2 : 1 : 0", "where(B > 0, where(B > 10, 2, 1), 0)", False),
    ("isnan(A[1] / B) + isinf(A[1] / B) * 2", "isnan(A / D) + isinf(A / D) * 2", False),
    ("A[1] * pi", "A * pi", False),
    ("(A[1] + A[2]) * (A[3] - B) / (B + 1)", "(A + B) * (C - D) / (D + 1)", False),
    ("A[1] * 1e-3 + 1.5e2 - .5", "A * 1e-3 + 1.5e2 - .5", False),
    ("(A[3] - A[2]) / (A[3] + A[2]) * 10000", "(C - B) / (C + B) * 10000", False),
]

# In the integer type itself: numpy's arithmetic is exact for these values (|v| <= 40).
INTEGER_NATIVE = [
    ("A[1] + B", "A + D"),
    ("A[1] * 3", "A * 3"),
    ("A[1] > B", "A > D"),
    ("where(A[1] > B, A[1], B)", "where(A > D, A, D)"),
    ("max(A[1], B)", "maximum(A, D)"),
    ("A[1] / B", "A / D"),
]

# (dtype, A's nodata, B's nodata, GDAL type name). Nodata at the type's limits; NaN as a nodata.
# int8 is a Byte file with PIXELTYPE=SIGNEDBYTE before GDAL 3.7 (both sides read it as int8).
CONFIGS = [
    ("uint8", 0, 255, "Byte"),
    ("int8", -128, 127, "Byte"),
    ("uint16", 65535, 0, "UInt16"),
    ("int16", -32768, 32767, "Int16"),
    ("uint32", 4294967295, 0, "UInt32"),
    ("int32", -2147483648, 2147483647, "Int32"),
    ("uint64", 18446744073709551615, 0, "UInt64"),
    ("int64", -9223372036854775808, 9223372036854775807, "Int64"),
    ("float32", float(np.finfo(np.float32).min), float(np.finfo(np.float32).max), "Float32"),
    ("float64", float(np.finfo(np.float64).max), -9999.0, "Float64"),
    ("float64", float("nan"), -1e300, "Float64"),
]

# float64 results of an int16 input written as each integer type (GDAL's conversion on write:
# rounded to nearest, halves away from zero, saturated).
OUTPUT_TYPES = [("uint8", "Byte"), ("int8", None), ("uint16", "UInt16"), ("int16", "Int16"),
                ("uint32", "UInt32"), ("int32", "Int32"), ("float32", "Float32")]
OUTPUT_EXPRS = [("A[1] * 2.5 + 60", "A * 2.5 + 60"), ("A[2] / 4 + 50.5", "B / 4 + 50.5")]

ULPS = 4  # math-library cases


def gdal_type(name):
    return getattr(gdal, "GDT_" + name)


def set_nodata(band, dtype, nodata):
    if dtype == "int64":
        band.SetNoDataValueAsInt64(int(nodata))
    elif dtype == "uint64":
        band.SetNoDataValueAsUInt64(int(nodata))
    else:
        band.SetNoDataValue(float(nodata))


def write(path, arrays, dtype, gtype, nodata):
    options = ["TILED=YES", "BLOCKXSIZE=16", "BLOCKYSIZE=16"]
    if dtype == "int8" and gtype == "Byte":
        options.append("PIXELTYPE=SIGNEDBYTE")
    ds = gdal.GetDriverByName("GTiff").Create(path, W, H, len(arrays), gdal_type(gtype), options)
    ds.SetGeoTransform((500000, 30, 0, 4000000, 0, -30))
    ds.SetProjection('LOCAL_CS["judge",UNIT["metre",1]]')
    for i, a in enumerate(arrays):
        band = ds.GetRasterBand(i + 1)
        if nodata is not None:
            set_nodata(band, dtype, nodata)
        band.WriteArray(a)
    ds = None


def read(path):
    ds = gdal.Open(path)
    bands = [ds.GetRasterBand(k + 1) for k in range(ds.RasterCount)]
    return np.stack([b.ReadAsArray() for b in bands]), bands[0].GetNoDataValue()


def make_values(rng, dtype, n_bands, nodata, every):
    """Integers (ties for round), zeros (division by zero), small floats for the float types,
    nodata pixels every `every` pixels (shifted per band) and NaN pixels in float inputs."""
    out = []
    unsigned = dtype.startswith("u")
    for b in range(n_bands):
        ints = rng.integers(0 if unsigned else -20, 41 if unsigned else 21, size=(H, W))
        if dtype.startswith("float"):
            kind = rng.integers(0, 3, size=(H, W))
            v = np.where(kind == 0, ints.astype(np.float64),
                         np.where(kind == 1, rng.uniform(-1, 1, size=(H, W)),
                                  rng.uniform(-40, 40, size=(H, W))))
        else:
            v = ints
        v = v.astype(dtype)
        flat = v.reshape(-1)
        flat[(np.arange(flat.size) + 3 * b) % 29 == 4] = 0
        if nodata is not None:
            flat[(np.arange(flat.size) + 5 * b) % every == 2] = nodata
        if dtype.startswith("float"):
            flat[(np.arange(flat.size) + 7 * b) % 37 == 5] = np.nan
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
    with np.errstate(over="ignore"):
        return np.abs(ordered(a) - ordered(b))


def letters_of(numpy_expr):
    return sorted(set(re.findall(r"\b([ABCD])\b", numpy_expr)))


def as_float64(numpy_expr):
    """The numpy spelling with every letter converted to float64 first."""
    return re.sub(r"\b([ABCD])\b", r"\1.astype(float64)", numpy_expr)


class Judge:
    def __init__(self, build_root, tmp):
        self.vsr_run = os.path.join(build_root, "tools", "vsr-run", "vsr-run")
        self.tmp = tmp
        self.failures = []
        self.rows = []
        self.documented = {"nodata-NaN": 0, "NaN input": 0}
        self.expressions = set()

    def run(self, args, what):
        p = subprocess.run([self.vsr_run] + args, capture_output=True)
        if p.returncode != 0:
            raise RuntimeError(f"{what}: vsr-run exit {p.returncode}: "
                               f"{p.stderr.decode('utf-8', 'replace').strip()}")

    def ours(self, label, files, exprs, ot, f32):
        """Every expression as one band: --op calc and a pipeline calc step. A float output's
        nodata is NaN (-a_nodata nan), which no valid result takes: an input's nodata at a type
        limit as the output's would be refused where a valid result equals it (gdal_calc.py
        writes it, and it then reads as nodata)."""
        calc = []
        for e in exprs:
            calc += ["--calc", e]
        if f32:
            calc += ["--compute", "float32"]
        if ot.startswith("float"):
            calc += ["-a_nodata", "nan"]
        op_out = os.path.join(self.tmp, "op.tif")
        pipe_out = os.path.join(self.tmp, "pipe.tif")
        self.run(["--op", "calc", "-i", "A=" + files["a"], "-i", "B=" + files["b"], *calc,
                  "--ot", ot, "-o", op_out, "--overwrite", "-q"], f"{label} --op calc")
        self.run(["pipeline", "read", "A=" + files["a"], "B=" + files["b"], "!", "calc", *calc,
                  "--ot", ot, "!", "write", pipe_out, "--overwrite", "-q"], f"{label} pipeline")
        return {"--op calc": read(op_out), "pipeline": read(pipe_out)}

    def theirs(self, numpy_expr, files, gtype, nodata):
        out = os.path.join(self.tmp, "theirs.tif")
        kwargs = {}
        for letter in letters_of(numpy_expr):
            f, band = LETTERS[letter]
            kwargs[letter] = files[f]
            kwargs[f"{letter}_band"] = band
        with np.errstate(all="ignore"):
            Calc(calc=numpy_expr, outfile=out, NoDataValue=nodata, type=gtype, quiet=True,
                 overwrite=True, **kwargs)
        return read(out)[0][0]

    def compare(self, label, got, nd, want, gnd, by_value, by_nan, ulps):
        """got: ours with nodata nd; want: gdal_calc.py's with nodata gnd. by_value: pixels an
        input's nodata value marks (both mask them); by_nan: pixels only a NaN input marks."""
        masked = by_value | by_nan
        got_nd = np.isnan(got) if np.isnan(nd) else got == nd
        flt = got.dtype.kind == "f"
        both_nan = (np.isnan(got) & np.isnan(want)) if flt else np.zeros(got.shape, bool)
        equal = (got == want) | both_nan
        if flt and ulps:
            fin = np.isfinite(got) & np.isfinite(want)
            with np.errstate(invalid="ignore", over="ignore"):
                scale = np.spacing(np.maximum(np.abs(want.astype(np.float64)), 1)
                                   .astype(got.dtype))
                equal |= fin & ((ulp_distance(got, want) <= ulps) |
                                (np.abs(got - want) <= ulps * scale))
        bad = ~masked & ~equal
        bad |= masked & ~got_nd  # our rule: every masked pixel is our nodata
        want_nd = want == gnd
        nodata_nan = by_value & ~want_nd & (np.isnan(want) if flt else False)
        bad |= by_value & ~want_nd & ~nodata_nan
        nan_input = by_nan & ~by_value
        self.documented["nodata-NaN"] += int(nodata_nan.sum())
        self.documented["NaN input"] += int(nan_input.sum())
        max_ulps = 0
        if flt:
            fin = np.isfinite(got) & np.isfinite(want) & ~masked
            if fin.any():
                max_ulps = int(ulp_distance(got[fin], want[fin].astype(got.dtype)).max())
        self.rows.append((label, int(bad.sum()), int(nodata_nan.sum()), int(nan_input.sum()),
                          max_ulps))
        if bad.any():
            idx = np.argwhere(bad)[:3]
            detail = ", ".join(f"{tuple(int(v) for v in i)}: ours {got[tuple(i)]!r} gdal_calc "
                               f"{want[tuple(i)]!r}" for i in idx)
            self.failures.append(f"{label}: {int(bad.sum())} pixel(s) differ ({detail})")

    def masks(self, numpy_expr, bands, nodatas):
        by_value = np.zeros((H, W), bool)
        by_nan = np.zeros((H, W), bool)
        for letter in letters_of(numpy_expr):
            v, nd = bands[letter], nodatas[letter]
            if nd is not None and not (isinstance(nd, float) and np.isnan(nd)):
                # As gdal_calc.py compares: the array against the nodata as a Python number.
                by_value |= v == np.array(nd).astype(np.float64) if v.dtype.kind == "f" \
                    else v == nd
            if v.dtype.kind == "f":
                by_nan |= np.isnan(v)
        return by_value, by_nan

    def judge_config(self, rng, dtype, nd_a, nd_b, gtype):
        files = {"a": os.path.join(self.tmp, f"a-{dtype}.tif"),
                 "b": os.path.join(self.tmp, f"b-{dtype}.tif")}
        a_vals = make_values(rng, dtype, 3, nd_a, 11)
        b_vals = make_values(rng, dtype, 1, nd_b, 7)
        write(files["a"], a_vals, dtype, gtype, nd_a)
        write(files["b"], b_vals, dtype, gtype, nd_b)
        bands = {"A": a_vals[0], "B": a_vals[1], "C": a_vals[2], "D": b_vals[0]}
        nodatas = {"A": nd_a, "B": nd_a, "C": nd_a, "D": nd_b}
        f32 = dtype == "float32"
        ot = "float32" if f32 else "float64"
        gt = "Float32" if f32 else "Float64"
        integer = dtype[0] in "ui"
        cfg = f"{dtype} (nodata {nd_a!r}, {nd_b!r})"
        outs = self.ours(cfg, files, [e for e, _, _ in EXPRESSIONS], ot, f32)
        self.same_outputs(cfg, outs)
        for k, (expr, numpy_expr, libm) in enumerate(EXPRESSIONS):
            self.expressions.add(expr)
            by_value, by_nan = self.masks(numpy_expr, bands, nodatas)
            spelled = as_float64(numpy_expr) if integer else numpy_expr
            for how, (got, nd) in outs.items():
                gnd = -7777.0 if np.isnan(nd) else nd
                if how == "--op calc":
                    want = self.theirs(spelled, files, gt, gnd)
                self.compare(f"{cfg} {how}: {expr}", got[k], nd, want, gnd, by_value, by_nan,
                             ULPS if libm else 0)
        if integer:
            outs = self.ours(cfg, files, [e for e, _ in INTEGER_NATIVE], "float64", False)
            for k, (expr, numpy_expr) in enumerate(INTEGER_NATIVE):
                self.expressions.add(expr)
                by_value, by_nan = self.masks(numpy_expr, bands, nodatas)
                nd = outs["--op calc"][1]
                gnd = -7777.0 if np.isnan(nd) else nd
                want = self.theirs(numpy_expr, files, "Float64", gnd)
                for how, (got, nd) in outs.items():
                    self.compare(f"{cfg} {how} in {dtype}: {expr}", got[k], nd, want, gnd,
                                 by_value, by_nan, 0)
        if dtype == "int16":
            for ot, gt in OUTPUT_TYPES:
                if gt is None:
                    continue  # no Int8 in GDAL 3.6
                outs = self.ours(f"{cfg} --ot {ot}", files, [e for e, _ in OUTPUT_EXPRS], ot,
                                 False)
                for k, (expr, numpy_expr) in enumerate(OUTPUT_EXPRS):
                    by_value, by_nan = self.masks(numpy_expr, bands, nodatas)
                    got, nd = outs["--op calc"]
                    gnd = -7777.0 if np.isnan(nd) else nd
                    want = self.theirs(as_float64(numpy_expr), files, gt, gnd)
                    for how, (got, nd) in outs.items():
                        self.compare(f"{cfg} {how} --ot {ot}: {expr}", got[k], nd, want, gnd,
                                     by_value, by_nan, 0)

    def same_outputs(self, cfg, outs):
        (a, nda), (b, ndb) = outs["--op calc"], outs["pipeline"]
        same = a.tobytes() == b.tobytes() and (nda == ndb or (np.isnan(nda) and np.isnan(ndb)))
        if not same:
            self.failures.append(f"{cfg}: --op calc and the pipeline's calc step differ")

    def judge_wraparound(self):
        """uint8 arithmetic in gdal_calc.py wraps at 256; ours is exact (documented)."""
        files = {"a": os.path.join(self.tmp, "w-a.tif"), "b": os.path.join(self.tmp, "w-b.tif")}
        v = (np.arange(H * W) % 256).astype(np.uint8).reshape(H, W)
        write(files["a"], [v, v, v], "uint8", "Byte", None)
        write(files["b"], [v], "uint8", "Byte", None)
        got = self.ours("uint8 wrap", files, ["A[1] * 3"], "float64", False)["--op calc"][0][0]
        want = self.theirs("A * 3", files, "Float64", "none")
        exact = v.astype(np.float64) * 3
        if not (np.array_equal(got, exact) and np.array_equal(want, exact % 256)
                and (got != want).any()):
            self.failures.append("uint8 A * 3: not the documented wrap-around of gdal_calc.py")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-root", required=True)
    args = ap.parse_args()
    vsr_run = os.path.join(args.build_root, "tools", "vsr-run", "vsr-run")
    if not os.access(vsr_run, os.X_OK):
        print(f"SKIP: {vsr_run} is not built")
        return SKIP
    rng = np.random.default_rng(20261202)
    with tempfile.TemporaryDirectory(prefix="vsr-cli-judge-") as tmp:
        judge = Judge(os.path.abspath(args.build_root), tmp)
        for dtype, nd_a, nd_b, gtype in CONFIGS:
            judge.judge_config(rng, dtype, nd_a, nd_b, gtype)
        judge.judge_wraparound()
    width = min(100, max(len(r[0]) for r in judge.rows))
    print(f"{'run':<{width}}  differ  nodata-NaN  NaN-input  max-ulps")
    for label, bad, nn, ni, ulps in judge.rows:
        print(f"{label[:width]:<{width}}  {bad:6d}  {nn:10d}  {ni:9d}  {ulps:8d}")
    print(f"{len(judge.expressions)} expressions, {len(CONFIGS)} input types, "
          f"{len(judge.rows)} comparisons; documented: {judge.documented['nodata-NaN']} nodata "
          f"pixels where gdal_calc.py leaves NaN, {judge.documented['NaN input']} pixels where "
          "only a NaN input marks nodata (gdal_calc.py computes with it)")
    if judge.failures:
        print("FAILURES:")
        for f in judge.failures[:40]:
            print("  " + f)
        if len(judge.failures) > 40:
            print(f"  ... and {len(judge.failures) - 40} more")
        return 1
    print("vsr-run --op calc and the pipeline's calc step agree with gdal_calc.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
