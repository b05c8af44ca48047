"""The accumulator-model presets: one registry of (arch, instruction) -> :class:`AccumulatorModel`.

Presets of ``arch="sm90"`` were fitted to and validated against an NVIDIA H200 (docs/tensorcore.md;
the evidence is the captured hardware vectors in tests/data/, checked bit for bit by
tests/test_tensorcore.py).  ``arch="any"`` holds the architecture-independent references
(``"exact"``, ``"fp32"``): :func:`get_model` falls back to them for every arch.

Adding an instruction (Ada ``sm89``, Blackwell ``sm100``, AMD CDNA3 ``gfx942``, ...):

1. if its datapath is one of the existing kinds (:data:`~fp8sim.tensorcore.model.KINDS`: ``"fused"``
   multi-term adders with their block size, alignment and output rounding, ``"exact"``, ``"fp32"``),
   it is data: ``register_model(arch, instruction, AccumulatorModel(...))`` with the fitted
   parameters (``gpu/characterize.py`` fits them from probes), ``validated=True`` once the captures
   of ``python -m gpu.capture`` on that hardware pass ``verify_capture``;
2. otherwise it needs one new kind: a name in ``KINDS``, its parameters (if any) in
   :class:`~fp8sim.tensorcore.model.AccumulatorModel` and ``ModelParams``, and one block kernel in
   :mod:`fp8sim.tensorcore._bitexact`, called from the one dispatch on ``P.kind`` in ``_instr``.
"""

from __future__ import annotations

from dataclasses import replace

from .._names import unknown_name_error
from .model import AccumulatorModel
from .wide import MODEL_WGMMA_BF16

__all__ = ["PRESETS", "ANY_ARCH", "register_model", "get_model", "model_names"]

# Evidence for the sm90 presets: docs/tensorcore.md and tests/data/*.npz
PRESETS: dict[tuple[str, str], AccumulatorModel] = {}

#: the arch of the architecture-independent presets
ANY_ARCH = "any"


def _key(value, what: str) -> str:
    example = "sm90" if what == "arch" else "wgmma"
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a name such as {example!r}, got {type(value).__name__}")
    if not value.strip():
        raise ValueError(f"{what} must be a non-empty name such as {example!r}")
    return value.strip().lower()


def register_model(arch: str, instruction: str, model: AccumulatorModel) -> None:
    """Register ``model`` as the preset of ``instruction`` on ``arch`` (names are case-insensitive).

    ``arch="any"`` makes it the preset of every arch that has none of its own.  A pair that already
    has a preset is refused (``ValueError``).
    """
    key = (_key(arch, "arch"), _key(instruction, "instruction"))
    if not isinstance(model, AccumulatorModel):
        raise TypeError(f"model must be an AccumulatorModel, got {type(model).__name__}")
    if key in PRESETS:
        raise ValueError(f"instruction {key[1]!r} on arch {key[0]!r} already has a preset ({PRESETS[key].name!r})")
    PRESETS[key] = model


