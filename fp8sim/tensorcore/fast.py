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

:func:`wgmma_gemm_codes` computes the same result from the codes, for operands
without inf / NaN codes (the common case; :func:`wgmma_gemm` takes the rest).
It decodes the codes through 256-entry tables into packed tiles and runs each
32-product group on a tile of accumulators with one LLVM function
(:func:`fp8sim.tensorcore._fast_blocks.tile_group`): the group's exponent on
int8 lanes, then one FMA rounded toward zero per product into a biased
accumulator, which adds each product truncated toward zero to ``F`` fraction
bits below the exponent (the arithmetic of the CUDA-core kernel; all exact).

The equality with :func:`fp8sim.tensorcore.matmul` (the model validated
against the H200) is tested bit for bit in tests/test_gemm.py and
tests/test_fast_kernel.py; :mod:`fp8sim.tensorcore.kernels` says which models the
kernels compute (the ``"packed"`` and ``"wgmma"`` kernels).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from .. import _fpenv
from ..intrinsics import fma32
from ._fast_blocks import TILE_N, TILE_ROWS, promote_tile, tile_group
from .codes import code_table
from .kernels import packed_operands

__all__ = [
    "wgmma_gemm",
    "wgmma_gemm_codes",
    "code_tables",
    "SCALE_FMA",
    "SCALE_MUL_ADD",
    "SCALE_EPILOGUE",
]

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
        fe = _fpenv.enter()  # the IEEE default environment on whichever thread runs the tile
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
        _fpenv.leave(fe)


def code_tables(fmt, subnormal_exponent: str = "clamp"):
    """(value float32[256], nominal exponent bits int32[256], special bool[256]) for an FP8 format."""
    cls, sign, sig, exp, vals = code_table(fmt, subnormal_exponent)
    v = vals.astype(np.float32)
    e = np.where(cls == 1, exp, _NEG16).astype(np.int16)
    return v, e, cls >= 2


# ---------------------------------------------------------------- packed kernel (_fast_blocks.tile_group)
_MAX_ROWS = 96  # output rows per tile at most (a multiple of TILE_ROWS): B's panel is reused over them
_A_BYTES = 2**28  # packed A per block of rows at most (about; at least one row tile)
_NONE8 = -64  # int8 exponent of a zero code: none + none and none + any real exponent stay in range
_FLOOR = -49  # lower bound of a group's exponent, below every real product and accumulator exponent


@njit(cache=True, parallel=True)
def _count_special(codes, sp):
    """The number of ``codes`` (a flat uint8 array) marked in the 256-entry table ``sp``."""
    n = 0
    for i in prange(codes.size):
        n += sp[codes[i]]
    return n


@njit(cache=True, inline="always")
def _masks(vi, d0, stride, ms, mz, nlanes):
    """``ms[j]`` / ``mz[j]`` = the sign / non-zero bits of the float32 patterns ``vi[d0 + k*stride + j]``
    over k < 32 (bit k), for j < nlanes."""
    for j in range(nlanes):
        ms[j] = 0
        mz[j] = 0
    for k in range(32):
        sh = np.uint32(k)
        for j in range(nlanes):
            x = np.uint32(vi[d0 + k * stride + j])
            ms[j] |= (x >> np.uint32(31)) << sh
            mz[j] |= np.uint32((x & np.uint32(0x7FFFFFFF)) != 0) << sh


