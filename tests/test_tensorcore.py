"""fp8sim.tensorcore: bit-exact agreement with H200 captures, presets, validation.

The captures in tests/data/ were written by ``python -m gpu.capture`` on an
NVIDIA H200 (see docs/tensorcore.md).  Agreement must be 100% bit-exact
(NaN matches NaN), with no tolerance.
"""

from __future__ import annotations

import glob
import json
import os
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from fp8sim import tensorcore as tc

DATA = os.path.join(os.path.dirname(__file__), "data")
MMA_FILES = sorted(glob.glob(os.path.join(DATA, "wgmma*_*.npz")) + glob.glob(os.path.join(DATA, "mma.sync_*.npz")))
CHAIN_FILES = sorted(glob.glob(os.path.join(DATA, "chain_*.npz")))
DT = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}


def bits_equal(x, y):
    x = np.asarray(x, np.float32)
    y = np.asarray(y, np.float32)
    return (x.view(np.uint32) == y.view(np.uint32)) | (np.isnan(x) & np.isnan(y))


def dec(codes, fmt):
    return np.asarray(codes, np.uint8).view(DT[fmt]).astype(np.float64)


# ------------------------------------------------------------ hardware data
def test_capture_inventory():
    """Every instruction x format pair x family is present."""
    names = {os.path.basename(f) for f in MMA_FILES}
    for ins in ("wgmma", "mma.sync", "wgmma.f16"):
        for pair in ("e4m3xe4m3", "e4m3xe5m2", "e5m2xe4m3", "e5m2xe5m2"):
            for fam in ("normal", "wide", "cancel", "largec", "subnormal", "nearmax", "special"):
                assert f"{ins}_{pair}_{fam}.npz" in names
    assert {os.path.basename(f) for f in CHAIN_FILES} == {"chain_wgmma_e4m3_normal.npz", "chain_wgmma_e4m3_uniform.npz"}
    total = sum(os.path.getsize(f) for f in glob.glob(os.path.join(DATA, "*.npz")))
    assert total < 25 * 2**20


@pytest.mark.parametrize("path", MMA_FILES, ids=os.path.basename)
def test_single_instruction_captures_bit_exact(path):
    r = tc.verify_capture(path)
    assert r["meta"]["gpu"].startswith("NVIDIA")
    assert r["mismatches"] == 0, r["first_mismatches"]
    assert r["match_rate"] == 1.0


@pytest.mark.parametrize("path", CHAIN_FILES, ids=os.path.basename)
def test_chained_k4096_captures_bit_exact(path):
    """K = 4096 tile loops (128 wgmma per output), with and without promotion every 128."""
    cap = tc.load_capture(path)
    meta = cap["meta"]
    assert meta["kind"] == "chain" and meta["shape"][2] == 4096
    rows, cols = slice(0, 64), slice(0, 16)  # a 64x16 tile keeps the test fast
    a, b, c = cap["a"][rows], cap["b"][:, cols], cap["c"][rows, cols]
    d = tc.matmul(a, b, c, a_format="e4m3", b_format="e4m3", instruction="wgmma")
    assert bits_equal(d, cap["d"][rows, cols]).all()
    d128 = tc.matmul(a, b, c, a_format="e4m3", b_format="e4m3", instruction="wgmma", promote_every=128)
    assert bits_equal(d128, cap["d_promote128"][rows, cols]).all()
    # promotion changes the result (so the test can tell them apart)
    assert not bits_equal(d, d128).all()


def test_verify_capture_reports_mismatches():
    """Scoring another model against a capture reports mismatches with details."""
    path = os.path.join(DATA, "wgmma_e4m3xe4m3_normal.npz")
    r = tc.verify_capture(path, "exact")
    assert r["mismatches"] > 0 and r["match_rate"] < 1.0
    mm = r["first_mismatches"][0]
    assert set(mm) >= {"index", "hardware", "model", "hardware_bits", "model_bits"}


