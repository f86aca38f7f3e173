"""kvsim capacity SCENARIO.yaml --slo ttft_p90=2 [--slo ...] [--search replicas|rate|concurrency] [--max N]
[--vary KEY=V1,V2 ... [--gpu-cost HARDWARE=PRICE ...]] [--seeds N] [--workers N | --ray [ADDRESS]]
[--set key.path=value ...] [--out DIR] [--json]

The fewest replicas (or, for the scenario's fleet, the highest request rate, its goodput, or the most
requests a client may keep in flight) meeting every SLO, by bisection over independent runs (sim/cluster/capacity.py). Prints the SLO attainment curve (each
candidate's figures) and, with --out, writes capacity.json, capacity.csv and capacity.png. With --vary, the
same search for each layout (sim/cluster/layouts.py) and the best layout: the fewest GPUs, or the most
requests a second (in flight) per GPU; with --gpu-cost, by price instead. With --seeds N, a candidate meets
only if it meets under each of N seeds (the scenario's and the N - 1 after it), its figures the worst seed's.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd
import yaml

from sim import limits as L
from sim.cluster.capacity import (
    SLO,
    parallel_runner,
    parse_slo,
    search_concurrency,
    search_rate,
    search_replicas,
    seed_list,
    seeds_agree,
)
from sim.cluster.layouts import cost_of, gpus_of, hardware_names, score_key, search_layouts
from sim.cluster.replica import pool_scenario
from sim.commands.compare import combinations, parse_vary
from sim.errors import KvsimError
from sim.output import prepare_out_dir, summary_json, write_atomic, write_text
from sim.scenario import apply_override, load_scenario, parse_override

MAX_WORKERS = 1024
MAX_SEEDS = 1000


def add_parser(sub) -> None:
    p = sub.add_parser("capacity", help="the fewest replicas (or the highest rate) that meet SLOs")
    p.add_argument("scenario", help="scenario YAML file")
    p.add_argument("--slo", action="append", default=[], metavar="METRIC_STAT=SECONDS", required=True,
                   help="an SLO, e.g. ttft_p90=2 or tpot_p90=0.1 (repeatable; all must hold)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a scenario key (repeatable)")
    p.add_argument("--search", choices=["replicas", "rate", "concurrency"], default="replicas",
                   help="replicas: the fewest replicas; rate: the highest workload.rate for the scenario's fleet; "
                        "concurrency: the highest workload.max_concurrency (a client's requests in flight)")
    p.add_argument("--group", type=int, default=None, metavar="I",
                   help="with --search replicas on a mixed fleet (cluster.groups): the fewest replicas of group I "
                        "(0-based), the other groups as they are")
    p.add_argument("--max", type=int, default=None,
                   help="most replicas (default 64), or highest concurrency (default: the workload's requests), "
                        "to consider")
    p.add_argument("--seeds", type=int, default=1, metavar="N",
                   help="run each candidate under N seeds (the scenario's seed and the N - 1 after it): it meets only "
                        "if every seed's run meets, and its figures are the worst seed's (default 1)")
    p.add_argument("--workers", type=int, default=1, help="candidates run in parallel processes")
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS", help="run candidates on Ray")
    p.add_argument("--vary", action="append", default=[], metavar="KEY.PATH=V1,V2",
                   help="layouts to compare (the cross product of the values, e.g. hardware.tensor_parallel=1,2 "
                        "model.weight_dtype=null,int4), each searched on its own: replicas, the fewest GPUs wins; "
                        "rate or concurrency, the most per GPU of its fleet (with --gpu-cost: per price)")
    p.add_argument("--gpu-cost", action="append", default=[], metavar="HARDWARE=PRICE",
                   help="with --vary: a GPU's price an hour by hardware name, e.g. h100-80gb=2.5 (repeatable); "
                        "layouts are then ranked by price")
    p.add_argument("--out", help="folder for capacity.json, capacity.csv and capacity.png")
    p.add_argument("--json", action="store_true", help="print the answer and every candidate as JSON")
    p.set_defaults(func=main)


def _base_rate(scn) -> float:
    """The workload's mean arrival rate (requests / span of arrivals)."""
    if scn.workload.rate is not None:
        return float(scn.workload.rate)
    from sim.workload import build_workload

    reqs = build_workload(scn.workload, base_dir=scn.base_dir, seed=scn.seed, source=scn.source).requests
    span = max(r.arrival_s for r in reqs) - min(r.arrival_s for r in reqs)
    return len(reqs) / span if span > 0 else float(len(reqs))


