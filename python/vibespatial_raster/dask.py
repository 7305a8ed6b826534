# SPDX-License-Identifier: Apache-2.0
"""Raster work on Dask: chunks sized by the planner from each worker's VRAM budget, the pool
configured on every worker, band and tile maps over Dask arrays, and a streamed GeoTIFF job.

Needs ``dask`` and ``distributed`` (``pip install vibespatial-raster[dask]``); ``xarray`` for
DataArray inputs. Everything also runs on Dask's local schedulers; with a
``distributed.Client`` the worker side is:

- :class:`PoolPlugin` (registered with :func:`register`): configures the pool on each worker
  when it starts (the tier from the worker's usual environment variables), and gives the pool's
  spare memory back to the driver whenever the worker is idle.
- :func:`memory_pool_stats`, :func:`available_vram_bytes`, :func:`free_pool_memory`: the
  per-process functions of the same names, run on every worker; ``{worker address: result}``.

The raster side:

- :func:`plan_chunks` / :func:`chunk_plan`: Dask chunks from the planner and the smallest
  per-task VRAM budget among the workers: whole bands, band batches or tiles, aligned to the
  file's internal tiling.
- :func:`map_bands` / :func:`map_tiles`: apply a band op (``OwnedRasterArray`` in, out, as
  everywhere in the package) to each chunk of a Dask array or xarray ``DataArray``; the halo of
  :func:`map_tiles` is exchanged by ``dask.array.map_overlap``.
- :func:`read_raster`, :func:`write_raster`, :func:`process_geotiff`: a raster file as a Dask
  array of windows read in parallel, a Dask array written as one GeoTIFF (each task writes its
  chunk to a part file, then one task merges the parts through a GDAL VRT), and the two joined
  around an op.

Where a task runs its op (``device=``): ``"auto"`` runs it on the worker's GPU when the worker
has a real driver and the package was built with the CUDA ops, and on the CPU (host ops)
otherwise, as ``vsr-run`` does; ``"gpu"`` always stages the chunk through the device (pool
memory; on the driver emulator the op must then accept device rasters); ``"cpu"`` never.

Files are opened by the workers: paths must name the same file on every worker (one machine,
or a shared file system).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import math
import os
import re
import shutil
import socket
import stat
import struct
import threading
import uuid
import warnings
import xml.sax.saxutils
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

import dask
import dask.array as da
import distributed
import numpy as np
from dask.utils import parse_bytes

from . import _core
from . import dispatch as _dispatch
from . import io as _io
from . import memory as _memory
from . import ops as _ops
from ._dtypes import planning_dtype, raster_dtype
from ._errors import DriverUnavailableError
from .buffers import OwnedRasterArray, RasterMetadata, RasterPlan, Residency, TilingStrategy
from .buffers import _checked_nodata

try:
    import fcntl
except ImportError:  # no flock (Windows): parts left by a killed writer are only reported
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "ChunkPlan",
    "PoolPlugin",
    "available_vram_bytes",
    "chunk_plan",
    "free_pool_memory",
    "map_bands",
    "map_tiles",
    "memory_pool_stats",
    "plan_chunks",
    "process_geotiff",
    "read_raster",
    "register",
    "write_raster",
]

BandOp = Callable[[OwnedRasterArray], OwnedRasterArray]

_UNSET: Any = object()
_DEVICES = ("auto", "gpu", "cpu")
_IDENTITY = (1.0, 0.0, 0.0, 0.0, -1.0, 0.0)

# ---------------------------------------------------------------------------------------------
# Where this process runs ops
# ---------------------------------------------------------------------------------------------

_mode_lock = threading.Lock()
_auto_mode: str | None = None


def _process_mode() -> str:
    """"gpu" when this process has a real CUDA driver and the CUDA ops, else "cpu" (the
    emulator runs no kernels; vsr-run decides the same way). Kept once the driver is available;
    while it is not, each call looks again (the runtime starts a failed driver again)."""
    global _auto_mode
    with _mode_lock:
        if _auto_mode is not None:
            return _auto_mode
        info = _core.driver_info()
        available = bool(info.get("available"))
        real = available and not bool(info.get("emulated"))
        mode = "gpu" if real and _ops.ops_built_with_cuda() else "cpu"
        if available:
            _auto_mode = mode
        return mode


def _resolve_device(device: str) -> str:
    return _process_mode() if device == "auto" else device


def _check_device(device: Any) -> str:
    if device not in _DEVICES:
        raise ValueError(f"device must be one of {', '.join(_DEVICES)}, not {device!r}")
    return str(device)


# ---------------------------------------------------------------------------------------------
# The worker plugin
# ---------------------------------------------------------------------------------------------


def _idle(worker: Any) -> bool:
    state = worker.state
    return not (state.executing or state.long_running or state.ready or state.constrained)


class PoolPlugin(distributed.WorkerPlugin):
    """Sets up vibespatial-raster on each Dask worker.

    On a worker's start (and on every worker already running when registered): applies
    ``env`` to the worker's environment, configures the pool (the tier from
    ``VIBESPATIAL_GPU_POOL_ONLY`` / ``VIBESPATIAL_GPU_MANAGED_MEMORY`` as everywhere; a worker
    without a driver runs its ops on the CPU and has no pool) and records the pool's live bytes
    as the worker's baseline. Every ``idle_free_interval`` seconds (None: never) a worker with
    no task running or ready gives the pool's free physical memory back to the driver
    (:func:`vibespatial_raster.memory.free_pool_memory`, safe with live allocations). On
    teardown it stops that check and frees once more.

    ``env`` takes effect only if nothing in the worker has used the driver yet: set a worker's
    own variables (e.g. ``CUDA_VISIBLE_DEVICES``) through the worker's environment instead
    (``dask worker``'s environment, ``Nanny(env=...)``, dask-cuda).
    """

    name = "vibespatial-raster"

    def __init__(self, *, env: Mapping[str, str] | None = None,
                 idle_free_interval: float | None = 5.0) -> None:
        if idle_free_interval is not None and not idle_free_interval > 0:
            raise ValueError(f"idle_free_interval must be > 0 seconds or None, not "
                             f"{idle_free_interval!r}")
        self.env = {str(k): str(v) for k, v in (env or {}).items()}
        self.idle_free_interval = idle_free_interval
        self.tier: str | None = None
        self.mode: str | None = None
        self.baseline_bytes = 0
        self.idle_frees = 0
        self._worker: Any = None
        self._callback: Any = None

    def setup(self, worker: Any) -> None:
        self._worker = worker
        os.environ.update(self.env)
        self.mode = _process_mode()
        try:
            self.tier = _memory.configure_memory_pool()
        except DriverUnavailableError:
            self.tier = None  # no GPU: the ops run on the CPU
        self.baseline_bytes = int(_memory.memory_pool_stats().get("current_bytes", 0) or 0)
        if self.idle_free_interval is not None:
            from tornado.ioloop import PeriodicCallback

            self._callback = PeriodicCallback(self._tick, self.idle_free_interval * 1000.0)
            worker.periodic_callbacks["vibespatial-raster-idle-free"] = self._callback
            self._callback.start()

    def teardown(self, worker: Any) -> None:
        if self._callback is not None:
            self._callback.stop()
            worker.periodic_callbacks.pop("vibespatial-raster-idle-free", None)
            self._callback = None
        self.free()

    def _tick(self) -> None:
        self.free_if_idle()

    def free(self) -> int:
        """Give the pool's free physical memory back now; returns the bytes given back."""
        return _free_now()

    def free_if_idle(self) -> int:
        """:meth:`free` when the worker runs no task and has none ready and the pool holds free
        memory; returns the bytes given back (0 otherwise)."""
        worker = self._worker
        if worker is None or not _idle(worker):
            return 0
        if int(_memory.memory_pool_stats().get("pool_free_bytes", 0) or 0) == 0:
            return 0
        freed = self.free()
        self.idle_frees += 1
        return freed


def _free_now() -> int:
    before = _memory.memory_pool_stats()
    if not before.get("configured"):
        return 0
    _memory.free_pool_memory()
    after = _memory.memory_pool_stats()
    return max(0, int(before.get("mapped_bytes", 0)) - int(after.get("mapped_bytes", 0)))


def register(client: Any = None, **options: Any) -> PoolPlugin:
    """Register :class:`PoolPlugin` (``options`` are its arguments) with the cluster of
    ``client`` (default: the current client); it runs on every worker, present and future.
    Registering again replaces it.

    Raises:
        TypeError: ``client`` is not a ``distributed.Client``, or an unknown option;
        ValueError: the client is closed, or there is no client; what :class:`PoolPlugin`
        raises for its options. (Every function here taking ``client=`` checks it the same
        way.)
    """
    plugin = PoolPlugin(**options)
    _client(client).register_plugin(plugin, name=PoolPlugin.name)
    return plugin


def _client(client: Any) -> Any:
    if client is not None:
        return _checked(client)
    try:
        return distributed.default_client()
    except ValueError:
        raise ValueError("no Dask client: create a distributed.Client or pass client=") from None


def _checked(client: Any) -> Any:
    """``client`` if it is an open ``distributed.Client``; TypeError / ValueError otherwise
    (a closed client's calls fail deep in distributed with an AttributeError)."""
    if not isinstance(client, distributed.Client):
        raise TypeError(f"client must be a distributed.Client, not {type(client).__name__}")
    if str(getattr(client.status, "value", client.status)) in ("closing", "closed"):
        raise ValueError(f"the Dask client is closed (status {client.status!r}): pass an open "
                         "client, or none to use the current one")
    return client


def _client_or_none(client: Any) -> Any:
    """``client`` (checked), else the current client, else None (Dask's local schedulers)."""
    return _checked(client) if client is not None else _default_client_or_none()


def _default_client_or_none() -> Any:
    try:
        return distributed.default_client()
    except ValueError:
        return None


def _worker_stats(dask_worker: Any) -> dict:
    stats = dict(_memory.memory_pool_stats())
    stats["available_vram_bytes"] = _dispatch.available_vram_bytes()
    stats["nthreads"] = int(dask_worker.state.nthreads)
    stats["mode"] = _process_mode()
    plugin = dask_worker.plugins.get(PoolPlugin.name)
    if isinstance(plugin, PoolPlugin):
        stats["baseline_bytes"] = plugin.baseline_bytes
        stats["idle_frees"] = plugin.idle_frees
    return stats


def _worker_budget(dask_worker: Any) -> tuple[int, int]:
    return _dispatch.available_vram_bytes(), int(dask_worker.state.nthreads)


def _worker_free(dask_worker: Any) -> int:
    del dask_worker
    return _free_now()


def memory_pool_stats(client: Any = None) -> dict[str, dict]:
    """:func:`vibespatial_raster.memory.memory_pool_stats` of every worker, by address, plus
    ``available_vram_bytes``, ``nthreads``, ``mode`` ("gpu" or "cpu": where ``device="auto"``
    runs ops there) and, with :class:`PoolPlugin`, ``baseline_bytes`` (live pool bytes when the
    worker started) and ``idle_frees``."""
    return dict(_client(client).run(_worker_stats))


def available_vram_bytes(client: Any = None) -> dict[str, int]:
    """:func:`vibespatial_raster.dispatch.available_vram_bytes` of every worker, by address
    (0 for a worker without a GPU)."""
    return {addr: int(v[0]) for addr, v in _client(client).run(_worker_budget).items()}


def free_pool_memory(client: Any = None) -> dict[str, int]:
    """Give each worker's free pool memory back to its driver now; the bytes each gave back,
    by address. Safe while tasks run (live allocations stay)."""
    return {addr: int(v) for addr, v in _client(client).run(_worker_free).items()}


# ---------------------------------------------------------------------------------------------
# Chunk planning
# ---------------------------------------------------------------------------------------------


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
        block_shape: the file's internal tile or strip (rows, cols) the chunks align to, or None.
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


def _tiff_block_shape(path: str) -> tuple[int, int] | None:
    """(rows, cols) of a TIFF's tiles (TileLength, TileWidth) or strips (RowsPerStrip, width)
    from its first image directory; None for another format or a file without either."""
    try:
        with open(path, "rb") as f:
            head = f.read(16)
            if len(head) < 8 or head[:2] not in (b"II", b"MM"):
                return None
            e = "<" if head[:2] == b"II" else ">"
            magic = struct.unpack(e + "H", head[2:4])[0]
            if magic == 42:
                ifd = struct.unpack(e + "I", head[4:8])[0]
                count_fmt, entry_size, value_fmt, value_size = "H", 12, "I", 4
            elif magic == 43 and len(head) >= 16:
                ifd = struct.unpack(e + "Q", head[8:16])[0]
                count_fmt, entry_size, value_fmt, value_size = "Q", 20, "Q", 8
            else:
                return None
            f.seek(ifd)
            raw = f.read(struct.calcsize(count_fmt))
            (n,) = struct.unpack(e + count_fmt, raw)
            entries = f.read(n * entry_size)
    except OSError:
        return None
    tags: dict[int, int] = {}
    for i in range(n):
        entry = entries[i * entry_size:(i + 1) * entry_size]
        if len(entry) < entry_size:
            break
        tag, typ = struct.unpack(e + "HH", entry[:4])
        value = entry[4 + value_size:]
        if typ == 3:  # SHORT
            tags[tag] = struct.unpack(e + "H", value[:2])[0]
        elif typ == 4:  # LONG
            tags[tag] = struct.unpack(e + "I", value[:4])[0]
        elif typ == 16 and value_fmt == "Q":  # LONG8
            tags[tag] = struct.unpack(e + "Q", value[:8])[0]
    if 322 in tags and 323 in tags:
        return int(tags[323]), int(tags[322])
    if 278 in tags and 256 in tags:
        return int(tags[278]), int(tags[256])
    return None


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
    v = _io._index(name, value)
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
    def is_int(v: Any) -> bool:
        return hasattr(v, "__index__") and not isinstance(v, (bool, np.bool_))

    entries = (chunks.values() if isinstance(chunks, dict)
               else chunks if isinstance(chunks, (tuple, list)) else (chunks,))
    flat = [v for e in entries for v in (e if isinstance(e, (tuple, list)) else (e,))]
    if isinstance(chunks, (bool, np.bool_)) or not (
            is_int(chunks) or isinstance(chunks, (str, tuple, list, dict))) or any(
            not (is_int(v) or isinstance(v, str) or v is None) for v in flat):
        raise TypeError(f"{who}: chunks must be {_CHUNK_FORMS}; not {chunks!r}")
    try:
        norm = da.core.normalize_chunks(chunks, shape, dtype=dtype)
    except Exception as e:  # noqa: BLE001 - Dask's own wording, as a ValueError naming chunks
        raise ValueError(f"{who}: chunks {chunks!r} are not chunks of the {shape} array ("
                         f"{str(e).splitlines()[0] or type(e).__name__}); chunks must be "
                         f"{_CHUNK_FORMS}") from None
    if any(not is_int(s) or s <= 0 for axis in norm for s in axis):
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
        block_shape = _tiff_block_shape(path)
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
    file's path (its header is read, and a TIFF's internal tiles or strips are found), or an
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


