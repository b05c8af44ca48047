"""What the commands share: the command registry, the exceptions of the exit codes, JSON output, and
the argument checks made before any work starts.

Every command checks its arguments, its input files and its output paths before any work starts; a
problem is a :class:`UsageError` (exit code 2) whose message names the option or the path, or an
:class:`~fp8sim.formats.UnknownNameError` for an unknown name.  Existing outputs are never replaced
without ``--force``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence

from .. import report
from .._json import dumps as json_dumps
from .._names import unknown_name_error
from ..formats import UnknownNameError
from ..scaling import granularity, granularity_names
from ..studies import TABLE_COLUMNS

__all__ = [
    "COMMANDS",
    "GRANULARITY_FORMS",
    "command",
    "UsageError",
    "Interrupted",
    "DefaultsFormatter",
    "emit_json",
    "progress_enabled",
    "option_errors",
    "int_type",
    "seed_type",
    "check_in_file",
    "check_out_file",
    "check_out_dir",
    "lookup_format",
    "lookup_mode",
    "granularity_list",
    "csv_list",
    "fmt_value",
    "format_table",
]

#: subcommand name -> (configure(parser), run(args) -> exit code, help, epilog), in registration order
COMMANDS: dict[
    str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int], str, str]
] = {}


#: the forms of granularity names, for help texts: tensor, row, col, 1xN, RxC, gN, mxN, nvfp4, delayed
GRANULARITY_FORMS = ", ".join(name.split()[0] for name in granularity_names())


class UsageError(Exception):
    """Bad arguments: exit code 2."""


class Interrupted(Exception):
    """The run was interrupted (Ctrl-C) and cleaned up: exit code 130."""


def command(name: str, help: str, epilog: str = ""):  # noqa: A002
    """Register ``fn(args) -> int`` as subcommand ``name``; the decorated
    function's ``configure`` attribute (set with ``@fn.arguments``) adds its arguments."""

    def wrap(fn):
        def arguments(configure):
            COMMANDS[name] = (configure, fn, help, epilog)
            return configure

        fn.arguments = arguments
        COMMANDS[name] = (lambda p: None, fn, help, epilog)
        return fn

    return wrap


class DefaultsFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Keep the epilog's line breaks and add each option's default to its help."""


def emit_json(obj) -> None:
    """Print ``obj`` as indented strict JSON: numpy scalars and arrays converted, NaN and
    infinities written as the strings ``"nan"``, ``"inf"``, ``"-inf"`` (see :mod:`fp8sim._json`)."""
    print(json_dumps(obj))


def progress_enabled(args) -> bool:
    """Progress bars only on a terminal, and never with --quiet."""
    return not getattr(args, "quiet", False) and sys.stderr.isatty()


@contextlib.contextmanager
def option_errors(option: str) -> Iterator[None]:
    """Errors raised inside name ``option``: an UnknownNameError stays one (exit code 2), a ValueError
    or TypeError becomes a :class:`UsageError`; both with ``OPTION: `` before the message."""
    prefix = f"{option}: " if option else ""
    try:
        yield
    except UnknownNameError as e:
        raise UnknownNameError(f"{prefix}{e}") from None
    except (ValueError, TypeError) as e:
        raise UsageError(f"{prefix}{e}") from None


def int_type(least: int, most: int | None = None) -> Callable[[str], int]:
    """An argparse ``type=`` for an integer option in ``least..most``; argparse names the option
    in its message and exits with code 2."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if v < least or (most is not None and v > most):
            rng = f"{least}..{most}" if most is not None else f">= {least}"
            raise argparse.ArgumentTypeError(f"must be an integer {rng}, got {v}")
        return v

    parse.__name__ = "integer"  # argparse's "invalid integer value" wording
    return parse


#: the ``type=`` of every ``--seed``: an integer >= 0
seed_type = int_type(0)


