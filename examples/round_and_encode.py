"""Round and encode numbers in FP8: values, codes, modes, saturation.

python examples/round_and_encode.py
"""

import numpy as np

import fp8sim

x = np.array([0.1, 1 / 3, 300.0, -431.99999999999994, 1e6, np.nan])
print("E4M3:", fp8sim.E4M3.summary()["description"])
for mode in ["rne", "rtz", "rup", "rdn", "rto"]:
    print(f"  {mode}: {fp8sim.round(x, 'e4m3', mode)}")
print("  saturating:", fp8sim.round(x, "e4m3", saturate=True))
print("  stochastic (seed 0, 13 random bits):", fp8sim.round(x, "e4m3", "sr", seed=0, sr_bits=13))

codes = fp8sim.encode(x, "e4m3", saturate=True)
print("codes:", [f"0x{c:02x}" for c in codes])
print("decoded:", fp8sim.decode(codes, "e4m3"))
print("as ml_dtypes:", codes.view(fp8sim.E4M3.ml_dtype))

# the same codes for every format of the catalogue
for name in ["e5m2", "e4m3fnuz", "e2m1", "bf16"]:
    f = fp8sim.format(name)
    y = fp8sim.round(x[:5], f, saturate=True)
    print(f"{name:>9} (max {f.max:g}): {y}")
