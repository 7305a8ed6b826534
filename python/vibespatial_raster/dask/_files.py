# SPDX-License-Identifier: Apache-2.0
"""Raster files on Dask: a file as a Dask array of windows, a Dask array written as one GeoTIFF
(parts written in parallel, then merged), and the two around an op."""

from __future__ import annotations

import contextlib
import errno
import functools
import math
import os
import re
import shutil
import socket
import stat
import threading
import uuid
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

import dask
import dask.array as da
import distributed
import numpy as np

from .. import _core
from .. import io as _io
from ..buffers import OwnedRasterArray, RasterMetadata, TilingStrategy
from ._block import BandOp, _starts
from ._chunks import _dask_chunks, _file_block_shape, _split, chunk_plan
from ._georef import _UNSET, _affine6, _crs_text
from ._map import _map, _prepare
from ._plugin import _client_or_none, _on_a_worker

try:
    import fcntl
except ImportError:  # no flock (Windows): parts left by a killed writer are only reported
    fcntl = None  # type: ignore[assignment]

class _WindowReader:
    """A raster file as an array-like for ``dask.array.from_array``: each chunk is one
    windowed read through :func:`vibespatial_raster.io.read_raster`."""

    def __init__(self, path: str, meta: RasterMetadata, bands: tuple[int, ...]) -> None:
        self.path = path
        self.bands = bands
        self.dtype = np.dtype(meta.dtype)
        self.shape = (len(bands), int(meta.height), int(meta.width))
        self.ndim = 3

    def __getitem__(self, key: Any) -> np.ndarray:
        if not isinstance(key, tuple):
            key = (key,)
        key = key + (slice(None),) * (3 - len(key))
        (b0, b1, _), (r0, r1, _), (c0, c1, _) = (
            k.indices(n) for k, n in zip(key, self.shape))
        if b1 <= b0 or r1 <= r0 or c1 <= c0:
            return np.empty((max(0, b1 - b0), max(0, r1 - r0), max(0, c1 - c0)), self.dtype)
        raster = _io.read_raster(self.path, window=(c0, r0, c1 - c0, r1 - r0),
                                 bands=list(self.bands[b0:b1]))
        return np.asarray(raster.to_numpy()).reshape(b1 - b0, r1 - r0, c1 - c0)


def _metadata(path: str, client: Any) -> RasterMetadata:
    if client is None:
        return _io.read_raster_metadata(path)
    return client.submit(_io.read_raster_metadata, path, pure=False).result()


def _header(path: str) -> tuple[RasterMetadata, tuple[int, int]]:
    return _io.read_raster_metadata(path), _file_block_shape(path)


def _header_on_a_worker(path: str, client: Any) -> tuple[RasterMetadata, tuple[int, int]]:
    """The file's metadata and blocks, read where the tasks read it."""
    return _on_a_worker(client, _header, path)


