"""Sweeps give the same rows serially and on a dask LocalCluster."""

import json

import pytest

from fp8sim import sweep
from fp8sim.cli import main


def test_local_cluster_equals_serial():
    params = sweep.granularity_params(
        distributions=("gaussian", "outlier_channels"),
        formats=("e4m3",),
        granularities=("tensor", "1x128"),
        seeds=(0, 1),
        sizes=((32, 256),),
    )
    serial = sweep.run(sweep.granularity_task, params, scheduler="serial")
    local = sweep.run(sweep.granularity_task, params, scheduler="local", workers=2)
    assert len(serial) == len(params) == 8
    assert local == serial  # same rows, same order, bit-identical numbers
    # the rows are real measurements: 1x128 beats per-tensor on outlier channels
    by = {(r["distribution"], r["granularity"], r["seed"]): r["sqnr_db"] for r in serial}
    assert by[("outlier_channels", "1x128", 0)] > by[("outlier_channels", "tensor", 0)]


def test_unknown_scheduler_and_cli(tmp_path, capsys):
    with pytest.raises(ValueError, match="unknown scheduler"):
        sweep.run(sweep.granularity_task, [{"x": 1}], scheduler="banana")
    code = main(
        [
            "sweep",
            "granularity",
            "--scheduler",
            "serial",
            "--distributions",
            "gaussian",
            "--formats",
            "e4m3",
            "--granularities",
            "tensor",
            "--sizes",
            "16x128",
            "--out",
            str(tmp_path),
            "--json",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["tasks"] == 1 and (tmp_path / "sweep_granularity.csv").exists()
    assert main(["sweep", "granularity", "--granularities", "1y5", "--scheduler", "serial"]) == 2


def _sweep_args(tmp_path, *extra):
    base = ["sweep", "granularity", "--scheduler", "serial", "--distributions", "gaussian", "--formats", "e4m3"]
    return [*base, "--granularities", "tensor", "--sizes", "16x128", "--out", str(tmp_path), *extra]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--seeds", ","], "--seeds: expected a comma-separated list"),
        (["--seeds", "0,-1"], "--seeds: seeds must be integers >= 0"),
        (["--sizes", "0x8"], "--sizes: sizes must be positive"),
        (["--sizes", "8"], "--sizes: sizes are ROWSxCOLS"),
        (["--formats", "e8m0"], "--formats: e8m0 cannot hold quantized elements"),
        (["--formats", "e4m4"], "did you mean 'e4m3'"),
        (["--distributions", "gausian"], "did you mean 'gaussian'"),
        (["--granularities", "tensor,1x128,tensr"], "did you mean 'tensor'"),
        (["--scheduler", "banana"], "--scheduler: unknown scheduler 'banana'"),
    ],
)
def test_sweep_usage_errors_before_any_task(tmp_path, capsys, monkeypatch, extra, message):
    monkeypatch.setattr(sweep, "run", lambda *a, **k: pytest.fail("a task ran"))
    assert main(_sweep_args(tmp_path, *extra)) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "sweep_granularity.csv").exists()


def test_sweep_out_checked_before_any_task_and_not_overwritten(tmp_path, capsys, monkeypatch):
    afile = tmp_path / "afile"
    afile.write_text("x")
    real_run = sweep.run
    monkeypatch.setattr(sweep, "run", lambda *a, **k: pytest.fail("a task ran"))
    assert main(_sweep_args(afile)) == 2 and "exists and is not a folder" in capsys.readouterr().err
    (tmp_path / "sweep_granularity.csv").write_text("old")
    assert main(_sweep_args(tmp_path)) == 2 and "pass --force" in capsys.readouterr().err
    assert (tmp_path / "sweep_granularity.csv").read_text() == "old"
    monkeypatch.setattr(sweep, "run", real_run)
    assert main(_sweep_args(tmp_path, "--force")) == 0
    assert (tmp_path / "sweep_granularity.csv").read_text().startswith("distribution,format,granularity")


def test_sweep_unreachable_scheduler_is_a_quick_usage_error(tmp_path, capsys):
    import time

    t = time.perf_counter()
    code = main(_sweep_args(tmp_path, "--scheduler", "tcp://127.0.0.1:9", "--connect-timeout", "1"))
    err = capsys.readouterr().err
    assert code == 2 and "no dask scheduler answered at tcp://127.0.0.1:9 within 1 s" in err, err
    assert time.perf_counter() - t < 20


def test_sweep_params_checked_in_the_api():
    for kw, msg in [
        ({"seeds": (-1,)}, "seeds must be integers >= 0"),
        ({"sizes": ((0, 8),)}, "sizes must be pairs of positive integers"),
        ({"formats": ("e8m0",)}, "cannot hold quantized elements"),
        ({"granularities": ()}, "granularities: expected a non-empty list"),
    ]:
        with pytest.raises(ValueError, match=msg):
            sweep.granularity_params(**kw)
    with pytest.raises(ValueError, match="workers must be a positive integer"):
        sweep.run(sweep.granularity_task, [], scheduler="local", workers=0)


def test_sweep_help_has_descriptions_and_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "comma-separated tensor seeds (integers >= 0) (default: 0)" in text
    assert "(default: 256x1024)" in text and "(default: tensor,1x128,128x128,mx32)" in text
