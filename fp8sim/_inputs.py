"""The one rule for float array inputs of the public entry points.

``round``, ``encode``, ``quantize`` and ``gemm`` (and the CLI's ``.npy`` loader) accept

* float32 and float64 arrays, as they are (big-endian ones are byte-swapped: values unchanged);
* float16 and ``ml_dtypes.bfloat16`` arrays, converted to float32 -- exactly: every float16 and
  bfloat16 value is a float32 value;

and refuse everything else with a ``TypeError`` that names the dtype and the accepted ones:
integers and booleans (convert explicitly), complex, object, other ml_dtypes formats, and
``np.longdouble`` (rounding it to float64 would drop bits silently).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

__all__ = ["ACCEPTED", "flag", "float_input", "is_half"]

#: the accepted input dtypes, as error messages name them
ACCEPTED = "float32, float64, float16 or bfloat16"

_BF16 = np.dtype(ml_dtypes.bfloat16)


def is_half(dt: np.dtype) -> bool:
    """True for float16 (either byte order) and ml_dtypes.bfloat16."""
    return dt == _BF16 or (dt.kind == "f" and dt.itemsize == 2)


def float_input(x, who: str, name: str = "x") -> tuple[np.ndarray, np.dtype]:
    """``(array, original dtype)`` for an input of ``who`` (e.g. ``"fp8sim.round"``).

    The array is float32 or float64 in native byte order (not necessarily contiguous): float16
    and bfloat16 become float32 exactly.  Any other dtype raises ``TypeError``.
    """
    arr = np.asarray(x)
    dt = arr.dtype
    if is_half(dt):
        return arr.astype(np.float32), (dt if dt == _BF16 else np.dtype(np.float16))
    if dt.kind == "f" and dt.itemsize in (4, 8):
        if not dt.isnative:
            arr = arr.astype(dt.newbyteorder("="))  # byte order only; values unchanged
        return arr, arr.dtype
    hint = ""
    if dt.kind == "f":
        hint = " (float64 cannot hold every value of it: round it yourself if that is what you want)"
    elif dt.kind in "iub":
        hint = " (convert it explicitly, e.g. x.astype(np.float32))"
    raise TypeError(f"{who}: {name} must be a {ACCEPTED} array, got dtype {dt}{hint} -- nothing is cast silently")


def flag(v, who: str, name: str) -> bool:
    """A boolean argument: True/False (or numpy bools); anything else -- ``"no"``, 1, None -- raises
    ``TypeError`` instead of being taken for its truth value."""
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    raise TypeError(f"{who}: {name} must be True or False, got {type(v).__name__} {v!r}")
