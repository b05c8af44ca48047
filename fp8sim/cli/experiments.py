"""Commands that run studies and write folders of results: ``report``, ``study``, ``sweep`` and
``train``."""

from __future__ import annotations

import os
import textwrap

from .. import report, sweep
from ..studies import STUDY_NAMES, study
from ..studies import granularity as granularity_study
from .common import (
    GRANULARITY_FORMS,
    DefaultsFormatter,
    Interrupted,
    UsageError,
    check_out_dir,
    command,
    csv_list,
    emit_json,
    granularity_list,
    int_type,
    lookup_format,
    option_errors,
    progress_enabled,
    seed_type,
)

__all__ = ["SWEEP_CSV", "TRAIN_FILES"]

#: the files ``fp8sim train`` writes into --out (besides its figures)
TRAIN_FILES = ("summary.json", "losses.csv", "layer_stats.csv")


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
    + textwrap.fill(
        "Sections and options: "
        + "; ".join(f"{sec} ({', '.join(opts)})" for sec, opts in report.OPTIONS.items() if sec)
        + "; the captures are a folder of .npz files.",
        90,
    )
    + f"\nStudies: {', '.join(report.STUDY_IDS)}.\n"
    "The config, --out and every value are checked before any study runs (exit code 2).\n"
    "An existing report in --out is replaced only with --force, and only once the new one is\n"
    "complete; Ctrl-C (exit code 130) or a failure leaves --out as it was.",
)
def _report(args) -> int:
    try:
        config = report.load_config(args.config) if args.config else None
    except report.ConfigError as e:
        raise UsageError(str(e)) from None
    if args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {args.jobs}")
    check_out_dir(args.out, force=args.force)
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


# ---------------------------------------------------------------- study
@command(
    "study",
    f"run one study ({', '.join(STUDY_NAMES)}) and write figures and CSV",
    "examples:\n  fp8sim study granularity --out out/granularity --quick\n"
    "  fp8sim study accumulation --out out/accumulation --json",
)
def _study(args) -> int:
    mod = study(args.name)
    check_out_dir(args.out, force=args.force, writes=(mod.CSV_NAME,))
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
    p.add_argument("name", choices=sorted(STUDY_NAMES), help="which study")
    p.add_argument("--out", default="out", help="output folder (default ./out)")
    p.add_argument("--force", action="store_true", help="replace the study's CSV and figures from an earlier run")
    p.add_argument("--quick", action="store_true", help="smaller tensors (seconds)")
    p.add_argument("--seed", type=seed_type, default=0, help="seed of the synthetic tensors (default 0)")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.add_argument("--json", action="store_true", help="machine-readable summary")


# ---------------------------------------------------------------- sweep
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
    dists = csv_list(args.distributions, option="--distributions")
    with option_errors("--distributions"):
        sweep.check_axis("distributions", dists)
    fmts = [lookup_format(f, "--formats").name for f in csv_list(args.formats, option="--formats")]
    with option_errors("--formats"):
        sweep.check_axis("formats", fmts)
    grans = granularity_list(args.granularities, "--granularities")
    seeds = csv_list(args.seeds, int, option="--seeds")
    with option_errors("--seeds"):
        sweep.check_axis("seeds", seeds)
    sizes = [_size(sz) for sz in csv_list(args.sizes, option="--sizes")]
    if args.workers is not None and args.scheduler != "local":
        raise UsageError("--workers sizes the LocalCluster; it applies only to --scheduler local")
    try:
        scheduler = sweep.check_scheduler(args.scheduler)
    except ValueError as e:
        raise UsageError(f"--scheduler: {e}") from None
    if args.connect_timeout <= 0:
        raise UsageError(f"--connect-timeout must be positive, got {args.connect_timeout}")
    check_out_dir(args.out, force=args.force, writes=(SWEEP_CSV,))
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
    path = report.write_csv(os.path.join(args.out, SWEEP_CSV), rows)
    if args.json:
        emit_json({"csv": path, "tasks": len(rows), "scheduler": scheduler, "rows": rows})
    elif not args.quiet:
        print(f"{len(rows)} tasks ({scheduler}): wrote {path}")
    return 0


class _SweepHelpFormatter(DefaultsFormatter):
    """:class:`DefaultsFormatter` that adds ``(default: ...)`` only where it tells something: not to a
    help that already states its default, nor for a default of None or a flag's False."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "(default" in text or action.default is None or action.default is False:
            return text
        return super()._get_help_string(action)


@_sweep.arguments
def _sweep_args(p):
    p.formatter_class = _SweepHelpFormatter
    p.add_argument("name", choices=["granularity"], help="which sweep")
    p.add_argument(
        "--distributions",
        default=",".join(sweep.DEFAULT_DISTRIBUTIONS),
        help=f"comma-separated synthetic tensors, of: {', '.join(granularity_study.DISTRIBUTIONS)}",
    )
    p.add_argument("--formats", default=",".join(sweep.DEFAULT_FORMATS), help="comma-separated element formats")
    p.add_argument(
        "--granularities",
        default=",".join(sweep.DEFAULT_GRANULARITIES),
        help=f"comma-separated granularities: {GRANULARITY_FORMS}",
    )
    p.add_argument(
        "--seeds", default=",".join(map(str, sweep.DEFAULT_SEEDS)), help="comma-separated tensor seeds (integers >= 0)"
    )
    p.add_argument(
        "--sizes",
        default=",".join(f"{m}x{n}" for m, n in sweep.DEFAULT_SIZES),
        help="comma-separated tensor sizes ROWSxCOLS",
    )
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
        type=int_type(1),
        default=None,
        help="LocalCluster worker processes (default: one per core)",
    )
    p.add_argument("--out", default="out", help=f"output folder, for {SWEEP_CSV}")
    p.add_argument("--force", action="store_true", help=f"replace an existing {SWEEP_CSV} in --out")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.add_argument("--json", action="store_true", help="print the rows as JSON (NaN and inf as strings)")


# ---------------------------------------------------------------- train
@command(
    "train",
    "train a small LM with several recipes from the same start and compare the losses with BF16",
    "examples:\n  fp8sim train --out out/train\n"
    "  fp8sim train --recipes bf16,deepseek-v3,per-tensor --steps 100 --seed 1 --out out/t --json\n"
    "  fp8sim train --recipes bf16,deepseek-v3 --steps 20 --fidelity exact --out out/exact",
)
def _train(args) -> int:
    from ..gemms.presets import recipe
    from ..training.train import DEFAULT_RECIPES, train

    if args.recipes is None:
        names = list(DEFAULT_RECIPES)
    else:
        names = [s.strip() for s in args.recipes.split(",") if s.strip()]
    if not names:
        raise UsageError("--recipes is empty")
    for n in names:
        with option_errors("--recipes"):  # the message lists the known names
            recipe(n)
    if getattr(args, "backend", "numpy") == "torch":
        if args.jobs != 1:
            raise UsageError("--jobs is for the numpy backend (the torch backend trains one recipe at a time)")
        from .train_torch import run as run_torch

        return run_torch(args, names)
    if args.steps < 1:
        raise UsageError(f"--steps must be positive, got {args.steps}")
    if args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {args.jobs}")
    check_out_dir(args.out, force=args.force, writes=TRAIN_FILES)
    summary = train(names, args.steps, args.seed, args.out, fidelity=args.fidelity, progress=progress_enabled(args),
                    jobs=args.jobs)  # fmt: skip
    summary.pop("results", None)
    if args.json:
        emit_json(summary)
        return 0
    if not args.quiet:
        print(f"{args.steps} steps, seed {args.seed}, fidelity {args.fidelity}")
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
        print(f"wrote {args.out}/{', '.join(TRAIN_FILES)} and {len(summary.get('figures', []))} figures")
    return 0


@_train.arguments
def _train_args(p):
    from .train_torch import add_arguments as torch_arguments

    torch_arguments(p)
    p.add_argument(
        "--recipes",
        default=None,
        help="comma-separated recipe names (default: the five of the comparison, "
        "fp8sim.training.train.DEFAULT_RECIPES; bf16 is the reference)",
    )
    p.add_argument("--steps", type=int, default=300, help="optimizer steps per recipe (default 300)")
    p.add_argument("--seed", type=seed_type, default=0, help="initialization and data-order seed, >= 0 (default 0)")
    p.add_argument("--out", default="train_out", help="output folder (default ./train_out)")
    p.add_argument("--force", action="store_true", help="replace the results of an earlier run in --out")
    p.add_argument(
        "--fidelity",
        choices=report.FIDELITIES,
        default="exact",
        help="GEMM accumulation: exact (default; bit-exact tensor-core model, fixed-order float64 sums "
        "elsewhere: the same numbers on every machine) or fast (float32 BLAS sums: machine-dependent, "
        "not bit-exact, and slower than exact for the recipes that promote partial sums)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="recipes trained at a time in worker processes (numpy backend; default 1: in this process). "
        "The results are the same for any value",
    )
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.add_argument("--json", action="store_true", help="print summary.json to stdout")
