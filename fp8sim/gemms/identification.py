"""Which library configuration produced this GEMM output? (:func:`fp8sim.identify`)

The module is ``fp8sim.gemms.identification``; ``fp8sim.identify`` is its function.

:func:`identify` takes the FP8 codes and scales a kernel was given and the output ``y`` it returned,
searches the arithmetic parameters of :func:`fp8sim.scaled_gemm`'s :class:`~fp8sim.Recipe`, and
returns the recipe that reproduces ``y`` bit for bit (or the closest one, with :meth:`explain`
naming the first output that differs and the step of the model that would change it).

The search space (every combination that makes a valid recipe):

* ``accumulator``: every name of :func:`fp8sim.gemms.recipes.accumulator_names` (sm90): "wgmma" first,
  the others only when no wgmma candidate reproduces every output;
* ``promote_every``: None, 32, 64, 128, 256, 512 (dividing 128 with 1x128 / 128x128 scales);
* the scales: with tensorwise / rowwise scales ``scale_at="epilogue"`` in each ``epilogue_scale``
  order ("alpha", "b-then-a", "a-then-b") and ``scale_at="promotion"`` with ``scale_application``
  "fma" and "mul-add"; with K-blocked scales only the latter two;
* split-K: ``split_k`` 1..16 with ``split_granule`` 128, 256, 512 and 1024 (a multiple of
  ``promote_every``; cuBLASLt's blockwise kernel uses 512)
  and the three ``split_order`` s; layouts with the same K slices are tried once (the smallest
  ``split_k``, granule 128 first), and orders that add the same way once (two slices: "sequential";
  three: "sequential" and "reverse");
* ``output_format``: "bf16" when every finite ``y`` is a bf16 value, "fp32" unless ``y`` is bf16-typed.

How (speed: about 2 s for 256x256x4096 on two cores when a wgmma recipe matches;
``benchmarks/bench_identify.py``):

1. stage 1 on a sample of the outputs: up to 8 rows x 128 columns for "wgmma", spread over the rows
   and columns that hold finite nonzero outputs (a zero row of ``a`` gives the same output under
   every candidate and tells none apart) (its fused kernel:
   ~0.013 s for 8x256x4096 through ``scaled_matmul``; the sample's kernels run on one thread).  The tensor-core
   chain of every (accumulator, promote_every, scale mode, K slice) is run once through
   :func:`fp8sim.gemms.engine.run_codes` and cached; the slice sums (:func:`~fp8sim.gemms.engine.combine_slices`),
   epilogue orders (:func:`~fp8sim.gemms.engine.apply_epilogue`) and output casts
   (:func:`~fp8sim.gemms.engine.cast_output`) of every candidate are cheap numpy on top;
2. only when no wgmma candidate reproduces every output (stage 3 first): the other accumulators
   ("wgmma.f16", "mma.sync", "exact", "fp32": 0.1 to 0.7 s for 8x256x4096, 10 to 50 times slower;
   "fp64": numpy per promotion interval) on a tiny sample (1 row x 32 columns), with ``split_k=1``
   and the split layout of the best wgmma candidate only, then stage 3 again;
3. stage 2: the best candidates of stage 1 (by sample match rate, ties broken towards the usual
   library choices: see :data:`PREFERENCE`) run on all outputs, up to :data:`STAGE2` of them, until
   one matches every output.  When none does while other candidates matched every sampled output
   (a sample that cannot tell them apart), stage 2 widens: those candidates are tried on a second
   sample, the outputs where the candidates run so far fail; the ones that fail there are ruled
   out, the best of the others run on all outputs, and so on until one matches every output or
   none is left;
4. after a match, up to :data:`TIES` more candidates that matched every sampled output (first the
   best one of each other accumulator) run on all outputs: those that match every output too are
   ``IdentifyResult.ties``, named by :meth:`~IdentifyResult.explain` (the outputs cannot tell them
   apart: an exact product rounded to bf16 is reproduced by "mma.sync", "exact", "fp32" and "fp64"
   alike).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import cache

import ml_dtypes
import numpy as np

from .._fpenv import ieee_defaults
from ..rounding.api import serial_if_small
from ..tensorcore import get_model
from ..tensorcore.kernels import scaled_request, select
from .engine import apply_epilogue, cast_output, combine_slices, k_slices, run_codes
from .operands import padded_inputs, prepare
from .recipes import BF16_ACCUMULATORS, Recipe, accumulator_names

__all__ = ["identify", "IdentifyResult", "PREFERENCE", "STEPS", "STAGE2", "recipe_fields", "bit_match"]

WHO = "fp8sim.identify"
SAMPLE = (8, 128)  #: rows x columns of stage 1 for the fast accumulators
TINY = (1, 32)  #: rows x columns of stage 1 for the slow accumulators
STAGE2 = 6  #: most candidates run on all outputs at a time (stage 2 widens while none matches every output)
TIES = 3  #: most candidates run on all outputs after a match, to find the recipes that tie with it
SPLIT_KS, GRANULES = tuple(range(1, 17)), (128, 256, 512, 1024)
#: how ties on the match rate are broken (first = preferred): the accumulator in the order of
#: accumulator_names(), then promote_every None or 128 before split-K before the other promotions
#: (K=512 with promotion every 128 is split-K into 4 slices of 128 in the sequential order), smaller
#: split_k, then these orders per field
PREFERENCE: dict[str, tuple] = {
    "promote_every": (None, 128, 64, 32, 256, 512),
    "scale_mode": ("epilogue", "fma", "mul-add"),
    "split_order": ("sequential", "reverse", "pairwise"),
    "output_format": ("bf16", "fp32"),
    "epilogue_scale/tensor": ("alpha", "b-then-a", "a-then-b"),
    "epilogue_scale/row": ("b-then-a", "a-then-b", "alpha"),
}
#: field -> the step of the model it belongs to (:meth:`IdentifyResult.explain`)
STEPS = {
    "accumulator": "accumulator width/truncation",
    "promote_every": "promotion",
    "split_k": "split-K",
    "split_granule": "split-K",
    "split_order": "split-K",
    "scale_at": "scale order",
    "scale_application": "scale order",
    "epilogue_scale": "scale order",
    "output_format": "output rounding",
}
FIELDS = tuple(STEPS)
_GRAN = {"tensor": "tensor", "row": "row", "col": "row", "1x128": "1x128", "128x128": "128x128"}


def bit_match(y: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Elementwise bit equality of float32 arrays, any NaN equal to any NaN."""
    return (y.view(np.uint32) == ref.view(np.uint32)) | (np.isnan(y) & np.isnan(ref))


