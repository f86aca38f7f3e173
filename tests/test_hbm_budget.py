"""summary.json's hbm_budget: where a tensor-parallel group's HBM goes when the cache is sized from it
(weights, activation reserve, KV blocks, the rest), by hand; absent when num_gpu_blocks is given."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sim.runner import run_scenario
from sim.scenario import scenario_from_dict

ROOT = Path(__file__).resolve().parents[1]
WORK = {"requests": [{"prompt_len": 100, "output_len": 4}]}


def test_the_budget_of_an_int4_7b_on_one_h100_by_hand():
    # 80 GiB = 85,899,345,920 bytes; 0.9 of it usable, 5% of that (3,865,470,566.4) kept for activations;
    # int4 weights 3,864,010,752 bytes (tests/test_weight_quantization.py); 8,294 blocks of 8,388,608 bytes
    r = run_scenario(scenario_from_dict({"model": "TheBloke/Llama-2-7B-AWQ", "hardware": "h100-80gb",
                                         "workload": WORK, "output": {"plots": False}}))
    assert r.summary["hbm_budget"] == {
        "gpus": 1, "hbm_bytes": 85_899_345_920, "weights_bytes": 3_864_010_752,
        "activation_reserve_bytes": 3_865_470_566, "kv_cache_bytes": 8294 * 8_388_608,
        "unused_bytes": 85_899_345_920 - 3_864_010_752 - 3_865_470_566 - 69_575_114_752}


def test_the_budget_of_a_tensor_parallel_group_and_of_a_single_replica_cluster():
    # Llama-3.1-70B in fp16 on two H100s: 171,798,691,840 bytes, 141,107,412,992 of weights, a reserve of
    # 0.05 x 0.9 x that (7,730,941,132.8), 1,102 blocks of 16 x 327,680 bytes (tests/test_cli_run.py)
    data = {"model": "llama-3.1-70b", "hardware": {"name": "h100-80gb", "tensor_parallel": 2}, "workload": WORK,
            "output": {"plots": False}}
    want = {"gpus": 2, "hbm_bytes": 171_798_691_840, "weights_bytes": 141_107_412_992,
            "activation_reserve_bytes": 7_730_941_133, "kv_cache_bytes": 1102 * 5_242_880,
            "unused_bytes": 171_798_691_840 - 141_107_412_992 - 7_730_941_133 - 5_777_653_760}
    assert run_scenario(scenario_from_dict(data)).summary["hbm_budget"] == want
    one = run_scenario(scenario_from_dict({**data, "cluster": {"replicas": 1}}))
    assert one.summary["hbm_budget"] == want


def test_no_budget_where_the_block_count_is_given_and_the_table_where_it_is_not(tmp_path):
    given = {"model": "llama-2-7b", "kv_cache": {"num_gpu_blocks": 64}, "workload": WORK, "output": {"plots": False}}
    assert "hbm_budget" not in run_scenario(scenario_from_dict(given)).summary
    scn = tmp_path / "s.yaml"
    scn.write_text("model: TheBloke/Llama-2-7B-AWQ\nhardware: h100-80gb\n"
                   "workload: {requests: [{prompt_len: 100, output_len: 4}]}\n")
    r = subprocess.run([sys.executable, "-m", "sim.cli", "run", str(scn), "--no-plots", "--out", str(tmp_path / "o")],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "GPU memory of the 1-GPU group (GB)" in r.stdout and "69.58" in r.stdout and "3.86" in r.stdout
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["hbm_budget"]["kv_cache_bytes"] == 69_575_114_752


def test_compare_shows_the_kv_cache_size_where_the_runs_differ_in_it(tmp_path):
    # Llama-2-7B on an H100: 7,148 blocks of 8,388,608 bytes in fp16 (59.96 GB), 8,294 in int4 (69.58 GB)
    scn = tmp_path / "s.yaml"
    scn.write_text("model: llama-2-7b\nhardware: h100-80gb\nworkload: {requests: [{prompt_len: 100, output_len: 4}]}\n")

    def compare(vary: str) -> str:
        r = subprocess.run([sys.executable, "-m", "sim.cli", "compare", str(scn), "--vary", vary], cwd=ROOT,
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return r.stdout

    out = compare("model=llama-2-7b,TheBloke/Llama-2-7B-AWQ")
    assert "KV GB" in out and "59.96" in out and "69.58" in out
    assert "KV GB" not in compare("scheduler.max_num_seqs=8,16")   # the same cache: no column


def test_the_figure_of_the_budget_is_drawn_where_the_summary_has_one(tmp_path):
    scn = tmp_path / "s.yaml"
    scn.write_text("model: llama-2-7b\nhardware: h100-80gb\nworkload: {requests: [{prompt_len: 100, output_len: 4}]}\n")

    def kvsim(*args: str) -> None:
        r = subprocess.run([sys.executable, "-m", "sim.cli", *args], cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr

    kvsim("run", str(scn), "--out", str(tmp_path / "sized"))
    assert (tmp_path / "sized" / "hbm_budget.png").stat().st_size > 1000
    assert "hbm_budget.png" in (tmp_path / "sized" / "report.html").read_text()
    kvsim("run", str(scn), "--out", str(tmp_path / "given"), "--set", "kv_cache.num_gpu_blocks=64")
    assert not (tmp_path / "given" / "hbm_budget.png").exists()
    kvsim("compare", str(scn), "--vary", "model=llama-2-7b,TheBloke/Llama-2-7B-AWQ", "--out", str(tmp_path / "cmp"))
    assert (tmp_path / "cmp" / "hbm_budget.png").stat().st_size > 1000


def test_a_fleet_reports_one_replicas_budget_for_each_pool_sized_from_hbm():
    # Llama-2-13B on an A100-80GB (the quickstart's engine): 13,015,864,320 weights of 2 bytes; 819,200 bytes of
    # KV a token, 13,107,200 a block; (73,443,940,761.6 - 26,031,728,640) / 13,107,200 = 3,617 blocks
    data = {"model": "llama-2-13b", "hardware": "a100-80gb", "workload": WORK, "output": {"plots": False},
            "cluster": {"prefill": {"replicas": 1}, "decode": {"replicas": 2}, "kv_transfer": {"link": "nvlink"}}}
    per = run_scenario(scenario_from_dict(data)).summary["cluster"]["hbm_budget_per_replica"]
    one = {"gpus": 1, "hbm_bytes": 85_899_345_920, "weights_bytes": 26_031_728_640,
           "activation_reserve_bytes": 3_865_470_566, "kv_cache_bytes": 3617 * 13_107_200,
           "unused_bytes": 85_899_345_920 - 26_031_728_640 - 3_865_470_566 - 3617 * 13_107_200}
    assert per == {"prefill": one, "decode": one}
    data["cluster"]["prefill"]["kv_cache"] = {"num_gpu_blocks": 64}   # given: HBM did not size that pool
    assert run_scenario(scenario_from_dict(data)).summary["cluster"]["hbm_budget_per_replica"] == {"decode": one}
    data["kv_cache"] = {"num_gpu_blocks": 64}
    assert "hbm_budget_per_replica" not in run_scenario(scenario_from_dict(data)).summary["cluster"]
