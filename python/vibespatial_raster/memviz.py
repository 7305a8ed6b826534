# SPDX-License-Identifier: Apache-2.0
"""Memory snapshots (:func:`vibespatial_raster.memory.snapshot`) without PyTorch.

:func:`load_snapshot` reads a snapshot file as data: its pickle may hold dicts, lists, tuples,
str, int, float, bool and None, and nothing that names code (a class, a function, a
``__reduce__``), so opening a snapshot from anywhere runs nothing of its.

:func:`check_snapshot` asserts the invariants that PyTorch's readers rely on
(``torch.cuda._memory_viz.segsum`` and ``trace``, and its MemoryViz viewer): every segment's
blocks tile it; every ``alloc`` has one ``free_requested`` and one ``free_completed`` after it,
or is a live block of the snapshot; replayed back from the snapshot, as the viewer's segment
view draws each event, every block live at an event starts inside a segment and every
``segment_map`` or ``segment_alloc`` takes memory that is in one; and, for a history recorded
from an empty pool, the driver allocations replayed from ``segment_alloc`` / ``segment_free``
and the pages replayed from ``segment_map`` / ``segment_unmap`` are the snapshot's segments.

``python -m vibespatial_raster.memviz snapshot.pickle -o out.html`` draws it as one
self-contained HTML file (inline SVG, no script, nothing fetched): the timeline of live bytes
per owner and of the bytes the pool holds mapped, OOMs and trims marked, and the segment map.
Every value from the snapshot is text in the page (escaped), never markup.
"""

from __future__ import annotations

import bisect
import html as _html
import io
import os
import pickle
from itertools import compress
from typing import IO, Any

__all__ = ["SnapshotError", "check_snapshot", "load_snapshot", "loads_snapshot", "main",
           "timeline", "to_html"]

_STATES = {"active_allocated", "active_awaiting_free", "inactive"}


class SnapshotError(ValueError):
    """A snapshot breaks an invariant of PyTorch's format; ``problems`` lists each one."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems[:10]) + (" ..." if len(problems) > 10 else ""))
        self.problems = problems


# ---- reading a snapshot file: data, never code ----

_LEAVES = frozenset({str, int, float, bool, type(None)})
_CONTAINERS = frozenset({dict, list, tuple})
_ALLOWED = _LEAVES | _CONTAINERS
_WHAT_IT_HOLDS = "a snapshot holds only dicts, lists, tuples, str, int, float, bool and None"


class _NamesCode(pickle.UnpicklingError):
    pass


class _DataUnpickler(pickle.Unpickler):
    """An unpickler that finds no class or function: the opcodes that would call one (a
    ``__reduce__``, an instance, an extension code) fail; those of the format's types remain."""

    def find_class(self, module: str, name: str) -> Any:
        raise _NamesCode(f"the pickle names {module}.{name}: a snapshot file is data ("
                         f"{_WHAT_IT_HOLDS}), and memviz loads no code from it")

    def persistent_load(self, pid: Any) -> Any:
        raise _NamesCode("the pickle refers to an object outside it (a persistent id): "
                         f"{_WHAT_IT_HOLDS}")


def _refuse_type(kinds: set[type]) -> None:
    kind = min(kinds - _ALLOWED, key=lambda k: k.__name__)
    raise SnapshotError([f"the pickle holds a {kind.__name__}: {_WHAT_IT_HOLDS}"])


def _check_data(root: object) -> None:
    # Containers only on the stack, each once (the pickle's memo may share one, or make one hold
    # itself), without recursion (any depth); the leaves' types checked a container at a time.
    if type(root) not in _CONTAINERS:
        _refuse_type({type(root)})
    seen = {id(root)}
    stack: list[Any] = [root]
    while stack:
        x: Any = stack.pop()
        if type(x) is dict:
            if not _LEAVES.issuperset(map(type, x)):
                raise SnapshotError(["the pickle holds a dict key that is not a str or a number"])
            x = x.values()
        kinds = set(map(type, x))
        if kinds <= _LEAVES:
            continue
        if not kinds <= _ALLOWED:
            _refuse_type(kinds)
        for v in compress(x, map(_CONTAINERS.__contains__, map(type, x))):
            if v and id(v) not in seen:  # an empty one holds nothing to check
                seen.add(id(v))
                stack.append(v)


