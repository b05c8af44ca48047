"""The named recipes: :data:`PRESETS`, looked up with :func:`recipe`, extended with
:func:`register_preset`.

Every preset is one keyword-only :class:`~fp8sim.Recipe` expression in :data:`_TABLE`, in the
order :func:`recipe_names` lists them: Hopper (validated on the H200 where ``validated=True``),
the library configurations of docs/libraries.md (captures in ``tests/data/libraries_sm90.npz``),
the wide baselines, and the presets beyond Hopper.

The presets beyond Hopper run on the MMA-Sim models of :mod:`fp8sim.tensorcore` and are
**emulated, not validated on hardware** (``validated=False``; their descriptions end with
:data:`NOT_VALIDATED`); see docs/accelerators.md.

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

A new preset (a library configuration, say) is one :func:`register_preset` call::

    from fp8sim.gemms import register_preset
    register_preset(fp8sim.recipe("cublaslt-row").with_(name="cublaslt-row-splitk2", split_k=2))
"""

from __future__ import annotations

from .._names import unknown_name_error
from .recipes import Recipe

__all__ = ["PRESETS", "recipe", "recipe_names", "register_preset", "NOT_VALIDATED", "PRESETS_BEYOND_HOPPER"]


#: the label every preset beyond Hopper carries in its description
NOT_VALIDATED = "Emulated, not validated on hardware: the accumulator matches MMA-Sim (validated by its authors)."

_CUBLASLT = "torch 2.11 torch._scaled_mm -> cuBLASLt 13.1 (130100) on H200"
_TRITON = "Triton 3.6 tl.dot on H200 (sm_90)"
_SLOW_ACC = "use_fast_accum=False: the wgmma partial is added into fp32 every 128 K (plain fp32 add)"
_FAST_ACC = "use_fast_accum=True: the wgmma accumulator runs over all of K (of each split-K slice)"


def _cublaslt_tensor(name: str, promote_every: int | None, acc: str) -> Recipe:
    return Recipe(
        name=name,
        x_format="e4m3",
        w_format="e4m3",
        x_granularity="tensor",
        w_granularity="tensor",
        scale_format="fp32",
        accumulator="wgmma",
        promote_every=promote_every,
        scale_at="epilogue",
        epilogue_scale="alpha",
        output_format="bf16",
        validated=True,
        description=f"{_CUBLASLT}, tensorwise fp32 scales; {acc}; epilogue fp32(fp32(sa*sb) * acc), "
        "then the output cast (RNE). Split-K (split_k) is the library's choice per shape: see docs",
    )


def _cublaslt_row(name: str, promote_every: int | None, acc: str) -> Recipe:
    return Recipe(
        name=name,
        x_format="e4m3",
        w_format="e4m3",
        x_granularity="row",
        w_granularity="row",
        scale_format="fp32",
        accumulator="wgmma",
        promote_every=promote_every,
        scale_at="epilogue",
        epilogue_scale="b-then-a",
        output_format="bf16",
        validated=True,
        description=f"{_CUBLASLT}, rowwise (M,1) x (1,N) fp32 scales (outer-vector scaling); {acc}; "
        "epilogue fp32(fp32(acc * sb[j]) * sa[i]), then the output cast (RNE)",
    )


def _triton_imprecise(imprecise: int) -> Recipe:
    return Recipe(
        name=f"triton-imprecise-{imprecise}",
        x_format="e4m3",
        w_format="e4m3",
        x_granularity="row",
        w_granularity="row",
        scale_format="fp32",
        accumulator="wgmma",
        promote_every=imprecise,
        scale_at="epilogue",
        epilogue_scale="a-then-b",
        output_format="fp32",
        validated=True,
        description=f"{_TRITON}: tl.dot(..., max_num_imprecise_acc={imprecise}): the wgmma partial is added "
        f"into the fp32 accumulator every {imprecise} K (BLOCK_K >= {imprecise}); epilogue acc * sa * sb",
    )


