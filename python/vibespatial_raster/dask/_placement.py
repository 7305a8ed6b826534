# SPDX-License-Identifier: Apache-2.0
"""Where this process runs the Dask layer's ops (``device=``)."""

from __future__ import annotations

import threading
from typing import Any

from .. import _core
from .. import ops as _ops

_mode_lock = threading.Lock()
_auto_mode: str | None = None


def _process_mode() -> str:
    """Where ``device="auto"`` runs ops in this process: "gpu" or "cpu", as the library's
    placement rule (``placed``, which vsr-run asks too) decides on this process's driver and
    ops: the device for a real CUDA driver and the CUDA ops, else the host (on the emulator the
    device ops are its emulated device's host work on streams: ``device="gpu"`` runs them there).
    Kept once the driver is available; while it is not, each call looks again (the runtime
    starts a failed driver again)."""
    global _auto_mode
    with _mode_lock:
        if _auto_mode is not None:
            return _auto_mode
        info = _core.driver_info()
        residency, _, _ = _core.placed("auto", info, _ops.ops_built_with_cuda())
        mode = "gpu" if residency == "device" else "cpu"
        if info.get("available"):
            _auto_mode = mode
        return mode


def _resolve_device(device: str) -> str:
    return _process_mode() if device == "auto" else device


def _check_device(device: Any) -> str:
    """``device`` ("auto", "gpu" or "cpu", as the library's placement_from_string reads it);
    ValueError naming ``device`` otherwise."""
    try:
        return _core.placement_from_string(device if isinstance(device, str) else repr(device))
    except ValueError as e:
        raise ValueError(f"device: {e}") from None
