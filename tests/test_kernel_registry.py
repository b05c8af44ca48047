"""The kernel registry (fp8sim.tensorcore.kernels), the kernel choice of a recipe
(fp8sim.gemms.kernels, ``fp8sim info --kernels``) and the conformance of every kernel with
the bit-exact references.

* The decisions: ``select`` is checked against the predicates the callers used before the
  registry existed (copied below from the old ``tensorcore/api.py``, ``scaled_mma.py``,
  ``fast.py`` and ``cuda.py``), over every registered model, variants of them, formats and K.
* Conformance, parametrized over kernel x registered model: every CPU kernel that claims a model
  runs on random and special codes (inf, NaN, subnormal, zero; several K) and is compared bit for
  bit with an independent computation: the other kernel where two compute the model, the
  instruction chain's definition (one ``mma`` after another, C carried), an exact reference for the
  ``"exact"`` and ``"fp32"`` kinds, the promotion loop over the instruction chain (``chain-loop``)
  for the scaled-GEMM kernels, and the H200 captures for the sm90 presets.
"""

from __future__ import annotations

import glob
import io
import itertools
import json
import os
from contextlib import redirect_stdout
from dataclasses import replace
from fractions import Fraction
from functools import partial

import numpy as np
import pytest

import fp8sim
from fp8sim import tensorcore as tc
from fp8sim.cli import main
from fp8sim.formats import format as get_format
from fp8sim.gemms import KernelChoice, engine, kernel_choice
from fp8sim.gemms.engine import scaled_matmul
from fp8sim.tensorcore import archs
from fp8sim.tensorcore import kernels as K
from tests import capture_sets as lc

MODELS = {key: tc.get_model(key[1], key[0]) for key in tc.model_names()}
MODEL_IDS = {key: f"{key[0]}:{key[1]}" for key in MODELS}
CHAIN = [k for k in K.KERNELS if k.operation == "chain"]
SCALED_EXACT_CPU = [k for k in K.KERNELS if k.operation == "scaled" and k.device == "cpu" and k.name != "blas-fast"]


# ---------------------------------------------------------------- the old predicates (6c70d44)
def _old_general_ok(m):
    if m.kind == "interleaved":
        return m.output == "f32" and m.block % 2 == 0
    if m.kind != "fused":
        return False
    if (m.c_mode, m.product_exponent, m.zero_sign, m.k_order) != ("fused", "nominal", "positive", None):
        return False
    if m.subnormal_exponent not in ("clamp", "normalize"):
        return False
    return not (m.group > 1 and m.align_rounding != "rz")


def _old_legacy_ok(m):
    return (
        m.kind in ("fused", "exact", "fp32")
        and m.instr_k == 32
        and m.zero_exponent is None
        and m.group == 1
        and m.overflow == "ieee"
    )


def _old_fast_ok(m):
    return (
        m.kind == "fused"
        and m.block == 32
        and m.c_mode == "fused"
        and m.align_rounding == "rz"
        and m.product_exponent == "nominal"
        and m.subnormal_exponent == "clamp"
        and m.out_rounding == "rz"
        and m.output == "f32"
        and m.k_order is None
        and m.zero_sign == "positive"
        and m.frac_bits <= 13
        and m.out_frac_bits <= 13
        and m.instr_k == 32
        and m.zero_exponent is None
        and m.group == 1
        and m.overflow == "ieee"
        and m.sum_frac_bits is None
    )


def _old_packed_ok(fa, fb, F):
    for f in (fa, fb):
        t = tc.code_table(f, "clamp")
        e = t.exp[t.cls == 1]
        if e.size and (e.min() < -17 or e.max() > 15):
            return False
    return 0 <= F <= 13 and 2 * fa.mbits + fb.mbits <= 21


def _old_chain(m, fa, fb, k, scales, out16):
    if (
        not scales
        and _old_legacy_ok(m)
        and (m.validated or m.kind != "fused" or not _old_general_ok(m))
        and k % 32 == 0
        and fa.bits == 8
        and fb.bits == 8
        and fa.fits_float32
        and fb.fits_float32
        and not out16
    ):
        return "sm90-bitlevel"
    return "general" if _old_general_ok(m) else "error"


