"""Train the small language model with BF16 and the DeepSeek-V3 FP8 recipe and compare the losses.

    python examples/train_two_recipes.py [--steps 100] [--out train_example]

Same initialization and data order for both; every Linear GEMM of the FP8 run goes through
fp8sim.gemm with the recipe (fast mode: exact quantization, fp32 accumulation per block).
"""

import argparse

from fp8sim.training import train

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=100)
ap.add_argument("--out", default="train_example")
args = ap.parse_args()

summary = train(["bf16", "deepseek-v3"], steps=args.steps, seed=0, out_dir=args.out, progress=False)
for name, r in summary["recipes"].items():
    rel = r.get("rel_loss_error_vs_bf16")
    rel_txt = "reference" if rel is None else f"relative loss error vs bf16 {rel['mean_abs'] * 100:.3f} %"
    print(f"{name:>12}: final loss {r['final_loss']:.4f}, {rel_txt}")
print(
    f"DeepSeek-V3 reports < {summary['deepseek_v3_rel_loss_error_claim'] * 100:.2f} % at 671B scale; "
    f"figures and CSV in {args.out}/"
)
