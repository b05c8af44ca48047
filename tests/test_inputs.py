"""One input rule for every entry point (fp8sim._inputs): float32 / float64 as they are, float16 and
bfloat16 converted to float32 exactly, everything else refused with the same message; boolean
arguments that are real booleans; quantize of formats wider than 8 bits (E5M6)."""

import json
import os
import subprocess
import sys
from fractions import Fraction
from math import floor, frexp

import ml_dtypes
import numpy as np
import pytest

import fp8sim
from fp8sim import NanStyle, metrics
from fp8sim.cli import main

ACCEPTED = "float32, float64, float16 or bfloat16"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _halves(rng, n=4096):
    """float16 and bfloat16 arrays with normals, subnormals, zeros of both signs, inf and NaN."""
    h = rng.integers(0, 1 << 16, n, dtype=np.uint16)
    f16 = h.view(np.float16)
    b16 = h.view(ml_dtypes.bfloat16)
    return f16, b16


def _same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    return np.array_equal(a.view(np.uint8), b.view(np.uint8))


def test_half_to_float32_is_exact():
    # the premise of the rule: every float16 / bfloat16 value (NaN payloads aside) is a float32 value
    f16, b16 = _halves(np.random.default_rng(0), 1 << 16)
    for h in (f16, b16):
        back = h.astype(np.float32).astype(h.dtype)
        ok = np.isnan(h.astype(np.float32))
        assert np.array_equal(back.view(np.uint16)[~ok], h.view(np.uint16)[~ok])


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "e2m1", "e5m6", "bf16"])
@pytest.mark.parametrize("mode", ["rne", "rtz", "sr"])
def test_round_and_encode_take_float16_and_bfloat16(fmt, mode):
    f16, b16 = _halves(np.random.default_rng(1))
    kw = dict(seed=3) if mode == "sr" else {}
    for h in (f16, b16):
        x32 = h.astype(np.float32)
        got = fp8sim.round(h, fmt, mode, saturate=True, **kw)
        assert got.dtype == np.float32
        assert _same_bits(got, fp8sim.round(x32, fmt, mode, saturate=True, **kw))
        fin = np.isfinite(x32) if fp8sim.format(fmt).nan is NanStyle.NONE else np.ones(x32.shape, bool)
        assert _same_bits(
            fp8sim.encode(h[fin], fmt, mode, saturate=True, **kw),
            fp8sim.encode(x32[fin], fmt, mode, saturate=True, **kw),
        )


@pytest.mark.parametrize("g", ["tensor", "1x128", "128x128", "g32", "mx32", "row", "col"])
def test_quantize_takes_float16_and_bfloat16(g):
    rng = np.random.default_rng(2)
    x32 = (rng.standard_normal((96, 300)) * 3).astype(np.float32)
    for dt in (np.float16, ml_dtypes.bfloat16):
        h = x32.astype(dt)
        q = fp8sim.quantize(h, "e4m3", g)
        ref = fp8sim.quantize(h.astype(np.float32), "e4m3", g)
        assert np.array_equal(q.codes, ref.codes) and _same_bits(q.scales, ref.scales)
        assert q.dtype == np.dtype(dt)
        # dequantize rounds the exact float64 product once to the input dtype
        assert _same_bits(q.dequantize(), ref.dequantize(np.float64).astype(dt))


@pytest.mark.parametrize("recipe", ["deepseek-v3", "per-tensor", "mxfp8", "bf16", "fp32", "fp64"])
def test_gemm_takes_float16_and_bfloat16(recipe):
    rng = np.random.default_rng(3)
    x32 = rng.standard_normal((8, 256)).astype(np.float32)
    w32 = rng.standard_normal((256, 16)).astype(np.float32)
    for dt in (np.float16, ml_dtypes.bfloat16):
        x, w = x32.astype(dt), w32.astype(dt)
        y = fp8sim.gemm(x, w, recipe)
        assert _same_bits(y, fp8sim.gemm(x.astype(np.float32), w.astype(np.float32), recipe))
    # the fp64 ground truth of half inputs is exact: products of two float16 values and their
    # sum over K = 256 fit in float64 (11-bit significands, exponents within 2**-48 .. 2**32)
    x16, w16 = x32.astype(np.float16), w32.astype(np.float16)
    if recipe == "fp64":
        exact = [
            [float(sum(Fraction(float(a)) * Fraction(float(b)) for a, b in zip(x16[i], w16[:, j]))) for j in range(16)]
            for i in range(8)
        ]
        assert np.array_equal(fp8sim.gemm(x16, w16, "fp64"), np.array(exact))


