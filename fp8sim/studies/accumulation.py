"""Accumulation study: how the FP8 tensor-core accumulator, promotion and the GEMM recipe set the error.

Three parts, each for N(0,1), U(0,1) and outlier-heavy inputs (``"outlier"``:
N(0,1) with 0.5 % of the entries multiplied by 50):

1. ``accumulator``: the accumulation error alone, as DeepSeek-V3 and
   docs/tensorcore.md measure it: A (M x K) and B (K x N) are draws
   quantised to e4m3 without scaling (RNE, saturating); the reference is the
   fp64 product of the same FP8 values; each accumulator model (``wgmma``,
   ``mma.sync``, ``exact``, ``fp32``) runs with and without promotion every
   128, for K = 128 .. 16384;
2. ``recipe``: the whole GEMM of each recipe (quantization included) against
   the fp64 GEMM of the unquantized inputs, for the same K;
3. ``promotion``: the promotion interval P = 32 .. K of the wgmma model at a
   fixed K (4096; 2048 with ``quick``).

Errors are elementwise ``|y - ref| / |ref|`` (max and median over the
outputs with ref != 0) and the relative Frobenius norm.  Output in
``out_dir``: ``accumulation_study.csv`` and four log-log PNG figures.
"""

from __future__ import annotations

import csv
import os
import time

import numpy as np

from .._names import unknown_name_error

__all__ = [
    "CSV_NAME",
    "DISTRIBUTIONS",
    "MODELS",
    "RECIPES",
    "COLUMNS",
    "DEEPSEEK_V3_K4096_NO_PROMOTION_MAX",
    "H200_K4096",
    "make_inputs",
    "errors",
    "accumulate",
    "run",
]

#: the file of the study's table, in ``out_dir``
CSV_NAME = "accumulation_study.csv"
DISTRIBUTIONS = ("normal", "uniform", "outlier")
MODELS = ("wgmma", "mma.sync", "exact", "fp32")
RECIPES = ("deepseek-v3", "per-tensor", "per-tensor-no-promotion", "mxfp8", "te-hybrid", "bf16", "fp32")
COLUMNS = ("part", "distribution", "config", "K", "promote_every", "max_rel", "median_rel", "rel_frobenius", "n")

# What DeepSeek-V3 states (arXiv 2412.19437, section 3.3.2) and what the H200 gave
# (docs/tensorcore.md, chained wgmma captures, 128 x 128 outputs, K = 4096).
DEEPSEEK_V3_K4096_NO_PROMOTION_MAX = 0.02  # "a maximum relative error of nearly 2%"
H200_K4096 = {
    ("uniform", "no promotion"): {"max_rel": 0.0704, "median_rel": 0.0660},
    ("uniform", "promote 128"): {"max_rel": 0.00060, "median_rel": 0.00049},
    ("normal", "no promotion"): {"median_rel": 0.00097},
    ("normal", "promote 128"): {"median_rel": 0.00012},
}


def make_inputs(dist: str, M: int, K: int, N: int, rng: np.random.Generator):
    """float32 x (M, K), w (K, N) of one distribution."""
    if dist == "uniform":
        x, w = rng.random((M, K)), rng.random((K, N))
    elif dist == "normal":
        x, w = rng.standard_normal((M, K)), rng.standard_normal((K, N))
    elif dist == "outlier":
        x, w = rng.standard_normal((M, K)), rng.standard_normal((K, N))
        x[rng.random((M, K)) < 0.005] *= 50.0
        w[rng.random((K, N)) < 0.005] *= 50.0
    else:
        raise unknown_name_error("distribution", dist, DISTRIBUTIONS)
    return x.astype(np.float32), w.astype(np.float32)


def errors(ref, y) -> dict:
    """Elementwise relative errors of ``y`` against ``ref`` (max and median over ref != 0 and finite y),
    the relative Frobenius error and the number of outputs counted."""
    ref = np.asarray(ref, np.float64)
    y = np.asarray(y, np.float64)
    m = (ref != 0) & np.isfinite(y)
    rel = np.abs(y[m] - ref[m]) / np.abs(ref[m])
    fro = float(np.linalg.norm((y - ref)[np.isfinite(y)]) / np.linalg.norm(ref))
    return {
        "max_rel": float(rel.max()) if rel.size else float("nan"),
        "median_rel": float(np.median(rel)) if rel.size else float("nan"),
        "rel_frobenius": fro,
        "n": int(m.sum()),
    }


