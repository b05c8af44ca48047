"""fp8sim.gemms.recipes: presets, lookup, validation."""

import dataclasses

import numpy as np
import pytest

import fp8sim
from fp8sim.gemms.presets import PRESETS
from fp8sim.gemms.recipes import Recipe

NAMES = [
    "deepseek-v3",
    "per-tensor",
    "per-tensor-no-promotion",
    "mxfp8",
    "te-hybrid",
    "cublaslt-tensor",
    "cublaslt-row",
    "cublaslt-tensor-fast",
    "cublaslt-row-fast",
    "cublaslt-block",
    "triton",
    "triton-imprecise-32",
    "triton-imprecise-64",
    "triton-imprecise-128",
    "bf16",
    "bf16-cublaslt",
    "fp32",
    "fp64",
    "deepseek-v3-blackwell",
    "mxfp8-blackwell",
    "mxfp4",
    "nvfp4",
]


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


def test_unknown_recipe_names_close_matches():
    with pytest.raises(fp8sim.UnknownNameError, match="did you mean 'deepseek-v3'") as e:
        fp8sim.recipe("deepseek-v2")
    assert isinstance(e.value, ValueError) and "known recipes: " + ", ".join(NAMES) in str(e.value)


def test_accumulators_come_from_the_tensorcore_registry():
    from fp8sim.gemms.recipes import BF16_ACCUMULATORS, accumulator_names
    from fp8sim.tensorcore import model_names

    names = accumulator_names()
    assert names == [i for a, i in model_names() if a == "sm90"] + ["fp64"]
    assert {"wgmma", "wgmma.f16", "mma.sync", "exact", "fp32", "fp64"} <= set(names)
    for a in names:
        if a in BF16_ACCUMULATORS:  # the BF16 datapath takes bf16 operands only
            assert Recipe("t", x_format="bf16", w_format="bf16", accumulator=a).accumulator == a
            continue
        assert Recipe("t", accumulator=a).accumulator == a


def test_is_int_refuses_bools():
    from fp8sim.gemms.recipes import is_int

    assert is_int(3) and is_int(np.int64(3)) and not is_int(True) and not is_int(np.bool_(True)) and not is_int(3.0)


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
    r2 = r.with_(promote_every=64)
    assert r2.promote_every == 64 and r.promote_every == 128


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
        dict(x_format="e5m6"),  # 12 bits: not an 8-bit tensor-core operand
        dict(x_format="e2m1", w_format="e2m1"),
        dict(x_format="e8m0"),
        dict(x_format="fp16", w_format="fp16"),
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


def test_lookup_suggests_close_names():
    with pytest.raises(fp8sim.UnknownNameError, match="did you mean 'deepseek-v3'"):
        fp8sim.recipe("deepseek-v4")


# ------------------------------------------------------------- issue #18 items 12 and 14
def test_any_8bit_format_or_format_object():
    custom = fp8sim.Format("e4m3b6", 4, 3, 6, nan=fp8sim.NanStyle.OCP)
    for f, stored in [
        ("e4m3fnuz", "e4m3fnuz"),
        ("E5M2FNUZ", "e5m2fnuz"),
        ("float8_e4m3fn", "e4m3"),
        ("e3m4", "e3m4"),
        (fp8sim.E4M3, "e4m3"),
        (fp8sim.E5M2FNUZ, "e5m2fnuz"),
        (custom, custom),
    ]:
        r = Recipe("t", x_format=f, w_format=f, grad_format=f, backward_promote_every=128)
        assert r.x_format == stored and r.w_format == stored and r.grad_format == stored and r.is_fp8
        assert r.backward().x_format == stored
    assert Recipe("t", x_format=fp8sim.BF16, w_format="bf16").x_format == "bf16"


