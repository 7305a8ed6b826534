# SPDX-License-Identifier: Apache-2.0
"""Hostile uses of the native module: subinterpreters, 64-bit integer nodata, foreign device
arrays that lie about themselves, devices that do not exist, and OOM handlers that raise what is
not an Exception. Each gets a typed error naming what is wrong, or exactly what was asked for."""

from __future__ import annotations

import ctypes
import ctypes.util
import decimal
import fractions
import gc
import importlib.util
import os
import pathlib
import struct
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from conftest import EMULATED_DEVICE_MEMORY, REAL_DRIVER, run_python

import vibespatial_raster as vr
from vibespatial_raster import dispatch, io, memory, ops, testing
from vibespatial_raster.buffers import DeviceArray, OwnedRasterArray

needs_io = pytest.mark.skipif(not io.io_available(), reason="built without GDAL")
# These fill the emulated device (512 MiB, one device) on purpose.
on_emulator = pytest.mark.skipif(REAL_DRIVER, reason="sized for the emulated device")


# ---- subinterpreters ---------------------------------------------------------------------------

SUBINTERPRETERS = next((m for m in ("_interpreters", "_xxsubinterpreters")
                        if importlib.util.find_spec(m) is not None), None)


@pytest.mark.skipif(SUBINTERPRETERS is None, reason="no subinterpreter module")
@pytest.mark.parametrize("target", ["vibespatial_raster", "vibespatial_raster._core"])
def test_a_subinterpreter_import_is_refused_and_the_main_interpreter_keeps_working(target,
                                                                                   tmp_path):
    # The second initialization used to overwrite the extension's per-process state: the main
    # interpreter's DeviceBuffer.close() then refused its own buffer, and from_numpy crashed.
    report = tmp_path / "sub.txt"
    sub_code = (f"try:\n    import {target}\n    message = 'imported'\n"
                f"except ImportError as e:\n    message = 'ImportError: ' + str(e)\n"
                f"with open({str(report)!r}, 'w') as f:\n    f.write(message)\n")
    run_python(f"""
        import {SUBINTERPRETERS} as interpreters
        import numpy as np
        import vibespatial_raster as vr
        from vibespatial_raster import memory, ops
        buf = memory.DeviceBuffer(4096)
        before = vr.OwnedRasterArray.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4))
        sub = interpreters.create()
        interpreters.run_string(sub, {sub_code!r})
        interpreters.destroy(sub)
        buf.close()
        assert buf.closed
        r = vr.OwnedRasterArray.from_numpy(np.ones((2, 8, 8), np.float32), nodata=0)
        assert ops.band_statistics(r)[0].count == 64
        assert ops.band_statistics(before)[0].max == 11
        r.move_to("device")
        assert r.to_numpy().sum() == 128
        b2 = memory.DeviceBuffer(1 << 20)
        b2.close()
        print("main ok")
    """)
    text = report.read_text()
    assert text.startswith("ImportError:") and "subinterpreter" in text, text


def test_the_extension_cannot_be_initialized_twice_in_one_interpreter():
    # Dropped from sys.modules and imported again, it used to come back without its types
    # (nanobind: "type 'Raster' was already registered!") while the first copy kept working.
    run_python("""
        import sys, warnings
        import numpy as np
        import vibespatial_raster as vr
        from vibespatial_raster import _core, memory
        buf = memory.DeviceBuffer(4096)
        del sys.modules["vibespatial_raster._core"]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            try:
                import vibespatial_raster._core
                raise SystemExit("imported twice")
            except ImportError as e:
                assert "already initialized" in str(e), e
        sys.modules["vibespatial_raster._core"] = _core
        buf.close()
        assert vr.OwnedRasterArray.from_numpy(np.ones((2, 2), np.uint8)).shape == (2, 2)
    """)


# ---- 64-bit integer nodata, exactly ------------------------------------------------------------

U64 = [0, 1, 2**53, 2**53 + 1, 2**63 - 1, 2**63, 2**63 + 1, 12345678901234567890, 2**64 - 2,
       2**64 - 1]
