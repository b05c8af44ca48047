"""The public tensor-core operations: one instruction (:func:`mma`) and a tile loop along K (:func:`matmul`)."""

from __future__ import annotations

import math
import operator
from typing import Any

import ml_dtypes
import numpy as np

from .._fpenv import ieee_defaults
from ..formats import Format
from ..formats import format as _get_format
from . import archs, kernels
from ._bitexact import matmul_kernel
from .codes import code_table
from .model import K_INSTR, AccumulatorModel, instruction_order, model_params
from .registry import PRESETS, get_model
from .scaled_mma import decode_scales, run_general

__all__ = ["mma", "matmul"]

_BF16 = np.dtype(ml_dtypes.bfloat16)


def _check_codes(x, name: str) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype != np.uint8:
        raise TypeError(f"{name} must be uint8 FP8 codes, got dtype {x.dtype}")
    if x.ndim < 2:
        raise ValueError(f"{name} must have at least 2 dimensions, got shape {x.shape}")
    return x


def _fmt8(name, which: str) -> Format:
    if name is None:
        raise TypeError(f"{which} is required (e.g. 'e4m3' or 'e5m2')")
    f = _get_format(name)
    if f.bits != 8 or not f.fits_float32:
        raise ValueError(f"{which} must be an 8-bit format (e.g. 'e4m3', 'e5m2'), got {f.name!r}")
    return f


def _batch_shape(a: np.ndarray, b: np.ndarray, c: np.ndarray | None) -> tuple[int, ...]:
    shapes = [a.shape[:-2], b.shape[:-2]] + ([c.shape[:-2]] if c is not None else [])
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        names = "a, b" + (", c" if c is not None else "")
        raise ValueError(
            f"the batch dimensions of {names} do not broadcast: {', '.join(map(str, shapes))} "
            f"(shapes a {a.shape}, b {b.shape}" + (f", c {c.shape})" if c is not None else ")")
        ) from None


def _run(a, b, c, a_format, b_format, model: AccumulatorModel, promote: int) -> np.ndarray:
    fa_ = _fmt8(a_format, "a_format")
    fb_ = _fmt8(b_format, "b_format")
    M, K = a.shape[-2:]
    N = b.shape[-1]
    batch = _batch_shape(a, b, c)
    nb = math.prod(batch)
    if nb * M * N == 0:  # nothing to compute (reshape(-1, ...) cannot size an empty array)
        return np.zeros(batch + (M, N), np.float32)
    if K == 0:  # no instruction at all: D = C exactly (IEEE: NaN payloads kept), or +0 without C
        if c is None:
            return np.zeros(batch + (M, N), np.float32)
        return np.array(np.broadcast_to(c, batch + (M, N)), dtype=np.float32)
    a3 = np.ascontiguousarray(np.broadcast_to(a, batch + (M, K))).reshape((nb, M, K))
    b3 = np.ascontiguousarray(np.swapaxes(np.broadcast_to(b, batch + (K, N)).reshape((nb, K, N)), 1, 2))
    if c is None:
        c3 = np.zeros((nb, M, N), np.float64)
    else:
        c3 = np.broadcast_to(c, batch + (M, N)).reshape((nb, M, N)).astype(np.float64)
        if model.output == "f16" and promote <= 0:
            # C is the initial tensor-core accumulator, held in fp16; with promotion C is the
            # initial value of the separate fp32 accumulator and keeps its fp32 value
            with np.errstate(over="ignore"):
                c3 = c3.astype(np.float16).astype(np.float64)
    # one numba signature for every call: C-contiguous, writeable, aligned arrays
    req: Any = ("C_CONTIGUOUS", "WRITEABLE", "ALIGNED")
    a3, b3, c3 = np.require(a3, requirements=req), np.require(b3, requirements=req), np.require(c3, requirements=req)
    tA = code_table(fa_, model.subnormal_exponent)
    tB = code_table(fb_, model.subnormal_exponent)
    out = np.empty((nb, M, N), np.float64)
    with np.errstate(all="ignore"):
        matmul_kernel(
            a3,
            b3,
            c3,
            int(promote),
            instruction_order(model),
            tA.cls,
            tA.sign,
            tA.sig,
            tA.exp,
            tA.val,
            fa_.mbits,
            tB.cls,
            tB.sign,
            tB.sig,
            tB.exp,
            tB.val,
            fb_.mbits,
            model_params(model),
            out,
        )
        d = out.astype(np.float32)
    bits = d.view(np.uint32)
    bits[np.isnan(d)] = np.uint32(model.nan_bits)
    return d.reshape(batch + (M, N))


