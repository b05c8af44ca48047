"""The tile kernel of the packed wgmma GEMM (:func:`fp8sim.tensorcore.fast.wgmma_gemm_codes`).

:func:`tile_group` runs one 32-product MMA group on a tile of ``rows x TILE_N`` fp32 accumulators.
It is one LLVM function, written in LLVM vector IR, so that each block of outputs stays in
registers over the group (LLVM's loop vectorizer alone streams the accumulators through memory
for every product). It has two passes:

1. **Largest exponent.** ``pm[r, n] = max_k (ea[r, k] + eb[k, n])`` on int8 lanes, 32 per 256-bit
   vector, for blocks of ``EXP_ROWS`` rows by 64 columns.
2. **Truncated sum, one FMA per product.** For blocks of ``VAL_ROWS`` rows by ``VAL_LANES``
   columns, the group's exponent is ``p = max(pm, exponent of the accumulator C, floor)``, and
   ``u = 2**(p - F)`` is the spacing the truncation keeps. The sum starts at the bias
   ``M = 1.5 * 2**23 * u``, so every partial sum lies in one binade whose spacing is ``u``. There,
   an FMA rounded toward zero, ``S = fma_rz(a, b, S)``, adds ``floor(a*b / u)``. Truncation toward
   zero differs from floor only for negative addends. A's values are stored times
   ``1 + 2**-(23 - mbits)``, and then ``trunc(q) = floor(q * (1 + eps)) + [q < 0]`` for every
   addend ``q = a*b / u``. The nudge moves no non-integer across an integer, because ``q`` has at
   most ``sa + sb`` significant bits (``2**(sa+sb) * eps <= 1``). It moves every negative integer
   just below itself, because ``|q| < 2**(F + 2)``. C enters the same way, as
   ``fma_rz(c, 1 + 2**-20, M + u [c < 0])``, since it has at most 14 significant bits. The
   ``[q < 0]`` terms are ``popcount((sign_a ^ sign_b) & nz_a & nz_b)`` of 32-bit masks per row and
   column, taken off ``M``'s bit pattern. The group's result ``S - (M - u * #negative)`` is exact.
   Its bit pattern is then masked to the output's fraction bits.

This is the arithmetic of the CUDA-core kernel (:mod:`fp8sim.tensorcore._cuda_source`), which
rounds toward zero with ``__fmaf_rz``. On the CPU, rounding toward zero is the floating-point
environment's rounding mode. The function saves the caller's mode, sets round-toward-zero
(``llvm.set.rounding``), and restores the saved mode before it returns. Inside, every
floating-point operation is a constrained intrinsic (``llvm.experimental.constrained.*``) in a
``strictfp`` function, which LLVM keeps between the two mode changes. The function is never
inlined, so no operation of the caller runs in the changed mode. Every other operation is exact in
any rounding mode. While it runs a group, it prefetches the next group's A and B, which are
stored right after this group's.

:func:`promote_tile` adds a tile's accumulators into the fp32 totals (scale mode as in
:func:`fp8sim.tensorcore.fast.wgmma_gemm`), in the caller's rounding mode, on 8-lane vectors.

Layouts (offsets in elements): ``acc`` and ``pm`` hold the tile, row-major with ``TILE_N``
columns. A is packed per group, ``av``/``ae[a_off + r*32 + k]``, with masks ``am[am_off + 2r]``
(sign bits) and ``am[am_off + 2r + 1]`` (non-zero bits). B is packed per column panel,
``bv``/``be[b_off + k*TILE_N + n]``, with masks ``bm[bm_off + n]`` and
``bm[bm_off + TILE_N + n]``. The vector types are generic LLVM IR, so any target compiles them
(AVX2 as 256-bit registers, narrower SIMD as several).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types as nb_types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["tile_group", "promote_tile", "TILE_N", "TILE_ROWS", "EXP_ROWS", "VAL_ROWS", "VAL_LANES", "C_ETA"]

#: columns of a tile (one B panel)
TILE_N = 64
#: rows x columns of one exponent block
EXP_ROWS = 4
_EXP_LANES = 64
#: rows x columns of one sum block
VAL_ROWS = 6
VAL_LANES = 16
#: a tile's rows are a multiple of this (both block heights)
TILE_ROWS = 12
#: C's nudge ``1 + 2**-20`` (see the module docstring)
C_ETA = 1.0 + 2.0**-20
_W8 = 32  # int8 lanes per vector
_W = 8  # float32 / int32 lanes per vector
_GROUP = 32  # products per MMA group
_UNROLL = 4  # k steps per iteration of the sum loop
_NAME = "fp8sim_wgmma_tile_group_v3"

_i8 = ir.IntType(8)
_i32 = ir.IntType(32)
_i64 = ir.IntType(64)
_f32 = ir.FloatType()
_md = ir.MetaDataType()
_vf = ir.VectorType(_f32, _W)
_vi = ir.VectorType(_i32, _W)
_v8 = ir.VectorType(_i8, _W)
_vb = ir.VectorType(_i8, _W8)


def _c64(x):
    return ir.Constant(_i64, x)


def _vconst(vty, x):
    return ir.Constant(vty, [x] * vty.count)


def _splat(b, x, vty):
    v = b.insert_element(ir.Constant(vty, ir.Undefined), x, ir.Constant(_i32, 0))
    return b.shuffle_vector(v, ir.Constant(vty, ir.Undefined), ir.Constant(ir.VectorType(_i32, vty.count), None))


def _vptr(b, base, off, vty):
    return b.bitcast(b.gep(base, [off], inbounds=True), vty.as_pointer())


def _smax(b, x, y):
    return b.select(b.icmp_signed(">", x, y), x, y)


def _loop(b, n, body, init=None):
    """``vals = body(i, vals)`` for ``i < n`` (an i64 value or an int) as an LLVM loop, from ``init`` (a
    dict of LLVM values, or None); returns the final values."""
    n = n if isinstance(n, ir.Value) else _c64(n)
    slots = {key: cgutils.alloca_once(b, val.type) for key, val in (init or {}).items()}
    for key, val in (init or {}).items():
        b.store(val, slots[key])
    with cgutils.for_range(b, n) as loop:
        vals = body(loop.index, {key: b.load(slot) for key, slot in slots.items()})
        for key, slot in slots.items():
            b.store(vals[key], slot)
    return {key: b.load(slot) for key, slot in slots.items()}


def _declare(mod, name, ret, args):
    return cgutils.get_or_insert_function(mod, ir.FunctionType(ret, args), name)


def _exp_pass(b, pm, ae, be, a_off, b_off, rows):
    """Pass 1: ``pm`` = the group's largest product exponent per output (int8, wrapping adds: the
    caller keeps every sum in range)."""
    nv = _EXP_LANES // _W8

    def row_block(ri, _):
        rb = b.mul(ri, _c64(EXP_ROWS))
        arow = [b.add(a_off, b.mul(b.add(rb, _c64(r)), _c64(_GROUP))) for r in range(EXP_ROWS)]

        def col_block(ci, _):
            cb = b.mul(ci, _c64(_EXP_LANES))

            def step(ki, acc):
                for u in range(2):
                    k = b.add(b.mul(ki, _c64(2)), _c64(u))
                    brow = b.add(b_off, b.add(b.mul(k, _c64(TILE_N)), cb))
                    bvec = [b.load(_vptr(b, be, b.add(brow, _c64(v * _W8)), _vb), align=1) for v in range(nv)]
                    for r in range(EXP_ROWS):
                        es = _splat(b, b.load(b.gep(ae, [b.add(arow[r], k)], inbounds=True)), _vb)
                        for v in range(nv):
                            acc[r, v] = _smax(b, b.add(es, bvec[v]), acc[r, v])
                return acc

            init = {(r, v): _vconst(_vb, -128) for r in range(EXP_ROWS) for v in range(nv)}
            acc = _loop(b, _GROUP // 2, step, init)
            for r in range(EXP_ROWS):
                prow = b.add(b.mul(b.add(rb, _c64(r)), _c64(TILE_N)), cb)
                for v in range(nv):
                    b.store(acc[r, v], _vptr(b, pm, b.add(prow, _c64(v * _W8)), _vb), align=1)
            return {}

        _loop(b, TILE_N // _EXP_LANES, col_block)
        return {}

    _loop(b, b.udiv(rows, _c64(EXP_ROWS)), row_block)


def _prefetch(b, mod, base, off):
    """Prefetch the cache line of ``base[off]`` for reading (never faults, so ``off`` may lie past the end)."""
    i8p = _i8.as_pointer()
    fn = mod.declare_intrinsic("llvm.prefetch", [i8p], ir.FunctionType(ir.VoidType(), [i8p, _i32, _i32, _i32]))
    b.call(fn, [b.bitcast(b.gep(base, [off]), i8p), ir.Constant(_i32, 0), ir.Constant(_i32, 3), ir.Constant(_i32, 1)])


def _sum_pass(b, mod, acc_p, pm, av, ae, bv, be, am, bm, a_off, b_off, am_off, bm_off, rows, F, floor, keep):
    """Pass 2 (in round-toward-zero mode): the truncated group sums, into ``acc``."""
    rz = ir.MetaDataString(mod, "round.towardzero")
    ign = ir.MetaDataString(mod, "fpexcept.ignore")
    cfma = _declare(mod, "llvm.experimental.constrained.fma.v8f32", _vf, [_vf, _vf, _vf, _md, _md])
    cfsub = _declare(mod, "llvm.experimental.constrained.fsub.v8f32", _vf, [_vf, _vf, _md, _md])
    ctpop = _declare(mod, "llvm.ctpop.v8i32", _vi, [_vi])
    nv = VAL_LANES // _W
    flv = _splat(b, floor, _vi)
    kpv = _splat(b, keep, _vi)
    # M's bit pattern is (p + 127 + 23 - F) << 23 | 1.5's fraction bit
    mconst = b.add(b.shl(b.sub(_vconst(_vi, 150), _splat(b, F, _vi)), _vconst(_vi, 23)), _vconst(_vi, 0x400000))
    eta = _vconst(_vf, C_ETA)

    def fma(x, y, z):
        return b.call(cfma, [x, y, z, rz, ign])

    def row_block(ri, _):
        rb = b.mul(ri, _c64(VAL_ROWS))
        arow = [b.add(a_off, b.mul(b.add(rb, _c64(r)), _c64(_GROUP))) for r in range(VAL_ROWS)]

        def col_block(ci, _):
            cb = b.mul(ci, _c64(VAL_LANES))
            S, mbits, offs = {}, {}, {}
            # prefetch the next group's A and B (stored right after this group's), a few lines per block:
            # A's values are 3 cache lines per block, the exponents at most 1 each, B's values 2 (all of
            # them in a 96-row tile; the hardware prefetcher fetches the rest of smaller tiles)
            j = b.add(b.mul(ri, _c64(TILE_N // VAL_LANES)), ci)
            a_next = b.add(a_off, b.mul(rows, _c64(_GROUP)))
            b_next = b.add(b_off, _c64(_GROUP * TILE_N))
            for t in range(3):
                _prefetch(b, mod, av, b.add(a_next, b.mul(b.add(b.mul(j, _c64(3)), _c64(t)), _c64(16))))
            for t in range(2):
                _prefetch(b, mod, bv, b.add(b_next, b.mul(b.add(b.mul(j, _c64(2)), _c64(t)), _c64(16))))
            _prefetch(b, mod, ae, b.add(a_next, b.mul(j, _c64(64))))
            _prefetch(b, mod, be, b.add(b_next, b.mul(j, _c64(64))))
            for r in range(VAL_ROWS):
                orow = b.add(b.mul(b.add(rb, _c64(r)), _c64(TILE_N)), cb)
                for v in range(nv):
                    o = offs[r, v] = b.add(orow, _c64(v * _W))
                    c = b.load(_vptr(b, acc_p, o, _vf), align=4)
                    cb_ = b.bitcast(c, _vi)
                    ce = b.sub(b.and_(b.lshr(cb_, _vconst(_vi, 23)), _vconst(_vi, 0xFF)), _vconst(_vi, 127))
                    e = b.sext(b.load(_vptr(b, pm, o, _v8), align=1), _vi)
                    p = _smax(b, _smax(b, e, ce), flv)  # C = 0 gives ce = -127, below the floor
                    m = mbits[r, v] = b.add(b.shl(p, _vconst(_vi, 23)), mconst)
                    # C first: M + u when C < 0 (C is never -0)
                    S[r, v] = fma(c, eta, b.bitcast(b.sub(m, b.ashr(cb_, _vconst(_vi, 31))), _vf))

            def step(ki, S):
                for u in range(_UNROLL):
                    k = b.add(b.mul(ki, _c64(_UNROLL)), _c64(u))
                    brow = b.add(b_off, b.add(b.mul(k, _c64(TILE_N)), cb))
                    bvec = [b.load(_vptr(b, bv, b.add(brow, _c64(v * _W)), _vf), align=4) for v in range(nv)]
                    for r in range(VAL_ROWS):
                        a = _splat(b, b.load(b.gep(av, [b.add(arow[r], k)], inbounds=True)), _vf)
                        for v in range(nv):
                            S[r, v] = fma(a, bvec[v], S[r, v])
                return S

            S = _loop(b, _GROUP // _UNROLL, step, S)
            bcol = b.add(bm_off, cb)
            bsg = [b.load(_vptr(b, bm, b.add(bcol, _c64(v * _W)), _vi), align=4) for v in range(nv)]
            bnz = [b.load(_vptr(b, bm, b.add(bcol, _c64(TILE_N + v * _W)), _vi), align=4) for v in range(nv)]
            for r in range(VAL_ROWS):
                ma = b.add(am_off, b.mul(b.add(rb, _c64(r)), _c64(2)))
                asg = _splat(b, b.load(b.gep(am, [ma], inbounds=True)), _vi)
                anz = _splat(b, b.load(b.gep(am, [b.add(ma, _c64(1))], inbounds=True)), _vi)
                for v in range(nv):
                    neg = b.call(ctpop, [b.and_(b.and_(b.xor(asg, bsg[v]), anz), bnz[v])])
                    res = b.call(cfsub, [S[r, v], b.bitcast(b.sub(mbits[r, v], neg), _vf), rz, ign])
                    res = b.and_(b.bitcast(res, _vi), kpv)
                    b.store(b.bitcast(res, _vf), _vptr(b, acc_p, offs[r, v], _vf), align=4)
            return {}

        _loop(b, TILE_N // VAL_LANES, col_block)
        return {}

    _loop(b, b.udiv(rows, _c64(VAL_ROWS)), row_block)


def _add_attribute(fn, name):
    """Add a function attribute, also one missing from llvmlite's list of known names."""
    try:
        fn.attributes.add(name)
    except ValueError:
        set.add(fn.attributes, name)


