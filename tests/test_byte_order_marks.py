"""Files saved with a UTF-8 byte-order mark (Excel's "CSV UTF-8", Notepad, some exporters) read as the same
file without one: scenarios, runs files, model configs and traces. Before, the mark became part of the first
column's name or made the JSON invalid, and the file was refused."""

from __future__ import annotations

import json
from pathlib import Path

from sim.fidelity.runs import read_runs
from sim.hf_config import load_hf_config
from sim.runner import run_scenario
from sim.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
BOM = b"\xef\xbb\xbf"


def _with_bom(src: bytes, path: Path) -> Path:
    path.write_bytes(BOM + src)
    return path


def test_a_runs_file_with_a_byte_order_mark_reads_as_without(tmp_path):
    src = ROOT / "sim/data/ground_truth/vllm_h100_runs.csv"
    marked = read_runs(_with_bom(src.read_bytes(), tmp_path / "runs.csv"))
    assert marked == read_runs(src) and len(marked) == 6


def test_a_config_json_with_a_byte_order_mark_reads_as_without(tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
           "num_hidden_layers": 32, "num_key_value_heads": 32, "vocab_size": 32000, "max_position_embeddings": 4096}
    plain = tmp_path / "plain" / "config.json"
    plain.parent.mkdir()
    plain.write_text(json.dumps(cfg))
    (tmp_path / "marked").mkdir()
    marked = _with_bom(json.dumps(cfg).encode(), tmp_path / "marked" / "config.json")
    assert load_hf_config(marked).model_dump(exclude={"name"}) == load_hf_config(plain).model_dump(exclude={"name"})


def test_a_scenario_and_its_traces_with_byte_order_marks_run_as_without(tmp_path):
    traces = ROOT / "scenarios" / "traces"
    jsonl = _with_bom(b"".join((traces / "mooncake_conversation.jsonl").read_bytes().splitlines(True)[:40]),
                      tmp_path / "t.jsonl")
    csv = _with_bom((traces / "custom_sample.csv").read_bytes(), tmp_path / "t.csv")
    scenario = (ROOT / "scenarios" / "mooncake_conversation.yaml").read_bytes().replace(
        b"traces/mooncake_conversation.jsonl", str(jsonl).encode())
    marked = load_scenario(_with_bom(scenario, tmp_path / "m.yaml"), ["output.plots=false", "workload.limit=30"])
    plain_jsonl = tmp_path / "p.jsonl"
    plain_jsonl.write_bytes(jsonl.read_bytes()[len(BOM):])
    (tmp_path / "p.yaml").write_bytes(scenario.replace(str(jsonl).encode(), str(plain_jsonl).encode()))
    plain = load_scenario(tmp_path / "p.yaml", ["output.plots=false", "workload.limit=30"])
    a, b = run_scenario(marked), run_scenario(plain)
    assert len(a.requests) == 30 and a.requests.equals(b.requests)
    custom = (ROOT / "scenarios" / "custom_csv.yaml").read_text().replace("traces/custom_sample.csv", str(csv))
    (tmp_path / "c.yaml").write_text(custom)
    r = run_scenario(load_scenario(tmp_path / "c.yaml", ["output.plots=false", "workload.limit=20"]))
    assert r.summary["num_requests"] == 20
