"""Register-blocked micro-kernels of the packed wgmma GEMM (:func:`fp8sim.tensorcore.fast.wgmma_gemm_codes`).

Two kernels written as numba intrinsics on LLVM vector types, so that a block of outputs stays in
registers over the 32 products of one MMA group (LLVM's loop vectorizer alone streams the
accumulators through memory for every product):

* :func:`mk_exp`: the group's largest nominal product exponent ``max_k (ea[i, k] + eb[k, n])`` for
  ``EXP_ROWS`` rows by ``EXP_LANES`` columns, on int8 lanes (32 per 256-bit vector);
* :func:`mk_group`: the whole group on ``VAL_ROWS`` rows by ``VAL_LANES`` columns: the exponent
  ``p`` (with the accumulator's), every addend truncated toward zero to ``F`` fraction bits below
  ``p`` as ``int32(va * vb * 2**(F - p))`` and summed exactly in int32, the result scaled back and
  masked to the output's fraction bits.

A is read one scalar per row and k (broadcast), either decoded (float32 values, int8 exponents) or
as FP8 codes through a 256-entry table; B as decoded column panels, one k row of ``b_ld`` values
contiguous, its values scaled by ``2**-BIAS_B``.  The power of two ``2**(F - p)`` is applied to a
product by an integer add to its exponent field: exact for the normal float32 products of FP8
values, and a zero product becomes at most 0.5, which truncates to 0.  Offsets and row strides
are in elements.
The vector types are generic LLVM IR: any target compiles them (AVX2 as 256-bit registers,
narrower SIMD as several).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types as nb_types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["mk_exp", "mk_group", "EXP_ROWS", "EXP_LANES", "VAL_ROWS", "VAL_LANES", "BIAS_B"]

#: rows x columns of one :func:`mk_exp` block
EXP_ROWS = 4
EXP_LANES = 64
#: rows x columns of one :func:`mk_group` block
VAL_ROWS = 3
VAL_LANES = 16
_W8 = 32  # int8 lanes per vector
_W32 = 8  # float32 / int32 lanes per vector
_GROUP = 32  # products per MMA group
_UNROLL = 2  # k steps per iteration of a micro-kernel's loop
#: B's values come scaled by 2**-BIAS_B (see the module docstring)
BIAS_B = 64

_i8 = ir.IntType(8)
_i32 = ir.IntType(32)
_i64 = ir.IntType(64)
_f32 = ir.FloatType()


def _data(context, builder, aryty, val, elt):
    """The data pointer of a numba array, as a pointer to ``elt``."""
    ary = context.make_array(aryty)(context, builder, val)
    return builder.bitcast(ary.data, elt.as_pointer())


def _i64v(builder, v):
    return builder.sext(v, _i64) if v.type.width < 64 else v


def _i32v(builder, v):
    if v.type.width > 32:
        return builder.trunc(v, _i32)
    return builder.sext(v, _i32) if v.type.width < 32 else v


def _c64(x):
    return ir.Constant(_i64, x)


def _vconst(vty, x):
    return ir.Constant(vty, [x] * vty.count)


def _splat(builder, x, vty):
    v = builder.insert_element(ir.Constant(vty, ir.Undefined), x, ir.Constant(_i32, 0))
    return builder.shuffle_vector(v, ir.Constant(vty, ir.Undefined), ir.Constant(ir.VectorType(_i32, vty.count), None))


def _vptr(builder, base, off, vty):
    return builder.bitcast(builder.gep(base, [off], inbounds=True), vty.as_pointer())


def _smax(builder, a, b):
    return builder.select(builder.icmp_signed(">", a, b), a, b)


def _k_loop(builder, init, step):
    """``values = step(k, values)`` for k < 32, from ``init`` (a dict of LLVM values), as an LLVM loop
    of ``32 / _UNROLL`` iterations (a fully unrolled group overflows the decoded-instruction cache);
    returns the final values."""
    slots = {key: cgutils.alloca_once(builder, val.type) for key, val in init.items()}
    for key, val in init.items():
        builder.store(val, slots[key])
    with cgutils.for_range(builder, _c64(_GROUP // _UNROLL)) as loop:
        vals = {key: builder.load(slot) for key, slot in slots.items()}
        for u in range(_UNROLL):
            vals = step(builder.add(builder.mul(loop.index, _c64(_UNROLL)), _c64(u)), vals)
        for key, slot in slots.items():
            builder.store(vals[key], slot)
    return {key: builder.load(slot) for key, slot in slots.items()}


def _lookup(builder, codes, table, off):
    """``table[codes[off]]`` (uint8 code, 256-entry table)."""
    c = builder.load(builder.gep(codes, [off], inbounds=True))
    return builder.load(builder.gep(table, [builder.zext(c, _i64)], inbounds=True))


@intrinsic
def mk_exp(typingctx, pm, a_codes, etab, be, p_off, a_off, b_off, p_ld, a_ld, b_ld):
    """``pm[p_off + r*p_ld + n] = max_k (etab[a_codes[a_off + r*a_ld + k]] + be[b_off + k*b_ld + n])``
    over k < 32 for r < EXP_ROWS, n < EXP_LANES (int8 exponents, wrapping add: the caller keeps every
    sum in range)."""
    sig = nb_types.void(pm, a_codes, etab, be, p_off, a_off, b_off, p_ld, a_ld, b_ld)
    vty = ir.VectorType(_i8, _W8)
    nv = EXP_LANES // _W8

    def codegen(context, builder, signature, args):
        P = _data(context, builder, signature.args[0], args[0], _i8)
        direct = signature.args[1].dtype == nb_types.int8
        A = _data(context, builder, signature.args[1], args[1], _i8)
        T = _data(context, builder, signature.args[2], args[2], _i8)
        B = _data(context, builder, signature.args[3], args[3], _i8)
        po, ao, bo, pld, ald, bld = (_i64v(builder, a) for a in args[4:])
        arow = [builder.add(ao, builder.mul(ald, _c64(r))) for r in range(EXP_ROWS)]

        def step(k, acc):
            brow = builder.add(bo, builder.mul(bld, k))
            bvec = [builder.load(_vptr(builder, B, builder.add(brow, _c64(v * _W8)), vty), align=1) for v in range(nv)]
            for r in range(EXP_ROWS):
                ao_k = builder.add(arow[r], k)
                e = builder.load(builder.gep(A, [ao_k], inbounds=True)) if direct else _lookup(builder, A, T, ao_k)
                es = _splat(builder, e, vty)
                for v in range(nv):
                    acc[r, v] = _smax(builder, builder.add(es, bvec[v]), acc[r, v])
            return acc

        acc = _k_loop(builder, {(r, v): _vconst(vty, -128) for r in range(EXP_ROWS) for v in range(nv)}, step)
        for r in range(EXP_ROWS):
            prow = builder.add(po, builder.mul(pld, _c64(r)))
            for v in range(nv):
                builder.store(acc[r, v], _vptr(builder, P, builder.add(prow, _c64(v * _W8)), vty), align=1)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def mk_group(typingctx, acc, pm8, a_codes, vtab, bv, o_off, a_off, b_off, o_ld, a_ld, b_ld, F, floor, keep):
    """One MMA group on the outputs ``o = o_off + r*o_ld + n`` (r < VAL_ROWS, n < VAL_LANES), in place
    on the float32 accumulators ``acc[o]``:

    * the group's exponent ``p = max(pm8[o], exponent of acc[o] (-128 for zero), floor)`` and the
      power of two ``scale = 2**(F - p)``, built as a float32 bit pattern;
    * ``S = int32(acc * scale) + sum_k int32(va * vb[b_off + k*b_ld + n] * 2**BIAS_B * scale)`` over
      k < 32, with ``va = a[a_off + r*a_ld + k]`` (float32 ``a``) or ``vtab[a[...]]`` (uint8 codes):
      the accumulator and every product truncated toward zero to ``F`` fraction bits below ``p``,
      summed exactly in int32;
    * ``acc[o] = S / scale`` (exact) with its bit pattern masked by ``keep``.

    Exact for finite FP8 values whose products ``va * vb`` are normal float32 numbers, with
    ``F - p + BIAS_B`` in [1, 126] and ``S`` below 2**24 in magnitude (the caller's ranges).
    """

    sig = nb_types.void(acc, pm8, a_codes, vtab, bv, o_off, a_off, b_off, o_ld, a_ld, b_ld, F, floor, keep)
    vf = ir.VectorType(_f32, _W32)
    vi = ir.VectorType(_i32, _W32)
    v8 = ir.VectorType(_i8, _W32)
    nv = VAL_LANES // _W32

    def codegen(context, builder, signature, args):
        Ap = _data(context, builder, signature.args[0], args[0], _f32)
        Pp = _data(context, builder, signature.args[1], args[1], _i8)
        direct = signature.args[2].dtype == nb_types.float32
        A = _data(context, builder, signature.args[2], args[2], _f32 if direct else _i8)
        T = _data(context, builder, signature.args[3], args[3], _f32)
        B = _data(context, builder, signature.args[4], args[4], _f32)
        oo, ao, bo, old, ald, bld = (_i64v(builder, a) for a in args[5:11])
        Fv, fl, kp = (_splat(builder, _i32v(builder, a), vi) for a in args[11:14])
        arow = [builder.add(ao, builder.mul(ald, _c64(r))) for r in range(VAL_ROWS)]
        S, scl, kk, offs = {}, {}, {}, {}
        for r in range(VAL_ROWS):
            orow = builder.add(oo, builder.mul(old, _c64(r)))
            for v in range(nv):
                o = builder.add(orow, _c64(v * _W32))
                offs[r, v] = o
                a = builder.load(_vptr(builder, Ap, o, vf), align=4)
                e = builder.and_(builder.lshr(builder.bitcast(a, vi), _vconst(vi, 23)), _vconst(vi, 0xFF))
                nz = builder.icmp_signed("!=", e, _vconst(vi, 0))
                ce = builder.select(nz, builder.sub(e, _vconst(vi, 127)), _vconst(vi, -128))
                pm = builder.sext(builder.load(_vptr(builder, Pp, o, v8), align=1), vi)
                p = _smax(builder, _smax(builder, pm, ce), fl)
                sb = builder.shl(builder.sub(builder.add(_vconst(vi, 127), Fv), p), _vconst(vi, 23))
                scl[r, v] = builder.bitcast(sb, vf)
                kk[r, v] = builder.add(sb, _vconst(vi, (BIAS_B - 127) << 23))
                S[r, v] = builder.fptosi(builder.fmul(a, scl[r, v]), vi)

        def step(k, S):
            brow = builder.add(bo, builder.mul(bld, k))
            bvec = [builder.load(_vptr(builder, B, builder.add(brow, _c64(v * _W32)), vf), align=4) for v in range(nv)]
            for r in range(VAL_ROWS):
                ao_k = builder.add(arow[r], k)
                a = builder.load(builder.gep(A, [ao_k], inbounds=True)) if direct else _lookup(builder, A, T, ao_k)
                asp = _splat(builder, a, vf)
                for v in range(nv):
                    q = builder.bitcast(builder.add(builder.bitcast(builder.fmul(asp, bvec[v]), vi), kk[r, v]), vf)
                    S[r, v] = builder.add(S[r, v], builder.fptosi(q, vi))
            return S

        S = _k_loop(builder, S, step)
        for (r, v), o in offs.items():
            inv = builder.bitcast(builder.sub(_vconst(vi, 254 << 23), builder.bitcast(scl[r, v], vi)), vf)
            res = builder.and_(builder.bitcast(builder.fmul(builder.sitofp(S[r, v], vf), inv), vi), kp)
            builder.store(builder.bitcast(res, vf), _vptr(builder, Ap, o, vf), align=4)
        return context.get_dummy_value()

    return sig, codegen