# ------------------------------------------------------------ model facts
def test_wgmma_keeps_13_fraction_bits_and_truncates():
    a = np.zeros((1, 1, 32), np.uint8)
    b = np.zeros((1, 32, 1), np.uint8)
    a[0, 0, 0], b[0, 0, 0] = 0x38, 0x38  # 1 * 1
    c = np.array([[[2.0**-13 + 2.0**-14]]], np.float32)
    d = tc.mma(a, b, c, a_format="e4m3", b_format="e4m3")
    assert d[0, 0, 0] == np.float32(1 + 2.0**-13)  # 2^-14 truncated away
    d = tc.mma(a, b, -c, a_format="e4m3", b_format="e4m3")
    assert d[0, 0, 0] == np.float32(1 - 2.0**-13)  # magnitude truncation: 1 - 2^-13 - 2^-14 -> 1 - 2^-13


def test_mma_sync_is_two_hmma_plus_fadd():
    m = tc.get_model("mma.sync")
    assert m.block == 16 and m.c_mode == "separate" and m.frac_bits == 25
    assert m.k_order[:4] == (0, 1, 4, 5) and m.k_order[16:20] == (2, 3, 6, 7)


# ------------------------------------------------------------ presets vs fp64
def _rand_inputs(rng, fa, fb, T, M, N, K=32, spread=4):
    a = rng.integers(0, 256, (T, M, K)).astype(np.uint8)
    b = rng.integers(0, 256, (T, K, N)).astype(np.uint8)
    # keep finite codes with moderate exponents
    for x, f in ((a, fa), (b, fb)):
        v = dec(x, f)
        bad = ~np.isfinite(v) | (np.abs(v) > 2.0**spread) | ((np.abs(v) < 2.0**-spread) & (v != 0))
        x[bad] = 0x38 if f == "e4m3" else 0x3C  # 1.0
    return a, b


def _round_f32(fr: Fraction) -> np.float32:
    """Correct RNE rounding of an exact rational to float32 (independent reference)."""
    if fr == 0:
        return np.float32(0.0)
    s = -1 if fr < 0 else 1
    x = abs(fr)
    e = x.numerator.bit_length() - x.denominator.bit_length()
    while Fraction(2) ** e > x:
        e -= 1
    while Fraction(2) ** (e + 1) <= x:
        e += 1
    e = max(e, -126)
    q = Fraction(2) ** (e - 23)
    n = x / q
    fl = n.numerator // n.denominator
    rem = n - fl
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and fl % 2 == 1):
        fl += 1
    return np.float32(s * float(fl * q))


@pytest.mark.parametrize("fa,fb", [("e4m3", "e4m3"), ("e5m2", "e4m3"), ("e5m2", "e5m2")])
def test_exact_preset_matches_fraction_reference(fa, fb):
    rng = np.random.default_rng(1)
    a, b = _rand_inputs(rng, fa, fb, 2, 8, 8, spread=12)
    c = (rng.standard_normal((2, 8, 8)) * 2.0 ** rng.integers(-30, 30, (2, 8, 8))).astype(np.float32)
    d = tc.mma(a, b, c, a_format=fa, b_format=fb, instruction="exact")
    va, vb = dec(a, fa), dec(b, fb)
    for t in range(2):
        for i in range(8):
            for j in range(8):
                fr = Fraction(float(c[t, i, j])) + sum(
                    Fraction(float(va[t, i, k])) * Fraction(float(vb[t, k, j])) for k in range(32)
                )
                assert d[t, i, j] == _round_f32(fr)


def test_exact_preset_no_double_rounding():
    """2^30 + 2^6 + 2^-32: fp64 rounds to the fp32 midpoint, fp32 of the exact sum rounds up."""
    a = np.zeros((1, 32), np.uint8)
    b = np.zeros((32, 1), np.uint8)
    dt = ml_dtypes.float8_e5m2
    a[0, 0] = np.array(2.0**3, np.float32).astype(dt).view(np.uint8)
    b[0, 0] = np.array(2.0**3, np.float32).astype(dt).view(np.uint8)  # 2^6
    a[0, 1] = np.array(2.0**-16, np.float32).astype(dt).view(np.uint8)
    b[1, 0] = np.array(2.0**-16, np.float32).astype(dt).view(np.uint8)  # 2^-32
    c = np.array([[2.0**30]], np.float32)
    d = tc.mma(a, b, c, a_format="e5m2", b_format="e5m2", instruction="exact")
    assert d[0, 0] == np.float32(2.0**30 + 2.0**7)
    assert np.float32(np.float64(2.0**30) + 2.0**6 + 2.0**-32) == np.float32(2.0**30)  # the naive way fails


