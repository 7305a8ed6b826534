# SPDX-License-Identifier: Apache-2.0
"""map_pipeline: an ops.Pipeline over the chunks of one or more Dask arrays, one chain per
chunk, each chunk read once with the chain's total halo (docs/dask.md)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import dask.array as da
import numpy as np

from .. import _core
from ..buffers import OwnedRasterArray, RasterMetadata, Residency
from ..ops import Pipeline
from ._block import (_checked_result, _ChunkGrid, _on_cluster, _ResultInfo, _sample_fill,
                     _sample_side)
from ._chunks import _dask_chunks, _int_arg, _split, plan_chunks
from ._georef import _UNSET
from ._map import _prepare, _wrap_result
from ._placement import _check_device, _resolve_device


@dataclass(frozen=True)
class _PipelineSpec:
    pipeline: Pipeline
    names: tuple[str, ...]
    nodata: tuple[Any, ...]  # per input
    affine: tuple[float, ...]
    crs: str | None
    device: str
    grid: _ChunkGrid
    out_bands: int | None = None
    out_dtype: str | None = None
    out_nodata: Any = None
    who: str = "map_pipeline"


def _run_chain(blocks: list[np.ndarray], spec: _PipelineSpec, row0: int, col0: int) -> Any:
    """The chain on one window: every input's block (bands, h, w) whose top-left pixel is
    (row0, col0) of the raster, as rasters of their own nodata."""
    device = _resolve_device(spec.device)
    affine = _core.affine_shifted(spec.affine, col0, row0)
    rasters = {}
    for name, block, nodata in zip(spec.names, blocks, spec.nodata):
        r = OwnedRasterArray.from_numpy(np.ascontiguousarray(block), nodata=nodata,
                                        affine=affine, crs=spec.crs)
        if device == "gpu":
            r.move_to(Residency.DEVICE)
        rasters[name] = r
    return spec.pipeline.run(**rasters)


def _run_pipeline_block(*blocks: np.ndarray, spec: _PipelineSpec,
                        block_info: dict | None = None) -> np.ndarray:
    """The task: every input's block (with the halo on the sides that have neighbours)."""
    assert block_info is not None
    loc = block_info[0]["chunk-location"]
    row0, col0 = spec.grid.block_origin(loc, *blocks)
    out = _run_chain(list(blocks), spec, row0, col0)
    _checked_result(out, spec, (col0, row0, int(blocks[0].shape[-1]), int(blocks[0].shape[-2])),
                    f"chunk {tuple(loc)} (pixels from row {row0}, column {col0})")
    return np.asarray(out.to_numpy()).reshape(out.band_count, out.height, out.width)


def _sample(nodata: Any, dtype: np.dtype, bands: int, side: int) -> np.ndarray:
    return np.full((bands, side, side), _sample_fill(nodata, dtype), dtype=dtype)


def _infer_chain(spec: _PipelineSpec, bands: tuple[int, ...],
                 dtypes: tuple[np.dtype, ...]) -> tuple[np.dtype, int, Any, Any]:
    """(dtype, bands, nodata as the raster shows it, nodata as the runtime holds it) of the
    chain's result on a small window of every input."""
    side = _sample_side(spec.grid.halo)
    blocks = [_sample(nd, dt, b, side) for nd, dt, b in zip(spec.nodata, dtypes, bands)]
    out = _run_chain(blocks, spec, 0, 0)
    rule = _checked_result(out, spec, (0, 0, side, side),
                           "the sample window (pixels of nodata, run once at submission)")
    return np.dtype(rule.dtype), int(rule.band_count), out.nodata, rule.nodata


