"""Train the same small LM from the same initialization and data order with several recipes.

``train(recipes, steps, seed, out_dir)`` writes ``out_dir/summary.json``, ``losses.csv``,
``layer_stats.csv`` and the figures ``loss_curves.png``, ``rel_loss_error.png`` and
``layer_amax.png``; see docs/training.md.  :func:`train_one` runs one recipe and returns a
:class:`RunResult`; :class:`Fault` injects a NaN, an outlier or a gradient spike at a chosen
step (for testing the instruments).
"""

from __future__ import annotations

import csv
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .._fpenv import ieee_defaults
from .._json import dumps as _strict_json
from .._json import json_default
from .data import Batches, corpus
from .instruments import DriftMonitor, DynamicClipper, ElasticRestart, global_norm
from .model import FP8_PARTS, Context, ModelConfig, TransformerLM, precision_for
from .optim import AdamW, lr_schedule

__all__ = [
    "TrainConfig",
    "Fault",
    "RunResult",
    "train_one",
    "train",
    "DEFAULT_RECIPES",
    "relative_loss_error",
    "DEEPSEEK_V3_REL_LOSS_ERROR",
]

DEFAULT_RECIPES = ("bf16", "deepseek-v3", "per-tensor", "per-tensor-no-promotion", "te-hybrid")
#: DeepSeek-V3 report (arXiv 2412.19437): "the relative loss error of our FP8-training model remains
#: consistently below 0.25%" compared with the BF16 baseline.
DEEPSEEK_V3_REL_LOSS_ERROR = 0.0025


