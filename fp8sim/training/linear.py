"""FP8 Linear layer: the three GEMMs of training, each through a recipe.

For ``Y = X W`` with ``X (T, D_in)`` (T tokens) and master weights ``W (D_in, D_out)``:

==========  ========================  =====  ===========================================
GEMM        product                   K      operands quantized along K
==========  ========================  =====  ===========================================
Fprop       ``Y  = X  @ W``           D_in   X: ``x_granularity`` along D_in (1x128 tiles
                                             per token); W: ``w_granularity`` (128x128)
Dgrad       ``dX = dY @ W^T``         D_out  dY: along D_out (1x128 per token); W^T: the
                                             Fprop quantization of W, transposed, when the
                                             weight blocks are square (128x128, per tensor)
                                             -- W and W^T share scales --, else W
                                             re-quantized along D_out
Wgrad       ``dW = X^T @ dY``         T      X^T and dY re-quantized along the tokens
                                             (1x128 along T for X^T, 128x1 for dY (T, D_out))
==========  ========================  =====  ===========================================

Formats: activations ``recipe.x_format``, weights ``recipe.w_format``, gradients
``recipe.grad_format`` (TransformerEngine's hybrid E5M2) or ``recipe.x_format``.
Dgrad and Wgrad use :meth:`Recipe.backward` (its promotion interval).  Wgrad's output is
FP32 (FP32 weight gradients, as DeepSeek-V3 keeps them); Fprop and Dgrad give the
recipe's output format (BF16 for the FP8 presets).

Every GEMM of :mod:`fp8sim.training` goes through :func:`matmul`, which calls
:func:`fp8sim.gemm` (the path and the default ``fidelity="exact"`` of every user) with the
operands quantized here.  Recipes whose scales are folded into a block-scaled MMA (MXFP8, MXFP4,
NVFP4 on Blackwell; :attr:`Recipe.block_scaled`) run :func:`block_scaled_matmul` instead: the same
arithmetic as :func:`fp8sim.gemms.block_scaled.block_scaled_gemm`, from operands quantized here
(``fp8sim.gemm`` quantizes block-scaled operands itself, 1x16 along K, and takes no
QuantizedTensors).

TransformerEngine's NVFP4 techniques (recipe fields, all off by default):

* ``weight_2d_blocks``: W quantized with one E4M3 scale per 16x16 block
  (:func:`fp8sim.scaling.nvfp4.quantize_nvfp4_2d`); W and W^T then quantize alike, so Dgrad
  reuses Fprop's quantized W (as with 128x128 blocks);
* ``wgrad_rht``: before Wgrad's operands X^T and dY are quantized along the tokens, both are
  multiplied by the same block-diagonal random Hadamard matrix along the tokens
  (:func:`fp8sim.scaling.hadamard.rht`, size 16, signs ``rht_seed``; the float64 result rounded to
  float32): ``(X^T R)(R^T dY) = X^T dY``;
* ``grad_rounding="sr"``: dY is quantized with stochastic rounding in Dgrad and Wgrad (the seed of
  each quantization comes from the run's seed, the step, the layer and the operand:
  :func:`sr_seed`).
"""

from __future__ import annotations

import copy
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._fpenv import ieee_defaults
from ..gemms.api import gemm
from ..gemms.engine import cast_operand
from ..gemms.operands import transpose_quantized
from ..gemms.presets import recipe as get_recipe
from ..gemms.recipes import BF16_ACCUMULATORS
from ..gemms.roles import ROLES, role_formats, role_granularities, role_recipe
from ..metrics import quantization_counts
from ..rounding import cast
from ..scaling import QuantizedTensor, quantize
from ..scaling import granularity as as_granularity
from ..scaling.hadamard import rht
from ..scaling.nvfp4 import quantize_nvfp4_2d
from ..scaling.orientation import along_k
from ._detmath import det_matmul

