"""Floating-point formats as values.

A :class:`Format` is a small frozen dataclass that says how a binary
floating-point code is laid out (sign, exponent, mantissa bits, bias) and
which codes are special (infinities, NaN, subnormals).  Everything else --
the largest value, the smallest subnormal, epsilon, the number of codes --
is derived from those fields, with names that mirror :func:`numpy.finfo`.

The catalogue holds the OCP 8-bit formats (E4M3FN, E5M2), the AMD/Graphcore
"fnuz" variants, the OCP MX scale and sub-byte element formats (E8M0, E2M1,
E2M3, E3M2), E3M4, DeepSeek-V3's E5M6 and the usual wide formats (BF16,
FP16, TF32, FP32).  Look formats up with :func:`format` or use the module
constants (``E4M3``, ``E5M2``, ...).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property

import ml_dtypes
import numpy as np

from ._names import UnknownNameError, close_matches

__all__ = [
    "MAX_BITS",
    "UnknownNameError",
    "NanStyle",
    "Format",
    "format",
    "format_names",
    "E4M3",
    "E5M2",
    "E4M3FNUZ",
    "E5M2FNUZ",
    "E8M0",
    "E2M1",
    "E2M3",
    "E3M2",
    "E3M4",
    "E5M6",
    "BF16",
    "FP16",
    "TF32",
    "FP32",
    "CATALOGUE",
]


#: The widest format (sign included) the kernels support: codes are computed in int64.
MAX_BITS = 63


class NanStyle(str, enum.Enum):
    """How a format encodes NaN.

    * ``IEEE``: the all-ones exponent field is reserved.  With infinities,
      mantissa 0 is +-inf and every other mantissa is NaN; without
      infinities (E8M0) every code with that exponent is NaN.
    * ``OCP``: only S.1111.111 (all ones) is NaN; every other code of the
      top binade is a finite number (OCP E4M3FN).
    * ``FNUZ``: the single code 1000...0 ("negative zero") is NaN; there is
      no negative zero and no infinity.
    * ``NONE``: every code is a finite number (OCP FP4/FP6).
    """

    IEEE = "ieee"
    OCP = "ocp"
    FNUZ = "fnuz"
    NONE = "none"


@dataclass(frozen=True)
class Format:
    """A binary floating-point format.

    Parameters
    ----------
    name:
        Short name used in tables and error messages.
    ebits, mbits:
        Exponent and mantissa (trailing significand) field widths.
    bias:
        Exponent bias.
    signed:
        Whether there is a sign bit.
    inf:
        Whether +-inf are encodable (only meaningful with ``NanStyle.IEEE``).
    nan:
        How NaN is encoded, see :class:`NanStyle`.
    subnormals:
        If true, the zero exponent field encodes zero and subnormals
        ``0.m * 2**(1 - bias)``.  If false, the zero exponent field is an
        ordinary binade ``1.m * 2**(-bias)`` and the format has no zero
        (OCP E8M0).
    """

    name: str
    ebits: int
    mbits: int
    bias: int
    signed: bool = True
    inf: bool = False
    nan: NanStyle = NanStyle.IEEE
    subnormals: bool = True
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"Format name must be a non-empty str, got {self.name!r}")
        for fld, lo, hi in (("ebits", 1, 11), ("mbits", 0, 52), ("bias", None, None)):
            v = getattr(self, fld)
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
                raise TypeError(f"Format {self.name!r}: {fld} must be an int, got {v!r} ({type(v).__name__})")
            if lo is not None and hi is not None and not lo <= v <= hi:
                raise ValueError(f"Format {self.name!r}: {fld} must be an int in {lo}..{hi}, got {v}")
            object.__setattr__(self, fld, int(v))
        for fld in ("signed", "inf", "subnormals"):
            v = getattr(self, fld)
            if not isinstance(v, (bool, np.bool_)):
                raise TypeError(f"Format {self.name!r}: {fld} must be a bool, got {v!r} ({type(v).__name__})")
            object.__setattr__(self, fld, bool(v))
        try:
            object.__setattr__(self, "nan", NanStyle(self.nan))
        except ValueError:
            raise ValueError(
                f"Format {self.name!r}: unknown nan style {self.nan!r}; known: {', '.join(n.value for n in NanStyle)}"
            ) from None
        if self.inf and self.nan is not NanStyle.IEEE:
            raise ValueError(f"Format {self.name!r}: infinities need NanStyle.IEEE")
        if self.inf and self.mbits == 0:
            raise ValueError(f"Format {self.name!r}: inf and NaN need at least one mantissa bit")
        if self.nan is NanStyle.FNUZ and not self.signed:
            raise ValueError(f"Format {self.name!r}: 'fnuz' NaN needs a sign bit")
        if self.bits > MAX_BITS:
            # the rounding kernel computes codes, sign bit included, in int64
            raise ValueError(f"Format {self.name!r}: at most {MAX_BITS} bits, got {self.bits}")
        if self.max_code_mag < 0:
            raise ValueError(f"Format {self.name!r}: has no finite codes")
        # every value must be a float64 (the kernels round to float64 values and decode into them)
        lo_exp = self.emin - (self.mbits if self.subnormals else 0)
        if self.emax > 1023 or lo_exp < -1074:
            raise ValueError(
                f"Format {self.name!r}: its values span 2**{lo_exp}..2**{self.emax + 1}; float64 holds "
                f"2**-1074..2**1024 (choose the bias so that emax <= 1023 and the smallest value >= 2**-1074)"
            )

    # ----------------------------------------------------------- layout
    @property
    def bits(self) -> int:
        """Total width in bits."""
        return int(self.signed) + self.ebits + self.mbits

    @property
    def num_codes(self) -> int:
        """Number of bit patterns, ``2**bits``."""
        return 1 << self.bits

    @property
    def sign_mask(self) -> int:
        return (1 << (self.bits - 1)) if self.signed else 0

    @property
    def has_zero(self) -> bool:
        return self.subnormals

    @property
    def has_negative_zero(self) -> bool:
        return self.signed and self.subnormals and self.nan is not NanStyle.FNUZ

    @cached_property
    def max_code_mag(self) -> int:
        """Largest code magnitude (sign bit clear) that is a finite number."""
        top = (1 << (self.ebits + self.mbits)) - 1
        if self.nan is NanStyle.IEEE:
            return ((1 << self.ebits) - 2) << self.mbits | ((1 << self.mbits) - 1)
        if self.nan is NanStyle.OCP:
            return top - 1
        return top  # FNUZ, NONE

    # ------------------------------------------------------- exponents
    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number."""
        return 1 - self.bias if self.subnormals else -self.bias

    @property
    def emax(self) -> int:
        """Exponent of the largest finite number."""
        return (self.max_code_mag >> self.mbits) - self.bias

    # ---------------------------------------------------------- values
    def _exact(self, code_mag: int) -> Fraction:
        e_field = code_mag >> self.mbits
        m_field = code_mag & ((1 << self.mbits) - 1)
        if self.subnormals and e_field == 0:
            return Fraction(m_field, 1 << self.mbits) * Fraction(2) ** (1 - self.bias)
        return (1 + Fraction(m_field, 1 << self.mbits)) * Fraction(2) ** (e_field - self.bias)

    @property
    def max(self) -> float:
        """Largest finite value."""
        return float(self._exact(self.max_code_mag))

    @property
    def min(self) -> float:
        """Most negative finite value (``-max``; the smallest value if unsigned)."""
        return -self.max if self.signed else self.min_subnormal

    @property
    def min_normal(self) -> float:
        """Smallest positive normal value (``numpy.finfo.smallest_normal``)."""
        return 2.0**self.emin

    @property
    def min_subnormal(self) -> float:
        """Smallest positive value (``numpy.finfo.smallest_subnormal``)."""
        if self.subnormals:
            return 2.0 ** (self.emin - self.mbits)
        return 2.0**self.emin

    @property
    def eps(self) -> float:
        """Distance from 1.0 to the next larger value."""
        return 2.0**-self.mbits

    @property
    def precision(self) -> int:
        """Significand bits including the implicit leading bit."""
        return self.mbits + 1

    @property
    def fits_float32(self) -> bool:
        """Whether every finite value of the format is exactly a float32."""
        return self.mbits <= 23 and self.emax <= 127 and self.emin - self.mbits >= -149

    @property
    def code_dtype(self) -> np.dtype:
        """Unsigned integer dtype that holds one code."""
        if self.bits <= 8:
            return np.dtype(np.uint8)
        if self.bits <= 16:
            return np.dtype(np.uint16)
        if self.bits <= 32:
            return np.dtype(np.uint32)
        return np.dtype(np.uint64)

    @property
    def value_dtype(self) -> np.dtype:
        """float32 if it holds every value of the format, else float64."""
        return np.dtype(np.float32) if self.fits_float32 else np.dtype(np.float64)

    @property
    def ml_dtype(self):
        """The matching ml_dtypes / numpy scalar type, or None."""
        for dt in _ML_DTYPES:
            if _same_values(self, dt):
                return dt
        return None

    # ----------------------------------------------------- special codes
    @property
    def nan_code(self) -> int | None:
        """Canonical (positive, quiet) NaN code, or None if there is no NaN."""
        if self.nan is NanStyle.NONE:
            return None
        if self.nan is NanStyle.FNUZ:
            return self.sign_mask
        if self.nan is NanStyle.OCP:
            return (1 << (self.ebits + self.mbits)) - 1
        # IEEE: all-ones exponent, quiet bit (top mantissa bit) set
        quiet = (1 << (self.mbits - 1)) if self.mbits > 0 else 0
        return (((1 << self.ebits) - 1) << self.mbits) | quiet

    @property
    def inf_code(self) -> int | None:
        return (((1 << self.ebits) - 1) << self.mbits) if self.inf else None

    def is_nan_code(self, code: int) -> bool:
        mag = code & ~self.sign_mask
        if self.nan is NanStyle.NONE:
            return False
        if self.nan is NanStyle.FNUZ:
            return code == self.sign_mask
        if self.nan is NanStyle.OCP:
            return mag == (1 << (self.ebits + self.mbits)) - 1
        e_field = mag >> self.mbits
        if e_field != (1 << self.ebits) - 1:
            return False
        return not (self.inf and (mag & ((1 << self.mbits) - 1)) == 0)

    def __str__(self) -> str:
        return self.name

    def summary(self) -> dict:
        """The format's properties as a plain dict (for tables and --json)."""
        return {
            "name": self.name,
            "bits": self.bits,
            "ebits": self.ebits,
            "mbits": self.mbits,
            "bias": self.bias,
            "signed": self.signed,
            "inf": self.inf,
            "nan": self.nan.value,
            "subnormals": self.subnormals,
            "max": self.max,
            "min_normal": self.min_normal,
            "min_subnormal": self.min_subnormal,
            "eps": self.eps,
            "emax": self.emax,
            "emin": self.emin,
            "num_codes": self.num_codes,
            "ml_dtype": None if self.ml_dtype is None else np.dtype(self.ml_dtype).name,
            "description": self.description,
        }


