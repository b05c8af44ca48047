"""FP8 GEMMs as recipes describe them and libraries run them.

A :class:`Recipe` names every choice of one GEMM (operand formats and granularities, the accumulator
model, promotion, scale placement, split-K, output format); the presets (:func:`recipe`,
:func:`recipe_names`) are the ones in docs/gemm.md and docs/libraries.md.

* :func:`gemm` quantizes float operands as the recipe says and runs them (:mod:`.operands`, then
  the one engine :mod:`.engine`; block-scaled MMAs in :mod:`.block_scaled`), optionally with a
  :class:`GemmReport` (:mod:`.error_report`);
* :func:`scaled_gemm` runs codes and scales the user already has, as a library does;
* :func:`identify` finds the recipe a library's outputs were computed with (:mod:`.identification`);
* :func:`kernel_choice` says which kernel runs a recipe on this machine, and why the faster ones do
  not (:mod:`.kernels`; the decision is :func:`fp8sim.tensorcore.kernels.select`);
* CuPy arrays and CUDA torch tensors run on the GPU (:mod:`.device`).

A recipe is composed of typed specs (:mod:`.specs`): an :class:`OperandSpec` per operand, a
:class:`GemmSpec` per GEMM (fprop, dgrad, wgrad: :meth:`Recipe.gemm`) and a :class:`TrainingSpec`.
New presets: :func:`register_preset`.

Modules, lowest first: ``specs`` -> ``recipe_checks`` -> ``recipes`` -> ``presets`` -> ``roles``,
``operands`` -> ``engine`` -> ``block_scaled``, ``error_report``, ``device``, ``kernels`` -> ``api`` ->
``identification``.  Nothing in :mod:`fp8sim.tensorcore` or :mod:`fp8sim.scaling` imports this package
(``tests/test_static.py``).
"""

from .api import GemmReport, gemm, scaled_gemm
from .block_scaled import block_scaled_gemm
from .identification import IdentifyResult, identify
from .kernels import KernelChoice, kernel_choice
from .presets import PRESETS, recipe, recipe_names, register_preset
from .recipes import Recipe
from .specs import GemmSpec, OperandSpec, SplitK, TrainingSpec, WideAccumulator

__all__ = [
    "Recipe",
    "recipe",
    "recipe_names",
    "register_preset",
    "OperandSpec",
    "GemmSpec",
    "SplitK",
    "TrainingSpec",
    "WideAccumulator",
    "PRESETS",
    "gemm",
    "scaled_gemm",
    "block_scaled_gemm",
    "identify",
    "IdentifyResult",
    "GemmReport",
    "kernel_choice",
    "KernelChoice",
]