@dataclass(frozen=True)
class TrainConfig:
    """Settings of a training run (the defaults are those of ``fp8sim train``).

    The model (``model``), sequences per batch (``batch``), AdamW (peak ``lr``, ``betas``,
    ``weight_decay``) with ``warmup`` steps and cosine decay to ``final_lr_fraction`` of the
    peak, the synthetic corpus (``corpus_tokens``, ``corpus_seed``), elastic restart
    (``checkpoint_interval``, ``checkpoint_dir``; after ``patience`` non-finite steps in a row,
    roll back and multiply the learning rate by ``lr_cut``), validation batches
    (``eval_batches``), the parts of the model that use the recipe (``fp8_parts``), the BLAS and
    numba thread limit (``threads``) and keyword arguments of the drift monitor (``monitor``)
    and of the gradient clipper (``clipper``).
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    batch: int = 8
    lr: float = 2e-3
    warmup: int = 20
    final_lr_fraction: float = 0.1
    weight_decay: float = 0.1
    betas: tuple = (0.9, 0.95)
    corpus_tokens: int = 1 << 18
    corpus_seed: int = 1234
    checkpoint_interval: int = 25
    checkpoint_dir: str | None = None
    lr_cut: float = 0.5
    patience: int = 3
    eval_batches: int = 4
    fp8_parts: tuple = FP8_PARTS
    threads: int | None = 1
    monitor: dict = field(default_factory=dict)
    clipper: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Fault:
    """Inject a fault on the first pass through steps ``step .. step + duration - 1``:

    * ``"nan"``: one NaN in the input of Linear layer ``layer`` (propagates to loss and gradients);
    * ``"outlier"``: one element of that input multiplied by ``factor`` (times the tensor's amax);
    * ``"grad_spike"``: the loss gradient multiplied by ``factor``.
    """

    kind: str
    step: int
    duration: int = 1
    layer: str = "layer0.mlp.up"
    factor: float = 1e6

    def __post_init__(self):
        if self.kind not in ("nan", "outlier", "grad_spike"):
            raise ValueError(f"Fault kind must be 'nan', 'outlier' or 'grad_spike', got {self.kind!r}")

    def apply(self, ctx) -> None:
        if self.kind == "grad_spike":
            ctx.grad_scale *= self.factor
            return
        factor, kind = self.factor, self.kind

        def f(x):
            i = (x.shape[0] // 3, x.shape[-1] // 2)
            if kind == "nan":
                x[i] = np.nan
            else:
                x[i] = np.max(np.abs(x)) * factor
            return x

        ctx.perturbations[self.layer] = f


@dataclass
class RunResult:
    """The record of one recipe's run (:func:`train_one`): per-step losses, gradient norms and
    learning rates, the validation loss, wall time, iterations (steps replayed after a restart
    included), saturation/underflow counts, the instruments' events, per-tensor statistics
    (``series``), non-finite steps, restarts, the fidelity, and the final parameters when asked
    for (``keep_params``)."""

    recipe: str
    losses: np.ndarray
    grad_norms: np.ndarray
    lrs: np.ndarray
    val_loss: float
    wall_time_s: float
    iterations: int
    counts: dict
    events: list
    series: dict  # tensor -> stat -> array over steps (NaN where not recorded)
    nonfinite_steps: int
    restarts: int
    fidelity: str
    params: Any = field(repr=False, default=None)


def _payload(model, opt, clipper, step):
    return {"model": model.state(), "opt": opt.state(), "clipper": clipper.state(), "step": int(step)}


def _restore(payload, model, opt, clipper):
    model.load_state(payload["model"])
    opt.load_state(payload["opt"])
    clipper.load_state(payload["clipper"])


@ieee_defaults
def train_one(
    recipe,
    steps: int,
    seed: int = 0,
    *,
    config: TrainConfig | None = None,
    fidelity: str = "exact",
    faults=(),
    progress=None,
    keep_params: bool = False,
) -> RunResult:
    """Train one recipe for ``steps`` optimizer steps; ``progress`` is called with ``(recipe, step, loss)``
    after every iteration.

    ``fidelity="exact"`` (the default, as for :func:`fp8sim.gemm`) runs the FP8 GEMMs on the
    bit-exact accumulator model and every other GEMM with float64 sums in a fixed order: the
    same seed gives the same bits on every machine and thread count.  ``"fast"`` sums the FP8
    promotion intervals and the BF16/FP32 GEMMs with float32 BLAS, whose summation order
    depends on the CPU, the BLAS build and its thread count: its losses can differ between
    machines, first in the last bits, then by as much as two runs of different recipes."""
    from ..gemms.presets import recipe as _get_recipe

    cfg = config or TrainConfig()
    if steps < 1:
        raise ValueError(f"train: steps must be positive, got {steps}")
    if fidelity not in ("fast", "exact"):
        raise ValueError(f"train: fidelity must be 'fast' or 'exact', got {fidelity!r}")
    r = _get_recipe(recipe)
    ids, vocab = corpus(cfg.corpus_tokens, cfg.corpus_seed)
    mcfg = cfg.model if cfg.model.vocab == vocab.size else _with_vocab(cfg.model, vocab.size)
    prec = precision_for(r, cfg.fp8_parts)
    model = TransformerLM(mcfg, seed, prec.dtype)
    params = model.params()
    opt = AdamW(params, cfg.lr, cfg.betas, weight_decay=cfg.weight_decay, moment_format=prec.moment_format)
    clipper = DynamicClipper(**cfg.clipper)
    monitor = DriftMonitor(**cfg.monitor)
    elastic = ElasticRestart(
        cfg.checkpoint_interval,
        cfg.patience,
        cfg.lr_cut,
        None if cfg.checkpoint_dir is None else os.path.join(cfg.checkpoint_dir, r.name),
    )
    data = Batches(ids, cfg.batch, mcfg.context, seed)
    ctx = Context(prec, fidelity)
    ctx.sr_seed = seed  # stochastic rounding (grad_rounding="sr"): each tensor's seed from (seed, step, name)
    losses = np.full(steps, np.nan)
    norms = np.full(steps, np.nan)
    lrs = np.full(steps, np.nan)
    counts: dict[str, list] = {}
    fired = set()
    t0 = time.perf_counter()
    step, iterations = 0, 0
    elastic.maybe_checkpoint(0, _payload(model, opt, clipper, 0), force=True)
    while step < steps:
        ctx.reset()
        ctx.perturbations = {}
        ctx.grad_scale = 1.0
        ctx.step = step
        for i, f in enumerate(faults):
            if f.step <= step < f.step + f.duration and (i, step) not in fired:
                fired.add((i, step))
                f.apply(ctx)
        x, y = data.batch_at(step)
        with np.errstate(all="ignore"):
            loss = model.loss_and_grads(x, y, ctx)
            norm = global_norm(params)
        iterations += 1
        losses[step], norms[step] = loss, norm
        for name, rec in ctx.records.items():
            if rec.quantized:
                c = counts.setdefault(name.rsplit(":", 1)[-1], [0, 0, 0])
                c[0] += rec.n_saturated
                c[1] += rec.n_underflow
                c[2] += rec.n
        finite = bool(np.isfinite(loss) and np.isfinite(norm))
        res = elastic.observe(step, finite)
        if progress is not None:
            progress(r.name, step, loss)
        if not finite:
            if res is None:
                step += 1
                continue
            if isinstance(res, str):  # "gave_up"
                break
            ck_step, payload = res
            _restore(payload, model, opt, clipper)
            step = ck_step
            continue
        clipper.clip(step, params, norm)
        lr = lr_schedule(step, steps, cfg.lr, cfg.warmup, cfg.final_lr_fraction) * elastic.lr_factor
        lrs[step] = lr
        opt.step(lr)
        monitor.update(step, ctx.records)
        step += 1
        elastic.maybe_checkpoint(step, _payload(model, opt, clipper, step))
    wall = time.perf_counter() - t0
    vctx = Context(prec, fidelity)
    with np.errstate(all="ignore"):
        val = float(np.mean([model.loss(vx, vy, vctx) for vx, vy in data.validation(cfg.eval_batches)]))
    series: dict = {}
    for name, ser in monitor.series.items():
        series[name] = {}
        for stat, pts in ser.items():
            a = np.full(steps, np.nan)
            for s_, v in pts:
                a[s_] = v
            series[name][stat] = a
    events = sorted(elastic.events + clipper.events + monitor.events, key=lambda e: e.step)
    return RunResult(
        r.name,
        losses,
        norms,
        lrs,
        val,
        wall,
        iterations,
        counts,
        events,
        series,
        elastic.nonfinite_steps,
        elastic.restarts,
        fidelity,
        params=model.state() if keep_params else None,
    )


def _with_vocab(mcfg: ModelConfig, vocab: int) -> ModelConfig:
    from dataclasses import replace

    return replace(mcfg, vocab=vocab)


def relative_loss_error(losses: np.ndarray, reference: np.ndarray, fraction: float = 0.1) -> dict:
    """Relative loss error against ``reference`` over the last ``fraction`` of the steps:
    ``mean_abs`` = mean over those steps of ``|L - L_ref| / L_ref`` (same batch each step),
    ``of_means`` = ``|mean(L) - mean(L_ref)| / mean(L_ref)``, ``signed`` = ``mean(L - L_ref) / mean(L_ref)``,
    ``max_abs`` = the largest per-step value."""
    n = len(losses)
    k = max(1, int(round(n * fraction)))
    a, b = np.asarray(losses[-k:], np.float64), np.asarray(reference[-k:], np.float64)
    with np.errstate(all="ignore"):
        rel = np.abs(a - b) / b
        return {
            "mean_abs": float(np.mean(rel)),
            "max_abs": float(np.max(rel)),
            "of_means": float(abs(np.mean(a) - np.mean(b)) / np.mean(b)),
            "signed": float(np.mean(a - b) / np.mean(b)),
            "steps": [n - k, n],
        }


def _summary_of(res: RunResult, ref: RunResult | None, steps: int) -> dict:
    k = max(1, int(round(steps * 0.1)))
    tot = [sum(c[i] for c in res.counts.values()) for i in range(3)]
    out = {
        "final_loss": float(res.losses[-1]),
        "final_loss_last10pct_mean": float(np.nanmean(res.losses[-k:])),
        "mean_loss": float(np.nanmean(res.losses)),
        "val_loss": res.val_loss,
        "rel_loss_error_vs_bf16": None,
        "n_saturated": int(tot[0]),
        "n_underflow": int(tot[1]),
        "n_quantized": int(tot[2]),
        "frac_underflow": float(tot[1] / tot[2]) if tot[2] else 0.0,
        "by_operand": {
            k_: {
                "n_saturated": int(c[0]),
                "n_underflow": int(c[1]),
                "n_quantized": int(c[2]),
                "frac_underflow": float(c[1] / c[2]) if c[2] else 0.0,
            }
            for k_, c in res.counts.items()
        },
        "nonfinite_steps": int(res.nonfinite_steps),
        "restarts": int(res.restarts),
        "clip_events": sum(e.kind == "clip" for e in res.events),
        "drift_warnings": sum(e.kind == "drift" for e in res.events),
        "iterations": res.iterations,
        "wall_time_s": round(res.wall_time_s, 3),
        "s_per_step": round(res.wall_time_s / max(res.iterations, 1), 4),
        "fidelity": res.fidelity,
        "events": [e.as_dict() for e in res.events[:50]],
    }
    if ref is not None:
        out["rel_loss_error_vs_bf16"] = relative_loss_error(res.losses, ref.losses)
    return out


@ieee_defaults
def train(
    recipes=DEFAULT_RECIPES,
    steps: int = 300,
    seed: int = 0,
    out_dir: str = "train_out",
    fidelity: str = "exact",
    progress: bool = True,
    *,
    config: TrainConfig | None = None,
    faults=(),
    figures: bool = True,
    on_step=None,
    jobs: int = 1,
) -> dict:
    """Train every recipe in ``recipes`` (names or Recipes) from the same initialization and data
    order; write the outputs to ``out_dir`` and return the summary (also ``out_dir/summary.json``).

    ``progress`` shows a progress bar on stderr; ``on_step(recipe, step, loss)``, when given, is
    called after every iteration (for progress lines of your own).  ``jobs > 1`` trains that many
    recipes at a time in worker processes (each with ``config.threads`` threads); with
    ``fidelity="exact"`` the results are the same bits as one after the other.  Workers report
    progress when a recipe finishes (``on_step`` is then called for each of its steps)."""
    from ..gemms.presets import recipe as _get_recipe

    cfg = config or TrainConfig()
    if isinstance(recipes, str):
        recipes = [s.strip() for s in recipes.split(",") if s.strip()]
    rs = [_get_recipe(r) for r in recipes]
    if not rs:
        raise ValueError("train: no recipes given")
    names = [r.name for r in rs]
    if len(set(names)) != len(names):
        raise ValueError(f"train: duplicate recipes in {names}")
    os.makedirs(out_dir, exist_ok=True)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=steps * len(rs), desc="train", unit="step", file=sys.stderr, dynamic_ncols=True)

    def tick(name, step, loss):
        if on_step is not None:
            on_step(name, step, loss)
        if bar is not None:
            bar.update(1)
            bar.set_postfix_str(f"{name} step {step} loss {loss:.4f}", refresh=False)

    results = {}
    if isinstance(jobs, (bool, np.bool_)) or not isinstance(jobs, (int, np.integer)) or jobs < 1:
        raise ValueError(f"train: jobs must be an int >= 1, got {jobs!r}")
    if jobs > 1 and len(rs) > 1:
        results = _train_parallel(rs, steps, seed, cfg, fidelity, tuple(faults), int(jobs), tick)
    else:
        with _threads(cfg.threads):
            for r in rs:
                results[r.name] = train_one(r, steps, seed, config=cfg, fidelity=fidelity, faults=faults, progress=tick)
    if bar is not None:
        bar.close()
    ref = results.get("bf16")
    summary = {
        "steps": steps,
        "seed": seed,
        "fidelity": fidelity,
        "threads": cfg.threads,
        "reference": "bf16" if ref is not None else None,
        "deepseek_v3_rel_loss_error_claim": DEEPSEEK_V3_REL_LOSS_ERROR,
        "rel_loss_error_definition": "mean over the last 10% of steps of |L - L_bf16| / L_bf16 (same batch "
        "each step); of_means: |mean L - mean L_bf16| / mean L_bf16 over those steps",
        "config": _jsonable(asdict(cfg)),
        "recipes": {name: _summary_of(res, ref if name != "bf16" else None, steps) for name, res in results.items()},
    }
    _write_losses(os.path.join(out_dir, "losses.csv"), results)
    _write_layer_stats(os.path.join(out_dir, "layer_stats.csv"), results)
    if figures:
        from . import figures as _fig

        summary["figures"] = _fig.all_figures(out_dir, results, DEEPSEEK_V3_REL_LOSS_ERROR)
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        f.write(_strict_json(summary))  # strict JSON: NaN/inf as "nan"/"inf"/"-inf"
    summary["results"] = results
    return summary


def _train_one_job(args):
    r, steps, seed, cfg, fidelity, faults = args
    with _threads(cfg.threads):
        return train_one(r, steps, seed, config=cfg, fidelity=fidelity, faults=faults)


def _train_parallel(rs, steps, seed, cfg, fidelity, faults, jobs, tick) -> dict:
    """:func:`train_one` for each recipe in ``jobs`` spawned worker processes; results in recipe order."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")  # (fork after numba's threads start is not safe)
    with ProcessPoolExecutor(max_workers=min(jobs, len(rs)), mp_context=ctx) as pool:
        futs = {r.name: pool.submit(_train_one_job, (r, steps, seed, cfg, fidelity, faults)) for r in rs}
        out = {}
        for name, fut in futs.items():
            res = fut.result()
            for i in range(res.iterations):
                tick(name, min(i, steps - 1), float(res.losses[min(i, steps - 1)]))
            out[name] = res
    return out


