# SPDX-License-Identifier: Apache-2.0
"""vibespatial_raster.dask under careless and hostile use: each test is a misuse that once
failed silently (a wrong result, a destroyed input, directories made from a typo) or with an
error that named nothing the caller passed. Expected: a typed error naming the argument,
nothing lost, no partial output."""

from __future__ import annotations

import hashlib
import warnings

import numpy as np
import pytest

pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

import dask  # noqa: E402
import dask.array as da  # noqa: E402

from vibespatial_raster import io, ops  # noqa: E402
from vibespatial_raster import dask as vd  # noqa: E402
from vibespatial_raster.buffers import OwnedRasterArray, RasterMetadata  # noqa: E402

NAN = float("nan")
UTM = (10.0, 0.0, 500000.0, 0.0, -10.0, 5000000.0)

needs_io = pytest.mark.skipif(not io.io_available(), reason="built without GDAL")


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def geotiff(tmp_path):
    data = np.random.default_rng(3).random((2, 100, 100), dtype=np.float32)
    path = tmp_path / "in.tif"
    io.write_raster(path, OwnedRasterArray.from_numpy(data, nodata=NAN, affine=UTM,
                                                      crs="EPSG:32633"))
    return path, data


# ---------------------------------------------------------------------------------------------
# DataArrays whose dims are not (band, y, x)
# ---------------------------------------------------------------------------------------------


def test_a_dataarray_with_band_last_is_refused_not_misread():
    xr = pytest.importorskip("xarray")
    # (y, x, band), as image libraries lay pixels out: once read as 100 bands of 60 x 3.
    img = xr.DataArray(np.zeros((100, 60, 3), np.float32), dims=("y", "x", "band"))
    for call in (lambda: vd.map_tiles(img, lambda r: r, chunks=None),
                 lambda: vd.map_bands(img, lambda b: b),
                 lambda: vd.plan_chunks(img, vram_budget=1 << 30)):
        with pytest.raises(ValueError, match=r"\('y', 'x', 'band'\).*transpose"):
            call()
    # x before y is as wrong (rows would be columns).
    swapped = xr.DataArray(np.zeros((2, 60, 100), np.float32), dims=("band", "x", "y"))
    with pytest.raises(ValueError, match=r"\('band', 'x', 'y'\)"):
        vd.map_tiles(swapped, lambda r: r, chunks=None)
    # The transposed array is accepted, and so are arrays with other dim names.
    got = vd.map_tiles(img.transpose("band", "y", "x"), lambda r: r, chunks=None)
    assert got.dims == ("band", "y", "x") and got.shape == (3, 100, 60)
    plain = xr.DataArray(np.zeros((3, 10, 10), np.float32))
    assert vd.map_tiles(plain, lambda r: r, chunks=None).shape == (3, 10, 10)


@pytest.mark.parametrize("ydim,xdim", [("lat", "lon"), ("latitude", "longitude"),
                                       ("Lat", "Lon"), ("y", "x")])
@pytest.mark.parametrize("coord_dtype", [np.float64, np.float32])
def test_lat_lon_coordinates_give_the_affine_as_x_y_do(tmp_path, ydim, xdim, coord_dtype):
    # Only x / y coordinates were read: lat / lon got the identity affine without a word.
    xr = pytest.importorskip("xarray")
    lon = (10.0 + 0.1 * (np.arange(30) + 0.5)).astype(coord_dtype)
    lat = (50.0 - 0.1 * (np.arange(20) + 0.5)).astype(coord_dtype)
    src = xr.DataArray(da.zeros((1, 20, 30), dtype=np.float32, chunks=(1, 10, 10)),
                       dims=("band", ydim, xdim), coords={ydim: lat, xdim: lon},
                       attrs={"crs": "EPSG:4326"})
    want = pytest.approx((0.1, 0.0, 10.0, 0.0, -0.1, 50.0), rel=1e-6, abs=1e-5)
    seen = []

    def op(r):
        seen.append(r.affine)
        return r

    vd.map_tiles(src, op, chunks=None)
    vd.map_bands(src, op)
    assert seen and all(a == want for a in seen)
    if io.io_available():
        assert vd.write_raster(src, tmp_path / "out.tif").affine == want


