"""Accumulators by architecture: Hopper, Blackwell and CDNA3 on the same FP8 products.

For each input family of :mod:`fp8sim.studies.accumulation` (``"normal"``, ``"uniform"``,
``"outlier"``) A (M x K) and B (K x N) are drawn, scaled so that their largest magnitude is 240
and quantized to e4m3 without block scales (RNE, saturating).  Every such value is also an
e4m3fnuz value (e4m3 below 240 re-encoded), so the three accumulators multiply *the same*
products:

* ``"sm90 wgmma"`` -- Hopper's FP8 ``wgmma`` (13 fraction bits, truncation; validated on H200),
  without promotion and with promotion into fp32 every 128 (DeepSeek-V3);
* ``"sm100 tcgen05 f8f6f4"`` -- Blackwell's ``tcgen05.mma kind::f8f6f4`` (25 bits, truncation),
  without and with promotion every 128;
* ``"cdna3 mfma"`` -- MI300's fp8 MFMA (two interleaved 24-bit lanes, round-down, RNE at the
  output), without and with promotion every 128.

The reference is the float64 product of the same FP8 values, so the errors are the accumulators'
alone.  Errors are :func:`fp8sim.studies.accumulation.errors` (max and median elementwise relative
error, relative Frobenius norm).  The Blackwell and CDNA3 models are "matches MMA-Sim (validated
by its authors)", not validated by fp8sim on hardware (docs/accelerators.md).
"""

from __future__ import annotations

import numpy as np

from ..formats import format as _get_format
from .accumulation import DISTRIBUTIONS, curve_style, errors, make_inputs

__all__ = ["ACCUMULATORS", "KS", "KS_QUICK", "COLUMNS", "compare_accumulators", "fnuz_codes", "plot", "section"]

#: (label, arch, instruction, a/b format): the accumulators compared
ACCUMULATORS = (
    ("sm90 wgmma", "sm90", "wgmma", "e4m3"),
    ("sm100 tcgen05 f8f6f4", "sm100", "tcgen05.mma", "e4m3"),
    ("cdna3 mfma", "cdna3", "mfma", "e4m3fnuz"),
)
KS = (128, 512, 2048, 4096, 8192, 16384)
#: the K of the report's quick run
KS_QUICK = (128, 1024, 4096)
COLUMNS = ("distribution", "accumulator", "K", "promote_every", "max_rel", "median_rel", "rel_frobenius", "n")
_AMAX = 240.0  # the largest e4m3 value that e4m3fnuz also holds is 240


def _quantize(x: np.ndarray) -> np.ndarray:
    """The e4m3 values (RNE) of ``x`` scaled to amax 240 (the scale only sets the range)."""
    s = np.float32(_AMAX / float(np.max(np.abs(x))))
    y = np.minimum(np.abs(x * s), np.float32(_AMAX)) * np.sign(x)
    return y.astype(np.float32).astype(_get_format("e4m3").ml_dtype).astype(np.float32)


def fnuz_codes(values: np.ndarray) -> np.ndarray:
    """The e4m3fnuz codes of float values that e4m3fnuz holds exactly (ValueError otherwise)."""
    dt = _get_format("e4m3fnuz").ml_dtype
    codes = np.asarray(values, np.float32).astype(dt)
    if not np.array_equal(codes.astype(np.float32), np.asarray(values, np.float32)):
        raise ValueError("values not exactly representable in e4m3fnuz")
    return codes.view(np.uint8)


def _codes(values: np.ndarray, fmt: str) -> np.ndarray:
    if fmt == "e4m3fnuz":
        return fnuz_codes(values)
    return np.asarray(values, np.float32).astype(_get_format(fmt).ml_dtype).view(np.uint8)


def compare_accumulators(
    Ks=KS,
    distributions=DISTRIBUTIONS,
    M: int = 16,
    N: int = 16,
    promotions=(None, 128),
    seed: int = 0,
) -> list[dict]:
    """The accumulators of :data:`ACCUMULATORS` on the same e4m3 products, errors vs fp64.

    Returns one dict per (distribution, accumulator, K, promotion) with the keys of
    :data:`COLUMNS` (``promote_every`` 0 for none).  Inputs are drawn once per (distribution, K)
    with ``numpy.random.default_rng(seed)``.
    """
    import fp8sim.tensorcore as tc

    rows = []
    for dist in distributions:
        for K in Ks:
            rng = np.random.default_rng([seed, K, DISTRIBUTIONS.index(dist) if dist in DISTRIBUTIONS else 0])
            x, w = make_inputs(dist, M, K, N, rng)
            xq, wq = _quantize(x), _quantize(w)
            ref = xq.astype(np.float64) @ wq.astype(np.float64)
            for label, arch, instr, fmt in ACCUMULATORS:
                a, b = _codes(xq, fmt), _codes(wq, fmt)
                for p in promotions:
                    y = tc.matmul(a, b, a_format=fmt, b_format=fmt, instruction=instr, arch=arch, promote_every=p)
                    e = errors(ref, y)
                    rows.append({"distribution": dist, "accumulator": label, "K": K, "promote_every": p or 0, **e})
    return rows