register_model(
    "sm90",
    "wgmma",
    AccumulatorModel(
        name="sm90 wgmma f32 (FP8)",
        kind="fused",
        block=32,
        frac_bits=13,
        align_rounding="rz",
        product_exponent="nominal",
        subnormal_exponent="clamp",
        c_mode="fused",
        out_frac_bits=13,
        out_rounding="rz",
        output="f32",
        validated=True,
        description="wgmma.mma_async m64nNk32 .f32 with e4m3/e5m2 inputs on sm_90a (H100/H200/H800)",
    ),
)
register_model(
    "sm90",
    "wgmma.f16",
    AccumulatorModel(
        name="sm90 wgmma f16 (FP8)",
        kind="fused",
        block=32,
        frac_bits=13,
        align_rounding="rz",
        product_exponent="nominal",
        subnormal_exponent="clamp",
        c_mode="fused",
        out_frac_bits=10,
        out_rounding="rne",
        output="f16",
        nan_bits=0x7FFFE000,
        validated=True,
        description="wgmma.mma_async m64nNk32 .f16 with e4m3/e5m2 inputs on sm_90a (C/D fp16; "
        "C's exponent clamped at fp16 emin; results that round to 0 are +0; NaN = fp16 0x7fff)",
    ),
)
# mma.sync m16n8k32 FP8 on sm_90 is no tensor-core FP8 instruction: ptxas emits
# F2FP.F16.E4M3/E5M2.UNPACK_B (exact fp8 -> fp16), HMMA.16816.F32 on the low
# halves of each 4-byte fragment register (k % 4 in {0, 1}) with a zero
# accumulator, a second HMMA.16816.F32 on the high halves (k % 4 in {2, 3})
# accumulating onto the first, and an FADD of C.  See docs/tensorcore.md.
_HMMA_ORDER = tuple(k for k in range(32) if k % 4 < 2) + tuple(k for k in range(32) if k % 4 >= 2)
register_model(
    "sm90",
    "mma.sync",
    AccumulatorModel(
        name="sm90 mma.sync f32 (FP8 via FP16 HMMA)",
        kind="fused",
        block=16,
        frac_bits=25,
        align_rounding="rz",
        product_exponent="nominal",
        subnormal_exponent="fp16",
        c_mode="separate",
        out_frac_bits=23,
        out_rounding="rz",
        output="f32",
        k_order=_HMMA_ORDER,
        validated=True,
        description="mma.sync m16n8k32 .f32 e4m3/e5m2 on sm_90: two FP16 HMMA.16816 (k%4<2, then k%4>=2) + FADD C",
    ),
)
# BF16 wgmma (m64nNk16): fitted to torch's BF16 GEMMs on the H200 (tests/test_bf16_baseline.py)
register_model("sm90", "wgmma.bf16", MODEL_WGMMA_BF16)
for _arch in ("sm90", "any"):
    register_model(
        _arch,
        "exact",
        AccumulatorModel(name="exact", kind="exact", description="exact sum of products and C, one fp32 RNE rounding"),
    )
    register_model(
        _arch,
        "fp32",
        AccumulatorModel(name="fp32", kind="fp32", description="fp32 RNE after every addition (C first, k in order)"),
    )
# Literature presets for other architectures (NOT validated on hardware here).
register_model(
    "sm89",
    "mma.sync",
    AccumulatorModel(
        name="sm89 mma.sync f32 (FP8), from MMA-Sim",
        kind="fused",
        block=16,
        frac_bits=13,
        out_frac_bits=13,
        out_rounding="rz",
        validated=False,
        description="Ada QMMA as reported by MMA-Sim (split-k, 13 bits); not validated by fp8sim",
    ),
)


# ---------------------------------------------------------------------------------------------
# Instructions beyond Hopper, as modelled by MMA-Sim (Xie et al., arXiv 2511.10909, the ``mmasim``
# package v2): NOT validated on hardware by fp8sim; equal to MMA-Sim bit for bit (tests/
# test_arch_models.py), which its authors validated on the GPUs.  MMA-Sim's parameters per
# datapath: F fraction bits kept below the largest exponent (truncated), L products per fused
# sum, e_zero the exponent of a zero addend, the output rounding (RZ to fp32, RZ to 13 bits, RNE
# to fp16); an overflowing RZ result is inf (its exponent overflows).  The instruction table
# (formats, shapes, scales, evidence) is fp8sim.tensorcore.archs.
_F16_NAN = 0x7FFFE000  # fp32 pattern of the fp16 NaN 0x7fff


