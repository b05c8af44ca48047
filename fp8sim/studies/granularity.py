"""Granularity study: how the choice of scale granularity and scale policy sets FP8 quantization error.

Every granularity (per-tensor, per-row, per-column, 1x128 tiles, 128x128
blocks, groups of 32, OCP MX32, NVFP4-style two-level, delayed per-tensor
scaling) and every scale policy (fp32, bf16, power-of-two with
FLOOR/CEIL/RCEIL/EVEN rounding, E8M0 for MX) is applied, for e4m3 and
e5m2, to synthetic tensors that mimic LLM training data:

* ``gaussian``: N(0, 1) activations;
* ``student_t``: heavy-tailed (Student-t, 3 degrees of freedom);
* ``outlier_channels``: N(0, 1) with a few channels (columns) 100x larger,
  as in LLM activations;
* ``outlier_tokens``: a few rows (tokens) 100x larger, as DeepSeek-V3 notes
  for activation gradients;
* ``lognormal_grad``: gradients whose magnitudes are log-normal over many
  decades (sigma = 3 in natural log: ~8 decades across +-3 sigma).

Output in ``out_dir``: ``granularity_study.csv`` (one row per
distribution x format x granularity x policy with every metric),
``sqnr_by_granularity.png``, ``sqnr_policy_heatmap.png``,
``error_histograms.png`` and ``scale_heatmap.png``.
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
    "FORMATS",
    "GRANULARITIES",
    "POLICIES",
    "MX_POLICIES",
    "COLUMNS",
    "make_tensor",
    "run",
]

#: the file of the study's table, in ``out_dir``
CSV_NAME = "granularity_study.csv"
DISTRIBUTIONS = ("gaussian", "student_t", "outlier_channels", "outlier_tokens", "lognormal_grad")
FORMATS = ("e4m3", "e5m2")
GRANULARITIES = ("tensor", "row", "col", "1x128", "128x128", "g32", "mx32", "nvfp4", "delayed")
# (scale_format, scale_rounding); MX uses e8m0 with each rounding, NVFP4 its own E4M3 x FP32
POLICIES = (("fp32", None), ("bf16", "ceil"), ("pow2", "floor"), ("pow2", "ceil"), ("pow2", "rceil"), ("pow2", "even"))
MX_POLICIES = (("e8m0", "floor"), ("e8m0", "ceil"), ("e8m0", "rceil"), ("e8m0", "even"))
COLUMNS = (
    "distribution",
    "format",
    "granularity",
    "scale_format",
    "scale_rounding",
    "sqnr_db",
    "rel_frobenius",
    "max_rel_error",
    "fraction_saturated",
    "fraction_underflow",
    "fraction_subnormal",
    "n_scales",
    "bits_per_element",
)


def make_tensor(kind: str, shape, rng: np.random.Generator) -> np.ndarray:
    """One synthetic float32 tensor of the given kind (see the module docstring)."""
    M, N = shape
    if kind == "gaussian":
        x = rng.standard_normal((M, N))
    elif kind == "student_t":
        x = rng.standard_t(3, (M, N))
    elif kind == "outlier_channels":
        x = rng.standard_normal((M, N))
        ch = rng.choice(N, size=max(4, N // 256), replace=False)
        x[:, ch] *= 100.0
    elif kind == "outlier_tokens":
        x = rng.standard_normal((M, N))
        tok = rng.choice(M, size=max(2, M // 128), replace=False)
        x[tok, :] *= 100.0
    elif kind == "lognormal_grad":
        x = rng.choice([-1.0, 1.0], (M, N)) * np.exp(rng.normal(0.0, 3.0, (M, N))) * 1e-4
    else:
        raise unknown_name_error("distribution", kind, DISTRIBUTIONS)
    return x.astype(np.float32)


def _configs(granularities=GRANULARITIES):
    for g in granularities:
        if g == "mx32":
            yield from ((g, sf, sr) for sf, sr in MX_POLICIES)
        elif g == "nvfp4":
            yield g, None, None
        else:
            yield from ((g, sf, sr) for sf, sr in POLICIES)


def _choose(kind: str, plural: str, given, known) -> tuple:
    """``given`` (default: all of ``known``), each checked against ``known``."""
    if given is None:
        return tuple(known)
    given = tuple(given)
    if not given:
        raise ValueError(f"no {plural} given; known: {', '.join(known)}")
    for v in given:
        if v not in known:
            raise unknown_name_error(kind, v, known, plural=plural)
    return given


def run(
    out_dir,
    *,
    quick: bool = False,
    progress: bool = True,
    seed: int = 0,
    shape=None,
    formats=None,
    distributions=None,
    granularities=None,
) -> dict:
    """Run the study; write the CSV and PNG figures into ``out_dir``.

    ``quick=True`` uses 128x1024 tensors (seconds); the default 512x4096.
    ``shape``, ``formats``, ``distributions`` and ``granularities`` restrict
    or resize the study (default: all of :data:`FORMATS`,
    :data:`DISTRIBUTIONS` and :data:`GRANULARITIES`); an unknown name raises
    :class:`~fp8sim.formats.UnknownNameError`.
    Returns ``{"csv": path, "figures": [paths], "rows": [dict, ...],
    "key": {(distribution, format, granularity): sqnr_db}, "seconds": float}``
    where ``key`` holds the default-policy (fp32 scales; E8M0 FLOOR for MX)
    SQNR of every granularity.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator
    from tqdm.auto import tqdm

    from .. import metrics
    from ..scaling import DelayedScaling, quantize

    fmts = _choose("format", "formats", formats, FORMATS)
    dists = _choose("distribution", "distributions", distributions, DISTRIBUTIONS)
    grans = _choose("granularity", "granularities", granularities, GRANULARITIES)
    if shape is None:
        shape = (128, 1024) if quick else (512, 4096)
    shape = tuple(int(v) for v in shape)
    if len(shape) != 2 or min(shape) < 1:
        raise ValueError(f"shape must be two positive sizes (rows, cols), got {shape!r}")
    t0 = time.perf_counter()
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(seed)
    tensors = {d: make_tensor(d, shape, rng) for d in dists}
    # delayed scaling: the history holds the amaxes of 4 earlier tensors of the same kind
    hist_len = 4
    history = {d: [float(np.max(np.abs(make_tensor(d, shape, rng)))) for _ in range(hist_len)] for d in dists}
    configs = list(_configs(grans))
    rows, keep_q = [], {}
    bar = tqdm(total=len(dists) * len(fmts) * len(configs), desc="granularity study", disable=not progress, leave=False)
    for dist in dists:
        x = tensors[dist]
        x64 = x.astype(np.float64)
        for fmt in fmts:
            for g, sf, sr in configs:
                gran = DelayedScaling(hist_len, amax_history=history[dist]) if g == "delayed" else g
                q = quantize(x, fmt, gran, scale_format=sf, scale_rounding=sr)
                d = q.dequantize(np.float64)
                s = metrics.summary(x64, q)
                bits = 8.0 * q.nbytes / x.size
                rows.append(
                    {
                        "distribution": dist,
                        "format": fmt,
                        "granularity": g,
                        "scale_format": q.scale_format,
                        "scale_rounding": q.scale_rounding or "",
                        **{
                            k: s[k]
                            for k in (
                                "sqnr_db",
                                "rel_frobenius",
                                "max_rel_error",
                                "fraction_saturated",
                                "fraction_underflow",
                                "fraction_subnormal",
                            )
                        },
                        "n_scales": int(q.scales.size),
                        "bits_per_element": bits,
                    }
                )
                if dist == "outlier_channels" and sf in (None, "fp32", "e8m0") and (sr in (None, "floor")):
                    keep_q[(fmt, g)] = (q, d)
                bar.update(1)
    bar.close()

    csv_path = os.path.join(out_dir, CSV_NAME)
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})

    def default(r):
        return (
            (r["scale_format"] == "fp32")
            or (r["granularity"] == "mx32" and r["scale_rounding"] == "floor")
            or r["granularity"] == "nvfp4"
        )

    key = {(r["distribution"], r["format"], r["granularity"]): r["sqnr_db"] for r in rows if default(r)}
    figures = []

    # 1. SQNR per granularity and distribution (default policy), one panel per format
    fig, axes = plt.subplots(1, len(fmts), figsize=(7 * len(fmts), 4.5), sharey=True, squeeze=False)
    axes = axes[0]
    width = 0.8 / len(dists)
    xs = np.arange(len(grans))
    for ax, fmt in zip(axes, fmts):
        for k, dist in enumerate(dists):
            vals = [key[(dist, fmt, g)] for g in grans]
            ax.bar(xs + (k - len(dists) / 2 + 0.5) * width, vals, width, label=dist)
        ax.set_xticks(xs, grans, rotation=30)
        ax.set_title(f"{fmt}: SQNR (fp32 scales; MX E8M0 floor)")
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("SQNR [dB]")
    axes[-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)  # not over the bars
    fig.tight_layout()
    figures.append(os.path.join(out_dir, "sqnr_by_granularity.png"))
    fig.savefig(figures[-1], dpi=110)
    plt.close(fig)

    if "outlier_channels" not in dists:  # figures 2-4 show the outlier-channel tensor
        return {
            "csv": csv_path,
            "figures": figures,
            "rows": rows,
            "key": key,
            "seconds": time.perf_counter() - t0,
            "shape": shape,
        }

    def panels(n, size):
        fig, axes = plt.subplots(1, n, figsize=(size[0] * n, size[1]), squeeze=False)
        return fig, axes[0]

    def save(fig, name):
        fig.tight_layout()
        figures.append(os.path.join(out_dir, name))
        fig.savefig(figures[-1], dpi=110)
        plt.close(fig)

    # 2. policy x granularity heat map of SQNR for outlier activations
    pols = [f"{sf}/{sr}" if sr else sf for sf, sr in POLICIES]
    gs = [g for g in grans if g not in ("mx32", "nvfp4")]
    if gs:
        fig, axes = panels(len(fmts), (7, 4.5))
        for ax, fmt in zip(axes, fmts):
            H = np.full((len(gs), len(pols)), np.nan)
            for r in rows:
                if r["distribution"] == "outlier_channels" and r["format"] == fmt and r["granularity"] in gs:
                    p = f"{r['scale_format']}/{r['scale_rounding']}" if r["scale_rounding"] else r["scale_format"]
                    if p in pols:
                        H[gs.index(r["granularity"]), pols.index(p)] = r["sqnr_db"]
            im = ax.imshow(H, cmap="viridis", aspect="auto")
            ax.set_xticks(range(len(pols)), pols, rotation=30)
            ax.set_yticks(range(len(gs)), gs)
            for i in range(len(gs)):
                for j in range(len(pols)):
                    ax.text(j, i, f"{H[i, j]:.1f}", ha="center", va="center", color="w", fontsize=7)
            ax.set_title(f"{fmt}, outlier channels: SQNR [dB] by scale policy")
            fig.colorbar(im, ax=ax)
        save(fig, "sqnr_policy_heatmap.png")

    # 3. error histograms (outlier channels): log10 relative error per element
    hist_g = [g for g in ("tensor", "row", "1x128", "128x128", "mx32") if g in grans]
    if hist_g:
        x = tensors["outlier_channels"].astype(np.float64)
        fig, axes = panels(len(fmts), (7, 4))
        bins = np.linspace(-8, 1, 73)
        for ax, fmt in zip(axes, fmts):
            for g in hist_g:
                d = keep_q[(fmt, g)][1]
                nz = x != 0
                rel = np.abs(d[nz] - x[nz]) / np.abs(x[nz])
                lr = np.log10(np.maximum(rel, 1e-8))
                ax.hist(lr, bins=bins, histtype="step", label=g, density=True)
            ax.set_xlabel("log10 |relative error| (1e-8 = exact)")
            ax.set_title(f"{fmt}, outlier channels")
        axes[-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
        axes[0].set_ylabel("density")
        save(fig, "error_histograms.png")

    # 4. heat map of per-block scales for the outlier tensor
    map_g = [g for g in ("1x128", "128x128", "mx32") if g in grans]
    if map_g:
        fig, axes = panels(len(map_g), (5, 4.5))
        for ax, g in zip(axes, map_g):
            q = keep_q[(fmts[0], g)][0]
            im = ax.imshow(np.log2(q.scales.astype(np.float64)), aspect="auto", cmap="magma", interpolation="nearest")
            ax.set_title(f"{fmts[0]} {g}: log2(scale), scales {q.scales.shape}")
            # block indices are integers: no fractional ticks (one block row would get -0.4 .. 0.4)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
            ax.yaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
            bm, bn = q.block_shape
            ax.set_xlabel(f"block column ({bn} elements of K each)")
            ax.set_ylabel(f"block row ({bm} token{'s' if bm > 1 else ''} each)")
            fig.colorbar(im, ax=ax)
        fig.suptitle("Per-block scales of an activation tensor with outlier channels")
        save(fig, "scale_heatmap.png")

    return {
        "csv": csv_path,
        "figures": figures,
        "rows": rows,
        "key": key,
        "seconds": time.perf_counter() - t0,
        "shape": shape,
    }
