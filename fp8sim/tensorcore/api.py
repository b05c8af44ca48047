"""The public tensor-core operations: one instruction (:func:`mma`) and a tile loop along K (:func:`matmul`)."""

from __future__ import annotations

import math
import operator
from typing import Any

import ml_dtypes
import numpy as np

from ..formats import Format
from ..formats import format as _get_format
from .bitexact import matmul_kernel
from .codes import code_table
from .model import K_INSTR, AccumulatorModel, instruction_order, model_params
from .registry import get_model

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


def mma(a, b, c, *, a_format, b_format, instruction="wgmma", arch: str = "sm90") -> np.ndarray:
    """One FP8 tensor-core instruction D = A @ B + C (K = 32), bit-exact.

    Parameters
    ----------
    a:
        uint8 codes of shape (..., M, 32) in ``a_format``.
    b:
        uint8 codes of shape (..., 32, N) in ``b_format``.
    c:
        float32 array (..., M, N).  Batch dimensions broadcast.
    a_format, b_format:
        ``"e4m3"`` or ``"e5m2"`` (or Format objects).
    instruction:
        ``"wgmma"``, ``"mma.sync"``, ``"wgmma.f16"`` (C/D held in fp16),
        ``"exact"``, ``"fp32"`` or an :class:`AccumulatorModel`.
    arch:
        Architecture of the preset (``"sm90"``).

    Returns
    -------
    float32 array (..., M, N).
    """
    model = get_model(instruction, arch)
    a = _check_codes(a, "a")
    b = _check_codes(b, "b")
    if a.shape[-1] != K_INSTR:
        raise ValueError(f"a must have shape (..., M, 32) for one instruction, got {a.shape}")
    if b.shape[-2] != K_INSTR:
        raise ValueError(f"b must have shape (..., 32, N) for one instruction, got {b.shape}")
    c = _check_c(c, a.shape[-2], b.shape[-1])
    return _run(a, b, c, a_format, b_format, model, 0)


def matmul(
    a, b, c=None, *, a_format, b_format, instruction="wgmma", arch: str = "sm90", promote_every=None
) -> np.ndarray:
    """D = A @ B (+ C) as a tensor-core tile loop along K, bit-exact.

    The K dimension is processed by consecutive K = 32 instructions in order,
    the accumulator staying in the instruction's output format.  With
    ``promote_every`` (a multiple of 32, in K elements) the tensor-core
    partial is added into a separate fp32 accumulator (IEEE RNE addition)
    every ``promote_every`` elements and restarted from zero; a remainder is
    added at the end (DeepGEMM / CUTLASS ``GmmaFP8Accumulation``).  C, if
    given, is the initial value of the fp32 accumulator (without promotion:
    the initial tensor-core accumulator).

    Shapes: a (..., M, K), b (..., K, N), c (..., M, N) float32; K a multiple of 32.
    Empty shapes work: M = 0 or N = 0 give an empty (..., M, N) result, K = 0 gives C
    unchanged (zeros without C).
    """
    model = get_model(instruction, arch)
    a = _check_codes(a, "a")
    b = _check_codes(b, "b")
    K = a.shape[-1]
    if b.shape[-2] != K:
        raise ValueError(f"inner dimensions differ: a has K={K}, b has K={b.shape[-2]}")
    if K % K_INSTR:
        raise ValueError(f"K must be a multiple of 32 (one instruction per 32 elements), got {K}")
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
        if promote <= 0 or promote % K_INSTR:
            raise ValueError(f"promote_every must be a positive multiple of 32, got {promote_every!r}")
    if c is not None:
        c = _check_c(c, a.shape[-2], b.shape[-1])
    return _run(a, b, c, a_format, b_format, model, promote)
