"""A small decoder-only transformer language model in numpy, with explicit backward passes.

``tokens -> embedding (+ learned positions) -> n_layers x [x + Attn(Norm(x)); x + MLP(Norm(x))]
-> Norm -> head -> softmax cross-entropy``; multi-head causal self-attention, a GELU MLP,
RMSNorm (or LayerNorm).  Every GEMM goes through :func:`fp8sim.training.linear.matmul`.

Which parts run in FP8 is decided by :class:`Precision` from the recipe (DeepSeek-V3's
split by default): the Linear layers of attention (``qkv``, ``attn_out``) and of the MLP
(``mlp_up``, ``mlp_down``) use the recipe under test; the embedding, the output head
(``head``), the attention score and value GEMMs (``attention``) use the BF16 baseline;
normalization, softmax, GELU and the loss are computed in FP32 (FP64 for the ``"fp64"``
recipe), with exp, tanh and log from :mod:`fp8sim.training._detmath` (float64 evaluation with
IEEE basic operations, rounded once: the same bits on every machine, unlike numpy's SIMD
float32 ``exp``/``tanh``).  For BF16 and FP8 recipes the activations between layers are BF16 values (the
embedding output, every norm, GELU and residual output are rounded to BF16, as a BF16
training framework stores them; GEMM outputs are BF16 already).  Backward passes treat
those roundings as the identity (straight-through), as autograd does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..rounding import cast
from ._detmath import det_exp, det_log, det_tanh
from .linear import Linear, Param, Record, matmul, wide_recipe

__all__ = [
    "ModelConfig",
    "Precision",
    "precision_for",
    "Context",
    "TransformerLM",
    "Embedding",
    "RMSNorm",
    "LayerNorm",
    "Attention",
    "MLP",
    "Block",
    "cross_entropy",
    "FP8_PARTS",
    "PARTS",
]

PARTS = ("qkv", "attn_out", "mlp_up", "mlp_down", "attention", "head")
FP8_PARTS = ("qkv", "attn_out", "mlp_up", "mlp_down")


# ------------------------------------------------------------------ precision policy
@dataclass(frozen=True)
class Precision:
    """Which recipe each part of the model runs with, and the number formats around the GEMMs.

    ``recipe``: the recipe under test, used by the parts in ``fp8_parts`` when it is an FP8
    recipe; ``baseline``: the wide recipe of every other GEMM; ``activation_format``: ``"bf16"``
    or None (activations kept in ``dtype``); ``moment_format``: AdamW moments (``"bf16"`` as
    DeepSeek-V3, or None: ``dtype``); ``dtype``: master weights, gradients and the FP32/FP64
    non-GEMM arithmetic."""

    recipe: Any
    baseline: Any
    fp8_parts: tuple = FP8_PARTS
    activation_format: str | None = "bf16"
    moment_format: str | None = "bf16"
    dtype: Any = np.float32

    def recipe_for(self, part: str):
        if part not in PARTS:
            raise ValueError(f"unknown model part {part!r}; parts: {PARTS}")
        if self.recipe.is_fp8 and part in self.fp8_parts:
            return self.recipe
        return self.baseline


def precision_for(recipe, fp8_parts=FP8_PARTS) -> Precision:
    """The DeepSeek-V3-style split for ``recipe`` (a name or :class:`fp8sim.Recipe`): FP8 recipes
    run ``fp8_parts`` in FP8 and the rest in BF16 with BF16 activations and moments; ``"bf16"``
    the same without FP8; ``"fp32"`` everything in FP32; ``"fp64"`` everything in FP64 (for
    gradient checks)."""
    from ..gemms.presets import recipe as _get

    r = _get(recipe)
    bad = [p for p in fp8_parts if p not in PARTS]
    if bad:
        raise ValueError(f"unknown model parts {bad}; parts: {PARTS}")
    if r.is_fp8:
        if r.output_format == "fp64":
            raise ValueError(f"recipe {r.name!r}: FP8 recipes with fp64 output are not supported for training")
        return Precision(r, wide_recipe("bf16"), tuple(fp8_parts))
    if r.x_format == "fp64" or r.output_format == "fp64":
        return Precision(r, r, (), None, None, np.float64)
    if r.x_format == "fp32" and r.output_format == "fp32":
        return Precision(r, r, (), None, None, np.float32)
    return Precision(r, r, (), "bf16", "bf16", np.float32)


class Context:
    """What one forward/backward pass needs besides the data: the precision policy, the GEMM
    fidelity, the per-tensor statistics of this step (:attr:`records`) and fault injection
    (:meth:`perturb`: a function applied to a layer's input in the forward pass)."""

    def __init__(self, precision: Precision, fidelity: str = "exact"):
        self.precision = precision
        self.fidelity = fidelity
        self.dtype = precision.dtype
        self.records: dict[str, Record] = {}
        self.perturbations: dict = {}
        self.grad_scale = 1.0
        self.step = 0  # the training step (stochastic rounding draws from (sr_seed, step, tensor name))
        self.sr_seed = 0  # the run's seed for stochastic rounding

    def recipe_for(self, part: str):
        return self.precision.recipe_for(part)

    def record(self, name: str, rec: Record) -> None:
        """Keep this step's statistics ``rec`` of the tensor ``name``."""
        self.records[name] = rec

    def perturb(self, name: str, x: np.ndarray) -> np.ndarray:
        f = self.perturbations.get(name)
        return x if f is None else f(np.array(x, copy=True))

    def act(self, x: np.ndarray) -> np.ndarray:
        """Round to the activation storage format (BF16) and the compute dtype."""
        x = np.asarray(x, dtype=self.dtype)
        if self.precision.activation_format == "bf16":
            return cast(x, "bf16")
        return x

    def reset(self) -> None:
        self.records = {}


# ------------------------------------------------------------------ layers
@dataclass
class Embedding:
    tok: Param
    pos: Param
    _cache: Any = field(default=None, repr=False)

    @classmethod
    def create(cls, vocab, d, context, rng, std, dtype):
        return cls(
            Param("embed.tok", (rng.standard_normal((vocab, d)) * std).astype(dtype), decay=False),
            Param("embed.pos", (rng.standard_normal((context, d)) * std).astype(dtype), decay=False),
        )

    def params(self):
        return [self.tok, self.pos]

    def forward(self, tokens, ctx):
        S = tokens.shape[1]
        if S > self.pos.value.shape[0]:
            raise ValueError(f"sequence length {S} exceeds the context {self.pos.value.shape[0]}")
        self._cache = tokens
        return ctx.act(self.tok.value[tokens] + self.pos.value[:S])

    def backward(self, dx, ctx):
        tokens = self._cache
        np.add.at(self.tok.grad, tokens.reshape(-1), dx.reshape(-1, dx.shape[-1]).astype(self.tok.grad.dtype))
        self.pos.grad[: tokens.shape[1]] += dx.sum(axis=0).astype(self.pos.grad.dtype)
        return None


@dataclass
class RMSNorm:
    weight: Param
    eps: float = 1e-6
    _cache: Any = field(default=None, repr=False)

    @classmethod
    def create(cls, name, d, dtype):
        return cls(Param(name + ".weight", np.ones(d, dtype=dtype), decay=False))

    def params(self):
        return [self.weight]

    def forward(self, x, ctx):
        x = np.asarray(x, ctx.dtype)
        r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps)
        self._cache = (x, r)
        return ctx.act(x * r * self.weight.value)

    def backward(self, dy, ctx):
        x, r = self._cache
        dy = np.asarray(dy, ctx.dtype)
        xhat = x * r
        self.weight.grad += (dy * xhat).reshape(-1, x.shape[-1]).sum(axis=0)
        dxh = dy * self.weight.value
        return r * (dxh - xhat * np.mean(dxh * xhat, axis=-1, keepdims=True))


