# SPDX-License-Identifier: Apache-2.0
"""vibespatial_raster.dask: chunk planning, band and tile maps, the GeoTIFF job and the worker
plugin, on a LocalCluster of worker processes on the host driver emulator.

The workers' emulated devices differ in size (VSR_EMU_DEVICE_MEMORY per Nanny), so the
smallest budget is visible. Results are compared with the single-process package ops, and with
the vsr-run tool's output where it is built (build/tools/vsr-run/vsr-run, by tools/run-tests;
VSR_RUN names another).
"""

from __future__ import annotations

import copy
import math
import os
import pathlib
import signal
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest

pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

import cloudpickle  # noqa: E402  (a dependency of distributed)
import dask  # noqa: E402
import dask.array as da  # noqa: E402

from vibespatial_raster import dispatch, io, ops, testing  # noqa: E402
from vibespatial_raster import dask as vd  # noqa: E402
from vibespatial_raster.buffers import (  # noqa: E402
    OwnedRasterArray,
    RasterMetadata,
    TilingStrategy,
)

# Workers unpickle this module's ops by value: they need not import the test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

REPO = pathlib.Path(__file__).resolve().parents[2]
NAN = float("nan")
UTM = (10.0, 0.0, 500000.0, 0.0, -10.0, 5000000.0)
BIG, SMALL = 32 << 20, 8 << 20  # the two workers' emulated devices

# The tests ship their rasters to the workers inside the graph.
pytestmark = pytest.mark.filterwarnings("ignore:Sending large graph:UserWarning")

needs_io = pytest.mark.skipif(not io.io_available(), reason="built without GDAL")


def vsr_run_path() -> str | None:
    path = os.environ.get("VSR_RUN") or str(REPO / "build" / "tools" / "vsr-run" / "vsr-run")
    return path if os.access(path, os.X_OK) else None


needs_vsr_run = pytest.mark.skipif(
    vsr_run_path() is None,
    reason="vsr-run is not built (tools/run-tests builds build/tools/vsr-run/vsr-run); the "
           "single-process comparisons still ran")


