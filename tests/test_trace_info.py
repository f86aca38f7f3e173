"""kvsim trace-info against an independent pandas computation over the raw files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim.cli import main

TRACES = Path(__file__).resolve().parents[1] / "scenarios" / "traces"


def info_json(capsys: pytest.CaptureFixture, *args: str) -> dict:
    assert main(["trace-info", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def expected(times_s: pd.Series, prompt: pd.Series, output: pd.Series) -> dict:
    t = np.sort(times_s.to_numpy(dtype=float))
    gaps = np.diff(t)
    return {
        "requests": len(t),
        "time_span_s": t[-1] - t[0],
        "mean_rate_rps": (len(t) - 1) / (t[-1] - t[0]),
        "burstiness_cv": gaps.std(ddof=0) / gaps.mean(),
        "prompt_len": {"mean": prompt.mean(), "p50": prompt.quantile(0.5), "p99": prompt.quantile(0.99),
                       "max": prompt.max()},
        "output_len": {"mean": output.mean(), "p50": output.quantile(0.5), "p99": output.quantile(0.99),
                       "max": output.max()},
    }


def assert_matches(got: dict, want: dict) -> None:
    assert got["requests"] == want["requests"]
    for key in ("time_span_s", "mean_rate_rps", "burstiness_cv"):
        assert got[key] == pytest.approx(want[key], rel=1e-9), key
    for side in ("prompt_len", "output_len"):
        for stat, value in want[side].items():
            assert got[side][stat] == pytest.approx(value, rel=1e-9), (side, stat)


def test_azure_conversation(capsys: pytest.CaptureFixture) -> None:
    raw = pd.read_csv(TRACES / "azure_llm_2023_conv.csv")
    ns = pd.to_datetime(raw["TIMESTAMP"]).astype("int64")
    secs = (ns - ns.min()) / 1e9  # subtract in integers: epoch seconds in float64 lose microseconds
    got = info_json(capsys, str(TRACES / "azure_llm_2023_conv.csv"))
    assert got["format"] == "azure" and got["requests"] == 19_366
    assert_matches(got, expected(secs, raw["ContextTokens"], raw["GeneratedTokens"]))
    assert got["prompt_len"]["mean"] == pytest.approx(1155, abs=1)  # the README's 1,155 / 211
    assert got["output_len"]["mean"] == pytest.approx(211, abs=1)


def test_mooncake_conversation(capsys: pytest.CaptureFixture) -> None:
    raw = pd.read_json(TRACES / "mooncake_conversation.jsonl", lines=True)
    got = info_json(capsys, str(TRACES / "mooncake_conversation.jsonl"))
    assert got["format"] == "mooncake" and got["requests"] == 12_031
    assert_matches(got, expected(raw["timestamp"] / 1000.0, raw["input_length"], raw["output_length"]))
    ids = raw.sort_values("timestamp", kind="stable")["hash_ids"].explode()
    repeated = ids.duplicated().mean()  # a reference whose id appeared before
    assert got["block_repeat_fraction"] == pytest.approx(repeated, rel=1e-12)
    assert got["block_repeat_fraction"] == pytest.approx(0.37, abs=0.01)


def test_length_only_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    plot = tmp_path / "arxiv.png"
    got = info_json(capsys, str(TRACES / "arxiv_summarization_lengths.csv"), "--plot", str(plot))
    raw = pd.read_csv(TRACES / "arxiv_summarization_lengths.csv")
    assert got["format"] == "vidur" and got["requests"] == len(raw) == 28_257
    assert got["time_span_s"] is None and got["mean_rate_rps"] is None
    assert got["prompt_len"]["max"] == raw["num_prefill_tokens"].max()
    assert plot.stat().st_size > 1000


def test_text_output_and_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["trace-info", str(TRACES / "burstgpt_synthetic_sample.csv")]) == 0
    out = capsys.readouterr().out
    assert "burstgpt" in out and "zero response tokens" in out
    assert main(["trace-info", str(tmp_path / "missing.csv")]) == 2
    odd = tmp_path / "odd.csv"
    odd.write_text("a,b\n1,2\n")
    assert main(["trace-info", str(odd)]) == 2
    assert "cannot tell the trace format" in capsys.readouterr().err
