# SPDX-License-Identifier: Apache-2.0
"""PyTorch's own viewer, MemoryViz.js (the page behind pytorch.org/memory_viz), opens the pool's
snapshot unchanged, in headless chromium, in each of its three views.

The page is the one ``torch.cuda._memory_viz.trace_plot`` writes: a module script that imports
``add_local_files`` from MemoryViz.js on a CDN and hands it the pickle, base64-encoded. The
browser has no network here: every request is paused with the DevTools ``Fetch`` domain and
answered from local files. MemoryViz.js is answered with the file that ``VSR_TORCH_MEMORY_VIZ_JS``
names (``torch/utils/viz/MemoryViz.js`` of PyTorch's source tree, which trace_plot's page
imports from its main branch: the wheels do not ship it); its d3 imports (``d3@5``,
``d3-axis@1``, ``d3-scale@1``, ``d3-zoom@1``, ``d3-brush@1``) with an ES module built around
the d3 v5 UMD bundle that ``VSR_D3_V5_JS`` names (mpld3's wheel ships one:
``mpld3/js/d3.v5.min.js``). Skipped unless both are set, and without chromium.

Each view must load with no console error, error log entry or uncaught exception, and draw what
the snapshot says: the timelines one polygon per allocation (per driver allocation in the
segment timeline) and one of the small ones left out; the segment view, at the last event, one
rectangle per segment and two per live block, and the bytes allocated and reserved of the
snapshot; then it is stepped back through every event (the arrow key), which replays the trace
back from the snapshot, and at each event the bytes reserved must be those the trace says.
Broken snapshots show that each kind of fault is caught."""

from __future__ import annotations

import base64
import json
import os
import pathlib
import pickle
import re
import time
from typing import Any

import pytest

from conftest import run_python
from test_memviz_browser import TIMEOUT_S, Chromium, browser  # noqa: F401

# Where trace_plot's page imports the viewer from, and the page's own (never looked up) address.
VIEWER_URL = "https://cdn.jsdelivr.net/gh/pytorch/pytorch@main/torch/utils/viz/MemoryViz.js"
PAGE_URL = "https://memory-viz.invalid/snapshot.html"
FAVICON_URL = "https://memory-viz.invalid/favicon.ico"  # asked for after the load
D3_URL = "https://cdn.skypack.dev/d3@5"
D3_PACKAGE_URLS = [f"https://cdn.skypack.dev/d3-{name}@1" for name in
                   ("axis", "scale", "zoom", "brush")]
KINDS = ["Active Memory Timeline", "Allocator State History", "Active Cached Segment Timeline"]
ANSWER_ID_BASE = 1 << 30  # ids of our Fetch answers: int32, apart from send()'s


@pytest.fixture(scope="module")
def viewer_files() -> tuple[bytes, str]:
    """MemoryViz.js and the d3 v5 UMD bundle; the test is skipped without them."""
    js = os.environ.get("VSR_TORCH_MEMORY_VIZ_JS")
    d3 = os.environ.get("VSR_D3_V5_JS")
    if not js or not d3:
        pytest.skip("VSR_TORCH_MEMORY_VIZ_JS (torch/utils/viz/MemoryViz.js of PyTorch's source "
                    "tree: its wheels do not ship it) and "
                    "VSR_D3_V5_JS (a d3 v5 UMD bundle, e.g. mpld3/js/d3.v5.min.js) are not "
                    "both set: PyTorch's viewer is not opened")
    viewer = pathlib.Path(js).read_bytes()
    bundle = pathlib.Path(d3).read_text(encoding="utf-8")
    assert b'from "https://cdn.skypack.dev/d3@5"' in viewer, "not MemoryViz.js?"
    assert "d3js.org v5." in bundle[:200], "not a d3 v5 bundle?"
    return viewer, bundle