def _old_scaled(m, fa, fb, fidelity, finite):
    if fidelity == "exact" and _old_fast_ok(m):
        return "packed" if finite and _old_packed_ok(fa, fb, m.frac_bits) else "wgmma"
    return "blas-fast" if fidelity == "fast" else "chain-loop"


def _variants():
    out = dict(MODELS)
    for key, m in MODELS.items():
        for change in (
            {"validated": not m.validated},
            {"out_rounding": "rne"},
            {"frac_bits": 14},
            {"subnormal_exponent": "normalize"},
            {"c_mode": "separate"},
            {"block": 16},
        ):
            try:
                out[(key, tuple(change.items()))] = replace(m, **change)
            except (TypeError, ValueError):
                pass
    return out


FORMATS = ["e4m3", "e5m2", "e2m1", "e4m3fnuz", "e5m2fnuz", "e8m0", "bf16", "tf32"]


def _new(req):
    try:
        k = K.select(req)
    except K.NoKernelError:
        return "error"
    if k.name == "packed" and req.finite_codes is False:
        raise AssertionError("packed selected for non-finite codes")
    return k.name


def test_select_takes_the_kernel_the_callers_took_before():
    n = 0
    for m, a, b in itertools.product(_variants().values(), FORMATS, FORMATS):
        fa, fb = get_format(a), get_format(b)
        for k, scales, out16 in itertools.product((16, 32, 96), (False, True), (False, True)):
            got = _new(K.chain_request(m, fa, fb, k, block_scales=scales, out16=out16))
            assert got == _old_chain(m, fa, fb, k, scales, out16), (m, a, b, k, scales, out16)
            n += 1
        if fa.bits != 8 or fb.bits != 8:
            continue
        for fidelity, finite in itertools.product(("exact", "fast"), (True, False)):
            want = _old_scaled(m, fa, fb, fidelity, finite)
            req = K.scaled_request(m, fa, fb, m=8, n=8, k=64, fidelity=fidelity, finite_codes=finite)
            got = _new(req)
            if want == "chain-loop" and got == "error":  # no chain kernel: tc.matmul raised before
                assert _new(K.chain_request(m, fa, fb, 64)) == "error"
                continue
            assert got == want, (m, a, b, fidelity, finite)
            n += 1
            # the facts unknown (the packed kernel checks the codes while it runs)
            if finite:
                assert _new(replace(req, finite_codes=None)) == want
    assert n > 20000
    fp64 = K.scaled_request(None, get_format("e4m3"), get_format("e4m3"))
    assert K.select(fp64).name == "fp64" and K.select(replace(fp64, fidelity="fast")).name == "blas-fast"


def test_cuda_kernel_rules(monkeypatch):
    monkeypatch.setattr(K, "cuda_available", lambda: True)
    e4, e5 = get_format("e4m3"), get_format("e5m2")
    wg = MODELS[("sm90", "wgmma")]
    req = K.scaled_request(wg, e4, e5, backend="cupy")
    assert K.select(req).name == "cuda"
    for bad, why in (
        (replace(req, fidelity="fast"), "fidelity='fast'"),
        (replace(req, a_format=e5), "outside the kernel's exactness conditions"),  # e5m2 A: mbits 2 ok
        (replace(req, model=MODELS[("sm90", "mma.sync")]), "block=16 (only 32)"),
    ):
        if bad.a_format is e5:  # mbits_a = 2 <= 3: e5m2 x e5m2 is inside the conditions
            assert K.select(bad).name == "cuda"
            continue
        with pytest.raises(K.NoKernelError, match=why.replace("(", r"\(").replace(")", r"\)")):
            K.select(bad)
    monkeypatch.setattr(K, "cuda_available", lambda: False)
    with pytest.raises(K.NoKernelError, match="needs CuPy and a CUDA device") as e:
        K.select(req)
    assert isinstance(e.value, NotImplementedError) and isinstance(e.value, ValueError)