def map_pipeline(pipeline: Pipeline, array: Any = None, *, nodata: Any = _UNSET,
                 affine: Any = None, crs: Any = None, device: str = "auto",
                 chunks: Any = "plan", buffers_per_band: int = 2,
                 client: Any = None, **inputs: Any) -> Any:
    """Run ``pipeline`` (an :class:`~vibespatial_raster.ops.Pipeline`) on every chunk of its
    inputs: one task per chunk runs the whole chain on the chunk read once with the chain's
    total halo (:attr:`Pipeline.halo`, the sum of its steps') from the neighbouring chunks, and
    keeps the chunk's own pixels; a lazy array of the results, equal bit for bit to
    ``pipeline.run(...)`` on the whole rasters.

    The inputs: ``array`` for a pipeline of one input, or each by its name in the pipeline
    (``map_pipeline(chain, A=scene, B=dem)``): Dask or NumPy arrays (bands, height, width) or
    (height, width), or xarray DataArrays, of one height and width and the band counts the
    pipeline was built for. ``nodata``: one value for every input, or a dict by input name
    (default: each DataArray's own, else None); ``affine`` (rasterio order) and ``crs``: the
    first input's DataArray's by default, else the identity and None.

    ``chunks``: "plan" (default) plans the spatial chunks with :func:`plan_chunks` for the
    chain's halo and all the inputs' bands together (``buffers_per_band``: default 2, a step's
    input and output, what the chain keeps live per band); None keeps the first input's
    spatial chunks; or Dask chunks (height, width) or (bands, height, width). Every input is
    rechunked to the same spatial chunks, all its bands in one chunk (a chain may combine
    bands); chunks thinner than the halo are widened as in :func:`map_tiles`. ``device`` as in
    :func:`map_tiles`. The result (bands, height, width), or (height, width) when the first
    input is 2D and the chain returns one band; a DataArray first input gives a DataArray.

    Raises:
        TypeError: ``pipeline`` is not a Pipeline; ValueError: inputs missing or not the
        pipeline's, band counts other than the pipeline's, inputs of different heights or
        widths, a bad ``device`` or ``chunks``, or the chain's own error on the first (sample)
        window, naming the step.
    """
    if not isinstance(pipeline, Pipeline):
        raise TypeError(f"map_pipeline needs an ops.Pipeline, not {type(pipeline).__name__}")
    names = pipeline.inputs
    if array is not None:
        if inputs:
            raise ValueError("give the inputs either as one array or by name, not both")
        if len(names) != 1:
            raise ValueError(f"the pipeline has the inputs {', '.join(names)}: give each by "
                             "name (map_pipeline(chain, A=..., B=...))")
        inputs = {names[0]: array}
    missing = [n for n in names if n not in inputs]
    extra = [n for n in inputs if n not in names]
    if missing or extra:
        raise ValueError(f"map_pipeline needs exactly the inputs {', '.join(names)}"
                         + (f"; missing {', '.join(missing)}" if missing else "")
                         + (f"; not inputs: {', '.join(extra)}" if extra else ""))
    device = _check_device(device)
    if isinstance(nodata, dict):
        unknown = [n for n in nodata if n not in names]
        if unknown:
            raise ValueError(f"nodata names inputs the pipeline lacks: {', '.join(unknown)}")
    prepared = []
    for k, name in enumerate(names):
        nd = nodata.get(name, _UNSET) if isinstance(nodata, dict) else nodata
        src, data, aff, crs_text, nd = _prepare("map_pipeline", inputs[name], nd,
                                                affine if k == 0 else None,
                                                crs if k == 0 else None)
        prepared.append((src, data, aff, crs_text, nd))
    src0, first, aff0, crs0, _ = prepared[0]
    two_d = first.ndim == 2
    datas: list[Any] = []
    expected = pipeline.input_bands
    for name, (_, data, _, _, _) in zip(names, prepared):
        if data.ndim == 2:
            data = data[np.newaxis]
        if data.shape[0] != expected[name]:
            raise ValueError(f"input {name} has {data.shape[0]} band(s), the pipeline was "
                             f"built for {expected[name]}")
        if datas and data.shape[1:] != datas[0].shape[1:]:
            raise ValueError(f"input {name} is {data.shape[1]} x {data.shape[2]}, input "
                             f"{names[0]} {datas[0].shape[1]} x {datas[0].shape[2]}")
        datas.append(data)
    halo = pipeline.halo
    height, width = datas[0].shape[1:]
    if isinstance(chunks, str) and chunks == "plan":
        buffers = _int_arg("buffers_per_band", buffers_per_band, 1)
        widest = max((np.dtype(d.dtype) for d in datas), key=lambda t: t.itemsize)
        total = sum(d.shape[0] for d in datas)
        meta_in = RasterMetadata(height, width, total, widest, None, aff0, None)
        planned = plan_chunks(meta_in, buffers_per_band=buffers, halo=halo, client=client,
                              per_band=False)
        rows, cols = planned[-2], planned[-1]
    elif chunks is None:
        rows, cols = datas[0].chunks[-2], datas[0].chunks[-1]
    else:
        shape = tuple(datas[0].shape) if np.ndim(chunks) == 0 or len(chunks) == 3 \
            else (height, width)
        c = _dask_chunks("map_pipeline", chunks, shape, np.dtype(datas[0].dtype))
        rows, cols = c[-2], c[-1]
    rows, cols = tuple(rows), tuple(cols)
    if halo:
        if min(rows) < halo:
            rows = _split(height, max(max(rows), halo), halo)
        if min(cols) < halo:
            cols = _split(width, max(max(cols), halo), halo)
    datas = [d.rechunk(((d.shape[0],), rows, cols)) for d in datas]
    grid = _ChunkGrid.of(halo, rows, cols)
    spec = _PipelineSpec(pipeline, tuple(names), tuple(p[4] for p in prepared), aff0, crs0,
                         device, grid)
    bands = tuple(d.shape[0] for d in datas)
    dtypes = tuple(np.dtype(d.dtype) for d in datas)
    out_dtype, out_bands, shown_nodata, exact_nodata = _on_cluster(client, _infer_chain, spec,
                                                                   bands, dtypes)
    spec = replace(spec, out_bands=out_bands, out_dtype=out_dtype.name, out_nodata=exact_nodata)
    meta = np.empty((0, 0, 0), dtype=out_dtype)
    depth = {0: 0, 1: halo if len(rows) > 1 else 0, 2: halo if len(cols) > 1 else 0}
    out_chunks = ((out_bands,), rows, cols)
    if depth[1] or depth[2]:
        result = da.map_overlap(_run_pipeline_block, *datas, spec=spec, depth=depth,
                                boundary="none", trim=True, align_arrays=False,
                                chunks=((out_bands,),) + grid.grown(),
                                dtype=out_dtype, meta=meta, token="vsr-pipeline")
    else:
        result = da.map_blocks(_run_pipeline_block, *datas, spec=spec, chunks=out_chunks,
                               dtype=out_dtype, meta=meta, token="vsr-pipeline")
    if two_d and out_bands == 1:
        result = result[0]
    if src0 is None:
        return result
    return _wrap_result(src0, result, _ResultInfo(out_dtype, out_bands, shown_nodata,
                                                  exact_nodata))
