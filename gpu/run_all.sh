#!/usr/bin/env bash
# Run the whole hardware oracle on one GPU: build, SASS dump, probes, captures,
# cvt sweep, verification.  Usage: bash gpu/run_all.sh OUTDIR
# (run from the repository root; needs nvcc, cuobjdump, CuPy, numba).
set -u
OUT=${1:-oracle_out}
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:-.}:.
export PYTHONUNBUFFERED=1
{
  date -u; nvidia-smi; nvcc --version
  python3 -c "import cupy, numba, numpy; print('cupy', cupy.__version__, 'numba', numba.__version__, 'numpy', numpy.__version__)"
} > "$OUT/env.log" 2>&1
python3 -c "import gpu.launch as K; print(K.build(force=True))" > "$OUT/build.log" 2>&1
cuobjdump -sass gpu/kernels/build/tc_sm90a.cubin > "$OUT/sass.txt" 2>&1
python3 - > "$OUT/sanity.log" 2>&1 <<'PY'
import json, numpy as np
import gpu.launch as K
print(json.dumps(K.device_info()))
try:
    print("wgmma descriptor (LBO, SBO):", K.descriptor_fields())
except Exception as e:
    print("wgmma sanity FAILED:", repr(e))
from gpu import characterize as ch
for ins in ("wgmma", "mma.sync", "wgmma.f16"):
    for fa, fb in ch.PAIRS:
        try:
            r = ch.run_probes(ch.hardware_runner(ins), ins, [(fa, fb)], ["probe_sanity"])[0]
            print(ins, fa, fb, r.findings, r.table)
        except Exception as e:
            print(ins, fa, fb, "FAILED", repr(e))
PY
for ins in wgmma mma.sync wgmma.f16; do
  timeout 300 python3 -m gpu.characterize --instruction $ins --no-refine \
     --save "$OUT/probes_$ins.npz" --json "$OUT/fit_$ins.json" > "$OUT/characterize_$ins.log" 2>&1
done
timeout 300 python3 -m gpu.capture --out "$OUT/captures" > "$OUT/capture.log" 2>&1
timeout 200 python3 -m gpu.capture_wide --out "$OUT/captures_wide" > "$OUT/capture_wide.log" 2>&1
timeout 200 python3 -m gpu.cvt_sweep --out "$OUT/cvt_sm90.npz" > "$OUT/cvt.log" 2>&1
timeout 200 python3 -m gpu.verify "$OUT"/captures/*.npz > "$OUT/verify.log" 2>&1
date -u >> "$OUT/env.log"
