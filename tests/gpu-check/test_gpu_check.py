#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""tools/gpu-check tested on a CPU, in a scratch copy of the tools (nothing is written into the
source tree): a carried build made of stub programs (the test list pointing at stub tests, a
stamp of the scratch sources), a fake nvidia-smi, meson and ninja on PATH. Asserts the plan and
its budget (--dry-run), a whole run (exit status, the four files under $OUT, the table, the JSON,
the paths of the build mapped onto the checkout), failures, no GPU, a run killed in the middle
(the results so far are there), steps stopped at their limit, a stale carried build (built here
with -Dwerror=false), --prepare (the staged build, the stamp, the carry list and the call, the
64 MiB limit), and tools/gpu-record on the JSON.

usage: test_gpu_check.py SOURCE_ROOT
"""

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import time

SRC = os.path.abspath(sys.argv[1])
OLD_ROOT = "/nonexistent/prepared-root"  # where the carried build says it was made
OLD_BUILD = OLD_ROOT + "/build-gpu"

CONF_STDOUT = textwrap.dedent("""\
    vsr-conformance: driver libcuda.so.1 (version 13000, real), 1 device(s), granularity 2097152
    [doctest] test cases: 3 | 2 passed | 1 failed

    case                                           section  evidence seen_on_gpu result
    init.flags_must_be_zero                        §3.1     hdr      no          PASS
    version.driver_version                         §3.1     hdr      no          PASS
    device.bad_ordinal                             §1.3     probe    no          FAIL
    2 passed, 1 failed, 5 not selected in this mode (default)
    """)

BENCH_DISPATCH = {
    "benchmark": "dispatch", "quick": True,
    "machine": {"driver_library": "libcuda.so.1", "emulated": False, "device": "NVIDIA H200"},
    "notes": [], "sections": [],
    "summary": [
        {"metric": "GPU rescale / cuMemcpyDtoD GB/s", "value": 0.91, "goal": ">= 0.85",
         "met": "yes", "note": ""},
        {"metric": "pipelined per-band GPU dispatch / pinned H2D GB/s", "value": 0.62,
         "goal": ">= 0.80", "met": "no", "note": "4 passes"},
        {"metric": "per-band dispatch overlap ratio", "value": 0.93, "goal": "", "met": "n/a",
         "note": ""},
    ],
}
BENCH_ALLOC = {
    "benchmark": "alloc", "quick": True,
    "machine": {"driver_library": "libcuda.so.1", "emulated": False, "device": "NVIDIA H200"},
    "notes": [], "sections": [],
    "summary": [{"metric": "small trace, pool/cuMemAllocAsync", "value": 3.5, "goal": ">= 2",
                 "met": "yes", "note": ""}],
}

# Stub programs. Each fails when its name is in $STUB_FAIL, hangs when it is in $STUB_HANG.
PRELUDE = """\
    #!/bin/sh
    me=%s
    case ",$STUB_FAIL," in *,$me,*) echo "$me: failing as asked"; exit 1 ;; esac
    case ",$STUB_HANG," in *,$me,*) echo "$me: hanging"; echo $$ >> "$STUB_PIDS"; exec sleep 600 ;; esac
    """

NVIDIA_SMI = """\
    #!/bin/sh
    [ -n "$STUB_NO_GPU" ] && exit 9
    case "$*" in
      *--query-gpu*) echo "NVIDIA H200, 580.159.04, 140000 MiB, 143771 MiB" ;;
      *) echo "| NVIDIA-SMI 580.159.04   Driver Version: 580.159.04   CUDA Version: 13.0 |" ;;
    esac
    """

# A test of the gpu suite: records its argument list and two environment variables, prints its
# name (the conformance tests their table), exits 77 when STUB_ALL_SKIP is set.
TEST = PRELUDE + """\
    echo "$me $* VIBESPATIAL_CUDA_DRIVER=[$VIBESPATIAL_CUDA_DRIVER] EMU=[$VSR_EMULATOR] LIBS=[$VSR_LIBS]" \\
      >> "$STUB_RECORD"
    [ -n "$STUB_ALL_SKIP" ] && { echo "SKIP: no device"; exit 77; }
    case "$me" in conformance*) cat "$STUB_CONF" ;; *) echo "[doctest] test cases: 4 | 4 passed" ;; esac
    exit 0
    """

PROGRAMS = {
    "tools/vsr-info/vsr-info": PRELUDE % "vsr-info" + """\
        echo "driver libcuda.so.1: 1 device"
        echo "device 0: NVIDIA H200"
        """,
    "tests/conformance/vsr-conformance": PRELUDE % "conformance" + """\
        case "$*" in
          *--sticky*) echo "(k) launch after a sticky error                               =  700 CUDA_ERROR_ILLEGAL_ADDRESS" ;;
          *) echo "vsr-conformance --probe: libcuda.so.1, driver version 13000, granularity 2097152"
             echo "(a) cuMemMap onto a mapped range                              =    1 CUDA_ERROR_INVALID_VALUE"
             echo "(d) cuMemGetInfo after cuMemCreate                            =    0 CUDA_SUCCESS free=1 total=2" ;;
        esac
        """,
    "tools/vsr-bench/vsr-bench": PRELUDE % "bench" + """\
        echo "[vsr-bench] progress on stderr" >&2
        case "$1" in dispatch) cat "$STUB_BENCH_DISPATCH" ;; *) cat "$STUB_BENCH_ALLOC" ;; esac
        """,
    "tools/vsr-run/vsr-run": PRELUDE % "history" + """\
        while [ $# -gt 0 ]; do
          [ "$1" = --memory-history ] && printf 'snapshot' > "$2"
          shift
        done
        echo "[vsr-run] diagnostics: where the time went" >&2
        echo "  running focal-mean                          2.0000     1.10" >&2
        echo "    compute (16 tiles)                        1.5000" >&2
        """,
}
GPU_TESTS = ["ops-gpu", "gpu-smoke-dispatch", "conformance-gpu", "gpu-smoke-tier-a",
             "gpu-vsr-run", "conformance-gpu-sticky"]
PYTHON_CHECK = PRELUDE % "python" + """\
    echo "6 passed, 0 failed, 0 skipped"
    """

# meson and ninja for a build on the GPU machine (or --prepare): they record their arguments;
# ninja makes a build directory of stub programs with its test list.
FAKE_MESON = """\
    #!/bin/sh
    echo "meson $*" >> "$STUB_RECORD"
    case ",$STUB_FAIL," in *,configure,*) echo "configure failing"; exit 1 ;; esac
    if [ "$1" = introspect ]; then cat "$3/meson-info/intro-tests.json"; exit 0; fi
    [ "$1" = setup ] || exit 0
    for a in "$@"; do case "$a" in -*) ;; setup) ;; *) dir=$a ;; esac; done
    mkdir -p "$dir/meson-private" "$dir/meson-info"
    echo "  tests               : YES"
    """
FAKE_NINJA = """\
    #!/bin/sh
    echo "ninja $*" >> "$STUB_RECORD"
    case ",$STUB_FAIL," in *,build,*) echo "build failing"; exit 1 ;; esac
    dir=$2
    echo "[1/2] Compiling CUDA object src/ops/ops_cuda.cu.o"
    echo "[2/2] Linking target tests/ops/gpu/test-ops-gpu"
    python3 "$STUB_MAKE_BUILD" "$dir" "$dir" "$(cd "$dir/.." && pwd)"
    """

# Writes a build directory of stub programs: MAKE_BUILD DIR RECORDED_BUILD RECORDED_ROOT.
MAKE_BUILD = """\
import json, os, shutil, sys
sys.path.insert(0, os.path.dirname(__file__))
from stubs import write_build
write_build(sys.argv[1], sys.argv[2], sys.argv[3])
"""

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}", file=sys.stderr)


def write_exe(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(textwrap.dedent(text))
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def write_build(build, recorded_build, recorded_root, big=0):
    """A build directory of stub programs whose test list names RECORDED_BUILD and RECORDED_ROOT
    (where the build says it was made)."""
    for rel, text in PROGRAMS.items():
        write_exe(os.path.join(build, rel), text)
    tests = []
    for name in GPU_TESTS:
        rel = f"tests/gpu/{name}"
        write_exe(os.path.join(build, rel), TEST % name)
        # As meson writes them: a program of the build, a source file named through the
        # build directory, and (gpu-vsr-run) the Python of the machine that configured it.
        cmd = [f"{recorded_build}/{rel}", "--source", f"{recorded_build}/../tests/x"]
        if name == "gpu-vsr-run":
            cmd = ["/nonexistent/python3", "-c",
                   "import os, sys; os.execv(sys.argv[1], sys.argv[1:])",
                   f"{recorded_build}/{rel}", "--source", f"{recorded_build}/../tests/x"]
        tests.append({"name": name, "suite": ["vibespatial-raster:gpu"], "cmd": cmd,
                      "env": {"VIBESPATIAL_CUDA_DRIVER": "",
                              "VSR_EMULATOR": f"{recorded_build}/tools/emu.so",
                              "VSR_LIBS": f"{recorded_build}/src:/usr/lib"},
                      "timeout": 30, "workdir": None, "is_parallel": False})
    tests.append({"name": "not-gpu", "suite": ["vibespatial-raster:memory"], "cmd": ["false"],
                  "env": {}, "timeout": 30})
    os.makedirs(os.path.join(build, "meson-info"), exist_ok=True)
    with open(os.path.join(build, "meson-info", "intro-tests.json"), "w") as f:
        json.dump(tests, f)
    # A real ELF file that the tests' environment names, so the staging strips one and the
    # loader check reads it.
    shutil.copy2("/bin/true", os.path.join(build, "tools", "emu.so"))
    # A program no gpu test names: not staged.
    write_exe(os.path.join(build, "tests", "memory", "test-pool"), "#!/bin/sh\nexit 0\n")
    write_exe(os.path.join(build, "src", "libvsr.so.1"), "library stand-in\n")
    os.makedirs(os.path.join(build, "src", "lib.a.p"), exist_ok=True)
    with open(os.path.join(build, "src", "lib.a.p", "object.o"), "w") as f:
        f.write("object")
    if big:
        with open(os.path.join(build, "src", "libhuge.so"), "wb") as f:
            f.truncate(big)


def setup(tmp):
    repo = os.path.join(tmp, "repo")
    os.makedirs(os.path.join(repo, "tools"))
    for name in ("gpu-check", "gpu-record", "gpu_check_build.py"):
        shutil.copy2(os.path.join(SRC, "tools", name), os.path.join(repo, "tools", name))
    os.makedirs(os.path.join(repo, "docs"))
    shutil.copy2(os.path.join(SRC, "docs", "gpu-verification.md"),
                 os.path.join(repo, "docs", "gpu-verification.md"))
    os.makedirs(os.path.join(repo, "tests", "conformance"))
    with open(os.path.join(repo, "tests", "conformance", "case_table.cpp"), "w") as f:
        f.write('    CaseInfo{"init.flags_must_be_zero", "§3.1", E::hdr, K::normal, false},\n'
                '    CaseInfo{"device.bad_ordinal", "§1.3", E::probe, K::normal, false},\n')
    with open(os.path.join(repo, "meson.build"), "w") as f:
        f.write("project('scratch', 'cpp')\n")
    with open(os.path.join(repo, ".gitignore"), "w") as f:
        f.write("/build*/\n/.carry/\n")
    write_exe(os.path.join(repo, "python", "tests", "gpu", "run-gpu-python-check"), PYTHON_CHECK)
    fakebin = os.path.join(tmp, "bin")
    write_exe(os.path.join(fakebin, "nvidia-smi"), NVIDIA_SMI)
    write_exe(os.path.join(fakebin, "meson"), FAKE_MESON)
    write_exe(os.path.join(fakebin, "ninja"), FAKE_NINJA)
    data = os.path.join(tmp, "data")
    os.makedirs(data)
    shutil.copy2(__file__, os.path.join(data, "stubs.py"))
    with open(os.path.join(data, "make_build.py"), "w") as f:
        f.write(MAKE_BUILD)
    paths = {"make": os.path.join(data, "make_build.py"),
             "record": os.path.join(tmp, "record.txt"), "pids": os.path.join(tmp, "pids.txt")}
    for name, content in (("conf.txt", CONF_STDOUT), ("dispatch.json", json.dumps(BENCH_DISPATCH)),
                          ("alloc.json", json.dumps(BENCH_ALLOC))):
        paths[name] = os.path.join(data, name)
        with open(paths[name], "w") as f:
            f.write(content)
    return repo, fakebin, paths


def carry_build(repo, stale=False):
    """The carried build, as --prepare leaves it: stub programs and a stamp of the sources."""
    staged = os.path.join(repo, ".carry", "gpu-build")
    write_build(staged, OLD_BUILD, OLD_ROOT)
    files = source_hashes(repo)
    if stale:
        files["meson.build"] = "0" * 64
    with open(os.path.join(staged, "gpu-check-stamp.json"), "w") as f:
        json.dump({"source_root": OLD_ROOT, "build_dir": OLD_BUILD, "made_utc": "then",
                   "files": files}, f)


def source_hashes(repo):
    """The stamp's hashes, as tools/gpu_check_build.py computes them."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "gpu_check_build_copy", os.path.join(repo, "tools", "gpu_check_build.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.source_hashes(repo)


