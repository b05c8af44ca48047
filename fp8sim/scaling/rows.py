"""The row kernel of quantization: one row's codes, tile by tile, each the single rounding of the exact
quotient ``x / scale`` (and, when measuring, each tile's amax and scale first).

:func:`round_row` is the serial function that every parallel driver (:mod:`fp8sim.scaling._kernels`)
calls once per row; :func:`amax_seg` and :func:`top32` measure a tile's amax from its bit patterns.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ..intrinsics import fdiv, fma32, fma64, lshr32, prefetch_r, prefetch_w
from ..rounding import SR, random_bits, round_one
from ..rounding.fast8 import rne_code32, to_odd, to_odd32
from .policy import E8M0, FLOOR, FP32, POW2, odd64, pow2, scale_fp32, scale_one

__all__ = ["round_row", "amax_seg", "top32"]


# =====================================================================
# a tile's amax
# =====================================================================
@njit(inline="always")
def top32(xi, lo, hi):
    """The largest magnitude bit pattern of the float32 patterns xi[lo:hi] (an int32 max reduction)."""
    top = np.int32(0)
    for j in range(np.uint64(lo), np.uint64(hi)):  # unsigned: no wraparound check, so it vectorizes
        top = max(top, np.int32(xi[j] & np.int32(0x7FFFFFFF)))  # int32 casts keep the lanes 32-bit
    return top


@njit(inline="always")
def _amax_bits32(xi, lo, hi, ignore_nan):
    """amax of float32 bit patterns xi[lo:hi]: an integer max reduction (it vectorizes); inf skipped,
    NaN gives NaN unless ignore_nan.  One pass takes the max of every magnitude pattern; only a tile that
    holds an inf or NaN (a max at or above inf's pattern) is scanned again for its largest finite one."""
    top = top32(xi, lo, hi)
    if top < np.int32(0x7F800000):
        return np.float64(np.int32(top).view(np.float32))
    if top > np.int32(0x7F800000) and not ignore_nan:
        return np.nan
    fin = np.int32(0)
    for j in range(np.uint64(lo), np.uint64(hi)):
        b = np.int32(xi[j] & np.int32(0x7FFFFFFF))
        fin = max(fin, b if b < np.int32(0x7F800000) else np.int32(0))
    return np.float64(np.int32(fin).view(np.float32))


@njit(inline="always")
def _amax_bits64(xi, lo, hi, ignore_nan):
    """As _amax_bits32 for float64 bit patterns."""
    fin = np.int64(0)
    top = np.int64(0)
    for j in range(np.uint64(lo), np.uint64(hi)):
        b = xi[j] & np.int64(0x7FFFFFFFFFFFFFFF)
        top = max(top, b)
        fin = max(fin, b if b < np.int64(0x7FF0000000000000) else np.int64(0))
    if top > np.int64(0x7FF0000000000000) and not ignore_nan:
        return np.nan
    return np.int64(fin).view(np.float64)


@njit(inline="always")
def amax_seg(xi, lo, hi, ignore_nan):
    """amax of the float32 or float64 bit patterns xi[lo:hi] (inf skipped; NaN gives NaN unless ignore_nan)."""
    if xi.itemsize == 4:
        return _amax_bits32(xi, lo, hi, ignore_nan)
    return _amax_bits64(xi, lo, hi, ignore_nan)


# =====================================================================
# the general path: float64 quotients rounded to odd, then the bit-level kernel
# =====================================================================
_Q_LO, _Q_HI = 2.0**-960, 2.0**960  # the quotient's residual is exact (and nothing underflows) between these


@njit(inline="always")
def _quot_odd(xv, d, inv, is_pow2):
    """The quotient ``xv / d`` rounded to odd at 53 bits (from its exact residual, an FMA): rounding it to
    a format of at most 51 significant bits is the single rounding of the exact quotient in every mode.
    Also returns whether that holds: not where ``|xv|`` or the quotient is below 2**-960 (there the
    residual may be inexact and the quotient may have lost bits to underflow; :func:`_quot_odd_scaled`
    handles those).  ``inv = 1/d`` and ``is_pow2`` (``d`` is a power of two) let a power-of-two scale
    multiply.  ``d`` must lie in [2**-960, 2**960]."""
    q = xv * inv if is_pow2 else xv / d
    r = fma64(q, d, -xv)  # (0 for a power of two, unless the product overflowed to inf)
    aq = abs(q)
    ax = abs(xv)
    ok = ((aq >= _Q_LO) & (ax >= _Q_LO)) | (ax == 0.0) | (not (ax < np.inf))
    return odd64(q, r), ok


@njit
def _quot_odd_scaled(xv, d):
    """``(q, k)``: the quotient ``xv * 2**k / d`` rounded to odd, with ``xv * 2**k`` (exact) near ``d`` so
    that the quotient is near 1: rounding ``q`` to a format whose exponent range is shifted by ``k`` is the
    single rounding of ``xv / d`` where the plain quotient underflows (finite nonzero ``xv``, ``d`` in
    [2**-960, 2**960])."""
    mx, ex = math.frexp(xv)
    md, ed = math.frexp(d)
    k = ed - ex
    xs = math.ldexp(xv, k)
    q = xs / d
    return odd64(q, fma64(q, d, -xs)), k


@njit(inline="always")
def _round_shifted(q, r, mode, p, k):
    """The code of ``q`` rounded by the bit-level kernel (random bits ``r`` for SR) to the format ``p``
    with its exponent range shifted by ``k``: 0 for the format itself, else the shift of a quotient formed
    with the exponent range shifted (:func:`_quot_odd_scaled`; only the code is used)."""
    v, c = round_one(q, r, mode, p, k)
    return c


@njit(cache=True)  # not inlined: the kernels share one compilation of the general path
def _round_seg_general(xs, cs, d, mode, p, key, base):
    """The general path of :func:`round_row`: the float64 quotient rounded to odd (:func:`_quot_odd`, or
    :func:`_quot_odd_scaled` where it underflows), rounded by the bit-level kernel."""
    n = xs.size
    m, ex = math.frexp(d)
    is_pow2 = m == 0.5
    inv = 1.0 / d
    # The quotient rounded to odd: the kernel's rounding of it is the single rounding of the exact x / d
    # in every mode.  Elements whose quotient underflows (tiny x, huge d) are redone in a second pass with
    # the exponent range shifted.
    d_ok = (d >= _Q_LO) & (d <= _Q_HI)
    hard = False
    for j in range(n):
        r = random_bits(key, base + j) if mode == SR else np.uint64(0)
        xv = np.float64(xs[j])
        if d_ok:
            q, ok = _quot_odd(xv, d, inv, is_pow2)
            hard = hard | (not ok)
        else:
            q = xv / d
        cs[j] = _round_shifted(q, r, mode, p, 0)
    if not hard:
        return
    for j in range(n):
        xv = np.float64(xs[j])
        q, ok = _quot_odd(xv, d, inv, is_pow2)
        if ok:
            continue
        q, k = _quot_odd_scaled(xv, d)
        r = random_bits(key, base + j) if mode == SR else np.uint64(0)
        cs[j] = _round_shifted(q, r, mode, p, k)


# =====================================================================
# the float32 paths (RNE into 8-bit formats, :mod:`fp8sim.rounding.fast8`)
# =====================================================================
@njit(inline="always")
def _div_tile(xrow, crow, lo, hi, d32, fp):
    """Codes of xrow[lo:hi] / d32: the float32 quotient re-rounded to odd with its exact float32
    residual ``q*d - x`` (:func:`~fp8sim.rounding.fast8.fast_params` says for which scales it is exact)."""
    for j in range(np.uint64(lo), np.uint64(hi)):
        xv = np.float32(xrow[j])
        q = xv / d32
        crow[j] = rne_code32(to_odd32(q, fma32(q, d32, -xv)), fp)


@njit(inline="always")
def _pow2_run(xrow, crow, ie, lo, hi, clo, fp, nan):
    """Codes of xrow[lo:hi] times each element's exact reciprocal ``ie[j - clo]`` (a run of tiles with
    power-of-two scales: one loop, no per-tile set-up)."""
    for j in range(np.uint64(lo), np.uint64(hi)):
        crow[j] = rne_code32(np.float32(xrow[j]) * ie[j - np.uint64(clo)], fp, nan)


@njit(inline="always")
def _mul_tile(xrow, crow, lo, hi, inv, fp, sub_lim, nan):
    """Codes of xrow[lo:hi] times the reciprocal ``inv`` of a float32 scale that is not a power of two:
    ``q1 = RN(x * RN(1/d))`` is within 2 ulps of ``x/d``, so RNE at the format's precision gives the
    single rounding unless a midpoint of the format's grid is that close to ``q1`` (its bits below the
    last kept one within 4 of 100..0) or ``q1`` is in the subnormal range.  Returns whether an element
    was that close (the caller then redoes the tile by division)."""
    lo_win, smask = fp[9], fp[10]
    hard = np.int32(0)  # min of int32 masks: 32-bit lanes (| would widen them to 64 bits)
    for j in range(np.uint64(lo), np.uint64(hi)):
        q1 = np.float32(xrow[j]) * inv
        crow[j] = rne_code32(q1, fp, nan)
        a = np.int32(np.float32(q1).view(np.int32) & np.int32(0x7FFFFFFF))
        near = np.int32(np.int32(a - lo_win) & smask) <= np.int32(8)
        sub = np.int32(a + np.int32(0x7FFFFFFF)) < sub_lim  # 0 < |q1| < 2**emin: 1 moved to INT32_MIN
        hard = min(hard, np.int32(-1) if near | sub else np.int32(0))
    return hard != np.int32(0)


# round_row's paths for a tile
_P_POW2, _P_MUL, _P_DIV, _P_DIV64, _P_NAN, _P_OTHER = 0, 1, 2, 3, 4, 5


@njit(inline="always")
def _normal_scale_path(sb, fma_min):
    """The path of a tile whose float32 scale is a finite normal with bit pattern ``sb``: a power of two;
    else the multiply path where the float32 residual is exact (``sb >= fma_min``, :func:`~fp8sim.rounding.fast8.fast_params`)
    and the scale is below 2**125; else division (selects only: it vectorizes)."""
    pth = np.int32(_P_MUL) if sb < np.int32(0x7E000000) else np.int32(_P_DIV)
    pth = pth if sb >= fma_min else np.int32(_P_DIV64)
    return np.int32(_P_POW2) if np.int32(sb & np.int32(0x7FFFFF)) == np.int32(0) else pth


# Measured rows (1xN tiles, MX) prefetch the input and code lines _PREFETCH elements (8 KB of float32,
# two chunks) ahead of the tile being rounded, a tile's worth at a time, spread over the row (into the
# next row at a row's end; a prefetch never faults): on the 2-core benchmark machine the hardware
# prefetcher alone left these rows waiting on memory for a fifth to a quarter of the time (1x128) and
# the prefetch took that away.  Where in the loop it goes was measured: prefetching a whole chunk at
# once gained less, the rows of NxN bands (read from cache) and 4096 or more ahead gained nothing or
# lost (benchmarks/RESULTS.md).
_PREFETCH = 2048


# =====================================================================
# one row
# =====================================================================
@njit(cache=True)
def round_row(
    xrow,
    crow,
    bn,
    srow,
    glob,
    mode,
    p,
    key,
    base,
    tab,
    use_tab,
    fp,
    use_fast,
    measure,
    xirow,
    arow,
    sp,
    ignore_nan,
    nan_free,
    pfd,
):
    """Codes of one row: tile ``jb`` (elements ``lo = jb*bn`` to ``hi = (jb+1)*bn``, the last one ragged)
    divided by ``d = srow[jb] * glob``, each the single rounding of the exact quotient.

    ``pfd`` > 0: the multiply loop prefetches the input ``pfd`` elements ahead of each tile (the rows of
    the next band, for :func:`~fp8sim.scaling._kernels.fused_bands32`).

    ``nan_free``: no element reaches the fast loops as NaN (the caller measured every block's amax with
    NaN propagating, so a block with a NaN has a NaN scale and is filled), which drops their NaN test.

    With ``measure``, the scales are not given but computed here: each tile's amax (from ``xirow``, the
    row's bit patterns) goes to ``arow`` and its scale (policy ``sp``) to ``srow``.  The row is worked
    through in chunks of about 1024 elements, each measured and then rounded while it is in L1; for
    float32 tiles with fp32 or MX scales the measuring is vectorized across the chunk's tiles.

    A serial function that the parallel kernels call once per row (compiled once).  The tile loop's body
    is written out here rather than in an inlined helper: passing the row arrays to one costs reference
    counting per tile, more than a 32-element tile's arithmetic.

    Paths, fastest first:

    * ``use_fast`` (float32 input, RNE, a format :func:`~fp8sim.rounding.fast8.fast_params`
      accepts) and a float32 normal scale: for a power-of-two scale the
      float32 product with its reciprocal is exact; otherwise the product
      with the reciprocal is used where it provably rounds like the exact
      quotient, else the float32 quotient is re-rounded to odd with its
      exact residual (below); then :func:`rne_code32` computes the code
      arithmetically.
    * ``use_tab`` (float32 input, deterministic mode, an element format with
      <= 6 mantissa bits, ``tab`` = that rounding's memo table from
      :mod:`fp8sim.rounding`) and a float32 scale: the quotient is formed in
      float32, its exact residual ``q*d - x`` (exact in float64) tells
      whether and in which direction it was rounded, and the quotient is
      re-rounded to odd (toward zero, lowest bit set when inexact).  Round to
      odd at 24 bits followed by any rounding at <= 7 bits equals that single
      rounding of the exact quotient; the memo table then gives the code.
    * otherwise the float64 quotient (:func:`_round_seg_general`), by
      multiplying with the reciprocal for a power-of-two scale, else by
      division re-rounded to odd with its exact FMA residual; quotients that
      underflow float64 are redone with the exponent range shifted, so every
      mode rounds the exact quotient once.
    """
    N = xrow.size
    nt = srow.size
    # tiles per chunk: about 1024 elements (4 KB of float32), measured and then rounded while in L1
    tpc = max(1, 1024 // bn)
    nan_code = p[10]  # the rest of p goes to the general path
    e0_bits = fp[0]
    sub_lim = np.int32(e0_bits + np.int32(0x7FFFFFFF))  # see the multiply path
    path = np.empty(tpc, dtype=np.int32)
    dv = np.empty(tpc, dtype=np.float32)  # the float32 scale
    iv = np.empty(tpc, dtype=np.float32)  # its reciprocal
    ie = np.empty(tpc * bn, dtype=np.float32)  # the reciprocal of each element's power-of-two scale
    tops = np.empty(tpc, dtype=np.int32)  # each tile's largest magnitude bit pattern
    # Measuring float32 tiles for fp32 scales (vkind 1) or OCP MX scales (E8M0 or power of two, FLOOR;
    # vkind 2) is vectorized across the chunk's tiles: one loop takes every tile's largest magnitude
    # pattern, the next computes all their scales, reciprocals and paths at once (the per-tile scalar
    # work, and its latency chain amax -> scale -> reciprocal, cost as much as a 128-element tile's
    # rounding otherwise).  A chunk with an inf or NaN, or (MX) an amax outside the normal range or a
    # scale the format clamps, takes the per-tile path below instead.  Given float32 scales (vkind 3)
    # are classified in one vectorized loop too.
    vkind = 0
    if measure and use_fast and xirow.itemsize == 4 and glob == 1.0:
        if sp[0] == FP32:
            vkind = 1
        elif (sp[0] == POW2 or sp[0] == E8M0) and sp[1] == FLOOR:
            vkind = 2
    elif not measure and use_fast and glob == 1.0:
        vkind = 3
    fmax, m2, smin, smax = sp[2], pow2(sp[5]), sp[6], sp[7]
    fma_min = fp[8]
    # MX: the scale 2**(floor(log2 amax) - emax_elem + margin) is the amax's exponent field shifted;
    # it is used as it is where it lies in [2**-126, 2**125] and in the scale format's range
    mx_off = np.int32(127 + sp[3] - sp[5])  # biased exponent minus this is the scale's exponent
    mx_lo = np.int32(max(-126, sp[8]))
    mx_hi = np.int32(min(125, sp[9]))
    for c0 in range(0, nt, tpc):
        c1 = min(c0 + tpc, nt)
        n = c1 - c0
        # Phase 1: each tile's amax and scale (with ``measure``), path and float32 constants.
        fast1 = False
        if vkind == 1 or vkind == 2:
            for t in range(n):
                lo = (c0 + t) * bn
                hi = min(lo + bn, N)
                tops[t] = top32(xirow, lo, hi)
                if vkind == 2:  # (see _PREFETCH)
                    for k in range(lo + _PREFETCH, hi + _PREFETCH, 16):
                        prefetch_r(xrow, np.int64(k))
                    for k in range(lo + _PREFETCH, hi + _PREFETCH, 64):
                        prefetch_w(crow, np.int64(k))
        if vkind != 0:
            bad = np.int32(0)  # min of int32 flags: 32-bit lanes
            if vkind == 1:
                for t in range(np.uint64(n)):  # vectorizes (no branch: selects)
                    top = tops[t]
                    s32 = np.float32(scale_fp32(np.int32(top).view(np.float32), fmax, m2, smin, smax))
                    sb = np.float32(s32).view(np.int32)
                    arow[np.uint64(c0) + t] = np.int32(top).view(np.float32)
                    srow[np.uint64(c0) + t] = s32
                    dv[t] = s32
                    iv[t] = fdiv(np.float32(1.0), s32)  # exact for a power of two
                    path[t] = _normal_scale_path(sb, fma_min)  # s32 is a finite normal (clamped)
                    bad = min(bad, np.int32(-1) if top >= np.int32(0x7F800000) else np.int32(0))
            elif vkind == 3:
                for t in range(np.uint64(n)):  # vectorizes
                    s32 = np.float32(srow[np.uint64(c0) + t])
                    sb = np.float32(s32).view(np.int32)
                    dv[t] = s32
                    iv[t] = fdiv(np.float32(1.0), s32)
                    normal = (sb >= np.int32(0x00800000)) & (sb < np.int32(0x7F800000))
                    pth = _normal_scale_path(sb, fma_min)
                    pth = pth if normal else np.int32(_P_OTHER)
                    path[t] = np.int32(_P_NAN) if s32 != s32 else pth
            else:
                for t in range(np.uint64(n)):  # vectorizes
                    top = tops[t]
                    e = np.int32(lshr32(top, np.int32(23)) - mx_off)
                    sbits = np.int32(np.int32(e + np.int32(127)) << np.int32(23))
                    arow[np.uint64(c0) + t] = np.int32(top).view(np.float32)
                    srow[np.uint64(c0) + t] = np.int32(sbits).view(np.float32)
                    dv[t] = np.int32(sbits).view(np.float32)
                    iv[t] = np.int32(np.int32(0x7F000000) - sbits).view(np.float32)
                    path[t] = np.int32(_P_POW2)
                    ok = (top >= np.int32(0x00800000)) & (top < np.int32(0x7F800000)) & (e >= mx_lo) & (e <= mx_hi)
                    bad = min(bad, np.int32(0) if ok else np.int32(-1))
            if bad == np.int32(0):
                fast1 = True
                for t in range(n):
                    if path[t] == _P_POW2:
                        inv = iv[t]
                        for j in range(np.uint64(t * bn), np.uint64(min(t * bn + bn, N - c0 * bn))):
                            ie[j] = inv  # each element's reciprocal: the run's loop has no per-tile set-up
        for jb in range(c0, c1 if not fast1 else c0):  # per tile, scalar
            t = jb - c0
            if measure:
                a = amax_seg(xirow, jb * bn, min(jb * bn + bn, N), ignore_nan)
                arow[jb] = a
                srow[jb] = scale_one(a, glob, sp)
            d = np.float64(srow[jb]) * glob
            d32 = np.float32(d)
            dv[t] = d32
            sb = np.float32(d32).view(np.int32)
            if use_fast and np.int32(sb - np.int32(0x00800000)) < np.int32(0x7E000000) and sb & 0x7FFFFF == 0:
                # a power of two in [2**-126, 2**125]: its reciprocal, exactly, from the exponent field
                iv[t] = np.int32(np.int32(0x7F000000) - sb).view(np.float32)
            else:
                iv[t] = np.float32(1.0) / d32
            if d != d:
                path[t] = _P_NAN
            elif use_fast and np.float64(d32) == d and d32 >= np.float32(1.1754943508222875e-38) and d32 < np.inf:
                if np.int32(np.float32(d32).view(np.int32) & np.int32(0x7FFFFF)) == np.int32(0):
                    path[t] = _P_POW2
                    inv = iv[t]
                    for j in range(np.uint64(t * bn), np.uint64(min(t * bn + bn, N - c0 * bn))):
                        ie[j] = inv  # each element's reciprocal: the run's loop has no per-tile set-up
                elif np.float32(d32).view(np.int32) >= fma_min:  # the float32 residual is exact (fast8.fast_params)
                    path[t] = _P_MUL if d32 < np.float32(4.2535295865117308e37) else _P_DIV  # 2**125
                else:
                    path[t] = _P_DIV64
            else:
                path[t] = _P_OTHER
        # Phase 2: the tiles.  Runs of power-of-two and multiply-path tiles go through tight loops that keep
        # their constants in registers.  The NaN fill and the fast paths index the row with unsigned integers
        # over range(lo, hi): no bounds wraparound (so the loops vectorize) and no tile slices (whose reference
        # counting would cost more than a 32-element tile's arithmetic).  The table and general paths work on
        # slices.
        jb = c0
        while jb < c1:
            kind = path[jb - c0]
            if kind == _P_POW2:  # the product with the exact reciprocal, over a run of such tiles at once
                je = jb + 1
                while je < c1 and path[je - c0] == _P_POW2:
                    je += 1
                if nan_free:
                    _pow2_run(xrow, crow, ie, jb * bn, min(je * bn, N), c0 * bn, fp, False)
                else:
                    _pow2_run(xrow, crow, ie, jb * bn, min(je * bn, N), c0 * bn, fp, True)
                jb = je
                continue
            if kind == _P_MUL:  # the product with the reciprocal, checked (_mul_tile); rare tiles by division
                while True:
                    lo = jb * bn
                    hi = min(lo + bn, N)
                    if measure and bn >= 128:  # (see _PREFETCH)
                        for k in range(lo + _PREFETCH, hi + _PREFETCH, 16):
                            prefetch_r(xrow, np.int64(k))
                        for k in range(lo + _PREFETCH, hi + _PREFETCH, 64):
                            prefetch_w(crow, np.int64(k))
                    elif pfd > 0:
                        for k in range(lo + pfd, hi + pfd, 16):
                            prefetch_r(xrow, np.int64(k))
                    if nan_free:
                        hard = _mul_tile(xrow, crow, lo, hi, iv[jb - c0], fp, sub_lim, False)
                    else:
                        hard = _mul_tile(xrow, crow, lo, hi, iv[jb - c0], fp, sub_lim, True)
                    if hard:
                        _div_tile(xrow, crow, lo, hi, dv[jb - c0], fp)
                    jb += 1
                    if jb == c1 or path[jb - c0] != _P_MUL:
                        break
                continue
            lo = jb * bn
            hi = min(lo + bn, N)
            ulo = np.uint64(lo)
            uhi = np.uint64(hi)
            d32 = dv[jb - c0]
            jb += 1
            if kind == _P_DIV:
                _div_tile(xrow, crow, lo, hi, d32, fp)
                continue
            if kind == _P_DIV64:  # as _P_DIV with the float64 residual (exact where the float32 one may not be)
                d64 = np.float64(d32)
                for j in range(ulo, uhi):
                    xv = np.float32(xrow[j])
                    q = xv / d32
                    crow[j] = rne_code32(to_odd(q, np.float64(q) * d64 - np.float64(xv), 0.0), fp)
                continue
            if kind == _P_NAN:  # NaN scale: the whole block is NaN (elements get the NaN code, or 0 without one)
                fill = nan_code if nan_code >= 0 else 0
                for j in range(ulo, uhi):
                    crow[j] = fill
                continue
            d = np.float64(srow[jb - 1]) * glob
            xs = xrow[lo:hi]
            cs = crow[lo:hi]
            n = xs.size
            if use_tab and np.float64(d32) == d and d32 >= np.float32(1.1754943508222875e-38) and d32 < np.inf:
                d64 = np.float64(d32)
                buf = np.empty(n, dtype=np.uint32)
                for j in range(n):  # vectorizes: quotient, residual, round to odd
                    xv = np.float32(xs[j])
                    q = xv / d32
                    r = np.float64(q) * d64 - np.float64(xv)  # exact: q*d has <= 48 significant bits
                    b = np.int64(np.float32(q).view(np.int32))
                    inexact = r != 0.0
                    toward_zero = inexact & (q != np.float32(0.0)) & ((r > 0.0) == (q > np.float32(0.0)))
                    b = (b - np.int64(toward_zero)) | np.int64(inexact)
                    if not (abs(xv) < np.float32(np.inf)):  # inf / NaN elements keep their own pattern
                        b = np.int64(xv.view(np.int32))
                    buf[j] = np.uint32(b & np.int64(0xFFFFFFFF))
                for j in range(n):  # table lookups
                    u = buf[j]
                    cs[j] = tab[np.int64((u & np.uint32(0xFFFF)) != np.uint32(0)), np.int64(u >> np.uint32(16))]
                continue
            _round_seg_general(xs, cs, d, mode, p, key, base + lo)
