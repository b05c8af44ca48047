"""Hardware oracle for fp8sim.gemm: a scaled FP8 GEMM on the H200 (kernels/gemm.cu).

``fp8_gemm(qx, qw, recipe)`` runs the DeepSeek-V3 recipe (wgmma m64n8k32
e4m3, 1x128 activation scales, 128x128 weight scales, promotion every 128
into fp32 with ``fma(sa*sb, partial, acc)``) or the per-tensor
no-promotion variant on the GPU and returns (fp32 output, bf16 output as
float32).  Operands come from :func:`fp8sim.gemms.operands.quantize_operands`, so
the codes and scales are the ones the CPU emulator uses.

Capture (on the GPU machine, from the repository root)::

    PYTHONPATH=. python3 -m gpu.gemm OUTDIR

builds the kernel, checks it on exactly representable inputs, runs every
case of :data:`CASES`, stores seeds, sizes, checksums of the quantized
operands and the outputs of a few sampled rows (``OUTDIR/gemm_sm90.npz``),
and times the kernel next to ``torch._scaled_mm`` (``OUTDIR/gemm_timing.json``).
``tests/test_gemm.py`` regenerates the operands from the seeds and checks
that ``fp8sim.gemm`` reproduces the stored rows bit for bit.
"""

from __future__ import annotations

import json
import os
import sys
import time
import zlib
from dataclasses import replace

import numpy as np

try:
    import cupy as cp
except Exception:  # pragma: no cover - CuPy is optional
    cp = None

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "kernels", "gemm.cu")
LBO, SBO = 128, 256  # no-swizzle K-major descriptor fields found in run 1 (gpu/NOTES.md)

# (name, M, N, K, distribution, seed, recipe, sampled rows)
CASES = [
    ("normal_256x256x512", 256, 256, 512, "normal", 101, "deepseek-v3", 256),
    ("normal_192x160x1000", 192, 160, 1000, "normal", 102, "deepseek-v3", 192),
    ("uniform_1024x1024x1024", 1024, 1024, 1024, "uniform", 103, "deepseek-v3", 16),
    ("outlier_2048x2048x2048", 2048, 2048, 2048, "outlier", 104, "deepseek-v3", 8),
    ("uniform_512x512x3000", 512, 512, 3000, "uniform", 105, "deepseek-v3", 16),
    ("normal_4096x4096x4096", 4096, 4096, 4096, "normal", 106, "deepseek-v3", 8),
    ("uniform_4096x4096x4096", 4096, 4096, 4096, "uniform", 107, "deepseek-v3", 8),
    ("uniform_512x512x4096_noprom", 512, 512, 4096, "uniform", 108, "per-tensor-no-promotion", 16),
    ("normal_4096x4096x4096_noprom", 4096, 4096, 4096, "normal", 109, "per-tensor-no-promotion", 8),
    ("nan_codes_256x256x512", 256, 256, 512, "nan_codes", 110, "deepseek-v3", 256),
]


