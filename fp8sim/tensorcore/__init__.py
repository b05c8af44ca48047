"""Bit-exact models of tensor-core FP8 matrix-multiply-accumulate.

An accumulator model is a frozen dataclass of parameters
(:class:`AccumulatorModel`).  The ``"fused"`` kind describes the multi-term
fused adders of NVIDIA tensor cores, in the style of Fasi, Higham, Mikaitis
& Pranesh (2021) and MMA-Sim (Xie et al. 2025):

1. the K = 32 products of one instruction are split into ``K / block``
   consecutive blocks, processed in order;
2. each block's products are exact; together with the running accumulator
   (C for the first block) they are aligned to the largest exponent among
   the non-zero addends and every addend is cut to ``frac_bits`` fraction
   bits below that exponent (``align_rounding``: ``"rz"`` truncates the
   magnitude, ``"rd"`` truncates the two's-complement value);
3. the aligned addends are summed exactly, and the sum is normalised and
   rounded to ``out_frac_bits`` fraction bits (``out_rounding``) in the
   output format (fp32, or fp16 for the f16-accumulator instructions);
4. with ``c_mode="separate"`` the products are summed without C and C is
   added afterwards by an IEEE fp32 addition.

Other kinds: ``"exact"`` (exact sum of the 32 products and C, one RNE
rounding to fp32 per instruction) and ``"fp32"`` (sequential fp32 RNE
additions, C first, then k = 0..31).

The package:

* :mod:`~fp8sim.tensorcore.model` -- :class:`AccumulatorModel`, and ``ModelParams``, the model as
  the kernels see it;
* :mod:`~fp8sim.tensorcore.registry` -- the presets per (arch, instruction), :func:`get_model`,
  :func:`register_model` (and how to add an instruction);
* :mod:`~fp8sim.tensorcore.codes` -- :func:`code_table`, the per-code tables of an 8-bit format;
* :mod:`~fp8sim.tensorcore._bitexact` -- the bit-level reference kernels;
* :mod:`~fp8sim.tensorcore.api` -- :func:`mma` and :func:`matmul`;
* :mod:`~fp8sim.tensorcore.archs` -- the instruction table beyond Hopper (sm89, sm100, sm120,
  cdna3: formats, shapes, scales, evidence), :func:`models_listing`;
* :mod:`~fp8sim.tensorcore.scaled_mma` -- their GEMMs (block scales, FP4 groups, CDNA3) on the numba
  kernels of :mod:`~fp8sim.tensorcore._mma_kernels`; :mod:`~fp8sim.gemms.block_scaled` -- the
  recipes whose block scales are folded into the MMA (MXFP8, MXFP4, NVFP4 on Blackwell);
* :mod:`~fp8sim.tensorcore.captures` -- :func:`verify_capture` and the hardware captures;
* :mod:`~fp8sim.tensorcore.fast` -- the fast numba GEMM kernel of the wgmma-type models
  (used by :func:`fp8sim.gemm`), and :mod:`~fp8sim.tensorcore.cuda` its CUDA twin;
* :mod:`~fp8sim.tensorcore.kernels` -- the kernel registry: one ordered list of every kernel above
  with what it computes and why not (a reason string), and the one
  :func:`~fp8sim.tensorcore.kernels.select` that :func:`mma`, :func:`matmul`,
  ``scaled_matmul`` and the device path decide through (``fp8sim info --kernels RECIPE``).

The presets for ``arch="sm90"`` were fitted to and validated against an
NVIDIA H200 (docs/tensorcore.md; the evidence is the captured hardware
vectors in tests/data/, checked bit for bit by tests/test_tensorcore.py).
"""

from ..formats import UnknownNameError as UnknownNameError  # raised by every lookup here
from .api import matmul, mma
from .archs import models_listing
from .captures import (
    CaptureError,
    NotTensorCoreCaptureError,
    bits_equal,
    bits_identical,
    capture_kind,
    load_capture,
    verify_capture,
)
from .codes import CodeTable, code_table
from .model import K_INSTR, AccumulatorModel, ModelParams, model_params
from .registry import PRESETS, get_model, model_names, register_model

__all__ = [
    "AccumulatorModel",
    "ModelParams",
    "model_params",
    "PRESETS",
    "K_INSTR",
    "get_model",
    "model_names",
    "register_model",
    "mma",
    "matmul",
    "verify_capture",
    "load_capture",
    "capture_kind",
    "CaptureError",
    "NotTensorCoreCaptureError",
    "bits_equal",
    "bits_identical",
    "CodeTable",
    "code_table",
    "models_listing",
]
