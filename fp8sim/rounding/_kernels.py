"""Numba kernels behind :mod:`fp8sim.rounding` (private: the package re-exports what other packages use):
the one rounding mechanism.

One scalar routine, :func:`round_one`, rounds a float to any
:class:`~fp8sim.formats.Format` in any mode and returns both the rounded
value and its code.  The parallel array kernels call it element by element;
the format arrives as one :class:`~fp8sim.rounding.params.FormatParams` struct (plain numbers,
unpacked inside) and the mode as a compile-time constant, so there is one mechanism for every format and mode rather than a
copy per format.

The method works on the input's bit pattern with integer arithmetic.  With
``sig`` the input's full significand (implicit bit included) and ``E =
clamp(e, emin, emax + 1)`` for the input's exponent ``e``, the quantum of
the target grid at ``|x|`` is ``2**(E - mbits)``; ``s`` is the number of
low significand bits below that quantum, ``n = sig >> s`` the truncated
significand and ``rem = sig - (n << s)`` the discarded part, so the
fractional distance to the next value is exactly ``rem / 2**s``.  Every
rounding mode is a rule that decides from ``rem``, the parity of the
truncated code, the sign and (for stochastic rounding) random bits whether
to add one quantum.  Nothing is rounded twice, so float64 input is rounded
once, directly.

The source is written once and instantiated twice, like a template: for
float32 input on int32 lanes (eight to an AVX2 register) and for float64
input on int64 lanes; :func:`round_one` dispatches on the input type at
compile time.
"""

from __future__ import annotations

import warnings

import numpy as np
from numba import njit, prange, types
from numba.core.errors import NumbaIRAssumptionWarning
from numba.extending import overload

from .. import _fpenv
from .modes import RoundMode

__all__ = [
    "round_one",
    "random_bits",
    "KERNELS",
    "any_mode",
    "lookup16",
    "decode_kernel",
    "RNE",
    "RNA",
    "RTZ",
    "RUP",
    "RDN",
    "RTO",
    "SR",
    "GOLDEN",
    "MIX1",
    "MIX2",
]

# numba's pedantic SSA check flags the inlined round_one's branch variables
# ("variable ... is not in scope") at compile time; the generated code is
# unaffected (every path is verified bit for bit by the test suite).
warnings.filterwarnings("ignore", category=NumbaIRAssumptionWarning)


# the mode numbers as plain ints (compile-time constants of the kernels)
RNE, RNA, RTZ, RUP, RDN, RTO, SR = (int(m) for m in RoundMode)

# SplitMix64 constants of the counter-based random bits of stochastic rounding
GOLDEN = np.uint64(0x9E3779B97F4A7C15)
MIX1 = np.uint64(0xBF58476D1CE4E5B9)
MIX2 = np.uint64(0x94D049BB133111EB)


@njit(inline="always")
def random_bits(key, i):
    """64 random bits for element ``i``: SplitMix64 of a counter.

    Counter-based, so the bits of element i depend only on (key, i), never
    on how the array is split across threads.
    """
    z = key + (np.uint64(i) + np.uint64(1)) * GOLDEN
    z = (z ^ (z >> np.uint64(30))) * MIX1
    z = (z ^ (z >> np.uint64(27))) * MIX2
    return z ^ (z >> np.uint64(31))


