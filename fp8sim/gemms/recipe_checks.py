"""The checks of a :class:`~fp8sim.gemms.recipes.Recipe`, on its flat fields: every field is checked
when a recipe is made, so a recipe that exists can run (the messages name the recipe and field)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._names import unknown_name_error
from ..formats import CATALOGUE, Format, format_names
from ..formats import format as _get_format

__all__ = [
    "check_fields",
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
    from ..tensorcore import model_names

    return [instruction for arch, instruction in model_names() if arch == "sm90"] + ["fp64"]


def arch_accumulator_names() -> list[str]:
    """The accumulators of the other architectures, spelled ``"arch:key"``
    (``"sm100:tcgen05.mma.kind::f8f6f4"``, ``"cdna3:mfma"``, ...): every registry preset of
    :mod:`fp8sim.tensorcore` beyond sm90 ("matches MMA-Sim", not validated on hardware here)."""
    from ..tensorcore import model_names

    return [f"{arch}:{instruction}" for arch, instruction in model_names() if arch not in ("sm90", "any")]


def is_block_scaled(accumulator) -> bool:
    """Whether an accumulator (a name or an :class:`~fp8sim.tensorcore.AccumulatorModel`) is a
    block-scaled MMA (``kind::mxf8f6f4``, ``kind::mxf4``, ``kind::mxf4nvf4``): the scales are folded
    into the instruction, not applied at promotion (:attr:`AccumulatorModel.block_scaled`).  Unknown
    names are not."""
    return _block_scaled_accumulator(accumulator)


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
    operand whose last axis is K), None for one block over all of K: the granularity's own
    :meth:`~fp8sim.scaling.Granularity.k_block` (it raises for NVFP4, ``col`` and groups across K)."""
    return g.k_block(who, which)


