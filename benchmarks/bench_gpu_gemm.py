"""GPU speed of fp8sim's bit-exact emulation against the libraries it emulates, in one process.

Usage (on a machine with an NVIDIA GPU, torch with CUDA and CuPy)::

    PYTHONPATH=. python3 benchmarks/bench_gpu_gemm.py [--sizes 2048,4096,8192] [--json FILE]

For each M = N = K and a skinny shape (64 x 64 x 16384), it times with CUDA events:

* ``torch._scaled_mm`` blockwise (1x128 x 128x128 fp32 scales, DeepSeek-V3's scaling) and
  tensorwise (fast accumulation off), bf16 output;
* torch's BF16 matmul;
* fp8sim's CUDA-core emulation of the DeepSeek-V3 GEMM (``backend="cupy"``): the kernel alone
  (``fp8sim.tensorcore.cuda.last_kernel_seconds``) and end to end from host float arrays
  (``fp8sim.gemm(..., backend="cupy")``: quantization on the CPU, transfers, kernel, output cast),
  the better of two runs after a warm-up call that compiles the kernels;

and prints every time with the ratios to cuBLASLt blockwise.  The emulation never calls the
tensor-core instructions it models.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def _events(torch, fn, reps: int) -> float:
    fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(reps):
        fn()
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) / 1e3 / reps


def bench(M: int, N: int, K: int, reps: int = 20) -> dict:
    import torch

    import fp8sim
    from fp8sim.tensorcore import cuda as tc_cuda

    rng = np.random.default_rng(0)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((N, K)).astype(np.float32)
    dev = "cuda"
    a = torch.from_numpy(x).to(dev).to(torch.float8_e4m3fn)
    b = torch.from_numpy(w).to(dev).to(torch.float8_e4m3fn).t()
    nkb, nnb = -(-K // 128), -(-N // 128)
    sa = torch.ones((nkb, M), device=dev).t()
    sb = torch.ones((nnb, nkb), device=dev).t()
    one = torch.tensor(1.0, device=dev)
    out = {"M": M, "N": N, "K": K}
    out["cublaslt_block_s"] = _events(torch, lambda: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16), reps)
    out["cublaslt_tensor_s"] = _events(
        torch, lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16, use_fast_accum=False), reps
    )
    xb, wb = torch.from_numpy(x).to(dev).bfloat16(), torch.from_numpy(w).to(dev).bfloat16()
    out["torch_bf16_s"] = _events(torch, lambda: xb @ wb.t(), reps)
    fp8sim.gemm(x[:512, :1024], w[:512, :1024], "deepseek-v3", layout="nk", backend="cupy")  # compile, build
    e2e, kern = [], []
    for _ in range(2):  # the better of two runs
        t0 = time.perf_counter()
        fp8sim.gemm(x, w, "deepseek-v3", layout="nk", backend="cupy")
        e2e.append(time.perf_counter() - t0)
        kern.append(float(tc_cuda.last_kernel_seconds))
    out["fp8sim_end_to_end_s"] = min(e2e)
    out["fp8sim_kernel_s"] = min(kern)
    base = out["cublaslt_block_s"]
    out["ratio_kernel_vs_cublaslt_block"] = out["fp8sim_kernel_s"] / base
    out["ratio_end_to_end_vs_cublaslt_block"] = out["fp8sim_end_to_end_s"] / base
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="2048,4096,8192")
    ap.add_argument("--skinny", default="64,64,16384")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    import torch

    shapes = [(n, n, n) for n in map(int, a.sizes.split(","))] + [tuple(map(int, a.skinny.split(",")))]
    rows = []
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(
        f"{'M x N x K':>20} {'cuBLASLt block':>15} {'cuBLASLt tensor':>16} {'torch bf16':>11} "
        f"{'fp8sim kernel':>14} {'fp8sim e2e':>11} {'kernel ratio':>13} {'e2e ratio':>10}"
    )
    for M, N, K in shapes:
        r = bench(M, N, K)
        rows.append(r)
        print(
            f"{f'{M} x {N} x {K}':>20} {r['cublaslt_block_s'] * 1e3:>12.3f} ms {r['cublaslt_tensor_s'] * 1e3:>13.3f} ms "
            f"{r['torch_bf16_s'] * 1e3:>8.3f} ms {r['fp8sim_kernel_s'] * 1e3:>11.1f} ms {r['fp8sim_end_to_end_s']:>9.2f} s "
            f"{r['ratio_kernel_vs_cublaslt_block']:>12.0f}x {r['ratio_end_to_end_vs_cublaslt_block']:>9.0f}x",
            flush=True,
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
