"""What a benchmark record states about the run besides its timings (``benchmarks/records/*.json``).

The speed figures of README.md, benchmarks/RESULTS.md and the documentation are rendered from
committed records (``python benchmarks/figures.py``), so each record carries what the figures
depend on: when and on which commit it ran, the machine, its load and the package versions.
"""

from __future__ import annotations

import datetime
import importlib
import importlib.metadata
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: environment variables that change BLAS or numba behaviour, recorded as found (None: unset)
ENV_VARS = (
    "OPENBLAS_CORETYPE",
    "OPENBLAS_L2_SIZE",
    "OPENBLAS_NUM_THREADS",
    "OMP_NUM_THREADS",
    "NUMBA_NUM_THREADS",
)


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        pass
    try:  # importable without its metadata (a source folder on PYTHONPATH)
        return str(getattr(importlib.import_module(name), "__version__", None) or "") or None
    except ImportError:
        return None


def command(script: str, argv: list[str]) -> str:
    """The command line of the run, without ``--record FILE`` (where the record went is no part of it)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--record", "--json"):
            skip = True
        elif not a.startswith(("--record=", "--json=")):
            out.append(a)
    return " ".join(["python", script, *out])


def environment(packages: list[str]) -> dict:
    """Date (UTC), commit, uncommitted changes, CPU, core and numba thread counts, versions of numpy,
    numba, fp8sim and ``packages``, and the :data:`ENV_VARS` as found."""
    import numba

    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "commit": _git("rev-parse", "HEAD"),
        "uncommitted_changes": None if status is None else bool(status),
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "numba_threads": numba.get_num_threads(),
        "versions": {name: _version(name) for name in ["numpy", "numba", "fp8sim", *packages]},
        "env": {k: os.environ.get(k) for k in ENV_VARS},
    }


def write(path: str | None, record: dict) -> None:
    """Write ``record`` as indented JSON to ``path`` (nothing when ``path`` is None or empty)."""
    if path:
        import json

        with open(path, "w") as fh:
            json.dump(record, fh, indent=2)
            fh.write("\n")
