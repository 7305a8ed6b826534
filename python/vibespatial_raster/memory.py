# SPDX-License-Identifier: Apache-2.0
"""The device memory pool: the seed's ``vibespatial.raster.memory`` on the native runtime.

The pool is the C++ library's (tiers A/B/C/fallback on the CUDA driver's virtual memory API);
see the project README for the tiers. Everything here is thread-safe.

Tier selection, first match wins (seed order):

======== ================================= =========================================
tier     when                              behaviour
======== ================================= =========================================
C        ``VIBESPATIAL_GPU_MANAGED_MEMORY=1`` bare managed memory per request
A        ``VIBESPATIAL_GPU_POOL_ONLY=1``      the pool, no OOM recovery
B        default, device supports VMM      the pool with the OOM recovery chain
fallback device without VMM                a caching pool over ``cuMemAlloc``
======== ================================= =========================================

The pool keeps some slack so that a steady mix of large sizes stops remapping pages: by default
up to a tenth of the peak of live large blocks while the device has room, less as it fills, none
on a full device (slack is what goes back first when memory runs short).
``VIBESPATIAL_GPU_POOL_RESERVE`` (tiers A/B) overrides it with a decimal fraction from 0 (always
tight) to 1; ``auto`` or unset is the adaptive default (docs/memory-pool.md has the figures).

Unlike the Python original, :func:`free_pool_memory` is safe with live allocations, and the
pool serves CuPy, PyTorch and Numba too (:mod:`vibespatial_raster.allocators`).
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable

from . import _core
from ._ints import integer

__all__ = [
    "DeviceBuffer",
    "add_oom_handler",
    "configure_memory_pool",
    "forget_stream",
    "free_pool_memory",
    "memory_pool_stats",
    "remove_oom_handler",
]

#: Device memory from the pool: ``DeviceBuffer(size, stream=0)`` allocates ``size`` bytes
#: stream-ordered on ``stream`` (a CUstream value; 0 is the legacy default stream); ``ptr``,
#: ``size``, ``stream``; ``close()`` (or garbage collection) frees it on that stream.
DeviceBuffer = _core.DeviceBuffer


def configure_memory_pool() -> str:
    """Configure the GPU memory pool. Returns the tier name ("A", "B", "C" or "fallback").

    Idempotent: later calls return the tier chosen first. Called lazily by the first device
    allocation, so calling it is optional.

    Raises:
        DriverUnavailableError: no usable CUDA driver or device. Nothing is cached: a later
            call (this, or any that needs the driver) starts the driver again (cuInit and the
            device count again; a library that could not be loaded is looked for again), so a
            first start that failed does not doom the process. A library that loaded but lacks
            a required entry point stays refused.
        CudaError: the requested tier is impossible, e.g. ``VIBESPATIAL_GPU_MANAGED_MEMORY=1`` on
            a device without managed memory (``CUDA_ERROR_NOT_SUPPORTED``).
    """
    return _core.configure_memory_pool()


def free_pool_memory() -> None:
    """Release unused memory back to the driver.

    Gives every free physical page of every device's pool back (after the stream work that
    freed it completes). Live allocations stay where they are, with their contents, so unlike
    the Python original this is safe to call at any time. Tier C: no-op. Fallback: frees the
    cached blocks. No-op before the pool is configured.

    Raises:
        CudaError: the driver failed; the pool stays consistent and usable.
    """
    _core.free_pool_memory()


def forget_stream(stream: int) -> None:
    """Tell the pool that ``stream`` (a CUstream value) is about to be destroyed.

    Call it after the last free on ``stream`` and before destroying the stream, while it is still
    alive. CUDA hands a destroyed stream's handle value to later streams; without this call the
    pool could treat a new stream with that value as the old one and give it blocks that the old
    stream's queued work still writes. Afterwards blocks freed on ``stream`` are reusable on any
    stream once the work queued on ``stream`` so far has completed. ``0`` (the legacy default
    stream): a no-op; ``2`` (``CU_STREAM_PER_THREAD``): the calling thread's per-thread stream.
    A no-op before the pool is configured. Thread-safe; may be called again.

    Raises:
        CudaError: the pool could not record a mark on ``stream`` (e.g. it was already
            destroyed); a later call may retry.
    """
    _core.forget_stream(stream)


def memory_pool_stats(device: int | None = None) -> dict:
    """Return current pool statistics (of the current device, or of ``device``).

    Keys always present: ``tier`` ("A", "B", "C", "fallback", or "" if not yet configured) and
    ``configured``. Tiers A/B/C: ``current_bytes``, ``current_count``, ``peak_bytes``,
    ``peak_count``, ``total_bytes``, ``total_count``, and ``pool_size`` (A/B only). Fallback:
    ``used_bytes``, ``free_bytes``, ``total_bytes`` (used + free). Byte counts of live memory are
    the sizes requested.

    Additions, always present: ``device``, ``mapped_bytes``, ``reserved_bytes``,
    ``pool_free_bytes`` (what :func:`free_pool_memory` would give back), ``largest_free_block``,
    ``oom_recoveries``, ``granularity``, ``small_block_limit``, ``tier_reason`` (why the device
    has its tier, in words, e.g. that its VMM self-test failed; "" before configuration).

    Without ``device`` it never raises, and works before configuration and without a driver.
    A ``device`` the process does not have is refused, as the C ABI refuses it
    (``vsr_memory_pool_stats_device``: ``VSR_ERROR_OUT_OF_RANGE``): a negative one, one beyond
    the pool's limit of 64 devices, and, once the pool is configured, one at or beyond the
    driver's device count. (Before configuration the driver's devices are not known yet: a
    device from 0 to 63 gets the unconfigured snapshot.)

    Raises:
        ValueError: ``device`` does not exist (the message names it and the devices there are).
        TypeError: ``device`` is not an integer (a bool, float or str).
    """
    if device is None:
        return _core.memory_pool_stats(None)
    return _core.memory_pool_stats(integer("memory_pool_stats: device", device))


_handlers_lock = threading.Lock()
_handler_ids: set[int] = set()


def add_oom_handler(handler: Callable[[int], object]) -> int:
    """Register ``handler`` to run when the device is full (tier B's recovery chain).

    It is called as ``handler(requested_bytes)`` from whichever thread allocates, and returns a
    true value if it freed something (for instance ``lambda n: gc.collect() > 0``, the Python
    original's recovery). The pool holds none of its locks while handlers run, so a handler may
    free device memory, and allocate: an allocation of its own that finds the device full fails
    at once (OutOfMemoryError) instead of running the handlers again. That holds on the
    handler's thread only: a handler must not wait for another thread's allocation that can find
    the device full, since that allocation runs the handlers (this one too) again, without end.

    An ``Exception`` in a handler is reported through ``sys.unraisablehook`` and counts as
    having freed nothing. Any other ``BaseException`` (``KeyboardInterrupt`` from Ctrl-C,
    ``SystemExit``, ``GeneratorExit``) stops the recovery and comes out of the allocating call
    as it was raised; the pool and the handlers stay as they were. While the interpreter exits,
    handlers are not called (they count as having freed nothing).

    Returns:
        the handler's id, for :func:`remove_oom_handler` (never 0).
    Raises:
        TypeError: ``handler`` is not callable.
    """
    if not callable(handler):
        raise TypeError(f"add_oom_handler: {handler!r} is not callable")
    handler_id = _core.add_oom_handler(handler)
    with _handlers_lock:
        _handler_ids.add(handler_id)
    return handler_id


def remove_oom_handler(handler_id: int) -> None:
    """Unregister the handler with id ``handler_id``; unknown ids are ignored. A call of the
    handler already running on another thread may complete."""
    _core.remove_oom_handler(handler_id)
    with _handlers_lock:
        _handler_ids.discard(handler_id)


@atexit.register
def _remove_handlers_at_exit() -> None:
    # The pool outlives the interpreter: drop the Python callables while Python still runs.
    with _handlers_lock:
        ids = list(_handler_ids)
        _handler_ids.clear()
    for handler_id in ids:
        _core.remove_oom_handler(handler_id)
