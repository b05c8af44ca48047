"""Scale policies: a block's dequantization scale from its amax.

:func:`scale_policy` checks a granularity's ``scale_format`` / ``scale_rounding`` / ``margin`` and
gives the :class:`ScalePolicy` the kernels see; :func:`scale_one` (numba) computes one scale from one
amax, :func:`finish_scales` rounds the bf16 and E4M3 ratios to their format.

Scale rounding shares the one :class:`~fp8sim.rounding.RoundMode` vocabulary: ``"floor"`` is
:attr:`RoundMode.RDN <fp8sim.rounding.RoundMode.RDN>` (``"rdn"``, ``"rd"``, ...) and ``"ceil"``
:attr:`RoundMode.RUP <fp8sim.rounding.RoundMode.RUP>` (``"rup"``, ``"ru"``, ...), rounding
``log2(amax) - emax_elem`` to an integer.  Two rules are specific to power-of-two scales and are not
element rounding modes:

* ``"rceil"``: ``ceil(log2(float32(amax / fmt.max)))``, the ceiling of the log2 of the ratio
  rounded to float32 first (PTX ``cvt.rp.satfinite.ue8m0x2.f32``, NVIDIA's MXFP8 recipe);
* ``"even"``: ``floor(log2(r)) - emax_elem`` with ``r`` the amax rounded half up to the element
  format's precision (torchao's EVEN).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import njit

from .._names import unknown_name_error
from ..formats import BF16, E4M3, Format, UnknownNameError
from ..formats import format as _lookup_format
from ..intrinsics import fdiv, fma64
from ..rounding import RoundMode, round_mode
from ..rounding import round as _round
from .names import granularity

__all__ = [
    "ScalePolicy",
    "scale_policy",
    "canonical_scale_rounding",
    "SCALE_FORMATS",
    "SCALE_ROUNDINGS",
    "FP32",
    "BF16_SCALE",
    "POW2",
    "E8M0",
    "E4M3_SCALE",
    "FLOOR",
    "CEIL",
    "RCEIL",
    "EVEN",
    "FLT_MAX",
    "pow2",
    "floor_log2",
    "ceil_log2",
    "scale_fp32",
    "odd64",
    "div_odd",
    "scale_one",
    "scales_from_amax",
    "finish_scales",
]

SCALE_FORMATS = ("fp32", "bf16", "pow2", "e8m0")
SCALE_ROUNDINGS = ("floor", "ceil", "rceil", "even")

# scale kinds as the kernels see them
FP32, BF16_SCALE, POW2, E8M0, E4M3_SCALE = 0, 1, 2, 3, 4
_KIND = {"fp32": FP32, "bf16": BF16_SCALE, "pow2": POW2, "e8m0": E8M0, "e4m3": E4M3_SCALE}
# scale roundings as the kernels see them: floor and ceil are the round modes RDN and RUP (of
# log2(amax) - emax_elem to an integer); rceil and even are scale rules of their own (numbered past the
# modes)
FLOOR = int(RoundMode.RDN)
CEIL = int(RoundMode.RUP)
RCEIL = 16
EVEN = 17
_ROUNDING = {"floor": FLOOR, "ceil": CEIL, "rceil": RCEIL, "even": EVEN}
_MODE_ROUNDING = {RoundMode.RDN: "floor", RoundMode.RUP: "ceil"}
FLT_MAX = float(np.finfo(np.float32).max)


class ScalePolicy(NamedTuple):
    """A scale policy as the kernels see it (a numba-typed tuple).

    ``kind`` (:data:`FP32`, :data:`BF16_SCALE`, :data:`POW2`, :data:`E8M0`, :data:`E4M3_SCALE`) and
    ``rnd`` (:data:`FLOOR`, :data:`CEIL`, :data:`RCEIL`, :data:`EVEN`) pick the rule; ``fmax``,
    ``emax_e`` and ``mbits_e`` are the element format's max, emax and mantissa bits; scales are
    multiplied by ``2**margin`` and clamped to ``[smin, smax]`` (power-of-two exponents to
    ``[emin_s, emax_s]``).
    """

    kind: np.int64
    rnd: np.int64
    fmax: np.float64
    emax_e: np.int64
    mbits_e: np.int64
    margin: np.int64
    smin: np.float64
    smax: np.float64
    emin_s: np.int64
    emax_s: np.int64


def canonical_scale_rounding(name) -> str:
    """The canonical name (``"floor"``, ``"ceil"``, ``"rceil"`` or ``"even"``) of a scale rounding:
    ``"floor"`` and ``"ceil"`` also by their :class:`~fp8sim.rounding.RoundMode` (``"rdn"``,
    ``RoundMode.RDN``, ``"rd"``, ...; ``"rup"``, ``RoundMode.RUP``, ``"ru"``, ...).  Other names raise
    :class:`~fp8sim.formats.UnknownNameError`."""
    if isinstance(name, str) and name.strip().lower() in ("rceil", "even"):
        return name.strip().lower()  # (before the mode aliases: "even" is also an alias of rne there)
    try:
        if not isinstance(name, (str, RoundMode)):
            raise UnknownNameError(name)
        m = round_mode(name, allowed=tuple(_MODE_ROUNDING), what="scale_rounding")
    except UnknownNameError:
        label = name.label if isinstance(name, RoundMode) else name
        candidates = [*SCALE_ROUNDINGS, "rdn", "rup", "rd", "ru", "down", "up"]
        raise unknown_name_error(
            "scale_rounding", label, SCALE_ROUNDINGS, candidates=candidates, plural="scale roundings"
        ) from None
    return _MODE_ROUNDING[m]


def scale_policy(g, fmt, scale_format=None, scale_rounding=None, margin=0) -> tuple[str, str | None, ScalePolicy]:
    """``(scale_format, scale_rounding, policy)``: the checked, canonical scale format and rounding of
    granularity ``g`` (its defaults where None) for element format ``fmt``, and their
    :class:`ScalePolicy`.  Raises TypeError / ValueError (UnknownNameError for unknown names)."""
    g = granularity(g)
    if not isinstance(fmt, Format):
        fmt = _lookup_format(fmt)
    if isinstance(margin, (bool, np.bool_)) or not isinstance(margin, (int, np.integer)):
        raise TypeError(f"margin must be an int (a number of binades), got {margin!r}")
    margin = int(margin)
    fixed = g.fixed_scale(scale_format, scale_rounding)  # (NVFP4: E4M3 block scales, no rounding choice)
    if fixed is not None:
        sf, sr = fixed
    else:
        sf = g.default_scale_format if scale_format is None else scale_format
        if not isinstance(sf, str) or sf.lower() not in SCALE_FORMATS:
            raise unknown_name_error("scale_format", scale_format, SCALE_FORMATS, plural="scale formats")
        sf = sf.lower()
        g.check_scale_format(sf)  # (MX: E8M0 only)
        if sf == "fp32":
            if scale_rounding is not None:
                raise ValueError(
                    "scale_rounding applies to bf16, pow2 and e8m0 scales; fp32 scales are "
                    "amax/max rounded to nearest float32 -- pass scale_rounding=None"
                )
            sr = None
        else:
            default = g.default_scale_rounding(sf)
            sr = canonical_scale_rounding(default if scale_rounding is None else scale_rounding)
    return sf, sr, _policy_of(fmt, sf, sr, margin)


def _policy_of(fmt: Format, sf: str, sr: str | None, margin: int) -> ScalePolicy:
    kind = _KIND[sf]
    rnd = _ROUNDING.get(sr or "", FLOOR)
    # 2**margin must be a normal value of the scale format (for nvfp4: of the float32 tensor scale)
    m_lo, m_hi = (-127, 127) if kind == E8M0 else (-126, 127)
    if not m_lo <= margin <= m_hi:
        raise ValueError(
            f"margin must be an int in {m_lo}..{m_hi} for "
            f"{'nvfp4 (float32 tensor scale)' if kind == E4M3_SCALE else sf} "
            f"scales (2**margin a normal scale), got {margin}"
        )
    if kind == BF16_SCALE:
        smin, smax, emin_s, emax_s = 2.0**-126, BF16.max, -126, 127
    elif kind == E4M3_SCALE:
        smin, smax, emin_s, emax_s = E4M3.min_subnormal, E4M3.max, -9, 8
    elif kind == E8M0:
        smin, smax, emin_s, emax_s = 2.0**-127, 2.0**127, -127, 127
    else:
        smin, smax, emin_s, emax_s = 2.0**-126, (FLT_MAX if kind == FP32 else 2.0**127), -126, 127
    return ScalePolicy(
        np.int64(kind),
        np.int64(rnd),
        np.float64(fmt.max),
        np.int64(fmt.emax),
        np.int64(fmt.mbits),
        np.int64(margin),
        np.float64(smin),
        np.float64(smax),
        np.int64(emin_s),
        np.int64(emax_s),
    )


# =====================================================================
# numba: one scale from one amax
# =====================================================================
@njit(inline="always")
def pow2(k):
    """2.0**k for -1022 <= k <= 1023, built from the exponent field."""
    return np.int64((k + 1023) << 52).view(np.float64)


@njit(inline="always")
def floor_log2(a):
    """floor(log2(a)) for finite a > 0 (from the exponent field; frexp for subnormal doubles)."""
    biased = (np.float64(a).view(np.int64) >> 52) & 0x7FF
    if biased == 0:
        m, e = math.frexp(a)
        return e - 1
    return biased - 1023


@njit(inline="always")
def ceil_log2(a):
    """ceil(log2(a)) for finite a > 0: floor(log2(a)), plus one unless a is a power of two."""
    b = np.float64(a).view(np.int64)
    if (b >> 52) & 0x7FF == 0:  # subnormal double
        m, e = math.frexp(a)
        return e - 1 if m == 0.5 else e
    return ((b >> 52) & 0x7FF) - 1023 + (1 if b & np.int64(0xFFFFFFFFFFFFF) != 0 else 0)


@njit(inline="always")
def scale_fp32(a, fmax, m2, smin, smax):
    """An fp32 scale: amax / max times 2**margin (``m2``) rounded to float32, clamped to [smin, smax]
    (one expression for :func:`scale_one` and the vectorized tile loop of the row kernel)."""
    s = np.float64(np.float32(fdiv(np.float64(a), np.float64(fmax)) * m2))  # 2**margin before the float32
    return min(max(s, smin), smax)  # rounding: a ratio beyond float32's range still gets its scaled value


@njit(inline="always")
def odd64(q, r):
    """The float64 quotient ``q`` re-rounded to odd, given its exact residual ``r = q*d - x`` (d > 0):
    toward zero and with the lowest bit set when inexact.  A NaN residual (an inf or NaN element) keeps
    ``q``; an overflowed ``q`` (inf from a finite element) becomes the largest finite double."""
    b = np.float64(q).view(np.int64)
    inexact = (r != 0.0) & (r == r)
    toward_zero = inexact & (q != 0.0) & ((r > 0.0) == (q > 0.0))
    b = (b - np.int64(toward_zero)) | np.int64(inexact)
    return np.int64(b).view(np.float64)


@njit(inline="always")
def div_odd(a, b):
    """``a / b`` (b > 0) rounded to odd at 53 bits: rounding it to any format of at most 51 bits is the
    single rounding of the exact ratio (below 2**-960 the residual may be inexact; those ratios round to
    zero or the smallest scale anyway).  (``float32(a / b)`` needs no such care where ``b`` has at most
    28 significant bits: the float64 quotient of a float64 by it cannot land on a float32 midpoint
    unless the exact ratio is that midpoint.)"""
    q = fdiv(a, b)
    return odd64(q, fma64(q, b, -a))


@njit(inline="always")
def scale_one(amax, glob, sp):
    """Dequantization scale of a block from its amax (NaN amax gives a NaN scale); ``sp``: the
    :class:`ScalePolicy`."""
    kind, rnd, fmax, emax_e, mbits_e, margin, smin, smax, emin_s, emax_s = sp
    if amax != amax:
        return np.nan
    if kind == E4M3_SCALE:  # NVFP4 block scales: amax / (global scale * max), rounded to odd (glob * fmax
        # is exact), so that rounding it to E4M3 afterwards is the single rounding of the exact ratio
        return div_odd(np.float64(amax), glob * fmax) * pow2(margin)
    a = amax if glob == 1.0 else amax / glob  # (a division's latency, per tile, when it is not needed)
    if kind == FP32:
        return scale_fp32(a, fmax, pow2(margin), smin, smax)
    if kind == BF16_SCALE:  # the unrounded ratio; rounded to the format afterwards
        return a / fmax * pow2(margin)
    # power of two (pow2 / e8m0)
    if a == 0.0:
        e = emin_s
    elif rnd == FLOOR:
        e = floor_log2(a) - emax_e
    elif rnd == CEIL:
        e = ceil_log2(a) - emax_e
    elif rnd == RCEIL:  # ceil(log2(float32(amax / fmax)))
        r = np.float64(np.float32(a / fmax))
        e = emin_s if r == 0.0 else ceil_log2(r)
    else:  # EVEN: amax rounded half up to the element precision, then floor
        b = np.float64(a).view(np.int64) + (np.int64(1) << (51 - mbits_e))
        b = b & ~np.int64((1 << 52) - 1)
        e = floor_log2(np.int64(b).view(np.float64)) - emax_e
    e = e + margin
    e = min(max(e, emin_s), emax_s)
    return pow2(e)


@njit(cache=True)
def scales_from_amax(amax, glob, sp, out):
    """``out[k]``: the scale of amax ``amax[k]`` (:func:`scale_one`)."""
    for k in range(amax.size):
        out[k] = scale_one(amax[k], glob, sp)


def finish_scales(s: np.ndarray, sf: str, sr: str | None) -> np.ndarray:
    """Round the ratios of bf16 / e4m3 scale policies to their format (other policies are final)."""
    if sf == "bf16":
        assert sr is not None
        mode = {"floor": "rdn", "ceil": "rup", "rceil": "rup", "even": "rne"}[sr]
        s32 = s.astype(np.float32)  # the float32 scale amax/max (correctly rounded)
        r = _round(s32.astype(np.float64), BF16, mode, saturate=True)
        return np.where(np.isnan(r), r, np.clip(r, 2.0**-126, BF16.max))
    if sf == "e4m3":  # NVFP4 block scales: RNE satfinite; a nonzero block never gets scale 0
        r = _round(s, E4M3, "rne", saturate=True)
        return np.where(r == 0, E4M3.min_subnormal, r)
    return s
