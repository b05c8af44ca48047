"""The PyTorch adapter (fp8sim.torch): its three GEMMs against fp8sim's numpy API bit for bit, gradients
against float64 finite differences, convert / Linear / plans, the errors it raises."""

from __future__ import annotations

import copy
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import fp8sim  # noqa: E402
import fp8sim.torch as ft  # noqa: E402
from fp8sim.gemms.recipes import Recipe  # noqa: E402
from fp8sim.scaling import DelayedScaling  # noqa: E402
from fp8sim.torch.stateful import is_stateful  # noqa: E402
from fp8sim.training.linear import Linear as NpLinear  # noqa: E402
from fp8sim.training.linear import Param, matmul, quantize_operand  # noqa: E402
from fp8sim.training.model import Context, precision_for  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FP8_PRESETS = [n for n in fp8sim.recipe_names() if fp8sim.recipe(n).is_fp8]
WIDE = ["bf16", "bf16-cublaslt", "fp32"]


# ------------------------------------------------------------------ utilities
def bits(a) -> np.ndarray:
    """The bit patterns of a float array (or tensor): equality of these is bit-identity (NaN, -0)."""
    if isinstance(a, torch.Tensor):
        a = a.detach()
        if a.dtype == torch.bfloat16:
            return a.view(torch.int16).numpy().copy()
        a = a.numpy()
    a = np.ascontiguousarray(a)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def assert_bits(a, b) -> None:
    a, b = bits(a), bits(b)
    assert a.shape == b.shape
    bad = np.flatnonzero(a.reshape(-1) != b.reshape(-1))
    assert bad.size == 0, f"{bad.size} of {a.size} elements differ, first at flat index {bad[:5]}"


def numpy_linear(x2: np.ndarray, w_nk: np.ndarray, dy2: np.ndarray, recipe):
    """fp8sim's numpy training Linear (master weight ``W = weight.T``): (y, dx, dW as (N, K))."""
    ctx = Context(precision_for(recipe, ("qkv",)))
    lin = NpLinear("l", "qkv", Param("l.weight", np.ascontiguousarray(w_nk.T)))
    y = lin.forward(x2, ctx)
    dx = lin.backward(dy2, ctx)
    return y, dx, lin.weight.grad.T


def data(T=48, K=160, N=96, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, K)).astype(dtype)
    w = (rng.standard_normal((N, K)) * 0.05).astype(dtype)
    dy = (rng.standard_normal((T, N)) * 1e-3).astype(dtype)
    b = rng.standard_normal(N).astype(dtype)
    return x, w, dy, b


def run(x, w, dy, recipe, bias=None, **kw):
    """ft.linear forward and backward: (y, dx, dw, db) tensors."""
    xt = x.clone().requires_grad_() if isinstance(x, torch.Tensor) else torch.tensor(x, requires_grad=True)
    wt = w.clone().requires_grad_() if isinstance(w, torch.Tensor) else torch.tensor(w, requires_grad=True)
    bt = None if bias is None else torch.tensor(bias, requires_grad=True)
    y = ft.linear(xt, wt, bt, recipe=recipe, **kw)
    y.backward(dy if isinstance(dy, torch.Tensor) else torch.tensor(dy))
    return y.detach(), xt.grad, wt.grad, None if bt is None else bt.grad


# ------------------------------------------------------------------ bit-identity with the numpy API
@pytest.mark.parametrize("recipe", FP8_PRESETS + WIDE)
def test_forward_and_gradients_match_numpy_linear(recipe):
    """Output, grad_x and grad_weight equal fp8sim.training.Linear's bit for bit (ragged blocks: K=160,
    N=96, 48 tokens), for every FP8 preset and the wide baselines; the input is batched (2, 24, K).
    A preset that the numpy Linear refuses on these shapes, the adapter refuses with the same error."""
    x, w, dy, _ = data()
    try:
        y_ref, dx_ref, dw_ref = numpy_linear(x, w, dy, recipe)
    except (TypeError, ValueError, NotImplementedError) as e:
        with pytest.raises(type(e)):
            run(x, w, dy, recipe)
        return
    state = ft.LayerState("l") if is_stateful(fp8sim.recipe(recipe)) else None  # seeds of numpy's layer "l"
    y, dx, dw, _ = run(x.reshape(2, 24, -1), w, dy.reshape(2, 24, -1), recipe, state=state)
    assert y.shape == (2, 24, 96) and dx.shape == (2, 24, 160) and dw.shape == (96, 160)
    assert_bits(y.reshape(48, 96), y_ref)
    assert_bits(dx.reshape(48, 160), dx_ref)
    assert_bits(dw, dw_ref)


