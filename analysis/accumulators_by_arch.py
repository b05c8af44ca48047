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
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    accumulators.plot(rows, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
