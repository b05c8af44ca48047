"""The speed figures of README.md, benchmarks/RESULTS.md and the docs come from committed benchmark
records (``benchmarks/records/*.json``), and the claims about ml_dtypes hold for the installed one.

Each figure block (``<!-- figures: NAME -->`` ... ``<!-- /figures: NAME -->``) must equal what
``benchmarks/figures.py`` renders from its record; each record must be consistent in itself (the
ratios and the met/MISSED verdicts recomputed from its timings), and must say when, on which commit
and under which machine load it ran.
"""

from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import fp8sim

ROOT = Path(__file__).resolve().parent.parent


def _figures():
    spec = importlib.util.spec_from_file_location("bench_figures", ROOT / "benchmarks" / "figures.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


figures = _figures()


@pytest.mark.parametrize("rel", sorted(figures.FILES))
def test_figure_blocks_equal_their_records(rel):
    text = (ROOT / rel).read_text(encoding="utf-8")
    found = dict(figures.blocks(text))
    for name in figures.FILES[rel]:
        assert name in found, f"{rel} has no '{name}' figure block"
    for name, content in found.items():
        assert content == figures.render(name), (
            f"{rel}: the '{name}' figures differ from their record; run python benchmarks/figures.py"
        )


def _provenance(rec: dict) -> None:
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", rec["date"])
    assert re.fullmatch(r"[0-9a-f]{40}", rec["commit"])
    assert isinstance(rec["uncommitted_changes"], bool)
    assert rec["cpus"] >= 1 and rec["numba_threads"] >= 1
    for key in ("load_average_before", "load_average_after"):
        assert len(rec[key]) == 3 and all(v >= 0 for v in rec[key])
    assert rec["command"].startswith("python benchmarks/bench_") and "--record" not in rec["command"]
    assert rec["versions"]["numpy"] and rec["versions"]["numba"]


def test_rounding_record_is_consistent():
    rec = figures.load("rounding")
    _provenance(rec)
    assert rec["versions"]["ml_dtypes"]
    res = rec["results"]
    base = res["ml_dtypes astype f32->e4m3"]["elements_per_s"]
    for name, r in res.items():
        assert math.isclose(r["elements_per_s"], r["n"] / r["seconds"], rel_tol=1e-12), name
        assert math.isclose(r["ratio_vs_ml_dtypes_f32"], r["elements_per_s"] / base, rel_tol=1e-12), name
    assert {t["case"] for t in rec["targets"]} == {
        "fp8sim.encode f32 rne",
        "fp8sim.encode f32 sr",
        "fp8sim.encode f64 rne",
    }
    for t in rec["targets"]:
        ratio = res[t["case"]]["elements_per_s"] / res[t["against"]]["elements_per_s"]
        assert math.isclose(t["ratio"], ratio, rel_tol=1e-12)
        assert t["met"] == (ratio >= t["need"])  # a missed target is recorded as missed


def test_missed_targets_are_shown_as_missed():
    rec = figures.load("rounding")
    text = figures.render("rounding")
    for t in rec["targets"]:
        assert f"**{t['ratio']:.2f}×**" in text
    assert text.count("**MISSED**") == sum(not t["met"] for t in rec["targets"])


def test_fidelity_record_is_consistent():
    rec = figures.load("fidelity")
    _provenance(rec)
    assert {g["n"] for g in rec["gemm"]} >= {1024, 2048}
    for g in rec["gemm"]:
        assert math.isclose(g["fast_over_exact"], g["fast_s"] / g["exact_s"], rel_tol=1e-12)
    for t in rec["train"]:
        assert math.isclose(t["fast_over_exact"], t["fast_s_per_step"] / t["exact_s_per_step"], rel_tol=1e-12)


def test_no_unrecorded_speed_claims_remain():
    """The figures these documents quoted without a record (ml_dtypes at 102.7 Melem/s, 16.1x / 4.46x /
    7.3x, fidelity="fast" at about half the time or 4x numpy) are gone."""
    stale = ["102.7", "16.1×", "4.46×", "7.3×", "about half the\ntime", "about half the time", "about 4× (7.8 s)"]
    for rel in ["README.md", "benchmarks/RESULTS.md", "docs/rounding.md", "docs/results.md", "docs/training.md"]:
        text = (ROOT / rel).read_text(encoding="utf-8")
        for s in stale:
            assert s not in text, f"{rel} still says {s!r}"
    assert "2× the\n  fast mode per step" not in (ROOT / "docs" / "training.md").read_text(encoding="utf-8")


def test_ml_dtypes_float64_claim_holds_for_the_installed_version():
    """README and docs/rounding.md say: fp8sim rounds float64 once (-431.99999999999994 -> -416 in E4M3),
    ml_dtypes 0.7 does too, and 0.5 / 0.6 round through float32 (-448).  The installed ml_dtypes
    must behave as the documents say its version does."""
    x = np.array([-431.99999999999994])
    assert fp8sim.round(x, "e4m3").tolist() == [-416.0]
    # the correct result, independently: E4M3's neighbours of x are -416 and -448 (spacing 32 in
    # [256, 512)), and x lies on -416's side of their midpoint -432
    assert -432.0 < x[0] < -416.0
    once = x.astype(ml_dtypes.float8_e4m3fn).astype(np.float64).tolist()
    via32 = x.astype(np.float32).astype(ml_dtypes.float8_e4m3fn).astype(np.float64).tolist()
    assert via32 == [-448.0]  # rounding through float32 gives the wrong neighbour
    major, minor = (int(p) for p in ml_dtypes.__version__.split(".")[:2])
    assert once == ([-416.0] if (major, minor) >= (0, 7) else [-448.0])
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    rounding = " ".join((ROOT / "docs" / "rounding.md").read_text(encoding="utf-8").split())
    assert "ml_dtypes 0.7 casts float64 once too" in readme
    assert "ml_dtypes 0.5 and 0.6 (fp8sim accepts ≥ 0.5) cast it through float32" in readme
    assert "0.7 rounds the float64 value once" in rounding
    assert "0.5 and 0.6 round through float32" in rounding
    for text in (readme, rounding):
        assert "ml_dtypes goes through float32" not in text
        assert "| float64 input | rounds through float32" not in text
