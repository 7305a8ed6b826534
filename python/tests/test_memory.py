# SPDX-License-Identifier: Apache-2.0
"""vibespatial_raster.memory: tiers, the seed's statistics keys, OOM handlers, error mapping."""

from __future__ import annotations

import gc
import sys

import numpy as np
import pytest
from conftest import EMULATED_DEVICE_MEMORY, run_python

import vibespatial_raster as vsr
from vibespatial_raster import _core, memory
from vibespatial_raster.memory import DeviceBuffer

MIB = 1 << 20
ALWAYS = {"tier", "configured"}
POOL_KEYS = {"current_bytes", "current_count", "peak_bytes", "peak_count", "total_bytes",
             "total_count"}
FALLBACK_KEYS = {"used_bytes", "free_bytes", "total_bytes"}
OURS = {"device", "mapped_bytes", "reserved_bytes", "pool_free_bytes", "largest_free_block",
        "oom_recoveries", "granularity", "small_block_limit", "tier_reason", "owners"}


def test_default_tier_is_b_and_configuration_is_idempotent():
    assert memory.configure_memory_pool() == "B"
    assert memory.configure_memory_pool() == "B"


def test_tier_b_stats_have_exactly_the_seed_keys_plus_ours():
    memory.configure_memory_pool()
    s = memory.memory_pool_stats()
    assert set(s) == ALWAYS | POOL_KEYS | {"pool_size"} | OURS
    assert s["tier"] == "B" and s["configured"] is True
    buf = DeviceBuffer(MIB)
    s = memory.memory_pool_stats(device=0)
    assert s["granularity"] == 2 * MIB and s["pool_size"] >= 2 * MIB and s["device"] == 0
    buf.close()


@pytest.mark.parametrize(
    ("env", "tier", "keys"),
    [
        ({"VIBESPATIAL_GPU_POOL_ONLY": "1"}, "A", POOL_KEYS | {"pool_size"}),
        ({"VIBESPATIAL_GPU_MANAGED_MEMORY": "1"}, "C", POOL_KEYS),
        ({"VSR_EMU_VMM": "0"}, "fallback",
         FALLBACK_KEYS | {"used_count", "peak_used_count", "allocation_count"}),
    ],
)
def test_each_tier_reports_its_seed_keys(env, tier, keys):
    out = run_python(
        """
        from vibespatial_raster import memory
        before = memory.memory_pool_stats()
        assert before["tier"] == "" and before["configured"] is False, before
        assert set(before) == {"tier", "configured"} | OURS, before
        tier = memory.configure_memory_pool()
        buf = memory.DeviceBuffer(3 << 20)
        s = memory.memory_pool_stats()
        print(tier, sorted(s))
        if tier == "fallback":
            assert s["used_bytes"] >= 3 << 20 and s["total_bytes"] == s["used_bytes"] + s["free_bytes"]
        else:
            assert s["current_bytes"] == 3 << 20 and s["current_count"] == 1, s
            assert s["total_bytes"] == 3 << 20 and s["peak_bytes"] == 3 << 20, s
        buf.close()
        """.replace("OURS", repr(OURS)),
        env,
    )
    got_tier, keys_text = out.split(" ", 1)
    assert got_tier == tier
    assert set(eval(keys_text)) == ALWAYS | keys | OURS


def test_allocations_are_counted_and_given_back(pool_baseline):
    before = memory.memory_pool_stats()
    buf = DeviceBuffer(3 * MIB)
    small = DeviceBuffer(1000)
    s = memory.memory_pool_stats()
    assert s["current_bytes"] == before["current_bytes"] + 3 * MIB + 1000
    assert s["current_count"] == before["current_count"] + 2
    assert s["total_count"] == before["total_count"] + 2
    assert buf.ptr % 256 == 0 and buf.size == 3 * MIB and not buf.closed
    buf.close()
    assert buf.closed
    buf.close()  # idempotent
    del small
    gc.collect()
    assert memory.memory_pool_stats()["current_bytes"] == before["current_bytes"]


