"""Granularities: how a tensor is cut into blocks that share one scale, and the names they go by.

Each :class:`Granularity` gives the block extent along every axis of ``x`` (:meth:`~Granularity.block_shape`),
the shape of its ``scales`` (:meth:`~Granularity.scale_shape`) and the canonical ``(B, M, N)`` view with
blocks ``(bm, bn)`` that the kernels work on (:func:`view_of`).  :func:`fp8sim.scaling.names.granularity` parses the
short names (``"tensor"``, ``"1x128"``, ``"mx32"``, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np

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
    "AmaxHistory",
    "view_of",
]

_PROBE = 1 << 30  # an axis longer than any block: what block_shape gives along it is "all of the axis"


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

    Subclasses (frozen dataclasses) define ``name`` and :meth:`block_shape` (block extents per
    axis of ``x``; the built-ins define the canonical 3-D view ``(B, M, N)`` with blocks
    ``(bm, bn)`` the kernels work on, ``_view``, instead).  The other methods say how the
    granularity behaves in a GEMM, in training and in the scale policy; their defaults fit a
    one-level granularity with blocks inside each matrix, and the built-ins override them.
    :func:`register_granularity` gives a new one a name.
    """

    @property
    def name(self) -> str:  # pragma: no cover - overridden
        raise NotImplementedError

    def __str__(self) -> str:
        return self.name

    #: scale format and rounding used when quantize() is given None
    default_scale_format = "fp32"

    def _view(self, shape: tuple) -> tuple:
        """``(B, M, N, bm, bn, axis)``: the kernels' view.  Default, from :meth:`block_shape`:
        blocks of ``(bm, bn)`` within each matrix of the last two axes (a new granularity need only
        define :meth:`block_shape`)."""
        if type(self).block_shape is Granularity.block_shape:
            raise NotImplementedError(f"{type(self).__name__} defines neither block_shape() nor _view()")
        blk = tuple(int(b) for b in self.block_shape(shape))
        if len(blk) != len(shape) or any(b != 1 for b in blk[:-2]):
            raise ValueError(f"{self.name}: blocks {blk} of shape {shape} must lie within the last two axes")
        B, M, N = _matrix_view(shape)
        return B, M, N, (blk[-2] if len(shape) >= 2 else 1), blk[-1], None

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

    # ---- behaviour the rest of fp8sim asks of a granularity (override where the defaults do not fit)

    #: the scale comes from state the object carries (delayed scaling's amax history), not from ``x``;
    #: such a granularity must be passed as the object (its name would make a fresh, empty state)
    stateful: ClassVar[bool] = False
    #: two-level scales: block scales times a per-tensor scale (NVFP4)
    two_level: ClassVar[bool] = False
    #: the granularity fixes its scale format: a recipe's ``scale_format`` is not passed to it (MX: E8M0)
    own_scale_format: ClassVar[bool] = False

    def transposed(self) -> Granularity:
        """The granularity of the transpose of a 2-D tensor: the same blocks, axes swapped.

        Default: ``self`` where a block is square on a large square probe (one scale for the tensor,
        square tiles); otherwise NotImplementedError (a granularity with oblong blocks must say how
        it transposes)."""
        a, b = self.block_shape((_PROBE, _PROBE))[-2:]
        if a == b:
            return self
        raise NotImplementedError(f"{type(self).__name__} ({self.name}) does not define transposed()")

    @property
    def same_when_transposed(self) -> bool:
        """True when the tensor and its transpose get the same blocks (per tensor, square tiles)."""
        try:
            return self.transposed() == self
        except (ValueError, NotImplementedError):
            return False

    def k_block(self, who: str = "fp8sim.Recipe", which: str = "granularity") -> int | None:
        """The extent along K of one scale block of this recipe granularity (spelled for an operand
        whose last axis is K: ``x (M, K)``, ``w (N, K)``); None for one block over all of K.  Raises
        ValueError (TypeError) naming ``who`` and ``which`` where a GEMM cannot apply it.

        Default: the block extent along the last axis of a large probe tensor."""
        try:
            b = int(self.block_shape((_PROBE, _PROBE))[-1])
        except NotImplementedError:
            raise TypeError(f"{who}: {which} {self!r} is not a granularity the GEMM knows") from None
        return None if b >= _PROBE else b

    def block_extent(self, axis: int) -> int | None:
        """The extent along ``axis`` (0 or 1) of a 2-D tensor of one block, not clamped to the
        tensor (32 for ``"mx32"`` along its axis); None where the block spans what the tensor's shape
        gives (:meth:`block_shape`)."""
        return None

    @property
    def mma_block_scale(self) -> tuple[str, int] | None:
        """``(scale kind, block size)`` where a block-scaled MMA folds this recipe granularity's
        scales in (``("ue8m0", 32)`` for ``"mx32"``, ``("ue4m3", 16)`` for ``"nvfp4"``, blocks
        along K); None for granularities no block-scaled MMA takes."""
        return None

    @property
    def device_quantizable(self) -> bool:
        """True where the GPU quantizer of :mod:`fp8sim.gemms.device` applies (one-level scales
        from the tensor itself)."""
        return not (self.stateful or self.two_level)

    def grouped(self, size: int) -> Granularity:
        """Groups of ``size`` along the last axis with this granularity's kind of scale
        (:class:`MX` for MX, else :class:`Group`)."""
        return Group(size)

    # a stateful granularity (``stateful = True``) keeps an amax history: quantize() takes the
    # scale from history_amax() and then record()s the tensor's amax
    def history_amax(self) -> float:
        """The amax the next quantize() uses (stateful granularities only)."""
        raise TypeError(f"granularity {self.name} keeps no amax history")

    def record(self, amax: float) -> None:
        """Record a tensor's amax in the history (stateful granularities only)."""
        raise TypeError(f"granularity {self.name} keeps no amax history")

    # scale-policy hooks (fp8sim.scaling.policy.scale_policy)
    def fixed_scale(self, scale_format, scale_rounding) -> tuple[str, str | None] | None:
        """``(scale_format, scale_rounding)`` where the granularity fixes them (checking the given
        ones), None where the caller's (or the defaults) apply."""
        return None

    def check_scale_format(self, scale_format: str) -> None:
        """Raise ValueError where this granularity cannot use the (canonical) ``scale_format``."""

    def default_scale_rounding(self, scale_format: str) -> str:
        """The scale rounding used for ``scale_format`` when none is given (not fp32)."""
        return "ceil" if scale_format == "bf16" else "rceil"


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

    def transposed(self) -> Granularity:
        return self

    def k_block(self, who: str = "fp8sim.Recipe", which: str = "granularity") -> int | None:
        return None


