"""The packed wgmma kernel (fp8sim.tensorcore.fast.wgmma_gemm_codes) and the general fast kernel
(wgmma_gemm) against the bit-level tensor-core model (fp8sim.tensorcore.matmul, independent code):
random codes over the whole code space, ragged shapes, every scale mode, promotion intervals 0 / 32 /
128, e4m3 / e5m2 pairs (and e3m4, fnuz); the packed kernel's rounding-mode switch left no trace."""

import numba
import numpy as np
import pytest
from numba import njit, prange

import fp8sim
from fp8sim import tensorcore as tc
from fp8sim.formats import format as get_format
from fp8sim.gemms.engine import promote as promote_step
from fp8sim.gemms.engine import scaled_matmul
from fp8sim.tensorcore.fast import (
    SCALE_EPILOGUE,
    SCALE_FMA,
    SCALE_MUL_ADD,
    code_tables,
    wgmma_gemm,
    wgmma_gemm_codes,
)

KEEP13 = np.int32(np.uint32((0xFFFFFFFF << 10) & 0xFFFFFFFF).view(np.int32))  # 13 output fraction bits
PAIRS = [("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3"), ("e5m2", "e5m2")]


def bits_equal(x, y):
    x = np.asarray(x, np.float32)
    y = np.asarray(y, np.float32)
    return (x.view(np.uint32) == y.view(np.uint32)) | (np.isnan(x) & np.isnan(y))


def codes(rng, shape, fmt, kind):
    """Random codes: ``finite`` (uniform over the code space, inf / NaN codes replaced by small finite
    ones), ``all`` (finite plus a few of every inf / NaN code, so that some outputs stay finite),
    ``tiny`` (zeros, subnormals and the smallest normals), ``spread`` (finite, a fifth of them forced
    small: long alignment shifts and truncation)."""
    c = rng.integers(0, 256, shape, dtype=np.uint8)
    sp = code_tables(get_format(fmt))[2]
    c[sp[c]] = rng.integers(1, 8, int(sp[c].sum()), dtype=np.uint8)
    if kind == "all":
        m = rng.random(shape) < 0.002
        c[m] = rng.choice(np.flatnonzero(sp).astype(np.uint8), int(m.sum()))
    elif kind == "tiny":
        c &= 0x87
    elif kind == "spread":
        m = rng.random(shape) < 0.2
        c[m] &= 0x8F
    return c


def reference(a, b, fa, fb, sa, sb, kscale, promote, mode):
    """The scaled GEMM from the bit-level model: one tensorcore.matmul partial per promotion interval,
    promoted in fp32 by gemm_core.promote, scaled at promotion (sa[:, kb] * sb[kb]) or in the epilogue."""
    M, Kp = a.shape
    N = b.shape[1]
    step = promote if promote else Kp
    tot = np.zeros((M, N), np.float32)
    for k0 in range(0, Kp, step):
        part = tc.matmul(a[:, k0 : k0 + step], b[k0 : k0 + step], a_format=fa, b_format=fb, instruction="wgmma")
        if not promote:
            tot = part
            break
        kb = k0 // kscale if mode != SCALE_EPILOGUE else 0
        with np.errstate(all="ignore"):
            s = (sa[:, kb : kb + 1] * sb[kb : kb + 1, :]).astype(np.float32)
            tot = promote_step(tot, part, s, mode)
    if mode == SCALE_EPILOGUE:
        with np.errstate(all="ignore"):
            tot = ((sa[:, :1] * sb[:1, :]).astype(np.float32) * tot).astype(np.float32)
    return tot


def general_kernel(a, b, fa, fb, sa, sb, kscale, promote, mode):
    """wgmma_gemm (the kernel for operands with inf / NaN codes) on the decoded operands."""
    va, ea, spa = code_tables(get_format(fa))
    vb, eb, spb = code_tables(get_format(fb))
    askip = np.ascontiguousarray((va[a] == 0) & ~np.isnan(va[a]) & ~spb[b].any(axis=1)[None, :])
    out = np.empty((a.shape[0], b.shape[1]), np.float32)
    with np.errstate(all="ignore"):
        wgmma_gemm(va[a], ea[a], vb[b], eb[b], sa, sb, kscale, promote, mode, 13, KEEP13, askip, out)
    return out


