# SPDX-License-Identifier: Apache-2.0
"""The Python original's other tiled executors on the one tile executor:
dispatch_tiled_binary, dispatch_tiled_accumulator and dispatch_tiled_multipass equal the
whole-raster computation for every dtype at several budgets, and a broken merge (or a
tile-dependent op) is caught by the same comparison; bad input gets typed errors."""

from __future__ import annotations

import numpy as np
import pytest

from vibespatial_raster import dispatch, ops, tiling
from vibespatial_raster.buffers import (OwnedRasterArray, RasterDiagnosticKind, RasterPlan,
                                        TilingStrategy, from_numpy)

try:
    from scipy import ndimage
except ImportError:  # pragma: no cover - scipy is in requirements-test.txt
    ndimage = None

DTYPES = ["uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64", "float32",
          "float64"]
AFFINE = (10.0, 0.0, 500.0, 0.0, -10.0, 900.0)
H, W = 600, 520


def plans(dtype: str, bands: int, halo: int = 0) -> list[RasterPlan]:
    """Plans at several budgets (0, no GPU: WHOLE; 4/5 and a tenth of what the whole raster
    needs: 256 x 512 and 256 x 256 tiles) and two hand-made tilings with ragged edge tiles."""
    whole_bytes = H * W * np.dtype(dtype).itemsize * 2 * bands
    out = [dispatch.analyze_raster_plan(H, W, dtype, band_count=bands, halo=halo, vram_budget=b)
           for b in (0, whole_bytes * 4 // 5, whole_bytes // 10)]
    for shape in ((97, 130), (256, 520)):
        rows, cols = -(-H // shape[0]), -(-W // shape[1])
        out.append(RasterPlan(TilingStrategy.TILED, shape, halo, rows * cols, 0, bands))
    assert out[0].strategy == "whole"
    assert all(p.strategy == "tiled" and p.n_tiles > 1 for p in out[1:]), out
    assert out[1].tile_shape != out[2].tile_shape, out
    return out


def sample(dtype: str, bands: int, seed: int, *, low: int = 0, high: int = 100) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(low, high, size=(bands, H, W)).astype(dtype)


# ---- binary ----------------------------------------------------------------------------------


def absdiff(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a - b| without overflow in any dtype."""
    return np.where(a > b, a - b, b - a)


def binary_op(ta: OwnedRasterArray, tb: OwnedRasterArray) -> OwnedRasterArray:
    return from_numpy(absdiff(ta.to_numpy(), tb.to_numpy()), nodata=ta.nodata, affine=ta.affine)


def whole_indexing_op(b_whole: np.ndarray):
    """Broken on purpose: reads b at the tile's local coordinates of the whole raster (right
    for a whole plan, wrong for every tile but the first)."""

    def op(ta: OwnedRasterArray, tb: OwnedRasterArray) -> OwnedRasterArray:
        h, w = ta.height, ta.width
        d = absdiff(ta.to_numpy(), b_whole[..., :h, :w])
        return from_numpy(d, nodata=ta.nodata, affine=ta.affine)

    return op


@pytest.mark.parametrize("dtype", DTYPES)
def test_binary_equals_the_elementwise_op_on_the_whole_pair(dtype):
    a_data, b_data = sample(dtype, 2, 1), sample(dtype, 2, 2)
    a = from_numpy(a_data, nodata=7, affine=AFFINE, crs="EPSG:3857")
    b = from_numpy(b_data, nodata=9, affine=AFFINE)
    want = absdiff(a_data, b_data)
    for plan in plans(dtype, 2):
        out = tiling.dispatch_tiled_binary(a, b, binary_op, plan)
        assert out.dtype == np.dtype(dtype)
        if plan.strategy == "whole":  # the broken op is right on the whole raster
            np.testing.assert_array_equal(
                tiling.dispatch_tiled_binary(a, b, whole_indexing_op(b_data), plan).to_numpy(),
                want)
        np.testing.assert_array_equal(out.to_numpy(), want, err_msg=str(plan))
        assert out.affine == AFFINE and out.nodata == 7
        if plan.strategy == "tiled":
            assert out.crs == "EPSG:3857"
            broken = tiling.dispatch_tiled_binary(a, b, whole_indexing_op(b_data), plan)
            assert not np.array_equal(broken.to_numpy(), want), plan


def test_binary_tiles_are_the_same_window_of_both_with_their_own_nodata():
    a = from_numpy(np.zeros((H, W), np.float32), nodata=-1.0, affine=AFFINE)
    b = from_numpy(np.ones((H, W), np.float32), nodata=-2.0, affine=AFFINE)
    seen = []

    def op(ta, tb):
        assert ta.shape == tb.shape and ta.affine == tb.affine
        assert (ta.nodata, tb.nodata) == (-1.0, -2.0)
        seen.append(ta.affine)
        return from_numpy(ta.to_numpy() + tb.to_numpy(), nodata=ta.nodata, affine=ta.affine)

    plan = RasterPlan(TilingStrategy.TILED, (256, 256), 0, 9, 0)
    out = tiling.dispatch_tiled_binary(a, b, op, plan)
    assert out.shape == (H, W)
    np.testing.assert_array_equal(out.to_numpy(), 1.0)
    assert len(seen) == 9 and seen[1] == (10.0, 0.0, 500.0 + 2560.0, 0.0, -10.0, 900.0)


def test_binary_refuses_rasters_of_different_grids_naming_both():
    a = from_numpy(np.zeros((10, 12), np.float32))
    b = from_numpy(np.zeros((10, 11), np.float32))
    plan = RasterPlan(TilingStrategy.WHOLE, None, 0, 0, 0)
    with pytest.raises(ValueError, match=r"a is 10 x 12 .* b 10 x 11"):
        tiling.dispatch_tiled_binary(a, b, binary_op, plan)


def test_binary_refuses_a_result_that_changes_dtype_between_tiles():
    a = from_numpy(np.zeros((H, W), np.float32))
    calls = []

    def op(ta, tb):
        calls.append(1)
        dtype = np.float32 if len(calls) == 1 else np.float64
        return from_numpy(ta.to_numpy().astype(dtype))

    plan = RasterPlan(TilingStrategy.TILED, (256, 256), 0, 9, 0)
    with pytest.raises(ValueError, match="tile 1"):
        tiling.dispatch_tiled_binary(a, a, op, plan)


def test_binary_records_a_runtime_event():
    a = from_numpy(np.zeros((H, W), np.uint8))
    plan = RasterPlan(TilingStrategy.TILED, (256, 256), 0, 9, 0)
    out = tiling.dispatch_tiled_binary(a, a, binary_op, plan)
    last = [e for e in out.diagnostics if e.kind == RasterDiagnosticKind.RUNTIME][-1]
    assert last.detail.startswith("dispatch_tiled_binary tiles=9 tile_shape=(256,256)")


# ---- accumulator -----------------------------------------------------------------------------


def hist_of(t: OwnedRasterArray) -> np.ndarray:
    return ops.histogram(t, 16, 0.0, 100.0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_accumulated_histogram_equals_the_whole_rasters(dtype):
    data = sample(dtype, 3, 5)
    data[:, ::7, ::5] = 42  # nodata pixels, which neither count
    r = from_numpy(data, nodata=42, affine=AFFINE)
    want = ops.histogram(r, 16, 0.0, 100.0)
    for plan in plans(dtype, 3, halo=3):  # the halo is ignored: no pixel counted twice
        got = tiling.dispatch_tiled_accumulator(r, hist_of, lambda acc, p: acc + p, plan)
        np.testing.assert_array_equal(got, want, err_msg=str(plan))
        if plan.strategy == "tiled":
            last_only = tiling.dispatch_tiled_accumulator(r, hist_of, lambda acc, p: p, plan)
            assert not np.array_equal(last_only, want), plan


def test_accumulator_folds_left_in_tile_order():
    r = from_numpy(np.arange(H * W, dtype=np.int64).reshape(H, W))
    plan = RasterPlan(TilingStrategy.TILED, (256, 256), 0, 9, 0)
    order = tiling.dispatch_tiled_accumulator(r, lambda t: [int(t.to_numpy().flat[0])],
                                              lambda acc, p: acc + p, plan)
    firsts = [row * W + col for row in (0, 256, 512) for col in (0, 256, 512)]
    assert order == firsts


def test_accumulator_refuses_a_merge_that_changes_the_partials_shape_or_dtype():
    r = from_numpy(np.zeros((H, W), np.float32))
    plan = RasterPlan(TilingStrategy.TILED, (256, 256), 0, 9, 0)
    with pytest.raises(ValueError, match=r"shape \(2, 1, 16\).*partials of shape \(1, 16\)"):
        tiling.dispatch_tiled_accumulator(r, hist_of, lambda acc, p: np.stack([acc, p]), plan)
    with pytest.raises(ValueError, match="dtype float64 for partials of shape .* dtype int64"):
        tiling.dispatch_tiled_accumulator(r, hist_of, lambda acc, p: (acc + p) / 2.0, plan)


def test_accumulator_whole_plan_is_one_tile_and_device_input_is_refused_when_tiled():
    r = from_numpy(np.ones((4, 5), np.uint8))
    whole = RasterPlan(TilingStrategy.WHOLE, None, 0, 0, 0)
    assert tiling.dispatch_tiled_accumulator(r, lambda t: t.pixel_count, max, whole) == 20
    d = from_numpy(np.ones((4, 5), np.uint8), residency="device")
    tiled = RasterPlan(TilingStrategy.TILED, (2, 2), 0, 6, 0)
    with pytest.raises(ValueError, match="host-resident"):
        tiling.dispatch_tiled_accumulator(d, lambda t: 1, lambda a, b: a + b, tiled)


# ---- multipass: connected-component labels ----------------------------------------------------


def local_labels(tile: OwnedRasterArray) -> OwnedRasterArray:
    """Labels of one tile (4-connectivity), unique over the raster: each component is named by
    the raster-wide linear index (+ 1) of its first pixel (the tile's origin comes from its
    affine, the identity here)."""
    fg = tile.to_numpy() != 0
    labels = scan_labels(fg)
    col, row = int(tile.affine[2]), int(-tile.affine[5])
    h, w = fg.shape
    gidx = (np.arange(h)[:, None] + row) * W + (np.arange(w)[None, :] + col) + 1
    first = np.full(int(labels.max()) + 1, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, labels.ravel(), gidx.ravel())
    return from_numpy(np.where(labels > 0, first[labels], 0).astype(np.int64), affine=tile.affine)


def scan_labels(fg: np.ndarray) -> np.ndarray:
    """4-connected labels of a 2D mask: scipy's, else a two-pass union-find (for a test run
    without scipy)."""
    if ndimage is not None:
        return ndimage.label(fg)[0]
    h, w = fg.shape
    parent = np.arange(h * w + 1)

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    idx = np.arange(h * w).reshape(h, w) + 1
    for r in range(h):
        for c in range(w):
            if not fg[r, c]:
                continue
            if r and fg[r - 1, c]:
                parent[find(idx[r, c])] = find(idx[r - 1, c])
            if c and fg[r, c - 1]:
                ra, rb = find(idx[r, c]), find(idx[r, c - 1])
                parent[ra] = rb
    roots = np.array([find(i) for i in idx.ravel()]).reshape(h, w)
    return np.where(fg, roots, 0)


def canonical(labels: np.ndarray) -> np.ndarray:
    """Labels renumbered 1, 2, ... in the order of their first pixel (0 stays background)."""
    flat = labels.ravel()
    values, first, inverse = np.unique(flat, return_index=True, return_inverse=True)
    rank = np.empty(len(values), dtype=np.int64)
    rank[np.argsort(first)] = np.arange(len(values))
    background = rank[values == 0]
    out = rank[inverse] + 1
    if len(background):
        out = np.where(flat == 0, 0, out - (rank[inverse] > background[0]))
    return out.reshape(labels.shape)


def seam_merge(inter: OwnedRasterArray,
               bounds: list[tuple[int, int, int, int]]) -> OwnedRasterArray:
    """Joins labels that touch across tile seams (union-find over the seam pixel pairs)."""
    lab = inter.to_numpy().reshape(H, W).copy()
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for rs, re, cs, ce in bounds:
        pairs = []
        if re < H:
            pairs.append((lab[re - 1, cs:ce], lab[re, cs:ce]))
        if ce < W:
            pairs.append((lab[rs:re, ce - 1], lab[rs:re, ce]))
        for x, y in pairs:
            both = (x != 0) & (y != 0)
            for u, v in zip(x[both].tolist(), y[both].tolist()):
                parent[find(u)] = find(v)
    values, inverse = np.unique(lab, return_inverse=True)
    roots = np.array([find(int(v)) if v else 0 for v in values], dtype=np.int64)
    lab = roots[inverse].reshape(lab.shape)
    return from_numpy(lab, affine=inter.affine)


def no_merge(inter, bounds):
    """Broken on purpose: keeps the per-tile labels (components cut at the seams)."""
    return inter


def blobs(dtype: str, seed: int) -> np.ndarray:
    """Foreground blobs (about half the pixels), long enough to cross tile seams."""
    rng = np.random.default_rng(seed)
    noise = rng.random((H, W)) < 0.55
    return noise.astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_multipass_labels_equal_whole_raster_labels(dtype):
    data = blobs(dtype, 11)
    r = from_numpy(data)
    want = canonical(scan_labels(data != 0))
    for plan in plans(dtype, 1):
        out = tiling.dispatch_tiled_multipass(r, local_labels, seam_merge, plan)
        assert out.dtype == np.int64 and out.shape == (H, W)
        np.testing.assert_array_equal(canonical(out.to_numpy()), want, err_msg=str(plan))
        if plan.strategy == "tiled":
            broken = tiling.dispatch_tiled_multipass(r, local_labels, no_merge, plan)
            assert not np.array_equal(canonical(broken.to_numpy()), want), plan


def test_multipass_gives_the_merge_every_tiles_bounds():
    r = from_numpy(np.zeros((10, 7), np.uint8))
    seen = []

    def merge(inter, bounds):
        seen.extend(bounds)
        assert inter.residency == "host" and inter.shape == (10, 7)
        return inter

    plan = RasterPlan(TilingStrategy.TILED, (4, 5), 1, 6, 0)
    tiling.dispatch_tiled_multipass(r, lambda t: t, merge, plan)
    assert seen == [(0, 4, 0, 5), (0, 4, 5, 7), (4, 8, 0, 5), (4, 8, 5, 7), (8, 10, 0, 5),
                    (8, 10, 5, 7)]
    seen.clear()
    tiling.dispatch_tiled_multipass(r, lambda t: t, merge, RasterPlan("whole", None, 0, 0, 0))
    assert seen == [(0, 10, 0, 7)]


def test_multipass_refuses_a_merge_that_changes_dtype_or_shape():
    r = from_numpy(np.zeros((10, 7), np.uint8))
    plan = RasterPlan(TilingStrategy.TILED, (4, 5), 0, 6, 0)
    with pytest.raises(ValueError, match=r"merge_fn returned .*int32.* for an intermediate of"):
        tiling.dispatch_tiled_multipass(
            r, lambda t: t, lambda i, b: from_numpy(i.to_numpy().astype(np.int32)), plan)
    with pytest.raises(ValueError, match="must keep the intermediate's dtype and shape"):
        tiling.dispatch_tiled_multipass(
            r, lambda t: t, lambda i, b: from_numpy(np.zeros((10, 6), np.uint8)), plan)
    with pytest.raises(TypeError, match="merge_fn must return an OwnedRasterArray"):
        tiling.dispatch_tiled_multipass(r, lambda t: t, lambda i, b: i.to_numpy(), plan)
