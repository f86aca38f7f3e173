"""Seeded mixes of prefix groups, parallel samples, beams, swap, chunked prefill and every waiting-queue
policy on small caches, all with the invariant checks after every step (tests/conftest.py): every
request ends finished or rejected, and each ref count equals the tables holding the block."""

from __future__ import annotations

import random

import pytest

from sim.runner import run_scenario
from sim.scenario import scenario_from_dict


def _case(i: int) -> tuple[dict, int]:
    rng = random.Random(f"prefix-mix:{i}")
    reqs = []
    for _ in range(rng.randint(2, 8)):
        p = rng.randint(2, 100)
        r = {"arrival": round(rng.random() * 0.05, 4), "prompt_len": p, "output_len": rng.randint(1, 40)}
        k = rng.random()
        if k < 0.3:
            r["n"] = rng.randint(2, 4)
        elif k < 0.5:
            r["beam_width"] = rng.randint(2, 4)
        if rng.random() < 0.6:
            r["prefix_group"] = rng.randint(0, 1)
            r["prefix_len"] = rng.randint(1, p - 1)
        reqs.append(r)
    bs = rng.choice([1, 4, 16])
    scn = {
        "model": "tiny-llama", "hardware": "cpu",
        "kv_cache": {"block_size": bs, "num_gpu_blocks": rng.randint(30, 120) * 16 // bs,
                     "prefix_caching": rng.random() < 0.8, "swap_space_gb": rng.choice([0, 0.0001])},
        "scheduler": {"policy": rng.choice(["fcfs", "longest_prefix_first", "priority", "round_robin"]),
                      "preemption": rng.choice(["recompute", "swap"]), "chunked_prefill": rng.random() < 0.5,
                      "max_num_seqs": rng.randint(2, 12), "max_num_batched_tokens": rng.choice([None, 64]),
                      "max_steps_without_progress": 3000},
        "workload": {"requests": reqs}, "output": {"plots": False},
    }
    return scn, len(reqs)


@pytest.mark.parametrize("i", range(30))
def test_mixed_sharing_runs_clean(i):
    data, count = _case(i)
    s = run_scenario(scenario_from_dict(data), check_integrity=True).summary
    assert s["num_finished"] + s["num_rejected"] == count
