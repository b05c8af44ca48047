"""NVFP4 as TransformerEngine trains it: the random Hadamard transform, 16x16 weight blocks, stochastic
rounding of gradients, the block-scaled GEMM from quantized operands, and an nvfp4 training step.

The facts come from TransformerEngine's NVFP4 documentation and its NVFP4BlockScaling recipe: an E4M3
scale per 16 elements times an FP32 tensor scale amax / (6 * 448); 16x16 blocks for weights; a 16x16
random Hadamard transform of the Wgrad inputs; stochastic rounding of gradients only.
"""

from __future__ import annotations

import numpy as np
import pytest

import fp8sim
import fp8sim.tensorcore as tc
from fp8sim.gemms.block_scaled import block_scaled_gemm
from fp8sim.gemms.presets import PRESETS, recipe
from fp8sim.gemms.recipes import Recipe
from fp8sim.rounding import cast
from fp8sim.scaling import NVFP4, Tile
from fp8sim.scaling.hadamard import TE_SIGNS, hadamard_matrix, inverse_rht, rht, rht_matrix, rht_signs
from fp8sim.scaling.nvfp4 import nvfp4_global_scale, quantize_nvfp4_2d
from fp8sim.training import linear as L
from fp8sim.training.model import Context, ModelConfig, precision_for
from fp8sim.training.train import TrainConfig, train_one

TINY = TrainConfig(
    model=ModelConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64, context=16),
    batch=4,  # 64 tokens: Wgrad's K, a multiple of the transform's 16
    corpus_tokens=20000,
    warmup=3,
    eval_batches=1,
)


def bits(y):
    return np.asarray(y, np.float32).view(np.uint32)


def plain_nvfp4():
    """nvfp4 without TransformerEngine's three techniques."""
    return recipe("nvfp4").with_(name="nvfp4-plain", weight_2d_blocks=False, wgrad_rht=False, grad_rounding="rne")


# ------------------------------------------------------------------ random Hadamard transform
@pytest.mark.parametrize("n", [1, 2, 4, 8, 16, 32, 64])
def test_hadamard_matrix_is_orthogonal_with_entries_pm1(n):
    h = hadamard_matrix(n).astype(np.int64)
    assert set(np.unique(h)) <= {-1, 1}
    assert np.array_equal(h @ h.T, n * np.eye(n, dtype=np.int64))  # H H^T = n I, exactly (integers)


def test_rht_matrix_is_orthogonal_and_the_signs_are_te_s_or_the_seed_s():
    r = rht_matrix(16)
    assert np.array_equal(r @ r.T, np.eye(16))  # entries +-1/4: the float64 products and sums are exact
    assert np.array_equal(rht_signs(), TE_SIGNS) and rht_signs() is not TE_SIGNS
    assert np.array_equal(r, TE_SIGNS[:, None] * hadamard_matrix(16) / 4.0)  # S H / sqrt(16)
    assert np.array_equal(rht_signs(7), rht_signs(7))
    assert not np.array_equal(rht_signs(7), rht_signs(8))
    with pytest.raises(ValueError, match="pass a seed"):
        rht_signs(None, 8)
    with pytest.raises(ValueError, match="power of two"):
        hadamard_matrix(12)


def _bounded(rng, shape):
    """float32 values with magnitudes in [2**-8, 2**8): the transform's float64 sums are exact."""
    m = rng.uniform(1.0, 2.0, shape) * 2.0 ** rng.integers(-8, 8, shape)
    return (m * rng.choice([-1.0, 1.0], shape)).astype(np.float32)


