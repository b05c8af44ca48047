"""Fast bit-exact numba kernel for scaled FP8 GEMMs on the wgmma accumulator model.

This is a re-formulation of :func:`fp8sim.tensorcore.matmul` for the fused
(``kind="fused"``, ``block=32``, ``c_mode="fused"``, ``align_rounding="rz"``,
``product_exponent="nominal"``, ``out_rounding="rz"``, ``output="f32"``)
models -- the sm90 ``"wgmma"`` preset -- that vectorizes over N.  It
relies on three exact identities:

* a product of two FP8 values is exact in float32, and so is its product with
  a power of two ``2**(F - E)`` (no underflow for FP8 products);
* ``trunc(p * 2**(F - E))`` is the addend truncated (toward zero, i.e. the
  magnitude) to ``F`` fraction bits below the largest exponent ``E``: an
  integer below ``2**15`` for ``F = 13``; the sum of 33 of them is exact in
  float32 (below ``2**24``), in any order;
* truncating a normal float32 to ``f`` fraction bits toward zero is masking
  the low ``23 - f`` bits of its pattern.

The largest exponent ``E`` uses the *nominal* exponents (``ea + eb`` from the
per-code tables, subnormals clamped to the format's emin), kept as float32
exponent-field bit patterns so that the max is an integer max.  Promotion
adds the tensor-core partial into an fp32 accumulator with a correctly
rounded fused multiply-add (LLVM ``llvm.fma.f32``) or a separately rounded
multiply and add; see :func:`wgmma_gemm`.

The equality with :func:`fp8sim.tensorcore.matmul` (the model validated
against the H200) is tested bit for bit in tests/test_gemm.py;
:func:`fast_kernel_ok` says which models the kernel computes.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..intrinsics import fma32
from .codes import code_table
from .model import AccumulatorModel

__all__ = ["wgmma_gemm", "code_tables", "fast_kernel_ok", "SCALE_FMA", "SCALE_MUL_ADD", "SCALE_EPILOGUE"]

# scale application modes at promotion / epilogue
SCALE_FMA = 0  # tot = fma(sa*sb, partial, tot)        (DeepGEMM's += compiled with contraction)
SCALE_MUL_ADD = 1  # tot = tot + fp32(sa*sb * partial)      (no contraction)
SCALE_EPILOGUE = 2  # tot = tot + partial at promotion; out = fp32(sa*sb * tot) at the end

_NEG16 = -10000  # exponent of a zero/special code: never the max (int16)


@njit(cache=True, inline="always")
def _promote(tot, acc, s, mode):
    if mode == SCALE_FMA:
        return fma32(s, acc, tot)
    if mode == SCALE_MUL_ADD:
        return np.float32(tot + np.float32(s * acc))
    return np.float32(tot + acc)


@njit(cache=True)
def _pass1(pm, ber, ea):
    for n in range(pm.size):
        pm[n] = max(pm[n], np.int16(ber[n] + ea))


@njit(cache=True)
def _pass2(S, bvr, va, scf):
    for n in range(S.size):
        S[n] += np.trunc((va * bvr[n]) * scf[n])


@njit(cache=True)
def _row_instr(accr, accb, aerow, avrow, askrow, be, bv, k0, n0, n1, pm, sci, invi, scf, invf, S, F, one, keep_bits):
    nn = n1 - n0
    for n in range(nn):
        eb = (accb[n] >> 23) & 0xFF
        pm[n] = np.int16(eb - 127) if eb != 0 else np.int16(_NEG16)
    for k in range(k0, k0 + 32):
        ea = aerow[k]
        if ea == _NEG16:
            continue
        _pass1(pm[:nn], be[k, n0:n1], ea)
    for n in range(nn):
        p = np.int32(pm[n])
        ok = p > -1000
        sci[n] = ((127 + F - p) << 23) if ok else one
        invi[n] = ((127 - F + p) << 23) if ok else one
    for n in range(nn):
        S[n] = np.float32(0.0) + np.trunc(accr[n] * scf[n])
    for k in range(k0, k0 + 32):
        if askrow[k]:
            continue
        _pass2(S[:nn], bv[k, n0:n1], avrow[k], scf[:nn])
    for n in range(nn):
        accr[n] = S[n] * invf[n]
    for n in range(nn):
        accb[n] = accb[n] & keep_bits


@njit(cache=True, parallel=True)
def wgmma_gemm(av, ae, bv, be, sa, sb, kscale, promote, mode, F, keep_bits, a_skip, out):
    """Scaled FP8 GEMM on the fused wgmma accumulator model.

    av, ae : (M, Kp) float32 value / int16 nominal exponent (``_NEG16`` for zero, inf and NaN
             codes) of A's codes
    bv, be : (Kp, N) the same for B (K outer, N contiguous)
    sa     : (M, nks) float32 A scales per K scale block of ``kscale`` elements
    sb     : (nks, N) float32 B scales per K scale block, expanded over N
    promote: promotion interval in K elements (multiple of 32); 0 = never (one chain over K)
    mode   : SCALE_FMA / SCALE_MUL_ADD (scales applied at promotion, needs kscale % promote == 0)
             or SCALE_EPILOGUE (plain fp32 add at promotion, scale sa[:, 0] * sb[0] at the end)
    F      : fraction bits kept below the largest exponent; keep_bits: int32 mask of the kept
             result bits (truncation to the output's fraction bits)
    a_skip : (M, Kp) bool, True where the A product is zero for every column (zero code, no
             special B values), so that the k step can be skipped
    out    : (M, N) float32
    """
    M, Kp = av.shape
    N = bv.shape[1]
    MB = 32
    NB = 512
    nmt = (M + MB - 1) // MB
    nnt = (N + NB - 1) // NB
    one = np.int32(127 << 23)
    for t in prange(nmt * nnt):
        mt = t // nnt
        nt = t % nnt
        i0 = mt * MB
        i1 = min(M, i0 + MB)
        n0 = nt * NB
        n1 = min(N, n0 + NB)
        nn = n1 - n0
        accb2 = np.zeros((MB, NB), np.int32)
        acc = accb2.view(np.float32)
        tot = np.zeros((MB, NB), np.float32)
        pm = np.empty(NB, np.int16)
        sci = np.empty(NB, np.int32)
        invi = np.empty(NB, np.int32)
        S = np.empty(NB, np.float32)
        scf = sci.view(np.float32)
        invf = invi.view(np.float32)
        cnt = 0
        for k0 in range(0, Kp, 32):
            for ii in range(i1 - i0):
                i = i0 + ii
                _row_instr(
                    acc[ii],
                    accb2[ii],
                    ae[i],
                    av[i],
                    a_skip[i],
                    be,
                    bv,
                    k0,
                    n0,
                    n1,
                    pm,
                    sci,
                    invi,
                    scf,
                    invf,
                    S,
                    F,
                    one,
                    keep_bits,
                )
            cnt += 32
            last = k0 + 32 >= Kp
            if promote > 0 and (cnt == promote or last):
                kb = k0 // kscale
                for ii in range(i1 - i0):
                    i = i0 + ii
                    s_a = sa[i, kb]
                    totr = tot[ii]
                    accr = acc[ii]
                    sbr = sb[kb]
                    for n in range(nn):
                        s = np.float32(s_a * sbr[n0 + n])
                        totr[n] = _promote(totr[n], accr[n], s, mode)
                        accr[n] = 0.0
                cnt = 0
        for ii in range(i1 - i0):
            i = i0 + ii
            res = tot[ii] if promote > 0 else acc[ii]
            s_a = sa[i, 0]
            sbr = sb[0]
            for n in range(nn):
                r = res[n]
                if mode == SCALE_EPILOGUE:
                    r = np.float32(np.float32(s_a * sbr[n0 + n]) * r)
                out[i, n0 + n] = r


def code_tables(fmt, subnormal_exponent: str = "clamp"):
    """(value float32[256], nominal exponent bits int32[256], special bool[256]) for an FP8 format."""
    cls, sign, sig, exp, vals = code_table(fmt, subnormal_exponent)
    v = vals.astype(np.float32)
    e = np.where(cls == 1, exp, _NEG16).astype(np.int16)
    return v, e, cls >= 2


def fast_kernel_ok(model: AccumulatorModel) -> bool:
    """Whether :func:`wgmma_gemm` computes ``model`` bit for bit (the fused wgmma-type models)."""
    return (
        model.kind == "fused"
        and model.block == 32
        and model.c_mode == "fused"
        and model.align_rounding == "rz"
        and model.product_exponent == "nominal"
        and model.subnormal_exponent == "clamp"
        and model.out_rounding == "rz"
        and model.output == "f32"
        and model.k_order is None
        and model.zero_sign == "positive"
        and model.frac_bits <= 13
        and model.out_frac_bits <= 13
    )
