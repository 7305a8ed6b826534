# SPDX-License-Identifier: Apache-2.0
"""Memory snapshots (:func:`vibespatial_raster.memory.snapshot`) without PyTorch.

:func:`check_snapshot` asserts the invariants that PyTorch's readers rely on
(``torch.cuda._memory_viz.segsum`` and ``trace``, and its MemoryViz viewer): every segment's
blocks tile it; every ``alloc`` has one ``free_requested`` and one ``free_completed`` after it,
or is a live block of the snapshot; and, for a history recorded from an empty pool, the pages
replayed from ``segment_map`` / ``segment_unmap`` are the snapshot's segments.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SnapshotError", "check_snapshot"]

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
    if problems:
        raise SnapshotError(problems)


def _check_pages(snapshot: dict[str, Any], problems: list[str]) -> None:
    # Pages (in the largest unit dividing every range) mapped by the trace, against the segments:
    # maps and unmaps need not pair up (an unmap may take the tail of a mapped run).
    ranges: set[int] = set()
    unit = 0
    for trace in snapshot.get("device_traces", []):
        for e in trace:
            if e["action"] in ("segment_map", "segment_unmap"):
                unit = e["size"] if unit == 0 else _gcd(unit, e["size"])
    for seg in snapshot.get("segments", []):
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
        for seg in snapshot.get("segments", [])
        for a in range(seg["address"], seg["address"] + seg["total_size"], unit)
    }
    if pages != ranges:
        problems.append("the pages the trace leaves mapped are not the snapshot's segments")


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a
