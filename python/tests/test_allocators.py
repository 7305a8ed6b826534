# SPDX-License-Identifier: Apache-2.0
"""vibespatial_raster.allocators on the emulator: the PyTorch entry points the extension exports
(called through ctypes, as PyTorch's dlopen + dlsym would), and the CuPy, PyTorch and Numba
adapters against small stand-ins for the frameworks (the real ones run in tools/gpu-check's
Python step: python/tests/gpu/check_frameworks.py)."""

from __future__ import annotations

import collections
import ctypes
import gc
import sys
import types
import weakref

import numpy as np
import pytest

import vibespatial_raster as vsr
import vibespatial_raster.testing
from vibespatial_raster import _core, allocators, memory

MIB = 1 << 20


def current_bytes() -> int:
    return memory.memory_pool_stats()["current_bytes"]


# ---- PyTorch: the exported entry points ----


@pytest.fixture
def torch_entry_points():
    lib = ctypes.CDLL(_core.__file__)
    malloc = lib.vsr_torch_malloc
    malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    malloc.restype = ctypes.c_void_p
    free = lib.vsr_torch_free
    free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    free.restype = None
    return malloc, free


def test_torch_entry_points_allocate_from_the_pool(torch_entry_points, pool_baseline):
    malloc, free = torch_entry_points
    before = memory.memory_pool_stats()
    ptr = malloc(3 * MIB, 0, None)
    assert ptr and ptr % 256 == 0
    s = memory.memory_pool_stats()
    assert s["current_bytes"] == before["current_bytes"] + 3 * MIB
    assert s["total_count"] == before["total_count"] + 1
    data = np.arange(3 * MIB, dtype=np.uint8)
    _core.memcpy(ptr, data.ctypes.data, data.nbytes, _core.COPY_HOST_TO_DEVICE)
    back = np.empty_like(data)
    _core.memcpy(back.ctypes.data, ptr, back.nbytes, _core.COPY_DEVICE_TO_HOST)
    assert np.array_equal(back, data)
    free(ptr, 3 * MIB, 0, None)
    assert current_bytes() == before["current_bytes"]
    assert malloc(0, 0, None) is None  # size 0: a null pointer, nothing allocated
    free(None, 0, 0, None)


def test_torch_free_is_stream_ordered(torch_entry_points, created_stream, emu, pool_baseline):
    # A block freed on stream S while S still has queued work may be reused on S at once, but
    # not on another stream until that work completes, unless that stream is made to wait for it
    # (the pool does so rather than take new memory). The legacy stream runs asynchronously here,
    # as on the real driver, so such a wait does not block the caller.
    malloc, free = torch_entry_points
    s = created_stream.value
    assert emu.vsr_emu_set_option(b"ASYNC_DEFAULT_STREAMS", b"1") == 0
    try:
        ptr = malloc(4 * MIB, 0, s)
        assert emu.vsr_emu_stream_pause(created_stream, 1) == 0
        lib = ctypes.CDLL(vsr.testing.emulator_path())  # queue work on S: a memset it holds
        assert lib.cuMemsetD8Async(ctypes.c_uint64(ptr), 7, ctypes.c_size_t(4 * MIB),
                                   created_stream) == 0
        free(ptr, 4 * MIB, 0, s)
        same = malloc(4 * MIB, 0, s)
        assert same == ptr  # S itself may: its own later work runs after the memset
        free(same, 4 * MIB, 0, s)
        other = malloc(4 * MIB, 0, None)
        if other == ptr:  # the legacy stream got it only behind a wait for S's memset
            assert lib.cuStreamQuery(None) == 600  # CUDA_ERROR_NOT_READY
        assert emu.vsr_emu_stream_pause(created_stream, 0) == 0
        assert lib.cuStreamSynchronize(None) == 0
        free(other, 4 * MIB, 0, None)
    finally:
        emu.vsr_emu_stream_pause(created_stream, 0)
        emu.vsr_emu_set_option(b"ASYNC_DEFAULT_STREAMS", b"default")


def test_torch_malloc_throws_to_its_cpp_caller():
    # PyTorch calls the entry point from C++; a failure reaches it as an exception (as RMM's
    # allocator does), which _core.torch_malloc, a C++ caller through dlsym, turns into Python's.
    with pytest.raises(vsr.OutOfMemoryError):
        _core.torch_malloc(1 << 40, 0, 0)
    with pytest.raises(ValueError, match="negative"):
        _core.torch_malloc(-1, 0, 0)
    ptr = _core.torch_malloc(MIB, 0, 0)
    _core.torch_free(ptr, MIB, 0, 0)


def test_torch_free_reports_bad_frees_without_throwing(torch_entry_points, capfd):
    _malloc, free = torch_entry_points
    before = current_bytes()
    free(0x1000, 64, 0, None)  # never allocated: reported, nothing changes
    assert "vsr_torch_free" in capfd.readouterr().err
    assert current_bytes() == before


# ---- stand-ins for the frameworks ----


def fake_module(name, **attrs):
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    return mod


