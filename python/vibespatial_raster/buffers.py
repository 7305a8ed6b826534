# SPDX-License-Identifier: Apache-2.0
"""Raster types: the seed's ``vibespatial.raster.buffers`` on the native runtime.

- :class:`TilingStrategy`, :class:`Residency`: string enums.
- :class:`RasterPlan`, :class:`RasterMetadata`, :class:`RasterWindow`: frozen dataclasses.
- :func:`from_numpy`, :func:`from_device`: the Python original's module-level factories (the
  classmethods of the same names do the same).
- :class:`RasterDiagnosticKind`, :class:`RasterDiagnosticEvent`, :class:`RuntimeSelection`: a
  raster's diagnostic log (:attr:`OwnedRasterArray.diagnostics`), bounded to
  :data:`DIAGNOSTICS_CAPACITY` recent events.
- :class:`OwnedRasterArray`: a band-major ``(bands, height, width)`` raster with its
  georeferencing, on the host or on the device, backed by the C++ library's storage (device
  memory from the pool) or, after :meth:`OwnedRasterArray.from_device`, by another library's
  device array, used in place.
- :class:`DeviceArray`: a zero-copy device view speaking ``__cuda_array_interface__`` (v3) and
  DLPack, which CuPy, PyTorch, Numba and JAX import without a copy (the protocols are read and
  spoken in the private ``_interop`` module; the class is importable from here).

Memory safety: a NumPy view (:meth:`OwnedRasterArray.to_numpy` of a host raster) or a device
view keeps the storage it shows alive, and no call frees or moves a storage in place:
:meth:`~OwnedRasterArray.move_to` copies into new storage. A view therefore never dangles; after
a move it shows the pixels as they were.
"""

from __future__ import annotations

import decimal
import enum
import math
import numbers
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _core
from ._dtypes import raster_dtype
from ._interop import (_DLPACK_CPU, _DLPACK_CUDA, DeviceArray, _External, _cupy_if_imported,
                       _forward_dlpack, _import_cai, _import_dlpack, _stream_handle)

__all__ = [
    "DIAGNOSTICS_CAPACITY",
    "DeviceArray",
    "OwnedRasterArray",
    "RasterDiagnosticEvent",
    "RasterDiagnosticKind",
    "RasterMetadata",
    "RasterPlan",
    "RasterWindow",
    "Residency",
    "RuntimeSelection",
    "TilingStrategy",
    "from_device",
    "from_numpy",
]

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - Python 3.10

    class StrEnum(str, enum.Enum):
        """``enum.StrEnum`` of Python 3.11 for 3.10."""

        def __str__(self) -> str:
            return str(self.value)


class TilingStrategy(StrEnum):
    """How a plan moves a raster through the device.

    ``WHOLE``: all bands at once; ``TILED``: spatial tiles of ``tile_shape``; ``BAND_BATCHES``
    (ours): whole bands, ``bands_per_pass`` at a time (per-band work only).
    """

    WHOLE = "whole"
    TILED = "tiled"
    BAND_BATCHES = "band_batches"


class Residency(StrEnum):
    """Where a raster's authoritative pixels live."""

    HOST = "host"
    DEVICE = "device"


class RasterDiagnosticKind(StrEnum):
    """What a diagnostic event records (the Python original's kinds)."""

    CREATED = "created"
    TRANSFER = "transfer"
    MATERIALIZATION = "materialization"
    RUNTIME = "runtime"


@dataclass(frozen=True)
class RasterDiagnosticEvent:
    """One event of a raster's diagnostic log.

    Attributes:
        kind: what it records.
        detail: what happened, in words (e.g. "host->device 320 bytes (1x8x10 float32)",
            "dispatch_per_band_cpu bands=3 shape=(8, 10) threads=2 elapsed=0.0012s").
        residency: where the pixels were after it.
        visible_to_user: True for transfers.
        elapsed_seconds: wall time it took (transfers, executors), else 0.
        bytes_transferred: bytes copied (transfers), else 0.
    """

    kind: RasterDiagnosticKind
    detail: str
    residency: Residency
    visible_to_user: bool = False
    elapsed_seconds: float = 0.0
    bytes_transferred: int = 0


@dataclass(frozen=True)
class RuntimeSelection:
    """A runtime decision, as :meth:`OwnedRasterArray.record_runtime_selection` keeps it."""

    selected: str
    reason: str = ""
    requested: str = ""


#: The most events (and, apart, runtime selections) a raster's log keeps: older ones are
#: dropped, and ``diagnostics_report()["events_dropped"]`` counts them.
DIAGNOSTICS_CAPACITY: int = int(_core.DiagnosticLog.capacity)


def _selection_text(value: Any) -> str:
    """A selection field as text: an enum's value, else str()."""
    if value is None:
        return ""
    return str(getattr(value, "value", value))


