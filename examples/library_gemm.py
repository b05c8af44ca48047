"""Which FP8 GEMM did my kernel run?  Rebuild torch._scaled_mm's configurations and identify one.

    python examples/library_gemm.py [K]

Makes FP8 codes and rowwise scales, runs them through three library configurations with
fp8sim.scaled_gemm (the bits cuBLASLt and Triton compute on an H200, docs/libraries.md), then
hands one output to fp8sim.identify as if it came from an unknown kernel.
"""

import sys

import numpy as np

import fp8sim

K = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
rng = np.random.default_rng(0)
x = rng.random((32, K)).astype(np.float32)
w = rng.random((48, K)).astype(np.float32)  # torch's weight layout (N, K)
sa = (np.abs(x).max(1, keepdims=True) / 448).astype(np.float32)  # (M, 1)
sb = (np.abs(w).max(1, keepdims=True).T / 448).astype(np.float32)  # (1, N)
a = fp8sim.encode(x / sa, "e4m3")
b = fp8sim.encode(w / sb.T, "e4m3")

exact = fp8sim.decode(a, "e4m3").astype(np.float64) * sa @ (fp8sim.decode(b, "e4m3").astype(np.float64) * sb.T).T
for preset in ("cublaslt-row", "cublaslt-row-fast", "triton"):
    r = fp8sim.recipe(preset).with_(output_format="fp32")
    y = fp8sim.scaled_gemm(a, b, sa, sb, r, layout="nk")
    err = np.linalg.norm(y - exact) / np.linalg.norm(exact)
    print(f"{preset:18s} relative error {err:.2e}   ({r.description[:60]}...)")

# an "unknown" kernel: cuBLASLt rowwise with fast accumulation and 2-way split-K
unknown = fp8sim.scaled_gemm(
    a, b, sa, sb, fp8sim.recipe("cublaslt-row-fast").with_(output_format="fp32", split_k=2), layout="nk"
)
res = fp8sim.identify(a, b, unknown, a_scale=sa, b_scale=sb, layout="nk")
r = res.recipe
print(
    f"identify: match {res.match_rate:.0%} with promote_every={r.promote_every}, split_k={r.split_k}, "
    f"epilogue_scale={r.epilogue_scale!r}, output={r.output_format}"
)
unknown[3, 5] = np.nextafter(unknown[3, 5], np.float32(np.inf))  # one bit flipped
print(fp8sim.identify(a, b, unknown, a_scale=sa, b_scale=sb, layout="nk").explain())
