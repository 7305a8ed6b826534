# SPDX-License-Identifier: Apache-2.0
"""vibespatial_raster.buffers: OwnedRasterArray's seed API, zero-copy NumPy sharing, device
interop through __cuda_array_interface__ (v3, with its stream) and DLPack, bad input."""

from __future__ import annotations

import ctypes
import math

import numpy as np
import pytest

import vibespatial_raster as vsr
from vibespatial_raster import _core, testing
from vibespatial_raster.buffers import (DeviceArray, OwnedRasterArray, RasterMetadata,
                                        RasterWindow, Residency, TilingStrategy)
from vibespatial_raster.memory import DeviceBuffer

ALL_DTYPES = ["uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
              "float32", "float64"]
AFFINE = (30.0, 0.0, 440_720.0, 0.0, -30.0, 3_751_320.0)


def sample(bands=3, h=5, w=7, dtype="float32"):
    return (np.arange(bands * h * w) % 100).reshape(bands, h, w).astype(dtype)


def test_enums_are_strings():
    assert TilingStrategy.WHOLE == "whole" and TilingStrategy.TILED == "tiled"
    assert TilingStrategy("band_batches") is TilingStrategy.BAND_BATCHES
    assert Residency("device") is Residency.DEVICE and str(Residency.HOST) == "host"


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_from_numpy_round_trips_every_dtype(dtype):
    data = sample(dtype=dtype)
    r = OwnedRasterArray.from_numpy(data, nodata=7, affine=AFFINE, crs="EPSG:32611")
    assert (r.band_count, r.height, r.width, r.shape) == (3, 5, 7, (3, 5, 7))
    assert r.dtype == np.dtype(dtype) and r.pixel_count == 35
    assert r.nodata == 7 and type(r.nodata) is (int if dtype[0] in "ui" else float)
    assert r.affine == AFFINE and r.crs == "EPSG:32611" and r.residency is Residency.HOST
    assert np.array_equal(r.to_numpy(), data)
    r.move_to(Residency.DEVICE)
    assert r.residency is Residency.DEVICE
    assert np.array_equal(r.to_numpy(), data)
    assert np.array_equal(r.move_to("host").to_numpy(), data)


def test_two_dimensional_input_stays_two_dimensional():
    r = OwnedRasterArray.from_numpy(np.ones((4, 6), np.uint16))
    assert r.shape == (4, 6) and r.band_count == 1 and r.to_numpy().shape == (4, 6)
    assert r.affine == (1.0, 0.0, 0.0, 0.0, -1.0, 0.0) and r.nodata is None and r.crs is None


def test_host_pixels_are_shared_with_numpy_without_a_copy():
    data = sample()
    r = OwnedRasterArray.from_numpy(data)
    a = r.to_numpy()
    b = r.to_numpy()
    assert np.shares_memory(a, b) and not np.shares_memory(a, data)  # from_numpy copied once
    assert a.flags.writeable and a.flags.c_contiguous
    a[1, 2, 3] = -1
    assert r.to_numpy()[1, 2, 3] == -1
    via_dlpack = np.from_dlpack(r)
    assert np.shares_memory(via_dlpack, a)
    assert r.__dlpack_device__() == (1, 0)
    assert np.shares_memory(np.asarray(r), a)
    band = r.band(1)
    assert band.shape == (5, 7) and np.shares_memory(band.to_numpy(), a)


def test_views_outlive_the_raster_and_its_moves():
    r = OwnedRasterArray.from_numpy(sample())
    view = r.to_numpy()
    before = view.copy()
    r.move_to("device")  # new storage on the device; the NumPy view keeps the host storage
    r.move_to("host")
    del r
    import gc

    gc.collect()
    assert np.array_equal(view, before)