@pytest.mark.parametrize("recipe", ["delayed", "nvfp4"])
def test_stateful_recipes_match_numpy_linear_over_steps(recipe):
    """Delayed scaling (amax histories that carry from step to step) and NVFP4 (stochastic rounding of
    gradients drawn per (seed, step, layer, operand)): ft.Linear over 4 steps against one
    fp8sim.training.Linear driven with the same seed and steps, bit for bit at every step."""
    if recipe == "delayed":
        r = fp8sim.recipe("deepseek-v3").with_(
            name="delayed",
            x_granularity=DelayedScaling(4),
            w_granularity=DelayedScaling(4),
            promote_every=128,
            scale_at="epilogue",
        )
    else:
        r = fp8sim.recipe(recipe)
    x, w, dy, _ = data(T=64, K=128, N=64, seed=11)
    ctx = Context(precision_for(r, ("qkv",)))
    ctx.sr_seed = 7
    ref = NpLinear("blk.l", "qkv", Param("blk.l.weight", np.ascontiguousarray(w.T)))
    mod = ft.Linear(128, 64, bias=False, recipe=r, name="blk.l", seed=7)
    assert mod.state is not None
    with torch.no_grad():
        mod.weight.copy_(torch.from_numpy(w))
    for step in range(4):
        scale = np.float32(2.0**step)  # amaxes that change: the history matters
        ctx.step = step
        ref.weight.grad[:] = 0
        y_ref = ref.forward(x * scale, ctx)
        dx_ref = ref.backward(dy * scale, ctx)
        xt = torch.from_numpy(x * scale).requires_grad_()
        mod.weight.grad = None
        y = mod(xt)
        y.backward(torch.from_numpy(dy * scale))
        assert_bits(y, y_ref)
        assert_bits(xt.grad, dx_ref)
        assert_bits(mod.weight.grad, ref.weight.grad.T)
    assert mod.state.step == 4


def test_stateful_recipe_needs_a_state():
    r = fp8sim.recipe("per-tensor").with_(name="delayed", x_granularity=DelayedScaling())
    x, w, dy, _ = data(T=16, K=64, N=32)
    with pytest.raises(ValueError, match="state=fp8sim.torch.LayerState"):
        ft.linear(torch.from_numpy(x), torch.from_numpy(w), recipe=r)
    with pytest.raises(TypeError, match="LayerState"):
        ft.linear(torch.from_numpy(x), torch.from_numpy(w), recipe=r, state={})


def test_fp64_recipe_on_float64_tensors_matches_numpy_linear():
    x, w, dy, _ = data(T=20, K=40, N=24, dtype=np.float64)
    y_ref, dx_ref, dw_ref = numpy_linear(x, w, dy, "fp64")
    y, dx, dw, _ = run(x, w, dy, "fp64")
    assert y.dtype == torch.float64
    assert_bits(y, y_ref)
    assert_bits(dx, dx_ref)
    assert_bits(dw, dw_ref)


def test_fprop_is_fp8sim_gemm_with_torch_layout():
    """The Fprop GEMM is fp8sim.gemm(x, weight, recipe, layout="nk") (the public GEMM)."""
    x, w, dy, _ = data(seed=3)
    for recipe in ("deepseek-v3", "cublaslt-row", "te-hybrid"):
        y, *_ = run(x, w, dy, recipe)
        assert_bits(y, fp8sim.gemm(x, w, recipe, layout="nk"))


def test_hybrid_gradients_are_e5m2():
    """te-hybrid: Dgrad quantizes dy to E5M2 (Recipe.backward()), not to the forward's E4M3."""
    x, w, dy, _ = data(seed=5)
    _, dx, _, _ = run(x, w, dy, "te-hybrid")
    r = fp8sim.recipe("te-hybrid")
    e5m2 = fp8sim.gemm(dy, w, r.backward(), layout="kn")
    e4m3 = fp8sim.gemm(dy, w, r.with_(grad_format=None, backward_promote_every=None, promote_every=128), layout="kn")
    assert_bits(dx, e5m2)
    assert not np.array_equal(bits(dx), bits(e4m3))


# ------------------------------------------------------------------ dtypes
def test_bfloat16_tensors():
    """bfloat16 x and weight: the GEMMs see their float32 values; y and grad_x are the BF16 outputs
    (exact), grad_weight is the FP32 Wgrad rounded to bfloat16 (RNE, checked with fp8sim.round)."""
    x, w, dy, _ = data(seed=1)
    xb, wb, dyb = (torch.tensor(a).to(torch.bfloat16) for a in (x, w, dy))
    y_ref, dx_ref, dw_ref = numpy_linear(xb.float().numpy(), wb.float().numpy(), dyb.float().numpy(), "deepseek-v3")
    y, dx, dw, _ = run(xb, wb, dyb, "deepseek-v3")
    assert y.dtype == dx.dtype == dw.dtype == torch.bfloat16
    assert_bits(y.float(), y_ref)
    assert_bits(dx.float(), dx_ref)
    assert_bits(dw.float(), fp8sim.round(np.asarray(dw_ref, np.float32), "bf16"))


