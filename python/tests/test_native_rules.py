# SPDX-License-Identifier: Apache-2.0
"""The library's rules as the package reaches them through _core, each written once in C++: the
placement rule, the tile executor's first-result rule, the shift of an affine to a window, a
file's blocks, the merge of a raster written in parts; and the package's one integer-argument
rule (_ints), which io, dispatch and dask share."""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest

from vibespatial_raster import _core, _errors, dispatch, io
from vibespatial_raster._ints import integer, is_integer
from vibespatial_raster.buffers import OwnedRasterArray

needs_io = pytest.mark.skipif(not io.io_available(), reason="built without GDAL")
AFFINE = (30.0, 0.0, 440_720.0, 0.0, -30.0, 3_751_320.0)


# ---- placement ------------------------------------------------------------------------------

def test_placement_names_are_the_librarys():
    assert [_core.placement_from_string(s) for s in ("auto", "gpu", "cpu")] == ["auto", "gpu",
                                                                                "cpu"]
    with pytest.raises(ValueError, match="placement must be auto, gpu or cpu, not 'tpu'"):
        _core.placement_from_string("tpu")


def test_the_placement_rule_on_given_facts():
    gpu = {"available": True, "emulated": False, "library": "libcuda.so.1",
           "devices": [{"name": "NVIDIA H200"}]}
    assert _core.placed("auto", gpu, True) == ("device", "GPU NVIDIA H200: device ops (CUDA)",
                                               False)
    assert _core.placed("auto", gpu, False)[0] == "host"
    assert _core.placed("cpu", gpu, True)[0] == "host"
    emulator = dict(gpu, emulated=True)
    assert _core.placed("auto", emulator, True)[0] == "host"
    assert _core.placed("gpu", emulator, False)[0] == "device"
    # Keys that are missing read as their defaults (no driver).
    assert _core.placed("auto", {}, True)[0] == "host"
    with pytest.raises(_errors.DriverUnavailableError, match="no usable CUDA driver"):
        _core.placed("gpu", {"available": False, "reason": "none here"}, True)
    # Without facts, the process's own: auto keeps the host ops on the emulator.
    if _core.driver_info()["emulated"]:
        residency, reason, emulated = _core.placed("auto")
        assert residency == "host" and emulated and "emulator" in reason


def test_dask_decides_device_auto_by_the_librarys_rule(monkeypatch):
    pytest.importorskip("distributed")
    from vibespatial_raster import ops
    from vibespatial_raster import dask as vd
    from vibespatial_raster.dask import _placement

    # A real GPU whose build has no CUDA ops: the host, for the reason the library gives.
    monkeypatch.setattr(vd, "_auto_mode", None)
    monkeypatch.setattr(_core, "driver_info", lambda: {"available": True, "emulated": False,
                                                       "devices": [{"name": "X"}]})
    monkeypatch.setattr(ops, "ops_built_with_cuda", lambda: False)
    asked = []
    real_placed = _core.placed
    monkeypatch.setattr(_core, "placed", lambda *a: asked.append(a) or real_placed(*a))
    assert _placement._process_mode() == "cpu"
    assert asked and asked[0][0] == "auto"
    with pytest.raises(ValueError, match="^device: placement must be auto, gpu or cpu"):
        _placement._check_device("tpu")
    with pytest.raises(ValueError, match="^device: placement must be auto, gpu or cpu"):
        _placement._check_device(None)


# ---- the first-result rule ------------------------------------------------------------------

def raster(dtype=np.float32, bands=1, shape=(4, 5), nodata=None):
    return OwnedRasterArray.from_numpy(np.zeros((bands, *shape), dtype), nodata=nodata)._native


def test_the_first_result_fixes_dtype_bands_and_nodata():
    rule = _core.TileResultRule("map_tiles")
    assert rule.dtype is None and rule.band_count is None and not rule.nodata_fixed
    rule.check(raster(nodata=math.nan), (0, 0, 5, 4), "chunk (0, 0)")
    assert (rule.dtype, rule.band_count, rule.nodata_fixed) == ("float32", 1, True)
    assert math.isnan(rule.nodata)
    rule.check(raster(nodata=math.nan), (5, 0, 5, 4), "chunk (0, 1)")  # NaN equals NaN
    with pytest.raises(ValueError, match=r"^map_tiles: chunk \(1, 0\) returned dtype float64, "
                                         "which differs from the first tile's float32"):
        rule.check(raster(np.float64, nodata=math.nan), (0, 4, 5, 4), "chunk (1, 0)")
    with pytest.raises(ValueError, match="returned nodata 5.0, which differs from the first "
                                         "tile's nan"):
        rule.check(raster(nodata=5.0), (0, 4, 5, 4), "chunk (1, 0)")
    with pytest.raises(ValueError, match=r"op returned 4 x 5 for chunk \(1, 1\) of 3 x 5"):
        rule.check(raster(nodata=math.nan), (0, 4, 5, 3), "chunk (1, 1)")


