"""Quantize an 8192x8192 float32 matrix (1x128, 128x128, mx32) and compare with the memory bound.

The bound is (bytes read + bytes written) / copy bandwidth, the bandwidth
measured in the same run by np.copyto of a 512 MB array (bandwidth =
(read + write bytes) / time).  Copies and quantizations are interleaved and
each is the best of ``--repeat`` runs, so a noisy machine affects both alike.

Two times per granularity: "warm", where quantize reuses the code buffer of
an earlier call that was dropped (what a loop over same-shaped tensors gets,
and what the copy into a preallocated array gets), and "cold", with the
buffer pool off, where every call also has the operating system fault in and
zero a fresh 64 MiB array.  The ratio to the bound is given for both.
Usage: python benchmarks/bench_quantize.py [--n 8192] [--repeat 10]
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import fp8sim  # noqa: E402
from fp8sim import _buffers  # noqa: E402

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
    best = {(g, w): float("inf") for g in GRANULARITIES for w in (True, False)}
    for _ in range(args.repeat):
        t_copy = min(t_copy, timed(lambda: np.copyto(dst, src)))
        for g in GRANULARITIES:
            for warm in (True, False):
                _buffers.enabled = warm
                best[g, warm] = min(best[g, warm], timed(lambda g=g: fp8sim.quantize(x, "e4m3", g)))
    _buffers.enabled = True
    bw = 2 * src.nbytes / t_copy
    print(f"copy bandwidth (read+write) {bw / 1e9:.2f} GB/s")
    print(f"{'granularity':>12} {'bound ms':>9} {'warm ms':>8} {'ratio':>6} {'cold ms':>8} {'ratio':>6}")
    for g in GRANULARITIES:
        bound = moved[g] / bw
        w, c = best[g, True], best[g, False]
        print(f"{g:>12} {bound * 1e3:9.1f} {w * 1e3:8.1f} {w / bound:6.2f} {c * 1e3:8.1f} {c / bound:6.2f}")


if __name__ == "__main__":
    main()
