"""Numba kernels of the tensor-core datapaths beyond Hopper, vectorized over N, exact by construction.

The kernels of :mod:`fp8sim.tensorcore.scaled_mma` (which decodes the operands and picks one).
Each task is a tile of ``_MB`` rows by ``_NB`` columns; per block of ``L`` products and per row,
every loop runs over the tile's columns on contiguous arrays without calls (LLVM vectorizes them).
Powers of two and exponents come from bit patterns (int arrays viewed as floats), never from
``frexp``/``ldexp``.  Why every step is exact:

* **Products in float32.** On the *fast path* both operands' elements of the block have at most
  12 significant bits and magnitudes in [2**-24, 2**16) (every FP8/FP6/FP4 and fp16 value, and
  bf16/tf32 values of that range; the caller checks each block): ``va * vb`` has at most 24
  significant bits and lies in [2**-48, 2**32), so it is exact in float32.  Block scales are not folded into
  the values: with one UE8M0 scale per block and row (column), ``xs = xa + xb`` is the same for
  every product of an output's block, so aligning ``p * 2**xs`` to the largest exponent ``E`` is
  aligning ``p`` to ``E - xs``, and the float32 factor is ``2**(F - E + xs)``.
* **Truncation by conversion.** Every product is below ``4 * 2**(E - xs)`` (significands below
  2), so ``p * 2**(F - E + xs) < 2**(F + 2)``: a power-of-two scaling, exact unless it underflows,
  and where the factor is below 2**-126 every ``|p| < 2**32`` gives ``|p * factor| < 1``, whose
  truncation is 0 either way (the factor is then set to 0).  ``int32(x)`` truncates toward zero
  (the ``rz`` alignment); ``int32(floor(x))`` is the two's-complement cut (``rd``).
* **Sums in int32, then int64/float64.** A chunk of ``2**(29 - F)`` such integers sums below
  ``2**31`` (F = 25: 16 per chunk, two chunks per block of 32); the chunks and C's aligned term
  (below ``2**(F + 1)``) are added in float64 (integers below 2**53, exact).
* **The output rounding** multiplies the exact sum by the power of two ``2**(E - F)`` (float64,
  no under/overflow for these ranges), takes the exponent from the float64 pattern, scales by
  ``2**-(e - p)`` (exact), rounds to an integer (rint, trunc, floor or ceil: exact) and scales
  back.

The *fallback path* (a row's block or a column tile's block holding inf/NaN, NaN scales or
magnitudes outside that range, scales with a significand other than 1, or F > 27) does the same in float64: products of two values of at most 11 bits times the scales'
significands are exact, ``trunc`` of a float64 is exact, and a block's sum stays below 2**53;
inf and NaN propagate by IEEE arithmetic.

The FP4 grouped kernel sums each group of 16 products exactly in int16 (e2m1 values times 2 are
integers of magnitude at most 12: a product is at most 144, a group at most 2304), then aligns the
groups in float64.  The CDNA3 kernel sums each lane of 8 products in int32 (F = 24: below 2**29).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

__all__ = ["NONE16", "NONE32", "fused_kernel", "grouped_kernel", "interleaved_kernel", "pow2_bits"]

#: exponent of an element that has none (zero, inf, NaN): never the largest (int16, and its sums)
NONE16 = -10000
#: "no exponent" in int32 arithmetic (below any real exponent, far from overflow)
NONE32 = -(1 << 20)
_REAL = -5000  # exponents above this are real

_RNE, _RTZ, _RUP, _RDN = 0, 2, 3, 4  # fp8sim.rounding.RoundMode values (checked by scaled_mma)
ROUND_CODES = (_RNE, _RTZ, _RUP, _RDN)  #: the rounding numbers above, for the check in scaled_mma

_MB = 16  # rows per task
_NB = 256  # columns per task
COLUMNS_PER_TASK = _NB
_ONE64 = np.int64(1023) << np.int64(52)
_MASK63 = np.int64(0x7FFFFFFFFFFFFFFF)


@njit(cache=True, inline="always")
def pow2_bits(e):
    """The float64 bit pattern of 2**e (int64), for -1022 <= e <= 1023."""
    return np.int64(e + 1023) << np.int64(52)


# ------------------------------------------------------------------ small vector loops
@njit(cache=True)
def _p1(pm, ber, ea):
    for n in range(pm.size):
        pm[n] = max(pm[n], np.int16(ber[n] + ea))


@njit(cache=True)
def _p2i(S, bvr, va, sc):
    for n in range(S.size):
        S[n] += np.int32(va * bvr[n] * sc[n])


@njit(cache=True)
def _p2i_rd(S, bvr, va, sc):
    for n in range(S.size):
        S[n] += np.int32(np.floor(va * bvr[n] * sc[n]))


@njit(cache=True)
def _p2f(S, bvr, va, sgr, sc):
    for n in range(S.size):
        S[n] += np.trunc(va * np.float64(bvr[n]) * sgr[n] * sc[n])


@njit(cache=True)
def _p2f1(S, bvr, va, sc):
    for n in range(S.size):
        S[n] += np.trunc(va * np.float64(bvr[n]) * sc[n])


@njit(cache=True)
def _p2f_rd(S, bvr, va, sgr, sc):
    for n in range(S.size):
        S[n] += np.floor(va * np.float64(bvr[n]) * sgr[n] * sc[n])


@njit(cache=True)
def _acc_exp(E, accb, emin):
    """E[n] = max(E[n], nominal exponent of the float32 accumulator (clamped at emin))."""
    for n in range(E.size):
        ab = accb[n]
        ef = (ab >> 23) & 0xFF
        mag = ab & 0x7FFFFFFF
        ec = ef - 127
        ec = max(ec, emin)
        ec = ec if (ef != 255 and mag != 0) else NONE32
        E[n] = max(E[n], ec)


@njit(cache=True)
def _round_out(X, Xi, Qi, Ri, acc, p, mode, emin, emax, ovf_inf):
    """acc[n] = X[n] rounded to p fraction bits of the output (emin, emax); +0 for zero; inf and
    NaN kept.  X holds exact float64 values (normal or zero), Xi its int64 view; Qi, Ri scratch."""
    big = np.float64(2.0) ** (emax + 1)
    maxf = (np.float64(2.0) - np.float64(2.0) ** (-p)) * np.float64(2.0) ** emax
    for n in range(X.size):
        e = ((Xi[n] & _MASK63) >> np.int64(52)) - np.int64(1023)
        e = max(e, np.int64(emin)) - p  # the exponent of the output's unit in the last place
        Qi[n] = pow2_bits(-e)
        Ri[n] = pow2_bits(e)
    Q = Qi.view(np.float64)
    R = Ri.view(np.float64)
    for n in range(X.size):
        x = X[n]
        r = x * Q[n]
        if mode == _RNE:
            r = np.rint(r)
        elif mode == _RTZ:
            r = np.trunc(r)
        elif mode == _RDN:
            r = np.floor(r)
        else:
            r = np.ceil(r)
        r = r * R[n]
        neg = x < 0
        if abs(r) >= big:
            inf = ovf_inf or mode == _RNE or (mode == _RUP and not neg) or (mode == _RDN and neg)
            r = np.inf if inf else maxf
            r = -r if neg else r
        if r == 0.0:
            r = 0.0
        if not abs(x) < np.inf:
            r = x
        acc[n] = np.float32(r)


# ------------------------------------------------------------------ fused (T-FDPA / ST-FDPA)
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
    bspec (K // L, ceil(N / _NB)): the column tile's block does; c: (M, N) float64; rd: 1 for the
    two's-complement cut; all_f64: every block on the fallback path; p/mode/emin/emax/ovf_inf: the
    output rounding; zexp: floor of the alignment exponent (NONE32: none); promote: K elements
    per promotion into an fp32 accumulator (0: none).  out: (M, N) float64.
    """
    M, K = av.shape
    N = bv.shape[1]
    nmt = (M + _MB - 1) // _MB
    nnt = (N + _NB - 1) // _NB
    chunk = min(L, 1 << max(0, 29 - F))
    nch = (L + chunk - 1) // chunk
    for t in prange(nmt * nnt):
        mt = t // nnt
        nt = t % nnt
        i0 = mt * _MB
        i1 = min(M, i0 + _MB)
        n0 = nt * _NB
        n1 = min(N, n0 + _NB)
        nn = n1 - n0
        accb = np.zeros((_MB, _NB), np.int32)
        acc = accb.view(np.float32)
        tot = np.zeros((_MB, _NB), np.float32)
        pm = np.empty(_NB, np.int16)
        E = np.empty(_NB, np.int32)
        sci = np.empty(_NB, np.int32)
        scf = sci.view(np.float32)
        s64i = np.empty(_NB, np.int64)
        s64 = s64i.view(np.float64)
        Xi = np.empty(_NB, np.int64)
        X = Xi.view(np.float64)
        S = np.empty((nch, _NB), np.int32)
        Sf = np.empty(_NB)
        scp = np.empty(_NB, np.int64)
        scpf = scp.view(np.float64)
        Qi = np.empty(_NB, np.int64)
        Ri = np.empty(_NB, np.int64)
        for ii in range(i1 - i0):
            for n in range(nn):
                acc[ii, n] = np.float32(c[i0 + ii, n0 + n])
        if promote > 0:
            for ii in range(i1 - i0):
                for n in range(nn):
                    tot[ii, n] = acc[ii, n]
                    acc[ii, n] = 0.0
        cnt = 0
        for kb in range(0, K, L):
            blk = kb // L
            sb = kb // sblk
            bsp = bspec[blk, nt]
            xbr = xb[sb, n0:n1]
            for ii in range(i1 - i0):
                i = i0 + ii
                accr = acc[ii, :nn]
                # the largest exponent: products (pass 1), the scales, C, the floor
                pmr = pm[:nn]
                pmr[:] = NONE16
                for k in range(kb, kb + L):
                    ea = ae[i, k]
                    if ea == NONE16:
                        continue
                    _p1(pmr, be[k, n0:n1], ea)
                xai = xa[i, sb]
                Er = E[:nn]
                for n in range(nn):
                    pe = np.int32(pmr[n])
                    Er[n] = max(pe + xai + xbr[n] if pe > _REAL else NONE32, zexp)
                _acc_exp(Er, accb[ii, :nn], emin)
                # C's aligned term (in X) and the inverse scale 2**(E - F) (in s64)
                for n in range(nn):
                    e = Er[n]
                    Xi[n] = pow2_bits(F - e) if e > _REAL else _ONE64
                    s64i[n] = pow2_bits(e - F) if e > _REAL else _ONE64
                Xr = X[:nn]
                for n in range(nn):
                    Xr[n] *= np.float64(accr[n])
                if rd:
                    for n in range(nn):
                        Xr[n] = np.floor(Xr[n])
                else:
                    for n in range(nn):
                        Xr[n] = np.trunc(Xr[n])
                if all_f64 or bsp or aspec[i, blk]:
                    # fallback: float64 products with the scales' exponents and significands
                    sga_i = sga[i, sb]
                    sgbr = sgb[sb, n0:n1]
                    for n in range(nn):
                        e = Er[n]
                        scp[n] = pow2_bits(F - e + xai + xbr[n]) if e > _REAL else _ONE64
                        Sf[n] = 0.0
                    Sfr = Sf[:nn]
                    unit = sgu
                    for k in range(kb, kb + L):
                        va = np.float64(av[i, k]) * sga_i
                        if va == 0.0 and not bsp:
                            continue
                        if rd:
                            _p2f_rd(Sfr, bv[k, n0:n1], va, sgbr, scpf[:nn])
                        elif unit:
                            _p2f1(Sfr, bv[k, n0:n1], va, scpf[:nn])
                        else:
                            _p2f(Sfr, bv[k, n0:n1], va, sgbr, scpf[:nn])
                    for n in range(nn):
                        Xr[n] = (Xr[n] + Sfr[n]) * s64[n]
                else:
                    # fast path: float32 products, int32 chunk sums
                    for n in range(nn):
                        e = Er[n]
                        sp = F - e + xai + xbr[n]
                        sp = min(sp, 127)
                        sci[n] = ((sp + 127) << 23) if (e > _REAL and sp >= -126) else 0
                    scr = scf[:nn]
                    for ch in range(nch):
                        Sr = S[ch, :nn]
                        Sr[:] = 0
                        for k in range(kb + ch * chunk, min(kb + L, kb + (ch + 1) * chunk)):
                            va = av[i, k]
                            if va == 0.0:
                                continue
                            if rd:
                                _p2i_rd(Sr, bv[k, n0:n1], np.float32(va), scr)
                            else:
                                _p2i(Sr, bv[k, n0:n1], np.float32(va), scr)
                    for ch in range(nch):
                        Sr = S[ch, :nn]
                        for n in range(nn):
                            Xr[n] += np.float64(Sr[n])
                    for n in range(nn):
                        Xr[n] *= s64[n]
                _round_out(Xr, Xi[:nn], Qi[:nn], Ri[:nn], accr, p, mode, emin, emax, ovf_inf)
            cnt += L
            if promote > 0 and (cnt == promote or kb + L >= K):
                for ii in range(i1 - i0):
                    for n in range(nn):
                        tot[ii, n] = np.float32(tot[ii, n] + acc[ii, n])
                        acc[ii, n] = 0.0
                cnt = 0
        res = tot if promote > 0 else acc
        for ii in range(i1 - i0):
            for n in range(nn):
                out[i0 + ii, n0 + n] = np.float64(res[ii, n])


