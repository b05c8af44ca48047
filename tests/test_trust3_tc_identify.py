"""Trust, round 3 (#26): the instruction rule that tc.mma and tc.matmul share, sm89 mma.sync k16
chains, identify on outputs its sample cannot tell apart (and recipes that tie), and the data
errors of ``fp8sim verify`` and ``fp8sim identify``."""

from __future__ import annotations

import glob
import os
import zipfile
import zlib

import numpy as np
import pytest

import fp8sim
import fp8sim.tensorcore as tc
from fp8sim.cli import main
from fp8sim.formats import format as fmt_of
from fp8sim.gemms.engine import k_slices
from fp8sim.gemms.identification import bit_match
from fp8sim.tensorcore import archs
from fp8sim.tensorcore.registry import PRESETS

DATA = os.path.join(os.path.dirname(__file__), "data")


def bits(d: np.ndarray) -> np.ndarray:
    return d.view(np.uint16 if d.dtype == np.float16 else np.uint32)


# ------------------------------------------------------------------ one instruction rule (item 3)
#: every base name of the instruction table
BASES = sorted({(r.arch, r.instruction) for r in archs.ROWS})
#: every operand format of the table
FORMATS = sorted({f for r in archs.ROWS for f in r.formats})
#: no scales, and every (scale format, block) pair the table has
SCALES = [None, ("ue8m0", 32), ("ue8m0", 16), ("ue4m3", 16)]


def _codes(rng, name: str, shape) -> np.ndarray:
    f = fmt_of(name)
    return rng.integers(0, f.num_codes, shape).astype(f.code_dtype)


def _scale_codes(rng, sname: str, shape) -> np.ndarray:
    if sname == "ue8m0":  # 2^-15 .. 2^14: products neither all overflow nor all underflow
        return rng.integers(112, 142, shape).astype(np.uint8)
    return rng.integers(0x28, 0x48, shape).astype(np.uint8)  # ue4m3 around 1.0 (0x38)


def _run(fn, a, b, c, fa, fb, instruction, arch, out, sa, sb, sname):
    kw = dict(a_format=fa, b_format=fb, instruction=instruction, arch=arch, out_format=out)
    if sa is not None:
        kw.update(a_scale=sa, b_scale=sb, scale_format=sname)
    return fn(a, b, c, **kw)


def _sweep_cases():
    for arch, ins in BASES:
        for scale in SCALES:
            for out in ("f32", "f16"):
                yield arch, ins, scale, out


