"""Bit-pattern reinterpretation of scalars inside numba kernels (no memory round trip).

``f64_bits(x)`` / ``f64_of(i)`` and ``f32_bits(x)`` / ``f32_of(i)`` are LLVM ``bitcast`` instructions,
so that a kernel's loop can build powers of two from exponents and read exponents from floats in
registers (LLVM vectorizes such loops).  :func:`pow2` is ``2**e`` as a float64 for
``-1022 <= e <= 1023``, :func:`pow2f` the float32 ``2**e`` for ``-126 <= e <= 127``.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit
from numba import types as nb_types
from numba.extending import intrinsic

__all__ = ["f64_bits", "f64_of", "f32_bits", "f32_of", "pow2", "pow2f"]


def _int_to(builder, v, width: int):
    w = v.type.width
    if w < width:
        return builder.sext(v, ir.IntType(width))
    if w > width:
        return builder.trunc(v, ir.IntType(width))
    return v


@intrinsic
def f64_of(typingctx, i):
    """The float64 whose bit pattern is the integer ``i`` (taken as 64 bits)."""
    if not isinstance(i, nb_types.Integer):
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(_int_to(builder, args[0], 64), ir.DoubleType())

    return nb_types.float64(i), codegen


@intrinsic
def f64_bits(typingctx, x):
    """The bit pattern (int64) of the float64 ``x``."""
    if x != nb_types.float64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return nb_types.int64(x), codegen


@intrinsic
def f32_of(typingctx, i):
    """The float32 whose bit pattern is the integer ``i`` (taken as 32 bits)."""
    if not isinstance(i, nb_types.Integer):
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(_int_to(builder, args[0], 32), ir.FloatType())

    return nb_types.float32(i), codegen


@intrinsic
def f32_bits(typingctx, x):
    """The bit pattern (int32) of the float32 ``x``."""
    if x != nb_types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return nb_types.int32(x), codegen


@njit(cache=True, inline="always")
def pow2(e):
    """``2.0**e`` (float64) for an integer ``-1022 <= e <= 1023``."""
    return f64_of((e + 1023) << 52)


@njit(cache=True, inline="always")
def pow2f(e):
    """``2.0**e`` (float32) for an integer ``-126 <= e <= 127``."""
    return f32_of((e + 127) << 23)
