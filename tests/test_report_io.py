"""Outputs of the report and the command line: atomic report folders, output/input path checks made
before any work starts, strict JSON, usage errors that name the option (exit code 2)."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import fp8sim
from fp8sim import _json, report
from fp8sim.cli import UsageError, check_in_file, check_out_dir, check_out_file, granularity_list, main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def strict_loads(text: str):
    """json.loads that rejects the non-standard NaN/Infinity/-Infinity tokens, as strict parsers do."""

    def bad(token):
        raise AssertionError(f"non-standard JSON token {token}")

    return json.loads(text, parse_constant=bad)


def tree(path: Path) -> dict:
    """Every file under ``path`` with its bytes (for "left exactly as it was" checks)."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


FORMATS_ONLY = '{"studies": ["formats"], "seed": %d}'
ROUNDING_TINY = '{"studies": ["formats", "rounding"], "seed": %d, "rounding": {"formats": ["e4m3"], "modes": ["rne"], "samples": 100}}'


# ------------------------------------------------------------ strict JSON
def test_dumps_writes_strict_json_for_nonfinite_values():
    obj = {
        "nan": float("nan"),
        "f32": np.float32("inf"),
        "arr": np.array([1.5, -np.inf, np.nan]),
        ("a", 1): np.int64(3),
        "ok": [np.bool_(True), None, 2.0**-149],
    }
    text = _json.dumps(obj)
    back = strict_loads(text)
    assert back == {"nan": "nan", "f32": "inf", "arr": [1.5, "-inf", "nan"], "a/1": 3, "ok": [True, None, 2.0**-149]}
    assert "NaN" not in text and "Infinity" not in text
    assert math.isnan(float(back["nan"])) and float(back["arr"][1]) == -math.inf  # readable back with float()


def test_cli_json_is_strict(capsys):
    # 1e6 overflows: E4M3 has no infinity (NaN), E5M2 rounds to +inf under RNE (IEEE 754, no saturation)
    code, out, _ = run(capsys, "round", "1e6", "--format", "e4m3", "--json")
    assert code == 0 and strict_loads(out)["results"][0]["value"] == "nan"
    code, out, _ = run(capsys, "round", "1e6", "--format", "e5m2", "--json")
    r = strict_loads(out)["results"][0]
    assert code == 0 and r["value"] == "inf" and r["code"] == "0x7c"  # 0 11111 00 = +inf


def test_report_summary_json_is_strict(tmp_path, monkeypatch, capsys):
    # a study whose headline number is NaN: summary.json and --json stay valid JSON
    def study_nan(out, quick, progress, opts):
        return {"id": "nan", "title": "t", "html": "", "figures": [], "csv": [], "numbers": {"x": float("nan")}}

    summary = report.build(tmp_path / "r", progress=False, studies=[study_nan])
    text = (tmp_path / "r" / "summary.json").read_text()
    assert strict_loads(text)["sections"]["nan"]["x"] == "nan"
    assert summary["index"] == str(tmp_path / "r" / "index.html")


def test_report_folder_gets_the_permissions_mkdir_would_give(tmp_path):
    # built in a private temporary folder, the report must not stay private (0700) once renamed
    import os
    import stat

    def study(out, quick, progress, opts):
        return {"id": "s", "title": "t", "html": "", "figures": [], "csv": [], "numbers": {}}

    report.build(tmp_path / "r", progress=False, studies=[study])
    (tmp_path / "plain").mkdir()
    mode = stat.S_IMODE(os.stat(tmp_path / "r").st_mode)
    assert mode == stat.S_IMODE(os.stat(tmp_path / "plain").st_mode), oct(mode)


# ------------------------------------------------------- atomic report folder
def test_report_replaces_an_earlier_report_only_with_force_and_never_mixes(tmp_path, capsys):
    out = tmp_path / "rep"
    (tmp_path / "a.json").write_text(ROUNDING_TINY % 0)
    (tmp_path / "b.json").write_text(FORMATS_ONLY % 1)
    code, _, err = run(capsys, "report", "--out", str(out), "--config", str(tmp_path / "a.json"), "--quiet")
    assert code == 0, err
    first = tree(out)
    assert "rounding_modes.csv" in first
    # an earlier report is not replaced without --force: exit 2 before any study, folder untouched
    code, _, err = run(capsys, "report", "--out", str(out), "--config", str(tmp_path / "b.json"), "--quiet")
    assert code == 2 and "pass --force" in err and str(out) in err
    assert tree(out) == first
    # with --force the new report replaces the old one as a whole: no rounding files of run 1 left
    code, _, err = run(capsys, "report", "--out", str(out), "--config", str(tmp_path / "b.json"), "--quiet", "--force")
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["seed"] == 1 and list(summary["sections"]) == ["formats"]
    assert sorted(tree(out)) == ["formats.csv", "index.html", "summary.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.json", "rep"]  # no partial/replaced folder