def loads_snapshot(data: bytes) -> dict[str, Any]:
    """The snapshot in ``data`` (a pickle, as :func:`vibespatial_raster.memory.dump_snapshot`
    and ``torch.cuda.memory._dump_snapshot`` write it), read as data: nothing in it is run.

    Raises:
        SnapshotError: ``data`` is not a pickle (or is cut short), names a class or function
            (what would run code), holds a type the format does not have (bytes, a set, ...),
            or its top level is not a dict.
    """
    try:
        loaded = _DataUnpickler(io.BytesIO(data)).load()
    except _NamesCode as e:
        raise SnapshotError([str(e)]) from None
    except MemoryError:
        raise
    except Exception as e:  # what a broken pickle raises: UnpicklingError, EOFError, ValueError..
        raise SnapshotError([f"not a snapshot pickle: {type(e).__name__}: {e}"]) from None
    _check_data(loaded)
    if type(loaded) is not dict:
        raise SnapshotError([f"not a memory snapshot: its top level is a "
                             f"{type(loaded).__name__}, not a dict"])
    return loaded


def load_snapshot(source: str | os.PathLike[str] | IO[bytes]) -> dict[str, Any]:
    """The snapshot in the file ``source`` (a path, or a binary file open for reading), read as
    :func:`loads_snapshot` reads it.

    Raises:
        SnapshotError: as :func:`loads_snapshot`.
        OSError: the file cannot be read (``FileNotFoundError`` when it does not exist).
    """
    if hasattr(source, "read"):
        return loads_snapshot(source.read())  # type: ignore[union-attr]
    with open(source, "rb") as f:  # type: ignore[arg-type]
        return loads_snapshot(f.read())


# ---- the shape memviz reads ----

_COUNT = "a count"  # an int from 0 to 2**64 - 1 (not a bool): an address, a size, a time
_ADDRESSED = {"alloc", "free_requested", "free_completed", "segment_map", "segment_unmap",
              "segment_alloc", "segment_free"}
# Per entry: the keys memviz reads, what each must be, and whether it must be there.
_SEGMENT = {"address": (_COUNT, True), "total_size": (_COUNT, True),
            "allocated_size": (_COUNT, True), "segment_type": (str, True),
            "blocks": (list, True), "device": (_COUNT, False), "is_expandable": (bool, False)}
_BLOCK = {"address": (_COUNT, True), "size": (_COUNT, True), "state": (str, True),
          "requested_size": (_COUNT, False), "user_metadata": (str, False)}
_EVENT = {"action": (str, True), "size": (_COUNT, True), "time_us": (_COUNT, True),
          "addr": (_COUNT, False), "device_free": (_COUNT, False),
          "user_metadata": (str, False)}
_EXTRA = {"dropped_events": (_COUNT, False), "recording": (bool, False)}


def _fits(value: object, kind: object) -> bool:
    if kind is _COUNT:
        return type(value) is int and 0 <= value < 1 << 64
    return isinstance(value, kind)  # type: ignore[arg-type]


def _entry(entry: object, keys: dict[str, tuple[object, bool]], where: str,
           problems: list[str]) -> bool:
    if not isinstance(entry, dict):
        problems.append(f"{where} is a {type(entry).__name__}, not a dict")
        return False
    fine = True
    for key, (kind, required) in keys.items():
        if key not in entry:
            if required:
                problems.append(f"{where} has no {key!r}")
                fine = False
        elif not _fits(entry[key], kind):
            what = _COUNT if kind is _COUNT else f"a {getattr(kind, '__name__', kind)}"
            problems.append(f"{where}: its {key!r} is {_short(entry[key])}, not {what}")
            fine = False
    return fine


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_shape(snapshot: object) -> None:
    """Raises SnapshotError unless ``snapshot`` has every key memviz reads, of its type."""
    if not isinstance(snapshot, dict):
        raise SnapshotError([f"not a memory snapshot: a {type(snapshot).__name__}, not a dict"])
    problems: list[str] = []
    for key in ("segments", "device_traces"):
        if not isinstance(snapshot.get(key), list):
            problems.append(f"not a memory snapshot: no {key!r} list" if key not in snapshot
                            else f"not a memory snapshot: its {key!r} is not a list")
    if "vibespatial" in snapshot:
        _entry(snapshot["vibespatial"], _EXTRA, "'vibespatial'", problems)
    if problems:
        raise SnapshotError(problems)
    for i, seg in enumerate(snapshot["segments"]):
        if _entry(seg, _SEGMENT, f"segment {i}", problems):
            for j, b in enumerate(seg["blocks"]):
                _entry(b, _BLOCK, f"segment {i} block {j}", problems)
    for d, trace in enumerate(snapshot["device_traces"]):
        if not isinstance(trace, list):
            problems.append(f"the trace of device {d} is a {type(trace).__name__}, not a list")
            continue
        for k, e in enumerate(trace):
            where = f"device {d} event {k}"
            if _entry(e, _EVENT, where, problems) and e["action"] in _ADDRESSED \
                    and "addr" not in e:
                problems.append(f"{where} ({e['action']}) has no 'addr'")
    if problems:
        raise SnapshotError(problems)


