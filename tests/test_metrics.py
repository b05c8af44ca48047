"""Error metrics, checked against direct formulas on small hand-made arrays."""

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fp8sim
from fp8sim import metrics as M


def test_basic_values():
    r = np.array([3.0, 4.0, 0.0, -1.0])
    a = np.array([3.0, 4.5, 0.0, -1.5])
    assert M.rel_frobenius_error(r, a) == pytest.approx(math.sqrt(0.25 + 0.25) / math.sqrt(26.0))
    assert M.sqnr_db(r, a) == pytest.approx(10 * math.log10(26.0 / 0.5))
    assert M.max_rel_error(r, a) == pytest.approx(0.5)
    assert M.fraction_underflow(np.array([1.0, 2.0, 0.0, 3.0]), np.array([0.0, 2.0, 0.0, 0.0])) == 0.5


def test_exact_and_zero_cases():
    r = np.array([1.0, -2.0])
    assert M.sqnr_db(r, r) == math.inf
    assert M.rel_frobenius_error(r, r) == 0.0
    assert M.max_rel_error(r, r) == 0.0
    z = np.zeros(3)
    assert M.rel_frobenius_error(z, z) == 0.0
    assert M.rel_frobenius_error(z, np.ones(3)) == math.inf
    assert M.sqnr_db(z, np.ones(3)) == -math.inf
    assert M.max_rel_error(z, np.array([0.0, 1.0, 0.0])) == math.inf


def test_nan_handling():
    r = np.array([1.0, np.nan, 2.0])
    a = np.array([1.0, 5.0, 2.5])
    assert M.sqnr_db(r, a) == pytest.approx(10 * math.log10(5.0 / 0.25))
    assert math.isnan(M.sqnr_db(r, a, nan="propagate"))
    assert math.isnan(M.rel_frobenius_error(r, a, nan="propagate"))
    with pytest.raises(ValueError, match="omit"):
        M.sqnr_db(r, a, nan="drop")


def test_infinities():
    r = np.array([np.inf, 1.0])
    assert M.sqnr_db(r, r) == math.inf  # equal infinities: no error
    assert M.rel_frobenius_error(np.array([1.0, 2.0]), np.array([np.inf, 2.0])) == math.inf


def test_dtypes_and_shapes():
    r = np.arange(6, dtype=np.float32).reshape(2, 3)
    a = r.astype(ml_dtypes.bfloat16)
    assert M.sqnr_db(r, a) == math.inf
    with pytest.raises(ValueError, match="shape"):
        M.sqnr_db(r, r.T)
    with pytest.raises(TypeError):
        M.sqnr_db(r, np.array([["a"] * 3] * 2))


@settings(max_examples=50)
@given(
    hnp.arrays(
        np.float64, st.integers(1, 50), elements=st.floats(-1e6, 1e6).filter(lambda v: v == 0 or abs(v) > 1e-100)
    ),
    st.floats(1e-3, 1.0),
)
def test_sqnr_matches_rel_frobenius(r, noise):
    a = r * (1 + noise)
    if not np.any(r):
        return
    rf = M.rel_frobenius_error(r, a)
    assert rf == pytest.approx(noise, rel=1e-9)
    assert M.sqnr_db(r, a) == pytest.approx(-20 * math.log10(rf), rel=1e-9)


def test_saturation_subnormal_and_block_stats():
    x = np.array([[1.0, 2.0, 3.0, 5e-5], [10.0, 20.0, 30.0, 40.0]], np.float32)
    # per tensor with a chosen amax of 3: everything above 3 clips
    q = fp8sim.quantize(x, "e4m3", "tensor", amax=3.0)
    assert M.fraction_saturated(x, q) == 4 / 8
    # 5e-5 / (3/448) = 0.0075 -> e4m3 subnormal 4 * 2**-9 (below 2**-6)
    assert M.fraction_subnormal(q) == 1 / 8
    s = M.summary(x, q)
    assert s["fraction_saturated"] == 0.5 and s["fraction_subnormal"] == 1 / 8
    q = fp8sim.quantize(x, "e4m3", "row")
    b = M.block_stats(x, q)
    assert b["n"].tolist() == [[4], [4]]
    assert b["amax"].ravel().tolist() == [3.0, 40.0]
    d = q.dequantize(np.float64)
    for i in range(2):
        ref = M.sqnr_db(x[i].astype(np.float64), d[i])
        assert b["sqnr_db"][i, 0] == pytest.approx(ref)
        assert b["max_abs_error"][i, 0] == pytest.approx(np.abs(d[i] - x[i]).max())
    assert (b["n_saturated"] == 0).all()
    with pytest.raises(TypeError):
        M.fraction_subnormal(x)


