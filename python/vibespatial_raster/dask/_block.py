# SPDX-License-Identifier: Apache-2.0
"""Running an op on one block: the task every chunk runs, and the first result that fixes what
every chunk's result must be."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from .. import _core
from .. import dispatch as _dispatch
from ..buffers import OwnedRasterArray, Residency
from ._placement import _resolve_device
from ._plugin import _client_or_none

BandOp = Callable[[OwnedRasterArray], OwnedRasterArray]

@dataclass(frozen=True)
class _TaskSpec:
    device: str
    each_band: bool  # op per band (map_bands) or per tile (map_tiles)
    buffers_per_band: int
    scratch_bytes: int
    nodata: float | int | None
    affine: tuple[float, ...]
    crs: str | None
    two_d: bool
    halo: int
    row_starts: tuple[int, ...]
    col_starts: tuple[int, ...]
    row_sizes: tuple[int, ...]
    col_sizes: tuple[int, ...]
    out_bands: int | None = None
    # What the first result (the op on a small block at submission) had: every chunk's result
    # must agree, or the array's declared dtype and the written file's nodata would be wrong.
    out_dtype: str | None = None
    out_nodata: float | int | None = None  # exactly, as the runtime holds it
    who: str = "map_tiles"  # the public call, first in the messages of the first-result rule


class _Expected(Protocol):
    """What a result is checked against (_TaskSpec, and map_pipeline's spec)."""

    @property
    def out_bands(self) -> int | None: ...
    @property
    def out_dtype(self) -> str | None: ...
    @property
    def out_nodata(self) -> float | int | None: ...
    @property
    def who(self) -> str: ...


_SAMPLE = "the sample block (pixels of nodata, run once at submission)"


def _checked_result(out: Any, spec: _Expected, read: tuple[int, int, int, int],
                    tile: str) -> Any:
    """The tile executor's first-result rule (``TileResultRule``) on ``out``, the result for the
    window ``read`` (col, row, width, height) named ``tile``: its shape must be the window's, and
    its dtype, band count and nodata those of the first result once ``spec`` has them. Returns the
    rule, holding what ``out`` had."""
    if not isinstance(out, OwnedRasterArray):
        raise TypeError(f"the op must return an OwnedRasterArray, not {type(out).__name__}")
    rule = _core.TileResultRule(spec.who)
    if spec.out_bands is not None:
        rule.expect_band_count(spec.out_bands)
    if spec.out_dtype is not None:
        rule.expect_dtype(spec.out_dtype)
        rule.expect_nodata(spec.out_nodata)
    rule.check(out._as_native(), read, tile)
    return rule


def _execute(block: np.ndarray, op: BandOp, spec: _TaskSpec, row0: int, col0: int) -> Any:
    """Runs ``op`` on one block (bands, h, w) whose top-left pixel is (row0, col0) of the
    raster; returns the op's result raster (on the host or the device)."""
    device = _resolve_device(spec.device)
    raster = OwnedRasterArray.from_numpy(np.ascontiguousarray(block), nodata=spec.nodata,
                                         affine=_core.affine_shifted(spec.affine, col0, row0),
                                         crs=spec.crs)
    if spec.each_band:
        if raster.band_count == 1:
            # As the dispatchers stack several bands: with the source's georeferencing.
            if device == "gpu":
                raster.move_to(Residency.DEVICE)
            band = op(raster.band(0))
            if not isinstance(band, OwnedRasterArray):
                raise TypeError(f"the op must return an OwnedRasterArray, not "
                                f"{type(band).__name__}")
            out = OwnedRasterArray.from_band_stack([band], source=raster)
        elif device == "gpu":
            out = _dispatch.dispatch_per_band_gpu(raster, op,
                                                  buffers_per_band=spec.buffers_per_band,
                                                  scratch_bytes=spec.scratch_bytes)
        else:
            out = _dispatch.dispatch_per_band_cpu(raster, op)
    else:
        if device == "gpu":
            raster.move_to(Residency.DEVICE)
        out = op(raster)
    del raster
    return out


def _run_block(block: np.ndarray, op: BandOp, spec: _TaskSpec,
               block_info: dict | None = None) -> np.ndarray:
    """The task: ``block`` (with its halo on the sides that have neighbours) through ``op``."""
    assert block_info is not None
    loc = block_info[0]["chunk-location"]
    i, j = loc[-2], loc[-1]
    h = spec.halo
    row0 = spec.row_starts[i] - (h if i > 0 else 0)
    col0 = spec.col_starts[j] - (h if j > 0 else 0)
    expect = (spec.row_sizes[i] + (h if i > 0 else 0) + (h if i < len(spec.row_sizes) - 1 else 0),
              spec.col_sizes[j] + (h if j > 0 else 0) + (h if j < len(spec.col_sizes) - 1 else 0))
    if tuple(block.shape[-2:]) != expect:
        raise RuntimeError(f"block {loc} is {block.shape[-2:]} with its halo, expected {expect}: "
                           "Dask rechunked the overlap")
    block3 = block[np.newaxis] if spec.two_d else block
    out = _execute(block3, op, spec, row0, col0)
    _checked_result(out, spec, (col0, row0, int(block.shape[-1]), int(block.shape[-2])),
                    f"chunk {tuple(loc)} (pixels from row {row0}, column {col0})")
    data = np.asarray(out.to_numpy()).reshape(out.band_count, out.height, out.width)
    return data[0] if spec.two_d else data


@dataclass(frozen=True)
class _ResultInfo:
    dtype: np.dtype
    bands: int
    nodata: float | int | None  # as OwnedRasterArray.nodata shows it
    exact_nodata: float | int | None  # as the runtime holds it (the rule's)


def _sample_fill(nodata: Any, dtype: np.dtype) -> Any:
    """The small block's pixels: the nodata where ``dtype`` holds it exactly, else 0 (NaN, or
    an integer dtype's nodata it cannot hold, such as 256 for uint8: that marks no pixel)."""
    if nodata is None:
        return 0
    try:
        with np.errstate(all="ignore"):
            held = np.array([nodata]).astype(dtype)[0]
    except (OverflowError, TypeError, ValueError):
        return 0
    return held if held == nodata else 0


def _infer(op: BandOp, spec: _TaskSpec, bands: int, dtype: np.dtype) -> _ResultInfo:
    """What ``op`` returns for a small block of ``bands`` bands: dtype, bands, nodata."""
    side = 8 + 2 * min(spec.halo, 64)  # a halo wider than any chunk must not size it
    sample = np.full((bands, side, side), _sample_fill(spec.nodata, dtype), dtype=dtype)
    out = _execute(sample, op, spec, 0, 0)
    rule = _checked_result(out, spec, (0, 0, side, side), _SAMPLE)
    return _ResultInfo(np.dtype(rule.dtype), int(rule.band_count), out.nodata, rule.nodata)


def _infer_on_cluster(op: BandOp, spec: _TaskSpec, bands: int, dtype: np.dtype,
                      client: Any) -> _ResultInfo:
    """:func:`_infer` on a worker (where the op will run, GPU or CPU), or here without one."""
    client = _client_or_none(client)
    if client is None:
        return _infer(op, spec, bands, dtype)
    return client.submit(_infer, op, spec, bands, dtype, pure=False).result()