def _devices(snapshot: dict[str, Any]) -> set[int]:
    # Device 0 always (a snapshot of a process that recorded nothing still has it).
    return ({0} | set(range(len(snapshot["device_traces"])))
            | {s.get("device", 0) for s in snapshot["segments"]})


def _check_device(snapshot: dict[str, Any], device: object) -> int:
    if type(device) is not int:
        raise TypeError(f"memviz: device must be an int, not {device!r}")
    have = _devices(snapshot)
    if device not in have:
        listed = ", ".join(str(d) for d in sorted(have)[:8]) + (", ..." if len(have) > 8 else "")
        raise ValueError(f"device {device} is not in the snapshot (its devices: {listed})")
    return device


# ---- the invariants of PyTorch's readers ----


def _segments(snapshot: dict[str, Any], problems: list[str]) -> dict[int, int]:
    live: dict[int, int] = {}
    for i, seg in enumerate(snapshot["segments"]):
        where = f"segment {i} at {seg['address']:#x}"
        cursor = seg["address"]
        total = allocated = 0
        for b in seg["blocks"]:
            if b["state"] not in _STATES:
                problems.append(f"{where}: a block's state is {_short(b['state'])}")
            if b["address"] != cursor:
                problems.append(f"{where}: a block at {b['address']:#x} does not follow the last")
            if "frames" not in b:
                problems.append(f"{where}: a block has no frames")
            cursor = b["address"] + b["size"]
            total += b["size"]
            if b["state"] == "active_allocated":
                allocated += b["size"]
                if not 0 < b.get("requested_size", 0) <= b["size"]:
                    problems.append(f"{where}: a live block's requested_size is out of range")
                live[b["address"]] = b["size"]
        if total != seg["total_size"]:
            problems.append(f"{where}: its blocks add up to {total}, not {seg['total_size']}")
        if allocated != seg["allocated_size"]:
            problems.append(f"{where}: allocated_size {seg['allocated_size']} != {allocated}")
    return live


def check_snapshot(snapshot: dict[str, Any], *, complete: bool = False) -> None:
    """Raise :class:`SnapshotError` unless ``snapshot`` holds the invariants above.

    ``complete``: the history was recorded from an empty pool and nothing was dropped, so that a
    free of a block never allocated, and mapped pages that are not segments, are errors too
    (otherwise a free may belong to a block allocated before recording started).

    A snapshot without a key the checks read (``segments``, ``device_traces``, a segment's
    ``address``, an event's ``action``, ...), or with one of the wrong type (an address that is
    not a count), raises :class:`SnapshotError` naming it. Its cost grows with the snapshot's
    entries, not with the addresses they span.
    """
    _check_shape(snapshot)
    problems: list[str] = []
    live = _segments(snapshot, problems)
    if complete and snapshot.get("vibespatial", {}).get("dropped_events", 0):
        problems.append("events were dropped: the history is not complete")
    for d, trace in enumerate(snapshot["device_traces"]):
        state: dict[int, str] = {}
        last_time = 0
        for k, e in enumerate(trace):
            action = e["action"]
            where = f"device {d} event {k} ({_short(action)})"
            for key in ("stream", "frames"):
                if key not in e:
                    problems.append(f"{where}: no {key!r}")
            if e["time_us"] < last_time:
                problems.append(f"{where}: earlier than the event before it")
            last_time = e["time_us"]
            if action == "oom":
                if "device_free" not in e:
                    problems.append(f"{where}: an oom without device_free")
                continue
            addr = e.get("addr", 0)
            if action == "alloc":
                if addr in state:
                    problems.append(f"{where}: {addr:#x} allocated again before its free")
                state[addr] = "live"
            elif action == "free_requested":
                if addr not in state:
                    if complete:
                        problems.append(f"{where}: {addr:#x} freed, never allocated")
                    state[addr] = "requested"
                elif state[addr] != "live":
                    problems.append(f"{where}: {addr:#x} freed twice")
                state[addr] = "requested"
            elif action == "free_completed":
                if state.get(addr) != "requested":
                    if complete or addr in state:
                        problems.append(f"{where}: {addr:#x} completed without a request")
                state.pop(addr, None)
        for addr, st in state.items():
            if st == "requested":
                problems.append(f"device {d}: the free of {addr:#x} never completed")
            elif addr not in live:
                problems.append(f"device {d}: {addr:#x} allocated, never freed, and not live")
    if complete:
        _check_pages(snapshot, problems)
    _check_replay(snapshot, problems)
    if problems:
        raise SnapshotError(problems)