I64 = [-2**63, -2**63 + 1, -2**53 - 1, -1, 0, 2**53 + 1, 2**62 + 3, 2**63 - 2, 2**63 - 1]
_rng = np.random.default_rng(20240611)
U64_SAMPLE = [int(v) for v in _rng.integers(0, 2**64, 12, dtype=np.uint64, endpoint=False)]
I64_SAMPLE = [int(v) for v in _rng.integers(-2**63, 2**63, 12, dtype=np.int64, endpoint=False)]
CASES = ([("uint64", v) for v in U64 + U64_SAMPLE] + [("int64", v) for v in I64 + I64_SAMPLE])


def sentinel_raster(dtype: str, value: int) -> tuple[np.ndarray, int]:
    """A 2-band raster of `dtype` holding `value` once per band, and its neighbours (value +- 1,
    which a nodata rounded through a double would mark instead) everywhere else it can."""
    info = np.iinfo(dtype)
    others = [v for v in (value - 1, value + 1, 7) if info.min <= v <= info.max and v != value]
    data = np.full((2, 4, 5), others[0], dtype=dtype)
    data[:, 1, :] = others[-1]
    data[0, 2, 3] = value
    data[1, 0, 0] = value
    return data, 2


def expected_mask(data: np.ndarray, value: int) -> np.ndarray:
    return data == np.array(value, dtype=data.dtype)


@pytest.mark.parametrize("dtype,value", CASES)
def test_integer_nodata_is_exact_through_construction_views_and_ops(dtype, value):
    data, n_nodata = sentinel_raster(dtype, value)
    r = OwnedRasterArray.from_numpy(data, nodata=value)
    assert type(r.nodata) is int and r.nodata == value
    assert r.metadata.nodata == value
    np.testing.assert_array_equal(r.nodata_mask, expected_mask(data, value))
    assert r.band(1).nodata == value
    assert r.with_georeferencing(crs="EPSG:4326").nodata == value
    assert r.with_georeferencing(nodata=value).nodata == value
    # The ops test pixels against the exact sentinel: one pixel per band is not counted.
    stats = ops.band_statistics(r)
    assert [s.count for s in stats] == [data[0].size - 1, data[1].size - 1]
    if value == 0 and dtype == "int64":
        # The neighbour -1 clamps to the bound 0, the nodata: it would read as nodata (refused).
        with pytest.raises(ValueError, match="would equal the output nodata"):
            ops.clip(r, 0, 2**62)
    else:
        assert ops.clip(r, 0, 2**62).nodata == value
    stacked = dispatch.dispatch_per_band_cpu(r, lambda b: b)
    assert stacked.nodata == value
    # NumPy integers, and the device round trip (a copy into new storage each way).
    np_value = np.uint64(value) if dtype == "uint64" else np.int64(value)
    assert OwnedRasterArray.from_numpy(data, nodata=np_value).nodata == value
    r.move_to("device")
    assert r.nodata == value
    assert r.band(0).nodata == value
    ext = OwnedRasterArray.from_device(r.device_array(), nodata=value)
    assert ext.nodata == value
    assert ext.move_to("host").nodata == value
    assert OwnedRasterArray.from_band_stack([ext.band(0), ext.band(1)], source=ext).nodata == value
    r.move_to("host")
    assert r.nodata == value


def _libgdal() -> ctypes.CDLL | None:
    for name in ("gdal", "gdal.so.32", "gdal.so.34", "gdal.so.35", "gdal.so.36"):
        path = ctypes.util.find_library(name) or f"lib{name}"
        try:
            lib = ctypes.CDLL(path if "/" in path or path.startswith("lib") else path)
        except OSError:
            continue
        if hasattr(lib, "GDALGetRasterNoDataValueAsUInt64"):
            return lib
    return None


def gdal_nodata(path: os.PathLike, dtype: str) -> int | None:
    """Band 1's nodata as GDAL itself reads it (its C API, through ctypes)."""
    lib = _libgdal()
    if lib is None:
        pytest.skip("libgdal (3.5+) is not loadable through ctypes")
    lib.GDALAllRegister()
    lib.GDALOpen.restype = ctypes.c_void_p
    lib.GDALOpen.argtypes = [ctypes.c_char_p, ctypes.c_int]
    lib.GDALGetRasterBand.restype = ctypes.c_void_p
    lib.GDALGetRasterBand.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.GDALClose.argtypes = [ctypes.c_void_p]
    ds = lib.GDALOpen(os.fsencode(path), 0)
    assert ds
    try:
        band = lib.GDALGetRasterBand(ds, 1)
        has = ctypes.c_int(0)
        if dtype == "uint64":
            fn = lib.GDALGetRasterNoDataValueAsUInt64
            fn.restype = ctypes.c_uint64
        else:
            fn = lib.GDALGetRasterNoDataValueAsInt64
            fn.restype = ctypes.c_int64
        fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
        value = fn(band, ctypes.byref(has))
        return int(value) if has.value else None
    finally:
        lib.GDALClose(ds)


