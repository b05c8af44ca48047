import os

import pytest
from hypothesis import settings

# numba compiles on first use: no per-example deadline; CI gets a fixed,
# reproducible profile.
settings.register_profile("default", deadline=None, max_examples=200)
settings.register_profile("ci", deadline=None, max_examples=200, derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")


def pytest_collection_modifyitems(config, items):
    """Tests marked slow (exhaustive sweeps) run only when asked for with ``-m slow``."""
    if "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="exhaustive check: run with -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
