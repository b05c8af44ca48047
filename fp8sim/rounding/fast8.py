"""Round to nearest even into a signed 8-bit format, specialized for float32 lanes.

The same rounding as ``round_one`` (``fp8sim.rounding._kernels``) in mode RNE (the quantization tests
check the two equal, code for code, on sweeps of every float32 binade), written for the fused
quantization kernels: 32-bit integer and float32 lane arithmetic only, so that it vectorizes.

* :func:`rne_code32` -- the code of a float32 quotient (exact or rounded to odd);
* :func:`to_odd`, :func:`to_odd32` -- a float32 quotient re-rounded to odd from its exact residual;
* :class:`FastParams`, :func:`fast_params` -- the format's int32 constants, or None where this path does
  not apply (:data:`NO_FAST` stands in for them there).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from ..formats import Format, NanStyle
from ..intrinsics import lshr32

__all__ = ["FastParams", "fast_params", "NO_FAST", "rne_code32", "to_odd", "to_odd32"]


class FastParams(NamedTuple):
    """The int32 constants of :func:`rne_code32` and of the fused kernels' float32 paths (a numba-typed
    tuple; the kernels unpack ``fp[:8]`` or read fields by name)."""

    e0_bits: np.int32  #: bit pattern of 2**emin: below it the subnormal candidate is taken
    shift: np.int32  #: 23 - mbits, the float32 significand bits dropped
    k_add: np.int32  #: rounding bias minus the exponent rebias (normal range)
    magic_bits: np.int32  #: bit pattern of M = 2**(emin - mbits + 23) (subnormal range)
    ovf_code: np.int32  #: the code overflow is capped to (max_code, or the inf/NaN code after it)
    nan_code: np.int32  #: the NaN code (-1 without one)
    sign_shift: np.int32  #: 32 - bits: moves the sign from bit 31 to bit bits-1
    sign_mask: np.int32  #: the format's sign bit
    fma_min: np.int32  #: smallest scale pattern whose float32 residual is exact
    lo_win: np.int32  #: low end of the multiply path's near-midpoint window
    smask: np.int32  #: mask of the bits below the last kept one


@njit(inline="always")
def to_odd(q, r, zero):
    """The float32 quotient ``q`` re-rounded to odd, given its exact residual ``r = q*d - x`` (float32 or
    float64, ``zero`` a 0 of the same type; r is NaN for an inf or NaN element, which is kept as it is):
    toward zero and with the lowest bit set when inexact."""
    b = np.float32(q).view(np.int32)
    inexact = (r != zero) & (r == r)
    toward_zero = inexact & (q != np.float32(0.0)) & ((r > zero) == (q > np.float32(0.0)))
    b = np.int32(np.int32(b - np.int32(toward_zero)) | np.int32(inexact))
    return np.int32(b).view(np.float32)


@njit(inline="always")
def to_odd32(q, r):
    """As :func:`to_odd` for a float32 residual, in fewer lane operations: the quotient overshoots the
    exact one when ``r`` and ``q`` have the same sign bit (a zero ``q`` always has the sign of ``x``, so
    it never overshoots); ``r != 0`` as an ordered comparison is false for a NaN residual (inf or NaN
    element), which keeps ``q`` as it is."""
    b = np.float32(q).view(np.int32)
    inexact = np.int32(-1) if (r < np.float32(0.0)) | (r > np.float32(0.0)) else np.int32(0)
    same = np.int32(np.int32(np.float32(r).view(np.int32) ^ b) >> np.int32(31))  # 0 if same sign, else -1
    down = np.int32(inexact & ~same)  # -1 where q overshoots
    b = np.int32(np.int32(b + down) | np.int32(inexact & np.int32(1)))
    return np.int32(b).view(np.float32)


@njit(inline="always")
def rne_code32(q, fp, nan=True):
    """The code of the float32 ``q`` rounded to nearest even into a signed format with subnormals and
    the standard layout, in 32-bit integer and float32 lane arithmetic only (it vectorizes).

    ``q`` must be exact or rounded to odd (at 24 bits, then rounding to <= 21 is the single rounding).
    Two candidates, selected by the magnitude ``a`` of ``q``'s bit pattern:

    * normal range (``|q| >= 2**emin``): the integer rounding of the pattern,
      ``(a + 2**(s-1) - 1 + lsb) >> s`` with ``s = 23 - m`` and ``lsb`` the last kept bit, with the
      exponent rebias folded into the added constant;
    * subnormal range: adding ``M = 2**(emin - m + 23)`` rounds ``|q|`` to a multiple of the subnormal
      spacing ``2**(emin - m)`` by float32 RNE, and the low bits of the sum count the multiples, which
      is the code (``2**m``, the smallest normal's code, when it rounds up).

    Overflow (and inf) is capped to the saturation or overflow code, NaN gets the NaN code.  ``fp``:
    the :class:`FastParams` of :func:`fast_params`.
    """
    e0_bits, shift, k_add, magic_bits, ovf_code, nan_code, sign_shift, sign_mask = fp[:8]
    b = np.float32(q).view(np.int32)
    a = np.int32(b & np.int32(0x7FFFFFFF))
    lsb = np.int32(lshr32(a, shift) & np.int32(1))
    cn = lshr32(np.int32(np.int32(a + k_add) + lsb), shift)  # a + k_add > 0 where cn is used
    y = np.float32(np.int32(a).view(np.float32) + np.int32(magic_bits).view(np.float32))
    cs = np.int32(np.float32(y).view(np.int32) - magic_bits)
    c = cs if a < e0_bits else cn
    c = min(c, ovf_code)  # ovf_code is max_code (saturate) or max_code + 1 (the inf or NaN code)
    if nan:  # (a constant at the call site: False drops the test where no element can be NaN)
        c = nan_code if q != q else c
    return np.uint8(c | np.int32(lshr32(b, sign_shift) & sign_mask))


def fast_params(fmt: Format, saturate: bool) -> FastParams | None:
    """The :class:`FastParams` of :func:`rne_code32` for ``fmt``, or None where it does not apply
    (the format needs a signed layout with -0, subnormals, IEEE/OCP/no NaN, <= 8 bits, and ranges
    that keep every constant a float32 normal and every sum inside int32)."""
    ok = (
        fmt.signed
        and fmt.subnormals
        and fmt.has_negative_zero
        and fmt.bits <= 8
        and fmt.sign_mask == 1 << (fmt.bits - 1)
        and fmt.nan in (NanStyle.IEEE, NanStyle.OCP, NanStyle.NONE)
        and 1 <= fmt.mbits <= 21
        and fmt.emin - fmt.mbits >= -124
        and fmt.emax <= 120
    )
    if not ok:
        return None
    if saturate or fmt.nan is NanStyle.NONE:
        ovf = fmt.max_code_mag
    else:
        special = fmt.inf_code if fmt.inf_code is not None else fmt.nan_code
        if special is None or special != fmt.max_code_mag + 1:  # the overflow code must follow the largest
            return None
        ovf = special
    i32 = np.int32
    s = 23 - fmt.mbits
    # The float32 residual fma(q, d, -x) of q = RN(x/d) is exact when q's and d's binades sum to at least
    # -103 (no underflow).  It decides the rounding only for quotients from the format's smallest
    # midpoint 2**(emin - mbits - 1) upward (smaller ones give zero either way), so scales from
    # 2**(-103 - (emin - mbits - 1)) up may use it; smaller scales take the float64 residual.
    fma_min = max(-126, -103 - (fmt.emin - fmt.mbits - 1))
    return FastParams(
        i32((fmt.emin + 127) << 23),  # |q| below 2**emin: subnormal
        i32(s),
        i32((1 << (s - 1)) - 1 - ((126 + fmt.emin) << 23)),  # rounding bias minus the exponent rebias
        i32((fmt.emin - fmt.mbits + 23 + 127) << 23),  # M = 2**(emin - m + 23)
        i32(ovf),
        i32(fmt.nan_code if fmt.nan_code is not None else -1),
        i32(32 - fmt.bits),  # the sign bit moves from bit 31 to bit bits-1
        i32(fmt.sign_mask),
        i32((fma_min + 127) << 23),
        i32((1 << (s - 1)) - 4),  # near-midpoint window of the multiply path: its low end ...
        i32((1 << s) - 1),  # ... and the mask of the bits below the last kept one
    )


#: stands in for the constants where :func:`fast_params` gives None (the kernels do not read them then)
NO_FAST = FastParams(*((np.int32(0),) * 11))