def _check_c(c, M, N):
    if c is None:
        raise TypeError("c is required for mma (a float32 array (..., M, N); zeros for D = A @ B)")
    c = np.asarray(c)
    if c.dtype != np.float32:
        if c.dtype.kind != "f" and c.dtype != _BF16:
            raise TypeError(
                f"c must be a float32 array (float64, float16 or bfloat16 holding float32 values are "
                f"converted exactly), got dtype {c.dtype}"
            )
        c32 = c.astype(np.float32)
        if not np.array_equal(c32.astype(c.dtype), c, equal_nan=True):
            raise ValueError("c must hold float32 values (got values that are not exactly float32)")
        c = c32
    if c.ndim < 2 or c.shape[-2:] != (M, N):
        raise ValueError(f"c must have shape (..., {M}, {N}), got {c.shape}")
    return c


def _fmt(name, which: str) -> Format:
    if name is None:
        raise TypeError(f"{which} is required (e.g. 'e4m3' or 'e5m2')")
    f = _get_format(name)
    if not f.signed or not f.subnormals:  # E8M0: unsigned powers of two without zero, a scale format
        raise ValueError(
            f"{which} {f.name!r} is not an operand format (unsigned, without zero: a scale-only format); "
            "block scales go in a_scale / b_scale with scale_format='ue8m0' or 'ue4m3'"
        )
    return f


def _scales(a_scale, b_scale, scale_format, M: int, N: int, K: int):
    """(scale Format, block, decoded scales) of the block scales, or None without scales."""
    if a_scale is None and b_scale is None:
        if scale_format is not None:
            raise ValueError("scale_format given without a_scale and b_scale")
        return None
    if a_scale is None or b_scale is None:
        raise ValueError("block scales need both a_scale (M, K // block) and b_scale (K // block, N)")
    sf = archs.scale_format("ue8m0" if scale_format is None else scale_format)
    sa = np.asarray(a_scale)
    sb = np.asarray(b_scale)
    for name, x in (("a_scale", sa), ("b_scale", sb)):
        if x.dtype != np.uint8:
            raise TypeError(f"{name} must hold uint8 {sf.name} codes, got dtype {x.dtype}")
        if x.ndim != 2:
            raise ValueError(f"{name} must be 2-D, got shape {x.shape}")
    nbk = sa.shape[1]
    if sa.shape[0] != M or nbk == 0 or K % nbk or sb.shape != (nbk, N):
        raise ValueError(
            f"a_scale must have shape (M, K // block) = ({M}, K // block) and b_scale (K // block, N) = "
            f"(K // block, {N}) with the same block dividing K = {K}; got {sa.shape} and {sb.shape}"
        )
    block = K // nbk
    sam, sae = decode_scales(sa, sf)
    sbm, sbe = decode_scales(sb, sf)
    return sf, block, (sam, sae, sbm, sbe, block)


def _general(a, b, c, fa, fb, model: AccumulatorModel, promote: int, scales, out16: bool) -> np.ndarray:
    """The instruction chain on the kernels of :mod:`~fp8sim.tensorcore.scaled_mma` (2-D operands)."""
    M, K = a.shape
    N = b.shape[1]
    if K % model.block:
        raise ValueError(f"K = {K} must be a multiple of the model's block ({model.block})")
    if scales is not None and model.group > 1 and scales[1] % model.group:
        raise ValueError(f"the scale block ({scales[1]}) must be a multiple of the model's group ({model.group})")
    if c is None:
        c64 = np.zeros((M, N), np.float64)
    else:
        c64 = np.asarray(c, dtype=np.float64)
        if model.output == "f16" and promote <= 0:
            with np.errstate(over="ignore"):
                c64 = c64.astype(np.float16).astype(np.float64)
    with np.errstate(all="ignore"):
        d = run_general(a, b, c64, fa, fb, model, promote, scales[2] if scales is not None else None).astype(np.float32)
    nan = np.isnan(d)
    if out16 and promote <= 0:
        h = d.astype(np.float16)
        h.view(np.uint16)[nan] = np.uint16(0x7FFF)
        return h
    d.view(np.uint32)[nan] = np.uint32(model.nan_bits)
    return d