def make_inputs(M, N, K, dist, seed):
    """Deterministic float32 x (M, K) and w (K, N) for a case."""
    rng = np.random.default_rng(seed)
    if dist == "uniform":
        x = rng.random((M, K))
        w = rng.random((K, N))
    else:
        x = rng.standard_normal((M, K))
        w = rng.standard_normal((K, N))
        if dist == "outlier":
            ch = rng.choice(K, size=max(2, K // 128), replace=False)
            x[:, ch] *= 100.0
            x[rng.random((M, K)) < 1e-3] *= 1e4
    return x.astype(np.float32), w.astype(np.float32)


def case_operands(case):
    """(qx, qw, recipe) for a case: the operands every path (GPU, CPU) consumes."""
    import fp8sim
    from fp8sim.gemms.operands import quantize_operands

    name, M, N, K, dist, seed, rname, _ = case
    x, w = make_inputs(M, N, K, "normal" if dist == "nan_codes" else dist, seed)
    r = fp8sim.recipe(rname)
    qx, qw = quantize_operands(x, w, r)
    if dist == "nan_codes":  # E4M3 NaN codes (0x7f / 0xff) in a few places of both operands
        rng = np.random.default_rng(seed + 1000)
        cx, cw = qx.codes.copy(), qw.codes.copy()
        cx[rng.random(cx.shape) < 2e-4] = 0x7F
        cw[rng.random(cw.shape) < 2e-4] = 0xFF
        qx, qw = replace(qx, codes=cx), replace(qw, codes=cw)
    return qx, qw, r


def sampled_rows(case) -> np.ndarray:
    name, M, N, K, dist, seed, rname, nrows = case
    if nrows >= M:
        return np.arange(M)
    return np.sort(np.random.default_rng(seed + 2000).choice(M, nrows, replace=False))


def take_rows(q, rows):
    """The QuantizedTensor of the rows ``rows`` of an (M, K) operand (scales follow their blocks)."""
    bm = q.block_shape[0]
    return replace(
        q,
        codes=np.ascontiguousarray(q.codes[rows]),
        scales=np.ascontiguousarray(q.scales[rows // bm]),
        amax=np.ascontiguousarray(q.amax[rows // bm]),
        shape=(len(rows), q.shape[1]),
        _view=None,
    )


def checksum(qx, qw) -> int:
    c = 0
    for a in (qx.codes, qx.scales, qw.codes, qw.scales):
        c = zlib.crc32(np.ascontiguousarray(a).tobytes(), c)
    return int(c)


def kernel_operands(qx, qw, r):
    """Padded codes and scale arrays in the kernel's layout (the same as fp8sim's CPU kernel)."""
    from fp8sim.gemms.operands import kernel_inputs

    M, N = qx.shape[0], qw.shape[1]
    A, B, sa, sb, kscale = kernel_inputs(qx, qw, r.promote_every)
    Kp = A.shape[1]
    Mp, Np = -(-M // 64) * 64, -(-N // 32) * 32
    A = np.pad(A, ((0, Mp - M), (0, 0)))
    Bt = np.ascontiguousarray(np.pad(B, ((0, 0), (0, Np - N))).T)
    sa = np.pad(sa, ((0, Mp - M), (0, 0)), constant_values=1.0)
    sb = np.pad(sb, ((0, 0), (0, Np - N)), constant_values=1.0)
    promote = 0 if r.promote_every is None else r.promote_every // 32
    return A, Bt, np.ascontiguousarray(sa), np.ascontiguousarray(sb), int(kscale), promote, (M, N, Mp, Np, Kp)


# ------------------------------------------------------------------ GPU side
_mod = None


def _module():
    global _mod
    if _mod is None:
        from .launch import load_module

        _mod = load_module(SRC, "gemm_sm90a.cubin")
    return _mod


def launch(ops, reps: int = 1):
    """Run the kernel on device arrays; returns (D, Dbf, seconds per run)."""
    A, Bt, sa, sb, kscale, promote, (M, N, Mp, Np, Kp) = ops
    f = _module().get_function("fp8_gemm_e4m3")
    dA, dB, dsa, dsb = (cp.asarray(a) for a in (A, Bt, sa, sb))
    dD = cp.empty((Mp, Np), cp.float32)
    dDb = cp.empty((Mp, Np), cp.uint16)
    args = (
        dA,
        dB,
        dsa,
        dsb,
        dD,
        dDb,
        np.int32(Mp),
        np.int32(Np),
        np.int32(Kp),
        np.int32(sa.shape[1]),
        np.int32(kscale),
        np.int32(promote),
        np.int32(LBO),
        np.int32(SBO),
    )
    grid = (Np // 32, Mp // 64)
    f(grid, (128,), args)
    cp.cuda.Device().synchronize()
    t = float("nan")
    if reps > 0:
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        for _ in range(reps):
            f(grid, (128,), args)
        e1.record()
        e1.synchronize()
        t = cp.cuda.get_elapsed_time(e0, e1) / 1e3 / reps
    D = cp.asnumpy(dD)[:M, :N]
    Db = (cp.asnumpy(dDb)[:M, :N].astype(np.uint32) << 16).view(np.float32)
    return D, Db, t


def sanity() -> dict:
    """Small-integer operands (exact products and sums) with scales 1: D must equal the exact result."""
    import fp8sim

    rng = np.random.default_rng(7)
    M, N, K = 128, 64, 512
    xv = rng.integers(-3, 4, (M, K)).astype(np.float32)
    wv = rng.integers(-3, 4, (K, N)).astype(np.float32)
    cx, cw = fp8sim.encode(xv, "e4m3"), fp8sim.encode(wv, "e4m3")
    from fp8sim.scaling import quantize

    qx = quantize(xv, "e4m3", "1x128")
    qw = quantize(wv, "e4m3", "128x128")
    qx = replace(qx, codes=cx, scales=np.ones_like(qx.scales))
    qw = replace(qw, codes=cw, scales=np.ones_like(qw.scales))
    res = {}
    for rname in ("deepseek-v3", "per-tensor-no-promotion"):
        rr = fp8sim.recipe(rname)
        if rname != "deepseek-v3":
            qx1 = replace(qx, scales=np.ones((1, 1), np.float32), block_shape=(M, K))
            qw1 = replace(qw, scales=np.ones((1, 1), np.float32), block_shape=(K, N))
        else:
            qx1, qw1 = qx, qw
        D, Db, _ = launch(kernel_operands(qx1, qw1, rr), reps=0)
        exact = xv.astype(np.float64) @ wv.astype(np.float64)
        res[rname] = int((D == exact).sum()), int(D.size)
    return res


def _emulate(ops, r):
    """fp8sim's CUDA-core emulation (backend="cupy") on the kernel's operands; (M, N) float32."""
    from fp8sim.gemms.engine import scaled_matmul

    A, Bt, sa, sb, kscale, promote, (M, N, Mp, Np, Kp) = ops
    y = scaled_matmul(
        A,
        np.ascontiguousarray(Bt.T),
        sa,
        sb,
        a_format="e4m3",
        b_format="e4m3",
        kscale=kscale,
        accumulator=r.accumulator,
        promote_every=r.promote_every,
        scale_at=r.scale_at,
        scale_application=r.scale_application,
        backend="cupy",
    )
    return y[:M, :N]


def _emu_big(n: int) -> dict:
    """Time the CUDA-core emulation on an n^3 DeepSeek-V3-shaped GEMM (random finite codes, scales 1)."""
    from fp8sim.gemms.engine import scaled_matmul
    from fp8sim.tensorcore import cuda as GK

    try:
        rng = np.random.default_rng(5)
        A = rng.integers(0, 0x7E, (n, n), dtype=np.uint8)
        B = rng.integers(0, 0x7E, (n, n), dtype=np.uint8)
        nks = n // 128
        sa = np.ones((n, nks), np.float32)
        sb = np.ones((nks, n), np.float32)
        t = time.time()
        scaled_matmul(A, B, sa, sb, a_format="e4m3", b_format="e4m3", kscale=128, promote_every=128, backend="cupy")
        return {
            f"cupy-emulation {n}^3": {
                "seconds": GK.last_kernel_seconds,
                "call_seconds": time.time() - t,
                "tflops": 2 * n**3 / GK.last_kernel_seconds / 1e12,
            }
        }
    except Exception as e:  # pragma: no cover
        return {f"cupy-emulation {n}^3": repr(e)}


def _torch_timing(n: int) -> dict:
    out = {}
    try:
        import torch

        dev = "cuda"
        a = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn)
        b = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn).t()  # column-major (K, N)
        one = torch.tensor(1.0, device=dev)
        for fast in (False, True):

            def run():
                return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=fast)

            run()
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(10):
                run()
            e1.record()
            torch.cuda.synchronize()
            t = e0.elapsed_time(e1) / 1e3 / 10
            out[f"torch._scaled_mm(use_fast_accum={fast})"] = {"seconds": t, "tflops": 2 * n**3 / t / 1e12}
        x = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        y = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        x @ y
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(10):
            x @ y
        e1.record()
        torch.cuda.synchronize()
        t = e0.elapsed_time(e1) / 1e3 / 10
        out["torch bf16 matmul"] = {"seconds": t, "tflops": 2 * n**3 / t / 1e12}
        out["torch"] = torch.__version__
    except Exception as e:  # pragma: no cover
        out["torch_error"] = repr(e)
    return out


def capture(out_dir: str) -> dict:
    os.makedirs(out_dir, exist_ok=True)
    t0 = time.time()
    try:
        log = {"sanity": sanity()}
    except Exception as e:  # keep going: the captures are still worth having
        import traceback

        traceback.print_exc()
        log = {"sanity": repr(e)}
    print("sanity (exact matches / n):", log["sanity"], flush=True)
    store = {}
    meta = []
    timing = {}
    for case in CASES:
        try:
            _one(case, store, meta, timing)
        except Exception as e:
            import traceback

            traceback.print_exc()
            log.setdefault("errors", []).append(f"{case[0]}: {e!r}")
    _finish(out_dir, t0, log, store, meta, timing)
    return log


def _one(case, store, meta, timing):
    """Run one case on the tensor cores and on the CUDA-core emulation; store the sampled rows."""
    name, M, N, K, dist, seed, rname, _ = case
    tq = time.time()
    qx, qw, r = case_operands(case)
    ops = kernel_operands(qx, qw, r)
    reps = 3 if M * N * K >= 4096**3 else 0
    D, Db, t = launch(ops, reps=reps)
    emu = _emulate(ops, r)
    both_nan = np.isnan(emu) & np.isnan(D)
    emu_bad = int(((emu.view(np.uint32) != D.view(np.uint32)) & ~both_nan).sum())
    rows = sampled_rows(case)
    store[f"{name}/rows"] = rows.astype(np.int32)
    store[f"{name}/d"] = D[rows].view(np.uint32)
    store[f"{name}/d_bf16"] = (Db[rows].view(np.uint32) >> 16).astype(np.uint16)
    meta.append(
        {
            "name": name,
            "M": M,
            "N": N,
            "K": K,
            "dist": dist,
            "seed": seed,
            "recipe": rname,
            "checksum": checksum(qx, qw),
            "nan_outputs": int(np.isnan(D).sum()),
            "cupy_emulation_mismatches": emu_bad,
            "n_outputs": int(D.size),
        }
    )
    if reps:
        timing[name] = {"seconds": t, "tflops": 2 * M * N * K / t / 1e12}
    if reps:
        from fp8sim.tensorcore import cuda as GK

        timing[name + " cupy-emulation"] = {
            "seconds": GK.last_kernel_seconds,
            "tflops": 2 * M * N * K / GK.last_kernel_seconds / 1e12,
        }
    print(
        f"{name}: {time.time() - tq:.1f} s"
        + (f", kernel {t * 1e3:.1f} ms" if reps else "")
        + f", cupy emulation mismatches {emu_bad}/{D.size}",
        flush=True,
    )


def _finish(out_dir, t0, log, store, meta, timing):
    np.savez_compressed(os.path.join(out_dir, "gemm_sm90.npz"), meta=json.dumps(meta), **store)
    timing.update(_torch_timing(4096))
    if time.time() - t0 < 200:
        timing.update(_emu_big(16384))
    try:
        from gpu.launch import device_info

        log["device"] = device_info()
    except Exception as e:  # pragma: no cover
        log["device"] = repr(e)
    log["timing"] = timing
    log["seconds"] = time.time() - t0
    with open(os.path.join(out_dir, "gemm_timing.json"), "w") as f:
        json.dump(log, f, indent=1)
    print(json.dumps(log, indent=1))


if __name__ == "__main__":
    capture(sys.argv[1] if len(sys.argv) > 1 else "gemm_capture")