def test_device_buffer_rejects_bad_sizes():
    with pytest.raises(TypeError):
        DeviceBuffer(-1)
    with pytest.raises(TypeError):
        DeviceBuffer("64")
    assert DeviceBuffer(0).ptr == 0


def test_free_pool_memory_keeps_live_blocks_and_their_data(pool_baseline):
    keep = DeviceBuffer(4 * MIB)
    data = np.arange(4 * MIB, dtype=np.uint8)
    _core.memcpy(keep.ptr, data.ctypes.data, data.nbytes, _core.COPY_HOST_TO_DEVICE)
    drop = DeviceBuffer(16 * MIB)
    drop.close()
    assert memory.memory_pool_stats()["pool_free_bytes"] >= 16 * MIB
    memory.free_pool_memory()
    assert memory.memory_pool_stats()["pool_free_bytes"] == 0
    back = np.empty_like(data)
    _core.memcpy(back.ctypes.data, keep.ptr, back.nbytes, _core.COPY_DEVICE_TO_HOST)
    assert np.array_equal(back, data)
    keep.close()


def _fill_device(step: int) -> list[DeviceBuffer]:
    held = []
    while True:
        try:
            held.append(DeviceBuffer(step))
        except vsr.OutOfMemoryError:
            return held


def test_out_of_memory_is_a_memory_error_with_the_request():
    with pytest.raises(vsr.OutOfMemoryError) as info:
        DeviceBuffer(2 * EMULATED_DEVICE_MEMORY)
    assert isinstance(info.value, MemoryError)
    assert info.value.requested_bytes == 2 * EMULATED_DEVICE_MEMORY
    assert str(2 * EMULATED_DEVICE_MEMORY) in str(info.value)


def test_oom_handler_frees_memory_and_the_request_succeeds(pool_baseline):
    memory.free_pool_memory()
    held = _fill_device(32 * MIB)
    calls = []

    def release_one(requested):
        calls.append(requested)
        if not held:
            return False
        held.pop().close()
        return True

    recoveries = memory.memory_pool_stats()["oom_recoveries"]
    handler_id = memory.add_oom_handler(release_one)
    try:
        assert handler_id != 0
        extra = DeviceBuffer(32 * MIB)  # the device is full: only the handler makes room
        assert calls and calls[0] == 32 * MIB
        assert memory.memory_pool_stats()["oom_recoveries"] == recoveries + 1
        extra.close()
    finally:
        memory.remove_oom_handler(handler_id)
        for b in held:
            b.close()
    memory.remove_oom_handler(handler_id)  # unknown ids are ignored


def test_failing_oom_handler_is_reported_not_raised(monkeypatch, pool_baseline):
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: reported.append(u.exc_value))

    def broken(requested):
        raise ValueError(f"cannot free {requested}")

    memory.free_pool_memory()
    held = _fill_device(32 * MIB)
    handler_id = memory.add_oom_handler(broken)
    try:
        with pytest.raises(vsr.OutOfMemoryError):
            DeviceBuffer(32 * MIB)
    finally:
        memory.remove_oom_handler(handler_id)
        for b in held:
            b.close()
    assert reported and all(isinstance(e, ValueError) for e in reported)


def test_add_oom_handler_rejects_non_callables():
    with pytest.raises(TypeError):
        memory.add_oom_handler(42)


def test_driver_errors_are_cuda_errors_with_code_and_name(emu, pool_baseline):
    memory.free_pool_memory()  # no free page left: a new block needs cuMemCreate
    assert emu.vsr_emu_set_fail(b"cuMemCreate:1+:CUDA_ERROR_UNKNOWN") == 0
    with pytest.raises(vsr.CudaError) as info:
        DeviceBuffer(8 * MIB)
    assert info.value.code == 999
    assert info.value.name == "CUDA_ERROR_UNKNOWN"
    assert not isinstance(info.value, vsr.DriverUnavailableError)
    emu.vsr_emu_set_fail(None)
    DeviceBuffer(8 * MIB).close()  # the pool is usable again


