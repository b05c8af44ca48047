"""The typed parts of a :class:`~fp8sim.gemms.recipes.Recipe` (frozen values), in the style of
TransformerEngine (``QParams`` per tensor, ``MMParams`` per GEMM) and torchao
(``Float8LinearConfig``: a ``CastConfig`` per role, a ``Float8GemmConfig`` per GEMM):

* :class:`OperandSpec`: how one operand is quantized: element format, scale granularity (a
  :class:`~fp8sim.scaling.Granularity` value, spelled for an operand whose last axis is K), scale
  format and rounding, margin, element rounding, and (Wgrad operands) the random Hadamard
  transform;
* :class:`GemmSpec`: how one GEMM multiplies: the accumulator (an
  :class:`~fp8sim.tensorcore.AccumulatorModel`, or a :class:`WideAccumulator` for numpy's BLAS and
  exact float64), the promotion interval, where and how scales apply, the epilogue order, split-K
  (:class:`SplitK`) and the output format;
* :class:`TrainingSpec`: the training-only techniques (TransformerEngine's hybrid gradient format
  and backward promotion, and its NVFP4 techniques).

A spec keeps the spelling it was given (``"1x128"``, ``"wgmma"``) next to the typed value: the
recipe's flat fields (``recipe.x_granularity``, ``recipe.accumulator``) read it, and equality
compares it, as it did before the specs.  The checks that relate fields to each other (scale
blocks that nest, promotion dividing the block, formats an instruction multiplies) are the
recipe's: a spec is checked when a :class:`~fp8sim.gemms.recipes.Recipe` is made of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..formats import Format
from ..scaling import Granularity
from ..tensorcore import AccumulatorModel

__all__ = ["OperandSpec", "GemmSpec", "SplitK", "WideAccumulator", "TrainingSpec", "Accumulator", "ROLES"]

#: the three GEMMs of training (``y = x w``; ``dx = dy w^T``; ``dw = x^T dy``)
ROLES = ("fprop", "dgrad", "wgrad")

#: accumulator names that are not tensor-core models: ``"fp64"`` (exact float64 products and sums)
WIDE_ACCUMULATORS = ("fp64",)


@dataclass(frozen=True)
class WideAccumulator:
    """An accumulator that is not a tensor-core model: ``"fp64"`` (exact float64 products and sums),
    or, for the unquantized (bf16 / fp32 / fp64 operand) recipes, numpy's float32 BLAS under the
    accumulator name the recipe gives (``"fp32"``)."""

    name: str

    @property
    def block_scaled(self) -> bool:
        """Always False: no scales inside an instruction."""
        return False

    @property
    def exact(self) -> bool:
        """True for ``"fp64"``: exact float64 products and sums."""
        return self.name == "fp64"


#: the accumulator of a GEMM: a tensor-core model or a wide (BLAS / float64) accumulator
Accumulator = AccumulatorModel | WideAccumulator


@dataclass(frozen=True)
class SplitK:
    """Split-K: ``slices`` slices of K, each its own accumulator from zero, starting on multiples of
    ``granule`` K elements (``ceil(ceil(K / granule) / slices)`` granules per slice), the fp32 slice
    results summed in ``order`` (``"sequential"``, ``"reverse"`` or ``"pairwise"``), as cuBLASLt's
    split-K kernels and their ``splitKreduce`` kernel do.  ``SplitK()`` is no split."""

    slices: int = 1
    granule: int = 128
    order: str = "sequential"


@dataclass(frozen=True)
class OperandSpec:
    """How one GEMM operand is quantized (``QParams`` / ``CastConfig``).

    ``granularity`` takes anything :func:`fp8sim.granularity` parses and holds the
    :class:`~fp8sim.scaling.Granularity` value; the spelling given is kept in ``spelling`` (what
    ``recipe.x_granularity`` returns, and what equality compares).  ``rounding`` is the element
    rounding (``"rne"``, or ``"sr"`` for the gradients of a recipe with ``grad_rounding="sr"``) and
    ``rht`` the random Hadamard transform along K applied before quantizing (Wgrad operands of a
    recipe with ``wgrad_rht``): the operands a recipe stores (``recipe.x``, ``recipe.w``) have the
    defaults, the ones of a GEMM role (:meth:`Recipe.operands`) say what that GEMM does."""

    format: str | Format = "e4m3"
    granularity: Any = field(default="tensor", compare=False)
    scale_format: str | None = None
    scale_rounding: str | None = None
    margin: int = 0
    rounding: str = "rne"
    rht: bool = False
    spelling: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        from ..scaling import granularity as _granularity

        g = self.granularity
        if self.spelling is None:
            object.__setattr__(self, "spelling", g)
        if not isinstance(g, Granularity):
            object.__setattr__(self, "granularity", _granularity(g))


@dataclass(frozen=True)
class GemmSpec:
    """How one GEMM multiplies and accumulates (``MMParams`` / ``Float8GemmConfig``).

    ``accumulator`` takes an accumulator name (``"wgmma"``, ``"sm100:tcgen05.mma.kind::mxf4"``,
    ``"fp64"``), an :class:`~fp8sim.tensorcore.AccumulatorModel` or a :class:`WideAccumulator` and
    holds the typed value (the name given is kept in ``accumulator_name``: ``recipe.accumulator``).
    ``promote_every``: K elements per tensor-core partial before it joins the fp32 accumulator
    (None: all of K); ``scale_at``: ``"promotion"`` (DeepGEMM) or ``"epilogue"``;
    ``scale_application``: the fp32 order at promotion, ``"fma"`` or ``"mul-add"``;
    ``epilogue_scale``: the fp32 order in the epilogue, ``"alpha"``, ``"b-then-a"`` or
    ``"a-then-b"``; ``split_k``: a :class:`SplitK`; ``output_format``: ``"bf16"``, ``"fp32"`` or
    ``"fp64"``."""

    accumulator: Any = field(default="wgmma", compare=False)
    promote_every: int | None = 128
    scale_at: str = "promotion"
    scale_application: str = "fma"
    epilogue_scale: str = "alpha"
    split_k: SplitK = SplitK()
    output_format: str = "bf16"
    accumulator_name: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        a = self.accumulator
        if self.accumulator_name is None:
            object.__setattr__(self, "accumulator_name", a.name if isinstance(a, WideAccumulator) else a)
        if isinstance(a, str):
            object.__setattr__(self, "accumulator", _accumulator(a))
        if not isinstance(self.split_k, SplitK):
            raise TypeError(f"GemmSpec: split_k must be a SplitK, got {type(self.split_k).__name__}")

    @property
    def block_scaled(self) -> bool:
        """True when the accumulator is a block-scaled MMA (the scales are inside the instruction)."""
        return bool(getattr(self.accumulator, "block_scaled", False))


def _accumulator(name: str) -> Accumulator:
    """The typed accumulator of a (checked) name: a registry model, else a wide accumulator."""
    from ..tensorcore import get_model

    key = name.strip().lower()
    if key in WIDE_ACCUMULATORS:
        return WideAccumulator(key)
    return get_model(key)


@dataclass(frozen=True)
class TrainingSpec:
    """The techniques of the training GEMMs (used by :mod:`fp8sim.training`; defaults: off).

    ``grad_format``: the format of the gradient operands (TransformerEngine's hybrid E5M2; None: the
    activations' format) and ``backward_promote_every`` the promotion of Dgrad and Wgrad when it is
    set; TransformerEngine's NVFP4 techniques: ``weight_2d_blocks`` (one E4M3 scale per 16x16 block of
    an NVFP4 weight), ``wgrad_rht`` with ``rht_seed`` (a random Hadamard transform of both Wgrad
    operands along the tokens; None: TransformerEngine's fixed signs) and ``grad_rounding``
    (``"rne"`` or ``"sr"``: the element rounding of the gradient operands)."""

    grad_format: str | Format | None = None
    backward_promote_every: int | None = None
    weight_2d_blocks: bool = False
    wgrad_rht: bool = False
    rht_seed: int | None = None
    grad_rounding: str = "rne"
