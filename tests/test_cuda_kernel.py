"""The CUDA-core emulation kernel (fp8sim.tensorcore.cuda) against the CPU kernel, bit for bit.

The comparisons run where CuPy sees a GPU (skipped elsewhere); the recorded H200 run is checked
everywhere.  The CPU kernel (fp8sim.tensorcore.fast.wgmma_gemm)
is itself tested against the bit-level reference model in tests/test_gemm.py and reproduces the
H200's captures (tests/test_libraries.py); here every tile shape, the parallel-interval path, every
scale mode and promotion interval, both operand formats and the whole code space (zeros, subnormals,
NaN, inf) are compared.
"""

from __future__ import annotations

import numpy as np
import pytest

import fp8sim
from fp8sim.gemms.engine import scaled_matmul
from fp8sim.tensorcore.fast import SCALE_EPILOGUE, SCALE_FMA, SCALE_MUL_ADD


def _gpu():
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


needs_gpu = pytest.mark.skipif(not _gpu(), reason="needs CuPy and an NVIDIA GPU")

_APPLY = {SCALE_FMA: ("promotion", "fma"), SCALE_MUL_ADD: ("promotion", "mul-add"), SCALE_EPILOGUE: ("epilogue", "fma")}


def _codes(rng, shape, fmt, kind):
    if kind == "all":  # the whole code space, NaN and inf included
        return rng.integers(0, 256, shape, dtype=np.uint8)
    x = rng.standard_normal(shape).astype(np.float32) * np.float32(2.0) ** rng.integers(-6, 7, (shape[0], 1))
    if kind == "outliers":
        x[:, rng.integers(0, shape[1], 3)] *= 300
    q = fp8sim.quantize(x, fmt, "tensor")
    c = q.codes.copy()
    if kind == "zeros":
        c[rng.random(shape) < 0.3] = 0
    return c


