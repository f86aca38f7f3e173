"""The console note on rejected requests: kinds of reason counted by hand, and kvsim run printing it."""

import warnings

import pandas as pd

from sim.cli import main
from sim.commands.rejections import rejection_note


def frame(statuses, reasons):
    return pd.DataFrame({"status": statuses, "reject_reason": reasons})


def test_no_rejection_no_note():
    assert rejection_note(frame(["FINISHED", "FINISHED"], [None, None])) is None
    assert rejection_note(frame([], [])) is None


def test_reasons_differing_only_in_numbers_are_one_kind_most_common_first():
    reqs = frame(["REJECTED", "FINISHED", "REJECTED", "REJECTED", "REJECTED"],
                 ["needs 5 KV blocks, the cache has 1", None, "prompt of 4107 tokens does not fit max_model_len 4096",
                  "needs 12 KV blocks, the cache has 1", "needs 6 KV blocks, the cache has 1"])
    # 3 of the "needs # KV blocks" kind (first met: the 5-block one), 1 of the prompt kind
    assert rejection_note(reqs) == ('note: 4 of 5 requests rejected: 3 like "needs 5 KV blocks, the cache has 1"; '
                                    '1 like "prompt of 4107 tokens does not fit max_model_len 4096"')


def test_kinds_beyond_three_are_counted_together():
    reasons = ["a", "b", "b", "c", "d", "e", "e", "e"]
    note = rejection_note(frame(["REJECTED"] * 8, reasons))
    # e (3), b (2), then a and c tie at 1: a was met first; c and d are the 2 left, 2 requests
    assert note == 'note: 8 of 8 requests rejected: 3 like "e"; 2 like "b"; 1 like "a"; 2 for 2 other reasons'


def test_kvsim_run_prints_the_note_and_no_warning(tmp_path, capsys):
    # a one-block cache: the two prompts need ceil((10 + 5) / 16) = 1 and ceil((20 + 3) / 16) = 2 blocks
    f = tmp_path / "s.yaml"
    f.write_text("model: llama-2-7b\nhardware: a100-80gb\nkv_cache: {block_size: 16, num_gpu_blocks: 1}\n"
                 "workload:\n  requests:\n    - {arrival: 0.0, prompt_len: 10, output_len: 5}\n"
                 "    - {arrival: 0.0, prompt_len: 20, output_len: 3}\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # the figures of a run with no finished request warn of nothing
        assert main(["run", str(f), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert 'note: 1 of 2 requests rejected: 1 like "needs 2 KV blocks, the cache has 1"' in out


def test_all_rejected_run_draws_its_figures_without_warning(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("model: llama-2-7b\nhardware: a100-80gb\nkv_cache: {block_size: 16, num_gpu_blocks: 1}\n"
                 "workload:\n  requests:\n    - {arrival: 0.0, prompt_len: 40, output_len: 5}\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["run", str(f), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "latency_breakdown.png").exists()


def test_kvsim_compare_prints_each_runs_note(tmp_path, capsys):
    # one block of 16 tokens: the 20-token prompt needs ceil(23 / 16) = 2 blocks; with 4 blocks every prompt fits
    f = tmp_path / "s.yaml"
    f.write_text("model: llama-2-7b\nhardware: a100-80gb\nkv_cache: {block_size: 16, num_gpu_blocks: 1}\n"
                 "output: {plots: false}\n"
                 "workload:\n  requests:\n    - {arrival: 0.0, prompt_len: 10, output_len: 5}\n"
                 "    - {arrival: 0.0, prompt_len: 20, output_len: 3}\n")
    assert main(["compare", str(f), "--vary", "kv_cache.num_gpu_blocks=1,4"]) == 0
    out = capsys.readouterr().out
    assert 'num_gpu_blocks=1: note: 1 of 2 requests rejected: 1 like "needs 2 KV blocks, the cache has 1"' in out
    assert "num_gpu_blocks=4: note" not in out