def test_from_numpy_bad_input():
    with pytest.raises(ValueError):
        OwnedRasterArray.from_numpy(np.zeros(5, np.float32))
    with pytest.raises(ValueError):
        OwnedRasterArray.from_numpy(np.zeros((1, 2, 3, 4), np.float32))
    with pytest.raises(ValueError):
        OwnedRasterArray.from_numpy(np.zeros((0, 3), np.float32))
    with pytest.raises(TypeError):
        OwnedRasterArray.from_numpy(np.zeros((2, 3), np.complex64))
    with pytest.raises(TypeError):
        OwnedRasterArray.from_numpy(np.zeros((2, 3), bool))
    with pytest.raises(ValueError):
        OwnedRasterArray.from_numpy(np.zeros((2, 3), np.int16), nodata=float("nan"))
    with pytest.raises(TypeError):
        OwnedRasterArray.from_numpy(np.zeros((2, 3)), nodata="none")
    with pytest.raises(ValueError):
        OwnedRasterArray.from_numpy(np.zeros((2, 3)), affine=(1, 2, 3))
    with pytest.raises(TypeError):
        OwnedRasterArray.from_numpy(np.zeros((2, 3)), affine=5)
    with pytest.raises(ValueError):
        OwnedRasterArray.from_numpy(np.zeros((2, 3)), residency="gpu")
    with pytest.raises(TypeError):
        OwnedRasterArray()


def test_from_numpy_takes_other_layouts_and_byte_orders():
    data = sample(dtype="float64")
    r = OwnedRasterArray.from_numpy(data[:, ::2, ::-1])  # strided: copied contiguously
    assert np.array_equal(r.to_numpy(), data[:, ::2, ::-1])
    big = data.astype(">f8")
    r = OwnedRasterArray.from_numpy(big)
    assert r.dtype == np.dtype("float64") and np.array_equal(r.to_numpy(), data)


def test_georeferencing_objects():
    class Affine:  # the `affine` package's attribute interface
        a, b, c, d, e, f = 2.0, 0.0, 100.0, 0.0, -2.0, 50.0

    class CRS:  # pyproj.CRS's
        def to_wkt(self):
            return 'PROJCS["test"]'

    crs = CRS()
    r = OwnedRasterArray.from_numpy(np.zeros((4, 3), np.float32), affine=Affine(), crs=crs)
    assert r.affine == (2.0, 0.0, 100.0, 0.0, -2.0, 50.0)
    assert r.crs is crs and r._as_native().crs == 'PROJCS["test"]'
    # bounds: corners (0,0) -> (100, 50), (3, 4) -> (106, 42)
    assert r.bounds == (100.0, 42.0, 106.0, 50.0)
    meta = r.metadata
    assert isinstance(meta, RasterMetadata)
    assert (meta.height, meta.width, meta.band_count, meta.dtype) == (4, 3, 1, np.float32)
    assert meta.bounds == r.bounds and meta.pixel_count == 12 and meta.crs is crs
    g = r.with_georeferencing(nodata=-1, crs="EPSG:4326")
    assert g.nodata == -1.0 and g.crs == "EPSG:4326" and r.nodata is None
    assert np.shares_memory(g.to_numpy(), r.to_numpy())
    with pytest.raises(AttributeError):
        r.nodata = 3


def test_rotated_bounds():
    meta = RasterMetadata(10, 20, 1, np.dtype("uint8"), None, (0, 1, 5, 1, 0, 7), None)
    assert meta.bounds == (5.0, 7.0, 15.0, 27.0)


def test_nodata_masks():
    data = np.array([[1, 2], [3, -9]], np.int32)
    r = OwnedRasterArray.from_numpy(data, nodata=-9)
    assert r.nodata_mask.tolist() == [[False, False], [False, True]]
    assert r.valid_mask.tolist() == [[True, True], [True, False]]
    f = OwnedRasterArray.from_numpy(np.array([[np.nan, 1.0]], np.float32), nodata=np.nan)
    assert f.nodata_mask.tolist() == [[True, False]]
    assert not OwnedRasterArray.from_numpy(data).nodata_mask.any()


def test_band_access_and_range_errors():
    r = OwnedRasterArray.from_numpy(sample())
    with pytest.raises(IndexError):
        r.band(3)
    with pytest.raises(IndexError):
        r.device_band(-1)
    with pytest.raises(TypeError):
        r.band(1.0)
    band = r.device_band(2)  # moves the raster to the device
    assert r.residency is Residency.DEVICE
    assert isinstance(band, DeviceArray) and band.shape == (5, 7)
    assert np.array_equal(band.copy_to_host(), sample()[2])


