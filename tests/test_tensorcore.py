"""fp8sim.tensorcore: bit-exact agreement with H200 captures, presets, validation.

The captures in tests/data/ were written by ``python -m gpu.capture`` on an
NVIDIA H200 (see docs/tensorcore.md).  Agreement must be 100% bit-exact
(every float32 bit pattern, NaN sign and payload included), with no tolerance.
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
    """Identical float32 bit patterns, NaN sign and payload included (both must be float32)."""
    assert x.dtype == np.float32 and y.dtype == np.float32, (x.dtype, y.dtype)
    return x.view(np.uint32) == y.view(np.uint32)


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


@pytest.mark.parametrize("path", MMA_FILES + CHAIN_FILES, ids=os.path.basename)
def test_single_instruction_captures_bit_exact(path):
    """Every stored output is compared (NaN included, by bit pattern) and reproduced."""
    r = tc.verify_capture(path)
    assert r["meta"]["gpu"].startswith("NVIDIA")
    assert r["mismatches"] == 0, r["first_mismatches"]
    assert r["match_rate"] == 1.0
    with np.load(path) as z:
        outputs = {k: z[k] for k in z.files if k == "d" or k.startswith("d_")}
    assert r["n"] == sum(d.size for d in outputs.values())
    assert {k: v["n"] for k, v in r["outputs"].items()} == {k: d.size for k, d in outputs.items()}


def test_shipped_nan_patterns_are_the_presets():
    """The H200 writes one NaN pattern per instruction (read from the captures with numpy):
    0x7fffffff for the fp32 accumulators, 0x7fffe000 (fp16 0x7fff) for wgmma.f16; the presets'
    nan_bits are exactly these, and the shipped captures hold NaN outputs of every instruction."""
    seen: dict = {}
    for path in MMA_FILES + CHAIN_FILES:
        cap = tc.load_capture(path)
        for k in cap:
            if k == "d" or k.startswith("d_"):
                d = cap[k]
                assert d.dtype == np.float32
                seen.setdefault(cap["meta"]["instruction"], set()).update(
                    np.unique(d.view(np.uint32)[np.isnan(d)]).tolist()
                )
    assert seen == {"wgmma": {0x7FFFFFFF}, "mma.sync": {0x7FFFFFFF}, "wgmma.f16": {0x7FFFE000}}
    for ins, pats in seen.items():
        assert {tc.get_model(ins).nan_bits} == pats


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


# ------------------------------------------------------------ verification catches every change
SPECIAL = {ins: os.path.join(DATA, f"{ins}_e4m3xe5m2_special.npz") for ins in ("wgmma", "mma.sync", "wgmma.f16")}


def _save(path, cap, **changes):
    """Write a copy of a loaded capture with some arrays replaced (None drops the key)."""
    arrays = {k: v for k, v in cap.items() if k != "meta"}
    meta = dict(cap["meta"])
    for k, v in changes.items():
        if k == "meta":
            meta = v
        elif v is None:
            arrays.pop(k, None)
        else:
            arrays[k] = v
    np.savez(path, meta=np.array(json.dumps(meta)), **arrays)
    return str(path)


@pytest.mark.parametrize("ins", sorted(SPECIAL))
def test_verify_compares_nan_bit_patterns(ins):
    """A model whose NaN is another pattern fails on every NaN output (issue #18, item 8)."""
    from dataclasses import replace

    cap = tc.load_capture(SPECIAL[ins])
    n_nan = int(np.isnan(cap["d"]).sum())
    assert n_nan > 100
    assert tc.verify_capture(SPECIAL[ins])["mismatches"] == 0
    other = replace(tc.get_model(ins), nan_bits=0x7FC00000)
    r = tc.verify_capture(SPECIAL[ins], other)
    assert r["mismatches"] == n_nan and r["n"] == cap["d"].size
    assert r["first_mismatches"][0]["model_bits"] == "0x7fc00000"


@pytest.mark.parametrize("flip", [0x80000000, 0x00000001, 0x00400000], ids=["sign", "payload-low", "quiet-bit"])
def test_verify_detects_a_changed_nan(tmp_path, flip):
    """Flipping the sign or a payload bit of one captured NaN (it stays NaN) is one mismatch."""
    cap = tc.load_capture(SPECIAL["wgmma"])
    d = cap["d"].copy()
    idx = tuple(np.argwhere(np.isnan(d))[7])
    bits = d.view(np.uint32)
    bits[idx] ^= np.uint32(flip)
    assert np.isnan(d[idx])
    r = tc.verify_capture(_save(tmp_path / "t.npz", cap, d=d))
    assert r["mismatches"] == 1 and r["match_rate"] == (d.size - 1) / d.size
    mm = r["first_mismatches"][0]
    assert tuple(mm["index"]) == idx and mm["hardware_bits"] == f"0x{0x7FFFFFFF ^ flip:08x}"
    assert mm["model_bits"] == "0x7fffffff"


def test_verify_refuses_outputs_not_stored_as_float32(tmp_path):
    """float64 outputs are refused, not rounded: this change vanishes when rounded to float32."""
    cap = tc.load_capture(SPECIAL["wgmma"])
    d64 = cap["d"].astype(np.float64)
    i = np.flatnonzero(np.isfinite(d64) & (d64 != 0))[0]
    d64.flat[i] *= 1 + 2.0**-40
    assert np.array_equal(d64.astype(np.float32), cap["d"], equal_nan=True)
    with pytest.raises(tc.CaptureError, match=r"'d' must be float32.*got float64"):
        tc.verify_capture(_save(tmp_path / "f64.npz", cap, d=d64))
    with pytest.raises(tc.CaptureError, match=r"'d' must be float32.*got float16"):
        tc.verify_capture(_save(tmp_path / "f16.npz", cap, d=cap["d"].astype(np.float16)))


def test_verify_capture_without_outputs_is_not_a_pass(tmp_path):
    cap = tc.load_capture(SPECIAL["wgmma"])
    empty = _save(tmp_path / "empty.npz", cap, a=cap["a"][:0], b=cap["b"][:0], c=cap["c"][:0], d=cap["d"][:0])
    with pytest.raises(tc.CaptureError, match="no outputs"):
        tc.verify_capture(empty)


def _bad_captures(tmp_path):
    cap = tc.load_capture(SPECIAL["wgmma"])
    meta = cap["meta"]
    text = tmp_path / "notes.txt"
    text.write_text("# not a capture\n")
    npy = tmp_path / "array.npy"
    np.save(npy, np.zeros(3, np.float32))
    obj = tmp_path / "pickled.npz"
    np.savez(obj, meta=np.array(json.dumps(meta)), a=np.array([{"x": 1}], dtype=object))
    badjson = tmp_path / "badjson.npz"
    np.savez(badjson, meta=np.array("{not json"), d=cap["d"])
    (tmp_path / "empty.npz").write_bytes(b"")
    (tmp_path / "truncated.npz").write_bytes(open(SPECIAL["wgmma"], "rb").read()[:200])
    no_b_format = {k: v for k, v in meta.items() if k != "b_format"}
    return {
        "no b": (_save(tmp_path / "no_b.npz", cap, b=None), r"no 'b'"),
        "no c": (_save(tmp_path / "no_c.npz", cap, c=None), r"no 'c'"),
        "no d": (_save(tmp_path / "no_d.npz", cap, d=None), r"no 'd'"),
        "no b_format": (_save(tmp_path / "no_bf.npz", cap, meta=no_b_format), r"meta\['b_format'\]"),
        "d wrong shape": (_save(tmp_path / "shape.npz", cap, d=cap["d"][:, :, :4]), r"'d' has shape \(16, 64, 4\)"),
        "d wrong rank": (_save(tmp_path / "rank.npz", cap, d=cap["d"].reshape(16, -1)), r"'d' must have 3 dim"),
        "a int32": (_save(tmp_path / "a32.npz", cap, a=cap["a"].astype(np.int32)), r"'a' must be uint8"),
        "unknown output": (_save(tmp_path / "extra.npz", cap, d_x=cap["d"]), r"unknown output 'd_x'"),
        "unknown instruction": (
            _save(tmp_path / "ins.npz", cap, meta={**meta, "instruction": "hgmma"}),
            r"unknown instruction 'hgmma'",
        ),
        "text file": (str(text), r"not a zip archive"),
        "npy file": (str(npy), r"single \.npy array"),
        "empty file": (str(tmp_path / "empty.npz"), r"an empty file"),
        "truncated": (str(tmp_path / "truncated.npz"), r"not an \.npz capture|damaged"),
        "pickled": (str(obj), r"pickled|object"),
        "bad meta": (str(badjson), r"not valid JSON"),
        "directory": (str(tmp_path), r"directory"),
    }


def test_verify_names_what_is_wrong_with_a_file(tmp_path):
    """Malformed files raise CaptureError with the file and the problem, never another exception."""
    for what, (path, pattern) in _bad_captures(tmp_path).items():
        with pytest.raises(tc.CaptureError, match=pattern) as e:
            tc.verify_capture(path)
        assert str(path) in str(e.value), what
    with pytest.raises(FileNotFoundError, match="no such file"):
        tc.verify_capture(str(tmp_path / "missing.npz"))


def test_verify_other_capture_kinds():
    """Probe captures are scored bit for bit; GEMM and cvt captures are named, not scored."""
    from dataclasses import replace

    path = os.path.join(DATA, "probes_sm90_wgmma.f16.npz")
    with np.load(path) as z:
        ds = [z[k] for k in z.files if k.startswith("D")]
    r = tc.verify_capture(path)
    assert r["kind"] == "probes" and r["mismatches"] == 0 and r["n"] == sum(d.size for d in ds) > 14000
    n_nan = sum(int(np.isnan(d).sum()) for d in ds)
    assert n_nan > 0
    r = tc.verify_capture(path, replace(tc.get_model("wgmma.f16"), nan_bits=0x7FFFFFFF))
    assert r["mismatches"] == n_nan
    for name, kind in (("gemm_sm90.npz", "gemm"), ("cvt_sm90.npz", "cvt")):
        with pytest.raises(tc.NotTensorCoreCaptureError, match="not a tensor-core capture") as e:
            tc.verify_capture(os.path.join(DATA, name))
        assert e.value.kind == kind
    assert tc.capture_kind(tc.load_capture(CHAIN_FILES[0])) == "chain"


def test_cli_verify_scores_every_file_and_summarizes(tmp_path, capsys):
    from fp8sim.cli import main

    cap = tc.load_capture(SPECIAL["wgmma"])
    d = cap["d"].copy()
    d.view(np.uint32)[np.isnan(d)] ^= np.uint32(0x80000000)  # every NaN's sign flipped
    tampered = _save(tmp_path / "tampered.npz", cap, d=d)
    bad = _bad_captures(tmp_path)
    good = SPECIAL["wgmma"]
    gemm = os.path.join(DATA, "gemm_sm90.npz")
    files = [good, gemm, bad["no b"][0], tampered, bad["text file"][0], os.path.join(DATA, "probes_sm90_wgmma.npz")]
    code = main(["verify", *files])
    out, err = capsys.readouterr()
    assert code == 1 and err == ""
    summary = out[out.index("summary:") :]
    for f in files:
        assert f in summary
    n_nan = int(np.isnan(d).sum())
    assert f"{d.size - n_nan}/{d.size}" in out and "no 'b'" in out and "not a zip archive" in out
    assert "skipped" in summary and "(gemm capture)" in summary
    # strict JSON (NaN values of the mismatches as strings), the same verdicts
    code = main(["verify", *files, "--json"])
    out, _ = capsys.readouterr()
    res = json.loads(out, parse_constant=lambda c: pytest.fail(f"invalid JSON constant {c}"))
    assert code == 1 and res["ok"] is False
    assert [r["status"] for r in res["files"]] == ["bit-exact", "skipped", "error", "mismatch", "error", "bit-exact"]
    assert res["files"][3]["mismatches"] == n_nan and res["files"][3]["first_mismatches"][0]["hardware"] == "nan"
    # good files (and a named skip) pass; nothing scored does not
    assert main(["verify", good, gemm]) == 0
    assert main(["verify", gemm]) == 1
    out, _ = capsys.readouterr()
    assert "no outputs were scored" in out
    empty = _save(tmp_path / "e.npz", cap, a=cap["a"][:0], b=cap["b"][:0], c=cap["c"][:0], d=cap["d"][:0])
    assert main(["verify", empty]) == 1
    assert "no outputs" in capsys.readouterr().out
    assert main(["verify", good, "--model", "hgmma"]) == 2
    assert "did you mean 'wgmma'" in capsys.readouterr().err


def test_gpu_verify_tool_delegates(capsys):
    from gpu import verify

    assert verify.main([SPECIAL["wgmma"]]) == 0
    assert verify.main([SPECIAL["wgmma"], "--instruction", "exact"]) == 1
    assert "summary:" in capsys.readouterr().out


# ------------------------------------------------------------ model parameters are checked
@pytest.mark.parametrize(
    "kw,exc,pattern",
    [
        (dict(frac_bits=13.5), TypeError, "frac_bits must be an integer"),
        (dict(frac_bits=13.0), TypeError, "frac_bits must be an integer"),
        (dict(frac_bits="13"), TypeError, "frac_bits must be an integer"),
        (dict(frac_bits=True), TypeError, "bool"),
        (dict(frac_bits=41), ValueError, "0..40"),
        (dict(block=16.0), TypeError, "block must be an integer"),
        (dict(block=False), TypeError, "bool"),
        (dict(out_frac_bits=23.0), TypeError, "out_frac_bits"),
        (dict(out_frac_bits=11, output="f16"), ValueError, "0..10"),
        (dict(nan_bits=0), ValueError, "float32 NaN"),
        (dict(nan_bits=0x7F800000), ValueError, "float32 NaN"),  # +inf
        (dict(nan_bits=0xFF800000), ValueError, "float32 NaN"),  # -inf
        (dict(nan_bits=0x3F800000), ValueError, "float32 NaN"),  # 1.0
        (dict(nan_bits=2**32 + 0x7FFFFFFF), ValueError, "float32 NaN"),
        (dict(nan_bits=-1), ValueError, "float32 NaN"),
        (dict(nan_bits=float("nan")), TypeError, "nan_bits must be an integer"),
        (dict(k_order=tuple(float(k) for k in range(32))), TypeError, "k_order must hold integers"),
        (dict(k_order=tuple(range(31))), ValueError, "permutation"),
        (dict(k_order="0123"), TypeError, "k_order"),
        (dict(kind="fuse"), tc.UnknownNameError, "did you mean 'fused'"),
        (dict(out_rounding="rnee"), tc.UnknownNameError, "did you mean 'rne'"),
        (dict(align_rounding="rne"), tc.UnknownNameError, r"unknown align_rounding 'rne'.*rtz, rdn"),
        (dict(out_rounding="rna"), tc.UnknownNameError, r"unknown out_rounding 'rna'.*rtz, rne, rdn, rup"),
        (dict(out_rounding=2), TypeError, "out_rounding"),
        (dict(output="fp16"), tc.UnknownNameError, r"did you mean 'f16'.*f32, f16"),
        (dict(c_mode=1), TypeError, "c_mode"),
        (dict(validated="yes"), TypeError, "validated"),
    ],
)
def test_accumulator_model_rejects_bad_parameters(kw, exc, pattern):
    with pytest.raises(exc, match=pattern):
        tc.AccumulatorModel(name="x", **kw)


def test_accumulator_model_accepts_numpy_integers_and_any_float32_nan():
    m = tc.AccumulatorModel(name="x", frac_bits=np.int64(13), block=np.int32(32), k_order=np.arange(32))
    assert type(m.frac_bits) is int and type(m.block) is int and m.k_order == tuple(range(32))
    for bits in (0x7FC00000, 0xFFC00001, 0x7F800001):
        m = tc.AccumulatorModel(name="x", nan_bits=bits)
        a = np.zeros((1, 32), np.uint8)
        a[0, 0] = 0x7F  # e4m3 NaN
        d = tc.mma(
            a,
            np.zeros((32, 1), np.uint8),
            np.zeros((1, 1), np.float32),
            a_format="e4m3",
            b_format="e4m3",
            instruction=m,
        )
        assert int(d.view(np.uint32)[0, 0]) == bits


def test_get_model_unknown_names():
    with pytest.raises(tc.UnknownNameError, match=r"unknown instruction 'wgmm'.*did you mean 'wgmma'"):
        tc.get_model("wgmm")
    with pytest.raises(tc.UnknownNameError, match=r"unknown arch 'sm91'.*did you mean 'sm90'"):
        tc.get_model("wgmma", "sm91")
    with pytest.raises(tc.UnknownNameError, match=r"no preset for arch 'sm89'"):
        tc.get_model("wgmma", "sm89")
    assert issubclass(tc.UnknownNameError, ValueError)
    with pytest.raises(TypeError, match="arch"):
        tc.get_model("wgmma", 90)


# ------------------------------------------------------------ shapes and layouts
KW = dict(a_format="e4m3", b_format="e5m2")


@pytest.mark.parametrize("ins", ["wgmma", "mma.sync", "wgmma.f16", "exact", "fp32"])
def test_empty_shapes(ins):
    """M = 0, N = 0 or an empty batch give an empty result of the right shape (issue #18, item 18)."""
    for M, N, T in ((0, 8, 2), (4, 0, 2), (0, 0, 1), (4, 8, 0)):
        a = np.zeros((T, M, 32), np.uint8)
        b = np.zeros((T, 32, N), np.uint8)
        d = tc.mma(a, b, np.zeros((T, M, N), np.float32), instruction=ins, **KW)
        assert d.shape == (T, M, N) and d.dtype == np.float32
        for promote in (None, 64):
            d = tc.matmul(
                np.zeros((M, 128), np.uint8), np.zeros((128, N), np.uint8), instruction=ins, promote_every=promote, **KW
            )
            assert d.shape == (M, N) and d.dtype == np.float32


@pytest.mark.parametrize("ins", ["wgmma", "wgmma.f16", "mma.sync"])
@pytest.mark.parametrize("promote", [None, 32])
def test_matmul_with_k_zero_returns_c(ins, promote):
    """K = 0: no product at all, D = C bit for bit (NaN payload, -0, values fp16 cannot hold)."""
    c = np.array([[1 + 2.0**-20, -0.0, np.inf], [np.nan, -3.5, 1e-40]], np.float32)
    c.view(np.uint32)[1, 0] = 0xFFC01234
    d = tc.matmul(
        np.zeros((2, 0), np.uint8), np.zeros((0, 3), np.uint8), c, instruction=ins, promote_every=promote, **KW
    )
    assert d.dtype == np.float32 and np.array_equal(d.view(np.uint32), c.view(np.uint32))
    d = tc.matmul(np.zeros((5, 2, 0), np.uint8), np.zeros((0, 3), np.uint8), instruction=ins, **KW)
    assert d.shape == (5, 2, 3) and np.array_equal(d.view(np.uint32), np.zeros((5, 2, 3), np.uint32))


def test_f16_accumulator_with_promotion_keeps_c_in_fp32():
    """With promote_every, C starts the fp32 accumulator: 1 + 2^-20 (no fp16 value) plus
    zero products stays 1 + 2^-20.  Without promotion C enters the fp16 accumulator: 1."""
    c = np.full((2, 2), 1 + 2.0**-20, np.float32)
    z = np.zeros((2, 64), np.uint8), np.zeros((64, 2), np.uint8)
    assert (tc.matmul(*z, c, instruction="wgmma.f16", promote_every=32, **KW) == c).all()
    assert (tc.matmul(*z, c, instruction="wgmma.f16", **KW) == np.float32(1.0)).all()


def test_non_contiguous_and_fortran_inputs():
    """Strided, transposed and Fortran-ordered inputs give the results of contiguous copies."""
    rng = np.random.default_rng(9)
    big_a = rng.integers(0, 0x70, (3, 8, 128)).astype(np.uint8)
    big_b = rng.integers(0, 0x70, (3, 128, 10)).astype(np.uint8)
    c = rng.standard_normal((3, 10, 4)).astype(np.float32).transpose(0, 2, 1)[:, :4, :5]
    a, b = big_a[:, :4, ::2], big_b[:, 1::2, ::2]
    assert not (a.flags.c_contiguous or b.flags.c_contiguous or c.flags.c_contiguous)
    for ins in ("wgmma", "mma.sync"):
        ref = tc.matmul(a.copy(), b.copy(), c.copy(), instruction=ins, **KW)
        assert np.array_equal(tc.matmul(a, b, c, instruction=ins, **KW).view(np.uint32), ref.view(np.uint32))
        ref = tc.mma(a[..., :32].copy(), b[:, :32].copy(), c.copy(), instruction=ins, **KW)
        got = tc.mma(np.asfortranarray(a[..., :32]), np.asfortranarray(b[:, :32]), c, instruction=ins, **KW)
        assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))