def test_fp32_master_weights_with_bfloat16_activations():
    """Mixed dtypes (DeepSeek-V3's FP32 master weights, BF16 activations): grad_weight stays FP32."""
    x, w, dy, _ = data(seed=2)
    xb, dyb = torch.tensor(x).to(torch.bfloat16), torch.tensor(dy).to(torch.bfloat16)
    y_ref, dx_ref, dw_ref = numpy_linear(xb.float().numpy(), w, dyb.float().numpy(), "deepseek-v3")
    y, dx, dw, _ = run(xb, torch.tensor(w), dyb, "deepseek-v3")
    assert (y.dtype, dx.dtype, dw.dtype) == (torch.bfloat16, torch.bfloat16, torch.float32)
    assert_bits(y.float(), y_ref)
    assert_bits(dx.float(), dx_ref)
    assert_bits(dw, dw_ref)


# ------------------------------------------------------------------ bias
@pytest.mark.parametrize("recipe", ["deepseek-v3", "per-tensor", "cublaslt-row"])
def test_bias_is_added_before_the_output_cast(recipe):
    """y = round_bf16(fp32(acc + fp32(bias))) with acc the fp32 accumulator (fp8sim.gemm with fp32 output);
    grad_bias is the correctly rounded column sum of dy (math.fsum; the float64 sum of these values is
    exact); the GEMM gradients are those without bias."""
    x, w, dy, b = data(seed=4)
    r = fp8sim.recipe(recipe)
    y, dx, dw, db = run(x, w, dy, recipe, bias=b)
    _, dx0, dw0, _ = run(x, w, dy, recipe)
    acc = fp8sim.gemm(x, w, r.with_(output_format="fp32"), layout="nk")
    assert_bits(y, fp8sim.round(acc + b, "bf16"))
    assert_bits(dx, dx0)
    assert_bits(dw, dw0)
    fsum = np.array([math.fsum(dy[:, j].astype(np.float64)) for j in range(dy.shape[1])], np.float32)
    assert_bits(db, fsum)


def test_bias_on_the_bf16_baseline():
    """bf16 recipe with bias, on values whose products and sums are exact (multiples of 2**-9 below
    2**14): y = round_bf16(fp32(x W^T) + bias)."""
    rng = np.random.default_rng(15)
    x = (rng.integers(-16, 17, (12, 40)) / 8).astype(np.float32)
    w = (rng.integers(-16, 17, (10, 40)) / 64).astype(np.float32)
    b = rng.standard_normal(10).astype(np.float32)
    y, *_ = run(x, w, np.zeros((12, 10), np.float32), "bf16", bias=b)
    exact = (x.astype(np.float64) @ w.T.astype(np.float64)).astype(np.float32)
    assert_bits(y, fp8sim.round(exact + b, "bf16"))


