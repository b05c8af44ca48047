"""fp8sim.gemm (fp8sim.gemms.api): the fast kernel against the validated tensor-core model, the captured
H200 GEMMs, hand-checkable cases, the error decomposition, padding and bad input."""

import fractions
import glob
import os

import ml_dtypes
import numpy as np
import pytest

import fp8sim
from fp8sim import tensorcore as tc
from fp8sim.gemms.engine import scaled_matmul
from fp8sim.gemms.error_report import SOURCES, GemmReport
from fp8sim.gemms.operands import kernel_inputs, padded_k, quantize_operands
from fp8sim.scaling import MX, Group, PerColumn, PerRow, PerTensor, Tile
from fp8sim.scaling.orientation import along_k, transpose_granularity
from fp8sim.tensorcore import load_capture

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")
CHAIN_FILES = sorted(glob.glob(os.path.join(DATA, "chain_*.npz")))


def bits_equal(x, y):
    x = np.asarray(x, np.float32)
    y = np.asarray(y, np.float32)
    return (x.view(np.uint32) == y.view(np.uint32)) | (np.isnan(x) & np.isnan(y))


def unit_scaled(a, b, fa, fb, promote):
    M, K = a.shape
    N = b.shape[1]
    return scaled_matmul(
        a,
        b,
        np.ones((M, 1), np.float32),
        np.ones((1, N), np.float32),
        a_format=fa,
        b_format=fb,
        kscale=K,
        promote_every=promote,
        scale_at="promotion" if promote else "epilogue",
    )


def random_codes(rng, shape, fmt, kind):
    c = rng.integers(0, 256, shape, dtype=np.uint8)
    v = fp8sim.decode(c, fmt)
    if kind == "finite":
        c[~np.isfinite(v)] = 0
    elif kind == "sparse_special":  # mostly finite, a few inf/NaN codes
        c[~np.isfinite(v)] = 1
        m = rng.random(shape) < 0.002
        specials = np.array([0x7F, 0xFF] if fmt == "e4m3" else [0x7C, 0xFC, 0x7E], np.uint8)
        c[m] = rng.choice(specials, m.sum())
    elif kind == "subnormal":  # exponent field 0 or 1: subnormals, the smallest normals, zeros
        c = c & (0x87 if fmt == "e4m3" else 0x87)
    elif kind == "wide":  # exponents far apart: alignment shifts and truncation
        c[~np.isfinite(v)] = 0
        c[rng.random(shape) < 0.05] &= 0x8F
    return c


# ----------------------------------------------------------- fast kernel == tensorcore.matmul
@pytest.mark.parametrize("fa,fb", [("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3"), ("e5m2", "e5m2")])
@pytest.mark.parametrize("kind", ["finite", "sparse_special", "subnormal", "wide"])
def test_fast_kernel_equals_tensorcore_matmul(fa, fb, kind):
    rng = np.random.default_rng(hash((fa, fb, kind)) % 2**32)
    M, K, N = 19, 256, 45
    a = random_codes(rng, (M, K), fa, kind)
    b = random_codes(rng, (K, N), fb, kind)
    for promote in (None, 64, 128):
        ref = tc.matmul(a, b, a_format=fa, b_format=fb, instruction="wgmma", promote_every=promote)
        got = unit_scaled(a, b, fa, fb, promote)
        assert bits_equal(ref, got).all(), (promote, int((~bits_equal(ref, got)).sum()))
    if kind == "sparse_special":
        assert np.isnan(ref).any() and np.isfinite(ref).any()


@pytest.mark.parametrize("path", CHAIN_FILES, ids=os.path.basename)
def test_fast_kernel_reproduces_chained_h200_tiles(path):
    cap = load_capture(path)
    assert not cap["c"].any()  # the chained captures start from C = 0
    a, b = cap["a"], cap["b"]
    assert bits_equal(unit_scaled(a, b, "e4m3", "e4m3", None), cap["d"]).all()
    assert bits_equal(unit_scaled(a, b, "e4m3", "e4m3", 128), cap["d_promote128"]).all()


def _slow_wgmma():
    # the wgmma preset with an explicit identity k-order: same arithmetic, forces the general path
    # (tensorcore.matmul per promotion interval + fp32 promotion in numpy)
    return tc.AccumulatorModel(**{**tc.get_model("wgmma").summary(), "k_order": tuple(range(32))})


