"""Run a small PyTorch model's Linear layers with FP8 GEMMs (fp8sim.torch), forward and backward, on CPU.

    python examples/torch_linear.py [--recipe deepseek-v3] [--tokens 64]

Converts a 2-block MLP model in place (the output head stays in high precision, as DeepSeek-V3 keeps
it), runs one forward/backward pass with the recipe and with plain torch, and checks one layer's
GEMM against fp8sim.gemm on the same tensors.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import fp8sim
import fp8sim.torch as ft


class Model(torch.nn.Module):
    def __init__(self, d: int = 128, vocab: int = 96) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(
                torch.nn.LayerNorm(d), torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d)
            )
            for _ in range(2)
        )
        self.lm_head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for blk in self.blocks:
            x = x + blk(x)
        return self.lm_head(x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="deepseek-v3", help="an fp8sim recipe (fp8sim.recipe_names())")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per batch (default 64)")
    args = ap.parse_args()

    torch.manual_seed(0)
    ref = Model()
    model = ft.convert(Model(), args.recipe)  # in place; lm_head is skipped by default
    model.load_state_dict(ref.state_dict())  # the same weights (state_dict keys are unchanged)
    n = sum(isinstance(m, ft.Linear) for m in model.modules())
    print(f"converted {n} Linear layers to recipe {args.recipe!r} (kept: lm_head)")

    tokens = torch.randint(0, 96, (2, args.tokens // 2))
    targets = torch.randint(0, 96, (2, args.tokens // 2))
    for name, m in (("torch fp32", ref), (args.recipe, model)):
        t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(m(tokens).flatten(0, 1), targets.flatten())
        loss.backward()
        g = m.blocks[0][1].weight.grad.norm().item()
        print(f"{name:>12}: loss {loss.item():.6f}  |grad W(blocks.0.1)| {g:.6f}  ({time.perf_counter() - t0:.2f} s)")

    lin = model.blocks[0][1]
    x = torch.randn(16, 128)
    with torch.no_grad():
        y = ft.linear(x, lin.weight, recipe=args.recipe)  # the layer's GEMM, without its bias
    ref_y = fp8sim.gemm(x.numpy(), lin.weight.detach().numpy(), args.recipe, layout="nk")
    same = np.array_equal(y.numpy().view(np.uint32), ref_y.view(np.uint32))
    print(f"layer output (16 tokens) bit-identical to fp8sim.gemm: {same}")


if __name__ == "__main__":
    main()
