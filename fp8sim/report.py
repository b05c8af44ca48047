"""``fp8sim report``: the headline studies as one self-contained HTML page.

Each study is a function ``(out_dir, quick, progress, opts) -> section``
where ``opts`` holds the study's options from a config file (see
:data:`OPTIONS`) and the seed, and a section is a dict with a title, HTML
body, figure paths, CSV paths and headline numbers; :func:`build` runs them,
embeds the figures and writes ``index.html``, ``summary.json`` and the
CSV/PNG files beside it.

A config file (TOML or JSON; :func:`load_config`) chooses the studies, the
seed and each study's sizes and subsets, e.g.::

    seed = 1
    studies = ["formats", "granularity", "training"]

    [granularity]
    shape = [256, 2048]
    formats = ["e4m3"]
    granularities = ["tensor", "1x128", "128x128", "mx32"]

    [training]
    recipes = ["bf16", "deepseek-v3"]
    steps = 100
"""

from __future__ import annotations

import base64
import csv
import html
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from . import __version__, formats, plotting, rounding
from ._json import dumps as json_dumps
from ._names import close_matches, unknown_name_error

MODES = ["rne", "rna", "rtz", "rup", "rdn", "rto", "sr"]
ROUNDING_FORMATS = ("e4m3", "e5m2", "e3m4", "e2m1", "bf16")
TRAINING_RECIPES = ("bf16", "deepseek-v3", "per-tensor", "per-tensor-no-promotion")
TRAINING_RECIPES_QUICK = ("bf16", "deepseek-v3")


class ConfigError(ValueError):
    """A report config file that cannot be used (the message names the key and what is allowed)."""


def _known(kind: str):
    """The allowed values of a list-of-names option, or None where any name its registry knows is allowed."""
    from .studies import accumulation, granularity

    if kind == "distributions/granularity":
        return granularity.DISTRIBUTIONS
    if kind == "distributions/accumulation":
        return accumulation.DISTRIBUTIONS
    if kind == "granularities":
        return granularity.GRANULARITIES
    if kind == "formats/granularity":
        return granularity.FORMATS
    if kind == "modes":
        return tuple(MODES)
    if kind == "studies":
        return tuple(STUDY_IDS)
    return None


#: Every option a config file may set: section -> key -> kind.  Kinds: ``int`` (positive),
#: ``int0`` (non-negative), ``int128`` (at least 128), ``bool``, ``path``, ``fidelity``, ``shape``
#: (two positive ints), ``formats/signed`` (registered formats with a sign bit: the rounding study
#: draws negative values), ``recipes`` (registered recipes) and lists of the names :func:`_known`
#: returns (``formats/granularity``: the element formats that study accepts, not e8m0 or e2m1).
#: Each value is checked against what its study accepts, so a bad config exits before any study runs.
OPTIONS: dict[str, dict[str, str]] = {
    "": {"seed": "int0", "quick": "bool", "studies": "studies"},
    "rounding": {"formats": "formats/signed", "modes": "modes", "samples": "int"},
    "granularity": {
        "shape": "shape",
        "formats": "formats/granularity",
        "distributions": "distributions/granularity",
        "granularities": "granularities",
    },
    "accumulation": {
        "k_max": "int128",
        "size": "int",
        "distributions": "distributions/accumulation",
        "recipes": "recipes",
    },
    "tensorcore": {"captures": "path"},
    "training": {"recipes": "recipes", "steps": "int", "fidelity": "fidelity"},
}


