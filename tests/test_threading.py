"""fp8sim's threading setup (fp8sim/_threads.py): ``OMP_WAIT_POLICY=PASSIVE`` at import unless the user
chose a wait policy, so that the OpenMP threads of numba's kernels (and of torch, imported after
fp8sim) sleep between kernels instead of spinning on the cores; numba's threading layer unchanged.

No timings here: the OpenMP runtime itself reports the policy it took (``OMP_DISPLAY_ENV``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fp8sim import _threads

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("initial", [{}, {"PATH": "/bin", "OMP_NUM_THREADS": "2"}])
def test_apply_sets_a_passive_wait_policy_where_the_user_chose_none(initial):
    env = dict(initial)
    assert _threads.apply(env) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert env == {**initial, "OMP_WAIT_POLICY": "PASSIVE"}


@pytest.mark.parametrize("name", ["OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME"])
@pytest.mark.parametrize("value", ["ACTIVE", "1000", ""])
def test_apply_never_overrides_the_users_choice(name, value):
    env = {name: value, "OMP_NUM_THREADS": "1"}
    assert _threads.apply(env) == {}
    assert env == {name: value, "OMP_NUM_THREADS": "1"}  # even an empty value is the user's


def _run(code: str, **env_vars: str) -> dict:
    """Run ``code`` in a fresh interpreter whose environment has none of the wait-policy variables
    (this process has fp8sim's own default in os.environ) but ``env_vars``; ``code`` prints JSON. Returns
    it, with ``"spincounts"``: the GOMP_SPINCOUNT of every GNU OpenMP runtime that reported its
    settings on stderr (``OMP_DISPLAY_ENV=VERBOSE``) and ``"policies"``: their OMP_WAIT_POLICY."""
    env = {k: v for k, v in os.environ.items() if k not in _threads.USER_CHOICES and k != "OMP_DISPLAY_ENV"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env.update(env_vars)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    out["spincounts"] = re.findall(r"GOMP_SPINCOUNT = '(\d+)'", p.stderr)
    out["policies"] = re.findall(r"OMP_WAIT_POLICY = '(\w+)'", p.stderr)
    return out


_REPORT = (
    "import json, os, numba; numba.get_num_threads()\n"  # starts numba's thread pool: loads its OpenMP runtime
    "print(json.dumps({'env': os.environ.get('OMP_WAIT_POLICY'), 'layer': numba.threading_layer(),"
    " 'applied': fp8sim._threads.APPLIED}))"
)


def test_numbas_openmp_runtime_waits_passively_after_import_fp8sim():
    r = _run("import fp8sim\n" + _REPORT, OMP_DISPLAY_ENV="VERBOSE")
    assert r["env"] == "PASSIVE" and r["applied"] == {"OMP_WAIT_POLICY": "PASSIVE"}
    if r["layer"] != "omp" or not r["spincounts"]:
        pytest.skip(f"numba's threading layer is {r['layer']}, not GNU OpenMP's")
    # libgomp's spin count with OMP_WAIT_POLICY unset is 300000; PASSIVE makes it 0
    assert r["spincounts"] == ["0"] and r["policies"] == ["PASSIVE"], r


@pytest.mark.parametrize(
    "user", [{"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "123"}, {"KMP_BLOCKTIME": "0"}], ids=lambda d: [*d][0]
)
def test_import_fp8sim_keeps_the_users_wait_policy(user):
    r = _run("import fp8sim\n" + _REPORT, OMP_DISPLAY_ENV="VERBOSE", **user)
    assert r["env"] == user.get("OMP_WAIT_POLICY") and r["applied"] == {}, r
    if r["layer"] == "omp" and r["spincounts"]:
        expected = {"OMP_WAIT_POLICY": "30000000000", "GOMP_SPINCOUNT": "123", "KMP_BLOCKTIME": "300000"}
        assert r["spincounts"] == [expected[[*user][0]]], r  # libgomp's values for ACTIVE, 123, unset


def test_numbas_threading_layer_stays_the_users_choice():
    r = _run("import fp8sim\n" + _REPORT, NUMBA_THREADING_LAYER="workqueue")
    assert r["layer"] == "workqueue" and r["env"] == "PASSIVE"


@pytest.mark.parametrize("first", ["fp8sim", "torch"])
def test_import_order_with_torch(first):
    pytest.importorskip("torch")
    second = "torch" if first == "fp8sim" else "fp8sim"
    code = f"import {first}\nimport {second}\nimport fp8sim, torch\n" + _REPORT.replace(
        "}))", ", 'torch_threads': torch.get_num_threads()}))"
    )
    r = _run(code, OMP_DISPLAY_ENV="VERBOSE")
    assert r["env"] == "PASSIVE" and r["applied"] == {"OMP_WAIT_POLICY": "PASSIVE"}
    # torch keeps the threads it has without fp8sim (numba's omp layer shares torch's OpenMP runtime
    # and sets its thread count when its pool starts: to NUMBA_NUM_THREADS, by default the usable cores)
    alone = _run("import json, torch; print(json.dumps({'torch_threads': torch.get_num_threads()}))")
    assert r["torch_threads"] == alone["torch_threads"], (r, alone)
    if first == "fp8sim" and r["spincounts"]:
        # imported after fp8sim, torch's own OpenMP runtime (which numba's kernels then share) sleeps too
        assert set(r["spincounts"]) == {"0"}, r
