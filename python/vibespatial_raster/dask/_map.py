# SPDX-License-Identifier: Apache-2.0
"""map_bands / map_tiles: a band op over the chunks of a Dask array or DataArray."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import dask.array as da
import numpy as np

from .._dtypes import raster_dtype
from ..buffers import TilingStrategy, _checked_nodata
from ._block import BandOp, _ChunkGrid, _infer_on_cluster, _ResultInfo, _run_block, _TaskSpec
from ._chunks import _dask_chunks, _int_arg, _split, chunk_plan, plan_chunks
from ._georef import _IDENTITY, _UNSET, _affine6, _check_dims, _crs_text, _georef_of, _is_dataarray
from ._placement import _check_device

def _as_dask(data: Any) -> Any:
    if isinstance(data, da.Array):
        return data
    return da.from_array(np.asarray(data), chunks=-1)


def _prepare(who: str, array: Any, nodata: Any, affine: Any,
             crs: Any) -> tuple[Any, Any, tuple, Any, Any]:
    """(source DataArray or None, dask array, affine, crs, nodata); the nodata checked for the
    array's dtype as :meth:`OwnedRasterArray.from_numpy` checks it, before any work."""
    if _is_dataarray(array):
        if array.ndim not in (2, 3):
            raise ValueError(f"a raster DataArray is (band, y, x) or (y, x), not {array.dims}")
        _check_dims(array)
        a_aff, a_crs, a_nodata = _georef_of(array, affine_needed=affine is None)
        data = _as_dask(array.data)
        src = array
        affine = a_aff if affine is None else affine
        crs = a_crs if crs is None else crs
        nodata = a_nodata if nodata is _UNSET else nodata
    else:
        if not hasattr(array, "shape") or not hasattr(array, "dtype"):
            raise TypeError(f"expected a Dask or NumPy array or an xarray DataArray, not "
                            f"{type(array).__name__}")
        data = _as_dask(array)
        src = None
        nodata = None if nodata is _UNSET else nodata
    if data.ndim not in (2, 3):
        raise ValueError(f"a raster array is (bands, height, width) or (height, width), not "
                         f"{data.ndim}D")
    _checked_nodata(who, nodata, raster_dtype(data.dtype))
    return src, data, _affine6(_IDENTITY if affine is None else affine), _crs_text(crs), nodata


def _wrap_result(src: Any, result: Any, info: _ResultInfo) -> Any:
    if src is None:
        return result
    import xarray as xr

    attrs = dict(src.attrs)
    for key in ("_FillValue", "nodata"):
        if key in attrs or key == "_FillValue":
            if info.nodata is None:
                attrs.pop(key, None)
            else:
                attrs[key] = info.nodata
    coords = src.coords
    if src.ndim == 3 and result.shape[0] != src.shape[0]:
        band_dim = src.dims[0]
        coords = {k: v for k, v in src.coords.items() if band_dim not in v.dims}
    return xr.DataArray(result, dims=src.dims, coords=coords, attrs=attrs, name=src.name)


