"""Messages for unknown names: what was asked for, the closest known names, and every known name."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["UnknownNameError", "close_matches", "unknown_name_error"]


class UnknownNameError(ValueError):
    """An unknown format, mode or granularity name (the message lists the known ones)."""


def close_matches(name: str, known: Iterable[str], n: int = 3) -> list[str]:
    """Up to ``n`` known names close to ``name`` (difflib, case-insensitive), best first."""
    known = list(known)
    lower = {k.lower(): k for k in known}
    hits = difflib.get_close_matches(str(name).strip().lower(), list(lower), n=n, cutoff=0.6)
    return [lower[h] for h in hits]


def unknown_name_error(
    kind: str,
    name: str,
    known: Iterable[str],
    *,
    where: str = "",
    candidates: Iterable[str] | None = None,
    plural: str | None = None,
) -> UnknownNameError:
    """An :class:`~fp8sim.UnknownNameError` saying ``unknown KIND 'NAME'`` (``WHERE: `` first
    when given), the close matches (``did you mean ...?``, among ``candidates``, default ``known``)
    and the known names (``known PLURAL: ...``, default KIND + "s")."""
    known = list(known)
    hint = close_matches(name, known if candidates is None else candidates)
    msg = f"{where}: " if where else ""
    msg += f"unknown {kind} {name!r}"
    if hint:
        msg += f"; did you mean {' or '.join(map(repr, hint))}?"
    msg += f"; known {plural or kind + 's'}: {', '.join(known)}"
    return UnknownNameError(msg)