@pytest.mark.parametrize("ydim,xdim", [("lat", "lon"), ("y", "x")])
def test_unevenly_spaced_coordinates_are_refused_not_read_as_the_identity(tmp_path, ydim,
                                                                          xdim):
    xr = pytest.importorskip("xarray")
    lat = 50.0 - 0.1 * (np.arange(20) + 0.5)
    gap = 10.0 + 0.1 * (np.arange(30) + 0.5) + np.where(np.arange(30) >= 15, 0.1, 0.0)
    for lon in (gap, np.geomspace(1.0, 2.0, 30), np.full(30, 10.0)):
        src = xr.DataArray(np.zeros((1, 20, 30), np.float32), dims=("band", ydim, xdim),
                           coords={ydim: lat, xdim: lon})
        for call in (lambda: vd.map_tiles(src, lambda r: r, chunks=None),
                     lambda: vd.map_bands(src, lambda b: b),
                     lambda: vd.write_raster(src, tmp_path / "out.tif")):
            with pytest.raises(ValueError, match=f"'{xdim}' coordinates are not evenly spaced"
                                                 ".*affine="):
                call()
        # An affine given, or carried in the attrs, is used: the coordinates are not read.
        given = (0.1, 0.0, 10.0, 0.0, -0.1, 50.0)
        assert vd.map_tiles(src, lambda r: r, affine=given, chunks=None).shape == src.shape
        carried = src.assign_attrs(transform=given)
        assert vd.map_tiles(carried, lambda r: r, chunks=None).shape == src.shape
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# process_geotiff / write_raster: paths
# ---------------------------------------------------------------------------------------------


@needs_io
def test_process_geotiff_never_overwrites_its_input(geotiff, tmp_path):
    src, _ = geotiff
    before = digest(src)
    for out in (src, tmp_path / "." / "in.tif", str(src)):
        with pytest.raises(ValueError, match="out_path.*input"):
            vd.process_geotiff(src, out, ops.focal_mean_3x3, halo=1, progress=False)
    # A hard link is the same file under another name.
    link = tmp_path / "link.tif"
    link.hardlink_to(src)
    with pytest.raises(ValueError, match="out_path.*input"):
        vd.process_geotiff(src, link, ops.focal_mean_3x3, halo=1, progress=False)
    assert digest(src) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.tif", "link.tif"]


@needs_io
def test_write_raster_never_overwrites_a_file_its_array_reads(geotiff, tmp_path):
    # write_raster(read_raster(p), p) replaced p, with an op between: the input was lost.
    xr = pytest.importorskip("xarray")
    src, data = geotiff
    other = tmp_path / "other.tif"
    io.write_raster(other, OwnedRasterArray.from_numpy(data, nodata=NAN, affine=UTM))
    link = tmp_path / "link.tif"
    link.hardlink_to(src)
    before = {p.name: digest(p) for p in (src, other)}
    read = vd.read_raster(src, chunks=(1, 50, 50))
    arrays = [read,
              vd.map_tiles(read, ops.focal_mean_3x3, halo=1, chunks=None) * 2,
              vd.read_raster(other, chunks=(1, 50, 50)) + read,  # any of several inputs
              dask.optimize(vd.map_bands(read, ops.focal_mean_3x3) + 1)[0],  # fused layers
              vd.read_raster(src, xarray=True, chunks=(1, 50, 50)),
              xr.DataArray(read, dims=("band", "y", "x")).isel(y=slice(0, 10))]
    for array in arrays:
        for out in (src, str(src), tmp_path / "." / "in.tif", link):
            with pytest.raises(ValueError, match=r"^write_raster: path .* is the input file "
                                                 r".*in\.tif.*never replaced"):
                vd.write_raster(array, out)
    with pytest.raises(ValueError, match="is the input file .*other"):
        vd.write_raster(arrays[2], other)
    assert {p.name: digest(p) for p in (src, other)} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.tif", "link.tif", "other.tif"]
    # Another path is written; a persisted array holds its pixels and reads no file.
    out = tmp_path / "out.tif"
    vd.write_raster(arrays[1], out)
    vd.write_raster(read.persist(scheduler="sync") * 2, other)
    np.testing.assert_array_equal(io.read_raster(other).to_numpy(), data * 2)


