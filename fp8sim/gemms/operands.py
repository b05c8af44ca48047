"""Operand preparation: what every FP8 GEMM does before the engine (:mod:`fp8sim.gemms.engine`).

* float operands: checked (:func:`check_inputs`), quantized as the recipe says
  (:func:`quantize_operands`, granularities laid along K by :func:`~fp8sim.scaling.orientation.along_k`);
* codes the user already has (:func:`fp8sim.scaled_gemm`): checked as codes of their format
  (:func:`as_codes`), the scales read as tensorwise / rowwise / 1x128 / 128x128 (:func:`scale_blocks`);
* for the engine: codes zero-padded along K to whole promotion intervals (:func:`padded_k`,
  :func:`pad_k`) and the scales per K block (:func:`k_scales`, :func:`padded_inputs`), written once for
  NumPy and CuPy arrays (the array module of the operands, :func:`xp_of`).

K that is not a multiple of the promotion interval / 32 is zero-padded at the end (zero codes), as
TMA-fed kernels do; the ragged last scale block is the quantizer's own smaller block.  Padding does
not change any bit: an all-zero instruction leaves the accumulator as it is.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .._inputs import float_input
from ..formats import Format
from ..formats import format as get_format
from ..scaling import QuantizedTensor, quantize
from ..scaling.orientation import along_k, transpose_granularity
from .presets import recipe as get_recipe
from .recipes import Recipe
from .specs import OperandSpec

__all__ = [
    "quantize_as",
    "check_inputs",
    "transpose_quantized",
    "quantize_operands",
    "k_scales",
    "kernel_inputs",
    "padded_k",
    "pad_k",
    "xp_of",
    "as_codes",
    "scale_blocks",
    "prepare",
    "padded_inputs",
]

BLOCK = 128  #: the K (and N) extent of one 1x128 / 128x128 scale block


def padded_k(K: int, promote_every: int | None) -> int:
    """K rounded up to whole promotion intervals (to whole MMAs of 32 without promotion): the
    zero-padded K the kernel runs over."""
    step = max(32, promote_every or 32)
    return -(-K // step) * step


def xp_of(a):
    """The array module of ``a``: CuPy for CuPy device arrays, else NumPy."""
    if type(a).__module__.startswith("cupy"):
        import cupy

        return cupy
    return np


def pad_k(codes: np.ndarray, Kp: int, axis: int) -> np.ndarray:
    """``codes`` zero-padded along ``axis`` (its K axis) to ``Kp`` (contiguous; NumPy or CuPy)."""
    xp = xp_of(codes)
    K = codes.shape[axis]
    if Kp == K:
        return xp.ascontiguousarray(codes)
    pad = [(0, 0), (0, 0)]
    pad[axis] = (0, Kp - K)
    return xp.pad(codes, pad)


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


def check_inputs(x, w, layout: str):
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
def quantize_as(a, spec: OperandSpec, which: str) -> QuantizedTensor:
    """Quantize the GEMM operand ``a`` (``which``: ``"x"`` an ``(M, K)`` operand, ``"w"`` a ``(K, N)``
    one) as the operand spec says: its format, its granularity laid along K
    (:func:`~fp8sim.scaling.orientation.along_k`; parsed from the spelling, so that delayed scaling
    starts from a fresh state as it always did), its scale format, rounding and margin."""
    return quantize(
        a,
        spec.format,
        along_k(spec.spelling, which),
        scale_format=spec.scale_format,
        scale_rounding=spec.scale_rounding,
        margin=spec.margin,
    )


def quantize_operands(x, w, recipe) -> tuple[QuantizedTensor, QuantizedTensor]:
    """Quantize ``x (M, K)`` and ``w (K, N)`` as ``recipe`` says (``recipe.x``, ``recipe.w``;
    QuantizedTensors pass through)."""
    r = get_recipe(recipe)
    qx = x if isinstance(x, QuantizedTensor) else quantize_as(x, r.x, "x")
    qw = w if isinstance(w, QuantizedTensor) else quantize_as(w, r.w, "w")
    return qx, qw


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


# ------------------------------------------------------------------ scaled_gemm: inputs
def _torch_to_numpy(x):
    """A torch tensor as numpy (float8 as uint8 codes, with its format name); anything else as is."""
    mod = type(x).__module__
    if not mod.startswith("torch"):
        return x, None
    t = x.detach().cpu()
    name = str(t.dtype).replace("torch.", "")
    fmts = {
        "float8_e4m3fn": "e4m3",
        "float8_e5m2": "e5m2",
        "float8_e4m3fnuz": "e4m3fnuz",
        "float8_e5m2fnuz": "e5m2fnuz",
    }
    if name in fmts:
        import torch

        return t.contiguous().view(torch.uint8).numpy(), fmts[name]
    if name == "bfloat16":
        return t.float().numpy(), None
    return t.numpy(), None


def as_codes(x, fmt, who: str, name: str) -> tuple[np.ndarray, Format]:
    """``x`` as a 2-D uint8 code array and its format: uint8 codes in format ``fmt``, or an
    ml_dtypes / torch float8 array whose dtype must be ``fmt`` (TypeError / ValueError otherwise)."""
    f = get_format(fmt) if not isinstance(fmt, Format) else fmt
    if f.bits != 8:
        raise ValueError(f"{who}: {name}_format must be an 8-bit format, got {f.name} ({f.bits} bits)")
    if not f.signed or not f.subnormals:
        raise ValueError(
            f"{who}: {name}_format {f.name!r} is not an element format (unsigned, without zero: "
            f"{'E8M0 is the MX scale format' if f.name == 'e8m0' else 'a scale-only format'}); the operands "
            "take signed formats with zero (e4m3, e5m2, ...)"
        )
    x, tfmt = _torch_to_numpy(x)
    a = np.asarray(x)
    if tfmt is not None and get_format(tfmt) != f:
        raise ValueError(f"{who}: {name} is a torch {tfmt} tensor but {name}_format is {f.name!r}")
    if a.dtype != np.uint8:
        dt = str(a.dtype)
        if dt.startswith("float8"):
            if f.ml_dtype is None or np.dtype(f.ml_dtype) != a.dtype:
                raise ValueError(f"{who}: {name} has dtype {dt} but {name}_format is {f.name!r}")
            a = a.view(np.uint8)
        else:
            raise TypeError(
                f"{who}: {name} must hold FP8 codes: a uint8 array, an ml_dtypes float8 array or a "
                f"torch float8 tensor, got dtype {dt}"
            )
    if a.ndim != 2:
        raise ValueError(f"{who}: {name} must be 2-D, got shape {a.shape}")
    if 0 in a.shape:
        raise ValueError(f"{who}: {name} must not be empty, got shape {a.shape}")
    return np.ascontiguousarray(a), f


def _scale_array(s, who: str, name: str) -> np.ndarray:
    s, _ = _torch_to_numpy(s)
    arr = np.asarray(s)
    if arr.dtype.kind not in "fiu" or arr.dtype == np.bool_:
        raise TypeError(f"{who}: {name} must be a float array of scales, got dtype {arr.dtype}")
    if arr.dtype == np.float64 or arr.dtype.kind in "iu":
        # scales are fp32 on every library: a float64 scale that is not an fp32 value is refused
        a32 = arr.astype(np.float32)
        with np.errstate(invalid="ignore"):
            lost = (a32.astype(arr.dtype) != arr) & ~np.isnan(arr.astype(np.float64))
        if np.any(lost):
            raise ValueError(f"{who}: {name} holds values that are not float32 (the libraries' scales are fp32)")
        arr = a32
    else:
        arr, _ = float_input(arr, who, name)
        arr = arr.astype(np.float32)
    return np.ascontiguousarray(arr)


def scale_blocks(a_scale, b_scale, M: int, N: int, K: int, layout: str, who: str = "fp8sim.scaled_gemm"):
    """The scales as the engine takes them: ``(sa (M, nks), sb (nks, N), kscale, kinds)`` with
    ``kinds`` the granularity names of each operand ("tensor", "row", "col", "1x128", "128x128").

    A ``(1, N)`` ``b_scale`` with layout ``"nk"``, ``N <= 128`` and ``ceil(K/128) == N`` fits both
    per-column scales and 128x128 blocks: it is read as blocks when ``a_scale`` holds 1x128 blocks
    (more than one along K), as per-column scales otherwise.

    Accepted shapes: ``a_scale`` ``()`` / ``(1,)`` / ``(1, 1)`` (tensorwise), ``(M, 1)`` (rowwise),
    ``(M, ceil(K/128))`` (1x128); ``b_scale`` ``()`` (tensorwise), ``(1, N)`` (per output column),
    ``(ceil(K/128), ceil(N/128))`` with layout ``"kn"`` or ``(ceil(N/128), ceil(K/128))`` with
    layout ``"nk"`` (128x128).  Anything else is a ValueError naming these shapes."""
    nkb, nnb = -(-K // BLOCK), -(-N // BLOCK)
    sa = np.ones((1, 1), np.float32) if a_scale is None else _scale_array(a_scale, who, "a_scale")
    sb = np.ones((1, 1), np.float32) if b_scale is None else _scale_array(b_scale, who, "b_scale")
    if sa.size == 1 and sa.ndim <= 2:
        ka, sa2 = "tensor", np.full((M, 1), sa.reshape(()), np.float32)
    elif sa.shape == (M, 1):
        ka, sa2 = "row", sa
    elif sa.shape == (M, nkb):
        ka, sa2 = "1x128", sa
    else:
        raise ValueError(
            f"{who}: a_scale has shape {sa.shape}; for a (M, K) = ({M}, {K}) operand it must be () "
            f"(tensorwise), ({M}, 1) (rowwise) or ({M}, {nkb}) (1x128 blocks along K)"
        )
    blk = (nkb, nnb) if layout == "kn" else (nnb, nkb)
    if sb.size == 1 and sb.ndim <= 2:
        kb, sb2 = "tensor", np.full((1, N), sb.reshape(()), np.float32)
    elif sb.shape == (1, N) and not (blk == (1, N) and ka == "1x128" and nkb > 1):
        # (1, N) is also the 128x128 block shape with layout "nk" when N <= 128 and ceil(K/128) == N:
        # blocks when a's scales are 1x128 blocks (the blockwise GEMM), per column otherwise
        kb, sb2 = "col", sb
    elif sb.shape == blk:
        kb = "128x128"
        sbk = sb if layout == "kn" else sb.T
        sb2 = np.repeat(sbk, BLOCK, axis=1)[:, :N]
    else:
        raise ValueError(
            f"{who}: b_scale has shape {sb.shape}; for b of (K, N) = ({K}, {N}) with layout={layout!r} it must "
            f"be () (tensorwise), (1, {N}) (per output column) or {blk} (128x128 blocks"
            f"{', (ceil(K/128), ceil(N/128))' if layout == 'kn' else ', (ceil(N/128), ceil(K/128))'})"
        )
    kblocked = ka == "1x128" or kb == "128x128"
    if not kblocked:
        return np.ascontiguousarray(sa2), np.ascontiguousarray(sb2), None, (ka, kb)
    if sa2.shape[1] != nkb:
        sa2 = np.repeat(sa2, nkb, axis=1)
    if sb2.shape[0] != nkb:
        sb2 = np.repeat(sb2, nkb, axis=0)
    return np.ascontiguousarray(sa2), np.ascontiguousarray(sb2), BLOCK, (ka, kb)


def prepare(a_codes, b_codes, a_scale, b_scale, a_format, b_format, layout, who="fp8sim.scaled_gemm"):
    """The checked inputs of :func:`scaled_gemm`: ``(A (M, K), B (K, N), sa, sb, kscale, fa, fb, kinds)``."""
    if layout not in ("kn", "nk"):
        raise ValueError(f"{who}: layout must be 'kn' (b is (K, N)) or 'nk' (b is (N, K)), got {layout!r}")
    A, fa = as_codes(a_codes, a_format, who, "a")
    B, fb = as_codes(b_codes, b_format, who, "b")
    if layout == "nk":
        B = np.ascontiguousarray(B.T)
    M, K = A.shape
    if B.shape[0] != K:
        bshape = B.shape if layout == "kn" else B.shape[::-1]
        raise ValueError(
            f"{who}: inner dimensions differ: a is {A.shape} (K={K}), b is {bshape} with layout={layout!r} "
            f"(K={B.shape[0]})"
        )
    N = B.shape[1]
    sa, sb, kscale, kinds = scale_blocks(a_scale, b_scale, M, N, K, layout, who)
    return A, B, sa, sb, kscale, fa, fb, kinds


def padded_inputs(A, B, sa, sb, kscale, r: Recipe):
    """Codes zero-padded along K to whole promotion intervals (whole MMAs without promotion) and
    the block length ``kscale`` the engine takes (the padded K for one scale over all of K)."""
    K = A.shape[1]
    Kp = padded_k(K, r.promote_every)
    if kscale is not None and r.promote_every is not None and kscale % r.promote_every:
        raise ValueError(
            f"recipe {r.name!r}: promote_every={r.promote_every} does not divide the scale blocks of {kscale} along K"
        )
    if kscale is not None:
        nks = -(-Kp // kscale)
        if sa.shape[1] < nks:  # the padding's blocks: their codes are zero, any scale will do
            sa = np.pad(sa, ((0, 0), (0, nks - sa.shape[1])), mode="edge")
            sb = np.pad(sb, ((0, nks - sb.shape[0]), (0, 0)), mode="edge")
    return pad_k(A, Kp, 1), pad_k(B, Kp, 0), sa, sb, (Kp if kscale is None else kscale)
