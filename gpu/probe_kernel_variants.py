"""Compile-time variants of the emulation kernel, timed at one size (a development probe).

Usage: PYTHONPATH=. python3 gpu/probe_kernel_variants.py [--n 4096]
"""

from __future__ import annotations

import argparse

import numpy as np


def main() -> None:
    import cupy as cp

    import fp8sim
    from fp8sim.tensorcore import cuda

    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--variants", default="base,FP8SIM_NO_DPX,FP8SIM_SKIP_PASS1,FP8SIM_SKIP_PASS2")
    args = ap.parse_args()
    n = args.n
    e4 = fp8sim.format("e4m3")
    rng = cp.random.default_rng(0)
    a = rng.integers(0, 126, (n, n), dtype=cp.uint8) | (rng.integers(0, 2, (n, n), dtype=cp.uint8) << 7).astype(
        cp.uint8
    )
    b = rng.integers(0, 126, (n, n), dtype=cp.uint8)
    sa = cp.ones((n, n // 128), cp.float32)
    sb = cp.ones((n // 128, n), cp.float32)
    ref = None
    for v in args.variants.split(","):
        opts = ("-std=c++17",) + (() if v == "base" else tuple(f"-D{d}" for d in v.split("+")))
        mod = cuda.compile_kernels(opts)
        y = cuda.device_wgmma_gemm(a, b, e4, e4, sa, sb, 128, 128, 0, 13, -1024, b_layout="nk")
        ts = []
        for _ in range(3):
            y = cuda.device_wgmma_gemm(a, b, e4, e4, sa, sb, 128, 128, 0, 13, -1024, b_layout="nk")
            ts.append(cuda.last_kernel_seconds)
        k = mod.get_function(cuda.KERNEL_NAMES["large"])
        at = k.attributes
        same = "" if ref is None else f" same-as-base={bool((cp.asnumpy(y).view(np.uint32) == ref).all())}"
        if ref is None:
            ref = cp.asnumpy(y).view(np.uint32)
        print(
            f"{v:28s} {min(ts) * 1e3:8.2f} ms  regs {at['num_regs']} local {at['local_size_bytes']}{same}", flush=True
        )


if __name__ == "__main__":
    main()
