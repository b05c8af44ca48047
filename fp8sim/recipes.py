"""GEMM recipes: the bundle of choices that turns two float matrices into an FP8 GEMM.

A :class:`Recipe` names, for ``y = x @ w`` with ``x (M, K)`` and ``w (K, N)``:

* the operand formats (``"e4m3"``, ``"e5m2"``; ``"bf16"``, ``"fp32"``,
  ``"fp64"`` for the unquantized baselines);
* the operand scale granularities and policies (see :mod:`fp8sim.scaling`;
  granularities that run along one axis -- ``"gN"``, ``"mxN"`` -- are
  applied along K for both operands);
* the accumulator model (a :mod:`fp8sim.tensorcore` preset name or an
  :class:`~fp8sim.tensorcore.AccumulatorModel`; ``"fp64"`` = exact);
* the promotion interval in K elements (``None``: the tensor-core
  accumulator runs over the whole of K);
* how scales are applied: at each promotion (``scale_at="promotion"``,
  DeepGEMM) or once in the epilogue (``"epilogue"``, per-tensor kernels);
  and the fp32 operation order at promotion (``scale_application``):

  - ``"fma"``: ``s = fp32(sa * sb)``; ``acc = fma(s, partial, acc)``.  This
    is DeepGEMM's ``final_accum += scale_a * scale_b * accum`` as nvcc
    compiles it (the default ``-fmad=true`` contracts the multiply-add into
    one FFMA; the scale product is its own FMUL, being a separate
    statement); our GPU oracle writes the ``__fmaf_rn`` explicitly;
  - ``"mul-add"``: ``acc = acc + fp32(s * partial)`` (compiled with
    ``-fmad=false``);

* the output format (``"bf16"``: RNE from fp32, ``"fp32"``, ``"fp64"``);
* for TransformerEngine-style hybrid recipes, the gradient format and the
  promotion used by the backward GEMMs (:meth:`Recipe.backward`).

Named presets: :data:`PRESETS`, looked up with :func:`recipe`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

__all__ = ["Recipe", "recipe", "recipe_names", "PRESETS"]

FP8_FORMATS = ("e4m3", "e5m2")
WIDE_FORMATS = ("bf16", "fp32", "fp64")
OUTPUT_FORMATS = ("bf16", "fp32", "fp64")
ACCUMULATORS = ("wgmma", "wgmma.f16", "mma.sync", "exact", "fp32", "fp64")


@dataclass(frozen=True)
class Recipe:
    """One GEMM recipe (frozen; derive variants with :func:`dataclasses.replace` or :meth:`with_`)."""

    name: str
    x_format: str = "e4m3"
    w_format: str = "e4m3"
    x_granularity: object = "1x128"
    w_granularity: object = "128x128"
    scale_format: str | None = None
    scale_rounding: str | None = None
    margin: int = 0
    accumulator: object = "wgmma"
    promote_every: int | None = 128
    scale_at: str = "promotion"
    scale_application: str = "fma"
    output_format: str = "bf16"
    grad_format: str | None = None
    backward_promote_every: int | None = None
    validated: bool = False
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for which in ("x_format", "w_format"):
            v = str(getattr(self, which)).lower()
            if v not in FP8_FORMATS + WIDE_FORMATS:
                raise ValueError(
                    f"Recipe {self.name!r}: {which} must be one of "
                    f"{list(FP8_FORMATS + WIDE_FORMATS)}, got {getattr(self, which)!r}"
                )
            object.__setattr__(self, which, v)
        if (self.x_format in FP8_FORMATS) != (self.w_format in FP8_FORMATS):
            raise ValueError(
                f"Recipe {self.name!r}: both operands must be FP8 or both wide, "
                f"got {self.x_format!r} and {self.w_format!r}"
            )
        if self.output_format not in OUTPUT_FORMATS:
            raise ValueError(
                f"Recipe {self.name!r}: output_format must be one of {list(OUTPUT_FORMATS)}, got {self.output_format!r}"
            )
        if isinstance(self.accumulator, str):
            a = self.accumulator.strip().lower()
            if a not in ACCUMULATORS:
                raise ValueError(
                    f"Recipe {self.name!r}: accumulator must be one of {list(ACCUMULATORS)} "
                    f"or an AccumulatorModel, got {self.accumulator!r}"
                )
            object.__setattr__(self, "accumulator", a)
        if self.promote_every is not None:
            p = self.promote_every
            if isinstance(p, bool) or int(p) != p or p <= 0 or p % 32:
                raise ValueError(
                    f"Recipe {self.name!r}: promote_every must be None or a positive "
                    f"multiple of 32 (K elements), got {p!r}"
                )
            object.__setattr__(self, "promote_every", int(p))
        if self.scale_at not in ("promotion", "epilogue"):
            raise ValueError(f"Recipe {self.name!r}: scale_at must be 'promotion' or 'epilogue', got {self.scale_at!r}")
        if self.scale_at == "promotion" and self.is_fp8 and self.promote_every is None:
            raise ValueError(f"Recipe {self.name!r}: scale_at='promotion' needs promote_every")
        if self.scale_application not in ("fma", "mul-add"):
            raise ValueError(
                f"Recipe {self.name!r}: scale_application must be 'fma' or 'mul-add', got {self.scale_application!r}"
            )
        if self.grad_format is not None and str(self.grad_format).lower() not in FP8_FORMATS:
            raise ValueError(f"Recipe {self.name!r}: grad_format must be None, 'e4m3' or 'e5m2'")

    @property
    def is_fp8(self) -> bool:
        return self.x_format in FP8_FORMATS

    def with_(self, **changes) -> Recipe:
        """A copy with some fields changed (``dataclasses.replace``)."""
        return replace(self, **changes)

    def backward(self) -> Recipe:
        """The recipe of a backward GEMM (dgrad/wgrad): the gradient operand ``x`` in
        ``grad_format`` and promotion ``backward_promote_every`` (TransformerEngine's hybrid
        format).  Recipes without a gradient format return themselves."""
        if self.grad_format is None:
            return self
        p = self.backward_promote_every
        return replace(
            self,
            name=self.name + ":backward",
            x_format=self.grad_format,
            promote_every=p,
            scale_at="promotion" if (p is not None and self.scale_at == "promotion") else "epilogue",
        )


PRESETS: dict[str, Recipe] = {}


def _add(r: Recipe) -> None:
    PRESETS[r.name] = r


_add(
    Recipe(
        "deepseek-v3",
        "e4m3",
        "e4m3",
        "1x128",
        "128x128",
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
    )
)
_add(
    Recipe(
        "per-tensor",
        "e4m3",
        "e4m3",
        "tensor",
        "tensor",
        scale_format="fp32",
        accumulator="wgmma",
        promote_every=128,
        scale_at="epilogue",
        output_format="bf16",
        description="E4M3 per-tensor (current amax) fp32 scales, wgmma accumulator promoted every 128 "
        "by a plain fp32 add (CUTLASS GmmaFP8Accumulation), scales in the epilogue, bf16 out",
    )
)
_add(
    Recipe(
        "per-tensor-no-promotion",
        "e4m3",
        "e4m3",
        "tensor",
        "tensor",
        scale_format="fp32",
        accumulator="wgmma",
        promote_every=None,
        scale_at="epilogue",
        output_format="bf16",
        validated=True,
        description="as per-tensor, but the tensor-core accumulator runs over all of K (cuBLAS 'fast "
        "accumulation'); scale product applied once in the epilogue",
    )
)
_add(
    Recipe(
        "mxfp8",
        "e4m3",
        "e4m3",
        "mx32",
        "mx32",
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
    )
)
_add(
    Recipe(
        "te-hybrid",
        "e4m3",
        "e4m3",
        "tensor",
        "tensor",
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
    )
)
_add(
    Recipe(
        "bf16",
        "bf16",
        "bf16",
        "tensor",
        "tensor",
        accumulator="fp32",
        promote_every=None,
        scale_at="epilogue",
        output_format="bf16",
        description="BF16 inputs, fp32 accumulation (numpy float32 BLAS; order not that of any GPU), "
        "bf16 output: the usual baseline",
    )
)
_add(
    Recipe(
        "fp32",
        "fp32",
        "fp32",
        "tensor",
        "tensor",
        accumulator="fp32",
        promote_every=None,
        scale_at="epilogue",
        output_format="fp32",
        description="fp32 inputs, fp32 accumulation (numpy float32 BLAS), fp32 output",
    )
)
_add(
    Recipe(
        "fp64",
        "fp64",
        "fp64",
        "tensor",
        "tensor",
        accumulator="fp64",
        promote_every=None,
        scale_at="epilogue",
        output_format="fp64",
        description="ground truth: float64 inputs and accumulation (returned as float64)",
    )
)


def recipe_names() -> list[str]:
    """Names of the preset recipes, in the order of the presets table."""
    return list(PRESETS)


def recipe(name) -> Recipe:
    """The named preset (a :class:`Recipe` is returned as is)."""
    if isinstance(name, Recipe):
        return name
    if not isinstance(name, str):
        raise TypeError(f"recipe must be a name or a Recipe, got {type(name).__name__}")
    key = name.strip().lower()
    if key not in PRESETS:
        raise ValueError(f"unknown recipe {name!r}; known recipes: {', '.join(PRESETS)}")
    return PRESETS[key]
