"""Block-scaled GEMMs (MXFP8, MXFP4, NVFP4) at the edges: K shorter than a scale block, invalid
operand configurations, NaN under NVFP4's tensor scale, overflow of the tensor scales (issue 26).

The reference for a K that is not a multiple of the scale block is the hardware's rule: K is
zero-padded to whole blocks, the scale of the padded block comes from the amax of its real
elements.  So a GEMM must equal, bit for bit, the same GEMM on operands zero-padded along K by
hand.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fp8sim
import fp8sim.tensorcore as tc
from fp8sim.gemms.block_scaled import block_scaled_gemm, k_block
from fp8sim.gemms.presets import recipe
from fp8sim.scaling.nvfp4 import quantize_nvfp4_2d

BLOCK_SCALED = {"mxfp8-blackwell": 32, "mxfp4": 32, "nvfp4": 16}  # recipe -> scale block along K


def operands(M, K, N, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((K, N)).astype(np.float32)
    return x, w


def pad_to(a, axis, n):
    """``a`` zero-padded along ``axis`` to length ``n``."""
    widths = [(0, 0)] * a.ndim
    widths[axis] = (0, n - a.shape[axis])
    return np.pad(a, widths)


def round_up(k, b):
    return -(-k // b) * b


def assert_same(y, ref):
    """Bit for bit (NaN where NaN; +0 and -0 both zero)."""
    y, ref = np.asarray(y), np.asarray(ref)
    assert y.shape == ref.shape
    assert np.array_equal(y, ref, equal_nan=True), np.argwhere(~((y == ref) | (np.isnan(y) & np.isnan(ref))))[:5]


# ------------------------------------------------------------------ item 1: K below the scale block
@pytest.mark.parametrize("name", sorted(BLOCK_SCALED))
def test_gemm_equals_gemm_on_operands_zero_padded_along_k(name):
    """K = 1..70: fp8sim.gemm equals the GEMM on x, w zero-padded along K to whole blocks, and to
    one more (all-zero) block; for a K that is a multiple of the block the padding changes nothing."""
    b = BLOCK_SCALED[name]
    for K in range(1, 71):
        x, w = operands(4, K, 3, K)
        y = fp8sim.gemm(x, w, name)
        for Kp in (round_up(K, b), round_up(K, b) + b):
            yp = fp8sim.gemm(pad_to(x, 1, Kp), pad_to(w, 0, Kp), name)
            assert_same(y, yp)


def test_mxfp8_small_k_is_close_to_the_exact_product():
    """The issue's case, x (4, 20) @ w (20, 3) on mxfp8-blackwell, was off by 10**4; E4M3 with
    block scales and a bf16 output stays within a few percent of the float64 product."""
    rng = np.random.default_rng(0)
    for K in (9, 10, 17, 20, 31):
        x = rng.standard_normal((4, K)).astype(np.float32)
        w = rng.standard_normal((K, 3)).astype(np.float32)
        ref = x.astype(np.float64) @ w.astype(np.float64)
        y = fp8sim.gemm(x, w, "mxfp8-blackwell")
        assert np.max(np.abs(y - ref)) <= 0.05 * np.sqrt(K) * np.max(np.abs(x)) * np.max(np.abs(w)), K


@pytest.mark.parametrize("name", sorted(BLOCK_SCALED))
def test_mma_operands_of_a_short_k_are_those_of_the_zero_padded_k(name):
    """What goes into the MMA (codes, scale codes, tensor scale) for K = 1..70 is what goes in for the
    operands zero-padded by hand: the partial block's scale is the padded block's."""
    b = BLOCK_SCALED[name]
    for K in range(1, 71):
        x, w = operands(3, K, 2, 100 + K)
        _, p = block_scaled_gemm(x, w, name, return_parts=True)
        Kp = round_up(K, b)
        _, pp = block_scaled_gemm(pad_to(x, 1, Kp), pad_to(w, 0, Kp), name, return_parts=True)
        for key in ("a", "b", "sa", "sb"):
            assert np.array_equal(p[key], pp[key]), (K, key)
        assert p["alpha"] == pp["alpha"]


@pytest.mark.parametrize("name,kp", [("mxfp8-blackwell", 32), ("mxfp4", 64)])
def test_mx_gemm_is_the_tensorcore_matmul_on_padded_codes_and_the_partial_blocks_scale(name, kp):
    """The MX GEMM written out: fp8sim.quantize along K (a K shorter than 32 is one block, whose E8M0
    scale is from its own amax), the codes zero-padded to the instruction's K, the scale codes as
    quantize gives them (one more block of 2**0 where the padding adds a block), into
    fp8sim.tensorcore.matmul with the block scales: the GEMM's accumulator, for K = 1..70."""
    r = recipe(name)
    for K in range(1, 71):
        x, w = operands(3, K, 4, 200 + K)
        qx = fp8sim.quantize(x, r.x_format, "mx32")
        qw = fp8sim.quantize(w, r.w_format, fp8sim.scaling.MX(32, axis=-2))
        Kp = round_up(K, kp)
        nks = Kp // 32
        sa = np.pad(qx.scale_codes, ((0, 0), (0, nks - qx.scale_codes.shape[1])), constant_values=127)
        sb = np.pad(qw.scale_codes, ((0, nks - qw.scale_codes.shape[0]), (0, 0)), constant_values=127)
        acc = tc.matmul(
            pad_to(qx.codes, 1, Kp), pad_to(qw.codes, 0, Kp), a_format=r.x_format, b_format=r.w_format,
            instruction="tcgen05.mma", arch="sm100", a_scale=sa, b_scale=sb, scale_format="ue8m0",
        )  # fmt: skip
        _, p = block_scaled_gemm(x, w, name, return_parts=True)
        assert_same(acc, p["acc"])