@dataclass(frozen=True)
class RasterPlan:
    """The planner's decision for one raster and one operation.

    Attributes:
        strategy: whole, tiled or band_batches.
        tile_shape: effective (output) tile (height, width), halo excluded; None unless tiled.
        halo: overlap pixels on each side of a tile.
        n_tiles: ceil(H/th) * ceil(W/tw); 0 unless tiled.
        estimated_vram_per_tile: bytes one pass needs on the device (0 with no GPU).
        bands_per_pass: bands in one pass (ours; band_count for whole and non-per-band tiles).
        fits_budget: False when even the smallest pass exceeds the usable budget (ours; the
            Python original returned such a plan silently).
    """

    strategy: TilingStrategy
    tile_shape: tuple[int, int] | None
    halo: int
    n_tiles: int
    estimated_vram_per_tile: int
    bands_per_pass: int = 1
    fits_budget: bool = True

    @classmethod
    def _from_core(cls, t: tuple) -> RasterPlan:
        strategy, tile, halo, n_tiles, estimate, bands_per_pass, fits = t
        return cls(
            TilingStrategy(strategy),
            None if tile is None else (int(tile[0]), int(tile[1])),
            int(halo),
            int(n_tiles),
            int(estimate),
            int(bands_per_pass),
            bool(fits),
        )

    def _core_args(self) -> tuple[str, tuple[int, int] | None, int, int, int, int, bool]:
        return (
            str(TilingStrategy(self.strategy)),
            None if self.tile_shape is None else (int(self.tile_shape[0]), int(self.tile_shape[1])),
            int(self.halo),
            int(self.n_tiles),
            int(self.estimated_vram_per_tile),
            int(self.bands_per_pass),
            bool(self.fits_budget),
        )


def _affine_tuple(affine: Any) -> tuple[float, float, float, float, float, float]:
    """(a, b, c, d, e, f) in rasterio order from a 6-sequence or an ``affine.Affine``."""
    if all(hasattr(affine, k) for k in "abcdef"):
        values = [affine.a, affine.b, affine.c, affine.d, affine.e, affine.f]
    else:
        try:
            values = list(affine)
        except TypeError:
            raise TypeError(f"affine must be 6 numbers (a, b, c, d, e, f), not {affine!r}") from None
    if len(values) != 6:
        raise ValueError(f"affine must have 6 numbers (a, b, c, d, e, f), not {len(values)}")
    try:
        return tuple(float(v) for v in values)  # type: ignore[return-value]
    except (TypeError, ValueError):
        raise TypeError(f"affine must be 6 numbers (a, b, c, d, e, f), not {affine!r}") from None


def _crs_string(crs: Any) -> str:
    """The CRS as the library keeps it: WKT, "EPSG:n", or "" for none."""
    if crs is None:
        return ""
    if isinstance(crs, str):
        return crs
    to_wkt = getattr(crs, "to_wkt", None)  # pyproj.CRS, rasterio.crs.CRS
    if callable(to_wkt):
        return str(to_wkt())
    return str(crs)


_INT64_MIN = -(2**63)
_UINT64_END = 2**64


def _nodata_value(nodata: Any, who: str = "nodata") -> int | float | None:
    """``nodata`` as the runtime takes it: None, an int (integers of any kind, held exactly:
    Python and NumPy integers, integral Fractions and Decimals) or a float (other real numbers:
    floats, NumPy floats, Fractions, Decimals, NaN included). TypeError for what is not a real
    number (bool, complex, str); ValueError for a signaling NaN Decimal. ``who`` names the
    caller in the messages."""
    if nodata is None:
        return None
    if isinstance(nodata, (bool, np.bool_, complex, np.complexfloating)):
        raise TypeError(f"nodata must be a number or None, not {nodata!r}")
    if isinstance(nodata, (int, np.integer)):
        return int(nodata)
    if isinstance(nodata, (float, np.floating)):
        return float(nodata)
    if isinstance(nodata, decimal.Decimal):
        if nodata.is_finite() and nodata == nodata.to_integral_value():
            return int(nodata)
        if nodata.is_snan():
            raise ValueError(f"{who}: nodata {nodata!r} is a signaling NaN")
        return float(nodata)
    if isinstance(nodata, numbers.Rational):
        if nodata.denominator == 1:
            return int(nodata.numerator)
        return float(nodata)
    if isinstance(nodata, numbers.Real):
        return float(nodata)
    raise TypeError(f"nodata must be a number or None, not {nodata!r}")


def _checked_nodata(who: str, nodata: Any, dtype: np.dtype) -> int | float | None:
    """``nodata`` as the runtime holds it for pixels of ``dtype`` (see :func:`_nodata_value`):
    exactly for integer rasters (every int64 and uint64 value, 2**64 - 1 and -2**63 included),
    as a float for float rasters. TypeError for a value that is not a real number (complex,
    bool, str), ValueError for a NaN nodata on an integer dtype, OverflowError for an integer
    beyond any float (``who`` names the caller). An integer dtype's nodata that the dtype
    cannot hold (256 or 1e10 for uint8) is kept: such a raster has no nodata pixels, as the ops
    say; an integer beyond 64 bits is kept as its nearest float."""
    value = _nodata_value(nodata, who)
    if value is None:
        return None
    if isinstance(value, int) and (dtype.kind == "f" or not _INT64_MIN <= value < _UINT64_END):
        try:
            value = float(value)
        except OverflowError:
            raise OverflowError(f"{who}: nodata {value} is too large for a float") from None
    if isinstance(value, float) and math.isnan(value) and dtype.kind in "iu":
        raise ValueError(f"{who}: a NaN nodata cannot mark pixels of dtype {dtype}")
    return value


