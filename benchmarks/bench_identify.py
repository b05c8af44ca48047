"""Speed of fp8sim.identify: which configuration produced a 256x256x4096 output?

Usage: python benchmarks/bench_identify.py [--m 256 --n 256 --k 4096] [--split-k 3] [--repeat 1]

Random E4M3 codes (N(0, 1) values) with tensorwise scales, the output made by fp8sim.scaled_gemm with
"cublaslt-tensor-fast" and split_k (default 3); one warm-up call on a small problem loads the numba
kernels, then identify is timed on the full problem and the recipe it found is printed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import fp8sim  # noqa: E402


def problem(m: int, n: int, k: int, split_k: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    a = fp8sim.encode(rng.standard_normal((m, k)), "e4m3").astype(np.uint8)
    b = fp8sim.encode(rng.standard_normal((k, n)), "e4m3").astype(np.uint8)
    sa, sb = np.float32(0.0371), np.float32(1.73)
    r = fp8sim.recipe("cublaslt-tensor-fast").with_(split_k=split_k)
    return a, b, sa, sb, r, fp8sim.scaled_gemm(a, b, sa, sb, r)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=int, default=256)
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--split-k", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    a, b, sa, sb, _r, y = problem(16, 16, 512, 2)
    fp8sim.identify(a, b, y, a_scale=sa, b_scale=sb)  # warm-up: numba kernels loaded / compiled
    a, b, sa, sb, truth, y = problem(args.m, args.n, args.k, args.split_k)
    for _ in range(args.repeat):
        t = time.perf_counter()
        res = fp8sim.identify(a, b, y, a_scale=sa, b_scale=sb)
        dt = time.perf_counter() - t
        f = res.recipe
        print(
            f"identify {args.m}x{args.n}x{args.k} (truth cublaslt-tensor-fast split_k={args.split_k}): {dt:.2f} s, "
            f"{len(res.table)} candidates, match {100 * res.match_rate:.2f} %, found split_k={f.split_k} "
            f"promote_every={f.promote_every} epilogue_scale={f.epilogue_scale!r} output={f.output_format}"
        )


if __name__ == "__main__":
    main()
