# SPDX-License-Identifier: Apache-2.0
"""The pool for CuPy, PyTorch and Numba: their device memory from vibespatial-raster.

Every allocation goes through the pool (``device_allocate``), stream-ordered on the framework's
stream, and shows in :func:`vibespatial_raster.memory.memory_pool_stats`; the pool's OOM
recovery (tier B) and :func:`~vibespatial_raster.memory.free_pool_memory` cover it too.

- CuPy: ``cupy.cuda.set_allocator(cupy_allocator)`` (or :func:`use_cupy_allocator`). Each
  allocation is made on CuPy's current stream and freed on it.
- PyTorch: ``torch.cuda.memory.change_current_allocator(torch_allocator())`` (or
  :func:`use_torch_allocator`), before PyTorch's first CUDA allocation. The allocator is a
  ``CUDAPluggableAllocator`` over ``vsr_torch_malloc`` / ``vsr_torch_free``, exported by the
  package's extension module with PyTorch's signatures; PyTorch passes its current stream.
- Numba: ``numba.cuda.set_memory_manager(NumbaEMMPlugin)`` (or :func:`use_numba_allocator`), or
  ``NUMBA_CUDA_MEMORY_MANAGER=vibespatial_raster.allocators`` in the environment. Numba's
  allocation API has no stream: blocks are allocated and freed on the legacy default stream.

The frameworks are imported only when these functions are called.
"""

from __future__ import annotations

import ctypes
import importlib
import threading
from typing import Any

from . import _core
from .memory import DeviceBuffer

__all__ = [
    "NumbaEMMPlugin",
    "cupy_allocator",
    "torch_allocator",
    "torch_allocator_entry_points",
    "use_cupy_allocator",
    "use_numba_allocator",
    "use_torch_allocator",
]

# ---- CuPy ----


def cupy_allocator(nbytes: int) -> Any:
    """A ``cupy.cuda.set_allocator`` allocator: ``nbytes`` from the pool on CuPy's current
    stream, as a ``cupy.cuda.MemoryPointer`` whose memory returns to the pool (on that stream)
    when CuPy drops it."""
    import cupy

    stream = cupy.cuda.get_current_stream()
    buf = DeviceBuffer(int(nbytes), int(stream.ptr), "cupy")
    mem = cupy.cuda.UnownedMemory(buf.ptr, buf.size, buf, cupy.cuda.runtime.getDevice())
    return cupy.cuda.MemoryPointer(mem, 0)


def use_cupy_allocator() -> None:
    """Make the pool CuPy's allocator (``cupy.cuda.set_allocator(cupy_allocator)``)."""
    import cupy

    cupy.cuda.set_allocator(cupy_allocator)


# ---- PyTorch ----


def torch_allocator_entry_points() -> tuple[str, str, str]:
    """(shared library path, allocation function, free function) for
    ``torch.cuda.memory.CUDAPluggableAllocator``: the package's extension module, which exports
    ``void* vsr_torch_malloc(ssize_t size, int device, cudaStream_t stream)`` and
    ``void vsr_torch_free(void* ptr, ssize_t size, int device, cudaStream_t stream)``."""
    return (_core.__file__, "vsr_torch_malloc", "vsr_torch_free")


def torch_allocator() -> Any:
    """A ``torch.cuda.memory.CUDAPluggableAllocator`` drawing from the pool."""
    import torch

    return torch.cuda.memory.CUDAPluggableAllocator(*torch_allocator_entry_points())


def use_torch_allocator() -> Any:
    """Make the pool PyTorch's CUDA allocator; must run before PyTorch's first CUDA allocation
    (PyTorch refuses to swap an initialized allocator). Returns the allocator."""
    import torch

    allocator = torch_allocator()
    torch.cuda.memory.change_current_allocator(allocator)
    return allocator


# ---- Numba ----


def _numba_device_pointer(ptr: int) -> Any:
    """The pointer type Numba's MemoryPointer expects: the NVIDIA binding's CUdeviceptr, or a
    ctypes integer with Numba's own ctypes binding."""
    from numba.cuda.cudadrv import driver as numba_driver

    if not getattr(numba_driver, "USE_NV_BINDING", False):
        return ctypes.c_uint64(int(ptr))
    nv_binding: Any = getattr(numba_driver, "binding", None)
    if nv_binding is None:  # numba-cuda versions that import the binding elsewhere
        nv_binding = importlib.import_module("cuda.bindings.driver")
    return nv_binding.CUdeviceptr(int(ptr))


def _make_numba_plugin() -> type:
    from numba import cuda

    class NumbaEMMPlugin(cuda.HostOnlyCUDAMemoryManager):
        """Numba's External Memory Management plugin over the pool (interface version 1).

        Device allocations come from the pool on the legacy default stream; host (pinned and
        mapped) memory stays Numba's. IPC handles are not supported: the pool's memory is
        mapped through the VMM API, which cuIpcGetMemHandle cannot export.
        """

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._lock = threading.Lock()
            self._buffers: dict[int, DeviceBuffer] = {}

        def initialize(self) -> None:
            super().initialize()

        def memalloc(self, size: int) -> Any:
            buf = DeviceBuffer(int(size), 0, "numba")
            key = id(buf)
            with self._lock:
                self._buffers[key] = buf
            lock = self._lock
            buffers = self._buffers

            def finalizer() -> None:
                with lock:
                    owned = buffers.pop(key, None)
                if owned is not None:
                    owned.close()

            return cuda.MemoryPointer(self.context, _numba_device_pointer(buf.ptr), size,
                                      finalizer=finalizer)

        def get_memory_info(self) -> Any:
            stats = _core.memory_pool_stats()
            free, total = 0, 0
            for dev in _core.driver_info()["devices"]:
                if dev["ordinal"] == stats["device"]:
                    free, total = dev["free_bytes"], dev["total_bytes"]
            return cuda.MemoryInfo(free=free + stats["pool_free_bytes"], total=total)

        def get_ipc_handle(self, memory: Any) -> Any:
            raise NotImplementedError("vibespatial_raster's Numba plugin does not export IPC "
                                      "handles (pool memory is VMM-mapped)")

        def reset(self) -> None:
            # Numba resets a context only when told to; its allocations are then invalid.
            with self._lock:
                buffers = list(self._buffers.values())
                self._buffers.clear()
            for buf in buffers:
                buf.close()
            super().reset()

        @property
        def interface_version(self) -> int:
            return 1

    return NumbaEMMPlugin


_numba_plugin: type | None = None
_numba_lock = threading.Lock()


def _numba_plugin_class() -> type:
    global _numba_plugin
    with _numba_lock:
        if _numba_plugin is None:
            _numba_plugin = _make_numba_plugin()
        return _numba_plugin


def use_numba_allocator() -> None:
    """Make the pool Numba's device memory manager (``numba.cuda.set_memory_manager``)."""
    from numba import cuda

    cuda.set_memory_manager(_numba_plugin_class())


def __getattr__(name: str) -> Any:
    # NumbaEMMPlugin subclasses Numba's base class, so it is made on first access;
    # _numba_memory_manager is the name NUMBA_CUDA_MEMORY_MANAGER=<this module> looks up.
    if name in ("NumbaEMMPlugin", "_numba_memory_manager"):
        return _numba_plugin_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
