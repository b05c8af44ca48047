"""Bad input gets a clear error or IEEE-style semantics, never a silent wrong answer."""

import ml_dtypes
import numpy as np
import pytest

import fp8sim


@pytest.mark.parametrize(
    "x",
    [
        np.arange(4),
        np.array([1, 2], dtype=object),
        np.array([True]),
        np.array([1 + 2j]),
        np.array([1.0], ml_dtypes.float8_e4m3fn),
        ["a"],
    ],
)
@pytest.mark.parametrize("func", [fp8sim.round, fp8sim.encode])
def test_non_float_input_is_rejected(func, x):  # float16 / bfloat16: tests/test_inputs.py
    with pytest.raises(TypeError, match="float32, float64, float16 or bfloat16"):
        func(x, "e4m3")


def test_unknown_names():
    with pytest.raises(ValueError, match="unknown format 'e9m9'.*e4m3"):
        fp8sim.round(np.ones(2), "e9m9")
    with pytest.raises(ValueError, match="unknown rounding mode 'nearest-odd'.*rne"):
        fp8sim.round(np.ones(2), "e4m3", "nearest-odd")
    with pytest.raises(TypeError, match="mode must be a string"):
        fp8sim.round(np.ones(2), "e4m3", 3)


def test_sr_needs_seed_and_valid_bits():
    with pytest.raises(ValueError, match="seed"):
        fp8sim.round(np.ones(2), "e4m3", "sr")
    with pytest.raises(TypeError, match="seed"):
        fp8sim.round(np.ones(2), "e4m3", "sr", seed=1.5)
    with pytest.raises(ValueError, match="sr_bits"):
        fp8sim.round(np.ones(2), "e4m3", "sr", seed=1, sr_bits=0)
    with pytest.raises(ValueError, match="sr_bits"):
        fp8sim.round(np.ones(2), "e4m3", "sr", seed=1, sr_bits=60)


def test_decode_code_dtype_and_range():
    with pytest.raises(TypeError, match="uint8"):
        fp8sim.decode(np.array([1, 2], np.int64), "e4m3")
    with pytest.raises(TypeError, match="uint8"):
        fp8sim.decode(np.array([1.0], np.float32), "e4m3")
    with pytest.raises(TypeError, match="uint16"):
        fp8sim.decode(np.array([1], np.uint8), "bf16")
    with pytest.raises(ValueError, match="< 16"):
        fp8sim.decode(np.array([3, 16], np.uint8), "e2m1")


def test_nan_cannot_be_encoded_without_nan():
    with pytest.raises(ValueError, match="no NaN"):
        fp8sim.encode(np.array([1.0, np.nan]), "e2m1")
    assert np.isnan(fp8sim.round(np.array([np.nan]), "e2m1")[0])  # values may still say NaN


def test_empty_zero_d_and_non_contiguous():
    e = fp8sim.round(np.zeros((0, 3), np.float32), "e4m3")
    assert e.shape == (0, 3) and e.dtype == np.float32
    assert fp8sim.encode(np.zeros(0), "e5m2").dtype == np.uint8
    s = fp8sim.round(np.float64(1.1), "e4m3")
    assert s.shape == () and s == 1.125
    assert fp8sim.round(3.3, "e4m3") == 3.25  # python float -> float64
    base = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    view = base[::3, 1::2].T
    assert not view.flags.c_contiguous
    got = fp8sim.round(view, "e4m3")
    assert got.shape == view.shape
    assert np.array_equal(got, fp8sim.round(np.ascontiguousarray(view), "e4m3"))
    assert np.array_equal(fp8sim.decode(fp8sim.encode(view, "e4m3"), "e4m3"), got)
    big_endian = np.ones(3, dtype=">f4")
    assert np.array_equal(fp8sim.round(big_endian, "e4m3"), np.ones(3, np.float32))


def test_input_not_modified():
    x = np.array([1.1, -2.3, np.nan], np.float32)
    c = x.copy()
    fp8sim.round(x, "e4m3")
    fp8sim.encode(x, "e4m3", "sr", seed=0)
    assert np.array_equal(x, c, equal_nan=True)


@pytest.mark.parametrize(
    "lookup, wrong, right",
    [
        (fp8sim.format, "e4m33", "e4m3"),
        (fp8sim.format, "bfloat61", "bf16"),
        (fp8sim.granularity, "1x12B", "1x128"),
        (lambda m: fp8sim.round(1.0, "e4m3", m), "stochastik", "stochastic"),
        (fp8sim.recipe, "deepseek-v33", "deepseek-v3"),
    ],
)
def test_unknown_names_suggest_the_close_match(lookup, wrong, right):
    with pytest.raises(fp8sim.UnknownNameError, match=f"did you mean '{right}'"):
        lookup(wrong)
