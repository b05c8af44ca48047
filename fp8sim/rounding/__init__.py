"""Rounding to a format, and the codes of a format: one mechanism, every mode.

* :mod:`~fp8sim.rounding.modes` -- :class:`RoundMode`, the one vocabulary of rounding modes (element,
  scale and accumulator output rounding), names and aliases;
* :mod:`~fp8sim.rounding.params` -- :class:`FormatParams`, a format as the kernels see it;
* :mod:`~fp8sim.rounding.kernels` -- ``round_one``, the scalar template (float32 and float64
  instantiations), and the array kernels;
* :mod:`~fp8sim.rounding.fast8` -- the vectorized round-to-nearest-even code path into the 8-bit
  formats that the fused quantization kernels use (an instantiation of the same rounding);
* :mod:`~fp8sim.rounding.api` -- :func:`round`, :func:`encode`, :func:`decode`, :func:`decode_table`.
"""

from .api import (
    SMALL,
    cast,
    decode,
    decode_table,
    encode,
    memo_table,
    round,
    run_kernel,
    serial_if_small,
    sr_random_bits,
)
from .modes import ALIASES, MODES, RoundMode, check_sr_bits, round_mode, sr_key
from .params import FormatParams, float32_kernel_ok, format_params

__all__ = [
    "RoundMode",
    "MODES",
    "ALIASES",
    "round_mode",
    "round",
    "encode",
    "decode",
    "decode_table",
    "sr_random_bits",
    "cast",
    "FormatParams",
    "format_params",
    "float32_kernel_ok",
    "memo_table",
    "run_kernel",
    "serial_if_small",
    "SMALL",
    "sr_key",
    "check_sr_bits",
]