def read_raster(path: str | os.PathLike, *, chunks: Any = None,
                bands: Sequence[int] | None = None, xarray: bool = False,
                buffers_per_band: int = 2, halo: int = 0, scratch_bytes: int = 0,
                per_band: bool = True, client: Any = None) -> Any:
    """The raster file at ``path`` as a lazy Dask array (bands, height, width): each chunk is
    read by its own task (a window of the 1-based ``bands``, default all, through GDAL), so the
    workers read in parallel.

    ``chunks``: None plans them (:func:`plan_chunks` with ``buffers_per_band``, ``halo``,
    ``scratch_bytes``, ``per_band``; aligned to the file's tiles); or Dask chunks for the
    (bands, height, width) array: an int (every axis), -1 or None (whole axes), ``"auto"`` or a
    size such as ``"64MiB"``, a dict ``{axis: size}``, or one entry per axis (an int, -1,
    ``"auto"``, or that axis's chunk sizes, adding up to it).
    ``xarray=True`` returns an xarray ``DataArray`` (dims band, y, x; ``x`` / ``y`` pixel-centre
    coordinates for a north-up affine; attrs ``crs`` (WKT), ``transform`` (rasterio order),
    ``_FillValue``; a rioxarray-style ``spatial_ref`` coordinate).

    Raises:
        TypeError / ValueError: ``chunks`` of another type, or that do not fit the array or
        hold an empty chunk (naming ``chunks`` and these forms); ValueError: a band not in the
        file. What :func:`vibespatial_raster.io.read_raster_metadata` raises.
    """
    p = os.fspath(path)
    c = _client_or_none(client)
    meta, block_shape = _header_on_a_worker(p, c)
    band_list = tuple(int(b) for b in (bands or range(1, meta.band_count + 1)))
    for b in band_list:
        if not 1 <= b <= meta.band_count:
            raise ValueError(f"band {b} is not in [1, {meta.band_count}]")
    sub = replace(meta, band_count=len(band_list))
    if chunks is not None:
        chunks = _dask_chunks("read_raster", chunks, (len(band_list), meta.height, meta.width),
                              np.dtype(meta.dtype))
    else:
        chunks = chunk_plan(sub, buffers_per_band=buffers_per_band, halo=halo,
                            scratch_bytes=scratch_bytes, client=client, per_band=per_band,
                            block_shape=block_shape).chunks
    reader = _WindowReader(p, meta, band_list)
    try:
        stamp = os.stat(p).st_mtime_ns
    except OSError:
        stamp = 0
    name = "vsr-read-" + dask.base.tokenize(p, stamp, band_list, chunks)
    arr = da.from_array(reader, chunks=chunks, lock=False, fancy=False, asarray=True,
                        meta=np.empty((0, 0, 0), dtype=reader.dtype), name=name)
    if not xarray:
        return arr
    return _to_dataarray(arr, sub, band_list)


def _to_dataarray(arr: Any, meta: RasterMetadata, bands: tuple[int, ...]) -> Any:
    import xarray as xr

    a, b, c, d, e, f = meta.affine
    crs = _crs_text(meta.crs)
    coords: dict[str, Any] = {"band": list(bands)}
    if b == 0 and d == 0:
        coords["x"] = c + a * (np.arange(meta.width) + 0.5)
        coords["y"] = f + e * (np.arange(meta.height) + 0.5)
    ref_attrs = {"GeoTransform": " ".join(repr(v) for v in (c, a, b, f, d, e))}
    if crs:
        ref_attrs["crs_wkt"] = crs
        ref_attrs["spatial_ref"] = crs
    coords["spatial_ref"] = xr.Variable((), 0, attrs=ref_attrs)
    attrs: dict[str, Any] = {"transform": tuple(meta.affine)}
    if crs:
        attrs["crs"] = crs
    if meta.nodata is not None:
        attrs["_FillValue"] = meta.nodata
    return xr.DataArray(arr, dims=("band", "y", "x"), coords=coords, attrs=attrs)


@dataclass(frozen=True)
class _PartWriter:
    """The target of ``dask.array.store``: each chunk becomes a GeoTIFF of its own in
    ``parts_dir`` (written under a temporary name, then renamed, so a task retried after its
    worker died leaves one whole file)."""

    parts_dir: str
    nodata: float | int | None
    affine: tuple[float, ...]
    crs: str | None

    def __setitem__(self, key: tuple[slice, ...], value: np.ndarray) -> None:
        (b, r, c) = key
        final = os.path.join(self.parts_dir, _part_name(b.start, r.start, c.start))
        tmp = f"{final}.{os.getpid()}-{threading.get_ident()}.tmp"
        raster = OwnedRasterArray.from_numpy(np.ascontiguousarray(value), nodata=self.nodata,
                                             affine=_core.affine_shifted(self.affine, c.start,
                                                                         r.start),
                                             crs=self.crs)
        _io.write_raster(tmp, raster, compress=None, tiled=False)
        os.replace(tmp, final)


def _part_name(b0: int, r0: int, c0: int) -> str:
    return f"part-b{b0}-r{r0}-c{c0}.tif"


# GDAL keeps the nodata of a 64-bit integer band as an integer of its type, read from its text
# with strtoll / strtoull: any other text becomes some integer of the type.
_INT64_LIMITS = {"int64": (-(2**63), 2**63 - 1), "uint64": (0, 2**64 - 1)}