@pytest.mark.parametrize("kind", ["file", "foreign_folder", "summary_json_folder"])
def test_report_out_that_cannot_take_a_report_is_refused_before_any_study(tmp_path, capsys, monkeypatch, kind):
    ran = []
    monkeypatch.setattr(report, "_build_into", lambda *a, **k: ran.append(1))
    out = tmp_path / "o"
    if kind == "file":
        out.write_text("keep me")
        message = "is not a folder"
    else:
        out.mkdir()
        (out / "notes.txt").write_text("keep me")
        if kind == "summary_json_folder":
            (out / "summary.json").mkdir()
            (out / "index.html").write_text("x")
        message = "holds no earlier fp8sim report"
    before = tree(tmp_path)
    for extra in ([], ["--force"]):  # --force never deletes a folder that is not a report
        code, _, err = run(capsys, "report", "--out", str(out), *extra)
        assert code == 2 and message in err and str(out) in err, err
    assert tree(tmp_path) == before and not ran
    if kind == "file":  # a parent that is a file
        code, _, err = run(capsys, "report", "--out", str(out / "sub"))
        assert code == 2 and f"{out} is a file, not a folder" in err


def test_report_failure_leaves_no_partial_folder(tmp_path):
    def boom(out, quick, progress, opts):
        (out / "half.csv").write_text("1,2\n")
        raise RuntimeError("study failed")

    with pytest.raises(RuntimeError, match="study failed"):
        report.build(tmp_path / "r", progress=False, studies=[boom])
    assert list(tmp_path.iterdir()) == []


