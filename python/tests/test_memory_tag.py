# SPDX-License-Identifier: Apache-2.0
"""memory.tag as a context manager of the standard library is: one object entered again inside
itself, entered by several threads at once, left by an exception; each exit pops what its own
entry pushed, on its own thread."""

from __future__ import annotations

import threading

import pytest

from vibespatial_raster import _core, memory

MIB = 1 << 20


def _owners_of(snap: dict, ptrs: set[int]) -> dict[int, str]:
    return {e["addr"]: e["user_metadata"] for e in snap["device_traces"][0]
            if e["action"] == "alloc" and e["addr"] in ptrs}


def test_a_tag_entered_again_inside_itself():
    t = memory.tag("outer")
    with t as entered:
        assert entered is t
        with t:
            assert _core.memory_tag_depth() == 2
        assert _core.current_memory_tag() == "outer" and _core.memory_tag_depth() == 1
        with memory.tag("inner"), t:
            assert _core.memory_tag_depth() == 3
        assert _core.current_memory_tag() == "outer" and _core.memory_tag_depth() == 1
    assert _core.current_memory_tag() == "user" and _core.memory_tag_depth() == 0
    with t:  # and reused afterwards
        assert _core.current_memory_tag() == "outer"
    assert _core.memory_tag_depth() == 0


def test_a_tag_pops_what_it_pushed_on_an_exception():
    t = memory.tag("failing")
    for _ in range(2 * 64):  # more than the stack's depth: nothing leaks
        with pytest.raises(KeyError):
            with t, t:
                raise KeyError("x")
    assert _core.memory_tag_depth() == 0


def test_the_blocks_of_a_reentered_tag_are_its_own_and_later_ones_are_not():
    t = memory.tag("tile")
    memory.record_memory_history(True, 1000)
    try:
        with t:
            with t:
                a = memory.DeviceBuffer(4096)
            b = memory.DeviceBuffer(4096)
        c = memory.DeviceBuffer(4096)
        snap = memory.snapshot()
    finally:
        memory.record_memory_history(False)
    owners = _owners_of(snap, {a.ptr, b.ptr, c.ptr})
    assert [owners[a.ptr], owners[b.ptr], owners[c.ptr]] == ["tile", "tile", "user"]
    for buf in (a, b, c):
        buf.close()


SHARED = memory.tag("shared")


def test_one_tag_shared_by_threads():
    threads = 4
    rounds = 300
    start = threading.Barrier(threads)
    errors: list[str] = []

    def work(k: int) -> None:
        start.wait()
        try:
            for i in range(rounds):
                with SHARED:
                    if _core.current_memory_tag() != "shared":
                        errors.append(f"thread {k} round {i}: {_core.current_memory_tag()}")
                    with SHARED:
                        if _core.memory_tag_depth() != 2:
                            errors.append(f"thread {k} round {i}: depth "
                                          f"{_core.memory_tag_depth()}")
                if _core.memory_tag_depth() != 0:
                    errors.append(f"thread {k} round {i}: left {_core.memory_tag_depth()} "
                                  f"tags pushed")
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(f"thread {k}: {e!r}")

    pool = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    assert errors == []
    assert _core.memory_tag_depth() == 0


def test_a_tag_left_on_a_thread_that_did_not_enter_it():
    t = memory.tag("here")
    t.__enter__()
    try:
        caught: list[BaseException] = []

        def leave() -> None:
            try:
                t.__exit__(None, None, None)
            except RuntimeError as e:
                caught.append(e)
            caught.append(_core.memory_tag_depth())  # type: ignore[arg-type]

        th = threading.Thread(target=leave)
        th.start()
        th.join()
        assert len(caught) == 2 and "did not enter" in str(caught[0]) and caught[1] == 0
        assert _core.current_memory_tag() == "here"  # this thread's entry is still open
    finally:
        t.__exit__(None, None, None)
    assert _core.memory_tag_depth() == 0
    with pytest.raises(RuntimeError, match="did not enter"):
        t.__exit__(None, None, None)  # left once more than entered


def test_a_tag_left_out_of_order_pops_what_was_pushed_inside_it():
    # A generator's block left after a block entered later (the generator closed inside it):
    # the outer exit takes the inner tag with it, and the inner exit then pops nothing of the
    # tags pushed since.
    outer, inner, later = memory.tag("outer"), memory.tag("inner"), memory.tag("later")
    outer.__enter__()
    inner.__enter__()
    outer.__exit__(None, None, None)
    assert _core.memory_tag_depth() == 0
    with later:
        inner.__exit__(None, None, None)
        assert _core.current_memory_tag() == "later" and _core.memory_tag_depth() == 1
    assert _core.memory_tag_depth() == 0
