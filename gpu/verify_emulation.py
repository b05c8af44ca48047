"""Verify the CUDA-core emulation kernel against the CPU kernel on a GPU and record the counts.

Usage (a machine with an NVIDIA GPU and CuPy)::

    PYTHONPATH=. python3 gpu/verify_emulation.py --out tests/data/cuda_kernel_run.json

Compares :func:`fp8sim.tensorcore.cuda.device_wgmma_gemm` (both tile shapes and the parallel
promotion-interval path) with the CPU kernel behind ``fp8sim.gemms.engine.scaled_matmul`` on random
codes (the whole code space, quantized Gaussians, outlier columns, many zeros), every scale mode,
promotion 32 and 128, all four e4m3/e5m2 pairs, ragged and large shapes, and ``fp8sim.gemm`` on
device arrays against host arrays for the library presets.  Writes the number of outputs compared
and of mismatches (bit patterns; two NaNs count as equal) with the SHA-256 of the kernel source, so
that tests/test_cuda_kernel.py can tell on a machine without a GPU that the record is of this kernel.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform

import numpy as np


def _same(x, y) -> np.ndarray:
    x, y = np.asarray(x, np.float32), np.asarray(y, np.float32)
    return (x.view(np.uint32) == y.view(np.uint32)) | (np.isnan(x) & np.isnan(y))


def main() -> None:
    import cupy as cp

    import fp8sim
    from fp8sim.gemms.engine import scaled_matmul
    from fp8sim.tensorcore import cuda
    from fp8sim.tensorcore.fast import SCALE_EPILOGUE, SCALE_FMA, SCALE_MUL_ADD

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=11)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    apply_ = {
        SCALE_FMA: ("promotion", "fma"),
        SCALE_MUL_ADD: ("promotion", "mul-add"),
        SCALE_EPILOGUE: ("epilogue", "fma"),
    }

    def codes(shape, fmt, kind):
        if kind == "all":
            return rng.integers(0, 256, shape, dtype=np.uint8)
        x = rng.standard_normal(shape).astype(np.float32) * np.float32(2.0) ** rng.integers(-6, 7, (shape[0], 1))
        if kind == "outliers":
            x[:, rng.integers(0, shape[1], 5)] *= 300
        c = fp8sim.quantize(x, fmt, "tensor").codes.copy()
        if kind == "zeros":
            c[rng.random(shape) < 0.4] = 0
        return c

    rows = []
    total = bad = 0
    shapes = [(1, 1, 32), (33, 47, 160), (130, 257, 512), (256, 256, 2048), (64, 64, 8192), (300, 129, 1056)]
    for fa, fb in (("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3"), ("e5m2", "e5m2")):
        for kind in ("all", "normal", "outliers", "zeros"):
            for M, N, Kp in shapes:
                for mode in (SCALE_FMA, SCALE_MUL_ADD, SCALE_EPILOGUE):
                    for promote in (32, 128):
                        kscale = Kp if mode == SCALE_EPILOGUE else 128
                        a = codes((M, Kp), fa, kind)
                        b = codes((N, Kp), fb, kind).T.copy()
                        nks = 1 if mode == SCALE_EPILOGUE else -(-Kp // kscale)
                        sa = (2.0 ** rng.integers(-8, 8, (M, nks)) * rng.uniform(1, 2, (M, nks))).astype(np.float32)
                        sb = (2.0 ** rng.integers(-8, 8, (nks, N)) * rng.uniform(1, 2, (nks, N))).astype(np.float32)
                        at, app = apply_[mode]
                        ref = scaled_matmul(
                            a, b, sa, sb, a_format=fa, b_format=fb, kscale=kscale, promote_every=promote,
                            scale_at=at, scale_application=app,
                        )  # fmt: skip
                        for sms in (1, 10**6):
                            y = cuda.device_wgmma_gemm(
                                cp.asarray(a), cp.asarray(b), fp8sim.format(fa), fp8sim.format(fb), cp.asarray(sa),
                                cp.asarray(sb), kscale, promote, mode, 13, -1024, sms=sms,
                            )  # fmt: skip
                            miss = int((~_same(ref, cp.asnumpy(y))).sum())
                            total += ref.size
                            bad += miss
                            if miss:
                                rows.append(
                                    dict(
                                        fa=fa,
                                        fb=fb,
                                        kind=kind,
                                        shape=[M, N, Kp],
                                        mode=mode,
                                        promote=promote,
                                        sms=sms,
                                        mismatches=miss,
                                    )
                                )
    gemm_total = gemm_bad = 0
    for recipe in (
        "deepseek-v3",
        "per-tensor",
        "cublaslt-tensor",
        "cublaslt-row",
        "cublaslt-block",
        "triton",
        "triton-imprecise-32",
    ):
        r = fp8sim.recipe(recipe)
        for M, N, K in ((200, 336, 1040), (512, 512, 4096), (64, 64, 16384)):
            x = (rng.standard_normal((M, K)) * 2.0 ** rng.integers(-4, 5, (M, 1))).astype(np.float32)
            w = (rng.standard_normal((N, K)) * 0.05).astype(np.float32)
            x[0, :4] = [np.nan, np.inf, -np.inf, -0.0]
            for rr in (r, r.with_(split_k=4)) if r.scale_at == "epilogue" else (r,):
                ref = fp8sim.gemm(x, w, rr, layout="nk")
                got = cp.asnumpy(fp8sim.gemm(cp.asarray(x), cp.asarray(w), rr, layout="nk", backend="cupy"))
                miss = int((~_same(ref, got)).sum())
                gemm_total += ref.size
                gemm_bad += miss
                if miss:
                    rows.append(dict(recipe=recipe, split_k=rr.split_k, shape=[M, N, K], mismatches=miss))
    rec = {
        "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
        "cupy": cp.__version__,
        "python": platform.python_version(),
        "kernel_source_sha256": hashlib.sha256(cuda.CUDA_SOURCE.encode()).hexdigest(),
        "kernel_outputs_compared": total,
        "kernel_mismatches": bad,
        "device_gemm_outputs_compared": gemm_total,
        "device_gemm_mismatches": gemm_bad,
        "failures": rows,
    }
    with open(args.out, "w") as f:
        json.dump(rec, f, indent=1)
    print(json.dumps({k: v for k, v in rec.items() if k != "failures"}, indent=1))


if __name__ == "__main__":
    main()
