"""Each trace format on small hand-made files (tests/data/traces); expected values worked out by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.errors import KvsimError
from sim.workload import Workload, WorkloadConfig, build_workload

DATA = Path(__file__).resolve().parent / "data" / "traces"


def load(trace: str, fmt: str, base: Path = DATA, **extra) -> Workload:
    return build_workload(WorkloadConfig.model_validate({"trace": trace, "format": fmt, **extra}), base, 0)


def rows(w: Workload) -> list[tuple]:
    return [(r.req_id, round(r.arrival_s, 9), r.prompt_len, r.output_len) for r in w.requests]


def test_azure_out_of_order_sorted_with_warning_and_zero_output_skipped() -> None:
    w = load("azure_small.csv", "azure")
    # times from 18:15:46.68059: 49.0 -> 2.31941, 50.995169 -> 4.314579, 53.25 -> 6.56941
    assert rows(w) == [(0, 0.0, 374, 44), (1, 2.31941, 100, 10), (2, 4.314579, 396, 109), (3, 6.56941, 50, 5)]
    assert w.stats["rows_read"] == 5
    assert w.stats["skipped_by_reason"] == {"zero output tokens": 1}
    assert len(w.stats["warnings"]) == 1 and "sorted" in w.stats["warnings"][0]


def test_mooncake_keeps_hash_ids_and_ms_times() -> None:
    w = load("mooncake_small.jsonl", "mooncake")
    assert rows(w) == [(0, 0.0, 1200, 10), (1, 1.5, 1024, 5), (2, 2.5, 600, 7)]
    assert [r.hash_ids for r in w.requests] == [(0, 1, 2), (0, 1), (3, 4)]
    assert {r.hash_block_tokens for r in w.requests} == {512}
    assert w.stats["warnings"] == []


def test_mooncake_clipping_cuts_hash_ids() -> None:
    w = load("mooncake_small.jsonl", "mooncake", max_model_len=1000)
    # 1200+10 -> prompt 999, output 1 (3 blocks -> 2); 1024+5 -> 999+1; 600+7 fits
    assert [(r.prompt_len, r.output_len, r.hash_ids) for r in w.requests] == [
        (999, 1, (0, 1)), (999, 1, (0, 1)), (600, 7, (3, 4))]
    assert w.stats["clipped"] == 2


def test_vidur_with_arrivals() -> None:
    assert rows(load("vidur_small.csv", "vidur")) == [(0, 0.0, 100, 20), (1, 0.5, 300, 40), (2, 2.0, 50, 5)]


def test_length_only_trace_needs_an_arrival_process(tmp_path: Path) -> None:
    p = tmp_path / "lengths.csv"
    p.write_text("num_prefill_tokens,num_decode_tokens\n10,2\n20,3\n30,4\n")
    with pytest.raises(KvsimError, match="no arrival times"):
        load(str(p), "vidur")
    w = load(str(p), "vidur", arrival={"process": "constant", "rate": 2.0})
    assert rows(w) == [(0, 0.0, 10, 2), (1, 0.5, 20, 3), (2, 1.0, 30, 4)]


def test_burstgpt_skips_failures_and_filters_models() -> None:
    w = load("burstgpt_small.csv", "burstgpt")
    assert rows(w) == [(0, 0.0, 472, 18), (1, 113.0, 417, 276), (2, 120.0, 1360, 193)]
    assert w.stats["skipped_by_reason"] == {"failed request (zero response tokens)": 2}
    w = load("burstgpt_small.csv", "burstgpt", model_filter="ChatGPT")
    assert rows(w) == [(0, 0.0, 472, 18), (1, 120.0, 1360, 193)]
    assert w.stats["rows_skipped"] == 3


def test_csv_with_column_mapping_and_ms(tmp_path: Path) -> None:
    p = tmp_path / "mine.csv"
    p.write_text("t,in,out,tier,grp,plen\n2000,50,5,1,0,20\n500,60,6,0,-1,0\n")
    w = load(str(p), "csv", columns={"arrival": "t", "prompt_len": "in", "output_len": "out", "priority": "tier",
                                     "prefix_group": "grp", "prefix_len": "plen"}, time_unit="ms")
    a, b = w.requests
    assert (a.arrival_s, a.prompt_len, a.priority, a.prefix_group) == (0.0, 60, 0, -1)
    assert (b.arrival_s, b.prompt_len, b.output_len, b.priority, b.prefix_group, b.prefix_len) == (1.5, 50, 5, 1, 0, 20)


def test_jsonl_with_default_names(tmp_path: Path) -> None:
    p = tmp_path / "mine.jsonl"
    p.write_text('{"arrival": 1.0, "prompt_len": 7, "output_len": 3, "n": 2}\n'
                 '{"arrival": 3.0, "prompt_len": 8, "output_len": 4, "n": 1}\n')
    w = load(str(p), "jsonl")
    assert [(r.arrival_s, r.prompt_len, r.output_len, r.n) for r in w.requests] == [(0.0, 7, 3, 2), (2.0, 8, 4, 1)]


def test_azure_streamed_in_chunks_equals_one_read() -> None:
    from sim.workload.table import LoadStats
    from sim.workload.traces import load_azure

    path = Path(__file__).resolve().parents[1] / "scenarios" / "traces" / "azure_llm_2023_conv.csv"
    whole = load_azure(path, "x", LoadStats())
    chunked = load_azure(path, "x", LoadStats(), chunk_rows=1000)
    assert (whole.arrival == chunked.arrival).all() and (whole.prompt_len == chunked.prompt_len).all()


# ---------------------------------------------------------------- bad traces: file, line, problem


AZ_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZ_ROW = "2023-11-16 18:15:46.6805900,374,44\n"


@pytest.mark.parametrize(("text", "fmt", "line", "problem"), [
    ("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.68,3\n", "azure", 1, "missing column: GeneratedTokens"),
    (AZ_HEADER + AZ_ROW + AZ_ROW + "2023-11-16 18:15:47.0,abc,4\n", "azure", 4, "ContextTokens: not a number"),
    (AZ_HEADER + AZ_ROW + "2023-11-16 18:15:47.0,10,-4\n", "azure", 3, "GeneratedTokens: negative token count -4"),
    (AZ_HEADER + AZ_ROW + "yesterday at noon,10,4\n", "azure", 3, "unparsable timestamp"),
    ("arrived_at,num_prefill_tokens,num_decode_tokens\n0,1,1\nsoon,2,2\n", "vidur", 3, "unparsable timestamp"),
    ("Timestamp,Model,Request tokens,Response tokens\n1,ChatGPT,5,1.5\n", "burstgpt", 2, "not a whole number: 1.5"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1, "input_length": 5}\n',
     "mooncake", 2, "missing field: output_length"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1, "input_len\n',
     "mooncake", 2, "invalid JSON"),
    ('{"timestamp": 0, "input_length": -5, "output_length": 1}\n', "mooncake", 1, "negative token count"),
])
def test_bad_trace_names_file_line_and_problem(tmp_path: Path, text: str, fmt: str, line: int, problem: str) -> None:
    p = tmp_path / ("bad.jsonl" if fmt == "mooncake" else "bad.csv")
    p.write_text(text)
    with pytest.raises(KvsimError) as err:
        load(str(p), fmt)
    assert err.value.where == f"{p}:{line}"
    assert problem in err.value.what


@pytest.mark.parametrize(("name", "text", "problem"), [
    ("empty.csv", "", "the file is empty"),
    ("empty.jsonl", "\n\n", "the file is empty"),
    ("header.csv", AZ_HEADER, "only a header"),
])
def test_empty_traces(tmp_path: Path, name: str, text: str, problem: str) -> None:
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(KvsimError) as err:
        load(str(p), "mooncake" if name.endswith("jsonl") else "azure")
    assert err.value.where == str(p) and problem in err.value.what


def test_unknown_format_and_missing_file(tmp_path: Path) -> None:
    from sim.workload.table import LoadStats
    from sim.workload.traces import load_trace

    with pytest.raises(KvsimError, match="unknown trace format 'parquet'"):
        load_trace(DATA / "azure_small.csv", "parquet", "x.csv", LoadStats())
    with pytest.raises(KvsimError, match="no such file"):
        load("nope.csv", "azure", base=tmp_path)


def test_unknown_format_in_a_scenario_exits_2(tmp_path: Path) -> None:
    from sim.cli import main

    scn = tmp_path / "s.yaml"
    scn.write_text(f"workload:\n  trace: {DATA / 'azure_small.csv'}\n  format: parquet\n")
    assert main(["run", str(scn), "--out", str(tmp_path / "out")]) == 2


def test_azure_2024_style_timestamps_with_utc_offset(tmp_path: Path) -> None:
    p = tmp_path / "az2024.csv"
    p.write_text(AZ_HEADER + "2024-05-10 00:00:00.009930+00:00,100,10\n2024-05-10 00:00:01.5+00:00,200,20\n"
                 "2024-05-10 00:00:02+00:00,300,30\n")
    assert rows(load(str(p), "azure")) == [(0, 0.0, 100, 10), (1, 1.49007, 200, 20), (2, 1.99007, 300, 30)]


def test_mooncake_without_hash_ids(tmp_path: Path) -> None:
    p = tmp_path / "m.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 700, "output_length": 3}\n'
                 '{"timestamp": 10, "input_length": 600, "output_length": 2, "hash_ids": [7, 8]}\n')
    w = load(str(p), "mooncake", max_model_len=500)
    assert [(r.prompt_len, r.hash_ids) for r in w.requests] == [(499, None), (499, (7,))]