def tiff_nodata_text(path: os.PathLike) -> str | None:
    """The text of the GDAL_NODATA TIFF tag (42113) in the file's first directory: the file's
    own record, independent of any reader."""
    raw = pathlib.Path(path).read_bytes()
    order = {b"II": "<", b"MM": ">"}[raw[:2]]
    magic = struct.unpack(order + "H", raw[2:4])[0]
    big = magic == 43
    if big:
        offset = struct.unpack(order + "Q", raw[8:16])[0]
        (count,) = struct.unpack(order + "Q", raw[offset:offset + 8])
        entries, size, pos = count, 20, offset + 8
    else:
        offset = struct.unpack(order + "I", raw[4:8])[0]
        (count,) = struct.unpack(order + "H", raw[offset:offset + 2])
        entries, size, pos = count, 12, offset + 2
    for i in range(entries):
        e = raw[pos + i * size:pos + (i + 1) * size]
        tag, _typ = struct.unpack(order + "HH", e[:4])
        if tag != 42113:
            continue
        n = struct.unpack(order + ("Q" if big else "I"), e[4:12 if big else 8])[0]
        inline = e[12:] if big else e[8:]
        if n <= len(inline):
            data = inline[:n]
        else:
            at = struct.unpack(order + ("Q" if big else "I"), inline)[0]
            data = raw[at:at + n]
        return data.rstrip(b"\0").decode()
    return None


@needs_io
@pytest.mark.parametrize("dtype,value", CASES)
def test_integer_nodata_is_exact_through_files(dtype, value, tmp_path):
    data, _ = sentinel_raster(dtype, value)
    path = tmp_path / "a.tif"
    io.write_raster(path, OwnedRasterArray.from_numpy(data, nodata=value))
    assert tiff_nodata_text(path) == str(value)
    assert gdal_nodata(path, dtype) == value
    assert io.read_raster_metadata(path).nodata == value
    back = io.read_raster(path)
    assert back.nodata == value and type(back.nodata) is int
    np.testing.assert_array_equal(back.nodata_mask, expected_mask(data, value))
    assert [s.count for s in ops.band_statistics(back)] == [data[0].size - 1] * 2
    # A file written by GDAL's reader and our writer again: a device round trip on the way.
    again = tmp_path / "b.tif"
    io.write_raster(again, back.move_to("device"))
    assert tiff_nodata_text(again) == str(value)


@needs_io
@pytest.mark.parametrize("dtype,value", [("uint64", 2**64 - 1), ("uint64", 12345678901234567890),
                                         ("int64", 2**63 - 1), ("int64", -2**63)])
def test_integer_nodata_is_exact_through_streamed_runs(dtype, value, tmp_path):
    data = np.arange(2 * 40 * 30, dtype=dtype).reshape(2, 40, 30)
    data[0, 3, 4] = value
    src = tmp_path / "in.tif"
    io.write_raster(src, OwnedRasterArray.from_numpy(data, nodata=value))
    plan = dispatch.analyze_raster_plan(40, 30, dtype, band_count=2, vram_budget=0)
    out = tmp_path / "out.tif"
    io.process_raster_streamed(src, out, lambda t: t, plan)
    assert tiff_nodata_text(out) == str(value)
    assert io.read_raster(out).nodata == value
    # A tile op that sets another 64-bit sentinel: the output takes it exactly.
    other = value - 1 if value > 0 else value + 1
    out2 = tmp_path / "out2.tif"
    io.process_raster_streamed(src, out2, lambda t: t.with_georeferencing(nodata=other), plan)
    assert tiff_nodata_text(out2) == str(other)
    assert io.read_raster_metadata(out2).nodata == other


