"""The bit-level reference kernels of the accumulator models (numba).

One instruction (:func:`_instr`) takes K = 32 products in the model's order, in blocks; each block
is one fused multi-term addition (``kind="fused"``: :func:`_fused_block`, its result rounded by
:func:`round_out`), an exact sum rounded once to fp32 (``"exact"``: :func:`_exact_block`), or, for
``"fp32"``, the products are added one by one in fp32.  Blocks holding inf or NaN go through IEEE
float64 arithmetic (:func:`_special_block`).  :func:`matmul_kernel` chains the instructions along K,
with optional promotion into an fp32 accumulator.

The kernels read the model as a :class:`~fp8sim.tensorcore.model.ModelParams` (``P``) and each
operand as the arrays of its :class:`~fp8sim.tensorcore.codes.CodeTable`.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .. import _fpenv
from ..rounding import RoundMode
from .model import FP32, FUSED

__all__ = ["matmul_kernel", "round_out"]

# output rounding modes (compile-time constants)
RNE = int(RoundMode.RNE)
RUP = int(RoundMode.RUP)
RDN = int(RoundMode.RDN)


@njit(cache=True, inline="always")
def _bitlen(x):
    n = 0
    while x > 0:
        x >>= 1
        n += 1
    return n


@njit(cache=True)
def round_out(S, q, neg, P):
    """Round the exact value (-1)**neg * S * 2**q (S >= 0 integer) to the output.

    Returns a float64 holding the rounded value (exact in the output format)."""
    p = P.out_frac_bits
    mode = P.out_rounding
    emin = P.out_emin
    emax = P.out_emax
    if S == 0:
        return 0.0
    L = _bitlen(S)
    E = q + L - 1
    if E < emin:
        E = emin
    qe = E - p
    if qe > q:
        sh = qe - q
        if sh >= 63:
            r = 0
            rem_nz = S != 0
            above_half = False
            is_half = False
            if sh == 63:
                above_half = S > (1 << 62)
                is_half = S == (1 << 62)
        else:
            r = S >> sh
            rem = S - (r << sh)
            half = np.int64(1) << (sh - 1)
            rem_nz = rem != 0
            above_half = rem > half
            is_half = rem == half
        if mode == RNE:
            if above_half or (is_half and (r & 1) == 1):
                r += 1
        elif mode == RDN:  # toward -inf
            if rem_nz and neg:
                r += 1
        elif mode == RUP:  # toward +inf
            if rem_nz and not neg:
                r += 1
        # RTZ: nothing
        if r >= (np.int64(1) << (p + 1)):
            r >>= 1
            qe += 1
    else:
        r = S << (q - qe)
    if r == 0:
        return 0.0  # underflow to zero: +0 (the H200 returns +0 for f16 results that round to 0)
    # overflow
    if r > 0 and qe + _bitlen(r) - 1 > emax:
        if mode == RNE or (mode == RUP and not neg) or (mode == RDN and neg):
            return -np.inf if neg else np.inf
        r = (np.int64(1) << (p + 1)) - 1
        qe = emax - p
    v = math.ldexp(float(r), qe)
    return -v if neg else v


@njit(cache=True, inline="always")
def _f32_parts(c, emin):
    """(sig, exp) of a finite non-zero accumulator value c: |c| = sig * 2**(exp - 23),
    with exp clamped at the accumulator format's emin (-126 for fp32, -14 for fp16)."""
    f, x = math.frexp(abs(c))
    e = x - 1
    sig = np.int64(f * 16777216.0)  # 2**24, exact
    if e < emin:
        sig >>= emin - e
        e = emin
    return sig, e


@njit(cache=True)
def _special_block(acc, arow, b, j, kb, order, k0, k1, va, vb):
    s = float(acc)
    for idx in range(k0, k1):
        k = kb + order[idx]
        s += va[arow[k]] * vb[b[j, k]]
    return s


