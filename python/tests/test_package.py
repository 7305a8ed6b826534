# SPDX-License-Identifier: Apache-2.0
"""The installed package: its modules, exports, stubs, errors and what travels with it."""

from __future__ import annotations

import ast
import ctypes
import importlib
import os
import pathlib
import shutil
import subprocess

import pytest

import vibespatial_raster as vsr
from vibespatial_raster import _core, testing

PKG_DIR = pathlib.Path(vsr.__file__).parent

SEED_NAMES = {
    "memory": ["configure_memory_pool", "free_pool_memory", "memory_pool_stats",
               "add_oom_handler", "remove_oom_handler"],
    "dispatch": ["available_vram_bytes", "max_bands_for_budget", "analyze_raster_plan",
                 "plan_from_metadata", "dispatch_per_band_cpu", "dispatch_per_band_gpu"],
    "buffers": ["TilingStrategy", "RasterPlan", "RasterMetadata", "OwnedRasterArray"],
    "ops": ["band_statistics", "rescale", "clip", "fill_nodata", "normalized_difference",
            "histogram", "focal_mean_3x3"],
    "io": ["read_raster_metadata", "read_raster", "write_raster", "process_raster_streamed"],
    "allocators": ["cupy_allocator", "torch_allocator", "NumbaEMMPlugin"],
    "tiling": ["dispatch_tiled", "dispatch_tiled_halo"],
}


@pytest.mark.parametrize("module", sorted(SEED_NAMES))
def test_modules_have_their_names(module):
    mod = importlib.import_module(f"vibespatial_raster.{module}")
    for name in SEED_NAMES[module]:
        assert name in mod.__all__, name
    for name in mod.__all__:
        if name == "NumbaEMMPlugin":
            continue  # made on first access (it subclasses Numba's class)
        assert getattr(mod, name) is not None, name


def test_owned_raster_array_members():
    members = ["from_numpy", "from_device", "to_numpy", "move_to", "device_data", "device_band",
               "from_band_stack", "band_count", "height", "width", "shape", "dtype", "nodata",
               "affine", "crs", "residency", "nodata_mask", "bounds", "metadata"]
    for name in members:
        assert hasattr(vsr.OwnedRasterArray, name), name


def test_version_matches_the_library():
    assert vsr.__version__ == _core.__version__
    lib = ctypes.CDLL(_core.__file__)
    lib.vsr_version.restype = ctypes.c_char_p
    assert lib.vsr_version().decode() == vsr.__version__


def test_every_module_of_the_source_tree_is_installed():
    # The install lists of python/meson.build name each file: a module missing there is missing
    # from the wheel, and its package fails to import once installed.
    source = pathlib.Path(__file__).resolve().parents[1] / "vibespatial_raster"
    if not source.is_dir():
        pytest.skip("the source tree is not beside the tests")
    modules = sorted(p.relative_to(source) for p in source.rglob("*.py"))
    assert pathlib.Path("dask", "__init__.py") in modules
    missing = [str(m) for m in modules if not (PKG_DIR / m).is_file()]
    assert missing == []


def test_typing_files_ship():
    assert (PKG_DIR / "py.typed").is_file()
    assert (PKG_DIR / "_core.pyi").is_file()


def _stub_names(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def test_core_stub_lists_the_module():
    stub = _stub_names(PKG_DIR / "_core.pyi")
    public = {n for n in dir(_core) if not n.startswith("_")} | {"__version__"}
    assert stub == public


def test_shared_library_exports_only_its_entry_points():
    lib = ctypes.CDLL(_core.__file__)
    for name in ("PyInit__core", "vsr_torch_malloc", "vsr_torch_free", "vsr_memcpy",
                 "vsr_device_allocate", "vsr_analyze_raster_plan"):
        assert hasattr(lib, name), name
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    out = subprocess.run([nm, "-D", "--defined-only", _core.__file__], capture_output=True,
                         text=True, check=True).stdout
    exported = {line.split()[-1] for line in out.splitlines() if line.strip()}
    # The C++ API and nanobind stay inside: another copy of the library in the process (the
    # ctypes route, a C++ extension) cannot interpose on the pool the package uses.
    assert exported, out
    assert {s for s in exported if s != "PyInit__core" and not s.startswith("vsr_")} == set()


def test_errors_are_python_errors():
    assert issubclass(vsr.OutOfMemoryError, MemoryError)
    assert issubclass(vsr.CudaError, RuntimeError)
    assert issubclass(vsr.DriverUnavailableError, vsr.CudaError)
    e = vsr.CudaError("boom", 999, "CUDA_ERROR_UNKNOWN")
    assert (e.code, e.name, str(e)) == (999, "CUDA_ERROR_UNKNOWN", "boom")
    import pickle

    e2 = pickle.loads(pickle.dumps(e))
    assert (type(e2), e2.code, e2.name) == (vsr.CudaError, 999, "CUDA_ERROR_UNKNOWN")
    o = pickle.loads(pickle.dumps(vsr.OutOfMemoryError("full", 123)))
    assert o.requested_bytes == 123


def test_emulator_ships_and_is_the_loaded_driver():
    path = testing.emulator_path()
    assert os.path.isfile(path) and path.startswith(str(PKG_DIR))
    info = vsr.driver_info()
    assert info["available"] and info["emulated"]
    assert info["library"] == path
    assert b"vsr-cuda-emulator" in testing.emulator().vsr_emu_describe()
