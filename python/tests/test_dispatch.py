# SPDX-License-Identifier: Apache-2.0
"""vibespatial_raster.dispatch: the seed's budget examples, the planner against the C ABI and
the Python original's algorithm on a grid, Python callables in per-band dispatch, bad input."""

from __future__ import annotations

import ctypes
import functools
import itertools
import math

import numpy as np
import pytest
from conftest import run_python

import vibespatial_raster as vsr
from vibespatial_raster import _core, dispatch, ops, tiling
from vibespatial_raster.buffers import (OwnedRasterArray, RasterMetadata, RasterPlan, Residency,
                                        TilingStrategy)

MB80 = 80_000_000


# ---- the seed's examples ----


def test_seed_examples_with_an_explicit_budget():
    assert dispatch.max_bands_for_budget(1000, 1000, np.float32, vram_budget=MB80) == 10
    assert dispatch.max_bands_for_budget(1000, 1000, np.uint8, vram_budget=MB80) == 40
    assert dispatch.max_bands_for_budget(1000, 1000, np.float64, vram_budget=MB80) == 5
    assert dispatch.max_bands_for_budget(1000, 1000, np.float32, scratch_bytes=30_000_000,
                                         vram_budget=MB80) == 6


def test_seed_examples_on_a_device_whose_budget_is_80_mb():
    # available = free * 0.85: an emulated device of ceil(80 MB / 0.85) bytes has an 80 MB budget,
    # so the seed's calls run unchanged, with the budget the library measures.
    out = run_python(
        """
        import numpy as np
        from vibespatial_raster.dispatch import available_vram_bytes, max_bands_for_budget
        assert available_vram_bytes() == 80_000_000, available_vram_bytes()
        print(max_bands_for_budget(1000, 1000, np.float32),
              max_bands_for_budget(1000, 1000, np.uint8),
              max_bands_for_budget(1000, 1000, np.float64),
              max_bands_for_budget(1000, 1000, np.float32, scratch_bytes=30_000_000))
        """,
        # The emulator rounds cuMemGetInfo's free bytes down to 2 MiB by default, as a real
        # driver's figure is not exact to the byte; this case needs the exact figure.
        {"VSR_EMU_DEVICE_MEMORY": str(math.ceil(MB80 / 0.85)), "VSR_EMU_MEMINFO_QUANTUM": "0"},
    )
    assert out.split() == ["10", "40", "5", "6"]


def test_max_bands_is_at_least_one_and_accepts_any_numpy_dtype():
    assert dispatch.max_bands_for_budget(1000, 1000, "float64", vram_budget=0) == 1
    assert dispatch.max_bands_for_budget(1000, 1000, "float64", vram_budget=-5) == 1
    # Planning needs only the element width, as in the Python original.
    assert dispatch.max_bands_for_budget(1000, 1000, np.complex128, vram_budget=MB80) == 2
    assert dispatch.max_bands_for_budget(1000, 1000, np.float16, vram_budget=MB80) == 20
    assert dispatch.max_bands_for_budget(1000, 1000, np.dtype(">f4"), vram_budget=MB80) == 10
    assert dispatch.max_bands_for_budget(1000, 1000, bool, vram_budget=MB80) == 40


def test_available_vram_is_the_library_budget():
    budget = dispatch.available_vram_bytes()
    lib = ctypes.CDLL(_core.__file__)
    out = ctypes.c_uint64()
    assert lib.vsr_available_vram_bytes(ctypes.byref(out)) == 0
    assert 0 < budget <= 512 << 20
    assert abs(out.value - budget) <= 4 << 20  # other tests' allocations may come and go


# ---- the planner against the C ABI and the Python original's algorithm ----


class PlanOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("band_count", ctypes.c_int32),
                ("buffers_per_band", ctypes.c_int32), ("scratch_bytes", ctypes.c_uint64),
                ("halo", ctypes.c_int32), ("per_band", ctypes.c_int32),
                ("vram_budget", ctypes.c_uint64), ("has_vram_budget", ctypes.c_int32),
                ("reserved0", ctypes.c_int32)]


class CPlan(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("strategy", ctypes.c_int32),
                ("halo", ctypes.c_int32), ("has_tile_shape", ctypes.c_int32),
                ("bands_per_pass", ctypes.c_int32), ("tile_height", ctypes.c_int64),
                ("tile_width", ctypes.c_int64), ("n_tiles", ctypes.c_int64),
                ("estimated_vram_per_tile", ctypes.c_uint64), ("fits_budget", ctypes.c_int32),
                ("reserved0", ctypes.c_int32)]


DTYPE_CODES = {"uint8": 0, "int8": 1, "uint16": 2, "int16": 3, "uint32": 4, "int32": 5,
               "uint64": 6, "int64": 7, "float32": 8, "float64": 9}
