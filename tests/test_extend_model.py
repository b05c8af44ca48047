"""Worked example (docs/architecture.md, "Adding an accumulator model"): a new accumulator model is one
registry entry, made through public API only, and then runs everywhere a model runs -- one instruction
(``tensorcore.mma``), the tile loop (``tensorcore.matmul``), capture scoring, a :class:`fp8sim.Recipe`
through :func:`fp8sim.gemm`, and the kernel report.

The expected bits are independent of the code under test: the H200's own outputs (the captures shipped
with fp8sim) and the validated ``deepseek-v3`` recipe, which reproduces the H200 GEMM oracle.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

import fp8sim
import fp8sim.tensorcore as tc
from fp8sim.gemms.recipes import arch_accumulator_names

CAPTURES = os.path.join(os.path.dirname(fp8sim.__file__), "captures")
ARCH = "sm90-example"  # a new arch name: nothing of fp8sim knows it before the test registers it


@pytest.fixture(scope="module")
def registered():
    """The sm90 wgmma arithmetic re-declared field by field as a new model (what a user does for a new
    GPU whose accumulator the characterization tools measured), and a variant with one bit less."""
    wgmma = tc.get_model("wgmma", "sm90")
    fields = {f.name: getattr(wgmma, f.name) for f in dataclasses.fields(wgmma)}
    fields.update(name="example: sm90 wgmma re-declared", validated=False, description="worked example")
    same = tc.AccumulatorModel(**fields)
    narrower = tc.AccumulatorModel(**{**fields, "name": "example: 12-bit alignment", "frac_bits": 12})
    try:
        tc.register_model(ARCH, "wgmma", same)
        tc.register_model(ARCH, "wgmma-f12", narrower)
    except ValueError:  # registered by an earlier run of this module in the same process
        pass
    return tc.get_model("wgmma", ARCH), tc.get_model("wgmma-f12", ARCH)


def test_the_registry_knows_it(registered):
    same, narrower = registered
    assert (ARCH, "wgmma") in tc.model_names() and (ARCH, "wgmma-f12") in tc.model_names()
    assert same.frac_bits == 13 and narrower.frac_bits == 12
    with pytest.raises(ValueError, match="already has a preset"):
        tc.register_model(ARCH, "wgmma", same)


@pytest.mark.parametrize(
    "capture", ["wgmma_e4m3xe4m3_normal.npz", "wgmma_e4m3xe5m2_normal.npz", "wgmma_e4m3xe4m3_special.npz"]
)
def test_reproduces_the_h200_captures(registered, capture):
    """The re-declared model scores 100 % on the H200's outputs; one bit less of alignment does not
    (so the registered model's own parameters are what ran)."""
    same, narrower = registered
    path = os.path.join(CAPTURES, capture)
    assert tc.verify_capture(path, model=same)["match_rate"] == 1.0
    if "normal" in capture:
        assert tc.verify_capture(path, model=narrower)["match_rate"] < 1.0


def test_mma_and_matmul_by_name(registered):
    """By name on its arch: ``mma`` and ``matmul`` give the sm90 preset's bits (the captures above show
    those are the H200's)."""
    rng = np.random.default_rng(7)
    a = rng.integers(0, 256, (16, 128), dtype=np.uint8)
    b = rng.integers(0, 256, (128, 24), dtype=np.uint8)
    kw = dict(a_format="e4m3", b_format="e5m2")
    ref = tc.matmul(a, b, instruction="wgmma", arch="sm90", promote_every=64, **kw)
    got = tc.matmul(a, b, instruction="wgmma", arch=ARCH, promote_every=64, **kw)
    assert np.array_equal(ref.view(np.uint32), got.view(np.uint32))
    c = np.zeros((16, 24), np.float32)
    one = tc.mma(a[:, :32], b[:32], c, instruction="wgmma", arch=ARCH, **kw)
    assert np.array_equal(one.view(np.uint32), tc.mma(a[:, :32], b[:32], c, **kw).view(np.uint32))


def test_a_recipe_on_the_new_model(registered):
    """A recipe names the model as ``"arch:instruction"``: DeepSeek-V3's recipe on it equals the validated
    preset bit for bit, on every output format path (bf16 RNE from the fp32 accumulator)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((40, 300)).astype(np.float32)
    w = rng.standard_normal((300, 72)).astype(np.float32)
    mine = fp8sim.recipe("deepseek-v3").with_(name="deepseek-v3-on-example", accumulator=f"{ARCH}:wgmma")
    assert f"{ARCH}:wgmma" in arch_accumulator_names()
    ref = fp8sim.gemm(x, w, "deepseek-v3")
    got = fp8sim.gemm(x, w, mine)
    assert np.array_equal(ref.view(np.uint32), got.view(np.uint32))
    narrow = mine.with_(accumulator=f"{ARCH}:wgmma-f12")
    assert not np.array_equal(ref.view(np.uint32), fp8sim.gemm(x, w, narrow).view(np.uint32))