__all__ = [
    "ROLES",
    "matmul",
    "role_recipe",
    "quantize_operand",
    "orient",
    "Linear",
    "Param",
    "Record",
    "tensor_record",
    "operand_stats",
    "wide_recipe",
    "transposes_share_scales",
    "block_scaled_matmul",
    "wgrad_transform",
    "sr_seed",
]


# ------------------------------------------------------------------ recipes
def wide_recipe(name: str):
    """The unquantized preset ``name`` (``"bf16"``, ``"fp32"``, ``"fp64"``)."""
    return get_recipe(name)


# ------------------------------------------------------------------ quantization along K
def _operand(k_axis: int) -> str:
    if k_axis not in (0, 1):
        raise ValueError(f"orient: k_axis must be 0 or 1, got {k_axis!r}")
    return "x" if k_axis == 1 else "w"


def orient(g, k_axis: int):
    """The granularity ``g`` (a recipe's spelling for an ``(M, K)`` operand, blocks along K) for
    a 2-D operand whose reduction dimension is axis ``k_axis`` (1: ``(M, K)``, 0: ``(K, N)``):
    :func:`fp8sim.scaling.orientation.along_k`, the GEMM's own rule (``1x128`` becomes ``128x1`` for a
    ``(K, N)`` operand, groups and MX blocks move to axis 0; per-tensor and delayed scaling are
    unchanged)."""
    return along_k(g, _operand(k_axis))


def transposes_share_scales(g) -> bool:
    """True when quantizing ``W`` and ``W^T`` with ``g`` gives the same blocks (per tensor, square tiles):
    then Dgrad reuses Fprop's quantized weight."""
    g = as_granularity(g)
    return g.same_when_transposed


def quantize_operand(
    a,
    fmt: str,
    g,
    k_axis: int,
    *,
    scale_format=None,
    scale_rounding=None,
    margin: int = 0,
    mode: str = "rne",
    seed=None,
    blocks_2d: bool = False,
):
    """Quantize the 2-D GEMM operand ``a`` to ``fmt`` with the recipe granularity ``g`` laid along
    its reduction axis ``k_axis`` (see :func:`orient`), elements rounded in ``mode`` (``"sr"``
    needs ``seed``).  ``blocks_2d`` (an NVFP4 weight, ``Recipe.weight_2d_blocks``): one E4M3 scale
    per 16x16 block instead (:func:`fp8sim.scaling.nvfp4.quantize_nvfp4_2d`; the same for either
    ``k_axis``)."""
    a = np.asarray(a)
    if a.ndim != 2:
        raise ValueError(f"quantize_operand: a must be 2-D, got shape {a.shape}")
    if blocks_2d:
        return quantize_nvfp4_2d(a, fmt, mode=mode, seed=seed, margin=margin)
    go = orient(g, k_axis)  # (delayed scaling: the object itself, with its history)
    kw: dict[str, Any] = {"scale_rounding": scale_rounding, "margin": margin}
    if mode != "rne":
        kw.update(mode=mode, seed=seed)
    if go.own_scale_format or scale_format is None:  # (MX: E8M0 scales whatever the recipe says)
        return quantize(a, fmt, go, **kw)
    return quantize(a, fmt, go, scale_format=scale_format, **kw)


def operand_stats(a: np.ndarray, q: QuantizedTensor) -> tuple[int, int]:
    """``(n_saturated, n_underflow)`` of the quantization ``q`` of ``a`` (in the mode ``q`` was
    made with): :func:`fp8sim.metrics.quantization_counts`, the one definition (saturated: clipped
    by the conversion, infinities included; underflowed: nonzero, non-NaN elements that became
    exactly zero)."""
    c = quantization_counts(a, q, mode=q.mode)
    return c["n_saturated"], c["n_underflow"]