@pytest.mark.parametrize("given,held", [
    (np.uint64(2**64 - 1), 2**64 - 1),
    (decimal.Decimal("18446744073709551615"), 2**64 - 1),
    (decimal.Decimal("18446744073709551615.000"), 2**64 - 1),
    (fractions.Fraction(2**64 - 1, 1), 2**64 - 1),
    (fractions.Fraction(2 * (2**64 - 1), 2), 2**64 - 1),
    (np.int8(-3), -3),
    (18446744073709551615.0, 2**64),  # a float means its value: 2**64, which no pixel holds
    (2**64, 2**64),
])
def test_nodata_of_any_integer_kind_is_held_exactly(given, held):
    r = OwnedRasterArray.from_numpy(np.array([[2**64 - 1, 5]], np.uint64), nodata=given)
    assert r.nodata == held and type(r.nodata) is int
    assert r.nodata_mask.tolist() == [[held == 2**64 - 1, False]]


@pytest.mark.parametrize("given,held", [
    (decimal.Decimal("1.5"), 1.5), (fractions.Fraction(1, 3), 1 / 3),
    (decimal.Decimal("-Infinity"), float("-inf")), (np.float16(2.5), 2.5)])
def test_fractional_nodata_is_its_nearest_float(given, held):
    assert OwnedRasterArray.from_numpy(np.zeros((2, 2), np.float64), nodata=given).nodata == held


def test_nodata_that_is_no_real_number_is_refused():
    data = np.zeros((2, 2), np.uint64)
    for bad in (True, np.bool_(False), 1j, "5", b"5", [5], object()):
        with pytest.raises(TypeError, match="nodata must be a number"):
            OwnedRasterArray.from_numpy(data, nodata=bad)
    with pytest.raises(ValueError, match="from_numpy: nodata Decimal\\('sNaN'\\)"):
        OwnedRasterArray.from_numpy(data, nodata=decimal.Decimal("sNaN"))
    with pytest.raises(ValueError, match="NaN nodata"):
        OwnedRasterArray.from_numpy(data, nodata=decimal.Decimal("NaN"))
    with pytest.raises(OverflowError, match="from_numpy: nodata .* too large"):
        OwnedRasterArray.from_numpy(data, nodata=10**400)
    with pytest.raises(OverflowError, match="from_numpy: nodata .* too large"):
        OwnedRasterArray.from_numpy(np.zeros((2, 2), np.float32), nodata=-10**400)


def test_a_float_raster_holds_an_integer_nodata_as_its_float():
    r = OwnedRasterArray.from_numpy(np.zeros((2, 2), np.float64), nodata=2**64 - 1)
    assert r.nodata == float(2**64 - 1) and type(r.nodata) is float


# ---- foreign device arrays (CUDA array interface, DLPack) ----------------------------------------

class FakeCAI:
    """An object speaking __cuda_array_interface__ with whatever dictionary it is given."""

    def __init__(self, cai):
        self.__cuda_array_interface__ = cai


@pytest.fixture
def device_source():
    r = OwnedRasterArray.from_numpy(np.arange(24, dtype=np.float32).reshape(2, 3, 4),
                                    residency="device")
    cai = dict(r.device_array().__cuda_array_interface__)
    return r, cai


def with_fields(cai, **fields):
    out = dict(cai)
    for k, v in fields.items():
        if v is KeyError:
            out.pop(k)
        else:
            out[k] = v
    return out


def test_a_valid_interface_is_accepted(device_source):
    r, cai = device_source
    ext = OwnedRasterArray.from_device(FakeCAI(cai))
    np.testing.assert_array_equal(ext.to_numpy(), r.to_numpy())
    little = "<f4" if sys.byteorder == "little" else ">f4"
    ext = OwnedRasterArray.from_device(FakeCAI(with_fields(cai, typestr=little,
                                                           strides=(48, 16, 4))))
    np.testing.assert_array_equal(ext.to_numpy(), r.to_numpy())


def test_a_non_native_byte_order_is_refused(device_source):
    # '>f4' used to be read as little-endian floats: every pixel byte-swapped garbage.
    _, cai = device_source
    swapped = ">f4" if sys.byteorder == "little" else "<f4"
    with pytest.raises(ValueError, match="typestr.*byte order"):
        OwnedRasterArray.from_device(FakeCAI(with_fields(cai, typestr=swapped)))
    with pytest.raises(ValueError, match="typestr.*byte order"):
        OwnedRasterArray.from_device(FakeCAI(with_fields(cai, typestr=swapped.replace("f", "i"))))


