"""A small GPT in PyTorch trained with the FP8 GEMMs of a recipe (:func:`train`): the torch backend of
``fp8sim train``.

The model (:class:`GPT`) has the shape of :mod:`fp8sim.training`'s numpy transformer: token and
learned position embeddings, ``n_layers`` pre-norm blocks ``x + Attn(RMSNorm(x)); x + MLP(RMSNorm(x))``
(causal multi-head attention through ``torch.nn.functional.scaled_dot_product_attention``, a tanh
GELU MLP), a final RMSNorm and an output head.  Every recipe's run starts from the same
initialization (``torch.manual_seed(seed)``) and sees the same batches (:class:`fp8sim.training.Batches`
on the synthetic corpus); the model is converted with :func:`fp8sim.torch.plan` of the recipe
(``plan("deepseek-v3")`` for ``"deepseek-v3"``: DeepSeek-V3's whole scheme), so the Linear layers of
attention (``qkv``, ``o_proj``) and of the MLP run the recipe and the head stays in float32.
AdamW (torch's, FP32 moments), warm-up and cosine decay as :func:`fp8sim.training.lr_schedule`.

The emulated GEMMs give the same bits on every machine; torch's own kernels (attention, norms,
the optimizer) give the same bits for the same seed on the same machine and thread count.
"""

from __future__ import annotations

import csv
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..gemms.presets import recipe as get_recipe
from ..training.data import CORPORA, Batches, Vocabulary, text_corpus
from ..training.data import corpus as synthetic_corpus
from ..training.optim import lr_schedule
from ..training.train import relative_loss_error
from .modules import convert
from .plans import plan

__all__ = ["GPTConfig", "GPT", "train", "fit", "optimizer", "load_corpus", "TORCH_TRAIN_FILES"]

#: the files :func:`train` writes into ``out_dir``
TORCH_TRAIN_FILES = ("summary.json", "losses.csv")


@dataclass(frozen=True)
class GPTConfig:
    """Shape of :class:`GPT` (defaults: those of ``fp8sim train``'s numpy model) and of its training."""

    vocab: int = 181
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 512
    context: int = 64
    init_std: float = 0.02
    batch: int = 8
    lr: float = 2e-3
    warmup: int = 20
    weight_decay: float = 0.1


class _Block(torch.nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.n_heads = c.n_heads
        self.norm1 = torch.nn.RMSNorm(c.d_model, eps=1e-6)
        self.qkv = torch.nn.Linear(c.d_model, 3 * c.d_model, bias=False)
        self.o_proj = torch.nn.Linear(c.d_model, c.d_model, bias=False)
        self.norm2 = torch.nn.RMSNorm(c.d_model, eps=1e-6)
        self.up_proj = torch.nn.Linear(c.d_model, c.d_ff, bias=False)
        self.down_proj = torch.nn.Linear(c.d_ff, c.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, S, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, S, 3, self.n_heads, d // self.n_heads).unbind(2)
        o = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.o_proj(o.transpose(1, 2).reshape(B, S, d))
        h = torch.nn.functional.gelu(self.up_proj(self.norm2(x)), approximate="tanh")
        return x + self.down_proj(h)


class GPT(torch.nn.Module):
    """The decoder-only LM of the module docstring (``forward(tokens (B, S)) -> logits (B, S, vocab)``)."""

    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        if c.d_model % c.n_heads:
            raise ValueError(f"GPTConfig: d_model {c.d_model} is not a multiple of n_heads {c.n_heads}")
        self.config = c
        self.tok = torch.nn.Embedding(c.vocab, c.d_model)
        self.pos = torch.nn.Embedding(c.context, c.d_model)
        self.blocks = torch.nn.ModuleList(_Block(c) for _ in range(c.n_layers))
        self.norm = torch.nn.RMSNorm(c.d_model, eps=1e-6)
        self.lm_head = torch.nn.Linear(c.d_model, c.vocab, bias=False)
        out_std = c.init_std / math.sqrt(2 * c.n_layers)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(
                    p, std=out_std if name.endswith(("o_proj.weight", "down_proj.weight")) else c.init_std
                )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        S = tokens.shape[1]
        x = self.tok(tokens) + self.pos(torch.arange(S, device=tokens.device))
        for blk in self.blocks:
            x = blk(x)
        return self.lm_head(self.norm(x))


def _loss(model: torch.nn.Module, x: np.ndarray, y: np.ndarray, device) -> torch.Tensor:
    logits = model(torch.from_numpy(x).to(device))
    return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), torch.from_numpy(y).to(device).flatten())


def load_corpus(name: str) -> tuple[np.ndarray, Vocabulary, str | None]:
    """``(ids, vocabulary, sha256 or None)`` of a corpus of :data:`fp8sim.training.data.CORPORA`."""
    if name == "synthetic":
        ids, vocab = synthetic_corpus()
        return ids, vocab, None
    if name == "pydoc":
        return text_corpus()
    raise ValueError(f"train: corpus must be one of {list(CORPORA)}, got {name!r}")