def _select(instruction, arch, fa: Format, fb: Format, K: int, out_format, scale, one: bool = False):
    """(model, returns float16) for the instruction name or model and the operands; ``K`` is the
    product's (one instruction's for :func:`mma`, ``one``; the whole product's for :func:`matmul`),
    a base name resolved by :func:`fp8sim.tensorcore.archs.resolve` for both."""
    if out_format not in ("f32", "f16"):
        raise ValueError(f"out_format must be 'f32' or 'f16', got {out_format!r}")
    if isinstance(instruction, AccumulatorModel):
        if out_format == "f16" and instruction.output != "f16":
            raise ValueError(f"out_format='f16' needs a model with output 'f16', got {instruction.output!r}")
        return instruction, out_format == "f16"
    if not isinstance(instruction, str):
        raise TypeError(f"instruction must be a name or an AccumulatorModel, got {type(instruction).__name__}")
    if not isinstance(arch, str):
        raise TypeError(f"arch must be a name such as 'sm90', got {type(arch).__name__}")
    if archs.rows_for(arch, instruction):  # a base name: the row of these operands
        try:
            row = archs.resolve(arch, instruction, fa, fb, K, out_format, scale)
            if row is None:
                raise ValueError(f"no {arch} {instruction} model for {fa.name} x {fb.name}, K={K}, {out_format}")
            if one and K not in row.ks:
                ks = " or ".join(map(str, row.ks))
                raise ValueError(f"a must have K = {ks} for one {arch} {instruction} kind::{row.kind}, got K = {K}")
            return row.model, out_format == "f16"
        except ValueError:
            key = (arch.strip().lower(), instruction.strip().lower())
            if fa.bits == 8 and fb.bits == 8 and scale is None and out_format == "f32" and key in PRESETS:
                return PRESETS[key], False  # the sm90 presets take any 8-bit format, as they always have
            raise
    key = (arch.strip().lower(), instruction.strip().lower())
    model = next((r.model for r in archs.ROWS if (r.arch, r.key) == key), None)
    if model is None:
        model = get_model(instruction, arch)
    if out_format == "f16" and model.output != "f16":
        raise ValueError(f"out_format='f16' needs an instruction with an f16 accumulator, got {instruction!r}")
    return model, out_format == "f16"


def _dispatch(a, b, c, fa, fb, model, promote, scales, out16, kernel=None):
    """Run one chain on the kernel :func:`fp8sim.tensorcore.kernels.select` picks: the sm90 bit-level
    kernel for the H200-validated presets and the models only it computes, else the kernels of
    :mod:`~fp8sim.tensorcore.scaled_mma` (``"general"``)."""
    K = a.shape[-1]
    req = kernels.chain_request(model, fa, fb, K, block_scales=scales is not None, out16=out16)
    if kernels.select(req, kernel).name == "sm90-bitlevel":
        return _run(a, b, c, fa, fb, model, promote)
    batch = _batch_shape(a, b, c)
    M, N = a.shape[-2], b.shape[-1]
    nb = math.prod(batch)
    dt = np.float16 if out16 and promote <= 0 else np.float32
    if nb * M * N == 0:
        return np.zeros(batch + (M, N), dt)
    if K == 0:
        if c is None:
            return np.zeros(batch + (M, N), dt)
        return np.array(np.broadcast_to(c, batch + (M, N)), dtype=dt)
    a3 = np.broadcast_to(a, batch + (M, K)).reshape((nb, M, K))
    b3 = np.broadcast_to(b, batch + (K, N)).reshape((nb, K, N))
    c3 = None if c is None else np.broadcast_to(c, batch + (M, N)).reshape((nb, M, N))
    outs = [
        _general(a3[t], b3[t], None if c3 is None else c3[t], fa, fb, model, promote, scales, out16) for t in range(nb)
    ]
    return np.stack(outs).reshape(batch + (M, N))


def _check_any_codes(x, name: str, fmt: Format) -> np.ndarray:
    x = np.asarray(x)
    want = fmt.code_dtype
    if x.dtype != want:
        raise TypeError(f"{name} must hold {want} codes of {fmt.name}, got dtype {x.dtype}")
    if x.ndim < 2:
        raise ValueError(f"{name} must have at least 2 dimensions, got shape {x.shape}")
    return x


