"""fp8sim: bit-exact simulation of FP8 arithmetic.

Formats are values (:class:`Format`); :func:`round`, :func:`encode` and
:func:`decode` convert between floats and a format's values and codes.
"""

from .formats import (  # noqa: F401
    BF16, CATALOGUE, E2M1, E2M3, E3M2, E3M4, E4M3, E4M3FNUZ, E5M2, E5M2FNUZ, E5M6, E8M0, FP16, FP32, TF32,
    Format, NanStyle, format, format_names,
)
from .rounding import MODES, decode, decode_table, encode, round  # noqa: F401

__version__ = "0.1.0"
from .scaling import Granularity, QuantizedTensor, dequantize, granularity, quantize; from . import metrics  # noqa: E402,F401,E702
from .recipes import Recipe, recipe, recipe_names; from .gemm import gemm  # noqa: E402,F401,E702
