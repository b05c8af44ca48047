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

from ._json import json_default
from .formats import UnknownNameError

COMMANDS: dict[
    str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int], str, str]
] = {}


class UsageError(Exception):
    """Bad arguments: exit code 2."""


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
    """Print ``obj`` as indented JSON (numpy scalars and arrays converted)."""
    print(json.dumps(obj, indent=2, default=json_default))


def progress_enabled(args) -> bool:
    """Progress bars only on a terminal, and never with --quiet."""
    return not getattr(args, "quiet", False) and sys.stderr.isatty()


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
        fmts = [formats.format(args.name)]
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
    from . import formats, rounding

    fmt = formats.format(args.format)
    try:
        x = np.array([float(v) for v in args.values], dtype=np.float64)
    except ValueError as e:
        raise UsageError(f"values must be numbers: {e}") from None
    kw = dict(saturate=args.saturate, flush_subnormals=args.flush_subnormals, seed=args.seed, sr_bits=args.sr_bits)
    y = rounding.round(x, fmt, args.mode, **kw)
    codes = rounding.encode(x, fmt, args.mode, **kw) if fmt.nan.value != "none" or not np.isnan(x).any() else None
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
    p.add_argument("--seed", type=int, default=None, help="seed for --mode sr")
    p.add_argument("--sr-bits", type=int, default=None, help="random bits for --mode sr")
    p.add_argument("--json", action="store_true", help="machine-readable output")


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
    "Studies: formats, rounding, granularity, accumulation, tensorcore, training.",
)
def _report(args) -> int:
    from . import report

    try:
        config = report.load_config(args.config) if args.config else None
    except report.ConfigError as e:
        raise UsageError(str(e)) from None
    if args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {args.jobs}")
    summary = report.build(args.out, quick=args.quick, progress=progress_enabled(args), config=config, jobs=args.jobs)
    if args.json:
        emit_json(summary)
    elif not args.quiet:
        print(f"wrote {summary['index']}")
    return 0


@_report.arguments
def _report_args(p):
    p.add_argument("--out", default="report", help="output folder (default ./report)")
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
    "Exit code 0 when every output matches bit for bit, 1 otherwise.",
)
def _verify(args) -> int:
    from . import tensorcore

    rows = []
    for path in args.files:
        r = tensorcore.verify_capture(path, model=args.model)
        rows.append(
            {
                "file": path,
                "instruction": args.model or r["meta"].get("instruction"),
                "formats": f"{r['meta'].get('a_format')}x{r['meta'].get('b_format')}",
                "n": r["n"],
                "mismatches": r["mismatches"],
                "match_rate": r["match_rate"],
                "first_mismatches": r["first_mismatches"],
            }
        )
    bad = sum(r["mismatches"] for r in rows)
    if args.json:
        emit_json({"files": rows, "mismatches": bad, "n": sum(r["n"] for r in rows)})
    else:
        for r in rows:
            print(
                f"{r['file']}: {r['instruction']} {r['formats']}: {r['n'] - r['mismatches']}/{r['n']} "
                f"bit-exact ({100 * r['match_rate']:.4f} %)"
            )
            for m in r["first_mismatches"]:
                print(f"    {m['output']}{list(m['index'])}: hardware {m['hardware_bits']} model {m['model_bits']}")
        print(f"total: {sum(r['n'] for r in rows) - bad}/{sum(r['n'] for r in rows)} outputs bit-exact")
    return 0 if bad == 0 else 1