class _Ranges:
    """Disjoint byte ranges [begin, end), sorted, adjacent ones merged."""

    def __init__(self) -> None:
        self.begins: list[int] = []
        self.ends: list[int] = []

    def covers(self, a: int, e: int) -> bool:
        i = bisect.bisect_right(self.begins, a) - 1
        return i >= 0 and self.ends[i] >= e

    def misses(self, a: int, e: int) -> bool:
        i = bisect.bisect_right(self.ends, a)  # the first range that ends after a
        return i == len(self.begins) or self.begins[i] >= e

    def add(self, a: int, e: int) -> None:
        if a >= e:
            return  # nothing to add: no empty range is kept
        lo = bisect.bisect_left(self.ends, a)  # ranges that end at a or later ...
        hi = bisect.bisect_right(self.begins, e)  # ... and begin at e or earlier merge with it
        if lo < hi:
            a = min(a, self.begins[lo])
            e = max(e, self.ends[hi - 1])
        self.begins[lo:hi] = [a]
        self.ends[lo:hi] = [e]

    def remove(self, a: int, e: int) -> None:
        if a >= e:
            return
        lo = bisect.bisect_right(self.ends, a)  # ranges that end after a ...
        hi = bisect.bisect_left(self.begins, e)  # ... and begin before e lose [a, e)
        begins: list[int] = []
        ends: list[int] = []
        if lo < hi and self.begins[lo] < a:
            begins.append(self.begins[lo])
            ends.append(a)
        if lo < hi and self.ends[hi - 1] > e:
            begins.append(e)
            ends.append(self.ends[hi - 1])
        self.begins[lo:hi] = begins
        self.ends[lo:hi] = ends


def _check_replay(snapshot: dict[str, Any], problems: list[str]) -> None:
    # MemoryViz's segment view draws the state at an event by undoing, from the snapshot back,
    # every later event: a map or a segment_alloc takes its range out of the segments (it must be
    # there), an unmap or a segment_free puts it back, an alloc takes its block out, a free puts
    # it back; every block then live must start inside a segment, or the view fails at that event.
    # Ranges in bytes, not pages: a driver allocation (tiers C and fallback) has any size.
    for d, trace in enumerate(snapshot.get("device_traces", [])):
        segments = [s for s in snapshot.get("segments", []) if s.get("device", 0) == d]
        mapped = _Ranges()
        for s in segments:
            mapped.add(s["address"], s["address"] + s["total_size"])
        live = {b_addr: size for b_addr, size in _live_blocks(segments)}
        starts = sorted(live)  # the live blocks' addresses
        for k in range(len(trace) - 1, 0, -1):
            e = trace[k]
            action = e["action"]
            where = f"device {d} event {k} ({action})"
            if action in _MAPS + _UNMAPS:
                begin, end = e["addr"], e["addr"] + e["size"]
                if action in _MAPS:
                    if not mapped.covers(begin, end):
                        problems.append(f"{where}: replayed back from the snapshot, its pages "
                                        "are not all in a segment")
                    if bisect.bisect_left(starts, begin) != bisect.bisect_left(starts, end):
                        problems.append(f"{where}: a block live before it starts in its pages")
                    mapped.remove(begin, end)
                else:
                    if not mapped.misses(begin, end):
                        problems.append(f"{where}: replayed back from the snapshot, its pages "
                                        "are still in a segment before it")
                    mapped.add(begin, end)
            elif action == "alloc" and e["addr"] in live:
                del live[e["addr"]]
                del starts[bisect.bisect_left(starts, e["addr"])]
            elif action == "free_completed" and "addr" in e and e["addr"] not in live:
                if not mapped.covers(e["addr"], e["addr"] + 1):
                    problems.append(f"{where}: the block at {e['addr']:#x} is in no segment "
                                    "while it is live")
                live[e["addr"]] = e["size"]
                bisect.insort(starts, e["addr"])


