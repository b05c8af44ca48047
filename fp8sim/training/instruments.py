"""Stability instruments for FP8 training: activation-drift monitoring, dynamic gradient clipping,
elastic restart.  Each logs what it does as an :class:`Event` (also sent to the
``fp8sim.training`` logger), so a run's summary can list them.

* :class:`DriftMonitor` records, every step and for every monitored tensor (the input ``x`` and
  the output gradient ``dy`` of each Linear layer), amax, RMS and the fractions of elements
  saturated and underflowed by the quantization; it warns when a statistic leaves its recent
  band: for amax and RMS, the band is ``[median / f, median * f]`` of the last ``window``
  steps (log scale, ``f = band_factor``); for the fractions, ``median + max(band_abs,
  band_factor * median)``.  No warning before ``min_history`` steps.  Values outside the band do
  not enter the history, so one outlier does not widen the band for the next steps.
* :class:`DynamicClipper`: the gradient-norm threshold adapts to the recent history: an
  exponential moving average of the norm and of its variance, threshold ``mean + z * std``
  (ZClip-style); before ``min_history`` steps the fixed ``initial_max_norm`` (default: none, the
  first steps only fill the history).  A clipped norm
  enters the history as the threshold, so a spike does not raise the threshold.
* :class:`ElasticRestart`: checkpoints (model, optimizer, clipper state, step) every
  ``interval`` steps, in memory or as ``.npz`` files in ``directory``; after ``patience`` (3)
  consecutive steps with a non-finite loss or gradient it rolls back to the last checkpoint and
  multiplies the learning-rate factor by ``lr_cut``.
"""

from __future__ import annotations

import copy
import logging
import os
from collections import deque
from dataclasses import asdict, dataclass, field

import numpy as np

__all__ = ["Event", "DriftMonitor", "DynamicClipper", "ElasticRestart", "global_norm"]

log = logging.getLogger("fp8sim.training")

STATS = ("amax", "rms", "frac_saturated", "frac_underflow")


@dataclass
class Event:
    """Something an instrument did at a step: ``kind`` is ``"drift"``, ``"clip"``,
    ``"nonfinite"``, ``"restart"`` or ``"gave_up"``, with a message and its numbers (``data``)."""

    step: int
    kind: str  # "drift", "clip", "nonfinite", "restart", "gave_up"
    message: str
    data: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def global_norm(params) -> float:
    """L2 norm of all gradients (float64 sum of squares); inf/NaN if any gradient is."""
    s = 0.0
    with np.errstate(all="ignore"):
        for p in params:
            s += float(np.sum(np.square(p.grad, dtype=np.float64)))
    return float(np.sqrt(s))


class DriftMonitor:
    """Per-tensor running statistics with band warnings (module docstring)."""

    def __init__(
        self,
        window: int = 50,
        min_history: int = 10,
        band_factor: float = 8.0,
        band_abs: float = 0.05,
        watch=("x", "dy"),
    ):
        self.window, self.min_history = int(window), int(min_history)
        self.band_factor, self.band_abs = float(band_factor), float(band_abs)
        self.watch = tuple(watch)
        self.series: dict[str, dict[str, list]] = {}  # tensor -> stat -> [(step, value)]
        self._recent: dict[tuple, deque] = {}
        self.events: list[Event] = []

    @staticmethod
    def stats_of(rec) -> dict:
        n = max(int(rec.n), 1)
        return {
            "amax": rec.amax,
            "rms": rec.rms,
            "frac_saturated": rec.n_saturated / n if rec.quantized else 0.0,
            "frac_underflow": rec.n_underflow / n if rec.quantized else 0.0,
        }

    def band(self, name: str, stat: str):
        """``(lo, hi)`` of the current band, or None while the history is short."""
        h = self._recent.get((name, stat))
        if h is None or len(h) < self.min_history:
            return None
        med = float(np.median(np.asarray(h)))
        if stat in ("amax", "rms"):
            return med / self.band_factor, med * self.band_factor
        return -np.inf, med + max(self.band_abs, self.band_factor * med)

    def update(self, step: int, records: dict) -> list[Event]:
        """Record this step's statistics (``records``: tensor name -> Record) and return new warnings."""
        new = []
        for name, rec in records.items():
            if name.rsplit(":", 1)[-1] not in self.watch:
                continue
            stats = self.stats_of(rec)
            ser = self.series.setdefault(name, {s: [] for s in STATS})
            for stat, v in stats.items():
                ser[stat].append((int(step), float(v)))
                b = self.band(name, stat)
                inside = True
                if b is not None and (not np.isfinite(v) or v < b[0] or v > b[1]):
                    inside = False
                    ev = Event(
                        int(step),
                        "drift",
                        f"{name} {stat} = {v:.4g} left its band [{b[0]:.4g}, {b[1]:.4g}]",
                        {"tensor": name, "stat": stat, "value": float(v), "band": [float(b[0]), float(b[1])]},
                    )
                    new.append(ev)
                    log.warning("step %d: %s", step, ev.message)
                if inside and np.isfinite(v):
                    self._recent.setdefault((name, stat), deque(maxlen=self.window)).append(float(v))
        self.events += new
        return new

    def state(self) -> dict:
        return {k: list(v) for k, v in self._recent.items()}


