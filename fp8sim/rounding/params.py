"""A format's parameters as the rounding kernels see them: one named struct, built in one place."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..formats import Format, NanStyle

__all__ = ["FormatParams", "format_params", "float32_kernel_ok"]


class FormatParams(NamedTuple):
    """The target format and the conversion's options, as plain numbers (a numba-typed tuple).

    ``inf_code``/``nan_code`` are -1 where the format lacks them; ``saturate_overflow`` is 1 for a
    saturating conversion and for formats with neither inf nor NaN.  Built by :func:`format_params`;
    the kernels unpack it (``(mbits, emin, ...) = p``) or read its fields by name.
    """

    mbits: np.int64
    emin: np.int64
    emax: np.int64
    max_code: np.int64
    max_val: np.float64
    sign_mask: np.int64
    signed: bool
    has_neg_zero: bool
    subnormals: bool
    inf_code: np.int64
    nan_code: np.int64
    saturate_overflow: np.int64
    flush: bool
    sr_bits: np.int64


def format_params(fmt: Format, saturate: bool, flush: bool = False, sr_bits: int = 52) -> FormatParams:
    """The :class:`FormatParams` of rounding to ``fmt`` (checked arguments assumed)."""
    no_special = fmt.nan is NanStyle.NONE
    return FormatParams(
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