@dataclass(frozen=True)
class PerRow(Granularity):
    """One scale per row (per token): ``scales.shape == x.shape[:-1] + (1,)``."""

    @property
    def name(self) -> str:
        return "row"

    def _view(self, shape):
        return 1, _prod(shape[:-1]), shape[-1], 1, shape[-1], None

    def transposed(self) -> Granularity:
        return PerColumn()

    def k_block(self, who: str = "fp8sim.Recipe", which: str = "granularity") -> int | None:
        return None


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

    def transposed(self) -> Granularity:
        return PerRow()

    def k_block(self, who: str = "fp8sim.Recipe", which: str = "granularity") -> int | None:
        raise ValueError(
            f"{who}: {which} 'col' gives every K element its own scale, which a GEMM cannot apply "
            "(recipe granularities are spelled for an operand whose last axis is K: x (M, K), "
            "w (N, K); 'row' is one scale per token / output channel)"
        )


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

    def transposed(self) -> Granularity:
        return Tile(self.cols, self.rows)

    def k_block(self, who: str = "fp8sim.Recipe", which: str = "granularity") -> int | None:
        return self.cols

    def block_extent(self, axis: int) -> int | None:
        return int(self.cols if axis == 1 else self.rows)


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

    def transposed(self) -> Granularity:
        if self.axis not in (-2, -1, 0, 1):
            raise ValueError(f"transpose_granularity: {self.name} has axis {self.axis}, not an axis of a 2-D tensor")
        return replace(self, axis=0 if self.axis in (-1, 1) else -1)

    def k_block(self, who: str = "fp8sim.Recipe", which: str = "granularity") -> int | None:
        if self.axis in (-1, 1):
            return self.size
        raise ValueError(
            f"{who}: {which} {self.name} runs along axis {self.axis}; a recipe granularity is spelled for "
            f"an operand whose last axis is K (x (M, K), w (N, K)), so groups run along axis -1"
        )

    def block_extent(self, axis: int) -> int | None:
        return int(self.size) if self.axis % 2 == axis else None


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

    own_scale_format = True

    @property
    def mma_block_scale(self) -> tuple[str, int] | None:
        return ("ue8m0", self.size) if self.axis in (-1, 1) else None

    def grouped(self, size: int) -> Granularity:
        return MX(size)

    def check_scale_format(self, scale_format: str) -> None:
        if scale_format != "e8m0":
            raise ValueError(
                f"MX blocks use E8M0 scales (scale_format='e8m0'), got {scale_format!r}; "
                f"use Group({self.size}) / 'g{self.size}' for other scale formats"
            )

    def default_scale_rounding(self, scale_format: str) -> str:
        return "floor"


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

    two_level = True

    @property
    def mma_block_scale(self) -> tuple[str, int] | None:
        return ("ue4m3", self.size) if self.axis in (-1, 1) else None

    def k_block(self, who: str = "fp8sim.Recipe", which: str = "granularity") -> int | None:
        raise ValueError(
            f"{who}: {which} {self.name}: two-level (NVFP4) scales are not supported by the FP8 GEMM "
            "(use 'mx32', 'g128', '1x128', 'tensor', ...)"
        )

    def fixed_scale(self, scale_format, scale_rounding) -> tuple[str, str | None] | None:
        if scale_format not in (None, "e4m3"):
            raise ValueError(
                f"nvfp4 scales are E4M3 block scales times an FP32 tensor scale; "
                f"scale_format must be None or 'e4m3', got {scale_format!r}"
            )
        if scale_rounding is not None:
            raise ValueError("nvfp4 block scales are rounded to nearest (satfinite); scale_rounding must be None")
        return "e4m3", None