def test_from_band_stack_follows_the_original():
    src = OwnedRasterArray.from_numpy(sample(), nodata=np.float32(np.nan), affine=AFFINE,
                                      crs="EPSG:3857")
    with pytest.raises(ValueError):
        OwnedRasterArray.from_band_stack([], source=src)
    # NaN nodata given as np.float32 and as a Python float: the same sentinel (the original
    # compared them with == and failed; reference sec. 1.7).
    b0 = OwnedRasterArray.from_numpy(sample()[0], nodata=np.float32(np.nan))
    b1 = OwnedRasterArray.from_numpy(sample()[1], nodata=float("nan"))
    stacked = OwnedRasterArray.from_band_stack([b0, b1], source=src)
    assert stacked.shape == (2, 5, 7) and math.isnan(stacked.nodata)
    assert stacked.affine == AFFINE and stacked.crs == "EPSG:3857"
    assert np.array_equal(stacked.to_numpy(), sample()[:2])
    one = OwnedRasterArray.from_band_stack([b0], source=src)
    assert np.shares_memory(one.to_numpy(), b0.to_numpy()) and one.affine == AFFINE
    assert b0.affine != AFFINE  # the result got the source's metadata, b0 kept its own
    other_dtype = OwnedRasterArray.from_numpy(sample(dtype="float64")[1], nodata=np.nan)
    with pytest.raises(ValueError, match="band 1"):
        OwnedRasterArray.from_band_stack([b0, other_dtype], source=src)
    other_nodata = OwnedRasterArray.from_numpy(sample()[1], nodata=0)
    with pytest.raises(ValueError):
        OwnedRasterArray.from_band_stack([b0, other_nodata], source=src)
    with pytest.raises(TypeError):
        OwnedRasterArray.from_band_stack([b0, sample()[1]], source=src)
    on_device = OwnedRasterArray.from_numpy(sample()[1], nodata=np.nan, residency="device")
    mixed = OwnedRasterArray.from_band_stack([b0, on_device], source=src)
    assert mixed.residency is Residency.DEVICE


# ---- device interop ----


class CaiArray:
    """A minimal producer of the CUDA array interface over a pool buffer."""

    def __init__(self, buf, shape, typestr, stream=None, strides=None, version=3, mask=None):
        self.buf = buf
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr,
                                         "data": (buf.ptr, False), "version": version,
                                         "strides": strides, "stream": stream, "mask": mask}


def device_copy_of(data: np.ndarray, stream: int = 0) -> DeviceBuffer:
    buf = DeviceBuffer(data.nbytes, stream)
    _core.memcpy(buf.ptr, np.ascontiguousarray(data).ctypes.data, data.nbytes,
                 _core.COPY_HOST_TO_DEVICE, stream)
    return buf


def test_device_raster_exposes_the_cuda_array_interface_v3():
    r = OwnedRasterArray.from_numpy(sample(), residency="device")
    cai = r.__cuda_array_interface__
    assert cai["version"] == 3 and cai["stream"] == 1  # ready on the legacy default stream
    assert cai["shape"] == (3, 5, 7) and cai["typestr"] == "<f4" and cai["strides"] is None
    assert cai["data"][0] == r._as_native().device_pointer and cai["data"][1] is False
    host = OwnedRasterArray.from_numpy(sample())
    assert not hasattr(host, "__cuda_array_interface__")


def test_from_device_uses_the_memory_in_place():
    data = sample(dtype="int16")
    buf = device_copy_of(data)
    r = OwnedRasterArray.from_device(CaiArray(buf, data.shape, "<i2"), nodata=-1, affine=AFFINE)
    assert r.residency is Residency.DEVICE and r.shape == data.shape and r.dtype == np.int16
    assert r.__cuda_array_interface__["data"][0] == buf.ptr  # no copy
    assert np.array_equal(r.to_numpy(), data)
    # A change made through the producer's memory shows: it is the same memory.
    patch = np.full(data.shape, 5, np.int16)
    _core.memcpy(buf.ptr, patch.ctypes.data, patch.nbytes, _core.COPY_HOST_TO_DEVICE)
    assert np.array_equal(r.to_numpy(), patch)
    assert np.array_equal(r.band(2).to_numpy(), patch[2])
    stats = vsr.ops.band_statistics(r.move_to("host"))
    assert stats[0].count == 35 and stats[0].mean == 5.0


