"""Scaled FP8 GEMMs as real kernels run them, with an error report.

``fp8sim.gemm(x, w, recipe)`` quantizes ``x (M, K)`` and ``w (K, N)`` (or
``(N, K)`` with ``layout="nk"``) as the :class:`~fp8sim.recipes.Recipe` says,
multiplies the FP8 codes on a bit-exact tensor-core accumulator model,
promotes the tensor-core partial into an fp32 accumulator every
``promote_every`` K elements while applying the scales, and casts the result
to the output format.  See docs/gemm.md.

Pipeline for an FP8 recipe (``scale_at="promotion"``, e.g. DeepSeek-V3)::

    codes, scales = quantize(x), quantize(w)           # fp8sim.quantize
    for each promotion interval b (promote_every K elements):
        partial = tensor-core chain over b, starting from 0   # accumulator model
        s = fp32(sa[i, b] * sb[b, j])                         # fp32 multiply
        acc = fma(s, partial, acc)     # or acc + fp32(s * partial) ("mul-add")
    y = round(acc, output_format)                             # bf16: RNE

With ``scale_at="epilogue"`` the promotion is a plain fp32 add and
``y = round(fp32(fp32(sa * sb) * acc))`` (per-tensor scales only).

The stages are: :func:`quantize_operands` (recipe granularities laid along K by
:func:`along_k`), :func:`kernel_inputs` (codes zero-padded along K, scales per K block:
:func:`k_scales`, :func:`pad_k`), :func:`~fp8sim.gemm_core.scaled_matmul` (the arithmetic, in
:mod:`fp8sim.gemm_core`), the output cast, and on request the :class:`GemmReport`
(:mod:`fp8sim.gemm_report`).

K that is not a multiple of the promotion interval / 32 is zero-padded at
the end (zero codes), as TMA-fed kernels do; the ragged last scale block is
the quantizer's own smaller block.  Padding does not change any bit: an
all-zero instruction leaves the accumulator as it is.

Bad input: ``x`` and ``w`` must be 2-D real float arrays (float32, float64,
float16 or bfloat16 -- the last two converted to float32 exactly; any other
dtype, np.longdouble included, raises ``TypeError``) or
:class:`~fp8sim.QuantizedTensor` objects with matching K (``ValueError``
naming the shapes otherwise).  With ``layout="nk"`` a QuantizedTensor ``w``
of shape ``(N, K)`` is transposed with its granularity (a ``Tile(r, c)``
becomes ``Tile(c, r)``, ``1x128`` becomes ``128x1``), so its scales stay on
their blocks.  NaN and +-inf follow the
quantizer's rules (a NaN makes its scale block NaN, so every output that
uses the block is NaN; +-inf saturates to +-max * scale) and then propagate
through the accumulator model as on the H200 (an inf or NaN product makes
the instruction's result inf/NaN; fp32 NaN outputs are 0x7fffffff).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ._fpenv import ieee_defaults
from ._inputs import flag, float_input
from .device import is_device_array
from .gemm_core import cast_output, scaled_matmul, wide_matmul
from .gemm_report import SOURCES, GemmReport, fp8_gemm_report, wide_gemm_report
from .recipes import Recipe
from .recipes import recipe as get_recipe
from .scaled import pad_k, padded_k, run_codes
from .scaling import QuantizedTensor, quantize
from .scaling.orientation import along_k, transpose_granularity

__all__ = [
    "gemm",
    "GemmReport",
    "quantize_operands",
    "scaled_matmul",
    "transpose_granularity",
    "along_k",
    "k_scales",
    "pad_k",
    "padded_k",
    "kernel_inputs",
    "SOURCES",
]


# ------------------------------------------------------------------ input checks
def _as_float2d(a, name: str) -> np.ndarray | QuantizedTensor:
    if isinstance(a, QuantizedTensor):
        return a
    # float32/float64 as they are, float16/bfloat16 exactly to float32, other dtypes: TypeError
    arr, _ = float_input(a, "fp8sim.gemm", name)
    if arr.ndim != 2:
        raise ValueError(f"fp8sim.gemm: {name} must be 2-D, got shape {arr.shape}")
    if 0 in arr.shape:
        raise ValueError(f"fp8sim.gemm: {name} must not be empty, got shape {arr.shape}")
    return arr


def _check_inputs(x, w, layout: str):
    if layout not in ("kn", "nk"):
        raise ValueError(f"fp8sim.gemm: layout must be 'kn' (w is (K, N)) or 'nk' (w is (N, K)), got {layout!r}")
    x = _as_float2d(x, "x")
    w = _as_float2d(w, "w")
    if isinstance(w, QuantizedTensor):
        if len(w.shape) != 2:
            raise ValueError(f"fp8sim.gemm: w must be 2-D, got shape {w.shape}")
        if layout == "nk":
            w = transpose_quantized(w)
    elif layout == "nk":
        w = w.T
    if isinstance(x, QuantizedTensor) and len(x.shape) != 2:
        raise ValueError(f"fp8sim.gemm: x must be 2-D, got shape {x.shape}")
    kx, kw = x.shape[1], w.shape[0]
    if kx != kw:
        wshape = tuple(w.shape) if layout == "kn" else tuple(w.shape)[::-1]
        raise ValueError(
            f"fp8sim.gemm: inner dimensions differ: x is {tuple(x.shape)} (K={kx}), "
            f"w is {wshape} with layout={layout!r} (K={kw})"
        )
    return x, w


# ------------------------------------------------------------------ orientation along K
def transpose_quantized(q: QuantizedTensor) -> QuantizedTensor:
    """The QuantizedTensor of a 2-D ``q``'s transpose: codes, scales, amax AND granularity
    transposed, so that ``transpose_quantized(q).dequantize() == q.dequantize().T``."""
    g = transpose_granularity(q.granularity)
    shape = tuple(q.shape)[::-1]
    if tuple(q.scales.shape[::-1]) != g.scale_shape(shape):  # scales that do not fit their granularity
        raise ValueError(
            f"fp8sim.gemm: cannot transpose {q!r}: its scales {q.scales.shape} do not match "
            f"its granularity {q.granularity.name} on shape {q.shape}"
        )
    return replace(
        q,
        codes=np.ascontiguousarray(q.codes.T),
        scales=np.ascontiguousarray(q.scales.T),
        shape=shape,
        amax=np.ascontiguousarray(np.asarray(q.amax).T),
        block_shape=g.block_shape(shape),
        granularity=g,
        _view=None,
    )


# ------------------------------------------------------------------ quantization
def quantize_operands(x, w, recipe) -> tuple[QuantizedTensor, QuantizedTensor]:
    """Quantize ``x (M, K)`` and ``w (K, N)`` as ``recipe`` says (QuantizedTensors pass through)."""
    r = get_recipe(recipe)
    out = []
    for a, fmt, g, name in ((x, r.x_format, r.x_granularity, "x"), (w, r.w_format, r.w_granularity, "w")):
        if isinstance(a, QuantizedTensor):
            out.append(a)
            continue
        out.append(
            quantize(
                a,
                fmt,
                along_k(g, name),
                scale_format=r.scale_format,
                scale_rounding=r.scale_rounding,
                margin=r.margin,
            )
        )
    return out[0], out[1]


# ------------------------------------------------------------------ the kernel's operands
def k_scales(qx: QuantizedTensor, qw: QuantizedTensor, Kp: int):
    """Scales per K block for the kernel: ``(sa (M, nks), sb (nks, N), kscale, nks)``, float32
    scales and the block length along K (``Kp`` for one block over all of K)."""
    M, K = qx.shape
    N = qw.shape[1]
    bmx, bkx = qx.block_shape
    bkw, bnw = qw.block_shape
    bkx = K if qx.scales.shape[1] == 1 else bkx
    bkw = K if qw.scales.shape[0] == 1 else bkw
    kscale = min(bkx, bkw)
    for b, n in ((bkx, qx.scales.shape[1]), (bkw, qw.scales.shape[0])):
        if n > 1 and b % kscale:
            raise ValueError(f"fp8sim.gemm: scale blocks along K of {bkx} (x) and {bkw} (w) do not nest")
    if kscale % 32 and qx.scales.shape[1] * qw.scales.shape[0] > 1:
        raise ValueError(f"fp8sim.gemm: K scale blocks must be multiples of 32 (one MMA), got {kscale}")
    nks = -(-Kp // kscale) if kscale < K else 1
    j = np.arange(nks) * kscale
    ia = np.minimum(j // bkx, qx.scales.shape[1] - 1) if qx.scales.shape[1] > 1 else np.zeros(nks, int)
    iw = np.minimum(j // bkw, qw.scales.shape[0] - 1) if qw.scales.shape[0] > 1 else np.zeros(nks, int)
    sa = np.repeat(qx.scales.astype(np.float32), bmx, axis=0)[:M][:, ia]
    sb = np.repeat(qw.scales.astype(np.float32), bnw, axis=1)[:, :N][iw]
    gs = float(qx.global_scale) * float(qw.global_scale)
    if gs != 1.0:
        raise ValueError("fp8sim.gemm: two-level (NVFP4) scales are not supported by the FP8 GEMM")
    return np.ascontiguousarray(sa), np.ascontiguousarray(sb), (kscale if kscale < K else Kp), nks


def kernel_inputs(qx: QuantizedTensor, qw: QuantizedTensor, promote_every: int | None):
    """What :func:`scaled_matmul` takes for ``qx (M, K) @ qw (K, N)``: ``(A (M, Kp), B (Kp, N), sa,
    sb, kscale)``, the codes zero-padded to :func:`padded_k` and the scales per K block
    (:func:`k_scales`)."""
    Kp = padded_k(qx.shape[1], promote_every)
    sa, sb, kscale, _nks = k_scales(qx, qw, Kp)
    return pad_k(qx.codes, Kp, 1), pad_k(qw.codes, Kp, 0), sa, sb, kscale


def _fp8(qx: QuantizedTensor, qw: QuantizedTensor, r: Recipe, fidelity: str, backend: str = "cpu"):
    parts = kernel_inputs(qx, qw, r.promote_every)
    A, B, sa, sb, kscale = parts
    y32 = run_codes(A, B, sa, sb, kscale, qx.format, qw.format, r, K=qx.shape[1], fidelity=fidelity, backend=backend)
    return y32, parts


def _gemm_on_device(x, w, r: Recipe, report: bool, layout: str, fidelity: str):
    """:func:`gemm` on GPU device arrays (:mod:`fp8sim.device`): a CuPy array out."""
    from .device import as_cupy, gemm_device, is_device_array

    if not (is_device_array(x) and is_device_array(w)):
        raise TypeError("fp8sim.gemm: x and w must both be device arrays (CuPy or CUDA torch) or both host arrays")
    if report:
        raise NotImplementedError("fp8sim.gemm: report=True needs host arrays (the report's fp64 GEMMs run on the CPU)")
    if fidelity != "exact":
        raise NotImplementedError("fp8sim.gemm: fidelity='fast' on device arrays; the GPU path is the exact model")
    if not r.is_fp8:  # the wide recipes: computed on the host, returned on the device
        import cupy as cp

        return cp.asarray(gemm(cp.asnumpy(as_cupy(x)), cp.asnumpy(as_cupy(w)), r, layout=layout))
    return gemm_device(x, w, r, layout)


# ------------------------------------------------------------------ public
@ieee_defaults
def gemm(
    x,
    w,
    recipe="deepseek-v3",
    *,
    report: bool = False,
    layout: str = "kn",
    backend: str = "cpu",
    fidelity: str = "exact",
    baseline="bf16",
):
    """``y = x @ w`` as the FP8 GEMM ``recipe`` describes.

    Parameters
    ----------
    x : (M, K) float array (float32, float64, float16 or bfloat16; float16 and bfloat16 are
        converted to float32 exactly, other dtypes raise TypeError) or a QuantizedTensor
    w : (K, N) float array or QuantizedTensor; (N, K) with ``layout="nk"`` (torch Linear weights)
    recipe : a preset name (:func:`fp8sim.recipe`) or a :class:`~fp8sim.Recipe`
    report : also return a :class:`GemmReport` (costs a few fp64 GEMMs and one more model GEMM)
    layout : ``"kn"`` or ``"nk"``
    backend : ``"cpu"`` (numba) or ``"cupy"`` (the same arithmetic as a CUDA-core kernel on an NVIDIA
        GPU, bit-identical; needs CuPy; wgmma-type accumulators and fidelity="exact" only).  With
        ``"cupy"``, ``x`` and ``w`` may be CuPy arrays or CUDA torch tensors: quantization, kernel
        and output cast then run on the GPU (:mod:`fp8sim.device`) and the result is a CuPy array
    baseline : the BF16 recipe the report compares against: ``"bf16"`` (numpy's float32 BLAS, the
        fast option) or ``"bf16-cublaslt"`` (the BF16 GEMM the H200 computes, cuBLASLt's
        arithmetic; pass ``.with_(split_k=...)`` for the library's split at your shape)
    fidelity : ``"exact"`` (bit-exact accumulator model) or ``"fast"`` (exact quantization and scale
        application, but each promotion interval's partial from float32 BLAS instead of the
        tensor-core model: NOT bit-exact, and not faster than ``"exact"`` for recipes that promote
        partial sums; see docs/gemm.md for its measured deviation and speed)

    Returns
    -------
    float32 (M, N) array holding output-format values (float64 for the ``"fp64"`` recipe / output),
    and the report when ``report=True``.
    """
    r = get_recipe(recipe)
    report = flag(report, "fp8sim.gemm", "report")
    base = get_recipe(baseline)
    if base.x_format != "bf16" or base.w_format != "bf16":
        raise ValueError(f"fp8sim.gemm: baseline must be a BF16 recipe ('bf16', 'bf16-cublaslt'), got {base.name!r}")
    if backend not in ("cpu", "cupy"):
        raise ValueError(f"fp8sim.gemm: backend must be 'cpu' or 'cupy', got {backend!r}")
    if fidelity not in ("exact", "fast"):
        raise ValueError(f"fp8sim.gemm: fidelity must be 'exact' or 'fast', got {fidelity!r}")
    if backend == "cupy" and (is_device_array(x) or is_device_array(w)):
        return _gemm_on_device(x, w, r, report, layout, fidelity)
    x, w = _check_inputs(x, w, layout)
    if not r.is_fp8:
        y = wide_matmul(x, w, r)
        if report:
            return y, wide_gemm_report(x, w, r, y, baseline)
        return y
    if r.block_scaled:  # MX / NVFP4 scales folded into the MMA (Blackwell): fp8sim.tensorcore.block_gemm
        if report:
            raise NotImplementedError(f"fp8sim.gemm: report=True is not available for block-scaled recipes ({r.name})")
        from .tensorcore.block_gemm import block_scaled_gemm

        return block_scaled_gemm(x, w, r)
    qx, qw = quantize_operands(x, w, r)
    for name, q in (("x", qx), ("w", qw)):
        if q.format.bits != 8 or not q.format.fits_float32:
            raise ValueError(
                f"fp8sim.gemm: the tensor-core model multiplies 8-bit codes; {name} is quantized "
                f"to {q.format.name} ({q.format.bits} bits)"
            )
    y32, parts = _fp8(qx, qw, r, fidelity, backend)
    y = cast_output(y32, r.output_format)
    if report:
        return y, fp8_gemm_report(x, w, qx, qw, r, y, parts, baseline)
    return y
