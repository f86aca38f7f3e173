"""Cluster speed: N replicas against one replica with N times the capacity, on the same requests.

    python benchmarks/cluster_bench.py [--replicas 8] [--limit 100000] [--router round_robin] [--single-step]
                                       [--repeat 1] [--router-calls]

Both replay the quickstart's engine (Llama-2-13B, A100-80GB, chunked prefill) on the first ``--limit``
requests of the Azure conversation hour (all 19,366 by default). The large replica has N times the HBM
capacity, bandwidth and FLOP/s, N times the KV blocks of one replica and N times its batch limits
(max_num_seqs, max_num_batched_tokens): the same work in fewer, larger steps. Prints each run's wall time,
steps and microseconds a step, and the ratio (issue goal: the cluster at most 1.5x the large replica).
Timings on a shared machine are noisy: compare the ratio of one invocation (``--repeat``: the two runs
alternate, the fastest of each counts). ``--router-calls`` also times the cluster with its router called
at each arrival instead of applied by the compiled core (``Router.core_rule`` switched off), and checks that
both give the same request table.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from sim.cluster.routers import ROUTERS
from sim.runner import gpu_blocks, run_scenario
from sim.scenario import load_scenario
from sim.specs import HardwareSpec

QUICKSTART = Path(__file__).resolve().parents[1] / "scenarios" / "quickstart.yaml"


def timed(overrides: list[str], calls: bool = False) -> tuple[float, int, object]:
    """(wall seconds, steps, request table) of one run; ``calls``: routers' core rules switched off."""
    scn = load_scenario(QUICKSTART, overrides)
    saved = {cls: cls.__dict__["core_rule"] for cls in ROUTERS.values() if "core_rule" in cls.__dict__}
    if calls:
        for cls in saved:
            cls.core_rule = lambda self, requests, num_replicas: None
    try:
        t0 = time.perf_counter()
        res = run_scenario(scn, check_integrity=False)
        return time.perf_counter() - t0, int(res.summary["num_steps"]), res.requests
    finally:
        for cls, rule in saved.items():
            cls.core_rule = rule


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--limit", type=int, default=100_000)
    ap.add_argument("--router", default="round_robin")
    ap.add_argument("--single-step", action="store_true", help="scheduler.multi_step: false in both runs")
    ap.add_argument("--repeat", type=int, default=1, help="alternate the two runs this many times")
    ap.add_argument("--router-calls", action="store_true",
                    help="also time the cluster with the router called at each arrival (no core rule)")
    args = ap.parse_args()
    n = args.replicas
    base = [f"workload.limit={args.limit}", "output.plots=false",
            f"scheduler.multi_step={'false' if args.single_step else 'true'}"]
    one = load_scenario(QUICKSTART, base)
    hw = HardwareSpec.from_name("a100-80gb")
    big = [*base, f"hardware.hbm_bytes={hw.hbm_bytes * n}", f"hardware.hbm_bandwidth={hw.hbm_bandwidth * n}",
           f"hardware.peak_flops={hw.peak_flops * n}", f"kv_cache.num_gpu_blocks={gpu_blocks(one) * n}",
           f"scheduler.max_num_seqs={one.scheduler.max_num_seqs * n}",
           f"scheduler.max_num_batched_tokens={one.scheduler.max_num_batched_tokens * n}"]
    cluster = [*base, f"cluster.replicas={n}", f"cluster.router.policy={args.router}"]
    runs: dict[str, list[tuple[float, int]]] = {"cluster": [], "big": [], "calls": []}
    tables = {}
    for _ in range(max(1, args.repeat)):
        for key, over, calls in (("cluster", cluster, False), ("big", big, False), ("calls", cluster, True)):
            if key == "calls" and not args.router_calls:
                continue
            wall, steps, tables[key] = timed(over, calls)
            runs[key].append((wall, steps))
    rows = [(f"{n} replicas ({args.router})", *min(runs["cluster"])),
            (f"1 replica with {n}x capacity", *min(runs["big"]))]
    if args.router_calls:
        rows.append((f"{n} replicas, router called", *min(runs["calls"])))
    for name, wall, steps in rows:
        print(f"{name:<32} {wall:8.2f} s  {steps:>10,} steps  {wall / steps * 1e6:6.1f} us/step")
    print(f"cluster / large replica: {rows[0][1] / rows[1][1]:.2f}x (goal: at most 1.5x)")
    if args.router_calls:
        same = tables["calls"].equals(tables["cluster"])
        print(f"router applied by the core / called: {rows[0][1] / rows[2][1]:.2f}x "
              f"({'the same' if same else 'DIFFERENT'} request table)")


if __name__ == "__main__":
    main()