_MAPS = ("segment_map", "segment_alloc")
_UNMAPS = ("segment_unmap", "segment_free")


def _live_blocks(segments: list[dict[str, Any]]) -> list[tuple[int, int]]:
    out = []
    for seg in segments:
        for b in seg["blocks"]:
            if b["state"] in ("active_allocated", "active_awaiting_free"):
                out.append((b["address"], b["size"]))
    return out


def _check_pages(snapshot: dict[str, Any], problems: list[str]) -> None:
    # Driver allocations (segment_alloc / segment_free: tiers C and fallback) are whole segments:
    # each one got and not given back is a segment of the snapshot, at its address and of its size.
    got: dict[int, int] = {}
    for trace in snapshot["device_traces"]:
        for e in trace:
            if e["action"] == "segment_alloc":
                if e["addr"] in got:
                    problems.append(f"segment {e['addr']:#x} got twice")
                got[e["addr"]] = e["size"]
            elif e["action"] == "segment_free":
                if got.pop(e["addr"], None) != e["size"]:
                    problems.append(f"segment {e['addr']:#x} given back, never got")
    segments = []
    for seg in snapshot["segments"]:
        if not seg.get("is_expandable") and got.get(seg["address"]) == seg["total_size"]:
            del got[seg["address"]]
        else:
            segments.append(seg)
    for addr in got:
        problems.append(f"segment {addr:#x} was got and not given back, and is not in the snapshot")
    # The bytes mapped by the trace, as ranges (so that the work grows with the events, not with
    # the addresses they span), against the other segments: maps and unmaps need not pair up (an
    # unmap may take the tail of a mapped run).
    mapped = _Ranges()
    for trace in snapshot["device_traces"]:
        for e in trace:
            action = e["action"]
            if action not in ("segment_map", "segment_unmap") or e["size"] == 0:
                continue
            begin, end = e["addr"], e["addr"] + e["size"]
            if action == "segment_map":
                if not mapped.misses(begin, end):
                    problems.append(f"pages from {begin:#x} to {end:#x} mapped twice")
                mapped.add(begin, end)
            else:
                if not mapped.covers(begin, end):
                    problems.append(f"pages from {begin:#x} to {end:#x} unmapped, never mapped")
                mapped.remove(begin, end)
    held = _Ranges()
    for seg in segments:
        held.add(seg["address"], seg["address"] + seg["total_size"])
    if (mapped.begins, mapped.ends) != (held.begins, held.ends):
        problems.append("the pages the trace leaves mapped are not the snapshot's segments")


# ---- a picture without PyTorch ----


def timeline(snapshot: dict[str, Any], device: int = 0) -> dict[str, Any]:
    """The live bytes per owner and the bytes mapped ("held") over the history of ``device``:
    ``{"times": [...], "series": {name: [...]}, "marks": [(time, action, text), ...]}``, one
    point per event, times in microseconds from the first event. Marks are OOMs and trims.

    Raises:
        SnapshotError: ``snapshot`` lacks a key this reads, or has one of the wrong type.
        ValueError: ``device`` is not in the snapshot (it has neither a trace nor a segment
            there; device 0 always is).
        TypeError: ``device`` is not an int.
    """
    _check_shape(snapshot)
    device = _check_device(snapshot, device)
    traces = snapshot["device_traces"]
    trace = traces[device] if device < len(traces) else []
    owners: dict[int, tuple[str, int]] = {}
    live: dict[str, int] = {}
    # What was mapped before the first event: the snapshot's segments less what the trace
    # mapped, plus what it unmapped (recording may start with pages mapped); never so little
    # that an unmap would take the line below zero (a snapshot without its segments).
    net = lowest = 0
    for e in trace:
        if e["action"] in _MAPS:
            net += e["size"]
        elif e["action"] in _UNMAPS:
            net -= e["size"]
            lowest = min(lowest, net)
    held = sum(s["total_size"] for s in snapshot["segments"] if s.get("device", 0) == device)
    held = max(held - net, -lowest)
    times: list[int] = []
    series: dict[str, list[int]] = {"held": []}
    marks: list[tuple[int, str, str]] = []
    t0 = trace[0]["time_us"] if trace else 0
    for e in trace:
        action = e["action"]
        owner = e.get("user_metadata", "user")
        if action == "alloc":
            owners[e["addr"]] = (owner, e["size"])
            live[owner] = live.get(owner, 0) + e["size"]
        elif action == "free_requested" and e["addr"] in owners:
            who, size = owners.pop(e["addr"])
            live[who] -= size
        elif action in _MAPS:
            held += e["size"]
        elif action in _UNMAPS:
            held -= e["size"]
        elif action in ("oom", "trim"):
            text = f"{action}: {e['size']} bytes"
            if action == "oom":
                text += f" requested, {e.get('device_free', 0)} free on the device"
            marks.append((e["time_us"] - t0, action, text))
        times.append(e["time_us"] - t0)
        series["held"].append(held)
        for name in live:
            series.setdefault(name, [0] * (len(times) - 1)).append(live[name])
    return {"times": times, "series": series, "marks": marks}


