"""The modules 0.2.0 moved into fp8sim.gemms: the old names import, warn, and give the same objects;
the function ``fp8sim.gemm`` is never replaced by a module (the old ``sys.modules`` alias is gone)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

import fp8sim
import fp8sim.gemms as gemms

OLD = {
    "fp8sim.recipes": ("Recipe", gemms.recipes.Recipe),
    "fp8sim.recipes_blackwell": ("PRESETS_BEYOND_HOPPER", gemms.presets.PRESETS_BEYOND_HOPPER),
    "fp8sim.pipeline": ("quantize_operands", gemms.operands.quantize_operands),
    "fp8sim.gemm": ("scaled_matmul", gemms.engine.scaled_matmul),
    "fp8sim.gemm_core": ("cast_output", gemms.engine.cast_output),
    "fp8sim.scaled": ("run_codes", gemms.engine.run_codes),
    "fp8sim.gemm_report": ("GemmReport", gemms.error_report.GemmReport),
    "fp8sim.identification": ("bit_match", gemms.identification.bit_match),
    "fp8sim.device": ("gemm_device", gemms.device.gemm_device),
    "fp8sim.tensorcore.block_gemm": ("block_scaled_gemm", gemms.block_scaled.block_scaled_gemm),
}


@pytest.mark.parametrize("old", sorted(OLD))
def test_old_name_warns_and_gives_the_moved_object(old):
    name, obj = OLD[old]
    mod = importlib.import_module(old)
    with pytest.warns(DeprecationWarning, match=r"deprecated since fp8sim 0\.2\.0"):
        got = getattr(mod, name)
    assert got is obj


def test_from_import_statement_warns():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from fp8sim.pipeline import gemm  # noqa: F401
    assert any(issubclass(w.category, DeprecationWarning) and "fp8sim.gemms.api.gemm" in str(w.message) for w in caught)


def test_unknown_name_on_an_old_module_is_an_attribute_error():
    mod = importlib.import_module("fp8sim.recipes")
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        mod.nonexistent  # noqa: B018


def test_gemm_stays_the_function_after_import_fp8sim_gemm():
    """In a fresh interpreter: ``import fp8sim.gemm`` (the old module name) leaves ``fp8sim.gemm`` the
    function, and importing fp8sim alone warns about nothing."""
    code = (
        "import warnings; warnings.simplefilter('error')\n"
        "import fp8sim\n"
        "import fp8sim.gemm\n"
        "assert callable(fp8sim.gemm) and fp8sim.gemm.__module__ == 'fp8sim.gemms.api', fp8sim.gemm\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_package_attribute_of_a_moved_module_warns():
    with pytest.warns(DeprecationWarning):
        assert fp8sim.pipeline.gemm is gemms.api.gemm  # type: ignore[attr-defined]
