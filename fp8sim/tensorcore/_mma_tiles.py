"""The one mechanism of the tensor-core kernels beyond Hopper (:mod:`fp8sim.tensorcore._mma_kernels`).

Every kernel there is the same loop: a task is a tile of :data:`MB` rows by :data:`NB` columns
(:func:`tile`), its fp32 accumulator starts from C (:func:`load_c`), each block of ``L`` products
is one step per row of the tile, and after each block the chain promotes into an fp32 total every
``promote`` elements (:func:`chain_step`); the tile is stored at the end (:func:`store`).  A row's
step is built from the parts here, parametrized by the datapath:

* :func:`lane_max`: the largest nominal product exponent over a *lane*, a strided range of k (the
  whole block for the fused datapaths, the even or the odd k for CDNA3's);
* :func:`lane_sum` (fast path, float32 products summed in int32) and :func:`lane_sum_f64`
  (fallback path, float64): the lane's products aligned by a per-column power of two and cut;
* :func:`block_exp` / :func:`factor32`: a block's largest exponent (with the accumulator's and the
  zero floor) and the fast path's float32 factor;
* :func:`round_row`: C's aligned term plus the sums (:func:`block_sum`), rounded to the output.

The loops run over a tile's columns on contiguous rows, without calls or temporaries, indexed
from 0 (or with unsigned indices: a signed offset would make numba wrap negative indices, which
stops LLVM from vectorizing), exponents in int32 (8 vector lanes instead of int64's 4), powers of
two and exponents as bit patterns (:mod:`fp8sim.tensorcore.bitcast`).  Why each step is exact is
in :mod:`fp8sim.tensorcore._mma_kernels`.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .bitcast import f32_bits, f32_of, f64_bits, f64_of, pow2

__all__ = [
    "NONE16",
    "NONE32",
    "REAL",
    "ROUND_CODES",
    "MB",
    "NB",
    "COLUMNS_PER_TASK",
    "tiles",
    "tile",
    "load_c",
    "chain_step",
    "store",
    "lane_max",
    "lane_sum",
    "lane_sum_f64",
    "acc_exponent",
    "block_exp",
    "factor32",
    "block_sum",
    "round_row",
]

#: exponent of an element that has none (zero, inf, NaN): never the largest (int16, and its sums)
NONE16 = -10000
#: "no exponent" in int32 arithmetic (below any real exponent, far from overflow)
NONE32 = -(1 << 20)
REAL = -5000  #: exponents above this are real

_RNE, _RTZ, _RUP, _RDN = 0, 2, 3, 4  # fp8sim.rounding.RoundMode values (checked by scaled_mma)
ROUND_CODES = (_RNE, _RTZ, _RUP, _RDN)  #: the rounding numbers above, for the check in scaled_mma

MB = 8  #: rows per task
NB = 512  #: columns per task
COLUMNS_PER_TASK = NB  #: columns of a task: the granularity of B's fallback-path flags
_MASK63 = np.int64(0x7FFFFFFFFFFFFFFF)
_KEEP24 = np.int64(-(1 << 29))  # a float64 pattern's sign, exponent and top 23 fraction bits
_TINY = 2.0**-126  # float32's smallest normal
_P149 = 2.0**149
_M149 = 2.0**-149  # float32's smallest subnormal
_BIG = 2.0**128
_F32_MAX = float(np.finfo(np.float32).max)


# ------------------------------------------------------------------ the tile loop
@njit(cache=True, inline="always")
def tiles(M, N):
    """(row tiles, column tiles) of an (M, N) output."""
    return (M + MB - 1) // MB, (N + NB - 1) // NB


@njit(cache=True, inline="always")
def tile(t, nnt, M, N):
    """(first row, rows, first column, columns, column tile) of task ``t`` (``nnt`` column tiles)."""
    mt = t // nnt
    nt = t % nnt
    i0 = mt * MB
    n0 = nt * NB
    return i0, min(M, i0 + MB) - i0, n0, min(N, n0 + NB) - n0, nt


@njit(cache=True)
def load_c(c, acc, tot, i0, rows, n0, nn, promote):
    """The tile's accumulator ``acc`` from C (float64 values, to float32); with promotion C starts
    the total ``tot`` and the accumulator 0."""
    for ii in range(rows):
        cr = c[i0 + ii, n0 : n0 + nn]
        for n in range(nn):
            x = np.float32(cr[n])
            acc[ii, n] = np.float32(0.0) if promote > 0 else x
            tot[ii, n] = x if promote > 0 else np.float32(0.0)


@njit(cache=True)
def chain_step(acc, tot, cnt, L, promote, last, rows, nn):
    """After a block of ``L`` elements (``cnt`` elements since the last promotion): every
    ``promote`` elements, and after the ``last`` block, the accumulator is added into the fp32 total
    (RNE) and restarts from 0.  Returns the new count."""
    cnt += L
    if promote > 0 and (cnt == promote or last):
        for ii in range(rows):
            for n in range(nn):
                tot[ii, n] = np.float32(tot[ii, n] + acc[ii, n])
                acc[ii, n] = 0.0
        cnt = 0
    return cnt


@njit(cache=True)
def store(out, acc, tot, promote, i0, rows, n0, nn):
    """The tile's result (the total with promotion, else the accumulator) into ``out`` (float64)."""
    for ii in range(rows):
        outr = out[i0 + ii, n0 : n0 + nn]
        for n in range(nn):
            outr[n] = np.float64(tot[ii, n] if promote > 0 else acc[ii, n])


