"""fp8sim's NVFP4 quantization against TransformerEngine's fp32 operation order: how often they differ.

Usage: python analysis/nvfp4_te_arithmetic.py [--rows 512] [--cols 1024] [--seed 0] [--json FILE]

fp8sim (``fp8sim.quantize(x, "e2m1", "nvfp4")``) rounds each quantity once from its exact value:
the tensor scale ``g = fp32(amax / 2688)``, the block scale ``E4M3(amax_b / (6 g))``, the element
``E2M1(x / (s_b g))``.  TransformerEngine's NVFP4 kernels (as its documentation and reference
quantizer describe them) compute, in fp32::

    S_enc = 2688 / amax                      # fp32 division; 1 if amax is 0
    g     = 1 / S_enc                        # the decode scale the tensor stores
    s_b   = E4M3_satfinite(amax_b * (S_enc * fp32(1/6)))
    e     = E2M1_satfinite(x * (1 / (s_b * g)))        # RNE (or stochastic for gradients)

and give the NVFP4 GEMM the alpha ``amax_a * amax_b * fp32(1 / (36 * 448**2))``.  This script
writes TransformerEngine's order out with numpy float32 operations (our own code, from those
formulas) and counts the differences on synthetic tensors: the tensor scale, the block scales, the
element values and the GEMM alpha.  The results are quoted in docs/accelerators.md.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

import fp8sim  # noqa: E402
from fp8sim.scaling.nvfp4 import nvfp4_global_scale  # noqa: E402

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)


def te_quantize(x: np.ndarray, block: int = 16):
    """TransformerEngine's NVFP4 arithmetic on float32 ``x (M, N)``, 1x16 blocks along the rows, RNE:
    ``(g, s_b (M, N / 16) float32 values, element values (M, N) float32)``."""
    amax = F32(np.max(np.abs(x)))
    s_enc = F32(F32(448.0 * 6.0) / amax) if amax != 0 else F32(1.0)
    s_enc = min(s_enc, FLT_MAX)
    if s_enc == 0:
        s_enc = F32(1.0)
    g = F32(1.0 / np.float64(s_enc))  # 1.0 / S_enc in double, stored as float: fp32(1 / S_enc)
    mult = F32(s_enc * F32(1.0 / 6.0))
    bamax = np.max(np.abs(x.reshape(x.shape[0], -1, block)), axis=-1).astype(F32)
    sb32 = np.minimum((bamax * mult).astype(F32), F32(448.0))
    sb = sb32.astype(ml_dtypes.float8_e4m3fn).astype(F32)  # RNE, saturated to 448 above
    with np.errstate(divide="ignore"):
        inv = np.minimum((F32(1.0) / (sb * g).astype(F32)).astype(F32), FLT_MAX)
    scaled = (x.reshape(x.shape[0], -1, block) * inv[..., None]).astype(F32).reshape(x.shape)
    vals = fp8sim.round(scaled, "e2m1", mode="rne", saturate=True).astype(F32)
    return g, sb, vals


def te_alpha(amax_a: float, amax_b: float) -> np.float32:
    """The NVFP4 GEMM's alpha in TransformerEngine: ``((1 * amax_a) * amax_b) * fp32(1 / (36 * 448 * 448))``."""
    factor_inv = F32(F32(1.0) / F32(6.0 * 6.0 * 448.0 * 448.0))
    return F32(F32(F32(amax_a) * F32(amax_b)) * factor_inv)


def families(rows: int, cols: int, rng) -> dict:
    n = rng.standard_normal((rows, cols))
    out = n.copy()
    out[:, rng.choice(cols, cols // 64, replace=False)] *= 100.0
    return {
        "normal": n,
        "lognormal gradients": (n * np.exp(2 * rng.standard_normal((rows, cols))) * 1e-4),
        "outlier channels": out,
        "uniform": rng.uniform(-1, 1, (rows, cols)),
    }


def compare(x: np.ndarray) -> dict:
    x = x.astype(F32)
    q = fp8sim.quantize(x, "e2m1", "nvfp4")
    g, sb, vals = te_quantize(x)
    ours_vals = q.values().astype(F32)
    return {
        "global_scale_equal": bool(F32(q.global_scale) == g),
        "global_scale_rel_diff": float(abs(q.global_scale - float(g)) / float(g)),
        "block_scales_differ": float(np.mean(q.scales.astype(F32) != sb)),
        "elements_differ": float(np.mean(ours_vals != vals)),
        "dequantized_rel_diff": float(
            np.linalg.norm(q.dequantize(np.float64) - vals.astype(np.float64) * np.repeat(sb, 16, axis=1) * float(g))
            / np.linalg.norm(x.astype(np.float64))
        ),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--cols", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    res = {name: compare(x) for name, x in families(args.rows, args.cols, rng).items()}
    amaxes = np.exp(rng.uniform(np.log(1e-6), np.log(1e4), (2, 10000))).astype(F32)
    ours = np.array([F32(nvfp4_global_scale(a)) for a in amaxes.ravel()]).reshape(2, -1)
    te_g = np.array([F32(1.0 / np.float64(F32(F32(2688.0) / a))) for a in amaxes.ravel()]).reshape(2, -1)
    alpha_ours = (ours[0] * ours[1]).astype(F32)
    alpha_te = np.array([te_alpha(a, b) for a, b in amaxes.T])
    res["random amax (10,000 pairs, 1e-6..1e4)"] = {
        "global_scales_differ": float(np.mean(ours != te_g)),
        "alpha_differs": float(np.mean(alpha_ours != alpha_te)),
        "alpha_max_rel_diff": float(np.max(np.abs(alpha_ours.astype(np.float64) / alpha_te - 1))),
    }
    print(json.dumps(res, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
