"""``fp8sim identify``: which library configuration produced a GEMM output saved in a ``.npz`` file.

The file (``numpy.savez``) holds

* ``a``: ``(M, K)`` uint8 FP8 codes; ``b``: ``(K, N)`` codes, or ``(N, K)`` with ``layout="nk"``;
* ``y``: the kernel's ``(M, N)`` output as float32 (a bf16 output converted with ``.float()``);
* optional ``a_scale``, ``b_scale``: float32 scales as :func:`fp8sim.scaled_gemm` takes them;
* optional ``a_format``, ``b_format`` (default ``"e4m3"``), ``layout`` (default ``"kn"``): strings,
  stored by ``savez`` as 0-d arrays.

From a torch kernel (``y = torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, ...)``)::

    import numpy as np, torch
    c = lambda t: t.contiguous().view(torch.uint8).cpu().numpy()  # FP8 codes as uint8
    np.savez("mine.npz", a=c(a), b=c(w), layout="nk", a_scale=sa.cpu(), b_scale=sb.cpu(), y=y.float().cpu())

With blockwise scales torch's ``scale_b`` is ``(ceil(K/128), ceil(N/128))``, the blocks of ``w.t()``:
save ``b_scale=sb.t().cpu()`` with ``layout="nk"``.
"""

from __future__ import annotations

import zipfile
import zlib
from typing import Any

import numpy as np

from .common import check_in_file, command, emit_json

__all__ = ["load_identify_npz", "EXAMPLE"]

EXAMPLE = (
    "  import numpy as np, torch\n"
    "  c = lambda t: t.contiguous().view(torch.uint8).cpu().numpy()  # FP8 codes as uint8\n"
    '  np.savez("mine.npz", a=c(a), b=c(w), layout="nk", a_scale=sa.cpu(), b_scale=sb.cpu(), y=y.float().cpu())\n'
    "  (blockwise scales: b_scale=sb.t().cpu(), torch's scale_b being the blocks of w.t())\n"
)


def _member(z, path: str, key: str) -> np.ndarray:
    """The array ``key`` of the archive ``z`` (ValueError naming the file and the entry when numpy
    cannot read it: a damaged or truncated member, an object array)."""
    try:
        return z[key]
    except ValueError as e:
        if "allow_pickle" in str(e) or "pickle" in str(e).lower():
            why = "an object array (pickled Python objects); store numeric arrays and plain strings"
        else:
            why = f"damaged or truncated ({e})"
        raise ValueError(f"{path}: entry {key!r} cannot be read: {why}") from None
    except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise ValueError(f"{path}: entry {key!r} cannot be read: damaged or truncated ({e})") from None


def load_identify_npz(path: str) -> dict:
    """The keyword arguments of :func:`fp8sim.identify` stored in ``path`` (ValueError naming the
    file for a missing or malformed entry)."""
    try:
        z = np.load(path, allow_pickle=False)
    except Exception as e:  # noqa: BLE001 - any unreadable file: one message
        why = " ".join(str(e).split())
        if "pickle" in why.lower():
            why = "a .npy file holding an object array (pickled Python objects), not a .npz archive"
        raise ValueError(f"{path}: not a readable .npz file ({type(e).__name__}: {why})") from None
    if not isinstance(z, np.lib.npyio.NpzFile):
        shape = getattr(z, "shape", None)
        raise ValueError(
            f"{path}: a single .npy array (shape {shape}) renamed .npz, not a .npz archive of named arrays "
            "(save a, b, y with numpy.savez; see --help)"
        )
    with z:
        missing = [k for k in ("a", "b", "y") if k not in z.files]
        if missing:
            raise ValueError(f"{path}: missing array(s) {', '.join(missing)} (needs a, b, y; see --help)")
        unknown = sorted(set(z.files) - {"a", "b", "y", "a_scale", "b_scale", "a_format", "b_format", "layout"})
        if unknown:
            raise ValueError(f"{path}: unknown entries {', '.join(unknown)} (see --help for the format)")
        out: dict[str, Any] = {k: _member(z, path, k) for k in ("a", "b", "y")}
        for k in ("a_scale", "b_scale"):
            if k in z.files:
                out[k] = _member(z, path, k)
        for k in ("a_format", "b_format", "layout"):
            if k in z.files:
                v = _member(z, path, k)
                if v.ndim != 0 or v.dtype.kind not in "US":
                    raise ValueError(f"{path}: {k} must be a string (a 0-d array), got {v.dtype} of shape {v.shape}")
                out[k] = str(v.item() if v.dtype.kind == "U" else v.item().decode())
    return out


def _row_text(row: dict) -> str:
    keys = ["accumulator", "promote_every", "scale_at", "scale_application", "epilogue_scale", "split_k"]
    keys += ["split_granule", "split_order", "output_format"]
    full = "-" if row["match_rate"] is None else f"{100 * row['match_rate']:.3f} %"
    fields = " ".join(f"{k}={row[k]}" for k in keys if row[k] is not None)
    return f"  all {full:>9}  sample({row['sample']}) {100 * row['sample_match_rate']:7.3f} %  {fields}"


@command(
    "identify",
    "find the library configuration (a Recipe) that reproduces a GEMM output saved in a .npz file",
    "The .npz file holds a (M, K) uint8 FP8 codes, b (K, N) codes or (N, K) with layout='nk',\n"
    "y the (M, N) output as float32, and optionally a_scale, b_scale (float32, the shapes\n"
    "fp8sim.scaled_gemm takes: () tensorwise, (M, 1) / (1, N) rowwise, 1x128 / 128x128 blocks)\n"
    "and a_format, b_format ('e4m3', 'e5m2'), layout ('kn', 'nk') as strings (0-d arrays).\n"
    "Saving a torch kernel's inputs and output:\n" + EXAMPLE + "examples:\n"
    "  fp8sim identify mine.npz\n"
    "  fp8sim identify mine.npz --json\n"
    "Prints the best recipe, its match rate (outputs bit-identical, NaN equal to NaN), the top 5\n"
    "candidates and where the best one diverges.  Exit code 0 when the search ran (whatever the\n"
    "match rate), 1 when the file cannot be read or its arrays do not fit, 2 for bad usage\n"
    "(no such file).",
)
def _identify(args) -> int:
    from ..gemms.identification import identify, recipe_fields

    path = check_in_file(args.file, "FILE", (".npz",))
    kw = load_identify_npz(path)
    a, b, y = kw.pop("a"), kw.pop("b"), kw.pop("y")
    if y.dtype != np.float32:
        raise ValueError(f"{path}: y must be float32 (save a bf16 output with y.float()), got {y.dtype}")
    try:
        res = identify(a, b, y, **kw)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path}: {e}") from None
    if args.json:
        emit_json(res.to_dict(top=5))
        return 0
    print("best recipe: " + ", ".join(f"{k}={v!r}" for k, v in recipe_fields(res.recipe).items()))
    print(
        f"match rate: {100 * res.match_rate:.4f} % ({res.n_outputs - res.mismatches} of {res.n_outputs} outputs "
        f"bit-identical; {len(res.table)} candidates in {res.seconds:.1f} s)"
    )
    print("top 5 candidates (rate on all outputs, rate on the sample):")
    for row in res.table[:5]:
        print(_row_text(row))
    print(res.explain())
    return 0


@_identify.arguments
def _identify_args(p):
    p.add_argument(
        "file", help="a .npz file with a, b, y (and optionally a_scale, b_scale, a_format, b_format, layout)"
    )
    p.add_argument("--json", action="store_true", help='machine-readable output (strict JSON: NaN written as "nan")')