def sr_seed(base: int, step: int, name: str) -> int:
    """The seed of one stochastic-rounding quantization in training: a 63-bit integer from
    ``numpy.random.SeedSequence([base, step, crc32(name)])`` (``base``: the run's seed; ``name``:
    layer and operand, e.g. ``"layer0.mlp.up:dy"``), so that every tensor of every step draws its
    own random bits and a run is reproduced by its seed (a rollback replays the same bits)."""
    ss = np.random.SeedSequence([int(base) & 0xFFFFFFFF, int(step), zlib.crc32(name.encode())])
    return int(ss.generate_state(1, np.uint64)[0] >> np.uint64(1))


def wgrad_transform(a: np.ndarray, axis: int, r) -> np.ndarray:
    """A Wgrad operand as recipe ``r`` quantizes it: with ``r.wgrad_rht`` its random Hadamard
    transform along the token axis ``axis`` (size 16, signs ``r.rht_seed``; float64, rounded once
    to ``a``'s float dtype, float32 for float32/bf16 inputs), else ``a`` itself."""
    if not r.wgrad_rht:
        return a
    a = np.asarray(a)
    out = np.float64 if a.dtype == np.float64 else np.float32
    return rht(a, axis=axis, n=16, seed=r.rht_seed).astype(out)


def block_scaled_matmul(qa: QuantizedTensor, qb: QuantizedTensor, recipe) -> np.ndarray:
    """``qa (M, K) @ qb (K, N)`` on the block-scaled MMA of ``recipe`` (``Recipe.block_scaled``) from
    operands quantized along K: :func:`fp8sim.gemms.block_scaled.block_scaled_gemm_quantized`, the
    arithmetic of :func:`fp8sim.gemm` for these recipes.  Returns float32 (float64 for an fp64
    output format)."""
    from ..gemms.block_scaled import block_scaled_gemm_quantized

    return block_scaled_gemm_quantized(qa, qb, recipe)