BAD_FIELDS = [
    ({"version": 4}, ValueError, "version 4"),
    ({"version": "3"}, TypeError, "'version' must be an integer"),
    ({"version": True}, TypeError, "'version' must be an integer"),
    ({"version": KeyError}, ValueError, "has no 'version'"),
    ({"shape": KeyError}, ValueError, "has no 'shape'"),
    ({"shape": (2, -3, 4)}, ValueError, "'shape' .* negative"),
    ({"shape": (2.0, 3, 4)}, TypeError, "'shape' must be a tuple of integers"),
    ({"shape": (True, 3, 4)}, TypeError, "'shape' must be a tuple of integers"),
    ({"shape": "234"}, TypeError, "'shape' must be a tuple of integers"),
    ({"shape": (2**40, 2**40, 4)}, ValueError, "'shape' .* beyond 64 bits"),
    ({"shape": (2**64, 1, 1)}, ValueError, "'shape' .* beyond 64 bits"),
    ({"typestr": 4}, TypeError, "'typestr' must be a string"),
    ({"typestr": "<c8"}, TypeError, "'typestr' '<c8'"),
    ({"typestr": "not a dtype"}, TypeError, "'typestr' 'not a dtype' is not a dtype"),
    ({"data": None}, TypeError, "'data' must be a tuple"),
    ({"data": [0, False]}, TypeError, "'data' must be a tuple"),
    ({"data": (1,)}, TypeError, "'data' must be a tuple"),
    ({"data": ("0x10", False)}, ValueError, "'data' pointer '0x10'"),
    ({"data": (-4096, False)}, ValueError, "'data' pointer -4096"),
    ({"data": (2**64, False)}, ValueError, "'data' pointer"),
    ({"data": (0, False)}, ValueError, "'data' pointer is a null pointer"),
    ({"strides": (48, 16)}, ValueError, "'strides' .* differ in length"),
    ({"strides": (48, 16, -4)}, ValueError, "not C-contiguous"),
    ({"strides": (48.0, 16, 4)}, TypeError, "'strides' must be None or a tuple"),
    ({"strides": (96, 32, 8)}, ValueError, "not C-contiguous"),
    ({"mask": object()}, ValueError, "'mask'"),
    ({"stream": 0}, ValueError, "stream 0"),
    ({"stream": -7}, ValueError, "'stream' -7"),
    ({"stream": "1"}, TypeError, "'stream' must be None or an integer"),
    ({"stream": True}, TypeError, "'stream' must be None or an integer"),
    ({"stream": 2**64}, ValueError, "'stream'"),
]


@pytest.mark.parametrize("fields,error,says", BAD_FIELDS)
def test_each_bad_field_is_refused_by_name(device_source, fields, error, says):
    _, cai = device_source
    with pytest.raises(error, match="from_device: .*" + says):
        OwnedRasterArray.from_device(FakeCAI(with_fields(cai, **fields)))


def test_a_bad_data_flag_and_a_misaligned_pointer_are_refused(device_source):
    _, cai = device_source
    ptr = cai["data"][0]
    with pytest.raises(TypeError, match="read-only flag must be a bool"):
        OwnedRasterArray.from_device(FakeCAI(with_fields(cai, data=(ptr, "no"))))
    with pytest.raises(ValueError, match="not aligned to the element size"):
        OwnedRasterArray.from_device(FakeCAI(with_fields(cai, data=(ptr + 2, False))))
    with pytest.raises(TypeError, match="__cuda_array_interface__ must be a dict"):
        OwnedRasterArray.from_device(FakeCAI([("shape", (2, 3, 4))]))


def test_a_read_only_interface_gives_read_only_views(device_source):
    r, cai = device_source
    ext = OwnedRasterArray.from_device(FakeCAI(with_fields(cai, data=(cai["data"][0], True))))
    assert ext.device_array().__cuda_array_interface__["data"][1] is True
    np.testing.assert_array_equal(ext.to_numpy(), r.to_numpy())


class FakeDLPack:
    """A DLPack producer over a DeviceArray, with a __dlpack_device__ of our choosing."""

    def __init__(self, array: DeviceArray, device=None, versioned=False):
        self.array = array
        self.device = device
        self.versioned = versioned

    def __dlpack_device__(self):
        return self.device if self.device is not None else self.array.__dlpack_device__()

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        return self.array.__dlpack__(stream=stream,
                                     max_version=(1, 0) if self.versioned else None)