@pytest.mark.parametrize("n", [1, 4, 16, 64])
@pytest.mark.parametrize("axis", [0, 1])
def test_rht_then_inverse_recovers_the_input_exactly(n, axis):
    rng = np.random.default_rng(n)
    x = _bounded(rng, (64, 128))
    for seed in (None, 3) if n == 16 else (3,):
        y = rht(x, axis=axis, n=n, seed=seed)
        assert y.dtype == np.float64
        back = inverse_rht(y, axis=axis, n=n, seed=seed)
        assert np.array_equal(back, x.astype(np.float64))
        # and it is the block-diagonal matrix product (the same values, the sums being exact)
        xm = np.moveaxis(x.astype(np.float64), axis, -1)
        want = (xm.reshape(xm.shape[:-1] + (-1, n)) @ rht_matrix(n, seed)).reshape(xm.shape)
        assert np.array_equal(y, np.moveaxis(want, -1, axis))


@pytest.mark.parametrize("n", [2, 8, 32])
def test_rht_of_other_powers_of_two_round_only_in_the_scaling(n):
    # 1/sqrt(n) is irrational for n = 2 * 4**j: the round trip is within a few ulps of each run's
    # largest element (the scaled sums round once each way), not exact
    x = _bounded(np.random.default_rng(1), (8, 64)).astype(np.float64)
    back = inverse_rht(rht(x, n=n, seed=5), n=n, seed=5)
    run_max = np.repeat(np.abs(x).reshape(8, -1, n).max(axis=-1), n, axis=1)
    assert np.all(np.abs(back - x) <= 4 * np.spacing(run_max))
    assert not np.array_equal(back, x)


def test_rht_keeps_the_gemm_and_spreads_an_outlier():
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((8, 64)), rng.standard_normal((64, 5))
    prod = rht(a, axis=1) @ rht(b, axis=0)  # (A R_bd)(R_bd^T B) = A B
    assert np.allclose(prod, a @ b, rtol=0, atol=1e-12)
    spike = np.zeros((1, 16))
    spike[0, 5] = 8.0
    assert np.array_equal(np.abs(rht(spike)), np.full((1, 16), 2.0))  # one element over all 16: 8 / 4
    with pytest.raises(ValueError, match="multiple of the transform size 16"):
        rht(np.ones((3, 40)), axis=1)


# ------------------------------------------------------------------ 16x16 weight blocks
def test_2d_blocks_give_w_and_wt_the_same_scales_and_codes():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((48, 80)).astype(np.float32)
    w[7, 33] = 40.0
    q, qt = quantize_nvfp4_2d(w), quantize_nvfp4_2d(np.ascontiguousarray(w.T))
    assert q.granularity == Tile(16, 16) and q.scales.shape == (3, 5) and q.scale_format == "e4m3"
    assert np.array_equal(q.scales, qt.scales.T) and np.array_equal(q.codes, qt.codes.T)
    assert q.global_scale == qt.global_scale
    assert np.array_equal(q.dequantize(), qt.dequantize().T)
    # 1x16 blocks along K do not have this property: W and W^T quantize differently
    q1 = fp8sim.quantize(w, "e2m1", "nvfp4")
    q1t = fp8sim.quantize(np.ascontiguousarray(w.T), "e2m1", "nvfp4")
    assert not np.array_equal(q1.dequantize(), q1t.dequantize().T)


