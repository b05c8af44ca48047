"""Figures (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from . import formats, rounding  # noqa: E402

__all__ = ["STYLE", "mode_error_figure", "rounding_error_figure"]

STYLE: Any = {
    "figure.dpi": 110,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "font.size": 9,
}


def rounding_error_figure(path, names=("e4m3", "e5m2", "e4m3fnuz", "e3m4", "e2m1", "bf16"), n: int = 40000):
    """Worst relative RNE rounding error against magnitude, one line per format.

    Each line is the maximum relative error within each binade (the
    envelope of the saw-tooth): flat at the unit roundoff 2**-(mbits+1) in
    the normal range, rising in the subnormal range, ending where values
    flush to zero (left) or saturate (right, marked).
    """
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(7.5, 4.2))
        lo_all, hi_all = -30.0, 18.0
        for name in names:
            f = formats.format(name)
            lo = max(np.log2(f.min_subnormal) - 1.5, lo_all)
            hi = min(np.log2(f.max) + 0.999, hi_all)
            x = 2.0 ** np.linspace(lo, hi, n)
            y = rounding.round(x, f, saturate=True)
            rel = np.abs(y - x) / x
            bins = np.floor(np.log2(x))
            edges = np.flatnonzero(np.diff(bins)) + 1
            env = np.maximum.reduceat(rel, np.r_[0, edges])
            xb = x[np.r_[0, edges]]
            (line,) = ax.plot(
                xb,
                np.maximum(env, 1e-9),
                lw=1.2,
                drawstyle="steps-post",
                label=f"{name}  (u = 2^-{f.mbits + 1}, max {f.max:.4g})",
            )
            if np.log2(f.max) < hi_all:
                ax.axvline(f.max, color=line.get_color(), lw=0.6, ls=":")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_ylim(1e-3, 1.5)
        ax.set_xlim(2.0**lo_all, 2.0**hi_all)
        ax.set_xlabel("|x|  (dotted: format max; beyond it values saturate)")
        ax.set_ylabel("worst relative error (RNE)")
        ax.set_title("Rounding error by magnitude: precision in the normal range, loss in the subnormals")
        ax.legend(fontsize=7, loc="lower left")
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
    return path


def mode_error_figure(path, rows: list[dict]):
    """Mean relative error and relative bias per format and rounding mode."""
    names = list(dict.fromkeys(r["format"] for r in rows))
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, 2, figsize=(9.5, 3.6))
        width = 0.8 / len(modes)
        for j, mode in enumerate(modes):
            mean = [next(r["mean_rel_error"] for r in rows if r["format"] == n and r["mode"] == mode) for n in names]
            bias = [next(r["rel_bias"] for r in rows if r["format"] == n and r["mode"] == mode) for n in names]
            xs = np.arange(len(names)) + (j - len(modes) / 2 + 0.5) * width
            axes[0].bar(xs, mean, width, label=mode)
            axes[1].bar(xs, bias, width, label=mode)
        for ax, t in zip(axes, ["mean |relative error|", "relative bias  sum(round(x)-x) / sum|x|"]):
            ax.set_xticks(np.arange(len(names)), names)
            ax.set_title(t)
        axes[0].set_yscale("log")
        axes[1].set_yscale("symlog", linthresh=1e-4)
        axes[0].legend(fontsize=7, ncol=2)
        fig.suptitle("Rounding modes on log-normal data (spread over 8 binades, inside each format's range)")
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
    return path
