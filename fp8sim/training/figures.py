"""Figures of a training comparison (matplotlib, Agg backend)."""

from __future__ import annotations

import os
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

__all__ = ["loss_curves", "rel_loss_error", "layer_amax", "all_figures", "STYLE"]

STYLE: Any = {
    "figure.dpi": 110,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "font.size": 9,
}


def _smooth(a: np.ndarray, w: int) -> np.ndarray:
    if w <= 1:
        return a
    out = np.full_like(a, np.nan, dtype=np.float64)
    for i in range(len(a)):
        seg = a[max(0, i - w + 1) : i + 1]
        seg = seg[np.isfinite(seg)]
        out[i] = seg.mean() if seg.size else np.nan
    return out


def _legend_outside(ax, **kw) -> None:
    """A legend to the right of the axes, never over the data."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=7, **kw)


def _smoothing_note(w: int) -> str:
    return f"running mean of {w} steps" if w > 1 else "per step"


def loss_curves(path, results, reference: str = "bf16") -> str:
    """Training loss of every recipe (top) and, when ``reference`` ran, each recipe's signed loss
    difference to it in % (bottom), where curves that lie on top of each other in the top panel
    separate.  The reference is drawn last (black, dashed) so that no other curve hides it."""
    names = list(results)
    has_ref = reference in results and len(names) > 1
    with plt.rc_context(STYLE):
        if has_ref:
            fig, (ax, ax2) = plt.subplots(2, 1, figsize=(8.5, 6.0), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
        else:
            fig, ax = plt.subplots(figsize=(8.5, 4.2))
            ax2 = None
        n = len(next(iter(results.values())).losses)
        w = max(1, n // 30)
        order = [k for k in names if k != reference] + ([reference] if reference in results else [])
        cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        colors = {k: cycle[i % len(cycle)] for i, k in enumerate(order[:-1] if has_ref else order)}
        for name in order:
            res = results[name]
            is_ref = name == reference
            kw = {"color": "k", "ls": "--", "zorder": 5} if is_ref else {"color": colors[name], "zorder": 3}
            if w > 1:
                ax.plot(res.losses, lw=0.5, alpha=0.25, **kw)
            ax.plot(_smooth(res.losses, w), lw=1.4, label=name, **kw)
        ax.set_ylabel(f"training loss\n({_smoothing_note(w)})")
        title = "Same model, initialization and batches; one recipe per line"
        if w > 1:
            title += " (faint: per step)"
        ax.set_title(title)
        _legend_outside(ax)
        if ax2 is not None:
            ref = np.asarray(results[reference].losses, np.float64)
            ax2.axhline(0.0, color="k", ls="--", lw=1.0, label=reference)
            for name in order[:-1]:
                with np.errstate(all="ignore"):
                    d = 100 * (np.asarray(results[name].losses, np.float64) - ref) / ref
                ax2.plot(_smooth(d, w), lw=1.2, color=colors[name], label=name)
            ax2.set_ylabel(f"(L - L_{reference}) / L_{reference} in %\n({_smoothing_note(w)})")
            ax2.set_xlabel("step")
            _legend_outside(ax2)
        else:
            ax.set_xlabel("step")
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
    return path


def rel_loss_error(path, results, claim: float, reference: str = "bf16") -> str | None:
    if reference not in results:
        return None
    ref = results[reference].losses
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(8.5, 4.2))
        n = len(ref)
        w = max(1, n // 20)
        for name, res in results.items():
            if name == reference:
                continue
            with np.errstate(all="ignore"):
                rel = np.abs(res.losses - ref) / ref
            ax.plot(np.arange(n), 100 * _smooth(rel, w), lw=1.3, label=name)
        ax.axhline(100 * claim, color="k", ls="--", lw=0.8, label=f"DeepSeek-V3: < {100 * claim:g} %")
        ax.axvspan(n - max(1, round(0.1 * n)), n, color="0.9", zorder=0, label="last 10 % (summary)")
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel(f"|L - L_{reference}| / L_{reference} in %\n({_smoothing_note(w)})")
        ax.set_title(f"Relative loss error against {reference}")
        _legend_outside(ax)
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
    return path


def layer_amax(path, results) -> str:
    names = list(results)
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(len(names), 2, figsize=(11, 2.3 * len(names) + 0.6), squeeze=False, sharex=True)
        for i, name in enumerate(names):
            res = results[name]
            for j, kind in enumerate(("x", "dy")):
                ax = axes[i, j]
                for tensor, ser in res.series.items():
                    if tensor.rsplit(":", 1)[-1] != kind:
                        continue
                    ax.plot(ser["amax"], lw=0.9, label=tensor.rsplit(":", 1)[0])
                ax.set_yscale("log")
                ax.set_ylabel("amax |X|" if kind == "x" else "amax |dY|")
                ax.set_title(
                    f"{name}: amax of each Linear's {'input X' if kind == 'x' else 'output gradient dY'}", fontsize=8
                )
                if i == len(names) - 1:
                    ax.set_xlabel("step")
        if axes[0, 1].get_legend_handles_labels()[0]:
            _legend_outside(axes[0, 1], ncol=1)
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
    return path


def all_figures(out_dir, results, claim) -> list[str]:
    paths = [
        loss_curves(os.path.join(out_dir, "loss_curves.png"), results),
        rel_loss_error(os.path.join(out_dir, "rel_loss_error.png"), results, claim),
        layer_amax(os.path.join(out_dir, "layer_amax.png"), results),
    ]
    return [os.path.basename(p) for p in paths if p]
