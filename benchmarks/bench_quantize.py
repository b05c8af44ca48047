"""Quantize an 8192x8192 float32 matrix (1x128, 128x128, mx32) and compare with the memory bound.

The bound is (bytes read + bytes written) / copy bandwidth, the bandwidth
measured in the same run by np.copyto of a 512 MB array (bandwidth =
(read + write bytes) / time).  Copies and quantizations are interleaved and
each is the best of ``--repeat`` runs, so a noisy machine affects both alike.
Usage: python benchmarks/bench_quantize.py [--n 8192] [--repeat 10]
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import fp8sim  # noqa: E402

GRANULARITIES = ("1x128", "128x128", "mx32")


def timed(f) -> float:
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args(argv)
    n = args.n
    src = np.ones(512 * 2**20 // 4, np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    x = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    moved = {}
    for g in GRANULARITIES:
        fp8sim.quantize(x[:256, :256], "e4m3", g)  # compile / load the cache
        q = fp8sim.quantize(x, "e4m3", g)
        moved[g] = x.nbytes + q.codes.nbytes + 2 * q.scales.nbytes  # scales: fp32 written, amax too
    t_copy = float("inf")
    best = {g: float("inf") for g in GRANULARITIES}
    for _ in range(args.repeat):
        t_copy = min(t_copy, timed(lambda: np.copyto(dst, src)))
        for g in GRANULARITIES:
            best[g] = min(best[g], timed(lambda g=g: fp8sim.quantize(x, "e4m3", g)))
    bw = 2 * src.nbytes / t_copy
    print(f"copy bandwidth (read+write) {bw / 1e9:.2f} GB/s")
    print(f"{'granularity':>12} {'time ms':>9} {'bound ms':>9} {'ratio':>6}")
    for g in GRANULARITIES:
        bound = moved[g] / bw
        print(f"{g:>12} {best[g] * 1e3:9.1f} {bound * 1e3:9.1f} {best[g] / bound:6.2f}")


if __name__ == "__main__":
    main()