def _map(data: Any, op: BandOp, *, who: str, halo: int, each_band: bool, per_band: bool,
         chunks: Any, nodata: Any,
         affine: tuple[float, ...], crs: str | None, device: str, buffers_per_band: int,
         scratch_bytes: int, client: Any) -> tuple[Any, _ResultInfo]:
    """``op`` over the chunks of the Dask array ``data`` (prepared by :func:`_prepare`)."""
    if not callable(op):
        raise TypeError(f"op must be callable, not {type(op).__name__}")
    device = _check_device(device)
    halo = _int_arg("halo", halo, 0)
    buffers = _int_arg("buffers_per_band", buffers_per_band, 1)
    scratch = _int_arg("scratch_bytes", scratch_bytes, 0)
    if isinstance(chunks, str) and chunks == "plan":
        chunks = plan_chunks(data, buffers_per_band=buffers, halo=halo, scratch_bytes=scratch,
                             client=client, per_band=per_band)
    elif chunks is not None:
        chunks = _dask_chunks(who, chunks, tuple(data.shape), np.dtype(data.dtype))
    if chunks is not None:
        data = data.rechunk(chunks)
    if halo:
        # map_overlap needs every chunk at least halo thick (an axis thinner than the halo
        # becomes one chunk, which has no neighbours to exchange with).
        fixed = list(data.chunks)
        for ax in (-2, -1):
            fixed[ax] = _split(sum(fixed[ax]), max(max(fixed[ax]), halo), halo) \
                if min(fixed[ax]) < halo else fixed[ax]
        if tuple(fixed) != data.chunks:
            data = data.rechunk(tuple(fixed))
    rows, cols = data.chunks[-2], data.chunks[-1]
    grid = _ChunkGrid.of(halo, rows, cols)
    spec = _TaskSpec(device, each_band, buffers, scratch, nodata, affine, crs, data.ndim == 2,
                     grid, who=who)
    in_bands = 1 if data.ndim == 2 else max(data.chunks[0])
    info = _infer_on_cluster(op, spec, in_bands, np.dtype(data.dtype), client)
    if data.ndim == 3 and info.bands != in_bands:
        if each_band or len(data.chunks[0]) != 1:
            raise ValueError(f"the op returns {info.bands} band(s) for {in_bands}: ops that "
                             "change the band count need map_tiles with every band in one "
                             "chunk (per_band=False)")
    elif data.ndim == 2 and info.bands != 1:
        raise ValueError(f"the op returns {info.bands} bands for a 2D (single-band) array")
    spec = replace(spec, out_bands=info.bands, out_dtype=info.dtype.name,
                   out_nodata=info.exact_nodata)

    band_chunks: tuple[tuple[int, ...], ...] = ()
    if data.ndim == 3:
        band_chunks = ((info.bands,),) if info.bands != in_bands else (data.chunks[0],)
    meta = np.empty((0,) * data.ndim, dtype=info.dtype)
    token = "vsr-bands" if each_band else "vsr-tiles"
    # Only axes of several chunks exchange a halo (Dask refuses a depth beyond the array).
    depth = {data.ndim - 2: halo if len(rows) > 1 else 0,
             data.ndim - 1: halo if len(cols) > 1 else 0}
    if any(depth.values()):
        if data.ndim == 3:
            depth[0] = 0
        result = da.map_overlap(_run_block, data, op=op, spec=spec, depth=depth,
                                boundary="none", trim=True,
                                chunks=band_chunks + grid.grown(),
                                dtype=info.dtype, meta=meta, token=token)
    else:
        result = da.map_blocks(_run_block, data, op=op, spec=spec,
                               chunks=band_chunks + (rows, cols), dtype=info.dtype, meta=meta,
                               token=token)
    return result, info


