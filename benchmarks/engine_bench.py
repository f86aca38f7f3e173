"""Engine speed and memory, phase by phase: load, simulate, summarise, write, plot.

    python benchmarks/engine_bench.py                       # the Azure conversation hour, Llama-3.1-8B on H100
    python benchmarks/engine_bench.py --workload quickstart # the quickstart settings (Llama-2-13B, A100) over the hour
    python benchmarks/engine_bench.py --workload mooncake   # the Mooncake conversation hour, prefix caching hit
    python benchmarks/engine_bench.py --double-output       # every output length doubled
    python benchmarks/engine_bench.py --output-scaling      # as given, then doubled, in this process
    python benchmarks/engine_bench.py --synthetic 1000000 --rate 30
    python benchmarks/engine_bench.py --core-compare --repeat 3   # the compiled core against the SimPy loop
    python benchmarks/engine_bench.py --workload quickstart --core-compare --set kv_cache.allocator=contiguous-max
    python benchmarks/engine_bench.py --workload quickstart --core-compare --set scheduler.batching=static \
        --set scheduler.chunked_prefill=false           # (any scenario key, as kvsim run --set takes it)
    python benchmarks/engine_bench.py --no-core             # the SimPy loop (sim/engine.py) for every run
    python benchmarks/engine_bench.py --compare             # multi-step on and off (SimPy loop), in this process
    python benchmarks/engine_bench.py --compare --repeat 3  # alternating, the fastest of each mode
    python benchmarks/engine_bench.py --batch-scaling       # wall time per step at batch 8 and 256 (core, loop)
    python benchmarks/engine_bench.py --no-lane             # the decode lane off (sim/sched/decode_lane.py)
    python benchmarks/engine_bench.py --stream-compare --repeat 3   # the step table written after / during the run
    python benchmarks/engine_bench.py --yaml hour.yaml      # write the scenario, for `kvsim run hour.yaml`
    python benchmarks/engine_bench.py --yaml hour_x2.yaml --double-output   # ... its trace's outputs doubled

A scenario the compiled engine core covers (sim/engine_core.py: all of these) runs there unless
``--no-core``; the options about decode runs, the decode lane and multi-step measure the SimPy loop, so they
turn the core off. Prints, per run: whether the core ran it, requests, steps, decode runs (multi-step), engine waits (SimPy timeouts the engine
yielded: its events), arrivals, wall seconds per phase, steps per wall second and peak RSS. As ``kvsim run
--out``, the per-step table is written while the engine runs (on a second thread: sim/step_stream.py), so
"simulate" includes whatever that costs the engine and "write" is what is left after the run (the stream's
last rows, requests.csv, report.html). Timings on a shared machine are noisy: compare ratios measured in one process (``--compare``), not numbers across runs.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import math
import resource
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import yaml

import sim.engine_core as engine_core
import sim.runner as runner
from sim import run_scenario, scenario_from_dict
from sim.scenario import apply_override, parse_override

ROOT = Path(__file__).resolve().parents[1]
TRACE = str(ROOT / "scenarios" / "traces" / "azure_llm_2023_conv.csv")


def azure_scenario(limit: int | None) -> dict:
    """The issue's reference: the Azure conversation hour, Llama-3.1-8B on one H100, 16-token blocks, FCFS,
    chunked prefill, max_num_seqs 256, max_num_batched_tokens 2048."""
    return {"name": "azure-conv-hour", "seed": 0, "model": "llama-3.1-8b", "hardware": "h100-80gb",
            "kv_cache": {"block_size": 16},
            "scheduler": {"policy": "fcfs", "chunked_prefill": True, "max_num_seqs": 256,
                          "max_num_batched_tokens": 2048},
            "workload": {"trace": TRACE, "format": "azure", "limit": limit}}


def quickstart_scenario(limit: int | None) -> dict:
    """scenarios/quickstart.yaml (Llama-2-13B on A100) over the whole hour (or its first ``limit``)."""
    data = yaml.safe_load((ROOT / "scenarios" / "quickstart.yaml").read_text())
    data["name"] = "quickstart-hour"
    data["workload"]["limit"] = limit
    data["workload"]["trace"] = TRACE
    return data


def mooncake_scenario(limit: int | None) -> dict:
    """scenarios/mooncake_conversation.yaml (Llama-3.1-8B on H200, prefix caching over the trace's shared
    512-token chunks) over the whole hour of the Mooncake conversation trace (or its first ``limit``)."""
    data = yaml.safe_load((ROOT / "scenarios" / "mooncake_conversation.yaml").read_text())
    data["name"] = "mooncake-conv-hour"
    data["workload"]["limit"] = limit
    data["workload"]["trace"] = str(ROOT / "scenarios" / data["workload"]["trace"])
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


def batch_scenario(batch: int) -> dict:
    """``batch`` requests at once (then 3 more waves), 64-token prompts, 600-token outputs, multi-step off:
    every step a single step of a full batch (with a prefill chunk where a wave changes)."""
    return {"name": f"batch-{batch}", "seed": 0, "model": "llama-3-8b", "hardware": "h100-80gb",
            "scheduler": {"max_num_seqs": batch, "multi_step": False},
            "workload": {"synthetic": {
                "num_requests": 4 * batch, "arrival": {"process": "poisson", "rate": 1e6},
                "prompt_len": {"dist": "fixed", "value": 64}, "output_len": {"dist": "fixed", "value": 600}}}}


def batch_scaling(repeat: int) -> None:
    """Wall microseconds per step at batch 8 and 256 (fastest of ``repeat``): the compiled core, and the
    SimPy loop with the decode lane on and off."""
    import sim.sched.continuous as continuous

    modes = {"compiled core": (True, True), "SimPy loop, decode lane on": (False, True),
             "SimPy loop, decode lane off": (False, False)}
    best: dict[tuple[str, int], float] = {}
    core_was = engine_core.enabled
    try:
        for _ in range(max(1, repeat)):
            for name, (core, lane) in modes.items():
                engine_core.enabled = core and core_was
                continuous.ContinuousScheduler.use_lane = lane
                for batch in (8, 256):
                    scn = scenario_from_dict(batch_scenario(batch), base_dir=ROOT / "scenarios")
                    res = run_scenario(scn, check_integrity=False)
                    us = res.profile["simulate_s"] / res.profile["steps"] * 1e6
                    best[name, batch] = min(best.get((name, batch), math.inf), us)
    finally:
        engine_core.enabled = core_was
        continuous.ContinuousScheduler.use_lane = True
    for name in modes:
        print(f"{name:<28}: batch 8 {best[name, 8]:6.2f} us/step, batch 256 {best[name, 256]:6.2f} us/step: "
              f"{best[name, 256] / best[name, 8]:.2f}x")


@contextlib.contextmanager
def outputs_doubled(on: bool = True) -> Iterator[None]:
    """While open (and ``on``), every workload ``run_scenario`` builds has each output length doubled."""
    if not on:
        yield
        return
    build = runner.build_workload

    def doubled(*a, **kw):
        out = build(*a, **kw)
        for r in out.requests:
            r.output_len *= 2
        return out

    runner.build_workload = doubled
    try:
        yield
    finally:
        runner.build_workload = build


def measure(data: dict, multi_step: bool, write: bool, plot: bool, double_output: bool, stream: bool = True,
            core: bool = True) -> dict:
    """One run's phases. With ``write``, as ``kvsim run --out`` does it: the per-step table is written while
    the engine runs (sim/step_stream.py, on a second thread), the rest after it; without ``stream``, all of
    it after the run. ``core``: the compiled engine core where it covers the scenario (else the SimPy loop)."""
    from sim.commands.run import results_stage, write_results

    data = copy.deepcopy(data)
    data.setdefault("scheduler", {})["multi_step"] = multi_step
    scn = scenario_from_dict(data, base_dir=ROOT / "scenarios")
    with tempfile.TemporaryDirectory() as tmp, results_stage(Path(tmp) / "w" if write else None) as (stage, stream_obj):
        t0 = time.perf_counter()
        was, engine_core.enabled = engine_core.enabled, core and engine_core.enabled
        try:
            with outputs_doubled(double_output):
                res = run_scenario(scn, check_integrity=False, step_stream=stream_obj if stream else None)
        finally:
            engine_core.enabled = was
        total = time.perf_counter() - t0
        p = res.profile
        row = {"name": data["name"] + (" x2out" if double_output else ""), "core": p["compiled_core"],
               "multi_step": multi_step, "stream": stream,
               "requests": res.summary["num_requests"], "steps": p["steps"], "decode_runs": p["decode_runs"],
               "engine_waits": p["engine_waits"], "arrivals": p["arrivals"],
               "load_s": p["load_s"], "simulate_s": p["simulate_s"], "summarise_s": p["summarise_s"]}
        t = time.perf_counter()
        if write:
            write_results(res, Path(tmp) / "w", plots=False, stage=stage, stream=stream_obj if stream else None)
        row["write_s"] = time.perf_counter() - t
        t = time.perf_counter()
        if plot:
            from sim import plots

            plots.write_run_plots(res.requests, res.steps, res.summary, Path(tmp), timeline=res.timeline)
        row["plot_s"] = time.perf_counter() - t
    row["run_s"] = total
    row["steps_per_s"] = p["steps"] / total
    row["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return row


def write_yaml(data: dict, path: Path, double_output: bool) -> None:
    """``data`` as a scenario file at ``path``; ``double_output``: its Azure trace copied beside it (PATH's
    name + .csv) with every GeneratedTokens doubled, and the scenario reading that copy."""
    data = copy.deepcopy(data)
    trace = data.get("workload", {}).get("trace")
    if double_output:
        if trace is None or data["workload"].get("format") != "azure":
            raise SystemExit("--double-output with --yaml needs an Azure trace workload")
        import pandas as pd

        df = pd.read_csv(trace)
        df["GeneratedTokens"] *= 2
        copy_path = path.with_suffix(".csv")
        df.to_csv(copy_path, index=False)
        data["workload"]["trace"] = str(copy_path.resolve())
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    print(f"wrote {path}")


def add_workload_args(ap: argparse.ArgumentParser) -> None:
    """The options that pick the benchmark's workload (``workload_data`` reads them)."""
    ap.add_argument("--workload", choices=["azure", "quickstart", "mooncake"], default="azure")
    ap.add_argument("--limit", type=int, default=None, help="first N requests of the trace (default all)")
    ap.add_argument("--synthetic", type=int, default=0, help="run N synthetic requests instead of the trace")
    ap.add_argument("--rate", type=float, default=30.0, help="synthetic arrival rate (req/s)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a scenario override, as kvsim run takes it (repeatable), e.g. scheduler.batching=static")


