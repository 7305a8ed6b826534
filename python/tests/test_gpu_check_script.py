# SPDX-License-Identifier: Apache-2.0
"""The GPU step's script (python/tests/gpu/check_frameworks.py) runs here too: on the emulator
its pool check passes and the frameworks this machine lacks are skipped, so the script itself
is exercised before it reaches a GPU."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

from conftest import EMULATED_DEVICE_MEMORY

from vibespatial_raster import testing

SCRIPT = pathlib.Path(__file__).resolve().parent / "gpu" / "check_frameworks.py"


def run(env_extra):
    env = dict(os.environ, VSR_EMU_DEVICE_MEMORY=str(EMULATED_DEVICE_MEMORY), **env_extra)
    return subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True,
                          timeout=600)


def test_check_frameworks_on_the_emulator():
    proc = run({"VIBESPATIAL_CUDA_DRIVER": testing.emulator_path(),
                "VSR_GPU_CHECK_ALLOW_EMULATOR": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS pool: tier B" in proc.stdout
    for framework in ("cupy", "torch", "numba"):
        if importlib.util.find_spec(framework) is None:
            assert "is not installed" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1].endswith("skipped")


def test_check_frameworks_says_when_there_is_no_gpu():
    proc = run({"VIBESPATIAL_CUDA_DRIVER": "/nonexistent/libcuda.so.1"})
    assert proc.returncode == 77, proc.stdout + proc.stderr
    assert "no usable GPU" in proc.stdout
