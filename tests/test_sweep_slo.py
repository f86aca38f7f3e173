"""A sweep measured against SLOs (``slo:`` in the sweep file): each row gains slo.* (sim/goodput.py), the
SLOs are part of each task's identity, and a bad one is refused naming the file and line."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml
from test_sweep_reliability import BASE, _cli

from sim.sweep import load_sweep


def _sweep(tmp_path, slo: list[str] | None, out: str = "res"):
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(BASE, sort_keys=False))
    spec = {"base": "base.yaml", "grid": {"scheduler.max_num_seqs": [1, 4]}, "out": out}
    if slo is not None:
        spec["slo"] = slo
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_rows_gain_the_slo_report(tmp_path, capsys):
    # a bound no request can miss (an hour) and one none can meet (a nanosecond of TTFT)
    path = _sweep(tmp_path, ["e2e_p99=3600", "ttft_p50=0.000000001"])
    assert _cli(capsys, "sweep", str(path), "--workers", "1", "--no-progress")[0] == 0
    rows = pd.read_csv(tmp_path / "res" / "results.csv")
    assert len(rows) == 2 and (rows["status"] == "ok").all()
    assert (rows["slo.attain_e2e_p99"] == 1.0).all() and (rows["slo.attain_ttft_p50"] == 0.0).all()
    assert (rows["slo.goodput_req_s"] == 0.0).all() and not rows["slo.meets"].any()
    loose = _sweep(tmp_path, ["e2e_p99=3600"], out="loose")
    assert _cli(capsys, "sweep", str(loose), "--workers", "2", "--no-progress")[0] == 0
    rows = pd.read_csv(tmp_path / "loose" / "results.csv")
    assert rows["slo.meets"].all()
    assert rows["slo.goodput_req_s"].tolist() == pytest.approx(rows["request_throughput"].tolist(), rel=1e-12)


def test_the_slos_are_part_of_each_tasks_identity(tmp_path):
    without = {t.task_id for t in load_sweep(_sweep(tmp_path, None)).tasks}
    assert without == {t.task_id for t in load_sweep(_sweep(tmp_path, [])).tasks}   # (as before SLOs existed)
    with_slo = {t.task_id for t in load_sweep(_sweep(tmp_path, ["ttft_p90=2", "tpot_p90=0.1"])).tasks}
    reordered = {t.task_id for t in load_sweep(_sweep(tmp_path, ["tpot_p90=0.1", "ttft_p90=2"])).tasks}
    assert with_slo == reordered and not with_slo & without


def test_a_bad_slo_names_the_file_and_line(tmp_path, capsys):
    path = _sweep(tmp_path, ["ttft_p95=2"])
    code, _, err = _cli(capsys, "sweep", str(path))
    line = next(i for i, t in enumerate(path.read_text().splitlines(), 1) if t.startswith("slo:"))
    assert code == 2 and err.strip().startswith(f"error: {path}:{line}: slo: expected METRIC_STAT=SECONDS")
