"""The recipes on the tensor cores beyond Hopper (issue 16), against compositions written out here.

Each GEMM must equal, bit for bit, the same computation spelled out step by step: quantization by
fp8sim.quantize, one ``fp8sim.tensorcore.mma`` per instruction along K (the accumulator chained
through C), the fp32 promotion / epilogue arithmetic and the output cast.  The instruction
models themselves are checked against MMA-Sim in tests/test_arch_models.py.
"""

from __future__ import annotations

import numpy as np
import pytest

import fp8sim
import fp8sim.tensorcore as tc
from fp8sim.gemms.block_scaled import block_scaled_gemm
from fp8sim.gemms.presets import recipe
from fp8sim.gemms.recipes import Recipe
from fp8sim.intrinsics import fma32_array
from fp8sim.rounding import cast

NEW = ("deepseek-v3-blackwell", "mxfp8-blackwell", "mxfp4", "nvfp4")


def bits(y):
    return np.asarray(y, np.float32).view(np.uint32)


def inputs(M, K, N, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((K, N)).astype(np.float32)
    x[rng.random((M, K)) < 0.01] *= 40.0  # outliers: blocks of very different scales
    return x, w


def fma32(a, b, c):
    """fp32 fma(a, b, c) elementwise (one rounding)."""
    a, b, c = (np.ascontiguousarray(v, dtype=np.float32) for v in (a, b, c))
    out = np.empty(c.shape, np.float32)
    fma32_array(a.ravel(), b.ravel(), c.ravel(), out.reshape(-1))
    return out


def test_presets_are_labelled_emulated():
    for name in NEW:
        r = recipe(name)
        assert r.validated is False and "emulated, not validated on hardware" in r.description.lower(), name
    assert [recipe(n).block_scaled for n in NEW] == [False, True, True, True]


def test_deepseek_v3_on_blackwell_is_tcgen05_chained_with_fma_promotion():
    M, K, N = 6, 256, 5
    x, w = inputs(M, K, N, 1)
    y = fp8sim.gemm(x, w, "deepseek-v3-blackwell")
    # written out: 1x128 / 128x128 fp32 scales, tcgen05 kind::f8f6f4 per k32 from C = 0 within each
    # 128, then acc = fma(fp32(sa * sb), partial, acc)
    qx = fp8sim.quantize(x, "e4m3", "1x128", scale_format="fp32")
    qw = fp8sim.quantize(w, "e4m3", "128x128", scale_format="fp32")
    acc = np.zeros((M, N), np.float32)
    for kb in range(K // 128):
        part = np.zeros((M, N), np.float32)
        for k in range(kb * 128, kb * 128 + 128, 32):
            part = tc.mma(qx.codes[:, k : k + 32], qw.codes[k : k + 32], part, a_format="e4m3", b_format="e4m3",
                          instruction="tcgen05.mma", arch="sm100")  # fmt: skip
        sa = np.repeat(qx.scales[:, kb : kb + 1].astype(np.float32), N, axis=1)
        sb = np.repeat(qw.scales[kb : kb + 1, :].astype(np.float32), 128, axis=1)[:, :N]  # 128 columns a block
        acc = fma32((sa * sb).astype(np.float32), part, acc)
    want = cast(acc, "bf16", canonical_nan=True)
    assert (bits(y) == bits(want)).all()


def _chain(a, b, sa, sb, fmt, step, sfmt):
    """One block-scaled instruction per ``step`` of K, the accumulator chained through C."""
    M, N = a.shape[0], b.shape[1]
    blk = a.shape[1] // sa.shape[1]
    d = np.zeros((M, N), np.float32)
    for k in range(0, a.shape[1], step):
        s0, s1 = k // blk, (k + step) // blk
        d = tc.mma(a[:, k : k + step], b[k : k + step], d, a_format=fmt, b_format=fmt, instruction="tcgen05.mma",
                   arch="sm100", a_scale=sa[:, s0:s1], b_scale=sb[s0:s1], scale_format=sfmt)  # fmt: skip
    return d


def _e8m0(s):
    return (np.log2(s.astype(np.float64)).astype(np.int64) + 127).astype(np.uint8)


@pytest.mark.parametrize(("name", "fmt", "step"), [("mxfp8-blackwell", "e4m3", 32), ("mxfp4", "e2m1", 64)])
def test_mx_recipes_are_the_scaled_instruction_chained_along_k(name, fmt, step):
    M, K, N = 5, 192, 7
    x, w = inputs(M, K, N, 2)
    y = block_scaled_gemm(x, w, name)
    qx = fp8sim.quantize(x, fmt, "mx32")
    qw = fp8sim.quantize(np.ascontiguousarray(w.T), fmt, "mx32")  # w as (N, K): groups of 32 along K
    a, b = qx.codes, np.ascontiguousarray(qw.codes.T)
    d = _chain(a, b, _e8m0(qx.scales), np.ascontiguousarray(_e8m0(qw.scales).T), fmt, step, "ue8m0")
    assert (bits(y) == bits(cast(d, "bf16", canonical_nan=True))).all()


def test_nvfp4_is_ue4m3_per_16_in_the_mma_and_the_tensor_scale_as_alpha():
    M, K, N = 4, 128, 6
    x, w = inputs(M, K, N, 3)
    # 1x16 blocks on both operands (the preset's 16x16 weight blocks: tests/test_nvfp4_training.py)
    y = block_scaled_gemm(x, w, fp8sim.recipe("nvfp4").with_(name="nvfp4-1d", weight_2d_blocks=False))
    qx = fp8sim.quantize(x, "e2m1", "nvfp4")
    qw = fp8sim.quantize(np.ascontiguousarray(w.T), "e2m1", "nvfp4")
    ue4m3 = lambda s: s.astype(np.float32).astype(fp8sim.formats.format("e4m3").ml_dtype).view(np.uint8)  # noqa: E731
    d = _chain(qx.codes, np.ascontiguousarray(qw.codes.T), ue4m3(qx.scales), np.ascontiguousarray(ue4m3(qw.scales).T),
               "e2m1", 64, "ue4m3")  # fmt: skip
    alpha = np.float32(np.float32(qx.global_scale) * np.float32(qw.global_scale))
    want = cast((alpha * d).astype(np.float32), "bf16", canonical_nan=True)
    assert (bits(y) == bits(want)).all()
    # the result is an NVFP4 GEMM: close to the fp64 product at FP4 precision, far from exact
    ref = x.astype(np.float64) @ w
    err = np.linalg.norm(y - ref) / np.linalg.norm(ref)
    assert 0.01 < err < 0.3


def test_k_not_a_multiple_of_the_instruction_is_zero_padded():
    x, w = inputs(3, 80, 4, 4)  # 80 = 2.5 x 32: padded to 96 (mxf8f6f4) and 128 (mxf4)
    for name in ("mxfp8-blackwell", "mxfp4"):
        xp = np.concatenate([x, np.zeros((3, 48), np.float32)], axis=1)
        wp = np.concatenate([w, np.zeros((48, 4), np.float32)], axis=0)
        assert (bits(block_scaled_gemm(x, w, name)) == bits(block_scaled_gemm(xp, wp, name))).all(), name


def test_mismatched_formats_and_granularities_are_named():
    mx4 = "sm100:tcgen05.mma.kind::mxf4"
    with pytest.raises(ValueError, match="multiplies e2m1"):
        Recipe("bad", "e4m3", "e4m3", "mx32", "mx32", scale_format="e8m0", accumulator=mx4, promote_every=None,
               scale_at="epilogue")  # fmt: skip
    with pytest.raises(ValueError, match="takes ue8m0 per 32"):
        Recipe("bad", "e4m3", "e4m3", "nvfp4", "nvfp4", accumulator="sm100:tcgen05.mma.kind::mxf8f6f4",
               promote_every=None, scale_at="epilogue")  # fmt: skip
    with pytest.raises(ValueError, match="promote_every=None"):
        Recipe("bad", "e2m1", "e2m1", "mx32", "mx32", scale_format="e8m0", accumulator=mx4, promote_every=128)
    with pytest.raises(ValueError, match="8 bits|4 bits"):
        Recipe("bad", "e2m1", "e2m1", "tensor", "tensor", accumulator="wgmma")
    with pytest.raises(ValueError, match="no block-scaled accumulator"):
        block_scaled_gemm(np.ones((2, 32), np.float32), np.ones((32, 2), np.float32), "deepseek-v3")
    with pytest.raises(ValueError, match="accumulator"):
        Recipe("bad", accumulator="sm100:no-such-instruction")


def test_arch_accumulator_names_resolve_to_the_registry_models():
    r = recipe("deepseek-v3-blackwell")
    m = tc.get_model(r.accumulator)
    assert m is tc.get_model("tcgen05.mma.kind::f8f6f4", "sm100") and m.frac_bits == 25
    assert tc.get_model("cdna3:mfma").kind == "interleaved"


def test_study_orders_the_accumulators_by_their_bits():
    # uniform inputs, K = 4096, no promotion: Hopper's 13 bits lose percents (DeepSeek-V3 reports ~2 %,
    # the H200 7 %), Blackwell's 25 and CDNA3's 24 bits lose about 2**-12 of that
    from fp8sim.studies.accumulators import compare_accumulators

    rows = compare_accumulators(Ks=(4096,), distributions=("uniform",), M=4, N=4, promotions=(None,))
    e = {r["accumulator"]: r["max_rel"] for r in rows}
    assert e["sm90 wgmma"] > 0.02
    assert e["sm100 tcgen05 f8f6f4"] < 1e-5 and e["cdna3 mfma"] < 1e-5


def test_report_section_compares_the_three_accumulators(tmp_path):
    from fp8sim import report

    assert list(report.STUDY_IDS).index("accelerators") == list(report.STUDY_IDS).index("accumulation") + 1
    cfg = {"accelerators": {"k_max": 1024, "size": 4, "distributions": ["uniform"]}}
    summary = report.build(tmp_path / "r", progress=False, studies=["accelerators"], config=cfg)
    sec = summary["sections"]["accelerators"]
    labels = ("sm90 wgmma", "sm100 tcgen05 f8f6f4", "cdna3 mfma")
    assert set(sec) == {f"uniform/{a}/{p}" for a in labels for p in ("none", 128)}
    assert all(v["K"] == 1024 for v in sec.values())
    # Hopper's 13 fraction bits lose far more than Blackwell's 25 and CDNA3's 24 without promotion
    assert sec["uniform/sm90 wgmma/none"]["median"] > 100 * sec["uniform/sm100 tcgen05 f8f6f4/none"]["median"]
    assert sec["uniform/sm90 wgmma/none"]["median"] > 100 * sec["uniform/cdna3 mfma/none"]["median"]
    page = (tmp_path / "r" / "index.html").read_text()
    assert "<h2>Accumulators by architecture: Hopper, Blackwell, CDNA3</h2>" in page
    assert "accelerators/accumulators_by_arch.png" in summary["files"]
    with pytest.raises(report.ConfigError, match="k_max"):
        report.validate_config({"accelerators": {"k_max": 64}})
