"""Scaled quantization: granularities, scale policies and :class:`QuantizedTensor`.

FP8 is only usable with scaling: a tensor is cut into blocks, each block
gets a scale, and the elements are divided by their block's scale before
they are rounded to the FP8 format.  This module offers every granularity
and scale policy in common use through one mechanism.

Scale convention
----------------
Every scale stored here is a **dequantization scale**::

    x  ~=  decode(codes) * scale * global_scale

so that ``scale = amax * 2**margin / fmt.max`` for the amax-based policies
(DeepSeek-V3 / DeepGEMM store ``amax / 448`` in the same sense; OCP MX's
``X`` is one too).  TransformerEngine stores the reciprocal ("quantization
scale" ``fmt.max / amax``); :attr:`QuantizedTensor.scales` holds ``1/that``.
``global_scale`` is 1.0 except for the two-level NVFP4-style granularity.

Elements are converted as ``round(x / (scale * global_scale))``, the single
rounding of the exact quotient in every mode and for every input dtype: a
float64 quotient is re-rounded to odd from its exact (FMA) residual, and
where it would underflow (tiny elements, large scales) the element is
rounded with the exponent range shifted instead, so directed modes see
every nonzero quotient (float32 paths: see ``_round_row``).

Granularities and scale layouts
-------------------------------
``scales`` always has as many dimensions as ``x``; along each axis its
length is ``ceil(x.shape[d] / block_shape[d])``: the blocks tile ``x`` from
the origin and the **ragged edge is its own smaller block** (never padded
with values that would enter the amax).  ``scales[idx]`` belongs to the
elements ``x[idx[0]*b0 : (idx[0]+1)*b0, ...]``.  A 1-D ``x`` is one row.
Dimensions before the last two are batch dimensions: blocks never span two
matrices of a batch, except for ``"tensor"`` (one scale for everything).

============== ==================== ============================================
name           block_shape           scales shape for x of shape (..., M, N)
============== ==================== ============================================
``tensor``     whole tensor          (1, ..., 1, 1)
``row``        (1, N)                (..., M, 1)        per token
``col``        (M, 1)                (..., 1, N)        per channel
``1xN``        (1, N)  e.g. 1x128    (..., M, ceil(N/128))  DeepSeek-V3 activations
``RxC``        (R, C)  e.g. 128x128  (..., ceil(M/128), ceil(N/128))  DeepSeek-V3 weights
``gG``         G along ``axis``      ``x.shape`` with ``shape[axis] -> ceil(shape[axis]/G)``
``mxK``        K along ``axis``      like ``gK``; E8M0 scales (OCP MX v1.0)
``nvfp4``      16 along ``axis``     like ``g16``; E4M3 block scales x FP32 ``global_scale``
``delayed``    whole tensor          (1, ..., 1); scale from an amax history
============== ==================== ============================================

Scale policies
--------------
``scale_format``: ``"fp32"`` (amax/max rounded to float32), ``"bf16"``,
``"pow2"`` (a power of two in float32, exponent in -126..127) or ``"e8m0"``
(a power of two, exponent in -127..127, OCP MX).  Power-of-two scales are
rounded by ``scale_rounding``:

* ``"floor"``: ``2**(floor(log2 amax) - emax_elem)`` (OCP MX v1.0; the
  largest elements may exceed ``fmt.max`` and saturate),
* ``"ceil"``: ``2**(ceil(log2 amax) - emax_elem)`` (never overflows; may
  waste a binade),
* ``"rceil"``: ``2**ceil(log2(float32(amax / fmt.max)))`` (NVIDIA's MXFP8
  recipe, cuBLAS "RCEIL": the smallest power of two with which nothing
  overflows),
* ``"even"``: ``2**(floor(log2 r) - emax_elem)`` with ``r`` = amax rounded
  to the element's precision, half up (torchao's EVEN).

``bf16`` scales round the float32 scale up (``"ceil"``/``"rceil"``, the
default, so nothing overflows), down (``"floor"``) or to nearest
(``"even"``).  ``margin`` (an int) multiplies every scale by
``2**margin`` (TransformerEngine's margin: headroom of ``margin`` binades).

Zero, tiny and non-finite values
--------------------------------
* Scales are clamped to the scale format's positive normal range (fp32,
  bf16, pow2: ``[2**-126, max]``; e8m0 ``[2**-127, 2**127]``), so all-zero
  and all-tiny blocks get a finite, nonzero scale (never NaN/inf).
* ``+-inf`` does not enter amax; it is converted like any overflow:
  ``saturate=True`` (the default, OCP "satfinite") gives ``+-max``, else
  inf (e5m2) or NaN (e4m3).  :func:`fp8sim.metrics.fraction_saturated`
  reports it.
* NaN enters amax, so a block holding a NaN gets a NaN scale and
  dequantizes to NaN -- the NaN propagates to its block only (as in OCP MX,
  where a NaN scale makes the whole block NaN).  With ``ignore_nan=True``
  amax skips NaN and only the NaN element itself stays NaN.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numba
import numpy as np
from llvmlite import ir as llvm_ir
from numba import njit, prange
from numba.core import types as nb_types
from numba.extending import intrinsic
from numba.np.arrayobj import populate_array

from . import _buffers
from . import _kernels as K
from ._inputs import flag, float_input
from .formats import BF16, CATALOGUE, E4M3, Format, NanStyle
from .formats import format as _lookup_format
from .rounding import MODES, _memo_table, _mode, _params, _sr_key, decode_table, float32_kernel_ok

__all__ = [
    "Granularity",
    "PerTensor",
    "PerRow",
    "PerColumn",
    "Tile",
    "Group",
    "MX",
    "NVFP4",
    "DelayedScaling",
    "QuantizedTensor",
    "granularity",
    "granularity_names",
    "quantize",
    "dequantize",
    "SCALE_FORMATS",
    "SCALE_ROUNDINGS",
]

SCALE_FORMATS = ("fp32", "bf16", "pow2", "e8m0")
SCALE_ROUNDINGS = ("floor", "ceil", "rceil", "even")

# scale kinds and roundings as the kernels see them
_FP32, _BF16, _POW2, _E8M0, _E4M3 = 0, 1, 2, 3, 4
_FLOOR, _CEIL, _RCEIL, _EVEN = 0, 1, 2, 3
_KIND = {"fp32": _FP32, "bf16": _BF16, "pow2": _POW2, "e8m0": _E8M0, "e4m3": _E4M3}
_ROUNDING = {"floor": _FLOOR, "ceil": _CEIL, "rceil": _RCEIL, "even": _EVEN}
_FLT_MAX = float(np.finfo(np.float32).max)


# =====================================================================
# granularities
# =====================================================================
def _prod(xs) -> int:
    p = 1
    for v in xs:
        p *= int(v)
    return p


def _positive_int(v, what: str) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{what} must be a positive int, got {v!r}")
    if v <= 0:
        raise ValueError(f"{what} must be a positive int, got {v}")
    return int(v)


def _axis(axis, ndim: int, who: str) -> int:
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{who}: axis must be an int, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"{who}: axis {axis} is out of range for an array of {ndim} dimension(s)")
    return int(axis) % ndim


@dataclass(frozen=True)
class Granularity:
    """Base class: how a tensor is cut into blocks that share one scale.

    Subclasses define :meth:`block_shape` (block extents per axis of ``x``)
    and the canonical 3-D view ``(B, M, N)`` with blocks ``(bm, bn)`` the
    kernels work on (:meth:`_view`).
    """

    @property
    def name(self) -> str:  # pragma: no cover - overridden
        raise NotImplementedError

    def __str__(self) -> str:
        return self.name

    #: scale format and rounding used when quantize() is given None
    default_scale_format = "fp32"

    def _view(self, shape: tuple) -> tuple:  # pragma: no cover - overridden
        raise NotImplementedError

    def block_shape(self, shape) -> tuple:
        """Extent of one block along each axis of an ``x`` of this shape."""
        shape = tuple(int(s) for s in shape)
        B, M, N, bm, bn, axis = self._view(shape)
        return _block_shape_from_view(shape, bm, bn, axis)

    def scale_shape(self, shape) -> tuple:
        """Shape of the ``scales`` array for an ``x`` of this shape."""
        shape = tuple(int(s) for s in shape)
        blk = self.block_shape(shape)
        return tuple(-(-s // b) for s, b in zip(shape, blk))


def _block_shape_from_view(shape, bm, bn, axis):
    """Per-axis block extents; ``axis`` is the axis the view's M runs along (None: rows of last axis)."""
    nd = len(shape)
    blk = [1] * nd
    if axis == "tensor":
        return tuple(shape)
    if axis is None:  # (B, M, N) with M = shape[-2] (or 1 for 1-D) and N = shape[-1]
        blk[-1] = min(bn, shape[-1])
        if nd >= 2:
            blk[-2] = min(bm, shape[-2])
        return tuple(blk)
    blk[axis] = min(bm, shape[axis])  # (P, A, Q) view with blocks (g, 1)
    return tuple(blk)


def _matrix_view(shape):
    if len(shape) == 1:
        return 1, 1, shape[0]
    return _prod(shape[:-2]), shape[-2], shape[-1]


@dataclass(frozen=True)
class PerTensor(Granularity):
    """One scale for the whole tensor.  ``scales.shape == (1,) * x.ndim``."""

    @property
    def name(self) -> str:
        return "tensor"

    def _view(self, shape):
        R = _prod(shape[:-1])
        return 1, R, shape[-1], R, shape[-1], "tensor"


@dataclass(frozen=True)
class PerRow(Granularity):
    """One scale per row (per token): ``scales.shape == x.shape[:-1] + (1,)``."""

    @property
    def name(self) -> str:
        return "row"

    def _view(self, shape):
        return 1, _prod(shape[:-1]), shape[-1], 1, shape[-1], None


@dataclass(frozen=True)
class PerColumn(Granularity):
    """One scale per column (per channel) of each matrix.

    ``scales.shape == x.shape[:-2] + (1, N)``; for a 1-D ``x`` (one row)
    every element is its own column: ``scales.shape == x.shape``.
    """

    @property
    def name(self) -> str:
        return "col"

    def _view(self, shape):
        B, M, N = _matrix_view(shape)
        return B, M, N, M, 1, None


@dataclass(frozen=True)
class Tile(Granularity):
    """Blocks of ``rows x cols`` elements of each matrix (``"1x128"``, ``"128x128"``).

    ``scales.shape == x.shape[:-2] + (ceil(M/rows), ceil(N/cols))``.  For a
    1-D ``x`` (one row) ``scales.shape == (ceil(N/cols),)``.  ``"1x128"``
    is DeepSeek-V3's activation tiling along K of an (M, K) operand, and
    ``"128x128"`` its weight blocking of an (N, K) operand.
    """

    rows: int = 1
    cols: int = 128

    def __post_init__(self):
        _positive_int(self.rows, "Tile rows")
        _positive_int(self.cols, "Tile cols")

    @property
    def name(self) -> str:
        return f"{self.rows}x{self.cols}"

    def _view(self, shape):
        B, M, N = _matrix_view(shape)
        if self.rows == 1:
            return 1, B * M, N, 1, self.cols, None
        return B, M, N, self.rows, self.cols, None

    def block_shape(self, shape):
        shape = tuple(int(s) for s in shape)
        blk = [1] * len(shape)
        blk[-1] = min(self.cols, shape[-1])
        if len(shape) >= 2:
            blk[-2] = min(self.rows, shape[-2])
        return tuple(blk)