def test_more_input_checks():
    a, b, c = np.zeros((4, 32), np.uint8), np.zeros((32, 8), np.uint8), np.zeros((4, 8), np.float32)
    with pytest.raises(ValueError, match=r"batch dimensions of a, b, c do not broadcast"):
        tc.mma(np.zeros((3, 4, 32), np.uint8), np.zeros((2, 32, 8), np.uint8), c, **KW)
    with pytest.raises(TypeError, match="promote_every"):
        tc.matmul(a, b, promote_every=64.0, **KW)
    with pytest.raises(TypeError, match="promote_every"):
        tc.matmul(a, b, promote_every=True, **KW)
    with pytest.raises(TypeError, match="c is required"):
        tc.mma(a, b, None, **KW)
    with pytest.raises(TypeError, match="c must be a float32 array"):
        tc.mma(a, b, c.astype(np.int32), **KW)
    with pytest.raises(TypeError, match="uint8"):
        tc.mma(a.astype(bool), b, c, **KW)
    # bfloat16 and float16 C hold float32 values: converted exactly
    cb = np.full((4, 8), 1.5, ml_dtypes.bfloat16)
    assert (tc.mma(a, b, cb, **KW) == np.float32(1.5)).all()
    assert (tc.mma(a, b, c.astype(np.float16) + np.float16(2.0**-24), **KW) == np.float32(2.0**-24)).all()