def run_vsr_run(*args: str) -> None:
    env = dict(os.environ, VIBESPATIAL_CUDA_DRIVER=testing.emulator_path())
    proc = subprocess.run([vsr_run_path(), *args], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def sample(bands: int, side: int) -> np.ndarray:
    """vsr-run's generated sample raster (make_sample in tools/vsr-run): float32, NaN nodata."""
    n = bands * side * side
    i = np.arange(n, dtype=np.uint64).astype(np.uint32)
    h = (i * np.uint32(2654435761)).astype(np.uint32)
    h ^= h >> np.uint32(15)
    b = np.repeat(np.arange(bands), side * side)
    y = np.tile(np.repeat(np.arange(side), side), bands)
    x = np.tile(np.arange(side), bands * side)
    v = ((b + 1).astype(np.float32) * np.float32(100)
         + ((x + 2 * y) % 1000).astype(np.float32) * np.float32(0.5)
         + (h % 64).astype(np.float32) * np.float32(0.25))
    v[h % 100 == 0] = np.nan
    return v.reshape(bands, side, side)


def whole_focal(data: np.ndarray) -> np.ndarray:
    return ops.focal_mean_3x3(OwnedRasterArray.from_numpy(data, nodata=NAN)).to_numpy()


def rescale_op(lo: float, hi: float):
    return lambda band: ops.rescale(band, lo, hi, 0, 1, np.float32)


def staged_focal(r: OwnedRasterArray) -> OwnedRasterArray:
    """A device op that holds only its input on the device: the tile arrives in pool memory and
    is brought back to run the host focal mean (so that the chunk alone is what the budget
    counts)."""
    assert r.residency == "device"
    return ops.focal_mean_3x3(r.move_to("host"))


def device_focal(r: OwnedRasterArray) -> OwnedRasterArray:
    """The focal mean on the device tile itself (the emulated device backend on the emulator):
    its result stays on the device until the task reads it back."""
    assert r.residency == "device"
    out = ops.focal_mean_3x3(r)
    assert out.residency == "device"
    return out


def assert_same(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a, b)  # NaN equals NaN; every other pixel bit for bit


# ---------------------------------------------------------------------------------------------
# plan_chunks, no cluster
# ---------------------------------------------------------------------------------------------


def meta(bands: int, height: int, width: int, dtype=np.float32) -> RasterMetadata:
    return RasterMetadata(height, width, bands, np.dtype(dtype), None, UTM, None)


def test_plan_chunks_follows_the_planner_strategy():
    m = meta(4, 1024, 1024)
    band = 1024 * 1024 * 4 * 2  # one band, two buffers
    whole = vd.chunk_plan(m, vram_budget=10 * 4 * band)
    assert whole.plan.strategy is TilingStrategy.WHOLE
    assert whole.chunks == ((4,), (1024,), (1024,))
    batches = vd.chunk_plan(m, vram_budget=math.ceil(2.5 * band / 0.7))
    assert batches.plan.strategy is TilingStrategy.BAND_BATCHES
    assert batches.chunks == ((2, 2), (1024,), (1024,))
    tiles = vd.chunk_plan(m, vram_budget=band, halo=2)
    assert tiles.plan.strategy is TilingStrategy.TILED and tiles.plan.bands_per_pass == 1
    th, tw = tiles.plan.tile_shape
    assert tiles.chunks == ((1, 1, 1, 1), (th,) * (1024 // th), (tw,) * (1024 // tw))
    mixed = vd.chunk_plan(m, vram_budget=band, halo=2, per_band=False)
    assert mixed.chunks[0] == (4,) and max(mixed.chunks[1]) < 1024
    for cp, budget in ((whole, 40 * band), (tiles, band), (mixed, band)):
        assert cp.chunk_bytes <= dispatch.usable_vram_budget(budget)
        assert [sum(c) for c in cp.chunks] == [4, 1024, 1024]


def test_plan_chunks_keeps_2d_arrays_2d_and_splits_for_min_chunks():
    chunks = vd.plan_chunks(np.zeros((600, 500), np.uint16), vram_budget=1 << 30, min_chunks=3)
    assert len(chunks) == 2 and sum(chunks[0]) == 600 and chunks[1] == (500,)
    assert len(chunks[0]) >= 3
    # Bands are split before rows: whole bands need no halo.
    assert vd.plan_chunks(meta(4, 600, 500), vram_budget=1 << 30, min_chunks=2, halo=1) == \
        ((2, 2), (600,), (500,))


def test_plan_chunks_without_a_gpu_follows_dask_chunk_size():
    with dask.config.set({"array.chunk-size": "1MiB"}):
        cp = vd.chunk_plan(meta(3, 2000, 2000), vram_budget=0, halo=1)
    assert cp.budget == 0
    biggest = max(cp.chunks[0]) * max(cp.chunks[1]) * max(cp.chunks[2]) * 4
    assert biggest <= 1 << 20


@needs_io
def test_plan_chunks_aligns_tiles_to_the_files_blocks(tmp_path):
    data = np.zeros((3, 800, 800), np.float32)
    path = tmp_path / "blocks.tif"
    io.write_raster(path, OwnedRasterArray.from_numpy(data), blockxsize=512, blockysize=512)
    # 768 x 768 tiles fit this budget (800 x 800 does not); the file's blocks are 512.
    budget = math.ceil((768 + 2) ** 2 * 3 * 4 * 2 / 0.7) + 1024
    plain = vd.chunk_plan(meta(3, 800, 800), vram_budget=budget, halo=1, per_band=False)
    assert plain.plan.tile_shape == (768, 768) and plain.chunks[1][0] == 768
    aligned = vd.chunk_plan(path, vram_budget=budget, halo=1, per_band=False)
    assert aligned.block_shape == (512, 512)
    assert aligned.chunks == ((3,), (512, 288), (512, 288))
    stripped = tmp_path / "strips.tif"
    io.write_raster(stripped, OwnedRasterArray.from_numpy(data), tiled=False)
    rows, width = vd.chunk_plan(stripped, vram_budget=budget).block_shape
    assert width == 800 and 1 <= rows <= 800


def test_plan_chunks_rejects_bad_arguments():
    with pytest.raises(ValueError, match="halo"):
        vd.plan_chunks(meta(1, 100, 100), halo=-1, vram_budget=1 << 20)
    with pytest.raises(ValueError, match="buffers_per_band"):
        vd.plan_chunks(meta(1, 100, 100), buffers_per_band=0, vram_budget=1 << 20)
    with pytest.raises(ValueError, match="256"):
        vd.plan_chunks(meta(1, 4000, 4000), vram_budget=100_000)
    with pytest.raises(TypeError):
        vd.plan_chunks(object(), vram_budget=1 << 20)
    with pytest.raises(ValueError, match="4D"):
        vd.plan_chunks(np.zeros((1, 1, 2, 2)), vram_budget=1 << 20)


# ---------------------------------------------------------------------------------------------
# map_bands / map_tiles on Dask's local scheduler
# ---------------------------------------------------------------------------------------------


def test_maps_on_the_threaded_scheduler_equal_the_whole_raster_op():
    data = sample(3, 300)
    arr = da.from_array(data, chunks=(1, 128, 100))
    ref = whole_focal(data)
    got = vd.map_tiles(arr, ops.focal_mean_3x3, halo=1, nodata=NAN, chunks=None)
    assert got.chunks == arr.chunks
    assert_same(got.compute(scheduler="threads"), ref)
    assert_same(vd.map_bands(arr, ops.focal_mean_3x3, nodata=NAN).compute(scheduler="threads"),
                ref)
    # Without the halo the tile edges differ: the test can tell.
    no_halo = vd.map_tiles(arr, ops.focal_mean_3x3, nodata=NAN, chunks=None)
    assert not np.array_equal(no_halo.compute(scheduler="threads"), ref, equal_nan=True)
    # A 2D array stays 2D.
    flat = vd.map_tiles(da.from_array(data[0], chunks=64), ops.focal_mean_3x3, halo=1,
                        nodata=NAN, chunks=None)
    assert_same(flat.compute(scheduler="threads"), ref[0])


def test_tiles_carry_their_own_affine_and_crs():
    # Each output pixel is its world x, computed from the tile's affine: right only if every
    # tile's origin (halo included) is shifted correctly.
    def world_x(r):
        a, b, c, d, e, f = r.affine
        assert r.crs == "EPSG:32633"
        cols = np.arange(r.width, dtype=np.float64)
        grid = np.broadcast_to(c + a * cols, (r.band_count, r.height, r.width))
        return OwnedRasterArray.from_numpy(np.ascontiguousarray(grid), affine=r.affine)

    arr = da.zeros((2, 90, 70), dtype=np.float32, chunks=(1, 32, 25))
    got = vd.map_tiles(arr, world_x, halo=3, affine=UTM, crs="EPSG:32633", chunks=None)
    expected = np.broadcast_to(UTM[2] + UTM[0] * np.arange(70), (2, 90, 70))
    np.testing.assert_array_equal(got.compute(scheduler="threads"), expected)


def test_an_op_may_change_dtype_and_band_count():
    data = sample(4, 64)
    arr = da.from_array(data, chunks=(4, 32, 32))
    ndvi = vd.map_tiles(arr, lambda r: ops.normalized_difference(r.band(3), r.band(2)),
                        nodata=NAN, chunks=None)
    assert ndvi.shape == (1, 64, 64)
    whole = OwnedRasterArray.from_numpy(data, nodata=NAN)
    ref = ops.normalized_difference(whole.band(3), whole.band(2)).to_numpy()
    np.testing.assert_array_equal(ndvi.compute(scheduler="threads")[0], ref)
    filled = np.nan_to_num(data, nan=0.0)
    # 1..255: the rescale keeps 0, outside its output range, for the nodata pixels.
    to_u8 = lambda r: ops.rescale(r, 0, 1500, 1, 255, np.uint8)  # noqa: E731
    as_u8 = vd.map_bands(da.from_array(filled, chunks=(2, 64, 64)), to_u8, nodata=0)
    assert as_u8.dtype == np.uint8
    np.testing.assert_array_equal(as_u8.compute(scheduler="threads"),
                                  to_u8(OwnedRasterArray.from_numpy(filled, nodata=0)).to_numpy())
    with pytest.raises(ValueError, match="band count"):
        vd.map_tiles(da.from_array(data, chunks=(2, 32, 32)),
                     lambda r: ops.normalized_difference(r.band(1), r.band(0)), nodata=NAN,
                     chunks=None)


def test_map_tiles_hands_the_op_whole_tiles_and_keeps_its_nodata():
    data = sample(4, 64)
    arr = da.from_array(data, chunks=(2, 32, 64))
    seen = []

    def fill(r):
        seen.append(r.band_count)
        return ops.fill_nodata(r, -1)

    out = vd.map_tiles(arr, fill, nodata=NAN, per_band=True, chunks=None)
    assert not np.isnan(out.compute(scheduler="sync")).any()
    assert set(seen) == {2}  # tiles of the chunk's bands, not band by band
    # Planned for a band-independent op, tiles may hold fewer than all bands.
    planned = vd.map_tiles(arr, fill, nodata=NAN, per_band=True, chunks="plan")
    assert sum(planned.chunks[0]) == 4


def test_bad_ops_and_arguments_raise():
    arr = da.zeros((2, 16, 16), dtype=np.float32, chunks=8)
    with pytest.raises(TypeError, match="callable"):
        vd.map_tiles(arr, 42, chunks=None)
    with pytest.raises(ValueError, match="device"):
        vd.map_tiles(arr, ops.focal_mean_3x3, device="tpu", chunks=None)
    with pytest.raises(ValueError, match="pixels"):
        vd.map_tiles(arr, lambda r: OwnedRasterArray.from_numpy(np.zeros((2, 3, 3), np.float32)),
                     chunks=None)
    with pytest.raises(TypeError, match="OwnedRasterArray"):
        vd.map_bands(arr, lambda b: b.to_numpy())
    with pytest.raises(TypeError, match="dtype"):
        vd.map_tiles(da.zeros((4, 4), dtype=np.complex64), ops.focal_mean_3x3, chunks=None)
    with pytest.raises(ValueError, match="1D"):
        vd.map_tiles(da.zeros(4), ops.focal_mean_3x3, chunks=None)


def test_dataarrays_keep_dims_coords_and_georeferencing():
    xr = pytest.importorskip("xarray")
    data = sample(2, 40)
    x = UTM[2] + UTM[0] * (np.arange(40) + 0.5)
    y = UTM[5] + UTM[4] * (np.arange(40) + 0.5)
    src = xr.DataArray(da.from_array(data, chunks=(1, 20, 20)), dims=("band", "y", "x"),
                       coords={"band": [1, 2], "y": y, "x": x},
                       attrs={"crs": "EPSG:32633", "_FillValue": NAN, "units": "dn"},
                       name="reflectance")
    seen = []

    def focal(r):
        seen.append((r.affine, r.crs, r.nodata))
        return ops.focal_mean_3x3(r)

    out = vd.map_tiles(src, focal, halo=1, chunks=None)
    assert isinstance(out, xr.DataArray) and out.dims == src.dims and out.name == "reflectance"
    for name in ("band", "x", "y"):
        np.testing.assert_array_equal(out.coords[name], src.coords[name])
    assert out.attrs["crs"] == "EPSG:32633" and out.attrs["units"] == "dn"
    assert math.isnan(out.attrs["_FillValue"])
    assert_same(out.compute(scheduler="sync").values, whole_focal(data))
    # The affine came from the x/y coordinates, the CRS and nodata from the attrs.
    affine, crs, nodata = seen[0]
    assert affine == pytest.approx(UTM) and crs == "EPSG:32633" and math.isnan(nodata)
    filled = vd.map_tiles(src, lambda r: ops.fill_nodata(r, -1), chunks=None)
    assert "_FillValue" not in filled.attrs and filled.coords["band"].values.tolist() == [1, 2]
    assert not np.isnan(filled.values).any()
    # Per-band results are stacked with the input's georeferencing, as the dispatchers do.
    bands = vd.map_bands(src, lambda b: ops.fill_nodata(b, -1), bands_per_chunk=1)
    assert math.isnan(bands.attrs["_FillValue"]) and bands.coords["band"].size == 2
    assert_same(bands.values, filled.values)


@needs_io
@pytest.mark.parametrize("dtype,nodata", [(np.int8, -128), (np.uint16, 65535),
                                          (np.float64, None)])
def test_write_raster_writes_one_geotiff_of_the_chunks(tmp_path, dtype, nodata):
    rng = np.random.default_rng(1)
    info = np.iinfo(dtype) if np.dtype(dtype).kind in "iu" else None
    data = (rng.integers(info.min, info.max, (3, 70, 90), endpoint=True).astype(dtype)
            if info else rng.random((3, 70, 90)).astype(dtype))
    arr = da.from_array(data, chunks=(2, 32, 40))
    path = tmp_path / "out.tif"
    m = vd.write_raster(arr, path, nodata=nodata, affine=UTM, crs="EPSG:32633")
    assert (m.dtype, m.band_count, m.nodata, m.affine) == (np.dtype(dtype), 3, nodata, UTM)
    assert "32633" in m.crs
    np.testing.assert_array_equal(io.read_raster(path).to_numpy(), data)
    assert [p.name for p in tmp_path.iterdir()] == ["out.tif"]
    # A 2D array is one band.
    vd.write_raster(arr[1], tmp_path / "one.tif")
    np.testing.assert_array_equal(io.read_raster(tmp_path / "one.tif").to_numpy(), data[1:2])


def test_dataarrays_georeferenced_the_rioxarray_way():
    xr = pytest.importorskip("xarray")
    wkt = "EPSG:32633"
    ref = xr.Variable((), 0, attrs={"crs_wkt": wkt,
                                    "GeoTransform": "500000.0 10.0 0.0 5000000.0 0.0 -10.0"})
    src = xr.DataArray(da.zeros((1, 20, 30), dtype=np.float32, chunks=(1, 10, 10)),
                       dims=("band", "y", "x"), coords={"spatial_ref": ref})
    seen = []

    def record(r):
        seen.append((r.affine, r.crs))
        return r

    vd.map_tiles(src, record, chunks=None).compute(scheduler="sync")
    assert (UTM, wkt) in seen  # the first tile's
    assert ((10.0, 0.0, 500200.0, 0.0, -10.0, 4999900.0), wkt) in seen  # the last tile's


# ---------------------------------------------------------------------------------------------
# A cluster of two worker processes with emulated devices of different sizes
# ---------------------------------------------------------------------------------------------


def start_cluster(envs: list[dict[str, str]]):
    """A LocalCluster of len(envs) worker processes (one thread each), each with its own
    environment (Nanny env: applied in the worker process before it starts)."""
    cluster = distributed.LocalCluster(n_workers=0, processes=True, threads_per_worker=1,
                                       dashboard_address=":0", silence_logs=50)
    for i, env in enumerate(envs):
        spec = copy.deepcopy(cluster.new_spec)
        spec["options"]["env"] = dict(env)
        cluster.worker_spec[i] = spec
    cluster.scale(len(envs))
    client = distributed.Client(cluster)
    client.wait_for_workers(len(envs), timeout=120)
    return cluster, client


@pytest.fixture(scope="module")
def client():
    cluster, client = start_cluster([{"VSR_EMU_DEVICE_MEMORY": str(BIG)},
                                     {"VSR_EMU_DEVICE_MEMORY": str(SMALL)}])
    vd.register(client, idle_free_interval=None)
    yield client
    client.close()
    cluster.close()


def by_device(client) -> dict[int, str]:
    """Worker address by emulated device size."""
    sizes = client.run(lambda: int(os.environ["VSR_EMU_DEVICE_MEMORY"]))
    return {size: addr for addr, size in sizes.items()}


def test_workers_report_budgets_and_plans_use_the_smallest(client):
    budgets = vd.available_vram_bytes(client)
    addr = by_device(client)
    assert budgets[addr[SMALL]] == int(SMALL * 0.85)
    assert budgets[addr[BIG]] == int(BIG * 0.85)
    stats = vd.memory_pool_stats(client)
    assert {s["tier"] for s in stats.values()} == {"B"}
    # auto keeps the host ops on the emulator (its device ops are host work queued on streams)
    assert {s["mode"] for s in stats.values()} == {"cpu"}
    m = meta(4, 1024, 1024)
    cp = vd.chunk_plan(m, halo=1, per_band=False, client=client)
    assert cp.budget == budgets[addr[SMALL]] and cp.worker_budgets == budgets
    assert cp.chunk_bytes <= dispatch.usable_vram_budget(cp.budget)
    # The larger worker alone would have planned chunks the smaller one cannot hold.
    big = vd.chunk_plan(m, halo=1, per_band=False, vram_budget=budgets[addr[BIG]])
    assert big.chunk_bytes > dispatch.usable_vram_budget(cp.budget)
    # With a client the default is at least one chunk per worker thread.
    assert len(vd.plan_chunks(meta(2, 64, 64), client=client)[0]) == 2


def test_map_bands_and_map_tiles_on_the_cluster_equal_one_process(client):
    data = sample(4, 1024)
    arr = da.from_array(data, chunks=(4, 512, 512))
    ref = whole_focal(data)
    tiles = vd.map_tiles(arr, ops.focal_mean_3x3, halo=1, nodata=NAN)
    assert len(tiles.chunks[1]) > 1  # planned for the 8 MiB worker: several tiles, real halos
    assert_same(tiles.compute(), ref)
    # Whole bands: a 1024 x 1024 one does not fit the 8 MiB worker; 512 x 512 ones do, two a
    # chunk.
    with pytest.raises(ValueError, match="map_tiles"):
        vd.map_bands(arr, ops.focal_mean_3x3, nodata=NAN)
    small = sample(4, 512)
    bands = vd.map_bands(da.from_array(small, chunks=(1, 512, 512)), ops.focal_mean_3x3,
                         nodata=NAN)
    assert bands.chunks[0] == (2, 2)
    assert_same(bands.compute(), whole_focal(small))


def test_a_pipeline_per_chunk_on_the_cluster_equals_it_run_whole(client):
    # The chain travels to the workers pickled as its steps; chunks planned for the smallest
    # worker budget (several tiles, halo 2 exchanged between them).
    data = sample(4, 1024)
    chain = (ops.Pipeline(A=4).calc(["(A[4] - A[3]) / (A[4] + A[3])", "A[1]"])
             .focal_mean("reflect").focal_mean().rescale(-1, 1, 1, 255, "uint8"))
    got = vd.map_pipeline(chain, da.from_array(data, chunks=(4, 512, 512)), nodata=NAN)
    assert len(got.chunks[1]) > 1
    want = chain.run(A=OwnedRasterArray.from_numpy(data, nodata=NAN)).to_numpy()
    out = got.compute()
    assert out.dtype == want.dtype and out.tobytes() == want.tobytes()


@needs_vsr_run
def test_the_cluster_matches_vsr_run_on_its_sample(client, tmp_path):
    data = sample(4, 512)
    arr = da.from_array(data, chunks=(4, 256, 256))
    run_vsr_run("--op", "focal-mean", "--sample-size", "512", "--bands", "4",
                "--output", str(tmp_path / "focal.tif"))
    focal = vd.map_tiles(arr, ops.focal_mean_3x3, halo=1, nodata=NAN, chunks=(1, 200, 300))
    assert_same(focal.compute(), io.read_raster(tmp_path / "focal.tif").to_numpy())
    run_vsr_run("--op", "rescale", "--sample-size", "512", "--bands", "4",
                "--output", str(tmp_path / "rescale.tif"))
    lo, hi = float(np.nanmin(data)), float(np.nanmax(data))
    scaled = vd.map_bands(arr, rescale_op(lo, hi), nodata=NAN)
    assert_same(scaled.compute(), io.read_raster(tmp_path / "rescale.tif").to_numpy())


@pytest.fixture
def geotiff(tmp_path):
    data = sample(3, 700)
    path = tmp_path / "in.tif"
    io.write_raster(path, OwnedRasterArray.from_numpy(data, nodata=NAN, affine=UTM,
                                                      crs="EPSG:32633"))
    return path, data


def check_output(path, ref, like):
    out = io.read_raster_metadata(path)
    assert (out.height, out.width, out.affine, out.crs) == (like.height, like.width,
                                                              like.affine, like.crs)
    assert out.driver == "GTiff" and math.isnan(out.nodata)
    assert_same(io.read_raster(path).to_numpy(), ref)
    assert not list(path.parent.glob(path.name + ".parts-*"))  # the parts are gone


@needs_io
def test_geotiff_job_on_the_cluster_equals_one_process(client, geotiff, tmp_path, capsys):
    src, data = geotiff
    like = io.read_raster_metadata(src)
    out = tmp_path / "focal.tif"
    written = vd.process_geotiff(src, out, ops.focal_mean_3x3, halo=1, client=client)
    assert "100% Completed" in capsys.readouterr().out  # Dask's progress bar
    assert written.band_count == 3
    check_output(out, whole_focal(data), like)
    lo, hi = float(np.nanmin(data)), float(np.nanmax(data))
    out2 = tmp_path / "rescale.tif"
    vd.process_geotiff(src, out2, rescale_op(lo, hi), kind="bands", progress=False)
    ref = ops.rescale(OwnedRasterArray.from_numpy(data, nodata=NAN), lo, hi, 0, 1, np.float32)
    check_output(out2, ref.to_numpy(), like)
    # The windows read in parallel are the file's, as a DataArray too.
    arr = vd.read_raster(src, xarray=True)
    assert arr.dims == ("band", "y", "x") and arr.attrs["transform"] == UTM
    assert arr.x.values[0] == UTM[2] + 5 and arr.y.values[0] == UTM[5] - 5
    assert_same(arr.sel(band=[2]).values, data[1:2])


@needs_io
@needs_vsr_run
def test_geotiff_job_matches_vsr_run_streamed(client, geotiff, tmp_path):
    src, data = geotiff
    like = io.read_raster_metadata(src)
    run_vsr_run("--op", "focal-mean", "--input", str(src), "--output", str(tmp_path / "r.tif"))
    vd.process_geotiff(src, tmp_path / "focal.tif", ops.focal_mean_3x3, halo=1,
                       progress=False)
    check_output(tmp_path / "focal.tif", io.read_raster(tmp_path / "r.tif").to_numpy(), like)
    run_vsr_run("--op", "rescale", "--input", str(src), "--output", str(tmp_path / "s.tif"))
    lo, hi = float(np.nanmin(data)), float(np.nanmax(data))
    vd.process_geotiff(src, tmp_path / "rescale.tif", rescale_op(lo, hi), kind="bands",
                       progress=False)
    check_output(tmp_path / "rescale.tif", io.read_raster(tmp_path / "s.tif").to_numpy(), like)


class FailsOnTiles:
    """An op that works on map_tiles' small inference block and fails on real tiles."""

    def __call__(self, r):
        if r.height > 32:
            raise RuntimeError("this op fails")
        return ops.focal_mean_3x3(r)


@needs_io
def test_a_failed_geotiff_job_raises_and_leaves_no_parts(client, geotiff, tmp_path):
    src, _ = geotiff
    out = tmp_path / "never.tif"
    with pytest.raises(RuntimeError, match="this op fails"):
        vd.process_geotiff(src, out, FailsOnTiles(), halo=1, progress=False)
    assert not out.exists()
    assert not list(tmp_path.glob("never.tif.parts-*"))


def test_device_tasks_stay_within_the_smallest_budget_and_pools_return(client):
    data = sample(4, 1024)
    arr = da.from_array(data, chunks=(4, 1024, 1024))
    ref = whole_focal(data)
    usable = dispatch.usable_vram_budget(vd.available_vram_bytes(client)[by_device(client)[SMALL]])
    got = vd.map_tiles(arr, staged_focal, halo=1, nodata=NAN, device="gpu")
    assert_same(got.compute(), ref)

    def staged_band(band):
        assert band.residency == "device"
        return ops.focal_mean_3x3(band.move_to("host"))

    small = sample(4, 512)
    assert_same(vd.map_bands(small, staged_band, nodata=NAN, device="gpu").compute(),
                whole_focal(small))
    stats = vd.memory_pool_stats(client)
    for s in stats.values():
        assert 0 < s["peak_bytes"] <= usable  # every staged chunk fit the 8 MiB worker
        assert s["current_bytes"] == s["baseline_bytes"]  # nothing left behind
    assert any(s["pool_free_bytes"] > 0 for s in stats.values())
    freed = vd.free_pool_memory(client)
    assert sum(freed.values()) > 0
    assert all(s["pool_free_bytes"] == 0 for s in vd.memory_pool_stats(client).values())


def test_device_placement_runs_the_ops_on_the_device_and_equals_the_cpu_run(client):
    data = sample(2, 512)
    arr = da.from_array(data, chunks=(2, 256, 256))
    cpu = vd.map_tiles(arr, ops.focal_mean_3x3, halo=1, nodata=NAN, device="cpu").compute()
    gpu = vd.map_tiles(arr, device_focal, halo=1, nodata=NAN, device="gpu").compute()
    assert_same(gpu, cpu)
    assert_same(cpu, whole_focal(data))

    def device_band(band):
        assert band.residency == "device"
        return ops.rescale(band, 0, 1000, 0, 1, np.float32)

    assert_same(vd.map_bands(data, device_band, nodata=NAN, device="gpu").compute(),
                vd.map_bands(data, rescale_op(0, 1000), nodata=NAN, device="cpu").compute())
    stats = vd.memory_pool_stats(client)
    assert all(s["current_bytes"] == s["baseline_bytes"] for s in stats.values())


def hold_pool_memory_while_busy():
    """Runs as a task: frees a pool block, then asks the plugin to free while this task runs."""
    from vibespatial_raster import memory

    worker = distributed.get_worker()
    memory.DeviceBuffer(4 << 20).close()
    spare = memory.memory_pool_stats()["pool_free_bytes"]
    freed = worker.plugins[vd.PoolPlugin.name].free_if_idle()
    return spare, freed, memory.memory_pool_stats()["pool_free_bytes"]


def test_idle_workers_give_spare_pool_memory_back(client):
    vd.register(client, idle_free_interval=0.05)
    try:
        # Busy: nothing is freed, by the check's own call or its periodic one.
        spare, freed, after = client.submit(hold_pool_memory_while_busy, pure=False).result()
        assert spare > 0 and freed == 0 and after == spare
        # Idle: the periodic check frees it (polled, with a deadline for a loaded machine).
        deadline = time.monotonic() + 60
        while True:
            stats = vd.memory_pool_stats(client)
            if all(s["pool_free_bytes"] == 0 for s in stats.values()) and \
                    any(s["idle_frees"] > 0 for s in stats.values()):
                break
            assert time.monotonic() < deadline, stats
            time.sleep(0.05)
    finally:
        vd.register(client, idle_free_interval=None)


class Latched:
    """Wraps an op: full-size tiles announce themselves on a Queue, then wait for an Event."""

    def __init__(self, op, queue: str, event: str) -> None:
        self.op, self.queue, self.event = op, queue, event

    def __call__(self, r):
        if r.height > 32:  # not the small block map_tiles infers the result's dtype from
            worker = distributed.get_worker()
            distributed.Queue(self.queue).put((worker.address, os.getpid()))
            assert distributed.Event(self.event).wait(timeout=120)
        return self.op(r)


def test_a_killed_worker_is_retried_and_the_result_is_identical(client):
    # Last in the module: it kills one of the shared cluster's workers (its Nanny restarts it).
    data = sample(2, 512)
    arr = da.from_array(data, chunks=(1, 256, 256))
    name = uuid.uuid4().hex
    op = Latched(staged_focal, "q" + name, "e" + name)  # through the pools, to check them after
    future = client.compute(vd.map_tiles(arr, op, halo=1, nodata=NAN, device="gpu",
                                         chunks=None))
    address, pid = distributed.Queue("q" + name).get(timeout=120)
    os.kill(pid, signal.SIGKILL)  # mid-job: one of its tasks is running
    distributed.Event("e" + name).set()
    assert_same(future.result(timeout=300), whole_focal(data))
    assert pid not in client.run(os.getpid).values()  # the Nanny started a new process
    client.wait_for_workers(2, timeout=120)
    for s in vd.memory_pool_stats(client).values():
        assert s["current_bytes"] == s["baseline_bytes"]
