"""fp8sim: bit-exact simulation of FP8 arithmetic.

* formats are values (:class:`Format`, :func:`format`); :func:`round`,
  :func:`encode` and :func:`decode` convert between floats and a format's
  values and codes, in every rounding mode (:class:`RoundMode`);
* :func:`quantize` applies a scaling granularity (per tensor ... 1x128,
  128x128, MX, NVFP4, delayed) and returns a :class:`QuantizedTensor`;
  :mod:`fp8sim.metrics` measures the error;
* :mod:`fp8sim.tensorcore` models tensor-core accumulators bit for bit;
  :func:`gemm` runs a GEMM recipe (:func:`recipe`) on them
  (:mod:`fp8sim.pipeline`).

Where each concept lives: docs/architecture.md.
"""

import sys as _sys

# first: numba's cache of fp8sim's kernels goes to a per-user folder, never into the package;
# then, before any kernel loads an OpenMP runtime, OMP_WAIT_POLICY=PASSIVE unless the user chose a
# policy (fp8sim/_threads.py: the runtime's threads sleep, not spin, between fp8sim's kernels)
from . import (
    _numba_cache,  # noqa: F401, I001
    _threads,  # noqa: F401
    metrics,
    pipeline,
    rounding,
    scaling,
    tensorcore,
)
from ._version import __version__
from .formats import (
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
from .identification import identify
from .pipeline import GemmReport, gemm, scaled_matmul
from .recipes import Recipe, recipe, recipe_names
from .rounding import MODES, RoundMode, decode, decode_table, encode, round
from .scaled import scaled_gemm
from .scaling import Granularity, QuantizedTensor, dequantize, granularity, quantize
from .tensorcore import AccumulatorModel, get_model

# ``fp8sim.gemm`` is the function; the module it used to name is fp8sim.pipeline.  Old imports such as
# ``from fp8sim.gemm import scaled_matmul`` keep working through this alias.
_sys.modules[__name__ + ".gemm"] = pipeline

__all__ = [
    "__version__",
    # formats
    "Format",
    "NanStyle",
    "UnknownNameError",
    "format",
    "format_names",
    "CATALOGUE",
    "E4M3",
    "E5M2",
    "E4M3FNUZ",
    "E5M2FNUZ",
    "E8M0",
    "E2M1",
    "E2M3",
    "E3M2",
    "E3M4",
    "E5M6",
    "BF16",
    "FP16",
    "TF32",
    "FP32",
    # rounding
    "RoundMode",
    "MODES",
    "round",
    "encode",
    "decode",
    "decode_table",
    # scaling
    "Granularity",
    "QuantizedTensor",
    "granularity",
    "quantize",
    "dequantize",
    # tensor cores, GEMMs
    "AccumulatorModel",
    "get_model",
    "Recipe",
    "recipe",
    "recipe_names",
    "gemm",
    "scaled_gemm",
    "identify",
    "scaled_matmul",
    "GemmReport",
    # modules
    "metrics",
    "pipeline",
    "rounding",
    "scaling",
    "tensorcore",
]
