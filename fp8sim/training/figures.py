"""Figures of a training comparison (matplotlib, Agg backend)."""

from __future__ import annotations

import os
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

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


def loss_curves(path, results) -> str:
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(7.5, 4.2))
        n = len(next(iter(results.values())).losses)
        w = max(1, n // 30)
        for name, res in results.items():
            (line,) = ax.plot(res.losses, lw=0.5, alpha=0.3)
            ax.plot(_smooth(res.losses, w), lw=1.3, color=line.get_color(), label=name)
        ax.set_xlabel("step")
        ax.set_ylabel(f"training loss (faint: per step; bold: mean of the last {w})")
        ax.set_title("Same model, initialization and batches; one recipe per line")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
    return path


def rel_loss_error(path, results, claim: float, reference: str = "bf16") -> str | None:
    if reference not in results:
        return None
    ref = results[reference].losses
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(7.5, 4.2))
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
        ax.set_ylabel(f"|L - L_{reference}| / L_{reference}  (%; mean of the last {w} steps)")
        ax.set_title(f"Relative loss error against {reference}")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
    return path


def layer_amax(path, results) -> str:
    names = list(results)
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(len(names), 2, figsize=(10, 2.3 * len(names) + 0.6), squeeze=False, sharex=True)
        for i, name in enumerate(names):
            res = results[name]
            for j, kind in enumerate(("x", "dy")):
                ax = axes[i, j]
                for tensor, ser in res.series.items():
                    if tensor.rsplit(":", 1)[-1] != kind:
                        continue
                    ax.plot(ser["amax"], lw=0.9, label=tensor.rsplit(":", 1)[0])
                ax.set_yscale("log")
                ax.set_title(
                    f"{name}: amax of each Linear's {'input X' if kind == 'x' else 'output gradient dY'}", fontsize=8
                )
                if i == len(names) - 1:
                    ax.set_xlabel("step")
        axes[0, 1].legend(fontsize=6, ncol=2, loc="best")
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
