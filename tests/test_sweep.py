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