@dataclass(frozen=True)
class Group(Granularity):
    """Groups of ``size`` consecutive elements along ``axis`` (``"g16"``, ``"g32"``).

    ``scales.shape`` is ``x.shape`` with ``shape[axis]`` replaced by
    ``ceil(shape[axis] / size)``.  ``Group(128)`` equals ``Tile(1, 128)``.
    """

    size: int = 32
    axis: int = -1

    def __post_init__(self):
        _positive_int(self.size, f"{type(self).__name__} size")
        if isinstance(self.axis, (bool, np.bool_)) or not isinstance(self.axis, (int, np.integer)):
            raise TypeError(f"{type(self).__name__}: axis must be an int, got {self.axis!r}")

    @property
    def name(self) -> str:
        return f"g{self.size}" + ("" if self.axis == -1 else f"@{self.axis}")

    def _view(self, shape):
        a = _axis(self.axis, len(shape), self.name)
        if a == len(shape) - 1:
            return 1, _prod(shape[:-1]), shape[-1], 1, self.size, len(shape) - 1
        return _prod(shape[:a]), shape[a], _prod(shape[a + 1 :]), self.size, 1, a

    def block_shape(self, shape):
        shape = tuple(int(s) for s in shape)
        a = _axis(self.axis, len(shape), self.name)
        blk = [1] * len(shape)
        blk[a] = min(self.size, shape[a])
        return tuple(blk)


@dataclass(frozen=True)
class MX(Group):
    """OCP Microscaling (MX v1.0) blocks: ``size`` (32) elements along ``axis`` share an E8M0 scale.

    ``X = 2**(floor(log2(amax)) - emax_elem)`` clamped to 2**-127..2**127
    (all-zero blocks get 2**-127); elements are converted with saturation.
    Layout as :class:`Group`; ``QuantizedTensor.scale_codes`` are the E8M0
    bytes.  ``scale_rounding`` may pick CEIL/RCEIL/EVEN instead of FLOOR.
    For an MX GEMM ``A (M, K)`` uses ``axis=-1`` and ``B (K, N)`` ``axis=-2``.
    """

    default_scale_format = "e8m0"

    @property
    def name(self) -> str:
        return f"mx{self.size}" + ("" if self.axis == -1 else f"@{self.axis}")


@dataclass(frozen=True)
class NVFP4(Group):
    """Two-level scaling (NVIDIA NVFP4): an E4M3 scale per ``size`` (16) elements times an FP32 per-tensor scale.

    ``global_scale = amax(x) * 2**margin / (fmt.max * 448)`` (float32);
    block scale ``s_b = round_e4m3_rne_satfinite(amax_b / fmt.max / global_scale)``
    (a nonzero block whose scale would round to 0 gets E4M3's smallest
    subnormal 2**-9); elements ``round(x / (s_b * global_scale))``.  Layout
    as :class:`Group`; ``scales`` hold ``s_b`` (values of E4M3) and
    ``scale_codes`` their E4M3 bytes.  Usually used with ``fmt="e2m1"``.
    """

    size: int = 16
    default_scale_format = "e4m3"

    @property
    def name(self) -> str:
        return "nvfp4" + ("" if self.size == 16 else str(self.size)) + ("" if self.axis == -1 else f"@{self.axis}")


class DelayedScaling(Granularity):
    """Per-tensor delayed scaling (TransformerEngine style).

    The scale is computed from an **amax history** of the previous tensors,
    not from the tensor being quantized: ``amax = max(history)``
    (``algo="max"``) or the most recent entry (``algo="most_recent"``).
    While the history holds no positive amax the scale is 1.0 (TE's initial
    scale).  Each :func:`quantize` call then records the current tensor's
    amax in the history (a rolling window of ``history_len`` entries, newest
    first) -- this object is the mutable state, like TE's ``fp8_meta``.
    ``scales.shape == (1,) * x.ndim``; values above ``fmt.max * scale``
    saturate (``saturate=True``) -- see ``metrics.fraction_saturated``.
    """

    def __init__(self, history_len: int = 16, algo: str = "max", amax_history=None):
        self.history_len = _positive_int(history_len, "DelayedScaling history_len")
        if algo not in ("max", "most_recent"):
            raise ValueError(f"DelayedScaling algo must be 'max' or 'most_recent', got {algo!r}")
        self.algo = algo
        buf = np.zeros(self.history_len, dtype=np.float64)
        if amax_history is not None:
            h = np.asarray(amax_history, dtype=np.float64).reshape(-1)[: self.history_len]
            if not (np.isfinite(h) & (h >= 0)).all():
                raise ValueError("amax_history must hold finite, non-negative values")
            buf[: h.size] = h
        self.amax_history = buf

    def __repr__(self) -> str:
        return f"DelayedScaling(history_len={self.history_len}, algo={self.algo!r}, amax={self.history_amax()})"

    __eq__ = object.__eq__
    __hash__ = object.__hash__

    @property
    def name(self) -> str:
        return f"delayed{self.history_len}"

    def _view(self, shape):
        return PerTensor()._view(shape)

    def history_amax(self) -> float:
        """The amax the next quantize() will use (0.0 while the history is empty)."""
        h = self.amax_history
        return float(np.max(h)) if self.algo == "max" else float(h[0])

    def record(self, amax: float) -> None:
        """Push ``amax`` into the history (newest first); non-finite values are skipped, as TE does."""
        if np.isfinite(amax):
            self.amax_history = np.roll(self.amax_history, 1)
            self.amax_history[0] = amax


_NAMED = {
    "tensor": PerTensor,
    "per_tensor": PerTensor,
    "row": PerRow,
    "token": PerRow,
    "per_row": PerRow,
    "col": PerColumn,
    "column": PerColumn,
    "channel": PerColumn,
    "per_col": PerColumn,
}
_PATTERNS = [
    (re.compile(r"^(\d+)x(\d+)$"), lambda m: Tile(int(m[1]), int(m[2]))),
    (re.compile(r"^g(\d+)$"), lambda m: Group(int(m[1]))),
    (re.compile(r"^mx(\d+)$"), lambda m: MX(int(m[1]))),
    (re.compile(r"^mx$"), lambda m: MX(32)),
    (re.compile(r"^nvfp4$"), lambda m: NVFP4(16)),
    (re.compile(r"^delayed(\d*)$"), lambda m: DelayedScaling(int(m[1]) if m[1] else 16)),
]


def granularity_names() -> list[str]:
    """The string forms :func:`granularity` understands (``N``, ``R``, ``C`` any positive ints)."""
    return [
        "tensor",
        "row",
        "col",
        "1xN (e.g. 1x128)",
        "RxC (e.g. 128x128)",
        "gN (e.g. g32)",
        "mxN (e.g. mx32)",
        "nvfp4",
        "delayed / delayedN (history length N)",
    ]


def granularity(g) -> Granularity:
    """A :class:`Granularity` from its short name (or the object itself)."""
    if isinstance(g, Granularity):
        return g
    if not isinstance(g, str):
        raise TypeError(f"granularity must be a Granularity or a name, got {type(g).__name__}")
    key = g.strip().lower()
    if key in _NAMED:
        return _NAMED[key]()
    for pat, make in _PATTERNS:
        m = pat.match(key)
        if m:
            nums = [int(v) for v in m.groups() if v]
            if any(v <= 0 for v in nums):
                raise ValueError(f"granularity {g!r}: tile/group sizes must be positive ints")
            return make(m)
    from ._names import unknown_name_error

    examples = ("tensor", "row", "col", "1x128", "128x128", "g32", "mx32", "nvfp4", "delayed")
    raise unknown_name_error("granularity", g, granularity_names(), candidates=examples, plural="granularities")


_as_granularity = granularity


# =====================================================================
# numba kernels
# =====================================================================
@njit(inline="always")
def _pow2(k):
    """2.0**k for -1022 <= k <= 1023, built from the exponent field."""
    return np.int64((k + 1023) << 52).view(np.float64)


@njit(inline="always")
def _floor_log2(a):
    """floor(log2(a)) for finite a > 0 (from the exponent field; frexp for subnormal doubles)."""
    biased = (np.float64(a).view(np.int64) >> 52) & 0x7FF
    if biased == 0:
        m, e = math.frexp(a)
        return e - 1
    return biased - 1023


@njit(inline="always")
def _ceil_log2(a):
    """ceil(log2(a)) for finite a > 0: floor(log2(a)), plus one unless a is a power of two."""
    b = np.float64(a).view(np.int64)
    if (b >> 52) & 0x7FF == 0:  # subnormal double
        m, e = math.frexp(a)
        return e - 1 if m == 0.5 else e
    return ((b >> 52) & 0x7FF) - 1023 + (1 if b & np.int64(0xFFFFFFFFFFFFF) != 0 else 0)


@njit(inline="always")
def _scale_fp32(a, fmax, m2, smin, smax):
    """An fp32 scale: amax / max times 2**margin (``m2``) rounded to float32, clamped to [smin, smax]
    (one expression for :func:`_scale_one` and the vectorized tile loop of :func:`_round_row`)."""
    s = np.float64(np.float32(_fdiv(np.float64(a), np.float64(fmax)) * m2))  # 2**margin before the float32
    return min(max(s, smin), smax)  # rounding: a ratio beyond float32's range still gets its scaled value


@njit(inline="always")
def _div_odd(a, b):
    """``a / b`` (b > 0) rounded to odd at 53 bits: rounding it to any format of at most 51 bits is the
    single rounding of the exact ratio (below 2**-960 the residual may be inexact; those ratios round to
    zero or the smallest scale anyway).  (``float32(a / b)`` needs no such care where ``b`` has at most
    28 significant bits: the float64 quotient of a float64 by it cannot land on a float32 midpoint
    unless the exact ratio is that midpoint.)"""
    q = _fdiv(a, b)
    return _odd64(q, _fma64(q, b, -a))