@dataclass
class LayerNorm:
    weight: Param
    bias: Param
    eps: float = 1e-5
    _cache: Any = field(default=None, repr=False)

    @classmethod
    def create(cls, name, d, dtype):
        return cls(
            Param(name + ".weight", np.ones(d, dtype=dtype), decay=False),
            Param(name + ".bias", np.zeros(d, dtype=dtype), decay=False),
        )

    def params(self):
        return [self.weight, self.bias]

    def forward(self, x, ctx):
        x = np.asarray(x, ctx.dtype)
        mu = np.mean(x, axis=-1, keepdims=True)
        xc = x - mu
        r = 1.0 / np.sqrt(np.mean(xc * xc, axis=-1, keepdims=True) + self.eps)
        xhat = xc * r
        self._cache = (xhat, r)
        return ctx.act(xhat * self.weight.value + self.bias.value)

    def backward(self, dy, ctx):
        xhat, r = self._cache
        dy = np.asarray(dy, ctx.dtype)
        d = xhat.shape[-1]
        self.weight.grad += (dy * xhat).reshape(-1, d).sum(axis=0)
        self.bias.grad += dy.reshape(-1, d).sum(axis=0)
        dxh = dy * self.weight.value
        return r * (dxh - np.mean(dxh, axis=-1, keepdims=True) - xhat * np.mean(dxh * xhat, axis=-1, keepdims=True))


