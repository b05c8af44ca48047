"""Granularity names: the spellings :func:`granularity` parses (``"tensor"``, ``"row"``, ``"1x128"``,
``"128x128"``, ``"mx32"``, ``"g64"``, ``"nvfp4"``, ``"delayed"``, ...), :func:`granularity_names`, and
:func:`register_granularity`, which adds a user's own granularity under a name (docs/architecture.md,
"Adding a granularity")."""

from __future__ import annotations

import re
from collections.abc import Callable

from .._names import unknown_name_error
from .granularities import MX, NVFP4, DelayedScaling, Granularity, Group, PerColumn, PerRow, PerTensor, Tile

__all__ = ["granularity", "granularity_names", "register_granularity"]


_NAMED = {
    "tensor": PerTensor,
    "per_tensor": PerTensor,
    "row": PerRow,
    "token": PerRow,
    "per_row": PerRow,
    "col": PerColumn,
    "column": PerColumn,
    "channel": PerColumn,
    "per_col": PerColumn,
}
_PATTERNS = [
    (re.compile(r"^(\d+)x(\d+)$"), lambda m: Tile(int(m[1]), int(m[2]))),
    (re.compile(r"^g(\d+)$"), lambda m: Group(int(m[1]))),
    (re.compile(r"^mx(\d+)$"), lambda m: MX(int(m[1]))),
    (re.compile(r"^mx$"), lambda m: MX(32)),
    (re.compile(r"^nvfp4$"), lambda m: NVFP4(16)),
    (re.compile(r"^delayed(\d*)$"), lambda m: DelayedScaling(int(m[1]) if m[1] else 16)),
]


_REGISTERED: dict[str, tuple[str, Callable[[], Granularity]]] = {}  # spelling -> (name as given, factory)
_REGISTERED_PATTERNS: list[tuple[str, re.Pattern, Callable[[re.Match], Granularity]]] = []


def register_granularity(name: str, factory: Callable, *, pattern: str | None = None) -> None:
    """Make :func:`granularity` (so ``fp8sim.granularity``, ``fp8sim.quantize`` and recipe strings)
    know a new granularity.

    ``name`` (case-insensitive) is the spelling; ``factory()`` makes the :class:`Granularity`.  With
    ``pattern`` (a regular expression matched against the lower-cased spelling), ``factory(match)``
    makes it and ``name`` is the form shown by :func:`granularity_names` (e.g. ``name="hN"``,
    ``pattern=r"^h(\\d+)$"``).  Built-in spellings cannot be taken over (ValueError); registering a
    name again replaces its factory.  The base :class:`Granularity` gives defaults for every
    behaviour the GEMM, training and scale policy ask for (see its methods)."""
    if not isinstance(name, str) or not name.strip():
        raise TypeError(f"register_granularity: name must be a non-empty str, got {name!r}")
    if not callable(factory):
        raise TypeError(f"register_granularity: factory must be callable, got {factory!r}")
    key = name.strip().lower()
    if pattern is None:
        if key in _NAMED or any(p.match(key) for p, _ in _PATTERNS):
            raise ValueError(f"register_granularity: {name!r} is a built-in granularity name")
        _REGISTERED[key] = (name.strip(), factory)
        return
    rx = re.compile(pattern)
    _REGISTERED_PATTERNS[:] = [e for e in _REGISTERED_PATTERNS if e[0].lower() != key]
    _REGISTERED_PATTERNS.append((name.strip(), rx, factory))


def _registered(key: str) -> Granularity | None:
    if key in _REGISTERED:
        made = _REGISTERED[key][1]()
    else:
        for _name, rx, make in _REGISTERED_PATTERNS:
            m = rx.match(key)
            if m:
                made = make(m)
                break
        else:
            return None
    if not isinstance(made, Granularity):
        raise TypeError(
            f"granularity {key!r}: its registered factory returned {type(made).__name__}, not a Granularity"
        )
    return made


def granularity_names() -> list[str]:
    """The string forms :func:`granularity` understands (``N``, ``R``, ``C`` any positive ints), then
    the registered ones (:func:`register_granularity`)."""
    return [
        *_builtin_names(),
        *(name for name, _ in _REGISTERED.values()),
        *(name for name, _, _ in _REGISTERED_PATTERNS),
    ]


def _builtin_names() -> list[str]:
    return [
        "tensor",
        "row",
        "col",
        "1xN (e.g. 1x128)",
        "RxC (e.g. 128x128)",
        "gN (e.g. g32)",
        "mxN (e.g. mx32)",
        "nvfp4",
        "delayed / delayedN (history length N)",
    ]


def granularity(g) -> Granularity:
    """A :class:`Granularity` from its short name (or the object itself)."""
    if isinstance(g, Granularity):
        return g
    if not isinstance(g, str):
        raise TypeError(f"granularity must be a Granularity or a name, got {type(g).__name__}")
    key = g.strip().lower()
    if key in _NAMED:
        return _NAMED[key]()
    for pat, make in _PATTERNS:
        m = pat.match(key)
        if m:
            nums = [int(v) for v in m.groups() if v]
            if any(v <= 0 for v in nums):
                raise ValueError(f"granularity {g!r}: tile/group sizes must be positive ints")
            return make(m)
    made = _registered(key)
    if made is not None:
        return made
    examples = ("tensor", "row", "col", "1x128", "128x128", "g32", "mx32", "nvfp4", "delayed")
    raise unknown_name_error("granularity", g, granularity_names(), candidates=examples, plural="granularities")
