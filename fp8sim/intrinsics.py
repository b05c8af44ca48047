"""The numba intrinsics fp8sim's kernels share: one home for LLVM-level operations.

* :func:`fma32`, :func:`fma64`: fused multiply-add with one rounding (``llvm.fma``; vectorizes);
* :func:`fdiv`: IEEE division without numba's ZeroDivisionError check;
* :func:`lshr32`: logical right shift on int32 lanes;
* :func:`prefetch_r`, :func:`prefetch_w`: cache-line prefetch for reading / writing;
* :func:`borrow`: an array view without reference counting, for the parallel kernels.

All are callable from numba-compiled code only.
"""

from __future__ import annotations

from llvmlite import ir as llvm_ir
from numba import njit
from numba import types as nb_types
from numba.extending import intrinsic
from numba.np.arrayobj import populate_array

__all__ = ["fma32", "fma64", "fma32_array", "fdiv", "lshr32", "prefetch_r", "prefetch_w", "borrow"]


@intrinsic
def fma32(typingctx, a, b, c):
    """float32 fused multiply-add ``a*b + c`` with one rounding (LLVM's llvm.fma; vectorizes)."""
    sig = nb_types.float32(nb_types.float32, nb_types.float32, nb_types.float32)

    def codegen(context, builder, signature, args):
        flt = llvm_ir.FloatType()
        fn = builder.module.declare_intrinsic("llvm.fma", [flt], llvm_ir.FunctionType(flt, [flt, flt, flt]))
        return builder.call(fn, args)

    return sig, codegen


@intrinsic
def fma64(typingctx, a, b, c):
    """float64 fused multiply-add ``a*b + c`` with one rounding (LLVM's llvm.fma)."""
    sig = nb_types.float64(nb_types.float64, nb_types.float64, nb_types.float64)

    def codegen(context, builder, signature, args):
        dbl = llvm_ir.DoubleType()
        fn = builder.module.declare_intrinsic("llvm.fma", [dbl], llvm_ir.FunctionType(dbl, [dbl, dbl, dbl]))
        return builder.call(fn, args)

    return sig, codegen


@intrinsic
def fdiv(typingctx, a, b):
    """``a / b`` for two floats of one type, IEEE (a zero divisor gives inf or NaN) without numba's
    ZeroDivisionError check: a loop whose divisor varies then vectorizes."""
    if a != b or not isinstance(a, nb_types.Float):
        return None
    sig = a(a, b)

    def codegen(context, builder, signature, args):
        return builder.fdiv(args[0], args[1])

    return sig, codegen


def _make_prefetch(rw):
    """An intrinsic ``f(arr, i)`` that prefetches the cache line of ``arr``'s element ``i`` into L1, for
    reading (rw=0) or writing (rw=1).  A prefetch never faults, so ``i`` may lie past the array's end."""

    @intrinsic
    def _pf(typingctx, arr, idx):
        sig = nb_types.void(arr, idx)

        def codegen(context, builder, signature, args):
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            ptr = builder.gep(ary.data, [args[1]])
            i8p = llvm_ir.IntType(8).as_pointer()
            p8 = builder.bitcast(ptr, i8p)
            i32 = llvm_ir.IntType(32)
            fn = builder.module.declare_intrinsic(
                "llvm.prefetch", [i8p], llvm_ir.FunctionType(llvm_ir.VoidType(), [i8p, i32, i32, i32])
            )
            builder.call(fn, [p8, i32(rw), i32(3), i32(1)])
            return context.get_dummy_value()

        return sig, codegen

    return _pf


prefetch_r = _make_prefetch(0)
prefetch_w = _make_prefetch(1)


@intrinsic
def lshr32(typingctx, a, s):
    """``a >> s`` (logical) on int32 lanes.  numba widens int32 shifts to int64, and LLVM cannot narrow
    a right shift by a run-time amount back, so the shift is emitted directly (it vectorizes as one
    shift by a scalar count)."""
    sig = nb_types.int32(nb_types.int32, nb_types.int32)

    def codegen(context, builder, signature, args):
        return builder.lshr(args[0], args[1])

    return sig, codegen


@intrinsic
def borrow(typingctx, arr):
    """The same array without its reference count (a null meminfo): views taken from it and calls that
    receive it do no reference counting.  The parallel kernels borrow their arrays so that the two
    threads do not both increment one shared counter, atomically, for every row view and call (that
    contention cost more than a third of a row's arithmetic).  Valid while the caller holds ``arr``."""
    sig = arr(arr)

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        src = context.make_array(aryty)(context, builder, args[0])
        out = context.make_array(aryty)(context, builder)
        populate_array(out, data=src.data, shape=src.shape, strides=src.strides, itemsize=src.itemsize, meminfo=None)
        return out._getvalue()

    return sig, codegen


@njit(cache=True)
def fma32_array(a, b, c, out):
    """``out[i] = fma32(a[i], b[i], c[i])`` over float32 arrays (for numpy-level callers)."""
    for i in range(a.size):
        out[i] = fma32(a[i], b[i], c[i])
