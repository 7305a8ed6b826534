# SPDX-License-Identifier: Apache-2.0
"""The memory history and snapshots from Python: record_memory_history, tag, snapshot,
dump_snapshot, the owners in memory_pool_stats, and the snapshot checker (memviz), with the
CuPy, PyTorch and Numba stand-ins of test_allocators.py tagged "cupy", "torch" and "numba"."""

from __future__ import annotations

import copy
import gc
import importlib.util
import os
import pathlib
import pickle
import random
import threading
import time

import pytest

from test_allocators import fake_cupy, fake_numba, fake_torch, torch_entry_points  # noqa: F401
from vibespatial_raster import _core, allocators, memory, memviz

MIB = 1 << 20


@pytest.fixture
def recording():
    memory.record_memory_history(True, 100_000)
    yield
    memory.record_memory_history(False)


def _allocs(snap):
    return [e for e in snap["device_traces"][0] if e["action"] == "alloc"]


def test_record_memory_history_refuses_bad_input():
    for bad in (0, -1, 2**24 + 1, 2**70):
        with pytest.raises(ValueError, match="max_entries"):
            memory.record_memory_history(True, bad)
    for bad in ("5", 1.5, True, None):
        with pytest.raises(TypeError, match="max_entries"):
            memory.record_memory_history(True, bad)
    with pytest.raises(TypeError, match="enabled"):
        memory.record_memory_history("yes")
    assert not _core.memory_history_enabled()  # nothing changed


def test_tags_refuse_bad_input_and_unbalanced_pops():
    for bad in (5, b"bytes", None):
        with pytest.raises(TypeError):
            memory.tag(bad)
    for bad in ("", "x" * 257, "a\0b", "\ud800"):
        with pytest.raises(ValueError):
            memory.tag(bad)
    with pytest.raises(ValueError):
        memory.marker("")
    assert _core.memory_tag_depth() == 0
    with pytest.raises(RuntimeError, match="no memory tag"):
        _core.pop_memory_tag()
    with memory.tag("é" * 128):  # 256 bytes of UTF-8: the longest
        assert _core.current_memory_tag() == "é" * 128
        with memory.tag("inner"):
            assert _core.current_memory_tag() == "inner"
    assert _core.current_memory_tag() == "user" and _core.memory_tag_depth() == 0


def test_a_session_with_the_frameworks_passes_the_checker(
        fake_cupy, fake_numba, torch_entry_points, recording, pool_baseline):  # noqa: F811
    malloc, free = torch_entry_points
    memory.marker("start")
    with memory.tag("tile 3"):
        tile = memory.DeviceBuffer(3 * MIB)
        small = memory.DeviceBuffer(1000)
    plain = memory.DeviceBuffer(5000)
    cp = allocators.cupy_allocator(2 * MIB)
    allocators.use_numba_allocator()
    mm = fake_numba[0](context="ctx")
    mm.initialize()
    nb = mm.memalloc(MIB)
    tp = malloc(4 * MIB, 0, None)
    with memory.tag("mine"):
        cp_mine = allocators.cupy_allocator(700)  # a tag the caller set wins
    snap = memory.snapshot()
    memviz.check_snapshot(snap)
    owner = {e["addr"]: e["user_metadata"] for e in _allocs(snap)}
    assert owner[tile.ptr] == "tile 3" and owner[small.ptr] == "tile 3"
    assert owner[plain.ptr] == "user"
    assert owner[cp.ptr] == "cupy" and owner[cp_mine.ptr] == "mine"
    assert owner[nb.device_pointer.value] == "numba"
    assert owner[tp] == "torch"
    assert snap["device_traces"][0][0]["action"] == "annotate"
    assert snap["device_traces"][0][0]["user_metadata"] == "start"
    live = {b["address"]: b for s in snap["segments"] for b in s["blocks"]
            if b["state"] == "active_allocated"}
    assert live[tile.ptr]["requested_size"] == 3 * MIB
    assert live[tp]["user_metadata"] == "torch"
    owners = memory.memory_pool_stats()["owners"]
    assert owners["torch"] == {"live_bytes": 4 * MIB, "live_count": 1}
    assert owners["tile 3"] == {"live_bytes": 3 * MIB + 1000, "live_count": 2}
    assert owners["cupy"]["live_bytes"] == 2 * MIB
    assert owners["numba"]["live_bytes"] == MIB
    assert list(owners)[0] == "torch"  # largest first
    free(tp, 4 * MIB, 0, None)
    del cp, cp_mine, nb
    for b in (tile, small, plain):
        b.close()
    mm.reset()
    gc.collect()
    memory.free_pool_memory()
    snap = memory.snapshot()
    memviz.check_snapshot(snap)
    assert "torch" not in memory.memory_pool_stats()["owners"]
    actions = {e["action"] for e in snap["device_traces"][0]}
    assert {"alloc", "free_requested", "free_completed", "segment_map", "segment_unmap",
            "trim"} <= actions