@ieee_defaults
def matmul(
    a, b, recipe, role: str, *, layout: str = "kn", fidelity: str = "exact", seed: int | None = None
) -> np.ndarray:
    """The one GEMM of :mod:`fp8sim.training`: ``a @ b`` (``b`` given as ``(N, K)`` with
    ``layout="nk"``) as GEMM ``role`` (``"fprop"``, ``"dgrad"``, ``"wgrad"``) of ``recipe``.

    For FP8 recipes the operands should be :class:`QuantizedTensor` objects quantized along K
    (:func:`quantize_operand`); float arrays are quantized here with the role's formats and the
    recipe's granularities laid along K (``a`` along axis 1, ``b`` along its K axis) and its
    training options: ``weight_2d_blocks`` for the weight (``b`` of Fprop and Dgrad),
    ``wgrad_rht`` (both Wgrad operands transformed along K first, :func:`wgrad_transform`) and
    ``grad_rounding`` for the gradient (``a`` of Dgrad, ``b`` of Wgrad; ``"sr"`` needs ``seed``).
    Block-scaled recipes run :func:`block_scaled_matmul`, the others :func:`fp8sim.gemm`.  Wide recipes
    take float arrays; arrays with more than 2 dimensions are batched GEMMs (attention), FP8
    recipes run them as one :func:`fp8sim.gemm` per matrix.  Wide recipes cast like
    :func:`fp8sim.gemm` (operands rounded to the recipe's format, output rounded to the output
    format); with ``fidelity="exact"`` (the default) the products are summed in float64 in a fixed
    order (:func:`~fp8sim.training._detmath.det_matmul`), the same bits on every machine; with
    ``"fast"`` by float32 BLAS (:func:`fp8sim.gemm`, or one batched numpy product), whose summation
    order depends on the machine.

    Returns float32 holding output-format values (float64 for fp64 recipes).
    """
    rr = role_recipe(recipe, role)
    if fidelity not in ("fast", "exact"):
        raise ValueError(f"matmul: fidelity must be 'fast' or 'exact', got {fidelity!r}")
    if not rr.is_fp8:
        if isinstance(a, QuantizedTensor) or isinstance(b, QuantizedTensor):
            raise TypeError(f"matmul: recipe {rr.name!r} is not FP8 and takes float arrays")
        a, b = np.asarray(a), np.asarray(b)
        if rr.accumulator in BF16_ACCUMULATORS:  # the BF16 tensor-core model: machine-independent bits
            return _bf16_tensorcore(a, b, rr, layout)
        if fidelity == "exact":
            return _wide_batched(a, b if layout == "kn" else np.swapaxes(b, -1, -2), rr, deterministic=True)
        if a.ndim > 2 or b.ndim > 2:
            return _wide_batched(a, b if layout == "kn" else np.swapaxes(b, -1, -2), rr)
        return np.asarray(gemm(a, b, rr, layout=layout, fidelity=fidelity))
    if not isinstance(a, QuantizedTensor) and np.ndim(a) > 2:
        # batched FP8 GEMM (e.g. attention put in FP8): one fp8sim.gemm per matrix
        a = np.asarray(a)
        bb = np.asarray(b) if layout == "kn" else np.swapaxes(np.asarray(b), -1, -2)
        lead = np.broadcast_shapes(a.shape[:-2], bb.shape[:-2])
        a = np.broadcast_to(a, lead + a.shape[-2:])
        bb = np.broadcast_to(bb, lead + bb.shape[-2:])
        out = [
            matmul(
                np.ascontiguousarray(a[i]),
                np.ascontiguousarray(bb[i]),
                recipe,
                role,
                fidelity=fidelity,
                seed=None if seed is None else sr_seed(seed, j, "batch"),
            )
            for j, i in enumerate(np.ndindex(*lead))
        ]
        return np.stack(out).reshape(lead + out[0].shape)
    r0 = get_recipe(recipe)
    fa, fb = role_formats(r0, role)
    ga, gb = role_granularities(r0, role)
    mode_a = r0.grad_rounding if role == "dgrad" else "rne"
    mode_b = r0.grad_rounding if role == "wgrad" else "rne"
    kb = 0 if layout == "kn" else 1
    needs_seed = (mode_a == "sr" and not isinstance(a, QuantizedTensor)) or (
        mode_b == "sr" and not isinstance(b, QuantizedTensor)
    )
    if needs_seed and seed is None:
        raise ValueError(
            f"matmul: recipe {r0.name!r} rounds gradients stochastically (grad_rounding='sr'): pass seed=<int> "
            "or quantized operands"
        )
    if role == "wgrad":
        a = a if isinstance(a, QuantizedTensor) else wgrad_transform(a, 1, r0)
        b = b if isinstance(b, QuantizedTensor) else wgrad_transform(b, kb, r0)
    pol: dict[str, Any] = {"scale_format": rr.scale_format, "scale_rounding": rr.scale_rounding, "margin": rr.margin}
    if not isinstance(a, QuantizedTensor):
        a = quantize_operand(a, fa, ga, 1, mode=mode_a, seed=seed, **pol)
    if not isinstance(b, QuantizedTensor):
        b2d = role != "wgrad" and r0.weight_2d_blocks
        b = quantize_operand(b, fb, gb, kb, mode=mode_b, seed=seed, blocks_2d=b2d, **pol)
    if rr.block_scaled:
        return block_scaled_matmul(a, transpose_quantized(b) if layout == "nk" else b, rr)
    return np.asarray(gemm(a, b, rr, layout=layout, fidelity=fidelity))


def _bf16_tensorcore(a, b, r, layout: str):
    """A BF16 recipe on the tensor-core model (``accumulator="wgmma.bf16"``, e.g. "bf16-cublaslt"):
    one :func:`fp8sim.gemm` per matrix of the leading dimensions."""
    if a.ndim == 2 and b.ndim == 2:
        return np.asarray(gemm(a, b, r, layout=layout))
    bb = b if layout == "kn" else np.swapaxes(b, -1, -2)
    lead = np.broadcast_shapes(a.shape[:-2], bb.shape[:-2])
    a = np.broadcast_to(a, lead + a.shape[-2:])
    bb = np.broadcast_to(bb, lead + bb.shape[-2:])
    out = [np.asarray(gemm(np.ascontiguousarray(a[i]), np.ascontiguousarray(bb[i]), r)) for i in np.ndindex(*lead)]
    return np.stack(out).reshape(lead + out[0].shape)


