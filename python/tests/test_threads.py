# SPDX-License-Identifier: Apache-2.0
"""The GIL is released during long native work, and the package is safe from Python threads.

GIL release is shown without timing: with the interpreter's switch interval set far beyond the
test's length, a waiting Python thread can run only when the running one gives the GIL up
itself. The main thread does nothing that gives it up between native calls, so the second thread
reporting progress while the main thread is inside its loop of native calls proves that a native
call released the GIL. Were it held, the second thread would run only after the loop."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

from conftest import run_python

from vibespatial_raster import dispatch, io, memory, ops
from vibespatial_raster.buffers import OwnedRasterArray
from vibespatial_raster.memory import DeviceBuffer

BIG = np.random.default_rng(3).random((2, 1024, 1024)).astype(np.float32)


def progress_during(native_call, max_calls: int = 200) -> bool:
    """Whether a second Python thread ran while the main thread was making ``native_call``s."""
    ready = threading.Event()
    go = threading.Event()
    state = {"in_loop": False, "seen_in_loop": None}

    def observer():
        ready.set()
        go.wait()
        # Past here only once the main thread gives the GIL up (the switch interval is huge).
        state["seen_in_loop"] = state["in_loop"]

    old = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    try:
        t = threading.Thread(target=observer)
        t.start()
        ready.wait()  # the observer holds the GIL until it blocks in go.wait()
        state["in_loop"] = True
        go.set()  # the observer now wants the GIL back
        for _ in range(max_calls):
            native_call()
            if state["seen_in_loop"] is not None:
                break
        state["in_loop"] = False
        t.join()
    finally:
        sys.setswitchinterval(old)
    return bool(state["seen_in_loop"])


def test_the_observer_does_not_run_while_the_gil_is_held():
    # The method's control: a loop of calls that keep the GIL shows no progress.
    assert progress_during(lambda: sum(range(1000)), max_calls=50) is False


@pytest.mark.parametrize("name", ["focal_mean", "statistics", "histogram", "move_to",
                                  "to_numpy", "dispatch_cpu", "dispatch_gpu"])
def test_long_native_work_releases_the_gil(name):
    raster = OwnedRasterArray.from_numpy(BIG)
    on_device = OwnedRasterArray.from_numpy(BIG, residency="device")

    def identity(band):
        return band

    calls = {
        "focal_mean": lambda: ops.focal_mean_3x3(raster),
        "statistics": lambda: ops.band_statistics(raster),
        "histogram": lambda: ops.histogram(raster, 64, 0, 1),
        "move_to": lambda: OwnedRasterArray.from_numpy(BIG[0]).move_to("device"),
        "to_numpy": on_device.to_numpy,
        "dispatch_cpu": lambda: dispatch.dispatch_per_band_cpu(raster, identity),
        "dispatch_gpu": lambda: dispatch.dispatch_per_band_gpu(on_device, identity),
    }
    assert progress_during(calls[name])


def test_waiting_for_the_device_releases_the_gil():
    # free_pool_memory waits for the stream work that freed each page. Here that work is held
    # on a paused stream that only a second Python thread releases: with the GIL held during
    # the wait this would never finish (the subprocess's timeout turns that into a failure).
    run_python(
        """
        import ctypes, threading
        from vibespatial_raster import _core, memory, testing
        emu = testing.emulator()
        lib = ctypes.CDLL(testing.emulator_path())
        _core.stream_synchronize(0)
        stream = ctypes.c_void_p()
        assert lib.cuStreamCreate(ctypes.byref(stream), 1) == 0
        buf = memory.DeviceBuffer(8 << 20, stream.value)
        assert emu.vsr_emu_stream_pause(stream, 1) == 0
        assert lib.cuMemsetD8Async(ctypes.c_uint64(buf.ptr), 1, ctypes.c_size_t(8 << 20),
                                   stream) == 0
        buf.close()  # freed on the paused stream: its pages wait for the memset
        waits = emu.vsr_emu_call_count(b"cuEventSynchronize") + \
            emu.vsr_emu_call_count(b"cuStreamSynchronize") + \
            emu.vsr_emu_call_count(b"cuCtxSynchronize")
        def release():
            import time
            while (emu.vsr_emu_call_count(b"cuEventSynchronize") +
                   emu.vsr_emu_call_count(b"cuStreamSynchronize") +
                   emu.vsr_emu_call_count(b"cuCtxSynchronize")) == waits:
                time.sleep(0.001)  # until free_pool_memory waits on the device
            released.append(True)
            emu.vsr_emu_stream_pause(stream, 0)
        released = []
        t = threading.Thread(target=release)
        t.start()
        memory.free_pool_memory()
        t.join()
        assert released == [True]
        assert memory.memory_pool_stats()["pool_free_bytes"] == 0
        lib.cuStreamDestroy_v2(stream)
        print("ok")
        """,
        timeout=120,
    )


@pytest.mark.skipif(not io.io_available(), reason="built without GDAL")
def test_file_io_releases_the_gil(tmp_path):
    path = tmp_path / "big.tif"
    io.write_raster(path, OwnedRasterArray.from_numpy(BIG))
    assert progress_during(lambda: io.read_raster(path))


def test_many_python_threads(pool_baseline):
    # Each thread allocates, plans, moves, runs ops and dispatches on rasters of its own and
    # checks every result; the pool's books balance at the end.
    errors = []
    barrier = threading.Barrier(8)

    def worker(k):
        try:
            barrier.wait()
            rng = np.random.default_rng(k)
            for i in range(6):
                data = rng.integers(0, 1000, (3, 96, 80)).astype(np.int32)
                r = OwnedRasterArray.from_numpy(data, nodata=-1)
                buf = DeviceBuffer(int(rng.integers(1, 4 << 20)))
                r.move_to("device")
                assert np.array_equal(r.to_numpy(), data)
                r.move_to("host")
                doubled = dispatch.dispatch_per_band_cpu(
                    r, lambda b: OwnedRasterArray.from_numpy(b.to_numpy() * 2, nodata=-1))
                assert np.array_equal(doubled.to_numpy(), data * 2)
                on_gpu = dispatch.dispatch_per_band_gpu(
                    r, lambda b: OwnedRasterArray.from_numpy(b.to_numpy() + k, nodata=-1))
                assert np.array_equal(on_gpu.to_numpy(), data + k)
                stats = ops.band_statistics(r)
                assert stats[0].count == 96 * 80 and stats[0].max == data[0].max()
                plan = dispatch.analyze_raster_plan(96 * (i + 1), 80, "int32", band_count=3,
                                                    vram_budget=1 << 20)
                assert plan.n_tiles >= 0
                buf.close()
                if i % 3 == 0:
                    memory.free_pool_memory()
        except BaseException as e:  # noqa: BLE001 - reported to the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_concurrent_close_frees_once(pool_baseline):
    # close() runs without the GIL; from many threads at once exactly one frees the block.
    for _ in range(20):
        buf = DeviceBuffer(1 << 20)
        barrier = threading.Barrier(6)
        errors = []

        def close():
            try:
                barrier.wait()
                buf.close()
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=close) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors and buf.closed
