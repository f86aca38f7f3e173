"""A run against SLOs (sim/goodput.py): attainment, whether the run meets them, and the goodput, on runs
whose answer is known by construction; and ``kvsim compare --slo``."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from sim import run_scenario, scenario_from_dict
from sim.cli import main
from sim.cluster.capacity import parse_slo
from sim.goodput import slo_report

GATEWAY = str(Path(__file__).resolve().parents[1] / "scenarios" / "gateway_cap.yaml")


def _burst(tmp_path, n: int, output_len: int, max_num_seqs: int = 1):
    """``n`` identical requests at once on one engine serving ``max_num_seqs`` at a time."""
    return run_scenario(scenario_from_dict({
        "name": "burst", "model": "llama-2-7b", "hardware": "a100-80gb", "scheduler": {"max_num_seqs": max_num_seqs},
        "workload": {"synthetic": {"num_requests": n, "arrival": {"process": "burst"},
                                   "prompt_len": {"dist": "fixed", "value": 64},
                                   "output_len": {"dist": "fixed", "value": output_len}}}}, base_dir=tmp_path))


def test_served_one_at_a_time_the_first_k_meet_a_ttft_bound(tmp_path):
    res = _burst(tmp_path, 6, 8)
    ttft = res.requests.sort_values("ttft_s")["ttft_s"].to_numpy()
    assert (ttft[1:] > ttft[:-1]).all()   # one at a time: each waits for those before it
    bound = (ttft[2] + ttft[3]) / 2       # between the third and the fourth
    report = slo_report(res.requests, res.summary, [parse_slo(f"ttft_p90={bound}")])
    assert report["attain_ttft_p90"] == 3 / 6
    assert report["goodput_req_s"] == pytest.approx(3 / res.summary["makespan_s"], rel=1e-12)
    assert report["meets"] is False and report["ttft_p90"] == res.summary["ttft_s"]["p90"]
    loose = slo_report(res.requests, res.summary, [parse_slo(f"ttft_p90={ttft[-1] * 2}"), parse_slo("itl_p99=10")])
    assert loose["meets"] is True and math.isnan(loose["attain_itl_p99"])
    assert loose["goodput_req_s"] == pytest.approx(res.summary["request_throughput"], rel=1e-12)   # all good
    tight = slo_report(res.requests, res.summary, [parse_slo(f"e2e_mean={ttft[0] / 2}")])
    assert tight["goodput_req_s"] == 0.0 and tight["attain_e2e_mean"] == 0.0


def test_a_request_of_one_output_token_has_no_tpot_to_miss(tmp_path):
    res = _burst(tmp_path, 4, 1, max_num_seqs=4)
    assert res.requests["tpot_s"].isna().all()
    report = slo_report(res.requests, res.summary, [parse_slo("tpot_p90=0.000001")])
    assert report["attain_tpot_p90"] == 1.0
    assert report["goodput_req_s"] == pytest.approx(res.summary["request_throughput"], rel=1e-12)


def test_compare_slo_columns_and_csv(tmp_path, capsys):
    out = tmp_path / "cmp"
    rc = main(["compare", GATEWAY, "--vary", "workload.max_concurrency=2,null", "--out", str(out), "--no-plots",
               "--set", "workload.synthetic.num_requests=40", "--set", "workload.synthetic.arrival={process: burst}",
               "--slo", "ttft_p90=0.5"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "SLOs met" in printed and "goodput" in printed
    df = pd.read_csv(out / "compare.csv").set_index("run")
    # two in flight at a time: every request's TTFT is short; all 40 at once: most wait behind the others
    assert df.loc["max_concurrency=2", "slo.attain_ttft_p90"] == 1.0
    assert bool(df.loc["max_concurrency=2", "slo.meets"]) is True
    assert df.loc["max_concurrency=2", "slo.goodput_req_s"] == pytest.approx(
        df.loc["max_concurrency=2", "request_throughput"], rel=1e-12)
    assert df.loc["max_concurrency=null", "slo.goodput_req_s"] < df.loc["max_concurrency=null", "request_throughput"]


def test_compare_bad_slo_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "cmp"
    rc = main(["compare", GATEWAY, "--vary", "workload.max_concurrency=2,4", "--slo", "ttft_p95=1", "--out", str(out)])
    assert rc == 2 and not out.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --slo:")


def test_run_slo_adds_the_report_to_summary_json(tmp_path, capsys):
    import json

    import yaml

    scenario = tmp_path / "burst.yaml"
    scenario.write_text(yaml.safe_dump({
        "name": "burst", "model": "llama-2-7b", "hardware": "a100-80gb", "scheduler": {"max_num_seqs": 1},
        "workload": {"synthetic": {"num_requests": 6, "arrival": {"process": "burst"},
                                   "prompt_len": {"dist": "fixed", "value": 64},
                                   "output_len": {"dist": "fixed", "value": 8}}}}))
    assert main(["run", str(scenario), "--out", str(tmp_path / "a"), "--no-plots"]) == 0
    ttft = sorted(pd.read_csv(tmp_path / "a" / "requests.csv")["ttft_s"])
    bound = (ttft[3] + ttft[4]) / 2   # the first four meet it, served one at a time
    assert main(["run", str(scenario), "--out", str(tmp_path / "b"), "--no-plots", "--slo", f"ttft_p50={bound}"]) == 0
    assert "goodput_req_s" in capsys.readouterr().out
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert summary["slo"]["attain_ttft_p50"] == 4 / 6 and summary["slo"]["meets"] is True   # (p50: the 3rd-4th)
    assert summary["slo"]["goodput_req_s"] == pytest.approx(4 / summary["makespan_s"], rel=1e-12)
    assert "slo" not in json.loads((tmp_path / "a" / "summary.json").read_text())
    assert main(["run", str(scenario), "--out", str(tmp_path / "c"), "--slo", "speed_p90=1"]) == 2
    assert not (tmp_path / "c").exists()