def _check_value(where: str, kind: str, v):
    def fail(what):
        raise ConfigError(f"{where}: expected {what}, got {v!r}")

    if kind in ("int", "int0", "int128"):
        least = {"int": 1, "int0": 0, "int128": 128}[kind]
        if isinstance(v, bool) or not isinstance(v, int) or v < least:
            fail({"int": "a positive integer", "int0": "a non-negative integer", "int128": "an integer >= 128"}[kind])
        return v
    if kind == "bool":
        if not isinstance(v, bool):
            fail("true or false")
        return v
    if kind == "path":
        if not isinstance(v, str) or not Path(v).is_dir():
            fail("an existing folder")
        return v
    if kind == "fidelity":
        if v not in ("fast", "exact"):
            fail('"fast" or "exact"')
        return v
    if kind == "shape":
        if (
            not isinstance(v, list)
            or len(v) != 2
            or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in v)
        ):
            fail("two positive integers [rows, cols]")
        return v
    if not isinstance(v, list) or not v or not all(isinstance(n, str) for n in v):
        fail("a non-empty list of names")
    if kind == "formats/signed":
        for n in v:
            try:
                f = formats.format(n)
            except formats.UnknownNameError:
                raise ConfigError(str(unknown_name_error("format", n, formats.format_names(), where=where))) from None
            except ValueError as e:
                raise ConfigError(f"{where}: {e}") from None
            if not f.signed:
                raise ConfigError(
                    f"{where}: {n!r} is an unsigned (scale-only) format; the rounding study rounds signed values, "
                    f"use a signed format such as {', '.join(ROUNDING_FORMATS)}"
                )
        return v
    if kind == "recipes":
        from .recipes import recipe

        for n in v:
            try:
                recipe(n)
            except ValueError as e:
                raise ConfigError(f"{where}: {e}") from None
        return v
    known = _known(kind)
    bad = [n for n in v if n not in known]
    if bad:
        hints = list(dict.fromkeys(m for n in bad for m in close_matches(n, known)))
        if kind == "formats/granularity":
            head = f"{', '.join(map(repr, bad))} not accepted: the granularity study quantizes to the element formats"
        else:
            head = f"unknown {', '.join(map(repr, bad))}"
        raise ConfigError(
            f"{where}: {head}"
            + (f" (did you mean {' or '.join(map(repr, hints))}?)" if hints else "")
            + f"; known: {', '.join(known)}"
        )
    return v


def validate_config(cfg: dict, source: str = "config") -> dict:
    """Check a config mapping against :data:`OPTIONS`; return it unchanged or raise :class:`ConfigError`."""
    if not isinstance(cfg, dict):
        raise ConfigError(f"{source}: the top level must be a table/object, got {type(cfg).__name__}")
    sections = [k for k in OPTIONS if k]
    for key, v in cfg.items():
        if key in OPTIONS[""]:
            _check_value(f"{source}: {key}", OPTIONS[""][key], v)
        elif key in sections:
            if not isinstance(v, dict):
                raise ConfigError(f"{source}: [{key}] must be a table/object of options")
            for opt, val in v.items():
                if opt not in OPTIONS[key]:
                    raise ConfigError(f"{source}: [{key}] has no option {opt!r}; known: {', '.join(OPTIONS[key])}")
                _check_value(f"{source}: [{key}] {opt}", OPTIONS[key][opt], val)
        else:
            raise ConfigError(f"{source}: unknown key {key!r}; known: {', '.join(list(OPTIONS['']) + sections)}")
    return cfg


def load_config(path) -> dict:
    """Read a report config from a TOML (``.toml``) or JSON file and validate it."""
    path = Path(path)
    try:
        text = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
    if path.suffix.lower() == ".json":
        try:
            cfg = json.loads(text)
        except ValueError as e:
            raise ConfigError(f"{path} is not valid JSON: {e}") from None
    else:
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10
            try:
                import tomli as tomllib  # type: ignore[no-redef]
            except ModuleNotFoundError:
                raise ConfigError(
                    "TOML config files need Python >= 3.11 or the tomli package; or write the config as .json"
                ) from None
        try:
            cfg = tomllib.loads(text.decode())
        except (ValueError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path} is not valid TOML: {e}") from None
    return validate_config(cfg, str(path))