class _Fields:
    """The flat fields of a recipe being checked (mutable while the checks normalize them)."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)
        self.parsed: dict[str, Any] = {}  # "x_granularity" -> its Granularity value, once parsed

    def __getattr__(self, k: str) -> Any:  # for mypy: the attributes are the flat fields
        raise AttributeError(k)

    def __setattr__(self, k: str, v: Any) -> None:
        self.__dict__[k] = v

    @property
    def is_fp8(self) -> bool:
        return self.x_format not in WIDE_FORMATS


def _block_scaled_accumulator(a: Any) -> bool:
    """Whether an accumulator (a name or a model) is a block-scaled MMA, without raising."""
    from ..tensorcore import AccumulatorModel, get_model

    if isinstance(a, AccumulatorModel):
        return a.block_scaled
    if not isinstance(a, str) or a.strip().lower() in ("fp64", "fp32"):
        return False
    try:
        return get_model(a).block_scaled
    except (TypeError, ValueError):
        return False


def check_fields(name: Any, values: dict[str, Any]) -> _Fields:
    """The checks of a recipe on its flat fields; returns them normalized."""
    if not isinstance(name, str) or not name.strip():
        raise TypeError(f"Recipe: name must be a non-empty string, got {name!r}")
    f = _Fields(values)
    who = f"Recipe {name!r}"
    block = _block_scaled_accumulator(f.accumulator)
    for which in ("x_format", "w_format"):
        setattr(f, which, _operand_format(getattr(f, which), who, which, narrow=block))
    if (f.x_format in WIDE_FORMATS) != (f.w_format in WIDE_FORMATS):
        raise ValueError(
            f"{who}: both operands must be FP8 or both wide, got {_fmt_name(f.x_format)!r} and "
            f"{_fmt_name(f.w_format)!r}"
        )
    f.output_format = _choice(f.output_format, OUTPUT_FORMATS, who, "output_format")
    _check_accumulator(f, who)
    if f.split_k > 1 and not f.is_fp8 and f.accumulator not in BF16_ACCUMULATORS:
        raise ValueError(
            f"{who}: split_k={f.split_k} needs a tensor-core accumulator; the wide recipes on "
            f"numpy's BLAS ({f.accumulator!r}) have no K slices (use accumulator='wgmma.bf16')"
        )
    if f.accumulator in BF16_ACCUMULATORS and (f.x_format, f.w_format) != ("bf16", "bf16"):
        raise ValueError(
            f"{who}: accumulator {f.accumulator!r} is the BF16 tensor-core datapath: it needs bf16 "
            f"operands, got {_fmt_name(f.x_format)!r} x {_fmt_name(f.w_format)!r}"
        )
    f.promote_every = _promotion(f.promote_every, who, "promote_every")
    f.backward_promote_every = _promotion(f.backward_promote_every, who, "backward_promote_every")
    f.scale_at = _choice(f.scale_at, SCALE_ATS, who, "scale_at")
    f.scale_application = _choice(f.scale_application, SCALE_APPLICATIONS, who, "scale_application")
    f.epilogue_scale = _choice(f.epilogue_scale, EPILOGUE_SCALES, who, "epilogue_scale")
    f.split_order = _choice(f.split_order, SPLIT_ORDERS, who, "split_order")
    for which, lo in (("split_k", 1), ("split_granule", _MMA_K)):
        v = getattr(f, which)
        if not is_int(v) or v < lo:
            raise ValueError(f"{who}: {which} must be an int >= {lo}, got {v!r}")
        setattr(f, which, int(v))
    if f.split_granule % _MMA_K:
        raise ValueError(f"{who}: split_granule must be a multiple of {_MMA_K} (one MMA), got {f.split_granule}")
    if f.split_k > 1 and f.promote_every is not None and f.split_granule % f.promote_every:
        raise ValueError(
            f"{who}: split_granule ({f.split_granule}) must be a multiple of promote_every "
            f"({f.promote_every}): a slice holds whole promotion intervals"
        )
    if not is_int(f.margin):
        raise TypeError(f"{who}: margin must be an int (a number of binades of headroom), got {f.margin!r}")
    if not isinstance(f.validated, bool):
        raise TypeError(f"{who}: validated must be True or False, got {f.validated!r}")
    if not isinstance(f.description, str):
        raise TypeError(f"{who}: description must be a string, got {type(f.description).__name__}")
    if f.grad_format is not None:
        g = _operand_format(f.grad_format, who, "grad_format")
        if g in WIDE_FORMATS:
            raise ValueError(f"{who}: grad_format must be None or an 8-bit format (e.g. 'e5m2'), got {g!r}")
        f.grad_format = g
    if block:
        _check_block_scaled(f, who)
    else:
        _check_scaling(f, who)
    _check_training(f, who, block)
    if f.grad_format is not None:  # the backward recipe must be valid too (raises here, not in training)
        p = f.backward_promote_every
        back = {k: v for k, v in f.__dict__.items() if k != "parsed"}
        back.update(
            x_format=f.grad_format,
            promote_every=p,
            scale_at="promotion" if (p is not None and f.scale_at == "promotion") else "epilogue",
            grad_format=None,
            backward_promote_every=None,
        )
        check_fields(name + ":backward", back)
    return f


def _check_accumulator(f: _Fields, who: str) -> None:
    from ..tensorcore import AccumulatorModel

    a = f.accumulator
    if isinstance(a, AccumulatorModel):
        return
    known = tuple(accumulator_names()) + tuple(arch_accumulator_names())
    if not isinstance(a, str):
        raise TypeError(
            f"{who}: accumulator must be one of {list(known)} or an AccumulatorModel, got {type(a).__name__}"
        )
    f.accumulator = _choice(a, known, who, "accumulator")


def _check_scaling(f: _Fields, who: str) -> None:
    """Granularities and scale policy, as quantize and the GEMM kernel will need them."""
    from ..scaling import granularity as _granularity
    from ..scaling.policy import scale_policy

    grans = {}
    for which in ("x_granularity", "w_granularity"):
        v = getattr(f, which)
        try:
            grans[which] = f.parsed[which] = _granularity(v)
        except (TypeError, ValueError) as e:
            raise type(e)(f"{who}: {which}: {e}") from None
    if not f.is_fp8:
        return
    if f.scale_at == "promotion" and f.promote_every is None:
        raise ValueError(f"{who}: scale_at='promotion' needs promote_every")
    blocks = {}
    for which, fmt in (("x_granularity", f.x_format), ("w_granularity", f.w_format)):
        g = grans[which]
        try:
            scale_policy(g, _get_format(fmt), f.scale_format, f.scale_rounding, f.margin)
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
    if f.scale_at == "epilogue" and blocks:
        raise ValueError(
            f"{who}: scale_at='epilogue' needs one scale over all of K per row/column "
            f"(tensor, row or delayed), got {', '.join(f'{k}={getattr(f, k)!r}' for k in blocks)}"
        )
    if f.scale_at == "promotion" and blocks:
        kb = min(blocks.values())
        assert f.promote_every is not None
        if kb % f.promote_every:
            raise ValueError(
                f"{who}: promote_every={f.promote_every} must divide the K scale block ({kb}): "
                "scales applied at promotion change only between promotion intervals"
            )
    if blocks and f.split_k > 1 and f.split_granule % max(blocks.values()):
        raise ValueError(
            f"{who}: split_granule ({f.split_granule}) must be a multiple of the K scale "
            f"blocks ({', '.join(map(str, sorted(set(blocks.values()))))}): slices start on block boundaries"
        )


def _check_block_scaled(f: _Fields, who: str) -> None:
    """A recipe on a block-scaled MMA: MX (UE8M0 per 32) or NVFP4 (UE4M3 per 16) granularities
    that the instruction takes, formats it multiplies, no promotion, no split-K."""
    from ..scaling import granularity as _granularity
    from ..tensorcore import archs, get_model

    if isinstance(f.accumulator, str):
        arch, _, key = f.accumulator.partition(":")
        rows = [r for r in archs.ROWS if (r.arch, r.key) == (arch, key)]
    else:  # a model object: the instructions with scales that it models
        rows = [r for r in archs.ROWS if r.scales and r.model == f.accumulator]
    takes = {("ue8m0" if s == "e8m0" else s, b) for r in rows for s, b in r.scales}
    formats = tuple(dict.fromkeys(x for r in rows for x in r.formats))
    for which in ("x_granularity", "w_granularity"):
        try:
            g = f.parsed[which] = _granularity(getattr(f, which))
        except (TypeError, ValueError) as e:
            raise type(e)(f"{who}: {which}: {e}") from None
        sc = g.mma_block_scale  # (scale format, block) along K, or None: not a block scale of an MMA
        if sc is None or sc not in takes:
            raise ValueError(
                f"{who}: {which} {g.name!r}: accumulator {f.accumulator!r} folds block scales into the "
                f"MMA and takes {', '.join(f'{s} per {b}' for s, b in sorted(takes))} along K "
                "(granularity 'mx32', 'mx16' or 'nvfp4')"
            )
    for which in ("x_format", "w_format"):
        if getattr(f, which) not in formats:
            raise ValueError(
                f"{who}: {which} {_fmt_name(getattr(f, which))!r}: accumulator {f.accumulator!r} "
                f"multiplies {', '.join(formats)}"
            )
    if f.promote_every is not None or f.split_k != 1 or f.scale_at != "epilogue":
        raise ValueError(
            f"{who}: accumulator {f.accumulator!r} accumulates over all of K with the scales inside "
            "the MMA: it needs promote_every=None, split_k=1 and scale_at='epilogue' (where an NVFP4 "
            "tensor scale is applied)"
        )
    get_model(f.accumulator)  # type: ignore[arg-type]


def _check_training(f: _Fields, who: str, block: bool) -> None:
    """The training options: NVFP4 2D weight blocks, the Wgrad random Hadamard transform and the
    gradients' rounding (TransformerEngine's NVFP4BlockScaling techniques)."""
    from ..rounding import RoundMode, round_mode
    from ..scaling import granularity as _granularity

    for which in ("weight_2d_blocks", "wgrad_rht"):
        if not isinstance(getattr(f, which), bool):
            raise TypeError(f"{who}: {which} must be True or False, got {getattr(f, which)!r}")
    if f.rht_seed is not None and not is_int(f.rht_seed):
        raise TypeError(f"{who}: rht_seed must be None (TransformerEngine's fixed signs) or an int, got {f.rht_seed!r}")
    if f.rht_seed is not None:
        f.rht_seed = int(f.rht_seed)
    try:
        m = round_mode(f.grad_rounding, allowed=(RoundMode.RNE, RoundMode.SR), what="grad_rounding")
    except (TypeError, ValueError) as e:
        raise type(e)(f"{who}: {e}") from None
    f.grad_rounding = m.label
    if not f.is_fp8 and (f.weight_2d_blocks or f.wgrad_rht or f.grad_rounding != "rne"):
        raise ValueError(
            f"{who}: weight_2d_blocks, wgrad_rht and grad_rounding='sr' apply to quantized operands; "
            f"{_fmt_name(f.x_format)!r} operands are not quantized"
        )
    if f.weight_2d_blocks and not (block and _granularity(f.w_granularity).two_level):
        raise ValueError(
            f"{who}: weight_2d_blocks (one E4M3 scale per 16x16 weight block) needs an NVFP4 recipe: "
            f"w_granularity 'nvfp4' on a block-scaled accumulator, got {f.w_granularity!r} on "
            f"{f.accumulator!r}"
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
