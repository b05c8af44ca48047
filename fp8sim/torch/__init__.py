"""PyTorch adapter: run a torch model's Linear layers with the FP8 GEMMs of an fp8sim recipe.

``import fp8sim.torch`` (needs PyTorch: ``pip install "fp8sim[torch]"``; ``import fp8sim`` does not
import it)::

    import fp8sim.torch as ft
    y = ft.linear(x, weight, bias, recipe="deepseek-v3")     # autograd: Fprop, Dgrad, Wgrad
    model = ft.convert(model, "deepseek-v3")                 # swap nn.Linear layers in place: plan("deepseek-v3")

* :func:`linear`: ``x @ weight.T + bias`` whose three GEMMs are bit-identical to fp8sim's numpy
  API (:func:`fp8sim.training.matmul`, :class:`fp8sim.training.Linear`) on the same values;
* :class:`Linear`: a drop-in ``nn.Linear`` (same parameters, ``from_linear``);
* :func:`convert`: swaps ``nn.Linear`` layers by name patterns or a predicate, applying a plan
  (``convert(model, "deepseek-v3")`` is ``convert(model, plan("deepseek-v3"))``, the whole scheme);
* :class:`Plan` / :func:`plan`: a precision plan (DeepSeek-V3's: high-precision head and gating,
  FP8 activation cache, E5M6 input of the post-attention Linear, FP32 master weights).

The GEMMs are the custom operators ``torch.ops.fp8sim.linear`` / ``linear_backward``, opaque to
``torch.compile``.  See docs/pytorch.md.
"""

try:
    import torch as _torch  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError('fp8sim.torch needs PyTorch: pip install "fp8sim[torch]" (or pip install torch)') from e

from .function import (
    SUPPORTED_DTYPES,
    ActivationCache,
    LayerState,
    LinearFunction,
    LinearOptions,
    expand_groups,
    group_recipe,
    linear,
    options,
)
from .modules import Linear, UnconvertedWarning, convert, convertible
from .plans import ATTN_OUT, DEEPSEEK_ATTN_OUT_CACHE, DEFAULT_SKIP, Plan, matches, plan, plan_names

__all__ = [
    "linear",
    "Linear",
    "convert",
    "convertible",
    "UnconvertedWarning",
    "Plan",
    "plan",
    "plan_names",
    "matches",
    "ActivationCache",
    "LinearOptions",
    "LinearFunction",
    "LayerState",
    "options",
    "group_recipe",
    "expand_groups",
    "SUPPORTED_DTYPES",
    "DEFAULT_SKIP",
    "ATTN_OUT",
    "DEEPSEEK_ATTN_OUT_CACHE",
]