def test_without_a_driver():
    run_python(
        """
        import vibespatial_raster as vsr
        from vibespatial_raster import dispatch, memory
        try:
            memory.configure_memory_pool()
        except vsr.DriverUnavailableError as e:
            assert isinstance(e, vsr.CudaError) and e.code != 0, e
            assert "VIBESPATIAL_CUDA_DRIVER" in str(e)
        else:
            raise AssertionError("no error")
        assert dispatch.available_vram_bytes() == 0
        s = memory.memory_pool_stats()
        assert s["tier"] == "" and s["configured"] is False
        memory.free_pool_memory()
        assert vsr.driver_info()["available"] is False
        plan = dispatch.analyze_raster_plan(5000, 5000, "float64")
        assert plan.strategy == "whole" and plan.estimated_vram_per_tile == 0
        try:
            memory.DeviceBuffer(1024)
        except vsr.DriverUnavailableError:
            pass
        else:
            raise AssertionError("no error")
        """,
        {"VIBESPATIAL_CUDA_DRIVER": "/nonexistent/libcuda-for-vsr-tests.so.1"},
    )


def test_forget_stream_keeps_a_recycled_stream_handle_off_busy_blocks(emu):
    # A stream S writes a block behind a held stream and frees it; forget_stream(S), then S is
    # destroyed and the emulator hands its handle value to the next stream S2 at once (as the real
    # driver may). S2 must not get the block while S's write is pending, unless S2 waits for it.
    import ctypes

    lib = ctypes.CDLL(vsr.testing.emulator_path())
    _core.stream_synchronize(0)  # binds the primary context on this thread
    gate, event, s, s2 = (ctypes.c_void_p() for _ in range(4))
    assert lib.cuStreamCreate(ctypes.byref(gate), 1) == 0
    assert emu.vsr_emu_stream_pause(gate, 1) == 0
    assert emu.vsr_emu_set_option(b"RECYCLE_HANDLES", b"1") == 0
    try:
        assert lib.cuEventCreate(ctypes.byref(event), 2) == 0
        assert lib.cuEventRecord(event, gate) == 0
        assert lib.cuStreamCreate(ctypes.byref(s), 1) == 0
        assert lib.cuStreamWaitEvent(s, event, 0) == 0  # S's work waits behind the gate
        memory.forget_stream(0)  # the legacy stream: a no-op
        buf = DeviceBuffer(1024, stream=s.value)
        p = buf.ptr
        assert lib.cuMemsetD8Async(ctypes.c_uint64(p), 0xAA, ctypes.c_size_t(1024), s) == 0
        buf.close()
        memory.forget_stream(s.value)
        assert lib.cuStreamDestroy_v2(s) == 0
        assert lib.cuStreamCreate(ctypes.byref(s2), 1) == 0
        assert s2.value == s.value  # the same handle value
        buf2 = DeviceBuffer(1024, stream=s2.value)
        if buf2.ptr == p:
            assert lib.cuStreamQuery(s2) == 600  # CUDA_ERROR_NOT_READY: behind S's free
        assert lib.cuMemsetD8Async(ctypes.c_uint64(buf2.ptr), 0x55, ctypes.c_size_t(1024),
                                   s2) == 0
    finally:
        emu.vsr_emu_stream_pause(gate, 0)
        emu.vsr_emu_set_option(b"RECYCLE_HANDLES", b"default")
    assert lib.cuStreamSynchronize(gate) == 0
    assert lib.cuStreamSynchronize(s2) == 0
    back = np.zeros(1024, np.uint8)
    _core.memcpy(back.ctypes.data, buf2.ptr, 1024, _core.COPY_DEVICE_TO_HOST, s2.value)
    assert (back == 0x55).all()  # S's late write did not land in S2's block
    buf2.close()
    memory.forget_stream(s2.value)
    assert lib.cuStreamDestroy_v2(s2) == 0
    assert lib.cuEventDestroy_v2(event) == 0
    assert lib.cuStreamDestroy_v2(gate) == 0


def test_stats_say_why_the_device_has_its_tier():
    memory.configure_memory_pool()
    assert "supports virtual memory management" in memory.memory_pool_stats()["tier_reason"]
