"""Numba kernels of the tensor-core datapaths beyond Hopper, vectorized over N, exact by construction.

The kernels of :mod:`fp8sim.tensorcore.scaled_mma` (which decodes the operands with
:mod:`fp8sim.tensorcore._mma_decode` and picks one): :func:`fused_kernel` (MMA-Sim's T-FDPA, and
ST-FDPA with MX scales), :func:`grouped_kernel` (GST-FDPA: MXFP4 / NVFP4) and
:func:`interleaved_kernel` (GTR-FDPA: CDNA3's MFMA).  All three are the one tile loop of
:mod:`fp8sim.tensorcore._mma_tiles` with their own row step.  Why every step is exact:

* **Products in float32.** On the *fast path* both operands' elements of the block have at most
  12 significant bits and magnitudes in [2**-24, 2**16) (every FP8/FP6/FP4 and fp16 value, and
  bf16/tf32 values of that range; the caller checks each block): ``va * vb`` has at most 24
  significant bits and lies in [2**-48, 2**32), so it is exact in float32.  Block scales are not
  folded into the values: with one UE8M0 scale per block and row (column), ``xs = xa + xb`` is the
  same for every product of an output's block, so aligning ``p * 2**xs`` to the largest exponent
  ``E`` is aligning ``p`` to ``E - xs``, and the float32 factor is ``2**(F - E + xs)``.
* **Truncation by conversion.** Every product is below ``4 * 2**(E - xs)`` (significands below
  2), so ``p * 2**(F - E + xs) < 2**(F + 2)``: a power-of-two scaling, exact unless it falls below
  2**-126, where it is below 1 in magnitude: then its truncation is 0 and its floor 0 or -1 by its
  sign alone, and the float32 result, nonzero with the product's sign, gives the same.  The
  factor is raised to 2**-100 where it is smaller (every product scaled by it is below 2**-68
  anyway, and at 2**-100 a product of at least 2**-48 stays nonzero).  ``int32(x)`` truncates toward
  zero (the ``rz`` alignment); ``int32(floor(x))`` is the two's-complement cut (``rd``).
* **Sums in int32, then float64.** A chunk of ``2**(29 - F)`` such integers sums below
  ``2**31`` (F = 25: 16 per chunk, two chunks per block of 32); the chunks and C's aligned term
  (below ``2**(F + 1)``) are added in float64 (integers below 2**53, exact).
* **The output rounding** multiplies the exact sum by the power of two ``2**(E - F)`` (float64,
  no under/overflow for these ranges).  To fp32 with RNE it is the float32 conversion; with RZ
  the float64 pattern keeps its top 24 significant bits (values at or above 2**-126; below, the
  value is cut to a multiple of 2**-149 by exact scalings) and the conversion is then exact.
  Otherwise the exponent comes from the float64 pattern, the sum is scaled by ``2**-(e - p)``
  (exact), rounded to an integer (rint, trunc, floor or ceil: exact) and scaled back.

The *fallback path* (a row's block or a column tile's block holding inf/NaN, NaN scales or
magnitudes outside that range, scales with a significand other than 1, or F > 27) does the same
in float64: products of two values of at most 11 bits times the scales' significands are exact,
``trunc`` of a float64 is exact, and a block's sum stays below 2**53; inf and NaN propagate by
IEEE arithmetic.

The FP4 grouped kernel sums each group of 16 products exactly in int16 (e2m1 values times 2 are
integers of magnitude at most 12: a product is at most 144, a group at most 2304), then aligns the
groups in float64.  The CDNA3 kernel sums each lane of 8 products in int32 (F = 24: below 2**29),
and the two lanes' cuts toward -inf are arithmetic right shifts.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .. import _fpenv
from ._mma_tiles import (
    MB,
    NB,
    NONE32,
    REAL,
    acc_exponent,
    block_exp,
    chain_step,
    factor32,
    lane_max,
    lane_sum,
    lane_sum_f64,
    load_c,
    round_row,
    store,
    tile,
    tiles,
)
from .bitcast import f32_bits, f64_bits, pow2, pow2f

__all__ = ["fused_kernel", "grouped_kernel", "interleaved_kernel"]


# ------------------------------------------------------------------ fused (T-FDPA / ST-FDPA)
@njit(cache=True)
def _fused_setup(pm, E, sc, scp, acc, ii, xai, xbr, nn, F, slow, scaled, emin, zexp):
    """Per column of a row's block: the largest exponent ``E`` (products with their scales' exponents
    ``xs``, the accumulator's, the floor ``zexp``) and the products' factor ``scp = 2**(F - E + xs)``
    (float64, ``slow``) or ``sc`` its float32 (:func:`~fp8sim.tensorcore._mma_tiles.factor32`).  Without scales (``scaled``
    false) xs is 0.  ``F``, ``xai``, ``xbr``, ``emin`` and ``zexp`` are int32."""
    if slow:
        for n in range(nn):
            xs = np.int32(xai + xbr[n])
            e = block_exp(np.int32(pm[n]), xs, acc[ii, n], zexp, emin)
            E[n] = e
            scp[n] = pow2(F - e + xs) if e > REAL else 1.0
    elif scaled:
        for n in range(nn):
            xs = np.int32(xai + xbr[n])
            e = block_exp(np.int32(pm[n]), xs, acc[ii, n], zexp, emin)
            E[n] = e
            sc[n] = factor32(e, xs, F)
    else:
        for n in range(nn):
            e = block_exp(np.int32(pm[n]), np.int32(0), acc[ii, n], zexp, emin)
            E[n] = e
            sc[n] = factor32(e, np.int32(0), F)


@njit(cache=True, parallel=True)
def fused_kernel(
    av, ae, bv, be, xa, xb, sga, sgb, sgu, sblk, aspec, bspec, c, L, F, rd, all_f64, p, mode, emin, emax, ovf_inf, zexp,
    promote, out,
):  # fmt: skip
    """Fused multi-term accumulation (group 1) of (M, K) @ (K, N) along K, blocks of ``L``.

    av/ae: A's values (float32, or float64 when scales were folded in) and nominal exponents
    (int16, NONE16 for zero/inf/NaN), (M, K); bv/be: B's, (K, N); xa/sga (M, K // sblk) and
    xb/sgb (K // sblk, N): block scales' exponents (int32) and significands (float64; the block
    ``sblk`` a multiple of L); sgu: every significand is 1; aspec (M, K // L): the row's block needs the fallback path;
    bspec (K // L, ceil(N / NB)): the column tile's block does; c: (M, N) float64; rd: 1 for the
    two's-complement cut; all_f64: every block on the fallback path; p/mode/emin/emax/ovf_inf: the
    output rounding; zexp: floor of the alignment exponent (NONE32: none); promote: K elements
    per promotion into an fp32 accumulator (0: none).  out: (M, N) float64.
    """
    M, K = av.shape
    N = bv.shape[1]
    nmt, nnt = tiles(M, N)
    chunk = min(L, 1 << max(0, 29 - F))
    scaled = np.any(xa != 0) or np.any(xb != 0)  # else every xs is 0
    F32, emin32, z32 = np.int32(F), np.int32(emin), np.int32(zexp)
    for t in prange(nmt * nnt):
        fe = _fpenv.enter()  # the IEEE default environment on whichever thread runs the tile
        i0, rows, n0, nn, nt = tile(t, nnt, M, N)
        acc = np.zeros((MB, NB), np.float32)
        tot = np.zeros((MB, NB), np.float32)
        pm = np.empty(NB, np.int16)
        E = np.empty(NB, np.int32)
        sc = np.empty(NB, np.float32)
        scp = np.empty(NB)
        S = np.empty(NB, np.int32)
        Sf = np.empty(NB)
        load_c(c, acc, tot, i0, rows, n0, nn, promote)
        cnt = 0
        for kb in range(0, K, L):
            blk = kb // L
            sb = kb // sblk
            bsp = bspec[blk, nt]
            xbr = xb[sb, n0 : n0 + nn]
            for ii in range(rows):
                i = i0 + ii
                lane_max(pm, ae, be, i, kb, kb + L, 1, n0, nn)
                slow = all_f64 or bsp or aspec[i, blk]
                _fused_setup(pm, E, sc, scp, acc, ii, xa[i, sb], xbr, nn, F32, slow, scaled, emin32, z32)
                if slow:
                    lane_sum_f64(Sf, av, bv, sga[i, sb], sgb, sb, scp, i, kb, kb + L, 1, n0, nn, rd, sgu, bsp)
                else:
                    for k0 in range(kb, kb + L, chunk):  # the chunks' int32 sums, added in float64
                        lane_sum(S, av, bv, sc, i, k0, min(kb + L, k0 + chunk), 1, n0, nn, rd)
                        for n in range(nn):
                            Sf[n] = (Sf[n] if k0 > kb else 0.0) + np.float64(S[n])
                round_row(E, acc, Sf, ii, nn, F, rd, False, p, mode, emin, emax, ovf_inf)
            cnt = chain_step(acc, tot, cnt, L, promote, kb + L >= K, rows, nn)
        store(out, acc, tot, promote, i0, rows, n0, nn)
        _fpenv.leave(fe)


# ------------------------------------------------------------------ grouped (GST-FDPA: MXFP4 / NVFP4)
@njit(cache=True, parallel=True)
def grouped_kernel(av, bv, bnz, unit, xa, sga, xb, sgb, sblk, c, L, G, F, p, mode, emin, emax, ovf_inf, zexp, promote,
                   out):  # fmt: skip
    """Grouped fused accumulation: exact sums of ``G`` products, times their scales, one fused sum.

    av (M, K), bv (K, N): element values as integers (int16: e2m1 values times 2) or floats
    (float64), a group sum times ``unit`` being its value; bnz (K, N) int16: B's element is
    nonzero; xa/sga (M, K // sblk), xb/sgb (K // sblk, N): scale exponents (int32) and
    significands (float64: 0 for a zero scale, NaN for a NaN one); c (M, N) float64.  Other
    arguments as :func:`fused_kernel` (alignment: truncation).  out (M, N) float64.
    """
    M, K = av.shape
    N = bv.shape[1]
    ng = L // G
    nmt, nnt = tiles(M, N)
    for t in prange(nmt * nnt):
        fe = _fpenv.enter()  # the IEEE default environment on whichever thread runs the tile
        i0, rows, n0, nn, nt = tile(t, nnt, M, N)
        acc = np.zeros((MB, NB), np.float32)
        tot = np.zeros((MB, NB), np.float32)
        gv = np.zeros((ng, NB), av.dtype)
        nz = np.zeros((ng, NB), np.int16)
        ge = np.empty((ng, NB), np.int32)
        gs = np.empty((ng, NB))
        E = np.empty(NB, np.int64)
        X = np.empty(NB)
        inv = np.empty(NB)
        load_c(c, acc, tot, i0, rows, n0, nn, promote)
        cnt = 0
        for kb in range(0, K, L):
            for ii in range(rows):
                i = i0 + ii
                for n in range(nn):
                    E[n] = zexp
                for g in range(ng):
                    k0 = kb + g * G
                    for n in range(nn):
                        gv[g, n] = 0
                        nz[g, n] = 0
                    for k in range(k0, k0 + G):
                        va = av[i, k]
                        if va == 0:
                            continue
                        bvr = bv[k, n0 : n0 + nn]
                        bnzr = bnz[k, n0 : n0 + nn]
                        for n in range(nn):
                            gv[g, n] += va * bvr[n]
                            nz[g, n] |= bnzr[n]
                    s = k0 // sblk
                    ma = sga[i, s] * unit
                    xai = xa[i, s]
                    sgbr = sgb[s, n0 : n0 + nn]
                    xbr = xb[s, n0 : n0 + nn]
                    for n in range(nn):
                        ms = ma * sgbr[n]
                        gs[g, n] = np.float64(gv[g, n]) * ms
                        real = nz[g, n] != 0 and ms != 0.0 and abs(ms) < np.inf
                        e = xai + xbr[n] if real else NONE32
                        ge[g, n] = e
                        E[n] = max(E[n], e)
                for n in range(nn):
                    e = max(E[n], acc_exponent(acc[ii, n], np.int32(emin)))
                    E[n] = e
                    real = e > REAL
                    X[n] = np.trunc(np.float64(acc[ii, n]) * (pow2(F - e) if real else 1.0))
                    inv[n] = pow2(e - F) if real else 1.0
                for g in range(ng):
                    for n in range(nn):
                        ee = ge[g, n]
                        v = gs[g, n] * (pow2(ee + F - E[n]) if ee > REAL else 1.0)
                        X[n] += np.trunc(v) if ee > REAL else v  # 0 (or NaN from a NaN scale)
                for n in range(nn):
                    X[n] *= inv[n]
                round_row(E, acc, X, ii, nn, F, 0, True, p, mode, emin, emax, ovf_inf)
            cnt = chain_step(acc, tot, cnt, L, promote, kb + L >= K, rows, nn)
        store(out, acc, tot, promote, i0, rows, n0, nn)
        _fpenv.leave(fe)


# ------------------------------------------------------------------ interleaved (GTR-FDPA: CDNA3 MFMA)
@njit(cache=True)
def _interleave_fin(pm0, pm1, S0, S1, acc, ii, nn, F, F2):
    """Add the two lanes (cut toward -inf), C (cut toward -inf) and round: the CDNA3 datapath's end.

    Lane sums S0/S1 are integers in units of 2**(pm0/pm1 - F).  With ed the larger lane exponent,
    ec C's exponent (at least -126) and em = max(ed, ec): the lanes are cut to units 2**(ed - F) and
    added, their sum cut to units 2**(em - F2 - 1), C to units 2**(em - F) (dropped when ec is more
    than F + 1 below em), the total cut toward -inf to F2 fraction bits and rounded to fp32 RNE.
    Every scaling is by a power of two within float64's normal range (exact).  Branch-free (every
    value is computed, the selects pick), so that the loop vectorizes."""
    for n in range(nn):
        e0 = np.int32(pm0[n])
        e1 = np.int32(pm1[n])
        a0 = np.float64(S0[n])
        a1 = np.float64(S1[n])
        x = np.float64(acc[ii, n])
        ed = max(e0, e1)
        s0 = np.floor(a0 * pow2(e0 - ed)) if e0 > REAL else a0
        s1 = np.floor(a1 * pow2(e1 - ed)) if e1 > REAL else a1
        sd = s0 + s1  # units 2**(ed - F); +-inf / NaN on the fallback path
        ec = max(np.int32((f64_bits(x) >> np.int64(52)) & np.int64(0x7FF)) - np.int32(1023), np.int32(-126))
        edr = ed > REAL
        em = max(ed, ec) if edr else ec
        cu = np.floor(x * pow2(F - em)) if ec >= em - F - 1 else 0.0  # units 2**(em - F)
        sc = np.floor(sd * pow2(ed - em + F2 + 1 - F)) if edr else sd  # units 2**(em - F2 - 1)
        v = (sc + cu * pow2(F2 + 1 - F)) * pow2(em - F2 - 1)
        ev = max(np.int32((f64_bits(v) >> np.int64(52)) & np.int64(0x7FF)) - np.int32(1023), np.int32(-126))
        r = np.float32(np.floor(v * pow2(F2 - ev)) * pow2(ev - F2)) + np.float32(0.0)
        fin = abs(x) < np.inf and abs(sd) < np.inf
        acc[ii, n] = r if fin else np.float32(x + sd)  # IEEE: inf / NaN


@njit(cache=True)
def _interleave_fin_int(pm0, pm1, S0, S1, acc, ii, nn, F, F2):
    """:func:`_interleave_fin` for the fast path: int32 lane sums (their total below 2**31) and a
    finite-or-not float32 accumulator.  The lanes' cuts toward -inf to units 2**(ed - F) are
    arithmetic right shifts (a shift by 31 leaves 0 or -1: the cut of anything below one unit), the
    exponents int32 (8 lanes); C's exponent is its float32 one clamped at -126 (float64's for the
    values a float32 holds).  The rest as :func:`_interleave_fin`, in float64."""
    for n in range(nn):
        e0 = np.int32(pm0[n])
        e1 = np.int32(pm1[n])
        ed = max(e0, e1)
        sd = np.int32(S0[n] >> np.int32(min(ed - e0, 31))) + np.int32(S1[n] >> np.int32(min(ed - e1, 31)))
        a = acc[ii, n]
        ec = max(np.int32(np.int32(f32_bits(a) >> np.int32(23)) & np.int32(0xFF)) - np.int32(127), np.int32(-126))
        em = max(np.int32(ed), ec)  # ec when no lane has an exponent (NONE16 is below -126)
        x = np.float64(a)
        cu = np.floor(x * pow2(F - em)) if ec >= em - F - 1 else 0.0  # units 2**(em - F)
        sdf = np.float64(np.int32(sd))
        sc = np.floor(sdf * pow2(ed - em + F2 + 1 - F)) if ed > REAL else sdf  # units 2**(em - F2 - 1)
        v = (sc + cu * pow2(F2 + 1 - F)) * pow2(em - F2 - 1)
        ev = max(np.int32((f64_bits(v) >> np.int64(52)) & np.int64(0x7FF)) - np.int32(1023), np.int32(-126))
        r = np.float32(np.floor(v * pow2(F2 - ev)) * pow2(ev - F2)) + np.float32(0.0)
        acc[ii, n] = r if abs(x) < np.inf else np.float32(x + sdf)  # IEEE: inf / NaN


@njit(cache=True, parallel=True)
def interleaved_kernel(av, ae, bv, be, aspec, bspec, c, L, F, F2, promote, out):
    """AMD CDNA3 FP8 MFMA accumulation along K, blocks of ``L`` (even and odd k: two lanes).

    Arguments as :func:`fused_kernel` (values float32, no scales); F2 is ``sum_frac_bits``.  The
    output is fp32 (RNE).  Lane sums: at most L / 2 integers below 2**(F + 2) each, in int32 on the
    fast path (F + 2 + log2(L) <= 31: the two lanes' total fits too), in float64 on the fallback
    path.
    """
    M, K = av.shape
    N = bv.shape[1]
    nmt, nnt = tiles(M, N)
    fast_ok = L * (1 << (F + 2)) <= (1 << 31)  # the lane sums, and their total, fit int32
    F32 = np.int32(F)
    for t in prange(nmt * nnt):
        fe = _fpenv.enter()  # the IEEE default environment on whichever thread runs the tile
        i0, rows, n0, nn, nt = tile(t, nnt, M, N)
        acc = np.zeros((MB, NB), np.float32)
        tot = np.zeros((MB, NB), np.float32)
        pm = np.empty((2, NB), np.int16)
        sc = np.empty(NB, np.float32)
        scp = np.empty(NB)
        S = np.empty((2, NB), np.int32)
        Sf = np.empty((2, NB))
        one = np.ones((1, 1))
        load_c(c, acc, tot, i0, rows, n0, nn, promote)
        cnt = 0
        for kb in range(0, K, L):
            blk = kb // L
            bsp = bspec[blk, nt]
            for ii in range(rows):
                i = i0 + ii
                slow = bsp or aspec[i, blk] or not fast_ok
                for lane in range(2):
                    pml = pm[lane]
                    lane_max(pml, ae, be, i, kb + lane, kb + L, 2, n0, nn)
                    if slow:
                        for n in range(nn):
                            e = np.int32(pml[n])
                            scp[n] = pow2(F - e) if e > REAL else 1.0
                        lane_sum_f64(Sf[lane], av, bv, 1.0, one, 0, scp, i, kb + lane, kb + L, 2, n0, nn, False,
                                      True, bsp)  # fmt: skip
                    else:
                        for n in range(nn):
                            e = np.int32(pml[n])
                            sc[n] = pow2f(np.int32(F32 - e)) if e > REAL else np.float32(0.0)
                        lane_sum(S[lane], av, bv, sc, i, kb + lane, kb + L, 2, n0, nn, False)
                if slow:
                    _interleave_fin(pm[0], pm[1], Sf[0], Sf[1], acc, ii, nn, F32, F2)
                else:
                    _interleave_fin_int(pm[0], pm[1], S[0], S[1], acc, ii, nn, F32, F2)
            cnt = chain_step(acc, tot, cnt, L, promote, kb + L >= K, rows, nn)
        store(out, acc, tot, promote, i0, rows, n0, nn)
        _fpenv.leave(fe)