@pytest.mark.parametrize("name", ["deepseek-v3", "per-tensor", "per-tensor-no-promotion", "mxfp8", "te-hybrid"])
def test_scaled_gemm_fast_path_equals_general_path(name):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((9, 300)).astype(np.float32)
    w = (rng.standard_normal((300, 140)) * np.exp(rng.normal(0, 2, (1, 140)))).astype(np.float32)
    r = fp8sim.recipe(name).with_(output_format="fp32")
    fast = fp8sim.gemm(x, w, r)
    general = fp8sim.gemm(x, w, r.with_(accumulator=_slow_wgmma()))
    assert bits_equal(fast, general).all()


# ----------------------------------------------------------- captured GPU GEMMs (H200)
GPU_CAPTURE = os.path.join(DATA, "gemm_sm90.npz")


def _gpu_cases():
    import gpu.gemm as gg

    return gg, {c[0]: c for c in gg.CASES}


def test_gpu_gemm_capture_complete():
    gg, cases = _gpu_cases()
    cap = load_capture(GPU_CAPTURE)
    names = {m["name"] for m in cap["meta"]}
    assert names == set(cases)
    sizes = {(m["M"], m["N"], m["K"]) for m in cap["meta"]}
    assert (4096, 4096, 4096) in sizes and any(k % 128 for _, _, k in sizes)
    assert os.path.getsize(GPU_CAPTURE) < 5e6
    # the CUDA-core emulation (backend="cupy") matched the tensor-core kernel on every output there
    assert all(m["cupy_emulation_mismatches"] == 0 for m in cap["meta"])


@pytest.mark.parametrize("name", [c[0] for c in __import__("gpu.gemm", fromlist=["CASES"]).CASES])
def test_gpu_gemm_outputs_reproduced_bit_for_bit(name):
    gg, cases = _gpu_cases()
    case = cases[name]
    cap = load_capture(GPU_CAPTURE)
    meta = next(m for m in cap["meta"] if m["name"] == name)
    qx, qw, r = gg.case_operands(case)
    assert gg.checksum(qx, qw) == meta["checksum"], "operands differ from the captured ones"
    rows = cap[f"{name}/rows"]
    xr = gg.take_rows(qx, rows)
    y32 = fp8sim.gemm(xr, qw, r.with_(output_format="fp32"))
    ybf = fp8sim.gemm(xr, qw, r)
    d32 = cap[f"{name}/d"].view(np.float32)
    dbf = (cap[f"{name}/d_bf16"].astype(np.uint32) << 16).view(np.float32)
    # strict bit patterns, NaNs included (the H200 writes 0x7fffffff / bf16 0x7fff)
    assert np.array_equal(y32.view(np.uint32), d32.view(np.uint32))
    assert np.array_equal(ybf.view(np.uint32), dbf.view(np.uint32))
    if "nan" in name:
        assert np.isnan(d32).any() and np.isfinite(d32).any()
    if name == "normal_256x256x512":
        # the promotion order matters: a separately rounded multiply-add is visibly different
        alt = fp8sim.gemm(xr, qw, r.with_(output_format="fp32", scale_application="mul-add"))
        assert (~bits_equal(alt, d32)).mean() > 0.2


# ----------------------------------------------------------- hand-checkable cases
def test_deepseek_hand_checkable_constant_matrices():
    # x = 2 everywhere: each 1x128 block has amax 2, scale fp32(2/448), every code is 448.
    # w = 1 everywhere: scale fp32(1/448), codes 448.  Each wgmma sums 32 products 448*448 exactly
    # (49 * 2**17); 4 instructions give 49 * 2**19; promotion: fma(fp32(sa*sb), 49*2**19, 0).
    x = np.full((3, 128), 2.0, np.float32)
    w = np.ones((128, 5), np.float32)
    sa, sb = np.float32(2.0 / 448), np.float32(1.0 / 448)
    s = np.float32(sa * sb)
    expect = np.float32(float(s) * 49 * 2**19)  # one rounding: fma with a zero addend
    y = fp8sim.gemm(x, w, fp8sim.recipe("deepseek-v3").with_(output_format="fp32"))
    assert (y == expect).all()
    ybf = fp8sim.gemm(x, w, "deepseek-v3")
    assert (ybf == np.float32(ml_dtypes.bfloat16(expect))).all()
    assert abs(float(expect) - 256.0) < 1e-4


