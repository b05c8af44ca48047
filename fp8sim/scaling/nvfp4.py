"""NVFP4 with 2D scale blocks: one E4M3 scale per 16x16 block times an FP32 tensor scale.

TransformerEngine's NVFP4 training recipe quantizes weights this way (its documentation: "each
block of 16x16 elements shares a scaling factor"; activations and gradients keep 1x16 blocks), so
that a weight and its transpose quantize to the same values: the Fprop GEMM (K along the rows of
``W (D_in, D_out)``) and the Dgrad GEMM (K along its columns) read the same quantized ``W``.

:func:`quantize_nvfp4_2d` applies fp8sim's NVFP4 rule (:class:`~fp8sim.scaling.NVFP4`) with the
16x16 block's amax in place of the 1x16 group's:

* tensor scale ``g = fp32(amax(x) * 2**margin / (fmt.max * 448))`` (``amax / (6 * 448)`` for E2M1,
  TransformerEngine's ``s_global``), clamped to fp32's normal range; NaN elements are skipped in
  ``amax(x)`` (TransformerEngine's amax kernel reduces with ``fmaxf`` / ``__hmax``, which skip NaN),
  so a NaN makes only its own block's scale NaN (see docs/scaling.md);
* block scale ``s_b = E4M3_rne_satfinite(amax_b / (fmt.max * g))`` from the exact ratio (a nonzero
  block whose scale would round to 0 gets 2**-9);
* element ``round(x / (s_b * g))``, one rounding of the exact quotient, RNE or stochastic
  (``mode="sr"`` with ``seed``), saturating at +-fmt.max.

It is the same kernel path as :func:`fp8sim.quantize` (the block amax, :func:`scales_from_amax`,
:func:`apply`), so a 16x16 block gets exactly the scale and codes that ``fp8sim.quantize`` gives a
group of 256 elements holding the same values under the same tensor scale.  The result is a
:class:`~fp8sim.QuantizedTensor` with granularity ``Tile(16, 16)``, ``scale_format="e4m3"`` and the
tensor scale as ``global_scale``; ``decode(codes) * scales * global_scale`` dequantizes it.

TransformerEngine's kernels compute the same quantities in a different fp32 operation order
(``S_enc = fp32(2688 / amax)``, ``g = fp32(1 / S_enc)``, ``s_b = e4m3(fp32(amax_b * fp32(S_enc *
fp32(1/6))))``, elements ``fp32(x * fp32(1 / fp32(s_b * g)))`` rounded to E2M1; a block scale that
rounds to 0 stays 0): the two agree except where one of those roundings lands differently;
docs/accelerators.md gives the measured rate.
"""

from __future__ import annotations

import numpy as np

from ..formats import E4M3, NanStyle
from ..formats import format as _lookup_format
from ..rounding import SR, format_params, round_mode, sr_key
from ..rounding.fast8 import NO_FAST
from ._kernels import NO_TABLE, apply
from .granularities import NVFP4, Tile, view_of
from .policy import FLT_MAX, finish_scales, scale_policy, scales_from_amax
from .quantization import bit_view, block_amax, input_array, tensor_amax
from .tensor import QuantizedTensor

__all__ = ["quantize_nvfp4_2d", "nvfp4_global_scale"]


def nvfp4_global_scale(amax: float, fmt="e2m1", margin: int = 0) -> float:
    """The NVFP4 tensor (decode) scale of a tensor with amax ``amax``:
    ``fp32(amax * 2**margin / (fmt.max * 448))`` clamped to [2**-126, FLT_MAX] (NaN stays NaN),
    as :func:`fp8sim.quantize` computes it for the ``"nvfp4"`` granularity."""
    f = _lookup_format(fmt)
    a = float(amax)
    if a != a:
        return float("nan")
    with np.errstate(over="ignore"):  # beyond float32 (a float64 amax): inf, clamped to FLT_MAX below
        g = float(np.float32(a / (f.max * E4M3.max) * 2.0 ** int(margin)))
    return min(max(g, 2.0**-126), FLT_MAX)