def test_from_device_reads_after_the_producers_stream(emu, created_stream):
    # The producer's data is ready on the stream it names in the interface: a read must wait for
    # that stream. The producer's write is queued on a stream held paused (emulator); the read
    # is issued from another thread and the stream released only once the read's copy has been
    # queued. Were the read not ordered after the stream, it would copy the unwritten buffer.
    import threading
    import time

    lib = ctypes.CDLL(testing.emulator_path())
    stream = created_stream
    data = sample(dtype="float32") + 1
    buf = DeviceBuffer(data.nbytes, stream.value)
    zeros = np.zeros_like(data)
    _core.memcpy(buf.ptr, zeros.ctypes.data, zeros.nbytes, _core.COPY_HOST_TO_DEVICE,
                 stream.value)
    r = OwnedRasterArray.from_device(CaiArray(buf, data.shape, "<f4", stream=stream.value))
    assert emu.vsr_emu_stream_pause(stream, 1) == 0
    assert lib.cuMemcpyHtoDAsync_v2(ctypes.c_uint64(buf.ptr), data.ctypes.data_as(
        ctypes.c_void_p), ctypes.c_size_t(data.nbytes), stream) == 0
    copies = emu.vsr_emu_call_count(b"cuMemcpyDtoHAsync")
    result = {}
    reader = threading.Thread(target=lambda: result.setdefault("pixels", r.to_numpy()))
    reader.start()
    deadline = time.monotonic() + 60  # a guard against a hang, not a timing assumption
    while emu.vsr_emu_call_count(b"cuMemcpyDtoHAsync") == copies:
        assert time.monotonic() < deadline and reader.is_alive()
        time.sleep(0.001)
    assert emu.vsr_emu_stream_pause(stream, 0) == 0
    reader.join()
    assert np.array_equal(result["pixels"], data)
    del r
    buf.close()


class DlpackOnly:
    """A producer that speaks only DLPack, over another one (a raster, a DeviceArray)."""

    def __init__(self, inner):
        self.inner = inner

    def __dlpack__(self, stream=None, **kw):
        return self.inner.__dlpack__(stream=stream, **kw)

    def __dlpack_device__(self):
        return self.inner.__dlpack_device__()


@pytest.mark.parametrize("protocol", ["cai", "dlpack"])
def test_from_device_refuses_an_extent_its_memory_does_not_hold(protocol):
    # A 64-byte pool block described as 64 x 64 float32 (16 KiB: the pool's neighbouring memory)
    # and as 1024 x 1024 (4 MiB: past the mapped pages, a sticky fault that would end every
    # later allocation): refused before anything reads it, and the device stays usable.
    data = np.arange(16, dtype=np.float32)
    buf = device_copy_of(data)

    def claim(shape):
        if protocol == "cai":
            return CaiArray(buf, shape, "<f4")
        return DlpackOnly(DeviceArray(buf.ptr, shape, np.float32, owner=buf))

    for shape, nbytes in (((64, 64), 16384), ((1024, 1024), 4 << 20), ((2, 3, 3), 72)):
        with pytest.raises(ValueError, match=f"from_device: {nbytes} bytes at 0x[0-9a-f]+ run "
                           "past the end of the pool block holding it \\(64 bytes at"):
            OwnedRasterArray.from_device(claim(shape))
    ok = OwnedRasterArray.from_device(claim((4, 4)))
    assert np.array_equal(ok.to_numpy(), data.reshape(4, 4))
    assert np.array_equal(OwnedRasterArray.from_numpy(sample(), residency="device").to_numpy(),
                          sample())
    # Freed memory, and memory that is no device memory at all.
    del ok
    ptr = buf.ptr
    buf.close()
    gone = DeviceArray(ptr, (4, 4), np.float32, owner=buf)
    with pytest.raises(ValueError, match="from_device: .*in no live block"):
        OwnedRasterArray.from_device(gone if protocol == "cai" else DlpackOnly(gone))
    host = np.zeros((4, 4), np.float32)
    fake = DeviceArray(host.ctypes.data, (4, 4), np.float32, owner=host)
    with pytest.raises(ValueError, match="from_device: .*is not device memory"):
        OwnedRasterArray.from_device(fake if protocol == "cai" else DlpackOnly(fake))


def test_raw_copies_refuse_an_extent_their_memory_does_not_hold():
    buf = DeviceBuffer(64)
    out = np.zeros(1 << 20, np.float32)
    with pytest.raises(ValueError, match="vsr_memcpy: src: 4194304 bytes at"):
        _core.memcpy(out.ctypes.data, buf.ptr, out.nbytes, _core.COPY_DEVICE_TO_HOST)
    assert not out.any()
    with pytest.raises(ValueError, match="from_device: 16384 bytes"):
        _core.Raster.from_device_memory(buf.ptr, "float32", 1, 64, 64, None,
                                        (1.0, 0.0, 0.0, 0.0, -1.0, 0.0), "", 0)
    buf.close()