# ------------------------------------------------------------------ lanes
@njit(cache=True)
def lane_max(pm, ae, be, i, k0, k1, ks, n0, nn):
    """``pm[n] = max(ae[i, k] + be[k, n0 + n])`` over ``k in range(k0, k1, ks)`` (int16; NONE16 when
    no product has an exponent)."""
    for n in range(nn):
        pm[n] = NONE16
    u0 = np.uint64(n0)
    for k in range(k0, k1, ks):
        ea = ae[i, k]
        if ea == NONE16:
            continue
        for n in range(np.uint64(nn)):
            pm[n] = max(pm[n], np.int16(be[k, u0 + n] + ea))


@njit(cache=True)
def lane_sum(S, av, bv, sc, i, k0, k1, ks, n0, nn, rd):
    """Fast path: ``S[n] = sum int32(av[i, k] * bv[k, n0 + n] * sc[n])`` over the lane (float32
    products; ``rd``: floor before the conversion, else its truncation toward zero)."""
    for n in range(nn):
        S[n] = 0
    u0 = np.uint64(n0)
    for k in range(k0, k1, ks):
        va = np.float32(av[i, k])
        if va == 0.0:
            continue
        if rd:
            for n in range(np.uint64(nn)):
                S[n] += np.int32(np.floor(va * bv[k, u0 + n] * sc[n]))
        else:
            for n in range(np.uint64(nn)):
                S[n] += np.int32(va * bv[k, u0 + n] * sc[n])


@njit(cache=True)
def lane_sum_f64(Sf, av, bv, sga_i, sgb, sb, scp, i, k0, k1, ks, n0, nn, rd, unit, bsp):
    """Fallback path: ``Sf[n] = sum cut(av[i, k] * sga_i * bv[k, n0 + n] * sgb[sb, n0 + n] * scp[n])``
    over the lane in float64 (``cut``: trunc, or floor with ``rd``; ``unit``: every significand is 1,
    ``sgb`` unread).  A zero A element is skipped unless the column tile holds inf/NaN (``bsp``)."""
    for n in range(nn):
        Sf[n] = 0.0
    u0 = np.uint64(n0)
    for k in range(k0, k1, ks):
        va = np.float64(av[i, k]) * sga_i
        if va == 0.0 and not bsp:
            continue
        if rd:
            for n in range(np.uint64(nn)):
                Sf[n] += np.floor(va * np.float64(bv[k, u0 + n]) * sgb[sb, u0 + n] * scp[n])
        elif unit:
            for n in range(np.uint64(nn)):
                Sf[n] += np.trunc(va * np.float64(bv[k, u0 + n]) * scp[n])
        else:
            for n in range(np.uint64(nn)):
                Sf[n] += np.trunc(va * np.float64(bv[k, u0 + n]) * sgb[sb, u0 + n] * scp[n])


# ------------------------------------------------------------------ exponents
@njit(cache=True, inline="always")
def acc_exponent(a, emin):
    """Nominal exponent of the float32 accumulator ``a`` (clamped at the int32 ``emin``; NONE32
    for 0, inf, NaN), in int32."""
    ab = f32_bits(a)
    ef = np.int32(ab >> np.int32(23)) & np.int32(0xFF)
    ec = max(np.int32(ef - np.int32(127)), emin)
    real = ef != np.int32(255) and (ab & np.int32(0x7FFFFFFF)) != np.int32(0)
    return ec if real else np.int32(NONE32)


@njit(cache=True, inline="always")
def block_exp(pe, xs, a, zexp, emin):
    """The largest exponent of a block (int32): its products' ``pe + xs`` (``pe`` NONE16 for none,
    ``xs`` the scales' exponents), the accumulator ``a``'s and the floor ``zexp`` (int32)."""
    e = max(np.int32(pe + xs) if pe > np.int32(REAL) else np.int32(NONE32), zexp)
    return max(e, acc_exponent(a, emin))


