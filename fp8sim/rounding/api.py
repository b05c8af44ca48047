"""Rounding to a format, and the codes of a format.

``round(x, fmt, mode)`` returns values of ``fmt`` in ``x``'s float dtype;
``encode`` returns their bit patterns; ``decode`` turns codes back into
values.  All three run one numba mechanism (:mod:`fp8sim.rounding._kernels`) that is
parameterized by the format and the mode.

Rounding modes
--------------
``"rne"`` nearest, ties to even (IEEE default) · ``"rna"`` nearest, ties
away from zero · ``"rtz"`` toward zero · ``"rup"`` toward +inf · ``"rdn"``
toward -inf · ``"rto"`` round to odd (inexact results take the neighbour
whose code is odd) · ``"sr"`` stochastic (round away from zero with
probability equal to the fractional distance, truncated to ``sr_bits``
bits; reproducible from ``seed``).

Special values and overflow
---------------------------
* NaN gives NaN (sign kept where the format has signed NaNs).  The sign of
  zero is kept where the format has -0 (not in 'fnuz' formats).
* ``saturate=True`` clamps overflow, and +-inf, to +-max, as the OCP
  ``satfinite`` conversion (PTX ``cvt.rn.satfinite``) does.
* Otherwise IEEE 754 rules, rounding as if the exponent range were
  unbounded: the nearest modes and ``sr`` overflow to +-inf; ``rtz`` to
  +-max; ``rup`` to +inf or -max, ``rdn`` to +max or -inf; ``rto`` to +-max
  (round to odd never leaves the finite range).  Where the format has no
  infinity the result is NaN; where it has neither infinity nor NaN (OCP
  FP4/FP6: e2m1, e2m3, e3m2) overflow always saturates, as the OCP MX
  specification requires.
* ``flush_subnormals=True`` replaces subnormal results by zero of the same
  sign (after rounding: a value that rounds up to the smallest normal is
  kept).
* E8M0 has no zero and no sign: 0 and negative inputs give NaN (0xFF), as
  in ml_dtypes; positive values below 2**-127 give 2**-127.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import cache, lru_cache

import ml_dtypes
import numba
import numpy as np

from .._fpenv import ieee_defaults
from .._inputs import flag, float_input
from ..formats import Format, NanStyle
from ..formats import format as _lookup
from . import _kernels as K
from .modes import MODES, check_sr_bits, round_mode, sr_key
from .params import FormatParams, float32_kernel_ok, format_params

__all__ = [
    "round",
    "encode",
    "decode",
    "decode_table",
    "sr_random_bits",
    "cast",
    "memo_table",
    "run_kernel",
    "serial_if_small",
    "SMALL",
    "MODES",
]


def _mode(mode) -> int:
    return int(round_mode(mode))


def _float_array(x, func: str) -> np.ndarray:
    # float32/float64 as they are, float16/bfloat16 exactly to float32, anything else: TypeError
    return float_input(x, f"fp8sim.{func}")[0]


def _prepare(x, fmt, mode, saturate, flush_subnormals, seed, sr_bits, func):
    saturate = flag(saturate, f"fp8sim.{func}", "saturate")
    flush_subnormals = flag(flush_subnormals, f"fp8sim.{func}", "flush_subnormals")
    fmt = _lookup(fmt)
    m = _mode(mode)
    arr = _float_array(x, func)
    key = sr_key(seed) if m == K.SR else np.uint64(0)
    srb = check_sr_bits(sr_bits)
    flat = np.ascontiguousarray(arr).reshape(-1)
    if flat.dtype == np.float32 and not float32_kernel_ok(fmt):
        flat = flat.astype(np.float64)  # exact; the float64 kernel handles the wider formats
    return fmt, arr, flat, (m, format_params(fmt, bool(saturate), bool(flush_subnormals), srb)), key


def _no_negatives_without_nan(fmt: Format, flat: np.ndarray, func: str) -> None:
    """An unsigned format maps negative inputs to NaN; one without NaN has no answer for them: raise
    (the kernel would otherwise produce the code -1, outside the format)."""
    if not fmt.signed and fmt.nan_code is None and flat.size and bool((flat < 0).any()):
        raise ValueError(
            f"fp8sim.{func}: format {fmt.name} is unsigned and has no NaN, so negative inputs have no "
            "result; clip them to 0 (or take abs) first"
        )


SMALL = 1 << 15


@contextmanager
def serial_if_small(n: int, threshold: int = SMALL):
    """Run numba parallel kernels on the calling thread alone for small inputs:
    waking the thread pool costs more than the work (and much more on a busy machine)."""
    if n >= threshold:
        yield
        return
    old = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(old)


def _memo_ok(fmt: Format, mode: int, flat: np.ndarray) -> bool:
    return flat.dtype == np.float32 and mode != K.SR and fmt.mbits <= 6 and flat.size >= 1 << 16


#: From this many elements on, an array is rounded by its mode's own kernel (the mode a compile-time
#: constant: branch-free and vectorized, but compiled separately for each mode and dtype); smaller
#: arrays share one kernel that takes the mode at run time.
SPECIALIZE_MIN = 1 << 20


def run_kernel(flat: np.ndarray, out: np.ndarray, mode: int, params: FormatParams, key) -> None:
    """Round contiguous float32/float64 ``flat`` into ``out`` (values or codes, by ``out``'s dtype)."""
    if flat.size >= SPECIALIZE_MIN:
        K.KERNELS[mode](flat, out, params, key)
    else:
        K.any_mode(flat, out, np.int64(mode), params, key)


@lru_cache(maxsize=256)
@ieee_defaults
def memo_table(fmt: Format, mode: int, params: FormatParams, want_code: bool) -> np.ndarray:
    """round_one on the 2 * 65536 float32 representatives (key << 16 | sticky), see kernels.lookup16:
    the results (codes or values) of every float32 input of a format with <= 6 mantissa bits."""
    keys = np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)
    reps = np.stack([keys, keys | np.uint32(1)]).reshape(-1).view(np.float32)
    out = np.empty(reps.shape, _kernel_dtype(fmt, reps, want_code))
    run_kernel(reps, out, mode, params, np.uint64(0))
    table = out.reshape(2, 1 << 16)
    table.setflags(write=False)
    return table


