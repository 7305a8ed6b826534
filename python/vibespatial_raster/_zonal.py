# SPDX-License-Identifier: Apache-2.0
"""Zonal statistics (:func:`vibespatial_raster.ops.zonal_stats`): per zone and band, the
statistics of the pixels inside, in one pass over the raster's tiles (docs/zonal-statistics.md).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import numpy as np

from . import _core
from .buffers import OwnedRasterArray

ZonalInputError = _core.ZonalInputError

DEFAULT_STATS = ("count", "sum", "mean", "min", "max")


class ZonalResult(dict):
    """The table of :func:`zonal_stats`: a dict of NumPy columns of one row per zone and band,
    ``"zone"`` (int64, float64 or object of str), ``"band"`` (int32, 1-based), then one float64
    column per statistic in the order asked (NaN is null: a zone with no valid pixel has count,
    cell_count and variety 0 and NaN elsewhere); ``"frac"`` is an object column of dicts
    ``{value: share of count}``."""

    def to_pandas(self) -> Any:
        """The table as a pandas DataFrame (needs pandas)."""
        import pandas as pd

        return pd.DataFrame({k: v for k, v in self.items()})

    @property
    def rows(self) -> int:
        """Rows (zones x bands)."""
        return len(self["band"])


def _columns(native: tuple) -> ZonalResult:
    kind, zone, bands, names, values, frac = native
    out = ZonalResult()
    if kind == "str":
        out["zone"] = np.array(zone, dtype=object)
    else:
        out["zone"] = np.frombuffer(zone, dtype=kind).copy()
    out["band"] = np.frombuffer(bands, dtype=np.int32).copy()
    for name, col in zip(names, values):
        if name == "frac":
            column = np.empty(len(frac), dtype=object)
            for i, row in enumerate(frac):
                column[i] = {v: share for v, share in row}
            out[name] = column
        else:
            out[name] = np.frombuffer(col, dtype=np.float64).copy()
    return out


def _stats(stats: Any) -> list[str]:
    if isinstance(stats, str):
        stats = [s.strip() for s in stats.split(",")]
    names = [str(s) for s in stats]
    return names


def _wkb(zones: Any) -> list[bytes]:
    try:
        items = list(zones)
    except TypeError:
        items = [zones]
    out: list[bytes] = []
    shapely = None
    for g in items:
        if isinstance(g, (bytes, bytearray, memoryview)):
            out.append(bytes(g))
            continue
        if shapely is None:
            try:
                import shapely as shapely_module
            except ImportError:
                raise TypeError("zones must be a path, WKB bytes, shapely geometries or a zone "
                                f"raster, not {type(g).__name__}") from None
            shapely = shapely_module
        if not isinstance(g, shapely.Geometry):
            raise TypeError("zones must be a path, WKB bytes, shapely geometries or a zone "
                            f"raster, not {type(g).__name__}")
        out.append(shapely.to_wkb(g))
    return out


def _ids(ids: Any, n: int) -> tuple[str | None, Any]:
    if ids is None:
        return None, None
    arr = np.asarray(ids)
    if len(arr) != n:
        raise ValueError(f"ids has {len(arr)} entries for {n} zones")
    if arr.dtype.kind in "iub":
        return "int64", [int(v) for v in arr]
    if arr.dtype.kind == "f":
        return "float64", [float(v) for v in arr]
    return "str", [str(v) for v in arr]


def _path(p: Any) -> str | None:
    if isinstance(p, (str, os.PathLike)):
        return os.fspath(p)
    return None


def zonal_stats(raster: Any, zones: Any, *, stats: str | Sequence[str] = DEFAULT_STATS,
                pixels: str = "fractional", quantile: float = 0.9,
                bands: Sequence[int] | None = None, weights: Any = None,
                layer: str | None = None, zone_field: str | None = None, ids: Any = None,
                memory_budget: int = 0, tile_shape: tuple[int, int] | None = None,
                progress: Callable[[int, int], Any] | None = None,
                allow_virtual: bool = False, threads: int = 0) -> ZonalResult:
    """Zonal statistics of ``raster`` over ``zones``, one row per zone and band.

    ``raster``: a raster file path, or a host :class:`OwnedRasterArray` (its affine places it).
    ``zones``: a vector file path (GeoPackage, GeoJSON, Shapefile; ``layer``, ``zone_field``;
    features in another CRS are transformed to the raster's), a zone raster (a path of a raster
    file, or an :class:`OwnedRasterArray`; one integer band on the raster's grid), or a sequence
    of shapely geometries or WKB bytes in the raster's CRS (``ids`` names them; default 0, 1,
    ...). ``stats``: names of :func:`zonal_stat_names`, a list or a comma-separated string.
    ``pixels``: ``"fractional"`` (exact coverage fractions, as exactextract), ``"center"`` or
    ``"all-touched"`` (as GDAL rasterize). ``weights``: a one-band raster on the same grid (a
    path with a path raster, an OwnedRasterArray with an in-memory one) for weighted_mean and
    weighted_sum. ``bands``: 1-based bands (default all). ``memory_budget``: host bytes of the
    tiles read at once (0: 256 MiB); ``tile_shape`` forces a tiling. ``progress(done, total)``
    is called after each tile. ``threads``: threads reducing a tile's zones (0: every CPU; results
    do not depend on it). The GIL is released while it runs.

    Raises ZonalInputError (a ValueError) for bad zones or options, FileNotFoundError for a
    missing file.
    """
    names = _stats(stats)
    band_list = [int(b) for b in (bands or [])]
    tile = None if tile_shape is None else (int(tile_shape[0]), int(tile_shape[1]))
    common: dict[str, Any] = dict(pixels=pixels, stats=names, quantile=float(quantile),
                                  bands=band_list, memory_budget=int(memory_budget),
                                  tile_shape=tile, progress=progress, threads=int(threads))
    raster_path = _path(raster)
    if raster_path is not None:
        weights_path = "" if weights is None else _path(weights)
        if weights_path is None:
            raise TypeError("with a raster path, weights must be a path too")
        zones_path = _path(zones)
        if zones_path is not None:
            return _columns(_core.zonal_stats_file(
                raster_path, zones_path, layer or "", zone_field or "", weights_path,
                allow_virtual=allow_virtual, **common))
        wkb = _wkb(zones)
        kind, id_list = _ids(ids, len(wkb))
        return _columns(_core.zonal_stats_file_wkb(raster_path, wkb, kind, id_list, weights_path,
                                                   allow_virtual=allow_virtual, **common))
    if not isinstance(raster, OwnedRasterArray):
        raise TypeError("raster must be a path or an OwnedRasterArray, not "
                        f"{type(raster).__name__}")
    w = None
    if weights is not None:
        if not isinstance(weights, OwnedRasterArray):
            raise TypeError("with an in-memory raster, weights must be an OwnedRasterArray")
        w = weights._as_native()
    if isinstance(zones, OwnedRasterArray):
        return _columns(_core.zonal_stats_raster(raster._as_native(), None, None, None,
                                                 zones._as_native(), w, **common))
    if _path(zones) is not None:
        raise TypeError("with an in-memory raster, zones must be geometries, WKB or a zone "
                        "raster (OwnedRasterArray)")
    wkb = _wkb(zones)
    kind, id_list = _ids(ids, len(wkb))
    return _columns(_core.zonal_stats_raster(raster._as_native(), wkb, kind, id_list, None, w,
                                             **common))


def zonal_stat_names() -> list[str]:
    """The statistics :func:`zonal_stats` computes."""
    return list(_core.zonal_stat_names())