def _num_requests(scn) -> int:
    """The workload's requests (a client limit at or above it changes nothing)."""
    from sim.workload import build_workload

    return len(build_workload(scn.workload, base_dir=scn.base_dir, seed=scn.seed, source=scn.source).requests)


def plot(table: pd.DataFrame, x: str, slos: list[SLO], path: Path) -> Path:
    """Each SLO's figure per candidate (green: all SLOs met), with its bound."""
    from sim.plots import _save, plt

    fig, axes = plt.subplots(1, len(slos), figsize=(4.2 * len(slos), 3.3), squeeze=False)
    t = table.sort_values(x)
    for ax, s in zip(axes[0], slos):
        ax.plot(t[x], t[s.name], color="#868e96", lw=1)
        ax.scatter(t[x], t[s.name], c=["#2b8a3e" if m else "#e03131" for m in t["meets"]], zorder=3)
        ax.axhline(s.value, color="#1c7ed6", ls="--", lw=1, label=f"SLO {s.value:g} s")
        ax.set_xlabel({"replicas": "replicas", "rate": "request rate (req/s)",
                       "concurrency": "requests in flight (client limit)"}[x])
        ax.set_ylabel(f"{s.name} (s)")
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    return _save(fig, path)


def _search_data(args: argparse.Namespace, overrides: list[str]) -> tuple[dict, list[str]]:
    """The scenario file's mapping with ``overrides`` applied, and the overrides (a fleet of one replica added
    for a replicas search of a scenario without a cluster)."""
    data = yaml.safe_load(Path(args.scenario).read_text(encoding="utf-8-sig"))
    overrides = list(overrides)
    for text in overrides:
        path, value = parse_override(text)
        apply_override(data, path, value, Path(args.scenario).parent)
    cl = data.get("cluster")
    groups = cl.get("groups") if isinstance(cl, dict) else None
    if args.group is not None:
        if args.search != "replicas" or not isinstance(groups, list):
            raise KvsimError("--group", "grows one group of a mixed fleet: give it with --search replicas and a "
                             "scenario with cluster.groups")
        if not 0 <= args.group < len(groups):
            raise KvsimError("--group", f"the fleet has groups 0 .. {len(groups) - 1}, not {args.group}")
    elif args.search == "replicas" and isinstance(cl, dict) and (
            (cl.get("data_parallel") and not cl.get("data_parallel_size"))
            or any(isinstance(cl.get(k), dict) and cl[k].get("data_parallel") for k in ("prefill", "decode"))):
        raise KvsimError("--search", "replicas: a data-parallel engine's replicas are its ranks, one engine's size "
                         "and not a fleet's; to add whole engines, give each one's ranks (--set "
                         "cluster.data_parallel_size=8), or compare sizes with --vary (cluster.replicas=2,4,8, or a "
                         "pool's, cluster.decode.replicas=4,8) and --search rate or concurrency")
    elif args.search == "replicas" and groups is not None:
        raise KvsimError(f"{args.scenario}: cluster.groups", "a mixed fleet has no one replica count to search; "
                         "give --group I to grow group I, or use --search rate or concurrency")
    if args.search == "replicas" and (not isinstance(cl, dict) or not {"replicas", "groups", "prefill", "decode"} & set(cl)):
        overrides.append("cluster.replicas=1")            # e.g. only --set cluster.router.policy=...: a fleet
        apply_override(data, ["cluster", "replicas"], 1)
    return data, overrides


def _per_engine(scn) -> int:
    """The replicas a replicas search adds at a time: each data-parallel engine's ranks
    (``cluster.data_parallel_size``), else 1."""
    cl = scn.cluster
    return cl.data_parallel_size if cl is not None and cl.data_parallel and cl.data_parallel_size else 1


def _costs(texts: list[str]) -> dict[str, float] | None:
    """``--gpu-cost NAME=PRICE`` as {hardware name: price an hour} (None: none given)."""
    if not texts:
        return None
    costs: dict[str, float] = {}
    for text in texts:
        name, sep, value = text.partition("=")
        try:
            price = float(value)
        except ValueError:
            price = math.nan
        if not sep or not name.strip() or not math.isfinite(price) or price < 0:
            raise KvsimError("--gpu-cost", f"{text!r}: expected HARDWARE=PRICE with a price >= 0")
        costs[name.strip().lower()] = price
    return costs