def _define(mod):
    """The tile-group function in ``mod`` (internal linkage, never inlined)."""
    fn = mod.globals.get(_NAME)
    if fn is not None:
        return fn
    ptrs = [_f32, _i8, _f32, _i8, _f32, _i8, _i32, _i32]
    fnty = ir.FunctionType(ir.VoidType(), [t.as_pointer() for t in ptrs] + [_i64] * 5 + [_i32] * 3)
    fn = ir.Function(mod, fnty, _NAME)
    fn.linkage = "internal"
    fn.attributes.add("noinline")
    fn.attributes.add("nounwind")
    _add_attribute(fn, "strictfp")  # it sets the rounding mode: LLVM assumes nothing about its FP environment
    acc, pm, av, ae, bv, be, am, bm, a_off, b_off, am_off, bm_off, rows, F, floor, keep = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    _exp_pass(b, pm, ae, be, a_off, b_off, rows)
    get_round = mod.declare_intrinsic("llvm.get.rounding", [], ir.FunctionType(_i32, []))
    set_round = mod.declare_intrinsic("llvm.set.rounding", [], ir.FunctionType(ir.VoidType(), [_i32]))
    saved = b.call(get_round, [])
    b.call(set_round, [ir.Constant(_i32, 0)])  # 0: toward zero
    _sum_pass(b, mod, acc, pm, av, ae, bv, be, am, bm, a_off, b_off, am_off, bm_off, rows, F, floor, keep)
    b.call(set_round, [saved])
    b.ret_void()
    return fn


