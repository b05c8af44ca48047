"""Lint and type checks of the package (ruff and mypy, configured in pyproject.toml)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_clean():
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff not installed (pip install -e '.[test]')")
    out = subprocess.run(
        [ruff, "check", "fp8sim", "tests", "gpu", "examples", "scripts", "benchmarks", "analysis"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout[-3000:]


def test_mypy_clean():
    pytest.importorskip("mypy")
    out = subprocess.run([sys.executable, "-m", "mypy", "fp8sim"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:]


def test_ruff_format_clean():
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff not installed (pip install -e '.[test]')")
    out = subprocess.run([ruff, "format", "--check", "."], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:]
