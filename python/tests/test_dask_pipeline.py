# SPDX-License-Identifier: Apache-2.0
"""vibespatial_raster.dask.map_pipeline: an ops.Pipeline over Dask arrays, one chain per chunk
with the chain's total halo, equal bit for bit to the same Pipeline run on the whole rasters
(Dask's local schedulers; the distributed form is in test_dask.py)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

pytest.importorskip("dask.array")
pytest.importorskip("distributed")

import dask.array as da  # noqa: E402

from vibespatial_raster import ops  # noqa: E402
from vibespatial_raster import dask as vd  # noqa: E402
from vibespatial_raster.buffers import OwnedRasterArray  # noqa: E402

AFFINE = (10.0, 0.0, 500000.0, 0.0, -10.0, 5000000.0)


def values(bands, h, w, seed, dtype=np.float32, nodata=-9999.0):
    rng = np.random.default_rng(seed)
    a = rng.uniform(0, 1000, size=(bands, h, w))
    a = a.astype(dtype)
    a.reshape(-1)[::29] = nodata
    if np.issubdtype(dtype, np.floating):
        a.reshape(-1)[7::43] = np.nan
    return a


def whole(chain, **arrays_and_nodata):
    rasters = {n: OwnedRasterArray.from_numpy(a, nodata=nd, affine=AFFINE)
               for n, (a, nd) in arrays_and_nodata.items()}
    return chain.run(**rasters).to_numpy()


def same_bits(got, want):
    got = np.asarray(got).reshape(want.shape) if got.size == want.size else got
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()


def chain_of_three(edge):
    return (ops.Pipeline(A=3).focal_mean(edge).clip(100, 900).focal_mean("nearest")
            .rescale(0, 1000, 1, 255, "uint8"))


@pytest.mark.parametrize("edge", ["nearest", "reflect", "constant_nodata"])
@pytest.mark.parametrize("chunks", [None, (3, 32, 25), (3, 1, 1), (3, 70, 9), (3, 90, 61)])
def test_a_chain_per_chunk_equals_the_chain_run_whole(edge, chunks):
    data = values(3, 90, 61, 1)
    chain = chain_of_three(edge)
    assert chain.halo == 2
    want = whole(chain, A=(data, -9999.0))
    arr = da.from_array(data, chunks=chunks if chunks is not None else (1, 20, 17))
    got = vd.map_pipeline(chain, arr, nodata=-9999.0, affine=AFFINE, chunks=None if chunks
                          is None else chunks)
    assert got.dtype == np.uint8
    same_bits(got.compute(scheduler="threads"), want)


def test_planned_chunks_and_a_2d_input():
    data = values(1, 300, 260, 2, dtype=np.float64)
    chain = ops.Pipeline(A=1).focal_mean("reflect").focal_mean("reflect").focal_mean("constant_nodata")
    want = whole(chain, A=(data, -9999.0))
    got = vd.map_pipeline(chain, da.from_array(data[0], chunks=64), nodata=-9999.0,
                          affine=AFFINE)
    assert got.ndim == 2
    same_bits(got.compute(scheduler="threads"), want[0] if want.ndim == 3 else want)
    got = vd.map_pipeline(chain, data[0], nodata=-9999.0, affine=AFFINE, chunks=(50, 40))
    assert got.chunks == (tuple([50] * 6), tuple([40] * 6 + [20]))
    same_bits(got.compute(scheduler="sync"), want[0] if want.ndim == 3 else want)


def test_named_inputs_of_their_own_dtypes_and_nodata():
    a = values(4, 77, 83, 3)
    b = values(1, 77, 83, 4, dtype=np.uint16, nodata=65535)
    chain = (ops.Pipeline(A=4, B=1).calc(["(A[4] - A[3]) / (A[4] + A[3])", "A[1] - B"])
             .focal_mean("reflect").calc("X[1] * 100 + X[2]", dtype="float64").focal_mean())
    want = whole(chain, A=(a, -9999.0), B=(b, 65535))
    got = vd.map_pipeline(chain, A=da.from_array(a, chunks=(2, 30, 30)),
                          B=da.from_array(b, chunks=(1, 16, 50)),
                          nodata={"A": -9999.0, "B": 65535}, affine=AFFINE, chunks=(24, 31))
    assert got.shape == (1, 77, 83) and got.dtype == np.float64
    same_bits(got.compute(scheduler="threads"), want)


def test_one_task_per_chunk_reads_each_chunk_once_with_the_summed_halo():
    data = values(3, 64, 64, 5)
    chain = chain_of_three("reflect")
    seen = []

    got = vd.map_pipeline(chain, da.from_array(data, chunks=(3, 16, 32)), nodata=-9999.0,
                          affine=AFFINE, chunks=None)
    keys = [k for k in dict(got.__dask_graph__()) if k[0].startswith("vsr-pipeline")]
    assert len(keys) == 4 * 2  # one chain per chunk
    # Each task's window: the chunk and chain.halo (2) pixels of each neighbour.
    from vibespatial_raster.dask import _pipeline

    real = _pipeline._run_chain

    def spy(blocks, spec, row0, col0):
        seen.append((row0, col0, blocks[0].shape))
        return real(blocks, spec, row0, col0)

    _pipeline._run_chain = spy
    try:
        out = got.compute(scheduler="sync")
    finally:
        _pipeline._run_chain = real
    same_bits(out, whole(chain, A=(data, -9999.0)))
    windows = sorted(s for s in seen if s[2][1:] != (8 + 4, 8 + 4))  # the sample window
    assert len(windows) == 8
    assert (0, 0, (3, 18, 34)) in windows and (14, 30, (3, 20, 34)) in windows
    # Without the halo (each chunk on its own) the chunk edges differ: the test can tell.
    alone = vd.map_tiles(da.from_array(data, chunks=(3, 16, 32)),
                         lambda r: chain.run(A=r), nodata=-9999.0, chunks=None)
    assert alone.compute(scheduler="sync").tobytes() != out.tobytes()


def test_a_pipeline_pickles_as_its_steps():
    chain = (ops.Pipeline(A=2, B=1).calc(["A[1] + B", "A[2]"], dtype="float64", nodata=-1)
             .fill_nodata(0).convert("int32", -5).clip(-3, 3000).rescale(0, 3000, 0, 1))
    again = pickle.loads(pickle.dumps(chain))
    assert again.steps == chain.steps and again.input_bands == {"A": 2, "B": 1}
    a, b = values(2, 20, 21, 6), values(1, 20, 21, 7)
    same_bits(whole(again, A=(a, -9999.0), B=(b, -9999.0)),
              whole(chain, A=(a, -9999.0), B=(b, -9999.0)))


def test_dataarrays_keep_coords_and_attrs():
    xr = pytest.importorskip("xarray")
    data = values(3, 40, 50, 8)
    arr = xr.DataArray(da.from_array(data, chunks=(3, 16, 16)), dims=("band", "y", "x"),
                       coords={"band": [1, 2, 3], "y": 5000000.0 - 10.0 * np.arange(40) - 5,
                               "x": 500000.0 + 10.0 * np.arange(50) + 5},
                       attrs={"nodata": -9999.0})
    chain = ops.Pipeline(A=3).focal_mean().calc("X[1] + X[3]")
    got = vd.map_pipeline(chain, arr, chunks=None)
    assert isinstance(got, xr.DataArray) and got.dims == ("band", "y", "x")
    assert got.shape == (1, 40, 50)
    np.testing.assert_array_equal(got.x.values, arr.x.values)
    same_bits(got.data.compute(scheduler="threads"), whole(chain, A=(data, -9999.0)))


def test_bad_inputs_raise_before_any_work():
    chain = ops.Pipeline(A=3).focal_mean()
    two = ops.Pipeline(A=3, B=1).calc("A[1] + B")
    arr = da.zeros((3, 16, 16), dtype=np.float32, chunks=8)
    with pytest.raises(TypeError, match="ops.Pipeline"):
        vd.map_pipeline(ops.focal_mean_3x3, arr)
    with pytest.raises(ValueError, match="2 band"):
        vd.map_pipeline(chain, arr[:2])
    with pytest.raises(ValueError, match="by name"):
        vd.map_pipeline(two, arr)
    with pytest.raises(ValueError, match="missing B"):
        vd.map_pipeline(two, A=arr)
    with pytest.raises(ValueError, match="not inputs: C"):
        vd.map_pipeline(chain, A=arr, C=arr)
    with pytest.raises(ValueError, match="16 x 16"):
        vd.map_pipeline(two, A=arr, B=da.zeros((1, 16, 15), dtype=np.float32))
    with pytest.raises(ValueError, match="device"):
        vd.map_pipeline(chain, arr, device="tpu")
    with pytest.raises(ValueError, match="lacks: Z"):
        vd.map_pipeline(chain, arr, nodata={"Z": 0})
