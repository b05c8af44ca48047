"""Recipes whose quantization has state or randomness, in :func:`fp8sim.torch.linear`: delayed scaling
(TransformerEngine's amax history, one per operand of each layer), stochastic rounding of gradients,
NVFP4's 16x16 weight blocks and random Hadamard transform of the Wgrad inputs.

These run the Linear layer of :mod:`fp8sim.training` itself (:class:`fp8sim.training.Linear`, one
object per forward call, on the host), so every quantization -- which operand keeps which amax
history, which tensor draws which random bits -- is the numpy trainer's, bit for bit.  The state a
torch layer keeps between calls is a :class:`LayerState`: the delayed-scaling histories, the
layer's name, the run's seed and the step that stochastic rounding draws from
(:func:`fp8sim.training.linear.sr_seed`).  :class:`fp8sim.torch.Linear` holds one and counts the
steps (one forward call is one step); :func:`fp8sim.torch.linear` takes one as ``state=``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..gemms.engine import cast_output
from ..gemms.recipes import Recipe
from ..scaling import granularity as as_granularity
from ..training.linear import Linear as NpLinear
from ..training.linear import Param

__all__ = ["LayerState", "is_stateful", "host_forward", "host_backward"]


@dataclass
class LayerState:
    """What a Linear layer keeps between calls for a stateful recipe (:func:`is_stateful`).

    ``name`` names the layer in the stochastic-rounding seeds (``sr_seed(seed, step, f"{name}:{operand}")``,
    as :class:`fp8sim.training.Linear` draws them), ``seed`` is the run's, ``step`` the step of the next
    forward call (each call advances it by one; set it to replay a step), ``delayed`` the amax
    histories of delayed scaling by operand (``"x"``, ``"w"``, ``"dy"``, ``"wT"``, ``"xT"``,
    ``"dyT"``), filled on first use from the recipe's :class:`~fp8sim.scaling.DelayedScaling`.
    """

    name: str = "linear"
    seed: int = 0
    step: int = 0
    delayed: dict = field(default_factory=dict)


def is_stateful(r: Recipe) -> bool:
    """True for FP8 recipes whose quantization needs a :class:`LayerState`: delayed scaling of x or W,
    stochastic rounding of gradients, NVFP4's 2-D weight blocks or the Wgrad Hadamard transform."""
    if not r.is_fp8:
        return False
    if any(as_granularity(g).stateful for g in (r.x_granularity, r.w_granularity)):
        return True
    return (
        getattr(r, "grad_rounding", "rne") != "rne"
        or bool(getattr(r, "weight_2d_blocks", False))
        or bool(getattr(r, "wgrad_rht", False))
    )


class _Context:
    """The part of :class:`fp8sim.training.model.Context` that :class:`fp8sim.training.Linear` reads."""

    def __init__(self, recipe: Recipe, fidelity: str, step: int, seed: int) -> None:
        self.recipe, self.fidelity, self.step, self.sr_seed = recipe, fidelity, step, seed
        self.dtype = np.float32

    def recipe_for(self, part: str) -> Recipe:
        return self.recipe

    def perturb(self, name: str, x: np.ndarray) -> np.ndarray:
        return x

    def record(self, name: str, rec) -> None:
        pass


def host_forward(
    x: np.ndarray, weight: np.ndarray, bias, r: Recipe, fidelity: str, state: LayerState, cached=None
) -> tuple[np.ndarray, tuple[Any, Any]]:
    """Fprop of ``x (T, K)`` and a torch-layout ``weight (N, K)`` (float arrays) through
    :class:`fp8sim.training.Linear` with ``state``; returns ``y (T, N)`` (float32, output-format values,
    the bias added to the fp32 result before the output cast) and what :func:`host_backward` needs.
    ``cached`` replaces ``x`` as the values Wgrad reads (an activation cache).  Advances ``state.step``."""
    lin = NpLinear(state.name, "linear", Param(f"{state.name}.weight", weight.T))
    lin._delayed = state.delayed  # the histories persist across calls
    ctx = _Context(r if bias is None else r.with_(output_format="fp32"), fidelity, state.step, state.seed)
    state.step += 1
    y = lin.forward(x, ctx)
    if bias is not None:
        with np.errstate(all="ignore"):
            y = cast_output(y.astype(np.float32) + np.asarray(bias, np.float32), r.output_format)
    xs, qw, _ = lin._cache
    lin._cache = (xs if cached is None else cached, qw, r)  # the backward GEMMs run the recipe itself
    ctx.recipe = r
    return np.asarray(y), (lin, ctx)


def host_backward(dy: np.ndarray, saved) -> tuple[np.ndarray, np.ndarray]:
    """Dgrad and Wgrad of :func:`host_forward`'s call: ``(dx (T, K), dW (N, K))`` as float32 arrays."""
    lin, ctx = saved
    dx = lin.backward(np.ascontiguousarray(dy, dtype=np.float32), ctx)
    return np.asarray(dx), np.ascontiguousarray(lin.weight.grad.T)
