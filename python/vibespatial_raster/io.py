# SPDX-License-Identifier: Apache-2.0
"""Raster files through GDAL (when the library was built with it; :func:`io_available`).

- :func:`read_raster_metadata`: the header only, for planning before any pixel is read.
- :func:`read_raster`: a window and a band subset into a host raster.
- :func:`write_raster`: a raster to a file (GeoTIFF by default).
- :func:`process_raster_streamed`: read, process and write a file tile by tile following a
  plan (with halo), with only one tile in memory; the output takes the op's dtype.

Paths are str, bytes or os.PathLike; one holding a NUL byte raises ValueError (GDAL would
stop the path there and read or replace another file). GDAL's geotransform is converted to the
rasterio-order affine; the CRS comes back as WKT. In a build without GDAL every call raises
RuntimeError ("built without GDAL").
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from . import _core
from ._ints import integer
from .buffers import OwnedRasterArray, RasterMetadata, RasterPlan, RasterWindow
from .dispatch import BandOp, _adapter, _check_raster

__all__ = [
    "io_available",
    "process_raster_streamed",
    "read_raster",
    "read_raster_metadata",
    "write_raster",
]


def io_available() -> bool:
    """Whether this build reads and writes files through GDAL."""
    return _core.io_available()


def _path(p: Any) -> str:
    """``p`` (a str, bytes or os.PathLike) as a str; ValueError for a NUL byte, which GDAL would
    take as the end of the path (another file would be read, or replaced)."""
    try:
        s = os.fsdecode(os.fspath(p))
    except TypeError:
        raise TypeError(f"expected a path, not {type(p).__name__}") from None
    if "\0" in s:
        raise ValueError(f"embedded null byte in path {s!r}")
    return s


_INT64_MAX = 2**63 - 1
_INT_MAX = 2**31 - 1


def _window(window: Any) -> tuple[int, int, int, int] | None:
    if window is None:
        return None
    if isinstance(window, RasterWindow):
        values = [window.col_off, window.row_off, window.width, window.height]
    elif isinstance(window, (str, bytes)):
        raise TypeError(f"window must be (col_off, row_off, width, height), not {window!r}")
    else:
        try:
            values = list(window)
        except TypeError:
            raise TypeError("window must be (col_off, row_off, width, height), not "
                            f"{window!r}") from None
    if len(values) != 4:
        raise ValueError("window must be (col_off, row_off, width, height)")
    w = tuple(integer("window", v) for v in values)
    if any(abs(v) > _INT64_MAX for v in w):
        raise ValueError(f"window {w} is not inside any raster: values beyond 64 bits")
    return w  # type: ignore[return-value]


def _bands(bands: Any) -> list[int]:
    if bands is None:
        return []
    if isinstance(bands, (str, bytes)) or not hasattr(bands, "__iter__"):
        raise TypeError(f"bands must be a sequence of 1-based band numbers, not {bands!r}")
    out = [integer("bands", b) for b in bands]
    if not out:
        raise ValueError("bands is empty: give None for all bands, or band numbers from 1")
    for b in out:
        if not 1 <= b <= _INT_MAX:
            raise ValueError(f"band index {b} is outside [1, band count]")
    return out


def _compress(compress: str | None) -> str:
    return "NONE" if compress is None else str(compress).upper()


def _block(blockxsize: int, blockysize: int) -> int:
    blockxsize = integer("blockxsize", blockxsize)
    blockysize = integer("blockysize", blockysize)
    if blockxsize != blockysize:
        raise ValueError(f"blockxsize and blockysize must be equal (GTiff tiles are square "
                         f"here), not {blockxsize} and {blockysize}")
    return blockxsize


def read_raster_metadata(path: str | os.PathLike, *, allow_virtual: bool = False
                         ) -> RasterMetadata:
    """The header of the raster file at ``path``: shape, band count, dtype, nodata (band 1's),
    affine, CRS (WKT) and driver.

    Only raster file formats whose pixels come from the named file alone open by default;
    ``allow_virtual=True`` also accepts VRTs (which read the files they name), GDAL's virtual
    file systems (``/vsi...``) and URLs. Give it only for inputs you trust.

    Raises:
        FileNotFoundError (an OSError): the file does not exist (PermissionError: it cannot be
            read); ValueError: the file is not a raster this call opens, a FIFO or device, a
            path with a NUL byte; RuntimeError: an unsupported data type, bands of differing
            types or nodata, or a build without GDAL.
    """
    return RasterMetadata._from_core(_core.read_raster_metadata(_path(path), bool(allow_virtual)))


def read_raster(path: str | os.PathLike, *, window: RasterWindow | Sequence[int] | None = None,
                bands: Sequence[int] | None = None, allow_virtual: bool = False
                ) -> OwnedRasterArray:
    """Read ``window`` (default: all; a RasterWindow or (col_off, row_off, width, height)) of
    the 1-based ``bands`` (default: all) into a new host raster; its affine is shifted to the
    window's origin. ``allow_virtual`` as :func:`read_raster_metadata`. Window values and
    band numbers are integers (Python or NumPy); ``bands`` may be any iterable of them.

    Raises:
        FileNotFoundError (an OSError): the file does not exist; ValueError: a file that is not
            a raster this call opens, a window outside the raster or empty, a band
        outside [1, band count], an empty ``bands``, a path with a NUL byte; TypeError: a
        window value or band that is not an integer (a float, bool or string);
        RuntimeError as :func:`read_raster_metadata`.
    """
    w = _window(window)
    native = _core.read_raster(_path(path), w, _bands(bands), bool(allow_virtual))
    return OwnedRasterArray._wrap(native)


def write_raster(path: str | os.PathLike, raster: OwnedRasterArray, *, driver: str = "GTiff",
                 compress: str | None = "deflate", tiled: bool = True, blockxsize: int = 256,
                 blockysize: int = 256) -> None:
    """Write ``raster`` (a device raster is copied, not moved) to ``path``, replacing any file:
    its dtype, every band, affine, CRS and nodata.

    Raises:
        ValueError: an unknown driver, a CRS GDAL does not understand, or options the driver
        refuses (an unknown ``compress``, a tiled GeoTIFF's block side that is not a positive
        multiple of 16), before anything is written; TypeError: a block side that is not an
        integer (a float, bool or string); RuntimeError: GDAL cannot create or write the file.
    """
    _check_raster(raster)
    _core.write_raster(_path(path), raster._as_native(), str(driver), _compress(compress),
                       bool(tiled), _block(blockxsize, blockysize))


def process_raster_streamed(in_path: str | os.PathLike, out_path: str | os.PathLike,
                            op_fn: BandOp, plan: RasterPlan, *, halo: int | None = None,
                            compress: str | None = "deflate", tiled: bool = True,
                            blockxsize: int = 256, blockysize: int = 256, driver: str = "GTiff",
                            progress: Callable[[int, int], Any] | None = None,
                            allow_virtual: bool = False) -> None:
    """Process the file ``in_path`` tile by tile following ``plan`` and write ``out_path``.

    Each tile is read with ``halo`` (default: ``plan.halo``) extra pixels per side, clamped at
    the raster's edges, and handed to ``op_fn`` as a host raster; its interior is written. The
    output takes the first tile result's dtype, band count and nodata (ops may change the dtype:
    unlike the Python original, nothing is cast back to the source dtype) and the input's shape,
    affine and CRS. Only one tile is live at a time. ``progress(done, total)`` is called after
    each tile. ``allow_virtual`` as :func:`read_raster_metadata`, for the input. The output is
    all or nothing: written beside ``out_path`` and renamed over it only when complete.

    Raises:
        TypeError: a halo or block side that is not an integer (a float, bool or string);
        ValueError: a negative halo, a tiled plan without a tile shape, a tile result of the
        wrong shape or of a dtype, band count or nodata differing from the first tile's;
        whatever :func:`read_raster` / :func:`write_raster` or ``op_fn`` raise.
    """
    if not isinstance(plan, RasterPlan):
        raise TypeError(f"plan must be a RasterPlan, not {type(plan).__name__}")
    if halo is not None:
        h = integer("halo", halo)
        if abs(h) > _INT64_MAX:
            raise ValueError(f"halo {h} is beyond 64 bits")
        plan = replace(plan, halo=h)
    if progress is not None and not callable(progress):
        raise TypeError("progress must be callable")
    _core.process_raster_streamed(_path(in_path), _path(out_path),
                                  _adapter(op_fn, crs=None, two_d=False), *plan._core_args(),
                                  str(driver), _compress(compress), bool(tiled),
                                  _block(blockxsize, blockysize), progress, bool(allow_virtual))