def _file_nodata(who: str, nodata: Any, dtype: np.dtype) -> float | int | None:
    """``nodata`` as the written file's GDAL NoData holds it: a Python int for a 64-bit integer
    ``dtype`` (exactly), else a Python float (a NumPy scalar becomes a plain number). GDAL keeps
    a float32 band's nodata as a float32: a finite value it would turn into an infinity or into
    zero (1e300, 1e-50) is refused with ValueError, since those would mark real pixels. For a
    64-bit integer dtype, the value its largest integer rounds to as a double (2**63 for int64,
    2**64 for uint64: what that nodata becomes in the runtime, which holds nodata as a double)
    stands for the largest integer, and any other value that is not an integer of the type's
    range is refused with ValueError: the file would hold some other integer and mark real
    pixels as nodata."""
    if nodata is None:
        return None
    if dtype.name == "float32":
        given = float(nodata)
        with np.errstate(over="ignore", under="ignore"):
            held = float(np.float32(given))
        if math.isfinite(given) and (math.isinf(held) or (held == 0 and given != 0)):
            raise ValueError(f"{who}: nodata {nodata!r} is beyond float32's range: a float32 "
                             f"GeoTIFF would keep it as {held!r} and mark those pixels as nodata; "
                             "give a value float32 holds, or None")
        return given
    if dtype.name not in _INT64_LIMITS:
        return float(nodata)
    lo, hi = _INT64_LIMITS[dtype.name]
    value: int | None
    if isinstance(nodata, (int, np.integer)):
        value = int(nodata)
    else:
        f = float(nodata)
        value = int(f) if math.isfinite(f) and f.is_integer() else None
    if value == hi + 1:  # float(hi) is hi + 1 for both types: the runtime's nodata is a double
        value = hi
    if value is None or not lo <= value <= hi:
        raise ValueError(f"{who}: nodata {nodata!r} cannot be the nodata of a {dtype} GeoTIFF: "
                         f"GDAL keeps a {dtype} raster's nodata as an integer from {lo} to {hi}, "
                         "and would mark other pixels; give such an integer, or None")
    return value


def _merge_parts(_stored: Any, parts_dir: str, out_path: str,
                 chunks: tuple[tuple[int, ...], ...], dtype: np.dtype, nodata: Any,
                 affine: tuple[float, ...], crs: str | None, compress: str | None,
                 tiled: bool, blocksize: int) -> RasterMetadata:
    """The parts of ``parts_dir`` as one GeoTIFF at ``out_path``, through the native part merge
    (one tile source over the part files, written all or nothing, a tile of the largest chunk at
    a time); the parts are removed."""
    band_chunks, row_chunks, col_chunks = chunks
    parts = [(os.path.join(parts_dir, _part_name(b0, r0, c0)), (c0, r0, cw, rh), b0)
             for b0 in _starts(band_chunks)
             for r0, rh in zip(_starts(row_chunks), row_chunks)
             for c0, cw in zip(_starts(col_chunks), col_chunks)]
    try:
        _core.merge_raster_parts(parts, sum(row_chunks), sum(col_chunks), sum(band_chunks),
                                 dtype.name, nodata, affine, crs or "", _io._path(out_path),
                                 "GTiff", _io._compress(compress), bool(tiled),
                                 _io._block(blocksize, blocksize))
    finally:
        shutil.rmtree(parts_dir, ignore_errors=True)
    return _io.read_raster_metadata(out_path)


def _probe_write(parts_dir: str, dtype: np.dtype, nodata: Any, affine: tuple[float, ...],
                 crs: str | None, compress: str | None, tiled: bool, blocksize: int) -> None:
    """One pixel written with the output's dtype, georeferencing and options, then removed: what
    GDAL refuses (an unknown ``compress``, a tile side that is not a multiple of 16, a CRS it
    does not understand) fails before the job, not after every chunk has been computed."""
    probe = os.path.join(parts_dir, "probe.tif")
    pixel = OwnedRasterArray.from_numpy(np.zeros((1, 1, 1), dtype), nodata=nodata,
                                        affine=affine, crs=crs)
    _io.write_raster(probe, pixel, compress=compress, tiled=tiled, blockxsize=blocksize,
                     blockysize=blocksize)
    os.remove(probe)