def environment(tmp, fakebin, paths, out, **extra):
    env = dict(os.environ)
    for k in list(env):
        if k.startswith("STUB_") or k.startswith("GPU_CHECK_") or k == "OUT":
            del env[k]
    env.update({"PATH": fakebin + os.pathsep + env.get("PATH", ""), "OUT": out,
                "STUB_CONF": paths["conf.txt"], "STUB_BENCH_DISPATCH": paths["dispatch.json"],
                "STUB_BENCH_ALLOC": paths["alloc.json"], "STUB_RECORD": paths["record"],
                "STUB_MAKE_BUILD": paths["make"], "STUB_PIDS": paths["pids"]})
    env.update(extra)
    return env


def run_check(tmp, name, stale=False, carried=True, args=(), **extra):
    base = os.path.join(tmp, name)
    repo, fakebin, paths = setup(base)
    if carried:
        carry_build(repo, stale=stale)
    out = os.path.join(base, "out")
    env = environment(base, fakebin, paths, out, **extra)
    t0 = time.monotonic()
    r = subprocess.run([os.path.join(repo, "tools", "gpu-check"), *args], env=env,
                       capture_output=True, text=True, timeout=300)
    took = time.monotonic() - t0
    files = sorted(os.listdir(out)) if os.path.isdir(out) else []
    summary = read(os.path.join(out, "summary.txt"))
    data = None
    if os.path.exists(os.path.join(out, "gpu-check.json")):
        data = json.load(open(os.path.join(out, "gpu-check.json")))
    record = read(paths["record"])
    print(f"--- {name}: exit {r.returncode} in {took:.1f} s, files {files}\n{r.stdout}"
          f"{r.stderr[-3000:]}", file=sys.stderr)
    return r, files, summary, data, repo, record, took