def _check_c16(c, M, N, out16: bool):
    if out16 and c is not None and np.asarray(c).dtype == np.float16:
        c = np.asarray(c)
        if c.ndim < 2 or c.shape[-2:] != (M, N):
            raise ValueError(f"c must have shape (..., {M}, {N}), got {c.shape}")
        return c.astype(np.float32)
    return _check_c(c, M, N)


def _operands(a, b, a_format, b_format, a_scale, b_scale, scale_format, scales_if_empty_k: bool = True):
    """The checks :func:`mma` and :func:`matmul` share: formats, ``a (..., M, K)`` and ``b (..., K, N)``
    as arrays, and the block scales (:func:`_scales`); returns ``(fa, fb, a, b, M, N, K, sc)``."""
    fa = _fmt(a_format, "a_format")
    fb = _fmt(b_format, "b_format")
    a = np.asarray(a)
    b = np.asarray(b)
    if a.ndim < 2 or b.ndim < 2:
        raise ValueError(f"a and b must have at least 2 dimensions, got shapes {a.shape} and {b.shape}")
    K = a.shape[-1]
    if b.shape[-2] != K:
        raise ValueError(f"inner dimensions differ: a has K={K}, b has K={b.shape[-2]}")
    M, N = a.shape[-2], b.shape[-1]
    sc = _scales(a_scale, b_scale, scale_format, M, N, K) if (K or scales_if_empty_k) else None
    if sc is not None and (a.ndim != 2 or b.ndim != 2):
        raise ValueError("block scales take 2-D a and b")
    return fa, fb, a, b, M, N, K, sc


@ieee_defaults
def mma(
    a,
    b,
    c,
    *,
    a_format,
    b_format,
    instruction: str | AccumulatorModel = "wgmma",
    arch: str = "sm90",
    out_format: str = "f32",
    a_scale=None,
    b_scale=None,
    scale_format=None,
    kernel: str | None = None,
) -> np.ndarray:
    """One tensor-core instruction D = A @ B + C, bit-exact.

    Parameters
    ----------
    a:
        Codes of shape (..., M, K) in ``a_format``, one element per code: uint8 for formats of up
        to 8 bits (FP6/FP4 codes in the low bits), uint16 for bf16/fp16, uint32 for tf32 (its
        19-bit code).  K is the instruction's (32 for FP8/FP6/FP4, 64 for block-scaled FP4,
        16 for bf16/fp16, 8 for tf32; sm89/sm120 ``mma.sync`` and ``mfma`` also take 16).
    b:
        Codes of shape (..., K, N) in ``b_format``.  M and N are free (every output is independent).
    c:
        float32 array (..., M, N) (float16 for f16 outputs; float32 C is then rounded to fp16).
        Batch dimensions broadcast.
    a_format, b_format:
        Operand formats (names or Format objects): e4m3, e5m2, e3m2, e2m3, e2m1, e4m3fnuz,
        e5m2fnuz, bf16, fp16, tf32, as the instruction takes them.
    instruction:
        A base name -- ``"mma.sync"``, ``"wgmma"``, ``"tcgen05.mma"``, ``"mfma"`` -- whose kind
        follows from the formats, K and the scales (:mod:`fp8sim.tensorcore.archs` has the table
        and the mapping); a registry key (``"wgmma.f16"``, ``"exact"``, ``"fp32"``,
        ``"tcgen05.mma.kind::mxf4nvf4"``, ...); or an :class:`AccumulatorModel`.
    arch:
        ``"sm89"``, ``"sm90"``, ``"sm100"``, ``"sm120"`` or ``"cdna3"``.
    out_format:
        ``"f32"`` or ``"f16"`` (D held in fp16: the result is a float16 array).  The registry
        keys ending in ``.f16`` (``"wgmma.f16"``) return their fp16 values as float32, as before.
    a_scale, b_scale, scale_format:
        Block scales: uint8 codes of shape (M, K // block) and (K // block, N), one per ``block``
        elements along K, in ``scale_format`` (``"ue8m0"``, the default, or ``"ue4m3"``).
    kernel:
        None (the kernel :func:`fp8sim.tensorcore.kernels.select` picks) or the name of an
        instruction-chain kernel of :data:`fp8sim.tensorcore.kernels.KERNELS` to run instead
        (``"sm90-bitlevel"`` or ``"general"``, where it computes the model: for cross-checks).

    Returns
    -------
    float32 array (..., M, N) (float16 for ``out_format="f16"``).  NaN is the canonical NaN.
    """
    fa, fb, a, b, M, N, K, sc = _operands(a, b, a_format, b_format, a_scale, b_scale, scale_format)
    model, out16 = _select(instruction, arch, fa, fb, K, out_format, None if sc is None else sc[:2], one=True)
    a = _check_any_codes(a, "a", fa)
    b = _check_any_codes(b, "b", fb)
    if K != model.instr_k and not (K % model.block == 0 and K < model.instr_k):
        raise ValueError(f"a must have K = {model.instr_k} for one {model.name!r} instruction, got K = {K}")
    if c is None:
        raise TypeError("c is required for mma (a float32 array (..., M, N); zeros for D = A @ B)")
    c = _check_c16(c, M, N, out16 or model.output == "f16")
    return _dispatch(a, b, c, fa, fb, model, 0, sc, out16, kernel)


