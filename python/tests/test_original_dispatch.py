# SPDX-License-Identifier: Apache-2.0
"""The Python original's tests/test_dispatch.py (vibespatial-raster 0.1.7), every test of it
written anew against the original's names through a name-only shim (original_shim: the
``vibespatial.raster.*`` modules are this package's). Its CuPy tests skip without CuPy, as
there. Where the original mocked CuPy away to mean "no GPU", the equivalent runs a fresh
interpreter with no driver."""

from __future__ import annotations

from unittest.mock import MagicMock, patch

import numpy as np
import pytest
from conftest import REAL_DRIVER, run_python

import original_shim

original_shim.install()

from vibespatial.raster.buffers import (  # noqa: E402
    OwnedRasterArray,
    RasterDiagnosticKind,
    from_numpy,
)
from vibespatial.raster.dispatch import (  # noqa: E402
    _VRAM_HEADROOM_FRACTION,
    available_vram_bytes,
    dispatch_per_band_cpu,
    dispatch_per_band_gpu,
    max_bands_for_budget,
)

try:
    import cupy  # noqa: F401

    HAS_CUPY = True
except ImportError:
    HAS_CUPY = False

needs_cupy = pytest.mark.skipif(not HAS_CUPY, reason="CuPy not available")

BUDGET = "vibespatial.raster.dispatch.available_vram_bytes"
AFFINE = (10.0, 0.0, 100.0, 0.0, -10.0, 200.0)
NODATA = -9999.0


def single_band(dtype=np.float32, nodata=NODATA, seed=42) -> OwnedRasterArray:
    values = np.random.default_rng(seed).random((8, 10)).astype(dtype)
    return from_numpy(values, nodata=nodata, affine=AFFINE, crs=None)


def multiband(bands=3, dtype=np.float32, nodata=NODATA, seed=42) -> OwnedRasterArray:
    values = np.random.default_rng(seed).random((bands, 8, 10)).astype(dtype)
    return from_numpy(values, nodata=nodata, affine=AFFINE, crs=None)


def doubled(raster: OwnedRasterArray) -> OwnedRasterArray:
    return from_numpy(raster.to_numpy() * 2, nodata=raster.nodata, affine=raster.affine,
                      crs=raster.crs)


def last_runtime_detail(raster: OwnedRasterArray) -> str:
    events = [e for e in raster.diagnostics if e.kind == RasterDiagnosticKind.RUNTIME]
    assert events, raster.diagnostics
    return events[-1].detail


# ---- available_vram_bytes ----


def test_available_vram_is_an_int():
    assert isinstance(available_vram_bytes(), int)


def test_available_vram_is_non_negative():
    assert available_vram_bytes() >= 0


def test_available_vram_is_zero_without_a_gpu():
    # The original blocked `import cupy`; with no CuPy it had no GPU. Here: no driver.
    out = run_python("""
        import builtins
        real = builtins.__import__
        def blocked(name, *a, **k):
            if name == "cupy" or name.startswith("cupy."):
                raise ImportError(name)
            return real(name, *a, **k)
        builtins.__import__ = blocked
        import sys
        sys.path.insert(0, %r)
        import original_shim
        original_shim.install()
        from vibespatial.raster.dispatch import available_vram_bytes
        print(available_vram_bytes())
    """ % (__file__.rsplit("/", 1)[0],),
        env={"VIBESPATIAL_CUDA_DRIVER": "/nonexistent/libcuda.so.1"})
    assert out.split() == ["0"]


@needs_cupy
def test_available_vram_is_positive_with_a_gpu():
    assert available_vram_bytes() > 0


@needs_cupy
def test_available_vram_leaves_the_headroom():
    import cupy as cp

    from vibespatial.raster.memory import memory_pool_stats

    # Ours counts the free bytes its own pool holds (the original counted CuPy's pool's).
    result = available_vram_bytes()
    free, _ = cp.cuda.runtime.memGetInfo()
    pool_free = memory_pool_stats().get("pool_free_bytes") or 0
    # 1% slack: other processes may free memory between the two readings.
    raw_total = (free + pool_free) * 1.01
    assert result <= int(raw_total * (1.0 - _VRAM_HEADROOM_FRACTION))


# ---- max_bands_for_budget, with the budget patched ----


@pytest.mark.parametrize("dtype, bands", [(np.float32, 10), (np.uint8, 40), (np.float64, 5),
                                          (np.int16, 20)])
def test_max_bands_for_an_80_mb_budget(dtype, bands):
    with patch(BUDGET, return_value=80_000_000):
        assert max_bands_for_budget(1000, 1000, dtype) == bands


def test_max_bands_after_scratch():
    with patch(BUDGET, return_value=80_000_000):
        assert max_bands_for_budget(1000, 1000, np.float32, scratch_bytes=30_000_000) == 6


def test_max_bands_is_one_when_scratch_exceeds_the_budget():
    with patch(BUDGET, return_value=1_000_000):
        assert max_bands_for_budget(1000, 1000, np.float32, scratch_bytes=999_000_000) == 1


def test_max_bands_is_one_with_no_vram():
    with patch(BUDGET, return_value=0):
        assert max_bands_for_budget(1000, 1000, np.float32) == 1


def test_max_bands_with_four_buffers_per_band():
    with patch(BUDGET, return_value=80_000_000):
        assert max_bands_for_budget(1000, 1000, np.float32, buffers_per_band=4) == 5


def test_max_bands_of_a_small_raster():
    with patch(BUDGET, return_value=80_000_000):
        assert max_bands_for_budget(10, 10, np.float32) == 100_000


