# SPDX-License-Identifier: Apache-2.0
"""A name-only shim: makes ``vibespatial.raster`` and ``vibespatial.raster.<module>`` the
modules of ``vibespatial_raster`` in ``sys.modules``, so code written for the Python original
imports this package unchanged. It maps names and nothing else."""

from __future__ import annotations

import importlib
import sys
import types

import vibespatial_raster

MODULES = ("allocators", "buffers", "dispatch", "io", "memory", "ops", "testing", "tiling")


def install() -> None:
    """Maps the original's module names onto this package's (idempotent)."""
    root = sys.modules.get("vibespatial")
    if root is None:
        root = types.ModuleType("vibespatial")
        root.__path__ = []  # a package, so that submodules resolve
        sys.modules["vibespatial"] = root
    root.raster = vibespatial_raster  # type: ignore[attr-defined]
    sys.modules["vibespatial.raster"] = vibespatial_raster
    for name in MODULES:
        sys.modules[f"vibespatial.raster.{name}"] = importlib.import_module(
            f"vibespatial_raster.{name}")
