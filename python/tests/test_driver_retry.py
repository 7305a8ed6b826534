# SPDX-License-Identifier: Apache-2.0
"""A failed start of the CUDA driver is not kept: the next call starts it again.

Each case runs a fresh interpreter with the emulator's fault plan (VSR_EMU_FAIL), because the
runtime keeps a driver that started for the life of the process. Once the first failing cuInit
was kept too: every later configure and allocation failed with it and the driver never saw a
second cuInit, though the docstrings said nothing is cached."""

from __future__ import annotations

import json

import pytest

from conftest import REAL_DRIVER, run_python

pytestmark = pytest.mark.skipif(REAL_DRIVER, reason="the emulator's fault plan makes the failure")


def run_json(code: str, fail: str) -> dict:
    return json.loads(run_python(code, env={"VSR_EMU_FAIL": fail}).strip().splitlines()[-1])


def test_a_failed_first_start_is_tried_again_by_the_next_call():
    got = run_json("""
        import json
        import vibespatial_raster as vr
        from vibespatial_raster import memory, testing

        out = {}
        try:
            memory.configure_memory_pool()
        except vr.DriverUnavailableError as e:
            out["first"] = [type(e).__name__, str(e)]
        out["info_after_failure"] = vr.driver_info()["available"]  # the second start
        out["tier"] = memory.configure_memory_pool()
        buf = memory.DeviceBuffer(1 << 20)
        out["ptr"] = buf.ptr != 0
        buf.close()
        out["info"] = vr.driver_info()["available"]
        out["cuInit"] = testing.emulator().vsr_emu_call_count(b"cuInit")
        print(json.dumps(out))
    """, "cuInit:1")
    assert got["first"][0] == "DriverUnavailableError"
    assert "cuInit failed" in got["first"][1]
    assert got["info_after_failure"] is True
    assert got["tier"] == "B" and got["ptr"] and got["info"]
    assert got["cuInit"] == 2  # one failed start, one good, none after


def test_a_first_allocation_that_fails_does_not_doom_the_next():
    got = run_json("""
        import json
        import vibespatial_raster as vr
        from vibespatial_raster import memory, testing

        out = {"errors": []}
        for _ in range(2):
            try:
                memory.DeviceBuffer(4096)
            except vr.DriverUnavailableError as e:
                out["errors"].append(str(e))
        buf = memory.DeviceBuffer(4096)
        out["stats"] = memory.memory_pool_stats()["tier"]
        buf.close()
        out["cuInit"] = testing.emulator().vsr_emu_call_count(b"cuInit")
        print(json.dumps(out))
    """, "cuInit:1:CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,cuInit:2:CUDA_ERROR_OPERATING_SYSTEM")
    assert len(got["errors"]) == 2
    assert "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH" in got["errors"][0]
    assert "CUDA_ERROR_OPERATING_SYSTEM" in got["errors"][1]  # the second start's own reason
    assert got["stats"] == "B"
    assert got["cuInit"] == 3


def test_threads_racing_the_first_configure_agree():
    got = run_json("""
        import json, threading
        import vibespatial_raster as vr
        from vibespatial_raster import memory, testing

        barrier = threading.Barrier(8)
        tiers, failures, odd = [], [], []

        def racer():
            barrier.wait()
            for _ in range(20):
                try:
                    tiers.append(memory.configure_memory_pool())
                    return
                except vr.DriverUnavailableError as e:
                    failures.append(str(e))
                except Exception as e:
                    odd.append(repr(e))

        threads = [threading.Thread(target=racer) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(json.dumps({"tiers": tiers, "failures": len(failures), "odd": odd,
                          "cuInit": testing.emulator().vsr_emu_call_count(b"cuInit")}))
    """, "cuInit:1")
    assert got["odd"] == []
    assert got["tiers"] == ["B"] * 8
    assert got["failures"] >= 1
    assert got["cuInit"] == 2


def test_dask_decides_where_ops_run_again_after_a_failed_start(monkeypatch):
    # dask's "auto" device kept "cpu" for the whole process when the driver was not available
    # at its first look, so a worker whose first start failed never used its GPU.
    pytest.importorskip("dask.array")
    pytest.importorskip("distributed")
    from vibespatial_raster import _core, ops
    from vibespatial_raster import dask as vd

    answers = iter([{"available": False, "emulated": False},
                    {"available": True, "emulated": False}])
    monkeypatch.setattr(vd, "_auto_mode", None)
    monkeypatch.setattr(_core, "driver_info", lambda: next(answers))
    monkeypatch.setattr(ops, "ops_built_with_cuda", lambda: True)
    assert vd._process_mode() == "cpu"
    assert vd._process_mode() == "gpu"
    assert vd._process_mode() == "gpu"  # settled: no third look
