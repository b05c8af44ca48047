"""Which kernel computes a recipe's GEMM on this machine, and why the faster ones were not taken.

:func:`kernel_choice` asks the kernel registry (:mod:`fp8sim.tensorcore.kernels`) what
:func:`fp8sim.gemm` would run for a recipe:

* FP8 recipes: the promoted scaled GEMM (``scaled_matmul``), one line per kernel of that operation
  (the packed kernel checks the codes for inf / NaN while it runs: the kernel for codes that hold
  some is named too; the promotion loop names the instruction-chain kernel it runs);
* block-scaled recipes (MXFP8, MXFP4, NVFP4 on Blackwell): :func:`fp8sim.tensorcore.matmul` with the
  scales inside every instruction, one line per instruction-chain kernel (on the host, whatever
  the backend);
* wide recipes (bf16, fp32, fp64 operands): no FP8 kernel -- numpy's BLAS, or for
  ``accumulator="wgmma.bf16"`` the BF16 tensor-core model (``fp8sim.tensorcore.wide.bf16_matmul``).

``fp8sim info --kernels RECIPE`` prints :meth:`KernelChoice.explain`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..formats import format as get_format
from ..tensorcore import get_model
from ..tensorcore.kernels import (
    NoKernelError,
    chain_request,
    explain,
    get_kernel,
    scaled_request,
    select,
    with_facts,
)
from .presets import recipe as get_recipe
from .recipes import BF16_ACCUMULATORS, Recipe

__all__ = ["KernelChoice", "kernel_choice"]


@dataclass(frozen=True)
class KernelChoice:
    """The kernel a recipe's GEMM runs on: ``kernel`` (its name, None where no kernel computes it or
    the recipe needs none), ``operation`` (``"scaled"``, ``"chain"`` or ``"wide"``), ``rows`` (every
    kernel of the operation in the registry's order with ``None`` where it supports the GEMM, else
    the reason it does not) and ``notes`` (what else runs)."""

    recipe: str
    operation: str
    kernel: str | None
    rows: tuple[tuple[str, str | None], ...]
    notes: tuple[str, ...]
    backend: str
    fidelity: str
    formats: tuple[str, str]

    def explain(self) -> str:
        """One line per kernel: ``->`` before the one that runs, the reason for each that does not."""
        head = (
            f"recipe {self.recipe!r} ({self.formats[0]} x {self.formats[1]}, backend={self.backend!r}, "
            f"fidelity={self.fidelity!r})"
        )
        lines = [head]
        if self.operation == "wide":
            lines.append(f"  no FP8 kernel: {self.notes[0]}")
            lines += [f"  {n}" for n in self.notes[1:]]
            return "\n".join(lines)
        what = (
            "the instruction chain (block scales in every instruction)"
            if self.operation == "chain"
            else ("the promoted scaled GEMM")
        )
        lines.append(f"  {what}; kernels in the registry's order (fastest first):")
        width = max(len(n) for n, _ in self.rows)
        seen = False
        for name, why in self.rows:
            if name == self.kernel:
                lines.append(f"  -> {name:<{width}}  runs: {get_kernel(name).computes}")
                seen = True
            elif why is None:
                lines.append(f"     {name:<{width}}  supports it too (after {self.kernel!r} in the order)")
            else:
                lines.append(f"     {name:<{width}}  {'not taken' if not seen else 'no'}: {why}")
        if self.kernel is None:
            lines.append("  no kernel computes this GEMM")
        lines += [f"  {n}" for n in self.notes]
        return "\n".join(lines)

    def summary(self) -> dict:
        """A JSON-ready dict of the choice."""
        return {
            "recipe": self.recipe,
            "operation": self.operation,
            "kernel": self.kernel,
            "backend": self.backend,
            "fidelity": self.fidelity,
            "formats": list(self.formats),
            "kernels": [{"name": n, "supported": w is None, "reason": w} for n, w in self.rows],
            "notes": list(self.notes),
        }


def _name(fmt) -> str:
    """A format's name (the wide recipes' "fp64" is no catalogue format)."""
    return fmt if fmt == "fp64" else get_format(fmt).name


def _select(req) -> str | None:
    try:
        return select(req).name
    except NoKernelError:
        return None


def kernel_choice(
    recipe: str | Recipe,
    *,
    backend: str = "cpu",
    fidelity: str = "exact",
    a_format=None,
    b_format=None,
) -> KernelChoice:
    """The kernel :func:`fp8sim.gemm` runs for ``recipe`` (a preset name or a :class:`Recipe`) with
    ``backend`` (``"cpu"`` or ``"cupy"``) and ``fidelity`` on this machine, and why each kernel before
    it was not taken.  ``a_format`` / ``b_format`` override the recipe's operand formats (a backward
    GEMM's gradient format, say)."""
    if backend not in ("cpu", "cupy"):
        raise ValueError(f"kernel_choice: backend must be 'cpu' or 'cupy', got {backend!r}")
    if fidelity not in ("exact", "fast"):
        raise ValueError(f"kernel_choice: fidelity must be 'exact' or 'fast', got {fidelity!r}")
    r = get_recipe(recipe) if isinstance(recipe, str) else recipe
    xf = r.x_format if a_format is None else a_format
    wf = r.w_format if b_format is None else b_format
    formats = (_name(xf), _name(wf))

    def choice(operation: str, kernel: str | None, rows, notes) -> KernelChoice:
        return KernelChoice(r.name, operation, kernel, tuple(rows), tuple(notes), backend, fidelity, formats)

    acc = r.accumulator
    notes: list[str] = []
    if not r.is_fp8:
        if isinstance(acc, str) and acc in BF16_ACCUMULATORS:
            bf16 = get_model(acc)
            inner = "the general instruction-chain kernels"
            if get_kernel("general").claims(bf16) is not None:
                inner = "its own bf16 row kernel"
            notes.append(
                f"the BF16 tensor-core model {bf16.name!r} (fp8sim.tensorcore.wide.bf16_matmul, on {inner}), on the host"
            )
        else:
            wide = "float64" if acc == "fp64" or formats[0] == "fp64" else "float32"
            notes.append(f"numpy's {wide} BLAS on the {formats[0]} operands, on the host (an unquantized recipe)")
        return choice("wide", None, (), notes)
    fa, fb = get_format(xf), get_format(wf)
    model = None if acc == "fp64" else get_model(acc)  # type: ignore[arg-type]
    if r.block_scaled:
        req = chain_request(model, fa, fb, block_scales=True)
        notes.append("block-scaled recipes run fp8sim.tensorcore.matmul with the scales, on the host")
        if fidelity == "fast":
            notes.append("fidelity='fast' does not apply to block-scaled recipes (always bit-exact)")
        return choice("chain", _select(req), ((k.name, w) for k, w in explain(req)), notes)
    req = scaled_request(model, fa, fb, fidelity=fidelity, backend=backend)
    kernel = _select(req)
    if kernel == "packed":
        other = _select(with_facts(req, finite_codes=False))
        notes.append(f"operands holding inf / NaN codes run on {other!r} (the packed kernel takes finite codes)")
    if kernel == "chain-loop":
        chain = _select(chain_request(model, fa, fb))
        notes.append(f"each promotion interval's instruction chain runs on {chain!r}")
    return choice("scaled", kernel, ((k.name, w) for k, w in explain(req)), notes)
