# SPDX-License-Identifier: Apache-2.0
"""The carried build of tools/gpu-check: what --prepare builds for the GPU machine and stages in
.carry/gpu-build (programs, libraries and the test list, stripped of objects and debug sections),
the stamp of the sources it was built from, what travels to the device tool, and, on the GPU
machine, whether that build can run there and its tests with their paths mapped onto the
checkout."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CARRY = os.path.join(ROOT, ".carry")
STAGED = os.path.join(CARRY, "gpu-build")
STAMP = os.path.join(STAGED, "gpu-check-stamp.json")
PY_WHEEL_DIR = os.path.join(CARRY, "python-wheel")
CARRY_LIST = [".carry"]
CARRY_LIMIT = 64 << 20  # the device tool: tracked + untracked files + carried paths
CALL_LIMIT_S = 600  # one device call
BUILD_DIR = os.environ.get("GPU_CHECK_BUILD_DIR") or "build-gpu"
BUILD_OPTIONS = ["--wrap-mode=nodownload", "--buildtype=debugoptimized", "-Dcuda=enabled",
                 "-Dgpu-archs=9.0", "-Dtests=enabled", "-Dgdal=disabled", "-Dpython=disabled",
                 "-Dwerror=false"]
PY_BUILD_TOOLS = ["meson-python==0.22.1", "pyproject-metadata==0.12.1", "meson==1.12.1",
                  "nanobind==3.1.0"]

BUILD_SUFFIXES = (".cpp", ".hpp", ".h", ".c", ".cc", ".cu", ".cuh", ".inc", ".map", ".wrap")
BUILD_NAMES = ("meson.build", "meson_options.txt")
SKIP_DIRS = {".git", ".carry", "gpu-check-out", "__pycache__", "node_modules"}


PROGRESS = None  # a file that receives what say() prints, as well as stderr


def say(*parts):
    line = "== gpu-check: " + " ".join(str(p) for p in parts)
    print(line, file=sys.stderr, flush=True)
    if PROGRESS is not None:
        PROGRESS.write(line + "\n")
        PROGRESS.flush()


# ---- the sources and what a build depends on ---------------------------------------------------

def build_inputs(root):
    """Relative paths of the files a build depends on, found by walking the tree (the GPU machine
    has no git): sources, headers, meson files, linker maps."""
    found = []
    for top, dirs, files in os.walk(root):
        rel = os.path.relpath(top, root)
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("build")
                         and not d.startswith(".venv"))
        for f in files:
            if f in BUILD_NAMES or f.endswith(BUILD_SUFFIXES):
                found.append(os.path.normpath(os.path.join(rel, f)))
    return sorted(found)


def digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def source_hashes(root):
    return {p: digest(os.path.join(root, p)) for p in build_inputs(root)}


def travelling_files(root):
    """What the device tool sends besides the carried paths: tracked and untracked, not ignored
    files (git's view, where git is here)."""
    r = subprocess.run(["git", "-C", root, "ls-files", "-co", "--exclude-standard", "-z"],
                       capture_output=True)
    if r.returncode != 0:
        return None
    return [p for p in r.stdout.decode("utf-8", "replace").split("\0") if p]


def tree_bytes(path):
    total = 0
    for top, _, files in os.walk(path):
        for f in files:
            p = os.path.join(top, f)
            if not os.path.islink(p):
                total += os.path.getsize(p)
    return total


def mib(n):
    return f"{n / (1 << 20):.1f} MiB"


# ---- --prepare ---------------------------------------------------------------------------------

def run_logged(cmd, log, cwd=ROOT, env=None):
    say("$", " ".join(cmd))
    with open(log, "w") as f:
        r = subprocess.run(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, env=env)
    if r.returncode != 0:
        with open(log, errors="replace") as f:
            tail = f.read().splitlines()[-30:]
        print("\n".join(tail), file=sys.stderr)
    return r.returncode


def is_elf(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


# The programs the steps other than the tests run, relative to the build directory.
STEP_PROGRAMS = ["tools/vsr-info/vsr-info", "tools/vsr-bench/vsr-bench", "tools/vsr-run/vsr-run",
                 "tests/conformance/vsr-conformance"]


def staged_paths(build):
    """What running the GPU steps needs from a build directory, relative to it: the test list,
    the programs of the steps, every file inside the build that a test of the gpu suite names
    (its program, arguments or environment) and every shared library (some are loaded by path).
    Nothing else: the CPU suites' programs would not fit what travels."""
    wanted = set(STEP_PROGRAMS)
    info = os.path.join(build, "meson-info")
    if os.path.isdir(info):
        wanted.update(os.path.join("meson-info", f) for f in os.listdir(info))
    try:
        with open(os.path.join(info, "intro-tests.json")) as f:
            tests = [t for t in json.load(f) if in_gpu_suite(t)]
    except (OSError, ValueError):
        tests = []
    prefix = os.path.abspath(build) + os.sep
    for t in tests:
        for word in list(t.get("cmd", [])) + list((t.get("env") or {}).values()):
            for part in str(word).split(os.pathsep):
                # meson names some files as BUILD/../SOURCE: only files inside the build count.
                part = os.path.normpath(part) if os.path.isabs(part) else part
                if part.startswith(prefix):
                    wanted.add(os.path.relpath(part, build))
    for top, dirs, files in os.walk(build):
        dirs[:] = [d for d in dirs if not d.endswith(".p") and not d.startswith("meson-")]
        for f in files:
            if f.endswith(".so") or ".so." in f:
                wanted.add(os.path.relpath(os.path.join(top, f), build))
    return sorted(p for p in wanted if os.path.islink(os.path.join(build, p))
                  or os.path.isfile(os.path.join(build, p)))


def stage_build(build, dest):
    """Copies staged_paths(build) to dest, ELF files without their debug sections."""
    if os.path.exists(dest):
        shutil.rmtree(dest)
    strip = shutil.which("strip")
    for rel in staged_paths(build):
        src = os.path.join(build, rel)
        out = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        if os.path.islink(src):
            os.symlink(os.readlink(src), out)
        elif strip and is_elf(src) and subprocess.run(
                [strip, "--strip-debug", "-o", out, src], capture_output=True).returncode == 0:
            shutil.copymode(src, out)
        else:
            shutil.copy2(src, out)
    # Libraries the GPU machine's image may lack or have older (the OpenMP runtime of the host
    # band ops, the C++ runtime these were built with): used there only if the loader misses one.
    libs = os.path.join(dest, "fallback-libs")
    os.makedirs(libs, exist_ok=True)
    for name in ("libgomp.so.1", "libstdc++.so.6", "libgcc_s.so.1"):
        r = subprocess.run(["g++", "-print-file-name=" + name], capture_output=True, text=True)
        p = r.stdout.strip()
        if r.returncode == 0 and os.path.isabs(p) and os.path.exists(p):
            shutil.copy2(os.path.realpath(p), os.path.join(libs, name))


def find_python312():
    """A Python 3.12 that runs (a pyenv shim on PATH may name one that is not selected)."""
    cand = [os.environ.get("GPU_CHECK_PYTHON", "")]
    pyenv = os.path.expanduser("~/.pyenv/versions")
    if os.path.isdir(pyenv):
        cand += [os.path.join(pyenv, v, "bin", "python3.12") for v in sorted(os.listdir(pyenv))
                 if v.startswith("3.12")]
    cand.append(shutil.which("python3.12") or "")
    for c in cand:
        if c and os.access(c, os.X_OK) and subprocess.run(
                [c, "-c", "import sys; assert sys.version_info[:2] == (3, 12)"],
                capture_output=True).returncode == 0:
            return c
    return None


def build_python_wheel(work):
    """The package as a wheel for the GPU image's Python 3.12 (no CUDA ops, no GDAL: the image has
    no libgdal), so the Python step installs it instead of compiling."""
    py = find_python312()
    if not py:
        say("no python3.12 here (GPU_CHECK_PYTHON names one): the Python step will build the",
            "package on the GPU machine")
        return False
    venv = os.path.join(work, "py312")
    log = os.path.join(work, "python-wheel.log")
    if run_logged([py, "-m", "venv", venv], log) != 0:
        return False
    vpy = os.path.join(venv, "bin", "python")
    if run_logged([vpy, "-m", "pip", "install", "-q", *PY_BUILD_TOOLS], log) != 0:
        return False
    if os.path.exists(PY_WHEEL_DIR):
        shutil.rmtree(PY_WHEEL_DIR)
    env = dict(os.environ, PATH=os.path.join(venv, "bin") + os.pathsep + os.environ["PATH"])
    rc = run_logged([vpy, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                     "-w", PY_WHEEL_DIR, "-Cbuild-dir=" + os.path.join(ROOT, "build-gpu-py"),
                     "-Csetup-args=-Dcuda=disabled", "-Csetup-args=-Dgdal=disabled",
                     "-Csetup-args=-Dwerror=false", "-Ccompile-args=-j%d" % (os.cpu_count() or 2),
                     "."], log, env=env)
    return rc == 0


def prepare():
    work = tempfile.mkdtemp(prefix="gpu-check-prepare.")
    try:
        return prepare_in(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def prepare_in(work):
    # doctest's header and the Python build tools: for a build on the GPU machine, should the
    # carried one not match the sources there.
    src = os.environ.get("DOCTEST_HEADER", "/usr/include/doctest/doctest.h")
    if not os.path.isfile(src):
        print(f"gpu-check --prepare: {src} not found: apt-get install doctest-dev (or set "
              "DOCTEST_HEADER)", file=sys.stderr)
        return 1
    os.makedirs(os.path.join(CARRY, "doctest", "doctest"), exist_ok=True)
    shutil.copy(src, os.path.join(CARRY, "doctest", "doctest", "doctest.h"))
    say(f"{src} -> .carry/doctest/doctest/doctest.h")
    wheels = os.environ.get("GPU_CHECK_SKIP_WHEELS") != "1"
    if wheels:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                            "--only-binary=:all:", "-d", os.path.join(CARRY, "wheels"),
                            *PY_BUILD_TOOLS])
        if r.returncode != 0:
            say("warning: pip could not download the Python build tools; a build of the",
                "package on the GPU machine will fail")
    if os.environ.get("GPU_CHECK_SKIP_BUILD") != "1":
        build = os.path.join(ROOT, BUILD_DIR)
        meson = shutil.which("meson") or "meson"
        setup = [meson, "setup", build, *BUILD_OPTIONS]
        if os.path.isdir(os.path.join(build, "meson-private")):
            setup.insert(2, "--wipe")
        if run_logged(setup, os.path.join(work, "configure.log")) != 0:
            print("gpu-check --prepare: configure failed", file=sys.stderr)
            return 1
        jobs = os.environ.get("GPU_CHECK_JOBS") or str(os.cpu_count() or 2)
        say(f"building {BUILD_DIR}/ for sm_90 (the CUDA band ops take minutes on few cores)")
        if run_logged(["ninja", "-C", build, "-j", jobs], os.path.join(work, "build.log")) != 0:
            print("gpu-check --prepare: the build failed", file=sys.stderr)
            return 1
        stage_build(build, STAGED)
        stamp = {"source_root": ROOT, "build_dir": build, "options": BUILD_OPTIONS,
                 "made_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "files": source_hashes(ROOT)}
        with open(STAMP, "w") as f:
            json.dump(stamp, f, indent=1, sort_keys=True)
        say(f"{BUILD_DIR}/ staged in .carry/gpu-build ({mib(tree_bytes(STAGED))})")
        if wheels and os.environ.get("GPU_CHECK_SKIP_PYTHON_WHEEL") != "1":
            if build_python_wheel(work):
                say(f"the package as a cp312 wheel in .carry/python-wheel "
                    f"({mib(tree_bytes(PY_WHEEL_DIR))})")
    # What travels must fit the device tool's limit.
    files = travelling_files(ROOT)
    if files is None:
        print("gpu-check --prepare: not a git checkout: cannot tell what travels",
              file=sys.stderr)
        return 1
    tree = sum(os.path.getsize(os.path.join(ROOT, p)) for p in files
               if os.path.isfile(os.path.join(ROOT, p)) and not os.path.islink(
                   os.path.join(ROOT, p)))
    carried = sum(tree_bytes(os.path.join(ROOT, c)) for c in CARRY_LIST)
    total = tree + carried
    say(f"travels: {mib(total)} of {mib(CARRY_LIMIT)} (the tree {mib(tree)}, "
        f"{', '.join(CARRY_LIST)} {mib(carried)})")
    if total > CARRY_LIMIT:
        print(f"gpu-check --prepare: {mib(total)} would travel, over the device tool's "
              f"{mib(CARRY_LIMIT)}: the largest carried files:", file=sys.stderr)
        sizes = []
        for c in CARRY_LIST:
            for top, _, fs in os.walk(os.path.join(ROOT, c)):
                sizes += [(os.path.getsize(os.path.join(top, f)), os.path.join(top, f))
                          for f in fs if not os.path.islink(os.path.join(top, f))]
        for size, p in sorted(sizes, reverse=True)[:8]:
            print(f"  {mib(size)}  {os.path.relpath(p, ROOT)}", file=sys.stderr)
        return 1
    carry = json.dumps(CARRY_LIST)
    print(f"carry: {carry}")
    print(f'device tool call: run(command="tools/gpu-check", carry={carry}, '
          f"timeout_s={CALL_LIMIT_S})")
    return 0


# ---- the carried build -------------------------------------------------------------------------

def read_stamp():
    try:
        with open(STAMP) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def staged_tests():
    stamp = read_stamp()
    if not stamp:
        return None
    try:
        with open(os.path.join(STAGED, "meson-info", "intro-tests.json")) as f:
            tests = json.load(f)
    except (OSError, ValueError):
        return None
    return [relocate_test(t, stamp) for t in tests if in_gpu_suite(t)]


def in_gpu_suite(t):
    return any(s == "gpu" or s.endswith(":gpu") for s in t.get("suite", []))


def relocate(text, stamp):
    """A path (or a list of them joined by ':') of the machine that built the carried build,
    mapped onto this checkout: files of the build into the carried copy, others of the sources
    into the sources here."""
    if not isinstance(text, str):
        return text
    build = stamp["build_dir"].rstrip(os.sep) + os.sep
    root = stamp["source_root"].rstrip(os.sep) + os.sep
    parts = []
    for part in text.split(os.pathsep):
        if os.path.isabs(part):
            part = os.path.normpath(part)
            if (part + os.sep).startswith(build):
                part = os.path.join(STAGED, os.path.relpath(part, build))
            elif (part + os.sep).startswith(root):
                part = os.path.join(ROOT, os.path.relpath(part, root))
        parts.append(part)
    return os.pathsep.join(parts)


def relocate_test(t, stamp):
    t = dict(t)
    t["cmd"] = [relocate(c, stamp) for c in t.get("cmd", [])]
    t["env"] = {k: relocate(v, stamp) for k, v in (t.get("env") or {}).items()}
    if t.get("workdir"):
        t["workdir"] = relocate(t["workdir"], stamp)
    return with_python_here(t)


def with_python_here(t):
    """A test run by a Python that is not on this machine (the one meson found where the build
    was configured) runs with the Python running this instead."""
    if t.get("cmd") and os.path.basename(t["cmd"][0]).startswith("python") and \
            not os.access(t["cmd"][0], os.X_OK):
        t = dict(t, cmd=[sys.executable] + list(t["cmd"][1:]))
    return t


def missing_libraries(paths, env):
    if shutil.which("ldd") is None:
        return []
    missing = set()
    for p in paths:
        r = subprocess.run(["ldd", p], capture_output=True, text=True, env=env)
        for line in (r.stdout + r.stderr).splitlines():
            if "not found" in line:
                missing.add(line.strip())
    return sorted(missing)


def check_prebuilt(env):
    """Whether the carried build can run here: built from these sources, its programs' libraries
    found (with the carried fallback libraries if need be, then added to env's
    LD_LIBRARY_PATH). Returns (usable, why)."""
    stamp = read_stamp()
    if stamp is None:
        return False, "no carried build (run tools/gpu-check --prepare before the run)"
    have = source_hashes(ROOT)
    want = stamp.get("files", {})
    changed = sorted(p for p in set(have) | set(want) if have.get(p) != want.get(p))
    if changed:
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        return False, f"the sources changed since it was built: {', '.join(changed[:3])}{more}"
    absent = [p for p in STEP_PROGRAMS if not os.access(os.path.join(STAGED, p), os.X_OK)]
    if absent:
        return False, "the carried build lacks " + ", ".join(absent)
    elves = []
    for top, _, files in os.walk(STAGED):
        if os.path.basename(top) == "fallback-libs":
            continue
        elves += [os.path.join(top, f) for f in files
                  if is_elf(os.path.join(top, f)) and os.access(os.path.join(top, f), os.X_OK)]
    missing = missing_libraries(elves, env)
    if missing:
        libs = os.path.join(STAGED, "fallback-libs")
        env["LD_LIBRARY_PATH"] = libs + (os.pathsep + env["LD_LIBRARY_PATH"]
                                             if env.get("LD_LIBRARY_PATH") else "")
        still = missing_libraries(elves, env)
        if still:
            return False, "libraries not found: " + "; ".join(still[:3])
        return True, f"built {stamp.get('made_utc', '?')}; with the carried {', '.join(missing)}"
    return True, f"built {stamp.get('made_utc', '?')}, {len(elves)} programs and libraries"
