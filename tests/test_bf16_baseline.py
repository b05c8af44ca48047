"""torch's BF16 GEMM on an H200 (torch 2.11, cuBLASLt 13.1), bit for bit: fp8sim.tensorcore.wide.

The captures (tests/data/libraries_sm90.npz, keys ``<set>/abf``, ``<set>/wbf``, ``<set>/y/torch_bf16_*``)
hold sampled rows of X and W and the matching outputs of ``X @ W.T`` (bf16 out) and of
``torch.mm(..., out_dtype=torch.float32)``.  The model: wgmma m64nNk16 chained along K (C and the 16
products of one instruction in one fused sum, 25 fraction bits, truncation, fp32 truncation), split-K
slices added in fp32, bf16 output by RNE.  Zero tolerance.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

import numpy as np
import pytest

from fp8sim.tensorcore import matmul as tc_matmul
from fp8sim.tensorcore.model import AccumulatorModel
from fp8sim.tensorcore.wide import MODEL_WGMMA_BF16, bf16_matmul

DATA = os.path.join(os.path.dirname(__file__), "data")
SETS = ["mid256_normal", "sq4096_outlier", "skinny64_normal", "ragged200x336_normal"]

#: split-K slices of cuBLASLt's bf16 kernels (kernel names with "splitK" + splitKreduce in the json);
#: the slices are ceil(ceil(K / 64) / S) * 64 elements long, the last one shorter
SPLIT_K = {"mid256_normal": 3, "skinny64_normal": 12}
GRANULE = 64


@pytest.fixture(scope="module")
def captures():
    z = np.load(os.path.join(DATA, "libraries_sm90.npz"))
    meta = json.load(open(os.path.join(DATA, "libraries_sm90.json")))
    return z, meta


def slices(K: int, S: int) -> list[tuple[int, int]]:
    granules = -(-K // GRANULE)
    size = -(-granules // S) * GRANULE
    return [(k, min(K, k + size)) for k in range(0, K, size)]


def emulate(a, w, S: int) -> np.ndarray:
    """fp32 result of X @ W.T: each K slice on the wgmma model, the slices summed in fp32 in order."""
    acc = None
    for k0, k1 in slices(a.shape[1], S):
        part = bf16_matmul(a[:, k0:k1], w[:, k0:k1], MODEL_WGMMA_BF16, b_transposed=True)
        acc = part if acc is None else (acc + part).astype(np.float32)
    return acc


def to_bf16(x: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 bits, RNE (finite inputs)."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def test_slices_rule():
    assert slices(4096, 3) == [(0, 1408), (1408, 2816), (2816, 4096)]
    assert slices(16384, 12)[-1] == (15488, 16384) and len(slices(16384, 12)) == 12
    assert slices(1040, 1) == [(0, 1040)]


@pytest.mark.parametrize("name", SETS)
def test_torch_bf16_bit_exact(captures, name):
    z, meta = captures
    kernels = meta["sets"][name]["kernels"][name + "_bf16"]
    split = any("splitK" in k for k in kernels["torch_bf16_mm_f32"])
    assert split == (name in SPLIT_K)
    a, w = z[name + "/abf"], z[name + "/wbf"]
    assert a.shape[1] == meta["sets"][name]["K"]
    y = emulate(a, w, SPLIT_K.get(name, 1))
    np.testing.assert_array_equal(y.view(np.uint32), z[name + "/y/torch_bf16_mm_f32"])
    np.testing.assert_array_equal(to_bf16(y), z[name + "/y/torch_bf16_matmul"])


def test_nearest_alternatives_do_not_match(captures):
    """The captures do tell the parameters apart: 24 or 26 bits, or C added separately, fail."""
    z, _ = captures
    a, w = z["ragged200x336_normal/abf"], z["ragged200x336_normal/wbf"]
    y = z["ragged200x336_normal/y/torch_bf16_mm_f32"]
    # (c_mode="separate" runs on wide.py's own kernel, which has no e_zero and saturates an RZ
    # overflow: this normal data reaches neither)
    separate = {"c_mode": "separate", "zero_exponent": None, "overflow": "ieee"}
    for change in ({"frac_bits": 24}, {"frac_bits": 26}, separate, {"out_rounding": "rne"}):
        fields = {**MODEL_WGMMA_BF16.summary(), **change, "validated": False}
        got = bf16_matmul(a, w, AccumulatorModel(**fields), b_transposed=True)
        assert (got.view(np.uint32) == y).mean() < 0.6, change


def _bf16(x: np.ndarray) -> np.ndarray:
    return (np.asarray(x, np.float32).view(np.uint32) >> 16).astype(np.uint16)


def test_small_integers_exact():
    rng = np.random.default_rng(0)
    a = rng.integers(-4, 5, (9, 200))
    b = rng.integers(-4, 5, (200, 7))
    got = bf16_matmul(_bf16(a), _bf16(b), MODEL_WGMMA_BF16)
    assert got.dtype == np.float32 and got.shape == (9, 7)
    np.testing.assert_array_equal(got, (a @ b).astype(np.float32))


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"block": 8, "out_rounding": "rne", "align_rounding": "rd", "product_exponent": "normalized"},
        {"frac_bits": 13, "out_rounding": "rd"},
        {"c_mode": "separate", "out_rounding": "ru"},
    ],
)
def test_agrees_with_fp8_reference_kernel(fields):
    """On e5m2 values (exact in bf16, normal: subnormals normalised) the kernel equals fp8sim's bit-level kernel."""
    rng = np.random.default_rng(1)
    codes = [rng.integers(0, 256, shape).astype(np.uint8) for shape in ((6, 64), (64, 5))]
    for c in codes:
        e = (c >> 2) & 0x1F
        c[(e == 0x1F) | (e == 0)] = 0x3C
    # (no e_zero and IEEE overflow, as the bit-level kernel computes: e5m2 products are far from both)
    base = {**MODEL_WGMMA_BF16.summary(), "subnormal_exponent": "normalize", "validated": False,
            "zero_exponent": None, "overflow": "ieee"}  # fmt: skip
    model = AccumulatorModel(**{**base, **fields})
    if model.c_mode == "separate":  # C joins per k16 instruction here, per k32 instruction there: one instruction
        codes = [codes[0][:, :16], codes[1][:16]]
        codes = [np.concatenate([codes[0], np.zeros_like(codes[0])], axis=1), np.concatenate([codes[1], 0 * codes[1]])]
    # validated: fp8sim.tensorcore runs it on the sm90 bit-level kernel (a second implementation)
    ref = tc_matmul(codes[0], codes[1], a_format="e5m2", b_format="e5m2", instruction=replace(model, validated=True))
    as_bf16 = [_bf16((c.astype(np.uint16) << 8).view(np.float16).astype(np.float32)) for c in codes]
    got = bf16_matmul(as_bf16[0], as_bf16[1], model)
    np.testing.assert_array_equal(got.view(np.uint32), np.asarray(ref, np.float32).view(np.uint32))