def _wide_batched(a, b, r, deterministic: bool = False):
    """A wide-recipe GEMM (batched over leading dimensions): operands cast to the recipe's formats
    as :func:`fp8sim.gemm` casts them (:func:`~fp8sim.gemms.engine.cast_operand`), products summed by
    numpy's BLAS (float32; machine-dependent order) or, with ``deterministic``, by
    :func:`~fp8sim.training._detmath.det_matmul` (float64 sums in a fixed order: the same bits on
    every machine), the float32 result rounded to the output format (:func:`fp8sim.rounding.cast`)."""
    with np.errstate(all="ignore"):
        ca, cb = cast_operand(a, r.x_format), cast_operand(b, r.w_format)
        y = det_matmul(ca, cb) if deterministic else np.matmul(ca, cb)
    if r.output_format == "fp64" or r.x_format == "fp64":
        return y.astype(np.float64)
    y = y.astype(np.float32)
    return cast(y, "bf16") if r.output_format == "bf16" else y


# ------------------------------------------------------------------ the layer
@dataclass
class Param:
    """A master parameter (FP32, FP64 for the fp64 recipe) and its gradient."""

    name: str
    value: np.ndarray
    grad: Any = None
    decay: bool = True

    def __post_init__(self):
        if self.grad is None:
            self.grad = np.zeros_like(self.value)


@dataclass
class Record:
    """Statistics of one tensor in one step (filled by the layers, read by the drift monitor)."""

    amax: float
    rms: float
    n: int
    n_saturated: int = 0
    n_underflow: int = 0
    quantized: bool = False


def tensor_record(x: np.ndarray, q: QuantizedTensor | None = None) -> Record:
    """amax, RMS and size of ``x``; with its quantization ``q`` also the saturation and underflow
    counts (:func:`operand_stats`)."""
    xf = np.asarray(x)
    with np.errstate(all="ignore"):
        amax = float(np.max(np.abs(xf))) if xf.size else 0.0
        rms = float(np.sqrt(np.mean(np.square(xf, dtype=np.float64)))) if xf.size else 0.0
    if q is None:
        return Record(amax, rms, int(xf.size))
    sat, und = operand_stats(xf, q)
    return Record(amax, rms, int(xf.size), sat, und, True)