def test_two_promotions_hand_checkable():
    # K = 256: two promotion intervals with different x scales (amax 4 then 1)
    x = np.concatenate([np.full((1, 128), 4.0), np.full((1, 128), 1.0)], axis=1).astype(np.float32)
    w = np.ones((256, 1), np.float32)
    s1 = np.float32(np.float32(4.0 / 448) * np.float32(1.0 / 448))
    s2 = np.float32(np.float32(1.0 / 448) * np.float32(1.0 / 448))
    p = 49 * 2**19
    t1 = np.float32(float(s1) * p)
    t2 = np.float32(fractions.Fraction(float(s2)) * p + fractions.Fraction(float(t1)))  # exact fma, one rounding
    y = fp8sim.gemm(x, w, fp8sim.recipe("deepseek-v3").with_(output_format="fp32"))
    assert y[0, 0] == t2


def _round_f32(q: fractions.Fraction) -> np.float32:
    """Correctly rounded (RNE) float32 of an exact rational."""
    f = np.float32(float(q))
    cands = [np.nextafter(f, np.float32(-np.inf)), f, np.nextafter(f, np.float32(np.inf))]
    best = min(cands, key=lambda c: (abs(fractions.Fraction(float(c)) - q), int(np.float32(c).view(np.uint32)) & 1))
    return np.float32(best)


def test_exact_accumulation_with_unit_scales_is_correctly_rounded():
    rng = np.random.default_rng(11)
    a = random_codes(rng, (6, 32), "e4m3", "wide")
    b = random_codes(rng, (32, 7), "e5m2", "wide")
    M, K = a.shape
    N = b.shape[1]
    y = scaled_matmul(
        a,
        b,
        np.ones((M, 1), np.float32),
        np.ones((1, N), np.float32),
        a_format="e4m3",
        b_format="e5m2",
        kscale=K,
        accumulator="exact",
        promote_every=None,
        scale_at="epilogue",
    )
    va = fp8sim.decode(a, "e4m3").astype(np.float64)
    vb = fp8sim.decode(b, "e5m2").astype(np.float64)
    for i in range(M):
        for j in range(N):
            q = sum(
                (fractions.Fraction(float(va[i, k])) * fractions.Fraction(float(vb[k, j])) for k in range(K)),
                fractions.Fraction(0),
            )
            assert y[i, j] == _round_f32(q), (i, j)


def test_fp64_recipe_and_bf16_baseline():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 50))
    w = rng.standard_normal((50, 3))
    y = fp8sim.gemm(x, w, "fp64")
    assert y.dtype == np.float64 and np.array_equal(y, x @ w)
    yb = fp8sim.gemm(x, w, "bf16")
    assert yb.dtype == np.float32
    assert np.array_equal(yb, yb.astype(ml_dtypes.bfloat16).astype(np.float32))  # bf16 values
    xb = x.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)
    wb = w.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)
    assert np.array_equal(yb, (xb @ wb).astype(ml_dtypes.bfloat16).astype(np.float32))


# ----------------------------------------------------------- layout, padding, bad input
def test_layout_nk_equals_kn():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((8, 200)).astype(np.float32)
    w = rng.standard_normal((200, 24)).astype(np.float32)
    for name in ("deepseek-v3", "mxfp8", "per-tensor"):
        assert bits_equal(fp8sim.gemm(x, w, name), fp8sim.gemm(x, np.ascontiguousarray(w.T), name, layout="nk")).all()


def test_k_not_multiple_of_block_is_zero_padded():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((5, 200)).astype(np.float32)
    w = rng.standard_normal((200, 9)).astype(np.float32)
    xp = np.pad(x, ((0, 0), (0, 56)))
    wp = np.pad(w, ((0, 56), (0, 0)))
    for name in ("deepseek-v3", "per-tensor", "per-tensor-no-promotion", "mxfp8"):
        assert bits_equal(fp8sim.gemm(x, w, name), fp8sim.gemm(xp, wp, name)).all()


