# SPDX-License-Identifier: Apache-2.0
"""Daemon threads inside the package when the interpreter exits.

Before Python 3.14 CPython ends a daemon thread that asks for the GIL during finalization with
pthread_exit(), a forced unwind; one that meets a noexcept C++ frame aborts the process
("terminate called without an active exception", exit status 134). The package parks such a
thread instead (what CPython 3.14 does), so a process whose daemon threads use the package exits
as cleanly as one whose daemon threads use NumPy: status 0, nothing on stderr. Each case runs a
fresh interpreter several times, since where a thread is when the interpreter exits varies."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from conftest import EMULATED_DEVICE_MEMORY, REAL_DRIVER

from vibespatial_raster import io, testing

RUNS = 4

PRELUDE = """
import os, sys, threading, time
import numpy as np
import vibespatial_raster as vr
from vibespatial_raster import dispatch, io, memory, ops
from vibespatial_raster.buffers import OwnedRasterArray

def start(target, n=3):
    ready = threading.Barrier(n + 1)
    def run():
        ready.wait()
        target()
    for _ in range(n):
        threading.Thread(target=run, daemon=True).start()
    ready.wait()
    time.sleep(0.2)  # the threads are in their loops now
"""

SURFACES = {
    "memory_pool_stats": """
        def loop():
            while True:
                memory.memory_pool_stats()
        start(loop)
    """,
    "device_buffers": """
        def loop():
            while True:
                memory.DeviceBuffer(1 << 16).close()
                memory.free_pool_memory()
        start(loop)
    """,
    "raster_ops": """
        data = np.random.default_rng(0).random((2, 64, 64)).astype(np.float32)
        def loop():
            while True:
                r = OwnedRasterArray.from_numpy(data, nodata=0)
                ops.focal_mean_3x3(r)
                ops.band_statistics(r)
                ops.histogram(r, 8, 0, 1)
                r.move_to("device")
                r.move_to("host")
        start(loop)
    """,
    "oom_handler": """
        hold = memory.DeviceBuffer(400 << 20)  # what is left cannot hold 200 MiB
        memory.add_oom_handler(lambda n: (time.sleep(0), False)[1])
        def loop():
            while True:
                try:
                    memory.DeviceBuffer(200 << 20)
                except vr.OutOfMemoryError:
                    pass
        start(loop)
    """,
    "band_op": """
        raster = OwnedRasterArray.from_numpy(np.ones((4, 32, 32), np.float32))
        def op(band):
            time.sleep(0)  # Python code that gives the GIL up, on the library's workers
            return ops.clip(band, 0, 1)
        def loop():
            while True:
                dispatch.dispatch_per_band_cpu(raster, op)
        start(loop)
    """,
    "failing_band_op": """
        raster = OwnedRasterArray.from_numpy(np.ones((8, 16, 16), np.float32))
        def op(band):
            time.sleep(0)
            raise ValueError("every band fails")  # errors of several workers are dropped
        def loop():
            while True:
                try:
                    dispatch.dispatch_per_band_cpu(raster, op)
                except ValueError:
                    pass
        start(loop)
    """,
    "sys_exit": """
        def loop():
            while True:
                memory.DeviceBuffer(4096)
                OwnedRasterArray.from_numpy(np.zeros((8, 8), np.uint8)).move_to("device")
        start(loop, n=4)
        sys.exit(0)
    """,
}

if io.io_available():
    SURFACES["streamed_io"] = """
        import tempfile
        d = tempfile.mkdtemp()
        src = os.path.join(d, "in.tif")
        io.write_raster(src, OwnedRasterArray.from_numpy(np.ones((2, 96, 96), np.float32)))
        plan = dispatch.analyze_raster_plan(96, 96, "float32", band_count=2,
                                            vram_budget=2 * 64 * 64 * 4 * 3)
        def loop():
            k = threading.get_ident()
            while True:
                io.process_raster_streamed(src, os.path.join(d, f"out{k}.tif"), lambda t: t,
                                           plan, progress=lambda done, total: time.sleep(0))
        start(loop)
    """


def run_script(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if not REAL_DRIVER:
        env["VIBESPATIAL_CUDA_DRIVER"] = testing.emulator_path()
        env["VSR_EMU_DEVICE_MEMORY"] = str(EMULATED_DEVICE_MEMORY)
    for key in ("VIBESPATIAL_GPU_POOL_ONLY", "VIBESPATIAL_GPU_MANAGED_MEMORY"):
        env.pop(key, None)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=timeout)


def assert_clean_exit(code: str, runs: int = RUNS) -> None:
    for i in range(runs):
        proc = run_script(code)
        assert proc.returncode == 0 and "terminate" not in proc.stderr, (
            f"run {i}: exit status {proc.returncode}\n--- stderr\n{proc.stderr}")
        assert proc.stderr == "", f"run {i}: stderr\n{proc.stderr}"


@pytest.mark.parametrize("surface", sorted(SURFACES))
def test_daemon_threads_in_the_package_do_not_abort_the_exit(surface):
    assert_clean_exit(PRELUDE + textwrap.dedent(SURFACES[surface]))


def test_the_control_numpy_daemon_threads_exit_cleanly():
    # The method's control: what plain NumPy gives, and what the package must match.
    assert_clean_exit("""
        import threading, time
        import numpy as np
        def loop():
            a = np.ones(1 << 16)
            while True:
                np.sort(a)
                time.sleep(0)
        for _ in range(3):
            threading.Thread(target=loop, daemon=True).start()
        time.sleep(0.2)
    """, runs=2)


def test_the_main_thread_still_uses_the_package_at_exit():
    # Only threads CPython would end are parked: the thread that finalizes keeps working, in
    # atexit functions (the package's own atexit hook runs among them) while daemon threads are
    # in the package, and in finalizers run by the interpreter's shutdown itself (where
    # Py_IsInitialized() is already false). A parked main thread would hang here.
    proc = run_script(PRELUDE + textwrap.dedent("""
        import atexit
        def late():
            b = memory.DeviceBuffer(1 << 20)
            assert memory.memory_pool_stats()["current_count"] >= 1
            b.close()
            r = OwnedRasterArray.from_numpy(np.ones((2, 8, 8), np.float32)).move_to("device")
            assert r.to_numpy().sum() == 128
            assert ops.band_statistics(r.move_to("host"))[0].count == 64
            print("late ok", flush=True)
        atexit.register(late)
        def loop():
            while True:
                memory.DeviceBuffer(1 << 12).close()
        start(loop)
    """))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "late ok" in proc.stdout and proc.stderr == "", proc.stdout + proc.stderr
    proc = run_script("""
        import os
        from vibespatial_raster import memory
        class AtShutdown:
            def __del__(self):
                b = memory.DeviceBuffer(4096)
                n = memory.memory_pool_stats()["current_count"]
                b.close()
                memory.free_pool_memory()
                os.write(1, b"del ok %d\\n" % n)
        keep = AtShutdown()
    """, timeout=60)
    assert proc.returncode == 0 and "del ok 1" in proc.stdout, proc.stdout + proc.stderr


def test_an_atexit_function_may_join_a_daemon_thread_that_uses_the_package():
    # Registered before the package's own atexit hook (so it runs after it): the daemon thread
    # must still get the GIL back while atexit functions run, or this join would hang.
    proc = run_script("""
        import atexit, threading, time
        stop = threading.Event()
        done = []
        def worker():
            from vibespatial_raster import memory
            while not stop.is_set():
                memory.DeviceBuffer(1 << 12).close()
            done.append(True)
        t = threading.Thread(target=worker, daemon=True)
        def finish():
            stop.set()
            t.join(30)
            print("joined", done, flush=True)
        atexit.register(finish)
        import vibespatial_raster
        t.start()
        time.sleep(0.3)
    """)
    assert proc.returncode == 0 and "joined [True]" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_fork_while_daemon_threads_are_in_the_package():
    # The child has only the forking thread; it refuses the device (CUDA cannot cross fork)
    # with a typed error, keeps host work, and both processes exit cleanly.
    assert_clean_exit(PRELUDE + textwrap.dedent("""
        import warnings
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
        def loop():
            while True:
                memory.DeviceBuffer(1 << 12).close()
                ops.band_statistics(OwnedRasterArray.from_numpy(np.ones((16, 16), np.float32)))
        start(loop)
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                assert memory.memory_pool_stats()["tier"] == ""
                s = ops.band_statistics(OwnedRasterArray.from_numpy(np.ones((4, 4), np.float32)))
                assert s[0].count == 16
                try:
                    memory.DeviceBuffer(4096)
                    code = 3
                except vr.DriverUnavailableError:
                    pass
            except BaseException:
                code = 4
            sys.stdout.flush()
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
    """), runs=2)