@pytest.mark.parametrize("shape", [(32, 48), (40, 24)])
def test_a_16x16_block_is_nvfp4_of_its_256_elements_under_the_tensor_scale(shape):
    rng = np.random.default_rng(4)
    w = (rng.standard_normal(shape) * np.exp(rng.standard_normal(shape))).astype(np.float32)
    q = quantize_nvfp4_2d(w)
    amax = float(np.max(np.abs(w)))
    assert q.global_scale == float(np.float32(amax / (6 * 448)))  # TE's s_global = amax / (fp4_max * fp8_max)
    assert q.global_scale == nvfp4_global_scale(amax)
    for i in range(0, shape[0], 16):
        for j in range(0, shape[1], 16):
            tile = np.ascontiguousarray(w[i : i + 16, j : j + 16]).reshape(1, -1)  # ragged edges: smaller blocks
            r = fp8sim.quantize(tile, "e2m1", NVFP4(tile.size), amax=amax)
            assert r.scales.ravel()[0] == q.scales[i // 16, j // 16]
            assert np.array_equal(r.codes.reshape(-1), q.codes[i : i + 16, j : j + 16].reshape(-1))


# ------------------------------------------------------------------ stochastic rounding of gradients
def test_sr_of_nvfp4_gradients_is_unbiased_and_rne_is_not():
    rng = np.random.default_rng(5)
    g = (rng.standard_normal((4, 64)) * 1e-3).astype(np.float32)
    q0 = fp8sim.quantize(g, "e2m1", "nvfp4")
    step = np.repeat(q0.scales.astype(np.float64), 16, axis=1) * q0.global_scale  # element unit
    ok = np.abs(g / step) < 6  # not saturated (a saturated element is clipped in any mode)
    n = 600
    mean_sr = np.mean([fp8sim.quantize(g, "e2m1", "nvfp4", mode="sr", seed=s).dequantize() for s in range(n)], axis=0)
    # E2M1's spacing d is 0.5 below 2, 1 below 4, 2 below 6 (units of `step`); a draw lands on one of the
    # two neighbours, so its standard deviation is at most d / 2 and the mean of n draws lies within 5
    # standard deviations, 5 * d / 2 / sqrt(n), of x
    v = np.abs(g / step)
    d = np.where(v < 2, 0.5, np.where(v < 4, 1.0, 2.0)) * step
    bound = 5 * d / 2 / np.sqrt(n)
    assert np.all(np.abs(mean_sr - g)[ok] <= bound[ok])
    err_rne = np.abs(q0.dequantize() - g)  # RNE: the same value on every draw, biased
    assert np.count_nonzero((err_rne > bound)[ok]) > ok.sum() // 2


def test_sr_is_deterministic_for_a_seed_and_the_training_seeds_differ():
    g = np.random.default_rng(6).standard_normal((32, 32)).astype(np.float32)
    a = fp8sim.quantize(g, "e2m1", "nvfp4", mode="sr", seed=11)
    b = fp8sim.quantize(g, "e2m1", "nvfp4", mode="sr", seed=11)
    c = fp8sim.quantize(g, "e2m1", "nvfp4", mode="sr", seed=12)
    assert np.array_equal(a.codes, b.codes) and not np.array_equal(a.codes, c.codes)
    seeds = {L.sr_seed(0, s, name) for s in range(3) for name in ("l0:dy", "l0:dyT", "l1:dy")}
    assert len(seeds) == 9 and L.sr_seed(0, 1, "l0:dy") == L.sr_seed(0, 1, "l0:dy")
    assert all(0 <= v < 2**63 for v in seeds)


# ------------------------------------------------------------------ the recipe fields
def test_nvfp4_preset_has_te_s_techniques_and_other_presets_are_unchanged():
    r = recipe("nvfp4")
    assert (r.weight_2d_blocks, r.wgrad_rht, r.rht_seed, r.grad_rounding) == (True, True, None, "sr")
    assert r.backward().grad_rounding == "sr" and not r.validated
    for name, p in PRESETS.items():
        if name != "nvfp4":
            assert (p.weight_2d_blocks, p.wgrad_rht, p.rht_seed, p.grad_rounding) == (False, False, None, "rne"), name
    assert recipe("deepseek-v3") == Recipe("deepseek-v3", scale_format="fp32", validated=True)  # defaults compare equal


def test_training_fields_are_checked():
    with pytest.raises(ValueError, match="needs an NVFP4 recipe"):
        recipe("deepseek-v3").with_(weight_2d_blocks=True)
    with pytest.raises(ValueError, match="needs an NVFP4 recipe"):
        recipe("mxfp8-blackwell").with_(weight_2d_blocks=True)
    with pytest.raises(ValueError, match="not quantized"):
        recipe("bf16").with_(wgrad_rht=True)
    with pytest.raises(ValueError, match="grad_rounding"):
        recipe("nvfp4").with_(grad_rounding="rtz")
    with pytest.raises(TypeError, match="rht_seed"):
        recipe("nvfp4").with_(rht_seed=1.5)
    with pytest.raises(TypeError, match="wgrad_rht"):
        recipe("nvfp4").with_(wgrad_rht=1)
    assert recipe("deepseek-v3").with_(grad_rounding="stochastic", wgrad_rht=True).grad_rounding == "sr"


# ------------------------------------------------------------------ the GEMM from quantized operands
@pytest.mark.parametrize("name", ["nvfp4", "mxfp8-blackwell", "mxfp4"])
@pytest.mark.parametrize("K", [128, 80])
def test_block_scaled_matmul_is_block_scaled_gemm_on_the_same_quantization(name, K):
    rng = np.random.default_rng(K)
    x = rng.standard_normal((12, K)).astype(np.float32)
    w = rng.standard_normal((K, 10)).astype(np.float32)
    x[0, 3] = 50.0
    r = plain_nvfp4() if name == "nvfp4" else recipe(name)
    qa = L.quantize_operand(x, r.x_format, r.x_granularity, 1)
    qb = L.quantize_operand(w, r.w_format, r.w_granularity, 0)
    assert np.array_equal(bits(L.block_scaled_matmul(qa, qb, r)), bits(block_scaled_gemm(x, w, r)))


def test_gemm_of_nvfp4_quantizes_the_weight_in_16x16_blocks():
    """fp8sim.gemm(x, w, "nvfp4") is training's Fprop GEMM: x in 1x16 blocks, w in 16x16 blocks, and
    not the 1x16-weight GEMM (which differs on these inputs)."""
    rng = np.random.default_rng(21)
    x = rng.standard_normal((16, 96)).astype(np.float32)
    w = (rng.standard_normal((96, 32)) * np.exp(rng.uniform(-3, 3, (96, 32)))).astype(np.float32)
    y = fp8sim.gemm(x, w, "nvfp4")
    qx, qw = fp8sim.quantize(x, "e2m1", "nvfp4"), quantize_nvfp4_2d(w)
    assert np.array_equal(bits(y), bits(L.block_scaled_matmul(qx, qw, "nvfp4")))
    assert not np.array_equal(bits(y), bits(block_scaled_gemm(x, w, plain_nvfp4())))


def test_block_scaled_matmul_with_16x16_weights_is_the_scaled_mma_chain():
    rng = np.random.default_rng(8)
    M, K, N = 6, 128, 20
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((K, N)).astype(np.float32)
    qx, qw = fp8sim.quantize(x, "e2m1", "nvfp4"), quantize_nvfp4_2d(w)
    y = L.block_scaled_matmul(qx, qw, "nvfp4")
    # written out: UE4M3 codes per 16 along K (the 16x16 block's scale for each of its 16 columns), one
    # tcgen05.mma kind::mxf4nvf4 per k64 chained through C, alpha = fp32(gx * gw), bf16 RNE
    ue4m3 = lambda s: s.astype(np.float32).astype(fp8sim.formats.format("e4m3").ml_dtype).view(np.uint8)  # noqa: E731
    sa = ue4m3(qx.scales)
    sb = np.repeat(ue4m3(qw.scales), 16, axis=1)[:, :N]
    d = np.zeros((M, N), np.float32)
    for k in range(0, K, 64):
        d = tc.mma(qx.codes[:, k : k + 64], qw.codes[k : k + 64], d, a_format="e2m1", b_format="e2m1",
                   instruction="tcgen05.mma", arch="sm100", a_scale=np.ascontiguousarray(sa[:, k // 16 : k // 16 + 4]),
                   b_scale=np.ascontiguousarray(sb[k // 16 : k // 16 + 4]), scale_format="ue4m3")  # fmt: skip
    alpha = np.float32(np.float32(qx.global_scale) * np.float32(qw.global_scale))
    assert np.array_equal(bits(y), bits(cast((alpha * d).astype(np.float32), "bf16", canonical_nan=True)))


def test_matmul_with_stochastic_gradients_needs_a_seed():
    rng = np.random.default_rng(9)
    dy, w = rng.standard_normal((32, 48)).astype(np.float32), rng.standard_normal((32, 48)).astype(np.float32)
    with pytest.raises(ValueError, match="pass seed"):
        L.matmul(dy, w, "nvfp4", "dgrad", layout="nk")
    a = L.matmul(dy, w, "nvfp4", "dgrad", layout="nk", seed=1)
    assert np.array_equal(bits(a), bits(L.matmul(dy, w, "nvfp4", "dgrad", layout="nk", seed=1)))
    assert not np.array_equal(bits(a), bits(L.matmul(dy, w, "nvfp4", "dgrad", layout="nk", seed=2)))
    ref = dy.astype(np.float64) @ w.T.astype(np.float64)
    assert np.linalg.norm(a - ref) / np.linalg.norm(ref) < 0.3  # an FP4 GEMM


# ------------------------------------------------------------------ the Linear layer and training
def test_nvfp4_linear_quantizes_as_transformer_engine():
    rng = np.random.default_rng(10)
    T, d_in, d_out = 64, 32, 48
    lin = L.Linear.create("lin", "mlp_up", d_in, d_out, rng, 0.1)
    ctx = Context(precision_for("nvfp4"))
    ctx.sr_seed, ctx.step = 0, 3
    x = rng.standard_normal((T, d_in)).astype(np.float32)
    dy = (rng.standard_normal((T, d_out)) * 1e-3).astype(np.float32)
    lin.forward(x, ctx)
    lin.backward(dy, ctx)
    qx, qw, _ = lin.last_operands["fprop"]
    qdy, qwt, layout = lin.last_operands["dgrad"]
    qxt, qdyt, _ = lin.last_operands["wgrad"]
    # Fprop: activations 1x16 along D_in (RNE), weights 16x16 blocks (RNE)
    assert qx.granularity == NVFP4(16) and qx.mode == "rne"
    assert qw.granularity == Tile(16, 16) and qw.mode == "rne"
    assert np.array_equal(qw.codes, quantize_nvfp4_2d(lin.weight.value).codes)
    # Dgrad: dY 1x16 along D_out, stochastic; W^T is Fprop's quantized W (2D blocks: the same values)
    assert qdy.mode == "sr" and qwt is qw and layout == "nk"
    # Wgrad: both operands transformed along the tokens and quantized along them; dY stochastic
    assert qxt.mode == "rne" and qdyt.mode == "sr" and qdyt.granularity == NVFP4(16, axis=0)
    xt = rht(x.T, axis=1).astype(np.float32)
    assert np.array_equal(qxt.codes, fp8sim.quantize(xt, "e2m1", "nvfp4").codes)
    seed = L.sr_seed(0, 3, "lin:dyT")
    want = fp8sim.quantize(rht(dy, axis=0).astype(np.float32), "e2m1", NVFP4(16, axis=0), mode="sr", seed=seed)
    assert np.array_equal(qdyt.codes, want.codes)
    # the transform cancels in the product: dW is X^T dY up to the NVFP4 quantization
    ref = x.T.astype(np.float64) @ dy
    dw = lin.weight.grad
    assert np.linalg.norm(dw - ref) / np.linalg.norm(ref) < 0.3
    deq = qxt.dequantize(np.float64) @ qdyt.dequantize(np.float64)
    assert np.linalg.norm(dw - deq) / np.linalg.norm(deq) < 1e-5  # the GEMM of the quantized operands


def test_nvfp4_training_steps_run_and_repeat_bit_for_bit():
    a = train_one("nvfp4", 3, seed=0, config=TINY)
    b = train_one("nvfp4", 3, seed=0, config=TINY)
    c = train_one(plain_nvfp4(), 3, seed=0, config=TINY)
    assert np.all(np.isfinite(a.losses)) and a.nonfinite_steps == 0
    assert np.array_equal(a.losses, b.losses) and a.val_loss == b.val_loss
    assert not np.array_equal(a.losses, c.losses)  # the techniques change the numbers
