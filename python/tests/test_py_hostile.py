# SPDX-License-Identifier: Apache-2.0
"""Hostile and careless inputs to the non-Dask API: each gets a typed error naming the argument,
and nothing on disk is lost."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from vibespatial_raster import dispatch, io
from vibespatial_raster.buffers import OwnedRasterArray, RasterWindow

pytestmark = pytest.mark.skipif(not io.io_available(), reason="built without GDAL")


@pytest.fixture
def tif(tmp_path):
    data = np.arange(3 * 40 * 50, dtype=np.float32).reshape(3, 40, 50)
    path = tmp_path / "in.tif"
    io.write_raster(path, OwnedRasterArray.from_numpy(data, nodata=-1.0))
    return path, data


# ---- paths: a NUL byte used to cut the path short, so another file was read or replaced ----

def test_write_raster_path_with_nul_refused_and_other_file_kept(tif):
    path, data = tif
    small = OwnedRasterArray.from_numpy(np.zeros((2, 2), np.uint8))
    with pytest.raises(ValueError, match="null byte"):
        io.write_raster(str(path) + "\0.evil.tif", small)
    assert np.array_equal(io.read_raster(path).to_numpy(), data)


def test_read_paths_with_nul_refused(tif):
    path, _ = tif
    with pytest.raises(ValueError, match="null byte"):
        io.read_raster(str(path) + "\0x")
    with pytest.raises(ValueError, match="null byte"):
        io.read_raster_metadata(str(path) + "\0x")


def test_streamed_paths_with_nul_refused(tif, tmp_path):
    path, data = tif
    plan = dispatch.analyze_raster_plan(40, 50, "float32", band_count=3, vram_budget=0)
    with pytest.raises(ValueError, match="null byte"):
        io.process_raster_streamed(path, str(path) + "\0x", lambda t: t, plan)
    with pytest.raises(ValueError, match="null byte"):
        io.process_raster_streamed(str(path) + "\0x", tmp_path / "o.tif", lambda t: t, plan)
    assert not (tmp_path / "o.tif").exists()
    assert np.array_equal(io.read_raster(path).to_numpy(), data)


def test_bytes_paths_work_like_str(tif, tmp_path):
    path, data = tif
    assert np.array_equal(io.read_raster(os.fsencode(path)).to_numpy(), data)
    assert io.read_raster_metadata(os.fsencode(path)).band_count == 3
    out = tmp_path / "b.tif"
    io.write_raster(os.fsencode(out), io.read_raster(path))
    assert np.array_equal(io.read_raster(out).to_numpy(), data)


# ---- windows: floats were truncated, strings split into digits, big ints gave pybind noise ----

@pytest.mark.parametrize("window", [(0.9, 0, 10, 10), (0, 0, 10.5, 10), (True, 0, 10, 10),
                                    "0055", RasterWindow(0.5, 0, 10, 10), (0, 0, "10", 10)])
def test_read_raster_window_of_non_integers_refused(tif, window):
    path, _ = tif
    with pytest.raises(TypeError, match="window"):
        io.read_raster(path, window=window)


def test_read_raster_window_too_large_is_value_error(tif):
    path, _ = tif
    with pytest.raises(ValueError, match="window"):
        io.read_raster(path, window=(0, 0, 2**70, 10))


def test_read_raster_window_numpy_integers_accepted(tif):
    path, data = tif
    w = np.array([1, 2, 3, 4])
    r = io.read_raster(path, window=tuple(w))
    assert np.array_equal(r.to_numpy(), data[:, 2:6, 1:4])


# ---- bands: a numpy array raised "truth value ambiguous"; 1.7, True and "12" were read ----

def test_read_raster_bands_numpy_array(tif):
    path, data = tif
    r = io.read_raster(path, bands=np.array([3, 1]))
    assert np.array_equal(r.to_numpy(), data[[2, 0]])


@pytest.mark.parametrize("bands", [[1.7], [True], "12", [np.float64(2.0)], 2])
def test_read_raster_bands_of_non_integers_refused(tif, bands):
    path, _ = tif
    with pytest.raises(TypeError, match="bands"):
        io.read_raster(path, bands=bands)


def test_read_raster_empty_band_list_refused(tif):
    path, _ = tif
    with pytest.raises(ValueError, match="bands"):
        io.read_raster(path, bands=[])


def test_read_raster_huge_band_is_value_error(tif):
    path, _ = tif
    with pytest.raises(ValueError, match="band"):
        io.read_raster(path, bands=[2**40])


# ---- a FIFO (or a device) as input: GDAL's open blocked forever, Ctrl-C could not stop it ----

@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
@pytest.mark.parametrize("call", ["read_raster_metadata", "read_raster"])
def test_fifo_input_refused_without_blocking(tmp_path, call):
    fifo = tmp_path / "pipe.tif"
    os.mkfifo(fifo)
    code = ("import sys\n"
            "from vibespatial_raster import io\n"
            f"try:\n    io.{call}(sys.argv[1])\n"
            "except ValueError as e:\n    print('ValueError:', e)\n")
    try:
        done = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True,
                              text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{call} on a FIFO blocked for 30 s")
    assert done.returncode == 0, done.stderr
    assert "ValueError:" in done.stdout and "not a regular file" in done.stdout


# ---- halo and block sizes: 1.7 and 256.9 were truncated, True taken as 1, "32" parsed ----

@pytest.mark.parametrize("halo", [1.7, True, float("nan"), "1"])
def test_streamed_halo_must_be_an_integer(tif, tmp_path, halo):
    path, _ = tif
    plan = dispatch.analyze_raster_plan(40, 50, "float32", band_count=3, vram_budget=0)
    out = tmp_path / "o.tif"
    with pytest.raises(TypeError, match="halo"):
        io.process_raster_streamed(path, out, lambda t: t, plan, halo=halo)
    assert not out.exists()


def test_streamed_huge_halo_is_value_error(tif, tmp_path):
    path, _ = tif
    plan = dispatch.analyze_raster_plan(40, 50, "float32", band_count=3, vram_budget=0)
    with pytest.raises(ValueError, match="halo"):
        io.process_raster_streamed(path, tmp_path / "o.tif", lambda t: t, plan, halo=2**70)


@pytest.mark.parametrize("side", [256.9, "32", True])
def test_write_raster_block_side_must_be_an_integer(tif, tmp_path, side):
    path, _ = tif
    r = io.read_raster(path)
    with pytest.raises(TypeError, match="blockxsize"):
        io.write_raster(tmp_path / "o.tif", r, blockxsize=side, blockysize=side)
    assert not (tmp_path / "o.tif").exists()


def test_write_raster_block_side_numpy_integer_accepted(tif, tmp_path):
    path, data = tif
    io.write_raster(tmp_path / "o.tif", io.read_raster(path), blockxsize=np.int64(32),
                    blockysize=np.int32(32))
    assert np.array_equal(io.read_raster(tmp_path / "o.tif").to_numpy(), data)