def accumulate(a_codes, b_codes, model: str, promote):
    """The FP8 product of codes (e4m3, unit scales) on one accumulator model (float32 result)."""
    from ..gemms.engine import scaled_matmul

    M, K = a_codes.shape
    N = b_codes.shape[1]
    return scaled_matmul(
        a_codes,
        b_codes,
        np.ones((M, 1), np.float32),
        np.ones((1, N), np.float32),
        a_format="e4m3",
        b_format="e4m3",
        kscale=K,
        accumulator=model,
        promote_every=promote,
        scale_at="epilogue",
    )


def run(
    out_dir,
    *,
    quick: bool = False,
    progress: bool = True,
    seed: int = 0,
    k_max=None,
    size=None,
    distributions=None,
    recipes=None,
) -> dict:
    """Run the study; write CSV and figures to ``out_dir``; return a summary dict.

    ``k_max`` (K = 128, 256, ... up to it; default 16384, 4096 with ``quick``),
    ``size`` (M = N of the wgmma runs; default 128, 32 with ``quick``),
    ``distributions`` and ``recipes`` restrict or resize the study.
    """
    from tqdm.auto import tqdm

    from .. import gemms, rounding

    dists = tuple(distributions) if distributions is not None else DISTRIBUTIONS
    recs = tuple(recipes) if recipes is not None else RECIPES
    if not dists:
        raise ValueError(f"no distributions given; known: {', '.join(DISTRIBUTIONS)}")
    for d in dists:
        if d not in DISTRIBUTIONS:
            raise unknown_name_error("distribution", d, DISTRIBUTIONS)
    for r in recs:
        gemms.recipe(r)  # raises on an unknown name, listing the known ones
    k_max = int(k_max) if k_max is not None else (4096 if quick else 16384)
    if k_max < 128:
        raise ValueError(f"k_max must be at least 128, got {k_max}")
    size = int(size) if size is not None else (32 if quick else 128)
    if size < 1:
        raise ValueError(f"size must be positive, got {size}")
    t0 = time.time()
    os.makedirs(out_dir, exist_ok=True)
    Ks = [128 * 2**i for i in range(int(np.log2(k_max // 128)) + 1)]  # 128 .. k_max
    M = N = size
    M_slow = max(1, size // 4)  # the general (non-wgmma) models run on the slow reference path
    K_sweep = min(2048 if quick else 4096, Ks[-1])
    Ps = [32 * 2**i for i in range(int(np.log2(K_sweep // 32)) + 1)]
    rng = np.random.default_rng(seed)
    rows = []
    n_steps = len(dists) * (len(Ks) * (len(MODELS) * 2 + len(recs)) + len(Ps))
    bar = tqdm(total=n_steps, desc="accumulation study", disable=not progress, leave=False)
    data = {}
    for dist in dists:
        xs, ws = make_inputs(dist, M, max(Ks), N, rng)
        data[dist] = (xs, ws)
        for K in Ks:
            x, w = xs[:, :K], ws[:K]
            a = rounding.encode(x, "e4m3", saturate=True)
            b = rounding.encode(w, "e4m3", saturate=True)
            ref = rounding.decode(a, "e4m3").astype(np.float64) @ rounding.decode(b, "e4m3").astype(np.float64)
            for model in MODELS:
                mm = M if model == "wgmma" else M_slow
                for promote in (None, 128):
                    y = accumulate(a[:mm], b[:, :mm], model, promote)
                    e = errors(ref[:mm, :mm], y)
                    rows.append(
                        {
                            "part": "accumulator",
                            "distribution": dist,
                            "config": model,
                            "K": K,
                            "promote_every": promote or 0,
                            **e,
                        }
                    )
                    bar.update()
            ref64 = x.astype(np.float64) @ w.astype(np.float64)
            for name in recs:
                y = gemms.gemm(x, w, name)
                rows.append(
                    {
                        "part": "recipe",
                        "distribution": dist,
                        "config": name,
                        "K": K,
                        "promote_every": gemms.recipe(name).promote_every or 0,
                        **errors(ref64, y),
                    }
                )
                bar.update()
        x, w = xs[:, :K_sweep], ws[:K_sweep]
        a = rounding.encode(x, "e4m3", saturate=True)
        b = rounding.encode(w, "e4m3", saturate=True)
        ref = rounding.decode(a, "e4m3").astype(np.float64) @ rounding.decode(b, "e4m3").astype(np.float64)
        for P in Ps:
            y = accumulate(a, b, "wgmma", P)
            rows.append(
                {
                    "part": "promotion",
                    "distribution": dist,
                    "config": "wgmma",
                    "K": K_sweep,
                    "promote_every": P,
                    **errors(ref, y),
                }
            )
            bar.update()
    bar.close()
    csv_path = os.path.join(out_dir, CSV_NAME)
    with open(csv_path, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=COLUMNS)
        wr.writeheader()
        for r in rows:
            wr.writerow({k: r[k] for k in COLUMNS})
    figures = _figures(rows, out_dir)
    headline = _headline(rows, Ks)
    return {
        "csv": csv_path,
        "figures": figures,
        "rows": rows,
        "headline": headline,
        "seconds": time.time() - t0,
        "quick": quick,
    }


def _headline(rows, Ks) -> dict:
    """wgmma errors at K = 4096 (or the largest K run) beside DeepSeek-V3's statement and the H200."""
    K = 4096 if 4096 in Ks else max(Ks)
    out: dict = {"K": K, "deepseek_v3_max_no_promotion": DEEPSEEK_V3_K4096_NO_PROMOTION_MAX, "h200": H200_K4096}
    for r in rows:
        if r["part"] == "accumulator" and r["config"] == "wgmma" and r["K"] == K:
            key = (r["distribution"], "promote 128" if r["promote_every"] else "no promotion")
            out[key] = {k: r[k] for k in ("max_rel", "median_rel", "rel_frobenius")}
    return out


def _same_as(curves: dict) -> dict:
    """``{label: earlier label}`` for each curve whose points (every panel's) are those of an earlier
    curve: drawn on top of it, it would hide; the legend names the pair instead."""
    out: dict = {}
    labels = list(curves)
    for i, a in enumerate(labels):
        for b in labels[:i]:
            if b not in out and curves[a] == curves[b]:
                out[a] = b
                break
    return out


#: the look of the i-th of several curves that may lie on one another: later curves are drawn
#: thinner with smaller hollow markers, so a curve under another one still shows around it
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def curve_style(i: int, n: int) -> dict:
    return {
        "marker": _MARKERS[i % len(_MARKERS)],
        "ms": 3.0 + 4.0 * (n - 1 - i) / max(1, n - 1),
        "mfc": "none",
        "lw": 0.9 + 1.6 * (n - 1 - i) / max(1, n - 1),
    }


def _figures(rows, out_dir) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..plotting import k_axis, log_line, zero_lane, zero_legend_handle

    paths = []
    dists = list(dict.fromkeys(r["distribution"] for r in rows))
    recs = list(dict.fromkeys(r["config"] for r in rows if r["part"] == "recipe"))

    def panels():
        fig, axes = plt.subplots(1, len(dists), figsize=(5 * len(dists), 4.2), sharey=True, squeeze=False)
        return fig, axes[0]

    def finish(fig, axes, legend, zeros, name):
        handles, labels = legend
        if zeros:
            zero_lane(axes[0])  # (the panels share y)
            handles = [*handles, zero_legend_handle()]
            labels = [*labels, handles[-1].get_label()]
        axes[-1].legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
        fig.tight_layout()
        p = os.path.join(out_dir, name)
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)

    def points(part, dist, config, promote, metric):
        return sorted(
            (r["K"], r[metric])
            for r in rows
            if r["part"] == part
            and r["distribution"] == dist
            and r["config"] == config
            and (promote is None or r["promote_every"] == promote)
        )

    for metric, label in (("median_rel", "median"), ("max_rel", "max")):
        fig, axes = panels()
        keys = [(m, p) for m in MODELS for p in (0, 128)]
        curves = {k: [points("accumulator", d, k[0], k[1], metric) for d in dists] for k in keys}
        twin = _same_as(curves)
        zeros = 0
        for ax, (d_i, dist) in zip(axes, enumerate(dists)):
            for i, model in enumerate(MODELS):
                for promote, ls in ((0, "-"), (128, "--")):
                    pts = curves[(model, promote)][d_i]
                    if not pts:
                        continue
                    name = f"{model}" + (" + promote 128" if promote else "")
                    if (model, promote) in twin:
                        m, p = twin[(model, promote)]
                        name += f" (= {m}{' + promote 128' if p else ''})"
                    slot = 2 * i + (promote > 0) - (len(keys) - 1) / 2
                    _, nz = log_line(
                        ax, [k for k, _ in pts], [v for _, v in pts], ls, color=f"C{i}", zero_dodge=0.07 * slot, zero_filled=bool(promote),
                        label=name, **curve_style(i, len(MODELS)),
                    )  # fmt: skip
                    zeros += nz
            if dist == "uniform":
                ax.axhline(DEEPSEEK_V3_K4096_NO_PROMOTION_MAX, color="k", lw=0.8, ls=":")
                ax.annotate(
                    "DeepSeek-V3: 'nearly 2%' at K=4096", (130, DEEPSEEK_V3_K4096_NO_PROMOTION_MAX * 1.15), fontsize=7
                )
            ax.set_yscale("log")
            k_axis(ax, [r["K"] for r in rows if r["part"] == "accumulator"])
            ax.set_title(f"{dist} inputs (e4m3, no scaling)")
            ax.set_xlabel("K")
            ax.grid(True, which="major", alpha=0.3)
        axes[0].set_ylabel(f"{label} elementwise relative error vs fp64")
        finish(fig, axes, axes[0].get_legend_handles_labels(), zeros, f"accumulator_{label}_vs_K.png")
    if recs:
        fig, axes = panels()
        curves = {n: [points("recipe", d, n, None, "rel_frobenius") for d in dists] for n in recs}
        twin = _same_as(curves)
        zeros = 0
        for ax, (d_i, dist) in zip(axes, enumerate(dists)):
            for i, name in enumerate(recs):
                pts = curves[name][d_i]
                if not pts:
                    continue
                shown = name + (f" (= {twin[name]})" if name in twin else "")
                _, nz = log_line(ax, [k for k, _ in pts], [v for _, v in pts], "-", color=f"C{i}", zero_dodge=0.07 * (i - (len(recs) - 1) / 2),
                                 label=shown, **curve_style(i, len(recs)))  # fmt: skip
                zeros += nz
            ax.set_yscale("log")
            k_axis(ax, [r["K"] for r in rows if r["part"] == "recipe"])
            ax.set_title(f"recipes, {dist} inputs")
            ax.set_xlabel("K")
            ax.grid(True, which="major", alpha=0.3)
        axes[0].set_ylabel("relative Frobenius error vs fp64 GEMM")
        finish(fig, axes, axes[0].get_legend_handles_labels(), zeros, "recipes_vs_K.png")
    fig, ax = plt.subplots(figsize=(6, 4.2))
    zeros = 0
    for i, dist in enumerate(dists):
        for metric, ls in (("median_rel", "-"), ("max_rel", "--")):
            pts = sorted(
                (r["promote_every"], r[metric]) for r in rows if r["part"] == "promotion" and r["distribution"] == dist
            )
            _, nz = log_line(ax, [k for k, _ in pts], [v for _, v in pts], ls, color=f"C{i}", marker="o", ms=3,
                             zero_dodge=0.07 * (2 * i + (metric == "max_rel") - (2 * len(dists) - 1) / 2),
                             zero_filled=metric == "max_rel", label=f"{dist} {metric.split('_')[0]}")  # fmt: skip
            zeros += nz
    ax.set_yscale("log")
    k_axis(ax, [r["promote_every"] for r in rows if r["part"] == "promotion"])
    K = max(r["K"] for r in rows if r["part"] == "promotion")
    ax.set_title(f"wgmma, promotion interval sweep (K = {K})")
    ax.set_xlabel("promotion interval P (K elements)")
    ax.set_ylabel("elementwise relative error vs fp64")
    ax.grid(True, which="major", alpha=0.3)
    finish(fig, [ax], ax.get_legend_handles_labels(), zeros, "promotion_interval.png")
    return paths
