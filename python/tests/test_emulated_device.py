# SPDX-License-Identifier: Apache-2.0
"""Device rasters on the emulated device: the band ops on a raster moved to the device run on the
emulated device backend (the host ops' work queued on the emulator's streams, over its device
memory) and equal the host results bit for bit; so do dispatch_per_band_gpu, the tiled executors
with ops on device tiles, and a Dask run with device placement. On a real driver the package's
device ops are those of its build (CUDA or none): these checks then run only with CUDA ops."""

from __future__ import annotations

import numpy as np
import pytest

import vibespatial_raster as vsr
from vibespatial_raster import dispatch, ops, tiling
from vibespatial_raster.buffers import OwnedRasterArray

pytestmark = pytest.mark.skipif(
    not (vsr.driver_info().get("emulated") or ops.ops_built_with_cuda()),
    reason="a real driver and a build without the CUDA ops: no device backend")

UTM = "EPSG:32633"
AFFINE = (10.0, 0.0, 500000.0, 0.0, -10.0, 5000000.0)


def sample(bands: int, h: int, w: int, dtype=np.float32, seed: int = 7) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = (rng.random((bands, h, w)) * 1000).astype(dtype)
    flat = a.reshape(-1)
    flat[5::23] = 7  # the nodata
    if np.issubdtype(dtype, np.floating):
        flat[3::17] = np.nan
    return a


def host(data: np.ndarray, nodata=7) -> OwnedRasterArray:
    return OwnedRasterArray.from_numpy(data, nodata=nodata, affine=AFFINE, crs=UTM)


def device(data: np.ndarray, nodata=7) -> OwnedRasterArray:
    r = host(data, nodata).move_to("device")
    assert r.residency == "device"
    return r


def same(a: OwnedRasterArray, b: OwnedRasterArray) -> None:
    x, y = a.to_numpy(), b.to_numpy()
    assert x.dtype == y.dtype and x.shape == y.shape
    np.testing.assert_array_equal(x, y)  # NaN equals NaN; every other pixel bit for bit
    assert a.nodata == b.nodata or (a.nodata != a.nodata and b.nodata != b.nodata)


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.float32, np.float64])
def test_every_op_on_a_device_raster_equals_the_host(dtype):
    data = sample(3, 61, 47, dtype)
    h, d = host(data), device(data)
    assert ops.band_statistics(d) == ops.band_statistics(h)
    for out in ("uint8", "float32"):
        r = ops.rescale(d, 0, 1000, 0, 250, out)
        assert r.residency == "device"
        same(r, ops.rescale(h, 0, 1000, 0, 250, out))
    same(ops.clip(d, 10, 600), ops.clip(h, 10, 600))
    same(ops.fill_nodata(d, 3), ops.fill_nodata(h, 3))
    d2, h2 = device(sample(3, 61, 47, dtype, seed=9)), host(sample(3, 61, 47, dtype, seed=9))
    same(ops.normalized_difference(d, d2), ops.normalized_difference(h, h2))
    np.testing.assert_array_equal(ops.histogram(d, 32, 0, 1000), ops.histogram(h, 32, 0, 1000))
    for edge in ("nearest", "reflect", "constant_nodata"):
        same(ops.focal_mean_3x3(d, edge), ops.focal_mean_3x3(h, edge))
    expr = ["(A[2] - A[1]) / (A[2] + A[1])", "where(A[3] > 500, A[3], 0)"]
    same(ops.calc(expr, A=d), ops.calc(expr, A=h))
    same(ops.calc("A[1] + B[2]", A=d, B=d2, dtype="float64"),
         ops.calc("A[1] + B[2]", A=h, B=h2, dtype="float64"))


def test_a_device_raster_moves_back_with_its_pixels():
    data = sample(2, 33, 29)
    d = device(data)
    np.testing.assert_array_equal(d.to_numpy(), data)
    r = ops.focal_mean_3x3(d, "reflect")
    back = r.move_to("host")
    assert back.residency == "host"
    same(back, ops.focal_mean_3x3(host(data), "reflect"))


def test_dispatch_per_band_gpu_with_device_ops_equals_the_cpu_dispatch():
    data = sample(6, 64, 80)

    def op(band):
        return ops.rescale(ops.clip(band, 10, 900), 10, 900, 0, 1, "float32")

    cpu = dispatch.dispatch_per_band_cpu(host(data), op)
    same(dispatch.dispatch_per_band_gpu(host(data), op), cpu)
    same(dispatch.dispatch_per_band_gpu(device(data), op), cpu)


def on_device(fn):
    """An op that puts each tile on the device and runs ``fn`` there."""
    def run(tile):
        return fn(tile.move_to("device"))
    return run


def test_tiled_executors_with_ops_on_device_tiles_equal_the_host():
    data = sample(2, 96, 70)
    plan = dispatch.analyze_raster_plan(96, 70, np.float32, band_count=2, halo=1,
                                        vram_budget=64 << 10)
    assert plan.strategy == "tiled"

    def focal(t):
        return ops.focal_mean_3x3(t, "reflect")

    same(tiling.dispatch_tiled(host(data), on_device(focal), plan),
         tiling.dispatch_tiled(host(data), focal, plan))
    same(tiling.dispatch_tiled_halo(host(data), on_device(focal), plan),
         tiling.dispatch_tiled_halo(host(data), focal, plan))
    b = sample(2, 96, 70, seed=3)
    same(tiling.dispatch_tiled_binary(
        host(data), host(b), lambda x, y: ops.normalized_difference(x.move_to("device"),
                                                                    y.move_to("device")), plan),
        tiling.dispatch_tiled_binary(host(data), host(b), ops.normalized_difference, plan))

    def hist(t):
        return ops.histogram(t, 16, 0, 1000)

    np.testing.assert_array_equal(
        tiling.dispatch_tiled_accumulator(host(data), on_device(hist), np.add, plan),
        tiling.dispatch_tiled_accumulator(host(data), hist, np.add, plan))
    same(tiling.dispatch_tiled_multipass(host(data), on_device(focal), lambda r, _: r, plan),
         tiling.dispatch_tiled_multipass(host(data), focal, lambda r, _: r, plan))


def test_a_pipeline_on_device_inputs_equals_the_host():
    data = sample(4, 64, 64)
    chain = (ops.Pipeline(A=4)
             .calc("(A[4] - A[3]) / (A[4] + A[3])")
             .focal_mean("reflect")
             .rescale(-1, 1, 1, 255, "uint8"))
    same(chain.run(A=device(data)), chain.run(A=host(data)))