_ML_DTYPES = [
    ml_dtypes.float8_e4m3fn,
    ml_dtypes.float8_e5m2,
    ml_dtypes.float8_e4m3fnuz,
    ml_dtypes.float8_e5m2fnuz,
    ml_dtypes.float8_e8m0fnu,
    ml_dtypes.float8_e3m4,
    ml_dtypes.float8_e4m3,
    ml_dtypes.float4_e2m1fn,
    ml_dtypes.float6_e2m3fn,
    ml_dtypes.float6_e3m2fn,
    ml_dtypes.bfloat16,
    np.float16,
    np.float32,
]


def _same_values(fmt: Format, dt) -> bool:
    fi = ml_dtypes.finfo(dt)
    if fi.bits != fmt.bits or fi.nmant != fmt.mbits:
        return False
    if float(fi.max) != fmt.max or float(fi.smallest_subnormal) != fmt.min_subnormal:
        return False
    # distinguish e.g. float8_e4m3 (IEEE, inf) from float8_e4m3fn (OCP)
    with np.errstate(over="ignore"):
        has_inf = bool(np.isinf(np.array(np.inf, dtype=np.float32).astype(dt)))
    return has_inf == fmt.inf and (float(fi.min) < 0) == fmt.signed


E4M3 = Format(
    "e4m3", 4, 3, 7, inf=False, nan=NanStyle.OCP, description="OCP FP8 E4M3FN: no inf, NaN only S.1111.111, max 448"
)
E5M2 = Format(
    "e5m2", 5, 2, 15, inf=True, nan=NanStyle.IEEE, description="OCP FP8 E5M2: IEEE-like with inf and NaN, max 57344"
)
E4M3FNUZ = Format(
    "e4m3fnuz",
    4,
    3,
    8,
    inf=False,
    nan=NanStyle.FNUZ,
    description="E4M3 with bias 8, no -0 (0x80 is NaN), max 240 (AMD MI300, Graphcore)",
)
E5M2FNUZ = Format(
    "e5m2fnuz", 5, 2, 16, inf=False, nan=NanStyle.FNUZ, description="E5M2 with bias 16, no inf, no -0 (0x80 is NaN)"
)
E8M0 = Format(
    "e8m0",
    8,
    0,
    127,
    signed=False,
    inf=False,
    nan=NanStyle.IEEE,
    subnormals=False,
    description="OCP MX shared scale: unsigned power of two 2**-127..2**127, 0xFF is NaN, no zero",
)
E2M1 = Format(
    "e2m1", 2, 1, 1, inf=False, nan=NanStyle.NONE, description="OCP FP4 (MXFP4/NVFP4 element): no inf/NaN, max 6"
)
E2M3 = Format("e2m3", 2, 3, 1, inf=False, nan=NanStyle.NONE, description="OCP FP6 E2M3: no inf/NaN, max 7.5")
E3M2 = Format("e3m2", 3, 2, 3, inf=False, nan=NanStyle.NONE, description="OCP FP6 E3M2: no inf/NaN, max 28")
E3M4 = Format(
    "e3m4", 3, 4, 3, inf=True, nan=NanStyle.IEEE, description="IEEE-like 8-bit E3M4 with inf and NaN, max 15.5"
)
E5M6 = Format(
    "e5m6",
    5,
    6,
    15,
    inf=True,
    nan=NanStyle.IEEE,
    description="DeepSeek-V3's 12-bit format for the input of the Linear after attention "
    "(layout assumed IEEE-like, as FP16 with 6 mantissa bits)",
)
BF16 = Format("bf16", 8, 7, 127, inf=True, nan=NanStyle.IEEE, description="bfloat16")
FP16 = Format("fp16", 5, 10, 15, inf=True, nan=NanStyle.IEEE, description="IEEE 754 binary16")
TF32 = Format(
    "tf32",
    8,
    10,
    127,
    inf=True,
    nan=NanStyle.IEEE,
    description="NVIDIA TensorFloat-32 (19 bits: fp32 range, fp16 precision)",
)
FP32 = Format("fp32", 8, 23, 127, inf=True, nan=NanStyle.IEEE, description="IEEE 754 binary32")