def _make_round_one(FT, IT, P: int, BIAS: int):
    """Instantiate the rounding routine for input float type FT (P mantissa bits,
    exponent bias BIAS) computing on the same-width signed integer type IT."""
    W = np.dtype(IT).itemsize * 8
    ABS = IT((1 << (W - 1)) - 1)
    INF_BITS = IT(((1 << (W - 1 - P)) - 1) << P)
    MANT = IT((1 << P) - 1)
    IMPLICIT = IT(1 << P)
    ONE, ZERO = IT(1), IT(0)
    P_ = IT(P)
    BIAS_ = IT(BIAS)
    SMAX = IT(W - 1)
    EMIN_IN = 1 - BIAS  # smallest normal exponent of the input type
    IS32 = W == 32

    @njit(inline="always")
    def pow2(k):
        """FT(2**k) for EMIN_IN <= k <= BIAS, from the exponent field."""
        return IT((k + BIAS_) << P_).view(FT)

    @njit(inline="always")
    def pow2_any(k):
        """FT(2**k) for 2 * EMIN_IN <= k <= BIAS (subnormal powers too)."""
        k_hi = k if k > EMIN_IN else IT(EMIN_IN)
        return pow2(k_hi) * pow2(k - k_hi)

    @njit(inline="always")
    def to_float(m):
        """FT(m) for 0 <= m <= 2**P + 1."""
        if IS32:
            return FT(m)  # int32 -> float32 converts natively on AVX2
        # int64 -> float64 does not (no vcvtqq2pd): set m as the low mantissa bits of 2**52
        return IT(m | IT(0x4330000000000000)).view(FT) - FT(4503599627370496.0)

    def round_one(x, r, mode, p, k=0):
        (
            mbits,
            emin,
            emax,
            max_code,
            max_val,
            sign_mask,
            signed,
            has_neg_zero,
            subnormals,
            inf_code,
            nan_code,
            saturate_overflow,
            flush,
            sr_bits,
        ) = p
        mbits = IT(mbits)
        emin = IT(emin + k)
        emax = IT(emax + k)
        max_code = IT(max_code)
        sign_mask = IT(sign_mask)
        inf_code = IT(inf_code)
        nan_code = IT(nan_code)
        u = FT(x).view(IT)
        neg = u < ZERO
        ab = u & ABS
        is_nan = ab > INF_BITS
        is_inf = ab == INF_BITS
        is_zero = ab == ZERO
        ef = ab >> P_
        e_eff = (ef if ef > ONE else ONE) - BIAS_
        sig = (ab & MANT) | (IMPLICIT if ef != ZERO else ZERO)

        E = e_eff if e_eff > emin else emin
        E = E if E < emax + ONE else emax + ONE
        s = E - mbits - e_eff + P_
        s = s if s > ZERO else ZERO
        sc = s if s < SMAX else SMAX
        n = sig >> sc
        rem = sig - (n << sc)
        half = ONE << (sc - ONE if sc > ZERO else ZERO)

        cn = ((E - emin) << mbits) + n
        if not subnormals:
            cn = cn - (ONE << mbits)
        odd = (cn & ONE) == ONE

        if mode == RNE:
            inc = (rem > half) | ((rem == half) & (rem != ZERO) & odd)
        elif mode == RNA:
            inc = (rem >= half) & (rem != ZERO)
        elif mode == RTZ:
            inc = False
        elif mode == RUP:
            inc = (rem != ZERO) & (not neg)
        elif mode == RDN:
            inc = (rem != ZERO) & neg
        elif mode == RTO:
            inc = (rem != ZERO) & (not odd)
        else:  # SR: t = floor(frac * 2**sr_bits) + sr_bits random bits carries into the quantum
            d = np.int64(s) - sr_bits
            rem64 = np.int64(rem)
            t = (rem64 >> (d if d < 63 else np.int64(63))) if d >= 0 else (rem64 << (-d))
            rnd = np.int64(r >> np.uint64(64 - sr_bits))
            inc = t + rnd >= (np.int64(1) << sr_bits)

        m = n + IT(inc)
        c = cn + IT(inc)
        val = to_float(m) * pow2_any(E - mbits)

        if flush and subnormals and c < (ONE << mbits):
            c = ZERO
            val = FT(0.0)

        # ---- overflow and specials -----------------------------------
        over = (c > max_code) | is_inf
        dir_max = (mode == RTZ) | (mode == RTO) | ((mode == RUP) & neg) | ((mode == RDN) & (not neg))
        to_max = (saturate_overflow == 1) | (dir_max & (not is_inf))
        if over:
            if to_max:
                c = max_code
                val = FT(max_val)
            elif inf_code >= ZERO:
                c = inf_code
                val = FT(np.inf)
            else:
                c = nan_code
                val = FT(np.nan)
        if not subnormals:
            # no zero (E8M0): positive underflow gives the smallest value, 0 gives NaN
            if c < ZERO:
                c = ZERO
                val = pow2_any(emin)
            if is_zero:
                c = nan_code
                val = FT(np.nan)
        if (neg & (not signed) & (not is_zero)) | is_nan:
            c = nan_code
            val = FT(np.nan)
        if neg & signed:
            val = -val
            if (c != ZERO or has_neg_zero) and c != sign_mask:
                c = c | sign_mask
        if subnormals and (not has_neg_zero) and c == ZERO:
            val = FT(0.0)
        return val, c

    return round_one


_ROUND_ONE_F32 = _make_round_one(np.float32, np.int32, 23, 127)
_ROUND_ONE_F64 = _make_round_one(np.float64, np.int64, 52, 1023)


