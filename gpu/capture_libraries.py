"""Capture what the FP8 GEMM libraries compute on this GPU: inputs, outputs, versions, kernel names.

Run on a machine with an NVIDIA Hopper GPU, torch (with CUDA) and Triton, from the repository
root::

    PYTHONPATH=. python3 -m gpu.capture_libraries --out DIR [--quick]

It writes ``DIR/libraries_sm90.npz`` (the captures) and ``DIR/libraries_sm90.json`` (versions,
the kernels each library launched per configuration and shape, and every configuration a library
refused, with its error message).  ``tests/test_libraries.py`` reproduces every captured output
with :func:`fp8sim.scaled_gemm` and zero tolerance; ``docs/libraries.md`` describes the results.

What is captured, per input set (a shape, a distribution, an operand-format pair):

* ``torch._scaled_mm`` (cuBLASLt): tensorwise (0-dim fp32 scales), rowwise (``(M, 1)`` and
  ``(1, N)`` fp32 scales) and blockwise (1x128 activations, ``(M, ceil(K/128))`` outer-dim-major;
  128x128 weights, ``(ceil(K/128), ceil(N/128))`` outer-dim-major for ``b = w.t()``), each with
  ``use_fast_accum`` off and on where torch allows it, bf16 and fp32 outputs;
* a Triton ``tl.dot`` GEMM (:func:`triton_gemm`) with BLOCK_K 64 and 128 and
  ``max_num_imprecise_acc`` default / 32 / 64 / 128 where Triton allows it;
* the project's own DeepSeek-V3 kernel (``gpu/kernels/gemm.cu``, e4m3 only);
* torch's bf16 matmul (cuBLASLt) on bf16 operands (the hardware BF16 baseline).

Storage (npz keys ``<set>/<name>``): ``a`` sampled rows of A codes (uint8, ``(m, K)``), ``w``
sampled rows of W = B^T codes (uint8, ``(n, K)``: torch's weight layout), ``rows`` / ``cols``
(the sampled indices into M and N), the scales of each kind (``sa_tensor``, ``sb_tensor``
scalars; ``sa_row (m, 1)``, ``sb_row (1, n)``; ``sa_block (m, ceil(K/128))`` for the sampled
rows and ``sb_block (ceil(K/128), ceil(N/128))`` in full), and one output per configuration
``y/<config>`` as raw bits (uint16 for bf16, uint32 for fp32) of shape ``(m, n)``.  The bf16
baseline stores its operands as ``abf`` / ``wbf`` (uint16 bits).  The outputs were computed on
the full ``(M, N, K)`` problem: a library's choice of kernel and split-K depends on the shape.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import traceback

import numpy as np

TILE = 128
FMT = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}

# (name, M, N, K, distribution, pairs, sampled rows, sampled cols, bf16 baseline)
PAIRS4 = (("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3"), ("e5m2", "e5m2"))
SETS = [
    ("sq256_normal", 256, 256, 256, "normal", PAIRS4[:1], 64, 64, False),
    ("mid256_normal", 256, 256, 4096, "normal", PAIRS4, 32, 32, True),
    ("sq1024_uniform", 1024, 1024, 1024, "uniform", PAIRS4[:1], 32, 32, False),
    ("sq4096_outlier", 4096, 4096, 4096, "outlier", PAIRS4[:1], 16, 16, True),
    ("sq4096_uniform", 4096, 4096, 4096, "uniform", PAIRS4[:1], 16, 16, False),
    ("skinny64_normal", 64, 64, 16384, "normal", (PAIRS4[0], PAIRS4[2]), 16, 16, True),
    ("skinny128x256_uniform", 128, 256, 8192, "uniform", PAIRS4[:1], 16, 16, False),
    ("skinny256x128_outlier", 256, 128, 16384, "outlier", PAIRS4[:1], 16, 16, False),
    ("skinny32x2048_normal", 32, 2048, 7168, "normal", PAIRS4[:1], 16, 16, False),
    ("ragged200x336_normal", 200, 336, 1040, "normal", PAIRS4[:3], 64, 64, True),
    ("ragged520x272_uniform", 520, 272, 2960, "uniform", PAIRS4[:1], 24, 24, False),
    ("special256_nan", 256, 256, 512, "special", PAIRS4[:3], 64, 64, False),
    ("special256_saturate", 256, 256, 512, "saturate", PAIRS4[:1], 64, 64, False),
]
QUICK = {"sq256_normal", "mid256_normal", "ragged200x336_normal", "skinny64_normal"}


def float_inputs(M, N, K, dist, seed):
    """x (M, K), w (N, K) float32 for a distribution."""
    rng = np.random.default_rng(seed)
    if dist == "uniform":
        x, w = rng.random((M, K)), rng.random((N, K))
    else:
        x, w = rng.standard_normal((M, K)), rng.standard_normal((N, K))
        if dist == "outlier":  # mean-shifted activations with outlier channels
            x = x + 0.5
            ch = rng.choice(K, size=max(2, K // 128), replace=False)
            x[:, ch] *= 50.0
    return x.astype(np.float32), w.astype(np.float32)


def quantize_rows(torch, t, fmt, rng):
    """FP8 codes of t (rows along K) with one fp32 scale per 1x128 block (amax / fmt max) and
    the scales; NaN-free inputs only."""
    fmax = 448.0 if fmt == "e4m3" else 57344.0
    R, K = t.shape
    nb = -(-K // TILE)
    pad = torch.nn.functional.pad(t, (0, nb * TILE - K))
    amax = pad.abs().reshape(R, nb, TILE).amax(-1).clamp_min(1e-12)
    s = (amax / fmax).float()
    q = (pad.reshape(R, nb, TILE) / s[..., None]).reshape(R, nb * TILE)[:, :K]
    codes = q.to(getattr(torch, FMT[fmt]))
    return codes, s


def special_codes(torch, codes, fmt, rng, which):
    """NaN / inf codes sprinkled in (``which="special"``) or every code at the format's max."""
    c = codes.view(torch.uint8).clone()
    if which == "special":
        mask = torch.from_numpy(rng.random(tuple(c.shape)) < 3e-3).to(c.device)
        nan = 0x7F if fmt == "e4m3" else 0x7E  # e4m3 NaN; e5m2 NaN
        c[mask] = nan
        if fmt == "e5m2":
            mask2 = torch.from_numpy(rng.random(tuple(c.shape)) < 3e-3).to(c.device)
            c[mask2] = 0x7C  # +inf
            c[mask2 & torch.from_numpy(rng.random(tuple(c.shape)) < 0.5).to(c.device)] = 0xFC
    else:  # saturate: +-max codes
        mx = 0x7E if fmt == "e4m3" else 0x7B
        sign = torch.from_numpy((rng.random(tuple(c.shape)) < 0.3).astype(np.uint8) * 0x80).to(c.device)
        c = (torch.full_like(c, mx) | sign).to(torch.uint8)
    return c.view(codes.dtype)