def workload_data(args: argparse.Namespace) -> dict:
    """The scenario the workload options name."""
    if args.synthetic:
        data = synthetic_scenario(args.synthetic, args.rate)
    elif args.workload == "quickstart":
        data = quickstart_scenario(args.limit)
    elif args.workload == "mooncake":
        data = mooncake_scenario(args.limit)
    else:
        data = azure_scenario(args.limit)
    if getattr(args, "prefix_caching", False):   # vLLM's default; an unhit cache on these workloads
        data.setdefault("kv_cache", {})["prefix_caching"] = True
    for text in getattr(args, "set", []):
        path, value = parse_override(text)
        apply_override(data, path, value, ROOT / "scenarios")
    return data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_args(ap)
    ap.add_argument("--double-output", action="store_true", help="double every output length")
    ap.add_argument("--output-scaling", action="store_true",
                    help="the outputs as given, then doubled, alternating (--repeat times); prints the ratio")
    ap.add_argument("--single-step", action="store_true", help="multi-step off")
    ap.add_argument("--prefix-caching", action="store_true",
                    help="kv_cache.prefix_caching on (no request shares content: the core runs it, unhit)")
    ap.add_argument("--compare", action="store_true", help="multi-step off then on (SimPy loop), in this process")
    ap.add_argument("--core-compare", action="store_true",
                    help="the SimPy loop then the compiled core, alternating (--repeat times); prints the ratio")
    ap.add_argument("--no-core", action="store_true", help="the SimPy loop for every run (the compiled core off)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="with --compare: alternate off/on this many times; the ratio uses each mode's fastest")
    ap.add_argument("--no-write", action="store_true", help="skip writing the tables")
    ap.add_argument("--stream-compare", action="store_true",
                    help="the step table written after the run, then while it runs, alternating (--repeat times); "
                         "prints the ratio of simulate + summarise + write")
    ap.add_argument("--plots", action="store_true", help="also draw the figures")
    ap.add_argument("--no-lane", action="store_true",
                    help="decode lane off (the per-request loop plans and updates every step)")
    ap.add_argument("--yaml", metavar="PATH",
                    help="write the workload's scenario as YAML (with --double-output, beside a copy of the trace "
                         "with every output doubled) and stop")
    ap.add_argument("--batch-scaling", action="store_true",
                    help="wall time per step at batch 8 and 256: the core, the SimPy loop with the decode lane on "
                         "and off (--repeat times)")
    args = ap.parse_args()
    if args.batch_scaling:
        batch_scaling(args.repeat)
        return
    if args.no_lane:
        import sim.sched.continuous as continuous

        continuous.ContinuousScheduler.use_lane = False
    if args.no_core or args.no_lane or args.compare or args.single_step:   # (they measure the SimPy loop)
        engine_core.enabled = False
    data = workload_data(args)
    if args.yaml:
        write_yaml(data, Path(args.yaml), args.double_output)
        return
    if args.output_scaling:
        runs = [(not args.single_step, doubled, True) for doubled in (False, True)] * args.repeat
    elif args.stream_compare:
        runs = [(not args.single_step, args.double_output, stream) for stream in (False, True)] * args.repeat
    else:
        modes = [False, True] * args.repeat if args.compare else [not args.single_step]
        runs = [(m, args.double_output, True) for m in modes]
    cores = [False, True] * args.repeat if args.core_compare else [True] * len(runs)
    if args.core_compare:
        runs = [(not args.single_step, args.double_output, True)] * len(cores)
    rows = [measure(data, m, not args.no_write, args.plots, doubled, stream, core)
            for (m, doubled, stream), core in zip(runs, cores)]
    cols = list(rows[0])
    print(" | ".join(f"{c:>12}" for c in cols))
    for r in rows:
        print(" | ".join(f"{r[c]:>12.3f}" if isinstance(r[c], float) else f"{r[c]!s:>12}" for c in cols))
    if args.core_compare:
        best = {c: min(r["simulate_s"] for r in rows if r["core"] == c) for c in (False, True)}
        print(f"simulate time, compiled core / SimPy loop (fastest of {args.repeat}): {best[True] / best[False]:.3f}")
    if args.compare:
        best = {m: min(r["simulate_s"] for r in rows if r["multi_step"] == m) for m in (False, True)}
        print(f"simulate time, multi-step on / off (fastest of {args.repeat}): {best[True] / best[False]:.3f}")
    if args.stream_compare:   # the engine's time, the tables and the writing after it, each mode's fastest
        best = {st: min(r["simulate_s"] + r["summarise_s"] + r["write_s"] for r in rows if r["stream"] == st)
                for st in (False, True)}
        print(f"simulate + summarise + write, step table streamed / written after (fastest of {args.repeat}): "
              f"{best[True] / best[False]:.3f}")
    if args.output_scaling:   # whole runs (load to written tables), each kind's fastest
        best = {d: min(r["run_s"] + r["write_s"] for r in rows if r["name"].endswith("x2out") == d)
                for d in (False, True)}
        print(f"wall time, outputs doubled / as given (fastest of {args.repeat}): {best[True] / best[False]:.3f}")


if __name__ == "__main__":
    main()
