#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""vibespatial-raster from Python through ctypes: the pool, an OOM handler, and a plan.

Usage:
    VIBESPATIAL_CUDA_DRIVER=/path/to/libvsr-cuda-emulator.so VSR_EMU_DEVICE_MEMORY=67108864 \
        python3 python_ctypes_example.py [/path/to/libvibespatial-raster.so]

The library path comes from the first argument, else $VSR_LIBRARY, else the loader's search
path ("libvibespatial-raster.so"). On the emulator, set VSR_EMU_DEVICE_MEMORY small (64 MiB)
so that the example runs out of device memory; on a real GPU it sizes its blocks from the
memory the device has. Exits nonzero if anything is off (the project's CI runs it).

The OOM handler plays the part of the Python original's gc.collect(): when the device is full,
the pool calls it; it drops the cache's references to DeviceArray objects, whose __del__ gives
their memory back with vsr_device_deallocate, and returns 1 ("I freed something").
"""

import ctypes
import gc
import os
import sys

# ---- The C ABI, declared ----------------------------------------------------------------------

VSR_OK = 0
STATUS_NAMES = {
    0: "VSR_OK",
    1: "VSR_ERROR_INVALID_ARGUMENT",
    2: "VSR_ERROR_OUT_OF_MEMORY",
    3: "VSR_ERROR_CUDA",
    4: "VSR_ERROR_NO_DRIVER",
    5: "VSR_ERROR_OVERFLOW",
    6: "VSR_ERROR_OUT_OF_RANGE",
    7: "VSR_ERROR_INTERNAL",
}
VSR_ERROR_INVALID_ARGUMENT = 1
VSR_ERROR_OUT_OF_MEMORY = 2
VSR_TIER_CAPACITY = 16
MIB = 1 << 20


class PoolStats(ctypes.Structure):
    """vsr_pool_stats (c_api.h). Optional keys come with a has_ flag."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("tier", ctypes.c_char * VSR_TIER_CAPACITY),
        ("configured", ctypes.c_int32),
        ("device", ctypes.c_int32),
        ("current_bytes", ctypes.c_uint64),
        ("current_count", ctypes.c_uint64),
        ("peak_bytes", ctypes.c_uint64),
        ("peak_count", ctypes.c_uint64),
        ("total_bytes", ctypes.c_uint64),
        ("total_count", ctypes.c_uint64),
        ("pool_size", ctypes.c_uint64),
        ("used_bytes", ctypes.c_uint64),
        ("free_bytes", ctypes.c_uint64),
        ("has_current_bytes", ctypes.c_int32),
        ("has_current_count", ctypes.c_int32),
        ("has_peak_bytes", ctypes.c_int32),
        ("has_peak_count", ctypes.c_int32),
        ("has_total_bytes", ctypes.c_int32),
        ("has_total_count", ctypes.c_int32),
        ("has_pool_size", ctypes.c_int32),
        ("has_used_bytes", ctypes.c_int32),
        ("has_free_bytes", ctypes.c_int32),
        ("reserved0", ctypes.c_int32),
        ("mapped_bytes", ctypes.c_uint64),
        ("reserved_bytes", ctypes.c_uint64),
        ("pool_free_bytes", ctypes.c_uint64),
        ("largest_free_block", ctypes.c_uint64),
        ("oom_recoveries", ctypes.c_uint64),
        ("granularity", ctypes.c_uint64),
        ("small_block_limit", ctypes.c_uint64),
    ]

    OPTIONAL = ("current_bytes", "current_count", "peak_bytes", "peak_count", "total_bytes",
                "total_count", "pool_size", "used_bytes", "free_bytes")
    ALWAYS = ("mapped_bytes", "reserved_bytes", "pool_free_bytes", "largest_free_block",
              "oom_recoveries", "granularity", "small_block_limit")

    def as_dict(self):
        """The seed's dict form: only the keys the tier reports."""
        d = {"tier": self.tier.decode(), "configured": bool(self.configured)}
        for key in self.OPTIONAL:
            if getattr(self, "has_" + key):
                d[key] = getattr(self, key)
        for key in self.ALWAYS:
            d[key] = getattr(self, key)
        return d


class PlanOptions(ctypes.Structure):
    """vsr_plan_options (c_api.h); fill with vsr_plan_options_init."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("band_count", ctypes.c_int32),
        ("buffers_per_band", ctypes.c_int32),
        ("scratch_bytes", ctypes.c_uint64),
        ("halo", ctypes.c_int32),
        ("per_band", ctypes.c_int32),
        ("vram_budget", ctypes.c_uint64),
        ("has_vram_budget", ctypes.c_int32),
        ("reserved0", ctypes.c_int32),
    ]


class RasterPlan(ctypes.Structure):
    """vsr_raster_plan (c_api.h)."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("strategy", ctypes.c_int32),
        ("halo", ctypes.c_int32),
        ("has_tile_shape", ctypes.c_int32),
        ("bands_per_pass", ctypes.c_int32),
        ("tile_height", ctypes.c_int64),
        ("tile_width", ctypes.c_int64),
        ("n_tiles", ctypes.c_int64),
        ("estimated_vram_per_tile", ctypes.c_uint64),
        ("fits_budget", ctypes.c_int32),
        ("reserved0", ctypes.c_int32),
    ]


