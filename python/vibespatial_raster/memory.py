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
import os
import threading
from collections.abc import Callable
from types import TracebackType

from . import _core
from ._ints import integer

__all__ = [
    "DeviceBuffer",
    "add_oom_handler",
    "configure_memory_pool",
    "dump_snapshot",
    "forget_stream",
    "free_pool_memory",
    "marker",
    "memory_pool_stats",
    "record_memory_history",
    "remove_oom_handler",
    "snapshot",
    "tag",
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
    has its tier, in words, e.g. that its VMM self-test failed; "" before configuration), and
    ``owners``: ``{tag: {"live_bytes": ..., "live_count": ...}}``, largest first, for the blocks
    allocated while :func:`record_memory_history` was on and not freed since (empty when
    nothing was recorded).

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


# ---- memory history and snapshots ----


def record_memory_history(enabled: bool = True, max_entries: int = 100_000) -> None:
    """Start (``enabled=True``) or stop (``enabled=False``) recording the pool's memory history.

    While recording, every allocation and free of every device's pool, every page mapped,
    unmapped, created or released, every trim and OOM is recorded with its time, device, stream,
    address, size and owner tag (:func:`tag`), keeping the most recent ``max_entries`` events.
    Starting when stopped begins a new history; starting again while recording changes the bound
    and keeps what was recorded; stopping keeps the history for :func:`snapshot`. Off by
    default, and then nearly free.

    Raises:
        TypeError: ``enabled`` is not a bool, or ``max_entries`` not an integer.
        ValueError: ``max_entries`` is below 1 or above 16,777,216 (nothing changes).
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"record_memory_history: enabled must be a bool, not {enabled!r}")
    n = integer("record_memory_history: max_entries", max_entries)
    if enabled and not 1 <= n <= _core.MAX_MEMORY_HISTORY_ENTRIES:
        raise ValueError(
            f"record_memory_history: max_entries must be from 1 to "
            f"{_core.MAX_MEMORY_HISTORY_ENTRIES}, not {n}"
        )
    _core.record_memory_history(enabled, n if enabled else 1)


def _check_tag(function: str, name: object) -> str:
    if not isinstance(name, str):
        raise TypeError(f"{function}: a memory tag must be a str, not {name!r}")
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError as e:  # a lone surrogate
        raise ValueError(f"{function}: a memory tag must be UTF-8 text: {e}") from None
    if not 1 <= size <= _core.MAX_MEMORY_TAG_LENGTH:
        raise ValueError(
            f"{function}: a memory tag must hold 1 to {_core.MAX_MEMORY_TAG_LENGTH} bytes "
            f"of UTF-8, not {size}"
        )
    if "\0" in name:
        raise ValueError(f"{function}: a memory tag may not hold a NUL character")
    return name


class tag:  # noqa: N801 (a context manager named like a function, as contextlib's)
    """``with memory.tag("tile 3"):`` makes ``"tile 3"`` the owner of the device memory the
    calling thread allocates inside the block (in the memory history, :func:`snapshot` and
    ``memory_pool_stats()["owners"]``). Tags nest; the innermost wins.

    One ``tag`` object may be entered again inside its own block, used again afterwards, and
    shared by threads (a module-level ``tag`` entered by many threads at once): each entry
    pushes the name on the calling thread's own stack of tags (at most 64 deep), and its exit
    pops what that entry pushed, with any tag pushed inside it and left unpopped, also when the
    block ends in an exception. Nothing of a thread's tags is seen by another thread.

    Raises:
        TypeError: ``name`` is not a str.
        ValueError: ``name`` is empty, longer than 256 bytes of UTF-8, or holds a NUL.
        IndexError: on entry, the thread already has 64 tags pushed (nothing is pushed).
        RuntimeError: on exit, the tag was not entered on this thread (it is left on another
            thread than the one that entered it, or left more often than entered).
    """

    def __init__(self, name: str) -> None:
        self._name = _check_tag("memory.tag", name)

    def __enter__(self) -> "tag":
        _core.push_memory_tag(self._name)
        _thread_entries().append(_Entry(self, _core.memory_tag_depth()))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _leave(self)


class _Entry:
    """One entry of a tag on a thread: the tag, and the depth of the thread's stack with its
    name pushed."""

    __slots__ = ("tag", "depth")

    def __init__(self, owner: tag, depth: int) -> None:
        self.tag = owner
        self.depth = depth


_tag_state = threading.local()


def _thread_entries() -> list[_Entry]:
    """The calling thread's open entries of tags, outermost first."""
    try:
        return _tag_state.entries  # type: ignore[no-any-return]
    except AttributeError:
        _tag_state.entries = []
        _tag_state.taken = []  # entries popped by an outer entry's exit, not yet left
        return _tag_state.entries  # type: ignore[no-any-return]


