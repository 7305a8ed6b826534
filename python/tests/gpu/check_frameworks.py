#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The Python package on a real GPU: CuPy, PyTorch and Numba drawing from the pool, zero-copy
interop, and GPU dispatch with a CuPy op. Run by python/tests/gpu/run-gpu-python-check (the
Python step of tools/gpu-check) with the installed package, on the real driver.

Each check prints PASS or FAIL with a reason; the last line is "N passed, N failed, N skipped".
Exit status: 0 all passed, 1 a check failed, 77 there is no usable GPU (nothing was checked).

Every framework runs in a subprocess of its own (PyTorch's allocator must be installed before
its first CUDA allocation, and each check starts from a fresh pool). Never asks for managed
memory; the largest request is 1 GiB.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

CHECKS: dict[str, str] = {}


def check(name: str, framework: str | None = None):
    def register(fn):
        CHECKS[name] = (framework, textwrap.dedent(fn.__doc__))
        return fn

    return register


@check("pool", None)
def _pool():
    """
    from vibespatial_raster import memory, dispatch, OutOfMemoryError
    from vibespatial_raster.memory import DeviceBuffer
    tier = memory.configure_memory_pool()
    assert tier == "B", tier
    before = memory.memory_pool_stats()
    buf = DeviceBuffer(256 << 20)
    s = memory.memory_pool_stats()
    assert s["current_bytes"] == before["current_bytes"] + (256 << 20), s
    buf.close()
    memory.free_pool_memory()
    assert memory.memory_pool_stats()["pool_free_bytes"] == 0
    try:
        DeviceBuffer(1 << 46)  # 64 TiB: more than the device has
    except OutOfMemoryError as e:
        assert isinstance(e, MemoryError) and e.requested_bytes == 1 << 46
    else:
        raise AssertionError("no OutOfMemoryError")
    assert dispatch.available_vram_bytes() > 0
    print("tier", tier, "budget", dispatch.available_vram_bytes())
    """


@check("cupy-allocator", "cupy")
def _cupy():
    """
    import cupy, numpy as np
    from vibespatial_raster import allocators, memory
    cupy.cuda.set_allocator(allocators.cupy_allocator)
    base = memory.memory_pool_stats()["current_bytes"]
    x = cupy.arange(1 << 24, dtype=cupy.float32)  # 64 MiB
    y = x * 2 + 1
    used = memory.memory_pool_stats()["current_bytes"] - base
    assert used >= 2 * (64 << 20), used
    assert float(y[-1]) == 2 * ((1 << 24) - 1) + 1
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        z = cupy.ones(1 << 20, dtype=cupy.float64)
        assert z.data.mem.owner.stream == stream.ptr  # allocated on CuPy's current stream
        total = float(z.sum())
    stream.synchronize()
    assert total == float(1 << 20)
    del x, y, z
    cupy.cuda.Device().synchronize()
    assert memory.memory_pool_stats()["current_bytes"] == base
    print("cupy", cupy.__version__, "peak", memory.memory_pool_stats()["peak_bytes"])
    """


@check("cupy-interop-and-dispatch", "cupy")
def _cupy_interop():
    """
    import cupy, numpy as np
    from vibespatial_raster import dispatch, ops
    from vibespatial_raster.buffers import OwnedRasterArray
    data = np.random.default_rng(0).random((6, 2048, 2048), dtype=np.float32)
    raster = OwnedRasterArray.from_numpy(data, nodata=-1.0).move_to("device")
    ptr = raster.__cuda_array_interface__["data"][0]
    as_cupy = cupy.asarray(raster)
    assert as_cupy.data.ptr == ptr and bool(cupy.allclose(as_cupy, cupy.asarray(data)))
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:  # DLPack export to a consumer that passes its stream
        as_torch = torch.from_dlpack(raster)
        assert as_torch.data_ptr() == ptr and as_torch.is_cuda
    back = OwnedRasterArray.from_device(as_cupy * 3)
    assert np.allclose(back.to_numpy(), data * 3)
    wrapped = OwnedRasterArray.from_device(as_cupy)
    assert wrapped.__cuda_array_interface__["data"][0] == ptr  # no copy
    out = dispatch.dispatch_per_band_gpu(
        raster, lambda b: OwnedRasterArray.from_device(cupy.sqrt(b.device_data()), nodata=-1.0))
    assert np.allclose(out.to_numpy(), np.sqrt(data))
    if ops.ops_built_with_cuda():
        s = ops.band_statistics(raster)
        h = ops.band_statistics(raster.move_to("host"))
        assert [x.count for x in s] == [x.count for x in h]
        assert all(abs(a.mean - b.mean) < 1e-6 for a, b in zip(s, h))
    print("interop ok; device ops built:", ops.ops_built_with_cuda())
    """


