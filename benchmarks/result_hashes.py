"""Fingerprints of a run's results, to show that a speed change left them bit for bit as they were.

    python benchmarks/result_hashes.py > before.txt          # on the old code
    python benchmarks/result_hashes.py --against before.txt  # on the new code: exit 1 on any difference
    python benchmarks/result_hashes.py --case hour3000 --case c8-least_kv

A case's fingerprint is a SHA-256 over its summary (less ``wall_time_s``, as sorted JSON) and every row of
its per-step, per-request and (a cluster) per-replica tables, index included
(``pandas.util.hash_pandas_object``). The cases cover the single-engine paths (decode runs, the decode
lane, chunked prefill with preemption) and a cluster behind each router:

    hour3000          the first 3,000 requests of engine_bench.py's Azure hour (Llama-3.1-8B, H100)
    qs3000            the quickstart settings over the hour's first 3,000 requests
    c8-ROUTER         the quickstart's first 3,000 requests on 8 replicas behind ROUTER
    c4-ms-off         1,500 requests on 4 replicas behind least_kv, multi-step decode off
    mc1500            the Mooncake conversation scenario's first 1,500 requests (prefix caching: hits,
                      evictions, preemption by recompute)
    mc300-big         scenarios/mooncake_prefix.yaml (300 requests) with 400,000 blocks: hits, no pressure
    mc300-swap        the same with 12,000 blocks and preemption by swap
    prompt2000        scenarios/shared_system_prompt.yaml with 2,000 requests at 20 req/s and 4 groups
    beam-prefix       scenarios/beam_search.yaml with a prefix cache and 4 shared prefixes (forks and hits)
    pd2000-pull       scenarios/cluster_disaggregated.yaml (2,000 requests, 2 prefill + 6 decode, pulled KV)
    pd2000-push-lw    the same, the KV pushed layer by layer over 100G Ethernet
    spec-ngram        scenarios/speculative.yaml with prompt lookup, 500 requests, 64 in flight
    samples-n4        scenarios/parallel_sampling.yaml, 1,000 requests of 4 samples over a prefix cache of 2,000
                      blocks with 4 shared prefixes (forks, copies, hits, evictions, recomputed groups)
    lora2000-affinity scenarios/lora.yaml on 2 replicas of 4 slots at twice the rate, lora_affinity (skips, loads)
    pd2000-timeout    pd2000-pull sent four times as fast, clients giving up after 10 s (aborts on both pools,
                      waiting for a decode seat and in transfer)
    mistral-window    scenarios/mooncake_conversation.yaml's first 600 requests on Mistral-7B-v0.1 (every layer a
                      4,096-token window) on one H100 with 3,000 blocks: tables cut to the window, one-group
                      hits, preemptions, refusals past its 32,768-token context
    dp8-deepseek      scenarios/data_parallel.yaml as shipped: eight DeepSeek-V3 ranks in lockstep, dp_balance
    dp-fleet          the same as two engines of eight ranks at four times the rate, least_requests at the gateway
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Callable

import pandas as pd
from cluster_bench import QUICKSTART
from engine_bench import ROOT, azure_scenario, quickstart_scenario

from sim import run_scenario, scenario_from_dict
from sim.runner import Result
from sim.scenario import Scenario, load_scenario

ROUTERS = ["session", "least_kv", "least_requests", "round_robin", "prefix_affinity", "power_of_two"]


def _cluster(limit: int, replicas: int, router: str, *extra: str) -> Callable[[], Scenario]:
    return lambda: load_scenario(QUICKSTART, [f"workload.limit={limit}", "output.plots=false",
                                              f"cluster.replicas={replicas}", f"cluster.router.policy={router}",
                                              *extra])


CASES: dict[str, Callable[[], Scenario]] = {
    "hour3000": lambda: scenario_from_dict(azure_scenario(3000), base_dir=ROOT / "scenarios"),
    "qs3000": lambda: scenario_from_dict(quickstart_scenario(3000), base_dir=ROOT / "scenarios"),
    **{f"c8-{r}": _cluster(3000, 8, r) for r in ROUTERS},
    "c4-ms-off": _cluster(1500, 4, "least_kv", "scheduler.multi_step=false"),
    "mc1500": lambda: load_scenario(ROOT / "scenarios/mooncake_conversation.yaml", ["workload.limit=1500"]),
    "mc300-big": lambda: load_scenario(ROOT / "scenarios/mooncake_prefix.yaml", ["kv_cache.num_gpu_blocks=400000"]),
    "mc300-swap": lambda: load_scenario(ROOT / "scenarios/mooncake_prefix.yaml", [
        "kv_cache.num_gpu_blocks=12000", "scheduler.preemption=swap"]),
    "prompt2000": lambda: load_scenario(ROOT / "scenarios/shared_system_prompt.yaml", [
        "workload.synthetic.num_requests=2000", "workload.synthetic.arrival.process=poisson",
        "workload.synthetic.arrival.rate=20", "workload.synthetic.shared_prefix.groups=4"]),
    "beam-prefix": lambda: load_scenario(ROOT / "scenarios/beam_search.yaml", [
        "kv_cache.prefix_caching=true", "workload.synthetic.shared_prefix={groups: 4, length: 96}"]),
    "pd2000-pull": lambda: load_scenario(ROOT / "scenarios/cluster_disaggregated.yaml", ["output.plots=false"]),
    "pd2000-push-lw": lambda: load_scenario(ROOT / "scenarios/cluster_disaggregated.yaml", [
        "output.plots=false", "cluster.kv_transfer.mode=push", "cluster.kv_transfer.layerwise=true",
        "cluster.kv_transfer.link=ethernet-100g"]),
    "spec-ngram": lambda: load_scenario(ROOT / "scenarios/speculative.yaml", [
        "speculative.method=ngram", "workload.synthetic.num_requests=500", "workload.max_concurrency=64"]),
    "samples-n4": lambda: load_scenario(ROOT / "scenarios/parallel_sampling.yaml", [
        "workload.synthetic.num_requests=1000", "workload.synthetic.n=4", "kv_cache.prefix_caching=true",
        "kv_cache.num_gpu_blocks=2000", "workload.synthetic.shared_prefix.groups=4",
        "workload.synthetic.shared_prefix.length=64", "output.plots=false"]),
    "lora2000-affinity": lambda: load_scenario(ROOT / "scenarios/lora.yaml", [
        "cluster.replicas=2", "workload.time_scale=0.5", "lora.max_loras=4", "cluster.router.policy=lora_affinity",
        "output.plots=false"]),
    "pd2000-timeout": lambda: load_scenario(ROOT / "scenarios/cluster_disaggregated.yaml", [
        "output.plots=false", "workload.time_scale=0.25", "workload.timeout_s=10"]),
    "mistral-window": lambda: load_scenario(ROOT / "scenarios/mooncake_conversation.yaml", [
        "model=mistral-7b-v0.1", "hardware=h100-80gb", "kv_cache.num_gpu_blocks=3000", "workload.limit=600",
        "output.plots=false"]),
    "dp8-deepseek": lambda: load_scenario(ROOT / "scenarios/data_parallel.yaml", ["output.plots=false"]),
    "dp-fleet": lambda: load_scenario(ROOT / "scenarios/data_parallel.yaml", [
        "cluster.replicas=16", "cluster.data_parallel_size=8", "cluster.router.policy=least_requests",
        "workload.time_scale=0.25", "output.plots=false"]),
}


def fingerprint(result: Result) -> str:
    """16 hex digits of the SHA-256 of the summary less wall_time_s and of the result's tables."""
    summary = {k: v for k, v in result.summary.items() if k != "wall_time_s"}
    h = hashlib.sha256(json.dumps(summary, sort_keys=True, default=str).encode())
    for table in (result.steps, result.requests, getattr(result, "replicas", None)):
        if table is not None:
            h.update(pd.util.hash_pandas_object(table, index=True).to_numpy().tobytes())
    return h.hexdigest()[:16]


def read_fingerprints(path: str) -> dict[str, str]:
    """``name fingerprint`` lines, as this script prints them."""
    pairs = (line.split() for line in open(path) if line.strip())
    return {name: value for name, value in pairs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", action="append", choices=sorted(CASES), help="run only these cases (repeatable)")
    ap.add_argument("--against", metavar="FILE", help="compare with fingerprints printed earlier; exit 1 on a difference")
    args = ap.parse_args()
    expected = read_fingerprints(args.against) if args.against else {}
    differ = 0
    for name in args.case or list(CASES):
        value = fingerprint(run_scenario(CASES[name](), check_integrity=False))
        note = ""
        if name in expected and expected[name] != value:
            differ += 1
            note = f"   DIFFERS (was {expected[name]})"
        print(f"{name} {value}{note}", flush=True)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