def test_fp64_recipe_does_not_round_its_inputs():
    x = np.array([[1.0 + 2.0**-40]])
    y = fp8sim.gemm(x, np.array([[1.0]]), "fp64")
    assert y.dtype == np.float64 and y[0, 0] == 1.0 + 2.0**-40


@pytest.mark.skipif(np.dtype(np.longdouble).itemsize <= 8, reason="np.longdouble is float64 here")
def test_longdouble_is_refused_not_rounded():
    x = np.array([[1 + np.longdouble(2) ** -60]], dtype=np.longdouble)
    for call in (
        lambda: fp8sim.gemm(x, np.ones((1, 1)), "fp64"),
        lambda: fp8sim.gemm(np.ones((1, 1)), x, "fp64"),
        lambda: fp8sim.round(x, "e4m3"),
        lambda: fp8sim.encode(x, "e4m3"),
        lambda: fp8sim.quantize(x, "e4m3"),
    ):
        with pytest.raises(TypeError, match=ACCEPTED):
            call()


def test_bf16_recipe_rounds_float64_once():
    # x = 1 + 2**-8 + 2**-30 (float64).  bf16 has 7 fraction bits: x lies just above the midpoint
    # 1 + 2**-8 of 1 and 1 + 2**-7, so RNE gives 1 + 2**-7.  Through float32 first, the 2**-30 is
    # lost (below float32's half ulp 2**-24 at 1), the value becomes the midpoint itself and ties
    # to even give 1.0 -- the double rounding the bf16 recipe must not do.
    x = np.array([[1.0 + 2.0**-8 + 2.0**-30]])
    w = np.array([[1.0]])
    assert fp8sim.gemm(x, w, "bf16")[0, 0] == 1.0 + 2.0**-7
    r = fp8sim.recipe("bf16").with_(accumulator="fp64")
    assert fp8sim.gemm(x, w, r)[0, 0] == 1.0 + 2.0**-7
    # the same for the float64 accumulation of the fp64 inputs rounded once at the output
    r = fp8sim.recipe("fp64").with_(output_format="bf16")
    assert fp8sim.gemm(x, w, r)[0, 0] == 1.0 + 2.0**-7


BAD = [
    np.arange(2.0).astype(np.int32),
    np.array([True, False]),
    np.array([1 + 2j, 3j]),
    np.array([1.0, 2.0], dtype=object),
    np.array([1.0, 2.0]).astype(ml_dtypes.float8_e4m3fn),
]


@pytest.mark.parametrize("x", BAD, ids=lambda a: str(a.dtype))
def test_every_entry_point_refuses_other_dtypes_with_one_message(x):
    for call in (
        lambda: fp8sim.round(x, "e4m3"),
        lambda: fp8sim.encode(x, "e4m3"),
        lambda: fp8sim.quantize(x, "e4m3"),
        lambda: fp8sim.gemm(x.reshape(1, 2), np.ones((2, 1), np.float32)),
        lambda: fp8sim.gemm(np.ones((1, 2), np.float32), x.reshape(2, 1), "fp64"),
    ):
        with pytest.raises(TypeError, match=f"got dtype {x.dtype}.*") as e:
            call()
        assert ACCEPTED in str(e.value)


def test_boolean_arguments_must_be_booleans():
    x = np.array([1.0, 1e6], np.float32)
    for call in (
        lambda: fp8sim.round(x, "e4m3", saturate="no"),
        lambda: fp8sim.encode(x, "e4m3", saturate="no"),
        lambda: fp8sim.round(x, "e4m3", flush_subnormals="yes"),
        lambda: fp8sim.encode(x, "e4m3", flush_subnormals=None),
        lambda: fp8sim.quantize(x, "e4m3", saturate="no"),
        lambda: fp8sim.quantize(x, "e4m3", ignore_nan="no"),
        lambda: fp8sim.gemm(np.ones((1, 32), np.float32), np.ones((32, 1), np.float32), report="no"),
    ):
        with pytest.raises(TypeError, match="must be True or False"):
            call()
    # numpy booleans are booleans
    assert np.isnan(fp8sim.round(x, "e4m3", saturate=np.False_)[1])
    assert fp8sim.round(x, "e4m3", saturate=np.True_)[1] == 448.0


