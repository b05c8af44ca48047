"""GEMMs whose block scales are folded into the MMA: the MXFP8 / MXFP4 / NVFP4 recipes on Blackwell.

:func:`block_scaled_gemm` runs a :class:`~fp8sim.gemms.recipes.Recipe` whose accumulator is a
block-scaled instruction (``"sm100:tcgen05.mma.kind::mxf8f6f4"``, ``"...kind::mxf4"``,
``"...kind::mxf4nvf4"``; :attr:`Recipe.block_scaled`):

1. ``x (M, K)`` and ``w (K, N)`` quantized by :func:`fp8sim.quantize` with the recipe's formats
   and granularities along K (``"mx32"``: a UE8M0 scale per 32; ``"nvfp4"``: a UE4M3 scale per 16
   times an fp32 tensor scale; 16x16 weight blocks with ``weight_2d_blocks``);
   :func:`block_scaled_gemm_quantized` takes operands quantized already (training's);
2. the codes and the scale codes into :func:`fp8sim.tensorcore.matmul`, which chains the
   instruction along K with the scales inside every instruction (no separate promotion);
3. an NVFP4 tensor scale in the epilogue, ``fp32(fp32(gx * gw) * acc)`` (the GEMM's alpha);
4. the output cast of the recipe (:func:`fp8sim.gemms.engine.cast_output`).

K is padded with zero codes (scale 1) to the instruction's K: zero elements add nothing.  A K that
is not a multiple of the scale block ends in a partial block, which the MMA reads zero-padded to
the block: its scale is the amax-based scale of its real elements (:func:`fp8sim.quantize` gives
it, also when all of K is shorter than one block), and the padding's zeros add nothing, so the
GEMM equals the one on operands zero-padded along K to whole blocks.
"""

from __future__ import annotations

import numpy as np

from .._fpenv import ieee_defaults
from ..tensorcore.block_scales import E8M0_ONE, UE4M3_ONE, instruction_blocks, scale_codes

__all__ = ["block_scaled_gemm", "block_scaled_gemm_quantized", "k_block"]


def k_block(q, k_axis: int) -> int:
    """The extent along K (axis ``k_axis`` of the 2-D ``q``) of one scale block of the
    :class:`~fp8sim.QuantizedTensor` ``q``: its granularity's (32 for ``"mx32"``, 16 for ``"nvfp4"``
    and 16x16 tiles), not ``q.block_shape``, which is clamped to K when K is shorter than a block.
    Such a K is one partial block, as the MMA sees it zero-padded to the block: its scale, from the
    amax of its real elements, is the padded block's."""
    b = q.granularity.block_extent(k_axis)
    return int(q.block_shape[k_axis] if b is None else b)


def _pad(a: np.ndarray, n: int, axis: int, fill: int) -> np.ndarray:
    if n <= 0:
        return a
    shape = list(a.shape)
    shape[axis] = n
    return np.concatenate([a, np.full(shape, fill, a.dtype)], axis=axis)


@ieee_defaults
def block_scaled_gemm(x, w, recipe, *, return_parts: bool = False):
    """``x (M, K) @ w (K, N)`` on a block-scaled recipe (scales inside the MMA); see the module.

    ``x`` and ``w`` are quantized along K with the recipe's formats and granularities (an NVFP4
    weight of a recipe with ``weight_2d_blocks`` in 16x16 blocks,
    :func:`fp8sim.scaling.nvfp4.quantize_nvfp4_2d`, as training quantizes it), then
    :func:`block_scaled_gemm_quantized` multiplies them.  Returns the output in the recipe's
    ``output_format`` (float32 storage; float64 for fp64), or with ``return_parts`` also the dict of
    what went into the MMA (``a``, ``b`` codes, ``sa``, ``sb`` scale codes, ``scale_format``,
    ``alpha``, ``acc`` the fp32 accumulator).
    """
    from ..scaling import quantize
    from ..scaling.nvfp4 import quantize_nvfp4_2d
    from ..scaling.orientation import along_k
    from .presets import recipe as get_recipe

    r = get_recipe(recipe)
    if not r.block_scaled:
        raise ValueError(f"recipe {r.name!r} has no block-scaled accumulator (its scales are not inside the MMA)")
    x = np.asarray(x)
    w = np.asarray(w)
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[0]:
        raise ValueError(
            f"block_scaled_gemm: x (M, K) and w (K, N) must be 2-D with the same K, got {x.shape}, {w.shape}"
        )
    kw = dict(scale_format=r.scale_format, scale_rounding=r.scale_rounding, margin=r.margin)
    qx = quantize(x, r.x_format, along_k(r.x_granularity, "x"), **kw)
    if getattr(r, "weight_2d_blocks", False):
        qw = quantize_nvfp4_2d(w, r.w_format, margin=r.margin)
    else:
        qw = quantize(w, r.w_format, along_k(r.w_granularity, "w"), **kw)
    return block_scaled_gemm_quantized(qx, qw, r, return_parts=return_parts)