def kill_stubs(pids):
    for line in read(pids).split():
        try:
            os.kill(int(line), signal.SIGKILL)
        except (ValueError, ProcessLookupError):
            pass


def read(path):
    if not os.path.exists(path):
        return ""
    with open(path, errors="replace") as f:
        return f.read()


def status_of(data, step_id):
    for s in data["steps"]:
        if s["id"] == step_id:
            return s["status"]
    return None


def table_row(summary, name):
    for line in summary.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "|"):
            return [c.strip() for c in line.split("|")]
    return None


EXPECTED_FILES = ["gpu-check-logs.tar.gz", "gpu-check.json", "progress.txt", "summary.txt"]
STEP_IDS = (["gpu", "prebuilt", "driver"] + ["test:" + n for n in GPU_TESTS]
            + ["probe", "probe-sticky", "bench-dispatch", "bench-alloc", "history", "python"])


def main():
    with tempfile.TemporaryDirectory() as tmp:
        plan_checks(tmp)
        whole_run_checks(tmp)
        failure_checks(tmp)
        kill_checks(tmp)
        build_here_checks(tmp)
        prepare_checks(tmp)
    if failures:
        print(f"{len(failures)} check(s) failed", file=sys.stderr)
        sys.exit(1)
    print("gpu-check on a CPU: all checks passed")


