# SPDX-License-Identifier: Apache-2.0
"""Tiled executors: the Python original's ``dispatch_tiled``, ``dispatch_tiled_halo``,
``dispatch_tiled_binary``, ``dispatch_tiled_accumulator`` and ``dispatch_tiled_multipass``.

All take a :class:`~vibespatial_raster.buffers.RasterPlan` (from
:func:`~vibespatial_raster.dispatch.analyze_raster_plan`). A WHOLE plan calls ``op_fn`` once on
the whole raster; a TILED plan requires a host-resident raster (a full device-to-host copy would
defeat tiling), hands ``op_fn`` each tile as a new host raster whose affine is shifted to the
tile's origin, and stitches the results in a host raster allocated from the first tile's result
(so ``op_fn`` may change the dtype). Serial, on the calling thread; the loop runs in the C++
library's one tile executor, one tile live at a time, so a run holds the plan's tile (plus the
output, and for the multipass executor its full-size host intermediate).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from . import _core
from .buffers import OwnedRasterArray, RasterPlan
from .dispatch import BandOp, _adapter, _check_raster

__all__ = [
    "dispatch_tiled",
    "dispatch_tiled_accumulator",
    "dispatch_tiled_binary",
    "dispatch_tiled_halo",
    "dispatch_tiled_multipass",
]

BinaryOp = Callable[[OwnedRasterArray, OwnedRasterArray], OwnedRasterArray]
TileBounds = tuple[int, int, int, int]
MultipassMerge = Callable[[OwnedRasterArray, list[TileBounds]], OwnedRasterArray]


def _run(raster: OwnedRasterArray, op_fn: BandOp, plan: RasterPlan, with_halo: bool) -> Any:
    _check_raster(raster)
    if not isinstance(plan, RasterPlan):
        raise TypeError(f"plan must be a RasterPlan, not {type(plan).__name__}")
    start = time.perf_counter()
    native = _core.dispatch_tiled(raster._as_native(),
                                  _adapter(op_fn, crs=raster._crs_obj, two_d=False),
                                  *plan._core_args(), with_halo)
    out = OwnedRasterArray._wrap(native, crs=raster._crs_obj, two_d=raster._two_d)
    return _record_run(out, "dispatch_tiled_halo" if with_halo else "dispatch_tiled", raster,
                       plan, start)


def dispatch_tiled(raster: OwnedRasterArray, op_fn: BandOp, plan: RasterPlan) -> OwnedRasterArray:
    """Run a pointwise ``op_fn`` over the non-overlapping tiles of ``plan`` and stitch the
    results (tiles carry every band; edge tiles are smaller).

    Raises:
        ValueError: a TILED plan over a device-resident raster, a BAND_BATCHES plan, a tiled
        plan without a tile shape, a result of the wrong shape or of a dtype or band count
        differing from the first tile's; TypeError: bad argument types; whatever ``op_fn``
        raises.
    """
    return _run(raster, op_fn, plan, False)


def dispatch_tiled_halo(raster: OwnedRasterArray, op_fn: BandOp,
                        plan: RasterPlan) -> OwnedRasterArray:
    """As :func:`dispatch_tiled`, but each tile is read with ``plan.halo`` extra pixels per side
    (clamped at the raster's edges, no padding); ``op_fn`` returns its input's shape and the
    interior is kept. With ``plan.halo`` >= the op's radius the result equals the whole-raster
    result."""
    return _run(raster, op_fn, plan, True)


def _check_plan(plan: Any) -> None:
    if not isinstance(plan, RasterPlan):
        raise TypeError(f"plan must be a RasterPlan, not {type(plan).__name__}")


def _check_callable(name: str, fn: Any) -> None:
    if not callable(fn):
        raise TypeError(f"{name} must be callable, not {type(fn).__name__}")


def _native_result(who: str, result: Any) -> Any:
    if not isinstance(result, OwnedRasterArray):
        raise TypeError(f"{who} must return an OwnedRasterArray, not {type(result).__name__}")
    return result._as_native()


def _record_run(out: OwnedRasterArray, who: str, raster: OwnedRasterArray, plan: RasterPlan,
                start: float) -> OwnedRasterArray:
    elapsed = time.perf_counter() - start
    if plan.tile_shape is None or plan.strategy == "whole":
        path = "whole"
    else:
        path = (f"tiles={plan.n_tiles} tile_shape=({plan.tile_shape[0]},{plan.tile_shape[1]}) "
                f"halo={plan.halo}")
    out._record("runtime", f"{who} {path} raster_shape={raster.shape} elapsed={elapsed:.4f}s",
                elapsed)
    return out


def dispatch_tiled_binary(a: OwnedRasterArray, b: OwnedRasterArray, op_fn: BinaryOp,
                          plan: RasterPlan) -> OwnedRasterArray:
    """Run a binary ``op_fn(tile_a, tile_b)`` over the same tiles of ``a`` and ``b`` (one grid)
    and stitch the results, as :func:`dispatch_tiled` does for one raster.

    A WHOLE plan calls ``op_fn(a, b)`` once and returns its result. A TILED plan reads each
    tile of both (every band, ``plan.halo`` pixels of context, as :func:`dispatch_tiled_halo`;
    each tile with its own raster's nodata and an affine shifted to the tile's origin); the
    first result fixes the output's dtype, bands and nodata; the output has ``a``'s affine and
    CRS. A RUNTIME event on the result names the executor and its tiles.

    Raises:
        ValueError: ``a`` and ``b`` differ in height or width (the message gives both shapes), a
        TILED plan over a device-resident raster, a BAND_BATCHES plan, a tiled plan without a
        tile shape, a result of the wrong shape or of a dtype, band count or nodata differing
        from the first tile's; TypeError: bad argument types, or ``op_fn`` returning something
        other than an OwnedRasterArray; whatever ``op_fn`` raises.
    """
    _check_raster(a)
    _check_raster(b)
    _check_plan(plan)
    _check_callable("op_fn", op_fn)
    if (a.height, a.width) != (b.height, b.width):
        raise ValueError(f"dispatch_tiled_binary: a is {a.height} x {a.width} pixels (height x "
                         f"width) and b {b.height} x {b.width}: the two rasters must share one "
                         "grid")
    start = time.perf_counter()

    def call(ta: Any, tb: Any) -> Any:
        ra = OwnedRasterArray._wrap(ta, crs=a._crs_obj, two_d=a._two_d)
        rb = OwnedRasterArray._wrap(tb, crs=b._crs_obj, two_d=b._two_d)
        return _native_result("op_fn", op_fn(ra, rb))

    if plan.strategy == "whole":
        out = op_fn(a, b)
        if not isinstance(out, OwnedRasterArray):
            raise TypeError(f"op_fn must return an OwnedRasterArray, not {type(out).__name__}")
        return _record_run(out, "dispatch_tiled_binary", a, plan, start)
    native = _core.dispatch_tiled_binary(a._as_native(), b._as_native(), call, plan._core_args())
    out = OwnedRasterArray._wrap(native, crs=a._crs_obj, two_d=a._two_d)
    return _record_run(out, "dispatch_tiled_binary", a, plan, start)


def _shape_of(value: Any) -> tuple[Any, Any] | None:
    """(shape, dtype) of an array-like partial (NumPy, CuPy, OwnedRasterArray), else None."""
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is None or dtype is None:
        return None
    return tuple(shape), str(dtype)


def dispatch_tiled_accumulator(raster: OwnedRasterArray,
                               tile_fn: Callable[[OwnedRasterArray], Any],
                               merge_fn: Callable[[Any, Any], Any], plan: RasterPlan) -> Any:
    """Map-reduce over the tiles of ``plan``: ``tile_fn(tile)`` gives each tile's partial (any
    object: a histogram's counts, zonal sums), folded left in tile order (row-major) with
    ``merge_fn(acc, partial)``, which must be associative. Returns the fold (the only partial
    for a single tile).

    The halo is ignored: tiles do not overlap, so every pixel is counted once. A WHOLE plan is
    one tile, the raster itself. Tiles are read one at a time (a TILED plan needs a
    host-resident raster), so memory holds one tile and the accumulator.

    Raises:
        ValueError: a merge whose result differs from the partials in shape or dtype (for
        array-like partials, which have ``shape`` and ``dtype``), naming both; a plan as
        :func:`dispatch_tiled` refuses; TypeError: bad argument types; whatever the functions
        raise.
    """
    _check_raster(raster)
    _check_plan(plan)
    _check_callable("tile_fn", tile_fn)
    _check_callable("merge_fn", merge_fn)

    def tile(native: Any) -> Any:
        return tile_fn(OwnedRasterArray._wrap(native, crs=raster._crs_obj, two_d=raster._two_d))

    def merge(acc: Any, part: Any) -> Any:
        merged = merge_fn(acc, part)
        want, got = _shape_of(part), _shape_of(merged)
        if want is not None and got != want:
            got_text = "an object without shape and dtype" if got is None else \
                f"shape {got[0]} dtype {got[1]}"
            raise ValueError(f"dispatch_tiled_accumulator: merge_fn returned {got_text} for "
                             f"partials of shape {want[0]} dtype {want[1]}: a merge must keep "
                             "the partials' shape and dtype (e.g. summed histograms)")
        return merged

    return _core.dispatch_tiled_accumulator(raster._as_native(), tile, merge, plan._core_args())


def dispatch_tiled_multipass(raster: OwnedRasterArray, local_fn: BandOp, merge_fn: MultipassMerge,
                             plan: RasterPlan) -> OwnedRasterArray:
    """Two passes: ``local_fn(tile)`` runs over the tiles of ``plan`` (with ``plan.halo``
    pixels of context, as :func:`dispatch_tiled_halo`) into a full-size host intermediate; then
    ``merge_fn(intermediate, tile_bounds)`` runs once, on the host, and its result is returned.

    ``tile_bounds`` lists each tile's effective window as ``(row_start, row_end, col_start,
    col_end)`` (ends exclusive, halo excluded), row-major: what a merge of connected-component
    labels across tile seams, or of distance-transform seams, needs. A WHOLE plan is one tile,
    ``local_fn(raster)``, with bounds ``[(0, height, 0, width)]``.

    Raises:
        ValueError: a merge whose result differs from the intermediate in dtype, band count,
        height or width (naming both); a local result breaking the first-result rule; a plan as
        :func:`dispatch_tiled_halo` refuses; TypeError: bad argument types, or a function
        returning something other than an OwnedRasterArray; whatever the functions raise.
    """
    _check_raster(raster)
    _check_plan(plan)
    _check_callable("local_fn", local_fn)
    _check_callable("merge_fn", merge_fn)
    start = time.perf_counter()

    def merge(native: Any, bounds: Sequence[TileBounds]) -> Any:
        inter = OwnedRasterArray._wrap(native, crs=raster._crs_obj, two_d=raster._two_d)
        tiles = [(int(b[0]), int(b[1]), int(b[2]), int(b[3])) for b in bounds]
        return _native_result("merge_fn", merge_fn(inter, tiles))

    native = _core.dispatch_tiled_multipass(
        raster._as_native(), _adapter(local_fn, crs=raster._crs_obj, two_d=raster._two_d), merge,
        plan._core_args())
    out = OwnedRasterArray._wrap(native, crs=raster._crs_obj, two_d=raster._two_d)
    return _record_run(out, "dispatch_tiled_multipass", raster, plan, start)