# ------------------------------------------------------------------ gradients against finite differences
def test_fp64_recipe_passes_gradcheck():
    """The backward pass is the derivative of the forward pass: torch.autograd.gradcheck (float64 central
    differences) on the exact fp64 recipe, bias included."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 2, 5, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(4, 5, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w, b: ft.linear(x, w, b, recipe="fp64"), (x, w, b))


def test_bf16_gradients_against_float64_finite_differences():
    """bf16 recipe: grad_x, grad_weight and grad_bias against central differences in float64 of the exact
    loss L = sum(g * (x W^T + b)).  Tolerance from BF16 arithmetic (unit roundoff u = 2**-8): Dgrad rounds
    dy and W to BF16 (each product within 2u + u^2 of its exact value), sums in float64 and rounds the
    result to BF16 (u): |dx - dx*| <= 2.01 u (|g| |W|) + 1.01 u |dx*|; Wgrad writes FP32:
    |dW - dW*| <= 2.01 u (|g|^T |x|) + 2**-23 |dW*|; grad_bias is one FP32 rounding.  The central
    differences of this linear loss are exact to float64 rounding (1e-12 here)."""
    rng = np.random.default_rng(7)
    T, K, N = 6, 9, 5
    x, w, b = rng.standard_normal((T, K)), rng.standard_normal((N, K)), rng.standard_normal(N)
    x, w, b = (a.astype(np.float32).astype(np.float64) for a in (x, w, b))
    g = rng.standard_normal((T, N)).astype(np.float32).astype(np.float64)

    def loss(x, w, b):
        return float(np.sum(g * (x @ w.T + b)))

    def fd(f, a, h=1e-3):
        out = np.zeros_like(a)
        for i in np.ndindex(*a.shape):
            ap, am = a.copy(), a.copy()
            ap[i] += h
            am[i] -= h
            out[i] = (f(ap) - f(am)) / (2 * h)
        return out

    dx_fd = fd(lambda a: loss(a, w, b), x)
    dw_fd = fd(lambda a: loss(x, a, b), w)
    db_fd = fd(lambda a: loss(x, w, a), b)
    _, dx, dw, db = run(
        x.astype(np.float32), w.astype(np.float32), g.astype(np.float32), "bf16", bias=b.astype(np.float32)
    )
    u = 2.0**-8
    dx, dw, db = (t.numpy().astype(np.float64) for t in (dx, dw, db))
    assert np.all(np.abs(dx - dx_fd) <= 2.01 * u * (np.abs(g) @ np.abs(w)) + 1.01 * u * np.abs(dx_fd) + 1e-12)
    assert np.all(np.abs(dw - dw_fd) <= 2.01 * u * (np.abs(g).T @ np.abs(x)) + 2.0**-23 * np.abs(dw_fd) + 1e-12)
    assert np.all(np.abs(db - db_fd) <= 2.0**-24 * np.abs(db_fd) + 1e-12)


# ------------------------------------------------------------------ layouts and shapes
def test_non_contiguous_inputs_and_gradients():
    """A strided x, a transposed weight view and a non-contiguous incoming gradient give the bits of
    their contiguous copies."""
    x, w, dy, _ = data(seed=6)
    xs = torch.tensor(np.repeat(x, 2, axis=1))[:, ::2]  # strided view of x's values
    ws = torch.tensor(np.ascontiguousarray(w.T)).t()  # (N, K) view of a (K, N) tensor
    dys = torch.tensor(np.ascontiguousarray(dy.T)).t()
    assert not (xs.is_contiguous() or ws.is_contiguous() or dys.is_contiguous())
    got = run(xs, ws, dys, "deepseek-v3")
    want = run(x, w, dy, "deepseek-v3")
    for a, b in zip(got[:3], want[:3]):
        assert_bits(a, b)


def test_one_dimensional_input_and_empty_batch():
    x, w, dy, b = data(T=1, seed=8)
    y1 = ft.linear(torch.tensor(x[0]), torch.tensor(w), recipe="deepseek-v3")
    y2 = ft.linear(torch.tensor(x), torch.tensor(w), recipe="deepseek-v3")
    assert y1.shape == (96,)
    assert_bits(y1, y2[0])
    xe = torch.zeros(0, 3, 160, requires_grad=True)
    we = torch.tensor(w, requires_grad=True)
    be = torch.tensor(b, requires_grad=True)
    ye = ft.linear(xe, we, be)
    assert ye.shape == (0, 3, 96)
    ye.sum().backward()
    assert xe.grad.shape == xe.shape and not we.grad.any() and not be.grad.any()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lead=st.lists(st.integers(1, 3), min_size=0, max_size=2),
    K=st.integers(1, 200),
    N=st.integers(1, 140),
    recipe=st.sampled_from(["deepseek-v3", "per-tensor", "te-hybrid", "mxfp8", "cublaslt-row", "bf16"]),
    seed=st.integers(0, 2**16),
)
def test_shapes_property(lead, K, N, recipe, seed):
    """For any leading shape, K and N: the output has shape lead + (N,) and x's dtype, and output and
    gradients equal the numpy Linear's on the flattened tokens, bit for bit."""
    rng = np.random.default_rng(seed)
    T = int(np.prod(lead)) if lead else 1
    x = rng.standard_normal((T, K)).astype(np.float32)
    w = (rng.standard_normal((N, K)) * 0.1).astype(np.float32)
    dy = rng.standard_normal((T, N)).astype(np.float32)
    y, dx, dw, _ = run(x.reshape(*lead, K), w, dy.reshape(*lead, N), recipe)
    assert tuple(y.shape) == (*lead, N) and y.dtype == torch.float32
    y_ref, dx_ref, dw_ref = numpy_linear(x, w, dy, recipe)
    assert_bits(y.reshape(T, N), y_ref)
    assert_bits(dx.reshape(T, K), dx_ref)
    assert_bits(dw, dw_ref)