def test_from_device_bad_input():
    data = sample()
    buf = device_copy_of(data)
    with pytest.raises(TypeError):
        OwnedRasterArray.from_device(data)  # host memory has no device interface
    with pytest.raises(ValueError, match="C-contiguous"):
        OwnedRasterArray.from_device(CaiArray(buf, (3, 5, 7), "<f4", strides=(4, 60, 12)))
    with pytest.raises(ValueError):
        OwnedRasterArray.from_device(CaiArray(buf, (105,), "<f4"))
    with pytest.raises(ValueError):
        OwnedRasterArray.from_device(CaiArray(buf, (3, 5, 7), "<f4", stream=0))
    with pytest.raises(ValueError):
        OwnedRasterArray.from_device(CaiArray(buf, (3, 5, 7), "<f4", mask=object()))
    with pytest.raises(TypeError):
        OwnedRasterArray.from_device(CaiArray(buf, (3, 5, 7), "<c8"))
    with pytest.raises(TypeError):
        OwnedRasterArray.from_device(OwnedRasterArray.from_numpy(data))  # a host DLPack array
    ok = OwnedRasterArray.from_device(CaiArray(buf, (3, 5, 7), "<f4", strides=(140, 28, 4)))
    assert np.array_equal(ok.to_numpy(), data)


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


def read_capsule(capsule, name=b"dltensor"):
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    t = DLTensor.from_address(get(capsule, name))
    return (t.data + t.byte_offset, t.device_type, t.device_id, t.code, t.bits,
            [t.shape[i] for i in range(t.ndim)])


def test_dlpack_export_of_a_device_raster():
    r = OwnedRasterArray.from_numpy(sample(dtype="uint16"), residency="device")
    assert r.__dlpack_device__() == (2, 0)
    capsule = r.__dlpack__(stream=1)
    ptr, dev_type, dev_id, code, bits, shape = read_capsule(capsule)
    assert (ptr, dev_type, dev_id) == (r._as_native().device_pointer, 2, 0)
    assert (code, bits, shape) == (1, 16, [3, 5, 7])  # kDLUInt, 16 bits
    with pytest.raises(ValueError):
        r.__dlpack__(stream=0)
    versioned = r.__dlpack__(max_version=(1, 0))
    assert "dltensor_versioned" in repr(versioned)


def test_dlpack_round_trip_between_rasters_is_zero_copy():
    r = OwnedRasterArray.from_numpy(sample(dtype="float64"), residency="device")
    again = OwnedRasterArray.from_device(r)  # through DLPack? r has CAI first: either way in place
    assert again.__cuda_array_interface__["data"][0] == r.__cuda_array_interface__["data"][0]

    via = OwnedRasterArray.from_device(DlpackOnly(r))
    assert via.__cuda_array_interface__["data"][0] == r.__cuda_array_interface__["data"][0]
    assert np.array_equal(via.to_numpy(), sample(dtype="float64"))


def test_device_data_is_a_device_view():
    r = OwnedRasterArray.from_numpy(sample())
    d = r.device_data()
    assert r.residency is Residency.DEVICE
    assert isinstance(d, DeviceArray) and d.shape == (3, 5, 7) and d.dtype == np.float32
    assert d.__cuda_array_interface__["data"][0] == r.__cuda_array_interface__["data"][0]
    assert np.array_equal(d.copy_to_host(), sample())


def test_exported_device_memory_outlives_a_move():
    r = OwnedRasterArray.from_numpy(sample(), residency="device")
    ptr = r.__cuda_array_interface__["data"][0]  # a consumer now holds this address
    r.move_to("host")
    # The consumer's view is still valid memory with the pixels it had.
    out = np.empty((3, 5, 7), np.float32)
    _core.memcpy(out.ctypes.data, ptr, out.nbytes, _core.COPY_DEVICE_TO_HOST)
    assert np.array_equal(out, sample())


def test_repr_and_window():
    r = OwnedRasterArray.from_numpy(sample(), nodata=0)
    assert "shape=(3, 5, 7)" in repr(r) and "float32" in repr(r)
    w = RasterWindow(1, 2, 3, 4)
    assert (w.col_off, w.row_off, w.width, w.height) == (1, 2, 3, 4)
