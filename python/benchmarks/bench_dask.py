# SPDX-License-Identifier: Apache-2.0
"""vsr-bench dask: the same Dask job on a LocalCluster of 1 and of 2 worker processes, side by
side, and the ratio.

Both clusters stay up and the timed runs alternate between them in pairs (1, 2, 1, 2, ...,
--repeat pairs, after one untimed run on each), so that a change in the load of a shared machine
hits both sides of a pair alike; the ratio reported is the median of the pairs' ratios, with
their spread (min, max), beside each side's median time.

The job: a 3x3 focal mean applied --passes times in a row to each tile (halo = passes, the
halo exchanged by map_overlap), over a generated float32 raster that the workers make and keep
in memory first, so the timing covers the op and the halo exchange, not a transfer from the
client; the results stay on the workers (persist). Building the graph (map_tiles, which also
runs the op once on a small block on a worker to learn its dtype) is timed apart.
process_geotiff is timed whole.

Fairness: each worker runs one task at a time (threads_per_worker=1) with one OpenMP thread
(Dask's Nanny sets OMP_NUM_THREADS=1; omp_get_max_threads() is checked on every worker), so 1
worker uses one core and 2 workers two: the ratio is what a second worker process adds, the
same job and the same per-worker setup on both sides. (One worker with 2 OpenMP threads would
compare Dask with OpenMP, not 1 worker with 2.) The scheduler and the client run in this
process, on the same cores as the workers. The CPU seconds the workers and this process used
are printed for each side: "cores obtained" (worker CPU / wall) shows how much of the machine
a side actually got, which on a loaded machine, not the job, bounds the ratio.

Without a GPU the ops run on the CPU (the host driver emulator is loaded, as in the tests, and
says so); the load average is printed before and after, since the machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
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


def worker_threads() -> dict[str, Any]:
    """Run on a worker: its OMP_NUM_THREADS and the OpenMP runtime's max threads (the libgomp
    the package's ops link), and its CPU seconds so far."""
    import ctypes

    try:
        omp: int | str = int(ctypes.CDLL("libgomp.so.1").omp_get_max_threads())
    except (OSError, AttributeError) as e:
        omp = f"unknown ({e})"
    return {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), "omp_max_threads": omp}


def worker_cpu() -> float:
    """Run on a worker: the CPU seconds its process has used (all its threads)."""
    return time.process_time()