class AmaxHistory:
    """The state of :class:`DelayedScaling`: a rolling window of amaxes, newest first (like
    TransformerEngine's ``fp8_meta`` amax history).  ``values`` is a float64 array of the window's
    length; :meth:`record` pushes an amax in."""

    __slots__ = ("values",)

    def __init__(self, history_len: int, amax_history=None):
        buf = np.zeros(_positive_int(history_len, "DelayedScaling history_len"), dtype=np.float64)
        if amax_history is not None:
            h = np.asarray(amax_history, dtype=np.float64).reshape(-1)[: buf.size]
            if not (np.isfinite(h) & (h >= 0)).all():
                raise ValueError("amax_history must hold finite, non-negative values")
            buf[: h.size] = h
        self.values = buf

    def __repr__(self) -> str:
        return f"AmaxHistory({self.values.tolist()!r})"

    def amax(self, algo: str) -> float:
        """The amax of the window: its maximum (``algo="max"``) or newest entry (``"most_recent"``)."""
        h = self.values
        return float(np.max(h)) if algo == "max" else float(h[0])

    def record(self, amax: float) -> None:
        """Push ``amax`` into the window (newest first); non-finite values are skipped, as TE does."""
        if np.isfinite(amax):
            self.values = np.roll(self.values, 1)
            self.values[0] = amax


@dataclass(frozen=True, init=False, eq=False, repr=False)
class DelayedScaling(Granularity):
    """Per-tensor delayed scaling (TransformerEngine style).

    The scale is computed from an **amax history** of the previous tensors,
    not from the tensor being quantized: ``amax = max(history)``
    (``algo="max"``) or the most recent entry (``algo="most_recent"``).
    While the history holds no positive amax the scale is 1.0 (TE's initial
    scale).  Each :func:`quantize` call then records the current tensor's
    amax in the history (a rolling window of ``history_len`` entries, newest
    first).  The configuration (``history_len``, ``algo``) is frozen; the history is the
    :class:`AmaxHistory` in ``state`` (``amax_history`` reads it), so every object is its own
    state: objects compare by identity, and ``copy.deepcopy`` gives an independent history.
    ``scales.shape == (1,) * x.ndim``; values above ``fmt.max * scale``
    saturate (``saturate=True``) -- see ``metrics.fraction_saturated``.
    """

    history_len: int
    algo: str
    state: AmaxHistory

    stateful = True

    def __init__(
        self, history_len: int = 16, algo: str = "max", amax_history=None, *, state: AmaxHistory | None = None
    ):
        history_len = _positive_int(history_len, "DelayedScaling history_len")
        if algo not in ("max", "most_recent"):
            raise ValueError(f"DelayedScaling algo must be 'max' or 'most_recent', got {algo!r}")
        if state is None:
            state = AmaxHistory(history_len, amax_history)
        elif amax_history is not None or not isinstance(state, AmaxHistory) or state.values.size != history_len:
            raise ValueError("DelayedScaling: give amax_history or an AmaxHistory state of history_len entries")
        object.__setattr__(self, "history_len", history_len)
        object.__setattr__(self, "algo", algo)
        object.__setattr__(self, "state", state)

    __eq__ = object.__eq__
    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"DelayedScaling(history_len={self.history_len}, algo={self.algo!r}, amax={self.history_amax()})"

    @property
    def name(self) -> str:
        return f"delayed{self.history_len}"

    def _view(self, shape):
        return PerTensor()._view(shape)

    def transposed(self) -> Granularity:
        return self  # one scale, and the same state

    def k_block(self, who: str = "fp8sim.Recipe", which: str = "granularity") -> int | None:
        return None

    @property
    def amax_history(self) -> np.ndarray:
        """The amax history (float64, ``history_len`` entries, newest first): ``state.values``."""
        return self.state.values

    def history_amax(self) -> float:
        """The amax the next quantize() will use (0.0 while the history is empty)."""
        return self.state.amax(self.algo)

    def record(self, amax: float) -> None:
        """Push ``amax`` into the history (newest first); non-finite values are skipped, as TE does."""
        self.state.record(amax)


def view_of(g: Granularity, shape: tuple) -> tuple:
    """``(B, M, N, bm, bn)``: the batch/matrix view of ``shape`` under ``g`` and its block extent, as the
    kernels (and :func:`~fp8sim.scaling.quantize`) use it."""
    B, M, N, bm, bn, _ax = g._view(tuple(shape))
    return B, M, N, max(1, min(bm, M)), max(1, min(bn, N))