def test_verify_with_a_model_name_uses_the_captures_arch(tmp_path):
    """A preset name given to verify is resolved on the capture's own arch: an sm89 capture scored
    with model="mma.sync" is compared with the sm89 datapath (13 bits, MMA-Sim's), not sm90's."""
    import json

    with np.load(os.path.join(DATA, "mma.sync_e4m3xe4m3_normal.npz"), allow_pickle=False) as z:
        cap = {k: z[k] for k in z.files}
    meta = json.loads(str(cap["meta"]))
    meta["arch"] = "sm89"
    fa, fb = meta["a_format"], meta["b_format"]
    d89 = tc.mma(cap["a"], cap["b"], cap["c"], a_format=fa, b_format=fb, instruction="mma.sync", arch="sm89")
    d90 = tc.mma(cap["a"], cap["b"], cap["c"], a_format=fa, b_format=fb, instruction="mma.sync", arch="sm90")
    differ = int(np.sum(d89.view(np.uint32) != d90.view(np.uint32)))
    assert differ > 0  # the two datapaths differ on these inputs, so the test can tell them apart
    path = tmp_path / "sm89.npz"
    np.savez(path, **dict(cap, d=d89, meta=np.str_(json.dumps(meta))))
    assert tc.verify_capture(path, model="mma.sync")["mismatches"] == 0
    assert tc.verify_capture(path, model=tc.get_model("mma.sync", "sm90"))["mismatches"] == differ


