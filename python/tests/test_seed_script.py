# SPDX-License-Identifier: Apache-2.0
"""A script written against the Python original (vibespatial.raster.memory / dispatch /
buffers) runs on the package after changing only its imports."""

from __future__ import annotations

from conftest import run_python

SEED_SCRIPT = '''
import numpy as np
from vibespatial.raster.memory import configure_memory_pool, free_pool_memory, memory_pool_stats
from vibespatial.raster.dispatch import (analyze_raster_plan, available_vram_bytes,
                                         dispatch_per_band_cpu, dispatch_per_band_gpu,
                                         max_bands_for_budget, plan_from_metadata)
from vibespatial.raster.buffers import OwnedRasterArray, TilingStrategy

tier = configure_memory_pool()
assert tier in ("A", "B", "C", "fallback")
stats = memory_pool_stats()
assert stats["tier"] == tier and stats["configured"]
for key in ("current_bytes", "peak_bytes", "total_bytes", "current_count", "peak_count",
            "total_count", "pool_size"):
    assert key in stats, key

assert max_bands_for_budget(1000, 1000, np.float32) >= 1
plan = analyze_raster_plan(1000, 1000, np.float32, band_count=3, vram_budget=80_000_000)
assert plan.strategy == TilingStrategy.WHOLE and plan.tile_shape is None
big = analyze_raster_plan(40_000, 40_000, np.float64, band_count=4, halo=2,
                          vram_budget=80_000_000)
assert big.strategy == TilingStrategy.TILED and big.n_tiles > 1 and big.halo == 2

data = np.stack([np.full((64, 64), i, np.float32) for i in range(3)])
raster = OwnedRasterArray.from_numpy(data, nodata=-9999.0, affine=(10, 0, 0, 0, -10, 640))
assert raster.band_count == 3 and raster.shape == (3, 64, 64)
assert plan_from_metadata(raster.metadata, vram_budget=80_000_000).strategy == "whole"

def add_one(band):
    return OwnedRasterArray.from_numpy(band.to_numpy() + 1, nodata=band.nodata,
                                       affine=band.affine, crs=band.crs)

cpu = dispatch_per_band_cpu(raster, add_one)
gpu = dispatch_per_band_gpu(raster, add_one, buffers_per_band=2, scratch_bytes=0)
for out in (cpu, gpu):
    assert np.array_equal(out.to_numpy(), data + 1)
    assert out.nodata == raster.nodata and out.affine == raster.affine
assert available_vram_bytes() > 0
free_pool_memory()
print("seed script ok")
'''


def test_a_seed_script_runs_after_changing_its_imports():
    script = SEED_SCRIPT.replace("from vibespatial.raster.", "from vibespatial_raster.")
    assert script.count("vibespatial_raster") == 3 and "vibespatial.raster" not in script
    assert "seed script ok" in run_python(script)
