"""The parallel drivers of quantization (private to :mod:`fp8sim.scaling`): they split a ``(B, M, N)``
tensor into rows or bands of rows and call the row kernel (:func:`~fp8sim.scaling.rows.round_row`) for each; the amax kernels; dequantization.

* :func:`apply` -- given scales: every row rounded with its blocks' scales;
* :func:`fused` -- measured scales: each band's amaxes, scales, then its rounding;
* :func:`fused_bands32` -- :func:`fused` for float32 bands, software-pipelined;
* :func:`amax_rows`, :func:`amax_cols` -- block amaxes alone; :func:`dequant` -- codes back to values.

The rounding mode is a run-time argument: one compilation of each kernel serves every mode (the fast
paths do not depend on it; the general path branches on it per element).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .. import _fpenv
from ..intrinsics import borrow
from .policy import scale_one
from .rows import amax_seg, round_row, top32

__all__ = ["apply", "fused", "fused_bands32", "amax_rows", "amax_cols", "dequant", "NO_TABLE"]


@njit(cache=True)
def _band_amax_row(xirow, bn, ignore_nan, am):
    """Fold one row's tile amaxes into the band's ``am`` (NaN propagates, as np.maximum does)."""
    N = xirow.size
    for jb in range(am.size):
        ai = amax_seg(xirow, jb * bn, min(jb * bn + bn, N), ignore_nan)
        a = am[jb]
        if a == a and (ai != ai or ai > a):
            am[jb] = ai


@njit(parallel=True, cache=True)
def apply(x3, xi3, scales3, bm, bn, glob, mode, p, key, tab, use_tab, fp, use_fast, sp, codes3):
    """Round every element with its block's (given) scale; parallel over rows."""
    B, M, N = x3.shape
    x3, xi3, scales3, codes3, tab = borrow(x3), borrow(xi3), borrow(scales3), borrow(codes3), borrow(tab)
    for t in prange(B * M):
        fe = _fpenv.enter()  # the IEEE default environment on whichever thread runs the row
        b = t // M
        i = t - b * M
        srow = scales3[b, i // bm]
        round_row(
            x3[b, i],
            codes3[b, i],
            bn,
            srow,
            glob,
            mode,
            p,
            key,
            t * N,
            tab,
            use_tab,
            fp,
            use_fast,
            False,
            xi3[b, i],
            srow,
            sp,
            False,
            False,  # given scales: a NaN element may meet a finite scale
            0,
        )
        _fpenv.leave(fe)


@njit(parallel=True, cache=True)
def fused(x3, xi3, bm, bn, mode, p, key, sp, glob, ignore_nan, tab, use_tab, fp, use_fast, codes3, scales3, amax3):
    """Per band of bm rows: the blocks' amaxes, their scales, then the rounding.  A single row (1xN
    tiles, groups and MX) is measured and rounded chunk by chunk in one pass (:func:`round_row`); a
    band of several rows (float64 input: float32 bands go to :func:`fused_bands32`) is read for its
    amaxes first, then again, from cache, for the rounding.  Parallel over bands.  The scale kinds it serves (fp32, pow2, e8m0) are float32 values, so the
    rounding may take them back from ``scales3``."""
    B, M, N = x3.shape
    nbm = (M + bm - 1) // bm
    nbn = (N + bn - 1) // bn
    x3, xi3, codes3, tab = borrow(x3), borrow(xi3), borrow(codes3), borrow(tab)
    scales3, amax3 = borrow(scales3), borrow(amax3)
    for t in prange(B * nbm):
        fe = _fpenv.enter()
        b = t // nbm
        ib = t - b * nbm
        i0 = ib * bm
        i1 = min(i0 + bm, M)
        if bm > 1:  # (float32 bands go to fused_bands32)
            am = np.zeros(nbn, dtype=np.float64)
            for i in range(i0, i1):
                _band_amax_row(xi3[b, i], bn, ignore_nan, am)
            for jb in range(nbn):
                amax3[b, ib, jb] = am[jb]
                scales3[b, ib, jb] = scale_one(am[jb], glob, sp)
        for i in range(i0, i1):
            round_row(
                x3[b, i],
                codes3[b, i],
                bn,
                scales3[b, ib],
                glob,
                mode,
                p,
                key,
                (b * M + i) * N,
                tab,
                use_tab,
                fp,
                use_fast,
                bm == 1,
                xi3[b, i],
                amax3[b, ib],
                sp,
                ignore_nan,
                not ignore_nan,  # NaN made its block's scale NaN
                0,
            )
        _fpenv.leave(fe)


@njit(inline="always")
def _colmax(xr, acc):
    """acc[j] = max(acc[j], |xr[j]|) on float32 bit patterns (int32 lanes; NaN's patterns lie above inf's)."""
    for j in range(np.uint64(acc.size)):
        acc[j] = max(acc[j], np.int32(xr[j] & np.int32(0x7FFFFFFF)))


@njit(parallel=True, cache=True)
def fused_bands32(
    x3, xi3, bm, bn, mode, p, key, sp, glob, ignore_nan, tab, use_tab, fp, use_fast, codes3, scales3, amax3, nch
):
    """As :func:`fused` for bands of bm > 1 rows of float32, software-pipelined: the ``B*nbm`` bands are
    split into ``nch`` runs of consecutive bands, one per thread.  A band's amaxes come from the
    column-wise max of its rows' magnitude bit patterns and one reduction per block (a block whose max
    is inf's pattern or above, an inf or NaN in it, is measured again row by row).  Each row of a band
    is rounded (from cache) and then the same row of the next band is folded into that band's max,
    while the rounding loop prefetches that row (``pfd``): the next band's stream from memory overlaps
    this band's arithmetic, where a separate amax pass left them one after the other."""
    B, M, N = x3.shape
    nbm = (M + bm - 1) // bm
    nbn = (N + bn - 1) // bn
    nb = B * nbm
    x3, xi3, codes3, tab = borrow(x3), borrow(xi3), borrow(codes3), borrow(tab)
    scales3, amax3 = borrow(scales3), borrow(amax3)
    nch = max(1, min(nb, nch))
    for c in prange(nch):
        fe = _fpenv.enter()
        t0 = c * nb // nch
        t1 = (c + 1) * nb // nch
        acc = np.zeros(N, dtype=np.int32)  # the column-wise max of this band ...
        nxt = np.zeros(N, dtype=np.int32)  # ... and of the next one
        b = t0 // nbm
        ib = t0 - b * nbm
        for i in range(ib * bm, min(ib * bm + bm, M)):
            _colmax(xi3[b, i], acc)
        for t in range(t0, t1):
            b = t // nbm
            ib = t - b * nbm
            i0 = ib * bm
            i1 = min(i0 + bm, M)
            for jb in range(nbn):
                top = top32(acc, jb * bn, min(jb * bn + bn, N))
                if top < np.int32(0x7F800000):
                    a = np.float64(np.int32(top).view(np.float32))
                else:
                    a = 0.0
                    for i in range(i0, i1):
                        ai = amax_seg(xi3[b, i], jb * bn, min(jb * bn + bn, N), ignore_nan)
                        if a == a and (ai != ai or ai > a):
                            a = ai
                amax3[b, ib, jb] = a
                scales3[b, ib, jb] = scale_one(a, glob, sp)
            has_next = t + 1 < t1
            bq = (t + 1) // nbm  # the next band: batch bq, rows j0 to j1 (consecutive in memory)
            j0 = ((t + 1) - bq * nbm) * bm
            j1 = min(j0 + bm, M)
            pfd = ((bq * M + j0) - (b * M + i0)) * N if has_next else 0
            if has_next:
                for j in range(N):
                    nxt[j] = 0
            for i in range(i0, i1):
                round_row(
                    x3[b, i],
                    codes3[b, i],
                    bn,
                    scales3[b, ib],
                    glob,
                    mode,
                    p,
                    key,
                    (b * M + i) * N,
                    tab,
                    use_tab,
                    fp,
                    use_fast,
                    False,
                    xi3[b, i],
                    amax3[b, ib],
                    sp,
                    ignore_nan,
                    not ignore_nan,  # NaN made its block's scale NaN
                    pfd,
                )
                if has_next and j0 + (i - i0) < j1:
                    _colmax(xi3[bq, j0 + (i - i0)], nxt)
            if has_next:
                for j in range(j0 + (i1 - i0), j1):  # the next band has more rows (this one is ragged)
                    _colmax(xi3[bq, j], nxt)
                acc, nxt = nxt, acc
        _fpenv.leave(fe)


#: the memo table argument where the table path is not taken
NO_TABLE = np.zeros((2, 1), dtype=np.uint8)


@njit(parallel=True, cache=True)
def amax_rows(xi2, bn, ignore_nan, out):
    """Per row, amax of each run of ``bn`` columns: out[i, jb] (xi2: the input's bit patterns)."""
    R, N = xi2.shape
    nbn = (N + bn - 1) // bn
    for i in prange(R):
        fe = _fpenv.enter()
        xirow = xi2[i]
        for jb in range(nbn):
            lo = jb * bn
            hi = min(lo + bn, N)
            out[i, jb] = amax_seg(xirow, lo, hi, ignore_nan)
        _fpenv.leave(fe)


@njit(inline="always")
def _amax_update(a, v, ignore_nan):
    av = abs(np.float64(v))
    take = (av > a) | ((av != av) & (not ignore_nan))
    take = take & (av != np.inf)
    return av if take else a


@njit(parallel=True, cache=True)
def amax_cols(x3, bm, ignore_nan, out):
    """Blocks (bm, 1): out[b, ib, j] = amax of x3[b, ib*bm:(ib+1)*bm, j]; parallel over column chunks."""
    B, M, N = x3.shape
    nbm = (M + bm - 1) // bm
    CW = 512
    nch = (N + CW - 1) // CW
    for t in prange(B * nch):
        fe = _fpenv.enter()
        b = t // nch
        c0 = (t - b * nch) * CW
        c1 = min(c0 + CW, N)
        for ib in range(nbm):
            for j in range(c0, c1):
                out[b, ib, j] = 0.0
            for i in range(ib * bm, min((ib + 1) * bm, M)):
                for j in range(c0, c1):
                    out[b, ib, j] = _amax_update(out[b, ib, j], x3[b, i, j], ignore_nan)
        _fpenv.leave(fe)


@njit(parallel=True, cache=True)
def dequant(codes3, table, scales3, bm, bn, glob, out3):
    """``out3``: each code's value (``table``) times its block's scale and ``glob``, in float64."""
    B, M, N = codes3.shape
    nbn = (N + bn - 1) // bn
    for t in prange(B * M):
        fe = _fpenv.enter()
        b = t // M
        i = t - b * M
        ib = i // bm
        crow = codes3[b, i]
        orow = out3[b, i]
        for jb in range(nbn):
            s = np.float64(scales3[b, ib, jb]) * glob
            cs = crow[jb * bn : min(jb * bn + bn, N)]
            os_ = orow[jb * bn : min(jb * bn + bn, N)]
            for j in range(cs.size):
                os_[j] = np.float64(table[cs[j]]) * s
        _fpenv.leave(fe)
