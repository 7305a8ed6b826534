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
import re
import resource
import signal
import struct
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
    def __init__(self, build_root, tmp, sanitized=False):
        self.root = build_root
        # A sanitizer build: memory figures mean nothing there (shadow memory, quarantine).
        self.sanitized = sanitized
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


def tool_stderr(data):
    """stderr without sanitizer reports (a sanitizer build may print some for third-party
    headers; they are the sanitizer run's business, not the tool's output)."""
    return b"".join(l for l in data.splitlines(True)
                    if b"runtime error:" not in l and b"UndefinedBehaviorSanitizer" not in l)


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


# --- user bytes escaped ---------------------------------------------------------------------------

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


# --- unknown or empty values are errors -----------------------------------------------------------

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
        (env.vsr_bench, ["alloc", "--large-live", "0"]),
        (env.vsr_bench, ["alloc", "--large-live", "-3"]),
        (env.vsr_bench, ["alloc", "--large-live", ""]),
        (env.vsr_bench, ["dispatch", "--large-live", "8"]),
        (env.vsr_bench, ["nosuch"]),
    ]
    for tool, args in bad:
        p = env.run(tool, *args)
        expect_exit(p, 2, "%s %r" % (os.path.basename(tool), args))
        text = strict_text(p.stderr, "error message")
        check(text.strip() != "", "%s %r printed no message" % (tool, args))


# --- --large-live sizes the large trace -----------------------------------------------------------

@case
def bench_large_live_sizes_the_large_trace(env):
    # meson test sets MALLOC_PERTURB_, which makes malloc (the bench's baseline) write every block.
    p = env.run(env.vsr_bench, "alloc", "--quick", "--json", "--sections", "malloc",
                "--large-live", "24", env={"MALLOC_PERTURB_": "0"})
    expect_exit(p, 0, "vsr-bench alloc --large-live 24")
    out = json.loads(p.stdout)
    live = {s["trace"]: s["live"] for s in out["sections"] if s["section"] == "pool_vs_malloc"}
    check(live == {"small": 10000, "large": 24}, live)


# --- a budget of 0 is refused, never "no GPU" -----------------------------------------------------

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


# --- only raster file formats open an input -------------------------------------------------------

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