@pytest.mark.parametrize(
    "bad,exc,match",
    [
        (dict(margin=0.5), TypeError, "margin must be an int"),
        (dict(margin=True), TypeError, "margin must be an int"),
        (dict(margin="1"), TypeError, "margin must be an int"),
        (dict(x_granularity="1x12B"), fp8sim.UnknownNameError, "x_granularity: unknown granularity '1x12B'"),
        (dict(w_granularity=128), TypeError, "w_granularity"),
        (dict(validated="no"), TypeError, "validated must be True or False"),
        (dict(validated=1), TypeError, "validated must be True or False"),
        (dict(x_format="e4m4"), fp8sim.UnknownNameError, "did you mean 'e4m3'"),
        (dict(x_format=3), TypeError, "x_format must be a format name"),
        (dict(output_format="bf17"), fp8sim.UnknownNameError, "did you mean 'bf16'"),
        (dict(scale_at="promotoin"), fp8sim.UnknownNameError, "did you mean 'promotion'"),
        (dict(accumulator="wgma"), fp8sim.UnknownNameError, "did you mean 'wgmma'"),
        (dict(accumulator=3), TypeError, "accumulator"),
        (dict(promote_every=128.0), ValueError, "promote_every"),
        (dict(promote_every="128"), ValueError, "promote_every"),
        (dict(promote_every=True), ValueError, "promote_every"),
        (dict(backward_promote_every=100), ValueError, "backward_promote_every"),
        (dict(promote_every=256), ValueError, "must divide the K scale block"),  # 1x128 blocks
        (dict(x_granularity="g16"), ValueError, "multiple of 32"),
        (dict(x_granularity="1x128", w_granularity="1x96"), ValueError, "do not nest"),
        (dict(x_granularity="col"), ValueError, "every K element its own scale"),
        (dict(w_granularity="nvfp4"), ValueError, "NVFP4"),
        (dict(x_granularity=fp8sim.scaling.Group(32, axis=0)), ValueError, "axis"),
        (dict(scale_format="fp8"), ValueError, "unknown scale_format"),
        (dict(scale_format="fp32", scale_rounding="ceil"), ValueError, "scale_rounding"),
        (dict(x_granularity="mx32", scale_format="fp32"), ValueError, "E8M0"),
        (dict(scale_at="epilogue", promote_every=None), ValueError, "epilogue"),
        (dict(grad_format="e5m2"), ValueError, "backward"),  # backward GEMMs: epilogue with tiles
        (dict(grad_format="bf16"), ValueError, "grad_format"),
        (dict(name=""), TypeError, "name"),
        (dict(epilogue_scale="ab"), fp8sim.UnknownNameError, "a-then-b"),
        (dict(split_order="tree"), fp8sim.UnknownNameError, "pairwise"),
        (dict(split_k=0), ValueError, "split_k must be an int >= 1"),
        (dict(split_k=2.0), ValueError, "split_k"),
        (dict(split_k=True), ValueError, "split_k"),
        (dict(split_granule=100), ValueError, "multiple of 32"),
        (dict(split_granule=16), ValueError, "split_granule must be an int >= 32"),
        (dict(split_k=2, split_granule=64), ValueError, "multiple of promote_every"),
        (dict(split_k=2, split_granule=256, x_granularity="1x512", w_granularity="512x512"), ValueError, "scale block"),
    ],
)
def test_bad_recipes_fail_at_construction(bad, exc, match):
    # everything gemm would refuse later is refused when the recipe is made
    with pytest.raises(exc, match=match):
        Recipe(**{"name": "bad", **bad})


def test_accepted_recipes_run():
    # recipes that the construction checks let through do run (edge cases of those checks)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    w = rng.standard_normal((256, 5)).astype(np.float32)
    for kw in [
        dict(margin=-1),
        dict(margin=np.int64(2)),
        dict(x_granularity="row", w_granularity="row", scale_at="epilogue", promote_every=None),
        dict(x_granularity="row", w_granularity="row", scale_at="epilogue", epilogue_scale="b-then-a", split_k=3),
        dict(split_k=2, split_granule=512, split_order="pairwise"),
        dict(x_granularity="tensor", w_granularity="tensor", scale_at="epilogue", split_k=16, split_order="reverse"),
        dict(x_granularity="g32", w_granularity="g128", promote_every=32),
        dict(x_granularity="mx32", w_granularity="mx32", scale_format="e8m0", promote_every=32),
        dict(x_granularity="1x256", w_granularity="128x128", promote_every=64),
        dict(x_format="e5m2", w_format="e4m3fnuz", grad_format="e5m2fnuz", backward_promote_every=128),
        dict(validated=True),
    ]:
        r = Recipe("ok", **kw)
        y = fp8sim.gemm(x, w, r)
        assert y.shape == (3, 5) and np.isfinite(y).all(), kw
        if r.grad_format is not None:
            assert np.isfinite(fp8sim.gemm(x, w, r.backward())).all()