@njit(inline="always")
def _scale_one(amax, glob, sp):
    """Dequantization scale of a block from its amax (NaN amax gives a NaN scale)."""
    kind, rnd, fmax, emax_e, mbits_e, margin, smin, smax, emin_s, emax_s = sp
    if amax != amax:
        return np.nan
    if kind == 4:  # e4m3 (NVFP4 block scales): amax / (global scale * max), rounded to odd (glob * fmax is
        # exact), so that rounding it to E4M3 afterwards is the single rounding of the exact ratio
        return _div_odd(np.float64(amax), glob * fmax) * _pow2(margin)
    a = amax if glob == 1.0 else amax / glob  # (a division's latency, per tile, when it is not needed)
    if kind == 0:  # fp32
        return _scale_fp32(a, fmax, _pow2(margin), smin, smax)
    if kind == 1:  # bf16: the unrounded ratio; rounded to the format afterwards
        return a / fmax * _pow2(margin)
    # power of two (pow2 / e8m0)
    if a == 0.0:
        e = emin_s
    elif rnd == 0:  # FLOOR
        e = _floor_log2(a) - emax_e
    elif rnd == 1:  # CEIL
        e = _ceil_log2(a) - emax_e
    elif rnd == 2:  # RCEIL: ceil(log2(float32(amax / fmax)))
        r = np.float64(np.float32(a / fmax))
        e = emin_s if r == 0.0 else _ceil_log2(r)
    else:  # EVEN: amax rounded half up to the element precision, then floor
        b = np.float64(a).view(np.int64) + (np.int64(1) << (51 - mbits_e))
        b = b & ~np.int64((1 << 52) - 1)
        e = _floor_log2(np.int64(b).view(np.float64)) - emax_e
    e = e + margin
    e = min(max(e, emin_s), emax_s)
    return _pow2(e)


@njit(inline="always")
def _amax_update(a, v, ignore_nan):
    av = abs(np.float64(v))
    take = (av > a) | ((av != av) & (not ignore_nan))
    take = take & (av != np.inf)
    return av if take else a


@njit(inline="always")
def _top32(xi, lo, hi):
    """The largest magnitude bit pattern of the float32 patterns xi[lo:hi] (an int32 max reduction)."""
    top = np.int32(0)
    for j in range(np.uint64(lo), np.uint64(hi)):  # unsigned: no wraparound check, so it vectorizes
        top = max(top, np.int32(xi[j] & np.int32(0x7FFFFFFF)))  # int32 casts keep the lanes 32-bit
    return top


@njit(inline="always")
def _amax_bits32(xi, lo, hi, ignore_nan):
    """amax of float32 bit patterns xi[lo:hi]: an integer max reduction (it vectorizes); inf skipped,
    NaN gives NaN unless ignore_nan.  One pass takes the max of every magnitude pattern; only a tile that
    holds an inf or NaN (a max at or above inf's pattern) is scanned again for its largest finite one."""
    top = _top32(xi, lo, hi)
    if top < np.int32(0x7F800000):
        return np.float64(np.int32(top).view(np.float32))
    if top > np.int32(0x7F800000) and not ignore_nan:
        return np.nan
    fin = np.int32(0)
    for j in range(np.uint64(lo), np.uint64(hi)):
        b = np.int32(xi[j] & np.int32(0x7FFFFFFF))
        fin = max(fin, b if b < np.int32(0x7F800000) else np.int32(0))
    return np.float64(np.int32(fin).view(np.float32))


@njit(inline="always")
def _amax_bits64(xi, lo, hi, ignore_nan):
    """As _amax_bits32 for float64 bit patterns."""
    fin = np.int64(0)
    top = np.int64(0)
    for j in range(np.uint64(lo), np.uint64(hi)):
        b = xi[j] & np.int64(0x7FFFFFFFFFFFFFFF)
        top = max(top, b)
        fin = max(fin, b if b < np.int64(0x7FF0000000000000) else np.int64(0))
    if top > np.int64(0x7FF0000000000000) and not ignore_nan:
        return np.nan
    return np.int64(fin).view(np.float64)


@njit(inline="always")
def _amax_seg(xi, lo, hi, ignore_nan):
    if xi.itemsize == 4:
        return _amax_bits32(xi, lo, hi, ignore_nan)
    return _amax_bits64(xi, lo, hi, ignore_nan)


@intrinsic
def _fma32(typingctx, a, b, c):
    """float32 fused multiply-add ``a*b + c`` with one rounding (LLVM's llvm.fma; vectorizes)."""
    sig = nb_types.float32(nb_types.float32, nb_types.float32, nb_types.float32)

    def codegen(context, builder, signature, args):
        flt = llvm_ir.FloatType()
        fn = builder.module.declare_intrinsic("llvm.fma", [flt], llvm_ir.FunctionType(flt, [flt, flt, flt]))
        return builder.call(fn, args)

    return sig, codegen


@intrinsic
def _fma64(typingctx, a, b, c):
    """float64 fused multiply-add ``a*b + c`` with one rounding (LLVM's llvm.fma)."""
    sig = nb_types.float64(nb_types.float64, nb_types.float64, nb_types.float64)

    def codegen(context, builder, signature, args):
        dbl = llvm_ir.DoubleType()
        fn = builder.module.declare_intrinsic("llvm.fma", [dbl], llvm_ir.FunctionType(dbl, [dbl, dbl, dbl]))
        return builder.call(fn, args)

    return sig, codegen


@njit(inline="always")
def _odd64(q, r):
    """The float64 quotient ``q`` re-rounded to odd, given its exact residual ``r = q*d - x`` (d > 0):
    toward zero and with the lowest bit set when inexact.  A NaN residual (an inf or NaN element) keeps
    ``q``; an overflowed ``q`` (inf from a finite element) becomes the largest finite double."""
    b = np.float64(q).view(np.int64)
    inexact = (r != 0.0) & (r == r)
    toward_zero = inexact & (q != 0.0) & ((r > 0.0) == (q > 0.0))
    b = (b - np.int64(toward_zero)) | np.int64(inexact)
    return np.int64(b).view(np.float64)


_Q_LO, _Q_HI = 2.0**-960, 2.0**960  # the quotient's residual is exact (and nothing underflows) between these


@njit(inline="always")
def _quot_odd(xv, d, inv, pow2):
    """The quotient ``xv / d`` rounded to odd at 53 bits (from its exact residual, an FMA): rounding it to
    a format of at most 51 significant bits is the single rounding of the exact quotient in every mode.
    Also returns whether that holds: not where ``|xv|`` or the quotient is below 2**-960 (there the
    residual may be inexact and the quotient may have lost bits to underflow; :func:`_quot_odd_scaled`
    handles those).  ``inv = 1/d`` and ``pow2`` (``d`` is a power of two) let a power-of-two scale
    multiply.  ``d`` must lie in [2**-960, 2**960]."""
    q = xv * inv if pow2 else xv / d
    r = _fma64(q, d, -xv)  # (0 for a power of two, unless the product overflowed to inf)
    aq = abs(q)
    ax = abs(xv)
    ok = ((aq >= _Q_LO) & (ax >= _Q_LO)) | (ax == 0.0) | (not (ax < np.inf))
    return _odd64(q, r), ok


@njit
def _quot_odd_scaled(xv, d):
    """``(q, k)``: the quotient ``xv * 2**k / d`` rounded to odd, with ``xv * 2**k`` (exact) near ``d`` so
    that the quotient is near 1: rounding ``q`` to a format whose exponent range is shifted by ``k`` is the
    single rounding of ``xv / d`` where the plain quotient underflows (finite nonzero ``xv``, ``d`` in
    [2**-960, 2**960])."""
    mx, ex = math.frexp(xv)
    md, ed = math.frexp(d)
    k = ed - ex
    xs = math.ldexp(xv, k)
    q = xs / d
    return _odd64(q, _fma64(q, d, -xs)), k


@intrinsic
def _fdiv(typingctx, a, b):
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


_prefetch_r = _make_prefetch(0)
_prefetch_w = _make_prefetch(1)


@intrinsic
def _lshr32(typingctx, a, s):
    """``a >> s`` (logical) on int32 lanes.  numba widens int32 shifts to int64, and LLVM cannot narrow
    a right shift by a run-time amount back, so the shift is emitted directly (it vectorizes as one
    shift by a scalar count)."""
    sig = nb_types.int32(nb_types.int32, nb_types.int32)

    def codegen(context, builder, signature, args):
        return builder.lshr(args[0], args[1])

    return sig, codegen


@intrinsic
def _borrow(typingctx, arr):
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


@njit(inline="always")
def _to_odd(q, r, zero):
    """The float32 quotient ``q`` re-rounded to odd, given its exact residual ``r = q*d - x`` (float32 or
    float64, ``zero`` a 0 of the same type; r is NaN for an inf or NaN element, which is kept as it is):
    toward zero and with the lowest bit set when inexact."""
    b = np.float32(q).view(np.int32)
    inexact = (r != zero) & (r == r)
    toward_zero = inexact & (q != np.float32(0.0)) & ((r > zero) == (q > np.float32(0.0)))
    b = np.int32(np.int32(b - np.int32(toward_zero)) | np.int32(inexact))
    return np.int32(b).view(np.float32)


@njit(inline="always")
def _to_odd32(q, r):
    """As :func:`_to_odd` for a float32 residual, in fewer lane operations: the quotient overshoots the
    exact one when ``r`` and ``q`` have the same sign bit (a zero ``q`` always has the sign of ``x``, so
    it never overshoots); ``r != 0`` as an ordered comparison is false for a NaN residual (inf or NaN
    element), which keeps ``q`` as it is."""
    b = np.float32(q).view(np.int32)
    inexact = np.int32(-1) if (r < np.float32(0.0)) | (r > np.float32(0.0)) else np.int32(0)
    same = np.int32(np.int32(np.float32(r).view(np.int32) ^ b) >> np.int32(31))  # 0 if same sign, else -1
    down = np.int32(inexact & ~same)  # -1 where q overshoots
    b = np.int32(np.int32(b + down) | np.int32(inexact & np.int32(1)))
    return np.int32(b).view(np.float32)


@njit(inline="always")
def _rne_code32(q, fp, nan=True):
    """The code of the float32 ``q`` rounded to nearest even into a signed format with subnormals and
    the standard layout, in 32-bit integer and float32 lane arithmetic only (it vectorizes).

    ``q`` must be exact or rounded to odd (at 24 bits, then rounding to <= 21 is the single rounding).
    Two candidates, selected by the magnitude ``a`` of ``q``'s bit pattern:

    * normal range (``|q| >= 2**emin``): the integer rounding of the pattern,
      ``(a + 2**(s-1) - 1 + lsb) >> s`` with ``s = 23 - m`` and ``lsb`` the last kept bit, with the
      exponent rebias folded into the added constant;
    * subnormal range: adding ``M = 2**(emin - m + 23)`` rounds ``|q|`` to a multiple of the subnormal
      spacing ``2**(emin - m)`` by float32 RNE, and the low bits of the sum count the multiples, which
      is the code (``2**m``, the smallest normal's code, when it rounds up).

    Overflow (and inf) is capped to the saturation or overflow code, NaN gets the NaN code.  ``fp``:
    int32 constants from :func:`_fast_params`.
    """
    e0_bits, shift, k_add, magic_bits, ovf_code, nan_code, sign_shift, sign_mask = fp[:8]
    b = np.float32(q).view(np.int32)
    a = np.int32(b & np.int32(0x7FFFFFFF))
    lsb = np.int32(_lshr32(a, shift) & np.int32(1))
    cn = _lshr32(np.int32(np.int32(a + k_add) + lsb), shift)  # a + k_add > 0 where cn is used
    y = np.float32(np.int32(a).view(np.float32) + np.int32(magic_bits).view(np.float32))
    cs = np.int32(np.float32(y).view(np.int32) - magic_bits)
    c = cs if a < e0_bits else cn
    c = min(c, ovf_code)  # ovf_code is max_code (saturate) or max_code + 1 (the inf or NaN code)
    if nan:  # (a constant at the call site: False drops the test where no element can be NaN)
        c = nan_code if q != q else c
    return np.uint8(c | np.int32(_lshr32(b, sign_shift) & sign_mask))


