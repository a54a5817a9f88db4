"""okq and the compactor type-check under mypy --strict (the files pyproject.toml
names) and pass ruff, as do the tests, benchmarks and examples."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tool(name: str) -> str:
    found = Path(sys.executable).parent / name
    if found.exists():
        return str(found)
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed; it is part of the test extra")
    return path


def test_ruff() -> None:
    result = subprocess.run(
        [_tool("ruff"), "check", "okq", "compactor", "tests", "benchmarks", "examples"],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict() -> None:
    result = subprocess.run(
        [_tool("mypy")], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
