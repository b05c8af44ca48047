"""JSON output of numpy values (shared by the CLI and the writers of summary.json files)."""

from __future__ import annotations

import numpy as np


def json_default(o):
    """``json.dumps(..., default=json_default)``: numpy scalars and arrays as plain numbers/lists."""
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)
