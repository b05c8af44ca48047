"""Cost of exactness: fp8sim.gemm (bit-exact DeepSeek-V3 recipe) against numpy's float32 matmul.

Usage: python benchmarks/bench_gemm.py [--n 4096] [--m M --k K] [--recipes deepseek-v3,...] [--reps R] [--threads T]

For each size it times (after one warm-up call that also compiles the numba kernels):
  * numpy float32 matmul of the same shapes (BLAS),
  * fp8sim.gemm(..., fidelity="exact") split into quantization and the bit-exact GEMM kernel
    (codes in, fp32 out: the packed wgmma kernel for the fused wgmma-type accumulators, decoding
    included), with the ratio of the total and of the kernel alone to numpy,
  * fp8sim.gemm(..., fidelity="fast") (exact quantization, fp32 BLAS per promotion interval).
Records go to benchmarks/RESULTS.md under "## GEMM".
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import fp8sim  # noqa: E402
from fp8sim.gemms.engine import scaled_matmul  # noqa: E402
from fp8sim.gemms.operands import kernel_inputs, quantize_operands  # noqa: E402


def fp8_kernel(qx, qw, r):
    """The bit-exact part of fp8sim.gemm after quantization: padding, scales per K block, the kernel."""
    A, B, sa, sb, kscale = kernel_inputs(qx, qw, r.promote_every)
    return scaled_matmul(
        A,
        B,
        sa,
        sb,
        a_format=qx.format,
        b_format=qw.format,
        kscale=kscale,
        accumulator=r.accumulator,
        promote_every=r.promote_every,
        scale_at=r.scale_at,
        scale_application=r.scale_application,
    )


def best(f, reps):
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return min(ts)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--m", type=int)
    ap.add_argument("--k", type=int)
    ap.add_argument("--recipes", default="deepseek-v3,per-tensor-no-promotion")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--threads", type=int, help="numba threads (default: numba's, one per core)")
    args = ap.parse_args(argv)
    N = args.n
    M = args.m or N
    K = args.k or N
    rng = np.random.default_rng(0)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((K, N)).astype(np.float32)
    import numba

    if args.threads:
        numba.set_num_threads(args.threads)
    print(f"M={M} K={K} N={N}; numba threads {numba.get_num_threads()}, cpus {os.cpu_count()}")
    fp8sim.gemm(x[:64, :256], w[:256, :64])  # compile
    fp8sim.gemm(x[:64, :256], w[:256, :64], fidelity="fast")
    t_np = best(lambda: x @ w, max(args.reps, 2))
    macs = M * N * K
    print(f"numpy float32 matmul            {t_np:8.2f} s  {macs / t_np / 1e9:7.2f} GMAC/s")
    for name in args.recipes.split(","):
        r = fp8sim.recipe(name)
        t_q = best(lambda: quantize_operands(x, w, r), max(args.reps, 2))  # the first call may compile
        qx, qw = quantize_operands(x, w, r)
        t_k = best(lambda: fp8_kernel(qx, qw, r), args.reps)
        t_all = t_q + t_k
        t_f = best(lambda: fp8sim.gemm(x, w, r, fidelity="fast"), 1)
        print(
            f"{name:<24s} exact total {t_all:8.2f} s (quantize {t_q:.2f} s, kernel {t_k:.2f} s, "
            f"{macs / t_k / 1e9:.2f} GMAC/s)  ratio vs numpy {t_all / t_np:6.1f}x (kernel alone {t_k / t_np:.1f}x)"
        )
        print(f"{name:<24s} fast        {t_f:8.2f} s  ratio vs numpy {t_f / t_np:6.1f}x")


if __name__ == "__main__":
    main()
