"""Real FP8 training on the H200 against fp8sim.torch's emulation of it, step for step.

A GPT (:class:`fp8sim.torch.gpt.GPT`, 4 layers, d_model 512, 8 heads, d_ff 2048, context 256,
byte tokens of CPython's documentation text: 13.0 M parameters) is trained with the one loop
:func:`fp8sim.torch.gpt.fit` several times from the same seed; the runs differ only in what runs
the GEMMs of the Linear layers (the output head stays an fp32 ``nn.Linear`` in every run):

==============  ==================================================================================
run             the GEMMs of each Linear layer
==============  ==================================================================================
``real-block``  DeepSeek-V3's recipe on the tensor cores.  x quantized in 1x128 tiles, W in 128x128
                blocks, dy in 1x128 tiles (E4M3, fp32 scales amax/448).  Fprop ``y = x W^T`` and
                Dgrad ``dx = dy W`` by ``torch._scaled_mm`` with blockwise scales (cuBLASLt, BF16
                out); Wgrad ``dW^T = x^T dy`` with both operands re-quantized in 1x128 tiles along
                the tokens by the project's wgmma kernel (``gpu/kernels/gemm.cu``, FP32 out):
                cuBLASLt's blockwise GEMM takes 128x128 blocks on one operand only.
``emu-block``   ``fp8sim.torch.convert(model, Plan("deepseek-v3"))`` (the recipe alone, no activation
                caches): the same three GEMMs emulated on CUDA cores (:mod:`fp8sim.gemms.device`);
                cuBLASLt blockwise is the ``cublaslt-block`` preset, whose arithmetic is
                ``deepseek-v3``'s
``real-tensor`` per-tensor scales, ``torch._scaled_mm`` tensorwise (``use_fast_accum=False``) for all
                three GEMMs
``emu-tensor``  ``fp8sim.torch.convert(model, "cublaslt-tensor")``
``bf16``        ``torch.nn.functional.linear`` on BF16 copies of x and W (BF16 GEMMs, FP32 master)
==============  ==================================================================================

The real runs quantize with their own code (plain torch, below): ``s = fp32(amax / 448)`` per block
(at least 2^-126), codes ``RNE(x / s)`` computed exactly in float64 and saturated to 448; the K of every
blockwise ``torch._scaled_mm`` is zero-padded to whole groups of 4 blocks (:func:`pad_k`), so any width
whose blocks are not a multiple of 4 (d_model 384) runs with the scales cuBLASLt reads.  Every
GEMM output (Fprop y, Dgrad dx, Wgrad dW) of every step is hashed (a linear hash of its bits) in
every run, so two runs are compared GEMM by GEMM as well as loss by loss; the first GEMM whose
hashes differ is where two runs part.  torch runs deterministically (``use_deterministic_algorithms``,
attention through the math backend).

Run (on the GPU machine, from the repository root)::

    PYTHONPATH=. python3 -m gpu.train_fp8 OUTDIR [--steps 300] [--seeds 0,1,2] [--proof-runs ...] [--d-model N]

writes ``OUTDIR/train_fp8.json`` (losses as float bits, per-run GEMM hash agreement, kernel
names of one step, seconds per step) and ``OUTDIR/train_fp8_losses.csv``.  ``--fake`` runs the
same code on the CPU with fp8sim's own GEMMs in place of cuBLASLt and the wgmma kernel (a check
of the plumbing: layouts, scales, transposes), on a smaller model.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import numpy as np
import torch

from fp8sim.torch import Plan, convert
from fp8sim.torch.gpt import GPT, GPTConfig, fit, load_corpus
from fp8sim.torch.plans import DEFAULT_SKIP, matches
from fp8sim.training.data import Batches

TILE = 128
E4M3_MAX = 448.0
PROOF_CONFIG = GPTConfig(
    vocab=256, d_model=512, n_layers=4, n_heads=8, d_ff=2048, context=256, batch=8, lr=1e-3, warmup=30
)
FAKE_CONFIG = GPTConfig(vocab=256, d_model=256, n_layers=1, n_heads=4, d_ff=512, context=64, batch=4, warmup=2)


# ------------------------------------------------------------------ quantization (plain torch)
def rne_e4m3(q: torch.Tensor) -> torch.Tensor:
    """float64 ``q`` rounded to nearest even E4M3 (saturated to +-448) as a float8_e4m3fn tensor."""
    _, e = torch.frexp(q)  # q = m * 2**e, 0.5 <= |m| < 1 (e = 0 for q = 0)
    quantum = torch.exp2(((e - 1).clamp(min=-6) - 3).double())  # 3 fraction bits; subnormals below 2**-6
    r = (torch.round(q / quantum) * quantum).clamp(-E4M3_MAX, E4M3_MAX)  # torch.round: half to even
    return r.to(torch.float8_e4m3fn)  # exact: r is an E4M3 value


def quant(x: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` (2-D float32, its shape a multiple of ``block``) as E4M3 codes and fp32 block scales
    ``(R / bm, C / bc)``: ``s = fp32(amax / 448)`` (at least 2**-126), codes ``RNE(x / s)``."""
    R, C = x.shape
    bm, bc = block
    amax = x.abs().reshape(R // bm, bm, C // bc, bc).amax(dim=(1, 3))
    s = (amax.double() / E4M3_MAX).float().clamp(min=2.0**-126)
    full = s.double().repeat_interleave(bm, 0).repeat_interleave(bc, 1)
    return rne_e4m3(x.double() / full), s


def outer_major(s: torch.Tensor) -> torch.Tensor:
    """A 2-D scale tensor with the same values, stored outer-dim-major (column-major), as torch's
    blockwise ``scale_a`` wants it."""
    return s.t().contiguous().t()


#: blockwise ``torch._scaled_mm`` wants the GEMM's K in whole groups of this many 128-blocks (below)
K_BLOCK_GROUP = 4


def pad_k(codes: torch.Tensor, scales: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """An operand of a blockwise ``torch._scaled_mm``, its E4M3 ``codes`` and block ``scales`` (one per
    128 elements along ``dim``, the GEMM's K), padded along ``dim`` to a multiple of
    :data:`K_BLOCK_GROUP` blocks: zero codes (+0.0) and unit scales, so the product is unchanged.

    cuBLASLt reads the 128x128 scales of K block i and N block c at ``c * L4 + i``, L4 = the number of
    K blocks rounded up to a multiple of 4 (16-byte aligned), while torch accepts only the unpadded
    ``(K/128, N/128)`` outer-dim-major tensor: with K/128 not a multiple of 4 (d_model 384) torch refuses
    a padded view and cuBLASLt misreads the plain one (docs/libraries.md).  Padding K itself makes the
    two layouts one.  Both operands go through this (their K must agree); the inputs are returned as
    they are when no padding is needed, else new contiguous tensors."""
    nkb = scales.shape[dim]
    if codes.shape[dim] != nkb * TILE:
        raise ValueError(f"pad_k: {codes.shape[dim]} codes along dim {dim} but {nkb} scales of {TILE}")
    extra = -nkb % K_BLOCK_GROUP
    if not extra:
        return codes, scales
    zshape, oshape = list(codes.shape), list(scales.shape)
    zshape[dim], oshape[dim] = extra * TILE, extra
    raw = codes.view(torch.uint8)  # cat on the bytes: 0x00 is E4M3 +0.0
    zeros = torch.zeros(zshape, dtype=torch.uint8, device=codes.device)
    ones = torch.ones(oshape, dtype=scales.dtype, device=scales.device)
    return torch.cat([raw, zeros], dim).view(codes.dtype), torch.cat([scales, ones], dim)


# ------------------------------------------------------------------ the GEMM engines
class Engine:
    """What runs the real GEMMs: cuBLASLt through ``torch._scaled_mm`` and the project's wgmma kernel."""

    def scaled_mm(self, a, b, sa, sb, out_dtype):
        return torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=out_dtype, use_fast_accum=False)

    def wgrad(self, a: torch.Tensor, bt: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
        """``D (M, N) = sum_k a[m, k] bt[n, k]`` with 1x128 scales ``sa (M, K/128)`` and ``sb (K/128, N)``
        by gpu/kernels/gemm.cu (promotion every 128 K with ``fma(sa*sb, partial, acc)``), FP32 out."""
        import cupy as cp

        from gpu.gemm import LBO, SBO, _module

        M, K = a.shape
        N = bt.shape[0]
        if M % 64 or N % 32 or K % TILE:
            raise ValueError(f"wgrad kernel: M={M} (multiple of 64), N={N} (32), K={K} (128)")
        torch.cuda.synchronize()
        A = cp.from_dlpack(a.contiguous().view(torch.uint8))
        B = cp.from_dlpack(bt.contiguous().view(torch.uint8))
        dsa, dsb = cp.from_dlpack(sa.contiguous()), cp.from_dlpack(sb.contiguous())
        D = cp.empty((M, N), cp.float32)
        Db = cp.empty((M, N), cp.uint16)
        args = (A, B, dsa, dsb, D, Db, np.int32(M), np.int32(N), np.int32(K), np.int32(K // TILE))
        args += (np.int32(TILE), np.int32(TILE // 32), np.int32(LBO), np.int32(SBO))
        _module().get_function("fp8_gemm_e4m3")((N // 32, M // 64), (128,), args)
        cp.cuda.Device().synchronize()
        return torch.from_dlpack(D)


class FakeEngine(Engine):
    """fp8sim's CPU kernels in place of the real ones (``--fake``): the same arithmetic, on the host."""

    def scaled_mm(self, a, b, sa, sb, out_dtype):
        import fp8sim

        ac = a.view(torch.uint8).numpy()
        bt = b.t().contiguous().view(torch.uint8).numpy()  # (N, K)
        if sa.dim() == 0:
            r, sa_n, sb_n = fp8sim.recipe("cublaslt-tensor"), sa.numpy(), sb.numpy()
        else:
            r, sa_n, sb_n = fp8sim.recipe("cublaslt-block"), sa.contiguous().numpy(), sb.t().contiguous().numpy()
        r = r.with_(output_format="bf16" if out_dtype == torch.bfloat16 else "fp32")
        y = fp8sim.scaled_gemm(ac, bt, sa_n, sb_n, r, layout="nk")
        return torch.from_numpy(np.ascontiguousarray(y)).to(out_dtype)

    def wgrad(self, a, bt, sa, sb):
        from fp8sim.gemms.engine import scaled_matmul

        y = scaled_matmul(
            a.view(torch.uint8).numpy(),
            np.ascontiguousarray(bt.view(torch.uint8).numpy().T),
            sa.contiguous().numpy(),
            sb.contiguous().numpy(),
            a_format="e4m3",
            b_format="e4m3",
            kscale=TILE,
        )
        return torch.from_numpy(np.ascontiguousarray(y))


# ------------------------------------------------------------------ the real Linear layers
class _RealFP8(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, mode, engine):  # x (T, K), w (N, K), float32
        ctx.mode, ctx.engine = mode, engine
        T, K = x.shape
        N = w.shape[0]
        if mode == "block":
            xq, sx = quant(x, (1, TILE))
            wq, sw = quant(w, (TILE, TILE))  # (N/128, K/128)
            xp, sxp = pad_k(xq, sx, 1)
            wp, swp = pad_k(wq, sw, 1)
            y = engine.scaled_mm(xp, wp.t(), outer_major(sxp), outer_major(swp.t()), torch.bfloat16)
        else:
            xq, sx = quant(x, (T, K))
            wq, sw = quant(w, (N, K))
            y = engine.scaled_mm(xq, wq.t(), sx.reshape(()), sw.reshape(()), torch.bfloat16)
        ctx.save_for_backward(x, wq, sw, xq, sx)
        return y.float()

    @staticmethod
    def backward(ctx, gy):
        x, wq, sw, xq, sx = ctx.saved_tensors
        e = ctx.engine
        gy = gy.contiguous()
        T, N = gy.shape
        if ctx.mode == "block":
            gq, sg = quant(gy, (1, TILE))  # along N, Dgrad's K
            gp, sgp = pad_k(gq, sg, 1)
            wp, swp = pad_k(wq, sw, 0)  # W's N is Dgrad's K
            w_kn = wp.t().contiguous().t()  # W (N, K) stored column-major: the (K, N) operand of Dgrad
            dx = e.scaled_mm(gp, w_kn, outer_major(sgp), outer_major(swp), torch.bfloat16)
            xtq, sxt = quant(x.t().contiguous(), (1, TILE))  # (K, T): along the tokens
            gtq, sgt = quant(gy.t().contiguous(), (1, TILE))  # (N, T)
            dwt = e.wgrad(xtq, gtq, sxt, sgt.t().contiguous())  # (K, N)
        else:
            gq, sg = quant(gy, (T, N))
            w_kn = wq.t().contiguous().t()
            dx = e.scaled_mm(gq, w_kn, sg.reshape(()), sw.reshape(()), torch.bfloat16)
            # Wgrad: x^T (K, T) row-major (the same codes: one scale for the tensor), dy (T, N) column-major
            dwt = e.scaled_mm(
                xq.t().contiguous(), gq.t().contiguous().t(), sx.reshape(()), sg.reshape(()), torch.float32
            )
        return dx.float(), dwt.t().contiguous(), None, None


class RealLinear(torch.nn.Module):
    """``nn.Linear`` (no bias) whose GEMMs run on the tensor cores (``mode``: ``"block"``, ``"tensor"``
    or ``"bf16"``); shares the original module's weight Parameter."""

    def __init__(self, lin: torch.nn.Linear, mode: str, engine: Engine) -> None:
        super().__init__()
        if lin.bias is not None:
            raise ValueError("RealLinear: the proof's model has no biases")
        self.weight, self.mode, self.engine = lin.weight, mode, engine

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1])
        if self.mode == "bf16":
            y = torch.nn.functional.linear(x2.bfloat16(), self.weight.bfloat16()).float()
        else:
            y = _RealFP8.apply(x2.float().contiguous(), self.weight, self.mode, self.engine)
        return y.reshape(*lead, -1)


def convert_real(model: torch.nn.Module, mode: str, engine: Engine) -> torch.nn.Module:
    for name, mod in list(model.named_modules()):
        for child_name, child in list(mod.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if type(child) is torch.nn.Linear and not matches(full, DEFAULT_SKIP):
                setattr(mod, child_name, RealLinear(child, mode, engine))
    return model


# ------------------------------------------------------------------ GEMM hashes
class Hashes:
    """A linear hash of the bits of every Linear layer's Fprop output, Dgrad output and Wgrad
    result, per step: ``{step: {"<layer>/<role>": int}}``."""

    def __init__(self, model: torch.nn.Module, device, n_max: int) -> None:
        g = torch.Generator().manual_seed(12345)
        self.w = torch.randint(-(2**62), 2**62, (n_max,), generator=g, dtype=torch.int64).to(device)
        self.step: dict[str, torch.Tensor] = {}
        self.steps: list[dict[str, int]] = []
        for name, mod in model.named_modules():
            if name and hasattr(mod, "weight") and not matches(name, DEFAULT_SKIP) and mod.weight.dim() == 2:
                if isinstance(mod, torch.nn.Embedding) or "norm" in name:
                    continue
                mod.register_forward_hook(lambda m, i, o, name=name: self._add(name + "/fprop", o))
                mod.register_full_backward_hook(lambda m, gi, go, name=name: self._add(name + "/dgrad", gi[0]))
                mod.weight.register_post_accumulate_grad_hook(lambda p, name=name: self._add(name + "/wgrad", p.grad))

    def _add(self, key: str, t) -> None:
        if t is None:
            return
        v = t.detach().float().contiguous().view(torch.int32).flatten().to(torch.int64)
        self.step[key] = (v * self.w[: v.numel()]).sum()

    def end_step(self) -> None:
        keys = sorted(self.step)
        vals = torch.stack([self.step[k] for k in keys]).cpu().tolist() if keys else []
        self.steps.append(dict(zip(keys, vals)))
        self.step = {}


def compare(a: list[dict[str, int]], b: list[dict[str, int]]) -> dict:
    """GEMMs equal in both runs (same key, same hash), up to the first step where any differs."""
    n = same = 0
    first = None
    for s, (da, db) in enumerate(zip(a, b)):
        for k in sorted(set(da) | set(db)):
            n += 1
            if da.get(k) == db.get(k):
                same += 1
            elif first is None:
                first = {"step": s, "gemm": k}
    return {"gemms_compared": n, "gemms_equal": same, "first_difference": first}


# ------------------------------------------------------------------ runs
def one_run(kind: str, seed: int, steps: int, device, c: GPTConfig, data: Batches, engine: Engine, hash_gemms: bool):
    torch.manual_seed(seed)
    model = GPT(c).to(device)
    if kind.startswith("emu-"):
        model = convert(model, {"emu-block": Plan("deepseek-v3"), "emu-tensor": Plan("cublaslt-tensor")}[kind])
    else:
        model = convert_real(model, {"real-block": "block", "real-tensor": "tensor", "bf16": "bf16"}[kind], engine)
    hashes = Hashes(model, device, c.batch * c.context * max(c.d_ff, 3 * c.d_model)) if hash_gemms else None
    cb = None if hashes is None else (lambda step, loss: hashes.end_step())
    losses, wall, val = fit(model, data, c, steps, device, on_step=cb)
    return {"losses": losses, "s_per_step": wall / steps, "val_loss": val}, (hashes.steps if hashes else None)


def step_kernels(device, c: GPTConfig, data: Batches, engine: Engine, kind: str) -> list[str]:
    """The CUDA kernel names of one training step of ``kind`` (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    model = convert_real(GPT(c).to(device), {"real-block": "block", "real-tensor": "tensor"}[kind], engine)
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        fit(model, data, c, 1, device)
        torch.cuda.synchronize()
    names = sorted({e.name[:200] for e in p.events() if e.device_type.name == "CUDA"})
    return [n for n in names if any(s in n.lower() for s in ("gemm", "splitk", "sm90", "fp8", "cutlass", "nvjet"))]


def bits(x: float) -> str:
    return np.float64(x).tobytes().hex()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seeds", default="0,1,2", help="seeds of the comparison runs (real-block, real-tensor, bf16)")
    ap.add_argument("--proof-runs", default="emu-block,real-block,real-block,emu-tensor,real-tensor")
    ap.add_argument("--fake", action="store_true", help="CPU, fp8sim's GEMMs in place of the real ones")
    ap.add_argument("--time-limit", type=float, default=480.0, help="skip comparison runs after this many seconds")
    ap.add_argument(
        "--d-model",
        type=int,
        default=None,
        help="another width (a multiple of 128; heads of 64, d_ff 4 x d_model), e.g. 384, whose 128-blocks "
        "are not a multiple of 4",
    )
    a = ap.parse_args(argv)
    if a.d_model is not None and (a.d_model < 128 or a.d_model % TILE):
        ap.error(f"--d-model must be a positive multiple of {TILE}, got {a.d_model}")
    t_start = time.time()
    os.makedirs(a.out, exist_ok=True)
    device = "cpu" if a.fake else "cuda"
    engine: Engine = FakeEngine() if a.fake else Engine()
    c = FAKE_CONFIG if a.fake else PROOF_CONFIG
    if a.d_model is not None:
        c = dataclasses.replace(c, d_model=a.d_model, n_heads=a.d_model // 64, d_ff=4 * a.d_model)
    torch.use_deterministic_algorithms(True, warn_only=True)
    ids, vocab, sha = load_corpus("pydoc")
    n_params = sum(p.numel() for p in GPT(c).parameters())
    info: dict = {
        "config": c.__dict__,
        "parameters": n_params,
        "steps": a.steps,
        "corpus": "pydoc",
        "corpus_sha256": sha,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "device": "cpu (fake engine)" if a.fake else torch.cuda.get_device_name(),
        "runs": {},
    }
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if not a.fake:
        info["cuda"] = torch.version.cuda
        with sdpa_kernel(SDPBackend.MATH):
            d0 = Batches(ids, c.batch, c.context, 0)
            info["kernels"] = {k: step_kernels(device, c, d0, engine, k) for k in ("real-block", "real-tensor")}

    hashes: dict[str, list] = {}
    columns: dict[str, list[float]] = {}

    def record(key, res, h):
        info["runs"][key] = {
            "s_per_step": res["s_per_step"],
            "val_loss": res["val_loss"],
            "loss_bits": [bits(v) for v in res["losses"]],
        }
        columns[key] = res["losses"]
        if h is not None:
            hashes[key] = h
        print(
            f"[train_fp8] {key}: final loss {res['losses'][-1]:.6f}, {res['s_per_step'] * 1e3:.1f} ms/step", flush=True
        )
        with open(os.path.join(a.out, "train_fp8.json"), "w") as f:
            json.dump(info, f, indent=1)

    with sdpa_kernel(SDPBackend.MATH):
        data = Batches(ids, c.batch, c.context, 0)
        seen: dict[str, int] = {}
        for kind in [k for k in a.proof_runs.split(",") if k]:
            seen[kind] = seen.get(kind, 0) + 1
            key = f"{kind}/seed0" + ("" if seen[kind] == 1 else f"/repeat{seen[kind] - 1}")
            record(key, *one_run(kind, 0, a.steps, device, c, data, engine, hash_gemms=True))
        pairs = (("emu-block", "real-block"), ("emu-tensor", "real-tensor"), ("real-block", "real-block/seed0/repeat1"))
        for x, y in pairs:
            ka, kb = f"{x}/seed0", (y if "/" in y else f"{y}/seed0")
            if ka in hashes and kb in hashes:
                same_loss = info["runs"][ka]["loss_bits"] == info["runs"][kb]["loss_bits"]
                info.setdefault("comparisons", {})[f"{ka} vs {kb}"] = {
                    "losses_identical": same_loss,
                    **compare(hashes[ka], hashes[kb]),
                }
                print(f"[train_fp8] {ka} vs {kb}: {info['comparisons'][f'{ka} vs {kb}']}", flush=True)
        for seed in [int(s) for s in a.seeds.split(",") if s]:
            data = Batches(ids, c.batch, c.context, seed)
            for kind in ("bf16", "real-block", "real-tensor"):
                key = f"{kind}/seed{seed}"
                if key in info["runs"]:
                    continue
                if time.time() - t_start > a.time_limit:
                    info.setdefault("skipped", []).append(key)
                    continue
                record(key, *one_run(kind, seed, a.steps, device, c, data, engine, hash_gemms=False))
    with open(os.path.join(a.out, "train_fp8_losses.csv"), "w", newline="") as f:
        w = csv.writer(f)
        keys = list(columns)
        w.writerow(["step", *keys])
        for s in range(a.steps):
            w.writerow([s, *(repr(columns[k][s]) for k in keys)])
    with open(os.path.join(a.out, "train_fp8.json"), "w") as f:
        json.dump(info, f, indent=1)
    print(f"[train_fp8] done in {time.time() - t_start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