def write_csv(path, rows: list[dict]) -> str:
    """Write ``rows`` (dicts with the same keys) as a CSV file with a header; return the path."""
    path = str(path)
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def html_table(rows: list[dict], columns: list[str] | None = None) -> str:
    """An HTML table of ``rows`` (floats to 4 significant digits, text escaped)."""
    columns = columns or list(rows[0])

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
    from .cli import TABLE_COLUMNS

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
    """Mean relative error and relative bias of each rounding mode on log-normal data."""
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
        "Right: mean error and bias of each rounding mode on positive log-normal data. Directed modes are "
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
    from .studies import granularity

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
        "tensors that mimic LLM training data. Per-tensor scaling lets one outlier set the scale for "
        "everything; 1x128 tiles (DeepSeek-V3 activations) and 128x128 blocks (weights) confine it.</p>"
        + html_table(rows)
    )
    return {
        "id": "granularity",
        "title": "Scaling granularity",
        "html": text,
        "figures": [p for p in res["figures"]],
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
    package = Path(__file__).resolve().parent
    # a checkout: its tests/data next to the package's sources and pyproject.toml (not a stray
    # tests/data folder in the current directory or in site-packages)
    for root in (Path.cwd(), package.parent):
        if (root / "pyproject.toml").is_file() and (root / "fp8sim" / "__init__.py").is_file():
            if has_npz(root / "tests" / "data"):
                return root / "tests" / "data"
    shipped = package / "captures"
    return shipped if has_npz(shipped) else None


def study_tensorcore(out: Path, quick: bool, progress: bool, opts: dict) -> dict:
    """Hardware-validation status of each accumulator model: re-score the captures shipped with fp8sim."""
    from . import tensorcore

    data = Path(opts["captures"]) if opts.get("captures") else capture_dir()
    files = sorted(data.glob("*_e4m3*.npz")) if data is not None else []
    files = [f for f in files if not f.name.startswith(("probes", "cvt"))]
    if quick:
        files = [f for f in files if "normal" in f.name or "special" in f.name]
    per_model: dict = {}
    for f in files:
        r = tensorcore.verify_capture(f)
        m = r["meta"].get("instruction", "?")
        agg = per_model.setdefault(m, {"model": m, "captures": 0, "outputs": 0, "bit_exact": 0})
        agg["captures"] += 1
        agg["outputs"] += r["n"]
        agg["bit_exact"] += r["n"] - r["mismatches"]
    rows = [dict(v, match_rate=v["bit_exact"] / v["outputs"]) for v in per_model.values()]
    if rows:
        csv_path = write_csv(out / "tensorcore_validation.csv", rows)
        text = (
            "<p>Each accumulator model against outputs captured from an NVIDIA H200 (sm_90) and "
            "shipped with fp8sim (<code>fp8sim verify FILE</code>): the share of outputs reproduced "
            "bit for bit.</p>" + html_table(rows)
        )
        csvs = [csv_path]
    else:
        where = f"in {html.escape(str(data))}" if opts.get("captures") else "next to this installation"
        text, csvs = f"<p>No tensor-core captures (<code>*_e4m3*.npz</code>) found {where}.</p>", []
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
    from .studies import accumulation

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
    from .training.train import DEEPSEEK_V3_REL_LOSS_ERROR, train

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


STUDIES = [study_formats, study_rounding, study_granularity, study_accumulation, study_tensorcore, study_training]
STUDY_IDS = {f.__name__.removeprefix("study_"): f for f in STUDIES}
# relative cost of each study on a fresh installation (mostly numba compilation), for scheduling
_COST = {"study_granularity": 6, "study_accumulation": 4, "study_training": 3, "study_rounding": 2}


# ------------------------------------------------------------------ page
CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;
color:#1d2330;line-height:1.45}
h1{margin-bottom:0.1em} .sub{color:#5a6475;margin-top:0}
section{border-top:1px solid #dde2ea;margin-top:2em;padding-top:0.5em}
table{border-collapse:collapse;font-size:12px;margin:0.8em 0} th,td{border:1px solid #dde2ea;padding:3px 7px;
text-align:right} th{background:#f3f5f9} img{max-width:100%;border:1px solid #eef0f4;margin:0.5em 0}
code{background:#f3f5f9;padding:1px 4px;border-radius:3px} .env{font-size:12px;color:#5a6475}
"""


def _embed(path) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode()
    alt = html.escape(Path(path).stem.replace("_", " "))
    return f'<img src="data:image/png;base64,{data}" alt="{alt}">'


def environment() -> dict:
    """Versions of fp8sim and its numerical dependencies, the platform and the CPU count."""
    import ml_dtypes
    import numba

    return {
        "fp8sim": __version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": numba.__version__,
        "ml_dtypes": ml_dtypes.__version__,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }


def _groups(index: list, names: list, jobs: int) -> list:
    """Split the studies over ``jobs`` workers: the two that share the quantization kernels (granularity,
    accumulation) on one worker, so that a fresh installation compiles those once, the others spread
    over the rest by cost."""
    shared = [i for i in index if names[i] in ("study_granularity", "study_accumulation")]
    rest = sorted((i for i in index if i not in shared), key=lambda i: -_COST.get(names[i], 1))
    groups: list = [shared] if shared else []
    n_other = max(1, jobs - len(groups))
    others: list = [[] for _ in range(n_other)]
    for k, i in enumerate(rest):
        others[k % n_other].append(i)
    return [g for g in groups + others if g]


def _run_group(tasks: list) -> list:
    return [_timed_study(study, out, quick, False, opts) for study, out, quick, opts in tasks]


def _timed_study(study, out: Path, quick: bool, progress: bool, opts: dict) -> dict:
    t = time.perf_counter()
    sec = study(out, quick, progress, opts)
    sec["seconds"] = round(time.perf_counter() - t, 2)
    return sec


class OutputError(ValueError):
    """An output folder the report cannot be written to (the message names the path and why)."""


def is_report_dir(path) -> bool:
    """True if ``path`` is a folder holding a complete report written by :func:`build`
    (an ``index.html`` and a ``summary.json`` with fp8sim's keys)."""
    path = Path(path)
    try:
        summary = json.loads((path / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(summary, dict) and {"fp8sim", "sections"} <= set(summary) and (path / "index.html").is_file()


def check_out_dir(out_dir, *, overwrite: bool = False) -> Path:
    """Check, before any study runs, that a report can be written to ``out_dir``; return it as a Path.

    ``out_dir`` may be missing (it is created, with its parents), an empty folder, or (with
    ``overwrite=True``) an earlier report (:func:`is_report_dir`), which the new report replaces
    once it is complete.  Anything else raises :class:`OutputError`: a file, a non-empty folder
    that is not a report (it is never deleted), a parent that is a file or not writable.
    """
    out = Path(out_dir)
    if str(out_dir) == "" or out.resolve() == Path(out.resolve().anchor):
        raise OutputError(f"output folder {str(out_dir)!r}: need a folder name (the report replaces the folder)")
    if out.exists() or out.is_symlink():
        if not out.is_dir():
            raise OutputError(f"output folder {out} exists and is not a folder; choose another --out")
        if out.is_symlink():
            raise OutputError(f"output folder {out} is a symbolic link; give the folder itself")
        if any(out.iterdir()):
            if not is_report_dir(out):
                raise OutputError(
                    f"output folder {out} is not empty and holds no earlier fp8sim report (index.html and "
                    "summary.json); it is left alone: choose another --out, or empty or remove it"
                )
            if not overwrite:
                raise OutputError(
                    f"output folder {out} holds an earlier report; pass --force to replace it (the new report "
                    "replaces it only once it is complete)"
                )
    parent = out.resolve().parent
    anc = parent
    while not anc.exists():
        anc = anc.parent
    if not anc.is_dir():
        raise OutputError(f"output folder {out}: {anc} is a file, not a folder")
    if not os.access(anc, os.W_OK | os.X_OK):
        raise OutputError(f"output folder {out}: cannot write in {anc} (permission denied)")
    return out


def build(
    out_dir,
    *,
    quick: bool = False,
    progress: bool = True,
    studies=None,
    config: dict | None = None,
    jobs: int = 1,
    overwrite: bool = False,
) -> dict:
    """Run the studies and write ``index.html`` and ``summary.json`` in ``out_dir``.

    ``studies`` is a list of study functions or names (default: all, or the config's
    ``studies``); ``config`` is a mapping as :func:`load_config` returns (validated here).
    ``jobs > 1`` runs the studies in that many worker processes (each study is seeded, so
    the numbers are the same; on a fresh installation the processes also compile numba's
    kernels side by side); the page lists the sections in the same order either way.

    The report is written atomically: into a hidden sibling folder ``.NAME.partial-*`` on the
    same file system, renamed to ``out_dir`` once complete.  An existing ``out_dir`` must be
    empty, or an earlier report and ``overwrite=True`` (:func:`check_out_dir`, checked before
    any study runs); it is replaced only by the complete new report.  When the run fails or
    is interrupted (KeyboardInterrupt), the partial folder is removed and ``out_dir`` is left
    as it was, so ``out_dir`` always holds one complete report of one run (or nothing).
    """
    import shutil
    import tempfile

    config = validate_config(dict(config or {}))
    quick = quick or config.get("quick", False)
    seed = config.get("seed", 0)
    studies = studies or config.get("studies") or STUDIES
    studies = [STUDY_IDS[s] if isinstance(s, str) else s for s in studies]
    if int(jobs) < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    final = check_out_dir(out_dir, overwrite=overwrite)
    target = final.resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private (0700); a report folder is as mkdir makes it
    try:
        summary = _build_into(tmp, final, quick, progress, studies, config, seed, int(jobs))
        _swap_into_place(tmp, target, overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return summary


def _swap_into_place(tmp: Path, target: Path, overwrite: bool) -> None:
    """Rename the complete report ``tmp`` to ``target``, replacing an earlier report or an empty folder
    there (checked again now: the folder may have changed while the studies ran).  SIGINT is held off
    during the two renames so that an interrupt cannot leave ``target`` missing."""
    import shutil
    import signal
    import threading

    if target.exists() or target.is_symlink():
        check_out_dir(target, overwrite=overwrite)
    main = threading.current_thread() is threading.main_thread()
    handler = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        old = None
        if target.exists():
            old = target.parent / f".{target.name}.replaced-{os.getpid()}-{time.time_ns()}"
            os.rename(target, old)
        try:
            os.rename(tmp, target)
        except BaseException:
            if old is not None:
                os.rename(old, target)
            raise
    finally:
        if main:
            signal.signal(signal.SIGINT, handler)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _stop_workers(pool) -> None:
    """Terminate a ProcessPoolExecutor's workers now (on an interrupt: they must not keep writing
    into the partial folder while it is removed)."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(5)
    pool.shutdown(wait=False, cancel_futures=True)


def _build_into(
    out: Path, final: Path, quick: bool, progress: bool, studies: list, config: dict, seed: int, jobs: int
) -> dict:
    """Run the studies into the (new, empty) folder ``out`` and write the page and summary there;
    the summary names ``final`` (where ``out`` will be renamed to) as the index's location."""
    t0 = time.perf_counter()
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(studies), desc="fp8sim report", unit="study")

    def done(sec):
        if bar:
            bar.set_postfix_str(sec["id"])
            bar.update()

    def opts_of(study):
        return dict(config.get(study.__name__.removeprefix("study_"), {}), seed=seed)

    if jobs > 1 and len(studies) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        groups = _groups(list(range(len(studies))), [s.__name__ for s in studies], int(jobs))
        results: dict = {}
        pool = ProcessPoolExecutor(max_workers=len(groups), mp_context=multiprocessing.get_context("spawn"))
        try:
            futs = {
                pool.submit(_run_group, [(studies[i], out, quick, opts_of(studies[i])) for i in g]): g for g in groups
            }
            for f in as_completed(futs):
                for i, sec in zip(futs[f], f.result()):
                    results[i] = sec
                    done(sec)
        except BaseException:
            _stop_workers(pool)
            raise
        pool.shutdown()
        sections = [results[i] for i in range(len(studies))]
    else:
        sections = []
        for study in studies:
            sections.append(_timed_study(study, out, quick, progress, opts_of(study)))
            done(sections[-1])
    if bar:
        bar.close()
    env = environment()
    summary = {
        "fp8sim": __version__,
        "quick": quick,
        "seed": seed,
        "config": config,
        "seconds": round(time.perf_counter() - t0, 2),
        "environment": env,
        "sections": {s["id"]: s["numbers"] for s in sections},
        "files": sorted(os.path.relpath(p, out) for s in sections for p in s["figures"] + s["csv"]),
        "index": str(final / "index.html"),
    }
    (out / "summary.json").write_text(json_dumps(summary))
    body = []
    for s in sections:
        figs = "".join(_embed(p) for p in s["figures"])
        links = " ".join(
            f'<a href="{html.escape(os.path.relpath(p, out))}">{html.escape(os.path.relpath(p, out))}</a>'
            for p in s["csv"]
        )
        body.append(
            f'<section id="{s["id"]}"><h2>{html.escape(s["title"])}</h2>{s["html"]}{figs}'
            f'<p class="env">data: {links} · {s["seconds"]} s</p></section>'
        )
    env_html = html_table([{"key": k, "value": v} for k, v in env.items()])
    page = (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<title>fp8sim report</title><meta name='viewport' content='width=device-width,initial-scale=1'>"
        f"<style>{CSS}</style></head><body><h1>fp8sim report</h1>"
        f"<p class='sub'>What FP8 does to your numbers · fp8sim {__version__}"
        f"{' · quick run' if quick else ''} · {summary['seconds']} s</p>"
        + "".join(body)
        + f"<section id='environment'><h2>Environment</h2>{env_html}</section></body></html>"
    )
    (out / "index.html").write_text(page)
    return summary