@dataclass
class Linear:
    """``Y = X W`` with FP32 master weights ``W (d_in, d_out)`` and FP32 weight gradients.

    ``forward(X, ctx)`` and ``backward(dY, ctx)`` run the Fprop, Dgrad and Wgrad GEMMs of
    ``ctx.recipe_for(self.part)`` through :func:`matmul`, with operands quantized along each GEMM's
    K (module docstring).  ``last_operands[role] = (a, b, layout)`` keeps the operands of the most
    recent GEMM of each role (QuantizedTensors for FP8 recipes), so that tests can check the axes.
    """

    name: str
    part: str
    weight: Param
    last_operands: dict = field(default_factory=dict, repr=False)
    _cache: Any = field(default=None, repr=False)
    _delayed: dict = field(default_factory=dict, repr=False)

    @classmethod
    def create(cls, name: str, part: str, d_in: int, d_out: int, rng, std: float, dtype=np.float32):
        w = (rng.standard_normal((d_in, d_out)) * std).astype(dtype)
        return cls(name, part, Param(name + ".weight", w))

    def params(self):
        return [self.weight]

    def _g(self, g, key):
        """Granularity objects with state (delayed scaling) get one copy per operand of this layer."""
        g = as_granularity(g)
        if g.stateful:
            if key not in self._delayed:
                self._delayed[key] = copy.deepcopy(g)
            return self._delayed[key]
        return g

    def _q(self, a, fmt, g, key, k_axis, r, ctx, mode: str = "rne", blocks_2d: bool = False):
        seed = None
        if mode != "rne":  # stochastic rounding: the run's seed, the step, this layer and operand
            seed = sr_seed(getattr(ctx, "sr_seed", 0), getattr(ctx, "step", 0), f"{self.name}:{key}")
        q = quantize_operand(
            a,
            fmt,
            self._g(g, key),
            k_axis,
            scale_format=r.scale_format,
            scale_rounding=r.scale_rounding,
            margin=r.margin,
            mode=mode,
            seed=seed,
            blocks_2d=blocks_2d,
        )
        rec = tensor_record(a, q)
        ctx.record(f"{self.name}:{key}", rec)
        return q

    def forward(self, x: np.ndarray, ctx) -> np.ndarray:
        r = get_recipe(ctx.recipe_for(self.part))
        x = ctx.perturb(self.name, x)
        W = self.weight.value
        if r.is_fp8:
            qx = self._q(x, r.x_format, r.x_granularity, "x", 1, r, ctx)
            qw = self._q(W, r.w_format, r.w_granularity, "w", 0, r, ctx, blocks_2d=r.weight_2d_blocks)
            self.last_operands["fprop"] = (qx, qw, "kn")
            y = matmul(qx, qw, r, "fprop", fidelity=ctx.fidelity)
        else:
            ctx.record(f"{self.name}:x", tensor_record(x))
            self.last_operands["fprop"] = (x, W, "kn")
            y = matmul(x, W.astype(x.dtype, copy=False), r, "fprop", fidelity=ctx.fidelity)
            qw = None
        self._cache = (x, qw, r)
        return y.astype(ctx.dtype, copy=False)

    def backward(self, dy: np.ndarray, ctx) -> np.ndarray:
        x, qw, r = self._cache
        W = self.weight.value
        rb = r.backward()
        if r.is_fp8:
            gfmt = r.grad_format or r.x_format
            # Dgrad: dX = dY @ W^T, K = d_out
            qdy = self._q(dy, gfmt, r.x_granularity, "dy", 1, rb, ctx, mode=r.grad_rounding)
            if r.weight_2d_blocks or transposes_share_scales(r.w_granularity):
                b, layout = qw, "nk"  # W^T shares W's 128x128, 16x16 (or per-tensor) scales
            else:
                b, layout = self._q(np.ascontiguousarray(W.T), r.w_format, r.w_granularity, "wT", 0, rb, ctx), "kn"
            self.last_operands["dgrad"] = (qdy, b, layout)
            dx = matmul(qdy, b, r, "dgrad", layout=layout, fidelity=ctx.fidelity)
            # Wgrad: dW = X^T @ dY, K = T (tokens): both operands re-quantized along the tokens (after the
            # random Hadamard transform along the tokens, with wgrad_rht)
            xt = wgrad_transform(np.ascontiguousarray(x.T), 1, r)
            qxt = self._q(xt, r.x_format, r.x_granularity, "xT", 1, rb, ctx)
            qdyt = self._q(wgrad_transform(dy, 0, r), gfmt, r.x_granularity, "dyT", 0, rb, ctx, mode=r.grad_rounding)
            self.last_operands["wgrad"] = (qxt, qdyt, "kn")
            dw = matmul(qxt, qdyt, r, "wgrad", fidelity=ctx.fidelity)
        else:
            ctx.record(f"{self.name}:dy", tensor_record(dy))
            Wc = W.astype(dy.dtype, copy=False)
            self.last_operands["dgrad"] = (dy, Wc, "nk")
            dx = matmul(dy, Wc, r, "dgrad", layout="nk", fidelity=ctx.fidelity)
            xt = np.ascontiguousarray(x.T)
            self.last_operands["wgrad"] = (xt, dy, "kn")
            dw = matmul(xt, dy, r, "wgrad", fidelity=ctx.fidelity)
        self.weight.grad += dw.astype(self.weight.grad.dtype, copy=False)
        self._cache = None
        return dx.astype(ctx.dtype, copy=False)