# ---------------------------------------------------------------------------------------------
# Georeferencing of arrays and DataArrays
# ---------------------------------------------------------------------------------------------


def _is_dataarray(obj: Any) -> bool:
    xr = _xarray_if_imported()
    return xr is not None and isinstance(obj, xr.DataArray)


def _xarray_if_imported() -> Any:
    import sys

    return sys.modules.get("xarray")


_X_DIMS = ("x", "lon", "longitude")
_Y_DIMS = ("y", "lat", "latitude")


def _check_dims(array: Any) -> None:
    """A DataArray's spatial dims (named x / y, lon / lat or longitude / latitude) must be its
    last two, y then x: (band, y, x) or (y, x). Any other order would be read silently as
    other bands, rows and columns."""
    dims = tuple(str(d) for d in array.dims)
    xs = [k for k, d in enumerate(dims) if d.lower() in _X_DIMS]
    ys = [k for k, d in enumerate(dims) if d.lower() in _Y_DIMS]
    n = len(dims)
    if (xs and xs != [n - 1]) or (ys and ys != [n - 2]):
        raise ValueError(f"a raster DataArray is (band, y, x) or (y, x), not {dims}: "
                         f"transpose it first (array.transpose(..., 'y', 'x'))")


def _affine6(value: Any) -> tuple[float, float, float, float, float, float]:
    if all(hasattr(value, k) for k in "abcdef"):
        vals = [value.a, value.b, value.c, value.d, value.e, value.f]
    else:
        vals = [float(v) for v in value]
    if len(vals) == 9:
        vals = vals[:6]
    if len(vals) != 6:
        raise ValueError(f"affine must have 6 numbers (a, b, c, d, e, f), not {len(vals)}")
    return tuple(float(v) for v in vals)  # type: ignore[return-value]