# ------------------------------------------------------------ rounding vocabulary, registry, tables
def test_rounding_fields_accept_every_name_of_a_mode():
    """align_rounding/out_rounding take any RoundMode name or alias and store one spelling: models
    built from aliases equal the presets (repr included) and give identical results."""
    from dataclasses import replace

    from fp8sim.rounding import RoundMode

    base = tc.get_model("wgmma")
    for alias in ("rtz", "RZ", "zero", "truncate", RoundMode.RTZ):
        m = replace(base, align_rounding=alias, out_rounding=alias)
        assert m == base and repr(m) == repr(base) and m.out_rounding == "rz"
    f16 = tc.get_model("wgmma.f16")
    assert replace(f16, out_rounding="nearest") == f16 and replace(f16, out_rounding=RoundMode.RNE) == f16
    assert tc.AccumulatorModel(name="x", out_rounding="floor").out_rounding == "rd"
    assert tc.AccumulatorModel(name="x", out_rounding=RoundMode.RUP).out_rounding == "ru"
    assert tc.AccumulatorModel(name="x", align_rounding="rdn").align_rounding == "rd"
    # the kernels see RoundMode numbers
    assert tc.model_params(base).out_rounding == RoundMode.RTZ
    assert tc.model_params(f16).out_rounding == RoundMode.RNE
    p = tc.model_params(replace(base, align_rounding="rd", out_rounding="ru"))
    assert (p.align_rounding, p.out_rounding) == (RoundMode.RDN, RoundMode.RUP)
    rng = np.random.default_rng(3)
    a = rng.integers(0, 0x7E, size=(8, 128), dtype=np.uint8)
    a[rng.random(a.shape) < 0.5] |= np.uint8(0x80)
    b = rng.integers(0, 0x7B, size=(128, 5), dtype=np.uint8)
    for name, alias in (("rd", "towardnegative"), ("ru", "ceil"), ("rne", "even"), ("rz", "rtz")):
        ref = tc.matmul(a, b, instruction=replace(base, out_rounding=name, out_frac_bits=18), **KW)
        got = tc.matmul(a, b, instruction=replace(base, out_rounding=alias, out_frac_bits=18), **KW)
        assert bits_equal(ref, got).all(), name


