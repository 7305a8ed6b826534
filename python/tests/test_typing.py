# SPDX-License-Identifier: Apache-2.0
"""The shipped types hold: mypy checks the installed package (its modules against _core.pyi)
and a user's script against the package, through py.typed."""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys

import pytest

import vibespatial_raster

pytestmark = pytest.mark.skipif(importlib.util.find_spec("mypy") is None,
                                reason="mypy is not installed")

USER_SCRIPT = '''
import numpy as np
from vibespatial_raster import dispatch, memory, ops
from vibespatial_raster.buffers import OwnedRasterArray, RasterPlan, TilingStrategy

tier: str = memory.configure_memory_pool()
stats: dict = memory.memory_pool_stats()
plan: RasterPlan = dispatch.analyze_raster_plan(100, 100, np.float32, band_count=2)
strategy: TilingStrategy = plan.strategy
raster = OwnedRasterArray.from_numpy(np.zeros((2, 4, 4), np.float32))
out: OwnedRasterArray = dispatch.dispatch_per_band_cpu(raster, lambda b: b)
counts: np.ndarray = ops.histogram(out, 4, 0.0, 1.0)
bad: int = plan.tile_shape
'''


def mypy(*args: str, cwd: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mypy", "--no-incremental",
                           "--ignore-missing-imports", "--cache-dir", str(cwd / "cache"), *args],
                          capture_output=True, text=True, cwd=cwd, timeout=600)


def test_the_package_type_checks(tmp_path):
    proc = mypy("-p", "vibespatial_raster", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_user_script_is_checked_against_the_package(tmp_path):
    script = tmp_path / "user.py"
    script.write_text(USER_SCRIPT)
    proc = mypy(str(script), cwd=tmp_path)
    # Everything type-checks but the last line, which the package's annotations catch.
    errors = [line for line in proc.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1 and "user.py:13:" in errors[0], proc.stdout
    assert pathlib.Path(vibespatial_raster.__file__).with_name("py.typed").is_file()