def recipe_fields(r: Recipe) -> dict:
    """The searched fields of ``r`` (the accumulator as its name)."""
    d = {f: getattr(r, f) for f in FIELDS}
    d["accumulator"] = d["accumulator"] if isinstance(d["accumulator"], str) else d["accumulator"].name
    return d


def _y_input(y, M: int, N: int) -> tuple[np.ndarray, bool]:
    """``y`` as float32 and whether it is bf16-typed."""
    if type(y).__module__.startswith("torch"):
        name = str(y.dtype).replace("torch.", "")
        if name not in ("float32", "bfloat16"):
            raise TypeError(f"{WHO}: y must be a float32 or bfloat16 tensor, got torch.{name}")
        a = np.ascontiguousarray(y.detach().cpu().float().numpy())
        bf16 = name == "bfloat16"
    else:
        a, bf16 = _y_array(y)
    if a.shape != (M, N):
        raise ValueError(f"{WHO}: y has shape {a.shape}, expected ({M}, {N}) = (rows of a, columns of b)")
    return np.ascontiguousarray(a.astype(np.float32)), bf16


def _y_array(y) -> tuple[np.ndarray, bool]:
    a = np.asarray(y)
    if a.dtype == np.dtype(ml_dtypes.bfloat16):
        bf16 = True
    elif a.dtype == np.float32:
        bf16 = False
    else:
        raise TypeError(
            f"{WHO}: y must be a float32 array or an ml_dtypes.bfloat16 array (the kernel's output), got dtype "
            f"{a.dtype} (bf16 bit patterns: (y.astype(np.uint32) << 16).view(np.float32))"
        )
    return a, bf16


