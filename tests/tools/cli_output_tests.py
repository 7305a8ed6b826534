#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""vsr-run's outputs as a user names them (suite 'tools', with cli_tests.py, whose helpers these
cases use): what --memory-history and -o may name, checked before any pixel is read; creation
options the driver does not take; pipeline command lines. One meson test per case:
cli_output_tests.py --case NAME --build-root DIR. Exit status: 0 pass, 1 fail, 77 skip.
"""
import os
import stat
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cli_tests  # noqa: E402
from cli_tests import check, digest, expect_exit, run_ok, strict_text  # noqa: E402

CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def refused(env, what, *args, cwd=None):
    """Runs vsr-run, which must refuse the command line (exit 2) before computing anything;
    returns its stderr as text."""
    extra = None
    if env.sanitized:
        # AddressSanitizer aborts on an allocation beyond its largest (GDAL asks for a block of
        # 99999984 x 99999984 pixels) where malloc returns NULL, which GDAL reports as an error.
        extra = {"ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", "") +
                 ":allocator_may_return_null=1"}
    p = env.run(env.vsr_run, *[str(a) for a in args], cwd=cwd, env=extra)
    expect_exit(p, 2, what)
    text = strict_text(p.stderr, "%s: stderr" % what)
    check(b"throughput" not in p.stdout, "%s: it computed before refusing: %s" % (what, p.stdout))
    check(".vsr-" not in text, "%s: the message names a private temporary: %s" % (what, text))
    return text


def kind(path):
    return stat.S_IFMT(os.lstat(path).st_mode)


@case
def memory_history_never_replaces_a_file_of_the_run(env):
    # --memory-history F --overwrite renamed the pickle over F after the run: F the output, the
    # finished output became a pickle; F the input, the input was gone; exit 0 both times.
    src = env.make(env.path("in.tif"), "--width", 40, "--height", 30, "--nodata", "-9999")
    out = env.path("o.tif")
    run_ok(env, "--op", "focal-mean", "-i", src, "-o", out, "-q")
    kept = {p: digest(p) for p in (src, out)}
    os.symlink("in.tif", env.path("link-in.tif"))
    os.link(src, env.path("hard-in.tif"))
    os.symlink("o.tif", env.path("link-o.tif"))
    os.mkdir(env.path("sub"))
    for history, cwd in ((out, None), (src, None), ("./in.tif", env.tmp), ("sub/../o.tif", env.tmp),
                         (env.path("link-in.tif"), None), (env.path("hard-in.tif"), None),
                         (env.path("link-o.tif"), None)):
        text = refused(env, "--memory-history %s" % history, "--op", "focal-mean", "-i", src,
                       "-o", out, "--overwrite", "-q", "--memory-history", history, cwd=cwd)
        check(text.startswith("vsr-run: --memory-history: ") and "the same file as the" in text,
              text)
        for p, d in kept.items():
            check(digest(p) == d, "--memory-history %s: %s changed" % (history, p))
    # An output that does not exist yet, named another way (a link whose file is not there yet).
    new = env.path("new.tif")
    os.symlink("new.tif", env.path("link-new.tif"))
    for history in ("new.tif", "./new.tif", env.path("link-new.tif")):
        refused(env, "--memory-history %s of a new output" % history, "--op", "clip", "--range",
                "0,1", "-i", src, "-o", "new.tif", "--memory-history", history, cwd=env.tmp)
        check(not os.path.exists(new), "a refused run wrote its output")
    # calc's inputs, each of them.
    b = env.make(env.path("b.tif"), "--width", 40, "--height", 30)
    kept[b] = digest(b)
    for history in (src, b):
        refused(env, "calc --memory-history an input", "--op", "calc", "-i", "A=" + src, "-i",
                "B=" + b, "--calc", "A + B", "-o", env.path("c.tif"), "--overwrite",
                "--memory-history", history)
    check(not os.path.exists(env.path("c.tif")), "a refused calc wrote its output")
    # A pipeline: read's inputs and write's file.
    w = env.path("w.tif")
    for history in (w, src):
        refused(env, "pipeline --memory-history %s" % history, "pipeline", "read", "A=" + src,
                "!", "focal-mean", "!", "write", w, "--overwrite", "--memory-history", history)
        check(not os.path.exists(w), "a refused pipeline wrote its output")
    for p, d in kept.items():
        check(digest(p) == d, "%s changed" % p)
    # Any other file takes the history, with the output written as asked.
    hist = env.path("run.pickle")
    run_ok(env, "pipeline", "read", "A=" + src, "!", "focal-mean", "!", "write", w, "-q",
           "--memory-history", hist)
    with open(hist, "rb") as f:
        check(f.read(2) == b"\x80\x02", "the history is a pickle")
    check(env.dump(w)["driver"] == "GTiff", "the output is the raster")


@case
def output_targets_are_checked_before_any_pixel(env):
    # A bad --memory-history target was refused only after the whole run (exit 1), the output
    # already written; -o into a missing or read-only directory failed with exit 1.
    src = env.make(env.path("in.tif"), "--width", 40, "--height", 30)
    out = env.path("o.tif")
    fifo = env.path("pipe")
    os.mkfifo(fifo)
    os.mkdir(env.path("dir"))
    targets = [(env.path("missing/h.pickle"), "No such file or directory"),
               (env.path("dir"), "it is a directory"),
               (fifo, "not a regular file")]
    if os.geteuid() == 0:
        # A copy of /dev/null (character device 1:3): as root, the real one would be replaced.
        os.mknod(env.path("null"), 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        targets.append((env.path("null"), "not a regular file"))
        targets.append(("/proc/vsr-h.pickle", "cannot create a temporary directory"))
    else:
        os.mkdir(env.path("ro"))
        os.chmod(env.path("ro"), 0o555)
        targets.append((env.path("ro/h.pickle"), "Permission denied"))
    for history, says in targets:
        for op in (["--op", "focal-mean", "-o", out], ["--op", "stats"]):
            text = refused(env, "--memory-history %s" % history, *op, "-i", src, "--overwrite",
                           "--memory-history", history)
            check(text.startswith("vsr-run: --memory-history: ") and says in text, text)
            check(not os.path.exists(out), "the output was written before the refusal")
    check(kind(fifo) == stat.S_IFIFO, "the FIFO is still a FIFO")
    if os.geteuid() == 0:
        check(kind(env.path("null")) == stat.S_IFCHR, "the device is still a device")
    # -o: the same refusals, for a raster and for JSON, up front.
    for target, says in targets:
        for op in (["--op", "focal-mean"], ["--op", "stats"]):
            text = refused(env, "-o %s" % target, *op, "-i", src, "-o", target, "--overwrite")
            check(text.startswith("vsr-run: --output: ") and says in text, text)
    check(kind(fifo) == stat.S_IFIFO, "the FIFO is still a FIFO")
    # JSON never replaces an input (a raster output may: in place).
    before = digest(src)
    for op in (["--op", "stats"], ["--op", "histogram", "--bins", "4"]):
        text = refused(env, "%s -o the input" % op[1], *op, "-i", src, "-o", "./in.tif",
                       "--overwrite", cwd=env.tmp)
        check("the same file as the input" in text, text)
    check(digest(src) == before, "the input changed")
    entries = sorted(os.listdir(env.tmp))
    check(not [n for n in entries if ".vsr-" in n], "temporaries left: %s" % entries)


@case
def creation_options_the_driver_does_not_take_are_refused_up_front(env):
    # --co ZLEVEL=99 was accepted silently (GDAL warned "not recognised, ignoring" and wrote with
    # its default); -of COG --co BLOCKSIZE=99999999 passed the trial and failed after the whole
    # run, naming the private temporary path.
    src = env.make(env.path("in.tif"), "--width", 40, "--height", 30, "--bands", 2)
    out = env.path("o.tif")
    for args, says in (
            (["--co", "ZLEVEL=99"], "ZLEVEL=99"),
            (["--co", "COMPRESS=ZSTD", "--co", "ZSTD_LEVEL=99"], "ZSTD_LEVEL=99"),
            (["--co", "COMPRESS=JPEG", "--co", "JPEG_QUALITY=500"], "JPEG_QUALITY=500"),
            (["-of", "COG", "--co", "COMPRESS=DEFLATE", "--co", "LEVEL=99"], "LEVEL=99"),
            (["-of", "COG", "--co", "BLOCKSIZE=99999999"], "99999999"),
            (["-of", "COG", "--co", "BLOCKSIZE=64"], "should be >= 128"),
            (["--co", "TILED=YES", "--co", "BLOCKXSIZE=99999984", "--co", "BLOCKYSIZE=99999984"],
             "o.tif"),
            (["--co", "PREDICTOR=7"], "PREDICTOR=7"),
            (["--co", "BIGTIFF=MAYBE"], "BIGTIFF")):
        for op in (["--op", "focal-mean"], ["pipeline"]):
            words = (["pipeline", "read", "A=" + src, "!", "focal-mean", "!", "write", out] + args
                     if op == ["pipeline"] else op + ["-i", src, "-o", out] + args)
            text = refused(env, "vsr-run %s" % " ".join(words), *words)
            check(says in text, "%s: %s" % (args, text))
            check(not os.path.exists(out), "%s: an output was written" % args)
    # What the driver takes is written, the option applied.
    run_ok(env, "--op", "focal-mean", "-i", src, "-o", out, "-q", "--co", "ZLEVEL=9")
    run_ok(env, "--op", "focal-mean", "-i", src, "-o", env.path("c.tif"), "-of", "COG", "-q",
           "--co", "BLOCKSIZE=256")
    check(env.dump(env.path("c.tif"))["band_info"][0]["block"] == [256, 256], "COG BLOCKSIZE")
    entries = sorted(os.listdir(env.tmp))
    check(not [n for n in entries if ".vsr-" in n], "temporaries left: %s" % entries)


@case
def pipeline_command_line_errors_exit_2(env):
    # read X=a.tif (X is the previous step's name) ended with exit 1, as a run failure.
    src = env.make(env.path("in.tif"), "--width", 40, "--height", 30)
    out = env.path("o.tif")
    for words, says in (
            (["read", "X=" + src, "!", "focal-mean", "!", "write", out], "X"),
            (["read", "A=" + src, "X=" + src, "!", "focal-mean", "!", "write", out], "X"),
            (["read", "A=" + src, "A=" + src, "!", "focal-mean", "!", "write", out], "twice"),
            (["read", "A=" + src, "!", "calc", "--calc", "X[2]", "!", "write", out], "X"),
            (["read", "A=" + src, "!", "calc", "--calc", "B", "!", "write", out], "B"),
            (["read", "A=" + src, "!", "clip", "!", "write", out], "--range"),
            (["read", "A=" + src, "!", "focal-mean", "--edge", "wrap", "!", "write", out],
             "wrap"),
            (["read", "A=" + src, "!", "focal-mean", "!", "write", out, "--co", "NOPE=1"],
             "NOPE"),
            (["read", "A=" + src, "!", "focal-mean", "!", "write", out, "-of", "NoSuchDriver"],
             "NoSuchDriver"),
            (["read", "A=" + src, "!", "focal-mean", "!", "write", out, "--budget", "0"],
             "--budget"),
            (["read", "A=" + src, "!", "focal-mean", "!", "stats", "--bins", "3"], "--bins"),
            (["read", "A=" + src, "!", "focal-mean", "!", "histogram", "--range", "1,0"],
             "--range"),
            (["read", "!", "focal-mean", "!", "write", out], "read needs"),
            (["read", "A=" + src, "--budget", "5", "!", "focal-mean", "!", "write", out],
             "read takes only NAME=FILE"),
            (["read", "A=" + src, "!", "!", "write", out], "empty"),
            (["read", "A=" + src, "!", "stats", "!", "write", out], "unknown step 'stats'"),
            (["read", "A=" + src, "!", "ndvi", "!", "write", out], "unknown step 'ndvi'"),
            (["read", "A=" + src, "!", "write", out, "!", "write", out], "unknown step"),
            (["read", "A=" + src, "!", "focal-mean", "--op", "clip", "!", "write", out],
             "--op")):
        text = refused(env, "pipeline %s" % " ".join(words), "pipeline", *words)
        check(says in text, "%s: %s" % (words, text))
        check(not os.path.exists(out), "a refused pipeline wrote its output")


@case
def pipeline_steps_take_only_their_own_options(env):
    # Each step takes the options it declares; any other is refused (exit 2) before any file is
    # opened, naming the step, the option and the steps it belongs to. A calc step's -i never
    # opens its file: the inputs are read's.
    src = env.make(env.path("in.tif"), "--width", 40, "--height", 30)
    out = env.path("o.tif")
    nope = env.path("nope.tif")
    for words, step, option, belongs in (
            (["read", "A=" + src, "!", "calc", "--calc", "A[1]", "-i", "B=" + nope, "!",
              "write", out], "calc", "-i", "read"),
            (["read", "A=" + src, "!", "focal-mean", "-b", "1", "!", "write", out],
             "focal-mean", "-b", "read"),
            (["read", "A=" + src, "!", "focal-mean", "!", "write", out, "--value", "0"],
             "write", "--value", "fill-nodata"),
            (["read", "A=" + src, "!", "focal-mean", "!", "write", out, "--sample-size", "9"],
             "write", "--sample-size", "sample"),
            (["read", "A=" + src, "!", "focal-mean", "!", "write", out, "--bands", "2"],
             "write", "--bands", "sample"),
            (["read", "A=" + src, "!", "focal-mean", "!", "write", out, "--edge", "reflect"],
             "write", "--edge", "focal-mean"),
            (["read", "A=" + src, "!", "focal-mean", "--sample-size", "9", "!", "write", out],
             "focal-mean", "--sample-size", "sample"),
            (["read", "A=" + src, "!", "clip", "--range", "0,9", "--edge", "reflect", "!",
              "write", out], "clip", "--edge", "focal-mean"),
            (["read", "A=" + src, "!", "clip", "--range", "0,9", "--budget", "1M", "!",
              "write", out], "clip", "--budget", "write"),
            (["read", "A=" + src, "!", "focal-mean", "!", "stats", "--value", "1"],
             "stats", "--value", "fill-nodata")):
        text = refused(env, "pipeline %s" % " ".join(words), "pipeline", *words)
        check(step in text and option in text and belongs in text,
              "%s: the message names neither the step, the option nor where it belongs: %s" %
              (words, text))
        check("cannot open" not in text and "nope" not in text,
              "%s: a refused option's file was opened: %s" % (words, text))
        check(not os.path.exists(out), "a refused pipeline wrote its output")


def main():
    # cli_tests.py's runner, over these cases.
    cli_tests.CASES.clear()
    cli_tests.CASES.update(CASES)
    return cli_tests.main()


if __name__ == "__main__":
    sys.exit(main())