def _data(context, builder, aryty, val, elt):
    """The data pointer of a numba array, as a pointer to ``elt``."""
    ary = context.make_array(aryty)(context, builder, val)
    return builder.bitcast(ary.data, elt.as_pointer())


def _int(builder, v, ty):
    if v.type.width > ty.width:
        return builder.trunc(v, ty)
    return builder.sext(v, ty) if v.type.width < ty.width else v


@intrinsic
def tile_group(typingctx, acc, pm, av, ae, bv, be, am, bm, a_off, b_off, am_off, bm_off, rows, F, floor, keep):
    """One MMA group on the tile ``acc`` (``rows x TILE_N`` float32 accumulators, in place; ``rows`` a
    multiple of ``TILE_ROWS``), with ``pm`` (int8, the tile's size) as scratch: see the module docstring.

    ``av`` float32 / ``ae`` int8 hold A's values (times the nudge) and nominal exponents, ``bv`` / ``be``
    B's; ``am`` / ``bm`` int32 the sign and non-zero masks; ``F`` the kept fraction bits, ``floor`` the
    lowest group exponent, ``keep`` the int32 mask of the result's kept bits.  Exact for finite FP8
    values whose products are normal float32 numbers, with ``p - F + 150`` in [1, 254] (the caller's
    ranges)."""
    sig = nb_types.void(acc, pm, av, ae, bv, be, am, bm, a_off, b_off, am_off, bm_off, rows, F, floor, keep)

    def codegen(context, builder, signature, args):
        fn = _define(builder.module)
        elts = [_f32, _i8, _f32, _i8, _f32, _i8, _i32, _i32]
        ptrs = [_data(context, builder, signature.args[i], args[i], t) for i, t in enumerate(elts)]
        ints = [_int(builder, a, _i64) for a in args[8:13]] + [_int(builder, a, _i32) for a in args[13:16]]
        builder.call(fn, ptrs + ints)
        return context.get_dummy_value()

    return sig, codegen