def _regular_axis(values: Any, name: str) -> tuple[float, float]:
    """(first pixel centre, spacing) of a coordinate of pixel centres; ValueError unless it is
    numeric and evenly spaced (to a thousandth of a pixel, plus the rounding of its dtype)."""
    try:
        v = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"the DataArray's {name!r} coordinate is not numeric "
                         f"({np.asarray(values).dtype}): no affine maps it; pass affine= or "
                         "set attrs['transform']") from None
    step = (v[-1] - v[0]) / (v.size - 1)
    raw = np.asarray(values)
    rounding = 4 * float(np.finfo(raw.dtype).eps) * float(np.nanmax(np.abs(v))) \
        if raw.dtype.kind == "f" else 0.0
    off = np.abs(v - (v[0] + step * np.arange(v.size)))
    if not (np.isfinite(step) and step != 0 and np.all(off <= 1e-3 * abs(step) + rounding)):
        raise ValueError(f"the DataArray's {name!r} coordinates are not evenly spaced pixel "
                         f"centres (spacing {float(np.diff(v).min())!r} to "
                         f"{float(np.diff(v).max())!r}): no "
                         "affine maps them; pass affine= or set attrs['transform']")
    return float(v[0]), float(step)


def _coords_affine(x: Any) -> tuple[float, ...] | None:
    """The affine of a DataArray's 1D coordinates along its last two dims when they are named
    x / y, lon / lat or longitude / latitude (any case), as pixel centres; None when either
    has no coordinate or fewer than two pixels. ValueError when they are not evenly spaced
    (the identity would put the pixels elsewhere without a word)."""
    if x.ndim < 2:
        return None
    ydim, xdim = x.dims[-2], x.dims[-1]
    if str(xdim).lower() not in _X_DIMS or str(ydim).lower() not in _Y_DIMS:
        return None
    if xdim not in x.coords or ydim not in x.coords or x.sizes[xdim] < 2 or \
            x.sizes[ydim] < 2:
        return None
    x0, dx = _regular_axis(x.coords[xdim].values, str(xdim))
    y0, dy = _regular_axis(x.coords[ydim].values, str(ydim))
    return (dx, 0.0, x0 - dx / 2, 0.0, dy, y0 - dy / 2)


def _georef_of(x: Any, *, affine_needed: bool = True
               ) -> tuple[tuple[float, ...] | None, Any, Any]:
    """(affine, crs, nodata) a DataArray carries, as rioxarray and read_raster leave them:
    attrs ``transform`` / ``crs`` / ``nodata`` / ``_FillValue``, or the ``spatial_ref``
    coordinate's ``GeoTransform`` / ``crs_wkt``, or regular ``x`` / ``y`` (``lon`` / ``lat``,
    ``longitude`` / ``latitude``) coordinates (:func:`_coords_affine`; not read unless
    ``affine_needed``)."""
    attrs = dict(x.attrs)
    affine: tuple[float, ...] | None = None
    crs: Any = attrs.get("crs")
    ref = x.coords.get("spatial_ref")
    ref_attrs = dict(ref.attrs) if ref is not None else {}
    if "transform" in attrs:
        affine = _affine6(attrs["transform"])
    elif "GeoTransform" in ref_attrs:
        g = [float(v) for v in str(ref_attrs["GeoTransform"]).split()]
        affine = (g[1], g[2], g[0], g[4], g[5], g[3])
    elif affine_needed:
        affine = _coords_affine(x)
    if crs is None:
        crs = ref_attrs.get("crs_wkt") or ref_attrs.get("spatial_ref")
    if crs is None:
        rio = getattr(x, "rio", None)
        crs = getattr(rio, "crs", None) if rio is not None else None
    nodata = _UNSET
    for key in ("nodata", "_FillValue"):
        if key in attrs:
            nodata = attrs[key]
            break
    else:
        if "_FillValue" in x.encoding:
            nodata = x.encoding["_FillValue"]
    if nodata is not _UNSET and nodata is not None:
        nodata = float(nodata) if isinstance(nodata, (float, np.floating)) else nodata
    return affine, crs, (None if nodata is _UNSET else nodata)


def _crs_text(crs: Any) -> str | None:
    if crs is None:
        return None
    if isinstance(crs, str):
        return crs or None
    to_wkt = getattr(crs, "to_wkt", None)
    return str(to_wkt()) if callable(to_wkt) else str(crs)


# ---------------------------------------------------------------------------------------------
# Running an op on one block
# ---------------------------------------------------------------------------------------------


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
    out_nodata: float | int | None = None