def plot(rows: list[dict], path) -> str:
    """Draw the median elementwise relative error against K, one panel per input family, a line per
    accumulator (colour; each drawn thinner than the one before, so that a curve under another still
    shows) and promotion (dashed: every 128) (:func:`compare_accumulators`' rows); exact
    zeros are markers on the bottom edge (:func:`fp8sim.plotting.log_line`); the legend is a row of its
    own below the panels, so it covers no curve.  Writes ``path`` (PNG), returns it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..plotting import k_axis, log_line, zero_lane, zero_legend_handle

    dists = list(dict.fromkeys(r["distribution"] for r in rows))
    proms = sorted({r["promote_every"] for r in rows})
    fig, axes = plt.subplots(1, len(dists), figsize=(5 * len(dists), 4.3), sharey=True, squeeze=False)
    zeros = 0
    n_lines = len(ACCUMULATORS) * len(proms)
    for ax, dist in zip(axes[0], dists):
        for i, ((label, *_), color) in enumerate(zip(ACCUMULATORS, ("C0", "C1", "C2"))):
            for j, p in enumerate(proms):
                sel = sorted(
                    (r["K"], r["median_rel"])
                    for r in rows
                    if r["distribution"] == dist and r["accumulator"] == label and r["promote_every"] == p
                )
                if not sel:
                    continue
                ks, med = zip(*sel)
                slot = i * len(proms) + j - (n_lines - 1) / 2
                _, nz = log_line(ax, ks, med, "--" if p else "-", color=color, **curve_style(i, len(ACCUMULATORS)),
                                 zero_dodge=0.13 * slot, zero_filled=bool(p),
                                 label=f"{label}{f', promote {p}' if p else ''}")  # fmt: skip
                zeros += nz
        ax.set_yscale("log")
        k_axis(ax, [r["K"] for r in rows if r["distribution"] == dist])
        ax.set_title(f"{dist} inputs (e4m3, amax 240)")
        ax.set_xlabel("K")
        ax.grid(True, which="major", alpha=0.3)
    axes[0][0].set_ylabel("median relative error vs fp64")
    handles, labels = axes[0][0].get_legend_handles_labels()
    if zeros:
        zero_lane(axes[0][0])  # (the panels share y)
        handles.append(zero_legend_handle("exactly 0, in the lane at the bottom (filled: promote 128)"))
        labels.append(handles[-1].get_label())
    ncol = min(len(handles), 4)
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    rows_of_legend = -(-len(handles) // ncol)
    fig.tight_layout(rect=(0, 0.055 * rows_of_legend + 0.01, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)


def section(out, quick: bool, progress: bool, opts: dict) -> dict:
    """The report's section "Accumulators by architecture": :func:`compare_accumulators` on the same
    e4m3 products (options: ``k_max``, ``size`` (M = N), ``distributions``; ``seed``), a table of the
    errors at the largest K, the figure and the CSV.  The default run is small (8 x 8 outputs, K up
    to 16384; quick: 4 x 4, K up to 4096)."""
    import html as _html
    from pathlib import Path

    from .sections import html_table, write_csv

    sub = Path(out) / "accelerators"
    sub.mkdir(parents=True, exist_ok=True)
    k_max = int(opts.get("k_max", KS_QUICK[-1] if quick else KS[-1]))
    ks = tuple(k for k in (KS_QUICK if quick else KS) if k <= k_max) or (k_max,)
    if ks[-1] != k_max:
        ks = ks + (k_max,)
    size = int(opts.get("size", 4 if quick else 8))
    dists = tuple(opts.get("distributions", DISTRIBUTIONS))
    rows = compare_accumulators(Ks=ks, distributions=dists, M=size, N=size, seed=int(opts.get("seed", 0)))
    csv_path = write_csv(sub / "accumulators_by_arch.csv", rows)
    fig = plot(rows, sub / "accumulators_by_arch.png")
    top = [r for r in rows if r["K"] == ks[-1]]
    table = [
        {
            "inputs": r["distribution"],
            "accumulator": r["accumulator"],
            "promotion": r["promote_every"] or "none",
            "median rel. error": f"{r['median_rel']:.2e}",
            "max rel. error": f"{r['max_rel']:.2e}",
        }
        for r in top
    ]
    numbers = {
        f"{r['distribution']}/{r['accumulator']}/{r['promote_every'] or 'none'}": {
            "K": r["K"],
            "median": r["median_rel"],
            "max": r["max_rel"],
        }
        for r in top
    }
    labels = ", ".join(_html.escape(a[0]) for a in ACCUMULATORS)
    text = (
        f"<p>The same e4m3 products (inputs scaled to amax 240, which e4m3fnuz also holds) summed by {labels}, "
        f"{size} x {size} outputs, K = {', '.join(map(str, ks))}, without promotion and with promotion into fp32 "
        f"every 128; errors against the fp64 product of the same FP8 values, so they are the accumulators' alone. "
        f"Hopper's model is validated on the H200; the Blackwell and CDNA3 models match MMA-Sim (validated by its "
        f"authors) and are emulated, not validated on hardware here. The table gives K = {ks[-1]}.</p>"
        + html_table(table)
    )
    return {
        "id": "accelerators",
        "title": "Accumulators by architecture: Hopper, Blackwell, CDNA3",
        "html": text,
        "figures": [fig],
        "csv": [csv_path],
        "numbers": numbers,
    }
