"""The ``fp8sim`` command line.

Subcommands register themselves in :data:`COMMANDS` through
:func:`command`; each gets an argparse sub-parser and returns an exit code.
Exit codes: 0 success, 1 the work failed (the message says why), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from collections.abc import Callable

import numpy as np

from ._json import dumps as _json_dumps
from ._names import unknown_name_error
from .formats import UnknownNameError

COMMANDS: dict[
    str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int], str, str]
] = {}


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


def emit_json(obj) -> None:
    """Print ``obj`` as indented strict JSON: numpy scalars and arrays converted, NaN and
    infinities written as the strings ``"nan"``, ``"inf"``, ``"-inf"`` (see :mod:`fp8sim._json`)."""
    print(_json_dumps(obj))


def progress_enabled(args) -> bool:
    """Progress bars only on a terminal, and never with --quiet."""
    return not getattr(args, "quiet", False) and sys.stderr.isatty()


# ------------------------------------------------- argument checking helpers
# Every command checks its arguments, its input files and its output paths before any work
# starts; a problem is a UsageError (exit code 2) whose message names the option or the path.
# Existing outputs are never replaced without --force (FORCE_HELP).

FORCE_HELP = "replace existing output files (without it, an existing output is an error)"


def _int_type(option: str, least: int, most: int | None = None) -> Callable[[str], int]:
    """An argparse ``type=`` for an integer option in ``least..most``; argparse names the option
    in its message and exits with code 2."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if v < least or (most is not None and v > most):
            rng = f"{least}..{most}" if most is not None else f">= {least}"
            raise argparse.ArgumentTypeError(f"must be an integer {rng}, got {v}")  # argparse names {option}
        return v

    parse.__name__ = "integer"  # argparse's "invalid integer value" wording
    return parse


_seed_type = _int_type("--seed", 0)
_positive_int = _int_type("the value", 1)


def _check_in_file(path: str, what: str, suffixes: tuple[str, ...] = ()) -> str:
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


def _check_parent(path: str, what: str) -> None:
    """The folder that will hold ``path`` must exist or be creatable, and be writable."""
    anc = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(anc):
        anc = os.path.dirname(anc)
    if not os.path.isdir(anc):
        raise UsageError(f"{what} {path}: {anc} is a file, not a folder")
    if not os.access(anc, os.W_OK | os.X_OK):
        raise UsageError(f"{what} {path}: cannot write in {anc} (permission denied)")


def _check_out_file(path: str, what: str = "--out", *, force: bool = False, suffixes: tuple[str, ...] = ()) -> str:
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
    _check_parent(path, what)
    return path


def _check_out_dir(path: str, what: str = "--out", *, force: bool = False, writes: tuple[str, ...] = ()) -> str:
    """``path`` can be used as an output folder: missing (it will be created) or a folder, not a file;
    none of the files ``writes`` (names inside it) already there unless ``force``; writable."""
    if os.path.lexists(path) and not os.path.isdir(path):
        raise UsageError(f"{what} {path} exists and is not a folder")
    if os.path.isdir(path):
        for name in writes:
            f = os.path.join(path, name)
            if os.path.isdir(f):
                raise UsageError(f"{what} {path}: {f} is a folder where the output file goes")
            if os.path.lexists(f) and not force:
                raise UsageError(f"{what} {path} already holds {name}; pass --force to replace it")
        if not os.access(path, os.W_OK | os.X_OK):
            raise UsageError(f"{what} {path}: not writable (permission denied)")
    else:
        _check_parent(path, what)
    return path


def _lookup_format(name: str, option: str = "--format"):
    """The catalogue format ``name``; an unknown name is a usage error with close matches."""
    from . import formats

    try:
        return formats.format(name)
    except UnknownNameError:
        raise unknown_name_error("format", name, formats.format_names(), where=option) from None


def _granularity_list(text: str, option: str = "--granularity") -> list[str]:
    """A comma list of granularity names (``tensor,1x128,mx32``), each checked; a usage error names
    the option, the bad entry and the close matches."""
    from .scaling import granularity, granularity_names

    names = [v.strip() for v in text.split(",")]
    if not any(names) or any(not v for v in names):
        raise UsageError(f"{option}: expected a comma-separated list of granularities, got {text!r}")
    for g in names:
        try:
            granularity(g)
        except UnknownNameError:
            examples = ("tensor", "row", "col", "1x128", "128x128", "g32", "mx32", "nvfp4", "delayed")
            raise unknown_name_error(
                "granularity", g, granularity_names(), where=option, candidates=examples, plural="granularities"
            ) from None
        except ValueError as e:
            raise UsageError(f"{option}: {e}") from None
    return names


