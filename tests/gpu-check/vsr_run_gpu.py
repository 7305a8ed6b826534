#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""vsr-run's GPU paths against the same runs on the host: per band (dispatch_per_band_gpu, whole
and in band batches), tiled (a budget too small for one band) and streamed (file to file, when
vsr-run was built with GDAL), band math and a pipeline, each compared with the host run byte for
byte (statistics: counts, min and max exactly, mean and std to 1e-5), and the pool's peak within
every budget given.

Two modes:
- on the real driver (suite 'gpu'): the GPU runs use the real driver (vsr-run's --device auto),
  the host runs the emulator, where vsr-run runs the host ops. Exits 77 when vsr-run does not run
  on a GPU here.
- --emulated (suite 'tools', the plain and adversarial emulator): both on the emulator, the GPU
  runs with --device gpu (the emulated device backend), the host runs with --device cpu.

Outputs are equal when their files are, byte for byte, or (with --dump TOOL, tests/tools'
vsr-test-raster) when the tool's dumps of them (metadata and every pixel) are: a file's block
order may differ between two runs, as GDAL flushes blocks when its cache fills.

usage: vsr_run_gpu.py VSR_RUN EMULATOR_LIBRARY [--emulated] [--dump TOOL]
"""

import os
import re
import subprocess
import sys
import tempfile

exe, emulator = sys.argv[1], sys.argv[2]
emulated = "--emulated" in sys.argv[3:]
dump_tool = sys.argv[sys.argv.index("--dump") + 1] if "--dump" in sys.argv[3:] else None
failures = []


def run(args, gpu):
    env = dict(os.environ, VIBESPATIAL_CUDA_DRIVER=emulator if emulated or not gpu else "")
    env.pop("VSR_EMU_DEVICE_MEMORY", None)
    extra = ["--device", "gpu" if gpu else "cpu"] if emulated else []
    return subprocess.run([exe, *args, *extra], env=env, capture_output=True, text=True,
                          timeout=300)


def same_output(a, b):
    """Whether files a and b hold the same raster (see the module's comment)."""
    if not (os.path.exists(a) and os.path.exists(b)):
        return False
    x, y = open(a, "rb").read(), open(b, "rb").read()
    if x == y:
        return len(x) > 0
    if dump_tool is None:
        return False
    dumps = [subprocess.run([dump_tool, "dump", p], capture_output=True, text=True).stdout
             for p in (a, b)]
    # The file name is the dumps' only difference that is no content.
    return dumps[0] != "" and dumps[0].replace(a, "") == dumps[1].replace(b, "")


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


UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def peak_bytes(out):
    m = re.search(r"^  pool\s+peak ([0-9.]+) (B|KiB|MiB|GiB|TiB)", out, re.M)
    return float(m.group(1)) * UNITS[m.group(2)] if m else None


def budget_of(args):
    if "--budget" not in args:
        return None
    text = args[args.index("--budget") + 1]
    return int(text[:-1]) * (1 << 20) if text.endswith("M") else int(text)


def check(cond, what):
    print(("PASS " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def close(a, b):
    return a == b or abs(a - b) <= 1e-5 * max(abs(a), abs(b))


def on_gpu(out):
    driver = field(out, "driver")
    return driver.startswith("emulator (") and "emulated device ops" in driver if emulated \
        else driver.startswith("GPU ")


def check_peak(result, args, what):
    budget = budget_of(args)
    if budget is None:
        return
    peak = peak_bytes(result.stdout + result.stderr)  # with --json the summary is on stderr
    check(peak is not None and peak <= budget,
          "%s: the pool's peak %s is within the budget %d" % (what, peak, budget))


probe = run(["--op", "stats", "--bands", "2", "--sample-size", "64"], gpu=True)
if probe.returncode != 0 or not on_gpu(probe.stdout):
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
check_peak(tiled, common + ["--budget", "2M"], "stats, tiled")

# Histograms (with their range from a first pass), whole and tiled: the same counts.
if emulated:
    for budget in ([], ["--budget", "2M"]):
        args = ["--op", "histogram", "--bands", "3", "--sample-size", "1024", "--bins", "64",
                "--json"] + budget
        h, g = run(args, gpu=False), run(args, gpu=True)
        check(h.returncode == 0 and g.returncode == 0 and h.stdout == g.stdout
              and '"counts"' in g.stdout,
              "histogram %s on the GPU == host" % " ".join(budget))
        check_peak(g, args, "histogram " + " ".join(budget))

# Rescale per band (whole, and in band batches) and the tiled focal mean: they run on the GPU.
for args, plan in ((["--op", "rescale", "--bands", "8", "--sample-size", "1024"], ""),
                   (["--op", "rescale", "--bands", "8", "--sample-size", "1024", "--budget", "20M"],
                    "band_batches"),
                   (["--op", "focal-mean", "--bands", "2", "--sample-size", "1024", "--budget", "2M"],
                    "tiled")):
    r = run(args, gpu=True)
    check(r.returncode == 0 and on_gpu(r.stdout) and field(r.stdout, "plan").startswith(plan),
          "vsr-run %s on the GPU: exit %d, plan %s %s" % (" ".join(args), r.returncode,
                                                        field(r.stdout, "plan"), r.stderr.strip()))
    check_peak(r, args, " ".join(args))

# With GDAL: outputs byte-equal to the host's, for every op, band math and a pipeline, whole,
# tiled and streamed.
with tempfile.TemporaryDirectory() as tmp:
    src = os.path.join(tmp, "in.tif")
    made = run(["--op", "rescale", "--bands", "4", "--sample-size", "1024", "--output", src],
               gpu=False)
    if made.returncode != 0 and "without GDAL" in made.stderr:
        print("SKIP streamed and file outputs: vsr-run was built without GDAL")
    else:
        check(made.returncode == 0, "sample written with GDAL: " + made.stderr.strip())
        sample = ["--bands", "4", "--sample-size", "1024"]
        cases = [("per-band", ["--op", "rescale"] + sample),
                 ("tiled", ["--op", "focal-mean", "--budget", "2M"] + sample),
                 ("streamed", ["--op", "focal-mean", "--input", src, "--budget", "4M"])]
        if emulated:
            ndvi = "(A[4]-A[3])/(A[4]+A[3])"
            cases += [
                ("clip", ["--op", "clip", "--range", "200,600"] + sample),
                ("clip-tiled", ["--op", "clip", "--range", "200,600", "--budget", "2M"] + sample),
                ("fill-nodata", ["--op", "fill-nodata", "--value", "-5", "--input", src]),
                ("fill-nodata-tiled", ["--op", "fill-nodata", "--value", "-5", "--input", src,
                                       "--budget", "2M"]),
                ("rescale-tiled", ["--op", "rescale", "--ot", "uint8", "--input", src,
                                   "--budget", "2M"]),
                ("ndvi", ["--op", "normalized-difference", "--bands", "2",
                          "--sample-size", "1024"]),
                ("ndvi-tiled", ["--op", "normalized-difference", "--input", src, "--nir", "4",
                                "--red", "3", "--budget", "2M"]),
                ("calc", ["--op", "calc", "-i", "A=" + src, "--calc", ndvi]),
                ("calc-tiled", ["--op", "calc", "-i", "A=" + src, "--calc", ndvi, "--calc",
                                "A[1] * 2 + 1", "--budget", "2M"]),
            ]
            chain = ["pipeline", "read", "A=" + src, "!", "calc", "--calc", ndvi, "!",
                     "focal-mean", "--edge", "reflect", "!", "clip", "--range", "-0.2,0.9", "!",
                     "rescale", "--in-range", "-0.2,0.9", "--out-range", "1,255", "--ot", "uint8",
                     "!", "write"]
        for tag, args in cases:
            paths = []
            for gpu_run in (True, False):
                where = "gpu" if gpu_run else "host"
                paths.append(os.path.join(tmp, "%s-%s.tif" % (tag, where)))
                r = run(args + ["--output", paths[-1]], gpu=gpu_run)
                check(r.returncode == 0, "%s (%s): exit %d %s" % (tag, where, r.returncode,
                                                                 r.stderr.strip()))
                if gpu_run:
                    check(on_gpu(r.stdout), "%s runs on the GPU: %s" % (tag, field(r.stdout,
                                                                                   "driver")))
                    check_peak(r, args, tag)
            check(same_output(*paths), "%s output on the GPU == host" % tag)
        if emulated:
            steps = ("step 1 (calc)", "step 2 (focal-mean)", "step 3 (clip)", "step 4 (rescale)")
            for tag, budget in (("pipeline", []), ("pipeline-tiled", ["--budget", "2M"])):
                paths = []
                for gpu_run in (True, False):
                    paths.append(os.path.join(tmp, "%s-%s.tif" % (tag, gpu_run)))
                    r = run(chain + [paths[-1]] + budget + ["--diagnostics"], gpu=gpu_run)
                    check(r.returncode == 0, "%s (%s): exit %d %s" % (
                        tag, gpu_run, r.returncode, r.stderr.strip()))
                    where = "on the device" if gpu_run else "on the host"
                    shown = all(re.search(r"^  %s %s: \d+ tiles?$" % (re.escape(s), where),
                                          r.stderr, re.M) for s in steps)
                    check(shown, "%s --diagnostics shows every step %s" % (tag, where))
                    if gpu_run:
                        check(on_gpu(r.stdout), "%s runs on the GPU" % tag)
                        check_peak(r, budget, tag)
                check(same_output(*paths), "%s output on the GPU == host" % tag)

if failures:
    print("%d check(s) failed" % len(failures))
    sys.exit(1)
