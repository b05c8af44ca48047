"""Render the speed figures of README.md, benchmarks/RESULTS.md and the docs from the committed records.

    python benchmarks/figures.py           # rewrite every block from benchmarks/records/*.json
    python benchmarks/figures.py --check   # exit 1 if a block differs from its record

A block is the text between ``<!-- figures: NAME ... -->`` and ``<!-- /figures: NAME -->``; NAME
picks the record and the renderer (:data:`BLOCKS`).  Nothing between the markers is written by
hand: re-run the benchmark with ``--record benchmarks/records/FILE.json`` and then this script.
``tests/test_readme_figures.py`` checks that every block equals its rendering, so a figure cannot
drift from its record.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "benchmarks" / "records"

_SUP = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")


def _pow2(n: int) -> str:
    """``2²⁴`` for 16777216 (n a power of two), else the number."""
    k = n.bit_length() - 1
    return f"2{str(k).translate(_SUP)}" if n == 1 << k else f"{n:,}"


def load(name: str) -> dict:
    """The committed record ``benchmarks/records/NAME.json``."""
    with open(RECORDS / f"{name}.json") as fh:
        return json.load(fh)


def provenance(rec: dict) -> str:
    """Where the figures come from: date, commit, command, machine, load and versions."""
    commit = (rec.get("commit") or "unknown")[:7]
    dirty = " with uncommitted changes" if rec.get("uncommitted_changes") else ""
    before, after = rec["load_average_before"][0], rec["load_average_after"][0]
    cpus = rec["cpus"]
    busy = (before > 0.75 * cpus, after > 0.75 * cpus)
    state = {
        (True, True): "busy with other jobs throughout",
        (False, True): "quiet at the start, busy with other jobs by the end",
        (True, False): "busy with other jobs at the start, quiet by the end",
        (False, False): "quiet",
    }[busy]
    load_note = f"load average {before:.1f} at the start and {after:.1f} at the end on {cpus} cores ({state})"
    versions = ", ".join(f"{k} {v}" for k, v in rec["versions"].items() if v is not None and k != "fp8sim")
    return (
        f"Record `benchmarks/records/{rec['benchmark'].removeprefix('bench_')}.json`: `{rec['command'].strip()}` "
        f"on {rec['date']}, commit {commit}{dirty}; {rec['cpu']}, {cpus} cores, {rec['numba_threads']} numba "
        f"threads; {versions}; {load_note}."
    )


def render_rounding(rec: dict) -> str:
    """The rounding/encoding throughput table and its targets (bench_rounding.py)."""
    peers = f" (gfloat and pychop on the first {_pow2(rec['peer_n'])})" if rec["peer_n"] != rec["n"] else ""
    lines = [
        provenance(rec),
        f"{_pow2(rec['n'])} float32 N(0,1) elements{peers}, each case the best of {rec['rounds']} rounds"
        + (f"; not installed: {', '.join(rec['skipped'])}" if rec["skipped"] else "")
        + ":",
        "",
        "| case | Melem/s | × ml_dtypes (f32 cast) |",
        "|---|---:|---:|",
    ]
    for name, r in rec["results"].items():
        lines.append(f"| {name} | {r['elements_per_s'] / 1e6:.1f} | {r['ratio_vs_ml_dtypes_f32']:.2f} |")
    return "\n".join([*lines, "", targets_sentence(rec)])


def targets_sentence(rec: dict) -> str:
    """The targets of bench_rounding.py as ratios within the recorded run, each met or MISSED."""
    against = {
        "ml_dtypes astype f32->e4m3": "ml_dtypes' float32 cast",
        "ml_dtypes astype f64->e4m3": "ml_dtypes' float64 cast",
    }
    what = {
        "fp8sim.encode f32 rne": "RNE float32 → E4M3 encode",
        "fp8sim.encode f32 sr": "SR encode",
        "fp8sim.encode f64 rne": "float64 encode",
    }
    parts = [
        f"{what[t['case']]} **{t['ratio']:.2f}×** {against[t['against']]} (target ≥ {t['need']:g}×: "
        + ("met" if t["met"] else "**MISSED**")
        + ")"
        for t in rec["targets"]
    ]
    missed = sum(not t["met"] for t in rec["targets"])
    verdict = f"{missed} of {len(parts)} targets missed." if missed else "All targets met."
    return "Targets, as ratios within this run: " + "; ".join(parts) + ". " + verdict


def render_rounding_targets(rec: dict) -> str:
    """The targets sentence with a short provenance (for pages that link to the full table)."""
    commit = (rec.get("commit") or "unknown")[:7]
    return (
        f"Speed (`python benchmarks/bench_rounding.py`, record of {rec['date']}, commit {commit}, "
        f"{rec['cpus']} cores at load average {rec['load_average_before'][0]:.1f}): " + targets_sentence(rec)
    )


def _ms(s: float) -> str:
    return f"{s * 1e3:.0f} ms" if s < 10 else f"{s:.1f} s"


def render_fidelity(rec: dict) -> str:
    """The table of exact against fast GEMMs and training steps (bench_fidelity.py)."""
    lines = [
        provenance(rec),
        f"Each case the best of {rec['rounds']} rounds, N(0,1) float32 inputs, `fp8sim.gemm` end to end:",
        "",
        "| n × n × n | recipe | numpy float32 matmul | exact (default) | fast | fast / exact |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for g in rec["gemm"]:
        lines.append(
            f"| {g['n']}³ | {g['recipe']} | {_ms(g['numpy_s'])} | {_ms(g['exact_s'])} | {_ms(g['fast_s'])} "
            f"| {g['fast_over_exact']:.2f} |"
        )
    if rec["train"]:
        lines += [
            "",
            f"`fp8sim.training.train_one` (the default model, {rec['train'][0]['steps']} steps, best of "
            f"{rec['train_rounds']} rounds), seconds per step of the training loop:",
            "",
            "| recipe | exact (default) | fast | fast / exact |",
            "|---|---:|---:|---:|",
        ]
        for t in rec["train"]:
            lines.append(
                f"| {t['recipe']} | {t['exact_s_per_step']:.3f} | {t['fast_s_per_step']:.3f} "
                f"| {t['fast_over_exact']:.2f} |"
            )
    return "\n".join(lines)


def render_fidelity_summary(rec: dict) -> str:
    """One paragraph: how fast ``fidelity="fast"`` is against the default, from the record."""

    def ratios(recipe: str) -> str:
        return ", ".join(f"{g['fast_over_exact']:.2f}× at {g['n']}³" for g in rec["gemm"] if g["recipe"] == recipe)

    promoting = [g["fast_over_exact"] for g in rec["gemm"] if g["recipe"] != "per-tensor-no-promotion"]
    promoting += [t["fast_over_exact"] for t in rec["train"]]
    unpromoted = [g["fast_over_exact"] for g in rec["gemm"] if g["recipe"] == "per-tensor-no-promotion"]
    if min(promoting) >= 1:
        verdict = "took longer than the bit-exact default for every recipe that promotes partial sums and in training"
    else:
        verdict = "was not reliably faster than the bit-exact default for the recipes that promote partial sums"
    train = ", ".join(f"{t['recipe']} {t['fast_over_exact']:.2f}×" for t in rec["train"])
    commit = (rec.get("commit") or "unknown")[:7]
    only = bool(unpromoted) and max(unpromoted) < 1
    return (
        f'`fidelity="fast"` {verdict} (time of fast over exact: GEMM deepseek-v3 {ratios("deepseek-v3")}, '
        f"per-tensor {ratios('per-tensor')}"
        + (f"; a training step {train}" if train else "")
        + "). "
        + ("Only without promotion" if only else "Without promotion")
        + ", where it is a single float32 BLAS GEMM and misses the accumulator's truncation entirely, "
        + ("was it quicker" if only else "it took")
        + f": {ratios('per-tensor-no-promotion')}. (Record of `python benchmarks/bench_fidelity.py`, "
        f"{rec['date']}, commit {commit}, {rec['cpus']} cores at load average {rec['load_average_before'][0]:.1f}; "
        "the table is in benchmarks/RESULTS.md.)"
    )


#: block name -> (record name, renderer)
BLOCKS: dict[str, tuple[str, Callable[[dict], str]]] = {
    "rounding": ("rounding", render_rounding),
    "rounding-targets": ("rounding", render_rounding_targets),
    "fidelity": ("fidelity", render_fidelity),
    "fidelity-summary": ("fidelity", render_fidelity_summary),
}

#: file -> the blocks it must hold
FILES: dict[str, tuple[str, ...]] = {
    "README.md": ("rounding", "fidelity-summary"),
    "benchmarks/RESULTS.md": ("rounding", "fidelity"),
    "docs/rounding.md": ("rounding",),
    "docs/gemm.md": ("fidelity-summary",),
    "docs/training.md": ("fidelity-summary",),
    "docs/results.md": ("rounding-targets", "fidelity-summary"),
}

_BLOCK = re.compile(r"(<!-- figures: ([\w-]+)[^>]*-->)\n(?:(.*?)\n)?(<!-- /figures: \2 -->)", re.S)


def blocks(text: str) -> list[tuple[str, str]]:
    """(name, content) of every block in ``text``."""
    return [(m.group(2), m.group(3) or "") for m in _BLOCK.finditer(text)]


def render(name: str) -> str:
    record, fn = BLOCKS[name]
    return fn(load(record))


def rewrite(text: str) -> str:
    """``text`` with every block's content replaced by its rendering."""
    return _BLOCK.sub(lambda m: f"{m.group(1)}\n{render(m.group(2))}\n{m.group(4)}", text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only check; exit 1 if a block is out of date")
    args = ap.parse_args(argv)
    bad = []
    for rel, names in FILES.items():
        path = ROOT / rel
        text = path.read_text(encoding="utf-8")
        found = {n for n, _ in blocks(text)}
        missing = [n for n in names if n not in found]
        if missing:
            bad.append(f"{rel}: no block {', '.join(missing)}")
        new = rewrite(text)
        if new != text:
            if args.check:
                bad.append(f"{rel}: figures differ from the records")
            else:
                path.write_text(new, encoding="utf-8")
                print(f"rewrote {rel}")
    for b in bad:
        print(b, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
