"""fp8sim.recipes: presets, lookup, validation."""

import dataclasses

import numpy as np
import pytest

import fp8sim
from fp8sim.recipes import PRESETS, Recipe

NAMES = ["deepseek-v3", "per-tensor", "per-tensor-no-promotion", "mxfp8", "te-hybrid", "bf16", "fp32", "fp64"]


def test_preset_names_exact():
    assert list(PRESETS) == NAMES
    assert fp8sim.recipe_names() == NAMES


def test_lookup_and_error_lists_names():
    assert fp8sim.recipe("DeepSeek-V3") is PRESETS["deepseek-v3"]
    r = PRESETS["mxfp8"]
    assert fp8sim.recipe(r) is r
    with pytest.raises(ValueError) as e:
        fp8sim.recipe("deepseek")
    for n in NAMES:
        assert n in str(e.value)
    with pytest.raises(TypeError):
        fp8sim.recipe(3)


def test_deepseek_v3_preset_fields():
    r = fp8sim.recipe("deepseek-v3")
    assert (r.x_format, r.w_format, r.x_granularity, r.w_granularity) == ("e4m3", "e4m3", "1x128", "128x128")
    assert r.accumulator == "wgmma" and r.promote_every == 128 and r.scale_at == "promotion"
    assert r.scale_application == "fma" and r.output_format == "bf16" and r.validated
    assert fp8sim.recipe("per-tensor-no-promotion").promote_every is None
    assert fp8sim.recipe("mxfp8").scale_format == "e8m0"
    assert fp8sim.recipe("fp64").output_format == "fp64"


def test_frozen_and_with():
    r = fp8sim.recipe("deepseek-v3")
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.promote_every = 64
    r2 = r.with_(promote_every=256)
    assert r2.promote_every == 256 and r.promote_every == 128


def test_te_hybrid_backward():
    r = fp8sim.recipe("te-hybrid")
    b = r.backward()
    assert (r.x_format, b.x_format, b.w_format) == ("e4m3", "e5m2", "e4m3")
    assert r.promote_every is None and b.promote_every == 128
    assert fp8sim.recipe("deepseek-v3").backward() is fp8sim.recipe("deepseek-v3")
    rng = np.random.default_rng(0)
    g = rng.standard_normal((4, 256)).astype(np.float32)
    w = rng.standard_normal((256, 8)).astype(np.float32)
    yf = fp8sim.gemm(g, w, r)
    yb = fp8sim.gemm(g, w, b)
    assert not np.array_equal(yf, yb)  # e5m2 gradients quantize differently


@pytest.mark.parametrize(
    "bad",
    [
        dict(x_format="e3m4"),
        dict(x_format="e4m3", w_format="bf16"),
        dict(output_format="fp16"),
        dict(accumulator="tf32"),
        dict(promote_every=100),
        dict(promote_every=0),
        dict(scale_at="kernel"),
        dict(scale_application="fms"),
        dict(promote_every=None),
        dict(grad_format="bf16"),
    ],
)
def test_validation(bad):
    with pytest.raises(ValueError):
        Recipe("bad", **bad)


def test_promotion_interval_changes_result_and_per_tensor_hand_case():
    # per-tensor: x = 1, w = 1 -> scales 1/448 each; codes 448; sum over K = 256 of 448^2
    # = 51380224 (exact); epilogue: fp32(fp32(sa*sb) * acc); bf16 rounding of ~256
    x = np.ones((2, 256), np.float32)
    w = np.ones((256, 3), np.float32)
    s = np.float32(np.float32(1 / 448) * np.float32(1 / 448))
    expect = np.float32(s * np.float32(448.0 * 448.0 * 256))
    for name in ("per-tensor", "per-tensor-no-promotion"):
        y = fp8sim.gemm(x, w, fp8sim.recipe(name).with_(output_format="fp32"))
        assert (y == expect).all(), name
