"""Rounding to a format, and the codes of a format.

``round(x, fmt, mode)`` returns values of ``fmt`` in ``x``'s float dtype;
``encode`` returns their bit patterns; ``decode`` turns codes back into
values.  All three run one numba mechanism (:mod:`fp8sim._kernels`) that is
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

import numba
import numpy as np

from . import _kernels as K
from ._inputs import flag, float_input
from .formats import Format, NanStyle
from .formats import format as _lookup

__all__ = ["MODES", "round", "encode", "decode", "decode_table", "sr_random_bits"]

MODES = {"rne": K.RNE, "rna": K.RNA, "rtz": K.RTZ, "rup": K.RUP, "rdn": K.RDN, "rto": K.RTO, "sr": K.SR}
_MODE_ALIASES = {
    "nearest": "rne",
    "rn": "rne",
    "even": "rne",
    "tiestoeven": "rne",
    "away": "rna",
    "tiestoaway": "rna",
    "zero": "rtz",
    "rz": "rtz",
    "towardzero": "rtz",
    "truncate": "rtz",
    "up": "rup",
    "ru": "rup",
    "ceil": "rup",
    "towardpositive": "rup",
    "down": "rdn",
    "rd": "rdn",
    "floor": "rdn",
    "towardnegative": "rdn",
    "odd": "rto",
    "stochastic": "sr",
}


def _mode(mode: str) -> int:
    if not isinstance(mode, str):
        raise TypeError(f"mode must be a string, one of {', '.join(MODES)}; got {type(mode).__name__}")
    key = mode.strip().lower()
    key = _MODE_ALIASES.get(key, key)
    if key not in MODES:
        from ._names import unknown_name_error

        raise unknown_name_error(
            "rounding mode", mode, list(MODES), candidates=[*MODES, *_MODE_ALIASES], plural="modes"
        )
    return MODES[key]


def _float_array(x, func: str) -> np.ndarray:
    # float32/float64 as they are, float16/bfloat16 exactly to float32, anything else: TypeError
    return float_input(x, f"fp8sim.{func}")[0]


def _sr_key(seed) -> np.uint64:
    if seed is None:
        raise ValueError(
            "stochastic rounding needs a source of randomness: pass seed=<int> or seed=<numpy.random.Generator>"
        )
    if isinstance(seed, np.random.Generator):
        return np.uint64(seed.integers(0, 2**63, dtype=np.int64)) * np.uint64(2) + np.uint64(1)
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int or a numpy.random.Generator, got {type(seed).__name__}")
    return np.uint64(int(seed) & 0xFFFFFFFFFFFFFFFF)


def _sr_bits(sr_bits) -> int:
    if sr_bits is None:
        return 52
    if isinstance(sr_bits, (bool, np.bool_)) or not isinstance(sr_bits, (int, np.integer)):
        raise TypeError(f"sr_bits must be an int in 1..52 or None, got {type(sr_bits).__name__}")
    if not 1 <= sr_bits <= 52:
        raise ValueError(f"sr_bits must be in 1..52, got {sr_bits}")
    return int(sr_bits)


def _params(fmt: Format, mode: int, saturate: bool, flush: bool, sr_bits: int) -> tuple:
    no_special = fmt.nan is NanStyle.NONE
    return mode, (
        np.int64(fmt.mbits),
        np.int64(fmt.emin),
        np.int64(fmt.emax),
        np.int64(fmt.max_code_mag),
        np.float64(fmt.max),
        np.int64(fmt.sign_mask),
        bool(fmt.signed),
        bool(fmt.has_negative_zero),
        bool(fmt.subnormals),
        np.int64(-1 if fmt.inf_code is None else fmt.inf_code),
        np.int64(-1 if fmt.nan_code is None else fmt.nan_code),
        np.int64(1 if (saturate or no_special) else 0),
        bool(flush),
        np.int64(sr_bits),
    )


def float32_kernel_ok(fmt: Format) -> bool:
    """Whether the float32 instantiation of the kernel can round to ``fmt``.

    It needs the format inside float32 (precision and range) and
    ``emin >= -126``: below that, float32 subnormal inputs would be placed
    in the wrong binade (E8M0 reaches 2**-127).  Other formats go through
    the float64 kernel after an exact upcast.
    """
    return fmt.fits_float32 and fmt.emin >= -126


def _prepare(x, fmt, mode, saturate, flush_subnormals, seed, sr_bits, func):
    saturate = flag(saturate, f"fp8sim.{func}", "saturate")
    flush_subnormals = flag(flush_subnormals, f"fp8sim.{func}", "flush_subnormals")
    fmt = _lookup(fmt)
    m = _mode(mode)
    arr = _float_array(x, func)
    key = _sr_key(seed) if m == K.SR else np.uint64(0)
    srb = _sr_bits(sr_bits)
    flat = np.ascontiguousarray(arr).reshape(-1)
    if flat.dtype == np.float32 and not float32_kernel_ok(fmt):
        flat = flat.astype(np.float64)  # exact; the float64 kernel handles the wider formats
    return fmt, arr, flat, _params(fmt, m, bool(saturate), bool(flush_subnormals), srb), key


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


def _round_kernel(flat: np.ndarray, out: np.ndarray, mode: int, params: tuple, key) -> None:
    if flat.size >= SPECIALIZE_MIN:
        K.KERNELS[mode](flat, out, params, key)
    else:
        K.any_mode(flat, out, np.int64(mode), params, key)


@lru_cache(maxsize=256)
def _memo_table(fmt: Format, mode: int, params: tuple, want_code: bool) -> np.ndarray:
    """round_one on the 2 * 65536 representatives (key << 16 | sticky), see _kernels.lookup16."""
    keys = np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)
    reps = np.stack([keys, keys | np.uint32(1)]).reshape(-1).view(np.float32)
    out = np.empty(reps.shape, _kernel_dtype(fmt, reps, want_code))
    _round_kernel(reps, out, mode, params, np.uint64(0))
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
                K.lookup16(flat.view(np.uint32), _memo_table(fmt, m, params, want_code), out)
            else:
                _round_kernel(flat, out, m, params, key)
    return out.astype(dtype, copy=False)


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
    key = _sr_key(seed)
    i = np.arange(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = key + (i + np.uint64(1)) * K._GOLDEN
        z = (z ^ (z >> np.uint64(30))) * K._M1
        z = (z ^ (z >> np.uint64(27))) * K._M2
    return z ^ (z >> np.uint64(31))