# The page is built of _element calls only: every value from a snapshot goes in as text, escaped
# by _text, whether it lands in an element or in an attribute; names of elements and attributes,
# and the style sheet, are this module's literals. The page has no script (so no JSON in one).


class _Markup(str):
    """Markup this module built (_element, _markup): put in the page as it is."""

    __slots__ = ()


def _text(value: object) -> str:
    """``value`` as HTML text, also good inside a quoted attribute: ``& < > " '`` as character
    references, the line and paragraph separators too, and what UTF-8 cannot hold (a lone
    surrogate from a pickle) as a visible backslash escape."""
    text = _html.escape("%s" % (value,), quote=True)  # "%s": a plain str, whatever the type
    text = text.replace("\u2028", "&#x2028;").replace("\u2029", "&#x2029;")
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _markup(*parts: object) -> _Markup:
    """``parts`` one after the other: markup as it is, anything else as text."""
    return _Markup("".join(p if type(p) is _Markup else _text(p) for p in parts))


def _element(name: str, attributes: dict[str, object] | None = None,
             *children: object) -> _Markup:
    """``<name attributes>children</name>``; every attribute's value and every child that is not
    markup is text (:func:`_text`)."""
    opening = "".join(f' {key}="{_text(value)}"' for key, value in (attributes or {}).items())
    return _Markup(f"<{name}{opening}>{_markup(*children)}</{name}>")


_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
            "#7f7f7f", "#bcbd22", "#17becf"]

_HEAD = _Markup("""<head><meta charset="utf-8"><title>vibespatial-raster memory snapshot</title>
<style>
body { font-family: sans-serif; margin: 1em; }
.segment-row { display: flex; align-items: center; margin: 2px 0; }
.segment-label { flex: 0 0 8em; font-size: 12px; }
.segment { display: flex; flex: 1; height: 14px; border: 1px solid #999; }
.block.active { background: #1f77b4; }
.block.inactive { background: #eee; }
.block { height: 100%; box-sizing: border-box; border-right: 1px solid #fff; }
</style></head>""")


