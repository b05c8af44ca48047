"""Training on Blackwell's recipes against BF16 and DeepSeek-V3 on Hopper.

Usage: python analysis/blackwell_training.py [--steps 200] [--model small|default] [--jobs 2]
       [--out out/blackwell_train] [--evidence docs/evidence/blackwell_training]
       [--figure docs/figures/train_blackwell.png] [--replot]

Trains fp8sim.training's small LM from the same initialization and data order (seed 0, the bit-exact
fidelity: the same numbers on every machine and thread count) with

* bf16 (the reference) and deepseek-v3 (Hopper's wgmma, H200-validated);
* deepseek-v3-blackwell (DeepSeek-V3's scaling on tcgen05's 25-bit accumulator), mxfp8-blackwell
  (UE8M0 per 32 in the MMA) and nvfp4 (TransformerEngine's NVFP4 training recipe: 16x16 weight
  blocks, the Wgrad random Hadamard transform, stochastic rounding of the gradients), emulated on
  the MMA-Sim models, not validated on hardware;
* nvfp4-1d-rne: the same NVFP4 GEMMs without TransformerEngine's three techniques (1x16 weight
  blocks, no transform, RNE gradients), to show what they do.

It writes train()'s outputs to --out, copies summary.json and losses.csv to --evidence and draws
--figure (the signed and the absolute relative loss difference against bf16 per step, 10-step
means); --replot redraws the figure from --evidence/losses.csv.
"""

import argparse
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402

import fp8sim  # noqa: E402
from fp8sim.training import ModelConfig, TrainConfig, train  # noqa: E402

#: the "small" model: width 64, MLP 256, 4 heads, context 32 (256 tokens per step): ~1/8 of the
#: default model's GEMM work, so that the six runs take minutes on 2 cores
SMALL = ModelConfig(d_model=64, d_ff=256, n_heads=4, context=32)


def recipes():
    """The compared recipes (names, and the NVFP4 ablation as a Recipe)."""
    plain = fp8sim.recipe("nvfp4").with_(
        name="nvfp4-1d-rne",
        weight_2d_blocks=False,
        wgrad_rht=False,
        grad_rounding="rne",
        description="nvfp4 without TransformerEngine's 2D weight blocks, Wgrad RHT and stochastic rounding",
    )
    return ["bf16", "deepseek-v3", "deepseek-v3-blackwell", "mxfp8-blackwell", "nvfp4", plain]


def smooth(v: np.ndarray, n: int = 10) -> np.ndarray:
    """Trailing mean over ``n`` steps (fewer at the start)."""
    c = np.cumsum(np.insert(np.asarray(v, np.float64), 0, 0.0))
    i = np.arange(1, len(v) + 1)
    lo = np.maximum(i - n, 0)
    return (c[i] - c[lo]) / (i - lo)


def figure(path: str, losses: dict, claim: float) -> None:
    """Signed and absolute relative loss difference against bf16 per step (10-step means), one
    colour per recipe in both panels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ref = np.asarray(losses["bf16"], np.float64)
    fig, (a0, a1) = plt.subplots(1, 2, figsize=(11, 4))
    for k, (name, loss) in enumerate((n, v) for n, v in losses.items() if n != "bf16"):
        d = (np.asarray(loss, np.float64) - ref) / ref
        a0.plot(100 * smooth(d), color=f"C{k}", label=name, lw=1.2)
        a1.semilogy(smooth(np.abs(d)), color=f"C{k}", label=name, lw=1.2)
    a0.axhline(0, color="k", lw=0.8)
    a1.axhline(claim, color="k", ls=":", lw=1, label="DeepSeek-V3's 0.25 %")
    a0.set(xlabel="step", ylabel="(L - L_bf16) / L_bf16 in % (10-step mean)", title="loss above bf16")
    a1.set(xlabel="step", ylabel="|L - L_bf16| / L_bf16 (10-step mean)", title="relative loss error vs bf16")
    for a in (a0, a1):
        a.grid(True, which="both", alpha=0.3)
        a.legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=120)


def read_losses(path: str) -> dict:
    """``losses.csv`` (a step column, one column per recipe) as recipe -> float64 array."""
    import csv

    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    names = rows[0][1:]
    vals = np.array([[float(v) for v in r[1:]] for r in rows[1:]])
    return {n: vals[:, i] for i, n in enumerate(names)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", choices=("small", "default"), default="small")
    ap.add_argument("--jobs", type=int, default=2, help="recipes trained at a time (worker processes)")
    ap.add_argument("--out", default=os.path.join("out", "blackwell_train"))
    ap.add_argument("--evidence", default=os.path.join("docs", "evidence", "blackwell_training"))
    ap.add_argument("--figure", default=os.path.join("docs", "figures", "train_blackwell.png"))
    ap.add_argument("--replot", action="store_true", help="only redraw --figure from --evidence/losses.csv")
    args = ap.parse_args(argv)
    if args.replot:
        figure(args.figure, read_losses(os.path.join(args.evidence, "losses.csv")), 0.0025)
        print(f"wrote {args.figure}")
        return
    cfg = TrainConfig(model=SMALL) if args.model == "small" else TrainConfig()
    t0 = time.perf_counter()
    summary = train(recipes(), steps=args.steps, seed=args.seed, out_dir=args.out, progress=False, config=cfg,
                    figures=False, jobs=args.jobs)  # fmt: skip
    wall = time.perf_counter() - t0
    results = summary.pop("results")
    print(f"{'recipe':<24} {'final loss':>10} {'val loss':>9} {'rel. loss error':>16} {'s/step':>7}")
    for name, rec in summary["recipes"].items():
        rel = rec["rel_loss_error_vs_bf16"]
        rel_s = "-" if rel is None else f"{100 * rel['mean_abs']:.3f} %"
        print(f"{name:<24} {rec['final_loss']:10.4f} {rec['val_loss']:9.4f} {rel_s:>16} {rec['s_per_step']:7.3f}")
    print(f"wall time {wall:.0f} s with {args.jobs} jobs")
    os.makedirs(args.evidence, exist_ok=True)
    for f in ("summary.json", "losses.csv"):
        shutil.copy(os.path.join(args.out, f), os.path.join(args.evidence, f))
    figure(args.figure, {n: r.losses for n, r in results.items()}, summary["deepseek_v3_rel_loss_error_claim"])
    print(f"wrote {args.evidence}/summary.json, losses.csv and {args.figure}")


if __name__ == "__main__":
    main()