def test_a_history_recorded_from_an_empty_pool_is_complete(recording):
    memory.free_pool_memory()
    memory.record_memory_history(False)
    memory.record_memory_history(True, 1000)  # a new history, with nothing mapped
    bufs = [memory.DeviceBuffer(n) for n in (100, 3 * MIB, 7000, 9 * MIB)]
    for b in bufs[::2]:
        b.close()
    memory.free_pool_memory()
    memviz.check_snapshot(memory.snapshot(), complete=True)
    for b in bufs[1::2]:
        b.close()
    memory.free_pool_memory()
    snap = memory.snapshot()
    memviz.check_snapshot(snap, complete=True)


def test_the_checker_catches_broken_snapshots(recording):
    keep = memory.DeviceBuffer(3 * MIB)
    memory.DeviceBuffer(2000).close()
    snap = memory.snapshot()
    memviz.check_snapshot(snap)
    broken = copy.deepcopy(snap)
    broken["segments"][0]["blocks"][0]["size"] += 4096
    with pytest.raises(memviz.SnapshotError, match="add up"):
        memviz.check_snapshot(broken)
    broken = copy.deepcopy(snap)
    trace = broken["device_traces"][0]
    i = max(k for k, e in enumerate(trace) if e["action"] == "free_completed")
    del trace[i]
    with pytest.raises(memviz.SnapshotError, match="never completed"):
        memviz.check_snapshot(broken)
    broken = copy.deepcopy(snap)
    for seg in broken["segments"]:
        for b in seg["blocks"]:
            if b["address"] == keep.ptr:
                b["state"] = "inactive"
                seg["allocated_size"] -= b["size"]
    with pytest.raises(memviz.SnapshotError, match="not live"):
        memviz.check_snapshot(broken)
    keep.close()


def test_the_checker_replays_the_trace_back_from_the_snapshot():
    # As MemoryViz's segment view does: every block live at an event lies in a segment then.
    memory.free_pool_memory()
    memory.record_memory_history(True, 1000)  # every page mapped is in the trace
    try:
        keep = memory.DeviceBuffer(3 * MIB)
        gone = memory.DeviceBuffer(5 * MIB)
        gone_ptr = gone.ptr
        gone.close()
        memory.free_pool_memory()
        snap = memory.snapshot()
        keep.close()
    finally:
        memory.record_memory_history(False)
    memviz.check_snapshot(snap)
    trace = snap["device_traces"][0]
    broken = copy.deepcopy(snap)
    outside = max(s["address"] + s["total_size"] for s in snap["segments"]) + 64 * MIB
    for e in broken["device_traces"][0]:  # its alloc and free balance, in no segment
        if e.get("addr") == gone_ptr and e["action"] in ("alloc", "free_requested",
                                                          "free_completed"):
            e["addr"] = outside
    with pytest.raises(memviz.SnapshotError, match="in no segment while it is live"):
        memviz.check_snapshot(broken)
    broken = copy.deepcopy(snap)
    i = max(k for k, e in enumerate(trace) if e["action"] == "segment_unmap")
    del broken["device_traces"][0][i]
    with pytest.raises(memviz.SnapshotError, match="not all in a segment"):
        memviz.check_snapshot(broken)


