"""Accumulation study: FP8 GEMM error vs K, accumulator model, promotion and recipe.

Usage: python analysis/accumulation_study.py [out_dir] [--quick] [--seed S]
Writes accumulation_study.csv and four log-log PNG figures (see fp8sim.studies.accumulation).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from fp8sim.studies import accumulation  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", nargs="?", default="results/accumulation")
    ap.add_argument("--quick", action="store_true", help="small matrices, K up to 4096 (seconds)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    res = accumulation.run(args.out_dir, quick=args.quick, seed=args.seed)
    h = res["headline"]
    print(f"wrote {res['csv']} and {len(res['figures'])} figures in {res['seconds']:.1f} s")
    print(f"K = {h['K']}, wgmma accumulator, e4m3 inputs without scaling (elementwise relative error):")
    print("  DeepSeek-V3 (H800, inputs not stated): max 'nearly 2%' without promotion")
    for dist in accumulation.DISTRIBUTIONS:
        for mode in ("no promotion", "promote 128"):
            e = h.get((dist, mode))
            if e:
                hw = h["h200"].get((dist, mode), {})
                hws = ", ".join(f"{k.split('_')[0]} {v:.3%}" for k, v in hw.items())
                print(
                    f"  {dist:8s} {mode:13s} emulated max {e['max_rel']:.3%} median {e['median_rel']:.3%}"
                    + (f"   (H200: {hws})" if hws else "")
                )


if __name__ == "__main__":
    main()