def test_max_bands_takes_a_dtype_type_or_instance():
    with patch(BUDGET, return_value=80_000_000):
        assert (max_bands_for_budget(1000, 1000, np.float32)
                == max_bands_for_budget(1000, 1000, np.dtype(np.float32)))


# ---- dispatch_per_band_cpu ----


def test_cpu_single_band_passthrough():
    r = single_band()
    out = dispatch_per_band_cpu(r, doubled)
    np.testing.assert_allclose(out.to_numpy(), r.to_numpy() * 2)
    assert out.band_count == 1


def test_cpu_single_band_calls_once():
    op = MagicMock(side_effect=doubled)
    dispatch_per_band_cpu(single_band(), op)
    assert op.call_count == 1


def test_cpu_single_band_records_a_runtime_event():
    detail = last_runtime_detail(dispatch_per_band_cpu(single_band(), doubled))
    assert "dispatch_per_band_cpu" in detail and "single-band" in detail


def test_cpu_three_bands():
    r = multiband(3)
    out = dispatch_per_band_cpu(r, doubled)
    np.testing.assert_allclose(out.to_numpy(), r.to_numpy() * 2)
    assert out.band_count == 3
    assert out.to_numpy().shape == (3, 8, 10)


def test_cpu_calls_once_per_band():
    op = MagicMock(side_effect=doubled)
    dispatch_per_band_cpu(multiband(5), op)
    assert op.call_count == 5


def test_cpu_multiband_keeps_the_metadata():
    out = dispatch_per_band_cpu(multiband(3, dtype=np.float32), doubled)
    assert out.affine == AFFINE
    assert out.crs is None
    assert out.nodata == NODATA
    assert out.dtype == np.float32


def test_cpu_multiband_records_a_runtime_event_with_the_band_count():
    detail = last_runtime_detail(dispatch_per_band_cpu(multiband(3), doubled))
    assert "dispatch_per_band_cpu" in detail and "bands=3" in detail


def test_cpu_two_bands():
    r = multiband(2)
    out = dispatch_per_band_cpu(r, doubled)
    np.testing.assert_allclose(out.to_numpy(), r.to_numpy() * 2)
    assert out.band_count == 2


def test_cpu_multiband_keeps_nodata_pixels():
    values = multiband(2).to_numpy().copy()
    values[0, 0, 0] = NODATA
    values[1, 3, 4] = NODATA
    r = from_numpy(values, nodata=NODATA, affine=AFFINE, crs=None)

    def same(band):
        return from_numpy(band.to_numpy().copy(), nodata=band.nodata, affine=band.affine,
                          crs=band.crs)

    out = dispatch_per_band_cpu(r, same).to_numpy()
    assert out[0, 0, 0] == NODATA and out[1, 3, 4] == NODATA


# ---- dispatch_per_band_gpu (CuPy only, as in the original) ----


@needs_cupy
def test_gpu_single_band_passthrough():
    r = single_band()
    out = dispatch_per_band_gpu(r, doubled)
    np.testing.assert_allclose(out.to_numpy(), r.to_numpy() * 2)
    assert out.band_count == 1


@needs_cupy
def test_gpu_single_band_calls_once():
    op = MagicMock(side_effect=doubled)
    dispatch_per_band_gpu(single_band(), op)
    assert op.call_count == 1


@needs_cupy
def test_gpu_single_band_records_a_runtime_event():
    detail = last_runtime_detail(dispatch_per_band_gpu(single_band(), doubled))
    assert "dispatch_per_band_gpu" in detail and "single-band" in detail


@needs_cupy
def test_gpu_three_bands():
    r = multiband(3)
    out = dispatch_per_band_gpu(r, doubled)
    np.testing.assert_allclose(out.to_numpy(), r.to_numpy() * 2)
    assert out.band_count == 3 and out.to_numpy().shape == (3, 8, 10)


@needs_cupy
def test_gpu_calls_once_per_band():
    op = MagicMock(side_effect=doubled)
    dispatch_per_band_gpu(multiband(4), op)
    assert op.call_count == 4


@needs_cupy
def test_gpu_multiband_keeps_the_metadata():
    out = dispatch_per_band_gpu(multiband(3, dtype=np.float32), doubled)
    assert out.affine == AFFINE and out.crs is None
    assert out.nodata == NODATA and out.dtype == np.float32


@needs_cupy
def test_gpu_multiband_records_a_runtime_event_with_the_band_count():
    detail = last_runtime_detail(dispatch_per_band_gpu(multiband(3), doubled))
    assert "dispatch_per_band_gpu" in detail and "bands=3" in detail


@needs_cupy
def test_gpu_and_cpu_agree():
    r = multiband(3)
    np.testing.assert_allclose(dispatch_per_band_gpu(r, doubled).to_numpy(),
                               dispatch_per_band_cpu(r, doubled).to_numpy(), atol=1e-6)


# ---- the same GPU tests on this package's own device path (the emulator here) ----


@pytest.mark.skipif(REAL_DRIVER, reason="the emulator's run of the CuPy tests above")
def test_gpu_tests_without_cupy_on_the_emulator():
    r1, r3 = single_band(), multiband(3)
    op = MagicMock(side_effect=doubled)
    out1 = dispatch_per_band_gpu(r1, op)
    np.testing.assert_allclose(out1.to_numpy(), r1.to_numpy() * 2)
    assert "single-band" in last_runtime_detail(out1)
    out3 = dispatch_per_band_gpu(r3, op)
    assert op.call_count == 4
    np.testing.assert_allclose(out3.to_numpy(), dispatch_per_band_cpu(r3, doubled).to_numpy())
    assert out3.affine == AFFINE and out3.crs is None and out3.nodata == NODATA
    detail = last_runtime_detail(out3)
    assert "dispatch_per_band_gpu" in detail and "bands=3" in detail
