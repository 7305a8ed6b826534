#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""tools/gpu-check tested on a CPU: --dry-run against a fake nvidia-smi and stub steps, in a copy
of the tools in a temporary directory (nothing is written into the source tree). Asserts the exit
status, the files under $OUT (at most 8: exactly three), the table and the JSON; then
tools/gpu-record on that JSON, and --prepare.

usage: test_gpu_check.py SOURCE_ROOT
"""

import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import textwrap

SRC = os.path.abspath(sys.argv[1])

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

STUBS = {
    "nvidia-smi": """\
        #!/bin/sh
        [ -n "$STUB_NO_GPU" ] && exit 9
        case "$*" in
          *--query-gpu*) echo "NVIDIA H200, 580.159.04, 140000 MiB, 143771 MiB" ;;
          *) echo "| NVIDIA-SMI 580.159.04   Driver Version: 580.159.04   CUDA Version: 13.0 |" ;;
        esac
        """,
    "configure": """\
        #!/bin/sh
        case " $* " in
          *" -Dtests=enabled "*) if [ -n "$STUB_NO_DOCTEST" ]; then
              echo "ERROR: doctest not found: apt-get install doctest-dev"; exit 1; fi
            t=YES ;;
          *) t=NO ;;
        esac
        echo "    CUDA language (nvcc): YES"
        echo "    tests               : $t"
        case ",$STUB_FAIL," in *,configure,*) exit 1 ;; esac
        exit 0
        """,
    "build": """\
        #!/bin/sh
        echo "[1/2] Compiling CUDA object src/ops/ops_cuda.cu.o"
        echo "[2/2] Linking target tests/ops/gpu/test-ops-gpu"
        case ",$STUB_FAIL," in *,build,*) exit 1 ;; esac
        exit 0
        """,
    "gpu-suite": """\
        #!/bin/sh
        mkdir -p "$GPU_CHECK_BUILD_DIR/meson-logs"
        python3 - "$GPU_CHECK_BUILD_DIR/meson-logs" <<'PY'
        import json, os, sys
        d = sys.argv[1]
        skip = bool(os.environ.get("STUB_ALL_SKIP"))
        conf = open(os.environ["STUB_CONF"]).read()
        tests = [
            {"name": "ops-gpu", "result": "SKIP" if skip else "OK", "duration": 3.1,
             "returncode": 77 if skip else 0, "stdout": ""},
            {"name": "conformance-gpu", "result": "SKIP" if skip else "OK", "duration": 1.0,
             "returncode": 77 if skip else 0, "stdout": "" if skip else conf},
        ]
        with open(os.path.join(d, "testlog.json"), "w") as f:
            for t in tests:
                f.write(json.dumps(t) + "\\n")
        with open(os.path.join(d, "testlog.txt"), "w") as f:
            f.write("stub testlog\\n")
        PY
        if [ -n "$STUB_ALL_SKIP" ]; then
          printf 'Ok:                 0\\nFail:               0\\nSkipped:            2\\n'
        else
          printf 'Ok:                 2\\nFail:               0\\nSkipped:            0\\n'
        fi
        case ",$STUB_FAIL," in *,gpu-suite,*) printf 'Fail:               1\\n'; exit 1 ;; esac
        exit 0
        """,
    "probe": """\
        #!/bin/sh
        [ -n "$STUB_HANG" ] && exec sleep 600
        echo "vsr-conformance --probe: libcuda.so.1, driver version 13000, granularity 2097152"
        echo "(a) cuMemMap onto a mapped range                              =    1 CUDA_ERROR_INVALID_VALUE"
        echo "(d) cuMemGetInfo after cuMemCreate                            =    0 CUDA_SUCCESS free=1 total=2"
        case ",$STUB_FAIL," in *,probe,*) exit 1 ;; esac
        exit 0
        """,
    "probe-sticky": """\
        #!/bin/sh
        echo "(k) launch after a sticky error                               =  700 CUDA_ERROR_ILLEGAL_ADDRESS"
        case ",$STUB_FAIL," in *,probe-sticky,*) exit 1 ;; esac
        exit 0
        """,
    "bench-dispatch": """\
        #!/bin/sh
        echo "[vsr-bench] progress on stderr" >&2
        cat "$STUB_BENCH_DISPATCH"
        case ",$STUB_FAIL," in *,bench-dispatch,*) exit 1 ;; esac
        exit 0
        """,
    "bench-alloc": """\
        #!/bin/sh
        cat "$STUB_BENCH_ALLOC"
        case ",$STUB_FAIL," in *,bench-alloc,*) exit 1 ;; esac
        exit 0
        """,
    "history": """\
        #!/bin/sh
        # vsr-run --diagnostics --memory-history FILE: the table on stderr, the snapshot written.
        while [ $# -gt 0 ]; do
          [ "$1" = --memory-history ] && printf 'snapshot' > "$2"
          shift
        done
        echo "[vsr-run] diagnostics: where the time went" >&2
        echo "  running focal-mean                          2.0000     1.10" >&2
        echo "    compute (16 tiles)                        1.5000" >&2
        case ",$STUB_FAIL," in *,history,*) exit 1 ;; esac
        exit 0
        """,
    "python": """\
        #!/bin/sh
        case ",$STUB_FAIL," in *,python,*) echo "5 passed, 1 failed, 0 skipped"; exit 1 ;; esac
        echo "6 passed, 0 failed, 0 skipped"
        exit 0
        """,
}

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}", file=sys.stderr)


def write_exe(path, text):
    with open(path, "w") as f:
        f.write(textwrap.dedent(text))
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def setup(tmp):
    repo = os.path.join(tmp, "repo")
    os.makedirs(os.path.join(repo, "tools"))
    for name in ("gpu-check", "gpu-record"):
        shutil.copy2(os.path.join(SRC, "tools", name), os.path.join(repo, "tools", name))
    os.makedirs(os.path.join(repo, "docs"))
    shutil.copy2(os.path.join(SRC, "docs", "gpu-verification.md"),
                 os.path.join(repo, "docs", "gpu-verification.md"))
    os.makedirs(os.path.join(repo, "tests", "conformance"))
    with open(os.path.join(repo, "tests", "conformance", "case_table.cpp"), "w") as f:
        f.write('    CaseInfo{"init.flags_must_be_zero", "§3.1", E::hdr, K::normal, false},\n'
                '    CaseInfo{"device.bad_ordinal", "§1.3", E::probe, K::normal, false},\n')
    stubs = os.path.join(tmp, "stubs")
    fakebin = os.path.join(tmp, "bin")
    os.makedirs(stubs)
    os.makedirs(fakebin)
    for name, text in STUBS.items():
        write_exe(os.path.join(fakebin if name == "nvidia-smi" else stubs, name), text)
    data = os.path.join(tmp, "data")
    os.makedirs(data)
    paths = {}
    for name, content in (("conf.txt", CONF_STDOUT), ("dispatch.json", json.dumps(BENCH_DISPATCH)),
                          ("alloc.json", json.dumps(BENCH_ALLOC))):
        paths[name] = os.path.join(data, name)
        with open(paths[name], "w") as f:
            f.write(content)
    return repo, stubs, fakebin, paths


def run_check(tmp, name, **env_extra):
    repo, stubs, fakebin, paths = setup(os.path.join(tmp, name))
    out = os.path.join(tmp, name, "out")
    os.makedirs(out)
    env = dict(os.environ)
    for k in list(env):
        if k.startswith("STUB_") or k.startswith("GPU_CHECK_"):
            del env[k]
    env.update({
        "PATH": fakebin + os.pathsep + env.get("PATH", ""),
        "OUT": out,
        "GPU_CHECK_STUBS": stubs,
        "GPU_CHECK_BUILD_DIR": os.path.join(tmp, name, "build-gpu"),
        "STUB_CONF": paths["conf.txt"],
        "STUB_BENCH_DISPATCH": paths["dispatch.json"],
        "STUB_BENCH_ALLOC": paths["alloc.json"],
    })
    env.update(env_extra)
    r = subprocess.run([os.path.join(repo, "tools", "gpu-check"), "--dry-run"], env=env,
                       capture_output=True, text=True, timeout=120)
    files = sorted(os.listdir(out))
    summary = ""
    if os.path.exists(os.path.join(out, "summary.txt")):
        summary = open(os.path.join(out, "summary.txt")).read()
    data = None
    if os.path.exists(os.path.join(out, "gpu-check.json")):
        data = json.load(open(os.path.join(out, "gpu-check.json")))
    print(f"--- {name}: exit {r.returncode}, files {files}\n{r.stdout}", file=sys.stderr)
    return r, files, summary, data, repo


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


EXPECTED_FILES = ["gpu-check-logs.tar.gz", "gpu-check.json", "summary.txt"]

with tempfile.TemporaryDirectory() as tmp:
    # 1. Everything passes: exit 0, three files, every step PASS, the JSON complete.
    r, files, summary, data, repo = run_check(tmp, "pass")
    check(r.returncode == 0, f"pass: exit status {r.returncode}, expected 0")
    check(files == EXPECTED_FILES, f"pass: files {files}")
    check(len(files) <= 8, "pass: at most 8 files under $OUT")
    check(data is not None and data["exit_status"] == 0, "pass: JSON exit_status 0")
    if data:
        ids = [s["id"] for s in data["steps"]]
        check(ids == ["gpu", "configure", "build", "gpu-suite", "probe", "probe-sticky",
                      "bench-dispatch", "bench-alloc", "history", "python"],
              f"pass: step ids {ids}")
        fig = [s["figure"] for s in data["steps"] if s["id"] == "history"][0]
        check("compute 1.500 s of 2.000 s (75%)" in fig and "snapshot 8 bytes" in fig,
              f"pass: history figure {fig!r}")
        with tarfile.open(os.path.join(tmp, "pass", "out", "gpu-check-logs.tar.gz")) as tar:
            names = tar.getnames()
        check(any(n.endswith("/memory-history.pickle") for n in names),
              f"pass: the snapshot among the logs: {names}")
        check(all(s["status"] == "PASS" for s in data["steps"]),
              f"pass: statuses {[s['status'] for s in data['steps']]}")
        check(data["machine"].get("gpu", "").startswith("NVIDIA H200"), "pass: machine.gpu")
        check(data["machine"].get("cuda_driver") == "13.0", "pass: machine.cuda_driver")
        check(data["machine"].get("uname_r") == os.uname().release, "pass: machine.uname_r")
        cases = data["conformance"]["default"]["cases"]
        check([c["result"] for c in cases] == ["PASS", "PASS", "FAIL"], f"pass: cases {cases}")
        check(data["bench"]["dispatch"]["summary"][1]["value"] == 0.62, "pass: bench JSON kept")
        check(len(data["probe"]["default"]) == 2 and data["probe"]["sticky"][0]["code"] == 700,
              f"pass: probe {data['probe']}")
        fig = [s["figure"] for s in data["steps"] if s["id"] == "bench-dispatch"][0]
        check("pipe/h2d 0.62!" in fig and "gpu/d2d 0.91" in fig and "overlap 0.93" in fig,
              f"pass: dispatch key figure {fig!r}")
    row = table_row(summary, "meson test --suite gpu")
    check(row is not None and row[1] == "PASS", f"pass: table row {row}")
    check(summary.splitlines()[-11].startswith("step "), "pass: the table's header")
    check(r.stdout.strip().endswith(summary.strip().splitlines()[-1]),
          "pass: the table is the last thing printed")
    import tarfile
    with tarfile.open(os.path.join(tmp, "pass", "out", "gpu-check-logs.tar.gz")) as t:
        names = t.getnames()
    for log in ("machine.txt", "configure.log", "build.log", "meson-test-gpu.log", "testlog.txt",
                "testlog.json", "probe.txt", "probe-sticky.txt", "bench-dispatch.json"):
        check(f"gpu-check-logs/{log}" in names, f"pass: {log} in the archive ({names})")

    # 2. The record made from that JSON, and the document and case table updated.
    gj = os.path.join(tmp, "pass", "out", "gpu-check.json")
    rec = subprocess.run([os.path.join(repo, "tools", "gpu-record"), "record", gj],
                         capture_output=True, text=True)
    check(rec.returncode == 0, f"record: exit {rec.returncode}: {rec.stderr}")
    md = rec.stdout
    check("| meson test --suite gpu | PASS |" in md, "record: step table")
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
    text = open(doc).read()
    check("NVIDIA H200" in text and "\nNone. No session" not in text,
          "record --update: run inserted, placeholder gone")
    check(text.index("## Runs so far") < text.index("### ") < text.index("## How to fill"),
          "record --update: inside 'Runs so far'")
    ct = open(table).read()
    check('"init.flags_must_be_zero", "§3.1", E::hdr, K::normal, true}' in ct
          and '"device.bad_ordinal", "§1.3", E::probe, K::normal, false}' in ct,
          f"record --flip-seen: {ct}")

    # 3. A failing step makes the exit status 1 (the flags were once set in a subshell and lost).
    for step in ("probe", "gpu-suite", "bench-alloc", "history", "build", "python"):
        r, files, summary, data, _ = run_check(tmp, "fail-" + step, STUB_FAIL=step)
        check(r.returncode == 1, f"fail {step}: exit status {r.returncode}, expected 1")
        check(files == EXPECTED_FILES, f"fail {step}: files {files}")
        check(data is not None and status_of(data, step) == "FAIL",
              f"fail {step}: JSON status {data and status_of(data, step)}")
        check(data is not None and data["exit_status"] == 1, f"fail {step}: JSON exit_status")

    # 4. A GPU and no doctest: the tests are not built, which fails the run.
    r, files, summary, data, _ = run_check(tmp, "no-doctest", STUB_NO_DOCTEST="1")
    check(r.returncode == 1, f"no doctest: exit status {r.returncode}, expected 1")
    check(data is not None and status_of(data, "configure") == "FAIL", "no doctest: configure FAIL")
    check(data is not None and status_of(data, "gpu-suite") == "FAIL", "no doctest: gpu suite FAIL")
    row = table_row(summary, "configure")
    check(row is not None and "doctest" in row[3] and "--prepare" in row[3],
          f"no doctest: configure row {row}")

    # 5. A GPU visible and every gpu test skipped: nothing was checked, a failure.
    r, files, summary, data, _ = run_check(tmp, "all-skip", STUB_ALL_SKIP="1")
    check(r.returncode == 1, f"all skipped with a GPU: exit status {r.returncode}, expected 1")
    check(data is not None and status_of(data, "gpu-suite") == "FAIL", "all skipped: gpu suite")

    # 6. No GPU: the device steps skip, exit 77 (never a pass).
    r, files, summary, data, _ = run_check(tmp, "no-gpu", STUB_NO_GPU="1", STUB_ALL_SKIP="1")
    check(r.returncode == 77, f"no GPU: exit status {r.returncode}, expected 77")
    check(data is not None and status_of(data, "gpu") == "SKIP", "no GPU: gpu row SKIP")
    check(data is not None and status_of(data, "gpu-suite") == "SKIP", "no GPU: gpu suite SKIP")

    # 7. The shared budget: a step that hangs is stopped at the budget, the rest not started.
    r, files, summary, data, _ = run_check(tmp, "budget", STUB_HANG="1", GPU_CHECK_BUDGET_S="11")
    check(r.returncode == 1, f"budget: exit status {r.returncode}, expected 1")
    check(data is not None and status_of(data, "gpu-suite") == "PASS", "budget: gpu suite ran")
    check(data is not None and status_of(data, "probe") == "TIMEOUT", "budget: probe stopped")
    check(data is not None and status_of(data, "probe-sticky") == "TIMEOUT"
          and status_of(data, "bench-alloc") == "TIMEOUT", "budget: later steps not started")
    check(data is not None and data["machine"]["total_seconds"] <= 13,
          f"budget: the run ended at the budget ({data and data['machine']['total_seconds']} s)")
    check(files == EXPECTED_FILES, f"budget: files {files}")

    # 8. --prepare puts the header where the build looks and prints the carry list.
    repo8, _, _, _ = setup(os.path.join(tmp, "prepare"))
    header = os.path.join(tmp, "prepare", "doctest.h")
    with open(header, "w") as f:
        f.write("// doctest stand-in\n")
    p = subprocess.run([os.path.join(repo8, "tools", "gpu-check"), "--prepare"],
                       env=dict(os.environ, DOCTEST_HEADER=header, GPU_CHECK_SKIP_WHEELS="1"),
                       capture_output=True, text=True)
    check(p.returncode == 0, f"prepare: exit {p.returncode}: {p.stderr}")
    check(os.path.exists(os.path.join(repo8, ".carry", "doctest", "doctest", "doctest.h")),
          "prepare: header in .carry/doctest/doctest/")
    check('carry: [".carry"]' in p.stdout, f"prepare: carry list: {p.stdout}")
    p = subprocess.run([os.path.join(repo8, "tools", "gpu-check"), "--prepare"],
                       env=dict(os.environ, DOCTEST_HEADER=header + ".missing"),
                       capture_output=True, text=True)
    check(p.returncode == 1 and "doctest-dev" in p.stderr, "prepare: a missing header is an error")

if failures:
    print(f"{len(failures)} check(s) failed", file=sys.stderr)
    sys.exit(1)
print("gpu-check dry run: all checks passed")