def _promote_rows(b, tot, acc, sa, sb, sa_off, sa_ld, sb_off, rows, kind):
    """``tot[r, n] (+)= scale * acc[r, n]`` and ``acc[r, n] = 0`` over the tile, for one scale mode."""
    fma = _declare(b.module, "llvm.fma.v8f32", _vf, [_vf, _vf, _vf])
    zero = _vconst(_vf, 0.0)

    def row(r, _):
        s_a = _splat(b, b.load(b.gep(sa, [b.add(sa_off, b.mul(r, sa_ld))], inbounds=True)), _vf)
        for v in range(TILE_N // _W):
            o = b.add(b.mul(r, _c64(TILE_N)), _c64(v * _W))
            t = b.load(_vptr(b, tot, o, _vf), align=4)
            a = b.load(_vptr(b, acc, o, _vf), align=4)
            if kind == 2:  # epilogue scale: a plain fp32 add here
                t = b.fadd(t, a)
            else:
                s = b.fmul(s_a, b.load(_vptr(b, sb, b.add(sb_off, _c64(v * _W)), _vf), align=4))
                t = b.call(fma, [s, a, t]) if kind == 0 else b.fadd(t, b.fmul(s, a))
            b.store(t, _vptr(b, tot, o, _vf), align=4)
            b.store(zero, _vptr(b, acc, o, _vf), align=4)
        return {}

    _loop(b, rows, row)


@intrinsic
def promote_tile(typingctx, tot, acc, sa, sb, sa_off, sa_ld, sb_off, rows, mode):
    """Promotion of the tile's accumulators ``acc`` (``rows x TILE_N`` float32) into ``tot``, then
    ``acc = 0``: ``tot = fma(sa[sa_off + r*sa_ld] * sb[sb_off + n], acc, tot)`` (mode 0, one rounding),
    ``tot + fp32(s * acc)`` (mode 1) or ``tot + acc`` (mode 2, scales in the epilogue), in the caller's
    rounding mode (round to nearest); ``s`` is the float32 product of the two scales."""
    sig = nb_types.void(tot, acc, sa, sb, sa_off, sa_ld, sb_off, rows, mode)

    def codegen(context, builder, signature, args):
        tot_p, acc_p, sa_p, sb_p = (_data(context, builder, signature.args[i], args[i], _f32) for i in range(4))
        sa_off, sa_ld, sb_off, rows, mode = (_int(builder, a, _i64) for a in args[4:9])
        with builder.if_else(builder.icmp_signed("==", mode, _c64(0))) as (is_fma, other):
            with is_fma:
                _promote_rows(builder, tot_p, acc_p, sa_p, sb_p, sa_off, sa_ld, sb_off, rows, 0)
            with other:
                with builder.if_else(builder.icmp_signed("==", mode, _c64(1))) as (is_mul_add, epi):
                    with is_mul_add:
                        _promote_rows(builder, tot_p, acc_p, sa_p, sb_p, sa_off, sa_ld, sb_off, rows, 1)
                    with epi:
                        _promote_rows(builder, tot_p, acc_p, sa_p, sb_p, sa_off, sa_ld, sb_off, rows, 2)
        return context.get_dummy_value()

    return sig, codegen
