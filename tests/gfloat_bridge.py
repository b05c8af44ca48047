"""Describe fp8sim formats to gfloat, an independent implementation.

Only the layout facts are passed on (widths, bias, which codes are NaN/inf);
gfloat then decodes and rounds with its own code.
"""

from gfloat import formats as GF
from gfloat.types import Domain, FormatInfo

import fp8sim

_BUILTIN = {
    "e4m3": GF.format_info_ocp_e4m3,
    "e5m2": GF.format_info_ocp_e5m2,
    "e8m0": GF.format_info_ocp_e8m0,
    "e2m1": GF.format_info_ocp_e2m1,
    "e2m3": GF.format_info_ocp_e2m3,
    "e3m2": GF.format_info_ocp_e3m2,
    "bf16": GF.format_info_bfloat16,
    "fp16": GF.format_info_binary16,
    "fp32": GF.format_info_binary32,
}


def gfloat_format(fmt: fp8sim.Format) -> FormatInfo:
    if fmt.name in _BUILTIN and fp8sim.format(fmt.name) == fmt:
        return _BUILTIN[fmt.name]
    nan = fmt.nan.value
    if nan == "ieee":
        high_nans = (1 << fmt.mbits) - (1 if fmt.inf else 0)
    elif nan == "ocp":
        high_nans = 1
    else:
        high_nans = 0
    return FormatInfo(
        name=fmt.name,
        k=fmt.bits,
        precision=fmt.mbits + 1,
        bias=fmt.bias,
        is_signed=fmt.signed,
        domain=Domain.Extended if fmt.inf else Domain.Finite,
        has_nz=fmt.has_negative_zero,
        num_high_nans=high_nans,
        has_subnormals=fmt.subnormals,
        is_twos_complement=False,
    )
