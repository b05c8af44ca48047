"""The ``fp8sim`` command line.

Subcommands register themselves in :data:`COMMANDS` through :func:`command`
(:mod:`fp8sim.cli.common`); each gets an argparse sub-parser and returns an exit code.  The
commands are grouped in modules: :mod:`~fp8sim.cli.numbers` (``info``, ``round``, ``quantize``),
:mod:`~fp8sim.cli.verify` (``verify``) and :mod:`~fp8sim.cli.experiments` (``report``, ``study``,
``sweep``, ``train``).
Exit codes: 0 success, 1 the work failed (the message says why), 2 bad usage, 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap

# First, before any other fp8sim module: with an editable install (pip install -e), a folder named
# fp8sim without __init__.py that comes first on sys.path (the checkout, seen from the folder that
# contains it; or one on PYTHONPATH) is imported as an empty namespace package ``fp8sim``, and fp8sim's
# own __init__ never runs (setuptools' editable finder is asked only after Python's path search). The
# submodules would still load, through that finder, and the command would run half set up (numba's
# cache inside the package, for one). Say so instead.
_parent = sys.modules.get(__name__.rpartition(".")[0])
if _parent is not None and getattr(_parent, "__file__", None) is None:
    raise ImportError(
        f"fp8sim: Python took the folder {os.pathsep.join(getattr(_parent, '__path__', []))} (no __init__.py; "
        "first on sys.path: the current folder, or PYTHONPATH) for an empty namespace package named fp8sim, "
        f"so the installed fp8sim ({os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}) never ran. "
        "This happens with an editable install (pip install -e) used from the folder that contains the "
        "checkout: run from another folder (the checkout itself works), take that folder off PYTHONPATH, "
        "or install with `pip install .`"
    )

from .._fpenv import ieee_env  # noqa: E402
from ..formats import UnknownNameError  # noqa: E402
from ..studies import TABLE_COLUMNS  # noqa: E402
from . import experiments, identify, numbers, verify  # noqa: E402
from .common import (  # noqa: E402
    COMMANDS,
    Interrupted,
    UsageError,
    check_in_file,
    check_out_dir,
    check_out_file,
    command,
    emit_json,
    format_table,
    granularity_list,
    progress_enabled,
)
from .experiments import SWEEP_CSV  # noqa: E402
from .numbers import load_float_npy  # noqa: E402

__all__ = [
    "main",
    "build_parser",
    "GROUPS",
    "COMMANDS",
    "command",
    "UsageError",
    "Interrupted",
    "load_float_npy",
    "emit_json",
    "progress_enabled",
    "format_table",
    "check_in_file",
    "check_out_file",
    "check_out_dir",
    "granularity_list",
    "TABLE_COLUMNS",
    "SWEEP_CSV",
]

#: the modules of the commands (importing one registers its commands), in the order of ``fp8sim --help``
GROUPS = (numbers, verify, experiments, identify)


def _group(fn) -> int:
    names = [m.__name__ for m in GROUPS]
    return names.index(fn.__module__) if fn.__module__ in names else len(names)


def build_parser() -> argparse.ArgumentParser:
    """The ``fp8sim`` argument parser with every registered subcommand."""
    from .._version import __version__

    parser = argparse.ArgumentParser(
        prog="fp8sim",
        description="Bit-exact simulation of FP8 arithmetic.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=textwrap.dedent("""\
            examples:
              fp8sim info --all
              fp8sim round 0.1 300 --format e4m3
              fp8sim report --out report --quick
            Run 'fp8sim COMMAND --help' for a command's options."""),
    )
    parser.add_argument("--version", action="version", version=f"fp8sim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (configure, _fn, help_, epilog) in sorted(COMMANDS.items(), key=lambda item: _group(item[1][1])):
        p = sub.add_parser(
            name, help=help_, description=help_, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        configure(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line on ``argv`` (default ``sys.argv[1:]``); return the exit code (0, 1, 2 or 130)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    _configure, fn, _help, _epilog = COMMANDS[args.command]
    try:
        with ieee_env():  # every command computes in the IEEE default floating-point environment
            return int(fn(args) or 0)
    except (UsageError, UnknownNameError) as e:
        print(f"fp8sim {args.command}: error: {e}", file=sys.stderr)
        return 2
    except (Interrupted, KeyboardInterrupt) as e:
        print(f"fp8sim {args.command}: {e or 'interrupted'}", file=sys.stderr)
        return 130
    except (ValueError, TypeError, OSError) as e:  # OSError: FileNotFoundError, PermissionError, ...
        print(f"fp8sim {args.command}: error: {e}", file=sys.stderr)
        return 1
