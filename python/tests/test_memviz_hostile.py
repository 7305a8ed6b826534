# SPDX-License-Identifier: Apache-2.0
"""Snapshots that are not what the pool writes, read by memviz: a snapshot file is data (its
pickle may not name code to run), every value from it lands in the page escaped, its checker
works in ranges of addresses (not one entry per address), and the command line refuses a broken
snapshot, a device it does not have, a missing input or output directory in one line, exit 2."""

from __future__ import annotations

import copy
import html.parser
import io
import os
import pickle
import pickletools
import subprocess
import sys
import tracemalloc

import pytest

from vibespatial_raster import _core, memory, memviz

TIB = 1 << 40


def tiny_snapshot() -> dict:
    """A valid snapshot of one device: one segment of two blocks (one live), its history."""

    def event(action: str, t: int, **more: object) -> dict:
        return {"action": action, "size": 0, "stream": 0, "time_us": t, "frames": [],
                "user_metadata": "tile", **more}

    segment = {
        "device": 0, "address": 0x10000, "total_size": 4096, "allocated_size": 1024,
        "active_size": 1024, "requested_size": 1000, "stream": 0, "segment_type": "small",
        "segment_pool_id": (0, 0), "is_expandable": True, "frames": [],
        "blocks": [
            {"address": 0x10000, "size": 1024, "requested_size": 1000,
             "state": "active_allocated", "frames": [], "user_metadata": "tile"},
            {"address": 0x10400, "size": 3072, "requested_size": 0, "state": "inactive",
             "frames": []},
        ],
    }
    trace = [
        event("segment_map", 1, addr=0x10000, size=4096),
        event("alloc", 2, addr=0x10000, size=1000),
        event("alloc", 3, addr=0x10400, size=10),
        event("free_requested", 4, addr=0x10400, size=10),
        event("free_completed", 5, addr=0x10400, size=10),
        event("oom", 6, size=TIB, device_free=0),
        event("trim", 7, addr=0, size=0),
    ]
    return {"segments": [segment], "device_traces": [trace],
            "vibespatial": {"dropped_events": 0, "recording": True}}


def test_the_tiny_snapshot_is_valid():
    memviz.check_snapshot(tiny_snapshot(), complete=True)
    assert memviz.loads_snapshot(pickle.dumps(tiny_snapshot())) == tiny_snapshot()


# ---- every value of a snapshot is data in the page ----

PAYLOADS = ['<script>console.error("pwned")</script>', '"><img src=x onerror=alert(1)>',
            "'><svg onload=alert(1)>", "</title></polyline><!--", "\u2028\u2029</style>"]


