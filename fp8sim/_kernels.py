"""Numba kernels behind :mod:`fp8sim.rounding`.

One scalar routine, :func:`round_one`, rounds a float64 to any
:class:`~fp8sim.formats.Format` in any mode and returns both the rounded
value and its code.  The parallel array kernels call it element by element;
the format and the mode arrive as plain integers, so there is one mechanism
for every format and mode rather than a copy per format.

The method: with ``e`` the unbiased exponent of ``|x|`` and ``E = max(e,
emin)``, the quantum of the target grid at ``|x|`` is ``2**(E - mbits)``.
Scaling ``|x|`` by ``2**-(E - mbits)`` (exact: a power of two) gives
``n + f`` with integer ``n`` (the truncated significand in units of the
quantum) and fraction ``0 <= f < 1`` (exact in float64).  Every rounding
mode is a rule that decides whether to add one quantum to ``n`` from
``f``, the parity of the truncated code, the sign and (for stochastic
rounding) random bits.  Because float32 and float64 inputs are scaled
exactly, each input is rounded once, directly.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

# mode numbers (the public names live in rounding.py)
RNE, RNA, RTZ, RUP, RDN, RTO, SR = 0, 1, 2, 3, 4, 5, 6

_ABS = np.int64(0x7FFFFFFFFFFFFFFF)
_INF_BITS = np.int64(0x7FF0000000000000)
_MANT = np.int64((1 << 52) - 1)
_IMPLICIT = np.int64(1 << 52)
_MANT_AND_IMPLICIT2 = np.int64((1 << 52) - 1)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


@njit(inline="always")
def _pow2(k):
    """2.0**k for -1022 <= k <= 1023, built from the exponent field."""
    return np.int64((k + 1023) << 52).view(np.float64)


@njit(inline="always")
def random_bits(key, i):
    """64 random bits for element ``i``: SplitMix64 of a counter.

    Counter-based, so the bits of element i depend only on (key, i), never
    on how the array is split across threads.
    """
    z = key + (np.uint64(i) + np.uint64(1)) * _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


@njit(inline="always")
def _magic_float(m):
    """float64(m) for 0 <= m < 2**52 without an int->float conversion (vectorizes on AVX2)."""
    return np.int64(m | np.int64(0x4330000000000000)).view(np.float64) - 4503599627370496.0


@njit(inline="always")
def round_one(x, r, mode, mbits, emin, emax, max_code, max_val, sign_mask, signed, has_neg_zero,
              subnormals, inf_code, nan_code, saturate_overflow, flush, sr_bits):
    """Round float64 ``x`` to the target format; return ``(value, code)``.

    Integer arithmetic on the float64 bit pattern (vectorizes with AVX2).
    ``sig`` is x's 53-bit significand and ``s`` the number of its low bits
    that fall below the target quantum at x: ``n = sig >> s`` is the
    truncated significand and ``rem = sig - (n << s)`` the discarded part,
    so the fractional distance is ``rem / 2**s``.
    ``r`` holds random bits (SR only).  ``inf_code``/``nan_code`` are -1
    when the format lacks them; ``saturate_overflow`` is 1 for saturating
    conversion and for formats with neither inf nor NaN.
    """
    u = np.float64(x).view(np.int64)
    neg = u < 0
    ab = u & _ABS
    is_nan = ab > _INF_BITS
    is_inf = ab == _INF_BITS
    is_zero = ab == 0
    ef = ab >> 52
    e_eff = (ef if ef > 1 else np.int64(1)) - 1023
    sig = (ab & _MANT) | (_IMPLICIT if ef != 0 else np.int64(0))

    E = e_eff if e_eff > emin else emin
    E = E if E < emax + 1 else emax + 1
    s = E - mbits - e_eff + 52
    s = s if s > 0 else np.int64(0)
    sc = s if s < 63 else np.int64(63)
    n = sig >> sc
    rem = sig - (n << sc)
    half = np.int64(1) << (sc - 1 if sc > 0 else np.int64(0))

    if subnormals:
        cn = ((E - emin) << mbits) + n
    else:
        cn = ((E - emin) << mbits) + n - (np.int64(1) << mbits)
    odd = (cn & 1) == 1

    if mode == RNE:
        inc = (rem > half) | ((rem == half) & (rem != 0) & odd)
    elif mode == RNA:
        inc = (rem >= half) & (rem != 0)
    elif mode == RTZ:
        inc = False
    elif mode == RUP:
        inc = (rem != 0) & (not neg)
    elif mode == RDN:
        inc = (rem != 0) & neg
    elif mode == RTO:
        inc = (rem != 0) & (not odd)
    else:  # SR: t = floor(frac * 2**sr_bits), compared with sr_bits random bits
        d = s - sr_bits
        t = (rem >> (d if d < 63 else np.int64(63))) if d >= 0 else (rem << (-d))
        rnd = np.int64(r >> np.uint64(64 - sr_bits))
        inc = t + rnd >= (np.int64(1) << sr_bits)

    m = n + np.int64(inc)
    c = cn + np.int64(inc)
    val = _magic_float(m & _MANT_AND_IMPLICIT2) * _pow2(E - mbits)

    if flush and subnormals and c < (np.int64(1) << mbits):
        c = np.int64(0)
        val = 0.0

    # ---- overflow and specials (selects) ----------------------------
    over = (c > max_code) | is_inf
    dir_max = (mode == RTZ) | (mode == RTO) | ((mode == RUP) & neg) | ((mode == RDN) & (not neg))
    to_max = (saturate_overflow == 1) | (dir_max & (not is_inf))
    if over:
        if to_max:
            c = max_code
            val = max_val
        elif inf_code >= 0:
            c = inf_code
            val = np.inf
        else:
            c = nan_code
            val = np.nan
    if not subnormals:
        # no zero (E8M0): positive underflow gives the smallest value, 0 gives NaN
        if c < 0:
            c = np.int64(0)
            val = _pow2(emin)
        if is_zero:
            c = nan_code
            val = np.nan
    if (neg & (not signed) & (not is_zero)) | is_nan:
        c = nan_code
        val = np.nan
    if neg & signed:
        val = -val
        if (c != 0 or has_neg_zero) and not (c == sign_mask):
            c = c | sign_mask
    if subnormals and (not has_neg_zero) and c == 0:
        val = 0.0
    return val, c


@njit(inline="always")
def _loop(x, out, want_code, mode, p, key):
    mbits, emin, emax, max_code, max_val, sign_mask, signed, has_neg_zero, subnormals, inf_code, \
        nan_code, saturate_overflow, flush, sr_bits = p
    for i in prange(x.size):
        r = random_bits(key, i) if mode == SR else np.uint64(0)
        v, c = round_one(x[i], r, mode, mbits, emin, emax, max_code, max_val, sign_mask, signed,
                         has_neg_zero, subnormals, inf_code, nan_code, saturate_overflow, flush, sr_bits)
        if want_code:
            out[i] = c
        else:
            out[i] = v


# One thin entry point per (mode, output): the mode reaches the inlined
# mechanism as a compile-time constant, so each loop is branch-free.
@njit(parallel=True, cache=True)
def _rne(x, out, want_code, p, key):
    _loop(x, out, want_code, RNE, p, key)


@njit(parallel=True, cache=True)
def _rna(x, out, want_code, p, key):
    _loop(x, out, want_code, RNA, p, key)


@njit(parallel=True, cache=True)
def _rtz(x, out, want_code, p, key):
    _loop(x, out, want_code, RTZ, p, key)


@njit(parallel=True, cache=True)
def _rup(x, out, want_code, p, key):
    _loop(x, out, want_code, RUP, p, key)


@njit(parallel=True, cache=True)
def _rdn(x, out, want_code, p, key):
    _loop(x, out, want_code, RDN, p, key)


@njit(parallel=True, cache=True)
def _rto(x, out, want_code, p, key):
    _loop(x, out, want_code, RTO, p, key)


@njit(parallel=True, cache=True)
def _sr(x, out, want_code, p, key):
    _loop(x, out, want_code, SR, p, key)


KERNELS = {RNE: _rne, RNA: _rna, RTZ: _rtz, RUP: _rup, RDN: _rdn, RTO: _rto, SR: _sr}


@njit(parallel=True, cache=True)
def decode_kernel(codes, table, out):
    n = codes.size
    for i in prange(n):
        out[i] = table[codes[i]]
