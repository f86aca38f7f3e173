"""Every per-format scenario runs end to end (with a small limit, to stay fast)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim import load_scenario, run_scenario

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"


# a smaller KV pool keeps the per-step integrity checks cheap; it still holds every request
@pytest.mark.parametrize(("name", "limit"), [
    ("azure_code", 40), ("mooncake_conversation", 4), ("vidur_arxiv", 10), ("burstgpt_sample", 15),
    ("custom_csv", 20),
])
def test_format_scenario_runs(name: str, limit: int) -> None:
    scn = load_scenario(SCENARIOS / f"{name}.yaml", [f"workload.limit={limit}", "kv_cache.num_gpu_blocks=3000"])
    result = run_scenario(scn)
    assert result.summary["num_requests"] == limit
    assert result.summary["num_finished"] + result.summary["num_rejected"] == limit
    assert len(result.requests) == limit


def test_mooncake_scenario_keeps_hash_ids() -> None:
    from sim.workload import build_workload

    scn = load_scenario(SCENARIOS / "mooncake_conversation.yaml", ["workload.limit=3"])
    reqs = build_workload(scn.workload, scn.base_dir, scn.seed, scn.source).requests
    # the trace's first three requests share block 0 (hash_ids [0, 1, ...], [0, 14, ...], [0, 28, ...])
    assert [r.hash_ids[0] for r in reqs] == [0, 0, 0]
    assert [len(r.hash_ids) for r in reqs] == [-(-r.prompt_len // 512) for r in reqs]
