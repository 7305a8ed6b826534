# SPDX-License-Identifier: Apache-2.0
"""Running an op on one block: the chunk grid the blocks come from (shared with map_pipeline),
the task every chunk runs, and the first result that fixes what every chunk's result must be."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from .. import _core
from .. import dispatch as _dispatch
from ..buffers import OwnedRasterArray, Residency
from ._placement import _resolve_device
from ._plugin import _client_or_none, _on_a_worker

BandOp = Callable[[OwnedRasterArray], OwnedRasterArray]


def _starts(sizes: Sequence[int]) -> tuple[int, ...]:
    """The first index of each chunk of an axis of chunks ``sizes``."""
    out, acc = [], 0
    for s in sizes:
        out.append(acc)
        acc += s
    return tuple(out)


@dataclass(frozen=True)
class _ChunkGrid:
    """The spatial chunks a task runs on (map_tiles, map_bands and map_pipeline): their row and
    column sizes, and the halo each chunk's block carries on the sides that have neighbours."""
    halo: int
    row_starts: tuple[int, ...]
    col_starts: tuple[int, ...]
    row_sizes: tuple[int, ...]
    col_sizes: tuple[int, ...]

    @classmethod
    def of(cls, halo: int, rows: Any, cols: Any) -> _ChunkGrid:
        """The grid of chunks of ``rows`` by ``cols`` pixels (Dask's chunk sizes of an axis)."""
        rows, cols = tuple(rows), tuple(cols)
        return cls(halo, _starts(rows), _starts(cols), rows, cols)

    def grown(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The row and column sizes of the blocks with their halo (map_overlap's chunks)."""
        h = self.halo

        def grown(sizes: tuple[int, ...]) -> tuple[int, ...]:
            n = len(sizes)
            return tuple(s + (h if k > 0 else 0) + (h if k < n - 1 else 0)
                         for k, s in enumerate(sizes))

        return grown(self.row_sizes), grown(self.col_sizes)

    def block_origin(self, loc: tuple[int, ...], *blocks: np.ndarray) -> tuple[int, int]:
        """(row, column) of the raster where the block of chunk ``loc`` (its last two indices
        the chunk's row and column) starts, halo included; every one of ``blocks`` must be the
        chunk with its halo."""
        i, j = loc[-2], loc[-1]
        h = self.halo
        row0 = self.row_starts[i] - (h if i > 0 else 0)
        col0 = self.col_starts[j] - (h if j > 0 else 0)
        expect = (self.row_sizes[i] + (h if i > 0 else 0)
                  + (h if i < len(self.row_sizes) - 1 else 0),
                  self.col_sizes[j] + (h if j > 0 else 0)
                  + (h if j < len(self.col_sizes) - 1 else 0))
        for b in blocks:
            if tuple(b.shape[-2:]) != expect:
                raise RuntimeError(f"block {loc} is {b.shape[-2:]} with its halo, expected "
                                   f"{expect}: Dask rechunked the overlap")
        return row0, col0


def _sample_side(halo: int) -> int:
    """Height and width of the sample block the first result is inferred from."""
    return 8 + 2 * min(halo, 64)  # a halo wider than any chunk must not size it


def _on_cluster(client: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` on a worker of ``client`` (checked), else of the current client, else here."""
    return _on_a_worker(_client_or_none(client), fn, *args)


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
    grid: _ChunkGrid
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
    row0, col0 = spec.grid.block_origin(loc, block)
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
    side = _sample_side(spec.grid.halo)
    sample = np.full((bands, side, side), _sample_fill(spec.nodata, dtype), dtype=dtype)
    out = _execute(sample, op, spec, 0, 0)
    rule = _checked_result(out, spec, (0, 0, side, side), _SAMPLE)
    return _ResultInfo(np.dtype(rule.dtype), int(rule.band_count), out.nodata, rule.nodata)


def _infer_on_cluster(op: BandOp, spec: _TaskSpec, bands: int, dtype: np.dtype,
                      client: Any) -> _ResultInfo:
    """:func:`_infer` on a worker (where the op will run, GPU or CPU), or here without one."""
    return _on_cluster(client, _infer, op, spec, bands, dtype)