def _kernel_dtype(fmt: Format, flat: np.ndarray, want_code: bool) -> np.dtype:
    """Output dtype of the kernel call.  Kept to a few types (float, uint8, uint32,
    uint64) so that numba compiles few specializations; callers cast the result."""
    if not want_code:
        return flat.dtype
    if fmt.bits <= 8:
        return np.dtype(np.uint8)
    return np.dtype(np.uint32) if fmt.bits <= 32 else np.dtype(np.uint64)


def _run(flat, fmt, m, params, key, want_code, dtype):
    """Run the rounding kernel on contiguous ``flat``; return an array of ``dtype``."""
    out = np.empty(flat.shape, dtype=_kernel_dtype(fmt, flat, want_code))
    if flat.size:
        with serial_if_small(flat.size):
            if _memo_ok(fmt, m, flat):
                K.lookup16(flat.view(np.uint32), memo_table(fmt, m, params, want_code), out)
            else:
                run_kernel(flat, out, m, params, key)
    return out.astype(dtype, copy=False)


@ieee_defaults
def round(
    x,
    fmt,
    mode: str = "rne",
    *,
    saturate: bool = False,
    flush_subnormals: bool = False,
    seed=None,
    sr_bits: int | None = None,
) -> np.ndarray:  # noqa: A001 - public API name
    """Round ``x`` to the values of ``fmt``.

    Parameters
    ----------
    x : float32 or float64 array (or scalar); float16 and ml_dtypes.bfloat16 arrays are
        converted to float32 (exactly) and give a float32 result; other dtypes raise TypeError
    fmt : Format or name (``"e4m3"``, ``"e5m2"``, ...)
    mode : ``"rne"``, ``"rna"``, ``"rtz"``, ``"rup"``, ``"rdn"``, ``"rto"`` or ``"sr"``
    saturate : clamp overflow and +-inf to +-max (OCP satfinite)
    flush_subnormals : replace subnormal results by signed zero
    seed : int or numpy Generator; required for ``"sr"``
    sr_bits : number of random bits for ``"sr"`` (probability truncated to
        that many bits, as hardware SR units do); default 52

    Returns
    -------
    Array of ``x``'s dtype (float32 for float16/bfloat16 ``x``) and shape holding values of ``fmt``.
    """
    fmt, arr, flat, (m, params), key = _prepare(x, fmt, mode, saturate, flush_subnormals, seed, sr_bits, "round")
    _no_negatives_without_nan(fmt, flat, "round")
    if arr.dtype == np.float32 and not fmt.fits_float32:
        raise ValueError(f"format {fmt.name} has values that float32 cannot hold; pass float64 input")
    return _run(flat, fmt, m, params, key, False, arr.dtype).reshape(arr.shape)


