"""``fp8sim report``: the headline studies as one self-contained HTML page.

Each study is a function ``(out_dir, quick, progress, opts) -> section`` (the sections are in
:mod:`fp8sim.studies.sections`, and the comparison of Hopper's, Blackwell's and CDNA3's
accumulators in :func:`fp8sim.studies.accumulators.section`) where ``opts`` holds the study's options from a config file (see
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

:func:`check_out_dir` is the one check of an output folder, for a report (the folder is
replaced as a whole) and for the commands that write named files into a folder.
"""

from __future__ import annotations

import base64
import html
import json
import os
import platform
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from . import formats
from ._fpenv import ieee_defaults
from ._json import dumps as json_dumps
from ._names import unknown_name_error
from ._version import __version__
from .formats import UnknownNameError
from .studies import STUDY_NAMES, accumulation, granularity
from .studies.sections import (
    MODES,
    ROUNDING_FORMATS,
    TRAINING_RECIPES,
    TRAINING_RECIPES_QUICK,
    capture_dir,
    html_table,
    mode_errors,
    study_accumulation,
    study_formats,
    study_granularity,
    study_rounding,
    study_tensorcore,
    study_training,
    write_csv,
)

__all__ = [
    "build",
    "load_config",
    "validate_config",
    "check_out_dir",
    "check_parent",
    "is_report_dir",
    "environment",
    "ConfigError",
    "ConfigNameError",
    "OutputError",
    "OPTIONS",
    "FIDELITIES",
    "CSS",
    # the sections (fp8sim.studies.sections), kept importable from here
    "MODES",
    "ROUNDING_FORMATS",
    "TRAINING_RECIPES",
    "TRAINING_RECIPES_QUICK",
    "STUDIES",
    "STUDY_IDS",
    "get_study",
    "capture_dir",
    "html_table",
    "write_csv",
    "mode_errors",
    "study_formats",
    "study_rounding",
    "study_granularity",
    "study_accumulation",
    "study_tensorcore",
    "study_training",
    "study_accelerators",
]


def study_accelerators(out: Path, quick: bool, progress: bool, opts: dict) -> dict:
    """Hopper's, Blackwell's and CDNA3's accumulators on the same e4m3 products (options: k_max,
    size, distributions): :func:`fp8sim.studies.accumulators.section`."""
    from .studies import accumulators

    return accumulators.section(out, quick, progress, opts)


#: the report's sections in page order: those of :mod:`fp8sim.studies.sections`, with the
#: accelerators comparison after the accumulation study
STUDIES = [study_formats, study_rounding, study_granularity, study_accumulation, study_accelerators]
STUDIES += [study_tensorcore, study_training]
#: study id (``formats``, ``rounding``, ..., ``accelerators``) -> its section function
STUDY_IDS = {f.__name__.removeprefix("study_"): f for f in STUDIES}


def get_study(name: str):
    """The section function of the study ``name`` (a key of :data:`STUDY_IDS`); an unknown name raises
    :class:`~fp8sim.formats.UnknownNameError`."""
    try:
        return STUDY_IDS[name]
    except (KeyError, TypeError):
        raise unknown_name_error("study", name, STUDY_IDS, plural="studies") from None


#: the GEMM fidelities of the training study (``fp8sim.training.train``'s ``fidelity``)
FIDELITIES = ("fast", "exact")


class ConfigError(ValueError):
    """A report config file that cannot be used (the message names the key and what is allowed)."""


class ConfigNameError(ConfigError, UnknownNameError):
    """A report config value that names an unknown study, format, mode, ... (the message gives the
    close matches and the known names)."""


#: the list-of-names kinds of :data:`OPTIONS`: kind -> (what one is called, plural, the allowed names)
_NAMES = {
    "distributions/granularity": ("distribution", "distributions", granularity.DISTRIBUTIONS),
    "distributions/accumulation": ("distribution", "distributions", accumulation.DISTRIBUTIONS),
    "granularities": ("granularity", "granularities", granularity.GRANULARITIES),
    "formats/granularity": ("format", "formats", granularity.FORMATS),
    "modes": ("rounding mode", "modes", MODES),
    "studies": ("study", "studies", tuple(STUDY_IDS)),
}

#: Every option a config file may set: section -> key -> kind.  Kinds: ``int`` (positive),
#: ``int0`` (non-negative), ``int128`` (at least 128), ``bool``, ``path``, ``fidelity``, ``shape``
#: (two positive ints), ``formats/signed`` (registered formats with a sign bit: the rounding study
#: draws negative values), ``recipes`` (registered recipes) and lists of names (``studies``, ``modes``,
#: ``granularities``, ``distributions/STUDY``; ``formats/granularity``: the element formats that
#: study accepts, not e8m0 or e2m1).  Each value is checked against what its study accepts, so a bad
#: config exits before any study runs.
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
    "accelerators": {"k_max": "int128", "size": "int", "distributions": "distributions/accumulation"},
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
        if v not in FIDELITIES:
            if not isinstance(v, str):
                fail(" or ".join(map(repr, FIDELITIES)))
            raise ConfigNameError(str(unknown_name_error("fidelity", v, FIDELITIES, where=where, plural="fidelities")))
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
            except UnknownNameError:
                raise ConfigNameError(
                    str(unknown_name_error("format", n, formats.format_names(), where=where))
                ) from None
            except ValueError as e:
                raise ConfigError(f"{where}: {e}") from None
            if not f.signed:
                raise ConfigError(
                    f"{where}: {n!r} is an unsigned (scale-only) format; the rounding study rounds signed values, "
                    f"use a signed format such as {', '.join(ROUNDING_FORMATS)}"
                )
        return v
    if kind == "recipes":
        from .gemms.presets import recipe

        for n in v:
            try:
                recipe(n)
            except UnknownNameError as e:
                raise ConfigNameError(f"{where}: {e}") from None
            except ValueError as e:
                raise ConfigError(f"{where}: {e}") from None
        return v
    word, plural, known = _NAMES[kind]
    for n in v:
        if n in known:
            continue
        if kind == "formats/granularity" and n in formats.format_names():
            raise ConfigError(
                f"{where}: {n!r} not accepted: the granularity study quantizes to the element formats "
                f"{', '.join(known)}"
            )
        raise ConfigNameError(str(unknown_name_error(word, n, known, where=where, plural=plural)))
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
                    err = unknown_name_error("option", opt, OPTIONS[key], where=f"{source}: [{key}]")
                    raise ConfigNameError(str(err))
                _check_value(f"{source}: [{key}] {opt}", OPTIONS[key][opt], val)
        else:
            raise ConfigNameError(str(unknown_name_error("key", key, [*OPTIONS[""], *sections], where=source)))
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


