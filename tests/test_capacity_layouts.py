"""kvsim capacity --vary: each layout's fewest replicas as its own search finds them, its GPUs (replicas x
tensor-parallel degree, per pool), the best layout (fewest GPUs, or cheapest with --gpu-cost), layouts no
fleet makes meet the SLOs, and bad arguments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from sim.cli import main
from sim.cluster.layouts import gpus_of
from sim.scenario import scenario_from_dict

SCENARIO = {
    "name": "layouts", "seed": 0, "model": "llama-2-7b", "hardware": "a100-80gb", "output": {"plots": False},
    "kv_cache": {"block_size": 16, "swap_space_gb": 0.001}, "scheduler": {"max_num_seqs": 64},
    "workload": {"synthetic": {"num_requests": 300, "arrival": {"process": "poisson", "rate": 30},
                               "prompt_len": {"dist": "uniform", "min": 200, "max": 2000},
                               "output_len": {"dist": "uniform", "min": 20, "max": 200}}},
}
SLOS = ["--slo", "ttft_p90=0.5", "--slo", "tpot_p90=0.03"]


@pytest.fixture
def scenario(tmp_path) -> Path:
    path = tmp_path / "layouts.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    return path


def _json(capsys, *args: str) -> dict:
    assert main(["capacity", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_each_layout_is_its_own_search_and_the_fewest_gpus_win(scenario, capsys):
    got = _json(capsys, str(scenario), *SLOS, "--vary", "hardware.tensor_parallel=1,2", "--vary",
                "model.weight_dtype=null,int4", "--workers", "2")
    rows = {r["layout"]: r for r in got["layouts"]}
    assert list(rows) == ["tensor_parallel=1, weight_dtype=null", "tensor_parallel=1, weight_dtype=int4",
                          "tensor_parallel=2, weight_dtype=null", "tensor_parallel=2, weight_dtype=int4"]
    for (tp, w), row in zip([(1, "null"), (1, "int4"), (2, "null"), (2, "int4")], rows.values()):
        alone = _json(capsys, str(scenario), *SLOS, "--set", f"hardware.tensor_parallel={tp}", "--set",
                      f"model.weight_dtype={w}")
        assert row["replicas"] == alone["replicas"] and row["gpus"] == tp * alone["replicas"]
        chosen = next(c for c in alone["candidates"] if c["replicas"] == alone["replicas"])
        assert (row["ttft_p90"], row["tpot_p90"]) == (chosen["ttft_p90"], chosen["tpot_p90"])   # its figures
        assert chosen["ttft_p90"] <= 0.5 and chosen["tpot_p90"] <= 0.03
        assert row["gpus_by_hardware"] == {"a100-80gb": row["gpus"]}
        assert row["varied"] == {"hardware.tensor_parallel": str(tp), "model.weight_dtype": w}
    fewest = min(r["gpus"] for r in rows.values())
    first = next(name for name, r in rows.items() if r["gpus"] == fewest)
    assert (got["layout"], got["gpus"], got["replicas"]) == (first, fewest, rows[first]["replicas"])


def test_prices_pick_the_cheapest_across_gpu_types(scenario, capsys):
    got = _json(capsys, str(scenario), *SLOS, "--vary", "hardware.name=a100-80gb,h100-80gb",
                "--gpu-cost", "a100-80gb=1.0", "--gpu-cost", "H100-80GB=10")
    a100, h100 = got["layouts"]
    assert a100["cost_per_hour"] == a100["gpus"] * 1.0 and h100["cost_per_hour"] == h100["gpus"] * 10.0
    assert h100["gpus"] <= a100["gpus"]   # an H100 is faster ...
    assert got["layout"] == "name=a100-80gb" and got["cost_per_hour"] == a100["gpus"]   # ... not ten times


def test_rate_layouts_rank_by_requests_a_second_per_gpu(scenario, capsys):
    got = _json(capsys, str(scenario), *SLOS, "--search", "rate", "--vary", "hardware.tensor_parallel=1,2",
                "--workers", "2")
    for tp, row in zip((1, 2), got["layouts"]):
        alone = _json(capsys, str(scenario), *SLOS, "--search", "rate", "--set", f"hardware.tensor_parallel={tp}",
                      "--workers", "2")
        assert row["rate"] == alone["rate"] and row["gpus"] == tp   # (no cluster: one replica of tp GPUs)
        assert row["rate_per_gpu"] == alone["rate"] / tp
    best = max(got["layouts"], key=lambda r: r["rate_per_gpu"])
    assert (got["layout"], got["rate"], got["rate_per_gpu"]) == (best["layout"], best["rate"], best["rate_per_gpu"])


def test_a_layout_no_fleet_serves_is_reported_and_never_chosen(scenario, capsys):
    assert main(["capacity", str(scenario), *SLOS, "--vary", "model.weight_dtype=null", "--max", "1",
                 "--set", "workload.synthetic.arrival.rate=400", "--json"]) == 1
    got = json.loads(capsys.readouterr().out)
    (only,) = got["layouts"]
    assert got["layout"] is None and only["gpus"] is None and "no fleet of up to 1 replicas" in only["reason"]


def test_a_disaggregated_fleet_counts_each_pools_gpus():
    scn = scenario_from_dict({**SCENARIO, "cluster": {
        "prefill": {"replicas": 1, "tensor_parallel": 2}, "decode": {"replicas": 1},
        "kv_transfer": {"link": "nvlink"}}})
    assert gpus_of(scn, {"replicas": 5, "prefill": 2, "decode": 3}) == (7, {"a100-80gb": 7})   # 2 x 2 + 3 x 1
    scn = scenario_from_dict({**SCENARIO, "cluster": {
        "prefill": {"replicas": 1, "hardware": "h100-80gb"}, "decode": {"replicas": 1},
        "kv_transfer": {"link": "nvlink"}}})
    assert gpus_of(scn, {"replicas": 5, "prefill": 2, "decode": 3}) == (5, {"h100-80gb": 2, "a100-80gb": 3})


@pytest.mark.parametrize("args, message", [
    (["--gpu-cost", "a100-80gb=1"], "--gpu-cost: prices rank layouts: give the layouts with --vary"),
    (["--vary", "hardware.tensor_parallel=1", "--gpu-cost", "a100-80gb=x"], "expected HARDWARE=PRICE"),
    (["--vary", "hardware.tensor_parallel=1", "--gpu-cost", "h100-80gb=2"], "no price for a100-80gb"),
    (["--vary", "hardware.tensor_parallel=1,3"], "tensor_parallel"),
])
def test_bad_layout_arguments_exit_2_in_one_line_before_any_search(scenario, capsys, args, message):
    assert main(["capacity", str(scenario), *SLOS, *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