def _case(rng, M, N, Kp, fa, fb, mode, promote, kind):
    kscale = Kp if mode == SCALE_EPILOGUE else 128
    if mode != SCALE_EPILOGUE and promote == 0:
        promote = 128
    a = _codes(rng, (M, Kp), fa, kind)
    b = _codes(rng, (N, Kp), fb, kind).T.copy()
    nks = 1 if mode == SCALE_EPILOGUE else -(-Kp // kscale)
    sa = (2.0 ** rng.integers(-8, 8, (M, nks)) * rng.uniform(1, 2, (M, nks))).astype(np.float32)
    sb = (2.0 ** rng.integers(-8, 8, (nks, N)) * rng.uniform(1, 2, (nks, N))).astype(np.float32)
    scale_at, app = _APPLY[mode]
    kw = dict(a_format=fa, b_format=fb, kscale=kscale, promote_every=promote, scale_at=scale_at, scale_application=app)
    return (a, b, sa, sb), kw


def _same(x, y):
    x, y = np.asarray(x, np.float32), np.asarray(y, np.float32)
    both_nan = np.isnan(x) & np.isnan(y)
    return (x.view(np.uint32) == y.view(np.uint32)) | both_nan


@needs_gpu
@pytest.mark.parametrize("fa,fb", [("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3"), ("e5m2", "e5m2")])
@pytest.mark.parametrize("kind", ["all", "normal", "outliers", "zeros"])
def test_kernel_equals_cpu(fa, fb, kind):
    import cupy as cp

    from fp8sim.tensorcore import cuda

    rng = np.random.default_rng(abs(hash((fa, fb, kind))) % 2**32)
    for M, N, Kp in [(1, 1, 32), (37, 45, 96), (130, 200, 256), (64, 64, 1024)]:
        for mode in (SCALE_FMA, SCALE_MUL_ADD, SCALE_EPILOGUE):
            for promote in (0, 32, 128):
                if mode != SCALE_EPILOGUE and promote == 0:
                    continue
                (a, b, sa, sb), kw = _case(rng, M, N, Kp, fa, fb, mode, promote, kind)
                ref = scaled_matmul(a, b, sa, sb, **kw)
                got = scaled_matmul(a, b, sa, sb, backend="cupy", **kw)
                assert _same(ref, got).all(), (M, N, Kp, mode, promote, int((~_same(ref, got)).sum()))
                # every tile shape and the parallel-interval path give the same bits
                P = kw["promote_every"]
                m = {"fma": SCALE_FMA, "mul-add": SCALE_MUL_ADD}[kw["scale_application"]]
                m = SCALE_EPILOGUE if kw["scale_at"] == "epilogue" else m
                for sms in (1, 10**6):
                    y = cuda.device_wgmma_gemm(
                        cp.asarray(a), cp.asarray(b), fp8sim.format(fa), fp8sim.format(fb), cp.asarray(sa),
                        cp.asarray(sb), kw["kscale"], P, m, 13, -1024, sms=sms,
                    )  # fmt: skip
                    assert _same(ref, cp.asnumpy(y)).all(), (M, N, Kp, mode, promote, sms)


@needs_gpu
def test_kernel_large_gemm_realistic():
    """One 512 x 640 x 2048 DeepSeek-V3 GEMM from float inputs: GPU and CPU give the same bits."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((512, 2048)).astype(np.float32)
    w = (rng.standard_normal((2048, 640)) * 0.02).astype(np.float32)
    for recipe in ("deepseek-v3", "per-tensor", "cublaslt-block", "cublaslt-tensor", "triton"):
        ref = fp8sim.gemm(x, w, recipe)
        got = fp8sim.gemm(x, w, recipe, backend="cupy")
        assert _same(ref, got).all(), recipe


@needs_gpu
@pytest.mark.parametrize(
    "recipe",
    ["deepseek-v3", "per-tensor", "cublaslt-tensor", "cublaslt-row", "cublaslt-block", "triton", "triton-imprecise-64"],
)
def test_device_gemm_equals_host(recipe):
    """fp8sim.gemm on CuPy device arrays (GPU quantization, kernel, cast) == the host path, bit for bit,
    for both weight layouts, a ragged shape, special values and a split-K variant of the recipe."""
    import cupy as cp

    rng = np.random.default_rng(3)
    r = fp8sim.recipe(recipe)
    for M, N, K in [(200, 336, 1040), (64, 96, 4096)]:
        x = (rng.standard_normal((M, K)) * 2.0 ** rng.integers(-4, 5, (M, 1))).astype(np.float32)
        w = (rng.standard_normal((N, K)) * 0.05).astype(np.float32)
        x[0, :5] = [np.nan, np.inf, -np.inf, 0.0, -0.0]
        x[1, :] = 0.0
        w[2, 7] = np.inf
        for rr in (r, r.with_(split_k=3)) if r.scale_at == "epilogue" else (r,):
            ref = fp8sim.gemm(x, w, rr, layout="nk")
            got = fp8sim.gemm(cp.asarray(x), cp.asarray(w), rr, layout="nk", backend="cupy")
            assert isinstance(got, cp.ndarray)
            assert _same(ref, cp.asnumpy(got)).all(), (recipe, rr.split_k, M, N, K)
            got_kn = fp8sim.gemm(cp.asarray(x), cp.asarray(np.ascontiguousarray(w.T)), rr, backend="cupy")
            assert _same(ref, cp.asnumpy(got_kn)).all(), (recipe, "kn")


@needs_gpu
def test_device_gemm_torch_inputs_and_errors():
    torch = pytest.importorskip("torch")
    import cupy as cp

    rng = np.random.default_rng(4)
    x = rng.standard_normal((96, 512)).astype(np.float32)
    w = rng.standard_normal((128, 512)).astype(np.float32)
    xt = torch.from_numpy(x).cuda().bfloat16()
    wt = torch.from_numpy(w).cuda().bfloat16()
    ref = fp8sim.gemm(xt.float().cpu().numpy(), wt.float().cpu().numpy(), layout="nk")
    got = fp8sim.gemm(xt, wt, layout="nk", backend="cupy")
    assert _same(ref, cp.asnumpy(got)).all()
    with pytest.raises(TypeError, match="both"):
        fp8sim.gemm(cp.asarray(x), w, layout="nk", backend="cupy")
    with pytest.raises(TypeError, match="float64"):
        fp8sim.gemm(cp.asarray(x, cp.float64), cp.asarray(w), layout="nk", backend="cupy")
    with pytest.raises(NotImplementedError, match="report"):
        fp8sim.gemm(cp.asarray(x), cp.asarray(w), layout="nk", backend="cupy", report=True)
    with pytest.raises(NotImplementedError, match="scale_format"):
        fp8sim.gemm(cp.asarray(x), cp.asarray(w), "mxfp8", layout="nk", backend="cupy")


def _record():
    import json
    from pathlib import Path

    p = Path(__file__).parent / "data" / "cuda_kernel_run.json"
    return json.loads(p.read_text()) if p.exists() else None


@pytest.mark.skipif(_record() is None, reason="no recorded GPU run")
def test_recorded_gpu_run_is_of_this_kernel():
    """The run recorded on the H200 (python gpu/verify_emulation.py) compared this kernel's source (by
    hash) with the CPU kernel on >= 10 million outputs and found no mismatch.  Runs everywhere: on a
    machine without a GPU it is the evidence that the CUDA path is bit-exact."""
    import hashlib

    from fp8sim.tensorcore import cuda

    rec = _record()
    assert rec["kernel_source_sha256"] == hashlib.sha256(cuda.CUDA_SOURCE.encode()).hexdigest(), (
        "the kernel changed since the recorded run: re-run gpu/verify_emulation.py on a GPU"
    )
    assert "H200" in rec["device"]
    assert rec["kernel_outputs_compared"] >= 10_000_000 and rec["kernel_mismatches"] == 0
    assert rec["device_gemm_outputs_compared"] >= 1_000_000 and rec["device_gemm_mismatches"] == 0
    assert rec["failures"] == []


@needs_gpu
@pytest.mark.parametrize("recipe", ["deepseek-v3", "te-hybrid", "cublaslt-block", "per-tensor"])
@pytest.mark.parametrize("role", ["fprop", "dgrad", "wgrad"])
def test_device_training_gemm_roles(recipe, role):
    """gemm_device with a role's formats and granularities == fp8sim.training.matmul on the host."""
    import cupy as cp

    from fp8sim.gemms.device import gemm_device
    from fp8sim.training.linear import matmul, role_formats, role_granularities, role_recipe

    rng = np.random.default_rng(5)
    r = fp8sim.recipe(recipe)
    T, din, dout = 300, 256, 384
    if role == "fprop":
        a, b, layout = rng.standard_normal((T, din)), rng.standard_normal((dout, din)) * 0.05, "nk"
    elif role == "dgrad":
        a, b, layout = rng.standard_normal((T, dout)) * 1e-3, rng.standard_normal((dout, din)) * 0.05, "kn"
    else:
        a, b, layout = rng.standard_normal((din, T)), rng.standard_normal((T, dout)) * 1e-3, "kn"
    a, b = a.astype(np.float32), b.astype(np.float32)
    ref = matmul(a, b, r, role, layout=layout)
    got = gemm_device(
        cp.asarray(a), cp.asarray(b), role_recipe(r, role), layout,
        formats=role_formats(r, role), granularities=role_granularities(r, role),
    )  # fmt: skip
    assert _same(ref, cp.asnumpy(got)).all()


@needs_gpu
def test_dequantize_device():
    import cupy as cp

    from fp8sim.gemms.device import dequantize_device, quantize_device

    rng = np.random.default_rng(6)
    x = (rng.standard_normal((130, 300)) * 10).astype(np.float32)
    q = fp8sim.quantize(x, "e4m3", "1x128")
    codes, scales = quantize_device(cp.asarray(x), fp8sim.format("e4m3"), (1, 128))
    assert (cp.asnumpy(codes) == q.codes).all() and _same(q.scales, cp.asnumpy(scales)).all()
    assert _same(
        q.dequantize(np.float32), cp.asnumpy(dequantize_device(codes, scales, fp8sim.format("e4m3"), (1, 128)))
    ).all()