class DynamicClipper:
    """Gradient clipping with an adaptive threshold (module docstring)."""

    def __init__(
        self,
        z: float = 3.0,
        window: int = 50,
        min_history: int = 10,
        min_rel_std: float = 0.1,
        initial_max_norm: float = np.inf,
    ):
        self.z, self.window, self.min_history = float(z), int(window), int(min_history)
        self.min_rel_std, self.initial_max_norm = float(min_rel_std), float(initial_max_norm)
        self.recent: deque = deque(maxlen=self.window)
        self.events: list[Event] = []
        self.history: list[tuple] = []  # (step, norm, threshold, clipped)

    def threshold(self) -> float:
        """``mean + z * max(std, min_rel_std * mean)`` of the last ``window`` (clipped) norms; the fixed
        ``initial_max_norm`` while fewer than ``min_history`` are known."""
        if len(self.recent) < self.min_history:
            return self.initial_max_norm
        h = np.asarray(self.recent, dtype=np.float64)
        mean = float(h.mean())
        return mean + self.z * max(float(h.std(ddof=1)), self.min_rel_std * mean)

    def clip(self, step: int, params, norm: float | None = None) -> float:
        """Clip the gradients of ``params`` in place if their norm exceeds the threshold; returns the
        factor applied (1.0 when not clipped)."""
        norm = global_norm(params) if norm is None else float(norm)
        thr = float(self.threshold())
        factor = 1.0
        if norm > thr:
            factor = thr / norm
            for p in params:
                p.grad *= p.grad.dtype.type(factor)
            ev = Event(
                int(step),
                "clip",
                f"gradient norm {norm:.4g} clipped to {thr:.4g}",
                {"norm": norm, "threshold": thr, "factor": factor},
            )
            self.events.append(ev)
            log.info("step %d: %s", step, ev.message)
        self.recent.append(min(norm, thr))
        self.history.append((int(step), norm, thr, factor < 1.0))
        return factor

    def state(self) -> dict:
        return {"recent": np.asarray(self.recent, dtype=np.float64)}

    def load_state(self, s: dict) -> None:
        self.recent = deque((float(v) for v in np.asarray(s["recent"]).reshape(-1)), maxlen=self.window)


class ElasticRestart:
    """Checkpoint every ``interval`` steps; roll back after ``patience`` consecutive non-finite steps."""

    def __init__(
        self,
        interval: int = 25,
        patience: int = 3,
        lr_cut: float = 0.5,
        directory: str | None = None,
        max_restarts: int = 5,
    ):
        if interval < 1 or patience < 1 or not (0 < lr_cut <= 1):
            raise ValueError(
                f"ElasticRestart: need interval >= 1, patience >= 1, 0 < lr_cut <= 1; got "
                f"{interval}, {patience}, {lr_cut}"
            )
        self.interval, self.patience, self.lr_cut = int(interval), int(patience), float(lr_cut)
        self.directory, self.max_restarts = directory, int(max_restarts)
        self.lr_factor = 1.0
        self.consecutive = 0
        self.restarts = 0
        self.nonfinite_steps = 0
        self.events: list[Event] = []
        self._ckpt: tuple | None = None  # (step, payload) in memory, or (step, path)

    @property
    def checkpoint_step(self):
        return None if self._ckpt is None else self._ckpt[0]

    def maybe_checkpoint(self, step: int, payload: dict, force: bool = False) -> bool:
        """Save ``payload`` (a dict of arrays / nested dicts / numbers) as the state *before* ``step``
        when ``step`` is a multiple of ``interval``."""
        if not force and step % self.interval:
            return False
        if self.directory is None:
            self._ckpt = (int(step), copy.deepcopy(payload))
        else:
            os.makedirs(self.directory, exist_ok=True)
            path = os.path.join(self.directory, "checkpoint.npz")
            flat = _flatten(payload)
            tmp = path + ".tmp.npz"
            np.savez(tmp, **flat)
            os.replace(tmp, path)
            self._ckpt = (int(step), path)
        return True

    def observe(self, step: int, finite: bool) -> tuple | str | None:
        """Report one step's outcome.  Returns ``None`` (carry on; a non-finite step's update is
        skipped by the caller) or ``(checkpoint_step, payload)`` to roll back to."""
        if finite:
            self.consecutive = 0
            return None
        self.consecutive += 1
        self.nonfinite_steps += 1
        self.events.append(
            Event(
                int(step),
                "nonfinite",
                f"non-finite loss or gradient ({self.consecutive} in a row); update skipped",
                {"consecutive": self.consecutive},
            )
        )
        if self.consecutive < self.patience:
            return None
        if self._ckpt is None or self.restarts >= self.max_restarts:
            self.events.append(
                Event(
                    int(step),
                    "gave_up",
                    "no checkpoint to roll back to" if self._ckpt is None else f"{self.restarts} restarts already",
                    {},
                )
            )
            log.error("step %d: elastic restart gave up", step)
            return "gave_up"
        self.restarts += 1
        self.consecutive = 0
        self.lr_factor *= self.lr_cut
        ck_step, payload = self._ckpt
        if isinstance(payload, str):
            with np.load(payload) as z:
                payload = _unflatten({k: z[k] for k in z.files})
        ev = Event(
            int(step),
            "restart",
            f"{self.patience} non-finite steps: rolled back to step {ck_step}, "
            f"learning-rate factor now {self.lr_factor:g}",
            {"rolled_back_to": ck_step, "lr_factor": self.lr_factor, "restarts": self.restarts},
        )
        self.events.append(ev)
        log.warning("step %d: %s", step, ev.message)
        return ck_step, copy.deepcopy(payload)


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if "/" in str(k):
            raise ValueError(f"checkpoint keys must not contain '/': {k!r}")
        if isinstance(v, dict):
            out.update(_flatten(v, key + "/"))
        else:
            out[key] = np.asarray(v if v is not None else np.nan)
    return out


def _unflatten(flat: dict) -> dict:
    out: dict = {}
    for k, v in flat.items():
        parts = k.split("/")
        d = out
        for p in parts[:-1]:
            d = d.setdefault(p, {})
        d[parts[-1]] = v[()] if v.ndim == 0 else v
    return out
