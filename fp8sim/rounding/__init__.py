"""Rounding to a format, and the codes of a format: one mechanism, every mode.

* :mod:`~fp8sim.rounding.modes` -- :class:`RoundMode`, the one vocabulary of rounding modes (element,
  scale and accumulator output rounding), names and aliases;
* :mod:`~fp8sim.rounding.params` -- :class:`FormatParams`, a format as the kernels see it, built by
  :func:`format_params` (the one place) and passed whole into every kernel;
* :mod:`~fp8sim.rounding.api` -- :func:`round`, :func:`encode`, :func:`decode`, :func:`decode_table`;
* ``_kernels`` (private) -- ``round_one``, the scalar template (float32 and float64 instantiations),
  and the array kernels; :mod:`~fp8sim.rounding.fast8` -- the vectorized round-to-nearest-even code
  path into the 8-bit formats that the fused quantization kernels use.

``__all__`` is the user's API.  The names imported below it without being listed are the package's
interface to fp8sim's other packages (the kernels of :mod:`fp8sim.scaling` call ``round_one`` from
numba code).
"""

from ._kernels import RDN as RDN
from ._kernels import RNA as RNA
from ._kernels import RNE as RNE
from ._kernels import RTO as RTO
from ._kernels import RTZ as RTZ
from ._kernels import RUP as RUP
from ._kernels import SR as SR
from ._kernels import random_bits as random_bits
from ._kernels import round_one as round_one
from .api import SMALL as SMALL
from .api import cast, decode, decode_table, encode, round, sr_random_bits
from .api import memo_table as memo_table
from .api import run_kernel as run_kernel
from .api import serial_if_small as serial_if_small
from .modes import ALIASES, MODES, RoundMode, round_mode
from .modes import check_sr_bits as check_sr_bits
from .modes import sr_key as sr_key
from .params import FormatParams, format_params
from .params import float32_kernel_ok as float32_kernel_ok

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
]