def test_bad_input():
    x = np.ones((4, 64), np.float32)
    with pytest.raises(ValueError, match="inner dimensions differ"):
        fp8sim.gemm(x, np.ones((32, 8), np.float32))
    with pytest.raises(ValueError, match="2-D"):
        fp8sim.gemm(np.ones((2, 4, 64), np.float32), np.ones((64, 8), np.float32))
    with pytest.raises(ValueError, match="2-D"):
        fp8sim.gemm(np.ones(64, np.float32), np.ones((64, 8), np.float32))
    with pytest.raises(TypeError, match="float"):
        fp8sim.gemm(np.ones((4, 64), np.int32), np.ones((64, 8), np.float32))
    with pytest.raises(ValueError, match="layout"):
        fp8sim.gemm(x, np.ones((64, 8), np.float32), layout="kk")
    with pytest.raises(ValueError, match="unknown recipe"):
        fp8sim.gemm(x, np.ones((64, 8), np.float32), "fp7")
    with pytest.raises(ValueError, match="backend"):
        fp8sim.gemm(x, np.ones((64, 8), np.float32), backend="tpu")


def test_nan_and_inf_inputs():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((4, 256)).astype(np.float32)
    w = rng.standard_normal((256, 8)).astype(np.float32)
    x[1, 3] = np.nan  # NaN: its 1x128 block gets a NaN scale -> row 1 is NaN
    x[2, 200] = np.inf  # inf saturates to +448 * scale (OCP satfinite) -> finite
    y, rep = fp8sim.gemm(x, w, "deepseek-v3", report=True)
    assert np.isnan(y[1]).all() and np.isfinite(y[[0, 2, 3]]).all()
    assert y[1].view(np.uint32)[0] == 0x7FFF0000  # the canonical bf16 NaN
    assert rep.counts["x: saturated / underflowed / non-finite elements"][2] == 2
    w2 = w.copy()
    w2[5, 7] = np.nan  # NaN in w: its 128x128 block -> every output column 0..7 (one block) is NaN
    assert np.isnan(fp8sim.gemm(x[[0]], w2, "deepseek-v3")).all()


# ----------------------------------------------------------- decomposition
def _exact_operands(rng, M, K, N):
    """E4M3 values with amax 448 in every 1x128 / 128x128 block: all scales are exactly 1."""
    x = fp8sim.decode(random_codes(rng, (M, K), "e4m3", "finite"), "e4m3").astype(np.float32)
    w = fp8sim.decode(random_codes(rng, (K, N), "e4m3", "finite"), "e4m3").astype(np.float32)
    x[:, ::128] = 448.0
    w[::128, ::128] = 448.0
    w[::128, :] = 448.0
    return x, w


def test_decomposition_terms_vanish_when_sources_are_off():
    rng = np.random.default_rng(8)
    x, w = _exact_operands(rng, 6, 256, 10)
    r = fp8sim.recipe("per-tensor-no-promotion").with_(
        x_granularity="1x128", w_granularity="128x128", scale_at="promotion", promote_every=128
    )
    qx, qw = quantize_operands(x, w, r)
    assert (qx.scales == 1).all() and (qw.scales == 1).all()
    off = r.with_(accumulator="fp64", output_format="fp64")
    y, rep = fp8sim.gemm(x, w, off, report=True)
    assert isinstance(rep, GemmReport) and set(rep.terms) == set(SOURCES)
    for k in ("x_quantization", "w_quantization", "scale_rounding", "accumulation", "output_cast"):
        assert rep.terms[k]["rel_frobenius"] == 0.0, k
    ref = x.astype(np.float64) @ w.astype(np.float64)
    assert np.abs(y - ref).max() <= 2**-22 * np.abs(ref).max()  # only the fp32 promotion rounds
    _, rep = fp8sim.gemm(
        x,
        w,
        off.with_(promote_every=None, scale_at="epilogue", x_granularity="tensor", w_granularity="tensor"),
        report=True,
    )
    assert rep.terms["promotion"]["rel_frobenius"] == 0.0
    # switching each source on makes its term non-zero
    rng = np.random.default_rng(9)
    x = rng.standard_normal((16, 512)).astype(np.float32)
    w = rng.standard_normal((512, 32)).astype(np.float32)
    _, rep = fp8sim.gemm(x, w, "deepseek-v3", report=True)
    for k in SOURCES:
        assert rep.terms[k]["rel_frobenius"] > 0, k
    assert 1e-3 < rep.terms["x_quantization"]["rel_frobenius"] < 0.1
    assert rep.terms["accumulation"]["rel_frobenius"] < rep.terms["x_quantization"]["rel_frobenius"]
    assert rep.blocks["x"]["n_saturated"].shape == (16, 4) and rep.blocks["w"]["n_underflow"].shape == (4, 1)
    assert "deepseek-v3" in str(rep)


