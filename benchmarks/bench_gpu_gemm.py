"""GPU speed of fp8sim's bit-exact emulation against the libraries it emulates, in one process.

Usage (on a machine with an NVIDIA GPU, torch with CUDA and CuPy)::

    PYTHONPATH=. python3 benchmarks/bench_gpu_gemm.py [--sizes 2048,4096,8192] [--json FILE]

For each M = N = K and a skinny shape (64 x 64 x 16384), it times with CUDA events:

* ``torch._scaled_mm`` blockwise (1x128 x 128x128 fp32 scales, DeepSeek-V3's scaling) and
  tensorwise (fast accumulation off), bf16 output;
* torch's BF16 matmul;
* fp8sim's CUDA-core emulation, **end to end from CUDA tensors** (``fp8sim.gemm(x, w, recipe,
  layout="nk", backend="cupy")`` on fp32 torch CUDA tensors: quantization on the GPU, the
  emulation kernel, the bf16 output cast; wall clock with a device synchronization), for the
  DeepSeek-V3 recipe (against cuBLASLt blockwise) and ``cublaslt-tensor`` (against cuBLASLt
  tensorwise), and the kernel alone (``fp8sim.tensorcore.cuda.last_kernel_seconds``); the better of
  three runs after a warm-up call that compiles the kernels;

and prints every time with the ratios.  The emulation never calls the tensor-core instructions it
models.
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
    xt, wt = torch.from_numpy(x).to(dev), torch.from_numpy(w).to(dev)
    for recipe, key, base in (
        ("deepseek-v3", "", "cublaslt_block_s"),
        ("cublaslt-tensor", "tensor_", "cublaslt_tensor_s"),
    ):
        fp8sim.gemm(xt[:256, :1024], wt[:256, :1024], recipe, layout="nk", backend="cupy")  # compile
        e2e, kern = [], []
        for _ in range(3):  # the best of three
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fp8sim.gemm(xt, wt, recipe, layout="nk", backend="cupy")
            torch.cuda.synchronize()
            e2e.append(time.perf_counter() - t0)
            kern.append(float(tc_cuda.last_kernel_seconds))
        out[f"fp8sim_{key}end_to_end_s"] = min(e2e)
        out[f"fp8sim_{key}kernel_s"] = min(kern)
        out[f"ratio_{key}kernel_vs_{base[:-2]}"] = min(kern) / out[base]
        out[f"ratio_{key}end_to_end_vs_{base[:-2]}"] = min(e2e) / out[base]
    out["ratio_end_to_end_vs_torch_bf16"] = out["fp8sim_end_to_end_s"] / out["torch_bf16_s"]
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
        f"{'DSv3 kernel':>12} {'DSv3 e2e':>10} {'ratio k/e2e':>12} {'tensor e2e':>11} {'ratio':>7}"
    )
    for M, N, K in shapes:
        r = bench(M, N, K)
        rows.append(r)
        print(
            f"{f'{M} x {N} x {K}':>20} {r['cublaslt_block_s'] * 1e3:>12.3f} ms {r['cublaslt_tensor_s'] * 1e3:>13.3f} ms "
            f"{r['torch_bf16_s'] * 1e3:>8.3f} ms {r['fp8sim_kernel_s'] * 1e3:>9.2f} ms {r['fp8sim_end_to_end_s'] * 1e3:>7.2f} ms "
            f"{r['ratio_kernel_vs_cublaslt_block']:>5.0f}x/{r['ratio_end_to_end_vs_cublaslt_block']:>4.0f}x "
            f"{r['fp8sim_tensor_end_to_end_s'] * 1e3:>8.2f} ms {r['ratio_tensor_end_to_end_vs_cublaslt_tensor']:>6.0f}x",
            flush=True,
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