def test_the_rule_takes_expectations_fixed_apart():
    rule = _core.TileResultRule("map_bands")
    rule.expect_dtype("uint16")
    rule.expect_band_count(2)
    rule.expect_nodata(2**64 - 1)
    with pytest.raises(ValueError, match="returned dtype uint64"):
        rule.check(raster(np.uint64, 2, nodata=2**64 - 1), (0, 0, 5, 4), "chunk 0")
    rule.expect_dtype("uint64")
    rule.check(raster(np.uint64, 2, nodata=2**64 - 1), (0, 0, 5, 4), "chunk 0")
    assert rule.nodata == 2**64 - 1  # exactly, beyond a double
    with pytest.raises(ValueError, match="returned nodata 18446744073709551614"):
        rule.check(raster(np.uint64, 2, nodata=2**64 - 2), (0, 0, 5, 4), "chunk 1")
    with pytest.raises(ValueError, match="returned 1 band"):
        rule.check(raster(np.uint64, 1, nodata=2**64 - 1), (0, 0, 5, 4), "chunk 2")
    with pytest.raises(TypeError, match="unsupported raster dtype 'complex64'"):
        rule.expect_dtype("complex64")


# ---- georeferencing -------------------------------------------------------------------------

def test_an_affine_is_shifted_to_a_window_as_the_library_shifts_it():
    rotated = (30.0, 0.5, 440_720.0, -0.25, -30.0, 3_751_320.0)
    assert _core.affine_shifted(rotated, 0, 0) == rotated
    a, b, c, d, e, f = rotated
    assert _core.affine_shifted(rotated, 7, 3) == (a, b, c + a * 7 + b * 3, d, e,
                                                   f + d * 7 + e * 3)
    if io.io_available():  # what the library's windowed reads give their windows
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "r.tif")
            io.write_raster(path, OwnedRasterArray.from_numpy(np.zeros((1, 10, 10), np.float32),
                                                              affine=rotated))
            assert io.read_raster(path, window=(7, 3, 2, 2)).affine == \
                _core.affine_shifted(rotated, 7, 3)


# ---- files ----------------------------------------------------------------------------------

@needs_io
def test_a_files_blocks_are_read_natively(tmp_path):
    r = OwnedRasterArray.from_numpy(np.zeros((2, 100, 70), np.float32))
    io.write_raster(tmp_path / "tiled.tif", r, blockxsize=32, blockysize=32)
    meta, band_nodata, georeferenced, block = _core.read_raster_info(
        str(tmp_path / "tiled.tif"), False)
    assert block == (32, 32) and band_nodata == [None, None] and georeferenced
    assert meta[:4] == (100, 70, 2, "float32")
    io.write_raster(tmp_path / "strips.tif", r, tiled=False)
    rows, cols = _core.read_raster_info(str(tmp_path / "strips.tif"), False)[3]
    assert cols == 70 and 1 <= rows <= 100
    pytest.importorskip("distributed")
    from vibespatial_raster.dask import _chunks

    assert _chunks._file_block_shape(tmp_path / "tiled.tif") == (32, 32)


def write_parts(tmp_path, data, nodata, rows, cols):
    parts = []
    r0 = 0
    for rh in rows:
        c0 = 0
        for cw in cols:
            path = str(tmp_path / f"part-{r0}-{c0}.tif")
            piece = OwnedRasterArray.from_numpy(data[:, r0:r0 + rh, c0:c0 + cw], nodata=nodata)
            io.write_raster(path, piece, compress=None, tiled=False)
            parts.append((path, (c0, r0, cw, rh), 0))
            c0 += cw
        r0 += rh
    return parts


@needs_io
@pytest.mark.parametrize("dtype,nodata", [(np.int64, -(2**63)), (np.uint64, 2**64 - 1),
                                          (np.float64, -sys.float_info.max),
                                          (np.float32, None)])
