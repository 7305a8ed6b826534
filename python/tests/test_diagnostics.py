# SPDX-License-Identifier: Apache-2.0
"""The Python original's module factories, diagnostics and device nodata mask: from_numpy /
from_device at module level with the original's rules, the raster's bounded event log
(CREATED, TRANSFER with bytes and seconds, RUNTIME from the executors), runtime selections,
diagnostics_report(), and device_nodata_mask() computed once and cached."""

from __future__ import annotations

import dataclasses
import enum

import numpy as np
import pytest

from vibespatial_raster import buffers, dispatch
from vibespatial_raster.buffers import (DIAGNOSTICS_CAPACITY, DeviceArray, OwnedRasterArray,
                                        RasterDiagnosticEvent, RasterDiagnosticKind, Residency,
                                        RuntimeSelection, from_device, from_numpy)


def kinds(raster: OwnedRasterArray, kind: RasterDiagnosticKind) -> list[RasterDiagnosticEvent]:
    return [e for e in raster.diagnostics if e.kind == kind]


# ---- factories ----


def test_module_factories_are_the_classmethods():
    data = np.arange(12, dtype=np.int16).reshape(3, 4)
    r = from_numpy(data, nodata=-1, affine=(2, 0, 10, 0, -2, 20), crs="EPSG:4326")
    assert isinstance(r, OwnedRasterArray)
    assert r.shape == (3, 4) and r.nodata == -1 and r.crs == "EPSG:4326"
    assert r.affine == (2.0, 0.0, 10.0, 0.0, -2.0, 20.0)
    np.testing.assert_array_equal(r.to_numpy(), data)
    d = from_numpy(np.ones((2, 3, 4), np.float32), residency=Residency.DEVICE)
    assert d.residency is Residency.DEVICE and d.band_count == 2
    assert "from_numpy" in buffers.__all__ and "from_device" in buffers.__all__


@pytest.mark.parametrize("shape", [(5,), (1, 2, 3, 4)])
def test_from_numpy_refuses_1d_and_4d(shape):
    with pytest.raises(ValueError, match="2D .* or 3D"):
        from_numpy(np.zeros(shape, np.float32))


@pytest.mark.parametrize("dtype", ["uint8", "int16", "int32", "uint64"])
def test_from_numpy_refuses_a_nan_nodata_on_an_integer_dtype(dtype):
    with pytest.raises(ValueError, match="NaN nodata"):
        from_numpy(np.zeros((2, 2), dtype), nodata=float("nan"))
    # A NaN nodata on a float raster is fine.
    assert np.isnan(from_numpy(np.zeros((2, 2), np.float32), nodata=np.nan).nodata)


def test_from_device_uses_the_device_array_in_place():
    src = from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3), residency="device")
    view = src.device_array()
    r = from_device(view, nodata=5.0, affine=(1, 0, 0, 0, -1, 0))
    assert r.residency is Residency.DEVICE and r.nodata == 5.0
    np.testing.assert_array_equal(r.to_numpy(), np.arange(6).reshape(2, 3))
    created = kinds(r, RasterDiagnosticKind.CREATED)
    assert created and created[0].detail.startswith("from_device shape=(2, 3) dtype=float32")
    flat = DeviceArray(view.ptr, (6,), np.dtype(np.float32), owner=view, stream=1)
    with pytest.raises(ValueError, match="2D or 3D"):
        from_device(flat)
    four_d = DeviceArray(view.ptr, (1, 1, 2, 3), np.dtype(np.float32), owner=view, stream=1)
    with pytest.raises(ValueError, match="2D or 3D"):
        from_device(four_d)


# ---- diagnostics ----


def test_kinds_are_the_originals():
    assert [k.value for k in RasterDiagnosticKind] == ["created", "transfer", "materialization",
                                                        "runtime"]
    assert {f.name for f in dataclasses.fields(RasterDiagnosticEvent)} == {
        "kind", "detail", "residency", "visible_to_user", "elapsed_seconds", "bytes_transferred"}


def test_move_to_records_transfers_with_bytes_and_seconds():
    r = from_numpy(np.zeros((2, 8, 10), np.float32))
    assert [e.kind for e in r.diagnostics] == [RasterDiagnosticKind.CREATED]
    r.move_to("device")
    r.move_to("device")  # no copy, no event
    r.move_to("host")
    t = kinds(r, RasterDiagnosticKind.TRANSFER)
    assert [e.detail for e in t] == ["host->device 640 bytes (2x8x10 float32)",
                                     "device->host 640 bytes (2x8x10 float32)"]
    assert [e.residency for e in t] == [Residency.DEVICE, Residency.HOST]
    assert all(e.bytes_transferred == 640 and e.elapsed_seconds >= 0 and e.visible_to_user
               for e in t)


def test_to_numpy_of_a_device_raster_records_a_materialization():
    r = from_numpy(np.zeros((3, 4), np.float64), residency="device")
    r.to_numpy()
    m = kinds(r, RasterDiagnosticKind.MATERIALIZATION)
    assert [e.detail for e in m] == ["to_numpy device->host copy 96 bytes"]
    assert m[0].bytes_transferred == 96 and m[0].residency is Residency.DEVICE
    assert r.residency is Residency.DEVICE
    host = from_numpy(np.zeros((3, 4), np.float64))
    host.to_numpy()  # a view: nothing copied, nothing recorded
    assert kinds(host, RasterDiagnosticKind.MATERIALIZATION) == []


def test_external_device_memory_moved_to_the_host_keeps_its_log():
    src = from_numpy(np.ones((4, 4), np.uint16), residency="device")
    r = from_device(src.device_array())
    r.move_to("host")
    details = [e.detail for e in r.diagnostics]
    assert details[0].startswith("from_device") and details[-1].startswith("device->host 32 ")