def optimizer(model: torch.nn.Module, c: GPTConfig) -> torch.optim.AdamW:
    """torch's AdamW (FP32 moments, betas 0.9/0.95) with weight decay on the 2-D weights other than
    the embeddings, as :class:`fp8sim.training.AdamW` decays them."""
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and not n.startswith(("tok", "pos"))]
    rest = [p for n, p in model.named_parameters() if not (p.dim() == 2 and not n.startswith(("tok", "pos")))]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": c.weight_decay}, {"params": rest, "weight_decay": 0.0}],
        lr=c.lr,
        betas=(0.9, 0.95),
    )


def fit(
    model: torch.nn.Module,
    data: Batches,
    c: GPTConfig,
    steps: int,
    device="cpu",
    *,
    on_step: Callable[[int, float], None] | None = None,
) -> tuple[list[float], float, float]:
    """Train ``model`` for ``steps`` steps on ``data`` (batch ``step`` is ``data.batch_at(step)``) with
    :func:`optimizer` and the schedule of :func:`fp8sim.training.lr_schedule`; returns the loss of
    every step, the seconds the steps took and the validation loss after them.  The one training
    loop of :func:`train` and of any comparison that swaps the Linear layers of a :class:`GPT`
    (the same loop, so the runs differ only in their GEMMs)."""
    opt = optimizer(model, c)
    losses: list[float] = []
    t0 = time.perf_counter()
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = float(np.float32(lr_schedule(step, steps, c.lr, c.warmup)))
        x, y = data.batch_at(step)
        loss = _loss(model, x, y, device)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if on_step is not None:
            on_step(step, losses[-1])
    wall = time.perf_counter() - t0
    with torch.no_grad():
        val = float(np.mean([_loss(model, x, y, device).item() for x, y in data.validation()]))
    return losses, wall, val


def train(
    recipes=("bf16", "deepseek-v3"),
    steps: int = 50,
    seed: int = 0,
    out_dir=None,
    *,
    device: str = "cpu",
    fidelity: str = "exact",
    config: GPTConfig | None = None,
    corpus: str = "synthetic",
    on_step: Callable[[str, int, float], None] | None = None,
) -> dict:
    """Train :class:`GPT` once per recipe (names; ``"bf16"``, the reference, is run first when listed)
    for ``steps`` steps and return the summary: per recipe the final and validation loss, the
    relative loss error against bf16 over the last 10 % of the steps
    (:func:`fp8sim.training.train.relative_loss_error`), seconds per step.  With ``out_dir`` it
    writes ``summary.json`` and ``losses.csv`` (one column per recipe).  ``fidelity`` is the GEMMs'
    (as :func:`fp8sim.gemm`); ``corpus`` is ``"synthetic"`` (:func:`fp8sim.training.data.corpus`) or
    ``"pydoc"`` (CPython's documentation text, byte tokens: :func:`fp8sim.training.data.text_corpus`);
    ``on_step(recipe, step, loss)`` is called after every step."""
    if isinstance(recipes, str):
        recipes = [s.strip() for s in recipes.split(",") if s.strip()]
    names = [get_recipe(r).name for r in recipes]
    if not names or len(set(names)) != len(names):
        raise ValueError(f"train: recipes must be distinct and not empty, got {names}")
    if "bf16" in names:
        names.remove("bf16")
        names.insert(0, "bf16")
    ids, vocab, corpus_sha = load_corpus(corpus)
    c = config or GPTConfig(vocab=vocab.size)
    if c.vocab < vocab.size:
        raise ValueError(f"train: config.vocab {c.vocab} is smaller than the {corpus!r} corpus' {vocab.size} ids")
    data = Batches(ids, c.batch, c.context, seed)
    losses: dict[str, list[float]] = {}
    summary: dict = {
        "backend": "torch",
        "device": device,
        "steps": steps,
        "seed": seed,
        "fidelity": fidelity,
        "corpus": corpus,
        "corpus_sha256": corpus_sha,
        "config": asdict(c),
    }
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        torch.manual_seed(seed)
        model = convert(GPT(c).to(device), plan(name, fidelity=fidelity))
        cb = None if on_step is None else (lambda step, loss, name=name: on_step(name, step, loss))
        losses[name], wall, val = fit(model, data, c, steps, device, on_step=cb)
        results[name] = {
            "final_loss": losses[name][-1],
            "val_loss": val,
            "rel_loss_error_vs_bf16": None,
            "s_per_step": round(wall / max(steps, 1), 4),
        }
        if name != "bf16" and "bf16" in losses:
            results[name]["rel_loss_error_vs_bf16"] = relative_loss_error(
                np.asarray(losses[name]), np.asarray(losses["bf16"])
            )
    summary["recipes"] = results
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        with open(out / "losses.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["step", *names])
            for s in range(steps):
                w.writerow([s, *(repr(losses[n][s]) for n in names)])
    return summary