def _softmax(s):
    m = np.max(s, axis=-1, keepdims=True)
    e = det_exp(s - m)
    return e / np.sum(e, axis=-1, keepdims=True)


@dataclass
class Attention:
    """Multi-head causal self-attention: ``qkv`` Linear, softmax(QK^T / sqrt(hd)) V, ``attn_out`` Linear."""

    name: str
    n_heads: int
    qkv: Linear
    out: Linear
    _cache: Any = field(default=None, repr=False)

    @classmethod
    def create(cls, name, d, n_heads, rng, std, out_std, dtype):
        if d % n_heads:
            raise ValueError(f"d_model {d} is not a multiple of n_heads {n_heads}")
        return cls(
            name,
            n_heads,
            Linear.create(name + ".qkv", "qkv", d, 3 * d, rng, std, dtype),
            Linear.create(name + ".out", "attn_out", d, d, rng, out_std, dtype),
        )

    def params(self):
        return self.qkv.params() + self.out.params()

    def forward(self, x, ctx):
        B, S, d = x.shape
        H = self.n_heads
        hd = d // H
        r = ctx.recipe_for("attention")
        qkv = self.qkv.forward(x.reshape(B * S, d), ctx).reshape(B, S, 3, H, hd)
        q, k, v = (np.ascontiguousarray(qkv[:, :, i].transpose(0, 2, 1, 3)) for i in range(3))  # (B, H, S, hd)
        scale = 1.0 / np.sqrt(hd)
        s = matmul(q, np.swapaxes(k, -1, -2), r, "fprop", fidelity=ctx.fidelity).astype(ctx.dtype) * scale
        mask = np.triu(np.ones((S, S), dtype=bool), 1)
        s = np.where(mask, -np.inf, s)
        p = _softmax(s).astype(ctx.dtype)
        o = matmul(ctx.act(p), v, r, "fprop", fidelity=ctx.fidelity).astype(ctx.dtype)
        o2 = ctx.act(o.transpose(0, 2, 1, 3).reshape(B * S, d))
        self._cache = (q, k, v, p, scale, (B, S, d))
        return self.out.forward(o2, ctx).reshape(B, S, d)

    def backward(self, dy, ctx):
        q, k, v, p, scale, (B, S, d) = self._cache
        H = self.n_heads
        hd = d // H
        r = ctx.recipe_for("attention")
        do = self.out.backward(dy.reshape(B * S, d), ctx).reshape(B, S, H, hd).transpose(0, 2, 1, 3)
        do = np.ascontiguousarray(do)
        dp = matmul(do, np.swapaxes(v, -1, -2), r, "dgrad", fidelity=ctx.fidelity).astype(ctx.dtype)
        dv = matmul(np.swapaxes(ctx.act(p), -1, -2), do, r, "dgrad", fidelity=ctx.fidelity).astype(ctx.dtype)
        ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True)) * scale
        ds = ctx.act(ds)
        dq = matmul(ds, k, r, "dgrad", fidelity=ctx.fidelity).astype(ctx.dtype)
        dk = matmul(np.swapaxes(ds, -1, -2), q, r, "dgrad", fidelity=ctx.fidelity).astype(ctx.dtype)
        dqkv = np.stack([dq, dk, dv], axis=2)  # (B, H, 3, S, hd)
        dqkv = dqkv.transpose(0, 3, 2, 1, 4).reshape(B * S, 3 * d)
        self._cache = None
        return self.qkv.backward(np.ascontiguousarray(dqkv), ctx).reshape(B, S, d)