def round_one(x, r, mode, p, k=0):
    """Round one float32/float64 ``x`` to the format of ``p``; return ``(value, code)``.

    Callable from numba code only.  ``p`` is the :class:`~fp8sim.rounding.params.FormatParams` of
    :func:`~fp8sim.rounding.params.format_params`, passed whole (unpacked inside).  The value has
    ``x``'s type; the code is an int32 (float32 input) or int64.  ``r`` holds 64 random bits (used by
    SR only); ``mode`` is a mode number (a compile-time constant where the caller's is).  ``k`` shifts
    the format's exponent range (``emin + k``, ``emax + k``): the code of a quotient formed with the
    range shifted.  Float32 ``x`` requires ``fp8sim.rounding.float32_kernel_ok(fmt)``; pass float64
    otherwise.
    """
    raise NotImplementedError("round_one runs inside numba-compiled code only")


@overload(round_one, inline="always")
def _round_one_overload(x, r, mode, p, k=0):
    if x == types.float32:
        return _ROUND_ONE_F32
    if x == types.float64:
        return _ROUND_ONE_F64
    return None


def _store(out, i, v, c):
    """out[i] = v for a float output array, c for an integer (code) array."""
    raise NotImplementedError


@overload(_store, inline="always")
def _store_overload(out, i, v, c):
    if isinstance(out.dtype, types.Float):

        def store_value(out, i, v, c):
            out[i] = v

        return store_value

    def store_code(out, i, v, c):
        out[i] = c

    return store_code


#: elements per parallel chunk of the array kernels (each chunk sets the floating-point environment once)
CHUNK = 4096


@njit(inline="always")
def _loop(x, out, mode, p, key):
    n = x.size
    for ch in prange((n + CHUNK - 1) // CHUNK):
        fe = _fpenv.enter()  # the IEEE default environment on whichever thread runs the chunk
        for i in range(ch * CHUNK, min(n, (ch + 1) * CHUNK)):
            r = random_bits(key, i) if mode == SR else np.uint64(0)
            v, c = round_one(x[i], r, mode, p)
            _store(out, i, v, c)  # the output dtype picks value or code at compile time
        _fpenv.leave(fe)


# One thin entry point per mode: the mode reaches the inlined mechanism as a
# compile-time constant, so each loop is branch-free and vectorizes.
@njit(parallel=True, cache=True)
def _rne(x, out, p, key):
    _loop(x, out, RNE, p, key)


@njit(parallel=True, cache=True)
def _rna(x, out, p, key):
    _loop(x, out, RNA, p, key)


@njit(parallel=True, cache=True)
def _rtz(x, out, p, key):
    _loop(x, out, RTZ, p, key)


@njit(parallel=True, cache=True)
def _rup(x, out, p, key):
    _loop(x, out, RUP, p, key)


@njit(parallel=True, cache=True)
def _rdn(x, out, p, key):
    _loop(x, out, RDN, p, key)


@njit(parallel=True, cache=True)
def _rto(x, out, p, key):
    _loop(x, out, RTO, p, key)


@njit(parallel=True, cache=True)
def _sr(x, out, p, key):
    _loop(x, out, SR, p, key)


KERNELS = {RNE: _rne, RNA: _rna, RTZ: _rtz, RUP: _rup, RDN: _rdn, RTO: _rto, SR: _sr}


@njit(parallel=True, cache=True)
def any_mode(x, out, mode, p, key):
    """The same loop with the mode as a run-time value: one compilation serves all seven modes.

    Compiling a mode's own kernel takes seconds; fp8sim.rounding uses this one for arrays too
    small to repay that (and to build the memo tables), the per-mode kernels for large ones.
    """
    _loop(x, out, mode, p, key)


# ---------------------------------------------------------------------------
# Memoized float32 path.  For a target with mbits <= 6, at least the low 17
# bits of a float32 significand fall below the target quantum (s >= 17), so
# the half-quantum bit lies above the low 16 bits, which then matter only
# through "are they all zero" (every deterministic mode decides on
# rem == 0, rem vs half).  Inputs past the range overflow whatever their
# low bits.  The result is therefore a
# function of (bits >> 16, low16 != 0): round_one evaluated once on the
# 2 * 65536 representatives (key << 16 | sticky) gives a table that equals
# round_one on every float32 input (checked over all 2**32 inputs by
# scripts/exhaustive_check.py).
@njit(parallel=True, cache=True)
def lookup16(bits, table, out):
    """out[i] = table[low16(bits[i]) != 0, bits[i] >> 16]."""
    for i in prange(bits.size):
        b = bits[i]
        out[i] = table[np.int64((b & np.uint32(0xFFFF)) != np.uint32(0)), np.int64(b >> np.uint32(16))]


@njit(parallel=True, cache=True)
def decode_kernel(codes, table, out):
    n = codes.size
    for i in prange(n):
        out[i] = table[codes[i]]