class ServingChromium(Chromium):
    """A Chromium whose page gets every request answered from ``files`` (url -> (type, body)),
    none from the network; a request for anything else fails and is listed in ``unserved``."""

    def __init__(self, binary: str, profile: pathlib.Path,
                 files: dict[str, tuple[str, bytes]]) -> None:
        super().__init__(binary, profile)
        self.files = files
        self.unserved: list[str] = []
        self._answers = 0

    def _receive(self, deadline: float) -> dict[str, Any]:
        while True:
            message = super()._receive(deadline)
            if message.get("method") != "Fetch.requestPaused":
                return message
            self._answer(message)

    def _answer(self, event: dict[str, Any]) -> None:
        # Sent without waiting for its reply (send() may be waiting for another one); the reply
        # lands in events, where nothing looks for it.
        p = event["params"]
        url = p["request"]["url"]
        if url in self.files:
            mime, body = self.files[url]
            method = "Fetch.fulfillRequest"
            params = {"requestId": p["requestId"], "responseCode": 200,
                      "responseHeaders": [{"name": "Content-Type", "value": mime},
                                          {"name": "Access-Control-Allow-Origin", "value": "*"}],
                      "body": base64.b64encode(body).decode()}
        else:
            self.unserved.append(url)
            method = "Fetch.failRequest"
            params = {"requestId": p["requestId"], "errorReason": "InternetDisconnected"}
        self._answers += 1
        message = {"id": ANSWER_ID_BASE + self._answers, "method": method, "params": params,
                   "sessionId": event["sessionId"]}
        os.write(self._out, json.dumps(message).encode() + b"\0")

    def open_page(self, url: str) -> str:
        """A new page with ``url`` loaded; returns its session."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget",
                            {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page"):
            self.send(f"{domain}.enable", session=session)
        self.send("Fetch.enable", {"patterns": [{"urlPattern": "*"}]}, session=session)
        nav = self.send("Page.navigate", {"url": url}, session=session)
        assert "errorText" not in nav, nav
        self.wait_for("Page.loadEventFired", session)
        return session

    def evaluate(self, session: str, expression: str) -> Any:
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True}, session=session)
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    def errors(self, session: str) -> list[str]:
        """Uncaught exceptions, console.error and console.assert messages and error log
        entries of the page ``session``, as test_memviz_browser.load_page collects them."""
        found = []
        for e in self.events:
            if e.get("sessionId") != session or "method" not in e:
                continue
            p = e.get("params", {})
            if e["method"] == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                found.append("uncaught: " + d.get("exception", {}).get("description", d["text"]))
            elif e["method"] == "Runtime.consoleAPICalled" and p["type"] in ("error", "assert"):
                found.append(f"console.{p['type']}: " + " ".join(
                    str(a.get("value", a.get("description", ""))) for a in p["args"]))
            elif e["method"] == "Log.entryAdded" and p["entry"]["level"] == "error":
                found.append(f"log ({p['entry']['source']}): {p['entry']['text']}")
        return found


_D3_NAMES: list[str] = []


D3_UMD_URL = "https://memory-viz.invalid/d3.v5.umd.js"


def d3_modules(binary: str, profile: pathlib.Path, bundle: str) -> tuple[bytes, bytes]:
    """ES modules around the UMD bundle: one that runs it and exports what it filled, one with
    each of its names as a named export (served as d3@5).

    The names are the keys of the object the bundle fills, read by running it in the browser.
    ``event`` is d3's current event, which d3 assigns to that object while a listener runs: the
    object's ``event`` is a setter of the first module's exported ``let``, so that
    ``import * as d3`` sees it change (the viewer reads ``d3.event`` in its listeners). The
    bundle runs in a module of its own: its free ``window`` must not meet d3's ``window``."""
    if not _D3_NAMES:
        browser = Chromium(binary, profile)
        try:
            target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = browser.send("Target.attachToTarget",
                                   {"targetId": target, "flatten": True})["sessionId"]
            result = browser.send("Runtime.evaluate", {
                "expression": "(() => { const holder = {}; (function () {\n" + bundle +
                              "\n}).call(holder); return Object.keys(holder.d3); })()",
                "returnByValue": True}, session=session)
            assert "exceptionDetails" not in result, result
            _D3_NAMES.extend(result["result"]["value"])
        finally:
            browser.close()
    names = _D3_NAMES
    assert len(names) > 400 and "event" in names, names
    assert all(re.fullmatch(r"[A-Za-z_$][\w$]*", n) for n in names), names
    umd = ("let event = null;\n"
           "const d3 = {};\n"
           "Object.defineProperty(d3, 'event', {get() { return event; }, "
           "set(v) { event = v; }, enumerable: true});\n"
           "(function () {\n" + bundle + "\n}).call({d3});\n"
           "export {event};\n"
           "export default d3;\n")
    others = ", ".join(n for n in names if n != "event")
    named = (f'import d3 from "{D3_UMD_URL}";\n'
             f'export {{event}} from "{D3_UMD_URL}";\n'
             f"export const {{{others}}} = d3;\n")
    return umd.encode(), named.encode()