def test_k_block_is_the_granularitys_not_the_clamped_block_shape():
    x = np.ones((3, 20), np.float32)
    qx = fp8sim.quantize(x, "e4m3", "mx32")
    assert qx.block_shape == (1, 20) and k_block(qx, 1) == 32
    qw = fp8sim.quantize(x.T.copy(), "e2m1", fp8sim.scaling.NVFP4(16, axis=-2))
    assert qw.block_shape == (16, 1) and k_block(qw, 0) == 16
    qt = quantize_nvfp4_2d(x[:, :10].T.copy())  # (10, 3): one 16x16 block, clamped to (10, 3)
    assert qt.block_shape == (10, 3) and k_block(qt, 0) == 16 and k_block(qt, 1) == 16


def test_blocks_the_instruction_does_not_take_are_refused():
    """An MX operand quantized with 16-element blocks on the MXFP8 MMA (which takes UE8M0 per 32): a
    ValueError naming the blocks, not a shape error from deeper down."""
    from fp8sim.gemms.block_scaled import block_scaled_gemm_quantized

    x, w = operands(2, 64, 3, 0)
    qx = fp8sim.quantize(x, "e4m3", "mx16")
    qw = fp8sim.quantize(w, "e4m3", fp8sim.scaling.MX(16, axis=-2))
    with pytest.raises(ValueError, match=r"scale blocks of 16 along K.*per 32"):
        block_scaled_gemm_quantized(qx, qw, "mxfp8-blackwell")