def test_dlpack_producers_are_checked(device_source):
    r, _ = device_source
    view = r.device_array()
    ext = OwnedRasterArray.from_device(FakeDLPack(view))
    np.testing.assert_array_equal(ext.to_numpy(), r.to_numpy())
    for bad in [("2", 0), (2,), [2, 0], None, (2.0, 0)]:
        with pytest.raises(TypeError, match="__dlpack_device__\\(\\) must return"):
            OwnedRasterArray.from_device(FakeDLPack(view, device=bad if bad is not None else 5))
    with pytest.raises(ValueError, match="the DLPack tensor is on device"):
        OwnedRasterArray.from_device(FakeDLPack(view, device=(2, 3)))
    with pytest.raises(TypeError, match="DLPack device type 7 is not CUDA"):
        OwnedRasterArray.from_device(FakeDLPack(view, device=(7, 0)))


def test_a_used_dlpack_capsule_is_refused(device_source):
    r, _ = device_source
    capsule = r.device_array().__dlpack__()

    class Reuses:
        def __dlpack_device__(self):
            return (2, 0)

        def __dlpack__(self, **kwargs):
            return capsule

    OwnedRasterArray.from_device(Reuses())
    with pytest.raises(TypeError, match="did not return an unused DLPack capsule"):
        OwnedRasterArray.from_device(Reuses())


def test_a_read_only_dlpack_tensor_is_imported_read_only(device_source):
    # A versioned capsule flagged read-only used to be refused as a wrong argument type.
    r, cai = device_source
    ro = DeviceArray(cai["data"][0], (2, 3, 4), np.float32, owner=r, readonly=True)
    ext = OwnedRasterArray.from_device(FakeDLPack(ro, versioned=True))
    assert ext.device_array().__cuda_array_interface__["data"][1] is True
    np.testing.assert_array_equal(ext.to_numpy(), r.to_numpy())


# ---- devices that do not exist -------------------------------------------------------------------

@on_emulator
@pytest.mark.parametrize("device", [64, -1, 2**31, -2**31 - 1, 2**70, 1000])
def test_memory_pool_stats_of_no_such_device_raises(device):
    # It used to return an empty snapshot, as if the device were real and unused.
    memory.configure_memory_pool()
    with pytest.raises(ValueError, match=f"memory_pool_stats: device {device} does not exist: "
                                         "this process has 1 device"):
        memory.memory_pool_stats(device)


@on_emulator
def test_memory_pool_stats_of_the_devices_there_are():
    memory.configure_memory_pool()
    assert memory.memory_pool_stats(0)["configured"] is True
    assert memory.memory_pool_stats(np.int64(0))["device"] == 0
    for bad in (True, 0.0, "0"):
        with pytest.raises(TypeError, match="device must be an integer"):
            memory.memory_pool_stats(bad)
    with pytest.raises(ValueError, match="device 1 does not exist"):
        memory.memory_pool_stats(1)


def test_memory_pool_stats_before_configuration_and_without_a_driver():
    out = run_python("""
        from vibespatial_raster import memory
        assert memory.memory_pool_stats()["configured"] is False
        assert memory.memory_pool_stats(3)["configured"] is False  # not known yet
        for d in (64, -1):
            try:
                memory.memory_pool_stats(d)
            except ValueError as e:
                print(e)
    """, env={"VIBESPATIAL_CUDA_DRIVER": "/nonexistent/libcuda.so.1"})
    lines = out.splitlines()
    assert lines[0].startswith("memory_pool_stats: device 64 does not exist: this process has "
                               "no usable CUDA device"), out
    assert lines[1].startswith("memory_pool_stats: device -1 does not exist"), out


# ---- OOM handlers raising what is not an Exception ----------------------------------------------

@pytest.fixture
def full_device():
    """All but ~112 MiB of the emulated device taken: a 200 MiB request runs the OOM chain."""
    gc.collect()
    memory.configure_memory_pool()
    hold = memory.DeviceBuffer(400 << 20)
    yield
    hold.close()
    memory.free_pool_memory()


