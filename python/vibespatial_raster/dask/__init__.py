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
- :func:`map_pipeline`: an ``ops.Pipeline`` over one or more Dask arrays, one chain per chunk,
  each chunk read once with the chain's total halo; equal to the chain run whole.
- :func:`read_raster`, :func:`write_raster`, :func:`process_geotiff`: a raster file as a Dask
  array of windows read in parallel, a Dask array written as one GeoTIFF (each task writes its
  chunk to a part file, then one task merges the parts into the file, all or nothing, with the
  library's part merge), and the two joined around an op.

Where a task runs its op (``device=``): ``"auto"`` runs it on the worker's GPU when the worker
has a real driver and the package was built with the CUDA ops, and on the CPU (host ops)
otherwise, as ``vsr-run`` does; ``"gpu"`` always stages the chunk through the device (pool
memory; on the driver emulator the op must then accept device rasters); ``"cpu"`` never.

Files are opened by the workers: paths must name the same file on every worker (one machine,
or a shared file system).
"""

from __future__ import annotations

import sys
import types

from . import _placement
from ._block import BandOp
from ._chunks import ChunkPlan, chunk_plan, plan_chunks
from ._files import process_geotiff, read_raster, write_raster
from ._map import map_bands, map_tiles
from ._pipeline import map_pipeline
from ._plugin import PoolPlugin, available_vram_bytes, free_pool_memory, memory_pool_stats, register

# Private names reached here (by the tests) since this package was one module: the chunk split
# and the placement decision for device="auto" (whose kept value is _auto_mode, below).
from ._chunks import _split  # noqa: F401
from ._placement import _process_mode  # noqa: F401

__all__ = [
    "ChunkPlan",
    "PoolPlugin",
    "available_vram_bytes",
    "chunk_plan",
    "free_pool_memory",
    "map_bands",
    "map_pipeline",
    "map_tiles",
    "memory_pool_stats",
    "plan_chunks",
    "process_geotiff",
    "read_raster",
    "register",
    "write_raster",
]


class _Module(types.ModuleType):
    """This package's module: ``_auto_mode`` reads and sets the decision :mod:`._placement`
    keeps for ``device="auto"`` (None: decide again), so that it is one value however it is
    reached."""

    @property
    def _auto_mode(self) -> str | None:
        return _placement._auto_mode

    @_auto_mode.setter
    def _auto_mode(self, value: str | None) -> None:
        _placement._auto_mode = value


sys.modules[__name__].__class__ = _Module
