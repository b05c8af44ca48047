"""Machine-independent arithmetic for ``fidelity="exact"`` training.

float32 BLAS (numpy's ``@``) sums in an order that depends on the CPU's kernels and thread
count, and numpy's float32 ``exp``/``tanh`` have SIMD implementations that differ between
instruction sets, so the same seed could give different losses on different machines.  The
functions here use IEEE basic operations (``+ - * /``, ``sqrt``, ``ldexp``) in a fixed order
and nothing else; numba compiles them without fast-math, so no reassociation and no FMA
contraction: the results are the same bits on every machine and at every thread count.

* :func:`det_matmul`: ``a @ b`` with every dot product summed in float64 in ascending k order
  (then rounded once by the caller); batched over leading dimensions.
* :func:`det_exp`, :func:`det_tanh`, :func:`det_log`: exp, tanh and log evaluated in float64
  (relative error below 1e-15) and rounded once to the input's dtype (float32, or float64
  for float64 input), so float32 results equal the correctly rounded value except within
  1e-15 of a rounding boundary.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from .. import _fpenv

__all__ = ["det_matmul", "det_exp", "det_tanh", "det_log"]

_LN2_HI = 6.93147180369123816490e-01  # ln 2 with its low bits cleared (n * _LN2_HI is exact)
_LN2_LO = 1.90821492927058770002e-10
_INV_LN2 = 1.44269504088896338700e00
_CHUNK = 4096  # elements per parallel chunk (each chunk sets the floating-point environment once)


@numba.njit(cache=True, parallel=True)
def _mm(a, b, out):  # pragma: no cover - compiled
    L, M, K = a.shape
    N = b.shape[2]
    for r in numba.prange(L * M):
        fe = _fpenv.enter()  # the IEEE default environment on whichever thread runs the row
        li = r // M
        i = r - li * M
        acc = np.zeros(N, np.float64)
        for k in range(K):
            aik = np.float64(a[li, i, k])
            for j in range(N):
                acc[j] = acc[j] + aik * np.float64(b[li, k, j])
        for j in range(N):
            out[li, i, j] = acc[j]
        _fpenv.leave(fe)


def det_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` (numpy matmul broadcasting of the leading dimensions) as float64 dot products
    summed in ascending k order: the same bits on every machine and thread count."""
    a, b = np.asarray(a), np.asarray(b)
    if a.ndim < 2 or b.ndim < 2:
        raise ValueError(f"det_matmul: operands must have at least 2 dimensions, got {a.shape} and {b.shape}")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"det_matmul: inner dimensions differ: {a.shape} @ {b.shape}")
    lead = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    L = int(np.prod(lead)) if lead else 1
    a3 = np.ascontiguousarray(np.broadcast_to(a, lead + (M, K))).reshape(L, M, K)
    b3 = np.ascontiguousarray(np.broadcast_to(b, lead + (K, N))).reshape(L, K, N)
    dt = np.float64 if np.float64 in (a3.dtype, b3.dtype) else np.float32
    out = np.empty((L, M, N), np.float64)
    _mm(a3.astype(dt, copy=False), b3.astype(dt, copy=False), out)
    return out.reshape(lead + (M, N))


@numba.njit(cache=True, inline="always")
def _exp(x):  # pragma: no cover - compiled
    if x != x:
        return x
    if x > 709.78:
        return np.inf
    if x < -745.2:
        return 0.0
    n = math.floor(x * _INV_LN2 + 0.5)
    r = (x - n * _LN2_HI) - n * _LN2_LO  # |r| <= 0.3466
    p = 1.0 / 479001600.0  # 1/12!
    for d in (39916800.0, 3628800.0, 362880.0, 40320.0, 5040.0, 720.0, 120.0, 24.0, 6.0, 2.0, 1.0, 1.0):
        p = p * r + 1.0 / d
    return math.ldexp(p, int(n))


@numba.njit(cache=True, parallel=True)
def _exp_arr(x, out):  # pragma: no cover - compiled
    n = x.size
    for ch in numba.prange((n + _CHUNK - 1) // _CHUNK):
        fe = _fpenv.enter()
        for i in range(ch * _CHUNK, min(n, (ch + 1) * _CHUNK)):
            out[i] = _exp(np.float64(x[i]))
        _fpenv.leave(fe)


@numba.njit(cache=True, parallel=True)
def _tanh_arr(x, out):  # pragma: no cover - compiled
    n = x.size
    for ch in numba.prange((n + _CHUNK - 1) // _CHUNK):
        fe = _fpenv.enter()
        for i in range(ch * _CHUNK, min(n, (ch + 1) * _CHUNK)):
            v = np.float64(x[i])
            a = abs(v)
            if v != v:
                t = v
            elif a < 0.00390625:  # 2**-8: tanh x = x - x^3/3 + 2x^5/15 - 17x^7/315 (error < x^9)
                s = v * v
                t = v + v * s * (-1.0 / 3.0 + s * (2.0 / 15.0 + s * (-17.0 / 315.0)))
            elif a > 20.0:
                t = 1.0 if v > 0 else -1.0
            else:
                e = _exp(-2.0 * a)
                t = (1.0 - e) / (1.0 + e)
                if v < 0:
                    t = -t
            out[i] = t
        _fpenv.leave(fe)


@numba.njit(cache=True)
def _log_arr(x, out):  # pragma: no cover - compiled
    sqrt_half = 0.70710678118654752440
    for i in range(x.size):
        v = np.float64(x[i])
        if v != v or v < 0:
            out[i] = np.nan
            continue
        if v == 0:
            out[i] = -np.inf
            continue
        if v == np.inf:
            out[i] = np.inf
            continue
        m, e = math.frexp(v)  # v = m * 2**e, 0.5 <= m < 1
        if m < sqrt_half:
            m = m * 2.0
            e -= 1
        s = (m - 1.0) / (m + 1.0)  # |s| <= 0.1716
        s2 = s * s
        p = 1.0 / 25.0
        for d in (23.0, 21.0, 19.0, 17.0, 15.0, 13.0, 11.0, 9.0, 7.0, 5.0, 3.0, 1.0):
            p = p * s2 + 1.0 / d
        out[i] = (e * _LN2_HI + 2.0 * s * p) + e * _LN2_LO


def _out_dtype(x: np.ndarray):
    if x.dtype.kind != "f":
        raise TypeError(f"expected a float array, got dtype {x.dtype}")
    return np.float64 if x.dtype == np.float64 else np.float32


def _apply(kernel, x) -> np.ndarray:
    x = np.asarray(x)
    out = np.empty(x.shape, _out_dtype(x))
    kernel(np.ascontiguousarray(x).reshape(-1), out.reshape(-1))
    return out


def det_exp(x: np.ndarray) -> np.ndarray:
    """``exp(x)`` (float32 result, float64 for float64 input; NaN and overflow as IEEE), machine-independent."""
    return _apply(_exp_arr, x)


def det_tanh(x: np.ndarray) -> np.ndarray:
    """``tanh(x)`` (float32 result, float64 for float64 input; NaN stays NaN), machine-independent."""
    return _apply(_tanh_arr, x)


def det_log(x: np.ndarray) -> np.ndarray:
    """``log(x)`` (float32 result, float64 for float64 input; log 0 = -inf, log of a negative = NaN),
    machine-independent."""
    return _apply(_log_arr, x)
