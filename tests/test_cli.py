"""The fp8sim command line: output, --json, exit codes and error messages."""

import json

import numpy as np
import pytest

import fp8sim
from fp8sim.cli import main


def run(capsys, *argv):
    code = main(list(argv))
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
    assert res[1]["code"] == "0xfd" and np.isnan(res[2]["value"])
    code, out, _ = run(capsys, "round", "1e6", "--format", "e4m3", "--saturate", "--json")
    assert json.loads(out)["results"][0]["value"] == 448.0


def test_round_bad_mode_and_value(capsys):
    assert run(capsys, "round", "1", "--mode", "banana")[0] == 2
    assert run(capsys, "round", "abc")[0] == 2
    assert run(capsys, "round", "1", "--mode", "sr")[0] == 1  # needs --seed
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
    code, out, _ = run(capsys, "report", "--out", str(tmp_path), "--quick", "--quiet")
    assert code == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    html = (tmp_path / "index.html").read_text()
    assert "data:image/png;base64," in html and "<h2>Formats</h2>" in html
    for f in summary["files"]:
        assert (tmp_path / f).stat().st_size > 0
    assert summary["sections"]["formats"]["e4m3"]["max"] == 448.0
    rn = summary["sections"]["rounding"]["e4m3/rne"]["mean_rel_error"]
    assert 0 < rn < 2.0**-4  # below the unit roundoff of E4M3


def test_quantize_command(tmp_path, capsys):
    x = np.random.default_rng(0).standard_normal((16, 256)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    code, out, _ = run(capsys, "quantize", str(tmp_path / "x.npy"), "--granularity", "1x128", "--json",
                       "--out", str(tmp_path / "q.npz"))
    res = json.loads(out)
    q = fp8sim.quantize(x, "e4m3", "1x128")
    assert code == 0 and res["scales_shape"] == [16, 2]
    assert res["sqnr_db"] == pytest.approx(fp8sim.metrics.sqnr_db(x, q.dequantize()), rel=0, abs=0)
    with np.load(tmp_path / "q.npz") as z:
        assert np.array_equal(z["codes"], q.codes) and np.array_equal(z["scales"], q.scales)
    np.save(tmp_path / "i.npy", np.arange(4))
    assert run(capsys, "quantize", str(tmp_path / "i.npy"))[0] == 2
    assert run(capsys, "quantize", str(tmp_path / "missing.npy"))[0] == 1
    assert run(capsys, "quantize", str(tmp_path / "x.npy"), "--granularity", "7q")[0] == 2