def _nodata_for(dtype: np.dtype, value: int | float | None) -> float | int | None:
    """nodata as the seed shows it: an int for integer rasters when it is one (exactly), a
    float for float rasters."""
    if value is None:
        return None
    if dtype.kind in "iu":
        if isinstance(value, int):
            return value
        if math.isfinite(value) and float(value).is_integer():
            return int(value)
    return float(value)


@dataclass(frozen=True)
class RasterMetadata:
    """What a raster header says, without the pixels.

    ``affine`` is in rasterio order (a, b, c, d, e, f): x = a*col + b*row + c,
    y = d*col + e*row + f. ``crs`` is what the raster carries (a string, or the object given).
    """

    height: int
    width: int
    band_count: int
    dtype: np.dtype
    nodata: float | int | None
    affine: tuple[float, float, float, float, float, float]
    crs: Any
    driver: str = ""

    @property
    def pixel_count(self) -> int:
        """height * width (pixels of one band)."""
        return int(self.height) * int(self.width)

    @property
    def bounds(self) -> tuple[float, float, float, float]:
        """(left, bottom, right, top): min/max of the affine image of the four corners."""
        return _core.metadata_bounds(int(self.height), int(self.width), _affine_tuple(self.affine))

    @classmethod
    def _from_core(cls, t: tuple, crs: Any = None) -> RasterMetadata:
        height, width, bands, dtype, nodata, affine, crs_str, driver = t
        d = np.dtype(dtype)
        return cls(
            int(height),
            int(width),
            int(bands),
            d,
            _nodata_for(d, nodata),
            tuple(affine),
            crs if crs is not None else (crs_str or None),
            driver,
        )


@dataclass(frozen=True)
class RasterWindow:
    """A pixel window: columns [col_off, col_off + width), rows [row_off, row_off + height)."""

    col_off: int
    row_off: int
    width: int
    height: int


_UNSET: Any = object()


