"""The fp8sim command line: output, --json, exit codes and error messages."""

import csv
import json
import sys

import numpy as np
import pytest

import fp8sim
from fp8sim.cli import main

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")


def run(capsys, *argv):
    try:
        code = main(list(argv))
    except SystemExit as e:  # argparse's own usage errors (exit 2)
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def test_info_single_and_all(capsys):
    code, out, _ = run(capsys, "info", "e4m3")
    assert code == 0 and "448" in out and "float8_e4m3fn" in out
    code, out, _ = run(capsys, "info", "--all", "--json")
    rows = json.loads(out)
    assert code == 0 and [r["name"] for r in rows] == fp8sim.format_names()
    assert {r["name"]: r["max"] for r in rows}["e5m2"] == 57344.0


def test_unknown_format_is_a_usage_error(capsys):
    code, _, err = run(capsys, "info", "e9m9")
    assert code == 2 and "known formats: e4m3" in err


def test_round_json_matches_api(capsys):
    code, out, _ = run(capsys, "round", "0.1", "-431.99999999999994", "1e6", "--format", "e4m3", "--json")
    res = json.loads(out)["results"]
    assert code == 0
    assert [r["value"] for r in res[:2]] == fp8sim.round(np.array([0.1, -431.99999999999994]), "e4m3").tolist()
    assert res[1]["code"] == "0xfd" and res[2]["value"] == "nan"  # strict JSON: NaN as a string
    code, out, _ = run(capsys, "round", "1e6", "--format", "e4m3", "--saturate", "--json")
    assert json.loads(out)["results"][0]["value"] == 448.0


def test_round_bad_mode_and_value(capsys):
    assert run(capsys, "round", "1", "--mode", "banana")[0] == 2
    assert run(capsys, "round", "abc")[0] == 2
    code, _, err = run(capsys, "round", "1", "--mode", "sr")  # needs --seed: a usage error naming the option
    assert code == 2 and "--mode sr needs --seed" in err
    with pytest.raises(SystemExit):
        main(["round"])  # argparse: values required


def test_verify_exit_codes(capsys, tmp_path):
    path = "tests/data/wgmma_e4m3xe4m3_normal.npz"
    code, out, _ = run(capsys, "verify", path, "--json")
    assert code == 0 and json.loads(out)["mismatches"] == 0
    # the mma.sync model does not reproduce wgmma's bits: exit code 1
    code, out, _ = run(capsys, "verify", path, "--model", "mma.sync")
    assert code == 1 and "bit-exact" in out


def test_report_quick(tmp_path, capsys):
    # the quick report as README runs it, with the training comparison cut to 4 steps to spare CI time
    (tmp_path / "cfg.toml").write_text("[training]\nsteps = 4\n")
    out_dir = tmp_path / "report"
    code, out, _ = run(
        capsys, "report", "--out", str(out_dir), "--quick", "--quiet", "--config", str(tmp_path / "cfg.toml")
    )
    assert code == 0
    summary = json.loads((out_dir / "summary.json").read_text())
    html = (out_dir / "index.html").read_text()
    assert "data:image/png;base64," in html and "<h2>Formats</h2>" in html
    for f in summary["files"]:
        assert (out_dir / f).stat().st_size > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg.toml", "report"]  # no partial folder left
    assert summary["sections"]["formats"]["e4m3"]["max"] == 448.0
    rn = summary["sections"]["rounding"]["e4m3/rne"]["mean_rel_error"]
    assert 0 < rn < 2.0**-4  # below the unit roundoff of E4M3
    assert set(summary["sections"]) == {
        "formats",
        "rounding",
        "granularity",
        "accumulation",
        "accelerators",
        "tensorcore",
        "training",
    }
    assert summary["sections"]["training"]["steps"] == 4
    assert set(summary["sections"]["training"]) == {"steps", "bf16", "deepseek-v3"}