def _size(n: int) -> str:
    if n < 1024:
        return f"{n:,} bytes"
    value = n / 1024
    for unit in ("KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            break
        value /= 1024
    return f"{value:.1f} {unit}"


def _plot(snapshot: dict[str, Any], tl: dict[str, Any], device: int) -> tuple[_Markup, _Markup]:
    """The timeline's SVG and its legend."""
    # pad: the margins; left holds the y labels, the top the marks' labels (three rows).
    width, height, pad, left = 960, 360, 48, 72
    times = tl["times"] or [0]
    # The x axis is the event's place in the trace (as in PyTorch's viewer), not its time: a run's
    # events come in bursts, and on a time axis the bursts would be drawn as one vertical line.
    last = max(len(times) - 1, 1)
    y_max = max([max(v) for v in tl["series"].values() if v] + [1])

    def x(k: int) -> str:
        return f"{left + (width - left - pad) * k / last:.1f}"

    def y(v: int) -> str:
        return f"{height - pad - (height - 2 * pad) * v / y_max:.1f}"

    def steps(values: list[int]) -> str:
        # A value holds from its event to the next one: a step, not a slope, between events;
        # points only where it changes, and at both ends.
        points = [f"{x(0)},{y(values[0])}"] if values else []
        for k in range(1, len(values)):
            if values[k] != values[k - 1]:
                points.append(f"{x(k)},{y(values[k - 1])}")
                points.append(f"{x(k)},{y(values[k])}")
        if len(values) > 1:
            points.append(f"{x(len(values) - 1)},{y(values[-1])}")
        return " ".join(points)

    parts = [_element("rect", {"x": 0, "y": 0, "width": width, "height": height,
                               "fill": "#fff"}),
             _element("line", {"x1": left, "x2": width - pad, "y1": height - pad,
                               "y2": height - pad, "stroke": "#999"})]
    legend = []
    for i, (name, values) in enumerate(tl["series"].items()):
        colour = "#000" if name == "held" else _COLOURS[i % len(_COLOURS)]
        dash = {"stroke-dasharray": "4 2"} if name == "held" else {}
        parts.append(_element("polyline", {
            "class": "series", "data-name": name,
            "data-series": "held" if name == "held" else "owner", "fill": "none",
            "stroke": colour, "stroke-width": "1.5", **dash, "points": steps(values)}))
        legend.append(_element("li", {}, _element("span", {"style": f"color:{colour}"}, "\u25a0"),
                               f" {name} (peak {max(values) if values else 0:,} bytes)"))
    traces = snapshot["device_traces"]
    trace = traces[device] if device < len(traces) else []
    marked = [k for k, e in enumerate(trace) if e["action"] in ("oom", "trim")]
    label_end = [float("-inf")] * 3  # where each row of mark labels is taken up to
    for k, (_, action, text) in zip(marked, tl["marks"]):
        colour = "#d00" if action == "oom" else "#080"
        parts.append(_element("line", {
            "class": f"mark {action}", "x1": x(k), "x2": x(k), "y1": pad, "y2": height - pad,
            "stroke": colour, "stroke-dasharray": "2 2"}, _element("title", {}, text)))
        # A label in the first row it does not overlap (none when all three are taken there:
        # the line's title still says what it is).
        word = "OOM" if action == "oom" else "trim"
        span = 8.0 * len(word)
        at = float(x(k))
        row = next((r for r in range(3) if label_end[r] < at - span / 2), None)
        if row is not None:
            label_end[row] = at + span / 2 + 2
            parts.append(_element("text", {
                "class": "mark-label", "x": x(k), "y": pad - 4 - 12 * row, "font-size": 11,
                "text-anchor": "middle", "fill": colour}, word))
    parts.append(_element("text", {"x": left - 4, "y": height - pad + 4, "font-size": 12,
                                   "text-anchor": "end"}, "0"))
    if tl["times"]:
        parts.append(_element("text", {"x": left - 4, "y": pad + 4, "font-size": 12,
                                       "text-anchor": "end"},
                              _element("title", {}, f"{y_max:,} bytes"), _size(y_max)))
        parts.append(_element("text", {"x": left, "y": height - 16, "font-size": 12},
                              "event 1 (0 µs)"))
        parts.append(_element("text", {"x": width - pad, "y": height - 16, "font-size": 12,
                                       "text-anchor": "end"},
                              f"event {len(times):,} ({times[-1]:,} µs)"))
    else:
        parts.append(_element("text", {"x": (left + width - pad) / 2, "y": height / 2,
                                       "font-size": 14, "text-anchor": "middle"},
                              "no events recorded"))
    svg = _element("svg", {"xmlns": "http://www.w3.org/2000/svg", "width": width,
                           "height": height, "role": "img", "aria-label": "memory timeline"},
                   *parts)
    return svg, _element("ul", {"class": "legend"}, *legend)


def _segment_rows(snapshot: dict[str, Any], device: int) -> list[_Markup]:
    rows = []
    for seg in snapshot["segments"]:
        if seg.get("device", 0) != device:
            continue
        cells = []
        for b in seg["blocks"]:
            share = 100.0 * b["size"] / max(seg["total_size"], 1)
            active = b["state"] == "active_allocated"
            title = f"{b['state']} {b['size']} bytes" + (
                f" ({b.get('user_metadata', '')})" if active else "")
            cells.append(_element("span", {"class": f"block {'active' if active else 'inactive'}",
                                           "style": f"width:{share:.3f}%", "title": title}))
        about = (f'{seg["segment_type"]} segment at {seg["address"]:#x}, '
                 f'{seg["total_size"]:,} bytes, {seg["allocated_size"]:,} allocated')
        rows.append(_element("div", {"class": "segment-row"},
                             _element("span", {"class": "segment-label"},
                                      f'{seg["segment_type"]} {_size(seg["total_size"])}'),
                             _element("div", {"class": "segment", "title": about}, *cells)))
    return rows


def to_html(snapshot: dict[str, Any], device: int = 0) -> str:
    """One self-contained HTML page (inline SVG, no script, nothing fetched): the timeline of
    live bytes per owner and of the bytes the pool holds mapped, OOMs and trims marked, and the
    segment map of the snapshot. Every value from ``snapshot`` is text in the page (markup in an
    owner's name or a segment's type is shown, never run).

    Raises:
        SnapshotError, ValueError, TypeError: as :func:`timeline`.
    """
    tl = timeline(snapshot, device)
    svg, legend = _plot(snapshot, tl, device)
    rows = _segment_rows(snapshot, device)
    dropped = snapshot.get("vibespatial", {}).get("dropped_events", 0)
    about = (f'{len(tl["times"])} events; {len(tl["marks"])} marks (red: OOM, green: trim); '
             f"{dropped} events dropped by the bounded history. Lines: live bytes per owner, "
             "event by event (evenly spaced, whatever the time between them); dashed: bytes "
             "the pool holds mapped.")
    body = _element("body", {}, _element("h1", {}, f"Device {device} memory"), "\n",
                    _element("p", {}, about), "\n", svg, "\n", legend, "\n",
                    _element("h2", {}, f"Segments ({len(rows)})"), "\n", *rows, "\n")
    return "<!DOCTYPE html>\n" + _element("html", {"lang": "en"}, _HEAD, "\n", body) + "\n"


class _Refused(Exception):
    """A bad command line, input or output: one line on stderr, exit status 2."""


def _printable(text: object) -> str:
    # A path on one line: control characters (a newline in a file name) as escapes.
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def _read(args: Any) -> dict[str, Any]:
    """The snapshot to draw, checked for what drawing needs; the output known writable."""
    path = _printable(args.snapshot)
    try:
        data = load_snapshot(args.snapshot)
        _check_shape(data)
    except OSError as e:
        raise _Refused(f"cannot read {path}: {e.strerror or e}") from None
    except SnapshotError as e:
        raise _Refused(f"{path}: {_printable(e)}") from None
    try:
        _check_device(data, args.device)
    except ValueError as e:
        raise _Refused(f"--device: {e}") from None
    output = _printable(args.output)
    directory = os.path.dirname(os.path.abspath(args.output))
    if os.path.isdir(args.output):
        raise _Refused(f"{output} is a directory")
    if os.path.exists(args.output) and not args.overwrite:
        raise _Refused(f"{output} exists (--overwrite replaces it)")
    if not os.path.isdir(directory):
        raise _Refused(f"cannot write {output}: the directory {_printable(directory)} "
                       "does not exist")
    return data


def main(argv: list[str] | None = None) -> int:
    """``python -m vibespatial_raster.memviz snapshot.pickle -o out.html [--device N]``.

    Returns 0 when the page is written. A snapshot that cannot be read (no such file, not a
    pickle, cut short, naming code, not a snapshot, without a key the page needs), a device it
    does not have, an existing output without ``--overwrite`` or a missing output directory:
    one line on stderr, status 2 (as for a bad command line), and no page written."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m vibespatial_raster.memviz",
                                     description="Draw a memory snapshot as one HTML file.")
    parser.add_argument("snapshot", help="a pickle from memory.dump_snapshot (read as data: "
                                         "nothing in it is run)")
    parser.add_argument("-o", "--output", required=True, help="the HTML file to write")
    parser.add_argument("--device", type=int, default=0,
                        help="the device to draw (one the snapshot has; default 0)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output")
    args = parser.parse_args(argv)
    try:
        data = _read(args)
    except _Refused as e:
        print(f"memviz: {e}", file=sys.stderr)
        return 2
    try:
        check_snapshot(data)
    except SnapshotError as e:
        # Still drawn: the page needs no segments, and it shows what the trace holds; PyTorch's
        # viewer may refuse the same file.
        print(f"memviz: warning: the snapshot breaks what PyTorch's readers rely on: "
              f"{_printable(e)}", file=sys.stderr)
    html = to_html(data, args.device)
    # The library's writer (outputs.hpp): all or nothing, never over a FIFO, a device or the
    # snapshot drawn.
    from . import _core
    try:
        _core.write_file_atomically(args.output, html.encode("utf-8"), args.overwrite,
                                    [("the snapshot", args.snapshot)])
    except (ValueError, FileExistsError, FileNotFoundError, NotADirectoryError,
            IsADirectoryError, PermissionError) as e:
        print(f"memviz: {_printable(e)}", file=sys.stderr)  # refused: as a bad command line
        return 2
    except OSError as e:  # a failed write (a full disk, ...): nothing was left behind
        print(f"memviz: {_printable(e)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
