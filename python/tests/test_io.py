# SPDX-License-Identifier: Apache-2.0
"""vibespatial_raster.io (GDAL): write, read back, header-only planning, streamed processing."""

from __future__ import annotations

import numpy as np
import pytest

from vibespatial_raster import dispatch, io, ops
from vibespatial_raster.buffers import OwnedRasterArray, RasterWindow

pytestmark = pytest.mark.skipif(not io.io_available(), reason="built without GDAL")

AFFINE = (30.0, 0.0, 440_720.0, 0.0, -30.0, 3_751_320.0)


@pytest.fixture
def tif(tmp_path):
    data = (np.arange(3 * 300 * 280) % 1000).reshape(3, 300, 280).astype(np.int16)
    path = tmp_path / "in.tif"
    r = OwnedRasterArray.from_numpy(data, nodata=-1, affine=AFFINE, crs="EPSG:32611")
    io.write_raster(path, r)
    return path, data


def test_write_then_read(tif):
    path, data = tif
    meta = io.read_raster_metadata(path)
    assert (meta.height, meta.width, meta.band_count, meta.dtype) == (300, 280, 3, np.int16)
    assert meta.nodata == -1 and meta.affine == AFFINE and meta.driver == "GTiff"
    assert "32611" in meta.crs
    r = io.read_raster(path)
    assert r.shape == (3, 300, 280) and np.array_equal(r.to_numpy(), data)
    part = io.read_raster(str(path), window=RasterWindow(10, 20, 30, 40), bands=[3, 1])
    assert np.array_equal(part.to_numpy(), data[[2, 0], 20:60, 10:40])
    assert part.affine[2] == AFFINE[2] + 10 * 30 and part.affine[5] == AFFINE[5] - 20 * 30
    assert np.array_equal(io.read_raster(path, window=(0, 0, 5, 5)).to_numpy(),
                          data[:, :5, :5])


def test_plan_from_file_metadata(tif):
    path, _ = tif
    meta = io.read_raster_metadata(path)
    plan = dispatch.plan_from_metadata(meta, halo=1, vram_budget=300_000)
    assert plan == dispatch.analyze_raster_plan(300, 280, np.int16, band_count=3, halo=1,
                                                vram_budget=300_000)


def test_streamed_processing_equals_whole(tif, tmp_path):
    path, data = tif
    plan = dispatch.analyze_raster_plan(300, 280, np.int16, band_count=3, halo=1,
                                        vram_budget=500_000)
    assert plan.strategy == "tiled" and plan.n_tiles > 1
    progress = []
    out = tmp_path / "out.tif"
    io.process_raster_streamed(path, out, ops.focal_mean_3x3, plan,
                               progress=lambda done, total: progress.append((done, total)))
    assert progress[-1] == (plan.n_tiles, plan.n_tiles) and len(progress) == plan.n_tiles
    result = io.read_raster(out)
    assert result.dtype == np.float32  # the op's dtype, not the source's
    whole = ops.focal_mean_3x3(OwnedRasterArray.from_numpy(data, nodata=-1))
    assert np.array_equal(result.to_numpy(), whole.to_numpy(), equal_nan=True)


def test_io_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="read_raster_metadata: cannot open raster"):
        io.read_raster_metadata(tmp_path / "missing.tif")
    (tmp_path / "notes.tif").write_text("not a raster\n")
    with pytest.raises(ValueError, match="read_raster_metadata: cannot open raster"):
        io.read_raster_metadata(tmp_path / "notes.tif")
    r = OwnedRasterArray.from_numpy(np.zeros((4, 4), np.uint8))
    with pytest.raises(ValueError):
        io.write_raster(tmp_path / "x.tif", r, blockxsize=256, blockysize=128)
    with pytest.raises(TypeError):
        io.read_raster(12.5)
    path = tmp_path / "small.tif"
    io.write_raster(path, r)
    with pytest.raises(ValueError):
        io.read_raster(path, window=(2, 2, 10, 10))
    with pytest.raises(ValueError):
        io.read_raster(path, bands=[2])
    plan = dispatch.analyze_raster_plan(4, 4, np.uint8, vram_budget=0)
    with pytest.raises(RuntimeError, match="tile failed"):
        io.process_raster_streamed(path, tmp_path / "o.tif",
                                   lambda t: (_ for _ in ()).throw(RuntimeError("tile failed")),
                                   plan)