@njit(cache=True, inline="always")
def factor32(e, xs, F):
    """The fast path's float32 factor ``2**(F - e + xs)`` (int32 arguments), clamped to
    [2**-100, 2**127]; 0 without an exponent (then every product is 0).  Below 2**-100 every product
    (below 2**32) scales below 2**-68, so its cut depends only on its sign: truncation 0, floor -1
    for a negative one; at 2**-100 every product (at least 2**-48) stays nonzero with its sign."""
    s = min(max(np.int32(F - e + xs), np.int32(-100)), np.int32(127))
    return f32_of(np.int32((s + np.int32(127)) << np.int32(23))) if e > REAL else np.float32(0.0)


# ------------------------------------------------------------------ the block's sum and its rounding
@njit(cache=True, inline="always")
def block_sum(E, acc, S, ii, n, F, rd, direct):
    """The exact float64 sum of a row's block at column n: C's aligned term ``cut(acc * 2**(F - E))``
    (trunc, or floor with ``rd``; C as is without an exponent) plus the products' sum ``S``, times
    ``2**(E - F)``; with ``direct`` the caller's sum ``S[n]`` as is."""
    e = E[n]
    real = e > REAL
    x = np.float64(acc[ii, n]) * (pow2(F - e) if real else 1.0)
    x = np.floor(x) if rd else np.trunc(x)
    x = (x + S[n]) * (pow2(e - F) if real else 1.0)
    return S[n] if direct else x


@njit(cache=True, inline="always")
def _finish(x, r, big, pos, neg):
    """The rounded ``r`` of ``x``: beyond the range ``pos`` / ``neg``; zero +0; inf and NaN kept."""
    r = (neg if x < 0 else pos) if abs(r) >= big else r
    r = 0.0 if r == 0.0 else r
    r = r if abs(x) < np.inf else x
    return np.float32(r)


@njit(cache=True, inline="always")
def _unit_exp(x, emin, p):
    """The exponent of the output's unit in the last place for the exact float64 ``x``."""
    e = ((f64_bits(x) & _MASK63) >> np.int64(52)) - np.int64(1023)
    return max(e, np.int64(emin)) - p


@njit(cache=True, inline="always")
def _f32_rz(x, ovf_inf):
    """``x`` (exact float64) truncated to float32, subnormals included: at or above 2**-126 its
    pattern keeps the top 24 significant bits (then the conversion is exact), below it ``x`` is cut
    to a multiple of 2**-149 (exact scalings).  At or beyond 2**128: inf (the conversion's) with
    ``ovf_inf``, else FLT_MAX.  inf and NaN are kept (the mask leaves the exponent and the quiet bit,
    which every NaN here has: they come from arithmetic and float32 values); +0 for zero."""
    a = abs(x)
    t = f64_of(f64_bits(x) & _KEEP24)
    t = np.trunc(x * _P149) * _M149 if a < _TINY else t
    y = np.float32(t)
    if not ovf_inf:
        y = np.float32(np.copysign(_F32_MAX, x)) if (a >= _BIG and a < np.inf) else y
    return y + np.float32(0.0)


@njit(cache=True)
def round_row(E, acc, S, ii, nn, F, rd, direct, p, mode, emin, emax, ovf_inf):
    """``acc[ii, n]`` = the block's exact sum (:func:`block_sum`) rounded to ``p`` fraction bits of
    the output (``emin``, ``emax``; ``mode`` one of :data:`ROUND_CODES`); an overflow is inf where
    ``ovf_inf`` or the rounding points away from zero, else the largest finite value; +0 for zero;
    inf and NaN kept.  fp32 results with RNE come from the float32 conversion, with RZ from
    :func:`_f32_rz`; the others scale by the unit in the last place, round to an integer (exact)
    and scale back."""
    big = pow2(emax + 1)
    maxf = (2.0 - pow2(-p)) * pow2(emax)
    pos = np.inf if (ovf_inf or mode == _RNE or mode == _RUP) else maxf
    neg = -np.inf if (ovf_inf or mode == _RNE or mode == _RDN) else -maxf
    f32 = p == 23 and emin == -126 and emax == 127
    if f32 and mode == _RNE:  # the conversion rounds to nearest-even (overflow: inf); -0 + 0 = +0
        for n in range(nn):
            acc[ii, n] = np.float32(block_sum(E, acc, S, ii, n, F, rd, direct)) + np.float32(0.0)
    elif f32 and mode == _RTZ:
        for n in range(nn):
            acc[ii, n] = _f32_rz(block_sum(E, acc, S, ii, n, F, rd, direct), ovf_inf)
    else:
        for n in range(nn):
            x = block_sum(E, acc, S, ii, n, F, rd, direct)
            e = _unit_exp(x, emin, p)
            y = x * pow2(-e)
            r = (
                np.rint(y)
                if mode == _RNE
                else (np.trunc(y) if mode == _RTZ else (np.floor(y) if mode == _RDN else np.ceil(y)))
            )
            acc[ii, n] = _finish(x, r * pow2(e), big, pos, neg)
