"""The orientation of a recipe's granularities along K: :func:`along_k` and :func:`transpose_granularity`.

A recipe spells a granularity for an operand whose last axis is K (``x (M, K)``, ``w (N, K)`` as
torch stores it); the GEMM takes ``w`` as ``(K, N)``.  (Re-exported by :mod:`fp8sim.gemms.api`.)
"""

from __future__ import annotations

from .granularities import Granularity
from .names import granularity as as_granularity

__all__ = ["along_k", "transpose_granularity"]


def transpose_granularity(g) -> Granularity:
    """The granularity of the transpose of a 2-D tensor: the same blocks, axes swapped.

    ``Tile(r, c)`` becomes ``Tile(c, r)`` (``1x128`` -> ``128x1``), per row becomes per column and
    back, groups and MX / NVFP4 blocks move to the other axis; per tensor and delayed scaling stay
    (:meth:`Granularity.transposed <fp8sim.scaling.Granularity.transposed>`).
    """
    return as_granularity(g).transposed()


def along_k(g, operand: str) -> Granularity:
    """The one orientation rule: a recipe granularity is spelled for an operand whose last axis is
    K -- ``x (M, K)``, and ``w`` as torch stores it, ``(N, K)`` (``"1x128"``: 128 along K).  This
    gives it for the operand as the GEMM takes it: ``operand="x"``, ``x (M, K)``, as is;
    ``operand="w"``, ``w (K, N)``, transposed (:func:`transpose_granularity`).  A granularity
    object with state (``g.stateful``: delayed scaling) is returned as is."""
    if operand not in ("x", "w"):
        raise ValueError(f"along_k: operand must be 'x' (an (M, K) operand) or 'w' (a (K, N) one), got {operand!r}")
    given = g
    g = as_granularity(g)
    if g.stateful and not isinstance(given, Granularity):
        raise ValueError(
            f"along_k: granularity {given!r} given by name makes a new DelayedScaling, with an empty amax "
            "history, on every GEMM, so every operand would get the scale 1.0; build the recipe with a "
            "DelayedScaling object (fp8sim.granularity('delayed')), which keeps the history"
        )
    if operand == "w":
        return transpose_granularity(g)
    return g