def plan_checks(tmp):
    # The designed plan fits the budget with time to spare; the dry run prints its sum.
    r, files, *_ = run_check(tmp, "dry", args=["--dry-run"])
    check(r.returncode == 0, f"dry run: exit {r.returncode}")
    sums = [ln for ln in r.stdout.splitlines() if ln.strip().startswith("sum ")]
    check(len(sums) == 2 and "fits" in sums[0] and "of a 540 s budget" in sums[0],
          f"dry run: the sums {sums}")
    total = int(sums[0].split()[1]) if sums else 10**9
    check(total <= 530, f"dry run: the designed plan's limits sum to {total} s, over 530")
    check(files == [], f"dry run: nothing written ({files})")
    check("dropped" in r.stdout, "dry run: a build here drops the last steps")
    # Too small a budget: the dry run says so and fails.
    r, *_ = run_check(tmp, "dry-small", args=["--dry-run"], GPU_CHECK_BUDGET_S="300")
    check(r.returncode == 1 and "DOES NOT FIT" in r.stdout, f"dry run, 300 s: {r.returncode}")
    r, *_ = run_check(tmp, "bad-arg", args=["--bogus"])
    check(r.returncode == 2, f"unknown option: exit {r.returncode}")


def whole_run_checks(tmp):
    r, files, summary, data, repo, record, _ = run_check(tmp, "pass")
    check(r.returncode == 0, f"pass: exit status {r.returncode}, expected 0")
    check(files == EXPECTED_FILES, f"pass: files {files}")
    check(data is not None and data["exit_status"] == 0, "pass: JSON exit_status 0")
    if not data:
        return
    ids = [s["id"] for s in data["steps"]]
    check(ids == STEP_IDS, f"pass: step ids {ids}")
    check(all(s["status"] == "PASS" for s in data["steps"]),
          f"pass: statuses {[(s['id'], s['status']) for s in data['steps']]}")
    fig = [s["figure"] for s in data["steps"] if s["id"] == "history"][0]
    check("compute 1.500 s of 2.000 s (75%)" in fig and "snapshot 8 bytes" in fig,
          f"pass: history figure {fig!r}")
    check(data["machine"].get("gpu", "").startswith("NVIDIA H200"), "pass: machine.gpu")
    check(data["machine"].get("cuda_driver") == "13.0", "pass: machine.cuda_driver")
    check(data["machine"].get("budget_seconds") == 540, "pass: machine.budget_seconds")
    cases = data["conformance"]["default"]["cases"]
    check([c["result"] for c in cases] == ["PASS", "PASS", "FAIL"], f"pass: cases {cases}")
    check(data["bench"]["dispatch"]["summary"][1]["value"] == 0.62, "pass: bench JSON kept")
    check(len(data["probe"]["default"]) == 2 and data["probe"]["sticky"][0]["code"] == 700,
          f"pass: probe {data['probe']}")
    fig = [s["figure"] for s in data["steps"] if s["id"] == "bench-dispatch"][0]
    check("pipe/h2d 0.62!" in fig and "gpu/d2d 0.91" in fig, f"pass: dispatch figure {fig!r}")
    # The carried build's paths are mapped onto this checkout: programs, arguments, env.
    staged = os.path.join(repo, ".carry", "gpu-build")
    line = next((ln for ln in record.splitlines() if ln.startswith("ops-gpu ")), "")
    check(f"--source {repo}/tests/x" in line and f"EMU=[{staged}/tools/emu.so]" in line
          and f"LIBS=[{staged}/src:/usr/lib]" in line and "VIBESPATIAL_CUDA_DRIVER=[]" in line,
          f"pass: relocated test: {line!r}")
    line = next((ln for ln in record.splitlines() if ln.startswith("gpu-vsr-run ")), "")
    check(f"--source {repo}/tests/x" in line,
          f"pass: a test run by a Python that is not here runs with this one: {line!r}")
    check(OLD_ROOT not in record, "pass: no path of the preparing machine reached a test")
    check("not-gpu" not in record, "pass: only the gpu suite ran")
    row = table_row(summary, "test: ops-gpu")
    check(row is not None and row[1] == "PASS" and "4 passed" in "|".join(row[3:]),
          f"pass: row {row}")
    check(r.stdout.strip().endswith(summary.strip().splitlines()[-1]),
          "pass: the table is the last thing printed")
    with tarfile.open(os.path.join(tmp, "pass", "out", "gpu-check-logs.tar.gz")) as t:
        names = t.getnames()
    for log in ("machine.txt", "prebuilt.log", "vsr-info.txt", "test-ops-gpu.log", "testlog.json",
                "probe.txt", "probe-sticky.txt", "bench-dispatch.json", "memory-history.pickle",
                "python.log"):
        check(f"gpu-check-logs/{log}" in names, f"pass: {log} in the archive ({names})")
    progress = read(os.path.join(tmp, "pass", "out", "progress.txt"))
    check("test: ops-gpu (limit" in progress, "pass: progress.txt holds what was printed")

    # The record made from that JSON, and the document and case table updated.
    gj = os.path.join(tmp, "pass", "out", "gpu-check.json")
    rec = subprocess.run([os.path.join(repo, "tools", "gpu-record"), "record", gj],
                         capture_output=True, text=True)
    check(rec.returncode == 0, f"record: exit {rec.returncode}: {rec.stderr}")
    md = rec.stdout
    check("| test: ops-gpu | PASS |" in md, "record: step table")
    check("2 passed, to be marked `seen_on_gpu`: init.flags_must_be_zero, version.driver_version"
          in md, "record: conformance ledger")
    check("device.bad_ordinal (FAIL)" in md, "record: failed case listed")
    check("| default | a | (a) cuMemMap onto a mapped range | 1 CUDA_ERROR_INVALID_VALUE |" in md,
          "record: §10 answer row")
    check("| pipelined per-band GPU dispatch / pinned H2D GB/s | 0.62 | >= 0.80 | no |" in md,
          "record: benchmark row")
    doc = os.path.join(repo, "docs", "gpu-verification.md")
    table = os.path.join(repo, "tests", "conformance", "case_table.cpp")
    upd = subprocess.run([os.path.join(repo, "tools", "gpu-record"), "record", gj, "--update", doc,
                          "--flip-seen", table], capture_output=True, text=True)
    check(upd.returncode == 0, f"record --update: {upd.stderr}")
    text = read(doc)
    check("NVIDIA H200" in text, "record --update: run inserted")
    check(text.index("## Runs so far") < text.index("### ") < text.index("## How to fill"),
          "record --update: inside 'Runs so far'")
    ct = read(table)
    check('"init.flags_must_be_zero", "§3.1", E::hdr, K::normal, true}' in ct
          and '"device.bad_ordinal", "§1.3", E::probe, K::normal, false}' in ct,
          f"record --flip-seen: {ct}")