class _Problem:
    """The checked inputs and what the search shares."""

    def __init__(self, a_codes, b_codes, y, a_scale, b_scale, a_format, b_format, layout):
        self.A, self.B, self.sa, self.sb, self.kscale, self.fa, self.fb, kinds = prepare(
            a_codes, b_codes, a_scale, b_scale, a_format, b_format, layout, WHO
        )
        self.kinds = kinds
        (self.M, self.K), self.N = self.A.shape, self.B.shape[1]
        self.y, self.y_bf16 = _y_input(y, self.M, self.N)
        fin = self.y[np.isfinite(self.y)]
        self.outputs = [o for o in ("bf16", "fp32") if not (o == "fp32" and self.y_bf16)]
        if np.any(fin.view(np.uint32) & 0xFFFF):
            self.outputs.remove("bf16")
        row = "tensor" if kinds == ("tensor", "tensor") else "row"
        self.epi_pref = PREFERENCE["epilogue_scale/" + row]
        self.blocked = self.kscale is not None

    def recipe(self, acc, P, mode, epi, S, g, order, out) -> Recipe:
        """The candidate as a Recipe (ValueError when the combination is not one)."""
        return Recipe(
            "identified",
            self.fa,
            self.fb,
            _GRAN[self.kinds[0]],
            _GRAN[self.kinds[1]],
            scale_format="fp32",
            accumulator=acc,
            promote_every=P,
            scale_at="epilogue" if mode == "epilogue" else "promotion",
            scale_application="fma" if mode == "epilogue" else mode,
            epilogue_scale=epi or "alpha",
            split_k=S,
            split_granule=g if S > 1 else max(128, P or 128),
            split_order=order,
            output_format=out,
        )

    def evaluate(self, r: Recipe, rows=None, cols=None) -> np.ndarray:
        """``scaled_gemm``'s output under ``r`` on the outputs ``y[rows][:, cols]`` (all by default)."""
        A, B, sa, sb = self.A, self.B, self.sa, self.sb
        if rows is not None:
            A, sa = A[rows], sa[rows]
        if cols is not None:
            B, sb = B[:, cols], sb[:, cols]
        Ap, Bp, sa, sb, ks = padded_inputs(A, B, sa, sb, self.kscale, r)
        return cast_output(run_codes(Ap, Bp, sa, sb, ks, self.fa, self.fb, r, K=self.K), r.output_format)


@cache
def _chain_recipe(acc, P, mode) -> Recipe:
    """The split_k=1 recipe of one tensor-core chain (its formats, granularities and epilogue do not
    enter run_codes with unit scales)."""
    return Recipe(
        "chain",
        accumulator=acc,
        x_granularity="tensor",
        w_granularity="tensor",
        promote_every=P,
        scale_at="epilogue" if mode == "epilogue" else "promotion",
        scale_application="fma" if mode == "epilogue" else mode,
        split_granule=max(128, P or 128),
        output_format="fp32",
    )


def _spread(n: int, k: int) -> np.ndarray:
    return np.unique(np.linspace(0, n - 1, min(n, k)).round().astype(np.intp))


def _informative(weight: np.ndarray, k: int) -> np.ndarray:
    """Up to ``k`` indices spread evenly over those of positive ``weight`` (the ones whose outputs can
    tell candidates apart), filled up with the others spread evenly when there are fewer."""
    good = np.flatnonzero(weight > 0)
    if len(good) >= min(len(weight), k):
        return good[_spread(len(good), k)]
    rest = np.flatnonzero(weight <= 0)
    return np.sort(np.concatenate([good, rest[_spread(len(rest), k - len(good))]]))


