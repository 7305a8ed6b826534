# SPDX-License-Identifier: Apache-2.0
"""pytest setup: every test runs on the host driver emulator that ships with the package.

The runtime loads its driver once per process, on first use, so the emulator is selected here,
before any test touches the device. Tests that need another environment (no driver, a tier
variable, a device of a given size) run a fresh interpreter through ``run_python``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from vibespatial_raster import testing

# 512 MiB: room for the raster tests, small enough for the OOM tests to fill quickly.
EMULATED_DEVICE_MEMORY = 512 << 20

# VSR_PYTEST_REAL_DRIVER=1 (tools/gpu-check's Python step) runs on the real driver instead.
REAL_DRIVER = os.environ.get("VSR_PYTEST_REAL_DRIVER") == "1"
if not REAL_DRIVER:
    testing.use_emulator(device_memory=EMULATED_DEVICE_MEMORY)


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 120) -> str:
    """Runs ``code`` in a fresh interpreter (the emulator selected unless ``env`` says
    otherwise); returns its stdout, and fails the test with its output if it exits nonzero.
    The timeout only guards against a hang (a deadlock would otherwise stop the suite)."""
    full_env = dict(os.environ)
    if not REAL_DRIVER:
        full_env["VIBESPATIAL_CUDA_DRIVER"] = testing.emulator_path()
        full_env["VSR_EMU_DEVICE_MEMORY"] = str(EMULATED_DEVICE_MEMORY)
    for key in ("VIBESPATIAL_GPU_POOL_ONLY", "VIBESPATIAL_GPU_MANAGED_MEMORY"):
        full_env.pop(key, None)
    if env:
        full_env.update(env)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env,
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"subprocess exited {proc.returncode}\n--- stdout\n{proc.stdout}\n"
                    f"--- stderr\n{proc.stderr}")
    return proc.stdout


@pytest.fixture
def emu():
    """The emulator's test API (fault plans cleared after the test)."""
    lib = testing.emulator()
    yield lib
    lib.vsr_emu_set_fail(None)


@pytest.fixture
def pool_baseline():
    """Checks that a test gives back every pool byte it took."""
    from vibespatial_raster import memory

    memory.configure_memory_pool()
    before = memory.memory_pool_stats()["current_bytes"]
    yield before
    import gc

    gc.collect()
    assert memory.memory_pool_stats()["current_bytes"] == before


@pytest.fixture
def created_stream(emu):
    """A non-blocking stream (CU_STREAM_NON_BLOCKING: the legacy default stream does not wait
    for it) created on the emulator, so it can be paused; destroyed after the test."""
    import ctypes

    from vibespatial_raster import _core

    _core.stream_synchronize(0)  # initializes the driver and binds the primary context here
    lib = ctypes.CDLL(testing.emulator_path())
    stream = ctypes.c_void_p()
    assert lib.cuStreamCreate(ctypes.byref(stream), 1) == 0
    yield stream
    emu.vsr_emu_stream_pause(stream, 0)
    assert lib.cuStreamSynchronize(stream) == 0
    from vibespatial_raster import memory

    memory.forget_stream(stream.value)  # the pool's contract before a stream is destroyed
    assert lib.cuStreamDestroy_v2(stream) == 0