@pytest.mark.parametrize(("arch", "ins", "scale", "out"), list(_sweep_cases()), ids=str)
def test_mma_and_matmul_resolve_a_base_name_by_one_rule(arch, ins, scale, out):
    """For every operand pair and K: archs.resolve's row is what both functions run (the same bits
    as the row's registry key), and a refused combination is refused by both."""
    M, N = 8, 8
    rng = np.random.default_rng(zlib.crc32(f"{arch} {ins} {scale} {out}".encode()))
    ran = 0
    for fa in FORMATS:
        for fb in FORMATS:
            for K in (8, 16, 32, 64):
                if scale is not None and K % scale[1]:
                    continue
                a, b = _codes(rng, fa, (M, K)), _codes(rng, fb, (K, N))
                c = rng.standard_normal((M, N)).astype(np.float16 if out == "f16" else np.float32)
                sa = sb = sname = None
                sf = None
                if scale is not None:
                    sname = scale[0]
                    sf = archs.scale_format(sname)
                    sa = _scale_codes(rng, sname, (M, K // scale[1]))
                    sb = _scale_codes(rng, sname, (K // scale[1], N))
                args = (a, b, c, fa, fb, ins, arch, out, sa, sb, sname)
                try:
                    row = archs.resolve(
                        arch, ins, fmt_of(fa), fmt_of(fb), K, out, None if sf is None else (sf, scale[1])
                    )
                except ValueError:
                    row = None
                # a base name that is also a registry preset takes other 8-bit pairs without scales
                # (outside the table: not swept here)
                preset = (arch, ins) in PRESETS and scale is None and out == "f32"
                if row is None and preset and fmt_of(fa).bits == fmt_of(fb).bits == 8:
                    continue
                if row is None or K not in row.ks:  # no single instruction of this base name
                    with pytest.raises((ValueError, TypeError)):
                        _run(tc.mma, *args)
                    if row is None:
                        with pytest.raises((ValueError, TypeError)):
                            _run(tc.matmul, *args)
                    continue
                d_mma = _run(tc.mma, *args)
                d_mat = _run(tc.matmul, *args)
                d_key = _run(tc.mma, *args[:5], row.key, arch, *args[7:])
                assert (bits(d_mma) == bits(d_mat)).all(), (fa, fb, K, row.key)
                assert (bits(d_mma) == bits(d_key)).all(), (fa, fb, K, row.key)
                ran += 1
    if any(r.arch == arch and r.instruction == ins and r.out == out and
           ((scale is None and not r.scales) or (scale is not None and (archs.scale_format(scale[0]).name, scale[1])
                                                 in r.scales)) for r in archs.ROWS):  # fmt: skip
        assert ran > 0


E8M0 = archs.scale_format("ue8m0")


@pytest.mark.parametrize(("arch", "ins"), [("sm100", "tcgen05.mma"), ("sm120", "mma.sync")])
def test_e2m1_with_ue8m0_per_32_is_kind_mxf4_in_mma_and_matmul(arch, ins):
    e2m1 = fmt_of("e2m1")
    # docs/accelerators.md: e2m1, scales, K = 64 -> kind::mxf4 (UE8M0 per 32); K = 32 -> kind::mxf8f6f4
    assert archs.resolve(arch, ins, e2m1, e2m1, 64, "f32", (E8M0, 32)).kind == "mxf4"
    assert archs.resolve(arch, ins, e2m1, e2m1, 128, "f32", (E8M0, 32)).kind == "mxf4"
    assert archs.resolve(arch, ins, e2m1, e2m1, 32, "f32", (E8M0, 32)).kind == "mxf8f6f4"
    assert archs.resolve(arch, ins, e2m1, e2m1, 96, "f32", (E8M0, 32)).kind == "mxf8f6f4"
    rng = np.random.default_rng(26)
    M, N, K = 32, 32, 128
    a, b = _codes(rng, "e2m1", (M, K)), _codes(rng, "e2m1", (K, N))
    sa, sb = _scale_codes(rng, "ue8m0", (M, K // 32)), _scale_codes(rng, "ue8m0", (K // 32, N))
    c = rng.standard_normal((M, N)).astype(np.float32)
    kw = dict(a_format="e2m1", b_format="e2m1", arch=arch)
    mxf4, mx8 = f"{ins}.kind::mxf4", f"{ins}.kind::mxf8f6f4"
    # K = 64: one instruction
    s = dict(a_scale=sa[:, :2], b_scale=sb[:2])
    one = tc.mma(a[:, :64], b[:64], c, instruction=ins, **s, **kw)
    assert (bits(one) == bits(tc.mma(a[:, :64], b[:64], c, instruction=mxf4, **s, **kw))).all()
    assert (bits(tc.matmul(a[:, :64], b[:64], c, instruction=ins, **s, **kw)) == bits(one)).all()
    # the two kinds differ on these data (else the equalities above could not fail)
    two = tc.matmul(a[:, :64], b[:64], c, instruction=mx8, **s, **kw)
    assert (bits(two) != bits(one)).any()
    # K = 128: two kind::mxf4 instructions, the second accumulating onto the first
    d = c
    for k in (0, 64):
        d = tc.mma(a[:, k : k + 64], b[k : k + 64], d, instruction=mxf4, a_scale=sa[:, k // 32 : k // 32 + 2],
                   b_scale=sb[k // 32 : k // 32 + 2], **kw)  # fmt: skip
    got = tc.matmul(a, b, c, instruction=ins, a_scale=sa, b_scale=sb, **kw)
    assert (bits(got) == bits(d)).all()


# ------------------------------------------------------------------ sm89 mma.sync k16 in matmul (item 17)
SM89_F32 = next(r for r in archs.ROWS if r.arch == "sm89" and r.out == "f32")


def test_sm89_matmul_takes_k16_instructions_as_mma_does():
    rng = np.random.default_rng(17)
    M, N = 16, 8
    kw = dict(a_format="e4m3", b_format="e5m2", instruction="mma.sync", arch="sm89")
    for K in (16, 48, 80):
        a, b = _codes(rng, "e4m3", (M, K)), _codes(rng, "e5m2", (K, N))
        c = rng.standard_normal((M, N)).astype(np.float32)
        # the chain of single instructions through tc.mma: k32 ones, then one k16
        d = c
        k0 = 0
        while k0 < K:
            k = 32 if K - k0 >= 32 else 16
            d = tc.mma(a[:, k0 : k0 + k], b[k0 : k0 + k], d, **kw)
            k0 += k
        got = tc.matmul(a, b, c, **kw)
        assert got.dtype == np.float32 and (bits(got) == bits(d)).all(), K


def test_sm89_matmul_k16_and_k48_equal_mmasim():
    from tests import test_arch_models as tam

    tam._mmasim()
    rng = np.random.default_rng(48)
    M, N = 16, 8
    kw = dict(a_format="e4m3", b_format="e4m3", instruction="mma.sync", arch="sm89")
    for K in (16, 48):
        a, b = _codes(rng, "e4m3", (M, K)), _codes(rng, "e4m3", (K, N))
        c = (rng.standard_normal((M, N)) * 8).astype(np.float32)
        ref = c
        for k0, k1 in ((0, 16),) if K == 16 else ((0, 32), (32, 48)):  # m16n8k32, then m16n8k16
            ref = tam.reference(SM89_F32, "e4m3", "e4m3", a[:, k0:k1], b[k0:k1], ref).view(np.float32)
        got = tc.matmul(a, b, c, **kw)
        assert (bits(got) == bits(ref)).all(), K


# ------------------------------------------------------------------ identify: samples that cannot tell (item 4)
def _zero_row_case(seed: int = 4):
    """cublaslt-tensor-fast with split_k=3 on a (32, 1024) a whose rows are zero but for 7 of them, none
    in the even spread of 8 rows over 32 that stage 1 took (0, 4, 9, 13, 18, 22, 27, 31): each
    sampled output was 0 under every candidate."""
    rng = np.random.default_rng(seed)
    M, N, K = 32, 48, 1024
    a = fp8sim.encode(rng.standard_normal((M, K)), "e4m3").astype(np.uint8)
    b = fp8sim.encode(rng.standard_normal((K, N)), "e4m3").astype(np.uint8)
    live = np.array([2, 6, 11, 15, 20, 24, 29])
    a[np.setdiff1d(np.arange(M), live)] = 0
    sa, sb = np.float32(0.75), np.float32(1.25)
    truth = fp8sim.recipe("cublaslt-tensor-fast").with_(split_k=3)
    return a, b, sa, sb, truth, fp8sim.scaled_gemm(a, b, sa, sb, truth)


def _found_split(res, K, truth) -> bool:
    r = res.recipe
    return k_slices(K, r.split_k, r.split_granule) == k_slices(K, truth.split_k, truth.split_granule)


def test_identify_samples_rows_that_tell_candidates_apart():
    a, b, sa, sb, truth, y = _zero_row_case()
    # the split-K layouts differ on these data (the split-1 recipe is not the truth)
    one = fp8sim.scaled_gemm(a, b, sa, sb, truth.with_(split_k=1))
    assert not bit_match(one.astype(np.float32), y.astype(np.float32)).all()
    res = fp8sim.identify(a, b, y, a_scale=sa, b_scale=sb)
    assert res.match_rate == 1.0 and res.mismatches == 0 and _found_split(res, 1024, truth)
    got = fp8sim.scaled_gemm(a, b, sa, sb, res.recipe)
    assert bit_match(got.astype(np.float32), y.astype(np.float32)).all()


def test_identify_widens_stage_2_when_its_sample_cannot_tell(monkeypatch):
    # the sample of before: rows and columns evenly spread, here 8 zero rows (every candidate 100 %)
    from fp8sim.gemms import identification

    def spread(p, shape):
        return identification._spread(p.M, shape[0]), identification._spread(p.N, shape[1])

    monkeypatch.setattr(identification, "_sample_indices", spread)
    a, b, sa, sb, truth, y = _zero_row_case()
    res = fp8sim.identify(a, b, y, a_scale=sa, b_scale=sb)
    assert res.match_rate == 1.0 and _found_split(res, 1024, truth)
    assert sum(row["match_rate"] is not None for row in res.table) > identification.STAGE2


@pytest.mark.parametrize("acc", ["fp64", "sm100:tcgen05.mma.kind::f8f6f4"])
def test_explain_names_recipes_that_tie_at_100_percent(acc):
    # an exact product rounded to bf16, and Blackwell's 25-bit f8f6f4 sum: on N(0, 1) e4m3 data every
    # exact-enough accumulator gives these outputs, so several recipes of the search space tie
    rng = np.random.default_rng(11)
    a = fp8sim.encode(rng.standard_normal((16, 256)), "e4m3").astype(np.uint8)
    b = fp8sim.encode(rng.standard_normal((256, 24)), "e4m3").astype(np.uint8)
    sa = sb = np.float32(1.0)
    truth = fp8sim.recipe("cublaslt-tensor-fast").with_(accumulator=acc, output_format="bf16")
    y = fp8sim.scaled_gemm(a, b, sa, sb, truth)
    res = fp8sim.identify(a, b, y, a_scale=sa, b_scale=sb)
    assert res.match_rate == 1.0 and len(res.ties) >= 1
    for r in [res.recipe, *res.ties]:  # each reproduces every output (checked here, not by identify)
        got = fp8sim.scaled_gemm(a, b, sa, sb, r)
        assert bit_match(got.astype(np.float32), y.astype(np.float32)).all()
    accs = {res.recipe.accumulator, *(t.accumulator for t in res.ties)}
    assert len(accs) >= 2
    text = res.explain()
    assert "tie:" in text
    for t in res.ties:
        assert f"accumulator={t.accumulator!r}" in text or t.accumulator == res.recipe.accumulator
    if acc == "fp64":
        assert "fp64" in accs
    assert res.to_dict()["ties"]


def test_no_tie_reported_when_the_outputs_tell():
    rng = np.random.default_rng(12)
    a = fp8sim.encode(rng.standard_normal((16, 512)), "e4m3").astype(np.uint8)
    b = fp8sim.encode(rng.standard_normal((512, 24)), "e4m3").astype(np.uint8)
    truth = fp8sim.recipe("cublaslt-tensor-fast").with_(output_format="fp32")
    sa, sb = np.float32(0.37), np.float32(1.7)
    y = fp8sim.scaled_gemm(a, b, sa, sb, truth)
    res = fp8sim.identify(a, b, y, a_scale=sa, b_scale=sb)
    assert res.match_rate == 1.0 and res.recipe.accumulator == "wgmma"
    for t in res.ties:  # a tie, if any, really is one
        got = fp8sim.scaled_gemm(a, b, sa, sb, t)
        assert bit_match(got.astype(np.float32), y.astype(np.float32)).all()
    assert ("tie:" in res.explain()) == bool(res.ties)


# ------------------------------------------------------------------ fp8sim verify on the project's data (item 14)
def _cli(capsys, *argv):
    try:
        code = main(list(argv))
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def test_verify_on_every_npz_of_tests_data_exits_0_with_short_lines(capsys):
    files = sorted(glob.glob(os.path.join(DATA, "*.npz")))
    lib = os.path.join(DATA, "libraries_sm90.npz")
    assert lib in files
    code, out, err = _cli(capsys, "verify", *files)
    lines = (out + err).splitlines()
    assert code == 0, [ln[:300] for ln in lines if "ERROR" in ln]
    assert max(map(len, lines)) <= 300
    skip = [ln for ln in lines if ln.startswith(lib + ": skipped")]
    assert len(skip) == 1 and "tests/test_libraries.py" in skip[0]


def test_verify_cuts_a_long_reason_to_one_short_line(tmp_path, capsys):
    # an archive of many unknown arrays: the reader's message lists every key
    f = tmp_path / "many.npz"
    np.savez(f, **{f"entry_{i:04d}": np.zeros(1) for i in range(400)})
    code, out, _ = _cli(capsys, "verify", str(f))
    line = next(ln for ln in out.splitlines() if ln.startswith(str(f)))
    assert code == 1 and "ERROR" in line and len(line) - len(str(f)) <= 250
    code, out, _ = _cli(capsys, "verify", str(f), "--json")
    assert code == 1 and "entry_0399" in out  # --json keeps the whole reason


# ------------------------------------------------------------------ fp8sim identify on bad files (item 15)
def _good_arrays():
    rng = np.random.default_rng(15)
    a = rng.integers(0, 0x70, (4, 32)).astype(np.uint8)
    b = rng.integers(0, 0x70, (32, 4)).astype(np.uint8)
    return dict(a=a, b=b, y=np.zeros((4, 4), np.float32))


def _bad_files(tmp_path):
    good = _good_arrays()
    npy = tmp_path / "renamed.npy"
    np.save(npy, good["a"])
    renamed = tmp_path / "renamed.npz"
    os.rename(npy, renamed)
    src = tmp_path / "src.npz"
    np.savez(src, **good)
    truncated = tmp_path / "truncated.npz"
    with zipfile.ZipFile(src) as zi, zipfile.ZipFile(truncated, "w") as zo:
        for name in zi.namelist():
            data = zi.read(name)
            zo.writestr(name, data[: len(data) // 2] if name == "a.npy" else data)
    obj = tmp_path / "object.npz"
    np.savez(obj, a=good["a"], b=good["b"], y=np.array([[1.0, "x"]], dtype=object))
    return {
        renamed: ("a single .npy array", "renamed"),
        truncated: ("entry 'a'", "truncated"),
        obj: ("entry 'y'", "object array"),
    }


def test_identify_names_the_file_and_the_problem_of_a_bad_npz(tmp_path, capsys):
    for path, words in _bad_files(tmp_path).items():
        code, out, err = _cli(capsys, "identify", str(path))
        lines = err.strip().splitlines()
        assert code == 1 and out == "" and len(lines) == 1, (path, err)
        assert str(path) in lines[0] and all(w in lines[0] for w in words), lines[0]
        assert "Traceback" not in err and len(lines[0]) <= 300