@_verify.arguments
def _verify_args(p):
    p.add_argument("files", nargs="+", help="capture files written by python -m gpu.capture")
    p.add_argument("--model", default=None, help="accumulator model to score (default: the capture's instruction)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


# ------------------------------------------------------------- quantize
@command(
    "quantize",
    "quantize a tensor from a .npy file with a scaling granularity and report the error",
    "examples:\n  fp8sim quantize acts.npy --format e4m3 --granularity 1x128\n"
    "  fp8sim quantize grads.npy --format e5m2 --granularity mx32 --out grads_q.npz --json\n"
    "The .npz holds codes, scales, amax and the settings; fp8sim.dequantize needs the\n"
    "QuantizedTensor, so reload with numpy and multiply decode(codes) by the expanded scales.",
)
def _quantize(args) -> int:
    import os

    from . import metrics
    from .scaling import quantize

    if not os.path.exists(args.file):
        raise FileNotFoundError(f"no such file: {args.file}")
    x = np.load(args.file, allow_pickle=False)
    if x.dtype not in (np.float32, np.float64):
        raise UsageError(
            f"{args.file} holds {x.dtype}; fp8sim quantizes float32 or float64 arrays "
            "(convert it explicitly, e.g. np.save(path, x.astype(np.float32)))"
        )
    q = quantize(
        x,
        args.format,
        args.granularity,
        mode=args.mode,
        seed=args.seed,
        saturate=not args.no_saturate,
        margin=args.margin,
    )
    y = q.dequantize()
    res = {
        "file": args.file,
        "shape": list(x.shape),
        "dtype": str(x.dtype),
        "format": q.format.name,
        "granularity": q.granularity.name,
        "scale_format": q.scale_format,
        "scales_shape": list(q.scales.shape),
        "sqnr_db": float(metrics.sqnr_db(x, y)),
        "rel_frobenius_error": float(metrics.rel_frobenius_error(x, y)),
        "max_rel_error": float(metrics.max_rel_error(x, y)),
        "fraction_saturated": float(metrics.fraction_saturated(x, q)),
        "fraction_underflow": float(metrics.fraction_underflow(x, y)),
    }
    if args.out:
        np.savez_compressed(
            args.out,
            codes=q.codes,
            scales=q.scales,
            amax=q.amax,
            settings=json.dumps({k: res[k] for k in ("format", "granularity", "scale_format")}),
        )
        res["out"] = args.out
    if args.json:
        emit_json(res)
    else:
        for k, v in res.items():
            print(f"{k:>22}: {_fmt_value(v)}")
    return 0


@_quantize.arguments
def _quantize_args(p):
    p.add_argument("file", help="a .npy file with a float32/float64 array (1 or more dims)")
    p.add_argument("-f", "--format", default="e4m3", help="element format (default e4m3)")
    p.add_argument(
        "-g",
        "--granularity",
        default="1x128",
        help="tensor, row, col, 1xN, NxN, gN, mxN, nvfp4, delayed (default 1x128)",
    )
    p.add_argument("-m", "--mode", default="rne", help="element rounding mode (default rne)")
    p.add_argument("--seed", type=int, default=None, help="seed for --mode sr")
    p.add_argument("--margin", type=int, default=0, help="scale margin in powers of two")
    p.add_argument("--no-saturate", action="store_true", help="overflow to inf/NaN instead of clamping")
    p.add_argument("--out", default=None, help="write codes and scales to this .npz")
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
    res = mod.run(args.out, quick=args.quick, progress=progress_enabled(args), seed=args.seed)
    summary = {
        "study": args.name,
        "out": args.out,
        "csv": res.get("csv"),
        "figures": res.get("figures"),
        "seconds": res.get("seconds"),
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
    p.add_argument("--quick", action="store_true", help="smaller tensors (seconds)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.add_argument("--json", action="store_true", help="machine-readable summary")


# ---------------------------------------------------------------- sweep
def _csv_list(text: str, cast=str) -> list:
    try:
        return [cast(v) for v in text.split(",") if v.strip()]
    except ValueError as e:
        raise UsageError(f"bad list {text!r}: {e}") from None


def _size(text: str) -> tuple[int, int]:
    try:
        m, n = text.lower().split("x")
        return int(m), int(n)
    except ValueError:
        raise UsageError(f"sizes are ROWSxCOLS, e.g. 256x1024; got {text!r}") from None


@command(
    "sweep",
    "run a configurations x seeds x sizes sweep serially or on a dask cluster",
    "examples:\n  fp8sim sweep granularity --seeds 0,1,2 --out out/sweep\n"
    "  fp8sim sweep granularity --scheduler serial --quiet --json\n"
    "  fp8sim sweep granularity --scheduler tcp://scheduler:8786 --sizes 1024x4096,4096x4096\n"
    "The rows are the same whichever scheduler runs them (each task seeds itself).",
)
def _sweep(args) -> int:
    import csv
    import os

    from . import formats, sweep
    from .scaling import granularity as _granularity
    from .studies.granularity import DISTRIBUTIONS

    dists = _csv_list(args.distributions)
    bad = [d for d in dists if d not in DISTRIBUTIONS]
    if bad:
        raise UsageError(f"unknown distribution(s) {', '.join(bad)}; known: {', '.join(DISTRIBUTIONS)}")
    fmts = [formats.format(f).name for f in _csv_list(args.formats)]
    grans = _csv_list(args.granularities)
    for g in grans:
        _granularity(g)  # raises with the list of known names
    params = sweep.granularity_params(
        dists, fmts, grans, _csv_list(args.seeds, int), [_size(s) for s in _csv_list(args.sizes)]
    )
    rows = sweep.run(
        sweep.granularity_task, params, scheduler=args.scheduler, workers=args.workers, progress=progress_enabled(args)
    )
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "sweep_granularity.csv")
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    if args.json:
        emit_json({"csv": path, "tasks": len(rows), "scheduler": args.scheduler, "rows": rows})
    elif not args.quiet:
        print(f"{len(rows)} tasks ({args.scheduler}): wrote {path}")
    return 0


@_sweep.arguments
def _sweep_args(p):
    p.add_argument("name", choices=["granularity"], help="which sweep")
    p.add_argument("--distributions", default="gaussian,outlier_channels,lognormal_grad")
    p.add_argument("--formats", default="e4m3,e5m2")
    p.add_argument("--granularities", default="tensor,1x128,128x128,mx32")
    p.add_argument("--seeds", default="0")
    p.add_argument("--sizes", default="256x1024", help="comma-separated ROWSxCOLS")
    p.add_argument(
        "--scheduler",
        default="local",
        help="'local' (a LocalCluster on this machine, default), 'serial', or a dask scheduler "
        "address such as tcp://host:8786",
    )
    p.add_argument("--workers", type=int, default=None, help="LocalCluster workers (default: one per core)")
    p.add_argument("--out", default="out", help="output folder")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--json", action="store_true")


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
    p.add_argument("--seed", type=int, default=0, help="initialization and data-order seed (default 0)")
    p.add_argument("--out", default="train_out", help="output folder (default ./train_out)")
    p.add_argument(
        "--fidelity",
        choices=("fast", "exact"),
        default="fast",
        help="GEMM accumulation: fast (float32 BLAS partials) or exact (bit-exact tensor-core model)",
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
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"fp8sim {args.command}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
