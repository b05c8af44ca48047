"""Granularities: how a tensor is cut into blocks that share one scale, and the names they go by.

Each :class:`Granularity` gives the block extent along every axis of ``x`` (:meth:`~Granularity.block_shape`),
the shape of its ``scales`` (:meth:`~Granularity.scale_shape`) and the canonical ``(B, M, N)`` view with
blocks ``(bm, bn)`` that the kernels work on (:func:`view_of`).  :func:`granularity` parses the short names
(``"tensor"``, ``"1x128"``, ``"mx32"``, ...).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from .._names import unknown_name_error

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
    "granularity",
    "granularity_names",
    "view_of",
]


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

    ``global_scale = amax(x) * 2**margin / (fmt.max * 448)`` (float32; NaN elements are skipped in
    ``amax(x)``, so a NaN makes only its block's scale NaN);
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
    examples = ("tensor", "row", "col", "1x128", "128x128", "g32", "mx32", "nvfp4", "delayed")
    raise unknown_name_error("granularity", g, granularity_names(), candidates=examples, plural="granularities")


def view_of(g: Granularity, shape: tuple) -> tuple:
    """``(B, M, N, bm, bn)``: the batch/matrix view of ``shape`` under ``g`` and its block extent, as the
    kernels (and :func:`~fp8sim.scaling.quantize`) use it."""
    B, M, N, bm, bn, _ax = g._view(tuple(shape))
    return B, M, N, max(1, min(bm, M)), max(1, min(bn, N))