@ieee_defaults
def matmul(
    a,
    b,
    c=None,
    *,
    a_format,
    b_format,
    instruction: str | AccumulatorModel = "wgmma",
    arch: str = "sm90",
    promote_every=None,
    out_format: str = "f32",
    a_scale=None,
    b_scale=None,
    scale_format=None,
    kernel: str | None = None,
) -> np.ndarray:
    """D = A @ B (+ C) as a tensor-core tile loop along K, bit-exact.

    The K dimension is processed by consecutive instructions in order (K = 32 for FP8; the
    instruction's K otherwise, see :func:`mma` for the operands and the instruction names), the
    accumulator staying in the instruction's output format.  With ``promote_every`` (a multiple
    of 32, in K elements) the tensor-core partial is added into a separate fp32 accumulator (IEEE
    RNE addition) every ``promote_every`` elements and restarted from zero; a remainder is added
    at the end (DeepGEMM / CUTLASS ``GmmaFP8Accumulation``).  C, if given, is the initial value of
    the fp32 accumulator (without promotion: the initial tensor-core accumulator).  Block scales
    (``a_scale`` (M, K // block), ``b_scale`` (K // block, N)) are folded into every instruction.

    Shapes: a (..., M, K), b (..., K, N), c (..., M, N) float32; K a multiple of the instruction's.
    Empty shapes work: M = 0 or N = 0 give an empty (..., M, N) result, K = 0 gives C
    unchanged (zeros without C).  ``kernel`` names the instruction-chain kernel to run, as for
    :func:`mma` (None: the one :func:`fp8sim.tensorcore.kernels.select` picks).
    """
    fa, fb, a, b, M, N, K, sc = _operands(a, b, a_format, b_format, a_scale, b_scale, scale_format, False)
    # the rule of mma (archs.resolve): the instruction with the largest K that divides K
    model, out16 = _select(instruction, arch, fa, fb, K, out_format, None if sc is None else sc[:2])
    a = _check_any_codes(a, "a", fa)
    b = _check_any_codes(b, "b", fb)
    # the sm90 kernel runs whole instructions of 32; a model the general kernels also compute runs
    # there for the other multiples of its block (sm89 mma.sync m16n8k16), as mma runs one k16
    step = kernels.chain_granule(model)
    if K % step:
        if kernels.get_kernel("sm90-bitlevel").claims(model) is None and step == K_INSTR:
            raise ValueError(f"K must be a multiple of 32 (one instruction per 32 elements), got {K}")
        raise ValueError(f"K must be a multiple of {step} (the {model.name!r} instruction's block), got {K}")
    promote = 0
    if promote_every is not None:
        if isinstance(promote_every, (bool, np.bool_)):
            raise TypeError(f"promote_every must be None or a positive multiple of 32, got {promote_every!r}")
        try:
            promote = operator.index(promote_every)
        except TypeError:
            raise TypeError(
                f"promote_every must be None or a positive multiple of 32 (an integer), got {promote_every!r}"
            ) from None
        if promote <= 0 or promote % K_INSTR or promote % model.block:
            raise ValueError(f"promote_every must be a positive multiple of 32, got {promote_every!r}")
    if c is not None:
        c = _check_c16(c, M, N, out16 or model.output == "f16")
    return _dispatch(a, b, c, fa, fb, model, promote, sc, out16, kernel)