@pytest.mark.parametrize("name", ["cublaslt-block", "deepseek-v3"])
def test_scaled_gemm_with_block_scales_and_short_k_equals_zero_padded(name):
    """fp8sim.scaled_gemm with fp32 scales and a K that ends in a partial block: K = 1..70 (one block,
    rowwise x tensorwise scales) and K = 128 + 1..70 (1x128 x 128x128 blocks, the second partial):
    the codes zero-padded along K to whole blocks of 128 give the same output."""
    rng = np.random.default_rng(3)
    M, N = 3, 5
    for K in list(range(1, 71)) + [128 + k for k in (1, 5, 16, 17, 31, 32, 33, 64, 70)]:
        a = rng.integers(0, 0x7E, (M, K), dtype=np.uint8) | (rng.integers(0, 2, (M, K), dtype=np.uint8) << 7)
        b = rng.integers(0, 0x7E, (K, N), dtype=np.uint8)
        nkb = -(-K // 128)
        sa = rng.uniform(0.5, 2, (M, nkb)).astype(np.float32)
        sb = rng.uniform(0.5, 2, (nkb, 1)).astype(np.float32) if nkb > 1 else np.float32(1.5)
        y = fp8sim.scaled_gemm(a, b, sa, sb, name)
        yp = fp8sim.scaled_gemm(pad_to(a, 1, 128 * nkb), pad_to(b, 0, 128 * nkb), sa, sb, name)
        assert_same(y, yp)


# ------------------------------------------------------------------ item 1 through fp8sim.torch
def torch_recipes():
    nv = recipe("nvfp4").with_(grad_rounding="rne", wgrad_rht=False)  # padding-independent rounding
    return [recipe("mxfp8-blackwell"), recipe("mxfp4"), nv, nv.with_(weight_2d_blocks=False)]


@pytest.mark.parametrize("r", torch_recipes(), ids=["mxfp8", "mxfp4", "nvfp4-2d", "nvfp4-1d"])
@pytest.mark.parametrize("T,K,N", [(20, 20, 3), (5, 9, 10), (17, 31, 7), (3, 70, 12), (40, 6, 33)])
def test_torch_linear_small_dims_equal_zero_padded(r, T, K, N):
    """Fprop (K = in_features), Dgrad (K = out_features) and Wgrad (K = tokens) of fp8sim.torch.linear
    with dimensions below the scale block equal those of the linear on x, W, dy zero-padded to 64 in
    every dimension (restricted to the real part)."""
    torch = pytest.importorskip("torch")
    import fp8sim.torch as ft
    from fp8sim.torch.stateful import is_stateful

    rng = np.random.default_rng(T * 10000 + K * 100 + N)
    x = rng.standard_normal((T, K)).astype(np.float32)
    w = rng.standard_normal((N, K)).astype(np.float32)
    dy = rng.standard_normal((T, N)).astype(np.float32)

    def run(x, w, dy):
        xt = torch.tensor(x, requires_grad=True)
        wt = torch.tensor(w, requires_grad=True)
        state = ft.LayerState("l") if is_stateful(r) else None
        y = ft.linear(xt, wt, recipe=r, state=state)
        y.backward(torch.tensor(dy))
        return y.detach().numpy(), xt.grad.numpy(), wt.grad.numpy()

    y, dx, dw = run(x, w, dy)
    Tp, Kp, Np = round_up(T, 64), round_up(K, 64), round_up(N, 64)
    xp = pad_to(pad_to(x, 0, Tp), 1, Kp)
    wp = pad_to(pad_to(w, 0, Np), 1, Kp)
    dyp = pad_to(pad_to(dy, 0, Tp), 1, Np)
    yp, dxp, dwp = run(xp, wp, dyp)
    assert_same(y, yp[:T, :N])
    assert_same(dx, dxp[:T, :K])
    assert_same(dw, dwp[:N, :K])


def test_torch_wgrad_of_20_tokens_is_close_to_the_exact_gradient():
    """The issue's case: 20 tokens on mxfp8-blackwell gave a weight gradient with relative error 1.9e6."""
    torch = pytest.importorskip("torch")
    import fp8sim.torch as ft

    rng = np.random.default_rng(7)
    x = rng.standard_normal((20, 64)).astype(np.float32)
    w = rng.standard_normal((32, 64)).astype(np.float32)
    dy = rng.standard_normal((20, 32)).astype(np.float32)
    xt = torch.tensor(x, requires_grad=True)
    wt = torch.tensor(w, requires_grad=True)
    ft.linear(xt, wt, recipe="mxfp8-blackwell").backward(torch.tensor(dy))
    ref = dy.T.astype(np.float64) @ x.astype(np.float64)
    rel = np.linalg.norm(wt.grad.numpy() - ref) / np.linalg.norm(ref)
    assert rel < 0.1, rel


# ------------------------------------------------------------------ item 5: invalid configurations
@pytest.mark.parametrize("name", ["nvfp4", "mxfp4"])
def test_scaled_gemm_refuses_fp4_only_recipes(name):
    a = np.full((2, 32), 0x38, np.uint8)
    b = np.full((32, 3), 0x38, np.uint8)
    with pytest.raises(ValueError, match=r"multiplies e2m1 only.*cannot run this recipe"):
        fp8sim.scaled_gemm(a, b, np.float32(1), np.float32(1), name)


def test_scaled_gemm_block_scaled_recipe_checks_the_formats_its_mma_takes():
    a = np.full((2, 32), 0x38, np.uint8)
    b = np.full((32, 3), 0x38, np.uint8)
    with pytest.raises(ValueError, match=r"a_format='e4m3fnuz'"):
        fp8sim.scaled_gemm(a, b, np.float32(1), np.float32(1), "mxfp8-blackwell", a_format="e4m3fnuz")
    y = fp8sim.scaled_gemm(a, b, np.float32(1), np.float32(1), "mxfp8-blackwell")  # e4m3: its MMA takes it
    assert np.array_equal(y, np.full((2, 3), 32.0, np.float32))  # 32 products 1 * 1


@pytest.mark.parametrize("which", ["a_format", "b_format"])
def test_scaled_gemm_refuses_e8m0_operands(which):
    a = np.full((2, 32), 127, np.uint8)
    b = np.full((32, 3), 127, np.uint8)
    with pytest.raises(ValueError, match=rf"{which} 'e8m0' is not an element format"):
        fp8sim.scaled_gemm(a, b, np.float32(1), np.float32(1), "cublaslt-tensor", **{which: "e8m0"})


@pytest.mark.parametrize("instruction,arch", [("wgmma", "sm90"), ("exact", "sm90"), ("mma.sync", "sm89")])
def test_tensorcore_refuses_e8m0_operands(instruction, arch):
    a = np.full((2, 32), 127, np.uint8)
    b = np.full((32, 3), 0x38, np.uint8)
    with pytest.raises(ValueError, match=r"a_format 'e8m0' is not an operand format"):
        tc.matmul(a, b, a_format="e8m0", b_format="e4m3", instruction=instruction, arch=arch)
    with pytest.raises(ValueError, match=r"b_format 'e8m0' is not an operand format"):
        tc.matmul(b.T.copy(), a.T.copy(), a_format="e4m3", b_format="e8m0", instruction=instruction, arch=arch)
    with pytest.raises(ValueError, match=r"a_format 'e8m0' is not an operand format"):
        tc.mma(a, b, np.zeros((2, 3), np.float32), a_format="e8m0", b_format="e4m3", instruction=instruction, arch=arch)


# ------------------------------------------------------------------ item 6: NVFP4 and NaN
def test_nvfp4_nan_in_x_poisons_only_its_row_of_the_output():
    """A NaN in x makes its 1x16 block's scale NaN: output row 0 is NaN, the other rows are those of x
    with the NaN replaced by 0 (not the tensor's largest element, so the tensor scale is the same)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    w = rng.standard_normal((64, 40)).astype(np.float32)
    xn, x0 = x.copy(), x.copy()
    xn[0, 5], x0[0, 5] = np.nan, 0.0
    yn, y0 = fp8sim.gemm(xn, w, "nvfp4"), fp8sim.gemm(x0, w, "nvfp4")
    assert np.isnan(yn[0]).all()
    assert not np.isnan(yn[1:]).any()
    assert_same(yn[1:], y0[1:])


def test_nvfp4_nan_in_a_2d_weight_block_poisons_its_16_columns():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    w = rng.standard_normal((64, 40)).astype(np.float32)
    wn, w0 = w.copy(), w.copy()
    wn[20, 3], w0[20, 3] = np.nan, 0.0
    yn, y0 = fp8sim.gemm(x, wn, "nvfp4"), fp8sim.gemm(x, w0, "nvfp4")
    assert np.isnan(yn[:, :16]).all()
    assert_same(yn[:, 16:], y0[:, 16:])


def test_nvfp4_tensor_scale_skips_nan():
    """The tensor scale is fp32(amax / (6 * 448)) over the non-NaN elements, computed here in numpy;
    only the NaN's block has a NaN scale."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4, 48)).astype(np.float32)
    x[2, 33] = np.nan
    expect = float(np.float32(np.nanmax(np.abs(x)).astype(np.float64) / (6 * 448)))
    for q in (fp8sim.quantize(x, "e2m1", "nvfp4"), quantize_nvfp4_2d(x)):
        assert q.global_scale == expect
    q = fp8sim.quantize(x, "e2m1", "nvfp4")
    nan_blocks = np.argwhere(np.isnan(q.scales))
    assert nan_blocks.tolist() == [[2, 2]]
    d = q.dequantize()
    assert np.isnan(d[2, 32:48]).all() and np.isfinite(np.delete(d.reshape(-1), np.arange(2 * 48 + 32, 3 * 48))).all()
    # all NaN: every block NaN, the tensor scale finite (the amax of no element is 0, clamped)
    qa = fp8sim.quantize(np.full((2, 32), np.nan, np.float32), "e2m1", "nvfp4")
    assert np.isfinite(qa.global_scale) and np.isnan(qa.dequantize()).all()
    # an amax given as NaN is used as given
    assert np.isnan(fp8sim.quantize(np.nan_to_num(x), "e2m1", "nvfp4", amax=np.nan).global_scale)


# ------------------------------------------------------------------ RuntimeWarnings in block_gemm
def test_huge_nvfp4_tensor_scales_overflow_to_inf_without_warnings():
    """Both tensor scales near 2**113: their fp32 product (the GEMM's alpha) overflows to inf, as the
    fp32 multiply on the GPU does, and the exact product (64 * 9e76) is beyond fp32 too: +inf
    everywhere, with no RuntimeWarning."""
    big = np.full((4, 64), 3e38, np.float32)
    fp8sim.gemm(big / 1e30, big.T / 1e30, "nvfp4")  # compiled first: numba's compiler warns on its own
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = fp8sim.gemm(big, big.T.copy(), "nvfp4")
        _, parts = block_scaled_gemm(big, big.T.copy(), "nvfp4", return_parts=True)
    assert np.isposinf(parts["alpha"])
    assert np.isposinf(y).all()


def test_float64_amax_beyond_float32_is_stored_as_inf_without_warnings():
    """A float64 tensor with elements beyond float32's range: the float32 amax is +inf (the IEEE cast),
    the NVFP4 tensor scale is clamped to FLT_MAX (its documented range), a float16 dequantization of
    values beyond 65504 is +-inf; none of it may leak a RuntimeWarning (overflow)."""
    x = np.array([[1e300, -2.0, 0.5, 3.0] * 4], np.float64)
    flt_max = float(np.finfo(np.float32).max)

    def run(x, y):
        q = fp8sim.quantize(x, "e4m3", "row")
        qd = fp8sim.quantize(x, "e4m3", fp8sim.granularity("delayed"))
        qn = fp8sim.quantize(x, "e2m1", "nvfp4")
        q2 = quantize_nvfp4_2d(x)
        h = fp8sim.quantize(y, "e4m3", "row").dequantize(np.float16)
        return q, qd, qn, q2, h

    run(x / 1e299, np.array([[1.0, 1.0]], np.float32))  # compiled first: numba's compiler warns on its own
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        q, qd, qn, q2, h = run(x, np.array([[1e5, 1.0]], np.float32))
    assert np.isposinf(q.amax).all() and np.isposinf(qd.amax).all() and np.isposinf(q2.amax).all()
    assert qn.global_scale == flt_max and q2.global_scale == flt_max
    assert np.isposinf(h[0, 0]) and np.isfinite(h[0, 1])