def test_band_views_and_regeoreferenced_copies_share_the_log():
    r = from_numpy(np.zeros((3, 4, 4), np.uint8))
    v = r.band(1)
    v.record_runtime_selection(RuntimeSelection(selected="cpu", reason="test"))
    assert r.runtime_history == [RuntimeSelection(selected="cpu", reason="test")]
    g = r.with_georeferencing(nodata=3)
    assert g.diagnostics == r.diagnostics


def test_record_runtime_selection_takes_the_originals_selection_objects():
    class Mode(enum.Enum):
        GPU = "gpu"
        AUTO = "auto"

    @dataclasses.dataclass(frozen=True)
    class OriginalSelection:  # the shape of vibespatial.runtime.RuntimeSelection
        requested: Mode
        selected: Mode
        reason: str

    r = from_numpy(np.zeros((2, 2), np.float32))
    r.record_runtime_selection(OriginalSelection(Mode.AUTO, Mode.GPU, "device present"))
    assert r.runtime_history == [RuntimeSelection("gpu", "device present", "auto")]
    last = kinds(r, RasterDiagnosticKind.RUNTIME)[-1]
    assert last.detail.startswith("selected=gpu reason=device present")
    with pytest.raises(TypeError, match="RuntimeSelection"):
        r.record_runtime_selection("gpu")


def test_the_log_is_bounded():
    r = from_numpy(np.zeros((2, 2), np.float32))
    n = DIAGNOSTICS_CAPACITY + 25
    for i in range(n):
        r.record_runtime_selection(RuntimeSelection(selected=str(i)))
    events = r.diagnostics
    assert len(events) == DIAGNOSTICS_CAPACITY == 64
    assert events[-1].detail.startswith(f"selected={n - 1} ")
    assert len(r.runtime_history) == DIAGNOSTICS_CAPACITY
    assert r.diagnostics_report()["events_dropped"] == 26  # 25 selections + the CREATED event


def test_diagnostics_report_is_the_originals_dict():
    r = from_numpy(np.zeros((3, 5, 6), np.int32), nodata=-1)
    r.move_to("device")
    rep = r.diagnostics_report()
    assert {k: rep[k] for k in ("shape", "dtype", "band_count", "pixel_count", "nodata",
                                "residency", "device_allocated")} == {
        "shape": (3, 5, 6), "dtype": "int32", "band_count": 3, "pixel_count": 30, "nodata": -1,
        "residency": "device", "device_allocated": True}
    assert [e["kind"] for e in rep["events"]] == ["created", "transfer"]
    assert rep["events"][1]["bytes_transferred"] == 360
    assert set(rep["events"][1]) == {"kind", "detail", "residency", "elapsed_seconds",
                                     "bytes_transferred"}


def test_per_band_dispatch_records_the_executor_and_path():
    one = from_numpy(np.ones((4, 4), np.float32))
    out = dispatch.dispatch_per_band_cpu(one, lambda b: from_numpy(b.to_numpy() + 1))
    assert kinds(out, RasterDiagnosticKind.RUNTIME)[-1].detail.startswith(
        "dispatch_per_band_cpu single-band passthrough elapsed=")
    three = from_numpy(np.ones((3, 4, 5), np.float32))
    ops = [lambda b: from_numpy(b.to_numpy() * 2)]
    out = dispatch.dispatch_per_band_cpu(three, ops[0])
    detail = kinds(out, RasterDiagnosticKind.RUNTIME)[-1].detail
    assert detail.startswith("dispatch_per_band_cpu bands=3 shape=(4, 5) threads=")
    # The stack's log starts with its results' events (each result's CREATED).
    assert len(kinds(out, RasterDiagnosticKind.CREATED)) == 3
    gpu = dispatch.dispatch_per_band_gpu(three, ops[0])
    detail = kinds(gpu, RasterDiagnosticKind.RUNTIME)[-1].detail
    assert detail.startswith("dispatch_per_band_gpu bands=3 shape=(4, 5) batches=1 "
                             "bands_per_pass=3 pipeline_depth=")
    assert kinds(three, RasterDiagnosticKind.RUNTIME) == []  # the source is not touched


# ---- device_nodata_mask ----


@pytest.mark.parametrize("dtype, nodata", [("float32", float("nan")), ("float64", -9.0),
                                           ("int16", -9), ("uint8", None)])
def test_device_nodata_mask_is_computed_once_and_cached(dtype, nodata):
    data = np.arange(24).reshape(2, 3, 4).astype(dtype)
    if nodata is not None:
        data[0, 1, 2] = nodata
        data[1, 0, 0] = nodata
    r = from_numpy(data, nodata=nodata)
    mask = r.device_nodata_mask()
    assert r.residency is Residency.DEVICE
    assert mask is r.device_nodata_mask()  # cached
    got = mask.get() if hasattr(mask, "get") else mask.copy_to_host()
    np.testing.assert_array_equal(got.astype(bool), r.nodata_mask)
    assert got.astype(bool).sum() == (0 if nodata is None else 2)
    r.move_to("host")
    again = r.device_nodata_mask()  # the pixels moved: computed anew for the new storage
    assert again is not mask


def test_device_nodata_mask_of_a_nan_sentinel_on_integer_pixels_warns():
    src = from_numpy(np.zeros((2, 2), np.int32), residency="device")
    r = from_device(src.device_array())
    r._ext_geo = (float("nan"),) + r._ext_geo[1:]  # what a foreign producer can hand over
    with pytest.warns(UserWarning, match="NaN nodata"):
        mask = r.device_nodata_mask()
    assert not mask.copy_to_host().any()