def triton_gemm():
    """The Triton FP8 GEMM that is captured: one tile per program, acc = tl.dot(a, b, acc[, max_num_imprecise_acc])
    over K in BLOCK_K steps (masked loads zero-fill the ragged K, M and N edges), then
    ``acc * sa[:, None] * sb[None, :]`` (fp32, left to right) and the cast to the output dtype."""
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(
        a_ptr, w_ptr, c_ptr, sa_ptr, sb_ptr, M, N, K,
        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, IMP: tl.constexpr, OUT_BF16: tl.constexpr,
    ):  # fmt: skip
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            kk = k0 + rk
            a = tl.load(a_ptr + rm[:, None] * K + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
            b = tl.load(w_ptr + rn[None, :] * K + kk[:, None], mask=(rn[None, :] < N) & (kk[:, None] < K), other=0.0)
            if IMP == 0:
                acc = tl.dot(a, b, acc)
            else:
                acc = tl.dot(a, b, acc, max_num_imprecise_acc=IMP)
        sa = tl.load(sa_ptr + rm, mask=rm < M, other=1.0)
        sb = tl.load(sb_ptr + rn, mask=rn < N, other=1.0)
        c = acc * sa[:, None] * sb[None, :]
        msk = (rm[:, None] < M) & (rn[None, :] < N)
        if OUT_BF16:
            tl.store(c_ptr + rm[:, None] * N + rn[None, :], c.to(tl.bfloat16), mask=msk)
        else:
            tl.store(c_ptr + rm[:, None] * N + rn[None, :], c, mask=msk)

    def run(torch, a, w, sa, sb, BK, imp, out_bf16, BM=128, BN=128):
        M, K = a.shape
        N = w.shape[0]
        c = torch.empty((M, N), device=a.device, dtype=torch.bfloat16 if out_bf16 else torch.float32)
        grid = (triton.cdiv(M, BM), triton.cdiv(N, BN))
        kernel[grid](a, w, c, sa, sb, M, N, K, BM=BM, BN=BN, BK=BK, IMP=imp, OUT_BF16=out_bf16, num_warps=8)
        return c

    return run


def padded_block_scales(torch, sb_b):
    """The (nkb, nnb) 128x128 weight scales as cuBLASLt reads them: outer-dim-major with the K
    extent padded to a multiple of 4 blocks (torch's ``L4 = round_up(K // 128, 4)``): a view of a
    (nnb, L4) buffer, shape (nkb, nnb), strides (1, L4)."""
    nkb, nnb = sb_b.shape
    l4 = -(-nkb // 4) * 4
    buf = torch.zeros((nnb, l4), device=sb_b.device, dtype=torch.float32)
    buf[:, :nkb] = sb_b.t()
    return buf[:, :nkb].t()


def split_probe(torch, store, meta, M, N, K, seed, pairs):
    """Crafted blockwise GEMMs that show how a split-K kernel combines 128-K tiles: all codes zero
    except in tiles t1 and t2 (``pairs``); stored ``probe<M>x<N>x<K>/y/<t1>_<t2>`` (fp32 bits of the first 16 x 16 outputs)."""
    rng = np.random.default_rng(seed)
    nkb = K // TILE
    x = torch.from_numpy(rng.standard_normal((M, K)).astype(np.float32)).cuda()
    w = torch.from_numpy(rng.standard_normal((N, K)).astype(np.float32)).cuda()
    a, sa_blk = quantize_rows(torch, x, "e4m3", rng)
    wq, sw_blk = quantize_rows(torch, w, "e4m3", rng)
    nnb = -(-N // TILE)
    sb_b = torch.nn.functional.pad(sw_blk, (0, 0, 0, nnb * TILE - N)).reshape(nnb, TILE, nkb).amax(1).t().contiguous()
    g = f"probe{M}x{N}x{K}"
    store[g + "/a"] = a.view(torch.uint8)[:16].cpu().numpy()
    store[g + "/w"] = wq.view(torch.uint8)[:16].cpu().numpy()
    store[g + "/sa_block"] = sa_blk[:16].cpu().numpy()
    store[g + "/sb_block"] = sb_b.cpu().numpy()
    sa_bl = sa_blk.t().contiguous().t()
    sb_bl = padded_block_scales(torch, sb_b)
    names = set()
    for t1, t2 in pairs:
        keep = torch.zeros(K, dtype=torch.bool, device="cuda")
        keep[t1 * TILE : (t1 + 1) * TILE] = True
        keep[t2 * TILE : (t2 + 1) * TILE] = True
        az = torch.where(keep[None, :], a.view(torch.uint8), 0).view(a.dtype)
        wz = torch.where(keep[None, :], wq.view(torch.uint8), 0).view(wq.dtype)
        y = torch._scaled_mm(az, wz.t(), sa_bl, sb_bl, out_dtype=torch.float32)
        store[f"{g}/y/{t1}_{t2}"] = bits(torch, y[:16, :16])
        names.update(
            kernel_names(
                torch, lambda az=az, wz=wz: torch._scaled_mm(az, wz.t(), sa_bl, sb_bl, out_dtype=torch.float32)
            )
        )
    meta.setdefault("probes", {})[g] = sorted(names)


def kernel_names(torch, fn):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as p:
        fn()
        torch.cuda.synchronize()
    skip = ("elementwise", "Memset", "FillFunctor", "copy_kernel")
    return [e.name[:160] for e in p.events() if e.device_type.name == "CUDA" and not any(s in e.name for s in skip)]


def bits(torch, y):
    """Raw bits of a bf16 (uint16) or fp32 (uint32) tensor, as numpy."""
    if y.dtype == torch.bfloat16:
        return y.view(torch.int16).cpu().numpy().view(np.uint16)
    return y.float().view(torch.int32).cpu().numpy().view(np.uint32)


def capture(out_dir: str, quick: bool = False) -> dict:
    import torch

    dev = "cuda"
    meta: dict = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(),
        "capability": list(torch.cuda.get_device_capability()),
        "allow_bf16_reduced_precision_reduction": bool(
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
        ),
        "sets": {},
        "refused": [],
    }
    try:
        import ctypes

        h = ctypes.CDLL("libcublasLt.so")
        h.cublasLtGetVersion.restype = ctypes.c_size_t
        meta["cublasLt"] = int(h.cublasLtGetVersion())
    except Exception as e:  # pragma: no cover - depends on the machine
        meta["cublasLt"] = repr(e)
    try:
        import triton

        meta["triton"] = triton.__version__
        tri = triton_gemm()
    except Exception as e:  # pragma: no cover
        meta["triton"] = repr(e)
        tri = None
    deep = None
    try:
        from . import gemm as G

        G._module()
        deep = G
    except Exception as e:  # pragma: no cover
        meta["deepseek_kernel"] = repr(e)
    store: dict[str, np.ndarray] = {}
    for si, (sname, M, N, K, dist, pairs, nr, nc, with_bf16) in enumerate(SETS):
        if quick and sname not in QUICK:
            continue
        t0 = time.time()
        rng = np.random.default_rng(1000 + si)
        x, w = float_inputs(M, N, K, "normal" if dist in ("special", "saturate") else dist, 2000 + si)
        rows = np.arange(M) if nr >= M else np.sort(np.r_[rng.choice(M - 1, nr - 1, replace=False), M - 1])
        cols = np.arange(N) if nc >= N else np.sort(np.r_[rng.choice(N - 1, nc - 1, replace=False), N - 1])
        xt, wt = torch.from_numpy(x).to(dev), torch.from_numpy(w).to(dev)
        info = {"M": M, "N": N, "K": K, "dist": dist, "kernels": {}}
        for fa, fb in pairs:
            pname = f"{sname}_{fa}x{fb}"
            key = lambda k: f"{pname}/{k}"  # noqa: E731
            a, sa_blk = quantize_rows(torch, xt, fa, rng)
            wq, sw_blk = quantize_rows(torch, wt, fb, rng)
            if dist in ("special", "saturate"):
                a = special_codes(torch, a, fa, rng, dist)
                wq = special_codes(torch, wq, fb, rng, dist)
            nkb, nnb = -(-K // TILE), -(-N // TILE)
            # scales: tensorwise = the mean block scale; rowwise = the max block scale of the row;
            # weight blocks: the max of the 128 rows' scales (any positive fp32 values do: they are inputs)
            sa_t = sa_blk.mean().reshape(())
            sb_t = sw_blk.mean().reshape(())
            sa_r = sa_blk.amax(1, keepdim=True).contiguous()
            sb_r = sw_blk.amax(1).reshape(1, N).contiguous()
            pad_n = nnb * TILE - N
            swp = torch.nn.functional.pad(sw_blk, (0, 0, 0, pad_n), value=0.0)
            sb_b = swp.reshape(nnb, TILE, nkb).amax(1).t().contiguous()  # (nkb, nnb)
            sa_b = sa_blk  # (M, nkb)
            if dist == "saturate":
                sa_t = torch.tensor(3.0e30, device=dev)
                sb_t = torch.tensor(7.0e10, device=dev)
                sa_r = sa_r * 1e30
                sb_r = sb_r * 1e10
                sa_b = sa_b * 1e30
                sb_b = sb_b * 1e10
            if dist == "special":  # one NaN row scale and one NaN block scale
                sa_r = sa_r.clone()
                sa_r[3, 0] = float("nan")
                sa_b = sa_b.clone()
                sa_b[5, min(1, nkb - 1)] = float("nan")
            store[key("a")] = a.view(torch.uint8)[torch.from_numpy(rows).to(dev)].cpu().numpy()
            store[key("w")] = wq.view(torch.uint8)[torch.from_numpy(cols).to(dev)].cpu().numpy()
            store[key("rows")] = rows.astype(np.int32)
            store[key("cols")] = cols.astype(np.int32)
            store[key("sa_tensor")] = sa_t.cpu().numpy().astype(np.float32)
            store[key("sb_tensor")] = sb_t.cpu().numpy().astype(np.float32)
            store[key("sa_row")] = sa_r.cpu().numpy()[rows]
            store[key("sb_row")] = sb_r.cpu().numpy()[:, cols]
            store[key("sa_block")] = sa_b.cpu().numpy()[rows]
            store[key("sb_block")] = sb_b.cpu().numpy()
            rsel = torch.from_numpy(rows).to(dev)
            csel = torch.from_numpy(cols).to(dev)
            b = wq.t()
            kinfo = info["kernels"].setdefault(pname, {})

            def record(cfg, fn, kinfo=kinfo, key=key, rsel=rsel, csel=csel, pname=pname):
                try:
                    y = fn()
                    torch.cuda.synchronize()
                except Exception as e:
                    meta["refused"].append([pname, cfg, str(e).splitlines()[0][:240]])
                    return
                store[key("y/" + cfg)] = bits(torch, y[rsel][:, csel])
                try:
                    kinfo[cfg] = kernel_names(torch, fn)
                except Exception:
                    kinfo[cfg] = ["?"]

            sa_bl = sa_b.t().contiguous().t()  # outer-dim-major (M, nkb)
            sb_bl = padded_block_scales(torch, sb_b)
            try:
                torch._scaled_mm(a, b, sa_bl, sb_bl, out_dtype=torch.float32)
            except Exception as e:  # torch refuses the padded view: fall back to the plain tensor
                meta["refused"].append([pname, "padded block scales", str(e).splitlines()[0][:240]])
                sb_bl = sb_b.t().contiguous().t()
            if nkb % 4:  # what the unpadded (nkb, nnb) tensor, which torch also accepts, gives
                unp = sb_b.t().contiguous().t()
                try:
                    y0 = torch._scaled_mm(a, b, sa_bl, sb_bl, out_dtype=torch.float32)
                    y1 = torch._scaled_mm(a, b, sa_bl, unp, out_dtype=torch.float32)
                    info.setdefault("unpadded_block_scales_differ", {})[pname] = float(
                        (y0.view(torch.int32) != y1.view(torch.int32)).float().mean()
                    )
                except Exception as e:
                    info.setdefault("unpadded_block_scales_differ", {})[pname] = repr(e)[:200]
            for od, oname in ((torch.bfloat16, "bf16"), (torch.float32, "f32")):
                for fast in (False, True):
                    acc = "fast" if fast else "slow"
                    for kind, s_a, s_b in (("tensor", sa_t, sb_t), ("row", sa_r, sb_r), ("block", sa_bl, sb_bl)):
                        record(
                            f"cublaslt_{kind}_{acc}_{oname}",
                            lambda s_a=s_a, s_b=s_b, od=od, fast=fast: torch._scaled_mm(
                                a, b, s_a, s_b, out_dtype=od, use_fast_accum=fast
                            ),
                        )
            if tri is not None:
                sa_vec = sa_r.reshape(M).contiguous()
                sb_vec = sb_r.reshape(N).contiguous()
                for BK in (64, 128):
                    for imp in (0, 32, 64, 128):
                        if imp > BK:
                            continue
                        for ob in (False, True):
                            if ob and not (BK == 128 and imp == 0):
                                continue
                            record(
                                f"triton_bk{BK}_imp{imp}_{'bf16' if ob else 'f32'}",
                                lambda BK=BK, imp=imp, ob=ob: tri(torch, a, wq, sa_vec, sb_vec, BK, imp, ob),
                            )
            if deep is not None and fa == "e4m3" and fb == "e4m3" and M * N * K <= 4096**3:
                record("deepseek_kernel_bf16", lambda: _deepseek(torch, deep, a, wq, sa_b, sb_b, M, N, K, bf16=True))
                record("deepseek_kernel_f32", lambda: _deepseek(torch, deep, a, wq, sa_b, sb_b, M, N, K, bf16=False))
            if with_bf16 and (fa, fb) == pairs[0]:
                xb, wb = xt.to(torch.bfloat16), wt.to(torch.bfloat16)
                store[f"{sname}/abf"] = xb.view(torch.int16)[rsel].cpu().numpy().view(np.uint16)
                store[f"{sname}/wbf"] = wb.view(torch.int16)[csel].cpu().numpy().view(np.uint16)
                k2 = info["kernels"].setdefault(sname + "_bf16", {})

                def rec_bf(cfg, fn, k2=k2, sname=sname, rsel=rsel, csel=csel):
                    try:
                        y = fn()
                        torch.cuda.synchronize()
                    except Exception as e:
                        meta["refused"].append([sname, cfg, str(e).splitlines()[0][:240]])
                        return
                    store[f"{sname}/y/{cfg}"] = bits(torch, y[rsel][:, csel])
                    k2[cfg] = kernel_names(torch, fn)

                rec_bf("torch_bf16_matmul", lambda xb=xb, wb=wb: xb @ wb.t())
                rec_bf("torch_bf16_mm_f32", lambda xb=xb, wb=wb: torch.mm(xb, wb.t(), out_dtype=torch.float32))
        info["seconds"] = round(time.time() - t0, 2)
        meta["sets"][sname] = info
        print(sname, info["seconds"], "s", flush=True)
    if not quick:
        for M, N, K in ((64, 64, 16384), (128, 256, 8192)):
            nkb = K // TILE
            pairs = [(0, t) for t in range(1, nkb)] + [(t, t + 1) for t in range(1, nkb - 1)]
            split_probe(torch, store, meta, M, N, K, 77, pairs)
    os.makedirs(out_dir, exist_ok=True)
    np.savez_compressed(os.path.join(out_dir, "libraries_sm90.npz"), **store)
    with open(os.path.join(out_dir, "libraries_sm90.json"), "w") as f:
        json.dump(meta, f, indent=1)
    return meta


def _deepseek(torch, G, a, wq, sa_b, sb_b, M, N, K, bf16):
    """The project's DeepSeek-V3 kernel (gpu/kernels/gemm.cu) on the same codes and scales."""
    Mp, Np, Kp = -(-M // 64) * 64, -(-N // 32) * 32, -(-K // TILE) * TILE
    A = np.zeros((Mp, Kp), np.uint8)
    A[:M, :K] = a.view(torch.uint8).cpu().numpy()
    Bt = np.zeros((Np, Kp), np.uint8)
    Bt[:N, :K] = wq.view(torch.uint8).cpu().numpy()
    nkb = Kp // TILE
    sa = np.ones((Mp, nkb), np.float32)
    sa[:M] = sa_b.cpu().numpy()
    sbe = np.ones((nkb, Np), np.float32)
    sbe[:, :N] = np.repeat(sb_b.cpu().numpy(), TILE, axis=1)[:, :N]
    D, Db, _ = G.launch((A, Bt, sa, sbe, TILE, 4, (M, N, Mp, Np, Kp)), reps=0)
    y = Db if bf16 else D
    t = torch.from_numpy(np.ascontiguousarray(y)).to(a.device)
    return t.to(torch.bfloat16) if bf16 else t


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpu.capture_libraries", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--quick", action="store_true", help="only the small input sets")
    a = p.parse_args(argv)
    try:
        meta = capture(a.out, a.quick)
    except Exception:
        traceback.print_exc()
        return 1
    print(json.dumps({k: v for k, v in meta.items() if k != "sets"}, indent=1)[:4000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
