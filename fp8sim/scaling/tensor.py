"""The result of quantization: :class:`QuantizedTensor` (codes, block scales and how they were made) and
:func:`dequantize`."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .._fpenv import ieee_defaults
from ..formats import CATALOGUE, Format
from ..rounding import cast, decode, decode_table, encode
from ._kernels import dequant
from .granularities import Granularity, view_of

__all__ = ["QuantizedTensor", "dequantize"]


def _cast_once(v: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """float64 ``v`` rounded once (to nearest even) to ``dtype``: numpy's float16/float32 casts do that;
    ml_dtypes' casts from float64 go through float32 before ml_dtypes 0.7 (rounding twice), so ml_dtypes
    targets are rounded by fp8sim's kernel to their format and then converted exactly."""
    if dtype.kind == "f":
        with np.errstate(over="ignore"):  # beyond the target's range: +-inf, as the IEEE cast gives it
            return v.astype(dtype)
    fmt = next((f for f in CATALOGUE.values() if f.ml_dtype is not None and np.dtype(f.ml_dtype) == dtype), None)
    if fmt is None:
        raise TypeError(
            f"dequantize: dtype must be a float dtype (float64, float32, float16) or an ml_dtypes float type "
            f"of a catalogue format (e.g. bfloat16), got {dtype}"
        )
    return cast(v, fmt).astype(dtype)  # exact: the values are already values of fmt


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
        if self.scale_format == "e8m0":
            return encode(self.scales.astype(np.float64), "e8m0")
        if self.scale_format == "e4m3":
            return encode(self.scales.astype(np.float64), "e4m3")
        return None

    @ieee_defaults
    def values(self) -> np.ndarray:
        """The element values ``decode(codes)`` (float32, before scaling)."""
        return decode(self.codes, self.format)

    @ieee_defaults
    def expanded_scales(self) -> np.ndarray:
        """float64 array of ``shape``: each element's ``scale * global_scale``."""
        s = self.scales.astype(np.float64)
        for d, b in enumerate(self.block_shape):
            s = np.repeat(s, b, axis=d)
        s = s[tuple(slice(0, n) for n in self.shape)]
        return s * self.global_scale

    @ieee_defaults
    def dequantize(self, dtype=None) -> np.ndarray:
        """``decode(codes) * scale * global_scale``, computed exactly in float64 then rounded
        once (to nearest even) to ``dtype`` (default: the original dtype): a float dtype or an
        ml_dtypes type of a catalogue format such as bfloat16 (which is rounded by fp8sim, not by
        ml_dtypes' cast, which goes through float32 before ml_dtypes 0.7); other dtypes raise TypeError."""
        dtype = np.dtype(self.dtype if dtype is None else dtype)
        B, M, N, bm, bn = self._view if self._view is not None else view_of(self.granularity, self.shape)
        table = decode_table(self.format)
        out = np.empty((B, M, N), dtype=np.float64)
        dequant(
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


def dequantize(q: QuantizedTensor, dtype=None) -> np.ndarray:
    """``q.dequantize(dtype)``: ``decode(codes) * scales * global_scale`` in ``q.dtype`` (or ``dtype``)."""
    if not isinstance(q, QuantizedTensor):
        raise TypeError(f"dequantize expects a QuantizedTensor, got {type(q).__name__}")
    return q.dequantize(dtype)
