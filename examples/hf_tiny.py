"""A Hugging Face transformers model under FP8 emulation: a tiny Llama built from a local config (no
download), converted with DeepSeek-V3's precision plan, one forward/backward pass on CPU.

    python examples/hf_tiny.py [--plan deepseek-v3] [--tokens 32]

Needs torch and transformers: ``pip install "fp8sim[hf]"`` (on Linux without an NVIDIA GPU, install torch's
CPU build first: ``pip install torch --index-url https://download.pytorch.org/whl/cpu``). Without them it
says what is missing and exits with status 0, skipped.  The plan keeps ``lm_head`` in high precision, runs the q/k/v,
o_proj and MLP projections with the deepseek-v3 recipe, keeps ``o_proj``'s input for Wgrad as E5M6
with power-of-two scales and every other input as its 1x128 E4M3 quantization, and makes the
converted layers' weights FP32 masters.
"""

from __future__ import annotations

import argparse
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", default="deepseek-v3", help="a plan (fp8sim.torch.plan_names()) or recipe name")
    ap.add_argument("--tokens", type=int, default=32, help="tokens per sequence (default 32)")
    args = ap.parse_args()

    try:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM
    except ModuleNotFoundError as e:
        if e.name not in ("torch", "transformers"):
            raise
        print(
            f"hf_tiny.py: skipped: it needs {e.name}, which is not installed. Install it with "
            '`pip install "fp8sim[hf]"` (or `pip install transformers torch`).',
            file=sys.stderr,
        )
        return

    import fp8sim.torch as ft

    cfg = LlamaConfig(
        vocab_size=128,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    ref = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.load_state_dict(ref.state_dict())
    ft.convert(model, ft.plan(args.plan))
    names = [n for n, m in model.named_modules() if isinstance(m, ft.Linear)]
    print(f"converted {len(names)} Linear layers with plan {args.plan!r}; kept: lm_head")
    print(f"  {names[3]}: {model.get_submodule(names[3]).options.cache}")

    ids = torch.randint(0, cfg.vocab_size, (2, args.tokens))
    for name, m in (("torch bf16", ref), (args.plan, model)):
        t0 = time.perf_counter()
        out = m(input_ids=ids, labels=ids)
        out.loss.backward()
        w = m.model.layers[0].self_attn.q_proj.weight
        print(
            f"{name:>12}: loss {out.loss.item():.6f}  q_proj.weight {w.dtype}, grad {w.grad.dtype} "
            f"|grad| {w.grad.float().norm().item():.5f}  ({time.perf_counter() - t0:.2f} s)"
        )


if __name__ == "__main__":
    main()
