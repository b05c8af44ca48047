"""FP8 GEMMs on GPU device arrays: quantization, the emulation kernel and the output cast, all on the GPU.

``fp8sim.gemm(x, w, recipe, backend="cupy")`` comes here when ``x`` and ``w`` are CuPy arrays or CUDA
torch tensors (through DLPack, no copy).  The result is a CuPy array on the same device, bit for
bit what the host path computes (tests/test_cuda_kernel.py).  What runs on the GPU:

* quantization of float32 (or bfloat16 / float16, converted exactly) operands to 8-bit formats with
  fp32 block scales (``"tensor"``, ``"row"``, ``"1x128"``, ``"128x128"`` and any other fixed block
  shape), round to nearest even, saturating, ``margin`` powers of two -- :func:`quantize_device`;
* the accumulator model's CUDA-core kernel (:mod:`fp8sim.tensorcore.cuda`), split-K slices and
  epilogue scale orders as :func:`fp8sim.gemms.engine.run_codes` runs them;
* the output cast (bf16 or fp32, round to nearest even, the hardware's canonical NaN).

Recipes outside that (other scale formats or roundings, delayed scaling, NVFP4 two-level scales)
raise ``NotImplementedError`` naming the field; pass host arrays for them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "is_device_array",
    "as_cupy",
    "quantize_device",
    "dequantize_device",
    "cast_output_device",
    "gemm_device",
]

_QUANT_SOURCE = r"""
__device__ __forceinline__ unsigned char rne8(double q, unsigned int sign, int mbits, int emin, int max_mag,
                                             int nan_code)
{
    if (q != q) return (unsigned char)(nan_code | sign);
    const unsigned long long a = (unsigned long long)__double_as_longlong(q) & 0x7FFFFFFFFFFFFFFFull;
    const double aa = __longlong_as_double((long long)a);
    long long mag;
    if (aa >= ldexp(1.0, emin)) {  // normal range: round the pattern to mbits fraction bits (carries ok)
        const int s = 52 - mbits;
        const unsigned long long lsb = (a >> s) & 1ull;
        const unsigned long long r = (a + ((1ull << (s - 1)) - 1ull) + lsb) >> s;
        mag = (long long)r - ((long long)(1023 + emin - 1) << mbits);
        if (mag > max_mag) mag = max_mag;  // saturate (inf included)
    } else {  // subnormal range: adding 2^(emin - mbits + 52) rounds to the spacing, RNE
        const double magic = ldexp(1.0, emin - mbits + 52);
        mag = __double_as_longlong(aa + magic) - __double_as_longlong(magic);
    }
    return (unsigned char)((unsigned int)mag | sign);
}

// codes[i * ldc + j] = RNE(x[i, j] / scale of its (bm, bc) block) for j < C, 0 for C <= j < ldc
extern "C" __global__ void quantize8(const float* __restrict__ x, const float* __restrict__ scales,
                                     unsigned char* __restrict__ codes, long long R, long long C, long long ldc,
                                     int bm, int bc, int nbc, int mbits, int emin, int max_mag, int nan_code)
{
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= R * ldc) return;
    const long long i = t / ldc, j = t - i * ldc;
    if (j >= C) { codes[t] = 0; return; }
    const float xv = x[i * C + j];
    const float s = scales[(i / bm) * nbc + j / bc];
    const double q = (double)xv / (double)s;
    unsigned int sign;
    if (xv != xv) sign = (__float_as_uint(xv) >> 31) << 7;      // a NaN element keeps its sign
    else if (s != s) sign = (__float_as_uint(s) >> 31) << 7;    // a NaN scale: the scale's NaN
    else sign = (unsigned int)(__double_as_longlong(q) >> 63) << 7;
    codes[t] = rne8(q, sign, mbits, emin, max_mag, nan_code);
}

