# SPDX-License-Identifier: Apache-2.0
"""The worker side: the pool configured on every worker (:class:`PoolPlugin`), the clients the
layer runs on, and the per-process pool functions run on every worker."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import distributed

from .. import dispatch as _dispatch
from .. import memory as _memory
from .._errors import DriverUnavailableError
from ._placement import _process_mode

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


def _on_a_worker(client: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` on one of ``client``'s workers (where the tasks run: their devices, GPU or
    CPU, and the file system they see), or here when ``client`` is None (Dask's local
    schedulers). ``client`` is one :func:`_client_or_none` returned."""
    if client is None:
        return fn(*args)
    return client.submit(fn, *args, pure=False).result()


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
