"""The three GEMMs of training as a recipe defines them (:data:`ROLES`: Fprop ``y = x w``, Dgrad
``dx = dy w^T``, Wgrad ``dw = x^T dy``): which recipe, operand formats and granularities each one
runs with.  The logic is the recipe's (:meth:`Recipe.role`, :meth:`Recipe.operands`,
:meth:`Recipe.gemm`); these functions take a preset name or a recipe."""

from __future__ import annotations

from typing import Any

from .presets import recipe as _recipe
from .recipes import Recipe
from .specs import ROLES

__all__ = ["ROLES", "role_recipe", "role_formats", "role_granularities"]


def role_recipe(recipe: str | Recipe, role: str) -> Recipe:
    """The recipe a GEMM of ``role`` runs with (:meth:`Recipe.role`): Fprop the recipe itself;
    Dgrad :meth:`Recipe.backward`; Wgrad :meth:`Recipe.backward` with FP32 output (FP32 weight
    gradients, except fp64 recipes)."""
    return _recipe(recipe).role(role)


def role_formats(r: str | Recipe, role: str) -> tuple[Any, Any]:
    """The operand formats ``(a, b)`` of GEMM ``role`` of recipe ``r`` (gradients in ``grad_format``)."""
    a, b = _recipe(r).operands(role)
    return a.format, b.format


def role_granularities(r: str | Recipe, role: str) -> tuple[Any, Any]:
    """The operand granularities ``(a, b)`` of GEMM ``role``, as the recipe spells them (Wgrad: both
    along the tokens, as x)."""
    a, b = _recipe(r).operands(role)
    return a.spelling, b.spelling
