# SPDX-License-Identifier: Apache-2.0
"""Band operations of the C++ library (Thrust/CUB): statistics, rescale, clip, nodata fill,
normalized difference, histograms and a 3x3 focal mean, for all ten raster dtypes; band math
(:func:`calc`), chains of operations read once (:class:`Pipeline`), and zonal statistics
(:func:`zonal_stats`).

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
from typing import Any, Sequence

import numpy as np

from . import _core
from ._dtypes import raster_dtype
from ._zonal import ZonalInputError, ZonalResult, zonal_stat_names, zonal_stats
from .buffers import OwnedRasterArray

__all__ = [
    "BandStatistics",
    "Pipeline",
    "ZonalInputError",
    "ZonalResult",
    "band_statistics",
    "calc",
    "clip",
    "compute_dtype",
    "fill_nodata",
    "focal_mean_3x3",
    "histogram",
    "normalized_difference",
    "ops_built_with_cuda",
    "rescale",
    "zonal_stat_names",
    "zonal_stats",
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


# ---- band math and pipelines --------------------------------------------------------------------

_COMPUTE = ("float64", "float32")


def _expressions(expr: Any) -> list[str]:
    if isinstance(expr, str):
        return [expr]
    if isinstance(expr, Sequence) and not isinstance(expr, (bytes, bytearray)):
        out = list(expr)
        if out and all(isinstance(e, str) for e in out):
            return out
    raise TypeError("expr must be a str or a non-empty sequence of str, not "
                    f"{type(expr).__name__}")


def _calc_args(dtype: Any, compute: str, propagate_nodata: Any, nodata: Any) -> tuple:
    if compute not in _COMPUTE:
        raise ValueError(f"compute must be 'float64' or 'float32', not {compute!r}")
    if not isinstance(propagate_nodata, bool):
        raise TypeError("propagate_nodata must be a bool, not "
                        f"{type(propagate_nodata).__name__}")
    if nodata is not None and (isinstance(nodata, bool) or
                               not isinstance(nodata, (int, float, np.integer, np.floating))):
        raise TypeError(f"nodata must be a number or None, not {type(nodata).__name__}")
    if isinstance(nodata, np.integer):
        nodata = int(nodata)
    elif isinstance(nodata, np.floating):
        nodata = float(nodata)
    return (raster_dtype(dtype).name, compute == "float32", propagate_nodata, nodata)


def calc(expr: str | Sequence[str], *, dtype: Any = "float32", compute: str = "float64",
         propagate_nodata: bool = True, nodata: int | float | None = None,
         **inputs: OwnedRasterArray) -> OwnedRasterArray:
    """Band math over named rasters, as GDAL's calc writes it: ``calc("(A[4]-A[3])/(A[4]+A[3])",
    A=scene)`` (``A[2]`` is band 2, 1-based; ``A`` alone a one-band input). One output band per
    expression; computed in float64 unless ``compute="float32"``; written as ``dtype``. A pixel
    where an input the expression reads is invalid gives the output's nodata unless
    ``propagate_nodata=False``. The language, the nodata rule and the comparison with
    ``gdal_calc.py`` are in docs/band-math.md. Runs where the inputs live; results have the
    first input's residency, affine and CRS.

    Raises:
        ValueError: a bad expression (with its column and a caret), a name not given, a band out
            of range, inputs of different grids, a bad dtype or nodata.
        TypeError: an input that is not an OwnedRasterArray, ``expr`` not text.
    """
    exprs = _expressions(expr)
    if not inputs:
        raise ValueError("calc needs at least one input, e.g. calc('A * 2', A=raster)")
    rasters = [_raster(name, r) for name, r in inputs.items()]
    args = _calc_args(dtype, compute, propagate_nodata, nodata)
    native = _core.calc(exprs, list(inputs), [r._as_native() for r in rasters], *args)
    return _result(native, rasters[0])


class Pipeline:
    """A chain of operations over named inputs, run as one: each tile is read once, every step
    runs on it, the result is written once. Inputs are given by name and band count, the first
    where the chain starts: ``Pipeline(A=4)``; in a calc step's expressions ``X`` is the previous
    step's output. Each method adds a step, checks it at once (a bad expression fails here, with
    the step named) and returns the pipeline::

        chain = (ops.Pipeline(A=4)
                 .calc("(A[4] - A[3]) / (A[4] + A[3])")
                 .focal_mean("reflect")
                 .rescale(-1, 1, 1, 255, "uint8"))
        out = chain.run(A=scene)                    # or chain.run(plan, A=scene): tiled

    A tiled run reads every tile with :attr:`halo` pixels of context and equals the whole-raster
    result bit for bit (docs/pipelines.md).
    """

    def __init__(self, **inputs: int) -> None:
        if not inputs:
            raise ValueError("a Pipeline needs at least one input, e.g. Pipeline(A=4)")
        for name, bands in inputs.items():
            if isinstance(bands, bool) or not isinstance(bands, (int, np.integer)):
                raise TypeError(f"the band count of input {name} must be an integer, not "
                                f"{type(bands).__name__}")
        self._names = list(inputs)
        self._bands = {n: int(b) for n, b in inputs.items()}
        self._native = _core.Pipeline([(n, int(b)) for n, b in inputs.items()])
        # The steps added, as (method, args, kwargs): a pickled pipeline is built again from
        # them (the native chain does not pickle), so that Dask workers get the same chain.
        self._recipe: list[tuple[str, tuple, dict]] = []

    def calc(self, expr: str | Sequence[str], *, dtype: Any = "float32", compute: str = "float64",
             propagate_nodata: bool = True, nodata: int | float | None = None) -> "Pipeline":
        """Adds band math over the inputs and ``X`` (as :func:`calc`)."""
        self._native.calc(_expressions(expr), *_calc_args(dtype, compute, propagate_nodata, nodata))
        kept = expr if isinstance(expr, str) else tuple(expr)
        self._recipe.append(("calc", (kept,), {"dtype": dtype, "compute": compute,
                                               "propagate_nodata": propagate_nodata,
                                               "nodata": nodata}))
        return self

    def focal_mean(self, edge: str = "nearest") -> "Pipeline":
        """Adds a 3x3 focal mean (halo 1); ``edge`` as :func:`focal_mean_3x3`."""
        if edge not in _EDGES:
            raise ValueError(f"edge must be one of {', '.join(_EDGES)}, not {edge!r}")
        self._native.focal_mean(edge)
        self._recipe.append(("focal_mean", (edge,), {}))
        return self

    def rescale(self, in_min: float, in_max: float, out_min: float, out_max: float,
                dtype: Any = "float32") -> "Pipeline":
        """Adds a linear rescale (as :func:`rescale`)."""
        self._native.rescale(in_min, in_max, out_min, out_max, raster_dtype(dtype).name)
        self._recipe.append(("rescale", (in_min, in_max, out_min, out_max, dtype), {}))
        return self

    def convert(self, dtype: Any, nodata: int | float | None = None) -> "Pipeline":
        """Adds a conversion to ``dtype`` as ``gdal_translate -ot`` converts, with ``nodata``."""
        self._native.convert(raster_dtype(dtype).name, _calc_args("float32", "float64", True,
                                                                  nodata)[3])
        self._recipe.append(("convert", (dtype, nodata), {}))
        return self

    def clip(self, lower: float, upper: float) -> "Pipeline":
        """Adds a clamp of the valid pixels to [lower, upper] (as :func:`clip`)."""
        self._native.clip(lower, upper)
        self._recipe.append(("clip", (lower, upper), {}))
        return self

    def fill_nodata(self, value: float) -> "Pipeline":
        """Adds a fill of the invalid pixels with ``value`` (as :func:`fill_nodata`)."""
        self._native.fill_nodata(value)
        self._recipe.append(("fill_nodata", (value,), {}))
        return self

    @property
    def inputs(self) -> list[str]:
        """The inputs' names, in order."""
        return list(self._names)

    @property
    def input_bands(self) -> dict[str, int]:
        """The inputs' band counts, by name, in order."""
        return dict(self._bands)

    def __reduce__(self) -> tuple:
        # Pickled as its inputs and steps, built again when unpickled (the same checks pass).
        return (_rebuild_pipeline, (dict(self._bands), list(self._recipe)))

    @property
    def halo(self) -> int:
        """The sum of the steps' halos: the context a tiled run reads per tile side."""
        return self._native.halo

    @property
    def band_count(self) -> int | None:
        """The result's band count."""
        return self._native.band_count

    @property
    def steps(self) -> list[str]:
        """The steps' names, in order."""
        return list(self._native.step_names())

    def run(self, plan: Any = None, **rasters: OwnedRasterArray) -> OwnedRasterArray:
        """Runs the chain over whole rasters given by input name (every input, one grid): whole
        without ``plan``, else tiled as ``plan`` (a RasterPlan) says.

        Raises:
            ValueError: missing or extra inputs, band counts other than the chain's, rasters of
                different grids, a step's error on the data (naming the step).
        """
        from .buffers import RasterPlan

        missing = [n for n in self._names if n not in rasters]
        extra = [n for n in rasters if n not in self._names]
        if missing or extra:
            raise ValueError(f"run needs exactly the inputs {', '.join(self._names)}"
                             + (f"; missing {', '.join(missing)}" if missing else "")
                             + (f"; not inputs: {', '.join(extra)}" if extra else ""))
        ordered = [_raster(n, rasters[n]) for n in self._names]
        if plan is None:
            core_plan: tuple = ("whole", None, 0, 0, 0, max(1, ordered[0].band_count), True)
        elif isinstance(plan, RasterPlan):
            core_plan = plan._core_args()
        else:
            raise TypeError(f"plan must be a RasterPlan or None, not {type(plan).__name__}")
        native = self._native.run([r._as_native() for r in ordered], *core_plan)
        return _result(native, ordered[0])

    def __repr__(self) -> str:
        inputs = ", ".join(self._names)
        return f"Pipeline(inputs=[{inputs}], steps={self.steps}, halo={self.halo})"


def _rebuild_pipeline(inputs: dict[str, int], recipe: list[tuple[str, tuple, dict]]) -> Pipeline:
    """A Pipeline from its inputs and the steps :meth:`Pipeline.__reduce__` recorded."""
    chain = Pipeline(**inputs)
    for method, args, kwargs in recipe:
        getattr(chain, method)(*args, **kwargs)
    return chain