def _fast_params(fmt: Format, saturate: bool):
    """int32 constants of :func:`_rne_code32` for ``fmt``, or None where it does not apply
    (the format needs a signed layout with -0, subnormals, IEEE/OCP/no NaN, <= 8 bits, and ranges
    that keep every constant a float32 normal and every sum inside int32)."""
    ok = (
        fmt.signed
        and fmt.subnormals
        and fmt.has_negative_zero
        and fmt.bits <= 8
        and fmt.sign_mask == 1 << (fmt.bits - 1)
        and fmt.nan in (NanStyle.IEEE, NanStyle.OCP, NanStyle.NONE)
        and 1 <= fmt.mbits <= 21
        and fmt.emin - fmt.mbits >= -124
        and fmt.emax <= 120
    )
    if not ok:
        return None
    if saturate or fmt.nan is NanStyle.NONE:
        ovf = fmt.max_code_mag
    else:
        special = fmt.inf_code if fmt.inf_code is not None else fmt.nan_code
        if special is None or special != fmt.max_code_mag + 1:  # the overflow code must follow the largest
            return None
        ovf = special
    i32 = np.int32
    s = 23 - fmt.mbits
    # The float32 residual fma(q, d, -x) of q = RN(x/d) is exact when q's and d's binades sum to at least
    # -103 (no underflow).  It decides the rounding only for quotients from the format's smallest
    # midpoint 2**(emin - mbits - 1) upward (smaller ones give zero either way), so scales from
    # 2**(-103 - (emin - mbits - 1)) up may use it; smaller scales take the float64 residual.
    fma_min = max(-126, -103 - (fmt.emin - fmt.mbits - 1))
    return (
        i32((fmt.emin + 127) << 23),  # |q| below 2**emin: subnormal
        i32(s),
        i32((1 << (s - 1)) - 1 - ((126 + fmt.emin) << 23)),  # rounding bias minus the exponent rebias
        i32((fmt.emin - fmt.mbits + 23 + 127) << 23),  # M = 2**(emin - m + 23)
        i32(ovf),
        i32(fmt.nan_code if fmt.nan_code is not None else -1),
        i32(32 - fmt.bits),  # the sign bit moves from bit 31 to bit bits-1
        i32(fmt.sign_mask),
        i32((fma_min + 127) << 23),
        i32((1 << (s - 1)) - 4),  # near-midpoint window of the multiply path: its low end ...
        i32((1 << s) - 1),  # ... and the mask of the bits below the last kept one
    )


_NO_FAST = (np.int32(0),) * 11


@njit(cache=True)  # not inlined: the kernels share one compilation of the general path
def _round_seg_general(xs, cs, d, mode, p, key, base):
    """The general path of :func:`_round_row`: the float64 quotient rounded to odd (:func:`_quot_odd`, or
    :func:`_quot_odd_scaled` where it underflows), rounded by the bit-level kernel."""
    (
        mbits,
        emin,
        emax,
        max_code,
        max_val,
        sign_mask,
        signed,
        has_neg_zero,
        subnormals,
        inf_code,
        nan_code,
        sat,
        flush,
        sr_bits,
    ) = p
    n = xs.size
    m, ex = math.frexp(d)
    pow2 = m == 0.5
    inv = 1.0 / d
    # The quotient rounded to odd: the kernel's rounding of it is the single rounding of the exact x / d
    # in every mode.  Elements whose quotient underflows (tiny x, huge d) are redone in a second pass with
    # the exponent range shifted.
    d_ok = (d >= _Q_LO) & (d <= _Q_HI)
    hard = False
    for j in range(n):
        r = K.random_bits(key, base + j) if mode == K.SR else np.uint64(0)
        xv = np.float64(xs[j])
        if d_ok:
            q, ok = _quot_odd(xv, d, inv, pow2)
            hard = hard | (not ok)
        else:
            q = xv / d
        v, c = K.round_one(
            q,
            r,
            mode,
            mbits,
            emin,
            emax,
            max_code,
            max_val,
            sign_mask,
            signed,
            has_neg_zero,
            subnormals,
            inf_code,
            nan_code,
            sat,
            flush,
            sr_bits,
        )
        cs[j] = c
    if not hard:
        return
    for j in range(n):
        xv = np.float64(xs[j])
        q, ok = _quot_odd(xv, d, inv, pow2)
        if ok:
            continue
        q, k = _quot_odd_scaled(xv, d)
        r = K.random_bits(key, base + j) if mode == K.SR else np.uint64(0)
        v, c = K.round_one(
            q,
            r,
            mode,
            mbits,
            emin + k,  # the format's exponent range shifted by k, as the quotient is (only the code is used)
            emax + k,
            max_code,
            max_val,
            sign_mask,
            signed,
            has_neg_zero,
            subnormals,
            inf_code,
            nan_code,
            sat,
            flush,
            sr_bits,
        )
        cs[j] = c


@njit(inline="always")
def _div_tile(xrow, crow, lo, hi, d32, fp):
    """Codes of xrow[lo:hi] / d32: the float32 quotient re-rounded to odd with its exact float32
    residual ``q*d - x`` (:func:`_fast_params` says for which scales it is exact)."""
    for j in range(np.uint64(lo), np.uint64(hi)):
        xv = np.float32(xrow[j])
        q = xv / d32
        crow[j] = _rne_code32(_to_odd32(q, _fma32(q, d32, -xv)), fp)


@njit(inline="always")
def _pow2_run(xrow, crow, ie, lo, hi, clo, fp, nan):
    """Codes of xrow[lo:hi] times each element's exact reciprocal ``ie[j - clo]`` (a run of tiles with
    power-of-two scales: one loop, no per-tile set-up)."""
    for j in range(np.uint64(lo), np.uint64(hi)):
        crow[j] = _rne_code32(np.float32(xrow[j]) * ie[j - np.uint64(clo)], fp, nan)


@njit(inline="always")
def _mul_tile(xrow, crow, lo, hi, inv, fp, sub_lim, nan):
    """Codes of xrow[lo:hi] times the reciprocal ``inv`` of a float32 scale that is not a power of two:
    ``q1 = RN(x * RN(1/d))`` is within 2 ulps of ``x/d``, so RNE at the format's precision gives the
    single rounding unless a midpoint of the format's grid is that close to ``q1`` (its bits below the
    last kept one within 4 of 100..0) or ``q1`` is in the subnormal range.  Returns whether an element
    was that close (the caller then redoes the tile by division)."""
    lo_win, smask = fp[9], fp[10]
    hard = np.int32(0)  # min of int32 masks: 32-bit lanes (| would widen them to 64 bits)
    for j in range(np.uint64(lo), np.uint64(hi)):
        q1 = np.float32(xrow[j]) * inv
        crow[j] = _rne_code32(q1, fp, nan)
        a = np.int32(np.float32(q1).view(np.int32) & np.int32(0x7FFFFFFF))
        near = np.int32(np.int32(a - lo_win) & smask) <= np.int32(8)
        sub = np.int32(a + np.int32(0x7FFFFFFF)) < sub_lim  # 0 < |q1| < 2**emin: 1 moved to INT32_MIN
        hard = min(hard, np.int32(-1) if near | sub else np.int32(0))
    return hard != np.int32(0)


# _round_row's paths for a tile
_P_POW2, _P_MUL, _P_DIV, _P_DIV64, _P_NAN, _P_OTHER = 0, 1, 2, 3, 4, 5


@njit(inline="always")
def _normal_scale_path(sb, fma_min):
    """The path of a tile whose float32 scale is a finite normal with bit pattern ``sb``: a power of two;
    else the multiply path where the float32 residual is exact (``sb >= fma_min``, :func:`_fast_params`)
    and the scale is below 2**125; else division (selects only: it vectorizes)."""
    pth = np.int32(_P_MUL) if sb < np.int32(0x7E000000) else np.int32(_P_DIV)
    pth = pth if sb >= fma_min else np.int32(_P_DIV64)
    return np.int32(_P_POW2) if np.int32(sb & np.int32(0x7FFFFF)) == np.int32(0) else pth


# Measured rows (1xN tiles, MX) prefetch the input and code lines _PREFETCH elements (8 KB of float32,
# two chunks) ahead of the tile being rounded, a tile's worth at a time, spread over the row (into the
# next row at a row's end; a prefetch never faults): on the 2-core benchmark machine the hardware
# prefetcher alone left these rows waiting on memory for a fifth to a quarter of the time (1x128) and
# the prefetch took that away.  Where in the loop it goes was measured: prefetching a whole chunk at
# once gained less, the rows of NxN bands (read from cache) and 4096 or more ahead gained nothing or
# lost (benchmarks/RESULTS.md).
_PREFETCH = 2048


