"""fp8sim: bit-exact simulation of FP8 arithmetic.

* formats are values (:class:`Format`, :func:`format`); :func:`round`,
  :func:`encode` and :func:`decode` convert between floats and a format's
  values and codes, in every rounding mode (:class:`RoundMode`);
* :func:`quantize` applies a scaling granularity (per tensor ... 1x128,
  128x128, MX, NVFP4, delayed) and returns a :class:`QuantizedTensor`;
  :mod:`fp8sim.metrics` measures the error;
* :mod:`fp8sim.tensorcore` models tensor-core accumulators bit for bit;
  :func:`gemm` runs a GEMM recipe (:func:`recipe`) on them, :func:`scaled_gemm` runs codes
  and scales as a library does (:mod:`fp8sim.gemms`).

Where each concept lives: docs/architecture.md.
"""

# first: numba's cache of fp8sim's kernels goes to a per-user folder, never into the package;
# then, before any kernel loads an OpenMP runtime, OMP_WAIT_POLICY=PASSIVE unless the user chose a
# policy (fp8sim/_threads.py: the runtime's threads sleep, not spin, between fp8sim's kernels)
from . import (
    _moved,
    _numba_cache,  # noqa: F401, I001
    _threads,  # noqa: F401
    gemms,
    metrics,
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
from .gemms import GemmReport, Recipe, gemm, identify, recipe, recipe_names, scaled_gemm
from .gemms.engine import scaled_matmul
from .rounding import MODES, RoundMode, decode, decode_table, encode, round
from .scaling import Granularity, QuantizedTensor, dequantize, granularity, quantize
from .tensorcore import AccumulatorModel, get_model

# the modules 0.2.0 moved into fp8sim.gemms (and ``fp8sim.gemm``, the old name of the GEMM module, while
# the attribute fp8sim.gemm is the function) stay importable, with a DeprecationWarning (fp8sim/_moved.py)
_moved.install()


def __getattr__(name: str):
    return _moved.attribute(name)


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
    "gemms",
    "metrics",
    "rounding",
    "scaling",
    "tensorcore",
]