def test_no_cupy_backend_error_names_every_kernel(monkeypatch):
    monkeypatch.setattr(K, "cuda_available", lambda: False)
    a = np.full((4, 32), 0x38, np.uint8)
    b = np.full((32, 4), 0x38, np.uint8)
    one = np.ones((4, 1), np.float32), np.ones((1, 4), np.float32)
    with pytest.raises(NotImplementedError) as e:
        scaled_matmul(a, b, *one, a_format="e4m3", b_format="e4m3", kscale=32, promote_every=None, scale_at="epilogue",
                      backend="cupy")  # fmt: skip
    msg = str(e.value)
    assert "cuda: needs CuPy and a CUDA device" in msg
    assert all(f"{k.name}:" in msg for k in K.KERNELS if k.operation == "scaled")


def test_every_registered_model_is_claimed():
    for key, m in MODELS.items():
        assert any(k.claims(m) is None for k in CHAIN), key
        assert any(k.claims(m) is None for k in SCALED_EXACT_CPU), key
        for row in (r for r in archs.ROWS if (r.arch, r.key) == key):
            fa = get_format(row.formats[0])
            req = K.chain_request(m, fa, fa, row.ks[0], block_scales=bool(row.scales), out16=row.out == "f16")
            K.select(req)  # raises where no kernel computes the model on its own operands
    # explain lists every kernel of the operation, in the registry's order
    req = K.chain_request(MODELS[("sm90", "wgmma")], get_format("e4m3"), get_format("e4m3"), 64)
    assert [k.name for k, _ in K.explain(req)] == ["sm90-bitlevel", "general"]
    assert [w for _, w in K.explain(req)] == [None, None]
    with pytest.raises(ValueError, match="unknown kernel"):
        K.get_kernel("nope")


def test_forced_kernel_must_compute_the_request():
    e4 = get_format("e4m3")
    exact = MODELS[("sm90", "exact")]
    with pytest.raises(K.NoKernelError, match="kind 'exact'"):
        K.select(K.chain_request(exact, e4, e4, 32), "general")
    unval = replace(MODELS[("sm90", "wgmma")], validated=False)
    req = K.chain_request(unval, e4, e4, 32)
    assert K.select(req).name == "general"  # the sm90 kernel gives way ...
    assert "not validated" in K.get_kernel("sm90-bitlevel").supports(req)
    assert K.select(req, "sm90-bitlevel").name == "sm90-bitlevel"  # ... but computes it
    a = np.full((2, 32), 0x7F, np.uint8)  # NaN codes
    b = np.full((32, 2), 0x38, np.uint8)
    one = np.ones((2, 1), np.float32), np.ones((1, 2), np.float32)
    with pytest.raises(K.NoKernelError, match="inf / NaN"):
        scaled_matmul(a, b, *one, a_format="e4m3", b_format="e4m3", kscale=32, promote_every=None,
                      scale_at="epilogue", kernel="packed")  # fmt: skip


