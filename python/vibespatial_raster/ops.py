# SPDX-License-Identifier: Apache-2.0
"""Band operations of the C++ library (Thrust/CUB): statistics, rescale, clip, nodata fill,
normalized difference, histograms and a 3x3 focal mean, for all ten raster dtypes.

An operation runs where its input lives: a host raster on the CPU (all cores; the GIL is
released), a device raster on the GPU when the library was built with CUDA
(:func:`ops_built_with_cuda`; otherwise such a call raises RuntimeError). Results have the
input's residency, shape, affine and CRS.

A pixel is valid unless it equals the raster's nodata or is NaN. Compute type: float32 for
integers of 16 bits or fewer and float32, float64 otherwise (:func:`compute_dtype`).

The elementwise operations and the focal mean take ``out=``: an existing raster of the result's
dtype, shape and residency to write into (reused across calls instead of allocating); the
elementwise ones may write in place (``out`` the input itself).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _core
from ._dtypes import raster_dtype
from .buffers import OwnedRasterArray

__all__ = [
    "BandStatistics",
    "band_statistics",
    "clip",
    "compute_dtype",
    "fill_nodata",
    "focal_mean_3x3",
    "histogram",
    "normalized_difference",
    "ops_built_with_cuda",
    "rescale",
]

_EDGES = ("nearest", "reflect", "constant_nodata")


@dataclass(frozen=True)
class BandStatistics:
    """Statistics of the valid pixels of one band; with none, count is 0 and the rest NaN.
    ``std`` is the population standard deviation (ddof = 0, numpy's default)."""

    count: int
    min: float
    max: float
    mean: float
    std: float


def _raster(name: str, r: Any) -> OwnedRasterArray:
    if not isinstance(r, OwnedRasterArray):
        raise TypeError(f"{name} must be an OwnedRasterArray, not {type(r).__name__}")
    return r


def _result(native: Any, like: OwnedRasterArray) -> OwnedRasterArray:
    return OwnedRasterArray._wrap(native, crs=like._crs_obj, two_d=like._two_d,
                                  device_id=like._device_id)


def _out(out: Any) -> Any:
    r = _raster("out", out)
    if r._native is None:
        raise ValueError("out must be a raster in the library's storage, not an array used in "
                         "place through from_device")
    return r._native


def ops_built_with_cuda() -> bool:
    """Whether device-resident rasters can be processed (the library was built with nvcc)."""
    return _core.ops_built_with_cuda()


def compute_dtype(dtype: Any) -> np.dtype:
    """The compute (and focal/normalized-difference output) dtype of a raster dtype."""
    return np.dtype(_core.compute_dtype(raster_dtype(dtype).name))


def band_statistics(raster: OwnedRasterArray) -> list[BandStatistics]:
    """Count, min, max, mean and population std of the valid pixels, one entry per band."""
    r = _raster("raster", raster)
    return [BandStatistics(int(c), mn, mx, mean, std)
            for c, mn, mx, mean, std in _core.band_statistics(r._as_native())]


def rescale(raster: OwnedRasterArray, in_min: float, in_max: float, out_min: float,
            out_max: float, dtype: Any = None, *,
            out: OwnedRasterArray | None = None) -> OwnedRasterArray:
    """Linear map of [in_min, in_max] onto [out_min, out_max], as ``dtype`` (default: the
    input's; with ``out``, out's). Integers are rounded half away from zero and saturated;
    values outside the input range are extrapolated. Invalid pixels get a nodata no valid
    output can take: NaN for a float output; for an integer output, a value outside the output
    range (the source's nodata when it is one, else the dtype's largest, else its smallest), or
    0 with no nodata when the source had none (NaN pixels of a float source).

    Raises:
        ValueError: a bound is not finite, in_min == in_max, ``out`` does not match, or an
        integer output range covers the whole dtype while the source has a nodata.
    """
    r = _raster("raster", raster)
    if out is not None:
        if dtype is not None and raster_dtype(dtype) != out.dtype:
            raise ValueError(f"rescale: dtype {np.dtype(dtype)} differs from out's {out.dtype}")
        _core.rescale_into(r._as_native(), in_min, in_max, out_min, out_max, _out(out))
        return out
    d = r.dtype if dtype is None else raster_dtype(dtype)
    return _result(_core.rescale(r._as_native(), in_min, in_max, out_min, out_max, d.name), r)


def clip(raster: OwnedRasterArray, lower: float, upper: float, *,
         out: OwnedRasterArray | None = None) -> OwnedRasterArray:
    """Clamp valid pixels to [lower, upper] (integers: bounds rounded inwards); nodata kept.

    Raises:
        ValueError: a NaN bound, or lower > upper.
    """
    r = _raster("raster", raster)
    if out is not None:
        _core.clip_into(r._as_native(), lower, upper, _out(out))
        return out
    return _result(_core.clip(r._as_native(), lower, upper), r)


def fill_nodata(raster: OwnedRasterArray, value: float, *,
                out: OwnedRasterArray | None = None) -> OwnedRasterArray:
    """Replace invalid pixels (nodata or NaN) with ``value``; the result has no nodata.

    Raises:
        ValueError: ``value`` is not exactly representable in the dtype (or is NaN).
    """
    r = _raster("raster", raster)
    if out is not None:
        _core.fill_nodata_into(r._as_native(), value, _out(out))
        return out
    return _result(_core.fill_nodata(r._as_native(), value), r)


def normalized_difference(a: OwnedRasterArray, b: OwnedRasterArray, *,
                          out: OwnedRasterArray | None = None) -> OwnedRasterArray:
    """(a - b) / (a + b) band by band in the compute dtype; NaN where either input is invalid
    or a + b == 0; the result's nodata is NaN. Metadata comes from ``a``.

    Raises:
        ValueError: a and b differ in dtype, band count, shape or residency.
    """
    ra = _raster("a", a)
    rb = _raster("b", b)
    if out is not None:
        _core.normalized_difference_into(ra._as_native(), rb._as_native(), _out(out))
        return out
    return _result(_core.normalized_difference(ra._as_native(), rb._as_native()), ra)


def histogram(raster: OwnedRasterArray, bins: int, lower: float, upper: float) -> np.ndarray:
    """Per-band histogram of the valid pixels over ``bins`` equal bins on [lower, upper]:
    half-open bins except the last, which includes ``upper`` (numpy's rule). Returns an int64
    array of shape (bands, bins).

    Raises:
        ValueError: bins < 1, a bound is not finite, lower >= upper.
    """
    r = _raster("raster", raster)
    return np.asarray(_core.histogram(r._as_native(), bins, lower, upper))


def focal_mean_3x3(raster: OwnedRasterArray, edge: str = "nearest", *,
                   out: OwnedRasterArray | None = None) -> OwnedRasterArray:
    """Mean of the valid pixels of each 3x3 window in the compute dtype; NaN where the centre is
    invalid or no neighbour is; the result's nodata is NaN. ``edge``: "nearest", "reflect" or
    "constant_nodata" (the window is truncated at the raster's edge). Bands are independent.
    With ``dispatch_tiled_halo`` and halo >= 1 the result equals the whole-raster result.

    Raises:
        ValueError: an unknown edge mode; ``out`` overlapping the input or not matching.
    """
    r = _raster("raster", raster)
    if edge not in _EDGES:
        raise ValueError(f"edge must be one of {', '.join(_EDGES)}, not {edge!r}")
    if out is not None:
        _core.focal_mean_3x3_into(r._as_native(), edge, _out(out))
        return out
    return _result(_core.focal_mean_3x3(r._as_native(), edge), r)
