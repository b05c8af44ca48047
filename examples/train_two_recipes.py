"""Train the small language model with BF16 and the DeepSeek-V3 FP8 recipe and compare the losses.

    python examples/train_two_recipes.py [--steps 100] [--out train_example]

Same initialization and data order for both; every Linear GEMM of the FP8 run goes through
fp8sim.gemm with the recipe (bit-exact accumulator, the default fidelity: the same numbers on
every machine).  Prints a progress line every tenth of the run.
"""

import argparse
import time

from fp8sim.training import train

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=100)
ap.add_argument("--out", default="train_example")
args = ap.parse_args()

recipes = ["bf16", "deepseek-v3"]
every = max(1, args.steps // 10)
t0 = time.perf_counter()
print(f"training {', '.join(recipes)} for {args.steps} steps each (first run: numba compiles its kernels)", flush=True)


def report(recipe, step, loss):
    if step % every == 0 or step == args.steps - 1:
        print(
            f"  {recipe:>12} step {step + 1:>4}/{args.steps}  loss {loss:.4f}  ({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )


summary = train(recipes, steps=args.steps, seed=0, out_dir=args.out, progress=False, on_step=report)
for name, r in summary["recipes"].items():
    rel = r.get("rel_loss_error_vs_bf16")
    rel_txt = "reference" if rel is None else f"relative loss error vs bf16 {rel['mean_abs'] * 100:.3f} %"
    print(f"{name:>12}: final loss {r['final_loss']:.4f}, {rel_txt}")
print(
    f"DeepSeek-V3 reports < {summary['deepseek_v3_rel_loss_error_claim'] * 100:.2f} % at 671B scale; "
    f"figures and CSV in {args.out}/"
)
