"""Score fp8sim's tensor-core model against hardware captures.

    python -m gpu.verify tests/data/wgmma_e4m3xe4m3_normal.npz [more.npz ...]
    python -m gpu.verify --instruction exact FILE     # score another model

The same scoring and output as ``fp8sim verify`` (:func:`fp8sim.tensorcore.verify_capture`):
every output is compared as a float32 bit pattern, NaN sign and payload included; each file
gets its score, or the reason it was skipped (another kind of capture) or could not be
scored, and a summary table ends the output.  Exit status 0 when every scored output
matches and at least one was scored, 1 when any output differs or any file cannot be read
or scored, 2 for an unknown ``--instruction``.
"""

from __future__ import annotations

import argparse
import sys

from fp8sim import cli


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpu.verify", description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--instruction", help="model to score instead of the capture's own instruction")
    ap.add_argument("--arch", default="sm90", help="architecture of the --instruction preset (default sm90)")
    ap.add_argument("--json", action="store_true", help="print one strict JSON document")
    args = ap.parse_args(argv)
    forward = ["verify", *args.files, "--arch", args.arch]
    if args.instruction:
        forward += ["--model", args.instruction]
    if args.json:
        forward.append("--json")
    return cli.main(forward)


if __name__ == "__main__":
    sys.exit(main())