@needs_io
def test_an_output_in_a_missing_directory_raises_before_any_work(geotiff, tmp_path):
    src, data = geotiff
    calls = []

    def op(r):
        calls.append(r.height)
        return r

    out = tmp_path / "typo" / "deeper" / "out.tif"
    with pytest.raises(FileNotFoundError, match="typo"):
        vd.process_geotiff(src, out, op, progress=False)
    with pytest.raises(FileNotFoundError, match="typo"):
        vd.write_raster(da.from_array(data, chunks=(1, 50, 50)), out)
    assert not (tmp_path / "typo").exists()  # once made, with the output in it
    assert calls == []  # nothing computed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.tif"]


@pytest.mark.parametrize("options,says", [({"compress": "bogus"}, "'BOGUS' .* COMPRESS"),
                                          ({"blocksize": 7}, "multiple of 16, not 7")])
def test_write_options_gdal_refuses_fail_before_the_job(geotiff, tmp_path, options, says):
    src, data = geotiff
    calls = []

    def op(r):
        calls.append(r.height)
        return r

    out = tmp_path / "out.tif"
    with pytest.raises(ValueError, match=says):
        vd.process_geotiff(src, out, op, progress=False, **options)
    # Only the op's run on a small block (to learn its dtype) happened: no 100-row chunk.
    assert calls and max(calls) <= 8
    computed = []  # no client: Dask's local scheduler, in this process

    def count(block):
        computed.append(block.shape)
        return block

    with pytest.raises(ValueError, match=says):
        lazy = da.from_array(data, chunks=(1, 50, 50)).map_blocks(
            count, dtype=data.dtype, meta=np.empty((0, 0, 0), data.dtype))
        vd.write_raster(lazy, out, **options)
    assert computed == []  # no chunk was computed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.tif"]  # no output, no parts


# ---------------------------------------------------------------------------------------------
# chunks= in the forms Dask takes, and none other
# ---------------------------------------------------------------------------------------------


@needs_io
@pytest.mark.parametrize("kind,chunks", [("bands", 1), ("bands", (1, 50, 50)),
                                         ("bands", {0: 1}), ("bands", -1), ("tiles", 50),
                                         ("tiles", (1, -1, "auto"))])
def test_process_geotiff_takes_the_dask_chunks_read_raster_takes(geotiff, tmp_path, kind,
                                                                 chunks):
    # kind="bands" once indexed chunks as a tuple of tuples: an int failed with "'int' object
    # is not subscriptable", (1, 50, 50) with "'int' object is not iterable".
    src, data = geotiff
    out = tmp_path / "out.tif"
    vd.process_geotiff(src, out, lambda r: r, kind=kind, chunks=chunks, progress=False)
    np.testing.assert_array_equal(io.read_raster(out).to_numpy(), data)
    assert vd.read_raster(src, chunks=chunks).compute(scheduler="sync").shape == data.shape


BAD_CHUNKS = [(1.5, TypeError), (object(), TypeError), (True, TypeError),
              ((1, 50.0, 50), TypeError), ("bogus", ValueError), ((1, 2), ValueError),
              (((1,), (100,), (100,)), ValueError), (((0, 2), (100,), (100,)), ValueError),
              ((0, 50, 50), ValueError)]


@needs_io
@pytest.mark.parametrize("chunks,error", BAD_CHUNKS)
def test_malformed_chunks_are_named_before_any_work(geotiff, tmp_path, chunks, error):
    src, data = geotiff
    calls = []

    def op(r):
        calls.append(r.height)
        return r

    arr = da.from_array(data, chunks=(1, 50, 50))
    for who, call in (
            ("read_raster", lambda: vd.read_raster(src, chunks=chunks)),
            ("map_tiles", lambda: vd.map_tiles(arr, op, chunks=chunks)),
            ("process_geotiff", lambda: vd.process_geotiff(src, tmp_path / "o.tif", op,
                                                           kind="bands", chunks=chunks,
                                                           progress=False)),
            ("process_geotiff", lambda: vd.process_geotiff(src, tmp_path / "o.tif", op,
                                                           chunks=chunks, progress=False))):
        with pytest.raises(error, match=rf"^{who}: chunks .*must be Dask chunks: an int"):
            call()
    assert calls == []  # the op never ran, not even on the small block
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.tif"]


