"""fp8sim: bit-exact simulation of FP8 arithmetic.

* formats are values (:class:`Format`, :func:`format`); :func:`round`,
  :func:`encode` and :func:`decode` convert between floats and a format's
  values and codes, in every rounding mode;
* :func:`quantize` applies a scaling granularity (per tensor ... 1x128,
  128x128, MX, NVFP4, delayed) and returns a :class:`QuantizedTensor`;
  :mod:`fp8sim.metrics` measures the error;
* :mod:`fp8sim.tensorcore` models the Hopper tensor-core accumulator bit for
  bit; :func:`gemm` runs a GEMM recipe (:func:`recipe`) on it.
"""

__version__ = "0.1.0"

# first: numba's cache of fp8sim's kernels goes to a per-user folder, never into the package
from . import _numba_cache  # noqa: F401, I001
from . import metrics  # noqa: F401
from .formats import (  # noqa: F401
    BF16,
    CATALOGUE,
    E2M1,
    E2M3,
    E3M2,
    E3M4,
    E4M3,
    E4M3FNUZ,
    E5M2,
    E5M2FNUZ,
    E5M6,
    E8M0,
    FP16,
    FP32,
    TF32,
    Format,
    NanStyle,
    UnknownNameError,
    format,
    format_names,
)
from .gemm import gemm  # noqa: F401
from .recipes import Recipe, recipe, recipe_names  # noqa: F401
from .rounding import MODES, decode, decode_table, encode, round  # noqa: F401
from .scaling import Granularity, QuantizedTensor, dequantize, granularity, quantize  # noqa: F401