def failure_checks(tmp):
    # A failing step makes the exit status 1, and the steps after it still run.
    for step, sid in (("conformance", "probe"), ("gpu-smoke-dispatch", "test:gpu-smoke-dispatch"),
                      ("bench", "bench-alloc"), ("history", "history"), ("python", "python"),
                      ("ops-gpu", "test:ops-gpu")):
        r, files, summary, data, *_ = run_check(tmp, "fail-" + step, STUB_FAIL=step)
        check(r.returncode == 1, f"fail {step}: exit status {r.returncode}, expected 1")
        check(files == EXPECTED_FILES, f"fail {step}: files {files}")
        check(data is not None and status_of(data, sid) == "FAIL",
              f"fail {step}: status {data and status_of(data, sid)}")
        check(data is not None and status_of(data, "python") in ("PASS", "FAIL"),
              f"fail {step}: the last step still ran")
    # A GPU visible and every gpu test skipped: nothing was checked, a failure.
    r, files, summary, data, *_ = run_check(tmp, "all-skip", STUB_ALL_SKIP="1")
    check(r.returncode == 1, f"all skipped with a GPU: exit status {r.returncode}, expected 1")
    check(data is not None and status_of(data, "tests") == "FAIL", "all skipped: a FAIL row")
    # No GPU: the device steps skip, exit 77 (never a pass).
    r, files, summary, data, *_ = run_check(tmp, "no-gpu", STUB_NO_GPU="1", STUB_ALL_SKIP="1")
    check(r.returncode == 77, f"no GPU: exit status {r.returncode}, expected 77")
    check(data is not None and status_of(data, "gpu") == "SKIP"
          and status_of(data, "bench-alloc") == "SKIP", "no GPU: device steps SKIP")
    # No carried build and a GPU: built here; a GPU visible with no test built fails.
    r, files, summary, data, *_ = run_check(tmp, "no-tests", carried=False, STUB_FAIL="build")
    check(r.returncode == 1 and data is not None and status_of(data, "tests") == "FAIL",
          f"nothing built with a GPU: exit {r.returncode}")


