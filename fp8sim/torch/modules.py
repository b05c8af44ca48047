"""``fp8sim.torch.Linear`` (a drop-in ``torch.nn.Linear`` whose GEMMs run an fp8sim recipe) and
``fp8sim.torch.convert`` (swap a model's Linear layers in place)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from dataclasses import replace

import torch

from .function import LinearOptions, linear, options
from .plans import Plan, plan
from .stateful import LayerState, is_stateful

__all__ = ["Linear", "convert", "convertible", "UnconvertedWarning"]


class UnconvertedWarning(UserWarning):
    """Warned by :func:`convert` for modules whose Linear projections it cannot reach:
    ``torch.nn.MultiheadAttention`` (and the Transformer layers built on it) and the inference fast
    path of ``torch.nn.TransformerEncoderLayer``.  Those GEMMs stay in the model's precision."""


class Linear(torch.nn.Linear):
    """``torch.nn.Linear`` with Fprop, Dgrad and Wgrad run by an fp8sim recipe
    (:func:`fp8sim.torch.linear`).

    The parameters are ``weight (out_features, in_features)`` and ``bias``, as in ``nn.Linear``, so a
    ``state_dict`` loads into the original model and back; it is an ``nn.Linear`` (``isinstance``
    holds).  ``recipe``, ``fidelity``, ``cache`` and ``group_size`` are those of
    :func:`~fp8sim.torch.linear`; they are checked here, once.  For a recipe with stateful or random
    quantization (delayed scaling, stochastic rounding, ...) the layer keeps a
    :class:`~fp8sim.torch.LayerState` in ``state`` (its amax histories and step; ``name`` and
    ``seed`` name its random bits), else ``state`` is None.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device=None,
        dtype=None,
        *,
        recipe="deepseek-v3",
        fidelity: str = "exact",
        cache=None,
        group_size: int | None = None,
        name: str = "linear",
        seed: int = 0,
    ) -> None:
        super().__init__(in_features, out_features, bias, device, dtype)
        self.options = _options(recipe, fidelity, cache, group_size)
        self.state = _state(self.options, name, seed)

    @property
    def recipe(self):
        """The layer's :class:`fp8sim.Recipe`."""
        return self.options.recipe

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return linear(input, self.weight, self.bias, recipe=self.options, state=self.state)

    def extra_repr(self) -> str:
        o = self.options
        s = f"{super().extra_repr()}, recipe={o.recipe.name!r}"
        if o.cache is not None:
            s += f", cache={o.cache!r}"
        if o.group_size is not None:
            s += f", group_size={o.group_size}"
        return s

    @classmethod
    def from_linear(
        cls,
        module: torch.nn.Linear,
        recipe="deepseek-v3",
        *,
        fidelity: str = "exact",
        cache=None,
        group_size: int | None = None,
        name: str = "linear",
        seed: int = 0,
    ) -> Linear:
        """A :class:`Linear` that shares ``module``'s parameters (the same ``Parameter`` objects: an
        optimizer that holds them keeps working, tied weights stay tied).  ``recipe`` may be a
        :class:`~fp8sim.torch.LinearOptions` (then the other options must be left out).  Hooks
        registered on ``module`` are not carried over.  ``name`` and ``seed`` go to the layer's
        :class:`~fp8sim.torch.LayerState` (stateful recipes only)."""
        if not isinstance(module, torch.nn.Linear):
            raise TypeError(f"Linear.from_linear: module must be a torch.nn.Linear, got {type(module).__name__}")
        new = cls.__new__(cls)
        torch.nn.Module.__init__(new)
        new.in_features, new.out_features = module.in_features, module.out_features
        new.weight = module.weight
        if module.bias is None:
            new.register_parameter("bias", None)
        else:
            new.bias = module.bias
        new.options = _options(recipe, fidelity, cache, group_size)
        new.state = _state(new.options, name, seed)
        new.train(module.training)
        return new


def _options(recipe, fidelity, cache, group_size) -> LinearOptions:
    if isinstance(recipe, LinearOptions):
        if (fidelity, cache, group_size) != ("exact", None, None):
            raise TypeError("fp8sim.torch.Linear: give either LinearOptions or fidelity/cache/group_size")
        return recipe
    return options(recipe, fidelity=fidelity, cache=cache, group_size=group_size)


def _state(o: LinearOptions, name: str, seed: int) -> LayerState | None:
    return LayerState(str(name), int(seed)) if is_stateful(o.recipe) else None


def convertible(module) -> bool:
    """True for the modules :func:`convert` swaps: ``torch.nn.Linear`` and subclasses that keep its
    ``forward`` (``NonDynamicallyQuantizableLinear``), not fp8sim's :class:`Linear` itself.
    Subclasses with their own ``forward`` (LoRA, quantized layers, ...) are left alone."""
    return (
        isinstance(module, torch.nn.Linear)
        and not isinstance(module, Linear)
        and type(module).forward is torch.nn.Linear.forward
    )