def test_specials_and_padding():
    inf, nan = 0x7F80, 0x7FC1
    a = _bf16(np.ones((2, 20)))
    b = _bf16(np.ones((20, 3)))
    a[0, 19] = inf
    b[5, 1] = nan
    got = bf16_matmul(a, b, MODEL_WGMMA_BF16)
    assert got[0, 0] == np.inf and got[1, 0] == 20.0 and got[1, 2] == 20.0  # K = 20: zero padded to 32
    assert got[:, 1].view(np.uint32).tolist() == [MODEL_WGMMA_BF16.nan_bits] * 2
    big = _bf16(np.full((1, 16), 2.0**127))
    # 16 * 2^254 overflows: inf, as the H200's single wgmma instruction gives (tests/test_wide_h200.py),
    # although RZ in IEEE arithmetic would give FLT_MAX
    assert bf16_matmul(big, big.T.copy(), MODEL_WGMMA_BF16)[0, 0] == np.inf


def test_bad_input():
    x = np.zeros((2, 16), np.uint16)
    with pytest.raises(TypeError):
        bf16_matmul(x.astype(np.float32), x.T, MODEL_WGMMA_BF16)
    with pytest.raises(ValueError):
        bf16_matmul(x, x, MODEL_WGMMA_BF16)
    with pytest.raises(ValueError):
        bf16_matmul(x, x.T, AccumulatorModel(name="e", kind="exact"))
    # e_zero with a separate C: neither kernel computes it (refused, not computed without e_zero)
    sep = replace(MODEL_WGMMA_BF16, name="sep", c_mode="separate", validated=False)
    with pytest.raises(ValueError, match="needs the general kernels .* c_mode='separate'"):
        bf16_matmul(x, x.T, sep)