# ------------------------------------------------------------------ NaN outputs are errors (#18 item 5)
def test_nan_output_is_an_infinite_error():
    x = np.array([1.0, 2.0, 3.0])
    for a in (np.full(3, np.nan), np.array([1.0, 2.0, np.nan])):
        assert M.sqnr_db(x, a) == -math.inf
        assert M.rel_frobenius_error(x, a) == math.inf
        assert M.max_rel_error(x, a) == math.inf
        assert math.isnan(M.sqnr_db(x, a, nan="propagate"))
    s = M.summary(x, np.full(3, np.nan))
    assert (s["n"], s["n_nan"], s["n_inf"], s["n_omitted"]) == (3, 3, 0, 0) and s["sqnr_db"] == -math.inf
    # a NaN reference has nothing to compare with: omitted whatever the output
    r = np.array([1.0, np.nan, 2.0, np.nan])
    a = np.array([1.0, np.nan, 2.5, 7.0])
    assert M.sqnr_db(r, a) == pytest.approx(10 * math.log10(5.0 / 0.25), rel=1e-15)
    s = M.summary(r, a)
    assert (s["n_nan"], s["n_omitted"]) == (1, 2)
    s = M.summary(np.ones(2), np.array([np.inf, 1.0]))
    assert s["n_inf"] == 1 and s["sqnr_db"] == -math.inf


def test_nan_in_a_block_destroys_the_block_and_metrics_say_so():
    x = np.random.default_rng(1).standard_normal((1, 256))
    x[0, 5] = np.nan
    q = fp8sim.quantize(x, "e4m3", "1x128")
    d = q.dequantize(np.float64)
    assert np.isnan(d[0, :128]).all() and np.isfinite(d[0, 128:]).all()  # the premise
    s = M.summary(x, q)
    assert (s["n_nan"], s["n_omitted"]) == (128, 1)
    assert s["sqnr_db"] == -math.inf and s["rel_frobenius"] == math.inf and s["max_rel_error"] == math.inf
    assert M.sqnr_db(x, d) == -math.inf
    b = M.block_stats(x, q)
    assert b["sqnr_db"][0, 0] == -math.inf and b["n_nan"].tolist() == [[128, 0]] and b["n"].tolist() == [[127, 128]]
    assert b["sqnr_db"][0, 1] == M.sqnr_db(x[0, 128:], d[0, 128:])
    # NaN in x and the elements of its NaN-scale block are left out of the saturation count
    assert M.quantization_counts(x, q)["n_omitted"] == 128
    assert math.isnan(M.fraction_saturated(x, q, nan="propagate"))


# ------------------------------------------------------------------ saturated = clipped (#18 item 6)
_E4M3_X = [448.0, 449.0, 463.99, 464.0, 464.01, 479.99, 480.0, 1000.0, -464.0, -470.0, np.inf, -np.inf, 1.0]
# By hand: E4M3's max 448 = 1.110b x 2^8 (even mantissa); with one more exponent bit the next value
# would be 480, the midpoint 464.  Clipped = the rounding would give a magnitude above 448.
_E4M3_CLIPPED = {
    "rne": [464.01, 479.99, 480.0, 1000.0, -470.0, np.inf, -np.inf],  # 464 ties to even 448
    "rna": [464.0, 464.01, 479.99, 480.0, 1000.0, -464.0, -470.0, np.inf, -np.inf],
    "rtz": [480.0, 1000.0, np.inf, -np.inf],
    "rup": [449.0, 463.99, 464.0, 464.01, 479.99, 480.0, 1000.0, np.inf, -np.inf],
    "rdn": [480.0, 1000.0, -464.0, -470.0, np.inf, -np.inf],
    "rto": [449.0, 463.99, 464.0, 464.01, 479.99, 480.0, 1000.0, -464.0, -470.0, np.inf, -np.inf],  # 480 odd
}


