# SPDX-License-Identifier: Apache-2.0
"""The package's exception types: the C++ library's errors as Python exceptions.

- :class:`CudaError` (a ``RuntimeError``): a CUDA driver call failed; ``code`` is the CUresult
  value and ``name`` its enumerator name (``"CUDA_ERROR_INVALID_VALUE"``).
- :class:`DriverUnavailableError` (a :class:`CudaError`): no usable driver or device.
- :class:`OutOfMemoryError` (a ``MemoryError``): the device, after the pool's recovery chain,
  cannot satisfy a request; ``requested_bytes`` says how much was asked for.

Bad arguments raise ``ValueError`` (or ``IndexError`` / ``OverflowError`` where those say it
better), wrong types ``TypeError``. A file that is missing or cannot be reached raises the
``OSError`` of its errno (``FileNotFoundError``, ``PermissionError``).
"""

from __future__ import annotations

__all__ = ["CudaError", "DriverUnavailableError", "OutOfMemoryError"]


class CudaError(RuntimeError):
    """A CUDA driver call failed.

    Attributes:
        code: the CUresult value (compare with the CUDA_ERROR_* values of ``cuda.h``).
        name: its enumerator name, e.g. ``"CUDA_ERROR_INVALID_VALUE"`` ("" if unknown).
    """

    def __init__(self, message: str, code: int = 0, name: str = "") -> None:
        super().__init__(message)
        self.code = int(code)
        self.name = str(name)

    def __reduce__(self):  # keeps code and name through pickling (multiprocessing, Dask)
        return (type(self), (str(self), self.code, self.name))


class DriverUnavailableError(CudaError):
    """There is no usable CUDA driver: the library named by VIBESPATIAL_CUDA_DRIVER (default
    libcuda.so.1) could not be loaded, cuInit failed, or no device exists."""


class OutOfMemoryError(MemoryError):
    """A device allocation could not be satisfied, after the pool's recovery chain (tier B).

    Attributes:
        requested_bytes: the size of the request that failed (0 when not known).
    """

    def __init__(self, message: str, requested_bytes: int = 0) -> None:
        super().__init__(message)
        self.requested_bytes = int(requested_bytes)

    def __reduce__(self):
        return (type(self), (str(self), self.requested_bytes))