@pytest.mark.parametrize("fa,fb", [("e4m3", "e4m3"), ("e4m3", "e5m2")])
def test_fp32_preset_matches_sequential_fp32(fa, fb):
    rng = np.random.default_rng(2)
    a, b = _rand_inputs(rng, fa, fb, 3, 8, 8)
    c = rng.standard_normal((3, 8, 8)).astype(np.float32)
    d = tc.mma(a, b, c, a_format=fa, b_format=fb, instruction="fp32")
    va, vb = dec(a, fa).astype(np.float32), dec(b, fb).astype(np.float32)
    acc = c.copy()
    for k in range(32):
        acc = (acc + va[:, :, k : k + 1] * vb[:, k : k + 1, :]).astype(np.float32)
    assert bits_equal(d, acc).all()


def test_matmul_chains_instructions_and_promotes():
    rng = np.random.default_rng(3)
    a = (rng.standard_normal((16, 256)).astype(np.float32).astype(ml_dtypes.float8_e4m3fn)).view(np.uint8)
    b = (rng.standard_normal((256, 8)).astype(np.float32).astype(ml_dtypes.float8_e4m3fn)).view(np.uint8)
    c = rng.standard_normal((16, 8)).astype(np.float32)
    kw = dict(a_format="e4m3", b_format="e4m3")
    acc = c
    for k0 in range(0, 256, 32):
        acc = tc.mma(a[:, k0 : k0 + 32], b[k0 : k0 + 32], acc, **kw)
    assert bits_equal(tc.matmul(a, b, c, **kw), acc).all()
    # promotion every 96 (3 instructions): 96 + 96 + remainder 64
    tot = c.copy()
    for k0, k1 in ((0, 96), (96, 192), (192, 256)):
        part = np.zeros_like(c)
        for k in range(k0, k1, 32):
            part = tc.mma(a[:, k : k + 32], b[k : k + 32], part, **kw)
        tot = (tot + part).astype(np.float32)
    assert bits_equal(tc.matmul(a, b, c, promote_every=96, **kw), tot).all()
    assert bits_equal(tc.matmul(a[:, :32], b[:32], c, **kw), tc.mma(a[:, :32], b[:32], c, **kw)).all()


def test_batch_broadcasting():
    rng = np.random.default_rng(4)
    a = rng.integers(0, 0x70, (3, 4, 32)).astype(np.uint8)
    b = rng.integers(0, 0x70, (32, 5)).astype(np.uint8)
    c = np.zeros((4, 5), np.float32)
    d = tc.mma(a, b, c, a_format="e4m3", b_format="e4m3")
    assert d.shape == (3, 4, 5) and d.dtype == np.float32
    assert bits_equal(d[1], tc.mma(a[1], b, c, a_format="e4m3", b_format="e4m3")).all()


