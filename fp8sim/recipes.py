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

Named presets: :data:`PRESETS`, looked up with :func:`recipe` (the presets beyond Hopper, issue 16,
are made in :mod:`fp8sim.recipes_blackwell`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ._names import unknown_name_error
from .formats import CATALOGUE, Format, format_names
from .formats import format as _get_format

__all__ = [
    "Recipe",
    "recipe",
    "recipe_names",
    "PRESETS",
    "accumulator_names",
    "arch_accumulator_names",
    "is_block_scaled",
    "is_int",
    "BF16_ACCUMULATORS",
]

WIDE_FORMATS = ("bf16", "fp32", "fp64")
OUTPUT_FORMATS = ("bf16", "fp32", "fp64")
SCALE_ATS = ("promotion", "epilogue")
SCALE_APPLICATIONS = ("fma", "mul-add")
EPILOGUE_SCALES = ("alpha", "b-then-a", "a-then-b")
#: accumulator models of BF16 tensor-core instructions: only for bf16 x bf16 recipes
BF16_ACCUMULATORS = ("wgmma.bf16",)
SPLIT_ORDERS = ("sequential", "reverse", "pairwise")
_MMA_K = 32  # K of one FP8 MMA instruction: scale blocks along K are multiples of it


def is_int(v) -> bool:
    """True for a Python or numpy integer that is not a boolean (``True`` is not a count)."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def accumulator_names() -> list[str]:
    """The accumulator names a recipe takes: the sm90 presets of :mod:`fp8sim.tensorcore` and
    ``"fp64"`` (exact float64 products and sums)."""
    from .tensorcore import model_names

    return [instruction for arch, instruction in model_names() if arch == "sm90"] + ["fp64"]


def arch_accumulator_names() -> list[str]:
    """The accumulators of the other architectures, spelled ``"arch:key"``
    (``"sm100:tcgen05.mma.kind::f8f6f4"``, ``"cdna3:mfma"``, ...): every registry preset of
    :mod:`fp8sim.tensorcore` beyond sm90 ("matches MMA-Sim", not validated on hardware here)."""
    from .tensorcore import model_names

    return [f"{arch}:{instruction}" for arch, instruction in model_names() if arch not in ("sm90", "any")]


def is_block_scaled(accumulator) -> bool:
    """Whether an accumulator name is a block-scaled MMA (``kind::mxf8f6f4``, ``kind::mxf4``,
    ``kind::mxf4nvf4``): the scales are folded into the instruction, not applied at promotion."""
    return isinstance(accumulator, str) and "kind::mxf" in accumulator


#: element formats of the block-scaled MMAs (FP8, FP6, FP4)
BLOCK_SCALED_FORMATS = ("e4m3", "e5m2", "e3m2", "e2m3", "e2m1")


def _operand_format(v, who: str, which: str, narrow: bool = False):
    """A wide format name ("bf16", "fp32", "fp64"), or the 8-bit format of an FP8 operand: its
    catalogue name when it is the catalogue's format of that name, else the Format itself."""
    if isinstance(v, str) and v.strip().lower() in WIDE_FORMATS:
        return v.strip().lower()
    if isinstance(v, str):
        try:
            f = _get_format(v)
        except ValueError:
            raise unknown_name_error(
                "format",
                v,
                list(WIDE_FORMATS) + [n for n in format_names() if n not in WIDE_FORMATS],
                where=f"{who}: {which}",
            ) from None
    elif isinstance(v, Format):
        f = v
    else:
        raise TypeError(f"{who}: {which} must be a format name or an fp8sim.Format, got {type(v).__name__}")
    for wide in ("bf16", "fp32"):
        if f == CATALOGUE[wide]:
            return wide
    if narrow and f.name in BLOCK_SCALED_FORMATS and CATALOGUE.get(f.name) == f:
        return f.name
    if f.bits != 8 or not f.fits_float32 or not f.signed or not f.subnormals:
        why = (
            f"{f.bits} bits"
            if f.bits != 8
            else ("unsigned" if not f.signed else ("no zero" if not f.subnormals else "values beyond float32"))
        )
        raise ValueError(
            f"{who}: {which} {f.name!r} ({why}) cannot be a GEMM operand: the FP8 GEMM multiplies "
            f"8-bit codes of a signed format with zero on the tensor-core model (e.g. e4m3, e5m2, "
            f"e4m3fnuz, e5m2fnuz, e3m4 or a custom 8-bit fp8sim.Format), and the wide recipes take "
            f"{', '.join(WIDE_FORMATS)}"
        )
    return f.name if CATALOGUE.get(f.name) == f else f


def _k_block(g, who: str, which: str) -> int | None:
    """The extent along K of one scale block of the recipe granularity ``g`` (spelled for an
    operand whose last axis is K), None for one block over all of K."""
    from .scaling import NVFP4, DelayedScaling, Group, PerColumn, PerRow, PerTensor, Tile

    if isinstance(g, NVFP4):
        raise ValueError(
            f"{who}: {which} {g.name}: two-level (NVFP4) scales are not supported by the FP8 GEMM "
            "(use 'mx32', 'g128', '1x128', 'tensor', ...)"
        )
    if isinstance(g, (PerTensor, PerRow, DelayedScaling)):
        return None
    if isinstance(g, Tile):
        return g.cols
    if isinstance(g, Group):
        if g.axis in (-1, 1):
            return g.size
        raise ValueError(
            f"{who}: {which} {g.name} runs along axis {g.axis}; a recipe granularity is spelled for "
            f"an operand whose last axis is K (x (M, K), w (N, K)), so groups run along axis -1"
        )
    if isinstance(g, PerColumn):
        raise ValueError(
            f"{who}: {which} 'col' gives every K element its own scale, which a GEMM cannot apply "
            "(recipe granularities are spelled for an operand whose last axis is K: x (M, K), "
            "w (N, K); 'row' is one scale per token / output channel)"
        )
    raise TypeError(f"{who}: {which} {g!r} is not a granularity the GEMM knows")


@dataclass(frozen=True)
class Recipe:
    """One GEMM recipe (frozen; derive variants with :func:`dataclasses.replace` or :meth:`with_`).

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
    x_format: str | Format = "e4m3"
    w_format: str | Format = "e4m3"
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
    epilogue_scale: str = "alpha"
    split_k: int = 1
    split_granule: int = 128
    split_order: str = "sequential"
    grad_format: str | Format | None = None
    backward_promote_every: int | None = None
    weight_2d_blocks: bool = False
    wgrad_rht: bool = False
    rht_seed: int | None = None
    grad_rounding: str = "rne"
    validated: bool = False
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise TypeError(f"Recipe: name must be a non-empty string, got {self.name!r}")
        who = f"Recipe {self.name!r}"
        block = is_block_scaled(self.accumulator)
        for which in ("x_format", "w_format"):
            object.__setattr__(self, which, _operand_format(getattr(self, which), who, which, narrow=block))
        if (self.x_format in WIDE_FORMATS) != (self.w_format in WIDE_FORMATS):
            raise ValueError(
                f"{who}: both operands must be FP8 or both wide, got {_fmt_name(self.x_format)!r} and "
                f"{_fmt_name(self.w_format)!r}"
            )
        object.__setattr__(self, "output_format", _choice(self.output_format, OUTPUT_FORMATS, who, "output_format"))
        self._check_accumulator(who)
        if self.split_k > 1 and not self.is_fp8 and self.accumulator not in BF16_ACCUMULATORS:
            raise ValueError(
                f"{who}: split_k={self.split_k} needs a tensor-core accumulator; the wide recipes on "
                f"numpy's BLAS ({self.accumulator!r}) have no K slices (use accumulator='wgmma.bf16')"
            )
        if self.accumulator in BF16_ACCUMULATORS and (self.x_format, self.w_format) != ("bf16", "bf16"):
            raise ValueError(
                f"{who}: accumulator {self.accumulator!r} is the BF16 tensor-core datapath: it needs bf16 "
                f"operands, got {_fmt_name(self.x_format)!r} x {_fmt_name(self.w_format)!r}"
            )
        object.__setattr__(self, "promote_every", _promotion(self.promote_every, who, "promote_every"))
        object.__setattr__(
            self, "backward_promote_every", _promotion(self.backward_promote_every, who, "backward_promote_every")
        )
        object.__setattr__(self, "scale_at", _choice(self.scale_at, SCALE_ATS, who, "scale_at"))
        object.__setattr__(
            self, "scale_application", _choice(self.scale_application, SCALE_APPLICATIONS, who, "scale_application")
        )
        object.__setattr__(self, "epilogue_scale", _choice(self.epilogue_scale, EPILOGUE_SCALES, who, "epilogue_scale"))
        object.__setattr__(self, "split_order", _choice(self.split_order, SPLIT_ORDERS, who, "split_order"))
        for which, lo in (("split_k", 1), ("split_granule", _MMA_K)):
            v = getattr(self, which)
            if not is_int(v) or v < lo:
                raise ValueError(f"{who}: {which} must be an int >= {lo}, got {v!r}")
            object.__setattr__(self, which, int(v))
        if self.split_granule % _MMA_K:
            raise ValueError(f"{who}: split_granule must be a multiple of {_MMA_K} (one MMA), got {self.split_granule}")
        if self.split_k > 1 and self.promote_every is not None and self.split_granule % self.promote_every:
            raise ValueError(
                f"{who}: split_granule ({self.split_granule}) must be a multiple of promote_every "
                f"({self.promote_every}): a slice holds whole promotion intervals"
            )
        if not is_int(self.margin):
            raise TypeError(f"{who}: margin must be an int (a number of binades of headroom), got {self.margin!r}")
        if not isinstance(self.validated, bool):
            raise TypeError(f"{who}: validated must be True or False, got {self.validated!r}")
        if not isinstance(self.description, str):
            raise TypeError(f"{who}: description must be a string, got {type(self.description).__name__}")
        if self.grad_format is not None:
            g = _operand_format(self.grad_format, who, "grad_format")
            if g in WIDE_FORMATS:
                raise ValueError(f"{who}: grad_format must be None or an 8-bit format (e.g. 'e5m2'), got {g!r}")
            object.__setattr__(self, "grad_format", g)
        if block:
            self._check_block_scaled(who)
        else:
            self._check_scaling(who)
        self._check_training(who)
        if self.grad_format is not None:
            self.backward()  # the backward recipe must be valid too (raises here, not in training)

    def _check_accumulator(self, who: str) -> None:
        from .tensorcore import AccumulatorModel

        a = self.accumulator
        if isinstance(a, AccumulatorModel):
            return
        known = tuple(accumulator_names()) + tuple(arch_accumulator_names())
        if not isinstance(a, str):
            raise TypeError(
                f"{who}: accumulator must be one of {list(known)} or an AccumulatorModel, got {type(a).__name__}"
            )
        object.__setattr__(self, "accumulator", _choice(a, known, who, "accumulator"))

    def _check_scaling(self, who: str) -> None:
        """Granularities and scale policy, as quantize and the GEMM kernel will need them."""
        from .scaling import granularity as _granularity
        from .scaling import scale_policy

        grans = {}
        for which in ("x_granularity", "w_granularity"):
            v = getattr(self, which)
            try:
                grans[which] = _granularity(v)
            except (TypeError, ValueError) as e:
                raise type(e)(f"{who}: {which}: {e}") from None
        if not self.is_fp8:
            return
        if self.scale_at == "promotion" and self.promote_every is None:
            raise ValueError(f"{who}: scale_at='promotion' needs promote_every")
        blocks = {}
        for which, fmt in (("x_granularity", self.x_format), ("w_granularity", self.w_format)):
            g = grans[which]
            try:
                scale_policy(g, _get_format(fmt), self.scale_format, self.scale_rounding, self.margin)
            except (TypeError, ValueError) as e:
                raise type(e)(f"{who}: {which} {g.name}: {e}") from None
            b = _k_block(g, who, which)
            if b is not None:
                blocks[which] = b
        for which, b in blocks.items():
            if b % _MMA_K:
                raise ValueError(
                    f"{who}: {which} has scale blocks of {b} along K; the GEMM applies scales per "
                    f"K block, which must be a multiple of {_MMA_K} (one MMA instruction)"
                )
        if len(blocks) == 2:
            bx, bw = blocks["x_granularity"], blocks["w_granularity"]
            if max(bx, bw) % min(bx, bw):
                raise ValueError(f"{who}: scale blocks along K of {bx} (x) and {bw} (w) do not nest")
        if self.scale_at == "epilogue" and blocks:
            raise ValueError(
                f"{who}: scale_at='epilogue' needs one scale over all of K per row/column "
                f"(tensor, row or delayed), got {', '.join(f'{k}={getattr(self, k)!r}' for k in blocks)}"
            )
        if self.scale_at == "promotion" and blocks:
            kb = min(blocks.values())
            assert self.promote_every is not None
            if kb % self.promote_every:
                raise ValueError(
                    f"{who}: promote_every={self.promote_every} must divide the K scale block ({kb}): "
                    "scales applied at promotion change only between promotion intervals"
                )
        if blocks and self.split_k > 1 and self.split_granule % max(blocks.values()):
            raise ValueError(
                f"{who}: split_granule ({self.split_granule}) must be a multiple of the K scale "
                f"blocks ({', '.join(map(str, sorted(set(blocks.values()))))}): slices start on block boundaries"
            )

    def _check_block_scaled(self, who: str) -> None:
        """A recipe on a block-scaled MMA: MX (UE8M0 per 32) or NVFP4 (UE4M3 per 16) granularities
        that the instruction takes, formats it multiplies, no promotion, no split-K."""
        from .scaling import NVFP4, Group
        from .scaling import granularity as _granularity
        from .tensorcore import archs, get_model

        assert isinstance(self.accumulator, str)
        arch, _, key = self.accumulator.partition(":")
        row = next(r for r in archs.ROWS if (r.arch, r.key) == (arch, key))
        takes = {("ue8m0" if s == "e8m0" else s, b) for s, b in row.scales}
        for which in ("x_granularity", "w_granularity"):
            try:
                g = _granularity(getattr(self, which))
            except (TypeError, ValueError) as e:
                raise type(e)(f"{who}: {which}: {e}") from None
            if isinstance(g, NVFP4):
                sc = ("ue4m3", g.size)
            elif isinstance(g, Group) and g.name.startswith("mx"):
                sc = ("ue8m0", g.size)
            else:
                sc = None
            if sc is None or sc not in takes or getattr(g, "axis", None) not in (-1, 1):
                raise ValueError(
                    f"{who}: {which} {g.name!r}: accumulator {self.accumulator!r} folds block scales into the "
                    f"MMA and takes {', '.join(f'{s} per {b}' for s, b in sorted(takes))} along K "
                    "(granularity 'mx32', 'mx16' or 'nvfp4')"
                )
        for which in ("x_format", "w_format"):
            if getattr(self, which) not in row.formats:
                raise ValueError(
                    f"{who}: {which} {_fmt_name(getattr(self, which))!r}: accumulator {self.accumulator!r} "
                    f"multiplies {', '.join(row.formats)}"
                )
        if self.promote_every is not None or self.split_k != 1 or self.scale_at != "epilogue":
            raise ValueError(
                f"{who}: accumulator {self.accumulator!r} accumulates over all of K with the scales inside "
                "the MMA: it needs promote_every=None, split_k=1 and scale_at='epilogue' (where an NVFP4 "
                "tensor scale is applied)"
            )
        get_model(self.accumulator)  # type: ignore[arg-type]

    def _check_training(self, who: str) -> None:
        """The training options: NVFP4 2D weight blocks, the Wgrad random Hadamard transform and the
        gradients' rounding (TransformerEngine's NVFP4BlockScaling techniques)."""
        from .rounding import RoundMode, round_mode
        from .scaling import NVFP4
        from .scaling import granularity as _granularity

        for which in ("weight_2d_blocks", "wgrad_rht"):
            if not isinstance(getattr(self, which), bool):
                raise TypeError(f"{who}: {which} must be True or False, got {getattr(self, which)!r}")
        if self.rht_seed is not None and not is_int(self.rht_seed):
            raise TypeError(
                f"{who}: rht_seed must be None (TransformerEngine's fixed signs) or an int, got {self.rht_seed!r}"
            )
        if self.rht_seed is not None:
            object.__setattr__(self, "rht_seed", int(self.rht_seed))
        try:
            m = round_mode(self.grad_rounding, allowed=(RoundMode.RNE, RoundMode.SR), what="grad_rounding")
        except (TypeError, ValueError) as e:
            raise type(e)(f"{who}: {e}") from None
        object.__setattr__(self, "grad_rounding", m.label)
        if not self.is_fp8 and (self.weight_2d_blocks or self.wgrad_rht or self.grad_rounding != "rne"):
            raise ValueError(
                f"{who}: weight_2d_blocks, wgrad_rht and grad_rounding='sr' apply to quantized operands; "
                f"{_fmt_name(self.x_format)!r} operands are not quantized"
            )
        if self.weight_2d_blocks and not (self.block_scaled and isinstance(_granularity(self.w_granularity), NVFP4)):
            raise ValueError(
                f"{who}: weight_2d_blocks (one E4M3 scale per 16x16 weight block) needs an NVFP4 recipe: "
                f"w_granularity 'nvfp4' on a block-scaled accumulator, got {self.w_granularity!r} on "
                f"{self.accumulator!r}"
            )

    @property
    def block_scaled(self) -> bool:
        """True for a recipe whose scales are folded into a block-scaled MMA (run by
        :func:`fp8sim.tensorcore.block_gemm.block_scaled_gemm`)."""
        return is_block_scaled(self.accumulator)

    @property
    def is_fp8(self) -> bool:
        """True for the quantized (8-bit operand) recipes, False for bf16 / fp32 / fp64."""
        return self.x_format not in WIDE_FORMATS

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
            grad_format=None,
            backward_promote_every=None,
        )


def _fmt_name(f) -> str:
    return f if isinstance(f, str) else f.name


def _choice(v, known: tuple, who: str, which: str) -> str:
    if not isinstance(v, str):
        raise TypeError(f"{who}: {which} must be one of {list(known)}, got {type(v).__name__} {v!r}")
    key = v.strip().lower()
    if key not in known:
        raise unknown_name_error(which, v, known, where=who)
    return key


def _promotion(p, who: str, which: str) -> int | None:
    if p is None:
        return None
    if not is_int(p) or p <= 0 or p % _MMA_K:
        raise ValueError(f"{who}: {which} must be None or a positive int multiple of {_MMA_K} (K elements), got {p!r}")
    return int(p)


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
# ---- library configurations (docs/libraries.md; captures in tests/data/libraries_sm90.npz)
_CUBLASLT = "torch 2.11 torch._scaled_mm -> cuBLASLt 13.1 (130100) on H200"
_TRITON = "Triton 3.6 tl.dot on H200 (sm_90)"


def _library(name: str, x_gran: str, w_gran: str, promote_every, description: str, **fields) -> None:
    """A validated library preset: E4M3 operands with fp32 scales on the wgmma accumulator, scales
    in the epilogue unless ``fields`` say otherwise."""
    kw: dict[str, Any] = dict(scale_format="fp32", accumulator="wgmma", scale_at="epilogue", output_format="bf16")
    kw.update(fields)
    _add(
        Recipe(
            name,
            "e4m3",
            "e4m3",
            x_gran,
            w_gran,
            promote_every=promote_every,
            validated=True,
            description=description,
            **kw,
        )
    )


for _fast in (False, True):
    _sfx = "-fast" if _fast else ""
    _prom = None if _fast else 128
    _acc = (
        "use_fast_accum=True: the wgmma accumulator runs over all of K (of each split-K slice)"
        if _fast
        else "use_fast_accum=False: the wgmma partial is added into fp32 every 128 K (plain fp32 add)"
    )
    _library(
        "cublaslt-tensor" + _sfx,
        "tensor",
        "tensor",
        _prom,
        f"{_CUBLASLT}, tensorwise fp32 scales; {_acc}; epilogue fp32(fp32(sa*sb) * acc), "
        "then the output cast (RNE). Split-K (split_k) is the library's choice per shape: see docs",
        epilogue_scale="alpha",
    )
    _library(
        "cublaslt-row" + _sfx,
        "row",
        "row",
        _prom,
        f"{_CUBLASLT}, rowwise (M,1) x (1,N) fp32 scales (outer-vector scaling); {_acc}; "
        "epilogue fp32(fp32(acc * sb[j]) * sa[i]), then the output cast (RNE)",
        epilogue_scale="b-then-a",
    )
_library(
    "cublaslt-block",
    "1x128",
    "128x128",
    128,
    f"{_CUBLASLT}, blockwise 1x128 activations x 128x128 weights (fast accumulation refused "
    "by torch): every 128 K the wgmma partial p joins fp32 as fma(fp32(sa*sb), p, acc) -- DeepSeek-V3's "
    "arithmetic; split-K per shape (see docs). The 128x128 scale tensor must be padded to a multiple of 4 "
    "blocks along K (docs/libraries.md)",
    scale_at="promotion",
    scale_application="fma",
    split_granule=512,
)
_library(
    "triton",
    "row",
    "row",
    None,
    f"{_TRITON}: acc = tl.dot(a, b, acc) with the default max_num_imprecise_acc (2**30 on "
    "sm_90): the wgmma accumulator runs over all of K for any BLOCK_K; epilogue acc * sa * sb "
    "(as gpu/capture_libraries.py writes it; a kernel's own epilogue order is its own)",
    epilogue_scale="a-then-b",
    output_format="fp32",
)
for _imp in (32, 64, 128):
    _library(
        f"triton-imprecise-{_imp}",
        "row",
        "row",
        _imp,
        f"{_TRITON}: tl.dot(..., max_num_imprecise_acc={_imp}): the wgmma partial is added "
        f"into the fp32 accumulator every {_imp} K (BLOCK_K >= {_imp}); epilogue acc * sa * sb",
        epilogue_scale="a-then-b",
        output_format="fp32",
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
        description="BF16 inputs, fp32 accumulation by numpy's float32 BLAS (the fast baseline: its order "
        "and rounding are not any GPU's; 'bf16-cublaslt' is the H200's), bf16 output",
    )
)
_add(
    Recipe(
        "bf16-cublaslt",
        "bf16",
        "bf16",
        "tensor",
        "tensor",
        accumulator="wgmma.bf16",
        promote_every=None,
        scale_at="epilogue",
        output_format="bf16",
        split_granule=64,
        validated=True,
        description="torch 2.11 BF16 matmul -> cuBLASLt 13.1 on H200: wgmma m64nNk16 chained along K (C and "
        "16 exact products in one fused sum, 25 fraction bits, truncation, fp32 truncation), split-K "
        "slices of ceil(ceil(K/64)/S)*64 summed in fp32 (S is the library's choice per shape), bf16 RNE",
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


# ---- beyond Hopper (issue 16): emulated on the MMA-Sim models, made in their own module
from .recipes_blackwell import PRESETS_BEYOND_HOPPER  # noqa: E402  (data only: no import cycle)

for _fields in PRESETS_BEYOND_HOPPER:
    _add(Recipe(**_fields))
