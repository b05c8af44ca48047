"""The quantization driver: :func:`quantize` checks its arguments, picks the kernel path (given or
measured scales, fused or two-pass, float32 fast path, memo table or general path) and builds the
:class:`~fp8sim.scaling.QuantizedTensor`."""

from __future__ import annotations

import numba
import numpy as np

from .. import _buffers
from .._fpenv import ieee_defaults
from .._inputs import flag, float_input
from ..formats import E4M3, NanStyle
from ..formats import format as _lookup_format
from ..rounding import RNE, SR, float32_kernel_ok, format_params, memo_table, round_mode, sr_key
from ..rounding.fast8 import NO_FAST, fast_params
from ._kernels import NO_TABLE, amax_cols, amax_rows, apply, fused, fused_bands32
from .granularities import Granularity, view_of
from .names import granularity as _granularity
from .policy import FLT_MAX, finish_scales, scale_policy, scales_from_amax
from .tensor import QuantizedTensor

__all__ = ["quantize"]


def input_array(x) -> tuple[np.ndarray, np.dtype]:
    """``x`` as a contiguous float array for quantization and its original dtype."""
    # the rule of fp8sim._inputs: float32/float64 as they are, float16/bfloat16 exactly to float32
    arr, dt = float_input(x, "fp8sim.quantize")
    if arr.ndim == 0:
        raise ValueError("quantize: x must have at least 1 dimension, got a scalar")
    return np.ascontiguousarray(arr), dt