# A write's parts directory is ``<out>.parts-<12 hex digits>``; the process that called the write
# holds an exclusive flock on the directory's WRITER_LOCK file for as long as the write runs
# (made under another name, locked, then renamed, so the file never exists unlocked while its
# writer lives); the file names the writer's host. The kernel drops the lock when that process
# dies, however it dies, so a directory whose lock file can be locked from the writer's host was
# left by a writer that is gone. From another host a lock may not be seen (NFS mounted with
# local_lock=flock, some cluster file systems), and without a lock file (a writer whose process
# does not see the directory: another machine; one making it now) nothing can be said: such
# directories are reported, never removed.
_WRITER_LOCK = "writer.lock"


def _lock_record() -> bytes:
    return f"pid {os.getpid()} on {socket.gethostname()}\n".encode()


def _recorded_here(record: bytes) -> bool:
    """Whether a lock file's ``record`` names this host."""
    host = record.decode("utf-8", "replace").rstrip("\n").partition(" on ")[2]
    return host == socket.gethostname()


def _parts_dir_pattern(out_path: str) -> re.Pattern[str]:
    return re.compile(re.escape(os.path.basename(out_path)) + r"\.parts-[0-9a-f]{12}")


def _new_parts_dir(out_path: str) -> str:
    return f"{out_path}.parts-{uuid.uuid4().hex[:12]}"


def _remove_if_writer_gone(parts_dir: str) -> bool | None:
    """Removes ``parts_dir`` if its writer is gone: True when removed, False when its writer
    holds the lock (a live write: another process, or another thread of this one), None when
    it cannot tell (no lock file, a writer on another host, no flock here) or could not remove
    it."""
    if fcntl is None:
        return None
    try:
        fd = os.open(os.path.join(parts_dir, _WRITER_LOCK),
                     os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        except OSError:
            return None
        try:
            record = os.pread(fd, 4096, 0)
        except OSError:
            return None
        if not _recorded_here(record):
            return None
        shutil.rmtree(parts_dir, ignore_errors=True)  # the lock held: no other sweep races it
        return None if os.path.lexists(parts_dir) else True
    finally:
        os.close(fd)


def _sweep_parts_dirs(out_path: str) -> list[str]:
    """Removes the parts directories beside ``out_path`` that writes of ``out_path`` left when
    their process died (killed before it could clean up); returns those whose writer it cannot
    judge. Only real directories named as this module names them for ``out_path`` are looked
    at: a file or symbolic link of such a name, or another target's parts, are never touched."""
    parent = os.path.dirname(os.path.abspath(out_path))
    pattern = _parts_dir_pattern(out_path)
    unknown: list[str] = []
    try:
        names = sorted(os.listdir(parent))
    except OSError:
        return unknown
    for name in names:
        if not pattern.fullmatch(name):
            continue
        path = os.path.join(parent, name)
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                continue
        except OSError:
            continue  # removed meanwhile
        if _remove_if_writer_gone(path) is None and os.path.lexists(path):
            unknown.append(path)  # (not one another sweep removed meanwhile)
    return unknown


def _make_parts_dir(parts_dir: str, out_path: str) -> list[str]:
    """Makes ``parts_dir`` beside ``out_path``, first removing the parts directories that dead
    writes of ``out_path`` left; returns the leftovers it could not judge (see
    :func:`_sweep_parts_dirs`). FileNotFoundError when the output's directory does not exist
    (it is never made: a mistyped path must not become a directory tree)."""
    _check_out_dir(out_path)
    unknown = _sweep_parts_dirs(out_path)
    os.mkdir(parts_dir)
    return unknown


def _hold_writer_lock(parts_dir: str) -> int | None:
    """Makes ``parts_dir``'s lock file, locked by this process; returns its descriptor (close
    it once the parts directory is gone), or None when this process cannot (it does not see the
    directory: the workers run on another machine; or the file system has no flock)."""
    if fcntl is None:
        return None
    tmp = os.path.join(parts_dir, f".{_WRITER_LOCK}.{uuid.uuid4().hex[:12]}")
    try:
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, _lock_record())
        os.rename(tmp, os.path.join(parts_dir, _WRITER_LOCK))
    except OSError:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.remove(tmp)
        return None
    return fd


