"""``fp8sim train --backend torch``: the recipes' comparison on a PyTorch GPT (:func:`fp8sim.torch.gpt.train`).

The numpy trainer stays the default and needs no torch; this module imports torch only when it runs.
"""

from __future__ import annotations

import sys

from .common import UsageError, check_out_dir, emit_json, progress_enabled

__all__ = ["add_arguments", "run"]


def add_arguments(p) -> None:
    """The torch backend's options of ``fp8sim train``."""
    p.add_argument(
        "--backend",
        choices=("numpy", "torch"),
        default="numpy",
        help="numpy (default: fp8sim.training's model) or torch (a PyTorch GPT converted with fp8sim.torch.plan)",
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="torch backend: the device (default cpu)")
    p.add_argument(
        "--corpus",
        choices=("synthetic", "pydoc"),
        default="synthetic",
        help="torch backend: the synthetic language (default) or CPython's documentation text as bytes",
    )


def run(args, names: list[str]) -> int:
    """Train ``names`` with the torch backend as ``args`` say (steps, seed, out, fidelity, device,
    json, quiet, force)."""
    try:
        import torch
    except ImportError:
        raise UsageError('--backend torch needs PyTorch: pip install "fp8sim[torch]"') from None
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: torch finds no CUDA device")
    from ..torch.gpt import TORCH_TRAIN_FILES, train

    if args.steps < 1:
        raise UsageError(f"--steps must be positive, got {args.steps}")
    check_out_dir(args.out, force=args.force, writes=TORCH_TRAIN_FILES)

    # progress as the numpy backend shows it: a bar on stderr, on a terminal only and never with --quiet
    # (stdout keeps the results alone, also when it is a pipe)
    bar = None
    if progress_enabled(args):
        from tqdm.auto import tqdm

        bar = tqdm(total=args.steps * len(names), desc="train", unit="step", file=sys.stderr, dynamic_ncols=True)

    def progress(name: str, step: int, loss: float) -> None:
        if bar is not None:
            bar.update(1)
            bar.set_postfix_str(f"{name} step {step + 1}/{args.steps} loss {loss:.4f}", refresh=False)

    try:
        summary = train(
            names,
            args.steps,
            args.seed,
            args.out,
            device=args.device,
            fidelity=args.fidelity,
            corpus=getattr(args, "corpus", "synthetic"),
            on_step=progress,
        )
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        emit_json(summary)
        return 0
    if not args.quiet:
        print(f"torch backend on {args.device}: {args.steps} steps, seed {args.seed}, fidelity {args.fidelity}")
        print(f"{'recipe':<26}{'final loss':>11}{'val loss':>10}{'rel.err vs bf16':>17}{'s/step':>8}")
        for name, r in summary["recipes"].items():
            rel = r["rel_loss_error_vs_bf16"]
            rel_s = "-" if rel is None else f"{100 * rel['mean_abs']:.3f} %"
            print(f"{name:<26}{r['final_loss']:>11.4f}{r['val_loss']:>10.4f}{rel_s:>17}{r['s_per_step']:>8.3f}")
        print(f"wrote {args.out}/{', '.join(TORCH_TRAIN_FILES)}")
    return 0
