"""The profile CSV: exact columns, one row per (step, operator), the num_tokens / context_len meaning."""

import csv

import pytest

torch = pytest.importorskip("torch")

from backend.profile import COLUMNS, ProfileGrid, main, run_profile  # noqa: E402
from backend.shapes import model_preset  # noqa: E402


def test_profile_rows_and_columns(tmp_path):
    grid = ProfileGrid(prefill_batch_sizes=(2,), prefill_lens=(8, 20), decode_batch_sizes=(3,),
                       decode_context_lens=(17,), warmup=0, repeats=1)
    out = tmp_path / "p.csv"
    run_profile(model_preset("tiny-llama"), "cpu", out, grid)
    with out.open() as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == COLUMNS
        rows = list(reader)
    assert len(rows) == 3 * 6                                   # 3 steps x 6 operators
    steps = {(r["kind"], r["batch_size"], r["num_tokens"], r["context_len"]) for r in rows}
    assert steps == {("prefill", "2", "16", "0"), ("prefill", "2", "40", "0"), ("decode", "3", "3", "17")}
    ops = {r["operator"] for r in rows}
    assert ops == {"attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj", "attention", "step"}
    assert all(r["model"] == "tiny-llama" and r["device"] == "cpu" and float(r["time_ms"]) > 0 for r in rows)
    for step in steps:                                          # the step exceeds any one layer's operator
        times = {r["operator"]: float(r["time_ms"]) for r in rows
                 if (r["kind"], r["batch_size"], r["num_tokens"], r["context_len"]) == step}
        assert times["step"] > max(v for k, v in times.items() if k != "step")


def test_profile_cli(tmp_path, capsys):
    out = tmp_path / "q.csv"
    assert main(["--out", str(out), "--prefill-batch", "1", "--prefill-lens", "4", "--decode-batch", "1",
                 "--decode-context", "4", "--repeats", "1"]) == 0
    assert len(out.read_text().splitlines()) == 1 + 2 * 6