@pytest.mark.parametrize("env", [{"VIBESPATIAL_GPU_MANAGED_MEMORY": "1"}, {"VSR_EMU_VMM": "0"}])
def test_a_history_of_tiers_c_and_fallback_passes_the_checker(env):
    from conftest import run_python

    # Each driver allocation is a segment: the viewer's segment view finds every live block in
    # one, and the segments are what segment_alloc / segment_free replay to.
    out = run_python(
        """
        from vibespatial_raster import memory, memviz
        memory.record_memory_history(True)
        a = memory.DeviceBuffer(3 << 20)
        b = memory.DeviceBuffer(1000)
        a.close()
        snap = memory.snapshot()
        try:
            memviz.check_snapshot(snap)
            memviz.check_snapshot(snap, complete=True)
            print("passed")
        except memviz.SnapshotError as e:
            print(e)
        actions = {e["action"] for e in snap["device_traces"][0]}
        print("segment_alloc" in actions, len(snap["segments"]) >= 1,
              all(not s["is_expandable"] for s in snap["segments"]))
        b.close()
        memory.free_pool_memory()
        snap = memory.snapshot()
        memviz.check_snapshot(snap, complete=True)
        print(snap["segments"])
        """, env)
    assert out.split("\n")[:3] == ["passed", "True True True", "[]"], out


def test_memviz_held_bytes_start_from_what_was_mapped_before_recording():
    memory.free_pool_memory()
    before = memory.DeviceBuffer(6 * MIB)  # mapped before recording starts, unmapped during it
    memory.record_memory_history(True, 1000)
    try:
        before.close()
        with memory.tag("tile"):
            tile = memory.DeviceBuffer(3 * MIB)
        memory.free_pool_memory()
        snap = memory.snapshot()
        tile.close()
    finally:
        memory.record_memory_history(False)
    held = memviz.timeline(snap)["series"]["held"]
    assert min(held) >= 0
    assert held[-1] == sum(s["total_size"] for s in snap["segments"])
    assert held[0] >= 6 * MIB  # still mapped at the first event (a free)


def test_the_oom_message_says_why(recording):
    from vibespatial_raster import OutOfMemoryError

    with memory.tag("big tile"):
        keep = memory.DeviceBuffer(5 * MIB)
        with pytest.raises(OutOfMemoryError) as info:
            memory.DeviceBuffer(1 << 40)
    text = str(info.value)
    assert info.value.requested_bytes == 1 << 40
    for part in ("requested 1.00 TiB", "the driver reports", "free large pages (slack)",
                 "free small-block slots", "the largest request it could serve",
                 "top owners by live bytes: big tile 5.00 MiB in 1 block"):
        assert part in text, text
    keep.close()


def test_dump_snapshot_writes_all_or_nothing(tmp_path, recording):
    buf = memory.DeviceBuffer(2 * MIB)
    path = tmp_path / "snap.pickle"
    memory.dump_snapshot(path)
    with open(path, "rb") as f:
        data = pickle.load(f)
    assert set(data) >= {"segments", "device_traces"}
    memviz.check_snapshot(data)
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)
    before = path.read_bytes()
    with pytest.raises(FileExistsError):
        memory.dump_snapshot(path)
    assert path.read_bytes() == before  # kept
    memory.dump_snapshot(str(path), overwrite=True)
    with pytest.raises(FileNotFoundError):
        memory.dump_snapshot(tmp_path / "missing" / "snap.pickle")
    with pytest.raises(ValueError):
        memory.dump_snapshot("")
    with pytest.raises(TypeError):
        memory.dump_snapshot(5)
    with pytest.raises(TypeError):
        memory.dump_snapshot(path, overwrite=1)
    assert sorted(os.listdir(tmp_path)) == ["snap.pickle"]  # no temporary file left
    buf.close()


def _torch_memory_viz():
    """PyTorch's torch/cuda/_memory_viz.py: from an installed torch, or the file named by
    VSR_TORCH_MEMORY_VIZ (taken out of a torch wheel: it imports no torch at module level)."""
    path = os.environ.get("VSR_TORCH_MEMORY_VIZ")
    if path:
        spec = importlib.util.spec_from_file_location("_memory_viz", pathlib.Path(path))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    if importlib.util.find_spec("torch") is None:
        pytest.skip("PyTorch is not installed (and VSR_TORCH_MEMORY_VIZ is not set): "
                    "its _memory_viz cannot run; memviz.check_snapshot covers its invariants")
    from torch.cuda import _memory_viz

    return _memory_viz