_GELU_C = np.sqrt(2.0 / np.pi)


@dataclass
class MLP:
    """``mlp_down(GELU(mlp_up(x)))`` (tanh GELU)."""

    up: Linear
    down: Linear
    _cache: Any = field(default=None, repr=False)

    @classmethod
    def create(cls, name, d, d_ff, rng, std, out_std, dtype):
        return cls(
            Linear.create(name + ".up", "mlp_up", d, d_ff, rng, std, dtype),
            Linear.create(name + ".down", "mlp_down", d_ff, d, rng, out_std, dtype),
        )

    def params(self):
        return self.up.params() + self.down.params()

    def forward(self, x, ctx):
        B, S, d = x.shape
        h = self.up.forward(x.reshape(B * S, d), ctx).astype(ctx.dtype)
        t = det_tanh(_GELU_C * (h + 0.044715 * h**3))
        g = ctx.act(0.5 * h * (1.0 + t))
        self._cache = (h, t, (B, S, d))
        return self.down.forward(g, ctx).reshape(B, S, d)

    def backward(self, dy, ctx):
        h, t, (B, S, d) = self._cache
        dg = self.down.backward(dy.reshape(B * S, d), ctx)
        dh = dg * (0.5 * (1.0 + t) + 0.5 * h * (1.0 - t * t) * _GELU_C * (1.0 + 3 * 0.044715 * h * h))
        self._cache = None
        return self.up.backward(ctx.act(dh), ctx).reshape(B, S, d)


@dataclass
class Block:
    norm1: Any
    attn: Attention
    norm2: Any
    mlp: MLP

    def params(self):
        return self.norm1.params() + self.attn.params() + self.norm2.params() + self.mlp.params()

    def forward(self, x, ctx):
        h = ctx.act(x + self.attn.forward(self.norm1.forward(x, ctx), ctx))
        return ctx.act(h + self.mlp.forward(self.norm2.forward(h, ctx), ctx))

    def backward(self, dy, ctx):
        dh = dy + self.norm2.backward(self.mlp.backward(dy, ctx), ctx)
        return dh + self.norm1.backward(self.attn.backward(dh, ctx), ctx)


