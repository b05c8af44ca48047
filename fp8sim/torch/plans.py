"""Precision plans: which Linear layers of a torch model run which recipe, with which activation
caches and master-weight dtype (:class:`Plan`, :func:`plan`); :func:`fp8sim.torch.convert` applies
one (``convert(model, "deepseek-v3")`` applies ``plan("deepseek-v3")``).

``plan("deepseek-v3")`` is DeepSeek-V3's mixed-precision scheme (technical report, section 3.3) as far
as it concerns the GEMMs of Linear layers:

=============================  =================================================================
part of the scheme             what the plan does
=============================  =================================================================
FP8 GEMMs                      every ``nn.Linear`` not skipped runs Fprop, Dgrad and Wgrad with the
                               ``deepseek-v3`` recipe (1x128 E4M3 activations, 128x128 weights,
                               promotion every 128, BF16 output, FP32 weight gradients)
high precision: head, gating   ``skip``: Linear layers named ``lm_head``, ``head``, ``gate`` or
                               ``router`` stay ``torch.nn.Linear`` (the model's own dtype)
high precision: embedding,     not Linear layers: :func:`~fp8sim.torch.convert` leaves them as they
norms, attention               are (attention's score and value products included)
activation cache               ``activation_cache="fprop"``: Wgrad reads the values of the Fprop
                               GEMM's 1x128 E4M3 quantization of ``x`` instead of ``x``
post-attention Linear          ``attn_out_cache``: the input of the Linear layers that match
                               ``attn_out`` (``o_proj``, ``attn.out_proj``, ``attn.c_proj``, ...) is
                               kept as E5M6 in 1x128 tiles with power-of-two scales, and Wgrad
                               re-quantizes those values along the tokens.  (E5M6 is 12 bits: a
                               storage format; the Fprop GEMM multiplies E4M3 codes.)
FP32 master weights            ``master_weights="fp32"``: converted layers' parameters are made
                               float32; BF16 activations then meet FP32 weights in the GEMMs
BF16 optimizer moments         ``optimizer_moments="bf16"``: a documented field for the optimizer
                               (as :class:`fp8sim.training.AdamW` keeps them); convert does not
                               act on it
per-group scaling (option)     ``group_size=16``: 16 consecutive elements along K share a scale
                               (:func:`fp8sim.torch.group_recipe`); None in the preset
=============================  =================================================================
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..gemms.presets import recipe as get_recipe
from ..gemms.recipes import Recipe
from .function import ActivationCache, LinearOptions, options

__all__ = [
    "Plan",
    "plan",
    "plan_names",
    "DEFAULT_SKIP",
    "ATTN_OUT",
    "DEEPSEEK_ATTN_OUT_CACHE",
    "matches",
]

#: Linear layers kept in high precision by default: output heads and MoE gating / routers
DEFAULT_SKIP = ("lm_head", "head", "gate", "router")
#: names of the post-attention projection in common models (Llama/Mistral/Qwen/DeepSeek ``o_proj``,
#: ``attn.out_proj``, GPT-2-style ``attn.c_proj``, ``attn.proj``, BERT ``attention.output.dense``)
ATTN_OUT = ("o_proj", "*attn.out_proj", "*attention.out_proj", "*attn.c_proj", "*attn.proj", "*attention.output.dense")
#: DeepSeek-V3's storage of the post-attention Linear's input: E5M6, 1x128 tiles, power-of-two scales
DEEPSEEK_ATTN_OUT_CACHE = ActivationCache("e5m6", "1x128", "pow2")
_MASTER = (None, "fp32")
_MOMENTS = (None, "bf16", "fp32")


def matches(name: str, patterns) -> bool:
    """True when the module name ``name`` (dotted, as ``named_modules`` gives it) matches one of the
    fnmatch ``patterns`` (case-sensitive), either as a whole or by its last component: ``"lm_head"``
    matches ``"lm_head"`` and ``"model.lm_head"``, ``"*attn.c_proj"`` matches ``"h.0.attn.c_proj"``."""
    last = name.rpartition(".")[2]
    return any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(last, p) for p in patterns)


def _patterns(v, what: str):
    if callable(v):
        return v
    if isinstance(v, str):
        return (v,)
    try:
        pats = tuple(v)
    except TypeError:
        raise TypeError(
            f"Plan: {what} must be fnmatch patterns or a predicate (name, module) -> bool, got {v!r}"
        ) from None
    bad = [p for p in pats if not isinstance(p, str)]
    if bad:
        raise TypeError(f"Plan: {what} patterns must be strings, got {bad!r}")
    return pats


@dataclass(frozen=True)
class Plan:
    """A precision plan for :func:`fp8sim.torch.convert` (frozen; derive variants with :func:`plan`'s
    keyword arguments or :func:`dataclasses.replace`).

    Fields
    ------
    recipe : the recipe of every converted Linear layer (a name or :class:`fp8sim.Recipe`)
    skip : Linear layers that stay ``torch.nn.Linear``: fnmatch patterns (:func:`matches`) or a
        predicate ``(name, module) -> bool`` (True: keep in high precision)
    attn_out : patterns of the post-attention Linear layers, which get ``attn_out_cache``
    attn_out_cache : what Wgrad reads as the input of an ``attn_out`` layer (None, ``"fprop"`` or an
        :class:`~fp8sim.torch.ActivationCache`)
    activation_cache : the same for every other converted layer
    group_size : None, or per-group scaling of that many elements along K
        (:func:`fp8sim.torch.group_recipe`)
    master_weights : None (parameters keep their dtype) or ``"fp32"`` (convert makes the converted
        layers' weight and bias float32, in place)
    optimizer_moments : None, ``"bf16"`` or ``"fp32"``: the format of the optimizer's moments, for the
        training loop to use; convert does not act on it
    fidelity : ``"exact"`` or ``"fast"`` (as :func:`fp8sim.gemm`)
    name : the plan's name
    """

    recipe: Any = "deepseek-v3"
    skip: Any = DEFAULT_SKIP
    attn_out: tuple = ATTN_OUT
    attn_out_cache: Any = None
    activation_cache: Any = None
    group_size: int | None = None
    master_weights: str | None = None
    optimizer_moments: str | None = None
    fidelity: str = "exact"
    name: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        r = get_recipe(self.recipe)
        object.__setattr__(self, "recipe", r)
        object.__setattr__(self, "skip", _patterns(self.skip, "skip"))
        pats = _patterns(self.attn_out, "attn_out")
        if callable(pats):
            raise TypeError("Plan: attn_out must be fnmatch patterns")
        object.__setattr__(self, "attn_out", pats)
        for cache in (self.attn_out_cache, self.activation_cache):  # raises for a bad cache / group size
            options(r, fidelity=self.fidelity, cache=cache, group_size=self.group_size)
        if self.master_weights not in _MASTER:
            raise ValueError(f"Plan: master_weights must be one of {list(_MASTER)}, got {self.master_weights!r}")
        if self.optimizer_moments not in _MOMENTS:
            raise ValueError(f"Plan: optimizer_moments must be one of {list(_MOMENTS)}, got {self.optimizer_moments!r}")
        if not self.name:
            object.__setattr__(self, "name", r.name)

    def skips(self, name: str, module) -> bool:
        """True when the Linear layer ``name`` stays in high precision."""
        if callable(self.skip):
            return bool(self.skip(name, module))
        return matches(name, self.skip)

    def options_for(self, name: str, module) -> LinearOptions | None:
        """The :class:`~fp8sim.torch.LinearOptions` of the Linear layer ``name`` (None: skipped)."""
        if self.skips(name, module):
            return None
        cache = self.attn_out_cache if matches(name, self.attn_out) else self.activation_cache
        return options(self.recipe, fidelity=self.fidelity, cache=cache, group_size=self.group_size)


_PLANS: dict[str, Callable[[], Plan]] = {
    "deepseek-v3": lambda: Plan(
        "deepseek-v3",
        skip=DEFAULT_SKIP,
        attn_out=ATTN_OUT,
        attn_out_cache=DEEPSEEK_ATTN_OUT_CACHE,
        activation_cache="fprop",
        master_weights="fp32",
        optimizer_moments="bf16",
        name="deepseek-v3",
    ),
}


def plan_names() -> list[str]:
    """The names of the plan presets (any recipe name gives a plain plan too)."""
    return list(_PLANS)


def plan(name: str | Recipe = "deepseek-v3", **changes) -> Plan:
    """The plan ``name``: ``"deepseek-v3"`` is DeepSeek-V3's scheme (module docstring); any other
    recipe name or :class:`fp8sim.Recipe` gives a plain plan (that recipe on every Linear layer
    but the skipped ones, no activation caches, dtypes unchanged).  ``changes`` replace fields,
    e.g. ``plan("deepseek-v3", group_size=16)``.  :func:`fp8sim.torch.convert` applies ``plan(name)``
    to a name; :class:`Plan` itself (``Plan("deepseek-v3")``) is always a plain plan."""
    if isinstance(name, str) and name.strip().lower() in _PLANS:
        p = _PLANS[name.strip().lower()]()
    else:
        p = Plan(get_recipe(name))
    return replace(p, **changes) if changes else p