def _jsonable(d):
    return json.loads(json.dumps(d, default=json_default))


def _write_losses(path, results):
    names = list(results)
    n = len(next(iter(results.values())).losses)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step"] + names)
        for i in range(n):
            w.writerow([i] + [repr(float(results[k].losses[i])) for k in names])


def _write_layer_stats(path, results):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["recipe", "step", "tensor", "amax", "rms", "frac_saturated", "frac_underflow"])
        for name, res in results.items():
            for tensor, ser in res.series.items():
                for i in range(len(res.losses)):
                    if np.isnan(ser["amax"][i]):
                        continue
                    w.writerow(
                        [name, i, tensor]
                        + [f"{ser[s][i]:.6g}" for s in ("amax", "rms", "frac_saturated", "frac_underflow")]
                    )


class _threads:
    """Limit BLAS and numba threads (the model's tensors are small: on a shared 2-core machine one
    thread per process was 2-5x faster than two)."""

    def __init__(self, n):
        self.n = n

    def __enter__(self):
        self._ctl: Any = None
        self._numba: Any = None
        if not self.n:
            return self
        try:
            from threadpoolctl import threadpool_limits

            self._ctl = threadpool_limits(self.n)
        except ImportError:  # pragma: no cover
            pass
        try:
            import numba

            self._numba = numba.get_num_threads()
            numba.set_num_threads(min(self.n, numba.config.NUMBA_NUM_THREADS))
        except Exception:  # noqa: BLE001  # pragma: no cover
            self._numba = None
        return self

    def __exit__(self, *exc):
        if self._ctl is not None:
            self._ctl.restore_original_limits()
        if self._numba is not None:
            import numba

            numba.set_num_threads(self._numba)
        return False
