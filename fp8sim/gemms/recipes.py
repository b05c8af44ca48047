"""GEMM recipes: the bundle of choices that turns two float matrices into an FP8 GEMM.

A :class:`Recipe` names, for ``y = x @ w`` with ``x (M, K)`` and ``w (K, N)``:

* the operand formats (``"e4m3"``, ``"e5m2"``, any other signed 8-bit
  format with zero -- ``"e4m3fnuz"``, ``"e5m2fnuz"``, ``"e3m4"``, a custom
  :class:`~fp8sim.Format`; ``"bf16"``, ``"fp32"``, ``"fp64"`` for the
  unquantized baselines);
* the operand scale granularities and policies (see :mod:`fp8sim.scaling`),
  spelled for an operand whose last axis is K: ``x (M, K)`` and ``w`` as
  torch stores it, ``(N, K)``.  ``"1x128"`` is 128 elements along K for
  either operand; for ``w (K, N)`` the GEMM transposes the granularity
  (``1x128`` -> ``128x1``, ``row`` -> ``col``, groups along axis 0);
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

* with scales in the epilogue, the fp32 operation order (``epilogue_scale``): ``"alpha"``
  ``fp32(fp32(sa * sb) * acc)`` (cuBLASLt tensorwise), ``"b-then-a"`` ``fp32(fp32(acc * sb) * sa)``
  (cuBLASLt rowwise), ``"a-then-b"`` ``fp32(fp32(acc * sa) * sb)`` (a Triton epilogue written
  ``acc * sa * sb``);
* split-K (``split_k`` slices of K, each its own accumulator from zero; slice boundaries at
  multiples of ``split_granule`` K elements, ``ceil(ceil(K / granule) / split_k)`` granules per
  slice; the fp32 slice results summed in ``split_order``: ``"sequential"`` (slice 0 first),
  ``"reverse"`` or ``"pairwise"``), as cuBLASLt's split-K kernels and their ``splitKreduce``
  kernel do (scales at promotion are applied inside each slice; epilogue scales after the sum);
* the output format (``"bf16"``: RNE from fp32, ``"fp32"``, ``"fp64"``);
* for TransformerEngine-style hybrid recipes, the gradient format and the
  promotion used by the backward GEMMs (:meth:`Recipe.backward`);
* for training (:mod:`fp8sim.training`), TransformerEngine's NVFP4 techniques:
  ``weight_2d_blocks`` (one scale per 16x16 block of an NVFP4 weight, so ``W`` and ``W^T`` share
  scales), ``wgrad_rht`` and ``rht_seed`` (a random Hadamard transform of both Wgrad operands along
  the tokens, :mod:`fp8sim.scaling.hadamard`) and ``grad_rounding`` (``"sr"``: stochastic rounding
  of the gradient operands).  Their defaults leave a recipe as it was.

Named presets: :data:`fp8sim.gemms.presets.PRESETS`, looked up with :func:`fp8sim.recipe`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from dataclasses import replace as _replace
from typing import Any

from ..formats import Format
from .recipe_checks import (
    BF16_ACCUMULATORS,
    BLOCK_SCALED_FORMATS,
    EPILOGUE_SCALES,
    OUTPUT_FORMATS,
    SCALE_APPLICATIONS,
    SCALE_ATS,
    SPLIT_ORDERS,
    WIDE_FORMATS,
    accumulator_names,
    arch_accumulator_names,
    check_fields,
    is_block_scaled,
    is_int,
)
from .specs import ROLES, GemmSpec, OperandSpec, SplitK, TrainingSpec, WideAccumulator

__all__ = [
    "Recipe",
    "FLAT_FIELDS",
    "accumulator_names",
    "arch_accumulator_names",
    "is_block_scaled",
    "is_int",
    "BF16_ACCUMULATORS",
    "WIDE_FORMATS",
    "OUTPUT_FORMATS",
    "SCALE_ATS",
    "SCALE_APPLICATIONS",
    "EPILOGUE_SCALES",
    "SPLIT_ORDERS",
    "BLOCK_SCALED_FORMATS",
    "OperandSpec",
    "GemmSpec",
    "SplitK",
    "TrainingSpec",
    "WideAccumulator",
    "ROLES",
]

#: the flat fields of a recipe, in the order ``Recipe(name, ...)`` takes them positionally
FLAT_FIELDS = (
    "x_format",
    "w_format",
    "x_granularity",
    "w_granularity",
    "scale_format",
    "scale_rounding",
    "margin",
    "accumulator",
    "promote_every",
    "scale_at",
    "scale_application",
    "output_format",
    "epilogue_scale",
    "split_k",
    "split_granule",
    "split_order",
    "grad_format",
    "backward_promote_every",
    "weight_2d_blocks",
    "wgrad_rht",
    "rht_seed",
    "grad_rounding",
    "validated",
    "description",
)

#: the defaults of the flat fields
FLAT_DEFAULTS: dict[str, Any] = dict(
    x_format="e4m3",
    w_format="e4m3",
    x_granularity="1x128",
    w_granularity="128x128",
    scale_format=None,
    scale_rounding=None,
    margin=0,
    accumulator="wgmma",
    promote_every=128,
    scale_at="promotion",
    scale_application="fma",
    output_format="bf16",
    epilogue_scale="alpha",
    split_k=1,
    split_granule=128,
    split_order="sequential",
    grad_format=None,
    backward_promote_every=None,
    weight_2d_blocks=False,
    wgrad_rht=False,
    rht_seed=None,
    grad_rounding="rne",
    validated=False,
    description="",
)

_COMPOSED = ("x", "w", "fprop", "training", "validated", "description")


def _flatten(x, w, fprop, training) -> dict[str, Any]:
    """The flat fields of composed specs (None: not given)."""
    out: dict[str, Any] = {}
    for which, spec in (("x", x), ("w", w)):
        if spec is None:
            continue
        if not isinstance(spec, OperandSpec):
            raise TypeError(f"Recipe: {which} must be an OperandSpec, got {type(spec).__name__}")
        if spec.rounding != "rne" or spec.rht:
            raise ValueError(
                f"Recipe: {which}: the element rounding and RHT of a recipe's operands are training "
                "techniques: set them in training=TrainingSpec(grad_rounding=..., wgrad_rht=...)"
            )
        out[f"{which}_format"] = spec.format
        out[f"{which}_granularity"] = spec.spelling
        pol = (spec.scale_format, spec.scale_rounding, spec.margin)
        if x is not None and w is not None and which == "w" and pol != (x.scale_format, x.scale_rounding, x.margin):
            raise ValueError(
                "Recipe: x and w must have the same scale_format, scale_rounding and margin "
                f"(got {(x.scale_format, x.scale_rounding, x.margin)} and {pol})"
            )
        out.update(scale_format=spec.scale_format, scale_rounding=spec.scale_rounding, margin=spec.margin)
    if fprop is not None:
        if not isinstance(fprop, GemmSpec):
            raise TypeError(f"Recipe: fprop must be a GemmSpec, got {type(fprop).__name__}")
        out.update(
            accumulator=fprop.accumulator_name,
            promote_every=fprop.promote_every,
            scale_at=fprop.scale_at,
            scale_application=fprop.scale_application,
            epilogue_scale=fprop.epilogue_scale,
            split_k=fprop.split_k.slices,
            split_granule=fprop.split_k.granule,
            split_order=fprop.split_k.order,
            output_format=fprop.output_format,
        )
    if training is not None:
        if not isinstance(training, TrainingSpec):
            raise TypeError(f"Recipe: training must be a TrainingSpec, got {type(training).__name__}")
        out.update({f.name: getattr(training, f.name) for f in fields(TrainingSpec)})
    return out


@dataclass(frozen=True, init=False, repr=False)
class Recipe:
    """One GEMM recipe (frozen; derive variants with :meth:`with_` or :func:`dataclasses.replace`).

    A recipe is the composition of typed specs (:mod:`fp8sim.gemms.specs`): the operand specs
    ``x`` and ``w`` (:class:`~fp8sim.gemms.specs.OperandSpec`), the Fprop GEMM ``fprop``
    (:class:`~fp8sim.gemms.specs.GemmSpec`; :meth:`gemm` gives Dgrad's and Wgrad's), the training
    techniques ``training`` (:class:`~fp8sim.gemms.specs.TrainingSpec`), ``validated`` and a
    ``description``.  It is made either from those::

        Recipe("mine", x=OperandSpec("e4m3", "1x128", "fp32"), w=OperandSpec("e4m3", "128x128", "fp32"),
               fprop=GemmSpec("wgmma", promote_every=128, split_k=SplitK(2, granule=512)))

    or from the flat fields, the documented shorthand (positionally in the order of
    :data:`FLAT_FIELDS`, or by keyword; both may be mixed, a flat keyword overriding a spec)::

        Recipe("mine", "e4m3", "e4m3", "1x128", "128x128", scale_format="fp32", split_k=2, split_granule=512)

    Every flat field reads as an attribute (``recipe.x_format``, ``recipe.promote_every``,
    ``recipe.accumulator``, ``recipe.split_k``, ...), as it was given after normalization.

    Every field is checked when the recipe is made, so a recipe that exists can run: operand
    formats (``"bf16"``, ``"fp32"``, ``"fp64"`` for the wide baselines; else any signed 8-bit
    format with zero -- a catalogue name such as ``"e4m3fnuz"`` or a custom
    :class:`~fp8sim.Format`), granularities (parsed as :func:`fp8sim.granularity` does, spelled
    for an operand whose last axis is K: ``x (M, K)`` and ``w (N, K)`` as torch stores it; scale
    blocks along K must be multiples of 32 that nest and that ``promote_every`` divides), the
    scale policy (as :func:`fp8sim.quantize` checks it; ``margin`` an int), booleans that are
    real booleans.  Unknown names raise :class:`~fp8sim.formats.UnknownNameError` naming the
    closest known ones.

    The training options (used by :mod:`fp8sim.training`; defaults: off) are TransformerEngine's
    NVFP4 techniques: ``weight_2d_blocks`` (NVFP4 weights with one E4M3 scale per 16x16 block,
    :func:`fp8sim.scaling.nvfp4.quantize_nvfp4_2d`; NVFP4 recipes only), ``wgrad_rht`` (a random
    Hadamard transform of size 16 of both Wgrad operands along their K, the tokens;
    :func:`fp8sim.scaling.hadamard.rht`) with ``rht_seed`` (None: TransformerEngine's fixed
    signs; an int: signs from that seed), and ``grad_rounding`` (``"rne"`` or ``"sr"``: the
    element rounding of the gradient operands of Dgrad and Wgrad).
    """

    name: str
    x: OperandSpec
    w: OperandSpec
    fprop: GemmSpec
    training: TrainingSpec
    validated: bool
    description: str = field(compare=False)

    def __init__(self, name: str, *args: Any, **kw: Any) -> None:
        if args and isinstance(args[0], OperandSpec):
            order: tuple[str, ...] = _COMPOSED
        else:
            order = FLAT_FIELDS
        if len(args) > len(order):
            raise TypeError(f"Recipe() takes at most {len(order) + 1} positional arguments ({len(args) + 1} given)")
        for k, v in zip(order, args):
            if k in kw:
                raise TypeError(f"Recipe() got multiple values for argument {k!r}")
            kw[k] = v
        unknown = [k for k in kw if k not in FLAT_DEFAULTS and k not in _COMPOSED]
        if unknown:
            raise TypeError(f"Recipe() got an unexpected keyword argument {unknown[0]!r}")
        values = dict(FLAT_DEFAULTS)
        values.update(_flatten(kw.pop("x", None), kw.pop("w", None), kw.pop("fprop", None), kw.pop("training", None)))
        values.update(kw)
        f = check_fields(name, values)
        set_ = object.__setattr__
        set_(self, "name", name)
        for which in ("x", "w"):
            spelled = getattr(f, f"{which}_granularity")
            g = f.parsed.get(f"{which}_granularity", spelled)
            fmt = getattr(f, f"{which}_format")
            set_(self, which, OperandSpec(fmt, g, f.scale_format, f.scale_rounding, f.margin, spelling=spelled))
        set_(
            self,
            "fprop",
            GemmSpec(
                _typed_accumulator(f.accumulator, f.is_fp8),
                f.promote_every,
                f.scale_at,
                f.scale_application,
                f.epilogue_scale,
                SplitK(f.split_k, f.split_granule, f.split_order),
                f.output_format,
                accumulator_name=f.accumulator,
            ),
        )
        set_(
            self,
            "training",
            TrainingSpec(
                f.grad_format, f.backward_promote_every, f.weight_2d_blocks, f.wgrad_rht, f.rht_seed, f.grad_rounding
            ),
        )
        set_(self, "validated", f.validated)
        set_(self, "description", f.description)

    # ---- the flat fields (the shorthand's names), read from the specs
    @property
    def x_format(self) -> str | Format:
        return self.x.format

    @property
    def w_format(self) -> str | Format:
        return self.w.format

    @property
    def x_granularity(self) -> Any:
        return self.x.spelling

    @property
    def w_granularity(self) -> Any:
        return self.w.spelling

    @property
    def scale_format(self) -> str | None:
        return self.x.scale_format

    @property
    def scale_rounding(self) -> str | None:
        return self.x.scale_rounding

    @property
    def margin(self) -> int:
        return self.x.margin

    @property
    def accumulator(self) -> Any:
        """The accumulator as given (a name, or an AccumulatorModel); the typed value is
        ``recipe.fprop.accumulator``."""
        return self.fprop.accumulator_name

    @property
    def promote_every(self) -> int | None:
        return self.fprop.promote_every

    @property
    def scale_at(self) -> str:
        return self.fprop.scale_at

    @property
    def scale_application(self) -> str:
        return self.fprop.scale_application

    @property
    def output_format(self) -> str:
        return self.fprop.output_format

    @property
    def epilogue_scale(self) -> str:
        return self.fprop.epilogue_scale

    @property
    def split_k(self) -> int:
        return self.fprop.split_k.slices

    @property
    def split_granule(self) -> int:
        return self.fprop.split_k.granule

    @property
    def split_order(self) -> str:
        return self.fprop.split_k.order

    @property
    def grad_format(self) -> str | Format | None:
        return self.training.grad_format

    @property
    def backward_promote_every(self) -> int | None:
        return self.training.backward_promote_every

    @property
    def weight_2d_blocks(self) -> bool:
        return self.training.weight_2d_blocks

    @property
    def wgrad_rht(self) -> bool:
        return self.training.wgrad_rht

    @property
    def rht_seed(self) -> int | None:
        return self.training.rht_seed

    @property
    def grad_rounding(self) -> str:
        return self.training.grad_rounding

    def flat(self) -> dict[str, Any]:
        """The flat fields (``name`` first): ``Recipe(**recipe.flat()) == recipe``."""
        return {"name": self.name, **{k: getattr(self, k) for k in FLAT_FIELDS}}

    def __repr__(self) -> str:
        changed = [
            f"{k}={getattr(self, k)!r}"
            for k in FLAT_FIELDS
            if k != "description" and not _same(getattr(self, k), FLAT_DEFAULTS[k])
        ]
        return f"Recipe({', '.join([repr(self.name)] + changed)})"

    @property
    def block_scaled(self) -> bool:
        """True for a recipe whose scales are folded into a block-scaled MMA (run by
        :func:`fp8sim.gemms.block_scaled.block_scaled_gemm`): a property of the accumulator model."""
        return self.fprop.block_scaled

    @property
    def is_fp8(self) -> bool:
        """True for the quantized (8-bit operand) recipes, False for bf16 / fp32 / fp64."""
        return self.x.format not in WIDE_FORMATS

    def with_(self, **changes: Any) -> Recipe:
        """A copy with some fields changed: flat fields (``split_k=2``) or specs (``fprop=...``),
        a flat field overriding a spec (``dataclasses.replace`` does the same)."""
        kw: dict[str, Any] = {k: getattr(self, k) for k in _COMPOSED}
        kw.update(changes)
        return Recipe(changes.pop("name", self.name), **{k: v for k, v in kw.items() if k != "name"})

    def backward(self) -> Recipe:
        """The recipe of a backward GEMM (dgrad/wgrad): the gradient operand ``x`` in
        ``grad_format`` and promotion ``backward_promote_every`` (TransformerEngine's hybrid
        format).  Recipes without a gradient format return themselves."""
        if self.grad_format is None:
            return self
        return self._roles()["backward"]

    def role(self, role: str) -> Recipe:
        """The recipe GEMM ``role`` runs with: ``"fprop"`` the recipe itself; ``"dgrad"``
        :meth:`backward`; ``"wgrad"`` :meth:`backward` with FP32 output (FP32 weight gradients,
        except fp64 recipes).  Computed once per recipe."""
        if role not in ROLES:
            raise ValueError(f"matmul: role must be one of {ROLES}, got {role!r}")
        if role == "fprop":
            return self
        return self._roles()[role]

    def gemm(self, role: str = "fprop") -> GemmSpec:
        """The :class:`~fp8sim.gemms.specs.GemmSpec` of GEMM ``role`` (:meth:`role`'s ``fprop``)."""
        return self.role(role).fprop

    def operands(self, role: str = "fprop") -> tuple[OperandSpec, OperandSpec]:
        """The operand specs ``(a, b)`` of GEMM ``role``: Fprop ``(x, w)``; Dgrad ``(dy, w)`` with the
        gradient in ``grad_format`` (else x's format) and ``grad_rounding``; Wgrad ``(x, dy)``, both
        quantized along the tokens with x's granularity, the gradient rounded in ``grad_rounding``,
        both with ``rht`` when the recipe has ``wgrad_rht``."""
        if role not in ROLES:
            raise ValueError(f"matmul: role must be one of {ROLES}, got {role!r}")
        x, w, t = self.x, self.w, self.training
        grad = OperandSpec(
            t.grad_format or x.format,
            x.granularity,
            x.scale_format,
            x.scale_rounding,
            x.margin,
            rounding=t.grad_rounding,
            spelling=x.spelling,
        )
        if role == "fprop":
            return x, w
        if role == "dgrad":
            return grad, w
        return _replace(x, rht=t.wgrad_rht), _replace(grad, rht=t.wgrad_rht)

    def _roles(self) -> dict[str, Recipe]:
        cache = self.__dict__.get("_role_cache")
        if cache is None:
            p = self.backward_promote_every
            rb = self
            if self.grad_format is not None:
                rb = self.with_(
                    name=self.name + ":backward",
                    x_format=self.grad_format,
                    promote_every=p,
                    scale_at="promotion" if (p is not None and self.scale_at == "promotion") else "epilogue",
                    grad_format=None,
                    backward_promote_every=None,
                )
            rw = rb if rb.output_format == "fp64" else rb.with_(output_format="fp32")
            cache = {"backward": rb, "dgrad": rb, "wgrad": rw}
            object.__setattr__(self, "_role_cache", cache)
        return cache


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def _typed_accumulator(a: Any, fp8: bool) -> Any:
    """The typed accumulator of a checked recipe: a model, or a :class:`WideAccumulator` for
    ``"fp64"`` and for the wide recipes on numpy's BLAS (any name but the BF16 tensor core)."""
    if isinstance(a, str) and (a == "fp64" or (not fp8 and a not in BF16_ACCUMULATORS)):
        return WideAccumulator(a)
    return a