@njit(cache=True)
def _fused_block(acc, use_acc, arow, b, j, kb, order, k0, k1, clsA, sgA, sigA, expA, fa, clsB, sgB, sigB, expB, fb, P):
    """One fused multi-term addition; returns a float64 holding an output value."""
    F = P.frac_bits
    align_rd = P.align_rounding == RDN
    prod_norm = P.normalized_products == 1
    # largest exponent among non-zero addends
    emax = -100000
    have = False
    c_nz = use_acc and acc != 0.0
    csig = np.int64(0)
    cexp = 0
    if c_nz:
        csig, cexp = _f32_parts(acc, P.out_emin)
        emax = cexp
        have = True
    sfrac = fa + fb
    for idx in range(k0, k1):
        k = kb + order[idx]
        ca = arow[k]
        cb = b[j, k]
        if clsA[ca] == 0 or clsB[cb] == 0:
            continue
        e = expA[ca] + expB[cb]
        if prod_norm:
            m = sigA[ca] * sigB[cb]
            if m >= (np.int64(1) << (sfrac + 1)):
                e += 1
        if e > emax:
            emax = e
        have = True
    if not have:
        # every addend is zero
        if P.ieee_zero == 1:
            allneg = True
            if use_acc:
                allneg = math.copysign(1.0, acc) < 0
            for idx in range(k0, k1):
                k = kb + order[idx]
                if (sgA[arow[k]] ^ sgB[b[j, k]]) == 0:
                    allneg = False
            return -0.0 if allneg else 0.0
        return 0.0
    S = np.int64(0)
    if c_nz:
        sh = cexp - 23 - emax + F
        if sh >= 0:
            t = csig << sh
            rem = False
        elif sh > -63:
            t = csig >> (-sh)
            rem = (t << (-sh)) != csig
        else:
            t = np.int64(0)
            rem = True
        if acc < 0:
            if align_rd and rem:
                t += 1
            S -= t
        else:
            S += t
    for idx in range(k0, k1):
        k = kb + order[idx]
        ca = arow[k]
        cb = b[j, k]
        if clsA[ca] == 0 or clsB[cb] == 0:
            continue
        m = sigA[ca] * sigB[cb]
        sh = expA[ca] + expB[cb] - sfrac - emax + F
        if sh >= 0:
            t = m << sh
            rem = False
        elif sh > -63:
            t = m >> (-sh)
            rem = (t << (-sh)) != m
        else:
            t = np.int64(0)
            rem = True
        if sgA[ca] ^ sgB[cb]:
            if align_rd and rem:
                t += 1
            S -= t
        else:
            S += t
    neg = S < 0
    if neg:
        S = -S
    if S == 0 and P.ieee_zero == 1:
        return 0.0  # exact cancellation: +0 under RNE-like rules
    return round_out(S, emax - F, neg, P)


@njit(cache=True)
def _fsum(vals, n):
    """Correctly rounded (RN64) sum of vals[:n] (Shewchuk / Python's math.fsum)."""
    p = np.empty(n + 1, np.float64)
    m = 0
    for idx in range(n):
        x = vals[idx]
        i = 0
        for t in range(m):
            y = p[t]
            if abs(x) < abs(y):
                x, y = y, x
            hi = x + y
            lo = y - (hi - x)
            if lo != 0.0:
                p[i] = lo
                i += 1
            x = hi
        p[i] = x
        m = i + 1
    hi = 0.0
    if m > 0:
        m -= 1
        hi = p[m]
        lo = 0.0
        while m > 0:
            x = hi
            m -= 1
            y = p[m]
            hi = x + y
            yr = hi - x
            lo = y - yr
            if lo != 0.0:
                break
        if m > 0 and ((lo < 0.0 and p[m - 1] < 0.0) or (lo > 0.0 and p[m - 1] > 0.0)):
            y = lo * 2.0
            x = hi + y
            yr = x - hi
            if y == yr:
                hi = x
    return hi