# ------------------------------------------------------------------ grouped (GST-FDPA: MXFP4 / NVFP4)
@njit(cache=True)
def _g_add(gv, nz, bvr, bnzr, va):
    for n in range(gv.size):
        gv[n] += va * bvr[n]
        nz[n] |= bnzr[n]


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
    nmt = (M + _MB - 1) // _MB
    nnt = (N + _NB - 1) // _NB
    for t in prange(nmt * nnt):
        mt = t // nnt
        nt = t % nnt
        i0 = mt * _MB
        i1 = min(M, i0 + _MB)
        n0 = nt * _NB
        n1 = min(N, n0 + _NB)
        nn = n1 - n0
        accb = np.zeros((_MB, _NB), np.int32)
        acc = accb.view(np.float32)
        tot = np.zeros((_MB, _NB), np.float32)
        gv = np.zeros((ng, _NB), av.dtype)
        nz = np.zeros((ng, _NB), np.int16)
        ge = np.empty((ng, _NB), np.int32)
        gs = np.empty((ng, _NB))
        E = np.empty(_NB, np.int32)
        Xi = np.empty(_NB, np.int64)
        X = Xi.view(np.float64)
        s64i = np.empty(_NB, np.int64)
        s64 = s64i.view(np.float64)
        gpi = np.empty(_NB, np.int64)
        gp = gpi.view(np.float64)
        Qi = np.empty(_NB, np.int64)
        Ri = np.empty(_NB, np.int64)
        for ii in range(i1 - i0):
            for n in range(nn):
                acc[ii, n] = np.float32(c[i0 + ii, n0 + n])
        if promote > 0:
            for ii in range(i1 - i0):
                for n in range(nn):
                    tot[ii, n] = acc[ii, n]
                    acc[ii, n] = 0.0
        cnt = 0
        for kb in range(0, K, L):
            for ii in range(i1 - i0):
                i = i0 + ii
                accr = acc[ii, :nn]
                Er = E[:nn]
                Er[:] = zexp
                for g in range(ng):
                    k0 = kb + g * G
                    gvr = gv[g, :nn]
                    nzr = nz[g, :nn]
                    gvr[:] = 0
                    nzr[:] = 0
                    for k in range(k0, k0 + G):
                        va = av[i, k]
                        if va == 0:
                            continue
                        _g_add(gvr, nzr, bv[k, n0:n1], bnz[k, n0:n1], va)
                    s = k0 // sblk
                    ma = sga[i, s] * unit
                    xai = xa[i, s]
                    sbr = sgb[s, n0:n1]
                    xbr = xb[s, n0:n1]
                    ger = ge[g, :nn]
                    gsr = gs[g, :nn]
                    for n in range(nn):
                        ms = ma * sbr[n]
                        gsr[n] = np.float64(gvr[n]) * ms
                        real = nzr[n] != 0 and ms != 0.0 and abs(ms) < np.inf
                        e = xai + xbr[n]
                        ger[n] = e if real else NONE32
                        Er[n] = max(Er[n], e if real else NONE32)
                _acc_exp(Er, accb[ii, :nn], emin)
                for n in range(nn):
                    e = Er[n]
                    Xi[n] = pow2_bits(F - e) if e > _REAL else _ONE64
                    s64i[n] = pow2_bits(e - F) if e > _REAL else _ONE64
                Xr = X[:nn]
                for n in range(nn):
                    Xr[n] = np.trunc(Xr[n] * np.float64(accr[n]))
                for g in range(ng):
                    ger = ge[g, :nn]
                    gsr = gs[g, :nn]
                    for n in range(nn):
                        ee = ger[n]
                        gpi[n] = pow2_bits(ee + F - Er[n]) if ee > _REAL else _ONE64
                    for n in range(nn):
                        v = gsr[n] * gp[n]
                        Xr[n] += np.trunc(v) if ger[n] > _REAL else v  # 0 (or NaN from a NaN scale)
                for n in range(nn):
                    Xr[n] *= s64[n]
                _round_out(Xr, Xi[:nn], Qi[:nn], Ri[:nn], accr, p, mode, emin, emax, ovf_inf)
            cnt += L
            if promote > 0 and (cnt == promote or kb + L >= K):
                for ii in range(i1 - i0):
                    for n in range(nn):
                        tot[ii, n] = np.float32(tot[ii, n] + acc[ii, n])
                        acc[ii, n] = 0.0
                cnt = 0
        res = tot if promote > 0 else acc
        for ii in range(i1 - i0):
            for n in range(nn):
                out[i0 + ii, n0 + n] = np.float64(res[ii, n])


