# SPDX-License-Identifier: Apache-2.0
"""tools/vsr-bench-dask (python/benchmarks/bench_dask.py) runs end to end on a small job and
reports what it promises: both sides' throughput, the pairs' ratios and their median, each
side's worker CPU and cores obtained, and one OpenMP thread per worker. Timings are not
asserted (the machine is shared); only that they were measured."""

from __future__ import annotations

import json
import pathlib
import statistics
import subprocess
import sys

import pytest

pytest.importorskip("distributed")

REPO = pathlib.Path(__file__).resolve().parents[2]
BENCH = REPO / "python" / "benchmarks" / "bench_dask.py"


def run_bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True,
                          timeout=300, cwd=REPO)


def test_bench_dask_reports_both_sides_and_the_ratio():
    p = run_bench("--bands", "2", "--size", "256", "--chunks", "4", "--repeat", "4",
                  "--geotiff", "--json")
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout)
    assert r["pairs"] == 4 and len(r["pair_ratios"]) == 4
    assert "2 x 256 x 256 float32" in r["job"]
    sides = {row["workers"]: row for row in r["rows"]}
    assert set(sides) == {1, 2}
    for n, row in sides.items():
        assert row["seconds"]["min"] > 0 and row["mpx_per_s"] > 0
        assert row["worker_cpu_seconds"]["median"] > 0
        assert row["cores_obtained"]["median"] > 0
        assert row["geotiff_seconds"]["min"] > 0
        assert len(row["worker_threads"]) == n
        # One task and one OpenMP thread per worker: the fairness the ratio rests on.
        assert all(t["omp_max_threads"] == 1 for t in row["worker_threads"])
    assert r["omp_max_threads_per_worker"] == ["1"]
    # The ratio is the pairs' median (of 4: the mean of the middle two, no single pair's).
    assert r["ratio"]["median"] == pytest.approx(statistics.median(r["pair_ratios"]))
    assert r["ratio"]["min"] <= r["ratio"]["median"] <= r["ratio"]["max"]
    assert r["geotiff_ratio"]["median"] > 0


def test_bench_dask_text_report_names_the_ratio():
    p = run_bench("--bands", "1", "--size", "128", "--chunks", "2", "--repeat", "1")
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.splitlines()
    assert lines[0].startswith("vsr-bench dask: focal mean x3 (halo 3), 1 x 128 x 128 float32")
    table = next(line for line in lines if line.startswith("map_tiles (Mpx/s)"))
    assert table.split()[-2].endswith("x")  # "... 1-worker 2-worker 1.23x [min-max]"
    assert any(line.startswith("pair ratios: ") for line in lines)


def test_bench_dask_rejects_no_pairs():
    p = run_bench("--repeat", "0")
    assert p.returncode == 2
    assert "--repeat must be >= 1" in p.stderr