@pytest.mark.parametrize("name", SETS)
def test_bf16_cublaslt_recipe_through_gemm(captures, name):
    """The public path: fp8sim.gemm(x, w, "bf16-cublaslt" with cuBLASLt's split, layout="nk") on the
    captured bf16 operands gives torch's bf16 and fp32 outputs; numpy's BLAS baseline ("bf16") does
    not reproduce the fp32 bits (it is the fast option, not the GPU's arithmetic)."""
    import fp8sim

    z, _ = captures
    x = (z[name + "/abf"].astype(np.uint32) << 16).view(np.float32)
    w = (z[name + "/wbf"].astype(np.uint32) << 16).view(np.float32)
    r = fp8sim.recipe("bf16-cublaslt").with_(split_k=SPLIT_K.get(name, 1))
    assert r.split_granule == GRANULE
    y = fp8sim.gemm(x, w, r, layout="nk")
    np.testing.assert_array_equal(y.view(np.uint32), (z[name + "/y/torch_bf16_matmul"].astype(np.uint32) << 16))
    y32 = fp8sim.gemm(x, w, r.with_(output_format="fp32"), layout="nk")
    np.testing.assert_array_equal(y32.view(np.uint32), z[name + "/y/torch_bf16_mm_f32"])
    numpy32 = fp8sim.gemm(x, w, fp8sim.recipe("bf16").with_(output_format="fp32"), layout="nk")
    assert (numpy32.view(np.uint32) == z[name + "/y/torch_bf16_mm_f32"]).mean() < 0.2


def test_bf16_accumulator_needs_bf16_operands():
    import fp8sim

    with pytest.raises(ValueError, match="needs bf16"):
        fp8sim.Recipe("bad", x_format="e4m3", w_format="e4m3", accumulator="wgmma.bf16")


def test_report_against_the_hardware_bf16():
    """gemm(report=True, baseline="bf16-cublaslt") measures the FP8 GEMM against the BF16 GEMM the
    H200 computes; the default stays numpy's BLAS; a baseline that is not BF16 is refused."""
    import fp8sim

    rng = np.random.default_rng(4)
    x = rng.standard_normal((16, 512)).astype(np.float32)
    w = rng.standard_normal((512, 8)).astype(np.float32)
    _, rep_np = fp8sim.gemm(x, w, "deepseek-v3", report=True)
    _, rep_hw = fp8sim.gemm(x, w, "deepseek-v3", report=True, baseline="bf16-cublaslt")
    y_fp8 = fp8sim.gemm(x, w, "deepseek-v3").astype(np.float64)
    for rep, base in ((rep_np, "bf16"), (rep_hw, "bf16-cublaslt")):
        yb = fp8sim.gemm(x, w, base).astype(np.float64)
        want = np.linalg.norm(y_fp8 - yb) / np.linalg.norm(yb)
        assert rep.error_vs_bf16["rel_frobenius"] == pytest.approx(want, rel=1e-9), base
    assert rep_hw.error == rep_np.error
    with pytest.raises(ValueError, match="baseline"):
        fp8sim.gemm(x, w, "deepseek-v3", report=True, baseline="deepseek-v3")


def test_training_runs_the_bf16_tensorcore_model():
    """fp8sim.training's matmul runs "bf16-cublaslt" on the tensor-core model (as fp8sim.gemm does,
    split-K included), not on its deterministic float64 path for the BLAS baseline; a split on a
    BLAS recipe is refused."""
    import fp8sim
    from fp8sim.training.linear import matmul

    rng = np.random.default_rng(5)
    x = rng.standard_normal((8, 4096)).astype(np.float32)
    w = rng.standard_normal((4096, 8)).astype(np.float32)
    r = fp8sim.recipe("bf16-cublaslt").with_(output_format="fp32")
    for S in (1, 3):
        rs = r.with_(split_k=S)
        got = matmul(x, w, rs, "fprop")
        np.testing.assert_array_equal(got.view(np.uint32), fp8sim.gemm(x, w, rs).view(np.uint32))
    assert not np.array_equal(matmul(x, w, r.with_(split_k=3), "fprop"), matmul(x, w, r, "fprop"))
    batched = matmul(np.stack([x, 2 * x]), w, r, "fprop")
    np.testing.assert_array_equal(batched[1].view(np.uint32), fp8sim.gemm(2 * x, w, r).view(np.uint32))
    with pytest.raises(ValueError, match="split_k"):
        fp8sim.recipe("bf16").with_(split_k=2)
