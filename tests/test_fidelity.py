"""kvsim fidelity: the measured-runs format, the rebuilt load, the per-stage figures, the CLI.

Expected values come from the ground-truth README's description of the client (rate x duration
requests, 100 prompts cycled, exactly output_len tokens) and from hand arithmetic.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim.errors import KvsimError
from sim.fidelity.evaluate import StageResult, evaluate, next_stage_start, stage_engine, stage_figures
from sim.fidelity.goals import check_goals
from sim.fidelity.rebuild import arrivals, build_requests, poisson_arrivals, prompt_lengths, run_scenario_for
from sim.fidelity.report import text_table
from sim.fidelity.runs import group_runs, hardware_preset, model_preset, read_runs
from sim.runner import run_scenario

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "sim" / "data" / "ground_truth" / "vllm_h100_runs.csv"


def kvsim(*args):
    return subprocess.run([sys.executable, "-m", "sim.cli", *args], cwd=ROOT, capture_output=True, text=True)


def test_shipped_runs_are_read_with_their_settings():
    stages = read_runs(RUNS)
    assert [(s.run, s.stage) for s in stages][:2] == [("llama-2-7b-tp1-codegen", 0), ("llama-2-7b-tp1-codegen", 1)]
    s = stages[0]
    assert (s.model, s.hardware, s.tensor_parallel, s.num_gpu_blocks) == ("llama-2-7b", "h100-80gb", 1, 7463)
    assert s.num_requests == 3000 and s.num_prompts == 100 and s.output_len == 247
    assert stages[2].model == "llama-2-70b" and stages[2].num_gpu_blocks is None
    assert stages[4].model == "codellama-34b" and stages[4].tensor_parallel == 2
    assert len(group_runs(stages)) == 3
    assert model_preset("codellama/CodeLlama-34b-Instruct-hf") == "codellama-34b"


def test_prompt_lengths_follow_the_measured_quantiles():
    q = {"mean": 591.63, "p10": 584.9, "p50": 591.0, "p90": 600.0, "p99": 603.01}
    lengths = prompt_lengths(q, 100)
    assert lengths.sum() == 59163                       # mean x 100, exactly
    assert abs(np.percentile(lengths, 10) - 584.9) <= 1.5
    assert abs(np.percentile(lengths, 50) - 591.0) <= 1.5
    assert abs(np.percentile(lengths, 90) - 600.0) <= 1.5


def test_arrivals_fill_the_stage_exactly():
    t = arrivals(np.random.default_rng(1), 600.0, 600.0, 6000)
    assert len(t) == 6000 and np.all(np.diff(t) >= 0)
    assert t[0] > 600.0 and t[-1] == pytest.approx(1200.0)
    # Poisson: the gaps' coefficient of variation is about 1
    gaps = np.diff(t)
    assert 0.9 < gaps.std() / gaps.mean() < 1.1


def test_poisson_load_fills_whole_seconds():
    """inference-perf's poisson load: n ~ Poisson(rate) requests each whole second, spread over it with the
    last one on the second; exactly the requests asked for."""
    t = poisson_arrivals(np.random.default_rng(2), 100.0, 5.0, 3000)
    assert len(t) == 3000 and np.all(np.diff(t) > 0) and t[0] > 100.0
    seconds = np.ceil(t - 100.0)                     # arrival in (100 + k - 1, 100 + k]: second k
    full = np.unique(seconds)[:-1]                   # (the last second may be cut at 3,000)
    last_of = {k: t[seconds == k].max() for k in full}
    assert all(last_of[k] == 100.0 + k for k in full)
    counts = np.bincount(seconds.astype(int))[1:-1]  # requests per whole second, empty ones included
    assert 4.7 < counts.mean() < 5.3 and 0.8 < counts.var() / counts.mean() < 1.2   # Poisson: variance = mean


def test_stages_start_where_they_are_told_with_the_same_draws():
    stages = group_runs(read_runs(RUNS))["llama-2-7b-tp1-codegen"]
    back_to_back, windows, _ = build_requests(stages, seed=3)
    shifted, shifted_windows, _ = build_requests(stages, seed=3, starts=[0.0, 612.5])
    assert shifted_windows == [(0.0, 600.0), (612.5, 1212.5)]
    assert shifted[:3000] == back_to_back[:3000]
    assert [r["arrival"] - 12.5 for r in shifted[3000:]] == pytest.approx([r["arrival"] for r in back_to_back[3000:]])
    poisson = [dataclasses.replace(s, load="poisson") for s in stages]
    reqs, pw, _ = build_requests(poisson, seed=3, starts=[0.0, 700.0])
    assert len(reqs) == 9000 and pw[1][0] == 700.0 and min(r["arrival"] for r in reqs[3000:]) > 700.0
    assert pw[0] == (0.0, max(600.0, max(r["arrival"] for r in reqs[:3000])))


def test_next_stage_starts_once_the_last_request_has_finished():
    """The client waits for every request of a stage, sleeps its 1 s stage interval and starts the next
    stage's timer 1 s ahead: 2 s after the last completion (and never before the stage's last arrival)."""
    reqs = pd.DataFrame({"arrival_s": [1.0, 9.0, 9.5, 11.0], "status": ["FINISHED", "FINISHED", "REJECTED", "FINISHED"],
                         "ttft_s": [0.1, 0.2, float("nan"), 0.1], "e2e_s": [3.0, 4.0, float("nan"), 50.0]})
    assert next_stage_start(reqs, (0.0, 10.0)) == 13.0 + 2.0      # 9 + 4; request at 11 s is the next stage's
    assert next_stage_start(reqs.iloc[:1], (0.0, 10.0)) == 10.0 + 2.0
    assert next_stage_start(reqs.iloc[:0], (0.0, 10.0)) == 12.0


def test_a_stage_waits_for_the_one_before_to_drain():
    """Replayed as the client ran them: at 5 req/s the 7B's last stage-0 request finishes about 2 s after it
    arrived, so stage 1 starts about 2 + 2 s after stage 0's last arrival; at 60 req/s (far past what one
    H100 serves) stage 0 leaves a backlog, and stage 1 waits for all of it."""
    light = [dataclasses.replace(s, duration_s=10.0) for s in group_runs(read_runs(RUNS))["llama-2-7b-tp1-codegen"]]
    heavy = [dataclasses.replace(light[0], rate_req_s=60.0), light[1]]
    for stages, low, high in ((light, 2.5, 7.0), (heavy, 20.0, 300.0)):
        first, second = evaluate(stages, [0])
        gap = second.windows[0][0] - first.windows[0][1]
        assert low < gap < high, gap
        assert first.windows[0][0] == 0.0 and first.windows[0][1] == pytest.approx(10.0)


def test_runs_files_give_the_load_and_ignore_eos(tmp_path):
    lines = RUNS.read_text().splitlines()
    lines[1] = lines[1].replace(",constant,5.0,", ",Poisson,5.0,", 1).replace(",True,3000,", ",false,3000,", 1)
    lines[3] = lines[3].replace(",constant,8.0,", ",,8.0,", 1)
    f = tmp_path / "r.csv"
    f.write_text("\n".join(lines) + "\n")
    stages = read_runs(f)
    assert (stages[0].load, stages[0].ignore_eos) == ("poisson", False)
    assert (stages[1].load, stages[1].ignore_eos) == ("constant", True)
    assert stages[2].load == "constant"                             # an empty cell: the client's default
    r = StageResult(stages[0], predictions=[dict(stages[0].measured)])
    assert "ignore_eos false: replayed with exactly output_len tokens" in text_table([r])


def test_a_runs_file_may_give_pipeline_stages(tmp_path):
    """An optional pipeline_parallel column: the 70B run replayed as 2 stages of TP 2 (its blocks sized from
    the four GPUs' memory), both stages alike; a value out of range names the file, line and column."""
    lines = RUNS.read_text().splitlines()
    head = lines[0] + ",pipeline_parallel"
    rows = [line.replace(",4,H100-80GB-SXM,", ",2,H100-80GB-SXM,", 1) + ",2" for line in lines[1:] if "70b" in line]
    f = tmp_path / "pp.csv"
    f.write_text("\n".join([head, *rows]) + "\n")
    stages = read_runs(f)
    assert [(s.tensor_parallel, s.pipeline_parallel) for s in stages] == [(2, 2), (2, 2)]
    scn, _, _ = run_scenario_for(stages[:1], seed=0)
    assert (scn.hardware_spec.tensor_parallel, scn.hardware_spec.pipeline_parallel, scn.hardware_spec.gpus) == (2, 2, 4)
    from sim.fidelity.rebuild import NON_KV_GIB_PER_GPU

    assert scn.kv_cache.activation_reserve_gb == pytest.approx(4 * NON_KV_GIB_PER_GPU)   # every GPU of the server
    f.write_text("\n".join([head, rows[0][:-1] + "65"]) + "\n")
    with pytest.raises(KvsimError, match="pp.csv:2: pipeline_parallel: must be 1 .. 64, got 65"):
        read_runs(f)


def test_a_runs_file_may_give_data_parallel_engines(tmp_path):
    """An optional data_parallel column (vLLM's --data-parallel-size): the 7B run's server as 2 engines behind
    vLLM's balancer, each with the logged 7,463 blocks; a dense model's engines are plain replicas, a mixture
    of experts' the ranks of one data-parallel engine. The engines' running requests add up in the report."""
    lines = RUNS.read_text().splitlines()
    head = lines[0] + ",data_parallel"
    rows = [line + ",2" for line in lines[1:] if "7b" in line]
    f = tmp_path / "dp.csv"
    f.write_text("\n".join([head, *rows]) + "\n")
    stages = read_runs(f)
    assert [s.data_parallel for s in stages] == [2, 2]
    scn, _, _ = run_scenario_for(stages[:1], seed=0)
    assert (scn.cluster.replicas, scn.cluster.data_parallel, scn.cluster.router.policy) == (2, False, "dp_balance")
    assert scn.kv_cache.num_gpu_blocks == 7463
    moe = dataclasses.replace(stages[0], model="mixtral-8x7b", num_gpu_blocks=None)
    scn, _, _ = run_scenario_for([moe], seed=0)
    assert (scn.cluster.replicas, scn.cluster.data_parallel) == (2, True)
    f.write_text("\n".join([head, rows[0][:-1] + "0"]) + "\n")
    with pytest.raises(KvsimError, match="dp.csv:2: data_parallel: must be 1 .. 64, got 0"):
        read_runs(f)


def test_engines_behind_one_server_add_up_their_running_requests():
    """Two engines' steps (replica 0: 4 running for 1 s then 2 for 1 s; replica 1: 6 running for 2 s): time
    means 3 and 6, so 9 running in all."""
    steps = pd.DataFrame({"replica": [0, 0, 1], "start_s": [0.0, 1.0, 0.0], "duration_s": [1.0, 1.0, 2.0],
                          "num_running": [4, 2, 6], "num_waiting": [1, 0, 0], "kv_usage": [0.1, 0.2, 0.3],
                          "num_preempted": [0, 1, 0]})
    engine = stage_engine(steps, (0.0, 10.0))
    assert engine == {"running_mean": 9.0, "waiting_mean": 0.5, "kv_usage_peak": 0.3, "preemptions": 1}


def test_requests_cycle_the_prompts_and_stages_run_back_to_back():
    stages = group_runs(read_runs(RUNS))["llama-2-7b-tp1-codegen"]
    reqs, windows, refused = build_requests(stages, seed=3)
    assert refused == [0, 0]
    assert len(reqs) == 3000 + 6000
    assert windows == [(0.0, 600.0), (600.0, 1200.0)]
    assert all(r["output_len"] == 247 for r in reqs)
    # request i sends prompt i mod 100: the same content, one id per 16 tokens (the whole prompt shareable)
    assert reqs[0]["hash_ids"] == reqs[100]["hash_ids"] == reqs[4200]["hash_ids"]
    assert reqs[7]["prompt_len"] == reqs[107]["prompt_len"]
    assert len(reqs[7]["hash_ids"]) == -(-reqs[7]["prompt_len"] // 16)
    # 10 groups of 10 prompts share a system prompt of 100 client tokens: on the server BOS + 100 x 590.63 /
    # 566 = 105 tokens, so their first 6 blocks (96 tokens); nothing after, and nothing across groups
    firsts = {tuple(r["hash_ids"][:6]) for r in reqs[:100]}
    assert len(firsts) == 10
    assert all(sum(tuple(r["hash_ids"][:6]) == f for r in reqs[:100]) == 10 for f in firsts)
    assert len({r["hash_ids"][6] for r in reqs[:100]}) == 100
    assert sum(r["prompt_len"] for r in reqs[:100]) == 59163
    assert sum(1 for r in reqs if r["arrival"] <= 600.0) == 3000


def test_requests_that_cannot_fit_the_context_are_refused_not_replayed():
    """vLLM's API server answers 400 when prompt + max_tokens exceeds max_model_len: such requests take
    their turn in the prompt cycle but never reach the engine."""
    from dataclasses import replace

    stage = group_runs(read_runs(RUNS))["llama-2-7b-tp1-codegen"][0]   # 3000 requests over 100 prompts
    lengths = prompt_lengths(stage.prompt_quantiles, 100)
    limit = int(np.median(lengths))
    long = replace(stage, output_len=stage.max_model_len - limit)   # prompts longer than the median refused
    too_long = int((lengths > limit).sum())
    assert 0 < too_long < 100
    reqs, windows, refused = build_requests([long], seed=5)
    assert refused == [30 * too_long]                   # 30 full cycles of the 100 prompts
    assert len(reqs) == 3000 - 30 * too_long
    assert all(r["prompt_len"] + r["output_len"] <= stage.max_model_len for r in reqs)
    prompts = [tuple(r["hash_ids"]) for r in reqs]
    assert len(set(prompts)) == 100 - too_long           # each refused prompt is refused every time
    assert {prompts.count(p) for p in set(prompts)} == {30}
    none_fit = replace(stage, output_len=stage.max_model_len)
    scn, windows, refused = run_scenario_for([none_fit], seed=0)
    assert scn is None and refused == [3000] and windows == [(0.0, 600.0)]


def test_rebuilt_scenario_names_only_the_server_settings():
    stages = group_runs(read_runs(RUNS))["llama-2-70b-tp4-general"]
    scn, _, _ = run_scenario_for(stages, seed=0)
    assert scn.hardware_spec.tensor_parallel == 4 and scn.hardware_spec.name == "h100-80gb"
    assert scn.kv_cache.prefix_caching and scn.scheduler.chunked_prefill
    assert scn.scheduler.max_num_seqs == 128 and scn.scheduler.max_num_batched_tokens == 2048
    assert scn.kv_cache.num_gpu_blocks is None   # not logged: kvsim's own estimate
    assert scn.executor.calibration is None      # the hardware's shipped calibration, by default
    assert scn.model_spec.max_model_len == 4096



def _llama_params(layers: int, hidden: int, kv_heads: int, head_dim: int, inter: int, vocab: int) -> int:
    """Parameters of a Llama-style model from its config.json (untied embeddings, gated MLP, RMSNorm)."""
    kv = kv_heads * head_dim
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * inter + 2 * hidden
    return 2 * vocab * hidden + layers * per_layer + hidden


def _blocks_by_hand(tp: int, params: int, layers: int, kv_heads: int, head_dim: int, non_kv_gib: float) -> int:
    """KV blocks of 16 tokens (fp16) in tp x 80 GiB at 0.9 utilisation after the weights and non_kv_gib a GPU."""
    gib = 2**30
    free = 0.9 * 80 * gib * tp - 2 * params - int(non_kv_gib * tp * gib)
    return int(free // (16 * layers * 2 * kv_heads * head_dim * 2))


def test_unlogged_servers_get_what_the_7b_log_leaves_per_gpu():
    """The 7B's logged 7,463 blocks leave 1.14 GiB a GPU beside the weights at 0.9 utilisation (6.74e9
    parameters: 12.55 GiB); a server without a logged count keeps that much a GPU (not kvsim's generic 5%
    of the card), and the 7B rebuilt without its log gets its logged count back."""
    from sim.fidelity.rebuild import NON_KV_GIB_PER_GPU
    from sim.runner import gpu_blocks
    p7 = _llama_params(32, 4096, 32, 128, 11008, 32000)
    assert p7 == 6_738_415_616   # Llama-2-7B's published parameter count
    assert _blocks_by_hand(1, p7, 32, 32, 128, NON_KV_GIB_PER_GPU) == 7463
    stages = read_runs(RUNS)
    unlogged = [dataclasses.replace(s, num_gpu_blocks=None) for s in group_runs(stages)["llama-2-7b-tp1-codegen"]]
    scn, _, _ = run_scenario_for(unlogged, seed=0)
    assert gpu_blocks(scn) == 7463
    p70 = _llama_params(80, 8192, 8, 128, 28672, 32000)
    scn, _, _ = run_scenario_for(group_runs(stages)["llama-2-70b-tp4-general"], seed=0)
    assert gpu_blocks(scn) == _blocks_by_hand(4, p70, 80, 8, 128, NON_KV_GIB_PER_GPU)
    assert gpu_blocks(scn) > _blocks_by_hand(4, p70, 80, 8, 128, 0.05 * 0.9 * 80)   # the generic reserve
    result = evaluate(stages, seeds=[0], max_duration_s=5, runs=["llama-2-70b-tp4-general"])[0]
    assert (result.kv_blocks, result.kv_blocks_estimated) == (gpu_blocks(scn), True)
    assert f"{result.kv_blocks:,} KV blocks (estimated)" in text_table([result])

def test_stage_figures_by_hand():
    # two requests in the stage, one after it; output_len 5
    df = pd.DataFrame({"arrival_s": [1.0, 2.0, 11.0], "status": ["FINISHED"] * 3,
                       "ttft_s": [0.1, 0.3, 9.0], "e2e_s": [1.0, 2.0, 9.0]})
    f = stage_figures(df, (0.0, 10.0), output_len=5)
    assert f["ttft_mean"] == pytest.approx(0.2) and f["e2e_mean"] == pytest.approx(1.5)
    assert f["decode_per_token"] == pytest.approx((1.5 - 0.2) / 4)
    assert f["req_per_s"] == pytest.approx(2 / 4.0)      # last completion at 2.0 + 2.0 = 4.0 s
    assert f["e2e_p50"] == pytest.approx(1.5)



def test_stage_engine_by_hand():
    """Steps starting in [10, 20): durations 1, 3 with 4 and 8 running -> (4 x 1 + 8 x 3) / 4 = 7, with
    2 and 0 waiting -> 2 / 4 = 0.5; the peak KV share of those two; their preemptions summed. Steps outside
    the window do not count."""
    steps = pd.DataFrame({"start_s": [9.0, 10.0, 11.0, 20.0], "duration_s": [1.0, 1.0, 3.0, 1.0],
                          "num_running": [50, 4, 8, 50], "num_waiting": [9, 2, 0, 9],
                          "kv_usage": [0.9, 0.25, 0.5, 0.99], "num_preempted": [5, 1, 2, 7]})
    assert stage_engine(steps, (10.0, 20.0)) == {"running_mean": 7.0, "waiting_mean": 0.5, "kv_usage_peak": 0.5,
                                                 "preemptions": 3}
    assert stage_engine(steps, (30.0, 40.0))["preemptions"] == 0
    r = StageResult(read_runs(RUNS)[0], engine=[
        {"running_mean": 7.0, "waiting_mean": 0.5, "kv_usage_peak": 0.5, "preemptions": 3},
        {"running_mean": 9.0, "waiting_mean": 1.5, "kv_usage_peak": 0.25, "preemptions": 5}])
    r.predictions = [dict.fromkeys(r.stage.measured, 1.0)] * 2
    assert ("replayed engine: 8.0 requests running, 1.0 waiting (time means), KV peak 50.0%, 3..5 preemptions"
            in text_table([r]))
    assert "from t =" not in text_table([r])              # a first stage: from 0
    r.windows = [(603.94, 1203.94), (604.21, 1204.21)]     # a later stage, started when its predecessor drained
    assert "(5 req/s constant, 2 seed(s), from t = 603.9 .. 604.2 s)" in text_table([r])
    assert r.to_json()["windows_s"] == [[603.94, 1203.94], [604.21, 1204.21]]

def test_parity_figure_draws_any_number_of_runs(tmp_path):
    """Twelve runs (more than the markers there are): each run drawn in a marker and colour of its own,
    one legend entry per run once per-point entries would not fit; the figure is a PNG."""
    from sim.fidelity.report import _run_style, parity_figure

    base = read_runs(RUNS)[0]
    results = []
    for i in range(12):
        r = StageResult(dataclasses.replace(base, run=f"run-{i:02d}"))
        r.predictions = [dict(base.measured)] * 2
        results.append(r)
    parity_figure(results, tmp_path / "parity.png")
    assert (tmp_path / "parity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len({_run_style(i) for i in range(90)}) == 90


def test_goals_flag_false_saturation():
    stage = read_runs(RUNS)[3]                     # 70B at 20 req/s: measured mean TTFT 0.121 s
    r = StageResult(stage, [dict(stage.measured) | {"ttft_mean": 3 * 0.12127 + 0.06}])
    rows = check_goals([r])
    assert not next(g for g in rows if g["goal"] == "no false saturation")["ok"]
    ok = StageResult(stage, [dict(stage.measured)])
    assert all(g["ok"] for g in check_goals([ok]))   # a perfect prediction meets every goal


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace("ttft_s_mean,", "ttft_mean,", 1), "missing column(s): ttft_s_mean"),
    (lambda t: t.replace(",5.0,600,", ",five,600,", 1), "rate_req_s: not a number"),
    (lambda t: t.replace("meta-llama/Llama-2-7b-hf", "acme/Giant-9000", 1), "model: no kvsim preset"),
    (lambda t: t.splitlines()[0] + "\n", "no runs (only a header)"),
    (lambda t: t.replace(",constant,5.0,", ",trace,5.0,", 1), "load: 'trace' cannot be rebuilt"),
    (lambda t: t.replace(",True,3000,", ",maybe,3000,", 1), "ignore_eos: expected true or false, got 'maybe'"),
])
def test_bad_runs_files_exit_2_with_one_line(tmp_path, edit, message):
    f = tmp_path / "runs.csv"
    f.write_text(edit(RUNS.read_text()))
    r = kvsim("fidelity", str(f), "--seeds", "1", "--duration", "5")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and str(f) in lines[0]


def test_read_runs_names_the_line_and_column(tmp_path):
    lines = RUNS.read_text().splitlines()
    lines[3] = lines[3].replace(",constant,8.0,", ",constant,-8.0,", 1)   # the 4th line: 70B stage 0
    f = tmp_path / "r.csv"
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(KvsimError) as e:
        read_runs(f)
    assert e.value.where == f"{f}:4" and "rate_req_s" in e.value.what


def test_cli_quick_subset_meets_the_decode_goal(tmp_path):
    """The 7B run, cut to 60 s a stage, 2 seeds: mean decode time per token within the goal's +-10%."""
    out = tmp_path / "fid"
    r = kvsim("fidelity", str(RUNS), "--run", "llama-2-7b-tp1-codegen", "--duration", "60", "--seeds", "2",
              "--json", "--out", str(out))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [s["stage"] for s in doc["stages"]] == [0, 1]
    for s in doc["stages"]:
        assert len(s["seeds"]) == 2
        lo, hi = s["spread"]["decode_per_token"]
        assert lo <= s["predicted"]["decode_per_token"] <= hi
        assert abs(s["error"]["decode_per_token"]) <= 0.10
        assert not s["falsely_saturated"]
        assert (s["kv_blocks"], s["kv_blocks_estimated"]) == (7463, False)   # the server log's count
        assert len(s["engine"]) == 2 and all(e["preemptions"] == 0 and 0 < e["kv_usage_peak"] < 1 for e in s["engine"])
    assert {p.name for p in out.iterdir()} == {"fidelity.csv", "fidelity.json", "parity.png"}
    table = pd.read_csv(out / "fidelity.csv")
    assert len(table) == 2 * 10 and set(table["metric"]) >= {"ttft_mean", "decode_per_token", "req_per_s"}


def test_frontend_off_gives_engine_only_latencies(tmp_path):
    on = kvsim("fidelity", str(RUNS), "--run", "llama-2-7b-tp1-codegen", "--duration", "20", "--seeds", "1", "--json")
    off = kvsim("fidelity", str(RUNS), "--run", "llama-2-7b-tp1-codegen", "--duration", "20", "--seeds", "1", "--json",
                "--set", "frontend.enabled=false")
    assert on.returncode == off.returncode == 0
    from sim.scenario import FrontendConfig

    fe = FrontendConfig()
    a, b = json.loads(on.stdout)["stages"][0]["predicted"], json.loads(off.stdout)["stages"][0]["predicted"]
    # the frontend adds its input + output latency to TTFT (the engine sees the same load a few ms later)
    assert a["ttft_mean"] - b["ttft_mean"] == pytest.approx(fe.input_latency_s + fe.output_latency_s, abs=1.5e-3)


def test_fidelity_leaves_nothing_behind_on_bad_out(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    r = kvsim("fidelity", str(RUNS), "--out", str(f), "--seeds", "1", "--duration", "5")
    assert r.returncode == 2 and "--out must be a folder" in r.stderr
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_a_failing_writer_leaves_the_folder_as_it_was(tmp_path):
    """write_together: the three result files go in together; one that fails to render leaves the earlier
    files as they were and no temporary file behind."""
    from sim.output import write_together

    (tmp_path / "fidelity.csv").write_text("old\n")

    def broken(path):
        raise KeyError("a figure that cannot be drawn")

    with pytest.raises(KeyError):
        write_together(tmp_path, {"fidelity.csv": lambda p: p.write_text("new\n"), "parity.png": broken})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fidelity.csv"]
    assert (tmp_path / "fidelity.csv").read_text() == "old\n"
    write_together(tmp_path, {"fidelity.csv": lambda p: p.write_text("new\n"), "a.json": lambda p: p.write_text("{}")})
    assert (tmp_path / "fidelity.csv").read_text() == "new\n" and (tmp_path / "a.json").exists()


def test_workers_give_the_same_results_in_the_same_order():
    """Two runs x two seeds replayed in two processes: every stage's per-seed figures equal the in-process
    replay's, in seed order."""
    stages = read_runs(RUNS)
    picked = ["llama-2-7b-tp1-codegen", "codellama-34b-tp2-general"]
    inline = evaluate(stages, seeds=[0, 1], max_duration_s=5, runs=picked)
    pooled = evaluate(stages, seeds=[0, 1], max_duration_s=5, runs=picked, workers=2)
    assert [r.stage for r in pooled] == [r.stage for r in inline] and len(inline) == 4
    for a, b in zip(inline, pooled):
        assert a.predictions == b.predictions and a.refused == b.refused and a.engine == b.engine
        assert (a.kv_blocks, a.kv_blocks_estimated) == (b.kv_blocks, b.kv_blocks_estimated)
    # the two seeds differ (each replay is seeded on its own, not one stream shared by the pool)
    assert inline[0].predictions[0] != inline[0].predictions[1]


def test_workers_must_be_positive(tmp_path):
    r = kvsim("fidelity", str(RUNS), "--workers", "0")
    assert r.returncode == 2 and "--workers" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("gpu, preset", [
    ("H100-80GB-SXM", "h100-80gb"), ("NVIDIA H100 80GB HBM3", "h100-80gb"), ("A100-SXM4-40GB", "a100-40gb"),
    ("H200", "h200-141gb"), ("NVIDIA L40S", "l40s"),
    ("H100 PCIe", None), ("NVIDIA H100 NVL", None),   # other bandwidth and clocks than the SXM presets
])
def test_runs_files_name_gpus_as_nvidia_smi_does(gpu, preset):
    assert hardware_preset(gpu) == preset


def test_the_measured_servers_cpu_offload_changes_nothing_on_these_runs():
    """The runs' server had 8 GiB of CPU KV offload; replayed with that host tier, every figure of the 7B run
    (whose 8 GiB hold 1,024 blocks against its 7,463 GPU blocks, a cache that never fills) is unchanged
    (docs/fidelity.md)."""
    stages = read_runs(RUNS)
    picked = ["llama-2-7b-tp1-codegen"]
    plain = evaluate(stages, seeds=[0], max_duration_s=60, runs=picked)
    offload = evaluate(stages, seeds=[0], max_duration_s=60, runs=picked, overrides=["kv_cache.cpu_offload_gib=8"])
    for a, b in zip(plain, offload):
        assert a.predictions == b.predictions and a.engine == b.engine


def _concurrent_runs(tmp_path: Path, levels=(2, 6), counts=(20, 30), blank_rate=True) -> Path:
    """The 7B's two stages as inference-perf's concurrent load: num_requests by concurrency_level workers."""
    lines = RUNS.read_text().splitlines()
    header = lines[0] + ",concurrency_level,num_requests"
    rows = []
    for line, level, count in zip(lines[1:3], levels, counts):
        row = line.replace(",constant,5.0,600,", ",concurrent,,,").replace(",constant,10.0,600,", ",concurrent,,,")
        rows.append((row if blank_rate else line.replace(",constant,", ",concurrent,", 1)) + f",{level},{count}")
    f = tmp_path / "conc.csv"
    f.write_text("\n".join([header, *rows]) + "\n")
    return f


def test_concurrent_load_is_read(tmp_path):
    stages = read_runs(_concurrent_runs(tmp_path))
    assert [(s.load, s.concurrency, s.num_requests, s.rate_req_s) for s in stages] == \
        [("concurrent", 2, 20, 0.0), ("concurrent", 6, 30, 0.0)]
    f = _concurrent_runs(tmp_path)
    f.write_text(f.read_text().replace(",2,20\n", ",,20\n"))
    with pytest.raises(KvsimError, match=r"conc.csv:2.*concurrency_level: a concurrent load needs it"):
        read_runs(f)


def test_concurrent_stages_replayed_by_their_workers(tmp_path):
    # stage 0: 20 requests, all ready at 0, at most 2 in flight, each send when a slot frees (the first two
    # at 0); stage 1 starts 2 s after stage 0's last response, 30 requests, at most 6 in flight
    stages = read_runs(_concurrent_runs(tmp_path))
    first, second = evaluate(stages, [0])
    assert first.windows[0][0] == 0.0 and second.windows[0][0] > first.windows[0][1]
    scn, windows, _ = run_scenario_for(stages, 0, starts=[0.0, second.windows[0][0]])
    q = run_scenario(scn, check_integrity=False).requests
    sends, ends = q["arrival_s"].to_numpy(), (q["arrival_s"] + q["e2e_s"]).to_numpy()
    s0 = sends < second.windows[0][0]
    assert s0.sum() == 20 and (~s0).sum() == 30
    for mask, level in ((s0, 2), (~s0, 6)):
        order, done = np.sort(sends[mask]), np.sort(ends[mask])
        assert (order[:level] == order[0]).all()
        np.testing.assert_allclose(order[level:], done[:-level], rtol=0, atol=1e-12)
    assert second.windows[0][0] == pytest.approx(ends[s0].max() + 2.0, abs=1e-9)
    text = text_table([first, second])
    assert "(20 requests by 2 concurrent, 1 seed(s)" in text and "(30 requests by 6 concurrent" in text
    assert first.to_json()["concurrency"] == 2 and np.isfinite(second.to_json()["windows_s"][0][1])


METRIC_AND_PROMPT_COLUMNS = ["ttft_s_mean", "ttft_s_median", "ttft_s_p90", "ttft_s_p99", "e2e_s_mean", "e2e_s_median",
                             "e2e_s_p90", "e2e_s_p99", "decode_s_per_token_mean", "achieved_req_s", "prompt_len_mean",
                             "prompt_len_median", "prompt_len_p10", "prompt_len_p90", "prompt_len_p99"]


def _planned(tmp_path, drop: list[str], name: str = "plan.csv") -> Path:
    """The shipped runs file without the columns ``drop`` (a benchmark not yet run)."""
    f = tmp_path / name
    pd.read_csv(RUNS).drop(columns=drop).to_csv(f, index=False)
    return f


def test_a_row_without_measurements_is_a_prediction_only(tmp_path):
    """No measured figures and no server-side prompt lengths: each prompt is the client's system prompt and
    question plus a BOS token (100 + 466 + 1 = 567 for the 7B codegen run), nothing is measured, and the
    row asks for no goal."""
    stages = read_runs(_planned(tmp_path, METRIC_AND_PROMPT_COLUMNS))
    s = stages[0]
    assert not s.has_measurements and s.prompts_from_client
    assert s.prompt_quantiles == {"mean": 567.0, "p10": 567.0, "p50": 567.0, "p90": 567.0, "p99": 567.0}
    assert all(np.isnan(v) for v in s.measured.values())
    r = StageResult(s, [dict.fromkeys(s.measured, 1.0)])
    assert check_goals([r]) == [] and not r.falsely_saturated and np.isnan(r.error("ttft_mean"))
    assert len(build_requests([s], seed=0)[0]) == 3000
    assert {q["prompt_len"] for q in build_requests([s], seed=0)[0]} == {567}


def test_a_prediction_does_not_read_the_measured_figures(tmp_path):
    """The same run with and without its measured columns (prompt lengths kept): the same predictions, bit
    for bit; the table shows '-' for what was not measured and the CLI checks no goal."""
    only_inputs = _planned(tmp_path, METRIC_AND_PROMPT_COLUMNS[:10])
    picked = ["llama-2-7b-tp1-codegen"]
    with_figures = evaluate(read_runs(RUNS), seeds=[0], max_duration_s=5, runs=picked)
    without = evaluate(read_runs(only_inputs), seeds=[0], max_duration_s=5, runs=picked)
    assert [r.predictions for r in without] == [r.predictions for r in with_figures]
    assert "TTFT mean             -" in text_table(without)
    out = tmp_path / "out"
    r = kvsim("fidelity", str(only_inputs), "--run", picked[0], "--duration", "5", "--seeds", "1", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "no measured figures: predictions only, no goal checked" in r.stdout
    assert (out / "parity.png").stat().st_size > 0
    doc = json.loads((out / "fidelity.json").read_text())
    assert doc["goals_total"] == 0 and doc["stages"][0]["measured"]["ttft_mean"] is None


def test_measured_columns_and_prompt_lengths_come_all_or_none(tmp_path):
    """A header with some of a group's columns names the others (a misspelt one is not taken as not measured);
    a row with some of the five prompt lengths names those it lacks."""
    for dropped in ("prompt_len_p99", "achieved_req_s"):
        with pytest.raises(KvsimError) as e:
            read_runs(_planned(tmp_path, [dropped]))
        assert e.value.what.startswith(f"missing column(s): {dropped} ")
    table = pd.read_csv(RUNS)
    table.loc[0, "prompt_len_p99"] = None
    f = tmp_path / "gap.csv"
    table.to_csv(f, index=False)
    r = kvsim("fidelity", str(f), "--seeds", "1", "--duration", "5")
    assert r.returncode == 2
    assert r.stderr.strip() == (f"error: {f}:2: prompt_len_p99: give the five server-side prompt lengths, or none "
                                "(then the client's, plus a BOS token)")
