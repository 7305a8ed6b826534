# SPDX-License-Identifier: Apache-2.0
"""The README's "Scale out" example runs as written (a LocalCluster of two worker processes on
the emulator), in a scratch directory since it writes its GeoTIFFs where it runs."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

from vibespatial_raster import io, testing

pytest.importorskip("distributed")

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def scale_out_section() -> str:
    text = README.read_text()
    start = text.index("\n## Scale out\n")
    return text[start:text.index("\n## ", start + 1)]


def test_the_section_documents_clusters_beyond_one_machine():
    # The README points at docs/dask.md for clusters beyond one machine, which shows them.
    section = scale_out_section()
    for needle in ("several machines", "LocalCUDACluster", "(docs/dask.md)", "vd.register(client)"):
        assert needle in section, needle
    assert len(re.findall(r"```python\n", section)) == 1
    dask_doc = (README.parent / "docs" / "dask.md").read_text()
    for needle in ("dask scheduler", "dask worker", "LocalCUDACluster", "CUDA_VISIBLE_DEVICES",
                   "vd.register(client)"):
        assert needle in dask_doc, needle


@pytest.mark.skipif(not io.io_available(), reason="built without GDAL")
def test_the_scale_out_example_runs(tmp_path):
    (block,) = re.findall(r"```python\n(.*?)```", scale_out_section(), flags=re.S)
    env = dict(os.environ, VIBESPATIAL_CUDA_DRIVER=testing.emulator_path())
    proc = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "chunks: ((4,)," in proc.stdout
    assert "wrote 4 bands of float32" in proc.stdout
    assert proc.stdout.count(" cpu tier B 0 bytes live") == 2  # both workers, pools empty
    assert (tmp_path / "scale-out-focal.tif").is_file()