# ---------------------------------------------------------------- info
@command(
    "info",
    "show a format's properties, or a table of all formats",
    "examples:\n  fp8sim info e4m3\n  fp8sim info --all\n  fp8sim info e5m2 --json",
)
def _info(args) -> int:
    from . import formats

    if args.all or not args.name:
        fmts = list(formats.CATALOGUE.values())
    else:
        fmts = [_lookup_format(args.name, "")]
    rows = [f.summary() for f in fmts]
    if args.json:
        emit_json(rows if len(rows) > 1 or args.all else rows[0])
        return 0
    if len(rows) == 1 and not args.all:
        for k, v in rows[0].items():
            print(f"{k:>14}: {_fmt_value(v)}")
        return 0
    print(format_table(rows))
    return 0


@_info.arguments
def _info_args(p):
    p.add_argument("name", nargs="?", help="format name (e4m3, e5m2, e8m0, bf16, ...)")
    p.add_argument("--all", action="store_true", help="side-by-side table of every catalogue format")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _fmt_value(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


TABLE_COLUMNS = [
    "name",
    "bits",
    "ebits",
    "mbits",
    "bias",
    "inf",
    "nan",
    "max",
    "min_normal",
    "min_subnormal",
    "eps",
    "emax",
    "emin",
    "ml_dtype",
]


def format_table(rows: list[dict], columns: list[str] = TABLE_COLUMNS) -> str:
    """A plain-text table of format properties, one row per format."""
    cells = [[_fmt_value(r[c]) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    line = "  ".join(c.rjust(w) for c, w in zip(columns, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(out)


# ---------------------------------------------------------------- round
@command(
    "round",
    "round numbers to a format and show values, codes and errors",
    "examples:\n  fp8sim round 0.1 300 -431.99999999999994 --format e4m3\n"
    "  fp8sim round 1.3 --format e5m2 --mode rtz --json\n"
    "  fp8sim round 1e6 --format e4m3 --saturate",
)
def _round(args) -> int:
    from . import rounding

    fmt = _lookup_format(args.format)
    mode = _lookup_mode(args.mode)
    if mode == "sr" and args.seed is None:
        raise UsageError("--mode sr needs --seed N (stochastic rounding is reproducible from its seed)")
    if mode != "sr" and args.sr_bits is not None:
        raise UsageError(f"--sr-bits applies only to --mode sr (got --mode {args.mode})")
    try:
        x = np.array([float(v) for v in args.values], dtype=np.float64)
    except ValueError as e:
        raise UsageError(f"values must be numbers: {e}") from None
    kw = dict(saturate=args.saturate, flush_subnormals=args.flush_subnormals, seed=args.seed, sr_bits=args.sr_bits)
    y = rounding.round(x, fmt, mode, **kw)
    codes = rounding.encode(x, fmt, mode, **kw) if fmt.nan.value != "none" or not np.isnan(x).any() else None
    width = (fmt.bits + 3) // 4
    rows = []
    for i, (xi, yi) in enumerate(zip(x, y)):
        err = float(yi - xi) if np.isfinite(yi) and np.isfinite(xi) else float("nan")
        rel = abs(err / xi) if xi != 0 and np.isfinite(err) else (0.0 if err == 0 else float("nan"))
        rows.append(
            {
                "input": float(xi),
                "value": float(yi),
                "code": None if codes is None else f"0x{int(codes[i]):0{width}x}",
                "abs_error": err,
                "rel_error": rel,
            }
        )
    if args.json:
        emit_json({"format": fmt.name, "mode": args.mode, "saturate": args.saturate, "results": rows})
    else:
        print(f"format {fmt.name}, mode {args.mode}{', saturating' if args.saturate else ''}")
        for r in rows:
            print(f"{r['input']!r:>24} -> {r['value']!r:<14} code {r['code']}  rel.err {r['rel_error']:.3g}")
    return 0


@_round.arguments
def _round_args(p):
    p.add_argument("values", nargs="+", help="numbers to round (float64)")
    p.add_argument("-f", "--format", default="e4m3", help="target format (default e4m3)")
    p.add_argument("-m", "--mode", default="rne", help="rne, rna, rtz, rup, rdn, rto or sr (default rne)")
    p.add_argument("--saturate", action="store_true", help="clamp overflow to +-max (OCP satfinite)")
    p.add_argument("--flush-subnormals", action="store_true", help="flush subnormal results to zero")
    p.add_argument("--seed", type=_seed_type, default=None, help="seed for --mode sr (an integer >= 0; required)")
    p.add_argument(
        "--sr-bits",
        type=_int_type("--sr-bits", 1, 52),
        default=None,
        help="random bits for --mode sr, 1..52 (default 52)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output (NaN and inf as strings)")


def _lookup_mode(name: str, option: str = "--mode") -> str:
    """A rounding mode name; an unknown one is a usage error with close matches."""
    from . import rounding

    try:
        m = rounding._mode(str(name))  # the library's names and aliases ("nearest", "rz", ...)
    except UnknownNameError as e:
        raise UnknownNameError(f"{option}: {e}") from None
    return {v: k for k, v in rounding.MODES.items()}[m]


# --------------------------------------------------------------- report
@command(
    "report",
    "run the headline studies and write an HTML report with figures, CSV and JSON",
    "examples:\n  fp8sim report --out report --quick\n  fp8sim report --out report\n"
    "  fp8sim report --out report --config report.toml\n\n"
    "A config file (TOML or JSON) picks the studies, the seed and each study's sizes and subsets:\n"
    "  seed = 1\n"
    '  studies = ["formats", "granularity", "accumulation", "training"]\n'
    "  [granularity]\n"
    "  shape = [256, 2048]\n"
    '  granularities = ["tensor", "1x128", "128x128", "mx32"]\n'
    "  [training]\n"
    '  recipes = ["bf16", "deepseek-v3"]\n'
    "  steps = 100\n"
    "Sections and options: rounding (formats, modes, samples); granularity (shape, formats,\n"
    "distributions, granularities); accumulation (k_max, size, distributions, recipes);\n"
    "tensorcore (captures: a folder of .npz captures); training (recipes, steps, fidelity).\n"
    "Studies: formats, rounding, granularity, accumulation, tensorcore, training.\n"
    "The config, --out and every value are checked before any study runs (exit code 2).\n"
    "An existing report in --out is replaced only with --force, and only once the new one is\n"
    "complete; Ctrl-C (exit code 130) or a failure leaves --out as it was.",
)
def _report(args) -> int:
    from . import report

    try:
        config = report.load_config(args.config) if args.config else None
    except report.ConfigError as e:
        raise UsageError(str(e)) from None
    if args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {args.jobs}")
    try:
        report.check_out_dir(args.out, overwrite=args.force)
    except report.OutputError as e:
        raise UsageError(f"--out: {e}") from None
    try:
        summary = report.build(
            args.out,
            quick=args.quick,
            progress=progress_enabled(args),
            config=config,
            jobs=args.jobs,
            overwrite=args.force,
        )
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted; {args.out} was left as it was (no partial report written)") from None
    if args.json:
        emit_json(summary)
    elif not args.quiet:
        print(f"wrote {summary['index']}")
    return 0


@_report.arguments
def _report_args(p):
    p.add_argument(
        "--out",
        default="report",
        help="output folder (default ./report); missing or empty, or an earlier report with --force. The report "
        "is built in a hidden sibling folder and renamed into place once complete: an interrupted or failed run "
        "leaves --out as it was",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an earlier report in --out (only a folder holding an fp8sim report is ever replaced)",
    )
    p.add_argument("--quick", action="store_true", help="smaller studies (under 2 minutes on 2 cores)")
    p.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help="TOML or JSON file choosing studies, seed and study options (see below)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="worker processes for the studies (default: up to 2; 1 runs them in this process)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.add_argument("--json", action="store_true", help="print summary.json to stdout")


# --------------------------------------------------------------- verify
@command(
    "verify",
    "score the tensor-core emulator against hardware capture files (.npz)",
    "examples:\n  fp8sim verify tests/data/wgmma_e4m3xe4m3_normal.npz\n"
    "  fp8sim verify tests/data/*.npz --json\n"
    "  fp8sim verify capture.npz --model mma.sync   # score another model\n"
    "Every output is compared as a float32 bit pattern, NaN sign and payload included.\n"
    "Scores single-instruction captures, chained tile loops and probe captures; other\n"
    "hardware captures (the GEMM oracle's gemm_sm90.npz, the cvt sweep) are listed as\n"
    "skipped with the command that checks them.  A summary table ends the output.\n"
    "Exit code 0 when every scored output matches bit for bit (and at least one was\n"
    "scored), 1 when any output differs or any file cannot be read or scored (each such\n"
    "file is named with the reason), 2 for bad usage such as an unknown --model.",
)
def _verify(args) -> int:
    from . import tensorcore
    from ._json import dumps

    model = None
    if args.model:  # unknown name: exit 2; without --arch, the preset on each capture's own arch
        model = tensorcore.get_model(args.model, args.arch) if args.arch else args.model
        if args.arch is None and args.model.strip().lower() not in {i for _, i in tensorcore.PRESETS}:
            tensorcore.get_model(args.model)  # raises UnknownNameError with the close matches
    rows = []
    for path in args.files:
        row: dict = {"file": path, "status": "error", "kind": None, "instruction": None, "formats": None}
        row.update(n=0, mismatches=0, match_rate=None, first_mismatches=[], reason=None)
        try:
            r = tensorcore.verify_capture(path, model=model)
        except tensorcore.NotTensorCoreCaptureError as e:
            row.update(status="skipped", kind=e.kind, reason=str(e).removeprefix(f"{path}: "))
        except Exception as e:  # noqa: BLE001 - one bad file must not hide the others' scores
            msg = str(e) if isinstance(e, (ValueError, TypeError, OSError)) else f"{type(e).__name__}: {e}"
            row["reason"] = msg.removeprefix(f"{path}: ")
        else:
            meta = r["meta"]
            fmts = meta.get("formats")
            row.update(
                status="bit-exact" if r["mismatches"] == 0 else "mismatch",
                kind=r["kind"],
                instruction=(model if isinstance(model, str) else model.name)
                if model is not None
                else meta.get("instruction"),
                formats=", ".join(fmts) if isinstance(fmts, list) else f"{meta.get('a_format')}x{meta.get('b_format')}",
                n=r["n"],
                mismatches=r["mismatches"],
                match_rate=r["match_rate"],
                first_mismatches=r["first_mismatches"],
            )
        rows.append(row)
        if not args.json:
            _verify_print_row(row)
    count = {s: sum(r["status"] == s for r in rows) for s in ("bit-exact", "mismatch", "skipped", "error")}
    n = sum(r["n"] for r in rows)
    bad = sum(r["mismatches"] for r in rows)
    ok = bad == 0 and count["error"] == 0 and count["mismatch"] == 0 and n > 0
    if args.json:
        print(dumps({"files": rows, "n": n, "mismatches": bad, **count, "ok": ok}))
        return 0 if ok else 1
    print()
    print("summary:")
    width = max(len(r["file"]) for r in rows)
    for r in rows:
        if r["status"] in ("bit-exact", "mismatch"):
            score = f"{r['n'] - r['mismatches']}/{r['n']}"
        else:
            score = f"({r['kind']} capture)" if r["status"] == "skipped" else "(see above)"
        print(f"  {r['file']:<{width}}  {r['status']:<9}  {score}")
    print(
        f"total: {n - bad}/{n} outputs bit-exact in {count['bit-exact'] + count['mismatch']} files; "
        f"{count['mismatch']} with mismatches, {count['skipped']} skipped, {count['error']} not readable or not scored"
    )
    if n == 0:
        print("no outputs were scored: nothing is verified")
    return 0 if ok else 1


def _verify_print_row(r: dict) -> None:
    if r["status"] in ("bit-exact", "mismatch"):
        print(
            f"{r['file']}: {r['instruction']} {r['formats']}: {r['n'] - r['mismatches']}/{r['n']} "
            f"bit-exact ({100 * r['match_rate']:.4f} %)"
        )
        for m in r["first_mismatches"]:
            print(f"    {m['output']}{list(m['index'])}: hardware {m['hardware_bits']} model {m['model_bits']}")
    else:
        print(f"{r['file']}: {'skipped' if r['status'] == 'skipped' else 'ERROR'}: {r['reason']}")


@_verify.arguments
def _verify_args(p):
    p.add_argument(
        "files", nargs="+", help="capture files written by python -m gpu.capture (or gpu.characterize --save)"
    )
    p.add_argument("--model", default=None, help="accumulator model to score (default: the capture's instruction)")
    p.add_argument("--arch", default=None, help="architecture of the --model preset (default: each capture's own arch)")
    p.add_argument("--json", action="store_true", help='machine-readable output (strict JSON: NaN written as "nan")')


# ------------------------------------------------------------- quantize
def load_float_npy(path: str, dtype: str | None = None) -> np.ndarray:
    """The array of a ``.npy`` file, under the input rule of the API (:mod:`fp8sim._inputs`):
    float32, float64, float16 or bfloat16, else :class:`UsageError` naming the dtype.

    numpy saves an ``ml_dtypes.bfloat16`` array as raw 2-byte records (descr ``'<V2'``; loaded
    as ``|V2``), which cannot be told apart from other 2-byte records: ``dtype="bfloat16"``
    (``--dtype bfloat16``) reads them as bfloat16; without it such a file is refused with a
    message that says so.
    """
    import ml_dtypes

    from ._inputs import ACCEPTED, float_input

    x = np.load(path, allow_pickle=False)
    raw2 = x.dtype.kind == "V" and x.dtype.itemsize == 2 and x.dtype.fields is None
    if dtype is not None:
        if str(dtype).strip().lower() not in ("bfloat16", "bf16"):
            raise UsageError(f"--dtype must be bfloat16 (the only dtype numpy saves as raw records), got {dtype!r}")
        if raw2:
            x = x.view(ml_dtypes.bfloat16)
        elif x.dtype != np.dtype(ml_dtypes.bfloat16):
            raise UsageError(f"--dtype bfloat16: {path} holds {x.dtype}, not raw 2-byte (bfloat16) records")
    elif raw2:
        raise UsageError(
            f"{path} holds raw 2-byte records ({x.dtype}), which is how numpy saves an ml_dtypes.bfloat16 "
            "array; if it is bfloat16, pass --dtype bfloat16"
        )
    try:
        float_input(x, path)
    except TypeError:
        raise UsageError(
            f"{path} holds {x.dtype}; fp8sim quantizes {ACCEPTED} arrays "
            "(convert it explicitly, e.g. np.save(path, x.astype(np.float32)))"
        ) from None
    return x


def _npz_name(path: str) -> str:
    """``path`` as ``np.savez`` names it: ``.npz`` appended when missing."""
    return path if path.lower().endswith(".npz") else path + ".npz"


def _quantize_one(args, x: np.ndarray, q) -> dict:
    """The metrics of one quantization ``q`` of ``x`` (and its ``.npz`` when ``--out`` is given)."""
    from . import metrics

    summ = metrics.summary(x, q, mode=args.mode, progress=progress_enabled(args))
    res = {
        "file": args.file,
        "shape": list(x.shape),
        "dtype": str(x.dtype),
        "format": q.format.name,
        "granularity": q.granularity.name,
        "scale_format": q.scale_format,
        "scales_shape": list(q.scales.shape),
        "n": summ["n"],
        "n_nan": summ["n_nan"],
        "n_inf": summ["n_inf"],
        "sqnr_db": summ["sqnr_db"],
        "rel_frobenius_error": summ["rel_frobenius"],
        "max_rel_error": summ["max_rel_error"],
        "max_rel_error_excl_underflow": summ["max_rel_error_excl_underflow"],
        "fraction_saturated": summ["fraction_saturated"],
        "fraction_underflow": summ["fraction_underflow"],
        "fraction_subnormal": summ["fraction_subnormal"],
    }
    if args.out:
        path = args.out
        settings = {
            "format": q.format.name,
            "granularity": q.granularity.name,
            "scale_format": q.scale_format,
            "scale_rounding": q.scale_rounding,
            "mode": args.mode,
            "saturate": not args.no_saturate,
            "margin": args.margin,
        }
        np.savez_compressed(
            path,
            codes=q.codes,
            scales=q.scales,
            amax=q.amax,
            global_scale=np.float64(q.global_scale),
            block_shape=np.asarray(q.block_shape, dtype=np.int64),
            shape=np.asarray(q.shape, dtype=np.int64),
            dtype=np.str_(str(np.dtype(q.dtype))),
            format=np.str_(q.format.name),
            granularity=np.str_(q.granularity.name),
            scale_format=np.str_(q.scale_format),
            scale_rounding=np.str_(q.scale_rounding or "none"),
            mode=np.str_(args.mode),
            saturate=np.bool_(not args.no_saturate),
            margin=np.int64(args.margin),
            settings=json.dumps(settings),
        )
        res["out"] = path
    return res


@command(
    "quantize",
    "quantize a tensor from a .npy file with a scaling granularity and report the error",
    "examples:\n  fp8sim quantize acts.npy --format e4m3 --granularity 1x128\n"
    "  fp8sim quantize acts.npy --granularity tensor,1x128,128x128,mx32   # one result per granularity\n"
    "  fp8sim quantize grads.npy --format e5m2 --granularity mx32 --out grads_q.npz --json\n"
    "--out writes a .npz (the suffix is added when missing) with everything needed to rebuild\n"
    "the values: codes, scales (float32), amax, global_scale, block_shape, shape, dtype, format,\n"
    "granularity, scale_format, scale_rounding, mode, saturate, margin.  Rebuild them exactly\n"
    "(the values fp8sim's dequantize gives) with numpy:\n"
    "  z = np.load('q.npz'); s = z['scales'].astype(np.float64)\n"
    "  for ax, b in enumerate(z['block_shape']): s = np.repeat(s, b, axis=ax)\n"
    "  s = s[tuple(slice(0, n) for n in z['shape'])] * float(z['global_scale'])\n"
    "  y = fp8sim.decode(z['codes'], str(z['format'])).astype(np.float64) * s\n"
    "Metrics: sqnr_db in dB; rel_frobenius_error = ||y - x|| / ||x||; max_rel_error =\n"
    "max |y - x| / |x| over x != 0 as a ratio (1.0 = 100 %; an element flushed to zero gives\n"
    "exactly 1, max_rel_error_excl_underflow leaves those out); a NaN output where x is not NaN\n"
    "is an infinite error (n_nan counts NaN outputs); fraction_saturated: elements the\n"
    "conversion clipped (rounded beyond the format's max).",
)
def _quantize(args) -> int:
    from .scaling import quantize

    _check_in_file(args.file, "input", (".npy",))
    grans = _granularity_list(args.granularity, "--granularity")
    if args.out:
        if len(grans) > 1:
            raise UsageError("--out writes one quantized tensor: give one --granularity, not a list")
        if os.path.isdir(args.out):
            raise UsageError(f"--out {args.out} is a folder; give a file name")
        args.out = _check_out_file(_npz_name(args.out), "--out", force=args.force, suffixes=(".npz",))
    if _lookup_mode(args.mode) == "sr" and args.seed is None:
        raise UsageError("--mode sr needs --seed N (stochastic rounding is reproducible from its seed)")
    fmt = args.format
    if fmt is None:  # NVFP4 is defined with E2M1 elements; everything else defaults to E4M3
        fmt = "e2m1" if all(g.lower() == "nvfp4" for g in grans) else "e4m3"
    _lookup_format(fmt)
    x = load_float_npy(args.file, args.dtype)
    if x.ndim == 0:
        raise UsageError(f"input {args.file} holds a scalar (shape ()); quantize needs an array of 1 or more dims")
    opts = dict(mode=args.mode, seed=args.seed, saturate=not args.no_saturate, margin=args.margin)
    for g in grans:  # every setting checked on a one-element tensor of x's rank, before any work
        try:
            quantize(np.ones((1,) * x.ndim, dtype=x.dtype), fmt, g, **opts)
        except (ValueError, TypeError) as e:
            raise UsageError(f"--granularity {g} with --format {fmt}: {e}") from None
    # what fails now is the data's (e.g. NaN in a format without NaN): exit 1, not a usage error
    results = [_quantize_one(args, x, quantize(x, fmt, g, **opts)) for g in grans]
    if args.json:
        emit_json(results[0] if len(results) == 1 else results)
        return 0
    units = {
        "sqnr_db": "dB",
        "rel_frobenius_error": "||y - x|| / ||x||",
        "max_rel_error": "max |y - x| / |x| over x != 0; 1 = an element flushed to zero",
        "max_rel_error_excl_underflow": "the same without the flushed elements",
        "fraction_saturated": "of the elements, clipped by the conversion",
        "fraction_underflow": "of the elements, nonzero flushed to zero",
        "fraction_subnormal": "of the codes",
        "n_nan": "NaN outputs (each an infinite error)",
        "n_inf": "infinite outputs",
    }
    for i, res in enumerate(results):
        if i:
            print()
        for k, v in res.items():
            note = f"  ({units[k]})" if k in units else ""
            print(f"{k:>28}: {_fmt_value(v)}{note}")
    return 0


@_quantize.arguments
def _quantize_args(p):
    p.add_argument("file", help="a .npy file with a float32, float64, float16 or bfloat16 array (1 or more dims)")
    p.add_argument(
        "--dtype",
        default=None,
        choices=["bfloat16"],
        help="read the file's raw 2-byte records as bfloat16 (numpy saves ml_dtypes.bfloat16 arrays so)",
    )
    p.add_argument(
        "-f", "--format", default=None, help="element format (default e4m3; e2m1 when every granularity is nvfp4)"
    )
    p.add_argument(
        "-g",
        "--granularity",
        default="tensor",
        help="one granularity or a comma list (tensor,1x128,mx32): tensor, row, col, 1xN, NxN, gN, mxN, "
        "nvfp4, delayed (default tensor, as fp8sim.quantize)",
    )
    p.add_argument("-m", "--mode", default="rne", help="element rounding mode (default rne)")
    p.add_argument("--seed", type=_seed_type, default=None, help="seed for --mode sr (required with it)")
    p.add_argument("--margin", type=int, default=0, help="scale margin in powers of two (default 0)")
    p.add_argument("--no-saturate", action="store_true", help="overflow to inf/NaN instead of clamping")
    p.add_argument(
        "--out",
        default=None,
        help="write codes, scales and everything needed to rebuild the values to this .npz "
        "(.npz is appended when missing; see below)",
    )
    p.add_argument("--force", action="store_true", help="replace an existing --out file")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.add_argument("--json", action="store_true", help="machine-readable output")


# ---------------------------------------------------------------- study
STUDIES = {"granularity": "fp8sim.studies.granularity", "accumulation": "fp8sim.studies.accumulation"}


@command(
    "study",
    "run one study (granularity, accumulation) and write figures and CSV",
    "examples:\n  fp8sim study granularity --out out/granularity --quick\n"
    "  fp8sim study accumulation --out out/accumulation --json",
)
def _study(args) -> int:
    import importlib

    try:
        mod = importlib.import_module(STUDIES[args.name])
    except ModuleNotFoundError:
        raise UsageError(f"the {args.name} study is not available in this version") from None
    _check_out_dir(args.out, force=args.force, writes=(f"{args.name}_study.csv",))
    res = mod.run(args.out, quick=args.quick, progress=progress_enabled(args), seed=args.seed)
    summary = {
        "study": args.name,
        "out": args.out,
        "csv": res.get("csv"),
        "figures": res.get("figures"),
        "seconds": res.get("seconds"),
        # the numbers themselves, not only where they were written
        "headline": res.get("headline") if "headline" in res else res.get("key"),  # tuple keys: "a/b" in JSON
        "rows": res.get("rows"),
    }
    if args.json:
        emit_json(summary)
    elif not args.quiet:
        print(
            f"{args.name} study: wrote {res.get('csv')} and {len(res.get('figures') or [])} figures "
            f"in {args.out} ({res.get('seconds', 0):.1f} s)"
        )
    return 0


@_study.arguments
def _study_args(p):
    p.add_argument("name", choices=sorted(STUDIES), help="which study")
    p.add_argument("--out", default="out", help="output folder (default ./out)")
    p.add_argument("--force", action="store_true", help="replace the study's CSV and figures from an earlier run")
    p.add_argument("--quick", action="store_true", help="smaller tensors (seconds)")
    p.add_argument("--seed", type=_seed_type, default=0, help="seed of the synthetic tensors (default 0)")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.add_argument("--json", action="store_true", help="machine-readable summary")


# ---------------------------------------------------------------- sweep
def _csv_list(text: str, cast=str, option: str = "list") -> list:
    """The comma-separated entries of ``text`` (blanks dropped); a usage error naming ``option`` when
    an entry does not convert or none is left."""
    items = [v.strip() for v in text.split(",") if v.strip()]
    if not items:
        raise UsageError(f"{option}: expected a comma-separated list, got {text!r}")
    try:
        return [cast(v) for v in items]
    except ValueError as e:
        raise UsageError(f"{option}: bad entry in {text!r}: {e}") from None


def _size(text: str, option: str = "--sizes") -> tuple[int, int]:
    """``ROWSxCOLS`` as two positive ints."""
    try:
        m, n = text.lower().split("x")
        m_, n_ = int(m), int(n)
    except ValueError:
        raise UsageError(f"{option}: sizes are ROWSxCOLS, e.g. 256x1024; got {text!r}") from None
    if m_ < 1 or n_ < 1:
        raise UsageError(f"{option}: sizes must be positive, got {text!r}")
    return m_, n_


SWEEP_CSV = "sweep_granularity.csv"


@command(
    "sweep",
    "run a configurations x seeds x sizes sweep serially or on a dask cluster",
    "examples:\n  fp8sim sweep granularity --seeds 0,1,2 --out out/sweep\n"
    "  fp8sim sweep granularity --scheduler serial --quiet --json\n"
    "  fp8sim sweep granularity --scheduler tcp://scheduler:8786 --sizes 1024x4096,4096x4096\n"
    "One task per distribution x format x granularity x seed x size; each writes one row of\n"
    f"OUT/{SWEEP_CSV}. The rows are the same whichever scheduler runs them (each task seeds itself).\n"
    "Every option, --out and the scheduler's address are checked before any task starts (exit code 2).",
)
def _sweep(args) -> int:
    import csv

    from . import sweep
    from .studies.granularity import DISTRIBUTIONS

    dists = _csv_list(args.distributions, option="--distributions")
    for d in dists:
        if d not in DISTRIBUTIONS:
            raise unknown_name_error("distribution", d, DISTRIBUTIONS, where="--distributions")
    fmts = []
    for f in _csv_list(args.formats, option="--formats"):
        fmt = _lookup_format(f, "--formats")
        if not fmt.signed or fmt.bits > 16:
            raise UsageError(
                f"--formats: {fmt.name} cannot hold quantized elements (a signed format of at most 16 bits, "
                "e.g. e4m3, e5m2, e2m1, bf16)"
            )
        fmts.append(fmt.name)
    grans = _granularity_list(args.granularities, "--granularities")
    seeds = _csv_list(args.seeds, int, option="--seeds")
    if any(sd < 0 for sd in seeds):
        raise UsageError(f"--seeds: seeds must be integers >= 0, got {args.seeds!r}")
    sizes = [_size(sz) for sz in _csv_list(args.sizes, option="--sizes")]
    if args.workers is not None and args.scheduler != "local":
        raise UsageError("--workers sizes the LocalCluster; it applies only to --scheduler local")
    try:
        scheduler = sweep.check_scheduler(args.scheduler)
    except ValueError as e:
        raise UsageError(f"--scheduler: {e}") from None
    if args.connect_timeout <= 0:
        raise UsageError(f"--connect-timeout must be positive, got {args.connect_timeout}")
    _check_out_dir(args.out, force=args.force, writes=(SWEEP_CSV,))
    params = sweep.granularity_params(dists, fmts, grans, seeds, sizes)
    try:
        rows = sweep.run(
            sweep.granularity_task,
            params,
            scheduler=scheduler,
            workers=args.workers,
            progress=progress_enabled(args),
            connect_timeout=args.connect_timeout,
        )
    except sweep.SchedulerError as e:
        raise UsageError(f"--scheduler: {e}") from None
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, SWEEP_CSV)
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    if args.json:
        emit_json({"csv": path, "tasks": len(rows), "scheduler": scheduler, "rows": rows})
    elif not args.quiet:
        print(f"{len(rows)} tasks ({scheduler}): wrote {path}")
    return 0


@_sweep.arguments
def _sweep_args(p):
    from .studies.granularity import DISTRIBUTIONS

    p.formatter_class = _DefaultsFormatter
    p.add_argument("name", choices=["granularity"], help="which sweep")
    p.add_argument(
        "--distributions",
        default="gaussian,outlier_channels,lognormal_grad",
        help=f"comma-separated synthetic tensors, of: {', '.join(DISTRIBUTIONS)}",
    )
    p.add_argument("--formats", default="e4m3,e5m2", help="comma-separated element formats")
    p.add_argument(
        "--granularities",
        default="tensor,1x128,128x128,mx32",
        help="comma-separated granularities: tensor, row, col, 1xN, RxC, gN, mxN, nvfp4, delayed",
    )
    p.add_argument("--seeds", default="0", help="comma-separated tensor seeds (integers >= 0)")
    p.add_argument("--sizes", default="256x1024", help="comma-separated tensor sizes ROWSxCOLS")
    p.add_argument(
        "--scheduler",
        default="local",
        help="'local' (a LocalCluster on this machine), 'serial' (this process), or a dask scheduler "
        "address such as tcp://host:8786",
    )
    p.add_argument(
        "--connect-timeout",
        type=float,
        default=10.0,
        help="seconds to wait for the scheduler at a --scheduler address before giving up",
    )
    p.add_argument(
        "--workers",
        type=_int_type("--workers", 1),
        default=None,
        help="LocalCluster worker processes (default: one per core)",
    )
    p.add_argument("--out", default="out", help=f"output folder, for {SWEEP_CSV}")
    p.add_argument("--force", action="store_true", help=f"replace an existing {SWEEP_CSV} in --out")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.add_argument("--json", action="store_true", help="print the rows as JSON (NaN and inf as strings)")


class _DefaultsFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Keep the epilog's line breaks and add each option's default to its help."""


# ---------------------------------------------------------------- train
@command(
    "train",
    "train a small LM with several recipes from the same start and compare the losses with BF16",
    "examples:\n  fp8sim train --out out/train\n"
    "  fp8sim train --recipes bf16,deepseek-v3,per-tensor --steps 100 --seed 1 --out out/t --json\n"
    "  fp8sim train --recipes bf16,deepseek-v3 --steps 20 --fidelity exact --out out/exact",
)
def _train(args) -> int:
    from .recipes import recipe as _get_recipe
    from .training.train import train

    names = [s.strip() for s in args.recipes.split(",") if s.strip()]
    if not names:
        raise UsageError("--recipes is empty")
    for n in names:
        try:
            _get_recipe(n)
        except ValueError as e:  # the message lists the known names
            raise UsageError(str(e)) from None
    if args.steps < 1:
        raise UsageError(f"--steps must be positive, got {args.steps}")
    _check_out_dir(args.out, force=args.force, writes=("summary.json", "losses.csv", "layer_stats.csv"))
    summary = train(names, args.steps, args.seed, args.out, fidelity=args.fidelity, progress=progress_enabled(args))
    summary.pop("results", None)
    if args.json:
        emit_json(summary)
        return 0
    if not args.quiet:
        print(f"{args.steps} steps, seed {args.seed}, fidelity {args.fidelity}, GEMMs: {summary['gemm_backend']}")
        print(
            f"{'recipe':<26}{'final loss':>11}{'val loss':>10}{'rel.err vs bf16':>17}{'underflow':>11}"
            f"{'non-finite':>11}{'s/step':>8}"
        )
        for name, r in summary["recipes"].items():
            rel = r["rel_loss_error_vs_bf16"]
            rel_s = "-" if rel is None else f"{100 * rel['mean_abs']:.3f} %"
            print(
                f"{name:<26}{r['final_loss']:>11.4f}{r['val_loss']:>10.4f}{rel_s:>17}"
                f"{100 * r['frac_underflow']:>10.3f}%{r['nonfinite_steps']:>11}{r['s_per_step']:>8.3f}"
            )
        print(
            f"(DeepSeek-V3 reports < {100 * summary['deepseek_v3_rel_loss_error_claim']:g} % against BF16; "
            f"rel.err: mean over the last 10 % of steps)"
        )
        print(
            f"wrote {args.out}/summary.json, losses.csv, layer_stats.csv and {len(summary.get('figures', []))} figures"
        )
    return 0


@_train.arguments
def _train_args(p):
    p.add_argument(
        "--recipes",
        default="bf16,deepseek-v3,per-tensor,per-tensor-no-promotion,te-hybrid",
        help="comma-separated recipe names (default: the five of the comparison; bf16 is the reference)",
    )
    p.add_argument("--steps", type=int, default=300, help="optimizer steps per recipe (default 300)")
    p.add_argument("--seed", type=_seed_type, default=0, help="initialization and data-order seed, >= 0 (default 0)")
    p.add_argument("--out", default="train_out", help="output folder (default ./train_out)")
    p.add_argument("--force", action="store_true", help="replace the results of an earlier run in --out")
    p.add_argument(
        "--fidelity",
        choices=("fast", "exact"),
        default="exact",
        help="GEMM accumulation: exact (default; bit-exact tensor-core model, fixed-order float64 sums "
        "elsewhere: the same numbers on every machine) or fast (float32 BLAS: machine-dependent)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.add_argument("--json", action="store_true", help="print summary.json to stdout")


# ----------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    """The ``fp8sim`` argument parser with every registered subcommand."""
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
    from . import __version__

    parser.add_argument("--version", action="version", version=f"fp8sim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (configure, _fn, help_, epilog) in COMMANDS.items():
        p = sub.add_parser(
            name, help=help_, description=help_, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        configure(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line on ``argv`` (default ``sys.argv[1:]``); return the exit code (0, 1 or 2)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    _configure, fn, _help, _epilog = COMMANDS[args.command]
    try:
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
