"""Real FP8 training on the H200 against fp8sim.torch's emulation: the figure and the table.

Usage: python analysis/torch_h200_training.py [--evidence docs/evidence/torch_h200/train_fp8.json]
                                              [--out docs/figures/torch_h200_training.png]

Reads the record that ``python3 -m gpu.train_fp8 OUTDIR`` wrote on the H200 (losses as float64
bits, per-GEMM hash comparisons, seconds per step), prints the bit-identity result and the relative
loss error of each FP8 recipe against BF16 per seed (:func:`fp8sim.training.train.relative_loss_error`,
last 10 % of the steps, and the validation loss), and draws the losses of seed 0 (left: every run;
emulated and real curves lie on each other) and the loss error per seed (right).
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from fp8sim.training.train import relative_loss_error  # noqa: E402

EVIDENCE = os.path.join("docs", "evidence", "torch_h200", "train_fp8.json")
FP8 = (("real-block", "DeepSeek-V3 blockwise"), ("real-tensor", "per-tensor"))


def losses(run: dict) -> np.ndarray:
    """The float64 losses of a run from their stored bits."""
    return np.array([np.frombuffer(bytes.fromhex(b), np.float64)[0] for b in run["loss_bits"]])


def seeds(record: dict) -> list[int]:
    return sorted({int(k.split("/seed")[1].split("/")[0]) for k in record["runs"] if k.startswith("bf16/seed")})


def table(record: dict) -> dict:
    """Per FP8 run and seed: the relative loss error against bf16 and the validation losses."""
    out: dict = {}
    for kind, _ in FP8:
        for s in seeds(record):
            a, b = record["runs"].get(f"{kind}/seed{s}"), record["runs"][f"bf16/seed{s}"]
            if a is None:
                continue
            rel = relative_loss_error(losses(a), losses(b))
            out.setdefault(kind, {})[s] = {
                "mean_abs": rel["mean_abs"],
                "signed": rel["signed"],
                "val": a["val_loss"],
                "val_bf16": b["val_loss"],
                "val_rel": (a["val_loss"] - b["val_loss"]) / b["val_loss"],
            }
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--evidence", default=EVIDENCE)
    ap.add_argument("--out", default=os.path.join("docs", "figures", "torch_h200_training.png"))
    args = ap.parse_args(argv)
    with open(args.evidence) as f:
        rec = json.load(f)
    print(f"{rec['device']}, torch {rec['torch']}, {rec['parameters']:,} parameters, {rec['steps']} steps")
    for name, c in rec.get("comparisons", {}).items():
        print(f"{name}: losses identical {c['losses_identical']}, GEMMs equal {c['gemms_equal']}/{c['gemms_compared']}")
    for k, r in rec["runs"].items():
        print(f"{k:<28} {1e3 * r['s_per_step']:7.1f} ms/step  val {r['val_loss']:.4f}")
    t = table(rec)
    vals = [rec["runs"][f"bf16/seed{s}"]["val_loss"] for s in seeds(rec)]
    print(f"bf16 validation loss over seeds: {np.mean(vals):.4f} +- {np.std(vals, ddof=1):.4f}")
    for kind, label in FP8:
        rows = t.get(kind, {})
        m = np.array([v["mean_abs"] for v in rows.values()])
        vr = np.array([v["val_rel"] for v in rows.values()])
        print(
            f"{label}: loss error vs bf16 (last 10 %) per seed "
            + ", ".join(f"{100 * v:.2f} %" for v in m)
            + f"; mean {100 * m.mean():.2f} % (sd {100 * m.std(ddof=1):.2f} %); validation loss "
            + ", ".join(f"{100 * v:+.2f} %" for v in vr)
        )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    steps = np.arange(rec["steps"])
    for key, label, style in (
        ("bf16/seed0", "BF16 (torch)", dict(color="k", lw=1)),
        ("real-block/seed0", "DeepSeek-V3 FP8, H200 tensor cores", dict(color="C0", lw=2.5, alpha=0.5)),
        ("emu-block/seed0", "DeepSeek-V3 FP8, fp8sim.torch emulation", dict(color="C0", lw=0.8, ls="--")),
        ("real-tensor/seed0", "per-tensor FP8, H200 tensor cores", dict(color="C1", lw=2.5, alpha=0.5)),
        ("emu-tensor/seed0", "per-tensor FP8, fp8sim.torch emulation", dict(color="C1", lw=0.8, ls="--")),
    ):
        if key in rec["runs"]:
            ax.plot(steps, losses(rec["runs"][key]), label=label, **style)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (seed 0)")
    ax.set_ylim(top=4.0)
    ax.legend(fontsize=7)
    ax.set_title("every emulated loss equals the real one, bit for bit", fontsize=9)
    w = 0.35
    ss = seeds(rec)
    for i, (kind, label) in enumerate(FP8):
        rows = t.get(kind, {})
        bx.bar(np.arange(len(ss)) + (i - 0.5) * w, [100 * rows[s]["signed"] for s in ss], w, label=label)
    bx.axhline(0, color="k", lw=0.5)
    bx.set_xticks(np.arange(len(ss)), [f"seed {s}" for s in ss])
    bx.set_ylabel("signed loss error vs BF16, last 10 % of steps (%)")
    bx.legend(fontsize=7)
    bx.set_title("FP8 against BF16 per seed", fontsize=9)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