# ------------------------------------------------------------------ errors
def test_clear_errors():
    w = torch.randn(8, 16)
    x = torch.randn(4, 16)
    with pytest.raises(TypeError, match="float16"):
        ft.linear(x.half(), w)
    with pytest.raises(TypeError, match="int64"):
        ft.linear(x, torch.ones(8, 16, dtype=torch.int64))
    with pytest.raises(TypeError, match="torch.Tensor"):
        ft.linear(x.numpy(), w)
    with pytest.raises(ValueError, match="2-D"):
        ft.linear(x, torch.randn(16))
    with pytest.raises(ValueError, match="in_features = 16"):
        ft.linear(torch.randn(4, 12), w)
    with pytest.raises(ValueError, match=r"bias must have shape \(8,\)"):
        ft.linear(x, w, torch.randn(7))
    with pytest.raises(ValueError, match="empty"):
        ft.linear(torch.randn(4, 0), torch.randn(8, 0))
    with pytest.raises(ValueError, match="device 'meta'"):
        ft.linear(x.to("meta"), w.to("meta"))
    with pytest.raises(TypeError, match="strided"):
        ft.linear(x.to_sparse(), w)
    with pytest.raises(ValueError, match="delayed scaling"):  # a stateful recipe without its state
        ft.linear(x, w, recipe=fp8sim.recipe("per-tensor").with_(x_granularity=fp8sim.granularity("delayed")))
    with pytest.raises(ValueError, match="group_size replaces"):
        ft.linear(
            x, w, recipe=fp8sim.recipe("per-tensor").with_(x_granularity=fp8sim.granularity("delayed")), group_size=32
        )
    with pytest.raises(ValueError, match="recipe"):
        ft.linear(x, w, recipe="deepseek-v4")
    with pytest.raises(ValueError, match="multiple of 32 or divide it"):
        ft.linear(x, w, group_size=24)
    with pytest.raises(TypeError, match="cache"):
        ft.linear(x, w, cache="fp8")
    with pytest.raises(ValueError, match="fidelity"):
        ft.linear(x, w, fidelity="approx")


# ------------------------------------------------------------------ activation caches and groups
def test_fprop_activation_cache():
    """cache="fprop": Fprop and Dgrad unchanged; Wgrad reads the values of the Fprop quantization of x
    (1x128 E4M3, fp32 scales) re-quantized along the tokens -- the numpy API's matmul on those values."""
    x, w, dy, _ = data(seed=9)
    y, dx, dw, _ = run(x, w, dy, "deepseek-v3", cache="fprop")
    y0, dx0, dw0, _ = run(x, w, dy, "deepseek-v3")
    assert_bits(y, y0)
    assert_bits(dx, dx0)
    cached = quantize_operand(x, "e4m3", "1x128", 1, scale_format="fp32").dequantize(np.float32)
    assert_bits(dw, matmul(np.ascontiguousarray(cached.T), dy, "deepseek-v3", "wgrad").T)
    assert not np.array_equal(bits(dw), bits(dw0))


def test_e5m6_pow2_cache_of_the_post_attention_input():
    """ActivationCache("e5m6", "1x128", "pow2"): the cached values carry power-of-two scales and E5M6's
    6 fraction bits (relative error <= 2**-7 for normal values) and Wgrad reads them."""
    x, w, dy, _ = data(seed=10)
    q = fp8sim.quantize(x, "e5m6", "1x128", scale_format="pow2")
    assert np.all(np.log2(q.scales) == np.round(np.log2(q.scales)))
    cached = q.dequantize(np.float32)
    assert np.all(np.abs(cached - x) <= 2.0**-7 * np.abs(x))
    _, _, dw, _ = run(x, w, dy, "deepseek-v3", cache=ft.DEEPSEEK_ATTN_OUT_CACHE)
    assert_bits(dw, matmul(np.ascontiguousarray(cached.T), dy, "deepseek-v3", "wgrad").T)


def test_expand_groups_layout():
    a = np.arange(1, 41, dtype=np.float32).reshape(2, 20)
    e = ft.expand_groups(a, 1, 16)
    assert e.shape == (2, 64)
    assert np.array_equal(e[:, :16], a[:, :16]) and not e[:, 16:32].any()
    assert np.array_equal(e[:, 32:36], a[:, 16:]) and not e[:, 36:].any()
    assert np.array_equal(ft.expand_groups(a.T, 0, 16), e.T)


def test_group_recipe_fields():
    r = ft.group_recipe("deepseek-v3", 16)
    assert (r.x_granularity.name, r.w_granularity.name, r.promote_every, r.scale_at) == ("g32", "g32", 32, "promotion")
    h = ft.group_recipe("te-hybrid", 64)
    assert (h.x_granularity.name, h.promote_every, h.backward().promote_every) == ("g64", 64, 64)


