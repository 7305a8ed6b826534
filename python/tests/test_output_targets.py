# SPDX-License-Identifier: Apache-2.0
"""Every file the package writes goes through the library's one all-or-nothing writer, with its
rules for the target: memory.dump_snapshot, ``python -m vibespatial_raster.memviz`` and the
binding they share never replace a FIFO, a device or a directory, and memviz never writes over
the snapshot it draws."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from vibespatial_raster import _core, memory


def _kind(path) -> int:
    return stat.S_IFMT(os.lstat(path).st_mode)


def _special_files(tmp_path) -> list:
    """A FIFO, and (as root) a copy of /dev/null (character device 1:3)."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    made = [(fifo, stat.S_IFIFO)]
    if os.geteuid() == 0:
        null = tmp_path / "null"
        os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        made.append((null, stat.S_IFCHR))
    return made


def test_dump_snapshot_never_replaces_a_fifo_device_or_directory(tmp_path):
    special = _special_files(tmp_path)
    for path, kind in special:
        with pytest.raises(ValueError, match="not a regular file"):
            memory.dump_snapshot(path, overwrite=True)
        assert _kind(path) == kind
    with pytest.raises(ValueError, match="directory"):
        memory.dump_snapshot(tmp_path, overwrite=True)
    assert sorted(os.listdir(tmp_path)) == sorted(p.name for p, _ in special)


def test_write_file_atomically_binding(tmp_path):
    out = tmp_path / "out.txt"
    _core.write_file_atomically(str(out), b"first", False, [])
    assert out.read_bytes() == b"first"
    with pytest.raises(FileExistsError):
        _core.write_file_atomically(str(out), b"second", False, [])
    _core.write_file_atomically(str(out), b"second", True, [])
    assert out.read_bytes() == b"second"
    with pytest.raises(FileNotFoundError):
        _core.write_file_atomically(str(tmp_path / "missing" / "x"), b"x", True, [])
    os.symlink("out.txt", tmp_path / "link.txt")
    with pytest.raises(ValueError, match="the same file as the input"):
        _core.write_file_atomically(str(tmp_path / "link.txt"), b"x", True,
                                    [("the input", str(out))])
    assert out.read_bytes() == b"second"
    for path, kind in _special_files(tmp_path):
        with pytest.raises(ValueError):
            _core.write_file_atomically(str(path), b"x", True, [])
        assert _kind(path) == kind
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["out.txt", "link.txt", "pipe"] + (["null"] if os.geteuid() == 0 else []))


def test_memviz_writes_through_the_library_writer(tmp_path):
    # memviz renamed its temporary over anything that was not a directory (a FIFO, a device),
    # and with -o naming its own snapshot replaced the snapshot by the page.
    snap = tmp_path / "snap.pickle"
    memory.dump_snapshot(snap)
    before = snap.read_bytes()
    memviz = [sys.executable, "-m", "vibespatial_raster.memviz", str(snap)]
    special = _special_files(tmp_path)
    for path, kind in special:
        p = subprocess.run(memviz + ["-o", str(path), "--overwrite"], capture_output=True,
                           timeout=120)
        assert p.returncode == 2 and b"not a regular file" in p.stderr, p.stderr
        assert _kind(path) == kind
    for target in (snap, tmp_path / "." / "snap.pickle"):
        p = subprocess.run(memviz + ["-o", str(target), "--overwrite"], capture_output=True,
                           timeout=120)
        assert p.returncode == 2 and b"the same file as the snapshot" in p.stderr, p.stderr
    assert snap.read_bytes() == before
    p = subprocess.run(memviz + ["-o", str(tmp_path / "missing" / "out.html")],
                       capture_output=True, timeout=120)
    assert p.returncode == 2 and b"missing does not exist" in p.stderr, p.stderr
    assert not (tmp_path / "missing").exists()
    out = tmp_path / "out.html"
    subprocess.run(memviz + ["-o", str(out)], check=True, timeout=120)
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["out.html", "snap.pickle"] + [p.name for p, _ in special])
