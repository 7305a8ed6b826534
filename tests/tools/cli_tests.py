#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Tests that run the command-line tools (vsr-run, vsr-info, vsr-plan, vsr-bench) as a user does.

Input rasters are made in the test by vsr-test-raster (GDAL's C API, not the library under test);
results are read back by the same helper and checked against computations written here in plain
Python. Each case is one meson test: cli_tests.py --case NAME --build-root DIR.
Exit status: 0 pass, 1 fail, 77 skip.
"""
import argparse
import fcntl
import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile

CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


class Skip(Exception):
    pass


class Env:
    def __init__(self, build_root, tmp):
        self.root = build_root
        self.tmp = tmp
        self.vsr_run = os.path.join(build_root, "tools", "vsr-run", "vsr-run")
        self.vsr_info = os.path.join(build_root, "tools", "vsr-info", "vsr-info")
        self.vsr_plan = os.path.join(build_root, "tools", "vsr-plan", "vsr-plan")
        self.vsr_bench = os.path.join(build_root, "tools", "vsr-bench", "vsr-bench")
        self.raster_tool = os.path.join(build_root, "tests", "tools", "vsr-test-raster")

    def path(self, name):
        """A path in this case's temporary directory (bytes names allowed)."""
        if isinstance(name, bytes):
            return os.path.join(os.fsencode(self.tmp), name)
        return os.path.join(self.tmp, name)

    def make(self, path, *options):
        subprocess.run([self.raster_tool, "make", path] + [str(o) for o in options], check=True)
        return path

    def dump(self, path):
        out = subprocess.run([self.raster_tool, "dump", path], check=True,
                             stdout=subprocess.PIPE).stdout
        return json.loads(out)

    def run(self, tool, *args, env=None, **kwargs):
        """Runs a tool; returns the CompletedProcess with bytes stdout and stderr."""
        e = dict(os.environ)
        if env:
            e.update(env)
        return subprocess.run([tool] + list(args), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=e, **kwargs)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def strict_text(data, what):
    """Decodes bytes as UTF-8 (strict) and checks that no terminal control character is left."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise AssertionError("%s is not valid UTF-8 (%s): %r" % (what, e, data))
    for ch in text:
        if ord(ch) < 0x20 and ch not in "\n\t" or 0x7F <= ord(ch) <= 0x9F:
            raise AssertionError("%s holds control character %r: %r" % (what, ch, text))
    return text


def expect_exit(proc, code, what):
    check(proc.returncode == code, "%s: exit %d, expected %d\nstdout: %s\nstderr: %s" % (
        what, proc.returncode, code, proc.stdout.decode("utf-8", "replace"),
        proc.stderr.decode("utf-8", "replace")))


# --- issue 17 item 16: user bytes escaped -------------------------------------------------------

HOSTILE = b"bad-\xff\xfe-\x1b[31mred\x1b[0m-\xe2\x80\xaeevil"


@case
def info_escapes_user_bytes(env):
    lib = env.path(HOSTILE + b".so")
    p = env.run(env.vsr_info, "--json", env={"VIBESPATIAL_CUDA_DRIVER": os.fsdecode(lib)})
    text = strict_text(p.stdout, "vsr-info --json")
    doc = json.loads(text)
    check(doc["available"] is False, "driver %r should not load" % lib)
    # The exact path, invalid bytes as U+FFFD; the raw document held no control character.
    check(doc["library"] == lib.decode("utf-8", "replace"), doc["library"])
    p = env.run(env.vsr_info, env={"VIBESPATIAL_CUDA_DRIVER": os.fsdecode(lib)})
    text = strict_text(p.stdout, "vsr-info")
    check("\\xFF\\xFE" in text and "\\x1B[31m" in text and "\\u{202E}" in text, text)
    p = env.run(env.vsr_info, os.fsdecode(HOSTILE))
    expect_exit(p, 2, "vsr-info with a bad argument")
    strict_text(p.stderr, "vsr-info error")


@case
def run_escapes_user_bytes(env):
    missing = env.path(HOSTILE + b".tif")
    p = env.run(env.vsr_run, "--op", "stats", "--input", os.fsdecode(missing))
    expect_exit(p, 1, "vsr-run on a missing file")
    text = strict_text(p.stderr, "vsr-run error")
    check("\\xFF\\xFE" in text and "\\x1B[31m" in text, text)
    p = env.run(env.vsr_run, "--op", os.fsdecode(HOSTILE))
    expect_exit(p, 2, "vsr-run --op <hostile>")
    strict_text(p.stderr, "vsr-run usage error")
    # A real file with such a name: the summary names it escaped.
    real = env.make(env.path(HOSTILE + b"-real.tif"), "--width", 8, "--height", 8)
    p = env.run(env.vsr_run, "--op", "stats", "--input", os.fsdecode(real))
    expect_exit(p, 0, "vsr-run stats on a file with a hostile name")
    text = strict_text(p.stdout, "vsr-run summary")
    check("\\xFF\\xFE" in text, text)
    out = env.path(HOSTILE + b"-out.tif")
    p = env.run(env.vsr_run, "--op", "focal-mean", "--input", os.fsdecode(real), "--output",
                os.fsdecode(out))
    expect_exit(p, 0, "vsr-run focal-mean to a hostile name")
    strict_text(p.stdout, "vsr-run summary")
    check(os.path.exists(out), "output written under its exact name")


@case
def plan_escapes_user_bytes(env):
    p = env.run(env.vsr_plan, "--height", "10", "--width", "10", "--dtype",
                os.fsdecode(HOSTILE))
    expect_exit(p, 2, "vsr-plan --dtype <hostile>")
    strict_text(p.stderr, "vsr-plan error")
    p = env.run(env.vsr_plan, os.fsdecode(HOSTILE))
    expect_exit(p, 2, "vsr-plan <hostile>")
    strict_text(p.stderr, "vsr-plan error")


# --- issue 17 item 15: unknown or empty values are errors ----------------------------------------

@case
def empty_and_unknown_values_are_errors(env):
    bad = [
        (env.vsr_run, ["--input", ""]),
        (env.vsr_run, ["--output", ""]),
        (env.vsr_run, ["--input="]),
        (env.vsr_run, ["--op", "focal-mean", "--output="]),
        (env.vsr_run, ["--budget", ""]),
        (env.vsr_run, ["--op"]),
        (env.vsr_run, ["--progress=yes"]),
        (env.vsr_plan, ["--height", "4", "--width", "4", "--budget", ""]),
        (env.vsr_bench, ["alloc", "--seed", "abc"]),
        (env.vsr_bench, ["alloc", "--seed", "12x"]),
        (env.vsr_bench, ["alloc", "--seed", ""]),
        (env.vsr_bench, ["alloc", "--sections", "bogus"]),
        (env.vsr_bench, ["alloc", "--sections", "malloc,bogus"]),
        (env.vsr_bench, ["alloc", "--sections", ""]),
        (env.vsr_bench, ["alloc", "--sections", "malloc,"]),
        (env.vsr_bench, ["dispatch", "--sections", "bogus"]),
        (env.vsr_bench, ["dispatch", "--seed", "1"]),
        (env.vsr_bench, ["nosuch"]),
    ]
    for tool, args in bad:
        p = env.run(tool, *args)
        expect_exit(p, 2, "%s %r" % (os.path.basename(tool), args))
        text = strict_text(p.stderr, "error message")
        check(text.strip() != "", "%s %r printed no message" % (tool, args))


# --- issue 17 item 14: a budget of 0 is refused, never "no GPU" ----------------------------------

@case
def budget_zero_is_refused(env):
    for tool, args in [(env.vsr_run, ["--budget", "0"]), (env.vsr_run, ["--budget=0K"]),
                       (env.vsr_run, ["--op", "focal-mean", "--budget", "0GiB"]),
                       (env.vsr_plan, ["--height", "4096", "--width", "4096", "--budget", "0"])]:
        p = env.run(tool, *args)
        expect_exit(p, 2, "%s %r" % (os.path.basename(tool), args))
        text = strict_text(p.stderr, "error message")
        check("budget of 0" in text, text)
    # The smallest positive budget plans tiles and says they do not fit; auto still works.
    p = env.run(env.vsr_plan, "--height", "4096", "--width", "4096", "--budget", "1")
    expect_exit(p, 0, "vsr-plan --budget 1")
    text = strict_text(p.stdout, "vsr-plan table")
    check("tiled" in text and "fits budget       no" in text, text)
    p = env.run(env.vsr_run, "--op", "stats", "--sample-size", "300", "--budget", "1")
    expect_exit(p, 0, "vsr-run --budget 1")
    check(b"does NOT fit the budget" in p.stdout, p.stdout)


# --- issue 17 item 5: only raster file formats open an input -------------------------------------

@case
def vrt_disguised_as_tif_is_refused(env):
    secret_bytes = b"root:x:0:0:very-secret-data"
    secret = env.path("secret.txt")
    with open(secret, "wb") as f:
        f.write(secret_bytes)
    vrt = env.path("innocent.tif")
    with open(vrt, "w") as f:
        f.write('<VRTDataset rasterXSize="%d" rasterYSize="1">'
                '<VRTRasterBand dataType="Byte" band="1" subClass="VRTRawRasterBand">'
                '<SourceFilename relativetoVRT="0">%s</SourceFilename><ImageOffset>0</ImageOffset>'
                '<PixelOffset>1</PixelOffset><LineOffset>%d</LineOffset></VRTRasterBand>'
                '</VRTDataset>' % (len(secret_bytes), secret, len(secret_bytes)))
    out = env.path("out.tif")
    for args in (["--op", "stats", "--input", vrt],
                 ["--op", "focal-mean", "--input", vrt, "--output", out]):
        p = env.run(env.vsr_run, *args)
        expect_exit(p, 1, "vsr-run on a VRT named .tif")
        text = strict_text(p.stderr, "error")
        check("VRT" in text and "--allow-virtual" in text, text)
        check(not os.path.exists(out), "no output for a refused input")
    p = env.run(env.vsr_run, "--op", "stats", "--input", "/vsicurl/http://127.0.0.1:9/x.tif")
    expect_exit(p, 1, "vsr-run on a /vsicurl/ path")
    check(b"virtual file systems" in p.stderr, p.stderr)
    # Asked for, the VRT is read (and what it reads is the secret: that is why it is opt-in).
    p = env.run(env.vsr_run, "--op", "stats", "--input", vrt, "--allow-virtual")
    expect_exit(p, 0, "vsr-run --allow-virtual")
    row = [l for l in p.stdout.decode().splitlines() if l.startswith("1 ")][0].split()
    check(int(row[1]) == len(secret_bytes) and float(row[3]) == max(secret_bytes), row)


# --- issue 17 item 2: nothing lost on interruption or failure -------------------------------------

def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def only_files(env, expected, what):
    """The case's directory holds exactly `expected` (no output, no temporary, no sidecar)."""
    left = sorted(os.listdir(env.tmp))
    check(left == sorted(expected), "%s: directory holds %s, expected %s" % (what, left, expected))


def interrupted_run(env, sig, args):
    """Starts vsr-run with a 4 KiB stderr pipe and --progress, waits for its first progress line,
    sends `sig` and returns the exit status. The run cannot finish first: it has far more tiles
    than the pipe holds progress lines, and nothing reads the pipe after the first line."""
    p = subprocess.Popen([env.vsr_run] + args + ["--progress"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    try:
        fcntl.fcntl(p.stderr.fileno(), fcntl.F_SETPIPE_SZ, 4096)
        line = p.stderr.readline()
        check(line.startswith(b"[vsr-run]"), "first stderr line %r" % line)
        p.send_signal(sig)
        return p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stderr.close()


@case
def signal_leaves_input_and_no_output(env):
    # 4096 x 4096 with a 100K budget: 256 tiles of 256 x 256, and 256 progress lines.
    src = env.make(env.path("in.tif"), "--width", 4096, "--height", 4096, "--block", 256,
                   "--sparse", "--nodata", "-9999")
    before = digest(src)
    rc = interrupted_run(env, signal.SIGINT,
                         ["--op", "focal-mean", "--input", src, "--output", src, "--budget", "100K"])
    check(rc == -signal.SIGINT, "in place: exit status %d, expected death by SIGINT" % rc)
    check(digest(src) == before, "in place: the input changed")
    only_files(env, ["in.tif"], "SIGINT in place")
    out = env.path("out.tif")
    rc = interrupted_run(env, signal.SIGTERM,
                         ["--op", "focal-mean", "--input", src, "--output", out, "--budget", "100K"])
    check(rc == -signal.SIGTERM, "out of place: exit status %d, expected death by SIGTERM" % rc)
    only_files(env, ["in.tif"], "SIGTERM out of place")
    # Replacing an existing output: the old one survives the signal.
    with open(out, "wb") as f:
        f.write(b"old output")
    rc = interrupted_run(env, signal.SIGINT,
                         ["--op", "rescale", "--input", src, "--output", out, "--budget", "100K"])
    check(rc == -signal.SIGINT, "exit status %d" % rc)
    with open(out, "rb") as f:
        check(f.read() == b"old output", "the old output changed")
    only_files(env, ["in.tif", "out.tif"], "SIGINT over an old output")


@case
def read_error_leaves_input_and_no_output(env):
    src = env.make(env.path("in.tif"), "--width", 1024, "--height", 1024, "--block", 256,
                   "--compress", "DEFLATE")
    # Band 1's blocks 9..15 hold 0xFF bytes: reading them fails after 8 good tiles.
    subprocess.run([env.raster_tool, "corrupt", src, "--from-block", "9"], check=True)
    before = digest(src)
    for op in ("focal-mean", "rescale"):
        for target in (src, env.path("out.tif")):
            args = ["--op", op, "--input", src, "--output", target, "--budget", "100K"]
            p = env.run(env.vsr_run, *args)
            expect_exit(p, 1, "vsr-run %s on a damaged file" % op)
            strict_text(p.stderr, "error")
            check(digest(src) == before, "%s: the input changed" % op)
            only_files(env, ["in.tif"], "%s -> %s after a read error" % (op, target))


def limited_file_size(limit, ignore_sigxfsz):
    def setup():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        if ignore_sigxfsz:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    return setup


@case
def full_disk_leaves_input_and_no_output(env):
    # Files may not grow past 16 KiB (RLIMIT_FSIZE): a full disk as far as the writer can tell.
    # The outputs here would be about 100 KB (DEFLATE).
    limit = 16 * 1024
    src = env.make(env.path("in.tif"), "--width", 1024, "--height", 1024, "--block", 256)
    before = digest(src)
    for target in (src, env.path("out.tif")):
        for op in ("focal-mean", "rescale"):
            # SIGXFSZ ignored: writes fail with EFBIG, GDAL reports it, vsr-run exits 1.
            p = subprocess.run([env.vsr_run, "--op", op, "--input", src, "--output", target,
                                "--budget", "100K"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE,
                               preexec_fn=limited_file_size(limit, True))
            expect_exit(p, 1, "%s with a full disk" % op)
            strict_text(p.stderr, "error")
            check(digest(src) == before, "the input changed")
            only_files(env, ["in.tif"], "%s -> %s on a full disk" % (op, target))
        # SIGXFSZ at its default: the process dies of it, and the handler removed the file.
        p = subprocess.run([env.vsr_run, "--op", "focal-mean", "--input", src, "--output", target,
                            "--budget", "100K"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           preexec_fn=limited_file_size(limit, False))
        check(p.returncode == -signal.SIGXFSZ, "exit status %d, expected SIGXFSZ" % p.returncode)
        check(digest(src) == before, "the input changed")
        only_files(env, ["in.tif"], "SIGXFSZ -> %s" % target)
    # The sample path (write_raster, not streamed) is all or nothing too.
    out = env.path("sample.tif")
    p = subprocess.run([env.vsr_run, "--op", "rescale", "--sample-size", "300", "--output", out],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       preexec_fn=limited_file_size(limit, True))
    expect_exit(p, 1, "sample rescale with a full disk")
    only_files(env, ["in.tif"], "sample on a full disk")


# --- issue 17 item 6: memory bounded by the plan ---------------------------------------------------

MiB = 1024 * 1024


def run_rss(env, args):
    """Runs vsr-run; returns (exit status, stdout, stderr, peak RSS in bytes of that child)."""
    p = subprocess.Popen([env.vsr_run] + [str(a) for a in args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    out, err = p.stdout.read(), p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    p.stdout.close()
    p.stderr.close()
    return p.returncode, out, err, usage.ru_maxrss * 1024


@case
def memory_bounded_by_plan(env):
    # What vsr-run itself takes (libraries, GDAL, the emulator): a run over an 8 x 8 file.
    tiny = env.make(env.path("tiny.tif"), "--width", 8, "--height", 8)
    rc, _, err, baseline = run_rss(env, ["--op", "focal-mean", "--input", tiny, "--output",
                                         env.path("tiny-out.tif")])
    check(rc == 0, err)
    # A 1 KB sparse file: 32 bands of 2048 x 2048 float32 (512 MiB of pixels), pixel-interleaved,
    # so that a GDAL block carries all 32 bands (8 MiB). With an 8 MB budget the plan reads one
    # band per pass in tiles of 4 MiB; GDAL's cache is capped at 2 blocks + 64 MiB. Stated bound:
    # baseline + budget + cache + 40 MiB of slack (the old code read every band per tile and held
    # the whole raster for stats and rescale: about 1.1 GB here).
    src = env.make(env.path("sparse32.tif"), "--width", 2048, "--height", 2048, "--bands", 32,
                   "--block", 256, "--interleave", "pixel", "--sparse", "--nodata", "-9999")
    check(os.path.getsize(src) < 64 * 1024, "the input is a small sparse file")
    bound = baseline + 8 * MiB + (16 * MiB + 64 * MiB) + 40 * MiB
    for op in ("stats", "rescale", "focal-mean"):
        args = ["--op", op, "--input", src, "--budget", "8M"]
        if op != "stats":
            args += ["--output", env.path("out-%s.tif" % op)]
        rc, out, err, rss = run_rss(env, args)
        check(rc == 0, "%s: %s" % (op, err))
        check(b"1 band(s) per pass" in out, out)
        check(rss < bound, "%s: peak RSS %.0f MiB above the bound %.0f MiB (baseline %.0f MiB)" % (
            op, rss / MiB, bound / MiB, baseline / MiB))
    # A 372-byte file whose single block is 16384 x 16384 float32 (1 GiB): refused up front when
    # it does not fit the host memory allowed, with a message instead of a 1.3 GB allocation.
    big = env.make(env.path("oneblock.tif"), "--width", 16384, "--height", 16384, "--block",
                   16384, "--sparse")
    rc, _, err, rss = run_rss(env, ["--op", "stats", "--input", big, "--budget", "8M",
                                    "--host-memory", "512M"])
    check(rc == 1, "one huge block: exit %d" % rc)
    text = strict_text(err, "error")
    check("GDAL blocks of 1.0 GiB" in text and "host memory" in text, text)
    check(rss < baseline + 32 * MiB, "refusing took %.0f MiB" % (rss / MiB))
    # A 1.2 MB sparse file of 100000 x 100000 x 500 float32 (20 TB): a whole-raster plan is
    # refused with the amount, not a bare std::bad_alloc.
    huge = env.make(env.path("huge.tif"), "--width", 100000, "--height", 100000, "--bands", 500,
                    "--interleave", "pixel", "--sparse", "--co", "BLOCKYSIZE=1")
    for op in ("stats", "rescale", "focal-mean"):
        args = ["--op", op, "--input", huge, "--budget", "100T"]
        if op != "stats":
            args += ["--output", env.path("huge-out.tif")]
        rc, _, err, rss = run_rss(env, args)
        check(rc == 1, "%s on the huge file: exit %d" % (op, rc))
        text = strict_text(err, "error")
        check("TiB of host memory" in text and "bad_alloc" not in text, text)
        check(rss < baseline + 32 * MiB, "refusing took %.0f MiB" % (rss / MiB))
    check(not os.path.exists(env.path("huge-out.tif")), "no output")


# --- issue 16: results as GDAL and numpy give them ----------------------------------------------

def is_nan(x):
    return x != x


@case
def rescale_nodata_never_valid(env):
    # Byte, nodata 0, values 0 (nodata) and 1..250: rescaled to 0..1, the valid minimum (1) maps
    # to 0.0, which must stay a valid pixel.
    src = env.make(env.path("b.tif"), "--width", 40, "--height", 30, "--dtype", "uint8",
                   "--nodata", "0", "--nodata-every", "7")
    d = env.dump(src)
    px = d["pixels"][0]
    valid = [v for v in px if v != 0]
    lo, hi = min(valid), max(valid)
    out = env.path("r.tif")
    p = env.run(env.vsr_run, "--op", "rescale", "--input", src, "--output", out)
    expect_exit(p, 0, "rescale")
    r = env.dump(out)
    check(r["band_info"][0]["dtype"] == "float32", r["band_info"])
    check(is_nan(r["band_info"][0]["nodata"]), "output nodata %r" % r["band_info"][0]["nodata"])
    got = r["pixels"][0]
    for v, g in zip(px, got):
        if v == 0:
            check(is_nan(g), "nodata pixel -> %r" % g)
        else:
            want = (v - lo) * (1.0 / (hi - lo))
            check(abs(g - want) <= 1e-6, "%r -> %r, want %r" % (v, g, want))
    check(sum(1 for g in got if g == 0.0) == px.count(lo), "the valid minimum stays valid")


def stats_rows(stdout):
    """vsr-run's statistics table: {band: (count, min, max, mean, std)}."""
    rows = {}
    for line in stdout.decode().splitlines():
        parts = line.split()
        if len(parts) == 6 and parts[0].isdigit():
            rows[int(parts[0])] = (int(parts[1]),) + tuple(float(x) for x in parts[2:])
    return rows


@case
def int64_nodata_at_type_limits(env):
    imax, umax = 2**63 - 1, 2**64 - 1
    for dtype, nd, values in (("int64", imax, [imax, 9, imax - 1, 1, -5]),
                              ("uint64", umax, [umax, 1, umax - 1, 9, 0])):
        src = env.make(env.path(dtype + ".tif"), "--width", 10, "--height", 7, "--dtype", dtype,
                       "--nodata", str(nd), "--value", "list:" + ",".join(map(str, values)))
        d = env.dump(src)
        check(d["band_info"][0]["nodata"] == nd, d["band_info"])
        px = d["pixels"][0]
        valid = [v for v in px if v != nd]
        p = env.run(env.vsr_run, "--op", "stats", "--input", src)
        expect_exit(p, 0, "stats " + dtype)
        row = stats_rows(p.stdout)[1]
        check(row[0] == len(valid), "%s: count %d, want %d" % (dtype, row[0], len(valid)))
        check(abs(row[2] - max(valid)) <= 1e-5 * max(valid), "%s: max %r" % (dtype, row[2]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-root", required=True)
    ap.add_argument("--case", required=True, choices=sorted(CASES))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="vsr-cli-") as tmp:
        env = Env(a.build_root, tmp)
        try:
            CASES[a.case](env)
        except Skip as s:
            print("SKIP: %s" % s)
            return 77
        except AssertionError as e:
            print("FAIL: %s" % e, file=sys.stderr)
            return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
