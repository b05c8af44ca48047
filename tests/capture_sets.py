"""Loading the library captures of ``python -m gpu.capture_libraries`` (tests/data/libraries_sm90.npz)
and running each captured configuration through fp8sim's engine.

Each capture key ``<set>_<fa>x<fb>/y/<config>`` holds the library's output on the sampled rows and
columns of a full ``(M, N, K)`` problem; :func:`emulate` recomputes the same outputs from the
stored codes and scales with the preset of :data:`CONFIG_RECIPES` and the split-K count that
:data:`SPLIT_K` records for that shape (the library's own choice: docs/libraries.md).
"""

from __future__ import annotations

import json
import os
import re

import numpy as np

import fp8sim
from fp8sim.gemms.engine import cast_output, run_codes
from fp8sim.gemms.operands import padded_inputs

DATA = os.path.join(os.path.dirname(__file__), "data")
NPZ = os.path.join(DATA, "libraries_sm90.npz")
META = os.path.join(DATA, "libraries_sm90.json")

#: split-K slices cuBLASLt chose, per input set, for the kernels whose names say "splitK" in
#: libraries_sm90.json (tensorwise and blockwise; its rowwise kernels never split here).  Fitted
#: to the captures (as the accumulator's 13 bits are): the count and the slice boundaries were
#: searched over 1..16 slices and granules of 128..1024 K, and the crafted two-tile probes
#: (``probe*`` groups) show the blockwise slice boundaries directly (every 24 tiles = 3072 K).
SPLIT_K: dict[str, int] = {
    "skinny64_normal": 6,
    "skinny128x256_uniform": 3,
    "skinny256x128_outlier": 6,
    "skinny32x2048_normal": 2,
}


def load():
    z = np.load(NPZ)
    meta = json.load(open(META))
    groups: dict[str, dict] = {}
    for k in z.files:
        g, rest = k.split("/", 1)
        groups.setdefault(g, {})[rest] = z[k]
    return groups, meta


def pair_of(group: str) -> tuple[str, str] | None:
    m = re.search(r"_(e[45]m[23])x(e[45]m[23])$", group)
    return (m.group(1), m.group(2)) if m else None


def config_recipe(config: str) -> tuple[fp8sim.Recipe, str]:
    """(recipe, scale kind) of a captured configuration name."""
    out = "bf16" if config.endswith("_bf16") else "fp32"
    if config.startswith("cublaslt_"):
        _, kind, acc, _o = config.split("_")
        name = {"tensor": "cublaslt-tensor", "row": "cublaslt-row", "block": "cublaslt-block"}[kind]
        if acc == "fast":
            name += "-fast"
        return fp8sim.recipe(name).with_(output_format=out), kind
    if config.startswith("triton_"):
        imp = int(re.search(r"_imp(\d+)_", config).group(1))
        name = "triton" if imp == 0 else f"triton-imprecise-{imp}"
        return fp8sim.recipe(name).with_(output_format=out), "row"
    if config.startswith("deepseek_kernel"):
        return fp8sim.recipe("deepseek-v3").with_(output_format=out), "block"
    raise KeyError(config)


def operands(d: dict, kind: str):
    """(A (m, K), B (K, n), sa, sb, kscale) of the sampled rows / columns for a scale kind."""
    A = d["a"]
    B = np.ascontiguousarray(d["w"].T)
    if kind == "tensor":
        m, n = A.shape[0], B.shape[1]
        return A, B, np.full((m, 1), d["sa_tensor"], np.float32), np.full((1, n), d["sb_tensor"], np.float32), None
    if kind == "row":
        return A, B, d["sa_row"].astype(np.float32), d["sb_row"].astype(np.float32), None
    sbe = d["sb_block"].astype(np.float32)[:, d["cols"] // 128]  # (nkb, n): the sampled columns' blocks
    return A, B, d["sa_block"].astype(np.float32), np.ascontiguousarray(sbe), 128


def set_of(group: str) -> str:
    return group.rsplit("_", 1)[0]


def library_recipe(group: str, config: str, meta: dict) -> tuple[fp8sim.Recipe, str]:
    """The recipe that models a captured configuration: its preset, with the split-K count of
    :data:`SPLIT_K` where the library launched a split-K kernel."""
    r, kind = config_recipe(config)
    names = meta["sets"][set_of(group)]["kernels"][group].get(config, [])
    if any("splitK" in n for n in names):
        r = r.with_(split_k=SPLIT_K[set_of(group)])
    return r, kind


def emulate(d: dict, group: str, config: str, recipe=None, backend: str = "cpu") -> np.ndarray:
    """fp8sim's output for a captured configuration (float32 values of the output format)."""
    r, kind = config_recipe(config)
    if recipe is not None:
        r = recipe
    fa, fb = pair_of(group)
    A, B, sa, sb, kscale = operands(d, kind)
    Ap, Bp, sa, sb, ks = padded_inputs(A, B, sa, sb, kscale, r)
    return cast_output(run_codes(Ap, Bp, sa, sb, ks, fa, fb, r, K=A.shape[1], backend=backend), r.output_format)


def captured(d: dict, config: str) -> np.ndarray:
    y = d["y/" + config]
    if y.dtype == np.uint16:
        return (y.astype(np.uint32) << 16).view(np.float32)
    return y.view(np.float32)


def bit_match(y: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Elementwise bit equality of float32 arrays (any NaN equals any NaN: the libraries' NaN
    payloads are compared separately)."""
    y = np.asarray(y, np.float32)
    ref = np.asarray(ref, np.float32)
    return (y.view(np.uint32) == ref.view(np.uint32)) | (np.isnan(y) & np.isnan(ref))