# ------------------------------------------------------------------ E5M6 (12 bits) in quantize
def _rne_e5m6(v: Fraction) -> Fraction:
    """RNE to E5M6 (bias 15, 6 fraction bits, emin -14, max 65024) with saturation, in Fractions."""
    if v == 0:
        return Fraction(0)
    a = abs(v)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    while Fraction(2) ** e > a:
        e -= 1
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    q = Fraction(2) ** (max(e, -14) - 6)
    n = a / q
    k = floor(n)
    if n - k > Fraction(1, 2) or (n - k == Fraction(1, 2) and k % 2):
        k += 1
    r = min(k * q, Fraction(65024))
    return r if v > 0 else -r


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("g,blk", [("tensor", None), ("1x128", (1, 128)), ("128x128", (128, 128)), ("g32", (1, 32))])
@pytest.mark.parametrize("sf", ["fp32", "pow2"])
def test_quantize_e5m6_against_fraction_reference(dtype, g, blk, sf):
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((130, 160)) * np.exp2(rng.integers(-12, 12, (130, 1)))).astype(dtype)
    x[3, :40] *= 1e-6  # elements far below their block's amax: E5M6 subnormals and zeros
    q = fp8sim.quantize(x, "e5m6", g, scale_format=sf)
    assert q.codes.dtype == np.uint16 and q.format is fp8sim.E5M6
    blk = x.shape if blk is None else blk
    vals = q.values().astype(np.float64)
    for i in sorted(set(range(0, x.shape[0], 7)) | {3, 129}):  # every 7th row, row 3, the last
        for j in range(x.shape[1]):
            bi, bj = i // blk[0], j // blk[1]
            block = x[bi * blk[0] : (bi + 1) * blk[0], bj * blk[1] : (bj + 1) * blk[1]]
            amax = Fraction(float(np.abs(block).max()))
            s = q.scales[bi, bj]
            if sf == "fp32":  # amax / max rounded to float32 (the division is innocuous in float64)
                assert s == np.float32(float(amax) / 65024.0)
            else:  # rceil: the smallest power of two >= float32(amax / max)
                m, e = frexp(float(np.float32(float(amax) / 65024.0)))
                assert float(s) == 2.0 ** (e - 1 if m == 0.5 else e)
            if dtype == np.float64 and sf == "fp32":  # the quotient is the float64 division
                want = _rne_e5m6(Fraction(float(x[i, j]) / float(s)))
            else:  # exact: float32 / float32 rounded to float64 is innocuous; pow2 scales are exact
                want = _rne_e5m6(Fraction(float(x[i, j])) / Fraction(float(s)))
            assert Fraction(float(vals[i, j])) == want, (i, j, x[i, j], s)
    assert np.array_equal(q.dequantize(np.float64), vals * q.expanded_scales())


# ------------------------------------------------------------------ CLI and example, bf16 .npy files
def test_cli_reads_bfloat16_npy_with_dtype_hint(tmp_path, capsys):
    x = (np.random.default_rng(5).standard_normal((4, 256)) * 2).astype(ml_dtypes.bfloat16)
    path = str(tmp_path / "b.npy")
    np.save(path, x)  # numpy writes raw 2-byte records (descr '<V2')
    code = main(["quantize", path, "--json"])
    _, err = capsys.readouterr()
    assert code == 2 and "--dtype bfloat16" in err and "V2" in err
    code = main(["quantize", path, "--dtype", "bfloat16", "--json", "--quiet"])
    out, _ = capsys.readouterr()
    res = json.loads(out)
    assert code == 0 and res["dtype"] == "bfloat16"
    q = fp8sim.quantize(x.astype(np.float32), "e4m3")  # the API (same default granularity) on the exact conversion
    assert res["rel_frobenius_error"] == metrics.summary(x.astype(np.float32), q)["rel_frobenius"]
    # float16 needs no hint; ints get the one message
    np.save(tmp_path / "h.npy", x.astype(np.float16))
    assert main(["quantize", str(tmp_path / "h.npy"), "--json", "--quiet"]) == 0
    capsys.readouterr()
    np.save(tmp_path / "i.npy", np.arange(8))
    assert main(["quantize", str(tmp_path / "i.npy")]) == 2
    assert ACCEPTED in capsys.readouterr().err
    np.save(tmp_path / "f.npy", np.ones(4, np.float32))
    assert main(["quantize", str(tmp_path / "f.npy"), "--dtype", "bfloat16"]) == 2  # not raw records
    assert "float32" in capsys.readouterr().err


def test_compare_granularities_example_on_a_bfloat16_npy(tmp_path):
    x = np.random.default_rng(6).standard_normal((32, 256)).astype(ml_dtypes.bfloat16)
    np.save(tmp_path / "b.npy", x)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    script = os.path.join(ROOT, "examples", "compare_granularities.py")
    run = [sys.executable, script, str(tmp_path / "b.npy")]
    bad = subprocess.run(run, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert bad.returncode != 0 and "--dtype bfloat16" in bad.stderr
    ok = subprocess.run(run + ["--dtype", "bfloat16"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "(32, 256) bfloat16" in ok.stdout and "1x128" in ok.stdout
