"""FP8 training emulation: FP8 Linear layers (Fprop, Dgrad, Wgrad through a recipe), a small
decoder-only transformer LM with explicit backward passes, AdamW with BF16 moments, a
deterministic synthetic corpus, stability instruments, and :func:`train`, which compares
recipes against BF16.  See docs/training.md.

``fp8sim.training.matmul(a, b, recipe, role)`` is the one GEMM entry point of the package.
"""

from .data import Batches, make_corpus  # noqa: F401
from .instruments import DriftMonitor, DynamicClipper, ElasticRestart, Event  # noqa: F401
from .linear import Linear, gemm_backend, matmul, quantize_operand  # noqa: F401
from .model import Context, ModelConfig, Precision, TransformerLM, precision_for  # noqa: F401
from .optim import AdamW, lr_schedule  # noqa: F401
from .train import DEFAULT_RECIPES, Fault, RunResult, TrainConfig, train, train_one  # noqa: F401