def _check_out_dir(out_path: str) -> None:
    parent = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(parent):
        raise FileNotFoundError(errno.ENOENT, "the output's directory does not exist", parent)


def _same_file(a: str, b: str) -> bool:
    if os.path.abspath(a) == os.path.abspath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False  # one of them does not exist


def _read_paths(data: Any) -> list[str]:
    """The paths of the :class:`_WindowReader` objects in ``data``'s Dask graph: the files
    :func:`read_raster` reads for it (through any operation on its result). The graph's layers
    are walked without materializing blockwise ones (their literal arguments and task are
    looked at); files read by other means are not found."""
    nodes: tuple[type, ...] = ()
    try:
        from dask._task_spec import GraphNode

        nodes = (GraphNode,)
    except ImportError:  # a Dask of tuple tasks: the tuples are walked
        pass
    from dask.blockwise import Blockwise

    found: dict[str, None] = {}
    seen: set[int] = set()

    def visit(obj: Any, depth: int) -> None:
        if isinstance(obj, _WindowReader):
            found[obj.path] = None
            return
        if depth > 32 or id(obj) in seen or isinstance(obj, (str, bytes, np.ndarray)):
            return
        if isinstance(obj, (tuple, list, set, frozenset)):
            seen.add(id(obj))
            for v in obj:
                visit(v, depth + 1)
        elif isinstance(obj, dict):
            seen.add(id(obj))
            for v in obj.values():
                visit(v, depth + 1)
        elif isinstance(obj, functools.partial):
            visit((obj.func, obj.args, obj.keywords), depth + 1)
        elif isinstance(obj, nodes):
            seen.add(id(obj))
            for attr in ("value", "func", "args", "kwargs", "target"):
                visit(getattr(obj, attr, None), depth + 1)

    graph = data.__dask_graph__()
    for layer in getattr(graph, "layers", {"": graph}).values():
        if isinstance(layer, Blockwise):
            visit(tuple(layer.indices), 0)
            visit(getattr(layer, "task", None), 0)
            visit(getattr(layer, "dsk", None), 0)
        else:
            for task in layer.values():
                visit(task, 0)
    return list(found)


def _first_same_file(paths: Sequence[str], path: str) -> str | None:
    return next((p for p in paths if _same_file(p, path)), None)


def _run_with_progress(graph: Any, progress: bool, client: Any) -> Any:
    client = _client_or_none(client)
    if client is not None:
        future = client.compute(graph)
        if progress:
            distributed.progress(future, notebook=False)
        return future.result()
    if progress:
        from dask.diagnostics import ProgressBar

        with ProgressBar():
            return dask.compute(graph)[0]
    return dask.compute(graph)[0]


