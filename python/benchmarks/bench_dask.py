# SPDX-License-Identifier: Apache-2.0
"""vsr-bench dask: the same Dask job on a LocalCluster of 1 and of 2 worker processes, side by
side, and the ratio.

Both clusters stay up and the timed runs alternate between them (--repeat each), so that a
change in the load of a shared machine hits both sides alike; each side keeps its best run.

The job: a 3x3 focal mean applied --passes times in a row to each tile (halo = passes, the
halo exchanged by map_overlap), over a generated float32 raster that the workers make and keep
in memory first, so the timing covers the op and the halo exchange, not the client's transfer;
building the graph (map_tiles, which also runs the op once on a small block to learn its
dtype) is timed apart. process_geotiff is timed whole.
Each worker has one thread and one OpenMP thread (Dask's Nanny sets OMP_NUM_THREADS=1), so
1 worker uses one core and 2 workers two. --geotiff adds the streamed GeoTIFF job
(process_geotiff: parallel reads, the op, per-chunk writes, one serial merge).

Without a GPU the ops run on the CPU (the host driver emulator is loaded, as in the tests, and
says so); the load average is printed before and after, since the machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any

import numpy as np


def sample_block(block_info=None):
    """A deterministic float32 block (ramps plus a hash texture, ~1% NaN) for its location."""
    info = block_info[None]
    (b0, b1), (r0, r1), (c0, c1) = info["array-location"]
    b, y, x = np.meshgrid(np.arange(b0, b1), np.arange(r0, r1), np.arange(c0, c1),
                          indexing="ij")
    h = ((b * 7919 + y * 104729 + x) * 2654435761) & 0xFFFFFFFF
    h ^= h >> 15
    v = (100.0 * (b + 1) + ((x + 2 * y) % 1000) * 0.5 + (h % 64) * 0.25).astype(np.float32)
    v[h % 100 == 0] = np.nan
    return v


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vsr-bench dask", description=__doc__.split("\n")[0])
    parser.add_argument("--bands", type=int, default=8)
    parser.add_argument("--size", type=int, default=2048, help="raster side in pixels")
    parser.add_argument("--passes", type=int, default=3, help="focal means per tile")
    parser.add_argument("--chunks", type=int, default=16, help="chunks of the job (both runs)")
    parser.add_argument("--repeat", type=int, default=5,
                        help="timed runs of each side, alternating; the best is kept")
    parser.add_argument("--geotiff", action="store_true", help="also time process_geotiff")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    from vibespatial_raster import testing

    if "VIBESPATIAL_CUDA_DRIVER" not in os.environ:
        testing.use_emulator()
    import dask.array as da
    import distributed

    from vibespatial_raster import dask as vd
    from vibespatial_raster import io, ops
    from vibespatial_raster.buffers import OwnedRasterArray, RasterMetadata

    passes = args.passes

    def op(r):
        for _ in range(passes):
            r = ops.focal_mean_3x3(r)
        return r

    shape = (args.bands, args.size, args.size)
    meta = RasterMetadata(args.size, args.size, args.bands, np.dtype(np.float32), float("nan"),
                          (10.0, 0.0, 0.0, 0.0, -10.0, 0.0), None)
    # The same chunks for both runs: planned as for CPU workers (Dask's chunk size), split
    # into at least --chunks.
    chunks = vd.plan_chunks(meta, halo=passes, vram_budget=0, min_chunks=args.chunks)
    n_chunks = len(chunks[0]) * len(chunks[1]) * len(chunks[2])
    pixels = float(np.prod(shape))
    load_before = os.getloadavg()
    tmp = tempfile.mkdtemp(prefix="vsr-bench-dask-")
    src_tif = os.path.join(tmp, "in.tif")
    # Both clusters stay up and the timed runs alternate (1, 2, 1, 2, ...), so a change in the
    # machine's load hits both sides alike; each side keeps its best run.
    clusters: list[Any] = []
    clients: list[Any] = []
    sides: list[tuple[int, Any, Any]] = []
    try:
        for n in (1, 2):
            clusters.append(distributed.LocalCluster(n_workers=n, threads_per_worker=1,
                                                     processes=True, dashboard_address=":0",
                                                     silence_logs=50))
            clients.append(distributed.Client(clusters[-1], set_as_default=False))
            vd.register(clients[-1])
        for n, client in zip((1, 2), clients):
            with client.as_current():
                data = client.persist(da.map_blocks(sample_block, chunks=chunks,
                                                    dtype=np.float32,
                                                    meta=np.empty((0, 0, 0), np.float32)))
                distributed.wait(data)
                if args.geotiff and n == 1:
                    io.write_raster(src_tif, OwnedRasterArray.from_numpy(
                        data.compute(), nodata=float("nan"), affine=(10, 0, 0, 0, -10, 0),
                        crs="EPSG:32633"), compress=None)
            sides.append((n, data, client))
        best = {1: float("inf"), 2: float("inf")}
        gbest = {1: float("inf"), 2: float("inf")}
        build = {1: float("inf"), 2: float("inf")}  # map_tiles: the graph and the dtype probe
        modes: set[str] = set()
        for _ in range(args.repeat):
            for n, data, client in sides:
                with client.as_current():
                    modes |= {s["mode"] for s in vd.memory_pool_stats().values()}
                    t0 = time.perf_counter()
                    job = vd.map_tiles(data, op, halo=passes, nodata=float("nan"), chunks=None)
                    t1 = time.perf_counter()
                    out = job.persist()
                    distributed.wait(out)
                    best[n] = min(best[n], time.perf_counter() - t1)
                    build[n] = min(build[n], t1 - t0)
                    del out, job
                    if args.geotiff:
                        t0 = time.perf_counter()
                        vd.process_geotiff(src_tif, os.path.join(tmp, f"out{n}.tif"), op,
                                           halo=passes, chunks=chunks, compress=None,
                                           progress=False)
                        gbest[n] = min(gbest[n], time.perf_counter() - t0)
    finally:
        for c in clients + clusters:
            c.close()
    rows: list[dict[str, Any]] = []
    for n in (1, 2):
        row: dict[str, Any] = {"workers": n, "mode": "/".join(sorted(modes)),
                               "seconds": best[n], "mpx_per_s": pixels / best[n] / 1e6,
                               "graph_seconds": build[n]}
        if args.geotiff:
            row["geotiff_seconds"] = gbest[n]
            row["geotiff_mpx_per_s"] = pixels / gbest[n] / 1e6
        rows.append(row)
    load_after = os.getloadavg()
    ratio = rows[1]["mpx_per_s"] / rows[0]["mpx_per_s"]
    job = (f"focal mean x{passes} (halo {passes}), {args.bands} x {args.size} x {args.size} "
           f"float32, {n_chunks} chunks")
    result: dict[str, Any] = {"job": job, "cores": os.cpu_count(), "load_before": load_before,
                              "load_after": load_after, "rows": rows, "ratio": ratio}
    if args.geotiff:
        result["geotiff_ratio"] = rows[1]["geotiff_mpx_per_s"] / rows[0]["geotiff_mpx_per_s"]
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
        return 0
    print(f"vsr-bench dask: {result['job']}; ops on the {rows[0]['mode'].upper()}")
    print(f"machine: {os.cpu_count()} cores, load average before "
          f"{' '.join(f'{v:.2f}' for v in load_before)}, after "
          f"{' '.join(f'{v:.2f}' for v in load_after)}")
    print(f"{'':24s}{'1 worker':>14s}{'2 workers':>14s}{'ratio':>9s}")
    print(f"{'map_tiles (Mpx/s)':24s}{rows[0]['mpx_per_s']:14.1f}{rows[1]['mpx_per_s']:14.1f}"
          f"{ratio:8.2f}x")
    print(f"{'  best run (s)':24s}{rows[0]['seconds']:14.3f}{rows[1]['seconds']:14.3f}")
    print(f"{'  building the graph (s)':24s}{rows[0]['graph_seconds']:14.3f}"
          f"{rows[1]['graph_seconds']:14.3f}")
    if args.geotiff:
        print(f"{'process_geotiff (Mpx/s)':24s}{rows[0]['geotiff_mpx_per_s']:14.1f}"
              f"{rows[1]['geotiff_mpx_per_s']:14.1f}{result['geotiff_ratio']:8.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
