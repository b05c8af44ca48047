"""Quantize an 8192x8192 float32 matrix (1x128, 128x128, mx32) and compare with the memory bound.

The bound is (bytes read + bytes written) / copy bandwidth, the bandwidth
measured in the same run by np.copyto of a 512 MB array (bandwidth =
(read + write bytes) / time).  Usage: python benchmarks/bench_quantize.py [--n 8192] [--repeat 5]
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import fp8sim  # noqa: E402


def best(f, repeat):
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return min(ts)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    n = args.n
    src = np.ones(512 * 2**20 // 4, np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    t_copy = best(lambda: np.copyto(dst, src), args.repeat)
    bw = 2 * src.nbytes / t_copy
    print(f"copy bandwidth (read+write) {bw / 1e9:.2f} GB/s")
    x = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    print(f"{'granularity':>12} {'time ms':>9} {'bound ms':>9} {'ratio':>6}")
    for g in ("1x128", "128x128", "mx32"):
        q = fp8sim.quantize(x[:256, :256], "e4m3", g)  # compile / load the cache
        t = best(lambda: fp8sim.quantize(x, "e4m3", g), args.repeat)
        q = fp8sim.quantize(x, "e4m3", g)
        moved = x.nbytes + q.codes.nbytes + 2 * q.scales.nbytes  # scales: fp32 written, amax too
        bound = moved / bw
        print(f"{g:>12} {t * 1e3:9.1f} {bound * 1e3:9.1f} {t / bound:6.2f}")


if __name__ == "__main__":
    main()