def test_groups_of_16_scale_each_group_on_its_own():
    """Per-group scaling of 16: two groups of 16 along K (K=32) whose magnitudes differ by 2**12, integer
    values times powers of two with power-of-two scales.  Each group's codes are exact, its k32
    instruction (16 real codes, 16 zeros) sums exactly and the two scaled partials join fp32 in one FMA,
    so the output is the exact product rounded once to fp32.  Without the groups (one scale per 128)
    the small group underflows E4M3 and the result is not exact."""
    rng = np.random.default_rng(11)
    T, N = 8, 6
    x = rng.integers(-16, 17, (T, 32)).astype(np.float64)
    x[:, 0], x[:, 16] = 16, 16  # each group's amax is 16 (a power of two: exact codes)
    x[:, 16:] *= 2.0**-12
    w = rng.integers(-16, 17, (N, 32)).astype(np.float64)
    w[:, 0], w[:, 16] = 16, 16
    r = Recipe("pow2-test", "e4m3", "e4m3", "1x128", "128x128", scale_format="pow2", output_format="fp32")
    exact = (x @ w.T).astype(np.float32)
    xt, wt = torch.tensor(x, dtype=torch.float32), torch.tensor(w, dtype=torch.float32)
    assert_bits(ft.linear(xt, wt, recipe=r, group_size=16), exact)
    assert not np.array_equal(bits(ft.linear(xt, wt, recipe=r)), bits(exact))


def test_groups_run_in_the_backward_pass():
    """group_size=16 changes all three GEMMs; Fprop equals the g32 recipe on the expanded operands."""
    x, w, dy, _ = data(T=40, K=72, N=40, seed=12)
    y, dx, dw, _ = run(x, w, dy, "deepseek-v3", group_size=16)
    y0, dx0, dw0, _ = run(x, w, dy, "deepseek-v3")
    for a, b in ((y, y0), (dx, dx0), (dw, dw0)):
        assert not np.array_equal(bits(a), bits(b))
    g = ft.group_recipe("deepseek-v3", 16)
    assert_bits(y, fp8sim.gemm(ft.expand_groups(x, 1, 16), ft.expand_groups(w, 1, 16), g, layout="nk"))


# ------------------------------------------------------------------ modules, convert, plans
class Attn(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.q_proj = torch.nn.Linear(d, d)
        self.o_proj = torch.nn.Linear(d, d, bias=False)

    def forward(self, x):
        return self.o_proj(torch.tanh(self.q_proj(x)))


class Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.attn = Attn(d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 2 * d), torch.nn.GELU(), torch.nn.Linear(2 * d, d))
        self.gate = torch.nn.Linear(d, 4)

    def forward(self, x):
        h = x + self.attn(self.norm(x))
        return h + self.mlp(h) * torch.sigmoid(self.gate(h)).mean(-1, keepdim=True)


class Tiny(torch.nn.Module):
    def __init__(self, d=32, vocab=50):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        self.layers = torch.nn.ModuleList([Block(d), Block(d)])
        self.mha = torch.nn.MultiheadAttention(d, 2, batch_first=True)
        self.lm_head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, tok):
        x = self.embed(tok)
        for blk in self.layers:
            x = blk(x)
        x = x + self.mha(x, x, x, need_weights=False)[0]
        return self.lm_head(x)


def converted(model) -> set:
    return {n for n, mod in model.named_modules() if isinstance(mod, ft.Linear)}


def test_convert_nested_modules_with_default_skip():
    torch.manual_seed(0)
    m = Tiny()
    params = {n: p for n, p in m.named_parameters()}
    out = ft.convert(m, "deepseek-v3")
    assert out is m
    assert converted(m) == {f"layers.{i}.{s}" for i in (0, 1) for s in ("attn.q_proj", "attn.o_proj", "mlp.0", "mlp.2")}
    assert not isinstance(m.lm_head, ft.Linear) and not isinstance(m.layers[0].gate, ft.Linear)
    assert not isinstance(m.mha.out_proj, ft.Linear)  # MultiheadAttention reads its weights directly
    assert all(p is params[n] for n, p in m.named_parameters())  # the same Parameter objects
    assert m.layers[1].mlp[2].recipe.name == "deepseek-v3"
    assert "recipe='deepseek-v3'" in repr(m.layers[0].mlp[0])
    y = m(torch.randint(0, 50, (2, 7)))
    y.float().sum().backward()
    assert m.layers[0].attn.q_proj.weight.grad is not None
    assert ft.convert(m, "per-tensor") is m and m.layers[0].mlp[0].recipe.name == "deepseek-v3"  # converted once


