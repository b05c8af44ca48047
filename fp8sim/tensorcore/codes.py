"""Per-code tables of an 8-bit format: what the tensor-core kernels look up for each input code."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .._fpenv import ieee_defaults
from ..formats import Format
from ..rounding import decode

__all__ = ["CodeTable", "code_table", "ZERO", "FINITE", "INF", "NAN"]

#: code classes
ZERO, FINITE, INF, NAN = 0, 1, 2, 3


class CodeTable(NamedTuple):
    """Per code (arrays of 256): class, sign, significand, exponent and value.

    A finite value is ``(-1)**sign * sig * 2**(exp - mbits)`` with ``sig`` an integer; for normal
    numbers ``2**mbits <= sig < 2**(mbits+1)``.
    """

    cls: np.ndarray  #: int64: 0 zero, 1 finite non-zero, 2 inf, 3 NaN
    sign: np.ndarray  #: int64 sign bit
    sig: np.ndarray  #: int64 integer significand
    exp: np.ndarray  #: int64 exponent (subnormals per ``subnormal_exponent``)
    val: np.ndarray  #: float64 value


_TABLE_CACHE: dict = {}


@ieee_defaults
def code_table(fmt: Format, subnormal_exponent: str) -> CodeTable:
    """The :class:`CodeTable` of ``fmt`` (an 8-bit format).

    ``subnormal_exponent`` places a subnormal input: ``"clamp"`` at the format's emin (significand
    below 1), ``"fp16"`` at fp16's emin, ``"normalize"`` at its true exponent.
    """
    key = (fmt, subnormal_exponent)
    if key in _TABLE_CACHE:
        return _TABLE_CACHE[key]
    codes = np.arange(256, dtype=np.uint8)
    if fmt.ml_dtype is not None:
        vals = codes.view(fmt.ml_dtype).astype(np.float64)
    else:
        vals = np.asarray(decode(codes, fmt), dtype=np.float64)
    cls = np.zeros(256, np.int64)
    sign = np.zeros(256, np.int64)
    sig = np.zeros(256, np.int64)
    exp = np.zeros(256, np.int64)
    for i, v in enumerate(vals):
        sign[i] = 1 if math.copysign(1.0, v) < 0 else 0
        if math.isnan(v):
            cls[i] = NAN
            continue
        if math.isinf(v):
            cls[i] = INF
            continue
        if v == 0:
            continue
        cls[i] = FINITE
        av = abs(v)
        e = math.frexp(av)[1] - 1  # av in [2**e, 2**(e+1))
        if subnormal_exponent == "clamp" and e < fmt.emin:
            e = fmt.emin
        elif subnormal_exponent == "fp16" and e < -14:
            e = -14
        s = av / 2.0 ** (e - fmt.mbits)
        assert s == int(s), (fmt, i, v)
        sig[i] = int(s)
        exp[i] = e
    vals = np.where(np.isnan(vals), np.nan, vals)
    out = CodeTable(cls, sign, sig, exp, vals)
    _TABLE_CACHE[key] = out
    return out
