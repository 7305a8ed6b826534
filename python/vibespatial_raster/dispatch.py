# SPDX-License-Identifier: Apache-2.0
"""VRAM budget, planning and per-band dispatch: the seed's ``vibespatial.raster.dispatch``.

All of it runs in the C++ library (the GIL is released while it works):

- :func:`available_vram_bytes`: (driver free + free memory the pool holds) * 0.85; 0 with no GPU.
- :func:`max_bands_for_budget`: how many bands fit at once (always at least 1).
- :func:`analyze_raster_plan` / :func:`plan_from_metadata`: the Python original's planner (same
  strategies, tile shapes, tile counts and estimates), plus ``fits_budget`` and, with
  ``per_band=True``, the ``band_batches`` strategy.
- :func:`dispatch_per_band_cpu` / :func:`dispatch_per_band_gpu`: apply a Python callable to each
  band and stack the results with the source's georeferencing. The GPU dispatcher never asks the
  device for more than the budget: bands that do not fit together go through in batches.

``dtype`` arguments accept anything ``numpy.dtype()`` accepts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from . import _core
from ._dtypes import planning_dtype
from ._ints import integer
from .buffers import OwnedRasterArray, RasterMetadata, RasterPlan

__all__ = [
    "analyze_raster_plan",
    "available_vram_bytes",
    "dispatch_per_band_cpu",
    "dispatch_per_band_gpu",
    "max_bands_for_budget",
    "plan_from_metadata",
    "usable_vram_budget",
]

BandOp = Callable[[OwnedRasterArray], OwnedRasterArray]

#: The share of device memory :func:`available_vram_bytes` leaves out (as the Python original).
_VRAM_HEADROOM_FRACTION = 0.15


def _non_negative(name: str, value: Any) -> int:
    v = integer(name, value)
    if v < 0:
        raise ValueError(f"{name} must be >= 0, not {v}")
    return v


def _budget(vram_budget: Any) -> int:
    """None: this module's :func:`available_vram_bytes` (looked up at call time, so a test may
    patch it, as the Python original's tests do); a budget <= 0 means no GPU, as there."""
    if vram_budget is None:
        return max(0, integer("available_vram_bytes()", available_vram_bytes()))
    return max(0, integer("vram_budget", vram_budget))


def available_vram_bytes() -> int:
    """Return the effective available VRAM in bytes after headroom.

    (driver free + free bytes the pool holds) * 0.85, leaving 15% for the driver, fragmentation
    and concurrent allocations. Returns 0 when there is no usable driver or device, so it is
    safe to call on CPU-only machines. Never raises.
    """
    return _core.available_vram_bytes()


def usable_vram_budget(vram_budget: int) -> int:
    """The part of a budget the planner fills: floor(budget * 0.7), as the Python original."""
    return _core.usable_vram_budget(max(0, integer("vram_budget", vram_budget)))


def max_bands_for_budget(height: int, width: int, dtype: Any, buffers_per_band: int = 2,
                         scratch_bytes: int = 0, *, vram_budget: int | None = None) -> int:
    """Compute how many raster bands fit in available VRAM.

    ``max(1, (budget - scratch_bytes) // (height * width * itemsize * buffers_per_band))``, where
    the budget is ``vram_budget`` (ours) or :func:`available_vram_bytes`. Always at least 1, so a
    single-band fallback is always possible.

    Raises:
        ValueError: height or width <= 0, buffers_per_band < 1, scratch_bytes < 0;
        TypeError: a non-integer size or an unknown dtype; OverflowError: the per-band size
        exceeds 64 bits.
    """
    name, multiplier = planning_dtype(dtype)
    buffers = integer("buffers_per_band", buffers_per_band)
    if buffers < 1:
        raise ValueError(f"buffers_per_band must be >= 1, not {buffers}")
    return _core.max_bands_for_budget(integer("height", height), integer("width", width), name,
                                      buffers * multiplier,
                                      _non_negative("scratch_bytes", scratch_bytes),
                                      _budget(vram_budget))