def _sample_indices(p: _Problem, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """The rows and columns of stage 1's sample: spread over the rows (then the columns of those rows)
    that hold finite nonzero outputs.  An all-zero or all-NaN output row (a zero row of ``a``, say)
    is the same under every candidate and cannot tell them apart; such rows are taken only when
    there are not enough others."""
    live = np.isfinite(p.y) & (p.y != 0)
    rows = _informative(live.sum(axis=1), shape[0])
    return rows, _informative(live[rows].sum(axis=0), shape[1])


def _mismatch_indices(miss: np.ndarray, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """The rows with the most mismatching outputs (``miss``: counts per output), then the columns with
    the most of them in those rows: the outputs where the candidates run so far fail."""
    r = miss.sum(axis=1)
    rows = np.sort(np.argsort(-r, kind="stable")[: min(shape[0], int((r > 0).sum()))])
    c = miss[rows].sum(axis=0)
    return rows, np.sort(np.argsort(-c, kind="stable")[: min(shape[1], int((c > 0).sum()))])


class _Sample:
    """The outputs ``y[rows][:, cols]`` of stage 1 and the cached tensor-core chains on them."""

    def __init__(
        self, p: _Problem, shape: tuple[int, int], name: str, where: tuple[np.ndarray, np.ndarray] | None = None
    ):
        self.p, self.name = p, name
        rows, cols = _sample_indices(p, shape) if where is None else where
        self.rows: np.ndarray = rows
        self.cols: np.ndarray = cols
        self.A, self.B = p.A[self.rows], np.ascontiguousarray(p.B[:, self.cols])
        self.sa, self.sb = p.sa[self.rows], np.ascontiguousarray(p.sb[:, self.cols])
        self.y = p.y[np.ix_(self.rows, self.cols)]
        self.chains: dict = {}

    def chain(self, acc, P, mode, k0, k1) -> np.ndarray:
        """The fp32 result of slice ``[k0, k1)`` from a zero accumulator (unit scales for the
        epilogue mode; the slice's scales applied at each promotion otherwise)."""
        key = (acc, P, mode, k0, k1)
        if key not in self.chains:
            r = _chain_recipe(acc, P, mode)
            a, b, ks = self.A[:, k0:k1], self.B[k0:k1], self.p.kscale
            if mode == "epilogue":
                sa, sb = np.ones((a.shape[0], 1), np.float32), np.ones((1, b.shape[1]), np.float32)
            elif ks is None:
                sa, sb = self.sa, self.sb
            else:
                sa, sb = self.sa[:, k0 // ks : -(-k1 // ks)], self.sb[k0 // ks : -(-k1 // ks)]
            Ap, Bp, sa, sb, kk = padded_inputs(a, b, sa, sb, ks, r)
            self.chains[key] = run_codes(Ap, Bp, sa, sb, kk, self.p.fa, self.p.fb, r, K=k1 - k0)
        return self.chains[key]


def _layouts(K: int, P, only=None) -> list[tuple[int, int, list]]:
    """``(split_k, granule, slices)`` of the distinct split layouts valid with ``promote_every=P``."""
    seen, out = set(), []
    for S in SPLIT_KS:
        for g in GRANULES if S > 1 else (128,):
            if S > 1 and P is not None and g % P:
                continue
            if only is not None and (S, g) not in only:
                continue
            sl = tuple(k_slices(K, S, g))
            if sl not in seen:
                seen.add(sl)
                out.append((S, g if len(sl) > 1 else 128, list(sl)))
    return out


def fp8_accumulators() -> list[str]:
    """The accumulators identify searches: :func:`fp8sim.gemms.recipes.accumulator_names` without the BF16
    datapaths (identify takes FP8 codes)."""
    return [a for a in accumulator_names() if a not in BF16_ACCUMULATORS]


def _orders(n: int) -> tuple[str, ...]:
    return ("sequential",) if n <= 2 else ("sequential", "reverse") if n == 3 else PREFERENCE["split_order"]


def _stage1(p: _Problem, s: _Sample, accs, only=None) -> list[dict]:
    rows = []
    acc_names = fp8_accumulators()
    for acc in accs:
        for P in PREFERENCE["promote_every"]:
            if p.blocked and (P is None or 128 % P):
                continue
            for mode in PREFERENCE["scale_mode"]:
                if mode == "epilogue" and (p.blocked or (P is not None and P >= p.K)):
                    continue  # epilogue with P >= K: the same chain as P=None
                if mode != "epilogue" and P is None:
                    continue
                for S, g, slices in _layouts(p.K, P, only):
                    parts = [s.chain(acc, P, mode, k0, k1) for k0, k1 in slices]
                    for order in _orders(len(slices)):
                        tot = combine_slices(parts, order)
                        for epi in p.epi_pref if mode == "epilogue" else (None,):
                            z = tot if epi is None else apply_epilogue(tot, s.sa[:, :1], s.sb[:1, :], epi)
                            for out in p.outputs:
                                rate = float(bit_match(cast_output(z, out), s.y).mean())
                                key = (
                                    acc_names.index(acc),
                                    P not in (None, 128),  # the libraries' promotions before split-K
                                    S,
                                    PREFERENCE["promote_every"].index(P),
                                    GRANULES.index(g),
                                    PREFERENCE["scale_mode"].index(mode),
                                    p.epi_pref.index(epi) if epi else 0,
                                    PREFERENCE["split_order"].index(order),
                                    PREFERENCE["output_format"].index(out),
                                )
                                rows.append(
                                    dict(
                                        accumulator=acc,
                                        promote_every=P,
                                        scale_at="epilogue" if mode == "epilogue" else "promotion",
                                        scale_application=None if mode == "epilogue" else mode,
                                        epilogue_scale=epi,
                                        split_k=S,
                                        split_granule=g if S > 1 else None,
                                        split_order=order if len(slices) > 1 else None,
                                        output_format=out,
                                        sample=s.name,
                                        sample_outputs=s.y.size,
                                        sample_match_rate=rate,
                                        match_rate=None,
                                        _key=key,
                                        _args=(acc, P, mode, epi, S, g, order, out),
                                    )
                                )
    return rows


@dataclass
class IdentifyResult:
    """What :func:`identify` found.

    * ``recipe``: the best candidate, a :class:`~fp8sim.Recipe` for :func:`fp8sim.scaled_gemm`;
    * ``match_rate``: the fraction of all outputs bit-identical under it (NaN equals NaN);
    * ``table``: every candidate tried, best first: its fields (None where a field does not apply:
      ``epilogue_scale`` with scales at promotion, ``scale_application`` with scales in the
      epilogue, ``split_granule`` / ``split_order`` without split-K), ``sample`` ("rows": up to
      8 rows x 128 columns; "tiny": 1 x 32, the accumulators other than wgmma), ``sample_outputs``,
      ``sample_match_rate`` (on that sample) and ``match_rate`` (on all outputs; None for the
      candidates not run in stage 2);
    * ``mismatch``: the first diverging output of the best candidate (None at 100 %);
    * ``seconds``: the time the search took;
    * ``ties``: at 100 %, the other recipes found to reproduce every output as well (the outputs
      cannot tell them apart; :meth:`explain` names them), and ``untried_ties`` the candidates that
      matched every sampled output but were not run on all outputs (they may tie too).
    """

    recipe: Recipe
    match_rate: float
    table: list[dict]
    n_outputs: int
    mismatches: int
    mismatch: dict | None
    seconds: float
    ties: list[Recipe] = field(default_factory=list)
    untried_ties: int = 0
    _problem: _Problem = field(repr=False, default=None)  # type: ignore[assignment]
    _explained: dict | None = field(repr=False, default=None)

    def diagnosis(self) -> dict:
        """The first diverging output with both bit patterns and the single-parameter changes of
        the recipe that reproduce it there (``changes``: field, value, step); ``{}`` at 100 %."""
        if self.mismatch is None:
            return {}
        if self._explained is None:
            with serial_if_small(0, threshold=1):
                changes = _neighbours(self._problem, self.recipe, self.mismatch)
            self._explained = dict(self.mismatch, changes=changes)
        return self._explained

    def explain(self) -> str:
        """A few lines: at 100 % that every output matches, with the recipe's fields; else the first
        diverging output (row-major) with both bit patterns and the steps of the model whose
        change alone reproduces it (or that no single step does)."""
        fields = recipe_fields(self.recipe)
        f = ", ".join(f"{k}={v!r}" for k, v in fields.items())
        if self.mismatch is None:
            text = f"all {self.n_outputs} outputs are bit-identical under the recipe ({f})"
            if self.ties:
                other = [
                    ", ".join(f"{k}={v!r}" for k, v in recipe_fields(t).items() if v != fields[k]) for t in self.ties
                ]
                text += (
                    f"\ntie: {len(self.ties)} other recipe{'s' if len(self.ties) > 1 else ''} of the search space "
                    f"reproduce{'' if len(self.ties) > 1 else 's'} every output as well, so these outputs cannot "
                    "tell them apart (the recipe above is the preferred one): " + "; ".join(other)
                )
            if self.untried_ties:
                one = self.untried_ties == 1
                text += (
                    f"\n{self.untried_ties} more candidate{'' if one else 's'} matched every sampled output and "
                    f"{'was' if one else 'were'} not run on all outputs (they may tie as well)"
                )
            return text
        d = self.diagnosis()
        lines = [
            f"the best recipe ({f}) matches {self.n_outputs - self.mismatches} of {self.n_outputs} outputs "
            f"({100 * self.match_rate:.4f} %)",
            f"first diverging output (row-major): [{d['row']}, {d['col']}]: y {d['y_bits']} ({d['y']!r}), "
            f"recipe {d['model_bits']} ({d['model']!r}) ({d['bits']} bit patterns)",
        ]
        ch = d["changes"]
        if not ch:
            lines.append(
                "no single step of the model (accumulator, promotion, split-K, scale order, output rounding) "
                "reproduces it"
            )
        else:
            steps = list(dict.fromkeys(c["step"] for c in ch))
            lines.append("step that differs there: " + ", ".join(steps))
            lines.append(
                "single-parameter changes that reproduce it: "
                + "; ".join(f"{c['field']}={c['value']!r} ({c['step']})" for c in ch)
            )
        return "\n".join(lines)

    def to_dict(self, top: int = 5) -> dict:
        """The result as plain data (the CLI's ``--json``)."""
        return dict(
            recipe=recipe_fields(self.recipe),
            match_rate=self.match_rate,
            n_outputs=self.n_outputs,
            mismatches=self.mismatches,
            candidates=len(self.table),
            top=[dict(row) for row in self.table[:top]],
            first_mismatch=self.diagnosis() or None,
            ties=[recipe_fields(t) for t in self.ties],
            untried_ties=self.untried_ties,
            explain=self.explain(),
            seconds=self.seconds,
        )


def _bits(v: np.float32, bf16: bool) -> str:
    u = int(np.float32(v).view(np.uint32))
    return f"0x{u >> 16:04x}" if bf16 else f"0x{u:08x}"


def _neighbours(p: _Problem, r: Recipe, mm: dict) -> list[dict]:
    """The single-parameter changes of ``r`` that reproduce ``y`` at the output ``mm``."""
    i, j = mm["row"], mm["col"]
    want = p.y[i : i + 1, j : j + 1]
    alts: dict[str, list] = {
        "accumulator": [a for a in fp8_accumulators() if a != r.accumulator],
        "promote_every": [v for v in PREFERENCE["promote_every"] if v != r.promote_every],
        "split_k": [v for v in SPLIT_KS if v != r.split_k],
        "split_granule": [v for v in GRANULES if v != r.split_granule] if r.split_k > 1 else [],
        "split_order": [v for v in PREFERENCE["split_order"] if v != r.split_order] if r.split_k > 1 else [],
        "scale_at": [v for v in ("epilogue", "promotion") if v != r.scale_at],
        "scale_application": [v for v in ("fma", "mul-add") if v != r.scale_application]
        if r.scale_at == "promotion"
        else [],
        "epilogue_scale": [v for v in PREFERENCE["epilogue_scale/tensor"] if v != r.epilogue_scale]
        if r.scale_at == "epilogue"
        else [],
        "output_format": [v for v in p.outputs if v != r.output_format],
    }
    found = []
    for fld, values in alts.items():
        for v in values:
            extra: dict = {}
            if fld == "promote_every" and r.split_k == 1:
                extra["split_granule"] = max(128, v or 128)
            if fld == "split_k" and r.split_k == 1:
                extra["split_granule"] = 128 if r.promote_every is None or r.promote_every <= 128 else 256
            try:
                cand = r.with_(**{fld: v}, **extra)
                got = p.evaluate(cand, [i], [j])
            except ValueError:
                continue
            if bit_match(got.astype(np.float32), want).all():
                found.append(dict(field=fld, value=v, step=STEPS[fld]))
    return found


def _ranked(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: (-r["sample_match_rate"], r["_key"]))


def _stage2(p: _Problem, rows: list[dict]) -> list[tuple]:
    """``(rate, preference key, recipe, match)`` of the first :data:`STAGE2` candidates not yet run on all
    outputs, stopping at the first that reproduces every output."""
    results: list[tuple] = []
    for row in rows:
        if len(results) == STAGE2:
            break
        if row["match_rate"] is not None:
            continue
        r = p.recipe(*row["_args"])
        m = bit_match(p.evaluate(r).astype(np.float32), p.y)
        row["match_rate"] = float(m.mean())
        results.append((row["match_rate"], row["_key"], r, m))
        if m.all():
            break
    return results


@ieee_defaults
def _sample_rate(p: _Problem, s: _Sample, args: tuple) -> float:
    """The match rate of the candidate ``args`` (a table row's) on the sample ``s``, as stage 1
    computes it."""
    acc, P, mode, epi, S, g, order, out = args
    parts = [s.chain(acc, P, mode, k0, k1) for k0, k1 in k_slices(p.K, S, g)]
    tot = combine_slices(parts, order)
    z = tot if epi is None else apply_epilogue(tot, s.sa[:, :1], s.sb[:1, :], epi)
    return float(bit_match(cast_output(z, out), s.y).mean())


def _open(rows: list[dict]) -> list[dict]:
    """The candidates that may still reproduce every output: every sampled output matched, not yet run
    on all outputs and not ruled out by a second sample."""
    return [r for r in rows if r["match_rate"] is None and r["sample_match_rate"] == 1.0 and not r.get("_out")]


def _widen(p: _Problem, rows: list[dict], results: list[tuple]) -> list[tuple]:
    """Stage 2 beyond its first :data:`STAGE2` candidates, while none reproduces every output: the
    candidates that matched every sampled output are tried on a second sample, the outputs where
    the candidates run so far fail (those that fail there are ruled out: they cannot match every
    output), and the best survivors are run on all outputs; until one matches every output or no
    candidate is left."""
    more: list[tuple] = []
    while not any(t[3].all() for t in results + more):
        todo = _open(rows)
        if not todo:
            break
        miss = sum((~t[3]).astype(np.int64) for t in results + more)
        s = _Sample(p, SAMPLE, "mismatches", _mismatch_indices(miss, SAMPLE))
        with serial_if_small(0, threshold=1):
            for r in todo:
                r["_out"] = _sample_rate(p, s, r["_args"]) != 1.0
        keep = [r for r in todo if not r["_out"]]
        if not keep:
            break
        with serial_if_small(p.M * p.N):
            more += _stage2(p, keep)
    return more


def _ties(p: _Problem, rows: list[dict], best: Recipe, results: list[tuple]) -> tuple[list[Recipe], int]:
    """The other recipes that reproduce every output (the outputs cannot tell them from ``best``):
    those stage 2 found, and up to :data:`TIES` more of the candidates that matched every sampled
    output (first one per other accumulator), run on all outputs; and how many such candidates
    were not run."""
    ties = [t[2] for t in results if t[3].all() and t[2] is not best]
    todo = _open(rows)
    pick: list[dict] = []
    for r in todo:  # in rank order: the best candidate of each other accumulator first
        if r["accumulator"] != best.accumulator and all(r["accumulator"] != q["accumulator"] for q in pick):
            pick.append(r)
    chosen = {id(r) for r in pick}
    pick = (pick + [r for r in todo if id(r) not in chosen])[:TIES]
    with serial_if_small(p.M * p.N):
        for row in pick:
            cand = p.recipe(*row["_args"])
            m = bit_match(p.evaluate(cand).astype(np.float32), p.y)
            row["match_rate"] = float(m.mean())
            if m.all():
                ties.append(cand)
    return ties, len(todo) - len(pick)


def _on_wgmma_kernel(model, fa, fb) -> bool:
    """Whether :func:`~fp8sim.tensorcore.kernels.select` runs the exact CPU GEMM of ``model`` on the
    wgmma kernels (``"packed"``, or ``"wgmma"`` for codes with inf / NaN)."""
    return select(scaled_request(model, fa, fb)).name in ("packed", "wgmma")


def identify(
    a_codes, b_codes, y, *, a_scale=None, b_scale=None, a_format="e4m3", b_format="e4m3", layout="kn"
) -> IdentifyResult:
    """The :class:`~fp8sim.Recipe` under which ``fp8sim.scaled_gemm(a_codes, b_codes, a_scale, b_scale,
    recipe, a_format=..., b_format=..., layout=...)`` reproduces ``y``.

    ``a_codes``, ``b_codes``, the scales, formats and ``layout`` are taken as :func:`fp8sim.scaled_gemm`
    takes them (and checked as it checks them); ``y`` is the kernel's ``(M, N)`` output as a float32
    array or an ``ml_dtypes.bfloat16`` array (or a torch float32 / bfloat16 tensor).  The search
    space and its stages are in the module docstring: every candidate is tried on a sample of the
    outputs ("wgmma" with every split-K layout on up to 8 rows x 128 columns; the other accumulators,
    only when no wgmma candidate reproduces ``y``, on 1 row x 32 columns with ``split_k=1`` and the
    best wgmma split layout only), the best few on all outputs.  Ties go to the usual library
    choices (:data:`PREFERENCE`: wgmma, promote_every None or 128, no split-K, scales in the
    epilogue, the sequential order, bf16 output).

    Returns an :class:`IdentifyResult`: ``.recipe``, ``.match_rate`` (on all outputs), ``.table``
    (every candidate; ``sample_match_rate`` on its sample, ``match_rate`` on all outputs for the
    stage-2 candidates, None for the others) and ``.explain()``.
    """
    t0 = time.perf_counter()
    p = _Problem(a_codes, b_codes, y, a_scale, b_scale, a_format, b_format, layout)
    names = fp8_accumulators()
    # the accumulators whose scaled GEMM runs on a wgmma kernel (fp8sim.tensorcore.kernels) come first
    fast = [a for a in names if a != "fp64" and _on_wgmma_kernel(get_model(a), p.fa, p.fb)]
    slow = [a for a in names if a not in fast]
    with serial_if_small(0, threshold=1):  # the sample's small kernels: no thread pool (see serial_if_small)
        rows = _ranked(_stage1(p, _Sample(p, SAMPLE, "rows"), fast))
    with serial_if_small(p.M * p.N):
        results = _stage2(p, rows)
    results += _widen(p, rows, results)
    if slow and not any(t[3].all() for t in results):  # no wgmma candidate reproduces y: the others
        best = rows[0]
        only = {(1, 128)} | ({(best["split_k"], best["split_granule"])} if best["split_k"] > 1 else set())
        with serial_if_small(0, threshold=1):
            rows = _ranked(rows + _stage1(p, _Sample(p, TINY, "tiny"), slow, only))
        with serial_if_small(p.M * p.N):
            results += _stage2(p, rows)
        results += _widen(p, rows, results)
    rate, _, r, m = min(results, key=lambda t: (-t[0], t[1]))
    ties, untried = _ties(p, rows, r, results) if m.all() else ([], 0)
    mismatch = None
    if not m.all():
        i, j = divmod(int(np.flatnonzero(~m.ravel())[0]), p.N)
        model = p.evaluate(r, [i], [j]).astype(np.float32)[0, 0]
        bf = r.output_format == "bf16"
        yb, mb = _bits(p.y[i, j], bf), _bits(model, bf)
        mismatch = dict(row=i, col=j, y=float(p.y[i, j]), model=float(model), y_bits=yb, model_bits=mb)
        mismatch["bits"] = "bf16" if bf else "fp32"
    full = sorted((row for row in rows if row["match_rate"] is not None), key=lambda t: (-t["match_rate"], t["_key"]))
    rest = [row for row in rows if row["match_rate"] is None]
    table = [{k: v for k, v in row.items() if not k.startswith("_")} for row in full + rest]
    return IdentifyResult(
        recipe=r,
        match_rate=rate,
        table=table,
        n_outputs=int(m.size),
        mismatches=int((~m).sum()),
        mismatch=mismatch,
        seconds=time.perf_counter() - t0,
        ties=ties,
        untried_ties=untried,
        _problem=p,
    )