class _Elements(html.parser.HTMLParser):
    """The elements and attribute names of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.attributes: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.attributes.update(name for name, _ in attrs)


def _elements(page: str) -> _Elements:
    parser = _Elements()
    parser.feed(page)
    parser.close()
    return parser


@pytest.mark.parametrize("payload", PAYLOADS, ids=["script", "attribute", "quote", "comment",
                                                   "separators"])
def test_every_string_of_a_snapshot_lands_in_the_page_as_text(payload):
    plain = _elements(memviz.to_html(tiny_snapshot()))
    snap = tiny_snapshot()
    seg = snap["segments"][0]
    seg["segment_type"] = payload
    for b in seg["blocks"]:
        b["user_metadata"] = payload + " block"
    for k, e in enumerate(snap["device_traces"][0]):
        e["user_metadata"] = f"{payload} {k}"
    page = memviz.to_html(snap)
    found = _elements(page)
    # No element or attribute that the page without the payload lacks: nothing was injected.
    assert found.tags == plain.tags and found.attributes == plain.attributes
    assert "<script" not in page and "<img" not in page and "<svg onload" not in page
    assert "<!--" not in page
    assert "\u2028" not in page and "\u2029" not in page


@pytest.mark.parametrize("dropped", ["<script>alert(1)</script>", -1, 1.5, None, True])
def test_a_count_that_is_not_a_count_is_refused(dropped):
    snap = tiny_snapshot()
    snap["vibespatial"]["dropped_events"] = dropped
    for function in (memviz.to_html, memviz.check_snapshot):
        with pytest.raises(memviz.SnapshotError, match="dropped_events"):
            function(snap)


@pytest.mark.parametrize("where, key, value", [
    ("segment", "segment_type", 7),
    ("segment", "address", "0x10"),
    ("segment", "total_size", -4096),
    ("block", "size", 1.5),
    ("block", "state", None),
    ("event", "action", ["alloc"]),
    ("event", "time_us", "now"),
    ("event", "user_metadata", 3),
    ("event", "addr", None),
])
def test_a_value_of_the_wrong_type_is_refused(where, key, value):
    snap = tiny_snapshot()
    target = {"segment": snap["segments"][0], "block": snap["segments"][0]["blocks"][0],
              "event": snap["device_traces"][0][1]}[where]
    target[key] = value
    for function in (memviz.to_html, memviz.check_snapshot, memviz.timeline):
        with pytest.raises(memviz.SnapshotError, match=key):
            function(snap)


def test_a_lone_surrogate_in_a_name_is_drawn():
    snap = tiny_snapshot()
    snap["device_traces"][0][1]["user_metadata"] = "tile \udc80"
    page = memviz.to_html(snap)
    page.encode("utf-8")  # writable as UTF-8


# ---- a snapshot file is data ----


class _RunsACommand:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _opcodes(*ops: bytes) -> bytes:
    return b"\x80\x04" + b"".join(ops) + b"."


@pytest.mark.parametrize("data, what", [
    (None, "system"),  # filled in by the test: a __reduce__ naming os.system
    (pickle.dumps({"segments": [], "device_traces": [], "x": b"bytes"}, protocol=4), "bytes"),
    (pickle.dumps({"segments": [], "device_traces": [], "x": {1, 2}}, protocol=4), "set"),
    (pickle.dumps({"segments": [], "device_traces": [], "x": frozenset()}, protocol=4),
     "frozenset"),
    (pickle.dumps({"segments": [], "device_traces": [], "x": bytearray(b"a")}, protocol=5),
     "bytearray"),
    (pickle.dumps({"segments": [], "device_traces": [], "x": 1j}, protocol=2), "complex"),
    (pickle.dumps([1, 2]), "list"),
], ids=["reduce", "bytes", "set", "frozenset", "bytearray", "complex", "top-level list"])
def test_the_loader_admits_only_the_formats_types(tmp_path, data, what):
    marker = tmp_path / "ran"
    if data is None:
        data = pickle.dumps({"segments": [_RunsACommand(str(marker))], "device_traces": []})
    with pytest.raises(memviz.SnapshotError, match=what.split()[0]):
        memviz.loads_snapshot(data)
    path = tmp_path / "snap.pickle"
    path.write_bytes(data)
    with pytest.raises(memviz.SnapshotError):
        memviz.load_snapshot(path)
    p = subprocess.run([sys.executable, "-m", "vibespatial_raster.memviz", str(path), "-o",
                        str(tmp_path / "out.html")], capture_output=True, text=True)
    assert p.returncode == 2 and len(p.stderr.splitlines()) == 1, p.stderr
    assert p.stderr.startswith("memviz: ") and "Traceback" not in p.stderr
    assert not marker.exists() and not (tmp_path / "out.html").exists()


def test_the_loader_reads_what_the_pool_writes_tuples_included():
    keep = memory.DeviceBuffer(4096)  # a segment, with its segment_pool_id pair
    try:
        data = _core.memory_snapshot_pickle()
    finally:
        keep.close()
    assert any(op.name == "TUPLE2" for op, _, _ in pickletools.genops(data))
    assert memviz.loads_snapshot(data) == pickle.loads(data)
    big = pickle.dumps({"segments": [], "device_traces": [[{"n": 2**70, "f": 0.5, "b": False,
                                                             "none": None, "t": (1, "x")}]]})
    assert memviz.loads_snapshot(big) == pickle.loads(big)


def test_memory_snapshot_reads_through_the_loader(monkeypatch, tmp_path):
    marker = tmp_path / "ran"
    hostile = pickle.dumps({"segments": [_RunsACommand(str(marker))], "device_traces": []})
    monkeypatch.setattr(_core, "memory_snapshot_pickle", lambda: hostile)
    with pytest.raises(memviz.SnapshotError, match="system"):
        memory.snapshot()
    assert not marker.exists()


def test_a_shared_or_cyclic_structure_is_read_once():
    # The pickle's memo lets one list hold itself, or one list be reached many times: the loader
    # checks each object once, and refuses what is not a snapshot without looping.
    shared = [0] * 10
    wide = {"segments": [], "device_traces": [[{"frames": [shared] * 1000}]]}
    assert memviz.loads_snapshot(pickle.dumps(wide)) == wide
    cyclic: list = []
    cyclic.append(cyclic)
    with pytest.raises(memviz.SnapshotError):
        memviz.check_snapshot(memviz.loads_snapshot(pickle.dumps(
            {"segments": [], "device_traces": cyclic})))


# ---- the checker works in ranges ----


def _one_map(size: int) -> dict:
    snap = tiny_snapshot()
    seg = snap["segments"][0]
    seg["total_size"] = seg["allocated_size"] = 1
    seg["blocks"] = [{"address": seg["address"], "size": 1, "requested_size": 1,
                      "state": "active_allocated", "frames": []}]
    snap["device_traces"][0] = [{"action": "segment_map", "addr": seg["address"], "size": size,
                                 "stream": 0, "time_us": 1, "frames": []}]
    return snap


def test_complete_checks_work_in_ranges_not_addresses():
    # A 1-byte segment and a map of 4 MiB: the old checker put every byte in a set.
    tracemalloc.start()
    try:
        with pytest.raises(memviz.SnapshotError, match="not the snapshot's segments"):
            memviz.check_snapshot(_one_map(4 << 20), complete=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < (1 << 20), peak
    with pytest.raises(memviz.SnapshotError, match="not the snapshot's segments"):
        memviz.check_snapshot(_one_map(TIB), complete=True)  # 1 TiB: as quick


def test_complete_checks_find_pages_mapped_twice_or_never():
    snap = tiny_snapshot()
    trace = snap["device_traces"][0]
    again = dict(trace[0], addr=0x10800, size=0x800, time_us=1)  # the tail of the map again
    broken = copy.deepcopy(snap)
    broken["device_traces"][0].insert(1, again)
    with pytest.raises(memviz.SnapshotError, match="mapped twice"):
        memviz.check_snapshot(broken, complete=True)
    broken = copy.deepcopy(snap)
    unmap = dict(trace[0], action="segment_unmap", addr=0x20000, size=0x1000, time_us=7)
    broken["device_traces"][0].append(unmap)
    with pytest.raises(memviz.SnapshotError, match="unmapped, never mapped"):
        memviz.check_snapshot(broken, complete=True)
    # An unmap of the tail of a mapped run, and the segment that is left: consistent.
    split = copy.deepcopy(snap)
    seg = split["segments"][0]
    seg["total_size"] = 0x800
    seg["blocks"] = [dict(seg["blocks"][0])]
    seg["blocks"][0]["size"] = 0x400
    seg["blocks"].append({"address": 0x10400, "size": 0x400, "requested_size": 0,
                          "state": "inactive", "frames": []})
    split["device_traces"][0].append(dict(unmap, addr=0x10800, size=0x800))
    memviz.check_snapshot(split, complete=True)
    assert not hasattr(memviz, "_gcd")


# ---- the command line ----


def _memviz(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vibespatial_raster.memviz", *args],
                          capture_output=True, text=True)


def _refused(p: subprocess.CompletedProcess, words: str) -> None:
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert len(p.stderr.splitlines()) == 1 and p.stderr.startswith("memviz: "), p.stderr
    assert words in p.stderr, p.stderr


@pytest.fixture
def snapshot_file(tmp_path):
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(tiny_snapshot(), protocol=2))
    return path


def test_the_cli_draws_the_tiny_snapshot(tmp_path, snapshot_file):
    p = _memviz(str(snapshot_file), "-o", str(tmp_path / "out.html"))
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert 'data-name="tile"' in (tmp_path / "out.html").read_text(encoding="utf-8")


@pytest.mark.parametrize("device", ["-1", "1", "64", "-999"])
def test_the_cli_refuses_a_device_the_snapshot_does_not_have(tmp_path, snapshot_file, device):
    _refused(_memviz(str(snapshot_file), "-o", str(tmp_path / "out.html"), "--device", device),
             f"device {device}")
    assert not (tmp_path / "out.html").exists()
    with pytest.raises(ValueError, match=f"device {device}"):
        memviz.timeline(tiny_snapshot(), int(device))
    with pytest.raises(ValueError, match=f"device {device}"):
        memviz.to_html(tiny_snapshot(), int(device))


def test_a_device_of_the_snapshot_is_drawn(tmp_path, snapshot_file):
    snap = tiny_snapshot()
    snap["device_traces"].append([])  # device 1: nothing recorded
    snapshot_file.write_bytes(pickle.dumps(snap))
    p = _memviz(str(snapshot_file), "-o", str(tmp_path / "out.html"), "--device", "1")
    assert p.returncode == 0, p.stderr
    assert "Device 1 memory" in (tmp_path / "out.html").read_text(encoding="utf-8")


def _truncated() -> bytes:
    data = pickle.dumps(tiny_snapshot())
    return data[: len(data) // 2]


@pytest.mark.parametrize("case, words", [
    ("not a pickle", "snap.pickle"),
    ("truncated", "snap.pickle"),
    ("wrong top-level type", "not a memory snapshot"),
    ("no device_traces", "device_traces"),
    ("a segment without its address", "address"),
    ("input missing", "cannot read"),
    ("output directory missing", "no-such-dir"),
    ("output is a directory", "a directory"),
])
def test_the_cli_refuses_broken_input_in_one_line(tmp_path, snapshot_file, case, words):
    out = tmp_path / "out.html"
    if case == "not a pickle":
        snapshot_file.write_text("this is text, not a pickle\n")
    elif case == "truncated":
        snapshot_file.write_bytes(_truncated())
    elif case == "wrong top-level type":
        snapshot_file.write_bytes(pickle.dumps([tiny_snapshot()]))
    elif case == "no device_traces":
        snap = tiny_snapshot()
        del snap["device_traces"]
        snapshot_file.write_bytes(pickle.dumps(snap))
    elif case == "a segment without its address":
        snap = tiny_snapshot()
        del snap["segments"][0]["address"]
        snapshot_file.write_bytes(pickle.dumps(snap))
    elif case == "input missing":
        snapshot_file.unlink()
    elif case == "output directory missing":
        out = tmp_path / "no-such-dir" / "out.html"
    elif case == "output is a directory":
        out = tmp_path / "a-dir"
        out.mkdir()
        _refused(_memviz(str(snapshot_file), "-o", str(out), "--overwrite"), words)
        assert os.listdir(out) == []
        return
    _refused(_memviz(str(snapshot_file), "-o", str(out)), words)
    assert not out.exists()
    assert sorted(os.listdir(tmp_path)) in ([], ["snap.pickle"])


def test_the_loader_refuses_the_broken_files_with_a_snapshot_error(tmp_path):
    for data in (b"this is text", _truncated(), b""):
        with pytest.raises(memviz.SnapshotError, match="not a snapshot pickle"):
            memviz.loads_snapshot(data)
    with pytest.raises(FileNotFoundError):
        memviz.load_snapshot(tmp_path / "missing.pickle")
    assert memviz.load_snapshot(io.BytesIO(pickle.dumps(tiny_snapshot()))) == tiny_snapshot()