CATALOGUE: dict[str, Format] = {
    f.name: f for f in (E4M3, E5M2, E4M3FNUZ, E5M2FNUZ, E8M0, E2M1, E2M3, E3M2, E3M4, E5M6, BF16, FP16, TF32, FP32)
}

_ALIASES = {
    "e4m3fn": "e4m3",
    "float8_e4m3fn": "e4m3",
    "fp8_e4m3": "e4m3",
    "float8_e5m2": "e5m2",
    "fp8_e5m2": "e5m2",
    "float8_e4m3fnuz": "e4m3fnuz",
    "float8_e5m2fnuz": "e5m2fnuz",
    "e8m0fnu": "e8m0",
    "float8_e8m0fnu": "e8m0",
    "ue8m0": "e8m0",
    "fp4": "e2m1",
    "float4_e2m1fn": "e2m1",
    "e2m1fn": "e2m1",
    "float6_e2m3fn": "e2m3",
    "float6_e3m2fn": "e3m2",
    "float8_e3m4": "e3m4",
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "binary16": "fp16",
    "float32": "fp32",
    "single": "fp32",
    "binary32": "fp32",
}


def format_names() -> list[str]:
    """Names of the catalogue formats."""
    return list(CATALOGUE)


def format(name: str | Format) -> Format:  # noqa: A001 - public API name
    """Return the catalogue format called ``name`` (a Format is returned as is)."""
    if isinstance(name, Format):
        return name
    if not isinstance(name, str):
        raise TypeError(f"format must be a Format or a name, got {type(name).__name__}")
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    try:
        return CATALOGUE[key]
    except KeyError:
        hint = close_matches(key, [*CATALOGUE, *_ALIASES])
        hint = list(dict.fromkeys(_ALIASES.get(h, h) for h in hint))
        did = f"; did you mean {' or '.join(map(repr, hint))}?" if hint else ""
        raise UnknownNameError(
            f"unknown format {name!r}{did}; known formats: {', '.join(CATALOGUE)} "
            f"(or build one with fp8sim.Format(name, ebits, mbits, bias, ...))"
        ) from None