def kill_checks(tmp):
    # Killed in the middle (the device tool at its limit kills the command's process group):
    # what was done is under $OUT, the step running marked so, the rest listed as not run.
    base = os.path.join(tmp, "killed")
    repo, fakebin, paths = setup(base)
    carry_build(repo)
    out = os.path.join(base, "out")
    env = environment(base, fakebin, paths, out, STUB_HANG="gpu-vsr-run")
    p = subprocess.Popen([os.path.join(repo, "tools", "gpu-check")], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and "test: gpu-vsr-run (limit" not in read(
            os.path.join(out, "progress.txt")):
        time.sleep(0.2)
    time.sleep(1)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    kill_stubs(paths["pids"])
    files = sorted(os.listdir(out))
    check(files == EXPECTED_FILES, f"killed: files {files}")
    data = json.load(open(os.path.join(out, "gpu-check.json")))
    check(str(data["exit_status"]).startswith("incomplete"), f"killed: {data['exit_status']}")
    check(status_of(data, "test:ops-gpu") == "PASS" and status_of(data, "test:gpu-smoke-tier-a")
          == "PASS", "killed: the steps done are there")
    check(status_of(data, "test:gpu-vsr-run") == "RUNNING", "killed: the step cut off")
    check(status_of(data, "python") == "NOT RUN", "killed: the steps not reached")
    with tarfile.open(os.path.join(out, "gpu-check-logs.tar.gz")) as t:
        check("gpu-check-logs/test-ops-gpu.log" in t.getnames(), "killed: the logs so far")
    row = table_row(read(os.path.join(out, "summary.txt")), "test: gpu-vsr-run")
    check(row is not None and row[1] == "RUNNING", f"killed: summary row {row}")

    # A step that hangs is stopped at its limit (the unused time of the steps before it added),
    # and the steps after it get theirs: 15 steps of 4 s and 10 s kept, so the budget is 70 s.
    r, files, summary, data, _, _, took = run_check(tmp, "hang", STUB_HANG="conformance-gpu",
                                                    GPU_CHECK_BUDGET_S="70",
                                                    GPU_CHECK_LIMITS="*=4")
    check(r.returncode == 1, f"hang: exit status {r.returncode}, expected 1")
    check(data is not None and status_of(data, "test:conformance-gpu") == "TIMEOUT"
          and status_of(data, "test:gpu-smoke-tier-a") == "PASS"
          and status_of(data, "python") == "PASS", "hang: stopped, and the rest ran")
    check(took < 70, f"hang: the run took {took:.0f} s of a 70 s budget")
    secs = [s["seconds"] for s in data["steps"] if s["id"] == "test:conformance-gpu"] if data else []
    check(secs and 4 <= secs[0] <= 25, f"hang: stopped after {secs} s (its 4 s and the unused)")
    r, *_ = run_check(tmp, "bad-limits", GPU_CHECK_LIMITS="python=soon")
    check(r.returncode == 2, f"a bad GPU_CHECK_LIMITS: exit {r.returncode}")


def build_here_checks(tmp):
    # A carried build of other sources: configured and built here, with warnings not errors,
    # and its own tests run; in a 300 s budget the last steps are dropped.
    r, files, summary, data, repo, record, _ = run_check(tmp, "stale", stale=True,
                                                         GPU_CHECK_BUDGET_S="300")
    check(r.returncode == 0, f"stale: exit status {r.returncode}")
    check(data is not None and status_of(data, "prebuilt") == "SKIP"
          and status_of(data, "configure") == "PASS" and status_of(data, "build") == "PASS"
          and status_of(data, "test:ops-gpu") == "PASS", "stale: built here and tested")
    fig = [s["figure"] for s in data["steps"] if s["id"] == "prebuilt"][0] if data else ""
    check("meson.build" in fig, f"stale: the changed source is named: {fig!r}")
    setup_line = next((ln for ln in record.splitlines() if ln.startswith("meson setup")), "")
    check("-Dwerror=false" in setup_line and "-Dgpu-archs=9.0" in setup_line,
          f"stale: configured without werror: {setup_line!r}")
    check(data is not None and any("dropped" in s["figure"] for s in data["steps"]),
          "stale: the steps that do not fit after a build are dropped")


def prepare_checks(tmp):
    base = os.path.join(tmp, "prepare")
    repo, fakebin, paths = setup(base)
    subprocess.run(["git", "init", "-q", repo], check=True)
    subprocess.run(["git", "-C", repo, "add", "-A"], check=True)
    header = os.path.join(base, "doctest.h")
    with open(header, "w") as f:
        f.write("// doctest stand-in\n")
    env = environment(base, fakebin, paths, os.path.join(base, "out"), DOCTEST_HEADER=header,
                      GPU_CHECK_SKIP_WHEELS="1")
    p = subprocess.run([os.path.join(repo, "tools", "gpu-check"), "--prepare"], env=env,
                       capture_output=True, text=True)
    check(p.returncode == 0, f"prepare: exit {p.returncode}: {p.stderr[-2000:]}")
    check(os.path.exists(os.path.join(repo, ".carry", "doctest", "doctest", "doctest.h")),
          "prepare: header in .carry/doctest/doctest/")
    check('carry: [".carry"]' in p.stdout, f"prepare: carry list: {p.stdout}")
    check('run(command="tools/gpu-check", carry=[".carry"], timeout_s=600)' in p.stdout,
          f"prepare: the call: {p.stdout}")
    record = read(paths["record"])
    setup_line = next((ln for ln in record.splitlines() if ln.startswith("meson setup")), "")
    check("-Dwerror=false" in setup_line and "-Dcuda=enabled" in setup_line
          and "-Dgpu-archs=9.0" in setup_line, f"prepare: configure {setup_line!r}")
    staged = os.path.join(repo, ".carry", "gpu-build")
    stamp = json.load(open(os.path.join(staged, "gpu-check-stamp.json")))
    check(stamp["source_root"] == repo and "meson.build" in stamp["files"],
          f"prepare: stamp {stamp.get('source_root')}")
    check(os.path.exists(os.path.join(staged, "tools", "vsr-run", "vsr-run"))
          and os.path.exists(os.path.join(staged, "meson-info", "intro-tests.json"))
          and os.path.exists(os.path.join(staged, "src", "libvsr.so.1"))
          and not os.path.exists(os.path.join(staged, "src", "lib.a.p"))
          and not os.path.exists(os.path.join(staged, "tests", "memory", "test-pool")),
          "prepare: the gpu steps' programs, libraries and the test list staged; objects and "
          "the CPU suites' programs left out")
    check("travels:" in p.stderr and "of 64.0 MiB" in p.stderr, "prepare: the size is printed")
    # The prepared checkout runs as a whole (the stamp matches), with the carried build.
    env_run = environment(base, fakebin, paths, os.path.join(base, "out"))
    r = subprocess.run([os.path.join(repo, "tools", "gpu-check")], env=env_run,
                       capture_output=True, text=True, timeout=300)
    check(r.returncode == 0, f"prepare then run: exit {r.returncode}: {r.stderr[-2000:]}")
    # Over the device tool's 64 MiB: an error naming the largest file.
    env["STUB_MAKE_BUILD"] = os.path.join(base, "data", "make_big.py")
    with open(env["STUB_MAKE_BUILD"], "w") as f:
        f.write(MAKE_BUILD.replace("write_build(sys.argv[1], sys.argv[2], sys.argv[3])",
                                   "write_build(sys.argv[1], sys.argv[2], sys.argv[3], "
                                   "big=65 << 20)"))
    p = subprocess.run([os.path.join(repo, "tools", "gpu-check"), "--prepare"], env=env,
                       capture_output=True, text=True)
    check(p.returncode == 1 and "over the device tool's 64.0 MiB" in p.stderr
          and "libhuge.so" in p.stderr, f"prepare, too big: {p.returncode} {p.stderr[-500:]}")
    p = subprocess.run([os.path.join(repo, "tools", "gpu-check"), "--prepare"],
                       env=dict(env, DOCTEST_HEADER=header + ".missing"),
                       capture_output=True, text=True)
    check(p.returncode == 1 and "doctest-dev" in p.stderr, "prepare: a missing header is an error")


if __name__ == "__main__":
    main()