def test_convert_skip_patterns_and_predicate():
    m = ft.convert(Tiny(), "per-tensor", skip=("layers.0.*", "*.mlp.2", "lm_head"))
    assert converted(m) == {"layers.1.attn.q_proj", "layers.1.attn.o_proj", "layers.1.mlp.0", "layers.1.gate"}
    m = ft.convert(Tiny(), "bf16", skip=lambda name, mod: mod.out_features != 32)
    assert converted(m) == {f"layers.{i}.{s}" for i in (0, 1) for s in ("attn.q_proj", "attn.o_proj", "mlp.2")}
    m = ft.convert(Tiny(), "bf16", skip=())
    assert isinstance(m.lm_head, ft.Linear) and isinstance(m.layers[0].gate, ft.Linear)


def test_convert_shared_module_and_bare_linear():
    lin = torch.nn.Linear(8, 8)
    seq = torch.nn.Sequential(lin, torch.nn.ReLU(), lin)
    ft.convert(seq, "per-tensor")
    assert isinstance(seq[0], ft.Linear) and seq[0] is seq[2]
    bare = torch.nn.Linear(8, 4)
    new = ft.convert(bare, "per-tensor")
    assert isinstance(new, ft.Linear) and new.weight is bare.weight


def test_state_dict_round_trip():
    """The converted model's state_dict loads (strict) into the original model class and back, with
    the same keys and values; the loaded original computes what the source original computes."""
    torch.manual_seed(1)
    orig = Tiny()
    conv = ft.convert(copy.deepcopy(orig), ft.plan("deepseek-v3"))
    sd = conv.state_dict()
    assert list(sd) == list(orig.state_dict())
    fresh = Tiny()
    fresh.load_state_dict(sd, strict=True)
    tok = torch.randint(0, 50, (2, 5))
    assert torch.equal(fresh(tok), orig(tok))
    conv2 = ft.convert(Tiny(), "deepseek-v3")
    conv2.load_state_dict(orig.state_dict(), strict=True)
    assert torch.equal(conv2(tok), ft.convert(copy.deepcopy(orig), "deepseek-v3")(tok))


def test_plan_deepseek_v3():
    p = ft.plan("deepseek-v3")
    assert p.recipe.name == "deepseek-v3" and p.activation_cache == "fprop"
    assert p.attn_out_cache == ft.ActivationCache("e5m6", "1x128", "pow2")
    assert (p.master_weights, p.optimizer_moments, p.group_size) == ("fp32", "bf16", None)
    m = Tiny().to(torch.bfloat16)
    ft.convert(m, p)
    o, q = m.layers[0].attn.o_proj, m.layers[0].attn.q_proj
    assert o.options.cache == ft.DEEPSEEK_ATTN_OUT_CACHE and q.options.cache == "fprop"
    assert q.weight.dtype == torch.float32 and m.lm_head.weight.dtype == torch.bfloat16  # FP32 masters
    y = m(torch.randint(0, 50, (2, 5)))
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert q.weight.grad.dtype == torch.float32
    assert ft.plan("deepseek-v3", group_size=16).group_size == 16
    assert ft.plan("per-tensor").activation_cache is None and ft.plan("per-tensor").recipe.name == "per-tensor"
    with pytest.raises(ValueError, match="master_weights"):
        ft.plan("deepseek-v3", master_weights="fp16")
    with pytest.raises(TypeError, match="predicate"):
        ft.Plan("deepseek-v3", skip=3)


def test_linear_module():
    base = torch.nn.Linear(160, 96)
    lin = ft.Linear.from_linear(base, "te-hybrid")
    assert isinstance(lin, torch.nn.Linear) and lin.weight is base.weight and lin.bias is base.bias
    x = torch.randn(5, 160)
    assert_bits(lin(x), ft.linear(x, base.weight, base.bias, recipe="te-hybrid"))
    new = ft.Linear(16, 8, bias=False, recipe="bf16", dtype=torch.float64)
    assert new.bias is None and new.weight.dtype == torch.float64 and new.recipe.name == "bf16"
    with pytest.raises(TypeError, match="nn.Linear"):
        ft.Linear.from_linear(torch.nn.ReLU())
    with pytest.raises(TypeError, match="nn.Module"):
        ft.convert("model")


