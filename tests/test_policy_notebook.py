"""notebooks/policy_comparison.ipynb executes top to bottom, shows its figures, and is stored with fresh outputs."""

from __future__ import annotations

import pytest

pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

from notebook_util import execute_fresh, stream_text  # noqa: E402


def test_policy_notebook_executes():
    nb = execute_fresh("policy_comparison.ipynb", min_figures=4)
    text = stream_text(nb)
    ratio = float(text.split("continuous / static output throughput:")[1].split()[0])
    assert ratio >= 2.0
    # section 8: without a prefix cache each of 4 fanned-out samples computes its whole prompt (mean 161 tokens),
    # with one the 3 others compute only their partly filled last block (8 tokens on average): about
    # 4 x 161 / (161 + 3 x 8) = 3.5x the prefill tokens, recomputed preemptions aside
    fanned = float(text.split("fanned out without a prefix cache:")[1].split("x")[0])
    assert 2.5 <= fanned <= 4.5
    # section 9: DeepSeek-V3's latent on each of 8 GPUs, 8 x 61 layers x 576 x 2 bytes, against Llama-3.1-405B's
    # KV split over them, 2 x 126 layers x 8 KV heads x 128 x 2 bytes (its fp8 checkpoint keeps a 16-bit cache)
    latent = float(text.split("latent over the group:")[1].split("x")[0])
    assert latent == pytest.approx(8 * 61 * 576 * 2 / (2 * 126 * 8 * 128 * 2), abs=0.005)
    # section 10: Gemma-3-27B at 32,768 tokens: 62 layers x 32,768 tokens kept whole, against pages of 16 tokens
    # x 10 layers: 2,048 for the full group and 6 x 64 for the sliding groups' 1,024-token window
    whole = float(text.split("a 32,768-token sequence:")[1].split("x")[0])
    assert whole == pytest.approx(62 * 32768 / ((2048 + 6 * 64) * 16 * 10), abs=0.005)
    # section 11: clients that give up sooner abort at least as many requests, and none without a timeout
    aborted = [int(a) for a in text.split("aborted (no timeout, 60, 20, 10, 5 s):")[1].split("of")[0].split()]
    assert aborted[0] == 0 and aborted == sorted(aborted) and 0 < aborted[-1] <= 1500
    # section 12: more adapters a batch never makes requests wait longer, and once the slots cover the adapters
    # in use TTFT is within twice the base model's; LoRA's kernels make every decode step dearer
    ttft = [float(v) for v in text.split("lora TTFT p50 (2, 4, 8, 16 adapters a batch; without LoRA):")[1].split()[:5]]
    assert ttft[:4] == sorted(ttft[:4], reverse=True) and ttft[3] <= 2 * ttft[4] < ttft[0]
    tpot = [float(v) for v in text.split("lora TPOT mean ms (2, 4, 8, 16 adapters a batch; without LoRA):")[1].split()[:5]]
    assert min(tpot[:4]) > tpot[4]
