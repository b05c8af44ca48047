"""Hopper's bf16, fp16 and tf32 ``wgmma`` and ``mma.sync`` on the H200, one instruction per tile, bit for bit.

``python -m gpu.capture_wide --out tests/data/wide_sm90`` ran single ``wgmma.mma_async`` m64n8k16
(.f32.bf16.bf16, .f32.f16.f16, .f16.f16.f16) and m64n8k8 (.f32.tf32.tf32) instructions, and the
same four forms of ``mma.sync`` (m16n8k16, m16n8k8), on an H200
over five families of tiles (normal data, wide exponents, the whole code space with inf/NaN, sums
beyond the largest finite value, products below 2^-133).  fp8sim's sm90 models must give every
output's bits; so must MMA-Sim's Hopper models (where installed), which is how the BF16 preset's
two open questions (an overflowing RZ result; C = 0 with every product below 2^-133) were settled.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace

import numpy as np
import pytest

import fp8sim.tensorcore as tc
from fp8sim.tensorcore import archs
from fp8sim.tensorcore.wide import MODEL_WGMMA_BF16, bf16_matmul

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_arch_models as T  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "wide_sm90")
#: capture form -> (fp8sim format, accumulator, instruction, sm90 row key)
FORMS = {"bf16": ("bf16", "f32", "wgmma", "wgmma.bf16"), "fp16": ("fp16", "f32", "wgmma", "wgmma.kind::f16"),
         "fp16.f16": ("fp16", "f16", "wgmma", "wgmma.kind::f16.f16"),
         "tf32": ("tf32", "f32", "wgmma", "wgmma.kind::tf32"),
         "mma.sync.bf16": ("bf16", "f32", "mma.sync", "mma.sync.kind::f16"),
         "mma.sync.fp16": ("fp16", "f32", "mma.sync", "mma.sync.kind::f16"),
         "mma.sync.fp16.f16": ("fp16", "f16", "mma.sync", "mma.sync.kind::f16.f16"),
         "mma.sync.tf32": ("tf32", "f32", "mma.sync", "mma.sync.kind::tf32")}  # fmt: skip
FAMILIES = ("normal", "wide", "whole", "overflow", "tiny")


def _load(form):
    instr = FORMS[form][2]
    z = np.load(os.path.join(DATA, f"wgmma_wide_{form}.npz" if instr == "wgmma" else f"{form}.npz"))
    meta = json.loads(str(z["meta"]))
    assert meta["gpu"].startswith("NVIDIA H200") and meta["form"] == form and meta["families"] == list(FAMILIES)
    assert meta["instruction"] == instr
    return z, meta


def _bits(x) -> np.ndarray:
    return np.asarray(x, np.float32).view(np.uint32)


def _fp8sim(form, a, b, c, model=None):
    fmt, acc, instr, key = FORMS[form]
    if acc == "f16":
        c = c.astype(np.float16)
    kw = dict(a_format=fmt, b_format=fmt, out_format=acc)
    if model is None:
        return tc.mma(a, b, c, instruction=instr, arch="sm90", **kw).astype(np.float32)
    return tc.mma(a, b, c, instruction=model, **kw).astype(np.float32)


@pytest.mark.parametrize("form", list(FORMS))
def test_sm90_models_equal_the_h200_on_every_output(form):
    z, meta = _load(form)
    fmt, acc, instr, key = FORMS[form]
    row = next(r for r in archs.ROWS if (r.arch, r.key) == ("sm90", key))
    assert row.model.validated and row.evidence == archs.EVIDENCE_H200  # the label these captures earn
    rows = 64 if instr == "wgmma" else 16
    total = 0
    for fam in FAMILIES:
        a, b, c, d = (z[f"{fam}_{x}"] for x in "abcd")
        assert a.shape[1:] == (rows, 16 if fmt != "tf32" else 8) and d.shape == (meta["tiles"], rows, 8)
        got = _fp8sim(form, a, b, c)
        assert int((_bits(got) != _bits(d)).sum()) == 0, (form, fam)
        total += d.size
    assert total == 5 * 64 * 512


def test_the_captures_tell_the_bf16_alternatives_apart():
    # the BF16 preset fitted to cuBLASLt's GEMMs had left two cases open; the H200's instruction
    # decides both: an overflowing RZ result is inf (not FLT_MAX), and with C = 0 a block whose
    # products all lie below 2^-133 is aligned at 2^-133 (MMA-Sim's e_zero), not at its largest product
    z, _ = _load("bf16")
    for fam, change, what in (
        ("overflow", {"overflow": "ieee"}, "FLT_MAX"),
        ("tiny", {"zero_exponent": None}, "e_zero"),
    ):
        a, b, c, d = (z[f"{fam}_{x}"] for x in "abcd")
        alt = _fp8sim("bf16", a, b, c, replace(MODEL_WGMMA_BF16, name="alt", validated=False, **change))
        diff = _bits(alt) != _bits(d)
        assert diff.sum() > 50, what
        if fam == "overflow":
            assert (np.abs(alt[diff]) == np.finfo(np.float32).max).all() and np.isinf(d[diff]).all()
        else:
            assert (c[diff] == 0).all() and (np.abs(d[diff]) < 2.0**-126).all()
    # bf16_matmul (the recipes' BF16 GEMM) is the same preset
    a, b, c, d = (z[f"overflow_{x}"] for x in "abcd")
    zero_c = c[0] == 0
    got = bf16_matmul(a[0], b[0], MODEL_WGMMA_BF16)
    assert zero_c.any() and (_bits(got)[zero_c] == _bits(d[0])[zero_c]).all()


@pytest.mark.parametrize("form", list(FORMS))
def test_mmasim_hopper_models_equal_the_h200(form):
    T._mmasim()
    z, _ = _load(form)
    fmt, acc, instr, key = FORMS[form]
    row = next(r for r in archs.ROWS if (r.arch, r.key) == ("sm90", key))
    for fam in FAMILIES:
        a, b, c, d = (z[f"{fam}_{x}"] for x in "abcd")
        for t in range(0, a.shape[0], a.shape[0] // 4):  # 4 tiles per family (MMA-Sim runs about 1 M MAC/s)
            ct = c[t].astype(np.float16) if acc == "f16" else c[t]
            ref = T.reference(row, fmt, fmt, a[t], b[t], ct)
            ref = ref.view(np.float16).astype(np.float32) if acc == "f16" else ref.view(np.float32)
            assert (_bits(ref) == _bits(d[t])).all(), (form, fam, t)
