"""The recipe presets beyond Hopper (issue 16): Blackwell's MXFP8, MXFP4 and NVFP4, and DeepSeek-V3's
recipe on Blackwell's accumulator.

They run on the MMA-Sim models of :mod:`fp8sim.tensorcore` and are **emulated, not validated on
hardware** (``validated=False``).  They are data: :data:`PRESETS_BEYOND_HOPPER` holds the fields of
each :class:`fp8sim.Recipe`, which :mod:`fp8sim.recipes` makes and registers in
:data:`fp8sim.recipes.PRESETS` (``fp8sim.recipe("nvfp4")``); see docs/accelerators.md.

``nvfp4`` is TransformerEngine's ``NVFP4BlockScaling`` recipe as its documentation describes it
(``docs/features/low_precision_training/nvfp4`` of TransformerEngine, and the recipe's docstring):

* E2M1 elements, an E4M3 scale per 16 consecutive elements along K times an FP32 per-tensor scale
  ``s_global = amax / (6 * 448)``; elements and scales rounded to nearest (RNE);
* weights with one scale per 16x16 block (``weight_2d_blocks``: ``W`` and ``W^T`` quantize to the
  same values, so Dgrad reuses Fprop's weight);
* a random Hadamard transform (16x16, one fixed sign vector) of both Wgrad operands along the
  tokens before they are quantized (``wgrad_rht``);
* stochastic rounding of the gradients (``grad_rounding="sr"``: the output gradient in Dgrad and
  Wgrad).

:mod:`fp8sim.training` does all of it; a single ``fp8sim.gemm(x, w, "nvfp4")`` is the Fprop GEMM (16x16
weight blocks included).
"""

from __future__ import annotations

__all__ = ["NOT_VALIDATED", "PRESETS_BEYOND_HOPPER"]

#: the label every preset of this module carries in its description
NOT_VALIDATED = "Emulated, not validated on hardware: the accumulator matches MMA-Sim (validated by its authors)."

#: the fields of each preset (keyword arguments of :class:`fp8sim.Recipe`), in registration order
PRESETS_BEYOND_HOPPER: tuple[dict, ...] = (
    dict(
        name="deepseek-v3-blackwell",
        x_format="e4m3",
        w_format="e4m3",
        x_granularity="1x128",
        w_granularity="128x128",
        scale_format="fp32",
        accumulator="sm100:tcgen05.mma.kind::f8f6f4",
        promote_every=128,
        scale_at="promotion",
        scale_application="fma",
        output_format="bf16",
        description="DeepSeek-V3's scaling (E4M3, 1x128 / 128x128 fp32 scales, fma promotion every 128, bf16 "
        "out) on Blackwell's tcgen05.mma kind::f8f6f4 accumulator (25 fraction bits, truncation, RZ to fp32). "
        + NOT_VALIDATED,
    ),
    dict(
        name="mxfp8-blackwell",
        x_format="e4m3",
        w_format="e4m3",
        x_granularity="mx32",
        w_granularity="mx32",
        scale_format="e8m0",
        accumulator="sm100:tcgen05.mma.kind::mxf8f6f4",
        promote_every=None,
        scale_at="epilogue",
        output_format="bf16",
        description="OCP MXFP8 on Blackwell: E4M3 with UE8M0 scales per 32 along K folded into tcgen05.mma "
        "kind::mxf8f6f4 (each product carries its scales' exponents; one 25-bit accumulation over all of K, "
        "no separate promotion), bf16 out. " + NOT_VALIDATED,
    ),
    dict(
        name="mxfp4",
        x_format="e2m1",
        w_format="e2m1",
        x_granularity="mx32",
        w_granularity="mx32",
        scale_format="e8m0",
        accumulator="sm100:tcgen05.mma.kind::mxf4",
        promote_every=None,
        scale_at="epilogue",
        output_format="bf16",
        description="OCP MXFP4 on Blackwell: E2M1 with UE8M0 scales per 32 along K in tcgen05.mma kind::mxf4 "
        "(exact sums of 16 products, scaled, 35-bit fused accumulation), bf16 out. " + NOT_VALIDATED,
    ),
    dict(
        name="nvfp4",
        x_format="e2m1",
        w_format="e2m1",
        x_granularity="nvfp4",
        w_granularity="nvfp4",
        accumulator="sm100:tcgen05.mma.kind::mxf4nvf4",
        promote_every=None,
        scale_at="epilogue",
        output_format="bf16",
        weight_2d_blocks=True,
        wgrad_rht=True,
        grad_rounding="sr",
        description="NVFP4 as TransformerEngine's NVFP4BlockScaling trains it: E2M1 with a UE4M3 scale per 16 "
        "elements along K times an fp32 tensor scale amax/(6*448) (applied as the GEMM's alpha), RNE, on "
        "tcgen05.mma kind::mxf4nvf4, bf16 out; in training (fp8sim.training) weights with one scale per 16x16 "
        "block, a 16x16 random Hadamard transform of both Wgrad operands along the tokens, stochastic rounding "
        "of the gradients (a single fp8sim.gemm is the Fprop GEMM, 16x16 weight blocks included). " + NOT_VALIDATED,
    ),
)
