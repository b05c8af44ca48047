"""What the library settings cost: accumulation error of each library preset against K.

Usage: python analysis/library_study.py [out_dir] [--seed S]

For U(0,1) and N(0,1) inputs (64 x K times K x 64, K = 1024 .. 16384), each library preset of
docs/libraries.md quantizes the operands with its own scaling and runs the GEMM with fp32 output;
the error is measured against the exact (float64) product of the same quantized operands, so it
is the library's accumulation alone (quantization excluded).  Writes ``library_study.csv``,
``library_study.md`` (the table in docs/libraries.md) and ``library_accuracy.png``.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import fp8sim  # noqa: E402
from fp8sim.gemms.operands import quantize_operands  # noqa: E402

KS = (1024, 4096, 16384)
PRESETS = (
    ("cublaslt-tensor-fast", 1, "cuBLASLt tensorwise, use_fast_accum=True"),
    ("cublaslt-tensor-fast", 6, "  the same with cuBLASLt's split-K (6 slices at K = 16384, M = N = 64)"),
    ("triton", 1, "Triton tl.dot, default max_num_imprecise_acc"),
    ("triton-imprecise-128", 1, "Triton, max_num_imprecise_acc = 128"),
    ("cublaslt-tensor", 1, "cuBLASLt tensorwise, use_fast_accum=False"),
    ("cublaslt-row", 1, "cuBLASLt rowwise, use_fast_accum=False"),
    ("cublaslt-block", 1, "cuBLASLt blockwise 1x128 x 128x128"),
    ("deepseek-v3", 1, "DeepSeek-V3 / DeepGEMM (same arithmetic as cublaslt-block)"),
)


def inputs(dist: str, K: int, seed: int):
    rng = np.random.default_rng(seed)
    if dist == "uniform":
        return rng.random((64, K)).astype(np.float32), rng.random((K, 64)).astype(np.float32)
    return rng.standard_normal((64, K)).astype(np.float32), rng.standard_normal((K, 64)).astype(np.float32)


def errors(x, w, r: fp8sim.Recipe) -> tuple[float, float]:
    """(normwise relative error, max elementwise error / rms of the exact result)."""
    qx, qw = quantize_operands(x, w, r)
    exact = qx.dequantize(np.float64) @ qw.dequantize(np.float64)
    y = fp8sim.gemm(x, w, r).astype(np.float64)
    d = y - exact
    rms = np.sqrt(np.mean(exact**2))
    return float(np.linalg.norm(d) / np.linalg.norm(exact)), float(np.max(np.abs(d)) / rms)


def run(out_dir: str, seed: int = 0) -> dict:
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    for dist in ("uniform", "normal"):
        for K in KS:
            x, w = inputs(dist, K, seed)
            for name, split, label in PRESETS:
                if split > 1 and K != 16384:
                    continue
                r = fp8sim.recipe(name).with_(output_format="fp32", split_k=split)
                nrm, mx = errors(x, w, r)
                rows.append(dict(dist=dist, K=K, preset=name, split_k=split, label=label, normwise=nrm, max_rel_rms=mx))
    with open(os.path.join(out_dir, "library_study.csv"), "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)
    # markdown table: normwise relative error per preset and K, both distributions
    lines = [
        "| preset | split_k | "
        + " | ".join(f"U(0,1) K={K}" for K in KS)
        + " | "
        + " | ".join(f"N(0,1) K={K}" for K in KS)
        + " |",
        "|---|---|" + "---|" * (2 * len(KS)),
    ]
    for name, split, _ in PRESETS:
        cells = []
        for dist in ("uniform", "normal"):
            for K in KS:
                e = [
                    r["normwise"]
                    for r in rows
                    if r["preset"] == name and r["split_k"] == split and r["dist"] == dist and r["K"] == K
                ]
                cells.append(f"{e[0]:.2e}" if e else "")
        lines.append(f"| `{name}` | {split} | " + " | ".join(cells) + " |")
    md = "\n".join(lines) + "\n"
    with open(os.path.join(out_dir, "library_study.md"), "w") as f:
        f.write(md)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, dist in zip(axes, ("uniform", "normal")):
        for name, split, label in PRESETS:
            if split > 1:
                continue
            pts = [
                (r["K"], r["normwise"]) for r in rows if r["preset"] == name and r["split_k"] == 1 and r["dist"] == dist
            ]
            ax.loglog(*zip(*pts), marker="o", label=label)
        ax.set_title({"uniform": "U(0,1) inputs", "normal": "N(0,1) inputs"}[dist])
        ax.set_xlabel("K")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("normwise relative error vs exact sum of the FP8 operands")
    axes[1].legend(fontsize=7)
    fig.suptitle("Accumulation error of the library configurations (64 x K x 64, fp32 output)")
    fig.tight_layout()
    png = os.path.join(out_dir, "library_accuracy.png")
    fig.savefig(png, dpi=110)
    return dict(rows=rows, markdown=md, figure=png)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", nargs="?", default="results/libraries")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    res = run(a.out_dir, a.seed)
    print(res["markdown"])
    print("wrote", res["figure"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