STRATEGIES = {0: "whole", 1: "band_batches", 2: "tiled"}


def c_abi_plan(lib, h, w, dtype, bands, buffers, scratch, halo, budget, per_band):
    o = PlanOptions()
    assert lib.vsr_plan_options_init(ctypes.byref(o)) == 0
    o.band_count, o.buffers_per_band, o.scratch_bytes, o.halo = bands, buffers, scratch, halo
    o.per_band, o.vram_budget, o.has_vram_budget = int(per_band), budget, 1
    p = CPlan()
    p.struct_size = ctypes.sizeof(CPlan)
    assert lib.vsr_analyze_raster_plan(ctypes.c_int64(h), ctypes.c_int64(w), DTYPE_CODES[dtype],
                                       ctypes.byref(o), ctypes.byref(p)) == 0
    return RasterPlan(TilingStrategy(STRATEGIES[p.strategy]),
                      (p.tile_height, p.tile_width) if p.has_tile_shape else None, p.halo,
                      p.n_tiles, p.estimated_vram_per_tile, p.bands_per_pass, bool(p.fits_budget))


def original_plan(h, w, itemsize, bands, buffers, scratch, halo, budget):
    """analyze_raster_plan of the Python original, as the reference describes it (sec. 1.4)."""
    full = h * w * itemsize * buffers * bands
    if budget <= 0:
        return ("whole", None, 0, 0)
    usable = int(budget * 0.7)
    if full + scratch <= usable:
        return ("whole", None, 0, full + scratch)

    def align(x):
        return max(256, x // 256 * 256)

    th, tw = align(min(4096, h)), align(min(4096, w))
    while True:
        tile_bytes = (th + 2 * halo) * (tw + 2 * halo) * itemsize * buffers * bands + scratch
        if tile_bytes <= usable or (th == 256 and tw == 256):
            break
        if th >= tw:
            th = align(th // 2)
        else:
            tw = align(tw // 2)
    return ("tiled", (th, tw), math.ceil(h / th) * math.ceil(w / tw), tile_bytes)


GRID = list(itertools.product(
    [1, 300, 4097, 10_000, 70_000],  # height
    [1, 257, 4096, 20_000],  # width
    ["uint8", "int16", "float32", "float64"],
    [1, 3, 16],  # bands
    [1, 2, 3],  # buffers per band
    [0, 30_000_000],  # scratch
    [0, 1, 32],  # halo
    [0, 1, MB80, 1 << 30, 48 << 30],  # budget
))


@pytest.mark.parametrize("per_band", [False, True])
def test_planner_equals_the_c_abi_on_a_grid(per_band):
    lib = ctypes.CDLL(_core.__file__)
    mismatches = []
    for h, w, dtype, bands, buffers, scratch, halo, budget in GRID:
        ours = dispatch.analyze_raster_plan(h, w, dtype, band_count=bands,
                                            buffers_per_band=buffers, scratch_bytes=scratch,
                                            halo=halo, vram_budget=budget, per_band=per_band)
        theirs = c_abi_plan(lib, h, w, dtype, bands, buffers, scratch, halo, budget, per_band)
        if ours != theirs:
            mismatches.append((h, w, dtype, bands, buffers, scratch, halo, budget, ours, theirs))
    assert not mismatches, mismatches[:5]


def test_planner_reproduces_the_python_original_on_a_grid():
    mismatches = []
    strategies = set()
    for h, w, dtype, bands, buffers, scratch, halo, budget in GRID:
        plan = dispatch.analyze_raster_plan(h, w, dtype, band_count=bands,
                                            buffers_per_band=buffers, scratch_bytes=scratch,
                                            halo=halo, vram_budget=budget)
        got = (str(plan.strategy), plan.tile_shape, plan.n_tiles, plan.estimated_vram_per_tile)
        want = original_plan(h, w, np.dtype(dtype).itemsize, bands, buffers, scratch, halo,
                             budget)
        strategies.add(got[0])
        if got != want:
            mismatches.append(((h, w, dtype, bands, buffers, scratch, halo, budget), got, want))
        usable = int(budget * 0.7)
        assert plan.fits_budget == (budget == 0 or plan.estimated_vram_per_tile <= usable)
    assert not mismatches, mismatches[:5]
    assert strategies == {"whole", "tiled"}


def test_plan_types_and_the_band_batches_addition():
    plan = dispatch.analyze_raster_plan(1000, 1000, np.float32, band_count=12, vram_budget=MB80,
                                        per_band=True)
    assert plan.strategy is TilingStrategy.BAND_BATCHES and plan.strategy == "band_batches"
    assert plan.bands_per_pass == 7 and plan.tile_shape is None and plan.fits_budget
    whole = dispatch.analyze_raster_plan(100, 100, "uint8", vram_budget=MB80)
    assert whole == RasterPlan(TilingStrategy.WHOLE, None, 0, 0, 20_000, 1, True)
    with pytest.raises(Exception):
        whole.halo = 3  # frozen
    tiled = dispatch.analyze_raster_plan(30_000, 30_000, "float32", halo=2, vram_budget=MB80)
    assert tiled.strategy == "tiled" and isinstance(tiled.tile_shape, tuple)
    assert tiled.halo == 2


def test_plan_from_metadata_uses_the_header():
    meta = RasterMetadata(20_000, 20_000, 4, np.dtype("uint16"), None, (1, 0, 0, 0, -1, 0), None)
    assert dispatch.plan_from_metadata(meta, halo=3, vram_budget=MB80) == \
        dispatch.analyze_raster_plan(20_000, 20_000, "uint16", band_count=4, halo=3,
                                     vram_budget=MB80)
    with pytest.raises(TypeError):
        dispatch.plan_from_metadata((20_000, 20_000))


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        (dict(height=0), ValueError),
        (dict(width=-3), ValueError),
        (dict(height="10"), TypeError),
        (dict(height=10.5), TypeError),
        (dict(dtype=object), TypeError),
        (dict(dtype="not-a-dtype"), TypeError),
        (dict(band_count=0), ValueError),
        (dict(buffers_per_band=0), ValueError),
        (dict(halo=-1), ValueError),
        (dict(scratch_bytes=-1), ValueError),
        (dict(height=1 << 40, width=1 << 40, dtype="float64"), OverflowError),
    ],
)
def test_planner_bad_input(kwargs, error):
    args = dict(height=100, width=100, dtype="float32")
    args.update(kwargs)
    h, w, d = args.pop("height"), args.pop("width"), args.pop("dtype")
    with pytest.raises(error):
        dispatch.analyze_raster_plan(h, w, d, vram_budget=MB80, **args)


def test_negative_budget_means_no_gpu_as_in_the_original():
    plan = dispatch.analyze_raster_plan(50_000, 50_000, "float32", vram_budget=-1)
    assert plan.strategy == "whole" and plan.estimated_vram_per_tile == 0


# ---- per-band dispatch with Python callables ----


def make_raster(bands=3, h=64, w=48, dtype=np.float32, nodata=-9999.0, crs="EPSG:32633"):
    data = (np.arange(bands * h * w, dtype=np.float64).reshape(bands, h, w) % 251).astype(dtype)
    return OwnedRasterArray.from_numpy(data, nodata=nodata, affine=(10, 0, 500_000, 0, -10, 4e6),
                                       crs=crs)


def double(band):
    return OwnedRasterArray.from_numpy(band.to_numpy() * 2, nodata=band.nodata,
                                       affine=band.affine)


class Scale:
    def __init__(self, k):
        self.k = k
        self.seen = []

    def __call__(self, band):
        self.seen.append(band.shape)
        return OwnedRasterArray.from_numpy(band.to_numpy() * self.k, nodata=band.nodata)


def offset(band, *, by):
    return OwnedRasterArray.from_numpy(band.to_numpy() + by, nodata=band.nodata)


@pytest.mark.parametrize("dispatcher", [dispatch.dispatch_per_band_cpu,
                                        dispatch.dispatch_per_band_gpu])
@pytest.mark.parametrize("make_op", [lambda: double, lambda: Scale(2),
                                     lambda: functools.partial(offset, by=0),
                                     lambda: (lambda b: double(b))])
def test_per_band_dispatch_runs_python_callables(dispatcher, make_op, pool_baseline):
    raster = make_raster()
    crs = object.__new__(type("FakeCRS", (), {"to_wkt": lambda self: "EPSG:32633"}))
    raster = raster.with_georeferencing(crs=crs)
    op = make_op()
    out = dispatcher(raster, op)
    src = raster.to_numpy()
    want = src * 2 if op is not None and not isinstance(op, functools.partial) else src
    assert np.array_equal(out.to_numpy(), want)
    assert out.shape == (3, 64, 48) and out.dtype == np.float32
    assert out.nodata == -9999.0 and out.affine == raster.affine and out.crs is crs
    if isinstance(op, Scale):
        assert sorted(op.seen) == [(64, 48)] * 3  # each band as a 2D single-band raster
    expected_residency = Residency.DEVICE if dispatcher is dispatch.dispatch_per_band_gpu \
        else Residency.HOST
    assert out.residency is expected_residency


def test_single_band_is_passed_through_as_in_the_original():
    raster = make_raster(bands=1)
    sentinel = make_raster(bands=1, h=2, w=2)
    for dispatcher in (dispatch.dispatch_per_band_cpu, dispatch.dispatch_per_band_gpu):
        calls = []
        assert dispatcher(raster, lambda r: calls.append(r) or sentinel) is sentinel
        assert calls == [raster]


def test_gpu_dispatch_hands_over_device_views_and_takes_device_results(pool_baseline):
    raster = make_raster(bands=4)
    seen = []

    def on_device(band):
        seen.append((band.residency, band.shape))
        view = band.device_array()  # zero-copy view of the band on the device
        result = OwnedRasterArray.from_device(view, nodata=band.nodata)
        assert result.residency is Residency.DEVICE
        return result

    out = dispatch.dispatch_per_band_gpu(raster, on_device)
    assert seen == [(Residency.DEVICE, (64, 48))] * 4
    assert np.array_equal(out.to_numpy(), raster.to_numpy())
    assert out.residency is Residency.DEVICE and raster.residency is Residency.HOST


def test_gpu_dispatch_batches_bands_within_a_small_device():
    run_python(
        """
        import numpy as np
        from vibespatial_raster import dispatch, memory
        from vibespatial_raster.buffers import OwnedRasterArray
        budget = dispatch.available_vram_bytes()
        data = np.random.default_rng(1).random((12, 1024, 1024), dtype=np.float32)
        raster = OwnedRasterArray.from_numpy(data)
        plan = dispatch.analyze_raster_plan(1024, 1024, "float32", band_count=12,
                                            vram_budget=budget, per_band=True)
        assert plan.strategy == "band_batches" and plan.bands_per_pass < 12, plan
        calls = []
        def inc(band):
            calls.append(1)
            return OwnedRasterArray.from_numpy(band.to_numpy() + 1)
        out = dispatch.dispatch_per_band_gpu(raster, inc)
        assert len(calls) == 12
        assert np.array_equal(out.to_numpy(), data + 1)
        assert memory.memory_pool_stats()["peak_bytes"] <= budget
        """,
        {"VSR_EMU_DEVICE_MEMORY": str(64 << 20)},
    )


def test_exceptions_in_the_op_reach_the_caller():
    raster = make_raster()

    def fails(band):
        raise KeyError("band op failed")

    for dispatcher in (dispatch.dispatch_per_band_cpu, dispatch.dispatch_per_band_gpu):
        with pytest.raises(KeyError, match="band op failed"):
            dispatcher(raster, fails)


def test_bad_ops_and_results():
    raster = make_raster()
    for dispatcher in (dispatch.dispatch_per_band_cpu, dispatch.dispatch_per_band_gpu):
        with pytest.raises(TypeError, match="OwnedRasterArray"):
            dispatcher(raster, lambda b: b.to_numpy())
        with pytest.raises(TypeError, match="callable"):
            dispatcher(raster, "not callable")
        with pytest.raises(TypeError):
            dispatcher(raster.to_numpy(), double)
    counter = iter(range(10))

    def changing_dtype(band):
        d = np.float32 if next(counter) == 0 else np.float64
        return OwnedRasterArray.from_numpy(band.to_numpy().astype(d), nodata=band.nodata)

    with pytest.raises(ValueError):
        dispatch.dispatch_per_band_gpu(raster, changing_dtype)


def test_tiled_halo_dispatch_equals_the_whole_result():
    raster = make_raster(bands=2, h=600, w=700, nodata=None)
    plan = dispatch.analyze_raster_plan(600, 700, "float32", band_count=2, halo=1,
                                        vram_budget=4_000_000)
    assert plan.strategy == "tiled" and plan.n_tiles > 1
    whole = ops.focal_mean_3x3(raster)
    tiles = []

    def focal(tile):
        tiles.append(tile.affine)
        return ops.focal_mean_3x3(tile)

    tiled = tiling.dispatch_tiled_halo(raster, focal, plan)
    assert len(tiles) == plan.n_tiles
    assert np.array_equal(tiled.to_numpy(), whole.to_numpy())
    plain = tiling.dispatch_tiled(raster, lambda t: ops.clip(t, 10, 20), plan)
    assert np.array_equal(plain.to_numpy(), np.clip(raster.to_numpy(), 10, 20))
    with pytest.raises(TypeError):
        tiling.dispatch_tiled(raster, focal, "tiled")
    raster.move_to("device")
    with pytest.raises(ValueError):
        tiling.dispatch_tiled(raster, focal, plan)


def test_usable_budget_is_seventy_percent_as_in_the_original():
    assert dispatch.usable_vram_budget(MB80) == int(MB80 * 0.7) == 56_000_000
    assert dispatch.usable_vram_budget(0) == 0 and dispatch.usable_vram_budget(-3) == 0
    assert dispatch.usable_vram_budget(10) == 7
    with pytest.raises(TypeError):
        dispatch.usable_vram_budget(1.5)