def _mmasim(name: str, *, block: int, F: int, out: str = "f32", instr_k: int = 32, group: int = 1,
            zero_exponent: int | None = None, description: str = "") -> AccumulatorModel:  # fmt: skip
    """A fused MMA-Sim datapath: F bits, truncation, RZ to fp32 (overflow: inf) or RNE to fp16."""
    f16 = out == "f16"
    if zero_exponent is None:
        zero_exponent = -21 if f16 else -133
    return AccumulatorModel(
        name=name,
        kind="fused",
        block=block,
        frac_bits=F,
        align_rounding="rz",
        product_exponent="nominal",
        subnormal_exponent="clamp",
        c_mode="fused",
        out_frac_bits=10 if f16 else 23,
        out_rounding="rne" if f16 else "rz",
        output=out,
        nan_bits=_F16_NAN if f16 else 0x7FFFFFFF,
        validated=False,
        description=description,
        instr_k=instr_k,
        zero_exponent=zero_exponent,
        group=group,
        overflow="ieee" if f16 else "inf",
    )


#: Ada mma.sync FP8 with f16 accumulator: 13 bits, two blocks of 16, RNE to fp16, e_zero = -20
MODEL_SM89_MMA_F16 = _mmasim(
    "sm89 mma.sync f16 (FP8), from MMA-Sim",
    block=16,
    F=13,
    out="f16",
    zero_exponent=-20,
    description="mma.sync m16n8k32/k16 .f16 e4m3/e5m2 on sm_89 (Ada) as modelled by MMA-Sim: "
    "two fused sums of 16 products, 13 bits, RNE to fp16",
)
#: Blackwell FP8/FP6/FP4 without scales (tcgen05.mma kind::f8f6f4; sm_120 mma.sync FP8/f8f6f4)
MODEL_F8F6F4 = _mmasim(
    "sm100 f8f6f4 f32, from MMA-Sim",
    block=32,
    F=25,
    description="Blackwell FP8/FP6/FP4 (tcgen05.mma kind::f8f6f4, sm_120 mma.sync FP8 and kind::f8f6f4) as "
    "modelled by MMA-Sim: C and 32 products in one fused sum, 25 bits, RZ to fp32",
)
MODEL_F8F6F4_F16 = _mmasim(
    "sm100 f8f6f4 f16, from MMA-Sim",
    block=32,
    F=25,
    out="f16",
    description="Blackwell FP8/FP6/FP4 with f16 accumulator as modelled by MMA-Sim: 25 bits, RNE to fp16",
)
#: sm_120 mma.sync m16n8k16 FP8: one fused sum of the instruction's 16 products
MODEL_SM120_K16 = _mmasim(
    "sm120 mma.sync k16 f32 (FP8), from MMA-Sim",
    block=16,
    F=25,
    instr_k=16,
    description="mma.sync m16n8k16 .f32 e4m3/e5m2 on sm_120 as modelled by MMA-Sim: 16 products, 25 bits",
)
MODEL_SM120_K16_F16 = _mmasim(
    "sm120 mma.sync k16 f16 (FP8), from MMA-Sim",
    block=16,
    F=25,
    out="f16",
    instr_k=16,
    description="mma.sync m16n8k16 .f16 e4m3/e5m2 on sm_120 as modelled by MMA-Sim: 16 products, RNE to fp16",
)
#: MXFP8/MXFP6/MXFP4 at k32 (kind::mxf8f6f4): UE8M0 scales per 32 folded into the product exponents
MODEL_MXF8F6F4 = _mmasim(
    "sm100 mxf8f6f4, from MMA-Sim",
    block=32,
    F=25,
    description="kind::mxf8f6f4 (block32, ue8m0) as modelled by MMA-Sim: each product carries its two scales' "
    "exponents, C and 32 products in one fused sum, 25 bits, RZ to fp32",
)
#: MXFP4 / NVFP4 at k64 (kind::mxf4, kind::mxf4nvf4): exact sums of 16, scaled, 35-bit fused sum
MODEL_MXF4 = _mmasim(
    "sm100 mxf4/mxf4nvf4, from MMA-Sim",
    block=64,
    F=35,
    instr_k=64,
    group=16,
    zero_exponent=-139,
    description="kind::mxf4 / kind::mxf4nvf4 (e2m1, ue8m0 per 32 or 16, ue4m3 per 16) as modelled by MMA-Sim: "
    "exact sums of 16 products times their scales, C and the 4 groups in one fused sum, 35 bits, RZ to fp32",
)
#: bf16/fp16 (k16) and tf32 (k8) on Hopper and Blackwell (MMA-Sim: F = 25, L = 16 or 8)
MODEL_KIND_F16 = _mmasim(
    "sm100 kind::f16 f32, from MMA-Sim",
    block=16,
    F=25,
    instr_k=16,
    description="bf16/fp16 inputs, f32 accumulator (tcgen05.mma kind::f16, wgmma/mma.sync k16) as modelled by "
    "MMA-Sim: C and 16 products in one fused sum, 25 bits, RZ to fp32",
)
MODEL_KIND_F16_F16 = _mmasim(
    "sm100 kind::f16 f16, from MMA-Sim",
    block=16,
    F=25,
    out="f16",
    instr_k=16,
    description="fp16 inputs, f16 accumulator as modelled by MMA-Sim: 16 products, 25 bits, RNE to fp16",
)
MODEL_KIND_TF32 = _mmasim(
    "sm100 kind::tf32, from MMA-Sim",
    block=8,
    F=25,
    instr_k=8,
    description="tf32 inputs (k8) as modelled by MMA-Sim: C and 8 products in one fused sum, 25 bits, RZ to fp32",
)
#: the same three datapaths on Hopper (wgmma and mma.sync), checked on the H200: single
#: m64n8k16 / m64n8k8 wgmma and m16n8k16 / m16n8k8 mma.sync instructions on five families of tiles
#: (tests/data/wide_sm90, gpu/capture_wide.py) give every output's bits, so these copies carry the
#: H200 label (the sm100 rows keep MMA-Sim's)
_H200_WIDE = "MMA-Sim's model, validated on H200 (wgmma and mma.sync, tests/data/wide_sm90)"
MODEL_SM90_KIND_F16 = replace(
    MODEL_KIND_F16,
    name="sm90 kind::f16 f32",
    validated=True,
    description="wgmma m64nNk16 / mma.sync m16n8k16 .f32 with bf16 or fp16 inputs on sm_90a: C and 16 products in "
    "one fused sum, 25 bits, truncation, RZ to fp32 (an overflow is inf); " + _H200_WIDE,
)
MODEL_SM90_KIND_F16_F16 = replace(
    MODEL_KIND_F16_F16,
    name="sm90 kind::f16 f16",
    validated=True,
    description="wgmma m64nNk16 / mma.sync m16n8k16 .f16.f16.f16 on sm_90a: C and 16 products, 25 bits, RNE to "
    "fp16; " + _H200_WIDE,
)
MODEL_SM90_KIND_TF32 = replace(
    MODEL_KIND_TF32,
    name="sm90 kind::tf32",
    validated=True,
    description="wgmma m64nNk8 / mma.sync m16n8k8 .f32.tf32.tf32 on sm_90a: C and 8 products in one fused sum, 25 "
    "bits, truncation, RZ to fp32 (an overflow is inf); " + _H200_WIDE,
)
#: AMD CDNA3 (MI300) FP8 MFMA: two interleaved 24-bit sums, truncation toward -inf, RNE to fp32
MODEL_CDNA3_MFMA = AccumulatorModel(
    name="cdna3 mfma f32 (fp8/bf8), from MMA-Sim",
    kind="interleaved",
    block=16,
    frac_bits=24,
    sum_frac_bits=31,
    align_rounding="rz",
    product_exponent="nominal",
    subnormal_exponent="clamp",
    out_frac_bits=23,
    out_rounding="rne",
    output="f32",
    validated=False,
    description="v_mfma_f32_16x16x32 / 32x32x16 fp8/bf8 on CDNA3 (MI300) as modelled by MMA-Sim: per 16 products, "
    "even and odd k summed apart (24 bits, truncation), added toward -inf, C at 24 bits, 31-bit sum, RNE to fp32",
)

