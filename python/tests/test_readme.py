# SPDX-License-Identifier: Apache-2.0
"""The README's Python section runs as written: its quick start here on the emulator, its
CuPy / PyTorch blocks where those frameworks are installed (tools/gpu-check's Python step)."""

from __future__ import annotations

import importlib.util
import pathlib
import re

import pytest
from conftest import run_python

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def python_blocks() -> list[str]:
    text = README.read_text()
    start = text.index("\n## Python\n")
    end = text.index("\n## ", start + 1)
    return re.findall(r"```python\n(.*?)```", text[start:end], flags=re.S)


def framework_of(block: str) -> str | None:
    for name in ("cupy", "torch", "numba"):
        if re.search(rf"^import {name}\b", block, flags=re.M):
            return name
    return None


def test_the_python_section_has_a_quick_start_and_framework_blocks():
    blocks = python_blocks()
    assert [framework_of(b) for b in blocks] == [None, "cupy", "torch"]
    for block in blocks:
        compile(block, "README.md", "exec")


@pytest.mark.parametrize("index", range(3))
def test_readme_block_runs(index):
    block = python_blocks()[index]
    framework = framework_of(block)
    if framework is not None and importlib.util.find_spec(framework) is None:
        pytest.skip(f"{framework} is not installed (runs in tools/gpu-check's Python step)")
    out = run_python(block)
    if framework is None:
        assert "pool tier:" in out
        assert "current_bytes" in out
