"""Scoring the emulator against hardware captures, bit for bit.

A capture is an ``.npz`` archive written on the GPU by ``python -m gpu.capture`` (single
instructions, chained tile loops) or ``python -m gpu.characterize --save`` (probes);
:func:`verify_capture` replays its inputs through :func:`~fp8sim.tensorcore.mma` /
:func:`~fp8sim.tensorcore.matmul` and compares every output's float32 bit pattern.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .._fpenv import ieee_defaults
from .api import matmul, mma
from .model import K_INSTR, AccumulatorModel
from .registry import PRESETS, get_model

__all__ = [
    "verify_capture",
    "load_capture",
    "capture_kind",
    "CaptureError",
    "NotTensorCoreCaptureError",
    "bits_equal",
    "bits_identical",
]


class CaptureError(ValueError):
    """A file that cannot be scored: unreadable, not an .npz archive, or a capture with
    missing keys, wrong shapes or dtypes, or no outputs (the message says which)."""


class NotTensorCoreCaptureError(CaptureError):
    """A readable hardware capture of another kind (the GEMM oracle's ``gemm_sm90.npz``, the
    conversion sweep ``cvt_sm90.npz``): :attr:`kind` names it, the message says how it is checked."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def _where(path_or_npz) -> str:
    return "capture" if isinstance(path_or_npz, dict) else str(path_or_npz)