@njit(cache=True)
def _round_row(
    xrow,
    crow,
    bn,
    srow,
    glob,
    mode,
    p,
    key,
    base,
    tab,
    use_tab,
    fp,
    use_fast,
    measure,
    xirow,
    arow,
    sp,
    ignore_nan,
    nan_free,
    pfd,
):
    """Codes of one row: tile ``jb`` (elements ``lo = jb*bn`` to ``hi = (jb+1)*bn``, the last one ragged)
    divided by ``d = srow[jb] * glob``, each the single rounding of the exact quotient.

    ``pfd`` > 0: the multiply loop prefetches the input ``pfd`` elements ahead of each tile (the rows of
    the next band, for :func:`_fused_bands32`).

    ``nan_free``: no element reaches the fast loops as NaN (the caller measured every block's amax with
    NaN propagating, so a block with a NaN has a NaN scale and is filled), which drops their NaN test.

    With ``measure``, the scales are not given but computed here: each tile's amax (from ``xirow``, the
    row's bit patterns) goes to ``arow`` and its scale (policy ``sp``) to ``srow``.  The row is worked
    through in chunks of about 1024 elements, each measured and then rounded while it is in L1; for
    float32 tiles with fp32 or MX scales the measuring is vectorized across the chunk's tiles.

    A serial function that the parallel kernels call once per row (compiled once).  The tile loop's body
    is written out here rather than in an inlined helper: passing the row arrays to one costs reference
    counting per tile, more than a 32-element tile's arithmetic.

    Paths, fastest first:

    * ``use_fast`` (float32 input, RNE, a format :func:`_fast_params`
      accepts) and a float32 normal scale: for a power-of-two scale the
      float32 product with its reciprocal is exact; otherwise the product
      with the reciprocal is used where it provably rounds like the exact
      quotient, else the float32 quotient is re-rounded to odd with its
      exact residual (below); then :func:`_rne_code32` computes the code
      arithmetically.
    * ``use_tab`` (float32 input, deterministic mode, an element format with
      <= 6 mantissa bits, ``tab`` = that rounding's memo table from
      :mod:`fp8sim.rounding`) and a float32 scale: the quotient is formed in
      float32, its exact residual ``q*d - x`` (exact in float64) tells
      whether and in which direction it was rounded, and the quotient is
      re-rounded to odd (toward zero, lowest bit set when inexact).  Round to
      odd at 24 bits followed by any rounding at <= 7 bits equals that single
      rounding of the exact quotient; the memo table then gives the code.
    * otherwise the float64 quotient (:func:`_round_seg_general`), by
      multiplying with the reciprocal for a power-of-two scale, else by
      division re-rounded to odd with its exact FMA residual; quotients that
      underflow float64 are redone with the exponent range shifted, so every
      mode rounds the exact quotient once.
    """
    N = xrow.size
    nt = srow.size
    # tiles per chunk: about 1024 elements (4 KB of float32), measured and then rounded while in L1
    tpc = max(1, 1024 // bn)
    nan_code = p[10]  # the rest of p goes to the general path
    e0_bits = fp[0]
    sub_lim = np.int32(e0_bits + np.int32(0x7FFFFFFF))  # see the multiply path
    path = np.empty(tpc, dtype=np.int32)
    dv = np.empty(tpc, dtype=np.float32)  # the float32 scale
    iv = np.empty(tpc, dtype=np.float32)  # its reciprocal
    ie = np.empty(tpc * bn, dtype=np.float32)  # the reciprocal of each element's power-of-two scale
    tops = np.empty(tpc, dtype=np.int32)  # each tile's largest magnitude bit pattern
    # Measuring float32 tiles for fp32 scales (vkind 1) or OCP MX scales (E8M0 or power of two, FLOOR;
    # vkind 2) is vectorized across the chunk's tiles: one loop takes every tile's largest magnitude
    # pattern, the next computes all their scales, reciprocals and paths at once (the per-tile scalar
    # work, and its latency chain amax -> scale -> reciprocal, cost as much as a 128-element tile's
    # rounding otherwise).  A chunk with an inf or NaN, or (MX) an amax outside the normal range or a
    # scale the format clamps, takes the per-tile path below instead.  Given float32 scales (vkind 3)
    # are classified in one vectorized loop too.
    vkind = 0
    if measure and use_fast and xirow.itemsize == 4 and glob == 1.0:
        if sp[0] == _FP32:
            vkind = 1
        elif (sp[0] == _POW2 or sp[0] == _E8M0) and sp[1] == _FLOOR:
            vkind = 2
    elif not measure and use_fast and glob == 1.0:
        vkind = 3
    fmax, m2, smin, smax = sp[2], _pow2(sp[5]), sp[6], sp[7]
    fma_min = fp[8]
    # MX: the scale 2**(floor(log2 amax) - emax_elem + margin) is the amax's exponent field shifted;
    # it is used as it is where it lies in [2**-126, 2**125] and in the scale format's range
    mx_off = np.int32(127 + sp[3] - sp[5])  # biased exponent minus this is the scale's exponent
    mx_lo = np.int32(max(-126, sp[8]))
    mx_hi = np.int32(min(125, sp[9]))
    for c0 in range(0, nt, tpc):
        c1 = min(c0 + tpc, nt)
        n = c1 - c0
        # Phase 1: each tile's amax and scale (with ``measure``), path and float32 constants.
        fast1 = False
        if vkind == 1 or vkind == 2:
            for t in range(n):
                lo = (c0 + t) * bn
                hi = min(lo + bn, N)
                tops[t] = _top32(xirow, lo, hi)
                if vkind == 2:  # (see _PREFETCH)
                    for k in range(lo + _PREFETCH, hi + _PREFETCH, 16):
                        _prefetch_r(xrow, np.int64(k))
                    for k in range(lo + _PREFETCH, hi + _PREFETCH, 64):
                        _prefetch_w(crow, np.int64(k))
        if vkind != 0:
            bad = np.int32(0)  # min of int32 flags: 32-bit lanes
            if vkind == 1:
                for t in range(np.uint64(n)):  # vectorizes (no branch: selects)
                    top = tops[t]
                    s32 = np.float32(_scale_fp32(np.int32(top).view(np.float32), fmax, m2, smin, smax))
                    sb = np.float32(s32).view(np.int32)
                    arow[np.uint64(c0) + t] = np.int32(top).view(np.float32)
                    srow[np.uint64(c0) + t] = s32
                    dv[t] = s32
                    iv[t] = _fdiv(np.float32(1.0), s32)  # exact for a power of two
                    path[t] = _normal_scale_path(sb, fma_min)  # s32 is a finite normal (clamped)
                    bad = min(bad, np.int32(-1) if top >= np.int32(0x7F800000) else np.int32(0))
            elif vkind == 3:
                for t in range(np.uint64(n)):  # vectorizes
                    s32 = np.float32(srow[np.uint64(c0) + t])
                    sb = np.float32(s32).view(np.int32)
                    dv[t] = s32
                    iv[t] = _fdiv(np.float32(1.0), s32)
                    normal = (sb >= np.int32(0x00800000)) & (sb < np.int32(0x7F800000))
                    pth = _normal_scale_path(sb, fma_min)
                    pth = pth if normal else np.int32(_P_OTHER)
                    path[t] = np.int32(_P_NAN) if s32 != s32 else pth
            else:
                for t in range(np.uint64(n)):  # vectorizes
                    top = tops[t]
                    e = np.int32(_lshr32(top, np.int32(23)) - mx_off)
                    sbits = np.int32(np.int32(e + np.int32(127)) << np.int32(23))
                    arow[np.uint64(c0) + t] = np.int32(top).view(np.float32)
                    srow[np.uint64(c0) + t] = np.int32(sbits).view(np.float32)
                    dv[t] = np.int32(sbits).view(np.float32)
                    iv[t] = np.int32(np.int32(0x7F000000) - sbits).view(np.float32)
                    path[t] = np.int32(_P_POW2)
                    ok = (top >= np.int32(0x00800000)) & (top < np.int32(0x7F800000)) & (e >= mx_lo) & (e <= mx_hi)
                    bad = min(bad, np.int32(0) if ok else np.int32(-1))
            if bad == np.int32(0):
                fast1 = True
                for t in range(n):
                    if path[t] == _P_POW2:
                        inv = iv[t]
                        for j in range(np.uint64(t * bn), np.uint64(min(t * bn + bn, N - c0 * bn))):
                            ie[j] = inv  # each element's reciprocal: the run's loop has no per-tile set-up
        for jb in range(c0, c1 if not fast1 else c0):  # per tile, scalar
            t = jb - c0
            if measure:
                a = _amax_seg(xirow, jb * bn, min(jb * bn + bn, N), ignore_nan)
                arow[jb] = a
                srow[jb] = _scale_one(a, glob, sp)
            d = np.float64(srow[jb]) * glob
            d32 = np.float32(d)
            dv[t] = d32
            sb = np.float32(d32).view(np.int32)
            if use_fast and np.int32(sb - np.int32(0x00800000)) < np.int32(0x7E000000) and sb & 0x7FFFFF == 0:
                # a power of two in [2**-126, 2**125]: its reciprocal, exactly, from the exponent field
                iv[t] = np.int32(np.int32(0x7F000000) - sb).view(np.float32)
            else:
                iv[t] = np.float32(1.0) / d32
            if d != d:
                path[t] = _P_NAN
            elif use_fast and np.float64(d32) == d and d32 >= np.float32(1.1754943508222875e-38) and d32 < np.inf:
                if np.int32(np.float32(d32).view(np.int32) & np.int32(0x7FFFFF)) == np.int32(0):
                    path[t] = _P_POW2
                    inv = iv[t]
                    for j in range(np.uint64(t * bn), np.uint64(min(t * bn + bn, N - c0 * bn))):
                        ie[j] = inv  # each element's reciprocal: the run's loop has no per-tile set-up
                elif np.float32(d32).view(np.int32) >= fma_min:  # the float32 residual is exact (_fast_params)
                    path[t] = _P_MUL if d32 < np.float32(4.2535295865117308e37) else _P_DIV  # 2**125
                else:
                    path[t] = _P_DIV64
            else:
                path[t] = _P_OTHER
        # Phase 2: the tiles.  Runs of power-of-two and multiply-path tiles go through tight loops that keep
        # their constants in registers.  The NaN fill and the fast paths index the row with unsigned integers
        # over range(lo, hi): no bounds wraparound (so the loops vectorize) and no tile slices (whose reference
        # counting would cost more than a 32-element tile's arithmetic).  The table and general paths work on
        # slices.
        jb = c0
        while jb < c1:
            kind = path[jb - c0]
            if kind == _P_POW2:  # the product with the exact reciprocal, over a run of such tiles at once
                je = jb + 1
                while je < c1 and path[je - c0] == _P_POW2:
                    je += 1
                if nan_free:
                    _pow2_run(xrow, crow, ie, jb * bn, min(je * bn, N), c0 * bn, fp, False)
                else:
                    _pow2_run(xrow, crow, ie, jb * bn, min(je * bn, N), c0 * bn, fp, True)
                jb = je
                continue
            if kind == _P_MUL:  # the product with the reciprocal, checked (_mul_tile); rare tiles by division
                while True:
                    lo = jb * bn
                    hi = min(lo + bn, N)
                    if measure and bn >= 128:  # (see _PREFETCH)
                        for k in range(lo + _PREFETCH, hi + _PREFETCH, 16):
                            _prefetch_r(xrow, np.int64(k))
                        for k in range(lo + _PREFETCH, hi + _PREFETCH, 64):
                            _prefetch_w(crow, np.int64(k))
                    elif pfd > 0:
                        for k in range(lo + pfd, hi + pfd, 16):
                            _prefetch_r(xrow, np.int64(k))
                    if nan_free:
                        hard = _mul_tile(xrow, crow, lo, hi, iv[jb - c0], fp, sub_lim, False)
                    else:
                        hard = _mul_tile(xrow, crow, lo, hi, iv[jb - c0], fp, sub_lim, True)
                    if hard:
                        _div_tile(xrow, crow, lo, hi, dv[jb - c0], fp)
                    jb += 1
                    if jb == c1 or path[jb - c0] != _P_MUL:
                        break
                continue
            lo = jb * bn
            hi = min(lo + bn, N)
            ulo = np.uint64(lo)
            uhi = np.uint64(hi)
            d32 = dv[jb - c0]
            jb += 1
            if kind == _P_DIV:
                _div_tile(xrow, crow, lo, hi, d32, fp)
                continue
            if kind == _P_DIV64:  # as _P_DIV with the float64 residual (exact where the float32 one may not be)
                d64 = np.float64(d32)
                for j in range(ulo, uhi):
                    xv = np.float32(xrow[j])
                    q = xv / d32
                    crow[j] = _rne_code32(_to_odd(q, np.float64(q) * d64 - np.float64(xv), 0.0), fp)
                continue
            if kind == _P_NAN:  # NaN scale: the whole block is NaN (elements get the NaN code, or 0 without one)
                fill = nan_code if nan_code >= 0 else 0
                for j in range(ulo, uhi):
                    crow[j] = fill
                continue
            d = np.float64(srow[jb - 1]) * glob
            xs = xrow[lo:hi]
            cs = crow[lo:hi]
            n = xs.size
            if use_tab and np.float64(d32) == d and d32 >= np.float32(1.1754943508222875e-38) and d32 < np.inf:
                d64 = np.float64(d32)
                buf = np.empty(n, dtype=np.uint32)
                for j in range(n):  # vectorizes: quotient, residual, round to odd
                    xv = np.float32(xs[j])
                    q = xv / d32
                    r = np.float64(q) * d64 - np.float64(xv)  # exact: q*d has <= 48 significant bits
                    b = np.int64(np.float32(q).view(np.int32))
                    inexact = r != 0.0
                    toward_zero = inexact & (q != np.float32(0.0)) & ((r > 0.0) == (q > np.float32(0.0)))
                    b = (b - np.int64(toward_zero)) | np.int64(inexact)
                    if not (abs(xv) < np.float32(np.inf)):  # inf / NaN elements keep their own pattern
                        b = np.int64(xv.view(np.int32))
                    buf[j] = np.uint32(b & np.int64(0xFFFFFFFF))
                for j in range(n):  # table lookups
                    u = buf[j]
                    cs[j] = tab[np.int64((u & np.uint32(0xFFFF)) != np.uint32(0)), np.int64(u >> np.uint32(16))]
                continue
            _round_seg_general(xs, cs, d, mode, p, key, base + lo)


@njit(cache=True)
def _band_amax_row(xirow, bn, ignore_nan, am):
    """Fold one row's tile amaxes into the band's ``am`` (NaN propagates, as np.maximum does)."""
    N = xirow.size
    for jb in range(am.size):
        ai = _amax_seg(xirow, jb * bn, min(jb * bn + bn, N), ignore_nan)
        a = am[jb]
        if a == a and (ai != ai or ai > a):
            am[jb] = ai


# The rounding mode is a run-time argument: one compilation of each kernel serves every mode (the
# fast paths do not depend on it; the general path branches on it per element).
@njit(parallel=True, cache=True)
def _apply(x3, xi3, scales3, bm, bn, glob, mode, p, key, tab, use_tab, fp, use_fast, sp, codes3):
    """Round every element with its block's (given) scale; parallel over rows."""
    B, M, N = x3.shape
    x3, xi3, scales3, codes3, tab = _borrow(x3), _borrow(xi3), _borrow(scales3), _borrow(codes3), _borrow(tab)
    for t in prange(B * M):
        b = t // M
        i = t - b * M
        srow = scales3[b, i // bm]
        _round_row(
            x3[b, i],
            codes3[b, i],
            bn,
            srow,
            glob,
            mode,
            p,
            key,
            t * N,
            tab,
            use_tab,
            fp,
            use_fast,
            False,
            xi3[b, i],
            srow,
            sp,
            False,
            False,  # given scales: a NaN element may meet a finite scale
            0,
        )


@njit(parallel=True, cache=True)
def _fused(x3, xi3, bm, bn, mode, p, key, sp, glob, ignore_nan, tab, use_tab, fp, use_fast, codes3, scales3, amax3):
    """Per band of bm rows: the blocks' amaxes, their scales, then the rounding.  A single row (1xN
    tiles, groups and MX) is measured and rounded chunk by chunk in one pass (:func:`_round_row`); a
    band of several rows (float64 input: float32 bands go to :func:`_fused_bands32`) is read for its
    amaxes first, then again, from cache, for the rounding.  Parallel over bands.  The scale kinds it serves (fp32, pow2, e8m0) are float32 values, so the
    rounding may take them back from ``scales3``."""
    B, M, N = x3.shape
    nbm = (M + bm - 1) // bm
    nbn = (N + bn - 1) // bn
    x3, xi3, codes3, tab = _borrow(x3), _borrow(xi3), _borrow(codes3), _borrow(tab)
    scales3, amax3 = _borrow(scales3), _borrow(amax3)
    for t in prange(B * nbm):
        b = t // nbm
        ib = t - b * nbm
        i0 = ib * bm
        i1 = min(i0 + bm, M)
        if bm > 1:  # (float32 bands go to _fused_bands32)
            am = np.zeros(nbn, dtype=np.float64)
            for i in range(i0, i1):
                _band_amax_row(xi3[b, i], bn, ignore_nan, am)
            for jb in range(nbn):
                amax3[b, ib, jb] = am[jb]
                scales3[b, ib, jb] = _scale_one(am[jb], glob, sp)
        for i in range(i0, i1):
            _round_row(
                x3[b, i],
                codes3[b, i],
                bn,
                scales3[b, ib],
                glob,
                mode,
                p,
                key,
                (b * M + i) * N,
                tab,
                use_tab,
                fp,
                use_fast,
                bm == 1,
                xi3[b, i],
                amax3[b, ib],
                sp,
                ignore_nan,
                not ignore_nan,  # NaN made its block's scale NaN
                0,
            )


@njit(inline="always")
def _colmax(xr, acc):
    """acc[j] = max(acc[j], |xr[j]|) on float32 bit patterns (int32 lanes; NaN's patterns lie above inf's)."""
    for j in range(np.uint64(acc.size)):
        acc[j] = max(acc[j], np.int32(xr[j] & np.int32(0x7FFFFFFF)))


@njit(parallel=True, cache=True)
def _fused_bands32(
    x3, xi3, bm, bn, mode, p, key, sp, glob, ignore_nan, tab, use_tab, fp, use_fast, codes3, scales3, amax3, nch
):
    """As :func:`_fused` for bands of bm > 1 rows of float32, software-pipelined: the ``B*nbm`` bands are
    split into ``nch`` runs of consecutive bands, one per thread.  A band's amaxes come from the
    column-wise max of its rows' magnitude bit patterns and one reduction per block (a block whose max
    is inf's pattern or above, an inf or NaN in it, is measured again row by row).  Each row of a band
    is rounded (from cache) and then the same row of the next band is folded into that band's max,
    while the rounding loop prefetches that row (``pfd``): the next band's stream from memory overlaps
    this band's arithmetic, where a separate amax pass left them one after the other."""
    B, M, N = x3.shape
    nbm = (M + bm - 1) // bm
    nbn = (N + bn - 1) // bn
    nb = B * nbm
    x3, xi3, codes3, tab = _borrow(x3), _borrow(xi3), _borrow(codes3), _borrow(tab)
    scales3, amax3 = _borrow(scales3), _borrow(amax3)
    nch = max(1, min(nb, nch))
    for c in prange(nch):
        t0 = c * nb // nch
        t1 = (c + 1) * nb // nch
        acc = np.zeros(N, dtype=np.int32)  # the column-wise max of this band ...
        nxt = np.zeros(N, dtype=np.int32)  # ... and of the next one
        b = t0 // nbm
        ib = t0 - b * nbm
        for i in range(ib * bm, min(ib * bm + bm, M)):
            _colmax(xi3[b, i], acc)
        for t in range(t0, t1):
            b = t // nbm
            ib = t - b * nbm
            i0 = ib * bm
            i1 = min(i0 + bm, M)
            for jb in range(nbn):
                top = _top32(acc, jb * bn, min(jb * bn + bn, N))
                if top < np.int32(0x7F800000):
                    a = np.float64(np.int32(top).view(np.float32))
                else:
                    a = 0.0
                    for i in range(i0, i1):
                        ai = _amax_seg(xi3[b, i], jb * bn, min(jb * bn + bn, N), ignore_nan)
                        if a == a and (ai != ai or ai > a):
                            a = ai
                amax3[b, ib, jb] = a
                scales3[b, ib, jb] = _scale_one(a, glob, sp)
            has_next = t + 1 < t1
            bq = (t + 1) // nbm  # the next band: batch bq, rows j0 to j1 (consecutive in memory)
            j0 = ((t + 1) - bq * nbm) * bm
            j1 = min(j0 + bm, M)
            pfd = ((bq * M + j0) - (b * M + i0)) * N if has_next else 0
            if has_next:
                for j in range(N):
                    nxt[j] = 0
            for i in range(i0, i1):
                _round_row(
                    x3[b, i],
                    codes3[b, i],
                    bn,
                    scales3[b, ib],
                    glob,
                    mode,
                    p,
                    key,
                    (b * M + i) * N,
                    tab,
                    use_tab,
                    fp,
                    use_fast,
                    False,
                    xi3[b, i],
                    amax3[b, ib],
                    sp,
                    ignore_nan,
                    not ignore_nan,  # NaN made its block's scale NaN
                    pfd,
                )
                if has_next and j0 + (i - i0) < j1:
                    _colmax(xi3[bq, j0 + (i - i0)], nxt)
            if has_next:
                for j in range(j0 + (i1 - i0), j1):  # the next band has more rows (this one is ragged)
                    _colmax(xi3[bq, j], nxt)
                acc, nxt = nxt, acc


_NO_TABLE = np.zeros((2, 1), dtype=np.uint8)


@njit(parallel=True, cache=True)
def _amax_rows(xi2, bn, ignore_nan, out):
    """Per row, amax of each run of ``bn`` columns: out[i, jb] (xi2: the input's bit patterns)."""
    R, N = xi2.shape
    nbn = (N + bn - 1) // bn
    for i in prange(R):
        xirow = xi2[i]
        for jb in range(nbn):
            lo = jb * bn
            hi = min(lo + bn, N)
            out[i, jb] = _amax_seg(xirow, lo, hi, ignore_nan)


@njit(parallel=True, cache=True)
def _amax_cols(x3, bm, ignore_nan, out):
    """Blocks (bm, 1): out[b, ib, j] = amax of x3[b, ib*bm:(ib+1)*bm, j]; parallel over column chunks."""
    B, M, N = x3.shape
    nbm = (M + bm - 1) // bm
    CW = 512
    nch = (N + CW - 1) // CW
    for t in prange(B * nch):
        b = t // nch
        c0 = (t - b * nch) * CW
        c1 = min(c0 + CW, N)
        for ib in range(nbm):
            for j in range(c0, c1):
                out[b, ib, j] = 0.0
            for i in range(ib * bm, min((ib + 1) * bm, M)):
                for j in range(c0, c1):
                    out[b, ib, j] = _amax_update(out[b, ib, j], x3[b, i, j], ignore_nan)


@njit(cache=True)
def _scales_from_amax(amax, glob, sp, out):
    for k in range(amax.size):
        out[k] = _scale_one(amax[k], glob, sp)


@njit(parallel=True, cache=True)
def _dequant(codes3, table, scales3, bm, bn, glob, out3):
    B, M, N = codes3.shape
    nbn = (N + bn - 1) // bn
    for t in prange(B * M):
        b = t // M
        i = t - b * M
        ib = i // bm
        crow = codes3[b, i]
        orow = out3[b, i]
        for jb in range(nbn):
            s = np.float64(scales3[b, ib, jb]) * glob
            cs = crow[jb * bn : min(jb * bn + bn, N)]
            os_ = orow[jb * bn : min(jb * bn + bn, N)]
            for j in range(cs.size):
                os_[j] = np.float64(table[cs[j]]) * s


def _cast_once(v: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """float64 ``v`` rounded once (to nearest even) to ``dtype``: numpy's float16/float32 casts do that;
    ml_dtypes' casts from float64 go through float32 (rounding twice), so ml_dtypes targets are rounded
    by fp8sim's kernel to their format and then converted exactly."""
    if dtype.kind == "f":
        return v.astype(dtype)
    fmt = next((f for f in CATALOGUE.values() if f.ml_dtype is not None and np.dtype(f.ml_dtype) == dtype), None)
    if fmt is None:
        raise TypeError(
            f"dequantize: dtype must be a float dtype (float64, float32, float16) or an ml_dtypes float type "
            f"of a catalogue format (e.g. bfloat16), got {dtype}"
        )
    from .rounding import round as _round

    return _round(v, fmt).astype(dtype)  # exact: the values are already values of fmt


# =====================================================================
# QuantizedTensor
# =====================================================================
_MODE_NAME = {v: k for k, v in MODES.items()}  # kernel mode id -> canonical name


@dataclass(frozen=True, eq=False)
class QuantizedTensor:
    """A tensor quantized with block scales.

    ``x ~= decode(codes) * expand(scales) * global_scale`` where ``expand``
    repeats each scale over its block (``block_shape``; ragged edges are
    smaller blocks).  A GEMM consumes ``codes`` and ``scales`` directly:
    for ``A (M, K)`` quantized ``"1x128"``, ``scales`` is ``(M, ceil(K/128))``
    and ``A[m, k] ~= decode(codes[m, k]) * scales[m, k // 128]``; for
    ``W (N, K)`` quantized ``"128x128"``, ``scales`` is
    ``(ceil(N/128), ceil(K/128))`` and ``W[n, k] ~= decode(codes[n, k]) *
    scales[n // 128, k // 128]``.

    Attributes
    ----------
    codes : uint8 (the element format's code dtype) array of ``shape``
    scales : float32 array of :meth:`Granularity.scale_shape`; dequantization scales
    format : element :class:`~fp8sim.Format`
    granularity : :class:`Granularity`
    shape, dtype : the original array's shape and dtype
    scale_format, scale_rounding : the scale policy used (``"e4m3"``/None for NVFP4)
    global_scale : float (1.0 except NVFP4)
    amax : float32 array (scales' shape) of the amax measured on ``x`` per block
        (for NVFP4 the block amaxes; for delayed scaling the current tensor's amax)
    block_shape : per-axis block extent
    mode : the element rounding mode the codes were made with (its canonical name); the metrics'
        saturation counts depend on it
    """

    codes: np.ndarray
    scales: np.ndarray
    format: Format
    granularity: Granularity
    shape: tuple
    dtype: np.dtype
    scale_format: str
    scale_rounding: str | None
    global_scale: float
    amax: np.ndarray
    block_shape: tuple
    mode: str = "rne"
    _view: tuple | None = field(repr=False, default=None)

    @property
    def scale_codes(self) -> np.ndarray | None:
        """E8M0 codes (MX) or E4M3 codes (NVFP4) of the scales; None for fp32/bf16/pow2 scales."""
        from .rounding import encode

        if self.scale_format == "e8m0":
            return encode(self.scales.astype(np.float64), "e8m0")
        if self.scale_format == "e4m3":
            return encode(self.scales.astype(np.float64), "e4m3")
        return None

    def values(self) -> np.ndarray:
        """The element values ``decode(codes)`` (float32, before scaling)."""
        from .rounding import decode

        return decode(self.codes, self.format)

    def expanded_scales(self) -> np.ndarray:
        """float64 array of ``shape``: each element's ``scale * global_scale``."""
        s = self.scales.astype(np.float64)
        for d, b in enumerate(self.block_shape):
            s = np.repeat(s, b, axis=d)
        s = s[tuple(slice(0, n) for n in self.shape)]
        return s * self.global_scale

    def dequantize(self, dtype=None) -> np.ndarray:
        """``decode(codes) * scale * global_scale``, computed exactly in float64 then rounded
        once (to nearest even) to ``dtype`` (default: the original dtype): a float dtype or an
        ml_dtypes type of a catalogue format such as bfloat16 (which is rounded by fp8sim, not by
        ml_dtypes' cast, which goes through float32); other dtypes raise TypeError."""
        dtype = np.dtype(self.dtype if dtype is None else dtype)
        B, M, N, bm, bn = self._view if self._view is not None else _view_of(self.granularity, self.shape)
        table = decode_table(self.format)
        out = np.empty((B, M, N), dtype=np.float64)
        _dequant(
            self.codes.reshape(B, M, N),
            table,
            self.scales.reshape(B, -(-M // bm), -(-N // bn)),
            bm,
            bn,
            float(self.global_scale),
            out,
        )
        return _cast_once(out.reshape(self.shape), dtype)

    @property
    def nbytes(self) -> int:
        """Storage of codes plus scales (1 byte per E8M0/E4M3 scale, 2 per bf16, else 4)."""
        per = {"e8m0": 1, "e4m3": 1, "bf16": 2}.get(self.scale_format, 4)
        return int(self.codes.nbytes + self.scales.size * per)

    def __repr__(self) -> str:
        return (
            f"QuantizedTensor(shape={self.shape}, dtype={self.dtype}, format={self.format.name}, "
            f"granularity={self.granularity.name}, scales={self.scales.shape} {self.scale_format}"
            f"{'' if self.scale_rounding is None else '/' + self.scale_rounding})"
        )


# =====================================================================
# quantize
# =====================================================================
def _input(x) -> tuple[np.ndarray, np.dtype]:
    # the rule of fp8sim._inputs: float32/float64 as they are, float16/bfloat16 exactly to float32
    arr, dt = float_input(x, "fp8sim.quantize")
    if arr.ndim == 0:
        raise ValueError("quantize: x must have at least 1 dimension, got a scalar")
    return np.ascontiguousarray(arr), dt


def _policy(g: Granularity, fmt: Format, scale_format, scale_rounding, margin):
    if isinstance(margin, (bool, np.bool_)) or not isinstance(margin, (int, np.integer)):
        raise TypeError(f"margin must be an int (a number of binades), got {margin!r}")
    margin = int(margin)
    if isinstance(g, NVFP4):
        if scale_format not in (None, "e4m3"):
            raise ValueError(
                f"nvfp4 scales are E4M3 block scales times an FP32 tensor scale; "
                f"scale_format must be None or 'e4m3', got {scale_format!r}"
            )
        if scale_rounding is not None:
            raise ValueError("nvfp4 block scales are rounded to nearest (satfinite); scale_rounding must be None")
        sf, sr = "e4m3", None
    else:
        sf = g.default_scale_format if scale_format is None else scale_format
        if not isinstance(sf, str) or sf.lower() not in SCALE_FORMATS:
            raise ValueError(f"unknown scale_format {scale_format!r}; known: {', '.join(SCALE_FORMATS)}")
        sf = sf.lower()
        if isinstance(g, MX) and sf != "e8m0":
            raise ValueError(
                f"MX blocks use E8M0 scales (scale_format='e8m0'), got {sf!r}; "
                f"use Group({g.size}) / 'g{g.size}' for other scale formats"
            )
        if sf == "fp32":
            if scale_rounding is not None:
                raise ValueError(
                    "scale_rounding applies to bf16, pow2 and e8m0 scales; fp32 scales are "
                    "amax/max rounded to nearest float32 -- pass scale_rounding=None"
                )
            sr = None
        else:
            default = "floor" if isinstance(g, MX) else ("ceil" if sf == "bf16" else "rceil")
            sr = default if scale_rounding is None else scale_rounding
            if not isinstance(sr, str) or sr.lower() not in SCALE_ROUNDINGS:
                raise ValueError(f"unknown scale_rounding {scale_rounding!r}; known: {', '.join(SCALE_ROUNDINGS)}")
            sr = sr.lower()
    kind = _KIND[sf]
    rnd = _ROUNDING.get(sr or "", 0)
    # 2**margin must be a normal value of the scale format (for nvfp4: of the float32 tensor scale)
    m_lo, m_hi = (-127, 127) if kind == _E8M0 else (-126, 127)
    if not m_lo <= margin <= m_hi:
        raise ValueError(
            f"margin must be an int in {m_lo}..{m_hi} for {'nvfp4 (float32 tensor scale)' if kind == _E4M3 else sf} "
            f"scales (2**margin a normal scale), got {margin}"
        )
    if kind == _BF16:
        smin, smax, emin_s, emax_s = 2.0**-126, BF16.max, -126, 127
    elif kind == _E4M3:
        smin, smax, emin_s, emax_s = E4M3.min_subnormal, E4M3.max, -9, 8
    else:
        if kind == _E8M0:
            smin, smax, emin_s, emax_s = 2.0**-127, 2.0**127, -127, 127
        else:
            smin, smax, emin_s, emax_s = 2.0**-126, (_FLT_MAX if kind == _FP32 else 2.0**127), -126, 127
    sp = (
        np.int64(kind),
        np.int64(rnd),
        np.float64(fmt.max),
        np.int64(fmt.emax),
        np.int64(fmt.mbits),
        np.int64(margin),
        np.float64(smin),
        np.float64(smax),
        np.int64(emin_s),
        np.int64(emax_s),
    )
    return sf, sr, sp


def _finish_scales(s: np.ndarray, sf: str, sr, amax: np.ndarray | None) -> np.ndarray:
    """Round the ratios of bf16 / e4m3 scale policies to their format (other policies are final)."""
    from .rounding import round as _round

    if sf == "bf16":
        mode = {"floor": "rdn", "ceil": "rup", "rceil": "rup", "even": "rne"}[sr]
        s32 = s.astype(np.float32)  # the float32 scale amax/max (correctly rounded)
        r = _round(s32.astype(np.float64), BF16, mode, saturate=True)
        return np.where(np.isnan(r), r, np.clip(r, 2.0**-126, BF16.max))
    if sf == "e4m3":  # NVFP4 block scales: RNE satfinite; a nonzero block never gets scale 0
        r = _round(s, E4M3, "rne", saturate=True)
        return np.where(r == 0, E4M3.min_subnormal, r)
    return s


def quantize(
    x,
    fmt,
    granularity="tensor",
    *,
    scale_format=None,
    scale_rounding=None,
    mode="rne",
    saturate=True,
    margin=0,
    amax=None,
    seed=None,
    ignore_nan=False,
) -> QuantizedTensor:
    """Quantize ``x`` to ``fmt`` with block scales.

    Parameters
    ----------
    x : float32, float64, float16 or ml_dtypes.bfloat16 array of 1 or more dims (float16 and
        bfloat16 are converted to float32 exactly; other dtypes raise TypeError)
        (dimensions before the last two are batch dimensions)
    fmt : element format (``"e4m3"``, ``"e5m2"``, ``"e2m1"``, ``"e5m6"``, a custom
        :class:`~fp8sim.Format`, ...): signed, with zero, at most 16 bits (codes are uint8 for
        formats of up to 8 bits, uint16 for wider ones such as E5M6)
    granularity : a :class:`Granularity` or its name: ``"tensor"``, ``"row"``,
        ``"col"``, ``"1x128"``, ``"128x128"``, ``"g32"``, ``"mx32"``,
        ``"nvfp4"``, ``"delayed"`` (see the module docstring for layouts)
    scale_format : ``"fp32"``, ``"bf16"``, ``"pow2"`` or ``"e8m0"``; None
        picks the granularity's own (e8m0 for MX, E4M3xFP32 for NVFP4, else fp32)
    scale_rounding : ``"floor"``, ``"ceil"``, ``"rceil"`` or ``"even"`` for
        bf16/pow2/e8m0 scales; None picks floor for MX, ceil for bf16, rceil
        otherwise; must be None for fp32 scales
    mode : element rounding mode (as :func:`fp8sim.round`; ``"sr"`` needs ``seed``)
    saturate : clamp overflow and +-inf to +-max (default True)
    margin : int; scales are multiplied by ``2**margin`` (-126..127, -127..127 for e8m0
        scales: 2**margin a normal scale; other values raise ValueError)
    amax : optional amax to use instead of measuring ``x``: a scalar or an
        array broadcastable to the scales' shape (for NVFP4: the tensor amax)
    seed : int or numpy Generator for stochastic rounding
    ignore_nan : skip NaN when measuring amax (default: a NaN makes its block NaN)

    Returns
    -------
    :class:`QuantizedTensor` with ``x ~= decode(codes) * scales (expanded) * global_scale``.
    """
    saturate = flag(saturate, "fp8sim.quantize", "saturate")
    ignore_nan = flag(ignore_nan, "fp8sim.quantize", "ignore_nan")
    g = _as_granularity(granularity)
    fmt = _lookup_format(fmt)
    if fmt.bits > 16:
        raise ValueError(
            f"quantize: element format must have at most 16 bits (codes are uint8 or uint16), "
            f"got {fmt.name} ({fmt.bits} bits)"
        )
    if not fmt.signed or not fmt.subnormals:
        raise ValueError(f"quantize: element format must be signed with zero, got {fmt.name}")
    m = _mode(mode)
    key = _sr_key(seed) if m == K.SR else np.uint64(0)
    xc, orig_dtype = _input(x)
    if xc.ndim == 0:
        raise ValueError("quantize: x must have at least 1 dimension, got a scalar")
    if xc.size == 0:
        raise ValueError(f"quantize: x is empty (shape {xc.shape})")
    shape = tuple(xc.shape)
    B, M, N, bm, bn = _view_of(g, shape)
    nbm, nbn = -(-M // bm), -(-N // bn)
    sf, sr, sp = _policy(g, fmt, scale_format, scale_rounding, margin)
    p = _params(fmt, m, bool(saturate), False, 52)[1]
    scale_from_x = not (ignore_nan or amax is not None or isinstance(g, DelayedScaling))
    if fmt.nan is NanStyle.NONE and not scale_from_x and np.isnan(xc).any():
        raise ValueError(
            f"format {fmt.name} has no NaN: NaN elements cannot be encoded "
            "(with ignore_nan=False and a measured amax a NaN makes its whole block's scale NaN instead)"
        )
    mode_arg = np.int64(m)
    fast = _fast_params(fmt, bool(saturate)) if xc.dtype == np.float32 and m == K.RNE else None
    use_fast = fast is not None
    fp = fast if fast is not None else _NO_FAST
    # (the table path re-rounds float32 quotients to odd, on the float32 subnormal grid 2**-149 at worst:
    # the format's finest spacing must be 2**-147 or coarser for that to round once)
    use_tab = bool(
        xc.dtype == np.float32
        and m != K.SR
        and fmt.mbits <= 6
        and float32_kernel_ok(fmt)
        and fmt.emin - fmt.mbits >= -147
        and not use_fast
    )
    tab = _memo_table(fmt, m, p, True) if use_tab else _NO_TABLE
    x3 = xc.reshape(B, M, N)
    codes = _buffers.empty((B, M, N), fmt.code_dtype)  # large ones are reused once dropped (see _buffers)
    glob = 1.0

    if isinstance(g, NVFP4):
        if amax is None:
            t_amax = _measure(x3, B * M * N, N, ignore_nan, whole=True)
        else:
            t_amax = float(np.asarray(amax, dtype=np.float64).reshape(-1)[0]) if np.size(amax) == 1 else None
            if t_amax is None:
                raise ValueError("nvfp4: amax must be a scalar (the tensor amax)")
        glob = float(np.float32(t_amax / (fmt.max * E4M3.max) * 2.0 ** int(margin))) if t_amax == t_amax else np.nan
        glob = min(max(glob, 2.0**-126), _FLT_MAX) if glob == glob else glob
        sp = sp[:5] + (np.int64(0),) + sp[6:]  # margin went into the tensor scale
    if isinstance(g, DelayedScaling):
        if amax is not None:
            raise ValueError("delayed scaling takes its amax from its history; do not pass amax")
        cur = _measure(x3, B * M * N, N, ignore_nan, whole=True)
        h = g.history_amax()
        if h > 0 and np.isfinite(h):
            s = np.empty(1, dtype=np.float64)
            _scales_from_amax(np.array([h]), 1.0, sp, s)
            s = _finish_scales(s, sf, sr, None)
            scales3 = s.astype(np.float32).reshape(1, 1, 1)
        else:
            scales3 = np.ones((1, 1, 1), dtype=np.float32)
        _apply(x3, _bits(x3), scales3, bm, bn, 1.0, mode_arg, p, key, tab, use_tab, fp, use_fast, sp, codes)
        amax3: np.ndarray = np.full((1, 1, 1), cur, dtype=np.float32)
        g.record(cur)
    elif amax is None and bn > 1 and B * nbm >= 4 and sf not in ("bf16", "e4m3") and not isinstance(g, NVFP4):
        scales3 = np.empty((B, nbm, nbn), dtype=np.float32)  # float32 values, as in the row case
        amax3 = np.empty((B, nbm, nbn), dtype=np.float32)
        args = (x3, _bits(x3), bm, bn, mode_arg, p, key, sp, glob, bool(ignore_nan), tab, use_tab, fp, use_fast)
        if bm > 1 and xc.dtype == np.float32:
            _fused_bands32(*args, codes, scales3, amax3, numba.get_num_threads())
        else:
            _fused(*args, codes, scales3, amax3)
    else:
        if amax is None:
            amax3 = _block_amax(x3, bm, bn, bool(ignore_nan))
        else:
            a = np.asarray(amax, dtype=np.float64)
            sshape = g.scale_shape(shape) if not isinstance(g, NVFP4) else None
            if isinstance(g, NVFP4):
                amax3 = _block_amax(x3, bm, bn, bool(ignore_nan))
            else:
                assert sshape is not None
                try:
                    a = np.broadcast_to(a, sshape)
                except ValueError:
                    raise ValueError(
                        f"amax of shape {a.shape} does not broadcast to the scales' shape {sshape}"
                    ) from None
                if (a < 0).any():
                    raise ValueError("amax must be non-negative")
                amax3 = np.ascontiguousarray(a).reshape(B, nbm, nbn)
        s = np.empty(amax3.size, dtype=np.float64)
        _scales_from_amax(np.ascontiguousarray(amax3, dtype=np.float64).reshape(-1), glob, sp, s)
        s = _finish_scales(s, sf, sr, None)
        scales3 = s.astype(np.float32).reshape(B, nbm, nbn)
        _apply(x3, _bits(x3), scales3, bm, bn, glob, mode_arg, p, key, tab, use_tab, fp, use_fast, sp, codes)
        amax3 = np.asarray(amax3, dtype=np.float32)
    sshape = g.scale_shape(shape)
    return QuantizedTensor(
        codes=codes.reshape(shape),
        scales=scales3.reshape(sshape),
        format=fmt,
        granularity=g,
        shape=shape,
        dtype=orig_dtype,
        scale_format=sf,
        scale_rounding=sr,
        global_scale=float(glob),
        amax=amax3.reshape(sshape),
        block_shape=g.block_shape(shape),
        mode=_MODE_NAME[_mode(mode)],
        _view=(B, M, N, bm, bn),
    )


def _view_of(g: Granularity, shape: tuple) -> tuple:
    """(B, M, N, bm, bn): the batch/matrix view of ``shape`` and the block extent, as quantize uses it."""
    B, M, N, bm, bn, _ax = g._view(tuple(shape))
    return B, M, N, max(1, min(bm, M)), max(1, min(bn, N))


def _bits(a):
    return a.view(np.int32 if a.dtype == np.float32 else np.int64)


def _block_amax(x3, bm, bn, ignore_nan):
    B, M, N = x3.shape
    nbm, nbn = -(-M // bm), -(-N // bn)
    if bn == 1 and bm > 1:
        out = np.empty((B, nbm, N), dtype=np.float64)
        _amax_cols(x3, bm, ignore_nan, out)
        return out
    part = np.empty((B * M, nbn), dtype=np.float64)
    _amax_rows(_bits(x3.reshape(B * M, N)), bn, ignore_nan, part)
    part = part.reshape(B, M, nbn)
    if bm == 1:
        return part
    return np.maximum.reduceat(part, np.arange(0, M, bm), axis=1)  # NaN propagates


def _measure(x3, size, N, ignore_nan, whole):
    """amax of the whole tensor (NaN if any NaN unless ignore_nan; inf skipped)."""
    B, M, N = x3.shape
    x2 = x3.reshape(B * M, N)
    if B * M == 1 and N >= 4096:  # one long row: split it so both cores work
        cols = 1024
        n = (N // cols) * cols
        parts = [_measure(x2[:, :n].reshape(1, -1, cols), 0, cols, ignore_nan, True)]
        if n < N:
            parts.append(_measure(x2[:, n:].reshape(1, 1, -1), 0, N - n, ignore_nan, True))
        return float(np.max(parts))
    part = np.empty((B * M, 1), dtype=np.float64)
    _amax_rows(_bits(x2), N, ignore_nan, part)
    return float(np.max(part))


def dequantize(q: QuantizedTensor, dtype=None) -> np.ndarray:
    """``q.dequantize(dtype)``: ``decode(codes) * scales * global_scale`` in ``q.dtype`` (or ``dtype``)."""
    if not isinstance(q, QuantizedTensor):
        raise TypeError(f"dequantize expects a QuantizedTensor, got {type(q).__name__}")
    return q.dequantize(dtype)