def test_mxfp8_has_no_scale_rounding_and_fast_mode_is_close():
    rng = np.random.default_rng(10)
    x = rng.standard_normal((16, 512)).astype(np.float32)
    w = rng.standard_normal((512, 32)).astype(np.float32)
    _, rep = fp8sim.gemm(x, w, "mxfp8", report=True)
    assert rep.terms["scale_rounding"]["rel_frobenius"] == 0.0  # power-of-two scales
    r = fp8sim.recipe("deepseek-v3").with_(output_format="fp32")
    exact = fp8sim.gemm(x, w, r)
    fast = fp8sim.gemm(x, w, r, fidelity="fast")
    dev = np.linalg.norm(fast - exact) / np.linalg.norm(exact)
    assert 0 < dev < 1e-3


def test_cupy_backend_requires_cupy_or_matches():
    rng = np.random.default_rng(12)
    x = rng.standard_normal((8, 256)).astype(np.float32)
    w = rng.standard_normal((256, 16)).astype(np.float32)
    try:
        import cupy  # noqa: F401

        cupy.cuda.runtime.getDeviceCount()
    except Exception:
        with pytest.raises((ImportError, RuntimeError), match="(?i)cupy|gpu|cuda"):
            fp8sim.gemm(x, w, backend="cupy")
        return
    assert bits_equal(fp8sim.gemm(x, w, backend="cupy"), fp8sim.gemm(x, w)).all()  # pragma: no cover


# ----------------------------------------------------------- accumulation study
def test_study_reproduces_h200_k4096_uniform_numbers():
    # U(0,1) e4m3 inputs without scaling, K = 4096: the H200 gave median 6.60 % without promotion
    # and 0.049 % with promotion every 128 (docs/tensorcore.md); a fresh 32 x 32 sample of the
    # same distribution must land close to both (the error is a systematic truncation bias).
    from fp8sim.studies.accumulation import H200_K4096, accumulate, errors, make_inputs

    x, w = make_inputs("uniform", 32, 4096, 32, np.random.default_rng(1))
    a = fp8sim.encode(x, "e4m3", saturate=True)
    b = fp8sim.encode(w, "e4m3", saturate=True)
    ref = fp8sim.decode(a, "e4m3").astype(np.float64) @ fp8sim.decode(b, "e4m3").astype(np.float64)
    no = errors(ref, accumulate(a, b, "wgmma", None))
    pr = errors(ref, accumulate(a, b, "wgmma", 128))
    assert abs(no["median_rel"] - H200_K4096[("uniform", "no promotion")]["median_rel"]) < 0.002
    assert abs(pr["median_rel"] - H200_K4096[("uniform", "promote 128")]["median_rel"]) < 0.00005
    assert no["max_rel"] > 3 * 0.02  # far above DeepSeek-V3's 'nearly 2%' for all-positive inputs


def test_promotion_must_divide_scale_block():
    x = np.ones((2, 256), np.float32)
    w = np.ones((256, 2), np.float32)
    with pytest.raises(ValueError, match="promote_every"):
        fp8sim.gemm(x, w, fp8sim.recipe("deepseek-v3").with_(promote_every=256))


# ----------------------------------------------------------- transposed quantized operands (layout="nk")
# (granularity of w (N, K) as torch stores it, its block there (None: all of that axis), the
# same blocks written for w.T (K, N), the recipe to multiply with)
_DS = fp8sim.recipe("deepseek-v3")
NK_CASES = [
    (Tile(256, 128), (256, 128), Tile(128, 256), _DS),
    ("1x128", (1, 128), Tile(128, 1), _DS),
    ("128x128", (128, 128), Tile(128, 128), _DS),
    ("tensor", (None, None), PerTensor(), _DS),
    ("row", (1, None), PerColumn(), _DS),
    ("g128", (1, 128), Group(128, axis=0), _DS),
    ("mx32", (1, 32), MX(32, axis=0), _DS.with_(promote_every=32, scale_format=None)),
]


