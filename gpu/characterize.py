"""Characterize the FP8 tensor-core accumulator of an NVIDIA GPU.

``python -m gpu.characterize`` runs crafted-input probes (in the style of
Fasi, Higham, Mikaitis & Pranesh 2021, "Numerical behavior of NVIDIA tensor
cores", and of MMA-Sim, Xie et al. 2025) on the GPU for each instruction and
format pair, prints each probe's evidence table, fits the parameters of an
:class:`fp8sim.tensorcore.AccumulatorModel` and checks the fitted model
against every probe input.  ``--save FILE`` keeps the raw probe inputs and
outputs (.npz); ``--replay FILE`` re-runs the analysis from such a file
without a GPU; ``--emulate INSTR`` runs the probes against one of fp8sim's
models instead of hardware (a self-test of the probes).

Every probe is a dot product ``d = sum_k a_k b_k + c`` with K = 32, run as
one output element of one instruction (the hardware runner packs 8 probes
per instruction on the diagonal of the output tile).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field, replace

import numpy as np

import fp8sim
from fp8sim import tensorcore as tc

PAIRS = [("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3"), ("e5m2", "e5m2")]


# ------------------------------------------------------------------ helpers
def enc(vals, fmt) -> np.ndarray:
    """Codes of exactly representable values (asserts exactness)."""
    v = np.asarray(vals, np.float64)
    dt = fp8sim.format(fmt).ml_dtype
    codes = v.astype(np.float32).astype(dt).view(np.uint8)
    back = codes.view(dt).astype(np.float64)
    ok = (back == v) | (np.isnan(back) & np.isnan(v))
    if not np.all(ok):
        raise ValueError(f"not exactly representable in {fmt}: {v[~ok][:5]}")
    return codes


def _dec(codes, fmt):
    return np.asarray(codes, np.uint8).view(fp8sim.format(fmt).ml_dtype).astype(np.float64)


def normal_exp_range(fmt):
    f = fp8sim.format(fmt)
    return f.emin, f.emax


def pow2_factors(t: int, fa: str, fb: str):
    """(x, y) with x*y = 2**t, x a normal of fa, y a normal of fb; None if impossible."""
    lo_a, hi_a = normal_exp_range(fa)
    lo_b, hi_b = normal_exp_range(fb)
    for ea in range(hi_a, lo_a - 1, -1):
        eb = t - ea
        if lo_b <= eb <= hi_b:
            # prefer balanced exponents
            best = min(range(lo_a, hi_a + 1), key=lambda e: abs(e - (t - e)) if lo_b <= t - e <= hi_b else 1e9)
            return 2.0**best, 2.0 ** (t - best)
    return None


def max_pow2_product(fa, fb):
    return normal_exp_range(fa)[1] + normal_exp_range(fb)[1]


def min_pow2_product(fa, fb):
    return normal_exp_range(fa)[0] + normal_exp_range(fb)[0]


class Batch:
    """A list of probe dot products under construction."""

    def __init__(self, fa, fb):
        self.fa, self.fb = fa, fb
        self.a, self.b, self.c, self.labels = [], [], [], []

    def add(self, terms, c=0.0, label=None):
        """terms: list of (position, a_value, b_value)."""
        av = np.zeros(32)
        bv = np.zeros(32)
        for pos, x, y in terms:
            av[pos] = x
            bv[pos] = y
        self.a.append(av)
        self.b.append(bv)
        self.c.append(c)
        self.labels.append(label)

    def add_codes(self, ac, bc, c=0.0, label=None):
        self.a.append(np.asarray(ac, np.uint8))
        self.b.append(np.asarray(bc, np.uint8))
        self.c.append(c)
        self.labels.append(label)

    def arrays(self):
        A = np.stack([x if x.dtype == np.uint8 else enc(x, self.fa) for x in self.a]).astype(np.uint8)
        B = np.stack([x if x.dtype == np.uint8 else enc(x, self.fb) for x in self.b]).astype(np.uint8)
        C = np.array(self.c, dtype=np.float32)
        return A, B, C


@dataclass
class ProbeResult:
    name: str
    instruction: str
    a_format: str
    b_format: str
    A: np.ndarray
    B: np.ndarray
    C: np.ndarray
    D: np.ndarray
    labels: list
    table: list = field(default_factory=list)
    findings: dict = field(default_factory=dict)


def emulator_runner(model):
    def run(A, B, C, fa, fb):
        return tc.mma(A[:, None, :], B[:, :, None], C[:, None, None], a_format=fa, b_format=fb, instruction=model)[
            :, 0, 0
        ]

    return run


def hardware_runner(instruction):
    from . import launch as K

    Mi, Ni = K.SHAPES[instruction]

    def run(A, B, C, fa, fb):
        T = A.shape[0]
        n_inst = -(-T // 8)
        a = np.zeros((n_inst, Mi, 32), np.uint8)
        b = np.zeros((n_inst, 32, Ni), np.uint8)
        c = np.zeros((n_inst, Mi, Ni), np.float32)
        idx = np.arange(T)
        a[idx // 8, idx % 8] = A
        b[idx // 8, :, idx % 8] = B
        c[idx // 8, idx % 8, idx % 8] = C
        d = K.run(instruction, a, b, c, fa, fb)
        return d[idx // 8, idx % 8, idx % 8]

    return run


def f32hex(x) -> str:
    return f"0x{int(np.float32(x).view(np.uint32)):08x}"


def fmtv(x) -> str:
    x = float(x)
    if x != x or x in (float("inf"), float("-inf")):
        return str(x)
    if x == 0:
        return "-0" if np.signbit(x) else "0"
    m, e = np.frexp(x)
    if abs(m) == 0.5:
        return f"{'-' if x < 0 else ''}2^{e - 1}"
    return f"{x:.9g}"


# ------------------------------------------------------------------ probes
# Position triples used by the alignment probes: a triple whose three
# positions are summed by one fused addition gives the smallest threshold.
TRIPLES = [(0, 1, 2), (0, 1, 4), (0, 4, 8), (0, 16, 17), (30, 31, 29)]


def probe_sanity(fa, fb):
    """Exactly representable small-integer dot products.

    Hypothesis: operand layouts and the kernel are right.  Inputs: a, b random
    integers in [-4, 4], c a small integer; every partial sum is exact in any
    plausible accumulator.  Outcome: all outputs equal the exact sum -> the
    harness is trustworthy; any difference -> a layout/descriptor bug, and no
    other probe can be interpreted.
    """
    rng = np.random.default_rng(7)
    bt = Batch(fa, fb)
    for _ in range(64):
        bt.add(
            [(k, float(rng.integers(-4, 5)), float(rng.integers(-4, 5))) for k in range(32)],
            float(rng.integers(-64, 65)),
            "int",
        )

    def interpret(r: ProbeResult):
        va = _dec(r.A, fa)
        vb = _dec(r.B, fb)
        exact = (va * vb).sum(1) + r.C
        ok = np.array_equal(exact.astype(np.float32), r.D)
        r.table = [("exact small-integer sums", f"{int((exact == r.D).sum())}/{len(exact)} exact")]
        r.findings = {"sanity_ok": bool(ok)}

    return bt, interpret


def _cancel_small(bt, E, t, fa, fb, sign=1.0, mult=1.0, pos=(0, 1, 2), label=None, big=(1.0, 1.0)):
    """+big*2^E at pos0, -big*2^E at pos1, sign*mult*2^(E-t) at pos2."""
    xa, xb = pow2_factors(E, fa, fb)
    s = pow2_factors(E - t, fa, fb)
    if s is None:
        return False
    sa, sb = s
    bt.add(
        [(pos[0], xa * big[0], xb * big[1]), (pos[1], -xa * big[0], xb * big[1]), (pos[2], sign * sa * mult, sb)],
        0.0,
        label,
    )
    return True


def probe_alignment(fa, fb):
    """How many fraction bits below the largest exponent does each addend keep,
    and how is the rest rounded?

    Inputs: products +2^E, -2^E and s = +-2^(E-t) (also +-1.5*2^(E-t)) for
    t = 1, 2, ...; C = 0.  The exact sum is s.  The large terms cancel
    exactly, so what survives is s as aligned to the largest exponent E.
    Outcomes: s returned exactly for t <= F and 0 for t > F (truncation, RZ):
    F is the number of kept fraction bits.  For -2^(E-t), t > F: result 0 means
    truncation toward zero of the magnitude (sign-magnitude, "rz"); -2^(E-F)
    means two's-complement truncation (toward -inf, "rd").  For 1.5*2^(E-F):
    2^(E-F) -> truncation; 2^(E-F+1) -> rounding to nearest.
    """
    bt = Batch(fa, fb)
    E = max_pow2_product(fa, fb)
    for pos in TRIPLES:
        for t in range(1, 64):
            for sign in (1.0, -1.0):
                for mult in (1.0, 1.5):
                    _cancel_small(bt, E, t, fa, fb, sign, mult, pos=pos, label=(t, sign, mult, pos))

    def interpret(r: ProbeResult):
        thr = {}
        allrows = {}
        for lab, d in zip(r.labels, r.D):
            allrows[lab] = d
        tmax = max(lab[0] for lab in allrows)
        for pos in TRIPLES:
            F = None
            for t in range(1, tmax + 1):
                if allrows.get((t, 1.0, 1.0, pos)) == 2.0 ** (E - t):
                    F = t
                else:
                    break
            thr[pos] = F
        pos = min(TRIPLES, key=lambda p: thr[p] if thr[p] is not None else 999)
        F = thr[pos]
        rows = {lab[:3]: d for lab, d in allrows.items() if lab[3] == pos}
        r.table.append(
            (
                "largest t kept, per positions (i, j, l) of (+2^E, -2^E, 2^(E-t))",
                "; ".join(f"{p}: {thr[p]}" for p in TRIPLES),
            )
        )
        rd = None
        if F is not None and (F + 1, -1.0, 1.0) in rows:
            v = rows[(F + 1, -1.0, 1.0)]
            rd = "rz" if v == 0 else ("rd" if v == -(2.0 ** (E - F)) else f"other({fmtv(v)})")
        rnd = None
        if F is not None and (F, 1.0, 1.5) in rows:
            v = rows[(F, 1.0, 1.5)]
            rnd = (
                "truncate" if v == 2.0 ** (E - F) else ("round-up" if v == 2.0 ** (E - F + 1) else f"other({fmtv(v)})")
            )
        for t in range(max(1, (F or 13) - 2), min(tmax, (F or 13) + 3) + 1):
            for sign in (1.0, -1.0):
                for mult in (1.0, 1.5):
                    if (t, sign, mult) in rows:
                        r.table.append(
                            (
                                f"+2^{E} -2^{E} {'+' if sign > 0 else '-'}{mult:g}*2^{E - t} (t={t})",
                                fmtv(rows[(t, sign, mult)]),
                            )
                        )
        r.findings = {
            "frac_bits": F,
            "align_rounding": rd,
            "align_half": rnd,
            "E": E,
            "positions": list(pos),
            "per_positions": {str(k): v for k, v in thr.items()},
        }

    return bt, interpret


def probe_product_exponent(fa, fb):
    """Is the alignment exponent of a product ea+eb (its significand in [1,4))
    or the normalized exponent of the product?

    Inputs: products +1.5*1.5*2^E, -1.5*1.5*2^E (= +-2.25*2^E, nominal exponent E,
    true exponent E+1) and +2^(E-t).  Outcome: the threshold t at which 2^(E-t)
    disappears equals F (from probe_alignment) -> "nominal"; F-1 -> "normalized".
    """
    bt = Batch(fa, fb)
    E = max_pow2_product(fa, fb) - 2
    for pos in TRIPLES:
        for t in range(1, 60):
            _cancel_small(bt, E, t, fa, fb, 1.0, 1.0, pos=pos, label=(t, pos), big=(1.5, 1.5))

    def interpret(r: ProbeResult):
        res = {lab: d for lab, d in zip(r.labels, r.D)}
        thrs = []
        for pos in TRIPLES:
            thr = None
            for t in range(1, 60):
                if res.get((t, pos)) == 2.0 ** (E - t):
                    thr = t
                else:
                    break
            thrs.append(thr if thr is not None else 0)
        thr = min(thrs)
        r.table = [(f"+-2.25*2^{E}, +2^({E}-t): largest t kept (min over position triples)", str(thr))]
        r.findings = {"kept_t_with_2.25": thr}

    return bt, interpret


def probe_c_entry(fa, fb):
    """Does C take part in the fused alignment, or is it added separately?

    (a) C = 2^(E-t), products +2^E, -2^E: fused -> C survives only for t <= F;
        separate (products summed first, then an fp32 add) -> C always survives.
    (b) C = 2^E, products -2^E and +2^(E-t): fused -> 2^(E-t) for t <= F;
        separate -> the product sum -2^E+2^(E-t) is rounded first.
    (c) C = 2^(E+u), products 2^E + ...: does a large C set the alignment
        exponent (products lost when u > F)?
    """
    bt = Batch(fa, fb)
    E = max_pow2_product(fa, fb) - 4
    xa, xb = pow2_factors(E, fa, fb)
    for t in range(1, 40):
        bt.add([(0, xa, xb), (1, -xa, xb)], 2.0 ** (E - t), ("a", t))
        s = pow2_factors(E - t, fa, fb)
        if s:
            bt.add([(0, -xa, xb), (1, s[0], s[1])], 2.0**E, ("b", t))
    for u in range(1, 40):
        bt.add([(0, xa, xb)], 2.0 ** (E + u), ("c", u))

    def interpret(r: ProbeResult):
        res = {}
        for lab, d in zip(r.labels, r.D):
            res[lab] = d
        thr_a = max([t for (k, t) in res if k == "a" and res[(k, t)] == 2.0 ** (E - t)] or [0])
        thr_b = max([t for (k, t) in res if k == "b" and res[(k, t)] == 2.0 ** (E - t)] or [0])
        # c: largest u with 2^(E+u) + 2^E represented exactly-ish (product not lost)
        thr_c = max([u for (k, u) in res if k == "c" and res[(k, u)] > 2.0 ** (E + u)] or [0])
        r.table = [
            ("C = 2^(E-t), products +2^E -2^E: largest t where C survives", str(thr_a)),
            ("C = 2^E, products -2^E +2^(E-t): largest t kept", str(thr_b)),
            ("C = 2^(E+u), product 2^E: largest u where the product changes D", str(thr_c)),
        ]
        r.findings = {"c_survives_t": thr_a, "c_cancel_kept_t": thr_b, "c_large_u": thr_c}

    return bt, interpret


def probe_c_alone(fa, fb):
    """With all products zero, how many significand bits of C reach D?

    Inputs: C = 1 + 2^-j (j = 1..23) and random float32 C with full 24-bit
    significands, products 0 (a = b = 0) and also products 0*x.  Outcome: D = C
    exactly -> C passes through; D = C truncated to p fraction bits -> the
    output (or C's alignment) keeps p bits; RNE-like differences -> rounding.
    """
    bt = Batch(fa, fb)
    for j in range(1, 24):
        bt.add([], 1.0 + 2.0**-j, ("j", j))
        bt.add([], -(1.0 + 2.0**-j), ("-j", j))
    rng = np.random.default_rng(3)
    cs = (rng.uniform(1, 2, 64) * 2.0 ** rng.integers(-20, 20, 64)).astype(np.float32)
    for i, cv in enumerate(cs):
        bt.add([], float(cv), ("rand", i))

    def interpret(r: ProbeResult):
        kept = None
        for lab, d in zip(r.labels, r.D):
            if lab[0] == "j" and d == np.float32(1.0 + 2.0 ** -lab[1]):
                kept = lab[1]
        rand_exact = sum(1 for lab, d, c in zip(r.labels, r.D, r.C) if lab[0] == "rand" and d == c)
        r.table = [
            ("C = 1+2^-j, zero products: largest j with D == C", str(kept)),
            ("random full-precision C, zero products: D == C", f"{rand_exact}/64"),
        ]
        for lab, d, c in zip(r.labels, r.D, r.C):
            if lab[0] in ("j", "-j") and lab[1] in (12, 13, 14, 22, 23):
                r.table.append((f"C = {fmtv(c)} ({f32hex(c)})", f"{fmtv(d)} ({f32hex(d)})"))
        r.findings = {"c_alone_bits": kept, "c_random_exact": rand_exact}

    return bt, interpret


def probe_output_rounding(fa, fb):
    """How is the normalized sum rounded to the output?

    Inputs: sums whose exact value needs more significand bits than the output
    keeps but whose addends are all within the alignment window (no alignment
    loss): 1.75*2^E + 1.75*2^E + 2^(E-j) (carry into a new binade), and random
    sums of products within 12 binades of each other.  The fit compares RZ,
    RNE, RD, RU at 13..23 output fraction bits; the probe reports the
    consistent candidates.
    """
    bt = Batch(fa, fb)
    E = max_pow2_product(fa, fb) - 4
    xa, xb = pow2_factors(E, fa, fb)
    for j in range(1, 16):
        s = pow2_factors(E - j, fa, fb)
        if s:
            for sg in (1.0, -1.0):
                bt.add([(0, sg * 1.75 * xa, xb), (1, sg * 1.75 * xa, xb), (2, sg * s[0], s[1])], 0.0, ("carry", j, sg))
    rng = np.random.default_rng(5)
    lo, hi = E - 11, E
    for i in range(256):
        terms = []
        n = rng.integers(2, 9)
        for p in range(n):
            t = int(rng.integers(lo, hi + 1))
            fac = pow2_factors(t, fa, fb)
            m = float(rng.choice([1.0, 1.25, 1.5, 1.75] if fp8sim.format(fa).mbits >= 2 else [1.0, 1.5]))
            terms.append((p, fac[0] * m * (1 if rng.random() < 0.8 else -1), fac[1]))
        bt.add(terms, 0.0, ("rand", i))

    def interpret(r: ProbeResult):
        rows = []
        for lab, d in zip(r.labels, r.D):
            if lab[0] == "carry" and lab[1] in (10, 11, 12, 13, 14):
                rows.append((f"{'-' if lab[2] < 0 else ''}(1.75*2^{E}*2 + 2^{E - lab[1]})", fmtv(d)))
        r.table = rows
        r.findings = {}

    return bt, interpret


def probe_grouping(fa, fb):
    """Which products are summed together, and in what order?

    Inputs: +2^E at position i, -2^E at position j and a small s = 2^(E-t) at
    position l (t large: s is lost when aligned against 2^E), C = 0.
    Outcome per (i, j, l): D = s -> i and j cancelled in a block that
    finished before l's block; D = 0 -> s was aligned against 2^E (same block,
    or its block came first and the accumulator was then aligned to 2^E).
    Scanning all pairs i < j for l = 31 and l = 0 gives the blocks.
    """
    bt = Batch(fa, fb)
    E = max_pow2_product(fa, fb)
    t = min(E - min_pow2_product(fa, fb), 40)
    xa, xb = pow2_factors(E, fa, fb)
    sa, sb = pow2_factors(E - t, fa, fb)
    for l in (31, 0, 15, 16):
        for i in range(32):
            for j in range(i + 1, 32):
                if l in (i, j):
                    continue
                bt.add([(i, xa, xb), (j, -xa, xb), (l, sa, sb)], 0.0, (l, i, j))

    def interpret(r: ProbeResult):
        groups = {}
        for l in (31, 0, 15, 16):
            pairs = [(i, j) for (ll, i, j), d in zip(r.labels, r.D) if ll == l and d != 0]
            groups[l] = pairs
        # blocks: positions whose pairs cancel before l=31
        before31 = sorted({p for ij in groups[31] for p in ij})
        r.table = [
            (
                f"l={l}: pairs (i,j) cancelling before l",
                f"{len(groups[l])} pairs; positions {_ranges(sorted({p for ij in groups[l] for p in ij}))}",
            )
            for l in (31, 0, 15, 16)
        ]
        block = None
        k_order = None
        before0 = sorted({p for ij in groups[0] for p in ij})
        first = before31 or before0
        if not groups[31] and not groups[0]:
            block = 32
        elif first:
            # positions that cancel before l are exactly the earlier block(s)
            n_before = len(first)
            block = n_before if n_before == 16 else (32 - n_before if (32 - n_before) in (1, 2, 4, 8) else None)
            if n_before == 16 and first != list(range(16)):
                rest = [p for p in range(32) if p not in first]
                k_order = first + rest
        r.findings = {
            "block": block,
            "k_order": k_order,
            "t": t,
            "pairs_before_31": len(groups[31]),
            "pairs_before_0": len(groups[0]),
        }

    return bt, interpret


def _ranges(ps):
    if not ps:
        return "none"
    out = []
    s = p0 = ps[0]
    for p in ps[1:] + [None]:
        if p is None or p != p0 + 1:
            out.append(f"{s}" if s == p0 else f"{s}-{p0}")
            if p is not None:
                s = p
        if p is not None:
            p0 = p
    return ",".join(out)


def probe_subnormal_inputs(fa, fb):
    """Are subnormal FP8 inputs exact, and which exponent do they align with?

    (a) single product sub_a * 1 and 1 * sub_b with C = 0: D exact -> no flush.
    (b) products +x*y, -x*y with x the smallest subnormal of fa (y large) and
        C = 2^(e-t), e the true exponent of x*y: the largest t kept tells whether the
        subnormal product aligns with the clamped exponent emin+ey
        ("clamp": threshold F - mbits_a) or its true exponent ("normalize": F).
    """
    bt = Batch(fa, fb)
    fA = fp8sim.format(fa)
    fB = fp8sim.format(fb)
    for m in range(1, 2**fA.mbits):
        bt.add([(0, m * fA.min_subnormal, 1.0)], 0.0, ("a_sub", m))
    for m in range(1, 2**fB.mbits):
        bt.add([(0, 1.0, m * fB.min_subnormal)], 0.0, ("b_sub", m))
    bt.add([(0, fA.min_subnormal, fB.min_subnormal)], 0.0, ("both_sub", 1))
    x = fA.min_subnormal
    y = 2.0**fB.emax
    e_true = int(np.log2(x * y))
    for t in range(1, 40):
        # the small addend is C (fused with the products on NVIDIA wgmma)
        bt.add([(0, x, y), (1, -x, y)], 2.0 ** (e_true - t), ("align", t))
        # ... or a normal product at position 4 (same fused block as 0, 1 on sm_90)
        s = pow2_factors(e_true - t, fa, fb)
        if s is not None:
            bt.add([(0, x, y), (1, -x, y), (4, s[0], s[1])], 0.0, ("palign", t))

    def interpret(r: ProbeResult):
        va = _dec(r.A, fa)
        vb = _dec(r.B, fb)
        exact = (va * vb).sum(1) + r.C
        single = [(lab, d, e) for lab, d, e in zip(r.labels, r.D, exact) if lab[0] not in ("align", "palign")]
        n_exact = sum(1 for _, d, e in single if d == e)

        def threshold(kind):
            res = {lab[1]: d for lab, d in zip(r.labels, r.D) if lab[0] == kind}
            thr = None
            for t in sorted(res):
                if res[t] == 2.0 ** (e_true - t):
                    thr = t
                else:
                    break
            if thr is not None and thr == max(res):
                return None  # never lost within the probe's range: inconclusive
            return thr

        thr = threshold("align")
        pthr = threshold("palign")
        r.table = [
            ("single subnormal products exact", f"{n_exact}/{len(single)}"),
            (
                f"+-{fmtv(x)}*{fmtv(y)} (true exp {e_true}, clamped {fA.emin + fB.emax}) + 2^({e_true}-t): largest t kept",
                str(thr),
            ),
            ("same with a normal product 2^(e-t) at position 4 instead of C", str(pthr)),
        ]
        r.findings = {
            "subnormal_exact": n_exact == len(single),
            "sub_align_t": thr,
            "sub_align_t_products": pthr,
            "sub_clamp_shift": e_true - (fA.emin + fB.emax),
        }

    return bt, interpret


def probe_subnormal_output(fa, fb):
    """Subnormal and tiny fp32 C, and results in the fp32 subnormal range.

    Inputs: C = fp32 subnormals (2^-149, 2^-140*(1+2^-5...), full-bit patterns),
    C = smallest normals with all significand bits set, and zero products.
    Outcome: D == C -> subnormals pass; D == 0 -> flushed; truncated
    patterns -> subnormal outputs are quantized relative to 2^-126 with the
    output's fraction bits.
    """
    bt = Batch(fa, fb)
    rng = np.random.default_rng(11)
    bits = np.concatenate(
        [
            np.array([1, 2, 3, 0x7FFFFF, 0x400000, 0x400001, 0x12345, 0x3FF, 0x800000, 0xFFFFFF, 0x800001], np.uint32),
            rng.integers(1, 0x1000000, 53).astype(np.uint32),
        ]
    )
    cs = bits.view(np.float32)
    for i, cv in enumerate(cs):
        bt.add([], float(cv), ("c", i))
        bt.add([], -float(cv), ("-c", i))

    def interpret(r: ProbeResult):
        n = len(r.D)
        same = int(np.sum(r.D.view(np.uint32) == r.C.view(np.uint32)))
        zero = int(np.sum(r.D == 0))
        rows = []
        for _lab, c, d in list(zip(r.labels, r.C, r.D))[:16]:
            rows.append((f"C = {f32hex(c)}", f32hex(d)))
        r.table = [("tiny C with zero products: D == C", f"{same}/{n}"), ("D == 0", f"{zero}/{n}")] + rows
        r.findings = {"tiny_c_exact": same, "tiny_c_zero": zero, "n": n}

    return bt, interpret


def probe_specials(fa, fb):
    """Inf, NaN, signed zeros and overflow.

    Inputs: NaN codes, inf codes (e5m2), inf*0, inf + -inf, C = +-inf/NaN,
    C = -0 with zero products, +x - x with C = -0, C = FLT_MAX plus positive
    products, largest products.  Outcome: the table of D bit patterns (NaN
    encoding, sign of zero, overflow to inf or saturation).
    """
    bt = Batch(fa, fb)
    fA, fB = fp8sim.format(fa), fp8sim.format(fb)
    nanA = np.zeros(32, np.uint8)
    nanA[0] = fA.nan_code
    one_b = enc(np.r_[1.0, np.zeros(31)], fb)
    zeros = np.zeros(32, np.uint8)
    bt.add_codes(nanA, one_b, 0.0, "NaN(a) * 1")
    bt.add_codes(nanA, zeros, 0.0, "NaN(a) * 0")
    if fA.inf:
        infA = np.zeros(32, np.uint8)
        infA[0] = fA.inf_code
        bt.add_codes(infA, one_b, 0.0, "inf(a) * 1")
        bt.add_codes(infA, zeros, 0.0, "inf(a) * 0")
        m = infA.copy()
        m[1] = fA.inf_code | 0x80
        ob = one_b.copy()
        ob[1] = ob[0]
        bt.add_codes(m, ob, 0.0, "inf - inf")
        bt.add_codes(infA, one_b, float("-inf"), "inf + C=-inf")
        bt.add_codes(infA, one_b, float("nan"), "inf + C=NaN")
    bt.add([(0, 1.0, 1.0)], float("inf"), "1 + C=inf")
    bt.add([(0, 1.0, 1.0)], float("-inf"), "1 + C=-inf")
    bt.add([(0, 1.0, 1.0)], float("nan"), "1 + C=NaN")
    bt.add([], -0.0, "zero products, C=-0")
    bt.add([], 0.0, "zero products, C=+0")
    bt.add([(0, -0.0, 1.0)], -0.0, "(-0)*1, C=-0")
    bt.add([(0, 1.0, 1.0), (1, -1.0, 1.0)], -0.0, "1 - 1, C=-0")
    bt.add([(0, 1.0, 1.0), (1, -1.0, 1.0)], 0.0, "1 - 1, C=+0")
    bt.add([(0, 1.0, 1.0)], -1.0, "1 + C=-1")
    fmax = float(np.finfo(np.float32).max)
    bt.add([(k, fA.max, fB.max) for k in range(32)], fmax, "32*max*max + C=FLT_MAX")
    bt.add([(k, -fA.max, fB.max) for k in range(32)], -fmax, "-32*max*max + C=-FLT_MAX")
    bt.add([(k, fA.max, fB.max) for k in range(32)], 0.0, "32*max*max")
    bt.add([(0, fA.max, fB.max)], float(np.float32(2.0**128 - 2.0**114)), "max*max + C=2^128-2^114")

    def interpret(r: ProbeResult):
        r.table = [(lab, f"{fmtv(d)} ({f32hex(d)})") for lab, d in zip(r.labels, r.D)]
        r.findings = {"nan_bits": [f32hex(d) for d in r.D if d != d][:1]}

    return bt, interpret


PROBES = [
    probe_sanity,
    probe_alignment,
    probe_product_exponent,
    probe_c_entry,
    probe_c_alone,
    probe_output_rounding,
    probe_grouping,
    probe_subnormal_inputs,
    probe_subnormal_output,
    probe_specials,
]


def _make(name, fa, fb):
    return {p.__name__: p for p in PROBES}[name](fa, fb)


# ------------------------------------------------------------------ fitting
def assemble(findings: dict, base: tc.AccumulatorModel) -> tc.AccumulatorModel:
    """Build a model from probe findings (missing findings keep base's values)."""
    kw = {}
    al = findings.get("probe_alignment", {})
    if al.get("frac_bits"):
        kw["frac_bits"] = min(int(al["frac_bits"]), 40)
    if al.get("align_rounding") in ("rz", "rd"):
        kw["align_rounding"] = al["align_rounding"]
    pe = findings.get("probe_product_exponent", {})
    F = kw.get("frac_bits", base.frac_bits)
    if pe.get("kept_t_with_2.25") is not None:
        kw["product_exponent"] = "nominal" if pe["kept_t_with_2.25"] >= F else "normalized"
    gr = findings.get("probe_grouping", {})
    if gr.get("block"):
        kw["block"] = gr["block"]
    if gr.get("k_order"):
        kw["k_order"] = tuple(gr["k_order"])
    ca = findings.get("probe_c_alone", {})
    ce = findings.get("probe_c_entry", {})
    if ce.get("c_survives_t") is not None:
        kw["c_mode"] = "fused" if ce["c_survives_t"] < 30 else "separate"
    if ca.get("c_alone_bits") is not None:
        kw["out_frac_bits"] = min(int(ca["c_alone_bits"]), 23)
    sb = findings.get("probe_subnormal_inputs", {})
    st = sb.get("sub_align_t_products")
    if st is None:
        st = sb.get("sub_align_t")
    if st is not None:
        kw["subnormal_exponent"] = "normalize" if st >= F else "clamp"
    return replace(base, name=base.name + " (fitted)", **kw)


SEARCH_SPACE = {
    "block": [32, 16, 8],
    "frac_bits": list(range(10, 41)),
    "align_rounding": ["rz", "rd"],
    "product_exponent": ["nominal", "normalized"],
    "subnormal_exponent": ["clamp", "normalize", "fp16"],
    "c_mode": ["fused", "separate"],
    "out_frac_bits": [10, 13, 14, 23],
    "out_rounding": ["rz", "rne"],
}


def score(model, results) -> tuple[int, int]:
    n = bad = 0
    for r in results:
        d = emulator_runner(model)(r.A, r.B, r.C, r.a_format, r.b_format)
        ok = tc.bits_equal(d, r.D)
        n += ok.size
        bad += int((~ok).sum())
    return n - bad, n


def refine(model, results, max_rounds: int = 3):
    """Coordinate search over SEARCH_SPACE starting from ``model``."""
    best = model
    best_s = score(best, results)[0]
    for _ in range(max_rounds):
        improved = False
        for key, values in SEARCH_SPACE.items():
            for v in values:
                try:
                    m = replace(best, **{key: v})
                except ValueError:
                    continue
                s = score(m, results)[0]
                if s > best_s:
                    best, best_s, improved = m, s, True
        if not improved:
            break
    return best


# ------------------------------------------------------------------ driver
def run_probes(runner, instruction, pairs=PAIRS, names=None, log=print):
    results = []
    for fa, fb in pairs:
        for p in PROBES:
            if names and p.__name__ not in names:
                continue
            bt, interpret = p(fa, fb)
            A, B, C = bt.arrays()
            with np.errstate(all="ignore"):
                D = np.asarray(runner(A, B, C, fa, fb), np.float32)
            r = ProbeResult(p.__name__, instruction, fa, fb, A, B, C, D, bt.labels)
            interpret(r)
            results.append(r)
    return results


def analyse(results, instruction, arch="sm90", log=print, do_refine=True):
    """Print tables, fit a model per format pair, check it; returns a summary dict."""
    summary = {}
    by_pair = {}
    for r in results:
        by_pair.setdefault((r.a_format, r.b_format), []).append(r)
    try:
        base = tc.get_model(instruction, arch)
    except ValueError:
        base = tc.AccumulatorModel(name=instruction)
    for (fa, fb), rs in by_pair.items():
        log(f"\n=== {instruction}  A={fa}  B={fb} ===")
        findings = {}
        for r in rs:
            log(f"-- {r.name}: {json.dumps(r.findings, default=str)}")
            for row in r.table:
                log(f"     {row[0]:<70} {row[1]}")
            findings[r.name] = r.findings
        start = tc.AccumulatorModel(name=f"{instruction} {fa}x{fb}", out_rounding="rz")
        if instruction == "wgmma.f16":
            start = replace(start, output="f16", out_frac_bits=10, out_rounding="rne")
        fitted = assemble(findings, start)
        good, n = score(fitted, rs)
        if good < n and do_refine:
            fitted = refine(fitted, rs)
            good, n = score(fitted, rs)
        preset_good = score(base, rs)
        log(f"fitted model: {json.dumps({k: v for k, v in fitted.summary().items() if k not in ('description',)})}")
        log(
            f"fitted model reproduces {good}/{n} probe outputs; preset {base.name!r}: {preset_good[0]}/{preset_good[1]}"
        )
        summary[f"{fa}x{fb}"] = {
            "fitted": fitted.summary(),
            "fitted_match": [good, n],
            "preset_match": list(preset_good),
            "findings": findings,
        }
    return summary


def save_results(path, results):
    out = {}
    meta = []
    for i, r in enumerate(results):
        out[f"A{i}"] = r.A
        out[f"B{i}"] = r.B
        out[f"C{i}"] = r.C
        out[f"D{i}"] = r.D
        meta.append(
            {
                "name": r.name,
                "instruction": r.instruction,
                "a_format": r.a_format,
                "b_format": r.b_format,
                "labels": [repr(x) for x in r.labels],
            }
        )
    out["meta"] = np.array(json.dumps(meta))
    np.savez_compressed(path, **out)


def load_results(path):
    import ast

    z = np.load(path, allow_pickle=False)
    meta = json.loads(str(z["meta"]))
    results = []
    for i, m in enumerate(meta):
        labels = [ast.literal_eval(x) for x in m["labels"]]
        r = ProbeResult(
            m["name"],
            m["instruction"],
            m["a_format"],
            m["b_format"],
            z[f"A{i}"],
            z[f"B{i}"],
            z[f"C{i}"],
            z[f"D{i}"],
            labels,
        )
        bt, interpret = _make(r.name, r.a_format, r.b_format)
        interpret(r)
        results.append(r)
    return results


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m gpu.characterize", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--instruction",
        action="append",
        choices=["wgmma", "mma.sync", "wgmma.f16"],
        help="instruction(s) to probe (default: wgmma and mma.sync)",
    )
    ap.add_argument("--pair", action="append", help="format pair like e4m3xe5m2 (default: all four)")
    ap.add_argument("--probe", action="append", help="run only these probes (function names)")
    ap.add_argument("--save", help="write raw probe inputs/outputs to this .npz")
    ap.add_argument("--json", help="write the fitted parameters to this .json")
    ap.add_argument("--replay", help="analyse a saved .npz instead of running probes")
    ap.add_argument("--emulate", help="run the probes against an fp8sim model (self-test)")
    ap.add_argument("--no-refine", action="store_true")
    args = ap.parse_args(argv)
    instrs = args.instruction or ["wgmma", "mma.sync"]
    pairs = [tuple(p.split("x")) for p in args.pair] if args.pair else PAIRS
    summary = {}
    if args.replay:
        results = load_results(args.replay)
        for ins in sorted({r.instruction for r in results}):
            summary[ins] = analyse([r for r in results if r.instruction == ins], ins, do_refine=not args.no_refine)
    else:
        allres = []
        for ins in instrs:
            if args.emulate:
                runner = emulator_runner(tc.get_model(args.emulate))
            else:
                runner = hardware_runner(ins)
            res = run_probes(runner, ins, pairs, args.probe)
            allres += res
            summary[ins] = analyse(res, ins, do_refine=not args.no_refine)
        if args.save:
            save_results(args.save, allres)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1, default=str)
    return summary


if __name__ == "__main__":
    main()
