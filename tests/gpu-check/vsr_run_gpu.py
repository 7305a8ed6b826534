#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""vsr-run's GPU paths on the real driver (suite 'gpu'): per band (dispatch_per_band_gpu, whole
and in band batches), tiled (a budget too small for one band) and streamed (file to file, when
vsr-run was built with GDAL), each compared with the same run on the host (the emulator, where
vsr-run runs the host ops). Exits 77 when vsr-run does not run on a GPU here.

usage: vsr_run_gpu.py VSR_RUN EMULATOR_LIBRARY
"""

import os
import re
import subprocess
import sys
import tempfile

exe, emulator = sys.argv[1], sys.argv[2]
failures = []


def run(args, gpu):
    env = dict(os.environ, VIBESPATIAL_CUDA_DRIVER="" if gpu else emulator)
    env.pop("VSR_EMU_DEVICE_MEMORY", None)
    return subprocess.run([exe, *args], env=env, capture_output=True, text=True, timeout=300)


def field(out, name):
    m = re.search(r"^  %s\s+(.*)$" % name, out, re.M)
    return m.group(1) if m else ""


def stats(out):
    rows = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 6 and parts[0].isdigit():
            rows[int(parts[0])] = [float(x) for x in parts[1:]]
    return rows


def check(cond, what):
    print(("PASS " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def close(a, b):
    return a == b or abs(a - b) <= 1e-5 * max(abs(a), abs(b))


probe = run(["--op", "stats", "--bands", "2", "--sample-size", "64"], gpu=True)
if probe.returncode != 0 or not field(probe.stdout, "driver").startswith("GPU "):
    print("vsr-run-gpu: skipped: vsr-run does not run on a GPU here: "
          + (field(probe.stdout, "driver") or probe.stderr.strip()))
    sys.exit(77)

# Statistics: per band (whole plan) and tiled, against the host.
common = ["--op", "stats", "--bands", "4", "--sample-size", "1024"]
host = run(common, gpu=False)
gpu = run(common, gpu=True)
tiled = run(common + ["--budget", "2M"], gpu=True)
check(host.returncode == 0 and gpu.returncode == 0 and tiled.returncode == 0,
      "stats runs exit 0 (%d %d %d)" % (host.returncode, gpu.returncode, tiled.returncode))
check(field(tiled.stdout, "plan").startswith("tiled"), "stats --budget 2M plans tiles: "
      + field(tiled.stdout, "plan"))
hs, gs, ts = stats(host.stdout), stats(gpu.stdout), stats(tiled.stdout)
check(len(hs) == 4 and hs.keys() == gs.keys() == ts.keys(), "stats: four bands each")
for b in hs:
    for name, other in (("whole", gs), ("tiled", ts)):
        a, g = hs[b], other.get(b, [])
        check(len(g) == 5 and a[:3] == g[:3] and all(close(x, y) for x, y in zip(a[3:], g[3:])),
              "stats band %d on the GPU (%s) == host: %s vs %s" % (b, name, g, a))

# Rescale per band (whole, and in band batches) and the tiled focal mean: they run on the GPU.
for args, plan in ((["--op", "rescale", "--bands", "8", "--sample-size", "1024"], ""),
                   (["--op", "rescale", "--bands", "8", "--sample-size", "1024", "--budget", "20M"],
                    "band_batches"),
                   (["--op", "focal-mean", "--bands", "2", "--sample-size", "1024", "--budget", "2M"],
                    "tiled")):
    r = run(args, gpu=True)
    check(r.returncode == 0 and field(r.stdout, "driver").startswith("GPU ")
          and field(r.stdout, "plan").startswith(plan),
          "vsr-run %s on the GPU: exit %d, plan %s" % (" ".join(args), r.returncode,
                                                     field(r.stdout, "plan")))

# With GDAL: per-band, tiled and streamed outputs byte-equal to the host's.
with tempfile.TemporaryDirectory() as tmp:
    src = os.path.join(tmp, "in.tif")
    made = run(["--op", "rescale", "--bands", "4", "--sample-size", "1024", "--output", src],
               gpu=False)
    if made.returncode != 0 and "without GDAL" in made.stderr:
        print("SKIP streamed and file outputs: vsr-run was built without GDAL")
    else:
        check(made.returncode == 0, "sample written with GDAL: " + made.stderr.strip())
        sample = ["--bands", "4", "--sample-size", "1024"]
        for tag, args in (("per-band", ["--op", "rescale"] + sample),
                          ("tiled", ["--op", "focal-mean", "--budget", "2M"] + sample),
                          ("streamed", ["--op", "focal-mean", "--input", src, "--budget", "4M"])):
            outs = []
            for gpu_run in (True, False):
                where = "gpu" if gpu_run else "host"
                path = os.path.join(tmp, "%s-%s.tif" % (tag, where))
                r = run(args + ["--output", path], gpu=gpu_run)
                check(r.returncode == 0, "%s (%s): exit %d %s" % (tag, where, r.returncode,
                                                                 r.stderr.strip()))
                outs.append(open(path, "rb").read() if os.path.exists(path) else b"")
            check(outs[0] == outs[1] and len(outs[0]) > 0,
                  "%s output on the GPU == host, byte for byte" % tag)

if failures:
    print("%d check(s) failed" % len(failures))
    sys.exit(1)
