"""The one vocabulary of rounding modes: element rounding, scale rounding and accumulator output.

:class:`RoundMode` is what every kernel sees (an int, a compile-time constant
where a kernel is specialized per mode); names are accepted at the public
boundary with the aliases the field uses (PTX's ``rz``/``rn``/``ru``/``rd``,
IEEE's ``towardZero``, numpy's ``floor``/``ceil``, ...).
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np

from .._names import unknown_name_error

__all__ = ["RoundMode", "MODES", "ALIASES", "round_mode", "sr_key", "check_sr_bits"]


class RoundMode(IntEnum):
    """A rounding mode.  The value is the kernels' mode number."""

    RNE = 0  #: nearest, ties to even (IEEE default)
    RNA = 1  #: nearest, ties away from zero
    RTZ = 2  #: toward zero (truncation)
    RUP = 3  #: toward +inf
    RDN = 4  #: toward -inf
    RTO = 5  #: round to odd (an inexact result takes the neighbour whose code is odd)
    SR = 6  #: stochastic (away from zero with probability equal to the fractional distance)

    @property
    def label(self) -> str:
        """The canonical name (``"rne"``, ``"rtz"``, ...)."""
        return self.name.lower()


#: canonical name -> mode, in mode order
MODES: dict[str, RoundMode] = {m.label: m for m in RoundMode}

#: other names of the same modes
ALIASES: dict[str, str] = {
    "nearest": "rne",
    "rn": "rne",
    "even": "rne",
    "tiestoeven": "rne",
    "away": "rna",
    "tiestoaway": "rna",
    "zero": "rtz",
    "rz": "rtz",
    "towardzero": "rtz",
    "truncate": "rtz",
    "up": "rup",
    "ru": "rup",
    "ceil": "rup",
    "towardpositive": "rup",
    "down": "rdn",
    "rd": "rdn",
    "floor": "rdn",
    "towardnegative": "rdn",
    "odd": "rto",
    "stochastic": "sr",
}


def round_mode(mode, allowed=None, what: str = "rounding mode") -> RoundMode:
    """The :class:`RoundMode` named by ``mode`` (a RoundMode, a canonical name or an alias).

    ``allowed`` (modes) restricts the answer: another mode raises
    :class:`~fp8sim.formats.UnknownNameError` naming the allowed ones.
    """
    if isinstance(mode, RoundMode):
        m = mode
    else:
        if not isinstance(mode, str):
            raise TypeError(f"{what} must be a string, one of {', '.join(MODES)}; got {type(mode).__name__}")
        key = mode.strip().lower()
        key = ALIASES.get(key, key)
        if key not in MODES:
            known = list(MODES) if allowed is None else [RoundMode(a).label for a in allowed]
            raise unknown_name_error(what, mode, known, candidates=[*MODES, *ALIASES], plural="modes")
        m = MODES[key]
    if allowed is not None and m not in allowed:
        known = [RoundMode(a).label for a in allowed]
        raise unknown_name_error(what, mode if isinstance(mode, str) else m.label, known, plural="modes")
    return m


def sr_key(seed) -> np.uint64:
    """The 64-bit key of stochastic rounding's counter-based random bits, from an int or a Generator."""
    if seed is None:
        raise ValueError(
            "stochastic rounding needs a source of randomness: pass seed=<int> or seed=<numpy.random.Generator>"
        )
    if isinstance(seed, np.random.Generator):
        return np.uint64(seed.integers(0, 2**63, dtype=np.int64)) * np.uint64(2) + np.uint64(1)
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int or a numpy.random.Generator, got {type(seed).__name__}")
    return np.uint64(int(seed) & 0xFFFFFFFFFFFFFFFF)


def check_sr_bits(sr_bits) -> int:
    """``sr_bits`` checked (an int in 1..52; None means 52)."""
    if sr_bits is None:
        return 52
    if isinstance(sr_bits, (bool, np.bool_)) or not isinstance(sr_bits, (int, np.integer)):
        raise TypeError(f"sr_bits must be an int in 1..52 or None, got {type(sr_bits).__name__}")
    if not 1 <= sr_bits <= 52:
        raise ValueError(f"sr_bits must be in 1..52, got {sr_bits}")
    return int(sr_bits)
