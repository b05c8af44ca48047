import os

from hypothesis import settings

# numba compiles on first use: no per-example deadline; CI gets a fixed,
# reproducible profile.
settings.register_profile("default", deadline=None, max_examples=200)
settings.register_profile("ci", deadline=None, max_examples=200, derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")
