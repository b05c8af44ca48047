"""Block scales of the block-scaled MMAs (MXFP8 / MXFP4 / NVFP4): their codes and the blocks an
instruction takes.  The GEMMs that fold them into the MMA are :mod:`fp8sim.gemms.block_scaled`."""

from __future__ import annotations

import numpy as np

from . import archs
from .model import AccumulatorModel

__all__ = ["scale_codes", "instruction_blocks", "E8M0_ONE", "UE4M3_ONE"]

E8M0_ONE = 127  #: the UE8M0 code of 1.0
UE4M3_ONE = 0x38  #: the UE4M3 code of 1.0


def scale_codes(scales: np.ndarray, scale_format: str) -> np.ndarray:
    """uint8 codes of block-scale values: UE8M0 (powers of two 2**-127..2**127; NaN -> 0xff) or
    UE4M3 (positive E4M3 values).  A value the format does not hold raises ``ValueError``."""
    s = np.asarray(scales, np.float64)
    if scale_format == "ue8m0":
        fin = np.isfinite(s) & (s > 0)
        e = np.zeros(s.shape, np.int64)
        e[fin] = np.frexp(s[fin])[1] - 1
        if not np.array_equal(np.ldexp(1.0, e[fin]), s[fin]) or (e[fin] < -127).any() or (e[fin] > 127).any():
            raise ValueError("UE8M0 scales must be powers of two in 2**-127 .. 2**127 (or NaN)")
        if (~fin & ~np.isnan(s)).any():
            raise ValueError("UE8M0 scales must be positive powers of two (or NaN)")
        return np.where(fin, e + 127, 255).astype(np.uint8)
    if scale_format == "ue4m3":
        import ml_dtypes

        c = s.astype(np.float32).astype(ml_dtypes.float8_e4m3fn)
        if not np.array_equal(c.astype(np.float64), s, equal_nan=True) or (np.signbit(s) & (s != 0)).any():
            raise ValueError("UE4M3 scales must be non-negative E4M3 values")
        return (c.view(np.uint8) & 0x7F).astype(np.uint8)
    raise ValueError(f"scale_format must be 'ue8m0' or 'ue4m3', got {scale_format!r}")


def instruction_blocks(accumulator: str | AccumulatorModel, scale_format: str) -> tuple[int, ...]:
    """The scale blocks along K (in elements) that the block-scaled MMA ``accumulator``
    (``"sm100:tcgen05.mma.kind::mxf8f6f4"``, ..., or its model) takes with ``scale_format`` (``"ue8m0"`` or
    ``"ue4m3"``)."""
    if isinstance(accumulator, str):
        arch, _, key = accumulator.partition(":")
        rows = [r for r in archs.ROWS if (r.arch, r.key) == (arch, key)]
    else:  # a model object: the instructions with scales that it models
        rows = [r for r in archs.ROWS if r.scales and r.model == accumulator]
    return tuple(sorted({b for r in rows for s, b in r.scales if ("ue8m0" if s == "e8m0" else s) == scale_format}))