TINY = """
seed = 3
studies = ["rounding", "granularity", "accumulation", "training"]
[rounding]
formats = ["e5m2"]
modes = ["rne", "rtz"]
samples = 1000
[granularity]
shape = [64, 256]
formats = ["e4m3"]
distributions = ["gaussian", "outlier_channels"]
granularities = ["tensor", "1x128", "mx32"]
[accumulation]
k_max = 256
size = 8
distributions = ["normal"]
recipes = ["deepseek-v3"]
[training]
recipes = ["bf16", "deepseek-v3"]
steps = 2
"""


def test_report_config_selects_studies_and_options(tmp_path, capsys):
    (tmp_path / "r.toml").write_text(TINY)
    code, out, _ = run(
        capsys, "report", "--out", str(tmp_path / "a"), "--config", str(tmp_path / "r.toml"), "--json", "--jobs", "2"
    )
    assert code == 0
    summary = json.loads(out)
    assert summary["seed"] == 3 and summary["config"]["training"]["steps"] == 2
    sec = summary["sections"]
    assert list(sec) == ["rounding", "granularity", "accumulation", "training"]
    assert set(sec["rounding"]) == {"e5m2/rne", "e5m2/rtz"}
    assert set(sec["granularity"]) == {
        f"{d}/e4m3/{g}" for d in ("gaussian", "outlier_channels") for g in ("tensor", "1x128", "mx32")
    }
    # one outlier channel sets the per-tensor scale; 1x128 tiles map each tile amax onto 448
    assert sec["granularity"]["outlier_channels/e4m3/1x128"] > sec["granularity"]["outlier_channels/e4m3/tensor"]
    assert sec["accumulation"]["K"] == 256
    with open(tmp_path / "a" / "accumulation" / "accumulation_study.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert {r["distribution"] for r in rows} == {"normal"} and max(int(r["K"]) for r in rows) == 256
    assert {r["config"] for r in rows if r["part"] == "recipe"} == {"deepseek-v3"}
    with open(tmp_path / "a" / "training" / "losses.csv") as fh:
        assert len(list(csv.reader(fh))) == 1 + 2  # header + 2 steps
    # the same config as JSON, run in this process instead of two workers, gives the same numbers
    cfg = tomllib.loads(TINY)
    (tmp_path / "r.json").write_text(json.dumps(cfg))
    code, out, _ = run(
        capsys, "report", "--out", str(tmp_path / "b"), "--config", str(tmp_path / "r.json"), "--json", "--jobs", "1"
    )
    again = json.loads(out)["sections"]
    assert code == 0
    assert again["granularity"] == sec["granularity"] and again["rounding"] == sec["rounding"]


@pytest.mark.parametrize(
    "text, message",
    [
        ("bogus = 1", "unknown key 'bogus'; known keys: seed, quick, studies"),
        ("[granularity]\ntile = 3", "[granularity]: unknown option 'tile'; known options: shape"),
        (
            "[granularity]\ngranularities = ['1x128', 'blocky']",
            "unknown granularity 'blocky'; known granularities: tensor, row",
        ),
        ("[rounding]\nformats = ['e9m9']", "known formats: e4m3"),
        ("[training]\nrecipes = ['fp7']", "fp7"),
        ("[training]\nsteps = 0", "[training] steps: expected a positive integer, got 0"),
        # each value is checked against what its study accepts (not only against the registry)
        ("[granularity]\nformats = ['e8m0']", "'e8m0' not accepted: the granularity study quantizes"),
        ("[granularity]\nformats = ['e2m1']", "quantizes to the element formats e4m3, e5m2"),
        ("[rounding]\nformats = ['e8m0']", "'e8m0' is an unsigned (scale-only) format"),
        ("[accumulation]\nk_max = 64", "[accumulation] k_max: expected an integer >= 128, got 64"),
        ("[granularity]\ngranularities = ['tensr']", "unknown granularity 'tensr'; did you mean 'tensor'?"),
        ("[rounding]\nformats = ['e4m4']", "did you mean 'e4m3'"),
        ("[granularity]\nshape = [64]", "expected two positive integers"),
        ("studies = ['formats', 'speed']", "unknown study 'speed'; known studies: formats, rounding"),
        ("[training\nsteps = 1", "is not valid TOML"),
    ],
)
def test_report_config_errors_are_usage_errors(tmp_path, capsys, text, message):
    (tmp_path / "bad.toml").write_text(text)
    code, _, err = run(capsys, "report", "--out", str(tmp_path / "o"), "--config", str(tmp_path / "bad.toml"))
    assert code == 2 and message in err, err
    assert not (tmp_path / "o").exists()  # nothing ran


def test_report_config_missing_file(tmp_path, capsys):
    code, _, err = run(capsys, "report", "--out", str(tmp_path / "o"), "--config", str(tmp_path / "nope.toml"))
    assert code == 2 and "cannot read config file" in err


def test_quantize_command(tmp_path, capsys):
    x = np.random.default_rng(0).standard_normal((16, 256)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    code, out, _ = run(
        capsys,
        "quantize",
        str(tmp_path / "x.npy"),
        "--granularity",
        "1x128",
        "--json",
        "--out",
        str(tmp_path / "q.npz"),
    )
    res = json.loads(out)
    q = fp8sim.quantize(x, "e4m3", "1x128")
    assert code == 0 and res["scales_shape"] == [16, 2]
    assert res["sqnr_db"] == pytest.approx(fp8sim.metrics.sqnr_db(x, q.dequantize(np.float64)), rel=0, abs=0)
    with np.load(tmp_path / "q.npz") as z:
        assert np.array_equal(z["codes"], q.codes) and np.array_equal(z["scales"], q.scales)
    np.save(tmp_path / "i.npy", np.arange(4))
    assert run(capsys, "quantize", str(tmp_path / "i.npy"))[0] == 2
    assert run(capsys, "quantize", str(tmp_path / "missing.npy"))[0] == 2  # a usage error naming the path
    assert run(capsys, "quantize", str(tmp_path / "x.npy"), "--granularity", "7q")[0] == 2


def test_quantize_checks_paths_and_options_before_work(tmp_path, capsys):
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.savez(tmp_path / "z.npz", x=x)
    (tmp_path / "afile").write_text("not a folder")
    xs = str(tmp_path / "x.npy")
    cases = [
        ([str(tmp_path / "z.npz")], "expected a .npy file"),
        ([str(tmp_path)], "is a folder, not a file"),
        ([xs, "--out", str(tmp_path / "afile" / "q.npz")], "is a file, not a folder"),
        ([xs, "--out", str(tmp_path)], "is a folder"),
        ([xs, "--mode", "sr"], "--mode sr needs --seed"),
        ([xs, "--mode", "sr", "--seed", "-5"], "--seed"),
        ([xs, "-g", "1x128,,mx32"], "comma-separated list"),
        ([xs, "-g", "1x128,mx32", "--out", str(tmp_path / "two.npz")], "one --granularity"),
        ([xs, "-f", "e4m33"], "did you mean"),
    ]
    for args, message in cases:
        code, _, err = run(capsys, "quantize", *args)
        assert code == 2 and message in err, (args, err)
    np.save(tmp_path / "s.npy", np.float32(3.0))
    code, _, err = run(capsys, "quantize", str(tmp_path / "s.npy"))
    assert code == 2 and "scalar" in err
    # an existing --out is replaced only with --force; the path printed is the file written
    (tmp_path / "q.npz").write_bytes(b"keep")
    code, _, err = run(capsys, "quantize", xs, "--out", str(tmp_path / "q"))
    assert code == 2 and "--force" in err and (tmp_path / "q.npz").read_bytes() == b"keep"
    code, out, _ = run(capsys, "quantize", xs, "--out", str(tmp_path / "q"), "--force", "--json")
    assert code == 0 and json.loads(out)["out"] == str(tmp_path / "q.npz")
    with np.load(tmp_path / "q.npz") as z:
        assert np.array_equal(z["codes"], fp8sim.quantize(x, "e4m3").codes)


def test_quantize_defaults_and_granularity_lists(tmp_path, capsys):
    x = np.random.default_rng(2).standard_normal((8, 256)).astype(np.float32) * 3
    np.save(tmp_path / "x.npy", x)
    xs = str(tmp_path / "x.npy")
    # the CLI's default granularity is the API's (per tensor), with the same SQNR
    code, out, _ = run(capsys, "quantize", xs, "--json")
    res = json.loads(out)
    assert code == 0 and res["granularity"] == fp8sim.quantize(x, "e4m3").granularity.name
    assert res["sqnr_db"] == fp8sim.metrics.sqnr_db(x, fp8sim.quantize(x, "e4m3").dequantize(np.float64))
    # nvfp4 alone defaults to E2M1 elements (the format NVFP4 is defined with)
    code, out, _ = run(capsys, "quantize", xs, "-g", "nvfp4", "--json")
    assert code == 0 and json.loads(out)["format"] == "e2m1"
    # a comma list gives one result per granularity, each equal to its own run
    code, out, _ = run(capsys, "quantize", xs, "-g", "tensor, 1x128,mx32", "--json")
    rows = json.loads(out)
    assert code == 0 and [r["granularity"] for r in rows] == [
        fp8sim.quantize(x, "e4m3", g).granularity.name for g in ("tensor", "1x128", "mx32")
    ]
    for r, g in zip(rows, ("tensor", "1x128", "mx32")):
        assert r["sqnr_db"] == fp8sim.metrics.sqnr_db(x, fp8sim.quantize(x, "e4m3", g).dequantize(np.float64))


def _run_cli(args, stderr_tty: bool, tmp_path):
    """Run the installed command line in a subprocess; stderr is a pseudo-terminal or a pipe."""
    import os
    import pty
    import subprocess
    from pathlib import Path

    cmd = [sys.executable, "-m", "fp8sim.cli", *args]
    root = str(Path(fp8sim.__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    if not stderr_tty:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
        return p.returncode, p.stderr
    master, slave = pty.openpty()
    import fcntl
    import struct
    import termios

    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))  # a 160-column terminal
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=slave, cwd=tmp_path, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # EIO once the child has closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return p.wait(timeout=300), b"".join(chunks).decode(errors="replace")


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
def test_progress_bar_only_on_a_terminal_and_not_with_quiet(tmp_path):
    (tmp_path / "c.json").write_text('{"studies": ["formats"]}')
    args = ["report", "--out", "r", "--config", "c.json", "--force"]
    code, err = _run_cli(args, stderr_tty=True, tmp_path=tmp_path)
    assert code == 0 and "fp8sim report" in err and "1/1" in err, err  # the tqdm bar reached 1 of 1 study
    code, err = _run_cli(args, stderr_tty=False, tmp_path=tmp_path)
    assert code == 0 and err == ""
    code, err = _run_cli([*args, "--quiet"], stderr_tty=True, tmp_path=tmp_path)
    assert code == 0 and err == ""


def test_mode_aliases_of_the_library_work_on_the_command_line(capsys):
    # "rz" and "nearest" are fp8sim.round's aliases of rtz and rne: same values, same exit code
    for alias, mode in (("rz", "rtz"), ("nearest", "rne"), ("ru", "rup")):
        code, out, _ = run(capsys, "round", "0.3", "--format", "e4m3", "--mode", alias, "--json")
        assert code == 0, alias
        v = json.loads(out)["results"][0]["value"]
        assert v == float(fp8sim.round(np.array([0.3]), "e4m3", mode)[0]), alias