# ---------------------------------------------------------------- operands
def _codes(rng, fmt, shape, special: bool):
    """Codes of ``fmt``: encoded normal values over a wide range, with zeros and subnormals, and
    with ``special`` also inf / NaN codes and the largest ones."""
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-6, 6, size=shape))
    codes = np.asarray(fp8sim.encode(x, fmt, saturate=True)).astype(fmt.code_dtype)
    vals = np.asarray(fp8sim.decode_table(fmt)) if fmt.bits <= 16 else None
    flat = codes.reshape(-1)
    n = flat.size
    pos = rng.choice(n, size=max(1, n // 8), replace=False)
    flat[pos[: len(pos) // 2]] = 0  # zeros
    flat[pos[len(pos) // 2 :]] = rng.integers(1, 4, size=len(pos) - len(pos) // 2)  # smallest (subnormal)
    if special and vals is not None:
        bad = np.flatnonzero(~np.isfinite(vals))
        big = np.argsort(np.where(np.isfinite(vals), np.abs(vals), 0))[-4:]
        pick = np.concatenate([bad, big]) if bad.size else big
        pos = rng.choice(n, size=max(1, n // 16), replace=False)
        flat[pos] = rng.choice(pick, size=pos.size)
    return codes


def _scale_codes(rng, sfmt: str, shape):
    one = 127 if sfmt == "e8m0" else 0x38  # 1.0 in ue8m0 / ue4m3
    return (one + rng.integers(-2, 3, size=shape)).astype(np.uint8)


def _chain_case(model):
    """(a_format, b_format, K of one instruction, scale (format, block) or None) for a model."""
    key = next(k for k, v in MODELS.items() if v is model)
    rows = [r for r in archs.ROWS if (r.arch, r.key) == key]
    if not rows:
        return "e4m3", "e5m2", 32, None
    r = rows[0]
    fa = r.formats[0]
    fb = fa if r.same_format else r.formats[-1]
    return fa, fb, r.ks[0], (r.scales[0] if r.scales else None)


def _bits_same(x, y):
    return np.array_equal(np.asarray(x).view(np.uint32 if np.asarray(x).dtype == np.float32 else np.uint16),
                          np.asarray(y).view(np.uint32 if np.asarray(y).dtype == np.float32 else np.uint16))  # fmt: skip


def _fp32_rne(x: Fraction) -> float:
    """The float32 nearest ``x`` (ties to even), without double rounding."""
    f = np.float32(float(x))
    cands = [np.nextafter(f, np.float32(-np.inf)), f, np.nextafter(f, np.float32(np.inf))]
    return min(cands, key=lambda c: (abs(Fraction(float(c)) - x), int(np.float32(c).view(np.uint32)) & 1))


def _exact_reference(a, b, c, fa, fb, kind: str) -> np.ndarray:
    """The ``"exact"`` kind (per instruction of 32: C plus the exact sum, one RNE rounding) or the
    ``"fp32"`` kind (C, then each product added in fp32 RNE) on finite codes, in Python."""
    va = np.asarray(fp8sim.decode_table(fa), np.float64)[a]
    vb = np.asarray(fp8sim.decode_table(fb), np.float64)[b]
    M, Kk = a.shape
    N = b.shape[1]
    d = np.empty((M, N), np.float32)
    for i, j in itertools.product(range(M), range(N)):
        acc = np.float32(c[i, j])
        for k0 in range(0, Kk, 32):
            if kind == "exact":
                s = Fraction(float(acc)) + sum(Fraction(va[i, k]) * Fraction(vb[k, j]) for k in range(k0, k0 + 32))
                acc = np.float32(_fp32_rne(s))
            else:
                for k in range(k0, k0 + 32):
                    acc = np.float32(acc + np.float32(va[i, k] * vb[k, j]))
        d[i, j] = acc
    return d


CHAIN_PAIRS = [(k.name, key) for k in CHAIN for key, m in MODELS.items() if k.claims(m) is None]


@pytest.mark.parametrize(
    "kernel,key", CHAIN_PAIRS, ids=[f"{k}-{MODEL_IDS[key]}" for k, key in CHAIN_PAIRS]
)  # fmt: skip
def test_chain_kernel_conformance(kernel, key):
    model = MODELS[key]
    rng = np.random.default_rng(abs(hash((kernel, key))) % 2**32)
    a_name, b_name, k1, scale = _chain_case(model)
    fa, fb = get_format(a_name), get_format(b_name)
    kern = K.get_kernel(kernel)
    req = K.chain_request(model, fa, fb, 2 * k1, block_scales=scale is not None)
    if kern.can_compute(req) is not None:  # the model's own operands are not this kernel's: FP8 ones
        fa, fb, k1, scale = get_format("e4m3"), get_format("e5m2"), 32, None
        req = K.chain_request(model, fa, fb, 64)
    assert kern.can_compute(req) is None, f"{kernel} claims {key} but computes none of its requests"
    kw = dict(a_format=fa, b_format=fb, instruction=model)
    checks = 0
    for nk, special in ((1, True), (2, False), (3, True)):
        Kk = nk * k1
        a = _codes(rng, fa, (6, Kk), special)
        b = _codes(rng, fb, (Kk, 5), special)
        c = (rng.standard_normal((6, 5)) * 4).astype(np.float32)
        if special:
            c[0, 0], c[1, 1] = np.inf, np.nan
        sc = {}
        if scale is not None:
            sfmt, blk = scale
            sa, sb = _scale_codes(rng, sfmt, (6, Kk // blk)), _scale_codes(rng, sfmt, (Kk // blk, 5))
            sc = dict(a_scale=sa, b_scale=sb, scale_format="ue8m0" if sfmt == "e8m0" else sfmt)
        with np.errstate(all="ignore"):
            got = tc.matmul(a, b, c, kernel=kernel, **kw, **sc)
            # the chain's definition: one instruction after another, C carried
            d = c
            for k0 in range(0, Kk, k1):
                part = {}
                if sc:
                    blk = scale[1]
                    s0, s1 = k0 // blk, (k0 + k1) // blk
                    part = dict(
                        a_scale=sc["a_scale"][:, s0:s1], b_scale=sc["b_scale"][s0:s1], scale_format=sc["scale_format"]
                    )
                d = tc.mma(a[:, k0 : k0 + k1], b[k0 : k0 + k1], d, kernel=kernel, **kw, **part)
        assert _bits_same(got, d), (kernel, key, Kk)
        checks += 1
        # the other kernels that compute the same request
        for other in CHAIN:
            if other.name != kernel and other.can_compute(replace(req, k=Kk)) is None:
                with np.errstate(all="ignore"):
                    ref = tc.matmul(a, b, c, kernel=other.name, **kw, **sc)
                assert _bits_same(got, ref), (kernel, other.name, key, Kk)
                checks += 1
        if model.kind in ("exact", "fp32") and not special and Kk % 32 == 0:
            ref = _exact_reference(a, b, c, fa, fb, model.kind)
            assert _bits_same(got, ref), (kernel, key, Kk)
            checks += 1
    assert checks >= 3


DATA = os.path.join(os.path.dirname(__file__), "data")


def _captures(instruction: str):
    return sorted(glob.glob(os.path.join(DATA, f"{instruction}_e*x*_*.npz")))


SM90_CAPTURED = [("sm90", "wgmma"), ("sm90", "wgmma.f16"), ("sm90", "mma.sync")]
CAPTURE_PAIRS = [(k.name, key) for k in CHAIN for key in SM90_CAPTURED if k.claims(MODELS[key]) is None]


@pytest.mark.parametrize("kernel,key", CAPTURE_PAIRS, ids=[f"{k}-{MODEL_IDS[key]}" for k, key in CAPTURE_PAIRS])
def test_chain_kernels_reproduce_the_h200_captures(kernel, key):
    files = _captures(key[1])
    assert len(files) >= 28  # 4 format pairs x 7 families
    for path in files:
        z = np.load(path)
        meta = json.loads(str(z["meta"]))
        with np.errstate(all="ignore"):
            d = tc.mma(z["a"], z["b"], z["c"], a_format=meta["a_format"], b_format=meta["b_format"],
                       instruction=key[1], kernel=kernel)  # fmt: skip
        assert tc.bits_identical(d, z["d"]).all(), (kernel, path)
    if key == ("sm90", "wgmma"):  # the chained captures: 128 instructions along K = 4096
        z = np.load(os.path.join(DATA, "chain_wgmma_e4m3_normal.npz"))
        a, b, c = z["a"][:16], z["b"][:, :16], z["c"][:16, :16]
        d = tc.matmul(a, b, c, a_format="e4m3", b_format="e4m3", instruction="wgmma", kernel=kernel)
        assert tc.bits_identical(d, z["d"][:16, :16]).all()
        d = tc.matmul(a, b, c, a_format="e4m3", b_format="e4m3", instruction="wgmma", kernel=kernel, promote_every=128)
        assert tc.bits_identical(d, z["d_promote128"][:16, :16]).all()


SCALED_PAIRS = [
    (k.name, key)
    for k in SCALED_EXACT_CPU
    if k.name != "chain-loop"
    for key, m in MODELS.items()
    if k.claims(m) is None
]


@pytest.mark.parametrize("kernel,key", SCALED_PAIRS, ids=[f"{k}-{MODEL_IDS[key]}" for k, key in SCALED_PAIRS])
def test_scaled_kernel_conformance(kernel, key):
    """The scaled-GEMM kernels against the promotion loop over the instruction chain (``chain-loop``,
    the reference: :func:`fp8sim.tensorcore.matmul` per promotion interval)."""
    model = MODELS[key]
    rng = np.random.default_rng(7)
    pairs = [("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3"), ("e5m2fnuz", "e4m3fnuz")]
    checks = 0
    for (a_name, b_name), (Kp, P, kscale), app, special in itertools.product(
        pairs, ((32, None, 32), (96, 32, 32), (256, 128, 128), (384, 128, 256)), ("fma", "mul-add", "epilogue"),
        (False, True),
    ):  # fmt: skip
        fa, fb = get_format(a_name), get_format(b_name)
        if kernel == "packed" and special:
            continue  # the packed kernel takes finite codes (the forced run raises: test above)
        if app == "epilogue" or P is None:
            scale_at, nks = "epilogue", 1
        else:
            scale_at, nks = "promotion", -(-Kp // kscale)
        a = _codes(rng, fa, (9, Kp), special)
        b = _codes(rng, fb, (Kp, 7), special)
        sa = np.exp2(rng.integers(-3, 4, size=(9, nks))).astype(np.float32)
        sb = np.exp2(rng.integers(-3, 4, size=(nks, 7))).astype(np.float32) * np.float32(1.375)
        kw = dict(a_format=fa, b_format=fb, kscale=kscale if scale_at == "promotion" else Kp, accumulator=model,
                  promote_every=P, scale_at=scale_at, scale_application="fma" if app == "epilogue" else app)  # fmt: skip
        if kw["promote_every"] is None and scale_at == "promotion":
            continue
        got = scaled_matmul(a, b, sa, sb, kernel=kernel, **kw)
        ref = scaled_matmul(a, b, sa, sb, kernel="chain-loop", **kw)
        # bit for bit, any NaN equal to any NaN: the fp32 accumulator's NaN payload differs (the wgmma
        # kernels leave numpy's 0x7fc00000, the chain the model's 0x7fffffff) and the output cast
        # (cast_output) writes the canonical NaN over both
        assert lc.bit_match(got, ref).all(), (kernel, a_name, b_name, Kp, P, app, special)
        assert np.array_equal(np.isnan(got), np.isnan(ref))
        checks += 1
    assert checks > 40


_LIB_GROUPS = ["sq256_normal_e4m3xe4m3", "special256_nan_e4m3xe5m2", "ragged200x336_normal_e5m2xe4m3"]


def _misread(meta, group: str) -> bool:
    """Blockwise captures that cuBLASLt misreads (tests/test_libraries.py test_blockwise_scale_misread)."""
    return (-(-meta["sets"][lc.set_of(group)]["K"] // 128)) % 4 != 0


LIB_PAIRS = [k.name for k in SCALED_EXACT_CPU if k.claims(MODELS[("sm90", "wgmma")]) is None]


@pytest.mark.parametrize("kernel", LIB_PAIRS)
def test_scaled_kernels_reproduce_the_library_captures(kernel, monkeypatch):
    """cuBLASLt / Triton / DeepGEMM outputs captured on the H200 (tests/capture_sets.py), every
    configuration of three input sets, with ``kernel`` running every scaled GEMM of the engine."""
    groups, meta = lc.load()
    monkeypatch.setattr(engine, "scaled_matmul", partial(scaled_matmul, kernel=kernel))
    n = 0
    for g in _LIB_GROUPS:
        d = groups[g]
        for cfg in (k[2:] for k in d if k.startswith(("y/cublaslt_", "y/triton", "y/deepseek"))):
            if kernel == "packed" and "nan" in g:
                continue  # the captured NaN operands are the packed kernel's refusal (tested above)
            if "_block_" in cfg and _misread(meta, g):
                continue
            r, _ = lc.library_recipe(g, cfg, meta)
            y = lc.emulate(d, g, cfg, r)
            assert np.array_equal(y.view(np.uint32), lc.captured(d, cfg).view(np.uint32)), (kernel, g, cfg)
            n += 1
    assert n >= 20


# ---------------------------------------------------------------- the kernel choice of a recipe
def test_kernel_choice_fp8_recipe():
    ch = kernel_choice("deepseek-v3")
    assert (ch.operation, ch.kernel) == ("scaled", "packed")
    names = [n for n, _ in ch.rows]
    assert names == [k.name for k in K.KERNELS if k.operation == "scaled"]
    why = dict(ch.rows)
    assert "backend='cpu'" in why["cuda"] and "fidelity='exact'" in why["blas-fast"] and why["packed"] is None
    assert any("'wgmma'" in n for n in ch.notes)  # inf / NaN codes run on the general wgmma kernel
    text = ch.explain()
    assert "-> packed" in text and "not taken: backend='cpu'" in text
    assert kernel_choice("deepseek-v3", fidelity="fast").kernel == "blas-fast"
    # a model only the promotion loop computes, and which chain kernel it runs
    bw = kernel_choice("deepseek-v3-blackwell")
    assert bw.kernel == "chain-loop" and "zero_exponent" in dict(bw.rows)["packed"]
    assert any("'general'" in n for n in bw.notes)


@pytest.mark.parametrize("name", ["nvfp4", "mxfp8-blackwell", "mxfp4"])
def test_kernel_choice_block_scaled(name):
    ch = kernel_choice(name)
    assert (ch.operation, ch.kernel) == ("chain", "general")
    assert dict(ch.rows)["sm90-bitlevel"] is not None
    assert kernel_choice(name, backend="cupy").kernel == "general"  # on the host


def test_kernel_choice_wide_recipes():
    assert "float32 BLAS" in kernel_choice("bf16").explain()
    assert "float64 BLAS" in kernel_choice("fp64").explain()
    ch = kernel_choice("bf16-cublaslt")
    assert ch.kernel is None and "BF16 tensor-core model" in ch.notes[0]


def test_kernel_choice_formats_and_errors():
    ch = kernel_choice("deepseek-v3", a_format="e5m2", b_format="e5m2")
    assert ch.formats == ("e5m2", "e5m2") and ch.kernel == "packed"
    with pytest.raises(ValueError, match="backend"):
        kernel_choice("deepseek-v3", backend="tpu")
    assert isinstance(ch, KernelChoice) and fp8sim.gemms.kernel_choice is kernel_choice


def _cli(*argv) -> tuple[int, str]:
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = main(list(argv))
    return rc, buf.getvalue()


def test_cli_info_kernels(monkeypatch):
    rc, out = _cli("info", "--kernels", "deepseek-v3")
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].startswith("recipe 'deepseek-v3' (e4m3 x e4m3, backend='cpu'")
    assert sum(line.lstrip().startswith(("->", "cuda", "blas-fast", "fp64", "packed", "wgmma", "chain-loop"))
               for line in lines) == 6  # fmt: skip
    assert any(line.strip().startswith("-> packed") for line in lines)
    rc, out = _cli("info", "--kernels", "nvfp4")
    assert rc == 0 and "-> general" in out and "sm90-bitlevel  not taken: instr_k=64 (only 32)" in out
    # a machine without CuPy
    monkeypatch.setattr(K, "cuda_available", lambda: False)
    rc, out = _cli("info", "--kernels", "deepseek-v3", "--backend", "cupy")
    assert rc == 0
    assert "cuda        not taken: needs CuPy and a CUDA device" in out and "no kernel computes" in out
    rc, out = _cli("info", "--kernels", "deepseek-v3", "--backend", "cupy", "--json")
    js = json.loads(out)
    assert js["kernel"] is None and js["kernels"][0] == {
        "name": "cuda",
        "supported": False,
        "reason": "needs CuPy and a CUDA device",
    }
