# SPDX-License-Identifier: Apache-2.0
"""Where this process runs the Dask layer's ops (``device=``)."""

from __future__ import annotations

import threading
from typing import Any

from .. import _core
from .. import ops as _ops

_DEVICES = ("auto", "gpu", "cpu")

_mode_lock = threading.Lock()
_auto_mode: str | None = None


def _process_mode() -> str:
    """"gpu" when this process has a real CUDA driver and the CUDA ops, else "cpu" (the
    emulator runs no kernels; vsr-run decides the same way). Kept once the driver is available;
    while it is not, each call looks again (the runtime starts a failed driver again)."""
    global _auto_mode
    with _mode_lock:
        if _auto_mode is not None:
            return _auto_mode
        info = _core.driver_info()
        available = bool(info.get("available"))
        real = available and not bool(info.get("emulated"))
        mode = "gpu" if real and _ops.ops_built_with_cuda() else "cpu"
        if available:
            _auto_mode = mode
        return mode


def _resolve_device(device: str) -> str:
    return _process_mode() if device == "auto" else device


def _check_device(device: Any) -> str:
    if device not in _DEVICES:
        raise ValueError(f"device must be one of {', '.join(_DEVICES)}, not {device!r}")
    return str(device)
