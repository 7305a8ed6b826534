# SPDX-License-Identifier: Apache-2.0
"""Testing on machines without a GPU: the host CUDA driver emulator that ships with the package.

The emulator (``libvsr-cuda-emulator.so``) implements the driver API subset the runtime uses on
host memory, with the real driver's rules and error codes. Point the runtime at it before the
driver is first used in the process::

    from vibespatial_raster import testing
    testing.use_emulator(device_memory=256 << 20)   # sets VIBESPATIAL_CUDA_DRIVER and VSR_EMU_*

Device pointers it hands out are host addresses, so tests can read them; :func:`emulator`
gives its test API (``vsr_emu_*``: outstanding objects, fault injection, stream pause).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

__all__ = ["emulator", "emulator_path", "use_emulator"]


def emulator_path() -> str:
    """The path of the emulator installed with the package.

    Raises:
        FileNotFoundError: the package was installed without it.
    """
    path = Path(__file__).resolve().parent / "_emulator" / "libvsr-cuda-emulator.so"
    if not path.is_file():
        raise FileNotFoundError(f"the driver emulator is not installed at {path}")
    return str(path)


def use_emulator(*, device_memory: int | None = None, **options: str | int) -> str:
    """Make the runtime load the emulator: sets ``VIBESPATIAL_CUDA_DRIVER`` to it, and
    ``VSR_EMU_DEVICE_MEMORY`` and ``VSR_EMU_<NAME>`` for ``name=value`` options (e.g.
    ``device_count=2``, ``vmm=0``). Takes effect only if the driver has not been loaded yet in
    this process (the runtime loads it once, on first use). Returns the emulator's path."""
    path = emulator_path()
    os.environ["VIBESPATIAL_CUDA_DRIVER"] = path
    if device_memory is not None:
        os.environ["VSR_EMU_DEVICE_MEMORY"] = str(int(device_memory))
    for name, value in options.items():
        os.environ["VSR_EMU_" + name.upper()] = str(value)
    return path


def emulator() -> ctypes.CDLL:
    """The emulator's library, for its test API (``vsr_emu_query_outstanding``,
    ``vsr_emu_set_fail``, ``vsr_emu_call_count``, ``vsr_emu_set_option``,
    ``vsr_emu_stream_pause``, ``vsr_emu_describe``): the same instance the runtime loaded."""
    lib = ctypes.CDLL(os.environ.get("VIBESPATIAL_CUDA_DRIVER") or emulator_path())
    if not hasattr(lib, "vsr_emu_describe"):
        raise RuntimeError("VIBESPATIAL_CUDA_DRIVER does not name the emulator")
    lib.vsr_emu_describe.restype = ctypes.c_char_p
    lib.vsr_emu_call_count.restype = ctypes.c_ulonglong
    lib.vsr_emu_call_count.argtypes = [ctypes.c_char_p]
    lib.vsr_emu_set_fail.argtypes = [ctypes.c_char_p]
    lib.vsr_emu_set_option.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    lib.vsr_emu_stream_pause.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib
