"""The sections of ``fp8sim report``: one function per study.

Each is ``study_NAME(out_dir, quick, progress, opts) -> section``, where ``opts`` holds the
study's options from a report config and the seed, and a section is a dict with ``id``,
``title``, ``html`` (the body), ``figures`` and ``csv`` (paths) and ``numbers`` (the headline
numbers of ``summary.json``).  :data:`fp8sim.report.STUDIES` lists them (with the accelerators section) in the report's order.
"""

from __future__ import annotations

import csv
import html
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .. import formats, rounding
from .._names import unknown_name_error
from . import TABLE_COLUMNS

__all__ = [
    "MODES",
    "ROUNDING_FORMATS",
    "TRAINING_RECIPES",
    "TRAINING_RECIPES_QUICK",
    "write_csv",
    "html_table",
    "mode_errors",
    "capture_dir",
    "capture_set",
    "study_formats",
    "study_rounding",
    "study_granularity",
    "study_accumulation",
    "study_tensorcore",
    "study_training",
]

#: the rounding modes of the rounding study, in :data:`fp8sim.rounding.MODES` order
MODES = tuple(rounding.MODES)
ROUNDING_FORMATS = ("e4m3", "e5m2", "e3m4", "e2m1", "bf16")
#: the recipes of the report's training comparison (a full run, and ``quick``)
TRAINING_RECIPES = ("bf16", "deepseek-v3", "per-tensor", "per-tensor-no-promotion")
TRAINING_RECIPES_QUICK = ("bf16", "deepseek-v3")


def write_csv(path, rows: list[dict]) -> str:
    """Write ``rows`` (dicts with the same keys) as a CSV file with a header; return the path."""
    path = str(path)
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def html_table(rows: list[dict], columns: Sequence[str] | None = None) -> str:
    """An HTML table of ``rows`` (floats to 4 significant digits, text escaped); ``columns`` (keys of the
    rows, default all of the first row's) picks and orders the columns."""
    columns = list(columns or rows[0])
    for c in columns:
        if rows and c not in rows[0]:
            raise unknown_name_error("column", c, rows[0])

    def cell(v):
        if isinstance(v, float):
            return f"{v:.4g}"
        return html.escape(str(v))

    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{cell(r[c])}</td>" for c in columns) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


# ---------------------------------------------------------------- studies
def study_formats(out: Path, quick: bool, progress: bool, opts: dict) -> dict:
    """The format catalogue as a table (``formats.csv``)."""
    rows = [f.summary() for f in formats.CATALOGUE.values()]
    csv_path = write_csv(out / "formats.csv", [{c: r[c] for c in TABLE_COLUMNS} for r in rows])
    return {
        "id": "formats",
        "title": "Formats",
        "html": "<p>Every format of the catalogue (fp8sim.format(name)); properties mirror numpy.finfo.</p>"
        + html_table(rows, TABLE_COLUMNS),
        "figures": [],
        "csv": [csv_path],
        "numbers": {r["name"]: {"max": r["max"], "min_subnormal": r["min_subnormal"], "eps": r["eps"]} for r in rows},
    }


def mode_errors(names=ROUNDING_FORMATS, n: int = 200_000, seed: int = 0, modes=MODES) -> list[dict]:
    """Mean and maximum relative error and relative bias of each rounding mode on log-uniform data: ``n``
    magnitudes ``2**u``, ``u`` uniform in ``[max(log2(min_normal), log2(max) - 8), log2(max) - 0.5]`` (the
    binades just below each format's maximum, or its whole normal range where that is narrower), with
    random signs.  The errors are of the signed values; the bias,
    ``sum(round(|x|) - |x|) / sum(|x|)``, of the magnitudes (so a directed mode's bias keeps its sign)."""
    rng = np.random.default_rng(seed)
    rows = []
    for name in names:
        f = formats.format(name)
        # magnitudes spread over 8 binades well inside the normal range, random signs
        lo = max(np.log2(f.min_normal), np.log2(f.max) - 8)
        mag = 2.0 ** rng.uniform(lo, np.log2(f.max) - 0.5, n)
        x = (mag * rng.choice([-1.0, 1.0], n)).astype(np.float32)
        pos = np.abs(x).astype(np.float32)
        for mode in modes:
            y = rounding.round(pos, f, mode, seed=seed if mode == "sr" else None).astype(np.float64)
            ys = rounding.round(x, f, mode, seed=seed if mode == "sr" else None).astype(np.float64)
            rel = np.abs(ys - x) / np.abs(x)
            rows.append(
                {
                    "format": name,
                    "mode": mode,
                    "mean_rel_error": float(rel.mean()),
                    "max_rel_error": float(rel.max()),
                    "rel_bias": float((y - pos).sum() / pos.astype(np.float64).sum()),
                }
            )
    return rows


def study_rounding(out: Path, quick: bool, progress: bool, opts: dict) -> dict:
    """Rounding error per binade and per mode (options: formats, modes, samples)."""
    from .. import plotting

    fig1 = plotting.rounding_error_figure(out / "rounding_error.png")
    rows = mode_errors(
        names=opts.get("formats", ROUNDING_FORMATS),
        modes=opts.get("modes", MODES),
        n=opts.get("samples", 50_000 if quick else 400_000),
        seed=opts["seed"],
    )
    fig2 = plotting.mode_error_figure(out / "rounding_modes.png", rows)
    csv_path = write_csv(out / "rounding_modes.csv", rows)
    first = rows[0]["format"]
    e4 = {r["mode"]: r for r in rows if r["format"] == first}

    def quote(mode, key, fmt):
        return f"{mode.upper()} {key.replace('_', ' ')} {e4[mode][key]:{fmt}}" if mode in e4 else None

    quoted = [
        q
        for q in (
            quote("rne", "mean_rel_error", ".4f"),
            quote("rtz", "rel_bias", "+.4f"),
            quote("sr", "rel_bias", "+.5f"),
        )
        if q
    ]
    text = (
        "<p>Worst relative error of round-to-nearest-even in each binade: flat at the unit roundoff "
        "2<sup>-(m+1)</sup> in the normal range, growing in the subnormal range. "
        "Right: mean error and bias of each rounding mode on log-uniform data (magnitudes spread evenly over "
        "up to 8 binades below each format's maximum, random signs; the bias is taken on the magnitudes). "
        "Directed modes are "
        "biased by about half an ulp; stochastic rounding (sr) is unbiased at the cost of a larger mean error. "
        + (f"{first.upper()}: {', '.join(quoted)}." if quoted else "")
        + "</p>"
    )
    return {
        "id": "rounding",
        "title": "Rounding error per format and mode",
        "html": text,
        "figures": [fig1, fig2],
        "csv": [csv_path],
        "numbers": {f"{r['format']}/{r['mode']}": {k: r[k] for k in ("mean_rel_error", "rel_bias")} for r in rows},
    }


def study_granularity(out: Path, quick: bool, progress: bool, opts: dict) -> dict:
    """The granularity study (options: shape, formats, distributions, granularities)."""
    from . import granularity

    res = granularity.run(out / "granularity", quick=quick, progress=progress, **opts)
    key = res["key"]
    dists = list(dict.fromkeys(k[0] for k in key))
    gran = list(dict.fromkeys(k[2] for k in key))
    rows = []
    for d in dists:
        for f in dict.fromkeys(k[1] for k in key):
            row = {"distribution": d, "format": f}
            row.update({g: key.get((d, f, g), float("nan")) for g in gran})
            rows.append(row)
    text = (
        "<p>SQNR (dB, higher is better) of every granularity with its default scale policy, on synthetic "
        "tensors that mimic LLM training data. SQNR is energy-weighted: on the outlier-channel activations "
        "the 100x channels dominate signal and noise alike, so every granularity lands near the format's limit "
        "(about 31 dB for e4m3), except where an outlier is its block's amax: the fp32 scale maps each block's "
        "amax onto the format's maximum (448 for e4m3), so that element comes back without FP8 rounding error "
        "(only the float32 rounding of the scale). Fine tiles (1x128, DeepSeek-V3's activation tiles, and g32) "
        "make that case common, and that is all of their gain: leaving out each tile's largest element, 1x128 "
        "tiles give no more SQNR than one per-tensor scale; they do not confine the outlier's error. One "
        "per-tensor scale does its damage in underflow instead (<code>fraction_underflow</code> in the CSV: "
        "most elements of the log-normal gradients flush to zero).</p>" + html_table(rows)
    )
    return {
        "id": "granularity",
        "title": "Scaling granularity",
        "html": text,
        "figures": list(res["figures"]),
        "csv": [res["csv"]],
        "numbers": {f"{d}/{f}/{g}": v for (d, f, g), v in key.items()},
    }


def capture_dir() -> Path | None:
    """Where the hardware captures are, in this order: ``$FP8SIM_CAPTURES``; ``./tests/data`` when the
    current folder is an fp8sim source checkout (the README's set-up); ``tests/data`` of the checkout
    this package was installed from in development mode; the compact subset installed with the
    package (``fp8sim/captures``). None when there are none.

    Raises ValueError when ``$FP8SIM_CAPTURES`` is set but is not a folder with ``.npz`` files (never
    silently falls back to other captures)."""

    def has_npz(d: Path) -> bool:
        return d.is_dir() and any(d.glob("*.npz"))

    env = os.environ.get("FP8SIM_CAPTURES")
    if env:
        path = Path(env).expanduser()
        if not has_npz(path):
            what = "is not a folder" if not path.is_dir() else "has no .npz files"
            raise ValueError(
                f"FP8SIM_CAPTURES={env!r} {what}; set it to a folder of hardware captures (.npz, written by "
                "python -m gpu.capture) or unset it to use the captures found with fp8sim"
            )
        return path
    package = Path(__file__).resolve().parent.parent  # fp8sim/
    # a checkout: its tests/data next to the package's sources and pyproject.toml (not a stray
    # tests/data folder in the current directory or in site-packages)
    for root in (Path.cwd(), package.parent):
        if (root / "pyproject.toml").is_file() and (root / "fp8sim" / "__init__.py").is_file():
            if has_npz(root / "tests" / "data"):
                return root / "tests" / "data"
    shipped = package / "captures"
    return shipped if has_npz(shipped) else None


def _shown(path: Path) -> str:
    """A folder as the report shows it: relative to the current folder when inside it, else by name
    (the page never shows where this machine keeps its files)."""
    try:
        here, cwd = path.resolve(), Path.cwd().resolve()
    except OSError:
        return path.name
    return os.path.relpath(here, cwd) if here.is_relative_to(cwd) else path.name


def capture_set(data: Path, origin: str = "auto") -> tuple[str, str]:
    """Which hardware captures the folder ``data`` holds, as ``(kind, HTML label)``: ``"shipped"`` (the
    compact subset installed with the package, ``fp8sim/captures``), ``"checkout"`` (``tests/data`` of
    a source checkout: the full set) or ``"folder"`` (any other folder, named by ``origin``:
    ``"config"`` for the report config's ``[tensorcore] captures``, ``"env"`` for ``$FP8SIM_CAPTURES``)."""
    package = Path(__file__).resolve().parent.parent  # fp8sim/
    here = data.resolve()
    if here == (package / "captures").resolve():
        return "shipped", "the compact subset shipped with fp8sim (<code>fp8sim/captures</code>)"
    root = here.parent.parent
    if (
        here.name == "data"
        and here.parent.name == "tests"
        and (root / "pyproject.toml").is_file()
        and (root / "fp8sim" / "__init__.py").is_file()
    ):
        return "checkout", "the full set of the source checkout (<code>tests/data</code>)"
    via = {
        "config": " (the config's <code>[tensorcore] captures</code>)",
        "env": " (<code>$FP8SIM_CAPTURES</code>)",
    }.get(origin, "")
    return "folder", f"the folder <code>{html.escape(_shown(data))}</code>{via}"


def study_tensorcore(out: Path, quick: bool, progress: bool, opts: dict) -> dict:
    """Hardware-validation status of each accumulator model: re-score every single-instruction and
    chained-tile capture (all format pairs) of :func:`capture_dir`, or of the folder of the option
    ``captures``; the text names the capture set (:func:`capture_set`) and the outputs scored."""
    from .. import tensorcore
    from ..tensorcore.captures import CaptureError, capture_kind, load_capture

    if opts.get("captures"):
        data: Path | None = Path(opts["captures"])
        origin = "config"
    else:
        data = capture_dir()
        origin = "env" if os.environ.get("FP8SIM_CAPTURES") else "auto"
    files = sorted(data.glob("*.npz")) if data is not None else []
    if quick:
        files = [f for f in files if "normal" in f.name or "special" in f.name]
    per_model: dict = {}
    n_files = n_outputs = 0
    for f in files:
        try:
            cap = load_capture(f)
        except CaptureError:
            continue  # not a capture at all: the folder may hold other files
        if capture_kind(cap) not in ("mma", "chain"):
            continue  # probes, the GEMM oracle's and the cvt sweep's captures: fp8sim verify scores them
        r = tensorcore.verify_capture(f)  # (by path: an error names the file)
        m = r["meta"].get("instruction", "?")
        agg = per_model.setdefault(m, {"model": m, "captures": 0, "outputs": 0, "bit_exact": 0})
        agg["captures"] += 1
        agg["outputs"] += r["n"]
        agg["bit_exact"] += r["n"] - r["mismatches"]
        n_files += 1
        n_outputs += r["n"]
    rows = [dict(v, match_rate=v["bit_exact"] / v["outputs"]) for v in per_model.values()]
    if rows:
        assert data is not None
        _, label = capture_set(data, origin)
        csv_path = write_csv(out / "tensorcore_validation.csv", rows)
        subset = " (quick run: the normal and inf/NaN inputs only)" if quick else ""
        text = (
            f"<p>Each accumulator model against outputs captured from an NVIDIA H200 (sm_90): "
            f"{n_outputs:,} outputs of {n_files} single-instruction and chained-tile captures{subset}, "
            f"from {label}. The table gives the share reproduced bit for bit "
            f"(<code>fp8sim verify FILE</code> scores one file; it also scores the probe captures).</p>"
            + html_table(rows)
        )
        csvs = [csv_path]
    else:
        where = (
            f"in {html.escape(_shown(data))}"
            if origin == "config" and data is not None
            else "next to this installation"
        )
        text, csvs = f"<p>No tensor-core captures (<code>*.npz</code> of gpu.capture) found {where}.</p>", []
    return {
        "id": "tensorcore",
        "title": "Tensor-core models: hardware validation",
        "html": text,
        "figures": [],
        "csv": csvs,
        "numbers": {r["model"]: r["match_rate"] for r in rows},
    }


def _max_rel_pct(dist: str, v: float) -> float | str:
    """The maximum elementwise relative error in %, or why it is not shown: zero-mean inputs have
    outputs near zero, whose relative error is unbounded."""
    if dist in ("normal", "outlier"):
        return "not meaningful (outputs near 0)"
    return 100 * v


def study_accumulation(out: Path, quick: bool, progress: bool, opts: dict) -> dict:
    """The accumulation study (options: k_max, size, distributions, recipes)."""
    from . import accumulation

    res = accumulation.run(out / "accumulation", quick=quick, progress=progress, **opts)
    head = res["headline"]
    rows = []
    for key, v in head.items():
        if isinstance(key, tuple):
            rows.append(
                {
                    "source": "fp8sim model",
                    "inputs": key[0],
                    "accumulation": key[1],
                    "max rel. error (%)": _max_rel_pct(key[0], v["max_rel"]),
                    "median rel. error (%)": 100 * v["median_rel"],
                }
            )
    for key, v in (head.get("h200") or {}).items():
        rows.append(
            {
                "source": "H200, measured (K = 4096)",
                "inputs": key[0],
                "accumulation": key[1],
                "max rel. error (%)": _max_rel_pct(key[0], v.get("max_rel", float("nan"))),
                "median rel. error (%)": 100 * v["median_rel"],
            }
        )
    text = (
        f"<p>Relative error of an E4M3 GEMM with the bit-exact H200 <code>wgmma</code> accumulator "
        f"(13 fraction bits, truncation) against fp64, at K = {head['K']}, with and without promotion to "
        f"FP32 every 128 elements, next to the numbers measured on the H200. DeepSeek-V3 reports a maximum "
        f'relative error of "nearly 2%" at K = 4096 without promotion (input distribution not stated): '
        f"all-positive inputs give more, zero-mean inputs far less. Errors are elementwise "
        f"|y - y<sub>fp64</sub>| / |y<sub>fp64</sub>| in percent; the maximum of zero-mean inputs is not shown: "
        f"some of their outputs are close to zero, where any absolute error is a huge relative one (the "
        f"median is the meaningful figure there).</p>" + (html_table(rows) if rows else "")
    )
    numbers = {"K": head["K"]}
    numbers.update(
        {
            f"{key[0]}/{key[1]}": {"max": v["max_rel"], "median": v["median_rel"]}
            for key, v in head.items()
            if isinstance(key, tuple)
        }
    )
    return {
        "id": "accumulation",
        "title": "Tensor-core accumulation and promotion",
        "html": text,
        "figures": list(res["figures"]),
        "csv": [res["csv"]],
        "numbers": numbers,
    }


def study_training(out: Path, quick: bool, progress: bool, opts: dict) -> dict:
    """A short training comparison: the same small LM, initialization and batches with each recipe."""
    from ..training.train import DEEPSEEK_V3_REL_LOSS_ERROR, train

    recipes = opts.get("recipes", TRAINING_RECIPES_QUICK if quick else TRAINING_RECIPES)
    steps = opts.get("steps", 40 if quick else 200)
    sub = out / "training"
    summary = train(recipes, steps, opts["seed"], str(sub), fidelity=opts.get("fidelity", "exact"), progress=progress)
    rows, numbers = [], {"steps": steps}
    for name, r in summary["recipes"].items():
        rel = r["rel_loss_error_vs_bf16"]
        rows.append(
            {
                "recipe": name,
                "final loss (mean of last 10 %)": r["final_loss_last10pct_mean"],
                "rel. loss error vs bf16 (%)": 100 * rel["mean_abs"]
                if rel
                else ("reference" if name == "bf16" else "no bf16 run"),
                "FP8 elements flushed to zero (%)": 100 * r["frac_underflow"],
                "non-finite steps": r["nonfinite_steps"],
                "s/step": r["s_per_step"],
            }
        )
        numbers[name] = {
            "final_loss": r["final_loss_last10pct_mean"],
            "rel_loss_error": rel["mean_abs"] if rel else None,
        }
    csvs = [str(sub / "losses.csv"), str(sub / "layer_stats.csv")]
    text = (
        f"<p>A small transformer LM trained for {steps} steps from the same initialization and batches with "
        f"each recipe; every Linear layer's Fprop, Dgrad and Wgrad GEMM runs through the recipe. The relative "
        f"loss error is the mean of |L - L<sub>bf16</sub>| / L<sub>bf16</sub> over the last 10 % of steps. "
        f"DeepSeek-V3 reports below {DEEPSEEK_V3_REL_LOSS_ERROR:.2%} for its 671B model; at this model size "
        f"the number is dominated by run-to-run divergence (see the training docs).</p>" + html_table(rows)
    )
    return {
        "id": "training",
        "title": "Training against BF16",
        "html": text,
        "figures": [str(sub / f) for f in summary.get("figures", [])],
        "csv": csvs,
        "numbers": numbers,
    }
