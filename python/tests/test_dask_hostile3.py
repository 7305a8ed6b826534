# SPDX-License-Identifier: Apache-2.0
"""vibespatial_raster.dask.write_raster under hostile use, judged by the file it leaves: the
merged GeoTIFF's GDAL NoData (read through GDAL itself), its pixels, and what is left beside
it after a writer was killed. Nothing here looks at how the merge is done."""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import os
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import numpy as np
import pytest

pytest.importorskip("dask.array")
pytest.importorskip("distributed")

import dask.array as da  # noqa: E402

from vibespatial_raster import io  # noqa: E402
from vibespatial_raster import dask as vd  # noqa: E402

pytestmark = pytest.mark.skipif(not io.io_available(), reason="built without GDAL")

DBL_MAX = sys.float_info.max
DENORMAL_MIN = 5e-324


# ---------------------------------------------------------------------------------------------
# The file's NoData as GDAL reads it (osgeo when installed, else GDAL's C API through ctypes)
# ---------------------------------------------------------------------------------------------


def _gdal_c():
    name = ctypes.util.find_library("gdal")
    for candidate in ([name] if name else []) + ["libgdal.so"]:
        try:
            lib = ctypes.CDLL(candidate)
        except OSError:
            continue
        if not hasattr(lib, "GDALGetRasterNoDataValueAsUInt64"):  # GDAL < 3.5
            return None
        lib.GDALAllRegister()
        lib.GDALOpen.restype = ctypes.c_void_p
        lib.GDALOpen.argtypes = [ctypes.c_char_p, ctypes.c_int]
        lib.GDALGetRasterBand.restype = ctypes.c_void_p
        lib.GDALGetRasterBand.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.GDALGetRasterDataType.argtypes = [ctypes.c_void_p]
        has = ctypes.POINTER(ctypes.c_int)
        for fn, restype in (("GDALGetRasterNoDataValue", ctypes.c_double),
                            ("GDALGetRasterNoDataValueAsInt64", ctypes.c_int64),
                            ("GDALGetRasterNoDataValueAsUInt64", ctypes.c_uint64)):
            getattr(lib, fn).restype = restype
            getattr(lib, fn).argtypes = [ctypes.c_void_p, has]
        lib.GDALClose.argtypes = [ctypes.c_void_p]
        return lib
    return None


GDAL_C = _gdal_c()
GDT_UINT64, GDT_INT64 = 12, 13


def gdal_nodata(path, band: int = 1):
    """Band ``band``'s NoData in GDAL's own reading: an int for 64-bit integer bands, else a
    float; None when the band has none."""
    try:
        from osgeo import gdal
    except ImportError:
        gdal = None
    if gdal is not None:
        b = gdal.Open(str(path)).GetRasterBand(band)
        if b.DataType == gdal.GDT_Int64:
            return b.GetNoDataValueAsInt64()
        if b.DataType == gdal.GDT_UInt64:
            return b.GetNoDataValueAsUInt64()
        return b.GetNoDataValue()
    if GDAL_C is None:
        pytest.skip("neither osgeo nor a GDAL >= 3.5 C library to read the file's NoData")
    ds = GDAL_C.GDALOpen(os.fspath(path).encode(), 0)
    assert ds, f"GDAL cannot open {path}"
    try:
        b = GDAL_C.GDALGetRasterBand(ds, band)
        kind = GDAL_C.GDALGetRasterDataType(b)
        has = ctypes.c_int(0)
        if kind == GDT_INT64:
            value = GDAL_C.GDALGetRasterNoDataValueAsInt64(b, ctypes.byref(has))
        elif kind == GDT_UINT64:
            value = GDAL_C.GDALGetRasterNoDataValueAsUInt64(b, ctypes.byref(has))
        else:
            value = GDAL_C.GDALGetRasterNoDataValue(b, ctypes.byref(has))
        return value if has.value else None
    finally:
        GDAL_C.GDALClose(ds)


