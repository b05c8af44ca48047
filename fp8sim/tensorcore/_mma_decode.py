"""Operand decoding for the kernels of :mod:`fp8sim.tensorcore._mma_kernels`: one pass over the codes.

:func:`decode_a` (A, (M, K)) and :func:`decode_b` (B, (K, N)) write each element's value (float32),
nominal exponent (int16, ``NONE16`` for zero, inf and NaN) and the fast-path flags of the blocks
of ``L`` products (A per row and block, B per block and column tile of
``COLUMNS_PER_TASK``): a block leaves the fast path when it holds an element outside
[2**-24, 2**16) in magnitude (other than zero), inf or NaN.  Formats of up to 16 bits are looked
up in per-code tables (:func:`kernel_tables`); formats laid out as float32 (tf32: its 19-bit code
is the top of a float32 pattern; fp32) are decoded from the bits.  :func:`gather` is a plain
per-code table lookup (the grouped kernel's integer or float64 values).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._mma_tiles import COLUMNS_PER_TASK, NONE16
from .bitcast import f32_bits, f32_of

__all__ = ["decode_a", "decode_b", "gather", "outside"]

_LO = 2.0**-24  # the fast path's range of element magnitudes: [2**-24, 2**16) and zero
_HI = 2.0**16


def outside(v: np.ndarray) -> np.ndarray:
    """Elements that keep their block off the fast path: inf, NaN, and magnitudes outside
    [2**-24, 2**16) (products of two in-range values lie in [2**-48, 2**32): float32's range)."""
    a = np.abs(v)
    return ~((a < _HI) & ((a >= _LO) | (a == 0)))


@njit(cache=True, inline="always")
def _element(code, vtab, etab, otab, shift, normalize, emin):
    """(value float32, nominal exponent int16, outside 0/1) of one code: a table lookup, or with
    ``shift >= 0`` the float32 pattern ``code << shift`` (subnormals at ``emin``, or with
    ``normalize`` at their true exponent)."""
    if shift < 0:
        return vtab[code], etab[code], otab[code]
    v = f32_of(np.int64(code) << shift)
    b = f32_bits(v)
    ef = (b >> 23) & 0xFF
    real = ef != 255 and (b & 0x7FFFFFFF) != 0
    e = ef - 127
    if ef == 0:  # subnormal: the true exponent from the value scaled into the normal range
        e = ((f32_bits(v * np.float32(2.0**64)) >> 23) & 0xFF) - 127 - 64 if normalize else emin
    a = abs(np.float64(v))
    out = not ((a < _HI) and ((a >= _LO) or (a == 0)))
    return v, np.int16(e if real else NONE16), np.uint8(out)


@njit(cache=True)
def decode_a(codes, vtab, etab, otab, shift, normalize, emin, L, v, e, spec):
    """A (M, K): values ``v``, exponents ``e`` and ``spec (M, K // L)``: the row's block leaves the
    fast path.  Tables or bits as :func:`_element`."""
    M, K = codes.shape
    for i in range(M):
        for kb in range(K // L):
            cr = codes[i, kb * L : kb * L + L]
            vr = v[i, kb * L : kb * L + L]
            er = e[i, kb * L : kb * L + L]
            f = 0
            for k in range(L):
                vv, ee, oo = _element(cr[k], vtab, etab, otab, shift, normalize, emin)
                vr[k] = vv
                er[k] = ee
                f |= oo
            spec[i, kb] = f != 0


@njit(cache=True)
def decode_b(codes, vtab, etab, otab, shift, normalize, emin, L, v, e, spec):
    """B (K, N): values ``v``, exponents ``e`` and ``spec (K // L, column tiles)``: the column
    tile's block leaves the fast path.  Tables or bits as :func:`_element`."""
    K, N = codes.shape
    nt = spec.shape[1]
    flags = np.zeros((K, nt), np.uint8)
    for k in range(K):
        for t in range(nt):
            n0 = t * COLUMNS_PER_TASK
            n1 = min(N, n0 + COLUMNS_PER_TASK)
            cr = codes[k, n0:n1]
            vr = v[k, n0:n1]
            er = e[k, n0:n1]
            f = 0
            for n in range(n1 - n0):
                vv, ee, oo = _element(cr[n], vtab, etab, otab, shift, normalize, emin)
                vr[n] = vv
                er[n] = ee
                f |= oo
            flags[k, t] = f
    for kb in range(K // L):
        for t in range(nt):
            f = 0
            for k in range(kb * L, kb * L + L):
                f |= flags[k, t]
            spec[kb, t] = f != 0


@njit(cache=True)
def gather(codes, table, out):
    """``out[i, j] = table[codes[i, j]]`` (2-D)."""
    for i in range(codes.shape[0]):
        for j in range(codes.shape[1]):
            out[i, j] = table[codes[i, j]]