@njit(cache=True, parallel=True)
def _decode_a(A, va_t, ea_t, MB, av, ae, am):
    """A's codes (M, Kp) packed per row tile of ``MB`` rows and group: ``av`` / ``ae[((t*ng + g)*MB + r)*32 + k]``
    (value, int8 exponent), ``am[((t*ng + g)*MB + r)*2 + {0, 1}]`` (sign, non-zero masks); rows past M are
    zeros."""
    M, Kp = A.shape
    ng = Kp // 32
    avi = av.view(np.int32)
    Af = A.reshape(-1)
    for t in prange((M + MB - 1) // MB):
        for g in range(ng):
            for r in range(MB):
                d = ((t * ng + g) * MB + r) * 32
                i = t * MB + r
                if i < M:
                    s0 = i * Kp + g * 32
                    for k in range(32):
                        code = Af[s0 + k]
                        av[d + k] = va_t[code]
                        ae[d + k] = ea_t[code]
                else:
                    for k in range(32):
                        av[d + k] = 0.0
                        ae[d + k] = _NONE8
                ms = np.uint32(0)
                mz = np.uint32(0)
                for k in range(32):
                    x = np.uint32(avi[d + k])
                    ms |= (x >> np.uint32(31)) << np.uint32(k)
                    mz |= np.uint32((x & np.uint32(0x7FFFFFFF)) != 0) << np.uint32(k)
                am[d // 16] = np.int32(ms)
                am[d // 16 + 1] = np.int32(mz)


@njit(cache=True, parallel=True)
def _packed_gemm(av, ae, am, M, MB, B, vb_t, eb_t, sa, sb, kscale, promote, mode, F, keep_bits, out, panels, parts):
    """The kernel of :func:`wgmma_gemm_codes`: A packed by :func:`_decode_a` (``M`` rows, tiles of ``MB``),
    B (Kp, N) codes, the value / int8 exponent tables of B's format, ``sa (Mp, nks)`` and ``sb (nks, Np)``
    padded to whole tiles.

    Work items: a chunk of ``panels`` column panels times one of ``parts`` row ranges.  Each decodes
    its chunk of B into panels (one k row of a panel contiguous, masks per group) and sweeps its row
    tiles over them, so that the chunk stays in cache while A streams once per chunk."""
    Kp, N = B.shape
    NB = TILE_N
    nmt = (M + MB - 1) // MB
    nnt = (N + NB - 1) // NB
    nch = (nnt + panels - 1) // panels
    ng = Kp // 32
    T = MB * NB
    nks = sa.shape[1]
    Np = sb.shape[1]
    saf = sa.reshape(-1)
    sbf = sb.reshape(-1)
    Bf = B.reshape(-1)
    for job in prange(nch * parts):
        fe = _fpenv.enter()  # tile_group's rounding-mode switch starts from and returns to this default
        c = job // parts
        part = job % parts
        pc0 = c * panels
        npan = min(panels, nnt - pc0)
        bv = np.empty(npan * Kp * NB, np.float32)
        be = np.empty(npan * Kp * NB, np.int8)
        bm = np.empty(npan * ng * 2 * NB, np.int32)
        bvi = bv.view(np.int32)
        ms = np.empty(NB, np.uint32)
        mz = np.empty(NB, np.uint32)
        for k in range(Kp):  # one row of the chunk's codes at a time (rows of B are N apart)
            for pi in range(npan):
                n0 = (pc0 + pi) * NB
                w = min(N, n0 + NB) - n0
                d = (pi * Kp + k) * NB
                s0 = k * N + n0
                for n in range(w):
                    code = Bf[s0 + n]
                    bv[d + n] = vb_t[code]
                    be[d + n] = eb_t[code]
                for n in range(w, NB):
                    bv[d + n] = 0.0
                    be[d + n] = _NONE8
        for pi in range(npan):
            for g in range(ng):
                _masks(bvi, (pi * Kp + g * 32) * NB, NB, ms, mz, NB)
                m0 = (pi * ng + g) * 2 * NB
                for n in range(NB):
                    bm[m0 + n] = np.int32(ms[n])
                    bm[m0 + NB + n] = np.int32(mz[n])
        acc = np.empty(T, np.float32)
        tot = np.empty(T, np.float32)
        pm = np.empty(T, np.int8)
        for mt in range(part * nmt // parts, (part + 1) * nmt // parts):
            i0 = mt * MB
            for pi in range(npan):
                n0 = (pc0 + pi) * NB
                acc[:] = 0.0
                tot[:] = 0.0
                cnt = 0
                for g in range(ng):
                    k0 = g * 32
                    tg = mt * ng + g
                    tile_group(
                        acc,
                        pm,
                        av,
                        ae,
                        bv,
                        be,
                        am,
                        bm,
                        tg * MB * 32,
                        (pi * Kp + k0) * NB,
                        tg * MB * 2,
                        (pi * ng + g) * 2 * NB,
                        MB,
                        F,
                        _FLOOR,
                        keep_bits,
                    )
                    cnt += 32
                    if promote > 0 and (cnt == promote or g == ng - 1):
                        kb = k0 // kscale
                        promote_tile(tot, acc, saf, sbf, i0 * nks + kb, nks, kb * Np + n0, MB, mode)
                        cnt = 0
                res = tot if promote > 0 else acc
                for r in range(min(MB, M - i0)):
                    s_a = saf[(i0 + r) * nks]
                    for n in range(min(NB, N - n0)):
                        v = res[r * NB + n]
                        if mode == SCALE_EPILOGUE:
                            v = np.float32(np.float32(s_a * sbf[n0 + n]) * v)
                        out[i0 + r, n0 + n] = v
        _fpenv.leave(fe)


def _exp8(e):
    """int8 exponents of a code table (``_NONE8`` for zero and special codes)."""
    return np.where(e == _NEG16, _NONE8, e).astype(np.int8)


def _work_split(nmt: int, nnt: int, threads: int) -> tuple[int, int]:
    """(panels per chunk, row parts): chunks of up to four column panels (about 5 MB of decoded B at
    K = 4096), at least two chunks per thread where N allows, and the row tiles split into parts
    where there are fewer than four work items per thread."""
    panels = max(1, min(4, nnt // (2 * threads)))
    nch = -(-nnt // panels)
    return panels, max(1, min(nmt, -(-4 * threads // nch)))


def _tile_rows(M: int) -> int:
    """Rows per tile: a multiple of TILE_ROWS, at most _MAX_ROWS, with little padding past M."""
    ntiles = -(-M // _MAX_ROWS)
    rows = -(-M // ntiles)
    return TILE_ROWS * -(-rows // TILE_ROWS)


def wgmma_gemm_codes(a_codes, b_codes, fa, fb, sa, sb, kscale, promote, mode, F, keep_bits):
    """:func:`wgmma_gemm` from the codes: ``a_codes (M, Kp)``, ``b_codes (Kp, N)`` uint8 (Kp a multiple
    of 32), ``fa``, ``fb`` their formats, ``sa (M, nks)``, ``sb (nks, N)`` float32; the other
    arguments as for :func:`wgmma_gemm`.

    Decodes through 256-entry tables (A once, B once per chunk of column panels and block of A's rows,
    blocks of up to 256 MiB of packed A: 5.25 bytes per code) and runs each group
    on a tile with :func:`fp8sim.tensorcore._fast_blocks.tile_group`: int8 exponent maxima, then one
    FMA rounded toward zero per product into a biased accumulator, which adds every product
    truncated toward zero to ``F`` fraction bits below the group's exponent (all exact).  Returns
    the (M, N) float32 result, bit-identical to :func:`wgmma_gemm`, or None where an operand holds
    inf / NaN codes, K is empty or the formats are outside its ranges (the ``"packed"`` kernel's conditions in
    :mod:`fp8sim.tensorcore.kernels`; then use :func:`wgmma_gemm`).
    """
    M, Kp = a_codes.shape
    N = b_codes.shape[1]
    if Kp == 0 or M == 0 or N == 0 or Kp >= 2**40 or packed_operands(fa, fb, F) is not None:
        return None  # (K < 2**40 bounds the accumulator's exponent)
    va, ea, spa = code_tables(fa)
    vb, eb, spb = code_tables(fb)
    a_codes = np.ascontiguousarray(a_codes)
    b_codes = np.ascontiguousarray(b_codes)
    if _count_special(a_codes.reshape(-1), spa.astype(np.int64)) or _count_special(
        b_codes.reshape(-1), spb.astype(np.int64)
    ):
        return None
    MB, NB = _tile_rows(M), TILE_N
    nmt, nnt = -(-M // MB), -(-N // NB)
    sa_p = np.ones((nmt * MB, sa.shape[1]), np.float32)
    sa_p[:M] = sa
    sb_p = np.ones((sb.shape[0], nnt * NB), np.float32)
    sb_p[:, :N] = sb
    # A's values times the nudge 1 + 2**-(23 - mbits): exact (at most 24 significant bits)
    va_n = np.where(spa, 0.0, va.astype(np.float64) * (1.0 + 2.0 ** -(23 - fa.mbits))).astype(np.float32)
    ea8, eb8 = _exp8(ea), _exp8(eb)
    # A is packed in blocks of rows (whole tiles) of at most _A_BYTES (5.25 bytes per code), B per block
    RB = MB * max(1, _A_BYTES // (MB * Kp * 21 // 4))
    out = np.empty((M, N), np.float32)
    for r0 in range(0, M, RB):
        rows = min(RB, M - r0)
        nbt = -(-rows // MB)
        av = np.empty(nbt * MB * Kp, np.float32)
        ae = np.empty(nbt * MB * Kp, np.int8)
        am = np.empty(nbt * MB * (Kp // 32) * 2, np.int32)
        panels, parts = _work_split(nbt, nnt, numba.get_num_threads())
        with np.errstate(all="ignore"):
            _decode_a(a_codes[r0 : r0 + rows], va_n, ea8, MB, av, ae, am)
            _packed_gemm(
                av,
                ae,
                am,
                rows,
                MB,
                b_codes,
                vb,
                eb8,
                sa_p[r0 : r0 + nbt * MB],
                sb_p,
                int(kscale),
                int(promote),
                int(mode),
                int(F),
                np.int32(keep_bits),
                out[r0 : r0 + rows],
                panels,
                parts,
            )
    return out