# int (*)(size_t requested_bytes, void* user_data)
OOM_HANDLER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p)


class VsrError(RuntimeError):
    def __init__(self, function, status, message, cuda_error):
        super().__init__(f"{function}: {STATUS_NAMES.get(status, status)}: {message}")
        self.status = status
        self.cuda_error = cuda_error


def load(path):
    lib = ctypes.CDLL(path)
    sig = {
        "vsr_version": (ctypes.c_char_p, []),
        "vsr_last_error_message": (ctypes.c_char_p, []),
        "vsr_last_cuda_error": (ctypes.c_int, []),
        "vsr_configure_memory_pool": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_size_t]),
        "vsr_free_pool_memory": (ctypes.c_int, []),
        "vsr_memory_pool_stats": (ctypes.c_int, [ctypes.POINTER(PoolStats)]),
        "vsr_device_allocate": (ctypes.c_int, [ctypes.c_size_t, ctypes.c_void_p,
                                               ctypes.POINTER(ctypes.c_void_p)]),
        "vsr_device_deallocate": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t,
                                                 ctypes.c_void_p]),
        "vsr_add_oom_handler": (ctypes.c_int, [OOM_HANDLER, ctypes.c_void_p,
                                               ctypes.POINTER(ctypes.c_uint64)]),
        "vsr_remove_oom_handler": (ctypes.c_int, [ctypes.c_uint64]),
        "vsr_available_vram_bytes": (ctypes.c_int, [ctypes.POINTER(ctypes.c_uint64)]),
        "vsr_max_bands_for_budget": (ctypes.c_int, [ctypes.c_int64, ctypes.c_int64, ctypes.c_int,
                                                    ctypes.c_int, ctypes.c_uint64, ctypes.c_int,
                                                    ctypes.c_uint64,
                                                    ctypes.POINTER(ctypes.c_int)]),
        "vsr_plan_options_init": (ctypes.c_int, [ctypes.POINTER(PlanOptions)]),
        "vsr_analyze_raster_plan": (ctypes.c_int, [ctypes.c_int64, ctypes.c_int64, ctypes.c_int,
                                                   ctypes.POINTER(PlanOptions),
                                                   ctypes.POINTER(RasterPlan)]),
        "vsr_dtype_from_name": (ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int)]),
        "vsr_tiling_strategy_name": (ctypes.c_int, [ctypes.c_int,
                                                    ctypes.POINTER(ctypes.c_char_p)]),
    }
    for name, (restype, argtypes) in sig.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


def check(lib, function, status):
    """Raises VsrError for a failing status, with the thread's last error message."""
    if status != VSR_OK:
        raise VsrError(function, status, lib.vsr_last_error_message().decode(),
                       lib.vsr_last_cuda_error())


# ---- A tiny device array whose memory goes back to the pool when it dies -----------------------

class DeviceArray:
    def __init__(self, lib, nbytes):
        self._lib = lib
        self.nbytes = nbytes
        ptr = ctypes.c_void_p()
        check(lib, "vsr_device_allocate", lib.vsr_device_allocate(nbytes, None, ctypes.byref(ptr)))
        self.ptr = ptr.value
        DeviceArray.live += 1

    def __del__(self):
        if self.ptr is not None:
            status = self._lib.vsr_device_deallocate(self.ptr, self.nbytes, None)
            self.ptr = None
            DeviceArray.live -= 1
            if status != VSR_OK:  # __del__ cannot raise: remember the failure instead
                DeviceArray.errors.append(self._lib.vsr_last_error_message().decode())

    live = 0
    errors = []


def stats(lib):
    s = PoolStats()
    s.struct_size = ctypes.sizeof(PoolStats)
    check(lib, "vsr_memory_pool_stats", lib.vsr_memory_pool_stats(ctypes.byref(s)))
    return s


