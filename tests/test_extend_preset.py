"""Adding a library preset through the public registration API only (docs/architecture.md's worked
example): cuBLASLt rowwise with fast accumulation and two split-K slices, registered with
``fp8sim.gemms.register_preset`` and then used by name through ``fp8sim.recipe``, ``fp8sim.gemm``
and ``fp8sim.scaled_gemm``.  The expected result is the same arithmetic spelled independently: each
K slice computed by the unsplit preset (the wgmma accumulator over the whole slice) on its own (unit scales, fp32 out), the slices summed in fp32,
then cuBLASLt's rowwise epilogue fp32(fp32(acc * sb) * sa) and the bf16 cast."""

import numpy as np
import pytest

import fp8sim
from fp8sim.gemms import PRESETS, register_preset
from fp8sim.rounding import cast

NAME = "cublaslt-row-fast-splitk2"


@pytest.fixture
def preset():
    r = register_preset(fp8sim.recipe("cublaslt-row-fast").with_(name=NAME, split_k=2, description="test preset"))
    yield r
    PRESETS.pop(NAME, None)


def _operands(M=24, K=384, N=40, seed=7):
    rng = np.random.default_rng(seed)
    # magnitudes spread over many binades, so that where K is cut changes the fp32 sums
    x = (rng.standard_normal((M, K)) * np.exp2(rng.integers(-6, 7, (M, K)))).astype(np.float32)
    w = (rng.standard_normal((K, N)) * np.exp2(rng.integers(-6, 7, (K, N)))).astype(np.float32)
    return x, w


def _independent(qa, qb):
    """The split-K result from the unsplit preset: slices [0, 256) and [256, 384) (cuBLASLt's layout
    for K = 384, two slices, granule 128: ceil(ceil(384/128)/2) = 2 granules per slice)."""
    one = fp8sim.recipe("cublaslt-row-fast").with_(output_format="fp32")
    M, N = qa.codes.shape[0], qb.codes.shape[1]
    ones_a, ones_b = np.ones((M, 1), np.float32), np.ones((1, N), np.float32)
    parts = [
        fp8sim.scaled_gemm(qa.codes[:, k0:k1], qb.codes[k0:k1], ones_a, ones_b, one)
        for k0, k1 in ((0, 256), (256, 384))
    ]
    acc = (parts[0] + parts[1]).astype(np.float32)
    sa = np.asarray(qa.scales, np.float32).reshape(M, 1)
    sb = np.asarray(qb.scales, np.float32).reshape(1, N)
    y = ((acc * sb).astype(np.float32) * sa).astype(np.float32)
    return cast(y, "bf16")


def test_registered_preset_is_found_by_name(preset):
    assert fp8sim.recipe(NAME) is preset
    assert fp8sim.recipe(NAME.upper()) is preset
    assert NAME in fp8sim.recipe_names()
    assert preset.split_k == 2 and preset.fprop.split_k.slices == 2
    assert preset.epilogue_scale == "b-then-a" and preset.promote_every is None


def test_registered_preset_runs_gemm_and_scaled_gemm(preset):
    x, w = _operands()
    qa, qb = fp8sim.gemms.operands.quantize_operands(x, w, NAME)
    want = _independent(qa, qb)
    got_gemm = np.asarray(fp8sim.gemm(x, w, NAME))
    got_scaled = fp8sim.scaled_gemm(qa.codes, qb.codes, qa.scales, qb.scales, NAME)
    np.testing.assert_array_equal(got_gemm.view(np.uint32), want.view(np.uint32))
    np.testing.assert_array_equal(got_scaled.view(np.uint32), want.view(np.uint32))
    # the split changes the fp32 accumulator: the preset is not the unsplit one under another name
    split32 = np.asarray(fp8sim.gemm(x, w, preset.with_(output_format="fp32")))
    unsplit32 = np.asarray(fp8sim.gemm(x, w, fp8sim.recipe("cublaslt-row-fast").with_(output_format="fp32")))
    assert (split32.view(np.uint32) != unsplit32.view(np.uint32)).any()


def test_register_preset_refuses_duplicates_unless_replace(preset):
    with pytest.raises(ValueError, match="exists"):
        register_preset(preset)
    with pytest.raises(ValueError, match="exists"):
        register_preset(fp8sim.recipe("deepseek-v3"))
    other = preset.with_(split_k=3)
    assert register_preset(other, replace=True) is other
    assert fp8sim.recipe(NAME).split_k == 3
    with pytest.raises(ValueError, match="lowercase"):
        register_preset(preset.with_(name="Mixed-Case"))
    with pytest.raises(TypeError, match="Recipe"):
        register_preset("cublaslt-row")  # type: ignore[arg-type]