def analyze_raster_plan(height: int, width: int, dtype: Any, *, band_count: int = 1,
                        buffers_per_band: int = 2, scratch_bytes: int = 0, halo: int = 0,
                        vram_budget: int | None = None, per_band: bool = False) -> RasterPlan:
    """Decide the processing strategy for a raster given VRAM constraints.

    With budget = ``vram_budget`` (None: :func:`available_vram_bytes`) and usable = 70% of it:
    budget 0 (no GPU) -> WHOLE with estimate 0; everything fits -> WHOLE; otherwise TILED with
    all bands per tile: tiles start at min(4096, H) x min(4096, W) rounded down to multiples of
    256, and the larger side is halved (aligned to 256) until a tile with its halo plus
    ``scratch_bytes`` fits. This is the Python original's algorithm, with the same results.
    Ours: ``fits_budget`` is False when even 256 x 256 tiles exceed the budget, and
    ``per_band=True`` (bands independent) chooses BAND_BATCHES when one band fits.

    Raises:
        ValueError: height or width <= 0, band_count < 1, buffers_per_band < 1, halo < 0,
        scratch_bytes < 0; TypeError: a non-integer size or an unknown dtype; OverflowError: a
        byte count exceeds 64 bits.
    """
    name, multiplier = planning_dtype(dtype)
    buffers = integer("buffers_per_band", buffers_per_band)
    if buffers < 1:
        raise ValueError(f"buffers_per_band must be >= 1, not {buffers}")
    return RasterPlan._from_core(_core.analyze_raster_plan(
        integer("height", height), integer("width", width), name, integer("band_count", band_count),
        buffers * multiplier, _non_negative("scratch_bytes", scratch_bytes), integer("halo", halo),
        _budget(vram_budget), bool(per_band)))


def plan_from_metadata(metadata: RasterMetadata, *, buffers_per_band: int = 2,
                       scratch_bytes: int = 0, halo: int = 0, vram_budget: int | None = None,
                       per_band: bool = False) -> RasterPlan:
    """:func:`analyze_raster_plan` with the height, width, dtype and band count of ``metadata``
    (from ``io.read_raster_metadata`` or ``raster.metadata``), so a plan can be made before any
    pixel is read."""
    if not isinstance(metadata, RasterMetadata):
        raise TypeError(f"plan_from_metadata: expected a RasterMetadata, not "
                        f"{type(metadata).__name__}")
    name, multiplier = planning_dtype(metadata.dtype)
    buffers = integer("buffers_per_band", buffers_per_band)
    if buffers < 1:
        raise ValueError(f"buffers_per_band must be >= 1, not {buffers}")
    return RasterPlan._from_core(_core.plan_from_metadata(
        integer("height", metadata.height), integer("width", metadata.width),
        integer("band_count", metadata.band_count), name, buffers * multiplier,
        _non_negative("scratch_bytes", scratch_bytes), integer("halo", halo), _budget(vram_budget),
        bool(per_band)))


def _adapter(op_fn: BandOp, *, crs: Any, two_d: bool) -> Callable[[Any], Any]:
    """Wraps a Python band op for the library: native band in, native result out."""
    if not callable(op_fn):
        raise TypeError(f"op_fn must be callable, not {type(op_fn).__name__}")

    def call(native_band: Any) -> Any:
        result = op_fn(OwnedRasterArray._wrap(native_band, crs=crs, two_d=two_d))
        if not isinstance(result, OwnedRasterArray):
            raise TypeError(f"op_fn must return an OwnedRasterArray, not "
                            f"{type(result).__name__}")
        return result._as_native()

    return call


def _check_raster(raster: Any) -> None:
    if not isinstance(raster, OwnedRasterArray):
        raise TypeError(f"expected an OwnedRasterArray, not {type(raster).__name__}")


def _passthrough(who: str, raster: OwnedRasterArray, op_fn: BandOp) -> OwnedRasterArray:
    """The single-band path: ``op_fn(raster)`` as is, with a RUNTIME event on the result."""
    if not callable(op_fn):
        raise TypeError(f"op_fn must be callable, not {type(op_fn).__name__}")
    start = time.perf_counter()
    result = op_fn(raster)
    if not isinstance(result, OwnedRasterArray):
        raise TypeError(f"op_fn must return an OwnedRasterArray, not {type(result).__name__}")
    elapsed = time.perf_counter() - start
    result._record("runtime", f"{who} single-band passthrough elapsed={elapsed:.4f}s", elapsed)
    return result