def test_parts_are_merged_natively_exactly(tmp_path, dtype, nodata):
    data = (np.arange(2 * 37 * 41) % 251).reshape(2, 37, 41).astype(dtype)
    parts = write_parts(tmp_path, data, nodata, (20, 9, 8), (7, 30, 4))
    out = str(tmp_path / "merged.tif")
    _core.merge_raster_parts(parts, 37, 41, 2, np.dtype(dtype).name, nodata, AFFINE,
                             "EPSG:32611", out, "GTiff", "DEFLATE", True, 16)
    back = io.read_raster(out)
    assert np.array_equal(back.to_numpy(), data)
    assert back.affine == AFFINE and "32611" in back.crs
    assert _core.read_raster_info(out, False)[1] == [nodata, nodata]
    assert _core.read_raster_info(out, False)[3] == (16, 16)


@needs_io
def test_a_merge_of_parts_that_are_no_grid_is_refused_and_writes_nothing(tmp_path):
    data = np.ones((1, 20, 20), np.float32)
    parts = write_parts(tmp_path, data, None, (10, 10), (10, 10))
    out = tmp_path / "out.tif"
    out.write_bytes(b"before")
    merge = lambda ps: _core.merge_raster_parts(  # noqa: E731
        ps, 20, 20, 1, "float32", None, AFFINE, "", str(out), "GTiff", "NONE", False, 256)
    with pytest.raises(ValueError, match=r"3 parts for a grid of 1 x 2 x 2 cells"):
        merge(parts[:3])
    with pytest.raises(ValueError,
                       match=r"part 0 \('.*part-0-0.tif'\) is float32, the raster int16"):
        _core.merge_raster_parts(parts, 20, 20, 1, "int16", None, AFFINE, "", str(out), "GTiff",
                                 "NONE", False, 256)
    os.remove(parts[2][0])
    with pytest.raises(FileNotFoundError):
        merge(parts)
    assert out.read_bytes() == b"before"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.tif", "part-0-0.tif",
                                                           "part-0-10.tif", "part-10-10.tif"]


# ---- the integer-argument rule --------------------------------------------------------------

def test_one_integer_rule():
    assert integer("n", 3) == 3 and integer("n", np.int64(-2)) == -2
    assert is_integer(np.uint8(1)) and not is_integer(True) and not is_integer(np.True_)
    for bad in (True, np.True_, 1.0, "1", None, 2.5):
        with pytest.raises(TypeError, match=r"^n must be an integer, not "):
            integer("n", bad)


@needs_io
def test_io_dispatch_and_dask_refuse_non_integers_alike(tmp_path):
    path = tmp_path / "r.tif"
    io.write_raster(path, OwnedRasterArray.from_numpy(np.zeros((1, 4, 4), np.float32)))
    with pytest.raises(TypeError, match=r"^window must be an integer, not 0.5 \(float\)$"):
        io.read_raster(path, window=(0.5, 0, 2, 2))
    with pytest.raises(TypeError, match=r"^height must be an integer, not 1.5 \(float\)$"):
        dispatch.max_bands_for_budget(1.5, 4, np.float32, vram_budget=1 << 20)
    with pytest.raises(TypeError, match=r"^memory_pool_stats: device must be an integer, not "
                                        r"'0' \(str\)$"):
        from vibespatial_raster import memory

        memory.memory_pool_stats("0")
    pytest.importorskip("distributed")
    from vibespatial_raster import dask as vd

    with pytest.raises(TypeError, match=r"^halo must be an integer, not 1.5 \(float\)$"):
        vd.plan_chunks(path, halo=1.5, vram_budget=1 << 20)


def test_dask_chunks_are_checked_by_the_executors_first_result_rule():
    da = pytest.importorskip("dask.array")
    pytest.importorskip("distributed")
    from vibespatial_raster import dask as vd

    def widening(r):  # float32 on the sample block, float64 on the chunks
        a = r.to_numpy()
        return OwnedRasterArray.from_numpy(a.astype(np.float32 if a.shape[-1] <= 8 else
                                                    np.float64), affine=r.affine)

    arr = da.zeros((1, 64, 64), dtype=np.float32, chunks=(1, 32, 32))
    with pytest.raises(ValueError, match=r"^map_tiles: chunk \(0, [01], [01]\) \(pixels from row "
                                         r"(0|32), column (0|32)\) returned dtype float64, which "
                                         r"differs from the first tile's float32"):
        vd.map_tiles(arr, widening, chunks=None).compute(scheduler="sync")
    with pytest.raises(ValueError, match=r"^map_bands: op returned 3 x 3 for the sample block"):
        vd.map_bands(arr, lambda b: OwnedRasterArray.from_numpy(np.zeros((3, 3), np.float32)))
