"""The tensor-core instruction table: per (arch, instruction, kind) the operand formats, shapes,
block scales, accumulator model and evidence.

:func:`fp8sim.tensorcore.mma` and :func:`fp8sim.tensorcore.matmul` pick a row from ``arch``, the
base ``instruction`` (``"mma.sync"``, ``"wgmma"``, ``"tcgen05.mma"``, ``"mfma"``), the operand
formats, ``K``, ``out_format`` and the scales, by one rule (:func:`resolve`: the row taking the
operands whose instruction K is the largest that divides ``K``).  The kind follows from them:

* no scales: e4m3/e5m2 pairs are the plain FP8 instruction (sm89, sm90, sm120), any pair with an
  FP6/FP4 operand (or any pair on sm100) is ``kind::f8f6f4``; bf16/fp16 is ``kind::f16``, tf32
  ``kind::tf32``; e4m3fnuz/e5m2fnuz on ``cdna3`` is the fp8/bf8 MFMA;
* scales with K = 32 (one UE8M0 scale per 32): ``kind::mxf8f6f4``;
* scales with K = 64 and e2m1 operands: ``kind::mxf4`` (UE8M0 per 32) or ``kind::mxf4nvf4``
  (UE8M0 per 16, UE4M3 per 16); e2m1 x e2m1 with UE8M0 per 32 is ``kind::mxf4`` whenever K is a
  multiple of 64 (a ``matmul`` of K = 128 is two ``kind::mxf4`` instructions), ``kind::mxf8f6f4``
  otherwise (K = 32, 96, ...).

Each row's model is a preset of :mod:`fp8sim.tensorcore.registry` (the key in :attr:`Row.key`).
:func:`models_listing` is the text of ``fp8sim info --models``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..formats import Format, NanStyle
from ..formats import format as _get_format
from . import registry as _r
from .model import AccumulatorModel, mark_block_scaled
from .wide import MODEL_WGMMA_BF16

__all__ = [
    "Row",
    "ROWS",
    "UE4M3",
    "EVIDENCE_H200",
    "EVIDENCE_MMASIM",
    "EVIDENCE_REFERENCE",
    "scale_format",
    "resolve",
    "rows_for",
    "evidence",
    "models_listing",
]

#: NVFP4's block-scale format: E4M3 without sign (0x7f is NaN), as PTX's ``.ue4m3``
UE4M3 = Format(
    "ue4m3", 4, 3, 7, signed=False, inf=False, nan=NanStyle.OCP, description="unsigned E4M3 (NVFP4 block scale)"
)

EVIDENCE_H200 = "validated on H200"
EVIDENCE_MMASIM = "matches MMA-Sim (validated by its authors)"
EVIDENCE_REFERENCE = "reference (no hardware)"

_FP8 = ("e4m3", "e5m2")
_F8F6F4 = ("e4m3", "e5m2", "e3m2", "e2m3", "e2m1")
_F16 = ("bf16", "fp16")
_UE8M0 = "e8m0"


@dataclass(frozen=True)
class Row:
    """One instruction of the table."""

    arch: str
    instruction: str  #: base name: mma.sync, wgmma, tcgen05.mma, mfma
    kind: str  #: PTX kind (or the operand class): f8, f8f6f4, mxf8f6f4, mxf4, mxf4nvf4, f16, tf32, fp8
    formats: tuple[str, ...]  #: operand formats (any pair, unless same_format)
    out: str  #: "f32" or "f16"
    ks: tuple[int, ...]  #: the K of the shapes
    shape: str  #: shapes in words
    key: str  #: registry key of the model
    scales: tuple[tuple[str, int], ...] = ()  #: allowed (scale format, block) pairs; () = unscaled
    same_format: bool = False  #: a and b must have the same format (bf16/fp16)
    model_override: AccumulatorModel | None = None  #: a model that is not a registry preset

    @property
    def model(self) -> AccumulatorModel:
        if self.model_override is not None:
            return self.model_override
        return _r.get_model(self.key, self.arch)

    @property
    def evidence(self) -> str:
        return evidence(self.model)


def _rows() -> tuple[Row, ...]:
    rows: list[Row] = []
    add = rows.append
    # sm89 (Ada)
    for out, key in (("f32", "mma.sync"), ("f16", "mma.sync.f16")):
        add(Row("sm89", "mma.sync", "f8", _FP8, out, (32, 16), "m16n8k32, m16n8k16", key))
    # sm90 (Hopper): the H200-validated FP8 presets and bf16/fp16/tf32 wgmma and mma.sync
    add(Row("sm90", "wgmma", "f8", _FP8, "f32", (32,), "m64nNk32", "wgmma"))
    add(Row("sm90", "wgmma", "f8", _FP8, "f16", (32,), "m64nNk32", "wgmma.f16"))
    add(Row("sm90", "mma.sync", "f8", _FP8, "f32", (32,), "m16n8k32", "mma.sync"))
    add(Row("sm90", "wgmma", "f16", ("bf16",), "f32", (16,), "m64nNk16", "wgmma.bf16"))
    add(
        Row(
            "sm90",
            "wgmma",
            "f16",
            ("fp16",),
            "f32",
            (16,),
            "m64nNk16",
            "wgmma.kind::f16",
            model_override=_r.MODEL_SM90_KIND_F16,
        )
    )
    add(Row("sm90", "wgmma", "f16", ("fp16",), "f16", (16,), "m64nNk16", "wgmma.kind::f16.f16",
            model_override=_r.MODEL_SM90_KIND_F16_F16))  # fmt: skip
    add(Row("sm90", "wgmma", "tf32", ("tf32",), "f32", (8,), "m64nNk8", "wgmma.kind::tf32",
            model_override=_r.MODEL_SM90_KIND_TF32))  # fmt: skip
    add(Row("sm90", "mma.sync", "f16", _F16, "f32", (16,), "m16n8k16", "mma.sync.kind::f16", same_format=True,
            model_override=_r.MODEL_SM90_KIND_F16))  # fmt: skip
    add(Row("sm90", "mma.sync", "f16", ("fp16",), "f16", (16,), "m16n8k16", "mma.sync.kind::f16.f16",
            model_override=_r.MODEL_SM90_KIND_F16_F16))  # fmt: skip
    add(Row("sm90", "mma.sync", "tf32", ("tf32",), "f32", (8,), "m16n8k8", "mma.sync.kind::tf32",
            model_override=_r.MODEL_SM90_KIND_TF32))  # fmt: skip
    # sm100 (B200)
    tc = "m64/m128 x n8..256"
    for out, sfx in (("f32", ""), ("f16", ".f16")):
        add(Row("sm100", "tcgen05.mma", "f8f6f4", _F8F6F4, out, (32,), f"{tc} x k32", f"tcgen05.mma.kind::f8f6f4{sfx}"))
    add(Row("sm100", "tcgen05.mma", "mxf8f6f4", _F8F6F4, "f32", (32,), "m128 x n8..256 x k32",
            "tcgen05.mma.kind::mxf8f6f4", scales=((_UE8M0, 32),)))  # fmt: skip
    add(Row("sm100", "tcgen05.mma", "mxf4", ("e2m1",), "f32", (64,), "m128 x n8..256 x k64",
            "tcgen05.mma.kind::mxf4", scales=((_UE8M0, 32),)))  # fmt: skip
    add(Row("sm100", "tcgen05.mma", "mxf4nvf4", ("e2m1",), "f32", (64,), "m128 x n8..256 x k64",
            "tcgen05.mma.kind::mxf4nvf4", scales=((_UE8M0, 16), ("ue4m3", 16))))  # fmt: skip
    for instr, shp in (("tcgen05.mma", tc), ("mma.sync", "m16n8")):
        add(Row("sm100", instr, "f16", _F16, "f32", (16,), f"{shp} x k16", f"{instr}.kind::f16", same_format=True))
        add(Row("sm100", instr, "f16", ("fp16",), "f16", (16,), f"{shp} x k16", f"{instr}.kind::f16.f16"))
        add(Row("sm100", instr, "tf32", ("tf32",), "f32", (8,), f"{shp} x k8", f"{instr}.kind::tf32"))
    # sm120 (RTX Blackwell)
    for out, sfx in (("f32", ""), ("f16", ".f16")):
        add(Row("sm120", "mma.sync", "f8", _FP8, out, (32,), "m16n8k32", f"mma.sync{sfx}"))
        add(Row("sm120", "mma.sync", "f8", _FP8, out, (16,), "m16n8k16", f"mma.sync.k16{sfx}"))
        add(Row("sm120", "mma.sync", "f8f6f4", _F8F6F4, out, (32,), "m16n8k32", f"mma.sync.kind::f8f6f4{sfx}"))
    add(Row("sm120", "mma.sync", "mxf8f6f4", _F8F6F4, "f32", (32,), "m16n8k32", "mma.sync.kind::mxf8f6f4",
            scales=((_UE8M0, 32),)))  # fmt: skip
    add(Row("sm120", "mma.sync", "mxf4", ("e2m1",), "f32", (64,), "m16n8k64", "mma.sync.kind::mxf4",
            scales=((_UE8M0, 32),)))  # fmt: skip
    add(Row("sm120", "mma.sync", "mxf4nvf4", ("e2m1",), "f32", (64,), "m16n8k64", "mma.sync.kind::mxf4nvf4",
            scales=((_UE8M0, 16), ("ue4m3", 16))))  # fmt: skip
    # cdna3 (MI300)
    add(Row("cdna3", "mfma", "fp8", ("e4m3fnuz", "e5m2fnuz"), "f32", (32, 16), "16x16x32, 32x32x16", "mfma"))
    return tuple(rows)


#: every row of the instruction table
ROWS: tuple[Row, ...] = _rows()
for _row in ROWS:  # AccumulatorModel.block_scaled: the models of the rows that take scales
    if _row.scales:
        mark_block_scaled(_row.model)


def scale_format(name) -> Format:
    """The block-scale format called ``name``: ``"ue8m0"`` (E8M0) or ``"ue4m3"``."""
    if isinstance(name, Format):
        return name
    if not isinstance(name, str):
        raise TypeError(f"scale_format must be 'ue8m0' or 'ue4m3', got {type(name).__name__}")
    if name.strip().lower() == "ue4m3":
        return UE4M3
    f = _get_format(name)
    if f.name != _UE8M0:
        raise ValueError(f"scale_format must be 'ue8m0' or 'ue4m3', got {name!r}")
    return f


def rows_for(arch: str, instruction: str) -> list[Row]:
    """The rows of a base instruction on an arch (names are case-insensitive)."""
    a = arch.strip().lower()
    i = instruction.strip().lower()
    return [r for r in ROWS if r.arch == a and r.instruction == i]


def resolve(
    arch: str, instruction: str, a_format: Format, b_format: Format, K: int, out_format: str, scale: tuple | None
) -> Row | None:
    """The row of ``instruction`` on ``arch`` for these operands and a product of length ``K``, or
    ``None`` if ``instruction`` is no base name there.  ``scale`` is ``None`` or ``(scale Format,
    block)``.  Operands the instruction does not take raise ``ValueError`` naming what it takes.

    The one rule of :func:`fp8sim.tensorcore.mma` (``K`` = one instruction's) and
    :func:`fp8sim.tensorcore.matmul` (``K`` = the whole product's): among the rows that take the
    formats, ``out_format`` and the scales, the one with the largest instruction K that divides
    ``K`` (and divides, or is a multiple of, the scale block); the first such row of the table on a
    tie.  So e2m1 operands with UE8M0 scales per 32 run ``kind::mxf4`` (k64) when K is a multiple
    of 64 and ``kind::mxf8f6f4`` (k32) otherwise, in both functions."""
    rows = rows_for(arch, instruction)
    if not rows:
        return None
    fa, fb = a_format.name, b_format.name
    sc = None if scale is None else (scale[0].name, scale[1])
    best: tuple[int, Row] | None = None
    for r in rows:
        if not (
            fa in r.formats
            and fb in r.formats
            and (not r.same_format or fa == fb)
            and r.out == out_format
            and ((sc is None and not r.scales) or (sc is not None and sc in r.scales))
        ):
            continue
        for k in r.ks:
            if K % k or (sc is not None and k % sc[1] and sc[1] % k):
                continue
            if best is None or k > best[0]:
                best = (k, r)
    if best is not None:
        return best[1]
    what = f"{fa} x {fb}, K={K}, out_format={out_format!r}" + (
        ", no scales" if sc is None else f", scales {sc[0]} per {sc[1]}"
    )
    takes = "; ".join(
        f"{r.kind}: {_bits(r.formats)} {'/'.join(r.formats)} K={'/'.join(map(str, r.ks))} out {r.out}"
        + (" scales " + ", ".join(f"{s} per {b}" for s, b in r.scales) if r.scales else "")
        for r in rows
    )
    raise ValueError(f"{instruction} on {arch} does not take {what}; it takes {takes}")


def _bits(names) -> str:
    bits = sorted({_get_format(n).bits for n in names})
    return "/".join(map(str, bits)) + "-bit"


def evidence(model: AccumulatorModel) -> str:
    """The evidence label of a model."""
    if model.validated:
        return EVIDENCE_H200
    if model.kind in ("exact", "fp32"):
        return EVIDENCE_REFERENCE
    return EVIDENCE_MMASIM


def models_listing() -> str:
    """The text of ``fp8sim info --models``: every registry preset and every row of the
    instruction table, with its evidence label."""
    lines = [f"{'arch':<6} {'instruction':<30} {'formats':<36} {'out':<4} {'shape':<26} evidence"]
    seen = set()
    for r in ROWS:
        seen.add((r.arch, r.key))
        fm = "/".join(r.formats)
        if r.scales:
            fm += " + " + ",".join(f"{'ue8m0' if s == _UE8M0 else s}/{b}" for s, b in r.scales)
        lines.append(f"{r.arch:<6} {r.key:<30} {fm:<36} {r.out:<4} {r.shape:<26} {r.evidence}")
    for (arch, key), m in _r.PRESETS.items():
        if (arch, key) in seen:
            continue
        fm = "bf16" if m is MODEL_WGMMA_BF16 else ("any 8-bit" if m.kind in ("exact", "fp32") else "e4m3/e5m2")
        lines.append(f"{arch:<6} {key:<30} {fm:<36} {m.output:<4} {'k32':<26} {evidence(m)}")
    return "\n".join(lines)