@check("torch-allocator", "torch")
def _torch():
    """
    import torch
    from vibespatial_raster import allocators, memory
    allocators.use_torch_allocator()
    base = memory.memory_pool_stats()["current_bytes"]
    t = torch.ones(1 << 24, device="cuda")  # 64 MiB
    u = t * 3
    used = memory.memory_pool_stats()["current_bytes"] - base
    assert used >= 2 * (64 << 20), used
    assert float(u.sum()) == 3.0 * (1 << 24)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        v = torch.full((1 << 20,), 2.0, device="cuda")
        w = (v * v).sum()
    side.synchronize()
    assert float(w) == 4.0 * (1 << 20)
    del t, u, v, w
    torch.cuda.synchronize()
    assert memory.memory_pool_stats()["current_bytes"] == base, memory.memory_pool_stats()
    print("torch", torch.__version__, "total allocations", memory.memory_pool_stats()["total_count"])
    """


@check("numba-emm-plugin", "numba")
def _numba():
    """
    import os
    import numpy as np
    from numba import cuda
    from vibespatial_raster import allocators, memory
    assert os.environ["NUMBA_CUDA_MEMORY_MANAGER"] == "vibespatial_raster.allocators"

    @cuda.jit
    def add_one(a):
        i = cuda.grid(1)
        if i < a.size:
            a[i] += 1

    base = memory.memory_pool_stats()["current_bytes"]
    host = np.arange(1 << 22, dtype=np.float32)
    d = cuda.to_device(host)
    assert memory.memory_pool_stats()["current_bytes"] - base >= host.nbytes
    add_one[(host.size + 255) // 256, 256](d)
    assert np.array_equal(d.copy_to_host(), host + 1)
    info = cuda.current_context().get_memory_info()
    assert 0 < info.free <= info.total
    del d
    import gc; gc.collect()
    cuda.current_context().deallocations.clear()
    assert memory.memory_pool_stats()["current_bytes"] == base
    print("numba plugin ok")
    """


def main() -> int:
    # VSR_GPU_CHECK_ALLOW_EMULATOR=1 runs the checks on the emulator named by
    # VIBESPATIAL_CUDA_DRIVER: only for testing this script on a machine without a GPU.
    on_emulator = os.environ.get("VSR_GPU_CHECK_ALLOW_EMULATOR") == "1"
    accept = "i['available']" if on_emulator else "i['available'] and not i['emulated']"
    probe = subprocess.run(
        [sys.executable, "-c", "import vibespatial_raster as v; i = v.driver_info(); "
         f"print(int({accept}), i['reason'], [d['name'] for d in i['devices']])"],
        capture_output=True, text=True)
    if probe.returncode != 0:
        print(probe.stdout + probe.stderr)
        print("FAIL import: the package does not import")
        print("0 passed, 1 failed, 0 skipped")
        return 1
    if probe.returncode == 0 and not probe.stdout.startswith("1"):
        print("SKIP: no usable GPU:", probe.stdout.strip())
        return 77
    print("GPU:", probe.stdout.strip()[2:])
    passed = failed = skipped = 0
    for name, (framework, code) in CHECKS.items():
        env = dict(os.environ)
        if not on_emulator:
            env.pop("VIBESPATIAL_CUDA_DRIVER", None)  # the real driver
        if framework == "numba":
            env["NUMBA_CUDA_MEMORY_MANAGER"] = "vibespatial_raster.allocators"
        if framework is not None:
            have = subprocess.run([sys.executable, "-c", f"import {framework}"],
                                  capture_output=True, env=env)
            if have.returncode != 0:
                print(f"SKIP {name}: {framework} is not installed")
                skipped += 1
                continue
        try:
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                  env=env, timeout=300)
        except subprocess.TimeoutExpired:
            print(f"FAIL {name}: timed out")
            failed += 1
            continue
        if proc.returncode == 0:
            print(f"PASS {name}: {proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ''}")
            passed += 1
        else:
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
            print(f"FAIL {name}:\n  " + "\n  ".join(tail))
            failed += 1
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
