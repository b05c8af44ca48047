"""Every example runs (with small sizes) and prints what it promises, so none rots."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def run_example(name, *args, timeout=600):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_round_and_encode():
    out = run_example("round_and_encode.py")
    assert "-416" in out and "0x7e" in out  # single rounding of -431.99999999999994; 448 saturated


def test_compare_granularities_on_a_npy_file(tmp_path):
    x = np.random.default_rng(1).standard_normal((64, 256)).astype(np.float32)
    np.save(tmp_path / "t.npy", x)
    out = run_example("compare_granularities.py", str(tmp_path / "t.npy"))
    assert "(64, 256) float32" in out
    assert all(g in out for g in ["tensor", "1x128", "128x128", "mx32"])


def test_gemm_bitexact():
    out = run_example("gemm_bitexact.py", "--m", "64", "--k", "256", "--n", "32")
    assert "accumulation" in out and "relative Frobenius error vs fp64" in out


def test_deepseek_k4096_small():
    out = run_example("deepseek_k4096.py", "--mn", "8", "--k", "1024")
    lines = [ln for ln in out.splitlines() if ln.startswith("U(0,1)")]
    no_prom, prom = (float(ln.split("max rel. error ")[1].split("%")[0]) for ln in lines)
    assert prom < no_prom  # promotion every 128 removes the truncation error


def test_train_two_recipes(tmp_path):
    out = run_example("train_two_recipes.py", "--steps", "3", "--out", str(tmp_path))
    assert "deepseek-v3: final loss" in out and "relative loss error vs bf16" in out
    # progress while it runs (it is not silent for the whole run): one line per step of a 3-step run
    for r in ("bf16", "deepseek-v3"):
        assert [ln.split()[2] for ln in out.splitlines() if ln.split()[:2] == [r, "step"]] == ["1/3", "2/3", "3/3"]
    assert (tmp_path / "summary.json").exists() and (tmp_path / "losses.csv").exists()


def test_library_gemm():
    out = run_example("library_gemm.py", "512")
    assert "identify: match 100% with promote_every=None, split_k=2, epilogue_scale='b-then-a'" in out
    assert "first diverging output (row-major): [3, 5]" in out
    assert "no single step of the model" in out