@on_emulator
@pytest.mark.parametrize("kind", [KeyboardInterrupt, SystemExit, GeneratorExit])
def test_a_base_exception_from_an_oom_handler_comes_out_of_the_allocation(full_device, kind):
    calls = []
    raised = kind("from the handler")

    def handler(n):
        calls.append(n)
        raise raised

    before = memory.memory_pool_stats()
    hid = memory.add_oom_handler(handler)
    try:
        with pytest.raises(kind) as info:
            memory.DeviceBuffer(200 << 20)
        assert info.value is raised and calls == [200 << 20]
        # The chain is left as it was: the handler still registered, the pool's books intact,
        # and an allocation that fits works.
        with pytest.raises(kind):
            memory.DeviceBuffer(200 << 20)
        assert len(calls) == 2
        small = memory.DeviceBuffer(1 << 20)
        small.close()
        gc.collect()
        after = memory.memory_pool_stats()
        assert after["current_bytes"] == before["current_bytes"]
        assert after["oom_recoveries"] == before["oom_recoveries"]
    finally:
        memory.remove_oom_handler(hid)
    with pytest.raises(vr.OutOfMemoryError):
        memory.DeviceBuffer(200 << 20)
    assert len(calls) == 2


@on_emulator
def test_an_ordinary_exception_from_a_handler_is_still_reported_and_counts_as_nothing(
        full_device, monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(type(u.exc_value)))
    hid = memory.add_oom_handler(lambda n: 1 / 0)
    try:
        with pytest.raises(vr.OutOfMemoryError):
            memory.DeviceBuffer(200 << 20)
    finally:
        memory.remove_oom_handler(hid)
    assert seen and set(seen) == {ZeroDivisionError}


@on_emulator
def test_a_keyboard_interrupt_in_a_handler_stops_a_raster_move(full_device):
    r = OwnedRasterArray.from_numpy(np.ones((50, 1024, 1024), np.float32))  # 200 MiB

    def handler(n):
        raise KeyboardInterrupt

    hid = memory.add_oom_handler(handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            r.move_to("device")
    finally:
        memory.remove_oom_handler(hid)
    assert r.residency == "host" and r.to_numpy()[49, 1023, 1023] == 1


@on_emulator
def test_ctrl_c_and_sys_exit_inside_a_handler_reach_the_program():
    # They used to be printed as "Exception ignored" and the allocation raised OutOfMemoryError.
    env = dict(os.environ, VIBESPATIAL_CUDA_DRIVER=testing.emulator_path(),
               VSR_EMU_DEVICE_MEMORY=str(EMULATED_DEVICE_MEMORY))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import os, signal, sys, time
        # Python installs its KeyboardInterrupt handler only where SIGINT is not ignored at
        # start, and an ignored SIGINT is inherited from the parent (the test suite's process
        # may ignore it once other tests ran): install it, as an interactive program has it.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        import vibespatial_raster as vr
        from vibespatial_raster import memory
        hold = memory.DeviceBuffer(400 << 20)
        def ctrl_c(n):
            os.kill(os.getpid(), signal.SIGINT)  # as a terminal's Ctrl-C
            time.sleep(5)
            return False
        hid = memory.add_oom_handler(ctrl_c)
        try:
            memory.DeviceBuffer(200 << 20)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        memory.remove_oom_handler(hid)
        memory.add_oom_handler(lambda n: sys.exit(7))
        memory.DeviceBuffer(200 << 20)
        print("not reached")
    """)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 7, proc.stdout + proc.stderr
    assert proc.stdout == "interrupted\n", proc.stdout + proc.stderr
    assert "Exception ignored" not in proc.stderr, proc.stderr


# ---- handlers doing odd things -------------------------------------------------------------------

@on_emulator
def test_a_handler_may_allocate_on_another_thread_and_remove_itself(full_device):
    inner = []

    def handler(n):
        def other():
            b = memory.DeviceBuffer(1 << 20)  # fits: no second chain
            inner.append(b.ptr != 0)
            b.close()
        t = threading.Thread(target=other)
        t.start()
        t.join(30)
        memory.remove_oom_handler(hid)
        return False

    hid = memory.add_oom_handler(handler)
    with pytest.raises(vr.OutOfMemoryError):
        memory.DeviceBuffer(200 << 20)
    assert inner == [True]  # called once: it removed itself during the first round


def test_a_band_op_raising_keyboard_interrupt_stops_the_dispatch():
    r = OwnedRasterArray.from_numpy(np.ones((6, 8, 8), np.float32))

    def op(band):
        raise KeyboardInterrupt("stop")

    with pytest.raises(KeyboardInterrupt, match="stop"):
        dispatch.dispatch_per_band_cpu(r, op)
