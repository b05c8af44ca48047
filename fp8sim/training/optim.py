"""AdamW with FP32 master weights and BF16 moments (DeepSeek-V3's optimizer state).

``m = bf16(b1 m + (1 - b1) g)``, ``v = bf16(b2 v + (1 - b2) g^2)`` (each rounded once, RNE,
with :func:`fp8sim.round`), then the FP32 update
``w -= lr (m_hat / (sqrt(v_hat) + eps) + wd w)`` with bias corrections
``m_hat = m / (1 - b1^t)``, ``v_hat = v / (1 - b2^t)``.  Weight decay applies to parameters
with ``decay=True`` (the Linear weights; not norms and embeddings).  ``moment_format=None``
keeps the moments in the parameters' dtype.
"""

from __future__ import annotations

import numpy as np

from ..rounding import cast

__all__ = ["AdamW", "lr_schedule"]


class AdamW:
    """AdamW over a list of parameters, with the moments stored in ``moment_format``
    (``"bf16"``, ``"fp32"`` or None for the parameters' dtype); see the module docstring."""

    def __init__(
        self,
        params,
        lr: float = 2e-3,
        betas=(0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 0.1,
        moment_format: str | None = "bf16",
    ):
        if moment_format not in (None, "bf16", "fp32"):
            raise ValueError(f"AdamW: moment_format must be None, 'bf16' or 'fp32', got {moment_format!r}")
        self.params = list(params)
        self.lr, self.betas, self.eps, self.weight_decay = float(lr), tuple(betas), float(eps), float(weight_decay)
        self.moment_format = moment_format
        self.t = 0
        self.m = {p.name: np.zeros_like(p.value) for p in self.params}
        self.v = {p.name: np.zeros_like(p.value) for p in self.params}

    def _store(self, a: np.ndarray, like: np.ndarray) -> np.ndarray:
        if self.moment_format == "bf16":
            return cast(a.astype(np.float32), "bf16").astype(like.dtype)
        if self.moment_format == "fp32":
            return a.astype(np.float32).astype(like.dtype)
        return a.astype(like.dtype)

    def step(self, lr: float | None = None) -> None:
        lr = self.lr if lr is None else float(lr)
        b1, b2 = self.betas
        self.t += 1
        c1, c2 = 1.0 - b1**self.t, 1.0 - b2**self.t
        for p in self.params:
            g = p.grad
            m = self._store(b1 * self.m[p.name] + (1.0 - b1) * g, p.value)
            v = self._store(b2 * self.v[p.name] + (1.0 - b2) * (g * g), p.value)
            self.m[p.name], self.v[p.name] = m, v
            upd = (m / c1) / (np.sqrt(v / c2) + self.eps)
            if p.decay and self.weight_decay:
                upd = upd + self.weight_decay * p.value
            p.value -= (lr * upd).astype(p.value.dtype)

    def state(self) -> dict:
        return {
            "t": self.t,
            "m": {k: a.copy() for k, a in self.m.items()},
            "v": {k: a.copy() for k, a in self.v.items()},
        }

    def load_state(self, state: dict) -> None:
        self.t = int(state["t"])
        for k in self.m:
            self.m[k][...] = state["m"][k]
            self.v[k][...] = state["v"][k]


def lr_schedule(step: int, total: int, peak: float, warmup: int, final_fraction: float = 0.1) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay to ``final_fraction * peak`` at ``total``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (final_fraction + (1.0 - final_fraction) * 0.5 * (1.0 + np.cos(np.pi * t)))