class OwnedRasterArray:
    """A band-major raster with its georeferencing, on the host or the device.

    Build one with :meth:`from_numpy` (copies into the runtime's storage), :meth:`from_device`
    (uses another library's device array in place) or :meth:`from_band_stack`; operations and
    dispatchers return them too. ``shape`` is ``(height, width)`` for a raster made from a 2D
    array and for band views, else ``(bands, height, width)``.

    Thread-safety: distinct rasters may be used from distinct threads; one raster may be read
    from several threads, but :meth:`move_to` must not run concurrently with other calls on it.
    """

    __slots__ = ("__weakref__", "_cai_exported", "_crs_obj", "_device_id", "_ext", "_ext_geo",
                 "_ext_log", "_ext_shape", "_mask_cache", "_native", "_retired", "_two_d")
    _native: Any  # _core.Raster: the library's storage, or None for external device memory
    _ext: Any  # _External: another library's device memory (from_device), or None
    _ext_shape: Any  # (bands, height, width, dtype) of _ext
    _ext_geo: Any  # (nodata, affine, crs string) of _ext
    _crs_obj: Any  # the CRS object given by the user (returned as is), or _UNSET / None
    _two_d: bool
    _retired: list[Any]  # storages exported through the CUDA array interface, kept alive
    _cai_exported: bool
    _device_id: int
    _ext_log: Any  # _core.DiagnosticLog of external memory (the library's storage has its own)
    _mask_cache: Any  # (storage, mask) of device_nodata_mask, or None

    # ---- construction ----

    def __init__(self) -> None:
        raise TypeError("use OwnedRasterArray.from_numpy, from_device or from_band_stack")

    @classmethod
    def _wrap(cls, native: Any, *, crs: Any = _UNSET, two_d: bool = False,
              device_id: int = 0) -> OwnedRasterArray:
        self = object.__new__(cls)
        self._native = native
        self._ext = None
        self._ext_geo = None
        self._ext_shape = None
        self._crs_obj = crs
        self._two_d = bool(two_d) and native.band_count == 1
        self._retired = []
        self._cai_exported = False
        self._device_id = device_id
        self._ext_log = None
        self._mask_cache = None
        return self

    @classmethod
    def from_numpy(cls, data: Any, *, nodata: float | int | None = None,
                   affine: Any = (1.0, 0.0, 0.0, 0.0, -1.0, 0.0), crs: Any = None,
                   residency: Residency | str = Residency.HOST) -> OwnedRasterArray:
        """A raster holding a copy of ``data`` ((bands, height, width) or (height, width)).

        The copy goes into the runtime's own storage once; :meth:`to_numpy` then shares it with
        NumPy without a copy. ``residency=DEVICE`` puts it on the device (pool memory).

        Raises:
            ValueError: ``data`` is not 2D or 3D, is empty, a masked array with masked pixels
                (the mask would be lost: fill them with the nodata, ``data.filled(nodata)``),
                or a NaN ``nodata`` is given for an integer dtype; TypeError: an unsupported
                dtype, or a ``nodata`` that is not a real number (complex, bool, str).
        """
        if np.ma.is_masked(data):
            raise ValueError("from_numpy: data is a masked array with masked pixels, and the "
                             "mask would be lost: give data.filled(nodata) and nodata=")
        arr = np.asarray(data)
        if arr.ndim not in (2, 3):
            raise ValueError(f"from_numpy: data must be 2D (height, width) or 3D (bands, height, "
                             f"width), not {arr.ndim}D")
        dtype = raster_dtype(arr.dtype)
        shape3 = arr.shape if arr.ndim == 3 else (1, *arr.shape)
        if min(shape3) <= 0:
            raise ValueError(f"from_numpy: empty raster of shape {arr.shape}")
        value = _checked_nodata("from_numpy", nodata, dtype)
        where = Residency(residency)
        contiguous = np.ascontiguousarray(arr, dtype=dtype)
        native = _core.Raster.from_host(contiguous, dtype.name, int(shape3[0]), int(shape3[1]),
                                        int(shape3[2]), value, _affine_tuple(affine),
                                        _crs_string(crs))
        out = cls._wrap(native, crs=crs, two_d=arr.ndim == 2)
        if where is Residency.DEVICE:
            out.move_to(Residency.DEVICE)
        return out

    @classmethod
    def from_device(cls, device_arr: Any, *, nodata: float | int | None = None,
                    affine: Any = (1.0, 0.0, 0.0, 0.0, -1.0, 0.0),
                    crs: Any = None) -> OwnedRasterArray:
        """A device-resident raster over another library's device array, without a copy.

        ``device_arr`` is any object with ``__cuda_array_interface__`` (CuPy, Numba, PyTorch) or
        ``__dlpack__`` (PyTorch, JAX, CuPy): 2D or 3D, C-contiguous, of a raster dtype. The
        raster keeps it alive and reads it in place; work on it is ordered after the stream the
        producer names (CAI ``stream``; for DLPack the producer is asked for the legacy default
        stream). Operations that need the library's own storage (ops, dispatch) copy it.

        Every field the interface declares is checked, and a wrong one named: CAI ``version``
        (0 to 3), ``shape`` (non-negative integers), ``typestr`` (a raster dtype in this
        machine's byte order), ``data`` (a ``(pointer, read_only)`` tuple with an aligned,
        non-null pointer), ``strides``, ``mask`` (must be None) and ``stream`` (None or a
        handle other than 0); DLPack's device, version, shape, dtype and read-only flag. A
        read-only array gives read-only device views.

        The array's extent is checked against the memory before anything reads it: a pointer
        into the runtime's pool must lie in a live block that holds the whole array, any other
        in one device allocation the driver reports that does (for another library's pool, its
        whole driver allocation; for VMM memory, its whole reservation).

        Raises:
            TypeError: no such interface, host memory (use from_numpy), an unsupported dtype,
            or a field of the wrong type; ValueError: not 2D/3D, empty, not C-contiguous,
            masked, non-native byte order, a byte size beyond 64 bits, memory that does not
            hold the whole array (or is no device memory the driver knows), or another bad
            value.
        """
        if hasattr(device_arr, "__cuda_array_interface__"):
            ext, shape, dtype = _import_cai(device_arr)
        elif hasattr(device_arr, "__dlpack__"):
            ext, shape, dtype = _import_dlpack(device_arr)
        else:
            raise TypeError(f"from_device: {type(device_arr).__name__} has neither "
                            "__cuda_array_interface__ nor __dlpack__")
        if len(shape) not in (2, 3):
            raise ValueError(f"from_device: the array must be 2D or 3D, not {len(shape)}D")
        shape3 = tuple(shape) if len(shape) == 3 else (1, *shape)
        if min(shape3) <= 0:
            raise ValueError(f"from_device: empty array of shape {tuple(shape)}")
        value = _checked_nodata("from_device", nodata, dtype)
        # Before anything reads it: the memory must hold the whole array (a pool block its
        # requested bytes, other memory the allocation the driver knows there).
        nbytes = int(shape3[0]) * int(shape3[1]) * int(shape3[2]) * dtype.itemsize
        _core.check_device_range(ext.ptr, nbytes, "from_device")
        self = object.__new__(cls)
        self._native = None
        self._ext = ext
        self._ext_shape = (int(shape3[0]), int(shape3[1]), int(shape3[2]), dtype)
        self._ext_geo = (value, _affine_tuple(affine), _crs_string(crs))
        self._crs_obj = crs
        self._two_d = len(shape) == 2
        self._retired = []
        self._cai_exported = False
        self._device_id = ext.device_id
        self._mask_cache = None
        self._ext_log = _core.DiagnosticLog()
        self._ext_log.record("created", f"from_device shape={tuple(shape)} dtype={dtype}",
                             "device")
        return self

    @classmethod
    def from_band_stack(cls, band_results: Sequence[OwnedRasterArray], *,
                        source: OwnedRasterArray) -> OwnedRasterArray:
        """Stack per-band results into one raster with ``source``'s affine, CRS and nodata.

        One result comes back sharing its pixels, with ``source``'s georeferencing (the Python
        original overwrote the result's in place; this does not). Several are copied band after
        band into new storage, on the device if any result is there.

        Raises:
            ValueError: an empty list; results whose dtype, nodata (NaN equals NaN, whatever
                the scalar type) or shape differ from the first (the message names the band).
            TypeError: a result that is not an OwnedRasterArray.
        """
        results = list(band_results)
        if not results:
            raise ValueError("from_band_stack: no band results")
        for i, r in enumerate(results):
            if not isinstance(r, OwnedRasterArray):
                raise TypeError(f"from_band_stack: band {i} is a {type(r).__name__}, not an "
                                "OwnedRasterArray")
        if not isinstance(source, OwnedRasterArray):
            raise TypeError("from_band_stack: source must be an OwnedRasterArray")
        if source._native is not None:
            src = source._native
        else:
            nodata, affine, crs = source._ext_geo
            src = _core.Raster.from_host(np.zeros((1, 1), np.float64), "float64", 1, 1, 1, nodata,
                                         affine, crs)
        native = _core.Raster.from_band_stack([r._as_native() for r in results], src)
        two_d = results[0]._two_d if len(results) == 1 else False
        return cls._wrap(native, crs=source._crs_obj, two_d=two_d,
                         device_id=results[0]._device_id)

    # ---- shape and georeferencing ----

    @property
    def band_count(self) -> int:
        return self._native.band_count if self._native is not None else self._ext_shape[0]

    @property
    def height(self) -> int:
        return self._native.height if self._native is not None else self._ext_shape[1]

    @property
    def width(self) -> int:
        return self._native.width if self._native is not None else self._ext_shape[2]

    @property
    def pixel_count(self) -> int:
        """height * width."""
        return self.height * self.width

    @property
    def shape(self) -> tuple[int, ...]:
        if self._two_d:
            return (self.height, self.width)
        return (self.band_count, self.height, self.width)

    @property
    def dtype(self) -> np.dtype:
        if self._native is not None:
            return np.dtype(self._native.dtype)
        return self._ext_shape[3]

    @property
    def nbytes(self) -> int:
        return self.band_count * self.pixel_count * self.dtype.itemsize

    @property
    def nodata(self) -> float | int | None:
        """The nodata value of every band (NaN is a valid value), or None."""
        value = self._native.nodata if self._native is not None else self._ext_geo[0]
        return _nodata_for(self.dtype, value)

    @property
    def affine(self) -> tuple[float, float, float, float, float, float]:
        """The pixel -> world transform (a, b, c, d, e, f), rasterio order."""
        if self._native is not None:
            return tuple(self._native.affine)  # type: ignore[return-value]
        return self._ext_geo[1]

    @property
    def crs(self) -> Any:
        """The CRS: the object given at construction, else the library's string (WKT or
        "EPSG:n"), or None."""
        if self._crs_obj is not _UNSET and self._crs_obj is not None:
            return self._crs_obj
        s = self._native.crs if self._native is not None else self._ext_geo[2]
        return s or None

    @property
    def residency(self) -> Residency:
        if self._native is not None:
            return Residency(self._native.residency)
        return Residency.DEVICE

    @property
    def bounds(self) -> tuple[float, float, float, float]:
        """(left, bottom, right, top): min/max of the affine image of the four corners."""
        return _core.metadata_bounds(self.height, self.width, self.affine)

    @property
    def metadata(self) -> RasterMetadata:
        return RasterMetadata(self.height, self.width, self.band_count, self.dtype, self.nodata,
                              self.affine, self.crs, "")

    def with_georeferencing(self, *, nodata: Any = _UNSET, affine: Any = _UNSET,
                            crs: Any = _UNSET) -> OwnedRasterArray:
        """A raster sharing these pixels with other nodata, affine or CRS (the rest kept)."""
        new_nodata = self.nodata if nodata is _UNSET else nodata
        new_affine = self.affine if affine is _UNSET else affine
        new_crs = self.crs if crs is _UNSET else crs
        value = _checked_nodata("with_georeferencing", new_nodata, self.dtype)
        native = _core.Raster.with_georeferencing(self._as_native(), value,
                                                  _affine_tuple(new_affine), _crs_string(new_crs))
        return type(self)._wrap(native, crs=new_crs, two_d=self._two_d, device_id=self._device_id)

    # ---- masks ----

    @property
    def nodata_mask(self) -> np.ndarray:
        """Host boolean mask, True where a pixel is nodata (NaN pixels of a NaN nodata)."""
        data = self.to_numpy()
        nodata = self.nodata
        if nodata is None:
            return np.zeros(data.shape, dtype=bool)
        if isinstance(nodata, float) and math.isnan(nodata):
            if data.dtype.kind != "f":
                warnings.warn("NaN nodata on an integer raster marks nothing", stacklevel=2)
                return np.zeros(data.shape, dtype=bool)
            return np.isnan(data)
        return data == nodata

    @property
    def valid_mask(self) -> np.ndarray:
        """Host boolean mask, True where a pixel is not nodata."""
        return ~self.nodata_mask

    # ---- pixels ----

    def to_numpy(self) -> np.ndarray:
        """The pixels as a NumPy array of :attr:`shape`.

        Host-resident: a writable view of the raster's storage, no copy (it keeps the storage
        alive). Device-resident: a copy (device to host; the raster stays on the device), with
        a ``MATERIALIZATION`` event in :attr:`diagnostics`.
        """
        dtype = self.dtype
        shape3 = (self.band_count, self.height, self.width)
        if self._native is not None and self._native.residency == "host":
            view = _core.array_view(self._native.host_pointer, list(shape3), dtype.name,
                                    _DLPACK_CPU, 0, self._native, True)
            out = np.asarray(view)
        else:
            start = time.perf_counter()
            out = np.empty(shape3, dtype=dtype)
            if self._native is not None:
                self._native.copy_to_host_buffer(out)
            else:
                _core.memcpy(out.ctypes.data, self._ext.ptr, out.nbytes,
                             _core.COPY_DEVICE_TO_HOST, _stream_handle(self._ext.stream))
            self._log().record("materialization",
                               f"to_numpy device->host copy {out.nbytes} bytes", "device", True,
                               time.perf_counter() - start, out.nbytes)
        return out.reshape(self.shape)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        out = self.to_numpy()
        if dtype is not None:
            out = out.astype(dtype, copy=False)
        if copy:
            out = out.copy()
        return out

    def move_to(self, target: Residency | str, trigger: Any = None,
                reason: Any = None) -> OwnedRasterArray:
        """Make ``target`` ("host" or "device") the raster's residency; returns ``self``.

        The pixels are copied into new storage there (device memory from the pool); views of
        the old storage stay valid and keep its pixels. A no-op if already there.
        ``trigger`` and ``reason`` are accepted for the Python original's signature.

        Raises:
            ValueError: an unknown target; OutOfMemoryError / CudaError /
            DriverUnavailableError from the device.
        """
        del trigger, reason
        where = Residency(target)
        if where is self.residency:
            return self
        if self._native is not None:
            new = self._native.copy_to(where.value)
            if self._cai_exported:
                self._retired.append(self._native)
            self._native = new
            if where is Residency.DEVICE:
                self._device_id = _core.memory_pool_stats()["device"]
        else:
            b, h, w, dtype = self._ext_shape
            nodata, affine, crs = self._ext_geo
            start = time.perf_counter()
            new = _core.Raster.allocate("host", dtype.name, b, h, w, nodata, affine, crs)
            _core.memcpy(new.host_pointer, self._ext.ptr, new.byte_size,
                         _core.COPY_DEVICE_TO_HOST, _stream_handle(self._ext.stream))
            new.adopt_diagnostics(self._ext_log)
            self._ext_log.record("transfer",
                                 f"device->host {new.byte_size} bytes ({b}x{h}x{w} {dtype})",
                                 "host", True, time.perf_counter() - start, new.byte_size)
            self._ext_log = None
            if self._cai_exported:
                self._retired.append(self._ext)
            self._native = new
            self._ext = None
            self._ext_geo = None
            self._ext_shape = None
        self._cai_exported = False
        return self

    def band(self, i: int) -> OwnedRasterArray:
        """A zero-copy single-band view of band ``i``, on the same residency.

        Raises:
            IndexError: ``i`` is not in [0, band_count).
        """
        i = self._band_index(i)
        if self._native is not None:
            return type(self)._wrap(self._native.band(i), crs=self._crs_obj, two_d=True,
                                    device_id=self._device_id)
        b, h, w, dtype = self._ext_shape
        ext = self._ext
        view = object.__new__(type(self))
        view._native = None
        view._ext = _External(ext.ptr + i * h * w * dtype.itemsize, ext.owner, ext.stream,
                              ext.device_id, ext.device_type, ext.readonly)
        view._ext_shape = (1, h, w, dtype)
        view._ext_geo = self._ext_geo
        view._crs_obj = self._crs_obj
        view._two_d = True
        view._retired = []
        view._cai_exported = False
        view._device_id = self._device_id
        view._ext_log = self._ext_log
        view._mask_cache = None
        return view

    def _band_index(self, i: int) -> int:
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"band index must be an integer, not {type(i).__name__}")
        if not 0 <= int(i) < self.band_count:
            raise IndexError(f"band {i} out of range: the raster has {self.band_count} band(s)")
        return int(i)

    def device_data(self) -> Any:
        """The pixels on the device (moving the raster there first), zero-copy.

        Returns a ``cupy.ndarray`` when CuPy has been imported (as the Python original did),
        else a :class:`DeviceArray`, which CuPy, PyTorch, Numba and JAX import without a copy.
        """
        self.move_to(Residency.DEVICE)
        return self._device_view(0, self.band_count, self.shape)

    def device_band(self, i: int) -> Any:
        """Band ``i`` on the device as a zero-copy 2D view (moving the raster there first);
        CuPy or :class:`DeviceArray` as :meth:`device_data`.

        Raises:
            IndexError: ``i`` is not in [0, band_count).
        """
        i = self._band_index(i)
        self.move_to(Residency.DEVICE)
        return self._device_view(i, 1, (self.height, self.width))

    def device_array(self) -> DeviceArray:
        """The pixels on the device as a :class:`DeviceArray` (moving the raster there first)."""
        self.move_to(Residency.DEVICE)
        return self._device_array(0, self.band_count, self.shape)

    def _device_array(self, first: int, count: int, shape: tuple[int, ...]) -> DeviceArray:
        band_bytes = self.pixel_count * self.dtype.itemsize
        if self._native is not None:
            return DeviceArray(self._native.device_pointer + first * band_bytes, shape, self.dtype,
                               owner=self._native, stream=1, device_id=self._device_id)
        ext = self._ext
        return DeviceArray(ext.ptr + first * band_bytes, shape, self.dtype, owner=ext.owner,
                           stream=ext.stream, device_id=ext.device_id,
                           device_type=ext.device_type, readonly=ext.readonly)

    def _device_view(self, first: int, count: int, shape: tuple[int, ...]) -> Any:
        view = self._device_array(first, count, shape)
        cupy = _cupy_if_imported()
        if cupy is not None:
            return cupy.asarray(view)
        return view

    def _as_native(self) -> Any:
        """The library's raster for this one: itself, or a device copy of external memory."""
        if self._native is not None:
            return self._native
        b, h, w, dtype = self._ext_shape
        nodata, affine, crs = self._ext_geo
        native = _core.Raster.from_device_memory(self._ext.ptr, dtype.name, b, h, w, nodata,
                                                 affine, crs, _stream_handle(self._ext.stream))
        native.adopt_diagnostics(self._ext_log)
        return native

    # ---- diagnostics ----

    def _log(self) -> Any:
        """The diagnostic log of these pixels (the storage's, or external memory's)."""
        return self._native.diagnostics_log if self._native is not None else self._ext_log

    def _record(self, kind: str, detail: str, elapsed: float = 0.0) -> None:
        self._log().record(kind, detail, self.residency.value, False, float(elapsed), 0)

    @property
    def diagnostics(self) -> list[RasterDiagnosticEvent]:
        """The recent diagnostic events of these pixels, oldest first (a new list each time).

        The log belongs to the pixels: copies sharing them (band views, ``with_georeferencing``)
        share it, :meth:`move_to` carries it to the new storage, and
        :meth:`from_band_stack` starts a stack's log with its results' events. It keeps the
        :data:`DIAGNOSTICS_CAPACITY` most recent events. Recorded: ``CREATED`` (from_numpy,
        from_device), ``TRANSFER`` (each copy between host and device, with bytes and seconds),
        ``MATERIALIZATION`` (:meth:`to_numpy` of a device raster: a host copy, no move),
        ``RUNTIME`` (the per-band dispatchers and tiled executors, naming the executor and its
        path; :meth:`record_runtime_selection`)."""
        return [RasterDiagnosticEvent(RasterDiagnosticKind(k), d, Residency(r), bool(v),
                                      float(e), int(b))
                for k, d, r, v, e, b in self._log().events()]

    @property
    def runtime_history(self) -> list[RuntimeSelection]:
        """The runtime selections recorded for these pixels, oldest first (at most
        :data:`DIAGNOSTICS_CAPACITY`)."""
        return [RuntimeSelection(selected=s, reason=r, requested=q)
                for q, s, r in self._log().runtime_history()]

    def record_runtime_selection(self, selection: Any) -> None:
        """Keeps ``selection`` in :attr:`runtime_history` and records a ``RUNTIME`` event
        "selected=... reason=..." (as the Python original).

        ``selection`` is a :class:`RuntimeSelection` or any object with ``selected`` and
        ``reason`` attributes (``requested`` too, if it has one), e.g. the original's
        ``vibespatial.runtime.RuntimeSelection``; enum fields are kept by their values.

        Raises:
            TypeError: ``selection`` has no ``selected`` attribute.
        """
        if not hasattr(selection, "selected"):
            raise TypeError(f"record_runtime_selection: expected a RuntimeSelection, not "
                            f"{type(selection).__name__}")
        self._log().record_runtime_selection(
            _selection_text(getattr(selection, "requested", None)),
            _selection_text(selection.selected), _selection_text(getattr(selection, "reason", "")),
            self.residency.value)

    def diagnostics_report(self) -> dict[str, Any]:
        """A summary of the raster and its diagnostic events, as a dict: ``shape``, ``dtype``,
        ``band_count``, ``pixel_count``, ``nodata``, ``residency``, ``device_allocated``,
        ``events`` (each a dict of ``kind``, ``detail``, ``residency``, ``elapsed_seconds``,
        ``bytes_transferred``), as the Python original's, and ``events_dropped`` (ours: events
        older than the log's bound)."""
        return {
            "shape": self.shape,
            "dtype": str(self.dtype),
            "band_count": self.band_count,
            "pixel_count": self.pixel_count,
            "nodata": self.nodata,
            "residency": str(self.residency),
            "device_allocated": self.residency is Residency.DEVICE,
            "events": [
                {
                    "kind": str(e.kind),
                    "detail": e.detail,
                    "residency": str(e.residency),
                    "elapsed_seconds": e.elapsed_seconds,
                    "bytes_transferred": e.bytes_transferred,
                }
                for e in self.diagnostics
            ],
            "events_dropped": int(self._log().dropped_events),
        }

    def device_nodata_mask(self) -> Any:
        """The nodata mask on the device (moving the raster there first), True (1) where a
        pixel is nodata; computed on the first call and cached until the pixels move.

        With CuPy imported: a ``cupy`` bool array computed on the device (as the Python
        original). Otherwise: a :class:`DeviceArray` of uint8 (1 = nodata, 0 = valid) in pool
        memory, computed from a host copy of the pixels. A NaN nodata on an integer raster
        (possible only for external memory) warns and marks nothing. Writes to the device
        pixels after the first call are not reflected (call it again after a move, or use
        :attr:`nodata_mask`)."""
        self.move_to(Residency.DEVICE)
        key = self._native if self._native is not None else self._ext
        if self._mask_cache is not None and self._mask_cache[0] is key:
            return self._mask_cache[1]
        nodata = self.nodata
        nan = isinstance(nodata, float) and math.isnan(nodata)
        if nan and self.dtype.kind != "f":
            warnings.warn("NaN nodata on an integer raster marks nothing", stacklevel=2)
        cupy = _cupy_if_imported()
        if cupy is not None:
            data = self.device_data()
            if nodata is None or (nan and self.dtype.kind != "f"):
                mask = cupy.zeros(data.shape, dtype=cupy.bool_)
            elif nan:
                mask = cupy.isnan(data)
            else:
                mask = data == nodata
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                host = np.ascontiguousarray(self.nodata_mask, dtype=np.uint8)
            shape3 = (self.band_count, self.height, self.width)
            native = _core.Raster.from_host(host.reshape(shape3), "uint8", *shape3, None,
                                            self.affine, "").copy_to("device")
            mask = DeviceArray(native.device_pointer, self.shape, np.dtype(np.uint8),
                               owner=native, stream=1, device_id=self._device_id)
        self._mask_cache = (key, mask)
        return mask

    # ---- interop protocols ----

    @property
    def __cuda_array_interface__(self) -> dict:
        """CUDA array interface v3 of a device-resident raster (AttributeError on the host, so
        that consumers look for another protocol). ``stream`` is where the data is ready: 1, the
        legacy default stream, for the library's storage; the producer's for external arrays."""
        if self.residency is not Residency.DEVICE:
            raise AttributeError("__cuda_array_interface__: the raster is on the host "
                                 "(move_to('device') first, or use to_numpy())")
        self._cai_exported = True
        return self._device_array(0, self.band_count, self.shape).__cuda_array_interface__

    def __dlpack_device__(self) -> tuple[int, int]:
        if self.residency is Residency.HOST:
            return (_DLPACK_CPU, 0)
        if self._ext is not None:
            return (self._ext.device_type, self._ext.device_id)
        return (_DLPACK_CUDA, self._device_id)

    def __dlpack__(self, *, stream: int | None = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
        """DLPack export, zero-copy: host rasters as CPU tensors (``numpy.from_dlpack``), device
        rasters as CUDA tensors ordered for the consumer's ``stream``."""
        if self.residency is Residency.HOST:
            view = _core.array_view(self._native.host_pointer,
                                    [self.band_count, self.height, self.width][-len(self.shape):],
                                    self.dtype.name, _DLPACK_CPU, 0, self._native, True)
            return _forward_dlpack(view, max_version, dl_device, copy)
        return self._device_array(0, self.band_count, self.shape).__dlpack__(
            stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)

    def __repr__(self) -> str:
        return (f"OwnedRasterArray(shape={self.shape}, dtype={self.dtype}, "
                f"residency={self.residency.value}, nodata={self.nodata!r}, "
                f"affine={self.affine}, crs={self.crs!r})")


def from_numpy(data: Any, *, nodata: float | int | None = None,
               affine: Any = (1.0, 0.0, 0.0, 0.0, -1.0, 0.0), crs: Any = None,
               residency: Residency | str = Residency.HOST) -> OwnedRasterArray:
    """The Python original's factory: :meth:`OwnedRasterArray.from_numpy` (a copy of ``data``,
    (height, width) or (bands, height, width); 1D and 4D arrays, and a NaN ``nodata`` on an
    integer dtype, are refused with ValueError)."""
    return OwnedRasterArray.from_numpy(data, nodata=nodata, affine=affine, crs=crs,
                                       residency=residency)


def from_device(device_arr: Any, *, nodata: float | int | None = None,
                affine: Any = (1.0, 0.0, 0.0, 0.0, -1.0, 0.0),
                crs: Any = None) -> OwnedRasterArray:
    """The Python original's factory: :meth:`OwnedRasterArray.from_device` (another library's
    device array used in place, zero-copy; no host placeholder is allocated)."""
    return OwnedRasterArray.from_device(device_arr, nodata=nodata, affine=affine, crs=crs)
