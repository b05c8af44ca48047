"""Strict JSON output (shared by the CLI's ``--json`` and the writers of ``summary.json`` files).

JSON has no NaN or infinity, and ``json.dumps`` writes the non-standard tokens ``NaN`` and
``Infinity`` that strict parsers (JavaScript's ``JSON.parse``, ``jq``, Go, Rust serde) reject.
:func:`dumps` writes every non-finite float as a *string*: ``"nan"``, ``"inf"`` or ``"-inf"``
(``float(value)`` reads them back in Python), so the distinction between NaN and an overflow
to infinity is kept; numpy scalars and arrays become plain numbers and lists, and the result
is checked with ``allow_nan=False``.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

__all__ = ["dumps", "jsonable", "json_default", "NONFINITE"]

#: how :func:`dumps` writes the non-finite floats
NONFINITE = {"nan": "nan", "inf": "inf", "-inf": "-inf"}


def _float(v: float) -> float | str:
    if math.isfinite(v):
        return v
    if math.isnan(v):
        return NONFINITE["nan"]
    return NONFINITE["inf"] if v > 0 else NONFINITE["-inf"]


def jsonable(o: Any) -> Any:
    """``o`` with numpy values converted and non-finite floats replaced by ``"nan"``/``"inf"``/``"-inf"``.

    Dicts (keys made strings; tuple keys joined with ``/``), lists, tuples and arrays are converted
    recursively; anything else that JSON cannot hold becomes ``str(o)``.
    """
    if o is None or isinstance(o, (bool, str)):
        return o
    if isinstance(o, np.bool_):
        return bool(o)
    if isinstance(o, (int, np.integer)):
        return int(o)
    if isinstance(o, (float, np.floating)):
        return _float(float(o))
    if isinstance(o, dict):
        return {_key(k): jsonable(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [jsonable(v) for v in o]
    if isinstance(o, np.ndarray):
        return jsonable(o.tolist())
    if isinstance(o, np.generic):
        return jsonable(o.item())
    return str(o)


def _key(k: Any) -> str:
    if isinstance(k, str):
        return k
    if isinstance(k, tuple):
        return "/".join(map(str, k))
    return str(jsonable(k))


def dumps(obj: Any, *, indent: int | None = 2) -> str:
    """Strict JSON text of ``obj`` (see the module docstring for NaN and infinity)."""
    return json.dumps(jsonable(obj), indent=indent, allow_nan=False)


def json_default(o: Any) -> Any:
    """``json.dumps(..., default=json_default)``: numpy scalars and arrays as plain numbers/lists.

    Prefer :func:`dumps`: ``default`` is never called for Python floats, so NaN and infinity
    still come out as the invalid tokens ``NaN``/``Infinity``.
    """
    if isinstance(o, (np.floating, np.integer, np.ndarray, np.bool_)):
        return jsonable(o)
    return str(o)