def test_pytorchs_memory_viz_reads_the_snapshot(recording):
    viz = _torch_memory_viz()
    keep = [memory.DeviceBuffer(n) for n in (3 * MIB, 600, 9000)]
    keep.pop().close()
    snap = memory.snapshot()
    assert "segments:" in viz.segsum(snap)
    assert "entries" in viz.trace(snap)
    for b in keep:
        b.close()


@pytest.mark.parametrize("env, segments", [({"VIBESPATIAL_GPU_MANAGED_MEMORY": "1"}, 1),
                                           ({"VSR_EMU_VMM": "0"}, 2)])
def test_pytorchs_memory_viz_reads_tiers_c_and_fallback(env, segments):
    # Their driver allocations are cudaMalloc / cudaFree lines of PyTorch's trace, and segments
    # of its segsum (tier C frees at once; the fallback caches the freed block).
    from conftest import run_python

    _torch_memory_viz()  # skips without it
    path = os.environ.get("VSR_TORCH_MEMORY_VIZ", "")
    out = run_python(
        f"""
        import importlib.util
        if {path!r}:
            spec = importlib.util.spec_from_file_location("_memory_viz", {path!r})
            viz = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(viz)
        else:
            from torch.cuda import _memory_viz as viz
        from vibespatial_raster import memory
        memory.record_memory_history(True)
        a = memory.DeviceBuffer(3 << 20)
        b = memory.DeviceBuffer(1000)
        a.close()
        snap = memory.snapshot()
        print(viz.segsum(snap).splitlines()[1])
        text = viz.trace(snap)
        print(text.count("cudaMalloc("), text.count("cudaFree("))
        b.close()
        memory.free_pool_memory()
        text = viz.trace(memory.snapshot())
        print(text.count("cudaMalloc("), text.count("cudaFree("))
        """, env)
    freed = 2 - segments
    assert out.split("\n")[:3] == [f"segments: {segments}", f"2 {freed}", "2 2"], out


def test_pytorchs_memory_viz_reads_a_session_with_the_frameworks(
        tmp_path, fake_cupy, fake_numba, torch_entry_points, recording,  # noqa: F811
        pool_baseline):
    # Every kind of event: the stand-ins' blocks, tags, a marker, an OOM, frees, a trim; read
    # back from the pickle, as PyTorch's readers get it.
    from vibespatial_raster import OutOfMemoryError

    viz = _torch_memory_viz()
    malloc, free = torch_entry_points
    memory.marker("start")
    with memory.tag("tile 3"):
        tile = memory.DeviceBuffer(3 * MIB)
        with pytest.raises(OutOfMemoryError):
            memory.DeviceBuffer(1 << 40)
    cp = allocators.cupy_allocator(2 * MIB)
    allocators.use_numba_allocator()
    mm = fake_numba[0](context="ctx")
    mm.initialize()
    nb = mm.memalloc(MIB)
    tp = malloc(4 * MIB, 0, None)
    small = memory.DeviceBuffer(1000)
    free(tp, 4 * MIB, 0, None)
    tile.close()
    memory.free_pool_memory()
    memory.marker("end")
    path = tmp_path / "session.pickle"
    memory.dump_snapshot(path)
    with open(path, "rb") as f:
        snap = pickle.load(f)
    memviz.check_snapshot(snap)
    text = viz.segsum(snap)
    assert f"segments: {len(snap['segments'])}" in text
    text = viz.trace(snap)
    assert f"{len(snap['device_traces'][0])} entries" in text
    assert "raise OutOfMemoryError" in text and "# annotate" in text
    assert "import {add_local_files}" in viz.trace_plot(snap)
    del cp, nb
    small.close()
    mm.reset()
    gc.collect()