register_model("sm89", "mma.sync.f16", MODEL_SM89_MMA_F16)
for _arch, _prefix in (("sm100", "tcgen05.mma"), ("sm120", "mma.sync")):
    register_model(_arch, f"{_prefix}.kind::f8f6f4", MODEL_F8F6F4)
    register_model(_arch, f"{_prefix}.kind::f8f6f4.f16", MODEL_F8F6F4_F16)
    register_model(_arch, f"{_prefix}.kind::mxf8f6f4", MODEL_MXF8F6F4)
    register_model(_arch, f"{_prefix}.kind::mxf4", MODEL_MXF4)
    register_model(_arch, f"{_prefix}.kind::mxf4nvf4", MODEL_MXF4)
register_model("sm120", "mma.sync", MODEL_F8F6F4)
register_model("sm120", "mma.sync.f16", MODEL_F8F6F4_F16)
register_model("sm120", "mma.sync.k16", MODEL_SM120_K16)
register_model("sm120", "mma.sync.k16.f16", MODEL_SM120_K16_F16)
for _prefix in ("tcgen05.mma", "mma.sync"):
    register_model("sm100", f"{_prefix}.kind::f16", MODEL_KIND_F16)
    register_model("sm100", f"{_prefix}.kind::f16.f16", MODEL_KIND_F16_F16)
    register_model("sm100", f"{_prefix}.kind::tf32", MODEL_KIND_TF32)