@njit(cache=True)
def _exact_block(acc, arow, b, j, kb, order, k0, k1, va, vb):
    """Exact sum of acc and the block's products, rounded once to fp32 (RNE)."""
    n = k1 - k0 + 1
    vals = np.empty(n + 1, np.float64)
    vals[0] = acc
    for idx in range(k0, k1):
        k = kb + order[idx]
        vals[idx - k0 + 1] = va[arow[k]] * vb[b[j, k]]  # exact
    hi = _fsum(vals, n)
    if hi == 0.0 or not math.isfinite(hi):
        return hi
    # round |hi| to fp32 in float64 arithmetic (all steps exact)
    mag = abs(hi)
    e = math.frexp(mag)[1] - 1
    if e < -126:
        e = -126
    ulp = math.ldexp(1.0, e - 23)
    q = math.floor(mag / ulp)
    down = q * ulp
    if down == mag:
        r = mag
    else:
        mid = down + 0.5 * ulp
        if mag < mid:
            r = down
        elif mag > mid:
            r = down + ulp
        else:
            # hi is an fp32 midpoint: the sign of (exact - hi) decides
            vals[n] = -hi
            res = _fsum(vals, n + 1)
            if hi < 0:
                res = -res
            if res > 0:
                r = down + ulp
            elif res < 0:
                r = down
            else:
                r = down if q % 2 == 0 else down + ulp
    if r > 3.4028234663852886e38:  # rounded beyond FLT_MAX: overflow
        r = np.inf
    return -r if hi < 0 else r


@njit(cache=True)
def _instr(acc, arow, b, j, kb, order, clsA, sgA, sigA, expA, vA, fa, clsB, sgB, sigB, expB, vB, fb, P):
    """One K=32 instruction on columns kb..kb+31 with accumulator input acc
    (a float64 holding an output-format value); returns the new accumulator."""
    kind = P.kind
    blk = P.block
    separate = P.separate_c == 1
    if kind == FP32:  # sequential RNE additions, C first
        a32 = np.float32(acc)
        for idx in range(32):
            k = kb + order[idx]
            p = vA[arow[k]] * vB[b[j, k]]  # exact in float64 (and float32)
            a32 = np.float32(float(a32) + p)
        return float(a32)
    t = 0.0 if separate else acc
    for s in range(0, 32, blk):
        special = not math.isfinite(t)
        if not special:
            for idx in range(s, s + blk):
                k = kb + order[idx]
                if clsA[arow[k]] >= 2 or clsB[b[j, k]] >= 2:
                    special = True
                    break
        if special:
            t = _special_block(t, arow, b, j, kb, order, s, s + blk, vA, vB)
        elif kind == FUSED:
            t = _fused_block(
                t, True, arow, b, j, kb, order, s, s + blk, clsA, sgA, sigA, expA, fa, clsB, sgB, sigB, expB, fb, P
            )
        else:
            t = _exact_block(t, arow, b, j, kb, order, s, s + blk, vA, vB)
    if separate:  # C added to the tensor-core result by an fp32 FADD (RNE)
        return float(np.float32(acc + t))
    return t


@njit(cache=True, parallel=True)
def matmul_kernel(a, b, c, promote, order, clsA, sgA, sigA, expA, vA, fa, clsB, sgB, sigB, expB, vB, fb, P, out):
    """a (B, M, K) uint8, b (B, N, K) uint8 (B transposed, K contiguous), c (B, M, N) float64, out (B, M, N) float64."""
    nb, M, K = a.shape
    N = b.shape[1]
    for r in prange(nb * M):
        fe = _fpenv.enter()  # the IEEE default environment on whichever thread runs the row
        bi = r // M
        i = r % M
        arow = a[bi, i]
        bb = b[bi]
        for j in range(N):
            c0 = c[bi, i, j]
            if promote <= 0:
                acc = c0
                for k0 in range(0, K, 32):
                    acc = _instr(
                        acc, arow, bb, j, k0, order, clsA, sgA, sigA, expA, vA, fa, clsB, sgB, sigB, expB, vB, fb, P
                    )
                out[bi, i, j] = acc
            else:
                tot = np.float32(c0)
                part = 0.0
                cnt = 0
                for k0 in range(0, K, 32):
                    part = _instr(
                        part, arow, bb, j, k0, order, clsA, sgA, sigA, expA, vA, fa, clsB, sgB, sigB, expB, vB, fb, P
                    )
                    cnt += 32
                    if cnt == promote:
                        tot = np.float32(float(tot) + part)
                        part = 0.0
                        cnt = 0
                if cnt > 0:
                    tot = np.float32(float(tot) + part)
                out[bi, i, j] = float(tot)
        _fpenv.leave(fe)
