# SPDX-License-Identifier: Apache-2.0
"""dtype handling shared by the modules: anything ``numpy.dtype()`` accepts comes in."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["RASTER_DTYPES", "raster_dtype", "planning_dtype"]

#: The element types a raster can have (the C++ DType), by numpy name.
RASTER_DTYPES = (
    "uint8",
    "int8",
    "uint16",
    "int16",
    "uint32",
    "int32",
    "uint64",
    "int64",
    "float32",
    "float64",
)

_BY_ITEMSIZE = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}


def _np_dtype(dtype: Any) -> np.dtype:
    try:
        return np.dtype(dtype)
    except TypeError as e:
        raise TypeError(f"not a dtype: {dtype!r} ({e})") from None


def raster_dtype(dtype: Any) -> np.dtype:
    """The native-byte-order numpy dtype of a raster element type; TypeError for the others."""
    d = _np_dtype(dtype)
    if d.name not in RASTER_DTYPES:
        raise TypeError(
            f"unsupported raster dtype {d!s}: expected one of {', '.join(RASTER_DTYPES)}"
        )
    return d.newbyteorder("=")


def planning_dtype(dtype: Any) -> tuple[str, int]:
    """What the planner needs of a dtype: a C++ dtype of the same width and a multiplier.

    Planning depends on the element width only, so any fixed-size numpy dtype is accepted, as by
    the Python original (``np.dtype(dtype).itemsize``): a raster dtype plans as itself, others as
    the unsigned type of their width, and widths without one (complex128: 16 bytes) as uint8 with
    the width folded into the buffers per band, which gives the same byte counts and tiles.
    """
    d = _np_dtype(dtype)
    if d.hasobject or d.itemsize == 0:
        raise TypeError(f"cannot plan for dtype {d!s}: it has no fixed element size")
    if d.name in RASTER_DTYPES:
        return d.name, 1
    if d.itemsize in _BY_ITEMSIZE:
        return _BY_ITEMSIZE[d.itemsize], 1
    return "uint8", d.itemsize