@ieee_defaults
def encode(
    x,
    fmt,
    mode: str = "rne",
    *,
    saturate: bool = False,
    flush_subnormals: bool = False,
    seed=None,
    sr_bits: int | None = None,
) -> np.ndarray:
    """Round ``x`` to ``fmt`` and return the bit patterns.

    Same arguments and rounding as :func:`round`.  Codes are uint8 for
    formats of up to 8 bits, uint16 up to 16 bits, uint32 up to 32 bits;
    sub-byte formats (FP4, FP6) use the low bits of a uint8.  View them as
    ml_dtypes arrays with ``codes.view(fmt.ml_dtype)`` where one exists.
    NaN cannot be encoded in formats without NaN (e2m1, e2m3, e3m2): that
    raises ValueError, as do negative inputs to an unsigned format without NaN.
    """
    fmt, arr, flat, (m, params), key = _prepare(x, fmt, mode, saturate, flush_subnormals, seed, sr_bits, "encode")
    _no_negatives_without_nan(fmt, flat, "encode")
    if fmt.nan is NanStyle.NONE and flat.size and np.isnan(flat).any():
        raise ValueError(f"format {fmt.name} has no NaN: NaN inputs cannot be encoded (replace them first)")
    return _run(flat, fmt, m, params, key, True, fmt.code_dtype).reshape(arr.shape)


@cache
@ieee_defaults
def decode_table(fmt: Format) -> np.ndarray:
    """Values of all ``2**bits`` codes of a format of at most 16 bits (read-only)."""
    fmt = _lookup(fmt)
    if fmt.bits > 16:
        raise ValueError(f"decode_table: {fmt.name} has {fmt.bits} bits; tables exist up to 16 bits")
    codes = np.arange(fmt.num_codes, dtype=np.int64)
    table = _decode_arith(codes, fmt).astype(fmt.value_dtype)
    table.setflags(write=False)
    return table


def _decode_arith(codes: np.ndarray, fmt: Format) -> np.ndarray:
    """Decode int64 codes arithmetically to float64 (vectorized)."""
    sign = (codes & fmt.sign_mask) != 0 if fmt.signed else np.zeros(codes.shape, bool)
    mag = codes & ((1 << (fmt.ebits + fmt.mbits)) - 1)
    e_field = mag >> fmt.mbits
    m_field = (mag & ((1 << fmt.mbits) - 1)).astype(np.float64)
    frac = m_field / float(1 << fmt.mbits)
    if fmt.subnormals:
        val = np.where(e_field == 0, frac * 2.0**fmt.emin, np.ldexp(1.0 + frac, (e_field - fmt.bias)))
    else:
        val = np.ldexp(1.0 + frac, (e_field - fmt.bias))
    val = np.where(sign, -val, val)
    top = (1 << fmt.ebits) - 1
    if fmt.nan is NanStyle.IEEE:
        special = e_field == top
        if fmt.inf:
            val = np.where(special & (m_field == 0), np.where(sign, -np.inf, np.inf), val)
            val = np.where(special & (m_field != 0), np.nan, val)
        else:
            val = np.where(special, np.nan, val)
    elif fmt.nan is NanStyle.OCP:
        val = np.where(mag == (1 << (fmt.ebits + fmt.mbits)) - 1, np.nan, val)
    elif fmt.nan is NanStyle.FNUZ:
        val = np.where(codes == fmt.sign_mask, np.nan, val)
    return val