@pytest.fixture
def fake_cupy(monkeypatch):
    state = types.SimpleNamespace(stream_ptr=0, allocator=None)

    class UnownedMemory:
        def __init__(self, ptr, size, owner, device_id):
            self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id

    class MemoryPointer:
        def __init__(self, mem, offset):
            self.mem, self.ptr = mem, mem.ptr + offset

    cuda = fake_module(
        "cupy.cuda", UnownedMemory=UnownedMemory, MemoryPointer=MemoryPointer,
        get_current_stream=lambda: types.SimpleNamespace(ptr=state.stream_ptr),
        runtime=types.SimpleNamespace(getDevice=lambda: 0),
        set_allocator=lambda fn: setattr(state, "allocator", fn))
    monkeypatch.setitem(sys.modules, "cupy", fake_module("cupy", cuda=cuda))
    monkeypatch.setitem(sys.modules, "cupy.cuda", cuda)
    return state


def test_cupy_allocator_draws_from_the_pool_on_cupys_stream(fake_cupy, created_stream,
                                                            pool_baseline):
    allocators.use_cupy_allocator()
    assert fake_cupy.allocator is allocators.cupy_allocator
    before = current_bytes()
    fake_cupy.stream_ptr = created_stream.value
    mp = allocators.cupy_allocator(5 * MIB)
    owner = mp.mem.owner
    assert mp.ptr == owner.ptr and mp.mem.size == 5 * MIB and mp.mem.device_id == 0
    assert owner.stream == created_stream.value  # allocated (and freed) on CuPy's stream
    assert current_bytes() == before + 5 * MIB
    del mp, owner
    gc.collect()
    assert current_bytes() == before
    fake_cupy.stream_ptr = 0
    small = allocators.cupy_allocator(100)
    assert small.mem.owner.stream == 0 and current_bytes() == before + 100


@pytest.fixture
def fake_torch(monkeypatch):
    made = []

    class CUDAPluggableAllocator:
        def __init__(self, path, alloc_fn_name, free_fn_name):
            self.args = (path, alloc_fn_name, free_fn_name)
            made.append(self)

    current = []
    memory_mod = fake_module("torch.cuda.memory", CUDAPluggableAllocator=CUDAPluggableAllocator,
                             change_current_allocator=current.append)
    cuda = fake_module("torch.cuda", memory=memory_mod)
    monkeypatch.setitem(sys.modules, "torch", fake_module("torch", cuda=cuda))
    return made, current


def test_torch_allocator_names_the_exported_entry_points(fake_torch, torch_entry_points):
    made, current = fake_torch
    alloc = allocators.use_torch_allocator()
    assert current == [alloc] and made == [alloc]
    path, alloc_name, free_name = alloc.args
    lib = ctypes.CDLL(path)  # what PyTorch does with them
    assert ctypes.cast(getattr(lib, alloc_name), ctypes.c_void_p).value == \
        ctypes.cast(torch_entry_points[0], ctypes.c_void_p).value
    assert hasattr(lib, free_name)


@pytest.fixture
def fake_numba(monkeypatch):
    class HostOnlyCUDAMemoryManager:
        def __init__(self, context):
            self.context = context
            self.reset_calls = 0

        def initialize(self):
            pass

        def reset(self):
            self.reset_calls += 1

    class MemoryPointer:
        def __init__(self, context, pointer, size, owner=None, finalizer=None):
            self.context, self.device_pointer, self.size = context, pointer, size
            if finalizer is not None:
                weakref.finalize(self, finalizer)

    installed = []

    def set_memory_manager(cls):
        if cls(context=None).interface_version != 1:
            raise RuntimeError("EMM interface version")
        installed.append(cls)

    driver = fake_module("numba.cuda.cudadrv.driver", USE_NV_BINDING=False)
    cudadrv = fake_module("numba.cuda.cudadrv", driver=driver)
    cuda = fake_module("numba.cuda", HostOnlyCUDAMemoryManager=HostOnlyCUDAMemoryManager,
                       MemoryPointer=MemoryPointer,
                       MemoryInfo=collections.namedtuple("MemoryInfo", "free,total"),
                       set_memory_manager=set_memory_manager, cudadrv=cudadrv)
    for name, mod in [("numba", fake_module("numba", cuda=cuda)), ("numba.cuda", cuda),
                      ("numba.cuda.cudadrv", cudadrv), ("numba.cuda.cudadrv.driver", driver)]:
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(allocators, "_numba_plugin", None)
    return installed


def test_numba_plugin_allocates_from_the_pool(fake_numba, pool_baseline):
    allocators.use_numba_allocator()
    plugin_cls = fake_numba[0]
    assert plugin_cls is allocators.NumbaEMMPlugin is allocators._numba_memory_manager
    mm = plugin_cls(context="ctx")
    mm.initialize()
    before = current_bytes()
    mp = mm.memalloc(6 * MIB)
    assert isinstance(mp.device_pointer, ctypes.c_uint64) and mp.device_pointer.value
    assert mp.context == "ctx" and mp.size == 6 * MIB
    assert current_bytes() == before + 6 * MIB
    del mp
    gc.collect()
    assert current_bytes() == before
    kept = mm.memalloc(MIB)
    mm.reset()  # a context reset frees everything the plugin handed out
    assert current_bytes() == before and mm.reset_calls == 1
    del kept
    gc.collect()
    info = mm.get_memory_info()
    assert 0 < info.free <= info.total == 512 * MIB
    with pytest.raises(NotImplementedError):
        mm.get_ipc_handle(None)