def autogroup_note() -> str | None:
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as f:
            on = f.read().strip() == "1"
    except OSError:
        return None
    if not on:
        return None
    return ("the kernel's autogroup scheduling is on: CPU is shared between sessions, not "
            "processes, so while other sessions are busy both workers together get about one "
            "session's share and the ratio falls toward 1 whatever the job does")


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vsr-bench dask", description=__doc__.split("\n")[0])
    parser.add_argument("--bands", type=int, default=8)
    # 4096: the 2-worker run takes ~3 s on a 2-core host, long enough that Dask's fixed
    # cost per run (sending the graph, the first tasks' start, the last one's result) is a small
    # part of it; at 2048 (~0.8 s) it is a tenth and the ratio reads ~0.1 lower.
    parser.add_argument("--size", type=int, default=4096, help="raster side in pixels")
    parser.add_argument("--passes", type=int, default=3, help="focal means per tile")
    parser.add_argument("--chunks", type=int, default=16, help="chunks of the job (both runs)")
    parser.add_argument("--repeat", type=int, default=7,
                        help="timed pairs (1 worker, then 2), after one untimed run on each")
    parser.add_argument("--geotiff", action="store_true", help="also time process_geotiff")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")

    from vibespatial_raster import testing

    if "VIBESPATIAL_CUDA_DRIVER" not in os.environ:
        testing.use_emulator()
    import dask.array as da
    import distributed

    from vibespatial_raster import dask as vd
    from vibespatial_raster import io, ops
    from vibespatial_raster.buffers import OwnedRasterArray, RasterMetadata

    logging.getLogger("distributed").setLevel(logging.ERROR)  # no INFO lines when closing
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
    clusters: list[Any] = []
    clients: list[Any] = []
    sides: list[tuple[int, Any, Any]] = []
    runs: dict[int, list[dict[str, float]]] = {1: [], 2: []}
    gruns: dict[int, list[float]] = {1: [], 2: []}
    threads: dict[int, list[dict[str, Any]]] = {}
    modes: set[str] = set()

    def timed(n: int, data: Any, client: Any, record: bool) -> None:
        with client.as_current():
            t0 = time.perf_counter()
            job = vd.map_tiles(data, op, halo=passes, nodata=float("nan"), chunks=None)
            t1 = time.perf_counter()
            cpu0 = client.run(worker_cpu)
            here0 = time.process_time()
            t2 = time.perf_counter()
            out = job.persist()
            distributed.wait(out)
            t3 = time.perf_counter()
            here1 = time.process_time()
            cpu1 = client.run(worker_cpu)
            del out, job
            gt = 0.0
            if args.geotiff:
                g0 = time.perf_counter()
                vd.process_geotiff(src_tif, os.path.join(tmp, f"out{n}.tif"), op,
                                   halo=passes, chunks=chunks, compress=None, progress=False)
                gt = time.perf_counter() - g0
        if record:
            wcpu = sum(cpu1[a] - cpu0[a] for a in cpu0)
            runs[n].append({"seconds": t3 - t2, "graph_seconds": t1 - t0,
                            "worker_cpu_seconds": wcpu, "client_cpu_seconds": here1 - here0})
            if args.geotiff:
                gruns[n].append(gt)

    try:
        for n in (1, 2):
            clusters.append(distributed.LocalCluster(n_workers=n, threads_per_worker=1,
                                                     processes=True, dashboard_address=":0",
                                                     silence_logs=logging.ERROR))
            clients.append(distributed.Client(clusters[-1], set_as_default=False))
            vd.register(clients[-1])
        for n, client in zip((1, 2), clients):
            threads[n] = list(client.run(worker_threads).values())
            with client.as_current():
                modes |= {s["mode"] for s in vd.memory_pool_stats().values()}
                data = client.persist(da.map_blocks(sample_block, chunks=chunks,
                                                    dtype=np.float32,
                                                    meta=np.empty((0, 0, 0), np.float32)))
                distributed.wait(data)
                if args.geotiff and n == 1:
                    io.write_raster(src_tif, OwnedRasterArray.from_numpy(
                        data.compute(), nodata=float("nan"), affine=(10, 0, 0, 0, -10, 0),
                        crs="EPSG:32633"), compress=None)
            sides.append((n, data, client))
        for n, data, client in sides:
            timed(n, data, client, record=False)  # warm-up: first calls, imports
        for _ in range(args.repeat):
            for n, data, client in sides:  # 1, 2, 1, 2, ...
                timed(n, data, client, record=True)
    finally:
        for c in clients + clusters:
            c.close()
    load_after = os.getloadavg()

    ratios = [a["seconds"] / b["seconds"] for a, b in zip(runs[1], runs[2])]
    rows: list[dict[str, Any]] = []
    for n in (1, 2):
        secs = [r["seconds"] for r in runs[n]]
        wcpu = [r["worker_cpu_seconds"] for r in runs[n]]
        cores = [r["worker_cpu_seconds"] / r["seconds"] for r in runs[n]]
        row: dict[str, Any] = {
            "workers": n, "mode": "/".join(sorted(modes)),
            "seconds": spread(secs),
            "mpx_per_s": pixels / statistics.median(secs) / 1e6,
            "worker_cpu_seconds": spread(wcpu),
            "cores_obtained": spread(cores),
            "client_cpu_seconds": spread([r["client_cpu_seconds"] for r in runs[n]]),
            "graph_seconds": spread([r["graph_seconds"] for r in runs[n]]),
            "worker_threads": threads[n],
        }
        if args.geotiff:
            row["geotiff_seconds"] = spread(gruns[n])
            row["geotiff_mpx_per_s"] = pixels / statistics.median(gruns[n]) / 1e6
        rows.append(row)
    job = (f"focal mean x{passes} (halo {passes}), {args.bands} x {args.size} x {args.size} "
           f"float32, {n_chunks} chunks")
    omp = sorted({str(t["omp_max_threads"]) for n in (1, 2) for t in threads[n]})
    result: dict[str, Any] = {
        "job": job, "cores": os.cpu_count(), "load_before": load_before,
        "load_after": load_after, "pairs": args.repeat, "rows": rows,
        "ratio": spread(ratios), "pair_ratios": ratios,
        "omp_max_threads_per_worker": omp, "autogroup_note": autogroup_note(),
    }
    if args.geotiff:
        result["geotiff_ratio"] = spread([a / b for a, b in zip(gruns[1], gruns[2])])
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
        return 0

    def med(row: dict[str, Any], key: str) -> float:
        return float(row[key]["median"])

    def rng(row: dict[str, Any], key: str) -> str:
        return f"{row[key]['min']:.2f}-{row[key]['max']:.2f}"

    r1, r2 = rows
    ratio = result["ratio"]
    print(f"vsr-bench dask: {job}; ops on the {r1['mode'].upper()}")
    print(f"machine: {os.cpu_count()} cores, load average before "
          f"{' '.join(f'{v:.2f}' for v in load_before)}, after "
          f"{' '.join(f'{v:.2f}' for v in load_after)}")
    print(f"each worker: 1 task at a time, OpenMP max threads {'/'.join(omp)} (checked on every "
          f"worker): 1 worker = 1 core, 2 workers = 2; scheduler and client in this process")
    note = result["autogroup_note"]
    if note:
        print(f"note: {note}")
    print(f"{args.repeat} pairs, alternating 1, 2, 1, 2, ...; medians [min-max]")
    print(f"{'':28s}{'1 worker':>14s}{'2 workers':>14s}{'ratio':>9s}")
    print(f"{'map_tiles (Mpx/s)':28s}{r1['mpx_per_s']:14.1f}{r2['mpx_per_s']:14.1f}"
          f"{ratio['median']:8.2f}x  [{ratio['min']:.2f}-{ratio['max']:.2f}]")
    print(f"{'  run (s)':28s}{med(r1, 'seconds'):14.3f}{med(r2, 'seconds'):14.3f}"
          f"   [{rng(r1, 'seconds')} | {rng(r2, 'seconds')}]")
    # ratio = (cores obtained 2 / 1) / (worker CPU 2 / 1): what the machine gave each side,
    # over what the second worker costs in CPU (halo transfers, two caches, Dask's bookkeeping).
    print(f"{'  worker CPU (s)':28s}{med(r1, 'worker_cpu_seconds'):14.3f}"
          f"{med(r2, 'worker_cpu_seconds'):14.3f}"
          f"{med(r2, 'worker_cpu_seconds') / med(r1, 'worker_cpu_seconds'):8.2f}x")
    print(f"{'  cores obtained':28s}{med(r1, 'cores_obtained'):14.2f}"
          f"{med(r2, 'cores_obtained'):14.2f}"
          f"{med(r2, 'cores_obtained') / med(r1, 'cores_obtained'):8.2f}x  "
          f"[{rng(r1, 'cores_obtained')} | {rng(r2, 'cores_obtained')}]")
    print(f"{'  scheduler+client CPU (s)':28s}{med(r1, 'client_cpu_seconds'):14.3f}"
          f"{med(r2, 'client_cpu_seconds'):14.3f}")
    print(f"{'  building the graph (s)':28s}{med(r1, 'graph_seconds'):14.3f}"
          f"{med(r2, 'graph_seconds'):14.3f}")
    if args.geotiff:
        g = result["geotiff_ratio"]
        print(f"{'process_geotiff (Mpx/s)':28s}{r1['geotiff_mpx_per_s']:14.1f}"
              f"{r2['geotiff_mpx_per_s']:14.1f}{g['median']:8.2f}x  "
              f"[{g['min']:.2f}-{g['max']:.2f}]")
    print("pair ratios: " + " ".join(f"{v:.2f}" for v in ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