def viewer_page(pickle_bytes: bytes, kind: str) -> bytes:
    """The page torch.cuda._memory_viz.trace_plot writes, for the pickle as it is on disk
    (padded with zero bytes to a multiple of 3 before base64, as trace_plot pads it)."""
    padded = pickle_bytes + b"\0" * (3 - len(pickle_bytes) % 3)
    files = json.dumps([{"name": "snapshot.pickle",
                         "base64": base64.b64encode(padded).decode()}])
    return (f'<!DOCTYPE html>\n<html>\n<head>\n</head>\n<body>\n<script type="module">\n'
            f'import {{add_local_files}} from "{VIEWER_URL}"\n'
            f"const local_files = {files}\n"
            f"add_local_files(local_files, {kind!r})\n"
            "</script>\n</body>\n").encode()


# What a view drew, read from the DOM: the last div of the body is the view's (the first, its
# "drag and drop a file" text, when the viewer threw before it drew).
TIMELINE = """(() => {
  const svg = [...document.querySelectorAll('body > div')].at(-1).querySelector('svg');
  if (svg === null) return null;  // nothing drawn
  const polygons = [...svg.querySelectorAll('polygon')];
  return {polygons: polygons.length,
          bad_points: polygons.filter(p => !/^[-0-9.e, ]+$/.test(p.getAttribute('points')))
                              .length,
          ticks: svg.querySelectorAll('.tick').length};
})()"""

SEGMENT_VIEW = """new Promise(done => requestAnimationFrame(() => requestAnimationFrame(() => {
  const [stack, svg, list] = [...document.querySelectorAll('body > div')].at(-1)
                                .firstElementChild.children;
  const events = list.children.length;
  const drawn = () => ({
    rects: [...svg.querySelectorAll(':scope > g > g')].map(g => g.querySelectorAll('rect').length),
    header: stack.textContent.split('\\n')[0]});
  const steps = [drawn()];
  for (let i = 1; i < events; i++) {  // back one event a time, as the up arrow key steps
    document.body.dispatchEvent(new KeyboardEvent('keydown', {key: 'ArrowUp'}));
    steps.push(drawn());
  }
  done({events, steps});
})))"""


def run_view(binary: str, tmp_path: pathlib.Path, viewer: bytes, bundle: str,
             pickle_bytes: bytes, kind: str) -> tuple[list[str], Any]:
    """Open the viewer on the pickle in view ``kind``; returns (its errors, what it drew)."""
    umd, d3 = d3_modules(binary, tmp_path / "d3-profile", bundle)
    js = "text/javascript"
    files = {PAGE_URL: ("text/html", viewer_page(pickle_bytes, kind)),
             VIEWER_URL: (js, viewer), D3_URL: (js, d3), D3_UMD_URL: (js, umd),
             FAVICON_URL: ("image/x-icon", b"")}
    for url in D3_PACKAGE_URLS:
        files[url] = (js, f'export * from "{D3_URL}";\n'.encode())
    browser = ServingChromium(binary, tmp_path / "profile", files)
    try:
        session = browser.open_page(PAGE_URL)
        drawn = browser.evaluate(session, SEGMENT_VIEW if kind == KINDS[1] else TIMELINE)
        time.sleep(0.2)  # a late error event still arrives
        browser.evaluate(session, "0")
        errors = browser.errors(session)
        errors += [f"not served: {url}" for url in browser.unserved]
        return errors, drawn
    finally:
        browser.close()


