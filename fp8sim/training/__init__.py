"""FP8 training emulation: FP8 Linear layers (Fprop, Dgrad, Wgrad through a recipe), a small
decoder-only transformer LM with explicit backward passes, AdamW with BF16 moments, a
deterministic synthetic corpus, stability instruments, and :func:`train`, which compares
recipes against BF16.  See docs/training.md.

``fp8sim.training.matmul(a, b, recipe, role)`` is the one GEMM entry point of the training
emulation; it runs :func:`fp8sim.gemm`.
"""

from .data import Batches, make_corpus
from .instruments import DriftMonitor, DynamicClipper, ElasticRestart, Event
from .linear import Linear, matmul, quantize_operand
from .model import Context, ModelConfig, Precision, TransformerLM, precision_for
from .optim import AdamW, lr_schedule
from .train import DEFAULT_RECIPES, Fault, RunResult, TrainConfig, train, train_one

__all__ = [
    "Batches",
    "make_corpus",
    "DriftMonitor",
    "DynamicClipper",
    "ElasticRestart",
    "Event",
    "Linear",
    "matmul",
    "quantize_operand",
    "Context",
    "ModelConfig",
    "Precision",
    "TransformerLM",
    "precision_for",
    "AdamW",
    "lr_schedule",
    "DEFAULT_RECIPES",
    "Fault",
    "RunResult",
    "TrainConfig",
    "train",
    "train_one",
]
