# SPDX-License-Identifier: Apache-2.0
"""The memviz page (``python -m vibespatial_raster.memviz``) in a real headless browser: Debian's
chromium loads it with no console error and no uncaught exception, and draws one series per owner
of the snapshot and one of the held bytes.

The browser is driven over the Chrome DevTools Protocol on a pipe (``--remote-debugging-pipe``:
it reads commands from fd 3 and writes replies and events to fd 4, each message JSON ended by a
NUL byte), so no Python package beyond the standard library is needed. A second test loads pages
with an error injected and proves each kind is caught. Skipped when neither ``chromium`` nor
``chromium-browser`` is on PATH (``apt-get install --no-install-recommends chromium``)."""

from __future__ import annotations

import fcntl
import json
import os
import pathlib
import select
import shutil
import subprocess
import sys
import time
from typing import Any

import pytest

from vibespatial_raster import OutOfMemoryError, memory

MIB = 1 << 20
TIMEOUT_S = 60.0


@pytest.fixture
def browser() -> str:
    """The chromium binary; the test is skipped without one."""
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no chromium or chromium-browser on PATH: the page is not loaded in a browser "
                "(apt-get install --no-install-recommends chromium)")


class Chromium:
    """A headless chromium with one page, driven over the DevTools protocol on a pipe."""

    def __init__(self, binary: str, profile: pathlib.Path) -> None:
        # The child's ends are first moved to fds >= 10, so that placing them at 3 and 4 cannot
        # overwrite one with the other; dup2 leaves the copies at 3 and 4 inheritable.
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD_CLOEXEC, 10)
        w = fcntl.fcntl(from_child_w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(to_child_r)
        os.close(from_child_w)

        def place_pipe_ends() -> None:
            os.dup2(r, 3)
            os.dup2(w, 4)

        self._log = open(profile.parent / f"{profile.name}.stderr", "w+b")
        args = [binary, "--headless", "--disable-gpu", "--no-sandbox", "--remote-debugging-pipe",
                f"--user-data-dir={profile}", "--no-first-run", "--no-default-browser-check",
                "--disable-extensions", "--disable-dev-shm-usage", "about:blank"]
        # close_fds=False, or fds 3 and 4 would be closed after place_pipe_ends; the parent's
        # other fds are not inheritable (PEP 446).
        self._proc = subprocess.Popen(args, preexec_fn=place_pipe_ends, close_fds=False,
                                      stdin=subprocess.DEVNULL, stdout=self._log,
                                      stderr=self._log)
        os.close(r)
        os.close(w)
        self._out = to_child_w
        self._in = from_child_r
        self._buf = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def _fail(self, what: str) -> None:
        self._log.flush()
        self._log.seek(0)
        tail = self._log.read()[-3000:].decode(errors="replace")
        raise AssertionError(f"chromium: {what}; its output:\n{tail}")

    def _receive(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                self._fail("no reply in time")
            ready, _, _ = select.select([self._in], [], [], left)
            if ready:
                chunk = os.read(self._in, 1 << 16)
                if not chunk:
                    self._fail("it closed the pipe (exited?)")
                self._buf += chunk
        message, self._buf = self._buf.split(b"\0", 1)
        return json.loads(message)

    def send(self, method: str, params: dict[str, Any] | None = None,
             session: str | None = None) -> dict[str, Any]:
        """Send one command and return its result; events that arrive meanwhile are kept."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        try:
            os.write(self._out, json.dumps(message).encode() + b"\0")
        except BrokenPipeError:
            self._fail("it closed the pipe (exited?)")
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            reply = self._receive(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    self._fail(f"{method} failed: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def wait_for(self, method: str, session: str) -> None:
        deadline = time.monotonic() + TIMEOUT_S
        while not any(e.get("method") == method and e.get("sessionId") == session
                      for e in self.events):
            self.events.append(self._receive(deadline))

    def close(self) -> None:
        try:
            if self._proc.poll() is None:
                try:
                    os.write(self._out, json.dumps(
                        {"id": 0, "method": "Browser.close", "params": {}}).encode() + b"\0")
                except OSError:
                    pass
                try:
                    self._proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
        finally:
            os.close(self._out)
            os.close(self._in)
            self._log.close()


def load_page(binary: str, profile: pathlib.Path, page: pathlib.Path,
              expression: str) -> tuple[list[str], Any]:
    """Load ``page`` and return (the errors it raised, the value of ``expression`` after load).

    Errors: uncaught exceptions and unhandled rejections, console.error and console.assert
    messages, and the browser's own error log entries (a resource that failed to load, a
    security refusal)."""
    browser = Chromium(binary, profile)
    try:
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.send("Target.attachToTarget",
                               {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page"):
            browser.send(f"{domain}.enable", session=session)
        nav = browser.send("Page.navigate", {"url": page.as_uri()}, session=session)
        assert "errorText" not in nav, nav
        browser.wait_for("Page.loadEventFired", session)
        result = browser.send("Runtime.evaluate", {"expression": expression,
                                                   "returnByValue": True}, session=session)
        assert "exceptionDetails" not in result, result
        value = result["result"].get("value")
        errors = []
        for e in browser.events:
            if e.get("sessionId") != session:
                continue
            p = e.get("params", {})
            if e["method"] == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                errors.append("uncaught: " + d.get("exception", {}).get("description", d["text"]))
            elif e["method"] == "Runtime.consoleAPICalled" and p["type"] in ("error", "assert"):
                errors.append(f"console.{p['type']}: " + " ".join(
                    str(a.get("value", a.get("description", ""))) for a in p["args"]))
            elif e["method"] == "Log.entryAdded" and p["entry"]["level"] == "error":
                errors.append(f"log ({p['entry']['source']}): {p['entry']['text']}")
        return errors, value
    finally:
        browser.close()


# What the page draws, read from the laid-out DOM: each series a polyline with data-series
# ("owner" or "held") and data-name, with its length and its box against the plot's.
SERIES = """(() => {
  const svg = document.querySelector('svg[aria-label="memory timeline"]');
  const box = svg.getBoundingClientRect();
  return [...document.querySelectorAll('[data-series]')].map(el => {
    const r = el.getBoundingClientRect();
    return {kind: el.dataset.series, name: el.dataset.name, length: el.getTotalLength(),
            points: el.points.numberOfItems, tag: el.tagName,
            inside: r.left >= box.left && r.right <= box.right && r.top >= box.top &&
                    r.bottom <= box.bottom};
  });
})()"""


@pytest.fixture
def page(tmp_path) -> tuple[pathlib.Path, set[str]]:
    """A memviz page of a history with several owners, an OOM and a trim; and those owners.
    Pages mapped before recording started are unmapped while it records."""
    memory.free_pool_memory()
    before = memory.DeviceBuffer(6 * MIB)
    memory.record_memory_history(True, 100_000)
    try:
        before.close()
        memory.marker("start")
        keep = []
        with memory.tag("tile 1"):
            keep.append(memory.DeviceBuffer(3 * MIB))
            memory.DeviceBuffer(2000).close()
        with memory.tag("tile 2"):
            keep.append(memory.DeviceBuffer(5 * MIB))
            with pytest.raises(OutOfMemoryError):
                memory.DeviceBuffer(1 << 40)
            with memory.tag("halo <2>"):  # markup in a name is escaped, not drawn
                keep.append(memory.DeviceBuffer(700_000))
        keep.append(memory.DeviceBuffer(9000))  # untagged: "user"
        keep.pop(0).close()
        memory.free_pool_memory()
        snapshot = tmp_path / "snap.pickle"
        memory.dump_snapshot(snapshot)
        snap = memory.snapshot()
        for b in keep:
            b.close()
    finally:
        memory.record_memory_history(False)
    owners = {e.get("user_metadata", "user") for e in snap["device_traces"][0]
              if e["action"] == "alloc"}
    assert owners == {"tile 1", "tile 2", "halo <2>", "user"}
    out = tmp_path / "memviz.html"
    subprocess.run([sys.executable, "-m", "vibespatial_raster.memviz", str(snapshot), "-o",
                    str(out)], check=True)
    return out, owners


def test_the_page_loads_with_no_error_and_draws_a_series_per_owner(browser, tmp_path, page):
    html, owners = page
    errors, series = load_page(browser, tmp_path / "profile", html, SERIES)
    assert errors == []
    assert sorted(s["name"] for s in series if s["kind"] == "owner") == sorted(owners)
    assert [s["name"] for s in series if s["kind"] == "held"] == ["held"]
    assert len(series) == len(owners) + 1
    for s in series:  # each one laid out in the plot, with a line to see
        assert s["tag"] == "polyline" and s["points"] > 1 and s["length"] > 0 and s["inside"], s


@pytest.mark.parametrize("injected, expected", [
    ("<script>throw new Error('injected failure')</script>", "uncaught: Error: injected failure"),
    ("<script>Promise.reject(new Error('injected rejection'))</script>", "injected rejection"),
    ("<script>console.error('injected console error')</script>",
     "console.error: injected console error"),
    ('<img src="does-not-exist.png">', "log (network)"),
])
def test_an_error_in_the_page_is_caught(browser, tmp_path, page, injected, expected):
    # The same page with one error put in: what the first test asserts absent is seen.
    html, owners = page
    broken = tmp_path / "broken.html"
    broken.write_text(html.read_text(encoding="utf-8").replace("</body>", injected + "</body>"),
                      encoding="utf-8")
    errors, series = load_page(browser, tmp_path / "profile", broken, SERIES)
    assert len(errors) == 1 and expected in errors[0], errors
    assert len(series) == len(owners) + 1  # the page itself still drew


def test_a_snapshots_markup_is_shown_not_run(browser, tmp_path):
    # Every string of the snapshot (the segment's type, the owners of blocks and events) holds
    # markup that would run a script: the page loads with none run, and shows them as text.
    import pickle

    memory.free_pool_memory()
    memory.record_memory_history(True, 1000)
    try:
        with memory.tag("tile"):
            keep = memory.DeviceBuffer(3 * MIB)
        snap = memory.snapshot()
    finally:
        memory.record_memory_history(False)
        keep.close()
    run = "<script>console.error('ran from the snapshot')</script>"
    on_error = "<img src=x onerror=\"console.error('ran from the snapshot')\">"
    for seg in snap["segments"]:
        seg["segment_type"] = run
        for b in seg["blocks"]:
            b["user_metadata"] = on_error
    for e in snap["device_traces"][0]:
        e["user_metadata"] = "tile " + run
    snapshot = tmp_path / "hostile.pickle"
    snapshot.write_bytes(pickle.dumps(snap))
    out = tmp_path / "hostile.html"
    subprocess.run([sys.executable, "-m", "vibespatial_raster.memviz", str(snapshot), "-o",
                    str(out)], check=True)
    errors, text = load_page(browser, tmp_path / "profile", out,
                             "[document.body.innerText, document.scripts.length, "
                             "document.images.length, "
                             "[...document.querySelectorAll('[data-series]')]"
                             ".map(el => el.dataset.name)]")
    assert errors == []
    body, scripts, images, names = text
    assert scripts == 0 and images == 0
    assert run in body  # drawn as text
    assert "tile " + run in names
