"""Trace loading speed and memory.

1. Load the full Azure 2023 conversation trace (19,366 rows) with build_workload: best of 5
   (target: well under 1 s).
2. Generate an Azure-format file of ``--rows`` rows (default 10 million, about 450 MB) in a temporary
   folder, then, each in a fresh process so peak RSS (ru_maxrss) is its own:
     stream   build_workload on the file (read in 1M-row chunks)
     floor    the same Request objects built from in-memory arrays, no file at all
     naive    pd.read_csv of the whole file at once, no Requests (what not streaming costs)
   Streaming holds its Requests plus one chunk, so its peak should sit near the floor.

    .venv/bin/python benchmarks/trace_load_bench.py [--rows 10000000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONV = ROOT / "scenarios" / "traces" / "azure_llm_2023_conv.csv"


def bench_small(repeats: int = 5) -> dict:
    from sim.workload import WorkloadConfig, build_workload

    cfg = WorkloadConfig(trace=str(CONV), format="azure")
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        w = build_workload(cfg, ROOT, 0)
        times.append(time.perf_counter() - t0)
    return {"rows": len(w.requests), "best_s": min(times), "mean_s": sum(times) / len(times)}


def generate(path: Path, rows: int, chunk: int = 1_000_000, seed: int = 0) -> float:
    """An Azure-format CSV: TIMESTAMP with 7 decimals, ContextTokens, GeneratedTokens."""
    import numpy as np
    import pandas as pd

    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    start = pd.Timestamp("2024-05-10 00:00:00")
    tick = 0  # 100 ns units
    with path.open("w") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for lo in range(0, rows, chunk):
            n = min(chunk, rows - lo)
            ticks = tick + np.cumsum(rng.integers(1, 1_000_000, n))  # mean gap 50 ms
            tick = int(ticks[-1])
            stamps = (start + pd.to_timedelta(ticks * 100, unit="ns")).strftime("%Y-%m-%d %H:%M:%S.%f")
            df = pd.DataFrame({"TIMESTAMP": pd.Series(stamps) + "0",  # %f gives 6 digits; Azure has 7
                               "ContextTokens": rng.integers(1, 8000, n),
                               "GeneratedTokens": rng.integers(1, 1000, n)})
            df.to_csv(f, header=False, index=False)
    return time.perf_counter() - t0


def peak_rss_mb() -> float:
    """This process's peak resident memory. VmHWM, not ru_maxrss: the latter keeps the parent's
    high-water mark across fork + exec."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def child(mode: str, path: Path) -> dict:
    """One measurement in this (fresh) process."""
    import numpy as np

    base = peak_rss_mb()
    t0 = time.perf_counter()
    if mode == "stream":
        from sim.workload import WorkloadConfig, build_workload

        w = build_workload(WorkloadConfig(trace=str(path), format="azure"), ROOT, 0)
        count = len(w.requests)
    elif mode == "floor":
        from sim.workload.build import to_requests
        from sim.workload.table import Columns

        rows = sum(1 for _ in path.open()) - 1
        rng = np.random.default_rng(0)
        cols = Columns(arrival=np.cumsum(rng.random(rows) * 0.1), prompt_len=rng.integers(1, 8000, rows),
                       output_len=rng.integers(1, 1000, rows))
        base = peak_rss_mb()
        reqs = to_requests(cols)
        del cols
        count = len(reqs)
    else:
        import pandas as pd

        df = pd.read_csv(path)
        count = len(df)
    return {"mode": mode, "rows": count, "seconds": time.perf_counter() - t0,
            "peak_rss_mb": peak_rss_mb(), "peak_rss_above_start_mb": peak_rss_mb() - base}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--keep", help="write the generated file here (and reuse it if present)")
    ap.add_argument("--skip-naive", action="store_true")
    ap.add_argument("--child", nargs=2, metavar=("MODE", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], Path(args.child[1]))))
        return
    small = bench_small()
    print(f"azure conversation trace: {small['rows']:,} requests, best {small['best_s'] * 1000:.0f} ms, "
          f"mean {small['mean_s'] * 1000:.0f} ms (target < 1000 ms)")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.keep) if args.keep else Path(tmp) / "azure_big.csv"
        if not path.exists():
            secs = generate(path, args.rows)
            print(f"generated {args.rows:,} rows ({path.stat().st_size / 2**20:,.0f} MiB) in {secs:.1f} s")
        modes = ["stream", "floor"] + ([] if args.skip_naive else ["naive"])
        for mode in modes:
            out = subprocess.run([sys.executable, __file__, "--child", mode, str(path)], capture_output=True,
                                 text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{mode:7} {r['rows']:>12,} rows  {r['seconds']:7.1f} s  peak RSS {r['peak_rss_mb']:8,.0f} MiB "
                  f"({r['peak_rss_above_start_mb']:,.0f} MiB above the process's start, "
                  f"{r['peak_rss_above_start_mb'] * 2**20 / r['rows']:.0f} B a row)")


if __name__ == "__main__":
    main()