def quantize_nvfp4_2d(
    x, fmt="e2m1", tile: int = 16, *, mode="rne", seed=None, margin: int = 0, amax=None
) -> QuantizedTensor:
    """Quantize the 2-D ``x`` to ``fmt`` with one E4M3 scale per ``tile x tile`` block times an FP32
    tensor scale (see the module docstring).

    Parameters
    ----------
    x : 2-D float32 / float64 / float16 / bfloat16 array (ragged edge blocks are their own,
        smaller blocks)
    fmt : element format (default ``"e2m1"``; signed with zero)
    tile : block edge (16)
    mode : element rounding, ``"rne"`` or ``"sr"`` (any mode :func:`fp8sim.round` takes)
    seed : int or numpy Generator, for ``mode="sr"``
    margin : int: the tensor scale is multiplied by ``2**margin``
    amax : optional tensor amax (a scalar) instead of measuring ``x``

    Returns
    -------
    :class:`~fp8sim.QuantizedTensor` (granularity ``Tile(tile, tile)``, ``scales`` of shape
    ``(ceil(M/tile), ceil(N/tile))`` holding E4M3 values, ``global_scale`` the tensor scale).
    """
    f = _lookup_format(fmt)
    if not f.signed or not f.subnormals or f.bits > 16:
        raise ValueError(f"quantize_nvfp4_2d: element format must be signed with zero, got {f.name}")
    xc, orig_dtype = input_array(x)
    if xc.ndim != 2:
        raise ValueError(f"quantize_nvfp4_2d: x must be 2-D, got shape {xc.shape}")
    if xc.size == 0:
        raise ValueError(f"quantize_nvfp4_2d: x is empty (shape {xc.shape})")
    rm = round_mode(mode)
    key = sr_key(seed) if int(rm) == SR else np.uint64(0)
    g = Tile(int(tile), int(tile))
    shape = tuple(xc.shape)
    _sf, _sr, sp = scale_policy(NVFP4(int(tile)), f, None, None, margin)
    sp = sp._replace(margin=np.int64(0))  # the margin goes into the tensor scale
    _B, M, N, bm, bn = view_of(g, shape)
    x3 = xc.reshape(1, M, N)
    if amax is None:
        t_amax = tensor_amax(x3, True)  # NaN skipped, as TransformerEngine's amax: a NaN reaches only its block
    else:
        if np.size(amax) != 1:
            raise ValueError("quantize_nvfp4_2d: amax must be a scalar (the tensor amax)")
        t_amax = float(np.asarray(amax, dtype=np.float64).reshape(-1)[0])
    glob = nvfp4_global_scale(t_amax, f, margin)
    if f.nan is NanStyle.NONE and amax is not None and np.isnan(xc).any():
        raise ValueError(f"format {f.name} has no NaN: NaN elements cannot be encoded")
    amax3 = block_amax(x3, bm, bn, False)
    nbm, nbn = amax3.shape[1], amax3.shape[2]
    s = np.empty(amax3.size, dtype=np.float64)
    scales_from_amax(np.ascontiguousarray(amax3, dtype=np.float64).reshape(-1), glob, sp, s)
    scales3 = finish_scales(s, "e4m3", None).astype(np.float32).reshape(1, nbm, nbn)
    p = format_params(f, True, False, 52)
    codes = np.empty((1, M, N), dtype=f.code_dtype)
    apply(
        x3, bit_view(x3), scales3, bm, bn, glob, np.int64(int(rm)), p, key, NO_TABLE, False, NO_FAST, False, sp, codes
    )
    with np.errstate(over="ignore"):  # a float64 amax beyond float32's range is stored as inf
        amax32 = np.asarray(amax3, dtype=np.float32).reshape(nbm, nbn)
    return QuantizedTensor(
        codes=codes.reshape(shape),
        scales=scales3.reshape(nbm, nbn),
        format=f,
        granularity=g,
        shape=shape,
        dtype=orig_dtype,
        scale_format="e4m3",
        scale_rounding=None,
        global_scale=float(glob),
        amax=amax32,
        block_shape=g.block_shape(shape),
        mode=rm.label,
        _view=(1, M, N, bm, bn),
    )