@pytest.mark.parametrize("mode", sorted(_E4M3_CLIPPED))
def test_saturated_means_clipped_in_the_rounding_mode(mode):
    x = np.array(_E4M3_X)
    q = fp8sim.quantize(x, "e4m3", "tensor", amax=448.0, mode=mode)  # scale exactly 1
    assert q.scales.ravel().tolist() == [1.0]
    assert (np.abs(q.values()[:-1]) == 448).all()  # the premise: every one is at the max code
    want = np.isin(x, _E4M3_CLIPPED[mode])
    c = M.quantization_counts(x, q, mode=mode)
    assert c["n_saturated"] == int(want.sum())
    assert M.fraction_saturated(x, q, mode=mode) == want.sum() / x.size
    assert M.block_stats(x, q, mode=mode)["n_saturated"].ravel().tolist() == [int(want.sum())]


def test_saturation_ties_follow_the_max_code_parity():
    # E5M2: max 57344 = 1.11b x 2^15 (odd mantissa), next 65536, midpoint 61440 rounds up (clipped)
    x = np.array([61440.0, 61439.0, -61440.0])
    q = fp8sim.quantize(x, "e5m2", "tensor", amax=57344.0)
    assert M.quantization_counts(x, q)["n_saturated"] == 2
    # E2M1: max 6 = 1.1b x 2^2 (odd), next 8, midpoint 7 clipped; negative codes too
    x = np.array([6.5, 7.0, -7.5, -8.0, 1.0])
    q = fp8sim.quantize(x, "e2m1", "tensor", amax=6.0)
    assert M.quantization_counts(x, q)["n_saturated"] == 3
    from fp8sim.training.linear import operand_stats

    assert operand_stats(x, q) == (3, 0)
    with pytest.raises(fp8sim.formats.UnknownNameError, match="known modes"):
        M.fraction_saturated(x, q, mode="sideways")


def _fp32_scale_overshoots(rng, n):
    """float32 amaxes whose fp32 scale amax/448 is rounded down, so amax / scale > 448."""
    out = []
    while len(out) < n:
        a = np.float32(rng.uniform(10, 100))
        s = np.float32(np.float64(a) / 448)
        if Fraction(float(a)) / Fraction(float(s)) > 448:
            out.append(a)
    return np.array(out, np.float32)


def test_block_amax_landing_a_float32_step_above_max_is_not_saturated():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 256)).astype(np.float32)
    a = _fp32_scale_overshoots(rng, 64 * 2).reshape(64, 2)
    x[:, 3], x[:, 200] = a[:, 0], a[:, 1]
    q = fp8sim.quantize(x, "e4m3", "1x128")
    s = q.scales.astype(np.float64)
    assert (np.abs(x).reshape(64, 2, 128).max(axis=2) == a).all()
    for blk, col in ((0, 3), (1, 200)):
        assert (q.values()[:, col] == 448).all()
        # above 448 * scale (the old rule counted these), but by far less than the 464 that RNE needs
        assert all(448 < Fraction(float(v)) / Fraction(float(sc)) < 464 for v, sc in zip(x[:, col], s[:, blk]))
    assert M.fraction_saturated(x, q) == 0.0
    assert M.summary(x, q)["fraction_saturated"] == 0.0
    assert M.block_stats(x, q)["n_saturated"].sum() == 0
    from fp8sim.training.linear import operand_stats

    assert operand_stats(x, q)[0] == 0


@pytest.mark.parametrize("g", ["1x128", "g32", "row", "tensor"])
def test_one_definition_of_saturated_and_underflow(g):
    from fp8sim.training.linear import operand_stats

    rng = np.random.default_rng(2)
    x = (rng.standard_normal((8, 256)) * np.exp(rng.uniform(-12, 0, (8, 256)))).astype(np.float32)
    q0 = fp8sim.quantize(x, "e4m3", g)
    q = fp8sim.quantize(x, "e4m3", g, amax=q0.amax * 0.4)  # the largest 60 % of each amax clip
    s = q.expanded_scales()
    # independent count, exact rationals: RNE clips from 464 (exclusive: 464 ties to 448)
    want_sat = sum(Fraction(abs(float(v))) / Fraction(float(sc)) > 464 for v, sc in zip(x.ravel(), s.ravel()))
    d = q.dequantize(np.float64)
    want_under = int(np.count_nonzero((x != 0) & (d == 0)))
    assert want_sat > 0 and want_under > 0
    c = M.quantization_counts(x, q)
    b = M.block_stats(x, q)
    assert c["n_saturated"] == want_sat == b["n_saturated"].sum()
    assert c["n_underflow"] == want_under == b["n_underflow"].sum()
    assert M.fraction_saturated(x, q) == want_sat / x.size == M.summary(x, q)["fraction_saturated"]
    assert M.fraction_underflow(x, d) == want_under / x.size == M.summary(x, q)["fraction_underflow"]
    assert operand_stats(x, q) == (want_sat, want_under)


