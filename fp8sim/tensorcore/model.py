"""The accumulator model: one tensor-core accumulation datapath as a frozen dataclass of parameters.

:class:`AccumulatorModel` holds the parameters by name (checked, as a user writes them);
:func:`model_params` turns a model into :class:`ModelParams`, the plain numbers the bit-level
kernels read.  The kinds of datapath (:data:`KINDS`) are the one place where a model chooses its
arithmetic kernel (see :mod:`fp8sim.tensorcore.registry` for adding one).
"""

from __future__ import annotations

import operator
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

import numpy as np

from .._names import unknown_name_error
from ..rounding import RoundMode, round_mode

__all__ = [
    "AccumulatorModel",
    "ModelParams",
    "model_params",
    "mark_block_scaled",
    "instruction_order",
    "K_INSTR",
    "KINDS",
    "FUSED",
    "EXACT",
    "FP32",
    "INTERLEAVED",
    "OVERFLOWS",
    "OUTPUTS",
    "ALIGN_ROUNDINGS",
    "OUT_ROUNDINGS",
]

K_INSTR = 32  # products per FP8 MMA instruction (m*n*k32 shapes)

#: kind name -> the kernels' kind number (the arithmetic of one instruction)
KINDS = {"fused": 0, "exact": 1, "fp32": 2, "interleaved": 3}
FUSED, EXACT, FP32, INTERLEAVED = KINDS["fused"], KINDS["exact"], KINDS["fp32"], KINDS["interleaved"]

#: what an overflowing result becomes: "ieee" (inf, or the largest finite value where the rounding
#: mode points toward zero) or "inf" (always inf: the significand is rounded, the exponent overflows)
OVERFLOWS = ("ieee", "inf")

#: output format -> (fraction bits, emin, emax)
OUTPUTS = {"f32": (23, -126, 127), "f16": (10, -14, 15)}

#: the rounding modes of the aligned addends and of the output (any name or alias of them is accepted)
ALIGN_ROUNDINGS = (RoundMode.RTZ, RoundMode.RDN)
OUT_ROUNDINGS = (RoundMode.RTZ, RoundMode.RNE, RoundMode.RDN, RoundMode.RUP)

# the spelling a model stores (PTX's names, as the presets always printed them)
_SPELLING = {RoundMode.RTZ: "rz", RoundMode.RNE: "rne", RoundMode.RDN: "rd", RoundMode.RUP: "ru"}


