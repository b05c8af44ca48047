"""Kernel-only timing of the CUDA-core emulation (fp8sim.tensorcore.cuda) on random codes.

Usage: PYTHONPATH=. python3 gpu/bench_emulation_kernel.py [--sizes 2048,4096,8192] [--skinny]
"""

from __future__ import annotations

import argparse


def main() -> None:
    import cupy as cp

    import fp8sim
    from fp8sim.tensorcore import cuda

    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="2048,4096,8192")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    shapes = [(n, n, n) for n in map(int, args.sizes.split(","))] + [(64, 64, 16384), (128, 256, 8192)]
    e4 = fp8sim.format("e4m3")
    for M, N, K in shapes:
        rng = cp.random.default_rng(0)
        a = rng.integers(0, 126, (M, K), dtype=cp.uint8)  # finite e4m3 codes of both signs below
        a |= (rng.integers(0, 2, (M, K), dtype=cp.uint8) << 7).astype(cp.uint8)
        b = rng.integers(0, 126, (N, K), dtype=cp.uint8)
        nks = -(-K // 128)
        sa = cp.ones((M, nks), cp.float32)
        sb = cp.ones((nks, N), cp.float32)
        cuda.device_wgmma_gemm(a, b, e4, e4, sa, sb, 128, 128, 0, 13, -1024, b_layout="nk")
        ts = []
        for _ in range(args.reps):
            cuda.device_wgmma_gemm(a, b, e4, e4, sa, sb, 128, 128, 0, 13, -1024, b_layout="nk")
            ts.append(cuda.last_kernel_seconds)
        t = min(ts)
        print(f"{M}x{N}x{K}: kernel {t * 1e3:9.2f} ms  {M * N * K / t / 1e12:6.2f} TMAC/s", flush=True)


if __name__ == "__main__":
    main()