def main(args: argparse.Namespace) -> int:
    slos = [parse_slo(t) for t in args.slo]
    if args.max is not None and args.max < 1:
        raise KvsimError("--max", f"must be at least 1, got {args.max}")
    if not 1 <= args.workers <= MAX_WORKERS:
        raise KvsimError("--workers", f"must be 1 .. {MAX_WORKERS}, got {args.workers}")
    if not 1 <= args.seeds <= MAX_SEEDS:
        raise KvsimError("--seeds", f"must be 1 .. {MAX_SEEDS}, got {args.seeds}")
    if args.seeds > 1 and any(v.split("=", 1)[0].strip() == "seed" for v in args.vary):
        raise KvsimError("--seeds", "runs each candidate under several seeds: do not also vary seed with --vary")
    load_scenario(args.scenario)                          # the file itself: errors with its line numbers
    if args.vary or args.gpu_cost:
        return _main_layouts(args, slos)
    data, overrides = _search_data(args, args.overrides)
    scn = load_scenario(args.scenario, overrides)         # validates the overrides
    _check_seeds(scn.seed, args.seeds)
    out = prepare_out_dir(args.out) if args.out else None
    with parallel_runner(str(Path(args.scenario).parent), args.scenario, slos, workers=args.workers,
                         use_ray=args.ray is not None, ray_address=args.ray or None, seeds=args.seeds) as run:
        if args.search == "replicas":
            answer = search_replicas(data, run, args.max or 64, args.workers, args.group, _per_engine(scn))
            x = "replicas"
        elif args.search == "concurrency":
            answer = search_concurrency(data, run, args.max or _num_requests(scn), args.workers)
            x = "concurrency"
        else:
            answer = search_rate(data, run, _base_rate(scn), args.workers)
            x = "rate"
    if args.seeds > 1:
        answer["seeds"] = seed_list(data, args.seeds)
    rows = [{k: v for k, v in c.items() if k not in ("splits", "seeds")} for c in answer["candidates"]]
    table = pd.DataFrame(rows)
    if args.json:
        print(summary_json(answer), end="")
    else:
        cols = [x] + [c for c in ("engines", "prefill", "decode") if c in table] + [s.name for s in slos] + \
            [f"attain_{s.name}" for s in slos] + ["meets"] + (["seeds_met"] if args.seeds > 1 else [])
        print(table[cols].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        slo_text = ", ".join(f"{s.name} <= {s.value:g} s" for s in slos)
        if x == "replicas" and "group" in answer:
            g = scn.cluster.groups[answer["group"]]
            hw = pool_scenario(scn, g).hardware_spec
            shape = f"TP {hw.tensor_parallel}" + (f" x PP {hw.pipeline_parallel}" if hw.pipeline_parallel > 1 else "")
            print(f"fewest replicas of group {answer['group']} ({hw.name}, {shape}) meeting "
                  f"{slo_text}: {answer['replicas']} ({gpus_of(scn, answer)[0]} GPUs in the fleet)")
        elif x == "replicas":
            split = f" ({answer['prefill']} prefill + {answer['decode']} decode)" if "prefill" in answer else ""
            if "engines" in answer:
                e = answer["engines"]
                split = f" ({e} data-parallel engine{'s' if e != 1 else ''} of {answer['replicas'] // e} ranks)"
            print(f"fewest replicas meeting {slo_text}: {answer['replicas']}{split}")
        elif x == "concurrency":
            print(f"highest concurrency meeting {slo_text}: {answer['concurrency']} requests in flight")
        else:
            print(f"highest rate meeting {slo_text}: {answer['rate']:.4g} requests/s")
        if answer.get("out_of_order"):
            print(_out_of_order_note(answer["out_of_order"], x))
        if args.seeds > 1:
            print(_seeds_note(answer, slos, args.seeds))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        write_text(out / "capacity.json", summary_json(answer))
        write_atomic(out / "capacity.csv", lambda p: table.to_csv(p, index=False))
        tmp = out / ".capacity.partial.png"
        try:
            plot(table, x, slos, tmp)
            tmp.replace(out / "capacity.png")
        finally:
            tmp.unlink(missing_ok=True)
        if not args.json:
            print(f"wrote capacity.json, capacity.csv, capacity.png to {out}/")
    return 0 if not math.isnan(float(answer.get(x, math.nan))) else 1




def _main_layouts(args: argparse.Namespace, slos: list[SLO]) -> int:
    """``--vary``: each layout's search (replicas, rate or concurrency) and the best layout (sim/cluster/layouts.py)."""
    if not args.vary:
        raise KvsimError("--gpu-cost", "prices rank layouts: give the layouts with --vary")
    costs = _costs(args.gpu_cost)
    layouts = combinations(parse_vary(args.vary))
    prepared: dict[tuple, tuple[dict, object]] = {}
    for layout in layouts:   # every layout read, and so checked, before any search
        varied = [f"{k}={v}" for k, v in layout]
        data, overrides = _search_data(args, args.overrides + varied)
        sets = [*overrides[:len(args.overrides)], *overrides[len(args.overrides) + len(varied):]]
        prepared[tuple(layout)] = (data, load_scenario(args.scenario, sets, varied))   # (errors name --vary)
    if costs is not None:   # every layout's hardware priced before any search
        cost_of({name: 0 for _, scn in prepared.values() for name in hardware_names(scn)}, costs)
    for _, scn in prepared.values():
        _check_seeds(scn.seed, args.seeds)
    out = prepare_out_dir(args.out) if args.out else None
    key = args.search
    with parallel_runner(str(Path(args.scenario).parent), args.scenario, slos, workers=args.workers,
                         use_ray=args.ray is not None, ray_address=args.ray or None, seeds=args.seeds) as run:
        def search(layout, data):
            scn = prepared[tuple(layout)][1]
            if key == "replicas":
                return search_replicas(data, run, args.max or 64, args.workers, args.group, _per_engine(scn))
            if key == "concurrency":
                return search_concurrency(data, run, args.max or _num_requests(scn), args.workers)
            return search_rate(data, run, _base_rate(scn), args.workers)

        answer = search_layouts(layouts, lambda lay: prepared[tuple(lay)][0], lambda lay: prepared[tuple(lay)][1],
                                search, key, costs, tuple(s.name for s in slos))
    if args.seeds > 1:   # (seed is not varied: every layout runs the same seeds)
        answer["seeds"] = seed_list(next(iter(prepared.values()))[0], args.seeds)
    rows = [{k: v for k, v in r.items() if k not in ("candidates", "varied", "gpus_by_hardware", "out_of_order")}
            for r in answer["layouts"]]
    table = pd.DataFrame(rows)
    if args.json:
        print(summary_json(answer), end="")
    else:
        _print_layouts(answer, rows, slos, key, costs is not None, args.group)
        if args.seeds > 1:
            print(_seeds_note({"candidates": [c for r in answer["layouts"] for c in r["candidates"]]}, slos,
                              args.seeds))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        write_text(out / "capacity.json", summary_json(answer))
        cands = pd.DataFrame([{"layout": r["layout"], **{k: v for k, v in c.items() if k not in ("splits", "seeds")}}
                              for r in answer["layouts"] for c in r["candidates"]])
        write_atomic(out / "capacity.csv", lambda p: cands.to_csv(p, index=False))
        tmp = out / ".capacity.partial.png"
        try:
            plot_layouts(table, score_key(key, costs is not None), tmp)
            tmp.replace(out / "capacity.png")
        finally:
            tmp.unlink(missing_ok=True)
        if not args.json:
            print(f"wrote capacity.json, capacity.csv, capacity.png to {out}/")
    return 0 if answer["layout"] is not None else 1


def _check_seeds(seed: int, seeds: int) -> None:
    """The last seed a candidate would run with must be a valid scenario seed."""
    if seed + seeds - 1 > L.MAX_SEED:
        raise KvsimError("--seeds", f"the scenario's seed {seed} plus {seeds - 1} passes the largest seed {L.MAX_SEED}")


def _seeds_note(answer: dict, slos: list[SLO], seeds: int) -> str:
    """What ``--seeds`` did: each candidate under N seeds, its figures the worst seed's; or that the seeds all
    gave the same figures."""
    if seeds_agree(answer, slos):
        return (f"note: all {seeds} seeds gave every candidate the same figures: nothing in this scenario is drawn "
                "at random (a trace replayed as recorded, a router that draws nothing), so more seeds add only time")
    return (f"each candidate ran under {seeds} seeds; it meets only if every seed's run meets (seeds_met), and its "
            "figures are the worst seed's (each seed's in the JSON's seeds)")


def _out_of_order_note(values: list, x: str) -> str:
    """The warning where the tried candidates show that meeting the SLOs is not monotone in ``x``."""
    shown = ", ".join(f"{v:.4g}" for v in values)
    if x == "replicas":
        what = f"larger fleets fail ({shown} replicas)"
    else:
        what = f"higher {'rates' if x == 'rate' else 'concurrencies'} meet ({shown})"
    return (f"note: meeting the SLOs is not monotone in {x} here: {what}; the search assumes it is, so a "
            "better answer may lie among values it did not try (an SLO's percentile is near its bound: run "
            "more requests, several seeds with --seeds N, or relax the SLOs)")


def _print_layouts(answer: dict, rows: list[dict], slos: list[SLO], key: str, priced: bool,
                   group: int | None = None) -> None:
    """The layouts' table, why a layout is out, and the best one, as text (``group``: the mixed fleet's
    group a replicas search grew)."""
    for r, row in zip(answer["layouts"], rows):
        row["hardware"] = " + ".join(f"{n} x {hw}" for hw, n in (r.get("gpus_by_hardware") or {}).items()) or "-"
    shown = pd.DataFrame(rows).drop(columns=["reason"], errors="ignore")
    print(shown.to_string(index=False, na_rep="-", float_format=lambda v: f"{v:.4g}"))
    for r in answer["layouts"]:
        if r["gpus"] is None:
            print(f"  {r['layout']}: {r['reason']}")
    slo_text = ", ".join(f"{s.name} <= {s.value:g} s" for s in slos)
    if answer["layout"] is None:
        print(f"no layout meets {slo_text}")
    elif key == "replicas":
        what = f"{answer['cost_per_hour']:.4g} an hour, " if priced else ""
        n = answer["replicas"]
        fleet = (f"{answer['gpus']} GPUs in {n} replica{'s' if n != 1 else ''}" if group is None
                 else f"{answer['gpus']} GPUs, group {group} at {n} replica{'s' if n != 1 else ''}")
        print(f"{'cheapest' if priced else 'fewest GPUs'} meeting {slo_text}: {answer['layout']} ({what}{fleet})")
    else:
        unit = "requests/s" if key == "rate" else "requests in flight"
        per = "per unit of price an hour" if priced else "per GPU"
        g = answer["gpus"]
        print(f"most {unit} {per} meeting {slo_text}: {answer['layout']} ({answer[key]:.4g} {unit} on "
              f"{g} GPU{'s' if g != 1 else ''}: {answer[score_key(key, priced)]:.4g} {per})")
    for r in answer["layouts"]:
        if r.get("out_of_order"):
            print(f"{r['layout']}: {_out_of_order_note(r['out_of_order'], key)}")


def plot_layouts(table: pd.DataFrame, key: str, path: Path) -> Path:
    """Each layout's GPUs (or price an hour) meeting the SLOs; the best in green, the ones none meets absent."""
    from sim.plots import _save, plt

    t = table.dropna(subset=[key]) if key in table else table.iloc[:0]
    left = 0.3 + 0.075 * max((len(str(x)) for x in table["layout"]), default=10)   # (room for the names)
    fig, ax = plt.subplots(figsize=(left + 4.0, 0.45 * max(len(table), 3) + 1))
    best = (t[key].min() if key in ("gpus", "cost_per_hour") else t[key].max()) if len(t) else math.nan
    ax.barh(t["layout"], t[key], color=["#2b8a3e" if v == best else "#868e96" for v in t[key]])
    ax.invert_yaxis()
    ax.set_xlabel({"gpus": "GPUs meeting the SLOs", "cost_per_hour": "price an hour of the fleet meeting the SLOs",
                   "rate_per_gpu": "requests/s per GPU meeting the SLOs",
                   "concurrency_per_gpu": "requests in flight per GPU meeting the SLOs"}.get(key, key.replace("_", " ")))
    if key == "gpus":
        ax.xaxis.get_major_locator().set_params(integer=True)
    return _save(fig, path, left=left)