def test_a_block_shape_that_is_not_rows_cols_is_named():
    m = RasterMetadata(100, 100, 1, np.dtype(np.float32), None, UTM, None)
    for bad in (16, "16", (16,), (16, 16, 16)):
        with pytest.raises(TypeError, match=r"block_shape must be \(rows, cols\)"):
            vd.plan_chunks(m, vram_budget=1 << 30, block_shape=bad)
    assert vd.plan_chunks(m, vram_budget=1 << 30, block_shape=[16, 16])


# ---------------------------------------------------------------------------------------------
# nodata an integer dtype cannot hold
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("nodata", [-1, 256, 1e10, -9999.0])
def test_an_integer_nodata_the_dtype_cannot_hold_marks_no_pixel_as_without_dask(tmp_path, nodata):
    # As OwnedRasterArray.from_numpy and the ops have it: kept, no pixel is nodata. The small
    # block that learns the op's result was filled with it: -1 / 256 for uint8 failed with
    # NumPy's OverflowError, 1e10 with a RuntimeWarning (invalid value in cast).
    data = np.arange(2 * 20 * 20, dtype=np.uint64).astype(np.uint8).reshape(2, 20, 20)
    whole = OwnedRasterArray.from_numpy(data, nodata=nodata)
    expect = ops.fill_nodata(whole, 7).to_numpy()  # no pixel is nodata: unchanged
    np.testing.assert_array_equal(expect, data)
    arr = da.from_array(data, chunks=(1, 10, 10))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for lazy in (vd.map_bands(arr, lambda b: ops.fill_nodata(b, 7), nodata=nodata),
                     vd.map_tiles(arr, lambda r: ops.fill_nodata(r, 7), nodata=nodata,
                                  chunks=None)):
            np.testing.assert_array_equal(lazy.compute(scheduler="sync"), expect)
        same = vd.map_tiles(arr, lambda r: r, nodata=nodata, chunks=None)
        if io.io_available():
            out = tmp_path / "out.tif"
            meta = vd.write_raster(same, out, nodata=nodata)
            assert meta.nodata == whole.nodata
            np.testing.assert_array_equal(io.read_raster(out).to_numpy(), data)


@needs_io
def test_process_geotiff_of_a_file_whose_nodata_its_dtype_cannot_hold(tmp_path):
    data = np.arange(20 * 20, dtype=np.uint64).astype(np.uint8).reshape(1, 20, 20)
    src = tmp_path / "in.tif"
    io.write_raster(src, OwnedRasterArray.from_numpy(data, nodata=256, affine=UTM))
    assert io.read_raster_metadata(src).nodata == 256  # GDAL keeps it
    out = tmp_path / "out.tif"
    meta = vd.process_geotiff(src, out, lambda r: r, chunks=(1, 10, 10), progress=False)
    assert meta.nodata == 256
    np.testing.assert_array_equal(io.read_raster(out).to_numpy(), data)


@pytest.mark.parametrize("nodata,error,says", [
    (NAN, ValueError, "a NaN nodata cannot mark pixels of dtype uint8"),
    (np.float32("nan"), ValueError, "a NaN nodata cannot mark pixels of dtype uint8"),
    ("x", TypeError, "nodata must be a number or None, not 'x'"),
    (True, TypeError, "nodata must be a number or None, not True")])
def test_a_nodata_from_numpy_refuses_is_refused_by_name_before_any_work(tmp_path, nodata,
                                                                         error, says):
    with pytest.raises(error, match=says):  # the rule checked: OwnedRasterArray's
        OwnedRasterArray.from_numpy(np.zeros((2, 2), np.uint8), nodata=nodata)
    calls = []

    def op(r):
        calls.append(r.height)
        return r

    arr = da.zeros((2, 20, 20), dtype=np.uint8, chunks=(1, 10, 10))
    for who, call in (("map_bands", lambda: vd.map_bands(arr, op, nodata=nodata)),
                      ("map_tiles", lambda: vd.map_tiles(arr, op, nodata=nodata)),
                      ("write_raster", lambda: vd.write_raster(arr, tmp_path / "o.tif",
                                                               nodata=nodata))):
        # Once "from_numpy: ..." from the op's first run, and "invalid literal for int()" for
        # "x" (a ValueError from NumPy filling the small block).
        prefix = f"{who}: " if error is ValueError else ""
        with pytest.raises(error, match=f"^{prefix}{says}"):
            call()
    assert calls == []
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# Ops whose results disagree with the first result
# ---------------------------------------------------------------------------------------------