def test_memviz_draws_one_self_contained_html_file(tmp_path, recording):
    import re
    import shutil
    import subprocess
    import sys

    from vibespatial_raster import OutOfMemoryError

    with memory.tag("tile 1"):
        a = memory.DeviceBuffer(3 * MIB)
    with memory.tag("tile 2"):
        b = memory.DeviceBuffer(5 * MIB)
        with pytest.raises(OutOfMemoryError):
            memory.DeviceBuffer(1 << 40)
    a.close()
    memory.free_pool_memory()
    snap = tmp_path / "snap.pickle"
    memory.dump_snapshot(snap)
    out = tmp_path / "out.html"
    cmd = [sys.executable, "-m", "vibespatial_raster.memviz", str(snap), "-o", str(out)]
    subprocess.run(cmd, check=True)
    html = out.read_text(encoding="utf-8")
    for outside in ("<script", "<link", "src=", "url(", "@import"):
        assert outside not in html  # nothing to fetch: it opens on a machine with no network
    assert set(re.findall(r'class="series" data-name="([^"]*)"', html)) == {
        "held", "tile 1", "tile 2"}
    assert html.count('class="mark oom"') == 1 and html.count('class="mark trim"') == 1
    assert html.count('class="segment"') == len(memory.snapshot()["segments"])
    p = subprocess.run(cmd, capture_output=True)
    assert p.returncode == 2 and b"exists" in p.stderr  # an existing output is refused
    with open(snap, "rb") as f:
        data = pickle.load(f)
    data["segments"] = []  # as tiers C and fallback write it: drawn, with a warning
    bare = tmp_path / "bare.pickle"
    with open(bare, "wb") as f:
        pickle.dump(data, f)
    p = subprocess.run(cmd[:3] + [str(bare), "-o", str(tmp_path / "bare.html")],
                       capture_output=True)
    assert p.returncode == 0 and b"warning: the snapshot breaks" in p.stderr
    assert (tmp_path / "bare.html").read_text(encoding="utf-8").count('class="series"') == 3
    os.unlink(bare)
    os.unlink(tmp_path / "bare.html")
    subprocess.run(cmd + ["--overwrite"], check=True)
    assert sorted(os.listdir(tmp_path)) == ["out.html", "snap.pickle"]
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        b.close()
        pytest.skip("no headless chromium here to load the page in (the checks above ran)")
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--dump-dom", out.as_uri()],
                         capture_output=True, timeout=120)
    assert dom.returncode == 0 and dom.stdout.count(b'class="series"') == 3
    b.close()


def test_snapshots_taken_while_threads_allocate_are_one_cut(pool_baseline):
    # Each snapshot's trace and segments agree (memviz.check_snapshot) while other threads
    # allocate and free: the snapshot reads both at one cut. Read at two moments, a block freed
    # in between is "allocated, never freed and not live". A small bound: events are let go all
    # the time, and the trace must still be every event after one moment.
    memory.record_memory_history(True, 4096)
    stop = threading.Event()
    errors = []
    shared = []  # blocks one thread allocated and another frees
    made = [0]  # allocations so far, of all threads

    def work(seed):
        rng = random.Random(seed)
        live = []
        try:
            while not stop.is_set():
                live.append(memory.DeviceBuffer(rng.choice((64, 256, 1000, 4096, 20000, 3 * MIB))))
                made[0] += 1
                if len(shared) < 32 and rng.random() < 0.2:
                    shared.append(live.pop())
                if shared and rng.random() < 0.2:
                    try:
                        shared.pop().close()
                    except IndexError:
                        pass
                while len(live) > 16 or (live and rng.random() < 0.4):
                    live.pop(rng.randrange(len(live))).close()
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)
        for b in live:
            b.close()

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    bad = []
    try:
        for _ in range(100):
            seen = made[0]
            while made[0] < seen + 50 and not errors:  # the threads allocate between snapshots
                time.sleep(0.0005)
            try:
                memviz.check_snapshot(memory.snapshot())
            except memviz.SnapshotError as e:
                bad.append(str(e).splitlines()[0])
    finally:
        stop.set()
        for t in threads:
            t.join()
        for b in shared:
            b.close()
        memory.record_memory_history(False)
    assert not errors
    assert not bad, f"{len(bad)} of 100 snapshots inconsistent, first: {bad[0]}"