def scales(rng, M, N, nks):
    """Scales over a wide range of binades (powers of two and non-powers), so that the promotion's
    rounding matters."""
    sa = (rng.random((M, nks)) * 2.0 ** rng.integers(-20, 20, (M, nks))).astype(np.float32)
    sb = (rng.random((nks, N)) * 2.0 ** rng.integers(-20, 20, (nks, N))).astype(np.float32)
    return sa, sb


# (promote, mode, kscale): promotion with scales (FMA / mul-add, kscale a multiple of promote), and the
# epilogue scale with promotion every 32 / 128 or none
MODES = [
    (128, SCALE_FMA, 128),
    (32, SCALE_FMA, 64),
    (128, SCALE_MUL_ADD, 128),
    (32, SCALE_MUL_ADD, 32),
    (0, SCALE_EPILOGUE, None),
    (32, SCALE_EPILOGUE, None),
    (128, SCALE_EPILOGUE, None),
]


def _case(rng, fa, fb, kind, M, K, N, promote, mode, kscale):
    a = codes(rng, (M, K), fa, kind)
    b = codes(rng, (K, N), fb, kind)
    kscale = kscale or K
    nks = -(-K // kscale) if mode != SCALE_EPILOGUE else 1
    sa, sb = scales(rng, M, N, nks)
    return a, b, sa, sb, kscale


@pytest.mark.parametrize("fa,fb", PAIRS)
@pytest.mark.parametrize("promote,mode,kscale", MODES)
def test_packed_kernel_equals_tensorcore_model(fa, fb, promote, mode, kscale):
    rng = np.random.default_rng(hash((fa, fb, promote, mode)) % 2**32)
    # ragged M and N (not multiples of the row tile or the 64-column panel), several row tiles (M = 200:
    # three tiles of 72 rows, the last one partial, split into row parts), K a multiple of 32
    cases = [("finite", (25, 256, 70)), ("tiny", (7, 128, 65)), ("spread", (30, 256, 9)), ("finite", (200, 64, 70))]
    for kind, (M, K, N) in cases:
        a, b, sa, sb, ks = _case(rng, fa, fb, kind, M, K, N, promote, mode, kscale)
        got = wgmma_gemm_codes(a, b, get_format(fa), get_format(fb), sa, sb, ks, promote, mode, 13, KEEP13)
        assert got is not None  # finite codes: the packed kernel ran
        ref = reference(a, b, fa, fb, sa, sb, ks, promote, mode)
        bad = ~bits_equal(ref, got)
        assert not bad.any(), (kind, int(bad.sum()))


@pytest.mark.parametrize("fa,fb", [("e3m4", "e3m4"), ("e3m4", "e5m2"), ("e4m3fnuz", "e5m2fnuz")])
def test_packed_kernel_other_formats(fa, fb):
    # e3m4's 5-bit significands take A's smallest nudge (1 + 2**-19); fnuz formats have no -0
    rng = np.random.default_rng(sum(map(ord, fa + fb)))
    for kind, (M, K, N) in [("finite", (20, 256, 70)), ("tiny", (13, 64, 33))]:
        a, b, sa, sb, ks = _case(rng, fa, fb, kind, M, K, N, 128, SCALE_FMA, 128)
        sp_a, sp_b = code_tables(get_format(fa))[2], code_tables(get_format(fb))[2]
        a[sp_a[a]] = 1  # "tiny" masking can make fnuz NaN codes (0x80)
        b[sp_b[b]] = 1
        got = wgmma_gemm_codes(a, b, get_format(fa), get_format(fb), sa, sb, ks, 128, SCALE_FMA, 13, KEEP13)
        assert got is not None
        assert bits_equal(reference(a, b, fa, fb, sa, sb, ks, 128, SCALE_FMA), got).all(), kind


def test_truncation_of_negative_addends():
    # one group, e4m3: 448 (exponent 8) sets u = 2**(8 - 13); -1 * 1 = -32 u is a negative integer
    # (kept whole), -2**-7 * 1 = -u/4 truncates to 0 (floor would give -u); by hand: 448 - 15 = 433,
    # and with B = -1 the signs flip: -448 + 15 = -433; with B = 0.5 (products -16 u, -u/8): 224 - 7.5
    a = np.array([[0x7E] + [0xB8] * 15 + [0x84] * 16], np.uint8)  # 448, -1.0, -2**-7
    b = np.zeros((32, 3), np.uint8)
    b[:, 0], b[:, 1], b[:, 2] = 0x38, 0xB8, 0x30  # 1.0, -1.0, 0.5
    e4m3 = get_format("e4m3")
    one_a, one_b = np.ones((1, 1), np.float32), np.ones((1, 3), np.float32)
    got = wgmma_gemm_codes(a, b, e4m3, e4m3, one_a, one_b, 32, 0, SCALE_EPILOGUE, 13, KEEP13)
    assert got.tolist() == [[433.0, -433.0, 216.5]]
    assert bits_equal(tc.matmul(a, b, a_format="e4m3", b_format="e4m3", instruction="wgmma"), got).all()


def test_packed_a_in_row_blocks(monkeypatch):
    # A packed in blocks of rows (here one 84-row tile each: three blocks, the last partial), B decoded
    # for each: the same bits as the reference
    from fp8sim.tensorcore import fast

    monkeypatch.setattr(fast, "_A_BYTES", 2**17)
    rng = np.random.default_rng(8)
    a, b, sa, sb, ks = _case(rng, "e4m3", "e5m2", "spread", 250, 256, 70, 128, SCALE_MUL_ADD, 128)
    got = wgmma_gemm_codes(a, b, get_format("e4m3"), get_format("e5m2"), sa, sb, ks, 128, SCALE_MUL_ADD, 13, KEEP13)
    assert fast._tile_rows(250) == 84 and got is not None
    assert bits_equal(reference(a, b, "e4m3", "e5m2", sa, sb, ks, 128, SCALE_MUL_ADD), got).all()


@njit(parallel=True)
def _round_probe(x, y):
    """x + y in float32 on every thread of numba's pool (one element per iteration)."""
    out = np.empty(x.size, np.float32)
    for i in prange(x.size):
        out[i] = x[i] + y[i]
    return out


def test_rounding_mode_is_restored():
    # the kernel rounds toward zero inside its tile function only: afterwards every thread (numba's
    # workers and the caller) rounds to nearest again: 1 + 0.75 ulp rounds up to 1 + ulp
    rng = np.random.default_rng(3)
    a, b, sa, sb, ks = _case(rng, "e4m3", "e4m3", "finite", 100, 256, 200, 128, SCALE_FMA, 128)
    n = 64 * numba.get_num_threads()
    x = np.ones(n, np.float32)
    y = np.full(n, 0.75 * 2.0**-23, np.float32)
    up = np.float32(1 + 2.0**-23)
    for threads in (numba.get_num_threads(), 1):
        numba.set_num_threads(threads)
        try:
            got = wgmma_gemm_codes(a, b, get_format("e4m3"), get_format("e4m3"), sa, sb, ks, 128, SCALE_FMA, 13, KEEP13)
            assert got is not None
            assert (_round_probe(x, y) == up).all()
        finally:
            numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        assert (x + y == up).all() and np.float32(1.0) + np.float32(0.75 * 2.0**-23) == up


@pytest.mark.parametrize("fa,fb", PAIRS)
def test_inf_nan_codes_take_the_general_kernel(fa, fb):
    rng = np.random.default_rng(hash((fa, fb, "all")) % 2**32)
    for promote, mode, kscale in [(128, SCALE_FMA, 128), (0, SCALE_EPILOGUE, None)]:
        a, b, sa, sb, ks = _case(rng, fa, fb, "all", 23, 128, 40, promote, mode, kscale)
        assert wgmma_gemm_codes(a, b, get_format(fa), get_format(fb), sa, sb, ks, promote, mode, 13, KEEP13) is None
        ref = reference(a, b, fa, fb, sa, sb, ks, promote, mode)
        assert bits_equal(ref, general_kernel(a, b, fa, fb, sa, sb, ks, promote, mode)).all()
        got = scaled_matmul(
            a,
            b,
            sa,
            sb,
            a_format=fa,
            b_format=fb,
            kscale=ks,
            promote_every=promote or None,
            scale_at="promotion" if mode != SCALE_EPILOGUE else "epilogue",
            scale_application="mul-add" if mode == SCALE_MUL_ADD else "fma",
        )
        assert bits_equal(ref, got).all()
        assert np.isnan(ref).any() and np.isfinite(ref).any()


def test_long_chain_without_promotion():
    # one accumulator over K = 2048 (64 groups): the accumulator's exponent dominates the group's
    rng = np.random.default_rng(5)
    fa = fb = "e5m2"
    a = codes(rng, (5, 2048), fa, "finite")
    b = codes(rng, (2048, 20), fb, "finite")
    a[:, :32] = 0x7B  # large values first: later products fall far below the accumulator
    ones_a, ones_b = np.ones((5, 1), np.float32), np.ones((1, 20), np.float32)
    got = wgmma_gemm_codes(a, b, get_format(fa), get_format(fb), ones_a, ones_b, 2048, 0, SCALE_EPILOGUE, 13, KEEP13)
    ref = tc.matmul(a, b, a_format=fa, b_format=fb, instruction="wgmma")
    assert got is not None and bits_equal(ref, got).all()


def test_scaled_matmul_dispatch_matches_both_kernels():
    # the default path of scaled_matmul (packed kernel) and wgmma_gemm agree on finite codes
    rng = np.random.default_rng(11)
    a, b, sa, sb, ks = _case(rng, "e4m3", "e4m3", "spread", 50, 384, 130, 128, SCALE_FMA, 128)
    got = scaled_matmul(a, b, sa, sb, a_format="e4m3", b_format="e4m3", kscale=ks, promote_every=128)
    assert bits_equal(general_kernel(a, b, "e4m3", "e4m3", sa, sb, ks, 128, SCALE_FMA), got).all()


def test_packed_kernel_scope():
    from dataclasses import replace

    from fp8sim.tensorcore.kernels import get_kernel, scaled_request

    e4m3, e5m2, e8m0 = (get_format(f) for f in ("e4m3", "e5m2", "e8m0"))
    wg = tc.get_model("wgmma")

    def packed_kernel_ok(fa, fb, F):
        return get_kernel("packed").supports(scaled_request(replace(wg, frac_bits=F), fa, fb)) is None

    assert packed_kernel_ok(e4m3, e5m2, 13) and packed_kernel_ok(e5m2, e5m2, 0)
    assert not packed_kernel_ok(e4m3, e5m2, 14)  # more kept bits than the int8 / int32 ranges allow
    assert not packed_kernel_ok(e8m0, e4m3, 13)  # exponents up to 127
    a = np.zeros((3, 0), np.uint8)
    b = np.zeros((0, 4), np.uint8)
    one = np.ones((3, 1), np.float32), np.ones((1, 4), np.float32)
    assert wgmma_gemm_codes(a, b, e4m3, e4m3, *one, 32, 0, SCALE_EPILOGUE, 13, KEEP13) is None  # K = 0


@pytest.mark.slow
@pytest.mark.parametrize("fa,fb", PAIRS)
def test_packed_kernel_equals_tensorcore_model_larger(fa, fb):
    rng = np.random.default_rng(hash((fa, fb, "large")) % 2**32)
    for kind in ("finite", "spread", "tiny"):
        a, b, sa, sb, ks = _case(rng, fa, fb, kind, 97, 1024, 200, 128, SCALE_FMA, 128)
        got = wgmma_gemm_codes(a, b, get_format(fa), get_format(fb), sa, sb, ks, 128, SCALE_FMA, 13, KEEP13)
        assert bits_equal(reference(a, b, fa, fb, sa, sb, ks, 128, SCALE_FMA), got).all(), kind


def test_gemm_end_to_end_uses_the_packed_kernel_bit_for_bit():
    # fp8sim.gemm on Gaussian data (the benchmark's inputs) against the general path of the same recipe
    rng = np.random.default_rng(2)
    x = rng.standard_normal((40, 512)).astype(np.float32)
    w = rng.standard_normal((512, 100)).astype(np.float32)
    r = fp8sim.recipe("deepseek-v3").with_(output_format="fp32")
    slow = tc.AccumulatorModel(**{**tc.get_model("wgmma").summary(), "k_order": tuple(range(32))})
    assert bits_equal(fp8sim.gemm(x, w, r), fp8sim.gemm(x, w, r.with_(accumulator=slow))).all()