def expect(condition, what):
    if not condition:
        raise AssertionError(what)


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("VSR_LIBRARY",
                                                                 "libvibespatial-raster.so")
    lib = load(path)
    print(f"vibespatial-raster {lib.vsr_version().decode()} from {path}")

    tier = ctypes.create_string_buffer(VSR_TIER_CAPACITY)
    check(lib, "vsr_configure_memory_pool", lib.vsr_configure_memory_pool(tier, len(tier)))
    print(f"tier {tier.value.decode()}")
    if tier.value != b"B":
        print("this example needs tier B (the OOM recovery chain); skipped")
        return 77

    # Errors come back as statuses with a message, never as crashes.
    bad = lib.vsr_device_deallocate(ctypes.c_void_p(0x1000), 64, None)
    expect(bad == VSR_ERROR_INVALID_ARGUMENT, f"foreign pointer: status {bad}")
    expect(lib.vsr_last_error_message().startswith(b"vsr_device_deallocate: "),
           "no error message")
    print(f"expected error: {lib.vsr_last_error_message().decode()}")

    # Size the blocks from the device: a cache of 3/4 of it, then a request of half of it.
    available = ctypes.c_uint64()
    check(lib, "vsr_available_vram_bytes", lib.vsr_available_vram_bytes(ctypes.byref(available)))
    device_bytes = int(available.value / 0.85)
    granule = max(stats(lib).granularity, 2 * MIB)
    cache_bytes = (device_bytes * 3 // 4) // granule * granule
    request_bytes = (device_bytes // 2) // granule * granule
    print(f"device ~{device_bytes // MIB} MiB: caching {cache_bytes // MIB} MiB, "
          f"then asking for {request_bytes // MIB} MiB")

    cache = {"tile-0": DeviceArray(lib, cache_bytes)}

    # Without a handler the request fails: the cache holds the memory.
    ptr = ctypes.c_void_p()
    status = lib.vsr_device_allocate(request_bytes, None, ctypes.byref(ptr))
    expect(status == VSR_ERROR_OUT_OF_MEMORY, f"expected OOM, got status {status}")
    print(f"without a handler: {lib.vsr_last_error_message().decode()}")

    handler_calls = []

    def on_oom(requested_bytes, _user_data):
        # The gc.collect() analogue: drop the cached arrays; their __del__ frees device memory.
        # The pool holds no lock here, so vsr_device_deallocate may be called.
        handler_calls.append(requested_bytes)
        freed = bool(cache)
        cache.clear()
        gc.collect()
        return 1 if freed else 0

    handler = OOM_HANDLER(on_oom)  # keep a reference for as long as it is registered
    handler_id = ctypes.c_uint64()
    check(lib, "vsr_add_oom_handler",
          lib.vsr_add_oom_handler(handler, None, ctypes.byref(handler_id)))

    before = stats(lib)
    array = DeviceArray(lib, request_bytes)  # runs out, calls on_oom, retries, succeeds
    after = stats(lib)
    print(f"with the handler: allocated {request_bytes // MIB} MiB at {array.ptr:#x} "
          f"after {len(handler_calls)} handler call(s)")
    expect(handler_calls == [request_bytes], f"handler calls {handler_calls}")
    expect(not cache and DeviceArray.live == 1, "the cache was not released")
    expect(after.oom_recoveries == before.oom_recoveries + 1, "no OOM recovery counted")
    expect(after.current_bytes == request_bytes and after.current_count == 1,
           f"live bytes {after.current_bytes}")

    # The planner, with an explicit budget.
    dtype = ctypes.c_int()
    check(lib, "vsr_dtype_from_name", lib.vsr_dtype_from_name(b"float32", ctypes.byref(dtype)))
    opts = PlanOptions()
    check(lib, "vsr_plan_options_init", lib.vsr_plan_options_init(ctypes.byref(opts)))
    opts.band_count = 4
    opts.has_vram_budget = 1
    opts.vram_budget = 80_000_000
    plan = RasterPlan()
    plan.struct_size = ctypes.sizeof(RasterPlan)
    check(lib, "vsr_analyze_raster_plan",
          lib.vsr_analyze_raster_plan(20000, 20000, dtype, ctypes.byref(opts),
                                      ctypes.byref(plan)))
    strategy = ctypes.c_char_p()
    check(lib, "vsr_tiling_strategy_name",
          lib.vsr_tiling_strategy_name(plan.strategy, ctypes.byref(strategy)))
    print(f"plan for 4 x 20000 x 20000 float32 in 80 MB: {strategy.value.decode()}, "
          f"tiles {plan.tile_height} x {plan.tile_width}, {plan.n_tiles} of them, "
          f"{plan.estimated_vram_per_tile} bytes per pass")
    expect(strategy.value == b"tiled" and plan.n_tiles > 1, "unexpected plan")
    bands = ctypes.c_int()
    check(lib, "vsr_max_bands_for_budget",
          lib.vsr_max_bands_for_budget(1000, 1000, dtype, 2, 0, 1, 80_000_000,
                                       ctypes.byref(bands)))
    expect(bands.value == 10, f"max bands {bands.value}")

    # Clean up: unregister, free, give the pages back.
    check(lib, "vsr_remove_oom_handler", lib.vsr_remove_oom_handler(handler_id))
    del array
    gc.collect()
    expect(DeviceArray.live == 0 and not DeviceArray.errors, f"errors {DeviceArray.errors}")
    check(lib, "vsr_free_pool_memory", lib.vsr_free_pool_memory())
    final = stats(lib)
    print("stats:", final.as_dict())
    expect(final.current_bytes == 0 and final.pool_free_bytes == 0, "memory left behind")
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