def test_underflow_counts_no_nan_codes():
    # e4m3fnuz's NaN is code 0x80, whose magnitude bits are zero: it is not a flushed value
    x = np.ones((2, 128))
    x[0, 0] = np.nan
    x[1, :10] = 1e-30
    q = fp8sim.quantize(x, "e4m3fnuz", "1x128")
    assert (q.codes[0] == 0x80).all()  # the premise: the NaN block is all NaN codes
    from fp8sim.training.linear import operand_stats

    assert operand_stats(x, q) == (0, 10)
    assert M.quantization_counts(x, q)["n_underflow"] == 10
    assert M.block_stats(x, q)["n_underflow"].tolist() == [[0], [10]]


# ------------------------------------------------------------------ max_rel_error (#18 item 21)
def test_max_rel_error_meaning_with_underflow():
    r = np.array([1.0, 1e-30, 2.0, -4.0])
    a = np.array([1.5, 0.0, 2.0, -3.0])
    assert M.max_rel_error(r, a) == 1.0  # the flushed element: |0 - r| / |r|
    assert M.max_rel_error(r, a, exclude_underflow=True) == 0.5
    s = M.summary(r, a)
    assert (s["max_rel_error"], s["max_rel_error_excl_underflow"], s["fraction_underflow"]) == (1.0, 0.5, 0.25)


# ------------------------------------------------------------------ streaming (#18 item 20)
_STREAM_CASES = [
    ("e4m3", "1x16", (2, 37, 50)),
    ("e4m3", "8x8", (2, 37, 50)),
    ("e4m3", "col", (37, 50)),
    ("e5m2", "row", (2, 37, 50)),
    ("e4m3", "tensor", (37, 50)),
    ("e4m3", "mx32", (5, 70)),
    ("e2m1", "nvfp4", (5, 70)),
    ("e4m3", fp8sim.scaling.Group(8, axis=0), (37, 6, 5)),
]


@pytest.mark.parametrize("fmt,g,shape", _STREAM_CASES, ids=[f"{c[0]}-{c[1]}" for c in _STREAM_CASES])
def test_streamed_blocks_match_the_whole_tensor(monkeypatch, fmt, g, shape):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(shape) * np.exp(rng.uniform(-8, 2, shape))).astype(np.float32)
    x.reshape(-1)[::97] = 0.0
    q = fp8sim.quantize(x, fmt, g, amax=None)
    whole = M.summary(x, q)
    wb = M.block_stats(x, q)
    monkeypatch.setattr(M, "_CHUNK", 7)  # spans that cut rows and blocks anywhere
    d = np.concatenate([t[1] for t in M._q_spans(x, q)])
    assert np.array_equal(d, q.dequantize(np.float64).ravel())  # bit for bit
    part = M.summary(x, q, progress=True)
    pb = M.block_stats(x, q)
    for k in ("n", "n_nan", "n_inf", "n_omitted", "max_rel_error", "max_rel_error_excl_underflow"):
        assert part[k] == whole[k], k
    for k in ("fraction_underflow", "fraction_saturated", "fraction_subnormal"):
        assert part[k] == whole[k], k
    for k in ("n", "n_saturated", "n_underflow", "n_nan", "max_abs_error"):
        assert np.array_equal(pb[k], wb[k]), k
    # sums: against exact rationals (float64 accumulation of a few thousand terms: << 1e-12)
    xr = [Fraction(float(v)) for v in x.ravel()]
    dr = [Fraction(float(v)) for v in d]
    sig = sum(v * v for v in xr)
    noise = sum((b - a) ** 2 for a, b in zip(xr, dr))
    exact = 10 * math.log10(sig / noise)
    assert part["sqnr_db"] == pytest.approx(exact, rel=1e-12) and whole["sqnr_db"] == pytest.approx(exact, rel=1e-12)
    assert M.sqnr_db(x, d.reshape(shape)) == part["sqnr_db"]  # same spans: identical
    assert np.allclose(pb["sqnr_db"], wb["sqnr_db"], rtol=1e-12, atol=0)


