"""Bit-exact BF16 matrix multiplication on a fused tensor-core accumulator (numba).

Hopper's ``wgmma ... m64nNk16 .f32.bf16.bf16`` takes 16 products per instruction.  As a ``"fused"``
:class:`~fp8sim.tensorcore.model.AccumulatorModel` (fields as documented there), one instruction is

1. ``16 / block`` consecutive blocks of exact bf16 x bf16 products, taken in order along K;
2. per block: the running fp32 accumulator (with ``c_mode="fused"``) and the products are aligned
   to the largest exponent among the non-zero addends (a product's exponent is ``ea + eb``, its
   significand in [1, 4), for ``product_exponent="nominal"``), each addend cut to ``frac_bits``
   fraction bits below it (``align_rounding``), summed exactly, normalised and rounded to
   ``out_frac_bits`` fraction bits (``out_rounding``) as an fp32 value;
3. with ``c_mode="separate"`` the block results start from 0 and the accumulator is added to the
   instruction's result by an fp32 RNE addition.

:func:`bf16_matmul` chains the instructions along the K it is given, from a zero accumulator
(split-K slices, if any, are the caller's: slice K and add the fp32 slice results).
A K that is not a multiple of 16 is padded with zero products (which change nothing).
Inf and NaN inputs take an IEEE float64 path; a NaN result is written as ``model.nan_bits``.
A zero result is +0 (the chain starts from +0, so ``zero_sign`` changes nothing).

:data:`MODEL_WGMMA_BF16` is the model fitted to torch's BF16 GEMMs on an H200 (cuBLASLt 13.1,
tests/test_bf16_baseline.py) and checked on single ``wgmma`` instructions there (overflow, tiny
products, the whole code space: tests/test_wide_h200.py): its alignment exponent is at least -133
(MMA-Sim's e_zero) and an overflowing RZ result is inf.

Models that :mod:`fp8sim.tensorcore.scaled_mma`'s kernels compute (every preset) run there (the same
bits, and about 15x faster than this module's kernel); this module's kernel computes the research
variants those kernels do not take (``c_mode="separate"``, ``product_exponent="normalized"``).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import njit, prange

from .. import _fpenv
from .._fpenv import ieee_defaults
from ..formats import format as get_format
from ..rounding import RoundMode
from ._bitexact import round_out
from .kernels import get_kernel
from .model import FUSED, AccumulatorModel, model_params
from .scaled_mma import run_general

__all__ = ["bf16_matmul", "bf16_tables", "K_BF16", "MODEL_WGMMA_BF16"]

K_BF16 = 16  # products per BF16 wgmma instruction (m64nNk16)

_RNE = int(RoundMode.RNE)
_RUP = int(RoundMode.RUP)
_RDN = int(RoundMode.RDN)

_ZERO_EXP = -(1 << 20)  # exponent of a zero operand: its products never set the largest exponent
_SHIFT_UP = 30  # products are shifted up by this much before the (single) alignment right shift


@functools.lru_cache(maxsize=1)
def _bf16_values():
    """float64 value of every bf16 code (inf and NaN included)."""
    with np.errstate(invalid="ignore"):
        v = (np.arange(65536, dtype=np.uint32) << 16).view(np.float32).astype(np.float64)
    v.flags.writeable = False
    return v


@functools.lru_cache(maxsize=4)
@ieee_defaults
def bf16_tables(normalize_subnormals: bool = False):
    """Per-code tables of the 65536 bf16 bit patterns: (sig, exp, neg, special).

    ``|value| = sig * 2**(exp - 7)`` with ``sig < 256``; a subnormal has ``exp = -126`` and
    ``sig < 128`` (or, with ``normalize_subnormals``, its true exponent and ``128 <= sig``); zero
    has ``sig = 0`` and a very small ``exp``; ``special`` is 1 for inf and NaN.
    """
    codes = np.arange(65536, dtype=np.int64)
    e = (codes >> 7) & 0xFF
    m = codes & 0x7F
    sig = np.where(e == 0, m, m | 0x80)
    exp = np.where(e == 0, -126, e - 127)
    if normalize_subnormals:
        for _ in range(7):
            low = (sig > 0) & (sig < 0x80)
            sig = np.where(low, sig << 1, sig)
            exp = np.where(low, exp - 1, exp)
    exp = np.where(sig == 0, _ZERO_EXP, exp)
    neg = (codes >> 15) & 1
    special = (e == 0xFF).astype(np.int8)
    tables = sig.astype(np.int64), exp.astype(np.int64), neg.astype(np.int64), special
    for t in tables:
        t.flags.writeable = False
    return tables


@njit(cache=True)
def _fused(acc, ma, xa, ga, mb, xb, gb, k0, k1, P):
    """One fused addition of acc and the products k0..k1-1 of two decoded rows; a float64 fp32 value.

    m*: significand magnitudes, x*: exponents, g*: sign masks (0 or -1), from :func:`_decode_rows`."""
    F = P.frac_bits
    pn = P.normalized_products
    rd = P.align_rounding == _RDN
    ps = 15 if pn == 1 else 62  # (m >> ps) is the normalisation carry of a product (0 for "nominal")
    emax = np.int64(_ZERO_EXP)
    for k in range(k0, k1):
        emax = max(emax, xa[k] + xb[k] + ((ma[k] * mb[k]) >> ps))
    c_nz = acc != 0.0
    csig = np.int64(0)
    cexp = 0
    if c_nz:
        f, x = math.frexp(abs(acc))
        cexp = x - 1
        csig = np.int64(f * 16777216.0)
        if cexp < -126:
            csig >>= -126 - cexp
            cexp = -126
        if cexp > emax:
            emax = cexp
    if emax <= _ZERO_EXP // 2:
        return 0.0  # every addend is zero
    S = np.int64(0)
    if c_nz:
        sh = cexp - 23 - emax + F
        lost = False
        if sh >= 0:
            t = csig << sh
        elif sh > -63:
            t = csig >> (-sh)
            lost = (t << (-sh)) != csig
        else:
            t = np.int64(0)
            lost = True
        if acc < 0:
            S -= t + (1 if rd and lost else 0)
        else:
            S += t
    base = emax + _SHIFT_UP + 14 - F
    if rd:  # two's-complement truncation (toward -inf)
        for k in range(k0, k1):
            m = ma[k] * mb[k]
            e = xa[k] + xb[k]  # the value's position: nominal, whatever set emax
            g = ga[k] ^ gb[k]
            S += (((m << _SHIFT_UP) ^ g) - g) >> min(base - e, 62)
    else:  # sign-magnitude truncation (toward zero)
        for k in range(k0, k1):
            m = ma[k] * mb[k]
            e = xa[k] + xb[k]  # the value's position: nominal, whatever set emax
            g = ga[k] ^ gb[k]
            S += (((m << _SHIFT_UP) >> min(base - e, 62)) ^ g) - g
    neg = S < 0
    if neg:
        S = -S
    return round_out(S, emax - F, neg, P)


@njit(cache=True, inline="always")
def _fused16(acc, ma, xa, ga, mb, xb, gb, k0, P):
    """:func:`_fused` for one block of 16 products (k0..k0+15), C fused, nominal exponents, RZ alignment."""
    F = P.frac_bits
    emax = np.int64(_ZERO_EXP)
    for k in range(k0, k0 + K_BF16):
        emax = max(emax, xa[k] + xb[k])
    S = np.int64(0)
    if acc != 0.0:
        f, x = math.frexp(abs(acc))
        cexp = x - 1
        csig = np.int64(f * 16777216.0)
        if cexp < -126:
            csig >>= -126 - cexp
            cexp = -126
        emax = max(emax, cexp)
        sh = cexp - 23 - emax + F
        t = csig << sh if sh >= 0 else (csig >> -sh if sh > -63 else 0)
        S = -t if acc < 0 else t
    elif emax <= _ZERO_EXP // 2:
        return 0.0
    base = emax + _SHIFT_UP + 14 - F
    for k in range(k0, k0 + K_BF16):
        g = ga[k] ^ gb[k]
        S += ((((ma[k] * mb[k]) << _SHIFT_UP) >> min(base - xa[k] - xb[k], 62)) ^ g) - g
    neg = S < 0
    return round_out(-S if neg else S, emax - F, neg, P)


@njit(cache=True)
def _special(acc, ar, br, k0, k1, vals):
    """IEEE float64 sum of acc and the products when an inf or NaN is involved."""
    s = acc
    for k in range(k0, k1):
        s += vals[ar[k]] * vals[br[k]]
    return s


@njit(cache=True)
def _has_special(row, sp):
    for k in range(row.shape[0]):
        if sp[row[k]]:
            return True
    return False


@njit(cache=True)
def _decode_rows(x, r0, r1, sig, exp, ng, m, e, g):
    """Rows r0..r1-1 of the bf16 codes x into m (magnitudes), e (exponents), g (sign masks)."""
    for i in range(r0, r1):
        for k in range(x.shape[1]):
            c = x[i, k]
            m[i - r0, k] = sig[c]
            e[i - r0, k] = exp[c]
            g[i - r0, k] = -ng[c]


@njit(cache=True)
def _checked_dot(ar, br, ma, xa, ga, mb, xb, gb, sp, vals, P):
    """The chained dot product of one output with inf/NaN checks per block (IEEE arithmetic there)."""
    separate = P.separate_c == 1
    blk = P.block
    acc = 0.0
    for kb in range(0, ar.shape[0], K_BF16):
        t = 0.0 if separate else acc
        for s in range(kb, kb + K_BF16, blk):
            if math.isfinite(t) and not (_has_special(ar[s : s + blk], sp) or _has_special(br[s : s + blk], sp)):
                t = _fused(t, ma, xa, ga, mb, xb, gb, s, s + blk, P)
            else:
                t = _special(t, ar, br, s, s + blk, vals)
        acc = float(np.float32(acc + t)) if separate else t
    return acc


_CHUNK = 256  # columns of the result per pass (bounds the decoded copy of b)


@njit(cache=True)
def _row(a, b, i, j0, j1, mB, xB, gB, bspec, sig, exp, ng, sp, vals, P, nanv, out):
    """Outputs (i, j0..j1-1): row i of a against the decoded rows of b."""
    K = a.shape[1]
    # the fast path: one fused sum of C and 16 products per instruction, nominal exponents, RZ
    fast = P.block == K_BF16 and P.separate_c == 0 and P.normalized_products == 0 and P.align_rounding != _RDN
    ar = a[i]
    mA = np.empty((1, K), np.int64)
    xA = np.empty((1, K), np.int64)
    gA = np.empty((1, K), np.int64)
    _decode_rows(a, i, i + 1, sig, exp, ng, mA, xA, gA)
    ma = mA[0]
    xa = xA[0]
    ga = gA[0]
    aspec = _has_special(ar, sp)
    for j in range(j0, j1):
        mb = mB[j - j0]
        xb = xB[j - j0]
        gb = gB[j - j0]
        acc = 0.0
        if fast:
            for kb in range(0, K, K_BF16):
                acc = _fused16(acc, ma, xa, ga, mb, xb, gb, kb, P)
        if not fast or aspec or bspec[j] or not math.isfinite(acc):
            # other parameters, inf/NaN inputs or an overflow: the general path
            acc = _checked_dot(ar, b[j], ma, xa, ga, mb, xb, gb, sp, vals, P)
        out[i, j] = nanv if math.isnan(acc) else np.float32(acc)


@njit(cache=True)
def _specials(x, sp):
    """Per row of codes x: whether it holds an inf or NaN."""
    r = np.zeros(x.shape[0], np.bool_)
    for i in range(x.shape[0]):
        r[i] = _has_special(x[i], sp)
    return r


@njit(cache=True, parallel=True)
def _rows(a, b, j0, j1, mB, xB, gB, bspec, sig, exp, ng, sp, vals, P, nanv, out):
    """Outputs (all rows, j0..j1-1), in parallel over the rows."""
    for i in prange(a.shape[0]):
        fe = _fpenv.enter()  # the IEEE default environment on whichever thread runs the row
        _row(a, b, i, j0, j1, mB, xB, gB, bspec, sig, exp, ng, sp, vals, P, nanv, out)
        _fpenv.leave(fe)


@ieee_defaults
def bf16_matmul(a_bits, b_bits, model: AccumulatorModel, *, b_transposed: bool = False) -> np.ndarray:
    """(M, K) @ (K, N) of bf16 bit patterns (uint16) on the fused accumulator ``model``; float32 (M, N).

    ``b_transposed=True`` takes ``b_bits`` as (N, K) (torch's weight layout: ``X @ W.T``).
    The sum over K is one chain of k16 instructions from a zero accumulator (no split-K).
    """
    if not isinstance(model, AccumulatorModel):
        raise TypeError(f"model must be an AccumulatorModel, got {type(model).__name__}")
    if model.kind != "fused" or model.output != "f32":
        raise ValueError(f"bf16_matmul needs a 'fused' model with output 'f32', got {model.kind!r}/{model.output!r}")
    if K_BF16 % model.block:
        raise ValueError(f"block must divide the bf16 instruction's K = {K_BF16}, got {model.block}")
    if model.subnormal_exponent == "fp16":
        raise ValueError("subnormal_exponent='fp16' has no meaning for bf16 inputs (use 'clamp' or 'normalize')")
    if model.k_order is not None:
        raise ValueError("bf16_matmul takes the products in K order (k_order must be None)")
    a = np.asarray(a_bits)
    b = np.asarray(b_bits)
    for name, x in (("a_bits", a), ("b_bits", b)):
        if x.dtype != np.uint16 or x.ndim != 2:
            raise TypeError(f"{name} must be a 2-D uint16 array of bf16 bit patterns, got {x.dtype} {x.shape}")
    if not b_transposed:
        b = b.T
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"K mismatch: a_bits {a_bits.shape}, b_bits {b_bits.shape} (b_transposed={b_transposed})")
    K = a.shape[1]
    Kp = -(-K // K_BF16) * K_BF16
    if Kp != K:
        a = np.pad(a, ((0, 0), (0, Kp - K)))
        b = np.pad(b, ((0, 0), (0, Kp - K)))
    a = np.ascontiguousarray(a)
    b = np.ascontiguousarray(b)
    why = get_kernel("general").claims(model)
    if why is None:  # the general kernels: (M, K) @ (K, N) from a zero accumulator
        bf16 = get_format("bf16")
        with np.errstate(all="ignore"):
            d = run_general(a, np.ascontiguousarray(b.T), np.zeros((a.shape[0], b.shape[0])), bf16, bf16, model)
        d = d.astype(np.float32)
        d.view(np.uint32)[np.isnan(d)] = np.uint32(model.nan_bits)
        return d
    if model.zero_exponent is not None or model.overflow != "ieee" or model.group != 1:
        raise ValueError(
            f"bf16_matmul: model {model.name!r} needs the general kernels (zero_exponent, overflow='inf' or "
            f"group > 1), which do not take it: {why}"
        )
    P = model_params(model)
    assert P.kind == FUSED
    sig, exp, ng, sp = bf16_tables(model.subnormal_exponent == "normalize")
    vals = _bf16_values()
    nanv = np.array([model.nan_bits], np.uint32).view(np.float32)[0]
    N, K = b.shape
    out = np.empty((a.shape[0], N), np.float32)
    bspec = _specials(b, sp)
    nc = min(N, _CHUNK)
    mB, xB, gB = (np.empty((nc, K), np.int64) for _ in range(3))
    for j0 in range(0, N, _CHUNK):
        j1 = min(N, j0 + _CHUNK)
        _decode_rows(b, j0, j1, sig, exp, ng, mB, xB, gB)
        _rows(a, b, j0, j1, mB, xB, gB, bspec, sig, exp, ng, sp, vals, P, nanv, out)
    return out


#: torch's BF16 GEMM on an H200 (cuBLASLt 13.1 nvjet kernels, wgmma m64nNk16 .f32.bf16.bf16)
MODEL_WGMMA_BF16 = AccumulatorModel(
    name="sm90 wgmma f32 (BF16)",
    kind="fused",
    block=16,
    frac_bits=25,
    align_rounding="rz",
    product_exponent="nominal",
    subnormal_exponent="clamp",
    c_mode="fused",
    out_frac_bits=23,
    out_rounding="rz",
    output="f32",
    zero_exponent=-133,
    overflow="inf",
    validated=True,
    description="wgmma.mma_async m64nNk16 .f32 with bf16 inputs on sm_90a: C and 16 products in one fused sum, "
    "25 fraction bits, truncation, RZ to fp32, alignment exponent at least -133, an overflow is inf; validated "
    "on H200 (cuBLASLt bf16 GEMM captures and single-instruction captures, tests/data/wide_sm90)",
)
