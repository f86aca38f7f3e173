"""Engine speed and memory: replay the full Azure conversation trace and large synthetic workloads.

    python benchmarks/engine_bench.py                 # the hour of Azure conversation traffic (19,366 requests)
    python benchmarks/engine_bench.py --synthetic 1000000 --rate 40

Reports wall time, simulated steps, steps/s, requests/s and peak RSS. Timings on a shared machine are
noisy: compare ratios from one run, not absolute numbers across runs.
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

import yaml

from sim import run_scenario, scenario_from_dict

ROOT = Path(__file__).resolve().parents[1]


def azure_scenario(limit: int | None) -> dict:
    """The quickstart scenario over the whole hour of the Azure conversation trace (or its first ``limit``)."""
    data = yaml.safe_load((ROOT / "scenarios" / "quickstart.yaml").read_text())
    data["name"] = "azure-conv-hour"
    data["workload"]["limit"] = limit
    return data


def synthetic_scenario(n: int, rate: float) -> dict:
    return {
        "name": f"synthetic-{n}", "model": "llama-3-8b", "hardware": "h100-80gb",
        "scheduler": {"max_num_batched_tokens": 8192},
        "workload": {"synthetic": {
            "num_requests": n, "arrival": {"process": "poisson", "rate": rate},
            "prompt_len": {"dist": "lognormal", "mean": 600, "std": 400, "min": 8, "max": 4000},
            "output_len": {"dist": "lognormal", "mean": 200, "std": 150, "min": 4, "max": 2000}}},
    }


def measure(data: dict) -> dict:
    scn = scenario_from_dict(data, base_dir=ROOT / "scenarios")
    t0 = time.perf_counter()
    res = run_scenario(scn, check_integrity=False)
    wall = time.perf_counter() - t0
    s = res.summary
    return {"name": data["name"], "requests": s["num_requests"], "steps": s["num_steps"], "wall_s": wall,
            "steps_per_s": s["num_steps"] / wall, "requests_per_s": s["num_requests"] / wall,
            "sim_makespan_s": s["makespan_s"],
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=None, help="first N requests of the Azure trace (default all)")
    ap.add_argument("--synthetic", type=int, default=0, help="also run N synthetic requests")
    ap.add_argument("--rate", type=float, default=30.0, help="synthetic arrival rate (req/s)")
    args = ap.parse_args()
    rows = [measure(azure_scenario(args.limit))]
    if args.synthetic:
        rows.append(measure(synthetic_scenario(args.synthetic, args.rate)))
    cols = list(rows[0])
    print(" | ".join(f"{c:>14}" for c in cols))
    for r in rows:
        print(" | ".join(f"{r[c]:>14.1f}" if isinstance(r[c], float) else f"{r[c]:>14}" for c in cols))


if __name__ == "__main__":
    main()