def check_in_file(path: str, what: str, suffixes: tuple[str, ...] = ()) -> str:
    """``path`` must be an existing, readable file, ending in one of ``suffixes`` when given."""
    if not os.path.exists(path):
        raise UsageError(f"{what} {path}: no such file")
    if os.path.isdir(path):
        raise UsageError(f"{what} {path} is a folder, not a file")
    if suffixes and not path.lower().endswith(tuple(s.lower() for s in suffixes)):
        raise UsageError(f"{what} {path}: expected a {' or '.join(suffixes)} file")
    if not os.access(path, os.R_OK):
        raise UsageError(f"{what} {path}: not readable (permission denied)")
    return path


def check_out_file(path: str, what: str = "--out", *, force: bool = False, suffixes: tuple[str, ...] = ()) -> str:
    """``path`` can be written as a file: not a folder, not an existing file unless ``force``, ending
    in one of ``suffixes`` when given, its folder existing or creatable and writable."""
    if suffixes and not path.lower().endswith(tuple(s.lower() for s in suffixes)):
        raise UsageError(f"{what} {path}: expected a file name ending in {' or '.join(suffixes)}")
    if os.path.isdir(path):
        raise UsageError(f"{what} {path} is a folder; give a file name")
    if os.path.lexists(path):
        if not force:
            raise UsageError(f"{what} {path} exists; pass --force to replace it")
        if not os.access(path, os.W_OK):
            raise UsageError(f"{what} {path}: not writable (permission denied)")
    try:
        report.check_parent(path)
    except report.OutputError as e:
        raise UsageError(f"{what} {path}: {e}") from None
    return path


def check_out_dir(path: str, what: str = "--out", *, force: bool = False, writes: Sequence[str] | None = None) -> str:
    """``path`` can take the outputs of a command: :func:`fp8sim.report.check_out_dir` (``writes``: the
    names of the files written into the folder; None: the folder is a report, replaced as a whole),
    its error a :class:`UsageError` naming the option ``what``."""
    try:
        report.check_out_dir(path, overwrite=force, writes=writes)
    except report.OutputError as e:
        raise UsageError(f"{what}: {e}") from None
    return path


def lookup_format(name: str, option: str = "--format"):
    """The catalogue format ``name``; an unknown name is a usage error with close matches."""
    from .. import formats

    with option_errors(option):
        return formats.format(name)


def lookup_mode(name: str, option: str = "--mode") -> str:
    """The canonical name (``rne``, ``rtz``, ...) of a rounding mode name or alias; an unknown one is a
    usage error with close matches."""
    from .. import rounding

    with option_errors(option):
        return rounding.round_mode(str(name)).label


def granularity_list(text: str, option: str = "--granularity") -> list[str]:
    """A comma list of granularity names (``tensor,1x128,mx32``), each checked; a usage error names
    the option, the bad entry and the close matches."""
    names = [v.strip() for v in text.split(",")]
    if not any(names) or any(not v for v in names):
        raise UsageError(f"{option}: expected a comma-separated list of granularities, got {text!r}")
    for g in names:
        with option_errors(option):
            granularity(g)
    return names


def csv_list(text: str, cast=str, option: str = "list") -> list:
    """The comma-separated entries of ``text`` (blanks dropped); a usage error naming ``option`` when
    an entry does not convert or none is left."""
    items = [v.strip() for v in text.split(",") if v.strip()]
    if not items:
        raise UsageError(f"{option}: expected a comma-separated list, got {text!r}")
    try:
        return [cast(v) for v in items]
    except ValueError as e:
        raise UsageError(f"{option}: bad entry in {text!r}: {e}") from None


def fmt_value(v) -> str:
    """A value of a plain-text table: floats to 6 significant digits."""
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def format_table(rows: list[dict], columns: Sequence[str] = TABLE_COLUMNS) -> str:
    """A plain-text table of format properties, one row per format (``columns``: keys of the rows)."""
    for c in columns:
        if rows and c not in rows[0]:
            raise unknown_name_error("column", c, rows[0])
    cells = [[fmt_value(r[c]) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    line = "  ".join(c.rjust(w) for c, w in zip(columns, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(out)