def _dequant_by_hand(q, blk):
    """float64 decode(codes) * scale of each element's block (blk: block extents, None = whole axis)."""
    b = [n if e is None else e for n, e in zip(q.shape, blk)]
    s = np.repeat(np.repeat(q.scales.astype(np.float64), b[0], 0), b[1], 1)[: q.shape[0], : q.shape[1]]
    return fp8sim.decode(q.codes, q.format).astype(np.float64) * s


@pytest.mark.parametrize("g,blk,gt,r", NK_CASES, ids=[str(c[0]) for c in NK_CASES])
def test_nk_quantized_weights_keep_their_scales(g, blk, gt, r):
    # issue #18 item 7: a QuantizedTensor w (N, K) with layout="nk" kept its Tile label on the
    # transposed data (report rel. error 1.0 instead of 0.0016) or crashed (1x128)
    rng = np.random.default_rng(9)
    M, K, N = 8, 384, 272  # N ragged for the 256- and 128-row blocks
    x = rng.standard_normal((M, K)).astype(np.float32)
    wT = rng.standard_normal((N, K)).astype(np.float32)
    wT[:, 128:] *= 1000  # blocks along K differ by 1000x
    wT[200:] *= 0.01  # and along N by 100x
    qx = fp8sim.quantize(x, "e4m3", "1x128")
    qw = fp8sim.quantize(wT, "e4m3", g)
    y, rep = fp8sim.gemm(qx, qw, r, layout="nk", report=True)
    ref = _dequant_by_hand(qx, (1, 128)) @ _dequant_by_hand(qw, blk).T
    rel = np.linalg.norm(y - ref) / np.linalg.norm(ref)
    assert rel < 0.005  # bf16 output of the exact product of the quantized operands: ~2e-3
    assert rep.error["rel_frobenius"] == pytest.approx(rel, rel=1e-9)
    # the same blocks quantized in the (K, N) layout: the same codes and scales, the same bits out
    assert transpose_granularity(qw.granularity) == gt and transpose_granularity(gt) == qw.granularity
    qkn = fp8sim.quantize(np.ascontiguousarray(wT.T), "e4m3", gt)
    assert np.array_equal(qkn.codes, qw.codes.T) and np.array_equal(qkn.scales, qw.scales.T)
    y2, rep2 = fp8sim.gemm(qx, qkn, r, report=True)
    assert bits_equal(y, y2).all()
    assert rep2.error["rel_frobenius"] == pytest.approx(rel, rel=1e-9)
    # float operands with the recipe's w granularity spelled for (N, K): the same quantization
    rw = r.with_(w_granularity=g)
    assert bits_equal(fp8sim.gemm(qx, wT, rw, layout="nk"), y).all()
    assert bits_equal(fp8sim.gemm(qx, np.ascontiguousarray(wT.T), rw), y).all()


@pytest.mark.parametrize(
    "g", [Tile(256, 128), "1x128", "128x128", "3x5", "tensor", "row", "col", "g16", "mx32", "g8@0", "nvfp4"]
)
@pytest.mark.parametrize("shape", [(300, 200), (7, 130), (1, 64)])
def test_transpose_q_dequantizes_to_the_transpose(g, shape):
    from fp8sim.gemms.operands import transpose_quantized

    rng = np.random.default_rng(10)
    a = (rng.standard_normal(shape) * np.exp(rng.normal(0, 3, shape))).astype(np.float32)
    gg = fp8sim.granularity(g) if g != "g8@0" else Group(8, axis=0)
    q = fp8sim.quantize(a, "e2m1" if g == "nvfp4" else "e4m3", gg)
    t = transpose_quantized(q)
    assert t.shape == shape[::-1] and t.granularity == transpose_granularity(q.granularity)
    assert np.array_equal(t.dequantize(np.float64), q.dequantize(np.float64).T)


def test_transpose_granularity_table():
    assert transpose_granularity("1x128") == Tile(128, 1)
    assert transpose_granularity(Tile(3, 5)) == Tile(5, 3)
    assert transpose_granularity("row") == PerColumn() and transpose_granularity("col") == PerRow()
    assert transpose_granularity("g32") == Group(32, axis=0)
    assert transpose_granularity(Group(32, axis=0)) == Group(32, axis=-1)
    assert transpose_granularity("mx32") == MX(32, axis=0)
    assert transpose_granularity("tensor") == PerTensor()