register_model("cdna3", "mfma", MODEL_CDNA3_MFMA)
# The sm90 bf16/fp16/tf32 paths other than the H200-validated "wgmma.bf16" (MODEL_KIND_F16 and
# friends on Hopper) are rows of fp8sim.tensorcore.archs, not registry presets: the sm90 presets
# are the accumulators that recipes take on FP8 operands.


def model_names() -> list[tuple[str, str]]:
    """(arch, instruction) pairs that have a preset, in registration order."""
    return list(PRESETS)


def get_model(instruction: str | AccumulatorModel = "wgmma", arch: str = "sm90") -> AccumulatorModel:
    """Return the preset for ``instruction`` on ``arch`` (a model is returned as is).

    ``instruction`` may name its arch as ``"arch:key"`` (``"sm100:tcgen05.mma.kind::f8f6f4"``,
    the spelling of a recipe's accumulator); that arch then replaces ``arch``.

    The preset registered for ``arch`` is taken, else the one of ``arch="any"``.  An unknown
    instruction or arch raises :class:`~fp8sim.formats.UnknownNameError` (a ``ValueError``) naming
    the closest known names and every (instruction, arch) preset.
    """
    if isinstance(instruction, AccumulatorModel):
        return instruction
    if not isinstance(instruction, str):
        raise TypeError(f"instruction must be a name or an AccumulatorModel, got {type(instruction).__name__}")
    if not isinstance(arch, str):
        raise TypeError(f"arch must be a name such as 'sm90', got {type(arch).__name__}")
    key = instruction.strip().lower()
    arch_key = arch.strip().lower()
    head, sep, tail = key.partition(":")
    if sep and tail and not tail.startswith(":") and any(a == head for a, _ in PRESETS):
        key, arch_key = tail, head  # "sm100:tcgen05.mma.kind::f8f6f4": the arch in the name
    model = PRESETS.get((arch_key, key), PRESETS.get((ANY_ARCH, key)))
    if model is not None:
        return model
    known = [f"{i} ({a})" for a, i in PRESETS]
    instrs = sorted({i for _, i in PRESETS})
    archs = sorted({a for a, _ in PRESETS if a != ANY_ARCH})
    where = f"no accumulator model for instruction {instruction!r} on arch {arch!r}"
    if key not in instrs:
        raise unknown_name_error("instruction", instruction, known, where=where, candidates=instrs, plural="presets")
    if arch_key not in archs:
        raise unknown_name_error("arch", arch, known, where=where, candidates=archs, plural="presets")
    has = [a for a, i in PRESETS if i == key]
    where += f" (the instruction has no preset for arch {arch!r}, only for {', '.join(map(repr, has))})"
    raise unknown_name_error(f"arch of {key}", arch, known, where=where, candidates=has, plural="presets")