#: every preset, in the order of :func:`recipe_names`
_TABLE: tuple[Recipe, ...] = (
    # ---- Hopper
    Recipe(
        name="deepseek-v3",
        x_format="e4m3",
        w_format="e4m3",
        x_granularity="1x128",
        w_granularity="128x128",
        scale_format="fp32",
        accumulator="wgmma",
        promote_every=128,
        scale_at="promotion",
        scale_application="fma",
        output_format="bf16",
        validated=True,
        description="DeepSeek-V3 / DeepGEMM: E4M3, 1x128 activation and 128x128 weight fp32 scales "
        "(amax/448), wgmma accumulator, promotion every 128 into fp32 with "
        "fma(sa*sb, partial, acc) on CUDA cores, bf16 output (bit-exact vs the H200 oracle)",
    ),
    Recipe(
        name="per-tensor",
        x_format="e4m3",
        w_format="e4m3",
        x_granularity="tensor",
        w_granularity="tensor",
        scale_format="fp32",
        accumulator="wgmma",
        promote_every=128,
        scale_at="epilogue",
        output_format="bf16",
        description="E4M3 per-tensor (current amax) fp32 scales, wgmma accumulator promoted every 128 "
        "by a plain fp32 add (CUTLASS GmmaFP8Accumulation), scales in the epilogue, bf16 out",
    ),
    Recipe(
        name="per-tensor-no-promotion",
        x_format="e4m3",
        w_format="e4m3",
        x_granularity="tensor",
        w_granularity="tensor",
        scale_format="fp32",
        accumulator="wgmma",
        promote_every=None,
        scale_at="epilogue",
        output_format="bf16",
        validated=True,
        description="as per-tensor, but the tensor-core accumulator runs over all of K (cuBLAS 'fast "
        "accumulation'); scale product applied once in the epilogue",
    ),
    Recipe(
        name="mxfp8",
        x_format="e4m3",
        w_format="e4m3",
        x_granularity="mx32",
        w_granularity="mx32",
        scale_format="e8m0",
        accumulator="wgmma",
        promote_every=32,
        scale_at="promotion",
        scale_application="fma",
        output_format="bf16",
        description="OCP MXFP8: E4M3 with E8M0 scales per 32 along K on both operands; emulated on the "
        "Hopper datapath (one wgmma k32 per scale block, scaled promotion after each; "
        "power-of-two scales make the scaling exact). NOT a model of Blackwell's "
        "block-scaled MMA, which is not validated here",
    ),
    Recipe(
        name="te-hybrid",
        x_format="e4m3",
        w_format="e4m3",
        x_granularity="tensor",
        w_granularity="tensor",
        scale_format="fp32",
        accumulator="wgmma",
        promote_every=None,
        scale_at="epilogue",
        output_format="bf16",
        grad_format="e5m2",
        backward_promote_every=128,
        description="TransformerEngine HYBRID: E4M3 forward, E5M2 gradients (Recipe.backward()), "
        "per-tensor scaling (delayed scaling whose history holds the current amax), "
        "fprop without split accumulator, dgrad/wgrad promoted every 128",
    ),
    # ---- library configurations (docs/libraries.md)
    _cublaslt_tensor("cublaslt-tensor", 128, _SLOW_ACC),
    _cublaslt_row("cublaslt-row", 128, _SLOW_ACC),
    _cublaslt_tensor("cublaslt-tensor-fast", None, _FAST_ACC),
    _cublaslt_row("cublaslt-row-fast", None, _FAST_ACC),
    Recipe(
        name="cublaslt-block",
        x_format="e4m3",
        w_format="e4m3",
        x_granularity="1x128",
        w_granularity="128x128",
        scale_format="fp32",
        accumulator="wgmma",
        promote_every=128,
        scale_at="promotion",
        scale_application="fma",
        output_format="bf16",
        split_granule=512,
        validated=True,
        description=f"{_CUBLASLT}, blockwise 1x128 activations x 128x128 weights (fast accumulation refused "
        "by torch): every 128 K the wgmma partial p joins fp32 as fma(fp32(sa*sb), p, acc) -- DeepSeek-V3's "
        "arithmetic; split-K per shape (see docs). The 128x128 scale tensor must be padded to a multiple of 4 "
        "blocks along K (docs/libraries.md)",
    ),
    Recipe(
        name="triton",
        x_format="e4m3",
        w_format="e4m3",
        x_granularity="row",
        w_granularity="row",
        scale_format="fp32",
        accumulator="wgmma",
        promote_every=None,
        scale_at="epilogue",
        epilogue_scale="a-then-b",
        output_format="fp32",
        validated=True,
        description=f"{_TRITON}: acc = tl.dot(a, b, acc) with the default max_num_imprecise_acc (2**30 on "
        "sm_90): the wgmma accumulator runs over all of K for any BLOCK_K; epilogue acc * sa * sb "
        "(as gpu/capture_libraries.py writes it; a kernel's own epilogue order is its own)",
    ),
    _triton_imprecise(32),
    _triton_imprecise(64),
    _triton_imprecise(128),
    # ---- wide baselines
    Recipe(
        name="bf16",
        x_format="bf16",
        w_format="bf16",
        x_granularity="tensor",
        w_granularity="tensor",
        accumulator="fp32",
        promote_every=None,
        scale_at="epilogue",
        output_format="bf16",
        description="BF16 inputs, fp32 accumulation by numpy's float32 BLAS (the fast baseline: its order "
        "and rounding are not any GPU's; 'bf16-cublaslt' is the H200's), bf16 output",
    ),
    Recipe(
        name="bf16-cublaslt",
        x_format="bf16",
        w_format="bf16",
        x_granularity="tensor",
        w_granularity="tensor",
        accumulator="wgmma.bf16",
        promote_every=None,
        scale_at="epilogue",
        output_format="bf16",
        split_granule=64,
        validated=True,
        description="torch 2.11 BF16 matmul -> cuBLASLt 13.1 on H200: wgmma m64nNk16 chained along K (C and "
        "16 exact products in one fused sum, 25 fraction bits, truncation, fp32 truncation), split-K "
        "slices of ceil(ceil(K/64)/S)*64 summed in fp32 (S is the library's choice per shape), bf16 RNE",
    ),
    Recipe(
        name="fp32",
        x_format="fp32",
        w_format="fp32",
        x_granularity="tensor",
        w_granularity="tensor",
        accumulator="fp32",
        promote_every=None,
        scale_at="epilogue",
        output_format="fp32",
        description="fp32 inputs, fp32 accumulation (numpy float32 BLAS), fp32 output",
    ),
    Recipe(
        name="fp64",
        x_format="fp64",
        w_format="fp64",
        x_granularity="tensor",
        w_granularity="tensor",
        accumulator="fp64",
        promote_every=None,
        scale_at="epilogue",
        output_format="fp64",
        description="ground truth: float64 inputs and accumulation (returned as float64)",
    ),
    # ---- beyond Hopper (emulated on the MMA-Sim models, not validated on hardware)
    Recipe(
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
    Recipe(
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
    Recipe(
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
    Recipe(
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

#: preset name -> recipe, in registration order (:func:`register_preset` adds to it)
PRESETS: dict[str, Recipe] = {}


def register_preset(r: Recipe, *, replace: bool = False) -> Recipe:
    """Register the recipe ``r`` as a preset under its name, so that :func:`fp8sim.recipe` (and every
    function that takes a recipe name: :func:`fp8sim.gemm`, :func:`fp8sim.scaled_gemm`, training)
    finds it; returns ``r``.  The name must be lowercase without surrounding spaces (names are looked up
    case-insensitively).  An existing name raises ``ValueError`` unless ``replace=True``."""
    if not isinstance(r, Recipe):
        raise TypeError(f"register_preset: expected a Recipe, got {type(r).__name__}")
    if r.name != r.name.strip().lower():
        raise ValueError(f"register_preset: a preset name is lowercase without surrounding spaces, got {r.name!r}")
    if r.name in PRESETS and not replace:
        raise ValueError(f"register_preset: a preset named {r.name!r} exists (pass replace=True to replace it)")
    PRESETS[r.name] = r
    return r


for _r in _TABLE:
    register_preset(_r)

#: the flat fields of the presets beyond Hopper (keyword arguments of :class:`fp8sim.Recipe`)
PRESETS_BEYOND_HOPPER: tuple[dict, ...] = tuple(
    r.flat() for r in _TABLE if r.name in ("deepseek-v3-blackwell", "mxfp8-blackwell", "mxfp4", "nvfp4")
)


def recipe_names() -> list[str]:
    """Names of the preset recipes, in the order of the presets table (registered ones last)."""
    return list(PRESETS)


def recipe(name) -> Recipe:
    """The named preset (a :class:`Recipe` is returned as is).  An unknown name raises
    :class:`~fp8sim.formats.UnknownNameError` (a ``ValueError``) naming the closest presets."""
    if isinstance(name, Recipe):
        return name
    if not isinstance(name, str):
        raise TypeError(f"recipe must be a name or a Recipe, got {type(name).__name__}")
    key = name.strip().lower()
    if key not in PRESETS:
        raise unknown_name_error("recipe", name, PRESETS)
    return PRESETS[key]