@pytest.mark.parametrize("g", ["1x128", "128x128", Tile(256, 128), "tensor", "row", "g128", "mx32", "nvfp4"])
def test_gemm_and_training_orient_agree(g):
    from fp8sim.training.linear import orient

    assert along_k(g, "w") == orient(g, 0) == transpose_granularity(g)
    assert along_k(g, "x") == orient(g, 1) == fp8sim.granularity(g)
    d = fp8sim.granularity("delayed")
    assert along_k(d, "w") is d and orient(d, 0) is d  # a granularity with state stays the same object
    with pytest.raises(ValueError, match="operand"):
        along_k(g, "k")
    with pytest.raises(ValueError, match="k_axis"):
        orient(g, 2)


def test_kernel_inputs_pad_k_and_scales():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((5, 300)).astype(np.float32)
    w = rng.standard_normal((300, 7)).astype(np.float32)
    r = fp8sim.recipe("deepseek-v3")
    qx, qw = quantize_operands(x, w, r)
    assert padded_k(300, 128) == 384 and padded_k(300, None) == 320 and padded_k(64, 32) == 64
    A, B, sa, sb, kscale = kernel_inputs(qx, qw, r.promote_every)
    assert A.shape == (5, 384) and B.shape == (384, 7) and not A[:, 300:].any() and not B[300:].any()
    assert np.array_equal(A[:, :300], qx.codes) and np.array_equal(B[:300], qw.codes)
    assert kscale == 128 and sa.shape == (5, 3) and sb.shape == (3, 7)
    assert np.array_equal(sa, qx.scales) and np.array_equal(sb, np.repeat(qw.scales, 128, axis=1)[:, :7])


# ----------------------------------------------------------- other 8-bit formats (issue #18 item 14)
def _custom_e4m3_bias6():
    return fp8sim.Format("e4m3b6", 4, 3, 6, nan=fp8sim.NanStyle.OCP)


@pytest.mark.parametrize("fmt", ["e4m3fnuz", "e5m2fnuz", "e3m4", "custom"])
def test_recipe_with_other_8bit_formats(fmt):
    f = _custom_e4m3_bias6() if fmt == "custom" else fp8sim.format(fmt)
    r = fp8sim.Recipe("t", x_format=f, w_format=f, scale_format="pow2", output_format="fp32")
    assert r.x_format == (f if fmt == "custom" else fmt) and r.is_fp8
    # integers in -4..4 with power-of-two scales: x / scale is an integer times a power of two that
    # every one of these formats holds, so the codes are exact; the code products, aligned to the
    # largest (<= 16x) with 13 fraction bits, are exact in the wgmma accumulator, and so are their
    # sums and the power-of-two scaling: y is x @ w exactly
    rng = np.random.default_rng(11)
    M, K, N = 4, 256, 8
    x = rng.integers(-4, 5, (M, K)).astype(np.float32)
    w = rng.integers(-4, 5, (K, N)).astype(np.float32)
    y = fp8sim.gemm(x, w, r)
    assert np.array_equal(y, x.astype(np.float64) @ w.astype(np.float64))
    # the fast wgmma kernel against the general tensor-core path, random data, scaled blocks
    xr = rng.standard_normal((9, 300)).astype(np.float32)
    wr = (rng.standard_normal((300, 70)) * np.exp(rng.normal(0, 2, (1, 70)))).astype(np.float32)
    rr = fp8sim.recipe("deepseek-v3").with_(x_format=f, w_format=f, output_format="fp32")
    assert bits_equal(fp8sim.gemm(xr, wr, rr), fp8sim.gemm(xr, wr, rr.with_(accumulator=_slow_wgmma()))).all()


def test_gemm_refuses_quantized_operands_it_cannot_multiply():
    x = np.ones((2, 64), np.float32)
    q = fp8sim.quantize(x, "e5m6", "1x128")  # 12-bit codes: quantize works, the FP8 GEMM cannot
    with pytest.raises(ValueError, match="8-bit codes.*e5m6"):
        fp8sim.gemm(q, np.ones((64, 2), np.float32))
