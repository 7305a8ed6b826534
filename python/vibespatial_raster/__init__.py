# SPDX-License-Identifier: Apache-2.0
"""vibespatial-raster for Python: a device memory pool on the CUDA driver's VMM API and
VRAM-budgeted raster dispatch, with the API of the Python original (``vibespatial.raster``).

Modules (the original's names; a script written for ``vibespatial.raster.memory`` /
``vibespatial.raster.dispatch`` runs after changing only its imports):

- :mod:`vibespatial_raster.memory`: the pool (``configure_memory_pool``, ``free_pool_memory``,
  ``memory_pool_stats``, OOM handlers).
- :mod:`vibespatial_raster.dispatch`: budget, planner, per-band dispatch.
- :mod:`vibespatial_raster.buffers`: ``OwnedRasterArray``, ``RasterPlan``, ``RasterMetadata``,
  ``TilingStrategy``, ``Residency``, the factories ``from_numpy`` / ``from_device`` and the
  diagnostic types (``RasterDiagnosticKind``, ``RasterDiagnosticEvent``).
- :mod:`vibespatial_raster.ops`: band operations; :mod:`vibespatial_raster.io`: GDAL files;
  :mod:`vibespatial_raster.tiling`: tiled executors.
- :mod:`vibespatial_raster.allocators`: the pool as CuPy's, PyTorch's and Numba's allocator.
- :mod:`vibespatial_raster.testing`: the host driver emulator, for tests without a GPU.
"""

from __future__ import annotations

from . import _core
from ._errors import CudaError, DriverUnavailableError, OutOfMemoryError
from . import allocators, buffers, dispatch, io, memory, ops, tiling
from .buffers import OwnedRasterArray, RasterMetadata, RasterPlan, Residency, TilingStrategy

__version__: str = _core.__version__

__all__ = [
    "CudaError",
    "DriverUnavailableError",
    "OutOfMemoryError",
    "OwnedRasterArray",
    "RasterMetadata",
    "RasterPlan",
    "Residency",
    "TilingStrategy",
    "__version__",
    "allocators",
    "buffers",
    "dispatch",
    "driver_info",
    "io",
    "memory",
    "ops",
    "tiling",
]


def driver_info() -> dict:
    """The CUDA driver the runtime loaded (or why it could not): ``available``, ``library``,
    ``reason``, ``emulated``, ``driver_version`` and ``devices`` (name, compute capability, VMM
    and managed-memory support, granularity, free/total bytes). Never raises."""
    return _core.driver_info()
