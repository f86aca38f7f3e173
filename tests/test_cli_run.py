"""kvsim run / kv-size / schema through the real CLI entry point."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from sim import load_scenario, run_scenario
from sim.cli import main

ROOT = Path(__file__).resolve().parents[1]
SUMMARY_KEYS = ("num_requests num_finished num_rejected makespan_s output_throughput_tok_s request_throughput "
                "ttft_s tpot_s itl_s e2e_s normalized_latency_s_per_tok kv_usage_mean kv_usage_max "
                "memory_breakdown num_preemptions prefix_cache_hit_rate swapped_blocks num_steps "
                "wall_time_s").split()

INLINE = """
name: inline
model: llama-2-7b
hardware: a100-80gb
kv_cache: {block_size: 16, num_gpu_blocks: 64}
frontend: {enabled: false}   # engine-only: the makespan is the sum of the step times
workload:
  requests:
    - {arrival: 0.0, prompt_len: 10, output_len: 5}
    - {arrival: 0.0, prompt_len: 20, output_len: 3}
"""


def kvsim(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "sim.cli", *args], cwd=cwd, capture_output=True, text=True)


def test_inline_scenario_step_counts_and_tokens(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(INLINE)
    res = run_scenario(load_scenario(f))
    s = res.summary
    # worked by hand in test_engine_exact: 5 steps, 30 prefill tokens, 6 decode tokens, 8 tokens out
    assert s["num_steps"] == 5
    assert res.steps["num_prefill_tokens"].sum() == 30
    assert res.steps["num_decode_tokens"].sum() == 6
    assert s["num_finished"] == 2 and s["num_rejected"] == 0
    assert res.requests["output_tokens"].sum() == 8
    assert s["output_throughput_tok_s"] == pytest.approx(8 / s["makespan_s"])
    assert s["makespan_s"] == pytest.approx(res.steps["duration_s"].sum())
    # blocks: 1 + 2 of 64 at most
    assert s["kv_usage_max"] == pytest.approx(3 / 64)


def test_quickstart_writes_every_output(tmp_path):
    out = tmp_path / "out"
    r = kvsim("run", "scenarios/quickstart.yaml", "--out", str(out), "--set", "workload.limit=150")
    assert r.returncode == 0, r.stderr
    assert "num_finished" in r.stdout
    s = json.loads((out / "summary.json").read_text())
    for k in SUMMARY_KEYS:
        assert k in s, k
    for k in ("ttft_s", "tpot_s", "itl_s", "e2e_s", "normalized_latency_s_per_tok"):
        assert set(s[k]) == {"mean", "p50", "p90", "p99"}
    assert s["num_finished"] + s["num_rejected"] == s["num_requests"] == 150
    assert sum(s["memory_breakdown"].values()) == pytest.approx(1.0)
    reqs = pd.read_csv(out / "requests.csv")
    assert len(reqs) == 150
    for col in ("req_id", "arrival_s", "prompt_tokens", "output_tokens", "first_token_s", "finish_s", "ttft_s",
                "tpot_s", "e2e_s", "num_preemptions", "status"):
        assert col in reqs.columns
    steps = pd.read_parquet(out / "steps.parquet")
    assert len(steps) == s["num_steps"]
    for col in ("start_s", "duration_s", "batch_size", "num_prefill_tokens", "num_decode_tokens", "num_running",
                "num_waiting", "kv_blocks_used"):
        assert col in steps.columns
    for png in ("kv_usage.png", "batch.png", "latency_cdf.png"):
        assert (out / png).stat().st_size > 1000


@pytest.mark.parametrize("where", ["set", "file"])
def test_typo_is_one_line_exit_2(tmp_path, where):
    if where == "set":
        args = ["run", "scenarios/quickstart.yaml", "--set", "scheduler.polcy=fcfs", "--out", str(tmp_path / "o")]
        r = kvsim(*args)
        expect_file = "scenarios/quickstart.yaml"
    else:
        f = tmp_path / "typo.yaml"
        f.write_text(INLINE + "scheduler:\n  polcy: fcfs\n")
        r = kvsim("run", str(f), "--out", str(tmp_path / "o"))
        expect_file = f"{f}:12"  # INLINE starts with a blank line; polcy is line 12
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr
    assert "scheduler.polcy" in lines[0] and expect_file in lines[0] and "unknown key" in lines[0]
    assert not (tmp_path / "o").exists()


def test_same_seed_same_summary(tmp_path):
    outs = []
    for i in range(2):
        out = tmp_path / f"o{i}"
        assert main(["run", "scenarios/quickstart.yaml", "--out", str(out), "--no-plots",
                     "--set", "workload.limit=100"]) == 0
        s = json.loads((out / "summary.json").read_text())
        s.pop("wall_time_s")
        outs.append(json.dumps(s, sort_keys=True))
    assert outs[0] == outs[1]


def test_kv_size_matches_the_seed():
    r = kvsim("kv-size", "--model", "llama-2-13b", "--seq-len", "4096", "--json")
    d = json.loads(r.stdout)
    assert d["bytes_per_token"] == 2 * 40 * 40 * 128 * 2 == 819_200
    assert d["bytes_per_block"] == 13_107_200
    assert d["bytes_per_sequence"] == 3_355_443_200
    d = json.loads(kvsim("kv-size", "--model", "llama-2-13b", "--seq-len", "1000", "--json").stdout)
    assert d["bytes_per_sequence"] == 819_200_000
    text = kvsim("kv-size", "--model", "llama-2-13b", "--seq-len", "4096").stdout
    assert "3.125 GiB" in text and "3,355,443,200" in text


def test_kv_size_says_what_fits_on_a_gpu_group():
    # Llama-2-7B in int4 (3,864,010,752 bytes of weights, tests/test_weight_quantization.py) on one H100:
    # (80 GiB x 0.9 x 0.95 - weights) / 8,388,608 bytes a block = 8,294 blocks, 132,704 tokens, and 32 whole
    # sequences of 4,096 tokens (256 blocks each)
    d = json.loads(kvsim("kv-size", "--model", "llama-2-7b", "--seq-len", "4096", "--weight-dtype", "int4",
                         "--hardware", "h100-80gb", "--json").stdout)
    assert d["weight_bytes"] == 3_864_010_752 and d["weight_dtype"] == "int4"
    budget = d["fits"].pop("hbm_budget")
    assert d["fits"] == {"hardware": "h100-80gb", "tensor_parallel": 1, "gpu_memory_utilization": 0.9,
                         "group_bytes_per_block": 8_388_608, "kv_blocks": 8294, "kv_tokens": 132_704, "sequences": 32}
    assert budget["kv_cache_bytes"] == 8294 * 8_388_608 and budget["weights_bytes"] == 3_864_010_752
    assert sum(budget[k] for k in ("weights_bytes", "activation_reserve_bytes", "kv_cache_bytes",
                                   "unused_bytes")) == budget["hbm_bytes"] == 80 * 1024**3
    # Llama-3.1-70B in fp16 on two: 2 x 80 GiB x 0.9 x 0.95 = 146,887,881,523.2 bytes less 141,107,412,992 of
    # weights leaves 1,102 blocks of 16 x 327,680 bytes
    text = kvsim("kv-size", "--model", "llama-3.1-70b", "--seq-len", "4096", "--hardware", "h100-80gb",
                 "--tensor-parallel", "2").stdout
    assert "1,102 blocks, 17,632 tokens, 4 sequences of 4,096 tokens" in text
    assert "of its 171.80 GB: weights 141.11, activation reserve 7.73, KV cache 5.78, unused 17.18 GB" in text


@pytest.mark.parametrize("args, message", [
    (["--hardware", "h100-80gb"], "--hardware: model weights (131.4 GiB) do not fit in 1 x h100-80gb"),
    (["--hardware", "h100-80gb", "--tensor-parallel", "3"], "--tensor-parallel: 3 does not divide"),
    (["--hardware", "b300"], "--hardware: unknown hardware preset 'b300'"),
    (["--weight-dtype", "int2"], "--weight-dtype: weight_dtype must be one of"),
    (["--hardware", "h100-80gb", "--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization: must be in"),
])
def test_kv_size_refuses_what_cannot_be_sized_in_one_line(args, message):
    r = kvsim("kv-size", "--model", "llama-3.1-70b", "--seq-len", "4096", *args)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and message in lines[0], r.stderr


def test_kv_size_of_a_config_file(tmp_path):
    # Qwen2.5-7B's published config.json: 28 layers, 4 KV heads of 128 (3584 / 28 heads)
    cfg = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
           "num_hidden_layers": 28, "num_key_value_heads": 4, "vocab_size": 152064,
           "max_position_embeddings": 32768, "sliding_window": 131072, "use_sliding_window": False}
    (tmp_path / "qwen").mkdir()
    path = tmp_path / "qwen" / "config.json"
    path.write_text(json.dumps(cfg))
    d = json.loads(kvsim("kv-size", "--model", str(path), "--seq-len", "1000", "--json").stdout)
    assert d["model"] == "qwen" and d["bytes_per_token"] == 2 * 28 * 4 * 128 * 2 == 57_344
    assert d["bytes_per_sequence"] == 57_344_000
    # a window on every layer (no max_window_layers): the cache keeps the window alone, 28 layers x 4,096 tokens
    # x 2,048 bytes a layer and token (vLLM's one sliding group), every token with the hybrid manager off
    path.write_text(json.dumps({**cfg, "use_sliding_window": True, "sliding_window": 4096}))
    d = json.loads(kvsim("kv-size", "--model", str(path), "--seq-len", "10000", "--json").stdout)
    assert d["bytes_per_sequence"] == d["bytes_per_sequence_window_only"] == 28 * 4096 * 2 * 4 * 128 * 2 == 234_881_024
    assert (d["local_attention"], d["local_span"], d["local_layers"]) == ("sliding_window", 4096, 28)
    kept = kvsim("kv-size", "--model", str(path), "--seq-len", "10000", "--json", "--disable-hybrid-kv-cache-manager")
    assert json.loads(kept.stdout)["bytes_per_sequence"] == 57_344 * 10_000
    text = kvsim("kv-size", "--model", str(path), "--seq-len", "10000").stdout
    assert "sliding window: 4,096 tokens on 28 of 28 layers" in text
    assert "a 10,000-token sequence 0.235 GB of KV against 0.573 GB with every token kept" in text


def test_kv_size_unknown_model():
    r = kvsim("kv-size", "--model", "llama-9", "--seq-len", "4")
    assert r.returncode == 2 and r.stderr.startswith("error: --model: unknown model preset")


def test_schema_is_json():
    r = kvsim("schema")
    schema = json.loads(r.stdout)
    assert {"model", "hardware", "kv_cache", "scheduler", "workload", "executor"} <= set(schema["properties"])


def test_steps_csv_equals_the_parquet_table(tmp_path):
    # steps.csv and steps.parquet (both by pyarrow) read back to the in-memory table
    from sim.cli import main
    from sim.runner import run_scenario
    from sim.scenario import load_scenario

    scn = Path(__file__).resolve().parents[1] / "scenarios" / "seed_four_requests.yaml"
    out = tmp_path / "o"
    assert main(["run", str(scn), "--out", str(out), "--no-plots"]) == 0
    ref = run_scenario(load_scenario(str(scn)), check_integrity=False).steps
    pd.testing.assert_frame_equal(pd.read_parquet(out / "steps.parquet"), ref, check_exact=True)
    pd.testing.assert_frame_equal(pd.read_csv(out / "steps.csv"), ref, check_exact=False, rtol=1e-15,
                                  check_dtype=False)   # a column of zeros reads back as integers


def test_json_prints_the_summary_alone_on_stdout(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(INLINE)
    out = tmp_path / "out"
    r = kvsim("run", str(f), "--json", "--out", str(out), "--no-plots")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)                     # nothing else on stdout: it parses whole
    # the two requests worked by hand above: 5 steps, both finished, 8 tokens out
    assert s["num_steps"] == 5 and s["num_finished"] == 2
    assert s["output_throughput_tok_s"] == pytest.approx(8 / s["makespan_s"])
    assert f"wrote 5 files to {out}/" in r.stderr
    written = json.loads((out / "summary.json").read_text())
    assert {k: v for k, v in s.items() if k != "wall_time_s"} == {
        k: v for k, v in written.items() if k != "wall_time_s"}