def _int_field(key: str, value: Any) -> int:
    """``value`` as a Python int; floats (even integral ones), bools and strings are refused."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{key} must be an integer, got the bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{key} must be an integer, got {value!r} ({type(value).__name__})") from None


@dataclass(frozen=True)
class AccumulatorModel:
    """Parameters of one tensor-core accumulation datapath.

    Parameters
    ----------
    name:
        Label used in reports.
    kind:
        ``"fused"`` (multi-term fused adder, parameters below), ``"exact"``
        (exact sum, one final fp32 RNE rounding per instruction) or
        ``"fp32"`` (fp32 RNE after every addition).
    block:
        Products summed by one fused addition (a divisor of ``instr_k``).  32 means the
        whole instruction is one fused sum; 16 means two chained halves
        (k = 0..15 first), as when FP8 is run on FP16 k16 hardware.
    frac_bits:
        Fraction bits kept below the largest exponent when aligning addends.
    align_rounding:
        Rounding of the aligned addends: ``"rz"`` (truncate the magnitude) or
        ``"rd"`` (truncate the two's-complement value, i.e. toward -inf).
        Any name of these :class:`~fp8sim.rounding.RoundMode` values is accepted
        (``"rtz"``, ``RoundMode.RTZ``, ``"floor"``, ...) and stored as ``"rz"``/``"rd"``.
    product_exponent:
        Exponent used for a product when finding the largest exponent:
        ``"nominal"`` = ea + eb (the significand product lies in [1, 4)),
        ``"normalized"`` = the product's true exponent.
    subnormal_exponent:
        Exponent of a subnormal input: ``"clamp"`` = the format's emin with a
        significand below 1 (the FP8 datapath), ``"normalize"`` = its true
        exponent (inputs first converted to a wider format, e.g. fp16).
    c_mode:
        ``"fused"``: C is one of the addends of the first block; ``"separate"``:
        C is added to the rounded product sum by an IEEE fp32 addition.
    out_frac_bits, out_rounding, output:
        The normalised sum is rounded to ``out_frac_bits`` fraction bits with
        ``out_rounding`` (``"rz"``, ``"rne"``, ``"rd"`` or ``"ru"``, or any other
        name of these modes) in the ``output`` format (``"f32"`` or ``"f16"``;
        subnormal results are quantised relative to the format's emin).
    zero_sign:
        Sign of an exactly zero result: ``"positive"`` (always +0) or
        ``"ieee"`` (-0 only when every addend is a negative zero).
    nan_bits:
        Bit pattern returned for a NaN result (fp32 pattern; for f16 output
        the fp32 pattern of the f16 NaN).
    validated:
        Whether the preset was checked against hardware captures.
    instr_k:
        Products per instruction (the k of the m*n*k shape): 32 for FP8, 64 for the block-scaled
        FP4 instructions, 16 for bf16/fp16, 8 for tf32.
    zero_exponent:
        Exponent a zero addend (a zero product, or C = 0) takes when the largest exponent is
        found (MMA-Sim's ``e_zero``); ``None``: zeros never set it.  It must lie below the
        output's emin (it is then a floor on the alignment exponent, since C is always an addend).
    group:
        Products summed exactly in consecutive groups of ``group`` before the alignment (the
        block-scaled FP4 instructions: 16); a group's exponent is its scale's exponent and a group
        is a zero addend only when all its products (or its scale) are zero.  1: no groups.
    overflow:
        ``"ieee"`` (a result beyond the output's range is inf, or the largest finite value where
        the rounding points toward zero) or ``"inf"`` (always inf).
    sum_frac_bits:
        For ``kind="interleaved"``: the fraction bits of the sum of the two lanes and C before the
        final rounding (CDNA3: 31).
    """

    name: str
    kind: str = "fused"
    block: int = 32
    frac_bits: int = 13
    align_rounding: str = "rz"
    product_exponent: str = "nominal"
    subnormal_exponent: str = "clamp"
    c_mode: str = "fused"
    out_frac_bits: int = 23
    out_rounding: str = "rz"
    output: str = "f32"
    zero_sign: str = "positive"
    k_order: tuple | None = None
    nan_bits: int = 0x7FFFFFFF
    validated: bool = False
    description: str = field(default="", compare=False)
    instr_k: int = K_INSTR
    zero_exponent: int | None = None
    group: int = 1
    overflow: str = "ieee"
    sum_frac_bits: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"name must be a string, got {type(self.name).__name__}")
        self._check_name("kind", list(KINDS))
        instr_k = _int_field("instr_k", self.instr_k)
        if not 1 <= instr_k <= 256:
            raise ValueError(f"instr_k must be an integer in 1..256 (products per instruction), got {self.instr_k!r}")
        block = _int_field("block", self.block)
        if block < 1 or instr_k % block:
            if instr_k == K_INSTR:
                raise ValueError(f"block must be a divisor of {K_INSTR} (1, 2, 4, 8, 16 or 32), got {self.block!r}")
            raise ValueError(f"block must be a divisor of instr_k = {instr_k}, got {self.block!r}")
        group = _int_field("group", self.group)
        if group < 1 or block % group:
            raise ValueError(f"group must be a divisor of block = {block}, got {self.group!r}")
        frac_bits = _int_field("frac_bits", self.frac_bits)
        if not 0 <= frac_bits <= 40:
            raise ValueError(f"frac_bits must be an integer in 0..40, got {self.frac_bits!r}")
        align_rounding = self._rounding("align_rounding", ALIGN_ROUNDINGS)
        out_rounding = self._rounding("out_rounding", OUT_ROUNDINGS)
        self._check_name("output", list(OUTPUTS))
        out_frac_bits = _int_field("out_frac_bits", self.out_frac_bits)
        top = OUTPUTS[self.output][0]
        if not 0 <= out_frac_bits <= top:
            raise ValueError(
                f"out_frac_bits must be an integer in 0..{top} for output {self.output!r}, got {self.out_frac_bits!r}"
            )
        self._check_name("product_exponent", ["nominal", "normalized"])
        self._check_name("subnormal_exponent", ["clamp", "normalize", "fp16"])
        ko = None
        if self.k_order is not None:
            if isinstance(self.k_order, (str, bytes)) or not hasattr(self.k_order, "__iter__"):
                raise TypeError(f"k_order must be a sequence of {K_INSTR} integers or None, got {self.k_order!r}")
            items = list(self.k_order)
            if any(isinstance(k, (bool, np.bool_)) for k in items):
                raise TypeError(f"k_order must hold integers, got {self.k_order!r}")
            try:
                ko = tuple(operator.index(k) for k in items)
            except TypeError:
                raise TypeError(f"k_order must hold integers, got {self.k_order!r}") from None
            if sorted(ko) != list(range(instr_k)):
                raise ValueError(f"k_order must be a permutation of 0..{instr_k - 1}, got {self.k_order!r}")
        self._check_name("c_mode", ["fused", "separate"])
        self._check_name("zero_sign", ["positive", "ieee"])
        nan_bits = _int_field("nan_bits", self.nan_bits)
        if not (0 <= nan_bits < 2**32 and (nan_bits >> 23) & 0xFF == 0xFF and nan_bits & 0x7FFFFF):
            raise ValueError(
                f"nan_bits must be the bit pattern of a float32 NaN (exponent bits all ones, mantissa not 0, "
                f"e.g. 0x7fffffff), got {self.nan_bits!r}" + (f" = 0x{nan_bits:08x}" if 0 <= nan_bits < 2**32 else "")
            )
        zero_exponent = self.zero_exponent
        if zero_exponent is not None:
            zero_exponent = _int_field("zero_exponent", zero_exponent)
            if zero_exponent >= OUTPUTS[self.output][1]:
                raise ValueError(
                    f"zero_exponent must lie below the emin of output {self.output!r} "
                    f"({OUTPUTS[self.output][1]}), got {self.zero_exponent!r}"
                )
        self._check_name("overflow", list(OVERFLOWS))
        sum_frac_bits = self.sum_frac_bits
        if sum_frac_bits is not None:
            sum_frac_bits = _int_field("sum_frac_bits", sum_frac_bits)
            if not 0 <= sum_frac_bits <= 40:
                raise ValueError(f"sum_frac_bits must be None or an integer in 0..40, got {self.sum_frac_bits!r}")
        if self.kind == "interleaved" and sum_frac_bits is None:
            raise ValueError("kind='interleaved' needs sum_frac_bits (the bits of the lane sum plus C)")
        if not isinstance(self.validated, (bool, np.bool_)):
            raise TypeError(f"validated must be True or False, got {self.validated!r}")
        if not isinstance(self.description, str):
            raise TypeError(f"description must be a string, got {type(self.description).__name__}")
        # store plain Python values (numpy integers are accepted, and compare equal) and one
        # spelling per rounding mode
        for key, value in (
            ("block", block),
            ("frac_bits", frac_bits),
            ("align_rounding", align_rounding),
            ("out_frac_bits", out_frac_bits),
            ("out_rounding", out_rounding),
            ("nan_bits", nan_bits),
            ("k_order", ko),
            ("validated", bool(self.validated)),
            ("instr_k", instr_k),
            ("group", group),
            ("zero_exponent", zero_exponent),
            ("sum_frac_bits", sum_frac_bits),
        ):
            object.__setattr__(self, key, value)

    def _check_name(self, key: str, known: list[str]) -> None:
        value = getattr(self, key)
        if not isinstance(value, str):
            raise TypeError(f"{key} must be one of {known}, got {value!r} ({type(value).__name__})")
        if value not in known:
            raise unknown_name_error(f"{key}", value, known, where="AccumulatorModel")

    def _rounding(self, key: str, allowed: tuple[RoundMode, ...]) -> str:
        """The stored spelling of the rounding mode named by field ``key`` (one of ``allowed``)."""
        value = getattr(self, key)
        if not isinstance(value, (str, RoundMode)):
            known = [_SPELLING[m] for m in allowed]
            raise TypeError(f"{key} must be one of {known} (or a RoundMode), got {value!r} ({type(value).__name__})")
        return _SPELLING[round_mode(value, allowed, what=key)]

    @property
    def block_scaled(self) -> bool:
        """True for the model of a block-scaled MMA (``kind::mxf8f6f4``, ``kind::mxf4``,
        ``kind::mxf4nvf4``): an instruction of :data:`fp8sim.tensorcore.archs.ROWS` that takes
        scales, so that the scales are folded into the instruction rather than applied at
        promotion.  Decided by the parameters (a model equal to such an instruction's is one)."""
        return self in _block_scaled_models()

    def summary(self) -> dict:
        return asdict(self)


class ModelParams(NamedTuple):
    """An accumulator model as the bit-level kernels see it: plain integers (a numba-typed tuple).

    Flags are 0/1; the rounding fields are :class:`~fp8sim.rounding.RoundMode` numbers.
    """

    kind: int  #: :data:`KINDS` number
    block: int
    frac_bits: int
    align_rounding: int  #: RTZ or RDN
    normalized_products: int  #: 1 for product_exponent="normalized"
    separate_c: int  #: 1 for c_mode="separate"
    out_frac_bits: int
    out_rounding: int  #: RTZ, RNE, RDN or RUP
    out_emin: int
    out_emax: int
    ieee_zero: int  #: 1 for zero_sign="ieee"


#: the models of the instructions that take block scales (filled by :mod:`fp8sim.tensorcore.archs`
#: from its rows with scales, through :func:`mark_block_scaled`)
_BLOCK_SCALED: set[AccumulatorModel] = set()


def mark_block_scaled(model: AccumulatorModel) -> None:
    """Record ``model`` as the model of a block-scaled MMA (:attr:`AccumulatorModel.block_scaled`)."""
    _BLOCK_SCALED.add(model)


def _block_scaled_models() -> set[AccumulatorModel]:
    return _BLOCK_SCALED


def model_params(model: AccumulatorModel) -> ModelParams:
    """The :class:`ModelParams` of ``model``."""
    _, out_emin, out_emax = OUTPUTS[model.output]
    return ModelParams(
        KINDS[model.kind],
        model.block,
        model.frac_bits,
        int(round_mode(model.align_rounding, ALIGN_ROUNDINGS)),
        0 if model.product_exponent == "nominal" else 1,
        0 if model.c_mode == "fused" else 1,
        model.out_frac_bits,
        int(round_mode(model.out_rounding, OUT_ROUNDINGS)),
        out_emin,
        out_emax,
        0 if model.zero_sign == "positive" else 1,
    )


def instruction_order(model: AccumulatorModel) -> np.ndarray:
    """The order in which one instruction takes its ``instr_k`` products (int64 indices)."""
    return np.array(model.k_order if model.k_order is not None else range(model.instr_k), dtype=np.int64)
