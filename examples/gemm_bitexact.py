"""Emulate one FP8 GEMM bit-exactly and explain its error.

    python examples/gemm_bitexact.py [--m 256 --k 1024 --n 256] [--recipe deepseek-v3]

The result is the bits an H200 running the recipe's kernel would produce; the
report attributes the error against fp64 to its sources.
"""

import argparse

import numpy as np

import fp8sim

ap = argparse.ArgumentParser()
ap.add_argument("--m", type=int, default=256)
ap.add_argument("--k", type=int, default=1024)
ap.add_argument("--n", type=int, default=256)
ap.add_argument("--recipe", default="deepseek-v3")
args = ap.parse_args()

rng = np.random.default_rng(0)
x = rng.standard_normal((args.m, args.k)).astype(np.float32)
w = (rng.standard_normal((args.k, args.n)) / np.sqrt(args.k)).astype(np.float32)

y, report = fp8sim.gemm(x, w, args.recipe, report=True)
print(fp8sim.recipe(args.recipe).description)
print(report)
y_bf16 = fp8sim.gemm(x, w, "bf16")
ref = x.astype(np.float64) @ w.astype(np.float64)
for name, out in [(args.recipe, y), ("bf16", y_bf16)]:
    err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    print(f"{name:>12}: relative Frobenius error vs fp64 {err:.3e}")