def merged_trace(trace: list[dict]) -> list[dict]:
    """The trace as the viewer lists it: a free_requested followed by the free_completed of the
    same address is one event."""
    out: list[dict] = []
    for e in trace:
        if (e["action"] == "free_completed" and out and out[-1]["action"] == "free_requested"
                and out[-1]["addr"] == e["addr"]):
            continue
        out.append(e)
    return out


def expected_timeline(snap: dict, segments: bool) -> int:
    """How many polygons MemoryViz's timeline draws for ``snap``: one per allocation the trace
    starts or ends, one per live block (segment) it does not, one of the small ones left out."""
    alloc, frees = (("segment_alloc", ("segment_free",)) if segments
                    else ("alloc", ("free_completed",)))
    live: set[int] = set()
    elements = 0
    for e in snap["device_traces"][0]:
        if e["action"] == alloc:
            live.add(e["addr"])
            elements += 1
        elif e["action"] in frees:
            if e["addr"] in live:
                live.discard(e["addr"])
            else:
                elements += 1
    for seg in snap["segments"]:
        if segments:
            elements += seg["address"] not in live
        else:
            elements += sum(b["state"] == "active_allocated" and b["address"] not in live
                            for b in seg["blocks"])
    return elements + 1


def reserved_by_event(snap: dict) -> list[int]:
    """The bytes reserved (in segments) after each event of the merged trace, from the
    snapshot's total back through the segment events."""
    delta = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
    reserved = sum(s["total_size"] for s in snap["segments"])
    out = []
    for e in reversed(merged_trace(snap["device_traces"][0])):
        out.append(reserved)
        reserved -= delta.get(e["action"], 0) * e["size"]
    return out[::-1]


HEADER = re.compile(r"\(.*\((\d+) bytes\) allocated / .*\((\d+) bytes\) reserved\)")


