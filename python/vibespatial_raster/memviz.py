# SPDX-License-Identifier: Apache-2.0
"""Memory snapshots (:func:`vibespatial_raster.memory.snapshot`) without PyTorch.

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
"""

from __future__ import annotations

import bisect
from typing import Any

__all__ = ["SnapshotError", "check_snapshot", "main", "timeline", "to_html"]

_STATES = {"active_allocated", "active_awaiting_free", "inactive"}


class SnapshotError(ValueError):
    """A snapshot breaks an invariant of PyTorch's format; ``problems`` lists each one."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems[:10]) + (" ..." if len(problems) > 10 else ""))
        self.problems = problems


def _segments(snapshot: dict[str, Any], problems: list[str]) -> dict[int, int]:
    live: dict[int, int] = {}
    for i, seg in enumerate(snapshot.get("segments", [])):
        where = f"segment {i} at {seg.get('address', '?'):#x}"
        cursor = seg["address"]
        total = allocated = 0
        for b in seg["blocks"]:
            if b["state"] not in _STATES:
                problems.append(f"{where}: a block's state is {b['state']!r}")
            if b["address"] != cursor:
                problems.append(f"{where}: a block at {b['address']:#x} does not follow the last")
            if "frames" not in b:
                problems.append(f"{where}: a block has no frames")
            cursor = b["address"] + b["size"]
            total += b["size"]
            if b["state"] == "active_allocated":
                allocated += b["size"]
                if not 0 < b["requested_size"] <= b["size"]:
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
    """
    problems: list[str] = []
    live = _segments(snapshot, problems)
    if complete and snapshot.get("vibespatial", {}).get("dropped_events", 0):
        problems.append("events were dropped: the history is not complete")
    for d, trace in enumerate(snapshot.get("device_traces", [])):
        state: dict[int, str] = {}
        last_time = 0
        for k, e in enumerate(trace):
            where = f"device {d} event {k} ({e.get('action')})"
            for key in ("action", "size", "stream", "frames", "time_us"):
                if key not in e:
                    problems.append(f"{where}: no {key!r}")
            if e.get("time_us", 0) < last_time:
                problems.append(f"{where}: earlier than the event before it")
            last_time = e.get("time_us", last_time)
            action = e["action"]
            if action == "oom":
                if "device_free" not in e:
                    problems.append(f"{where}: an oom without device_free")
                continue
            if action in ("alloc", "free_requested", "free_completed") and "addr" not in e:
                problems.append(f"{where}: no addr")
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
        lo = bisect.bisect_left(self.ends, a)  # ranges that end at a or later ...
        hi = bisect.bisect_right(self.begins, e)  # ... and begin at e or earlier merge with it
        if lo < hi:
            a = min(a, self.begins[lo])
            e = max(e, self.ends[hi - 1])
        self.begins[lo:hi] = [a]
        self.ends[lo:hi] = [e]

    def remove(self, a: int, e: int) -> None:
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
    for trace in snapshot.get("device_traces", []):
        for e in trace:
            if e["action"] == "segment_alloc":
                if e["addr"] in got:
                    problems.append(f"segment {e['addr']:#x} got twice")
                got[e["addr"]] = e["size"]
            elif e["action"] == "segment_free":
                if got.pop(e["addr"], None) != e["size"]:
                    problems.append(f"segment {e['addr']:#x} given back, never got")
    segments = []
    for seg in snapshot.get("segments", []):
        if not seg.get("is_expandable") and got.get(seg["address"]) == seg["total_size"]:
            del got[seg["address"]]
        else:
            segments.append(seg)
    for addr in got:
        problems.append(f"segment {addr:#x} was got and not given back, and is not in the snapshot")
    # Pages (in the largest unit dividing every range) mapped by the trace, against the other
    # segments: maps and unmaps need not pair up (an unmap may take the tail of a mapped run).
    ranges: set[int] = set()
    unit = 0
    for trace in snapshot.get("device_traces", []):
        for e in trace:
            if e["action"] in ("segment_map", "segment_unmap"):
                unit = e["size"] if unit == 0 else _gcd(unit, e["size"])
    for seg in segments:
        unit = seg["total_size"] if unit == 0 else _gcd(unit, seg["total_size"])
    if unit == 0:
        return
    for trace in snapshot.get("device_traces", []):
        for e in trace:
            if e["action"] == "segment_map":
                for a in range(e["addr"], e["addr"] + e["size"], unit):
                    if a in ranges:
                        problems.append(f"page {a:#x} mapped twice")
                    ranges.add(a)
            elif e["action"] == "segment_unmap":
                for a in range(e["addr"], e["addr"] + e["size"], unit):
                    if a not in ranges:
                        problems.append(f"page {a:#x} unmapped, never mapped")
                    ranges.discard(a)
    pages = {
        a
        for seg in segments
        for a in range(seg["address"], seg["address"] + seg["total_size"], unit)
    }
    if pages != ranges:
        problems.append("the pages the trace leaves mapped are not the snapshot's segments")


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