def same_double(a: float, b: float) -> bool:
    """Bit for bit (so -0.0 is not 0.0), NaN equal to NaN."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return struct.pack("<d", a) == struct.pack("<d", b)


def sentinel_raster(dtype, sentinel) -> np.ndarray:
    """(2, 12, 10) pixels: ``sentinel`` at a few places in every 4 x 4 chunk, real zeros and
    ones elsewhere."""
    a = np.zeros((2, 12, 10), dtype)
    a[:, 1::4, 1::4] = 1
    a[:, ::4, ::3] = np.array(sentinel).astype(dtype) if np.dtype(dtype).kind == "f" else sentinel
    return a


# ---------------------------------------------------------------------------------------------
# 1. The merged file's NoData is the nodata given, exactly
# ---------------------------------------------------------------------------------------------

F64 = np.float64
EXACT_CASES = [
    # (dtype, nodata as given, the file's NoData)
    ("float64", np.finfo(F64).max, DBL_MAX),
    ("float64", -np.finfo(F64).max, -DBL_MAX),
    ("float64", DBL_MAX, DBL_MAX),
    ("float64", -DBL_MAX, -DBL_MAX),
    ("float64", np.float64(-1e300), -1e300),
    ("float64", np.float64(DENORMAL_MIN), DENORMAL_MIN),
    ("float64", DENORMAL_MIN, DENORMAL_MIN),
    ("float64", np.nextafter(0.0, 1.0) * 3, DENORMAL_MIN * 3),
    ("float64", np.float64(-0.0), -0.0),
    ("float64", -0.0, -0.0),
    ("float64", np.float64("nan"), math.nan),
    ("float64", np.float64("inf"), math.inf),
    ("float64", -math.inf, -math.inf),
    ("float64", np.float64(0.1), 0.1),
    # a float32 raster given its smallest subnormal as a NumPy float32
    ("float32", np.float32(1e-45), float(np.float32(1e-45))),
    ("float32", np.finfo(np.float32).max, float(np.finfo(np.float32).max)),
    ("uint64", 2**64 - 1, 2**64 - 1),
    ("uint64", np.uint64(2**64 - 1), 2**64 - 1),
    ("uint64", 2**63 + 1, 2**63 + 1),
    ("int64", 2**63 - 1, 2**63 - 1),
    ("int64", np.int64(2**63 - 1), 2**63 - 1),
    ("int64", -(2**63), -(2**63)),
    ("int64", np.int64(-(2**63)), -(2**63)),
    ("int64", np.int64(-(2**63) + 1), -(2**63) + 1),
    # the runtime holds nodata as a double: 2**64 and 2**63 are what the largest values become
    ("uint64", float(2**64 - 1), 2**64 - 1),
    ("uint64", 2**64, 2**64 - 1),
    ("int64", float(2**63 - 1), 2**63 - 1),
    ("int64", 2**63, 2**63 - 1),
    ("int32", np.int32(-(2**31)), float(-(2**31))),
    ("uint8", np.uint8(255), 255.0),
]


@pytest.mark.parametrize(("dtype", "nodata", "expected"), EXACT_CASES,
                         ids=[f"{d}-{type(n).__name__}-{n!r}" for d, n, _ in EXACT_CASES])
def test_the_merged_geotiff_keeps_the_nodata_exactly(tmp_path, dtype, nodata, expected):
    # Once a NumPy scalar was written into the merge as "np.float64(...)", which GDAL read as 0:
    # the sentinels counted as valid and the real zeros were masked.
    data = sentinel_raster(dtype, expected if np.dtype(dtype).kind in "iu" else nodata)
    out = tmp_path / "out.tif"
    vd.write_raster(da.from_array(data, chunks=(1, 4, 4)), out, nodata=nodata)
    got = gdal_nodata(out)
    if np.dtype(dtype).kind in "iu" and np.dtype(dtype).itemsize == 8:
        assert type(got) is int and got == expected
    else:
        assert same_double(got, expected), (got, expected)
    assert all(gdal_nodata(out, b) == got or same_double(gdal_nodata(out, b), got)
               for b in (1, 2))
    back = io.read_raster(out).to_numpy()
    np.testing.assert_array_equal(back, data)  # every pixel, the sentinels included
    marked = np.isnan(back) if isinstance(got, float) and math.isnan(got) else back == got
    assert marked[:, ::4, ::3].all()  # the sentinels are nodata
    if got != 0:  # (-0.0 marks the zeros too: it equals them)
        assert marked.sum() == 2 * 3 * 4  # and nothing else: real zeros are not
    assert not list(tmp_path.glob("out.tif.parts-*"))


def test_a_numpy_nodata_from_dataarray_attrs_is_kept_exactly(tmp_path):
    xr = pytest.importorskip("xarray")
    data = sentinel_raster("uint64", 2**64 - 1)
    arr = xr.DataArray(da.from_array(data, chunks=(1, 6, 5)), dims=("band", "y", "x"),
                       attrs={"nodata": np.uint64(2**64 - 1)})
    vd.write_raster(arr, tmp_path / "out.tif")
    assert gdal_nodata(tmp_path / "out.tif") == 2**64 - 1
    arr = xr.DataArray(da.from_array(sentinel_raster("float64", DBL_MAX), chunks=(1, 6, 5)),
                       dims=("band", "y", "x"), attrs={"_FillValue": np.float64(DBL_MAX)})
    vd.write_raster(arr, tmp_path / "f.tif")
    assert same_double(gdal_nodata(tmp_path / "f.tif"), DBL_MAX)


@pytest.mark.parametrize(("dtype", "nodata"), [
    ("uint64", -1), ("uint64", np.int64(-1)), ("uint64", 1e20), ("uint64", 0.5),
    ("uint64", 2**64 + 1), ("uint64", 1e30), ("int64", 1e19), ("int64", -1e19),
    ("int64", -(2**63) - 1), ("int64", 1.5),
    ("int64", math.inf),
])
def test_a_64_bit_nodata_gdal_cannot_keep_is_refused_before_any_work(tmp_path, dtype, nodata):
    # GDAL reads a 64-bit band's NoData as an integer of its type: 1e20 became 1 and 0.5 became 0
    # in the file, so real pixels of those values were marked as nodata.
    out = tmp_path / "out.tif"
    with pytest.raises(ValueError, match=r"^write_raster: nodata .* cannot be the nodata of a"):
        vd.write_raster(da.from_array(np.ones((1, 8, 8), dtype), chunks=4), out, nodata=nodata)
    assert list(tmp_path.iterdir()) == []  # no file, no parts


@pytest.mark.parametrize("nodata", [1e300, -1e300, 1e-50, -1e-46, np.float64(3.5e38)])
def test_a_float32_nodata_beyond_float32_is_refused_before_any_work(tmp_path, nodata):
    # GDAL keeps a float32 band's nodata as a float32: 1e300 became inf and 1e-50 became 0 in
    # the file, so every real zero (or infinity) was nodata.
    out = tmp_path / "out.tif"
    with pytest.raises(ValueError, match=r"^write_raster: nodata .* beyond float32's range"):
        vd.write_raster(da.zeros((1, 8, 8), dtype=np.float32, chunks=4), out, nodata=nodata)
    assert list(tmp_path.iterdir()) == []


def test_process_geotiff_keeps_a_uint64_files_largest_nodata(tmp_path):
    # The file's nodata reaches the op as a double (2**64); the output keeps 2**64 - 1.
    src = tmp_path / "in.tif"
    vd.write_raster(da.from_array(sentinel_raster("uint64", 2**64 - 1), chunks=(1, 6, 5)), src,
                    nodata=2**64 - 1)
    out = tmp_path / "out.tif"
    vd.process_geotiff(src, out, lambda r: r, chunks=(1, 6, 5), progress=False)
    assert gdal_nodata(out) == 2**64 - 1
    np.testing.assert_array_equal(io.read_raster(out).to_numpy(), io.read_raster(src).to_numpy())


# ---------------------------------------------------------------------------------------------
# 2. Parts directories of killed writers
# ---------------------------------------------------------------------------------------------

# A writer in a child process whose second chunk blocks until it is killed (the first is
# written, so its parts directory holds a part): it prints "parts" once a part is there.
WRITER = """
    import os, sys, time
    import numpy as np
    import dask
    import dask.array as da
    from vibespatial_raster import dask as vd

    out, flag = sys.argv[1], sys.argv[2]

    def block(b, block_info=None):
        if block_info[0]["chunk-location"] != (0, 0, 0):
            while not any(n.startswith("part-") for d in os.listdir(os.path.dirname(out))
                          if d.startswith(os.path.basename(out) + ".parts-")
                          for n in os.listdir(os.path.join(os.path.dirname(out), d))):
                time.sleep(0.01)
            open(flag, "w").close()
            time.sleep(600)
        return b

    arr = da.zeros((1, 8, 8), dtype=np.uint8, chunks=(1, 8, 4)).map_blocks(block,
                                                                          dtype=np.uint8)
    with dask.config.set(scheduler="threads", num_workers=2):
        vd.write_raster(arr, out)
