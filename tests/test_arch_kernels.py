"""The fast path of the kernels beyond Hopper (float32 products, int32 sums) against MMA-Sim.

tests/test_arch_models.py draws codes over the whole code space, so nearly every block there
holds an inf/NaN code and takes the float64 path.  Here the codes are finite (and the scales not
NaN), the tiles span several kernel tasks (more than 16 rows, more than 256 columns), and every
output must equal MMA-Sim's bit for bit; the two paths must also agree with each other.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import fp8sim.tensorcore as tc
from fp8sim.formats import format as fmt_of
from fp8sim.tensorcore.scaled_mma import decode_operand

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_arch_models as T  # noqa: E402  (its random cases and its MMA-Sim reference)


def _finite(x, name):
    v, _ = decode_operand(x, fmt_of(name))
    x[~np.isfinite(v)] = 0
    return x


def _one_pair_per_row():
    seen = set()
    for case in T.SAME:
        row, fa, fb, K, scale = case
        if (row.arch, row.key, K, scale) in seen or (row.arch == "sm90" and row.key in ("wgmma", "wgmma.f16")):
            continue
        seen.add((row.arch, row.key, K, scale))
        yield case


@pytest.mark.parametrize("case", list(_one_pair_per_row()), ids=T._id)
def test_fast_path_equals_mmasim_on_finite_tiles(case):
    T._mmasim()
    row, fa, fb, K, scale = case
    rng = np.random.default_rng(abs(hash(T._id(case))) % 2**32)
    a, b, c, sa, sb, sname = T.random_case(rng, row, fa, fb, K, scale, 20, 300, finite_c=True)
    a, b = _finite(a, fa), _finite(b, fb)
    if sa is not None:
        nan = 255 if sname == "ue8m0" else 127
        sa[sa == nan] = 1
        sb[sb == nan] = 1
    d = tc.mma(a, b, c, a_format=fa, b_format=fb, instruction=row.instruction, arch=row.arch, out_format=row.out,
               a_scale=sa, b_scale=sb, scale_format=sname)  # fmt: skip
    ref = T.reference(row, fa, fb, a, b, c, sa, sb, sname)
    assert int((T.bits(d) != ref).sum()) == 0


@pytest.mark.parametrize(("fa", "arch", "instr", "out"), [("e4m3", "sm100", "tcgen05.mma", "f32"),
                                                      ("e2m3", "sm100", "tcgen05.mma", "f16"),
                                                      ("fp16", "sm100", "tcgen05.mma", "f32"),
                                                      ("e5m2fnuz", "cdna3", "mfma", "f32")])  # fmt: skip
def test_fast_and_float64_paths_agree(monkeypatch, fa, arch, instr, out):
    # the same finite operands on the fast path and, with the format check forced off, on the
    # float64 path: two derivations of every output (the module docstrings prove each exact)
    from fp8sim.tensorcore import scaled_mma

    f = fmt_of(fa)
    rng = np.random.default_rng(6)
    if f.bits == 16:
        a = rng.standard_normal((40, 128)).astype(np.float16).view(np.uint16)
        b = rng.standard_normal((128, 300)).astype(np.float16).view(np.uint16)
    else:
        a = _finite(rng.integers(0, f.num_codes, (40, 128)).astype(np.uint8), fa)
        b = _finite(rng.integers(0, f.num_codes, (128, 300)).astype(np.uint8), fa)
    c = (rng.standard_normal((40, 300)) * 2.0 ** rng.integers(-20, 20, (40, 300))).astype(np.float32)
    if out == "f16":
        c = np.clip(c, -6e4, 6e4).astype(np.float16)
    kw = dict(a_format=fa, b_format=fa, instruction=instr, arch=arch, out_format=out)
    fast = tc.matmul(a, b, c, **kw)
    fast_p = tc.matmul(a, b, c, promote_every=64, **kw) if out == "f32" else fast
    monkeypatch.setattr(scaled_mma, "_narrow", lambda fmt: False)
    slow = tc.matmul(a, b, c, **kw)
    slow_p = tc.matmul(a, b, c, promote_every=64, **kw) if out == "f32" else slow
    assert (T.bits(fast) == T.bits(slow)).all() and (T.bits(fast_p) == T.bits(slow_p)).all()
