"""``fp8sim verify``: score the tensor-core emulator against hardware captures."""

from __future__ import annotations

import zipfile

from .common import command, emit_json

__all__: list[str] = []

#: the longest reason the text output prints on a file's line (the JSON output keeps all of it)
REASON_CHARS = 240

#: the skip reason of the library captures (tests/data/libraries_sm90.npz)
LIBRARIES = (
    "not a tensor-core capture: library GEMM captures of gpu.capture_libraries (cuBLASLt, Triton and "
    "DeepSeek-V3 kernels on whole FP8 GEMMs); tests/test_libraries.py reproduces them "
    "(python3 -m pytest tests/test_libraries.py)"
)


def _is_library_capture(path: str) -> bool:
    """Whether ``path`` is an archive of ``python -m gpu.capture_libraries``: no ``meta``, members named
    ``<set>/<array>`` with the kernels' outputs under ``<set>/y/<kernel>`` (read from the zip's
    directory only; anything unreadable is left to the capture reader)."""
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
    except (OSError, zipfile.BadZipFile, ValueError):
        return False
    return "meta.npy" not in names and bool(names) and all("/" in n for n in names) and any("/y/" in n for n in names)


def _one_line(text: str) -> str:
    """``text`` on one line of at most :data:`REASON_CHARS` characters (its length said when cut)."""
    text = " ".join(text.split())
    if len(text) <= REASON_CHARS:
        return text
    return text[: REASON_CHARS - 40].rstrip() + f" ... ({len(text)} characters; --json has all)"


# --------------------------------------------------------------- verify
@command(
    "verify",
    "score the tensor-core emulator against hardware capture files (.npz)",
    "examples:\n  fp8sim verify tests/data/wgmma_e4m3xe4m3_normal.npz\n"
    "  fp8sim verify tests/data/*.npz --json\n"
    "  fp8sim verify capture.npz --model mma.sync   # score another model\n"
    "Every output is compared as a float32 bit pattern, NaN sign and payload included.\n"
    "Scores single-instruction captures, chained tile loops and probe captures; other\n"
    "hardware captures (the GEMM oracle's gemm_sm90.npz, the cvt sweep, the library\n"
    "captures libraries_sm90.npz) are listed as skipped with the command that checks\n"
    "them.  A summary table ends the output.\n"
    "Exit code 0 when every scored output matches bit for bit (and at least one was\n"
    "scored), 1 when any output differs or any file cannot be read or scored (each such\n"
    "file is named with the reason), 2 for bad usage such as an unknown --model.",
)
def _verify(args) -> int:
    from .. import tensorcore

    model = None
    if args.model:  # unknown name: exit 2; without --arch, the preset on each capture's own arch
        model = tensorcore.get_model(args.model, args.arch) if args.arch else args.model
        if args.arch is None and args.model.strip().lower() not in {i for _, i in tensorcore.model_names()}:
            tensorcore.get_model(args.model)  # raises UnknownNameError with the close matches
    rows = []
    for path in args.files:
        row: dict = {"file": path, "status": "error", "kind": None, "instruction": None, "formats": None}
        row.update(n=0, mismatches=0, match_rate=None, first_mismatches=[], reason=None)
        try:
            if _is_library_capture(path):
                raise tensorcore.NotTensorCoreCaptureError(f"{path}: {LIBRARIES}", "libraries")
            r = tensorcore.verify_capture(path, model=model)
        except tensorcore.NotTensorCoreCaptureError as e:
            row.update(status="skipped", kind=e.kind, reason=str(e).removeprefix(f"{path}: "))
        except Exception as e:  # noqa: BLE001 - one bad file must not hide the others' scores
            msg = str(e) if isinstance(e, (ValueError, TypeError, OSError)) else f"{type(e).__name__}: {e}"
            row["reason"] = msg.removeprefix(f"{path}: ")
        else:
            meta = r["meta"]
            fmts = meta.get("formats")
            row.update(
                status="bit-exact" if r["mismatches"] == 0 else "mismatch",
                kind=r["kind"],
                instruction=(model if isinstance(model, str) else model.name)
                if model is not None
                else meta.get("instruction"),
                formats=", ".join(fmts) if isinstance(fmts, list) else f"{meta.get('a_format')}x{meta.get('b_format')}",
                n=r["n"],
                mismatches=r["mismatches"],
                match_rate=r["match_rate"],
                first_mismatches=r["first_mismatches"],
            )
        rows.append(row)
        if not args.json:
            _verify_print_row(row)
    count = {s: sum(r["status"] == s for r in rows) for s in ("bit-exact", "mismatch", "skipped", "error")}
    n = sum(r["n"] for r in rows)
    bad = sum(r["mismatches"] for r in rows)
    ok = bad == 0 and count["error"] == 0 and count["mismatch"] == 0 and n > 0
    if args.json:
        emit_json({"files": rows, "n": n, "mismatches": bad, **count, "ok": ok})
        return 0 if ok else 1
    print()
    print("summary:")
    width = max(len(r["file"]) for r in rows)
    for r in rows:
        if r["status"] in ("bit-exact", "mismatch"):
            score = f"{r['n'] - r['mismatches']}/{r['n']}"
        else:
            score = f"({r['kind']} capture)" if r["status"] == "skipped" else "(see above)"
        print(f"  {r['file']:<{width}}  {r['status']:<9}  {score}")
    print(
        f"total: {n - bad}/{n} outputs bit-exact in {count['bit-exact'] + count['mismatch']} files; "
        f"{count['mismatch']} with mismatches, {count['skipped']} skipped, {count['error']} not readable or not scored"
    )
    if n == 0:
        print("no outputs were scored: nothing is verified")
    return 0 if ok else 1


def _verify_print_row(r: dict) -> None:
    if r["status"] in ("bit-exact", "mismatch"):
        print(
            f"{r['file']}: {r['instruction']} {r['formats']}: {r['n'] - r['mismatches']}/{r['n']} "
            f"bit-exact ({100 * r['match_rate']:.4f} %)"
        )
        for m in r["first_mismatches"]:
            print(f"    {m['output']}{list(m['index'])}: hardware {m['hardware_bits']} model {m['model_bits']}")
    else:
        print(f"{r['file']}: {'skipped' if r['status'] == 'skipped' else 'ERROR'}: {_one_line(r['reason'] or '')}")


@_verify.arguments
def _verify_args(p):
    p.add_argument(
        "files", nargs="+", help="capture files written by python -m gpu.capture (or gpu.characterize --save)"
    )
    p.add_argument("--model", default=None, help="accumulator model to score (default: the capture's instruction)")
    p.add_argument("--arch", default=None, help="architecture of the --model preset (default: each capture's own arch)")
    p.add_argument("--json", action="store_true", help='machine-readable output (strict JSON: NaN written as "nan")')