@ieee_defaults
def block_scaled_gemm_quantized(qa, qb, recipe, *, return_parts: bool = False):
    """``qa (M, K) @ qb (K, N)`` (:class:`~fp8sim.QuantizedTensor` operands quantized along K) on the
    block-scaled MMA of ``recipe`` (:attr:`Recipe.block_scaled`): the codes and their UE4M3 / UE8M0
    scale codes into :func:`fp8sim.tensorcore.matmul` (K zero-padded to the instruction's K, with
    scale 1), the NVFP4 tensor scales as alpha ``fp32(fp32(ga * gb) * acc)``, the recipe's output
    cast.  The operands' scale blocks along K (their granularities', :func:`k_block`; a K shorter than
    one block is one partial block) must both be the instruction's block (16 for NVFP4, 32 for MX,
    ValueError otherwise); along the other axis any block works (16x16 NVFP4 weights included).  The operand
    formats are the tensors' own (a gradient in another format than the recipe's ``x_format``).
    Returns as :func:`block_scaled_gemm`.
    """
    from ..scaling import QuantizedTensor
    from ..tensorcore import get_model, matmul
    from .engine import cast_output
    from .presets import recipe as get_recipe

    r = get_recipe(recipe)
    if not r.block_scaled:
        raise ValueError(f"block_scaled_gemm: recipe {r.name!r} has no block-scaled accumulator")
    if not (isinstance(qa, QuantizedTensor) and isinstance(qb, QuantizedTensor)):
        raise TypeError("block_scaled_gemm_quantized: qa and qb must be QuantizedTensors")
    if len(qa.shape) != 2 or len(qb.shape) != 2 or qa.shape[1] != qb.shape[0]:
        raise ValueError(f"block_scaled_gemm: qa (M, K) and qb (K, N) must share K, got {qa.shape} and {qb.shape}")
    sfmt = {"e4m3": "ue4m3", "e8m0": "ue8m0"}.get(qa.scale_format)
    if sfmt is None or qb.scale_format != qa.scale_format:
        raise ValueError(
            f"block_scaled_gemm: the MMA takes UE4M3 (NVFP4) or UE8M0 (MX) block scales on both operands, "
            f"got {qa.scale_format!r} and {qb.scale_format!r}"
        )
    model = get_model(r.accumulator)  # type: ignore[arg-type]
    M, K = qa.shape
    N = qb.shape[1]
    bx, bw = k_block(qa, 1), k_block(qb, 0)
    if bx != bw:
        raise ValueError(f"block_scaled_gemm: x and w have scale blocks of {bx} and {bw} along K; the MMA takes one")
    takes = instruction_blocks(r.accumulator, sfmt)  # type: ignore[arg-type]
    if bx not in takes:
        raise ValueError(
            f"block_scaled_gemm: the operands have {sfmt} scale blocks of {bx} along K; {r.accumulator!r} takes "
            f"{sfmt} scales per {' or '.join(map(str, takes)) or 'no block'} elements"
        )
    sa = np.repeat(scale_codes(qa.scales, sfmt), qa.block_shape[0], axis=0)[:M]
    sb = np.repeat(scale_codes(qb.scales, sfmt), qb.block_shape[1], axis=1)[:, :N]
    pad = -K % model.instr_k
    one = UE4M3_ONE if sfmt == "ue4m3" else E8M0_ONE
    a = _pad(np.ascontiguousarray(qa.codes), pad, 1, 0)
    b = _pad(np.ascontiguousarray(qb.codes), pad, 0, 0)
    nks = -(-(K + pad) // bx)
    sa = np.ascontiguousarray(_pad(sa, nks - sa.shape[1], 1, one))
    sb = np.ascontiguousarray(_pad(sb, nks - sb.shape[0], 0, one))
    acc = matmul(a, b, a_format=qa.format.name, b_format=qb.format.name, instruction=model, a_scale=sa, b_scale=sb,
                 scale_format=sfmt)  # fmt: skip
    with np.errstate(over="ignore"):  # two tensor scales near FLT_MAX: their fp32 product is inf, as on the GPU
        alpha = np.float32(np.float32(qa.global_scale) * np.float32(qb.global_scale))
    y = acc
    if alpha != 1:
        with np.errstate(all="ignore"):
            y = (alpha * acc).astype(np.float32)
    out = cast_output(y, r.output_format)
    if return_parts:
        return out, {"a": a, "b": b, "sa": sa, "sb": sb, "scale_format": sfmt, "alpha": alpha, "acc": acc}
    return out