# --- nothing lost on interruption or failure ------------------------------------------------------

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
    p = subprocess.Popen([env.vsr_run] + args + ["--progress", "--overwrite"],
                         stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    try:
        fcntl.fcntl(p.stderr.fileno(), fcntl.F_SETPIPE_SZ, 4096)
        line = p.stderr.readline()
        while line and not line.startswith(b"[vsr-run]") and tool_stderr(line) == b"":
            line = p.stderr.readline()  # a sanitizer report
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
            args = ["--op", op, "--input", src, "--output", target, "--budget", "100K",
                    "--overwrite"]
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
                                "--budget", "100K", "--overwrite"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE,
                               preexec_fn=limited_file_size(limit, True))
            expect_exit(p, 1, "%s with a full disk" % op)
            strict_text(p.stderr, "error")
            check(digest(src) == before, "the input changed")
            only_files(env, ["in.tif"], "%s -> %s on a full disk" % (op, target))
        # SIGXFSZ at its default: the process dies of it, and the handler removed the file.
        p = subprocess.run([env.vsr_run, "--op", "focal-mean", "--input", src, "--output", target,
                            "--budget", "100K", "--overwrite"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE,
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


# --- memory bounded by the plan -------------------------------------------------------------------

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


def printed_bytes(text):
    """Bytes of a size as the summary prints it ("66.00 MiB", "1.00 GiB", "512 B")."""
    number, unit = text.split()
    scale = {"B": 1, "KiB": 1024, "MiB": MiB, "GiB": 1024 * MiB, "TiB": 1024 * 1024 * MiB}
    return float(number) * scale[unit]


@case
def peak_memory_within_the_printed_plan(env):
    # Every op over a file that streams in many tiles: its peak RSS stays within what vsr-run
    # itself takes (an 8 x 8 run) plus the host memory the summary's stages line prints for the
    # run, with the stages overlapped, and 24 MiB for thread stacks and GDAL's per-thread
    # buffers.
    tiny = env.make(env.path("tiny.tif"), "--width", 8, "--height", 8, "--bands", 4)
    rc, _, err, baseline = run_rss(env, ["--op", "focal-mean", "--input", tiny, "--output",
                                         env.path("tiny-out.tif")])
    check(rc == 0, err)
    src = env.make(env.path("in.tif"), "--width", 1536, "--height", 1536, "--bands", 4,
                   "--block", 256, "--interleave", "pixel", "--nodata", "-9999")
    runs = {
        "stats": ["--op", "stats"],
        "histogram": ["--op", "histogram", "--bins", 64],
        "rescale": ["--op", "rescale", "--ot", "uint8", "--out-range", "1,255"],
        "clip": ["--op", "clip", "--range", "10,100"],
        "fill-nodata": ["--op", "fill-nodata", "--value", 0],
        "focal-mean": ["--op", "focal-mean"],
        "ndvi": ["--op", "ndvi"],
        "calc": ["--op", "calc", "--calc", "A[1] * 2 + A[2]", "--calc", "sqrt(abs(A[3]))"],
    }
    for name, args in list(runs.items()) + [("pipeline", None)]:
        out = env.path("out-%s.tif" % name)
        if args is None:
            words = ["pipeline", "read", "A=" + src, "!", "calc", "--calc", "X[1] + X[4]", "!",
                     "focal-mean", "!", "write", out, "--budget", "24M"]
        else:
            words = args + ["--input", src, "--budget", "24M"]
            if name not in ("stats", "histogram"):
                words += ["--output", out]
        rc, text, err, rss = run_rss(env, words)
        check(rc == 0, "%s: %s" % (name, err))
        lines = [l for l in text.decode().splitlines() if l.startswith("  stages ")]
        check(len(lines) == 1, "%s: no stages line in %r" % (name, text))
        stages = lines[0]
        check("overlapped" in stages, "%s: %s" % (name, stages))
        printed = printed_bytes(stages.split("host memory ")[1].split(" at most")[0])
        bound = baseline + printed + 24 * MiB
        check(env.sanitized or rss <= bound,
              "%s: peak RSS %.0f MiB above the printed %.0f MiB + %.0f MiB baseline + 24 MiB" % (
                  name, rss / MiB, printed / MiB, baseline / MiB))


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
        # A tiled run over a raster 64 times its budget (512 MiB of pixels, 8 MB).
        check(b"plan        tiled, " in out and b"1 band(s) per pass" in out, out)
        check(env.sanitized or rss < bound,
              "%s: peak RSS %.0f MiB above the bound %.0f MiB (baseline %.0f MiB)" % (
                  op, rss / MiB, bound / MiB, baseline / MiB))
    # A 372-byte file whose single block is 16384 x 16384 float32 (1 GiB): refused up front when
    # it does not fit the host memory allowed, with a message instead of a 1.3 GB allocation.
    big = env.make(env.path("oneblock.tif"), "--width", 16384, "--height", 16384, "--block",
                   16384, "--sparse")
    rc, _, err, rss = run_rss(env, ["--op", "stats", "--input", big, "--budget", "8M",
                                    "--host-memory", "512M"])
    check(rc == 1, "one huge block: exit %d" % rc)
    text = strict_text(err, "error")
    check("GDAL blocks of 1.00 GiB" in text and "host memory" in text, text)
    check(env.sanitized or rss < baseline + 32 * MiB, "refusing took %.0f MiB" % (rss / MiB))
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
        check(env.sanitized or rss < baseline + 32 * MiB, "refusing took %.0f MiB" % (rss / MiB))
    check(not os.path.exists(env.path("huge-out.tif")), "no output")


# --- results as GDAL and numpy give them ----------------------------------------------------------

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


# --- every op against an independent computation --------------------------------------------------

NAN = float("nan")


def rel_close(a, b, rel=1e-5, abs_tol=1e-4):
    if is_nan(a) or is_nan(b):
        return is_nan(a) and is_nan(b)
    return abs(a - b) <= max(abs_tol, rel * max(abs(a), abs(b)))


def run_ok(env, *args):
    p = env.run(env.vsr_run, *[str(a) for a in args])
    expect_exit(p, 0, "vsr-run %s" % " ".join(str(a) for a in args))
    return p


def valid_of(v, nd):
    return not is_nan(v) and (nd is None or v != nd)


def py_focal(band, h, w, nd, edge):
    out = []
    for y in range(h):
        for x in range(w):
            c = band[y * w + x]
            if not valid_of(c, nd):
                out.append(NAN)
                continue
            s, n = 0.0, 0
            for dy in (-1, 0, 1):
                for dx in (-1, 0, 1):
                    yy, xx = y + dy, x + dx
                    if edge == "nearest":
                        yy, xx = min(max(yy, 0), h - 1), min(max(xx, 0), w - 1)
                    elif edge == "reflect":
                        yy = (0 if h == 1 else (-yy if yy < 0 else (2 * (h - 1) - yy if yy >= h else yy)))
                        xx = (0 if w == 1 else (-xx if xx < 0 else (2 * (w - 1) - xx if xx >= w else xx)))
                    elif not (0 <= yy < h and 0 <= xx < w):
                        continue
                    v = band[yy * w + xx]
                    if valid_of(v, nd):
                        s += v
                        n += 1
            out.append(s / n if n else NAN)
    return out


def f32(x):
    """x rounded to float32 (as a Python float)."""
    return struct.unpack("f", struct.pack("f", x))[0]


def np_hist(values, bins, lo, hi, float32=False):
    """numpy.histogram's counts (numpy 2): edges from linspace in float64, held in the bin dtype
    (float32 for float32 data), range and edges compared with the value in that dtype; a value's
    bin by search on the edges."""
    import bisect
    r = f32 if float32 else (lambda x: x)
    step = (hi - lo) / bins
    edges = [r(i * step + lo) for i in range(bins)] + [r(hi)]
    counts = [0] * bins
    for v in values:
        if r(lo) <= v <= r(hi):
            counts[min(bisect.bisect_right(edges, v) - 1, bins - 1)] += 1
    return edges, counts


def round_half_away(x):
    import math
    return math.floor(x + 0.5) if x >= 0 else -math.floor(-x + 0.5)


@case
def ops_match_independent_computation(env):
    W, H, ND = 280, 260, -9999.0
    src = env.make(env.path("in.tif"), "--width", W, "--height", H, "--bands", 2, "--block", 64,
                   "--nodata", "-9999", "--nodata-every", 13, "--compress", "DEFLATE")
    d = env.dump(src)
    bands = d["pixels"]
    valid = [[v for v in b if valid_of(v, ND)] for b in bands]
    # Whole (auto budget) and tiled (100K: 256 x 256 tiles with a halo) must agree exactly.
    for budget in ("auto", "100K"):
        # stats
        doc = json.loads(run_ok(env, "--op", "stats", "-i", src, "--json", "--budget",
                                budget).stdout)
        for b, row in enumerate(doc["bands"]):
            vs = valid[b]
            mean = sum(vs) / len(vs)
            std = (sum((v - mean) ** 2 for v in vs) / len(vs)) ** 0.5
            check(row["count"] == len(vs) and row["min"] == min(vs) and row["max"] == max(vs),
                  (budget, row))
            check(rel_close(row["mean"], mean, 1e-9) and rel_close(row["std"], std, 1e-9), row)
            check(row["nodata"] == "-9999", row)
        # histogram: default range (each band's min..max) and a given one
        for extra in ([], ["--range", "0,100"]):
            doc = json.loads(run_ok(env, "--op", "histogram", "-i", src, "--json", "--bins", 7,
                                    "--budget", budget, *extra).stdout)
            for b, row in enumerate(doc["bands"]):
                lo, hi = (0.0, 100.0) if extra else (min(valid[b]), max(valid[b]))
                edges, counts = np_hist(valid[b], 7, lo, hi, d["band_info"][b]["dtype"] == "float32")
                check(row["edges"] == edges and row["counts"] == counts, (extra, row))
    outs = {}
    for budget in ("auto", "100K"):
        for name, args in (
                ("rescale", ["--op", "rescale"]),
                ("rescale-u8", ["--op", "rescale", "--in-range", "0,100", "--out-range", "0,200",
                                "--ot", "uint8"]),
                ("clip", ["--op", "clip", "--range", "0,50"]),
                ("fill", ["--op", "fill-nodata", "--value", "0"]),
                ("focal-nearest", ["--op", "focal-mean"]),
                ("focal-reflect", ["--op", "focal-mean", "--edge", "reflect"]),
                ("focal-nodata", ["--op", "focal-mean", "--edge", "nodata"]),
                ("nd", ["--op", "normalized-difference", "--nir", "2", "--red", "1"])):
            out = env.path("%s-%s.tif" % (name, budget))
            run_ok(env, "-i", src, "-o", out, "--budget", budget, "-q", *args)
            outs[(name, budget)] = env.dump(out)
    for name in ("rescale", "rescale-u8", "clip", "fill", "focal-nearest", "focal-reflect",
                 "focal-nodata", "nd"):
        whole, tiled = outs[(name, "auto")], outs[(name, "100K")]
        check(json.dumps(whole["pixels"]) == json.dumps(tiled["pixels"]),
              "%s: the tiled run differs from the whole run" % name)
    lo = min(min(v) for v in valid)
    hi = max(max(v) for v in valid)
    for b in range(2):
        px = bands[b]
        r = outs[("rescale", "auto")]
        check(is_nan(r["band_info"][b]["nodata"]), r["band_info"])
        for v, g in zip(px, r["pixels"][b]):
            check(rel_close(g, (v - lo) / (hi - lo)) if valid_of(v, ND) else is_nan(g),
                  ("rescale", v, g))
        r = outs[("rescale-u8", "auto")]
        check(r["band_info"][b]["dtype"] == "uint8" and r["band_info"][b]["nodata"] == 255,
              r["band_info"])
        for v, g in zip(px, r["pixels"][b]):
            want = round_half_away(min(max(v, 0.0), 100.0) * 2.0) if valid_of(v, ND) else 255
            check(g == want, ("rescale-u8", v, g, want))
        r = outs[("clip", "auto")]
        check(r["band_info"][b]["nodata"] == ND, r["band_info"])
        for v, g in zip(px, r["pixels"][b]):
            check(g == (min(max(v, 0.0), 50.0) if valid_of(v, ND) else v), ("clip", v, g))
        r = outs[("fill", "auto")]
        check(r["band_info"][b]["nodata"] is None, r["band_info"])
        for v, g in zip(px, r["pixels"][b]):
            check(g == (v if valid_of(v, ND) else 0.0), ("fill", v, g))
        for edge in ("nearest", "reflect", "nodata"):
            r = outs[("focal-" + edge, "auto")]
            want = py_focal(px, H, W, ND, edge)
            bad = [i for i, (g, w_) in enumerate(zip(r["pixels"][b], want)) if not rel_close(g, w_)]
            check(not bad, "focal %s band %d: %d pixels differ, first %s" % (
                edge, b + 1, len(bad), bad[:3]))
    r = outs[("nd", "auto")]
    check(r["bands"] == 1 and is_nan(r["band_info"][0]["nodata"]), r["band_info"])
    for a, b_, g in zip(bands[1], bands[0], r["pixels"][0]):
        if valid_of(a, ND) and valid_of(b_, ND) and a + b_ != 0:
            check(rel_close(g, (a - b_) / (a + b_)), ("nd", a, b_, g))
        else:
            check(is_nan(g), ("nd invalid", a, b_, g))


@case
def histogram_float32_edges_as_numpy(env):
    # Values on numpy's edges with 10 bins on [0, 1]: numpy bins float32 data with float32 edges
    # (0.7f is edge 7 itself), float64 data with float64 ones (0.7 lies below edge 7).
    values = "0.3,0.6,0.7,0.1,0.2,0.4,0.5,0.8,0.9,1.0,0.0,0.30000001,0.69999999,1.0000001,-0.0"
    for dtype in ("float32", "float64"):
        src = env.make(env.path(dtype + ".tif"), "--width", 15, "--height", 4, "--dtype", dtype,
                       "--value", "list:" + values)
        px = env.dump(src)["pixels"][0]
        for bins, lo, hi in ((10, 0.0, 1.0), (7, 0.0, 1.0), (100, 0.0, 1.0), (3, 0.1000000015, 0.5)):
            doc = json.loads(run_ok(env, "--op", "histogram", "-i", src, "--json", "--bins", bins,
                                    "--range", "%r,%r" % (lo, hi)).stdout)
            edges, counts = np_hist(px, bins, lo, hi, dtype == "float32")
            row = doc["bands"][0]
            check(row["edges"] == edges and row["counts"] == counts,
                  (dtype, bins, lo, hi, row, edges, counts))
        # numpy.histogram(float32 data, 10, (0, 1)) per value, as numpy 2.4 gives it.
        doc = json.loads(run_ok(env, "--op", "histogram", "-i", src, "--json", "--range", "0,1")
                         .stdout)
        want = ([8, 4, 4, 8, 4, 4, 4, 8, 4, 8] if dtype == "float32" else
                [8, 4, 8, 4, 4, 8, 8, 0, 4, 8])
        check(doc["bands"][0]["counts"] == want, (dtype, doc["bands"][0]["counts"], want))


def convert_like_gdal(v, dtype):
    """gdal_translate -ot's conversion: integers rounded half away from zero and saturated."""
    lo, hi = {"uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535),
              "int16": (-32768, 32767), "int32": (-2**31, 2**31 - 1)}[dtype]
    return min(max(round_half_away(v), lo), hi)


@case
def ot_applies_to_every_raster_op(env):
    W, H, ND = 60, 50, -9999.0
    src = env.make(env.path("in.tif"), "--width", W, "--height", H, "--bands", 2, "--nodata",
                   "-9999", "--nodata-every", 11)
    d = env.dump(src)
    bands = d["pixels"]
    check(d["band_info"][0]["dtype"] == "float32", d["band_info"])
    # (name, args, --ot, output nodata, expected pixel of (band, index))
    focal = [py_focal(bands[b], H, W, ND, "nearest") for b in range(2)]
    cases = (
        ("clip-u8", ["--op", "clip", "--range", "0,100"], "uint8", 255,
         lambda b, i, v: convert_like_gdal(min(max(v, 0.0), 100.0), "uint8")),
        ("clip-i16", ["--op", "clip", "--range", "-50,300"], "int16", ND,
         lambda b, i, v: convert_like_gdal(min(max(v, -50.0), 300.0), "int16")),
        ("fill-i16", ["--op", "fill-nodata", "--value", "-7"], "int16", None,
         lambda b, i, v: convert_like_gdal(v, "int16")),
        ("focal-u8", ["--op", "focal-mean"], "uint8", 255,
         lambda b, i, v: convert_like_gdal(focal[b][i], "uint8")),
        ("focal-f64", ["--op", "focal-mean"], "float64", NAN, lambda b, i, v: f32(focal[b][i])),
    )
    for name, args, ot, nd, want in cases:
        outs = []
        for budget in ("auto", "100K"):
            out = env.path("%s-%s.tif" % (name, budget))
            p = run_ok(env, "-i", src, "-o", out, "--ot", ot, "--budget", budget, *args)
            check(("output as " + ot) in p.stdout.decode(), p.stdout)
            outs.append(env.dump(out))
        r = outs[0]
        check(json.dumps(r["pixels"]) == json.dumps(outs[1]["pixels"]),
              "%s: the tiled run differs from the whole run" % name)
        for b in range(2):
            info = r["band_info"][b]
            check(info["dtype"] == ot, (name, info))
            check(info["nodata"] == nd or (nd is not None and is_nan(nd) and is_nan(info["nodata"])),
                  (name, info, nd))
            for i, (v, g) in enumerate(zip(bands[b], r["pixels"][b])):
                fill = name.startswith("fill")
                if not fill and (not valid_of(v, ND) or is_nan(want(b, i, v))):
                    check(g == nd or (is_nan(g) and is_nan(nd)), (name, b, i, v, g, nd))
                else:
                    w_ = want(b, i, -7.0 if fill and not valid_of(v, ND) else v)
                    check(g == w_ or (is_nan(g) and is_nan(w_)), (name, b, i, v, g, w_))
    # The normalized difference as float64: the float32 values exactly.
    run_ok(env, "-i", src, "-o", env.path("nd64.tif"), "--op", "ndvi", "--nir", "2", "--red",
           "1", "--ot", "float64", "-q")
    run_ok(env, "-i", src, "-o", env.path("nd32.tif"), "--op", "ndvi", "--nir", "2", "--red",
           "1", "-q")
    a, b_ = env.dump(env.path("nd64.tif")), env.dump(env.path("nd32.tif"))
    check(a["band_info"][0]["dtype"] == "float64" and is_nan(a["band_info"][0]["nodata"]), a)
    check(json.dumps(a["pixels"]) == json.dumps(b_["pixels"]), "ndvi as float64")
    # Impossible: a valid pixel (300.4, saturated) would become the uint8 output's nodata 255.
    bad = env.make(env.path("bad.tif"), "--width", 4, "--height", 1, "--value",
                   "list:1,2,300.4,-1", "--nodata", "-1")
    p = env.run(env.vsr_run, "-i", bad, "-o", env.path("bad-out.tif"), "--op", "clip", "--range",
                "0,1000", "--ot", "uint8")
    expect_exit(p, 1, "a valid pixel converting to the nodata")
    text = strict_text(p.stderr, "error")
    check("1 valid pixel(s) of band 1 convert to 255" in text and "uint8" in text, text)
    check(not os.path.exists(env.path("bad-out.tif")), "no output")
    # Without the collision (range up to 254) it goes through: 300.4 -> 254, -1 -> 255.
    run_ok(env, "-i", bad, "-o", env.path("ok.tif"), "--op", "clip", "--range", "0,254", "--ot",
           "uint8", "-q")
    check(env.dump(env.path("ok.tif"))["pixels"][0] == [1, 2, 254, 255], "clip as uint8")
    # --ot does not apply to reductions.
    p = env.run(env.vsr_run, "-i", src, "--op", "stats", "--ot", "uint8")
    expect_exit(p, 2, "--ot for stats")
    check(b"--ot does not apply" in p.stderr, p.stderr)


# --- the output's nodata: -a_nodata and the rule ----------------------------------------------------

@case
def a_nodata_sets_the_output_nodata(env):
    W, H = 30, 20
    f32 = env.make(env.path("f32.tif"), "--width", W, "--height", H, "--nodata", "-9999",
                   "--nodata-every", 7)
    px = env.dump(f32)["pixels"][0]
    valid = [v for v in px if v != -9999]
    lo, hi = min(valid), max(valid)
    # rescale onto all of 0..255 as uint8: no value is left for a nodata the op would choose.
    p = env.run(env.vsr_run, "--op", "rescale", "-i", f32, "--out-range", "0,255", "--ot",
                "uint8", "-o", env.path("r.tif"))
    expect_exit(p, 2, "rescale onto all of uint8 without -a_nodata")
    check(b"-a_nodata" in p.stderr and not os.path.exists(env.path("r.tif")), p.stderr)
    for flag, nd in ((["-a_nodata", "none"], None), (["--a_nodata=none"], None)):
        out = env.path("r-none.tif")
        run_ok(env, "--op", "rescale", "-i", f32, "--out-range", "0,255", "--ot", "uint8", "-o",
               out, "-q", "--overwrite", *flag)
        r = env.dump(out)
        check(r["band_info"][0]["nodata"] is None, r["band_info"])
        for v, g in zip(px, r["pixels"][0]):
            want = round_half_away((v - lo) * (255.0 / (hi - lo))) if v != -9999 else 0
            check(g == want, ("rescale 0..255", v, g, want))
        check(min(r["pixels"][0]) == 0 and max(r["pixels"][0]) == 255, "all of 0..255")
    # A nodata given: invalid pixels take it; a valid pixel equal to it is an error.
    run_ok(env, "--op", "rescale", "-i", f32, "--out-range", "1,255", "--ot", "uint8", "-o",
           env.path("r0.tif"), "-q", "-a_nodata", "0")
    r = env.dump(env.path("r0.tif"))
    check(r["band_info"][0]["nodata"] == 0, r["band_info"])
    check(all((g == 0) == (v == -9999) for v, g in zip(px, r["pixels"][0])), "nodata 0")
    p = env.run(env.vsr_run, "--op", "rescale", "-i", f32, "--out-range", "0,255", "--ot", "uint8",
                "-o", env.path("r1.tif"), "-a_nodata", "0")
    expect_exit(p, 1, "a valid pixel on -a_nodata")
    check(b"-a_nodata" in p.stderr and not os.path.exists(env.path("r1.tif")), p.stderr)
    run_ok(env, "--op", "clip", "--range", "0,100", "-i", f32, "-o", env.path("c.tif"), "-q",
           "-a_nodata", "-1")
    c = env.dump(env.path("c.tif"))
    check(c["band_info"][0]["nodata"] == -1, c["band_info"])
    check(all((g == -1) == (v == -9999) for v, g in zip(px, c["pixels"][0])), "clip -a_nodata")
    # 64-bit values exactly: an int64 input clipped, with INT64_MAX and UINT64_MAX sentinels.
    imax, umax = 2**63 - 1, 2**64 - 1
    for dtype, nd, values, top in (("int64", imax, [2**62 + 1, 5, -3, 2**62 + 3, 7], "9e18"),
                                   ("uint64", umax, [2**63 + 1, 5, 3, 2**63 + 3, 7], "1.8e19")):
        src = env.make(env.path(dtype + ".tif"), "--width", 5, "--height", 2, "--dtype", dtype,
                       "--value", "list:" + ",".join(map(str, values)), "--nodata", str(values[1]))
        out = env.path(dtype + "-o.tif")
        run_ok(env, "--op", "clip", "--range", "-10," + top, "-i", src, "-o", out, "-q",
               "-a_nodata", str(nd))
        d = env.dump(out)
        check(d["band_info"][0]["nodata"] == nd, (dtype, d["band_info"]))
        want = [nd if v == values[1] else v for v in values] * 2
        got = d["pixels"][0]
        # clip bounds go through double: values inside them are kept exactly.
        check(got == want, (dtype, got, want))
    # -a_nodata must fit the output's type.
    for args in (["--ot", "uint8", "-a_nodata", "300"], ["--ot", "int16", "-a_nodata", "nan"],
                 ["-a_nodata", "abc"], ["--ot", "uint8", "-a_nodata", "1.5"],
                 ["--ot", "int64", "-a_nodata", "9223372036854775808"]):
        p = env.run(env.vsr_run, "--op", "clip", "--range", "0,1", "-i", f32, "-o",
                    env.path("bad.tif"), *args)
        expect_exit(p, 2, " ".join(args))
        check(b"-a_nodata" in p.stderr and not os.path.exists(env.path("bad.tif")), p.stderr)
    p = env.run(env.vsr_run, "--op", "stats", "-i", f32, "-a_nodata", "0")
    expect_exit(p, 2, "-a_nodata for stats")
    # An input without nodata gives an output without one (focal-mean and normalized-difference
    # gave a NaN nodata), unless an integer output is made from float values.
    plain = env.make(env.path("plain.tif"), "--width", W, "--height", H, "--bands", 2)
    for name, args, nd in (("focal", ["--op", "focal-mean"], None),
                           ("ndvi", ["--op", "ndvi", "--nir", "2", "--red", "1"], None),
                           ("rescale", ["--op", "rescale"], None),
                           ("clip", ["--op", "clip", "--range", "0,10"], None),
                           ("clip-u8", ["--op", "clip", "--range", "0,10", "--ot", "uint8"], 255),
                           ("focal-given", ["--op", "focal-mean", "-a_nodata", "-5"], -5)):
        out = env.path("plain-%s.tif" % name)
        run_ok(env, "-i", plain, "-o", out, "-q", *args)
        info = env.dump(out)["band_info"]
        check(all(b["nodata"] == nd for b in info), (name, info))
    u16 = env.make(env.path("u16.tif"), "--width", W, "--height", H, "--dtype", "uint16")
    run_ok(env, "-i", u16, "-o", env.path("u16-f.tif"), "-q", "--op", "focal-mean", "--ot",
           "uint16")
    check(env.dump(env.path("u16-f.tif"))["band_info"][0]["nodata"] is None, "integer in, out")


@case
def stats_json_writes_non_finite_values_as_strings(env):
    # min/max/mean/std of a band holding infinities were null, as for a band with no valid pixel.
    src = env.make(env.path("inf.tif"), "--width", 4, "--height", 2, "--dtype", "float64",
                   "--value", "list:1,-inf,2,inf")
    empty = env.make(env.path("empty.tif"), "--width", 4, "--height", 2, "--value", "const:7",
                     "--nodata", "7")
    for path, out in ((src, None), (src, env.path("s.json"))):
        p = run_ok(env, "--op", "stats", "-i", path, "--json", "-q",
                   *(["-o", out] if out else []))
        text = open(out).read() if out else p.stdout.decode()
        # Strict JSON: no NaN or Infinity tokens.
        doc = json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
        b = doc["bands"][0]
        check(b["count"] == 8 and b["min"] == "-inf" and b["max"] == "inf" and
              b["mean"] == "nan" and b["std"] == "nan", b)
    doc = json.loads(run_ok(env, "--op", "stats", "-i", empty, "--json", "-q").stdout)
    b = doc["bands"][0]
    check(b["count"] == 0 and b["min"] is None and b["std"] is None, b)


@case
def rescale_takes_a_reversed_in_range(env):
    # --in-range HI,LO was refused ("LO must be below HI"); gdal_translate -scale 100 0 maps 100 to
    # the low end and 0 to the high end, as rescale(in_min=100, in_max=0) does.
    values = [0, 25, 50, 100, 150, -20, 75]
    src = env.make(env.path("in.tif"), "--width", 7, "--height", 1, "--value",
                   "list:" + ",".join(map(str, values)))
    run_ok(env, "--op", "rescale", "-i", src, "--in-range", "100,0", "--out-range", "0,1", "-o",
           env.path("r.tif"), "-q")
    got = env.dump(env.path("r.tif"))["pixels"][0]
    want = [f32((100.0 - min(max(v, 0.0), 100.0)) / 100.0) for v in values]
    check(all(rel_close(g, w_, 1e-6, 1e-7) for g, w_ in zip(got, want)), (got, want))
    run_ok(env, "--op", "rescale", "-i", src, "--in-range", "100,0", "--out-range", "0,200",
           "--ot", "uint8", "-o", env.path("r8.tif"), "-q")
    got = env.dump(env.path("r8.tif"))["pixels"][0]
    check(got == [200, 150, 100, 0, 0, 200, 50], got)


@case
def gdal_masks_count_as_invalid(env):
    # A GDAL mask (internal, .msk, alpha band) was ignored: masked pixels counted as valid.
    W, H, EVERY = 30, 20, 3
    masked = [i % EVERY == 0 for i in range(W * H)]
    for kind in ("internal", "external"):
        src = env.make(env.path(kind + ".tif"), "--width", W, "--height", H, "--mask", kind,
                       "--mask-every", EVERY)
        px = env.dump(src)["pixels"][0]
        valid = [v for v, m in zip(px, masked) if not m]
        doc = json.loads(run_ok(env, "--op", "stats", "-i", src, "--json", "-q").stdout)
        b = doc["bands"][0]
        check(b["count"] == len(valid) and b["min"] == min(valid) and b["max"] == max(valid),
              (kind, b))
        doc = json.loads(run_ok(env, "--op", "stats", "-i", src, "--json", "-q",
                                "--ignore-mask").stdout)
        check(doc["bands"][0]["count"] == W * H, (kind, doc))
        # A raster op: the masked pixels are invalid, so the output has a nodata (NaN) there.
        out = env.path(kind + "-clip.tif")
        run_ok(env, "--op", "clip", "--range", "0,50", "-i", src, "-o", out, "-q")
        r = env.dump(out)
        check(is_nan(r["band_info"][0]["nodata"]), r["band_info"])
        for v, m, g in zip(px, masked, r["pixels"][0]):
            check(is_nan(g) if m else g == min(max(v, 0.0), 50.0), (kind, v, m, g))
        run_ok(env, "--op", "clip", "--range", "0,50", "-i", src, "-o", env.path("ig.tif"), "-q",
               "--ignore-mask", "--overwrite")
        check(env.dump(env.path("ig.tif"))["band_info"][0]["nodata"] is None, "--ignore-mask")
    # RGBA: bands 1-3 take the alpha as their mask, with one nodata no valid pixel takes.
    src = env.make(env.path("rgba.tif"), "--width", W, "--height", H, "--bands", 4, "--dtype",
                   "uint8", "--mask", "alpha", "--mask-every", EVERY)
    d = env.dump(src)
    doc = json.loads(run_ok(env, "--op", "stats", "-i", src, "--json", "-q").stdout)
    counts = [b["count"] for b in doc["bands"]]
    check(counts == [W * H - sum(masked)] * 3 + [W * H], counts)
    out = env.path("rgb.tif")
    run_ok(env, "--op", "clip", "--range", "0,255", "-i", src, "-b", 1, "-b", 2, "-b", 3, "-o",
           out, "-q")
    r = env.dump(out)
    nd = r["band_info"][0]["nodata"]
    check(nd is not None and all(b["nodata"] == nd for b in r["band_info"]), r["band_info"])
    for b in range(3):
        check(all(v != nd for v, m in zip(d["pixels"][b], masked) if not m), "a valid pixel is nd")
        for v, m, g in zip(d["pixels"][b], masked, r["pixels"][b]):
            check(g == (nd if m else v), (b, v, m, g))


# --- the sample runs say their plan, keep to it and give the right answer -------------------------

# The sample (no --input): 4 bands of 600 x 600 float32; with a 1600K budget (1120000 bytes usable)
# every op tiles and its tiles fit: stats 512 x 512 (2 x 2 per band), rescale and focal-mean
# 256 x 512 (3 x 2), normalized-difference 256 x 256 with both bands (3 x 3).
SAMPLE_SIDE, SAMPLE_BANDS, SAMPLE_BUDGET = 600, 4, "1600K"


def sample_pixels(bands=SAMPLE_BANDS, side=SAMPLE_SIDE):
    """vsr-run's sample raster (make_sample), computed here: [band][row * side + col]."""
    out, i = [], 0
    for b in range(bands):
        px = []
        for y in range(side):
            for x in range(side):
                h = (i * 2654435761) & 0xFFFFFFFF
                h ^= h >> 15
                px.append(NAN if h % 100 == 0 else
                          100.0 * (b + 1) + ((x + 2 * y) % 1000) * 0.5 + (h % 64) * 0.25)
                i += 1
        out.append(px)
    return out


def sample_run(env, op, budget, *extra):
    """Runs vsr-run on the sample with --progress; checks the plan line against what is expected
    of the budget and that the progress lines count the plan's passes. Returns (stdout, plan)."""
    p = run_ok(env, "--op", op, "--sample-size", SAMPLE_SIDE, "--budget", budget, "--progress",
               *extra)
    out = strict_text(p.stdout, "summary")
    err = tool_stderr(p.stderr).decode()
    plans = [l.split(None, 1)[1] for l in out.splitlines() if l.startswith("  plan ")]
    check(len(plans) == 1, "one plan line: %r" % out)
    plan = plans[0]
    check("does NOT fit" not in plan, "%s --budget %s: %s" % (op, budget, plan))
    if budget == "auto":
        check(plan.startswith("whole, "), "%s: auto plans the whole raster: %s" % (op, plan))
    else:
        check(plan.startswith("tiled, ") and "budget 1.53 MiB" in plan, "%s: %s" % (op, plan))
    # The last progress line of the op's own pass says every tile (or band) was done.
    last = [l for l in err.splitlines() if l.startswith("[vsr-run] %s:" % op)]
    check(last, "%s: no progress line: %r" % (op, err))
    return out, plan, last[-1]


def diagnostics_table(stderr):
    """The --diagnostics table of a run's stderr: [(label, seconds)], labels stripped."""
    lines = tool_stderr(stderr).decode().splitlines()
    heads = [i for i, l in enumerate(lines) if l == "[vsr-run] diagnostics: where the time went"]
    check(len(heads) == 1, "one diagnostics table: %r" % lines)
    rows = []
    for l in lines[heads[0] + 2:]:
        # "label seconds cores" for a step, "label seconds" for a stage and the total.
        m = re.match(r"^\s*(.*?)\s+([0-9.]+)(?:\s+([0-9.]+))?$", l)
        check(m, "a diagnostics row: %r" % l)
        rows.append((m.group(1), float(m.group(2))))
    return rows


@case
def diagnostics_say_where_the_time_went(env):
    # 600 x 600 x 4 float32 at 100K: 256 x 256 tiles, 3 x 3 of them per band (one band a pass).
    p = run_ok(env, "--op", "stats", "--sample-size", SAMPLE_SIDE, "--budget", "100K",
               "--diagnostics", "-q")
    rows = diagnostics_table(p.stderr)
    labels = [r[0] for r in rows]
    check(labels == ["looking for a device", "checking the output", "making the sample raster",
                     "planning", "running stats", "read (36 tiles)", "compute (36 tiles)",
                     "write (36 tiles)", "printing the results", "total"], labels)
    seconds = dict(rows)
    check(all(v >= 0 for v in seconds.values()), rows)
    steps = [v for l, v in rows if not l.endswith("tiles)") and l != "total"]
    check(abs(sum(steps) - seconds["total"]) < 1e-3, rows)
    stages = [v for l, v in rows if l.endswith("tiles)")]
    check(sum(stages) <= seconds["running stats"] + 1e-3, rows)
    # Without the option: no table. A whole plan: one tile.
    p = run_ok(env, "--op", "stats", "--sample-size", SAMPLE_SIDE, "-q")
    check(b"diagnostics" not in p.stderr, p.stderr)
    rows = diagnostics_table(run_ok(env, "--op", "stats", "--sample-size", 100,
                                    "--diagnostics", "-q").stderr)
    check([r[0] for r in rows][4:8] == ["running stats", "read (1 tile)", "compute (1 tile)",
                                        "write (1 tile)"], rows)
    # A file run whose stages overlap: each stage counted whole, for every tile; each alone
    # within the step's wall time, together beyond it when they overlap.
    src = env.make(env.path("diag.tif"), "--width", 768, "--height", 768, "--bands", 2,
                   "--block", 256)
    p = run_ok(env, "--op", "focal-mean", "-i", src, "-o", env.path("diag-out.tif"),
               "--budget", "1M", "--diagnostics")
    check(b"overlapped" in p.stdout, p.stdout)
    rows = diagnostics_table(p.stderr)
    seconds = dict(rows)
    running = seconds["running focal-mean"]
    stages = [(l, v) for l, v in rows if l.endswith("tiles)")]
    check(len(stages) == 3 and len({l.split(" (")[1] for l, _ in stages}) == 1, stages)
    check(all(v <= running + 1e-3 for _, v in stages), rows)
    head = [l for l in tool_stderr(p.stderr).decode().splitlines() if "running focal-mean" in l]
    check(len(head) == 1 and len(head[0].split()) == 4, head)  # label (2 words), seconds, cores


@case
def sample_stats_follow_the_plan(env):
    px = sample_pixels()
    for budget in ("auto", SAMPLE_BUDGET):
        out, plan, last = sample_run(env, "stats", budget)
        if budget == "auto":
            # A whole plan is one tile of every band, on the sample as on a file.
            check(last.endswith("tile 1/1 (100%)"), last)
        else:
            check(plan.startswith("tiled, 4 tiles of 512 x 512 (halo 0), 1 band(s) per pass"),
                  plan)
            check(last.endswith("tile 16/16 (100%)"), last)  # 4 tiles of each of 4 bands
        rows = stats_rows(out.encode())
        check(sorted(rows) == [1, 2, 3, 4], out)
        for b in range(SAMPLE_BANDS):
            vs = [v for v in px[b] if not is_nan(v)]
            mean = sum(vs) / len(vs)
            std = (sum((v - mean) ** 2 for v in vs) / len(vs)) ** 0.5
            count, lo, hi, m, s = rows[b + 1]
            check(count == len(vs) and lo == min(vs) and hi == max(vs),
                  (budget, b + 1, rows[b + 1], len(vs), min(vs), max(vs)))
            check(rel_close(m, mean, 1e-5) and rel_close(s, std, 1e-5), (budget, rows[b + 1]))


def sample_band_op_follows_the_plan(env, op, halo, *checks):
    """A per-band raster op on the sample: one tile of every band (auto), or 6 tiles of 256 x 512
    for each band (tiled)."""
    for budget in ("auto", SAMPLE_BUDGET):
        out, plan, last = sample_run(env, op, budget)
        for want in checks:
            check(want in out, "%r not in %r" % (want, out))
        if budget == "auto":
            check(last.endswith("tile 1/1 (100%)"), last)  # one tile of every band
        else:
            check(plan.startswith("tiled, 6 tiles of 256 x 512 (halo %d), 1 band(s) per pass" %
                                  halo), plan)
            # 6 tiles in each of 4 one-band passes, as the plan says (and as a file goes).
            check(last.endswith("tile 24/24 (100%)"), last)


@case
def sample_rescale_follows_the_plan(env):
    valid = [v for b in sample_pixels() for v in b if not is_nan(v)]
    sample_band_op_follows_the_plan(
        env, "rescale", 0, "op          rescale: [%s, %s] -> [0, 1] as float32" % (
            repr(min(valid)).rstrip("0").rstrip("."), repr(max(valid)).rstrip("0").rstrip(".")))


@case
def sample_focal_mean_follows_the_plan(env):
    sample_band_op_follows_the_plan(env, "focal-mean", 1)


@case
def memory_history_of_a_focal_mean_run(env):
    # --memory-history writes PyTorch's snapshot pickle of the run: segments whose blocks tile
    # them, and a trace where every alloc is freed (the run frees what it allocated).
    import pickle

    # --device gpu: the sample moves into pool memory and the op computes there (on the host
    # emulator, on its emulated device): the trace holds the input's and the output's blocks,
    # and the run has freed them all.
    snap_path = env.path("snap.pickle")
    p = env.run(env.vsr_run, "--op", "focal-mean", "--sample-size", str(SAMPLE_SIDE), "--budget",
                SAMPLE_BUDGET, "--device", "gpu", "-q", "--memory-history", snap_path)
    check(p.returncode == 0, "exit %d: %r" % (p.returncode, p.stderr))
    with open(snap_path, "rb") as f:
        snap = pickle.load(f)
    live = set()
    for seg in snap["segments"]:
        check(sum(b["size"] for b in seg["blocks"]) == seg["total_size"], "blocks tile: %r" % seg)
        live |= {b["address"] for b in seg["blocks"] if b["state"] == "active_allocated"}
    trace = snap["device_traces"][0]
    actions = [e["action"] for e in trace]
    check(actions.count("alloc") >= 2, "the input's and the output's blocks: %r" % actions[:20])
    state = {}
    for e in trace:
        if e["action"] == "alloc":
            check(e["addr"] not in state, "an address allocated twice")
            state[e["addr"]] = "live"
            check(e["user_metadata"] == "raster", "the library's own blocks: %r" % e)
        elif e["action"] == "free_requested":
            check(state.get(e["addr"]) == "live", "a free of a live block")
            state[e["addr"]] = "requested"
        elif e["action"] == "free_completed":
            check(state.pop(e["addr"], None) == "requested", "a completed free")
    check(not state, "the run freed every block: %r" % state)
    before = open(snap_path, "rb").read()
    p = env.run(env.vsr_run, "--op", "stats", "--sample-size", "64", "--memory-history",
                snap_path)
    expect_exit(p, 2, "an existing --memory-history file without --overwrite")
    check(b"exists" in p.stderr, p.stderr)
    check(open(snap_path, "rb").read() == before, "the existing file is kept")
    run_ok(env, "--op", "stats", "--sample-size", "64", "-q", "--memory-history", snap_path,
           "--overwrite")
    missing = env.path("missing-dir/snap.pickle")
    p = env.run(env.vsr_run, "--op", "stats", "--sample-size", "64", "-q", "--memory-history",
                missing)
    # Refused before the run, as a bad output is (cli_output_tests.py has the other targets).
    expect_exit(p, 2, "--memory-history into a missing directory")
    check(not os.path.exists(os.path.dirname(missing)), "nothing written")


@case
def sample_ndvi_follows_the_plan(env):
    for budget in ("auto", SAMPLE_BUDGET):
        out, plan, last = sample_run(env, "ndvi", budget)
        check("input       sample, 4 x 600 x 600 float32" in out, out)
        if budget == "auto":
            check(plan.startswith("whole, 2 band(s) per pass"), plan)
            check(last.endswith("tile 1/1 (100%)"), last)
        else:
            check(plan.startswith("tiled, 9 tiles of 256 x 256 (halo 0), 2 band(s) per pass"), plan)
            check(last.endswith("tile 9/9 (100%)"), last)


@case
def band_selection_and_per_band_nodata(env):
    # A VRT stack of two GeoTIFFs whose bands have nodata -1 and -2 (GTiff holds one per file).
    W, H = 40, 30
    one = env.make(env.path("one.tif"), "--width", W, "--height", H, "--value", "list:-1,5,7,-2",
                   "--nodata", "-1")
    two = env.make(env.path("two.tif"), "--width", W, "--height", H, "--value", "list:-2,-1,3,9,4",
                   "--nodata", "-2")
    vrt = env.path("stack.vrt")
    with open(vrt, "w") as f:
        f.write('<VRTDataset rasterXSize="%d" rasterYSize="%d">' % (W, H))
        for i, (path, nd) in enumerate(((one, -1), (two, -2)), 1):
            f.write('<VRTRasterBand dataType="Float32" band="%d"><NoDataValue>%d</NoDataValue>'
                    '<SimpleSource><SourceFilename relativeToVRT="0">%s</SourceFilename>'
                    '<SourceBand>1</SourceBand></SimpleSource></VRTRasterBand>' % (i, nd, path))
        f.write('</VRTDataset>')
    px = [env.dump(one)["pixels"][0], env.dump(two)["pixels"][0]]
    nds = [-1.0, -2.0]
    doc = json.loads(run_ok(env, "--op", "stats", "-i", vrt, "--allow-virtual", "-b", "2", "-b",
                            "1", "--json").stdout)
    check([r["band"] for r in doc["bands"]] == [2, 1], doc)
    for row, k in zip(doc["bands"], (1, 0)):
        vs = [v for v in px[k] if v != nds[k]]
        check(row["count"] == len(vs) and row["min"] == min(vs) and row["max"] == max(vs), row)
        check(row["nodata"] == str(int(nds[k])), row)
    # Per-band ops keep each band's nodata: focal-mean's output nodata is NaN for both.
    out = env.path("f.tif")
    run_ok(env, "--op", "focal-mean", "-i", vrt, "--allow-virtual", "-o", out, "-q")
    f = env.dump(out)
    for k in range(2):
        want = py_focal(px[k], H, W, nds[k], "nearest")
        check(all(rel_close(g, w_) for g, w_ in zip(f["pixels"][k], want)), "focal band %d" % k)
    # clip keeps -1 and -2: GTiff cannot hold both, HFA can.
    p = env.run(env.vsr_run, "--op", "clip", "-i", vrt, "--allow-virtual", "--range", "0,6",
                "-o", env.path("c.tif"))
    expect_exit(p, 1, "clip of mixed nodata into GTiff")
    check(b"one nodata" in p.stderr, p.stderr)
    check(not os.path.exists(env.path("c.tif")), "no partial output")
    out = env.path("c.img")
    run_ok(env, "--op", "clip", "-i", vrt, "--allow-virtual", "--range", "0,6", "-o", out, "-q")
    c = env.dump(out)
    check(c["driver"] == "HFA" and [b["nodata"] for b in c["band_info"]] == nds, c["band_info"])
    for k in range(2):
        check(c["pixels"][k] == [v if v == nds[k] else min(max(v, 0), 6) for v in px[k]],
              "clip band %d" % k)
    # One band selected: GTiff is fine.
    run_ok(env, "--op", "clip", "-i", vrt, "--allow-virtual", "-b", "2", "--range", "0,6", "-o",
           env.path("c2.tif"), "-q")
    c2 = env.dump(env.path("c2.tif"))
    check(c2["bands"] == 1 and c2["band_info"][0]["nodata"] == -2.0, c2["band_info"])
    # The normalized difference takes each band's own nodata.
    run_ok(env, "--op", "normalized-difference", "-i", vrt, "--allow-virtual", "--nir", "2",
           "--red", "1", "-o", env.path("nd.tif"), "-q")
    nd = env.dump(env.path("nd.tif"))["pixels"][0]
    for a, b, g in zip(px[1], px[0], nd):
        if a != -2 and b != -1 and a + b != 0:
            check(rel_close(g, (a - b) / (a + b)), (a, b, g))
        else:
            check(is_nan(g), (a, b, g))
    # Histograms, fills and conversions per band too: each band's own nodata is left out, and an
    # integer --ot output takes each band's nodata (HFA holds one per band).
    doc = json.loads(run_ok(env, "--op", "histogram", "-i", vrt, "--allow-virtual", "--bins", 4,
                            "--json").stdout)
    for row, k in zip(doc["bands"], (0, 1)):
        vs = [v for v in px[k] if v != nds[k]]
        check(row["range"] == [min(vs), max(vs)] and
              row["counts"] == np_hist(vs, 4, min(vs), max(vs), True)[1], row)
    run_ok(env, "--op", "fill-nodata", "--value", "0", "-i", vrt, "--allow-virtual", "-o",
           env.path("fill.tif"), "-q")
    fl = env.dump(env.path("fill.tif"))
    for k in range(2):
        check(fl["pixels"][k] == [0.0 if v == nds[k] else v for v in px[k]], "fill band %d" % k)
    run_ok(env, "--op", "focal-mean", "--ot", "int16", "-i", vrt, "--allow-virtual", "-o",
           env.path("fi.img"), "-q")
    fi = env.dump(env.path("fi.img"))
    check([b["nodata"] for b in fi["band_info"]] == nds, fi["band_info"])
    for k in range(2):
        want = py_focal(px[k], H, W, nds[k], "nearest")
        check(fi["pixels"][k] == [nds[k] if is_nan(w_) else convert_like_gdal(w_, "int16")
                                  for w_ in want], "focal int16 band %d" % k)
    p = env.run(env.vsr_run, "--op", "stats", "-i", vrt, "--allow-virtual", "-b", "3")
    expect_exit(p, 2, "-b 3 of a 2-band file")


@case
def output_control(env):
    src = env.make(env.path("in.tif"), "--width", 64, "--height", 48, "--bands", 2)
    out = env.path("o.tif")
    run_ok(env, "--op", "focal-mean", "-i", src, "-o", out, "-q")
    check(env.dump(out)["compression"] == "DEFLATE", "default compression")
    before = digest(out)
    p = env.run(env.vsr_run, "--op", "clip", "--range", "0,1", "-i", src, "-o", out)
    expect_exit(p, 2, "an existing output without --overwrite")
    check(b"--overwrite" in p.stderr and digest(out) == before, p.stderr)
    run_ok(env, "--op", "focal-mean", "-i", src, "-o", out, "--overwrite", "--co", "COMPRESS=LZW",
           "--co=PREDICTOR=2", "--threads", "2", "-q")
    check(env.dump(out)["compression"] == "LZW", "--co COMPRESS=LZW")
    run_ok(env, "--op", "focal-mean", "-i", src, "-o", env.path("o.img"), "-q")
    check(env.dump(env.path("o.img"))["driver"] == "HFA", ".img is HFA")
    run_ok(env, "--op", "focal-mean", "-i", src, "-o", env.path("o.bin"), "-of", "ENVI", "-q")
    check(env.dump(env.path("o.bin"))["driver"] == "ENVI", "-of ENVI")
    p = env.run(env.vsr_run, "--op", "focal-mean", "-i", src, "-o", env.path("o.nosuchext"))
    expect_exit(p, 2, "an unknown extension")
    check(b"-of" in p.stderr, p.stderr)
    p = env.run(env.vsr_run, "--op", "focal-mean", "-i", src, "-o", env.path("x.tif"), "--co",
                "NOEQUALS")
    expect_exit(p, 2, "--co without =")
    # Options the driver refuses are usage errors before anything is read or written (GDAL
    # alone warns and writes with its defaults: COMPRESS=BOGUS gave an uncompressed file).
    for args, says in [(["--co", "COMPRESS=BOGUS"], b"'BOGUS' is an unexpected value for COMPRESS"),
                       (["--co", "NOSUCHOPTION=1"], b"NOSUCHOPTION"),
                       (["-of", "HFA", "--co", "COMPRESS=LZW"], b"HFA driver refuses"),
                       (["-of", "NoSuchDriver"], b"unknown GDAL driver 'NoSuchDriver'")]:
        p = env.run(env.vsr_run, "--op", "focal-mean", "-i", src, "-o", env.path("bad.tif"),
                    *args)
        expect_exit(p, 2, "vsr-run %r" % (args,))
        check(says in p.stderr and b"usage" not in p.stderr.lower()[:5], p.stderr)
        check(not os.path.exists(env.path("bad.tif")), "no output for %r" % (args,))
        check(b"throughput" not in p.stdout, "nothing was computed for %r" % (args,))
    p = env.run(env.vsr_run, "--op", "stats", "-i", src, "--bins", "4")
    expect_exit(p, 2, "--bins for stats")


@case
def metadata_kept(env):
    src = env.make(env.path("in.tif"), "--width", 50, "--height", 40, "--bands", 2, "--metadata")
    d = env.dump(src)
    run_ok(env, "--op", "focal-mean", "-i", src, "-o", env.path("f.tif"), "-q")
    f = env.dump(env.path("f.tif"))
    check(f["area_or_point"] == "Point" and f["geotransform"] == d["geotransform"], f)
    for bi, bo in zip(d["band_info"], f["band_info"]):
        for key in ("scale", "offset", "unit", "description", "color"):
            check(bi[key] == bo[key], (key, bi, bo))
    run_ok(env, "--op", "rescale", "-i", src, "-o", env.path("r.tif"), "-q")
    r = env.dump(env.path("r.tif"))
    check(r["area_or_point"] == "Point", r)
    for bi, bo in zip(d["band_info"], r["band_info"]):
        check(bo["description"] == bi["description"] and bo["color"] == bi["color"], bo)
        check(bo["scale"] == 1 and bo["offset"] == 0 and bo["unit"] == "", bo)
    bare = env.make(env.path("bare.tif"), "--width", 20, "--height", 10, "--no-geotransform")
    run_ok(env, "--op", "focal-mean", "-i", bare, "-o", env.path("b.tif"), "-q")
    check(env.dump(env.path("b.tif"))["geotransform"] is None, "no geotransform in, none out")


@case
def odd_data_answers(env):
    inf = env.make(env.path("inf.tif"), "--width", 8, "--height", 8, "--dtype", "float64",
                   "--value", "list:1,2,inf,3")
    for op in ("rescale", "histogram"):
        p = env.run(env.vsr_run, "--op", op, "-i", inf, *(["-o", env.path("x.tif")]
                                                          if op == "rescale" else []))
        expect_exit(p, 1, op + " over infinities")
        text = strict_text(p.stderr, "error")
        check("infinite" in text and ("--in-range" if op == "rescale" else "--range") in text,
              text)
    run_ok(env, "--op", "rescale", "-i", inf, "--in-range", "1,3", "-o", env.path("x.tif"), "-q")
    got = env.dump(env.path("x.tif"))["pixels"][0]
    check(got[:4] == [0.0, 0.5, 1.0, 1.0], got[:4])  # inf clamped to the input range
    const = env.make(env.path("c.tif"), "--width", 8, "--height", 8, "--value", "const:5",
                     "--nodata", "-1", "--nodata-every", 5)
    p = run_ok(env, "--op", "rescale", "-i", const, "--out-range", "10,20", "-o",
               env.path("cr.tif"))
    check(b"constant raster" in p.stdout, p.stdout)
    got = env.dump(env.path("cr.tif"))["pixels"][0]
    check(all(g == 10.0 or is_nan(g) for g in got) and got.count(10.0) > 0, got)
    for bad in (["--op", "ndvi", "--nir", "1", "--red", "1"],
                ["--op", "rescale", "--in-range", "3,3"],
                ["--op", "clip"], ["--op", "fill-nodata"], ["--op", "focal-mean", "--edge", "x"],
                ["--op", "rescale", "--ot", "complex64"]):
        p = env.run(env.vsr_run, "-i", const, *bad)
        expect_exit(p, 2, " ".join(bad))


@case
def stats_json_progress_quiet(env):
    src = env.make(env.path("in.tif"), "--width", 600, "--height", 300, "--dtype", "float64",
                   "--value", "list:0.1,0.2,0.30000000000000004,1e-300,12345.678901234567")
    p = run_ok(env, "--op=stats", "--input=" + src, "--json", "-q")
    doc = json.loads(p.stdout)
    check(doc["bands"][0]["min"] == 1e-300 and doc["bands"][0]["max"] == 12345.678901234567, doc)
    check(tool_stderr(p.stderr) == b"", "quiet: nothing on stderr")
    out = env.path("s.json")
    p = run_ok(env, "--op", "stats", "-i", src, "-o", out)
    check(b"vsr-run summary" in p.stdout and json.load(open(out))["bands"][0]["count"] == 180000,
          p.stdout)
    p = run_ok(env, "--op", "histogram", "-i", src, "-o", env.path("h.json"), "--bins", "3",
               "-q")
    check(p.stdout == b"" and sum(json.load(open(env.path("h.json")))["bands"][0]["counts"]) ==
          180000, p.stdout)
    # --progress (not a terminal): one line per tile of each pass; 600 x 300 with 100K: 256 x 256
    # tiles, 2 x 3 of them.
    p = run_ok(env, "--op", "focal-mean", "-i", src, "-o", env.path("f.tif"), "--budget",
               "100K", "--progress")
    lines = [l for l in tool_stderr(p.stderr).decode().splitlines() if l.startswith("[vsr-run]")]
    check(len(lines) == 6 and lines[-1].endswith("tile 6/6 (100%)"), lines)
    p = run_ok(env, "--op", "focal-mean", "-i", src, "-o", env.path("g.tif"), "--budget",
               "100K", "--progress", "-q")
    check(p.stdout == b"" and tool_stderr(p.stderr) == b"", "-q silences progress and summary")


# --- outputs that cannot be written, host memory, stale temporaries ------------------------------

def entries(env):
    return sorted(os.listdir(env.tmp))


def temporaries(env, name):
    """The hidden temporaries of writes to `name` in the case's directory (any naming)."""
    stem = name.rsplit(".", 1)[0]
    return [n for n in os.listdir(env.tmp)
            if n.startswith("." + name + ".vsr-") or n.startswith("." + stem + ".vsr-")]


@case
def output_format_without_a_file_is_refused(env):
    # -of MEM renamed its still-empty temporary file over the target: the input, written in place,
    # became 0 bytes; a new target appeared as a 0-byte file.
    src = env.make(env.path("in.tif"), "--width", 64, "--height", 48, "--nodata", "-9999")
    before = digest(src)
    # (PNG, refused here as "no Create" before, is written through a staged GeoTIFF now.)
    for fmt, says in (("MEM", b"writes no file"), ("mem", b"writes no file"),
                      ("NGW", b"not to a file")):
        for target, extra in ((src, ["--overwrite"]), (env.path("new.tif"), [])):
            p = env.run(env.vsr_run, "--op", "focal-mean", "-i", src, "-of", fmt, "-o", target,
                        *extra)
            expect_exit(p, 2, "-of %s -o %s" % (fmt, os.path.basename(target)))
            text = strict_text(p.stderr, "error")
            check(says in p.stderr and text.startswith("vsr-run: -of: "), text)
            check(b"throughput" not in p.stdout, "nothing computed for -of %s" % fmt)
            check(digest(src) == before, "-of %s: the input changed" % fmt)
            only_files(env, ["in.tif"], "-of %s -o %s" % (fmt, os.path.basename(target)))


def created_drivers(env, createcopy=False):
    out = subprocess.run([env.raster_tool, "drivers"] + (["--createcopy"] if createcopy else []),
                         check=True, stdout=subprocess.PIPE).stdout
    return json.loads(out)


def same_pixels(ref, got):
    """Whether two dumps hold the same valid pixels where the same pixels are valid (each file's
    own nodata; NaN is invalid)."""
    def invalid(v, nd):
        return is_nan(v) or (nd is not None and not is_nan(nd) and v == nd)
    for br, bg, ir, ig in zip(ref["pixels"], got["pixels"], ref["band_info"], got["band_info"]):
        for r, g in zip(br, bg):
            a, b = invalid(r, ir["nodata"]), invalid(g, ig["nodata"])
            if a != b or (not a and not rel_close(r, g)):
                return False
    return len(ref["pixels"]) == len(got["pixels"])


def each_driver_writes_or_is_refused(env, drivers):
    """Runs three ops into every driver of `drivers`: each either writes a file that reads back
    as the GeoTIFF result, or is refused (exit 2, the reason) before anything is computed or
    written. Returns {driver: [labels of the inputs it wrote]}."""
    inputs = [
        ("f32", ["--width", 40, "--height", 30, "--nodata", "-9999", "--nodata-every", 7],
         ["--op", "clip", "--range", "0,100"]),
        ("nan", ["--width", 40, "--height", 30, "--nodata", "-9999", "--nodata-every", 7],
         ["--op", "focal-mean"]),
        ("u8", ["--width", 40, "--height", 30, "--bands", 3, "--dtype", "uint8", "--nodata", 0,
                "--nodata-every", 5], ["--op", "clip", "--range", "10,200"]),
    ]
    written = {}
    for label, make, op in inputs:
        src = env.make(env.path(label + ".tif"), *make)
        ref = env.path(label + "-ref.tif")
        run_ok(env, *op, "-i", src, "-o", ref, "-q")
        want = env.dump(ref)
        for d in drivers:
            name = d["name"]
            sub = os.path.join(env.tmp, label + "-" + name)
            os.mkdir(sub)
            out = os.path.join(sub, "o." + (d["extension"] or "out"))
            p = env.run(env.vsr_run, *op, "-i", src, "-of", name, "-o", out, "-q")
            if p.returncode == 0:
                got = env.dump(out)
                # COG only writes: its files are GeoTIFFs.
                check(got["driver"] == ("GTiff" if name == "COG" else name) and
                      same_pixels(want, got),
                      "%s %s: the file does not read back as the result" % (label, name))
                written.setdefault(name, []).append(label)
            else:
                expect_exit(p, 2, "%s -of %s" % (label, name))
                check(b"vsr-run: -of: " in p.stderr and name.encode() in p.stderr,
                      "%s -of %s: %r" % (label, name, p.stderr))
                check(os.listdir(sub) == [], "%s -of %s left %s" % (label, name, os.listdir(sub)))
            check(not [n for n in os.listdir(sub) if ".vsr-" in n], "a temporary is left")
    return written


@case
def every_create_driver_writes_or_is_refused_up_front(env):
    # -of GPKG always failed: the temporary file existed before the driver ran, and GPKG refuses
    # to create over a file.
    written = each_driver_writes_or_is_refused(env, created_drivers(env))
    # GeoPackage takes 1 band of float32 and 3 bands of uint8 as RGBA only.
    check(written.get("GPKG") == ["f32", "nan"], "GPKG wrote %r" % written.get("GPKG"))
    for name in ("GTiff", "HFA", "ENVI", "EHdr", "RRASTER", "PCIDSK"):
        check(written.get(name) == ["f32", "nan", "u8"], "%s wrote %r" % (name, written.get(name)))


@case
def every_createcopy_driver_writes_or_is_refused_up_front(env):
    # Drivers with CreateCopy only (COG, PNG, JPEG, ...) were all refused ("no Create"): they are
    # written through a staged GeoTIFF, or refused up front with the driver's reason.
    written = each_driver_writes_or_is_refused(env, created_drivers(env, createcopy=True))
    check(written.get("COG") == ["f32", "nan", "u8"], "COG wrote %r" % written.get("COG"))
    # PNG holds uint8 (and uint16), not float32; JPEG's lossy codec keeps no nodata pixels.
    check(written.get("PNG") == ["u8"], "PNG wrote %r" % written.get("PNG"))
    check("JPEG" not in written, "JPEG wrote %r" % written.get("JPEG"))


# --- COG, PNG, JPEG; overviews -------------------------------------------------------------------

COG_VALIDATOR = "/usr/lib/python3/dist-packages/osgeo_utils/samples/validate_cloud_optimized_geotiff.py"


def validate_cog(path):
    """(exit status, output) of GDAL's validate_cloud_optimized_geotiff.py on `path`, or None when
    /usr/bin/python3 or osgeo_utils is missing."""
    if not (os.access("/usr/bin/python3", os.X_OK) and os.path.exists(COG_VALIDATOR)):
        return None
    p = subprocess.run(["/usr/bin/python3", COG_VALIDATOR, path], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT)
    return p.returncode, p.stdout.decode("utf-8", "replace")


def header(env, path):
    out = subprocess.run([env.raster_tool, "header", path], check=True,
                         stdout=subprocess.PIPE).stdout
    return json.loads(out)


@case
def cog_png_jpeg_and_overviews(env):
    # -of COG, PNG and JPEG were refused (no Create); overviews could not be asked for.
    big = env.make(env.path("big.tif"), "--width", 2000, "--height", 2000, "--block", 256,
                   "--nodata", "-9999", "--nodata-every", 13)
    cog = env.path("cog.tif")
    run_ok(env, "--op", "focal-mean", "-i", big, "-of", "COG", "-o", cog, "-q")
    h = header(env, cog)
    check(h["driver"] == "GTiff" and h["layout"] == "COG" and h["compression"] == "DEFLATE", h)
    check(h["overviews"] == [[1000, 1000], [500, 500], [250, 250]], h["overviews"])
    check(h["band_info"][0]["block"] == [256, 256] and is_nan(h["band_info"][0]["nodata"]), h)
    v = validate_cog(cog)
    if v is not None:
        check(v[0] == 0 and "is a valid cloud optimized GeoTIFF" in v[1] and
              "WARNING" not in v[1] and "ERROR" not in v[1], v)
    # The same pixels as a GeoTIFF run.
    run_ok(env, "--op", "focal-mean", "-i", big, "-o", env.path("ref.tif"), "-q")
    small = env.make(env.path("small.tif"), "--width", 600, "--height", 500, "--nodata", "-1",
                     "--nodata-every", 7)
    run_ok(env, "--op", "clip", "--range", "0,50", "-i", small, "-o", env.path("ref-s.tif"), "-q")
    run_ok(env, "--op", "clip", "--range", "0,50", "-i", small, "-of", "cog", "-o",
           env.path("s-cog.tif"), "-q", "--overviews", "2,4", "--resampling", "average")
    check(header(env, env.path("s-cog.tif"))["overviews"] == [[300, 250], [150, 125]], "2,4")
    check(same_pixels(env.dump(env.path("ref-s.tif")), env.dump(env.path("s-cog.tif"))),
          "COG pixels")
    run_ok(env, "--op", "clip", "--range", "0,50", "-i", small, "-of", "COG", "-o",
           env.path("s-none.tif"), "-q", "--overviews", "none")
    check(header(env, env.path("s-none.tif"))["overviews"] == [], "--overviews none")
    # GTiff and HFA hold them inside, ENVI in an .ovr beside the file.
    for name, ext in (("GTiff", "tif"), ("HFA", "img"), ("ENVI", "envi")):
        out = env.path("ov." + ext)
        run_ok(env, "--op", "clip", "--range", "0,50", "-i", small, "-of", name, "-o", out, "-q",
               "--overviews", "auto", "--overwrite")
        check(header(env, out)["overviews"] == [[300, 250], [150, 125]], name)
        check(os.path.exists(out + ".ovr") == (name == "ENVI"), name + " .ovr")
    # PNG and JPEG, from the output's extension too.
    u8 = env.make(env.path("u8.tif"), "--width", 64, "--height", 48, "--bands", 3, "--dtype",
                  "uint8")
    run_ok(env, "--op", "clip", "--range", "10,200", "-i", u8, "-o", env.path("ref-u8.tif"), "-q")
    run_ok(env, "--op", "clip", "--range", "10,200", "-i", u8, "-o", env.path("o.png"), "-q")
    png = env.dump(env.path("o.png"))
    check(png["driver"] == "PNG" and same_pixels(env.dump(env.path("ref-u8.tif")), png), "PNG")
    check(png["geotransform"] == env.dump(u8)["geotransform"], "PNG georeferencing (.aux.xml)")
    run_ok(env, "--op", "clip", "--range", "10,200", "-i", u8, "-o", env.path("o.jpg"), "-q")
    check(env.dump(env.path("o.jpg"))["driver"] == "JPEG", "JPEG")
    before = entries(env)
    # Refused before anything is computed, nothing left: JPEG with a nodata (lossy), 2 bands,
    # float32 to PNG.
    u8nd = env.make(env.path("u8nd.tif"), "--width", 64, "--height", 48, "--dtype", "uint8",
                    "--nodata", 0, "--nodata-every", 5)
    before = entries(env)
    for args, says in ((["-i", u8nd, "-o", env.path("n.jpg")], b"nodata"),
                       (["-i", u8, "-b", 1, "-b", 2, "-o", env.path("n.jpg")], b"JPEG"),
                       (["-i", small, "-o", env.path("n.png")], b"float32")):
        p = env.run(env.vsr_run, "--op", "clip", "--range", "10,200", *[str(a) for a in args])
        expect_exit(p, 2, " ".join(map(str, args)))
        check(says in p.stderr and b"throughput" not in p.stdout, p.stderr)
        check(entries(env) == before, "left %s" % (set(entries(env)) - set(before)))
    # Usage errors.
    for bad, says in ((["--overviews", "1"], b"below 2"), (["--overviews", "2,x"], b"factors"),
                      (["--overviews", "2,2"], b"twice"),
                      (["--resampling", "bogus", "--overviews", "auto"], b"unknown resampling"),
                      (["--resampling", "average"], b"no overviews"),
                      (["--resampling", "average", "--overviews", "none", "-of", "COG"],
                       b"no overviews")):
        p = env.run(env.vsr_run, "--op", "clip", "--range", "0,1", "-i", small, "-o",
                    env.path("u.tif"), *bad)
        expect_exit(p, 2, " ".join(bad))
        check(says in p.stderr, (bad, p.stderr))
    p = env.run(env.vsr_run, "--op", "stats", "-i", small, "--overviews", "auto")
    expect_exit(p, 2, "--overviews for stats")
    check(entries(env) == before, "left %s" % (set(entries(env)) - set(before)))


@case
def failed_write_leaves_nothing_with_any_driver(env):
    # A write that fails late (after the whole computation), whatever the driver: files may not
    # grow past 256 KiB (RLIMIT_FSIZE, SIGXFSZ ignored: a full disk as far as GDAL can tell).
    # -of netCDF once exited 1 and left a 2 MB file; COG, PNG and JPEG go through a staged
    # GeoTIFF, which is what fails here.
    limit = 256 * 1024
    f32 = env.make(env.path("f32.tif"), "--width", 1024, "--height", 1024, "--block", 256,
                   "--nodata", "-9999", "--nodata-every", 7)
    u8 = env.make(env.path("u8.tif"), "--width", 1024, "--height", 1024, "--block", 256,
                  "--bands", 3, "--dtype", "uint8", "--value", "list:3,200,17,90,255,1,64")
    inputs = {"f32": f32, "u8": u8}
    old = env.path("old.out")
    with open(old, "wb") as f:
        f.write(b"old output")
    for name, label, ext in (("GTiff", "f32", "tif"), ("COG", "f32", "tif"), ("PNG", "u8", "png"),
                             ("JPEG", "u8", "jpg"), ("netCDF", "f32", "nc"), ("HFA", "f32", "img"),
                             ("ENVI", "f32", "envi"), ("GPKG", "f32", "gpkg")):
        src = inputs[label]
        op = ["--op", "clip", "--range", "1,250"]
        for target in (env.path("new." + ext), old):
            before = entries(env)
            p = subprocess.run([env.vsr_run] + op + ["-i", src, "-of", name, "-o", target,
                                "--overwrite", "--budget", "300K"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               preexec_fn=limited_file_size(limit, True))
            expect_exit(p, 1, "-of %s with a full disk" % name)
            strict_text(p.stderr, "error")
            check(entries(env) == before, "-of %s -> %s left %s" % (
                name, os.path.basename(target), sorted(set(entries(env)) - set(before))))
            with open(old, "rb") as f:
                check(f.read() == b"old output", "-of %s: the old output changed" % name)
    # A signal while the staged GeoTIFF is written: the handler removes it with the rest.
    big = env.make(env.path("big.tif"), "--width", 4096, "--height", 4096, "--block", 256,
                   "--sparse", "--nodata", "-9999")
    before = entries(env)
    rc = interrupted_run(env, signal.SIGINT, ["--op", "focal-mean", "--input", big, "-of", "COG",
                                              "--output", env.path("c.tif"), "--budget", "100K"])
    check(rc == -signal.SIGINT, "exit status %d, expected death by SIGINT" % rc)
    check(entries(env) == before, "SIGINT during a COG write left %s" % (
        sorted(set(entries(env)) - set(before))))


@case
def unavailable_gtiff_is_named_as_such(env):
    # GDAL_SKIP=GTiff said "--co: write_raster: unknown GDAL driver 'GTiff'" with no --co given.
    src = env.make(env.path("in.tif"), "--width", 16, "--height", 16)
    for extra, option in (([], b"vsr-run: --output: "), (["-of", "GTiff"], b"vsr-run: -of: ")):
        p = env.run(env.vsr_run, "--op", "focal-mean", "-i", env.path("in.tif"), "-o",
                    env.path("o.tif"), *extra, env={"GDAL_SKIP": "GTiff"})
        expect_exit(p, 2, "GDAL_SKIP=GTiff %r" % extra)
        text = strict_text(p.stderr, "error")
        check(p.stderr.startswith(option) and b"--co" not in p.stderr and
              b"not available in this GDAL" in p.stderr and b"GDAL_SKIP" in p.stderr, text)
    # Creation options are still blamed when they are the fault.
    p = env.run(env.vsr_run, "--op", "focal-mean", "-i", src, "-o", env.path("o.tif"), "--co",
                "COMPRESS=BOGUS")
    expect_exit(p, 2, "--co COMPRESS=BOGUS")
    check(p.stderr.startswith(b"vsr-run: --co: "), p.stderr)
    only_files(env, ["in.tif"], "refusals")


def killed_run(env, args):
    """Starts vsr-run as interrupted_run does and SIGKILLs it after its first progress line."""
    return interrupted_run(env, signal.SIGKILL, args)


@case
def sigkilled_temporary_is_removed_by_the_next_write(env):
    src = env.make(env.path("in.tif"), "--width", 4096, "--height", 4096, "--block", 256,
                   "--sparse", "--nodata", "-9999")
    before = digest(src)
    out = env.path("out.tif")
    args = ["--op", "focal-mean", "--input", src, "--output", out, "--budget", "100K"]
    rc = killed_run(env, args)
    check(rc == -signal.SIGKILL, "exit status %d" % rc)
    check(temporaries(env, "out.tif"), "SIGKILL left no temporary: %s" % entries(env))
    # In place too: the input's stale temporary.
    rc = killed_run(env, ["--op", "focal-mean", "--input", src, "--output", src, "--budget",
                          "100K"])
    check(rc == -signal.SIGKILL and temporaries(env, "in.tif"), entries(env))
    check(digest(src) == before, "the input changed")
    # The next write to out.tif (A, which then waits on its stderr pipe, alive) removes the dead
    # run's temporary; B, writing out.tif meanwhile, never removes A's live one.
    dead = set(temporaries(env, "out.tif"))
    live = subprocess.Popen([env.vsr_run] + args + ["--progress", "--overwrite"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        fcntl.fcntl(live.stderr.fileno(), fcntl.F_SETPIPE_SZ, 4096)
        line = live.stderr.readline()
        while line and not line.startswith(b"[vsr-run]") and tool_stderr(line) == b"":
            line = live.stderr.readline()
        check(line.startswith(b"[vsr-run]"), "live run: %r" % line)
        mine = set(temporaries(env, "out.tif"))
        check(len(mine) == 1 and not mine & dead, "A removed the dead temporary %s: %s" % (
            dead, entries(env)))
        small = env.make(env.path("small.tif"), "--width", 32, "--height", 32)
        run_ok(env, "--op", "focal-mean", "-i", small, "-o", out, "--overwrite", "-q")
        check(set(temporaries(env, "out.tif")) == mine, "B kept A's temporary: %s" % entries(env))
        check(env.dump(out)["width"] == 32, "B's output")
    finally:
        live.send_signal(signal.SIGTERM)
        live.wait(timeout=60)
        live.stderr.close()
    check(live.returncode == -signal.SIGTERM, "live run: %d" % live.returncode)
    check(temporaries(env, "out.tif") == [], "SIGTERM removed A's own temporary")
    # The in-place run's stale temporary goes with the next write of the input.
    run_ok(env, "--op", "clip", "--range", "0,1", "-i", small, "-o", src, "--overwrite", "-q")
    only_files(env, ["in.tif", "out.tif", "small.tif"], "after the writes")


BIG_VRT = """<VRTDataset rasterXSize="1000000000" rasterYSize="1000000000">
  <VRTRasterBand dataType="Float32" band="1">
    <SimpleSource><SourceFilename relativeToVRT="1">small.tif</SourceFilename>
      <SourceBand>1</SourceBand><SrcRect xOff="0" yOff="0" xSize="64" ySize="64"/>
      <DstRect xOff="0" yOff="0" xSize="64" ySize="64"/></SimpleSource>
  </VRTRasterBand>
</VRTDataset>
"""


@case
def host_memory_is_checked_up_front(env):
    # The sample of 256 bands of 65536 x 65536 was a bare "std::bad_alloc".
    p = env.run(env.vsr_run, "--sample-size", "65536", "--bands", "256")
    expect_exit(p, 1, "a 4 TiB sample")
    text = strict_text(p.stderr, "error")
    check(b"bad_alloc" not in p.stderr and "host memory" in text and "4.00 TiB" in text and
          "available" in text, text)
    # --host-memory bounds the sample and the histograms too (it bounded file passes only).
    p = env.run(env.vsr_run, "--sample-size", "1024", "--host-memory", "4M")
    expect_exit(p, 1, "a 16 MiB sample under --host-memory 4M")
    check(b"allowed (--host-memory)" in p.stderr and b"3.81 MiB" in p.stderr, p.stderr)
    src = env.make(env.path("small.tif"), "--width", 64, "--height", 64)
    p = env.run(env.vsr_run, "--op", "histogram", "-i", src, "--bins", "1000000",
                "--host-memory", "20M", "-o", env.path("h.json"))
    expect_exit(p, 1, "a million bins under --host-memory 20M")
    check(b"1000000 bins" in p.stderr and b"allowed (--host-memory)" in p.stderr, p.stderr)
    check(not os.path.exists(env.path("h.json")), "no output")
    # Stats of a 10^9 x 10^9 VRT over a 64 x 64 file: the tile list (6e10 tiles) was allocated
    # before the first tile. Now the tiles stream: the first one is done, and the run is stopped.
    with open(env.path("big.vrt"), "w") as f:
        f.write(BIG_VRT)
    p = subprocess.Popen([env.vsr_run, "--op", "stats", "-i", env.path("big.vrt"),
                          "--allow-virtual", "--progress"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    try:
        line = p.stderr.readline()
        while line and not line.startswith(b"[vsr-run]") and tool_stderr(line) == b"":
            line = p.stderr.readline()
        check(line.startswith(b"[vsr-run] stats: tile 1/"), "first line %r" % line)
    finally:
        p.kill()
        p.wait()
        p.stderr.close()


@case
def failed_allocation_is_named(env):
    # An allocation that fails all the same (here: an address-space limit below what the
    # up-front check allows) is a host-memory error naming what was being made.
    if env.sanitized:
        raise Skip("a sanitizer's shadow memory needs more address space than the limit")
    limit = 1536 * MiB

    def setup():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    p = subprocess.run([env.vsr_run, "--sample-size", "16384", "--bands", "2", "--host-memory",
                        "1T"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=setup,
                       env=dict(os.environ, VIBESPATIAL_CUDA_DRIVER=env.path("no-driver.so")))
    expect_exit(p, 1, "a 2 GiB sample in 1.5 GiB of address space")
    text = strict_text(p.stderr, "error")
    check("std::bad_alloc" not in text and "out of host memory while making the sample raster"
          in text, text)


@case
def output_attacks(env):
    src = env.make(env.path("in.tif"), "--width", 64, "--height", 48, "--nodata", "-9999")
    before = digest(src)
    # A FIFO as output: never replaced by a file (its reader would wait forever), refused
    # before anything is computed.
    fifo = env.path("pipe.tif")
    os.mkfifo(fifo)
    for op, extra in (("focal-mean", []), ("stats", [])):
        p = env.run(env.vsr_run, "--op", op, "-i", src, "-o", fifo, "--overwrite", *extra)
        expect_exit(p, 2, "%s -o FIFO" % op)
        check(b"not a regular file" in p.stderr and b"throughput" not in p.stdout, p.stderr)
        check(stat_is_fifo(fifo), "the FIFO is still a FIFO")
    os.unlink(fifo)
    # A directory that takes no temporary (read-only): refused before any work, nothing left.
    ro = "/proc/vsr-out.tif" if os.geteuid() == 0 else None
    if ro is None:
        rodir = env.path("ro")
        os.mkdir(rodir)
        os.chmod(rodir, 0o555)
        ro = os.path.join(rodir, "o.tif")
    for op in ("focal-mean", "stats"):
        p = env.run(env.vsr_run, "--op", op, "-i", src, "-o", ro)
        expect_exit(p, 2, "%s into a read-only directory" % op)
        check(b"cannot create a temporary directory" in p.stderr and
              b"throughput" not in p.stdout, p.stderr)
    # A symbolic link to the input: written in place through it (the link stays a link).
    link = env.path("link.tif")
    os.symlink("in.tif", link)
    p = env.run(env.vsr_run, "--op", "clip", "--range", "0,1", "-i", src, "-o", link)
    expect_exit(p, 2, "a link to the input without --overwrite")
    check(digest(src) == before, "the input changed")
    run_ok(env, "--op", "clip", "--range", "0,1", "-i", src, "-o", link, "--overwrite", "-q")
    check(os.path.islink(link) and env.dump(src)["band_info"][0]["nodata"] == -9999 and
          max(v for v in env.dump(src)["pixels"][0] if v != -9999) <= 1, "clipped in place")
    os.unlink(link)
    # -of in any case is the driver: "gtiff" gets GTiff's defaults (DEFLATE, tiles).
    run_ok(env, "--op", "focal-mean", "-i", src, "-of", "gtiff", "-o", env.path("lc.tif"), "-q")
    d = env.dump(env.path("lc.tif"))
    check(d["driver"] == "GTiff" and d["compression"] == "DEFLATE" and
          d["band_info"][0]["block"] == [256, 256], d["compression"])
    # Two runs on one target at once: each writes all or nothing, the last rename wins, no
    # temporary is left.
    big = env.make(env.path("big.tif"), "--width", 1024, "--height", 1024)
    procs = [subprocess.Popen([env.vsr_run, "--op", op, "-i", big, "-o", env.path("same.tif"),
                               "--overwrite", "--budget", "100K", "-q"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for op in ("focal-mean", "rescale")]
    for q in procs:
        q.communicate(timeout=300)
        check(q.returncode == 0, "concurrent run: %d" % q.returncode)
    got = env.dump(env.path("same.tif"))
    refs = []
    for op in ("focal-mean", "rescale"):
        run_ok(env, "--op", op, "-i", big, "-o", env.path(op + ".tif"), "-q")
        refs.append(env.dump(env.path(op + ".tif")))
    check(any(same_pixels(r, got) for r in refs), "the target is one run's whole result")
    check(not [n for n in os.listdir(env.tmp) if ".vsr-" in n], "temporaries left: %s" %
          entries(env))
    # A driver that writes several files: all of them land under the target's name, nothing
    # is left of the temporary, and they read back.
    run_ok(env, "--op", "focal-mean", "-i", src, "-of", "EHdr", "-o", env.path("m.bil"), "-q")
    check({"m.bil", "m.hdr"} <= set(os.listdir(env.tmp)) and
          same_pixels(env.dump(env.path("lc.tif")), env.dump(env.path("m.bil"))),
          entries(env))


def ieee_div(a, b):
    """a / b as IEEE 754 float64 (numpy's float64 division): +-inf or NaN for a zero b."""
    if b != 0:
        return a / b
    if a == 0 or is_nan(a):
        return NAN
    import math
    return math.copysign(float("inf"), a) * math.copysign(1.0, b)


def same_value(got, want):
    return (is_nan(got) and is_nan(want)) or got == want


def calc_expected(bands_by_input, nodata_by_input, reads, fn, out_nodata):
    """Per pixel: out_nodata where any band read (reads: (input, band index)) is invalid, else
    fn(pixel values) in float64."""
    n = len(bands_by_input[reads[0][0]][reads[0][1]])
    out = []
    for i in range(n):
        vals = {}
        ok = True
        for name, b in reads:
            v = bands_by_input[name][b][i]
            if not valid_of(v, nodata_by_input[name]):
                ok = False
            vals[(name, b)] = v
        out.append(fn(vals) if ok else out_nodata)
    return out


@case
def calc_matches_python_float64(env):
    W, H = 150, 130
    a = env.make(env.path("a.tif"), "--width", W, "--height", H, "--bands", 4, "--dtype",
                 "float64", "--block", 64, "--nodata", "-9999", "--nodata-every", 11)
    b = env.make(env.path("b.tif"), "--width", W, "--height", H, "--dtype", "float64",
                 "--block", 64, "--nodata", "-1234", "--nodata-every", 7)
    da, db = env.dump(a), env.dump(b)
    px = {"A": da["pixels"], "B": db["pixels"]}
    nd = {"A": -9999.0, "B": -1234.0}
    ndvi = calc_expected(px, nd, [("A", 3), ("A", 2)],
                         lambda v: ieee_div(v[("A", 3)] - v[("A", 2)], v[("A", 3)] + v[("A", 2)]),
                         -9999.0)
    two1 = calc_expected(px, nd, [("A", 2), ("B", 0)],
                         lambda v: v[("A", 2)] * v[("B", 0)] - ieee_div(v[("A", 2)], 4.0), -9999.0)
    two2 = calc_expected(px, nd, [("A", 3), ("B", 0)],
                         lambda v: v[("A", 3)] if v[("B", 0)] > 0 else v[("B", 0)] + 0.5, -9999.0)
    check(sum(1 for v in ndvi if v == -9999.0) > 100, "the inputs hold invalid pixels")
    check(sum(1 for v in two1 if v == -9999.0) > sum(1 for v in ndvi if v == -9999.0),
          "B's invalid pixels add to A's")
    NDVI = "(A[4]-A[3])/(A[4]+A[3])"
    for budget in ("auto", "100K"):
        # NDVI reads bands 3 and 4 only (the summary lists the bands read).
        out = env.path("ndvi-%s.tif" % budget)
        p = run_ok(env, "--op", "calc", "-i", "A=" + a, "--calc", NDVI, "--ot", "float64", "-o",
                   out, "--budget", budget)
        check(b"band(s) 3 4" in p.stdout, p.stdout)
        if budget == "100K":
            check(b"tiled" in p.stdout, p.stdout)
        r = env.dump(out)
        check(r["bands"] == 1 and r["band_info"][0]["dtype"] == "float64" and
              r["band_info"][0]["nodata"] == -9999.0, r["band_info"])
        bad = [i for i, (g, w_) in enumerate(zip(r["pixels"][0], ndvi)) if not same_value(g, w_)]
        check(not bad, "ndvi (%s): %d pixels differ, first %s" % (
            budget, len(bad), [(i, r["pixels"][0][i], ndvi[i]) for i in bad[:3]]))
        check(r["geotransform"] == da["geotransform"], (r["geotransform"], da["geotransform"]))
        out2 = env.path("two-%s.tif" % budget)
        run_ok(env, "--op", "calc", "-i", "A=" + a, "-i", "B=" + b, "--calc",
               "A[3] * B - A[3] / 4", "--calc", "where(B > 0, A[4], B + 0.5)", "--ot", "float64",
               "-o", out2, "--budget", budget, "-q")
        r = env.dump(out2)
        check(r["bands"] == 2 and all(bi["nodata"] == -9999.0 for bi in r["band_info"]),
              r["band_info"])
        for k, want in enumerate((two1, two2)):
            bad = [i for i, (g, w_) in enumerate(zip(r["pixels"][k], want)) if not same_value(g, w_)]
            check(not bad, "two inputs, band %d (%s): %d pixels differ, first %s" % (
                k + 1, budget, len(bad), [(i, r["pixels"][k][i], want[i]) for i in bad[:3]]))
    # A bare -i is input A; the default output type is float32 (the float64 result rounded).
    out = env.path("ndvi-f32.tif")
    run_ok(env, "--op", "calc", "-i", a, "--calc", NDVI, "-o", out, "-q")
    r = env.dump(out)
    check(r["band_info"][0]["dtype"] == "float32", r["band_info"])
    bad = [i for i, (g, w_) in enumerate(zip(r["pixels"][0], ndvi)) if not same_value(g, f32(w_))]
    check(not bad, "float32 ndvi: %d pixels differ" % len(bad))
    # Without propagation the raw nodata values go through the expression.
    out = env.path("raw.tif")
    # (-a_nodata nan: a raw sum may land on -9999, the nodata calc would take from A, which it
    # refuses to write.)
    run_ok(env, "--op", "calc", "-i", "A=" + a, "-i", "B=" + b, "--calc", "A[3] + B",
           "--no-propagate-nodata", "-a_nodata", "nan", "--ot", "float64", "-o", out, "-q")
    r = env.dump(out)
    want = [x + y for x, y in zip(px["A"][2], px["B"][0])]
    check(r["pixels"][0] == want, "--no-propagate-nodata: raw values differ")
    # -a_nodata sets the output's nodata; a valid pixel equal to it is an error, not nodata.
    out = env.path("own-nodata.tif")
    run_ok(env, "--op", "calc", "-i", "A=" + a, "-i", "B=" + b, "--calc", "A[3] + B",
           "-a_nodata", "-12345.5", "--ot", "float64", "-o", out, "-q")
    r = env.dump(out)
    want = calc_expected(px, nd, [("A", 2), ("B", 0)], lambda v: v[("A", 2)] + v[("B", 0)],
                         -12345.5)
    check(r["band_info"][0]["nodata"] == -12345.5 and r["pixels"][0] == want, r["band_info"])
    out = env.path("clash.tif")
    p = env.run(env.vsr_run, "--op", "calc", "-i", "A=" + a, "--calc", "A[3] * 0 + 3",
                "-a_nodata", "3", "-o", out)
    expect_exit(p, 1, "calc whose valid pixels equal -a_nodata")
    check(b"equal the output nodata" in p.stderr and not os.path.exists(out), p.stderr)


@case
def bench_files_quick_prints_the_goals_table(env):
    # vsr-bench files --quick: small GDAL-made inputs, every job once against the installed
    # peers; the table and the goals print (timings are not checked: they mean nothing here).
    import shutil
    missing = [t for t in ("gdal_translate", "gdal_calc.py", "gdalinfo") if not shutil.which(t)]
    if missing:
        raise Skip("GDAL's tools missing: %s" % ", ".join(missing))
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                          "vsr-bench-files")
    p = env.run(sys.executable, script, "--quick", "--vsr-run", env.vsr_run, "--workdir",
                env.path("bench"))
    if p.returncode != 0 and b"needs numpy and GDAL's Python bindings" in p.stderr:
        raise Skip(p.stderr.decode("utf-8", "replace").strip())
    expect_exit(p, 0, "vsr-bench-files --quick")
    text = p.stdout.decode()
    check("512 x 512 x 4" in text and "load average before" in text, text)
    for job in ("focal mean float32", "rescale uint16->uint8", "NDVI float32", "stats uint16",
                "stats float32", "3-step chain"):
        check(text.count(job) >= 2, "%s: not in the table and the goals\n%s" % (job, text))
    goals = text[text.index("goals ("):]
    for peer in ("gdal_translate -scale", "gdal_calc.py", "gdalinfo -stats",
                 "3 separate vsr-run calls", "gdal_calc.py + gdal_translate"):
        line = [l for l in goals.splitlines() if peer in l]
        check(line and any(w in line[0] for w in ("met", "missed")), (peer, goals))
    check("scipy + rasterio" in goals, goals)  # run, or "not run" with the reason above
    # The focal mean's whole run against its stages, each run alone.
    line = [l for l in goals.splitlines() if "its own stages" in l]
    check(line and any(w in line[0] for w in ("met", "missed")), goals)
    check("focal mean's stages, each alone" in text, text)
    check(not any(os.path.exists(os.path.join(env.path("bench"), f)) and
                  f.startswith("vsr-bench-files-") for f in os.listdir(env.path("bench"))),
          "the bench left its outputs")


@case
def band_subsets_read_with_gdal_threads(env):
    # GDAL 3.6 crashes (SIGSEGV in its decoding threads) on one dataset read of a band list
    # other than 1..k of a compressed band-interleaved GeoTIFF when GDAL_NUM_THREADS is set, as
    # users set it for speed; such band lists are read band by band (docs/tools.md, -b).
    W, H = 300, 260
    a = env.make(env.path("a.tif"), "--width", W, "--height", H, "--bands", 4, "--dtype",
                 "float32", "--block", 64, "--compress", "DEFLATE", "--interleave", "BAND",
                 "--nodata", "-9999", "--nodata-every", 13)
    px = env.dump(a)["pixels"]
    threads = {"GDAL_NUM_THREADS": "ALL_CPUS"}
    out = env.path("ndvi.tif")
    p = env.run(env.vsr_run, "--op", "calc", "-i", "A=" + a, "--calc", "A[4] - A[3]",
                "--calc", "A[2] + A[4]", "--ot", "float64", "-o", out, "-q", env=threads)
    expect_exit(p, 0, "calc reading bands 2, 3 and 4 with GDAL_NUM_THREADS")
    got = env.dump(out)["pixels"]
    for k, (x, y, sign) in enumerate(((3, 2, -1), (1, 3, 1))):
        want = [-9999.0 if -9999.0 in (u, v) else float(f32(u) + sign * f32(v))
                for u, v in zip(px[x], px[y])]
        bad = [i for i, (g, w_) in enumerate(zip(got[k], want)) if not same_value(g, w_)]
        check(not bad, "band %d: %d pixels differ" % (k + 1, len(bad)))
    p = env.run(env.vsr_run, "-i", a, "-b", "4", "-b", "2", "--op", "stats", "--json",
                env=threads)
    expect_exit(p, 0, "stats of bands 4 and 2 with GDAL_NUM_THREADS")
    stats = json.loads(p.stdout)
    check(len(stats["bands"]) == 2, stats)


@case
def calc_refuses_mismatched_grids_and_bad_expressions(env):
    a = env.make(env.path("a.tif"), "--width", 40, "--height", 30, "--bands", 2)
    short = env.make(env.path("short.tif"), "--width", 40, "--height", 29)
    nogt = env.make(env.path("nogt.tif"), "--width", 40, "--height", 30, "--no-geotransform")
    out = env.path("out.tif")
    for other, what in ((short, b"size"), (nogt, b"geotransform")):
        p = env.run(env.vsr_run, "--op", "calc", "-i", "A=" + a, "-i", "B=" + other, "--calc",
                    "A[1] + B", "-o", out)
        expect_exit(p, 2, "calc over inputs of two grids")
        err = p.stderr
        check(what in err and b"A=" in err and b"B=" in err and os.fsencode(other) in err, err)
        check(not os.path.exists(out), "no output after a refused run")
    # A bad expression: the column and a caret under it, before any pixel is read.
    p = env.run(env.vsr_run, "--op", "calc", "-i", "A=" + a, "--calc", "A[1] + C", "-o", out)
    expect_exit(p, 2, "calc with an unknown name")
    err = p.stderr.decode()
    check("unknown name 'C' at column 8" in err, err)
    lines = err.splitlines()
    caret = [k for k, l in enumerate(lines) if l.strip() == "^"]
    check(caret and lines[caret[0] - 1].index("A[1] + C") + 7 == lines[caret[0]].index("^"), err)
    check(not os.path.exists(out), "no output after a bad expression")
    p = env.run(env.vsr_run, "--op", "calc", "-i", "A=" + a, "--calc", "A[1]", "--calc",
                "A[3] * 2", "-o", out)
    expect_exit(p, 2, "calc reading a band the input lacks")
    check(b"expression 2" in p.stderr, p.stderr)
    for args, what in ((["-i", "A=" + a, "-i", "A=" + a, "--calc", "A[1]"], b"twice"),
                       (["-i", a, "--calc", "A[1]", "-b", "1"], b"-b"),
                       (["-i", a], b"--calc"),
                       (["--calc", "1"], b"-i")):
        p = env.run(env.vsr_run, "--op", "calc", *args)
        expect_exit(p, 2, "calc %s" % args)
        check(what in p.stderr, p.stderr)
    p = env.run(env.vsr_run, "--op", "clip", "--range", "0,1", "-i", a, "--calc", "A[1]")
    expect_exit(p, 2, "--calc with another op")


@case
def pipeline_ends_in_stats_or_histogram(env):
    # A chain ending in ! stats / ! histogram prints what --op stats / --op histogram print of
    # the same chain written to a file: the same counts, bounds and bins (means and deviations
    # to rounding, the tiles merging in another order), whole and tiled, and writes no raster.
    src = env.make(env.path("in.tif"), "--width", 300, "--height", 200, "--bands", 2,
                   "--nodata", "-9999")
    chain = ["pipeline", "read", "A=" + src, "!", "calc", "--calc", "X[1] * 0.5 + X[2]",
             "--calc", "X[2]", "!", "focal-mean"]
    written = env.path("chain.tif")
    run_ok(env, *chain, "!", "write", written, "-q")
    want_s = json.loads(run_ok(env, "--op", "stats", "-i", written, "--json", "-q").stdout)
    want_h = json.loads(run_ok(env, "--op", "histogram", "-i", written, "--bins", 7,
                               "--range", "0,150", "--json", "-q").stdout)
    for budget in ("auto", "200K"):
        got = json.loads(run_ok(env, *chain, "!", "stats", "--json", "-q", "--budget",
                                budget).stdout)
        check(len(got["bands"]) == 2, got)
        for g, w in zip(got["bands"], want_s["bands"]):
            check(g["count"] == w["count"] and g["min"] == w["min"] and g["max"] == w["max"],
                  (budget, g, w))
            check(rel_close(g["mean"], w["mean"], 1e-9) and rel_close(g["std"], w["std"], 1e-9),
                  (budget, g, w))
        out = env.path("hist-%s.json" % budget)
        run_ok(env, *chain, "!", "histogram", "--bins", 7, "--range", "0,150", "-o", out, "-q",
               "--budget", budget)
        got = json.load(open(out))
        check([b["counts"] for b in got["bands"]] == [b["counts"] for b in want_h["bands"]],
              (budget, got, want_h))
        check([b["edges"] for b in got["bands"]] == [b["edges"] for b in want_h["bands"]], got)
    # --dry-run names the last step; the table form, and nothing else written.
    text = run_ok(env, *chain, "!", "stats", "--dry-run").stdout.decode()
    check("read ! calc ! focal-mean ! stats" in text, text)
    text = run_ok(env, *chain, "!", "stats").stdout.decode()
    check(text.splitlines()[0].split() == ["band", "count", "min", "max", "mean", "std"], text)
    check("output      the table above" in text, text)
    # A histogram needs its range; a terminal step takes no -b; write and stats are the ends.
    p = env.run(env.vsr_run, *chain, "!", "histogram", "--bins", "4")
    expect_exit(p, 2, "histogram without --range")
    check(b"--range" in p.stderr, p.stderr)
    p = env.run(env.vsr_run, *chain, "!", "stats", "-b", "1")
    expect_exit(p, 2, "stats with -b")
    p = env.run(env.vsr_run, *chain, "!", "bogus")
    expect_exit(p, 2, "an unknown last step")
    check(b"write FILE, stats or histogram" in p.stderr, p.stderr)


@case
def pipeline_equals_its_steps_run_one_after_another(env):
    W, H = 300, 280
    a = env.make(env.path("a.tif"), "--width", W, "--height", H, "--bands", 4, "--dtype",
                 "float64", "--block", 64, "--nodata", "-9999", "--nodata-every", 11)
    b = env.make(env.path("b.tif"), "--width", W, "--height", H, "--dtype", "float64",
                 "--block", 64, "--nodata", "-1234", "--nodata-every", 7)
    NDVI = "(A[4]-A[3])/(A[4]+A[3])"
    chains = {
        "ndvi": (["A=" + a],
                 [["calc", "--calc", NDVI], ["focal-mean", "--edge", "reflect"],
                  ["rescale", "--in-range", "-1,1", "--out-range", "1,255", "--ot", "uint8"]]),
        "two": (["A=" + a, "B=" + b],
                [["calc", "--calc", "A[2] * B", "--calc", "A[1] - B", "--ot", "float64"],
                 ["focal-mean"], ["clip", "--range", "-500,20000"], ["focal-mean", "--edge",
                                                                    "nodata"],
                 ["fill-nodata", "--value", "-1"]]),
    }
    for name, (inputs, steps) in chains.items():
        # The steps one after another, through intermediate files.
        prev = None
        for k, step in enumerate(steps):
            out = env.path("%s-step%d.tif" % (name, k))
            if step[0] == "calc":
                ins = []
                for i in inputs:
                    ins += ["-i", i]
                run_ok(env, "--op", "calc", *ins, *step[1:], "-o", out, "-q")
            else:
                run_ok(env, "--op", step[0], "-i", prev, *step[1:], "-o", out, "-q")
            prev = out
        want = env.dump(prev)
        words = ["pipeline", "read", *inputs]
        for step in steps:
            words += ["!", *step]
        for budget in ("auto", "100K"):
            out = env.path("%s-pipeline-%s.tif" % (name, budget))
            p = run_ok(env, *words, "!", "write", out, "--budget", budget)
            halo = sum(1 for s in steps if s[0] == "focal-mean")
            if budget == "100K":
                check(b"tiled" in p.stdout and (b"(halo %d)" % halo) in p.stdout, p.stdout)
            got = env.dump(out)
            check(got["band_info"] == want["band_info"], (got["band_info"], want["band_info"]))
            for k in range(want["bands"]):
                bad = [i for i, (g, w_) in enumerate(zip(got["pixels"][k], want["pixels"][k]))
                       if not same_value(g, w_) or str(g) != str(w_)]
                check(not bad, "%s (%s) band %d: %d pixels differ from the steps', first %s" % (
                    name, budget, k + 1, len(bad), bad[:3]))
            # --dry-run: the plan, nothing read or written.
            dry = env.path("%s-dry-%s.tif" % (name, budget))
            p = run_ok(env, *words, "!", "write", dry, "--budget", budget, "--dry-run")
            text = p.stdout.decode()
            check(("halo        %d" % halo) in text and
                  ("read ! %s ! write" % " ! ".join(s[0] for s in steps)) in text, text)
            if budget == "100K":
                check("tiles of" in text, text)
            check(not os.path.exists(dry), "--dry-run wrote its output")
    # Errors: a bad expression names its step, with the caret; rescale without --in-range; an
    # unknown step; output options inside a step.
    out = env.path("bad.tif")
    for words, what in (
            (["read", "A=" + a, "!", "calc", "--calc", "A[1] + C", "!", "write", out],
             "unknown name 'C' at column 8"),
            (["read", "A=" + a, "!", "calc", "--calc", "A[1]", "!", "rescale", "!", "write",
              out], "--in-range"),
            (["read", "A=" + a, "!", "blur", "!", "write", out], "unknown step 'blur'"),
            (["read", "A=" + a, "!", "focal-mean", "-o", out, "!", "write", out], "write FILE"),
            (["read", "A=" + a, "!", "focal-mean"], "write FILE")):
        p = env.run(env.vsr_run, "pipeline", *words)
        expect_exit(p, 2, "pipeline %s" % words)
        check(what in p.stderr.decode(), p.stderr)
        check(not os.path.exists(out), "a refused pipeline wrote its output")


def stat_is_fifo(path):
    import stat
    return stat.S_ISFIFO(os.lstat(path).st_mode)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-root", required=True)
    ap.add_argument("--case", required=True, choices=sorted(CASES))
    ap.add_argument("--sanitized", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="vsr-cli-") as tmp:
        env = Env(a.build_root, tmp, a.sanitized)
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