# ------------------------------------------------------------------ interleaved (GTR-FDPA: CDNA3 MFMA)
@njit(cache=True, parallel=True)
def interleaved_kernel(av, ae, bv, be, aspec, bspec, c, L, F, F2, promote, out):
    """AMD CDNA3 FP8 MFMA accumulation along K, blocks of ``L`` (even and odd k: two lanes).

    Arguments as :func:`fused_kernel` (values float32, no scales); F2 is ``sum_frac_bits``.  The
    output is fp32 (RNE).  Lane sums: at most L / 2 integers below 2**(F + 2) each, in int32 on the
    fast path (F + 2 + log2(L / 2) <= 31), in float64 on the fallback path.
    """
    M, K = av.shape
    N = bv.shape[1]
    nmt = (M + _MB - 1) // _MB
    nnt = (N + _NB - 1) // _NB
    fast_ok = (L // 2) * (1 << (F + 2)) <= (1 << 31)  # the lane sums fit int32
    for t in prange(nmt * nnt):
        mt = t // nnt
        nt = t % nnt
        i0 = mt * _MB
        i1 = min(M, i0 + _MB)
        n0 = nt * _NB
        n1 = min(N, n0 + _NB)
        nn = n1 - n0
        acc = np.zeros((_MB, _NB), np.float32)
        tot = np.zeros((_MB, _NB), np.float32)
        pm = np.empty((2, _NB), np.int16)
        sci = np.empty((2, _NB), np.int32)
        scf = sci.view(np.float32)
        scdi = np.empty((2, _NB), np.int64)
        scd = scdi.view(np.float64)
        S = np.empty((2, _NB), np.int32)
        Sf = np.empty((2, _NB))
        Wi = np.empty((1, _NB), np.int64)
        W = Wi.view(np.float64)
        for ii in range(i1 - i0):
            for n in range(nn):
                acc[ii, n] = np.float32(c[i0 + ii, n0 + n])
        if promote > 0:
            for ii in range(i1 - i0):
                for n in range(nn):
                    tot[ii, n] = acc[ii, n]
                    acc[ii, n] = 0.0
        cnt = 0
        for kb in range(0, K, L):
            blk = kb // L
            bsp = bspec[blk, nt]
            for ii in range(i1 - i0):
                i = i0 + ii
                for lane in range(2):
                    pmr = pm[lane, :nn]
                    pmr[:] = NONE16
                    for k in range(kb + lane, kb + L, 2):
                        ea = ae[i, k]
                        if ea == NONE16:
                            continue
                        _p1(pmr, be[k, n0:n1], ea)
                slow = bsp or aspec[i, blk] or not fast_ok
                for lane in range(2):
                    pmr = pm[lane, :nn]
                    if slow:
                        for n in range(nn):
                            e = np.int32(pmr[n])
                            scdi[lane, n] = pow2_bits(F - e) if e > _REAL else _ONE64
                        Sr = Sf[lane, :nn]
                        Sr[:] = 0.0
                        for k in range(kb + lane, kb + L, 2):
                            va = np.float64(av[i, k])
                            if va == 0.0 and not bsp:
                                continue
                            for n in range(nn):
                                Sr[n] += np.trunc(va * np.float64(bv[k, n0 + n]) * scd[lane, n])
                    else:
                        for n in range(nn):
                            e = np.int32(pmr[n])
                            sci[lane, n] = ((F - e + 127) << 23) if e > _REAL else 0
                        Sr = S[lane, :nn]
                        Sr[:] = 0
                        scr = scf[lane, :nn]
                        for k in range(kb + lane, kb + L, 2):
                            va = av[i, k]
                            if va == 0.0:
                                continue
                            _p2i(Sr, bv[k, n0:n1], np.float32(va), scr)
                        for n in range(nn):
                            Sf[lane, n] = np.float64(Sr[n])
                _interleave_fin(pm, Sf, acc[ii], Wi, W, nn, F, F2)
            cnt += L
            if promote > 0 and (cnt == promote or kb + L >= K):
                for ii in range(i1 - i0):
                    for n in range(nn):
                        tot[ii, n] = np.float32(tot[ii, n] + acc[ii, n])
                        acc[ii, n] = 0.0
                cnt = 0
        res = tot if promote > 0 else acc
        for ii in range(i1 - i0):
            for n in range(nn):
                out[i0 + ii, n0 + n] = np.float64(res[ii, n])


@njit(cache=True)
def _interleave_fin(pm, Sf, accr, Wi, W, nn, F, F2):
    """Add the two lanes (cut toward -inf), C (cut toward -inf) and round: the CDNA3 datapath's end.

    Lane sums Sf[lane] are integers in units of 2**(pm[lane] - F).  With ed the larger lane exponent,
    ec C's exponent (at least -126) and em = max(ed, ec): the lanes are cut to units 2**(ed - F) and
    added, their sum cut to units 2**(em - F2 - 1), C to units 2**(em - F) (dropped when ec is more
    than F + 1 below em), the total cut toward -inf to F2 fraction bits and rounded to fp32 RNE.
    Every scaling is by a power of two within float64's normal range (exact)."""
    for n in range(nn):
        e0 = np.int32(pm[0, n])
        e1 = np.int32(pm[1, n])
        ed = max(e0, e1)
        s0 = np.floor(Sf[0, n] * _P2[e0 - ed + _P2OFF]) if e0 > _REAL else Sf[0, n]
        s1 = np.floor(Sf[1, n] * _P2[e1 - ed + _P2OFF]) if e1 > _REAL else Sf[1, n]
        sd = s0 + s1  # units 2**(ed - F); +-inf / NaN on the fallback path
        x = np.float64(accr[n])
        if not (abs(x) < np.inf) or not (abs(sd) < np.inf):
            accr[n] = np.float32(x + sd)  # IEEE: inf / NaN
            continue
        W[0, n] = x
        ec = np.int32((Wi[0, n] >> np.int64(52)) & np.int64(0x7FF)) - 1023
        ec = max(ec, -126)
        em = max(ed, ec) if ed > _REAL else ec
        cu = np.floor(x * _P2[F - em + _P2OFF]) if ec >= em - F - 1 else 0.0  # units 2**(em - F)
        if ed > _REAL:
            sd = np.floor(sd * _P2[ed - em + F2 + 1 - F + _P2OFF])  # units 2**(em - F2 - 1)
        v = (sd + cu * _P2[F2 + 1 - F + _P2OFF]) * _P2[em - F2 - 1 + _P2OFF]
        if v == 0.0:
            accr[n] = 0.0
            continue
        W[0, n] = v
        ev = np.int32((Wi[0, n] >> np.int64(52)) & np.int64(0x7FF)) - 1023
        ev = max(ev, -126)
        accr[n] = np.float32(np.floor(v * _P2[F2 - ev + _P2OFF]) * _P2[ev - F2 + _P2OFF])


#: 2**e for e in -1022..1023 at index e + _P2OFF (exact powers of two)
_P2OFF = 1022
_P2 = np.ldexp(1.0, np.arange(-1022, 1024))