def test_host_fallback_of_the_device_path():
    """_device_gemm (the CUDA path's host fallback) returns the host GEMM's bits on the tensor's device."""
    from fp8sim.torch.function import _device_gemm

    x, w, _, b = data(seed=13)
    opts = ft.options("deepseek-v3")
    y = _device_gemm(torch.tensor(x), torch.tensor(w), opts, "fprop", "nk", torch.tensor(b))
    assert y.device.type == "cpu"
    assert_bits(y, run(x, w, np.zeros((48, 96), np.float32), "deepseek-v3", bias=b)[0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_give_the_cpu_bits():
    x, w, dy, b = data(seed=14)
    cpu = run(x, w, dy, "deepseek-v3", bias=b)
    dev = [torch.tensor(a, device="cuda", requires_grad=True) for a in (x, w, b)]
    y = ft.linear(*dev, recipe="deepseek-v3")
    y.backward(torch.tensor(dy, device="cuda"))
    assert y.device.type == "cuda"
    for a, c in zip([y] + [t.grad for t in dev], cpu):
        assert_bits(a.cpu(), c)


# ------------------------------------------------------------------ packaging and the example
def test_fp8sim_imports_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import fp8sim; assert 'fp8sim.torch' not in sys.modules\n"
        "try:\n    import fp8sim.torch\nexcept ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert 'pip install "fp8sim[torch]"' in out.stdout


def run_example(name, *args):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_torch_linear_example():
    out = run_example("torch_linear.py")
    assert "converted 4 Linear layers" in out and "bit-identical to fp8sim.gemm: True" in out


@pytest.mark.slow
def test_hf_tiny_example():
    pytest.importorskip("transformers")
    out = run_example("hf_tiny.py")
    assert "converted" in out and "loss" in out


# ------------------------------------------------------------------ the torch backend of fp8sim train
def test_torch_gpt_training_is_reproducible(tmp_path):
    """Two steps of the torch GPT with bf16 and deepseek-v3 from one seed: the same losses twice, the
    files written, deepseek-v3's relative loss error against bf16 reported (small, not zero)."""
    from fp8sim.torch.gpt import GPTConfig, train

    cfg = GPTConfig(vocab=181, d_model=32, n_layers=1, n_heads=2, d_ff=64, context=16, batch=2, warmup=1)
    a = train(["deepseek-v3", "bf16"], 2, 0, tmp_path, config=cfg)
    b = train(["deepseek-v3", "bf16"], 2, 0, None, config=cfg)
    assert list(a["recipes"]) == ["bf16", "deepseek-v3"]  # the reference first

    def numbers(summary):  # everything but the timings
        return {r: {k: v for k, v in d.items() if k != "s_per_step"} for r, d in summary["recipes"].items()}

    assert numbers(a) == numbers(b)
    rel = a["recipes"]["deepseek-v3"]["rel_loss_error_vs_bf16"]["mean_abs"]
    assert 0 < rel < 0.01
    rows = (tmp_path / "losses.csv").read_text().splitlines()
    assert rows[0] == "step,bf16,deepseek-v3" and len(rows) == 3
    assert (tmp_path / "summary.json").exists()


def test_train_torch_cli_module(tmp_path, capsys):
    import argparse

    from fp8sim.cli.train_torch import add_arguments, run

    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--backend", "torch"])
    assert (args.backend, args.device) == ("torch", "cpu")
    args = argparse.Namespace(
        backend="torch",
        device="cpu",
        steps=1,
        seed=0,
        out=str(tmp_path / "o"),
        fidelity="fast",
        json=False,
        quiet=False,
        force=False,
    )
    assert run(args, ["bf16"]) == 0
    assert "torch backend on cpu: 1 steps" in capsys.readouterr().out


def _train_torch_cli(tmp_path, stderr_tty: bool) -> tuple[int, str, str]:
    """``fp8sim train --backend torch`` (2 steps) in a subprocess, stdout a pipe (as in ``... | cat``),
    stderr a pipe or a pseudo-terminal; returns the exit code, stdout and stderr."""
    cmd = [sys.executable, "-m", "fp8sim.cli", "train", "--backend", "torch", "--recipes", "bf16", "--steps", "2"]
    cmd += ["--fidelity", "fast", "--out", "o", "--force"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    if not stderr_tty:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
        return p.returncode, p.stdout, p.stderr
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))  # a 160-column terminal
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=slave, cwd=tmp_path, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # EIO once the child has closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    out = p.stdout.read().decode() if p.stdout else ""
    return p.wait(timeout=600), out, b"".join(chunks).decode(errors="replace")


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
def test_train_torch_cli_prints_no_step_lines_off_a_terminal(tmp_path):
    # the README: progress appears on a terminal only. The torch backend printed a line per step on
    # stdout, also into a pipe; now a tqdm bar on stderr, as the numpy backend's
    code, out, err = _train_torch_cli(tmp_path, stderr_tty=False)
    assert code == 0, err
    assert "torch backend on cpu: 2 steps" in out
    assert "step 1/2" not in out and "step 2/2" not in out, out
    assert "step" not in err, err
    code, out, err = _train_torch_cli(tmp_path, stderr_tty=True)  # `... | cat` on a terminal
    assert code == 0, err
    assert "step 1/2" not in out and "step 2/2" not in out, out
    assert "train" in err and "2/2" in err, err  # the bar, on the terminal