def load_capture(path_or_npz) -> dict:
    """Load a capture (.npz written by ``python -m gpu.capture``, ``gpu.characterize --save``,
    ``gpu.gemm`` or ``gpu.cvt_sweep``) into a dict, ``meta`` parsed from its JSON.

    A dict is returned as is.  A missing file raises ``FileNotFoundError``; a file that is not an
    .npz archive, holds pickled objects or has no readable ``meta`` raises :class:`CaptureError`.
    """
    import json
    import os
    import zipfile

    if isinstance(path_or_npz, dict):
        return path_or_npz
    where = str(path_or_npz)
    if isinstance(path_or_npz, (str, os.PathLike)):
        if not os.path.exists(path_or_npz):
            raise FileNotFoundError(f"no such file: {where}")
        if os.path.isdir(path_or_npz):
            raise CaptureError(f"{where}: is a directory, not an .npz capture")
        try:
            with open(path_or_npz, "rb") as fh:
                head = fh.read(6)
        except OSError as e:
            raise CaptureError(f"{where}: cannot be read ({e})") from None
        if head[:6] == b"\x93NUMPY":
            raise CaptureError(f"{where}: not an .npz capture (a single .npy array; captures are .npz archives)")
        if head[:4] not in (b"PK\x03\x04", b"PK\x05\x06"):
            what = "an empty file" if not head else f"not a zip archive: it starts with {head!r}"
            raise CaptureError(f"{where}: not an .npz capture ({what})")
    try:
        z = np.load(path_or_npz, allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise CaptureError(f"{where}: not an .npz capture (numpy cannot read it: {e})") from None
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise CaptureError(f"{where}: not an .npz capture (a single .npy array of shape {np.shape(z)})")
    try:
        with z:
            d: dict[str, Any] = {k: z[k] for k in z.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, KeyError) as e:
        raise CaptureError(f"{where}: damaged .npz archive ({e})") from None
    meta = d.get("meta")
    if meta is None:
        d["meta"] = {}
        return d
    if meta.ndim != 0 or meta.dtype.kind not in "US":
        raise CaptureError(
            f"{where}: 'meta' must be a JSON string, got an array of dtype {meta.dtype}, shape {meta.shape}"
        )
    try:
        d["meta"] = json.loads(str(meta))
    except ValueError as e:
        raise CaptureError(f"{where}: 'meta' is not valid JSON ({e})") from None
    return d


def capture_kind(cap: dict) -> str:
    """The kind of a loaded capture: ``"mma"`` (single instructions, ``gpu.capture``),
    ``"chain"`` (K-long tile loops), ``"probes"`` (``gpu.characterize --save``), ``"gemm"``
    (``gpu.gemm``), ``"cvt"`` (``gpu.cvt_sweep``) or ``"unknown"``."""
    meta = cap.get("meta")
    if isinstance(meta, dict):
        if "e4m3_starts" in cap or "e5m2_starts" in cap or "instructions" in meta:
            return "cvt"
        kind = meta.get("kind", "mma")
        if kind in ("mma", "chain") and ("a_format" in meta or "d" in cap):
            return str(kind)
        return "unknown"
    if isinstance(meta, list) and meta and all(isinstance(m, dict) for m in meta):
        if "A0" in cap or all("labels" in m for m in meta):
            return "probes"
        if any(k.endswith("/d") for k in cap) or all("checksum" in m for m in meta):
            return "gemm"
    return "unknown"


_OTHER_KINDS = {
    "gemm": "GEMM capture of gpu.gemm (sampled rows of whole FP8 GEMMs); tests/test_gemm.py "
    "regenerates its operands and reproduces it (python3 -m pytest tests/test_gemm.py -k gpu_gemm)",
    "cvt": "conversion sweep of gpu.cvt_sweep (cvt.rn.satfinite over all 2**32 inputs); check it with "
    "PYTHONPATH=. python -m gpu.cvt_sweep --check FILE",
}


def bits_equal(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Equal float32 bit patterns, any NaN matching any NaN (used by the probe fitter of
    ``gpu.characterize``, where the NaN pattern is not one of the fitted parameters).
    Verification uses :func:`bits_identical`."""
    x = np.asarray(x, np.float32)
    y = np.asarray(y, np.float32)
    eq = x.view(np.uint32) == y.view(np.uint32)
    return eq | (np.isnan(x) & np.isnan(y))


def bits_identical(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Identical float32 bit patterns, NaN sign and payload included (both must be float32)."""
    return x.view(np.uint32) == y.view(np.uint32)


def _need(cap: dict, key: str, where: str, dtype, ndim: int, what: str) -> np.ndarray:
    if key not in cap:
        raise CaptureError(f"{where}: capture has no {key!r} ({what})")
    x = cap[key]
    if not isinstance(x, np.ndarray) or x.dtype != dtype:
        got = x.dtype if isinstance(x, np.ndarray) else type(x).__name__
        hint = " (hardware outputs are compared bit for bit and must be stored as float32)" if key[:1] in "dD" else ""
        raise CaptureError(f"{where}: {key!r} must be {np.dtype(dtype).name} ({what}), got {got}{hint}")
    if x.ndim != ndim:
        raise CaptureError(f"{where}: {key!r} must have {ndim} dimensions ({what}), got shape {x.shape}")
    return x


def _meta_str(meta: dict, key: str, where: str, default: str | None = None) -> str:
    v = meta.get(key, default)
    if not isinstance(v, str):
        raise CaptureError(f"{where}: meta[{key!r}] must be a string, got {v!r}")
    return v


@ieee_defaults
def verify_capture(path_or_npz, model=None, *, max_mismatches: int = 5) -> dict:
    """Score the emulator against a hardware capture, bit for bit.

    Every output is compared as a float32 bit pattern, NaN included: a NaN must have the
    hardware's sign and payload (the H200 writes 0x7fffffff, 0x7fffe000 for the fp16
    accumulator), so any change of a stored output is detected.  Scores single-instruction
    captures (``gpu.capture``), chained tile loops (``kind: "chain"``) and probe captures
    (``gpu.characterize --save``).  ``model`` (a name or an :class:`AccumulatorModel`) replaces
    the capture's own instruction.

    Returns a dict with ``match_rate``, ``n``, ``mismatches`` (count), ``outputs`` (per stored
    output), ``first_mismatches`` (list of dicts), ``kind`` and the capture's metadata.

    Raises :class:`NotTensorCoreCaptureError` for a GEMM or conversion capture,
    :class:`CaptureError` for a file that is not a readable capture (missing keys, wrong
    dtypes or shapes, outputs not stored as float32, no outputs at all), and ``UnknownNameError``
    for an unknown ``model``.
    """
    if isinstance(max_mismatches, (bool, np.bool_)) or not isinstance(max_mismatches, (int, np.integer)):
        raise TypeError(f"max_mismatches must be a non-negative integer, got {max_mismatches!r}")
    if max_mismatches < 0:
        raise ValueError(f"max_mismatches must be a non-negative integer, got {max_mismatches!r}")
    if model is not None and not isinstance(model, (str, AccumulatorModel)):
        raise TypeError(f"model must be None, a name or an AccumulatorModel, got {type(model).__name__}")
    where = _where(path_or_npz)
    cap = load_capture(path_or_npz)
    kind = capture_kind(cap)
    if kind in _OTHER_KINDS:
        raise NotTensorCoreCaptureError(f"{where}: not a tensor-core capture: {_OTHER_KINDS[kind]}", kind)
    if kind == "unknown":
        raise CaptureError(
            f"{where}: not a tensor-core capture (needs a, b, c, d and meta with a_format/b_format, "
            f"as python -m gpu.capture writes; keys found: {sorted(cap)})"
        )
    if isinstance(model, str):
        # a preset name: resolved on the capture's own arch (meta["arch"]) when replayed; an unknown
        # name is the caller's error, raised now
        if model.strip().lower() not in {i for _, i in PRESETS}:
            get_model(model)  # raises UnknownNameError with the close matches
        model = model.strip().lower()
    first: list[dict] = []
    results: dict[str, dict] = {}
    if kind == "probes":
        jobs, meta = _probe_jobs(cap, where, model)
    else:
        jobs, meta = _mma_jobs(cap, where, model, kind)
    total_n = total_bad = 0
    for key, run, hw in jobs:
        try:
            ref = run()
        except CaptureError:
            raise
        except (ValueError, TypeError) as e:
            raise CaptureError(f"{where}: cannot replay {key!r}: {e}") from None
        if ref.shape != hw.shape:
            raise CaptureError(
                f"{where}: {key!r} has shape {hw.shape}, but its inputs give outputs of shape {ref.shape}"
            )
        ok = bits_identical(ref, hw)
        n = int(ok.size)
        bad = int(n - np.count_nonzero(ok))
        total_n += n
        total_bad += bad
        results[key] = {"n": n, "mismatches": bad}
        if bad and len(first) < max_mismatches:
            for idx in np.argwhere(~ok)[: max_mismatches - len(first)]:
                idx = tuple(int(i) for i in idx)
                first.append(
                    {
                        "output": key,
                        "index": idx,
                        "hardware": float(hw[idx]),
                        "hardware_bits": f"0x{int(hw.view(np.uint32)[idx]):08x}",
                        "model": float(ref[idx]),
                        "model_bits": f"0x{int(ref.view(np.uint32)[idx]):08x}",
                    }
                )
    if total_n == 0:
        raise CaptureError(f"{where}: the capture has no outputs (0 batches or empty arrays): nothing to verify")
    return {
        "match_rate": (total_n - total_bad) / total_n,
        "n": total_n,
        "mismatches": total_bad,
        "outputs": results,
        "first_mismatches": first,
        "kind": kind,
        "meta": meta,
    }


def _mma_jobs(cap: dict, where: str, model: AccumulatorModel | str | None, kind: str):
    meta = cap["meta"]
    instr = model if model is not None else _meta_str(meta, "instruction", where, "wgmma")
    arch = _meta_str(meta, "arch", where, "sm90")
    fa_, fb_ = _meta_str(meta, "a_format", where), _meta_str(meta, "b_format", where)
    nd = 2 if kind == "chain" else 3
    shape = "(M, K)" if kind == "chain" else "(batches, M, 32)"
    a = _need(cap, "a", where, np.uint8, nd, f"A's FP8 codes {shape}")
    b = _need(cap, "b", where, np.uint8, nd, "B's FP8 codes " + ("(K, N)" if kind == "chain" else "(batches, 32, N)"))
    c = _need(cap, "c", where, np.float32, nd, "the accumulator input C")
    keys = sorted(k for k in cap if k == "d" or k.startswith("d_"))
    if not keys:
        raise CaptureError(f"{where}: capture has no 'd' (the hardware outputs)")
    jobs = []
    for key in keys:
        hw = _need(cap, key, where, np.float32, nd, "hardware outputs")
        if kind == "chain":
            promote = None
            if key != "d":
                tail = key[len("d_") :]
                num = tail[len("promote") :] if tail.startswith("promote") else ""
                if not num.isdigit() or int(num) <= 0 or int(num) % K_INSTR:
                    raise CaptureError(
                        f"{where}: unknown output {key!r} (chained captures hold 'd' and 'd_promote<N>', "
                        f"N a positive multiple of {K_INSTR})"
                    )
                promote = int(num)
            run = functools.partial(
                matmul, a, b, c, a_format=fa_, b_format=fb_, instruction=instr, arch=arch, promote_every=promote
            )
        else:
            if key != "d":
                raise CaptureError(f"{where}: unknown output {key!r} (single-instruction captures hold one 'd')")
            run = functools.partial(mma, a, b, c, a_format=fa_, b_format=fb_, instruction=instr, arch=arch)
        jobs.append((key, run, hw))
    return jobs, meta


def _probe_jobs(cap: dict, where: str, model: AccumulatorModel | str | None):
    meta = cap["meta"]
    jobs = []
    for i, m in enumerate(meta):
        for key in ("name", "instruction", "a_format", "b_format"):
            _meta_str(m, key, where + f" (probe {i})")
        A = _need(cap, f"A{i}", where, np.uint8, 2, "probe A codes (T, 32)")
        B = _need(cap, f"B{i}", where, np.uint8, 2, "probe B codes (T, 32)")
        C = _need(cap, f"C{i}", where, np.float32, 1, "probe accumulator inputs (T,)")
        D = _need(cap, f"D{i}", where, np.float32, 1, "probe hardware outputs (T,)")
        if not (A.shape[0] == B.shape[0] == C.shape[0] == D.shape[0]) or A.shape[1] != K_INSTR or B.shape[1] != K_INSTR:
            raise CaptureError(
                f"{where}: probe {i} ({m['name']}): shapes A {A.shape}, B {B.shape}, C {C.shape}, D {D.shape} "
                f"do not fit (T, 32), (T, 32), (T,), (T,)"
            )
        instr = model if model is not None else m["instruction"]

        def run(A=A, B=B, C=C, m=m, instr=instr):
            d = mma(
                A[:, None, :],
                B[:, :, None],
                C[:, None, None],
                a_format=m["a_format"],
                b_format=m["b_format"],
                instruction=instr,
            )
            return d[:, 0, 0]

        jobs.append((f"D{i} {m['name']} {m['a_format']}x{m['b_format']}", run, D))
    ins = sorted({m["instruction"] for m in meta})
    pairs = sorted({f"{m['a_format']}x{m['b_format']}" for m in meta})
    summary = {"kind": "probes", "instruction": ",".join(ins), "formats": pairs, "probes": len(meta)}
    return jobs, summary
