# SPDX-License-Identifier: Apache-2.0
"""The georeferencing of arrays and DataArrays: affine, CRS and nodata, given or carried."""

from __future__ import annotations

from typing import Any

import numpy as np

_UNSET: Any = object()
_IDENTITY = (1.0, 0.0, 0.0, 0.0, -1.0, 0.0)

def _is_dataarray(obj: Any) -> bool:
    xr = _xarray_if_imported()
    return xr is not None and isinstance(obj, xr.DataArray)


def _xarray_if_imported() -> Any:
    import sys

    return sys.modules.get("xarray")


_X_DIMS = ("x", "lon", "longitude")
_Y_DIMS = ("y", "lat", "latitude")


def _check_dims(array: Any) -> None:
    """A DataArray's spatial dims (named x / y, lon / lat or longitude / latitude) must be its
    last two, y then x: (band, y, x) or (y, x). Any other order would be read silently as
    other bands, rows and columns."""
    dims = tuple(str(d) for d in array.dims)
    xs = [k for k, d in enumerate(dims) if d.lower() in _X_DIMS]
    ys = [k for k, d in enumerate(dims) if d.lower() in _Y_DIMS]
    n = len(dims)
    if (xs and xs != [n - 1]) or (ys and ys != [n - 2]):
        raise ValueError(f"a raster DataArray is (band, y, x) or (y, x), not {dims}: "
                         f"transpose it first (array.transpose(..., 'y', 'x'))")


def _affine6(value: Any) -> tuple[float, float, float, float, float, float]:
    if all(hasattr(value, k) for k in "abcdef"):
        vals = [value.a, value.b, value.c, value.d, value.e, value.f]
    else:
        vals = [float(v) for v in value]
    if len(vals) == 9:
        vals = vals[:6]
    if len(vals) != 6:
        raise ValueError(f"affine must have 6 numbers (a, b, c, d, e, f), not {len(vals)}")
    return tuple(float(v) for v in vals)  # type: ignore[return-value]


def _regular_axis(values: Any, name: str) -> tuple[float, float]:
    """(first pixel centre, spacing) of a coordinate of pixel centres; ValueError unless it is
    numeric and evenly spaced (to a thousandth of a pixel, plus the rounding of its dtype)."""
    try:
        v = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"the DataArray's {name!r} coordinate is not numeric "
                         f"({np.asarray(values).dtype}): no affine maps it; pass affine= or "
                         "set attrs['transform']") from None
    step = (v[-1] - v[0]) / (v.size - 1)
    raw = np.asarray(values)
    rounding = 4 * float(np.finfo(raw.dtype).eps) * float(np.nanmax(np.abs(v))) \
        if raw.dtype.kind == "f" else 0.0
    off = np.abs(v - (v[0] + step * np.arange(v.size)))
    if not (np.isfinite(step) and step != 0 and np.all(off <= 1e-3 * abs(step) + rounding)):
        raise ValueError(f"the DataArray's {name!r} coordinates are not evenly spaced pixel "
                         f"centres (spacing {float(np.diff(v).min())!r} to "
                         f"{float(np.diff(v).max())!r}): no "
                         "affine maps them; pass affine= or set attrs['transform']")
    return float(v[0]), float(step)


def _coords_affine(x: Any) -> tuple[float, ...] | None:
    """The affine of a DataArray's 1D coordinates along its last two dims when they are named
    x / y, lon / lat or longitude / latitude (any case), as pixel centres; None when either
    has no coordinate or fewer than two pixels. ValueError when they are not evenly spaced
    (the identity would put the pixels elsewhere without a word)."""
    if x.ndim < 2:
        return None
    ydim, xdim = x.dims[-2], x.dims[-1]
    if str(xdim).lower() not in _X_DIMS or str(ydim).lower() not in _Y_DIMS:
        return None
    if xdim not in x.coords or ydim not in x.coords or x.sizes[xdim] < 2 or \
            x.sizes[ydim] < 2:
        return None
    x0, dx = _regular_axis(x.coords[xdim].values, str(xdim))
    y0, dy = _regular_axis(x.coords[ydim].values, str(ydim))
    return (dx, 0.0, x0 - dx / 2, 0.0, dy, y0 - dy / 2)


def _georef_of(x: Any, *, affine_needed: bool = True
               ) -> tuple[tuple[float, ...] | None, Any, Any]:
    """(affine, crs, nodata) a DataArray carries, as rioxarray and read_raster leave them:
    attrs ``transform`` / ``crs`` / ``nodata`` / ``_FillValue``, or the ``spatial_ref``
    coordinate's ``GeoTransform`` / ``crs_wkt``, or regular ``x`` / ``y`` (``lon`` / ``lat``,
    ``longitude`` / ``latitude``) coordinates (:func:`_coords_affine`; not read unless
    ``affine_needed``)."""
    attrs = dict(x.attrs)
    affine: tuple[float, ...] | None = None
    crs: Any = attrs.get("crs")
    ref = x.coords.get("spatial_ref")
    ref_attrs = dict(ref.attrs) if ref is not None else {}
    if "transform" in attrs:
        affine = _affine6(attrs["transform"])
    elif "GeoTransform" in ref_attrs:
        g = [float(v) for v in str(ref_attrs["GeoTransform"]).split()]
        affine = (g[1], g[2], g[0], g[4], g[5], g[3])
    elif affine_needed:
        affine = _coords_affine(x)
    if crs is None:
        crs = ref_attrs.get("crs_wkt") or ref_attrs.get("spatial_ref")
    if crs is None:
        rio = getattr(x, "rio", None)
        crs = getattr(rio, "crs", None) if rio is not None else None
    nodata = _UNSET
    for key in ("nodata", "_FillValue"):
        if key in attrs:
            nodata = attrs[key]
            break
    else:
        if "_FillValue" in x.encoding:
            nodata = x.encoding["_FillValue"]
    if nodata is not _UNSET and nodata is not None:
        nodata = float(nodata) if isinstance(nodata, (float, np.floating)) else nodata
    return affine, crs, (None if nodata is _UNSET else nodata)


def _crs_text(crs: Any) -> str | None:
    if crs is None:
        return None
    if isinstance(crs, str):
        return crs or None
    to_wkt = getattr(crs, "to_wkt", None)
    return str(to_wkt()) if callable(to_wkt) else str(crs)