def write_raster(array: Any, path: str | os.PathLike, *, nodata: Any = _UNSET,
                 affine: Any = None, crs: Any = None, compress: str | None = "deflate",
                 tiled: bool = True, blocksize: int = 256, progress: bool = False,
                 client: Any = None) -> RasterMetadata:
    """Compute ``array`` (Dask array (bands, height, width) or (height, width), or a
    DataArray) and write it as one GeoTIFF at ``path``; returns the written file's metadata.

    Each task writes its chunk to a part file beside ``path`` (``<path>.parts-<id>/``, removed
    at the end), so the chunks are computed and written in parallel; one last task streams the
    parts into ``path`` (the library's ``merge_raster_parts``), one chunk-sized tile at a time
    (compressed as ``compress``, tiled ``blocksize`` square), all or nothing. ``progress=True`` shows Dask's progress bar
    (``distributed.progress`` with a client, else ``dask.diagnostics.ProgressBar``).
    Georeferencing and the check of ``nodata`` as :func:`map_bands`; the file's nodata is the
    value given, exactly (a 64-bit integer one too).

    A write whose process is killed (SIGKILL, a lost machine) leaves its parts directory. The
    next write of ``path`` removes those whose writer is known to be gone (the calling process
    holds a lock on its parts directory while it lives) and warns (RuntimeWarning), naming them,
    about those it cannot judge: a writer whose process does not see the workers' files (another
    machine), a leftover of an older version. Parts of a live write are never removed.

    ``path`` must not be a file ``array`` reads: the files of the :func:`read_raster` calls
    in its Dask graph (through any operations on their results; also under another name or a
    hard link) are refused. A file read into the array by other means (``da.from_delayed``,
    another reader) is not recognised; a persisted array no longer reads its file.

    Raises:
        ValueError: ``path`` is a file the array reads (see above); FileNotFoundError:
        ``path``'s directory does not exist (it is not made); TypeError / ValueError: a
        ``nodata`` :func:`map_bands` refuses, or a nodata the GeoTIFF would keep as another value
        that marks real pixels (for a 64-bit integer dtype, anything but an integer of its
        range; for float32, a finite value beyond its range: 1e300 would be inf, 1e-50 zero);
        all before any work. ValueError /
        RuntimeError: what :func:`vibespatial_raster.io.write_raster` and GDAL raise; whatever
        computing ``array`` raises.
    """
    _, data, aff, crs_text, nodata = _prepare("write_raster", array, nodata, affine, crs)
    p, c = os.fspath(path), _client_or_none(client)
    # Before any work, as process_geotiff: a file the array reads is never replaced.
    read = _read_paths(data)
    same = _on_a_worker(c, _first_same_file, read, p) if read else None
    if same is not None:
        raise ValueError(f"write_raster: path {p!r} is the input file {same!r}: write the "
                         "result to another path (the input is never replaced)")
    return _write(data, p, who="write_raster", nodata=nodata, affine=aff, crs=crs_text,
                  compress=compress, tiled=tiled, blocksize=blocksize, progress=progress,
                  client=c)


def _write(data: Any, path: str, *, who: str, nodata: Any, affine: tuple[float, ...],
           crs: str | None, compress: str | None, tiled: bool, blocksize: int, progress: bool,
           client: Any) -> RasterMetadata:
    if data.ndim == 2:
        data = data[np.newaxis]
    nodata = _file_nodata(who, nodata, np.dtype(data.dtype))
    client = _client_or_none(client)
    parts_dir = _new_parts_dir(path)
    # Made and removed where the tasks run: a task still running after a failure finds no
    # directory to write into.
    unknown = _on_a_worker(client, _make_parts_dir, parts_dir, path)
    lock_fd = None
    try:
        lock_fd = _hold_writer_lock(parts_dir)
        if unknown:
            warnings.warn(f"{who}: {len(unknown)} parts directories beside {path!r} were left "
                          "by writes of this path whose process cannot be checked from here "
                          "(another machine, or an older version of this package); remove them "
                          f"once no such write runs: {', '.join(unknown)}", RuntimeWarning,
                          stacklevel=3)
        target = _PartWriter(parts_dir, nodata, affine, crs)
        stored = da.store(data, cast(Any, target), lock=False, compute=False)
        merged = dask.delayed(_merge_parts, pure=False)(
            stored, parts_dir, path, data.chunks, np.dtype(data.dtype), nodata, affine, crs,
            compress, bool(tiled), int(blocksize))
        _on_a_worker(client, _probe_write, parts_dir, np.dtype(data.dtype), nodata, affine, crs,
                    compress, bool(tiled), int(blocksize))
        return _run_with_progress(merged, progress, client)
    except BaseException:
        _on_a_worker(client, shutil.rmtree, parts_dir, True)  # a failed job leaves no parts
        raise
    finally:
        # Only now that the parts directory is gone: a directory of a released lock is removed
        # by the next write of this path.
        if lock_fd is not None:
            os.close(lock_fd)