# ---- a picture without PyTorch ----


def timeline(snapshot: dict[str, Any], device: int = 0) -> dict[str, Any]:
    """The live bytes per owner and the bytes mapped ("held") over the history of ``device``:
    ``{"times": [...], "series": {name: [...]}, "marks": [(time, action, text), ...]}``, one
    point per event, times in microseconds from the first event. Marks are OOMs and trims."""
    traces = snapshot.get("device_traces", [])
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
    held = sum(s["total_size"] for s in snapshot.get("segments", [])
               if s.get("device", 0) == device)
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


_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
            "#7f7f7f", "#bcbd22", "#17becf"]


def _esc(text: str) -> str:
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))


def _size(n: int) -> str:
    if n < 1024:
        return f"{n:,} bytes"
    value = n / 1024
    for unit in ("KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            break
        value /= 1024
    return f"{value:.1f} {unit}"


def to_html(snapshot: dict[str, Any], device: int = 0) -> str:
    """One self-contained HTML page (inline SVG, no script, nothing fetched): the timeline of
    live bytes per owner and of the bytes the pool holds mapped, OOMs and trims marked, and the
    segment map of the snapshot."""
    tl = timeline(snapshot, device)
    # pad: the margins; left holds the y labels, the top the marks' labels (three rows).
    width, height, pad, left = 960, 360, 48, 72
    times = tl["times"] or [0]
    # The x axis is the event's place in the trace (as in PyTorch's viewer), not its time: a run's
    # events come in bursts, and on a time axis the bursts would be drawn as one vertical line.
    last = max(len(times) - 1, 1)
    y_max = max([max(v) for v in tl["series"].values() if v] + [1])

    def x(k: int) -> float:
        return left + (width - left - pad) * k / last

    def y(v: int) -> float:
        return height - pad - (height - 2 * pad) * v / y_max

    def steps(values: list[int]) -> str:
        # A value holds from its event to the next one: a step, not a slope, between events;
        # points only where it changes, and at both ends.
        points = [f"{x(0):.1f},{y(values[0]):.1f}"] if values else []
        for k in range(1, len(values)):
            if values[k] != values[k - 1]:
                points.append(f"{x(k):.1f},{y(values[k - 1]):.1f}")
                points.append(f"{x(k):.1f},{y(values[k]):.1f}")
        if len(values) > 1:
            points.append(f"{x(len(values) - 1):.1f},{y(values[-1]):.1f}")
        return " ".join(points)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'role="img" aria-label="memory timeline">',
             f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fff"/>',
             f'<line x1="{left}" x2="{width - pad}" y1="{height - pad}" y2="{height - pad}" '
             f'stroke="#999"/>']
    legend = []
    for i, (name, values) in enumerate(tl["series"].items()):
        colour = "#000" if name == "held" else _COLOURS[i % len(_COLOURS)]
        dash = ' stroke-dasharray="4 2"' if name == "held" else ""
        kind = "held" if name == "held" else "owner"
        parts.append(f'<polyline class="series" data-name="{_esc(name)}" data-series="{kind}" '
                     f'fill="none" stroke="{colour}" stroke-width="1.5"{dash} '
                     f'points="{steps(values)}"/>')
        legend.append(f'<li><span style="color:{colour}">&#9632;</span> {_esc(name)} '
                      f'(peak {max(values) if values else 0:,} bytes)</li>')
    traces = snapshot.get("device_traces", [])
    trace = traces[device] if device < len(traces) else []
    marked = [k for k, e in enumerate(trace) if e["action"] in ("oom", "trim")]
    label_end = [float("-inf")] * 3  # where each row of mark labels is taken up to
    for k, (_, action, text) in zip(marked, tl["marks"]):
        colour = "#d00" if action == "oom" else "#080"
        parts.append(f'<line class="mark {action}" x1="{x(k):.1f}" x2="{x(k):.1f}" y1="{pad}" '
                     f'y2="{height - pad}" stroke="{colour}" stroke-dasharray="2 2">'
                     f'<title>{_esc(text)}</title></line>')
        # A label in the first row it does not overlap (none when all three are taken there:
        # the line's title still says what it is).
        word = "OOM" if action == "oom" else "trim"
        span = 8.0 * len(word)
        row = next((r for r in range(3) if label_end[r] < x(k) - span / 2), None)
        if row is not None:
            label_end[row] = x(k) + span / 2 + 2
            parts.append(f'<text class="mark-label" x="{x(k):.1f}" y="{pad - 4 - 12 * row}" '
                         f'font-size="11" text-anchor="middle" fill="{colour}">{word}</text>')
    parts.append(f'<text x="{left - 4}" y="{height - pad + 4}" font-size="12" '
                 f'text-anchor="end">0</text>')
    if tl["times"]:
        parts.append(f'<text x="{left - 4}" y="{pad + 4}" font-size="12" text-anchor="end">'
                     f'<title>{y_max:,} bytes</title>{_size(y_max)}</text>')
        parts.append(f'<text x="{left}" y="{height - 16}" font-size="12">event 1 (0 µs)</text>')
        parts.append(f'<text x="{width - pad}" y="{height - 16}" font-size="12" '
                     f'text-anchor="end">event {len(times):,} ({times[-1]:,} µs)</text>')
    else:
        parts.append(f'<text x="{(left + width - pad) / 2}" y="{height / 2}" font-size="14" '
                     f'text-anchor="middle">no events recorded</text>')
    parts.append("</svg>")
    rows = []
    for seg in snapshot.get("segments", []):
        if seg.get("device", 0) != device:
            continue
        cells = []
        for b in seg["blocks"]:
            share = 100.0 * b["size"] / max(seg["total_size"], 1)
            active = b["state"] == "active_allocated"
            title = _esc(f"{b['state']} {b['size']} bytes" +
                         (f" ({b.get('user_metadata', '')})" if active else ""))
            cells.append(f'<span class="block {"active" if active else "inactive"}" '
                         f'style="width:{share:.3f}%" title="{title}"></span>')
        about = (f'{seg["segment_type"]} segment at {seg["address"]:#x}, '
                 f'{seg["total_size"]:,} bytes, {seg["allocated_size"]:,} allocated')
        rows.append(f'<div class="segment-row"><span class="segment-label">'
                    f'{seg["segment_type"]} {_size(seg["total_size"])}</span>'
                    f'<div class="segment" title="{about}">{"".join(cells)}</div></div>')
    extra = snapshot.get("vibespatial", {})
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>vibespatial-raster memory snapshot</title>
<style>
body {{ font-family: sans-serif; margin: 1em; }}
.segment-row {{ display: flex; align-items: center; margin: 2px 0; }}
.segment-label {{ flex: 0 0 8em; font-size: 12px; }}
.segment {{ display: flex; flex: 1; height: 14px; border: 1px solid #999; }}
.block.active {{ background: #1f77b4; }}
.block.inactive {{ background: #eee; }}
.block {{ height: 100%; box-sizing: border-box; border-right: 1px solid #fff; }}
</style></head><body>
<h1>Device {device} memory</h1>
<p>{len(tl["times"])} events; {len(tl["marks"])} marks (red: OOM, green: trim);
{extra.get("dropped_events", 0)} events dropped by the bounded history. Lines: live bytes per
owner, event by event (evenly spaced, whatever the time between them); dashed: bytes the pool
holds mapped.</p>
{"".join(parts)}
<ul class="legend">{"".join(legend)}</ul>
<h2>Segments ({len(rows)})</h2>
{"".join(rows)}
</body></html>
"""


def main(argv: list[str] | None = None) -> int:
    """``python -m vibespatial_raster.memviz snapshot.pickle -o out.html [--device N]``."""
    import argparse
    import os
    import pickle
    import sys

    parser = argparse.ArgumentParser(prog="python -m vibespatial_raster.memviz",
                                     description="Draw a memory snapshot as one HTML file.")
    parser.add_argument("snapshot", help="a pickle from memory.dump_snapshot")
    parser.add_argument("-o", "--output", required=True, help="the HTML file to write")
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output")
    args = parser.parse_args(argv)
    with open(args.snapshot, "rb") as f:
        data = pickle.load(f)
    if not isinstance(data, dict) or "segments" not in data:
        parser.error(f"{args.snapshot} is not a memory snapshot")
    try:
        check_snapshot(data)
    except SnapshotError as e:
        # Still drawn: the page needs no segments, and it shows what the trace holds; PyTorch's
        # viewer may refuse the same file.
        print(f"memviz: warning: the snapshot breaks what PyTorch's readers rely on: {e}",
              file=sys.stderr)
    if os.path.exists(args.output) and not args.overwrite:
        parser.error(f"{args.output} exists (--overwrite replaces it)")
    html = to_html(data, args.device)
    # The library's writer (outputs.hpp): all or nothing, never over a FIFO, a device or the
    # snapshot drawn.
    from . import _core
    try:
        _core.write_file_atomically(args.output, html.encode("utf-8"), args.overwrite,
                                    [("the snapshot", args.snapshot)])
    except (ValueError, FileExistsError, FileNotFoundError, NotADirectoryError,
            PermissionError) as e:
        parser.error(str(e))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
