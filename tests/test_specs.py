"""The typed specs of a Recipe (fp8sim.gemms.specs): composition, the flat shorthand, roles, and block
scaling as a property of the accumulator model."""

import dataclasses

import numpy as np
import pytest

import fp8sim
from fp8sim.gemms import GemmSpec, OperandSpec, Recipe, SplitK, TrainingSpec, WideAccumulator
from fp8sim.gemms.engine import run_codes
from fp8sim.gemms.operands import kernel_inputs, quantize_operands
from fp8sim.scaling import Granularity
from fp8sim.tensorcore import AccumulatorModel, archs, get_model


@pytest.mark.parametrize("name", fp8sim.recipe_names())
def test_every_preset_is_its_specs_and_its_flat_fields(name):
    r = fp8sim.recipe(name)
    assert Recipe(**r.flat()) == r and hash(Recipe(**r.flat())) == hash(r)
    assert Recipe(r.name, r.x, r.w, r.fprop, r.training, r.validated, r.description) == r
    assert dataclasses.replace(r, name=r.name) == r
    assert eval(repr(r), {"Recipe": Recipe}) == r  # the repr is the flat shorthand
    assert isinstance(r.x.granularity, Granularity) and r.x.spelling == r.x_granularity
    assert r.fprop.split_k == SplitK(r.split_k, r.split_granule, r.split_order)
    assert r.block_scaled == r.fprop.block_scaled == r.fprop.accumulator.block_scaled


def test_composed_recipe_equals_the_flat_shorthand():
    flat = Recipe("t", "e4m3", "e4m3", "1x128", "128x128", scale_format="fp32", split_k=2, split_granule=512)
    composed = Recipe(
        "t",
        x=OperandSpec("e4m3", "1x128", "fp32"),
        w=OperandSpec("e4m3", "128x128", "fp32"),
        fprop=GemmSpec("wgmma", promote_every=128, split_k=SplitK(2, granule=512)),
    )
    assert composed == flat and hash(composed) == hash(flat)
    assert composed.split_k == 2 and composed.split_granule == 512 and composed.scale_format == "fp32"
    assert flat.with_(fprop=GemmSpec("wgmma", promote_every=64, split_k=SplitK(2, 512))).promote_every == 64
    assert flat.with_(x=OperandSpec("e5m2", "1x128", "fp32")).x_format == "e5m2"
    # a flat keyword overrides a spec
    assert Recipe("t", x=OperandSpec("e4m3", "1x128", "fp32"), x_format="e5m2").x_format == "e5m2"
    # the checks are the recipe's, whichever way it is spelled
    with pytest.raises(ValueError, match="promote_every=256 must divide"):
        Recipe("t", fprop=GemmSpec("wgmma", promote_every=256), x=OperandSpec("e4m3", "1x128"))
    with pytest.raises(ValueError, match="same scale_format"):
        Recipe("t", x=OperandSpec("e4m3", "1x128", "fp32"), w=OperandSpec("e4m3", "128x128", "e8m0"))
    with pytest.raises(TypeError, match="unexpected keyword"):
        Recipe("t", promote=128)


def test_typed_accumulators():
    assert fp8sim.recipe("deepseek-v3").fprop.accumulator == get_model("wgmma")
    assert fp8sim.recipe("deepseek-v3").accumulator == "wgmma"  # the flat read is the name, as given
    assert fp8sim.recipe("fp64").fprop.accumulator == WideAccumulator("fp64")
    assert fp8sim.recipe("bf16").fprop.accumulator == WideAccumulator("fp32")  # numpy's float32 BLAS
    assert isinstance(fp8sim.recipe("bf16-cublaslt").fprop.accumulator, AccumulatorModel)
    assert fp8sim.recipe("deepseek-v3").with_(accumulator="fp64").fprop.accumulator.exact


def test_block_scaled_is_a_property_of_the_model():
    # every instruction of the table: block-scaled exactly when it takes scales
    for row in archs.ROWS:
        assert row.model.block_scaled == bool(row.scales), row
    key = "sm100:tcgen05.mma.kind::mxf4"
    model = get_model(key)
    by_model = fp8sim.recipe("mxfp4").with_(accumulator=model)
    assert by_model.accumulator is model and by_model.block_scaled
    assert not fp8sim.recipe("deepseek-v3").with_(accumulator=get_model("wgmma")).block_scaled
    # a block-scaled recipe built on the model object computes what the named one does
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((8, 128)).astype(np.float32), rng.standard_normal((128, 16)).astype(np.float32)
    want = np.asarray(fp8sim.gemm(x, w, "mxfp4"))
    got = np.asarray(fp8sim.gemm(x, w, by_model))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    # and its checks still apply: the instruction takes MX or NVFP4 block scales, not 1x128 blocks
    with pytest.raises(ValueError, match="folds block scales"):
        by_model.with_(x_granularity="1x128")


def test_roles():
    hy = fp8sim.recipe("te-hybrid")
    assert hy.gemm("fprop") is hy.fprop and hy.gemm("fprop").promote_every is None
    # TransformerEngine HYBRID: E5M2 gradients, dgrad/wgrad promoted every 128 with the scales in the epilogue
    assert hy.gemm("dgrad").promote_every == 128 and hy.gemm("dgrad").scale_at == "epilogue"
    assert hy.gemm("wgrad").output_format == "fp32" and hy.gemm("dgrad").output_format == "bf16"
    assert [o.format for o in hy.operands("dgrad")] == ["e5m2", "e4m3"]
    assert [o.format for o in hy.operands("wgrad")] == ["e4m3", "e5m2"]
    assert hy.role("dgrad") == hy.backward() and hy.role("dgrad") is hy.role("dgrad")
    nv = fp8sim.recipe("nvfp4")
    a, b = nv.operands("wgrad")
    assert a.rht and b.rht and a.rounding == "rne" and b.rounding == "sr"
    assert nv.operands("dgrad")[0].rounding == "sr" and not nv.operands("fprop")[0].rht
    assert [o.spelling for o in nv.operands("wgrad")] == ["nvfp4", "nvfp4"]
    assert fp8sim.recipe("fp64").gemm("wgrad").output_format == "fp64"
    assert fp8sim.recipe("deepseek-v3").training == TrainingSpec()
    with pytest.raises(ValueError, match="role must be one of"):
        hy.gemm("forward")


@pytest.mark.parametrize("name", ["deepseek-v3", "cublaslt-row-fast", "cublaslt-block"])
def test_run_codes_takes_the_gemm_spec(name):
    r = fp8sim.recipe(name).with_(split_k=2, split_granule=512)
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((16, 640)).astype(np.float32), rng.standard_normal((640, 24)).astype(np.float32)
    qx, qw = quantize_operands(x, w, r)
    A, B, sa, sb, ks = kernel_inputs(qx, qw, r.promote_every)
    by_recipe = run_codes(A, B, sa, sb, ks, qx.format, qw.format, r, K=640)
    by_spec = run_codes(A, B, sa, sb, ks, qx.format, qw.format, r.gemm("fprop"), K=640)
    np.testing.assert_array_equal(by_spec.view(np.uint32), by_recipe.view(np.uint32))
