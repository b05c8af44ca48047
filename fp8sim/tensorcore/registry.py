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
   :mod:`fp8sim.tensorcore.bitexact`, called from the one dispatch on ``P.kind`` in ``_instr``.
"""

from __future__ import annotations

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


def model_names() -> list[tuple[str, str]]:
    """(arch, instruction) pairs that have a preset, in registration order."""
    return list(PRESETS)


def get_model(instruction: str | AccumulatorModel = "wgmma", arch: str = "sm90") -> AccumulatorModel:
    """Return the preset for ``instruction`` on ``arch`` (a model is returned as is).

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