def test_register_model_for_a_new_arch():
    """A new (arch, instruction) is one register_model call; it runs through mma and matmul, the
    arch-independent presets apply to it, and a second preset for the same pair is refused."""
    from dataclasses import replace

    copy = replace(tc.get_model("wgmma"), name="test copy of wgmma", validated=False)
    rng = np.random.default_rng(5)
    a = rng.integers(0, 0x7E, size=(6, 96), dtype=np.uint8)
    b = rng.integers(0, 0x7B, size=(96, 7), dtype=np.uint8)
    c = rng.standard_normal((6, 7)).astype(np.float32)
    try:
        tc.register_model("Test", "wgmma", copy)
        assert ("test", "wgmma") in tc.model_names()
        assert tc.get_model("wgmma", "test") is copy and tc.get_model("WGMMA", "TEST") is copy
        assert tc.get_model("exact", "test") == tc.get_model("exact")
        assert bits_equal(tc.mma(a[:, :32], b[:32], c, arch="test", **KW), tc.mma(a[:, :32], b[:32], c, **KW)).all()
        assert bits_equal(
            tc.matmul(a, b, c, arch="test", promote_every=64, **KW), tc.matmul(a, b, c, promote_every=64, **KW)
        ).all()
        with pytest.raises(ValueError, match="already has a preset"):
            tc.register_model("test", "wgmma", copy)
        with pytest.raises(tc.UnknownNameError, match=r"unknown instruction 'wgmmma'.*did you mean 'wgmma'"):
            tc.get_model("wgmmma", "test")
        with pytest.raises(
            tc.UnknownNameError, match=r"no preset for arch 'test'.*'sm90'.*known presets:.*wgmma \(test\)"
        ):
            tc.get_model("mma.sync", "test")
    finally:
        tc.PRESETS.pop(("test", "wgmma"), None)
    assert ("test", "wgmma") not in tc.model_names()
    with pytest.raises(ValueError, match="already has a preset"):
        tc.register_model("sm90", "wgmma", copy)
    with pytest.raises(TypeError, match="AccumulatorModel"):
        tc.register_model("test", "wgmma", "wgmma")
    with pytest.raises(TypeError, match="arch"):
        tc.register_model(90, "wgmma", copy)
    with pytest.raises(ValueError, match="instruction"):
        tc.register_model("test", " ", copy)


