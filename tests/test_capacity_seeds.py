"""kvsim capacity --seeds N: a candidate meets only if it meets under each of N seeds, its figures the worst
seed's; each seed's figures are those of a plain run with that seed; a scenario that draws nothing at random
says that the seeds agree; bad --seeds exit 2."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from test_cluster_capacity import SCENARIO

from sim.cli import main
from sim.cluster.capacity import SLO, across_seeds, search_replicas, seeds_agree
from sim.runner import run_scenario
from sim.scenario import load_scenario


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    path = tmp_path / "capacity.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    return path


def _p90s(path: Path, *overrides: str) -> dict[str, float]:
    s = run_scenario(load_scenario(path, list(overrides)), check_integrity=False).summary
    return {"ttft_p90": s["ttft_s"]["p90"], "tpot_p90": s["tpot_s"]["p90"]}


def _meets(p90s: dict[str, float]) -> bool:
    return p90s["ttft_p90"] <= 0.02 and p90s["tpot_p90"] <= 0.002


def test_across_seeds_keeps_the_worst_of_each_figure() -> None:
    rows = [
        {"ttft_p90": 0.5, "tpot_p90": 0.03, "meets": True, "attain_ttft_p90": 0.95, "attain_tpot_p90": 0.90,
         "goodput_req_s": 4.0, "num_finished": 100, "output_throughput_tok_s": 900.0, "worst_ratio": 0.6},
        {"ttft_p90": 0.9, "tpot_p90": 0.02, "meets": False, "attain_ttft_p90": 0.85, "attain_tpot_p90": 0.97,
         "goodput_req_s": 3.5, "num_finished": 98, "output_throughput_tok_s": 950.0, "worst_ratio": 1.8},
    ]
    slos = [SLO("ttft_s", "p90", 0.6), SLO("tpot_s", "p90", 0.05)]
    row = across_seeds(rows, [7, 8], slos)
    assert (row["ttft_p90"], row["tpot_p90"]) == (0.9, 0.03)          # the highest latencies
    assert (row["attain_ttft_p90"], row["attain_tpot_p90"]) == (0.85, 0.90)   # the lowest attainments
    assert (row["goodput_req_s"], row["num_finished"], row["output_throughput_tok_s"]) == (3.5, 98, 900.0)
    assert row["worst_ratio"] == 1.8 and row["meets"] is False and row["seeds_met"] == 1
    assert [s["seed"] for s in row["seeds"]] == [7, 8] and row["seeds"][1]["ttft_p90"] == 0.9
    # a seed whose figure is missing (NaN) fails the candidate, and the figure stays NaN
    rows[0]["ttft_p90"] = math.nan
    assert math.isnan(across_seeds(rows, [7, 8], slos)["ttft_p90"])


def test_a_replicas_search_needs_every_seed_to_meet() -> None:
    """By hand: seed 0 meets from 3 replicas, seed 1 from 5; together the answer is 5."""
    from_replicas = {0: 3, 1: 5}

    def run(datas: list[dict]) -> list[dict]:
        out = []
        for d in datas:
            n = d["cluster"]["replicas"]
            per_seed = [{"x": 1.0, "meets": n >= from_replicas[s], "worst_ratio": 0.5 if n >= from_replicas[s] else 2.0}
                        for s in (0, 1)]
            out.append(across_seeds(per_seed, [0, 1], []))
        return out

    answer = search_replicas({"cluster": {"replicas": 1}}, run, 16, 1)
    assert answer["replicas"] == 5
    assert {c["replicas"]: c["seeds_met"] for c in answer["candidates"]}[4] == 1


def test_seeds_answer_checked_by_plain_runs(scenario: Path, capsys) -> None:
    assert main(["capacity", str(scenario), "--slo", "ttft_p90=0.02", "--slo", "tpot_p90=0.002", "--seeds", "3",
                 "--max", "16", "--workers", "2", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["seeds"] == [0, 1, 2]
    n = answer["replicas"]
    runs = {(m, s): _p90s(scenario, f"cluster.replicas={m}", f"seed={s}") for m in (n - 1, n) for s in (0, 1, 2)}
    assert all(_meets(runs[n, s]) for s in (0, 1, 2))
    assert not all(_meets(runs[n - 1, s]) for s in (0, 1, 2))
    cand = {c["replicas"]: c for c in answer["candidates"]}[n - 1]
    for seed_row in cand["seeds"]:   # each seed's figures: a plain run's with that seed
        assert seed_row["ttft_p90"] == runs[n - 1, seed_row["seed"]]["ttft_p90"]
    assert cand["ttft_p90"] == max(runs[n - 1, s]["ttft_p90"] for s in (0, 1, 2))
    assert cand["seeds_met"] == sum(_meets(runs[n - 1, s]) for s in (0, 1, 2))


def test_a_scenario_that_draws_nothing_says_the_seeds_agree(tmp_path: Path, capsys) -> None:
    rows = "\n".join(f"{0.001 * i},{40 + i % 7 * 10},{8 + i % 5}" for i in range(60))
    (tmp_path / "t.csv").write_text("arrival,prompt_len,output_len\n" + rows + "\n")
    data = {k: v for k, v in SCENARIO.items() if k != "workload"}
    data["workload"] = {"trace": "t.csv", "format": "csv"}
    path = tmp_path / "trace.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["capacity", str(path), "--slo", "ttft_p90=0.005", "--seeds", "2", "--max", "8"]) == 0
    out = capsys.readouterr().out
    assert "all 2 seeds gave every candidate the same figures" in out and "seeds_met" in out


def test_seeds_agree_reads_every_split() -> None:
    same = {"ttft_p90": 1.0}
    other = {"ttft_p90": 2.0}
    cand = {"replicas": 2, "splits": [{"seeds": [same, same]}, {"seeds": [same, other]}]}
    assert not seeds_agree({"candidates": [cand]}, [SLO("ttft_s", "p90", 1.5)])
    cand["splits"][1]["seeds"] = [other, other]
    assert seeds_agree({"candidates": [cand]}, [SLO("ttft_s", "p90", 1.5)])


@pytest.mark.parametrize("args, message", [
    (["--seeds", "0"], "--seeds: must be 1 .. 1000, got 0"),
    (["--seeds", "2", "--vary", "seed=1,2"], "--seeds: runs each candidate under several seeds"),
    (["--seeds", "3", "--set", "seed=9223372036854775806"], "passes the largest seed"),
])
def test_bad_seeds_exit_2_in_one_line(scenario: Path, capsys, args: list[str], message: str) -> None:
    assert main(["capacity", str(scenario), "--slo", "ttft_p90=0.02", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