// the fp32 scale of a block from its amax (float32): float32(amax / fmax * m2) clamped to
// [2^-126, FLT_MAX], NaN for a NaN amax (fp8sim.scaling.policy.scale_fp32)
extern "C" __global__ void scales_fp32(const float* __restrict__ amax, float* __restrict__ s, long long n,
                                       double fmt_max, double m2)
{
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    const float a = amax[t];
    if (a != a) { s[t] = __int_as_float(0x7FC00000); return; }
    const double q = (double)(float)(((double)a / fmt_max) * m2);
    s[t] = (float)fmin(fmax(q, 0x1p-126), 3.4028234663852886e38);
}

// y (float32 storage) rounded to bf16 (RNE) or kept as fp32, NaN as the canonical quiet NaN
extern "C" __global__ void cast_out(const float* __restrict__ y, float* __restrict__ out, long long n, int bf16)
{
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    const unsigned int b = __float_as_uint(y[t]);
    unsigned int r;
    if ((b & 0x7FFFFFFFu) > 0x7F800000u) r = bf16 ? 0x7FFF0000u : 0x7FFFFFFFu;
    else if (bf16) r = (b + 0x7FFFu + ((b >> 16) & 1u)) & 0xFFFF0000u;
    else r = b;
    out[t] = __uint_as_float(r);
}
"""

_mod: Any = None


_abs_kernel: Any = None


def _abs_finite(x):
    import cupy as cp

    global _abs_kernel
    if _abs_kernel is None:
        _abs_kernel = cp.ElementwiseKernel(
            "float32 x", "float32 y", "y = isinf(x) ? 0.0f : fabsf(x)", "fp8sim_abs_finite"
        )
    return _abs_kernel(x)


def _kernels():
    import cupy as cp

    global _mod
    if _mod is None:
        _mod = cp.RawModule(code=_QUANT_SOURCE)
    return _mod


def is_device_array(a) -> bool:
    """Whether ``a`` is a CuPy array or a CUDA torch tensor."""
    mod = type(a).__module__
    if mod.startswith("cupy"):
        return True
    if mod.startswith("torch"):
        return bool(getattr(a, "is_cuda", False))
    return False


def as_cupy(a):
    """``a`` as a CuPy array without a copy (CUDA torch tensors through DLPack; bfloat16 and float16
    converted exactly to float32)."""
    import cupy as cp

    if type(a).__module__.startswith("torch"):
        import torch

        t = a.detach()
        if t.dtype in (torch.bfloat16, torch.float16):
            t = t.float()
        return cp.from_dlpack(t)
    return cp.asarray(a)


def as_float32(x, name: str):
    """A device array as contiguous float32 CuPy (bfloat16/float16 widened exactly); TypeError otherwise."""
    import cupy as cp

    x = as_cupy(x)
    if x.dtype == cp.float16:
        x = x.astype(cp.float32)
    if x.dtype == cp.float64:
        raise TypeError(f"fp8sim.gemm: device input {name} is float64; the GPU path takes float32, bfloat16 or float16")
    if x.dtype != cp.float32:
        raise TypeError(f"fp8sim.gemm: device input {name} must be float32, bfloat16 or float16, got {x.dtype}")
    if x.ndim != 2:
        raise ValueError(f"fp8sim.gemm: {name} must be 2-D, got shape {x.shape}")
    if x.size == 0:
        raise ValueError(f"fp8sim.gemm: {name} is empty (shape {x.shape})")
    return cp.ascontiguousarray(x)


def quantize_device(x, fmt, block: tuple[int, int], *, margin: int = 0, kp: int | None = None):
    """Quantize the 2-D float32 CuPy array ``x (R, C)`` to ``fmt`` (an 8-bit format) with one fp32 scale
    per ``block`` (rows, cols) tile: amax (NaN propagates, inf skipped), ``float32(amax / max *
    2**margin)`` clamped to [2**-126, FLT_MAX], codes RNE with saturation -- what
    :func:`fp8sim.quantize` computes for these settings.  Returns ``(codes (R, kp), scales (nbr,
    nbc))``, the codes zero-padded to ``kp`` columns (default C)."""
    import cupy as cp

    R, C = x.shape
    bm, bc = int(block[0]), int(block[1])
    nbr, nbc = -(-R // bm), -(-C // bc)
    a = _abs_finite(x)  # |x|, inf as 0 (an amax skips inf; NaN stays NaN)
    if nbr * bm != R or nbc * bc != C:
        a = cp.pad(a, ((0, nbr * bm - R), (0, nbc * bc - C)))
    a = a.reshape(nbr, bm, nbc, bc)
    amax = a.max(axis=3) if bc > 1 else a[:, :, :, 0]  # two stages, each parallel over its outputs
    amax = cp.ascontiguousarray(amax.max(axis=1) if bm > 1 else amax[:, 0, :])
    scales = cp.empty((nbr, nbc), cp.float32)
    k = _kernels()
    k.get_function("scales_fp32")(
        (-(-amax.size // 256),), (256,), (amax, scales, np.int64(amax.size), float(fmt.max), 2.0 ** int(margin))
    )
    kp = C if kp is None else int(kp)
    codes = cp.empty((R, kp), cp.uint8)
    n = R * kp
    nan_code = fmt.nan_code if fmt.nan_code is not None else fmt.max_code_mag
    k.get_function("quantize8")(
        (-(-n // 256),),
        (256,),
        (
            x, scales, codes, np.int64(R), np.int64(C), np.int64(kp), np.int32(bm), np.int32(bc), np.int32(nbc),
            np.int32(fmt.mbits), np.int32(fmt.emin), np.int32(fmt.max_code_mag), np.int32(nan_code),
        ),
    )  # fmt: skip
    return codes, scales


def cast_output_device(y, out_fmt: str):
    """:func:`fp8sim.gemms.engine.cast_output` on a CuPy float32 array (``"bf16"`` or ``"fp32"``)."""
    import cupy as cp

    if out_fmt not in ("bf16", "fp32"):
        raise NotImplementedError(f"fp8sim.gemm: output format {out_fmt!r} on device arrays (bf16 and fp32 are)")
    out = cp.empty_like(y)
    n = y.size
    _kernels().get_function("cast_out")((-(-n // 256),), (256,), (y, out, np.int64(n), np.int32(out_fmt == "bf16")))
    return out


def unsupported_reason(r, fmt_x, fmt_w, gx, gw) -> str | None:
    """Why the GPU path cannot run recipe ``r`` with these formats and granularities, or None."""
    from ..rounding.fast8 import fast_params

    for name, f in (("x_format", fmt_x), ("w_format", fmt_w)):
        if f.bits != 8 or fast_params(f, True) is None:
            return f"{name} {f.name}"
    if r.scale_format not in (None, "fp32"):
        return f"scale_format {r.scale_format!r}"
    if r.scale_rounding is not None:
        return f"scale_rounding {r.scale_rounding!r}"
    from ..scaling.orientation import along_k

    for name, g, op in (("x_granularity", gx, "x"), ("w_granularity", gw, "w")):
        if not along_k(g, op).device_quantizable:
            return f"{name} {g!r}"
    return None


def dequantize_device(codes, scales, fmt, block: tuple[int, int]):
    """``decode(codes) * scale`` of its block, exact in float64 and rounded once to float32, as
    :meth:`fp8sim.QuantizedTensor.dequantize` computes it; CuPy arrays ``codes (R, C)``, ``scales``."""
    import cupy as cp

    from ..rounding import decode_table

    R, C = codes.shape
    bm, bc = int(block[0]), int(block[1])
    table = cp.asarray(decode_table(fmt).astype(np.float64))
    s = cp.repeat(cp.repeat(scales.astype(cp.float64), bm, axis=0)[:R], bc, axis=1)[:, :C]
    return (table[codes] * s).astype(cp.float32)


def gemm_device(x, w, r, layout: str = "kn", *, formats=None, granularities=None):
    """The FP8 GEMM of recipe ``r`` (a :class:`~fp8sim.Recipe`) on device arrays: ``x (M, K)``, ``w (K, N)``
    or ``(N, K)`` with ``layout="nk"``.  Returns a CuPy float32 (M, N) array of output-format values.

    ``formats`` and ``granularities`` (pairs for x and w, spelled as in a recipe) override the
    recipe's own, as a training GEMM's role needs (:func:`fp8sim.training.matmul`)."""
    import cupy as cp

    from ..formats import format as get_format
    from ..scaling.orientation import along_k
    from .engine import run_codes
    from .operands import padded_k

    fx, fw = (get_format(f) for f in (formats or (r.x_format, r.w_format)))
    gx_spec, gw_spec = granularities or (r.x_granularity, r.w_granularity)
    why = unsupported_reason(r, fx, fw, gx_spec, gw_spec)
    if why is not None:
        raise NotImplementedError(
            f"fp8sim.gemm on device arrays: {why} is not implemented on the GPU; pass host arrays"
        )
    x = as_float32(x, "x")
    w = as_float32(w, "w")
    M, K = x.shape
    if layout == "nk":
        N, Kw = w.shape
    elif layout == "kn":
        Kw, N = w.shape
    else:
        raise ValueError(f"fp8sim.gemm: layout must be 'kn' or 'nk', got {layout!r}")
    if Kw != K:
        raise ValueError(f"fp8sim.gemm: inner dimensions differ: x {x.shape}, w {w.shape} ({layout})")
    Kp = padded_k(K, r.promote_every)
    gx = along_k(gx_spec, "x")
    bmx, bkx = gx.block_shape((M, K))
    gw = along_k(gw_spec, "w")  # blocks of w as (K, N)
    bkw, bnw = gw.block_shape((K, N))
    A, sx = quantize_device(x, fx, (bmx, bkx), margin=r.margin, kp=Kp)
    if layout == "nk":
        Bt, sw_nk = quantize_device(w, fw, (bnw, bkw), margin=r.margin, kp=Kp)
        sw = sw_nk.T  # (nbk, nbn)
    else:
        cw, sw = quantize_device(w, fw, (bkw, bnw), margin=r.margin)
        Bt = cp.zeros((N, Kp), cp.uint8)
        Bt[:, :K] = cw.T
    # scales per K block, as fp8sim.gemms.operands.k_scales
    bkx = K if sx.shape[1] == 1 else bkx
    bkw = K if sw.shape[0] == 1 else bkw
    kscale = min(bkx, bkw)
    for b, n in ((bkx, sx.shape[1]), (bkw, sw.shape[0])):
        if n > 1 and b % kscale:
            raise ValueError(f"fp8sim.gemm: scale blocks along K of {bkx} (x) and {bkw} (w) do not nest")
    if kscale % 32 and sx.shape[1] * sw.shape[0] > 1:
        raise ValueError(f"fp8sim.gemm: K scale blocks must be multiples of 32 (one MMA), got {kscale}")
    nks = -(-Kp // kscale) if kscale < K else 1
    j = np.arange(nks) * kscale
    ia = np.minimum(j // bkx, sx.shape[1] - 1) if sx.shape[1] > 1 else np.zeros(nks, int)
    iw = np.minimum(j // bkw, sw.shape[0] - 1) if sw.shape[0] > 1 else np.zeros(nks, int)
    ident_a = sx.shape[1] == nks and (ia == np.arange(nks)).all()
    ident_w = sw.shape[0] == nks and (iw == np.arange(nks)).all()
    sa = sx if bmx == 1 else cp.repeat(sx, bmx, axis=0)[:M]
    sa = cp.ascontiguousarray(sa if ident_a else sa[:, cp.asarray(ia)])
    sb = sw if bnw == 1 else cp.repeat(sw, bnw, axis=1)[:, :N]
    sb = cp.ascontiguousarray(sb if ident_w else sb[cp.asarray(iw)])
    y32 = run_codes(A, Bt.T, sa, sb, kscale if kscale < K else Kp, fx, fw, r, K=K, backend="cupy")
    return cast_output_device(y32, r.output_format)
