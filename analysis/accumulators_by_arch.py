"""Accumulators by architecture: Hopper wgmma, Blackwell tcgen05 f8f6f4 and CDNA3 MFMA on the same FP8 products.

Usage: python analysis/accumulators_by_arch.py [--out docs/figures/accumulators_by_arch.png] [--seed S]
Runs fp8sim.studies.accumulators.compare_accumulators (K = 128 .. 16384, normal / uniform /
outlier inputs, without promotion and with promotion every 128), prints the table and draws the
median elementwise relative error against K (one panel per input family).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from fp8sim.studies import accumulators  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join("docs", "figures", "accumulators_by_arch.png"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rows = accumulators.compare_accumulators(seed=args.seed)
    print(f"{'inputs':<8} {'accumulator':<22} {'K':>6} {'promote':>7} {'max_rel':>10} {'median_rel':>10}")
    for r in rows:
        print(f"{r['distribution']:<8} {r['accumulator']:<22} {r['K']:>6} {r['promote_every'] or '-':>7} "
              f"{r['max_rel']:10.2e} {r['median_rel']:10.2e}")  # fmt: skip
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dists = list(dict.fromkeys(r["distribution"] for r in rows))
    fig, axes = plt.subplots(1, len(dists), figsize=(5 * len(dists), 4), sharey=True)
    for ax, dist in zip(axes, dists):
        for (label, *_), color in zip(accumulators.ACCUMULATORS, ("C0", "C1", "C2")):
            for p, style in ((0, "-"), (128, "--")):
                sel = [
                    r
                    for r in rows
                    if r["distribution"] == dist and r["accumulator"] == label and r["promote_every"] == p
                ]
                ks = [r["K"] for r in sel]
                med = [max(r["median_rel"], 1e-10) for r in sel]
                ax.loglog(ks, med, style, color=color, marker="o", ms=3,
                          label=f"{label}{', promote 128' if p else ''}")  # fmt: skip
        ax.set_title(f"{dist} inputs (e4m3, amax 240)")
        ax.set_xlabel("K")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("median relative error vs fp64 (floor 1e-10)")
    axes[-1].legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
