# SPDX-License-Identifier: Apache-2.0
"""Chunk planning: Dask chunks from the planner and the workers' VRAM budgets."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import dask
import dask.array as da
import numpy as np
from dask.utils import parse_bytes

from .. import _core
from .. import dispatch as _dispatch
from .. import io as _io
from .._dtypes import planning_dtype
from .._ints import integer, is_integer
from ..buffers import RasterMetadata, RasterPlan
from ._georef import _IDENTITY, _check_dims, _is_dataarray
from ._plugin import _client_or_none, _worker_budget

@dataclass(frozen=True)
class ChunkPlan:
    """What :func:`chunk_plan` decided.

    Attributes:
        chunks: Dask chunks: ((bands...), (rows...), (cols...)), or ((rows...), (cols...)) for
            a 2D array.
        plan: the planner's decision the chunks follow (for ``budget``; with ``budget`` 0, for
            a budget that holds a chunk of Dask's ``array.chunk-size`` per buffer).
        budget: the per-task VRAM budget planned for, in bytes: the smallest among the GPU
            workers (each worker's available VRAM divided by its threads); 0 when no worker has
            a GPU, and the chunks then follow Dask's ``array.chunk-size`` instead.
        worker_budgets: each worker's per-task budget, by address ({} without a client).
        block_shape: the file's blocks (rows, cols) the chunks align to (GDAL's block: a
            GeoTIFF's tile or strip), or None.
        chunk_bytes: device bytes the largest chunk needs: (rows + 2 halo) x (cols + 2 halo) x
            bands x itemsize x buffers_per_band + scratch_bytes; within ``usable_vram_budget(
            budget)`` whenever ``budget`` > 0.
    """

    chunks: tuple[tuple[int, ...], ...]
    plan: RasterPlan
    budget: int
    worker_budgets: dict[str, int]
    block_shape: tuple[int, int] | None
    chunk_bytes: int


def _file_block_shape(path: str) -> tuple[int, int]:
    """(rows, cols) of the file's blocks: GDAL's block of band 1, a GeoTIFF's tile or strip
    (RowsPerStrip rows of the whole width), a scanline of most other formats."""
    rows, cols = _core.read_raster_info(_io._path(path), False)[3]
    return int(rows), int(cols)


def _describe(obj: Any) -> tuple[int, int, int, np.dtype, int, str | None]:
    """(bands, height, width, dtype, ndim, path) of a RasterMetadata, a path, or an array."""
    if _is_dataarray(obj):
        _check_dims(obj)
    if isinstance(obj, RasterMetadata):
        return obj.band_count, obj.height, obj.width, np.dtype(obj.dtype), 3, None
    if isinstance(obj, (str, os.PathLike)):
        path = os.fspath(obj)
        meta = _io.read_raster_metadata(path)
        return meta.band_count, meta.height, meta.width, np.dtype(meta.dtype), 3, path
    shape = getattr(obj, "shape", None)
    dtype = getattr(obj, "dtype", None)
    if shape is None or dtype is None:
        raise TypeError(f"expected a RasterMetadata, a path or an array, not "
                        f"{type(obj).__name__}")
    if len(shape) == 3:
        return int(shape[0]), int(shape[1]), int(shape[2]), np.dtype(dtype), 3, None
    if len(shape) == 2:
        return 1, int(shape[0]), int(shape[1]), np.dtype(dtype), 2, None
    raise ValueError(f"a raster array is (bands, height, width) or (height, width), not "
                     f"{len(shape)}D")


def _int_arg(name: str, value: Any, minimum: int) -> int:
    v = integer(name, value)
    if v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, not {v}")
    return v


def _split(total: int, size: int, halo: int) -> tuple[int, ...]:
    """Chunks of ``size`` along an axis of ``total``; a last chunk thinner than the halo is
    evened out with the one before it (map_overlap needs every chunk at least halo thick), so
    no chunk exceeds ``size``; where halving would leave a chunk thinner than the halo, the
    two merge instead (one chunk of less than ``size + halo``). With ``size`` >= ``halo``,
    no chunk is thinner than the halo unless the axis is."""
    size = max(1, min(size, total))
    chunks = [size] * (total // size)
    rest = total - size * len(chunks)
    if rest:
        chunks.append(rest)
    if halo and len(chunks) > 1 and chunks[-1] < halo:
        pair = chunks[-2] + chunks[-1]
        chunks[-2:] = [pair - pair // 2, pair // 2] if pair // 2 >= halo else [pair]
    return tuple(chunks)


_CHUNK_FORMS = ("Dask chunks: an int (every axis), -1 (whole axes), 'auto' or a size such as "
                "'64MiB', a dict {axis: size}, or one entry per axis (an int, -1 or None for "
                "the whole axis, 'auto', or the tuple of that axis's chunk sizes, adding up to "
                "it)")


def _dask_chunks(who: str, chunks: Any, shape: tuple[int, ...],
                 dtype: np.dtype) -> tuple[tuple[int, ...], ...]:
    """``chunks`` as Dask reads them for an array of ``shape`` (``normalize_chunks``): TypeError
    for another type, ValueError for chunks that do not fit the shape or hold an empty chunk,
    both naming ``chunks`` and the forms accepted (not an error deep in Dask or a task)."""
    entries = (chunks.values() if isinstance(chunks, dict)
               else chunks if isinstance(chunks, (tuple, list)) else (chunks,))
    flat = [v for e in entries for v in (e if isinstance(e, (tuple, list)) else (e,))]
    if isinstance(chunks, (bool, np.bool_)) or not (
            is_integer(chunks) or isinstance(chunks, (str, tuple, list, dict))) or any(
            not (is_integer(v) or isinstance(v, str) or v is None) for v in flat):
        raise TypeError(f"{who}: chunks must be {_CHUNK_FORMS}; not {chunks!r}")
    try:
        norm = da.core.normalize_chunks(chunks, shape, dtype=dtype)
    except Exception as e:  # noqa: BLE001 - Dask's own wording, as a ValueError naming chunks
        raise ValueError(f"{who}: chunks {chunks!r} are not chunks of the {shape} array ("
                         f"{str(e).splitlines()[0] or type(e).__name__}); chunks must be "
                         f"{_CHUNK_FORMS}") from None
    if any(not is_integer(s) or s <= 0 for axis in norm for s in axis):
        raise ValueError(f"{who}: chunks {chunks!r} hold an empty chunk ({norm}) for the {shape} "
                         f"array; chunks must be {_CHUNK_FORMS}")
    return tuple(tuple(int(s) for s in axis) for axis in norm)


def _cpu_budget(buffers: int, scratch: int) -> int:
    """A budget whose usable part holds a chunk of Dask's ``array.chunk-size`` bytes (per
    buffer) and the scratch: the planner then sizes chunks for workers without a GPU."""
    target = parse_bytes(dask.config.get("array.chunk-size")) * buffers + scratch
    budget = int(math.ceil(target / 0.7)) + 1
    while _dispatch.usable_vram_budget(budget) < target:
        budget += 1
    return budget


def _worker_budgets(client: Any) -> dict[str, int]:
    return {addr: int(avail) // max(1, int(threads))
            for addr, (avail, threads) in client.run(_worker_budget).items()}


def chunk_plan(metadata_or_array: Any, *, buffers_per_band: int = 2, halo: int = 0,
               scratch_bytes: int = 0, client: Any = None, per_band: bool = True,
               vram_budget: int | None = None, block_shape: tuple[int, int] | None = None,
               min_chunks: int | None = None) -> ChunkPlan:
    """:func:`plan_chunks`, with the plan, budgets and chunk size it chose (:class:`ChunkPlan`).
    """
    buffers = _int_arg("buffers_per_band", buffers_per_band, 1)
    halo = _int_arg("halo", halo, 0)
    scratch = _int_arg("scratch_bytes", scratch_bytes, 0)
    bands, height, width, dtype, ndim, path = _describe(metadata_or_array)
    if block_shape is None and path is not None:
        block_shape = _file_block_shape(path)
    if block_shape is not None:
        if isinstance(block_shape, (str, bytes)) or not isinstance(block_shape, Sequence) or \
                len(block_shape) != 2:
            raise TypeError(f"block_shape must be (rows, cols), not {block_shape!r}")
        bh, bw = (_int_arg("block_shape", v, 1) for v in block_shape)
        block_shape = (bh, bw)

    worker_budgets: dict[str, int] = {}
    c = _client_or_none(client)
    if vram_budget is not None:
        budget = _int_arg("vram_budget", vram_budget, 0)
    elif c is not None:
        worker_budgets = _worker_budgets(c)
        gpu = [b for b in worker_budgets.values() if b > 0]
        budget = min(gpu) if gpu else 0
    else:
        budget = _dispatch.available_vram_bytes()
    if min_chunks is None:
        min_chunks = 1
        if c is not None:
            workers = c.scheduler_info()["workers"].values()
            min_chunks = max(1, sum(int(w.get("nthreads", 1)) for w in workers))
    min_chunks = _int_arg("min_chunks", min_chunks, 1)

    meta = RasterMetadata(height, width, bands, dtype, None, _IDENTITY, None)
    plan_budget = budget if budget > 0 else _cpu_budget(buffers, scratch)
    plan = _dispatch.plan_from_metadata(meta, buffers_per_band=buffers, scratch_bytes=scratch,
                                        halo=halo, vram_budget=plan_budget, per_band=per_band)
    if not plan.fits_budget:
        raise ValueError(
            f"plan_chunks: even a {plan.tile_shape} tile of {plan.bands_per_pass} band(s) with "
            f"halo {halo} needs {plan.estimated_vram_per_tile} bytes, more than the usable "
            f"{_dispatch.usable_vram_budget(plan_budget)} of the budget planned for "
            f"({plan_budget} bytes: {'the smallest worker' if worker_budgets else 'given'})")
    bpc = plan.bands_per_pass
    th, tw = (height, width) if plan.tile_shape is None else plan.tile_shape
    th, tw = min(th, height), min(tw, width)
    if block_shape is not None:
        bh, bw = block_shape
        if th < height and th >= bh:
            th -= th % bh
        if tw < width and tw >= bw:
            tw -= tw % bw

    def count() -> int:
        return math.ceil(bands / bpc) * math.ceil(height / th) * math.ceil(width / tw)

    # More chunks than the budget needs when the workers would otherwise idle: whole bands
    # first (no halo to exchange), then rows (aligned to the file's blocks where possible).
    if count() < min_chunks and per_band and bpc > 1:
        bpc = max(1, min(bpc, math.ceil(bands / min_chunks)))
    if count() < min_chunks:
        others = math.ceil(bands / bpc) * math.ceil(width / tw)
        rows = math.ceil(height / math.ceil(min_chunks / others))
        align = block_shape[0] if block_shape is not None else 256
        if rows >= align:
            rows -= rows % align
        # Never thinner than twice the halo: map_overlap needs every chunk at least halo thick.
        th = max(1, min(th, max(rows, 2 * halo), height))

    row_chunks = _split(height, th, halo)
    col_chunks = _split(width, tw, halo)
    band_chunks = _split(bands, bpc, 0)
    itemsize = _core.itemsize(planning_dtype(dtype)[0]) * planning_dtype(dtype)[1]
    ph = max(row_chunks) + (2 * halo if len(row_chunks) > 1 else 0)
    pw = max(col_chunks) + (2 * halo if len(col_chunks) > 1 else 0)
    chunk_bytes = ph * pw * max(band_chunks) * itemsize * buffers + scratch
    chunks = (band_chunks, row_chunks, col_chunks) if ndim == 3 else (row_chunks, col_chunks)
    return ChunkPlan(chunks, plan, budget, worker_budgets, block_shape, chunk_bytes)


def plan_chunks(metadata_or_array: Any, *, buffers_per_band: int = 2, halo: int = 0,
                scratch_bytes: int = 0, client: Any = None, per_band: bool = True,
                vram_budget: int | None = None, block_shape: tuple[int, int] | None = None,
                min_chunks: int | None = None) -> tuple[tuple[int, ...], ...]:
    """Dask chunks for a raster, from the planner and the smallest worker budget.

    ``metadata_or_array``: a :class:`~vibespatial_raster.buffers.RasterMetadata`, a raster
    file's path (its header is read, and its blocks found: a GeoTIFF's tiles or strips), or an
    array of shape (bands, height, width) or (height, width) (NumPy, Dask, xarray).

    The budget is the smallest per-task VRAM budget among the workers of ``client`` (default:
    the current client, if any; without one, this process's :func:`available_vram_bytes`):
    each GPU worker's available VRAM divided by its threads, since its tasks run concurrently
    on one device; workers without a GPU do not count. ``vram_budget`` overrides it. The
    planner (:func:`~vibespatial_raster.dispatch.plan_from_metadata`, with ``per_band``: bands
    independent) then gives whole bands, band batches or tiles of all (``per_band=False``) or
    single bands; tiles are aligned down to the file's blocks (``block_shape`` (rows, cols)
    when given or found). With no GPU anywhere, the chunks hold Dask's ``array.chunk-size``
    per buffer. Chunks are then split further, bands first, until there are ``min_chunks``
    (default: the cluster's total threads; 1 without a client), rows never thinner than twice
    the halo (so a small raster on a big cluster may get fewer chunks).

    Returns ((bands...), (rows...), (cols...)), or ((rows...), (cols...)) for a 2D array.

    Raises:
        ValueError: a negative halo or scratch, buffers_per_band < 1, or a budget that cannot
        hold even a 256 x 256 tile of one band; TypeError: an argument of the wrong type; what
        :func:`vibespatial_raster.io.read_raster_metadata` raises for a path.
    """
    return chunk_plan(metadata_or_array, buffers_per_band=buffers_per_band, halo=halo,
                      scratch_bytes=scratch_bytes, client=client, per_band=per_band,
                      vram_budget=vram_budget, block_shape=block_shape,
                      min_chunks=min_chunks).chunks