"""


def parts_dirs(out) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(out.name + ".parts-"))


def start_writer(out, tmp_path) -> subprocess.Popen:
    """A writer of ``out`` in a child process, blocked mid-write with a part written."""
    from vibespatial_raster import testing

    flag = tmp_path / f"flag-{len(list(tmp_path.glob('flag-*')))}"
    env = dict(os.environ, VIBESPATIAL_CUDA_DRIVER=testing.emulator_path())
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(WRITER), str(out), str(flag)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120  # a guard against a hang, not a timing
    while not flag.exists():
        if child.poll() is not None:
            pytest.fail(f"the writer exited {child.returncode}: {child.stderr.read().decode()}")
        if time.monotonic() > deadline:
            child.kill()
            pytest.fail("the writer never got mid-write")
        time.sleep(0.02)
    return child


def kill(child: subprocess.Popen) -> None:
    child.send_signal(signal.SIGKILL)
    child.wait()
    child.stdout.close()
    child.stderr.close()


def small_write(out, value: int = 7):
    data = np.full((1, 8, 8), value, np.uint8)
    vd.write_raster(da.from_array(data, chunks=4), out)
    np.testing.assert_array_equal(io.read_raster(out).to_numpy(), data)


def test_a_killed_writers_parts_are_removed_by_the_next_write(tmp_path):
    out = tmp_path / "out.tif"
    child = start_writer(out, tmp_path)
    kill(child)
    left = parts_dirs(out)
    assert len(left) == 1 and any(n.startswith("part-") for n in os.listdir(tmp_path / left[0]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a dead writer's parts are removed, not reported
        small_write(out)
    assert parts_dirs(out) == []


def test_a_live_writers_parts_are_never_removed(tmp_path):
    out = tmp_path / "out.tif"
    child = start_writer(out, tmp_path)
    try:
        live = parts_dirs(out)
        assert len(live) == 1
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a live writer is known alive: nothing to report
            small_write(out)
        assert parts_dirs(out) == live  # the child's parts survive a write of the same path
        assert any(n.startswith("part-") for n in os.listdir(tmp_path / live[0]))
    finally:
        kill(child)
    small_write(out, 9)  # now the child is gone: its parts go
    assert parts_dirs(out) == []


def test_another_threads_write_of_the_same_path_keeps_its_parts(tmp_path):
    out = tmp_path / "out.tif"
    entered, release = threading.Event(), threading.Event()
    data = np.arange(64, dtype=np.uint8).reshape(1, 8, 8)

    def block(b, block_info=None):
        if block_info[0]["chunk-location"] == (0, 0, 1):
            entered.set()
            release.wait(120)
        return b

    errors: list[BaseException] = []

    def first():
        try:
            vd.write_raster(da.from_array(data, chunks=(1, 8, 4)).map_blocks(
                block, dtype=np.uint8), out)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=first)
    t.start()
    try:
        assert entered.wait(120)
        live = parts_dirs(out)
        assert len(live) == 1
        other = tmp_path / "other.tif"
        small_write(other)  # another target: its own parts only
        small_write(out, 3)  # the same target, from this thread, while the first write runs
        assert parts_dirs(out) == live
    finally:
        release.set()
        t.join()
    assert errors == []  # the first write found its parts and finished
    np.testing.assert_array_equal(io.read_raster(out).to_numpy(), data)
    assert parts_dirs(out) == []


def test_leftovers_that_cannot_be_judged_are_reported_not_removed(tmp_path):
    # A parts directory of this naming without a lock record: an older version's, or a writer
    # on another machine whose process cannot be seen from here.
    out = tmp_path / "out.tif"
    legacy = tmp_path / "out.tif.parts-0123456789ab"
    legacy.mkdir()
    (legacy / "part-b0-r0-c0.tif").write_bytes(b"x")
    with pytest.warns(RuntimeWarning, match=r"write_raster: 1 parts directories .*"
                      r"out\.tif\.parts-0123456789ab"):
        small_write(out)
    assert (legacy / "part-b0-r0-c0.tif").read_bytes() == b"x"


def test_a_dead_writer_of_another_host_is_reported_not_removed(tmp_path):
    # From another host a lock may not be seen (NFS with local_lock=flock): a free lock there
    # does not prove the writer gone. The lock record of a killed writer is made to name
    # another host, as a writer there would have written it.
    out = tmp_path / "out.tif"
    kill(start_writer(out, tmp_path))
    (left,) = parts_dirs(out)
    (tmp_path / left / "writer.lock").write_bytes(b"pid 1 on another-host.example\n")
    with pytest.warns(RuntimeWarning, match=rf"write_raster: 1 parts directories .*{left}"):
        small_write(out)
    assert parts_dirs(out) == [left]


def test_only_this_targets_parts_directories_are_touched(tmp_path):
    # A dead writer of "out.tif" left parts; the sweep of another target, and of a target whose
    # own name holds ".parts-", must not remove them, nor user files and links named alike.
    out = tmp_path / "out.tif"
    kill(start_writer(out, tmp_path))
    dead = parts_dirs(out)
    assert len(dead) == 1
    user_file = tmp_path / "out.tif.parts-aaaaaaaaaaaa"  # a user's file of the naming
    user_file.write_bytes(b"keep")
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "writer.lock").write_bytes(b"")
    (precious / "data").write_bytes(b"keep")
    (tmp_path / "out.tif.parts-bbbbbbbbbbbb").symlink_to(precious, target_is_directory=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        small_write(tmp_path / "out.tif.parts-cccccccccccc")  # a target named like parts
        small_write(tmp_path / "out")
        small_write(tmp_path / "o.tif")
    assert parts_dirs(out) == sorted(dead + ["out.tif.parts-aaaaaaaaaaaa",
                                             "out.tif.parts-bbbbbbbbbbbb",
                                             "out.tif.parts-cccccccccccc"])
    small_write(out)
    assert user_file.read_bytes() == b"keep"
    assert (precious / "data").read_bytes() == b"keep"  # the link is never followed
    assert (tmp_path / "out.tif.parts-bbbbbbbbbbbb").is_symlink()
    assert not (tmp_path / dead[0]).exists()
    np.testing.assert_array_equal(io.read_raster(tmp_path / "out.tif.parts-cccccccccccc")
                                  .to_numpy(), np.full((1, 8, 8), 7, np.uint8))


def test_a_failed_write_leaves_no_parts_and_no_lock(tmp_path):
    out = tmp_path / "out.tif"

    def boom(b):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        vd.write_raster(da.zeros((1, 8, 8), dtype=np.uint8, chunks=4).map_blocks(
            boom, dtype=np.uint8), out)
    assert list(tmp_path.iterdir()) == []