# ------------------------------------------------------------ validation
def test_input_validation():
    a = np.zeros((4, 32), np.uint8)
    b = np.zeros((32, 8), np.uint8)
    c = np.zeros((4, 8), np.float32)
    kw = dict(a_format="e4m3", b_format="e4m3")
    with pytest.raises(TypeError, match="uint8"):
        tc.mma(a.astype(np.int32), b, c, **kw)
    with pytest.raises(ValueError, match="32"):
        tc.mma(np.zeros((4, 16), np.uint8), b, c, **kw)
    with pytest.raises(ValueError, match=r"\(\.\.\., 4, 8\)"):
        tc.mma(a, b, np.zeros((4, 7), np.float32), **kw)
    with pytest.raises(ValueError, match="multiple of 32"):
        tc.matmul(np.zeros((4, 48), np.uint8), np.zeros((48, 8), np.uint8), **kw)
    with pytest.raises(ValueError, match="inner"):
        tc.matmul(np.zeros((4, 64), np.uint8), np.zeros((32, 8), np.uint8), **kw)
    with pytest.raises(ValueError, match="promote_every"):
        tc.matmul(np.zeros((4, 64), np.uint8), np.zeros((64, 8), np.uint8), promote_every=48, **kw)
    with pytest.raises(ValueError, match="8-bit"):
        tc.mma(a, b, c, a_format="fp16", b_format="e4m3")
    with pytest.raises(ValueError, match="unknown format"):
        tc.mma(a, b, c, a_format="e9m9", b_format="e4m3")
    with pytest.raises(ValueError, match="no accumulator model"):
        tc.mma(a, b, c, instruction="hgmma", **kw)
    with pytest.raises(ValueError, match="no accumulator model"):
        tc.mma(a, b, c, arch="sm100", **kw)
    with pytest.raises(ValueError, match="float32"):
        tc.mma(a, b, np.full((4, 8), 0.1), **kw)
    with pytest.raises(ValueError, match="block"):
        tc.AccumulatorModel(name="x", block=5)
    with pytest.raises(ValueError, match="k_order"):
        tc.AccumulatorModel(name="x", k_order=(0,) * 32)


def test_custom_model_object():
    m = tc.AccumulatorModel(name="wide", frac_bits=30, out_frac_bits=23, out_rounding="rne")
    a = np.full((1, 32), 0x38, np.uint8)
    b = np.full((32, 1), 0x38, np.uint8)
    d = tc.mma(a, b, np.zeros((1, 1), np.float32), a_format="e4m3", b_format="e4m3", instruction=m)
    assert d[0, 0] == 32.0


# ------------------------------------------------------------ hardware cvt
def test_hardware_cvt_vectors_against_encode():
    """cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32 on the H200 (run-length encoded over all
    2**32 inputs) against fp8sim.encode(..., "rne", saturate=True) at every run
    boundary and its neighbours; NaN outputs compared as NaN."""
    import fp8sim

    z = np.load(os.path.join(DATA, "cvt_sm90.npz"))
    meta = json.loads(str(z["meta"]))
    assert meta["gpu"].startswith("NVIDIA")
    for fmt in ("e4m3", "e5m2"):
        starts = z[f"{fmt}_starts"].astype(np.int64)
        codes = z[f"{fmt}_codes"]
        pts = np.unique(np.clip(np.concatenate([starts - 1, starts, starts + 1]), 0, 2**32 - 1))
        hw = codes[np.searchsorted(starts, pts, side="right") - 1]
        x = pts.astype(np.uint32).view(np.float32)
        ref = fp8sim.encode(x, fmt, "rne", saturate=True)
        f = fp8sim.format(fmt)
        isnan = np.array([f.is_nan_code(i) for i in range(256)])
        ok = (hw == ref) | (isnan[hw] & isnan[ref])
        assert ok.all(), (
            fmt,
            [(hex(int(p)), hex(int(h)), hex(int(r))) for p, h, r in zip(pts[~ok], hw[~ok], ref[~ok])][:8],
        )


# ------------------------------------------------------------ probe replay
@pytest.mark.parametrize("instruction", ["wgmma", "mma.sync"])
def test_probe_replay_recovers_presets(instruction):
    """The H200 probe outputs (python -m gpu.characterize --save) re-analysed offline
    give the preset's parameters for every format pair."""
    from gpu import characterize as ch

    results = ch.load_results(os.path.join(DATA, f"probes_sm90_{instruction}.npz"))
    preset = tc.get_model(instruction)
    pairs = sorted({(r.a_format, r.b_format) for r in results})
    assert len(pairs) == 4
    for pair in pairs:
        rs = [r for r in results if (r.a_format, r.b_format) == pair]
        findings = {r.name: r.findings for r in rs}
        assert findings["probe_sanity"]["sanity_ok"]
        fitted = ch.assemble(findings, tc.AccumulatorModel(name="fit", out_rounding="rz"))
        for key in ("block", "frac_bits", "align_rounding", "product_exponent", "c_mode", "out_frac_bits", "k_order"):
            assert getattr(fitted, key) == getattr(preset, key), (pair, key)
        # the preset reproduces every probe output
        good, n = ch.score(preset, rs)
        assert good == n