def check_drawn(snap: dict, kind: str, drawn: Any) -> None:
    """What the view drew is what the snapshot says."""
    if kind != KINDS[1]:
        assert drawn["polygons"] == expected_timeline(snap, kind == KINDS[2]), drawn
        assert drawn["bad_points"] == 0 and drawn["ticks"] > 0, drawn
        return
    trace = merged_trace(snap["device_traces"][0])
    assert drawn["events"] == len(trace) and len(drawn["steps"]) == len(trace)
    last = drawn["steps"][0]
    live = [b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    assert last["rects"] == [len(snap["segments"]), len(live), len(live)], last
    header = HEADER.match(last["header"])
    assert header, last
    assert int(header[1]) == sum(b["requested_size"] for b in live), last
    reserved = reserved_by_event(snap)
    seen = []
    for step in drawn["steps"]:
        header = HEADER.match(step["header"])
        assert header, step
        seen.append(int(header[2]))
    assert seen == reserved[::-1], (seen, reserved[::-1])


SESSION = """
    import sys
    from vibespatial_raster import OutOfMemoryError, memory
    MIB = 1 << 20
    memory.free_pool_memory()
    before = memory.DeviceBuffer(6 * MIB)  # live before recording starts, freed during it
    memory.record_memory_history(True, 100_000)
    before.close()
    memory.marker("start")
    keep = []
    with memory.tag("tile 1"):
        keep.append(memory.DeviceBuffer(3 * MIB))
        memory.DeviceBuffer(2000).close()
    with memory.tag("tile 2"):
        keep.append(memory.DeviceBuffer(5 * MIB))
        try:
            memory.DeviceBuffer(1 << 40)
            sys.exit("no OutOfMemoryError")
        except OutOfMemoryError:
            pass
        with memory.tag("halo"):
            keep.append(memory.DeviceBuffer(700_000))
    keep.append(memory.DeviceBuffer(9000))
    keep.append(memory.DeviceBuffer(600))
    keep.pop(0).close()
    keep.pop().close()
    memory.free_pool_memory()
    memory.marker("end")
    memory.dump_snapshot({path!r})
"""

TIERS = {"default": {}, "tier C": {"VIBESPATIAL_GPU_MANAGED_MEMORY": "1"},
         "fallback": {"VSR_EMU_VMM": "0"}}


def session_pickle(tmp_path: pathlib.Path, tier: str) -> bytes:
    """The pickle dump_snapshot writes after a session with several owners, small and large
    blocks, a block live before recording, an OOM, frees and a trim, on ``tier``."""
    path = tmp_path / f"{tier.replace(' ', '-')}.pickle"
    run_python(SESSION.format(path=str(path)), TIERS[tier])
    data = path.read_bytes()
    snap = pickle.loads(data)
    actions = {e["action"] for e in snap["device_traces"][0]}
    assert {"alloc", "free_completed", "oom", "annotate"} <= actions, actions
    assert snap["segments"], "nothing live in a segment"
    return data


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tier", list(TIERS))
def test_pytorchs_viewer_opens_the_snapshot(browser, viewer_files, tmp_path,  # noqa: F811
                                            tier, kind):
    viewer, bundle = viewer_files
    data = session_pickle(tmp_path, tier)
    errors, drawn = run_view(browser, tmp_path, viewer, bundle, data, kind)
    assert errors == [], errors
    check_drawn(pickle.loads(data), kind, drawn)


def _block_past_its_segment(snap: dict) -> None:
    # The viewer places a segment's blocks one after the other from its address: one more
    # live block runs past the segment's end, into no segment.
    seg = snap["segments"][0]
    seg["blocks"].append({"address": seg["address"] + seg["total_size"], "size": 4096,
                          "requested_size": 4096, "state": "active_allocated", "frames": []})


def _free_outside_every_segment(snap: dict) -> None:
    # The last free's block moved out of every segment: stepping back to before it, the viewer
    # puts the block back where no segment is.
    trace = snap["device_traces"][0]
    end = max(s["address"] + s["total_size"] for s in snap["segments"])
    last = max(i for i, e in enumerate(trace) if e["action"] == "free_completed")
    addr = trace[last]["addr"]
    for e in trace[last - 1:last + 1]:
        if e.get("addr") == addr:
            e["addr"] = end + (1 << 30)


def _unmatched_free_request(snap: dict) -> None:
    # A free request of a block that is not live when the trace is replayed back to it.
    trace = snap["device_traces"][0]
    trace.append({"action": "free_requested", "addr": 1 << 44, "size": 512, "stream": 0,
                  "frames": []})


@pytest.mark.parametrize("kind, fault, expected", [
    (KINDS[1], _block_past_its_segment, "Cannot read properties of null (reading 'occupied')"),
    (KINDS[1], _free_outside_every_segment,
     "Cannot read properties of null (reading 'occupied')"),
    (KINDS[1], _unmatched_free_request,
     "Cannot set properties of undefined (setting 'free_requested')"),
    (KINDS[0], "protocol 5", "Unhandled version 5"),
    (KINDS[0], "bytes", "UNKNOWN OPCODE: 99"),
])
def test_a_broken_snapshot_fails_in_the_viewer(browser, viewer_files, tmp_path,  # noqa: F811
                                               kind, fault, expected):
    # The same session's snapshot, read back and pickled again (protocol 2, as the pool writes
    # it): unchanged, it passes; with the fault put in, the viewer throws. The last two are
    # pickles its reader cannot read: protocol 5 (Python 3.14's default), and a bytes value.
    viewer, bundle = viewer_files
    snap = pickle.loads(session_pickle(tmp_path, "default"))
    errors, drawn = run_view(browser, tmp_path, viewer, bundle, pickle.dumps(snap, 2), kind)
    assert errors == [], errors
    check_drawn(snap, kind, drawn)
    if fault == "protocol 5":
        data = pickle.dumps(snap, 5)
    elif fault == "bytes":  # pickled with a GLOBAL (_codecs.encode), an opcode it lacks
        snap["device_traces"][0][0]["user_metadata"] = b"user"
        data = pickle.dumps(snap, 2)
    else:
        fault(snap)
        data = pickle.dumps(snap, 2)
    (tmp_path / "broken").mkdir()
    errors, _ = run_view(browser, tmp_path / "broken", viewer, bundle, data, kind)
    assert any(expected in e for e in errors), errors
