# SPDX-License-Identifier: Apache-2.0
"""Interop with other libraries' device arrays (private): the two protocols they speak, DLPack
and the CUDA array interface (v3), read (from_device's imports, every field checked and a wrong
one named) and spoken (:class:`DeviceArray`, the zero-copy view rasters hand out), and the
stream rules between a producer and a consumer. :mod:`vibespatial_raster.buffers` builds
rasters on them and re-exports :class:`DeviceArray`."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from . import _core
from ._dtypes import raster_dtype


def _cupy_if_imported() -> Any:
    return sys.modules.get("cupy")


class DeviceArray:
    """A zero-copy view of device memory, for other libraries to import.

    Speaks ``__cuda_array_interface__`` version 3 (with the stream the data is ready on) and
    DLPack (``__dlpack__`` / ``__dlpack_device__``), so ``cupy.asarray(a)``,
    ``torch.from_dlpack(a)``, ``numba.cuda.as_cuda_array(a)`` and ``jax.dlpack`` share the memory.
    The view keeps its storage alive. :meth:`copy_to_host` copies it into a NumPy array.
    """

    __slots__ = ("_device_id", "_device_type", "_owner", "_ptr", "_readonly", "_stream", "dtype",
                 "shape")

    def __init__(self, ptr: int, shape: tuple[int, ...], dtype: np.dtype, *, owner: Any,
                 stream: int | None = 1, device_id: int = 0, device_type: int = 2,
                 readonly: bool = False) -> None:
        self._ptr = int(ptr)
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self._owner = owner
        self._stream = stream
        self._device_id = int(device_id)
        self._device_type = int(device_type)
        self._readonly = bool(readonly)

    @property
    def ptr(self) -> int:
        """The device address of the first element."""
        return self._ptr

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def __cuda_array_interface__(self) -> dict:
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self._ptr, self._readonly),
            "version": 3,
            "strides": None,
            "stream": self._stream,
        }

    def __dlpack_device__(self) -> tuple[int, int]:
        return (self._device_type, self._device_id)

    def __dlpack__(self, *, stream: int | None = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
        _order_for_consumer(self._stream, stream)
        view = _core.array_view(self._ptr, list(self.shape), self.dtype.name, self._device_type,
                                self._device_id, self._owner, not self._readonly)
        return _forward_dlpack(view, max_version, dl_device, copy)

    def copy_to_host(self) -> np.ndarray:
        """A NumPy copy of the data (a device-to-host copy ordered after the data's stream)."""
        out = np.empty(self.shape, dtype=self.dtype)
        _core.memcpy(out.ctypes.data, self._ptr, out.nbytes, _core.COPY_DEVICE_TO_HOST,
                     _stream_handle(self._stream))
        return out

    def __repr__(self) -> str:
        return (f"DeviceArray(ptr=0x{self._ptr:x}, shape={self.shape}, dtype={self.dtype}, "
                f"device={self._device_id})")


def _stream_handle(stream: int | None) -> int:
    """A CUDA array interface stream value as a CUstream: None and 1 are the legacy default
    stream (0 here), 2 the per-thread default stream (CU_STREAM_PER_THREAD), others handles."""
    if stream is None or stream == 1:
        return 0
    return int(stream)


def _order_for_consumer(ready_on: int | None, consumer: int | None) -> None:
    """Makes data that is ready on stream ``ready_on`` (CAI convention; None: complete) safe to
    use on the DLPack consumer's stream ``consumer`` (None: the legacy default stream; -1: the
    consumer orders it itself)."""
    if consumer == 0:
        raise ValueError("__dlpack__: stream 0 is ambiguous for CUDA; pass 1 (legacy default "
                         "stream), 2 (per-thread default stream) or a stream handle")
    if ready_on is None or consumer == -1:
        return
    consumer_stream = 1 if consumer is None else int(consumer)
    if consumer_stream == ready_on:
        return
    # The legacy and per-thread default streams order each other; any other stream may be
    # non-blocking, so the data must be complete before it is handed over.
    if {consumer_stream, ready_on} <= {1, 2}:
        return
    _core.stream_synchronize(_stream_handle(ready_on))


def _forward_dlpack(view: Any, max_version: Any, dl_device: Any, copy: Any) -> Any:
    kwargs = {}
    if max_version is not None:
        kwargs["max_version"] = max_version
    if dl_device is not None:
        kwargs["dl_device"] = dl_device
    if copy is not None:
        kwargs["copy"] = copy
    return view.__dlpack__(**kwargs)


class _External:
    """Device memory of another library, used in place (from_device)."""

    __slots__ = ("device_id", "device_type", "owner", "ptr", "readonly", "stream")
    ptr: int
    owner: Any
    stream: int | None
    device_id: int
    device_type: int
    readonly: bool

    def __init__(self, ptr: int, owner: Any, stream: int | None, device_id: int,
                 device_type: int, readonly: bool) -> None:
        self.ptr = ptr
        self.owner = owner
        self.stream = stream
        self.device_id = device_id
        self.device_type = device_type
        self.readonly = readonly


_DLPACK_CPU = 1
_DLPACK_CUDA = 2
_DLPACK_CUDA_HOST = 3
_DLPACK_CUDA_MANAGED = 13


_U64_END = 2**64


def _is_int(v: Any) -> bool:
    """A Python or NumPy integer, not a bool."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    out = []
    step = itemsize
    for n in reversed(shape):
        out.append(step)
        step *= n
    return tuple(reversed(out))


def _checked_extent(where: str, shape: tuple[int, ...], itemsize: int) -> None:
    """ValueError if the array's byte size does not fit in 64 bits (``where`` names the field)."""
    size = itemsize
    for n in shape:
        size *= n
    if size >= _U64_END:
        raise ValueError(f"from_device: {where} {shape} is {size} bytes, beyond 64 bits")


def _checked_pointer(where: str, ptr: int, itemsize: int) -> None:
    if ptr == 0:
        raise ValueError(f"from_device: {where} is a null pointer")
    if ptr % itemsize != 0:
        raise ValueError(f"from_device: {where} 0x{ptr:x} is not aligned to the element size "
                         f"({itemsize} bytes)")


def _import_cai(obj: Any) -> tuple[_External, tuple[int, ...], np.dtype]:
    """Reads ``__cuda_array_interface__`` (versions 0 to 3), checking every field it uses: a
    TypeError or ValueError names the field that is wrong."""
    cai = obj.__cuda_array_interface__
    if not isinstance(cai, Mapping):
        raise TypeError(f"from_device: __cuda_array_interface__ must be a dict, not "
                        f"{type(cai).__name__}")
    for key in ("shape", "typestr", "data", "version"):
        if key not in cai:
            raise ValueError(f"from_device: __cuda_array_interface__ has no '{key}'")
    version = cai["version"]
    if not _is_int(version):
        raise TypeError(f"from_device: __cuda_array_interface__ 'version' must be an integer, "
                        f"not {version!r}")
    if not 0 <= int(version) <= 3:
        raise ValueError(f"from_device: __cuda_array_interface__ version {version} is not "
                         "supported (0 to 3 are)")
    if cai.get("mask") is not None:
        raise ValueError("from_device: masked arrays (CUDA array interface 'mask') are not "
                         "supported")
    raw_shape = cai["shape"]
    if not isinstance(raw_shape, (tuple, list)) or not all(_is_int(n) for n in raw_shape):
        raise TypeError(f"from_device: __cuda_array_interface__ 'shape' must be a tuple of "
                        f"integers, not {raw_shape!r}")
    shape = tuple(int(n) for n in raw_shape)
    if any(n < 0 for n in shape):
        raise ValueError(f"from_device: __cuda_array_interface__ 'shape' {shape} has a negative "
                         "extent")
    typestr = cai["typestr"]
    if not isinstance(typestr, str):
        raise TypeError(f"from_device: __cuda_array_interface__ 'typestr' must be a string, not "
                        f"{typestr!r}")
    try:
        given = np.dtype(typestr)
    except TypeError:
        raise TypeError(f"from_device: __cuda_array_interface__ 'typestr' {typestr!r} is not a "
                        "dtype") from None
    if given.byteorder not in ("=", "|"):
        raise ValueError(f"from_device: __cuda_array_interface__ 'typestr' {typestr!r} is not in "
                         f"this machine's byte order ({sys.byteorder}-endian): byte-swap it "
                         "first")
    try:
        dtype = raster_dtype(given)
    except TypeError as e:
        raise TypeError(f"from_device: __cuda_array_interface__ 'typestr' {typestr!r}: {e}") \
            from None
    _checked_extent("__cuda_array_interface__ 'shape'", shape, dtype.itemsize)
    data = cai["data"]
    if not isinstance(data, tuple) or len(data) != 2:
        raise TypeError(f"from_device: __cuda_array_interface__ 'data' must be a tuple "
                        f"(pointer, read_only), not {data!r}")
    ptr, readonly = data
    if not _is_int(ptr) or not 0 <= int(ptr) < _U64_END:
        raise ValueError(f"from_device: __cuda_array_interface__ 'data' pointer {ptr!r} is not "
                         "a 64-bit address")
    if not isinstance(readonly, (bool, np.bool_)):
        raise TypeError(f"from_device: __cuda_array_interface__ 'data' read-only flag must be a "
                        f"bool, not {readonly!r}")
    if all(n > 0 for n in shape):
        _checked_pointer("__cuda_array_interface__ 'data' pointer", int(ptr), dtype.itemsize)
    strides = cai.get("strides")
    if strides is not None:
        if not isinstance(strides, (tuple, list)) or not all(_is_int(v) for v in strides):
            raise TypeError(f"from_device: __cuda_array_interface__ 'strides' must be None or a "
                            f"tuple of integers, not {strides!r}")
        if len(strides) != len(shape):
            raise ValueError(f"from_device: __cuda_array_interface__ 'strides' {tuple(strides)} "
                             f"and 'shape' {shape} differ in length")
        expected = _c_strides(shape, dtype.itemsize)
        if any(n > 1 and int(v) != e for n, v, e in zip(shape, strides, expected)):
            raise ValueError("from_device: the array is not C-contiguous (copy it first, e.g. "
                             "cupy.ascontiguousarray)")
    stream = cai.get("stream") if int(version) >= 3 else None
    if stream is not None:
        if not _is_int(stream):
            raise TypeError(f"from_device: __cuda_array_interface__ 'stream' must be None or an "
                            f"integer, not {stream!r}")
        if int(stream) == 0:
            raise ValueError("from_device: CUDA array interface stream 0 is not allowed (v3)")
        if not 0 < int(stream) < _U64_END:
            raise ValueError(f"from_device: __cuda_array_interface__ 'stream' {stream} is not a "
                             "stream handle")
    device_id = _pointer_device(obj)
    return _External(int(ptr), obj, None if stream is None else int(stream), device_id,
                     _DLPACK_CUDA, bool(readonly)), shape, dtype


def _pointer_device(obj: Any) -> int:
    device = getattr(obj, "device", None)
    for attr in ("id", "index"):
        value = getattr(device, attr, None)
        if isinstance(value, int):
            return value
    return 0


def _import_dlpack(obj: Any) -> tuple[_External, tuple[int, ...], np.dtype]:
    """Imports a DLPack producer's CUDA tensor, checking what it declares: a TypeError or
    ValueError names what is wrong."""
    device = obj.__dlpack_device__()
    if (not isinstance(device, tuple) or len(device) != 2
            or not all(_is_int(v) for v in device)):
        raise TypeError(f"from_device: __dlpack_device__() must return (device_type, "
                        f"device_id), not {device!r}")
    device_type = int(device[0])
    if device_type in (_DLPACK_CPU, _DLPACK_CUDA_HOST):
        raise TypeError("from_device: this DLPack array is in host memory; use from_numpy")
    if device_type not in (_DLPACK_CUDA, _DLPACK_CUDA_MANAGED):
        raise TypeError(f"from_device: DLPack device type {device_type} is not CUDA")
    try:
        capsule = obj.__dlpack__(stream=1)  # we consume on the legacy default stream
    except TypeError:
        capsule = obj.__dlpack__()
    owner, ptr, shape, strides, dtype, dev_type, dev_id, readonly = _core.import_dlpack(capsule)
    if (int(dev_type), int(dev_id)) != (device_type, int(device[1])):
        raise ValueError(f"from_device: the DLPack tensor is on device {(dev_type, dev_id)}, but "
                         f"__dlpack_device__() said {device}")
    dtype = raster_dtype(dtype)
    shape = tuple(int(n) for n in shape)
    expected = _c_strides(shape, 1)
    if any(n > 1 and s != e for n, s, e in zip(shape, strides, expected)):
        raise ValueError("from_device: the array is not C-contiguous (make it contiguous first)")
    if all(n > 0 for n in shape):
        _checked_pointer("the DLPack tensor's data pointer", int(ptr), dtype.itemsize)
    return _External(int(ptr), owner, 1, int(dev_id), int(dev_type), bool(readonly)), shape, dtype
