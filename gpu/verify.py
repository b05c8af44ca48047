"""Score fp8sim's tensor-core model against hardware captures.

    python -m gpu.verify tests/data/wgmma_e4m3xe4m3_normal.npz [more.npz ...]
    python -m gpu.verify --instruction exact FILE     # score another model

Prints the match rate (bit-exact, NaN matches NaN) and the first mismatches
of each file; exits with status 1 if any file is not matched 100%.  The
scoring itself is :func:`fp8sim.tensorcore.verify_capture`.
"""

from __future__ import annotations

import argparse
import json
import sys

from fp8sim import tensorcore as tc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpu.verify", description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--instruction", help="model to score instead of the capture's own instruction")
    ap.add_argument("--arch", default="sm90")
    ap.add_argument("--json", action="store_true", help="print one JSON line per file")
    args = ap.parse_args(argv)
    model = tc.get_model(args.instruction, args.arch) if args.instruction else None
    worst = 1.0
    for f in args.files:
        try:
            r = tc.verify_capture(f, model)
        except ValueError as e:
            print(f"{f}: skipped ({e})")
            continue
        worst = min(worst, r["match_rate"])
        if args.json:
            print(json.dumps({"file": f, **{k: r[k] for k in ("match_rate", "n", "mismatches", "first_mismatches")}}))
            continue
        m = r["meta"]
        print(
            f"{f}: {m.get('instruction')} {m.get('a_format')}x{m.get('b_format')} {m.get('family')}: "
            f"{r['n'] - r['mismatches']}/{r['n']} bit-exact ({100 * r['match_rate']:.4f}%)"
        )
        for mm in r["first_mismatches"]:
            print(
                f"    {mm['output']}{list(mm['index'])}: hardware {mm['hardware']!r} ({mm['hardware_bits']}) "
                f"model {mm['model']!r} ({mm['model_bits']})"
            )
    return 0 if worst == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
