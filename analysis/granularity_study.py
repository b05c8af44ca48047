"""Granularity study: SQNR of FP8 quantization per scale granularity and policy.

Usage: python analysis/granularity_study.py [out_dir] [--quick]
Writes granularity_study.csv and four PNG figures (see fp8sim.studies.granularity).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from fp8sim.studies import granularity  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", nargs="?", default="results/granularity")
    ap.add_argument("--quick", action="store_true", help="small tensors (seconds)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    res = granularity.run(args.out_dir, quick=args.quick, seed=args.seed)
    key = res["key"]
    print(f"wrote {res['csv']} and {len(res['figures'])} figures in {res['seconds']:.1f} s")
    print("SQNR [dB], outlier-channel activations (fp32 scales; MX: E8M0 FLOOR):")
    for fmt in granularity.FORMATS:
        print(
            f"  {fmt}: " + ", ".join(f"{g} {key[('outlier_channels', fmt, g)]:.1f}" for g in granularity.GRANULARITIES)
        )


if __name__ == "__main__":
    main()