def convert(
    model: torch.nn.Module,
    recipe="deepseek-v3",
    *,
    skip: Iterable[str] | str | Callable[[str, torch.nn.Module], bool] | None = None,
    seed: int = 0,
) -> torch.nn.Module:
    """Swap the Linear layers of ``model`` for :class:`Linear` layers, in place, and return ``model``:
    ``convert(model, x)`` applies ``plan(x)`` (:func:`fp8sim.torch.plan`).

    So ``convert(model, "deepseek-v3")`` -- and ``convert(model)`` -- apply DeepSeek-V3's scheme:
    the ``deepseek-v3`` recipe with the FP8 activation cache, the E5M6 input of the post-attention
    Linear and FP32 master weights, head and gating kept (the converted layers' parameters become
    float32 in place).  Any other recipe name, or a :class:`fp8sim.Recipe`, applies that recipe
    alone (a plain plan: no caches, dtypes unchanged); ``convert(model, Plan("deepseek-v3"))`` is
    the ``deepseek-v3`` recipe alone.

    Only :func:`convertible` modules are swapped.  ``torch.nn.MultiheadAttention`` (also inside
    ``nn.TransformerEncoderLayer`` / ``DecoderLayer``) computes its projections with ``F.linear`` on
    its weights, and ``TransformerEncoderLayer``'s inference fast path (eval mode without grad) reads
    ``linear1`` / ``linear2``'s weights: convert cannot reach those GEMMs and warns
    (:class:`UnconvertedWarning`) naming the modules, unless ``skip`` covers the attention's
    ``out_proj`` (for example ``skip=("*self_attn*", ...)``) or the layer's ``linear1`` and
    ``linear2``.  The converted layers share the original ``Parameter`` objects, so ``state_dict``
    keys, tied weights and an optimizer's references are unchanged (``master_weights="fp32"``
    changes their dtype in place).  A layer reached under two names is converted once.

    Parameters
    ----------
    model : any ``torch.nn.Module`` (nested modules, ``Sequential``, ``ModuleList``, ``ModuleDict``);
        a bare ``nn.Linear`` cannot be replaced in place: its converted copy is returned
    recipe : a :class:`~fp8sim.torch.Plan`, or what :func:`fp8sim.torch.plan` takes: a plan preset
        name (``"deepseek-v3"``: the whole scheme), another recipe name or a :class:`fp8sim.Recipe`
        (that recipe, nothing else changed)
    skip : the Linear layers that stay ``torch.nn.Linear``: fnmatch patterns matched against the
        dotted module name and its last component (:func:`fp8sim.torch.matches`), or a predicate
        ``(name, module) -> bool``; None takes the plan's (``DEFAULT_SKIP``: ``lm_head``, ``head``,
        ``gate``, ``router``).  ``skip=()`` converts every Linear layer
    seed : the run's seed for recipes with stochastic rounding: layer ``name`` draws from
        ``(seed, step, name)`` (:class:`~fp8sim.torch.LayerState`, as :class:`fp8sim.training.Linear`)
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"fp8sim.torch.convert: model must be a torch.nn.Module, got {type(model).__name__}")
    p = recipe if isinstance(recipe, Plan) else plan(recipe)
    if skip is not None:
        p = replace(p, skip=skip)
    inside_mha = {id(c) for m in model.modules() if isinstance(m, torch.nn.MultiheadAttention) for c in m.children()}
    new: dict[int, Linear] = {}
    for name, m in model.named_modules():
        if not convertible(m) or id(m) in inside_mha or id(m) in new:
            continue
        o = p.options_for(name, m)
        if o is None:
            continue
        new[id(m)] = Linear.from_linear(m, o, name=name or "linear", seed=seed)
        if p.master_weights == "fp32":
            for t in (m.weight, m.bias):
                if t is not None and t.dtype != torch.float32:
                    t.data = t.data.float()
    _warn_unreached(model, p, new)
    for parent in list(model.modules()):
        for cname, child in list(parent._modules.items()):  # every name, also a child held twice
            if child is not None and id(child) in new:
                setattr(parent, cname, new[id(child)])
    return new.get(id(model), model)


def _join(name: str, child: str) -> str:
    return f"{name}.{child}" if name else child


def _warn_unreached(model: torch.nn.Module, p: Plan, new: dict[int, Linear]) -> None:
    """One :class:`UnconvertedWarning` naming the modules whose projections :func:`convert` cannot reach."""
    found: list[str] = []
    seen: set[int] = set()
    for name, m in model.named_modules():
        if id(m) in seen:
            continue
        seen.add(id(m))
        if isinstance(m, torch.nn.MultiheadAttention):
            if not p.skips(_join(name, "out_proj"), m.out_proj):
                inproj = "in_proj_weight" if m._qkv_same_embed_dim else "q/k/v_proj_weight"
                found.append(
                    f"{name or '<model>'!r} (torch.nn.MultiheadAttention: F.linear on {inproj} and out_proj.weight)"
                )
        elif isinstance(m, torch.nn.TransformerEncoderLayer):
            ff = [getattr(m, a, None) for a in ("linear1", "linear2")]
            if any(id(f) in new for f in ff):
                found.append(
                    f"{name or '<model>'!r} (torch.nn.TransformerEncoderLayer: in eval mode without grad its fast "
                    "path reads the weights of linear1 and linear2; torch.backends.mha.set_fastpath_enabled(False) "
                    "turns it off)"
                )
    if found:
        warnings.warn(
            "fp8sim.torch.convert: these modules compute Linear projections that convert cannot reach, so "
            "those GEMMs stay in the model's precision: " + "; ".join(found) + ". Build them from nn.Linear "
            "layers, or skip them (skip the attention's out_proj) to silence this.",
            UnconvertedWarning,
            stacklevel=3,
        )