@ieee_defaults
def decode(codes, fmt) -> np.ndarray:
    """Values of the codes of ``fmt``: float32, or float64 where float32 cannot hold the format.

    ``codes`` must be an unsigned integer array of the format's code dtype
    (uint8 up to 8 bits, uint16 up to 16, uint32 up to 32), or an ml_dtypes
    array of the format's own dtype.  Codes with bits above the format's
    width raise ValueError.
    """
    fmt = _lookup(fmt)
    arr = np.asarray(codes)
    ml = fmt.ml_dtype
    if ml is not None and arr.dtype.kind == "V" and arr.dtype == np.dtype(ml):
        arr = arr.view(fmt.code_dtype)  # an ml_dtypes array of this format
    if arr.dtype.kind == "u" and arr.dtype.itemsize == fmt.code_dtype.itemsize and not arr.dtype.isnative:
        arr = arr.astype(fmt.code_dtype)  # the same codes in the other byte order (e.g. '>u2' from a file)
    if arr.dtype != fmt.code_dtype:
        raise TypeError(
            f"fp8sim.decode: codes of {fmt.name} must be {fmt.code_dtype} "
            f"(or {np.dtype(ml).name if ml is not None else 'its ml_dtypes type'}), got {arr.dtype}"
        )
    flat = np.ascontiguousarray(arr).reshape(-1)
    if fmt.bits < 8 * fmt.code_dtype.itemsize and flat.size and int(flat.max()) >= fmt.num_codes:
        raise ValueError(f"fp8sim.decode: codes of {fmt.name} must be < {fmt.num_codes}, got {int(flat.max())}")
    if fmt.bits <= 16:
        table = decode_table(fmt)
        out = np.empty(flat.shape, dtype=table.dtype)
        if flat.size:
            with serial_if_small(flat.size):
                K.decode_kernel(flat, table, out)
    else:
        out = _decode_arith(flat.astype(np.int64), fmt).astype(fmt.value_dtype)
    return out.reshape(arr.shape)


def sr_random_bits(seed, n: int) -> np.ndarray:
    """The uint64 random words that ``mode="sr"`` uses for elements 0..n-1.

    Stochastic rounding of element ``i`` rounds away from zero iff
    ``floor(f * 2**b) + (r[i] >> (64 - b)) >= 2**b`` with ``f`` the
    fractional distance and ``b = sr_bits``.  Exposed so that the rule can
    be checked against independent implementations.
    """
    key = sr_key(seed)
    i = np.arange(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = key + (i + np.uint64(1)) * K.GOLDEN
        z = (z ^ (z >> np.uint64(30))) * K.MIX1
        z = (z ^ (z >> np.uint64(27))) * K.MIX2
    return z ^ (z >> np.uint64(31))


@ieee_defaults
def cast(x, fmt, *, canonical_nan: bool = False) -> np.ndarray:
    """``x`` rounded once, to nearest even, to a wide format (bf16, fp16, tf32, fp32, ...), in ``x``'s
    float dtype: the one output/operand cast of the GEMM pipeline and the training emulation.

    ``canonical_nan=True`` writes every NaN as the positive quiet NaN with all significand bits set
    that the hardware's conversions produce (``cvt.rn.bf16.f32``: 0x7FFF; fp32: 0x7FFFFFFF), placed in
    ``x``'s dtype; otherwise NaN keeps its sign, as :func:`round` does.
    """
    fmt = _lookup(fmt)
    arr = np.asarray(x)
    if canonical_nan and arr.dtype == np.float32 and fmt.name in ("fp32", "bf16"):
        # the same values, faster: float32 is its own format, and ml_dtypes' float32 -> bfloat16 cast
        # is the single RNE rounding (checked on all 2**32 inputs; NaN is overwritten below)
        with np.errstate(all="ignore"):
            y = arr.copy() if fmt.name == "fp32" else arr.astype(ml_dtypes.bfloat16).astype(np.float32)
    else:
        y = round(arr, fmt)
    if canonical_nan and y.size:
        nan = np.isnan(y)
        if nan.any():
            if y.dtype == np.float32:
                pattern = np.uint32(0x7FFFFFFF & ~((1 << (23 - fmt.mbits)) - 1))
                y.view(np.uint32)[nan] = pattern
            else:
                pattern64 = np.uint64(0x7FFFFFFFFFFFFFFF & ~((1 << (52 - fmt.mbits)) - 1))
                y.view(np.uint64)[nan] = pattern64
    return y
