# SPDX-License-Identifier: Apache-2.0
"""Tiled executors: the Python original's ``dispatch_tiled`` and ``dispatch_tiled_halo``.

Both take a :class:`~vibespatial_raster.buffers.RasterPlan` (from
:func:`~vibespatial_raster.dispatch.analyze_raster_plan`). A WHOLE plan calls ``op_fn`` once on
the whole raster; a TILED plan requires a host-resident raster (a full device-to-host copy would
defeat tiling), hands ``op_fn`` each tile as a new host raster whose affine is shifted to the
tile's origin, and stitches the results in a host raster allocated from the first tile's result
(so ``op_fn`` may change the dtype). Serial, on the calling thread; the loop runs in the C++
library.
"""

from __future__ import annotations

from typing import Any

from . import _core
from .buffers import OwnedRasterArray, RasterPlan
from .dispatch import BandOp, _adapter, _check_raster

__all__ = ["dispatch_tiled", "dispatch_tiled_halo"]


def _run(raster: OwnedRasterArray, op_fn: BandOp, plan: RasterPlan, with_halo: bool) -> Any:
    _check_raster(raster)
    if not isinstance(plan, RasterPlan):
        raise TypeError(f"plan must be a RasterPlan, not {type(plan).__name__}")
    native = _core.dispatch_tiled(raster._as_native(),
                                  _adapter(op_fn, crs=raster._crs_obj, two_d=False),
                                  *plan._core_args(), with_halo)
    return OwnedRasterArray._wrap(native, crs=raster._crs_obj, two_d=raster._two_d)


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
