"""Figures (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from . import formats, rounding  # noqa: E402

__all__ = [
    "STYLE",
    "ZERO_MARKER",
    "ZERO_NOTE",
    "k_axis",
    "log_line",
    "mode_error_figure",
    "rounding_error_figure",
    "zero_lane",
    "zero_legend_handle",
]

STYLE: Any = {
    "figure.dpi": 110,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "font.size": 9,
}


#: the marker of an exact zero on a log axis (:func:`log_line`), and what its legend entry says
ZERO_MARKER = "v"
ZERO_NOTE = "exactly 0 (drawn in the lane at the bottom)"
#: the height of the lane of :func:`zero_lane` (a fraction of the axes), and where its markers sit
_LANE = 0.09
_LANE_Y = 0.045


def log_line(
    ax, xs, ys, fmt: str = "-", *, zero_dodge: float = 0.0, zero_filled: bool = False, **kw
) -> tuple[Any, int]:
    """``ax.plot(xs, ys, fmt, **kw)`` for a log y axis, where an exact zero cannot be drawn: the
    positive values make the line; each zero is a :data:`ZERO_MARKER` in the line's colour near the
    bottom of the axes at its x (times ``2**zero_dodge``: give each line of a panel its own dodge so
    that the zeros of several lines at one x stay apart; hollow, or filled with ``zero_filled``), so
    no value leaves the figure silently.  Once every line is drawn, :func:`zero_lane` keeps the data
    out of the markers' lane; add :func:`zero_legend_handle` to the legend.  NaN stays a gap.  Returns ``(line, number of zeros)``; the line keeps its legend label
    even when every value is zero."""
    from matplotlib.transforms import blended_transform_factory

    xs = np.asarray(xs, dtype=float)
    ys = np.asarray(ys, dtype=float)
    zero = ys == 0
    (line,) = ax.plot(xs, np.where(zero, np.nan, ys), fmt, **kw)
    if zero.any():
        edge = blended_transform_factory(ax.transData, ax.transAxes)
        color = line.get_color()
        ax.plot(
            xs[zero] * 2.0**zero_dodge,
            np.full(int(zero.sum()), _LANE_Y),
            ZERO_MARKER,
            transform=edge,
            clip_on=False,
            color=color,
            mfc=color if zero_filled else "none",
            ms=5,
            zorder=line.get_zorder() + 1,
            label="_zero",
        )
    return line, int(zero.sum())


def zero_lane(ax) -> None:
    """Give the zeros of :func:`log_line` a lane of their own below the data of the log y axis of
    ``ax`` (call it once every line is drawn): the axis is extended downwards, the lane is marked off
    by a dotted line and labelled 0, and it holds no ticks (it is no range of values)."""
    lo, hi = ax.get_ylim()
    new_lo = lo / (hi / lo) ** (_LANE / (1 - _LANE))
    ax.set_ylim(new_lo, hi)
    for minor in (False, True):
        ticks = [t for t in ax.get_yticks(minor=minor) if lo <= t <= hi]
        ax.set_yticks(ticks, minor=minor)
    ax.set_ylim(new_lo, hi)
    ax.plot([0, 1], [_LANE, _LANE], transform=ax.transAxes, ls=":", lw=0.8, color="0.55", label="_lane")
    ax.text(-0.01, _LANE_Y, "0", transform=ax.transAxes, ha="right", va="center", fontsize="small")


def zero_legend_handle(note: str = ZERO_NOTE):
    """A legend handle for the zero markers of :func:`log_line` (label ``note``)."""
    from matplotlib.lines import Line2D

    return Line2D([], [], ls="none", marker=ZERO_MARKER, color="0.3", mfc="none", ms=6, label=note)


def k_axis(ax, ks) -> None:
    """A log-2 x axis for K: one labelled major tick at each K run (plain integers), no minor ticks."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    ks = sorted({int(k) for k in ks})
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(ks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{int(round(v))}"))
    ax.xaxis.set_minor_locator(NullLocator())
    if len(ks) > 6:
        ax.tick_params(axis="x", labelrotation=45, labelsize=7)


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
        # one legend for both panels, in its own row below them: it covers no bar
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=len(modes), fontsize=8, frameon=False)
        fig.suptitle("Rounding modes on log-uniform data (8 binades inside each format's range, random signs)")
        fig.tight_layout(rect=(0, 0.08, 1, 1))
        fig.savefig(path)
        plt.close(fig)
    return path