def process_geotiff(in_path: str | os.PathLike, out_path: str | os.PathLike, op: BandOp, *,
                    kind: str = "tiles", halo: int = 0, device: str = "auto",
                    per_band: bool | None = None, buffers_per_band: int = 2,
                    scratch_bytes: int = 0, chunks: Any = None, compress: str | None = "deflate",
                    tiled: bool = True, blocksize: int = 256, progress: bool = True,
                    client: Any = None) -> RasterMetadata:
    """The streaming job: read ``in_path`` in windows in parallel, apply ``op`` and write one
    GeoTIFF at ``out_path``; returns the output's metadata.

    ``kind="tiles"``: :func:`map_tiles` with ``halo`` (``per_band`` default False);
    ``kind="bands"``: :func:`map_bands`. ``chunks`` (default: planned for the workers'
    smallest budget and the file's tiles) as :func:`read_raster`; with ``kind="bands"`` only
    their band chunks count (each chunk holds whole bands). The output takes the op's
    dtype, band count and nodata and the input's size, affine and CRS (as
    :func:`vibespatial_raster.io.process_raster_streamed`); it is written as :func:`write_raster`
    writes, with Dask's progress bar unless ``progress=False``.

    Raises:
        ValueError: ``out_path`` is the input file (also through another name or a hard link:
        the input is never replaced), a bad ``kind`` or argument; TypeError / ValueError:
        ``chunks`` as :func:`read_raster` says; FileNotFoundError: the
        output's directory does not exist; both before any work. What :func:`read_raster`,
        :func:`map_tiles` / :func:`map_bands` and :func:`write_raster` raise.
    """
    if kind not in ("tiles", "bands"):
        raise ValueError(f"kind must be 'tiles' or 'bands', not {kind!r}")
    p_in, p_out = os.fspath(in_path), os.fspath(out_path)
    c = _client_or_none(client)
    # Before any work: the input is never replaced (not even by its own result), and a
    # mistyped output directory fails now, not after the whole job.
    if _on_a_worker(c, _same_file, p_in, p_out):
        raise ValueError(f"process_geotiff: out_path {p_out!r} is the input file {p_in!r}: "
                         "write the result to another path (the input is never replaced)")
    _on_a_worker(c, _check_out_dir, p_out)
    meta = _metadata(p_in, c)
    if chunks is not None:
        chunks = _dask_chunks("process_geotiff", chunks,
                              (meta.band_count, meta.height, meta.width), np.dtype(meta.dtype))
    if kind == "bands":
        if halo:
            raise ValueError("kind='bands' processes whole bands: no halo")
        band_plan = chunk_plan(meta, buffers_per_band=buffers_per_band,
                               scratch_bytes=scratch_bytes, client=client, per_band=True)
        if band_plan.plan.strategy is TilingStrategy.TILED:
            raise ValueError(f"process_geotiff: one whole band does not fit the smallest worker "
                             f"budget ({band_plan.budget} bytes); use kind='tiles'")
        bpc = max(band_plan.chunks[0] if chunks is None else chunks[0])
        chunks = (_split(meta.band_count, bpc, 0), (meta.height,), (meta.width,))
        per_band = True
    elif per_band is None:
        per_band = False
    arr = read_raster(p_in, chunks=chunks, buffers_per_band=buffers_per_band, halo=halo,
                      scratch_bytes=scratch_bytes, per_band=per_band, client=client)
    affine, crs = _affine6(meta.affine), _crs_text(meta.crs)
    result, info = _map(arr, op, who="process_geotiff", halo=halo if kind == "tiles" else 0,
                        each_band=kind == "bands", per_band=per_band,
                        chunks=None, nodata=meta.nodata, affine=affine, crs=crs, device=device,
                        buffers_per_band=buffers_per_band, scratch_bytes=scratch_bytes,
                        client=c)
    return _write(result, p_out, who="process_geotiff", nodata=info.nodata, affine=affine,
                  crs=crs, compress=compress, tiled=tiled, blocksize=blocksize,
                  progress=progress, client=c)