def cross_entropy(logits: np.ndarray, targets: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean token cross-entropy of ``logits (T, V)`` and its gradient (same dtype as ``logits``)."""
    z = logits - np.max(logits, axis=-1, keepdims=True)
    e = det_exp(z)
    ssum = np.sum(e, axis=-1, keepdims=True)
    T = logits.shape[0]
    rows = np.arange(T)
    loss = float(np.mean(det_log(ssum[:, 0]) - z[rows, targets]))
    g = e / ssum
    g[rows, targets] -= 1.0
    return loss, g / T


# ------------------------------------------------------------------ the model
@dataclass(frozen=True)
class ModelConfig:
    """Shape of the transformer: vocabulary (set from the corpus by :func:`train_one`), width,
    layers, attention heads, MLP width, context length, ``norm`` (``"rmsnorm"`` or
    ``"layernorm"``) and the standard deviation of the initial weights."""

    vocab: int = 160
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 512
    context: int = 64
    norm: str = "rmsnorm"
    init_std: float = 0.02

    def __post_init__(self):
        if self.norm not in ("rmsnorm", "layernorm"):
            raise ValueError(f"norm must be 'rmsnorm' or 'layernorm', got {self.norm!r}")
        for k in ("vocab", "d_model", "n_layers", "n_heads", "d_ff", "context"):
            if int(getattr(self, k)) < 1:
                raise ValueError(f"ModelConfig.{k} must be positive, got {getattr(self, k)!r}")


class TransformerLM:
    """Decoder-only LM; parameters are :class:`~fp8sim.training.linear.Param` objects (master
    values + gradients) initialised from ``seed`` (float32, then cast to ``dtype``: every dtype
    starts from the same values)."""

    def __init__(self, cfg: ModelConfig, seed: int = 0, dtype=np.float32):
        self.cfg = cfg
        rng = np.random.default_rng(seed)
        std, out_std = cfg.init_std, cfg.init_std / np.sqrt(2 * cfg.n_layers)
        f32 = np.float32
        Norm = RMSNorm if cfg.norm == "rmsnorm" else LayerNorm
        self.embed = Embedding.create(cfg.vocab, cfg.d_model, cfg.context, rng, std, f32)
        self.blocks = [
            Block(
                Norm.create(f"layer{i}.norm1", cfg.d_model, f32),
                Attention.create(f"layer{i}.attn", cfg.d_model, cfg.n_heads, rng, std, out_std, f32),
                Norm.create(f"layer{i}.norm2", cfg.d_model, f32),
                MLP.create(f"layer{i}.mlp", cfg.d_model, cfg.d_ff, rng, std, out_std, f32),
            )
            for i in range(cfg.n_layers)
        ]
        self.norm_f = Norm.create("norm_f", cfg.d_model, f32)
        self.head = Linear.create("head", "head", cfg.d_model, cfg.vocab, rng, std, f32)
        if dtype != np.float32:
            for p in self.params():
                p.value = p.value.astype(dtype)
                p.grad = np.zeros_like(p.value)

    def params(self) -> list[Param]:
        ps = self.embed.params()
        for b in self.blocks:
            ps += b.params()
        return ps + self.norm_f.params() + self.head.params()

    def zero_grad(self):
        for p in self.params():
            p.grad[...] = 0

    def forward(self, tokens, ctx) -> np.ndarray:
        x = self.embed.forward(tokens, ctx)
        for b in self.blocks:
            x = b.forward(x, ctx)
        B, S, d = x.shape
        h = self.norm_f.forward(x, ctx).reshape(B * S, d)
        return self.head.forward(h, ctx).astype(ctx.dtype)

    def backward(self, dlogits, ctx) -> None:
        B, S = self._shape
        dh = self.head.backward(dlogits, ctx).reshape(B, S, -1)
        dx = self.norm_f.backward(dh, ctx)
        for b in reversed(self.blocks):
            dx = b.backward(dx, ctx)
        self.embed.backward(dx, ctx)

    def loss(self, tokens, targets, ctx) -> float:
        """Forward only (evaluation)."""
        logits = self.forward(tokens, ctx)
        return cross_entropy(logits, np.asarray(targets).reshape(-1))[0]

    def loss_and_grads(self, tokens, targets, ctx) -> float:
        """Forward and backward: returns the loss, gradients in ``p.grad`` (zeroed first)."""
        self.zero_grad()
        tokens = np.asarray(tokens)
        self._shape = tokens.shape
        logits = self.forward(tokens, ctx)
        with np.errstate(all="ignore"):
            loss, dlogits = cross_entropy(logits, np.asarray(targets).reshape(-1))
        if ctx.grad_scale != 1.0:
            dlogits = dlogits * ctx.grad_scale
        self.backward(dlogits.astype(ctx.dtype), ctx)
        return loss

    def state(self) -> dict:
        return {p.name: p.value.copy() for p in self.params()}

    def load_state(self, state: dict) -> None:
        for p in self.params():
            p.value[...] = state[p.name]