def map_bands(array: Any, op: BandOp, *, nodata: Any = _UNSET, affine: Any = None,
              crs: Any = None, device: str = "auto", buffers_per_band: int = 2,
              scratch_bytes: int = 0, bands_per_chunk: int | None = None,
              client: Any = None) -> Any:
    """Apply the band op ``op`` to every band of ``array``; a lazy array of the results.

    ``array``: a Dask (or NumPy) array (bands, height, width) or (height, width), or an xarray
    ``DataArray`` with those dims. Chunks hold whole bands: ``bands_per_chunk`` of them
    (default: the band batches :func:`plan_chunks` gives for the smallest worker budget, at
    least one chunk per worker thread). Each task runs ``op`` on each band of its chunk as a
    single-band raster with the chunk's nodata, affine and CRS, on the worker's GPU (bands
    moved there within its budget by ``dispatch_per_band_gpu``) or CPU (``dispatch_per_band_cpu``)
    as ``device`` says (see the module), and the results are stacked as those dispatchers stack
    them: with the input's nodata, affine and CRS. ``op`` must return a raster of its input's
    shape; it is called once at submission on a small block to learn the result's dtype,
    band count and nodata, which every chunk's result must then have (ValueError otherwise).

    ``nodata``, ``affine`` (rasterio order) and ``crs`` default to the DataArray's (attrs
    ``nodata`` / ``_FillValue``, ``transform``, ``crs`` or rioxarray's ``spatial_ref``; else
    the affine of its pixel-centre coordinates along its last two dims when those are named
    ``x`` / ``y``, ``lon`` / ``lat`` or ``longitude`` / ``latitude``, ValueError when they are
    not evenly spaced) and else to None, the identity and None. ``nodata`` is checked as
    :meth:`OwnedRasterArray.from_numpy` checks it: a number or None, never NaN for an integer
    dtype; an integer nodata the dtype cannot hold (256 or -1 for uint8) marks no pixel, as in
    the ops. A DataArray comes back as a DataArray with the same dims, coordinates and attrs
    (``_FillValue`` / ``nodata`` set to the result's nodata).

    Raises:
        ValueError: a bad ``device``, a NaN ``nodata`` for an integer dtype, spatial
        coordinates not evenly spaced (with no ``affine`` given or carried), a budget that
        cannot hold one whole band (use :func:`map_tiles`), an op returning another shape, or
        (when computed) a chunk result whose dtype, band count or nodata differ from the first
        result's; TypeError: a non-callable op, a non-raster dtype or a ``nodata`` that is not
        a number. The arguments are checked before the op runs.
    """
    src, data, aff, crs_text, nodata = _prepare("map_bands", array, nodata, affine, crs)
    if data.ndim == 3:
        if bands_per_chunk is None:
            cp = chunk_plan(data, buffers_per_band=buffers_per_band, scratch_bytes=scratch_bytes,
                            client=client, per_band=True)
            if cp.plan.strategy is TilingStrategy.TILED:
                raise ValueError(
                    f"map_bands: one whole {data.shape[1]} x {data.shape[2]} band does not fit "
                    f"the smallest worker budget ({cp.budget} bytes); use map_tiles")
            bands_per_chunk = max(cp.chunks[0])
        bpc = _int_arg("bands_per_chunk", bands_per_chunk, 1)
        chunks: Any = (_split(data.shape[0], bpc, 0), (data.shape[1],), (data.shape[2],))
    else:
        chunks = ((data.shape[0],), (data.shape[1],))
    result, info = _map(data, op, who="map_bands", halo=0, each_band=True, per_band=True,
                        chunks=chunks,
                        nodata=nodata,
                        affine=aff, crs=crs_text, device=device,
                        buffers_per_band=buffers_per_band, scratch_bytes=scratch_bytes,
                        client=client)
    return _wrap_result(src, result, info)


def map_tiles(array: Any, op: BandOp, *, halo: int = 0, nodata: Any = _UNSET,
              affine: Any = None, crs: Any = None, device: str = "auto", per_band: bool = False,
              buffers_per_band: int = 2, scratch_bytes: int = 0, chunks: Any = "plan",
              client: Any = None) -> Any:
    """Apply ``op`` to every chunk of ``array`` seen as a raster tile with ``halo`` pixels of
    its neighbours on each side; a lazy array of the results (halos trimmed).

    ``chunks``: "plan" (default) rechunks to :func:`plan_chunks` for ``halo``,
    ``buffers_per_band``, ``scratch_bytes`` and ``per_band`` (False: every band in each tile,
    for ops that combine bands; True: a band-independent op, so tiles may hold fewer bands);
    None keeps the array's chunks; or Dask chunks, in the forms :func:`read_raster` takes
    (TypeError / ValueError naming ``chunks`` for others). The halo comes from the
    neighbouring chunks through ``dask.array.map_overlap`` (``boundary="none"``: tiles at the
    raster's edges are clamped there, not padded), so with ``halo`` >= the op's radius the
    result equals the op on the whole raster; chunks thinner than the halo are first
    rechunked to at least its width (an axis thinner than the halo becomes one chunk). Each
    tile reaches ``op`` as a raster with all the chunk's bands, the affine shifted to the
    tile's origin, on the worker's GPU or CPU as ``device`` says. ``op`` returns a raster of
    the tile's height and width; it may change the dtype and, when every band is in one
    chunk, the band count.
    Georeferencing, DataArrays and errors as :func:`map_bands`.
    """
    src, data, aff, crs_text, nodata = _prepare("map_tiles", array, nodata, affine, crs)
    result, info = _map(data, op, who="map_tiles", halo=halo, each_band=False,
                        per_band=per_band, chunks=chunks,
                        nodata=nodata,
                        affine=aff, crs=crs_text, device=device,
                        buffers_per_band=buffers_per_band, scratch_bytes=scratch_bytes,
                        client=client)
    return _wrap_result(src, result, info)