def widening(r):
    """float32 on the small inference block, float64 on real chunks."""
    a = r.to_numpy()
    return OwnedRasterArray.from_numpy(a.astype(np.float32 if a.shape[-1] <= 8 else np.float64),
                                       nodata=r.nodata, affine=r.affine)


def drifting_nodata(r):
    """nodata 0 on the small inference block, 5 on real chunks."""
    a = r.to_numpy()
    return OwnedRasterArray.from_numpy(a, nodata=0.0 if a.shape[-1] <= 8 else 5.0,
                                       affine=r.affine)


@pytest.mark.parametrize("op,what", [(widening, "dtype float64"),
                                     (drifting_nodata, "nodata 5.0")])
def test_a_chunk_result_unlike_the_first_raises(op, what):
    arr = da.zeros((1, 64, 64), dtype=np.float32, chunks=(1, 32, 32))
    lazy = vd.map_tiles(arr, op, chunks=None)
    with pytest.raises(ValueError, match=what):
        lazy.compute(scheduler="sync")
    # A consistent op still passes, NaN nodata included.
    same = vd.map_tiles(arr, lambda r: r, nodata=NAN, chunks=None).compute(scheduler="sync")
    assert same.dtype == np.float32


@needs_io
def test_a_widening_op_is_not_written_cast(geotiff, tmp_path):
    src, _ = geotiff
    out = tmp_path / "wide.tif"
    with pytest.raises(ValueError, match="dtype float64"):
        vd.process_geotiff(src, out, widening, progress=False,
                           chunks=((2,), (50, 50), (50, 50)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.tif"]


# ---------------------------------------------------------------------------------------------
# Halos as wide as the chunks or the raster
# ---------------------------------------------------------------------------------------------


def whole_focal(data):
    return ops.focal_mean_3x3(OwnedRasterArray.from_numpy(data, nodata=NAN)).to_numpy()


def test_chunks_are_never_thinner_than_the_halo():
    m = RasterMetadata(100, 100, 1, np.dtype(np.float32), None, UTM, None)
    # A small raster on a big cluster: min_chunks once split it into 1-row chunks.
    for halo in (1, 3, 5):
        chunks = vd.plan_chunks(m, halo=halo, vram_budget=1 << 30, min_chunks=1000)
        assert min(chunks[1]) >= halo and sum(chunks[1]) == 100, (halo, chunks)
    # The last chunk is evened out with the one before it, even when halving leaves too little.
    assert min(vd._split(81, 40, 35)) >= 35
    assert sum(vd._split(81, 40, 35)) == 81


@pytest.mark.parametrize("chunks,halo", [((1, 5, 5), 8), (((1,), (40,), (7, 7, 7, 7, 7, 5)), 7),
                                         ((1, 16, 16), 100), ((1, 16, 16), 10**6)])
def test_map_tiles_with_a_halo_wider_than_the_chunks(chunks, halo):
    data = np.random.default_rng(5).random((1, 40, 40), dtype=np.float32)
    arr = da.from_array(data, chunks=chunks)
    got = vd.map_tiles(arr, ops.focal_mean_3x3, halo=halo, nodata=NAN, chunks=None)
    np.testing.assert_array_equal(got.compute(scheduler="sync"), whole_focal(data))


# ---------------------------------------------------------------------------------------------
# Clients
# ---------------------------------------------------------------------------------------------


def test_a_closed_or_wrong_client_raises_a_clear_error():
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster:
        client = distributed.Client(cluster)
        vd.register(client)
        vd.register(client)  # registering again replaces it
        assert len(vd.memory_pool_stats(client)) == 1
        client.close()
        for call in (lambda: vd.register(client), lambda: vd.memory_pool_stats(client),
                     lambda: vd.available_vram_bytes(client),
                     lambda: vd.free_pool_memory(client),
                     lambda: vd.plan_chunks(np.zeros((1, 10, 10), np.float32), client=client),
                     lambda: vd.map_tiles(np.zeros((1, 10, 10), np.float32), lambda r: r,
                                          chunks=None, client=client)):
            with pytest.raises(ValueError, match="client is closed"):
                call()
    with pytest.raises(TypeError, match="client must be a distributed.Client, not str"):
        vd.register("tcp://127.0.0.1:8786")