# relative cost of each study on a fresh installation (mostly numba compilation), for scheduling
_COST = {"granularity": 6, "accumulation": 4, "training": 3, "rounding": 2, "accelerators": 2}


def _groups(index: list, names: list, jobs: int) -> list:
    """Split the studies (``names``: their ids) over ``jobs`` workers: the studies of the package
    :mod:`fp8sim.studies` (granularity, accumulation), which share the quantization kernels, on one
    worker, so that a fresh installation compiles those once, the others spread over the rest by cost."""
    shared = [i for i in index if names[i] in STUDY_NAMES]
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
    """An output folder (or file) that cannot be written to (the message names the path and why)."""


def is_report_dir(path) -> bool:
    """True if ``path`` is a folder holding a complete report written by :func:`build`
    (an ``index.html`` and a ``summary.json`` with fp8sim's keys)."""
    path = Path(path)
    try:
        summary = json.loads((path / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(summary, dict) and {"fp8sim", "sections"} <= set(summary) and (path / "index.html").is_file()


def check_parent(path) -> None:
    """The folder that will hold ``path`` exists or can be created: the nearest existing folder above
    ``path`` is a writable folder.  Else :class:`OutputError` (the message names that folder)."""
    anc = Path(path).resolve().parent
    while not anc.exists():
        anc = anc.parent
    if not anc.is_dir():
        raise OutputError(f"{anc} is a file, not a folder")
    if not os.access(anc, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write in {anc} (permission denied)")


def check_out_dir(out_dir, *, overwrite: bool = False, writes: Iterable[str] | None = None) -> Path:
    """Check, before any work starts, that outputs can be written to the folder ``out_dir``; return it
    as a Path.  A problem raises :class:`OutputError`.

    ``writes=None``: ``out_dir`` is a report folder, replaced as a whole (:func:`build`).  It may be
    missing (it is created, with its parents), an empty folder, or (with ``overwrite=True``) an earlier
    report (:func:`is_report_dir`), which the new report replaces once it is complete; not a file, a
    symbolic link, or a non-empty folder that is not a report (it is never deleted).  The folder above
    it must be writable.

    ``writes=NAMES``: the files ``NAMES`` are written into ``out_dir`` (a study's CSV, a training run's
    summary), whatever else it holds.  It may be missing (its parent writable) or a writable folder;
    none of ``NAMES`` may be a folder there, nor (without ``overwrite=True``) an existing file.
    """
    out = Path(out_dir)
    where = f"output folder {out}"
    if writes is None and (str(out_dir) == "" or out.resolve() == Path(out.resolve().anchor)):
        raise OutputError(f"output folder {str(out_dir)!r}: need a folder name (the report replaces the folder)")
    exists = out.exists() or out.is_symlink()
    if exists and not out.is_dir():
        raise OutputError(f"{where} exists and is not a folder; choose another --out")
    if writes is not None:
        if exists:
            for name in writes:
                f = out / name
                if f.is_dir():
                    raise OutputError(f"{where}: {f} is a folder where the output file goes")
                if (f.exists() or f.is_symlink()) and not overwrite:
                    raise OutputError(f"{where} already holds {name}; pass --force to replace it")
            if not os.access(out, os.W_OK | os.X_OK):
                raise OutputError(f"{where}: not writable (permission denied)")
            return out
    elif exists:
        if out.is_symlink():
            raise OutputError(f"{where} is a symbolic link; give the folder itself")
        if any(out.iterdir()):
            if not is_report_dir(out):
                raise OutputError(
                    f"{where} is not empty and holds no earlier fp8sim report (index.html and "
                    "summary.json); it is left alone: choose another --out, or empty or remove it"
                )
            if not overwrite:
                raise OutputError(
                    f"{where} holds an earlier report; pass --force to replace it (the new report "
                    "replaces it only once it is complete)"
                )
    try:
        check_parent(out)
    except OutputError as e:
        raise OutputError(f"{where}: {e}") from None
    return out


@ieee_defaults
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
    studies = [get_study(s) if isinstance(s, str) else s for s in studies]
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

        ids = [s.__name__.removeprefix("study_") for s in studies]
        groups = _groups(list(range(len(studies))), ids, int(jobs))
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