def _leave(owner: tag) -> None:
    # The innermost open entry of `owner` on this thread is the one a `with` leaves (entries of
    # one thread are left innermost first). An entry an outer exit already popped (a generator's
    # block left after the block around it) pops nothing when it is left.
    entries = _thread_entries()
    for i in range(len(entries) - 1, -1, -1):
        if entries[i].tag is owner:
            depth = entries[i].depth
            _tag_state.taken.extend(e.tag for e in entries[i + 1:])
            del entries[i:]
            while _core.memory_tag_depth() >= depth:
                _core.pop_memory_tag()
            return
    taken: list[tag] = _tag_state.taken
    for i in range(len(taken) - 1, -1, -1):
        if taken[i] is owner:
            del taken[i]
            return
    raise RuntimeError("memory.tag: left on a thread that did not enter it (a tag is left on "
                       "the thread that entered it, once per entry)")


def marker(name: str) -> None:
    """Record a user marker ``name`` in the memory history (an ``annotate`` entry of device 0's
    trace) if recording is on. Same errors as :class:`tag`."""
    _core.memory_history_marker(_check_tag("memory.marker", name))


def snapshot() -> dict:
    """The pool's segments and the recorded history as ``torch.cuda.memory._snapshot()``
    returns them: ``{"segments": [...], "device_traces": [[...], ...]}`` (docs/memory-pool.md
    has the mapping), readable by PyTorch's ``torch.cuda._memory_viz`` and its viewer, and by
    :mod:`vibespatial_raster.memviz`. An extra key ``"vibespatial"`` holds
    ``dropped_events`` (events the bounded history let go) and ``recording``."""
    from .memviz import loads_snapshot  # the one reader of snapshot pickles

    return loads_snapshot(_core.memory_snapshot_pickle())


def dump_snapshot(path: str | os.PathLike[str], overwrite: bool = False) -> None:
    """Write :func:`snapshot` as a pickle to ``path`` (what ``torch.cuda.memory._dump_snapshot``
    writes; PyTorch's viewer opens it), all or nothing, by the library's writer of every output:
    a private temporary directory beside ``path``, its file renamed into place when complete.

    An existing ``path`` is refused unless ``overwrite`` is true (as the package's other
    outputs); a FIFO, socket or device is never replaced, with ``overwrite`` too.

    Raises:
        TypeError: ``path`` is not a str or path-like, or ``overwrite`` not a bool.
        ValueError: ``path`` is empty, names a directory, or is a FIFO, socket or device.
        FileExistsError: ``path`` exists and ``overwrite`` is false (the file is kept).
        FileNotFoundError: the directory does not exist. No file is left behind on any error.
    """
    if not isinstance(overwrite, bool):
        raise TypeError(f"dump_snapshot: overwrite must be a bool, not {overwrite!r}")
    p = os.fspath(path)
    if not isinstance(p, str):
        raise TypeError(f"dump_snapshot: path must be a str or path-like, not {path!r}")
    _core.dump_memory_snapshot(p, overwrite)