@ieee_defaults
def quantize(
    x,
    fmt,
    granularity="tensor",
    *,
    scale_format=None,
    scale_rounding=None,
    mode="rne",
    saturate=True,
    margin=0,
    amax=None,
    seed=None,
    ignore_nan=False,
) -> QuantizedTensor:
    """Quantize ``x`` to ``fmt`` with block scales.

    Parameters
    ----------
    x : float32, float64, float16 or ml_dtypes.bfloat16 array of 1 or more dims (float16 and
        bfloat16 are converted to float32 exactly; other dtypes raise TypeError)
        (dimensions before the last two are batch dimensions)
    fmt : element format (``"e4m3"``, ``"e5m2"``, ``"e2m1"``, ``"e5m6"``, a custom
        :class:`~fp8sim.Format`, ...): signed, with zero, at most 16 bits (codes are uint8 for
        formats of up to 8 bits, uint16 for wider ones such as E5M6)
    granularity : a :class:`Granularity` or its name: ``"tensor"``, ``"row"``,
        ``"col"``, ``"1x128"``, ``"128x128"``, ``"g32"``, ``"mx32"``,
        ``"nvfp4"`` (see :mod:`fp8sim.scaling` for layouts); delayed scaling keeps state, so it
        takes the object, made once and passed every step (``g = fp8sim.granularity("delayed")``):
        its name raises ValueError
    scale_format : ``"fp32"``, ``"bf16"``, ``"pow2"`` or ``"e8m0"``; None
        picks the granularity's own (e8m0 for MX, E4M3xFP32 for NVFP4, else fp32)
    scale_rounding : ``"floor"`` (or the mode ``"rdn"``), ``"ceil"`` (``"rup"``), ``"rceil"`` or
        ``"even"`` for bf16/pow2/e8m0 scales (see :mod:`fp8sim.scaling.policy`); None picks floor
        for MX, ceil for bf16, rceil otherwise; must be None for fp32 scales
    mode : element rounding mode (as :func:`fp8sim.round`; ``"sr"`` needs ``seed``)
    saturate : clamp overflow and +-inf to +-max (default True)
    margin : int; scales are multiplied by ``2**margin`` (-126..127, -127..127 for e8m0
        scales: 2**margin a normal scale; other values raise ValueError)
    amax : optional amax to use instead of measuring ``x``: a scalar or an
        array broadcastable to the scales' shape (for NVFP4: the tensor amax)
    seed : int or numpy Generator for stochastic rounding
    ignore_nan : skip NaN when measuring amax (default: a NaN makes its block NaN; the NVFP4 tensor
        amax skips NaN either way, so that a NaN reaches only its block)

    Returns
    -------
    :class:`QuantizedTensor` with ``x ~= decode(codes) * scales (expanded) * global_scale``.
    """
    saturate = flag(saturate, "fp8sim.quantize", "saturate")
    ignore_nan = flag(ignore_nan, "fp8sim.quantize", "ignore_nan")
    g = _granularity(granularity)
    if g.stateful and not isinstance(granularity, Granularity):
        raise ValueError(
            f"quantize: granularity {granularity!r} given by name makes a new DelayedScaling, with an empty "
            "amax history, on every call, so every tensor would get the scale 1.0; create the object once "
            f"(g = fp8sim.granularity({granularity!r})) and pass it to every quantize call: it keeps the history"
        )
    fmt = _lookup_format(fmt)
    if fmt.bits > 16:
        raise ValueError(
            f"quantize: element format must have at most 16 bits (codes are uint8 or uint16), "
            f"got {fmt.name} ({fmt.bits} bits)"
        )
    if not fmt.signed or not fmt.subnormals:
        raise ValueError(f"quantize: element format must be signed with zero, got {fmt.name}")
    rm = round_mode(mode)
    m = int(rm)
    key = sr_key(seed) if m == SR else np.uint64(0)
    xc, orig_dtype = input_array(x)
    if xc.size == 0:
        raise ValueError(f"quantize: x is empty (shape {xc.shape})")
    shape = tuple(xc.shape)
    B, M, N, bm, bn = view_of(g, shape)
    nbm, nbn = -(-M // bm), -(-N // bn)
    sf, sr, sp = scale_policy(g, fmt, scale_format, scale_rounding, margin)
    p = format_params(fmt, bool(saturate), False, 52)
    scale_from_x = not (ignore_nan or amax is not None or g.stateful)
    if fmt.nan is NanStyle.NONE and not scale_from_x and np.isnan(xc).any():
        raise ValueError(
            f"format {fmt.name} has no NaN: NaN elements cannot be encoded "
            "(with ignore_nan=False and a measured amax a NaN makes its whole block's scale NaN instead)"
        )
    mode_arg = np.int64(m)
    fast = fast_params(fmt, bool(saturate)) if xc.dtype == np.float32 and m == RNE else None
    use_fast = fast is not None
    fp = fast if fast is not None else NO_FAST
    # (the table path re-rounds float32 quotients to odd, on the float32 subnormal grid 2**-149 at worst:
    # the format's finest spacing must be 2**-147 or coarser for that to round once)
    use_tab = bool(
        xc.dtype == np.float32
        and m != SR
        and fmt.mbits <= 6
        and float32_kernel_ok(fmt)
        and fmt.emin - fmt.mbits >= -147
        and not use_fast
    )
    tab = memo_table(fmt, m, p, True) if use_tab else NO_TABLE
    x3 = xc.reshape(B, M, N)
    codes = _buffers.empty((B, M, N), fmt.code_dtype)  # large ones are reused once dropped (see _buffers)
    glob = 1.0

    if g.two_level:
        if amax is None:
            # NaN is skipped in the tensor amax (TransformerEngine's amax kernel takes fmaxf / __hmax,
            # which return the other operand of a NaN): a NaN reaches only its own block's scale
            t_amax = tensor_amax(x3, True)
        else:
            t_amax = float(np.asarray(amax, dtype=np.float64).reshape(-1)[0]) if np.size(amax) == 1 else None
            if t_amax is None:
                raise ValueError("nvfp4: amax must be a scalar (the tensor amax)")
        with np.errstate(over="ignore"):  # beyond float32 (a float64 amax): inf, clamped to FLT_MAX below
            glob = float(np.float32(t_amax / (fmt.max * E4M3.max) * 2.0 ** int(margin))) if t_amax == t_amax else np.nan
        glob = min(max(glob, 2.0**-126), FLT_MAX) if glob == glob else glob
        sp = sp._replace(margin=np.int64(0))  # margin went into the tensor scale
    if g.stateful:  # (delayed scaling: the scale from the amax history it keeps)
        if amax is not None:
            raise ValueError("delayed scaling takes its amax from its history; do not pass amax")
        cur = tensor_amax(x3, ignore_nan)
        h = g.history_amax()
        if h > 0 and np.isfinite(h):
            s = np.empty(1, dtype=np.float64)
            scales_from_amax(np.array([h]), 1.0, sp, s)
            s = finish_scales(s, sf, sr)
            scales3 = s.astype(np.float32).reshape(1, 1, 1)
        else:
            scales3 = np.ones((1, 1, 1), dtype=np.float32)
        apply(x3, bit_view(x3), scales3, bm, bn, 1.0, mode_arg, p, key, tab, use_tab, fp, use_fast, sp, codes)
        with np.errstate(over="ignore"):  # a float64 amax beyond float32's range is stored as inf
            amax3: np.ndarray = np.full((1, 1, 1), cur, dtype=np.float32)
        g.record(cur)
    elif amax is None and bn > 1 and B * nbm >= 4 and sf not in ("bf16", "e4m3") and not g.two_level:
        scales3 = np.empty((B, nbm, nbn), dtype=np.float32)  # float32 values, as in the row case
        amax3 = np.empty((B, nbm, nbn), dtype=np.float32)
        args = (x3, bit_view(x3), bm, bn, mode_arg, p, key, sp, glob, bool(ignore_nan), tab, use_tab, fp, use_fast)
        if bm > 1 and xc.dtype == np.float32:
            fused_bands32(*args, codes, scales3, amax3, numba.get_num_threads())
        else:
            fused(*args, codes, scales3, amax3)
    else:
        if amax is None:
            amax3 = block_amax(x3, bm, bn, bool(ignore_nan))
        else:
            a = np.asarray(amax, dtype=np.float64)
            sshape = g.scale_shape(shape) if not g.two_level else None
            if g.two_level:
                amax3 = block_amax(x3, bm, bn, bool(ignore_nan))
            else:
                assert sshape is not None
                try:
                    a = np.broadcast_to(a, sshape)
                except ValueError:
                    raise ValueError(
                        f"amax of shape {a.shape} does not broadcast to the scales' shape {sshape}"
                    ) from None
                if (a < 0).any():
                    raise ValueError("amax must be non-negative")
                amax3 = np.ascontiguousarray(a).reshape(B, nbm, nbn)
        s = np.empty(amax3.size, dtype=np.float64)
        scales_from_amax(np.ascontiguousarray(amax3, dtype=np.float64).reshape(-1), glob, sp, s)
        s = finish_scales(s, sf, sr)
        scales3 = s.astype(np.float32).reshape(B, nbm, nbn)
        apply(x3, bit_view(x3), scales3, bm, bn, glob, mode_arg, p, key, tab, use_tab, fp, use_fast, sp, codes)
        with np.errstate(over="ignore"):  # a float64 amax beyond float32's range is stored as inf
            amax3 = np.asarray(amax3, dtype=np.float32)
    sshape = g.scale_shape(shape)
    return QuantizedTensor(
        codes=codes.reshape(shape),
        scales=scales3.reshape(sshape),
        format=fmt,
        granularity=g,
        shape=shape,
        dtype=orig_dtype,
        scale_format=sf,
        scale_rounding=sr,
        global_scale=float(glob),
        amax=amax3.reshape(sshape),
        block_shape=g.block_shape(shape),
        mode=rm.label,
        _view=(B, M, N, bm, bn),
    )


def bit_view(a):
    """The float32 (float64) array ``a`` viewed as int32 (int64) bits."""
    return a.view(np.int32 if a.dtype == np.float32 else np.int64)


def block_amax(x3, bm, bn, ignore_nan):
    """The amax of every ``(bm, bn)`` block of ``x3 (B, M, N)`` (float64; inf skipped, NaN unless ``ignore_nan``)."""
    B, M, N = x3.shape
    nbm, nbn = -(-M // bm), -(-N // bn)
    if bn == 1 and bm > 1:
        out = np.empty((B, nbm, N), dtype=np.float64)
        amax_cols(x3, bm, ignore_nan, out)
        return out
    part = np.empty((B * M, nbn), dtype=np.float64)
    amax_rows(bit_view(x3.reshape(B * M, N)), bn, ignore_nan, part)
    part = part.reshape(B, M, nbn)
    if bm == 1:
        return part
    return np.maximum.reduceat(part, np.arange(0, M, bm), axis=1)  # NaN propagates


def tensor_amax(x3, ignore_nan):
    """amax of the whole tensor (NaN if any NaN unless ignore_nan; inf skipped)."""
    B, M, N = x3.shape
    x2 = x3.reshape(B * M, N)
    if B * M == 1 and N >= 4096:  # one long row: split it so both cores work
        cols = 1024
        n = (N // cols) * cols
        parts = [tensor_amax(x2[:, :n].reshape(1, -1, cols), ignore_nan)]
        if n < N:
            parts.append(tensor_amax(x2[:, n:].reshape(1, 1, -1), ignore_nan))
        return float(np.max(parts))
    part = np.empty((B * M, 1), dtype=np.float64)
    amax_rows(bit_view(x2), N, ignore_nan, part)
    return float(np.max(part))