def _same_nodata(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    floats = (float, np.floating)
    if isinstance(a, floats) and isinstance(b, floats) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


def _shifted(affine: Sequence[float], row: int, col: int) -> tuple[float, ...]:
    a, b, c, d, e, f = affine
    return (a, b, c + a * col + b * row, d, e, f + d * col + e * row)


def _execute(block: np.ndarray, op: BandOp, spec: _TaskSpec, row0: int, col0: int) -> Any:
    """Runs ``op`` on one block (bands, h, w) whose top-left pixel is (row0, col0) of the
    raster; returns the op's result raster (on the host or the device)."""
    device = _resolve_device(spec.device)
    raster = OwnedRasterArray.from_numpy(np.ascontiguousarray(block), nodata=spec.nodata,
                                         affine=_shifted(spec.affine, row0, col0), crs=spec.crs)
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
    if not isinstance(out, OwnedRasterArray):
        raise TypeError(f"the op must return an OwnedRasterArray, not {type(out).__name__}")
    if (out.height, out.width) != (block.shape[-2], block.shape[-1]):
        raise ValueError(f"the op returned {out.height} x {out.width} pixels for a "
                         f"{block.shape[-2]} x {block.shape[-1]} block")
    del raster
    return out


def _block_result(out: Any, spec: _TaskSpec) -> np.ndarray:
    data = np.asarray(out.to_numpy()).reshape(out.band_count, out.height, out.width)
    if spec.out_bands is not None and data.shape[0] != spec.out_bands:
        raise ValueError(f"the op returned {data.shape[0]} band(s) where the first result had "
                         f"{spec.out_bands}")
    if spec.out_dtype is not None:
        if data.dtype != np.dtype(spec.out_dtype):
            raise ValueError(f"the op returned dtype {data.dtype} where the first result had "
                             f"{spec.out_dtype}: an op must return one dtype for every chunk")
        if not _same_nodata(out.nodata, spec.out_nodata):
            raise ValueError(f"the op returned nodata {out.nodata!r} where the first result "
                             f"had {spec.out_nodata!r}: an op must return one nodata for every "
                             "chunk")
    return data[0] if spec.two_d else data


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
    return _block_result(_execute(block3, op, spec, row0, col0), spec)


@dataclass(frozen=True)
class _ResultInfo:
    dtype: np.dtype
    bands: int
    nodata: float | int | None


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
    return _ResultInfo(np.dtype(out.dtype), int(out.band_count), out.nodata)


def _infer_on_cluster(op: BandOp, spec: _TaskSpec, bands: int, dtype: np.dtype,
                      client: Any) -> _ResultInfo:
    """:func:`_infer` on a worker (where the op will run, GPU or CPU), or here without one."""
    client = _client_or_none(client)
    if client is None:
        return _infer(op, spec, bands, dtype)
    return client.submit(_infer, op, spec, bands, dtype, pure=False).result()


# ---------------------------------------------------------------------------------------------
# map_bands / map_tiles
# ---------------------------------------------------------------------------------------------


def _as_dask(data: Any) -> Any:
    if isinstance(data, da.Array):
        return data
    return da.from_array(np.asarray(data), chunks=-1)


def _prepare(who: str, array: Any, nodata: Any, affine: Any,
             crs: Any) -> tuple[Any, Any, tuple, Any, Any]:
    """(source DataArray or None, dask array, affine, crs, nodata); the nodata checked for the
    array's dtype as :meth:`OwnedRasterArray.from_numpy` checks it, before any work."""
    if _is_dataarray(array):
        if array.ndim not in (2, 3):
            raise ValueError(f"a raster DataArray is (band, y, x) or (y, x), not {array.dims}")
        _check_dims(array)
        a_aff, a_crs, a_nodata = _georef_of(array, affine_needed=affine is None)
        data = _as_dask(array.data)
        src = array
        affine = a_aff if affine is None else affine
        crs = a_crs if crs is None else crs
        nodata = a_nodata if nodata is _UNSET else nodata
    else:
        if not hasattr(array, "shape") or not hasattr(array, "dtype"):
            raise TypeError(f"expected a Dask or NumPy array or an xarray DataArray, not "
                            f"{type(array).__name__}")
        data = _as_dask(array)
        src = None
        nodata = None if nodata is _UNSET else nodata
    if data.ndim not in (2, 3):
        raise ValueError(f"a raster array is (bands, height, width) or (height, width), not "
                         f"{data.ndim}D")
    _checked_nodata(who, nodata, raster_dtype(data.dtype))
    return src, data, _affine6(_IDENTITY if affine is None else affine), _crs_text(crs), nodata


def _wrap_result(src: Any, result: Any, info: _ResultInfo) -> Any:
    if src is None:
        return result
    import xarray as xr

    attrs = dict(src.attrs)
    for key in ("_FillValue", "nodata"):
        if key in attrs or key == "_FillValue":
            if info.nodata is None:
                attrs.pop(key, None)
            else:
                attrs[key] = info.nodata
    coords = src.coords
    if src.ndim == 3 and result.shape[0] != src.shape[0]:
        band_dim = src.dims[0]
        coords = {k: v for k, v in src.coords.items() if band_dim not in v.dims}
    return xr.DataArray(result, dims=src.dims, coords=coords, attrs=attrs, name=src.name)


def _starts(sizes: Sequence[int]) -> tuple[int, ...]:
    out, acc = [], 0
    for s in sizes:
        out.append(acc)
        acc += s
    return tuple(out)


def _map(data: Any, op: BandOp, *, who: str, halo: int, each_band: bool, per_band: bool,
         chunks: Any, nodata: Any,
         affine: tuple[float, ...], crs: str | None, device: str, buffers_per_band: int,
         scratch_bytes: int, client: Any) -> tuple[Any, _ResultInfo]:
    """``op`` over the chunks of the Dask array ``data`` (prepared by :func:`_prepare`)."""
    if not callable(op):
        raise TypeError(f"op must be callable, not {type(op).__name__}")
    device = _check_device(device)
    halo = _int_arg("halo", halo, 0)
    buffers = _int_arg("buffers_per_band", buffers_per_band, 1)
    scratch = _int_arg("scratch_bytes", scratch_bytes, 0)
    if isinstance(chunks, str) and chunks == "plan":
        chunks = plan_chunks(data, buffers_per_band=buffers, halo=halo, scratch_bytes=scratch,
                             client=client, per_band=per_band)
    elif chunks is not None:
        chunks = _dask_chunks(who, chunks, tuple(data.shape), np.dtype(data.dtype))
    if chunks is not None:
        data = data.rechunk(chunks)
    if halo:
        # map_overlap needs every chunk at least halo thick (an axis thinner than the halo
        # becomes one chunk, which has no neighbours to exchange with).
        fixed = list(data.chunks)
        for ax in (-2, -1):
            fixed[ax] = _split(sum(fixed[ax]), max(max(fixed[ax]), halo), halo) \
                if min(fixed[ax]) < halo else fixed[ax]
        if tuple(fixed) != data.chunks:
            data = data.rechunk(tuple(fixed))
    rows, cols = data.chunks[-2], data.chunks[-1]
    spec = _TaskSpec(device, each_band, buffers, scratch, nodata, affine, crs, data.ndim == 2,
                     halo, _starts(rows), _starts(cols), tuple(rows), tuple(cols))
    in_bands = 1 if data.ndim == 2 else max(data.chunks[0])
    info = _infer_on_cluster(op, spec, in_bands, np.dtype(data.dtype), client)
    if data.ndim == 3 and info.bands != in_bands:
        if each_band or len(data.chunks[0]) != 1:
            raise ValueError(f"the op returns {info.bands} band(s) for {in_bands}: ops that "
                             "change the band count need map_tiles with every band in one "
                             "chunk (per_band=False)")
    elif data.ndim == 2 and info.bands != 1:
        raise ValueError(f"the op returns {info.bands} bands for a 2D (single-band) array")
    spec = replace(spec, out_bands=info.bands, out_dtype=info.dtype.name,
                   out_nodata=info.nodata)

    def grown(sizes: Sequence[int]) -> tuple[int, ...]:
        n = len(sizes)
        return tuple(s + (halo if k > 0 else 0) + (halo if k < n - 1 else 0)
                     for k, s in enumerate(sizes))

    band_chunks: tuple[tuple[int, ...], ...] = ()
    if data.ndim == 3:
        band_chunks = ((info.bands,),) if info.bands != in_bands else (data.chunks[0],)
    meta = np.empty((0,) * data.ndim, dtype=info.dtype)
    token = "vsr-bands" if each_band else "vsr-tiles"
    # Only axes of several chunks exchange a halo (Dask refuses a depth beyond the array).
    depth = {data.ndim - 2: halo if len(rows) > 1 else 0,
             data.ndim - 1: halo if len(cols) > 1 else 0}
    if any(depth.values()):
        if data.ndim == 3:
            depth[0] = 0
        result = da.map_overlap(_run_block, data, op=op, spec=spec, depth=depth,
                                boundary="none", trim=True,
                                chunks=band_chunks + (grown(rows), grown(cols)),
                                dtype=info.dtype, meta=meta, token=token)
    else:
        result = da.map_blocks(_run_block, data, op=op, spec=spec,
                               chunks=band_chunks + (rows, cols), dtype=info.dtype, meta=meta,
                               token=token)
    return result, info


def map_bands(array: Any, op: BandOp, *, nodata: Any = _UNSET, affine: Any = None,
              crs: Any = None, device: str = "auto", buffers_per_band: int = 2,
              scratch_bytes: int = 0, bands_per_chunk: int | None = None,
              client: Any = None) -> Any:
    """Apply the band op ``op`` to every band of ``array``; a lazy array of the results.

    ``array``: a Dask (or NumPy) array (bands, height, width) or (height, width), or an xarray
    ``DataArray`` with those dims. Chunks hold whole bands: ``bands_per_chunk`` of them
    (default: the band batches :func:`plan_chunks` gives for the smallest worker budget, at
    least one chunk per worker thread). Each task runs ``op`` on each band of its chunk as a
    single-band raster with the chunk's nodata, affine and CRS, on the worker's GPU (bands
    moved there within its budget by ``dispatch_per_band_gpu``) or CPU (``dispatch_per_band_cpu``)
    as ``device`` says (see the module), and the results are stacked as those dispatchers stack
    them: with the input's nodata, affine and CRS. ``op`` must return a raster of its input's
    shape; it is called once at submission on a small block to learn the result's dtype,
    band count and nodata, which every chunk's result must then have (ValueError otherwise).

    ``nodata``, ``affine`` (rasterio order) and ``crs`` default to the DataArray's (attrs
    ``nodata`` / ``_FillValue``, ``transform``, ``crs`` or rioxarray's ``spatial_ref``; else
    the affine of its pixel-centre coordinates along its last two dims when those are named
    ``x`` / ``y``, ``lon`` / ``lat`` or ``longitude`` / ``latitude``, ValueError when they are
    not evenly spaced) and else to None, the identity and None. ``nodata`` is checked as
    :meth:`OwnedRasterArray.from_numpy` checks it: a number or None, never NaN for an integer
    dtype; an integer nodata the dtype cannot hold (256 or -1 for uint8) marks no pixel, as in
    the ops. A DataArray comes back as a DataArray with the same dims, coordinates and attrs
    (``_FillValue`` / ``nodata`` set to the result's nodata).

    Raises:
        ValueError: a bad ``device``, a NaN ``nodata`` for an integer dtype, spatial
        coordinates not evenly spaced (with no ``affine`` given or carried), a budget that
        cannot hold one whole band (use :func:`map_tiles`), an op returning another shape, or
        (when computed) a chunk result whose dtype, band count or nodata differ from the first
        result's; TypeError: a non-callable op, a non-raster dtype or a ``nodata`` that is not
        a number. The arguments are checked before the op runs.
    """
    src, data, aff, crs_text, nodata = _prepare("map_bands", array, nodata, affine, crs)
    if data.ndim == 3:
        if bands_per_chunk is None:
            cp = chunk_plan(data, buffers_per_band=buffers_per_band, scratch_bytes=scratch_bytes,
                            client=client, per_band=True)
            if cp.plan.strategy is TilingStrategy.TILED:
                raise ValueError(
                    f"map_bands: one whole {data.shape[1]} x {data.shape[2]} band does not fit "
                    f"the smallest worker budget ({cp.budget} bytes); use map_tiles")
            bands_per_chunk = max(cp.chunks[0])
        bpc = _int_arg("bands_per_chunk", bands_per_chunk, 1)
        chunks: Any = (_split(data.shape[0], bpc, 0), (data.shape[1],), (data.shape[2],))
    else:
        chunks = ((data.shape[0],), (data.shape[1],))
    result, info = _map(data, op, who="map_bands", halo=0, each_band=True, per_band=True,
                        chunks=chunks,
                        nodata=nodata,
                        affine=aff, crs=crs_text, device=device,
                        buffers_per_band=buffers_per_band, scratch_bytes=scratch_bytes,
                        client=client)
    return _wrap_result(src, result, info)


def map_tiles(array: Any, op: BandOp, *, halo: int = 0, nodata: Any = _UNSET,
              affine: Any = None, crs: Any = None, device: str = "auto", per_band: bool = False,
              buffers_per_band: int = 2, scratch_bytes: int = 0, chunks: Any = "plan",
              client: Any = None) -> Any:
    """Apply ``op`` to every chunk of ``array`` seen as a raster tile with ``halo`` pixels of
    its neighbours on each side; a lazy array of the results (halos trimmed).

    ``chunks``: "plan" (default) rechunks to :func:`plan_chunks` for ``halo``,
    ``buffers_per_band``, ``scratch_bytes`` and ``per_band`` (False: every band in each tile,
    for ops that combine bands; True: a band-independent op, so tiles may hold fewer bands);
    None keeps the array's chunks; or Dask chunks, in the forms :func:`read_raster` takes
    (TypeError / ValueError naming ``chunks`` for others). The halo comes from the
    neighbouring chunks through ``dask.array.map_overlap`` (``boundary="none"``: tiles at the
    raster's edges are clamped there, not padded), so with ``halo`` >= the op's radius the
    result equals the op on the whole raster; chunks thinner than the halo are first
    rechunked to at least its width (an axis thinner than the halo becomes one chunk). Each
    tile reaches ``op`` as a raster with all the chunk's bands, the affine shifted to the
    tile's origin, on the worker's GPU or CPU as ``device`` says. ``op`` returns a raster of
    the tile's height and width; it may change the dtype and, when every band is in one
    chunk, the band count.
    Georeferencing, DataArrays and errors as :func:`map_bands`.
    """
    src, data, aff, crs_text, nodata = _prepare("map_tiles", array, nodata, affine, crs)
    result, info = _map(data, op, who="map_tiles", halo=halo, each_band=False,
                        per_band=per_band, chunks=chunks,
                        nodata=nodata,
                        affine=aff, crs=crs_text, device=device,
                        buffers_per_band=buffers_per_band, scratch_bytes=scratch_bytes,
                        client=client)
    return _wrap_result(src, result, info)


# ---------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------


class _WindowReader:
    """A raster file as an array-like for ``dask.array.from_array``: each chunk is one
    windowed read through :func:`vibespatial_raster.io.read_raster`."""

    def __init__(self, path: str, meta: RasterMetadata, bands: tuple[int, ...]) -> None:
        self.path = path
        self.bands = bands
        self.dtype = np.dtype(meta.dtype)
        self.shape = (len(bands), int(meta.height), int(meta.width))
        self.ndim = 3

    def __getitem__(self, key: Any) -> np.ndarray:
        if not isinstance(key, tuple):
            key = (key,)
        key = key + (slice(None),) * (3 - len(key))
        (b0, b1, _), (r0, r1, _), (c0, c1, _) = (
            k.indices(n) for k, n in zip(key, self.shape))
        if b1 <= b0 or r1 <= r0 or c1 <= c0:
            return np.empty((max(0, b1 - b0), max(0, r1 - r0), max(0, c1 - c0)), self.dtype)
        raster = _io.read_raster(self.path, window=(c0, r0, c1 - c0, r1 - r0),
                                 bands=list(self.bands[b0:b1]))
        return np.asarray(raster.to_numpy()).reshape(b1 - b0, r1 - r0, c1 - c0)


def _metadata(path: str, client: Any) -> RasterMetadata:
    if client is None:
        return _io.read_raster_metadata(path)
    return client.submit(_io.read_raster_metadata, path, pure=False).result()


def read_raster(path: str | os.PathLike, *, chunks: Any = None,
                bands: Sequence[int] | None = None, xarray: bool = False,
                buffers_per_band: int = 2, halo: int = 0, scratch_bytes: int = 0,
                per_band: bool = True, client: Any = None) -> Any:
    """The raster file at ``path`` as a lazy Dask array (bands, height, width): each chunk is
    read by its own task (a window of the 1-based ``bands``, default all, through GDAL), so the
    workers read in parallel.

    ``chunks``: None plans them (:func:`plan_chunks` with ``buffers_per_band``, ``halo``,
    ``scratch_bytes``, ``per_band``; aligned to the file's tiles); or Dask chunks for the
    (bands, height, width) array: an int (every axis), -1 or None (whole axes), ``"auto"`` or a
    size such as ``"64MiB"``, a dict ``{axis: size}``, or one entry per axis (an int, -1,
    ``"auto"``, or that axis's chunk sizes, adding up to it).
    ``xarray=True`` returns an xarray ``DataArray`` (dims band, y, x; ``x`` / ``y`` pixel-centre
    coordinates for a north-up affine; attrs ``crs`` (WKT), ``transform`` (rasterio order),
    ``_FillValue``; a rioxarray-style ``spatial_ref`` coordinate).

    Raises:
        TypeError / ValueError: ``chunks`` of another type, or that do not fit the array or
        hold an empty chunk (naming ``chunks`` and these forms); ValueError: a band not in the
        file. What :func:`vibespatial_raster.io.read_raster_metadata` raises.
    """
    p = os.fspath(path)
    c = _client_or_none(client)
    meta = _metadata(p, c)
    band_list = tuple(int(b) for b in (bands or range(1, meta.band_count + 1)))
    for b in band_list:
        if not 1 <= b <= meta.band_count:
            raise ValueError(f"band {b} is not in [1, {meta.band_count}]")
    sub = replace(meta, band_count=len(band_list))
    if chunks is not None:
        chunks = _dask_chunks("read_raster", chunks, (len(band_list), meta.height, meta.width),
                              np.dtype(meta.dtype))
    else:
        chunks = chunk_plan(sub, buffers_per_band=buffers_per_band, halo=halo,
                            scratch_bytes=scratch_bytes, client=client, per_band=per_band,
                            block_shape=_tiff_block_shape(p)).chunks
    reader = _WindowReader(p, meta, band_list)
    try:
        stamp = os.stat(p).st_mtime_ns
    except OSError:
        stamp = 0
    name = "vsr-read-" + dask.base.tokenize(p, stamp, band_list, chunks)
    arr = da.from_array(reader, chunks=chunks, lock=False, fancy=False, asarray=True,
                        meta=np.empty((0, 0, 0), dtype=reader.dtype), name=name)
    if not xarray:
        return arr
    return _to_dataarray(arr, sub, band_list)


def _to_dataarray(arr: Any, meta: RasterMetadata, bands: tuple[int, ...]) -> Any:
    import xarray as xr

    a, b, c, d, e, f = meta.affine
    crs = _crs_text(meta.crs)
    coords: dict[str, Any] = {"band": list(bands)}
    if b == 0 and d == 0:
        coords["x"] = c + a * (np.arange(meta.width) + 0.5)
        coords["y"] = f + e * (np.arange(meta.height) + 0.5)
    ref_attrs = {"GeoTransform": " ".join(repr(v) for v in (c, a, b, f, d, e))}
    if crs:
        ref_attrs["crs_wkt"] = crs
        ref_attrs["spatial_ref"] = crs
    coords["spatial_ref"] = xr.Variable((), 0, attrs=ref_attrs)
    attrs: dict[str, Any] = {"transform": tuple(meta.affine)}
    if crs:
        attrs["crs"] = crs
    if meta.nodata is not None:
        attrs["_FillValue"] = meta.nodata
    return xr.DataArray(arr, dims=("band", "y", "x"), coords=coords, attrs=attrs)


_GDAL_TYPES = {"uint8": "Byte", "int8": "Int8", "uint16": "UInt16", "int16": "Int16",
               "uint32": "UInt32", "int32": "Int32", "uint64": "UInt64", "int64": "Int64",
               "float32": "Float32", "float64": "Float64"}


@dataclass(frozen=True)
class _PartWriter:
    """The target of ``dask.array.store``: each chunk becomes a GeoTIFF of its own in
    ``parts_dir`` (written under a temporary name, then renamed, so a task retried after its
    worker died leaves one whole file)."""

    parts_dir: str
    nodata: float | int | None
    affine: tuple[float, ...]
    crs: str | None

    def __setitem__(self, key: tuple[slice, ...], value: np.ndarray) -> None:
        (b, r, c) = key
        final = os.path.join(self.parts_dir, _part_name(b.start, r.start, c.start))
        tmp = f"{final}.{os.getpid()}-{threading.get_ident()}.tmp"
        raster = OwnedRasterArray.from_numpy(np.ascontiguousarray(value), nodata=self.nodata,
                                             affine=_shifted(self.affine, r.start, c.start),
                                             crs=self.crs)
        _io.write_raster(tmp, raster, compress=None, tiled=False)
        os.replace(tmp, final)


def _part_name(b0: int, r0: int, c0: int) -> str:
    return f"part-b{b0}-r{r0}-c{c0}.tif"


# GDAL keeps the nodata of a 64-bit integer band as an integer of its type, read from its text
# with strtoll / strtoull: any other text becomes some integer of the type.
_INT64_LIMITS = {"int64": (-(2**63), 2**63 - 1), "uint64": (0, 2**64 - 1)}


def _file_nodata(who: str, nodata: Any, dtype: np.dtype) -> float | int | None:
    """``nodata`` as the written file's GDAL NoData holds it: a Python int for a 64-bit integer
    ``dtype`` (exactly), else a Python float (a NumPy scalar becomes a plain number). GDAL keeps
    a float32 band's nodata as a float32: a finite value it would turn into an infinity or into
    zero (1e300, 1e-50) is refused with ValueError, since those would mark real pixels. For a
    64-bit integer dtype, the value its largest integer rounds to as a double (2**63 for int64,
    2**64 for uint64: what that nodata becomes in the runtime, which holds nodata as a double)
    stands for the largest integer, and any other value that is not an integer of the type's
    range is refused with ValueError: the file would hold some other integer and mark real
    pixels as nodata."""
    if nodata is None:
        return None
    if dtype.name == "float32":
        given = float(nodata)
        with np.errstate(over="ignore", under="ignore"):
            held = float(np.float32(given))
        if math.isfinite(given) and (math.isinf(held) or (held == 0 and given != 0)):
            raise ValueError(f"{who}: nodata {nodata!r} is beyond float32's range: a float32 "
                             f"GeoTIFF would keep it as {held!r} and mark those pixels as nodata; "
                             "give a value float32 holds, or None")
        return given
    if dtype.name not in _INT64_LIMITS:
        return float(nodata)
    lo, hi = _INT64_LIMITS[dtype.name]
    value: int | None
    if isinstance(nodata, (int, np.integer)):
        value = int(nodata)
    else:
        f = float(nodata)
        value = int(f) if math.isfinite(f) and f.is_integer() else None
    if value == hi + 1:  # float(hi) is hi + 1 for both types: the runtime's nodata is a double
        value = hi
    if value is None or not lo <= value <= hi:
        raise ValueError(f"{who}: nodata {nodata!r} cannot be the nodata of a {dtype} GeoTIFF: "
                         f"GDAL keeps a {dtype} raster's nodata as an integer from {lo} to {hi}, "
                         "and would mark other pixels; give such an integer, or None")
    return value


def _nodata_text(nodata: float | int) -> str:
    """``nodata`` (from :func:`_file_nodata`) as text GDAL reads back as the same value: an
    integer's digits, or the shortest text of the double that reads back as that double (signed
    zero, subnormals and the largest finite values included)."""
    if isinstance(nodata, int):
        return str(nodata)
    if math.isnan(nodata):
        return "nan"
    if math.isinf(nodata):
        return "inf" if nodata > 0 else "-inf"
    return repr(float(nodata))


def _vrt_xml(chunks: tuple[tuple[int, ...], ...], dtype: np.dtype, nodata: Any,
             affine: Sequence[float], crs: str | None, int8_as_byte: bool) -> str:
    esc = xml.sax.saxutils.escape
    band_chunks, row_chunks, col_chunks = chunks
    height, width = sum(row_chunks), sum(col_chunks)
    a, b, c, d, e, f = affine
    gdal_type = _GDAL_TYPES[dtype.name]
    if dtype.name == "int8" and int8_as_byte:
        gdal_type = "Byte"
    lines = [f'<VRTDataset rasterXSize="{width}" rasterYSize="{height}">']
    if crs:
        lines.append(f"  <SRS>{esc(crs)}</SRS>")
    lines.append(f"  <GeoTransform>{c!r}, {a!r}, {b!r}, {f!r}, {d!r}, {e!r}</GeoTransform>")
    band = 0
    for bi, nb in enumerate(band_chunks):
        b0 = sum(band_chunks[:bi])
        for k in range(nb):
            band += 1
            lines.append(f'  <VRTRasterBand dataType="{gdal_type}" band="{band}">')
            if dtype.name == "int8" and int8_as_byte:
                lines.append('    <Metadata domain="IMAGE_STRUCTURE"><MDI key="PIXELTYPE">'
                             "SIGNEDBYTE</MDI></Metadata>")
            if nodata is not None:
                lines.append(f"    <NoDataValue>{_nodata_text(nodata)}</NoDataValue>")
            r0 = 0
            for rh in row_chunks:
                c0 = 0
                for cw in col_chunks:
                    lines.append("    <SimpleSource>")
                    lines.append('      <SourceFilename relativeToVRT="1">'
                                 f"{esc(_part_name(b0, r0, c0))}</SourceFilename>")
                    lines.append(f"      <SourceBand>{k + 1}</SourceBand>")
                    lines.append(f'      <SrcRect xOff="0" yOff="0" xSize="{cw}" ySize="{rh}"/>')
                    lines.append(f'      <DstRect xOff="{c0}" yOff="{r0}" xSize="{cw}" '
                                 f'ySize="{rh}"/>')
                    lines.append("    </SimpleSource>")
                    c0 += cw
                r0 += rh
            lines.append("  </VRTRasterBand>")
    lines.append("</VRTDataset>")
    return "\n".join(lines) + "\n"


def _merge_parts(_stored: Any, parts_dir: str, out_path: str,
                 chunks: tuple[tuple[int, ...], ...], dtype: np.dtype, nodata: Any,
                 affine: tuple[float, ...], crs: str | None, compress: str | None,
                 tiled: bool, blocksize: int) -> RasterMetadata:
    """The parts of ``parts_dir`` as one GeoTIFF at ``out_path``: a VRT over them streamed
    through ``process_raster_streamed`` one chunk-sized tile at a time; the parts are removed."""
    vrt = os.path.join(parts_dir, "parts.vrt")
    try:
        for int8_as_byte in ((False, True) if dtype.name == "int8" else (False,)):
            with open(vrt, "w", encoding="utf-8") as fh:
                fh.write(_vrt_xml(chunks, dtype, nodata, affine, crs, int8_as_byte))
            try:
                # Our own VRT over our own parts: the one input a virtual format is allowed for.
                meta = _io.read_raster_metadata(vrt, allow_virtual=True)
            except (ValueError, RuntimeError):
                if int8_as_byte or dtype.name != "int8":
                    raise
                continue  # a GDAL before 3.7 knows no Int8: signed bytes are Byte there
            if np.dtype(meta.dtype) == dtype:
                break
        th, tw = chunks[1][0], chunks[2][0]
        n_tiles = math.ceil(sum(chunks[1]) / th) * math.ceil(sum(chunks[2]) / tw)
        plan = RasterPlan(TilingStrategy.TILED, (th, tw), 0, n_tiles, 0, sum(chunks[0]), True)
        _io.process_raster_streamed(vrt, out_path, lambda tile: tile, plan, compress=compress,
                                    tiled=tiled, blockxsize=blocksize, blockysize=blocksize,
                                    allow_virtual=True)
    finally:
        shutil.rmtree(parts_dir, ignore_errors=True)
    return _io.read_raster_metadata(out_path)


def _probe_write(parts_dir: str, dtype: np.dtype, nodata: Any, affine: tuple[float, ...],
                 crs: str | None, compress: str | None, tiled: bool, blocksize: int) -> None:
    """One pixel written with the output's dtype, georeferencing and options, then removed: what
    GDAL refuses (an unknown ``compress``, a tile side that is not a multiple of 16, a CRS it
    does not understand) fails before the job, not after every chunk has been computed."""
    probe = os.path.join(parts_dir, "probe.tif")
    pixel = OwnedRasterArray.from_numpy(np.zeros((1, 1, 1), dtype), nodata=nodata,
                                        affine=affine, crs=crs)
    _io.write_raster(probe, pixel, compress=compress, tiled=tiled, blockxsize=blocksize,
                     blockysize=blocksize)
    os.remove(probe)


def _on_workers(client: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` on a worker (the file system the tasks see), or here without a client."""
    if client is None:
        return fn(*args)
    return client.submit(fn, *args, pure=False).result()


# A write's parts directory is ``<out>.parts-<12 hex digits>``; the process that called the write
# holds an exclusive flock on the directory's WRITER_LOCK file for as long as the write runs
# (made under another name, locked, then renamed, so the file never exists unlocked while its
# writer lives); the file names the writer's host. The kernel drops the lock when that process
# dies, however it dies, so a directory whose lock file can be locked from the writer's host was
# left by a writer that is gone. From another host a lock may not be seen (NFS mounted with
# local_lock=flock, some cluster file systems), and without a lock file (a writer whose process
# does not see the directory: another machine; one making it now) nothing can be said: such
# directories are reported, never removed.
_WRITER_LOCK = "writer.lock"


def _lock_record() -> bytes:
    return f"pid {os.getpid()} on {socket.gethostname()}\n".encode()


def _recorded_here(record: bytes) -> bool:
    """Whether a lock file's ``record`` names this host."""
    host = record.decode("utf-8", "replace").rstrip("\n").partition(" on ")[2]
    return host == socket.gethostname()


def _parts_dir_pattern(out_path: str) -> re.Pattern[str]:
    return re.compile(re.escape(os.path.basename(out_path)) + r"\.parts-[0-9a-f]{12}")


def _new_parts_dir(out_path: str) -> str:
    return f"{out_path}.parts-{uuid.uuid4().hex[:12]}"


def _remove_if_writer_gone(parts_dir: str) -> bool | None:
    """Removes ``parts_dir`` if its writer is gone: True when removed, False when its writer
    holds the lock (a live write: another process, or another thread of this one), None when
    it cannot tell (no lock file, a writer on another host, no flock here) or could not remove
    it."""
    if fcntl is None:
        return None
    try:
        fd = os.open(os.path.join(parts_dir, _WRITER_LOCK),
                     os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        except OSError:
            return None
        try:
            record = os.pread(fd, 4096, 0)
        except OSError:
            return None
        if not _recorded_here(record):
            return None
        shutil.rmtree(parts_dir, ignore_errors=True)  # the lock held: no other sweep races it
        return None if os.path.lexists(parts_dir) else True
    finally:
        os.close(fd)


def _sweep_parts_dirs(out_path: str) -> list[str]:
    """Removes the parts directories beside ``out_path`` that writes of ``out_path`` left when
    their process died (killed before it could clean up); returns those whose writer it cannot
    judge. Only real directories named as this module names them for ``out_path`` are looked
    at: a file or symbolic link of such a name, or another target's parts, are never touched."""
    parent = os.path.dirname(os.path.abspath(out_path))
    pattern = _parts_dir_pattern(out_path)
    unknown: list[str] = []
    try:
        names = sorted(os.listdir(parent))
    except OSError:
        return unknown
    for name in names:
        if not pattern.fullmatch(name):
            continue
        path = os.path.join(parent, name)
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                continue
        except OSError:
            continue  # removed meanwhile
        if _remove_if_writer_gone(path) is None and os.path.lexists(path):
            unknown.append(path)  # (not one another sweep removed meanwhile)
    return unknown


def _make_parts_dir(parts_dir: str, out_path: str) -> list[str]:
    """Makes ``parts_dir`` beside ``out_path``, first removing the parts directories that dead
    writes of ``out_path`` left; returns the leftovers it could not judge (see
    :func:`_sweep_parts_dirs`). FileNotFoundError when the output's directory does not exist
    (it is never made: a mistyped path must not become a directory tree)."""
    _check_out_dir(out_path)
    unknown = _sweep_parts_dirs(out_path)
    os.mkdir(parts_dir)
    return unknown


def _hold_writer_lock(parts_dir: str) -> int | None:
    """Makes ``parts_dir``'s lock file, locked by this process; returns its descriptor (close
    it once the parts directory is gone), or None when this process cannot (it does not see the
    directory: the workers run on another machine; or the file system has no flock)."""
    if fcntl is None:
        return None
    tmp = os.path.join(parts_dir, f".{_WRITER_LOCK}.{uuid.uuid4().hex[:12]}")
    try:
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, _lock_record())
        os.rename(tmp, os.path.join(parts_dir, _WRITER_LOCK))
    except OSError:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.remove(tmp)
        return None
    return fd


def _check_out_dir(out_path: str) -> None:
    parent = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(parent):
        raise FileNotFoundError(errno.ENOENT, "the output's directory does not exist", parent)


def _same_file(a: str, b: str) -> bool:
    if os.path.abspath(a) == os.path.abspath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False  # one of them does not exist


def _read_paths(data: Any) -> list[str]:
    """The paths of the :class:`_WindowReader` objects in ``data``'s Dask graph: the files
    :func:`read_raster` reads for it (through any operation on its result). The graph's layers
    are walked without materializing blockwise ones (their literal arguments and task are
    looked at); files read by other means are not found."""
    nodes: tuple[type, ...] = ()
    try:
        from dask._task_spec import GraphNode

        nodes = (GraphNode,)
    except ImportError:  # a Dask of tuple tasks: the tuples are walked
        pass
    from dask.blockwise import Blockwise

    found: dict[str, None] = {}
    seen: set[int] = set()

    def visit(obj: Any, depth: int) -> None:
        if isinstance(obj, _WindowReader):
            found[obj.path] = None
            return
        if depth > 32 or id(obj) in seen or isinstance(obj, (str, bytes, np.ndarray)):
            return
        if isinstance(obj, (tuple, list, set, frozenset)):
            seen.add(id(obj))
            for v in obj:
                visit(v, depth + 1)
        elif isinstance(obj, dict):
            seen.add(id(obj))
            for v in obj.values():
                visit(v, depth + 1)
        elif isinstance(obj, functools.partial):
            visit((obj.func, obj.args, obj.keywords), depth + 1)
        elif isinstance(obj, nodes):
            seen.add(id(obj))
            for attr in ("value", "func", "args", "kwargs", "target"):
                visit(getattr(obj, attr, None), depth + 1)

    graph = data.__dask_graph__()
    for layer in getattr(graph, "layers", {"": graph}).values():
        if isinstance(layer, Blockwise):
            visit(tuple(layer.indices), 0)
            visit(getattr(layer, "task", None), 0)
            visit(getattr(layer, "dsk", None), 0)
        else:
            for task in layer.values():
                visit(task, 0)
    return list(found)


def _first_same_file(paths: Sequence[str], path: str) -> str | None:
    return next((p for p in paths if _same_file(p, path)), None)


def _run_with_progress(graph: Any, progress: bool, client: Any) -> Any:
    client = _client_or_none(client)
    if client is not None:
        future = client.compute(graph)
        if progress:
            distributed.progress(future, notebook=False)
        return future.result()
    if progress:
        from dask.diagnostics import ProgressBar

        with ProgressBar():
            return dask.compute(graph)[0]
    return dask.compute(graph)[0]


def write_raster(array: Any, path: str | os.PathLike, *, nodata: Any = _UNSET,
                 affine: Any = None, crs: Any = None, compress: str | None = "deflate",
                 tiled: bool = True, blocksize: int = 256, progress: bool = False,
                 client: Any = None) -> RasterMetadata:
    """Compute ``array`` (Dask array (bands, height, width) or (height, width), or a
    DataArray) and write it as one GeoTIFF at ``path``; returns the written file's metadata.

    Each task writes its chunk to a part file beside ``path`` (``<path>.parts-<id>/``, removed
    at the end), so the chunks are computed and written in parallel; one last task streams the
    parts into ``path`` through a GDAL VRT, one chunk-sized tile at a time (compressed as
    ``compress``, tiled ``blocksize`` square). ``progress=True`` shows Dask's progress bar
    (``distributed.progress`` with a client, else ``dask.diagnostics.ProgressBar``).
    Georeferencing and the check of ``nodata`` as :func:`map_bands`; the file's nodata is the
    value given, exactly (a 64-bit integer one too).

    A write whose process is killed (SIGKILL, a lost machine) leaves its parts directory. The
    next write of ``path`` removes those whose writer is known to be gone (the calling process
    holds a lock on its parts directory while it lives) and warns (RuntimeWarning), naming them,
    about those it cannot judge: a writer whose process does not see the workers' files (another
    machine), a leftover of an older version. Parts of a live write are never removed.

    ``path`` must not be a file ``array`` reads: the files of the :func:`read_raster` calls
    in its Dask graph (through any operations on their results; also under another name or a
    hard link) are refused. A file read into the array by other means (``da.from_delayed``,
    another reader) is not recognised; a persisted array no longer reads its file.

    Raises:
        ValueError: ``path`` is a file the array reads (see above); FileNotFoundError:
        ``path``'s directory does not exist (it is not made); TypeError / ValueError: a
        ``nodata`` :func:`map_bands` refuses, or a nodata the GeoTIFF would keep as another value
        that marks real pixels (for a 64-bit integer dtype, anything but an integer of its
        range; for float32, a finite value beyond its range: 1e300 would be inf, 1e-50 zero);
        all before any work. ValueError /
        RuntimeError: what :func:`vibespatial_raster.io.write_raster` and GDAL raise; whatever
        computing ``array`` raises.
    """
    _, data, aff, crs_text, nodata = _prepare("write_raster", array, nodata, affine, crs)
    p, c = os.fspath(path), _client_or_none(client)
    # Before any work, as process_geotiff: a file the array reads is never replaced.
    read = _read_paths(data)
    same = _on_workers(c, _first_same_file, read, p) if read else None
    if same is not None:
        raise ValueError(f"write_raster: path {p!r} is the input file {same!r}: write the "
                         "result to another path (the input is never replaced)")
    return _write(data, p, who="write_raster", nodata=nodata, affine=aff, crs=crs_text,
                  compress=compress, tiled=tiled, blocksize=blocksize, progress=progress,
                  client=c)


def _write(data: Any, path: str, *, who: str, nodata: Any, affine: tuple[float, ...],
           crs: str | None, compress: str | None, tiled: bool, blocksize: int, progress: bool,
           client: Any) -> RasterMetadata:
    if data.ndim == 2:
        data = data[np.newaxis]
    nodata = _file_nodata(who, nodata, np.dtype(data.dtype))
    client = _client_or_none(client)
    parts_dir = _new_parts_dir(path)
    # Made and removed where the tasks run: a task still running after a failure finds no
    # directory to write into.
    unknown = _on_workers(client, _make_parts_dir, parts_dir, path)
    lock_fd = None
    try:
        lock_fd = _hold_writer_lock(parts_dir)
        if unknown:
            warnings.warn(f"{who}: {len(unknown)} parts directories beside {path!r} were left "
                          "by writes of this path whose process cannot be checked from here "
                          "(another machine, or an older version of this package); remove them "
                          f"once no such write runs: {', '.join(unknown)}", RuntimeWarning,
                          stacklevel=3)
        target = _PartWriter(parts_dir, nodata, affine, crs)
        stored = da.store(data, cast(Any, target), lock=False, compute=False)
        merged = dask.delayed(_merge_parts, pure=False)(
            stored, parts_dir, path, data.chunks, np.dtype(data.dtype), nodata, affine, crs,
            compress, bool(tiled), int(blocksize))
        _on_workers(client, _probe_write, parts_dir, np.dtype(data.dtype), nodata, affine, crs,
                    compress, bool(tiled), int(blocksize))
        return _run_with_progress(merged, progress, client)
    except BaseException:
        _on_workers(client, shutil.rmtree, parts_dir, True)  # a failed job leaves no parts
        raise
    finally:
        # Only now that the parts directory is gone: a directory of a released lock is removed
        # by the next write of this path.
        if lock_fd is not None:
            os.close(lock_fd)


def process_geotiff(in_path: str | os.PathLike, out_path: str | os.PathLike, op: BandOp, *,
                    kind: str = "tiles", halo: int = 0, device: str = "auto",
                    per_band: bool | None = None, buffers_per_band: int = 2,
                    scratch_bytes: int = 0, chunks: Any = None, compress: str | None = "deflate",
                    tiled: bool = True, blocksize: int = 256, progress: bool = True,
                    client: Any = None) -> RasterMetadata:
    """The streaming job: read ``in_path`` in windows in parallel, apply ``op`` and write one
    GeoTIFF at ``out_path``; returns the output's metadata.

    ``kind="tiles"``: :func:`map_tiles` with ``halo`` (``per_band`` default False);
    ``kind="bands"``: :func:`map_bands`. ``chunks`` (default: planned for the workers'
    smallest budget and the file's tiles) as :func:`read_raster`; with ``kind="bands"`` only
    their band chunks count (each chunk holds whole bands). The output takes the op's
    dtype, band count and nodata and the input's size, affine and CRS (as
    :func:`vibespatial_raster.io.process_raster_streamed`); it is written as :func:`write_raster`
    writes, with Dask's progress bar unless ``progress=False``.

    Raises:
        ValueError: ``out_path`` is the input file (also through another name or a hard link:
        the input is never replaced), a bad ``kind`` or argument; TypeError / ValueError:
        ``chunks`` as :func:`read_raster` says; FileNotFoundError: the
        output's directory does not exist; both before any work. What :func:`read_raster`,
        :func:`map_tiles` / :func:`map_bands` and :func:`write_raster` raise.
    """
    if kind not in ("tiles", "bands"):
        raise ValueError(f"kind must be 'tiles' or 'bands', not {kind!r}")
    p_in, p_out = os.fspath(in_path), os.fspath(out_path)
    c = _client_or_none(client)
    # Before any work: the input is never replaced (not even by its own result), and a
    # mistyped output directory fails now, not after the whole job.
    if _on_workers(c, _same_file, p_in, p_out):
        raise ValueError(f"process_geotiff: out_path {p_out!r} is the input file {p_in!r}: "
                         "write the result to another path (the input is never replaced)")
    _on_workers(c, _check_out_dir, p_out)
    meta = _metadata(p_in, c)
    if chunks is not None:
        chunks = _dask_chunks("process_geotiff", chunks,
                              (meta.band_count, meta.height, meta.width), np.dtype(meta.dtype))
    if kind == "bands":
        if halo:
            raise ValueError("kind='bands' processes whole bands: no halo")
        band_plan = chunk_plan(meta, buffers_per_band=buffers_per_band,
                               scratch_bytes=scratch_bytes, client=client, per_band=True)
        if band_plan.plan.strategy is TilingStrategy.TILED:
            raise ValueError(f"process_geotiff: one whole band does not fit the smallest worker "
                             f"budget ({band_plan.budget} bytes); use kind='tiles'")
        bpc = max(band_plan.chunks[0] if chunks is None else chunks[0])
        chunks = (_split(meta.band_count, bpc, 0), (meta.height,), (meta.width,))
        per_band = True
    elif per_band is None:
        per_band = False
    arr = read_raster(p_in, chunks=chunks, buffers_per_band=buffers_per_band, halo=halo,
                      scratch_bytes=scratch_bytes, per_band=per_band, client=client)
    affine, crs = _affine6(meta.affine), _crs_text(meta.crs)
    result, info = _map(arr, op, who="process_geotiff", halo=halo if kind == "tiles" else 0,
                        each_band=kind == "bands", per_band=per_band,
                        chunks=None, nodata=meta.nodata, affine=affine, crs=crs, device=device,
                        buffers_per_band=buffers_per_band, scratch_bytes=scratch_bytes,
                        client=c)
    return _write(result, p_out, who="process_geotiff", nodata=info.nodata, affine=affine,
                  crs=crs, compress=compress, tiled=tiled, blocksize=blocksize,
                  progress=progress, client=c)
