"""fp8sim gives the same bits whatever floating-point environment the caller left.

On x86 the calling thread's MXCSR decides whether subnormal results are flushed to zero (FTZ),
whether subnormal operands are read as zero (DAZ) and how float operations round; numpy's and
numba's arithmetic follow it.  ``torch.set_flush_denormal(True)`` (a documented torch switch) sets
FTZ and DAZ on the calling thread, and a thread started afterwards copies them: numba's worker
threads, started with its thread pool, keep them.

Each check is computed here (the default environment) and in a child process that first turns
FTZ and DAZ on -- through torch, or by writing MXCSR -- then starts numba's thread pool (so that
every worker flushes too; the child checks that they do) and only then imports fp8sim.  The
child's results must equal this process's bit for bit, and the child's environment must be the
same FTZ/DAZ afterwards, on the calling thread and on the workers.  This process's results are
checked against independent references: rounding on the integers of the bit patterns and
ml_dtypes (every float32 from +0 through the subnormals and the first binade of normals, to bf16
and tf32), ml_dtypes' decoding of every code of every format of up to 16 bits, MMA-Sim (every
tensor-core instruction configuration it models as fp8sim does, random tiles over the whole code
space, C with subnormals), and exact arithmetic (tcgen05 block-scaled products 2**-129 .. 2**-126;
the MX quantization of 1e-37).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(
    platform.machine().lower() not in ("x86_64", "amd64"), reason="FTZ/DAZ are x86 MXCSR bits"
)

F32_TINY = 0x00800000  # the bits of 2**-126, the smallest normal float32
KEEP = 1 << 20  # results up to this many elements travel to the child whole (larger ones as digests)


def _bits(a) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a if a.dtype.kind in "ub" else a.view(f"u{a.dtype.itemsize}")


def _digest(v: np.ndarray) -> str:
    return f"{v.dtype.str}{v.shape}" + hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest()


# ------------------------------------------------------------------ inputs (made here, sent to the child)
def _inputs() -> dict[str, np.ndarray]:
    """Every array the checks read: the child must do no float arithmetic of its own."""
    rng = np.random.default_rng(26)
    u = np.arange(1 << 24, dtype=np.uint32)  # +0, every subnormal, the first binade of normals
    s32 = np.concatenate([u, u[::7] | np.uint32(0x80000000)]).view(np.float32)
    s64 = s32[::16].astype(np.float64)
    s64 = np.concatenate([s64, s64 * (1 + 2.0**-30), [1e-39, -1e-39, 5e-324, 3 * 5e-324]])
    x32 = (rng.standard_normal((64, 256)) * 2.0**-118).astype(np.float32)  # float32 subnormals and small normals
    x32[:, ::5] *= np.float32(2.0**-10)
    w32 = (rng.standard_normal((256, 48)) * 2.0**-70).astype(np.float32)
    codes_a = rng.integers(0, 0x7F, (64, 256)).astype(np.uint8)  # finite e4m3 codes of both signs
    codes_a |= rng.integers(0, 2, codes_a.shape).astype(np.uint8) << 7
    return {
        "s32": s32,
        "s64": s64,
        "x32": x32,
        "x64": rng.standard_normal((64, 256)) * 2.0**-135,  # normal in float64, subnormal in float32
        "gx": x32 * np.float32(2.0**48),  # GEMM operands about 2**-70: products near 2**-140
        "w32": w32,
        "tx": np.ascontiguousarray(x32[:, :64] * np.float32(2.0**48)),
        "tw": np.ascontiguousarray(w32[:64].T),
        "tb": x32[0, :48].copy(),
        "tg": (rng.standard_normal((64, 48)) * 2.0**-75).astype(np.float32),
        "codes_a": codes_a,
        "codes_b": rng.integers(0, 0x7F, (256, 48)).astype(np.uint8),
        "tensor_scale": np.array(2.0**-70, np.float32),
        "row_scale": (2.0 ** rng.integers(-75, -65, (64, 1))).astype(np.float32),
        "col_scale": (2.0 ** rng.integers(-75, -65, (1, 48))).astype(np.float32),
        "a_blocks": (2.0 ** rng.integers(-75, -65, (64, 2))).astype(np.float32),
        "b_blocks": (2.0 ** rng.integers(-75, -65, (2, 1))).astype(np.float32),
        "mx_tiny": np.full((1, 32), 1e-37),
        "exp_in": -700.0 - 45.0 * rng.random(100_000),  # exp of these is a float64 subnormal
        "tiny64": rng.standard_normal((8, 16)) * 1e-160,
    }


def _tc_cases(inputs: dict[str, np.ndarray]) -> list[dict]:
    """Every instruction configuration that MMA-Sim models as fp8sim does (tests/test_arch_models.py),
    a random tile over the whole code space each; the arrays go into ``inputs``."""
    from tests import test_arch_models as T

    out = []
    for i, case in enumerate(T.SAME):
        row, fa, fb, K, scale = case
        a, b, c, sa, sb, sname = T.random_case(np.random.default_rng(2600 + i), row, fa, fb, K, scale, 48, 24)
        for k, v in (("a", a), ("b", b), ("c", c), ("sa", sa), ("sb", sb)):
            if v is not None:
                inputs[f"tc{i}_{k}"] = v
        out.append({"i": i, "id": T._id(case), "fa": fa, "fb": fb, "instruction": row.instruction,
                    "arch": row.arch, "out": row.out, "sname": sname})  # fmt: skip
    return out


# ------------------------------------------------------------------ the checks (here and in the child)
_QUANT = [  # (format, granularity, keyword arguments)
    ("e4m3", "tensor", {}),
    ("e4m3", "row", {}),
    ("e4m3", "1x128", {}),
    ("e4m3", "128x128", {}),
    ("e4m3", "128x128", {"scale_format": "pow2"}),
    ("e4m3", "tensor", {"scale_format": "bf16"}),
    ("e4m3", "mx32", {}),
    ("e5m2", "mx32", {"scale_rounding": "rceil"}),
    ("e2m1", "mx32", {}),
    ("e2m1", "nvfp4", {}),
    ("e4m3", "g32", {"mode": "sr", "seed": 3}),
]


def _checks(inp: dict[str, np.ndarray], cases: list[dict]) -> Iterator[tuple[str, Callable[[], np.ndarray]]]:
    """Every check: its name and a function that computes its result, as bit patterns."""
    import fp8sim
    import fp8sim.tensorcore as tc
    from fp8sim.training._detmath import det_exp, det_matmul, det_tanh

    R, E, Q, M = fp8sim.round, fp8sim.encode, fp8sim.quantize, fp8sim.metrics
    s32, s64, x32 = inp["s32"], inp["s64"], inp["x32"]
    for fmt in ("bf16", "tf32", "e8m0"):
        for mode in ("rne", "rtz", "rup", "rdn"):
            yield f"round {fmt} {mode}", lambda fmt=fmt, mode=mode: _bits(R(s32, fmt, mode))
    yield "round bf16 sr", lambda: _bits(R(s32, "bf16", "sr", seed=1, sr_bits=8))
    yield "round bf16 flush_subnormals", lambda: _bits(R(s32, "bf16", flush_subnormals=True))
    yield "encode bf16", lambda: _bits(E(s32, "bf16"))
    yield "encode e8m0", lambda: _bits(E(s32, "e8m0"))
    yield "round float64 bf16", lambda: _bits(R(s64, "bf16"))
    yield "round float64 e8m0 rup", lambda: _bits(R(s64, "e8m0", "rup"))
    yield "round 1e-39 bf16", lambda: _bits(np.asarray(R(1e-39, "bf16")))
    yield "cast bf16 canonical_nan", lambda: _bits(fp8sim.rounding.cast(s32, "bf16", canonical_nan=True))
    for name, f in fp8sim.CATALOGUE.items():
        if f.bits <= 16:
            codes = np.arange(f.num_codes).astype(f.code_dtype)
            yield f"decode {name}", lambda f=f, codes=codes: _bits(fp8sim.decode(codes, f))
            finite = codes[np.isfinite(fp8sim.decode(codes, f))]  # integers: the same in any environment
            yield f"encode decoded {name}", lambda f=f, c=finite: _bits(E(fp8sim.decode(c, f), f))
    yield "quantize 1e-37 mx32 codes", lambda: _bits(Q(inp["mx_tiny"], "e4m3", "mx32").codes)
    yield "quantize 1e-37 mx32 scales", lambda: _bits(Q(inp["mx_tiny"], "e4m3", "mx32").scales)
    for x in ("x32", "x64"):
        for fmt, g, kw in _QUANT:
            key = f"quantize {x} {fmt} {g} {kw}"
            q = lambda x=x, fmt=fmt, g=g, kw=kw: Q(inp[x], fmt, g, **kw)  # noqa: E731
            yield key + " codes", lambda q=q: _bits(q().codes)
            yield key + " scales", lambda q=q: _bits(np.asarray(q().scales))
            yield key + " global", lambda q=q: _bits(np.asarray(q().global_scale, np.float64))
            yield key + " dequantize", lambda q=q: _bits(q().dequantize())

    def summary():
        m = M.summary(x32, Q(x32, "e4m3", "1x128"))
        return _bits(np.array([float(m[k]) for k in sorted(m) if isinstance(m[k], (int, float))]))

    def metrics():
        d = Q(x32, "e4m3", "1x128").dequantize()
        fs = (M.sqnr_db, M.rel_frobenius_error, M.max_rel_error, M.fraction_underflow)
        return _bits(np.array([f(x32, d) for f in fs]))

    def tcgen05():  # block-scaled products 1 * 1 * 2**-127 * 2**-2 = 2**-129 ...: float32 subnormals
        a = np.zeros((2, 32), np.uint8)
        b = np.zeros((32, 3), np.uint8)
        a[:, 0] = b[0, :] = 0x38  # e4m3 1.0
        sa = np.array([[0], [1]], np.uint8)  # ue8m0 2**-127, 2**-126
        sb = np.array([[125, 126, 127]], np.uint8)  # 2**-2, 2**-1, 1
        return _bits(tc.mma(a, b, np.zeros((2, 3), np.float32), a_format="e4m3", b_format="e4m3",
                            instruction="tcgen05.mma", arch="sm100", a_scale=sa, b_scale=sb, scale_format="ue8m0"))  # fmt: skip

    def mma(cs):
        i = cs["i"]
        return _bits(tc.mma(inp[f"tc{i}_a"], inp[f"tc{i}_b"], inp[f"tc{i}_c"], a_format=cs["fa"], b_format=cs["fb"],
                            instruction=cs["instruction"], arch=cs["arch"], out_format=cs["out"],
                            a_scale=inp.get(f"tc{i}_sa"), b_scale=inp.get(f"tc{i}_sb"), scale_format=cs["sname"]))  # fmt: skip

    yield "metrics summary", summary
    yield "metrics", metrics
    yield "tcgen05 mxf8f6f4 2**-129", tcgen05
    for cs in cases:
        yield f"mma {cs['id']}", lambda cs=cs: mma(cs)
    ca, cb = inp["codes_a"], inp["codes_b"]
    yield "tc.matmul wgmma promote 128", lambda: _bits(tc.matmul(ca, cb, a_format="e4m3", b_format="e4m3",
                                                                 promote_every=128))  # fmt: skip
    yield "tc.matmul tcgen05", lambda: _bits(tc.matmul(ca, cb, a_format="e4m3", b_format="e4m3",
                                                       instruction="tcgen05.mma", arch="sm100"))  # fmt: skip
    for name in fp8sim.recipe_names():
        yield f"gemm {name}", lambda name=name: _bits(fp8sim.gemm(inp["gx"], inp["w32"], name))
    for name in ("deepseek-v3", "per-tensor", "cublaslt-tensor"):
        yield f"gemm {name} fast", lambda name=name: _bits(fp8sim.gemm(inp["gx"], inp["w32"], name, fidelity="fast"))
    t = inp["tensor_scale"]
    for name, sa_, sb_ in (
        ("cublaslt-tensor", t, t),
        ("cublaslt-row", inp["row_scale"], inp["col_scale"]),
        ("deepseek-v3", inp["a_blocks"], inp["b_blocks"]),
    ):
        yield f"scaled_gemm {name}", lambda n=name, a=sa_, b=sb_: _bits(fp8sim.scaled_gemm(ca, cb, a, b, n))
    yield "det_exp", lambda: _bits(det_exp(inp["exp_in"]))
    yield "det_tanh", lambda: _bits(det_tanh(inp["x64"]))
    yield "det_matmul", lambda: _bits(det_matmul(inp["tiny64"], np.ascontiguousarray(inp["tiny64"].T)))
    try:
        import torch
    except ImportError:
        return
    import fp8sim.torch as ft

    def linear(recipe, k):
        x = torch.from_numpy(inp["tx"].copy()).requires_grad_(True)
        w = torch.from_numpy(inp["tw"].copy()).requires_grad_(True)
        bias = torch.from_numpy(inp["tb"].copy()).requires_grad_(True)
        y = ft.linear(x, w, bias, recipe=recipe)
        y.backward(torch.from_numpy(inp["tg"].copy()))
        return _bits({"y": y, "dx": x.grad, "dw": w.grad, "db": bias.grad}[k].detach().numpy())

    for recipe in ("deepseek-v3", "mxfp8-blackwell", "bf16"):
        for k in ("y", "dx", "dw", "db"):
            yield f"torch {recipe} {k}", lambda recipe=recipe, k=k: linear(recipe, k)


# ------------------------------------------------------------------ the child process
def _make_halve():
    import numba

    @numba.njit(parallel=True)
    def halve(x, out, tid):
        for i in numba.prange(out.size):
            out[i] = x[0] * np.float32(0.5)
            tid[i] = numba.get_thread_id()

    return halve


_HALVE: list = []


def _probe() -> dict:
    """Whether the calling thread and every numba thread flush ``2**-126 * 0.5`` to zero (the first
    call starts numba's thread pool)."""
    import numba

    if not _HALVE:
        _HALVE.append(_make_halve())
    tiny = np.array([F32_TINY], np.uint32).view(np.float32)
    calling = int(_bits(tiny * np.float32(0.5))[0]) == 0
    out = np.ones(64 * numba.get_num_threads(), np.float32)
    tid = np.full(out.size, -1, np.int64)
    _HALVE[0](tiny, out, tid)
    return {"calling": calling, "workers": bool((_bits(out) == 0).all()), "threads": len(set(tid.tolist()))}


def child(work: str, how: str) -> None:
    """Turn FTZ/DAZ on (``how``: "torch" or "mxcsr"), start numba's pool under it, then compute every
    check and compare it with the expected bits in ``work``; write ``work/report.json``."""
    wd = Path(work)
    if how == "torch":
        import torch

        assert torch.set_flush_denormal(True), "this CPU does not support flush-to-zero"
    else:
        from fp8sim._fpenv import DAZ, FTZ, read_mxcsr, write_mxcsr

        write_mxcsr(read_mxcsr() | FTZ | DAZ)
    before = _probe()  # starts numba's thread pool: its workers copy FTZ/DAZ
    with np.load(wd / "inputs.npz") as f:
        inp = {k: f[k] for k in f.files}
    cases = json.loads((wd / "cases.json").read_text())
    digests = json.loads((wd / "digests.json").read_text())
    with np.load(wd / "expected.npz") as f:
        whole = {k: f[k] for k in f.files}
    differ: dict[str, int | str] = {}  # name: how many elements differ (-1: the digest), or the error
    seen = 0
    for j, (name, fn) in enumerate(_checks(inp, cases)):
        seen += 1
        try:
            v = fn()
        except Exception as e:  # noqa: BLE001 - reported to the parent
            differ[name] = f"{type(e).__name__}: {e}"[:300]
            continue
        if _digest(v) == digests[j][1] and name == digests[j][0]:
            continue
        e = whole.get(f"r{j}")
        same_kind = e is not None and e.shape == v.shape and e.dtype == v.dtype
        differ[name] = int(np.count_nonzero(v != e)) if same_kind else -1
    report = {"before": before, "after": _probe(), "seen": seen, "differ": differ}
    (wd / "report.json").write_text(json.dumps(report))


def _run_child(work: Path, how: str) -> dict:
    env = dict(os.environ)
    env["NUMBA_NUM_THREADS"] = str(max(2, min(4, os.cpu_count() or 2)))  # at least one worker thread
    code = f"import tests.test_fpenv as t; t.child({str(work)!r}, {how!r})"
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads((work / "report.json").read_text())


# ------------------------------------------------------------------ independent references
def _round_bits(b: np.ndarray, drop: int, mode: str) -> np.ndarray:
    """float32 bit patterns ``b`` (finite, far from overflow) rounded to ``23 - drop`` fraction bits on
    the integers: finite floats of one sign are ordered as their patterns, and a carry out of the
    fraction bits steps into the next binade."""
    sign = b & np.uint32(0x80000000)
    mag = b & np.uint32(0x7FFFFFFF)
    low = mag & np.uint32((1 << drop) - 1)
    t = mag - low
    if mode == "rne":
        half = np.uint32(1 << (drop - 1))
        up = (low > half) | ((low == half) & ((t & np.uint32(1 << drop)) != 0))
    elif mode == "rtz":
        up = np.zeros(b.shape, bool)
    else:  # rup / rdn: away from zero on the side they round toward
        up = (low != 0) & ((sign == 0) if mode == "rup" else (sign != 0))
    return sign | (t + (up.astype(np.uint32) << np.uint32(drop)))  # no overflow: mag is far below inf


class _References:
    """The independent reference of each result that has one (``check`` returns whether it had)."""

    def __init__(self, inp: dict[str, np.ndarray], cases: list[dict]):
        from tests import test_arch_models as T

        self.inp = inp
        self.T = T
        self.cases = {f"mma {cs['id']}": cs for cs in cases}
        self.rows = {T._id(cs): cs for cs in T.SAME}

    def expected(self, name: str, v: np.ndarray):
        import ml_dtypes

        import fp8sim

        inp = self.inp
        s32 = inp["s32"]
        words = name.split()
        if words[0] == "round" and words[1] in ("bf16", "tf32") and words[2] in ("rne", "rtz", "rup", "rdn"):
            ref = _round_bits(_bits(s32), 16 if words[1] == "bf16" else 13, words[2])
            if name == "round bf16 rne":  # and ml_dtypes, on the same inputs
                assert (ref == _bits(s32.astype(ml_dtypes.bfloat16).astype(np.float32))).all()
            return ref
        if name == "encode bf16":
            return _bits(s32.astype(ml_dtypes.bfloat16))
        if name == "round 1e-39 bf16":
            return _bits(np.array(1e-39).astype(ml_dtypes.bfloat16).astype(np.float64))
        if words[0] == "decode" and fp8sim.format(words[1]).ml_dtype is not None:
            f = fp8sim.format(words[1])
            ref = _bits(np.arange(f.num_codes).astype(f.code_dtype).view(f.ml_dtype).astype(np.float32))
            nan = (ref & 0x7FFFFFFF) > 0x7F800000
            return np.where(nan & ((v & 0x7FFFFFFF) > 0x7F800000), v, ref)  # any NaN for NaN
        if name == "quantize 1e-37 mx32 scales":
            # 2**(floor(log2 1e-37) - emax(e4m3)) = 2**-131 is below E8M0's smallest value: 2**-127
            return np.array([[0x00400000]], np.uint32)
        if name == "quantize 1e-37 mx32 codes":  # 1e-37 * 2**127 = 17.01...: 18 in E4M3
            return _bits(np.full((1, 32), 1e-37 * 2.0**127).astype(ml_dtypes.float8_e4m3fn))
        if name == "tcgen05 mxf8f6f4 2**-129":  # exact: 2**e, subnormal below 2**-126
            e = np.array([[-129, -128, -127], [-128, -127, -126]])
            return np.where(e < -126, 1 << (e + 149), F32_TINY).astype(np.uint32)
        if name in self.cases:
            cs = self.cases[name]
            row, fa, fb, _K, _scale = self.rows[cs["id"]]
            i = cs["i"]
            return self.T.reference(row, fa, fb, inp[f"tc{i}_a"], inp[f"tc{i}_b"], inp[f"tc{i}_c"],
                                    inp.get(f"tc{i}_sa"), inp.get(f"tc{i}_sb"), cs["sname"])  # fmt: skip
        return None


def _subnormal(v: np.ndarray) -> bool:
    if v.dtype == np.uint32:
        return bool((((v & 0x7F800000) == 0) & ((v & 0x7FFFFF) != 0)).any())
    if v.dtype == np.uint64:
        exp, frac = (v >> np.uint64(52)) & np.uint64(0x7FF), v & np.uint64((1 << 52) - 1)
        return bool(((exp == 0) & (frac != 0)).any())
    return False


# ------------------------------------------------------------------ the tests
@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """The inputs and this process's results (checked against the independent references), in a folder."""
    pytest.importorskip("mmasim")
    work = tmp_path_factory.mktemp("fpenv")
    inp = _inputs()
    cases = _tc_cases(inp)
    refs = _References(inp, cases)
    digests, whole, checked, subnormal = [], {}, [], 0
    for j, (name, fn) in enumerate(_checks(inp, cases)):
        v = fn()
        ref = refs.expected(name, v)
        if ref is not None:
            assert ref.shape == v.shape and (v == ref).all(), f"{name}: {np.count_nonzero(v != ref)} differ"
            checked.append(name)
        subnormal += _subnormal(v)
        digests.append((name, _digest(v)))
        if v.size <= KEEP:
            whole[f"r{j}"] = v
    assert len(checked) >= 230 and subnormal >= 60, (len(checked), subnormal)  # what the checks cover
    np.savez(work / "inputs.npz", **inp)
    np.savez(work / "expected.npz", **whole)
    (work / "cases.json").write_text(json.dumps(cases))
    (work / "digests.json").write_text(json.dumps(digests))
    return work, len(digests)


@pytest.mark.parametrize("how", ["torch", "mxcsr"])
def test_same_bits_under_flush_to_zero(clean, tmp_path, how):
    if how == "torch":
        pytest.importorskip("torch")
    work, n = clean
    for f in ("inputs.npz", "expected.npz", "cases.json", "digests.json"):
        (tmp_path / f).symlink_to(work / f)
    rep = _run_child(tmp_path, how)
    # the child ran with FTZ/DAZ on its calling thread and on every numba thread ...
    before = rep["before"]
    assert before["calling"] and before["workers"] and before["threads"] >= 2, before
    assert rep["seen"] == n and not rep["differ"], f"{len(rep['differ'])} of {n} results differ: {rep['differ']}"
    # ... and fp8sim gave the environment back, on every thread
    assert rep["after"] == before, rep["after"]