def test_get_model_suggests_close_names_and_lists_the_presets():
    with pytest.raises(tc.UnknownNameError, match=r"did you mean 'wgmma.f16'.*known presets: wgmma \(sm90\), "):
        tc.get_model("wgmma.f61")
    with pytest.raises(tc.UnknownNameError, match=r"unknown arch 'sm900'.*did you mean 'sm90'"):
        tc.get_model("mma.sync", "sm900")


def test_code_tables():
    import fp8sim
    from fp8sim.tensorcore import fast

    e4m3 = fp8sim.format("e4m3")
    t = tc.code_table(e4m3, "clamp")
    assert isinstance(t, tc.CodeTable) and t is tc.code_table(e4m3, "clamp")
    assert (t.cls[0x38], t.sign[0x38], t.sig[0x38], t.exp[0x38], t.val[0x38]) == (1, 0, 8, 0, 1.0)
    assert (t.cls[0x01], t.sig[0x01], t.exp[0x01]) == (1, 1, -6)  # subnormal: emin, significand below 1
    assert tc.code_table(e4m3, "normalize").exp[0x01] == -9
    assert (t.cls[0x00], t.cls[0x80], t.sign[0x80], t.cls[0x7F]) == (0, 0, 1, 3)
    v, e, special = fast.code_tables(e4m3)
    assert np.array_equal(v, t.val.astype(np.float32), equal_nan=True) and special[0x7F] and not special[0x7E]
    assert e[0x38] == 0 and e[0x00] == e[0x7F] < -1000


def test_fast_kernel_models():
    from dataclasses import replace

    from fp8sim.tensorcore.kernels import get_kernel

    def fast_kernel_ok(model):
        return get_kernel("wgmma").claims(model) is None

    wg = tc.get_model("wgmma")
    assert fast_kernel_ok(wg) and fast_kernel_ok(replace(wg, out_rounding="rtz"))
    for ins in ("wgmma.f16", "mma.sync", "exact", "fp32"):
        assert not fast_kernel_ok(tc.get_model(ins)), ins
    assert not fast_kernel_ok(replace(wg, out_rounding="rne"))
    assert not fast_kernel_ok(replace(wg, frac_bits=14))


def test_bits_equal_and_identical():
    x = np.array([1.0, np.nan, -0.0], np.float32)
    y = np.array([1.0, np.nan, 0.0], np.float32)
    y.view(np.uint32)[1] ^= np.uint32(0x80000001)  # another NaN
    assert tc.bits_equal(x, y).tolist() == [True, True, False]
    assert tc.bits_identical(x, y).tolist() == [True, False, False]
