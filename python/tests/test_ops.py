# SPDX-License-Identifier: Apache-2.0
"""vibespatial_raster.ops: each band operation against NumPy, out= forms, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

import vibespatial_raster as vsr
from vibespatial_raster import ops
from vibespatial_raster.buffers import OwnedRasterArray


def raster(data, nodata=None, **kw):
    return OwnedRasterArray.from_numpy(np.asarray(data), nodata=nodata, **kw)


DATA = np.array([[[1, 2, 3], [4, -9, 6]], [[10, 20, 30], [40, 50, -9]]], np.float32)


def test_compute_dtype_and_cuda_flag():
    assert ops.compute_dtype("uint8") == np.float32
    assert ops.compute_dtype(np.int32) == np.float64
    assert isinstance(ops.ops_built_with_cuda(), bool)


def test_band_statistics_skip_nodata():
    stats = ops.band_statistics(raster(DATA, nodata=-9))
    for band, s in zip(DATA, stats):
        valid = band[band != -9].astype(np.float64)
        assert s.count == valid.size and s.min == valid.min() and s.max == valid.max()
        assert math.isclose(s.mean, valid.mean()) and math.isclose(s.std, valid.std())
    empty = ops.band_statistics(raster(np.full((2, 2), -9, np.int16), nodata=-9))[0]
    assert empty.count == 0 and math.isnan(empty.mean)


def test_rescale_clip_fill():
    r = raster(DATA, nodata=-9, affine=(2, 0, 0, 0, -2, 0), crs="EPSG:4326")
    out = ops.rescale(r, 0, 100, 0, 1, "float64")
    # A float output's nodata is NaN, never a value a valid pixel could take (-9 could be one).
    want = np.where(DATA == -9, np.nan, DATA.astype(np.float32) / np.float32(100))
    assert out.dtype == np.float64 and np.isnan(out.nodata)
    assert np.allclose(out.to_numpy(), want, equal_nan=True)
    assert out.affine == r.affine and out.crs == "EPSG:4326" and out.shape == r.shape
    clipped = ops.clip(r, 2, 30)
    assert np.array_equal(clipped.to_numpy(), np.where(DATA == -9, -9, np.clip(DATA, 2, 30)))
    filled = ops.fill_nodata(r, 0)
    assert filled.nodata is None
    assert np.array_equal(filled.to_numpy(), np.where(DATA == -9, 0, DATA))


def test_out_forms_write_in_place():
    r = raster(DATA.copy(), nodata=-9)
    same = ops.clip(r, 0, 5, out=r)
    assert same is r
    assert np.array_equal(r.to_numpy(), np.where(DATA == -9, -9, np.clip(DATA, 0, 5)))
    out = raster(np.zeros(DATA.shape, np.float32))
    ops.rescale(r, 0, 10, 0, 100, out=out)
    assert np.allclose(out.to_numpy()[0, 0], [10, 20, 30])
    with pytest.raises(ValueError):
        ops.rescale(r, 0, 10, 0, 100, "uint8", out=out)
    with pytest.raises(ValueError):
        ops.focal_mean_3x3(r, out=r)  # a focal op cannot write over its input


def test_normalized_difference():
    a = raster(np.array([[3.0, 0.0]], np.float32))
    b = raster(np.array([[1.0, 0.0]], np.float32))
    nd = ops.normalized_difference(a, b).to_numpy()
    assert nd[0, 0] == np.float32(0.5) and math.isnan(nd[0, 1])
    with pytest.raises(ValueError):
        ops.normalized_difference(a, raster(np.ones((1, 2), np.float64)))


def test_histogram_matches_numpy():
    rng = np.random.default_rng(7)
    data = rng.integers(0, 256, (2, 50, 40)).astype(np.uint8)
    counts = ops.histogram(raster(data), 16, 0, 255)
    assert counts.shape == (2, 16) and counts.dtype == np.int64
    for band, row in zip(data, counts):
        assert np.array_equal(row, np.histogram(band, 16, (0, 255))[0])
    with pytest.raises(ValueError):
        ops.histogram(raster(data), 0, 0, 1)
    with pytest.raises(ValueError):
        ops.histogram(raster(data), 4, 5, 5)


def test_histogram_float32_edges_match_numpy():
    # Values on the edges of 10, 7 and 100 bins on [0, 1]: numpy bins float32 data with float32
    # edges (0.7f is edge 7 itself) and float64 data with float64 ones.
    values = [i * 0.01 for i in range(101)] + [0.3, 0.6, 0.7, 1.0000001, -0.0]
    for dtype in (np.float32, np.float64):
        data = np.array(values, dtype).reshape(1, 1, -1)
        for bins in (7, 10, 100):
            got = ops.histogram(raster(data), bins, 0, 1)[0]
            assert np.array_equal(got, np.histogram(data, bins, (0, 1))[0]), (dtype, bins)


def test_focal_mean_3x3():
    data = np.arange(30, dtype=np.float64).reshape(5, 6)
    out = ops.focal_mean_3x3(raster(data), "nearest").to_numpy()
    padded = np.pad(data, 1, mode="edge")
    want = sum(padded[i:i + 5, j:j + 6] for i in range(3) for j in range(3)) / 9
    assert np.allclose(out, want)
    assert out.shape == (5, 6)
    with pytest.raises(ValueError):
        ops.focal_mean_3x3(raster(data), "wrap")


def test_device_ops_need_cuda_on_a_real_driver():
    r = raster(DATA, residency="device")
    if ops.ops_built_with_cuda():
        pytest.skip("this build runs device ops (checked on a GPU by tools/gpu-check)")
    if vsr.driver_info()["emulated"]:
        pytest.skip("the emulator runs device ops on its emulated device in every build "
                    "(test_emulated_device.py); the real driver's refusal is checked there")
    with pytest.raises(RuntimeError, match="without CUDA"):
        ops.band_statistics(r)


def test_bad_arguments():
    with pytest.raises(TypeError):
        ops.band_statistics(DATA)
    with pytest.raises(ValueError):
        ops.rescale(raster(DATA), 1, 1, 0, 1)
    with pytest.raises(ValueError):
        ops.clip(raster(DATA), 5, 1)
    with pytest.raises(ValueError):
        ops.fill_nodata(raster(np.zeros((2, 2), np.uint8)), 300)
    with pytest.raises(TypeError):
        ops.rescale(raster(DATA), 0, 1, 0, 1, "complex64")


def test_more_out_forms():
    a = raster(np.array([[3.0, 1.0]], np.float32))
    b = raster(np.array([[1.0, 1.0]], np.float32))
    out = raster(np.zeros((1, 2), np.float32))
    assert ops.normalized_difference(a, b, out=out) is out
    assert np.array_equal(out.to_numpy(), np.array([[0.5, 0.0]], np.float32))
    r = raster(np.array([[1, -9]], np.int16), nodata=-9)
    filled = raster(np.zeros((1, 2), np.int16))
    ops.fill_nodata(r, 7, out=filled)
    assert filled.to_numpy().tolist() == [[1, 7]] and filled.nodata is None
    focal = raster(np.zeros((1, 2), np.float32))
    ops.focal_mean_3x3(a, out=focal)
    assert np.allclose(focal.to_numpy(), [[(3 + 3 + 1) / 3, (3 + 1 + 1) / 3]])
    assert r.nbytes == 4 and a.nbytes == 8