# ------------------------------------------------------------------ fp8sim quantize (#18 items 5, 9, 20, 21)
def _cli(capsys, *argv):
    from fp8sim.cli import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_quantize_reports_destroyed_outputs(tmp_path, capsys):
    import json

    np.save(tmp_path / "n.npy", np.array([[np.nan, 1.0, 2.0]]))
    code, out, _ = _cli(capsys, "quantize", str(tmp_path / "n.npy"), "--json")
    res = json.loads(out)
    assert code == 0 and res["n"] == 3 and res["n_nan"] == 3
    assert float(res["sqnr_db"]) == -math.inf and float(res["rel_frobenius_error"]) == math.inf
    code, out, _ = _cli(capsys, "quantize", str(tmp_path / "n.npy"))
    assert code == 0 and "n_nan: 3" in out and "dB" in out and "flushed to zero" in out


def _help_recipe(capsys) -> str:
    from fp8sim.cli import main

    with pytest.raises(SystemExit):
        main(["quantize", "--help"])
    text = capsys.readouterr().out
    lines = text[text.index("with numpy:") :].splitlines()[1:]
    return "\n".join(ln.strip() for ln in lines[: next(i for i, ln in enumerate(lines) if not ln.startswith("  "))])


@pytest.mark.parametrize(
    "fmt,g,shape",
    [("e2m1", "nvfp4", (6, 40)), ("e4m3", "1x128", (3, 200)), ("e4m3", "128x128", (130, 129)), ("e5m2", "mx32", (70,))],
)
def test_cli_quantize_out_rebuilds_values_by_the_help_recipe(tmp_path, capsys, monkeypatch, fmt, g, shape):
    import json

    x = (np.random.default_rng(4).standard_normal(shape) * 300).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    monkeypatch.chdir(tmp_path)
    code, out, _ = _cli(capsys, "quantize", "x.npy", "-f", fmt, "-g", g, "--out", "q", "--json")
    res = json.loads(out)
    assert code == 0 and res["out"] == "q.npz" and (tmp_path / "q.npz").is_file() and not (tmp_path / "q").exists()
    q = fp8sim.quantize(x, fmt, g)
    recipe = _help_recipe(capsys)
    env = {"np": np, "fp8sim": fp8sim}
    exec(recipe, env)  # the --help text, run as written
    y = env["y"]
    assert y.dtype == np.float64 and np.array_equal(y, q.dequantize(np.float64))
    z = np.load("q.npz")
    assert tuple(z["shape"]) == shape and str(z["dtype"]) == "float32" and float(z["global_scale"]) == q.global_scale
    assert (str(z["format"]), str(z["granularity"]), str(z["scale_format"])) == (
        fmt,
        q.granularity.name,
        q.scale_format,
    )
    assert str(z["scale_rounding"]) == (q.scale_rounding or "none") and str(z["mode"]) == "rne" and bool(z["saturate"])
    if g == "nvfp4":
        assert q.global_scale != 1.0  # the premise: without it the values are off by this factor


def test_saturation_uses_the_mode_the_tensor_was_quantized_with():
    """E4M3 with scale 1 (amax 448 given): 470 lies above the RNE threshold 464 (the midpoint of
    448 and the next binade step 480), so RNE clips it; RTZ truncates it to 448, no clipping.
    Without an explicit mode the metrics must use the mode the tensor was quantized with."""
    x = np.array([[470.0, 1.0]], dtype=np.float32)
    for mode, clipped in (("rne", 1), ("rtz", 0), ("zero", 0)):
        q = fp8sim.quantize(x, "e4m3", "tensor", mode=mode, amax=448.0)
        assert q.mode == ("rtz" if mode == "zero" else mode)
        assert q.scales.reshape(-1)[0] == 1.0
        assert M.quantization_counts(x, q)["n_saturated"] == clipped, mode
        assert M.fraction_saturated(x, q) == clipped / 2, mode
        assert M.summary(x, q)["fraction_saturated"] == clipped / 2, mode
        assert M.fraction_saturated(x, q, mode="rne") == 1 / 2  # an explicit mode still wins