def dispatch_per_band_cpu(raster: OwnedRasterArray, op_fn: BandOp) -> OwnedRasterArray:
    """Apply ``op_fn`` to each band of ``raster`` on the CPU, then reassemble.

    A single-band raster is passed through: ``op_fn(raster)`` is returned as is. Otherwise each
    band goes to ``op_fn`` as a host-resident single-band OwnedRasterArray (a zero-copy view;
    a device raster is first copied, not moved), and the results are stacked with
    :meth:`OwnedRasterArray.from_band_stack` (the source's affine, CRS and nodata).

    ``op_fn`` runs on the library's worker threads (up to 8, each taking the GIL for the call),
    so Python code that releases the GIL (NumPy on large arrays) overlaps across bands.

    The result's :attr:`~OwnedRasterArray.diagnostics` end with a RUNTIME event naming the
    executor and its path: "dispatch_per_band_cpu single-band passthrough elapsed=...s", or
    "dispatch_per_band_cpu bands=B shape=(H, W) threads=N elapsed=...s".

    Raises:
        TypeError: ``op_fn`` is not callable or returns something other than an
        OwnedRasterArray; ValueError: results of differing dtype, nodata or shape; whatever
        ``op_fn`` raises (the first, once every worker has stopped).
    """
    _check_raster(raster)
    if raster.band_count == 1:
        return _passthrough("dispatch_per_band_cpu", raster, op_fn)
    native = _core.dispatch_per_band_cpu(raster._as_native(),
                                         _adapter(op_fn, crs=raster._crs_obj, two_d=True))
    return OwnedRasterArray._wrap(native, crs=raster._crs_obj)


def dispatch_per_band_gpu(raster: OwnedRasterArray, op_fn: BandOp, *, buffers_per_band: int = 2,
                          scratch_bytes: int = 0) -> OwnedRasterArray:
    """Apply ``op_fn`` to each band of ``raster`` on the GPU, then reassemble.

    A single-band raster is passed through: ``op_fn(raster)`` is returned as is (no driver
    needed). Otherwise each band goes to ``op_fn`` as a device-resident single-band view
    (zero-copy; ``band.device_data()`` is a CuPy array when CuPy is imported), called in band
    order on the calling thread; it returns a single-band raster on the device
    (``OwnedRasterArray.from_device(...)``) or the host. Results are stacked with the source's
    georeferencing.

    Unlike the Python original, the bands go to the device within the VRAM budget
    (:func:`available_vram_bytes`): ``buffers_per_band`` and ``scratch_bytes`` declare what
    ``op_fn`` needs per band, and bands that do not fit together go through in batches, the next
    batch copied while ``op_fn`` works on the current one. The result's diagnostics end with a
    RUNTIME event: "dispatch_per_band_gpu single-band passthrough ...", or
    "dispatch_per_band_gpu bands=B shape=(H, W) batches=P bands_per_pass=N pipeline_depth=D ...".

    Raises:
        DriverUnavailableError: no usable driver (several bands); RuntimeError: not even one
        band fits the budget (use a tiled plan); TypeError / ValueError as
        :func:`dispatch_per_band_cpu`; OutOfMemoryError / CudaError from the device.
    """
    _check_raster(raster)
    if raster.band_count == 1:
        return _passthrough("dispatch_per_band_gpu", raster, op_fn)
    buffers = integer("buffers_per_band", buffers_per_band)
    native = _core.dispatch_per_band_gpu(raster._as_native(),
                                         _adapter(op_fn, crs=raster._crs_obj, two_d=True),
                                         buffers, _non_negative("scratch_bytes", scratch_bytes))
    return OwnedRasterArray._wrap(native, crs=raster._crs_obj,
                                  device_id=_core.memory_pool_stats()["device"])
