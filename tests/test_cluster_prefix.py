"""Routers on the Mooncake conversation trace (500 requests, 4 replicas with prefix caching):
prefix_affinity's hit rate is well above round_robin's and close to one replica with four times the cache
(and to one replica with four times the cache and the compute)."""

from __future__ import annotations

from pathlib import Path

from sim.runner import gpu_blocks, run_scenario
from sim.scenario import load_scenario

SCN = Path(__file__).resolve().parents[1] / "scenarios/mooncake_conversation.yaml"


def _hit(*overrides: str) -> float:
    return run_scenario(load_scenario(SCN, list(overrides)), check_integrity=False).summary["prefix_cache_hit_rate"]


def test_prefix_affinity_hits_like_one_big_cache() -> None:
    blocks = gpu_blocks(load_scenario(SCN))
    big = _hit(f"kv_cache.num_gpu_blocks={4 * blocks}")
    rr = _hit("cluster.replicas=4", "cluster.router.policy=round_robin")
    pa = _hit("cluster.replicas=4", "cluster.router.policy=prefix_affinity")
    # the four replicas merged into one: 4x the cache, the compute (H200 x 4) and the batch limits
    merged = _hit(f"kv_cache.num_gpu_blocks={4 * blocks}", "scheduler.max_num_seqs=1024",
                  "scheduler.max_num_batched_tokens=32768",
                  "hardware={name: h200-141gb, hbm_bytes: 141000000000, hbm_bandwidth: 19.2e12, "
                  "peak_flops: 3956e12, host_link_bandwidth: 64e9}")
    assert pa > 1.4 * rr
    assert pa > 0.8 * big
    assert pa > 0.9 * merged
