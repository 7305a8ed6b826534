#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Runs two vsr-run binaries (a reference and the one under test) over every op and a few
pipelines, whole and tiled, on the host and on the emulated device, over generated GeoTIFFs of
several dtypes and nodata, and compares what they write byte for byte: the output files, the
JSON of stats and histogram, --dry-run's plan, the exit status and stderr of refused runs.

usage: cli_bytes_check.py --old OLD_VSR_RUN --new NEW_VSR_RUN --raster VSR_TEST_RASTER
                          --emulator LIBCUDA_EMULATOR.so [--keep DIR]
Exit 0 when every case agrees; 1 with the differing cases listed otherwise."""

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def scrub(text, work):
    # Timings and the per-run temporary directory differ between any two runs.
    text = text.replace(work, "WORK")
    text = re.sub(r"\b\d+(\.\d+)?\s*(s|ms|us|GB/s|MB/s|Mpx/s|MiB/s|GiB/s)\b", "T", text)
    text = re.sub(r"(?m)^  (time|throughput) .*$", "", text)
    return text


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--raster", required=True)
    ap.add_argument("--emulator", required=True)
    ap.add_argument("--keep")
    a = ap.parse_args()
    work = a.keep or tempfile.mkdtemp(prefix="vsr-bytes-")
    os.makedirs(work, exist_ok=True)
    env = dict(os.environ, VIBESPATIAL_CUDA_DRIVER=a.emulator)

    inputs = {}
    for dtype, nodata in (("float32", "nan"), ("float32", None), ("uint8", "0"),
                          ("int16", "-9999"), ("float64", "-1")):
        name = "%s_%s.tif" % (dtype, nodata or "none")
        path = os.path.join(work, name)
        cmd = [a.raster, "make", path, "--width", "300", "--height", "200", "--bands", "4",
               "--dtype", dtype, "--block", "64"]
        if nodata is not None:
            cmd += ["--nodata", nodata, "--nodata-every", "37"]
        subprocess.run(cmd, check=True, env=env)
        inputs[name] = path
    masked = os.path.join(work, "masked.tif")
    subprocess.run([a.raster, "make", masked, "--width", "200", "--height", "150", "--bands",
                    "3", "--dtype", "uint16", "--mask", "internal", "--mask-every", "11"],
                   check=True, env=env)
    inputs["masked.tif"] = masked

    ops = [
        ["--op", "rescale"],
        ["--op", "rescale", "--in-range", "10,200", "--out-range", "0,250", "--ot", "uint8"],
        ["--op", "rescale", "--in-range", "200,10"],
        ["--op", "clip", "--range", "20,120"],
        ["--op", "clip", "--range", "20,120", "--ot", "int32", "-a_nodata", "-5"],
        ["--op", "fill-nodata", "--value", "7"],
        ["--op", "focal-mean"],
        ["--op", "focal-mean", "--edge", "reflect", "--ot", "uint16"],
        ["--op", "focal-mean", "--edge", "nodata", "-b", "2", "-b", "1"],
        ["--op", "ndvi"],
        ["--op", "normalized-difference", "--nir", "2", "--red", "1", "--ot", "int16"],
    ]
    reductions = [
        ["--op", "stats", "--json"],
        ["--op", "stats", "--json", "-b", "3"],
        ["--op", "histogram", "--json"],
        ["--op", "histogram", "--json", "--bins", "7", "--range", "0,300"],
    ]
    tilings = [[], ["--budget", "200K"]]
    devices = [["--device", "cpu"], ["--device", "gpu"]]

    cases = []  # (label, argv without binary, output path or None)
    n = 0
    for iname, ipath in inputs.items():
        for op in ops + reductions:
            for tiling in tilings:
                for dev in devices:
                    n += 1
                    raster = op not in reductions
                    out = "out%d.%s" % (n, "tif" if raster else "json")
                    argv = op + ["-i", ipath, "-o", "OUT/" + out, "-q"] + tiling + dev
                    cases.append(("%s %s" % (iname, " ".join(op + tiling + dev)), argv, out))
    # The sample (no input), as a raster and as statistics.
    for op in (["--op", "rescale"], ["--op", "focal-mean"], ["--op", "stats", "--json"]):
        n += 1
        out = "out%d.%s" % (n, "json" if "stats" in op else "tif")
        cases.append(("sample " + " ".join(op), op + ["--sample-size", "300", "--bands", "2",
                                                      "-o", "OUT/" + out, "-q"], out))
    # calc.
    f32 = inputs["float32_nan.tif"]
    u8 = inputs["uint8_0.tif"]
    for extra in ([], ["--ot", "uint8"], ["--compute", "float32"], ["--no-propagate-nodata"],
                  ["-a_nodata", "-3", "--ot", "int16"]):
        for tiling in tilings:
            for dev in devices:
                n += 1
                out = "out%d.tif" % n
                argv = (["--op", "calc", "-i", "A=" + f32, "-i", "B=" + u8, "--calc",
                         "(A[4]-B[3])/(A[4]+B[3]+1)", "--calc", "A[1]*2", "-o", "OUT/" + out, "-q"]
                        + extra + tiling + dev)
                cases.append(("calc " + " ".join(extra + tiling + dev), argv, out))
    # Pipelines.
    pipes = [
        ["calc", "--calc", "X[1]+X[2]", "!", "focal-mean"],
        ["focal-mean", "--edge", "reflect", "!", "clip", "--range", "50,150", "!",
         "rescale", "--in-range", "0,300", "--ot", "uint8"],
        ["fill-nodata", "--value", "3", "!", "focal-mean", "!", "focal-mean"],
        ["calc", "--calc", "(A[4]-A[3])/(A[4]+A[3])", "-a_nodata", "nan"],
    ]
    for iname in ("float32_nan.tif", "int16_-9999.tif", "masked.tif"):
        for p in pipes:
            for tiling in tilings:
                for dev in devices:
                    n += 1
                    out = "out%d.tif" % n
                    argv = (["pipeline", "read", "A=" + inputs[iname], "!"] + p +
                            ["!", "write", "OUT/" + out, "-q"] + tiling + dev)
                    cases.append(("pipeline %s %s" % (iname, " ".join(p + tiling + dev)), argv,
                                  out))
            n += 1
            out = "out%d.json" % n
            cases.append(("pipeline stats %s %s" % (iname, " ".join(p)),
                          ["pipeline", "read", "A=" + inputs[iname], "!"] + p +
                          ["!", "stats", "--json", "-o", "OUT/" + out, "-q"], out))
            n += 1
            out = "out%d.json" % n
            cases.append(("pipeline histogram %s %s" % (iname, " ".join(p)),
                          ["pipeline", "read", "A=" + inputs[iname], "!"] + p +
                          ["!", "histogram", "--range", "0,200", "--bins", "5", "--json", "-o",
                           "OUT/" + out, "-q"], out))
            cases.append(("dry-run %s %s" % (iname, " ".join(p)),
                          ["pipeline", "read", "A=" + inputs[iname], "!"] + p +
                          ["!", "write", "OUT/dry.tif", "--dry-run", "--budget", "300K"], None))
    # Printed (not -q) stats/histogram tables and refused command lines: stdout, stderr, status.
    for argv in (["--op", "stats", "-i", f32], ["--op", "histogram", "-i", u8, "--bins", "4"],
                 ["--op", "clip", "-i", f32], ["--op", "nosuch"], ["--op", "stats", "--edge",
                                                                   "reflect"],
                 ["--op", "rescale", "-i", f32, "--ot", "nope"],
                 ["--op", "calc", "-i", f32, "--calc", "A[9]"],
                 ["--op", "rescale", "-i", f32, "-o", "OUT/s1.tif", "--overwrite"],
                 ["--op", "ndvi", "-i", u8, "-o", "OUT/s2.tif", "--overwrite", "--budget", "200K"],
                 ["--op", "calc", "-i", "A=" + f32, "--calc", "A[1]", "-o", "OUT/s3.tif",
                  "--overwrite"],
                 ["pipeline", "read", "A=" + f32, "!", "focal-mean", "!", "write", "OUT/s4.tif",
                  "--overwrite", "--budget", "300K"],
                 ["pipeline", "read", "A=" + u8, "!", "clip", "--range", "1,9", "!", "stats"],
                 ["pipeline", "read", "A=" + f32, "!", "clip", "!", "write", "OUT/x.tif"],
                 ["pipeline", "read", "A=" + f32, "!", "nosuch", "!", "write", "OUT/x.tif"],
                 ["pipeline", "read", "A=" + f32, "!", "focal-mean", "!", "write", "OUT/x.tif",
                  "--ot", "uint8"]):
        cases.append(("printed " + " ".join(os.path.basename(w) for w in argv), argv, None))

    failures = []
    for label, argv, out in cases:
        results = []
        for which, exe in (("old", a.old), ("new", a.new)):
            odir = os.path.join(work, which)
            os.makedirs(odir, exist_ok=True)
            words = [w.replace("OUT/", odir + "/") for w in argv]
            p = subprocess.run([exe] + words, env=env, capture_output=True, text=True)
            got = [p.returncode, scrub(p.stdout, odir), scrub(p.stderr, odir)]
            if out is not None:
                path = os.path.join(odir, out)
                got.append(digest(path) if os.path.exists(path) else "missing")
            results.append(got)
        if results[0] != results[1]:
            failures.append((label, results))
            print("DIFFERS: %s\n  old: %r\n  new: %r" % (label, results[0], results[1]),
                  flush=True)
    print("%d cases, %d differ" % (len(cases), len(failures)))
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