def _cli(args, cwd):
    root = str(Path(fp8sim.__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    return subprocess.Popen(
        [sys.executable, "-m", "fp8sim.cli", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a test run started in the background inherits SIGINT ignored (as shells start background
        # jobs), and Python then never raises KeyboardInterrupt: give the child Ctrl-C's default
        preexec_fn=_default_sigint if sys.platform != "win32" else None,
    )


def _default_sigint() -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT")
def test_interrupted_report_leaves_the_old_report_untouched(tmp_path):
    # seed-0 report, then a seed-1 run into the same folder interrupted (SIGINT, as Ctrl-C) mid-run
    (tmp_path / "old.json").write_text(FORMATS_ONLY % 0)
    p = _cli(["report", "--out", "rep", "--config", "old.json"], tmp_path)
    assert p.wait(300) == 0, p.stderr.read()
    old = tree(tmp_path / "rep")
    slow = {"studies": ["formats", "rounding"], "seed": 1, "rounding": {"samples": 3_000_000}}
    (tmp_path / "new.json").write_text(json.dumps(slow))
    p = _cli(["report", "--out", "rep", "--config", "new.json", "--force", "--jobs", "1"], tmp_path)
    deadline = time.time() + 240
    partial = []
    while time.time() < deadline and p.poll() is None:
        partial = [d for d in tmp_path.glob(".rep.partial-*") if (d / "formats.csv").exists()]
        if partial:
            break
        time.sleep(0.05)
    assert partial and p.poll() is None, "the run ended before it could be interrupted"
    time.sleep(1.0)  # inside the rounding study
    p.send_signal(signal.SIGINT)
    code = p.wait(120)
    err = p.stderr.read()
    # 130 from main(), or death by SIGINT itself (what a shell also reports as 130) if the interrupt
    # lands while the interpreter shuts down; either way the folder checks below must hold
    assert code in (130, -signal.SIGINT), (code, err)
    assert "interrupted" in err and "left as it was" in err
    assert tree(tmp_path / "rep") == old  # the complete seed-0 report, nothing of seed 1
    assert json.loads((tmp_path / "rep" / "summary.json").read_text())["seed"] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.json", "old.json", "rep"]  # partial folder removed


# ----------------------------------------------------- path-checking helpers
def test_path_helpers(tmp_path):
    f = tmp_path / "f.npy"
    f.write_bytes(b"x")
    assert check_in_file(str(f), "input", (".npy",)) == str(f)
    with pytest.raises(UsageError, match="no such file"):
        check_in_file(str(tmp_path / "nope.npy"), "input")
    with pytest.raises(UsageError, match="is a folder, not a file"):
        check_in_file(str(tmp_path), "input")
    (tmp_path / "z.npz").write_bytes(b"x")
    with pytest.raises(UsageError, match=r"z\.npz: expected a \.npy file"):
        check_in_file(str(tmp_path / "z.npz"), "input", (".npy",))
    # output files
    with pytest.raises(UsageError, match="exists; pass --force"):
        check_out_file(str(f))
    assert check_out_file(str(f), force=True) == str(f)
    with pytest.raises(UsageError, match="is a folder"):
        check_out_file(str(tmp_path))
    with pytest.raises(UsageError, match=r"f\.npy is a file, not a folder"):
        check_out_file(str(f / "q.npz"))
    with pytest.raises(UsageError, match=r"ending in \.npz"):
        check_out_file(str(tmp_path / "q.txt"), suffixes=(".npz",))
    assert check_out_file(str(tmp_path / "new" / "deeper" / "q.npz"), suffixes=(".npz",))
    # output folders
    with pytest.raises(UsageError, match="exists and is not a folder"):
        check_out_dir(str(f))
    with pytest.raises(UsageError, match="already holds f.npy; pass --force"):
        check_out_dir(str(tmp_path), writes=("f.npy",))
    assert check_out_dir(str(tmp_path), writes=("f.npy",), force=True)
    with pytest.raises(UsageError, match="a file, not a folder"):
        check_out_dir(str(f / "sub"))
    assert granularity_list("tensor, 1x128,mx32") == ["tensor", "1x128", "mx32"]
    with pytest.raises(fp8sim.formats.UnknownNameError, match="did you mean 'tensor'"):
        granularity_list("1x128,tensr")
    with pytest.raises(UsageError, match="comma-separated"):
        granularity_list("1x128,")


def test_folder_commands_check_outputs_before_work(tmp_path, capsys):
    (tmp_path / "summary.json").write_text("{}")
    code, _, err = run(capsys, "train", "--recipes", "bf16", "--steps", "1", "--out", str(tmp_path))
    assert code == 2 and "already holds summary.json; pass --force" in err
    (tmp_path / "granularity_study.csv").write_text("x")
    code, _, err = run(capsys, "study", "granularity", "--out", str(tmp_path), "--quick")
    assert code == 2 and "already holds granularity_study.csv" in err
    assert (tmp_path / "granularity_study.csv").read_text() == "x"
    code, _, err = run(capsys, "study", "granularity", "--out", str(tmp_path / "summary.json"), "--quick")
    assert code == 2 and "exists and is not a folder" in err


# ---------------------------------------------------- usage errors exit 2
@pytest.mark.parametrize(
    "argv, option",
    [
        (["round", "1", "--mode", "sr", "--seed", "0", "--sr-bits", "0"], "--sr-bits"),
        (["round", "1", "--mode", "sr", "--seed", "0", "--sr-bits", "53"], "--sr-bits"),
        (["round", "1", "--mode", "sr", "--seed", "-5"], "--seed"),
        (["study", "granularity", "--seed", "-1"], "--seed"),
        (["train", "--seed", "-1"], "--seed"),
        (["sweep", "granularity", "--workers", "0"], "--workers"),
    ],
)
def test_bad_integer_options_exit_2_naming_the_option(capsys, argv, option):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and f"argument {option}" in capsys.readouterr().err


def test_round_usage_errors(capsys):
    code, _, err = run(capsys, "round", "1", "--sr-bits", "4")
    assert code == 2 and "--sr-bits applies only to --mode sr" in err
    code, _, err = run(capsys, "round", "1", "--format", "e4m4")
    assert code == 2 and "did you mean 'e4m3'" in err and "known formats: e4m3" in err
    code, _, err = run(capsys, "round", "1", "--mode", "rnee")
    assert code == 2 and "did you mean 'rne'" in err
    # the SR result with a valid seed and bit count is still what the API gives
    code, out, _ = run(capsys, "round", "0.3", "--mode", "sr", "--seed", "7", "--sr-bits", "13", "--json")
    want = fp8sim.round(np.array([0.3]), "e4m3", "sr", seed=7, sr_bits=13)[0]
    assert code == 0 and json.loads(out)["results"][0]["value"] == float(want)


def test_study_training_without_bf16_is_not_labelled_reference(monkeypatch, tmp_path):
    import importlib

    tr = importlib.import_module("fp8sim.training.train")  # the module (the package exports the function as train)

    def fake_train(recipes, steps, seed, out, fidelity="fast", progress=False):
        r = {
            "final_loss_last10pct_mean": 1.0,
            "rel_loss_error_vs_bf16": None,
            "frac_underflow": 0.0,
            "nonfinite_steps": 0,
            "s_per_step": 0.1,
        }
        return {"recipes": {n: dict(r) for n in recipes}}

    monkeypatch.setattr(tr, "train", fake_train)
    sec = report.study_training(tmp_path, True, False, {"seed": 0, "recipes": ["deepseek-v3"], "steps": 1})
    assert "no bf16 run" in sec["html"] and "reference" not in sec["html"].split("<table>")[1]
